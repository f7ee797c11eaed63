// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_arfs: accelerated RFS for a stock virtio_net netdev backed by the vnic
 * device. This file: the module, its parameters, the netdevice notifier,
 * attach, install of the netdev hooks, teardown, and the work item.
 *
 * The module attaches to virtio_net netdevs whose device answers a HELLO
 * management frame with CAPS, and then gives them what the kernel's RFS code
 * needs to call a driver: a copy of the netdev_ops with ndo_rx_flow_steer,
 * an rx_cpu_rmap and NETIF_F_NTUPLE. Filters are sent to the device in-band
 * (mgmt.c). A device with the rule and RSS extensions also gets a copy of
 * the ethtool_ops with ntuple rules and RSS configuration (ethtool.c). See
 * README.md in this directory, and vnic_arfs.h for the locking.
 *
 * Teardown order (the hooks come off in the reverse order they went on):
 *   under RTNL: disable the work item; clear NTUPLE (wanted_features, then
 *   netdev_update_features(), then hw_features); synchronize_net(); set
 *   rx_cpu_rmap to NULL; restore netdev_ops (or, when someone replaced them
 *   after us, neuter our copy); the same for the ethtool_ops;
 *   synchronize_net(); free the rmap and the netdev_ops copy.
 *   At module exit RTNL is dropped here and the FLUSH(unload) is sent and
 *   waited for (mgmt.c); NETDEV_UNREGISTER skips it (the device is gone).
 *   under RTNL: dev_remove_pack() (before the netdev reference is dropped:
 *   netdev_run_todo() has a BUG_ON on a non-empty ptype_specific); unlink;
 *   debugfs; free the filters, the rules and the ethtool_ops copy;
 *   netdev_put(); kvfree_rcu() of the context.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/kmemleak.h>
#include <linux/random.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>

#include "vnic_arfs.h"

/* ------------------------------------------------------------------------ */
/* Module parameters                                                        */
/*
 * Every writable number is bounded (param_set_uint_minmax(): a write out of
 * range, at load or through sysfs, fails with -EINVAL and keeps the value),
 * and its description gives the range, so that modinfo shows it. Unbounded,
 * retransmit_ms=4294967295 would turn off retransmission and stall
 * detection, and an rmmod against a silent device would wait for ever.
 */

char *vnic_ifnames;
module_param_named(ifnames, vnic_ifnames, charp, 0444);
MODULE_PARM_DESC(ifnames,
		 "comma-separated interface names to attach to (default: every virtio_net netdev)");

unsigned int vnic_interval_ms = 100;
static int vnic_set_interval_ms(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, 10000);
}

static const struct kernel_param_ops vnic_interval_ms_ops = {
	.set = vnic_set_interval_ms,
	.get = param_get_uint,
};

module_param_cb(interval_ms, &vnic_interval_ms_ops, &vnic_interval_ms, 0644);
MODULE_PARM_DESC(interval_ms,
		 "period of the work item: send, retransmit, expiry pass (ms, 1..10000, default 100)");

unsigned int vnic_expire_quota = 64;
static int vnic_set_expire_quota(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, 65535);
}

static const struct kernel_param_ops vnic_expire_quota_ops = {
	.set = vnic_set_expire_quota,
	.get = param_get_uint,
};

module_param_cb(expire_quota, &vnic_expire_quota_ops, &vnic_expire_quota, 0644);
MODULE_PARM_DESC(expire_quota,
		 "filters examined per expiry pass at least, round-robin; raised so that every live filter is examined once per 10 s; 0 = no expiry (0..65535, default 64)");

/*
 * expiry=: which filters the expiry pass deletes. Written as one word so a
 * reader never sees a mode with another mode's timeout: the mode and its
 * milliseconds are packed into vnic_expiry (mode in the low 2 bits).
 */
unsigned int vnic_expiry = VNIC_EXPIRY_RPS;

static int vnic_expiry_set(const char *val, const struct kernel_param *kp)
{
	char buf[24], *s;
	unsigned int ms;

	if (strscpy(buf, val, sizeof(buf)) < 0)
		return -EINVAL;
	s = strim(buf);
	if (!strcmp(s, "rps")) {
		WRITE_ONCE(vnic_expiry, VNIC_EXPIRY_RPS);
		return 0;
	}
	if (!strcmp(s, "ice")) {
		WRITE_ONCE(vnic_expiry, VNIC_EXPIRY_ICE);
		return 0;
	}
	if (!strncmp(s, "idle:", 5) && !kstrtouint(s + 5, 10, &ms) &&
	    ms && ms <= VNIC_EXPIRY_IDLE_MAX_MS) {
		WRITE_ONCE(vnic_expiry, VNIC_EXPIRY_IDLE | ms << 2);
		return 0;
	}
	return -EINVAL;
}

static int vnic_expiry_get(char *buf, const struct kernel_param *kp)
{
	unsigned int e = READ_ONCE(vnic_expiry);

	switch (e & 3) {
	case VNIC_EXPIRY_ICE:
		return scnprintf(buf, PAGE_SIZE, "ice\n");
	case VNIC_EXPIRY_IDLE:
		return scnprintf(buf, PAGE_SIZE, "idle:%u\n", e >> 2);
	default:
		return scnprintf(buf, PAGE_SIZE, "rps\n");
	}
}

static const struct kernel_param_ops vnic_expiry_ops = {
	.set = vnic_expiry_set,
	.get = vnic_expiry_get,
};

module_param_cb(expiry, &vnic_expiry_ops, NULL, 0644);
MODULE_PARM_DESC(expiry,
		 "rps (default: delete only when rps_may_expire_flow() allows, as mlx5/sfc/bnxt), ice (also UDP filters 5 s after activation, as ice), idle:MS (also filters without a steer call for MS ms: vnic's own backstop, deletes filters of live flows)");

unsigned int vnic_retransmit_ms = 200;
static int vnic_set_retransmit_ms(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, 10000);
}

static const struct kernel_param_ops vnic_retransmit_ms_ops = {
	.set = vnic_set_retransmit_ms,
	.get = param_get_uint,
};

module_param_cb(retransmit_ms, &vnic_retransmit_ms_ops, &vnic_retransmit_ms, 0644);
MODULE_PARM_DESC(retransmit_ms,
		 "retransmit timeout on top of the device's programming latency (ms, 1..10000, default 200)");

unsigned int vnic_hello_timeout_ms = 3000;
static int vnic_set_hello_timeout_ms(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 100, 600000);
}

static const struct kernel_param_ops vnic_hello_timeout_ms_ops = {
	.set = vnic_set_hello_timeout_ms,
	.get = param_get_uint,
};

module_param_cb(hello_timeout_ms, &vnic_hello_timeout_ms_ops, &vnic_hello_timeout_ms, 0644);
MODULE_PARM_DESC(hello_timeout_ms,
		 "give up on a device that does not answer HELLO with CAPS (ms while up, 100..600000, default 3000)");

unsigned int vnic_keepalive_ms = 2000;
static int vnic_set_keepalive_ms(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, 600000);
}

static const struct kernel_param_ops vnic_keepalive_ms_ops = {
	.set = vnic_set_keepalive_ms,
	.get = param_get_uint,
};

module_param_cb(keepalive_ms, &vnic_keepalive_ms_ops, &vnic_keepalive_ms, 0644);
MODULE_PARM_DESC(keepalive_ms,
		 "send HELLO after this long without a device frame, to notice a device reset (ms, 0 = off, 0..600000, default 2000)");

unsigned int vnic_reject_holdoff_ms = 1000;
static int vnic_set_reject_holdoff_ms(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, 60000);
}

static const struct kernel_param_ops vnic_reject_holdoff_ms_ops = {
	.set = vnic_set_reject_holdoff_ms,
	.get = param_get_uint,
};

module_param_cb(reject_holdoff_ms, &vnic_reject_holdoff_ms_ops, &vnic_reject_holdoff_ms, 0644);
MODULE_PARM_DESC(reject_holdoff_ms,
		 "answer -EBUSY for a flow the device rejected, for this long (ms, 0..60000, default 1000)");

unsigned int vnic_mgmt_txq;
module_param_named(mgmt_txq, vnic_mgmt_txq, uint, 0444);
MODULE_PARM_DESC(mgmt_txq, "tx queue carrying the management frames (default 0)");

struct workqueue_struct *vnic_wq;

/* RTNL for writers, RCU for readers (ndo_rx_flow_steer). */
static LIST_HEAD(vnic_devs);
/* Set under RTNL at module exit: no new attach; UNREGISTER only aborts. */
static bool vnic_unloading;

const char * const vnic_state_names[] = {
	[VS_PROBING] = "probing", [VS_CAPS] = "installing",
	[VS_ACTIVE] = "active", [VS_FAILED] = "failed",
};

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */

/**
 * vnic_dev_link_ok - whether frames can be sent on @dev now
 * @dev: the netdev
 *
 * Return: true when @dev is running and has carrier.
 */
bool vnic_dev_link_ok(const struct net_device *dev)
{
	return netif_running(dev) && netif_carrier_ok(dev);
}

/*
 * A virtio_net netdev of our own. Not a failover master (net_failover,
 * VIRTIO_NET_F_STANDBY: it shares the virtio device as parent, and its
 * frames leave through the VF) nor its standby slave (the virtio_net netdev
 * under such a master): their traffic is not the device's to steer.
 */
static bool vnic_dev_is_virtio_net(const struct net_device *dev)
{
	const struct device *parent = dev->dev.parent;

	if (netif_is_failover(dev) || netif_is_failover_slave(dev))
		return false;
	return parent && parent->driver && parent->driver->name &&
	       !strcmp(parent->driver->name, "virtio_net");
}

static bool vnic_dev_name_wanted(const char *name)
{
	const char *p = vnic_ifnames;
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

/**
 * vnic_dev_ctx - the context of a netdev, for its ethtool ops
 * @dev: the netdev
 *
 * The list is walked under RCU; the context stays valid after, because the
 * caller holds RTNL (every ethtool call does) and contexts are released
 * under RTNL only.
 *
 * Return: the context, or NULL.
 */
struct vnic_ctx *vnic_dev_ctx(const struct net_device *dev)
{
	struct vnic_ctx *ctx, *found = NULL;

	rcu_read_lock();
	list_for_each_entry_rcu(ctx, &vnic_devs, list)
		if (ctx->dev == dev) {
			found = ctx;
			break;
		}
	rcu_read_unlock();
	return found;
}

/* Under RTNL. */
static struct vnic_ctx *vnic_dev_find(const struct net_device *dev)
{
	struct vnic_ctx *ctx;

	ASSERT_RTNL();
	list_for_each_entry(ctx, &vnic_devs, list)
		if (ctx->dev == dev)
			return ctx;
	return NULL;
}

/* ------------------------------------------------------------------------ */
/* ndo_rx_flow_steer                                                        */

/*
 * Reached through our copy of the netdev_ops only while rx_cpu_rmap and
 * NETIF_F_NTUPLE are set, from set_rps_cpu(): softirq (or busy polling with
 * BH disabled), RCU held.
 */
static int vnic_dev_rx_flow_steer(struct net_device *dev, const struct sk_buff *skb,
				  u16 rxq_index, u32 flow_id)
{
	struct vnic_ctx *ctx;

	list_for_each_entry_rcu(ctx, &vnic_devs, list)
		if (ctx->dev == dev)
			return vnic_flt_steer(ctx, skb, rxq_index, flow_id);
	return -ENODEV;
}

/* ------------------------------------------------------------------------ */
/* Install and teardown of the hooks                                        */

/* Under RTNL: ops, rmap, NTUPLE, in this order (the packet handler is in place). */
static int vnic_dev_install(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	unsigned int nq = dev->real_num_rx_queues, ncpu = 0;
	struct net_device_ops *ops;
	struct cpu_rmap *rmap;

	ASSERT_RTNL();
	/* net_failover may have enslaved it since attach (its notifier ran after ours) */
	if (!vnic_dev_is_virtio_net(dev))
		return -EOPNOTSUPP;
	if (dev->rx_cpu_rmap)
		return -EEXIST;
	if (dev->hw_features & NETIF_F_NTUPLE)
		return -EBUSY;	/* someone else's ntuple filters */
	rmap = vnic_rmap_build(ctx, nq, &ncpu);
	if (!rmap)
		return -ENOMEM;
	ops = kmemdup(dev->netdev_ops, sizeof(*ops), GFP_KERNEL);
	if (!ops) {
		cpu_rmap_put(rmap);
		return -ENOMEM;
	}
	ops->ndo_rx_flow_steer = vnic_dev_rx_flow_steer;

	ctx->orig_ops = dev->netdev_ops;
	ctx->ops = ops;
	WRITE_ONCE(dev->netdev_ops, ops);
	/*
	 * set_rps_cpu() tests rx_cpu_rmap and NTUPLE and then calls
	 * dev->netdev_ops->ndo_rx_flow_steer without a NULL check, all
	 * unlocked. Every receive path that could still hold the old ops
	 * (without the ndo) ends before the rmap is published, and any that
	 * starts later sees our ops (an RCU grace period orders the store
	 * before every later read-side section): no CPU, however weakly
	 * ordered, can pair our rmap with the old ops.
	 */
	synchronize_net();
	ctx->rmap = rmap;
	WRITE_ONCE(ctx->rmap_nq, nq);
	ctx->rmap_ncpu = ncpu;
	/* the map's contents before the pointer that leads to them */
	smp_store_release(&dev->rx_cpu_rmap, rmap);
	dev->hw_features |= NETIF_F_NTUPLE;
	dev->wanted_features |= NETIF_F_NTUPLE;
	vnic_lock_ops(dev);
	netdev_update_features(dev);
	vnic_unlock_ops(dev);
	ctx->ntuple_on = !!(dev->features & NETIF_F_NTUPLE);
	ctx->installed = true;
	/* last, and optional: aRFS does not need it */
	if (vnic_eth_install(ctx))
		vnic_warn(ctx, "out of memory: no ethtool rules or RSS\n");
	return 0;
}

/*
 * Under RTNL. After this, set_rps_cpu() no longer calls ndo_rx_flow_steer
 * (NTUPLE is off, then rx_cpu_rmap is NULL) and no CPU is inside it or holds
 * our ops copy. See the teardown order at the top of this file.
 */
static void vnic_dev_unhook(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	bool stacked;

	ASSERT_RTNL();
	/* the work item only takes RTNL with rtnl_trylock(): no deadlock */
	vnic_work_disable(ctx);
	if (!ctx->installed)
		return;

	/*
	 * NTUPLE off first: set_rps_cpu() tests rx_cpu_rmap and then reads it
	 * again, so rx_cpu_rmap may only become NULL once no CPU can be past
	 * the NTUPLE test. Features are recomputed from wanted_features and
	 * hw_features: wanted first, so that the bit leaves dev->features,
	 * and only then hw_features. A netdev being unregistered is closed and
	 * its receive path quiesced (the core ran synchronize_net() before
	 * NETDEV_UNREGISTER): there the features are only tidied directly.
	 */
	dev->wanted_features &= ~NETIF_F_NTUPLE;
	if (dev->reg_state == NETREG_REGISTERED) {
		vnic_lock_ops(dev);
		netdev_update_features(dev);
		vnic_unlock_ops(dev);
	}
	if (dev->features & NETIF_F_NTUPLE) {
		/* ndo_set_features failed, or unregistering: last resort */
		dev->features &= ~NETIF_F_NTUPLE;
		if (dev->reg_state == NETREG_REGISTERED)
			netdev_features_change(dev);
	}
	dev->hw_features &= ~NETIF_F_NTUPLE;
	synchronize_net();
	WRITE_ONCE(dev->rx_cpu_rmap, NULL);

	stacked = dev->netdev_ops != ctx->ops;
	if (!stacked) {
		WRITE_ONCE(dev->netdev_ops, ctx->orig_ops);
	} else {
		/*
		 * Someone replaced the netdev_ops after us, probably with a
		 * copy of ours (ndo_rx_flow_steer pointing into this module),
		 * and may restore ours later. Their copy cannot be changed,
		 * but the kernel only calls ndo_rx_flow_steer while
		 * rx_cpu_rmap is set, and it is NULL from now on (nothing else
		 * installs one on a virtio_net netdev). Our copy must outlive
		 * us, because they may put it back: it is leaked, with
		 * ndo_rx_flow_steer cleared so that it never points into
		 * freed module text.
		 */
		vnic_warn(ctx, "netdev_ops were replaced after ours: leaving them, neutering our copy\n");
		WRITE_ONCE(ctx->ops->ndo_rx_flow_steer, NULL);
		kmemleak_not_leak(ctx->ops);
	}
	vnic_eth_unhook(ctx);
	synchronize_net();
	cpu_rmap_put(ctx->rmap);
	ctx->rmap = NULL;
	if (!stacked)
		kfree(ctx->ops);
	ctx->ops = NULL;
	ctx->installed = false;
}

/* Under RTNL, after vnic_dev_unhook() (and the unload flush, if any). */
static void vnic_dev_release(struct vnic_ctx *ctx)
{
	ASSERT_RTNL();
	if (ctx->pack_added) {
		dev_remove_pack(&ctx->pt);
		ctx->pack_added = false;
	}
	list_del_rcu(&ctx->list);
	vnic_dbg_remove(ctx);
	/* no packet handler, no hooks, no work item: nothing else reaches it */
	vnic_flt_destroy(ctx);
	vnic_eth_release(ctx);
	netdev_put(ctx->dev, &ctx->tracker);
	kvfree_rcu(ctx, rcu);
}

/* ------------------------------------------------------------------------ */
/* The work item                                                            */

/* Probe or install failed: undo the packet handler only. Under RTNL. */
static void vnic_dev_give_up(struct vnic_ctx *ctx, const char *why)
{
	ASSERT_RTNL();
	if (ctx->pack_added) {
		dev_remove_pack(&ctx->pt);
		ctx->pack_added = false;
	}
	vnic_lock_bh(ctx);
	ctx->state = VS_FAILED;
	ctx->hello_out = false;
	vnic_unlock_bh(ctx);
	vnic_info(ctx, "not attaching: %s\n", why);
}

static void vnic_dev_work_probe(struct vnic_ctx *ctx)
{
	unsigned long delay;

	if (vnic_mgmt_probe(ctx, &delay)) {
		if (delay != MAX_JIFFY_OFFSET)
			vnic_work_queue(ctx, delay);
		return;
	}
	if (!rtnl_trylock()) {
		vnic_work_queue(ctx, 1);
		return;
	}
	vnic_dev_give_up(ctx, "the device did not answer HELLO with CAPS");
	rtnl_unlock();
}

static void vnic_dev_work_install(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	int err;

	if (!rtnl_trylock()) {
		vnic_work_queue(ctx, 1);
		return;
	}
	if (dev->reg_state != NETREG_REGISTERED) {
		rtnl_unlock();
		return;
	}
	err = vnic_dev_install(ctx);
	if (err) {
		vnic_dev_give_up(ctx, err == -EEXIST ? "the netdev already has an rx_cpu_rmap" :
				 err == -EBUSY ? "the netdev already has ntuple filters" :
				 err == -EOPNOTSUPP ? "the netdev is part of a failover pair" :
				 "out of memory");
		rtnl_unlock();
		return;
	}
	rtnl_unlock();

	vnic_lock_bh(ctx);
	ctx->state = VS_ACTIVE;
	/* a previous instance of the module may have left filters behind */
	ctx->flush_pending = true;
	ctx->flush_reason = VNIC_R_FLUSH;
	/* ... and rules, an RSS configuration */
	vnic_eth_reset_device_locked(ctx);
	ctx->last_rx = jiffies;
	vnic_info(ctx, "attached: generation %u, %u/%u queue pairs, capacity %u, buckets %u x %u, max_ops %u, latency %u us, %u rx queues\n",
		  ctx->gen, ctx->caps.enabled_queue_pairs, ctx->caps.max_queue_pairs,
		  ctx->caps.capacity, ctx->caps.buckets, ctx->caps.ways,
		  ctx->caps.max_ops, ctx->caps.latency_us, ctx->rmap_nq);
	vnic_work_kick_locked(ctx);
	vnic_unlock_bh(ctx);
	/* only now: a steer call before VS_ACTIVE fails and RFS would not retry */
	vnic_rmap_reset_kernel_rfs(ctx);
}

/*
 * Queue/CPU layout and NTUPLE transitions, under RTNL when it can be had
 * without waiting. Return: false to retry soon (RTNL was busy).
 */
static bool vnic_dev_work_layout(struct vnic_ctx *ctx)
{
	struct net_device *dev = ctx->dev;
	bool ntuple = !!(READ_ONCE(dev->features) & NETIF_F_NTUPLE);

	if (READ_ONCE(dev->real_num_rx_queues) == ctx->rmap_nq &&
	    num_online_cpus() == ctx->rmap_ncpu && ntuple == ctx->ntuple_on &&
	    !vnic_eth_layout_due(ctx))
		return true;
	if (!rtnl_trylock())
		return false;
	vnic_rmap_check(ctx);
	vnic_eth_layout(ctx);
	ntuple = !!(dev->features & NETIF_F_NTUPLE);
	if (ntuple && !ctx->ntuple_on) {
		/*
		 * Back on: the kernel's slots still name the flushed filters.
		 * They are reset once the FLUSH of "off" is acknowledged
		 * (vnic_rmap_reset_if_due()), when the ids are free: reset
		 * now, every flow would ask while they are held, meet -EBUSY,
		 * and never ask again.
		 */
		vnic_lock_bh(ctx);
		ctx->rfs_reset_due = true;
		vnic_unlock_bh(ctx);
	}
	ctx->ntuple_on = ntuple;
	rtnl_unlock();
	return true;
}

static void vnic_dev_work(struct work_struct *work)
{
	struct vnic_ctx *ctx = container_of(to_delayed_work(work), struct vnic_ctx, work);
	unsigned long delay;
	bool retry;
	int state;

	vnic_lock_bh(ctx);
	state = ctx->state;
	vnic_unlock_bh(ctx);

	switch (state) {
	case VS_PROBING:
		vnic_dev_work_probe(ctx);
		break;
	case VS_CAPS:
		vnic_dev_work_install(ctx);
		break;
	case VS_ACTIVE:
		/* the session goes on while RTNL is busy; the layout is retried soon */
		retry = !vnic_dev_work_layout(ctx);
		delay = vnic_mgmt_pass(ctx);
		/* after the pass: its bulk walk may have ended a layout change */
		vnic_rmap_reset_if_due(ctx);
		if (retry)
			delay = min(delay, msecs_to_jiffies(10));
		vnic_work_queue(ctx, delay);
		break;
	default:
		break;
	}
}

/* ------------------------------------------------------------------------ */
/* Netdevice notifier                                                       */

/* Under RTNL. */
static void vnic_dev_attach(struct net_device *dev)
{
	struct vnic_ctx *ctx;

	ASSERT_RTNL();
	if (vnic_unloading || !vnic_dev_is_virtio_net(dev) ||
	    !vnic_dev_name_wanted(dev->name) || vnic_dev_find(dev))
		return;
	ctx = kvzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx) {
		netdev_err(dev, "vnic_arfs: out of memory\n");
		return;
	}
	ctx->dev = dev;
	spin_lock_init(&ctx->lock);
	INIT_DELAYED_WORK(&ctx->work, vnic_dev_work);
	init_completion(&ctx->unload_done);
	init_waitqueue_head(&ctx->eth_wq);
	if (vnic_flt_init(ctx)) {
		netdev_err(dev, "vnic_arfs: cannot create the flow table\n");
		kvfree(ctx);
		return;
	}
	ctx->next_seq = get_random_u32();
	ctx->una = ctx->next_seq;
	ctx->state = VS_PROBING;
	netdev_hold(dev, &ctx->tracker, GFP_KERNEL);

	ctx->pt.type = htons(VNIC_ETH_P);
	ctx->pt.dev = dev;
	ctx->pt.func = vnic_mgmt_rcv;
	dev_add_pack(&ctx->pt);
	ctx->pack_added = true;

	list_add_tail_rcu(&ctx->list, &vnic_devs);
	vnic_dbg_add(ctx);
	vnic_work_queue(ctx, 0);
}

static int vnic_dev_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct net_device *dev = netdev_notifier_info_to_dev(ptr);
	struct vnic_ctx *ctx;

	if (event == NETDEV_REGISTER) {
		vnic_dev_attach(dev);
		return NOTIFY_DONE;
	}
	ctx = vnic_dev_find(dev);
	if (!ctx)
		return NOTIFY_DONE;
	if (ctx->unloading) {
		/* module exit owns the context: only cut its FLUSH wait short */
		if (event == NETDEV_UNREGISTER) {
			vnic_lock_bh(ctx);
			ctx->unload_abort = true;
			complete(&ctx->unload_done);
			vnic_unlock_bh(ctx);
		}
		return NOTIFY_DONE;
	}

	switch (event) {
	case NETDEV_UNREGISTER:
		vnic_dev_unhook(ctx);
		vnic_dev_release(ctx);
		break;
	case NETDEV_UP:
		vnic_lock_bh(ctx);
		if (ctx->state == VS_FAILED) {
			/* try again: the device may have come up since */
			ctx->state = VS_PROBING;
			ctx->probe_start = 0;
			ctx->hello_out = false;
			ctx->have_gen = false;
			vnic_unlock_bh(ctx);
			if (!ctx->pack_added) {
				dev_add_pack(&ctx->pt);
				ctx->pack_added = true;
			}
			vnic_lock_bh(ctx);
		} else if (ctx->state == VS_ACTIVE) {
			/* link was down: check the device's generation now */
			ctx->resync = true;
		}
		vnic_work_kick_locked(ctx);
		vnic_unlock_bh(ctx);
		break;
	case NETDEV_CHANGE:
	case NETDEV_FEAT_CHANGE:
		vnic_work_kick(ctx);
		break;
	case NETDEV_CHANGENAME:
		vnic_dbg_remove(ctx);
		vnic_dbg_add(ctx);
		break;
	default:
		break;
	}
	return NOTIFY_DONE;
}

static struct notifier_block vnic_dev_nb = {
	.notifier_call = vnic_dev_event,
};

/* ------------------------------------------------------------------------ */
/* Module                                                                   */

static int __init vnic_dev_init(void)
{
	int err;

	vnic_wq = alloc_workqueue("vnic_arfs", WQ_UNBOUND, 0);
	if (!vnic_wq)
		return -ENOMEM;
	vnic_dbg_init();
	/* replays NETDEV_REGISTER for the netdevs that exist already */
	err = register_netdevice_notifier(&vnic_dev_nb);
	if (err) {
		vnic_dbg_exit();
		destroy_workqueue(vnic_wq);
		return err;
	}
	return 0;
}

/*
 * Three phases, so that the wait for the device's FLUSH ACK (up to three
 * retransmit timeouts) holds neither RTNL nor pernet_ops_rwsem:
 * 1. RTNL: no new attach; unhook every context (the netdev is left as it
 *    was before us, but our packet handler stays to receive the ACK).
 * 2. no lock: FLUSH(unload) and wait, one netdev after the other. The list
 *    is frozen: attach is refused and UNREGISTER only aborts the wait.
 * 3. RTNL: release every context. Then the notifier is unregistered; its
 *    UNREGISTER replay finds no context left.
 */
static void __exit vnic_dev_exit(void)
{
	struct vnic_ctx *ctx, *tmp;

	rtnl_lock();
	vnic_unloading = true;
	list_for_each_entry(ctx, &vnic_devs, list) {
		ctx->flush_on_unload = ctx->installed && ctx->pack_added;
		vnic_dev_unhook(ctx);
		ctx->unloading = true;
	}
	rtnl_unlock();

	list_for_each_entry(ctx, &vnic_devs, list)
		if (ctx->flush_on_unload && vnic_dev_link_ok(ctx->dev))
			vnic_mgmt_unload_flush(ctx);

	rtnl_lock();
	list_for_each_entry_safe(ctx, tmp, &vnic_devs, list)
		vnic_dev_release(ctx);
	rtnl_unlock();

	unregister_netdevice_notifier(&vnic_dev_nb);
	destroy_workqueue(vnic_wq);
	rcu_barrier();		/* the kvfree_rcu() of every context */
	vnic_dbg_exit();
}

module_init(vnic_dev_init);
module_exit(vnic_dev_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("aRFS (ndo_rx_flow_steer) for virtio_net netdevs backed by the vnic device");
MODULE_AUTHOR("vnic project");
