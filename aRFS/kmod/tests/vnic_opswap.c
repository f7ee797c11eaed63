// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_opswap: test helper for the "stacked netdev_ops" scenario of
 * vnic_arfs. At load it replaces the netdev_ops of one netdev with a copy of
 * the current ones (so, after vnic_arfs attached, a copy whose
 * ndo_rx_flow_steer points into vnic_arfs), the way a module stacking on a
 * driver would. At unload, or when the netdev goes away, it puts back the
 * ops it found if its copy is still installed.
 *
 *   insmod vnic_opswap.ko ifname=eth0
 *   rmmod vnic_arfs      # must warn "netdev_ops were replaced after ours"
 *   rmmod vnic_opswap    # puts back vnic_arfs's neutered (leaked) copy
 *
 * It never calls through the ops itself.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/netdevice.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>

static char *ifname = "eth0";
module_param(ifname, charp, 0444);
MODULE_PARM_DESC(ifname, "netdev whose netdev_ops are replaced (default eth0)");

static struct net_device *opswap_dev;
static netdevice_tracker opswap_tracker;
static struct net_device_ops *opswap_ops;
static const struct net_device_ops *opswap_orig;

/* Under RTNL: put back the ops we found, if ours are still there. */
static void opswap_restore(void)
{
	struct net_device *dev = opswap_dev;
	bool ours;

	ASSERT_RTNL();
	if (!dev)
		return;
	ours = dev->netdev_ops == opswap_ops;
	if (ours)
		WRITE_ONCE(dev->netdev_ops, opswap_orig);
	else
		netdev_warn(dev, "vnic_opswap: netdev_ops replaced again, leaving them\n");
	synchronize_net();
	if (ours)
		kfree(opswap_ops);
	opswap_ops = NULL;
	netdev_put(dev, &opswap_tracker);
	opswap_dev = NULL;
	netdev_info(dev, "vnic_opswap: %s\n", ours ? "netdev_ops restored" : "released");
}

static int opswap_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	if (event == NETDEV_UNREGISTER && netdev_notifier_info_to_dev(ptr) == opswap_dev)
		opswap_restore();
	return NOTIFY_DONE;
}

static struct notifier_block opswap_nb = {
	.notifier_call = opswap_event,
};

static int __init opswap_init(void)
{
	struct net_device *dev;
	int err;

	rtnl_lock();
	dev = __dev_get_by_name(&init_net, ifname);
	if (!dev) {
		rtnl_unlock();
		pr_err("no netdev %s\n", ifname);
		return -ENODEV;
	}
	opswap_ops = kmemdup(dev->netdev_ops, sizeof(*opswap_ops), GFP_KERNEL);
	if (!opswap_ops) {
		rtnl_unlock();
		return -ENOMEM;
	}
	netdev_hold(dev, &opswap_tracker, GFP_KERNEL);
	opswap_dev = dev;
	opswap_orig = dev->netdev_ops;
	WRITE_ONCE(dev->netdev_ops, opswap_ops);
	netdev_info(dev, "vnic_opswap: netdev_ops replaced (ndo_rx_flow_steer %ps)\n",
		    opswap_ops->ndo_rx_flow_steer);
	rtnl_unlock();

	err = register_netdevice_notifier(&opswap_nb);
	if (err) {
		rtnl_lock();
		opswap_restore();
		rtnl_unlock();
	}
	return err;
}

static void __exit opswap_exit(void)
{
	unregister_netdevice_notifier(&opswap_nb);
	rtnl_lock();
	opswap_restore();
	rtnl_unlock();
}

module_init(opswap_init);
module_exit(opswap_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vnic_arfs test helper: replace a netdev's netdev_ops (stacked ops)");
MODULE_AUTHOR("vnic project");
