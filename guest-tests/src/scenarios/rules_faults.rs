//! `rules-faults`: the module's ethtool ntuple path held to what a real
//! driver must keep under the device's faults (aRFS/kmod/README.md,
//! "ethtool: ntuple rules and RSS").
//!
//! 1. **Lossy channel.** With [`MGMT_LOSS`] of the management frames lost
//!    each way (`mgmt_loss_rate`), [`LOSSY_INSERTS`] rule inserts (half at
//!    `RX_CLS_LOC_ANY`, half at chosen locations) and a delete of every
//!    other rule: every call succeeds (retransmission hides the loss) within
//!    [`CALL_RTOS`] retransmit timeouts plus [`CALL_SLACK`]
//!    ([`slow_calls`]); `ethtool -n` and the device's table equal the
//!    scenario's; the module retransmitted and the device lost frames both
//!    ways (the check was exercised), no call timed out or was refused,
//!    nothing was replayed, one acknowledged op per call
//!    ([`lossy_verdict`]); the trace's rule lines follow the calls in
//!    order, a frame applied twice only after a window reset and then
//!    idempotently ([`lossy_trace_verdict`]).
//! 2. **Device reset.** Queue rules for [`QUEUE_RULED`] flows of a fresh
//!    workload join them; the daemon is killed and restarted (QEMU
//!    reconnects: a new generation, an empty table, as `device-restart`).
//!    Within [`REPLAY_BOUND`] the module takes the new generation and the
//!    device holds every rule again: `ethtool -n` and the device's table
//!    equal the scenario's, `ethtool_replayed` rose by the rules per
//!    generation change, the new daemon's trace has a `rule_set` of each
//!    and nothing else ([`replay_verdict`]). Then the workload runs on the
//!    new daemon: over a window between two quiet points each ruled flow's
//!    datagrams all arrived on its rule's queue as the guest saw it, the
//!    rule counted each frame and its filter stood with no hit
//!    (`rules::ruled_window_verdict`, exact).
//! 3. **Unload.** `rmmod` with the rules present: within [`UNLOAD_BOUND`]
//!    the device holds no rule, and the trace has one `rule_del` with
//!    reason `unload` per rule, of that rule, and the FLUSH(unload)
//!    ([`unload_verdict`]). Reloaded, `ethtool -n` lists nothing and the
//!    device has no rule.

use super::rules::{
    device_rule, flow_rule, pick_ruled, rule_trace_verdict, ruled_window_verdict, table_verdict,
    Churn, Decider, Done, Expect, Op, Rules, WindowFlow, QUEUE_RULED,
};
use super::{Checks, Session, IFNAME};
use crate::harness::{wait_for, Context, Result};
use crate::proto::{RuleAction, RuleSpec};
use crate::{bail, ensure};
use arfs::{EventKind, TraceRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Management frames the device loses, each way (`mgmt_loss_rate`). The
/// module answers a call `ETIMEDOUT` after 7 retransmit timeouts, by when
/// its op was sent 6 times and, after a resync HELLO, once more
/// ([`timeout_chance`]): a correct module fails this scenario's 75 calls
/// in about 0.1% of runs at 0.1 each way (about 15 retransmissions a run),
/// in about 30% at 0.25.
pub(super) const MGMT_LOSS: f64 = 0.1;
/// Rules inserted under loss; every other one is then deleted.
pub(super) const LOSSY_INSERTS: usize = 50;
/// The chosen locations of the lossy inserts start here (the driver's
/// `RX_CLS_LOC_ANY` picks are the lowest free ones, below).
pub(super) const LOSSY_LOC_BASE: u32 = 64;
/// A call's bound in retransmit timeouts (the module's `rto_ms`): the
/// module answers `ETIMEDOUT` after `VNIC_MAX_RETRIES + 2` = 7.
pub(super) const CALL_RTOS: u64 = 7;
/// Beyond those: the agent's ioctl and a TCG vCPU's scheduling.
pub(super) const CALL_SLACK: Duration = Duration::from_millis(500);
/// From the new daemon's connection to the module holding every rule on
/// the device again.
pub(super) const REPLAY_BOUND: Duration = Duration::from_secs(30);
/// From `rmmod`'s return to the device holding no rule (the FLUSH(unload)
/// waits for its ACK: the table is empty when it returns).
pub(super) const UNLOAD_BOUND: Duration = Duration::from_secs(2);
/// The module's requests all answered (`ethtool_dirty` 0, nothing in
/// flight), with no loss.
const SETTLE_BOUND: Duration = Duration::from_secs(10);
/// Flows of the workload after the reset.
const FLOWS: usize = 16;
/// The lossy calls' rules (reproducible).
const SEED: u64 = 49;

// ---- verdicts ---------------------------------------------------------------

/// Sends of an op before the module's resync HELLO (`VNIC_MAX_RETRIES` + 1).
const SENDS_BEFORE_RESYNC: i32 = 6;

/// The chance that at least one of `calls` calls times out with a correct
/// module at `loss` each way: a send is answered with `(1 - loss)^2`; a
/// call fails when its first [`SENDS_BEFORE_RESYNC`] sends all go
/// unanswered and then the resync HELLO or the last send does too.
pub(super) fn timeout_chance(loss: f64, calls: usize) -> f64 {
    let answered = (1.0 - loss).powi(2);
    let per_call = (1.0 - answered).powi(SENDS_BEFORE_RESYNC) * (1.0 - answered * answered);
    1.0 - (1.0 - per_call).powi(i32::try_from(calls).unwrap_or(i32::MAX))
}

/// Calls (µs, as the agent timed the ioctl) slower than `bound`.
pub(super) fn slow_calls(us: &[u64], bound: Duration) -> Vec<String> {
    let b = u64::try_from(bound.as_micros()).unwrap_or(u64::MAX);
    let slow: Vec<String> = us
        .iter()
        .enumerate()
        .filter(|(_, &t)| t > b)
        .map(|(i, &t)| format!("call {} {:.1} ms", i + 1, t as f64 / 1000.0))
        .collect();
    if slow.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "{} calls took longer than {:.0} ms under loss: {}",
        slow.len(),
        b as f64 / 1000.0,
        slow.join(", ")
    )]
}

/// The counters of step 1 (deltas over the lossy calls).
#[derive(Debug, Clone, Default)]
pub(super) struct LossyFigures {
    /// The module's `retransmits` and `stalls` (window resets).
    pub retransmits: u64,
    pub stalls: u64,
    /// The device's `mgmt.dropped_by_loss`, `mgmt.replies_dropped_by_loss`.
    pub lost_requests: u64,
    pub lost_replies: u64,
    /// The module's `ethtool_ok`, `ethtool_refused`, `ethtool_timeouts`,
    /// `ethtool_replayed`.
    pub eth_ok: u64,
    pub eth_refused: u64,
    pub eth_timeouts: u64,
    pub eth_replayed: u64,
    /// Calls that succeeded.
    pub ok_calls: u64,
}

/// See the module's doc, step 1.
pub(super) fn lossy_verdict(f: &LossyFigures) -> Vec<String> {
    let mut out = Vec::new();
    if f.lost_requests == 0 || f.lost_replies == 0 {
        out.push(format!(
            "the device lost {} requests and {} replies: the loss was not exercised both ways",
            f.lost_requests, f.lost_replies
        ));
    }
    if f.retransmits == 0 {
        out.push("the module retransmitted nothing: the loss was not exercised".into());
    }
    if f.eth_ok != f.ok_calls || f.eth_refused != 0 || f.eth_timeouts != 0 {
        out.push(format!(
            "module: ethtool_ok +{} (successful calls {}), ethtool_refused +{}, ethtool_timeouts +{}",
            f.eth_ok, f.ok_calls, f.eth_refused, f.eth_timeouts
        ));
    }
    if f.eth_replayed != 0 {
        out.push(format!(
            "module: ethtool_replayed +{} under loss alone (no new generation)",
            f.eth_replayed
        ));
    }
    out
}

/// See the module's doc, step 1: `records` from before the first call,
/// `done` the successful calls. A rule frame is applied once, unless the
/// module sent it again after a window reset (`stalls`): then the device
/// sets the same rule again (`prev_rule` = the rule) or finds the location
/// already empty (`rule_reject unknown_id`). Those are set aside (at most
/// `stalls`), the rest must follow the calls. Returns (findings, lines
/// judged, re-applications).
pub(super) fn lossy_trace_verdict(
    records: &[TraceRecord],
    done: &[Done],
    stalls: u64,
) -> (Vec<String>, usize, u64) {
    let again = |r: &TraceRecord| match r.event {
        EventKind::RuleSet => r.rule.is_some() && r.prev_rule == r.rule,
        EventKind::RuleReject => r.reason.as_deref() == Some("unknown_id"),
        _ => false,
    };
    let reapplied = records.iter().filter(|r| again(r)).count() as u64;
    let kept: Vec<TraceRecord> = records.iter().filter(|r| !again(r)).cloned().collect();
    let (mut out, judged) = rule_trace_verdict(&kept, done, &BTreeMap::new());
    if reapplied > stalls {
        out.push(format!(
            "{reapplied} rule ops applied a second time (the same rule set again, or a delete of an empty location), {stalls} window resets: the device applied a retransmission twice, or the module sent a change again that the device had acknowledged"
        ));
    }
    (out, judged, reapplied)
}

/// See the module's doc, step 2: `records` the new daemon's trace up to
/// the replay, `replayed` and `gen_changes` the module's deltas,
/// `rss_default` whether its RSS configuration is the device's default
/// (then nothing of it is replayed).
pub(super) fn replay_verdict(
    want: &BTreeMap<u32, RuleSpec>,
    records: &[TraceRecord],
    replayed: u64,
    gen_changes: u64,
    rss_default: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    if gen_changes == 0 {
        out.push("the module counted no generation change after the device's reset".into());
    }
    let per = want.len() as u64 + u64::from(!rss_default);
    if replayed != per * gen_changes {
        out.push(format!(
            "module: ethtool_replayed +{replayed}; {} rules{} for each of {gen_changes} generation changes make {}",
            want.len(),
            if rss_default { "" } else { " and the RSS configuration" },
            per * gen_changes
        ));
    }
    let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        match r.event {
            EventKind::RuleSet => {
                let loc = r.loc.unwrap_or(u32::MAX);
                let w = want.get(&loc).and_then(|x| device_rule(loc, x));
                if w.is_none() || r.rule != w || r.prev_rule.is_some() {
                    out.push(format!(
                        "trace line {i}: rule_set at {loc} of {:?} replacing {:?}; the module holds {w:?} there, on a table the reset emptied",
                        r.rule, r.prev_rule
                    ));
                }
                *seen.entry(loc).or_default() += 1;
            }
            // A second generation change empties the table again.
            EventKind::RuleDel if gen_changes > 1 && r.reason.as_deref() == Some("reset") => {}
            EventKind::RuleDel | EventKind::RuleReject => out.push(format!(
                "trace line {i}: {:?} at {:?} reason {:?} after the reset: the module replays sets only",
                r.event, r.loc, r.reason
            )),
            _ => {}
        }
    }
    for loc in want.keys() {
        let n = seen.get(loc).copied().unwrap_or(0);
        if n == 0 || n > gen_changes.max(1) {
            out.push(format!(
                "the new daemon's trace has {n} rule_set lines at location {loc} ({gen_changes} generation changes)"
            ));
        }
    }
    out
}

/// See the module's doc, step 3: `records` from just before `rmmod` to
/// its FLUSH, `device_after` the device's rules once it returned.
pub(super) fn unload_verdict(
    want: &BTreeMap<u32, RuleSpec>,
    records: &[TraceRecord],
    device_after: &[arfs::Rule],
) -> Vec<String> {
    let mut out = Vec::new();
    if !device_after.is_empty() {
        out.push(format!(
            "after rmmod the device still holds {} rules, at {:?}",
            device_after.len(),
            device_after.iter().map(|r| r.loc).collect::<Vec<_>>()
        ));
    }
    if !records
        .iter()
        .any(|r| r.event == EventKind::Flush && r.reason.as_deref() == Some("unload"))
    {
        out.push("the trace has no FLUSH with reason unload".into());
    }
    let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        match r.event {
            EventKind::RuleDel if r.reason.as_deref() == Some("unload") => {
                let loc = r.loc.unwrap_or(u32::MAX);
                let w = want.get(&loc).and_then(|x| device_rule(loc, x));
                if w.is_none() || r.rule != w {
                    out.push(format!(
                        "trace line {i}: rule_del (unload) at {loc} of {:?}; the module held {w:?} there",
                        r.rule
                    ));
                }
                *seen.entry(loc).or_default() += 1;
            }
            EventKind::RuleSet | EventKind::RuleDel | EventKind::RuleReject => out.push(format!(
                "trace line {i}: {:?} at {:?} reason {:?} during the unload",
                r.event, r.loc, r.reason
            )),
            _ => {}
        }
    }
    for loc in want.keys() {
        let n = seen.get(loc).copied().unwrap_or(0);
        if n != 1 {
            out.push(format!(
                "{n} rule_del lines with reason unload at location {loc}, which held a rule"
            ));
        }
    }
    out
}

// ---- the scenario -----------------------------------------------------------

impl Session {
    /// Wait until the module's ethtool requests are all answered and
    /// nothing is in flight; returns how long it took.
    fn eth_settled(&mut self, what: &str) -> Result<Duration> {
        let t0 = Instant::now();
        let mut last = String::new();
        let r = wait_for(SETTLE_BOUND, what, || {
            let m = self.module_counters()?;
            last = format!(
                "ethtool_dirty {} inflight {} state {:?}",
                m.get("ethtool_dirty"),
                m.get("inflight"),
                m.state(IFNAME)
            );
            Ok((m.get("ethtool_dirty") == 0
                && m.get("inflight") == 0
                && m.state(IFNAME) == Some("active"))
            .then(|| t0.elapsed()))
        });
        match r {
            Ok(t) => Ok(t),
            Err(e) => bail!("{e}: {last}"),
        }
    }

    /// The lossy calls of step 1.
    fn lossy_calls(&mut self, rules: &mut Rules, size: u32) -> Result<()> {
        let mut churn = Churn::new(SEED, size, u32::from(self.pairs));
        for n in 0..LOSSY_INSERTS {
            let loc = (n % 2 == 1).then_some(LOSSY_LOC_BASE + n as u32);
            let op = Op::Insert {
                rule: churn.rule(),
                loc,
            };
            let got = self.rule_call(&op)?;
            rules.answer(&op, Expect::Ok(loc), got, size);
        }
        let gone: Vec<u32> = rules.set.keys().copied().step_by(2).collect();
        for loc in gone {
            let op = Op::Delete { loc };
            let got = self.rule_call(&op)?;
            rules.answer(&op, Expect::Ok(Some(loc)), got, size);
        }
        Ok(())
    }

    /// The device's rule hits by location.
    fn rule_hits(&mut self) -> Result<BTreeMap<u32, u64>> {
        Ok(self
            .device_rules()?
            .into_iter()
            .map(|(r, h)| (r.loc, h))
            .collect())
    }
}

#[allow(clippy::too_many_lines)] // three steps, each read top to bottom
pub(super) fn rules_faults(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    // The install sets or deletes every location: wait for it.
    s.eth_settled("the module's install-time rule requests to be answered")?;
    let listed = s
        .rule_list()
        .ctx("ethtool -n before any rule (does the device announce the rule extension?)")?;
    let size = u32::try_from(listed.size & 0x7fff_ffff).unwrap_or(0);
    ensure!(
        size >= LOSSY_LOC_BASE + LOSSY_INSERTS as u32,
        "the driver offers {size} rule locations; the scenario uses up to {}",
        LOSSY_LOC_BASE + LOSSY_INSERTS as u32
    );
    ensure!(
        listed.rules.is_empty(),
        "rules before the scenario set any: {listed:?}"
    );

    // Step 1: the lossy channel.
    let m0 = s.module_counters()?;
    let d0 = s.guest.ctl.stats()?;
    let rto_ms = m0.get("rto_ms");
    let bound = Duration::from_millis(CALL_RTOS * rto_ms) + CALL_SLACK;
    s.trace_since_mark()?;
    let mut rules = Rules::default();
    s.guest.ctl.set("mgmt_loss_rate", MGMT_LOSS)?;
    let lossy = s.lossy_calls(&mut rules, size);
    s.guest.ctl.set("mgmt_loss_rate", 0)?;
    lossy?;
    let lossy_calls = rules.calls;
    let lossy_findings = rules.findings.len();
    s.eth_settled("the module to settle after the lossy calls")?;
    let m1 = s.module_counters()?;
    let d1 = s.guest.ctl.stats()?;
    let trace1 = s.trace_since_mark()?;
    for l in &rules.findings {
        c.check(false, || format!("under loss: {l}"));
    }
    for l in slow_calls(&rules.us, bound) {
        c.check(false, || l);
    }
    let moved = |k: &str| super::faults::delta(&m1, &m0, k);
    let figs = LossyFigures {
        retransmits: moved("retransmits"),
        stalls: moved("stalls"),
        lost_requests: d1
            .mgmt
            .dropped_by_loss
            .saturating_sub(d0.mgmt.dropped_by_loss),
        lost_replies: d1
            .mgmt
            .replies_dropped_by_loss
            .saturating_sub(d0.mgmt.replies_dropped_by_loss),
        eth_ok: moved("ethtool_ok"),
        eth_refused: moved("ethtool_refused"),
        eth_timeouts: moved("ethtool_timeouts"),
        eth_replayed: moved("ethtool_replayed"),
        ok_calls: rules.done.len() as u64,
    };
    for l in lossy_verdict(&figs) {
        c.check(false, || l);
    }
    let (findings, judged1, reapplied) = lossy_trace_verdict(&trace1, &rules.done, figs.stalls);
    for l in findings {
        c.check(false, || l);
    }
    s.check_rule_tables(c, "after the lossy calls", &rules)?;
    let mut us = rules.us.clone();
    us.sort_unstable();
    let max_ms = us.last().map_or(0.0, |&x| x as f64 / 1000.0);
    let p50_ms = us.get(us.len() / 2).map_or(0.0, |&x| x as f64 / 1000.0);

    // Step 2: queue rules for workload flows, then the device's reset.
    let flows = s.steering_flows(FLOWS)?;
    let ruled: Vec<(usize, usize)> = pick_ruled(&flows, usize::from(s.pairs))
        .into_iter()
        .filter_map(|(i, dec)| match dec {
            Decider::RuleQueue(q) => Some((i, q)),
            _ => None,
        })
        .collect();
    ensure!(
        ruled.len() == QUEUE_RULED,
        "only {} flows need a filter; the scenario rules {QUEUE_RULED}",
        ruled.len()
    );
    let mut locs: BTreeMap<usize, u32> = BTreeMap::new();
    for &(i, q) in &ruled {
        let op = Op::Insert {
            rule: flow_rule(&flows[i].key, RuleAction::Queue(q as u32)),
            loc: None,
        };
        let got = s.rule_call(&op)?;
        rules.answer(&op, Expect::Ok(None), got, size);
        if let Some(l) = got.loc.filter(|_| got.errno == 0) {
            locs.insert(i, l);
        }
    }
    for l in rules.findings.iter().skip(lossy_findings) {
        c.check(false, || format!("before the reset: {l}"));
    }
    s.check_rule_tables(c, "before the reset", &rules)?;
    s.eth_settled("the module to settle before the reset")?;
    let m2 = s.module_counters()?;
    let gen0 = s.guest.ctl.stats()?.generation;
    s.trace_since_mark()?;
    let t0 = Instant::now();
    s.guest.restart_vnic(Duration::from_millis(500))?;
    // The old daemon's flow sets and trace are gone with it.
    s.gen_running = false;
    s.gen_sets.clear();
    s.trace_mark = 0;
    let pairs = s.pairs;
    let ctl = &mut s.guest.ctl;
    let st = wait_for(
        Duration::from_mins(1),
        "QEMU to reconnect and enable every queue pair",
        || {
            let st = ctl.stats()?;
            Ok((st.connected && st.enabled_pairs == pairs).then_some(st))
        },
    )?;
    let gen1 = st.generation;
    c.check(gen1 != gen0, || {
        format!("generation unchanged ({gen0:#x}) across the restart")
    });
    let n_rules = rules.set.len() as u64;
    let mut last = String::new();
    let replay = wait_for(
        REPLAY_BOUND,
        "the module to take the new generation and replay its rules",
        || {
            let m = s.module_counters()?;
            last = format!(
                "generation {} (device {gen1}), generation_changes +{}, rules_on_device {} of {n_rules}, ethtool_dirty {}, state {:?}",
                m.get("generation"),
                super::faults::delta(&m, &m2, "generation_changes"),
                m.get("rules_on_device"),
                m.get("ethtool_dirty"),
                m.state(IFNAME)
            );
            let ok = m.get("generation") == u64::from(gen1)
                && m.get("generation_changes") > m2.get("generation_changes")
                && m.get("rules_on_device") == n_rules
                && m.get("ethtool_dirty") == 0
                && m.state(IFNAME) == Some("active");
            Ok(ok.then_some(m))
        },
    );
    let m3 = match replay {
        Ok(m) => m,
        Err(e) => bail!("{e}: {last}"),
    };
    let replay_t = t0.elapsed();
    s.check_rule_tables(c, "after the reset", &rules)?;
    let trace2 = s.trace_since_mark()?;
    let replayed = super::faults::delta(&m3, &m2, "ethtool_replayed");
    let gen_changes = super::faults::delta(&m3, &m2, "generation_changes");
    let word = |k: &str| m3.words.get(&format!("{IFNAME}/{k}")).cloned();
    let rss_default = word("rss_indir").as_deref() == Some("default")
        && word("rss_key").as_deref() == Some("default");
    for l in replay_verdict(&rules.set, &trace2, replayed, gen_changes, rss_default) {
        c.check(false, || l);
    }

    // The workload on the new daemon: the ruled flows on their rules'
    // queues, over a window between two quiet points.
    s.udp_start(&flows)?;
    s.flows = flows;
    s.start_mark()?;
    s.start_gen_per_flow(s.settings.rate)?;
    s.wait_steered(&BTreeSet::new())?;
    std::thread::sleep(Duration::from_secs(1));
    let mark0 = s.quiet_point()?;
    let hits_a = s.rule_hits()?;
    s.resume_gen()?;
    std::thread::sleep(s.settings.measure);
    let mark1 = s.quiet_point()?;
    let hits_b = s.rule_hits()?;
    let sp = s.span(&mark0, &mark1)?;
    let mut window = Vec::new();
    for &(i, q) in &ruled {
        let f = &s.flows[i];
        let hits = locs.get(&i).and_then(|l| {
            let (h0, h1) = (hits_a.get(l)?, hits_b.get(l)?);
            Some(h1.saturating_sub(*h0))
        });
        window.push(WindowFlow {
            port: f.local_port,
            decider: Decider::RuleQueue(q),
            filter_q: f.rx_q,
            sent: sp.sent[i],
            got: sp.got[i].distinct,
            by_queue: sp.by_queue[i].clone(),
            filter_hits: sp.hits[i],
            rule_hits: hits,
        });
    }
    for (i, f) in s.flows.iter().enumerate() {
        if !ruled.iter().any(|&(r, _)| r == i) {
            sp.check_flow(i, f.local_port, 0, c);
        }
    }
    sp.check_snmp(c);
    for l in ruled_window_verdict(&window, sp.dev(|st| st.peer.rule_dropped)) {
        c.check(false, || format!("after the reset: {l}"));
    }
    let ruled_txt: Vec<String> = window
        .iter()
        .map(|w| {
            let q = match w.decider {
                Decider::RuleQueue(q) => q,
                _ => usize::MAX,
            };
            format!(":{} q{}->q{q} {}/{}", w.port, w.filter_q, w.got, w.sent)
        })
        .collect();

    // Step 3: rmmod with the rules present (the generator stays paused),
    // then a reload.
    s.trace_since_mark()?;
    let t1 = Instant::now();
    s.rmmod(Duration::from_mins(1)).ctx("rmmod vnic_arfs")?;
    let rmmod_t = t1.elapsed();
    let t2 = Instant::now();
    let emptied = wait_for(UNLOAD_BOUND, "the device to drop every rule", || {
        Ok(s.device_rules()?.is_empty().then_some(()))
    });
    let empty_t = t2.elapsed();
    let dev_after: Vec<arfs::Rule> = s.device_rules()?.into_iter().map(|(r, _)| r).collect();
    if let Err(e) = emptied {
        c.check(false, || format!("{e}"));
    }
    let mut trace3 = Vec::new();
    let flushed = wait_for(
        Duration::from_secs(10),
        "the trace to record the unload FLUSH",
        || {
            trace3.extend(s.trace_since_mark()?);
            Ok(trace3
                .iter()
                .any(|r| r.event == EventKind::Flush && r.reason.as_deref() == Some("unload"))
                .then_some(()))
        },
    );
    if let Err(e) = flushed {
        c.check(false, || format!("{e}"));
    }
    let unload_dels = trace3
        .iter()
        .filter(|r| r.event == EventKind::RuleDel && r.reason.as_deref() == Some("unload"))
        .count();
    for l in unload_verdict(&rules.set, &trace3, &dev_after) {
        c.check(false, || l);
    }
    s.ensure_module()?;
    s.eth_settled("the reloaded module's install-time rule requests to be answered")?;
    let listed = s.rule_list()?;
    let dev: Vec<arfs::Rule> = s.device_rules()?.into_iter().map(|(r, _)| r).collect();
    for l in table_verdict("after the reload", &BTreeMap::new(), &listed, &dev) {
        c.check(false, || l);
    }

    Ok(format!(
        "lossy: loss={MGMT_LOSS} calls={lossy_calls} (a correct module times out in {:.2}% of runs) call_ms(p50/max)={p50_ms:.1}/{max_ms:.1} bound={}ms retransmits={} stalls={} lost req/rep={}/{} reapplied={reapplied} rule_lines={judged1}; reset: rules={n_rules} gen {gen0:#x}->{gen1:#x} generation_changes+{gen_changes} ethtool_replayed+{replayed} in {:.1}s ruled=[{}]; unload: rmmod {:.1}s device empty in {:.0}ms rule_del(unload)={unload_dels}; reload: rules listed={} device={}",
        100.0 * timeout_chance(MGMT_LOSS, lossy_calls),
        bound.as_millis(),
        figs.retransmits,
        figs.stalls,
        figs.lost_requests,
        figs.lost_replies,
        replay_t.as_secs_f64(),
        ruled_txt.join(" "),
        rmmod_t.as_secs_f64(),
        empty_t.as_secs_f64() * 1000.0,
        listed.rules.len(),
        dev.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::super::{GEN_IP, GEN_PORT, GUEST_IP};
    use super::*;
    use arfs::table::ExtCause;
    use arfs::{DelReason, FlowKey, L4Proto, OpStatus, TableEvent};

    fn ev(e: &TableEvent) -> TraceRecord {
        TraceRecord::from_event(1, 1, e)
    }

    fn spec(port: u16, q: u32) -> RuleSpec {
        flow_rule(
            &FlowKey::v4(L4Proto::Udp, GEN_IP, GEN_PORT, GUEST_IP, port),
            RuleAction::Queue(q),
        )
    }

    fn set_line(loc: u32, r: &RuleSpec, prev: Option<&RuleSpec>) -> TraceRecord {
        ev(&TableEvent::RuleSet {
            seq: 1,
            rule: device_rule(loc, r).unwrap(),
            prev: prev.and_then(|p| device_rule(loc, p)),
        })
    }

    fn del_line(loc: u32, r: &RuleSpec, cause: ExtCause) -> TraceRecord {
        ev(&TableEvent::RuleRemoved {
            seq: Some(2),
            rule: device_rule(loc, r).unwrap(),
            cause,
        })
    }

    fn reject_line(loc: u32, status: OpStatus) -> TraceRecord {
        ev(&TableEvent::RuleRejected {
            seq: 3,
            loc,
            status,
        })
    }

    fn flush_unload() -> TraceRecord {
        ev(&TableEvent::Flushed {
            seq: 4,
            reason: DelReason::Unload,
            count: 0,
        })
    }

    #[test]
    fn the_loss_rate_leaves_a_correct_module_a_negligible_timeout_chance() {
        let calls = LOSSY_INSERTS + LOSSY_INSERTS / 2;
        let at = timeout_chance(MGMT_LOSS, calls);
        assert!(at < 0.002, "{at}");
        assert!(timeout_chance(0.25, calls) > 0.2);
        assert!(timeout_chance(0.0, calls) == 0.0);
    }

    #[test]
    fn a_call_past_the_bound_is_named() {
        let b = Duration::from_millis(1900);
        assert!(slow_calls(&[1000, 1_900_000, 3], b).is_empty());
        let f = slow_calls(&[1000, 1_900_001, 2_500_000], b);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].starts_with("2 calls"), "{f:?}");
        assert!(f[0].contains("call 2 1900.0 ms") && f[0].contains("call 3 2500.0 ms"));
    }

    #[test]
    fn the_loss_must_be_exercised_and_hidden() {
        let good = LossyFigures {
            retransmits: 12,
            stalls: 0,
            lost_requests: 8,
            lost_replies: 7,
            eth_ok: 75,
            ok_calls: 75,
            ..LossyFigures::default()
        };
        assert!(lossy_verdict(&good).is_empty());
        let cases: Vec<(LossyFigures, &str)> = vec![
            (
                LossyFigures {
                    retransmits: 0,
                    ..good.clone()
                },
                "retransmitted nothing",
            ),
            (
                LossyFigures {
                    lost_replies: 0,
                    ..good.clone()
                },
                "both ways",
            ),
            (
                LossyFigures {
                    eth_timeouts: 1,
                    ..good.clone()
                },
                "ethtool_timeouts +1",
            ),
            (
                LossyFigures {
                    eth_ok: 76,
                    ..good.clone()
                },
                "ethtool_ok +76",
            ),
            (
                LossyFigures {
                    eth_replayed: 3,
                    ..good.clone()
                },
                "ethtool_replayed +3",
            ),
        ];
        for (f, part) in cases {
            let v = lossy_verdict(&f);
            assert_eq!(v.len(), 1, "{f:?}: {v:?}");
            assert!(v[0].contains(part), "{v:?}");
        }
    }

    #[test]
    fn a_second_application_needs_a_window_reset() {
        let (a, b) = (spec(20001, 1), spec(20002, 2));
        let done = vec![
            Done::Set {
                loc: 0,
                rule: a.clone(),
                prev: None,
            },
            Done::Set {
                loc: 5,
                rule: b.clone(),
                prev: None,
            },
            Done::Del {
                loc: 0,
                rule: a.clone(),
            },
        ];
        let once = vec![
            set_line(0, &a, None),
            set_line(5, &b, None),
            del_line(0, &a, ExtCause::Op),
        ];
        assert_eq!(lossy_trace_verdict(&once, &done, 0), (vec![], 3, 0));
        // The set at 5 and the delete at 0 applied twice (their ACKs lost
        // until a window reset): fine with two resets, not with one.
        let twice = vec![
            set_line(0, &a, None),
            set_line(5, &b, None),
            set_line(5, &b, Some(&b)),
            del_line(0, &a, ExtCause::Op),
            reject_line(0, OpStatus::UnknownId),
        ];
        assert_eq!(lossy_trace_verdict(&twice, &done, 2), (vec![], 3, 2));
        let (f, _, n) = lossy_trace_verdict(&twice, &done, 1);
        assert_eq!(n, 2);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("2 rule ops applied a second time"), "{f:?}");
        // Another refusal is no re-application; a lost call is named.
        let refused = vec![
            set_line(0, &a, None),
            reject_line(7, OpStatus::BadQueue),
            set_line(5, &b, None),
            del_line(0, &a, ExtCause::Op),
        ];
        let (f, _, n) = lossy_trace_verdict(&refused, &done, 5);
        assert_eq!(n, 0);
        assert!(!f.is_empty(), "{f:?}");
        let (f, _, _) = lossy_trace_verdict(&once[..2], &done, 0);
        assert!(f[0].contains("call 3"), "{f:?}");
    }

    #[test]
    fn the_replay_sets_each_rule_per_generation() {
        let want: BTreeMap<u32, RuleSpec> = [(0, spec(20001, 1)), (9, spec(20002, 3))].into();
        let lines: Vec<TraceRecord> = want.iter().map(|(l, r)| set_line(*l, r, None)).collect();
        assert!(replay_verdict(&want, &lines, 2, 1, true).is_empty());
        // A non-default RSS configuration is replayed too.
        assert!(replay_verdict(&want, &lines, 3, 1, false).is_empty());
        let f = replay_verdict(&want, &lines, 2, 1, false);
        assert!(f[0].contains("ethtool_replayed +2"), "{f:?}");
        // No generation change seen; a rule short; a rule the module does
        // not hold; a second set in one generation.
        let f = replay_verdict(&want, &lines, 0, 0, true);
        assert!(f[0].contains("no generation change"), "{f:?}");
        let f = replay_verdict(&want, &lines[..1], 2, 1, true);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("0 rule_set lines at location 9"), "{f:?}");
        let mut other = lines.clone();
        other.push(set_line(4, &spec(20003, 0), None));
        let f = replay_verdict(&want, &other, 2, 1, true);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("rule_set at 4"), "{f:?}");
        let mut dup = lines.clone();
        dup.push(set_line(0, &want[&0], Some(&want[&0])));
        let f = replay_verdict(&want, &dup, 2, 1, true);
        assert_eq!(f.len(), 2, "{f:?}");
        // Two generation changes: each rule twice, the reset's deletes.
        let mut two = lines.clone();
        two.push(del_line(0, &want[&0], ExtCause::Reset));
        two.extend(lines.clone());
        assert!(replay_verdict(&want, &two, 4, 2, true).is_empty());
        assert_eq!(replay_verdict(&want, &two, 4, 1, true).len(), 4);
    }

    #[test]
    fn the_unload_deletes_every_rule_once() {
        let want: BTreeMap<u32, RuleSpec> = [(0, spec(20001, 1)), (9, spec(20002, 3))].into();
        let mut lines: Vec<TraceRecord> = want
            .iter()
            .map(|(l, r)| del_line(*l, r, ExtCause::Unload))
            .collect();
        lines.push(flush_unload());
        assert!(unload_verdict(&want, &lines, &[]).is_empty());
        // A rule left on the device, and its line missing.
        let left = device_rule(9, &want[&9]).unwrap();
        let f = unload_verdict(&want, &[lines[0].clone(), lines[2].clone()], &[left]);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].contains("still holds 1 rules, at [9]"), "{f:?}");
        assert!(f[1].contains("0 rule_del lines") && f[1].contains("location 9"));
        // No FLUSH; a delete by op instead; a wrong rule.
        let f = unload_verdict(&want, &lines[..2], &[]);
        assert_eq!(
            f,
            vec!["the trace has no FLUSH with reason unload".to_string()]
        );
        let mut op = lines.clone();
        op[0] = del_line(0, &want[&0], ExtCause::Op);
        assert_eq!(unload_verdict(&want, &op, &[]).len(), 2);
        let mut wrong = lines.clone();
        wrong[1] = del_line(9, &spec(20003, 0), ExtCause::Unload);
        let f = unload_verdict(&want, &wrong, &[]);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("rule_del (unload) at 9"), "{f:?}");
    }
}
