//! Scenarios of the stress group (issue 5, items 6, 7, 9, 10):
//!
//! - `hostile-mgmt`: the guest sends malformed management frames from an
//!   AF_PACKET socket; the device counts each by reason, answers exactly
//!   what PROTOCOL.md says, and the module's session and steering go on.
//! - `device-restart`: `vnic serve` is killed and restarted under a running
//!   guest; QEMU reconnects, the module replays its table, steering resumes.
//! - `tcp-tap`: vnic's tap peer in a host network namespace; a host TCP
//!   client opens 64 connections to the agent's server: TCP steers like UDP.
//! - `unload-reload`: on the debug kernel (KASAN, lockdep, kmemleak), 20
//!   module unload/reload cycles under traffic; the table is flushed on
//!   every unload and the kernel reports nothing.

use super::faults::{table_of, DevTable};
use super::{BootKind, Checks, Flow, Session, Window, GEN_IP, GEN_PORT, GUEST_IP, IFNAME};
use crate::harness::ctl::counter;
use crate::harness::vnic::VnicOptions;
use crate::harness::{wait_for, Context, Result};
use crate::proto::{hex_decode, hex_encode, PingResult, RawTxReport, RawTxSpec, Request, TcpStats};
use crate::{bail, ensure};
use arfs::proto::{self as wire, FrameError, Message};
use arfs::{EventKind, FlowKey, L4Proto, TraceRecord};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---- shared helpers --------------------------------------------------------

fn ping(s: &mut Session, count: u32) -> Result<PingResult> {
    s.guest.agent.call(
        &Request::Ping {
            addr: GEN_IP.to_string(),
            count,
            timeout_ms: 3000,
        },
        Duration::from_secs(30),
    )
}

/// Stop the workload and unload the module (the table must then be empty).
fn drop_module(s: &mut Session) -> Result<()> {
    if s.gen_running {
        s.guest.ctl.gen_stop_all()?;
        s.gen_running = false;
    }
    s.gen_sets.clear();
    if !s.flows.is_empty() {
        s.guest
            .agent
            .call_value(&Request::UdpStop, Duration::from_secs(30))?;
        s.flows.clear();
    }
    if s.module_loaded {
        s.rmmod(Duration::from_mins(1))?;
    }
    s.wait_device_empty("the device table to empty")
}

/// Wait until the device table equals the module's, entry for entry, with
/// nothing in flight. Returns the number of entries, or the differences.
fn tables_agree(s: &mut Session, timeout: Duration) -> Result<std::result::Result<usize, String>> {
    let start = Instant::now();
    loop {
        let (m, unsettled) = s.module_table()?;
        let d = table_of(&s.guest.ctl.table()?)?;
        if unsettled == 0 && m == d {
            return Ok(Ok(d.len()));
        }
        if start.elapsed() >= timeout {
            let only = |a: &DevTable, b: &DevTable| -> Vec<String> {
                a.iter()
                    .filter(|(id, e)| b.get(id) != Some(e))
                    .take(4)
                    .map(|(id, (flow, rxq))| format!("{id} q{rxq} {flow}"))
                    .collect()
            };
            return Ok(Err(format!(
                "device table ({} entries) != module table ({} active, {unsettled} in flight) after {:.0}s; only in module: {:?}; only on device: {:?}",
                d.len(),
                m.len(),
                timeout.as_secs_f64(),
                only(&m, &d),
                only(&d, &m)
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn mgmt_bad(stats: &Value, reason: &str) -> u64 {
    counter(stats, &format!("/mgmt/frames_bad/{reason}"))
}

// ---- hostile-mgmt ------------------------------------------------------------

/// The guest NIC's MAC as bytes.
fn guest_mac() -> [u8; 6] {
    let mut m = [0u8; 6];
    for (i, p) in crate::harness::qemu::GUEST_MAC
        .split(':')
        .enumerate()
        .take(6)
    {
        m[i] = u8::from_str_radix(p, 16).unwrap_or(0);
    }
    m
}

/// A management frame with every header field chosen by the caller.
fn raw_frame(ty: u8, seq: u32, gen: u32, count: u16, body_len: u16, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(30 + body.len());
    f.extend_from_slice(&wire::BROADCAST_MAC);
    f.extend_from_slice(&guest_mac());
    f.extend_from_slice(&wire::ETHERTYPE_MGMT.to_be_bytes());
    f.extend_from_slice(&wire::MAGIC.to_be_bytes());
    f.push(wire::VERSION);
    f.push(ty);
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&gen.to_be_bytes());
    f.extend_from_slice(&count.to_be_bytes());
    f.extend_from_slice(&body_len.to_be_bytes());
    f.extend_from_slice(body);
    f
}

fn hello_body(flags: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&1u32.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&guest_mac());
    b.extend_from_slice(&[0, 0]);
    b
}

/// One ADD op: `family`/`proto`/`pad` raw so bad keys can be built.
fn add_op(id: u16, rxq: u16, family: u8, proto: u8, pad_nonzero: bool) -> Vec<u8> {
    let mut o = Vec::with_capacity(44);
    o.extend_from_slice(&id.to_be_bytes());
    o.extend_from_slice(&rxq.to_be_bytes());
    o.push(family);
    o.push(proto);
    o.extend_from_slice(&GEN_PORT.to_be_bytes());
    o.extend_from_slice(&30000u16.to_be_bytes());
    o.extend_from_slice(&[0, 0]);
    let mut src = [0u8; 16];
    src[..4].copy_from_slice(&GEN_IP.octets());
    if pad_nonzero {
        src[9] = 1;
    }
    let mut dst = [0u8; 16];
    dst[..4].copy_from_slice(&GUEST_IP.octets());
    o.extend_from_slice(&src);
    o.extend_from_slice(&dst);
    o
}

/// A device reply as the in-window phase checks it: (type, seq,
/// frame_status, op statuses).
type Reply = (u8, u32, u8, Vec<u8>);

/// A malformed frame and the reason the device must give it.
struct Bad {
    what: &'static str,
    reason: FrameError,
    /// The type byte a NAK echoes (None: silent reasons).
    nak_type: Option<u8>,
    frame: Vec<u8>,
}

/// Every malformed-frame reason of PROTOCOL.md, several ways each, all
/// with header seq `seq` (NAK-able ones: see `hostile_mgmt` for why).
fn malformed(seq: u32, gen: u32) -> Vec<Bad> {
    use FrameError as E;
    let mut v = Vec::new();
    let mut push = |what, reason: FrameError, frame: Vec<u8>| {
        let nak_type = (!reason.is_silent()).then(|| frame[17]);
        v.push(Bad {
            what,
            reason,
            nak_type,
            frame,
        });
    };
    let hello = hello_body(0);
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f.truncate(14 + 10);
    push("truncated header", E::TooShort, f);
    let mut f = raw_frame(3, seq, gen, 1, 44, &add_op(1, 0, 4, 17, false));
    f.truncate(30 + 20);
    push("ADD cut inside its op", E::TooShort, f);
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f[14] = 0xde;
    f[15] = 0xad;
    push("bad magic", E::BadMagic, f);
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f[16] = 2;
    push("version 2", E::BadVersion, f);
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f[16] = 0;
    push("version 0", E::BadVersion, f);
    push("type 0", E::UnknownType, raw_frame(0, seq, gen, 0, 0, &[]));
    push("type 7", E::UnknownType, raw_frame(7, seq, gen, 0, 0, &[]));
    push(
        "type 255",
        E::UnknownType,
        raw_frame(255, seq, gen, 3, 12, &[0; 12]),
    );
    push(
        "CAPS to the device",
        E::WrongDirection,
        raw_frame(2, seq, gen, 0, 24, &[0; 24]),
    );
    push(
        "ACK to the device",
        E::WrongDirection,
        raw_frame(6, seq, gen, 1, 5, &[3, 0, 0, 0, 0]),
    );
    push(
        "HELLO with count 1",
        E::BadCount,
        raw_frame(1, seq, gen, 1, 16, &hello),
    );
    push(
        "ADD with count 0",
        E::BadCount,
        raw_frame(3, seq, gen, 0, 0, &[]),
    );
    push(
        "ADD with 34 ops",
        E::TooManyOps,
        raw_frame(3, seq, gen, 34, 34 * 44, &[]),
    );
    push(
        "ADD with 65535 ops",
        E::TooManyOps,
        raw_frame(3, seq, gen, 65535, 0, &[]),
    );
    push(
        "DEL with 1000 ops",
        E::TooManyOps,
        raw_frame(4, seq, gen, 1000, 4000, &[]),
    );
    let mut op = add_op(1, 0, 4, 17, false);
    op.pop();
    push(
        "ADD body 43 bytes",
        E::BadLength,
        raw_frame(3, seq, gen, 1, 43, &op),
    );
    push(
        "FLUSH body 5 bytes",
        E::BadLength,
        raw_frame(5, seq, gen, 0, 5, &[1, 0, 0, 0, 0]),
    );
    push(
        "FLUSH reason 0",
        E::BadReason,
        raw_frame(5, seq, gen, 0, 4, &[0, 0, 0, 0]),
    );
    push(
        "DEL reason 6",
        E::BadReason,
        raw_frame(4, seq, gen, 1, 4, &[0, 1, 6, 0]),
    );
    push(
        "HELLO flags",
        E::ReservedNonzero,
        raw_frame(1, seq, gen, 0, 16, &hello_body(0x8000)),
    );
    push(
        "FLUSH reserved",
        E::ReservedNonzero,
        raw_frame(5, seq, gen, 0, 4, &[1, 0, 7, 0]),
    );
    let mut op = add_op(1, 0, 4, 17, false);
    op[10] = 0xff;
    push(
        "ADD op reserved",
        E::ReservedNonzero,
        raw_frame(3, seq, gen, 1, 44, &op),
    );
    v
}

fn raw_run(s: &mut Session, spec: RawTxSpec, timeout: Duration) -> Result<RawTxReport> {
    s.guest
        .agent
        .call_value(&Request::RawTxStart(spec), Duration::from_secs(30))?;
    let r: RawTxReport = s.guest.agent.call(
        &Request::RawTxWait {
            timeout_ms: timeout.as_millis() as u64,
        },
        timeout + Duration::from_secs(30),
    )?;
    ensure!(
        r.done,
        "the raw-frame job did not finish within {timeout:?}"
    );
    Ok(r)
}

/// Phase 1, no module: a session of our own, in order, where every reply
/// of the device is checked against PROTOCOL.md. Returns figures.
fn hostile_in_window(s: &mut Session, c: &mut Checks) -> Result<String> {
    drop_module(s)?;
    s.ensure_net()?;
    let st0 = s.guest.ctl.stats()?;
    let gen = counter(&st0, "/generation") as u32;
    let enabled = counter(&st0, "/enabled_pairs") as u16;
    let base: u32 = 0x7000_0000;
    // (frame, expected reply: None = silence, Some((type, seq, frame_status, statuses)))
    let mut frames: Vec<(Vec<u8>, Option<Reply>)> = Vec::new();
    frames.push((
        raw_frame(1, base, gen, 0, 16, &hello_body(0)),
        Some((2, base, 0, Vec::new())),
    ));
    let mut seq = base + 1;
    let bad = malformed(0, gen);
    for b in &bad {
        let mut f = b.frame.clone();
        if f.len() >= 22 {
            f[18..22].copy_from_slice(&seq.to_be_bytes());
        }
        let reply = b
            .nak_type
            .map(|_| (wire::MsgType::Ack.code(), seq, b.reason.code(), Vec::new()));
        if b.nak_type.is_some() {
            seq += 1;
        }
        frames.push((f, reply));
    }
    // Op-level problems: an ADD whose every op is refused, a DEL of ids that
    // are not live (0xFFFF can never be).
    let mut ops = Vec::new();
    ops.extend(add_op(0xFFFF, 0, 4, 17, false)); // bad_id
    ops.extend(add_op(7, enabled, 4, 17, false)); // bad_queue (first disabled)
    ops.extend(add_op(8, 0xFFFF, 4, 17, false)); // bad_queue
    ops.extend(add_op(9, 0, 5, 17, false)); // bad_key: family
    ops.extend(add_op(10, 0, 4, 1, false)); // bad_key: ICMP
    ops.extend(add_op(11, 0, 4, 6, true)); // bad_key: IPv4 padding
    frames.push((
        raw_frame(3, seq, gen, 6, 6 * 44, &ops),
        Some((6, seq, 0, vec![7, 3, 3, 4, 4, 4])),
    ));
    seq += 1;
    frames.push((
        raw_frame(4, seq, gen, 2, 8, &[0xff, 0xff, 1, 0, 0x04, 0xd2, 2, 0]),
        Some((6, seq, 0, vec![6, 6])),
    ));
    let spec = RawTxSpec {
        ifname: IFNAME.into(),
        frames: frames.iter().map(|(f, _)| hex_encode(f)).collect(),
        rounds: 1,
        pps: 200,
        cpu: Some(0),
        capture_ethertype: Some(wire::ETHERTYPE_MGMT),
        linger_ms: 1500,
    };
    let rep = raw_run(s, spec, Duration::from_mins(1))?;
    c.check(rep.failed == 0 && rep.sent.iter().all(|&n| n == 1), || {
        format!(
            "in-window phase: not every frame was sent once: {:?} {:?}",
            rep.sent, rep.errors
        )
    });
    // The device's answers, in order.
    let mut got: Vec<Reply> = Vec::new();
    for h in &rep.captured {
        let f = hex_decode(h)?;
        match wire::decode_frame_driver(&f) {
            Ok((hd, Message::Caps(_))) => got.push((2, hd.seq, 0, Vec::new())),
            Ok((hd, Message::Ack(a))) => {
                got.push((6, hd.seq, a.frame_status, a.statuses.clone()));
                c.check(a.acked_type == ack_type_for(&frames, hd.seq), || {
                    format!(
                        "reply to seq {:#x} echoes type {} (the request's type byte is {})",
                        hd.seq,
                        a.acked_type,
                        ack_type_for(&frames, hd.seq)
                    )
                });
            }
            Ok((_, m)) => c.check(false, || format!("unexpected device frame {m:?}")),
            Err(e) => c.check(false, || format!("undecodable device frame {h}: {e}")),
        }
    }
    let want: Vec<Reply> = frames.iter().filter_map(|(_, r)| r.clone()).collect();
    c.check(got == want, || {
        let sent: Vec<String> = std::iter::once("HELLO".to_string())
            .chain(bad.iter().map(|b| format!("{} ({})", b.what, b.reason.name())))
            .chain(["ADD of 6 refused ops".into(), "DEL of 2 unknown ids".into()])
            .collect();
        format!(
            "device replies differ from PROTOCOL.md:\n      sent {sent:?}\n      got  {got:?}\n      want {want:?}"
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let st1 = s.guest.ctl.stats()?;
    let d = |p: &str| counter(&st1, p).saturating_sub(counter(&st0, p));
    let mut by_reason: BTreeMap<&str, u64> = BTreeMap::new();
    for b in &bad {
        *by_reason.entry(b.reason.name()).or_default() += 1;
    }
    for e in FrameError::ALL {
        let want = by_reason.get(e.name()).copied().unwrap_or(0);
        let have = mgmt_bad(&st1, e.name()) - mgmt_bad(&st0, e.name());
        c.check(have == want, || {
            format!(
                "in-window: device counted {have} {} frames, {want} sent",
                e.name()
            )
        });
    }
    let naks = bad.iter().filter(|b| b.nak_type.is_some()).count() as u64;
    for (p, want) in [
        ("/mgmt/naks_sent", naks),
        ("/mgmt/caps_sent", 1),
        ("/mgmt/acks_sent", 2),
        ("/table/rejects/bad_id", 1),
        ("/table/rejects/bad_queue", 2),
        ("/table/rejects/bad_key", 3),
        ("/table/unknown_deletes", 2),
        ("/table/adds", 0),
        ("/mgmt/out_of_order", 0),
    ] {
        c.check(d(p) == want, || {
            format!("in-window: {p} moved by {}, expected {want}", d(p))
        });
    }
    c.check(counter(&st1, "/table/live") == 0, || {
        "in-window: a refused op left a filter in the table".into()
    });
    Ok(format!(
        "in-window: {} frames, replies {}/{} as specified, naks={} rejects(bad_id/bad_queue/bad_key)={}/{}/{} unknown_deletes={}",
        frames.len(),
        got.len(),
        want.len(),
        d("/mgmt/naks_sent"),
        d("/table/rejects/bad_id"),
        d("/table/rejects/bad_queue"),
        d("/table/rejects/bad_key"),
        d("/table/unknown_deletes")
    ))
}

/// The type byte of the (NAK-able or well-formed) frame sent with `seq`.
fn ack_type_for(frames: &[(Vec<u8>, Option<Reply>)], seq: u32) -> u8 {
    frames
        .iter()
        .find(|(f, r)| r.as_ref().is_some_and(|r| r.1 == seq) && f.len() >= 18)
        .map_or(0, |(f, _)| f[17])
}

#[allow(clippy::many_single_char_names)] // s session, c checks, d delta, p ping, w window: as in mod.rs
pub(super) fn hostile_mgmt(s: &mut Session, c: &mut Checks) -> Result<String> {
    let phase1 = hostile_in_window(s, c)?;
    // Phase 2: the module's session is up and a steered workload runs; the
    // hostile frames come at a high rate. Their seq is far ahead of the
    // device's window (expected + 2^30): a NAK-able frame in the window
    // would consume a seq the module is about to use. That is inherent to
    // an unauthenticated channel, not something a device can tell apart.
    s.setup_steering()?;
    let st0 = s.guest.ctl.stats()?;
    let exp = counter(&st0, "/mgmt/expected_seq") as u32;
    let gen = counter(&st0, "/generation") as u32;
    let bad = malformed(exp.wrapping_add(0x4000_0000), gen);
    let m0 = s.module_counters()?;
    s.trace_since_mark()?;
    let pps: u32 = 4000;
    let blast = s.settings.measure + Duration::from_secs(5);
    let rounds = (u64::from(pps) * blast.as_secs() / bad.len() as u64) as u32;
    s.guest.agent.call_value(
        &Request::RawTxStart(RawTxSpec {
            ifname: IFNAME.into(),
            frames: bad.iter().map(|b| hex_encode(&b.frame)).collect(),
            rounds,
            pps,
            cpu: None,
            capture_ethertype: None,
            linger_ms: 0,
        }),
        Duration::from_secs(30),
    )?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    // Steering of the running workload during the blast.
    let w = s.measure()?;
    let (min, mean, min_hw) = s.check_window(&w, c);
    let p = ping(s, 3)?;
    c.check(p.received == p.sent, || {
        format!("ping during the blast: {}/{}", p.received, p.sent)
    });
    let during = t0.elapsed();
    let rep: RawTxReport = s.guest.agent.call(
        &Request::RawTxWait {
            timeout_ms: 120_000,
        },
        Duration::from_secs(150),
    )?;
    ensure!(rep.done, "the hostile sender did not finish");
    c.check(during < Duration::from_millis(rep.elapsed_ms), || {
        format!(
            "the measurement ({:.1}s) outlasted the blast ({:.1}s)",
            during.as_secs_f64(),
            rep.elapsed_ms as f64 / 1000.0
        )
    });
    c.check(rep.failed == 0, || {
        format!("sends failed: {:?}", rep.errors)
    });
    std::thread::sleep(Duration::from_secs(1));
    let st1 = s.guest.ctl.stats()?;
    let d = |p: &str| counter(&st1, p).saturating_sub(counter(&st0, p));
    let total: u64 = rep.sent.iter().sum();
    let mut sent_by: BTreeMap<&str, u64> = BTreeMap::new();
    for (b, n) in bad.iter().zip(&rep.sent) {
        *sent_by.entry(b.reason.name()).or_default() += n;
    }
    let mut counted = String::new();
    for e in FrameError::ALL {
        let want = sent_by.get(e.name()).copied().unwrap_or(0);
        let have = mgmt_bad(&st1, e.name()) - mgmt_bad(&st0, e.name());
        let _ = write!(counted, "{}={have}/{want} ", e.name());
        c.check(have == want, || {
            format!(
                "device counted {have} {} frames, the guest sent {want}",
                e.name()
            )
        });
    }
    c.check(d("/mgmt/frames_bad_total") == total, || {
        format!(
            "frames_bad_total moved by {}, {total} sent",
            d("/mgmt/frames_bad_total")
        )
    });
    let nakable: u64 = bad
        .iter()
        .zip(&rep.sent)
        .filter(|(b, _)| b.nak_type.is_some())
        .map(|(_, n)| n)
        .sum();
    c.check(d("/mgmt/out_of_order") == nakable, || {
        format!(
            "out_of_order moved by {}; the NAK-able hostile frames (all ahead of the window) were {nakable}",
            d("/mgmt/out_of_order")
        )
    });
    c.check(d("/mgmt/naks_sent") == 0, || {
        format!(
            "{} NAKs sent for frames outside the window",
            d("/mgmt/naks_sent")
        )
    });
    // The trace names each one (unless the trace writer had to drop lines).
    let trace = s.trace_since_mark()?;
    let traced = trace
        .iter()
        .filter(|r| r.event == EventKind::BadFrame)
        .count() as u64;
    let tdrop = d("/trace/dropped");
    c.check(traced + tdrop >= total && traced <= total, || {
        format!("{traced} bad_frame trace lines (+{tdrop} dropped) for {total} frames")
    });
    // The module's session never noticed.
    let m1 = s.module_counters()?;
    for k in [
        "generation_changes",
        "replays",
        "stalls",
        "rx_malformed",
        "naks",
    ] {
        let (a, b) = (m0.get(k), m1.get(k));
        c.check(a == b, || {
            format!("module {k} moved {a} -> {b} during the blast")
        });
    }
    c.check(m1.state(IFNAME) == Some("active"), || {
        format!("module state {:?}", m1.state(IFNAME))
    });
    let agree = tables_agree(s, Duration::from_secs(15))?;
    if let Err(e) = &agree {
        c.check(false, || e.clone());
    }
    Ok(format!(
        "{phase1}; under load: {total} frames in {:.1}s ({:.0}/s, {} retries) by reason sent/counted: {counted}out_of_order={} naks=0 traced={traced} module gen_changes/replays/stalls +0, tables agree ({} entries); steering on_cpu_min={min:.1}% mean={mean:.1}% hw_min={min_hw:.1}% ping {}/{}",
        rep.elapsed_ms as f64 / 1000.0,
        total as f64 * 1000.0 / rep.elapsed_ms.max(1) as f64,
        rep.retries,
        d("/mgmt/out_of_order"),
        agree.as_ref().copied().unwrap_or(0),
        p.received,
        p.sent
    ))
}

// ---- device-restart ------------------------------------------------------------

#[allow(clippy::many_single_char_names)] // s session, c checks, d delta, p ping, w window: as in mod.rs
pub(super) fn device_restart(s: &mut Session, c: &mut Checks) -> Result<String> {
    s.setup_steering()?;
    // Nothing in flight, module and device in agreement, before the kill.
    let before = match tables_agree(s, Duration::from_secs(15))? {
        Ok(n) => n,
        Err(e) => bail!("before the restart: {e}"),
    };
    let (m_before, _) = s.module_table()?;
    let st0 = s.guest.ctl.stats()?;
    let gen0 = counter(&st0, "/generation");
    let m0 = s.module_counters()?;
    let up0 = s.guest.info.uptime_s;
    let t0 = Instant::now();
    s.guest.restart_vnic(Duration::from_secs(1))?;
    // The old daemon's flow sets and trace are gone with it.
    s.gen_running = false;
    s.gen_sets.clear();
    s.trace_mark = 0;
    let ctl = &mut s.guest.ctl;
    let st = wait_for(
        Duration::from_mins(1),
        "QEMU to reconnect and enable every queue pair",
        || {
            let st = ctl.stats()?;
            Ok((st["connected"] == Value::Bool(true)
                && counter(&st, "/enabled_pairs") == u64::from(s.settings.queues))
            .then_some(st))
        },
    )?;
    let reconnect = t0.elapsed();
    let gen1 = counter(&st, "/generation");
    c.check(gen1 != gen0, || format!("generation unchanged ({gen0:#x})"));
    // The link comes back.
    let mut p = ping(s, 3)?;
    for _ in 0..5 {
        if p.received == p.sent {
            break;
        }
        p = ping(s, 3)?;
    }
    c.check(p.received == p.sent, || {
        format!("ping after the restart: {}/{}", p.received, p.sent)
    });
    // The module sees the new generation and replays its table.
    let mut last = None;
    let seen = wait_for(
        Duration::from_secs(30),
        "the module to take the new generation and replay",
        || {
            let m = s.module_counters()?;
            let ok = m.get("generation_changes") > m0.get("generation_changes")
                && m.get("replays") > m0.get("replays")
                && m.get("generation") == gen1
                && m.state(IFNAME) == Some("active");
            let r = ok.then(|| m.clone());
            last = Some(m);
            Ok(r)
        },
    );
    let m1 = match seen {
        Ok(m) => m,
        Err(e) => {
            let m = last.unwrap_or_default();
            c.check(false, || {
                format!(
                    "{e}: module generation {} (device {gen1}), generation_changes {}, replays {}, state {:?}",
                    m.get("generation"),
                    m.get("generation_changes"),
                    m.get("replays"),
                    m.state(IFNAME)
                )
            });
            m
        }
    };
    let replay_t = t0.elapsed();
    // The replay: the device holds what the module holds, and that is
    // everything the module had before (live flows keep their filters).
    let agree = tables_agree(s, Duration::from_secs(20))?;
    if let Err(e) = &agree {
        c.check(false, || e.clone());
    }
    let (m_after, _) = s.module_table()?;
    let kept = m_before
        .iter()
        .filter(|(id, e)| m_after.get(id) == Some(e))
        .count();
    let replayed = m1.get("replayed_filters") - m0.get("replayed_filters");
    c.check(replayed >= before as u64, || {
        format!("module replayed {replayed} filters, it had {before}")
    });
    let trace = s.trace_since_mark()?;
    let adds = trace.iter().filter(|r| r.event == EventKind::Add).count();
    c.check(adds >= before, || {
        format!("the new daemon's trace has {adds} ADDs, the module had {before} filters")
    });
    // Steering resumes: the generator starts again on the new daemon.
    s.start_gen_per_flow(s.settings.rate)?;
    let warm = s.wait_steered(&BTreeSet::new())?;
    std::thread::sleep(Duration::from_secs(1));
    let w = s.measure()?;
    let (min, mean, min_hw) = s.check_window(&w, c);
    // Same boot: the guest's uptime went on.
    let info: crate::proto::Info = s.guest.agent.req(Request::Hello)?;
    c.check(
        info.uptime_s > up0 + t0.elapsed().as_secs_f64() - 5.0,
        || {
            format!(
                "guest uptime {:.0}s: did it reboot? (was {up0:.0}s)",
                info.uptime_s
            )
        },
    );
    c.check(s.guest.qemu.exited().is_none(), || "QEMU exited".into());
    Ok(format!(
        "killed vnic (SIGKILL) 1s; reconnected in {:.1}s; generation {gen0:#x} -> {gen1:#x}; module generation_changes +{} replays +{} replayed_filters +{replayed} in {:.1}s; device==module {} entries (had {before}, {kept} identical); trace ADDs {adds}; ping {}/{}; re-steered in {:.1}s; on_cpu_min={min:.1}% mean={mean:.1}% hw_min={min_hw:.1}%",
        reconnect.as_secs_f64(),
        m1.get("generation_changes") - m0.get("generation_changes"),
        m1.get("replays") - m0.get("replays"),
        replay_t.as_secs_f64(),
        agree.as_ref().copied().unwrap_or(0),
        p.received,
        p.sent,
        warm.as_secs_f64()
    ))
}

// ---- tcp-tap ---------------------------------------------------------------------

/// A host network namespace holding vnic's tap peer. The daemon runs in it
/// (`ip netns exec`), so it creates its tap there; the tap gets the peer's
/// address. Deleted on drop (after the guest, hence the daemon, is gone).
pub struct TapNet {
    pub ns: String,
    pub tap: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .ctx(format!("running ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl TapNet {
    /// Create the namespace and point `vnic` at it.
    pub fn create(vnic: &mut VnicOptions) -> Result<Self> {
        let pid = std::process::id();
        let t = TapNet {
            ns: format!("vnic-gt-{pid}"),
            tap: format!("vgt{}", pid % 1_000_000),
        };
        let _ = ip(&["netns", "del", &t.ns]);
        ip(&["netns", "add", &t.ns])?;
        vnic.peer = format!("tap:{}", t.tap);
        vnic.wrap = vec!["ip".into(), "netns".into(), "exec".into(), t.ns.clone()];
        Ok(t)
    }

    /// Address the tap (vnic created it) and bring it up.
    pub fn configure(&self) -> Result<()> {
        let peer = format!("{GEN_IP}/24");
        ip(&["-n", &self.ns, "link", "set", "lo", "up"])?;
        ip(&["-n", &self.ns, "addr", "add", &peer, "dev", &self.tap])?;
        ip(&["-n", &self.ns, "link", "set", &self.tap, "up"])?;
        Ok(())
    }
}

impl Drop for TapNet {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.ns]) {
            eprintln!("warning: {e}");
        }
    }
}

/// The host-side TCP client: `n` connections from inside the namespace,
/// a paced writer thread, TCP_INFO read back per connection.
struct TcpClient {
    conns: Arc<Vec<TcpStream>>,
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl TcpClient {
    fn start(ns: &str, server: SocketAddrV4, n: usize, rate: u32) -> Result<Self> {
        let ns_path = format!("/run/netns/{ns}");
        // setns() only moves the calling thread: connect from a thread of
        // our own, in the namespace; the sockets stay there.
        let conns = std::thread::spawn(move || -> Result<Vec<TcpStream>> {
            let f = std::fs::File::open(&ns_path).ctx(format!("opening {ns_path}"))?;
            // SAFETY: setns(2) on an open netns fd; affects only this thread.
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns {ns_path}: {}", std::io::Error::last_os_error());
            }
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let s = TcpStream::connect_timeout(&server.into(), Duration::from_secs(20))
                    .ctx(format!("connection {i} to {server}"))?;
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                v.push(s);
                // Keep accept order = connect order (the agent pins by accept order).
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(v)
        })
        .join()
        .map_err(|_| "the client thread panicked")??;
        let conns = Arc::new(conns);
        let stop = Arc::new(AtomicBool::new(false));
        let (cs, st) = (conns.clone(), stop.clone());
        let writer = std::thread::spawn(move || {
            let buf = [0x5au8; 128];
            let start = Instant::now();
            let mut k: u64 = 0;
            while !st.load(Ordering::Relaxed) {
                let due = start + Duration::from_secs_f64(k as f64 / f64::from(rate.max(1)));
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let i = (k % cs.len() as u64) as usize;
                // WouldBlock (a full send buffer) just skips this write.
                let _ = std::io::Write::write(&mut &cs[i], &buf);
                k += 1;
            }
        });
        Ok(TcpClient {
            conns,
            stop,
            writer: Some(writer),
        })
    }

    /// Segments each connection has sent (TCP_INFO tcpi_segs_out).
    fn segs_out(&self) -> Vec<u64> {
        self.conns
            .iter()
            .map(|s| {
                // SAFETY: tcp_info is plain data; all-zero is valid.
                let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
                let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
                // SAFETY: getsockopt writes at most `len` bytes into `ti`,
                // which is that large; the fd is an open TCP socket.
                let rc = unsafe {
                    libc::getsockopt(
                        s.as_raw_fd(),
                        libc::IPPROTO_TCP,
                        libc::TCP_INFO,
                        (&raw mut ti).cast(),
                        &raw mut len,
                    )
                };
                if rc == 0 {
                    u64::from(ti.tcpi_segs_out)
                } else {
                    0
                }
            })
            .collect()
    }

    fn local_ports(&self) -> Vec<u16> {
        self.conns
            .iter()
            .map(|s| s.local_addr().map_or(0, |a| a.port()))
            .collect()
    }
}

impl Drop for TcpClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.writer.take() {
            let _ = t.join();
        }
    }
}

const TCP_PORT: u16 = 5201;

pub(super) fn tcp_tap(s: &mut Session, c: &mut Checks) -> Result<String> {
    let Some(ns) = s.tapnet.as_ref().map(|t| t.ns.clone()) else {
        bail!("tcp-tap needs the tap boot (the suite runs it in one)");
    };
    s.ensure_module()?;
    let p = ping(s, 3)?;
    c.check(p.received == p.sent, || {
        format!("ping over the tap: {}/{}", p.received, p.sent)
    });
    let ncpu = usize::from(s.settings.cpus);
    s.guest.agent.req::<Value>(Request::TcpStart {
        port: TCP_PORT,
        cpus: (0..ncpu).collect(),
        echo: false,
    })?;
    let r = tcp_tap_inner(s, c, &ns);
    let stop = s
        .guest
        .agent
        .call_value(&Request::TcpStop, Duration::from_secs(30));
    let figures = r?;
    stop?;
    Ok(figures)
}

#[allow(clippy::many_single_char_names)] // s session, c checks, d delta, p ping, w window: as in mod.rs
fn tcp_tap_inner(s: &mut Session, c: &mut Checks, ns: &str) -> Result<String> {
    let n = s.settings.flows;
    s.trace_since_mark()?; // the trace from the first SYN on is this scenario's
    let client = TcpClient::start(
        ns,
        SocketAddrV4::new(GUEST_IP, TCP_PORT),
        n,
        s.settings.rate,
    )?;
    let agent = &mut s.guest.agent;
    let stats: TcpStats = wait_for(
        Duration::from_secs(30),
        "the guest to accept every connection",
        || {
            let st: TcpStats = agent.req(Request::TcpStats)?;
            Ok((st.conns.len() == n).then_some(st))
        },
    )?;
    // Connection i of the agent is the client connection from its peer port.
    let ports = client.local_ports();
    let mut flows: Vec<(usize, Flow)> = Vec::new(); // (client index, flow)
    for conn in &stats.conns {
        let port: u16 = conn
            .peer
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let Some(ci) = ports.iter().position(|&p| p == port) else {
            bail!("agent connection from {} is not one of ours", conn.peer);
        };
        let key = FlowKey::v4(L4Proto::Tcp, GEN_IP, port, GUEST_IP, TCP_PORT);
        flows.push((
            ci,
            Flow {
                local_port: port,
                cpu: conn.cpu,
                key,
                rss_q: usize::from(s.rss.queue_for_key(&key)),
            },
        ));
    }
    // Warm-up: every flow whose RSS queue is not its receiver's has a filter there.
    let want: Vec<(FlowKey, usize)> = flows
        .iter()
        .filter(|(_, f)| f.rss_q != f.cpu)
        .map(|(_, f)| (f.key, f.cpu))
        .collect();
    let t0 = Instant::now();
    let mut missing = 0;
    let r = wait_for(s.settings.warmup_timeout, "every TCP flow's filter", || {
        let have = s.device_filters()?;
        missing = want
            .iter()
            .filter(|(k, q)| have.get(k).map(|v| v.1) != Some(*q))
            .count();
        Ok((missing == 0).then_some(()))
    });
    if let Err(e) = r {
        bail!("{e}: {missing} of {} TCP flows not steered", want.len());
    }
    let warm = t0.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    // The window.
    let a0: TcpStats = s.guest.agent.req(Request::TcpStats)?;
    let d0 = s.device_filters()?;
    let g0 = client.segs_out();
    std::thread::sleep(s.settings.measure);
    let a1: TcpStats = s.guest.agent.req(Request::TcpStats)?;
    let d1 = s.device_filters()?;
    let g1 = client.segs_out();
    let mut w = Window::default();
    let by_peer = |st: &TcpStats, port: u16| {
        st.conns
            .iter()
            .find(|c| c.peer.ends_with(&format!(":{port}")))
            .map(|c| (c.reads, c.on_cpu))
            .unwrap_or_default()
    };
    let mut min: f64 = 1.0;
    let mut min_hw: f64 = 1.0;
    let mut sum = 0.0;
    for (ci, f) in &flows {
        let (r0, o0) = by_peer(&a0, f.local_port);
        let (r1, o1) = by_peer(&a1, f.local_port);
        let (reads, on) = (r1 - r0, o1 - o0);
        w.packets.push(reads);
        w.on_cpu.push(on);
        let pct = if reads == 0 {
            0.0
        } else {
            on as f64 / reads as f64
        };
        min = min.min(pct);
        sum += pct;
        c.check(reads >= 5, || {
            format!(
                "TCP :{}: {reads} reads in the window: not enough to judge",
                f.local_port
            )
        });
        c.check(pct >= s.settings.min_on_cpu, || {
            format!(
                "TCP :{} (rss q{}, receiver cpu{}): {:.1}% of {reads} reads on the receiver's CPU",
                f.local_port,
                f.rss_q,
                f.cpu,
                100.0 * pct
            )
        });
        if f.rss_q != f.cpu {
            let segs = g1[*ci].saturating_sub(g0[*ci]);
            let hits = match (d0.get(&f.key), d1.get(&f.key)) {
                (Some(&(i0, _, h0)), Some(&(i1, q, h1))) if i0 == i1 && q == f.cpu => {
                    Some(h1.saturating_sub(h0))
                }
                _ => None,
            };
            let hw = match hits {
                Some(h) if segs > 0 => (h as f64 / segs as f64).min(1.0),
                _ => 0.0,
            };
            min_hw = min_hw.min(hw);
            c.check(hw >= s.settings.min_on_cpu, || {
                format!(
                    "TCP :{}: filter to q{} steered {hits:?} of the {segs} segments the client sent",
                    f.local_port, f.cpu
                )
            });
        }
    }
    let trace = s.trace_since_mark()?;
    let tcp_adds = trace
        .iter()
        .filter(|r| r.event == EventKind::Add && r.flow.is_some_and(|k| k.proto() == L4Proto::Tcp))
        .count();
    // As in steer, every flow RSS gets wrong was programmed to its
    // receiver's queue. Unlike UDP, the first steer of a TCP flow may follow
    // the (unpinned) accepting thread's CPU: accept() records the flow for
    // RFS too. The filter then moves with a REPLACE once the pinned receiver
    // reads; so an ADD or a REPLACE to the receiver's queue counts.
    for (_, f) in flows.iter().filter(|(_, f)| f.rss_q != f.cpu) {
        let programmed = trace.iter().any(|r| {
            matches!(r.event, EventKind::Add | EventKind::Replace)
                && r.flow == Some(f.key)
                && r.rxq.map(usize::from) == Some(f.cpu)
        });
        c.check(programmed, || {
            format!(
                "TCP :{}: no ADD or REPLACE to q{} in the trace (rss q{})",
                f.local_port, f.cpu, f.rss_q
            )
        });
    }
    let tcp_replaces = trace
        .iter()
        .filter(|r| {
            r.event == EventKind::Replace && r.flow.is_some_and(|k| k.proto() == L4Proto::Tcp)
        })
        .count();
    let rejects = trace
        .iter()
        .filter(|r| r.event == EventKind::Reject)
        .count();
    c.check(rejects == 0, || format!("{rejects} rejects in the trace"));
    let st = s.guest.ctl.stats()?;
    let tap_rx = counter(&st, "/peer/tap_rx");
    c.check(tap_rx > 0, || "the device read nothing from the tap".into());
    drop(client);
    Ok(format!(
        "conns={} steered={} tcp_adds={tcp_adds} tcp_replaces={tcp_replaces} warmup={:.1}s on_cpu_min={:.1}% mean={:.1}% hw_min={:.1}% (filter hits / client segs_out) tap_rx={tap_rx} tap_tx={}",
        flows.len(),
        want.len(),
        warm.as_secs_f64(),
        100.0 * min,
        100.0 * sum / flows.len().max(1) as f64,
        100.0 * min_hw,
        counter(&st, "/peer/tap_tx")
    ))
}

// ---- unload-reload ---------------------------------------------------------------

const KMEMLEAK: &str = "/sys/kernel/debug/kmemleak";
const CYCLES: usize = 20;
/// Generator rate of unload-reload's own workload (packets/s, all flows).
const DEBUG_RATE: u32 = 160;

fn kmemleak(s: &mut Session, cmd: &str) -> Result<()> {
    // A scan of the whole memory is slow on a TCG KASAN guest.
    s.guest
        .agent
        .call_value(
            &Request::WriteFile {
                path: KMEMLEAK.into(),
                value: cmd.into(),
            },
            Duration::from_mins(5),
        )
        .map(drop)
}

#[allow(clippy::many_single_char_names)] // s session, c checks, d delta, p ping, w window: as in mod.rs
pub(super) fn unload_reload(s: &mut Session, c: &mut Checks) -> Result<String> {
    // On the debug boot kmemleak must be there. A default boot (a kernel
    // left out of the suite's --debug-kernel) runs the same cycles and
    // checks without it, and its figures say so.
    let have_kmemleak = match s.guest.agent.read_file(KMEMLEAK) {
        Ok(_) => true,
        Err(e) => {
            c.check(s.kind != BootKind::Debug, || {
                format!("{KMEMLEAK} unreadable ({e}): not a kmemleak kernel, leaks unchecked")
            });
            false
        }
    };
    if have_kmemleak {
        // Leaks reported before (boot) are not the module's.
        kmemleak(s, "clear")?;
    }
    s.ensure_module()?;
    if s.flows.is_empty() {
        // A lighter workload than steer's (the debug kernel is slow):
        // 16 flows at DEBUG_RATE.
        let flows = s.make_flows(16.min(s.settings.flows));
        s.udp_start(&flows)?;
        s.flows = flows;
    }
    if !s.gen_running {
        // A KASAN kernel under TCG handles a few hundred packets/s: at the
        // steer rate (2000/s) its rx rings overflow and the agent starves.
        s.start_gen_per_flow(DEBUG_RATE.min(s.settings.rate))?;
    }
    s.trace_since_mark()?;
    let st0 = s.guest.ctl.stats()?;
    let mut flushed = Vec::new();
    let mut unload_ms = Vec::new();
    for cycle in 0..CYCLES {
        // Under traffic the module programs filters; unload with some live.
        let ctl = &mut s.guest.ctl;
        let live = wait_for(
            Duration::from_mins(1),
            "filters to be programmed under traffic",
            || {
                let n = counter(&ctl.table()?, "/live");
                Ok((n > 0).then_some(n))
            },
        )
        .ctx(format!("cycle {cycle}"))?;
        let t = Instant::now();
        s.rmmod(Duration::from_mins(1))?;
        unload_ms.push(t.elapsed().as_millis() as u64);
        // rmmod returns after the device acknowledged the FLUSH.
        let after = counter(&s.guest.ctl.table()?, "/live");
        c.check(after == 0, || {
            format!("cycle {cycle}: {after} filters left on the device after rmmod (had {live})")
        });
        // The trace is written by the daemon's tracer thread: give the
        // unload FLUSH's lines (its DELs come first) a moment to land.
        let mut trace = s.trace_since_mark()?;
        let t_trace = Instant::now();
        while !trace
            .iter()
            .any(|r| r.event == EventKind::Flush && r.reason.as_deref() == Some("unload"))
            && t_trace.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(100));
            trace.extend(s.trace_since_mark()?);
        }
        let (fl, attach): (Vec<&TraceRecord>, Vec<&TraceRecord>) = trace
            .iter()
            .filter(|r| r.event == EventKind::Flush)
            .partition(|r| r.reason.as_deref() == Some("unload"));
        let dels = trace
            .iter()
            .filter(|r| r.event == EventKind::Del && r.reason.as_deref() == Some("unload"))
            .count();
        // The FLUSH a (re)loaded module sends when it attaches found
        // nothing: the previous unload had flushed everything.
        for f in &attach {
            c.check(f.count == Some(0), || {
                format!(
                    "cycle {cycle}: the attach FLUSH removed {:?} filters left behind",
                    f.count
                )
            });
        }
        match fl.as_slice() {
            [f] => {
                let n = f.count.unwrap_or(0) as usize;
                c.check(n == dels && n > 0, || {
                    format!(
                        "cycle {cycle}: unload flush of {n} filters, {dels} unload deletes traced"
                    )
                });
                flushed.push(n);
            }
            _ => c.check(false, || {
                format!(
                    "cycle {cycle}: {} unload flush records in the trace after rmmod",
                    fl.len()
                )
            }),
        }
        s.ensure_module().ctx(format!("cycle {cycle}: reload"))?;
    }
    let st1 = s.guest.ctl.stats()?;
    let unload_deletes =
        counter(&st1, "/table/deletes/unload") - counter(&st0, "/table/deletes/unload");
    let total: usize = flushed.iter().sum();
    c.check(unload_deletes == total as u64, || {
        format!("device deletes/unload moved by {unload_deletes}, the flushes removed {total}")
    });
    // kmemleak: two scans (a leak is reported once it stayed unreferenced
    // across a scan), then the report must be empty.
    let t = Instant::now();
    let mut leaks = String::new();
    if have_kmemleak {
        for _ in 0..2 {
            kmemleak(s, "scan")?;
            std::thread::sleep(Duration::from_secs(1));
        }
        leaks = s.guest.agent.read_file(KMEMLEAK)?;
    }
    let scan_s = t.elapsed().as_secs_f64();
    let nleaks = leaks.matches("unreferenced object").count();
    if nleaks > 0 {
        s.guest.art.write("kmemleak.txt", &leaks);
        let head: String = leaks.lines().take(25).collect::<Vec<_>>().join("\n      ");
        c.check(false, || {
            format!("kmemleak: {nleaks} unreferenced objects:\n      {head}")
        });
    }
    let avg = unload_ms.iter().sum::<u64>() / unload_ms.len().max(1) as u64;
    let leak_check = if have_kmemleak {
        format!("kmemleak={nleaks} (scan {scan_s:.0}s)")
    } else {
        "kmemleak=n/a (default variant: no KASAN/kmemleak)".to_string()
    };
    Ok(format!(
        "cycles={CYCLES} flows={} flushed per unload min/max={}/{} total={total} device deletes_unload=+{unload_deletes} rmmod avg={avg}ms max={}ms {leak_check}",
        s.flows.len(),
        flushed.iter().min().copied().unwrap_or(0),
        flushed.iter().max().copied().unwrap_or(0),
        unload_ms.iter().max().copied().unwrap_or(0)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hostile frame is malformed for exactly the reason the scenario
    /// counts it under (the device's own decoder is the judge), covers every
    /// reason, and survives the hex round trip to the agent.
    #[test]
    fn malformed_frames_have_the_claimed_reason() {
        let bad = malformed(0x1234_5678, 7);
        let mut seen = BTreeSet::new();
        for b in &bad {
            let e = wire::decode_frame(&b.frame).expect_err(b.what);
            assert_eq!(e.kind, b.reason, "{}: {e}", b.what);
            assert_eq!(b.nak_type.is_some(), e.nak_header().is_some(), "{}", b.what);
            if let Some(h) = e.nak_header() {
                assert_eq!(h.seq, 0x1234_5678, "{}", b.what);
                assert_eq!(Some(h.msg_type), b.nak_type, "{}", b.what);
            }
            assert!(b.frame.len() >= 14 && b.frame.len() <= 1514, "{}", b.what);
            assert_eq!(hex_decode(&hex_encode(&b.frame)).unwrap(), b.frame);
            seen.insert(b.reason);
        }
        assert_eq!(seen.len(), FrameError::ALL.len(), "{seen:?}");
    }

    /// The in-window ADD's ops are well-formed frames whose every op is refused.
    #[test]
    fn refused_ops_decode() {
        let mut ops = Vec::new();
        ops.extend(add_op(0xFFFF, 0, 4, 17, false));
        ops.extend(add_op(9, 0, 5, 17, false));
        let f = raw_frame(3, 1, 0, 2, 88, &ops);
        let (_, m) = wire::decode_frame(&f).unwrap();
        let Message::Add(v) = m else { panic!("{m:?}") };
        assert_eq!(v[0].id, 0xFFFF);
        assert!(v[1].key().is_none());
        let good = add_op(1, 0, 4, 17, false);
        let f = raw_frame(3, 1, 0, 1, 44, &good);
        let (_, Message::Add(v)) = wire::decode_frame(&f).unwrap() else {
            panic!()
        };
        assert_eq!(
            v[0].key(),
            Some(FlowKey::v4(L4Proto::Udp, GEN_IP, GEN_PORT, GUEST_IP, 30000))
        );
    }
}
