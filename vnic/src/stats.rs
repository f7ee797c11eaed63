//! Counters, in two types by who writes them:
//!
//! - [`OwnedCounter`]: exactly one thread writes it (a queue's worker, on
//!   its own queue). Its increment is a plain load and store, no locked
//!   read-modify-write, and it is reachable only through the owner's
//!   handle ([`QueueOwner`], [`HitsOwner`]): one per queue / hit row,
//!   neither `Clone` nor `Sync`, taken by the worker when it is built.
//! - [`SharedCounter`]: any number of writers (`fetch_add`): the drops
//!   other workers count on a queue, the peer side, management replies.
//!
//! A counter more than one thread writes is a `SharedCounter`, which has
//! no single-writer increment: a multi-writer counter cannot be bumped
//! with a load and store that would lose the other writers' increments.
//! Readers (the control socket) read both with relaxed loads. Each queue's
//! block is padded to its own cache line.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Size of the id space of filter ids (0..=0xFFFE).
pub(crate) const ID_SPACE: usize = 0xFFFF;

use vnic_ctl_proto as wire;

/// A counter that one thread only writes (see the module doc). Relaxed:
/// counters are statistics, not synchronisation.
#[derive(Default)]
pub(crate) struct OwnedCounter(AtomicU64);

impl OwnedCounter {
    /// Adds `n`: a plain load and store. Private: only the owner's handle
    /// ([`QueueOwner`], [`HitsOwner`]) calls it.
    #[inline]
    fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A counter several threads may write: every increment is a `fetch_add`.
#[derive(Default)]
pub(crate) struct SharedCounter(AtomicU64);

impl SharedCounter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Adds `n` to a counter any thread may write.
#[inline]
pub(crate) fn add(c: &SharedCounter, n: u64) {
    c.add(n);
}

#[inline]
fn get(c: &SharedCounter) -> u64 {
    c.get()
}

/// Counters of one queue pair. Owned: written by the queue's worker only,
/// through its [`QueueOwner`]. Shared: other workers write them too
/// (frames they steer to this queue and that it cannot take), or they
/// are bumped where the owner's handle is not at hand (off the per-frame
/// path).
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct QueueStats {
    pub rx_packets: OwnedCounter,
    pub rx_bytes: OwnedCounter,
    /// Written by this queue's worker and by every worker that steers a
    /// frame here while the queue is out of buffers.
    pub rx_drops_no_buffers: SharedCounter,
    /// Written by the workers that hand frames to this queue's inbox.
    pub rx_drops_ring_full: SharedCounter,
    pub rx_drops_too_big: OwnedCounter,
    /// Written by this queue's worker and by the workers steering here.
    pub rx_drops_disabled: SharedCounter,
    pub rx_filter: OwnedCounter,
    pub rx_rss: OwnedCounter,
    /// `--rx-stores`: frames the rx stage wrote with plain stores (the
    /// rest of rx_packets streamed), and the store mode's changes.
    pub rx_plain: OwnedCounter,
    pub rx_store_switches: OwnedCounter,
    /// `--poll-us`: spins for rx buffers after a frame found none, those
    /// that found some, and the wall time they took (ns).
    pub rx_spins: OwnedCounter,
    pub rx_spins_found: OwnedCounter,
    pub rx_spin_ns: OwnedCounter,
    pub tx_packets: OwnedCounter,
    pub tx_bytes: OwnedCounter,
    /// `--poll-us`: spins for more tx chains, those that found one, and
    /// the wall time they took (ns; yielded time included).
    pub tx_spins: OwnedCounter,
    pub tx_spins_found: OwnedCounter,
    pub tx_spin_ns: OwnedCounter,
    /// Runts (the worker) and tap write errors (its tap peer).
    pub tx_drops: SharedCounter,
    pub rx_bad_chains: OwnedCounter,
    /// Unusable tx chains by reason, indexed like [`BadTx::ALL`].
    pub tx_bad: [OwnedCounter; 7],
    /// Times the rx / tx ring was stopped, by [`RingStop`] reason
    /// (index `code - 1`), and the reason it is stopped for now (its
    /// code; 0: running).
    pub rx_stops: [SharedCounter; 2],
    pub tx_stops: [SharedCounter; 2],
    pub rx_stopped: AtomicU64,
    pub tx_stopped: AtomicU64,
    /// Live [`QueueOwner`]s of this queue (1 while its worker exists).
    owners: AtomicU32,
}

impl QueueStats {
    pub(crate) fn rx_drops(&self) -> u64 {
        get(&self.rx_drops_no_buffers)
            + get(&self.rx_drops_ring_full)
            + self.rx_drops_too_big.get()
            + get(&self.rx_drops_disabled)
    }

    /// The queue as `ctl stats` shows it (`queues[index]`).
    pub(crate) fn to_wire(&self, index: usize) -> wire::QueueStats {
        let tx_bad = |r: BadTx| self.tx_bad(r);
        // Times stopped by reason (index `code - 1`), and why it is stopped now.
        let stops = |s: &[SharedCounter; 2], r: RingStop| get(&s[r.code() as usize - 1]);
        let now = |s: &AtomicU64| RingStop::name_of(s.load(Ordering::Relaxed)).map(str::to_string);
        wire::QueueStats {
            index,
            rx_packets: self.rx_packets.get(),
            rx_bytes: self.rx_bytes.get(),
            rx_drops: self.rx_drops(),
            rx_drops_no_buffers: get(&self.rx_drops_no_buffers),
            rx_drops_ring_full: get(&self.rx_drops_ring_full),
            rx_drops_too_big: self.rx_drops_too_big.get(),
            rx_drops_disabled: get(&self.rx_drops_disabled),
            rx_filter: self.rx_filter.get(),
            rx_rss: self.rx_rss.get(),
            rx_plain: self.rx_plain.get(),
            rx_store_switches: self.rx_store_switches.get(),
            rx_spins: self.rx_spins.get(),
            rx_spins_found: self.rx_spins_found.get(),
            rx_spin_ns: self.rx_spin_ns.get(),
            tx_packets: self.tx_packets.get(),
            tx_bytes: self.tx_bytes.get(),
            tx_spins: self.tx_spins.get(),
            tx_spins_found: self.tx_spins_found.get(),
            tx_spin_ns: self.tx_spin_ns.get(),
            tx_drops: get(&self.tx_drops),
            rx_bad_chains: self.rx_bad_chains.get(),
            tx_bad_chains: self.tx_bad_chains(),
            tx_bad_loop: tx_bad(BadTx::Loop),
            tx_bad_bad_index: tx_bad(BadTx::BadIndex),
            tx_bad_out_of_range: tx_bad(BadTx::OutOfRange),
            tx_bad_too_long: tx_bad(BadTx::TooLong),
            tx_bad_writable: tx_bad(BadTx::Writable),
            tx_bad_short_header: tx_bad(BadTx::ShortHeader),
            tx_bad_indirect: tx_bad(BadTx::Indirect),
            rx_bad_avail_jump: stops(&self.rx_stops, RingStop::AvailJump),
            rx_bad_avail_unreadable: stops(&self.rx_stops, RingStop::AvailUnreadable),
            rx_stopped: now(&self.rx_stopped),
            tx_bad_avail_jump: stops(&self.tx_stops, RingStop::AvailJump),
            tx_bad_avail_unreadable: stops(&self.tx_stops, RingStop::AvailUnreadable),
            tx_stopped: now(&self.tx_stopped),
        }
    }

    /// Unusable tx chains of one reason.
    pub(crate) fn tx_bad(&self, r: BadTx) -> u64 {
        BadTx::ALL
            .iter()
            .position(|&x| x == r)
            .map_or(0, |i| self.tx_bad[i].get())
    }

    /// Unusable tx chains, all reasons.
    pub(crate) fn tx_bad_chains(&self) -> u64 {
        self.tx_bad.iter().map(OwnedCounter::get).sum()
    }
}

/// The one writer of a queue's [`OwnedCounter`]s: taken by the queue's
/// worker ([`Stats::claim`]), neither `Clone` nor `Sync` (it may move to
/// the worker's thread, not be used from two).
pub(crate) struct QueueOwner {
    stats: Arc<Stats>,
    q: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl QueueOwner {
    /// The queue's counters, to increment the owned ones.
    #[inline]
    pub(crate) fn writer(&self) -> QueueWriter<'_> {
        QueueWriter {
            q: &self.stats.queues[self.q],
            _owner: PhantomData,
        }
    }
}

impl Drop for QueueOwner {
    fn drop(&mut self) {
        self.stats.queues[self.q]
            .owners
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// A borrow of a [`QueueOwner`] (no more `Send` than `&QueueOwner`):
/// increments the owned counters with a plain load and store, and gives
/// the queue's counters for the shared ones.
pub(crate) struct QueueWriter<'a> {
    q: &'a QueueStats,
    _owner: PhantomData<&'a QueueOwner>,
}

impl<'a> QueueWriter<'a> {
    /// Adds `n` to the owned counter `c` of this queue.
    #[inline]
    pub(crate) fn add(&self, c: impl FnOnce(&QueueStats) -> &OwnedCounter, n: u64) {
        c(self.q).add(n);
    }

    /// The queue's counters (for reading, and for its shared counters).
    #[inline]
    pub(crate) fn queue(&self) -> &'a QueueStats {
        self.q
    }

    /// Counts one unusable tx chain.
    #[inline]
    pub(crate) fn count_bad_tx(&self, r: BadTx) {
        let i = BadTx::ALL.iter().position(|&x| x == r).unwrap_or(0);
        self.q.tx_bad[i].add(1);
    }
}

/// Counters of the peer side (written by workers, hence atomics).
#[derive(Default)]
pub(crate) struct PeerStats {
    /// Frames from the peer carrying the management EtherType (dropped).
    pub spoofed_mgmt_dropped: SharedCounter,
    /// Frames from the peer that could not be parsed (delivered by RSS anyway).
    pub unparsable: SharedCounter,
    /// Frames that hit a filter and were delivered to another queue on
    /// purpose (the `misroute` fault).
    pub misrouted: SharedCounter,
    /// Frames that hit a filter and were dropped yet counted delivered
    /// (the `drop_rate` fault).
    pub fault_dropped: SharedCounter,
    /// Frames that hit a filter and had a payload byte flipped (the
    /// `corrupt_rate` fault).
    pub fault_corrupted: SharedCounter,
    /// Frames that hit a filter and had a payload byte flipped under a
    /// stale UDP checksum (the `bad_csum_rate` fault).
    pub fault_bad_csum: SharedCounter,
    /// Frames that hit a filter and lost the end of their payload, lengths
    /// and checksums kept consistent (the `truncate_rate` fault).
    pub fault_truncated: SharedCounter,
    /// Frames that hit a filter, were held back and delivered after their
    /// flow's next frame (the `reorder_rate` fault; counted when released).
    pub fault_reordered: SharedCounter,
    /// Filter hits the `delay_effect_ms` fault sent where the flow went
    /// before its filter was added or re-steered (counted as the filter's).
    pub fault_delayed: SharedCounter,
    /// Frames an `ethtool -N` rule with action drop took (not delivered).
    pub rule_dropped: SharedCounter,
    /// Generator: UDP frames generated.
    pub gen_sent: SharedCounter,
    /// Generator: frames from the guest sunk (not answered).
    pub sink_packets: SharedCounter,
    pub sink_bytes: SharedCounter,
    /// Generator: ARP requests answered.
    pub arp_replies: SharedCounter,
    /// Generator: ICMP and ICMPv6 echo requests answered.
    pub icmp_echo_replies: SharedCounter,
    /// Generator: IPv6 neighbour solicitations answered.
    pub nd_replies: SharedCounter,
    /// Generator: round trips of stamped frames the guest echoed back.
    pub rtt: RttHist,
    /// Tap: frames written to / read from the tap device, and write errors.
    pub tap_tx: SharedCounter,
    pub tap_rx: SharedCounter,
    pub tap_tx_errors: SharedCounter,
}

impl PeerStats {
    /// The peer side as `ctl stats` shows it (`peer`).
    pub(crate) fn to_wire(&self, kind: String) -> wire::PeerStats {
        wire::PeerStats {
            kind,
            spoofed_mgmt_dropped: get(&self.spoofed_mgmt_dropped),
            unparsable: get(&self.unparsable),
            misrouted: get(&self.misrouted),
            fault_dropped: get(&self.fault_dropped),
            fault_corrupted: get(&self.fault_corrupted),
            fault_bad_csum: get(&self.fault_bad_csum),
            fault_truncated: get(&self.fault_truncated),
            fault_reordered: get(&self.fault_reordered),
            fault_delayed: get(&self.fault_delayed),
            rule_dropped: get(&self.rule_dropped),
            gen_sent: get(&self.gen_sent),
            sink_packets: get(&self.sink_packets),
            sink_bytes: get(&self.sink_bytes),
            arp_replies: get(&self.arp_replies),
            icmp_echo_replies: get(&self.icmp_echo_replies),
            nd_replies: get(&self.nd_replies),
            rtt: self.rtt.to_wire(),
            tap_tx: get(&self.tap_tx),
            tap_rx: get(&self.tap_rx),
            tap_tx_errors: get(&self.tap_tx_errors),
        }
    }
}

/// The device's counters: per queue pair, the peer side, and management
/// replies lost for want of rx buffers.
pub(crate) struct Stats {
    pub queues: Box<[QueueStats]>,
    pub peer: PeerStats,
    /// Written by every worker that drops one of its replies.
    pub replies_dropped_no_buffers: SharedCounter,
    pub ctl: CtlStats,
    /// vhost-user requests refused (written by the relay threads and the
    /// main thread).
    pub vhost: VhostStats,
}

/// The control socket's clients (written by the `vnic-mgmt` thread only,
/// which also decrements `clients`: plain atomics).
#[derive(Default)]
pub(crate) struct CtlStats {
    /// Clients connected now.
    pub clients: AtomicU64,
    /// Clients refused because [`crate::ctlsock`]'s client limit was reached.
    pub refused: AtomicU64,
    /// Clients disconnected because they left replies unread too long.
    pub dropped_slow: AtomicU64,
    /// Request lines longer than the limit (the client is disconnected).
    pub lines_too_long: AtomicU64,
}

impl CtlStats {
    /// As `ctl stats` shows them (`ctl`).
    pub(crate) fn to_wire(&self) -> wire::CtlStats {
        wire::CtlStats {
            clients: self.clients.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            dropped_slow: self.dropped_slow.load(Ordering::Relaxed),
            lines_too_long: self.lines_too_long.load(Ordering::Relaxed),
        }
    }
}

impl Stats {
    pub(crate) fn new(pairs: usize) -> Self {
        Self {
            queues: (0..pairs).map(|_| QueueStats::default()).collect(),
            peer: PeerStats::default(),
            replies_dropped_no_buffers: SharedCounter::default(),
            ctl: CtlStats::default(),
            vhost: VhostStats::default(),
        }
    }

    /// The owner's handle of queue `q`'s counters, for its worker. There
    /// is one worker per queue; a second live owner (a worker of the
    /// previous connection that has not exited) is logged.
    pub(crate) fn claim(self: &Arc<Self>, q: usize) -> QueueOwner {
        if self.queues[q].owners.fetch_add(1, Ordering::Relaxed) != 0 {
            log::warn!("queue {q}: counters claimed by a second worker while the first is alive");
        }
        QueueOwner {
            stats: self.clone(),
            q,
            _not_sync: PhantomData,
        }
    }
}

/// A worker's hit counters: one per `u16`.
type HitRow = [OwnedCounter; 1 << 16];

fn hit_row() -> Arc<HitRow> {
    let row: Arc<[OwnedCounter]> = (0..1 << 16).map(|_| OwnedCounter::default()).collect();
    row.try_into()
        .unwrap_or_else(|_| unreachable!("a row of 1 << 16 counters"))
}

/// Per worker, per filter id: frames the worker's replica steered by that
/// filter (each row written by its worker only, through its [`HitsOwner`]).
pub(crate) struct Hits {
    /// One counter for every `u16`, so that a `u16` id indexes a row with
    /// no bounds check (the last, id 0xFFFF, is never a filter's and stays 0).
    rows: Box<[Arc<HitRow>]>,
    /// Per worker, per rule location: frames a rule decided.
    rule_rows: Box<[Arc<[OwnedCounter]>]>,
    /// Live [`HitsOwner`]s per row.
    owners: Box<[AtomicU32]>,
}

impl Hits {
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            rows: (0..workers).map(|_| hit_row()).collect(),
            rule_rows: (0..workers)
                .map(|_| {
                    (0..arfs::table::MAX_RULES)
                        .map(|_| OwnedCounter::default())
                        .collect()
                })
                .collect(),
            owners: (0..workers).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// The owner's handle of `worker`'s row (see [`Stats::claim`]).
    pub(crate) fn claim(self: &Arc<Self>, worker: usize) -> HitsOwner {
        if self.owners[worker].fetch_add(1, Ordering::Relaxed) != 0 {
            log::warn!("hits of worker {worker} claimed twice");
        }
        HitsOwner {
            hits: self.clone(),
            row: self.rows[worker].clone(),
            rule_row: self.rule_rows[worker].clone(),
            worker,
            _not_sync: PhantomData,
        }
    }

    /// Sum over the workers of the hits of filter `id`.
    pub(crate) fn sum(&self, id: u16) -> u64 {
        self.rows.iter().map(|r| r[usize::from(id)].get()).sum()
    }

    /// Sum over the workers of the frames the rule at `loc` decided.
    pub(crate) fn rule_sum(&self, loc: u32) -> u64 {
        self.rule_rows
            .iter()
            .filter_map(|r| r.get(loc as usize))
            .map(OwnedCounter::get)
            .sum()
    }
}

/// The one writer of a worker's row of [`Hits`].
pub(crate) struct HitsOwner {
    hits: Arc<Hits>,
    /// `hits.rows[worker]`, held here so that a hit is one indexed add.
    row: Arc<HitRow>,
    rule_row: Arc<[OwnedCounter]>,
    worker: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl HitsOwner {
    /// One more hit of filter `id` (a plain load and store).
    #[inline]
    pub(crate) fn count(&self, id: u16) {
        self.row[usize::from(id)].add(1);
    }

    /// One more frame decided by the rule at `loc`.
    #[inline]
    pub(crate) fn count_rule(&self, loc: u16) {
        if let Some(c) = self.rule_row.get(usize::from(loc)) {
            c.add(1);
        }
    }
}

impl Drop for HitsOwner {
    fn drop(&mut self) {
        self.hits.owners[self.worker].fetch_sub(1, Ordering::Relaxed);
    }
}

// ---- why the device refused guest input (the counters' names) --------------

/// Why a tx chain was unusable (one counter each in `ctl stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadTx {
    /// The chain revisits descriptors: more links than the table has
    /// entries.
    Loop,
    /// A head or `next` index outside the descriptor table.
    BadIndex,
    /// A buffer or a descriptor table outside guest memory.
    OutOfRange,
    /// More than [`MAX_TX_LEN`] bytes.
    TooLong,
    /// A device-writable buffer in a tx chain.
    Writable,
    /// Fewer bytes than a virtio-net header.
    ShortHeader,
    /// An indirect descriptor the spec forbids: nested, a table length
    /// that is zero or not a multiple of 16, or a table chain longer than
    /// the ring.
    Indirect,
}

impl BadTx {
    /// Every reason, in the order of their `ctl stats` fields.
    pub(crate) const ALL: [BadTx; 7] = [
        BadTx::Loop,
        BadTx::BadIndex,
        BadTx::OutOfRange,
        BadTx::TooLong,
        BadTx::Writable,
        BadTx::ShortHeader,
        BadTx::Indirect,
    ];

    /// The reason's name in `ctl stats` (`tx_bad_<name>`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            BadTx::Loop => "loop",
            BadTx::BadIndex => "bad_index",
            BadTx::OutOfRange => "out_of_range",
            BadTx::TooLong => "too_long",
            BadTx::Writable => "writable",
            BadTx::ShortHeader => "short_header",
            BadTx::Indirect => "indirect",
        }
    }
}

/// Why a frontend's vhost-user request was refused (which ends its
/// connection): the relay's own checks first, then the request handler's
/// errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    TooBig,
    TooManyFds,
    Truncated,
    RegionPastEof,
    InvalidMessage,
    InvalidParam,
    BadFds,
    NotNegotiated,
    InvalidOperation,
    BackendFailed,
    Other,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 11] = [
        Refusal::TooBig,
        Refusal::TooManyFds,
        Refusal::Truncated,
        Refusal::RegionPastEof,
        Refusal::InvalidMessage,
        Refusal::InvalidParam,
        Refusal::BadFds,
        Refusal::NotNegotiated,
        Refusal::InvalidOperation,
        Refusal::BackendFailed,
        Refusal::Other,
    ];

    /// The counter's name in `ctl stats` (`vhost.refused`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::TooBig => "too_big",
            Refusal::TooManyFds => "too_many_fds",
            Refusal::Truncated => "truncated",
            Refusal::RegionPastEof => "region_past_eof",
            Refusal::InvalidMessage => "invalid_message",
            Refusal::InvalidParam => "invalid_param",
            Refusal::BadFds => "bad_fds",
            Refusal::NotNegotiated => "not_negotiated",
            Refusal::InvalidOperation => "invalid_operation",
            Refusal::BackendFailed => "backend_failed",
            Refusal::Other => "other",
        }
    }
}

/// Refused vhost-user requests by [`Refusal`].
#[derive(Default)]
pub(crate) struct VhostStats {
    refused: [SharedCounter; Refusal::ALL.len()],
}

impl VhostStats {
    pub(crate) fn count(&self, r: Refusal) {
        self.refused[r as usize].add(1);
    }

    pub(crate) fn get(&self, r: Refusal) -> u64 {
        self.refused[r as usize].get()
    }

    /// As `ctl stats` shows them (`vhost`).
    pub(crate) fn to_wire(&self) -> wire::VhostStats {
        let g = |r| self.get(r);
        let refused = wire::VhostRefusals {
            too_big: g(Refusal::TooBig),
            too_many_fds: g(Refusal::TooManyFds),
            truncated: g(Refusal::Truncated),
            region_past_eof: g(Refusal::RegionPastEof),
            invalid_message: g(Refusal::InvalidMessage),
            invalid_param: g(Refusal::InvalidParam),
            bad_fds: g(Refusal::BadFds),
            not_negotiated: g(Refusal::NotNegotiated),
            invalid_operation: g(Refusal::InvalidOperation),
            backend_failed: g(Refusal::BackendFailed),
            other: g(Refusal::Other),
        };
        wire::VhostStats {
            refused_total: Refusal::ALL.iter().map(|&r| g(r)).sum(),
            refused,
        }
    }
}

/// Why the device stopped using a ring. The virtio spec lets a device
/// that meets such a ring set DEVICE_NEEDS_RESET; vhost-user has no
/// message for that, so the ring stays stopped (counted once, logged once,
/// named in `ctl stats`) until the frontend stops and restarts it, which
/// it does on every guest driver reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RingStop {
    /// The avail index runs more than the ring size ahead of the device:
    /// the driver published entries it cannot have filled.
    AvailJump,
    /// The avail ring cannot be read any more (guest memory changed under
    /// it).
    AvailUnreadable,
}

impl RingStop {
    /// Code kept in the queue's `*_stopped` counter (0: running).
    pub(crate) fn code(self) -> u64 {
        match self {
            RingStop::AvailJump => 1,
            RingStop::AvailUnreadable => 2,
        }
    }

    /// The name `ctl stats` shows for a code, `None` for 0 (running).
    pub(crate) fn name_of(code: u64) -> Option<&'static str> {
        match code {
            0 => None,
            1 => Some("avail_jump"),
            2 => Some("avail_unreadable"),
            _ => Some("unknown"),
        }
    }
}

impl std::fmt::Display for RingStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(Self::name_of(self.code()).unwrap_or("?"))
    }
}

// ---- the generator's round-trip histogram ----------------------------------

/// Longest round trip recorded; older stamps are `bad`.
pub(crate) const MAX_RTT: Duration = Duration::from_mins(1);

/// Sub-buckets per power of two (each 1/8 of its octave wide: a
/// percentile read from the histogram is within 12.5% of the true value).
const SUB: u32 = 8;
/// Buckets: exact below 8 ns, then 8 per octave up to 2^36 ns (> MAX_RTT).
const BUCKETS: usize = ((36 - 2) * SUB) as usize;

/// The bucket of `ns`.
fn bucket(ns: u64) -> usize {
    if ns < u64::from(SUB) {
        return ns as usize;
    }
    let e = ns.ilog2();
    let sub = (ns >> (e - 3)) & u64::from(SUB - 1);
    (((e - 2) * SUB) as usize + sub as usize).min(BUCKETS - 1)
}

/// The range [lo, hi) of bucket `i`, in ns.
pub(crate) fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB as usize {
        return (i as u64, i as u64 + 1);
    }
    let e = i as u32 / SUB + 2;
    let sub = (i as u32 % SUB) as u64;
    ((8 + sub) << (e - 3), (9 + sub) << (e - 3))
}

/// Round trips seen by the generator (any worker records: relaxed RMW).
pub(crate) struct RttHist {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
    bad: AtomicU64,
}

impl Default for RttHist {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            bad: AtomicU64::new(0),
        }
    }
}

impl RttHist {
    /// Records the round trip of a stamp sent at `sent` and echoed back at
    /// `now`; a stamp from the future or older than [`MAX_RTT`] is `bad`.
    pub(crate) fn record(&self, sent: u64, now: u64) {
        match now.checked_sub(sent) {
            Some(d) if d <= MAX_RTT.as_nanos() as u64 => {
                self.buckets[bucket(d)].fetch_add(1, Ordering::Relaxed);
                self.sum_ns.fetch_add(d, Ordering::Relaxed);
                self.count.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                self.bad.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `{"replies", "sum_ns", "bad", "buckets": [[lo_ns, hi_ns, n], ...]}`
    /// (non-empty buckets only, ascending).
    pub(crate) fn to_wire(&self) -> wire::RttStats {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let n = b.load(Ordering::Relaxed);
                (n > 0).then(|| {
                    let (lo_ns, hi_ns) = bucket_range(i);
                    wire::RttBucket { lo_ns, hi_ns, n }
                })
            })
            .collect();
        wire::RttStats {
            replies: self.count.load(Ordering::Relaxed),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            bad: self.bad.load(Ordering::Relaxed),
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Queue 0's `rx_drops_no_buffers`, bumped by its owner (the worker of
    /// queue 0 on its own out-of-buffers path, `Local::deliver`) and by
    /// other workers (frames they steer to queue 0 while it is starved,
    /// `Router::starved_drops`) at the same time: no increment may be
    /// lost. The owner keeps going until the others are done, so the
    /// writers overlap all along; five rounds. (With the owner's old plain
    /// load and store on this counter, it lost 0.6 to 3.8 million of about
    /// 6 million increments in 9 runs of 10 on the 2-CPU host, one round.)
    #[test]
    fn drop_counter_of_a_queue_keeps_every_increment_of_owner_and_others() {
        const N: u64 = 2_000_000;
        const OTHERS: u64 = 2;
        for round in 0..5 {
            let stats = Arc::new(Stats::new(3));
            let done = Arc::new(AtomicBool::new(false));
            let start = Arc::new(std::sync::Barrier::new(1 + OTHERS as usize));
            let owner = {
                let (stats, start, done) = (stats.clone(), start.clone(), done.clone());
                std::thread::spawn(move || {
                    let me = stats.claim(0);
                    let w = me.writer();
                    start.wait();
                    let mut n = 0u64;
                    while n < N || !done.load(Ordering::Relaxed) {
                        // As `Local::deliver` counts a frame it cannot place.
                        add(&w.queue().rx_drops_no_buffers, 1);
                        w.add(|q| &q.rx_packets, 1);
                        n += 1;
                    }
                    n
                })
            };
            let others: Vec<_> = (0..OTHERS)
                .map(|_| {
                    let (stats, start) = (stats.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        for _ in 0..N {
                            add(&stats.queues[0].rx_drops_no_buffers, 1);
                        }
                    })
                })
                .collect();
            for t in others {
                t.join().unwrap();
            }
            done.store(true, Ordering::Relaxed);
            let mine = owner.join().unwrap();
            let want = mine + N * OTHERS;
            let got = stats.queues[0].rx_drops_no_buffers.get();
            assert_eq!(
                got,
                want,
                "round {round}: {} of {want} increments lost",
                want - got
            );
            // The owned counter, one writer: exact too.
            assert_eq!(stats.queues[0].rx_packets.get(), mine);
        }
    }

    /// One owner per queue at a time: the claim count follows the handles.
    #[test]
    fn a_queue_owner_is_counted_while_it_lives() {
        let stats = Arc::new(Stats::new(2));
        let a = stats.claim(1);
        assert_eq!(stats.queues[1].owners.load(Ordering::Relaxed), 1);
        a.writer().count_bad_tx(BadTx::ALL[0]);
        assert_eq!(stats.queues[1].tx_bad_chains(), 1);
        drop(a);
        assert_eq!(stats.queues[1].owners.load(Ordering::Relaxed), 0);
        let hits = Arc::new(Hits::new(2));
        let h0 = hits.claim(0);
        let h1 = hits.claim(1);
        h0.count(7);
        h1.count(7);
        h1.count(7);
        assert_eq!(hits.sum(7), 3);
    }
    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut prev_hi = 0;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_range(i);
            assert_eq!(
                lo,
                prev_hi,
                "bucket {i} starts where {} ended",
                i.max(1) - 1
            );
            assert!(hi > lo);
            assert_eq!(bucket(lo), i);
            assert_eq!(bucket(hi - 1), i);
            // At most 1/8 of the bucket's lower edge wide (beyond the exact ones).
            if lo >= 8 {
                assert!((hi - lo) * 8 <= lo, "bucket {i} [{lo},{hi}) too wide");
            }
            prev_hi = hi;
        }
        assert!(prev_hi > MAX_RTT.as_nanos() as u64);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn record_sorts_good_and_bad() {
        let h = RttHist::default();
        h.record(1_000, 251_000); // 250 us
        h.record(1_000, 1_001_000); // 1 ms
        h.record(5_000, 4_000); // from the future
        h.record(0, MAX_RTT.as_nanos() as u64 + 1); // too old
        let v = h.to_wire();
        assert_eq!(v.replies, 2);
        assert_eq!(v.bad, 2);
        assert_eq!(v.sum_ns, 1_250_000);
        assert_eq!(v.buckets.len(), 2);
        let (lo, hi) = (v.buckets[0].lo_ns, v.buckets[0].hi_ns);
        assert!(lo <= 250_000 && 250_000 < hi);
    }
}
