// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_flowgen: test helper for the "debugfs-65k" scenario of vnic_arfs.
 * At load it calls the netdev's ndo_rx_flow_steer for @count distinct UDP
 * flows, the way set_rps_cpu() does (BH disabled, RCU held), so that the
 * filter table of vnic_arfs fills to tens of thousands of entries without
 * tens of thousands of sockets. Flow i is 10.99.(i >> 8).(i & 255):9999 ->
 * 10.0.2.15:9999, steered to rx queue i % real_num_rx_queues, RFS slot i.
 * What the calls returned is left in the read-only parameters accepted,
 * busy and failed (and in the kernel log).
 *
 *   insmod vnic_flowgen.ko ifname=eth0 count=65535
 *   cat /sys/module/vnic_flowgen/parameters/accepted
 *
 * The kernel's own RFS slots never name these filters, so
 * rps_may_expire_flow() lets vnic_arfs expire them at its next passes:
 * the scenario sets vnic_arfs's expire_quota to 0 first.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/module.h>
#include <linux/netdevice.h>
#include <linux/skbuff.h>
#include <linux/udp.h>

static char *ifname = "eth0";
module_param(ifname, charp, 0444);
MODULE_PARM_DESC(ifname, "netdev whose ndo_rx_flow_steer is called (default eth0)");

static unsigned int count = 65535;
module_param(count, uint, 0444);
MODULE_PARM_DESC(count, "flows to steer (default 65535)");

static unsigned int accepted;
module_param(accepted, uint, 0444);
MODULE_PARM_DESC(accepted, "calls that returned a filter id");

static unsigned int busy;
module_param(busy, uint, 0444);
MODULE_PARM_DESC(busy, "calls that returned -EBUSY (table full)");

static unsigned int failed;
module_param(failed, uint, 0444);
MODULE_PARM_DESC(failed, "calls that returned another error");

/* An IPv4/UDP packet whose network header is at skb->data, as on receive. */
static struct sk_buff *flowgen_skb(struct net_device *dev)
{
	struct sk_buff *skb;
	struct udphdr *uh;
	struct iphdr *iph;

	skb = alloc_skb(sizeof(*iph) + sizeof(*uh), GFP_KERNEL);
	if (!skb)
		return NULL;
	skb_reset_network_header(skb);
	iph = skb_put_zero(skb, sizeof(*iph));
	iph->version = 4;
	iph->ihl = 5;
	iph->ttl = 64;
	iph->protocol = IPPROTO_UDP;
	iph->tot_len = htons(sizeof(*iph) + sizeof(*uh));
	iph->daddr = htonl(0x0a00020f);		/* 10.0.2.15 */
	skb_set_transport_header(skb, sizeof(*iph));
	uh = skb_put_zero(skb, sizeof(*uh));
	uh->source = htons(9999);
	uh->dest = htons(9999);
	uh->len = htons(sizeof(*uh));
	skb->protocol = htons(ETH_P_IP);
	skb->dev = dev;
	return skb;
}

static int flowgen_steer(struct net_device *dev, struct sk_buff *skb, unsigned int i)
{
	const struct net_device_ops *ops;
	u16 rxq = i % READ_ONCE(dev->real_num_rx_queues);
	int ret = -EOPNOTSUPP;

	ip_hdr(skb)->saddr = htonl(0x0a630000 | (i & 0xffff));	/* 10.99.x.y */
	local_bh_disable();
	rcu_read_lock();
	ops = READ_ONCE(dev->netdev_ops);
	if ((READ_ONCE(dev->features) & NETIF_F_NTUPLE) && ops->ndo_rx_flow_steer)
		ret = ops->ndo_rx_flow_steer(dev, skb, rxq, i);
	rcu_read_unlock();
	local_bh_enable();
	return ret;
}

static int __init flowgen_init(void)
{
	struct net_device *dev;
	struct sk_buff *skb;
	unsigned int i;
	int ret = 0;

	if (count > 0x10000) {
		pr_err("count %u: at most 65536 distinct flows\n", count);
		return -EINVAL;
	}
	dev = dev_get_by_name(&init_net, ifname);
	if (!dev) {
		pr_err("no netdev %s\n", ifname);
		return -ENODEV;
	}
	skb = flowgen_skb(dev);
	if (!skb) {
		ret = -ENOMEM;
		goto put;
	}
	for (i = 0; i < count; i++) {
		int r = flowgen_steer(dev, skb, i);

		if (r == -EOPNOTSUPP && !i) {
			netdev_err(dev, "no ndo_rx_flow_steer or NTUPLE off\n");
			ret = r;
			break;
		}
		if (r >= 0)
			accepted++;
		else if (r == -EBUSY)
			busy++;
		else
			failed++;
		if (!(i % 256))
			cond_resched();
	}
	kfree_skb(skb);
	netdev_info(dev, "%u steer calls: %u accepted, %u busy, %u failed\n",
		    i, accepted, busy, failed);
put:
	dev_put(dev);
	return ret;
}

static void __exit flowgen_exit(void)
{
}

module_init(flowgen_init);
module_exit(flowgen_exit);
MODULE_DESCRIPTION("vnic_arfs test helper: steer many synthetic flows");
MODULE_LICENSE("GPL");
