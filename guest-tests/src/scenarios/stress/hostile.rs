//! Stress group: `hostile-mgmt`, malformed management frames from the
//! guest (an AF_PACKET socket of the agent) against the device.

use super::{drop_module, mgmt_bad, ping, tables_agree};
use crate::ensure;
use crate::harness::Result;
use crate::proto::{hex_decode, hex_encode, RawTxReport, RawTxSpec, Request};
use crate::scenarios::tracecheck::{planted_verdict, Planted};
use crate::scenarios::{Checks, Session, GEN_IP, GEN_PORT, GUEST_IP, IFNAME};
use arfs::proto::{self as wire, FrameError, Message};
use arfs::EventKind;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use vnic_ctl_proto::Stats;

/// The guest NIC's MAC as bytes.
pub(super) fn guest_mac() -> [u8; 6] {
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
pub(super) fn raw_frame(
    ty: u8,
    seq: u32,
    gen: u32,
    count: u16,
    body_len: u16,
    body: &[u8],
) -> Vec<u8> {
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

fn hello_body(reserved: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&1u32.to_be_bytes());
    b.extend_from_slice(&0x0bad_5eedu32.to_be_bytes()); // nonce
    b.extend_from_slice(&guest_mac());
    b.extend_from_slice(&reserved.to_be_bytes());
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
    /// What its `bad_frame` trace line must say: the field at fault, the
    /// op's index, the type (None: header unreadable).
    field: &'static str,
    op: Option<u16>,
    msg_type: Option<&'static str>,
    /// The type byte a NAK echoes (None: silent reasons).
    nak_type: Option<u8>,
    frame: Vec<u8>,
}

/// A frame's planted fault as its `bad_frame` line names it: (`field`,
/// `op`, `msg_type`; None: no readable header).
type Planted3 = (&'static str, Option<u16>, Option<&'static str>);

/// Every malformed-frame reason of PROTOCOL.md, several ways each, all
/// with header seq `seq` (NAK-able ones: see `hostile_mgmt` for why).
fn malformed(seq: u32, gen: u32) -> Vec<Bad> {
    use FrameError as E;
    let mut v = Vec::new();
    // (what, the reason, (the field at fault, the op's index, the type)
    // as its trace line must name them, the frame)
    let mut push = |what, reason: FrameError, at: Planted3, frame: Vec<u8>| {
        let nak_type = (!reason.is_silent()).then(|| frame[17]);
        let (field, op, msg_type) = at;
        v.push(Bad {
            what,
            reason,
            field,
            op,
            msg_type,
            nak_type,
            frame,
        });
    };
    let hello = hello_body(0);
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f.truncate(14 + 10);
    push("truncated header", E::TooShort, ("frame", None, None), f);
    let mut f = raw_frame(3, seq, gen, 1, 44, &add_op(1, 0, 4, 17, false));
    f.truncate(30 + 20);
    push(
        "ADD cut inside its op",
        E::TooShort,
        ("body", None, Some("ADD")),
        f,
    );
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f[14] = 0xde;
    f[15] = 0xad;
    push("bad magic", E::BadMagic, ("magic", None, Some("HELLO")), f);
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f[16] = 2;
    push(
        "version 2",
        E::BadVersion,
        ("version", None, Some("HELLO")),
        f,
    );
    let mut f = raw_frame(1, seq, gen, 0, 16, &hello);
    f[16] = 0;
    push(
        "version 0",
        E::BadVersion,
        ("version", None, Some("HELLO")),
        f,
    );
    push(
        "type 0",
        E::UnknownType,
        ("type", None, Some("0")),
        raw_frame(0, seq, gen, 0, 0, &[]),
    );
    push(
        "type 10",
        E::UnknownType,
        ("type", None, Some("10")),
        raw_frame(10, seq, gen, 0, 0, &[]),
    );
    push(
        "type 255",
        E::UnknownType,
        ("type", None, Some("255")),
        raw_frame(255, seq, gen, 3, 12, &[0; 12]),
    );
    push(
        "CAPS to the device",
        E::WrongDirection,
        ("type", None, Some("CAPS")),
        raw_frame(2, seq, gen, 0, 24, &[0; 24]),
    );
    push(
        "ACK to the device",
        E::WrongDirection,
        ("type", None, Some("ACK")),
        raw_frame(6, seq, gen, 1, 5, &[3, 0, 0, 0, 0]),
    );
    push(
        "HELLO with count 1",
        E::BadCount,
        ("count", None, Some("HELLO")),
        raw_frame(1, seq, gen, 1, 16, &hello),
    );
    push(
        "ADD with count 0",
        E::BadCount,
        ("count", None, Some("ADD")),
        raw_frame(3, seq, gen, 0, 0, &[]),
    );
    push(
        "ADD with 34 ops",
        E::TooManyOps,
        ("count", None, Some("ADD")),
        raw_frame(3, seq, gen, 34, 34 * 44, &[]),
    );
    push(
        "ADD with 65535 ops",
        E::TooManyOps,
        ("count", None, Some("ADD")),
        raw_frame(3, seq, gen, 65535, 0, &[]),
    );
    push(
        "DEL with 1000 ops",
        E::TooManyOps,
        ("count", None, Some("DEL")),
        raw_frame(4, seq, gen, 1000, 4000, &[]),
    );
    let mut op = add_op(1, 0, 4, 17, false);
    op.pop();
    push(
        "ADD body 43 bytes",
        E::BadLength,
        ("body_len", None, Some("ADD")),
        raw_frame(3, seq, gen, 1, 43, &op),
    );
    push(
        "FLUSH body 5 bytes",
        E::BadLength,
        ("body_len", None, Some("FLUSH")),
        raw_frame(5, seq, gen, 0, 5, &[1, 0, 0, 0, 0]),
    );
    push(
        "FLUSH reason 0",
        E::BadReason,
        ("reason", None, Some("FLUSH")),
        raw_frame(5, seq, gen, 0, 4, &[0, 0, 0, 0]),
    );
    push(
        "DEL reason 7 in op 1",
        E::BadReason,
        ("ops[].reason", Some(1), Some("DEL")),
        raw_frame(4, seq, gen, 2, 8, &[0, 1, 1, 0, 0, 2, 7, 0]),
    );
    push(
        "HELLO reserved",
        E::ReservedNonzero,
        ("reserved", None, Some("HELLO")),
        raw_frame(1, seq, gen, 0, 16, &hello_body(0x8000)),
    );
    push(
        "FLUSH reserved",
        E::ReservedNonzero,
        ("reserved", None, Some("FLUSH")),
        raw_frame(5, seq, gen, 0, 4, &[1, 0, 7, 0]),
    );
    let mut ops = add_op(1, 0, 4, 17, false);
    let mut op = add_op(2, 0, 4, 17, false);
    op[10] = 0xff;
    ops.extend(op);
    push(
        "ADD op reserved in op 1",
        E::ReservedNonzero,
        ("ops[].reserved", Some(1), Some("ADD")),
        raw_frame(3, seq, gen, 2, 88, &ops),
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
    let gen = st0.generation;
    let enabled = st0.enabled_pairs;
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
    let d = |f: fn(&Stats) -> u64| f(&st1).saturating_sub(f(&st0));
    let mut by_reason: BTreeMap<&str, u64> = BTreeMap::new();
    for b in &bad {
        *by_reason.entry(b.reason.name()).or_default() += 1;
    }
    for e in FrameError::ALL {
        let want = by_reason.get(e.name()).copied().unwrap_or(0);
        let have = mgmt_bad(&st1, e) - mgmt_bad(&st0, e);
        c.check(have == want, || {
            format!(
                "in-window: device counted {have} {} frames, {want} sent",
                e.name()
            )
        });
    }
    let naks = bad.iter().filter(|b| b.nak_type.is_some()).count() as u64;
    let moved: [(&str, crate::scenarios::Counter, u64); 9] = [
        ("/mgmt/naks_sent", |s: &Stats| s.mgmt.naks_sent, naks),
        ("/mgmt/caps_sent", |s: &Stats| s.mgmt.caps_sent, 1),
        ("/mgmt/acks_sent", |s: &Stats| s.mgmt.acks_sent, 2),
        (
            "/table/rejects/bad_id",
            |s: &Stats| s.table.rejects.bad_id,
            1,
        ),
        (
            "/table/rejects/bad_queue",
            |s: &Stats| s.table.rejects.bad_queue,
            2,
        ),
        (
            "/table/rejects/bad_key",
            |s: &Stats| s.table.rejects.bad_key,
            3,
        ),
        (
            "/table/unknown_deletes",
            |s: &Stats| s.table.unknown_deletes,
            2,
        ),
        ("/table/adds", |s: &Stats| s.table.adds, 0),
        ("/mgmt/out_of_order", |s: &Stats| s.mgmt.out_of_order, 0),
    ];
    for (p, f, want) in moved {
        c.check(d(f) == want, || {
            format!("in-window: {p} moved by {}, expected {want}", d(f))
        });
    }
    c.check(st1.table.live == 0, || {
        "in-window: a refused op left a filter in the table".into()
    });
    Ok(format!(
        "in-window: {} frames, replies {}/{} as specified, naks={} rejects(bad_id/bad_queue/bad_key)={}/{}/{} unknown_deletes={}",
        frames.len(),
        got.len(),
        want.len(),
        d(|s| s.mgmt.naks_sent),
        d(|s| s.table.rejects.bad_id),
        d(|s| s.table.rejects.bad_queue),
        d(|s| s.table.rejects.bad_key),
        d(|s| s.table.unknown_deletes)
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
pub(in crate::scenarios) fn hostile_mgmt(s: &mut Session, c: &mut Checks) -> Result<String> {
    let phase1 = hostile_in_window(s, c)?;
    // Phase 2: the module's session is up and a steered workload runs; the
    // hostile frames come at a high rate. Their seq is far ahead of the
    // device's window (expected + 2^30): a NAK-able frame in the window
    // would consume a seq the module is about to use. That is inherent to
    // an unauthenticated channel, not something a device can tell apart.
    s.setup_steering()?;
    let st0 = s.guest.ctl.stats()?;
    let exp = st0.mgmt.expected_seq.unwrap_or_else(|| {
        // Read as 0 to go on with; the scenario fails.
        crate::harness::missing("/mgmt/expected_seq (vnic ctl: null)".into());
        0
    });
    let gen = st0.generation;
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
    let fig = s.check_window(&w, c);
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
    let d = |f: fn(&Stats) -> u64| f(&st1).saturating_sub(f(&st0));
    let total: u64 = rep.sent.iter().sum();
    let mut sent_by: BTreeMap<&str, u64> = BTreeMap::new();
    for (b, n) in bad.iter().zip(&rep.sent) {
        *sent_by.entry(b.reason.name()).or_default() += n;
    }
    let mut counted = String::new();
    for e in FrameError::ALL {
        let want = sent_by.get(e.name()).copied().unwrap_or(0);
        let have = mgmt_bad(&st1, e) - mgmt_bad(&st0, e);
        let _ = write!(counted, "{}={have}/{want} ", e.name());
        c.check(have == want, || {
            format!(
                "device counted {have} {} frames, the guest sent {want}",
                e.name()
            )
        });
    }
    c.check(d(|s| s.mgmt.frames_bad_total) == total, || {
        format!(
            "frames_bad_total moved by {}, {total} sent",
            d(|s| s.mgmt.frames_bad_total)
        )
    });
    let nakable: u64 = bad
        .iter()
        .zip(&rep.sent)
        .filter(|(b, _)| b.nak_type.is_some())
        .map(|(_, n)| n)
        .sum();
    c.check(d(|s| s.mgmt.out_of_order) == nakable, || {
        format!(
            "out_of_order moved by {}; the NAK-able hostile frames (all ahead of the window) were {nakable}",
            d(|s| s.mgmt.out_of_order)
        )
    });
    c.check(d(|s| s.mgmt.naks_sent) == 0, || {
        format!(
            "{} NAKs sent for frames outside the window",
            d(|s| s.mgmt.naks_sent)
        )
    });
    // The trace names each one (unless the trace writer had to drop lines).
    let trace = s.trace_since_mark()?;
    let traced = trace
        .iter()
        .filter(|r| r.event == EventKind::BadFrame)
        .count() as u64;
    let tdrop = d(|s| s.trace.dropped);
    c.check(traced + tdrop >= total && traced <= total, || {
        format!("{traced} bad_frame trace lines (+{tdrop} dropped) for {total} frames")
    });
    // Each line says what its frame planted (reason, field, op, type,
    // seq), and each NAK-able frame's out_of_order drop names its seq and
    // type: the trace against what the guest sent.
    let planted: Vec<Planted<'_>> = bad
        .iter()
        .zip(&rep.sent)
        .map(|(b, n)| Planted {
            reason: b.reason.name(),
            field: b.field,
            op: b.op,
            msg_type: b.msg_type,
            seq: b.nak_type.map(|_| exp.wrapping_add(0x4000_0000)),
            sent: *n,
        })
        .collect();
    let pv = planted_verdict(&trace, &planted, tdrop);
    for f in &pv.findings {
        c.check(false, || f.clone());
    }
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
        c.check(false, || e.to_string());
    }
    // No data frame lost, repeated or damaged under the blast.
    let delivery = s.check_delivery(c)?;
    Ok(format!(
        "{phase1}; under load: {total} frames in {:.1}s ({:.0}/s, {} retries) by reason sent/counted: {counted}out_of_order={} naks=0 traced={traced} {} module gen_changes/replays/stalls +0, tables agree ({} entries); steering {fig} ping {}/{} {delivery}",
        rep.elapsed_ms as f64 / 1000.0,
        total as f64 * 1000.0 / rep.elapsed_ms.max(1) as f64,
        rep.retries,
        d(|s| s.mgmt.out_of_order),
        pv.figures("trace-vs-sent"),
        agree.as_ref().copied().unwrap_or(0),
        p.received,
        p.sent
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arfs::{FlowKey, L4Proto};
    use std::collections::BTreeSet;

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
            // The device's trace line for it says what the frame planted.
            let line = arfs::TraceRecord::bad_frame(0, 7, &e);
            assert_eq!(line.field.as_deref(), Some(b.field), "{}", b.what);
            assert_eq!(line.op, b.op, "{}", b.what);
            assert_eq!(line.msg_type.as_deref(), b.msg_type, "{}", b.what);
            assert_eq!(line.seq, b.nak_type.map(|_| 0x1234_5678), "{}", b.what);
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
