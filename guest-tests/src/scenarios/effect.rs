//! Issue 45, item 3: a filter takes effect when the trace says, seen from
//! the guest.
//!
//! The trace's time of an ADD or REPLACE is when the device applied it
//! (and acknowledged it). Every frame carries its send stamp in the same
//! clock (vnic/CTL.md, "What every frame carries"), and the agent records,
//! per flow and per NAPI instance (so per rx queue), the earliest and the
//! latest stamp of the datagrams counted under it. A frame steered without
//! the change was stamped before the change reached the workers, which is
//! [`MOVE_SLACK_NS`] at most after its trace time (see `order.rs`). So
//! every frame of the flow that arrived on the queue it left was sent
//! before `T + GEN_PERIOD_NS + MOVE_SLACK_NS`: a later one means the
//! filter took effect later than the trace says. The first stamp on the
//! new queue, less `T`, is "ACK to first steered frame", as the guest saw
//! it (reported).
//!
//! A flow with late datagrams is not judged: the agent attributes a
//! datagram to the NAPI of the last packet queued to its socket when it
//! reads it, and a late old-queue packet queued just after a new-queue one
//! would put the new one's stamp on the old queue.

use super::order::MOVE_SLACK_NS;
use super::workload::napi_queues;
use super::{Checks, Session, IFNAME};
use crate::harness::Result;
use crate::proto::{Request, RxQueueNapi};
use arfs::EventKind;
use std::collections::BTreeMap;

/// The generator's pacing period: it stamps and sends on a 1 ms timer.
pub(super) const GEN_PERIOD_NS: u64 = 1_000_000;

/// One flow's move and what the guest saw around it.
#[derive(Debug, Clone)]
pub(super) struct FlowEffect {
    pub port: u16,
    /// The queue it left and the one its ADD or REPLACE named.
    pub from_q: usize,
    pub to_q: usize,
    /// The ADD's or REPLACE's trace time.
    pub at: u64,
    /// Per rx queue: the earliest and latest send stamp seen there.
    pub sent: BTreeMap<usize, (u64, u64)>,
    /// Late datagrams of the flow (not judged when > 0).
    pub late: u64,
}

/// What [`effect_verdict`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct EffectVerdict {
    pub findings: Vec<String>,
    pub checked: usize,
    pub skipped: usize,
    /// ACK to the first frame on the new queue, per checked flow whose
    /// first stamp there is this move's (ns; a frame sent up to the slack
    /// before T counts as negative).
    pub ack_to_first: Vec<i64>,
}

impl EffectVerdict {
    /// The check's line, passing or not.
    pub fn figures(&self) -> String {
        let mut v = self.ack_to_first.clone();
        v.sort_unstable();
        let pct = |p: usize| {
            v.get((v.len().saturating_sub(1)) * p / 100)
                .map_or("-".into(), |&x| format!("{:.1}", x as f64 / 1e6))
        };
        format!(
            "effect: checked={} skipped_late={} late_on_old_q_flows={} ack_to_first_ms(min/p50/max)={}/{}/{}",
            self.checked,
            self.skipped,
            self.findings.len(),
            pct(0),
            pct(50),
            pct(100)
        )
    }
}

/// Every frame that arrived on the queue a flow left was sent no later
/// than its move's trace time plus one generator period and the slack.
pub(super) fn effect_verdict(flows: &[FlowEffect]) -> EffectVerdict {
    let mut v = EffectVerdict::default();
    let bar = |at: u64| at.saturating_add(GEN_PERIOD_NS + MOVE_SLACK_NS);
    for f in flows {
        if f.late > 0 {
            v.skipped += 1;
            continue;
        }
        v.checked += 1;
        // (A first stamp long before T is from an earlier stay of the flow
        // on that queue, not this move's.)
        if let Some(&(first, _)) = f.sent.get(&f.to_q).filter(|s| s.0 + MOVE_SLACK_NS >= f.at) {
            v.ack_to_first
                .push(i64::try_from(first).unwrap_or(i64::MAX) - i64::try_from(f.at).unwrap_or(0));
        }
        if let Some(&(_, last)) = f.sent.get(&f.from_q) {
            if last >= bar(f.at) {
                v.findings.push(format!(
                    "flow :{}: a frame sent {:.1} ms after its move to q{} (trace {:.1}ms) still arrived on q{}",
                    f.port,
                    (last - f.at) as f64 / 1e6,
                    f.to_q,
                    f.at as f64 / 1e6,
                    f.from_q
                ));
            }
        }
    }
    v
}

/// "ACK to first steered frame" from a flow's path (the agent's runs, see
/// `tracecheck::Seg`): for a move at `t` to queue `q`, the first send stamp
/// of the first run on `q` that starts no earlier than the slack before
/// `t`, less `t` (ns; negative when a frame sent just before `t` was
/// steered there). None when the path has no such run, or starts after `t`
/// (it cannot tell whether an earlier run was this move's).
pub(super) fn ack_to_first(path: &[super::tracecheck::Seg], q: usize, t: u64) -> Option<i64> {
    if path.iter().map(|s| s.first).min()? > t {
        return None;
    }
    let first = path
        .iter()
        .filter(|s| s.q == q && s.first + MOVE_SLACK_NS >= t)
        .map(|s| s.first)
        .min()?;
    Some(i64::try_from(first).ok()? - i64::try_from(t).ok()?)
}

impl Session {
    /// The effect check after a window: `from[i]` is the queue workload
    /// flow `i` left by its ADD or REPLACE to its receiver's queue in the
    /// trace (None: the flow did not move). Failures (naming the flows) go
    /// to `c`; returns the check's figures.
    pub(super) fn check_effect(
        &mut self,
        c: &mut Checks,
        from: &[Option<usize>],
    ) -> Result<String> {
        let (trace, _) = self.trace_from(0)?;
        let napi: RxQueueNapi = self.guest.agent.req(Request::RxQueueNapi {
            ifname: IFNAME.into(),
        })?;
        let map = napi_queues(&napi);
        let st = self.udp_stats()?;
        let mut flows = Vec::new();
        for (i, f) in self.flows.iter().enumerate() {
            let Some(from_q) = from.get(i).copied().flatten() else {
                continue;
            };
            let at = trace.iter().rev().find(|r| {
                matches!(r.event, EventKind::Add | EventKind::Replace)
                    && r.flow == Some(f.key)
                    && r.rxq.map(usize::from) == Some(f.rx_q)
            });
            let (Some(at), Some(got)) = (at, st.flows.get(i)) else {
                continue; // (the trace checks name a missing ADD or REPLACE)
            };
            let mut sent: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
            for &(id, lo, hi) in &got.napi_sent {
                let q = map.get(&id).copied().unwrap_or(usize::MAX);
                let e = sent.entry(q).or_insert((lo, hi));
                *e = (e.0.min(lo), e.1.max(hi));
            }
            flows.push(FlowEffect {
                port: f.local_port,
                from_q,
                to_q: f.rx_q,
                at: at.ts_ns,
                sent,
                late: got.delivery.reordered,
            });
        }
        let v = effect_verdict(&flows);
        for l in &v.findings {
            c.check(false, || l.clone());
        }
        Ok(v.figures())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn flow(sent: &[(usize, u64, u64)], late: u64) -> FlowEffect {
        FlowEffect {
            port: 20001,
            from_q: 1,
            to_q: 2,
            at: 1000 * MS,
            sent: sent
                .iter()
                .map(|&(q, a, b)| (q, (a * MS, b * MS)))
                .collect(),
            late,
        }
    }

    /// (queue, first stamp, last stamp) in ms.
    type Stamps = [(usize, u64, u64)];

    /// (per-queue stamps, late, fails).
    #[test]
    fn frames_sent_after_the_move_must_not_arrive_on_the_old_queue() {
        let cases: &[(&Stamps, u64, bool)] = &[
            // Old queue up to the move, new queue from it.
            (&[(1, 0, 999), (2, 1001, 5000)], 0, false),
            // In flight: sent just after T, within period + slack.
            (&[(1, 0, 1050), (2, 1003, 5000)], 0, false),
            // Nothing on the old queue at all (RSS never used).
            (&[(2, 0, 5000)], 0, false),
            // 8 frames at 31/s (~250 ms) still on the old queue: late effect.
            (&[(1, 0, 1250), (2, 1282, 5000)], 0, true),
            // Just past the bar.
            (&[(1, 0, 1051), (2, 1003, 5000)], 0, true),
            // The filter never took: everything on the old queue.
            (&[(1, 0, 5000)], 0, true),
            // A flow with late datagrams is not judged.
            (&[(1, 0, 1250), (2, 1282, 5000)], 2, false),
        ];
        for (i, &(sent, late, fails)) in cases.iter().enumerate() {
            let v = effect_verdict(&[flow(sent, late)]);
            assert_eq!(v.findings.len(), usize::from(fails), "case {i}: {v:?}");
            assert_eq!(
                (v.checked, v.skipped),
                (usize::from(late == 0), usize::from(late > 0))
            );
            if fails {
                assert!(v.findings[0].starts_with("flow :20001:"), "{v:?}");
            }
        }
        // The experiments' twin, from the path: q1, then q2 from 1004 ms.
        let seg = |q, a: u64, b: u64| super::super::tracecheck::Seg {
            q,
            first: a * MS,
            last: b * MS,
            n: 1,
        };
        let path = [seg(1, 0, 999), seg(2, 1004, 2000), seg(1, 2001, 3000)];
        assert_eq!(ack_to_first(&path, 2, 1000 * MS), Some(4_000_000));
        assert_eq!(ack_to_first(&path, 1, 1990 * MS), Some(11_000_000));
        assert_eq!(ack_to_first(&path, 3, 1000 * MS), None);
        assert_eq!(ack_to_first(&path[1..], 2, 900 * MS), None);
        let v = effect_verdict(&[flow(&[(1, 0, 999), (2, 1004, 5000)], 0)]);
        assert_eq!(v.ack_to_first, vec![4_000_000i64]);
        assert!(v.figures().contains("4.0/4.0/4.0"), "{}", v.figures());
    }
}
