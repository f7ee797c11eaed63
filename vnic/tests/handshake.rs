//! vhost-user session start against the real daemon: feature and protocol
//! negotiation, queue count, memory table (both ways), ring setup at the ring
//! size QEMU uses, and enabling 1..N queue pairs (RSS then spreads exactly
//! as `arfs` predicts over the enabled pairs only).

// Test code: d = daemon, g = guest, c = control client, s = stats, t = table.
#![allow(clippy::many_single_char_names)]

mod common;

use std::collections::BTreeMap;

use common::*;
use vhost::vhost_user::message::VhostUserProtocolFeatures as P;
use vnic_frontend::features as F;
use vnic_frontend::guest::Guest;
use vnic_frontend::{Driver, Options};

#[test]
fn negotiates_features_protocol_and_queue_count() {
    let d = daemon(&["--queues", "4"]);
    let mut drv = Driver::connect(&d.socket, T, opts(4, 1024)).expect("connect");

    assert_eq!(
        drv.offered & F::REQUIRED,
        F::REQUIRED,
        "device must offer VERSION_1|MQ|MRG_RXBUF|EVENT_IDX|INDIRECT_DESC|PROTOCOL_FEATURES, offered {:#x}",
        drv.offered
    );
    // Things a vhost-user net backend on vhost 0.18 must not offer.
    for (bit, name) in [
        (3, "MTU (NET_SET_MTU unsupported)"),
        (17, "CTRL_VQ (QEMU owns the control queue)"),
        (26, "LOG_ALL (no dirty logging)"),
        (34, "RING_PACKED (split rings only)"),
        (40, "RING_RESET"),
    ] {
        assert_eq!(drv.offered & (1u64 << bit), 0, "device offers {name}");
    }
    assert_eq!(drv.acked, drv.offered & (F::REQUIRED), "acked set");

    let want = P::MQ | P::REPLY_ACK | P::CONFIGURE_MEM_SLOTS;
    assert!(
        drv.offered_protocol.contains(want),
        "protocol features offered {:?}",
        drv.offered_protocol
    );
    for bad in [
        P::LOG_SHMFD,
        P::RARP,
        P::MTU,
        P::INFLIGHT_SHMFD,
        P::INBAND_NOTIFICATIONS,
        P::STATUS,
    ] {
        assert!(
            !drv.offered_protocol.intersects(bad),
            "device offers unsupported protocol feature {bad:?}"
        );
    }
    assert_eq!(drv.acked_protocol, want);
    assert_eq!(drv.queue_num, 8, "GET_QUEUE_NUM for --queues 4");
    assert!(drv.max_mem_slots.unwrap() >= 1, "GET_MAX_MEM_SLOTS");

    // All 8 vrings at QEMU's 1024 entries, every request REPLY_ACKed.
    let qps = drv.start_pairs(4).expect("ring setup");
    assert_eq!(qps.len(), 4);

    let mut c = ctl(&d);
    let s = wait_stats(&mut c, "4 pairs enabled", |s| {
        s.connected && s.enabled_pairs == 4
    });
    assert_eq!(s.queue_pairs, 4);
    assert_eq!(s.connections, 1);
}

#[test]
fn rejects_more_queue_pairs_than_offered() {
    let d = daemon(&["--queues", "2"]);
    let err = Driver::connect(&d.socket, T, opts(3, 256)).expect_err("3 pairs on a 2-pair device");
    assert!(err.to_string().contains("device has 4 vrings"), "{err}");
}

/// Memory given with ADD_MEM_REG (CONFIGURE_MEM_SLOTS) instead of
/// SET_MEM_TABLE works the same: frames flow and a management round trip
/// completes.
#[test]
fn add_mem_reg_path_moves_frames() {
    let d = daemon(&["--queues", "1"]);
    let o = Options {
        add_mem_reg: true,
        ..opts(1, 256)
    };
    let mut g = Guest::connect(&d.socket, o, 1).expect("connect with ADD_MEM_REG");
    let caps = g.hello(T).expect("HELLO -> CAPS");
    assert_eq!((caps.max_queue_pairs, caps.enabled_queue_pairs), (1, 1));
    let mut c = ctl(&d);
    gen_burst(
        &mut c,
        &FlowSpec::new()
            .flows(4)
            .sport("10000-10003")
            .count(40)
            .rate(0),
    );
    g.wait_until(T, "40 generator frames", |g| g.stashed() >= 40)
        .unwrap();
    assert_eq!(g.stashed(), 40);
    assert!(g.faults.is_empty(), "{:?}", g.faults);
    // `ctl stats` shows the rings as the 50 ms poll saw them: running, the
    // 40 frames and the CAPS reply used on rx, the HELLO taken from tx.
    let pair0 = |s: &Stats| {
        s.rings
            .as_ref()
            .and_then(|r| r.pairs.first().copied().flatten())
    };
    let s = wait_stats(&mut c, "the poll to see the rings", |s| {
        pair0(s).is_some_and(|p| p.rx.next_used == 41)
    });
    let p = pair0(&s).unwrap();
    let (rx, tx) = (p.rx, p.tx);
    assert_eq!((rx.enabled, rx.ready), (true, true), "{rx:?}");
    assert_eq!(tx.avail, Some(tx.next_avail), "tx fully taken: {tx:?}");
    assert_eq!(tx.next_avail, 1, "{tx:?}");
    let rings = s.rings.as_ref().unwrap();
    assert!(rings.age_ms.unwrap() < 5_000, "{s:?}");
    assert_eq!(rings.watchdog_nudges, 0);
}

/// Enable pairs one by one (as QEMU does when the guest raises VQ_PAIRS):
/// after each step CAPS reports the count, and 256 generator flows land
/// exactly where Toeplitz over `n` enabled queues says, frame by frame.
#[test]
fn enabling_pairs_one_by_one_rss_follows() {
    const PAIRS: u16 = 4;
    const FLOWS: u64 = 256;
    let d = daemon(&["--queues", "4"]);
    let mut g = guest(&d, PAIRS, 0);
    let mut c = ctl(&d);
    for n in 1..=PAIRS {
        g.drv.enable_pair(n - 1, true).expect("SET_VRING_ENABLE");
        wait_stats(&mut c, &format!("{n} pairs enabled"), |s| {
            s.enabled_pairs == n
        });
        let caps = g.hello(T).expect("HELLO");
        assert_eq!(caps.enabled_queue_pairs, n, "CAPS after enabling {n}");
        assert_eq!(caps.max_queue_pairs, PAIRS);

        let before = c.stats().unwrap();
        // 256 tuples (sport 20000..20255), 2 frames each.
        gen_burst(
            &mut c,
            &FlowSpec::new()
                .flows(FLOWS as u32)
                .sport("20000-20255")
                .count(2 * FLOWS)
                .rate(20000),
        );
        g.wait_until(T, "all generator frames", |g| {
            g.stashed() as u64 >= 2 * FLOWS
        })
        .unwrap();
        let got = g.take_all();
        assert_eq!(got.len() as u64, 2 * FLOWS);
        let mut per_q = BTreeMap::new();
        let mut wrong = Vec::new();
        for r in &got {
            let k = flow_of(&r.frame);
            let want = rss_queue(&k, n);
            *per_q.entry(r.rxq).or_insert(0u64) += 1;
            if r.rxq != want {
                wrong.push(format!("{k}: rxq {} want {want}", r.rxq));
            }
        }
        assert!(
            wrong.is_empty(),
            "{n} pairs: {} misrouted, e.g. {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        assert_eq!(
            per_q.len(),
            n as usize,
            "{n} pairs: every enabled queue used: {per_q:?}"
        );
        let after = c.stats().unwrap();
        for q in 0..PAIRS as usize {
            let rss = after.queues[q].rx_rss - before.queues[q].rx_rss;
            assert_eq!(
                rss,
                per_q.get(&(q as u16)).copied().unwrap_or(0),
                "queue {q} rx_rss"
            );
        }
        assert_eq!(sum_queues(&after, |q| q.rx_drops), 0, "no drops");
        assert_eq!(sum_queues(&after, |q| q.rx_filter), 0);
    }
    // Disable the last pair: CAPS and RSS shrink back to 3.
    g.drv.enable_pair(PAIRS - 1, false).unwrap();
    wait_stats(&mut c, "3 pairs enabled", |s| s.enabled_pairs == 3);
    assert_eq!(g.hello(T).unwrap().enabled_queue_pairs, 3);
    gen_burst(
        &mut c,
        &FlowSpec::new()
            .flows(FLOWS as u32)
            .sport("20000-20255")
            .count(FLOWS)
            .rate(20000),
    );
    if let Err(e) = g.wait_until(T, "frames after disabling", |g| g.stashed() as u64 >= FLOWS) {
        panic!(
            "{e}\nstats: {:?}\ngen: {:?}",
            c.stats().unwrap(),
            c.gen_list().unwrap()
        );
    }
    for r in g.take_all() {
        assert_eq!(r.rxq, rss_queue(&flow_of(&r.frame), 3));
    }
    assert!(g.faults.is_empty(), "{:?}", g.faults);
}
