//! `handshake`: the module talks only to the device (aRFS/PROTOCOL.md,
//! "Ethernet header"). With the device's `rogue_responder` knob on, a
//! second station answers every HELLO first, with a CAPS that does not echo
//! the HELLO's nonce, and sends a copy of every ACK from its own address.
//! The module must ignore and count both, attach and steer as usual, and
//! never broadcast: the device sees HELLOs only on the link-local group and
//! every other frame unicast to itself.

use super::super::{Checks, Session};
use super::dev_delta;
use crate::harness::{settle, Result};
use std::time::Duration;

/// How long the module may take to count the rogue's last frames once it is
/// off (they are in flight for milliseconds; a TCG guest under load can
/// hold them in its rx path for tens).
const SETTLE: Duration = Duration::from_secs(2);

pub(in crate::scenarios) fn handshake(s: &mut Session, c: &mut Checks) -> Result<String> {
    let d0 = s.guest.ctl.stats()?;
    s.guest.ctl.set("rogue_responder", 1)?;
    let steered = steer_with_a_rogue(s, c);
    s.guest.ctl.set("rogue_responder", 0)?;
    steered?;
    // The rogue is off: it sends nothing more, but what it sent just before
    // (a CAPS for the module's keepalive HELLO, every ~2 s) may still be on
    // its way. Each round reads the module, then the device: every frame
    // the module counted was sent before the device's read, so the lower
    // bound holds on any round and the module may take ACKs only the later
    // read counts. Rounds go on until the module has accounted for every
    // rogue frame (the upper bound), or for SETTLE: a frame still missing
    // after that was not counted.
    let (m, d1) = settle(SETTLE, || {
        // A fresh module (the scenario's setup unloaded it): its counters
        // started at zero with the rogue already answering.
        let m = s.module_counters()?;
        let d1 = s.guest.ctl.stats()?;
        let rogue = dev_delta(&d1, &d0, |s| s.mgmt.rogue_sent);
        let counted = m.get("rx_bad_nonce") + m.get("rx_foreign") + m.get("rx_stale");
        Ok(((m, d1), rogue <= counted))
    })?;

    let bad_nonce = m.get("rx_bad_nonce");
    let foreign = m.get("rx_foreign");
    let stale = m.get("rx_stale");
    let rogue = dev_delta(&d1, &d0, |s| s.mgmt.rogue_sent);
    let dev_acks =
        dev_delta(&d1, &d0, |s| s.mgmt.acks_sent) + dev_delta(&d1, &d0, |s| s.mgmt.naks_sent);
    let mod_acks = m.get("acks");
    c.check(bad_nonce >= 1, || {
        format!("the rogue CAPS (wrong nonce) was not counted: rx_bad_nonce {bad_nonce}, rogue frames {rogue}")
    });
    c.check(foreign >= 1, || {
        format!("the rogue ACKs (another address) were not counted: rx_foreign {foreign}, rogue frames {rogue}")
    });
    // Every rogue frame is refused as such, or (a CAPS for a HELLO already
    // answered) as stale: none was taken.
    c.check(
        bad_nonce + foreign <= rogue && rogue <= bad_nonce + foreign + stale,
        || {
            format!(
                "rogue frames {rogue}, module rx_bad_nonce {bad_nonce} + rx_foreign {foreign} (+ rx_stale {stale})"
            )
        },
    );
    c.check(mod_acks <= dev_acks, || {
        format!(
            "the module took {mod_acks} ACKs, the device sent {dev_acks}: it accepted rogue copies"
        )
    });
    for name in ["stalls", "generation_changes"] {
        let count = m.get(name);
        c.check(count == 0, || {
            format!("{name} {count}: the rogue responder disturbed the session")
        });
    }
    let to_group = dev_delta(&d1, &d0, |s| s.mgmt.dst.hello_to_group);
    let to_device = dev_delta(&d1, &d0, |s| s.mgmt.dst.to_device);
    let to_bcast = dev_delta(&d1, &d0, |s| s.mgmt.dst.to_broadcast);
    let to_other = dev_delta(&d1, &d0, |s| s.mgmt.dst.to_other);
    c.check(
        to_group >= 1 && to_device >= 1 && to_bcast == 0 && to_other == 0,
        || {
            format!(
                "driver frame destinations: HELLO to the group {to_group}, to the device {to_device}, broadcast {to_bcast}, other {to_other}"
            )
        },
    );
    Ok(format!(
        "rogue_frames={rogue} rx_bad_nonce={bad_nonce} rx_foreign={foreign} rx_stale={stale} acks module/device={mod_acks}/{dev_acks} dst: hello->group={to_group} ->device={to_device} broadcast={to_bcast} other={to_other}"
    ))
}

/// Load the module and steer the workload with the rogue on (the steer
/// checks, guest side included, on one window).
fn steer_with_a_rogue(s: &mut Session, c: &mut Checks) -> Result<()> {
    s.setup_steering()?;
    let w = s.measure()?;
    s.check_window(&w, c);
    Ok(())
}
