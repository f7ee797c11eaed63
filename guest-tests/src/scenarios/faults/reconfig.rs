//! Faults group: `reconfig`, the guest reconfiguring the NIC under the
//! module (channels and NTUPLE).

use super::{dev_delta, need_count, table_of, DevTable};
use crate::ensure;
use crate::harness::{wait_for, Result};
use crate::proto::Request;
use crate::scenarios::workload::irq_cpu_queue_map;
use crate::scenarios::{Checks, Session, IFNAME};
use arfs::{EventKind, TraceRecord};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

// ---- 8. guest-side reconfiguration --------------------------------------

/// `ethtool -L` 4 -> 2 -> 4 and NTUPLE off/on with 64 steered flows.
/// Traffic is stopped around each channel change: with RFS configured,
/// `ethtool -L` under traffic makes the kernel itself WARN in
/// get_rps_cpu (seen on 6.12 and 7.3 without this module), which would
/// hide what is tested here.
pub(in crate::scenarios) fn reconfig(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let full_q = s.settings.queues;
    let low_q: u16 = 2;
    let flows = s.steering_flows(s.settings.flows)?;
    let s0 = s.guest.ctl.stats()?;
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
        ifname: IFNAME.into(),
        combined: u32::from(low_q),
    })?;
    ensure!(
        got == u32::from(low_q),
        "ethtool -L {low_q}: device has {got}"
    );
    s.set_pairs(low_q);
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
    c.check(s_low.enabled_pairs == low_q, || {
        format!(
            "device spreads over {} pairs after ethtool -L {low_q}",
            s_low.enabled_pairs
        )
    });
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
        .map(|q| dev_delta(&s_low2, &s_low, |s| s.queues[q].rx_drops_disabled))
        .sum::<u64>();
    let dis_pkts = (usize::from(low_q)..usize::from(full_q))
        .map(|q| dev_delta(&s_low2, &s_low, |s| s.queues[q].rx_packets))
        .sum::<u64>();
    c.check(dis_drops == 0 && dis_pkts == 0, || {
        format!("with {low_q} queues: {dis_pkts} packets delivered and {dis_drops} dropped on disabled queues")
    });
    let low_filters = table_of(&s.guest.ctl.table()?)?.len();

    // 2 -> 4, quiesced; the new rx queues need their RFS tables again.
    let got: u32 = s.guest.agent.req(Request::SetChannels {
        ifname: IFNAME.into(),
        combined: u32::from(full_q),
    })?;
    ensure!(
        got == u32::from(full_q),
        "ethtool -L {full_q}: device has {got}"
    );
    s.set_pairs(full_q);
    // The module rebuilds its CPU -> queue rmap in its work item; until
    // then the kernel maps CPUs to the old queues and marks flows as
    // settled on them (no steer call later). Traffic resumes after.
    let rmap_full = s.wait_rmap(full_q)?;
    let st = s.settings.clone();
    s.guest.agent.req::<Value>(Request::Rfs {
        ifname: IFNAME.into(),
        sock_flow_entries: st.sock_flow_entries.next_power_of_two(),
        flow_cnt: st.flow_cnt,
        rps_cpus: None,
    })?;
    s.fault_start_gen()?;
    let back = s.wait_steered(&BTreeSet::new())?;

    // NTUPLE off: every filter goes; nothing is added while off.
    s.trace_since_mark()?;
    let off: bool = s.guest.agent.req(Request::SetFeature {
        ifname: IFNAME.into(),
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
        || Ok((ctl.table()?.live == 0).then_some(())),
    );
    if let Err(e) = flushed {
        c.check(false, || e.0);
    }
    std::thread::sleep(Duration::from_secs(2));
    let t_off = s.trace_since_mark()?;
    let live_off = s.guest.ctl.table()?.live;
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
        ifname: IFNAME.into(),
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
    let bad_q = dev_delta(&s1, &s0, |s| s.table.rejects.bad_queue);
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

// ---- relayout: filters follow a new CPU -> queue layout -------------------

/// `ethtool -L combined n` with the generator stopped around it (`back`:
/// up again from `low`, whose new queues get their rps_flow_cnt), then
/// traffic again: every flow must follow the new layout within `bound`
/// (its filter, if it needs one, on the queue of its receiver's CPU by the
/// guest's own IRQ affinity). Returns the figure `FULL->n:SECONDSs`.
fn change_layout(
    s: &mut Session,
    c: &mut Checks,
    low: u16,
    n: u16,
    back: bool,
    bound: Duration,
) -> Result<String> {
    let full_q = s.settings.queues;
    s.fault_stop_gen()?;
    std::thread::sleep(Duration::from_millis(500));
    let got: u32 = s.guest.agent.req(Request::SetChannels {
        ifname: IFNAME.into(),
        combined: u32::from(n),
    })?;
    ensure!(got == u32::from(n), "ethtool -L {n}: device has {got}");
    s.set_pairs(n);
    s.wait_rmap(n)?;
    // Queues that `ethtool -L` adds start without an RFS table
    // (rps_flow_cnt 0: the kernel never steers to them): give the
    // new ones theirs, as an admin would. Only the new ones:
    // writing rps_flow_cnt replaces a queue's table, which would
    // wipe the old CPU records the module must deal with itself.
    if back {
        for q in low..n {
            s.guest.agent.write_file(
                &format!("/sys/class/net/{IFNAME}/queues/rx-{q}/rps_flow_cnt"),
                &s.settings.flow_cnt.to_string(),
            )?;
        }
    }
    let map = irq_cpu_queue_map(s, n)?;
    s.fault_start_gen()?;
    let t0 = Instant::now();
    let (settled, last) = loop {
        let t = table_of(&s.guest.ctl.table()?)?;
        let last = misplaced(s, &t, &map);
        if last.0.is_empty() && last.1 == 0 {
            break (Some(t0.elapsed()), last);
        }
        if t0.elapsed() > bound.max(Duration::from_secs(10)) {
            break (None, last);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let what = if back { "back to" } else { "down to" };
    Ok(if let Some(d) = settled {
        c.check(d <= bound, || {
            format!("{what} {n} queues: flows followed the new layout only after {d:.1?}")
        });
        format!("{full_q}->{n}:{:.1}s", d.as_secs_f64())
    } else {
        c.check(false, || {
            format!(
                "{what} {n} queues: after {:.0?} of traffic {} filter(s) not local to their CPU ({}), {} flow(s) never steered; map {map:?}",
                bound.max(Duration::from_secs(10)),
                last.0.len(),
                last.0.iter().take(6).cloned().collect::<Vec<_>>().join(" "),
                last.1
            )
        });
        format!("{full_q}->{n}:unsettled")
    })
}

/// Synthetic filters of `vnic_flowgen.ko` in `relayout-4k`.
const SYNTHETIC: u32 = 4096;

/// `relayout` with 4,096 more filters in the table (synthetic ones from the
/// test helper `vnic_flowgen.ko`, as in debugfs-65k, the module's expiry
/// off so that they stay): each layout change deletes them all with one
/// FLUSH (no DEL; the module's ids stay held until its ACK, and only then
/// are the kernel's RFS records reset), after which every real flow is on
/// its CPU's queue within 5 s, with no `-EBUSY` on the way.
pub(in crate::scenarios) fn relayout_4k(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    s.guest
        .agent
        .write_file(&format!("{}/expire_quota", crate::module::PARAMS_DIR), "0")?;
    let full_q = s.settings.queues;
    let low = 3u16.min(full_q - 1);
    let flows = s.steering_flows(s.settings.flows)?;
    s.fault_start(flows)?;
    s.wait_steered(&BTreeSet::new())?;
    let flowgen = s.module_path.replace("vnic_arfs.ko", "vnic_flowgen.ko");
    s.guest.agent.call_value(
        &Request::ModuleLoad {
            path: flowgen,
            params: format!("ifname={IFNAME} count={SYNTHETIC}"),
        },
        Duration::from_mins(2),
    )?;
    let real = s.flows.iter().filter(|f| f.needs_filter()).count() as u64;
    let want = u64::from(SYNTHETIC) + real;
    let ctl = &mut s.guest.ctl;
    wait_for(
        Duration::from_mins(2),
        &format!("the device to hold {want} filters"),
        || Ok((ctl.stats()?.table.live >= want).then_some(())),
    )?;
    let s0 = s.guest.ctl.stats()?;
    let m0 = s.module_counters()?;
    s.trace_since_mark()?;
    let mut figures = Vec::new();
    let mut flushed = Vec::new();
    for (n, back) in [(low, false), (full_q, true)] {
        let d0 = s.guest.ctl.stats()?;
        figures.push(change_layout(s, c, low, n, back, Duration::from_secs(5))?);
        let d1 = s.guest.ctl.stats()?;
        flushed.push(dev_delta(&d1, &d0, |s| s.table.deletes.flush));
    }
    let trace = s.trace_since_mark()?;
    let m1 = s.module_counters()?;
    let s1 = s.guest.ctl.stats()?;
    let _ = s.guest.agent.call_value(
        &Request::ModuleUnload {
            name: "vnic_flowgen".into(),
        },
        Duration::from_secs(30),
    );
    // The device traces every entry a FLUSH removes as a `del` (reason
    // flush): what the module sent is in its own counters.
    let del_ops = super::delta(&m1, &m0, "del_ops");
    let flushes: Vec<u32> = trace
        .iter()
        .filter(|r| r.event == EventKind::Flush)
        .map(|r| r.count.unwrap_or(0))
        .collect();
    let busy = super::delta(&m1, &m0, "busy");
    let frames = super::delta(&m1, &m0, "layout_flush_frames");
    c.check(del_ops == 0, || {
        format!("the module sent {del_ops} DEL ops: the layout changes should delete with one FLUSH each")
    });
    c.check(
        flushes.len() == 2 && flushes[0] as u64 >= want && frames == 2,
        || {
            format!(
                "FLUSHes in the trace {flushes:?} (first must remove >= {want} filters), module layout FLUSH frames {frames}"
            )
        },
    );
    c.check(busy == 0, || {
        format!("{busy} steer calls answered -EBUSY across the layout changes")
    });
    // Each layout change walks the filters its FLUSH removes in holds of at
    // most 256 (VNIC_BULK_BATCH), the lock let go between them.
    let batches = super::delta(&m1, &m0, "bulk_batches");
    let min_batches: u64 = flushes.iter().map(|n| u64::from(*n).div_ceil(256)).sum();
    let bulk_max = m1.get("bulk_max");
    c.check(
        batches >= min_batches && (1..=256).contains(&bulk_max),
        || {
            format!(
                "the layout changes' walks over {flushes:?} filters took {batches} lock holds (want >= {min_batches}) of at most {bulk_max} filters (want 1..=256)"
            )
        },
    );
    let flush_dev = dev_delta(&s1, &s0, |s| s.table.flushes);
    Ok(format!(
        "filters={want} (synthetic {SYNTHETIC}) flush_frames={frames} device_flushes={flush_dev} flushed={flushes:?} del_ops={del_ops} busy={busy} bulk_batches={batches} bulk_max={bulk_max} settled {} rfs_resets={}",
        figures.join(" "),
        super::delta(&m1, &m0, "rfs_resets")
    ))
}

/// Flows whose device filter is not on the queue of their receiver's CPU
/// under `map` (a flow that RSS already delivers there needs none), and
/// flows that need a filter and have none.
fn misplaced(s: &Session, t: &DevTable, map: &BTreeMap<usize, usize>) -> (Vec<String>, usize) {
    let mut wrong = Vec::new();
    let mut missing = 0;
    for f in &s.flows {
        let want = map[&f.cpu];
        let filters: Vec<u16> = t
            .values()
            .filter(|(k, _)| *k == f.key)
            .map(|(_, q)| *q)
            .collect();
        for q in &filters {
            if usize::from(*q) != want {
                wrong.push(format!(
                    ":{} cpu{} on q{q} (want q{want})",
                    f.local_port, f.cpu
                ));
            }
        }
        if filters.is_empty() && f.rss_q != want {
            missing += 1;
        }
    }
    (wrong, missing)
}

/// `ethtool -L` at run time, 4 -> 3 and 4 -> 2 channels (back to 4 in
/// between) with steered flows: once traffic resumes, every live flow must
/// be steered to the rx queue of its receiver's CPU under the new layout
/// (the guest's own interrupt affinity) within 2 s, with no filter left on
/// a queue that is not local to its CPU. The kernel's RFS tables still
/// hold each flow's old CPU after the change, so this needs the module to
/// make the kernel ask again. (When the queues come back the suite sets
/// `rps_flow_cnt` on the added ones only, as an admin would: a queue that
/// `ethtool -L` adds has no RFS table, and the kernel never steers to it.)
pub(in crate::scenarios) fn relayout(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let full_q = s.settings.queues;
    let flows = s.steering_flows(s.settings.flows)?;
    s.fault_start(flows)?;
    s.wait_steered(&BTreeSet::new())?;
    let mut figures = Vec::new();
    for low in [3u16, 2] {
        if low >= full_q {
            continue;
        }
        for (n, back) in [(low, false), (full_q, true)] {
            figures.push(change_layout(s, c, low, n, back, Duration::from_secs(2))?);
        }
    }
    let m = s.module_counters()?;
    Ok(format!(
        "flows={} settled {} rmap_rebuilds={} resteers={}",
        s.flows.len(),
        figures.join(" "),
        m.get("rmap_rebuilds"),
        m.get("resteers")
    ))
}
