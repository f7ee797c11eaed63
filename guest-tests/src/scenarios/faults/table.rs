//! Faults group: the device's table limits. `table-full` (a table smaller
//! than the module believes) and `bucket-collisions` (a bucketed table whose
//! buckets overflow).

use super::{delta, dev_delta, rejects_by_reason, table_of, REJECT_HOLDOFF};
use crate::harness::{wait_for, Result};
use crate::scenarios::{Checks, Flow, Session, BASE_PORT, GEN_IP, GEN_PORT, GUEST_IP};
use crate::{bail, ensure};
use arfs::{EventKind, FilterTable, FlowKey, L4Proto, TableConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

// ---- 1. table full ---------------------------------------------------

/// 64 flows against a device table of 16 that the module believes has
/// 8192 (the device shrank under it with an empty table: a hardware
/// table shared with other users): the device rejects with table_full,
/// the module holds the refused flows off with -EBUSY instead of asking
/// per packet, and the 16 accepted flows are steered as well as ever.
pub(in crate::scenarios) fn table_full(s: &mut Session, c: &mut Checks) -> Result<String> {
    const CAP: u64 = 16;
    // The module's keepalive HELLO would fetch a CAPS with the new
    // capacity and the module would then cap itself at 16 (-EBUSY
    // without asking the device): off, so the device is what refuses.
    let extra = s.settings.module.extra.clone();
    s.settings.module.extra = format!("{extra} keepalive_ms=0");
    let loaded = s.ensure_module();
    s.settings.module.extra = extra;
    loaded?;
    s.guest.ctl.set("table_capacity", CAP)?;
    // Before the baselines: the port probe sends packets (no filter asked).
    let flows = s.steering_flows(s.settings.flows)?;
    let m0 = s.module_counters()?;
    let believed = m0.get("capacity");
    ensure!(
        believed == u64::from(s.boot_capacity),
        "the module believes the capacity is {believed}, not {}",
        s.boot_capacity
    );
    let s0 = s.guest.ctl.stats()?;
    let need = flows.iter().filter(|f| f.needs_filter()).count() as u64;
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
        || Ok((ctl.table()?.live == CAP).then_some(())),
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
    let dev_full = dev_delta(&s1, &s0, |s| s.table.rejects.table_full);
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
    let dev_ops = dev_delta(&s1, &s0, |s| s.table.adds)
        + dev_delta(&s1, &s0, |s| s.table.replaces)
        + dev_full;
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
    let mut guest_q_min: f64 = 1.0;
    for (i, f) in s.flows.iter().enumerate() {
        if !accepted.contains(&f.key) {
            continue;
        }
        guest_q_min = guest_q_min.min(s.check_guest_queue(&w, i, c));
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
                f.local_port, w.hits[i], w.sent[i], f.rx_q
            )
        });
    }
    Ok(format!(
        "cap={CAP} flows={} need_filter={need} filled_in={:.1}s live={} table_full: trace={} dev={dev_full} mod={mod_full} max_per_flow={worst}/{bound} add_ops={add_ops} steer_calls={steer_calls} busy={busy} busy_rejected={} accepted_on_cpu_min={:.1}% hw_min={:.1}% guest_q_min={:.1}%",
        s.flows.len(),
        fill.as_secs_f64(),
        table.len(),
        full.len(),
        delta(&m1, &m0, "busy_rejected"),
        100.0 * acc_min,
        100.0 * hw_min,
        100.0 * guest_q_min
    ))
}

// ---- 2. bucket collisions ---------------------------------------------

/// 64 buckets x 2 ways; flows chosen on the host (with the arfs crate,
/// the device's Toeplitz bucket hash) so that two buckets get 4 flows
/// each and 8 more flows have a bucket of their own. Every bucket_full
/// reject must be for a predicted collider, and replaying the trace the
/// rejected flow's bucket held exactly 2 filters, both predicted
/// colliders of that bucket.
pub(in crate::scenarios) fn bucket_collisions(s: &mut Session, c: &mut Checks) -> Result<String> {
    const B: u32 = 64;
    const W: usize = 2;
    s.guest.ctl.set("buckets", format!("{B}x{W}"))?;
    let model = FilterTable::new(TableConfig {
        capacity: s.boot_capacity,
        buckets: Some((B, W as u16)),
        ..TableConfig::default()
    })
    .map_err(|e| format!("bucket model: {e}"))?;
    // Receivers on CPUs whose queue is not the flow's RSS queue, so that
    // every candidate needs a filter.
    let ncpu = usize::from(s.settings.cpus);
    let candidate = |port: u16| {
        let key = FlowKey::v4(L4Proto::Udp, GEN_IP, GEN_PORT, GUEST_IP, port);
        let rss_q = usize::from(s.rss.queue_for_key(&key));
        let others: Vec<usize> = (0..ncpu).filter(|&c| s.queue_of_cpu(c) != rss_q).collect();
        let cpu = others
            .get(usize::from(port) % others.len().max(1))
            .copied()
            .unwrap_or(0);
        Flow {
            local_port: port,
            cpu,
            key,
            rss_q,
            rx_q: s.queue_of_cpu(cpu),
        }
    };
    let bucket = |k: &FlowKey| model.bucket_for(k).unwrap_or(u32::MAX);
    let mut by_bucket: BTreeMap<u32, Vec<u16>> = BTreeMap::new();
    for port in BASE_PORT..BASE_PORT + 2000 {
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
    for f in &tj.filters {
        let key: FlowKey = crate::scenarios::flow_key(&f.flow)?;
        let dev_b = f.bucket;
        c.check(dev_b == Some(bucket(&key)), || {
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
    let dev_full = dev_delta(&s1, &s0, |s| s.table.rejects.bucket_full);
    let mod_full = delta(&m1, &m0, "reject_bucket_full");
    c.check(dev_full == full as u64 && mod_full == dev_full, || {
        format!("bucket_full rejects: trace {full}, device {dev_full}, module {mod_full}")
    });
    c.check(
        dev_delta(&s1, &s0, |s| s.table.rejects.table_full) == 0,
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
