//! Faults on the daemon side (issue 5): a lossy management channel both ways
//! with a go-back-N client that retransmits, and the filter table's capacity
//! and bucket geometry changed at run time through `ctl set`.

// Test code: d = daemon, g = guest, c = control client.
#![allow(clippy::many_single_char_names)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arfs::proto::{AddOp, DelOp};
use arfs::{DelReason, FlowKey, Message, OpStatus, Toeplitz};
use common::*;
use vnic_frontend::guest::Guest;

fn st(v: &[OpStatus]) -> Vec<u8> {
    v.iter().map(|s| *s as u8).collect()
}

/// A go-back-N sender as PROTOCOL.md's "Reliable delivery" describes the
/// driver: up to `window` requests outstanding, every outstanding request
/// sent again (same sequence numbers) when the oldest is not acknowledged
/// within `rto`. Returns the ACK statuses of every request, in order, and
/// the number of retransmitted frames.
fn go_back_n(
    g: &mut Guest,
    reqs: &[Message],
    window: usize,
    rto: Duration,
    deadline: Duration,
) -> (Vec<Vec<u8>>, u64) {
    let base = g.seq;
    let mut acks: Vec<Option<Vec<u8>>> = vec![None; reqs.len()];
    let (mut una, mut next) = (0usize, 0usize);
    let mut retransmits = 0u64;
    let end = Instant::now() + deadline;
    let mut sent_at = Instant::now();
    while una < reqs.len() {
        assert!(
            Instant::now() < end,
            "no convergence within {deadline:?}: {una} of {} requests acknowledged",
            reqs.len()
        );
        while next < reqs.len() && next < una + window {
            let seq = base.wrapping_add(next as u32);
            let f = g.encode_mgmt(seq, &reqs[next]);
            let q = g.mgmt_txq;
            g.send(q, &f);
            if next == una {
                sent_at = Instant::now();
            }
            next += 1;
        }
        // Collect whatever replies arrived (duplicated ACKs are harmless).
        let _ = g.wait_until(Duration::from_millis(20), "replies", |g| {
            !g.replies.is_empty()
        });
        for r in g.replies.drain(..) {
            let i = r.header.seq.wrapping_sub(base) as usize;
            if let (Some(slot), Message::Ack(a)) = (acks.get_mut(i), &r.message) {
                assert_eq!(a.frame_status, 0, "request {i} NAKed: {a:?}");
                slot.get_or_insert_with(|| a.statuses.clone());
            }
        }
        let before = una;
        while una < reqs.len() && acks[una].is_some() {
            una += 1;
        }
        if una != before {
            sent_at = Instant::now();
        } else if sent_at.elapsed() >= rto {
            // Go back: everything from the oldest unacknowledged again.
            retransmits += (next - una) as u64;
            next = una;
        }
    }
    g.seq = base.wrapping_add(reqs.len() as u32);
    (
        acks.into_iter().map(Option::unwrap_or_default).collect(),
        retransmits,
    )
}

/// 20% loss of requests and of replies: a retransmitting client converges,
/// every op is applied exactly once (duplicates are re-ACKed from the cache,
/// not applied again), and the device table equals the client's model.
#[test]
fn lossy_management_both_ways_converges_to_the_client_model() {
    let d = daemon(&["--queues", "4", "--seed", "5"]);
    let mut g = guest(&d, 4, 4);
    let mut c = ctl(&d);
    g.hello(T).expect("HELLO");
    c.set("mgmt_loss_rate", 0.2).unwrap();

    // 60 single-op ADDs (some re-steer a flow already added), then DELs of
    // every third id: enough frames that both directions lose some.
    let mut model: BTreeMap<u16, (FlowKey, u16)> = BTreeMap::new();
    let mut reqs = Vec::new();
    for i in 0..60u16 {
        let id = i % 40;
        let flow = gen_flow(14000 + id, 5001);
        // The second round moves each flow to the next queue: a real
        // re-steer (an identical ADD would be counted as `unchanged`).
        let rxq = (i + i / 40) % 4;
        reqs.push(Message::Add(vec![AddOp::new(id, rxq, &flow)]));
        model.insert(id, (flow, rxq));
    }
    for id in (0..40u16).step_by(3) {
        reqs.push(Message::Del(vec![DelOp {
            id,
            reason: DelReason::Expired,
        }]));
        model.remove(&id);
    }
    let (acks, retransmits) = go_back_n(
        &mut g,
        &reqs,
        4,
        Duration::from_millis(150),
        Duration::from_mins(2),
    );
    for (i, a) in acks.iter().enumerate() {
        assert_eq!(a, &st(&[OpStatus::Ok]), "request {i}: {:?}", reqs[i]);
    }
    assert!(retransmits > 0, "20% loss but nothing was retransmitted");

    let s = c.stats().unwrap();
    let lost_in = s.mgmt.dropped_by_loss;
    let lost_out = s.mgmt.replies_dropped_by_loss;
    assert!(
        lost_in > 0 && lost_out > 0,
        "loss in {lost_in}, out {lost_out}"
    );
    assert!(s.mgmt.duplicates > 0);
    // Each op was applied once: 60 ADD ops (40 adds, 20 in-place re-steers
    // of a live id) and 14 deletes.
    assert_eq!(s.table.adds + s.table.replaces, 60, "{s:?}");
    assert_eq!(s.table.unchanged, 0, "{s:?}");
    assert_eq!(s.table.deletes.expired, 14, "{s:?}");

    let t = c.table().unwrap();
    let dev: BTreeMap<u16, (FlowKey, u16)> = t
        .filters
        .iter()
        .map(|f| {
            // The protocol's flow is the trace's: arfs reads it back.
            let flow: FlowKey =
                serde_json::from_value(serde_json::to_value(f.flow).unwrap()).unwrap();
            (f.id, (flow, f.rxq))
        })
        .collect();
    assert_eq!(dev, model, "device table differs from the client's model");
    assert!(g.faults.is_empty(), "{:?}", g.faults);
    assert!(g.bad_replies.is_empty(), "{:?}", g.bad_replies);
}

/// `table_capacity` and `buckets` change at run time only while the table
/// is empty; the next HELLO's CAPS carries the new geometry and the table
/// enforces it. Counters survive the change.
#[test]
fn capacity_and_buckets_change_at_runtime_while_empty() {
    let d = daemon(&["--queues", "2", "--table-capacity", "64"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    assert_eq!(g.hello(T).unwrap().capacity, 64);

    // Bad values and more than the replicas were sized for are refused.
    for (k, v) in [
        ("table_capacity", SetValue::from(0)),
        ("table_capacity", SetValue::from(65)),
        ("buckets", SetValue::from("4")),
        ("buckets", SetValue::from("0x2")),
    ] {
        let e = c.set(k, v.clone()).unwrap_err().to_string();
        assert!(e.contains(k), "{k}={v}: {e}");
    }
    let e = c.set("table_capacity", 65).unwrap_err().to_string();
    assert!(e.contains("--table-capacity"), "{e}");

    let k = c.set("table_capacity", 4).unwrap();
    assert_eq!(k.capacity, 4);
    assert_eq!(g.hello(T).unwrap().capacity, 4);
    let ops: Vec<AddOp> = (0..6)
        .map(|i| AddOp::new(i, i % 2, &gen_flow(15000 + i, 5001)))
        .collect();
    let ack = g.add(ops, T).unwrap();
    assert_eq!(
        ack.statuses,
        st(&[
            OpStatus::Ok,
            OpStatus::Ok,
            OpStatus::Ok,
            OpStatus::Ok,
            OpStatus::TableFull,
            OpStatus::TableFull
        ])
    );
    // In use: refused, with the way out in the message; nothing changed.
    for (k, v) in [
        ("table_capacity", SetValue::from(16)),
        ("buckets", SetValue::from("64x2")),
    ] {
        let e = c.set(k, v).unwrap_err().to_string();
        assert!(
            e.contains("4 live filters") && e.contains("unload"),
            "{k}: {e}"
        );
    }
    assert_eq!(c.table().unwrap().capacity, 4);

    // A FLUSH (what an unloading driver sends) empties it: now it may change.
    let r = g.request(&Message::Flush(DelReason::Unload), T).unwrap();
    assert!(matches!(r.message, Message::Ack(_)), "{r:?}");
    let k = c.set("buckets", "4x1").unwrap();
    assert_eq!((k.buckets, k.ways), (4, 1));
    let caps = g.hello(T).unwrap();
    assert_eq!((caps.capacity, caps.buckets, caps.ways), (4, 4, 1));
    let tp = Toeplitz::default();
    let flows: Vec<FlowKey> = (16000..16100).map(|p| gen_flow(p, 5001)).collect();
    let b0 = tp.hash_flow(&flows[0]) % 4;
    let same = flows
        .iter()
        .find(|k| tp.hash_flow(k) % 4 == b0 && **k != flows[0])
        .unwrap();
    let ack = g
        .add(vec![AddOp::new(1, 0, &flows[0]), AddOp::new(2, 1, same)], T)
        .unwrap();
    assert_eq!(ack.statuses, st(&[OpStatus::Ok, OpStatus::BucketFull]));
    let t = c.table().unwrap();
    assert_eq!(t.filters[0].bucket, Some(b0));

    // Back to the boot geometry once empty again; totals were kept.
    g.request(&Message::Flush(DelReason::Unload), T).unwrap();
    c.set("buckets", "none").unwrap();
    let k = c.set("table_capacity", 64).unwrap();
    assert_eq!(k.capacity, 64);
    assert_eq!(k.buckets, 0);
    let s = c.stats().unwrap();
    assert_eq!(s.table.adds, 5);
    assert_eq!(s.table.rejects.table_full, 2);
    assert_eq!(s.table.rejects.bucket_full, 1);
    assert_eq!(s.table.capacity, 64);
}

/// The `misroute` fault: with it on, every frame that hits a filter lands
/// on the next rx queue after the filter's (as the test frontend, the
/// "guest", sees it), `rx_filter` still counts it and `peer.misrouted`
/// counts the lie; with it off again, the filter's queue.
#[test]
fn misroute_delivers_filter_hits_to_another_queue() {
    let d = daemon(&["--queues", "4"]);
    let mut g = guest(&d, 4, 4);
    let mut c = ctl(&d);
    g.hello(T).expect("HELLO");
    let flow = gen_flow(13000, 5001);
    let target = (rss_queue(&flow, 4) + 1) % 4;
    let ack = g.add(vec![AddOp::new(3, target, &flow)], T).expect("ADD");
    assert!(ack.statuses.iter().all(|s| *s == 0), "{ack:?}");
    let burst = |g: &mut vnic_frontend::guest::Guest, c: &mut Client| {
        gen_burst(
            c,
            &FlowSpec::new()
                .flows(1)
                .sport("13000")
                .count(20)
                .rate(10000),
        );
        g.wait_until(T, "burst", |g| g.stashed() >= 20).unwrap();
        g.take_all()
            .into_iter()
            .map(|r| r.rxq)
            .collect::<Vec<u16>>()
    };
    assert!(burst(&mut g, &mut c).iter().all(|&q| q == target));
    let k = c.set("misroute", "1").expect("set misroute");
    assert!(k.misroute, "{k:?}");
    let before = c.stats().unwrap();
    let qs = burst(&mut g, &mut c);
    let wrong = (target + 1) % 4;
    assert!(
        qs.iter().all(|&q| q == wrong),
        "misroute on: expected every frame on rxq {wrong}, got {qs:?}"
    );
    let after = c.stats().unwrap();
    assert_eq!(after.peer.misrouted - before.peer.misrouted, 20);
    assert_eq!(
        sum_queues(&after, |q| q.rx_filter) - sum_queues(&before, |q| q.rx_filter),
        20
    );
    c.set("misroute", 0).expect("set misroute");
    assert!(burst(&mut g, &mut c).iter().all(|&q| q == target));
    // Bad values are refused with the knob's name.
    let e = c.set("misroute", "maybe").unwrap_err().to_string();
    assert!(e.contains("misroute") && e.contains("0/1"), "{e}");
}

/// `rogue_responder`: a second station answers too. Every CAPS and ACK
/// arrives twice, first from another MAC (the CAPS with a wrong nonce, as
/// one that did not see the HELLO would send), then from the device; the
/// device counts the driver's frames by destination (HELLO to the
/// link-local group, the rest to the device).
#[test]
fn rogue_responder_answers_before_the_device_from_another_station() {
    let d = daemon(&["--queues", "2"]);
    let mut c = ctl(&d);
    let mut g = guest(&d, 2, 2);
    c.set("rogue_responder", 1).unwrap();
    let seq = g.send_mgmt(&Message::Hello(arfs::proto::Hello {
        driver_version: 1,
        nonce: 0x0123_4567,
        mac: vnic_frontend::guest::GUEST_MAC,
    }));
    g.wait_until(T, "two CAPS", |g| {
        g.replies.iter().filter(|r| r.header.seq == seq).count() == 2
    })
    .unwrap();
    let caps: Vec<_> = g.replies.drain(..).collect();
    assert_ne!(
        caps[0].src,
        arfs::proto::DEVICE_MAC,
        "the rogue copy comes first"
    );
    assert_eq!(caps[1].src, arfs::proto::DEVICE_MAC);
    let nonce = |r: &vnic_frontend::guest::Reply| match &r.message {
        Message::Caps(c) => c.nonce,
        m => panic!("not a CAPS: {m:?}"),
    };
    assert_ne!(nonce(&caps[0]), 0x0123_4567);
    assert_eq!(nonce(&caps[1]), 0x0123_4567);
    g.generation = caps[1].header.generation;
    let k = gen_flow(10_000, 20_000);
    let seq = g.send_mgmt(&Message::Add(vec![AddOp::new(1, 1, &k)]));
    g.wait_until(T, "two ACKs", |g| {
        g.replies.iter().filter(|r| r.header.seq == seq).count() == 2
    })
    .unwrap();
    let acks: Vec<_> = g.replies.drain(..).collect();
    assert_ne!(acks[0].src, arfs::proto::DEVICE_MAC);
    assert_eq!(acks[1].src, arfs::proto::DEVICE_MAC);
    assert_eq!(acks[0].message, acks[1].message);
    let s = c.stats().unwrap();
    assert_eq!(s.mgmt.rogue_sent, 2);
    assert_eq!(s.mgmt.caps_sent, 1);
    assert_eq!(s.mgmt.dst.hello_to_group, 1);
    assert_eq!(s.mgmt.dst.to_device, 1);
    assert_eq!(s.mgmt.dst.to_broadcast, 0);
    // Off again: one answer per request.
    c.set("rogue_responder", 0).unwrap();
    g.add(vec![AddOp::new(2, 1, &gen_flow(10_000, 20_001))], T)
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    g.poll();
    assert!(g.replies.is_empty(), "{:?}", g.replies);
}

/// The trace's lines, read (and re-read while the writer catches up) until
/// `done` holds of them.
fn trace_lines(
    path: &std::path::Path,
    what: &str,
    done: impl Fn(&[arfs::TraceRecord]) -> bool,
) -> Vec<arfs::TraceRecord> {
    let deadline = Instant::now() + T;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<arfs::TraceRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if done(&lines) {
            return lines;
        }
        assert!(Instant::now() < deadline, "trace: {what}: {lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn trace_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vnic-faults-{}-{name}.jsonl", std::process::id()))
}

/// A guest that stops posting receive buffers: the device's replies wait in
/// its backlog, then are dropped. Each drop is counted
/// (`mgmt.replies_dropped_no_buffers`) and traced as a `mgmt_drop`
/// (`to_driver`, `no_buffer`) naming the dropped ACK's seq; with buffers
/// back, every request's ACK was either received or named by such a line,
/// never both.
#[test]
fn replies_dropped_for_want_of_buffers_are_counted_and_traced() {
    let path = trace_path("nobuf");
    let d = daemon(&["--queues", "1", "--trace", path.to_str().unwrap()]);
    let mut c = ctl(&d);
    let mut g = Guest::connect_with(&d.socket, opts(1, 16), 1, true).unwrap();
    wait_stats(&mut c, "1 enabled pair", |s| s.enabled_pairs == 1);
    g.hello(T).expect("HELLO");
    g.no_refill[0] = true;
    let n = 400u32;
    let first = g.seq;
    for _ in 0..n {
        g.send_mgmt(&Message::Flush(DelReason::Flush));
        g.poll();
    }
    wait_stats(&mut c, "every FLUSH applied", |s| {
        s.table.flushes == u64::from(n)
    });
    // The worker delivers or drops the replies after the table applied
    // their requests: wait until it is done (the count still for 300 ms).
    let last = std::cell::Cell::new((u64::MAX, Instant::now()));
    let s = wait_stats(&mut c, "the reply drops to settle", |s| {
        let d = s.mgmt.replies_dropped_no_buffers;
        if d != last.get().0 {
            last.set((d, Instant::now()));
        }
        last.get().1.elapsed() >= Duration::from_millis(300)
    });
    let dropped = s.mgmt.replies_dropped_no_buffers;
    assert!(
        dropped > 0,
        "no reply dropped with 16 buffers for {n}: {s:?}"
    );
    let lines = trace_lines(&path, "one no_buffer line per dropped reply", |l| {
        l.iter()
            .filter(|r| r.reason.as_deref() == Some("no_buffer"))
            .count() as u64
            >= dropped
    });
    let nobuf: Vec<&arfs::TraceRecord> = lines
        .iter()
        .filter(|r| r.reason.as_deref() == Some("no_buffer"))
        .collect();
    assert_eq!(nobuf.len() as u64, dropped, "{nobuf:?}");
    let mut lost = std::collections::BTreeSet::new();
    for r in &nobuf {
        assert_eq!(r.event, arfs::EventKind::MgmtDrop, "{r:?}");
        assert_eq!(r.dir, Some(arfs::proto::Direction::ToDriver), "{r:?}");
        assert_eq!(r.msg_type.as_deref(), Some("ACK"), "{r:?}");
        assert_eq!(r.gen, g.generation, "{r:?}");
        let seq = r.seq.expect("a dropped ACK's seq");
        assert!(seq.wrapping_sub(first) < n, "seq {seq} was never sent");
        assert!(lost.insert(seq), "seq {seq} dropped twice");
    }
    // Buffers again: the backlog comes through.
    g.no_refill[0] = false;
    g.wait_until(T, "every ACK received or dropped", |g| {
        g.replies.len() as u64 + dropped >= u64::from(n)
    })
    .unwrap();
    let got: std::collections::BTreeSet<u32> = g.replies.iter().map(|r| r.header.seq).collect();
    assert_eq!(got.len(), g.replies.len(), "an ACK received twice");
    assert!(
        got.is_disjoint(&lost),
        "an ACK both received and traced as dropped"
    );
    assert_eq!(got.len() as u64 + dropped, u64::from(n));
    assert!(g.faults.is_empty(), "{:?}", g.faults);
    let _ = std::fs::remove_file(&path);
}

/// Requests still waiting for their programming latency when the
/// generation changes are discarded, never applied nor acknowledged: the
/// `reset` line's `dropped` counts exactly the requests the frontend sent
/// and never saw answered.
#[test]
fn a_reset_counts_the_requests_it_discards() {
    let path = trace_path("reset-dropped");
    let d = daemon(&["--queues", "2", "--trace", path.to_str().unwrap()]);
    let mut c = ctl(&d);
    let mut g = guest(&d, 2, 2);
    wait_stats(&mut c, "2 enabled pairs", |s| s.enabled_pairs == 2);
    g.hello(T).expect("HELLO");
    let ack = g
        .add(vec![AddOp::new(1, 1, &gen_flow(14000, 5001))], T)
        .unwrap();
    assert_eq!(ack.statuses, st(&[OpStatus::Ok]));
    c.set("program_latency", "10s").unwrap();
    let sent: Vec<u32> = (0..3u16)
        .map(|i| {
            g.send_mgmt(&Message::Add(vec![AddOp::new(
                2 + i,
                0,
                &gen_flow(14001 + i, 5001),
            )]))
        })
        .collect();
    wait_stats(&mut c, "3 requests pending", |s| {
        s.mgmt.pending_requests == 3
    });
    // The frontend goes away (a guest reboot): a new generation.
    drop(g);
    wait_stats(&mut c, "disconnect noticed", |s| !s.connected);
    // The reset after the filter's add (the connection's own start wrote
    // one too, with nothing to drop).
    let after_add = |l: &[arfs::TraceRecord]| {
        let a = l.iter().position(|r| r.event == arfs::EventKind::Add)?;
        l[a..]
            .iter()
            .find(|r| r.event == arfs::EventKind::Reset)
            .cloned()
    };
    let lines = trace_lines(&path, "a reset after the add", |l| after_add(l).is_some());
    let reset = after_add(&lines).unwrap();
    assert_eq!(reset.dropped, Some(3), "{reset:?}");
    assert_eq!(reset.count, Some(1), "the one applied filter: {reset:?}");
    for seq in &sent {
        assert!(
            !lines.iter().any(|r| r.seq == Some(*seq)),
            "discarded request {seq} has a line: {lines:?}"
        );
    }
    c.set("program_latency", "0").unwrap();
    let _ = std::fs::remove_file(&path);
}
