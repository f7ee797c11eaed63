//! Faults group: the guest module as a driver under the conditions the
//! other fault scenarios create (issue 46). Each scenario reproduces one
//! path on which a driver can lose track of what the device holds, and
//! asserts what a real driver keeps: the device's table and the module's
//! agree, and the flows stay steered, seen from the guest.
//!
//! - `rebind`: a second station answers the keepalive HELLO with the
//!   right nonce from another address; the bound session must refuse it.
//! - `lost-ack-resteer`: the ACK of an applied ADD is lost, then the
//!   flow's re-steer is refused; no filter may be left on the device that
//!   the module does not know (an orphan).
//! - `reset-after-flush`: the ACK of the attach FLUSH is lost, later
//!   frames are acknowledged, then the link goes down and up (a window
//!   reset); the FLUSH the device already applied must not be sent again.
//! - `holdoff`: re-steers are refused and the flows move twice within the
//!   refusal hold-off; under the default `rps` expiry no live flow may
//!   lose its filter.
//! - `ntuple-toggle`: NTUPLE off and straight back on with the table 75%
//!   full; every flow is steered again within 5 s.
//! - `spoof-mgmt`: forged ACKs from the device's own address, of another
//!   generation (a replay, and a copy for another host): programming goes
//!   on without a resync, each forgery counted.
//! - `params`: out-of-range parameter writes are refused, `modinfo` shows
//!   the ranges.

use super::{table_of, DevTable, REJECT_HOLDOFF};
use crate::ensure;
use crate::harness::{settle, wait_for, Result};
use crate::module::PARAMS_DIR;
use crate::proto::Request;
use crate::scenarios::{Checks, Session, IFNAME};
use arfs::{EventKind, FlowKey, TraceRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The retransmit timeout the lost-ACK scenarios give the module: long
/// enough that what they do between the lost ACK and its retransmission
/// (a migration and its refused re-steer, or a link flap and the resync)
/// is over before the retransmission recovers the ACK.
const SLOW_RETRANSMIT_MS: u32 = 4000;

/// How long the module may take to re-steer every flow after NTUPLE is
/// back on (issue 46: "within 5 s").
const NTUPLE_RESTEER: Duration = Duration::from_secs(5);

/// The module's table and the device's, entry for entry (ids, flows,
/// queues): what differs, as a finding, or `None` when they agree.
pub(in crate::scenarios) fn tables_differ(module: &DevTable, device: &DevTable) -> Option<String> {
    if module == device {
        return None;
    }
    let only_m: Vec<String> = module
        .iter()
        .filter(|(k, v)| device.get(k) != Some(v))
        .map(|(id, (f, q))| format!("{id}:{f}->q{q}"))
        .collect();
    let only_d: Vec<String> = device
        .iter()
        .filter(|(k, v)| module.get(k) != Some(v))
        .map(|(id, (f, q))| format!("{id}:{f}->q{q}"))
        .collect();
    Some(format!(
        "module ({}) and device ({}) tables differ: module only {only_m:?}, device only (orphans) {only_d:?}",
        module.len(),
        device.len()
    ))
}

/// DELs of the trace that took a filter from one of `flows` for a reason
/// the module gave (not a FLUSH): the filters a live flow lost.
pub(in crate::scenarios) fn dels_of_live_flows<'a>(
    trace: &'a [TraceRecord],
    flows: &BTreeSet<FlowKey>,
) -> Vec<&'a TraceRecord> {
    trace
        .iter()
        .filter(|r| r.event == EventKind::Del)
        .filter(|r| r.flow.is_some_and(|k| flows.contains(&k)))
        .filter(|r| r.reason.as_deref() != Some("flush") && r.reason.as_deref() != Some("unload"))
        .collect()
}

impl Session {
    /// The module's filters (every state) as a [`DevTable`] and the
    /// device's, once the module has nothing in flight.
    fn settled_tables(&mut self) -> Result<(DevTable, DevTable)> {
        self.module_settled(Duration::from_secs(30))?;
        let m: DevTable = self
            .module_filters()?
            .iter()
            .map(|(id, f)| (*id, (f.flow, f.rxq)))
            .collect();
        let d = table_of(&self.guest.ctl.table()?)?;
        Ok((m, d))
    }

    /// Load the module with `extra` parameters on top of the suite's.
    fn load_module_with(&mut self, extra: &str) -> Result<()> {
        let saved = self.settings.module.extra.clone();
        self.settings.module.extra = format!("{saved} {extra}");
        let r = self.ensure_module();
        self.settings.module.extra = saved;
        r
    }

    fn set_param(&mut self, name: &str, value: &str) -> Result<()> {
        self.guest
            .agent
            .write_file(&format!("{PARAMS_DIR}/{name}"), value)
    }

    /// Run `argv` (busybox applets) in the guest; an error unless it
    /// exits 0. Returns its stdout.
    fn exec_ok(&mut self, argv: &[&str]) -> Result<String> {
        let r: crate::proto::ExecResult = self.guest.agent.req(Request::Exec {
            argv: argv.iter().map(|a| (*a).to_string()).collect(),
            timeout_ms: 10_000,
        })?;
        ensure!(
            r.status == Some(0) && !r.timed_out,
            "{argv:?}: status {:?}{}: {}",
            r.status,
            if r.timed_out { " (timed out)" } else { "" },
            r.stderr.trim()
        );
        Ok(r.stdout)
    }

    pub(in crate::scenarios) fn set_ntuple(&mut self, on: bool) -> Result<bool> {
        self.guest.agent.req(Request::SetFeature {
            ifname: IFNAME.into(),
            feature: "rx-ntuple-filter".into(),
            on,
        })
    }
}

/// `rebind`: once bound, a CAPS that echoes the nonce from another address
/// is refused and counted; the session and the steering go on with the
/// device, and no driver frame is addressed to the other station.
pub(in crate::scenarios) fn rebind(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let d0 = s.guest.ctl.stats()?;
    s.guest.ctl.set("rogue_responder", 1)?;
    s.guest.ctl.set("rogue_nonce", 1)?;
    // Idle: the module's keepalive HELLO (every 2 s without a device
    // frame) meets the rogue's CAPS, which comes first.
    let m0 = s.module_counters()?;
    let hellos = wait_for(
        Duration::from_secs(15),
        "two keepalive HELLOs answered while the rogue is on",
        || {
            let st = s.guest.ctl.stats()?;
            let caps = super::dev_delta(&st, &d0, |s| s.mgmt.caps_sent);
            Ok((caps >= 2).then_some(caps))
        },
    )?;
    let flows = s.steering_flows(16)?;
    s.fault_start(flows)?;
    let steered = s.wait_steered(&BTreeSet::new());
    let w = s.measure();
    s.guest.ctl.set("rogue_responder", 0)?;
    s.guest.ctl.set("rogue_nonce", 0)?;
    steered?;
    s.check_window(&w?, c);
    let m = s.module_counters()?;
    let d1 = s.guest.ctl.stats()?;
    let to_other = super::dev_delta(&d1, &d0, |s| s.mgmt.dst.to_other);
    let rebind = m.get("rx_rebind");
    c.check(m.has("rx_rebind") && rebind >= 1, || {
        format!("the rogue's CAPS with the right nonce was not refused as a rebind (rx_rebind {rebind}, {hellos} CAPS answered)")
    });
    c.check(to_other == 0, || {
        format!("{to_other} driver frames went to another address than the device: the session was rebound")
    });
    let stalls = super::delta(&m, &m0, "stalls");
    c.check(stalls == 0, || {
        format!("{stalls} stalls: the rogue disturbed the session")
    });
    Ok(format!(
        "caps_answered={hellos} rx_rebind={rebind} frames_to_other={to_other} stalls={stalls}"
    ))
}

/// `lost-ack-resteer`: ADD(X -> q1) applied, its ACK lost; the flow moves
/// and its re-steer ADD(X -> q2) is refused before the first ADD is
/// retransmitted. The device keeps X -> q1: so must the module.
pub(in crate::scenarios) fn lost_ack_resteer(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    s.set_param("retransmit_ms", &SLOW_RETRANSMIT_MS.to_string())?;
    let flows = s.steering_flows(16)?;
    let need: BTreeSet<FlowKey> = flows
        .iter()
        .filter(|f| f.needs_filter())
        .map(|f| f.key)
        .collect();
    ensure!(!need.is_empty(), "no flow of the workload needs a filter");
    s.guest.ctl.set("drop_acks", 1)?;
    let t0 = Instant::now();
    s.fault_start(flows)?;
    // The first ADD frame is applied (its ACK lost): its filters are on
    // the device, the module still waits for the ACK.
    let applied = wait_for(
        Duration::from_secs(2),
        "the device to apply the first ADD (its ACK lost)",
        || {
            let st = s.guest.ctl.stats()?;
            let have = s.device_filters()?;
            Ok((st.mgmt.replies_dropped_by_loss >= 1 && !have.is_empty()).then_some(have.len()))
        },
    )?;
    s.guest.ctl.set("add_fail_rate", 1.0)?;
    s.rotate_receivers()?;
    // The re-steers go out and are refused; then the first ADD's
    // retransmission brings its ACK (the device's cached reply).
    let rejected = wait_for(
        Duration::from_secs(3),
        "the device to refuse a re-steer",
        || {
            let st = s.guest.ctl.stats()?;
            Ok((st.table.rejects.injected_failure >= 1)
                .then_some(st.table.rejects.injected_failure))
        },
    )?;
    let before_rto = t0.elapsed() < Duration::from_millis(u64::from(SLOW_RETRANSMIT_MS));
    s.guest.ctl.set("add_fail_rate", 0.0)?;
    std::thread::sleep(Duration::from_millis(u64::from(SLOW_RETRANSMIT_MS)));
    let (m, d) = s.settled_tables()?;
    if let Some(e) = tables_differ(&m, &d) {
        c.check(false, || e);
    }
    s.set_param("retransmit_ms", "200")?;
    Ok(format!(
        "first_frame_filters={applied} refused_resteers={rejected} refused_before_retransmit={before_rto} module_filters={} device_filters={}",
        m.len(),
        d.len()
    ))
}

/// `reset-after-flush`: the attach FLUSH is applied but its ACK lost; the
/// workload's ADDs are acknowledged; the link goes down and up, so the
/// module resyncs and resets its window. The FLUSH is older than an
/// acknowledged frame: applied, never to be sent again.
pub(in crate::scenarios) fn reset_after_flush(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.guest.ctl.set("drop_acks", 1)?;
    s.load_module_with(&format!("retransmit_ms={SLOW_RETRANSMIT_MS}"))?;
    let t0 = Instant::now();
    let flows = s.steering_flows(16)?;
    s.fault_start(flows)?;
    s.wait_steered(&BTreeSet::new())?;
    let d0 = s.guest.ctl.stats()?;
    ensure!(
        d0.mgmt.replies_dropped_by_loss >= 1,
        "the FLUSH's ACK was not dropped (replies_dropped_by_loss 0)"
    );
    let m0 = s.module_counters()?;
    // The link flap (NETDEV_UP: the module checks the device's
    // generation with a HELLO and restarts its window), with the
    // generator paused: frames sent while the link is down are dropped.
    s.fault_stop_gen()?;
    s.wait_rx_quiet()?;
    s.exec_ok(&[
        "sh",
        "-c",
        &format!("ip link set {IFNAME} down && ip link set {IFNAME} up"),
    ])?;
    let before_rto = t0.elapsed() < Duration::from_millis(u64::from(SLOW_RETRANSMIT_MS));
    s.ensure_net()?;
    s.fault_start_gen()?;
    std::thread::sleep(Duration::from_secs(2));
    let m1 = s.module_counters()?;
    let d1 = s.guest.ctl.stats()?;
    let flushes = super::dev_delta(&d1, &d0, |s| s.table.flushes);
    c.check(flushes == 0, || {
        format!("the device applied {flushes} FLUSH(es) after the link flap: the module sent again a FLUSH the device had applied")
    });
    let (modt, devt) = s.settled_tables()?;
    if let Some(e) = tables_differ(&modt, &devt) {
        c.check(false, || e);
    }
    // The flows are still steered, seen from the guest.
    let window = s.measure()?;
    s.check_window(&window, c);
    Ok(format!(
        "flap_before_retransmit={before_rto} hellos={} flushes_after_flap={flushes} module_filters={} device_filters={}",
        super::delta(&m1, &m0, "hellos"),
        modt.len(),
        devt.len()
    ))
}

/// `holdoff`: every ADD refused while the flows move twice within the
/// refusal hold-off. The second move's steer call meets the hold-off; the
/// kernel never records that call's slot, so a module that takes it as
/// its filter's slot finds the filter expired and deletes it although the
/// flow is live. Under `rps` no flow may lose its filter.
pub(in crate::scenarios) fn holdoff(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let flows = s.steering_flows(16)?;
    s.fault_start(flows)?;
    s.wait_steered(&BTreeSet::new())?;
    let live: BTreeSet<FlowKey> = s.device_filters()?.keys().copied().collect();
    ensure!(!live.is_empty(), "no flow got a filter");
    let m0 = s.module_counters()?;
    let _ = s.trace_since_mark()?;
    s.guest.ctl.set("add_fail_rate", 1.0)?;
    s.rotate_receivers()?;
    // The re-steers are refused (hold-off starts), then the second move
    // well within it.
    std::thread::sleep(REJECT_HOLDOFF / 3);
    s.rotate_receivers()?;
    // Several expiry passes (100 ms each) with the flows live.
    std::thread::sleep(Duration::from_secs(3));
    s.guest.ctl.set("add_fail_rate", 0.0)?;
    let trace = s.trace_since_mark()?;
    let m1 = s.module_counters()?;
    let lost = dels_of_live_flows(&trace, &live);
    c.check(lost.is_empty(), || {
        let shown: Vec<String> = lost
            .iter()
            .take(6)
            .map(|r| {
                format!(
                    "id {} :{} ({})",
                    r.id.unwrap_or(u16::MAX),
                    r.flow.map_or(0, |k| k.dst_port()),
                    r.reason.as_deref().unwrap_or("?")
                )
            })
            .collect();
        format!(
            "{} live flows lost their filter while their re-steers were held off: {}",
            lost.len(),
            shown.join(", ")
        )
    });
    let dev = s.device_filters()?;
    let kept = live.iter().filter(|k| dev.contains_key(k)).count();
    c.check(kept == live.len(), || {
        format!("{kept} of {} flows still have a filter", live.len())
    });
    let refused = super::delta(&m1, &m0, "resteer_rejected");
    let held = super::delta(&m1, &m0, "busy_rejected");
    Ok(format!(
        "flows={} refused_resteers={refused} held_off_calls={held} lost_filters={} kept={kept}",
        live.len(),
        lost.len()
    ))
}

/// `ntuple-toggle`: NTUPLE off and on again while the DELs (or the FLUSH)
/// of "off" are still on their way, with 75% of the capacity live; every
/// flow must be steered again within [`NTUPLE_RESTEER`], seen from the
/// device's table and from the guest's queues.
pub(in crate::scenarios) fn ntuple_toggle(s: &mut Session, c: &mut Checks) -> Result<String> {
    const CAPACITY: u32 = 64;
    s.guest.ctl.set("table_capacity", CAPACITY)?;
    s.ensure_module()?;
    let flows = s.steering_flows(64)?;
    s.fault_start(flows)?;
    s.wait_steered(&BTreeSet::new())?;
    let live = s.guest.ctl.table()?.live;
    ensure!(
        live * 10 >= u64::from(CAPACITY) * 6,
        "only {live} of {CAPACITY} filters live: the scenario needs 60% or more"
    );
    // The device takes its time: "off"'s deletes are in flight when "on" comes.
    s.guest.ctl.set("program_latency", "1500ms")?;
    let d0 = s.guest.ctl.stats()?;
    let off = s.set_ntuple(false)?;
    ensure!(!off, "rx-ntuple-filter still on after turning it off");
    std::thread::sleep(Duration::from_millis(200));
    let on = s.set_ntuple(true)?;
    ensure!(on, "rx-ntuple-filter did not turn on again");
    let t_on = Instant::now();
    // The device applies "off" (a FLUSH, or a DEL per filter) 1.5 s after
    // it got it: until then the old filters steer, and a flow's filter in
    // the table says nothing about "on".
    let ctl = &mut s.guest.ctl;
    wait_for(
        NTUPLE_RESTEER,
        "the device to apply NTUPLE off's deletes",
        || {
            let st = ctl.stats()?;
            let flushed = super::dev_delta(&st, &d0, |x| x.table.flushes) >= 1
                || super::dev_delta(&st, &d0, |x| x.table.deletes.flush) >= live;
            Ok(flushed.then_some(()))
        },
    )?;
    // From here the device is quick again: what is judged is the module
    // asking again once "off" is applied, not the device's latency.
    s.guest.ctl.set("program_latency", 0)?;
    let warm = s.settings.warmup_timeout;
    s.settings.warmup_timeout = NTUPLE_RESTEER.saturating_sub(t_on.elapsed());
    let back = s.wait_steered(&BTreeSet::new());
    s.settings.warmup_timeout = warm;
    let resteer = t_on.elapsed();
    if let Err(e) = back {
        c.check(false, || {
            format!("not steered again within {NTUPLE_RESTEER:?} of NTUPLE on: {e}")
        });
    }
    let w = s.measure()?;
    s.check_window(&w, c);
    let m = s.module_counters()?;
    Ok(format!(
        "live_before={live}/{CAPACITY} resteered_in={:.1}s busy={} ntuple_flushes={} rfs_resets={}",
        resteer.as_secs_f64(),
        m.get("busy"),
        m.get("ntuple_flushes"),
        m.get("rfs_resets")
    ))
}

/// `spoof-mgmt`: with the device's `forge_acks` knob on, every ACK comes
/// with two forgeries from the device's address, one generation on: the
/// previous reply replayed, and the ACK for another host. Neither answers a
/// frame the module has in flight to it: programming goes on (filters, a
/// round of re-steers) with no resync beyond the keepalives, and every
/// forgery is counted (`rx_wrong_generation`, `rx_not_host`).
pub(in crate::scenarios) fn spoof_mgmt(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let m0 = s.module_counters()?;
    let d0 = s.guest.ctl.stats()?;
    let t0 = Instant::now();
    s.guest.ctl.set("forge_acks", 1)?;
    let flows = s.steering_flows(16)?;
    s.fault_start(flows)?;
    let programmed = s.wait_steered(&BTreeSet::new()).and_then(|_| {
        let had: BTreeSet<FlowKey> = s.device_filters()?.keys().copied().collect();
        s.rotate_receivers()?;
        s.wait_steered(&had)
    });
    s.guest.ctl.set("forge_acks", 0)?;
    let elapsed = t0.elapsed();
    programmed?;
    let window = s.measure()?;
    s.check_window(&window, c);
    // The last forgeries may still be on their way: read the module, then
    // the device, until the module has counted every forgery, or 2 s.
    let (m1, forged) = settle(Duration::from_secs(2), || {
        let m = s.module_counters()?;
        let d = s.guest.ctl.stats()?;
        let forged = super::dev_delta(&d, &d0, |s| s.mgmt.forged_sent);
        let counted = super::delta(&m, &m0, "rx_wrong_generation")
            + super::delta(&m, &m0, "rx_not_host")
            + super::delta(&m, &m0, "rx_stale");
        Ok(((m, forged), counted >= forged))
    })?;
    let wrong_gen = super::delta(&m1, &m0, "rx_wrong_generation");
    let not_host = super::delta(&m1, &m0, "rx_not_host");
    // A replayed CAPS (the previous reply may be one) is stale: no HELLO
    // of that seq is out.
    let stale = super::delta(&m1, &m0, "rx_stale");
    let hellos = super::delta(&m1, &m0, "hellos");
    let gen_changes = super::delta(&m1, &m0, "generation_changes");
    // Keepalives only: one per keepalive period (2 s) of silence at most,
    // up to the last read.
    let keepalives = t0.elapsed().as_secs() / 2 + 2;
    c.check(forged >= 2, || {
        format!("the device sent {forged} forgeries")
    });
    c.check(m1.has("rx_not_host") && not_host >= 1, || {
        format!("the copies for another host were not refused as such (rx_not_host {not_host}, {forged} forgeries)")
    });
    c.check(wrong_gen + not_host <= forged && forged <= wrong_gen + not_host + stale, || {
        format!("{forged} forgeries, the module counted rx_wrong_generation {wrong_gen} + rx_not_host {not_host} (+ rx_stale {stale})")
    });
    c.check(hellos <= keepalives, || {
        format!("{hellos} HELLOs in {:.1} s (keepalives: at most {keepalives}): forged ACKs started resyncs", t0.elapsed().as_secs_f64())
    });
    c.check(gen_changes == 0, || {
        format!("{gen_changes} generation changes: the device never restarted")
    });
    Ok(format!(
        "forged={forged} rx_wrong_generation={wrong_gen} rx_not_host={not_host} rx_stale={stale} hellos={hellos} in {:.1}s generation_changes={gen_changes}",
        elapsed.as_secs_f64()
    ))
}

/// A module parameter write the module must refuse (the value is out of
/// its range): `(name, value)`.
pub(in crate::scenarios) const OUT_OF_RANGE: &[(&str, &str)] = &[
    ("retransmit_ms", "0"),
    ("retransmit_ms", "4294967295"),
    ("interval_ms", "0"),
    ("interval_ms", "100000"),
    ("keepalive_ms", "4294967295"),
    ("hello_timeout_ms", "0"),
    ("reject_holdoff_ms", "4294967295"),
    ("expire_quota", "100000000"),
];

/// `params`: every writable parameter refuses values outside its range
/// (and keeps its value), and `modinfo` states each range.
pub(in crate::scenarios) fn params(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.ensure_module()?;
    let mut refused = 0;
    let mut before: BTreeMap<&str, String> = BTreeMap::new();
    for (name, _) in OUT_OF_RANGE {
        let v = s.guest.agent.read_file(&format!("{PARAMS_DIR}/{name}"))?;
        before.insert(name, v.trim().to_string());
    }
    for (name, value) in OUT_OF_RANGE {
        match s.set_param(name, value) {
            Err(_) => refused += 1,
            Ok(()) => c.check(false, || format!("{name}={value} was accepted")),
        }
        let now = s.guest.agent.read_file(&format!("{PARAMS_DIR}/{name}"))?;
        let was = &before[name];
        c.check(now.trim() == was, || {
            format!(
                "{name} is {} after the refused write of {value} (was {was})",
                now.trim()
            )
        });
    }
    let path = s.module_path.clone();
    let text = s.exec_ok(&["modinfo", "-F", "parm", &path])?;
    let names: std::collections::BTreeSet<&str> = OUT_OF_RANGE.iter().map(|(n, _)| *n).collect();
    for name in names {
        let line_has_range = text
            .lines()
            .any(|l| l.starts_with(&format!("{name}:")) && l.contains(".."));
        c.check(line_has_range, || {
            format!("modinfo shows no range for {name}")
        });
    }
    Ok(format!("refused={refused}/{}", OUT_OF_RANGE.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> FlowKey {
        format!("udp 10.0.2.1:10000 -> 10.0.2.15:{port}")
            .parse()
            .unwrap()
    }

    #[test]
    fn tables_agree_only_entry_for_entry() {
        let a: DevTable = [(1, (key(20000), 1)), (2, (key(20001), 2))].into();
        assert_eq!(tables_differ(&a, &a.clone()), None);
        let mut orphan = a.clone();
        orphan.insert(7, (key(20002), 3));
        let e = tables_differ(&a, &orphan).unwrap();
        assert!(e.contains("device only (orphans) [\"7:"), "{e}");
        let mut moved = a.clone();
        moved.insert(2, (key(20001), 0));
        assert!(tables_differ(&a, &moved).unwrap().contains("2:"));
        assert!(tables_differ(&a, &DevTable::new()).is_some());
    }

    #[test]
    fn only_module_deletes_of_the_flows_count_as_lost() {
        let rec = |port: u16, reason: &str| -> TraceRecord {
            serde_json::from_str(&format!(
                r#"{{"ts_ns":1,"event":"del","gen":1,"seq":1,"id":7,"rxq":1,"flow":{{"family":"ipv4","proto":"udp","src":"10.0.2.1","dst":"10.0.2.15","sport":10000,"dport":{port}}},"reason":"{reason}"}}"#
            ))
            .unwrap()
        };
        let trace = vec![
            rec(20000, "expired"),
            rec(20001, "flush"),
            rec(20002, "idle"),
            rec(20009, "expired"),
            rec(20003, "unload"),
        ];
        let flows: BTreeSet<FlowKey> = [20000, 20001, 20002, 20003].map(key).into();
        let lost = dels_of_live_flows(&trace, &flows);
        let ports: Vec<u16> = lost.iter().map(|r| r.flow.unwrap().dst_port()).collect();
        assert_eq!(ports, vec![20000, 20002]);
    }
}
