//! Scenarios of the stress group (issue 5, items 6, 7, 9, 10):
//!
//! - `hostile-mgmt`: the guest sends malformed management frames from an
//!   AF_PACKET socket; the device counts each by reason, answers exactly
//!   what PROTOCOL.md says, and the module's session and steering go on.
//! - `device-restart`: `vnic serve` is killed and restarted under a running
//!   guest; QEMU reconnects, the module replays its table, steering resumes.
//! - `tcp-tap`: vnic's tap peer in a host network namespace; a host TCP
//!   client opens 64 connections to the agent's server: TCP steers like UDP.
//! - `unload-reload`: on the debug kernel (KASAN, lockdep, kmemleak), 20
//!   module unload/reload cycles under traffic; the table is flushed on
//!   every unload and the kernel reports nothing.
//!
//! - `debugfs-65k`: on the debug kernel, 65,535 filters dumped through
//!   debugfs under traffic.
//!
//! - `spoof-tap`: forged management frames from the tap peer's side (in
//!   802.1ad, QinQ, VID-0 or 0x9100 tags, bare, to another station): the
//!   device drops and counts each, the module never sees one.
//!
//! `hostile-mgmt` is in `hostile.rs`, `tcp-tap` in `tap.rs`, `debugfs-65k`
//! and `lock-holds` in `bigtable.rs`, `spoof-tap` in `spoof.rs`; this file has
//! the group's helpers, `device-restart` and `unload-reload`.

use super::faults::{table_of, DevTable};
use super::{BootKind, Checks, Session, GEN_IP, IFNAME};
use crate::bail;
use crate::harness::{wait_for, Context, Result};
use crate::proto::{Kmsg, PingResult, ProbedUnload, Request};
use arfs::proto::FrameError;
use arfs::{EventKind, TraceRecord};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use vnic_ctl_proto::Stats;

pub(super) mod bigtable;
pub(super) mod hostile;
pub(super) mod spoof;
pub(super) mod tap;

pub(super) use tap::TapNet;

// ---- shared helpers --------------------------------------------------------

/// Load the test helper `vnic_flowgen.ko`: `count` synthetic steer calls
/// on eth0 (aRFS/kmod/tests), made while it loads.
fn flowgen_load(s: &mut Session, count: u32, timeout: Duration) -> Result<()> {
    let path = s.module_path.replace("vnic_arfs.ko", "vnic_flowgen.ko");
    s.guest
        .agent
        .call_value(
            &Request::ModuleLoad {
                path,
                params: format!("ifname={IFNAME} count={count}"),
            },
            timeout,
        )
        .ctx("loading vnic_flowgen.ko")?;
    Ok(())
}

/// Unload `vnic_flowgen.ko` (best effort: its filters stay the module's).
fn flowgen_unload(s: &mut Session) {
    let _ = s.guest.agent.call_value(
        &Request::ModuleUnload {
            name: "vnic_flowgen".into(),
        },
        Duration::from_secs(30),
    );
}

fn ping(s: &mut Session, count: u32) -> Result<PingResult> {
    s.guest.agent.call(
        &Request::Ping {
            addr: GEN_IP.to_string(),
            count,
            timeout_ms: 3000,
        },
        Duration::from_secs(30),
    )
}

/// Stop the workload: generator sets and receivers gone, no delivery mark.
fn stop_workload(s: &mut Session) -> Result<()> {
    if s.gen_running {
        s.guest.ctl.gen_stop(None)?;
        s.gen_running = false;
    }
    s.gen_sets.clear();
    if !s.flows.is_empty() {
        s.guest
            .agent
            .call_value(&Request::UdpStop, Duration::from_secs(30))?;
        s.flows.clear();
    }
    s.delivery_mark = None;
    Ok(())
}

/// Stop the workload and unload the module (the table must then be empty).
fn drop_module(s: &mut Session) -> Result<()> {
    stop_workload(s)?;
    if s.module_loaded {
        s.rmmod(Duration::from_mins(1))?;
    }
    s.wait_device_empty("the device table to empty")
}

/// The device table and the module's still differ after a wait (a
/// verdict: the scenario records it).
#[derive(Debug, thiserror::Error)]
#[error(
    "device table ({device} entries) != module table ({module} active, {in_flight} in flight) \
     after {:.0}s; only in module: {only_in_module:?}; only on device: {only_on_device:?}",
    .waited.as_secs_f64()
)]
pub(in crate::scenarios) struct TablesDiffer {
    device: usize,
    module: usize,
    in_flight: usize,
    waited: Duration,
    /// A few entries (`ID qRXQ FLOW`) of each side the other lacks.
    only_in_module: Vec<String>,
    only_on_device: Vec<String>,
}

/// Wait until the device table equals the module's, entry for entry, with
/// nothing in flight. Returns the number of entries, or the differences.
pub(in crate::scenarios) fn tables_agree(
    s: &mut Session,
    timeout: Duration,
) -> Result<std::result::Result<usize, TablesDiffer>> {
    let start = Instant::now();
    loop {
        let (m, unsettled) = s.module_table()?;
        let d = table_of(&s.guest.ctl.table()?)?;
        if unsettled == 0 && m == d {
            return Ok(Ok(d.len()));
        }
        if start.elapsed() >= timeout {
            let only = |a: &DevTable, b: &DevTable| -> Vec<String> {
                a.iter()
                    .filter(|(id, e)| b.get(id) != Some(e))
                    .take(4)
                    .map(|(id, (flow, rxq))| format!("{id} q{rxq} {flow}"))
                    .collect()
            };
            return Ok(Err(TablesDiffer {
                device: d.len(),
                module: m.len(),
                in_flight: unsettled,
                waited: timeout,
                only_in_module: only(&m, &d),
                only_on_device: only(&d, &m),
            }));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The device's count of malformed management frames of one reason.
fn mgmt_bad(stats: &Stats, reason: FrameError) -> u64 {
    let b = &stats.mgmt.frames_bad;
    match reason {
        FrameError::TooShort => b.too_short,
        FrameError::BadMagic => b.bad_magic,
        FrameError::BadVersion => b.bad_version,
        FrameError::UnknownType => b.unknown_type,
        FrameError::WrongDirection => b.wrong_direction,
        FrameError::BadLength => b.bad_length,
        FrameError::TooManyOps => b.too_many_ops,
        FrameError::BadReason => b.bad_reason,
        FrameError::ReservedNonzero => b.reserved_nonzero,
        FrameError::BadCount => b.bad_count,
    }
}

// ---- device-restart ------------------------------------------------------------

#[allow(clippy::many_single_char_names)] // s session, c checks, d delta, p ping, w window: as in mod.rs
pub(super) fn device_restart(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.setup_steering()?;
    // Nothing in flight, module and device in agreement, before the kill.
    let before = match tables_agree(s, Duration::from_secs(15))? {
        Ok(n) => n,
        Err(e) => bail!("before the restart: {e}"),
    };
    let (m_before, _) = s.module_table()?;
    let m0 = s.module_counters()?;
    // Delivery up to the kill: everything since the workload started (or
    // its last quiet point) arrived intact, exactly; the generator then
    // resumes, so that the daemon dies under traffic.
    let pre = if s.gen_running && s.delivery_mark.is_some() {
        s.delivery_window(c, true)?
    } else {
        "delivery: no workload running before the kill".into()
    };
    let at_kill = s.udp_stats()?;
    // A second of traffic the kill then cuts into.
    std::thread::sleep(Duration::from_secs(1));
    // The guest's uptime at the kill: a reboot during the restart would
    // restart it (comparing with the uptime at boot could not tell).
    let up0 = s
        .guest
        .agent
        .req::<crate::proto::Info>(Request::Hello)?
        .uptime_s;
    // The killed daemon's last word, read just before the kill: teardown
    // only ever sees the new daemon, so this is the one look at the old
    // one's rings (no bad chain, no stopped ring, none of it missing).
    let st0 = s.guest.ctl.stats()?;
    let gen0 = st0.generation;
    let live0 = st0.table.live;
    for p in super::session::ring_problems(&st0, s.settings.queues) {
        c.check(false, || format!("the killed daemon, before the kill: {p}"));
    }
    let t0 = Instant::now();
    s.guest.restart_vnic(Duration::from_secs(1))?;
    // The old daemon's flow sets and trace are gone with it.
    s.gen_running = false;
    s.gen_sets.clear();
    s.trace_mark = 0;
    let ctl = &mut s.guest.ctl;
    let st = wait_for(
        Duration::from_mins(1),
        "QEMU to reconnect and enable every queue pair",
        || {
            let st = ctl.stats()?;
            Ok((st.connected && st.enabled_pairs == s.pairs).then_some(st))
        },
    )?;
    let reconnect = t0.elapsed();
    let gen1 = st.generation;
    c.check(gen1 != gen0, || format!("generation unchanged ({gen0:#x})"));
    // The link comes back.
    let mut p = ping(s, 3)?;
    for _ in 0..5 {
        if p.received == p.sent {
            break;
        }
        p = ping(s, 3)?;
    }
    c.check(p.received == p.sent, || {
        format!("ping after the restart: {}/{}", p.received, p.sent)
    });
    // The module sees the new generation and replays its table.
    let mut last = None;
    let seen = wait_for(
        Duration::from_secs(30),
        "the module to take the new generation and replay",
        || {
            let m = s.module_counters()?;
            let ok = m.get("generation_changes") > m0.get("generation_changes")
                && m.get("replays") > m0.get("replays")
                && m.get("generation") == u64::from(gen1)
                && m.state(IFNAME) == Some("active");
            let r = ok.then(|| m.clone());
            last = Some(m);
            Ok(r)
        },
    );
    let m1 = match seen {
        Ok(m) => m,
        Err(e) => {
            let m = last.unwrap_or_default();
            c.check(false, || {
                format!(
                    "{e}: module generation {} (device {gen1}), generation_changes {}, replays {}, state {:?}",
                    m.get("generation"),
                    m.get("generation_changes"),
                    m.get("replays"),
                    m.state(IFNAME)
                )
            });
            m
        }
    };
    let replay_t = t0.elapsed();
    // The replay: the device holds what the module holds, and that is
    // everything the module had before (live flows keep their filters).
    let agree = tables_agree(s, Duration::from_secs(20))?;
    if let Err(e) = &agree {
        c.check(false, || e.to_string());
    }
    let (m_after, _) = s.module_table()?;
    let kept = m_before
        .iter()
        .filter(|(id, e)| m_after.get(id) == Some(e))
        .count();
    let replayed = m1.get("replayed_filters") - m0.get("replayed_filters");
    c.check(replayed >= before as u64, || {
        format!("module replayed {replayed} filters, it had {before}")
    });
    let trace = s.trace_since_mark()?;
    let adds = trace.iter().filter(|r| r.event == EventKind::Add).count();
    c.check(adds >= before, || {
        format!("the new daemon's trace has {adds} ADDs, the module had {before} filters")
    });
    let cut = killed_tail(s, c, &at_kill)?;
    // Steering resumes: fresh receivers (the new daemon's generator
    // numbers each flow from 0 again) and the generator on the new daemon.
    s.guest
        .agent
        .call_value(&Request::UdpStop, Duration::from_secs(30))?;
    let flows = s.flows.clone();
    s.udp_start(&flows)?;
    s.start_mark()?;
    s.start_gen_per_flow(s.settings.rate)?;
    let warm = s.wait_steered(&BTreeSet::new())?;
    std::thread::sleep(Duration::from_secs(1));
    let w = s.measure()?;
    let fig = s.check_window(&w, c);
    let post = s.delivery_window(c, true)?;
    // Same boot: the guest's uptime went on.
    let info: crate::proto::Info = s.guest.agent.req(Request::Hello)?;
    c.check(
        info.uptime_s > up0 + t0.elapsed().as_secs_f64() - 5.0,
        || {
            format!(
                "guest uptime {:.0}s: did it reboot? (was {up0:.0}s)",
                info.uptime_s
            )
        },
    );
    c.check(s.guest.qemu.exited().is_none(), || "QEMU exited".into());
    Ok(format!(
        "killed vnic (SIGKILL) 1s, its rings clean and {live0} filters live at the kill; reconnected in {:.1}s; generation {gen0:#x} -> {gen1:#x}; module generation_changes +{} replays +{} replayed_filters +{replayed} in {:.1}s; device==module {} entries (had {before}, {kept} identical); trace ADDs {adds}; ping {}/{}; re-steered in {:.1}s; {fig}; before the kill {pre}; at the kill {cut}; after {post}",
        reconnect.as_secs_f64(),
        m1.get("generation_changes") - m0.get("generation_changes"),
        m1.get("replays") - m0.get("replays"),
        replay_t.as_secs_f64(),
        agree.as_ref().copied().unwrap_or(0),
        p.received,
        p.sent,
        warm.as_secs_f64()
    ))
}

/// What the kill did to the workload's frames, read once the guest drained
/// the old daemon's last deliveries: a kill may cut each flow's stream
/// only at its tail (frames the old daemon built but never published), so
/// every flow's received sequence numbers are still a gap-free prefix,
/// with no duplicate, reorder or corrupted datagram since `at_kill` (read
/// just before it). How long the cut tail is cannot be known: the dead
/// daemon's send count went with it.
fn killed_tail(
    s: &mut Session,
    c: &mut Checks,
    at_kill: &crate::proto::UdpStats,
) -> Result<String> {
    let now = s.udp_stats()?;
    let mut late = 0;
    for (i, f) in s.flows.iter().enumerate() {
        let (Some(a), Some(b)) = (at_kill.flows.get(i), now.flows.get(i)) else {
            c.check(false, || {
                format!("flow :{}: no receiver counts around the kill", f.local_port)
            });
            continue;
        };
        let (b, moved) = (b.delivery, super::delivery::sub(&b.delivery, &a.delivery));
        late += moved.distinct;
        c.check(b.lost() == 0, || {
            format!(
                "flow :{}: {} frames missing below its highest sequence number {} after the kill (a kill may only cut the tail)",
                f.local_port,
                b.lost(),
                b.next.saturating_sub(1)
            )
        });
        let bad = [
            ("duplicated", moved.duplicated),
            ("reordered", moved.reordered),
            ("corrupted", moved.corrupted),
            ("short", moved.short),
        ];
        for (what, n) in bad {
            c.check(n == 0, || {
                format!(
                    "flow :{}: {n} {what} datagrams around the kill",
                    f.local_port
                )
            });
        }
    }
    Ok(format!(
        "{late} frames after the last read, every flow a gap-free prefix"
    ))
}

// ---- unload-reload ---------------------------------------------------------------

const KMEMLEAK: &str = "/sys/kernel/debug/kmemleak";
const CYCLES: usize = 20;
/// Generator rate of unload-reload's own workload (packets/s, all flows).
const DEBUG_RATE: u32 = 160;

fn kmemleak(s: &mut Session, cmd: &str) -> Result<()> {
    // A scan of the whole memory is slow on a TCG KASAN guest.
    s.guest
        .agent
        .call_value(
            &Request::WriteFile {
                path: KMEMLEAK.into(),
                value: cmd.into(),
            },
            Duration::from_mins(5),
        )
        .map(drop)
}

#[allow(clippy::many_single_char_names)] // s session, c checks, d delta, p ping, w window: as in mod.rs
pub(super) fn unload_reload(s: &mut Session, c: &mut Checks) -> Result<String> {
    // On the debug boot kmemleak must be there. A default boot (a kernel
    // left out of the suite's --debug-kernel) runs the same cycles and
    // checks without it, and its figures say so.
    let have_kmemleak = match s.guest.agent.read_file(KMEMLEAK) {
        Ok(_) => true,
        Err(e) => {
            c.check(s.kind != BootKind::Debug, || {
                format!("{KMEMLEAK} unreadable ({e}): not a kmemleak kernel, leaks unchecked")
            });
            false
        }
    };
    if have_kmemleak {
        // Leaks reported before (boot) are not the module's.
        kmemleak(s, "clear")?;
    }
    s.ensure_module()?;
    // A lighter workload than steer's: at the steer rate (2000/s) a KASAN
    // kernel's rx rings overflow and the agent starves.
    light_workload(s)?;
    s.trace_since_mark()?;
    let st0 = s.guest.ctl.stats()?;
    let mut flushed = Vec::new();
    let mut unload_ms = Vec::new();
    for cycle in 0..CYCLES {
        // Under traffic the module programs filters; unload with some live.
        let live =
            wait_live(s, "filters to be programmed under traffic").ctx(format!("cycle {cycle}"))?;
        let t = Instant::now();
        s.rmmod(Duration::from_mins(1))?;
        unload_ms.push(t.elapsed().as_millis() as u64);
        // rmmod returns after the device acknowledged the FLUSH.
        let after = s.guest.ctl.table()?.live;
        c.check(after == 0, || {
            format!("cycle {cycle}: {after} filters left on the device after rmmod (had {live})")
        });
        // The trace is written by the daemon's tracer thread: give the
        // unload FLUSH's lines (its DELs come first) a moment to land.
        let mut trace = s.trace_since_mark()?;
        let t_trace = Instant::now();
        while !trace
            .iter()
            .any(|r| r.event == EventKind::Flush && r.reason.as_deref() == Some("unload"))
            && t_trace.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(100));
            trace.extend(s.trace_since_mark()?);
        }
        let (fl, attach): (Vec<&TraceRecord>, Vec<&TraceRecord>) = trace
            .iter()
            .filter(|r| r.event == EventKind::Flush)
            .partition(|r| r.reason.as_deref() == Some("unload"));
        let dels = trace
            .iter()
            .filter(|r| r.event == EventKind::Del && r.reason.as_deref() == Some("unload"))
            .count();
        // The FLUSH a (re)loaded module sends when it attaches found
        // nothing: the previous unload had flushed everything.
        for f in &attach {
            c.check(f.count == Some(0), || {
                format!(
                    "cycle {cycle}: the attach FLUSH removed {:?} filters left behind",
                    f.count
                )
            });
        }
        match fl.as_slice() {
            [f] => {
                let n = f.count.unwrap_or(0) as usize;
                c.check(n == dels && n > 0, || {
                    format!(
                        "cycle {cycle}: unload flush of {n} filters, {dels} unload deletes traced"
                    )
                });
                flushed.push(n);
            }
            _ => c.check(false, || {
                format!(
                    "cycle {cycle}: {} unload flush records in the trace after rmmod",
                    fl.len()
                )
            }),
        }
        s.ensure_module().ctx(format!("cycle {cycle}: reload"))?;
    }
    let st1 = s.guest.ctl.stats()?;
    let unload_deletes = st1.table.deletes.unload - st0.table.deletes.unload;
    let total: usize = flushed.iter().sum();
    c.check(unload_deletes == total as u64, || {
        format!("device deletes/unload moved by {unload_deletes}, the flushes removed {total}")
    });
    // kmemleak: two scans (a leak is reported once it stayed unreferenced
    // across a scan), then the report must be empty.
    let t = Instant::now();
    let mut leaks = String::new();
    if have_kmemleak {
        for _ in 0..2 {
            kmemleak(s, "scan")?;
            std::thread::sleep(Duration::from_secs(1));
        }
        leaks = s.guest.agent.read_file(KMEMLEAK)?;
    }
    let scan_s = t.elapsed().as_secs_f64();
    let nleaks = leaks.matches("unreferenced object").count();
    if nleaks > 0 {
        s.guest.art.write("kmemleak.txt", &leaks);
        let head: String = leaks.lines().take(25).collect::<Vec<_>>().join("\n      ");
        c.check(false, || {
            format!("kmemleak: {nleaks} unreferenced objects:\n      {head}")
        });
    }
    let avg = unload_ms.iter().sum::<u64>() / unload_ms.len().max(1) as u64;
    let leak_check = if have_kmemleak {
        format!("kmemleak={nleaks} (scan {scan_s:.0}s)")
    } else {
        "kmemleak=n/a (default variant: no KASAN/kmemleak)".to_string()
    };
    let delivery = light_delivery(s, c)?;
    Ok(format!(
        "cycles={CYCLES} flows={} flushed per unload min/max={}/{} total={total} device deletes_unload=+{unload_deletes} rmmod avg={avg}ms max={}ms {leak_check} {delivery}",
        s.flows.len(),
        flushed.iter().min().copied().unwrap_or(0),
        flushed.iter().max().copied().unwrap_or(0),
        unload_ms.iter().max().copied().unwrap_or(0)
    ))
}

/// The light steering workload of the debug-boot scenarios (a KASAN kernel
/// under TCG handles a few hundred packets/s): 16 flows at [`DEBUG_RATE`].
/// Started (or started again) with fresh receivers and a delivery mark, so
/// that [`light_delivery`] accounts for every frame of it.
fn light_workload(s: &mut Session) -> Result<()> {
    if s.gen_running && !s.flows.is_empty() && s.delivery_mark.is_some() {
        return Ok(());
    }
    stop_workload(s)?;
    let flows = s.make_flows(16.min(s.settings.flows));
    s.udp_start(&flows)?;
    s.flows = flows;
    s.start_mark()?;
    s.start_gen_per_flow(DEBUG_RATE.min(s.settings.rate))
}

/// The delivery check of a shared debug-boot scenario (debugfs-65k, a
/// fresh one, gets it from `faults::isolated`): since the light workload
/// started (or the last scenario's check), every frame arrived intact and
/// once, and the guest's error counters stood still. Nothing these
/// scenarios do (unloads, NTUPLE toggles, stacked ops, table dumps) may
/// cost a data frame: without filters the flows go by RSS.
fn light_delivery(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.delivery_window(c, true)
}

/// Waits (up to a minute) for the device to hold filters; returns how many.
fn wait_live(s: &mut Session, what: &str) -> Result<u64> {
    let ctl = &mut s.guest.ctl;
    wait_for(Duration::from_mins(1), what, || {
        let n = ctl.table()?.live;
        Ok((n > 0).then_some(n))
    })
}

/// The device's longest programming latency (arfs::table::MAX_LATENCY_NS).
const MAX_LATENCY: &str = "10s";

/// Unload while the device delays every ACK by its maximum (10 s, known to
/// the module from CAPS): the module must wait for its FLUSH's ACK (rmmod
/// takes about 10 s) without holding RTNL. The guest
/// agent times an ethtool ioctl (which the kernel runs under RTNL) every
/// 20 ms during `delete_module`: none may take over 100 ms. The second
/// round also turns NTUPLE off and on again and again while the module
/// unloads. On the debug boot (lockdep, KASAN) the teardown's kernel-log
/// check catches what that race would break.
pub(super) fn unload_rtnl(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    light_workload(s)?;
    let mut figures = Vec::new();
    for toggle in [false, true] {
        // The module learns the device's latency from CAPS (its
        // retransmit timeout follows it): load it with the delay on.
        if s.module_loaded {
            s.rmmod(Duration::from_mins(2))?;
        }
        s.guest.ctl.set("program_latency", MAX_LATENCY)?;
        s.ensure_module()?;
        let live = wait_live(
            s,
            "filters to be programmed under traffic (each ADD applies 10 s late)",
        )?;
        let r: ProbedUnload = s.guest.agent.call(
            &Request::ProbedUnload {
                name: crate::module::NAME.into(),
                ifname: IFNAME.into(),
                every_ms: 20,
                toggle_ntuple: toggle,
            },
            Duration::from_mins(2),
        )?;
        s.guest.ctl.set("program_latency", 0)?;
        let what = if toggle {
            "with NTUPLE toggling"
        } else {
            "plain"
        };
        // The unload FLUSH is acknowledged 10 s after it was sent: an
        // unload that returned sooner did not wait for it (or gave up).
        c.check(r.unload_ms >= 9_000.0, || {
            format!(
                "{what}: rmmod returned after {:.1} s, before the device could acknowledge its FLUSH (10 s)",
                r.unload_ms / 1e3
            )
        });
        match &r.unload_error {
            None => s.module_loaded = false,
            Some(e) => c.check(false, || format!("{what}: {e}")),
        }
        // RTNL held across the 10 s wait blocks a probe for seconds, and
        // RTNL taken for each of the module's waits (100 ms and more, again
        // and again) makes most probes slow. Under TCG with KASAN a vCPU
        // descheduled by the host makes a probe take a few hundred ms now
        // and then: 1 of 333 (199 ms) in one cold CI run, 3 of 160 (up to
        // 249 ms, with NTUPLE toggling, a kernel build on the other core)
        // in another, none over 40 ms in the other runs. So the bar is: no
        // probe over 1 s and at most 5% of the probes over 100 ms (the 1%
        // it was failed that second run, a false failure).
        c.check(
            r.max_probe_ms < 1_000.0 && r.slow_probes * 20 <= r.probes,
            || {
                format!(
                    "{what}: RTNL held during the unload: {} of {} ethtool ioctls took over 100 ms (slowest {:.0} ms; unload {:.0} ms)",
                    r.slow_probes, r.probes, r.max_probe_ms, r.unload_ms
                )
            },
        );
        c.check(r.errors.is_empty(), || {
            format!("{what}: probe errors: {}", r.errors.join("; "))
        });
        if toggle {
            c.check(r.ntuple_toggles > 0, || {
                format!("{what}: no NTUPLE toggle happened during the unload")
            });
        }
        // The FLUSH takes effect on the device 10 s after it was sent.
        let ctl = &mut s.guest.ctl;
        let emptied = wait_for(Duration::from_secs(20), "the unload FLUSH to apply", || {
            Ok((ctl.table()?.live == 0).then_some(()))
        });
        if let Err(e) = emptied {
            c.check(false, || format!("{what}: {e}"));
        }
        figures.push(format!(
            "{what}: live={live} unload={:.1}s probes={} slowest={:.1}ms toggles={}",
            r.unload_ms / 1e3,
            r.probes,
            r.max_probe_ms,
            r.ntuple_toggles
        ));
    }
    s.ensure_module()?;
    figures.push(light_delivery(s, c)?);
    Ok(figures.join("; "))
}

/// Another module replaces the netdev's ops after ours ("stacked", the
/// test helper `vnic_opswap.ko`): `rmmod vnic_arfs` must leave the other
/// module's ops in place (it says so in the kernel log), must not leave
/// the kernel a way into its freed text (traffic keeps flowing for a
/// while, the kernel log stays clean), and the device table must be
/// flushed; then the helper goes, and a fresh load steers again.
pub(super) fn stacked_ops(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    light_workload(s)?;
    let live = wait_live(s, "filters to be programmed under traffic")?;
    let opswap = s.module_path.replace("vnic_arfs.ko", "vnic_opswap.ko");
    s.guest.agent.call_value(
        &Request::ModuleLoad {
            path: opswap.clone(),
            params: format!("ifname={IFNAME}"),
        },
        Duration::from_secs(30),
    )?;
    let t = Instant::now();
    s.rmmod(Duration::from_mins(1))?;
    let unload_ms = t.elapsed().as_millis();
    let left = s.guest.ctl.table()?.live;
    c.check(left == 0, || {
        format!("{left} filters left on the device after rmmod (had {live})")
    });
    // Traffic through the stacked ops for a while: nothing may call into
    // the unloaded module.
    std::thread::sleep(Duration::from_secs(2));
    let log: Kmsg = s.guest.agent.req(Request::Dmesg { since: 0 })?;
    let said = log
        .records
        .iter()
        .any(|r| r.msg.contains("netdev_ops were replaced after ours"));
    c.check(said, || {
        "rmmod vnic_arfs under stacked ops: no \"netdev_ops were replaced after ours\" in the kernel log".into()
    });
    s.guest.agent.call_value(
        &Request::ModuleUnload {
            name: "vnic_opswap".into(),
        },
        Duration::from_secs(30),
    )?;
    s.ensure_module()?;
    let again = match wait_live(s, "filters to be programmed again after the reload") {
        Ok(n) => n,
        Err(e) => {
            c.check(false, || e.0);
            0
        }
    };
    let delivery = light_delivery(s, c)?;
    Ok(format!(
        "live_before={live} rmmod={unload_ms}ms left={left} warned={said} live_after_reload={again} {delivery}"
    ))
}
