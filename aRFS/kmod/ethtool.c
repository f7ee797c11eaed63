// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_arfs ethtool: the ntuple rules (`ethtool -N`: get_rxnfc/set_rxnfc)
 * and the RSS configuration (`ethtool -X`: get_rxfh/set_rxfh) of a
 * virtio_net netdev whose vnic device announced the rule and RSS extensions
 * in its CAPS, forwarded to the device over the management protocol
 * (RULE_SET, RULE_DEL, RSS_SET; aRFS/PROTOCOL.md).
 *
 * The module holds what ethtool asked for (the wanted rule at each
 * location, the wanted key and indirection table) and a request per
 * location and for RSS (struct vnic_eth_req): a change makes its request
 * dirty, the work item sends it in the management window with the filter
 * ops (before them: ethtool waits), and the ACK records its status. An
 * ethtool call waits for the ACK of its own change, under RTNL like every
 * ethtool call, and returns the device's answer: a refused change is
 * undone (the device changed nothing either). Go-back-N retransmits a lost
 * op; a device that lost its table (new generation) gets every wanted rule
 * and the RSS configuration again.
 *
 * Rule location, flow types and masks are those of the device's rule stage:
 * tcp4/udp4/ip4/tcp6/udp6/ip6, address and port masks, the upper-layer
 * protocol with its mask for ip4/ip6; action a queue, drop, or RSS context
 * 0 plus a queue offset. Anything else (FLOW_EXT, FLOW_MAC_EXT, tos/tclass,
 * l4_4_bytes, other contexts, a VF) is -EOPNOTSUPP.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kmemleak.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>

#include "vnic_arfs.h"

/* The device's default Toeplitz key (aRFS/PROTOCOL.md, "RSS"). */
static const u8 vnic_eth_default_key[VNIC_RSS_KEY_LEN] = {
	0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2,
	0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
	0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4,
	0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
	0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
};

/* ------------------------------------------------------------------------ */
/* Requests                                                                 */

static void vnic_eth_mark_locked(struct vnic_ctx *ctx, struct vnic_eth_req *rq)
{
	if (!rq->dirty) {
		rq->dirty = true;
		ctx->eth_dirty++;
	}
}

static void vnic_eth_unmark_locked(struct vnic_ctx *ctx, struct vnic_eth_req *rq)
{
	if (rq->dirty) {
		rq->dirty = false;
		ctx->eth_dirty--;
	}
}

/* A new wanted state: send it. Return: the version to wait for. */
static u32 vnic_eth_change_locked(struct vnic_ctx *ctx, struct vnic_eth_req *rq)
{
	rq->ver++;
	vnic_eth_mark_locked(ctx, rq);
	vnic_work_kick_locked(ctx);
	return rq->ver;
}

/* Nothing to send after all: the wanted state is the device's. */
static void vnic_eth_settle_locked(struct vnic_ctx *ctx, struct vnic_eth_req *rq)
{
	vnic_eth_unmark_locked(ctx, rq);
	rq->inflight = false;
	WRITE_ONCE(rq->acked_ver, rq->ver);
	rq->status = VNIC_S_OK;
	wake_up(&ctx->eth_wq);
}

static bool vnic_eth_acked(const struct vnic_eth_req *rq, u32 ver)
{
	return (s32)(READ_ONCE(rq->acked_ver) - ver) >= 0;
}

/*
 * The errno of a device status. unknown_id answers a RULE_DEL of a location
 * the device had no rule at: what was asked for is true, so it is 0.
 */
static int vnic_eth_errno(int st)
{
	switch (st) {
	case VNIC_S_OK:
	case VNIC_S_UNKNOWN_ID:
		return 0;
	case VNIC_S_TABLE_FULL:
	case VNIC_S_BUCKET_FULL:
		return -ENOSPC;
	case VNIC_S_BAD_QUEUE:
	case VNIC_S_BAD_ID:
		return -EINVAL;
	case VNIC_S_BAD_KEY:
		return -EOPNOTSUPP;
	case -1:
		return -EPROTO;		/* NAKed: the frame was malformed */
	default:
		return -EIO;
	}
}

/*
 * Process context, RTNL held (every ethtool call holds it; ctx lives until
 * vnic_dev_release(), which needs RTNL too). Waits for the ACK of version
 * @ver of @rq. A session that is not running (link down, probing) gets the
 * change when it is: 0 at once. Return: the device's answer as an errno,
 * or -ETIMEDOUT (the request stays queued and is sent until the device
 * answers).
 */
static int vnic_eth_wait(struct vnic_ctx *ctx, struct vnic_eth_req *rq, u32 ver)
{
	unsigned long timeout;
	bool active;
	int st;

	vnic_lock_bh(ctx);
	active = ctx->state == VS_ACTIVE && vnic_dev_link_ok(ctx->dev);
	timeout = (VNIC_MAX_RETRIES + 2) * vnic_mgmt_rto(ctx);
	vnic_unlock_bh(ctx);
	if (!active)
		return 0;
	if (!wait_event_timeout(ctx->eth_wq, vnic_eth_acked(rq, ver), timeout)) {
		vnic_lock_bh(ctx);
		ctx->c.eth_timeouts++;
		vnic_unlock_bh(ctx);
		return -ETIMEDOUT;
	}
	vnic_lock_bh(ctx);
	st = rq->status;
	vnic_unlock_bh(ctx);
	return vnic_eth_errno(st);
}

/* ------------------------------------------------------------------------ */
/* Rules: ethtool_rx_flow_spec -> RULE_SET op                               */

static void vnic_eth_put_l4(u8 *op, __be16 sport, __be16 msport, __be16 dport, __be16 mdport)
{
	memcpy(op + 80, &sport, 2);
	memcpy(op + 82, &msport, 2);
	memcpy(op + 84, &dport, 2);
	memcpy(op + 86, &mdport, 2);
}

static int vnic_eth_rule_match(const struct ethtool_rx_flow_spec *fs, u8 *op)
{
	u32 flow = fs->flow_type & ~(FLOW_EXT | FLOW_MAC_EXT | FLOW_RSS);

	if (fs->flow_type & (FLOW_EXT | FLOW_MAC_EXT))
		return -EOPNOTSUPP;
	switch (flow) {
	case TCP_V4_FLOW:
	case UDP_V4_FLOW: {
		const struct ethtool_tcpip4_spec *v = &fs->h_u.tcp_ip4_spec;
		const struct ethtool_tcpip4_spec *m = &fs->m_u.tcp_ip4_spec;

		if (m->tos)
			return -EOPNOTSUPP;
		op[4] = flow == TCP_V4_FLOW ? VNIC_RF_TCP4 : VNIC_RF_UDP4;
		memcpy(op + 16, &v->ip4src, 4);
		memcpy(op + 32, &m->ip4src, 4);
		memcpy(op + 48, &v->ip4dst, 4);
		memcpy(op + 64, &m->ip4dst, 4);
		vnic_eth_put_l4(op, v->psrc, m->psrc, v->pdst, m->pdst);
		return 0;
	}
	case IP_USER_FLOW: {
		const struct ethtool_usrip4_spec *v = &fs->h_u.usr_ip4_spec;
		const struct ethtool_usrip4_spec *m = &fs->m_u.usr_ip4_spec;

		if (m->l4_4_bytes || m->tos || v->ip_ver != ETH_RX_NFC_IP4)
			return -EOPNOTSUPP;
		op[4] = VNIC_RF_IP4;
		op[12] = v->proto;
		op[13] = m->proto;
		memcpy(op + 16, &v->ip4src, 4);
		memcpy(op + 32, &m->ip4src, 4);
		memcpy(op + 48, &v->ip4dst, 4);
		memcpy(op + 64, &m->ip4dst, 4);
		return 0;
	}
	case TCP_V6_FLOW:
	case UDP_V6_FLOW: {
		const struct ethtool_tcpip6_spec *v = &fs->h_u.tcp_ip6_spec;
		const struct ethtool_tcpip6_spec *m = &fs->m_u.tcp_ip6_spec;

		if (m->tclass)
			return -EOPNOTSUPP;
		op[4] = flow == TCP_V6_FLOW ? VNIC_RF_TCP6 : VNIC_RF_UDP6;
		memcpy(op + 16, v->ip6src, 16);
		memcpy(op + 32, m->ip6src, 16);
		memcpy(op + 48, v->ip6dst, 16);
		memcpy(op + 64, m->ip6dst, 16);
		vnic_eth_put_l4(op, v->psrc, m->psrc, v->pdst, m->pdst);
		return 0;
	}
	case IPV6_USER_FLOW: {
		const struct ethtool_usrip6_spec *v = &fs->h_u.usr_ip6_spec;
		const struct ethtool_usrip6_spec *m = &fs->m_u.usr_ip6_spec;

		if (m->l4_4_bytes || m->tclass)
			return -EOPNOTSUPP;
		op[4] = VNIC_RF_IP6;
		op[12] = v->l4_proto;
		op[13] = m->l4_proto;
		memcpy(op + 16, v->ip6src, 16);
		memcpy(op + 32, m->ip6src, 16);
		memcpy(op + 48, v->ip6dst, 16);
		memcpy(op + 64, m->ip6dst, 16);
		return 0;
	}
	default:
		return -EOPNOTSUPP;
	}
}

/* The RULE_SET op of rule @fs at @loc, into @op; -errno if it has no such op. */
static int vnic_eth_rule_op(struct net_device *dev, const struct ethtool_rxnfc *info,
			    u32 loc, u8 *op)
{
	const struct ethtool_rx_flow_spec *fs = &info->fs;
	u64 q;
	int err;

	memset(op, 0, VNIC_RULE_OP);
	put_unaligned_be32(loc, op);
	err = vnic_eth_rule_match(fs, op);
	if (err)
		return err;
	if (fs->ring_cookie == RX_CLS_FLOW_DISC) {
		if (fs->flow_type & FLOW_RSS)
			return -EINVAL;
		op[5] = VNIC_RA_DROP;
		return 0;
	}
#ifdef RX_CLS_FLOW_WAKE
	if (fs->ring_cookie == RX_CLS_FLOW_WAKE)
		return -EOPNOTSUPP;
#endif
	if (ethtool_get_flow_spec_ring_vf(fs->ring_cookie))
		return -EOPNOTSUPP;
	q = ethtool_get_flow_spec_ring(fs->ring_cookie);
	if (q >= dev->real_num_rx_queues)
		return -EINVAL;
	if (fs->flow_type & FLOW_RSS) {
		if (info->rss_context)
			return -EOPNOTSUPP;	/* only the default context */
		op[5] = VNIC_RA_CONTEXT;
	} else {
		op[5] = VNIC_RA_QUEUE;
	}
	put_unaligned_be16(q, op + 6);
	return 0;
}

/* Under RTNL: the location a special RX_CLS_LOC_* names, or -ENOSPC. */
static int vnic_eth_free_loc(struct vnic_ctx *ctx, u32 special)
{
	unsigned int i;

	if (special == RX_CLS_LOC_LAST) {
		for (i = ctx->nr_rules; i-- > 0;)
			if (!ctx->rules[i].want)
				return i;
		return -ENOSPC;
	}
	if (special != RX_CLS_LOC_ANY && special != RX_CLS_LOC_FIRST)
		return -EINVAL;
	for (i = 0; i < ctx->nr_rules; i++)
		if (!ctx->rules[i].want)
			return i;
	return -ENOSPC;
}

static int vnic_eth_rule_ins(struct vnic_ctx *ctx, struct ethtool_rxnfc *info)
{
	struct ethtool_rx_flow_spec *fs = &info->fs;
	struct vnic_rule *r, old;
	u8 op[VNIC_RULE_OP];
	int loc, err;
	u32 ver;

	loc = fs->location;
	if (fs->location & RX_CLS_LOC_SPECIAL) {
		loc = vnic_eth_free_loc(ctx, fs->location);
		if (loc < 0)
			return loc;
	} else if (fs->location >= ctx->nr_rules) {
		return -EINVAL;
	}
	err = vnic_eth_rule_op(ctx->dev, info, loc, op);
	if (err)
		return err;
	fs->location = loc;	/* copied back to the caller: the id it prints */

	r = &ctx->rules[loc];
	vnic_lock_bh(ctx);
	old = *r;
	r->fs = *fs;
	memcpy(r->op, op, VNIC_RULE_OP);
	r->want = true;
	ver = vnic_eth_change_locked(ctx, &r->req);
	vnic_unlock_bh(ctx);

	err = vnic_eth_wait(ctx, &r->req, ver);
	vnic_lock_bh(ctx);
	if (err && err != -ETIMEDOUT) {
		/* refused: the device kept what it had at @loc, so do we */
		r->refused++;
		r->fs = old.fs;
		memcpy(r->op, old.op, VNIC_RULE_OP);
		r->want = old.want;
	} else if (!err) {
		r->set_ok++;
	}
	vnic_unlock_bh(ctx);
	return err;
}

static int vnic_eth_rule_del(struct vnic_ctx *ctx, u32 loc)
{
	struct vnic_rule *r;
	int err;
	u32 ver;

	if (loc >= ctx->nr_rules || !ctx->rules[loc].want)
		return -ENOENT;
	r = &ctx->rules[loc];
	vnic_lock_bh(ctx);
	r->want = false;
	ver = vnic_eth_change_locked(ctx, &r->req);
	vnic_unlock_bh(ctx);

	err = vnic_eth_wait(ctx, &r->req, ver);
	if (err && err != -ETIMEDOUT) {
		vnic_lock_bh(ctx);
		r->refused++;
		r->want = true;		/* the device still has it */
		vnic_unlock_bh(ctx);
	}
	return err;
}

/* ------------------------------------------------------------------------ */
/* RSS hash fields: the device's, fixed (aRFS/PROTOCOL.md, "RSS")           */

#define VNIC_RXH_2TUPLE	(RXH_IP_SRC | RXH_IP_DST)
#define VNIC_RXH_4TUPLE	(VNIC_RXH_2TUPLE | RXH_L4_B_0_1 | RXH_L4_B_2_3)

/*
 * The fields the device hashes for @flow_type: TCP and UDP over the
 * 4-tuple (unfragmented), every other IP protocol over the addresses, a
 * non-IP frame over nothing (queue 0). -EOPNOTSUPP for a type it has no
 * word on (GTP: hashed as the UDP it is, not by TEID).
 */
static int vnic_eth_hash_fields(u32 flow_type, u64 *data)
{
	switch (flow_type & ~FLOW_RSS) {
	case TCP_V4_FLOW:
	case UDP_V4_FLOW:
	case TCP_V6_FLOW:
	case UDP_V6_FLOW:
		*data = VNIC_RXH_4TUPLE;
		return 0;
	case SCTP_V4_FLOW:
	case SCTP_V6_FLOW:
	case AH_ESP_V4_FLOW:
	case AH_ESP_V6_FLOW:
	case AH_V4_FLOW:
	case AH_V6_FLOW:
	case ESP_V4_FLOW:
	case ESP_V6_FLOW:
	case IPV4_FLOW:
	case IPV6_FLOW:
		*data = VNIC_RXH_2TUPLE;
		return 0;
	case ETHER_FLOW:
		*data = 0;
		return 0;
	default:
		return -EOPNOTSUPP;
	}
}

/* A change of the fields: only to what they are (they cannot change). */
static int vnic_eth_hash_fields_set(u32 flow_type, u64 data)
{
	u64 now;
	int err = vnic_eth_hash_fields(flow_type, &now);

	if (err)
		return err;
	return data == now ? 0 : -EOPNOTSUPP;
}

#ifdef VNIC_HAVE_RXFH_FIELDS
static int vnic_eth_get_rxfh_fields(struct net_device *dev, struct ethtool_rxfh_fields *f)
{
	u64 data;
	int err;

	if (f->rss_context)
		return -EOPNOTSUPP;
	err = vnic_eth_hash_fields(f->flow_type, &data);
	if (!err)
		f->data = data;
	return err;
}

static int vnic_eth_set_rxfh_fields(struct net_device *dev, const struct ethtool_rxfh_fields *f,
				    struct netlink_ext_ack *extack)
{
	int err = f->rss_context ? -EOPNOTSUPP : vnic_eth_hash_fields_set(f->flow_type, f->data);

	if (err)
		NL_SET_ERR_MSG_MOD(extack, "fixed hash fields: 4-tuple TCP/UDP, else addresses");
	return err;
}
#endif

/* ------------------------------------------------------------------------ */
/* ethtool ops                                                              */

static int vnic_eth_get_rxnfc(struct net_device *dev, struct ethtool_rxnfc *info,
			      u32 *rule_locs)
{
	struct vnic_ctx *ctx = vnic_dev_ctx(dev);
	unsigned int i, n = 0;

	if (!ctx || !ctx->eops)
		return -ENODEV;
	switch (info->cmd) {
	case ETHTOOL_GRXCLSRLCNT:
		for (i = 0; i < ctx->nr_rules; i++)
			n += ctx->rules[i].want;
		info->rule_cnt = n;
		info->data = ctx->nr_rules | RX_CLS_LOC_SPECIAL;
		return 0;
	case ETHTOOL_GRXCLSRULE:
		if (info->fs.location >= ctx->nr_rules ||
		    !ctx->rules[info->fs.location].want)
			return -ENOENT;
		info->fs = ctx->rules[info->fs.location].fs;
		info->rss_context = 0;
		return 0;
	case ETHTOOL_GRXCLSRLALL:
		info->data = ctx->nr_rules;
		for (i = 0; i < ctx->nr_rules; i++) {
			if (!ctx->rules[i].want)
				continue;
			if (n == info->rule_cnt)
				return -EMSGSIZE;
			rule_locs[n++] = i;
		}
		info->rule_cnt = n;
		return 0;
#ifndef VNIC_HAVE_RXFH_FIELDS
	case ETHTOOL_GRXFH:	/* before 6.17: the hash fields come this way */
		if (ctx->eth_feat & VNIC_FEAT_RSS)
			return vnic_eth_hash_fields(info->flow_type, &info->data);
		fallthrough;
#endif
	default:
		if (ctx->orig_eops->get_rxnfc)
			return ctx->orig_eops->get_rxnfc(dev, info, rule_locs);
		return -EOPNOTSUPP;
	}
}

static int vnic_eth_set_rxnfc(struct net_device *dev, struct ethtool_rxnfc *info)
{
	struct vnic_ctx *ctx = vnic_dev_ctx(dev);

	if (!ctx || !ctx->eops)
		return -ENODEV;
	switch (info->cmd) {
	case ETHTOOL_SRXCLSRLINS:
		return vnic_eth_rule_ins(ctx, info);
	case ETHTOOL_SRXCLSRLDEL:
		return vnic_eth_rule_del(ctx, info->fs.location);
#ifndef VNIC_HAVE_RXFH_FIELDS
	case ETHTOOL_SRXFH:
		if (ctx->eth_feat & VNIC_FEAT_RSS)
			return vnic_eth_hash_fields_set(info->flow_type, info->data);
		fallthrough;
#endif
	default:
		if (ctx->orig_eops->set_rxnfc)
			return ctx->orig_eops->set_rxnfc(dev, info);
		return -EOPNOTSUPP;
	}
}

/* Under ctx->lock: the RSS_SET op of the wanted configuration. */
static void vnic_eth_rss_op_locked(struct vnic_ctx *ctx)
{
	struct vnic_rss *rss = &ctx->rss;
	u8 *op = rss->op;
	unsigned int i;

	memset(op, 0, VNIC_RSS_OP);
	op[4] = (rss->default_indir ? VNIC_RSS_DEFAULT_INDIR : 0) |
		(rss->default_key ? VNIC_RSS_DEFAULT_KEY : 0);
	op[5] = VNIC_RSS_HFUNC_TOP;
	if (!rss->default_key)
		memcpy(op + 8, rss->key, VNIC_RSS_KEY_LEN);
	if (!rss->default_indir)
		for (i = 0; i < VNIC_RSS_INDIR_LEN; i++)
			put_unaligned_be16(rss->indir[i], op + 48 + 2 * i);
}

#ifdef VNIC_HAVE_RXFH_PARAM
static u32 vnic_eth_get_rxfh_key_size(struct net_device *dev)
{
	return VNIC_RSS_KEY_LEN;
}

static u32 vnic_eth_get_rxfh_indir_size(struct net_device *dev)
{
	return VNIC_RSS_INDIR_LEN;
}

static int vnic_eth_get_rxfh(struct net_device *dev, struct ethtool_rxfh_param *rxfh)
{
	struct vnic_ctx *ctx = vnic_dev_ctx(dev);
	unsigned int i;

	if (!ctx || !ctx->eops)
		return -ENODEV;
	rxfh->hfunc = ETH_RSS_HASH_TOP;
	vnic_lock_bh(ctx);
	if (rxfh->indir)
		for (i = 0; i < VNIC_RSS_INDIR_LEN; i++)
			rxfh->indir[i] = ctx->rss.default_indir ?
				ethtool_rxfh_indir_default(i, dev->real_num_rx_queues) :
				ctx->rss.indir[i];
	if (rxfh->key)
		memcpy(rxfh->key, ctx->rss.key, VNIC_RSS_KEY_LEN);
	vnic_unlock_bh(ctx);
	return 0;
}

static int vnic_eth_set_rxfh(struct net_device *dev, struct ethtool_rxfh_param *rxfh,
			     struct netlink_ext_ack *extack)
{
	struct vnic_ctx *ctx = vnic_dev_ctx(dev);
	u16 old_indir[VNIC_RSS_INDIR_LEN];
	u8 old_key[VNIC_RSS_KEY_LEN];
	bool old_di, old_dk;
	struct vnic_rss *rss;
	unsigned int i;
	int err;
	u32 ver;

	if (!ctx || !ctx->eops)
		return -ENODEV;
	if (rxfh->hfunc != ETH_RSS_HASH_NO_CHANGE && rxfh->hfunc != ETH_RSS_HASH_TOP) {
		NL_SET_ERR_MSG_MOD(extack, "the device hashes with Toeplitz only");
		return -EOPNOTSUPP;
	}
	if (rxfh->rss_context) {
		NL_SET_ERR_MSG_MOD(extack, "the device has the default RSS context only");
		return -EOPNOTSUPP;
	}
	if (rxfh->input_xfrm && rxfh->input_xfrm != RXH_XFRM_NO_CHANGE) {
		NL_SET_ERR_MSG_MOD(extack, "the device has no input transformation");
		return -EOPNOTSUPP;
	}
	if (!rxfh->indir && !rxfh->key)
		return 0;
	if (rxfh->indir)
		for (i = 0; i < VNIC_RSS_INDIR_LEN; i++)
			if (rxfh->indir[i] >= dev->real_num_rx_queues)
				return -EINVAL;

	rss = &ctx->rss;
	vnic_lock_bh(ctx);
	memcpy(old_key, rss->key, VNIC_RSS_KEY_LEN);
	memcpy(old_indir, rss->indir, sizeof(old_indir));
	old_di = rss->default_indir;
	old_dk = rss->default_key;
	if (rxfh->indir) {
		for (i = 0; i < VNIC_RSS_INDIR_LEN; i++)
			rss->indir[i] = rxfh->indir[i];
		rss->default_indir = false;
	}
	if (rxfh->key) {
		memcpy(rss->key, rxfh->key, VNIC_RSS_KEY_LEN);
		rss->default_key = false;
	}
	vnic_eth_rss_op_locked(ctx);
	ver = vnic_eth_change_locked(ctx, &rss->req);
	vnic_unlock_bh(ctx);

	err = vnic_eth_wait(ctx, &rss->req, ver);
	if (err && err != -ETIMEDOUT) {
		vnic_lock_bh(ctx);
		memcpy(rss->key, old_key, VNIC_RSS_KEY_LEN);
		memcpy(rss->indir, old_indir, sizeof(old_indir));
		rss->default_indir = old_di;
		rss->default_key = old_dk;
		vnic_eth_rss_op_locked(ctx);
		vnic_unlock_bh(ctx);
		NL_SET_ERR_MSG_MOD(extack, "the device refused the RSS configuration");
	}
	return err;
}
#endif /* VNIC_HAVE_RXFH_PARAM */

/**
 * vnic_eth_layout - the device's own table when the kernel's is not the user's
 * @ctx: an installed context
 *
 * Work item, RTNL held (so that no set_rxfh is between its driver call and
 * the core's update of IFF_RXFH_CONFIGURED). A table the user never set (or
 * reset with `ethtool -X default`) follows the number of queues: the
 * device's round-robin table does that by itself.
 */
void vnic_eth_layout(struct vnic_ctx *ctx)
{
	ASSERT_RTNL();
	if (!ctx->eops || !(ctx->eth_feat & VNIC_FEAT_RSS) ||
	    netif_is_rxfh_configured(ctx->dev))
		return;
	vnic_lock_bh(ctx);
	if (!ctx->rss.default_indir) {
		ctx->rss.default_indir = true;
		vnic_eth_rss_op_locked(ctx);
		vnic_eth_change_locked(ctx, &ctx->rss.req);
	}
	vnic_unlock_bh(ctx);
}

/**
 * vnic_eth_layout_due - whether vnic_eth_layout() has work
 * @ctx: the context
 *
 * Work item, no lock: a hint, confirmed under RTNL.
 *
 * Return: true when the device holds a table the kernel no longer calls the
 * user's.
 */
bool vnic_eth_layout_due(struct vnic_ctx *ctx)
{
	return ctx->eops && (ctx->eth_feat & VNIC_FEAT_RSS) &&
	       !READ_ONCE(ctx->rss.default_indir) && !netif_is_rxfh_configured(ctx->dev);
}

/* ------------------------------------------------------------------------ */
/* Frames (the management window; mgmt.c calls these)                       */

/**
 * vnic_eth_build_locked - the next rule or RSS request frame
 * @ctx: the context, ctx->lock held
 * @s: the window slot of @seq: its buffer, type, op count and length are set
 * @seq: the frame's sequence number
 *
 * RSS first, then the dirty rule locations in order, as many of one kind
 * (RULE_SET or RULE_DEL) as fit in a frame and the device takes.
 *
 * Return: false if no request is due.
 */
bool vnic_eth_build_locked(struct vnic_ctx *ctx, struct vnic_slot *s, u32 seq)
{
	u8 *b = s->buf + ETH_HLEN + VNIC_HDR_LEN;
	unsigned int i, n = 0, max = 0, oplen;
	struct vnic_eth_req *rq;
	struct vnic_rule *r;
	u8 type = 0;

	if (!ctx->eth_dirty)
		return false;
	rq = &ctx->rss.req;
	if (rq->dirty) {
		vnic_eth_unmark_locked(ctx, rq);
		rq->inflight = true;
		rq->seq = seq;
		rq->sent_ver = rq->ver;
		memcpy(b, ctx->rss.op, VNIC_RSS_OP);
		ctx->c.rss_ops++;
		s->type = VNIC_T_RSS_SET;
		s->nops = 1;
		s->len = vnic_mgmt_put_hdr(ctx, s->buf, VNIC_T_RSS_SET, seq, 1, VNIC_RSS_OP);
		return true;
	}
	for (i = 0; i < ctx->nr_rules && ctx->eth_dirty; i++) {
		r = &ctx->rules[i];
		if (!r->req.dirty)
			continue;
		if (!type) {
			type = r->want ? VNIC_T_RULE_SET : VNIC_T_RULE_DEL;
			max = vnic_mgmt_max_ops(ctx, r->want ? VNIC_RULE_FIT : VNIC_RULE_DEL_FIT);
		} else if (type != (r->want ? VNIC_T_RULE_SET : VNIC_T_RULE_DEL)) {
			continue;
		}
		vnic_eth_unmark_locked(ctx, &r->req);
		r->req.inflight = true;
		r->req.seq = seq;
		r->req.sent_ver = r->req.ver;
		if (r->want)
			memcpy(b, r->op, VNIC_RULE_OP);
		else
			put_unaligned_be32(i, b);
		b += vnic_mgmt_op_len(type);
		if (++n == max)
			break;
	}
	if (!n)
		return false;
	if (type == VNIC_T_RULE_SET)
		ctx->c.rule_set_ops += n;
	else
		ctx->c.rule_del_ops += n;
	oplen = vnic_mgmt_op_len(type);
	s->type = type;
	s->nops = n;
	s->len = vnic_mgmt_put_hdr(ctx, s->buf, type, seq, n, n * oplen);
	return true;
}

static struct vnic_eth_req *vnic_eth_req_of(struct vnic_ctx *ctx, u8 type, const u8 *op,
					    struct vnic_rule **rule)
{
	u32 loc;

	*rule = NULL;
	if (type == VNIC_T_RSS_SET)
		return &ctx->rss.req;
	loc = get_unaligned_be32(op);
	if (loc >= ctx->nr_rules)
		return NULL;	/* cannot happen: we built the op */
	*rule = &ctx->rules[loc];
	return &(*rule)->req;
}

/**
 * vnic_eth_op_acked_locked - the device's answer to one rule or RSS op
 * @ctx: the context, ctx->lock held
 * @s: the slot of the request frame
 * @op: the op, in @s's buffer
 * @st: its status, or -1 when the frame was NAKed
 *
 * An answer to an op that a later one of the same request superseded is
 * ignored: that one's ACK decides.
 */
void vnic_eth_op_acked_locked(struct vnic_ctx *ctx, const struct vnic_slot *s,
			      const u8 *op, int st)
{
	struct vnic_eth_req *rq;
	struct vnic_rule *r;

	rq = vnic_eth_req_of(ctx, s->type, op, &r);
	if (!rq || !rq->inflight || rq->seq != s->seq)
		return;
	rq->inflight = false;
	rq->status = st;
	if (vnic_eth_errno(st)) {
		ctx->c.eth_refused++;
		if (net_ratelimit())
			vnic_warn(ctx, "device refused %s op%s%u: status %d\n",
				  s->type == VNIC_T_RSS_SET ? "an RSS" : "a rule",
				  r ? " at location " : "", r ? (unsigned int)(r - ctx->rules) : 0,
				  st);
	} else {
		ctx->c.eth_ok++;
		if (r)
			r->on_dev = s->type == VNIC_T_RULE_SET;
	}
	WRITE_ONCE(rq->acked_ver, rq->sent_ver);
	wake_up(&ctx->eth_wq);
}

/**
 * vnic_eth_unacked_locked - a rule or RSS frame the window reset dropped
 * @ctx: the context, ctx->lock held
 * @s: its slot, never acknowledged
 * @table_lost: the device has a new generation (vnic_eth_replay_locked()
 *	follows and decides what to send)
 *
 * Setting a rule, deleting one and setting RSS are idempotent: whether or
 * not the device applied the frame, sending its ops again is right.
 */
void vnic_eth_unacked_locked(struct vnic_ctx *ctx, const struct vnic_slot *s, bool table_lost)
{
	const u8 *op = s->buf + ETH_HLEN + VNIC_HDR_LEN;
	unsigned int i, oplen = vnic_mgmt_op_len(s->type);
	struct vnic_eth_req *rq;
	struct vnic_rule *r;

	for (i = 0; i < s->nops; i++, op += oplen) {
		rq = vnic_eth_req_of(ctx, s->type, op, &r);
		if (!rq || !rq->inflight || rq->seq != s->seq)
			continue;
		rq->inflight = false;
		if (!table_lost)
			vnic_eth_mark_locked(ctx, rq);
	}
}

/**
 * vnic_eth_replay_locked - the device lost its rules and RSS configuration
 * @ctx: the context, ctx->lock held
 *
 * New generation: every wanted rule and a configuration other than the
 * default are sent again; a deletion or a default due has nothing left to
 * do, and the ethtool call waiting for it (if any) has its answer.
 */
void vnic_eth_replay_locked(struct vnic_ctx *ctx)
{
	struct vnic_rss *rss = &ctx->rss;
	unsigned int i;

	for (i = 0; i < ctx->nr_rules; i++) {
		struct vnic_rule *r = &ctx->rules[i];

		r->on_dev = false;
		r->req.inflight = false;
		if (r->want) {
			vnic_eth_mark_locked(ctx, &r->req);
			ctx->c.eth_replayed++;
		} else if (r->req.dirty || r->req.acked_ver != r->req.ver) {
			vnic_eth_settle_locked(ctx, &r->req);
		}
	}
	if (!ctx->eops || !(ctx->eth_feat & VNIC_FEAT_RSS))
		return;
	rss->req.inflight = false;
	if (!rss->default_indir || !rss->default_key) {
		vnic_eth_mark_locked(ctx, &rss->req);
		ctx->c.eth_replayed++;
	} else if (rss->req.dirty || rss->req.acked_ver != rss->req.ver) {
		vnic_eth_settle_locked(ctx, &rss->req);
	}
}

/**
 * vnic_eth_reset_device_locked - make the device's rules and RSS ours
 * @ctx: the context, ctx->lock held, becoming active
 *
 * A previous instance of the module may have left rules and an RSS
 * configuration behind (the FLUSH at attach removes filters only): every
 * location is set or deleted, and the RSS configuration sent.
 */
void vnic_eth_reset_device_locked(struct vnic_ctx *ctx)
{
	unsigned int i;

	for (i = 0; i < ctx->nr_rules; i++)
		vnic_eth_mark_locked(ctx, &ctx->rules[i].req);
	if (ctx->eops && (ctx->eth_feat & VNIC_FEAT_RSS))
		vnic_eth_mark_locked(ctx, &ctx->rss.req);
}

/* ------------------------------------------------------------------------ */
/* Install and teardown                                                     */

/**
 * vnic_eth_install - give the netdev our ethtool ops, when the device has rules or RSS
 * @ctx: the context, its CAPS received
 *
 * Under RTNL, from the install of the netdev hooks. Nothing to do for a
 * device without the extensions; failing to allocate leaves ethtool as it
 * was (aRFS does not need it).
 *
 * Return: 0, or -ENOMEM.
 */
int vnic_eth_install(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	struct vnic_rule *rules = NULL;
	struct ethtool_ops *eops;
	unsigned int nr = 0;
	u32 feat;

	ASSERT_RTNL();
	vnic_lock_bh(ctx);
	feat = ctx->caps.features;
	if (feat & VNIC_FEAT_RULES)
		nr = min_t(unsigned int, ctx->caps.max_rules, VNIC_MAX_RULES);
	vnic_unlock_bh(ctx);
#ifndef VNIC_HAVE_RXFH_PARAM
	feat &= ~VNIC_FEAT_RSS;		/* before 6.8: no struct ethtool_rxfh_param */
#endif
	if (!(feat & VNIC_FEAT_KNOWN) || !dev->ethtool_ops)
		return 0;
	if (nr) {
		rules = kvcalloc(nr, sizeof(*rules), GFP_KERNEL);
		if (!rules)
			return -ENOMEM;
	}
	eops = kmemdup(dev->ethtool_ops, sizeof(*eops), GFP_KERNEL);
	if (!eops) {
		kvfree(rules);
		return -ENOMEM;
	}
	if (nr) {
		eops->get_rxnfc = vnic_eth_get_rxnfc;
		eops->set_rxnfc = vnic_eth_set_rxnfc;
#ifdef VNIC_HAVE_CAP_RSS_RXNFC_ADDS
		/* RULE_SET action 3: the context's queue plus the rule's */
		eops->cap_rss_rxnfc_adds = 1;
#endif
	}
#ifdef VNIC_HAVE_RXFH_PARAM
	if (feat & VNIC_FEAT_RSS) {
		eops->get_rxfh_key_size = vnic_eth_get_rxfh_key_size;
		eops->get_rxfh_indir_size = vnic_eth_get_rxfh_indir_size;
		eops->get_rxfh = vnic_eth_get_rxfh;
		eops->set_rxfh = vnic_eth_set_rxfh;
#ifdef VNIC_HAVE_RXFH_FIELDS
		eops->get_rxfh_fields = vnic_eth_get_rxfh_fields;
		eops->set_rxfh_fields = vnic_eth_set_rxfh_fields;
#endif
	}
#endif

	vnic_lock_bh(ctx);
	ctx->rules = rules;
	ctx->nr_rules = nr;
	ctx->eth_feat = feat;
	memcpy(ctx->rss.key, vnic_eth_default_key, VNIC_RSS_KEY_LEN);
	ctx->rss.default_indir = true;
	ctx->rss.default_key = true;
	vnic_eth_rss_op_locked(ctx);
	vnic_unlock_bh(ctx);
	ctx->orig_eops = dev->ethtool_ops;
	ctx->eops = eops;
	WRITE_ONCE(dev->ethtool_ops, eops);
	return 0;
}

/**
 * vnic_eth_unhook - give the netdev its ethtool ops back
 * @ctx: the context
 *
 * Under RTNL, from vnic_dev_unhook(), before its last synchronize_net():
 * after that no caller holds our copy, and vnic_eth_release() frees it.
 * The device keeps the rules and RSS: the FLUSH(unload) of module exit
 * removes them with the filters (a NETDEV_UNREGISTER's device is gone).
 */
void vnic_eth_unhook(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;

	ASSERT_RTNL();
	if (!ctx->eops)
		return;
	if (dev->ethtool_ops == ctx->eops) {
		WRITE_ONCE(dev->ethtool_ops, ctx->orig_eops);
	} else {
		/* replaced after us: neuter our copy, leak it (see vnic_dev_unhook()) */
		vnic_warn(ctx, "ethtool_ops were replaced after ours: leaving them, neutering our copy\n");
		*ctx->eops = *ctx->orig_eops;
		kmemleak_not_leak(ctx->eops);
		ctx->eops = NULL;
	}
}

/**
 * vnic_eth_release - free the rules and our ethtool ops copy
 * @ctx: the context: unhooked, its packet handler removed
 *
 * Under RTNL, from vnic_dev_release().
 */
void vnic_eth_release(struct vnic_ctx *ctx)
{
	ASSERT_RTNL();
	kfree(ctx->eops);
	ctx->eops = NULL;
	kvfree(ctx->rules);
	ctx->rules = NULL;
	ctx->nr_rules = 0;
}
