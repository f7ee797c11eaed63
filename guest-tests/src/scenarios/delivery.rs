//! Issue 23: every frame accounted for, from the guest.
//!
//! The generator numbers each flow's frames and fills their payload with a
//! pattern the agent checks on every datagram (`vnic_agent::payload`); the
//! agent counts per flow what arrived: distinct sequence numbers,
//! duplicates, reorders, corrupted payloads. At a *quiet point* (the
//! generator paused, the device's rx counters still, the receivers
//! drained) the suite compares that with what the generator sent, exactly,
//! together with the guest's own protocol error counters (`/proc/net/snmp`,
//! `/proc/net/netstat`, `/proc/net/snmp6`). Between two quiet points:
//!
//! - every flow: received == sent (minus what the scenario deliberately
//!   drops), no duplicate, no corrupted or short datagram;
//! - the guest's IP/UDP error counters did not move.
//!
//! The fault scenarios (`misroute`, `drop`, `corrupt`) turn one of vnic's
//! path fault knobs on over such a window and assert that the guest-side
//! check fails on exactly the steered flows, while the device's own hit
//! and per-queue figures say everything went well.

use super::order::{order_verdict, FlowOrder};
use super::workload::{fmt_queues, napi_queues, queue_delta};
use super::{Checks, Session, IFNAME};
use crate::harness::{wait_for, Result};
use crate::proto::{Delivery, Late, Request, RxQueueNapi, UdpStats};
use crate::{bail, ensure};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vnic_ctl_proto::{GenOp, Stats};

/// The guest's error counters the delivery check requires to stay still:
/// (file, section or prefix, field).
const SNMP: &[(&str, &str, &str)] = &[
    ("/proc/net/snmp", "Ip", "InHdrErrors"),
    ("/proc/net/netstat", "IpExt", "InCsumErrors"),
    ("/proc/net/snmp", "Udp", "InErrors"),
    ("/proc/net/snmp", "Udp", "InCsumErrors"),
    ("/proc/net/snmp", "Udp", "RcvbufErrors"),
    ("/proc/net/snmp6", "", "Ip6InHdrErrors"),
    ("/proc/net/snmp6", "", "Udp6InErrors"),
    ("/proc/net/snmp6", "", "Udp6InCsumErrors"),
    ("/proc/net/snmp6", "", "Udp6RcvbufErrors"),
    ("/proc/net/snmp", "Tcp", "InErrs"),
    ("/proc/net/snmp", "Tcp", "InCsumErrors"),
];

/// The error counters that moved from `a` to `b` (two reads of [`SNMP`]),
/// with how much.
pub(super) fn snmp_moved(a: &[u64], b: &[u64]) -> Vec<(String, u64)> {
    SNMP.iter()
        .zip(a.iter().zip(b))
        .filter(|(_, (x, y))| y > x)
        .map(|(&(_, sec, f), (x, y))| {
            (
                if sec.is_empty() {
                    f.to_string()
                } else {
                    format!("{sec} {f}")
                },
                y - x,
            )
        })
        .collect()
}

/// `Section: a b c` / `Section: 1 2 3` pairs (snmp, netstat) or `Name
/// value` lines (snmp6): the value of `field`.
fn snmp_field(text: &str, section: &str, field: &str) -> Option<u64> {
    if section.is_empty() {
        return text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == field).then(|| it.next()?.parse().ok())?
        });
    }
    let prefix = format!("{section}:");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
    lines.chunks(2).find_map(|pair| {
        let [names, values] = pair else { return None };
        let i = names.split_whitespace().position(|n| n == field)?;
        values.split_whitespace().nth(i)?.parse().ok()
    })
}

/// What a quiet point saw.
#[derive(Debug, Clone, Default)]
pub(super) struct Mark {
    /// Per workload flow: what the agent counted, and what the generator
    /// sent (cumulative).
    delivery: Vec<Delivery>,
    /// Per workload flow: the agent's log of late datagrams.
    late: Vec<Vec<Late>>,
    sent: Vec<u64>,
    packets: Vec<u64>,
    by_napi: Vec<Vec<(u32, u64)>>,
    napi_unknown: Vec<u64>,
    /// Filter (id, rxq, hits) per flow, if any.
    filters: Vec<Option<(u64, usize, u64)>>,
    snmp: Vec<u64>,
    /// The device's `ctl stats`.
    stats: Stats,
}

/// Per-flow figures between two quiet points.
#[derive(Debug, Clone, Default)]
pub(super) struct Span {
    pub sent: Vec<u64>,
    pub got: Vec<Delivery>,
    /// The late datagrams the agent logged in the span.
    pub late: Vec<Vec<Late>>,
    /// Filter hits per flow when the flow had the same filter at both
    /// ends (its rx queue), else None.
    pub hits: Vec<Option<(usize, u64)>>,
    pub by_queue: Vec<BTreeMap<usize, u64>>,
    pub packets: Vec<u64>,
    /// (counter, delta) of the guest's error counters that moved.
    pub snmp_moved: Vec<(String, u64)>,
    pub stats0: Stats,
    pub stats1: Stats,
}

/// `a - b`, field by field (saturating): what happened between two reads.
pub(super) fn sub(a: &Delivery, b: &Delivery) -> Delivery {
    Delivery {
        next: a.next.saturating_sub(b.next),
        distinct: a.distinct.saturating_sub(b.distinct),
        duplicated: a.duplicated.saturating_sub(b.duplicated),
        reordered: a.reordered.saturating_sub(b.reordered),
        corrupted: a.corrupted.saturating_sub(b.corrupted),
        short: a.short.saturating_sub(b.short),
        bad_len: a.bad_len.saturating_sub(b.bad_len),
    }
}

impl Span {
    /// Device counter delta over the span.
    pub fn dev(&self, counter: impl Fn(&Stats) -> u64) -> u64 {
        counter(&self.stats1).saturating_sub(counter(&self.stats0))
    }

    /// Per-queue `rx_filter` deltas.
    pub fn rx_filter(&self) -> Vec<u64> {
        let q = |v: &Stats| -> Vec<u64> { v.queues.iter().map(|q| q.rx_filter).collect() };
        let (a, b) = (q(&self.stats1), q(&self.stats0));
        a.iter()
            .zip(b.iter().chain(std::iter::repeat(&0)))
            .map(|(x, y)| x.saturating_sub(*y))
            .collect()
    }

    /// The delivery check of flow `i` (port `port`), expecting `drop`
    /// frames deliberately lost: records failures in `c`, naming the flow.
    pub fn check_flow(&self, i: usize, port: u16, drop: u64, c: &mut Checks) {
        let (sent, g) = (self.sent[i], &self.got[i]);
        let want = sent.saturating_sub(drop);
        c.check(g.distinct == want, || {
            format!(
                "flow :{port}: {} of {sent} frames sent arrived intact ({} missing{}{})",
                g.distinct,
                sent.saturating_sub(g.distinct),
                if g.corrupted > 0 {
                    format!(", {} of them corrupted", g.corrupted)
                } else {
                    String::new()
                },
                if drop > 0 {
                    format!(", {drop} dropped on purpose")
                } else {
                    String::new()
                }
            )
        });
        c.check(g.duplicated == 0, || {
            format!("flow :{port}: {} duplicated datagrams", g.duplicated)
        });
        c.check(g.corrupted == g.bad_len, || {
            format!(
                "flow :{port}: {} of its datagrams had a wrong payload (sequence tag or fill)",
                g.corrupted - g.bad_len.min(g.corrupted)
            )
        });
        c.check(g.bad_len == 0, || {
            format!(
                "flow :{port}: {} of its datagrams had a wrong length (received length != the length they carry)",
                g.bad_len
            )
        });
        c.check(g.short == 0, || {
            format!(
                "flow :{port}: {} datagrams too short to carry a sequence number",
                g.short
            )
        });
    }

    /// The guest's error counters did not move.
    pub fn check_snmp(&self, c: &mut Checks) {
        c.check(self.snmp_moved.is_empty(), || {
            let v: Vec<String> = self
                .snmp_moved
                .iter()
                .map(|(k, n)| format!("{k} +{n}"))
                .collect();
            format!("the guest's error counters moved: {}", v.join(", "))
        });
    }

    /// Sums for the report line.
    pub fn figures(&self) -> String {
        let s = |f: fn(&Delivery) -> u64| self.got.iter().map(f).sum::<u64>();
        let sent: u64 = self.sent.iter().sum();
        format!(
            "delivery: sent={sent} arrived={} lost={} dup={} reordered={} corrupted={} bad_len={} snmp_errors={}",
            s(|d| d.distinct),
            sent.saturating_sub(s(|d| d.distinct)),
            s(|d| d.duplicated),
            s(|d| d.reordered),
            s(|d| d.corrupted),
            s(|d| d.bad_len),
            self.snmp_moved.iter().map(|(_, n)| n).sum::<u64>()
        )
    }
}

impl Session {
    pub(super) fn read_snmp(&mut self) -> Result<Vec<u64>> {
        let mut files: BTreeMap<&str, String> = BTreeMap::new();
        let mut out = Vec::with_capacity(SNMP.len());
        for &(file, section, field) in SNMP {
            if !files.contains_key(file) {
                let t = self.guest.agent.read_file(file)?;
                files.insert(file, t);
            }
            let v = snmp_field(&files[file], section, field);
            let Some(v) = v else {
                bail!("the guest's {file} has no {section} {field}");
            };
            out.push(v);
        }
        Ok(out)
    }

    /// Generator sets of the workload: `pause` or `resume`.
    pub(super) fn gen_op(&mut self, op: GenOp) -> Result<()> {
        for id in self.gen_sets.clone() {
            self.guest
                .ctl
                .request(&vnic_ctl_proto::Request::gen(op, Some(id), None))?;
        }
        Ok(())
    }

    /// A quiet point: the workload's generator sets paused, the device's
    /// rx counters still, the receivers' counts still; everything read.
    /// The generator stays paused ([`Self::resume_gen`]).
    pub(super) fn quiet_point(&mut self) -> Result<Mark> {
        self.gen_op(GenOp::Pause)?;
        self.wait_rx_quiet()?;
        let mut last = u64::MAX;
        let mut since = Instant::now();
        let mut stats: Option<UdpStats> = None;
        wait_for(Duration::from_secs(10), "the receivers to drain", || {
            let st = self.udp_stats()?;
            let n: u64 = st
                .flows
                .iter()
                .map(|f| f.delivery.distinct + f.delivery.duplicated + f.delivery.corrupted)
                .sum();
            if n != last {
                last = n;
                since = Instant::now();
            }
            let done = since.elapsed() >= Duration::from_millis(300);
            stats = Some(st);
            Ok(done.then_some(()))
        })?;
        let a = stats.unwrap_or_default();
        ensure!(
            a.flows.len() == self.flows.len(),
            "the agent has {} flows, the workload {}",
            a.flows.len(),
            self.flows.len()
        );
        let sent = self.gen_sent_by_flow()?;
        let table = self.device_filters()?;
        let snmp = self.read_snmp()?;
        let stats = self.guest.ctl.stats()?;
        Ok(Mark {
            delivery: a.flows.iter().map(|f| f.delivery).collect(),
            late: a.flows.iter().map(|f| f.late.clone()).collect(),
            packets: a.flows.iter().map(|f| f.packets).collect(),
            by_napi: a.flows.iter().map(|f| f.by_napi.clone()).collect(),
            napi_unknown: a.flows.iter().map(|f| f.napi_unknown).collect(),
            sent,
            filters: self
                .flows
                .iter()
                .map(|f| table.get(&f.key).copied())
                .collect(),
            snmp,
            stats,
        })
    }

    pub(super) fn resume_gen(&mut self) -> Result<()> {
        self.gen_op(GenOp::Resume)
    }

    /// The mark a workload starts from: nothing sent or received yet; the
    /// guest's error counters and the device's stats as they are now.
    pub(super) fn start_mark(&mut self) -> Result<()> {
        let n = self.flows.len();
        let snmp = self.read_snmp()?;
        let stats = self.guest.ctl.stats()?;
        self.delivery_mark = Some(Mark {
            delivery: vec![Delivery::default(); n],
            late: vec![Vec::new(); n],
            sent: vec![0; n],
            packets: vec![0; n],
            by_napi: vec![Vec::new(); n],
            napi_unknown: vec![0; n],
            filters: vec![None; n],
            snmp,
            stats,
        });
        Ok(())
    }

    /// What happened between two quiet points.
    pub(super) fn span(&mut self, a: &Mark, b: &Mark) -> Result<Span> {
        let napi: RxQueueNapi = self.guest.agent.req(Request::RxQueueNapi {
            ifname: IFNAME.into(),
        })?;
        let map = napi_queues(&napi);
        let n = self.flows.len();
        ensure!(
            a.sent.len() == n && b.sent.len() == n,
            "the workload changed between two quiet points"
        );
        let snmp_moved = snmp_moved(&a.snmp, &b.snmp);
        Ok(Span {
            sent: (0..n)
                .map(|i| b.sent[i].saturating_sub(a.sent[i]))
                .collect(),
            got: (0..n)
                .map(|i| sub(&b.delivery[i], &a.delivery[i]))
                .collect(),
            // Every datagram sent before `a` had arrived by then (a quiet
            // point): one late since carries a sequence number >= a's next.
            late: (0..n)
                .map(|i| {
                    let from = a.delivery[i].next;
                    b.late[i]
                        .iter()
                        .filter(|l| l.seq >= from)
                        .copied()
                        .collect()
                })
                .collect(),
            hits: (0..n)
                .map(|i| match (a.filters[i], b.filters[i]) {
                    (Some((ia, qa, ha)), Some((ib, qb, hb))) if ia == ib && qa == qb => {
                        Some((qb, hb.saturating_sub(ha)))
                    }
                    _ => None,
                })
                .collect(),
            by_queue: (0..n)
                .map(|i| {
                    queue_delta(
                        &b.by_napi[i],
                        &a.by_napi[i],
                        b.napi_unknown[i].saturating_sub(a.napi_unknown[i]),
                        &map,
                    )
                })
                .collect(),
            packets: (0..n)
                .map(|i| b.packets[i].saturating_sub(a.packets[i]))
                .collect(),
            snmp_moved,
            stats0: a.stats.clone(),
            stats1: b.stats.clone(),
        })
    }

    /// The delivery check of a steering scenario: a quiet point, every
    /// flow since the last one (or since the workload started) checked,
    /// the generator resumed. Returns the report's figures.
    pub(super) fn check_delivery(&mut self, c: &mut Checks) -> Result<String> {
        self.delivery_window(c, true)
    }

    /// [`Self::check_delivery`], the generator resumed after it when
    /// `resume`, else left paused (a scenario's last window).
    pub(super) fn delivery_window(&mut self, c: &mut Checks, resume: bool) -> Result<String> {
        let Some(a) = self.delivery_mark.take() else {
            bail!("no delivery mark: the workload was not started with one (start_mark)");
        };
        let b = self.quiet_point()?;
        let sp = self.span(&a, &b);
        self.delivery_mark = Some(b);
        if resume {
            self.resume_gen()?;
        }
        let sp = sp?;
        for (i, f) in self.flows.iter().enumerate() {
            sp.check_flow(i, f.local_port, 0, c);
        }
        sp.check_snmp(c);
        let fig = sp.figures();
        self.last_span = Some(sp);
        Ok(fig)
    }
}

/// A per-flow figure of what the agent counted.
type PerFlow = fn(&Delivery) -> u64;

/// Which path fault a scenario turns on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Misroute,
    Drop,
    Corrupt,
    BadCsum,
    Truncate,
    Reorder,
}

impl Fault {
    fn knob(self) -> &'static str {
        match self {
            Fault::Misroute => "misroute_rate",
            Fault::Drop => "drop_rate",
            Fault::Corrupt => "corrupt_rate",
            Fault::BadCsum => "bad_csum_rate",
            Fault::Truncate => "truncate_rate",
            Fault::Reorder => "reorder_rate",
        }
    }
    /// The rate the scenario sets: misroute every hit (the knob
    /// as it was), the others 10%.
    fn rate(self) -> f64 {
        match self {
            Fault::Misroute => 1.0,
            _ => 0.1,
        }
    }
    /// The device's counter of the fault (its name under `peer`, and the field).
    fn counter(self) -> (&'static str, fn(&Stats) -> u64) {
        match self {
            Fault::Misroute => ("misrouted", |s| s.peer.misrouted),
            Fault::Drop => ("fault_dropped", |s| s.peer.fault_dropped),
            Fault::Corrupt => ("fault_corrupted", |s| s.peer.fault_corrupted),
            Fault::BadCsum => ("fault_bad_csum", |s| s.peer.fault_bad_csum),
            Fault::Truncate => ("fault_truncated", |s| s.peer.fault_truncated),
            Fault::Reorder => ("fault_reordered", |s| s.peer.fault_reordered),
        }
    }
    /// What the guest counted of it over the steered flows, when it can
    /// count every one: (what, per-flow figure).
    fn guest_count(self) -> Option<(&'static str, PerFlow)> {
        match self {
            Fault::Corrupt => Some(("corrupted datagrams", |d| d.corrupted)),
            Fault::Truncate => Some(("datagrams of a wrong length", |d| d.bad_len)),
            Fault::Reorder => Some(("late datagrams", |d| d.reordered)),
            _ => None,
        }
    }
}

/// The guest-side checks of flow `i` over a span: delivery (nothing
/// expected lost), order (nothing moves the flow in a fault scenario's
/// windows: any late datagram fails) and, for a steered flow, every packet
/// on its filter's queue. Failures go to `c`.
fn guest_checks(s: &Session, sp: &Span, i: usize, c: &mut Checks) {
    let f = &s.flows[i];
    sp.check_flow(i, f.local_port, 0, c);
    let order = order_verdict(&[FlowOrder {
        port: f.local_port,
        reordered: sp.got[i].reordered,
        late: &sp.late[i],
        moves: &[],
    }]);
    for l in order.findings {
        c.check(false, || l);
    }
    if f.needs_filter() {
        let on_q = sp.by_queue[i].get(&f.rx_q).copied().unwrap_or(0);
        c.check(on_q == sp.packets[i] && sp.packets[i] > 0, || {
            format!(
                "flow :{}: the guest saw {on_q} of its {} packets arrive on its filter's queue q{} (by queue: {})",
                f.local_port,
                sp.packets[i],
                f.rx_q,
                fmt_queues(&sp.by_queue[i])
            )
        });
    }
}

impl Session {
    /// The steering workload of a fault scenario, warmed up: fresh flows
    /// (`steering_flows`), a delivery mark, the generator running, every
    /// flow that needs a filter has it (the device's table), plus a second.
    pub(super) fn fault_workload(&mut self) -> Result<()> {
        self.ensure_module()?;
        let flows = self.steering_flows(self.settings.flows)?;
        self.udp_start(&flows)?;
        self.flows = flows;
        self.start_mark()?;
        self.start_gen_per_flow(self.settings.rate)?;
        self.wait_steered(&std::collections::BTreeSet::new())?;
        std::thread::sleep(Duration::from_secs(1));
        Ok(())
    }
}

/// One path fault over a window between two quiet points, after a control
/// window without it.
fn path_fault(s: &mut Session, c: &mut Checks, fault: Fault) -> Result<String> {
    s.fault_workload()?;
    let steered: Vec<usize> = (0..s.flows.len())
        .filter(|&i| s.flows[i].needs_filter())
        .collect();
    c.check(!steered.is_empty(), || "no flow needs a filter".into());

    // Control: warm-up and a window without the fault pass every check.
    let m0 = s.quiet_point()?;
    let warm = s.span(&s.delivery_mark.clone().unwrap_or_default(), &m0)?;
    s.resume_gen()?;
    std::thread::sleep(s.settings.measure);
    let m1 = s.quiet_point()?;
    let ctl = s.span(&m0, &m1)?;
    let mut control = Checks::default();
    for i in 0..s.flows.len() {
        warm.check_flow(i, s.flows[i].local_port, 0, &mut control);
        guest_checks(s, &ctl, i, &mut control);
    }
    warm.check_snmp(&mut control);
    ctl.check_snmp(&mut control);
    c.check(control.failures.is_empty(), || {
        format!(
            "without the fault the guest-side checks already fail: {}",
            control.failures.join("; ")
        )
    });

    // The fault window: on after a quiet point, off before the next.
    s.guest.ctl.set(fault.knob(), fault.rate())?;
    let run = (|| {
        s.resume_gen()?;
        std::thread::sleep(s.settings.measure);
        s.quiet_point()
    })();
    let off = s.guest.ctl.set(fault.knob(), 0);
    let m2 = run?;
    off?;
    let sp = s.span(&m1, &m2)?;
    s.delivery_mark = Some(m2);

    // The device's own figures: every hit counted and "delivered".
    let mut hits_total = 0;
    let rx_filter = sp.rx_filter();
    let mut by_q = vec![0u64; rx_filter.len()];
    for &i in &steered {
        let flow = &s.flows[i];
        match sp.hits[i] {
            Some((fq, hit)) if fq == flow.rx_q => {
                hits_total += hit;
                if let Some(b) = by_q.get_mut(fq) {
                    *b += hit;
                }
                c.check(hit == sp.sent[i], || {
                    format!(
                        "flow :{}: the device counted {hit} hits for {} frames sent (its figures must stay at 100%)",
                        flow.local_port, sp.sent[i]
                    )
                });
            }
            _ => c.check(false, || {
                format!(
                    "flow :{} needs a filter to q{} but had no stable one over the fault window",
                    flow.local_port, flow.rx_q
                )
            }),
        }
    }
    let faulted = sp.dev(fault.counter().1);
    let rx_filter_total: u64 = rx_filter.iter().sum();
    c.check(rx_filter_total == hits_total, || {
        format!(
            "the device's queues counted {rx_filter_total} filter deliveries for {hits_total} hits"
        )
    });
    if fault == Fault::Misroute {
        c.check(faulted == hits_total, || {
            format!("peer.misrouted moved by {faulted}, the window had {hits_total} hits")
        });
    } else {
        // The queues' filter deliveries are where the filters point.
        c.check(rx_filter == by_q, || {
            format!("per-queue filter deliveries {rx_filter:?}, hits by filter queue {by_q:?}")
        });
        c.check(faulted > 0, || {
            format!("/peer/{} did not move", fault.counter().0)
        });
    }

    // The guest side: fails on every steered flow, on no other.
    let mut detected = 0;
    let mut lines = Vec::new();
    for i in 0..s.flows.len() {
        let flow = &s.flows[i];
        let mut probe = Checks::default();
        guest_checks(s, &sp, i, &mut probe);
        if flow.needs_filter() {
            if probe.failures.is_empty() {
                c.check(false, || {
                    format!(
                        "flow :{}: {} on, yet every guest-side check passed",
                        flow.local_port,
                        fault.knob()
                    )
                });
            } else {
                detected += 1;
                if lines.len() < 2 {
                    // The line of the check this fault is for.
                    let key = match fault {
                        Fault::Misroute => "filter's queue",
                        Fault::Drop | Fault::BadCsum => "arrived intact",
                        Fault::Corrupt => "wrong payload",
                        Fault::Truncate => "wrong length",
                        Fault::Reorder => "after a later one",
                    };
                    let l = probe.failures.iter().find(|l| l.contains(key));
                    lines.push(l.unwrap_or(&probe.failures[0]).clone());
                }
            }
        } else {
            c.check(probe.failures.is_empty(), || {
                format!(
                    "flow :{} has no filter, yet its guest-side check failed under {}: {}",
                    flow.local_port,
                    fault.knob(),
                    probe.failures.join("; ")
                )
            });
        }
    }
    // What the guest saw matches what the device did, exactly.
    let sum = |get: fn(&Delivery) -> u64| steered.iter().map(|&i| get(&sp.got[i])).sum::<u64>();
    let sent_steered: u64 = steered.iter().map(|&i| sp.sent[i]).sum();
    match fault {
        Fault::Misroute => {
            for &i in &steered {
                let flow = &s.flows[i];
                let wrong = (flow.rx_q + 1) % usize::from(s.pairs);
                let on = sp.by_queue[i].get(&wrong).copied().unwrap_or(0);
                c.check(
                    sp.packets[i] > 0 && on as f64 >= 0.95 * sp.packets[i] as f64,
                    || {
                        format!(
                            "flow :{}: {on} of {} packets on q{wrong}, the queue after its filter's (by queue: {})",
                            flow.local_port,
                            sp.packets[i],
                            fmt_queues(&sp.by_queue[i])
                        )
                    },
                );
                // Misrouted, yet every frame arrives, once, intact.
                sp.check_flow(i, flow.local_port, 0, c);
            }
        }
        Fault::Drop | Fault::BadCsum => {
            let lost = sent_steered.saturating_sub(sum(|d| d.distinct));
            c.check(lost == faulted, || {
                format!(
                    "the guest lost {lost} frames of steered flows, the device dropped {faulted}"
                )
            });
        }
        Fault::Corrupt | Fault::Truncate | Fault::Reorder => {
            if let Some((what, get)) = fault.guest_count() {
                let bad = sum(get);
                c.check(bad == faulted, || {
                    format!(
                        "the guest found {bad} {what}, the device's {} says {faulted}",
                        fault.counter().0
                    )
                });
            }
        }
    }
    if fault == Fault::BadCsum {
        // The guest's own counters saw each one, and say so.
        let mut probe = Checks::default();
        sp.check_snmp(&mut probe);
        c.check(!probe.failures.is_empty(), || {
            "bad_csum_rate on, yet the guest's error counters did not move".into()
        });
        let csum: u64 = sp
            .snmp_moved
            .iter()
            .filter(|(k, _)| k.ends_with("InCsumErrors") && k.contains("Udp"))
            .map(|(_, n)| n)
            .sum();
        c.check(csum == faulted, || {
            format!(
                "the guest counted {csum} UDP checksum errors, the device sent {faulted} bad checksums ({:?})",
                sp.snmp_moved
            )
        });
        if let Some(l) = probe.failures.first() {
            lines.push(l.clone());
        }
    } else {
        sp.check_snmp(c);
    }
    Ok(format!(
        "{}={}: detected {detected}/{} steered flows, device {}=+{faulted}, hits=sent over {} frames (blind); control {}; e.g. {}",
        fault.knob(),
        fault.rate(),
        steered.len(),
        fault.counter().0,
        sent_steered,
        ctl.figures(),
        lines.join(" | ")
    ))
}

/// `misroute`: every filter hit to the next enabled queue.
pub(super) fn misroute(s: &mut Session, c: &mut Checks) -> Result<String> {
    path_fault(s, c, Fault::Misroute)
}

/// `drop`: 10% of the filter hits dropped, counted delivered.
pub(super) fn drop(s: &mut Session, c: &mut Checks) -> Result<String> {
    path_fault(s, c, Fault::Drop)
}

/// `bad-csum`: as `corrupt` under a stale UDP checksum: the guest's stack
/// drops them and counts checksum errors.
pub(super) fn bad_csum(s: &mut Session, c: &mut Checks) -> Result<String> {
    path_fault(s, c, Fault::BadCsum)
}

/// `corrupt`: one payload byte of 10% of the filter hits flipped, the
/// checksum kept valid.
pub(super) fn corrupt(s: &mut Session, c: &mut Checks) -> Result<String> {
    path_fault(s, c, Fault::Corrupt)
}

/// `truncate`: 10% of the filter hits 16 payload bytes short, lengths and
/// checksums kept consistent: only the length the payload carries tells.
pub(super) fn truncate(s: &mut Session, c: &mut Checks) -> Result<String> {
    path_fault(s, c, Fault::Truncate)
}

/// `reorder`: 10% of the filter hits held back and delivered after their
/// flow's next frame.
pub(super) fn reorder(s: &mut Session, c: &mut Checks) -> Result<String> {
    path_fault(s, c, Fault::Reorder)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (sent, what the agent counted, failure lines expected: a part of
    /// each): a datagram of a wrong length is named as such, not as a wrong
    /// payload, and still missing from what arrived intact.
    #[test]
    fn a_wrong_length_is_named_on_its_own_line() {
        let d = |distinct, corrupted, bad_len| Delivery {
            next: 10,
            distinct,
            corrupted,
            bad_len,
            ..Delivery::default()
        };
        let cases: &[(Delivery, &[&str])] = &[
            (d(10, 0, 0), &[]),
            (
                d(8, 2, 2),
                &[
                    "8 of 10 frames sent arrived intact",
                    "2 of its datagrams had a wrong length",
                ],
            ),
            (
                d(8, 2, 0),
                &["8 of 10", "2 of its datagrams had a wrong payload"],
            ),
            (
                d(7, 3, 1),
                &[
                    "7 of 10",
                    "2 of its datagrams had a wrong payload",
                    "1 of its datagrams had a wrong length",
                ],
            ),
        ];
        for (i, (got, want)) in cases.iter().enumerate() {
            let sp = Span {
                sent: vec![10],
                got: vec![*got],
                ..Span::default()
            };
            let mut c = Checks::default();
            sp.check_flow(0, 20000, 0, &mut c);
            assert_eq!(c.failures.len(), want.len(), "case {i}: {:?}", c.failures);
            for (line, part) in c.failures.iter().zip(want.iter()) {
                assert!(
                    line.contains(part) && line.starts_with("flow :20000:"),
                    "case {i}: {line}"
                );
            }
        }
    }

    #[test]
    fn snmp_fields_are_found_or_absent() {
        let snmp = "Ip: Forwarding DefaultTTL InReceives InHdrErrors\nIp: 1 64 100 7\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors\nUdp: 5 0 2 0 3 0 4\nUdpLite: InDatagrams InErrors\nUdpLite: 0 9\n";
        assert_eq!(snmp_field(snmp, "Ip", "InHdrErrors"), Some(7));
        assert_eq!(snmp_field(snmp, "Udp", "InErrors"), Some(2));
        assert_eq!(snmp_field(snmp, "Udp", "RcvbufErrors"), Some(3));
        assert_eq!(snmp_field(snmp, "Udp", "InCsumErrors"), Some(4));
        assert_eq!(snmp_field(snmp, "UdpLite", "InErrors"), Some(9));
        assert_eq!(snmp_field(snmp, "Udp", "Nope"), None);
        let six = "Ip6InReceives 10\nIp6InHdrErrors 1\nUdp6InErrors 0\n";
        assert_eq!(snmp_field(six, "", "Ip6InHdrErrors"), Some(1));
        assert_eq!(snmp_field(six, "", "Udp6InCsumErrors"), None);
        assert_eq!(snmp_field("", "Ip", "x"), None);
    }
}
