/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vnic_arfs internal header: the per-netdev context, the filter, the
 * cross-file functions of each concern, and the kernel-version compat.
 *
 * Files and prefixes (one concern each):
 *   netdev.c   vnic_dev_   module, parameters, notifier, attach, install,
 *                          teardown, ndo_rx_flow_steer entry, the work item
 *   mgmt.c     vnic_mgmt_  management frames, session, window, receive path
 *   filter.c   vnic_flt_   filter table (rhashtable + id xarray), steer, expiry
 *   rmap.c     vnic_rmap_  rx_cpu_rmap, the kernel's RFS tables, layout changes
 *   ethtool.c  vnic_eth_   ethtool ntuple rules and RSS (get/set_rxnfc, rxfh)
 *   debugfs.c  vnic_dbg_   /sys/kernel/debug/vnic_arfs/<ifname>/
 *
 * Locking (README.md, "Locking", says the same at more length):
 *   RTNL       every change of the netdev hooks: netdev_ops, rx_cpu_rmap,
 *              NETIF_F_NTUPLE, the packet handler; the vnic_devs list (writers);
 *              the RTNL fields of struct vnic_ctx. The work item only ever
 *              takes it with rtnl_trylock(), so teardown may wait for the work
 *              item (disable_delayed_work_sync) while holding RTNL.
 *   ctx->lock  the session, the window, the filter table and the counters.
 *              A BH lock: spin_lock() only where BH is already disabled
 *              (ndo_rx_flow_steer, the packet handler; both assert it with
 *              lockdep_assert_in_softirq()), spin_lock_bh() everywhere else.
 *   RCU        vnic_devs readers (ndo_rx_flow_steer).
 */
#ifndef VNIC_ARFS_H
#define VNIC_ARFS_H

#include <linux/netdevice.h>
#include <linux/cpu_rmap.h>
#include <linux/rhashtable.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/ethtool.h>
#include <linux/wait.h>
#include <linux/sched/clock.h>

#include "vnic_proto.h"

#if !IS_ENABLED(CONFIG_RFS_ACCEL)
#error "vnic_arfs needs a kernel built with CONFIG_RFS_ACCEL=y"
#endif

/* ------------------------------------------------------------------------ */
/* Compat, 6.1 .. 7.3: VNIC_HAVE_* come from the feature tests in Kbuild    */
/* (each commented there with the kernel version that changed).              */

#ifdef VNIC_HAVE_LINUX_UNALIGNED_H	/* 6.12+ */
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

#ifdef VNIC_HAVE_NETDEV_RX_QUEUE_H	/* 6.5+; before, in linux/netdevice.h */
#include <net/netdev_rx_queue.h>
#endif

#ifdef VNIC_HAVE_NET_RPS_H		/* 6.10+; before, in linux/netdevice.h */
#include <net/rps.h>
#endif

/* 6.15+: the per-netdev instance lock that some ops need besides RTNL. */
#ifdef VNIC_HAVE_NETDEV_LOCK_OPS
#include <net/netdev_lock.h>
static inline void vnic_lock_ops(struct net_device *dev) { netdev_lock_ops(dev); }
static inline void vnic_unlock_ops(struct net_device *dev) { netdev_unlock_ops(dev); }
#else
static inline void vnic_lock_ops(struct net_device *dev) { }
static inline void vnic_unlock_ops(struct net_device *dev) { }
#endif

/* ------------------------------------------------------------------------ */
/* Module parameters (netdev.c); names as seen in /sys/module/vnic_arfs.     */

/*
 * Expiry personalities (the expiry= parameter). Every one deletes a filter
 * when rps_may_expire_flow() allows it; ice also deletes UDP filters
 * VNIC_ICE_UDP_MS after their activation (ice_arfs.c,
 * ICE_ARFS_TIME_DELTA_EXPIRATION); idle also deletes filters without a
 * steer call for its milliseconds (ours: a working filter gets no steer
 * calls, so it deletes filters of live flows).
 */
enum {
	VNIC_EXPIRY_RPS		= 0,
	VNIC_EXPIRY_ICE		= 1,
	VNIC_EXPIRY_IDLE	= 2,
};

#define VNIC_EXPIRY_IDLE_MAX_MS	(24 * 3600 * 1000U)
#define VNIC_ICE_UDP_MS		5000
/* Filters one pass ages at most under expiry=ice (the rest: the next pass). */
#define VNIC_ICE_BATCH		4096
/* Every live filter is examined at least once per this period. */
#define VNIC_EXPIRY_SWEEP_MS	10000
/* Extra filters examined after the table was found full (sfc: 100). */
#define VNIC_EXPIRY_PRESSURE	100
/*
 * Filters one lock hold of vnic_flt_bulk() handles (a replay, a layout
 * change's FLUSH, the NTUPLE-off delete) before it lets ctx->lock and the
 * CPU go: 65,535 filters take 256 holds of some tens of microseconds each.
 */
#define VNIC_BULK_BATCH		256
/*
 * ... and a hold of a bulk job (the walk, the reaper, the RFS reset) also
 * ends once it has lasted this long, whatever it has done: a debug kernel
 * (KASAN, lockdep) under emulation takes hundreds of microseconds per
 * filter, a native one well under one.
 */
#define VNIC_HOLD_BUDGET_NS	(200 * NSEC_PER_USEC)

extern char *vnic_ifnames;
extern unsigned int vnic_interval_ms;
extern unsigned int vnic_expire_quota;
extern unsigned int vnic_expiry;	/* VNIC_EXPIRY_* | milliseconds << 2 */
extern unsigned int vnic_retransmit_ms;
extern unsigned int vnic_hello_timeout_ms;
extern unsigned int vnic_keepalive_ms;
extern unsigned int vnic_reject_holdoff_ms;
extern unsigned int vnic_mgmt_txq;

extern struct workqueue_struct *vnic_wq;

/* Messages: netdev_*() does not use pr_fmt, so the module names itself. */
#define vnic_info(ctx, fmt, ...) netdev_info((ctx)->dev, "vnic_arfs: " fmt, ##__VA_ARGS__)
#define vnic_warn(ctx, fmt, ...) netdev_warn((ctx)->dev, "vnic_arfs: " fmt, ##__VA_ARGS__)

/* ------------------------------------------------------------------------ */
/* Filters                                                                   */

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
	VF_LIVE,		/* in the flow table and live_list, owns an id */
	VF_DELETING,		/* DEL queued or in flight; owns its id until ACKed */
	VF_REJECTED,		/* device refused it: no id, in the flow table for the hold-off */
	VF_FLUSHING,		/* a layout change FLUSH removes it; owns its id until ACKed */
};

struct vnic_filter {
	struct rhash_head hnode;	/* ctx->flows (LIVE, REJECTED) */
	struct list_head node;		/* live_list (LIVE) or rej_list (REJECTED) */
	struct list_head pend;		/* add_list or del_list, while @pending */
	struct list_head alist;		/* ice_list (LIVE UDP, on the device), by @activated */
	struct vnic_flow key;
	u32 flow_id;			/* from the last steer call */
	u32 add_seq;			/* frame of the last ADD sent */
	u32 del_seq;			/* frame of the DEL */
	unsigned long last_seen;	/* jiffies of the last steer call */
	unsigned long activated;	/* jiffies of the last ADD ACKed ok */
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
	/*
	 * the last ADD was refused while an earlier ADD of the id was in
	 * flight (the device may hold that one): its ACK decides
	 */
	bool refused_pending;
	/* the walks of vnic_flt_bulk() this filter still waits for, see there */
	u32 layout_epoch;
	u32 replay_epoch;
};

/* Flow table size: every id (0..0xFFFE) plus the refused flows in hold-off. */
#define VNIC_MAX_REJECTED	16384
#define VNIC_FLOWS_MAX_BUCKETS	65536

/* ------------------------------------------------------------------------ */
/* The per-netdev context                                                    */

struct vnic_slot {
	u32 seq;
	bool used;
	bool acked;
	u8 type;
	u16 nops;
	u8 retries;
	u16 len;			/* whole frame, Ethernet header included */
	unsigned long sent_at;		/* last transmission, jiffies */
	u64 first_ns;			/* first transmission, ktime_get_ns() */
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
	u32 features;			/* VNIC_FEAT_*; 0 from a 24-byte CAPS */
	u16 max_rules;			/* with VNIC_FEAT_RULES */
};

/* ------------------------------------------------------------------------ */
/* ethtool rules and RSS (ethtool.c)                                         */

/* Rule locations the module keeps at most (the device may offer more). */
#define VNIC_MAX_RULES		1024

/*
 * One request to the device on behalf of ethtool (a rule location, or the
 * RSS configuration): what ethtool asked for is @ver; the op in flight
 * carries @sent_ver; the ACK of it sets @acked_ver and @status, and wakes
 * the ethtool call waiting for its own version (vnic_eth_wait()).
 */
struct vnic_eth_req {
	u32 ver;
	u32 sent_ver;
	u32 acked_ver;
	u32 seq;			/* frame of the op in flight */
	int status;			/* of @acked_ver: VNIC_S_*, or -1 (NAK) */
	bool dirty;			/* an op is due (first send or again) */
	bool inflight;
};

struct vnic_rule {
	struct ethtool_rx_flow_spec fs;	/* as ethtool set it */
	u8 op[VNIC_RULE_OP];		/* its RULE_SET op */
	bool want;			/* a rule is set here (else: delete) */
	bool on_dev;			/* the device ACKed a RULE_SET here */
	u64 set_ok, refused;
	struct vnic_eth_req req;
};

struct vnic_rss {
	u8 key[VNIC_RSS_KEY_LEN];
	u16 indir[VNIC_RSS_INDIR_LEN];
	bool default_indir;		/* the device's round-robin table */
	bool default_key;
	u8 op[VNIC_RSS_OP];
	struct vnic_eth_req req;
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
	u64 rx_bad_nonce;		/* CAPS with another nonce than our HELLO's */
	u64 rx_foreign;			/* device frames from another address */
	u64 rx_rebind;			/* CAPS from another address than the session's */
	u64 rx_not_host;		/* management frames not addressed to us */
	u64 applied_unacked;		/* unacked frames older than an ACKed one, at a reset */
	u64 gen_changes, replays, replayed, rmap_rebuilds, ntuple_flushes, queue_flushes;
	u64 stalls;
	u64 add_unacked;		/* ADD ops of unACKed frames at a window reset */
	u64 layout_flushes;		/* filters deleted by a queue/CPU layout change */
	u64 layout_flush_frames;	/* FLUSH frames a layout change sent */
	u64 rfs_resets;			/* resets of the kernel's RFS records */
	u64 expiry_pressure;		/* extra expiry passes after a full table */
	u64 bulk_batches;		/* lock holds of vnic_flt_bulk() */
	u64 bulk_max;			/* most filters one of them handled */
	u64 max_chain;			/* longest flow-table chain walked by a lookup */
	u64 steer_walked;		/* flow-table entries compared by steer lookups */
	/* ADD/DEL requests ACKed ok: first transmission to ACK, in us */
	u64 ack_rtts, ack_rtt_min_us, ack_rtt_max_us;
	u64 reaped;			/* filters freed by the work item (FLUSH, table loss) */
	u64 reap_batches;		/* lock holds of vnic_flt_reap() */
	u64 rfs_reset_chunks;		/* lock holds of vnic_rmap_reset_kernel_rfs() */
	/* ethtool: rule and RSS ops sent, their outcomes */
	u64 rule_set_ops, rule_del_ops, rss_ops, eth_ok, eth_refused, eth_timeouts;
	u64 eth_replayed;		/* rule/RSS ops sent again for a new generation */
};

#define VNIC_HOLD_SITES		32

/**
 * struct vnic_hold_site - the holds over 1 ms of ctx->lock one function ended
 * @at: the function (__func__), NULL for an unused entry
 * @over_1ms: holds over 1 ms it ended
 * @over_2ms: of them, longer than 2 ms
 * @max_ns: the longest
 */
struct vnic_hold_site {
	const char *at;
	u64 over_1ms, over_2ms, max_ns;
};

/**
 * struct vnic_holds - how long ctx->lock was held (debugfs lock_holds)
 * @holds: holds timed since the last reset of these figures
 * @over_1ms: holds longer than 1 ms
 * @over_2ms: holds longer than 2 ms
 * @max_ns: the longest hold, in ns (local_clock() of the holding CPU)
 * @max_at: the function that ended it
 * @sites: holds over 1 ms by the function that ended them (the first
 *	VNIC_HOLD_SITES functions seen; the module has fewer): the common
 *	short hold costs two clock reads and no search
 */
struct vnic_holds {
	u64 holds, over_1ms, over_2ms, max_ns;
	const char *max_at;
	struct vnic_hold_site sites[VNIC_HOLD_SITES];
};

#define VNIC_RESET_LOG		4	/* window resets kept for debugfs */
/* Every ADD op a full window can hold: a reset is never logged in part. */
#define VNIC_RESET_LOG_OPS	(VNIC_WINDOW * VNIC_ADD_FIT)

/**
 * struct vnic_reset_op - an ADD op whose frame was never acknowledged
 * @seq: sequence number of the frame that carried it
 * @id: its filter id
 * @rxq: the rx queue it asked for
 */
struct vnic_reset_op {
	u32 seq;
	u16 id;
	u16 rxq;
};

/**
 * struct vnic_reset_rec - one window reset (a stall or a new generation)
 * @nr: its number since attach, from 1
 * @table_lost: the device came back with another generation
 * @una: the oldest unacked seq when the window was reset
 * @next_seq: the first seq not sent then
 * @add_ops: ADD ops of the frames never acknowledged (@ops holds the first
 *	VNIC_RESET_LOG_OPS of them)
 * @nops: entries of @ops in use
 * @ops: the unacked ADD ops, in seq order: the device may or may not have
 *	applied each of them, and only its trace can tell which it did
 */
struct vnic_reset_rec {
	u64 nr;
	bool table_lost;
	u32 una;
	u32 next_seq;
	u32 add_ops;
	u32 nops;
	struct vnic_reset_op ops[VNIC_RESET_LOG_OPS];
};

/**
 * struct vnic_reset_log - the last VNIC_RESET_LOG window resets that left
 *	frames unacknowledged (a keepalive's reset of an empty window is not one)
 * @resets: such resets since attach (the newest is number @resets)
 * @rec: reset number n is in rec[(n - 1) % VNIC_RESET_LOG]
 */
struct vnic_reset_log {
	u64 resets;
	struct vnic_reset_rec rec[VNIC_RESET_LOG];
};

enum vnic_state {
	VS_PROBING,		/* HELLO sent, waiting for CAPS */
	VS_CAPS,		/* CAPS received, hooks not installed yet */
	VS_ACTIVE,
	VS_FAILED,		/* device never answered: netdev left untouched */
};

struct vnic_ctx {
	/* Set at attach, constant until the context is freed. */
	struct net_device *dev;
	netdevice_tracker tracker;
	struct packet_type pt;
	struct delayed_work work;

	/* RTNL. */
	struct list_head list;		/* vnic_devs; RCU for readers */
	struct rcu_head rcu;
	struct dentry *dbg;
	bool pack_added;
	bool installed;
	bool unloading;			/* module exit owns it: unhooked, flush to come */
	bool flush_on_unload;
	struct net_device_ops *ops;	/* our copy, with ndo_rx_flow_steer */
	const struct net_device_ops *orig_ops;
	struct ethtool_ops *eops;	/* our copy (device with rules or RSS) */
	const struct ethtool_ops *orig_eops;
	struct cpu_rmap *rmap;
	unsigned int rmap_nq;		/* also read (READ_ONCE) by debugfs */
	unsigned int rmap_ncpu;
	bool ntuple_on;			/* NETIF_F_NTUPLE seen by the last pass */

	/* ctx->lock. */
	spinlock_t lock;
#ifndef VNIC_HAVE_DISABLE_WORK
	bool work_off;			/* before 6.10: no disable_delayed_work() */
#endif
	int state;
	bool have_gen;
	bool hello_out;
	bool resync;
	bool flush_pending;
	u8 flush_reason;
	bool table_full;
	bool unload_wait;
	bool unload_abort;
	u32 gen;
	u32 hello_seq;
	u32 una;			/* oldest unacked request */
	u32 acked_hi;			/* newest request ACKed in this window */
	bool have_acked_hi;
	u32 next_seq;			/* next request sequence number */
	u32 unload_seq;
	unsigned long hello_sent_at;
	unsigned long probe_start;
	unsigned long last_rx;
	unsigned long table_full_since;
	unsigned int expire_extra;	/* extra filters for the next expiry pass */
	u32 hello_nonce;		/* of the HELLO with seq hello_nonce_seq */
	u32 hello_nonce_seq;
	u8 dev_mac[ETH_ALEN];		/* where the session's CAPS came from */
	bool have_dev_mac;
	struct vnic_caps caps;
	struct completion unload_done;

	struct xarray ids;		/* id -> filter, every filter that owns an id */
	u32 id_next;
	unsigned int nr_ids;
	unsigned int nr_live;
	unsigned int nr_rejected;
	struct rhashtable flows;	/* flow -> filter (LIVE, REJECTED) */
	struct list_head live_list;
	struct list_head rej_list;
	struct list_head add_list;
	struct list_head del_list;
	/* live UDP filters on the device, oldest activation first (expiry=ice) */
	struct list_head ice_list;
	/*
	 * A layout change deletes every live filter with one FLUSH, not a DEL
	 * each: FLUSHING filters wait on flush_list for the FLUSH to be sent,
	 * then on flush_wait_list for the ACK of the FLUSH sent as
	 * flush_wait_seq (a later FLUSH covers the earlier ones); their ids
	 * are freed at that ACK, and only then are the kernel's RFS records
	 * reset (rfs_reset_due), so that flows ask again when ids are free.
	 */
	struct list_head flush_list;
	struct list_head flush_wait_list;
	u32 flush_wait_seq;
	unsigned int nr_flushing;
	bool rfs_reset_due;
	/*
	 * Work on every live filter is done by vnic_flt_bulk() in batches of
	 * VNIC_BULK_BATCH, ctx->lock dropped between them. A walk's filters
	 * are those whose epoch differs from the context's (filters created
	 * since carry the new one); *_left counts them exactly (see
	 * vnic_flt_unlink_live_locked()).
	 */
	u32 layout_epoch;
	u32 replay_epoch;
	unsigned int layout_left;	/* live filters placed for the old layout */
	unsigned int replay_left;	/* live filters the device lost */
	bool layout_walk;		/* a layout change's walk is not over */
	/*
	 * Filters gone from the device whose ids and memory the work item
	 * frees (vnic_flt_reap()), VNIC_BULK_BATCH per lock hold, so that the
	 * ACK of a FLUSH or a table loss, in softirq, only moves lists:
	 * reap_list (by ->node) holds FLUSHING filters (nr_reaping of them),
	 * reap_del (by ->pend, ->pending still set) the DELETING filters a
	 * table loss made moot. Until then they keep their ids.
	 */
	struct list_head reap_list;
	struct list_head reap_del;
	unsigned int nr_reaping;
	unsigned int nr_flush_wait;	/* FLUSHING filters on flush_wait_list */
	/*
	 * ethtool rules and RSS. The array and nr_rules are set at install
	 * (RTNL) and constant until release; the entries are ctx->lock's;
	 * ethtool calls (RTNL) are their only writers of what is wanted.
	 */
	struct vnic_rule *rules;
	unsigned int nr_rules;
	u32 eth_feat;			/* VNIC_FEAT_* our ethtool ops serve */
	unsigned int eth_dirty;		/* requests with req.dirty set */
	struct vnic_rss rss;
	wait_queue_head_t eth_wq;
	struct vnic_counters c;
	u64 hold_t0;			/* local_clock() when ctx->lock was taken */
	struct vnic_holds holds;
	struct vnic_reset_log rlog;	/* debugfs resets */

	u8 hello_buf[ETH_HLEN + VNIC_HDR_LEN + VNIC_HELLO_BODY];
	u8 flush_buf[ETH_HLEN + VNIC_HDR_LEN + VNIC_FLUSH_BODY];
	struct vnic_slot slots[VNIC_WINDOW];
};

extern const char * const vnic_state_names[];

/*
 * ctx->lock, timed: every hold is measured from the moment it is taken to
 * the moment it is let go (debugfs lock_holds), with local_clock() of the
 * holding CPU (the lock disables preemption, so the CPU does not change).
 * A bulk job must keep its holds short: these figures show that it does.
 */
void vnic_hold_end(struct vnic_ctx *ctx, const char *where);

/* Whether the current hold of ctx->lock has used up VNIC_HOLD_BUDGET_NS. */
static inline bool vnic_hold_spent(const struct vnic_ctx *ctx)
{
	return local_clock() - ctx->hold_t0 > VNIC_HOLD_BUDGET_NS;
}

#define vnic_lock_bh(ctx) do {				\
		struct vnic_ctx *__c = (ctx);		\
		spin_lock_bh(&__c->lock);		\
		__c->hold_t0 = local_clock();		\
	} while (0)
#define vnic_unlock_bh(ctx) do {			\
		struct vnic_ctx *__c = (ctx);		\
		vnic_hold_end(__c, __func__);		\
		spin_unlock_bh(&__c->lock);		\
	} while (0)
/*
 * Where BHs are already off (softirq: steer calls, the packet handler;
 * aRFS/kmod/check wants lockdep_assert_in_softirq() beside each).
 */
#define vnic_lock(ctx) do {				\
		struct vnic_ctx *__c = (ctx);		\
		spin_lock(&__c->lock);			\
		__c->hold_t0 = local_clock();		\
	} while (0)
#define vnic_unlock(ctx) do {				\
		struct vnic_ctx *__c = (ctx);		\
		vnic_hold_end(__c, __func__);		\
		spin_unlock(&__c->lock);		\
	} while (0)

/* ------------------------------------------------------------------------ */
/* The work item: queue, kick, disable (compat for kernels before 6.10).     */

#ifdef VNIC_HAVE_DISABLE_WORK
/* The caller may or may not hold ctx->lock. */
static inline void vnic_work_kick_locked(struct vnic_ctx *ctx)
{
	mod_delayed_work(vnic_wq, &ctx->work, 0);
}

static inline void vnic_work_kick(struct vnic_ctx *ctx)
{
	mod_delayed_work(vnic_wq, &ctx->work, 0);
}

static inline void vnic_work_queue(struct vnic_ctx *ctx, unsigned long delay)
{
	queue_delayed_work(vnic_wq, &ctx->work, delay);
}

static inline void vnic_work_disable(struct vnic_ctx *ctx)
{
	disable_delayed_work_sync(&ctx->work);
}
#else
/*
 * 6.1 .. 6.9: disable_delayed_work_sync() appeared in 6.10. A flag written
 * and tested under ctx->lock, together with the queueing itself, gives the
 * same guarantee: once vnic_work_disable() returns the work is neither
 * running nor pending, and nothing queues it again.
 */
static inline void vnic_work_kick_locked(struct vnic_ctx *ctx)
{
	lockdep_assert_held(&ctx->lock);
	if (!ctx->work_off)
		mod_delayed_work(vnic_wq, &ctx->work, 0);
}

static inline void vnic_work_kick(struct vnic_ctx *ctx)
{
	vnic_lock_bh(ctx);
	vnic_work_kick_locked(ctx);
	vnic_unlock_bh(ctx);
}

static inline void vnic_work_queue(struct vnic_ctx *ctx, unsigned long delay)
{
	vnic_lock_bh(ctx);
	if (!ctx->work_off)
		queue_delayed_work(vnic_wq, &ctx->work, delay);
	vnic_unlock_bh(ctx);
}

static inline void vnic_work_disable(struct vnic_ctx *ctx)
{
	vnic_lock_bh(ctx);
	ctx->work_off = true;
	vnic_unlock_bh(ctx);
	cancel_delayed_work_sync(&ctx->work);
}
#endif

/* ------------------------------------------------------------------------ */
/* Cross-file functions (kernel-doc at each definition).                     */

/* netdev.c */
bool vnic_dev_link_ok(const struct net_device *dev);
struct vnic_ctx *vnic_dev_ctx(const struct net_device *dev);

/* mgmt.c */
unsigned long vnic_mgmt_rto(const struct vnic_ctx *ctx);
int vnic_mgmt_rcv(struct sk_buff *skb, struct net_device *dev,
		  struct packet_type *pt, struct net_device *orig_dev);
bool vnic_mgmt_probe(struct vnic_ctx *ctx, unsigned long *delay);
unsigned long vnic_mgmt_pass(struct vnic_ctx *ctx);
void vnic_mgmt_unload_flush(struct vnic_ctx *ctx);
bool vnic_mgmt_add_unacked(struct vnic_ctx *ctx, u16 id, u32 before, u32 except);
unsigned int vnic_mgmt_op_len(u8 type);
unsigned int vnic_mgmt_max_ops(const struct vnic_ctx *ctx, unsigned int fit);
unsigned int vnic_mgmt_put_hdr(struct vnic_ctx *ctx, u8 *buf, u8 type, u32 seq,
			       u16 count, u16 body_len);

/* filter.c */
int vnic_flt_init(struct vnic_ctx *ctx);
void vnic_flt_destroy(struct vnic_ctx *ctx);
int vnic_flt_steer(struct vnic_ctx *ctx, const struct sk_buff *skb,
		   u16 rxq_index, u32 flow_id);
void vnic_flt_queue_add_locked(struct vnic_ctx *ctx, struct vnic_filter *f);
void vnic_flt_free_locked(struct vnic_ctx *ctx, struct vnic_filter *f);
void vnic_flt_layout_changed_locked(struct vnic_ctx *ctx);
void vnic_flt_bulk(struct vnic_ctx *ctx);
void vnic_flt_reap(struct vnic_ctx *ctx);
void vnic_flt_flush_sent_locked(struct vnic_ctx *ctx, u32 seq);
void vnic_flt_flush_acked_locked(struct vnic_ctx *ctx, u32 seq);
void vnic_flt_flush_lost_locked(struct vnic_ctx *ctx);
void vnic_flt_replay_locked(struct vnic_ctx *ctx);
void vnic_flt_add_acked_locked(struct vnic_ctx *ctx, u16 id, u16 rxq, u32 seq, int st);
void vnic_flt_del_acked_locked(struct vnic_ctx *ctx, u16 id, u32 seq, int st);
void vnic_flt_expire_locked(struct vnic_ctx *ctx, unsigned long now);
void vnic_flt_reap_rejected_locked(struct vnic_ctx *ctx, unsigned long now);
bool vnic_flt_owns_slot_locked(struct vnic_ctx *ctx, u16 id, unsigned int rxq, u32 slot);

/* rmap.c */
struct cpu_rmap *vnic_rmap_build(struct vnic_ctx *ctx, unsigned int nq,
				 unsigned int *ncpu_out);
void vnic_rmap_reset_kernel_rfs(struct vnic_ctx *ctx);
void vnic_rmap_check(struct vnic_ctx *ctx);
void vnic_rmap_reset_if_due(struct vnic_ctx *ctx);

/* ethtool.c */
int vnic_eth_install(struct vnic_ctx *ctx);
void vnic_eth_unhook(struct vnic_ctx *ctx);
void vnic_eth_release(struct vnic_ctx *ctx);
void vnic_eth_reset_device_locked(struct vnic_ctx *ctx);
bool vnic_eth_build_locked(struct vnic_ctx *ctx, struct vnic_slot *s, u32 seq);
void vnic_eth_op_acked_locked(struct vnic_ctx *ctx, const struct vnic_slot *s,
			      const u8 *op, int st);
void vnic_eth_unacked_locked(struct vnic_ctx *ctx, const struct vnic_slot *s, bool table_lost);
void vnic_eth_replay_locked(struct vnic_ctx *ctx);
void vnic_eth_layout(struct vnic_ctx *ctx);
bool vnic_eth_layout_due(struct vnic_ctx *ctx);
/* debugfs.c */
void vnic_dbg_init(void);
void vnic_dbg_exit(void);
void vnic_dbg_add(struct vnic_ctx *ctx);
void vnic_dbg_remove(struct vnic_ctx *ctx);

#endif /* VNIC_ARFS_H */
