// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_arfs filter table: one filter per flow the kernel asked us to steer.
 *
 * A filter owns an id (0..0xFFFE, cyclic, from ctx->ids) from its creation
 * until the device acknowledged its DEL, so that a late duplicate frame can
 * never hit a newer filter. Flows are found through ctx->flows, an rhashtable
 * (bounded chains: it grows at 75% load and rehashes a chain longer than 16,
 * up to VNIC_FLOWS_MAX_BUCKETS buckets for the at most 65,535 + 16,384
 * entries). Every function here runs under ctx->lock unless it says otherwise.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/jiffies.h>
#include <linux/slab.h>
#include <net/flow_dissector.h>

#include "vnic_arfs.h"

/*
 * The lookup key: the flow, followed by a count of the entries the lookup
 * compared. Only the flow is hashed (key_len); rhashtable hands the key to
 * vnic_flt_cmp() for every entry of the chain it walks, which counts them.
 * The key is always a writable object on the caller's stack: rhashtable only
 * passes it on as a const pointer.
 */
struct vnic_flt_key {
	struct vnic_flow flow;		/* must stay first: the hashed part */
	unsigned int walked;
};

static int vnic_flt_cmp(struct rhashtable_compare_arg *arg, const void *obj)
{
	struct vnic_flt_key *k = (struct vnic_flt_key *)arg->key;
	const struct vnic_filter *f = obj;

	k->walked++;
	return memcmp(&k->flow, &f->key, sizeof(k->flow));
}

static const struct rhashtable_params vnic_flt_params = {
	.key_len = sizeof(struct vnic_flow),
	.key_offset = offsetof(struct vnic_filter, key),
	.head_offset = offsetof(struct vnic_filter, hnode),
	.obj_cmpfn = vnic_flt_cmp,
	.min_size = 64,
	.max_size = VNIC_FLOWS_MAX_BUCKETS,
	.automatic_shrinking = true,
};

/**
 * vnic_flt_init - set up an empty filter table
 * @ctx: the context, being attached (process context, no lock needed)
 *
 * Return: 0, or a negative errno from rhashtable_init().
 */
int vnic_flt_init(struct vnic_ctx *ctx)
{
	BUILD_BUG_ON(sizeof(struct vnic_flow) % sizeof(u32));
	BUILD_BUG_ON(VNIC_MAX_ID + 1 + VNIC_MAX_REJECTED > 2 * VNIC_FLOWS_MAX_BUCKETS);
	xa_init_flags(&ctx->ids, XA_FLAGS_ALLOC);
	INIT_LIST_HEAD(&ctx->live_list);
	INIT_LIST_HEAD(&ctx->rej_list);
	INIT_LIST_HEAD(&ctx->add_list);
	INIT_LIST_HEAD(&ctx->del_list);
	INIT_LIST_HEAD(&ctx->ice_list);
	INIT_LIST_HEAD(&ctx->flush_list);
	INIT_LIST_HEAD(&ctx->flush_wait_list);
	INIT_LIST_HEAD(&ctx->reap_list);
	INIT_LIST_HEAD(&ctx->reap_del);
	return rhashtable_init(&ctx->flows, &vnic_flt_params);
}

/**
 * vnic_flt_destroy - free every filter and the table
 * @ctx: the context, at the end of teardown
 *
 * Runs without ctx->lock: the netdev hooks and the packet handler are gone
 * and the work item is disabled, so nothing else can reach the table.
 */
void vnic_flt_destroy(struct vnic_ctx *ctx)
{
	struct vnic_filter *f, *tmp;
	unsigned long idx;

	rhashtable_destroy(&ctx->flows);
	list_for_each_entry_safe(f, tmp, &ctx->rej_list, node)
		kfree(f);
	xa_for_each(&ctx->ids, idx, f)
		kfree(f);
	xa_destroy(&ctx->ids);
	INIT_LIST_HEAD(&ctx->live_list);
	INIT_LIST_HEAD(&ctx->rej_list);
	INIT_LIST_HEAD(&ctx->add_list);
	INIT_LIST_HEAD(&ctx->del_list);
	INIT_LIST_HEAD(&ctx->ice_list);
	INIT_LIST_HEAD(&ctx->flush_list);
	INIT_LIST_HEAD(&ctx->flush_wait_list);
	INIT_LIST_HEAD(&ctx->reap_list);
	INIT_LIST_HEAD(&ctx->reap_del);
	ctx->nr_flushing = 0;
	ctx->nr_flush_wait = 0;
	ctx->nr_reaping = 0;
	ctx->nr_ids = 0;
	ctx->nr_live = 0;
	ctx->nr_rejected = 0;
	ctx->layout_left = 0;
	ctx->replay_left = 0;
	ctx->layout_walk = false;
}

static int vnic_flt_flow_from_skb(const struct sk_buff *skb, struct vnic_flow *k)
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

static struct vnic_filter *vnic_flt_lookup_locked(struct vnic_ctx *ctx,
						  struct vnic_flt_key *key)
{
	struct vnic_filter *f;

	key->walked = 0;
	f = rhashtable_lookup_fast(&ctx->flows, key, vnic_flt_params);
	if (key->walked > ctx->c.max_chain)
		ctx->c.max_chain = key->walked;
	return f;
}

static void vnic_flt_unhash_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	rhashtable_remove_fast(&ctx->flows, &f->hnode, vnic_flt_params);
}

/**
 * vnic_flt_queue_add_locked - queue an ADD of @f (no-op if one is queued)
 * @ctx: the context
 * @f: a LIVE filter
 */
void vnic_flt_queue_add_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	if (f->pending)
		return;
	list_add_tail(&f->pend, &ctx->add_list);
	f->pending = true;
}

/**
 * vnic_flt_free_locked - free a filter that owns an id
 * @ctx: the context
 * @f: a filter already out of the flow table and live_list (DELETING, or a
 *     LIVE one whose ADD was never sent)
 */
void vnic_flt_free_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	if (f->pending)
		list_del(&f->pend);
	xa_erase(&ctx->ids, f->id);
	ctx->nr_ids--;
	kfree(f);
}

/*
 * Take a LIVE filter off live_list, keeping the bulk walks' counts exact:
 * a filter a walk was still to visit is one fewer for it.
 */
static void vnic_flt_unlink_live_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	list_del(&f->node);
	list_del_init(&f->alist);
	ctx->nr_live--;
	if (f->layout_epoch != ctx->layout_epoch)
		ctx->layout_left--;
	if (f->replay_epoch != ctx->replay_epoch)
		ctx->replay_left--;
}

/*
 * Take a LIVE filter out of the flow table, live_list and the ADD queue,
 * into @state. Return: false when it was freed instead (the device never
 * saw its id: nothing to delete there).
 */
static bool vnic_flt_retire_locked(struct vnic_ctx *ctx, struct vnic_filter *f,
				   u8 state, u8 reason)
{
	vnic_flt_unhash_locked(ctx, f);
	vnic_flt_unlink_live_locked(ctx, f);
	if (f->pending) {
		list_del(&f->pend);
		f->pending = false;
	}
	if (!f->sent) {
		ctx->c.del_cancelled++;
		vnic_flt_free_locked(ctx, f);
		return false;
	}
	f->state = state;
	f->del_reason = reason;
	f->add_inflight = false;
	return true;
}

/* Take a LIVE filter out of service; the device is told with a DEL. */
static void vnic_flt_del_locked(struct vnic_ctx *ctx, struct vnic_filter *f, u8 reason)
{
	if (!vnic_flt_retire_locked(ctx, f, VF_DELETING, reason))
		return;
	list_add_tail(&f->pend, &ctx->del_list);
	f->pending = true;
}

static void vnic_flt_rejected_free_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	vnic_flt_unhash_locked(ctx, f);
	list_del(&f->node);
	ctx->nr_rejected--;
	kfree(f);
}

/*
 * The device refused the first ADD of a filter: free the id, and keep the
 * flow in the table for reject_holdoff_ms so that the steer calls the kernel
 * keeps making for it (6.12) get -EBUSY instead of a new ADD each time. With
 * VNIC_MAX_REJECTED flows already held off, the filter is simply freed.
 */
static void vnic_flt_reject_locked(struct vnic_ctx *ctx, struct vnic_filter *f, u8 status)
{
	vnic_flt_unlink_live_locked(ctx, f);
	if (f->pending) {
		list_del(&f->pend);
		f->pending = false;
	}
	xa_erase(&ctx->ids, f->id);
	ctx->nr_ids--;
	if (ctx->nr_rejected >= VNIC_MAX_REJECTED) {
		vnic_flt_unhash_locked(ctx, f);
		kfree(f);
		return;
	}
	f->id = VNIC_NO_FILTER;
	f->state = VF_REJECTED;
	f->rej_status = status;
	f->since = jiffies;
	list_add_tail(&f->node, &ctx->rej_list);
	ctx->nr_rejected++;
}

/**
 * vnic_flt_layout_changed_locked - the CPU -> rx queue layout changed
 * @ctx: the context
 *
 * Every live filter goes (reason flush): its queue was chosen for the old
 * layout and may not be local to the receiving CPU any more. With one FLUSH
 * frame, not a DEL each (65,535 DELs would hold their ids, counted against
 * the capacity, while every flow asks again). vnic_flt_bulk() takes the
 * filters out of the flow table in batches, so a steer call creates a new
 * filter, whose ADD the device gets after the FLUSH (frames are applied in
 * order, and the FLUSH is queued before the pass sends anything); they keep
 * their ids until the FLUSH is acknowledged. Refused flows are forgotten
 * too (a refusal such as bad_queue may not hold now). The kernel's RFS
 * records are reset once the FLUSH is acknowledged (rfs_reset_due), so that
 * the next packet of every flow asks for a filter again, under the new
 * layout, with the ids free.
 */
void vnic_flt_layout_changed_locked(struct vnic_ctx *ctx)
{
	struct vnic_filter *f, *tmp;

	ctx->layout_epoch++;
	ctx->layout_left = ctx->nr_live;
	ctx->layout_walk = true;
	list_for_each_entry_safe(f, tmp, &ctx->rej_list, node)
		vnic_flt_rejected_free_locked(ctx, f);
	ctx->table_full = false;
	ctx->rfs_reset_due = true;
}

/* One filter of a layout change's walk: retire it into the FLUSH. */
static void vnic_flt_bulk_flush_one(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	unsigned int nq = ctx->rmap_nq;

	if (f->rxq >= nq || f->dev_rxq >= nq)
		ctx->c.queue_flushes++;
	ctx->c.layout_flushes++;
	if (!vnic_flt_retire_locked(ctx, f, VF_FLUSHING, VNIC_R_FLUSH))
		return;
	list_add_tail(&f->node, &ctx->flush_list);
	ctx->nr_flushing++;
}

/* A filter a replay is still to visit: the device does not have it. */
static void vnic_flt_bulk_forget_dev(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	f->replay_epoch = ctx->replay_epoch;
	ctx->replay_left--;
	f->on_dev = false;
	f->sent = false;
	f->add_inflight = false;
}

/*
 * One lock hold of vnic_flt_bulk(): up to VNIC_BULK_BATCH filters (fewer
 * when the hold has lasted VNIC_HOLD_BUDGET_NS), each
 * taken from the head of live_list and either retired or moved to its tail
 * (the expiry pass rotates the list too; a walk goes by epochs and counts,
 * never by position).
 *
 * Return: true when work is left.
 */
static bool vnic_flt_bulk_step_locked(struct vnic_ctx *ctx)
{
	/* read at every hold: NTUPLE back on ends the delete (steer calls resume) */
	bool ntuple_off = !(READ_ONCE(ctx->dev->features) & NETIF_F_NTUPLE);
	struct vnic_filter *f;
	unsigned int n = 0;
	bool replay;

	while (n < VNIC_BULK_BATCH && !(n && vnic_hold_spent(ctx)) &&
	       !list_empty(&ctx->live_list) &&
	       (ctx->layout_left || ctx->replay_left || ntuple_off)) {
		f = list_first_entry(&ctx->live_list, struct vnic_filter, node);
		n++;
		replay = ctx->replay_left && f->replay_epoch != ctx->replay_epoch;
		if (replay)
			vnic_flt_bulk_forget_dev(ctx, f);
		if (ctx->layout_left && f->layout_epoch != ctx->layout_epoch) {
			vnic_flt_bulk_flush_one(ctx, f);
		} else if (ntuple_off) {
			/* one FLUSH for them all (the same path as a layout change) */
			if (vnic_flt_retire_locked(ctx, f, VF_FLUSHING, VNIC_R_FLUSH)) {
				list_add_tail(&f->node, &ctx->flush_list);
				ctx->nr_flushing++;
			}
		} else {
			/* replayed, or new since the walk began: to the tail */
			list_move_tail(&f->node, &ctx->live_list);
			if (replay) {
				vnic_flt_queue_add_locked(ctx, f);
				ctx->c.replayed++;
			}
		}
	}
	if (n) {
		ctx->c.bulk_batches++;
		ctx->c.bulk_max = max_t(u64, ctx->c.bulk_max, n);
	}
	if (ctx->layout_walk && !ctx->layout_left) {
		/* the layout walk is over: one FLUSH for it, before any new ADD */
		ctx->layout_walk = false;
		if (!list_empty(&ctx->flush_list)) {
			ctx->flush_pending = true;
			ctx->flush_reason = VNIC_R_FLUSH;
			ctx->c.layout_flush_frames++;
		}
	}
	return ctx->layout_left || ctx->replay_left ||
	       (ntuple_off && !list_empty(&ctx->live_list));
}

/**
 * vnic_flt_bulk - work on every live filter, in batches
 * @ctx: an active context (the work item, before the pass takes the lock)
 *
 * A layout change's FLUSH (vnic_flt_layout_changed_locked()), a replay
 * after the device lost its table (vnic_flt_replay_locked()) and the
 * NTUPLE-off delete each visit every live filter. They run here in holds
 * of VNIC_BULK_BATCH filters with ctx->lock, and BHs, released between
 * them: steer calls, ACKs and other netdevs' work go on meanwhile. Nothing
 * is sent until the walk is done (the pass that sends runs after it), so
 * the device sees the same frames as with one long hold.
 */
void vnic_flt_bulk(struct vnic_ctx *ctx)
{
	bool ntuple_off = !(READ_ONCE(ctx->dev->features) & NETIF_F_NTUPLE);
	bool more;

	vnic_lock_bh(ctx);
	if (ntuple_off && ctx->nr_live)
		ctx->c.ntuple_flushes++;
	do {
		more = vnic_flt_bulk_step_locked(ctx);
		vnic_unlock_bh(ctx);
		if (more)
			cond_resched();
		vnic_lock_bh(ctx);
	} while (more);
	/*
	 * Filters the NTUPLE-off walk retired (the walk may have ended early:
	 * NTUPLE back on) leave with one FLUSH, sent before any new ADD. Their
	 * ids are free at its ACK; the kernel's RFS records are reset only
	 * then (rfs_reset_due, set when NTUPLE comes back on).
	 */
	if (!ctx->layout_walk && !list_empty(&ctx->flush_list) && !ctx->flush_pending) {
		ctx->flush_pending = true;
		ctx->flush_reason = VNIC_R_FLUSH;
	}
	vnic_unlock_bh(ctx);
}

/**
 * vnic_flt_flush_sent_locked - a FLUSH frame goes out
 * @ctx: the context
 * @seq: its sequence number
 *
 * It covers every FLUSHING filter: those waiting for it and those of an
 * earlier FLUSH not acknowledged yet.
 */
void vnic_flt_flush_sent_locked(struct vnic_ctx *ctx, u32 seq)
{
	list_splice_tail_init(&ctx->flush_list, &ctx->flush_wait_list);
	ctx->nr_flush_wait = ctx->nr_flushing;	/* every FLUSHING filter waits now */
	ctx->flush_wait_seq = seq;
}

/* @n FLUSHING filters of @l are gone from the device: to the reaper. */
static void vnic_flt_flush_reap_locked(struct vnic_ctx *ctx, struct list_head *l,
				       unsigned int n)
{
	list_splice_tail_init(l, &ctx->reap_list);
	ctx->nr_flushing -= n;
	ctx->nr_reaping += n;
	vnic_work_kick_locked(ctx);
}

/**
 * vnic_flt_reap - free the filters a FLUSH or a table loss removed
 * @ctx: an active context (the work item)
 *
 * Their ids are released in holds of at most VNIC_BULK_BATCH filters (and
 * VNIC_HOLD_BUDGET_NS), with
 * ctx->lock and BHs let go between them, and their memory after each hold:
 * a 65,535-filter FLUSH costs its ACK a list splice, not 65,535 frees in
 * softirq under the lock.
 */
void vnic_flt_reap(struct vnic_ctx *ctx)
{
	struct vnic_filter *f, *tmp;
	unsigned int n;
	LIST_HEAD(gone);
	bool more;

	vnic_lock_bh(ctx);
	do {
		for (n = 0; n < VNIC_BULK_BATCH && !(n && vnic_hold_spent(ctx)); n++) {
			f = list_first_entry_or_null(&ctx->reap_list,
						     struct vnic_filter, node);
			if (f) {
				list_del(&f->node);
				ctx->nr_reaping--;
			} else {
				f = list_first_entry_or_null(&ctx->reap_del,
							     struct vnic_filter, pend);
				if (!f)
					break;
				list_del(&f->pend);
				ctx->c.del_lost++;
			}
			xa_erase(&ctx->ids, f->id);
			ctx->nr_ids--;
			list_add(&f->node, &gone);
		}
		if (n) {
			ctx->c.reaped += n;
			ctx->c.reap_batches++;
		}
		more = !list_empty(&ctx->reap_list) || !list_empty(&ctx->reap_del);
		vnic_unlock_bh(ctx);
		list_for_each_entry_safe(f, tmp, &gone, node)
			kfree(f);
		INIT_LIST_HEAD(&gone);
		if (more)
			cond_resched();
		vnic_lock_bh(ctx);
	} while (more);
	vnic_unlock_bh(ctx);
}

/**
 * vnic_flt_flush_acked_locked - the device answered a FLUSH
 * @ctx: the context
 * @seq: the FLUSH's sequence number
 *
 * When it is the FLUSH that covers the waiting filters, they are gone from
 * the device (ACKed ok or NAKed: a FLUSH is never refused op by op): the
 * work item frees their ids (vnic_flt_reap()), then resets the kernel's RFS
 * records when that is due.
 */
void vnic_flt_flush_acked_locked(struct vnic_ctx *ctx, u32 seq)
{
	if (list_empty(&ctx->flush_wait_list) || seq != ctx->flush_wait_seq)
		return;
	ctx->c.del[VNIC_R_FLUSH] += ctx->nr_flush_wait;
	vnic_flt_flush_reap_locked(ctx, &ctx->flush_wait_list, ctx->nr_flush_wait);
	ctx->nr_flush_wait = 0;
}

/**
 * vnic_flt_flush_lost_locked - the device lost its table (new generation)
 * @ctx: the context
 *
 * Every FLUSHING filter is gone from the device already, and so is every
 * filter waiting for its DEL to be sent: the work item frees them all.
 */
void vnic_flt_flush_lost_locked(struct vnic_ctx *ctx)
{
	ctx->c.del_lost += ctx->nr_flushing;
	list_splice_tail_init(&ctx->flush_list, &ctx->flush_wait_list);
	vnic_flt_flush_reap_locked(ctx, &ctx->flush_wait_list, ctx->nr_flushing);
	ctx->nr_flush_wait = 0;
	/* still ->pending: no ACK can free them meanwhile (vnic_flt_del_acked_locked()) */
	list_splice_tail_init(&ctx->del_list, &ctx->reap_del);
}

/**
 * vnic_flt_replay_locked - the device lost its table (new generation)
 * @ctx: the context
 *
 * Every live filter's ADD goes again; vnic_flt_bulk() queues them in
 * batches (softirq: the CAPS that told us). Until then a live filter still
 * reads as on the device, which nothing acts on before the walk ends: ADDs
 * and DELs go out only from the pass after it, and expiry runs there.
 */
void vnic_flt_replay_locked(struct vnic_ctx *ctx)
{
	ctx->c.replays++;
	ctx->table_full = false;
	ctx->replay_epoch++;
	ctx->replay_left = ctx->nr_live;
}

static bool vnic_flt_held_off(unsigned long now, unsigned long since)
{
	return time_before(now, since + msecs_to_jiffies(READ_ONCE(vnic_reject_holdoff_ms)));
}

/**
 * vnic_flt_steer - the body of ndo_rx_flow_steer
 * @ctx: the context of @skb's netdev
 * @skb: the packet the kernel wants steered
 * @rxq_index: the rx queue local to the receiving CPU (from rx_cpu_rmap)
 * @flow_id: the kernel's RFS slot, for rps_may_expire_flow()
 *
 * Softirq (or BH-disabled process context, busy polling), RCU held: takes
 * ctx->lock with spin_lock(), allocates with GFP_ATOMIC, does bounded work.
 *
 * Return: the filter id (>= 0), or -EPROTONOSUPPORT, -ENODEV, -EINVAL,
 * -EBUSY, -ENOMEM.
 */
int vnic_flt_steer(struct vnic_ctx *ctx, const struct sk_buff *skb,
		   u16 rxq_index, u32 flow_id)
{
	struct net_device *dev = ctx->dev;
	unsigned long now = jiffies;
	struct vnic_flt_key key;
	struct vnic_filter *f;
	int ret, err;
	u32 id;

	lockdep_assert_in_softirq();
	ret = vnic_flt_flow_from_skb(skb, &key.flow);

	vnic_lock(ctx);
	ctx->c.steer_calls++;
	if (ret) {
		ctx->c.unsupported++;
		goto out;
	}
	if (ctx->state != VS_ACTIVE) {
		ret = -ENODEV;
		goto out;
	}
	if (rxq_index >= READ_ONCE(dev->real_num_rx_queues)) {
		ctx->c.bad_rxq++;
		ret = -EINVAL;
		goto out;
	}

	f = vnic_flt_lookup_locked(ctx, &key);
	ctx->c.steer_walked += key.walked;
	if (f && f->state == VF_LIVE) {
		f->last_seen = now;
		if (f->refused_pending ||
		    (f->resteer_blocked && f->rxq != rxq_index &&
		     vnic_flt_held_off(now, f->since))) {
			/*
			 * The device refused this move lately, or the fate of
			 * an earlier ADD is open: no ADD per packet, and no
			 * id the device may not hold. The kernel records
			 * nothing for a failed call, so the filter's RFS slot
			 * stays the one of its last successful call (what
			 * rps_may_expire_flow() must be asked about).
			 */
			ctx->c.busy++;
			ctx->c.busy_rejected++;
			ret = -EBUSY;
			goto out;
		}
		/* success from here: the kernel writes the id into this slot */
		f->flow_id = flow_id;
		f->slot_rxq = rxq_index;
		ret = f->id;
		if (f->rxq == rxq_index) {
			ctx->c.steer_dedup++;
			goto out;
		}
		f->resteer_blocked = false;
		f->refused_pending = false;
		f->rxq = rxq_index;
		ctx->c.resteers++;
		vnic_flt_queue_add_locked(ctx, f);
		vnic_work_kick_locked(ctx);
		goto out;
	}
	if (f) {		/* VF_REJECTED */
		if (vnic_flt_held_off(now, f->since)) {
			ctx->c.busy++;
			ctx->c.busy_rejected++;
			ret = -EBUSY;
			goto out;
		}
		vnic_flt_rejected_free_locked(ctx, f);
	}

	if (ctx->table_full && !vnic_flt_held_off(now, ctx->table_full_since))
		ctx->table_full = false;
	/*
	 * FLUSHING ids leave the device before any new ADD (frames are in
	 * order); reaped ones have left it
	 */
	if (ctx->table_full ||
	    ctx->nr_ids - ctx->nr_flushing - ctx->nr_reaping >=
	    min_t(u32, ctx->caps.capacity, VNIC_MAX_ID + 1)) {
		ctx->c.busy++;
		/* table pressure: look for expired filters sooner (sfc does) */
		if (!ctx->expire_extra) {
			ctx->expire_extra = VNIC_EXPIRY_PRESSURE;
			ctx->c.expiry_pressure++;
			vnic_work_kick_locked(ctx);
		}
		ret = -EBUSY;
		goto out;
	}

	f = kzalloc(sizeof(*f), GFP_ATOMIC);
	if (!f) {
		ctx->c.nomem++;
		ret = -ENOMEM;
		goto out;
	}
	f->key = key.flow;
	INIT_LIST_HEAD(&f->alist);
	err = rhashtable_insert_fast(&ctx->flows, &f->hnode, vnic_flt_params);
	if (err) {
		kfree(f);
		if (err == -ENOMEM) {
			ctx->c.nomem++;
		} else {
			ctx->c.busy++;
			err = -EBUSY;
		}
		ret = err;
		goto out;
	}
	err = xa_alloc_cyclic(&ctx->ids, &id, f, XA_LIMIT(0, VNIC_MAX_ID),
			      &ctx->id_next, GFP_ATOMIC);
	if (err < 0) {
		vnic_flt_unhash_locked(ctx, f);
		kfree(f);
		if (err == -EBUSY)
			ctx->c.busy++;
		else
			ctx->c.nomem++;
		ret = err;
		goto out;
	}
	f->id = id;
	f->rxq = rxq_index;
	f->slot_rxq = rxq_index;
	f->dev_rxq = rxq_index;
	f->flow_id = flow_id;
	f->last_seen = now;
	f->since = now;
	f->state = VF_LIVE;
	f->layout_epoch = ctx->layout_epoch;
	f->replay_epoch = ctx->replay_epoch;
	list_add_tail(&f->node, &ctx->live_list);
	vnic_flt_queue_add_locked(ctx, f);
	ctx->nr_ids++;
	ctx->nr_live++;
	ctx->c.adds++;
	vnic_work_kick_locked(ctx);
	ret = id;
out:
	vnic_unlock(ctx);
	return ret;
}

/* The device holds @f from now: the activation time ice ages UDP filters by. */
static void vnic_flt_activated_locked(struct vnic_ctx *ctx, struct vnic_filter *f)
{
	f->activated = jiffies;
	if (f->key.proto == IPPROTO_UDP)
		list_move_tail(&f->alist, &ctx->ice_list);
}

/**
 * vnic_flt_add_acked_locked - apply the device's answer to one ADD op
 * @ctx: the context
 * @id: the op's filter id
 * @rxq: the op's queue
 * @seq: the frame that carried the op
 * @st: the op status (VNIC_S_*), or -1 when the frame was NAKed
 */
void vnic_flt_add_acked_locked(struct vnic_ctx *ctx, u16 id, u16 rxq, u32 seq, int st)
{
	struct vnic_filter *f = xa_load(&ctx->ids, id);

	if (st == VNIC_S_OK)
		ctx->c.add_ok++;
	if (!f)
		return;
	if (st == VNIC_S_OK) {
		f->on_dev = true;
		f->dev_rxq = rxq;
		if (f->state == VF_LIVE && f->add_seq == seq) {
			f->add_inflight = false;
			vnic_flt_activated_locked(ctx, f);
		} else if (f->state == VF_LIVE && f->refused_pending && !f->pending) {
			/*
			 * The later ADD (a re-steer) was refused while this one
			 * was unanswered: the device holds this one. As for any
			 * refused re-steer, the filter stays on this queue.
			 */
			f->refused_pending = false;
			f->rxq = rxq;
			vnic_flt_activated_locked(ctx, f);
			ctx->c.replaced_rejected++;
		}
		return;
	}
	if (st == VNIC_S_TABLE_FULL) {
		ctx->table_full = true;
		ctx->table_full_since = jiffies;
	}
	if (f->state != VF_LIVE)
		return;		/* being deleted */
	if (f->add_seq != seq) {
		/*
		 * An earlier ADD refused too, after the last one was: if
		 * nothing else of the id is in flight, the device holds none.
		 */
		if (f->refused_pending && !f->on_dev && !f->pending &&
		    !vnic_mgmt_add_unacked(ctx, id, f->add_seq, seq)) {
			f->refused_pending = false;
			vnic_flt_reject_locked(ctx, f, st < 0 ? 0xFF : st);
		}
		return;		/* superseded */
	}
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
	if (vnic_mgmt_add_unacked(ctx, id, seq, seq)) {
		/*
		 * Refused, but an earlier ADD of the id is unanswered (its ACK
		 * lost, say): the device may hold that one, so the id is not
		 * free. Its ACK (the retransmission brings it) decides; until
		 * then the flow is held off like a refused re-steer.
		 */
		f->refused_pending = true;
		f->resteer_blocked = true;
		f->since = jiffies;
		return;
	}
	vnic_flt_reject_locked(ctx, f, st < 0 ? 0xFF : st);
}

/**
 * vnic_flt_del_acked_locked - apply the device's answer to one DEL op
 * @ctx: the context
 * @id: the op's filter id
 * @seq: the frame that carried the op
 * @st: the op status (VNIC_S_*), or -1 when the frame was NAKed
 *
 * Acknowledged, even refused, the id is free again.
 */
void vnic_flt_del_acked_locked(struct vnic_ctx *ctx, u16 id, u32 seq, int st)
{
	struct vnic_filter *f = xa_load(&ctx->ids, id);

	if (!f || f->state != VF_DELETING || f->del_seq != seq || f->pending) {
		ctx->c.rx_stale++;
		return;
	}
	if (st == VNIC_S_OK) {
		ctx->c.del[f->del_reason]++;
		ctx->table_full = false;
	} else if (st == VNIC_S_UNKNOWN_ID) {
		ctx->c.del_unknown++;
	}
	vnic_flt_free_locked(ctx, f);
}

/*
 * The reason to delete @f for on this pass, or 0 to keep it. Every
 * personality deletes what rps_may_expire_flow() lets go (the only rule of
 * mlx5, sfc and bnxt); see the expiry= parameter for the others.
 */
static u8 vnic_flt_expiry_reason(struct vnic_ctx *ctx, struct vnic_filter *f,
				 unsigned int expiry, unsigned long now)
{
	unsigned int ms = expiry >> 2;

	if (rps_may_expire_flow(ctx->dev, f->slot_rxq, f->flow_id, f->id))
		return VNIC_R_EXPIRED;
	switch (expiry & 3) {
	case VNIC_EXPIRY_ICE:
		if (f->key.proto == IPPROTO_UDP &&
		    time_after(now, f->activated + msecs_to_jiffies(VNIC_ICE_UDP_MS)))
			return VNIC_R_AGED;
		break;
	case VNIC_EXPIRY_IDLE:
		if (time_after(now, f->last_seen + msecs_to_jiffies(ms)))
			return VNIC_R_IDLE;
		break;
	}
	return 0;
}

/**
 * vnic_flt_expiry_quota - filters to examine on this expiry pass
 * @ctx: the context
 *
 * At least expire_quota, and enough that every live filter is examined
 * once per VNIC_EXPIRY_SWEEP_MS at the work item's period (65,535 filters at
 * 100 ms: 656 a pass), plus the extra quota a full table asked for.
 * expire_quota 0 turns expiry off (test helpers that install filters no
 * RFS slot names).
 *
 * Return: the number of filters, at most the live count.
 */
static unsigned int vnic_flt_expiry_quota(struct vnic_ctx *ctx)
{
	u64 per_sweep = (u64)ctx->nr_live * max(READ_ONCE(vnic_interval_ms), 1U);
	unsigned int quota = READ_ONCE(vnic_expire_quota);
	unsigned int n;

	if (!quota) {
		ctx->expire_extra = 0;
		return 0;
	}
	n = max_t(unsigned int, quota, DIV_ROUND_UP_ULL(per_sweep, VNIC_EXPIRY_SWEEP_MS));

	n += ctx->expire_extra;
	ctx->expire_extra = 0;
	return min(n, ctx->nr_live);
}

/*
 * expiry=ice: every UDP filter VNIC_ICE_UDP_MS after its activation, at the
 * first pass after that (ice_arfs.c), whatever the size of the table: the
 * oldest activations are at the head of ice_list. A filter that cannot go
 * now (an ADD or DEL of it in flight) leaves the list; its next activation
 * puts it back.
 */
static void vnic_flt_ice_age_locked(struct vnic_ctx *ctx, unsigned long now)
{
	unsigned long age = msecs_to_jiffies(VNIC_ICE_UDP_MS);
	struct vnic_filter *f, *tmp;
	unsigned int n = 0;

	list_for_each_entry_safe(f, tmp, &ctx->ice_list, alist) {
		if (n++ >= VNIC_ICE_BATCH || !time_after(now, f->activated + age))
			break;
		if (!f->on_dev || f->add_inflight || f->pending || f->refused_pending) {
			list_del_init(&f->alist);
			continue;
		}
		vnic_flt_del_locked(ctx, f, VNIC_R_AGED);
	}
}

/**
 * vnic_flt_expire_locked - one expiry pass
 * @ctx: the context
 * @now: jiffies
 *
 * Round-robin over the live filters whose ADD is acknowledged, as many as
 * vnic_flt_expiry_quota() says: each is deleted for the reason
 * vnic_flt_expiry_reason() gives under the expiry= personality. Under
 * expiry=ice, first every UDP filter whose time is up.
 */
void vnic_flt_expire_locked(struct vnic_ctx *ctx, unsigned long now)
{
	unsigned int n = vnic_flt_expiry_quota(ctx);
	unsigned int expiry = READ_ONCE(vnic_expiry);
	struct vnic_filter *f;
	u8 reason;

	if ((expiry & 3) == VNIC_EXPIRY_ICE && READ_ONCE(vnic_expire_quota))
		vnic_flt_ice_age_locked(ctx, now);

	while (n-- && !list_empty(&ctx->live_list)) {
		f = list_first_entry(&ctx->live_list, struct vnic_filter, node);
		list_move_tail(&f->node, &ctx->live_list);
		if (!f->on_dev || f->add_inflight || f->pending || f->refused_pending)
			continue;
		reason = vnic_flt_expiry_reason(ctx, f, expiry, now);
		if (reason)
			vnic_flt_del_locked(ctx, f, reason);
	}
}

/**
 * vnic_flt_reap_rejected_locked - forget refused flows whose hold-off ended
 * @ctx: the context
 * @now: jiffies
 */
void vnic_flt_reap_rejected_locked(struct vnic_ctx *ctx, unsigned long now)
{
	struct vnic_filter *f, *tmp;

	list_for_each_entry_safe(f, tmp, &ctx->rej_list, node) {
		if (vnic_flt_held_off(now, f->since))
			break;
		vnic_flt_rejected_free_locked(ctx, f);
	}
}

/**
 * vnic_flt_owns_slot_locked - whether a kernel RFS slot was written for our filter
 * @ctx: the context
 * @id: the filter id the slot holds
 * @rxq: the slot's rx queue
 * @slot: the slot's index (the flow_id of the steer call)
 *
 * Return: true when @id is a live filter whose last steer call was for
 * this queue and slot.
 */
bool vnic_flt_owns_slot_locked(struct vnic_ctx *ctx, u16 id, unsigned int rxq, u32 slot)
{
	struct vnic_filter *f = xa_load(&ctx->ids, id);

	return f && f->state == VF_LIVE && f->slot_rxq == rxq && f->flow_id == slot;
}
