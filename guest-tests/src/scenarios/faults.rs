//! Scenarios of the faults group (issue 5, items 1-5 and 8): the device and
//! the guest module under injected faults, asserting on the module's and the
//! device's counters and on the trace.
//!
//! Every scenario starts from an unloaded module and an empty device table
//! (the module is reloaded, so its counters start at zero and it gets a
//! fresh CAPS) and, whatever happened, ends with the workload stopped, the
//! device knobs and table geometry back to the boot values, the channels and
//! NTUPLE restored and the module unloaded (the next scenario loads it).

use super::{Checks, Flow, Run, Session, GEN_IP, GEN_PORT, GUEST_IP};
use crate::harness::ctl::counter;
use crate::harness::{wait_for, Context, Result};
use crate::module::{self, ModuleCounters};
use crate::proto::Request;
use crate::{bail, ensure};
use arfs::{EventKind, FilterTable, FlowKey, L4Proto, Rss, TableConfig, TraceRecord};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The module's `reject_holdoff_ms` default: how long a flow the device
/// refused gets -EBUSY before the module asks again.
const REJECT_HOLDOFF: Duration = Duration::from_secs(1);

/// Run `scenario`, a scenario of this group ([`super::Setup::Fresh`] in the
/// table), from a fresh module and table, and put the session back after it.
pub(super) fn isolated(s: &mut Session, c: &mut Checks, scenario: Run) -> Result<String> {
    let outcome = s.fault_fresh().and_then(|()| scenario(s, c));
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
pub(super) struct ModFilter {
    rxq: u16,
    flow: FlowKey,
    state: String,
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

pub(super) fn table_of(v: &Value) -> Result<DevTable> {
    let mut m = BTreeMap::new();
    for f in v["filters"].as_array().cloned().unwrap_or_default() {
        let key: FlowKey =
            serde_json::from_value(f["flow"].clone()).ctx(format!("table flow {}", f["flow"]))?;
        let id = f["id"].as_u64().unwrap_or(u64::MAX) as u16;
        let rxq = f["rxq"].as_u64().unwrap_or(u64::MAX) as u16;
        m.insert(id, (key, rxq));
    }
    Ok(m)
}

fn delta(after: &ModuleCounters, before: &ModuleCounters, name: &str) -> u64 {
    after.get(name).saturating_sub(before.get(name))
}

fn dev_delta(after: &Value, before: &Value, ptr: &str) -> u64 {
    counter(after, ptr).saturating_sub(counter(before, ptr))
}

/// `after - before` for every number of a JSON tree (gauges such as
/// `live` come out right when they were 0 before).
fn json_delta(after: &Value, before: &Value) -> Value {
    match (after, before) {
        (Value::Object(a), Value::Object(b)) => Value::Object(
            a.iter()
                .map(|(k, v)| (k.clone(), json_delta(v, b.get(k).unwrap_or(&Value::Null))))
                .collect(),
        ),
        (Value::Number(a), Value::Number(b)) => match (a.as_u64(), b.as_u64()) {
            (Some(x), Some(y)) => json!(x.saturating_sub(y)),
            _ => after.clone(),
        },
        _ => after.clone(),
    }
}

/// Flows of the workload that need a filter (RSS does not deliver them to
/// their receiver's CPU).
fn need_count(s: &Session) -> usize {
    s.flows.iter().filter(|f| f.rss_q != f.cpu).count()
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
        let _ = self.guest.ctl.gen_stop_all();
        self.gen_running = false;
        self.gen_sets.clear();
        if !self.flows.is_empty() {
            let _ = self
                .guest
                .agent
                .call_value(&Request::UdpStop, Duration::from_secs(30));
            self.flows.clear();
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
        for (k, v) in [
            ("add_fail_rate", json!(0)),
            ("mgmt_loss_rate", json!(0)),
            ("program_latency", json!(0)),
        ] {
            if let Err(e) = self.guest.ctl.set(k, &v) {
                errs.push(e.0);
            }
        }
        if self.net_up {
            let q = u32::from(self.settings.queues);
            match self.guest.agent.req::<u32>(Request::SetChannels {
                ifname: super::IFNAME.into(),
                combined: q,
            }) {
                Ok(_) => self.rss = Rss::new(self.settings.queues),
                Err(e) => errs.push(format!("ethtool -L {q}: {e}")),
            }
        }
        if let Err(e) = self.fault_unload() {
            errs.push(e.0);
        }
        for (k, v) in [
            ("buckets", json!("none")),
            ("table_capacity", json!(self.boot_capacity)),
        ] {
            if let Err(e) = self.guest.ctl.set(k, &v) {
                errs.push(e.0);
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
    fn fault_start(&mut self, flows: Vec<Flow>) -> Result<()> {
        self.udp_start(&flows)?;
        self.flows = flows;
        self.fault_start_gen()
    }

    fn fault_start_gen(&mut self) -> Result<()> {
        self.start_gen_per_flow(self.settings.rate)
    }

    /// Stop the generator (receivers stay); returns what it sent per flow.
    fn fault_stop_gen(&mut self) -> Result<Vec<u64>> {
        let sent = self.gen_sent_by_flow()?;
        self.guest.ctl.gen_stop_all()?;
        self.gen_running = false;
        self.gen_sets.clear();
        Ok(sent)
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
    fn module_filters(&mut self) -> Result<BTreeMap<u16, ModFilter>> {
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
            m.insert(
                id,
                ModFilter {
                    rxq,
                    flow,
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
        stats0: &Value,
        sent: &[u64],
        trace: &[TraceRecord],
    ) -> Result<Accounting> {
        std::thread::sleep(Duration::from_secs(1));
        let stats1 = self.guest.ctl.stats()?;
        let table = self.guest.ctl.table()?;
        let mut live_hits: BTreeMap<FlowKey, u64> = BTreeMap::new();
        for f in table["filters"].as_array().cloned().unwrap_or_default() {
            let key: FlowKey = serde_json::from_value(f["flow"].clone())
                .ctx(format!("table flow {}", f["flow"]))?;
            *live_hits.entry(key).or_default() += f["hits"].as_u64().unwrap_or(0);
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
            let d = |k: &str| dev_delta(&stats1, stats0, &format!("/queues/{q}/{k}"));
            let rss = d("rx_rss");
            let dq = d("rx_drops");
            got_filter += d("rx_filter");
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
            .filter(|f| f.rss_q != f.cpu && have.get(&f.key).is_some_and(|x| x.1 == f.cpu))
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

// ---- 1. table full ---------------------------------------------------

/// 64 flows against a device table of 16 that the module believes has
/// 8192 (the device shrank under it with an empty table: a hardware
/// table shared with other users): the device rejects with table_full,
/// the module holds the refused flows off with -EBUSY instead of asking
/// per packet, and the 16 accepted flows are steered as well as ever.
pub(super) fn table_full(s: &mut Session, c: &mut Checks) -> Result<String> {
    const CAP: u64 = 16;
    // The module's keepalive HELLO would fetch a CAPS with the new
    // capacity and the module would then cap itself at 16 (-EBUSY
    // without asking the device): off, so the device is what refuses.
    let extra = s.settings.module.extra.clone();
    s.settings.module.extra = format!("{extra} keepalive_ms=0");
    let loaded = s.ensure_module();
    s.settings.module.extra = extra;
    loaded?;
    s.guest.ctl.set("table_capacity", &json!(CAP))?;
    let m0 = s.module_counters()?;
    let believed = m0.get("capacity");
    ensure!(
        believed == u64::from(s.boot_capacity),
        "the module believes the capacity is {believed}, not {}",
        s.boot_capacity
    );
    let s0 = s.guest.ctl.stats()?;
    let flows = s.make_flows(s.settings.flows);
    let need = flows.iter().filter(|f| f.rss_q != f.cpu).count() as u64;
    ensure!(
        need > CAP,
        "only {need} flows need a filter: cannot fill 16"
    );
    let t0 = Instant::now();
    s.fault_start(flows)?;
    let ctl = &mut s.guest.ctl;
    wait_for(
        s.settings.warmup_timeout,
        "the device table to fill (16 filters)",
        || Ok((counter(&ctl.table()?, "/live") == CAP).then_some(())),
    )?;
    let fill = t0.elapsed();
    // A few hold-off periods of refused flows asking again.
    std::thread::sleep(2 * REJECT_HOLDOFF);
    let w = s.measure()?;
    let elapsed = t0.elapsed();
    let trace = s.trace_since_mark()?;
    let m1 = s.module_counters()?;
    let s1 = s.guest.ctl.stats()?;
    let table = table_of(&s.guest.ctl.table()?)?;

    c.check(table.len() as u64 == CAP, || {
        format!("{} filters in a table of {CAP}", table.len())
    });
    let full = rejects_by_reason(&trace, "table_full");
    let dev_full = dev_delta(&s1, &s0, "/table/rejects/table_full");
    let mod_full = delta(&m1, &m0, "reject_table_full");
    c.check(!full.is_empty(), || {
        "no table_full reject in the trace".to_string()
    });
    c.check(
        dev_full == full.len() as u64 && mod_full == dev_full,
        || {
            format!(
                "table_full rejects: trace {}, device {dev_full}, module {mod_full}",
                full.len()
            )
        },
    );
    let other_rej = trace
        .iter()
        .filter(|r| r.event == EventKind::Reject)
        .count()
        - full.len();
    c.check(other_rej == 0, || {
        format!("{other_rej} rejects for other reasons than table_full")
    });
    // No retry loop: a refused flow is asked for again at most once per
    // hold-off period (plus the first try and one in flight).
    let mut per_flow: BTreeMap<FlowKey, u64> = BTreeMap::new();
    for r in &full {
        if let Some(k) = r.flow {
            *per_flow.entry(k).or_default() += 1;
        }
    }
    let bound = (elapsed.as_secs_f64() / REJECT_HOLDOFF.as_secs_f64()).ceil() as u64 + 2;
    let worst = per_flow.values().copied().max().unwrap_or(0);
    c.check(worst <= bound, || {
        format!("a refused flow was asked for {worst} times in {elapsed:?} (bound {bound}: one per {REJECT_HOLDOFF:?} hold-off)")
    });
    let add_ops = delta(&m1, &m0, "add_ops");
    let dev_ops =
        dev_delta(&s1, &s0, "/table/adds") + dev_delta(&s1, &s0, "/table/replaces") + dev_full;
    c.check(add_ops == dev_ops, || {
        format!("module sent {add_ops} ADD ops, the device handled {dev_ops}")
    });
    // -EBUSY or silence: 6.12 keeps calling for refused flows and gets
    // -EBUSY (busy, busy_rejected); 7.3 asks once per flow, so a batch
    // of ADDs sent before the first table_full ACK is simply refused
    // and those flows stay on RSS (no filter), with no -EBUSY at all.
    let busy = delta(&m1, &m0, "busy");
    let refused: BTreeSet<FlowKey> = full.iter().filter_map(|r| r.flow).collect();
    let on_rss = s
        .flows
        .iter()
        .filter(|f| refused.contains(&f.key))
        .filter(|f| !table.values().any(|(k, _)| *k == f.key))
        .count();
    c.check(on_rss == refused.len(), || {
        format!(
            "{} of {} refused flows have a filter after all",
            refused.len() - on_rss,
            refused.len()
        )
    });
    let steer_calls = delta(&m1, &m0, "steer_calls");
    // The accepted flows meet the bar.
    let accepted: BTreeSet<FlowKey> = table.values().map(|(k, _)| *k).collect();
    let mut acc_min: f64 = 1.0;
    let mut hw_min: f64 = 1.0;
    for (i, f) in s.flows.iter().enumerate() {
        if !accepted.contains(&f.key) {
            continue;
        }
        let pct = w.pct(i);
        acc_min = acc_min.min(pct);
        c.check(pct >= s.settings.min_on_cpu, || {
            format!(
                "accepted flow :{}: {:.1}% of {} packets on the receiver's CPU",
                f.local_port,
                100.0 * pct,
                w.packets[i]
            )
        });
        let hw = match w.hits[i] {
            Some(h) if w.sent[i] > 0 => (h as f64 / w.sent[i] as f64).min(1.0),
            _ => 0.0,
        };
        hw_min = hw_min.min(hw);
        c.check(hw >= s.settings.min_on_cpu, || {
            format!(
                "accepted flow :{}: its filter steered {:?} of {} packets sent (to q{})",
                f.local_port, w.hits[i], w.sent[i], f.cpu
            )
        });
    }
    Ok(format!(
        "cap={CAP} flows={} need_filter={need} filled_in={:.1}s live={} table_full: trace={} dev={dev_full} mod={mod_full} max_per_flow={worst}/{bound} add_ops={add_ops} steer_calls={steer_calls} busy={busy} busy_rejected={} accepted_on_cpu_min={:.1}% hw_min={:.1}%",
        s.flows.len(),
        fill.as_secs_f64(),
        table.len(),
        full.len(),
        delta(&m1, &m0, "busy_rejected"),
        100.0 * acc_min,
        100.0 * hw_min
    ))
}

// ---- 2. bucket collisions ---------------------------------------------

/// 64 buckets x 2 ways; flows chosen on the host (with the arfs crate,
/// the device's Toeplitz bucket hash) so that two buckets get 4 flows
/// each and 8 more flows have a bucket of their own. Every bucket_full
/// reject must be for a predicted collider, and replaying the trace the
/// rejected flow's bucket held exactly 2 filters, both predicted
/// colliders of that bucket.
pub(super) fn bucket_collisions(s: &mut Session, c: &mut Checks) -> Result<String> {
    const B: u32 = 64;
    const W: usize = 2;
    s.guest.ctl.set("buckets", &json!(format!("{B}x{W}")))?;
    let model = FilterTable::new(TableConfig {
        capacity: s.boot_capacity,
        buckets: Some((B, W as u16)),
        ..TableConfig::default()
    })
    .map_err(|e| format!("bucket model: {e}"))?;
    let ncpu = usize::from(s.settings.cpus);
    let candidate = |port: u16| {
        let key = FlowKey::v4(L4Proto::Udp, GEN_IP, GEN_PORT, GUEST_IP, port);
        let rss_q = usize::from(s.rss.queue_for_key(&key));
        let cpu = (rss_q + 1 + usize::from(port) % (ncpu - 1)) % ncpu;
        Flow {
            local_port: port,
            cpu,
            key,
            rss_q,
        }
    };
    let bucket = |k: &FlowKey| model.bucket_for(k).unwrap_or(u32::MAX);
    let mut by_bucket: BTreeMap<u32, Vec<u16>> = BTreeMap::new();
    for port in super::BASE_PORT..super::BASE_PORT + 2000 {
        by_bucket
            .entry(bucket(&candidate(port).key))
            .or_default()
            .push(port);
    }
    // Two hot buckets of 4, eight singles from other buckets.
    let hot: Vec<u32> = by_bucket
        .iter()
        .filter(|(_, p)| p.len() >= 4)
        .map(|(b, _)| *b)
        .take(2)
        .collect();
    ensure!(hot.len() == 2, "no two buckets with 4 candidate flows");
    let mut flows = Vec::new();
    let mut colliders: BTreeMap<u32, BTreeSet<FlowKey>> = BTreeMap::new();
    for b in &hot {
        for &p in &by_bucket[b][..4] {
            let f = candidate(p);
            colliders.entry(*b).or_default().insert(f.key);
            flows.push(f);
        }
    }
    let singles: Vec<Flow> = by_bucket
        .iter()
        .filter(|(b, _)| !hot.contains(b))
        .take(8)
        .map(|(_, p)| candidate(p[0]))
        .collect();
    let single_keys: BTreeSet<FlowKey> = singles.iter().map(|f| f.key).collect();
    flows.extend(singles);

    s.ensure_module()?;
    let m0 = s.module_counters()?;
    let s0 = s.guest.ctl.stats()?;
    let t0 = Instant::now();
    let nflows = flows.len();
    s.fault_start(flows)?;
    // Settled: every single steered, every hot bucket holding W filters.
    let mut last = String::new();
    let settled = wait_for(
        s.settings.warmup_timeout,
        "singles steered and hot buckets full",
        || {
            let t = table_of(&s.guest.ctl.table()?)?;
            let keys: BTreeSet<FlowKey> = t.values().map(|(k, _)| *k).collect();
            let singles_in = single_keys.iter().filter(|k| keys.contains(k)).count();
            let hot_fill: Vec<usize> = hot
                .iter()
                .map(|b| colliders[b].iter().filter(|k| keys.contains(k)).count())
                .collect();
            last = format!("singles {singles_in}/8, hot buckets {hot_fill:?}");
            Ok((singles_in == 8 && hot_fill.iter().all(|&n| n == W)).then_some(()))
        },
    );
    if let Err(e) = settled {
        bail!("{e}: {last}");
    }
    let settle = t0.elapsed();
    // Refused colliders ask again after the hold-off: more rejects.
    std::thread::sleep(2 * REJECT_HOLDOFF + Duration::from_millis(500));
    let trace = s.trace_since_mark()?;
    let m1 = s.module_counters()?;
    let s1 = s.guest.ctl.stats()?;
    let tj = s.guest.ctl.table()?;

    // The device's placement is the predicted one.
    for f in tj["filters"].as_array().cloned().unwrap_or_default() {
        let key: FlowKey = serde_json::from_value(f["flow"].clone())?;
        let dev_b = f["bucket"].as_u64();
        c.check(dev_b == Some(u64::from(bucket(&key))), || {
            format!(
                "filter for {key}: device bucket {dev_b:?}, arfs predicts {}",
                bucket(&key)
            )
        });
    }
    // Replay the trace (the table was empty at the mark).
    let mut live: BTreeMap<u16, FlowKey> = BTreeMap::new();
    let mut full = 0usize;
    let mut rejected: BTreeSet<FlowKey> = BTreeSet::new();
    for r in &trace {
        match r.event {
            EventKind::Add => {
                if let (Some(id), Some(k)) = (r.id, r.flow) {
                    live.insert(id, k);
                }
            }
            EventKind::Replace => {
                if let Some(p) = r.prev_id {
                    live.remove(&p);
                }
                if let (Some(id), Some(k)) = (r.id, r.flow) {
                    live.insert(id, k);
                }
            }
            EventKind::Del | EventKind::Evict => {
                if let Some(id) = r.id {
                    live.remove(&id);
                }
            }
            EventKind::Flush | EventKind::Reset => live.clear(),
            EventKind::Reject => {
                let Some(k) = r.flow else {
                    c.check(false, || format!("reject without a flow: {r:?}"));
                    continue;
                };
                let reason = r.reason.clone().unwrap_or_default();
                if reason != "bucket_full" {
                    c.check(false, || format!("reject for {k}: {reason}"));
                    continue;
                }
                full += 1;
                rejected.insert(k);
                let b = bucket(&k);
                let Some(pred) = colliders.get(&b) else {
                    c.check(false, || {
                        format!("bucket_full for {k} in bucket {b}, not a predicted collision")
                    });
                    continue;
                };
                c.check(pred.contains(&k), || {
                    format!("bucket_full for {k}: not one of bucket {b}'s predicted flows")
                });
                let occ: BTreeSet<FlowKey> =
                    live.values().filter(|x| bucket(x) == b).copied().collect();
                c.check(
                    occ.len() == W && occ.is_subset(pred) && !occ.contains(&k),
                    || format!("bucket_full for {k}: bucket {b} held {occ:?}, predicted {pred:?}"),
                );
            }
            _ => {}
        }
    }
    // Every collider that did not get in was refused with bucket_full.
    let now: BTreeSet<FlowKey> = table_of(&tj)?.values().map(|(k, _)| *k).collect();
    for (b, pred) in &colliders {
        for k in pred.iter().filter(|k| !now.contains(k)) {
            c.check(rejected.contains(k), || {
                format!("collider {k} (bucket {b}) has no filter and no bucket_full reject")
            });
        }
    }
    c.check(full > 0, || {
        "no bucket_full reject in the trace".to_string()
    });
    let dev_full = dev_delta(&s1, &s0, "/table/rejects/bucket_full");
    let mod_full = delta(&m1, &m0, "reject_bucket_full");
    c.check(dev_full == full as u64 && mod_full == dev_full, || {
        format!("bucket_full rejects: trace {full}, device {dev_full}, module {mod_full}")
    });
    c.check(
        dev_delta(&s1, &s0, "/table/rejects/table_full") == 0,
        || "table_full rejects with a nearly empty table".to_string(),
    );
    Ok(format!(
        "buckets={B}x{W} flows={nflows} hot={hot:?} (4 each) singles=8 settled_in={:.1}s live={} bucket_full: trace={full} dev={dev_full} mod={mod_full} refused_flows={} busy_rejected={}",
        settle.as_secs_f64(),
        now.len(),
        rejected.len(),
        delta(&m1, &m0, "busy_rejected")
    ))
}

// ---- 3. lossy management channel ------------------------------------

/// 20% of management frames lost each way while 64 flows get their
/// filters and then all move to another CPU (re-steers): the module's
/// retransmissions converge and the device table equals the module's
/// entry for entry.
pub(super) fn lossy_mgmt(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    s.guest.ctl.set("mgmt_loss_rate", &json!(0.2))?;
    let m0 = s.module_counters()?;
    let s0 = s.guest.ctl.stats()?;
    let flows = s.make_flows(s.settings.flows);
    s.fault_start(flows)?;
    let warm = s.wait_steered(&BTreeSet::new())?;
    // The module packs many ops per frame: one round of 64 flows is a
    // handful of frames. Every receiver moves on to the next CPU, round
    // after round (re-steers), until both directions lost frames and
    // the module retransmitted (at least 3 rounds, at most 12).
    let mut rounds = 0;
    let mut warm2 = Duration::ZERO;
    loop {
        let had: BTreeSet<FlowKey> = s.device_filters()?.keys().copied().collect();
        s.rotate_receivers()?;
        warm2 = warm2.max(s.wait_steered(&had)?);
        rounds += 1;
        let m = s.module_counters()?;
        let st = s.guest.ctl.stats()?;
        let lossy = delta(&m, &m0, "retransmits") > 0
            && dev_delta(&st, &s0, "/mgmt/dropped_by_loss") > 0
            && dev_delta(&st, &s0, "/mgmt/replies_dropped_by_loss") > 0;
        if rounds >= 12 || (rounds >= 3 && lossy) {
            break;
        }
    }
    let settle = s.module_settled(Duration::from_secs(30))?;
    let m1 = s.module_counters()?;
    let s1 = s.guest.ctl.stats()?;
    // Entry for entry, while the loss is still on.
    let modf = s.module_filters()?;
    let dev = table_of(&s.guest.ctl.table()?)?;
    let modt: DevTable = modf.iter().map(|(id, f)| (*id, (f.flow, f.rxq))).collect();
    c.check(modt == dev, || {
        let only_m: Vec<_> = modt.iter().filter(|(k, v)| dev.get(k) != Some(v)).collect();
        let only_d: Vec<_> = dev.iter().filter(|(k, v)| modt.get(k) != Some(v)).collect();
        format!(
            "module ({}) and device ({}) tables differ: module only {only_m:?}, device only {only_d:?}",
            modt.len(),
            dev.len()
        )
    });
    let retx = delta(&m1, &m0, "retransmits");
    let lost_in = dev_delta(&s1, &s0, "/mgmt/dropped_by_loss");
    let lost_out = dev_delta(&s1, &s0, "/mgmt/replies_dropped_by_loss");
    let dups = dev_delta(&s1, &s0, "/mgmt/duplicates");
    c.check(retx > 0, || "20% loss but no retransmission".to_string());
    c.check(lost_in > 0 && lost_out > 0, || {
        format!("loss knob dropped {lost_in} requests and {lost_out} replies")
    });
    // Each op applied once: module add_ok equals the device's adds.
    let add_ok = delta(&m1, &m0, "add_ok");
    let dev_adds = dev_delta(&s1, &s0, "/table/adds") + dev_delta(&s1, &s0, "/table/replaces");
    // Exact unless the module gave up on a frame (its oldest frame went
    // unanswered too often: `stalls`, a new HELLO, the ops sent again):
    // the device may have applied that frame whose ACKs were all lost,
    // which the module then never counts as add_ok.
    let stalls = delta(&m1, &m0, "stalls");
    c.check(
        add_ok == dev_adds || (stalls > 0 && add_ok <= dev_adds),
        || {
            format!(
                "module add_ok {add_ok}, device adds+replaces {dev_adds}, module stalls {stalls}"
            )
        },
    );
    let rej = dev_delta(&s1, &s0, "/table/rejects/table_full")
        + dev_delta(&s1, &s0, "/table/rejects/bad_queue")
        + dev_delta(&s1, &s0, "/table/rejects/bad_id");
    c.check(rej == 0, || format!("{rej} rejects under loss"));
    Ok(format!(
        "loss=20%/20% steered_in={:.1}s migrations={rounds} slowest_migration={:.1}s settled+{:.1}s filters={} retransmits={retx} frames_sent={} dev_lost_req={lost_in} dev_lost_rep={lost_out} duplicates={dups} reacks={} add_ok={add_ok} dev_add_ops={dev_adds} stalls={stalls}",
        warm.as_secs_f64(),
        warm2.as_secs_f64(),
        settle.as_secs_f64(),
        dev.len(),
        delta(&m1, &m0, "frames_sent"),
        dev_delta(&s1, &s0, "/mgmt/duplicate_reacks"),
    ))
}

// ---- 4. slow hardware -------------------------------------------------

/// Programming latency 10 ms (advertised in CAPS): packets keep
/// following RSS until each filter applies (per-queue accounting of
/// every packet), the module's RTO covers the latency (no
/// retransmission), repeated steer calls for a pending filter are
/// deduplicated (6.12 calls per packet), convergence time reported.
pub(super) fn slow_hw(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.guest.ctl.set("program_latency", &json!("10ms"))?;
    s.ensure_module()?;
    let m0 = s.module_counters()?;
    let lat = m0.get("latency_us");
    c.check(lat == 10_000, || {
        format!("module learned latency {lat} us from CAPS, device has 10000")
    });
    let s0 = s.guest.ctl.stats()?;
    // 12 flows that all need a filter, sharing the whole rate: a packet
    // every 6 ms per flow, so packets keep arriving on the RSS queue
    // while an ADD is pending (10 ms + the work item + the frame's way):
    // on 6.12 each of them makes a steer call the module must dedup.
    let flows: Vec<Flow> = s
        .make_flows(s.settings.flows)
        .into_iter()
        .filter(|f| f.rss_q != f.cpu)
        .take(12)
        .collect();
    let need = flows.len();
    s.fault_start(flows)?;
    let conv = s.wait_steered(&BTreeSet::new())?;
    std::thread::sleep(Duration::from_secs(1));
    let sent = s.fault_stop_gen()?;
    let trace = s.trace_since_mark()?;
    let acc = s.account(c, &s0, &sent, &trace)?;
    let m1 = s.module_counters()?;
    let s1 = s.guest.ctl.stats()?;
    let adds = trace.iter().filter(|r| r.event == EventKind::Add).count();
    // Each flow needing a filter got exactly one ADD: no second ADD
    // while the first was pending.
    let mut per_flow: BTreeMap<FlowKey, usize> = BTreeMap::new();
    for r in trace.iter().filter(|r| r.event == EventKind::Add) {
        if let Some(k) = r.flow {
            *per_flow.entry(k).or_default() += 1;
        }
    }
    let dup_adds = per_flow.values().filter(|&&n| n > 1).count();
    c.check(adds == need && dup_adds == 0, || {
        format!("{adds} ADDs for {need} flows needing a filter ({dup_adds} flows added twice)")
    });
    let add_ops = delta(&m1, &m0, "add_ops");
    let replaces = trace
        .iter()
        .filter(|r| r.event == EventKind::Replace)
        .count();
    let rejects = trace
        .iter()
        .filter(|r| r.event == EventKind::Reject)
        .count();
    c.check(add_ops as usize == adds + replaces + rejects, || {
        format!("module sent {add_ops} ADD ops, the trace has {adds} adds, {replaces} replaces, {rejects} rejects")
    });
    let retx = delta(&m1, &m0, "retransmits");
    c.check(retx == 0, || {
        format!("{retx} retransmissions: the RTO does not cover the 10 ms latency")
    });
    let dedup = delta(&m1, &m0, "steer_dedup");
    let calls = delta(&m1, &m0, "steer_calls");
    if s.kernel.label.starts_with("6.") {
        c.check(dedup > 0, || {
            format!("6.12: {calls} steer calls, none deduplicated")
        });
    }
    let rss_pkts: u64 = acc.via_rss.iter().sum();
    let filt_pkts: u64 = acc.via_filter.iter().sum();
    // Filters applied at least 10 ms after their request: ACK timing.
    let dev_adds = dev_delta(&s1, &s0, "/table/adds");
    Ok(format!(
        "latency=10ms need_filter={need} converged_in={:.1}s adds={adds} replaces={replaces} add_ops={add_ops} dev_adds={dev_adds} retransmits={retx} steer_calls={calls} steer_dedup={dedup} sent={} via_rss={rss_pkts} via_filter={filt_pkts} rx_drops={}",
        conv.as_secs_f64(),
        acc.sent,
        acc.drops
    ))
}

// ---- 5. ADD failures --------------------------------------------------

/// 10% of ADD ops fail with injected_failure: the module counts each
/// one (equal to the device's count and the trace's), the refused flows
/// stay on RSS until a later ADD succeeds (per-queue accounting), and
/// after the flows stop and the idle expiry runs the module's id space
/// is empty again (no leaked ids).
pub(super) fn add_failures(s: &mut Session, c: &mut Checks) -> Result<String> {
    // Device totals before the module loads: its counters start at 0.
    let s_pre = s.guest.ctl.stats()?;
    s.ensure_module()?;
    s.guest.ctl.set("add_fail_rate", &json!(0.1))?;
    let m0 = s.module_counters()?;
    let s0 = s.guest.ctl.stats()?;
    let flows = s.make_flows(s.settings.flows);
    let need = flows.iter().filter(|f| f.rss_q != f.cpu).count();
    s.fault_start(flows)?;
    // Refused flows are asked for again after the hold-off; give them
    // a few periods (not all need to make it: a kernel may stop asking).
    std::thread::sleep(Duration::from_secs(4));
    let steered_n = s.device_filters()?.len();
    let sent = s.fault_stop_gen()?;
    let trace = s.trace_since_mark()?;
    let acc = s.account(c, &s0, &sent, &trace)?;
    let m1 = s.module_counters()?;
    let s1 = s.guest.ctl.stats()?;
    let inj = rejects_by_reason(&trace, "injected_failure");
    let dev_inj = dev_delta(&s1, &s0, "/table/rejects/injected_failure");
    let mod_inj = delta(&m1, &m0, "reject_injected_failure");
    c.check(!inj.is_empty(), || {
        "10% ADD failures but none in the trace".to_string()
    });
    c.check(dev_inj == inj.len() as u64 && mod_inj == dev_inj, || {
        format!(
            "injected failures: trace {}, device {dev_inj}, module {mod_inj}",
            inj.len()
        )
    });
    // A refused flow's packets before its next successful ADD were
    // delivered by RSS: account() checked every queue; here: each
    // refused flow did get packets by RSS.
    let refused: BTreeSet<FlowKey> = inj.iter().filter_map(|r| r.flow).collect();
    for (i, f) in s.flows.iter().enumerate() {
        if refused.contains(&f.key) {
            c.check(acc.via_rss[i] > 0, || {
                format!("refused flow :{} got nothing by RSS", f.local_port)
            });
        }
    }
    let ratio = if inj.is_empty() {
        0.0
    } else {
        inj.len() as f64 / delta(&m1, &m0, "add_ops").max(1) as f64
    };
    // Expiry: the idle backstop deletes every filter of the stopped flows.
    s.guest.agent.write_file(
        &format!("{}/idle_timeout_ms", module::PARAMS_DIR),
        &s.settings.module.idle_timeout_ms.to_string(),
    )?;
    let bound = s.settings.module.expiry_bound(steered_n.max(1)) + REJECT_HOLDOFF;
    let t0 = Instant::now();
    let mut last = String::new();
    let r = wait_for(
        bound + Duration::from_secs(20),
        "the id space to empty",
        || {
            let m = s.module_counters()?;
            let live = counter(&s.guest.ctl.table()?, "/live");
            last = format!(
                "module ids {} live {} rejected_holdoff {}, device live {live}",
                m.get("ids"),
                m.get("live"),
                m.get("rejected_holdoff")
            );
            Ok((m.get("ids") == 0 && m.get("live") == 0 && live == 0).then(|| t0.elapsed()))
        },
    );
    let emptied = match r {
        Ok(t) => t,
        Err(e) => {
            c.check(false, || format!("{e}: {last} (leaked ids?)"));
            t0.elapsed()
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    let m2 = s.module_counters()?;
    let s2 = s.guest.ctl.stats()?;
    for msg in m2.compare(&json_delta(&s2, &s_pre)) {
        c.failures.push(msg);
    }
    Ok(format!(
        "add_fail_rate=10% need_filter={need} steered_after_4s={steered_n} injected: trace={} dev={dev_inj} mod={mod_inj} ({:.1}% of add_ops) refused_flows={} busy_rejected={} via_rss={} rx_drops={} ids_empty_in={:.1}s final_ids={} final_live={}",
        inj.len(),
        100.0 * ratio,
        refused.len(),
        delta(&m1, &m0, "busy_rejected"),
        acc.via_rss.iter().sum::<u64>(),
        acc.drops,
        emptied.as_secs_f64(),
        m2.get("ids"),
        m2.get("live")
    ))
}

// ---- 8. guest-side reconfiguration --------------------------------------

/// `ethtool -L` 4 -> 2 -> 4 and NTUPLE off/on with 64 steered flows.
/// Traffic is stopped around each channel change: with RFS configured,
/// `ethtool -L` under traffic makes the kernel itself WARN in
/// get_rps_cpu (seen on 6.12 and 7.3 without this module), which would
/// hide what is tested here.
pub(super) fn reconfig(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let full_q = s.settings.queues;
    let low_q: u16 = 2;
    let s0 = s.guest.ctl.stats()?;
    let flows = s.make_flows(s.settings.flows);
    s.fault_start(flows)?;
    s.wait_steered(&BTreeSet::new())?;
    let before = table_of(&s.guest.ctl.table()?)?;
    let doomed: BTreeSet<u16> = before
        .iter()
        .filter(|(_, (_, q))| *q >= low_q)
        .map(|(id, _)| *id)
        .collect();
    ensure!(
        !doomed.is_empty(),
        "no filter points at rx queues >= {low_q}"
    );

    // 4 -> 2, quiesced.
    s.fault_stop_gen()?;
    std::thread::sleep(Duration::from_millis(500));
    s.trace_since_mark()?;
    let got: u32 = s.guest.agent.req(Request::SetChannels {
        ifname: super::IFNAME.into(),
        combined: u32::from(low_q),
    })?;
    ensure!(
        got == u32::from(low_q),
        "ethtool -L {low_q}: device has {got}"
    );
    s.rss = Rss::new(low_q);
    let rmap_low = s.wait_rmap(low_q)?;
    let ctl = &mut s.guest.ctl;
    let mut last = String::new();
    let r = wait_for(
        Duration::from_secs(15),
        "filters to disabled rx queues to be deleted",
        || {
            let t = table_of(&ctl.table()?)?;
            let bad: Vec<u16> = t
                .iter()
                .filter(|(_, (_, q))| *q >= low_q)
                .map(|(id, _)| *id)
                .collect();
            last = format!("{bad:?}");
            Ok(bad.is_empty().then_some(()))
        },
    );
    if let Err(e) = r {
        c.check(false, || {
            format!("{e}: still pointing at disabled queues: {last}")
        });
    }
    let s_low = s.guest.ctl.stats()?;
    c.check(
        counter(&s_low, "/enabled_pairs") == u64::from(low_q),
        || {
            format!(
                "device spreads over {} pairs after ethtool -L {low_q}",
                counter(&s_low, "/enabled_pairs")
            )
        },
    );
    // Traffic again on 2 queues for a while: nothing may go to q2/q3.
    s.fault_start_gen()?;
    std::thread::sleep(Duration::from_secs(3));
    s.fault_stop_gen()?;
    std::thread::sleep(Duration::from_millis(500));
    let t_low = s.trace_since_mark()?;
    let s_low2 = s.guest.ctl.stats()?;
    let deleted: BTreeSet<u16> = t_low
        .iter()
        .filter(|r| matches!(r.event, EventKind::Del | EventKind::Evict))
        .filter_map(|r| r.id)
        .collect();
    for id in &doomed {
        c.check(deleted.contains(id), || {
            format!("filter {id} (to a disabled queue) has no delete in the trace")
        });
    }
    let bad_adds: Vec<&TraceRecord> = t_low
        .iter()
        .filter(|r| {
            matches!(r.event, EventKind::Add | EventKind::Replace)
                && r.rxq.is_some_and(|q| q >= low_q)
        })
        .collect();
    c.check(bad_adds.is_empty(), || {
        format!(
            "{} filters to disabled queues installed, first {:?}",
            bad_adds.len(),
            bad_adds.first()
        )
    });
    let dis_drops = (0..usize::from(full_q))
        .map(|q| dev_delta(&s_low2, &s_low, &format!("/queues/{q}/rx_drops_disabled")))
        .sum::<u64>();
    let dis_pkts = (usize::from(low_q)..usize::from(full_q))
        .map(|q| dev_delta(&s_low2, &s_low, &format!("/queues/{q}/rx_packets")))
        .sum::<u64>();
    c.check(dis_drops == 0 && dis_pkts == 0, || {
        format!("with {low_q} queues: {dis_pkts} packets delivered and {dis_drops} dropped on disabled queues")
    });
    let low_filters = table_of(&s.guest.ctl.table()?)?.len();

    // 2 -> 4, quiesced; the new rx queues need their RFS tables again.
    let got: u32 = s.guest.agent.req(Request::SetChannels {
        ifname: super::IFNAME.into(),
        combined: u32::from(full_q),
    })?;
    ensure!(
        got == u32::from(full_q),
        "ethtool -L {full_q}: device has {got}"
    );
    s.rss = Rss::new(full_q);
    // The module rebuilds its CPU -> queue rmap in its work item; until
    // then the kernel maps CPUs to the old queues and marks flows as
    // settled on them (no steer call later). Traffic resumes after.
    let rmap_full = s.wait_rmap(full_q)?;
    for f in &mut s.flows {
        f.rss_q = usize::from(s.rss.queue_for_key(&f.key));
    }
    let st = s.settings.clone();
    s.guest.agent.req::<Value>(Request::Rfs {
        ifname: super::IFNAME.into(),
        sock_flow_entries: st.sock_flow_entries.next_power_of_two(),
        flow_cnt: st.flow_cnt,
        rps_cpus: None,
    })?;
    s.fault_start_gen()?;
    let back = s.wait_steered(&BTreeSet::new())?;

    // NTUPLE off: every filter goes; nothing is added while off.
    s.trace_since_mark()?;
    let off: bool = s.guest.agent.req(Request::SetFeature {
        ifname: super::IFNAME.into(),
        feature: "rx-ntuple-filter".into(),
        on: false,
    })?;
    c.check(!off, || {
        "rx-ntuple-filter still on after turning it off".into()
    });
    let ctl = &mut s.guest.ctl;
    let flushed = wait_for(
        Duration::from_secs(15),
        "the device table to empty with NTUPLE off",
        || Ok((counter(&ctl.table()?, "/live") == 0).then_some(())),
    );
    if let Err(e) = flushed {
        c.check(false, || e.0);
    }
    std::thread::sleep(Duration::from_secs(2));
    let t_off = s.trace_since_mark()?;
    let live_off = counter(&s.guest.ctl.table()?, "/live");
    // Trace lines are written asynchronously: records from before the
    // switch may come first. Nothing may be added after the flush.
    let last_flush = t_off
        .iter()
        .rposition(|r| {
            matches!(r.event, EventKind::Del | EventKind::Flush)
                && r.reason.as_deref() == Some("flush")
        })
        .unwrap_or(0);
    let adds_off = t_off[last_flush..]
        .iter()
        .filter(|r| matches!(r.event, EventKind::Add | EventKind::Replace))
        .count();
    c.check(live_off == 0 && adds_off == 0, || {
        format!("NTUPLE off: {live_off} filters live, {adds_off} ADDs after the flush")
    });
    let on: bool = s.guest.agent.req(Request::SetFeature {
        ifname: super::IFNAME.into(),
        feature: "rx-ntuple-filter".into(),
        on: true,
    })?;
    c.check(on, || "rx-ntuple-filter did not turn on again".into());
    // Neither kernel asks again by itself for an established flow: while
    // NTUPLE was off, set_rps_cpu recorded the flow's CPU in the slot of
    // the queue RSS delivers it to (software RFS), so once NTUPLE is on
    // the flow looks settled and no steer call comes until the flow
    // moves (what a hardware driver sees as well). Measured and
    // reported; then every receiver moves to the next CPU, which makes
    // the kernel ask, and every flow must get its filter again.
    let t_on = Instant::now();
    let warmup = s.settings.warmup_timeout;
    s.settings.warmup_timeout = Duration::from_secs(4);
    let resumed = s.wait_steered(&BTreeSet::new());
    s.settings.warmup_timeout = warmup;
    let resumed_by_itself = match &resumed {
        Ok(_) => need_count(s),
        Err(_) => s.steered_count()?,
    };
    let resume_t = t_on.elapsed();
    s.rotate_receivers()?;
    let again = s.wait_steered(&BTreeSet::new())?;
    let s1 = s.guest.ctl.stats()?;
    let m = s.module_counters()?;
    let bad_q = dev_delta(&s1, &s0, "/table/rejects/bad_queue");
    c.check(bad_q == 0, || {
        format!("the module sent {bad_q} ADDs to queues the device has disabled")
    });
    c.check(m.get("bad_rxq") == 0, || {
        format!(
            "the kernel asked to steer to {} rx queues beyond real_num_rx_queues",
            m.get("bad_rxq")
        )
    });
    Ok(format!(
        "filters={} to_q>={low_q}={} rmap_rebuilt_in={:.1}s/{:.1}s deleted_after_-L{low_q}={} filters_on_{low_q}q={low_filters} resteered_on_{full_q}q_in={:.1}s ntuple_off_live={live_off} resumed_by_itself={resumed_by_itself}/{} in {:.1}s after_migration_in={:.1}s queue_flushes={} ntuple_flushes={} bad_queue_rejects={bad_q}",
        before.len(),
        doomed.len(),
        rmap_low.as_secs_f64(),
        rmap_full.as_secs_f64(),
        deleted.intersection(&doomed).count(),
        back.as_secs_f64(),
        need_count(s),
        resume_t.as_secs_f64(),
        again.as_secs_f64(),
        m.get("queue_flushes"),
        m.get("ntuple_flushes")
    ))
}
