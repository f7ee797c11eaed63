//! Issue 45, item 5: a fault knob for the effect check and one for the
//! trace checks, each turned on in a scenario that passes only when the
//! guest-side check fails for exactly the flows the fault touched while
//! the device's own figures say all went well.
//!
//! - `delay-effect`: with `delay_effect_ms` on, every new filter is ACKed
//!   and traced at once but steers its hits by RSS for a while: the effect
//!   check (`effect.rs`, with the order check for a flow it skips) must
//!   name every flow that needed a filter, and no other.
//! - `wrong-trace`: with `wrong_trace` on, the receivers move (as in
//!   `migrate`) and each REPLACE line names the new queue as `prev_rxq`:
//!   the trace checks (`tracecheck.rs`) must name every flow whose filter
//!   moved, and no other.

use super::{Checks, Flow, Session};
use crate::harness::Result;
use std::collections::BTreeSet;
use std::time::Duration;

/// How long `delay-effect` keeps each new filter from taking effect: 16
/// of a flow's 31 datagrams a second, well past the effect check's bar
/// (one generator period and the slack, 51 ms).
const DELAY_MS: u32 = 500;

/// The flows (guest ports) the failure lines name: `flow :P:` (the
/// guest-side checks) or `of flow :P ` (the trace's replay).
fn named_ports(lines: &[String]) -> BTreeSet<u16> {
    lines
        .iter()
        .filter_map(|l| {
            let i = l.find("flow :")? + "flow :".len();
            let digits: String = l[i..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Fails `c` unless `named` is exactly `want`; returns the report's words.
fn exactly(c: &mut Checks, check: &str, named: &BTreeSet<u16>, want: &BTreeSet<u16>) -> String {
    let missed: Vec<&u16> = want.difference(named).collect();
    let extra: Vec<&u16> = named.difference(want).collect();
    c.check(missed.is_empty(), || {
        format!("{check} did not name flows {missed:?}, which the fault touched")
    });
    c.check(extra.is_empty(), || {
        format!("{check} named flows {extra:?}, which the fault did not touch")
    });
    format!(
        "{check} named {}/{} affected flows",
        named.intersection(want).count(),
        want.len()
    )
}

/// The device's table has every flow `which` picks on its receiver's
/// queue: failures to `c`.
fn filters_in_place(s: &mut Session, c: &mut Checks, which: impl Fn(&Flow) -> bool) -> Result<()> {
    let table = s.device_filters()?;
    for f in s.flows.iter().filter(|f| which(f)) {
        c.check(table.get(&f.key).is_some_and(|t| t.1 == f.rx_q), || {
            format!(
                "flow :{}: the device's table has {:?}, not a filter to q{}",
                f.local_port,
                table.get(&f.key),
                f.rx_q
            )
        });
    }
    Ok(())
}

/// `delay-effect`: see the module's doc.
pub(super) fn delay_effect(s: &mut Session, c: &mut Checks) -> Result<String> {
    let before = s.guest.ctl.stats()?;
    s.guest.ctl.set("delay_effect_ms", DELAY_MS)?;
    let run = s.fault_workload();
    let off = s.guest.ctl.set("delay_effect_ms", 0);
    run?;
    off?;
    // Nothing lost, doubled or altered: the delivery check must pass. The
    // generator stays paused: the device's figures below are still.
    let delivery = s.delivery_window(c, false)?;
    let mut probe = Checks::default();
    let order = s.check_order(&mut probe)?;
    let from: Vec<Option<usize>> = s
        .flows
        .iter()
        .map(|f| f.needs_filter().then_some(f.rss_q))
        .collect();
    let effect = s.check_effect(&mut probe, &from)?;
    let after = s.guest.ctl.stats()?;

    // The device's own figures: every filter where it should be, every
    // hit counted as delivered by a filter.
    filters_in_place(s, c, Flow::needs_filter)?;
    let table = s.device_filters()?;
    let want: BTreeSet<u16> = s
        .flows
        .iter()
        .filter(|f| f.needs_filter())
        .map(|f| f.local_port)
        .collect();
    let d = |g: fn(&vnic_ctl_proto::Stats) -> u64| g(&after).saturating_sub(g(&before));
    let hits: u64 = table.values().map(|t| t.2).sum();
    let rx_filter: u64 = after
        .queues
        .iter()
        .zip(&before.queues)
        .map(|(a, b)| a.rx_filter.saturating_sub(b.rx_filter))
        .sum();
    let delayed = d(|s| s.peer.fault_delayed);
    c.check(rx_filter == hits && delayed > 0 && delayed < hits, || {
        format!(
            "the device's figures: {hits} filter hits, {rx_filter} filter deliveries, peer.fault_delayed +{delayed} (want every hit delivered by a filter, some delayed)"
        )
    });
    let named = named_ports(&probe.failures);
    let verdict = exactly(c, "the effect and order checks", &named, &want);
    Ok(format!(
        "delay_effect_ms={DELAY_MS}: {verdict}, device hits={hits} rx_filter=+{rx_filter} fault_delayed=+{delayed} (blind); {delivery} {order} {effect}; e.g. {}",
        probe.failures.first().cloned().unwrap_or_default()
    ))
}

/// `wrong-trace`: see the module's doc.
pub(super) fn wrong_trace(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.fault_workload()?;
    let before = s.device_filters()?;
    let had: BTreeSet<arfs::FlowKey> = before.keys().copied().collect();
    let traced0 = s.guest.ctl.stats()?.mgmt.wrong_traced;
    s.guest.ctl.set("wrong_trace", 1)?;
    let run = (|| {
        s.rotate_receivers()?;
        s.wait_steered(&had)?;
        std::thread::sleep(Duration::from_secs(1));
        s.delivery_window(c, false)
    })();
    let off = s.guest.ctl.set("wrong_trace", 0);
    let delivery = run?;
    off?;
    let falsified = s.guest.ctl.stats()?.mgmt.wrong_traced - traced0;
    // The flows whose filter the move took to another queue.
    let want: BTreeSet<u16> = s
        .flows
        .iter()
        .filter(|f| before.get(&f.key).is_some_and(|b| b.1 != f.rx_q))
        .map(|f| f.local_port)
        .collect();
    // The device's own figures: every filter where the guest wants it.
    filters_in_place(s, c, |f| had.contains(&f.key))?;
    c.check(falsified as usize >= want.len() && !want.is_empty(), || {
        format!(
            "mgmt.wrong_traced +{falsified} for {} flows re-steered to another queue",
            want.len()
        )
    });
    let mut probe = Checks::default();
    let traced = s.check_trace(&mut probe)?;
    let named = named_ports(&probe.failures);
    let verdict = exactly(c, "the trace checks", &named, &want);
    Ok(format!(
        "wrong_trace=1: {verdict}, device wrong_traced=+{falsified}; {delivery} {traced}; e.g. {}",
        probe
            .failures
            .iter()
            .find(|l| l.contains("prev_rxq"))
            .or(probe.failures.first())
            .cloned()
            .unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_lines_name_their_flows() {
        let lines = [
            "flow :20003: a frame sent 480.2 ms after its move".to_string(),
            "line 77: REPLACE of flow :20011 names its predecessor".to_string(),
            "the guest's error counters moved".to_string(),
            "flow :20003: 2 late datagrams".to_string(),
        ];
        assert_eq!(
            named_ports(&lines),
            [20003u16, 20011].into_iter().collect::<BTreeSet<_>>()
        );
        let mut c = Checks::default();
        let want: BTreeSet<u16> = [20003, 20004].into_iter().collect();
        let w = exactly(&mut c, "x", &named_ports(&lines), &want);
        assert_eq!(c.failures.len(), 2, "{:?}", c.failures);
        assert!(w.contains("1/2"), "{w}");
    }
}
