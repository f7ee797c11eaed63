// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_flowhash: test helper for the collision experiment of vnic_arfs.
 * It records, for every TCP/UDP flow received on @ifname, the flow hash
 * the stack uses for RPS/RFS (skb_get_hash(), the value whose low bits
 * pick the flow's rps_dev_flow slot), the rx queue that delivered it and
 * its packet count. The experiment reads the table to know which flows
 * share a slot, which cannot be computed outside the guest: the software
 * hash is keyed with a secret chosen at boot.
 *
 *   insmod vnic_flowhash.ko ifname=eth0 max_flows=8192
 *   cat /sys/kernel/debug/vnic_flowhash/flows
 *
 * One line per flow:
 *   udp 10.0.2.1 10000 10.0.2.15 5001 hash 0x1a2b3c4d rxq 2 packets 40
 * (IPv6 addresses in their compressed form, rxq -1 when the skb carries no
 * rx queue), after a first line "# flows N full M" (M: packets of new flows
 * not recorded because the table was full).
 *
 * Locking: the packet tap runs in softirq context, on any CPU; the table
 * (the hash list and the entries' fields) is protected by flowhash_lock,
 * taken with spin_lock() there and with spin_lock_bh() by the debugfs
 * reader. Entries are never freed before module exit, which runs after
 * dev_remove_pack() has waited for every tap in flight (synchronize_net()).
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/debugfs.h>
#include <linux/hashtable.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/jhash.h>
#include <linux/module.h>
#include <linux/netdevice.h>
#include <linux/seq_file.h>
#include <linux/skbuff.h>
#include <linux/slab.h>
#include <linux/udp.h>
#include <net/ip.h>
#include <net/ipv6.h>

static char *ifname = "eth0";
module_param(ifname, charp, 0444);
MODULE_PARM_DESC(ifname, "netdev whose received flows are recorded (default eth0)");

static unsigned int max_flows = 8192;
module_param(max_flows, uint, 0444);
MODULE_PARM_DESC(max_flows, "flows recorded at most (default 8192, 1..65536)");

struct flowhash_key {
	struct in6_addr saddr;	/* IPv4: mapped, ::ffff:a.b.c.d */
	struct in6_addr daddr;
	__be16 sport;
	__be16 dport;
	u8 proto;
	u8 family;		/* AF_INET or AF_INET6 */
};

struct flowhash_entry {
	struct hlist_node node;
	struct flowhash_key key;
	u32 hash;
	int rxq;
	u64 packets;
};

static DEFINE_SPINLOCK(flowhash_lock);
static DEFINE_HASHTABLE(flowhash_table, 12);
static struct flowhash_entry *flowhash_entries;
static unsigned int flowhash_used;
static u64 flowhash_full;
static struct net_device *flowhash_dev;
static struct dentry *flowhash_dir;

/* Fills @k from the IPv4/IPv6 and TCP/UDP headers; false for other packets. */
static bool flowhash_parse(const struct sk_buff *skb, struct flowhash_key *k)
{
	int off = skb_network_offset(skb);
	__be16 ports[2], *pp;
	u8 proto;

	memset(k, 0, sizeof(*k));
	if (skb->protocol == htons(ETH_P_IP)) {
		struct iphdr _iph;
		const struct iphdr *iph;

		iph = skb_header_pointer(skb, off, sizeof(_iph), &_iph);
		if (!iph || iph->ihl < 5 || ip_is_fragment(iph))
			return false;
		ipv6_addr_set_v4mapped(iph->saddr, &k->saddr);
		ipv6_addr_set_v4mapped(iph->daddr, &k->daddr);
		proto = iph->protocol;
		off += iph->ihl * 4;
		k->family = AF_INET;
	} else if (skb->protocol == htons(ETH_P_IPV6)) {
		struct ipv6hdr _ip6h;
		const struct ipv6hdr *ip6h;

		ip6h = skb_header_pointer(skb, off, sizeof(_ip6h), &_ip6h);
		if (!ip6h)
			return false;
		k->saddr = ip6h->saddr;
		k->daddr = ip6h->daddr;
		/* No extension headers: the workloads send none. */
		proto = ip6h->nexthdr;
		off += sizeof(*ip6h);
		k->family = AF_INET6;
	} else {
		return false;
	}
	if (proto != IPPROTO_UDP && proto != IPPROTO_TCP)
		return false;
	pp = skb_header_pointer(skb, off, sizeof(ports), ports);
	if (!pp)
		return false;
	k->sport = pp[0];
	k->dport = pp[1];
	k->proto = proto;
	return true;
}

static u32 flowhash_key_hash(const struct flowhash_key *k)
{
	return jhash(k, sizeof(*k), 0);
}

static int flowhash_rcv(struct sk_buff *skb, struct net_device *dev,
			struct packet_type *pt, struct net_device *orig_dev)
{
	struct flowhash_entry *e;
	struct flowhash_key k;
	u32 kh;

	lockdep_assert_in_softirq();
	if (!flowhash_parse(skb, &k))
		goto out;
	kh = flowhash_key_hash(&k);
	spin_lock(&flowhash_lock);
	hash_for_each_possible(flowhash_table, e, node, kh) {
		if (!memcmp(&e->key, &k, sizeof(k))) {
			e->packets++;
			e->hash = skb_get_hash(skb);
			e->rxq = skb_rx_queue_recorded(skb) ?
				 skb_get_rx_queue(skb) : -1;
			goto unlock;
		}
	}
	if (flowhash_used >= max_flows) {
		flowhash_full++;
		goto unlock;
	}
	e = &flowhash_entries[flowhash_used++];
	e->key = k;
	e->packets = 1;
	e->hash = skb_get_hash(skb);
	e->rxq = skb_rx_queue_recorded(skb) ? skb_get_rx_queue(skb) : -1;
	hash_add(flowhash_table, &e->node, kh);
unlock:
	spin_unlock(&flowhash_lock);
out:
	/* A tap gets its own reference to the skb. */
	consume_skb(skb);
	return NET_RX_SUCCESS;
}

static struct packet_type flowhash_pt __read_mostly = {
	.type = htons(ETH_P_ALL),
	.func = flowhash_rcv,
};

static void flowhash_show_addr(struct seq_file *m, const struct flowhash_key *k,
			       const struct in6_addr *a)
{
	if (k->family == AF_INET)
		seq_printf(m, "%pI4", &a->s6_addr32[3]);
	else
		seq_printf(m, "%pI6c", a);
}

static int flows_show(struct seq_file *m, void *v)
{
	unsigned int i;

	spin_lock_bh(&flowhash_lock);
	seq_printf(m, "# flows %u full %llu\n", flowhash_used, flowhash_full);
	for (i = 0; i < flowhash_used; i++) {
		const struct flowhash_entry *e = &flowhash_entries[i];

		seq_printf(m, "%s ", e->key.proto == IPPROTO_TCP ? "tcp" : "udp");
		flowhash_show_addr(m, &e->key, &e->key.saddr);
		seq_printf(m, " %u ", ntohs(e->key.sport));
		flowhash_show_addr(m, &e->key, &e->key.daddr);
		seq_printf(m, " %u hash 0x%08x rxq %d packets %llu\n",
			   ntohs(e->key.dport), e->hash, e->rxq, e->packets);
	}
	spin_unlock_bh(&flowhash_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(flows);

static int __init flowhash_init(void)
{
	if (!max_flows || max_flows > 65536) {
		pr_err("max_flows %u: must be 1..65536\n", max_flows);
		return -EINVAL;
	}
	flowhash_entries = kvcalloc(max_flows, sizeof(*flowhash_entries),
				    GFP_KERNEL);
	if (!flowhash_entries)
		return -ENOMEM;
	flowhash_dev = dev_get_by_name(&init_net, ifname);
	if (!flowhash_dev) {
		pr_err("no netdev %s\n", ifname);
		kvfree(flowhash_entries);
		return -ENODEV;
	}
	flowhash_dir = debugfs_create_dir(KBUILD_MODNAME, NULL);
	debugfs_create_file("flows", 0444, flowhash_dir, NULL, &flows_fops);
	flowhash_pt.dev = flowhash_dev;
	dev_add_pack(&flowhash_pt);
	pr_info("recording flows received on %s (at most %u)\n", ifname,
		max_flows);
	return 0;
}

static void __exit flowhash_exit(void)
{
	/* Waits for every tap in flight (synchronize_net()). */
	dev_remove_pack(&flowhash_pt);
	debugfs_remove_recursive(flowhash_dir);
	dev_put(flowhash_dev);
	kvfree(flowhash_entries);
}

module_init(flowhash_init);
module_exit(flowhash_exit);
MODULE_DESCRIPTION("vnic_arfs test helper: the RFS flow hash of received flows");
MODULE_LICENSE("GPL");
