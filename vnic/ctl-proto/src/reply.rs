//! Replies: the envelope (`ok`, `error`) and what each command answers
//! (CTL.md "Commands", "`stats` shape", "`table` shape").
//!
//! Counters the daemon keeps by reason (`frames_bad`, `deletes`, `rejects`,
//! the queues' `tx_bad_*` and `*_bad_avail_*`) are named fields here, one
//! per reason, not maps: a client reads `stats.mgmt.frames_bad.bad_magic`
//! and a reason renamed on one side fails to compile on the other. The
//! daemon's tests check that every reason of its enums has its field.
//!
//! Reply structs do not refuse unknown fields (a newer daemon may add
//! counters); the daemon's own tests check that what it sends is exactly
//! these fields. Every field must be there, `Option`s too (the daemon
//! sends `null`): a reply that lacks one is refused, never read as a
//! counter at 0 or a ring that runs.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::request::FlowSpec;

/// An `Option` field that must be present (as `null` or a value): serde
/// reads a missing `Option` as `None` unless the field has its own
/// deserializer.
mod required {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        Option::<T>::deserialize(d)
    }
}

/// A reply line: `{"ok": true, ...body}` or `{"ok": false, "error": "..."}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply<T> {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten)]
    pub body: T,
}

impl<T> Reply<T> {
    /// `{"ok": true, ...body}`.
    pub fn ok(body: T) -> Self {
        Reply {
            ok: true,
            error: None,
            body,
        }
    }
}

impl Reply<Empty> {
    /// `{"ok": false, "error": msg}`.
    pub fn error(msg: impl Into<String>) -> Self {
        Reply {
            ok: false,
            error: Some(msg.into()),
            body: Empty {},
        }
    }
}

/// No body: the reply of `trace_flush`, and of every error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// `stats`'s body.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsReply {
    pub stats: Stats,
}

/// `table`'s body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableReply {
    pub table: Table,
}

/// The body of `knobs` and `set`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KnobsReply {
    pub knobs: Knobs,
}

/// `gen start`'s body: the new flow set's id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenStarted {
    pub id: u32,
}

/// `gen set`'s body: the flow set after the change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenChanged {
    pub flow: FlowSetInfo,
}

/// `gen pause`'s body: the sets paused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenPaused {
    pub pause: Vec<u32>,
}

/// `gen resume`'s body: the sets resumed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenResumed {
    pub resume: Vec<u32>,
}

/// `gen stop`'s body: the sets stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenStopped {
    pub stopped: Vec<u32>,
}

/// `gen list`'s body.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenList {
    pub flows: Vec<FlowSetInfo>,
}

/// A flow set as `gen list` and `gen set` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowSetInfo {
    pub id: u32,
    pub spec: ResolvedFlowSpec,
    /// Packets sent so far, all workers.
    pub sent: u64,
    /// Not stopped, not paused, and (with a `count`) not all sent.
    pub active: bool,
}

/// A flow set's spec with the defaults filled in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedFlowSpec {
    pub flows: u32,
    pub src: String,
    pub sport: String,
    pub dst: String,
    pub dport: String,
    pub count: u64,
    pub rate: u64,
    pub size: usize,
    pub stamp: bool,
}

impl From<ResolvedFlowSpec> for FlowSpec {
    fn from(s: ResolvedFlowSpec) -> Self {
        FlowSpec {
            flows: Some(s.flows),
            src: Some(s.src),
            sport: Some(s.sport),
            dst: Some(s.dst),
            dport: Some(s.dport),
            count: Some(s.count),
            rate: Some(s.rate),
            size: Some(s.size),
            stamp: Some(s.stamp),
        }
    }
}

/// The `stats` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Changes on every new connection and every device stop/reset.
    pub generation: u32,
    pub uptime_s: f64,
    pub connected: bool,
    pub connections: u64,
    pub queue_pairs: u16,
    /// Pairs RSS spreads over, CAPS reports and ops are checked against.
    pub enabled_pairs: u16,
    pub queues: Vec<QueueStats>,
    pub mgmt: MgmtStats,
    pub table: TableStats,
    pub peer: PeerStats,
    pub trace: TraceStats,
    pub ctl: CtlStats,
    /// Absent from daemons older than the vhost-user fuzzer (read as all
    /// zero), so that a client of this crate still reads them: the benches'
    /// `--baseline` runs an older binary.
    #[serde(default)]
    pub vhost: VhostStats,
    /// `None` without a connection.
    #[serde(deserialize_with = "required::deserialize")]
    pub rings: Option<Rings>,
}

/// One queue pair's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    pub index: usize,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// The sum of the `rx_drops_*` reasons.
    pub rx_drops: u64,
    pub rx_drops_no_buffers: u64,
    pub rx_drops_ring_full: u64,
    pub rx_drops_too_big: u64,
    pub rx_drops_disabled: u64,
    pub rx_filter: u64,
    pub rx_rss: u64,
    /// Frames the rx stage wrote into the guest's buffers with plain
    /// stores; the rest of `rx_packets` were streamed (`vnic serve
    /// --rx-stores`). Management replies count too. Absent from daemons
    /// older than `--rx-stores` (read as zero).
    #[serde(default)]
    pub rx_plain: u64,
    /// Times the worker changed its store mode (`--rx-stores auto`: each
    /// probe of the other mode, and each change it kept).
    #[serde(default)]
    pub rx_store_switches: u64,
    /// `--poll-us`: times the worker spun for rx buffers after a frame
    /// found none (instead of asking the driver for a kick at once), those
    /// spins that found some, and their wall time in nanoseconds, as for
    /// `tx_spins`. Absent from daemons older than the rx spin (read as
    /// zero).
    #[serde(default)]
    pub rx_spins: u64,
    #[serde(default)]
    pub rx_spins_found: u64,
    #[serde(default)]
    pub rx_spin_ns: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// `--poll-us`: times the worker spun for more tx chains instead of
    /// sleeping at once, those spins that found one (each a sleep and a
    /// driver kick saved), and the nanoseconds all spins took (wall time:
    /// a spin yields its CPU at each turn, and on a loaded host the time
    /// others ran counts here without being this worker's CPU). Absent from
    /// daemons older than the adaptive spin (read as zero, so that the
    /// benches' `--baseline` can run an older binary; those daemons spun
    /// only with `--poll-us`, and did not count it).
    #[serde(default)]
    pub tx_spins: u64,
    #[serde(default)]
    pub tx_spins_found: u64,
    #[serde(default)]
    pub tx_spin_ns: u64,
    pub tx_drops: u64,
    pub rx_bad_chains: u64,
    /// The sum of the `tx_bad_<reason>` counters.
    pub tx_bad_chains: u64,
    pub tx_bad_loop: u64,
    pub tx_bad_bad_index: u64,
    pub tx_bad_out_of_range: u64,
    pub tx_bad_too_long: u64,
    pub tx_bad_writable: u64,
    pub tx_bad_short_header: u64,
    pub tx_bad_indirect: u64,
    pub rx_bad_avail_jump: u64,
    pub rx_bad_avail_unreadable: u64,
    /// Why the device stopped using the rx ring; `None` while it runs.
    #[serde(deserialize_with = "required::deserialize")]
    pub rx_stopped: Option<String>,
    pub tx_bad_avail_jump: u64,
    pub tx_bad_avail_unreadable: u64,
    #[serde(deserialize_with = "required::deserialize")]
    pub tx_stopped: Option<String>,
}

/// The management protocol's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgmtStats {
    pub frames_rx: u64,
    pub frames_ok: u64,
    /// The sum of `frames_bad`.
    pub frames_bad_total: u64,
    pub frames_bad: FramesBad,
    pub acks_sent: u64,
    pub caps_sent: u64,
    pub rogue_sent: u64,
    /// Frames sent as the `forge_acks` knob's forgeries.
    #[serde(default)]
    pub forged_sent: u64,
    /// `replace` trace lines the `wrong_trace` knob falsified.
    #[serde(default)]
    pub wrong_traced: u64,
    pub naks_sent: u64,
    pub dst: MgmtDst,
    pub dropped_by_loss: u64,
    pub replies_dropped_by_loss: u64,
    pub replies_dropped_no_buffers: u64,
    pub out_of_order: u64,
    pub duplicates: u64,
    pub duplicate_reacks: u64,
    pub pending_requests: u64,
    /// `None` before the first request of a generation.
    #[serde(deserialize_with = "required::deserialize")]
    pub expected_seq: Option<u32>,
}

/// Malformed management frames by reason (aRFS `FrameError` names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FramesBad {
    pub too_short: u64,
    pub bad_magic: u64,
    pub bad_version: u64,
    pub unknown_type: u64,
    pub wrong_direction: u64,
    pub bad_length: u64,
    pub too_many_ops: u64,
    pub bad_reason: u64,
    pub reserved_nonzero: u64,
    pub bad_count: u64,
}

/// Destination MACs of the driver's frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgmtDst {
    pub hello_to_group: u64,
    pub to_device: u64,
    pub to_broadcast: u64,
    pub to_other: u64,
}

/// The filter table's counters (`stats.table`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableStats {
    pub live: u64,
    pub capacity: u32,
    pub adds: u64,
    pub replaces: u64,
    pub unchanged: u64,
    pub deletes: Deletes,
    pub rejects: Rejects,
    pub unknown_deletes: u64,
    pub flushes: u64,
    pub resets: u64,
    pub requests: u64,
    pub generation_changes: u64,
}

/// Filters removed, by reason (aRFS `DelReason` names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deletes {
    pub expired: u64,
    pub idle: u64,
    pub replaced: u64,
    pub flush: u64,
    pub unload: u64,
    pub aged: u64,
}

/// ADD ops refused, by status (aRFS `OpStatus` names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejects {
    pub table_full: u64,
    pub bucket_full: u64,
    pub bad_queue: u64,
    pub bad_key: u64,
    pub injected_failure: u64,
    pub bad_id: u64,
}

/// The peer side's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStats {
    /// `gen` or `tap:IFNAME`.
    pub kind: String,
    pub spoofed_mgmt_dropped: u64,
    pub unparsable: u64,
    pub misrouted: u64,
    pub fault_dropped: u64,
    pub fault_corrupted: u64,
    pub fault_bad_csum: u64,
    /// Absent from a daemon older than `truncate_rate`: read as 0.
    #[serde(default)]
    pub fault_truncated: u64,
    /// Absent from a daemon older than `reorder_rate`: read as 0.
    #[serde(default)]
    pub fault_reordered: u64,
    /// Hits the `delay_effect_ms` fault left on the flow's previous queue
    /// (absent from an older daemon: read as 0).
    #[serde(default)]
    pub fault_delayed: u64,
    /// Frames an `ethtool -N` rule with action drop took (absent from an
    /// older daemon: read as 0).
    #[serde(default)]
    pub rule_dropped: u64,
    pub gen_sent: u64,
    pub sink_packets: u64,
    pub sink_bytes: u64,
    pub arp_replies: u64,
    pub icmp_echo_replies: u64,
    pub nd_replies: u64,
    pub rtt: RttStats,
    pub tap_tx: u64,
    pub tap_rx: u64,
    pub tap_tx_errors: u64,
}

/// Round trips of stamped frames (`peer.rtt`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RttStats {
    pub replies: u64,
    pub sum_ns: u64,
    /// Stamps from the future or older than 60 s (not recorded).
    pub bad: u64,
    /// Non-empty buckets, ascending.
    pub buckets: Vec<RttBucket>,
}

/// One histogram bucket: `[lo_ns, hi_ns, n]` on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u64, u64, u64)", into = "(u64, u64, u64)")]
pub struct RttBucket {
    pub lo_ns: u64,
    pub hi_ns: u64,
    pub n: u64,
}

impl From<(u64, u64, u64)> for RttBucket {
    fn from((lo_ns, hi_ns, n): (u64, u64, u64)) -> Self {
        RttBucket { lo_ns, hi_ns, n }
    }
}

impl From<RttBucket> for (u64, u64, u64) {
    fn from(b: RttBucket) -> Self {
        (b.lo_ns, b.hi_ns, b.n)
    }
}

/// The trace writer's accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStats {
    pub enabled: bool,
    pub written: u64,
    pub dropped: u64,
    pub write_errors: u64,
}

/// The control socket's clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtlStats {
    pub clients: u64,
    pub refused: u64,
    pub dropped_slow: u64,
    pub lines_too_long: u64,
}

/// The vhost-user requests the daemon refused. Each refusal ends that
/// frontend's connection (the listener stays: the frontend may connect
/// again).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostStats {
    /// The sum of `refused`.
    pub refused_total: u64,
    pub refused: VhostRefusals,
}

/// Refused vhost-user requests by reason: the first four are the relay's
/// own checks, the others the request handler's (vhost-user-backend's)
/// errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostRefusals {
    /// A payload over the relay's 64 KiB.
    pub too_big: u64,
    /// More file descriptors than one message may carry (32).
    pub too_many_fds: u64,
    /// The frontend went away in the middle of a message.
    pub truncated: u64,
    /// A memory region that reaches past the end of its file (mapping it
    /// would succeed, reading it would fault), or whose file has no size.
    pub region_past_eof: u64,
    /// Unknown request, wrong size, version or flags, fds where none go.
    pub invalid_message: u64,
    /// A value out of range (vring index, ring size, enable, features).
    pub invalid_param: u64,
    /// Missing or extra file descriptors.
    pub bad_fds: u64,
    /// A request whose feature or protocol feature was not negotiated.
    pub not_negotiated: u64,
    /// A request out of place (e.g. a second SET_OWNER).
    pub invalid_operation: u64,
    /// The handler could not carry it out (e.g. a memory table it cannot
    /// map, regions that intersect, a vring address in no region).
    pub backend_failed: u64,
    /// Anything else that ended a connection with an error.
    pub other: u64,
}

/// The vrings as the connection's last 50 ms poll saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rings {
    /// `None` before the first poll.
    #[serde(deserialize_with = "required::deserialize")]
    pub age_ms: Option<u64>,
    pub watchdog_nudges: u64,
    /// `None` until the pair's worker registered its rings.
    pub pairs: Vec<Option<RingPair>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingPair {
    pub rx: Ring,
    pub tx: Ring,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ring {
    pub enabled: bool,
    pub ready: bool,
    pub event_idx: bool,
    /// The driver's avail index (`None`: unreadable).
    #[serde(deserialize_with = "required::deserialize")]
    pub avail: Option<u16>,
    pub next_avail: u16,
    pub next_used: u16,
    /// The driver's EVENT_IDX threshold.
    #[serde(deserialize_with = "required::deserialize")]
    pub used_event: Option<u16>,
    pub nudged: bool,
}

/// The `table` object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    pub generation: u32,
    pub live: u64,
    pub capacity: u32,
    /// Sorted by id.
    pub filters: Vec<Filter>,
    /// The `ethtool -N` rules, by location (absent from an older daemon:
    /// read as none).
    #[serde(default)]
    pub rules: Vec<RuleEntry>,
    /// The RSS configuration (absent from a daemon older than the RSS
    /// extension: read as None).
    #[serde(default)]
    pub rss: Option<RssState>,
}

/// What RSS does with the frames no rule and no filter decides: the key
/// and the indirection table, the device's defaults or what the driver
/// set with RSS_SET (aRFS/PROTOCOL.md, the RSS extension).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssState {
    /// Whether the key is the default one.
    pub default_key: bool,
    /// The key RSS hashes with, 80 hex digits.
    pub key: String,
    /// Whether the table is the device's own, round-robin over the
    /// enabled pairs.
    pub default_indir: bool,
    /// The driver's table as it set it, 128 queues (None with
    /// `default_indir`).
    #[serde(deserialize_with = "required::deserialize")]
    pub indir: Option<Vec<u16>>,
    /// The table frames follow now, 128 queues: the driver's with each
    /// entry naming a pair that is not enabled replaced by the
    /// round-robin one, or round-robin over the enabled pairs.
    pub effective: Vec<u16>,
}

/// One rule of the masked stage, as the trace writes it (`arfs::Rule`'s
/// fields: `loc`, `flow` type, addresses and masks as 16 wire bytes,
/// ports and masks, `l4_proto`/`l4_mask`, `action`), with its hits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleEntry {
    /// The rule, as a JSON object.
    pub rule: serde_json::Value,
    /// Frames it decided since it was set.
    pub hits: u64,
}

/// One live filter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    pub id: u16,
    pub rxq: u16,
    /// Frames steered by it since it was installed.
    pub hits: u64,
    /// The daemon's monotonic clock (the trace's `ts_ns`).
    pub installed_ns: u64,
    /// The placement bucket with `--buckets`.
    #[serde(deserialize_with = "required::deserialize")]
    pub bucket: Option<u32>,
    pub flow: Flow,
}

/// A filter's flow (as the trace writes it): `src` is the remote peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Flow {
    pub family: Family,
    pub proto: L4,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum L4 {
    Tcp,
    Udp,
}

/// The knobs (`knobs`, and `set`'s reply).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Knobs {
    /// `misroute_rate` is 1.
    pub misroute: bool,
    pub misroute_rate: f64,
    pub drop_rate: f64,
    pub corrupt_rate: f64,
    pub bad_csum_rate: f64,
    #[serde(default)]
    pub truncate_rate: f64,
    #[serde(default)]
    pub reorder_rate: f64,
    /// A new or re-steered filter takes effect this long after its ACK.
    #[serde(default)]
    pub delay_effect_ms: u64,
    /// Each `replace` trace line names the new queue as `prev_rxq`.
    #[serde(default)]
    pub wrong_trace: bool,
    pub rogue_responder: bool,
    /// With `rogue_responder`: its CAPS echoes the HELLO's nonce.
    #[serde(default)]
    pub rogue_nonce: bool,
    /// Replies to requests still to be lost (`drop_acks`).
    #[serde(default)]
    pub drop_acks: u32,
    #[serde(default)]
    pub forge_acks: bool,
    pub add_fail_rate: f64,
    pub mgmt_loss_rate: f64,
    pub program_latency_us: f64,
    pub capacity: u32,
    /// 0: no placement model.
    pub buckets: u32,
    pub ways: u16,
    /// Most ops per request (CAPS).
    pub max_ops: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon from before the tx spin or `--rx-stores` counters (the
    /// benches' `--baseline` binaries) is still read: they read as zero;
    /// every other field is still required.
    #[test]
    fn stats_without_the_spin_or_store_counters_are_read() {
        let pinned: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/ctl-wire/stats.json")).unwrap();
        let mut old = pinned.clone();
        for q in old["queues"].as_array_mut().unwrap() {
            let q = q.as_object_mut().unwrap();
            for k in [
                "tx_spins",
                "tx_spins_found",
                "tx_spin_ns",
                "rx_plain",
                "rx_store_switches",
                "rx_spins",
                "rx_spins_found",
                "rx_spin_ns",
            ] {
                q.remove(k).unwrap();
            }
        }
        let s: Stats = serde_json::from_value(old).unwrap();
        let full: Stats = serde_json::from_value(pinned.clone()).unwrap();
        for (a, b) in s.queues.iter().zip(&full.queues) {
            assert_eq!((a.tx_spins, a.tx_spins_found, a.tx_spin_ns), (0, 0, 0));
            assert_eq!((a.rx_plain, a.rx_store_switches), (0, 0));
            assert_eq!((a.rx_spins, a.rx_spins_found, a.rx_spin_ns), (0, 0, 0));
            assert_ne!(b.rx_spins, 0);
            assert_ne!(b.tx_spins, 0);
            assert_ne!(b.rx_plain, 0);
            assert_eq!(a.tx_packets, b.tx_packets);
        }
        // Other counters stay required.
        let mut no_drops = pinned;
        no_drops["queues"][0]
            .as_object_mut()
            .unwrap()
            .remove("tx_drops")
            .unwrap();
        assert!(serde_json::from_value::<Stats>(no_drops).is_err());
    }

    /// A daemon from before the `vhost` section is still read: the
    /// section reads as all zero.
    #[test]
    fn stats_without_the_vhost_section_are_read() {
        let pinned: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/ctl-wire/stats.json")).unwrap();
        let mut old = pinned.clone();
        old.as_object_mut().unwrap().remove("vhost").unwrap();
        let s: Stats = serde_json::from_value(old).unwrap();
        assert_eq!(s.vhost, VhostStats::default());
        let full: Stats = serde_json::from_value(pinned.clone()).unwrap();
        assert_ne!(full.vhost, VhostStats::default());
        let mut no_ctl = pinned;
        no_ctl.as_object_mut().unwrap().remove("ctl").unwrap();
        assert!(serde_json::from_value::<Stats>(no_ctl).is_err());
    }

    #[test]
    fn envelopes_and_buckets_look_as_ctl_md_says() {
        let ok = Reply::ok(GenStarted { id: 3 });
        assert_eq!(serde_json::to_string(&ok).unwrap(), r#"{"ok":true,"id":3}"#);
        assert_eq!(
            serde_json::to_string(&Reply::error("no")).unwrap(),
            r#"{"ok":false,"error":"no"}"#
        );
        let r = RttStats {
            replies: 1,
            sum_ns: 9,
            bad: 0,
            buckets: vec![RttBucket {
                lo_ns: 8,
                hi_ns: 9,
                n: 1,
            }],
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["buckets"], serde_json::json!([[8, 9, 1]]));
        assert_eq!(serde_json::from_value::<RttStats>(v).unwrap(), r);
    }

    #[test]
    fn an_option_field_must_be_there() {
        let q = serde_json::to_value(QueueStats::default()).unwrap();
        assert_eq!(q["tx_stopped"], serde_json::Value::Null);
        assert!(serde_json::from_value::<QueueStats>(q.clone()).is_ok());
        for f in ["tx_stopped", "tx_bad_chains"] {
            let mut q = q.clone();
            q.as_object_mut().unwrap().remove(f);
            let e = serde_json::from_value::<QueueStats>(q).unwrap_err();
            assert!(
                e.to_string().contains(&format!("missing field `{f}`")),
                "{e}"
            );
        }
    }
}
