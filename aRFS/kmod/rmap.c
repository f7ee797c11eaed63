// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_arfs rx_cpu_rmap: which rx queue is local to which CPU, and what the
 * kernel's RFS tables remember about it.
 *
 * The kernel's set_rps_cpu() reads dev->rx_cpu_rmap twice (a NULL test, then
 * the lookup) and then calls ndo_rx_flow_steer. dev->rx_cpu_rmap therefore
 * only ever goes from one valid rmap to another while NETIF_F_NTUPLE is set
 * (here, under RTNL, followed by synchronize_net() before the old one is
 * put); it becomes NULL only after NTUPLE was cleared and synchronize_net()
 * ran (netdev.c, teardown).
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpu.h>
#include <linux/cpumask.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>

#include "vnic_arfs.h"

/**
 * vnic_rmap_build - CPU -> rx queue map the way virtio_net spreads its IRQs
 * @ctx: the context (its address is the rmap's object for every queue)
 * @nq: number of rx queues
 * @ncpu_out: set to the number of online CPUs the map was built for
 *
 * Like virtnet_set_affinity(): stride = max(online / nq, 1), the first
 * (online % nq) queues get one more CPU (only when online >= nq),
 * consecutive online CPUs, wrapping. Built with cpu_rmap_add/update, not
 * the IRQ variants (virtio's IRQs are private to virtio_pci).
 *
 * Return: the map (one reference), or NULL.
 */
struct cpu_rmap *vnic_rmap_build(struct vnic_ctx *ctx, unsigned int nq,
				 unsigned int *ncpu_out)
{
	unsigned int i, ncpu, stride, stragglers, group;
	struct cpu_rmap *rmap;
	cpumask_var_t mask;
	int cpu, rc = 0;

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

/* Slots of one rx queue's RFS table one hold of ctx->lock resets at most. */
#define VNIC_RFS_CHUNK		1024

/*
 * The rps_dev_flow table of rx queue @i and its slot count, under RCU (NULL
 * when the queue has none).
 */
static struct rps_dev_flow *vnic_rmap_rfs_table(struct net_device *dev, unsigned int i,
						unsigned int *n)
{
	struct netdev_rx_queue *q = dev->_rx + i;
#ifdef VNIC_HAVE_RPS_TAG_PTR
	/* after 6.12: a tagged pointer (table | log2 size) */
	rps_tag_ptr tp = READ_ONCE(q->rps_flow_table);

	if (!tp)
		return NULL;
	*n = rps_tag_to_mask(tp) + 1;
	return rps_tag_to_table(tp);
#else
	struct rps_dev_flow_table *t = rcu_dereference(q->rps_flow_table);

	if (!t)
		return NULL;
#ifdef VNIC_HAVE_RFS_TABLE_LOG
	*n = 1U << t->log;	/* 6.15 to 6.x: slot = hash_32(hash, log) */
#else
	*n = t->mask + 1;	/* up to 6.14: slot = hash & mask */
#endif
	return t->flows;
#endif
}

/*
 * One slot of the reset, ctx->lock held. A slot that names a live filter of
 * ours for this very queue and slot is kept. Otherwise the first sweep
 * clears its filter id, the second its CPU: 6.12 leaves `filter`
 * uninitialised in a fresh table (most slots hold some value), and on 7.x
 * a flow asks again only when its arrival slot's CPU differs, and is then
 * skipped (for good: its CPU is recorded) if the slot of its target queue
 * still names an active-looking filter, which must therefore be gone first.
 */
static void vnic_rmap_reset_slot(struct vnic_ctx *ctx, struct rps_dev_flow *slot,
				 unsigned int rxq, unsigned int j, unsigned int sweep)
{
	u16 fid = READ_ONCE(slot->filter);

	if (fid != RPS_NO_FILTER && vnic_flt_owns_slot_locked(ctx, fid, rxq, j))
		return;
	if (sweep == 0) {
		if (fid != RPS_NO_FILTER)
			WRITE_ONCE(slot->filter, RPS_NO_FILTER);
	} else if (READ_ONCE(slot->cpu) != RPS_NO_CPU) {
		WRITE_ONCE(slot->cpu, RPS_NO_CPU);
	}
}

/**
 * vnic_rmap_reset_kernel_rfs - make the kernel ask for every flow again
 * @ctx: an active context
 *
 * Forget what RFS recorded in the rx queues' rps_dev_flow tables: the CPU
 * each flow went to and the filter ids. Left alone, a flow already on its
 * desired CPU is never handed to ndo_rx_flow_steer again: get_rps_cpu()
 * only calls set_rps_cpu() when the slot's CPU differs from the desired one,
 * and 7.3 also skips the call while the target queue's slot holds a filter
 * id that looks active. With the slots reset the next packet of every flow
 * asks us to steer it (as after `rps_flow_cnt` is rewritten).
 *
 * Called after attach (slots written while there was no aRFS, or by a
 * previous instance), after a queue/CPU layout change (slots naming CPUs
 * and filters of the old layout) and when NTUPLE comes back on. Steer calls
 * go on meanwhile: a slot that names one of our live filters, for that very
 * queue and slot, was written by such a call and is kept, or
 * rps_may_expire_flow() would call the fresh filter expired and the kernel,
 * which then finds the flow on its queue, would not ask again.
 *
 * The tables are read and written by the receive path without a lock
 * (READ_ONCE/WRITE_ONCE) and freed through RCU when rps_flow_cnt is
 * rewritten. The tables are swept twice, filter ids first, then CPUs (see
 * vnic_rmap_reset_slot(): a flow that asks again must not meet a stale
 * filter id on its target queue that a later chunk would have cleared).
 * Each queue's table is done in chunks of VNIC_RFS_CHUNK slots (fewer when
 * the hold has lasted VNIC_HOLD_BUDGET_NS), one RCU read section and one
 * hold of ctx->lock each (the filter a slot names is looked up under the
 * lock, so the answer holds while the slot is written), with a chance to
 * reschedule between chunks: a table that was replaced meanwhile is taken
 * up again at the same slot, in the new table.
 */
void vnic_rmap_reset_kernel_rfs(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	unsigned int i, j, start, end, n, sweep;

	for (sweep = 0; sweep < 2; sweep++) {
		for (i = 0; i < dev->num_rx_queues; i++) {
			for (j = 0;; j = end) {
				struct rps_dev_flow *flows;

				rcu_read_lock();
				flows = vnic_rmap_rfs_table(dev, i, &n);
				if (!flows || j >= n) {
					rcu_read_unlock();
					break;
				}
				end = min(n, j + VNIC_RFS_CHUNK);
				start = j;
				vnic_lock_bh(ctx);
				for (; j < end; j++) {
					/* a chunk also ends with the hold's time budget */
					if (j > start && !(j & 63) && vnic_hold_spent(ctx)) {
						end = j;
						break;
					}
					vnic_rmap_reset_slot(ctx, &flows[j], i, j, sweep);
				}
				ctx->c.rfs_reset_chunks++;
				vnic_unlock_bh(ctx);
				rcu_read_unlock();
				cond_resched();
			}
		}
	}
}

/*
 * Shrinking real_num_rx_queues releases the sysfs objects of the queues
 * that go away, and with them their RFS tables (rx_queue_release() in
 * net/core/net-sysfs.c); queues added back start with rps_flow_cnt 0. The
 * kernel never calls ndo_rx_flow_steer for a target queue without a table
 * (set_rps_cpu()), so flows whose CPU maps to such a queue stay on RSS until
 * the administrator writes its rps_flow_cnt again. Say so.
 */
static void vnic_rmap_warn_no_table(struct vnic_ctx *ctx, unsigned int nq)
{
	struct net_device *dev = ctx->dev;
	unsigned int i, with = 0, without = 0, first = 0;

	rcu_read_lock();
	for (i = 0; i < nq && i < dev->num_rx_queues; i++) {
#ifdef VNIC_HAVE_RPS_TAG_PTR
		bool has = READ_ONCE(dev->_rx[i].rps_flow_table);
#else
		bool has = rcu_dereference(dev->_rx[i].rps_flow_table);
#endif
		if (has)
			with++;
		else if (!without++)
			first = i;
	}
	rcu_read_unlock();
	if (with && without)
		vnic_warn(ctx, "%u rx queue(s) from rx-%u on have no rps_flow_cnt (dropped when ethtool -L removed them): no aRFS to them until it is set\n",
			  without, first);
}

/**
 * vnic_rmap_check - follow a change of the rx queue count or of the online CPUs
 * @ctx: an installed context
 *
 * Under RTNL (the work item holds it through rtnl_trylock()). When
 * `ethtool -L` or CPU hotplug changed the layout: publish a new rmap
 * (non-NULL to non-NULL, see the top of this file), wait for the receive
 * path to be done with the old one, delete every filter with one FLUSH (they
 * were placed for the old layout) and, once the device acknowledged it,
 * reset the kernel's RFS tables (vnic_rmap_reset_if_due()) so that each
 * flow is steered again, to the queue of its receiver's CPU under the new
 * layout.
 */
void vnic_rmap_check(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	unsigned int nq = READ_ONCE(dev->real_num_rx_queues);
	unsigned int ncpu = num_online_cpus();
	struct cpu_rmap *rmap, *old;

	ASSERT_RTNL();
	if (!ctx->installed || (nq == ctx->rmap_nq && ncpu == ctx->rmap_ncpu))
		return;
	rmap = vnic_rmap_build(ctx, nq, &ncpu);
	if (!rmap)
		return;		/* try again next pass */
	old = ctx->rmap;
	ctx->rmap = rmap;
	WRITE_ONCE(ctx->rmap_nq, nq);
	ctx->rmap_ncpu = ncpu;
	/* the map's contents before the pointer (set_rps_cpu() reads it unlocked) */
	smp_store_release(&dev->rx_cpu_rmap, rmap);
	/* no steer call is still using the old map (or chose a queue from it) */
	synchronize_net();
	cpu_rmap_put(old);

	vnic_lock_bh(ctx);
	ctx->c.rmap_rebuilds++;
	vnic_flt_layout_changed_locked(ctx);
	vnic_work_kick_locked(ctx);
	vnic_unlock_bh(ctx);
	vnic_rmap_warn_no_table(ctx, nq);
}

/**
 * vnic_rmap_reset_if_due - reset the kernel's RFS records after a layout change
 * @ctx: an active context (the work item)
 *
 * Once the layout change's FLUSH is acknowledged and its filters reaped (no
 * filter is FLUSHING or waiting to be freed, so their ids are free), or at
 * once when there was nothing to flush.
 */
void vnic_rmap_reset_if_due(struct vnic_ctx *ctx)
{
	bool due;

	vnic_lock_bh(ctx);
	/* the layout walk is over and its FLUSH acknowledged */
	due = ctx->rfs_reset_due && !ctx->layout_walk && !ctx->nr_flushing &&
	      !ctx->nr_reaping;
	if (due) {
		ctx->rfs_reset_due = false;
		ctx->c.rfs_resets++;
	}
	vnic_unlock_bh(ctx);
	if (due)
		vnic_rmap_reset_kernel_rfs(ctx);
}
