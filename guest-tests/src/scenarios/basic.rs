//! The issue-4 scenarios: link, steer, migrate, expiry.
//!
//! They run in that order in the same boot; each makes sure its
//! prerequisites hold (a `migrate` run alone first programs the filters the
//! way `steer` does, without asserting on that set-up), so any subset can be
//! selected.

use super::workload::{fmt_queues, irq_cpu_queue_map, napi_queues, queue_delta, split_dels};
use super::{Checks, Family, Flow, Session, GEN_IP, GEN_IP6, IFNAME};
use crate::harness::{wait_for, Result};
use crate::module;
use crate::proto::{PingResult, Request, RxQueueNapi, UdpStats};
use crate::{bail, ensure};
use arfs::{EventKind, FlowKey, TraceRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use vnic_ctl_proto::QueueStats;

pub(super) fn link(s: &mut Session, c: &mut Checks) -> Result<String> {
    let st = s.settings.clone();
    let info = s.guest.info.clone();
    c.check(info.cpus == usize::from(st.cpus), || {
        format!("guest has {} CPUs, expected {}", info.cpus, st.cpus)
    });
    let eth = info.interfaces.iter().find(|i| i.name == IFNAME).cloned();
    let Some(eth) = eth else {
        bail!("guest has no {IFNAME}: {:?}", info.interfaces);
    };
    c.check(eth.driver == "virtio_net", || {
        format!("{IFNAME} driver is {:?}", eth.driver)
    });
    // virtio_net starts with min(pairs offered, CPUs) pairs in use.
    let boot_pairs = usize::from(st.queues.min(st.cpus));
    c.check(
        eth.rx_queues == boot_pairs && eth.tx_queues == boot_pairs,
        || {
            format!(
                "{IFNAME} has {} rx / {} tx queues at boot, expected {boot_pairs} (min of {} pairs offered and {} CPUs; MQ not negotiated?)",
                eth.rx_queues, eth.tx_queues, st.queues, st.cpus
            )
        },
    );
    s.ensure_net()?;
    let pairs = s.pairs;
    let ctl = &mut s.guest.ctl;
    let stats = wait_for(
        Duration::from_secs(20),
        "vnic to see every queue pair in use enabled",
        || {
            let now = ctl.stats()?;
            Ok((now.enabled_pairs == pairs).then_some(now))
        },
    );
    let stats = match stats {
        Ok(v) => v,
        Err(e) => {
            c.check(false, || format!("{e}"));
            s.guest.ctl.stats()?
        }
    };
    // 3 pings to the gen peer; over IPv6 too when the workload uses it
    // (neighbour discovery and ICMPv6 echo, both answered by the gen peer).
    let mut ping_to = |addr: String, c: &mut Checks| -> Result<PingResult> {
        let p: PingResult = s.guest.agent.call(
            &Request::Ping {
                addr: addr.clone(),
                count: 3,
                timeout_ms: 3000,
            },
            Duration::from_secs(30),
        )?;
        c.check(p.received == p.sent && p.sent == 3, || {
            format!("ping {addr}: {} of {} answered", p.received, p.sent)
        });
        Ok(p)
    };
    let ping = ping_to(GEN_IP.to_string(), c)?;
    let ping6 = if st.family == Family::Ipv4 {
        String::new()
    } else {
        let p6 = ping_to(GEN_IP6.to_string(), c)?;
        format!(" ping6={}/{}", p6.received, p6.sent)
    };

    // The CPU -> rx queue map the suite predicts for the topology (and the
    // module builds its rx_cpu_rmap from) is the guest's own: the affinity
    // of each rx queue's interrupt, as virtio_net spread them.
    let irq_map = irq_cpu_queue_map(s, pairs)?;
    let predicted_map: BTreeMap<usize, usize> = s.cpu_q.iter().copied().enumerate().collect();
    c.check(irq_map == predicted_map, || {
        format!(
            "CPU -> rx queue by the guest's interrupt affinity {irq_map:?}, the suite predicts {predicted_map:?} ({} pairs, {} CPUs)",
            pairs, st.cpus
        )
    });

    // 64 flows by RSS alone (RFS is not set up yet: no steering).
    let flows = s.make_flows(st.flows);
    let mut predicted = vec![0u64; usize::from(st.queues)];
    for f in &flows {
        predicted[f.rss_q] += u64::from(st.link_packets);
    }
    s.udp_start(&flows)?;
    let before = s.guest.ctl.stats()?;
    let total = u64::from(st.link_packets) * flows.len() as u64;
    let ids = s.gen_sets_for(&flows, st.rate, u64::from(st.link_packets))?;
    let send_time = Duration::from_secs_f64(total as f64 / f64::from(st.rate.max(1)));
    let ctl = &mut s.guest.ctl;
    wait_for(
        send_time * 3 + Duration::from_secs(30),
        "the generator to send every packet",
        || {
            let l = ctl.gen_list()?;
            let active = l.iter().any(|set| ids.contains(&set.id) && set.active);
            Ok((!active).then_some(()))
        },
    )?;
    // Let the guest drain its rings.
    let agent = &mut s.guest.agent;
    let mut last = 0;
    let got = wait_for(
        Duration::from_secs(20),
        "the guest to receive the link packets",
        || {
            let now: UdpStats = agent.req(Request::UdpStats)?;
            let n: u64 = now.flows.iter().map(|f| f.packets).sum();
            let done = n == total || (n == last && n > 0);
            last = n;
            Ok(done.then_some(n))
        },
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let after = s.guest.ctl.stats()?;
    let stop: UdpStats = s.guest.agent.req(Request::UdpStop)?;
    for id in ids {
        s.guest.ctl.gen_stop(Some(id))?;
    }

    let mut per_q = Vec::new();
    for (q, &pred) in predicted.iter().enumerate() {
        let d = |k: fn(&QueueStats) -> u64| k(&after.queues[q]) - k(&before.queues[q]);
        let rss = d(|q| q.rx_rss);
        let drops = d(|q| q.rx_drops);
        per_q.push(rss);
        if q >= usize::from(pairs) {
            c.check(rss + drops == 0, || {
                format!("rx queue {q} is not in use ({pairs} pairs) but got {rss} RSS deliveries (+{drops} drops)")
            });
            continue;
        }
        c.check(rss > 0, || format!("rx queue {q} received nothing"));
        // Every packet of a flow goes to the queue Rss predicts for it
        // (a few stray ARP frames may come on top).
        c.check(rss + drops >= pred && rss <= pred + 4, || {
            format!(
                "rx queue {q}: {rss} RSS deliveries (+{drops} drops), arfs::Rss predicts {pred}"
            )
        });
        c.check(d(|q| q.rx_filter) == 0, || {
            format!("rx queue {q}: filter deliveries before any filter existed")
        });
    }
    // The same from the guest's side: each flow's packets arrived on the
    // queue RSS predicts, as the guest kernel saw it (SO_INCOMING_NAPI_ID
    // through the NAPI -> queue map). This also checks that map, which the
    // steering scenarios' guest-side checks rely on.
    let napi: RxQueueNapi = s.guest.agent.req(Request::RxQueueNapi {
        ifname: IFNAME.into(),
    })?;
    let map = napi_queues(&napi);
    let mut guest_ok = 0;
    for (f, got) in flows.iter().zip(&stop.flows) {
        let by_q = queue_delta(&got.by_napi, &[], got.napi_unknown, &map);
        let on = by_q.get(&f.rss_q).copied().unwrap_or(0);
        let fine = got.packets > 0 && on * 100 >= got.packets * 95;
        guest_ok += usize::from(fine);
        c.check(fine, || {
            format!(
                "flow :{}: RSS predicts q{}; the guest saw its {} packets arrive on {} (NAPI map {}: {:?})",
                f.local_port,
                f.rss_q,
                got.packets,
                fmt_queues(&by_q),
                napi.source,
                napi.napi
            )
        });
    }
    let lost = total - stop.flows.iter().map(|f| f.packets).sum::<u64>();
    c.check(lost * 100 <= total, || {
        format!("guest received {got} of {total} packets")
    });
    let mq = stats.enabled_pairs;
    Ok(format!(
        "topology={} family={} mq={mq} cpu->q={:?} rxq={} ping={}/{}{ping6} rss_per_q={per_q:?} predicted={predicted:?} lost={lost} guest_saw_rss_q={guest_ok}/{} (napi map: {})",
        st.topology(),
        st.family,
        s.cpu_q,
        eth.rx_queues,
        ping.received,
        ping.sent,
        flows.len(),
        napi.source
    ))
}

pub(super) fn steer(s: &mut Session, c: &mut Checks) -> Result<String> {
    if !s.flows.is_empty() {
        bail!("steer must run on a fresh workload (run it before migrate/expiry)");
    }
    let warm = s.setup_steering()?;
    let w = s.measure()?;
    // Every packet of a steered flow on its filter's queue, as the guest saw it.
    let fig = s.check_window_bar(&w, c, 1.0);
    let delivery = s.check_delivery(c)?;
    let order = s.check_order(c)?;
    let from: Vec<Option<usize>> = s
        .flows
        .iter()
        .map(|f| f.needs_filter().then_some(f.rss_q))
        .collect();
    let effect = s.check_effect(c, &from)?;
    let traced = s.check_trace(c)?;
    let trace = s.trace_since_mark()?;
    let steered: Vec<&Flow> = s.flows.iter().filter(|f| f.needs_filter()).collect();
    let adds: Vec<&TraceRecord> = trace.iter().filter(|r| r.event == EventKind::Add).collect();
    let replaces = trace
        .iter()
        .filter(|r| r.event == EventKind::Replace)
        .count();
    let rejects: Vec<&TraceRecord> = trace
        .iter()
        .filter(|r| r.event == EventKind::Reject)
        .collect();
    for f in &steered {
        c.check(
            adds.iter()
                .any(|r| r.flow == Some(f.key) && r.rxq.map(usize::from) == Some(f.rx_q)),
            || {
                format!(
                    "no ADD in the trace for flow :{} (rss q{} -> q{} of cpu{})",
                    f.local_port, f.rss_q, f.rx_q, f.cpu
                )
            },
        );
    }
    for f in s.flows.iter().filter(|f| !f.needs_filter()) {
        c.check(!adds.iter().any(|r| r.flow == Some(f.key)), || {
            format!(
                "ADD for flow :{} although RSS already delivers it to q{}, local to cpu{}",
                f.local_port, f.rx_q, f.cpu
            )
        });
    }
    let pairs = usize::from(s.pairs);
    for r in adds
        .iter()
        .filter(|r| r.rxq.is_some_and(|q| usize::from(q) >= pairs))
    {
        c.check(false, || {
            format!(
                "ADD to rx queue {:?}, which is not in use ({pairs} pairs): {r:?}",
                r.rxq
            )
        });
    }
    c.check(rejects.is_empty(), || {
        format!(
            "{} rejects in the trace, first: {:?}",
            rejects.len(),
            rejects.first()
        )
    });
    // Live flows keep their filters (rps_may_expire_flow says "active"),
    // but for the kernel's race on a just-granted filter (reported).
    let (fresh, dels) = split_dels(&trace);
    c.check(dels == 0, || {
        format!("{dels} filters of live flows were deleted during steer")
    });
    s.guest.collect("steer", Some(module::DEBUGFS_DIR));
    let v6 = |f: &Flow| f.key.src_ip().is_ipv6();
    Ok(format!(
        "flows={} (ipv6 {}) steered={} (ipv6 {}) adds={} replaces={replaces} rejects={} fresh_expired=[{}] warmup={:.1}s {fig} pkts/flow~{} {delivery} {order} {effect} {traced}",
        s.flows.len(),
        s.flows.iter().filter(|f| v6(f)).count(),
        steered.len(),
        steered.iter().filter(|f| v6(f)).count(),
        adds.len(),
        rejects.len(),
        fresh.join(", "),
        warm.as_secs_f64(),
        w.packets.iter().sum::<u64>() / s.flows.len() as u64
    ))
}

pub(super) fn migrate(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.setup_steering()?;
    let before = s.device_filters()?;
    let had: BTreeSet<FlowKey> = s
        .flows
        .iter()
        .map(|f| f.key)
        .filter(|k| before.contains_key(k))
        .collect();
    s.trace_since_mark()?;
    // Every receiver moves to the next CPU.
    s.rotate_receivers()?;
    let warm = s.wait_steered(&had)?;
    std::thread::sleep(Duration::from_secs(1));
    let w = s.measure()?;
    let fig = s.check_window_bar(&w, c, 1.0);
    let delivery = s.check_delivery(c)?;
    let order = s.check_order(c)?;
    // The queue each flow left: its filter's before the move, else (an
    // ADD) its RSS queue; none where the kernel had nothing to move.
    let from: Vec<Option<usize>> = s
        .flows
        .iter()
        .map(|f| match before.get(&f.key) {
            Some(b) if b.1 != f.rx_q => Some(b.1),
            Some(_) => None,
            None => f.needs_filter().then_some(f.rss_q),
        })
        .collect();
    let effect = s.check_effect(c, &from)?;
    let traced = s.check_trace(c)?;
    let trace = s.trace_since_mark()?;
    let count = |k: EventKind| trace.iter().filter(|r| r.event == k).count();
    let (replaces, adds, rejects) = (
        count(EventKind::Replace),
        count(EventKind::Add),
        count(EventKind::Reject),
    );
    let mut kept = 0;
    for f in &s.flows {
        let cpu = Some(f.rx_q);
        // Several CPUs share a queue when there are fewer queues than
        // CPUs: a flow whose new CPU is local to the queue its filter
        // already names is where it should be, and the kernel does not ask.
        if before.get(&f.key).is_some_and(|b| b.1 == f.rx_q) {
            kept += 1;
            c.check(
                !trace
                    .iter()
                    .any(|r| r.flow == Some(f.key) && r.event != EventKind::Del),
                || {
                    format!(
                        "flow :{} moved to cpu{} whose queue q{} its filter already names, yet was reprogrammed",
                        f.local_port, f.cpu, f.rx_q
                    )
                },
            );
        } else if had.contains(&f.key) {
            c.check(
                trace.iter().any(|r| {
                    r.event == EventKind::Replace
                        && r.flow == Some(f.key)
                        && r.rxq.map(usize::from) == cpu
                }),
                || {
                    format!(
                        "flow :{} had a filter but no REPLACE to q{} is in the trace",
                        f.local_port, f.rx_q
                    )
                },
            );
        } else if f.needs_filter() {
            c.check(
                trace.iter().any(|r| {
                    r.event == EventKind::Add
                        && r.flow == Some(f.key)
                        && r.rxq.map(usize::from) == cpu
                }),
                || {
                    format!(
                        "flow :{} (no filter before) has no ADD to q{} in the trace",
                        f.local_port, f.rx_q
                    )
                },
            );
        }
    }
    c.check(rejects == 0, || format!("{rejects} rejects in the trace"));
    let (fresh, dels) = split_dels(&trace);
    c.check(dels == 0, || {
        format!("{dels} filters of live flows were deleted during migrate")
    });
    Ok(format!(
        "moved={} re-steered={} kept={kept} replaces={replaces} adds={adds} rejects={rejects} fresh_expired=[{}] warmup={:.1}s {fig} {delivery} {order} {effect} {traced}",
        s.flows.len(),
        had.len() - kept,
        fresh.join(", "),
        warm.as_secs_f64()
    ))
}

pub(super) fn expiry(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.setup_steering()?;
    let live_before = s.device_filters()?;
    let ids: BTreeSet<u64> = live_before.values().map(|&(id, _, _)| id).collect();
    ensure!(!ids.is_empty(), "no filters to expire");
    s.trace_since_mark()?;
    let bound = s.settings.module.expiry_bound(ids.len());
    // The flows stop; the receivers stay (sockets open, threads idle).
    // rps_may_expire_flow counts packets, so on idle CPUs only the
    // module's idle backstop can delete these filters: it is switched on
    // once no frame is in flight any more (it was off while the flows
    // ran, see ModuleParams). Switched on earlier, it deletes filters of
    // flows whose last frames are still arriving, and those frames make
    // the kernel steer (ADD) the flows again.
    let delivery = s.delivery_window(c, false)?;
    s.guest.ctl.gen_stop(None)?;
    s.gen_running = false;
    s.gen_sets.clear();
    s.delivery_mark = None;
    s.wait_rx_quiet()?;
    s.guest.agent.write_file(
        &module::expiry_param(),
        &module::idle_expiry(s.settings.module.idle_timeout_ms),
    )?;
    let t0 = Instant::now();
    let ctl = &mut s.guest.ctl;
    let emptied = wait_for(
        bound + Duration::from_secs(30),
        "the device table to empty",
        || {
            let t = ctl.table()?;
            Ok((t.live == 0).then(|| t0.elapsed()))
        },
    );
    let took = match emptied {
        Ok(t) => t,
        Err(e) => {
            c.check(false, || format!("{e}"));
            t0.elapsed()
        }
    };
    c.check(took <= bound, || {
        format!(
            "the table emptied after {:.1}s, over the configured bound {:.1}s",
            took.as_secs_f64(),
            bound.as_secs_f64()
        )
    });
    // Let the last ACKs reach the module before comparing counters.
    std::thread::sleep(Duration::from_secs(1));
    let trace = s.trace_since_mark()?;
    let dels: Vec<&TraceRecord> = trace.iter().filter(|r| r.event == EventKind::Del).collect();
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    for r in &dels {
        *by_reason
            .entry(r.reason.clone().unwrap_or_default())
            .or_default() += 1;
    }
    for id in &ids {
        c.check(
            dels.iter().any(|r| r.id.map(u64::from) == Some(*id)),
            || format!("filter {id} was never deleted"),
        );
    }
    let table = s.guest.ctl.table()?;
    c.check(table.live == 0, || {
        format!("device table not empty: {:?}", table.filters)
    });
    // Module and device agree exactly.
    let stats = s.guest.ctl.stats()?;
    let m = s.module_counters()?;
    s.guest
        .art
        .write_json("expiry-module-counters.json", &m.raw);
    let dev_adds = stats.table.adds + stats.table.replaces;
    let agree = m.compare(&stats, None);
    for msg in &agree {
        c.failures.push(msg.clone());
    }
    s.guest.collect("expiry", Some(module::DEBUGFS_DIR));
    // The workload is over (its generator stopped above): the next shared
    // scenario starts its own, with a fresh delivery mark.
    s.guest
        .agent
        .call_value(&Request::UdpStop, Duration::from_secs(30))?;
    s.flows.clear();
    Ok(format!(
        "filters={} emptied_in={:.1}s bound={:.1}s dels={} by_reason={by_reason:?} device_add_ops={dev_adds} module={} {delivery}",
        ids.len(),
        took.as_secs_f64(),
        bound.as_secs_f64(),
        dels.len(),
        m.summary()
    ))
}
