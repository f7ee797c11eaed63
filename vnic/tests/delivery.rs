//! Issue 23: what the generator's frames carry (per-flow sequence number,
//! tag and fill, a valid UDP checksum over IPv4 and IPv6), checked with
//! the guest agent's own checker (`vnic_agent::payload`) over the real
//! socket; and the path fault knobs (`misroute_rate`, `drop_rate`,
//! `corrupt_rate`), each applied after the filter hit is counted.

// Test code: d = daemon, g = guest, c = control client.
#![allow(clippy::many_single_char_names)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use arfs::proto::AddOp;
use common::*;
use vnic_agent::payload::{verify, Verdict};
use vnic_frontend::guest::Guest;

/// (sport, dport, UDP payload) of an IPv4 or IPv6 UDP frame whose UDP
/// checksum verifies (computed here, not with the daemon's code).
fn udp_checked(f: &[u8]) -> (u16, u16, Vec<u8>) {
    let (ok, r) = udp_parsed(f);
    assert!(ok, "UDP checksum of {f:02x?}");
    r
}

/// Whether the UDP checksum of an IPv4 or IPv6 UDP frame verifies, and
/// its (sport, dport, UDP payload).
fn udp_parsed(f: &[u8]) -> (bool, (u16, u16, Vec<u8>)) {
    let et = u16::from_be_bytes([f[12], f[13]]);
    let (l4, pseudo) = match et {
        0x0800 => {
            assert_eq!(f[14], 0x45);
            assert_eq!(f[23], 17);
            let mut p = f[26..34].to_vec();
            p.extend_from_slice(&[0, 17]);
            (34, p)
        }
        0x86dd => {
            assert_eq!(f[20], 17);
            let mut p = f[22..54].to_vec();
            p.extend_from_slice(&[0, 0]);
            (54, p)
        }
        _ => panic!("not IP: {f:02x?}"),
    };
    let ulen = usize::from(u16::from_be_bytes([f[l4 + 4], f[l4 + 5]]));
    let udp = &f[l4..l4 + ulen];
    assert_ne!(&udp[6..8], &[0, 0], "UDP checksum present");
    let mut sum: u64 = 0;
    let mut words = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    words(&pseudo);
    words(&(ulen as u32).to_be_bytes()[if et == 0x0800 { 2 } else { 0 }..]);
    if et == 0x86dd {
        words(&[0, 0, 0, 17]);
    }
    words(udp);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    (
        sum == 0xffff,
        (
            u16::from_be_bytes([udp[0], udp[1]]),
            u16::from_be_bytes([udp[2], udp[3]]),
            udp[8..].to_vec(),
        ),
    )
}

/// Sequence numbers per (sport, dport), asserting every frame verifies.
fn seqs(g: &mut Guest) -> BTreeMap<(u16, u16), Vec<u64>> {
    let mut m: BTreeMap<(u16, u16), Vec<u64>> = BTreeMap::new();
    for r in g.take_all() {
        let (sp, dp, p) = udp_checked(&r.frame.data);
        match verify(&p, sp, dp) {
            Verdict::Seq { seq, .. } => m.entry((sp, dp)).or_default().push(seq),
            v => panic!("{sp} -> {dp}: {v:?} for payload {p:02x?}"),
        }
    }
    for v in m.values_mut() {
        v.sort_unstable();
    }
    m
}

#[test]
fn generator_frames_carry_seq_and_pattern() {
    let d = daemon(&["--queues", "2"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    // IPv4 and IPv6, even and odd payload lengths, stamped and not.
    let sets = [
        FlowSpec::new()
            .flows(3)
            .sport("11000-11002")
            .dport("5001")
            .count(60)
            .rate(20000)
            .size(128),
        FlowSpec::new()
            .flows(2)
            .sport("11100-11101")
            .dport("5001")
            .count(40)
            .rate(20000)
            .size(101),
        FlowSpec::new()
            .flows(2)
            .sport("11200-11201")
            .dport("5001")
            .count(40)
            .rate(20000)
            .size(128)
            .stamp(true),
        FlowSpec::new()
            .flows(2)
            .src("fd00:2::1")
            .dst("fd00:2::15")
            .sport("11300-11301")
            .dport("5002")
            .count(40)
            .rate(20000)
            .size(128),
        FlowSpec::new()
            .flows(2)
            .src("fd00:2::1")
            .dst("fd00:2::15")
            .sport("11400-11401")
            .dport("5002")
            .count(40)
            .rate(20000)
            .size(111)
            .stamp(true),
    ];
    let mut want = 0;
    for s in &sets {
        gen_burst(&mut c, s);
        want += s.count.unwrap() as usize;
    }
    g.wait_until(T, "every frame", |g| g.stashed() >= want)
        .unwrap();
    let m = seqs(&mut g);
    assert_eq!(m.len(), 11, "{m:?}");
    for ((sp, _), v) in &m {
        assert_eq!(v, &(0..20).collect::<Vec<u64>>(), "flow from :{sp}");
    }

    // Paused and resumed, a set goes on where it stopped: no sequence
    // number twice, none skipped, and `sent` says how many there were.
    let id = c
        .gen_start(
            &FlowSpec::new()
                .flows(1)
                .sport("12000")
                .dport("5003")
                .rate(2000)
                .size(128),
        )
        .unwrap();
    let sent = |c: &mut Client| {
        let l = c.gen_list().unwrap();
        l.iter().find(|s| s.id == id).unwrap().sent
    };
    let mut all = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(100));
        c.gen_pause(Some(id)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let n = sent(&mut c) as usize;
        g.wait_until(T, "the paused set's frames", |g| {
            g.stashed() >= n - all.len()
        })
        .unwrap();
        all.extend(seqs(&mut g).remove(&(12000, 5003)).unwrap_or_default());
        assert_eq!(all.len(), n);
        c.gen_resume(Some(id)).unwrap();
    }
    all.sort_unstable();
    assert!(all.len() > 100, "{}", all.len());
    assert_eq!(all, (0..all.len() as u64).collect::<Vec<_>>());
    let e = c.gen_pause(Some(999)).unwrap_err().to_string();
    assert!(e.contains("no flow set 999"), "{e}");
}

/// `--rx-stores`: streamed and plain stores write the same frames (every
/// payload, sequence number and UDP checksum verified by the guest's own
/// checker, frames of 74 to 1000 bytes at line offsets the stage streams
/// and the tails it copies), and `ctl stats` says which mode wrote them:
/// `plain` counts every frame in rx_plain, `stream` none; `auto` starts
/// streaming and probes plain copies only after a run of 1920 rx batches
/// that delivered 16 frames a batch on average (30720 frames at the
/// least; these are 400), so it counts none either. No mode changes.
#[test]
fn each_rx_store_mode_writes_the_same_frames_and_says_which_it_used() {
    for mode in ["plain", "stream", "auto"] {
        let d = daemon(&["--queues", "1", "--rx-stores", mode]);
        let mut g = guest(&d, 1, 1);
        let mut c = ctl(&d);
        let mut want = 0;
        for (i, size) in [74, 129, 600, 1000].into_iter().enumerate() {
            let sport = 14000 + 10 * i as u16;
            gen_burst(
                &mut c,
                &FlowSpec::new()
                    .flows(2)
                    .sport(format!("{sport}-{}", sport + 1))
                    .dport("5001")
                    .count(100)
                    .rate(0)
                    .size(size),
            );
            want += 100;
        }
        g.wait_until(T, "every frame", |g| g.stashed() >= want)
            .unwrap();
        let m = seqs(&mut g);
        assert_eq!(m.len(), 8, "{mode}: {m:?}");
        for ((sp, _), v) in &m {
            assert_eq!(v, &(0..50).collect::<Vec<u64>>(), "{mode}: flow from :{sp}");
        }
        let s = wait_stats(&mut c, "the frames counted", |s| {
            s.queues[0].rx_packets == want as u64
        });
        let q = &s.queues[0];
        let plain = if mode == "plain" { q.rx_packets } else { 0 };
        assert_eq!(
            (q.rx_plain, q.rx_store_switches),
            (plain, 0),
            "{mode}: {q:?}"
        );
    }
}

/// The three path fault knobs, each on a steered flow at rate 1 (and
/// misroute at 1/2): the filter's hits and the queues' filter deliveries
/// count every frame as if nothing happened; what the "guest" receives
/// shows the fault; an unsteered flow is untouched.
#[test]
fn path_fault_knobs_act_after_the_hit_is_counted() {
    let d = daemon(&["--queues", "4"]);
    let mut g = guest(&d, 4, 4);
    let mut c = ctl(&d);
    g.hello(T).expect("HELLO");
    let flow = gen_flow(13000, 5001);
    let target = (rss_queue(&flow, 4) + 1) % 4;
    let wrong = (target + 1) % 4;
    let ack = g.add(vec![AddOp::new(3, target, &flow)], T).expect("ADD");
    assert!(ack.statuses.iter().all(|s| *s == 0), "{ack:?}");
    let hits = |c: &mut Client| c.table().unwrap().filters[0].hits;
    let spec = |n: u64| {
        FlowSpec::new()
            .flows(1)
            .sport("13000")
            .count(n)
            .rate(20000)
            .size(128)
    };
    // (frames, fault counter) per knob.
    let burst = |g: &mut Guest, c: &mut Client, n: u64, ctr: fn(&Stats) -> u64| {
        let (h0, s0) = (hits(c), c.stats().unwrap());
        gen_burst(c, &spec(n));
        let s1 = wait_stats(c, "every frame counted", |s| {
            sum_queues(s, |q| q.rx_filter) - sum_queues(&s0, |q| q.rx_filter) == n
        });
        std::thread::sleep(Duration::from_millis(100));
        g.poll();
        let got = g.take_all();
        assert_eq!(hits(c) - h0, n, "the filter counted every hit");
        (got, ctr(&s1) - ctr(&s0))
    };

    c.set("corrupt_rate", 1).unwrap();
    let (got, n) = burst(&mut g, &mut c, 20, |s| s.peer.fault_corrupted);
    assert_eq!((got.len(), n), (20, 20));
    for r in &got {
        assert_eq!(r.rxq, target);
        let (sp, dp, p) = udp_checked(&r.frame.data);
        assert_eq!(verify(&p, sp, dp), Verdict::Corrupt);
    }
    // An unsteered flow (no filter) is left alone.
    gen_burst(
        &mut c,
        &FlowSpec::new()
            .flows(1)
            .sport("13001")
            .count(10)
            .rate(20000)
            .size(128),
    );
    g.wait_until(T, "the unsteered burst", |g| g.stashed() >= 10)
        .unwrap();
    assert_eq!(seqs(&mut g)[&(13001, 5001)], (0..10).collect::<Vec<u64>>());
    c.set("corrupt_rate", 0).unwrap();

    // The same flip under a stale checksum: the guest's stack would drop it.
    c.set("bad_csum_rate", 1).unwrap();
    let (got, n) = burst(&mut g, &mut c, 20, |s| s.peer.fault_bad_csum);
    assert_eq!((got.len(), n), (20, 20));
    for r in &got {
        let (ok, (sp, dp, p)) = udp_parsed(&r.frame.data);
        assert!(!ok, "stale UDP checksum");
        assert_eq!(verify(&p, sp, dp), Verdict::Corrupt);
    }
    c.set("bad_csum_rate", 0).unwrap();

    c.set("drop_rate", "1.0").unwrap();
    let before = c.stats().unwrap();
    let (got, n) = burst(&mut g, &mut c, 20, |s| s.peer.fault_dropped);
    assert_eq!((got.len(), n), (0, 20), "dropped, yet counted delivered");
    let after = c.stats().unwrap();
    let q = |s: &Stats| s.queues[usize::from(target)].rx_packets;
    assert_eq!(q(&after) - q(&before), 20);
    c.set("drop_rate", 0).unwrap();

    let k = c.set("misroute_rate", 0.5).unwrap();
    // Exactly 0.5 (what the JSON reply compared before it had a type).
    assert_eq!(k.misroute_rate.to_bits(), 0.5f64.to_bits(), "{k:?}");
    let (got, n) = burst(&mut g, &mut c, 400, |s| s.peer.misrouted);
    let on_wrong = got.iter().filter(|r| r.rxq == wrong).count() as u64;
    let on_target = got.iter().filter(|r| r.rxq == target).count() as u64;
    assert_eq!(on_wrong + on_target, 400);
    assert_eq!(on_wrong, n, "peer.misrouted counts each misrouted frame");
    assert!(
        (100..300).contains(&on_wrong),
        "{on_wrong} of 400 at rate 1/2"
    );
    c.set("misroute_rate", 0).unwrap();

    // Truncated: every frame 16 bytes short, its checksum valid, what the
    // head says intact: only the length it carries tells.
    c.set("truncate_rate", 1).unwrap();
    let (got, n) = burst(&mut g, &mut c, 20, |s| s.peer.fault_truncated);
    assert_eq!((got.len(), n), (20, 20));
    for r in &got {
        let (sp, dp, p) = udp_checked(&r.frame.data);
        assert_eq!(p.len(), 128 - 42 - 16);
        assert_eq!(verify(&p, sp, dp), Verdict::BadLen);
    }
    c.set("truncate_rate", 0).unwrap();

    // Reordered: each frame drawn is held until the flow's next one, so at
    // rate 1 the pairs swap (1, 0, 3, 2, ...), on the filter's queue.
    c.set("reorder_rate", 1).unwrap();
    let (got, n) = burst(&mut g, &mut c, 20, |s| s.peer.fault_reordered);
    assert_eq!((got.len(), n), (20, 10));
    let order: Vec<u64> = got
        .iter()
        .map(|r| {
            assert_eq!(r.rxq, target);
            let (sp, dp, p) = udp_checked(&r.frame.data);
            match verify(&p, sp, dp) {
                Verdict::Seq { seq, .. } => seq,
                v => panic!("{v:?}"),
            }
        })
        .collect();
    let base = order.iter().min().copied().unwrap_or(0);
    let want: Vec<u64> = (0..20u64).map(|i| base + (i ^ 1)).collect();
    assert_eq!(order, want);
    // An odd frame out is held until the flow is quiet for 100 ms, then
    // delivered (the burst waits for every frame), not counted.
    let (got, n) = burst(&mut g, &mut c, 3, |s| s.peer.fault_reordered);
    assert_eq!((got.len(), n), (3, 1));
    c.set("reorder_rate", 0).unwrap();

    // Off again: everything intact on the filter's queue.
    let (got, _) = burst(&mut g, &mut c, 20, |s| s.peer.misrouted);
    assert!(got.iter().all(|r| r.rxq == target));
    for e in [
        c.set("drop_rate", 1.5).unwrap_err().to_string(),
        c.set("corrupt_rate", "x").unwrap_err().to_string(),
    ] {
        assert!(e.contains("_rate"), "{e}");
    }
}
