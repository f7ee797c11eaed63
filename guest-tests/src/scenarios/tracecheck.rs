//! Issue 45, item 4: the trace against the guest.
//!
//! Three pure verdicts over snapshots, each returning findings that name
//! the flow (or the line) at fault:
//!
//! - [`guest_verdict`]: the trace's lines about each workload flow against
//!   the flow's path as the guest saw it (the agent's runs of datagrams
//!   per NAPI instance, so per rx queue, with their send stamps in the
//!   trace's clock): a REPLACE's `prev_rxq` is the queue the guest saw the
//!   flow on just before it; an ADD's or REPLACE's `rxq` the queue it saw
//!   the flow settle on after it; the `hits` a DEL, an evict or a REPLACE
//!   reports for the filter it ends agree with the datagrams the guest got
//!   on that filter's queue over the filter's life, within the datagrams
//!   in flight at either end ([`hits_in_flight`]).
//! - [`replay_verdict`]: the trace against its own history, replayed from
//!   the daemon's start (an empty table): `prev_id`/`prev_flow`/`prev_rxq`
//!   of a REPLACE, the `flow`/`rxq` of a DEL and an evict name the entry
//!   the earlier lines installed; an `unknown_del` names no live id; a
//!   `reset` counts the evicts before it and leaves nothing live; each
//!   `gen_change`'s `prev_gen` is the generation the one before set, and
//!   every table, ack and bad_frame line carries that generation; an
//!   `ack`'s `count` and `statuses` (in op order) agree with its request's
//!   lines; a `flush` counts the `del` lines of its seq and gives their
//!   reason; an `unknown_del`'s reason is a DEL reason; a `mgmt_drop`
//!   carries the generation of the last `gen_change` (or, within
//!   [`GEN_RACE_NS`] of it, the one before: a worker reads it unlocked).
//! - [`counts_verdict`]: the `gen_change` and `mgmt_drop` lines against the
//!   device's counters read before and after the trace; the module's count
//!   of generation changes, and its DELs the device acknowledged by reason
//!   and as unknown ids, against the lines the device wrote for them.
//! - [`planted_verdict`]: the `bad_frame` lines and the `mgmt_drop` lines
//!   of the malformed frames the guest sent (hostile-mgmt) against what
//!   each frame planted: reason, field, op, type and seq.
//!
//! Time tolerance: [`MOVE_SLACK_NS`] (the chance table's order row) around
//! each line's time, as in the order and effect checks.

use super::order::MOVE_SLACK_NS;
use super::workload::napi_queues;
use super::{Checks, Session, IFNAME};
use crate::harness::Result;
use crate::module::ModuleCounters;
use crate::proto::{Request, RxQueueNapi};
use arfs::proto::{DelReason, Direction};
use arfs::{EventKind, FlowKey, OpStatus, TraceRecord};
use std::collections::BTreeMap;

/// One run of a flow's datagrams on one rx queue (the agent's `PathSeg`
/// with its NAPI id mapped to the queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Seg {
    pub q: usize,
    pub first: u64,
    pub last: u64,
    pub n: u64,
}

/// A workload flow as the guest saw it.
#[derive(Debug, Clone)]
pub(super) struct GuestFlow {
    pub port: u16,
    pub key: FlowKey,
    /// Its runs, in arrival order.
    pub path: Vec<Seg>,
    /// The generator's rate for it (datagrams per second).
    pub pps: f64,
}

/// What a verdict found, and what it judged.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Verdict {
    pub findings: Vec<String>,
    /// Per field or rule: lines judged.
    pub checked: BTreeMap<&'static str, usize>,
    /// Lines the guest's data could not judge (the flow's path did not
    /// cover the line's time with room to spare).
    pub unjudged: usize,
}

impl Verdict {
    fn judged(&mut self, what: &'static str) {
        *self.checked.entry(what).or_default() += 1;
    }

    /// The check's line, passing or not.
    pub fn figures(&self, name: &str) -> String {
        let c: Vec<String> = self
            .checked
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        format!(
            "{name}: {} unjudged={} findings={}",
            c.join(" "),
            self.unjudged,
            self.findings.len()
        )
    }
}

/// Datagrams a flow sending `pps` per second may put on either side of a
/// filter's start or end without the device being wrong: those sent
/// within [`MOVE_SLACK_NS`] of each end, and one more per end for the
/// agent's NAPI attribution (a datagram read after a later one was queued
/// takes that one's NAPI id; README, chance table, row "trace: a filter's
/// hits against the guest's datagrams").
pub(super) fn hits_in_flight(pps: f64) -> u64 {
    2 * ((pps * MOVE_SLACK_NS as f64 / 1e9).ceil() as u64 + 1)
}

/// The queue the guest saw the flow on at send time `t`: the run holding
/// `t` with the most datagrams, else the last run before `t`.
fn queue_at(path: &[Seg], t: u64) -> Option<usize> {
    path.iter()
        .filter(|s| s.first <= t && t <= s.last)
        .max_by_key(|s| s.n)
        .or_else(|| path.iter().filter(|s| s.last < t).max_by_key(|s| s.last))
        .map(|s| s.q)
}

/// The guest's datagrams on queue `q` sent within `[a, b]` (a run that
/// straddles an end counts pro rata), or None when a run on `q` reaches
/// past either end by more than the slack: the flow was on `q` without
/// the filter too (RSS's queue is the filter's), and the two cannot be
/// told apart.
fn datagrams_on(path: &[Seg], q: usize, a: u64, b: u64) -> Option<u64> {
    let mut n = 0.0;
    for s in path
        .iter()
        .filter(|s| s.q == q && s.last >= a && s.first <= b)
    {
        if s.first + MOVE_SLACK_NS < a || s.last > b + MOVE_SLACK_NS {
            return None;
        }
        let (lo, hi) = (s.first.max(a), s.last.min(b));
        n += if s.last == s.first {
            s.n as f64
        } else {
            s.n as f64 * (hi - lo) as f64 / (s.last - s.first) as f64
        };
    }
    Some(n.round() as u64)
}

fn ms(t: u64) -> f64 {
    t as f64 / 1e6
}

/// A line's event as the trace names it, in capitals (ADD, REPLACE...).
fn kind(e: EventKind) -> String {
    format!("{e:?}").to_uppercase()
}

/// See the module's doc. `records`: the trace (any slice; a filter whose
/// installing line is not in it, or came more than the slack before the
/// flow's first datagram (an earlier workload's), has its hits unjudged).
pub(super) fn guest_verdict(records: &[TraceRecord], flows: &[GuestFlow]) -> Verdict {
    let mut v = Verdict::default();
    for f in flows {
        let (Some(start), Some(end)) = (
            f.path.iter().map(|s| s.first).min(),
            f.path.iter().map(|s| s.last).max(),
        ) else {
            continue;
        };
        // The lines about this flow's filters, in trace order.
        let lines: Vec<&TraceRecord> = records
            .iter()
            .filter(|r| {
                matches!(
                    r.event,
                    EventKind::Add | EventKind::Replace | EventKind::Del | EventKind::Evict
                ) && (r.flow == Some(f.key) || r.prev_flow == Some(f.key))
            })
            .collect();
        // Per filter id of this flow: (installed at, rxq).
        let mut life: BTreeMap<u16, (u64, u16)> = BTreeMap::new();
        for (i, r) in lines.iter().enumerate() {
            let t = r.ts_ns;
            let next = lines.get(i + 1).map_or(end, |n| n.ts_ns.min(end));
            let ours = r.flow == Some(f.key);
            // The filter this line ends, and the hits it reports for it.
            let ended = match r.event {
                EventKind::Replace => r
                    .prev_id
                    .zip(r.prev_rxq)
                    .filter(|_| r.prev_flow == Some(f.key)),
                EventKind::Del | EventKind::Evict if ours => r.id.zip(r.rxq),
                _ => None,
            };
            if let (Some((id, q)), Some(hits)) = (ended, r.hits) {
                match life.remove(&id) {
                    Some((t0, _)) if t0 + MOVE_SLACK_NS >= start => {
                        match datagrams_on(&f.path, usize::from(q), t0, t) {
                            Some(got) => {
                                v.judged("hits");
                                let tol = hits_in_flight(f.pps);
                                if got.abs_diff(hits) > tol {
                                    v.findings.push(format!(
                                        "flow :{}: the trace's {} at {:.1} ms says filter {id} on q{q} had {hits} hits since {:.1} ms; the guest got {got} datagrams on q{q} then (in flight: {tol})",
                                        f.port, kind(r.event), ms(t), ms(t0)
                                    ));
                                }
                            }
                            None => v.unjudged += 1,
                        }
                    }
                    _ => v.unjudged += 1,
                }
            }
            if r.event == EventKind::Replace && r.prev_flow == Some(f.key) && ours {
                // Where the guest saw the flow just before.
                match (
                    r.prev_rxq,
                    queue_at(&f.path, t.saturating_sub(MOVE_SLACK_NS)),
                ) {
                    (Some(p), Some(was)) if t >= start + MOVE_SLACK_NS => {
                        v.judged("prev_rxq");
                        if usize::from(p) != was {
                            v.findings.push(format!(
                                "flow :{}: the trace's REPLACE at {:.1} ms gives prev_rxq q{p}; the guest saw the flow on q{was} before it",
                                f.port,
                                ms(t)
                            ));
                        }
                    }
                    _ => v.unjudged += 1,
                }
            }
            if ours && matches!(r.event, EventKind::Add | EventKind::Replace) {
                if let (Some(id), Some(q)) = (r.id, r.rxq) {
                    life.insert(id, (t, q));
                }
                // Where the guest saw it settle, up to the next line.
                let at = next.saturating_sub(MOVE_SLACK_NS);
                match (r.rxq, queue_at(&f.path, at)) {
                    (Some(q), Some(now)) if at > t + MOVE_SLACK_NS => {
                        v.judged("rxq");
                        if usize::from(q) != now {
                            v.findings.push(format!(
                                "flow :{}: the trace's {} at {:.1} ms gives rxq q{q}; the guest saw the flow on q{now} after it",
                                f.port,
                                kind(r.event),
                                ms(t)
                            ));
                        }
                    }
                    _ => v.unjudged += 1,
                }
            }
        }
    }
    v
}

/// A flow's port for messages (its destination port: the guest's side).
fn port(k: Option<&FlowKey>) -> String {
    k.map_or("?".into(), |k| format!(":{}", k.dst_port()))
}

/// An entry for messages: `id N flow :P on qQ`.
fn entry_text(id: Option<u16>, e: Option<(Option<FlowKey>, Option<u16>)>) -> String {
    let opt = |x: Option<u16>| x.map_or("?".into(), |x| x.to_string());
    match e {
        Some((f, q)) => format!("id {} flow {} on q{}", opt(id), port(f.as_ref()), opt(q)),
        None => format!("no live id {}", opt(id)),
    }
}

/// See the module's doc. `records` must start at the daemon's start.
pub(super) fn replay_verdict(records: &[TraceRecord]) -> Verdict {
    let mut v = Verdict::default();
    let mut live: BTreeMap<u16, (Option<FlowKey>, Option<u16>)> = BTreeMap::new();
    let mut evicts = 0u32;
    let mut last_gen: Option<u32> = None;
    // The generation before the last change, and the change's time.
    let mut before_change: Option<(u32, u64)> = None;
    for (i, r) in records.iter().enumerate() {
        let entry = |id: Option<u16>| id.and_then(|id| live.get(&id).copied());
        // A table line is written under the management lock, as is a
        // generation change: it carries the generation of the last one.
        // (A worker's mgmt_drop line reads it without the lock.)
        if let (Some(g), false) = (
            last_gen,
            matches!(r.event, EventKind::GenChange | EventKind::MgmtDrop),
        ) {
            v.judged("gen");
            if r.gen != g {
                v.findings.push(format!(
                    "line {i}: {} carries gen {}; the last gen_change set {g}",
                    kind(r.event),
                    r.gen
                ));
            }
        }
        match r.event {
            EventKind::Add => {
                if let Some(id) = r.id {
                    live.insert(id, (r.flow, r.rxq));
                }
            }
            EventKind::Replace => {
                v.judged("replace prev_id/prev_flow/prev_rxq");
                if entry(r.prev_id) != Some((r.prev_flow, r.prev_rxq)) {
                    v.findings.push(format!(
                        "line {i}: REPLACE of flow {} names its predecessor {} (prev_rxq); the trace's own history has {}",
                        port(r.flow.as_ref()),
                        entry_text(r.prev_id, Some((r.prev_flow, r.prev_rxq))),
                        entry_text(r.prev_id, entry(r.prev_id))
                    ));
                }
                if let Some(p) = r.prev_id {
                    live.remove(&p);
                }
                if let Some(id) = r.id {
                    live.insert(id, (r.flow, r.rxq));
                }
            }
            EventKind::Del | EventKind::Evict => {
                v.judged("del/evict flow/rxq");
                if entry(r.id) != Some((r.flow, r.rxq)) {
                    v.findings.push(format!(
                        "line {i}: {} names {}; the trace's own history has {}",
                        kind(r.event),
                        entry_text(r.id, Some((r.flow, r.rxq))),
                        entry_text(r.id, entry(r.id))
                    ));
                }
                if let Some(id) = r.id {
                    live.remove(&id);
                }
                evicts += u32::from(r.event == EventKind::Evict);
            }
            EventKind::UnknownDel => {
                v.judged("unknown_del");
                if entry(r.id).is_some() {
                    v.findings.push(format!(
                        "line {i}: unknown_del of id {:?}, which the trace has live",
                        r.id
                    ));
                }
                v.judged("unknown_del reason");
                if !is_del_reason(r.reason.as_deref()) {
                    v.findings.push(format!(
                        "line {i}: unknown_del of id {:?} gives reason {:?}, no DEL reason",
                        r.id, r.reason
                    ));
                }
            }
            EventKind::Flush => flush_check(records, i, &mut v),
            EventKind::MgmtDrop => {
                if let Some(g) = last_gen {
                    v.judged("mgmt_drop gen");
                    let raced =
                        before_change.is_some_and(|(p, t)| r.gen == p && r.ts_ns < t + GEN_RACE_NS);
                    if r.gen != g && !raced {
                        v.findings.push(format!(
                            "line {i}: mgmt_drop ({:?}) carries gen {}; the last gen_change set {g}{}",
                            r.reason,
                            r.gen,
                            before_change.map_or(String::new(), |(p, t)| format!(
                                " at {:.1} ms (gen {p} before it)",
                                ms(t)
                            ))
                        ));
                    }
                }
            }
            EventKind::Reset => {
                v.judged("reset count");
                if r.count != Some(evicts) || !live.is_empty() {
                    v.findings.push(format!(
                        "line {i}: reset says {:?} filters removed; the trace evicted {evicts} and still has {} live",
                        r.count,
                        live.len()
                    ));
                }
                live.clear();
                evicts = 0;
            }
            EventKind::GenChange => {
                if let Some(g) = last_gen {
                    v.judged("prev_gen");
                    if r.prev_gen != Some(g) {
                        v.findings.push(format!(
                            "line {i}: gen_change gives prev_gen {:?}; the generation before was {g}",
                            r.prev_gen
                        ));
                    }
                }
                before_change = last_gen.map(|g| (g, r.ts_ns));
                last_gen = Some(r.gen);
                evicts = 0;
            }
            EventKind::Ack => ack_check(records, i, &mut v),
            _ => {}
        }
    }
    v
}

/// A `mgmt_drop` line written by a worker (a reply dropped for want of
/// buffers, a spoofed frame from the peer) reads the generation without
/// the management lock: within this long after a `gen_change` it may still
/// carry the generation before (a worker's pass over one batch takes
/// microseconds; 50 ms is the order check's slack, far above it).
pub(super) const GEN_RACE_NS: u64 = MOVE_SLACK_NS;

fn is_del_reason(r: Option<&str>) -> bool {
    (1..=6).any(|c| DelReason::from_code(c).map(DelReason::name) == r)
}

/// A `flush` line against the `del` lines of its seq right before it: its
/// `count` is their number and its `reason` theirs.
fn flush_check(records: &[TraceRecord], i: usize, v: &mut Verdict) {
    let r = &records[i];
    let dels: Vec<&TraceRecord> = records[..i]
        .iter()
        .rev()
        .filter(|l| !matches!(l.event, EventKind::MgmtDrop | EventKind::BadFrame))
        .take_while(|l| l.seq == r.seq && l.event == EventKind::Del)
        .collect();
    v.judged("flush count/reason");
    let wrong_reason = dels.iter().find(|l| l.reason != r.reason);
    if r.count != Some(dels.len() as u32)
        || wrong_reason.is_some()
        || !is_del_reason(r.reason.as_deref())
    {
        v.findings.push(format!(
            "line {i}: flush seq {:?} says {:?} filters, reason {:?}; its seq has {} del lines{}",
            r.seq,
            r.count,
            r.reason,
            dels.len(),
            wrong_reason.map_or(String::new(), |l| format!(
                ", one with reason {:?}",
                l.reason
            ))
        ));
    }
}

/// An ADD's or DEL's `ack` line against its request's lines (those with
/// its seq right before it): `count` is the number of statuses; for an
/// ADD, the refusals in op order are the `reject` lines' reasons in line
/// order, and there are no fewer `ok`s than `add`/`replace` lines (an ADD
/// that changes nothing is `ok` without a line); for a DEL, one `del` line
/// per `ok` and one `unknown_del` per `unknown_id`.
fn ack_check(records: &[TraceRecord], i: usize, v: &mut Verdict) {
    let r = &records[i];
    let (Some(seq), Some(st)) = (r.seq, r.statuses.as_ref()) else {
        return;
    };
    let ops: Vec<&TraceRecord> = records[..i]
        .iter()
        .rev()
        .filter(|l| !matches!(l.event, EventKind::MgmtDrop | EventKind::BadFrame))
        .take_while(|l| {
            l.seq == Some(seq)
                && matches!(
                    l.event,
                    EventKind::Add
                        | EventKind::Replace
                        | EventKind::Del
                        | EventKind::Reject
                        | EventKind::UnknownDel
                )
        })
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let n = |k: EventKind, reason: Option<&str>| {
        ops.iter()
            .filter(|l| l.event == k && reason.is_none_or(|x| l.reason.as_deref() != Some(x)))
            .count()
    };
    v.judged("ack count/statuses");
    let mut bad = r.count.map(|c| c as usize) != Some(st.len());
    match r.msg_type.as_deref() {
        Some("ADD") => bad |= !add_lines_match(st, &ops),
        Some("DEL") => {
            let oks = st.iter().filter(|s| **s == OpStatus::Ok).count();
            let unknown = st.iter().filter(|s| **s == OpStatus::UnknownId).count();
            bad |= oks != n(EventKind::Del, Some("replaced"))
                || unknown != n(EventKind::UnknownDel, None);
        }
        _ => {}
    }
    if bad {
        let kinds: Vec<String> = ops
            .iter()
            .map(|l| {
                format!(
                    "{:?}{}",
                    l.event,
                    l.reason
                        .as_deref()
                        .map_or(String::new(), |x| format!("({x})"))
                )
            })
            .collect();
        v.findings.push(format!(
            "line {i}: ack of {:?} seq {seq} gives count {:?} statuses {:?}; its request's lines are [{}]",
            r.msg_type,
            r.count,
            st.iter().map(|s| s.name()).collect::<Vec<_>>(),
            kinds.join(", ")
        ));
    }
}

/// An ADD request's statuses against its lines, op by op: an `ok` takes
/// the next `add` or `replace` line if there is one (an ADD that changes
/// nothing has none; the `del` of an id the op took over comes first and
/// is passed over), a refusal the next line, which must be a `reject` of
/// that reason; no line may be left.
fn add_lines_match(st: &[OpStatus], ops: &[&TraceRecord]) -> bool {
    let mut lines = ops.iter().filter(|l| l.event != EventKind::Del).peekable();
    for s in st {
        if *s == OpStatus::Ok {
            lines.next_if(|l| matches!(l.event, EventKind::Add | EventKind::Replace));
        } else if lines
            .next()
            .is_none_or(|l| l.event != EventKind::Reject || l.reason.as_deref() != Some(s.name()))
        {
            return false;
        }
    }
    lines.next().is_none()
}

/// Device counters a trace line kind stands for, read at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// `table.generation_changes` (the `gen_change` lines but `start`).
    pub gen_changes: u64,
    /// `mgmt.dropped_by_loss`: `mgmt_drop` to the device, `loss`.
    pub loss_to_device: u64,
    /// `mgmt.replies_dropped_by_loss`: to the driver, `loss`.
    pub loss_to_driver: u64,
    /// `mgmt.out_of_order`, `mgmt.duplicates`: to the device.
    pub out_of_order: u64,
    pub duplicate: u64,
    /// `peer.spoofed_mgmt_dropped`: to the driver, `spoofed`.
    pub spoofed: u64,
    /// `mgmt.replies_dropped_no_buffers`: to the driver, `no_buffer`.
    pub no_buffer: u64,
    /// `trace.dropped`: lines the writer could not take (then nothing is
    /// judged).
    pub trace_dropped: u64,
}

impl Counts {
    pub(super) fn of(s: &vnic_ctl_proto::Stats) -> Self {
        Self {
            gen_changes: s.table.generation_changes,
            loss_to_device: s.mgmt.dropped_by_loss,
            loss_to_driver: s.mgmt.replies_dropped_by_loss,
            out_of_order: s.mgmt.out_of_order,
            duplicate: s.mgmt.duplicates,
            spoofed: s.peer.spoofed_mgmt_dropped,
            no_buffer: s.mgmt.replies_dropped_no_buffers,
            trace_dropped: s.trace.dropped,
        }
    }
}

/// The module's own account, read after the trace: what it saw since it
/// was loaded (the trace covers more: the daemon's whole life).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ModuleView {
    /// `generation_changes`.
    pub gen_changes: u64,
    /// `deletes_<reason>` for the reasons of a DEL op (the module counts
    /// one when the device acknowledged it, so the device applied it and
    /// wrote its `del` line, or its `unknown_del` when an ACK was settled
    /// without its status; FLUSHes are counted differently).
    pub deletes: BTreeMap<&'static str, u64>,
    /// `deletes_unknown_id`: DEL ops the device answered `unknown_id`
    /// (each an `unknown_del` line).
    pub unknown_id: u64,
}

/// The DEL-op reasons [`ModuleView::deletes`] holds.
const DEL_OP_REASONS: [&str; 3] = ["expired", "idle", "aged"];

impl ModuleView {
    pub(super) fn of(m: &ModuleCounters) -> Self {
        Self {
            gen_changes: m.get("generation_changes"),
            deletes: DEL_OP_REASONS
                .iter()
                .map(|r| (*r, m.get(&format!("deletes_{r}"))))
                .collect(),
            unknown_id: m.get("deletes_unknown_id"),
        }
    }
}

/// One row of [`counts_verdict`]: (lines of a kind, their count, the
/// device's counter for them).
type CountRow = (&'static str, u64, fn(&Counts) -> u64);

/// See the module's doc. `records`: the whole trace, read after `before`
/// and before `after` (so each count lies between the two readings);
/// `module`: the module's account since it was loaded, read after
/// `after`: it can only have seen generation changes the device made, and
/// every DEL it counted as acknowledged by reason (or as an unknown id)
/// has its line, with that reason, in the trace.
pub(super) fn counts_verdict(
    records: &[TraceRecord],
    before: &Counts,
    after: &Counts,
    module: Option<&ModuleView>,
) -> Verdict {
    let mut v = Verdict::default();
    if after.trace_dropped > 0 {
        v.unjudged += 1;
        return v;
    }
    let drops = |dir: Direction, reason: &str| {
        records
            .iter()
            .filter(|r| {
                r.event == EventKind::MgmtDrop
                    && r.dir == Some(dir)
                    && r.reason.as_deref() == Some(reason)
            })
            .count() as u64
    };
    let gens = records
        .iter()
        .filter(|r| r.event == EventKind::GenChange && r.reason.as_deref() != Some("start"))
        .count() as u64;
    #[rustfmt::skip]
    let rows: [CountRow; 7] = [
        ("gen_change", gens, |c| c.gen_changes),
        ("mgmt_drop to_device loss", drops(Direction::ToDevice, "loss"), |c| c.loss_to_device),
        ("mgmt_drop to_driver loss", drops(Direction::ToDriver, "loss"), |c| c.loss_to_driver),
        ("mgmt_drop out_of_order", drops(Direction::ToDevice, "out_of_order"), |c| c.out_of_order),
        ("mgmt_drop duplicate", drops(Direction::ToDevice, "duplicate"), |c| c.duplicate),
        ("mgmt_drop spoofed", drops(Direction::ToDriver, "spoofed"), |c| c.spoofed),
        ("mgmt_drop no_buffer", drops(Direction::ToDriver, "no_buffer"), |c| c.no_buffer),
    ];
    for (what, lines, get) in rows {
        v.judged(what);
        if lines < get(before) || lines > get(after) {
            v.findings.push(format!(
                "the trace has {lines} {what} lines; the device counted {} before reading it and {} after",
                get(before),
                get(after)
            ));
        }
    }
    let Some(m) = module else {
        return v;
    };
    v.judged("module generation_changes");
    if m.gen_changes > after.gen_changes || m.gen_changes > gens {
        v.findings.push(format!(
            "the module counted {} generation changes since it was loaded; the device made {} and traced {gens} in all",
            m.gen_changes, after.gen_changes
        ));
    }
    let lines = |k: EventKind, reason: Option<&str>| {
        records
            .iter()
            .filter(|r| r.event == k && reason.is_none_or(|x| r.reason.as_deref() == Some(x)))
            .count() as u64
    };
    for (reason, n) in &m.deletes {
        v.judged("module deletes by reason");
        // (An ACK the module lost it may settle from a later one without
        // the op's status: a DEL of an id the device no longer had then
        // counts under its reason too, so unknown_del lines count here.)
        let traced =
            lines(EventKind::Del, Some(reason)) + lines(EventKind::UnknownDel, Some(reason));
        if *n > traced {
            v.findings.push(format!(
                "the module counted {n} DELs with reason {reason} acknowledged; the trace has {traced} del and unknown_del lines with that reason"
            ));
        }
    }
    v.judged("module deletes_unknown_id");
    let traced = lines(EventKind::UnknownDel, None);
    if m.unknown_id > traced {
        v.findings.push(format!(
            "the module counted {} DELs answered unknown_id; the trace has {traced} unknown_del lines",
            m.unknown_id
        ));
    }
    v
}

/// A malformed frame the guest sent `sent` times (hostile-mgmt), and what
/// its `bad_frame` line must say: the values it planted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planted<'a> {
    pub reason: &'a str,
    pub field: &'a str,
    pub op: Option<u16>,
    /// The header's type (None: no readable header).
    pub msg_type: Option<&'a str>,
    /// The header's seq for an error the protocol NAKs (the device
    /// trusts that header); such a frame outside the device's window is
    /// also dropped as `out_of_order`, with this seq and type.
    pub seq: Option<u32>,
    pub sent: u64,
}

/// `bad_frame` and `out_of_order` `mgmt_drop` lines of the frames in
/// `planted` (the lines of the guest's own session are not theirs: a
/// planted NAK-able frame's seq is far from the session's): every
/// `bad_frame` line matches a planted frame field for field; per planted
/// kind no more lines than frames sent, and no fewer than sent less the
/// lines the trace writer dropped (`trace_dropped`); each planted NAK-able
/// frame has its `out_of_order` line with its seq and type.
pub(crate) fn planted_verdict(
    records: &[TraceRecord],
    planted: &[Planted<'_>],
    trace_dropped: u64,
) -> Verdict {
    type Key<'a> = (&'a str, &'a str, Option<u16>, Option<&'a str>, Option<u32>);
    let mut v = Verdict::default();
    let mut want: BTreeMap<Key<'_>, (u64, u64)> = BTreeMap::new();
    let mut drops: BTreeMap<(u32, &str), (u64, u64)> = BTreeMap::new();
    for p in planted {
        want.entry((p.reason, p.field, p.op, p.msg_type, p.seq))
            .or_default()
            .0 += p.sent;
        if let (Some(seq), Some(t)) = (p.seq, p.msg_type) {
            drops.entry((seq, t)).or_default().0 += p.sent;
        }
    }
    let mut strays = 0usize;
    for (i, r) in records.iter().enumerate() {
        match r.event {
            EventKind::BadFrame => {
                v.judged("bad_frame reason/field/op/msg_type/seq");
                let k = (
                    r.reason.as_deref().unwrap_or("-"),
                    r.field.as_deref().unwrap_or("-"),
                    r.op,
                    r.msg_type.as_deref(),
                    r.seq,
                );
                if let Some(n) = want.get_mut(&k) {
                    n.1 += 1;
                } else {
                    strays += 1;
                    if strays <= 5 {
                        v.findings.push(format!(
                            "line {i}: bad_frame reason {:?} field {:?} op {:?} msg_type {:?} seq {:?}: no frame the guest sent planted that",
                            k.0, k.1, k.2, k.3, k.4
                        ));
                    }
                }
            }
            EventKind::MgmtDrop if r.reason.as_deref() == Some("out_of_order") => {
                let Some(seq) = r.seq else { continue };
                let t = r.msg_type.as_deref().unwrap_or("-");
                if let Some(n) = drops.get_mut(&(seq, t)) {
                    v.judged("mgmt_drop out_of_order seq/msg_type/dir");
                    n.1 += 1;
                    if r.dir != Some(Direction::ToDevice) {
                        v.findings.push(format!(
                            "line {i}: out_of_order drop of seq {seq} ({t}) gives dir {:?}",
                            r.dir
                        ));
                    }
                } else if planted.iter().any(|p| p.seq == Some(seq)) {
                    v.findings.push(format!(
                        "line {i}: out_of_order drop of seq {seq} gives type {t}; no NAK-able frame of that type was sent"
                    ));
                }
            }
            _ => {}
        }
    }
    if strays > 5 {
        v.findings.push(format!(
            "{} more bad_frame lines planted by nobody",
            strays - 5
        ));
    }
    let mut missing = 0u64;
    for (what, rows) in [
        (
            "bad_frame",
            want.iter()
                .map(|(k, n)| (format!("{k:?}"), *n))
                .collect::<Vec<_>>(),
        ),
        (
            "out_of_order mgmt_drop",
            drops.iter().map(|(k, n)| (format!("{k:?}"), *n)).collect(),
        ),
    ] {
        for (k, (sent, got)) in rows {
            if got > sent {
                v.findings
                    .push(format!("{got} {what} lines for {k}; the guest sent {sent}"));
            }
            missing += sent.saturating_sub(got);
        }
    }
    if missing > trace_dropped {
        let short: Vec<String> = want
            .iter()
            .filter(|(_, (s, g))| g < s)
            .map(|(k, (s, g))| format!("{k:?} {g}/{s}"))
            .chain(
                drops
                    .iter()
                    .filter(|(_, (s, g))| g < s)
                    .map(|(k, (s, g))| format!("drop {k:?} {g}/{s}")),
            )
            .take(6)
            .collect();
        v.findings.push(format!(
            "{missing} planted frames have no line (the writer dropped {trace_dropped}): {}",
            short.join(", ")
        ));
    }
    v
}

impl Session {
    /// The three trace checks over the whole trace, the workload's flows'
    /// paths and the device's and module's counters. Failures (naming the
    /// flows or lines) go to `c`; returns the checks' figures.
    pub(super) fn check_trace(&mut self, c: &mut Checks) -> Result<String> {
        let before = Counts::of(&self.guest.ctl.stats()?);
        let (trace, _) = self.trace_from(0)?;
        let after = Counts::of(&self.guest.ctl.stats()?);
        let module = ModuleView::of(&self.module_counters()?);
        let napi: RxQueueNapi = self.guest.agent.req(Request::RxQueueNapi {
            ifname: IFNAME.into(),
        })?;
        let map = napi_queues(&napi);
        let st = self.udp_stats()?;
        let pps = f64::from(self.settings.rate) / self.flows.len().max(1) as f64;
        let flows: Vec<GuestFlow> = self
            .flows
            .iter()
            .zip(&st.flows)
            .map(|(f, got)| GuestFlow {
                port: f.local_port,
                key: f.key,
                path: got
                    .path
                    .iter()
                    .map(|p| Seg {
                        q: map.get(&p.napi).copied().unwrap_or(usize::MAX),
                        first: p.first,
                        last: p.last,
                        n: p.n,
                    })
                    .collect(),
                pps,
            })
            .collect();
        let g = guest_verdict(&trace, &flows);
        let r = replay_verdict(&trace);
        let n = counts_verdict(&trace, &before, &after, Some(&module));
        for l in g.findings.iter().chain(&r.findings).chain(&n.findings) {
            c.check(false, || l.clone());
        }
        Ok(format!(
            "{} {} {}",
            g.figures("trace-vs-guest"),
            r.figures("trace-replay"),
            n.figures("trace-counts")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arfs::{DelReason, L4Proto, TableEvent};

    const MS: u64 = 1_000_000;

    fn key(port: u16) -> FlowKey {
        FlowKey::v4(
            L4Proto::Udp,
            [10, 0, 2, 1].into(),
            10000,
            [10, 0, 2, 15].into(),
            port,
        )
    }

    fn ev(t_ms: u64, e: &TableEvent) -> TraceRecord {
        TraceRecord::from_event(t_ms * MS, 1, e)
    }

    /// A flow on q0 (RSS) to 500 ms, then its filter's q1 to 1500 ms, then
    /// q2 to 3000 ms, at 31 datagrams a second.
    fn flow() -> GuestFlow {
        let seg = |q, a: u64, b: u64, n| Seg {
            q,
            first: a * MS,
            last: b * MS,
            n,
        };
        GuestFlow {
            port: 20001,
            key: key(20001),
            path: vec![
                seg(0, 0, 499, 15),
                seg(1, 502, 1499, 31),
                seg(2, 1502, 3000, 46),
            ],
            pps: 31.0,
        }
    }

    /// The trace of that life; `plant` changes one line.
    fn trace(plant: impl Fn(&mut Vec<TraceRecord>)) -> Vec<TraceRecord> {
        let k = key(20001);
        let mut v = vec![
            TraceRecord::gen_change(0, 0, 1, "start"),
            ev(
                500,
                &TableEvent::Added {
                    seq: 1,
                    id: 5,
                    rxq: 1,
                    flow: k,
                },
            ),
            ev(
                1500,
                &TableEvent::Replaced {
                    seq: 2,
                    id: 5,
                    rxq: 2,
                    flow: k,
                    prev_id: 5,
                    prev_rxq: 1,
                    prev_flow: k,
                    prev_hits: 0,
                },
            ),
            ev(
                3000,
                &TableEvent::Deleted {
                    seq: 3,
                    id: 5,
                    rxq: 2,
                    flow: k,
                    reason: DelReason::Expired,
                    hits: 46,
                },
            ),
        ];
        v[2].hits = Some(31);
        plant(&mut v);
        v
    }

    /// (what is planted, guest-side findings, replay findings, a part of
    /// the first finding).
    #[test]
    fn each_wrong_field_is_named_with_its_flow() {
        type Plant = fn(&mut Vec<TraceRecord>);
        #[rustfmt::skip]
        let cases: &[(&str, Plant, usize, usize, &str)] = &[
            ("nothing", |_| {}, 0, 0, ""),
            // wrong_trace: the new queue as prev_rxq (its hits are then
            // read on the wrong queue too).
            ("prev_rxq", |v| v[2].prev_rxq = Some(2), 2, 1, "prev_rxq q2; the guest saw the flow on q1"),
            ("add rxq", |v| v[1].rxq = Some(3), 1, 1, "ADD at 500.0 ms gives rxq q3"),
            ("replace rxq", |v| v[2].rxq = Some(0), 1, 1, "REPLACE at 1500.0 ms gives rxq q0"),
            ("del hits", |v| v[3].hits = Some(10), 1, 0, "had 10 hits"),
            ("del rxq", |v| v[3].rxq = Some(1), 1, 1, "filter 5 on q1 had 46 hits"),
            ("replace hits", |v| v[2].hits = Some(90), 1, 0, "had 90 hits"),
            // Within the datagrams in flight: 31/s, 2 x (2 + 1).
            ("hits in flight", |v| v[3].hits = Some(52), 0, 0, ""),
        ];
        for &(what, plant, guest, replay, part) in cases {
            let t = trace(plant);
            let g = guest_verdict(&t, &[flow()]);
            let r = replay_verdict(&t);
            assert_eq!(g.findings.len(), guest, "{what}: {g:?}");
            assert_eq!(r.findings.len(), replay, "{what}: {r:?}");
            if guest > 0 {
                assert!(g.findings[0].starts_with("flow :20001:"), "{what}: {g:?}");
                assert!(g.findings.iter().any(|l| l.contains(part)), "{what}: {g:?}");
            }
            if what == "nothing" {
                let c = &g.checked;
                assert_eq!(
                    (c.get("prev_rxq"), c.get("rxq"), c.get("hits")),
                    (Some(&1), Some(&2), Some(&2)),
                    "{g:?}"
                );
            }
        }
        assert_eq!(hits_in_flight(31.0), 6);
    }

    /// Lines outside what the guest saw (before its path starts) are not
    /// judged, and a filter whose queue the flow kept without it (RSS's)
    /// has its hits unjudged.
    #[test]
    fn what_the_guest_did_not_see_is_unjudged() {
        let mut f = flow();
        for s in &mut f.path {
            s.first += 4000 * MS;
            s.last += 4000 * MS;
        }
        let g = guest_verdict(&trace(|_| {}), &[f]);
        assert!(g.findings.is_empty() && g.checked.is_empty(), "{g:?}");
        assert_eq!(g.unjudged, 5, "{g:?}");
        // The flow stays on the DEL's queue after it (RSS's queue too).
        let mut f = flow();
        f.path[2].last = 4000 * MS;
        let g = guest_verdict(&trace(|_| {}), &[f]);
        assert!(g.findings.is_empty(), "{g:?}");
        assert_eq!(g.checked.get("hits"), Some(&1), "{g:?}");
    }

    /// A change to one trace line.
    type LinePlant = fn(&mut TraceRecord);

    #[test]
    fn the_replay_checks_generations_resets_and_acks() {
        let k = key(20001);
        let add = |seq, id, rxq| {
            ev(
                10,
                &TableEvent::Added {
                    seq,
                    id,
                    rxq,
                    flow: k,
                },
            )
        };
        let mut ack = TraceRecord::bare(11 * MS, EventKind::Ack, 1);
        ack.seq = Some(4);
        ack.msg_type = Some("ADD".into());
        ack.count = Some(2);
        ack.statuses = Some(vec![OpStatus::Ok, OpStatus::TableFull]);
        let mut reject = TraceRecord::bare(10 * MS, EventKind::Reject, 1);
        reject.seq = Some(4);
        reject.reason = Some("table_full".into());
        let mut evict = TraceRecord::bare(20 * MS, EventKind::Evict, 2);
        (evict.id, evict.rxq, evict.flow) = (Some(5), Some(1), Some(k));
        let mut reset = TraceRecord::bare(20 * MS, EventKind::Reset, 2);
        reset.count = Some(1);
        let good = vec![
            TraceRecord::gen_change(0, 0, 1, "start"),
            add(4, 5, 1),
            reject.clone(),
            ack.clone(),
            TraceRecord::gen_change(20 * MS, 1, 2, "reset"),
            evict.clone(),
            reset.clone(),
        ];
        let v = replay_verdict(&good);
        assert!(v.findings.is_empty(), "{v:?}");
        assert_eq!(v.checked.len(), 5, "{v:?}");
        let planted: [(usize, LinePlant); 6] = [
            (1, |r| r.gen = 2),
            (4, |r| r.prev_gen = Some(7)),
            (6, |r| r.count = Some(2)),
            (3, |r| {
                r.statuses = Some(vec![OpStatus::TableFull, OpStatus::Ok]);
            }),
            (3, |r| r.count = Some(3)),
            (5, |r| r.rxq = Some(0)),
        ];
        for (i, plant) in planted {
            let mut t = good.clone();
            plant(&mut t[i]);
            let v = replay_verdict(&t);
            assert_eq!(v.findings.len(), 1, "line {i}: {v:?}");
            assert!(v.findings[0].starts_with(&format!("line {i}:")), "{v:?}");
        }
    }

    /// A FLUSH's line against its del lines; an unknown_del's reason; a
    /// worker's mgmt_drop generation, raced or stale.
    #[test]
    fn flushes_unknown_dels_and_drop_generations_are_replayed() {
        let k = key(20001);
        let del = |id, reason| {
            ev(
                30,
                &TableEvent::Deleted {
                    seq: 9,
                    id,
                    rxq: 1,
                    flow: k,
                    reason,
                    hits: 0,
                },
            )
        };
        let add = |id| {
            ev(
                10,
                &TableEvent::Added {
                    seq: 8,
                    id,
                    rxq: 1,
                    flow: k,
                },
            )
        };
        let flush = ev(
            30,
            &TableEvent::Flushed {
                seq: 9,
                reason: DelReason::Flush,
                count: 2,
            },
        );
        let unknown = ev(
            40,
            &TableEvent::UnknownDelete {
                seq: 10,
                id: 3,
                reason: DelReason::Idle,
            },
        );
        let spoofed = |t_ms, gen| {
            TraceRecord::mgmt_drop(
                t_ms * MS,
                gen,
                Direction::ToDriver,
                None,
                None,
                arfs::DropCause::Spoofed,
            )
        };
        let good = vec![
            TraceRecord::gen_change(0, 0, 1, "start"),
            add(1),
            add(2),
            del(1, DelReason::Flush),
            del(2, DelReason::Flush),
            flush,
            unknown,
            TraceRecord::gen_change(50 * MS, 1, 2, "reset"),
            // written by a worker that read the generation just before
            spoofed(60, 1),
            spoofed(200, 2),
        ];
        let v = replay_verdict(&good);
        assert!(v.findings.is_empty(), "{v:?}");
        for k in ["flush count/reason", "unknown_del reason", "mgmt_drop gen"] {
            assert!(v.checked.contains_key(k), "{k}: {v:?}");
        }
        let planted: [(usize, LinePlant); 6] = [
            (5, |r| r.count = Some(1)),
            (5, |r| r.reason = Some("unload".into())),
            (4, |r| r.reason = Some("expired".into())),
            (6, |r| r.reason = Some("soon".into())),
            // stale past the race allowance, or a generation never made
            (9, |r| r.gen = 1),
            (8, |r| r.gen = 7),
        ];
        for (i, plant) in planted {
            let mut t = good.clone();
            plant(&mut t[i]);
            let v = replay_verdict(&t);
            let at = if i == 4 { 5 } else { i };
            assert_eq!(v.findings.len(), 1, "line {i}: {v:?}");
            assert!(v.findings[0].starts_with(&format!("line {at}:")), "{v:?}");
        }
    }

    /// The module's acknowledged DELs by reason and its unknown ids against
    /// the device's lines; replies dropped for want of buffers.
    #[test]
    fn module_deletes_and_no_buffer_drops_match_the_lines() {
        let t = vec![
            TraceRecord::gen_change(0, 0, 1, "start"),
            ev(
                10,
                &TableEvent::Deleted {
                    seq: 3,
                    id: 1,
                    rxq: 0,
                    flow: key(20001),
                    reason: DelReason::Expired,
                    hits: 4,
                },
            ),
            ev(
                11,
                &TableEvent::UnknownDelete {
                    seq: 4,
                    id: 2,
                    reason: DelReason::Idle,
                },
            ),
            TraceRecord::mgmt_drop(
                12 * MS,
                1,
                Direction::ToDriver,
                Some(4),
                Some(6),
                arfs::DropCause::NoBuffer,
            ),
        ];
        let c = Counts {
            no_buffer: 1,
            ..Counts::default()
        };
        let m = ModuleView {
            gen_changes: 0,
            deletes: [("expired", 1), ("idle", 0), ("aged", 0)].into(),
            unknown_id: 1,
        };
        let v = counts_verdict(&t, &c, &c, Some(&m));
        assert!(v.findings.is_empty(), "{v:?}");
        // The device wrote idle where the module asked expired: the
        // module's count of expired DELs has no line.
        let mut wrong = t.clone();
        wrong[1].reason = Some("idle".into());
        let v = counts_verdict(&wrong, &c, &c, Some(&m));
        assert_eq!(v.findings.len(), 1, "{v:?}");
        assert!(v.findings[0].contains("reason expired"), "{v:?}");
        // An unknown_del not written; a reply dropped and not traced.
        let v = counts_verdict(&t[..2], &c, &c, Some(&m));
        assert_eq!(v.findings.len(), 2, "{v:?}");
    }

    /// hostile-mgmt's frames against their lines, field by field.
    #[test]
    fn planted_frames_are_named_as_planted() {
        let seq = 0x4000_0007;
        let planted = [
            Planted {
                reason: "bad_reason",
                field: "ops[].reason",
                op: Some(1),
                msg_type: Some("DEL"),
                seq: Some(seq),
                sent: 2,
            },
            Planted {
                reason: "bad_magic",
                field: "magic",
                op: None,
                msg_type: Some("HELLO"),
                seq: None,
                sent: 1,
            },
        ];
        let bad = |reason: &str, field: &str, op, t: &str, seq| {
            let mut r = TraceRecord::bare(MS, EventKind::BadFrame, 1);
            r.reason = Some(reason.into());
            r.field = Some(field.into());
            r.op = op;
            r.msg_type = Some(t.into());
            r.seq = seq;
            r
        };
        let ooo = TraceRecord::mgmt_drop(
            MS,
            1,
            Direction::ToDevice,
            Some(seq),
            Some(4),
            arfs::DropCause::OutOfOrder,
        );
        let del = bad("bad_reason", "ops[].reason", Some(1), "DEL", Some(seq));
        let good = vec![
            del.clone(),
            ooo.clone(),
            bad("bad_magic", "magic", None, "HELLO", None),
            del.clone(),
            ooo.clone(),
        ];
        let v = planted_verdict(&good, &planted, 0);
        assert!(v.findings.is_empty(), "{v:?}");
        let plants: [(usize, LinePlant); 5] = [
            (0, |r| r.op = Some(0)),
            (0, |r| r.field = Some("ops[].id".into())),
            (2, |r| r.msg_type = None),
            (3, |r| r.seq = None),
            (4, |r| r.msg_type = Some("ADD".into())),
        ];
        for (i, plant) in plants {
            let mut t = good.clone();
            plant(&mut t[i]);
            let v = planted_verdict(&t, &planted, 0);
            assert!(
                v.findings
                    .iter()
                    .any(|f| f.starts_with(&format!("line {i}:"))),
                "line {i}: {v:?}"
            );
            // The same line is also missing from its own kind's count.
            assert!(
                v.findings.iter().any(|f| f.contains("have no line")),
                "{v:?}"
            );
        }
        // A line lost by the writer is allowed when it says so.
        let short = &good[..4];
        assert_eq!(planted_verdict(short, &planted, 0).findings.len(), 1);
        assert!(planted_verdict(short, &planted, 1).findings.is_empty());
        // A frame traced twice.
        let mut twice = good.clone();
        twice.push(bad("bad_magic", "magic", None, "HELLO", None));
        assert_eq!(planted_verdict(&twice, &planted, 0).findings.len(), 1);
    }

    #[test]
    fn drops_and_generation_changes_match_the_counters() {
        let mut drop = TraceRecord::mgmt_drop(
            5,
            1,
            Direction::ToDevice,
            Some(3),
            None,
            arfs::DropCause::Loss,
        );
        let t = vec![
            TraceRecord::gen_change(0, 0, 1, "start"),
            TraceRecord::gen_change(1, 1, 2, "reconnect"),
            drop.clone(),
        ];
        let c = Counts {
            gen_changes: 1,
            loss_to_device: 1,
            ..Counts::default()
        };
        let m1 = ModuleView {
            gen_changes: 1,
            ..ModuleView::default()
        };
        let v = counts_verdict(&t, &c, &c, Some(&m1));
        assert!(v.findings.is_empty(), "{v:?}");
        // A drop counted, not traced (or traced twice); a module that saw
        // more generation changes than the device made.
        let more = Counts {
            loss_to_device: 2,
            ..c
        };
        assert_eq!(counts_verdict(&t, &more, &more, None).findings.len(), 1);
        drop.dir = Some(Direction::ToDriver);
        let t2 = vec![t[0].clone(), t[1].clone(), drop];
        let m2 = ModuleView {
            gen_changes: 2,
            ..ModuleView::default()
        };
        let v = counts_verdict(&t2, &c, &c, Some(&m2));
        assert_eq!(v.findings.len(), 3, "{v:?}");
        // Between the two readings: passes.
        let before = Counts::default();
        assert!(counts_verdict(&t, &before, &c, None).findings.is_empty());
        // The writer dropped lines: nothing judged.
        let lossy = Counts {
            trace_dropped: 1,
            ..c
        };
        assert_eq!(counts_verdict(&t, &c, &lossy, None).unjudged, 1);
    }
}
