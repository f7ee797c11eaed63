//! The issue-6 experiments as workloads over one booted [`Session`]:
//!
//! - [`collision_point`]: the 2025 slot-collision measurement (Steer-C / Add /
//!   Del per `rps_flow_cnt`), one point per call, the table state reset
//!   before each point so that many points run in one boot;
//! - [`rps_phase`]: plain RPS on a single queue (no RFS, no aRFS): per-CPU
//!   NET_RX softirqs and `/proc/net/softnet_stat` deltas for one traffic mix.
//!
//! The driver is the `vnic-experiment` binary; what the figures mean is in
//! guest-tests/docs/experiments.md. These are measurements, not scenarios of the suite:
//! the only verdicts are the acceptance check of the binary.

use super::slots::{self, AtEnd, SlotCounts, SlotRule};
use super::tracecheck::Seg;
use super::workload::{napi_queues, queue_delta, Flow};
use super::{Session, GEN_IP, GEN_PORT, GUEST_IP, IFNAME};
use crate::harness::{wait_for, Result};
use crate::module::{self, ModuleCounters};
use crate::procfs;
use crate::proto::{FlowCounters, Request, RxQueueNapi, UdpFlowSpec, UdpSpec, UdpStats};
use crate::{bail, ensure};
use arfs::{EventKind, FlowKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use vnic_ctl_proto::{FlowSpec, RttStats, Stats};

/// First guest port of the collision workload; iteration k of the
/// five-iteration variant uses `COLLISION_PORT + k * flows ..`.
pub const COLLISION_PORT: u16 = 20000;
/// The guest port the RPS workload's single socket listens on.
pub const RPS_PORT: u16 = 30000;
/// Time for vnic's trace writer to flush what it has (it flushes after
/// 50 ms without a new line).
const TRACE_SETTLE: Duration = Duration::from_millis(500);
/// How many flows that did not hold their queue a point names.
pub const MAX_MISSES: usize = 20;
/// The guest-side window at the end of each iteration of a collision
/// point (the lower bound: >= 95% of a flow's packets in it on its queue),
/// and the shortest iteration it is taken from whole.
pub const END_WINDOW: Duration = Duration::from_secs(10);
const END_WINDOW_MIN_ITERATION: Duration = Duration::from_secs(15);

/// The end window for iterations of `per_iter`: [`END_WINDOW`], or the
/// second half of a shorter one; and whether it is the half.
pub fn end_window(per_iter: Duration) -> (Duration, bool) {
    if per_iter >= END_WINDOW_MIN_ITERATION {
        (END_WINDOW, false)
    } else {
        (per_iter / 2, true)
    }
}

/// First source address of the RPS workload (`10.0.2.100` onwards).
pub const RPS_SRC_BASE: u8 = 100;

/// One collision workload: `flows` connected UDP flows with receivers
/// spread round-robin over the guest CPUs, `rate` packets per second over
/// all of them, for `duration`; with `iterations` > 1 the flows are replaced
/// by new ones (other guest ports) every `duration / iterations`.
#[derive(Debug, Clone, Serialize)]
pub struct CollisionWorkload {
    pub flows: usize,
    pub rate: u32,
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    pub iterations: u32,
    pub variant: Variant,
    /// Request/response: the generator stamps its datagrams, the guest's
    /// receivers echo each one back, and the device times the round trip
    /// (the Latency column).
    pub latency: bool,
    /// With `latency`: the guest echoes every Nth datagram of a flow.
    pub echo_every: u32,
    /// The device's programming latency during the point (`program_latency`
    /// knob: a filter takes effect this long after its ADD), 0 = at once.
    pub program_latency_ms: u32,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The collision experiment's variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// The flows live the whole point (the patch's one-iteration table).
    One,
    /// The flows are replaced every duration/iterations (its five-iteration table).
    Five,
    /// One iteration at a high per-flow packet rate, with the device
    /// programming filters after a delay as a real NIC does: the regime in
    /// which the old kernel calls `ndo_rx_flow_steer` many times per filter.
    Fast,
}

impl Variant {
    pub fn name(self, iterations: u32) -> String {
        match self {
            Variant::One => "One iteration".into(),
            Variant::Five if iterations == 5 => "Five iterations".into(),
            Variant::Five => format!("{iterations} iterations"),
            Variant::Fast => "High rate".into(),
        }
    }
}

/// The figures of one point (one kernel, one rps_flow_cnt, one variant).
/// Trace-derived counts are what the device did between the start of the
/// workload and the end of its last iteration; `module` and `device` are the
/// deltas of the raw counters over the same window (cross-checks).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CollisionPoint {
    pub kernel: String,
    pub release: String,
    pub rps_flow_cnt: u32,
    /// `None` in points from before the high-rate variant: see [`Self::variant`].
    pub variant: Option<Variant>,
    pub iterations: u32,
    pub flows_per_iteration: usize,
    pub queues: u16,
    pub rate_pps: u32,
    /// The device's programming latency during the point.
    pub program_latency_ms: u32,
    /// Traffic time (the generator ran), summed over the iterations; the
    /// counts also include what happened while the receivers of an
    /// iteration were being set up and torn down.
    pub duration_s: f64,
    /// Steer-C: ndo_rx_flow_steer calls (module `steer_calls`).
    pub steer_calls: u64,
    /// Steer-L: flow-table entries the module's steer lookups compared
    /// (module `steer_walked`; `None` in points from before the counter).
    pub steer_walked: Option<u64>,
    /// Latency: round trips of the stamped datagrams the guest echoed
    /// (`None` without `--latency`, or in points from before it).
    pub latency: Option<Latency>,
    /// Latency's guest-side twin: from each ADD's or REPLACE's trace time
    /// to the first frame the guest got on the queue it names (`None` in
    /// points from before it).
    pub ack_to_first: Option<AckToFirst>,
    /// Add: new filters programmed (device counter `table/adds`).
    pub adds: u64,
    /// Del: filters deleted (device counters `table/deletes/*`), and by reason.
    pub dels: u64,
    pub dels_by_reason: BTreeMap<String, u64>,
    /// Filters moved to another queue in place (device `table/replaces`).
    pub replaces: u64,
    /// ADD ops refused (device `table/rejects/*`), and by reason.
    pub rejects: u64,
    pub rejects_by_reason: BTreeMap<String, u64>,
    /// The same four counted from the trace lines read for the window
    /// (cross-check; the trace is written asynchronously, so a few lines at
    /// the window's edges can land on the wrong side of it).
    pub trace_adds: u64,
    pub trace_dels: u64,
    pub trace_replaces: u64,
    pub trace_rejects: u64,
    /// Distinct flows that got at least one filter.
    pub flows_added: u64,
    /// Flows programmed more than twice (add + replace lines).
    pub thrashing: u64,
    /// Most add/replace lines for a single flow.
    pub max_programs_per_flow: u64,
    /// Flows of the workload whose RSS queue is not their receiver's queue
    /// (those that need a filter; summed over the iterations).
    pub flows_needing_filter: u64,
    /// Live filters in the device table at the end of the window.
    pub live_at_end: u64,
    /// Packets the generator sent and the guest's receivers got.
    pub sent: u64,
    pub received: u64,
    /// Time spent resetting the table before the point.
    pub reset_s: f64,
    /// The host's 1-minute load average at the end of the point
    /// (/proc/loadavg; `None` in points from before it was recorded). Under
    /// TCG a loaded host starves the vCPUs and the Latency column grows on
    /// every kernel: read latencies beside it.
    pub host_load: Option<f64>,
    /// The reset needed the idle backstop (rps_may_expire_flow did not
    /// expire every filter after the table was replaced).
    pub reset_used_idle: bool,
    /// Module counter deltas (steer_calls, steer_dedup, adds, resteers, busy, ...).
    pub module: BTreeMap<String, u64>,
    /// Device counter deltas (table adds, replaces, deletes by reason, rejects).
    pub device: BTreeMap<String, u64>,
    /// Kernel warnings seen during the point (must be empty).
    pub kernel_problems: Vec<String>,
    /// How this kernel turns a flow hash into its RFS slot, as found from
    /// the filters' flow_id and the flows' hashes (`None`: no filter to
    /// compare).
    pub slot_rule: Option<SlotRule>,
    /// Flows needing a filter that kept their slot (no other such flow
    /// into the same queue shares it), how many of them got a filter (an
    /// ADD in the trace), and how many hold their queue at the end: a live
    /// filter to it in the device table and >= 95% of the last window's
    /// packets there, guest-side ([`slots::held_at_end`]).
    pub slots: SlotCounts,
    /// The guest-side window of `slots.own_slot_on_queue`, as measured
    /// between its two snapshots (the last 10 s of each iteration, or its
    /// second half when the iteration is shorter than 15 s); `None` in
    /// points from before that count.
    pub end_window_s: Option<f64>,
    /// The iteration was shorter than 15 s: the window is its second half.
    pub end_window_half: bool,
    /// Why flows that kept their slot did not hold their queue at the end
    /// (the first [`MAX_MISSES`]).
    pub end_misses: Vec<String>,
    /// Packets of flows `vnic_flowhash` had no room for (must be 0).
    pub flowhash_full: u64,
}

impl CollisionPoint {
    /// The variant (older points: by their iteration count).
    pub fn variant(&self) -> Variant {
        self.variant.unwrap_or(if self.iterations > 1 {
            Variant::Five
        } else {
            Variant::One
        })
    }

    /// Add / Del / Replace / Reject from the device counter deltas in
    /// `device` (exact for the window: they are read synchronously at its
    /// start and end), keeping the trace counts in `trace_*`.
    pub fn counts_from_device(&mut self) {
        let get = |k: &str| self.device.get(k).copied().unwrap_or(0);
        let by = |prefix: &str| -> BTreeMap<String, u64> {
            self.device
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), *v)))
                .filter(|(_, v)| *v > 0)
                .collect()
        };
        self.adds = get("adds");
        self.replaces = get("replaces");
        self.dels_by_reason = by("deletes_");
        self.dels = self.dels_by_reason.values().sum();
        self.rejects_by_reason = by("rejects_");
        self.rejects = self.rejects_by_reason.values().sum();
    }
}

fn module_deltas(a: &ModuleCounters, b: &ModuleCounters) -> BTreeMap<String, u64> {
    let names: Vec<String> = b
        .raw
        .keys()
        .filter_map(|k| k.rsplit('/').next().map(str::to_string))
        .collect();
    let mut out = BTreeMap::new();
    for n in names {
        // Counters are monotonic; state values (live, ids, ...) are not and
        // are skipped.
        if matches!(
            n.as_str(),
            "live"
                | "ids"
                | "inflight"
                | "seq_next"
                | "seq_unacked"
                | "generation"
                | "capacity"
                | "buckets"
                | "ways"
                | "max_ops"
                | "latency_us"
                | "max_queue_pairs"
                | "enabled_queue_pairs"
                | "hello_outstanding"
                | "table_full"
                | "rejected_holdoff"
                | "rx_queues"
                | "rmap_queues"
                | "rto_ms"
        ) {
            continue;
        }
        out.insert(n.clone(), b.get(&n).saturating_sub(a.get(&n)));
    }
    out
}

fn device_deltas(a: &Stats, b: &Stats) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let d = |f: fn(&Stats) -> u64| f(b).saturating_sub(f(a));
    out.insert("adds".into(), d(|s| s.table.adds));
    out.insert("replaces".into(), d(|s| s.table.replaces));
    let by_reason: [(&str, super::Counter); 12] = [
        ("deletes_expired", |s| s.table.deletes.expired),
        ("deletes_idle", |s| s.table.deletes.idle),
        ("deletes_replaced", |s| s.table.deletes.replaced),
        ("deletes_flush", |s| s.table.deletes.flush),
        ("deletes_unload", |s| s.table.deletes.unload),
        ("deletes_aged", |s| s.table.deletes.aged),
        ("rejects_table_full", |s| s.table.rejects.table_full),
        ("rejects_bucket_full", |s| s.table.rejects.bucket_full),
        ("rejects_bad_queue", |s| s.table.rejects.bad_queue),
        ("rejects_bad_key", |s| s.table.rejects.bad_key),
        ("rejects_injected_failure", |s| {
            s.table.rejects.injected_failure
        }),
        ("rejects_bad_id", |s| s.table.rejects.bad_id),
    ];
    for (k, f) in by_reason {
        out.insert(k.into(), d(f));
    }
    out
}

/// `vnic_flowhash`'s table of the flows it saw, with their hashes.
pub(super) const FLOWHASH_FLOWS: &str = "/sys/kernel/debug/vnic_flowhash/flows";

impl Session {
    fn release(&self) -> String {
        self.guest.info.kernel.clone()
    }

    /// (Re)loads the test helper `vnic_flowhash.ko` with an empty table.
    pub(super) fn load_flowhash(&mut self, flows: usize) -> Result<()> {
        let _ = self.guest.agent.call_value(
            &Request::ModuleUnload {
                name: "vnic_flowhash".into(),
            },
            Duration::from_secs(30),
        );
        let path = self.module_path.replace("vnic_arfs.ko", "vnic_flowhash.ko");
        let max = (flows + 1024).clamp(8192, 65536);
        self.guest
            .agent
            .call_value(
                &Request::ModuleLoad {
                    path,
                    params: format!("ifname={IFNAME} max_flows={max}"),
                },
                Duration::from_mins(1),
            )
            .map_err(|e| format!("loading vnic_flowhash.ko: {}", e.0))?;
        Ok(())
    }

    /// The flow hashes `vnic_flowhash` recorded, then unloads it.
    pub(super) fn read_flowhash(&mut self) -> Result<(HashMap<FlowKey, u32>, u64)> {
        let text = self.guest.agent.read_file(FLOWHASH_FLOWS)?;
        self.unload_flowhash()?;
        Ok(slots::parse_flowhash(&text)?)
    }

    /// Unloads `vnic_flowhash` (its table goes with it).
    pub(super) fn unload_flowhash(&mut self) -> Result<()> {
        self.guest.agent.call_value(
            &Request::ModuleUnload {
                name: "vnic_flowhash".into(),
            },
            Duration::from_secs(30),
        )?;
        Ok(())
    }

    /// Stop every generator set and the agent's UDP workload.
    fn stop_experiment_workload(&mut self) -> Result<()> {
        self.guest.ctl.gen_stop(None)?;
        self.gen_running = false;
        self.guest
            .agent
            .call_value(&Request::UdpStop, Duration::from_mins(1))
            .map(|_| ())
            .or_else(|e| {
                // Nothing running is fine.
                if e.0.contains("no UDP workload") {
                    Ok(())
                } else {
                    Err(e)
                }
            })
    }

    /// Write rps_flow_cnt on every rx queue (and the global socket table).
    /// The kernel allocates a new rps_dev_flow table on every write, so
    /// every filter of the old one is now "expired" for
    /// rps_may_expire_flow (its slot no longer holds the filter id).
    fn set_flow_cnt(&mut self, flow_cnt: u32) -> Result<()> {
        let entries = self.settings.sock_flow_entries.next_power_of_two();
        self.guest.agent.req::<Value>(Request::Rfs {
            ifname: IFNAME.into(),
            sock_flow_entries: entries,
            flow_cnt,
            rps_cpus: None,
        })?;
        self.settings.flow_cnt = flow_cnt;
        Ok(())
    }

    /// Wait until the device table and the module hold no filter. Returns
    /// whether the idle backstop had to be switched on for a moment.
    fn wait_table_empty(&mut self, timeout: Duration) -> Result<bool> {
        let empty = |s: &mut Session| -> Result<Option<()>> {
            let dev = s.guest.ctl.table()?.live;
            let m = s.module_counters()?;
            Ok((dev == 0 && m.get("live") == 0 && m.get("ids") == 0).then_some(()))
        };
        let t0 = Instant::now();
        let mut used_idle = false;
        loop {
            if empty(self)?.is_some() {
                break;
            }
            if t0.elapsed() > timeout && !used_idle {
                // rps_may_expire_flow keeps a filter whose slot still holds
                // its id and counts as active; with the flows stopped that
                // only happens if a write did not replace the table. The
                // idle backstop deletes what is left.
                self.guest
                    .agent
                    .write_file(&module::expiry_param(), &module::idle_expiry(1))?;
                used_idle = true;
            }
            if t0.elapsed() > timeout * 2 {
                bail!(
                    "the filter table did not empty within {:.0}s after the reset (device live {})",
                    (timeout * 2).as_secs_f64(),
                    self.guest.ctl.table()?.live
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if used_idle {
            self.guest
                .agent
                .write_file(&module::expiry_param(), &module::idle_expiry(0))?;
        }
        Ok(used_idle)
    }
}

/// Frames vnic's generator has sent so far, all sets together.
fn gen_total(s: &mut Session) -> Result<u64> {
    Ok(s.guest.ctl.stats()?.peer.gen_sent)
}

/// Stop generator set `id`, the only one running, and return the frames
/// sent since the generator's total was `before`. A set's own counter
/// leaves with the set, and a worker adds a batch to the total only after
/// sending it, so the total is read once it stands still.
fn gen_stop_counted(s: &mut Session, id: u32, before: u64) -> Result<u64> {
    s.guest.ctl.gen_stop(Some(id))?;
    let others = s.guest.ctl.gen_list()?;
    ensure!(
        others.is_empty(),
        "other generator sets are running, the sent count would include them: {others:?}"
    );
    let mut last = gen_total(s)?;
    wait_for(
        Duration::from_secs(5),
        "the generator's sent count to stand still",
        || {
            std::thread::sleep(Duration::from_millis(50));
            let now = gen_total(s)?;
            let still = now == last;
            last = now;
            Ok(still.then_some(()))
        },
    )?;
    Ok(last.saturating_sub(before))
}

/// Progress lines go to stderr with this prefix.
fn progress(msg: &str) {
    eprintln!("[experiment] {msg}");
}

/// Network up, module loaded and attached: what every collision point
/// needs (fails with the module build error when there is no module).
pub fn prepare_collisions(s: &mut Session) -> Result<()> {
    s.ensure_module()
}

/// One point of the slot-collision sweep: reset the table state, set
/// `flow_cnt`, run the workload, count. The session's guest has the module
/// loaded afterwards and no workload running.
pub fn collision_point(
    s: &mut Session,
    w: &CollisionWorkload,
    flow_cnt: u32,
) -> Result<CollisionPoint> {
    ensure!(w.iterations >= 1, "iterations must be at least 1");
    ensure!(
        w.flows >= 1
            && u16::try_from(usize::from(COLLISION_PORT) + w.flows * w.iterations as usize - 1)
                .is_ok(),
        "{} flows x {} iterations do not fit in the guest's port range",
        w.flows,
        w.iterations
    );
    s.ensure_module()?;
    let label = s.kernel.label.clone();
    s.load_flowhash(w.flows * w.iterations as usize)?;
    let t_reset = Instant::now();
    s.stop_experiment_workload()?;
    s.set_flow_cnt(flow_cnt)?;
    let used_idle = s.wait_table_empty(Duration::from_secs(30))?;
    let reset_s = t_reset.elapsed().as_secs_f64();

    // The reset's DEL lines must be in the file before the mark moves past them.
    std::thread::sleep(TRACE_SETTLE);
    s.guest
        .ctl
        .set("program_latency", format!("{}ms", w.program_latency_ms))?;
    let m0 = s.module_counters()?;
    let d0 = s.guest.ctl.stats()?;
    s.trace_since_mark()?;
    let per_iter = w.duration / w.iterations;
    let mut sent = 0u64;
    let mut received = 0u64;
    let mut needing = 0u64;
    let mut traffic = Duration::ZERO;
    let mut iteration_flows = Vec::new();
    let mut iteration_ends = Vec::new();
    let (mut end_window_s, mut end_window_half) = (None, false);
    let mut filters = Vec::new();
    let mut paths: HashMap<FlowKey, Vec<Seg>> = HashMap::new();
    for k in 0..w.iterations {
        let base = COLLISION_PORT + (k as usize * w.flows) as u16;
        let flows = s.flows_at(base, w.flows);
        needing += flows.iter().filter(|f| f.needs_filter()).count() as u64;
        iteration_flows.push(flows.clone());
        s.udp_start_echo(&flows, if w.latency { w.echo_every.max(1) } else { 0 })?;
        let spec = FlowSpec::new()
            .stamp(w.latency)
            .flows(w.flows as u32)
            .src(GEN_IP.to_string())
            .sport(GEN_PORT.to_string())
            .dst(GUEST_IP.to_string())
            .dport(format!("{}-{}", base, base + w.flows as u16 - 1))
            .count(0)
            .rate(u64::from(w.rate))
            .size(128);
        let before = gen_total(s)?;
        let id = s.guest.ctl.gen_start(&spec)?;
        s.gen_running = true;
        if w.iterations > 1 {
            progress(&format!(
                "{label} rps_flow_cnt={flow_cnt}: iteration {}/{} (guest ports {base}..{})",
                k + 1,
                w.iterations,
                base + w.flows as u16 - 1
            ));
        }
        // Each iteration gets its full share of traffic time; setting up
        // hundreds of receivers takes seconds under TCG and is not counted.
        // The guest's per-queue counts are read at the start of the end
        // window and at the end, the device's live table at the end (the
        // traffic time includes the reads).
        let t_it = Instant::now();
        let (win, half) = end_window(per_iter);
        std::thread::sleep(per_iter.saturating_sub(win));
        let napi: RxQueueNapi = s.guest.agent.req(Request::RxQueueNapi {
            ifname: IFNAME.into(),
        })?;
        let a0 = s.udp_stats()?;
        // The whole window after the first snapshot (reading it under TCG
        // takes a moment): the point runs that much longer.
        let t_win = Instant::now();
        std::thread::sleep(win);
        let a1 = s.udp_stats()?;
        let qmap = napi_queues(&napi);
        for f in &flows {
            let Some(c) = a1.flows.iter().find(|c| c.local_port == f.local_port) else {
                continue;
            };
            let path = c.path.iter().map(|p| Seg {
                q: qmap.get(&p.napi).copied().unwrap_or(usize::MAX),
                first: p.first,
                last: p.last,
                n: p.n,
            });
            paths.insert(f.key, path.collect());
        }
        let live = s.device_filters()?;
        end_window_s = Some(t_win.elapsed().as_secs_f64());
        end_window_half = half;
        traffic += t_it.elapsed();
        iteration_ends.push(at_end(&flows, &napi, &a0, &a1, &live)?);
        // The slots the kernel gave this iteration's filters.
        filters.extend(
            s.module_filters()?
                .into_values()
                .map(|f| (f.flow, f.flow_id)),
        );
        // The generator stops for good before the receivers close, so
        // every frame sent had its chance to arrive.
        sent += gen_stop_counted(s, id, before)?;
        let st: UdpStats = s
            .guest
            .agent
            .call(&Request::UdpStop, Duration::from_mins(1))?;
        received += st.flows.iter().map(|f| f.packets).sum::<u64>();
    }
    let duration_s = traffic.as_secs_f64();
    s.guest.ctl.set("program_latency", 0)?;
    let m1 = s.module_counters()?;
    let d1 = s.guest.ctl.stats()?;
    // vnic writes the trace from its own thread and flushes it when idle
    // for 50 ms: give the window's last lines time to reach the file.
    std::thread::sleep(TRACE_SETTLE);
    let trace = s.trace_since_mark()?;
    let live_at_end = s.guest.ctl.table()?.live;
    s.gen_running = false;
    let (hashes, flowhash_full) = s.read_flowhash()?;

    let mut p = CollisionPoint {
        kernel: label,
        release: s.release(),
        rps_flow_cnt: flow_cnt,
        variant: Some(w.variant),
        iterations: w.iterations,
        flows_per_iteration: w.flows,
        queues: s.settings.queues,
        rate_pps: w.rate,
        program_latency_ms: w.program_latency_ms,
        duration_s,
        steer_calls: m1.get("steer_calls").saturating_sub(m0.get("steer_calls")),
        steer_walked: Some(
            m1.get("steer_walked")
                .saturating_sub(m0.get("steer_walked")),
        ),
        flows_needing_filter: needing,
        live_at_end,
        sent,
        received,
        reset_s,
        host_load: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse().ok()),
        reset_used_idle: used_idle,
        module: module_deltas(&m0, &m1),
        device: device_deltas(&d0, &d1),
        latency: if w.latency {
            Some(Latency::window(&d0.peer.rtt, &d1.peer.rtt))
        } else {
            None
        },
        ack_to_first: Some(AckToFirst::of(&trace, &paths)),
        ..CollisionPoint::default()
    };
    let mut programs: HashMap<FlowKey, u64> = HashMap::new();
    let mut added: std::collections::HashSet<FlowKey> = std::collections::HashSet::new();
    for r in &trace {
        match r.event {
            EventKind::Add => {
                p.trace_adds += 1;
                if let Some(f) = r.flow {
                    *programs.entry(f).or_default() += 1;
                    added.insert(f);
                }
            }
            EventKind::Replace => {
                p.trace_replaces += 1;
                if let Some(f) = r.flow {
                    *programs.entry(f).or_default() += 1;
                }
            }
            EventKind::Del => p.trace_dels += 1,
            EventKind::Reject => p.trace_rejects += 1,
            _ => {}
        }
    }
    p.counts_from_device();
    p.flows_added = added.len() as u64;
    p.thrashing = programs.values().filter(|&&n| n > 2).count() as u64;
    p.max_programs_per_flow = programs.values().copied().max().unwrap_or(0);
    p.kernel_problems = s.guest.kernel_failures()?;
    let log = slots::table_log(flow_cnt);
    p.flowhash_full = flowhash_full;
    p.slot_rule = slots::infer_rule(&filters, &hashes, log)?;
    p.end_window_s = end_window_s;
    p.end_window_half = end_window_half;
    if let Some(rule) = p.slot_rule {
        for (flows, end) in iteration_flows.iter().zip(&iteration_ends) {
            let (c, misses) = slots::slot_counts(flows, &hashes, &added, end, rule, log);
            p.slots += c;
            let room = MAX_MISSES.saturating_sub(p.end_misses.len());
            p.end_misses.extend(misses.into_iter().take(room));
        }
    }
    Ok(p)
}

/// The end of an iteration as the lower bound reads it: each flow's live
/// filter queue (device table `live`) and its packets by rx queue between
/// the agent's snapshots `a0` and `a1` (NAPI ids mapped through `napi`).
fn at_end<'a>(
    flows: &[Flow],
    napi: &RxQueueNapi,
    a0: &'a UdpStats,
    a1: &'a UdpStats,
    live: &BTreeMap<FlowKey, (u64, usize, u64)>,
) -> Result<AtEnd> {
    let map = napi_queues(napi);
    let mut end = AtEnd::default();
    for f in flows {
        let find = |st: &'a UdpStats| -> Result<&'a FlowCounters> {
            Ok(st
                .flows
                .iter()
                .find(|c| c.local_port == f.local_port)
                .ok_or_else(|| {
                    format!("the agent has no receiver for guest port {}", f.local_port)
                })?)
        };
        let (c0, c1) = (find(a0)?, find(a1)?);
        end.last.insert(
            f.key,
            queue_delta(
                &c1.by_napi,
                &c0.by_napi,
                c1.napi_unknown.saturating_sub(c0.napi_unknown),
                &map,
            ),
        );
        if let Some(&(_, q, _)) = live.get(&f.key) {
            end.live_q.insert(f.key, q);
        }
    }
    Ok(end)
}

/// "ACK to first steered frame" as the guest saw it, over a point's ADD
/// and REPLACE lines (`effect::ack_to_first` on each flow's path; a line
/// the path does not cover is not counted).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct AckToFirst {
    /// Lines measured, and those of the point's flows not measured.
    pub n: u64,
    pub unmeasured: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl AckToFirst {
    /// Over the lines of `trace` that install or move a filter of one of
    /// `paths`' flows: (flow, its path with queues).
    pub(crate) fn of(trace: &[arfs::TraceRecord], paths: &HashMap<FlowKey, Vec<Seg>>) -> Self {
        let mut v = Vec::new();
        let mut unmeasured = 0;
        for r in trace
            .iter()
            .filter(|r| matches!(r.event, EventKind::Add | EventKind::Replace))
        {
            let (Some(k), Some(q)) = (r.flow, r.rxq) else {
                continue;
            };
            let Some(path) = paths.get(&k) else { continue };
            match super::effect::ack_to_first(path, usize::from(q), r.ts_ns) {
                Some(d) => v.push(d as f64 / 1e6),
                None => unmeasured += 1,
            }
        }
        v.sort_by(f64::total_cmp);
        let pct = |p: usize| {
            v.get(v.len().saturating_sub(1) * p / 100)
                .copied()
                .unwrap_or(0.0)
        };
        AckToFirst {
            n: v.len() as u64,
            unmeasured,
            p50_ms: pct(50),
            p99_ms: pct(99),
            max_ms: pct(100),
        }
    }
}

/// Round-trip times over a window, from two snapshots of the device's
/// `peer.rtt` histogram (`ctl stats`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Latency {
    /// Round trips timed in the window.
    pub replies: u64,
    pub mean_us: f64,
    /// Percentiles read from the histogram, interpolated inside their
    /// bucket (buckets are 1/8 of a power of two wide).
    pub p50_us: f64,
    pub p99_us: f64,
    /// Echoes with an impossible stamp (from the future, or older than 60 s).
    pub bad: u64,
}

impl Latency {
    /// The window between snapshots `a` and `b`.
    pub fn window(a: &RttStats, b: &RttStats) -> Latency {
        let buckets = |v: &RttStats| -> BTreeMap<u64, (u64, u64)> {
            v.buckets
                .iter()
                .map(|e| (e.lo_ns, (e.hi_ns, e.n)))
                .collect()
        };
        let n = |v: &RttStats, k: fn(&RttStats) -> u64| k(v);
        let before = buckets(a);
        let delta: Vec<(u64, u64, u64)> = buckets(b)
            .into_iter()
            .filter_map(|(lo, (hi, nb))| {
                let d = nb.saturating_sub(before.get(&lo).map_or(0, |x| x.1));
                (d > 0).then_some((lo, hi, d))
            })
            .collect();
        let replies = n(b, |r| r.replies).saturating_sub(n(a, |r| r.replies));
        let sum_ns = n(b, |r| r.sum_ns).saturating_sub(n(a, |r| r.sum_ns));
        let total: u64 = delta.iter().map(|x| x.2).sum();
        let pct = |q: f64| -> f64 {
            if total == 0 {
                return 0.0;
            }
            let want = q * total as f64;
            let mut seen = 0u64;
            for &(lo, hi, c) in &delta {
                if (seen + c) as f64 >= want {
                    let frac = ((want - seen as f64) / c as f64).clamp(0.0, 1.0);
                    return (lo as f64 + frac * (hi - lo) as f64) / 1e3;
                }
                seen += c;
            }
            delta.last().map_or(0.0, |x| x.1 as f64 / 1e3)
        };
        Latency {
            replies,
            mean_us: if replies == 0 {
                0.0
            } else {
                sum_ns as f64 / replies as f64 / 1e3
            },
            p50_us: pct(0.5),
            p99_us: pct(0.99),
            bad: n(b, |r| r.bad).saturating_sub(n(a, |r| r.bad)),
        }
    }
}

/// Per-CPU figures of one RPS phase (deltas over the phase).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RpsCpu {
    pub cpu: usize,
    /// softnet_stat column 0: packets processed by this CPU's backlog/NAPI.
    pub processed: u64,
    /// column 1: dropped (backlog full).
    pub dropped: u64,
    /// column 2: time squeeze (net_rx_action ran out of budget or time).
    pub time_squeeze: u64,
    /// column 9: RPS IPIs this CPU received (received_rps).
    pub rps: u64,
    /// NET_RX softirqs run on this CPU (/proc/softirqs).
    pub net_rx: u64,
}

/// One RPS phase: one traffic mix for a fixed time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RpsPhase {
    pub name: String,
    pub kernel: String,
    pub release: String,
    /// Distinct source addresses of the traffic (one flow each).
    pub sources: u32,
    pub rate_pps: u32,
    pub duration_s: f64,
    pub rps_cpus: String,
    pub sent: u64,
    /// Packets the guest's socket read.
    pub received: u64,
    /// Device-side drops on rx queue 0 (no guest buffers).
    pub device_rx_drops: u64,
    pub cpus: Vec<RpsCpu>,
    pub kernel_problems: Vec<String>,
    /// With RPS on: packets each CPU should have processed (indexed like
    /// `cpus`), from every flow's hash and packet count as the guest
    /// recorded them (`vnic_flowhash.ko`) and the rps_map
    /// ([`slots::rps_cpu`]). Empty with RPS off.
    #[serde(default)]
    pub predicted: Vec<u64>,
    /// Why there is no prediction with RPS on (then the check fails).
    #[serde(default)]
    pub prediction_error: Option<String>,
}

/// Share of all processed packets (softnet_stat column 0) each CPU took.
pub fn rps_shares(p: &RpsPhase) -> Vec<f64> {
    let total: u64 = p.cpus.iter().map(|c| c.processed).sum();
    p.cpus
        .iter()
        .map(|c| {
            if total == 0 {
                0.0
            } else {
                c.processed as f64 / total as f64
            }
        })
        .collect()
}

/// `[61% 39%]`.
pub fn fmt_shares(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{:.0}%", 100.0 * x)).collect();
    format!("[{}]", parts.join(" "))
}

/// RPS IPIs received over all CPUs (softnet_stat column 9).
pub fn rps_ipis(p: &RpsPhase) -> u64 {
    p.cpus.iter().map(|c| c.rps).sum()
}

/// The pattern of the background material's RPS measurements (the 2012
/// overflow patch's softnet_stat tables), as verdicts: each entry is
/// (holds, what it says). `off`: RPS off, many flows (optional);
/// `balanced`: RPS on, many flows; `heavy`: RPS on, one flow.
///
/// - RPS off: the CPU that takes the queue's interrupt processes >= 95%,
///   and no RPS IPI is received;
/// - RPS on, many flows: every CPU processes what the flows' hashes and
///   the rps_map predict ([`rps_prediction_holds`]; the hashes are random
///   per boot, so a "fair share" bar failed about once in 250 runs of 40
///   flows on 4 CPUs for no defect), and RPS IPIs are received;
/// - RPS on, one flow: one CPU processes >= 95% (the flow hash picks it),
///   the others next to nothing.
pub fn rps_pattern(
    off: Option<&RpsPhase>,
    balanced: &RpsPhase,
    heavy: &RpsPhase,
) -> Vec<(bool, String)> {
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let mut out = Vec::new();
    if let Some(off) = off {
        let s = rps_shares(off);
        out.push((
            max(&s) >= 0.95,
            format!(
                "RPS off: the interrupt CPU processes >= 95% (shares by CPU {})",
                fmt_shares(&s)
            ),
        ));
        out.push((
            rps_ipis(off) == 0,
            format!("RPS off: no RPS IPI ({} received)", rps_ipis(off)),
        ));
    }
    let (ok, what) = rps_prediction_holds(balanced);
    out.push((ok, what));
    out.push((
        rps_ipis(balanced) > 0,
        format!(
            "RPS on, {} flows: RPS IPIs received ({})",
            balanced.sources,
            rps_ipis(balanced)
        ),
    ));
    let s = rps_shares(heavy);
    out.push((
        max(&s) >= 0.95,
        format!(
            "RPS on, one flow: one CPU processes >= 95% (shares {})",
            fmt_shares(&s)
        ),
    ));
    out
}

/// Packets a CPU may process beyond or short of its prediction: 1% of the
/// phase's packets plus 50 (the ARP, ping and neighbour frames the
/// prediction does not include).
fn rps_slack(total: u64) -> u64 {
    total / 100 + 50
}

/// Whether each CPU processed what the flow hashes and the rps_map predict
/// (no "fair share": a placement of hashes that loads one CPU lightly is
/// predicted, not failed), and the line saying so.
pub fn rps_prediction_holds(p: &RpsPhase) -> (bool, String) {
    let total: u64 = p.cpus.iter().map(|c| c.processed).sum();
    let slack = rps_slack(total);
    let observed: Vec<u64> = p.cpus.iter().map(|c| c.processed).collect();
    if let Some(e) = &p.prediction_error {
        return (
            false,
            format!("RPS on, {} flows: no prediction ({e})", p.sources),
        );
    }
    let predicted_total: u64 = p.predicted.iter().sum();
    let ok = p.predicted.len() == observed.len()
        && predicted_total > 0
        && predicted_total + slack >= total
        && observed
            .iter()
            .zip(&p.predicted)
            .all(|(&o, &e)| o.abs_diff(e) <= slack);
    (
        ok,
        format!(
            "RPS on, {} flows: each CPU processes what the flow hashes and the rps_map predict, within {slack} packets (processed {observed:?}, predicted {:?} of {predicted_total} hashed packets)",
            p.sources, p.predicted
        ),
    )
}

fn cpu_counts(s: &mut Session) -> Result<(Vec<procfs::Softnet>, Vec<u64>)> {
    let sn = s.guest.agent.read_file("/proc/net/softnet_stat")?;
    let si = s.guest.agent.read_file("/proc/softirqs")?;
    let softnet = procfs::parse_softnet(&sn);
    let net_rx = procfs::parse_softirqs(&si)
        .remove("NET_RX")
        .unwrap_or_default();
    ensure!(!softnet.is_empty(), "no rows in /proc/net/softnet_stat");
    Ok((softnet, net_rx))
}

/// Set up plain RPS on every rx queue (the session has one): `rps_cpus` =
/// every guest CPU, RFS off (rps_flow_cnt 0, rps_sock_flow_entries 0), the
/// module not loaded. Returns the mask written.
/// Sets rx-0's `rps_cpus` (hex mask; "0" turns RPS off).
pub fn rps_set_mask(s: &mut Session, mask: &str) -> Result<()> {
    s.guest.agent.req::<Value>(Request::Rfs {
        ifname: IFNAME.into(),
        sock_flow_entries: 0,
        flow_cnt: 0,
        rps_cpus: Some(mask.to_string()),
    })?;
    Ok(())
}

pub fn rps_setup(s: &mut Session) -> Result<String> {
    s.ensure_net()?;
    ensure!(
        !s.module_loaded,
        "the RPS experiment runs without the aRFS module"
    );
    let cpus = u32::from(s.settings.cpus);
    ensure!((1..=32).contains(&cpus), "1..32 CPUs supported, got {cpus}");
    let mask = format!("{:x}", (1u64 << cpus) - 1);
    s.guest.agent.req::<Value>(Request::Rfs {
        ifname: IFNAME.into(),
        sock_flow_entries: 0,
        flow_cnt: 0,
        rps_cpus: Some(mask.clone()),
    })?;
    let got = s
        .guest
        .agent
        .read_file(&format!("/sys/class/net/{IFNAME}/queues/rx-0/rps_cpus"))?;
    let got_v = u64::from_str_radix(got.trim().replace(',', "").as_str(), 16).unwrap_or(0);
    ensure!(
        got_v == (1u64 << cpus) - 1,
        "rx-0/rps_cpus reads {:?} after writing {mask}",
        got.trim()
    );
    Ok(mask)
}

/// One RPS phase: `sources` source addresses (one UDP flow each, all to the
/// same guest port) at `rate` packets per second for `duration`.
pub fn rps_phase(
    s: &mut Session,
    name: &str,
    sources: u32,
    rate: u32,
    duration: Duration,
    mask: &str,
) -> Result<RpsPhase> {
    ensure!(
        (1..=150).contains(&sources),
        "sources must be in 1..=150 (10.0.2.100 onwards), got {sources}"
    );
    s.stop_experiment_workload()?;
    // With RPS on, the guest records every flow's hash and packets, from
    // which each CPU's share is predicted.
    let rps_map = slots::rps_map_of(mask).filter(|m| !m.is_empty());
    let mut prediction_error = None;
    if rps_map.is_some() {
        if let Err(e) = s.load_flowhash(sources as usize) {
            prediction_error = Some(e.0);
        }
    }
    // One unconnected socket receives from every source; its reader sits on
    // the last CPU.
    let last = usize::from(s.settings.cpus) - 1;
    s.guest.agent.call_value(
        &Request::UdpStart(UdpSpec {
            peer: GEN_IP.to_string(),
            flows: vec![UdpFlowSpec {
                local_port: RPS_PORT,
                peer_port: GEN_PORT,
                cpu: last,
                peer: None,
            }],
            connect: false,
            echo: false,
            echo_every: 0,
        }),
        Duration::from_mins(1),
    )?;
    let src_lo = std::net::Ipv4Addr::new(10, 0, 2, RPS_SRC_BASE);
    let src_hi = std::net::Ipv4Addr::new(10, 0, 2, RPS_SRC_BASE + (sources - 1) as u8);
    let (sn0, si0) = cpu_counts(s)?;
    let st0 = s.guest.ctl.stats()?;
    let before = st0.peer.gen_sent;
    let start = Instant::now();
    let id = s.guest.ctl.gen_start(
        &FlowSpec::new()
            .flows(sources)
            .src(format!("{src_lo}-{src_hi}"))
            .sport(GEN_PORT.to_string())
            .dst(GUEST_IP.to_string())
            .dport(RPS_PORT.to_string())
            .count(0)
            .rate(u64::from(rate))
            .size(128),
    )?;
    s.gen_running = true;
    std::thread::sleep(duration);
    let duration_s = start.elapsed().as_secs_f64();
    let sent = gen_stop_counted(s, id, before)?;
    // Let the guest drain its rings and backlogs before the "after" read.
    let agent = &mut s.guest.agent;
    let mut last_n = u64::MAX;
    let _ = wait_for(
        Duration::from_secs(15),
        "the guest to drain its receive path",
        || {
            let st: UdpStats = agent.req(Request::UdpStats)?;
            let n: u64 = st.flows.iter().map(|f| f.packets).sum();
            let done = n == last_n;
            last_n = n;
            std::thread::sleep(Duration::from_millis(500));
            Ok(done.then_some(()))
        },
    );
    let (sn1, si1) = cpu_counts(s)?;
    let st1 = s.guest.ctl.stats()?;
    let mut predicted = Vec::new();
    if let (Some(map), None) = (&rps_map, &prediction_error) {
        let text = s.guest.agent.read_file(FLOWHASH_FLOWS);
        let _ = s.guest.agent.call_value(
            &Request::ModuleUnload {
                name: "vnic_flowhash".into(),
            },
            Duration::from_secs(30),
        );
        match text
            .map_err(|e| e.0)
            .and_then(|t| slots::parse_flowhash_packets(&t).map_err(|e| e.to_string()))
        {
            Ok(flows) => {
                predicted = vec![0u64; sn1.len()];
                for (_, hash, packets) in flows {
                    match slots::rps_cpu(hash, map).and_then(|c| predicted.get_mut(c)) {
                        Some(p) => *p += packets,
                        None => {
                            prediction_error =
                                Some(format!("rps_map {map:?} names a CPU with no softnet row"));
                        }
                    }
                }
            }
            Err(e) => prediction_error = Some(e),
        }
    }
    let stop: UdpStats = s
        .guest
        .agent
        .call(&Request::UdpStop, Duration::from_mins(1))?;
    s.gen_running = false;
    let mut cpus = Vec::new();
    for (i, (a, b)) in sn0.iter().zip(&sn1).enumerate() {
        let cpu = b.cpu.map_or(i, |c| c as usize);
        cpus.push(RpsCpu {
            cpu,
            processed: b.processed.wrapping_sub(a.processed) & 0xffff_ffff,
            dropped: b.dropped.wrapping_sub(a.dropped) & 0xffff_ffff,
            time_squeeze: b.time_squeeze.wrapping_sub(a.time_squeeze) & 0xffff_ffff,
            rps: b.received_rps.wrapping_sub(a.received_rps) & 0xffff_ffff,
            net_rx: si1
                .get(cpu)
                .copied()
                .unwrap_or(0)
                .saturating_sub(si0.get(cpu).copied().unwrap_or(0)),
        });
    }
    let drops = |v: &Stats| v.queues[0].rx_drops;
    Ok(RpsPhase {
        name: name.to_string(),
        kernel: s.kernel.label.clone(),
        release: s.release(),
        sources,
        rate_pps: rate,
        duration_s,
        rps_cpus: mask.to_string(),
        sent,
        received: stop.flows.iter().map(|f| f.packets).sum(),
        device_rx_drops: drops(&st1).saturating_sub(drops(&st0)),
        cpus,
        kernel_problems: s.guest.kernel_failures()?,
        predicted,
        prediction_error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The window is the difference of two snapshots, bucket by bucket;
    /// the percentiles come from the window's buckets only.
    #[test]
    fn latency_window_subtracts_snapshots() {
        let rtt = |v: serde_json::Value| -> RttStats { serde_json::from_value(v).unwrap() };
        let before = rtt(json!({"replies": 100, "sum_ns": 100_000_000, "bad": 1,
                       "buckets": [[1_000_000, 1_048_576, 100]]}));
        // 100 more at ~1 ms before, then 98 at ~100 us and 2 at ~10 ms.
        let after = rtt(
            json!({"replies": 200, "sum_ns": 100_000_000 + 98 * 100_000 + 2 * 10_000_000,
                       "bad": 3,
                       "buckets": [[98_304, 102_400, 98],
                                   [1_000_000, 1_048_576, 100],
                                   [9_961_472, 10_485_760, 2]]}),
        );
        let w = Latency::window(&before, &after);
        assert_eq!(w.replies, 100);
        assert_eq!(w.bad, 2);
        assert!((w.mean_us - 298.0).abs() < 1e-9, "{w:?}");
        assert!((98.3..=102.4).contains(&w.p50_us), "{w:?}");
        // The 99th of 100 falls in the 10 ms bucket.
        assert!((9961.0..=10486.0).contains(&w.p99_us), "{w:?}");
        // Nothing in the window: zeros, not NaN.
        let none = Latency::window(&after, &after);
        assert_eq!((none.replies, none.mean_us, none.p99_us), (0, 0.0, 0.0));
        // Malformed snapshots are no `RttStats` (the stats request fails);
        // empty ones give zeros.
        assert!(serde_json::from_value::<RttStats>(json!({"buckets": [["x"]]})).is_err());
        assert!(serde_json::from_value::<RttStats>(json!(null)).is_err());
        let empty = Latency::window(&RttStats::default(), &RttStats::default());
        assert_eq!(empty, Latency::default());
    }
}
