//! A hostile guest: every kind of broken descriptor chain the driver can
//! build, on TX and on RX. Each one must be counted by the device
//! (`tx_bad_chains` / `rx_bad_chains` of that queue, exactly +1), its head
//! given back in the used ring, the same queue must carry a good frame
//! right after it, and the other pair must not notice anything.

// Test code: d = daemon, g = guest, c = control client, q = queue, s = stats.
#![allow(clippy::many_single_char_names)]

mod common;

use std::time::Duration;

use common::*;
use vnic_frontend::guest::{Guest, GUEST_MAC};
use vnic_frontend::{build_frame, FrameSpec, Hostile};

fn good_tx_frame(sport: u16) -> Vec<u8> {
    build_frame(&FrameSpec {
        src_mac: GUEST_MAC,
        dst_mac: [0xff; 6],
        src: GUEST_IP.parse().unwrap(),
        dst: GEN_IP.parse().unwrap(),
        proto: 17,
        sport,
        dport: 9,
        len: 128,
    })
}

/// One counter of a queue.
type Counter = fn(&QueueStats) -> u64;

/// The `tx_bad_<reason>` counter each broken TX chain must land in (its
/// name, for the messages, and the field).
fn tx_reason(kind: Hostile) -> (&'static str, Counter) {
    match kind {
        Hostile::AddrOutOfMemory
        | Hostile::StraddlesEnd
        | Hostile::IndirectOutOfMemory
        | Hostile::IndirectEntryOutOfMemory => ("out_of_range", |q| q.tx_bad_out_of_range),
        Hostile::Loop | Hostile::ChainLongerThanRing => ("loop", |q| q.tx_bad_loop),
        Hostile::NextOutOfRange | Hostile::BadHead => ("bad_index", |q| q.tx_bad_bad_index),
        Hostile::ZeroLength => ("short_header", |q| q.tx_bad_short_header),
        Hostile::IndirectBadLength | Hostile::IndirectNested | Hostile::IndirectLongerThanRing => {
            ("indirect", |q| q.tx_bad_indirect)
        }
        Hostile::WrongDirection => ("writable", |q| q.tx_bad_writable),
        Hostile::TooLong => ("too_long", |q| q.tx_bad_too_long),
    }
}

/// The `tx_bad_*` counters that differ between two looks at a queue.
fn tx_bad_moved(a: &QueueStats, b: &QueueStats) -> Vec<String> {
    let (a, b) = (
        serde_json::to_value(a).unwrap(),
        serde_json::to_value(b).unwrap(),
    );
    a.as_object()
        .unwrap()
        .iter()
        .filter(|(k, v)| k.starts_with("tx_bad_") && b.get(k.as_str()) != Some(v))
        .map(|(k, _)| k.clone())
        .collect()
}

#[test]
fn hostile_tx_chains_are_counted_and_queue_keeps_working() {
    let d = daemon(&["--queues", "2"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    let good = good_tx_frame(40000);
    let mut failures = Vec::new();
    let kinds = Hostile::ALL.into_iter().chain(Hostile::TX_ONLY);
    for (i, kind) in kinds.enumerate() {
        let before = c.stats().unwrap();
        let (name, reason_of) = tx_reason(kind);
        let reason = format!("tx_bad_{name}");
        let tx = &mut g.qps[0].tx;
        tx.ring
            .push_hostile(kind, false)
            .expect("build hostile chain");
        tx.ring.notify();
        g.send(0, &good);
        let want_bad = before.queues[0].tx_bad_chains + 1;
        let want_pkts = before.queues[0].tx_packets + 1;
        // Both heads (hostile and good) come back ...
        if let Err(e) = g.wait_until(Duration::from_secs(20), "tx heads returned", |g| {
            g.qps[0].tx.ring.in_flight() == 0
        }) {
            failures.push(format!(
                "#{i} {kind:?}: device kept {} tx descriptors: {e}",
                g.qps[0].tx.ring.in_flight()
            ));
            break; // the ring state is unknown now
        }
        // ... the good frame reached the peer and the bad chain was counted.
        let s = vnic_frontend::harness::wait_for(Duration::from_secs(10), "counters", || {
            let s = c.stats().unwrap();
            (s.queues[0].tx_packets >= want_pkts && s.queues[0].tx_bad_chains >= want_bad)
                .then_some(s)
        })
        .unwrap_or_else(|_| c.stats().unwrap());
        if s.queues[0].tx_bad_chains != want_bad {
            failures.push(format!(
                "#{i} {kind:?}: tx_bad_chains {} want exactly {want_bad}",
                s.queues[0].tx_bad_chains
            ));
        }
        if reason_of(&s.queues[0]) != reason_of(&before.queues[0]) + 1 {
            failures.push(format!(
                "#{i} {kind:?}: {reason} {} want exactly {} (counted as {:?})",
                reason_of(&s.queues[0]),
                reason_of(&before.queues[0]) + 1,
                tx_bad_moved(&s.queues[0], &before.queues[0])
            ));
        }
        if s.queues[0].tx_packets != want_pkts {
            failures.push(format!(
                "#{i} {kind:?}: tx_packets {} want exactly {want_pkts} (only the good frame)",
                s.queues[0].tx_packets
            ));
        }
        if s.queues[0].tx_stopped.is_some() {
            failures.push(format!("#{i} {kind:?}: the ring was stopped"));
        }
    }
    // The other pair never saw any of it and still works.
    let before = c.stats().unwrap();
    g.send(1, &good_tx_frame(40001));
    let s = wait_stats(&mut c, "tx on pair 1", |s| {
        s.queues[1].tx_packets == before.queues[1].tx_packets + 1
    });
    assert_eq!(s.queues[1].tx_bad_chains, 0, "pair 1 unaffected");
    assert!(
        g.faults.is_empty(),
        "device faults seen by the driver: {:?}",
        g.faults
    );
    assert!(
        failures.is_empty(),
        "hostile TX chains:\n{}",
        failures.join("\n")
    );
}

#[test]
fn hostile_rx_chains_are_counted_and_queue_keeps_working() {
    let d = daemon(&["--queues", "2"]);
    // Pair 0's rx ring starts empty so each hostile chain is the only buffer.
    let mut g = Guest::connect_with(&d.socket, opts(2, 256), 2, false).expect("connect");
    g.no_refill[1] = false;
    g.qps[1].rx.fill();
    let mut c = ctl(&d);
    let sport0 = (10000..=u16::MAX)
        .find(|&p| rss_queue(&gen_flow(p, 5001), 2) == 0)
        .unwrap();
    let sport1 = (10000..=u16::MAX)
        .find(|&p| rss_queue(&gen_flow(p, 5001), 2) == 1)
        .unwrap();
    let mut failures = Vec::new();
    for (i, kind) in Hostile::ALL.into_iter().enumerate() {
        let before = c.stats().unwrap();
        let rx = &mut g.qps[0].rx;
        rx.ring
            .push_hostile(kind, true)
            .expect("build hostile chain");
        rx.ring.notify();
        // One frame for queue 0 meets the hostile chain.
        gen_burst(
            &mut c,
            &FlowSpec::new()
                .flows(1)
                .sport(sport0.to_string())
                .count(1)
                .rate(1000),
        );
        let want_bad = before.queues[0].rx_bad_chains + 1;
        // The device gives the broken chain back (len 0) ...
        if let Err(e) = g.wait_until(Duration::from_secs(20), "hostile rx head returned", |g| {
            g.qps[0].rx.ring.in_flight() == 0
        }) {
            failures.push(format!(
                "#{i} {kind:?}: device kept {} rx descriptors: {e}",
                g.qps[0].rx.ring.in_flight()
            ));
            break;
        }
        // ... without writing a frame into it, and counts it.
        if !g.stash[0].is_empty() {
            failures.push(format!(
                "#{i} {kind:?}: a frame was delivered into the broken chain"
            ));
            g.stash[0].clear();
        }
        let s = vnic_frontend::harness::wait_for(Duration::from_secs(10), "rx_bad_chains", || {
            let s = c.stats().unwrap();
            (s.queues[0].rx_bad_chains >= want_bad).then_some(s)
        })
        .unwrap_or_else(|_| c.stats().unwrap());
        if s.queues[0].rx_bad_chains != want_bad {
            failures.push(format!(
                "#{i} {kind:?}: rx_bad_chains {} want exactly {want_bad}",
                s.queues[0].rx_bad_chains
            ));
        }
        // The next good buffer receives the next frame intact.
        g.qps[0].rx.post(1);
        g.qps[0].rx.ring.notify();
        gen_burst(
            &mut c,
            &FlowSpec::new()
                .flows(1)
                .sport(sport0.to_string())
                .count(1)
                .rate(1000),
        );
        if let Err(e) = g.wait_until(
            Duration::from_secs(20),
            "good frame after hostile chain",
            |g| g.stash[0].len() == 1,
        ) {
            failures.push(format!("#{i} {kind:?}: {e}"));
            break;
        }
        let f = g.stash[0].pop_front().unwrap();
        assert_eq!(
            flow_of(&f),
            gen_flow(sport0, 5001),
            "{kind:?}: frame intact"
        );
        assert_eq!(
            f.data.len(),
            64,
            "{kind:?}: default 64-byte generator frame"
        );
    }
    // Pair 1 was never affected.
    gen_burst(
        &mut c,
        &FlowSpec::new()
            .flows(1)
            .sport(sport1.to_string())
            .count(20)
            .rate(10000),
    );
    g.wait_until(T, "pair 1 frames", |g| g.stash[1].len() >= 20)
        .unwrap();
    let s = c.stats().unwrap();
    assert_eq!(s.queues[1].rx_bad_chains, 0);
    assert_eq!(s.queues[1].rx_drops, 0);
    assert!(
        g.faults.is_empty(),
        "device faults seen by the driver: {:?}",
        g.faults
    );
    assert!(
        failures.is_empty(),
        "hostile RX chains:\n{}",
        failures.join("\n")
    );
}

/// A driver that publishes an avail index more than a ring ahead of what
/// it filled, on TX and on RX, and kicks in a loop: each ring is stopped
/// once, counted once (`*_bad_avail_jump`), named in `ctl stats`
/// (`*_stopped`), signalled on the ring's error eventfd, logged once
/// (no line per kick); the other pair keeps working; after the frontend
/// restarts the rings (GET_VRING_BASE, set-up again) they carry frames.
#[test]
fn avail_index_jump_stops_the_ring_once_until_restarted() {
    let d = daemon(&["--queues", "2"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    let errs: Vec<_> = (0..2)
        .map(|_| vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    for (vring, e) in errs.iter().enumerate() {
        g.drv.set_vring_err(vring, e).expect("SET_VRING_ERR");
    }
    let size = g.qps[0].tx.ring.size();
    // 1,000 kicks with the index 102 past a full ring, on both rings.
    for _ in 0..1000 {
        g.qps[0].tx.ring.publish_jump(size + 102);
        g.qps[0].rx.ring.publish_jump(size + 102);
    }
    let s = wait_stats(&mut c, "both rings of pair 0 stopped", |s| {
        s.queues[0].tx_stopped.as_deref() == Some("avail_jump")
            && s.queues[0].rx_stopped.as_deref() == Some("avail_jump")
    });
    // More kicks change nothing.
    for _ in 0..1000 {
        g.qps[0].tx.ring.publish_jump(size + 102);
        g.qps[0].rx.ring.publish_jump(size + 102);
    }
    std::thread::sleep(Duration::from_millis(300));
    let s2 = c.stats().unwrap();
    let jumps: [(&str, Counter); 2] = [
        ("tx_bad_avail_jump", |q| q.tx_bad_avail_jump),
        ("rx_bad_avail_jump", |q| q.rx_bad_avail_jump),
    ];
    for (f, jump) in jumps {
        assert_eq!(
            jump(&s.queues[0]),
            1,
            "{f} counted once: {:#?}",
            s.queues[0]
        );
        assert_eq!(jump(&s2.queues[0]), 1, "{f} still once after more kicks");
    }
    assert_eq!(s2.queues[0].tx_bad_chains, 0, "no chain was popped");
    for (vring, e) in errs.iter().enumerate() {
        assert!(
            e.read().is_ok(),
            "vring {vring}'s error eventfd was not signalled"
        );
    }
    let log = d.log_text();
    let lines = log.lines().filter(|l| l.contains("ring stopped")).count();
    assert!(
        (1..=2).contains(&lines),
        "want one log line per stopped ring, got {lines}:\n{log}"
    );
    assert!(
        log.lines().count() < 20,
        "the kick loop flooded the log:\n{log}"
    );
    // Pair 1 is unaffected.
    let before = c.stats().unwrap();
    g.send(1, &good_tx_frame(40001));
    wait_stats(&mut c, "tx on pair 1", |s| {
        s.queues[1].tx_packets == before.queues[1].tx_packets + 1
    });
    // The frontend restarts pair 0's rings (what QEMU does on a guest
    // driver reset): they run again.
    g.drv.get_vring_base(0).expect("GET_VRING_BASE rx");
    g.drv.get_vring_base(1).expect("GET_VRING_BASE tx");
    let qp = g.drv.setup_pair(0).expect("set pair 0 up again");
    g.qps[0] = qp;
    g.drv.enable_pair(0, true).expect("enable pair 0");
    g.qps[0].rx.fill();
    g.qps[0].rx.ring.kick();
    let before = c.stats().unwrap();
    g.send(0, &good_tx_frame(40002));
    let s = wait_stats(&mut c, "pair 0 carries frames again", |s| {
        s.queues[0].tx_packets == before.queues[0].tx_packets + 1
            && s.queues[0].rx_stopped.is_none()
    });
    assert_eq!(s.queues[0].tx_stopped, None);
    assert_eq!(s.queues[0].tx_bad_avail_jump, 1);
}
