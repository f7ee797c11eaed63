//! Scenarios of the faults group (issue 5, items 1-5 and 8): the device and
//! the guest module under injected faults, asserting on the module's and the
//! device's counters and on the trace.
//!
//! Every scenario starts from an unloaded module and an empty device table
//! (the module is reloaded, so its counters start at zero and it gets a
//! fresh CAPS) and, whatever happened, ends with the workload stopped, the
//! device knobs and table geometry back to the boot values, the channels and
//! NTUPLE restored and the module unloaded (the next scenario loads it).
//!
//! This file has that framing ([`isolated`]) and the group's helpers; the
//! scenarios are in `table.rs` (table-full, bucket-collisions), `device.rs`
//! (lossy-mgmt, slow-hw, add-failures), `expiry.rs` (live-flows),
//! `handshake.rs` (handshake) and `reconfig.rs`.

use super::{Checks, Flow, Run, Session};
use crate::harness::{wait_for, Context, Result};
use crate::module::{self, ModuleCounters};
use crate::proto::Request;
use crate::{bail, ensure};
use arfs::{EventKind, FlowKey, TraceRecord};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vnic_ctl_proto::{QueueStats, SetValue, Stats, Table};

pub(super) mod device;
pub(super) mod driver;
pub(super) mod expiry;
pub(super) mod handshake;
pub(super) mod reconfig;
pub(super) mod table;

/// The module's `reject_holdoff_ms` default: how long a flow the device
/// refused gets -EBUSY before the module asks again.
const REJECT_HOLDOFF: Duration = Duration::from_secs(1);

/// Run `scenario`, a scenario of this group ([`super::Setup::Fresh`] in the
/// table), from a fresh module and table, and put the session back after it.
pub(super) fn isolated(s: &mut Session, c: &mut Checks, scenario: Run) -> Result<String> {
    let outcome = s
        .fault_fresh()
        .and_then(|()| scenario(s, c))
        .and_then(|fig| Ok(format!("{fig} {}", s.fault_delivery(c)?)));
    let cleanup = s.fault_restore();
    match (outcome, cleanup) {
        (Ok(fig), Ok(())) => Ok(fig),
        (Ok(fig), Err(e)) => {
            c.failures
                .push(format!("restoring the session afterwards: {e}"));
            Ok(fig)
        }
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(e2)) => Err(format!("{e}; and restoring the session: {e2}").into()),
    }
}

/// A module filter as debugfs `filters` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::scenarios) struct ModFilter {
    pub(in crate::scenarios) rxq: u16,
    pub(in crate::scenarios) flow: FlowKey,
    /// The RFS slot the kernel passed to ndo_rx_flow_steer.
    pub(in crate::scenarios) flow_id: u32,
    pub(in crate::scenarios) state: String,
}

/// Device filters by id: (flow, rxq).
pub(super) type DevTable = BTreeMap<u16, (FlowKey, u16)>;

/// Per-queue delivery accounting of a workload (see `account`).
#[derive(Debug, Default)]
struct Accounting {
    /// Packets each flow got before / outside a filter (sent - filtered).
    via_rss: Vec<u64>,
    /// Packets each flow's filters steered (live hits + hits of deleted
    /// or replaced entries, from the trace).
    via_filter: Vec<u64>,
    sent: u64,
    /// Frames the device dropped (no rx buffer) on any queue meanwhile.
    drops: u64,
}

pub(super) fn table_of(t: &Table) -> Result<DevTable> {
    let mut m = BTreeMap::new();
    for f in &t.filters {
        m.insert(f.id, (super::flow_key(&f.flow)?, f.rxq));
    }
    Ok(m)
}

pub(in crate::scenarios) fn delta(
    after: &ModuleCounters,
    before: &ModuleCounters,
    name: &str,
) -> u64 {
    after.get(name).saturating_sub(before.get(name))
}

/// A device counter's `after - before` (0 if it went down).
fn dev_delta(after: &Stats, before: &Stats, counter: impl Fn(&Stats) -> u64) -> u64 {
    counter(after).saturating_sub(counter(before))
}

/// Flows of the workload that need a filter (RSS does not deliver them to
/// their receiver's CPU).
fn need_count(s: &Session) -> usize {
    s.flows.iter().filter(|f| f.needs_filter()).count()
}

fn rejects_by_reason<'a>(trace: &'a [TraceRecord], reason: &str) -> Vec<&'a TraceRecord> {
    trace
        .iter()
        .filter(|r| r.event == EventKind::Reject && r.reason.as_deref() == Some(reason))
        .collect()
}

impl Session {
    // ---- set-up and clean-up shared by the group --------------------------

    /// Stop generator and receivers; forget the workload.
    fn fault_stop_workload(&mut self) {
        let _ = self.guest.ctl.gen_stop(None);
        self.gen_running = false;
        self.gen_sets.clear();
        if !self.flows.is_empty() {
            let _ = self
                .guest
                .agent
                .call_value(&Request::UdpStop, Duration::from_secs(30));
            self.flows.clear();
            self.delivery_mark = None;
        }
    }

    /// Unload the module (its FLUSH empties the device table).
    fn fault_unload(&mut self) -> Result<()> {
        if !self.module_loaded {
            return Ok(());
        }
        self.rmmod(Duration::from_mins(1)).ctx("rmmod vnic_arfs")?;
        self.wait_device_empty("the device table to be flushed on rmmod")?;
        // The trace is written asynchronously: consume it up to the FLUSH
        // record, so that the deletes of this unload (with their hits) do
        // not show up in the next scenario's part of the trace.
        wait_for(
            Duration::from_secs(10),
            "the trace to record the unload FLUSH",
            || {
                let t = self.trace_since_mark()?;
                Ok(t.iter()
                    .any(|r| r.event == EventKind::Flush && r.reason.as_deref() == Some("unload"))
                    .then_some(()))
            },
        )
    }

    /// No workload, no module, empty device table; trace mark at the end.
    fn fault_fresh(&mut self) -> Result<()> {
        self.fault_stop_workload();
        self.ensure_net()?;
        self.fault_unload()?;
        self.trace_since_mark()?;
        Ok(())
    }

    /// Everything back to what the other scenarios expect, even after a
    /// failure half-way; tries every step and reports the first error.
    fn fault_restore(&mut self) -> Result<()> {
        let mut errs: Vec<String> = Vec::new();
        self.fault_stop_workload();
        for k in [
            "add_fail_rate",
            "mgmt_loss_rate",
            "program_latency",
            "misroute",
            "rogue_responder",
            "drop_rate",
            "corrupt_rate",
            "bad_csum_rate",
            "rogue_nonce",
            "drop_acks",
            "forge_acks",
            "delay_effect_ms",
            "wrong_trace",
        ] {
            if let Err(e) = self.guest.ctl.set(k, 0) {
                errs.push(crate::harness::Error::from(e).0);
            }
        }
        if self.net_up {
            let pairs = self.settings.topology().pairs();
            let q = u32::from(pairs);
            match self.guest.agent.req::<u32>(Request::SetChannels {
                ifname: super::IFNAME.into(),
                combined: q,
            }) {
                Ok(_) => self.set_pairs(pairs),
                Err(e) => errs.push(format!("ethtool -L {q}: {e}")),
            }
        }
        if let Err(e) = self.fault_unload() {
            errs.push(e.0);
        }
        for (k, v) in [
            ("buckets", SetValue::from("none")),
            ("table_capacity", SetValue::from(self.boot_capacity)),
        ] {
            if let Err(e) = self.guest.ctl.set(k, v) {
                errs.push(crate::harness::Error::from(e).0);
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            bail!("{}", errs.join("; "))
        }
    }

    /// Receivers for `flows` and one generator set per flow (exact per-flow
    /// send counts), `rate` packets per second in total.
    /// The delivery mark is taken before the first frame: every frame the
    /// generator sends from here on is accounted for by [`isolated`].
    fn fault_start(&mut self, flows: Vec<Flow>) -> Result<()> {
        self.udp_start(&flows)?;
        self.flows = flows;
        self.start_mark()?;
        self.fault_start_gen()
    }

    /// Start the workload's generator sets, or resume them where
    /// [`Self::fault_stop_gen`] paused them (their sequence numbers go on,
    /// so the delivery check spans the whole scenario).
    fn fault_start_gen(&mut self) -> Result<()> {
        if self.gen_sets.is_empty() {
            self.start_gen_per_flow(self.settings.rate)
        } else {
            self.gen_op(vnic_ctl_proto::GenOp::Resume)
        }
    }

    /// Pause the generator (receivers stay); returns what it sent per flow.
    fn fault_stop_gen(&mut self) -> Result<Vec<u64>> {
        self.gen_op(vnic_ctl_proto::GenOp::Pause)?;
        self.gen_sent_by_flow()
    }

    /// The scenario's delivery check (issue 23): from the workload's start
    /// (or its last quiet point) to a quiet point now, every frame the
    /// generator sent arrived intact, once, and the guest's error counters
    /// stood still. No fault scenario drops data frames on purpose: its
    /// faults hit the management path, the table or the configuration,
    /// and the generator is paused while channels change. A scenario
    /// that ends without a workload says so in its figures.
    fn fault_delivery(&mut self, c: &mut Checks) -> Result<String> {
        if self.delivery_mark.is_none() || self.flows.is_empty() {
            return Ok("delivery: no workload at the end".into());
        }
        self.delivery_window(c, false)
    }

    /// The module's filters in the steady `active` state, as a [`DevTable`],
    /// and how many others it holds (being added, re-steered or deleted).
    pub(super) fn module_table(&mut self) -> Result<(DevTable, usize)> {
        let all = self.module_filters()?;
        let active: DevTable = all
            .iter()
            .filter(|(_, f)| f.state == "active")
            .map(|(id, f)| (*id, (f.flow, f.rxq)))
            .collect();
        let unsettled = all.len() - active.len();
        Ok((active, unsettled))
    }

    /// The module's filters (debugfs `filters`), by id.
    pub(in crate::scenarios) fn module_filters(&mut self) -> Result<BTreeMap<u16, ModFilter>> {
        let path = format!("{}/{}/filters", module::DEBUGFS_DIR, super::IFNAME);
        let text = self.guest.agent.read_file(&path)?;
        let mut m = BTreeMap::new();
        for l in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            // id rxq proto src dst flow_id state
            let w: Vec<&str> = l.split_whitespace().collect();
            ensure!(w.len() == 7, "unexpected module filter line {l:?}");
            let flow: FlowKey = format!("{} {} -> {}", w[2], w[3], w[4])
                .parse()
                .ctx(format!("module filter line {l:?}"))?;
            let id: u16 = w[0].parse().ctx(format!("id in {l:?}"))?;
            let rxq: u16 = w[1].parse().ctx(format!("rxq in {l:?}"))?;
            let flow_id: u32 = w[5].parse().ctx(format!("flow_id in {l:?}"))?;
            m.insert(
                id,
                ModFilter {
                    rxq,
                    flow,
                    flow_id,
                    state: w[6].to_string(),
                },
            );
        }
        Ok(m)
    }

    /// Per-flow and per-queue delivery accounting after the generator
    /// stopped (with `sent` per flow) and the guest drained its rings.
    /// Checks that every packet the filters did not steer arrived on the
    /// flow's RSS queue (device `rx_rss` per queue equals the sum over the
    /// flows RSS maps there of their unfiltered packets), and that the
    /// device's `rx_filter` total equals the filters' hits.
    fn account(
        &mut self,
        c: &mut Checks,
        stats0: &Stats,
        sent: &[u64],
        trace: &[TraceRecord],
    ) -> Result<Accounting> {
        std::thread::sleep(Duration::from_secs(1));
        let stats1 = self.guest.ctl.stats()?;
        let table = self.guest.ctl.table()?;
        let mut live_hits: BTreeMap<FlowKey, u64> = BTreeMap::new();
        for f in &table.filters {
            *live_hits.entry(super::flow_key(&f.flow)?).or_default() += f.hits;
        }
        // Hits of entries that are gone: the trace carries them.
        let mut gone_hits: BTreeMap<FlowKey, u64> = BTreeMap::new();
        for r in trace {
            let (k, h) = match r.event {
                EventKind::Replace => (r.prev_flow, r.hits),
                EventKind::Del | EventKind::Evict => (r.flow, r.hits),
                _ => continue,
            };
            if let (Some(k), Some(h)) = (k, h) {
                *gone_hits.entry(k).or_default() += h;
            }
        }
        let nq = usize::from(self.settings.queues);
        let mut acc = Accounting::default();
        let mut want_rss = vec![0u64; nq];
        for (i, f) in self.flows.iter().enumerate() {
            let filt = live_hits.get(&f.key).copied().unwrap_or(0)
                + gone_hits.get(&f.key).copied().unwrap_or(0);
            let s = sent[i];
            // Packets sent between reading `sent` and the stop are counted
            // by the device but not in `sent`: a little slack per flow.
            c.check(filt <= s + 3, || {
                format!(
                    "flow :{}: its filters steered {filt} packets, the generator sent {s}",
                    f.local_port
                )
            });
            acc.via_rss.push(s.saturating_sub(filt));
            acc.via_filter.push(filt);
            acc.sent += s;
            want_rss[f.rss_q] += s.saturating_sub(filt);
        }
        let total_filter: u64 = acc.via_filter.iter().sum();
        let mut got_filter = 0;
        let mut drops = 0;
        let slack_flows = 3 * self.flows.len() as u64;
        for (q, &want) in want_rss.iter().enumerate() {
            let d = |k: fn(&QueueStats) -> u64| dev_delta(&stats1, stats0, |s| k(&s.queues[q]));
            let rss = d(|q| q.rx_rss);
            let dq = d(|q| q.rx_drops);
            got_filter += d(|q| q.rx_filter);
            drops += dq;
            // A dropped frame (the guest had no rx buffer) may have been
            // chosen by RSS or by a filter (filter hits count it): drops
            // count on either side. Slack: packets sent after the last
            // `sent` read (a few per flow), ARP and the like.
            let slack = 8 + want / 50;
            c.check(rss + dq + slack >= want && rss <= want + slack + slack_flows, || {
                format!(
                    "rx queue {q}: {rss} packets by RSS (+{dq} dropped), the flows RSS maps there had {want} packets outside their filters"
                )
            });
        }
        acc.drops = drops;
        c.check(
            got_filter + drops + 8 >= total_filter && got_filter <= total_filter + slack_flows,
            || format!("device rx_filter total {got_filter} (+{drops} dropped), filter hits {total_filter}"),
        );
        Ok(acc)
    }

    /// Wait until the module has nothing in flight and every filter it
    /// holds is `active` (what it sent was acknowledged).
    fn module_settled(&mut self, timeout: Duration) -> Result<Duration> {
        let t0 = Instant::now();
        let mut last = String::new();
        let r = wait_for(timeout, "the module to settle (nothing in flight)", || {
            let m = self.module_counters()?;
            let f = self.module_filters()?;
            let busy: Vec<String> = f
                .iter()
                .filter(|(_, x)| x.state != "active")
                .map(|(id, x)| format!("{id}:{}", x.state))
                .collect();
            last = format!("inflight {} filters not active {busy:?}", m.get("inflight"));
            Ok((m.get("inflight") == 0 && busy.is_empty()).then(|| t0.elapsed()))
        });
        match r {
            Ok(t) => Ok(t),
            Err(e) => bail!("{e}: {last}"),
        }
    }

    /// Flows of the workload that need a filter and have one to their CPU.
    fn steered_count(&mut self) -> Result<usize> {
        let have = self.device_filters()?;
        Ok(self
            .flows
            .iter()
            .filter(|f| f.needs_filter() && have.get(&f.key).is_some_and(|x| x.1 == f.rx_q))
            .count())
    }

    /// Wait until the module's rmap covers exactly `n` rx queues.
    fn wait_rmap(&mut self, n: u16) -> Result<Duration> {
        let t0 = Instant::now();
        let mut last = (0, 0);
        let r = wait_for(
            Duration::from_secs(10),
            "the module to rebuild its rmap",
            || {
                let m = self.module_counters()?;
                last = (m.get("rx_queues"), m.get("rmap_queues"));
                Ok((last == (u64::from(n), u64::from(n))).then(|| t0.elapsed()))
            },
        );
        match r {
            Ok(t) => Ok(t),
            Err(e) => bail!("{e}: rx_queues/rmap_queues {last:?}, want {n}"),
        }
    }
}
