// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_arfs management protocol and session (aRFS/PROTOCOL.md): HELLO/CAPS,
 * ADD/DEL/FLUSH requests in a go-back-N window of VNIC_WINDOW frames, ACK
 * processing, generation changes and the best-effort FLUSH at unload.
 *
 * Frames are built under ctx->lock into the window slots and sent after the
 * lock is dropped; only the work item (or, once the work item is disabled,
 * module exit) builds and sends, so the slot buffers are stable while sent.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/etherdevice.h>
#include <linux/jiffies.h>
#include <linux/math64.h>
#include <linux/pkt_sched.h>
#include <linux/random.h>
#include <linux/skbuff.h>
#include <linux/timekeeping.h>

#include "vnic_arfs.h"

static bool vnic_mgmt_seq_before(u32 a, u32 b)
{
	return (s32)(a - b) < 0;
}

static struct vnic_slot *vnic_mgmt_slot(struct vnic_ctx *ctx, u32 seq)
{
	return &ctx->slots[seq % VNIC_WINDOW];
}

/*
 * Whether the ACK in @skb (sequence @seq) answers a frame in flight: one in
 * the window, not acknowledged yet, of the type the ACK names.
 */
static bool vnic_mgmt_answers_inflight_locked(struct vnic_ctx *ctx, const struct sk_buff *skb,
					      u32 seq)
{
	const struct vnic_slot *s;
	u8 raw[VNIC_ACK_FIXED];
	const u8 *fixed;

	if (vnic_mgmt_seq_before(seq, ctx->una) || !vnic_mgmt_seq_before(seq, ctx->next_seq))
		return false;
	s = vnic_mgmt_slot(ctx, seq);
	if (!s->used || s->seq != seq || s->acked)
		return false;
	fixed = skb_header_pointer(skb, VNIC_HDR_LEN, VNIC_ACK_FIXED, raw);
	return fixed && fixed[0] == s->type;
}

/**
 * vnic_mgmt_add_unacked - whether an ADD of @id is in flight in an earlier frame
 * @ctx: the context
 * @id: the filter id
 * @before: only frames older than this one count
 * @except: a frame that does not count (the one being acknowledged)
 *
 * The window holds at most VNIC_WINDOW frames of VNIC_ADD_FIT ops: bounded.
 *
 * Return: true when a frame in [una, @before), other than @except, not
 * acknowledged, carries an ADD of @id: the device may have applied it.
 */
bool vnic_mgmt_add_unacked(struct vnic_ctx *ctx, u16 id, u32 before, u32 except)
{
	unsigned int i;
	u32 q;

	for (q = ctx->una; q != ctx->next_seq && vnic_mgmt_seq_before(q, before); q++) {
		const struct vnic_slot *s = vnic_mgmt_slot(ctx, q);
		const u8 *op = s->buf + ETH_HLEN + VNIC_HDR_LEN;

		if (q == except || !s->used || s->seq != q || s->acked || s->type != VNIC_T_ADD)
			continue;
		for (i = 0; i < s->nops; i++, op += VNIC_ADD_OP)
			if (get_unaligned_be16(op) == id)
				return true;
	}
	return false;
}

/**
 * vnic_mgmt_rto - retransmit timeout
 * @ctx: the context (caps.latency_us read under ctx->lock, or racy for debugfs)
 *
 * Always longer than the device's programming latency (capped at 10 s):
 * retransmit_ms + latency_us.
 *
 * Return: the timeout in jiffies.
 */
unsigned long vnic_mgmt_rto(const struct vnic_ctx *ctx)
{
	u32 lat = min_t(u32, ctx->caps.latency_us, 10 * USEC_PER_SEC);

	return msecs_to_jiffies(max_t(unsigned int, READ_ONCE(vnic_retransmit_ms), 1)) +
	       usecs_to_jiffies(lat) + 1;
}

/* ------------------------------------------------------------------------ */
/* Frames                                                                   */

/**
 * vnic_mgmt_put_hdr - the Ethernet and management headers of a frame
 * @ctx: the context, ctx->lock held
 * @buf: the frame
 * @type: its message type
 * @seq: its sequence number
 * @count: its op count
 * @body_len: the length of the body that follows the header
 *
 * Return: the length of the whole frame.
 */
unsigned int vnic_mgmt_put_hdr(struct vnic_ctx *ctx, u8 *buf, u8 type, u32 seq,
			       u16 count, u16 body_len)
{
	u8 *h = buf + ETH_HLEN;

	static const u8 group[ETH_ALEN] = VNIC_HELLO_GROUP;

	/*
	 * No session yet: the link-local group. Once bound, everything goes to
	 * the device, the keepalive and resync HELLOs too: no other station
	 * sees a nonce it could answer.
	 */
	if (!ctx->have_dev_mac)
		ether_addr_copy(buf, group);
	else
		ether_addr_copy(buf, ctx->dev_mac);
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

static unsigned int vnic_mgmt_build_hello_locked(struct vnic_ctx *ctx, u32 seq)
{
	u8 *b = ctx->hello_buf + ETH_HLEN + VNIC_HDR_LEN;

	/* a new HELLO (not a retransmission) starts a session: a new nonce */
	if (!ctx->hello_nonce || seq != ctx->hello_nonce_seq) {
		ctx->hello_nonce = get_random_u32() | 1;
		ctx->hello_nonce_seq = seq;
	}
	memset(b, 0, VNIC_HELLO_BODY);
	put_unaligned_be32(VNIC_DRIVER_VERSION, b);
	put_unaligned_be32(ctx->hello_nonce, b + VNIC_HELLO_OFF_NONCE);
	memcpy(b + VNIC_HELLO_OFF_MAC, ctx->dev->dev_addr, ETH_ALEN);
	ctx->c.hellos++;
	return vnic_mgmt_put_hdr(ctx, ctx->hello_buf, VNIC_T_HELLO, seq, 0, VNIC_HELLO_BODY);
}

static unsigned int vnic_mgmt_build_flush(struct vnic_ctx *ctx, u8 *buf, u32 seq, u8 reason)
{
	u8 *b = buf + ETH_HLEN + VNIC_HDR_LEN;

	memset(b, 0, VNIC_FLUSH_BODY);
	b[0] = reason;
	return vnic_mgmt_put_hdr(ctx, buf, VNIC_T_FLUSH, seq, 0, VNIC_FLUSH_BODY);
}

/**
 * vnic_mgmt_max_ops - most ops of one request frame
 * @ctx: the context, ctx->lock held
 * @fit: the most ops of the type that fit in a frame
 *
 * Return: @fit, or the device's max_ops if lower (at least 1).
 */
unsigned int vnic_mgmt_max_ops(const struct vnic_ctx *ctx, unsigned int fit)
{
	return clamp_t(unsigned int, ctx->caps.max_ops, 1, fit);
}

/**
 * vnic_mgmt_op_len - the length of one op of a request type
 * @type: ADD, DEL, RULE_SET, RULE_DEL or RSS_SET
 *
 * Return: the op length in bytes, 0 for a type without ops.
 */
unsigned int vnic_mgmt_op_len(u8 type)
{
	switch (type) {
	case VNIC_T_ADD:
		return VNIC_ADD_OP;
	case VNIC_T_DEL:
		return VNIC_DEL_OP;
	case VNIC_T_RULE_SET:
		return VNIC_RULE_OP;
	case VNIC_T_RULE_DEL:
		return VNIC_RULE_DEL_OP;
	case VNIC_T_RSS_SET:
		return VNIC_RSS_OP;
	default:
		return 0;
	}
}

static bool vnic_mgmt_is_eth_type(u8 type)
{
	return type == VNIC_T_RULE_SET || type == VNIC_T_RULE_DEL || type == VNIC_T_RSS_SET;
}

/* Build the next request frame into the window; false if nothing to send. */
static bool vnic_mgmt_build_request_locked(struct vnic_ctx *ctx, unsigned long now)
{
	u32 seq = ctx->next_seq;
	struct vnic_slot *s = vnic_mgmt_slot(ctx, seq);
	u8 *b = s->buf + ETH_HLEN + VNIC_HDR_LEN;
	unsigned int n = 0, max;
	struct vnic_filter *f;
	u8 type;

	if (ctx->flush_pending) {
		type = VNIC_T_FLUSH;
		s->len = vnic_mgmt_build_flush(ctx, s->buf, seq, ctx->flush_reason);
		ctx->flush_pending = false;
		ctx->c.flushes++;
		vnic_flt_flush_sent_locked(ctx, seq);
	} else if (vnic_eth_build_locked(ctx, s, seq)) {
		/* ethtool waits for these: before the filters */
		type = s->type;
		n = s->nops;
	} else if (!list_empty(&ctx->del_list)) {
		type = VNIC_T_DEL;
		max = vnic_mgmt_max_ops(ctx, VNIC_DEL_FIT);
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
		s->len = vnic_mgmt_put_hdr(ctx, s->buf, type, seq, n, n * VNIC_DEL_OP);
	} else if (!list_empty(&ctx->add_list)) {
		type = VNIC_T_ADD;
		max = vnic_mgmt_max_ops(ctx, VNIC_ADD_FIT);
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
		s->len = vnic_mgmt_put_hdr(ctx, s->buf, type, seq, n, n * VNIC_ADD_OP);
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
	s->first_ns = ktime_get_ns();
	ctx->next_seq++;
	ctx->c.frames_sent++;
	return true;
}

/*
 * Process context. The frame goes to one fixed tx queue, bypassing the
 * qdisc, so that requests reach the device in sequence order.
 */
static int vnic_mgmt_xmit(struct vnic_ctx *ctx, const u8 *buf, unsigned int len)
{
	struct net_device *dev = ctx->dev;
	unsigned int txq = vnic_mgmt_txq;
	struct sk_buff *skb;
	int rc;

	if (!vnic_dev_link_ok(dev))
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

static void vnic_mgmt_xmit_count(struct vnic_ctx *ctx, const u8 *buf, unsigned int len)
{
	if (vnic_mgmt_xmit(ctx, buf, len)) {
		vnic_lock_bh(ctx);
		ctx->c.xmit_errors++;
		vnic_unlock_bh(ctx);
	}
}

/* ------------------------------------------------------------------------ */
/* Receive: CAPS and ACK. Softirq, any CPU, shared skbs: read only.         */

/*
 * Start the record of a window reset in the reset log (debugfs resets),
 * overwriting the oldest.
 */
static struct vnic_reset_rec *vnic_mgmt_reset_rec_locked(struct vnic_ctx *ctx, bool table_lost)
{
	struct vnic_reset_rec *r;

	r = &ctx->rlog.rec[ctx->rlog.resets % VNIC_RESET_LOG];
	ctx->rlog.resets++;
	r->nr = ctx->rlog.resets;
	r->table_lost = table_lost;
	r->una = ctx->una;
	r->next_seq = ctx->next_seq;
	r->add_ops = 0;
	r->nops = 0;
	return r;
}

/*
 * Forget every unacked request. If the device lost its table (new
 * generation) DELs are moot and the caller replays the live filters;
 * otherwise the ops go back to the queues to be sent again with new seqs.
 * The unacked ADD ops are logged (seq, id, rxq): the device may have
 * applied any of them, and a test matches its trace against this log.
 */
static void vnic_mgmt_window_reset_locked(struct vnic_ctx *ctx, bool table_lost)
{
	struct vnic_reset_rec *r = NULL;
	struct vnic_filter *f;
	bool applied;
	u32 seq;

	if (ctx->una != ctx->next_seq)
		r = vnic_mgmt_reset_rec_locked(ctx, table_lost);

	for (seq = ctx->una; seq != ctx->next_seq; seq++) {
		struct vnic_slot *s = vnic_mgmt_slot(ctx, seq);
		const u8 *op = s->buf + ETH_HLEN + VNIC_HDR_LEN;
		unsigned int i;

		if (!s->used || s->seq != seq)
			continue;
		s->used = false;
		if (s->acked)
			continue;
		/* The device may have applied these: we will never know. */
		if (s->type == VNIC_T_ADD) {
			ctx->c.add_unacked += s->nops;
			r->add_ops += s->nops;	/* r is set: the window is not empty */
		}
		/*
		 * The device applies frames in sequence order: one older than a
		 * frame it acknowledged was applied, its ACK lost. Sending a
		 * FLUSH or DEL of those again would undo what came after it.
		 */
		applied = !table_lost && ctx->have_acked_hi &&
			  vnic_mgmt_seq_before(seq, ctx->acked_hi);
		if (applied)
			ctx->c.applied_unacked++;
		if (s->type == VNIC_T_FLUSH) {
			if (applied) {
				ctx->table_full = false;
				vnic_flt_flush_acked_locked(ctx, seq);
			} else if (!table_lost) {
				ctx->flush_pending = true;
				ctx->flush_reason = op[0];
			}
			continue;
		}
		if (vnic_mgmt_is_eth_type(s->type)) {
			vnic_eth_unacked_locked(ctx, s, table_lost);
			continue;
		}
		for (i = 0; i < s->nops; i++) {
			u16 id = get_unaligned_be16(op);

			if (s->type == VNIC_T_ADD && r->nops < VNIC_RESET_LOG_OPS) {
				r->ops[r->nops].seq = seq;
				r->ops[r->nops].id = id;
				r->ops[r->nops].rxq = get_unaligned_be16(op + 2);
				r->nops++;
			}
			op += s->type == VNIC_T_ADD ? VNIC_ADD_OP : VNIC_DEL_OP;
			f = xa_load(&ctx->ids, id);
			if (!f)
				continue;
			if (s->type == VNIC_T_ADD && f->state == VF_LIVE && f->add_seq == seq) {
				f->add_inflight = false;
				if (!table_lost)
					vnic_flt_queue_add_locked(ctx, f);
			} else if (s->type == VNIC_T_ADD && f->state == VF_LIVE &&
				   f->refused_pending) {
				/*
				 * A later ADD of the id was refused while this one
				 * was unanswered: the device may hold this one. Send
				 * it again (an ADD is idempotent) to learn which.
				 */
				f->refused_pending = false;
				f->rxq = get_unaligned_be16(op - VNIC_ADD_OP + 2);
				if (!table_lost)
					vnic_flt_queue_add_locked(ctx, f);
			} else if (s->type == VNIC_T_DEL && f->state == VF_DELETING &&
				   f->del_seq == seq && !f->pending) {
				if (table_lost) {
					ctx->c.del_lost++;
					vnic_flt_free_locked(ctx, f);
				} else if (applied) {
					ctx->c.del[f->del_reason]++;
					vnic_flt_free_locked(ctx, f);
				} else {
					list_add_tail(&f->pend, &ctx->del_list);
					f->pending = true;
				}
			}
		}
	}
	ctx->have_acked_hi = false;	/* the window restarts at a new seq */
	if (table_lost) {
		/* FLUSHING and DEL-queued filters: freed by the work item */
		vnic_flt_flush_lost_locked(ctx);
		ctx->flush_pending = false;
	}
}

static void vnic_mgmt_rx_caps_locked(struct vnic_ctx *ctx, const struct sk_buff *skb,
				     const u8 *src, u32 seq, u32 gen, u16 body_len)
{
	u8 raw[VNIC_CAPS_EXT_BODY];
	struct vnic_caps caps;
	const u8 *b;
	bool lost;

	b = skb_header_pointer(skb, VNIC_HDR_LEN, body_len, raw);
	if (!b) {
		ctx->c.rx_malformed++;
		return;
	}
	if (!ctx->hello_out || seq != ctx->hello_seq ||
	    (ctx->state != VS_PROBING && ctx->state != VS_ACTIVE)) {
		ctx->c.rx_stale++;
		return;
	}
	/*
	 * The answer to our HELLO: it echoes the session's nonce, which only
	 * someone on the link saw, and comes from a unicast address, the
	 * device's, which every later device frame must come from too.
	 */
	if (get_unaligned_be32(b + VNIC_CAPS_OFF_NONCE) != ctx->hello_nonce) {
		ctx->c.rx_bad_nonce++;
		return;
	}
	if (!is_valid_ether_addr(src)) {
		ctx->c.rx_foreign++;
		return;
	}
	if (body_len == VNIC_CAPS_EXT_BODY &&
	    (get_unaligned_be32(b + VNIC_CAPS_OFF_FEATURES) & ~VNIC_FEAT_KNOWN ||
	     get_unaligned_be16(b + VNIC_CAPS_OFF_MAX_RULES + 2))) {
		ctx->c.rx_malformed++;	/* a feature we never asked for */
		return;
	}
	if (ctx->have_dev_mac && !ether_addr_equal(src, ctx->dev_mac)) {
		/* nothing rebinds a session: whoever else saw a nonce */
		ctx->c.rx_rebind++;
		if (net_ratelimit())
			vnic_warn(ctx, "refused a CAPS from %pM: the session is with %pM\n",
				  src, ctx->dev_mac);
		return;
	}
	ether_addr_copy(ctx->dev_mac, src);
	ctx->have_dev_mac = true;
	caps.max_queue_pairs = get_unaligned_be16(b);
	caps.enabled_queue_pairs = get_unaligned_be16(b + 2);
	caps.capacity = get_unaligned_be32(b + 4);
	caps.buckets = get_unaligned_be32(b + 8);
	caps.ways = get_unaligned_be16(b + 12);
	caps.max_ops = get_unaligned_be16(b + 14);
	caps.latency_us = get_unaligned_be32(b + 16);
	caps.features = 0;
	caps.max_rules = 0;
	if (body_len == VNIC_CAPS_EXT_BODY) {
		caps.features = get_unaligned_be32(b + VNIC_CAPS_OFF_FEATURES);
		if (caps.features & VNIC_FEAT_RULES)
			caps.max_rules = get_unaligned_be16(b + VNIC_CAPS_OFF_MAX_RULES);
	}

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
		vnic_work_kick_locked(ctx);
		return;
	}

	/* the device's expected seq is now seq + 1: restart the window there */
	vnic_mgmt_window_reset_locked(ctx, lost);
	ctx->caps = caps;
	ctx->una = seq + 1;
	ctx->next_seq = seq + 1;
	ctx->resync = false;
	if (lost) {
		ctx->c.gen_changes++;
		ctx->gen = gen;
		vnic_flt_replay_locked(ctx);
		vnic_eth_replay_locked(ctx);
	}
	vnic_work_kick_locked(ctx);
}

/* One op's outcome. @st is the op status, or -1 when the frame was NAKed. */
static void vnic_mgmt_ack_op_locked(struct vnic_ctx *ctx, const struct vnic_slot *s,
				    const u8 *op, int st)
{
	u16 id = get_unaligned_be16(op);

	if (vnic_mgmt_is_eth_type(s->type)) {
		vnic_eth_op_acked_locked(ctx, s, op, st);
		return;
	}
	if (st > 0) {
		if (st <= VNIC_S_MAX)
			ctx->c.rej[st]++;
		else
			ctx->c.rej_other++;
	}
	if (s->type == VNIC_T_ADD)
		vnic_flt_add_acked_locked(ctx, id, get_unaligned_be16(op + 2), s->seq, st);
	else
		vnic_flt_del_acked_locked(ctx, id, s->seq, st);
}

/* The device's programming latency as the driver sees it. */
static void vnic_mgmt_count_rtt_locked(struct vnic_ctx *ctx, const struct vnic_slot *s)
{
	u64 us = div_u64(ktime_get_ns() - s->first_ns, NSEC_PER_USEC);

	if (!ctx->c.ack_rtts++ || us < ctx->c.ack_rtt_min_us)
		ctx->c.ack_rtt_min_us = us;
	if (us > ctx->c.ack_rtt_max_us)
		ctx->c.ack_rtt_max_us = us;
}

static void vnic_mgmt_rx_ack_locked(struct vnic_ctx *ctx, const struct sk_buff *skb,
				    u32 seq, u16 count, u16 body_len)
{
	u8 fixed_raw[VNIC_ACK_FIXED], chunk_raw[64];
	const u8 *fixed, *chunk = NULL;
	unsigned int i, oplen;
	struct vnic_slot *s;
	u8 acked_type, fstatus;
	const u8 *op;

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
	if (ctx->state != VS_ACTIVE || vnic_mgmt_seq_before(seq, ctx->una) ||
	    !vnic_mgmt_seq_before(seq, ctx->next_seq)) {
		ctx->c.rx_stale++;
		return;
	}
	s = vnic_mgmt_slot(ctx, seq);
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
		if (net_ratelimit())
			vnic_warn(ctx, "device NAKed frame seq %u type %u (code %u)\n",
				  seq, s->type, fstatus);
	}
	if (!fstatus && s->type != VNIC_T_FLUSH)
		vnic_mgmt_count_rtt_locked(ctx, s);
	if (s->type == VNIC_T_FLUSH) {
		ctx->c.flush_acks++;
		if (!fstatus)
			ctx->table_full = false;
		vnic_flt_flush_acked_locked(ctx, seq);
	} else {
		oplen = vnic_mgmt_op_len(s->type);
		op = s->buf + ETH_HLEN + VNIC_HDR_LEN;
		for (i = 0; i < s->nops; i++, op += oplen) {
			int st = -1;

			if (!fstatus) {
				if (i % sizeof(chunk_raw) == 0) {
					unsigned int n = min_t(unsigned int, sizeof(chunk_raw),
							       s->nops - i);

					chunk = skb_header_pointer(skb, VNIC_HDR_LEN +
								   VNIC_ACK_FIXED + i,
								   n, chunk_raw);
					if (!chunk) {	/* cannot happen: length checked */
						ctx->c.rx_malformed++;
						return;
					}
				}
				st = chunk[i % sizeof(chunk_raw)];
			}
			vnic_mgmt_ack_op_locked(ctx, s, op, st);
		}
	}
	s->acked = true;
	if (!ctx->have_acked_hi || vnic_mgmt_seq_before(ctx->acked_hi, seq)) {
		ctx->acked_hi = seq;
		ctx->have_acked_hi = true;
	}
	while (ctx->una != ctx->next_seq) {
		s = vnic_mgmt_slot(ctx, ctx->una);
		if (!s->used || !s->acked)
			break;
		s->used = false;
		ctx->una++;
	}
	if (!list_empty(&ctx->add_list) || !list_empty(&ctx->del_list) || ctx->eth_dirty)
		vnic_work_kick_locked(ctx);
}

/**
 * vnic_mgmt_rcv - packet handler for EtherType 0x88B5 on one netdev
 * @skb: the frame (network header = management header)
 * @dev: the netdev
 * @pt: ctx->pt
 * @orig_dev: unused
 *
 * Softirq: takes ctx->lock with spin_lock(). The skb may be shared: read only.
 *
 * Return: NET_RX_SUCCESS (the frame is always consumed).
 */
int vnic_mgmt_rcv(struct sk_buff *skb, struct net_device *dev,
		  struct packet_type *pt, struct net_device *orig_dev)
{
	struct vnic_ctx *ctx = container_of(pt, struct vnic_ctx, pt);
	u8 raw[VNIC_HDR_LEN];
	u16 count, body_len;
	const u8 *h, *src;
	u32 seq, gen;
	u8 type;

	lockdep_assert_in_softirq();
	if (skb->pkt_type == PACKET_OUTGOING || skb->pkt_type == PACKET_LOOPBACK)
		goto out;

	vnic_lock(ctx);
	if (skb->pkt_type != PACKET_HOST) {
		/* the device answers our own address: another host's, or a group's */
		ctx->c.rx_not_host++;
		goto unlock;
	}
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

	src = eth_hdr(skb)->h_source;
	switch (type) {
	case VNIC_T_CAPS:
		if (count || (body_len != VNIC_CAPS_BODY && body_len != VNIC_CAPS_EXT_BODY)) {
			ctx->c.rx_malformed++;
			break;
		}
		vnic_mgmt_rx_caps_locked(ctx, skb, src, seq, gen, body_len);
		break;
	case VNIC_T_ACK:
		if (!ctx->have_dev_mac || !ether_addr_equal(src, ctx->dev_mac)) {
			/* not from the device of this session */
			ctx->c.rx_foreign++;
			break;
		}
		if (ctx->have_gen && gen != ctx->gen && !ctx->unload_wait) {
			/*
			 * The device restarted: HELLO again, then replay. Only
			 * an answer to a frame in flight says so; a replayed or
			 * forged ACK would stall programming at every round trip.
			 */
			ctx->c.rx_wrong_gen++;
			if (ctx->state == VS_ACTIVE && !ctx->resync &&
			    vnic_mgmt_answers_inflight_locked(ctx, skb, seq)) {
				ctx->resync = true;
				vnic_work_kick_locked(ctx);
			}
			break;
		}
		vnic_mgmt_rx_ack_locked(ctx, skb, seq, count, body_len);
		break;
	default:
		/* HELLO/ADD/DEL/FLUSH are ours (wrong direction), or unknown */
		ctx->c.rx_malformed++;
		break;
	}
unlock:
	vnic_unlock(ctx);
out:
	consume_skb(skb);
	return NET_RX_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* The work item's passes                                                   */

/**
 * vnic_mgmt_probe - one probing pass: (re)send HELLO until CAPS arrives
 * @ctx: the context, in VS_PROBING
 * @delay: set to when the next pass should run (jiffies from now)
 *
 * Work item.
 *
 * Return: false when the device did not answer within hello_timeout_ms of
 * link-up time and the caller should give up on the netdev.
 */
bool vnic_mgmt_probe(struct vnic_ctx *ctx, unsigned long *delay)
{
	unsigned long now = jiffies, rto;
	unsigned int len = 0;

	vnic_lock_bh(ctx);
	rto = vnic_mgmt_rto(ctx);
	*delay = rto;
	if (ctx->state != VS_PROBING) {
		vnic_unlock_bh(ctx);
		return true;
	}
	if (!vnic_dev_link_ok(ctx->dev)) {
		ctx->probe_start = 0;	/* NETDEV_UP / CHANGE kick us again */
		vnic_unlock_bh(ctx);
		*delay = MAX_JIFFY_OFFSET;
		return true;
	}
	if (!ctx->probe_start)
		ctx->probe_start = now;
	if (time_after(now, ctx->probe_start +
		       msecs_to_jiffies(READ_ONCE(vnic_hello_timeout_ms)))) {
		vnic_unlock_bh(ctx);
		return false;
	}
	if (!ctx->hello_out || time_after_eq(now, ctx->hello_sent_at + rto)) {
		if (!ctx->hello_out)
			ctx->hello_seq = ctx->next_seq;
		ctx->hello_out = true;
		ctx->hello_sent_at = now;
		len = vnic_mgmt_build_hello_locked(ctx, ctx->hello_seq);
	}
	vnic_unlock_bh(ctx);
	if (len)
		vnic_mgmt_xmit_count(ctx, ctx->hello_buf, len);
	return true;
}

/**
 * vnic_mgmt_pass - one pass of an active session
 * @ctx: the context, in VS_ACTIVE
 *
 * Work item. The bulk walk (replay, layout FLUSH, NTUPLE off), refused-flow
 * reaping, the expiry pass, stall detection, HELLO (resync or keepalive),
 * go-back-N retransmission and new request frames; the frames are sent after
 * ctx->lock is dropped.
 *
 * Return: when the next pass should run (jiffies from now).
 */
unsigned long vnic_mgmt_pass(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	unsigned int nsend = 0, hlen = 0, i;
	unsigned long now, rto, delay;
	unsigned int keepalive = READ_ONCE(vnic_keepalive_ms);
	u32 tosend[VNIC_WINDOW];

	/* replay, layout FLUSH, NTUPLE off: before anything is sent */
	vnic_flt_bulk(ctx);
	/* ids of filters a FLUSH or a table loss removed */
	vnic_flt_reap(ctx);

	now = jiffies;
	vnic_lock_bh(ctx);
	rto = vnic_mgmt_rto(ctx);

	vnic_flt_reap_rejected_locked(ctx, now);
	vnic_flt_expire_locked(ctx, now);

	if (vnic_dev_link_ok(dev)) {
		/*
		 * The oldest frame went unanswered VNIC_MAX_RETRIES times: the
		 * device may expect another seq (someone else sent HELLO, or it
		 * lost its state without a new generation). Restart the session.
		 */
		if (!ctx->hello_out && !ctx->resync && ctx->una != ctx->next_seq) {
			struct vnic_slot *old = vnic_mgmt_slot(ctx, ctx->una);

			if (old->used && !old->acked && old->retries >= VNIC_MAX_RETRIES &&
			    time_after_eq(now, old->sent_at + rto)) {
				ctx->resync = true;
				ctx->c.stalls++;
			}
		}
		if (ctx->hello_out) {
			if (time_after_eq(now, ctx->hello_sent_at + rto)) {
				ctx->hello_sent_at = now;
				hlen = vnic_mgmt_build_hello_locked(ctx, ctx->hello_seq);
			}
		} else if (ctx->resync ||
			   (keepalive && ctx->una == ctx->next_seq &&
			    time_after_eq(now, ctx->last_rx + msecs_to_jiffies(keepalive)))) {
			ctx->hello_seq = ctx->next_seq;
			ctx->hello_out = true;
			ctx->hello_sent_at = now;
			hlen = vnic_mgmt_build_hello_locked(ctx, ctx->hello_seq);
		}

		if (!ctx->hello_out) {
			u32 seq;

			/* go-back-N: on timeout resend every unacked frame, oldest first */
			if (ctx->una != ctx->next_seq &&
			    time_after_eq(now, vnic_mgmt_slot(ctx, ctx->una)->sent_at + rto)) {
				for (seq = ctx->una; seq != ctx->next_seq; seq++) {
					struct vnic_slot *s = vnic_mgmt_slot(ctx, seq);

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
			       vnic_mgmt_build_request_locked(ctx, now))
				tosend[nsend++] = ctx->next_seq - 1;
		}
	}

	delay = msecs_to_jiffies(max_t(unsigned int, READ_ONCE(vnic_interval_ms), 1));
	if (ctx->hello_out || ctx->una != ctx->next_seq)
		delay = min(delay, rto);
	vnic_unlock_bh(ctx);

	/* Only the work item writes the slot buffers: safe to read unlocked. */
	if (hlen)
		vnic_mgmt_xmit_count(ctx, ctx->hello_buf, hlen);
	for (i = 0; i < nsend; i++) {
		struct vnic_slot *s = vnic_mgmt_slot(ctx, tosend[i]);

		vnic_mgmt_xmit_count(ctx, s->buf, s->len);
	}
	return delay;
}

/**
 * vnic_mgmt_unload_flush - best effort: HELLO + FLUSH(unload), wait for the ACK
 * @ctx: an unhooked context whose packet handler is still in place
 *
 * Module exit, without RTNL (the wait may take three retransmit timeouts,
 * ~31 s with the device's latency at its 10 s cap). The work item is
 * disabled, so this is the only sender. HELLO first so that the device
 * expects our seq. A NETDEV_UNREGISTER of the netdev meanwhile ends the
 * wait early (ctx->unload_abort).
 */
void vnic_mgmt_unload_flush(struct vnic_ctx *ctx)
{
	unsigned long idx, rto, acked;
	unsigned int hlen, flen, live, tries;
	struct vnic_filter *f;
	u32 seq;

	might_sleep();
	for (tries = 0; tries < 3; tries++) {
		vnic_lock_bh(ctx);
		if (ctx->unload_abort) {
			vnic_unlock_bh(ctx);
			return;
		}
		seq = ctx->next_seq;
		ctx->next_seq += 2;
		hlen = vnic_mgmt_build_hello_locked(ctx, seq);
		flen = vnic_mgmt_build_flush(ctx, ctx->flush_buf, seq + 1, VNIC_R_UNLOAD);
		ctx->unload_seq = seq + 1;
		ctx->unload_wait = true;
		reinit_completion(&ctx->unload_done);
		rto = vnic_mgmt_rto(ctx);
		ctx->c.flushes++;
		vnic_unlock_bh(ctx);

		vnic_mgmt_xmit_count(ctx, ctx->hello_buf, hlen);
		vnic_mgmt_xmit_count(ctx, ctx->flush_buf, flen);
		/* consumes the completion: its return value is the only witness */
		acked = wait_for_completion_timeout(&ctx->unload_done, rto);

		vnic_lock_bh(ctx);
		if (acked && !ctx->unload_abort) {
			/* every filter the device may have had is gone */
			live = 0;
			xa_for_each(&ctx->ids, idx, f)
				if (f->sent)
					live++;
			ctx->unload_wait = false;
			ctx->c.flush_acks++;
			ctx->c.del[VNIC_R_UNLOAD] += live;
			vnic_unlock_bh(ctx);
			return;
		}
		vnic_unlock_bh(ctx);
	}
	vnic_lock_bh(ctx);
	ctx->unload_wait = false;
	vnic_unlock_bh(ctx);
	vnic_warn(ctx, "no ACK for the unload FLUSH\n");
}
