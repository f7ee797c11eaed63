//! `rps`: one rx queue, several CPUs. aRFS has nothing to steer there (every
//! CPU's local queue is queue 0; `steer` on such a topology checks that
//! the module stays idle), so what spreads the load is plain RPS. This
//! scenario asserts the behaviour the project's background material
//! describes, from the guest's own counters (per-CPU deltas of
//! /proc/net/softnet_stat and NET_RX softirqs):
//!
//! - RPS off: every packet is processed on the CPU that takes the queue's
//!   interrupt, and no CPU receives an RPS IPI;
//! - RPS on (`rps_cpus` = every CPU), many flows: each CPU processes what
//!   the flows' hashes (recorded in the guest by `vnic_flowhash.ko`) and the
//!   rps_map predict (`map->cpus[reciprocal_scale(hash, len)]`), within
//!   1% plus 50 packets, and RPS IPIs are sent. No "fair share" bar: a hash
//!   placement that loads one CPU lightly is predicted, not a chance
//!   failure;
//! - RPS on, one heavy flow: it all lands on one CPU (the flow hash picks
//!   one), however many CPUs are in the mask.

use super::experiments::{
    fmt_shares, rps_ipis, rps_pattern, rps_phase, rps_set_mask, rps_shares, RpsPhase,
};
use super::{Checks, Session};
use crate::ensure;
use crate::harness::Result;
use std::time::Duration;

/// Sources (one flow each) of the many-flow phases.
const MANY: u32 = 64;
const RATE: u32 = 3000;
const PHASE: Duration = Duration::from_secs(4);

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
        rps_set_mask(s, mask)?;
        let p = rps_phase(s, name, sources, RATE, PHASE, mask)?;
        c.check(p.sent > 0 && p.received * 100 >= p.sent * 95, || {
            format!(
                "{name}: the socket read {} of {} packets sent",
                p.received, p.sent
            )
        });
        phases.push(p);
    }
    rps_set_mask(s, "0")?;
    let (off, on, one) = (&phases[0], &phases[1], &phases[2]);
    for (holds, what) in rps_pattern(Some(off), on, one) {
        c.check(holds, || what.clone());
    }
    let (s_off, s_on, s_one) = (rps_shares(off), rps_shares(on), rps_shares(one));
    let ipis = rps_ipis;
    let drops = |p: &RpsPhase| p.cpus.iter().map(|c| c.dropped).sum::<u64>();
    let predicted: u64 = on.predicted.iter().sum();
    let pred_shares: Vec<f64> = on
        .predicted
        .iter()
        .map(|&p| p as f64 / predicted.max(1) as f64)
        .collect();
    Ok(format!(
        "processed by CPU: off {} ipis={} drops={}; on/{MANY} flows {} (predicted {}) ipis={} drops={}; on/1 flow {} ipis={} drops={}",
        fmt_shares(&s_off),
        ipis(off),
        drops(off),
        fmt_shares(&s_on),
        fmt_shares(&pred_shares),
        ipis(on),
        drops(on),
        fmt_shares(&s_one),
        ipis(one),
        drops(one)
    ))
}
