//! Issue 45: the order each flow's datagrams arrive in, judged against the
//! trace.
//!
//! Within one rx queue a device keeps a flow's frames in order, and the
//! guest's stack does too (RFS moves a flow between CPUs only once the old
//! CPU's backlog has passed its last packet). A flow's datagrams can
//! overtake one another only where the device moved the flow to another
//! queue: frames still in flight on the old queue (its ring, the guest's
//! backlog) may arrive after the first ones from the new queue. The
//! generator stamps every frame with its send time, in the clock of the
//! device's trace (vnic/CTL.md, "What every frame carries"), and the agent
//! logs, for each late datagram, its send time and that of the datagram
//! that had overtaken it (`vnic_agent::proto::Late`). So a late datagram is
//! explained only by a move of its flow in the trace at a time `T` such
//! that the late one was sent before `T` (it was steered by the table
//! without the move: to the old queue) and the one that overtook it after
//! `T` (with it: to the new queue), each within [`MOVE_SLACK_NS`]. Any
//! other late datagram is the device's (or the guest's) reordering.
//!
//! [`order_verdict`] is a pure function over a span's per-flow figures and
//! the trace's moves; the scenarios gather them (`Session::check_order`).

use super::{Checks, Session};
use crate::bail;
use crate::harness::Result;
use crate::proto::Late;
use arfs::{EventKind, FlowKey, TraceRecord};

/// How far a late datagram's send stamp may be past the move that explains
/// it, and the stamp of the datagram that overtook it before that move:
/// the stamp is the time its worker last took the table's events, read
/// before it took them, and the trace's time is read before the event is
/// handed to the workers; between the two reads and the hand-over lie a
/// few microseconds of host work, unless the host deschedules the thread
/// right there (`guest-tests/README.md`, the chance table, row "order: a
/// late datagram's send stamp against its move").
pub(super) const MOVE_SLACK_NS: u64 = 50_000_000;

/// The trace times (`ts_ns`) at which the device moved `key` to another
/// queue: its ADDs, REPLACEs (of it or to it), DELs and evictions.
pub(super) fn moves(trace: &[TraceRecord], key: &FlowKey) -> Vec<u64> {
    trace
        .iter()
        .filter(|r| {
            matches!(
                r.event,
                EventKind::Add | EventKind::Replace | EventKind::Del | EventKind::Evict
            ) && (r.flow.as_ref() == Some(key) || r.prev_flow.as_ref() == Some(key))
        })
        .map(|r| r.ts_ns)
        .collect()
}

/// One flow over a span: what the agent counted and logged, and the moves.
#[derive(Debug, Clone, Copy)]
pub(super) struct FlowOrder<'a> {
    /// The guest port that names the flow.
    pub port: u16,
    /// Late datagrams counted in the span.
    pub reordered: u64,
    /// The ones the agent logged (the last of them), in the span.
    pub late: &'a [Late],
    /// The flow's moves in the trace ([`moves`]).
    pub moves: &'a [u64],
}

/// What [`order_verdict`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct OrderVerdict {
    /// One line per flow with a late datagram no move explains.
    pub findings: Vec<String>,
    /// Late datagrams over all flows, logged ones, and logged ones a move
    /// explained.
    pub late: u64,
    pub logged: u64,
    pub explained: u64,
}

impl OrderVerdict {
    /// The report's figures (the check's line, passing or not).
    pub fn figures(&self) -> String {
        format!(
            "order: late={} logged={} explained_by_a_move={} unexplained_flows={}",
            self.late,
            self.logged,
            self.explained,
            self.findings.len()
        )
    }
}

/// Whether the move at `t` explains `l` (see the module's doc).
fn explains(t: u64, l: &Late) -> bool {
    l.sent < t.saturating_add(MOVE_SLACK_NS) && l.over_sent.saturating_add(MOVE_SLACK_NS) > t
}

/// Milliseconds of a trace time, for the lines.
fn ms(t: u64) -> String {
    format!("{:.1}ms", t as f64 / 1e6)
}

/// Every late datagram of every flow must be explained by a move of that
/// flow: a flow with late datagrams and no move fails, and so does one
/// with a logged late datagram that none of its moves explains. (Late
/// datagrams the agent did not log, beyond its last few per flow, count in
/// `late` and are judged only through the flow's having a move.)
pub(super) fn order_verdict(flows: &[FlowOrder<'_>]) -> OrderVerdict {
    let mut v = OrderVerdict::default();
    for f in flows {
        v.late += f.reordered;
        v.logged += f.late.len() as u64;
        if f.reordered == 0 && f.late.is_empty() {
            continue;
        }
        let bad: Vec<&Late> = f
            .late
            .iter()
            .filter(|l| !f.moves.iter().any(|&t| explains(t, l)))
            .collect();
        v.explained += (f.late.len() - bad.len()) as u64;
        let example = bad
            .first()
            .copied()
            .or(f.late.first())
            .map_or(String::new(), |l| {
                format!(
                    " (e.g. seq {} sent at {} arrived after seq {} sent at {})",
                    l.seq,
                    ms(l.sent),
                    l.over_seq,
                    ms(l.over_sent)
                )
            });
        if f.moves.is_empty() {
            v.findings.push(format!(
                "flow :{}: {} datagrams arrived after a later one of the flow, and the trace has no move of it{example}",
                f.port,
                f.reordered.max(f.late.len() as u64)
            ));
        } else if !bad.is_empty() {
            let at: Vec<String> = f.moves.iter().map(|&t| ms(t)).collect();
            v.findings.push(format!(
                "flow :{}: {} of its {} logged late datagrams were not in flight across a move (moves at {}){example}",
                f.port,
                bad.len(),
                f.late.len(),
                at.join(", ")
            ));
        }
    }
    v
}

impl Session {
    /// The order check over the last delivery window (`delivery_window`):
    /// every late datagram of a workload flow explained by a move of the
    /// flow in the running daemon's whole trace ([`order_verdict`]);
    /// failures (naming the flows) go to `c`. Returns the check's figures.
    pub(super) fn check_order(&mut self, c: &mut Checks) -> Result<String> {
        let Some(sp) = self.last_span.take() else {
            bail!("no delivery window to judge the order of");
        };
        let (trace, _) = self.trace_from(0)?;
        let moves: Vec<Vec<u64>> = self.flows.iter().map(|f| moves(&trace, &f.key)).collect();
        let flows: Vec<FlowOrder<'_>> = self
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| FlowOrder {
                port: f.local_port,
                reordered: sp.got.get(i).map_or(0, |d| d.reordered),
                late: sp.late.get(i).map_or(&[], Vec::as_slice),
                moves: &moves[i],
            })
            .collect();
        let v = order_verdict(&flows);
        for f in &v.findings {
            c.check(false, || f.clone());
        }
        let fig = v.figures();
        self.last_span = Some(sp);
        Ok(fig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arfs::L4Proto;

    const MS: u64 = 1_000_000;

    fn late(seq: u64, sent_ms: u64, over_seq: u64, over_ms: u64) -> Late {
        Late {
            seq,
            sent: sent_ms * MS,
            over_seq,
            over_sent: over_ms * MS,
        }
    }

    /// (late datagrams, moves in ms, reordered count, flow fails).
    #[test]
    fn late_datagrams_need_a_move_between_their_send_times() {
        let cases: &[(&[Late], &[u64], u64, bool)] = &[
            // Nothing late: passes with or without moves.
            (&[], &[], 0, false),
            (&[], &[1000], 0, false),
            // In flight across the move at 1000 ms: the late one sent
            // before, the one that overtook it after.
            (&[late(10, 990, 12, 1010)], &[1000], 1, false),
            (
                &[late(10, 970, 12, 1005), late(11, 995, 13, 1030)],
                &[1000],
                2,
                false,
            ),
            // Within the slack on either side.
            (&[late(10, 1040, 12, 1045)], &[1000], 1, false),
            (&[late(10, 900, 12, 955)], &[1000], 1, false),
            // A later move of several explains it.
            (&[late(10, 4990, 12, 5010)], &[1000, 5000], 1, false),
            // Late with no move at all: the device's reordering.
            (&[late(40, 2000, 41, 2032)], &[], 1, true),
            // Counted but not logged, no move: still a failure.
            (&[], &[], 3, true),
            // Both sent well after the move (a frame held back and
            // delivered after the flow's next one).
            (&[late(40, 2000, 41, 2032)], &[1000], 1, true),
            // Both well before it.
            (&[late(4, 100, 5, 132)], &[1000], 1, true),
            // Late one sent past the slack after the move.
            (&[late(10, 1051, 12, 1060)], &[1000], 1, true),
            // The one that overtook it sent more than the slack before.
            (&[late(10, 900, 12, 949)], &[1000], 1, true),
            // One good, one bad: the flow fails.
            (
                &[late(10, 990, 12, 1010), late(60, 3000, 61, 3030)],
                &[1000],
                2,
                true,
            ),
        ];
        for (i, &(l, moves_ms, reordered, fails)) in cases.iter().enumerate() {
            let moves: Vec<u64> = moves_ms.iter().map(|m| m * MS).collect();
            let v = order_verdict(&[FlowOrder {
                port: 20000 + i as u16,
                reordered,
                late: l,
                moves: &moves,
            }]);
            assert_eq!(v.findings.len(), usize::from(fails), "case {i}: {v:?}");
            if fails {
                assert!(
                    v.findings[0].contains(&format!(":{}", 20000 + i)),
                    "case {i}: the flow is named: {v:?}"
                );
            }
            assert_eq!(v.late, reordered);
        }
    }

    /// Only the failing flows are named, and the figures add up.
    #[test]
    fn the_verdict_names_exactly_the_flows_that_fail() {
        let good = [late(10, 990, 12, 1010)];
        let bad = [late(40, 2000, 41, 2032)];
        let mv = [1000 * MS];
        let flows = [
            FlowOrder {
                port: 1,
                reordered: 1,
                late: &good,
                moves: &mv,
            },
            FlowOrder {
                port: 2,
                reordered: 0,
                late: &[],
                moves: &[],
            },
            FlowOrder {
                port: 3,
                reordered: 1,
                late: &bad,
                moves: &mv,
            },
            FlowOrder {
                port: 4,
                reordered: 1,
                late: &bad,
                moves: &[],
            },
        ];
        let v = order_verdict(&flows);
        assert_eq!(v.findings.len(), 2, "{v:?}");
        assert!(v.findings[0].starts_with("flow :3:"), "{v:?}");
        assert!(v.findings[1].starts_with("flow :4:"), "{v:?}");
        assert_eq!((v.late, v.logged, v.explained), (3, 3, 1));
        assert!(v.figures().contains("unexplained_flows=2"));
    }

    #[test]
    fn moves_are_the_flows_table_changes() {
        let k = |p| {
            FlowKey::v4(
                L4Proto::Udp,
                [10, 0, 2, 1].into(),
                10000,
                [10, 0, 2, 15].into(),
                p,
            )
        };
        let rec = |event, ts_ns, flow: Option<FlowKey>, prev: Option<FlowKey>| TraceRecord {
            flow,
            prev_flow: prev,
            ..TraceRecord::bare(ts_ns, event, 1)
        };
        let trace = [
            rec(EventKind::Add, 1, Some(k(1)), None),
            rec(EventKind::Add, 2, Some(k(2)), None),
            rec(EventKind::Ack, 3, None, None),
            rec(EventKind::Replace, 4, Some(k(1)), Some(k(1))),
            rec(EventKind::Reject, 5, Some(k(1)), None),
            rec(EventKind::Del, 6, Some(k(1)), None),
            rec(EventKind::Replace, 7, Some(k(3)), Some(k(1))),
        ];
        assert_eq!(moves(&trace, &k(1)), vec![1, 4, 6, 7]);
        assert_eq!(moves(&trace, &k(2)), vec![2]);
        assert_eq!(moves(&trace, &k(9)), Vec::<u64>::new());
    }
}
