//! The authoritative filter table model.
//!
//! [`FilterTable`] holds the filters, applies ADD/DEL/FLUSH requests with the
//! semantics of PROTOCOL.md after a modelled programming latency, injects
//! failures deterministically under a seed, and reports everything it does
//! as [`TableEvent`]s. The daemon keeps one on its management path and gives
//! each worker thread a [`FlowIndex`] replica kept current with
//! [`FlowIndex::apply`] (or by cloning [`FilterTable::index`]).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::flow::FlowKey;
use crate::index::FlowIndex;
use crate::proto::{AddOp, DelOp, DelReason, MsgType, OpStatus, RssSetOp};
use crate::rng::SplitMix64;
use crate::rss::{RssConfig, Toeplitz, DEFAULT_KEY, KEY_LEN};

/// Highest valid filter id (0xFFFF is the kernel's RPS_NO_FILTER).
pub const MAX_FILTER_ID: u16 = 0xFFFE;
/// Largest capacity: the number of distinct filter ids.
pub const MAX_CAPACITY: u32 = 0xFFFF;
/// Largest bucket count.
pub const MAX_BUCKETS: u32 = 1 << 20;
/// Most requests [`FilterTable::try_submit`] lets wait for their due time.
pub const MAX_PENDING_REQUESTS: usize = 4096;
/// Largest programming latency (CAPS carries microseconds in a u32).
pub const MAX_LATENCY_NS: u64 = u32::MAX as u64 * 1000;

/// Configuration of a [`FilterTable`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableConfig {
    /// Most filters, 1..=65535.
    pub capacity: u32,
    /// Placement model: `(B buckets, W ways)`; `None` for none.
    pub buckets: Option<(u32, u16)>,
    /// Programming latency: requests take effect this long after submission.
    pub latency_ns: u64,
    /// Probability that an otherwise valid ADD op fails (`injected_failure`).
    pub add_fail_rate: f64,
    /// Probability returned by [`FilterTable::mgmt_loss`] draws.
    pub mgmt_loss_rate: f64,
    /// Seed of the fault-injection RNGs.
    pub seed: u64,
    /// Toeplitz key used by the placement model (serde: 80 hex digits).
    /// An RSS_SET's key never replaces it: the buckets are the device's own
    /// hash table, whatever key the driver gives RSS.
    #[serde(with = "hex_key")]
    pub rss_key: [u8; KEY_LEN],
    /// Locations of the masked rule stage (`ethtool -N` rules), 0..=1024;
    /// 0: no rule stage.
    #[serde(default = "default_rules")]
    pub rules: u32,
}

/// [`TableConfig::rules`] by default.
pub const DEFAULT_RULES: u32 = 128;
/// The most rule locations a device may have.
pub const MAX_RULES: u32 = 1024;

const fn default_rules() -> u32 {
    DEFAULT_RULES
}

/// Serde for a Toeplitz key as a hex string.
mod hex_key {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::rss::KEY_LEN;

    pub fn serialize<S: Serializer>(key: &[u8; KEY_LEN], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::rss::key_to_hex(key))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; KEY_LEN], D::Error> {
        let text = String::deserialize(d)?;
        crate::rss::key_from_hex(&text).map_err(serde::de::Error::custom)
    }
}

impl Default for TableConfig {
    fn default() -> Self {
        Self {
            capacity: 1024,
            buckets: None,
            latency_ns: 0,
            add_fail_rate: 0.0,
            mgmt_loss_rate: 0.0,
            seed: 0,
            rss_key: DEFAULT_KEY,
            rules: DEFAULT_RULES,
        }
    }
}

/// An invalid configuration value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field at fault (`capacity`, `buckets`, `latency_ns`, ...).
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

fn cfg_err(field: &'static str, message: String) -> ConfigError {
    ConfigError { field, message }
}

fn check_rate(field: &'static str, r: f64) -> Result<(), ConfigError> {
    if r.is_finite() && (0.0..=1.0).contains(&r) {
        Ok(())
    } else {
        Err(cfg_err(
            field,
            format!("{r} is not a probability in [0, 1]"),
        ))
    }
}

fn check_latency(ns: u64) -> Result<(), ConfigError> {
    if ns <= MAX_LATENCY_NS {
        Ok(())
    } else {
        Err(cfg_err(
            "latency_ns",
            format!("{ns} exceeds {MAX_LATENCY_NS} (CAPS carries u32 microseconds)"),
        ))
    }
}

impl TableConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(cfg_err(
                "capacity",
                format!(
                    "{} is outside 1..={MAX_CAPACITY} (filter ids are 16-bit)",
                    self.capacity
                ),
            ));
        }
        if let Some((b, w)) = self.buckets {
            if b == 0 || b > MAX_BUCKETS {
                return Err(cfg_err(
                    "buckets",
                    format!("bucket count {b} is outside 1..={MAX_BUCKETS}"),
                ));
            }
            if w == 0 {
                return Err(cfg_err("buckets", "ways must be at least 1".to_string()));
            }
        }
        if self.rules > MAX_RULES {
            return Err(cfg_err(
                "rules",
                format!("{} rule locations exceed {MAX_RULES}", self.rules),
            ));
        }
        check_latency(self.latency_ns)?;
        check_rate("add_fail_rate", self.add_fail_rate)?;
        check_rate("mgmt_loss_rate", self.mgmt_loss_rate)?;
        Ok(())
    }
}

/// A request submitted to the table (the body of an ADD, DEL or FLUSH frame).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// ADD ops, applied in order.
    Add(Vec<AddOp>),
    /// DEL ops, applied in order.
    Del(Vec<DelOp>),
    /// FLUSH with its reason (filters only: rules stay).
    Flush(DelReason),
    /// RULE_SET ops, applied in order.
    RuleSet(Vec<crate::proto::RuleOp>),
    /// RULE_DEL: locations, in order.
    RuleDel(Vec<u32>),
    /// RSS_SET: its one op.
    RssSet(Box<RssSetOp>),
}

impl TryFrom<crate::proto::Message> for Request {
    type Error = crate::proto::Message;

    /// ADD, DEL, FLUSH, RULE_SET, RULE_DEL and RSS_SET become requests;
    /// any other message is given back.
    fn try_from(m: crate::proto::Message) -> Result<Self, Self::Error> {
        use crate::proto::Message;
        match m {
            Message::Add(ops) => Ok(Self::Add(ops)),
            Message::Del(ops) => Ok(Self::Del(ops)),
            Message::Flush(r) => Ok(Self::Flush(r)),
            Message::RuleSet(ops) => Ok(Self::RuleSet(ops)),
            Message::RuleDel(locs) => Ok(Self::RuleDel(locs)),
            Message::RssSet(op) => Ok(Self::RssSet(op)),
            other => Err(other),
        }
    }
}

impl Request {
    /// The message type it came in.
    pub const fn kind(&self) -> MsgType {
        match self {
            Self::Add(_) => MsgType::Add,
            Self::Del(_) => MsgType::Del,
            Self::Flush(_) => MsgType::Flush,
            Self::RuleSet(_) => MsgType::RuleSet,
            Self::RuleDel(_) => MsgType::RuleDel,
            Self::RssSet(_) => MsgType::RssSet,
        }
    }
}

/// Something the table did. Events of one request are reported in op order,
/// followed by its [`TableEvent::Completed`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TableEvent {
    /// A new filter.
    Added {
        /// Request sequence number.
        seq: u32,
        /// Filter id.
        id: u16,
        /// Rx queue.
        rxq: u16,
        /// Flow.
        flow: FlowKey,
    },
    /// An ADD replaced a live filter: the same id (re-steer or new flow), or
    /// the same flow under another id (`prev_id` != `id`).
    Replaced {
        /// Request sequence number.
        seq: u32,
        /// Filter id now holding `flow`.
        id: u16,
        /// Its rx queue.
        rxq: u16,
        /// Its flow.
        flow: FlowKey,
        /// Id of the replaced entry.
        prev_id: u16,
        /// Rx queue of the replaced entry.
        prev_rxq: u16,
        /// Flow of the replaced entry.
        prev_flow: FlowKey,
        /// Hits of the replaced entry.
        prev_hits: u64,
    },
    /// A filter was removed: by DEL, by FLUSH (one event per filter), or
    /// (reason `replaced`) because an ADD installed its flow under another id
    /// while that id was live with a different flow.
    Deleted {
        /// Request sequence number.
        seq: u32,
        /// Filter id.
        id: u16,
        /// Rx queue.
        rxq: u16,
        /// Flow.
        flow: FlowKey,
        /// Why.
        reason: DelReason,
        /// Packets it steered.
        hits: u64,
    },
    /// An ADD op was refused.
    Rejected {
        /// Request sequence number.
        seq: u32,
        /// Filter id of the op.
        id: u16,
        /// Rx queue of the op.
        rxq: u16,
        /// The op's flow (`None` for `bad_key`).
        flow: Option<FlowKey>,
        /// Why (never `ok`).
        status: OpStatus,
    },
    /// DEL of an id that is not live.
    UnknownDelete {
        /// Request sequence number.
        seq: u32,
        /// The id.
        id: u16,
        /// The DEL's reason.
        reason: DelReason,
    },
    /// A FLUSH ran (after one `Deleted` per filter).
    Flushed {
        /// Request sequence number.
        seq: u32,
        /// Its reason.
        reason: DelReason,
        /// Filters removed.
        count: u32,
    },
    /// [`FilterTable::clear`] dropped a filter (device reset / generation change).
    Evicted {
        /// Filter id.
        id: u16,
        /// Rx queue.
        rxq: u16,
        /// Flow.
        flow: FlowKey,
        /// Packets it steered.
        hits: u64,
    },
    /// [`FilterTable::clear`] ran (after one `Evicted` per filter).
    Cleared {
        /// Filters removed.
        count: u32,
        /// Pending requests discarded (never applied, never acknowledged).
        dropped_requests: u32,
    },
    /// A RULE_SET op installed a rule (replacing `prev` at its location).
    RuleSet {
        /// Request sequence number.
        seq: u32,
        /// The rule.
        rule: crate::Rule,
        /// The rule it replaced at that location.
        prev: Option<crate::Rule>,
    },
    /// A rule went: by a RULE_DEL op (`seq`), or by [`FilterTable::clear`]
    /// (`seq` None; before its `Cleared`).
    RuleRemoved {
        /// Request sequence number (a RULE_DEL's, or a FLUSH(unload)'s).
        seq: Option<u32>,
        /// The rule.
        rule: crate::Rule,
        /// What removed it.
        cause: ExtCause,
    },
    /// A RULE_SET or RULE_DEL op was refused.
    RuleRejected {
        /// Request sequence number.
        seq: u32,
        /// The op's location.
        loc: u32,
        /// Why: `table_full`, `bad_queue`, `bad_key`, `unknown_id` (no rule
        /// there), `bad_id` (past the locations).
        status: OpStatus,
    },
    /// An RSS_SET op was applied or refused, or [`FilterTable::clear`] put
    /// the device's RSS defaults back (before its `Cleared`; only when a
    /// driver had changed them).
    RssSet(Box<RssChange>),
    /// A request took effect: send its ACK now.
    Completed {
        /// Request sequence number.
        seq: u32,
        /// Request type.
        kind: MsgType,
        /// One status per op, in op order (empty for FLUSH).
        statuses: Vec<OpStatus>,
        /// When it was due (submission time + latency).
        due_ns: u64,
    },
}

/// What made a rule go or the RSS defaults come back
/// ([`TableEvent::RuleRemoved`], [`RssChange`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExtCause {
    /// The driver's own op (RULE_DEL, RSS_SET).
    #[default]
    Op,
    /// A new generation (device reset, reconnect): `seq` is None.
    Reset,
    /// A FLUSH with reason `unload`: the driver that set them is gone
    /// (`seq` is the FLUSH's).
    Unload,
}

impl ExtCause {
    /// The trace's `reason` of a `rule_del` line.
    pub const fn rule_reason(self) -> &'static str {
        match self {
            Self::Op => "rule_del",
            Self::Reset => "reset",
            Self::Unload => "unload",
        }
    }

    /// The trace's `reason` of an `rss_set` line (none for an op's).
    pub const fn rss_reason(self) -> Option<&'static str> {
        match self {
            Self::Op => None,
            Self::Reset => Some("reset"),
            Self::Unload => Some("unload"),
        }
    }
}

/// What [`TableEvent::RssSet`] reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssChange {
    /// The RSS_SET's sequence number; None: a new generation put the
    /// defaults back ([`FilterTable::clear`]).
    pub seq: Option<u32>,
    /// `ok`, or why the op was refused (`bad_key`, `bad_queue`; nothing
    /// changed then).
    pub status: OpStatus,
    /// The op as it came (for a new generation: the op asking for the
    /// defaults).
    pub op: RssSetOp,
    /// Why, when not by an op of its own (`reset`, `unload`).
    #[serde(default)]
    pub cause: ExtCause,
}

impl RssChange {
    /// The RSS configuration in effect after it, or None when the op was
    /// refused (the one before stays).
    pub fn config(&self) -> Option<RssConfig> {
        (self.status == OpStatus::Ok).then(|| self.op.asked())
    }
}

/// A live filter, as dumped by [`FilterTable::entries`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Filter id.
    pub id: u16,
    /// Rx queue.
    pub rxq: u16,
    /// Flow.
    pub flow: FlowKey,
    /// Packets it steered.
    pub hits: u64,
    /// Time of the last hit (`None` before the first).
    pub last_hit_ns: Option<u64>,
    /// When it took effect.
    pub installed_ns: u64,
    /// Its placement bucket (with a placement model).
    pub bucket: Option<u32>,
}

/// Deletions by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonCounts {
    /// `expired`.
    pub expired: u64,
    /// `idle`.
    pub idle: u64,
    /// `replaced`.
    pub replaced: u64,
    /// `flush`.
    pub flush: u64,
    /// `unload`.
    pub unload: u64,
    /// `aged`.
    pub aged: u64,
}

impl ReasonCounts {
    fn bump(&mut self, r: DelReason, n: u64) {
        match r {
            DelReason::Expired => self.expired += n,
            DelReason::Idle => self.idle += n,
            DelReason::Replaced => self.replaced += n,
            DelReason::Flush => self.flush += n,
            DelReason::Unload => self.unload += n,
            DelReason::Aged => self.aged += n,
        }
    }

    /// The count for one reason.
    pub const fn get(&self, r: DelReason) -> u64 {
        match r {
            DelReason::Expired => self.expired,
            DelReason::Idle => self.idle,
            DelReason::Replaced => self.replaced,
            DelReason::Flush => self.flush,
            DelReason::Unload => self.unload,
            DelReason::Aged => self.aged,
        }
    }

    /// Sum over reasons.
    pub const fn total(&self) -> u64 {
        self.expired + self.idle + self.replaced + self.flush + self.unload + self.aged
    }
}

/// Rejected ADD ops by status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectCounts {
    /// `table_full`.
    pub table_full: u64,
    /// `bucket_full`.
    pub bucket_full: u64,
    /// `bad_queue`.
    pub bad_queue: u64,
    /// `bad_key`.
    pub bad_key: u64,
    /// `injected_failure`.
    pub injected_failure: u64,
    /// `bad_id`.
    pub bad_id: u64,
}

impl RejectCounts {
    fn bump(&mut self, s: OpStatus) {
        match s {
            OpStatus::TableFull => self.table_full += 1,
            OpStatus::BucketFull => self.bucket_full += 1,
            OpStatus::BadQueue => self.bad_queue += 1,
            OpStatus::BadKey => self.bad_key += 1,
            OpStatus::InjectedFailure => self.injected_failure += 1,
            OpStatus::BadId => self.bad_id += 1,
            OpStatus::Ok | OpStatus::UnknownId => {}
        }
    }

    /// Sum over statuses.
    pub const fn total(&self) -> u64 {
        self.table_full
            + self.bucket_full
            + self.bad_queue
            + self.bad_key
            + self.injected_failure
            + self.bad_id
    }
}

/// The table's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// ADD ops that installed a new filter.
    pub adds: u64,
    /// ADD ops that replaced a live filter.
    pub replaces: u64,
    /// ADD ops identical to the live entry (same id, flow and rxq): status
    /// ok, nothing changed, no event. A driver that lost every ACK of an
    /// applied ADD and sends it again after a new HELLO lands here, so
    /// `adds + replaces` counts each change once.
    #[serde(default)]
    pub unchanged: u64,
    /// Filters removed, by reason (DEL ops, FLUSH, flows moved to another id).
    pub deletes: ReasonCounts,
    /// ADD ops refused, by status.
    pub rejects: RejectCounts,
    /// DEL ops of ids that were not live.
    pub unknown_deletes: u64,
    /// FLUSH requests applied.
    pub flushes: u64,
    /// [`FilterTable::clear`] calls (generation changes).
    pub resets: u64,
    /// Requests applied.
    pub requests: u64,
    /// Lookups that found a filter.
    pub lookup_hits: u64,
    /// Lookups that found none.
    pub lookup_misses: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Meta {
    hits: u64,
    last_hit_ns: Option<u64>,
    installed_ns: u64,
    bucket: u32,
}

#[derive(Clone, Debug)]
struct Pending {
    due_ns: u64,
    seq: u32,
    req: Request,
}

/// The authoritative filter table. See the module docs.
#[derive(Clone, Debug)]
pub struct FilterTable {
    cfg: TableConfig,
    toeplitz: Toeplitz,
    index: FlowIndex<u16>,
    meta: Box<[Meta]>,
    bucket_fill: Vec<u16>,
    pending: VecDeque<Pending>,
    last_due: u64,
    fail_rng: SplitMix64,
    loss_rng: SplitMix64,
    counters: Counters,
    version: u64,
    /// The masked rule stage (hits are the daemon's: its workers count).
    rules: crate::RuleSet,
    /// What the driver's RSS_SET asked for (the default until one did).
    rss: RssConfig,
    /// The device's queue pairs: an RSS_SET entry at or past it is
    /// `bad_queue` ([`FilterTable::set_queue_pairs`]).
    queue_pairs: u16,
}

const LOSS_STREAM: u64 = 0x6c6f_7373_5f72_6e67;

impl FilterTable {
    /// An empty table; fails on an invalid configuration.
    pub fn new(cfg: TableConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let buckets = cfg.buckets.map_or(0, |(b, _)| b as usize);
        Ok(Self {
            toeplitz: Toeplitz::new(cfg.rss_key),
            index: FlowIndex::new(cfg.capacity as usize),
            meta: vec![Meta::default(); usize::from(MAX_FILTER_ID) + 1].into_boxed_slice(),
            bucket_fill: vec![0; buckets],
            pending: VecDeque::new(),
            last_due: 0,
            fail_rng: SplitMix64::new(cfg.seed),
            loss_rng: SplitMix64::new(cfg.seed ^ LOSS_STREAM),
            counters: Counters::default(),
            version: 0,
            rules: crate::RuleSet::new(cfg.rules),
            rss: RssConfig::default(),
            queue_pairs: u16::MAX,
            cfg,
        })
    }

    /// The device's queue pairs (CAPS `max_queue_pairs`): an RSS_SET
    /// indirection entry at or past it is refused with `bad_queue`. Until
    /// set, any entry below 0xFFFF is taken.
    pub fn set_queue_pairs(&mut self, n: u16) {
        self.queue_pairs = n;
    }

    /// The RSS configuration the driver set (the default until an RSS_SET
    /// changed it, and again after [`Self::clear`]).
    pub fn rss(&self) -> &RssConfig {
        &self.rss
    }

    /// The configuration (with the current knob values).
    pub fn config(&self) -> &TableConfig {
        &self.cfg
    }

    /// Capacity.
    pub fn capacity(&self) -> u32 {
        self.cfg.capacity
    }

    /// Live filters.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no filter is live.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Requests submitted and not yet applied.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Changes the programming latency for requests submitted from now on.
    /// Requests never overtake each other: one submitted later is due no
    /// earlier than the one before it.
    pub fn set_latency_ns(&mut self, ns: u64) -> Result<(), ConfigError> {
        check_latency(ns)?;
        self.cfg.latency_ns = ns;
        Ok(())
    }

    /// Changes the ADD failure probability.
    pub fn set_add_fail_rate(&mut self, p: f64) -> Result<(), ConfigError> {
        check_rate("add_fail_rate", p)?;
        self.cfg.add_fail_rate = p;
        Ok(())
    }

    /// Changes the management-frame loss probability.
    pub fn set_mgmt_loss_rate(&mut self, p: f64) -> Result<(), ConfigError> {
        check_rate("mgmt_loss_rate", p)?;
        self.cfg.mgmt_loss_rate = p;
        Ok(())
    }

    /// Changes the capacity and the placement model of an empty table (no
    /// live filter, no pending request); the counters are kept. Fails
    /// without changing anything on an invalid geometry or when the table
    /// is not empty (a real device cannot re-partition a table in use
    /// either).
    pub fn reshape(
        &mut self,
        capacity: u32,
        buckets: Option<(u32, u16)>,
    ) -> Result<(), ConfigError> {
        let mut cfg = self.cfg.clone();
        cfg.capacity = capacity;
        cfg.buckets = buckets;
        cfg.validate()?;
        if !self.is_empty() || !self.pending.is_empty() {
            let field = if capacity == self.cfg.capacity {
                "buckets"
            } else {
                "capacity"
            };
            return Err(cfg_err(
                field,
                format!(
                    "the table is in use ({} live filters, {} pending requests): it can only change while empty",
                    self.len(),
                    self.pending.len()
                ),
            ));
        }
        self.index = FlowIndex::new(capacity as usize);
        self.bucket_fill = vec![0; buckets.map_or(0, |(b, _)| b as usize)];
        self.cfg = cfg;
        Ok(())
    }

    /// Reseeds both fault-injection streams.
    pub fn reseed(&mut self, seed: u64) {
        self.cfg.seed = seed;
        self.fail_rng = SplitMix64::new(seed);
        self.loss_rng = SplitMix64::new(seed ^ LOSS_STREAM);
    }

    /// One draw of the management-frame loss knob: `true` means drop the
    /// frame. Deterministic under the seed (its own stream, independent of
    /// the ADD-failure draws).
    pub fn mgmt_loss(&mut self) -> bool {
        self.loss_rng.chance(self.cfg.mgmt_loss_rate)
    }

    /// Queues a request received at `now_ns`; it takes effect at
    /// `max(now_ns + latency, due time of the previous request)`.
    /// Returns that due time.
    pub fn submit(&mut self, now_ns: u64, seq: u32, req: Request) -> u64 {
        let due = now_ns
            .saturating_add(self.cfg.latency_ns)
            .max(self.last_due);
        self.last_due = due;
        self.pending.push_back(Pending {
            due_ns: due,
            seq,
            req,
        });
        due
    }

    /// Like [`Self::submit`], but refuses the request (returning it) when
    /// [`MAX_PENDING_REQUESTS`] are already waiting: a guest that streams
    /// requests faster than the programming latency drains them cannot grow
    /// the queue without bound. The caller drops the frame (the driver
    /// retransmits it) and counts it.
    pub fn try_submit(&mut self, now_ns: u64, seq: u32, req: Request) -> Result<u64, Request> {
        if self.pending.len() >= MAX_PENDING_REQUESTS {
            return Err(req);
        }
        Ok(self.submit(now_ns, seq, req))
    }

    /// Due time of the oldest pending request.
    pub fn next_due(&self) -> Option<u64> {
        self.pending.front().map(|p| p.due_ns)
    }

    /// Applies every request due at `now_ns`, in submission order, with
    /// `enabled_queues` rx queues enabled, reporting through `on_event`.
    /// Returns the number of requests applied.
    pub fn advance(
        &mut self,
        now_ns: u64,
        enabled_queues: u16,
        on_event: &mut impl FnMut(TableEvent),
    ) -> usize {
        let mut n = 0;
        while self.pending.front().is_some_and(|p| p.due_ns <= now_ns) {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            self.apply(p, enabled_queues, on_event);
            n += 1;
        }
        n
    }

    /// Applies a request immediately (ignoring latency and anything pending).
    /// Returns its per-op statuses; events go to `on_event`, including the
    /// `Completed`.
    pub fn apply_now(
        &mut self,
        now_ns: u64,
        seq: u32,
        req: Request,
        enabled_queues: u16,
        on_event: &mut impl FnMut(TableEvent),
    ) -> Vec<OpStatus> {
        let mut statuses = Vec::new();
        self.apply(
            Pending {
                due_ns: now_ns,
                seq,
                req,
            },
            enabled_queues,
            &mut |e| {
                if let TableEvent::Completed { statuses: s, .. } = &e {
                    statuses.clone_from(s);
                }
                on_event(e);
            },
        );
        statuses
    }

    fn apply(&mut self, p: Pending, enabled: u16, on_event: &mut impl FnMut(TableEvent)) {
        self.counters.requests += 1;
        let kind = p.req.kind();
        let statuses = match p.req {
            Request::Add(ops) => ops
                .iter()
                .map(|op| self.apply_add(op, p.seq, p.due_ns, enabled, on_event))
                .collect(),
            Request::Del(ops) => ops
                .iter()
                .map(|op| self.apply_del(*op, p.seq, on_event))
                .collect(),
            Request::Flush(reason) => {
                self.flush(p.seq, reason, on_event);
                Vec::new()
            }
            Request::RuleSet(ops) => ops
                .iter()
                .map(|op| self.apply_rule_set(op, p.seq, enabled, on_event))
                .collect(),
            Request::RuleDel(locs) => locs
                .iter()
                .map(|&loc| self.apply_rule_del(loc, p.seq, on_event))
                .collect(),
            Request::RssSet(op) => vec![self.apply_rss_set(&op, p.seq, on_event)],
        };
        on_event(TableEvent::Completed {
            seq: p.seq,
            kind,
            statuses,
            due_ns: p.due_ns,
        });
    }

    fn apply_rule_set(
        &mut self,
        op: &crate::proto::RuleOp,
        seq: u32,
        enabled: u16,
        on_event: &mut impl FnMut(TableEvent),
    ) -> OpStatus {
        // RSS contexts other than the default one do not exist yet.
        let rule = op
            .rule()
            .filter(|r| !matches!(r.action, crate::RuleAction::Context { ctx, .. } if ctx != 0));
        let res = rule
            .ok_or(crate::RuleError::BadKey)
            .and_then(|r| self.rules.insert(r, enabled).map(|prev| (r, prev)));
        match res {
            Ok((rule, prev)) => {
                on_event(TableEvent::RuleSet {
                    seq,
                    rule,
                    prev: prev.map(|p| p.0),
                });
                OpStatus::Ok
            }
            Err(e) => {
                let status = rule_status(e);
                on_event(TableEvent::RuleRejected {
                    seq,
                    loc: op.loc,
                    status,
                });
                status
            }
        }
    }

    /// An RSS_SET op: applied whole or refused whole (PROTOCOL.md, "The
    /// RSS extension"); reported either way.
    fn apply_rss_set(
        &mut self,
        op: &RssSetOp,
        seq: u32,
        on_event: &mut impl FnMut(TableEvent),
    ) -> OpStatus {
        let status = match op.config(self.queue_pairs) {
            Ok(c) => {
                self.rss = c;
                self.version += 1;
                OpStatus::Ok
            }
            Err(s) => s,
        };
        on_event(TableEvent::RssSet(Box::new(RssChange {
            seq: Some(seq),
            status,
            op: *op,
            cause: ExtCause::Op,
        })));
        status
    }

    fn apply_rule_del(
        &mut self,
        loc: u32,
        seq: u32,
        on_event: &mut impl FnMut(TableEvent),
    ) -> OpStatus {
        match self.rules.remove(loc) {
            Ok((rule, _)) => {
                on_event(TableEvent::RuleRemoved {
                    seq: Some(seq),
                    rule,
                    cause: ExtCause::Op,
                });
                OpStatus::Ok
            }
            Err(e) => {
                let status = rule_status(e);
                on_event(TableEvent::RuleRejected { seq, loc, status });
                status
            }
        }
    }

    /// The rules installed, by location.
    pub fn rules(&self) -> impl Iterator<Item = &crate::Rule> {
        self.rules.iter().map(|(r, _)| r)
    }

    fn bucket_of(&self, key: &FlowKey) -> Option<usize> {
        self.cfg
            .buckets
            .map(|(b, _)| (self.toeplitz.hash_flow(key) % b) as usize)
    }

    fn reject(
        &mut self,
        seq: u32,
        op: &AddOp,
        flow: Option<FlowKey>,
        status: OpStatus,
        on_event: &mut impl FnMut(TableEvent),
    ) -> OpStatus {
        self.counters.rejects.bump(status);
        on_event(TableEvent::Rejected {
            seq,
            id: op.id,
            rxq: op.rxq,
            flow,
            status,
        });
        status
    }

    /// Removes a live id from index, meta and bucket fill; returns (flow, rxq, hits).
    fn unlink(&mut self, id: u16) -> Option<(FlowKey, u16, u64)> {
        let (flow, rxq) = self.index.remove_by_id(id)?;
        let m = self.meta[usize::from(id)];
        if self.cfg.buckets.is_some() {
            self.bucket_fill[m.bucket as usize] -= 1;
        }
        self.version += 1;
        Some((flow, rxq, m.hits))
    }

    fn apply_add(
        &mut self,
        op: &AddOp,
        seq: u32,
        now: u64,
        enabled: u16,
        on_event: &mut impl FnMut(TableEvent),
    ) -> OpStatus {
        if op.id > MAX_FILTER_ID {
            return self.reject(seq, op, op.key(), OpStatus::BadId, on_event);
        }
        let Some(key) = op.key() else {
            return self.reject(seq, op, None, OpStatus::BadKey, on_event);
        };
        if op.rxq >= enabled {
            return self.reject(seq, op, Some(key), OpStatus::BadQueue, on_event);
        }
        let cur = self.index.get(op.id);
        let other = self.index.lookup(&key).filter(|&(oid, _)| oid != op.id);
        if cur.is_none() && other.is_none() && self.index.len() >= self.cfg.capacity as usize {
            return self.reject(seq, op, Some(key), OpStatus::TableFull, on_event);
        }
        let bucket = self.bucket_of(&key);
        if let (Some(b), Some((_, ways))) = (bucket, self.cfg.buckets) {
            let mut fill = self.bucket_fill[b];
            // The same flow under another id lives in this bucket and goes away.
            if other.is_some() {
                fill -= 1;
            }
            // The entry currently under this id goes away too.
            if cur.is_some() && self.meta[usize::from(op.id)].bucket as usize == b {
                fill -= 1;
            }
            if fill >= ways {
                return self.reject(seq, op, Some(key), OpStatus::BucketFull, on_event);
            }
        }
        // One draw per ADD op that would otherwise succeed.
        if self.fail_rng.chance(self.cfg.add_fail_rate) {
            return self.reject(seq, op, Some(key), OpStatus::InjectedFailure, on_event);
        }
        if other.is_none() && cur == Some((key, op.rxq)) {
            self.counters.unchanged += 1;
            return OpStatus::Ok;
        }
        let keep_hits = matches!(cur, Some((f, _)) if f == key);
        let prev_meta = self.meta[usize::from(op.id)];
        match (cur, other) {
            (None, None) => {
                self.counters.adds += 1;
                on_event(TableEvent::Added {
                    seq,
                    id: op.id,
                    rxq: op.rxq,
                    flow: key,
                });
            }
            (Some(_), other) => {
                if let Some((oid, _)) = other {
                    let (flow, rxq, hits) = self.unlink(oid).expect("other id is live");
                    self.counters.deletes.bump(DelReason::Replaced, 1);
                    on_event(TableEvent::Deleted {
                        seq,
                        id: oid,
                        rxq,
                        flow,
                        reason: DelReason::Replaced,
                        hits,
                    });
                }
                let (pflow, prxq, phits) = self.unlink(op.id).expect("id is live");
                self.counters.replaces += 1;
                on_event(TableEvent::Replaced {
                    seq,
                    id: op.id,
                    rxq: op.rxq,
                    flow: key,
                    prev_id: op.id,
                    prev_rxq: prxq,
                    prev_flow: pflow,
                    prev_hits: phits,
                });
            }
            (None, Some((oid, _))) => {
                let (pflow, prxq, phits) = self.unlink(oid).expect("other id is live");
                self.counters.replaces += 1;
                on_event(TableEvent::Replaced {
                    seq,
                    id: op.id,
                    rxq: op.rxq,
                    flow: key,
                    prev_id: oid,
                    prev_rxq: prxq,
                    prev_flow: pflow,
                    prev_hits: phits,
                });
            }
        }
        self.index
            .insert(key, op.id, op.rxq)
            .expect("room was checked");
        if let Some(b) = bucket {
            self.bucket_fill[b] += 1;
        }
        self.meta[usize::from(op.id)] = if keep_hits {
            Meta {
                bucket: bucket.unwrap_or(0) as u32,
                ..prev_meta
            }
        } else {
            Meta {
                hits: 0,
                last_hit_ns: None,
                installed_ns: now,
                bucket: bucket.unwrap_or(0) as u32,
            }
        };
        self.version += 1;
        OpStatus::Ok
    }

    fn apply_del(
        &mut self,
        op: DelOp,
        seq: u32,
        on_event: &mut impl FnMut(TableEvent),
    ) -> OpStatus {
        if let Some((flow, rxq, hits)) = self.unlink(op.id) {
            self.counters.deletes.bump(op.reason, 1);
            on_event(TableEvent::Deleted {
                seq,
                id: op.id,
                rxq,
                flow,
                reason: op.reason,
                hits,
            });
            OpStatus::Ok
        } else {
            self.counters.unknown_deletes += 1;
            on_event(TableEvent::UnknownDelete {
                seq,
                id: op.id,
                reason: op.reason,
            });
            OpStatus::UnknownId
        }
    }

    /// Removes every rule and puts the RSS defaults back (a new generation,
    /// or the FLUSH(unload) of a driver that is going away): one
    /// `RuleRemoved` per rule, then one `RssSet` when the driver had
    /// changed the defaults.
    fn drop_driver_config(
        &mut self,
        seq: Option<u32>,
        cause: ExtCause,
        on_event: &mut impl FnMut(TableEvent),
    ) {
        for (rule, _) in self.rules.clear() {
            on_event(TableEvent::RuleRemoved { seq, rule, cause });
        }
        if !self.rss.is_default() {
            self.rss = RssConfig::default();
            on_event(TableEvent::RssSet(Box::new(RssChange {
                seq,
                status: OpStatus::Ok,
                op: RssSetOp::new(&self.rss),
                cause,
            })));
        }
    }

    fn flush(&mut self, seq: u32, reason: DelReason, on_event: &mut impl FnMut(TableEvent)) {
        if reason == DelReason::Unload {
            // the driver that set the rules and the RSS configuration is
            // going away: nobody is left to see or remove them
            self.drop_driver_config(Some(seq), ExtCause::Unload, on_event);
        }
        let count = self.drain_all(&mut |id, rxq, flow, hits| {
            on_event(TableEvent::Deleted {
                seq,
                id,
                rxq,
                flow,
                reason,
                hits,
            });
        });
        self.counters.deletes.bump(reason, u64::from(count));
        self.counters.flushes += 1;
        on_event(TableEvent::Flushed { seq, reason, count });
    }

    /// Empties index, buckets and meta, calling `f(id, rxq, flow, hits)` per
    /// filter in id order.
    fn drain_all(&mut self, f: &mut impl FnMut(u16, u16, FlowKey, u64)) -> u32 {
        let mut live: Vec<(u16, u16, FlowKey)> =
            self.index.iter().map(|(k, id, rxq)| (id, rxq, k)).collect();
        live.sort_unstable_by_key(|e| e.0);
        for &(id, rxq, flow) in &live {
            f(id, rxq, flow, self.meta[usize::from(id)].hits);
            self.meta[usize::from(id)] = Meta::default();
        }
        self.index.clear();
        self.bucket_fill.fill(0);
        self.version += 1;
        live.len() as u32
    }

    /// Empties the table for a device reset / generation change: one
    /// `Evicted` per filter, then `Cleared`. Pending requests are discarded
    /// (the driver replays its table after the new generation's HELLO).
    /// Counters are kept (`resets` counts the calls).
    pub fn clear(&mut self, on_event: &mut impl FnMut(TableEvent)) {
        let dropped = self.pending.len() as u32;
        self.pending.clear();
        self.last_due = 0;
        let count = self.drain_all(&mut |id, rxq, flow, hits| {
            on_event(TableEvent::Evicted {
                id,
                rxq,
                flow,
                hits,
            });
        });
        self.drop_driver_config(None, ExtCause::Reset, on_event);
        self.counters.resets += 1;
        on_event(TableEvent::Cleared {
            count,
            dropped_requests: dropped,
        });
    }

    /// Looks a flow up in the applied state: `(filter id, rx queue)`.
    /// Does not count (see [`Self::lookup_counted`]).
    #[inline]
    pub fn lookup(&self, key: &FlowKey) -> Option<(u16, u16)> {
        self.index.lookup(key)
    }

    /// Looks a flow up, counting the hit or miss and recording one hit on
    /// the filter at `now_ns` (single-threaded use).
    pub fn lookup_counted(&mut self, key: &FlowKey, now_ns: u64) -> Option<(u16, u16)> {
        let r = self.index.lookup(key);
        match r {
            Some((id, _)) => {
                self.counters.lookup_hits += 1;
                self.record_hits(id, 1, now_ns);
            }
            None => self.counters.lookup_misses += 1,
        }
        r
    }

    /// Adds lookup counts made elsewhere (worker replicas).
    pub fn add_lookup_counts(&mut self, hits: u64, misses: u64) {
        self.counters.lookup_hits += hits;
        self.counters.lookup_misses += misses;
    }

    /// Adds `n` hits to filter `id` with last-hit time `now_ns`; returns
    /// false (and records nothing) when `id` is not live.
    pub fn record_hits(&mut self, id: u16, n: u64, now_ns: u64) -> bool {
        if !self.index.contains_id(id) {
            return false;
        }
        let m = &mut self.meta[usize::from(id)];
        m.hits += n;
        m.last_hit_ns = Some(m.last_hit_ns.map_or(now_ns, |t| t.max(now_ns)));
        true
    }

    /// One live filter.
    pub fn entry(&self, id: u16) -> Option<Entry> {
        let (flow, rxq) = self.index.get(id)?;
        let m = self.meta[usize::from(id)];
        Some(Entry {
            id,
            rxq,
            flow,
            hits: m.hits,
            last_hit_ns: m.last_hit_ns,
            installed_ns: m.installed_ns,
            bucket: self.cfg.buckets.map(|_| m.bucket),
        })
    }

    /// Every live filter, by id.
    pub fn entries(&self) -> Vec<Entry> {
        let mut ids: Vec<u16> = self.index.iter().map(|(_, id, _)| id).collect();
        ids.sort_unstable();
        ids.into_iter().filter_map(|id| self.entry(id)).collect()
    }

    /// Filters in bucket `b` (0 without a placement model).
    pub fn bucket_fill(&self, b: u32) -> u16 {
        self.bucket_fill.get(b as usize).copied().unwrap_or(0)
    }

    /// The placement bucket of a flow, with a placement model.
    pub fn bucket_for(&self, key: &FlowKey) -> Option<u32> {
        self.bucket_of(key).map(|b| b as u32)
    }

    /// The CAPS body describing this table, for a device with
    /// `max_queue_pairs` queue pairs of which `enabled_queue_pairs` are
    /// enabled (`max_ops` is [`DEFAULT_MAX_OPS`](crate::proto::DEFAULT_MAX_OPS),
    /// latency rounded up to whole microseconds).
    pub fn caps(&self, max_queue_pairs: u16, enabled_queue_pairs: u16) -> crate::proto::Caps {
        let (buckets, ways) = self.cfg.buckets.unwrap_or((0, 0));
        crate::proto::Caps {
            max_queue_pairs,
            enabled_queue_pairs,
            capacity: self.cfg.capacity,
            buckets,
            ways,
            max_ops: crate::proto::DEFAULT_MAX_OPS,
            latency_us: self.cfg.latency_ns.div_ceil(1000) as u32,
            nonce: 0,
            ext: None,
        }
    }

    /// The counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The applied state as a lookup index; clone it for a worker replica.
    pub fn index(&self) -> &FlowIndex<u16> {
        &self.index
    }

    /// Bumped on every change of the applied state (replicas compare it).
    pub fn version(&self) -> u64 {
        self.version
    }
}

impl FlowIndex<u16> {
    /// Applies a [`TableEvent`] to a replica, so that a replica fed every
    /// event of a table in order has the table's applied state. Returns
    /// whether the replica changed.
    pub fn apply(&mut self, ev: &TableEvent) -> bool {
        match ev {
            TableEvent::Added { id, rxq, flow, .. }
            | TableEvent::Replaced { id, rxq, flow, .. } => self.insert(*flow, *id, *rxq).is_ok(),
            TableEvent::Deleted { id, .. } | TableEvent::Evicted { id, .. } => {
                self.remove_by_id(*id).is_some()
            }
            TableEvent::Flushed { .. } | TableEvent::Cleared { .. } => {
                let changed = !self.is_empty();
                self.clear();
                changed
            }
            TableEvent::Rejected { .. }
            | TableEvent::UnknownDelete { .. }
            | TableEvent::RuleSet { .. }
            | TableEvent::RuleRemoved { .. }
            | TableEvent::RuleRejected { .. }
            | TableEvent::RssSet(_)
            | TableEvent::Completed { .. } => false,
        }
    }
}

/// A rule op's refusal as its ACK status.
const fn rule_status(e: crate::RuleError) -> OpStatus {
    match e {
        crate::RuleError::BadLocation => OpStatus::BadId,
        crate::RuleError::Full => OpStatus::TableFull,
        crate::RuleError::BadKey => OpStatus::BadKey,
        crate::RuleError::BadQueue => OpStatus::BadQueue,
        crate::RuleError::NoRule => OpStatus::UnknownId,
    }
}

impl crate::RuleSet {
    /// Applies a [`TableEvent`] to a replica of the table's rule stage (no
    /// checks: the table made them); returns whether the event was one of
    /// the rule stage's.
    pub fn apply(&mut self, ev: &TableEvent) -> bool {
        match ev {
            TableEvent::RuleSet { rule, .. } => {
                self.put(*rule);
                true
            }
            TableEvent::RuleRemoved { rule, .. } => {
                let _ = self.remove(rule.loc);
                true
            }
            TableEvent::RuleRejected { .. } => true,
            _ => false,
        }
    }
}

impl crate::Rss {
    /// Applies a [`TableEvent`] to a worker's RSS (the table checked the
    /// op); returns whether the event was an RSS one.
    pub fn apply(&mut self, ev: &TableEvent) -> bool {
        let TableEvent::RssSet(c) = ev else {
            return false;
        };
        if let Some(cfg) = c.config() {
            self.configure(&cfg);
        }
        true
    }
}
