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

use super::{light_workload, Checks, Session, IFNAME};
use crate::harness::{wait_for, Context, Result};
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

/// A `name value` line of a debugfs file.
fn field(text: &str, name: &str) -> Option<u64> {
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

pub(in super::super) fn debugfs_65k(s: &mut Session, c: &mut Checks) -> Result<String> {
    let target = s.boot_capacity.min(MAX_FILTERS);
    s.ensure_module()?;
    s.guest
        .agent
        .write_file(&format!("{PARAMS_DIR}/expire_quota"), "0")?;
    light_workload(s)?;
    let dir = format!("{DEBUGFS_DIR}/{IFNAME}");
    let state = |s: &mut Session| s.guest.agent.read_file(&format!("{dir}/state"));
    // The real flows first: their filters take a few ids of the table.
    let ctl = &mut s.guest.ctl;
    wait_for(Duration::from_mins(1), "filters for the real flows", || {
        Ok((ctl.stats()?.table.live > 0).then_some(()))
    })?;

    let flowgen = s.module_path.replace("vnic_arfs.ko", "vnic_flowgen.ko");
    let t = Instant::now();
    s.guest
        .agent
        .call_value(
            &Request::ModuleLoad {
                path: flowgen,
                params: format!("ifname={IFNAME} count={target}"),
            },
            Duration::from_mins(5),
        )
        .ctx("loading vnic_flowgen.ko")?;
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
