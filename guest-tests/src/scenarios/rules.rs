//! Issue 48, item 4: ethtool ntuple rules and aRFS filters together
//! (`rules-mixed`).
//!
//! The module serves `ethtool -N` (set_rxnfc/get_rxnfc) and forwards each
//! rule to the device's masked stage, which decides a frame by the rule at
//! its lowest matching location before any aRFS filter or RSS
//! (aRFS/PROTOCOL.md, the rule extension). Under the steering workload,
//! with every steered flow's filter in place:
//!
//! 1. **Rules over filters.** At a quiet point (the generator paused, rx
//!    still), queue rules for [`QUEUE_RULED`] steered flows, each to a
//!    queue other than its filter's (and its RSS queue's when there is a
//!    third), and a drop rule for [`DROP_RULED`] more. Over the next
//!    window, to the next quiet point ([`ruled_window_verdict`], exact:
//!    nothing is in flight at either end): a queue-ruled flow's datagrams
//!    all arrived, all on the rule's queue as the guest saw it
//!    (SO_INCOMING_NAPI_ID), the rule's hits in the device's table equal
//!    what the generator sent it, and its filter stood (same id and queue
//!    at both ends) with no hit; a drop-ruled flow got nothing, its rule
//!    counted every frame, and `peer.rule_dropped` moved by exactly that.
//! 2. **Rules gone.** The rules deleted at the next quiet point; over a
//!    window the flows are back on their filters' queues, each frame by
//!    its filter (hits = sent), none lost.
//! 3. **Churn.** At least [`CHURN_OPS`] rule inserts and deletes ([`Churn`]: at
//!    `RX_CLS_LOC_ANY` and at chosen locations, replacing rules, deleting
//!    them, and calls that must fail: a location past the table, a queue
//!    past the rx queues, a delete of an empty location) while the
//!    generator runs, in rounds of at least [`CHURN_ROTATE_EVERY`] calls:
//!    a third of them, the receivers move to the next CPU, and calls go on
//!    until aRFS has re-steered every flow (the trace must show ADDs or
//!    REPLACEs between a round's rule lines), then the filters settle: every call answers as expected, `ethtool -n` and the
//!    device's table equal what the scenario set (mid-way and at the end),
//!    and the churn's rules match no workload frame (documentation
//!    addresses), so the workload's own verdicts (steering window,
//!    delivery, trace) hold as in migrate.
//! 4. **The trace says so** ([`rule_trace_verdict`]): one `rule_set` line
//!    per insert that succeeded (its location and rule, the rule it
//!    replaced as `prev_rule`), one `rule_del` (reason `rule_del`) per
//!    delete with the rule it removed, in call order (each call waits for
//!    the device's ACK), no `rule_reject`; the `rule_del` of each rule of
//!    step 1 reports as hits what the guest got on the rule's queue (what
//!    the generator sent, for the drop rule).
//!
//! Then the steering window and the trace, order and delivery checks of
//! the other steering scenarios, the module's table against the device's
//! (`stress::tables_agree`), and the module's ethtool counters (no
//! refusal, no timeout, one acknowledged op per successful call).

use super::delivery::Span;
use super::workload::fmt_queues;
use super::{Checks, Session, GUEST_IP, GUEST_IP6, IFNAME};
use crate::harness::{Context, Result};
use crate::proto::{
    AddrMask, PortMask, ProtoMask, Request, RuleAction, RuleFlow, RuleList, RuleOp, RuleSpec,
};
use crate::{bail, ensure};
use arfs::rng::SplitMix64;
use arfs::{EventKind, FlowKey, TraceRecord};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Steered flows given a queue rule in step 1.
pub(super) const QUEUE_RULED: usize = 3;
/// Steered flows given a drop rule in step 1.
pub(super) const DROP_RULED: usize = 1;
/// Rule calls in the churn, at least (rounds go on until aRFS re-steered).
pub(super) const CHURN_OPS: usize = 300;
/// Calls in a churn round, at least; the receivers move after a third.
pub(super) const CHURN_ROTATE_EVERY: usize = 75;
/// `ethtool -n` and the device's table are compared with the scenario's
/// every this many churn calls (and at the end).
pub(super) const CHURN_CHECK_EVERY: usize = 100;
/// The churn keeps at most this many rules set (more: it deletes).
pub(super) const CHURN_MAX_LIVE: usize = 24;
/// Explicit locations the churn picks from: low ones, where
/// `RX_CLS_LOC_ANY`'s picks land too, so that inserts replace rules.
pub(super) const CHURN_LOCS: u32 = 32;
/// Frames a verdict of step 1 or 2 allows off its count: none. Both ends
/// of each window are quiet points (generator paused, the device's rx
/// counters and the receivers still), and the rules change only there, so
/// no frame is in flight across an end and every count is exact.
pub(super) const QUIET_SLACK: u64 = 0;

const ENOENT: i32 = libc::ENOENT;
const EINVAL: i32 = libc::EINVAL;

// ---- the rules as the device holds them -------------------------------------

fn bytes16(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v.octets());
            b
        }
        IpAddr::V6(v) => v.octets(),
    }
}

/// The device's rule (`arfs::Rule`, as its table and trace write it) for
/// `spec` at `loc`, as the module forwards it; None for a queue past u16.
pub(super) fn device_rule(loc: u32, spec: &RuleSpec) -> Option<arfs::Rule> {
    let addr =
        |a: Option<AddrMask>| a.map_or(([0; 16], [0; 16]), |a| (bytes16(a.addr), bytes16(a.mask)));
    let port = |p: Option<PortMask>| p.map_or((0, 0), |p| (p.port, p.mask));
    let (src, src_mask) = addr(spec.src);
    let (dst, dst_mask) = addr(spec.dst);
    let (sport, sport_mask) = port(spec.sport);
    let (dport, dport_mask) = port(spec.dport);
    let (l4_proto, l4_mask) = spec.l4_proto.map_or((0, 0), |p| (p.proto, p.mask));
    Some(arfs::Rule {
        loc,
        flow: match spec.flow {
            RuleFlow::Tcp4 => arfs::RuleFlow::Tcp4,
            RuleFlow::Udp4 => arfs::RuleFlow::Udp4,
            RuleFlow::Ip4 => arfs::RuleFlow::Ip4,
            RuleFlow::Tcp6 => arfs::RuleFlow::Tcp6,
            RuleFlow::Udp6 => arfs::RuleFlow::Udp6,
            RuleFlow::Ip6 => arfs::RuleFlow::Ip6,
        },
        src,
        src_mask,
        dst,
        dst_mask,
        sport,
        sport_mask,
        dport,
        dport_mask,
        l4_proto,
        l4_mask,
        action: match spec.action {
            RuleAction::Queue(q) => arfs::RuleAction::Queue(u16::try_from(q).ok()?),
            RuleAction::Drop => arfs::RuleAction::Drop,
        },
    })
}

/// The rule that matches exactly one workload flow (addresses and ports
/// under full masks), with `action`.
pub(super) fn flow_rule(k: &FlowKey, action: RuleAction) -> RuleSpec {
    let full = |a: IpAddr| AddrMask {
        addr: a,
        mask: match a {
            IpAddr::V4(_) => IpAddr::V4([255; 4].into()),
            IpAddr::V6(_) => IpAddr::V6([0xffff; 8].into()),
        },
    };
    RuleSpec {
        flow: if k.src_ip().is_ipv6() {
            RuleFlow::Udp6
        } else {
            RuleFlow::Udp4
        },
        src: Some(full(k.src_ip())),
        dst: Some(full(k.dst_ip())),
        sport: Some(PortMask {
            port: k.src_port(),
            mask: 0xffff,
        }),
        dport: Some(PortMask {
            port: k.dst_port(),
            mask: 0xffff,
        }),
        l4_proto: None,
        action,
    }
}

/// `ethtool -n`'s rules and the device's (location, rule) against what the
/// scenario set (`want`, by location). Findings name the location.
pub(super) fn table_verdict(
    when: &str,
    want: &BTreeMap<u32, RuleSpec>,
    listed: &RuleList,
    device: &[arfs::Rule],
) -> Vec<String> {
    let mut out = Vec::new();
    let got: BTreeMap<u32, &RuleSpec> = listed.rules.iter().map(|(l, r)| (*l, r)).collect();
    if listed.count as usize != want.len() || got.len() != listed.rules.len() {
        out.push(format!(
            "{when}: ethtool -n counts {} rules and lists {} (distinct locations {}); the scenario set {}",
            listed.count,
            listed.rules.len(),
            got.len(),
            want.len()
        ));
    }
    for loc in want
        .keys()
        .chain(got.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (w, g) = (want.get(loc), got.get(loc).copied());
        if w != g {
            out.push(format!(
                "{when}: ethtool -n has {g:?} at location {loc}; the scenario set {w:?}"
            ));
        }
    }
    let dev: BTreeMap<u32, &arfs::Rule> = device.iter().map(|r| (r.loc, r)).collect();
    let want_dev: BTreeMap<u32, Option<arfs::Rule>> =
        want.iter().map(|(l, r)| (*l, device_rule(*l, r))).collect();
    if dev.len() != device.len() {
        out.push(format!(
            "{when}: the device's table lists {} rules at {} distinct locations",
            device.len(),
            dev.len()
        ));
    }
    for loc in want_dev
        .keys()
        .chain(dev.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (w, g) = (want_dev.get(loc).copied().flatten(), dev.get(loc).copied());
        if w.as_ref() != g {
            out.push(format!(
                "{when}: the device's table has {g:?} at location {loc}; the scenario set {w:?}"
            ));
        }
    }
    out
}

// ---- step 1 and 2: who decided each flow's frames ---------------------------

/// What decides a flow's frames over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decider {
    /// Its rule, to this queue.
    RuleQueue(usize),
    /// Its rule, dropping them.
    RuleDrop,
    /// Its filter (no rule).
    Filter,
}

/// One flow over a window between two quiet points.
#[derive(Debug, Clone)]
pub(super) struct WindowFlow {
    pub port: u16,
    pub decider: Decider,
    /// The queue its filter names (the filter it had before the rules).
    pub filter_q: usize,
    /// Frames the generator sent it, intact datagrams the guest got.
    pub sent: u64,
    pub got: u64,
    /// The guest's datagrams by the rx queue that delivered them.
    pub by_queue: BTreeMap<usize, u64>,
    /// Its filter's hits over the window and its queue (None: not the same
    /// filter at both ends).
    pub filter_hits: Option<(usize, u64)>,
    /// Its rule's hits in the device's table at the window's end (it was
    /// set at the window's start; None: no rule).
    pub rule_hits: Option<u64>,
}

/// See the module's doc, steps 1 and 2. `rule_dropped`: the device's
/// `peer.rule_dropped` over the window. Findings name the flow.
pub(super) fn ruled_window_verdict(flows: &[WindowFlow], rule_dropped: u64) -> Vec<String> {
    let mut out = Vec::new();
    let off = |a: u64, b: u64| a.abs_diff(b) > QUIET_SLACK;
    let mut dropped = 0;
    for f in flows {
        let p = f.port;
        let on = |q: usize| f.by_queue.get(&q).copied().unwrap_or(0);
        let elsewhere = |q: usize| f.by_queue.iter().any(|(k, n)| *k != q && *n > 0);
        if f.sent == 0 {
            out.push(format!(
                ":{p}: the generator sent it nothing in the window: nothing to judge"
            ));
            continue;
        }
        match f.decider {
            Decider::RuleQueue(q) => {
                if off(f.got, f.sent) || off(on(q), f.got) || elsewhere(q) {
                    out.push(format!(
                        "flow :{p}: under its rule to q{q} (filter to q{}) the guest got {} of {} frames sent, by queue {}",
                        f.filter_q, f.got, f.sent, fmt_queues(&f.by_queue)
                    ));
                }
            }
            Decider::RuleDrop => {
                dropped += f.sent;
                if f.got > 0 || !f.by_queue.is_empty() {
                    out.push(format!(
                        "flow :{p}: under its drop rule the guest still got {} of {} frames, by queue {}",
                        f.got, f.sent, fmt_queues(&f.by_queue)
                    ));
                }
            }
            Decider::Filter => {
                let q = f.filter_q;
                if off(f.got, f.sent) || off(on(q), f.got) || elsewhere(q) {
                    out.push(format!(
                        "flow :{p}: with no rule the guest got {} of {} frames sent, by queue {}; its filter names q{q}",
                        f.got, f.sent, fmt_queues(&f.by_queue)
                    ));
                }
            }
        }
        let ruled = f.decider != Decider::Filter;
        match (ruled, f.rule_hits) {
            (true, Some(h)) if !off(h, f.sent) => {}
            (true, h) => out.push(format!(
                "flow :{p}: its rule decided {h:?} frames in the device's table; the generator sent it {}",
                f.sent
            )),
            (false, None) => {}
            (false, Some(h)) => out.push(format!(
                "flow :{p}: a rule for it is still in the device's table ({h} hits)"
            )),
        }
        // The rule wins: the filter stands and takes nothing; without the
        // rule it takes every frame again.
        let want_hits = if ruled { 0 } else { f.sent };
        match f.filter_hits {
            Some((q, h)) if q == f.filter_q && !off(h, want_hits) => {}
            other => out.push(format!(
                "flow :{p}: its filter to q{} {}; expected it to stand with {want_hits} hits (the {} decided)",
                f.filter_q,
                other.map_or("did not stand through the window".into(), |(q, h)| format!(
                    "was on q{q} with {h} hits"
                )),
                if ruled { "rule" } else { "filter" }
            )),
        }
    }
    if off(rule_dropped, dropped) {
        out.push(format!(
            "the device counted {rule_dropped} frames dropped by rules (peer.rule_dropped); the drop-ruled flows were sent {dropped}"
        ));
    }
    out
}

impl WindowFlow {
    /// Flow `i` of the session's workload over `sp`.
    fn of(
        sp: &Span,
        i: usize,
        port: u16,
        decider: Decider,
        filter_q: usize,
        rule_hits: Option<u64>,
    ) -> Self {
        Self {
            port,
            decider,
            filter_q,
            sent: sp.sent[i],
            got: sp.got[i].distinct,
            by_queue: sp.by_queue[i].clone(),
            filter_hits: sp.hits[i],
            rule_hits,
        }
    }
}

// ---- the churn --------------------------------------------------------------

/// One rule call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Op {
    /// `loc` None: RX_CLS_LOC_ANY.
    Insert {
        rule: RuleSpec,
        loc: Option<u32>,
    },
    Delete {
        loc: u32,
    },
}

/// What a call must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// Success: at this location (None: any free one, for RX_CLS_LOC_ANY).
    Ok(Option<u32>),
    /// This errno, and nothing changes.
    Errno(i32),
}

/// A call that succeeded, in order: what the trace must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Done {
    /// A rule set at `loc`, replacing `prev` (if any).
    Set {
        loc: u32,
        rule: RuleSpec,
        prev: Option<RuleSpec>,
    },
    /// The rule at `loc` deleted.
    Del { loc: u32, rule: RuleSpec },
}

/// The scenario's view of the rule table and the calls that changed it.
#[derive(Debug, Clone, Default)]
pub(super) struct Rules {
    /// What is set, by location.
    pub set: BTreeMap<u32, RuleSpec>,
    /// The successful calls, in order.
    pub done: Vec<Done>,
    /// Calls that answered otherwise than expected.
    pub findings: Vec<String>,
    /// Calls made, and those refused as expected.
    pub calls: usize,
    pub refused: usize,
    /// Each call's time (µs, the agent's measure of the ioctl).
    pub us: Vec<u64>,
}

impl Rules {
    /// Records call `op`'s answer `got` against `want`.
    pub(super) fn answer(&mut self, op: &Op, want: Expect, got: RuleOp, size: u32) {
        self.calls += 1;
        self.us.push(got.us);
        let what = match op {
            Op::Insert { rule, loc } => format!(
                "insert {:?} {:?} at {}",
                rule.flow,
                rule.action,
                loc.map_or("any".into(), |l| l.to_string())
            ),
            Op::Delete { loc } => format!("delete {loc}"),
        };
        match (want, got.errno, got.loc) {
            (Expect::Errno(e), g, _) if g == e => self.refused += 1,
            (Expect::Ok(at), 0, Some(loc))
                if at.is_none_or(|a| a == loc)
                    && loc < size
                    && (at.is_some() || !self.set.contains_key(&loc)) =>
            {
                match op {
                    Op::Insert { rule, .. } => {
                        let prev = self.set.insert(loc, rule.clone());
                        self.done.push(Done::Set {
                            loc,
                            rule: rule.clone(),
                            prev,
                        });
                    }
                    Op::Delete { .. } => {
                        if let Some(rule) = self.set.remove(&loc) {
                            self.done.push(Done::Del { loc, rule });
                        }
                    }
                }
            }
            _ => {
                self.findings.push(format!(
                    "call {} ({what}) answered errno {} location {:?}; expected {want:?} (locations in use: {:?})",
                    self.calls,
                    got.errno,
                    got.loc,
                    self.set.keys().collect::<Vec<_>>()
                ));
                // A success we did not expect still changed the table.
                if got.errno == 0 {
                    if let (Op::Insert { rule, .. }, Some(loc)) = (op, got.loc) {
                        let prev = self.set.insert(loc, rule.clone());
                        self.done.push(Done::Set {
                            loc,
                            rule: rule.clone(),
                            prev,
                        });
                    } else if let (Op::Delete { loc }, Some(rule)) =
                        (op, self.set.get(&got.loc.unwrap_or(u32::MAX)).cloned())
                    {
                        self.set.remove(loc);
                        self.done.push(Done::Del { loc: *loc, rule });
                    }
                }
            }
        }
    }
}

/// The churn's calls: random, reproducible from the seed, and each with
/// the answer it must get given what is set.
pub(super) struct Churn {
    rng: SplitMix64,
    /// The table's size (GRXCLSRLCNT's data without RX_CLS_LOC_SPECIAL).
    pub size: u32,
    /// rx queues in use.
    pub queues: u32,
}

impl Churn {
    pub(super) fn new(seed: u64, size: u32, queues: u32) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            size,
            queues,
        }
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n.max(1)
    }

    /// A rule that matches no workload frame: its source is in a
    /// documentation range (198.51.100.0/24, 2001:db8::/32) under a mask
    /// that covers the address's first byte, the workload's sources are
    /// 10.0.2.1 and fd00:2::1. Every flow type, masks and actions vary.
    pub(super) fn rule(&mut self) -> RuleSpec {
        let flow = [
            RuleFlow::Tcp4,
            RuleFlow::Udp4,
            RuleFlow::Ip4,
            RuleFlow::Tcp6,
            RuleFlow::Udp6,
            RuleFlow::Ip6,
        ][self.below(6) as usize];
        let v6 = matches!(flow, RuleFlow::Tcp6 | RuleFlow::Udp6 | RuleFlow::Ip6);
        let host = self.below(250) as u8 + 1;
        let wide = self.rng.chance(0.5);
        let src = if v6 {
            AddrMask {
                addr: IpAddr::V6([0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(host)].into()),
                mask: IpAddr::V6(
                    if wide {
                        [0xffff, 0xffff, 0, 0, 0, 0, 0, 0]
                    } else {
                        [0xffff; 8]
                    }
                    .into(),
                ),
            }
        } else {
            AddrMask {
                addr: IpAddr::V4([198, 51, 100, if wide { 0 } else { host }].into()),
                mask: IpAddr::V4([255, 255, 255, if wide { 0 } else { 255 }].into()),
            }
        };
        let dst = self.rng.chance(0.5).then(|| AddrMask {
            addr: if v6 {
                IpAddr::V6(GUEST_IP6)
            } else {
                IpAddr::V4(GUEST_IP)
            },
            mask: if v6 {
                IpAddr::V6([0xffff; 8].into())
            } else {
                IpAddr::V4([255; 4].into())
            },
        });
        let ip = matches!(flow, RuleFlow::Ip4 | RuleFlow::Ip6);
        let port = |this: &mut Self| {
            (!ip && this.rng.chance(0.6)).then(|| PortMask {
                port: 1024 + this.below(60000) as u16,
                mask: if this.rng.chance(0.5) { 0xffff } else { 0xff00 },
            })
        };
        let sport = port(self);
        let dport = port(self);
        let l4_proto = (ip && self.rng.chance(0.5)).then(|| ProtoMask {
            proto: if self.rng.chance(0.5) { 6 } else { 17 },
            mask: 0xff,
        });
        let action = if self.rng.chance(0.15) {
            RuleAction::Drop
        } else {
            RuleAction::Queue(self.below(u64::from(self.queues)) as u32)
        };
        RuleSpec {
            flow,
            src: Some(src),
            dst,
            sport,
            dport,
            l4_proto,
            action,
        }
    }

    /// The next call given what is `set`, and what it must answer.
    pub(super) fn next(&mut self, set: &BTreeMap<u32, RuleSpec>) -> (Op, Expect) {
        let free_any = (set.len() as u32) < self.size;
        let r = self.below(100);
        let full = set.len() >= CHURN_MAX_LIVE;
        match r {
            // Inserts where the driver picks the location.
            0..=34 if !full && free_any => (
                Op::Insert {
                    rule: self.rule(),
                    loc: None,
                },
                Expect::Ok(None),
            ),
            // Inserts at a chosen location (a replacement when it is set).
            35..=54 => {
                let loc = self.below(u64::from(CHURN_LOCS.min(self.size))) as u32;
                if full && !set.contains_key(&loc) {
                    return self.delete(set);
                }
                (
                    Op::Insert {
                        rule: self.rule(),
                        loc: Some(loc),
                    },
                    Expect::Ok(Some(loc)),
                )
            }
            // Calls that must fail and change nothing.
            55..=58 => (
                Op::Insert {
                    rule: self.rule(),
                    loc: Some(self.size),
                },
                Expect::Errno(EINVAL),
            ),
            59..=62 => {
                let mut rule = self.rule();
                rule.action = RuleAction::Queue(self.queues);
                (Op::Insert { rule, loc: None }, Expect::Errno(EINVAL))
            }
            63..=66 => match (0..CHURN_LOCS.min(self.size)).find(|l| !set.contains_key(l)) {
                Some(loc) => (Op::Delete { loc }, Expect::Errno(ENOENT)),
                None => self.delete(set),
            },
            _ => self.delete(set),
        }
    }

    /// Delete a rule that is set (an insert when none is).
    fn delete(&mut self, set: &BTreeMap<u32, RuleSpec>) -> (Op, Expect) {
        if set.is_empty() {
            return (
                Op::Insert {
                    rule: self.rule(),
                    loc: None,
                },
                Expect::Ok(None),
            );
        }
        let k = self.below(set.len() as u64) as usize;
        let loc = *set.keys().nth(k).unwrap_or(&0);
        (Op::Delete { loc }, Expect::Ok(Some(loc)))
    }
}

// ---- the trace --------------------------------------------------------------

/// See the module's doc, step 4. `records`: the trace from before the
/// first call on; `done`: the successful calls in order; `del_hits`: per
/// location, the hits the `rule_del` of the step-1 rule there must report
/// (the guest's count). Returns (findings, lines judged).
pub(super) fn rule_trace_verdict(
    records: &[TraceRecord],
    done: &[Done],
    del_hits: &BTreeMap<u32, u64>,
) -> (Vec<String>, usize) {
    let mut out = Vec::new();
    let lines: Vec<(usize, &TraceRecord)> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            matches!(
                r.event,
                EventKind::RuleSet | EventKind::RuleDel | EventKind::RuleReject
            )
        })
        .collect();
    let mut pending_hits = del_hits.clone();
    for (k, d) in done.iter().enumerate() {
        let Some(&(i, r)) = lines.get(k) else {
            out.push(format!(
                "the trace has {} rule lines; call {} ({d:?}) and {} more have none",
                lines.len(),
                k + 1,
                done.len() - k - 1
            ));
            break;
        };
        let problem = match d {
            Done::Set { loc, rule, prev } => {
                let want = device_rule(*loc, rule);
                let want_prev = prev.as_ref().and_then(|p| device_rule(*loc, p));
                (r.event != EventKind::RuleSet
                    || r.loc != Some(*loc)
                    || r.rule != want
                    || r.prev_rule != want_prev)
                    .then(|| format!("rule_set at {loc} of {want:?} replacing {want_prev:?}"))
            }
            Done::Del { loc, rule } => {
                let want = device_rule(*loc, rule);
                let hits = pending_hits.remove(loc);
                (r.event != EventKind::RuleDel
                    || r.loc != Some(*loc)
                    || r.rule != want
                    || r.reason.as_deref() != Some("rule_del")
                    || hits.is_some_and(|h| r.hits != Some(h)))
                .then(|| {
                    format!(
                        "rule_del at {loc} of {want:?}{}",
                        hits.map_or(String::new(), |h| format!(
                            " with {h} hits (the guest's count)"
                        ))
                    )
                })
            }
        };
        if let Some(want) = problem {
            out.push(format!(
                "trace line {i}: {:?} at {:?} rule {:?} prev_rule {:?} hits {:?} reason {:?}; call {} wants {want}",
                r.event,
                r.loc,
                r.rule,
                r.prev_rule,
                r.hits,
                r.reason,
                k + 1
            ));
            if out.len() >= 6 {
                out.push("(the rest of the rule lines are not compared)".into());
                return (out, k + 1);
            }
        }
    }
    for (i, r) in lines.iter().skip(done.len()) {
        out.push(format!(
            "trace line {i}: {:?} at {:?} reason {:?}, which no successful call made",
            r.event, r.loc, r.reason
        ));
    }
    (out, lines.len().min(done.len()))
}

/// Filter lines (ADD, REPLACE) in `records`, and those between its first
/// and its last rule line (`rule_set`, `rule_del`): aRFS programming the
/// device while the rules changed.
pub(super) fn interleaved_lines(records: &[TraceRecord]) -> (usize, usize) {
    let is_rule = |r: &TraceRecord| matches!(r.event, EventKind::RuleSet | EventKind::RuleDel);
    let is_filter = |r: &&TraceRecord| matches!(r.event, EventKind::Add | EventKind::Replace);
    let total = records.iter().filter(is_filter).count();
    let (Some(a), Some(b)) = (
        records.iter().position(is_rule),
        records.iter().rposition(is_rule),
    ) else {
        return (total, 0);
    };
    (total, records[a..b].iter().filter(is_filter).count())
}

// ---- the scenario -----------------------------------------------------------

impl Session {
    pub(super) fn rule_call(&mut self, op: &Op) -> Result<RuleOp> {
        let req = match op {
            Op::Insert { rule, loc } => Request::RuleInsert {
                ifname: IFNAME.into(),
                rule: rule.clone(),
                loc: *loc,
            },
            Op::Delete { loc } => Request::RuleDelete {
                ifname: IFNAME.into(),
                loc: *loc,
            },
        };
        self.guest.agent.req(req)
    }

    pub(super) fn rule_list(&mut self) -> Result<RuleList> {
        self.guest.agent.req(Request::RuleList {
            ifname: IFNAME.into(),
        })
    }

    /// The device's rules with their hits.
    pub(super) fn device_rules(&mut self) -> Result<Vec<(arfs::Rule, u64)>> {
        let t = self.guest.ctl.table()?;
        t.rules
            .iter()
            .map(|e| {
                let r: arfs::Rule = serde_json::from_value(e.rule.clone())
                    .ctx(format!("device table rule {}", e.rule))?;
                Ok((r, e.hits))
            })
            .collect()
    }

    /// Whether every flow that needs a filter has one to its receiver's
    /// queue now (`wait_steered`'s condition, read once).
    fn steered_now(&mut self) -> Result<bool> {
        let have = self.device_filters()?;
        Ok(self
            .flows
            .iter()
            .filter(|f| f.needs_filter())
            .all(|f| have.get(&f.key).is_some_and(|&(_, q, _)| q == f.rx_q)))
    }

    /// `ethtool -n` and the device's table against `rules`; findings to `c`.
    pub(super) fn check_rule_tables(
        &mut self,
        c: &mut Checks,
        when: &str,
        rules: &Rules,
    ) -> Result<()> {
        let listed = self.rule_list()?;
        let dev: Vec<arfs::Rule> = self.device_rules()?.into_iter().map(|(r, _)| r).collect();
        for l in table_verdict(when, &rules.set, &listed, &dev) {
            c.check(false, || l);
        }
        Ok(())
    }
}

/// The steered flows step 1 rules: (flow index, decider), the first
/// [`QUEUE_RULED`] to a queue other than their filter's (and their RSS
/// queue's when there is a third), the next [`DROP_RULED`] dropped.
pub(super) fn pick_ruled(flows: &[super::Flow], pairs: usize) -> Vec<(usize, Decider)> {
    flows
        .iter()
        .enumerate()
        .filter(|(_, f)| f.needs_filter())
        .take(QUEUE_RULED + DROP_RULED)
        .enumerate()
        .map(|(n, (i, f))| {
            if n >= QUEUE_RULED {
                return (i, Decider::RuleDrop);
            }
            let q = (1..pairs)
                .map(|d| (f.rx_q + d) % pairs)
                .find(|&q| q != f.rss_q)
                .unwrap_or((f.rx_q + 1) % pairs);
            (i, Decider::RuleQueue(q))
        })
        .collect()
}

#[allow(clippy::many_single_char_names)] // s session, c checks, n calls, d delta, w window: as in mod.rs
pub(super) fn rules_mixed(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.fault_workload()?;
    let listed = s
        .rule_list()
        .ctx("ethtool -n before any rule (does the device announce the rule extension?)")?;
    // The table's size, without RX_CLS_LOC_SPECIAL (the driver picks).
    let size = u32::try_from(listed.size & 0x7fff_ffff).unwrap_or(0);
    ensure!(
        size > 0,
        "ethtool -n: the driver offers no rule locations ({listed:?})"
    );
    ensure!(
        listed.rules.is_empty(),
        "rules before the scenario set any: {listed:?}"
    );
    let pairs = usize::from(s.pairs);
    let ruled = pick_ruled(&s.flows, pairs);
    ensure!(
        ruled.len() == QUEUE_RULED + DROP_RULED,
        "only {} flows need a filter; the scenario rules {}",
        ruled.len(),
        QUEUE_RULED + DROP_RULED
    );
    let m_before = s.module_counters()?;
    let mut rules = Rules::default();

    // Step 1: rules over the filters, set at a quiet point.
    let Some(start) = s.delivery_mark.take() else {
        bail!("no delivery mark: the workload was not started with one");
    };
    let m0 = s.quiet_point()?;
    let warm = s.span(&start, &m0)?;
    for (i, f) in s.flows.iter().enumerate() {
        warm.check_flow(i, f.local_port, 0, c);
    }
    s.trace_since_mark()?;
    let (_, trace_from) = s.trace_from(0)?;
    let mut locs: BTreeMap<usize, u32> = BTreeMap::new();
    for (n, &(i, d)) in ruled.iter().enumerate() {
        let action = match d {
            Decider::RuleQueue(q) => RuleAction::Queue(q as u32),
            _ => RuleAction::Drop,
        };
        // Half at a location of the driver's choosing, half at one of ours.
        let at = (n % 2 == 1).then_some(10 + n as u32);
        let op = Op::Insert {
            rule: flow_rule(&s.flows[i].key, action),
            loc: at,
        };
        let got = s.rule_call(&op)?;
        rules.answer(&op, Expect::Ok(at), got, size);
        if let Some(l) = got.loc.filter(|_| got.errno == 0) {
            locs.insert(i, l);
        }
    }
    s.check_rule_tables(c, "after the step-1 rules", &rules)?;
    s.resume_gen()?;
    std::thread::sleep(s.settings.measure);
    let m1 = s.quiet_point()?;
    let sp1 = s.span(&m0, &m1)?;
    let dev1: BTreeMap<u32, u64> = s
        .device_rules()?
        .into_iter()
        .map(|(r, h)| (r.loc, h))
        .collect();
    let mut w1 = Vec::new();
    let mut del_hits = BTreeMap::new();
    for &(i, d) in &ruled {
        let f = &s.flows[i];
        let loc = locs.get(&i).copied();
        let wf = WindowFlow::of(
            &sp1,
            i,
            f.local_port,
            d,
            f.rx_q,
            loc.and_then(|l| dev1.get(&l).copied()),
        );
        if let Some(l) = loc {
            // What the rule_del must say: the guest's count (queue rule),
            // or what was sent (drop rule).
            del_hits.insert(
                l,
                match d {
                    Decider::RuleQueue(q) => wf.by_queue.get(&q).copied().unwrap_or(0),
                    _ => wf.sent,
                },
            );
        }
        w1.push(wf);
    }
    for (i, f) in s.flows.iter().enumerate() {
        if ruled.iter().any(|&(r, _)| r == i) {
            continue;
        }
        sp1.check_flow(i, f.local_port, 0, c);
    }
    sp1.check_snmp(c);
    let dropped1 = sp1.dev(|st| st.peer.rule_dropped);
    for l in ruled_window_verdict(&w1, dropped1) {
        c.check(false, || l);
    }

    // Step 2: the rules deleted; the filters decide again.
    for &loc in locs.values() {
        let op = Op::Delete { loc };
        let got = s.rule_call(&op)?;
        rules.answer(&op, Expect::Ok(Some(loc)), got, size);
    }
    s.check_rule_tables(c, "after deleting the step-1 rules", &rules)?;
    s.resume_gen()?;
    std::thread::sleep(s.settings.measure);
    let m2 = s.quiet_point()?;
    let sp2 = s.span(&m1, &m2)?;
    let dev2 = s.device_rules()?;
    let w2: Vec<WindowFlow> = ruled
        .iter()
        .map(|&(i, _)| {
            let f = &s.flows[i];
            let rh = dev2
                .iter()
                .find(|(r, _)| locs.get(&i) == Some(&r.loc))
                .map(|(_, h)| *h);
            WindowFlow::of(&sp2, i, f.local_port, Decider::Filter, f.rx_q, rh)
        })
        .collect();
    for (i, f) in s.flows.iter().enumerate() {
        sp2.check_flow(i, f.local_port, 0, c);
    }
    sp2.check_snmp(c);
    for l in ruled_window_verdict(&w2, sp2.dev(|st| st.peer.rule_dropped)) {
        c.check(false, || l);
    }
    // From here on the delivery check expects every frame (the drop rule
    // is gone): the scenario's last window starts at this quiet point.
    s.delivery_mark = Some(m2);
    s.resume_gen()?;

    // Step 3: churn under traffic, aRFS re-steering every flow meanwhile.
    let seed = 48;
    let mut churn = Churn::new(seed, size, u32::from(s.pairs));
    let mut filter_lines = 0;
    let mut interleaved = 0;
    let mut n = 0;
    let mut call =
        |s: &mut Session, rules: &mut Rules, c: &mut Checks, n: &mut usize| -> Result<()> {
            *n += 1;
            let (op, want) = churn.next(&rules.set);
            let got = s.rule_call(&op)?;
            rules.answer(&op, want, got, size);
            if (*n).is_multiple_of(CHURN_CHECK_EVERY) {
                s.check_rule_tables(c, &format!("after churn call {n}"), rules)?;
            }
            Ok(())
        };
    for _ in 0..CHURN_OPS / CHURN_ROTATE_EVERY {
        // A round: calls, the receivers move (aRFS re-steers every flow),
        // calls while the module programs the REPLACEs, then the filters
        // settle before the next round (so that the trace-vs-guest check
        // sees the guest on each filter's queue between two moves).
        let (_, from) = s.trace_from(0)?;
        for _ in 0..CHURN_ROTATE_EVERY / 3 {
            call(s, &mut rules, c, &mut n)?;
        }
        s.rotate_receivers()?;
        // Calls go on until every flow's filter names its new queue (the
        // kernel asks as the flows' next frames arrive: on 7.3 later than
        // a burst of calls takes), so that they overlap the re-steering.
        let t0 = Instant::now();
        let mut after = 0;
        loop {
            call(s, &mut rules, c, &mut n)?;
            after += 1;
            if after >= CHURN_ROTATE_EVERY - CHURN_ROTATE_EVERY / 3
                && after % 5 == 0
                && (s.steered_now()? || t0.elapsed() > s.settings.warmup_timeout)
            {
                break;
            }
        }
        let (round, _) = s.trace_from(from)?;
        let (f, i) = interleaved_lines(&round);
        filter_lines += f;
        interleaved += i;
        s.wait_steered(&std::collections::BTreeSet::new())?;
        std::thread::sleep(Duration::from_secs(1));
    }
    c.check(interleaved > 0, || {
        format!("no ADD or REPLACE in the trace between two rule lines of a churn round ({filter_lines} in the rounds): aRFS programmed nothing while rules were being set")
    });
    s.check_rule_tables(c, "at the churn's end", &rules)?;
    let left = rules.set.len();
    let remaining: Vec<u32> = rules.set.keys().copied().collect();
    for loc in remaining {
        let op = Op::Delete { loc };
        let got = s.rule_call(&op)?;
        rules.answer(&op, Expect::Ok(Some(loc)), got, size);
    }
    s.check_rule_tables(c, "after deleting every rule", &rules)?;
    for l in &rules.findings {
        c.check(false, || l.clone());
    }

    // Step 4: the trace's rule lines, in call order.
    let (trace, _) = s.trace_from(trace_from)?;
    let (findings, judged) = rule_trace_verdict(&trace, &rules.done, &del_hits);
    for l in findings {
        c.check(false, || l);
    }

    // The workload's own verdicts, as in migrate: filters to the
    // receivers' new queues, a window, the trace against the guest.
    let warm2 = s.wait_steered(&std::collections::BTreeSet::new())?;
    std::thread::sleep(Duration::from_secs(1));
    let w = s.measure()?;
    let fig = s.check_window_bar(&w, c, 1.0);
    let delivery = s.check_delivery(c)?;
    let order = s.check_order(c)?;
    let traced = s.check_trace(c)?;
    let tables = match super::stress::tables_agree(s, Duration::from_secs(15))? {
        Ok(n) => format!("tables_agree={n}"),
        Err(e) => {
            c.check(false, || format!("after the churn: {e}"));
            "tables_agree=no".into()
        }
    };
    // The module's ethtool counters: no refusal, no timeout, and one op
    // acknowledged per successful call.
    let m_after = s.module_counters()?;
    let d = |k: &str| super::faults::delta(&m_after, &m_before, k);
    let ok_calls = rules.done.len() as u64;
    c.check(
        d("ethtool_refused") == 0 && d("ethtool_timeouts") == 0 && d("ethtool_ok") == ok_calls,
        || {
            format!(
                "module: ethtool_ok +{} (successful calls {ok_calls}), ethtool_refused +{}, ethtool_timeouts +{}",
                d("ethtool_ok"),
                d("ethtool_refused"),
                d("ethtool_timeouts")
            )
        },
    );
    c.check(m_after.get("rules_on_device") == 0, || {
        format!(
            "module: rules_on_device {} after every rule was deleted",
            m_after.get("rules_on_device")
        )
    });
    let mut us = rules.us.clone();
    us.sort_unstable();
    let pct = |p: usize| {
        us.get(us.len().saturating_sub(1) * p / 100)
            .map_or(0.0, |&x| x as f64 / 1000.0)
    };
    let ruled_txt: Vec<String> = ruled
        .iter()
        .zip(&w1)
        .map(|(&(_, d), wf)| match d {
            Decider::RuleQueue(q) => {
                format!(":{} q{}->q{q} {}/{}", wf.port, wf.filter_q, wf.got, wf.sent)
            }
            _ => format!(":{} drop {}/{}", wf.port, wf.got, wf.sent),
        })
        .collect();
    Ok(format!(
        "ruled=[{}] rule_dropped={dropped1} calls={} refused_as_expected={} set={} deleted={} left_after_churn={left} rule_lines={judged} filter_lines_in_churn={filter_lines} interleaved={interleaved} call_ms(p50/max)={:.1}/{:.1} rotations={} warmup={:.1}s {fig} {delivery} {order} {traced} {tables}",
        ruled_txt.join(" "),
        rules.calls,
        rules.refused,
        rules.done.iter().filter(|d| matches!(d, Done::Set { .. })).count(),
        rules.done.iter().filter(|d| matches!(d, Done::Del { .. })).count(),
        pct(50),
        pct(100),
        CHURN_OPS / CHURN_ROTATE_EVERY,
        warm2.as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use super::super::{GEN_IP, GEN_IP6, GEN_PORT};
    use super::*;
    use arfs::{L4Proto, RuleInput, TableEvent};

    fn key(port: u16) -> FlowKey {
        FlowKey::v4(L4Proto::Udp, GEN_IP, GEN_PORT, GUEST_IP, port)
    }

    #[test]
    fn flow_rule_is_the_devices_rule_for_that_flow_only() {
        for k in [
            key(20001),
            FlowKey::v6(L4Proto::Udp, GEN_IP6, GEN_PORT, GUEST_IP6, 20001),
        ] {
            let r = device_rule(3, &flow_rule(&k, RuleAction::Queue(2))).unwrap();
            assert_eq!(r.check(), Ok(()));
            assert!(r.matches(&RuleInput::of_flow(&k)));
            let other = FlowKey::new(k.proto(), k.src_ip(), k.src_port(), k.dst_ip(), 20002);
            assert!(!r.matches(&RuleInput::of_flow(&other.unwrap())));
            assert_eq!(r.action, arfs::RuleAction::Queue(2));
        }
    }

    #[test]
    fn churn_rules_are_valid_and_match_no_workload_frame() {
        let mut ch = Churn::new(7, 128, 4);
        let flows: Vec<FlowKey> = (0..200)
            .flat_map(|p| {
                [
                    key(20000 + p),
                    FlowKey::v6(L4Proto::Udp, GEN_IP6, GEN_PORT, GUEST_IP6, 20000 + p),
                ]
            })
            .collect();
        let mut kinds = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let spec = ch.rule();
            kinds.insert(spec.flow);
            let r = device_rule(0, &spec).unwrap();
            assert_eq!(r.check(), Ok(()), "{spec:?}");
            for k in &flows {
                assert!(!r.matches(&RuleInput::of_flow(k)), "{spec:?} matches {k}");
            }
            // And the agent can encode it.
            vnic_agent::ntuple::insert_request(&spec, 0).unwrap();
        }
        assert_eq!(kinds.len(), 6);
    }

    /// A driver like the module: ANY takes the lowest free location.
    fn driver(set: &mut BTreeMap<u32, RuleSpec>, op: &Op, size: u32, queues: u32) -> RuleOp {
        let err = |e| RuleOp {
            loc: None,
            errno: e,
            us: 1,
        };
        match op {
            Op::Insert { rule, loc } => {
                if matches!(rule.action, RuleAction::Queue(q) if q >= queues) {
                    return err(EINVAL);
                }
                let l = match loc {
                    Some(l) if *l >= size => return err(EINVAL),
                    Some(l) => *l,
                    None => match (0..size).find(|l| !set.contains_key(l)) {
                        Some(l) => l,
                        None => return err(libc::ENOSPC),
                    },
                };
                set.insert(l, rule.clone());
                RuleOp {
                    loc: Some(l),
                    errno: 0,
                    us: 1,
                }
            }
            Op::Delete { loc } => {
                if set.remove(loc).is_none() {
                    return err(ENOENT);
                }
                RuleOp {
                    loc: Some(*loc),
                    errno: 0,
                    us: 1,
                }
            }
        }
    }

    #[test]
    fn churn_against_a_faithful_driver_finds_nothing_and_a_lying_one_is_named() {
        let (size, queues) = (128, 4);
        let mut ch = Churn::new(48, size, queues);
        let mut rules = Rules::default();
        let mut dev = BTreeMap::new();
        for _ in 0..CHURN_OPS {
            let (op, want) = ch.next(&rules.set);
            let got = driver(&mut dev, &op, size, queues);
            rules.answer(&op, want, got, size);
        }
        assert!(rules.findings.is_empty(), "{:?}", rules.findings);
        assert_eq!(rules.set, dev);
        assert!(rules.refused >= 10, "{}", rules.refused);
        let sets = rules
            .done
            .iter()
            .filter(|d| matches!(d, Done::Set { prev: Some(_), .. }))
            .count();
        assert!(sets > 0, "no replacement in the churn");
        assert!(rules.set.len() <= CHURN_MAX_LIVE + 1);
        // The lists agree; a driver that lost one rule is named.
        let listed = RuleList {
            size: u64::from(size) | 0x8000_0000,
            count: dev.len() as u32,
            rules: dev.iter().map(|(l, r)| (*l, r.clone())).collect(),
        };
        let device: Vec<arfs::Rule> = dev
            .iter()
            .map(|(l, r)| device_rule(*l, r).unwrap())
            .collect();
        assert!(table_verdict("t", &rules.set, &listed, &device).is_empty());
        let mut lost = listed.clone();
        let gone = lost.rules.remove(0).0;
        let f = table_verdict("t", &rules.set, &lost, &device[1..]);
        assert_eq!(f.len(), 2, "{f:?}"); // ethtool's location, the device's
        assert!(f[0].contains(&format!("location {gone}")), "{f:?}");
        lost.count -= 1;
        assert_eq!(table_verdict("t", &rules.set, &lost, &device).len(), 2);
        // A call answering an unexpected errno, or a used location for ANY.
        let mut r2 = Rules::default();
        r2.set.insert(0, ch.rule());
        let op = Op::Insert {
            rule: ch.rule(),
            loc: None,
        };
        r2.answer(
            &op,
            Expect::Ok(None),
            RuleOp {
                loc: Some(0),
                errno: 0,
                us: 1,
            },
            size,
        );
        r2.answer(
            &Op::Delete { loc: 5 },
            Expect::Errno(ENOENT),
            RuleOp {
                loc: Some(5),
                errno: 0,
                us: 1,
            },
            size,
        );
        r2.answer(
            &op,
            Expect::Ok(None),
            RuleOp {
                loc: None,
                errno: libc::ETIMEDOUT,
                us: 1,
            },
            size,
        );
        assert_eq!(r2.findings.len(), 3, "{:?}", r2.findings);
    }

    fn wf(decider: Decider) -> WindowFlow {
        WindowFlow {
            port: 20001,
            decider,
            filter_q: 1,
            sent: 150,
            got: 150,
            by_queue: [(2, 150)].into(),
            filter_hits: Some((1, 0)),
            rule_hits: Some(150),
        }
    }

    /// (the flow, rule_dropped, findings, a part of the first).
    #[test]
    fn who_decided_is_judged_from_the_guest_and_the_device() {
        let drop = WindowFlow {
            got: 0,
            by_queue: BTreeMap::new(),
            ..wf(Decider::RuleDrop)
        };
        let back = WindowFlow {
            by_queue: [(1, 150)].into(),
            filter_hits: Some((1, 150)),
            rule_hits: None,
            ..wf(Decider::Filter)
        };
        let cases: Vec<(WindowFlow, u64, usize, &str)> = vec![
            (wf(Decider::RuleQueue(2)), 0, 0, ""),
            (drop.clone(), 150, 0, ""),
            (back.clone(), 0, 0, ""),
            // The filter won: the guest saw it on the filter's queue.
            (
                WindowFlow {
                    by_queue: [(1, 150)].into(),
                    filter_hits: Some((1, 150)),
                    rule_hits: Some(0),
                    ..wf(Decider::RuleQueue(2))
                },
                0,
                3,
                "under its rule to q2",
            ),
            // One frame on another queue.
            (
                WindowFlow {
                    by_queue: [(2, 149), (0, 1)].into(),
                    ..wf(Decider::RuleQueue(2))
                },
                0,
                1,
                "q0: 1",
            ),
            // The filter was replaced during the window.
            (
                WindowFlow {
                    filter_hits: None,
                    ..wf(Decider::RuleQueue(2))
                },
                0,
                1,
                "did not stand",
            ),
            // The drop rule let frames through, and the counter is short.
            (
                WindowFlow {
                    got: 3,
                    by_queue: [(1, 3)].into(),
                    ..drop.clone()
                },
                147,
                2,
                "still got 3",
            ),
            (drop, 149, 1, "peer.rule_dropped"),
            // Back to the filter, but a frame lost, and the rule still there.
            (
                WindowFlow {
                    got: 149,
                    by_queue: [(1, 149)].into(),
                    ..back.clone()
                },
                0,
                1,
                "149 of 150",
            ),
            (
                WindowFlow {
                    rule_hits: Some(0),
                    ..back
                },
                0,
                1,
                "still in the device's table",
            ),
        ];
        for (i, (f, dropped, n, part)) in cases.into_iter().enumerate() {
            let v = ruled_window_verdict(&[f], dropped);
            assert_eq!(v.len(), n, "case {i}: {v:?}");
            if n > 0 {
                assert!(v.iter().any(|l| l.contains(part)), "case {i}: {v:?}");
            }
        }
    }

    #[test]
    fn the_rule_lines_follow_the_calls() {
        let k = key(20001);
        let a = flow_rule(&k, RuleAction::Queue(2));
        let b = flow_rule(&k, RuleAction::Drop);
        let done = vec![
            Done::Set {
                loc: 0,
                rule: a.clone(),
                prev: None,
            },
            Done::Set {
                loc: 0,
                rule: b.clone(),
                prev: Some(a.clone()),
            },
            Done::Del {
                loc: 0,
                rule: b.clone(),
            },
        ];
        let ev = |e: TableEvent| TraceRecord::from_event(1, 1, &e);
        let ra = device_rule(0, &a).unwrap();
        let rb = device_rule(0, &b).unwrap();
        let good = vec![
            ev(TableEvent::RuleSet {
                seq: 1,
                rule: ra,
                prev: None,
            }),
            TraceRecord::gen_change(2, 1, 0, "start"),
            ev(TableEvent::RuleSet {
                seq: 2,
                rule: rb,
                prev: Some(ra),
            }),
            ev(TableEvent::RuleRemoved {
                seq: Some(3),
                rule: rb,
                cause: arfs::table::ExtCause::Op,
            }),
        ];
        let mut good = good;
        good[3].hits = Some(40);
        let hits: BTreeMap<u32, u64> = [(0, 40)].into();
        assert_eq!(rule_trace_verdict(&good, &done, &hits), (vec![], 3));
        // Hits other than the guest's count.
        let f = rule_trace_verdict(&good, &done, &[(0, 41)].into()).0;
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("41 hits"), "{f:?}");
        // A wrong prev_rule, a missing line, an extra reject.
        let mut bad = good.clone();
        bad[2].prev_rule = None;
        assert_eq!(rule_trace_verdict(&bad, &done, &hits).0.len(), 1);
        let f = rule_trace_verdict(&good[..3], &done, &hits).0;
        assert!(f[0].contains("call 3"), "{f:?}");
        let mut extra = good.clone();
        extra.push(ev(TableEvent::RuleRejected {
            seq: 4,
            loc: 9,
            status: arfs::OpStatus::UnknownId,
        }));
        let f = rule_trace_verdict(&extra, &done, &hits).0;
        assert!(f[0].contains("no successful call"), "{f:?}");
    }

    #[test]
    fn interleaving_counts_filter_lines_between_rule_lines() {
        let k = key(20001);
        let rule = device_rule(0, &flow_rule(&k, RuleAction::Drop)).unwrap();
        let set = TraceRecord::from_event(
            1,
            1,
            &TableEvent::RuleSet {
                seq: 1,
                rule,
                prev: None,
            },
        );
        let add = TraceRecord::from_event(
            1,
            1,
            &TableEvent::Added {
                seq: 2,
                id: 1,
                rxq: 1,
                flow: k,
            },
        );
        let del = TraceRecord::from_event(
            1,
            1,
            &TableEvent::RuleRemoved {
                seq: Some(3),
                rule,
                cause: arfs::table::ExtCause::Op,
            },
        );
        let v = vec![
            add.clone(),
            set.clone(),
            add.clone(),
            add.clone(),
            del,
            add.clone(),
        ];
        assert_eq!(interleaved_lines(&v), (4, 2));
        assert_eq!(interleaved_lines(&[add.clone(), set]), (1, 0));
        assert_eq!(interleaved_lines(&[add]), (1, 0));
    }

    #[test]
    fn ruled_flows_avoid_the_filter_and_rss_queues() {
        let mk = |rss_q, rx_q| super::super::Flow {
            local_port: 1,
            cpu: rx_q,
            key: key(1),
            rss_q,
            rx_q,
        };
        let flows = vec![mk(0, 0), mk(1, 2), mk(3, 0), mk(2, 1), mk(0, 3), mk(1, 1)];
        let p = pick_ruled(&flows, 4);
        assert_eq!(
            p,
            vec![
                (1, Decider::RuleQueue(3)),
                (2, Decider::RuleQueue(1)),
                (3, Decider::RuleQueue(3)),
                (4, Decider::RuleDrop)
            ]
        );
        // Two queues: the only other queue is the RSS queue.
        let p = pick_ruled(&[mk(1, 0), mk(0, 1), mk(1, 0), mk(0, 1)], 2);
        assert_eq!(p[0], (0, Decider::RuleQueue(1)));
    }
}
