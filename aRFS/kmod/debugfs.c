// SPDX-License-Identifier: GPL-2.0
/*
 * vnic_arfs debugfs: /sys/kernel/debug/vnic_arfs/<ifname>/{counters,state,filters,resets,
 * lock_holds}.
 * Formats in README.md; names may be added, never changed.
 *
 * counters, state and resets copy a snapshot under ctx->lock (resets into
 * a buffer allocated before the lock is taken). filters is a seq_file
 * iterator over the id xarray: ctx->lock is held from ->start to ->stop,
 * that is for the records of one read buffer at most, and a record is found
 * again by its id when seq_file restarts (buffer overflow, next read()).
 * debugfs_remove_recursive() waits for readers inside a file operation, so
 * the context outlives every access.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/slab.h>

#include "vnic_arfs.h"

static struct dentry *vnic_dbg_root;

/**
 * vnic_hold_end - account one hold of ctx->lock, about to be let go
 * @ctx: the context, ctx->lock held since ctx->hold_t0
 * @where: the function that lets it go
 */
void vnic_hold_end(struct vnic_ctx *ctx, const char *where)
{
	u64 ns = local_clock() - ctx->hold_t0;
	struct vnic_holds *h = &ctx->holds;
	struct vnic_hold_site *site;
	unsigned int i;

	h->holds++;
	if (ns > h->max_ns) {
		h->max_ns = ns;
		h->max_at = where;
	}
	if (likely(ns <= NSEC_PER_MSEC))
		return;
	/* the rare long hold: counted, and by the function that ended it */
	h->over_1ms++;
	h->over_2ms += ns > 2 * NSEC_PER_MSEC;
	for (i = 0; i < VNIC_HOLD_SITES; i++) {
		site = &h->sites[i];
		if (site->at != where && site->at)
			continue;
		site->at = where;
		site->over_1ms++;
		site->over_2ms += ns > 2 * NSEC_PER_MSEC;
		site->max_ns = max(site->max_ns, ns);
		break;
	}
}

static int vnic_dbg_counters_show(struct seq_file *m, void *v)
{
	struct vnic_ctx *ctx = m->private;
	struct vnic_counters c;

	vnic_lock_bh(ctx);
	c = ctx->c;
	vnic_unlock_bh(ctx);

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
	P("deletes_aged", c.del[VNIC_R_AGED]);
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
	P("rx_bad_nonce", c.rx_bad_nonce);
	P("rx_foreign", c.rx_foreign);
	P("rx_rebind", c.rx_rebind);
	P("rx_not_host", c.rx_not_host);
	P("applied_unacked", c.applied_unacked);
	P("naks", c.naks);
	P("expiry_pressure", c.expiry_pressure);
	P("layout_flush_frames", c.layout_flush_frames);
	P("rfs_resets", c.rfs_resets);
	P("bulk_batches", c.bulk_batches);
	P("bulk_max", c.bulk_max);
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
	P("add_unacked", c.add_unacked);
	P("layout_flushes", c.layout_flushes);
	P("max_chain", c.max_chain);
	P("steer_walked", c.steer_walked);
	P("ack_rtts", c.ack_rtts);
	P("ack_rtt_min_us", c.ack_rtt_min_us);
	P("ack_rtt_max_us", c.ack_rtt_max_us);
	P("reaped", c.reaped);
	P("reap_batches", c.reap_batches);
	P("rfs_reset_chunks", c.rfs_reset_chunks);
	P("rule_set_ops", c.rule_set_ops);
	P("rule_del_ops", c.rule_del_ops);
	P("rss_ops", c.rss_ops);
	P("ethtool_ok", c.eth_ok);
	P("ethtool_refused", c.eth_refused);
	P("ethtool_timeouts", c.eth_timeouts);
	P("ethtool_replayed", c.eth_replayed);
#undef P
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vnic_dbg_counters);

static unsigned int vnic_dbg_rules_locked(const struct vnic_ctx *ctx)
{
	unsigned int i, n = 0;

	for (i = 0; i < ctx->nr_rules; i++)
		n += ctx->rules[i].on_dev;
	return n;
}

static int vnic_dbg_state_show(struct seq_file *m, void *v)
{
	struct vnic_ctx *ctx = m->private;

	vnic_lock_bh(ctx);
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
	seq_printf(m, "rmap_queues %u\n", READ_ONCE(ctx->rmap_nq));
	seq_printf(m, "rto_ms %u\n", jiffies_to_msecs(vnic_mgmt_rto(ctx)));
	seq_printf(m, "features %#x\n", ctx->caps.features);
	seq_printf(m, "max_rules %u\n", ctx->caps.max_rules);
	seq_printf(m, "ethtool_features %#x\n", ctx->eth_feat);
	seq_printf(m, "rule_locations %u\n", ctx->nr_rules);
	seq_printf(m, "rules_on_device %u\n", vnic_dbg_rules_locked(ctx));
	seq_printf(m, "rss_indir %s\n", ctx->rss.default_indir ? "default" : "driver");
	seq_printf(m, "rss_key %s\n", ctx->rss.default_key ? "default" : "driver");
	seq_printf(m, "ethtool_dirty %u\n", ctx->eth_dirty);
	vnic_unlock_bh(ctx);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vnic_dbg_state);

/*
 * lock_holds: how long ctx->lock was held, since attach or since the last
 * write to the file (any write resets the figures). Format:
 *   holds <n>
 *   over_1ms <n>
 *   over_2ms <n>
 *   max_ns <ns>
 *   max_at <function that ended the longest hold, or ->
 *   at <function> over_1ms <n> over_2ms <n> max_ns <ns>
 *	(one line per function that ended a hold over 1 ms)
 */
static int vnic_dbg_lock_holds_show(struct seq_file *m, void *v)
{
	struct vnic_ctx *ctx = m->private;
	struct vnic_holds *h;
	unsigned int i;

	h = kvmalloc(sizeof(*h), GFP_KERNEL);
	if (!h)
		return -ENOMEM;
	vnic_lock_bh(ctx);
	*h = ctx->holds;
	vnic_unlock_bh(ctx);
	seq_printf(m, "holds %llu\n", h->holds);
	seq_printf(m, "over_1ms %llu\n", h->over_1ms);
	seq_printf(m, "over_2ms %llu\n", h->over_2ms);
	seq_printf(m, "max_ns %llu\n", h->max_ns);
	seq_printf(m, "max_at %s\n", h->max_at ?: "-");
	for (i = 0; i < VNIC_HOLD_SITES && h->sites[i].at; i++)
		seq_printf(m, "at %s over_1ms %llu over_2ms %llu max_ns %llu\n", h->sites[i].at,
			   h->sites[i].over_1ms, h->sites[i].over_2ms, h->sites[i].max_ns);
	kvfree(h);
	return 0;
}

static int vnic_dbg_lock_holds_open(struct inode *inode, struct file *file)
{
	return single_open(file, vnic_dbg_lock_holds_show, inode->i_private);
}

static ssize_t vnic_dbg_lock_holds_write(struct file *file, const char __user *buf,
					 size_t len, loff_t *ppos)
{
	struct vnic_ctx *ctx = ((struct seq_file *)file->private_data)->private;

	vnic_lock_bh(ctx);
	memset(&ctx->holds, 0, sizeof(ctx->holds));
	vnic_unlock_bh(ctx);
	return len;
}

static const struct file_operations vnic_dbg_lock_holds_fops = {
	.owner = THIS_MODULE,
	.open = vnic_dbg_lock_holds_open,
	.read = seq_read,
	.write = vnic_dbg_lock_holds_write,
	.llseek = seq_lseek,
	.release = single_release,
};

/*
 * resets: the window reset log, oldest kept reset first. Format:
 *   resets <resets since attach>
 *   reset <nr> table_lost <0|1> una <seq> next_seq <seq> add_ops <n> logged <m>
 *   add <seq> <id> <rxq>            (m lines, one per logged unacked ADD op)
 */
static int vnic_dbg_resets_show(struct seq_file *m, void *v)
{
	struct vnic_ctx *ctx = m->private;
	struct vnic_reset_log *log;
	u64 first, n;
	u32 i;

	log = kvmalloc(sizeof(*log), GFP_KERNEL);
	if (!log)
		return -ENOMEM;
	vnic_lock_bh(ctx);
	memcpy(log, &ctx->rlog, sizeof(*log));
	vnic_unlock_bh(ctx);

	seq_printf(m, "resets %llu\n", log->resets);
	first = log->resets > VNIC_RESET_LOG ? log->resets - VNIC_RESET_LOG + 1 : 1;
	for (n = first; n <= log->resets; n++) {
		const struct vnic_reset_rec *r = &log->rec[(n - 1) % VNIC_RESET_LOG];

		seq_printf(m, "reset %llu table_lost %u una %u next_seq %u add_ops %u logged %u\n",
			   r->nr, r->table_lost, r->una, r->next_seq, r->add_ops, r->nops);
		for (i = 0; i < r->nops; i++)
			seq_printf(m, "add %u %u %u\n", r->ops[i].seq, r->ops[i].id,
				   r->ops[i].rxq);
	}
	kvfree(log);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vnic_dbg_resets);

/*
 * filters: position 0 is the header line; position p >= 1 is the first
 * filter whose id is >= p - 1. ->next moves to (id of the record shown) + 2,
 * so positions only grow and a restarted read finds its place by id.
 */
static void *vnic_dbg_filters_find(struct vnic_ctx *ctx, loff_t pos)
{
	unsigned long idx;

	if (pos > VNIC_MAX_ID + 1)
		return NULL;
	idx = pos - 1;
	return xa_find(&ctx->ids, &idx, VNIC_MAX_ID, XA_PRESENT);
}

static void *vnic_dbg_filters_start(struct seq_file *m, loff_t *pos)
	__acquires(&ctx->lock)
{
	struct vnic_ctx *ctx = m->private;

	vnic_lock_bh(ctx);
	if (!*pos)
		return SEQ_START_TOKEN;
	return vnic_dbg_filters_find(ctx, *pos);
}

static void *vnic_dbg_filters_next(struct seq_file *m, void *v, loff_t *pos)
{
	struct vnic_ctx *ctx = m->private;
	const struct vnic_filter *f = v;

	*pos = v == SEQ_START_TOKEN ? 1 : (loff_t)f->id + 2;
	return vnic_dbg_filters_find(ctx, *pos);
}

static void vnic_dbg_filters_stop(struct seq_file *m, void *v)
	__releases(&ctx->lock)
{
	struct vnic_ctx *ctx = m->private;

	vnic_unlock_bh(ctx);
}

static int vnic_dbg_filters_show(struct seq_file *m, void *v)
{
	const struct vnic_filter *f = v;
	const char *st;

	if (v == SEQ_START_TOKEN) {
		seq_puts(m, "# id rxq proto src dst flow_id state\n");
		return 0;
	}
	if (f->state == VF_DELETING)
		st = "deleting";
	else if (f->state == VF_FLUSHING)
		st = "flushing";
	else if (f->on_dev)
		st = f->add_inflight || f->pending ? "active-updating" : "active";
	else
		st = f->add_inflight ? "adding" : "queued";

	seq_printf(m, "%u %u %s ", f->id, f->rxq, f->key.proto == IPPROTO_TCP ? "tcp" : "udp");
	if (f->key.family == 4)
		seq_printf(m, "%pI4:%u %pI4:%u", f->key.saddr, ntohs(f->key.sport),
			   f->key.daddr, ntohs(f->key.dport));
	else
		seq_printf(m, "[%pI6c]:%u [%pI6c]:%u", f->key.saddr, ntohs(f->key.sport),
			   f->key.daddr, ntohs(f->key.dport));
	seq_printf(m, " %u %s\n", f->flow_id, st);
	return 0;
}

static const struct seq_operations vnic_dbg_filters_sops = {
	.start = vnic_dbg_filters_start,
	.next = vnic_dbg_filters_next,
	.stop = vnic_dbg_filters_stop,
	.show = vnic_dbg_filters_show,
};

static int vnic_dbg_filters_open(struct inode *inode, struct file *file)
{
	int err = seq_open(file, &vnic_dbg_filters_sops);

	if (!err)
		((struct seq_file *)file->private_data)->private = inode->i_private;
	return err;
}

static const struct file_operations vnic_dbg_filters_fops = {
	.owner = THIS_MODULE,
	.open = vnic_dbg_filters_open,
	.read = seq_read,
	.llseek = seq_lseek,
	.release = seq_release,
};

/**
 * vnic_dbg_init - create /sys/kernel/debug/vnic_arfs (errors are ignored)
 */
void vnic_dbg_init(void)
{
	vnic_dbg_root = debugfs_create_dir("vnic_arfs", NULL);
}

/**
 * vnic_dbg_exit - remove /sys/kernel/debug/vnic_arfs
 */
void vnic_dbg_exit(void)
{
	debugfs_remove_recursive(vnic_dbg_root);
	vnic_dbg_root = NULL;
}

/**
 * vnic_dbg_add - create the netdev's directory and files
 * @ctx: the context (under RTNL: attach, NETDEV_CHANGENAME)
 */
void vnic_dbg_add(struct vnic_ctx *ctx)
{
	if (IS_ERR_OR_NULL(vnic_dbg_root))
		return;
	ctx->dbg = debugfs_create_dir(ctx->dev->name, vnic_dbg_root);
	if (IS_ERR(ctx->dbg))
		return;
	debugfs_create_file("counters", 0444, ctx->dbg, ctx, &vnic_dbg_counters_fops);
	debugfs_create_file("state", 0444, ctx->dbg, ctx, &vnic_dbg_state_fops);
	debugfs_create_file("filters", 0444, ctx->dbg, ctx, &vnic_dbg_filters_fops);
	debugfs_create_file("resets", 0444, ctx->dbg, ctx, &vnic_dbg_resets_fops);
	debugfs_create_file("lock_holds", 0644, ctx->dbg, ctx, &vnic_dbg_lock_holds_fops);
}

/**
 * vnic_dbg_remove - remove the netdev's directory; waits for active readers
 * @ctx: the context (under RTNL)
 */
void vnic_dbg_remove(struct vnic_ctx *ctx)
{
	debugfs_remove_recursive(ctx->dbg);
	ctx->dbg = NULL;
}
