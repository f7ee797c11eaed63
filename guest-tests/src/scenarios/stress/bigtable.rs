//! `debugfs-65k`: the module's table at the protocol's limit (65,535
//! filters), dumped through debugfs while traffic is steered, on the debug
//! kernels (lockdep, KASAN, kmemleak).
//!
//! Tens of thousands of RFS flows would need tens of thousands of connected
//! sockets, so the filters come from the test helper `vnic_flowgen.ko`: it
//! calls the netdev's `ndo_rx_flow_steer` once per synthetic flow, the way
//! `set_rps_cpu()` does (BH off, RCU held). The module's expiry is off
//! (`expire_quota=0`: the kernel's RFS slots never name those filters, so
//! `rps_may_expire_flow()` would let it delete them). Real flows run
//! meanwhile: the steer calls of their softirqs contend for the lock the
//! dump takes page by page. What must hold: the device and the module hold
//! the same number of filters, every dump lists each of them once, traffic
//! keeps flowing during the dumps, and the kernel reports nothing (the
//! session's log check: lockdep, KASAN, RCU stalls).
//!
//! `lock-holds`: the same full table, then the module's bulk jobs on it —
//! a table loss (the daemon restarted: every filter replayed), NTUPLE off
//! (one FLUSH of every filter; its ACK hands them to the work item, which
//! frees them in batches) and NTUPLE on (the kernel's RFS tables reset in
//! chunks) — each with no hold of the module's lock over [`HOLD_MAX`], by
//! the module's own figure (debugfs `lock_holds`, reset before each job).

use super::{flowgen_load, flowgen_unload, light_workload, BootKind, Checks, Session, IFNAME};
use crate::ensure;
use crate::harness::{wait_for, Result};
use crate::module::{DEBUGFS_DIR, PARAMS_DIR};
use crate::proto::Request;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// The protocol's id space (ids 0..=0xFFFE).
const MAX_FILTERS: u32 = 65_535;
/// Dumps taken under traffic: at least this many, and
const DUMPS: usize = 3;
/// as many more as it takes for the dumps to span this long. The light
/// workload's flows send together (their credits start at once), one burst
/// per 100 ms (16 flows at 160 packets/s); a window of five periods holds a
/// burst whatever its phase, so "nothing arrived" means the receive path
/// stalled, never that the window fell between two bursts. (Three dumps of
/// 6.12's 8,192 filters took 80-95 ms: the check failed by phase alone.)
const MIN_WINDOW: Duration = Duration::from_millis(500);
/// but never more than this many.
const MAX_DUMPS: usize = 64;

/// The longest hold of the module's lock a bulk job may take (issue 46:
/// "without a lock hold over 2 ms"). The figure is the guest's own clock
/// around each hold, so a vCPU the host preempts inside a hold counts
/// against it: the batches are sized to stay far below it (the holds'
/// maximum is printed with the function that ended it).
const HOLD_MAX: Duration = Duration::from_millis(2);

/// A `name value` line of a debugfs file.
pub(super) fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Ids of a `filters` dump, and the lines that repeat an id or do not parse.
fn dump_ids(text: &str) -> (HashSet<u32>, Vec<String>) {
    let mut ids = HashSet::new();
    let mut bad = Vec::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        match l.split(' ').next().and_then(|i| i.parse::<u32>().ok()) {
            Some(id) if ids.insert(id) => {}
            _ => bad.push(l.to_string()),
        }
    }
    (ids, bad)
}

/// The table's size for this boot (the protocol's limit on a debug boot),
/// the module loaded, its expiry off (the helper's filters are named by no
/// RFS slot: `rps_may_expire_flow()` would let it delete them), the light
/// workload running.
fn big_table_start(s: &mut Session) -> Result<u32> {
    s.ensure_module()?;
    s.guest
        .agent
        .write_file(&format!("{PARAMS_DIR}/expire_quota"), "0")?;
    light_workload(s)?;
    Ok(s.boot_capacity.min(MAX_FILTERS))
}

pub(in super::super) fn debugfs_65k(s: &mut Session, c: &mut Checks) -> Result<String> {
    let target = big_table_start(s)?;
    let dir = format!("{DEBUGFS_DIR}/{IFNAME}");
    let state = |s: &mut Session| s.guest.agent.read_file(&format!("{dir}/state"));
    // The real flows first: their filters take a few ids of the table.
    let ctl = &mut s.guest.ctl;
    wait_for(Duration::from_mins(1), "filters for the real flows", || {
        Ok((ctl.stats()?.table.live > 0).then_some(()))
    })?;

    let t = Instant::now();
    flowgen_load(s, target, Duration::from_mins(5))?;
    let inject_s = t.elapsed().as_secs_f64();
    let param = |s: &mut Session, p: &str| -> Result<u64> {
        let v = s
            .guest
            .agent
            .read_file(&format!("/sys/module/vnic_flowgen/parameters/{p}"))?;
        v.trim()
            .parse()
            .map_err(|e| format!("vnic_flowgen {p} = {v:?}: {e}").into())
    };
    let (accepted, busy, failed) = (
        param(s, "accepted")?,
        param(s, "busy")?,
        param(s, "failed")?,
    );
    c.check(failed == 0, || {
        format!("{failed} of {target} synthetic steer calls failed (not -EBUSY)")
    });

    // The module pushes the ADDs to the device in batches.
    let ctl = &mut s.guest.ctl;
    let want = u64::from(target);
    let programmed = wait_for(
        Duration::from_mins(5),
        &format!("the device to hold {want} filters"),
        || {
            let live = ctl.stats()?.table.live;
            Ok((live >= want).then_some(live))
        },
    );
    let programmed_s = t.elapsed().as_secs_f64();
    let dev_live = match programmed {
        Ok(n) => n,
        Err(e) => {
            c.check(false, || e.0.clone());
            s.guest.ctl.stats()?.table.live
        }
    };
    let st = state(s)?;
    let mod_live = field(&st, "live").ok_or_else(|| format!("no `live` in {dir}/state: {st}"))?;
    c.check(mod_live == dev_live && dev_live == want, || {
        format!("module live {mod_live}, device live {dev_live}, want {want}")
    });

    let before = s.udp_stats()?;
    let t_window = Instant::now();
    let mut dump_ms = Vec::new();
    while dump_ms.len() < DUMPS || (t_window.elapsed() < MIN_WINDOW && dump_ms.len() < MAX_DUMPS) {
        let i = dump_ms.len();
        let t = Instant::now();
        let text = s.guest.agent.call::<String>(
            &Request::ReadFile {
                path: format!("{dir}/filters"),
            },
            Duration::from_mins(2),
        )?;
        dump_ms.push(t.elapsed().as_millis());
        let (ids, bad) = dump_ids(&text);
        c.check(bad.is_empty(), || {
            format!(
                "dump {i}: {} lines repeat an id or do not parse, e.g. {:?}",
                bad.len(),
                &bad[..bad.len().min(3)]
            )
        });
        c.check(ids.len() as u64 == mod_live, || {
            format!(
                "dump {i}: {} filters listed, module holds {mod_live}",
                ids.len()
            )
        });
    }
    let after = s.udp_stats()?;
    let took = t_window.elapsed();
    let moved = |st: &crate::proto::UdpStats| st.flows.iter().map(|f| f.packets).sum::<u64>();
    let during = moved(&after).saturating_sub(moved(&before));
    c.check(during > 0, || {
        format!(
            "no packet reached the receivers while the table was dumped ({} dumps over {} ms)",
            dump_ms.len(),
            took.as_millis()
        )
    });
    let counters = s.guest.agent.read_file(&format!("{dir}/counters"))?;
    let max_chain = field(&counters, "max_chain").unwrap_or(0);
    s.guest.agent.call_value(
        &Request::ModuleUnload {
            name: "vnic_flowgen".into(),
        },
        Duration::from_secs(30),
    )?;
    Ok(format!(
        "filters={want} steer_calls: accepted={accepted} busy={busy} failed={failed} in {inject_s:.1}s; device held {dev_live} after {programmed_s:.1}s; module live={mod_live} max_chain={max_chain}; dumps x{}: {} ms in all ({}..{} ms each), each listing all; packets received during the dumps={during}",
        dump_ms.len(),
        took.as_millis(),
        dump_ms.iter().min().unwrap_or(&0),
        dump_ms.iter().max().unwrap_or(&0)
    ))
}

/// What debugfs `lock_holds` says.
struct Holds {
    count: u64,
    over_2ms: u64,
    max_ns: u64,
    max_at: String,
    /// `function holds/over_2ms/max_us` of each function that ended holds
    /// over 2 ms.
    long_at: Vec<String>,
}

fn read_holds(s: &mut Session, dir: &str) -> Result<Holds> {
    let text = s.guest.agent.read_file(&format!("{dir}/lock_holds"))?;
    let num =
        |k: &str| field(&text, k).ok_or_else(|| format!("no `{k}` in {dir}/lock_holds: {text}"));
    Ok(Holds {
        count: num("holds")?,
        over_2ms: num("over_2ms")?,
        max_ns: num("max_ns")?,
        max_at: text
            .lines()
            .find_map(|l| l.strip_prefix("max_at "))
            .unwrap_or("?")
            .to_string(),
        long_at: text
            .lines()
            .filter_map(|l| {
                let words: Vec<&str> = l.split(' ').collect();
                match words[..] {
                    ["at", func, "over_1ms", over1, "over_2ms", over, "max_ns", max]
                        if over != "0" =>
                    {
                        Some(format!(
                            "{func} {over} over 2 ms ({over1} over 1 ms), max {}us",
                            max.parse::<u64>().unwrap_or(0) / 1000
                        ))
                    }
                    _ => None,
                }
            })
            .collect(),
    })
}

/// One bulk job between a reset of `lock_holds` and a read of it: no hold
/// over [`HOLD_MAX`]. Returns the job's figure.
fn timed_job(
    s: &mut Session,
    c: &mut Checks,
    dir: &str,
    what: &str,
    job: impl FnOnce(&mut Session, &mut Checks) -> Result<String>,
) -> Result<String> {
    s.guest
        .agent
        .write_file(&format!("{dir}/lock_holds"), "0")?;
    let t = Instant::now();
    let done = job(s, c)?;
    let took = t.elapsed();
    let h = read_holds(s, dir)?;
    let max = Duration::from_nanos(h.max_ns);
    // Only guest time that counts instructions measures the module.
    let timed = s.kind == BootKind::Timed;
    c.check(!timed || (h.over_2ms == 0 && max <= HOLD_MAX), || {
        format!(
            "{what}: {} of {} holds of the module's lock over {HOLD_MAX:?}, the longest {max:?} (ended in {}); by function: {}",
            h.over_2ms,
            h.count,
            h.max_at,
            h.long_at.join(", ")
        )
    });
    Ok(format!(
        "{what}: {done} in {:.1}s, {} holds, max {}us ({}{})",
        took.as_secs_f64(),
        h.count,
        h.max_ns / 1000,
        h.max_at,
        if timed {
            ""
        } else {
            "; wall-clock time on a preemptible vCPU: the bound is not asserted"
        }
    ))
}

/// A number of the module's `counters` or `state` file.
pub(super) fn module_field(s: &mut Session, dir: &str, file: &str, name: &str) -> Result<u64> {
    let text = s.guest.agent.read_file(&format!("{dir}/{file}"))?;
    field(&text, name).ok_or_else(|| format!("no `{name}` in {dir}/{file}: {text}").into())
}

pub(in super::super) fn lock_holds(s: &mut Session, c: &mut Checks) -> Result<String> {
    // Traffic meanwhile (on the timed boot's one CPU the kernel steers
    // nothing: the table is the helper's).
    let target = big_table_start(s)?;
    let want = u64::from(target);
    let dir = format!("{DEBUGFS_DIR}/{IFNAME}");
    flowgen_load(s, target, Duration::from_mins(5))?;
    let ctl = &mut s.guest.ctl;
    wait_for(
        Duration::from_mins(5),
        &format!("the device to hold {want} filters"),
        || Ok((ctl.stats()?.table.live >= want).then_some(())),
    )?;
    let mut figures = Vec::new();

    // Table loss: a new daemon, a new generation, every filter replayed.
    figures.push(timed_job(s, c, &dir, "table loss", |s, _| {
        let replays = module_field(s, &dir, "counters", "replays")?;
        s.guest.restart_vnic(Duration::from_millis(500))?;
        s.gen_running = false;
        s.gen_sets.clear();
        s.trace_mark = 0;
        let mut live = 0;
        wait_for(
            Duration::from_mins(5),
            &format!("the new daemon to hold the {want} replayed filters"),
            || {
                live = s.guest.ctl.stats()?.table.live;
                Ok(
                    (live >= want && module_field(s, &dir, "counters", "replays")? > replays)
                        .then_some(()),
                )
            },
        )?;
        Ok(format!("{live} filters replayed"))
    })?);
    // The restart took the generator's flow sets: a new light workload
    // (and delivery mark) for the rest.
    light_workload(s)?;

    // NTUPLE off: one FLUSH of the whole table; its ACK hands every
    // filter to the work item, which frees them in batches.
    figures.push(timed_job(s, c, &dir, "ntuple off", |s, c| {
        let reaped = module_field(s, &dir, "counters", "reaped")?;
        ensure!(
            !s.set_ntuple(false)?,
            "rx-ntuple-filter still on after turning it off"
        );
        wait_for(
            Duration::from_mins(2),
            "the FLUSH to be acknowledged and every id freed",
            || Ok((module_field(s, &dir, "state", "ids")? == 0).then_some(())),
        )?;
        let n = module_field(s, &dir, "counters", "reaped")? - reaped;
        let batches = module_field(s, &dir, "counters", "reap_batches")?;
        c.check(n >= want, || {
            format!("the work item freed {n} filters after the FLUSH, want >= {want}")
        });
        Ok(format!(
            "{n} filters flushed and freed ({batches} batches in all)"
        ))
    })?);

    // NTUPLE on: the kernel's RFS tables reset, in chunks.
    figures.push(timed_job(s, c, &dir, "ntuple on", |s, _| {
        let resets = module_field(s, &dir, "counters", "rfs_resets")?;
        let chunks = module_field(s, &dir, "counters", "rfs_reset_chunks")?;
        ensure!(
            s.set_ntuple(true)?,
            "rx-ntuple-filter did not turn on again"
        );
        wait_for(
            Duration::from_secs(30),
            "the RFS tables to be reset",
            || Ok((module_field(s, &dir, "counters", "rfs_resets")? > resets).then_some(())),
        )?;
        let n = module_field(s, &dir, "counters", "rfs_reset_chunks")? - chunks;
        Ok(format!("RFS tables reset in {n} chunks"))
    })?);

    flowgen_unload(s);
    Ok(format!("filters={want}; {}", figures.join("; ")))
}
