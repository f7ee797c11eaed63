//! `live-flows`: what the module's expiry personalities (`expiry=`, see
//! aRFS/kmod/README.md) do to flows that never stop.
//!
//! Under `rps` (the default, as mlx5/sfc/bnxt) a live flow keeps its filter
//! for as long as it runs: the guest sees its packets on the filter's queue
//! at the end, the device and the module delete nothing, every filter keeps
//! its id. Under `ice` every UDP filter is deleted (reason `aged`) 5 s after
//! its activation, never sooner, and every steer call the kernel makes
//! afterwards is granted. Whether the kernel asks again after such a
//! driver-side delete is the kernel's business (6.12 does; 7.x, with the
//! 2025 slot-collision change, does not while the receiver stays put): the
//! scenario reports it, per kernel.

use super::super::{Checks, Session};
use super::delta;
use crate::harness::{settle, Result};
use crate::module;
use crate::scenarios::workload::{fresh_expired_age, fresh_line};
use arfs::{EventKind, FlowKey, TraceRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// ice's UDP filter lifetime (ICE_ARFS_TIME_DELTA_EXPIRATION), the
/// module's `expiry=ice`.
const ICE_UDP: Duration = Duration::from_secs(5);
/// How late after [`ICE_UDP`] an aged DEL may reach the device: the module
/// takes a due filter at its next expiry pass (`interval_ms`, 100 ms),
/// whatever the table's size, and the DEL's frame then crosses a TCG guest's
/// work queue and virtqueue (README chance table, "ice's late bound").
const ICE_LATE: Duration = Duration::from_secs(1);
/// Each phase runs 3x the longest timeout in play.
const PHASE: Duration = Duration::from_secs(15);
/// How long the module may take to count the DELs the device applied.
const SETTLE: Duration = Duration::from_secs(2);

/// Module counters of deletes by the expiry pass.
const EXPIRY_DELETES: [&str; 3] = ["deletes_expired", "deletes_idle", "deletes_aged"];

pub(in crate::scenarios) fn live_flows(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let mode = s.guest.agent.read_file(&module::expiry_param())?;
    c.check(mode.trim() == "rps", || {
        format!(
            "the module loaded with expiry={:?}, not its default rps",
            mode.trim()
        )
    });

    // Values the parameter refuses (the write fails, nothing changes).
    for bad in ["fast", "idle:", "idle:0", "idle:x", "ice:5"] {
        let r = s.guest.agent.write_file(&module::expiry_param(), bad);
        c.check(r.is_err(), || format!("expiry={bad:?} was accepted"));
    }
    let still = s.guest.agent.read_file(&module::expiry_param())?;
    c.check(still.trim() == "rps", || {
        format!("after refused writes expiry is {:?}", still.trim())
    });

    // ---- rps: live flows keep their filters ---------------------------
    s.setup_steering()?;
    // The ADDs of the workload: when each filter was activated.
    let setup = s.trace_since_mark()?;
    let steered: Vec<FlowKey> = s
        .flows
        .iter()
        .filter(|f| f.needs_filter())
        .map(|f| f.key)
        .collect();
    let before = s.device_filters()?;
    let m0 = s.module_counters()?;
    std::thread::sleep(PHASE);
    let w = s.measure()?;
    let fig = s.check_window(&w, c);
    let after = s.device_filters()?;
    let m1 = s.module_counters()?;
    let trace = s.trace_since_mark()?;
    let dels = trace.iter().filter(|r| r.event == EventKind::Del).count();
    let history = [setup, trace].concat();
    let mod_dels: u64 = EXPIRY_DELETES.iter().map(|n| delta(&m1, &m0, n)).sum();
    c.check(dels == 0 && mod_dels == 0, || {
        format!(
            "expiry=rps deleted filters of live flows over {}s: {dels} DELs in the trace, module expiry deletes {mod_dels}",
            PHASE.as_secs()
        )
    });
    let changed: Vec<String> = steered
        .iter()
        .filter(|k| before.get(k).map(|e| e.0) != after.get(k).map(|e| e.0))
        .map(|k| {
            format!(
                ":{} id {:?} -> {:?}",
                k.dst_port(),
                before.get(k).map(|e| e.0),
                after.get(k).map(|e| e.0)
            )
        })
        .collect();
    c.check(changed.is_empty(), || {
        format!(
            "under expiry=rps {} live flows lost or changed their filter: {}",
            changed.len(),
            changed.join(", ")
        )
    });

    // ---- ice: UDP filters age out 5 s after activation ---------------
    // Counters before the switch: the first pass under ice deletes every
    // filter older than 5 s at once, within one work period.
    let m2 = s.module_counters()?;
    s.guest.agent.write_file(&module::expiry_param(), "ice")?;
    std::thread::sleep(PHASE);
    // Back to the default first: no filter ages after this. 6.12 asks
    // again for each aged flow, so aged DELs come in waves ~5 s apart, and
    // one that the device applied (and traced) may not be ACKed to the
    // module yet: the module is read, then the trace, until the two agree
    // or SETTLE has passed (a DEL still uncounted then was lost).
    s.guest
        .agent
        .write_file(&module::expiry_param(), &module::idle_expiry(0))?;
    let mut trace = Vec::new();
    let (m3, ice) = settle(SETTLE, || {
        let m3 = s.module_counters()?;
        trace.extend(s.trace_since_mark()?);
        let ice = IcePhase::read(&history, &trace, &steered);
        let agree = delta(&m3, &m2, "deletes_aged") == ice.aged;
        Ok(((m3, ice), agree))
    })?;
    let aged = delta(&m3, &m2, "deletes_aged");
    let busy = delta(&m3, &m2, "busy");
    c.check(ice.aged_flows.len() == steered.len(), || {
        format!(
            "expiry=ice: {} of {} steered UDP flows had a filter deleted (aged) within {}s",
            ice.aged_flows.len(),
            steered.len(),
            PHASE.as_secs()
        )
    });
    c.check(ice.other_dels == 0, || {
        format!(
            "expiry=ice: {} DELs with another reason than aged (live flows: rps_may_expire_flow must keep them)",
            ice.other_dels
        )
    });
    c.check(aged == ice.aged, || {
        format!(
            "expiry=ice: module deletes_aged {aged}, trace aged DELs {}",
            ice.aged
        )
    });
    // Never before 5 s: the module counts from the ACK of the ADD, which
    // comes after the device applied it (the trace's add time).
    c.check(ice.early.is_empty(), || {
        format!(
            "expiry=ice: filters deleted less than {}s after their ADD: {}",
            ICE_UDP.as_secs(),
            ice.early.join(", ")
        )
    });
    // ice ages at 5 s, not at 5 s plus however long a round-robin sweep
    // of the table takes.
    c.check(ice.late.is_empty(), || {
        format!(
            "expiry=ice: filters deleted more than {:.1}s after their ADD: {}",
            (ICE_UDP + ICE_LATE).as_secs_f64(),
            ice.late.join(", ")
        )
    });
    c.check(ice.rejects == 0 && busy == 0, || {
        format!(
            "expiry=ice: re-steers refused: {} rejects in the trace, module busy {busy}",
            ice.rejects
        )
    });
    let reasked = ice.reasked.len();
    let verdict = if reasked == 0 {
        "the kernel never asked again after a driver-side delete"
    } else if reasked == ice.aged_flows.len() {
        "the kernel asked again for every flow"
    } else {
        "the kernel asked again for some flows"
    };
    Ok(format!(
        "flows={} steered={} rps: {}s dels=0 ids_kept={}/{} guest_q_min={:.1}% | ice: {}s aged_dels={} flows_aged={} readded={reasked}/{} ({verdict}) age_after_add={} rejects={} busy={busy} fresh_expired=[{}]",
        s.flows.len(),
        steered.len(),
        PHASE.as_secs(),
        steered.len() - changed.len(),
        steered.len(),
        fig.min_guest_q,
        PHASE.as_secs(),
        ice.aged,
        ice.aged_flows.len(),
        ice.aged_flows.len(),
        ice.age_range(),
        ice.rejects,
        ice.fresh_expired.join(", "),
    ))
}

/// What the `ice` phase's trace shows.
#[derive(Default)]
struct IcePhase {
    aged: u64,
    other_dels: u64,
    rejects: u64,
    aged_flows: BTreeSet<FlowKey>,
    /// Flows with an ADD after one of their aged DELs.
    reasked: BTreeSet<FlowKey>,
    /// Aged DELs less than [`ICE_UDP`] after the flow's ADD.
    early: Vec<String>,
    /// Aged DELs more than [`ICE_UDP`] + [`ICE_LATE`] after an ADD of the
    /// phase.
    late: Vec<String>,
    /// ADD -> aged DEL, for the DELs whose ADD is in the phase.
    ages: Vec<Duration>,
    /// `expired` DELs of filters less than [`FRESH`](super::super::workload::FRESH) old with no hits.
    fresh_expired: Vec<String>,
}

impl IcePhase {
    /// `before`: the trace up to the phase (each flow's last ADD there is
    /// its filter's activation); `trace`: the phase's.
    fn read(before: &[TraceRecord], trace: &[TraceRecord], steered: &[FlowKey]) -> Self {
        let want: BTreeSet<&FlowKey> = steered.iter().collect();
        let mut p = IcePhase::default();
        let mut added: BTreeMap<FlowKey, u64> = before
            .iter()
            .filter(|r| matches!(r.event, EventKind::Add | EventKind::Replace))
            .filter_map(|r| Some((r.flow?, r.ts_ns)))
            .collect();
        // ADDs of the phase itself: a filter activated before the switch to
        // ice is due at once, however old; only these are judged late.
        let mut in_phase: BTreeSet<FlowKey> = BTreeSet::new();
        for r in trace {
            let Some(flow) = r.flow else {
                if r.event == EventKind::Reject {
                    p.rejects += 1;
                }
                continue;
            };
            match r.event {
                EventKind::Add | EventKind::Replace => {
                    if p.aged_flows.contains(&flow) {
                        p.reasked.insert(flow);
                    }
                    added.insert(flow, r.ts_ns);
                    in_phase.insert(flow);
                }
                EventKind::Reject => p.rejects += 1,
                EventKind::Del if r.reason.as_deref() == Some("aged") => {
                    p.aged += 1;
                    if want.contains(&flow) {
                        p.aged_flows.insert(flow);
                    }
                    if let Some(t) = added.remove(&flow) {
                        let age = Duration::from_nanos(r.ts_ns.saturating_sub(t));
                        let line = format!(":{} after {:.2}s", flow.dst_port(), age.as_secs_f64());
                        if age < ICE_UDP {
                            p.early.push(line);
                        } else if age > ICE_UDP + ICE_LATE && in_phase.remove(&flow) {
                            p.late.push(line);
                        }
                        p.ages.push(age);
                    }
                }
                // The kernel's race on a just-granted filter: reported,
                // not failed (workload::fresh_expired_age).
                EventKind::Del => match fresh_expired_age(r, added.get(&flow).copied()) {
                    Some(age) => {
                        added.remove(&flow);
                        p.fresh_expired.push(fresh_line(flow.dst_port(), age));
                    }
                    None => p.other_dels += 1,
                },
                _ => {}
            }
        }
        p
    }

    fn age_range(&self) -> String {
        match (self.ages.iter().min(), self.ages.iter().max()) {
            (Some(a), Some(b)) => format!("{:.2}..{:.2}s", a.as_secs_f64(), b.as_secs_f64()),
            _ => "n/a".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flow :20027 in the 6.12 ice phase of a CI run (vnic's trace, ids as
    /// written): its aged DEL, the kernel's re-ADD, an `expired` DEL of the
    /// new filter 0.9 ms later with no hits, the next re-ADD.
    const RUN: [&str; 5] = [
        r#"{"ts_ns":90256210922,"event":"add","gen":4117637225,"seq":3602670786,"id":101,"rxq":3,"flow":{"family":"ipv4","proto":"udp","src":"10.0.2.1","dst":"10.0.2.15","sport":10000,"dport":20027}}"#,
        r#"{"ts_ns":95357936008,"event":"del","gen":4117637225,"seq":3602670792,"id":101,"rxq":3,"flow":{"family":"ipv4","proto":"udp","src":"10.0.2.1","dst":"10.0.2.15","sport":10000,"dport":20027},"hits":158,"reason":"aged"}"#,
        r#"{"ts_ns":95384498124,"event":"add","gen":4117637225,"seq":3602670794,"id":149,"rxq":3,"flow":{"family":"ipv4","proto":"udp","src":"10.0.2.1","dst":"10.0.2.15","sport":10000,"dport":20027}}"#,
        r#"{"ts_ns":95385413932,"event":"del","gen":4117637225,"seq":3602670796,"id":149,"rxq":3,"flow":{"family":"ipv4","proto":"udp","src":"10.0.2.1","dst":"10.0.2.15","sport":10000,"dport":20027},"hits":0,"reason":"expired"}"#,
        r#"{"ts_ns":95418136414,"event":"add","gen":4117637225,"seq":3602670799,"id":192,"rxq":3,"flow":{"family":"ipv4","proto":"udp","src":"10.0.2.1","dst":"10.0.2.15","sport":10000,"dport":20027}}"#,
    ];

    fn records(lines: &[&str]) -> Vec<TraceRecord> {
        lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn an_expiry_of_a_filter_just_granted_is_reported_not_failed() {
        let all = records(&RUN);
        let flow = all[0].flow.unwrap();
        let p = IcePhase::read(&all[..1], &all[1..], &[flow]);
        assert_eq!(p.other_dels, 0);
        assert_eq!(p.fresh_expired, vec![":20027 after 0.9ms".to_string()]);
        assert_eq!(p.aged, 1);
        assert!(p.reasked.contains(&flow));
    }

    #[test]
    fn an_expiry_of_a_filter_frames_hit_or_an_older_one_still_fails() {
        // The same DEL with hits: the module expired a filter in use.
        let hit = RUN[3].replace(r#""hits":0"#, r#""hits":5"#);
        // The same DEL 200 ms after the ADD.
        let late = RUN[3].replace("95385413932", "95584498124");
        for del in [hit, late] {
            let all = records(&[RUN[0], RUN[1], RUN[2], &del, RUN[4]]);
            let flow = all[0].flow.unwrap();
            let p = IcePhase::read(&all[..1], &all[1..], &[flow]);
            assert_eq!(p.other_dels, 1, "{del}");
            assert!(p.fresh_expired.is_empty());
        }
    }

    #[test]
    fn an_aged_delete_is_judged_by_its_age_both_ways() {
        // The CI run's aged DEL: 5.10 s after its ADD, in bounds.
        let all = records(&RUN[..2]);
        let flow = all[0].flow.unwrap();
        let p = IcePhase::read(&all[..1], &all[1..], &[flow]);
        assert!(p.early.is_empty() && p.late.is_empty());
        assert_eq!(p.ages.len(), 1);
        // The same DEL at 4.9 s and at 6.2 s after an ADD of the phase.
        for (ts, early) in [("95156210922", true), ("96456210922", false)] {
            let del = RUN[1].replace("95357936008", ts);
            let all = records(&[RUN[0], &del]);
            let p = IcePhase::read(&[], &all, &[flow]);
            assert_eq!(
                (p.early.len(), p.late.len()),
                if early { (1, 0) } else { (0, 1) },
                "{ts}"
            );
        }
        // Activated before the switch to ice: due at once, never late.
        let del = RUN[1].replace("95357936008", "111357936008");
        let all = records(&[RUN[0], &del]);
        let p = IcePhase::read(&all[..1], &all[1..], &[flow]);
        assert!(p.late.is_empty() && p.early.is_empty());
    }
}
