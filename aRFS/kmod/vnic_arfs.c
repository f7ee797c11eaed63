// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_arfs: accelerated RFS for a stock virtio_net netdev backed by the vnic
 * device.
 *
 * The module attaches to virtio_net netdevs whose device answers a HELLO
 * management frame with CAPS, and then gives them what the kernel's RFS code
 * needs to call a driver: a copy of the netdev_ops with ndo_rx_flow_steer,
 * NETIF_F_NTUPLE and an rx_cpu_rmap. Filters are sent to the device in-band,
 * as Ethernet frames of EtherType 0x88B5 (aRFS/PROTOCOL.md), with go-back-N
 * reliable delivery; expiry is polled with rps_may_expire_flow() plus an
 * idle-time backstop. See README.md in this directory.
 *
 * Locking: ctx->lock protects the session, the window and the filter table.
 * ndo_rx_flow_steer runs in softirq with RCU held and takes it with
 * spin_lock(); the packet handler takes it with spin_lock_bh(); the work item,
 * debugfs and the notifier take it with spin_lock_bh(). Attach, install and
 * teardown of the netdev hooks run under RTNL. The work item never blocks on
 * RTNL (it uses rtnl_trylock), so teardown may cancel it synchronously under
 * RTNL.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/version.h>
#include <linux/netdevice.h>
#include <linux/etherdevice.h>
#include <linux/if_ether.h>
#include <linux/skbuff.h>
#include <linux/rtnetlink.h>
#include <linux/cpu_rmap.h>
#include <linux/cpumask.h>
#include <linux/cpu.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <linux/hashtable.h>
#include <linux/jhash.h>
#include <linux/random.h>
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/completion.h>
#include <linux/pkt_sched.h>
#include <linux/unaligned.h>
#include <net/flow_dissector.h>
#include <net/netdev_rx_queue.h>
#include <net/rps.h>

#include "vnic_arfs.h"

#if !IS_ENABLED(CONFIG_RFS_ACCEL)
#error "vnic_arfs needs a kernel built with CONFIG_RFS_ACCEL=y"
#endif

/* ------------------------------------------------------------------------ */
/* Module parameters                                                        */

static char *ifnames;
module_param(ifnames, charp, 0444);
MODULE_PARM_DESC(ifnames,
		 "comma-separated interface names to attach to (default: every virtio_net netdev)");

static unsigned int interval_ms = 100;
module_param(interval_ms, uint, 0644);
MODULE_PARM_DESC(interval_ms, "period of the work item: send, retransmit, expiry pass (ms, default 100)");

static unsigned int expire_quota = 64;
module_param(expire_quota, uint, 0644);
MODULE_PARM_DESC(expire_quota, "filters examined per expiry pass, round-robin (default 64)");

static unsigned int idle_timeout_ms = 5000;
module_param(idle_timeout_ms, uint, 0644);
MODULE_PARM_DESC(idle_timeout_ms,
		 "delete a filter whose flow had no steer call for this long (ms, 0 = off, default 5000)");

static unsigned int retransmit_ms = 200;
module_param(retransmit_ms, uint, 0644);
MODULE_PARM_DESC(retransmit_ms,
		 "retransmit timeout on top of the device's programming latency (ms, default 200)");

static unsigned int hello_timeout_ms = 3000;
module_param(hello_timeout_ms, uint, 0644);
MODULE_PARM_DESC(hello_timeout_ms,
		 "give up on a device that does not answer HELLO with CAPS (ms while up, default 3000)");

static unsigned int keepalive_ms = 2000;
module_param(keepalive_ms, uint, 0644);
MODULE_PARM_DESC(keepalive_ms,
		 "send HELLO after this long without a device frame, to notice a device reset (ms, 0 = off, default 2000)");

static unsigned int reject_holdoff_ms = 1000;
module_param(reject_holdoff_ms, uint, 0644);
MODULE_PARM_DESC(reject_holdoff_ms,
		 "answer -EBUSY for a flow the device rejected, for this long (ms, default 1000)");

static unsigned int mgmt_txq;
module_param(mgmt_txq, uint, 0444);
MODULE_PARM_DESC(mgmt_txq, "tx queue carrying the management frames (default 0)");

/* ------------------------------------------------------------------------ */
/* Data structures                                                          */

/* A flow as the guest receives it: src = remote peer, dst = this host. */
struct vnic_flow {
	u8 family;		/* 4 or 6 */
	u8 proto;		/* IPPROTO_TCP or IPPROTO_UDP */
	u16 pad;
	__be16 sport;
	__be16 dport;
	u8 saddr[16];		/* IPv4 in bytes 0..3, zeros after */
	u8 daddr[16];
};

enum vnic_fstate {
	VF_LIVE,		/* in the flow hash and live_list, owns an id */
	VF_DELETING,		/* DEL queued or in flight; owns its id until ACKed */
	VF_REJECTED,		/* device refused it: no id, in the flow hash for the hold-off */
};

struct vnic_filter {
	struct hlist_node hnode;	/* ctx->flows (LIVE, REJECTED) */
	struct list_head node;		/* live_list (LIVE) or rej_list (REJECTED) */
	struct list_head pend;		/* add_list or del_list, while @pending */
	struct vnic_flow key;
	u32 hash;
	u32 flow_id;			/* from the last steer call */
	u32 add_seq;			/* frame of the last ADD sent */
	u32 del_seq;			/* frame of the DEL */
	unsigned long last_seen;	/* jiffies of the last steer call */
	unsigned long since;		/* created, or rejected */
	u16 id;
	u16 rxq;			/* queue the next ADD carries */
	u16 slot_rxq;			/* queue of the last steer call (its RFS slot) */
	u16 dev_rxq;			/* queue of the last ADD the device ACKed ok */
	u8 state;
	u8 del_reason;
	u8 rej_status;
	bool pending;
	bool add_inflight;
	bool on_dev;			/* an ADD of this id was ACKed ok */
	bool sent;			/* an ADD went out in this generation */
	bool resteer_blocked;		/* a re-steer was refused at @since */
};

struct vnic_slot {
	u32 seq;
	bool used;
	bool acked;
	u8 type;
	u16 nops;
	u8 retries;
	u16 len;			/* whole frame, Ethernet header included */
	unsigned long sent_at;
	u8 buf[VNIC_FRAME_MAX];
};

struct vnic_caps {
	u16 max_queue_pairs;
	u16 enabled_queue_pairs;
	u32 capacity;
	u32 buckets;
	u16 ways;
	u16 max_ops;
	u32 latency_us;
};

struct vnic_counters {
	u64 steer_calls, steer_dedup, adds, resteers;
	u64 busy, busy_rejected, unsupported, bad_rxq, nomem;
	u64 del[VNIC_R_MAX + 1];	/* deletes ACKed ok, by reason */
	u64 del_unknown;		/* DEL answered unknown_id */
	u64 del_cancelled;		/* removed before its ADD was sent */
	u64 del_lost;			/* made moot by a device reset */
	u64 add_ops, del_ops, add_ok, replaced_rejected;
	u64 rej[VNIC_S_MAX + 1];	/* ops answered with a non-ok status */
	u64 rej_other;
	u64 frames_sent, retransmits, hellos, flushes, flush_acks, acks;
	u64 naks, rx_malformed, rx_stale, rx_wrong_gen, xmit_errors;
	u64 gen_changes, replays, replayed, rmap_rebuilds, ntuple_flushes, queue_flushes;
	u64 stalls;
};

enum vnic_state {
	VS_PROBING,		/* HELLO sent, waiting for CAPS */
	VS_CAPS,		/* CAPS received, hooks not installed yet */
	VS_ACTIVE,
	VS_FAILED,		/* device never answered: netdev left untouched */
};

static const char * const vnic_state_names[] = {
	[VS_PROBING] = "probing", [VS_CAPS] = "installing",
	[VS_ACTIVE] = "active", [VS_FAILED] = "failed",
};

struct vnic_ctx {
	struct list_head list;		/* vnic_devs; RCU for readers, RTNL for writers */
	struct rcu_head rcu;
	struct net_device *dev;
	netdevice_tracker tracker;
	struct packet_type pt;
	struct delayed_work work;
	struct dentry *dbg;

	/* RTNL (or the work item before install) */
	bool pack_added;
	bool installed;
	bool had_ntuple;
	struct net_device_ops *ops;
	const struct net_device_ops *orig_ops;
	struct cpu_rmap *rmap;		/* work item and teardown only */
	unsigned int rmap_nq;
	unsigned int rmap_ncpu;

	spinlock_t lock;
	int state;
	bool dying;			/* teardown started */
	bool no_kick;			/* work item must not be re-armed */
	bool kicked;
	bool have_gen;
	bool hello_out;
	bool resync;
	bool flush_pending;
	u8 flush_reason;
	bool table_full;
	bool unload_wait;
	u32 gen;
	u32 hello_seq;
	u32 una;			/* oldest unacked request */
	u32 next_seq;			/* next request sequence number */
	u32 unload_seq;
	unsigned long hello_sent_at;
	unsigned long probe_start;
	unsigned long last_rx;
	unsigned long table_full_since;
	struct vnic_caps caps;
	struct completion unload_done;

	struct xarray ids;		/* id -> filter, every filter that owns an id */
	u32 id_next;
	unsigned int nr_ids;
	unsigned int nr_live;
	unsigned int nr_rejected;
	u32 seed;
	DECLARE_HASHTABLE(flows, 10);
	struct list_head live_list;
	struct list_head rej_list;
	struct list_head add_list;
	struct list_head del_list;
	struct vnic_counters c;

	u8 hello_buf[ETH_HLEN + VNIC_HDR_LEN + VNIC_HELLO_BODY];
	u8 flush_buf[ETH_HLEN + VNIC_HDR_LEN + VNIC_FLUSH_BODY];
	struct vnic_slot slots[VNIC_WINDOW];
};

static LIST_HEAD(vnic_devs);
static struct workqueue_struct *vnic_wq;
static struct dentry *vnic_dbg_root;
static bool vnic_unloading;

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */

static bool seq_before(u32 a, u32 b)
{
	return (s32)(a - b) < 0;
}

static struct vnic_slot *vnic_slot(struct vnic_ctx *ctx, u32 seq)
{
	return &ctx->slots[seq % VNIC_WINDOW];
}

/* Retransmit timeout: always longer than the programming latency. */
static unsigned long vnic_rto(const struct vnic_ctx *ctx)
{
	u32 lat = min_t(u32, ctx->caps.latency_us, 10 * USEC_PER_SEC);

	return msecs_to_jiffies(max_t(unsigned int, retransmit_ms, 1)) +
	       usecs_to_jiffies(lat) + 1;
}

static void vnic_kick_locked(struct vnic_ctx *ctx)
{
	if (ctx->kicked || ctx->no_kick || ctx->dying)
		return;
	ctx->kicked = true;
	mod_delayed_work(vnic_wq, &ctx->work, 0);
}

static void vnic_kick(struct vnic_ctx *ctx)
{
	spin_lock_bh(&ctx->lock);
	vnic_kick_locked(ctx);
	spin_unlock_bh(&ctx->lock);
}

static void vnic_resched(struct vnic_ctx *ctx, unsigned long delay)
{
	spin_lock_bh(&ctx->lock);
	if (!ctx->no_kick && !ctx->dying)
		queue_delayed_work(vnic_wq, &ctx->work, delay);
	spin_unlock_bh(&ctx->lock);
}

static bool vnic_link_ok(const struct net_device *dev)
{
	return netif_running(dev) && netif_carrier_ok(dev);
}

static bool vnic_is_virtio_net(const struct net_device *dev)
{
	const struct device *parent = dev->dev.parent;

	return parent && parent->driver && parent->driver->name &&
	       !strcmp(parent->driver->name, "virtio_net");
}

static bool vnic_name_wanted(const char *name)
{
	const char *p = ifnames;
	size_t len = strlen(name);

	if (!p || !*p)
		return true;
	while (*p) {
		const char *end = strchrnul(p, ',');

		if ((size_t)(end - p) == len && !memcmp(p, name, len))
			return true;
		p = *end ? end + 1 : end;
	}
	return false;
}

/* Under RTNL. */
static struct vnic_ctx *vnic_find(const struct net_device *dev)
{
	struct vnic_ctx *ctx;

	list_for_each_entry(ctx, &vnic_devs, list)
		if (ctx->dev == dev)
			return ctx;
	return NULL;
}

/* Under rcu_read_lock (ndo_rx_flow_steer is called with it held). */
static struct vnic_ctx *vnic_find_rcu(const struct net_device *dev)
{
	struct vnic_ctx *ctx;

	list_for_each_entry_rcu(ctx, &vnic_devs, list)
		if (ctx->dev == dev)
			return ctx;
	return NULL;
}

/* ------------------------------------------------------------------------ */
/* Filter table                                                             */

static int vnic_flow_from_skb(const struct sk_buff *skb, struct vnic_flow *k)
{
	struct flow_keys fk;

	memset(k, 0, sizeof(*k));
	if (skb->encapsulation)
		return -EPROTONOSUPPORT;
	if (!skb_flow_dissect_flow_keys(skb, &fk, 0))
		return -EPROTONOSUPPORT;
	if (fk.control.flags & (FLOW_DIS_IS_FRAGMENT | FLOW_DIS_ENCAPSULATION))
		return -EPROTONOSUPPORT;
	if (fk.basic.ip_proto != IPPROTO_TCP && fk.basic.ip_proto != IPPROTO_UDP)
		return -EPROTONOSUPPORT;

	if (fk.basic.n_proto == htons(ETH_P_IP) &&
	    fk.control.addr_type == FLOW_DISSECTOR_KEY_IPV4_ADDRS) {
		k->family = 4;
		memcpy(k->saddr, &fk.addrs.v4addrs.src, 4);
		memcpy(k->daddr, &fk.addrs.v4addrs.dst, 4);
	} else if (fk.basic.n_proto == htons(ETH_P_IPV6) &&
		   fk.control.addr_type == FLOW_DISSECTOR_KEY_IPV6_ADDRS) {
		k->family = 6;
		memcpy(k->saddr, &fk.addrs.v6addrs.src, 16);
		memcpy(k->daddr, &fk.addrs.v6addrs.dst, 16);
	} else {
		return -EPROTONOSUPPORT;
	}
	k->proto = fk.basic.ip_proto;
	k->sport = fk.ports.src;
	k->dport = fk.ports.dst;
	return 0;
}

static struct vnic_filter *vnic_flow_lookup(struct vnic_ctx *ctx,
					    const struct vnic_flow *key, u32 hash)
{
	struct vnic_filter *f;

	hash_for_each_possible(ctx->flows, f, hnode, hash)
		if (f->hash == hash && !memcmp(&f->key, key, sizeof(*key)))
			return f;
	return NULL;
}

static void vnic_queue_add_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	if (f->pending)
		return;
	list_add_tail(&f->pend, &ctx->add_list);
	f->pending = true;
}

/* Free a filter that owns an id (LIVE already unlinked, or DELETING). */
static void vnic_filter_free_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	if (f->pending)
		list_del(&f->pend);
	xa_erase(&ctx->ids, f->id);
	ctx->nr_ids--;
	kfree(f);
}

/* Take a LIVE filter out of service; the device is told with a DEL. */
static void vnic_filter_del_locked(struct vnic_ctx *ctx, struct vnic_filter *f,
				   u8 reason)
{
	hash_del(&f->hnode);
	list_del(&f->node);
	ctx->nr_live--;
	if (f->pending) {
		list_del(&f->pend);
		f->pending = false;
	}
	if (!f->sent) {
		/* the device never saw this id: nothing to delete there */
		ctx->c.del_cancelled++;
		vnic_filter_free_locked(ctx, f);
		return;
	}
	f->state = VF_DELETING;
	f->del_reason = reason;
	f->add_inflight = false;
	list_add_tail(&f->pend, &ctx->del_list);
	f->pending = true;
}

/* The device refused the first ADD of a filter: free the id, and keep the
 * flow in the hash for reject_holdoff_ms so that the steer calls the kernel
 * keeps making for it (6.12) get -EBUSY instead of a new ADD each time.
 */
static void vnic_filter_reject_locked(struct vnic_ctx *ctx, struct vnic_filter *f,
				      u8 status)
{
	list_del(&f->node);
	ctx->nr_live--;
	if (f->pending) {
		list_del(&f->pend);
		f->pending = false;
	}
	xa_erase(&ctx->ids, f->id);
	ctx->nr_ids--;
	f->id = VNIC_NO_FILTER;
	f->state = VF_REJECTED;
	f->rej_status = status;
	f->since = jiffies;
	list_add_tail(&f->node, &ctx->rej_list);
	ctx->nr_rejected++;
}

static void vnic_rejected_free_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	hash_del(&f->hnode);
	list_del(&f->node);
	ctx->nr_rejected--;
	kfree(f);
}

static void vnic_del_all_locked(struct vnic_ctx *ctx, u8 reason)
{
	struct vnic_filter *f, *tmp;

	list_for_each_entry_safe(f, tmp, &ctx->live_list, node)
		vnic_filter_del_locked(ctx, f, reason);
}

/* ------------------------------------------------------------------------ */
/* ndo_rx_flow_steer: softirq, RCU held. No sleeping, bounded work.         */

static int vnic_rx_flow_steer(struct net_device *dev, const struct sk_buff *skb,
			      u16 rxq_index, u32 flow_id)
{
	struct vnic_ctx *ctx = vnic_find_rcu(dev);
	struct vnic_filter *f;
	struct vnic_flow key;
	unsigned long now = jiffies;
	u32 hash, id;
	int ret, err;

	if (!ctx)
		return -ENODEV;
	ret = vnic_flow_from_skb(skb, &key);

	spin_lock(&ctx->lock);
	ctx->c.steer_calls++;
	if (ret) {
		ctx->c.unsupported++;
		goto out;
	}
	if (ctx->state != VS_ACTIVE || ctx->dying) {
		ret = -ENODEV;
		goto out;
	}
	if (rxq_index >= READ_ONCE(dev->real_num_rx_queues)) {
		ctx->c.bad_rxq++;
		ret = -EINVAL;
		goto out;
	}

	hash = jhash2((const u32 *)&key, sizeof(key) / sizeof(u32), ctx->seed);
	f = vnic_flow_lookup(ctx, &key, hash);
	if (f && f->state == VF_LIVE) {
		f->last_seen = now;
		f->flow_id = flow_id;
		f->slot_rxq = rxq_index;
		ret = f->id;
		if (f->rxq == rxq_index) {
			ctx->c.steer_dedup++;
			goto out;
		}
		if (f->resteer_blocked &&
		    time_before(now, f->since + msecs_to_jiffies(reject_holdoff_ms))) {
			/* the device refused this move lately: no ADD per packet */
			ctx->c.busy++;
			ctx->c.busy_rejected++;
			ret = -EBUSY;
			goto out;
		}
		f->resteer_blocked = false;
		f->rxq = rxq_index;
		ctx->c.resteers++;
		vnic_queue_add_locked(ctx, f);
		vnic_kick_locked(ctx);
		goto out;
	}
	if (f) {		/* VF_REJECTED */
		if (time_before(now, f->since + msecs_to_jiffies(reject_holdoff_ms))) {
			ctx->c.busy++;
			ctx->c.busy_rejected++;
			ret = -EBUSY;
			goto out;
		}
		vnic_rejected_free_locked(ctx, f);
	}

	if (ctx->table_full &&
	    time_after(now, ctx->table_full_since + msecs_to_jiffies(reject_holdoff_ms)))
		ctx->table_full = false;
	if (ctx->table_full || ctx->nr_ids >= min_t(u32, ctx->caps.capacity, VNIC_MAX_ID + 1)) {
		ctx->c.busy++;
		ret = -EBUSY;
		goto out;
	}

	f = kzalloc(sizeof(*f), GFP_ATOMIC);
	if (!f) {
		ctx->c.nomem++;
		ret = -ENOMEM;
		goto out;
	}
	err = xa_alloc_cyclic(&ctx->ids, &id, f, XA_LIMIT(0, VNIC_MAX_ID),
			      &ctx->id_next, GFP_ATOMIC);
	if (err < 0) {
		kfree(f);
		if (err == -EBUSY)
			ctx->c.busy++;
		else
			ctx->c.nomem++;
		ret = err;
		goto out;
	}
	f->key = key;
	f->hash = hash;
	f->id = id;
	f->rxq = rxq_index;
	f->slot_rxq = rxq_index;
	f->dev_rxq = rxq_index;
	f->flow_id = flow_id;
	f->last_seen = now;
	f->since = now;
	f->state = VF_LIVE;
	hash_add(ctx->flows, &f->hnode, hash);
	list_add_tail(&f->node, &ctx->live_list);
	vnic_queue_add_locked(ctx, f);
	ctx->nr_ids++;
	ctx->nr_live++;
	ctx->c.adds++;
	vnic_kick_locked(ctx);
	ret = id;
out:
	spin_unlock(&ctx->lock);
	return ret;
}

/* ------------------------------------------------------------------------ */
/* Frames                                                                   */

static unsigned int vnic_put_hdr(struct vnic_ctx *ctx, u8 *buf, u8 type, u32 seq,
				 u16 count, u16 body_len)
{
	u8 *h = buf + ETH_HLEN;

	eth_broadcast_addr(buf);
	memcpy(buf + ETH_ALEN, ctx->dev->dev_addr, ETH_ALEN);
	put_unaligned_be16(VNIC_ETH_P, buf + 2 * ETH_ALEN);
	put_unaligned_be16(VNIC_MAGIC, h + VNIC_OFF_MAGIC);
	h[VNIC_OFF_VERSION] = VNIC_VERSION;
	h[VNIC_OFF_TYPE] = type;
	put_unaligned_be32(seq, h + VNIC_OFF_SEQ);
	put_unaligned_be32(ctx->have_gen ? ctx->gen : 0, h + VNIC_OFF_GEN);
	put_unaligned_be16(count, h + VNIC_OFF_COUNT);
	put_unaligned_be16(body_len, h + VNIC_OFF_BODYLEN);
	return ETH_HLEN + VNIC_HDR_LEN + body_len;
}

static unsigned int vnic_build_hello_locked(struct vnic_ctx *ctx, u32 seq)
{
	u8 *b = ctx->hello_buf + ETH_HLEN + VNIC_HDR_LEN;

	memset(b, 0, VNIC_HELLO_BODY);
	put_unaligned_be32(VNIC_DRIVER_VERSION, b);
	memcpy(b + 8, ctx->dev->dev_addr, ETH_ALEN);
	ctx->c.hellos++;
	return vnic_put_hdr(ctx, ctx->hello_buf, VNIC_T_HELLO, seq, 0, VNIC_HELLO_BODY);
}

static unsigned int vnic_build_flush(struct vnic_ctx *ctx, u8 *buf, u32 seq, u8 reason)
{
	u8 *b = buf + ETH_HLEN + VNIC_HDR_LEN;

	memset(b, 0, VNIC_FLUSH_BODY);
	b[0] = reason;
	return vnic_put_hdr(ctx, buf, VNIC_T_FLUSH, seq, 0, VNIC_FLUSH_BODY);
}

static unsigned int vnic_max_ops(const struct vnic_ctx *ctx, unsigned int fit)
{
	return clamp_t(unsigned int, ctx->caps.max_ops, 1, fit);
}

/* Build the next request frame into the window; false if nothing to send. */
static bool vnic_build_request_locked(struct vnic_ctx *ctx, unsigned long now)
{
	u32 seq = ctx->next_seq;
	struct vnic_slot *s = vnic_slot(ctx, seq);
	u8 *b = s->buf + ETH_HLEN + VNIC_HDR_LEN;
	struct vnic_filter *f;
	unsigned int n = 0, max;
	u8 type;

	if (ctx->flush_pending) {
		type = VNIC_T_FLUSH;
		s->len = vnic_build_flush(ctx, s->buf, seq, ctx->flush_reason);
		ctx->flush_pending = false;
		ctx->c.flushes++;
	} else if (!list_empty(&ctx->del_list)) {
		type = VNIC_T_DEL;
		max = vnic_max_ops(ctx, VNIC_DEL_FIT);
		while (n < max && !list_empty(&ctx->del_list)) {
			f = list_first_entry(&ctx->del_list, struct vnic_filter, pend);
			list_del(&f->pend);
			f->pending = false;
			f->del_seq = seq;
			put_unaligned_be16(f->id, b);
			b[2] = f->del_reason;
			b[3] = 0;
			b += VNIC_DEL_OP;
			n++;
		}
		ctx->c.del_ops += n;
		s->len = vnic_put_hdr(ctx, s->buf, type, seq, n, n * VNIC_DEL_OP);
	} else if (!list_empty(&ctx->add_list)) {
		type = VNIC_T_ADD;
		max = vnic_max_ops(ctx, VNIC_ADD_FIT);
		while (n < max && !list_empty(&ctx->add_list)) {
			f = list_first_entry(&ctx->add_list, struct vnic_filter, pend);
			list_del(&f->pend);
			f->pending = false;
			f->add_seq = seq;
			f->add_inflight = true;
			f->sent = true;
			memset(b, 0, VNIC_ADD_OP);
			put_unaligned_be16(f->id, b);
			put_unaligned_be16(f->rxq, b + 2);
			b[4] = f->key.family;
			b[5] = f->key.proto;
			memcpy(b + 6, &f->key.sport, 2);
			memcpy(b + 8, &f->key.dport, 2);
			memcpy(b + 12, f->key.saddr, 16);
			memcpy(b + 28, f->key.daddr, 16);
			b += VNIC_ADD_OP;
			n++;
		}
		ctx->c.add_ops += n;
		s->len = vnic_put_hdr(ctx, s->buf, type, seq, n, n * VNIC_ADD_OP);
	} else {
		return false;
	}
	s->seq = seq;
	s->type = type;
	s->nops = n;
	s->used = true;
	s->acked = false;
	s->retries = 0;
	s->sent_at = now;
	ctx->next_seq++;
	ctx->c.frames_sent++;
	return true;
}

/* Process context. The frame goes to one fixed tx queue, bypassing the qdisc,
 * so that requests reach the device in sequence order.
 */
static int vnic_xmit(struct vnic_ctx *ctx, const u8 *buf, unsigned int len)
{
	struct net_device *dev = ctx->dev;
	unsigned int txq = mgmt_txq;
	struct sk_buff *skb;
	int rc;

	if (!vnic_link_ok(dev))
		return -ENETDOWN;
	if (txq >= dev->real_num_tx_queues)
		txq = 0;
	skb = alloc_skb(LL_RESERVED_SPACE(dev) + max_t(unsigned int, len, ETH_ZLEN),
			GFP_KERNEL);
	if (!skb)
		return -ENOMEM;
	skb_reserve(skb, LL_RESERVED_SPACE(dev));
	skb_put_data(skb, buf, len);
	if (len < ETH_ZLEN)
		skb_put_zero(skb, ETH_ZLEN - len);
	skb->dev = dev;
	skb->protocol = htons(VNIC_ETH_P);
	skb->priority = TC_PRIO_CONTROL;
	skb_reset_mac_header(skb);
	skb_set_network_header(skb, ETH_HLEN);
	rc = dev_direct_xmit(skb, txq);
	return rc == NETDEV_TX_OK ? 0 : -EAGAIN;
}

static void vnic_xmit_count(struct vnic_ctx *ctx, const u8 *buf, unsigned int len)
{
	if (vnic_xmit(ctx, buf, len)) {
		spin_lock_bh(&ctx->lock);
		ctx->c.xmit_errors++;
		spin_unlock_bh(&ctx->lock);
	}
}

/* ------------------------------------------------------------------------ */
/* Receive: CAPS and ACK. Softirq, any CPU, shared skbs: read only.         */

/* Forget every unacked request. If the device lost its table (new
 * generation) DELs are moot and the caller replays the live filters;
 * otherwise the ops go back to the queues to be sent again with new seqs.
 */
static void vnic_window_reset_locked(struct vnic_ctx *ctx, bool table_lost)
{
	struct vnic_filter *f, *tmp;
	u32 seq;

	for (seq = ctx->una; seq != ctx->next_seq; seq++) {
		struct vnic_slot *s = vnic_slot(ctx, seq);
		const u8 *op = s->buf + ETH_HLEN + VNIC_HDR_LEN;
		unsigned int i;

		if (!s->used || s->seq != seq)
			continue;
		s->used = false;
		if (s->acked)
			continue;
		if (s->type == VNIC_T_FLUSH) {
			if (!table_lost) {
				ctx->flush_pending = true;
				ctx->flush_reason = op[0];
			}
			continue;
		}
		for (i = 0; i < s->nops; i++) {
			u16 id = get_unaligned_be16(op);

			op += s->type == VNIC_T_ADD ? VNIC_ADD_OP : VNIC_DEL_OP;
			f = xa_load(&ctx->ids, id);
			if (!f)
				continue;
			if (s->type == VNIC_T_ADD && f->state == VF_LIVE && f->add_seq == seq) {
				f->add_inflight = false;
				if (!table_lost)
					vnic_queue_add_locked(ctx, f);
			} else if (s->type == VNIC_T_DEL && f->state == VF_DELETING &&
				   f->del_seq == seq && !f->pending) {
				if (table_lost) {
					ctx->c.del_lost++;
					vnic_filter_free_locked(ctx, f);
				} else {
					list_add_tail(&f->pend, &ctx->del_list);
					f->pending = true;
				}
			}
		}
	}
	if (table_lost) {
		list_for_each_entry_safe(f, tmp, &ctx->del_list, pend) {
			ctx->c.del_lost++;
			vnic_filter_free_locked(ctx, f);
		}
		ctx->flush_pending = false;
	}
}

static void vnic_replay_locked(struct vnic_ctx *ctx)
{
	struct vnic_filter *f;

	ctx->c.replays++;
	ctx->table_full = false;
	list_for_each_entry(f, &ctx->live_list, node) {
		f->on_dev = false;
		f->sent = false;
		f->add_inflight = false;
		vnic_queue_add_locked(ctx, f);
		ctx->c.replayed++;
	}
}

static void vnic_rx_caps_locked(struct vnic_ctx *ctx, const struct sk_buff *skb,
				u32 seq, u32 gen)
{
	u8 raw[VNIC_CAPS_BODY];
	const u8 *b;
	struct vnic_caps caps;
	bool lost;

	b = skb_header_pointer(skb, VNIC_HDR_LEN, VNIC_CAPS_BODY, raw);
	if (!b || get_unaligned_be32(b + 20)) {
		ctx->c.rx_malformed++;
		return;
	}
	if (!ctx->hello_out || seq != ctx->hello_seq ||
	    (ctx->state != VS_PROBING && ctx->state != VS_ACTIVE)) {
		ctx->c.rx_stale++;
		return;
	}
	caps.max_queue_pairs = get_unaligned_be16(b);
	caps.enabled_queue_pairs = get_unaligned_be16(b + 2);
	caps.capacity = get_unaligned_be32(b + 4);
	caps.buckets = get_unaligned_be32(b + 8);
	caps.ways = get_unaligned_be16(b + 12);
	caps.max_ops = get_unaligned_be16(b + 14);
	caps.latency_us = get_unaligned_be32(b + 16);

	ctx->hello_out = false;
	ctx->last_rx = jiffies;
	lost = !ctx->have_gen || gen != ctx->gen;

	if (ctx->state == VS_PROBING) {
		ctx->caps = caps;
		ctx->gen = gen;
		ctx->have_gen = true;
		ctx->una = seq + 1;
		ctx->next_seq = seq + 1;
		ctx->state = VS_CAPS;
		vnic_kick_locked(ctx);
		return;
	}

	/* the device's expected seq is now seq + 1: restart the window there */
	vnic_window_reset_locked(ctx, lost);
	ctx->caps = caps;
	ctx->una = seq + 1;
	ctx->next_seq = seq + 1;
	ctx->resync = false;
	if (lost) {
		ctx->c.gen_changes++;
		ctx->gen = gen;
		vnic_replay_locked(ctx);
	}
	vnic_kick_locked(ctx);
}

/* One op's outcome. @st is the op status, or -1 when the frame was NAKed. */
static void vnic_ack_op_locked(struct vnic_ctx *ctx, const struct vnic_slot *s,
			       const u8 *op, int st)
{
	u16 id = get_unaligned_be16(op);
	struct vnic_filter *f = xa_load(&ctx->ids, id);

	if (st > 0) {
		if (st <= VNIC_S_MAX)
			ctx->c.rej[st]++;
		else
			ctx->c.rej_other++;
	}

	if (s->type == VNIC_T_ADD) {
		u16 rxq = get_unaligned_be16(op + 2);

		if (st == VNIC_S_OK)
			ctx->c.add_ok++;
		if (!f)
			return;
		if (st == VNIC_S_OK) {
			f->on_dev = true;
			f->dev_rxq = rxq;
			if (f->state == VF_LIVE && f->add_seq == s->seq)
				f->add_inflight = false;
			return;
		}
		if (st == VNIC_S_TABLE_FULL) {
			ctx->table_full = true;
			ctx->table_full_since = jiffies;
		}
		if (f->state != VF_LIVE || f->add_seq != s->seq)
			return;		/* superseded, or being deleted */
		f->add_inflight = false;
		if (f->pending)
			return;		/* a newer ADD (re-steer) is queued */
		if (f->on_dev) {
			/* a refused re-steer: the device keeps the previous queue */
			f->rxq = f->dev_rxq;
			f->resteer_blocked = true;
			f->since = jiffies;
			ctx->c.replaced_rejected++;
			return;
		}
		vnic_filter_reject_locked(ctx, f, st < 0 ? 0xFF : st);
		return;
	}

	/* DEL */
	if (!f || f->state != VF_DELETING || f->del_seq != s->seq || f->pending) {
		ctx->c.rx_stale++;
		return;
	}
	if (st == VNIC_S_OK) {
		ctx->c.del[f->del_reason]++;
		ctx->table_full = false;
	} else if (st == VNIC_S_UNKNOWN_ID) {
		ctx->c.del_unknown++;
	}
	/* acknowledged, even refused: the id is free again */
	vnic_filter_free_locked(ctx, f);
}

static void vnic_rx_ack_locked(struct vnic_ctx *ctx, const struct sk_buff *skb,
			       u32 seq, u16 count, u16 body_len)
{
	u8 fixed_raw[VNIC_ACK_FIXED], chunk_raw[64];
	const u8 *fixed, *chunk = NULL;
	struct vnic_slot *s;
	const u8 *op;
	unsigned int i, oplen;
	u8 acked_type, fstatus;

	if (body_len != VNIC_ACK_FIXED + count) {
		ctx->c.rx_malformed++;
		return;
	}
	fixed = skb_header_pointer(skb, VNIC_HDR_LEN, VNIC_ACK_FIXED, fixed_raw);
	if (!fixed || fixed[2] || fixed[3]) {
		ctx->c.rx_malformed++;
		return;
	}
	acked_type = fixed[0];
	fstatus = fixed[1];

	if (ctx->unload_wait) {
		if (acked_type == VNIC_T_FLUSH && seq == ctx->unload_seq && !fstatus)
			complete(&ctx->unload_done);
		return;
	}
	if (ctx->state != VS_ACTIVE || seq_before(seq, ctx->una) ||
	    !seq_before(seq, ctx->next_seq)) {
		ctx->c.rx_stale++;
		return;
	}
	s = vnic_slot(ctx, seq);
	if (!s->used || s->seq != seq || s->acked) {
		ctx->c.rx_stale++;	/* duplicate ACK */
		return;
	}
	if (acked_type != s->type || (!fstatus && count != s->nops) ||
	    (fstatus && count) || fstatus > VNIC_FS_MAX) {
		ctx->c.rx_malformed++;
		return;
	}

	ctx->c.acks++;
	ctx->last_rx = jiffies;
	if (fstatus) {
		ctx->c.naks++;
		net_warn_ratelimited("%s: vnic_arfs: device NAKed frame seq %u type %u (code %u)\n",
				     ctx->dev->name, seq, s->type, fstatus);
	}
	if (s->type == VNIC_T_FLUSH) {
		ctx->c.flush_acks++;
		if (!fstatus)
			ctx->table_full = false;
	} else {
		oplen = s->type == VNIC_T_ADD ? VNIC_ADD_OP : VNIC_DEL_OP;
		op = s->buf + ETH_HLEN + VNIC_HDR_LEN;
		for (i = 0; i < s->nops; i++, op += oplen) {
			int st = -1;

			if (!fstatus) {
				if (i % sizeof(chunk_raw) == 0) {
					unsigned int n = min_t(unsigned int, sizeof(chunk_raw),
							       s->nops - i);

					chunk = skb_header_pointer(skb,
						VNIC_HDR_LEN + VNIC_ACK_FIXED + i, n, chunk_raw);
					if (!chunk) {	/* cannot happen: length checked */
						ctx->c.rx_malformed++;
						return;
					}
				}
				st = chunk[i % sizeof(chunk_raw)];
			}
			vnic_ack_op_locked(ctx, s, op, st);
		}
	}
	s->acked = true;
	while (ctx->una != ctx->next_seq) {
		s = vnic_slot(ctx, ctx->una);
		if (!s->used || !s->acked)
			break;
		s->used = false;
		ctx->una++;
	}
	if (!list_empty(&ctx->add_list) || !list_empty(&ctx->del_list))
		vnic_kick_locked(ctx);
}

static int vnic_rcv(struct sk_buff *skb, struct net_device *dev,
		    struct packet_type *pt, struct net_device *orig_dev)
{
	struct vnic_ctx *ctx = container_of(pt, struct vnic_ctx, pt);
	u8 raw[VNIC_HDR_LEN];
	const u8 *h;
	u16 count, body_len;
	u32 seq, gen;
	u8 type;

	if (skb->pkt_type == PACKET_OUTGOING || skb->pkt_type == PACKET_LOOPBACK)
		goto out;

	spin_lock_bh(&ctx->lock);
	h = skb_header_pointer(skb, 0, VNIC_HDR_LEN, raw);
	if (!h || get_unaligned_be16(h + VNIC_OFF_MAGIC) != VNIC_MAGIC ||
	    h[VNIC_OFF_VERSION] != VNIC_VERSION) {
		ctx->c.rx_malformed++;
		goto unlock;
	}
	type = h[VNIC_OFF_TYPE];
	seq = get_unaligned_be32(h + VNIC_OFF_SEQ);
	gen = get_unaligned_be32(h + VNIC_OFF_GEN);
	count = get_unaligned_be16(h + VNIC_OFF_COUNT);
	body_len = get_unaligned_be16(h + VNIC_OFF_BODYLEN);
	if (skb->len < VNIC_HDR_LEN + (unsigned int)body_len ||
	    VNIC_HDR_LEN + body_len > VNIC_MGMT_MAX) {
		ctx->c.rx_malformed++;
		goto unlock;
	}

	switch (type) {
	case VNIC_T_CAPS:
		if (count || body_len != VNIC_CAPS_BODY) {
			ctx->c.rx_malformed++;
			break;
		}
		vnic_rx_caps_locked(ctx, skb, seq, gen);
		break;
	case VNIC_T_ACK:
		if (ctx->have_gen && gen != ctx->gen && !ctx->unload_wait) {
			/* the device restarted: HELLO again, then replay */
			ctx->c.rx_wrong_gen++;
			if (ctx->state == VS_ACTIVE && !ctx->resync) {
				ctx->resync = true;
				vnic_kick_locked(ctx);
			}
			break;
		}
		vnic_rx_ack_locked(ctx, skb, seq, count, body_len);
		break;
	default:
		/* HELLO/ADD/DEL/FLUSH are ours (wrong direction), or unknown */
		ctx->c.rx_malformed++;
		break;
	}
unlock:
	spin_unlock_bh(&ctx->lock);
out:
	consume_skb(skb);
	return NET_RX_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* rx_cpu_rmap                                                              */

/*
 * CPU -> rx queue, the way virtnet_set_affinity() spreads the queue pairs:
 * stride = max(online / nq, 1), the first (online % nq) queues get one more
 * CPU (only when online >= nq), consecutive online CPUs, wrapping.
 */
static struct cpu_rmap *vnic_build_rmap(struct vnic_ctx *ctx, unsigned int nq,
					unsigned int *ncpu_out)
{
	struct cpu_rmap *rmap;
	cpumask_var_t mask;
	unsigned int i, ncpu, stride, stragglers, group;
	int cpu, rc;

	if (!nq || nq > U16_MAX)
		return NULL;
	rmap = alloc_cpu_rmap(nq, GFP_KERNEL);
	if (!rmap)
		return NULL;
	for (i = 0; i < nq; i++) {
		rc = cpu_rmap_add(rmap, ctx);
		if (rc < 0)
			goto fail;
	}
	if (!zalloc_cpumask_var(&mask, GFP_KERNEL))
		goto fail;

	cpus_read_lock();
	ncpu = num_online_cpus();
	stride = max_t(unsigned int, ncpu / nq, 1);
	stragglers = ncpu >= nq ? ncpu % nq : 0;
	cpu = cpumask_first(cpu_online_mask);
	for (i = 0; i < nq; i++) {
		cpumask_clear(mask);
		for (group = stride + (i < stragglers ? 1 : 0); group; group--) {
			cpumask_set_cpu(cpu, mask);
			cpu = cpumask_next(cpu, cpu_online_mask);
			if (cpu >= nr_cpu_ids)
				cpu = cpumask_first(cpu_online_mask);
		}
		rc = cpu_rmap_update(rmap, i, mask);
		if (rc)
			break;
	}
	cpus_read_unlock();
	free_cpumask_var(mask);
	if (rc)
		goto fail;
	*ncpu_out = ncpu;
	return rmap;
fail:
	cpu_rmap_put(rmap);
	return NULL;
}

/* ------------------------------------------------------------------------ */
/* Install and teardown                                                     */

/*
 * Forget what RFS recorded in the rx queues' rps_dev_flow tables before we
 * were installed (a previous instance of the module, or no aRFS at all):
 * the CPU each flow went to and the filter ids. Left alone, a flow already
 * on its desired CPU is never handed to ndo_rx_flow_steer again:
 * get_rps_cpu() only calls set_rps_cpu() when the slot's CPU differs from
 * the desired one, and while the module was away every slot of the RSS
 * queue got the desired CPU. Newer kernels (7.3) also skip the call while
 * the target queue's slot holds a filter id that looks active. With the
 * slots reset, the next packet of every flow asks us to steer it (as after
 * `rps_flow_cnt` is rewritten). Runs once we are installed and active.
 */
static void vnic_reset_kernel_rfs(struct net_device *dev)
{
#ifdef CONFIG_RFS_ACCEL
	unsigned int i, j, n;

	rcu_read_lock();
	for (i = 0; i < dev->num_rx_queues; i++) {
		struct netdev_rx_queue *q = dev->_rx + i;
		struct rps_dev_flow *flows;
#ifdef _NET_RPS_TYPES_H
		rps_tag_ptr tp = READ_ONCE(q->rps_flow_table);

		if (!tp)
			continue;
		flows = rps_tag_to_table(tp);
		n = rps_tag_to_mask(tp) + 1;
#else
		struct rps_dev_flow_table *t = rcu_dereference(q->rps_flow_table);

		if (!t)
			continue;
		flows = t->flows;
		n = t->mask + 1;
#endif
		for (j = 0; j < n; j++) {
			if (READ_ONCE(flows[j].filter) != RPS_NO_FILTER)
				WRITE_ONCE(flows[j].filter, RPS_NO_FILTER);
			if (READ_ONCE(flows[j].cpu) != RPS_NO_CPU)
				WRITE_ONCE(flows[j].cpu, RPS_NO_CPU);
		}
	}
	rcu_read_unlock();
#endif
}

/* Under RTNL. */
static int vnic_install(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	unsigned int nq = dev->real_num_rx_queues, ncpu = 0;
	struct net_device_ops *ops;
	struct cpu_rmap *rmap;

	ASSERT_RTNL();
	if (dev->rx_cpu_rmap)
		return -EEXIST;
	rmap = vnic_build_rmap(ctx, nq, &ncpu);
	if (!rmap)
		return -ENOMEM;
	ops = kmemdup(dev->netdev_ops, sizeof(*ops), GFP_KERNEL);
	if (!ops) {
		cpu_rmap_put(rmap);
		return -ENOMEM;
	}
	ops->ndo_rx_flow_steer = vnic_rx_flow_steer;

	/* 1. ops, 2. rmap, 3. NTUPLE (the packet handler is already in place) */
	ctx->orig_ops = dev->netdev_ops;
	ctx->ops = ops;
	WRITE_ONCE(dev->netdev_ops, ops);
	ctx->rmap = rmap;
	ctx->rmap_nq = nq;
	ctx->rmap_ncpu = ncpu;
	WRITE_ONCE(dev->rx_cpu_rmap, rmap);
	ctx->had_ntuple = !!(dev->hw_features & NETIF_F_NTUPLE);
	dev->hw_features |= NETIF_F_NTUPLE;
	dev->wanted_features |= NETIF_F_NTUPLE;
	netdev_update_features(dev);
	ctx->installed = true;
	return 0;
}

/* Best effort: HELLO (so the device expects our seq) + FLUSH(unload). */
static void vnic_unload_flush(struct vnic_ctx *ctx)
{
	unsigned int hlen, flen, live, tries;
	unsigned long rto;
	u32 seq;

	for (tries = 0; tries < 3; tries++) {
		struct vnic_filter *f;
		unsigned long idx;

		spin_lock_bh(&ctx->lock);
		seq = ctx->next_seq;
		ctx->next_seq += 2;
		hlen = vnic_build_hello_locked(ctx, seq);
		flen = vnic_build_flush(ctx, ctx->flush_buf, seq + 1, VNIC_R_UNLOAD);
		ctx->unload_seq = seq + 1;
		ctx->unload_wait = true;
		reinit_completion(&ctx->unload_done);
		live = 0;
		xa_for_each(&ctx->ids, idx, f)
			if (f->sent)
				live++;
		rto = vnic_rto(ctx);
		ctx->c.flushes++;
		spin_unlock_bh(&ctx->lock);

		vnic_xmit_count(ctx, ctx->hello_buf, hlen);
		vnic_xmit_count(ctx, ctx->flush_buf, flen);
		if (wait_for_completion_timeout(&ctx->unload_done, rto)) {
			spin_lock_bh(&ctx->lock);
			ctx->unload_wait = false;
			ctx->c.flush_acks++;
			ctx->c.del[VNIC_R_UNLOAD] += live;
			spin_unlock_bh(&ctx->lock);
			return;
		}
	}
	spin_lock_bh(&ctx->lock);
	ctx->unload_wait = false;
	spin_unlock_bh(&ctx->lock);
	netdev_warn(ctx->dev, "vnic_arfs: no ACK for the unload FLUSH\n");
}

static void vnic_free_filters(struct vnic_ctx *ctx)
{
	struct vnic_filter *f, *tmp;
	unsigned long idx;

	spin_lock_bh(&ctx->lock);
	list_for_each_entry_safe(f, tmp, &ctx->rej_list, node)
		vnic_rejected_free_locked(ctx, f);
	xa_for_each(&ctx->ids, idx, f) {
		xa_erase(&ctx->ids, idx);
		kfree(f);
	}
	INIT_LIST_HEAD(&ctx->live_list);
	INIT_LIST_HEAD(&ctx->add_list);
	INIT_LIST_HEAD(&ctx->del_list);
	ctx->nr_ids = 0;
	ctx->nr_live = 0;
	spin_unlock_bh(&ctx->lock);
	xa_destroy(&ctx->ids);
}

/* Under RTNL: NETDEV_UNREGISTER, or module unload. */
static void vnic_detach(struct vnic_ctx *ctx, bool unload)
{
	struct net_device *dev = ctx->dev;
	bool ours = true;

	ASSERT_RTNL();
	spin_lock_bh(&ctx->lock);
	ctx->no_kick = true;
	spin_unlock_bh(&ctx->lock);
	cancel_delayed_work_sync(&ctx->work);

	if (unload && ctx->installed && ctx->pack_added && vnic_link_ok(dev))
		vnic_unload_flush(ctx);

	spin_lock_bh(&ctx->lock);
	ctx->dying = true;
	spin_unlock_bh(&ctx->lock);

	if (ctx->installed) {
		if (!ctx->had_ntuple) {
			dev->hw_features &= ~NETIF_F_NTUPLE;
			dev->wanted_features &= ~NETIF_F_NTUPLE;
			dev->features &= ~NETIF_F_NTUPLE;
			if (dev->reg_state == NETREG_REGISTERED)
				netdev_features_change(dev);
		}
		synchronize_net();
		WRITE_ONCE(dev->rx_cpu_rmap, NULL);
		if (dev->netdev_ops == ctx->ops) {
			WRITE_ONCE(dev->netdev_ops, ctx->orig_ops);
		} else {
			/* someone stacked on our copy: it must outlive us */
			ours = false;
			netdev_warn(dev, "vnic_arfs: netdev_ops replaced by someone else, leaving them\n");
		}
		synchronize_net();
		cpu_rmap_put(ctx->rmap);
		ctx->rmap = NULL;
		if (ours)
			kfree(ctx->ops);
		ctx->ops = NULL;
		ctx->installed = false;
	}
	if (ctx->pack_added) {
		dev_remove_pack(&ctx->pt);
		ctx->pack_added = false;
	}
	list_del_rcu(&ctx->list);
	debugfs_remove_recursive(ctx->dbg);
	ctx->dbg = NULL;
	vnic_free_filters(ctx);
	netdev_put(dev, &ctx->tracker);
	kvfree_rcu(ctx, rcu);
}

/* Probe failed or install failed: undo the packet handler only. */
static void vnic_give_up(struct vnic_ctx *ctx, const char *why)
{
	if (ctx->pack_added) {
		dev_remove_pack(&ctx->pt);
		ctx->pack_added = false;
	}
	spin_lock_bh(&ctx->lock);
	ctx->state = VS_FAILED;
	ctx->hello_out = false;
	spin_unlock_bh(&ctx->lock);
	netdev_info(ctx->dev, "vnic_arfs: not attaching: %s\n", why);
}

/* ------------------------------------------------------------------------ */
/* The work item                                                            */

static void vnic_work_probe(struct vnic_ctx *ctx)
{
	unsigned long now = jiffies, rto;
	unsigned int len = 0;

	spin_lock_bh(&ctx->lock);
	if (ctx->state != VS_PROBING) {
		spin_unlock_bh(&ctx->lock);
		return;
	}
	rto = vnic_rto(ctx);
	if (!vnic_link_ok(ctx->dev)) {
		ctx->probe_start = 0;	/* NETDEV_UP / CHANGE kick us again */
		spin_unlock_bh(&ctx->lock);
		return;
	}
	if (!ctx->probe_start)
		ctx->probe_start = now;
	if (time_after(now, ctx->probe_start + msecs_to_jiffies(hello_timeout_ms))) {
		spin_unlock_bh(&ctx->lock);
		vnic_give_up(ctx, "the device did not answer HELLO with CAPS");
		return;
	}
	if (!ctx->hello_out || time_after_eq(now, ctx->hello_sent_at + rto)) {
		if (!ctx->hello_out)
			ctx->hello_seq = ctx->next_seq;
		ctx->hello_out = true;
		ctx->hello_sent_at = now;
		len = vnic_build_hello_locked(ctx, ctx->hello_seq);
	}
	spin_unlock_bh(&ctx->lock);
	if (len)
		vnic_xmit_count(ctx, ctx->hello_buf, len);
	vnic_resched(ctx, rto);
}

static void vnic_work_install(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	int err;

	if (!rtnl_trylock()) {
		vnic_resched(ctx, 1);
		return;
	}
	if (dev->reg_state != NETREG_REGISTERED) {
		rtnl_unlock();
		return;
	}
	err = vnic_install(ctx);
	rtnl_unlock();
	if (err) {
		vnic_give_up(ctx, err == -EEXIST ? "the netdev already has an rx_cpu_rmap"
				  : "out of memory");
		return;
	}
	spin_lock_bh(&ctx->lock);
	ctx->state = VS_ACTIVE;
	/* a previous instance of the module may have left filters behind */
	ctx->flush_pending = true;
	ctx->flush_reason = VNIC_R_FLUSH;
	ctx->last_rx = jiffies;
	netdev_info(dev, "vnic_arfs: attached: generation %u, %u/%u queue pairs, capacity %u, buckets %u x %u, max_ops %u, latency %u us, %u rx queues\n",
		    ctx->gen, ctx->caps.enabled_queue_pairs, ctx->caps.max_queue_pairs,
		    ctx->caps.capacity, ctx->caps.buckets, ctx->caps.ways,
		    ctx->caps.max_ops, ctx->caps.latency_us, ctx->rmap_nq);
	vnic_kick_locked(ctx);
	spin_unlock_bh(&ctx->lock);
	/* only now: a steer call before VS_ACTIVE fails and RFS would not retry */
	vnic_reset_kernel_rfs(dev);
}

/* ethtool -L or CPU hotplug changed the queue/CPU layout: new rmap, and
 * filters for queues that no longer exist are removed.
 */
static void vnic_check_queues(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	unsigned int nq = READ_ONCE(dev->real_num_rx_queues);
	unsigned int ncpu = num_online_cpus();
	struct cpu_rmap *rmap, *old;
	struct vnic_filter *f, *tmp;

	if (nq == ctx->rmap_nq && ncpu == ctx->rmap_ncpu)
		return;
	rmap = vnic_build_rmap(ctx, nq, &ncpu);
	if (!rmap)
		return;		/* try again next pass */
	old = ctx->rmap;
	ctx->rmap = rmap;
	ctx->rmap_nq = nq;
	ctx->rmap_ncpu = ncpu;
	WRITE_ONCE(dev->rx_cpu_rmap, rmap);
	synchronize_net();
	cpu_rmap_put(old);

	spin_lock_bh(&ctx->lock);
	ctx->c.rmap_rebuilds++;
	list_for_each_entry_safe(f, tmp, &ctx->live_list, node) {
		if (f->rxq >= nq || f->dev_rxq >= nq) {
			ctx->c.queue_flushes++;
			vnic_filter_del_locked(ctx, f, VNIC_R_FLUSH);
		}
	}
	spin_unlock_bh(&ctx->lock);
}

/* Round-robin over the live filters, at most expire_quota per pass. */
static void vnic_expire_locked(struct vnic_ctx *ctx, unsigned long now)
{
	unsigned int n = min(expire_quota, ctx->nr_live);
	unsigned long idle = msecs_to_jiffies(idle_timeout_ms);
	struct vnic_filter *f;

	while (n-- && !list_empty(&ctx->live_list)) {
		f = list_first_entry(&ctx->live_list, struct vnic_filter, node);
		list_move_tail(&f->node, &ctx->live_list);
		if (!f->on_dev || f->add_inflight || f->pending)
			continue;
		if (rps_may_expire_flow(ctx->dev, f->slot_rxq, f->flow_id, f->id))
			vnic_filter_del_locked(ctx, f, VNIC_R_EXPIRED);
		else if (idle_timeout_ms && time_after(now, f->last_seen + idle))
			vnic_filter_del_locked(ctx, f, VNIC_R_IDLE);
	}
}

static void vnic_work_active(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	u32 tosend[VNIC_WINDOW];
	unsigned int nsend = 0, hlen = 0, i;
	unsigned long now, rto, delay;
	struct vnic_filter *f, *tmp;

	vnic_check_queues(ctx);

	now = jiffies;
	spin_lock_bh(&ctx->lock);
	rto = vnic_rto(ctx);

	if (!(READ_ONCE(dev->features) & NETIF_F_NTUPLE) && ctx->nr_live) {
		ctx->c.ntuple_flushes++;
		vnic_del_all_locked(ctx, VNIC_R_FLUSH);
	}

	list_for_each_entry_safe(f, tmp, &ctx->rej_list, node) {
		if (time_before(now, f->since + msecs_to_jiffies(reject_holdoff_ms)))
			break;
		vnic_rejected_free_locked(ctx, f);
	}

	vnic_expire_locked(ctx, now);

	if (vnic_link_ok(dev)) {
		/*
		 * The oldest frame went unanswered VNIC_MAX_RETRIES times: the
		 * device may expect another seq (someone else sent HELLO, or it
		 * lost its state without a new generation). Restart the session.
		 */
		if (!ctx->hello_out && !ctx->resync && ctx->una != ctx->next_seq) {
			struct vnic_slot *old = vnic_slot(ctx, ctx->una);

			if (old->used && !old->acked && old->retries >= VNIC_MAX_RETRIES &&
			    time_after_eq(now, old->sent_at + rto)) {
				ctx->resync = true;
				ctx->c.stalls++;
			}
		}
		if (ctx->hello_out) {
			if (time_after_eq(now, ctx->hello_sent_at + rto)) {
				ctx->hello_sent_at = now;
				hlen = vnic_build_hello_locked(ctx, ctx->hello_seq);
			}
		} else if (ctx->resync ||
			   (keepalive_ms && ctx->una == ctx->next_seq &&
			    time_after_eq(now, ctx->last_rx + msecs_to_jiffies(keepalive_ms)))) {
			ctx->hello_seq = ctx->next_seq;
			ctx->hello_out = true;
			ctx->hello_sent_at = now;
			hlen = vnic_build_hello_locked(ctx, ctx->hello_seq);
		}

		if (!ctx->hello_out) {
			u32 seq;

			/* go-back-N: on timeout resend every unacked frame, oldest first */
			if (ctx->una != ctx->next_seq &&
			    time_after_eq(now, vnic_slot(ctx, ctx->una)->sent_at + rto)) {
				for (seq = ctx->una; seq != ctx->next_seq; seq++) {
					struct vnic_slot *s = vnic_slot(ctx, seq);

					if (!s->used || s->acked)
						continue;
					s->sent_at = now;
					if (s->retries < U8_MAX)
						s->retries++;
					tosend[nsend++] = seq;
					ctx->c.retransmits++;
				}
			}
			while (ctx->next_seq - ctx->una < VNIC_WINDOW &&
			       nsend < VNIC_WINDOW &&
			       vnic_build_request_locked(ctx, now))
				tosend[nsend++] = ctx->next_seq - 1;
		}
	}

	delay = msecs_to_jiffies(max_t(unsigned int, interval_ms, 1));
	if (ctx->hello_out || ctx->una != ctx->next_seq)
		delay = min(delay, rto);
	spin_unlock_bh(&ctx->lock);

	/* Only this work item writes the slot buffers: safe to read unlocked. */
	if (hlen)
		vnic_xmit_count(ctx, ctx->hello_buf, hlen);
	for (i = 0; i < nsend; i++) {
		struct vnic_slot *s = vnic_slot(ctx, tosend[i]);

		vnic_xmit_count(ctx, s->buf, s->len);
	}
	vnic_resched(ctx, delay);
}

static void vnic_work(struct work_struct *work)
{
	struct vnic_ctx *ctx = container_of(to_delayed_work(work), struct vnic_ctx, work);
	int state;

	/* from here on a kick must queue the work again */
	spin_lock_bh(&ctx->lock);
	ctx->kicked = false;
	state = ctx->state;
	spin_unlock_bh(&ctx->lock);

	switch (state) {
	case VS_PROBING:
		vnic_work_probe(ctx);
		break;
	case VS_CAPS:
		vnic_work_install(ctx);
		break;
	case VS_ACTIVE:
		vnic_work_active(ctx);
		break;
	default:
		break;
	}
}

/* ------------------------------------------------------------------------ */
/* debugfs                                                                  */

static int vnic_counters_show(struct seq_file *m, void *v)
{
	struct vnic_ctx *ctx = m->private;
	struct vnic_counters c;

	spin_lock_bh(&ctx->lock);
	c = ctx->c;
	spin_unlock_bh(&ctx->lock);

#define P(name, val) seq_printf(m, "%s %llu\n", name, (unsigned long long)(val))
	P("steer_calls", c.steer_calls);
	P("steer_dedup", c.steer_dedup);
	P("adds", c.adds);
	P("resteers", c.resteers);
	P("busy", c.busy);
	P("busy_rejected", c.busy_rejected);
	P("unsupported", c.unsupported);
	P("bad_rxq", c.bad_rxq);
	P("nomem", c.nomem);
	P("add_ops", c.add_ops);
	P("add_ok", c.add_ok);
	P("del_ops", c.del_ops);
	P("deletes_expired", c.del[VNIC_R_EXPIRED]);
	P("deletes_idle", c.del[VNIC_R_IDLE]);
	P("deletes_flush", c.del[VNIC_R_FLUSH]);
	P("deletes_unload", c.del[VNIC_R_UNLOAD]);
	P("deletes_unknown_id", c.del_unknown);
	P("deletes_cancelled", c.del_cancelled);
	P("deletes_lost", c.del_lost);
	P("frames_sent", c.frames_sent);
	P("retransmits", c.retransmits);
	P("hellos", c.hellos);
	P("flushes", c.flushes);
	P("flush_acks", c.flush_acks);
	P("acks", c.acks);
	P("naks", c.naks);
	P("reject_table_full", c.rej[VNIC_S_TABLE_FULL]);
	P("reject_bucket_full", c.rej[VNIC_S_BUCKET_FULL]);
	P("reject_bad_queue", c.rej[VNIC_S_BAD_QUEUE]);
	P("reject_bad_key", c.rej[VNIC_S_BAD_KEY]);
	P("reject_injected_failure", c.rej[VNIC_S_INJECTED]);
	P("reject_unknown_id", c.rej[VNIC_S_UNKNOWN_ID]);
	P("reject_bad_id", c.rej[VNIC_S_BAD_ID]);
	P("reject_other", c.rej_other);
	P("resteer_rejected", c.replaced_rejected);
	P("rx_malformed", c.rx_malformed);
	P("rx_stale", c.rx_stale);
	P("rx_wrong_generation", c.rx_wrong_gen);
	P("xmit_errors", c.xmit_errors);
	P("generation_changes", c.gen_changes);
	P("replays", c.replays);
	P("replayed_filters", c.replayed);
	P("rmap_rebuilds", c.rmap_rebuilds);
	P("ntuple_flushes", c.ntuple_flushes);
	P("queue_flushes", c.queue_flushes);
	P("stalls", c.stalls);
#undef P
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vnic_counters);

static int vnic_state_show(struct seq_file *m, void *v)
{
	struct vnic_ctx *ctx = m->private;

	spin_lock_bh(&ctx->lock);
	seq_printf(m, "state %s\n", vnic_state_names[ctx->state]);
	seq_printf(m, "generation %u\n", ctx->gen);
	seq_printf(m, "max_queue_pairs %u\n", ctx->caps.max_queue_pairs);
	seq_printf(m, "enabled_queue_pairs %u\n", ctx->caps.enabled_queue_pairs);
	seq_printf(m, "capacity %u\n", ctx->caps.capacity);
	seq_printf(m, "buckets %u\n", ctx->caps.buckets);
	seq_printf(m, "ways %u\n", ctx->caps.ways);
	seq_printf(m, "max_ops %u\n", ctx->caps.max_ops);
	seq_printf(m, "latency_us %u\n", ctx->caps.latency_us);
	seq_printf(m, "seq_next %u\n", ctx->next_seq);
	seq_printf(m, "seq_unacked %u\n", ctx->una);
	seq_printf(m, "inflight %u\n", ctx->next_seq - ctx->una);
	seq_printf(m, "hello_outstanding %u\n", ctx->hello_out);
	seq_printf(m, "table_full %u\n", ctx->table_full);
	seq_printf(m, "ids %u\n", ctx->nr_ids);
	seq_printf(m, "live %u\n", ctx->nr_live);
	seq_printf(m, "rejected_holdoff %u\n", ctx->nr_rejected);
	seq_printf(m, "rx_queues %u\n", READ_ONCE(ctx->dev->real_num_rx_queues));
	seq_printf(m, "rmap_queues %u\n", ctx->rmap_nq);
	seq_printf(m, "rto_ms %u\n", jiffies_to_msecs(vnic_rto(ctx)));
	spin_unlock_bh(&ctx->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vnic_state);

static void vnic_show_filter(struct seq_file *m, const struct vnic_filter *f,
			     const char *state)
{
	seq_printf(m, "%u %u %s ", f->id, f->rxq, f->key.proto == IPPROTO_TCP ? "tcp" : "udp");
	if (f->key.family == 4)
		seq_printf(m, "%pI4:%u %pI4:%u", f->key.saddr, ntohs(f->key.sport),
			   f->key.daddr, ntohs(f->key.dport));
	else
		seq_printf(m, "[%pI6c]:%u [%pI6c]:%u", f->key.saddr, ntohs(f->key.sport),
			   f->key.daddr, ntohs(f->key.dport));
	seq_printf(m, " %u %s\n", f->flow_id, state);
}

static int vnic_filters_show(struct seq_file *m, void *v)
{
	struct vnic_ctx *ctx = m->private;
	struct vnic_filter *f;
	unsigned long idx;

	seq_puts(m, "# id rxq proto src dst flow_id state\n");
	spin_lock_bh(&ctx->lock);
	xa_for_each(&ctx->ids, idx, f) {
		const char *st;

		if (f->state == VF_DELETING)
			st = "deleting";
		else if (f->on_dev)
			st = f->add_inflight || f->pending ? "active-updating" : "active";
		else
			st = f->add_inflight ? "adding" : "queued";
		vnic_show_filter(m, f, st);
	}
	spin_unlock_bh(&ctx->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vnic_filters);

static void vnic_debugfs_add(struct vnic_ctx *ctx)
{
	if (IS_ERR_OR_NULL(vnic_dbg_root))
		return;
	ctx->dbg = debugfs_create_dir(ctx->dev->name, vnic_dbg_root);
	if (IS_ERR(ctx->dbg))
		return;
	debugfs_create_file("counters", 0444, ctx->dbg, ctx, &vnic_counters_fops);
	debugfs_create_file("state", 0444, ctx->dbg, ctx, &vnic_state_fops);
	debugfs_create_file("filters", 0444, ctx->dbg, ctx, &vnic_filters_fops);
}

/* ------------------------------------------------------------------------ */
/* Netdevice notifier                                                       */

/* Under RTNL. */
static void vnic_attach(struct net_device *dev)
{
	struct vnic_ctx *ctx;

	if (!vnic_is_virtio_net(dev) || !vnic_name_wanted(dev->name) || vnic_find(dev))
		return;
	ctx = kvzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx) {
		netdev_err(dev, "vnic_arfs: out of memory\n");
		return;
	}
	ctx->dev = dev;
	spin_lock_init(&ctx->lock);
	INIT_DELAYED_WORK(&ctx->work, vnic_work);
	init_completion(&ctx->unload_done);
	xa_init_flags(&ctx->ids, XA_FLAGS_ALLOC);
	hash_init(ctx->flows);
	INIT_LIST_HEAD(&ctx->live_list);
	INIT_LIST_HEAD(&ctx->rej_list);
	INIT_LIST_HEAD(&ctx->add_list);
	INIT_LIST_HEAD(&ctx->del_list);
	ctx->seed = get_random_u32();
	ctx->next_seq = get_random_u32();
	ctx->una = ctx->next_seq;
	ctx->state = VS_PROBING;
	netdev_hold(dev, &ctx->tracker, GFP_KERNEL);

	ctx->pt.type = htons(VNIC_ETH_P);
	ctx->pt.dev = dev;
	ctx->pt.func = vnic_rcv;
	dev_add_pack(&ctx->pt);
	ctx->pack_added = true;

	list_add_tail_rcu(&ctx->list, &vnic_devs);
	vnic_debugfs_add(ctx);
	queue_delayed_work(vnic_wq, &ctx->work, 0);
}

static int vnic_netdev_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct net_device *dev = netdev_notifier_info_to_dev(ptr);
	struct vnic_ctx *ctx;

	if (event == NETDEV_REGISTER) {
		vnic_attach(dev);
		return NOTIFY_DONE;
	}
	ctx = vnic_find(dev);
	if (!ctx)
		return NOTIFY_DONE;

	switch (event) {
	case NETDEV_UNREGISTER:
		vnic_detach(ctx, READ_ONCE(vnic_unloading));
		break;
	case NETDEV_UP:
		spin_lock_bh(&ctx->lock);
		if (ctx->state == VS_FAILED && !ctx->dying) {
			/* try again: the device may have come up since */
			ctx->state = VS_PROBING;
			ctx->probe_start = 0;
			ctx->hello_out = false;
			ctx->have_gen = false;
			spin_unlock_bh(&ctx->lock);
			dev_add_pack(&ctx->pt);
			ctx->pack_added = true;
			spin_lock_bh(&ctx->lock);
		} else if (ctx->state == VS_ACTIVE) {
			/* link was down: check the device's generation now */
			ctx->resync = true;
		}
		vnic_kick_locked(ctx);
		spin_unlock_bh(&ctx->lock);
		break;
	case NETDEV_CHANGE:
	case NETDEV_FEAT_CHANGE:
		vnic_kick(ctx);
		break;
	case NETDEV_CHANGENAME:
		debugfs_remove_recursive(ctx->dbg);
		ctx->dbg = NULL;
		vnic_debugfs_add(ctx);
		break;
	default:
		break;
	}
	return NOTIFY_DONE;
}

static struct notifier_block vnic_nb = {
	.notifier_call = vnic_netdev_event,
};

static int __init vnic_arfs_init(void)
{
	int err;

	vnic_wq = alloc_workqueue("vnic_arfs", WQ_UNBOUND, 0);
	if (!vnic_wq)
		return -ENOMEM;
	vnic_dbg_root = debugfs_create_dir("vnic_arfs", NULL);
	err = register_netdevice_notifier(&vnic_nb);
	if (err) {
		debugfs_remove_recursive(vnic_dbg_root);
		destroy_workqueue(vnic_wq);
		return err;
	}
	return 0;
}

static void __exit vnic_arfs_exit(void)
{
	WRITE_ONCE(vnic_unloading, true);
	/* calls NETDEV_UNREGISTER for every netdev: each context is detached */
	unregister_netdevice_notifier(&vnic_nb);
	WARN_ON(!list_empty(&vnic_devs));
	destroy_workqueue(vnic_wq);
	rcu_barrier();
	debugfs_remove_recursive(vnic_dbg_root);
}

module_init(vnic_arfs_init);
module_exit(vnic_arfs_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("aRFS (ndo_rx_flow_steer) for virtio_net netdevs backed by the vnic device");
MODULE_AUTHOR("vnic project");
