//! Trace records: one JSON object per line, shape documented in
//! `aRFS/TRACE.md`.
//!
//! Every record has `ts_ns`, `event` and `gen`; the other fields appear only
//! when they apply (absent, never `null`). The daemon writes records with
//! `serde_json::to_writer` followed by a newline.

use serde::{Deserialize, Serialize};

use crate::flow::FlowKey;
use crate::proto::{DecodeError, Direction, MsgType, OpStatus};
use crate::table::TableEvent;

/// The `event` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A new filter ([`TableEvent::Added`]).
    Add,
    /// A filter replaced ([`TableEvent::Replaced`]).
    Replace,
    /// A filter removed ([`TableEvent::Deleted`]).
    Del,
    /// An ADD op refused ([`TableEvent::Rejected`]).
    Reject,
    /// DEL of an unknown id ([`TableEvent::UnknownDelete`]).
    UnknownDel,
    /// A FLUSH ([`TableEvent::Flushed`]).
    Flush,
    /// A filter dropped by a device reset ([`TableEvent::Evicted`]).
    Evict,
    /// The table was emptied by a reset ([`TableEvent::Cleared`]).
    Reset,
    /// A request took effect and was acknowledged ([`TableEvent::Completed`]).
    Ack,
    /// The device generation changed.
    GenChange,
    /// A malformed management frame.
    BadFrame,
    /// A management frame dropped.
    MgmtDrop,
    /// A rule installed at its location ([`TableEvent::RuleSet`]).
    RuleSet,
    /// A rule removed ([`TableEvent::RuleRemoved`]).
    RuleDel,
    /// A RULE_SET or RULE_DEL op refused ([`TableEvent::RuleRejected`]).
    RuleReject,
    /// An RSS_SET op applied or refused, or the RSS defaults put back by a
    /// new generation ([`TableEvent::RssSet`]).
    RssSet,
}

/// Why a management frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropCause {
    /// The loss knob fired.
    Loss,
    /// A request after the expected sequence number (go-back-N).
    OutOfOrder,
    /// A duplicate request (its ACK is re-sent when still known).
    Duplicate,
    /// A management frame arriving from the peer side.
    Spoofed,
    /// No room to deliver a device frame to the guest.
    NoBuffer,
}

impl DropCause {
    /// Lower-case name, as in the trace.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Loss => "loss",
            Self::OutOfOrder => "out_of_order",
            Self::Duplicate => "duplicate",
            Self::Spoofed => "spoofed",
            Self::NoBuffer => "no_buffer",
        }
    }
}

/// One trace line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Monotonic time in nanoseconds (the daemon's clock).
    pub ts_ns: u64,
    /// What happened.
    pub event: EventKind,
    /// Device generation.
    pub gen: u32,
    /// Sequence number of the request involved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u32>,
    /// Filter id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u16>,
    /// Rx queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rxq: Option<u16>,
    /// The flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowKey>,
    /// Replaced entry's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_id: Option<u16>,
    /// Replaced entry's rx queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_rxq: Option<u16>,
    /// Replaced entry's flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_flow: Option<FlowKey>,
    /// Packets the filter steered (for `replace`: of the replaced entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hits: Option<u64>,
    /// Reason / status / error name (see TRACE.md per event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Entry count (flush, reset, ack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Message type name (`ADD`...), for ack, bad_frame, mgmt_drop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg_type: Option<String>,
    /// Per-op statuses of an ack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statuses: Option<Vec<OpStatus>>,
    /// Previous generation (gen_change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_gen: Option<u32>,
    /// Offending field (bad_frame).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Offending op index (bad_frame).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<u16>,
    /// Frame direction (mgmt_drop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<Direction>,
    /// Pending requests discarded (reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u32>,
    /// A rule's location (rule_set, rule_del, rule_reject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loc: Option<u32>,
    /// The rule (rule_set, rule_del).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<crate::Rule>,
    /// The rule a rule_set replaced at its location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_rule: Option<crate::Rule>,
    /// An op's status (rss_set): `ok` or why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<OpStatus>,
    /// The RSS context of the op (rss_set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u32>,
    /// The op's `default_indir` flag (rss_set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_indir: Option<bool>,
    /// The op's `default_key` flag (rss_set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_key: Option<bool>,
    /// A Toeplitz key, 80 hex digits (rss_set: see TRACE.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// An indirection table, its 128 entries (rss_set: see TRACE.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub indir: Option<Vec<u16>>,
}

impl TraceRecord {
    /// A record with only `ts_ns`, `event` and `gen` set.
    pub const fn bare(ts_ns: u64, event: EventKind, gen: u32) -> Self {
        Self {
            ts_ns,
            event,
            gen,
            seq: None,
            id: None,
            rxq: None,
            flow: None,
            prev_id: None,
            prev_rxq: None,
            prev_flow: None,
            hits: None,
            reason: None,
            count: None,
            msg_type: None,
            statuses: None,
            prev_gen: None,
            field: None,
            op: None,
            dir: None,
            dropped: None,
            loc: None,
            rule: None,
            prev_rule: None,
            status: None,
            context: None,
            default_indir: None,
            default_key: None,
            key: None,
            indir: None,
        }
    }

    /// The record of a table event.
    pub fn from_event(ts_ns: u64, gen: u32, ev: &TableEvent) -> Self {
        match ev {
            TableEvent::RssSet(c) => Self::rss_set(ts_ns, gen, c),
            TableEvent::RuleSet { seq, rule, prev } => Self {
                seq: Some(*seq),
                loc: Some(rule.loc),
                rule: Some(*rule),
                prev_rule: *prev,
                ..Self::bare(ts_ns, EventKind::RuleSet, gen)
            },
            TableEvent::RuleRemoved { seq, rule, cause } => Self {
                seq: *seq,
                loc: Some(rule.loc),
                rule: Some(*rule),
                reason: Some(cause.rule_reason().to_string()),
                ..Self::bare(ts_ns, EventKind::RuleDel, gen)
            },
            TableEvent::RuleRejected { seq, loc, status } => Self {
                seq: Some(*seq),
                loc: Some(*loc),
                reason: Some(status.name().to_string()),
                ..Self::bare(ts_ns, EventKind::RuleReject, gen)
            },
            TableEvent::Added { seq, id, rxq, flow } => Self {
                seq: Some(*seq),
                id: Some(*id),
                rxq: Some(*rxq),
                flow: Some(*flow),
                ..Self::bare(ts_ns, EventKind::Add, gen)
            },
            TableEvent::Replaced {
                seq,
                id,
                rxq,
                flow,
                prev_id,
                prev_rxq,
                prev_flow,
                prev_hits,
            } => Self {
                seq: Some(*seq),
                id: Some(*id),
                rxq: Some(*rxq),
                flow: Some(*flow),
                prev_id: Some(*prev_id),
                prev_rxq: Some(*prev_rxq),
                prev_flow: Some(*prev_flow),
                hits: Some(*prev_hits),
                ..Self::bare(ts_ns, EventKind::Replace, gen)
            },
            TableEvent::Deleted {
                seq,
                id,
                rxq,
                flow,
                reason,
                hits,
            } => Self {
                seq: Some(*seq),
                id: Some(*id),
                rxq: Some(*rxq),
                flow: Some(*flow),
                hits: Some(*hits),
                reason: Some(reason.name().to_string()),
                ..Self::bare(ts_ns, EventKind::Del, gen)
            },
            TableEvent::Rejected {
                seq,
                id,
                rxq,
                flow,
                status,
            } => Self {
                seq: Some(*seq),
                id: Some(*id),
                rxq: Some(*rxq),
                flow: *flow,
                reason: Some(status.name().to_string()),
                ..Self::bare(ts_ns, EventKind::Reject, gen)
            },
            TableEvent::UnknownDelete { seq, id, reason } => Self {
                seq: Some(*seq),
                id: Some(*id),
                reason: Some(reason.name().to_string()),
                ..Self::bare(ts_ns, EventKind::UnknownDel, gen)
            },
            TableEvent::Flushed { seq, reason, count } => Self {
                seq: Some(*seq),
                reason: Some(reason.name().to_string()),
                count: Some(*count),
                ..Self::bare(ts_ns, EventKind::Flush, gen)
            },
            TableEvent::Evicted {
                id,
                rxq,
                flow,
                hits,
            } => Self {
                id: Some(*id),
                rxq: Some(*rxq),
                flow: Some(*flow),
                hits: Some(*hits),
                reason: Some("reset".to_string()),
                ..Self::bare(ts_ns, EventKind::Evict, gen)
            },
            TableEvent::Cleared {
                count,
                dropped_requests,
            } => Self {
                count: Some(*count),
                dropped: Some(*dropped_requests),
                reason: Some("reset".to_string()),
                ..Self::bare(ts_ns, EventKind::Reset, gen)
            },
            TableEvent::Completed {
                seq,
                kind,
                statuses,
                ..
            } => Self {
                seq: Some(*seq),
                msg_type: Some(kind.name().to_string()),
                count: Some(statuses.len() as u32),
                statuses: Some(statuses.clone()),
                ..Self::bare(ts_ns, EventKind::Ack, gen)
            },
        }
    }

    /// The line of an RSS_SET op or of the defaults a new generation put
    /// back (TRACE.md, `rss_set`): `key` is the key RSS hashes with after
    /// an applied op (the default key's with `default_key`), the op's as
    /// it came after a refused one; `indir` the driver's table after an
    /// applied op (none with `default_indir`: the device's round-robin
    /// table, which follows the enabled count), the op's as it came after
    /// a refused one.
    fn rss_set(ts_ns: u64, gen: u32, c: &crate::table::RssChange) -> Self {
        let op = &c.op;
        let (key, indir) = match c.config() {
            Some(cfg) => (cfg.key_or_default(), cfg.indirection),
            None => (op.key, Some(op.indirection)),
        };
        Self {
            seq: c.seq,
            reason: c.cause.rss_reason().map(str::to_string),
            status: Some(c.status),
            context: Some(op.context),
            default_indir: Some(op.default_indir()),
            default_key: Some(op.default_key()),
            key: Some(crate::rss::key_to_hex(&key)),
            indir: indir.map(|t| t.to_vec()),
            ..Self::bare(ts_ns, EventKind::RssSet, gen)
        }
    }

    /// A generation change (device reset, reconnect): `cause` is free text
    /// such as `start`, `reconnect`, `reset`, `queues`.
    pub fn gen_change(ts_ns: u64, prev_gen: u32, gen: u32, cause: &str) -> Self {
        Self {
            prev_gen: Some(prev_gen),
            reason: Some(cause.to_string()),
            ..Self::bare(ts_ns, EventKind::GenChange, gen)
        }
    }

    /// A malformed management frame (`reason` is the frame-error name).
    pub fn bad_frame(ts_ns: u64, gen: u32, err: &DecodeError) -> Self {
        Self {
            seq: err.nak_header().map(|h| h.seq),
            msg_type: err.header.map(|h| {
                MsgType::from_code(h.msg_type)
                    .map_or_else(|| h.msg_type.to_string(), |t| t.name().to_string())
            }),
            reason: Some(err.kind.name().to_string()),
            field: Some(err.field.to_string()),
            op: err.op,
            ..Self::bare(ts_ns, EventKind::BadFrame, gen)
        }
    }

    /// A management frame dropped.
    pub fn mgmt_drop(
        ts_ns: u64,
        gen: u32,
        dir: Direction,
        seq: Option<u32>,
        msg_type: Option<u8>,
        cause: DropCause,
    ) -> Self {
        Self {
            seq,
            msg_type: msg_type.map(|c| {
                MsgType::from_code(c).map_or_else(|| c.to_string(), |t| t.name().to_string())
            }),
            reason: Some(cause.name().to_string()),
            dir: Some(dir),
            ..Self::bare(ts_ns, EventKind::MgmtDrop, gen)
        }
    }
}
