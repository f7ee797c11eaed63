//! Counters. Per-queue counters are written by one worker thread only and read
//! by the control socket, so plain relaxed atomics suffice (no lock, no shared
//! cache line between workers: each queue's block is padded to its own line).

use std::sync::atomic::{AtomicU64, Ordering};

/// Size of the id space of filter ids (0..=0xFFFE).
pub const ID_SPACE: usize = 0xFFFF;

use serde_json::{json, Value};

use crate::virtq::tx::BadTx;
use crate::virtq::RingStop;

/// Adds `n` to a counter (relaxed: counters are statistics, not synchronisation).
#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Adds `n` to a counter that only the calling thread writes (readers
/// still see a consistent value): a plain load and store, no locked RMW.
#[inline]
pub fn add_owned(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

#[inline]
fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Counters of one queue pair.
#[derive(Default)]
#[repr(align(128))]
pub struct QueueStats {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub rx_drops_no_buffers: AtomicU64,
    pub rx_drops_ring_full: AtomicU64,
    pub rx_drops_too_big: AtomicU64,
    pub rx_drops_disabled: AtomicU64,
    pub rx_filter: AtomicU64,
    pub rx_rss: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub tx_drops: AtomicU64,
    pub rx_bad_chains: AtomicU64,
    /// Unusable tx chains by reason, indexed like [`BadTx::ALL`].
    pub tx_bad: [AtomicU64; 7],
    /// Times the rx / tx ring was stopped, by [`RingStop`] reason
    /// (index `code - 1`), and the reason it is stopped for now (its
    /// code; 0: running).
    pub rx_stops: [AtomicU64; 2],
    pub tx_stops: [AtomicU64; 2],
    pub rx_stopped: AtomicU64,
    pub tx_stopped: AtomicU64,
}

impl QueueStats {
    pub fn rx_drops(&self) -> u64 {
        get(&self.rx_drops_no_buffers)
            + get(&self.rx_drops_ring_full)
            + get(&self.rx_drops_too_big)
            + get(&self.rx_drops_disabled)
    }

    pub fn to_json(&self, index: usize) -> Value {
        let mut v = json!({
            "index": index,
            "rx_packets": get(&self.rx_packets),
            "rx_bytes": get(&self.rx_bytes),
            "rx_drops": self.rx_drops(),
            "rx_drops_no_buffers": get(&self.rx_drops_no_buffers),
            "rx_drops_ring_full": get(&self.rx_drops_ring_full),
            "rx_drops_too_big": get(&self.rx_drops_too_big),
            "rx_drops_disabled": get(&self.rx_drops_disabled),
            "rx_filter": get(&self.rx_filter),
            "rx_rss": get(&self.rx_rss),
            "tx_packets": get(&self.tx_packets),
            "tx_bytes": get(&self.tx_bytes),
            "tx_drops": get(&self.tx_drops),
            "rx_bad_chains": get(&self.rx_bad_chains),
            "tx_bad_chains": self.tx_bad_chains(),
        });
        let m = v.as_object_mut().expect("object");
        for (r, c) in BadTx::ALL.iter().zip(&self.tx_bad) {
            m.insert(format!("tx_bad_{}", r.name()), get(c).into());
        }
        for (dir, stops, now) in [
            ("rx", &self.rx_stops, &self.rx_stopped),
            ("tx", &self.tx_stops, &self.tx_stopped),
        ] {
            for (code, c) in (1u64..).zip(stops) {
                let name = RingStop::name_of(code).expect("nonzero");
                m.insert(format!("{dir}_bad_{name}"), get(c).into());
            }
            m.insert(format!("{dir}_stopped"), RingStop::name_of(get(now)).into());
        }
        v
    }

    /// Unusable tx chains, all reasons.
    pub fn tx_bad_chains(&self) -> u64 {
        self.tx_bad.iter().map(get).sum()
    }

    /// Counts one unusable tx chain (called by the queue's worker only).
    #[inline]
    pub fn count_bad_tx(&self, r: BadTx) {
        let i = BadTx::ALL.iter().position(|&x| x == r).unwrap_or(0);
        add_owned(&self.tx_bad[i], 1);
    }
}

/// Counters of the peer side (written by workers, hence atomics).
#[derive(Default)]
pub struct PeerStats {
    /// Frames from the peer carrying the management EtherType (dropped).
    pub spoofed_mgmt_dropped: AtomicU64,
    /// Frames from the peer that could not be parsed (delivered by RSS anyway).
    pub unparsable: AtomicU64,
    /// Frames that hit a filter and were delivered to another queue on
    /// purpose (the `misroute` fault).
    pub misrouted: AtomicU64,
    /// Frames that hit a filter and were dropped yet counted delivered
    /// (the `drop_rate` fault).
    pub fault_dropped: AtomicU64,
    /// Frames that hit a filter and had a payload byte flipped (the
    /// `corrupt_rate` fault).
    pub fault_corrupted: AtomicU64,
    /// Frames that hit a filter and had a payload byte flipped under a
    /// stale UDP checksum (the `bad_csum_rate` fault).
    pub fault_bad_csum: AtomicU64,
    /// Generator: UDP frames generated.
    pub gen_sent: AtomicU64,
    /// Generator: frames from the guest sunk (not answered).
    pub sink_packets: AtomicU64,
    pub sink_bytes: AtomicU64,
    /// Generator: ARP requests answered.
    pub arp_replies: AtomicU64,
    /// Generator: ICMP and ICMPv6 echo requests answered.
    pub icmp_echo_replies: AtomicU64,
    /// Generator: IPv6 neighbour solicitations answered.
    pub nd_replies: AtomicU64,
    /// Generator: round trips of stamped frames the guest echoed back.
    pub rtt: crate::peer::rtt::RttHist,
    /// Tap: frames written to / read from the tap device, and write errors.
    pub tap_tx: AtomicU64,
    pub tap_rx: AtomicU64,
    pub tap_tx_errors: AtomicU64,
}

impl PeerStats {
    pub fn to_json(&self, kind: &str) -> Value {
        json!({
            "kind": kind,
            "spoofed_mgmt_dropped": get(&self.spoofed_mgmt_dropped),
            "unparsable": get(&self.unparsable),
            "misrouted": get(&self.misrouted),
            "fault_dropped": get(&self.fault_dropped),
            "fault_corrupted": get(&self.fault_corrupted),
            "fault_bad_csum": get(&self.fault_bad_csum),
            "gen_sent": get(&self.gen_sent),
            "sink_packets": get(&self.sink_packets),
            "sink_bytes": get(&self.sink_bytes),
            "arp_replies": get(&self.arp_replies),
            "icmp_echo_replies": get(&self.icmp_echo_replies),
            "nd_replies": get(&self.nd_replies),
            "rtt": self.rtt.to_json(),
            "tap_tx": get(&self.tap_tx),
            "tap_rx": get(&self.tap_rx),
            "tap_tx_errors": get(&self.tap_tx_errors),
        })
    }
}

/// The device's counters: per queue pair, the peer side, and management
/// replies lost for want of rx buffers.
pub struct Stats {
    pub queues: Box<[QueueStats]>,
    pub peer: PeerStats,
    pub replies_dropped_no_buffers: AtomicU64,
    pub ctl: CtlStats,
}

/// The control socket's clients.
#[derive(Default)]
pub struct CtlStats {
    /// Clients connected now.
    pub clients: AtomicU64,
    /// Clients refused because [`crate::serve`]'s client limit was reached.
    pub refused: AtomicU64,
    /// Clients disconnected because they left replies unread too long.
    pub dropped_slow: AtomicU64,
    /// Request lines longer than the limit (the client is disconnected).
    pub lines_too_long: AtomicU64,
}

impl CtlStats {
    pub fn to_json(&self) -> Value {
        json!({
            "clients": get(&self.clients),
            "refused": get(&self.refused),
            "dropped_slow": get(&self.dropped_slow),
            "lines_too_long": get(&self.lines_too_long),
        })
    }
}

impl Stats {
    pub fn new(pairs: usize) -> Self {
        Self {
            queues: (0..pairs).map(|_| QueueStats::default()).collect(),
            peer: PeerStats::default(),
            replies_dropped_no_buffers: AtomicU64::new(0),
            ctl: CtlStats::default(),
        }
    }
}

/// Per worker, per filter id: frames the worker's replica steered by that
/// filter (each row written by its worker only).
pub struct Hits(Box<[Box<[AtomicU64]>]>);

impl Hits {
    pub fn new(workers: usize) -> Self {
        Self(
            (0..workers)
                .map(|_| (0..ID_SPACE).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        )
    }

    /// One more hit of filter `id` by `worker` (its own row: a plain
    /// load and store is enough).
    #[inline]
    pub fn count(&self, worker: usize, id: u16) {
        if let Some(h) = self.0.get(worker).and_then(|r| r.get(usize::from(id))) {
            add_owned(h, 1);
        }
    }

    /// Sum over the workers of the hits of filter `id`.
    pub fn sum(&self, id: u16) -> u64 {
        self.0
            .iter()
            .map(|r| r.get(usize::from(id)).map_or(0, get))
            .sum()
    }
}
