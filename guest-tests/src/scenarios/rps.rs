//! `rps`: one rx queue, several CPUs. aRFS has nothing to steer there (every
//! CPU's local queue is queue 0; `steer` on such a topology checks that
//! the module stays idle), so what spreads the load is plain RPS. This
//! scenario asserts the behaviour the project's background material
//! describes, from the guest's own counters (per-CPU deltas of
//! /proc/net/softnet_stat and NET_RX softirqs):
//!
//! - RPS off: every packet is processed on the CPU that takes the queue's
//!   interrupt, and no CPU receives an RPS IPI;
//! - RPS on (`rps_cpus` = every CPU), many flows: the processing spreads
//!   over every CPU (each gets at least half its fair share) and RPS IPIs
//!   are sent;
//! - RPS on, one heavy flow: it all lands on one CPU (the flow hash picks
//!   one), however many CPUs are in the mask.

use super::experiments::{rps_phase, RpsPhase};
use super::{Checks, Session, IFNAME};
use crate::ensure;
use crate::harness::Result;
use crate::proto::Request;
use serde_json::Value;
use std::time::Duration;

/// Sources (one flow each) of the many-flow phases: with 64 flows hashed
/// over 2 CPUs, one gets under a quarter with odds of about 1 in 15,000.
const MANY: u32 = 64;
const RATE: u32 = 3000;
const PHASE: Duration = Duration::from_secs(4);

fn set_rps(s: &mut Session, mask: &str) -> Result<()> {
    s.guest.agent.req::<Value>(Request::Rfs {
        ifname: IFNAME.into(),
        sock_flow_entries: 0,
        flow_cnt: 0,
        rps_cpus: Some(mask.to_string()),
    })?;
    Ok(())
}

/// Share of all processed packets each CPU processed.
fn shares(p: &RpsPhase) -> Vec<f64> {
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

fn fmt_shares(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{:.0}%", 100.0 * x)).collect();
    format!("[{}]", parts.join(" "))
}

pub(super) fn rps(s: &mut Session, c: &mut Checks) -> Result<String> {
    ensure!(
        s.pairs == 1 && s.settings.cpus >= 2,
        "rps runs on one rx queue and 2+ CPUs (--topology 1x2), this boot has {} pairs and {} CPUs",
        s.pairs,
        s.settings.cpus
    );
    s.ensure_net()?;
    ensure!(!s.module_loaded, "rps runs without the aRFS module");
    let ncpu = usize::from(s.settings.cpus);
    let all = format!("{:x}", (1u64 << ncpu) - 1);
    let mut phases = Vec::new();
    for (name, mask, sources) in [
        ("off", "0", MANY),
        ("on", all.as_str(), MANY),
        ("on-1flow", all.as_str(), 1),
    ] {
        set_rps(s, mask)?;
        let p = rps_phase(s, name, sources, RATE, PHASE, mask)?;
        c.check(p.sent > 0 && p.received * 100 >= p.sent * 95, || {
            format!(
                "{name}: the socket read {} of {} packets sent",
                p.received, p.sent
            )
        });
        phases.push(p);
    }
    set_rps(s, "0")?;
    let (off, on, one) = (&phases[0], &phases[1], &phases[2]);
    let ipis = |p: &RpsPhase| p.cpus.iter().map(|c| c.rps).sum::<u64>();
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let min = |v: &[f64]| v.iter().copied().fold(1.0, f64::min);

    let (s_off, s_on, s_one) = (shares(off), shares(on), shares(one));
    c.check(max(&s_off) >= 0.95, || {
        format!(
            "RPS off: the interrupt CPU should process everything; shares by CPU {}",
            fmt_shares(&s_off)
        )
    });
    c.check(ipis(off) == 0, || {
        format!("RPS off: {} RPS IPIs received", ipis(off))
    });
    let fair = 1.0 / ncpu as f64;
    c.check(min(&s_on) >= fair / 2.0, || {
        format!(
            "RPS on, {MANY} flows: some CPU got less than half its fair share ({:.0}%): {}",
            100.0 * fair,
            fmt_shares(&s_on)
        )
    });
    c.check(ipis(on) > 0, || {
        "RPS on, many flows: no RPS IPI was received".into()
    });
    c.check(max(&s_one) >= 0.95, || {
        format!(
            "RPS on, one flow: its packets should all be processed on one CPU; shares {}",
            fmt_shares(&s_one)
        )
    });
    let drops = |p: &RpsPhase| p.cpus.iter().map(|c| c.dropped).sum::<u64>();
    Ok(format!(
        "processed by CPU: off {} ipis={} drops={}; on/{MANY} flows {} ipis={} drops={}; on/1 flow {} ipis={} drops={}",
        fmt_shares(&s_off),
        ipis(off),
        drops(off),
        fmt_shares(&s_on),
        ipis(on),
        drops(on),
        fmt_shares(&s_one),
        ipis(one),
        drops(one)
    ))
}
