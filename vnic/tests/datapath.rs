//! The data path itself: MRG_RXBUF frames spanning several small buffers,
//! oversized frames without MRG_RXBUF, per-queue "no buffers" drops that
//! never hold up other queues, every TX descriptor layout reaching the
//! peer, IPv6 RSS, and the generator answering ARP and ping.

// Test code: d = daemon, g = guest, c = control client, s = stats, f = frame.
#![allow(clippy::many_single_char_names)]

mod common;

use std::time::Duration;

use common::*;
use vnic_frontend::features as F;
use vnic_frontend::guest::{Guest, GUEST_MAC};
use vnic_frontend::{build_frame, FrameSpec, Options, TxLayout, NET_HDR_LEN};

#[test]
fn mrg_rxbuf_frame_spans_small_buffers() {
    let d = daemon(&["--queues", "1"]);
    let mut g = Guest::connect_with(&d.socket, opts(1, 256), 1, false).unwrap();
    g.qps[0].rx.set_post_len(256);
    g.no_refill[0] = false;
    g.qps[0].rx.fill();
    let mut c = ctl(&d);
    gen_burst(
        &mut c,
        &FlowSpec::new().flows(1).count(20).rate(1000).size(1500),
    );
    g.wait_until(T, "20 large frames", |g| g.stashed() >= 20)
        .unwrap();
    let want_bufs = (1500 + NET_HDR_LEN).div_ceil(256) as u16;
    for f in g.stash[0].drain(..) {
        assert_eq!(f.data.len(), 1500);
        assert_eq!(f.num_buffers, want_bufs, "num_buffers");
        assert_eq!(f.hdr.num_buffers, want_bufs);
        assert_eq!(f.used_lens.iter().sum::<u32>() as usize, 1500 + NET_HDR_LEN);
        assert!(f.used_lens.iter().all(|&l| l <= 256));
        // IPv4 total length and UDP length as a 1500-byte frame needs.
        assert_eq!(u16::from_be_bytes([f.data[16], f.data[17]]), 1486);
        assert_eq!(u16::from_be_bytes([f.data[38], f.data[39]]), 1466);
        assert_eq!(flow_of(&f), gen_flow(10000, 5001));
    }
    let s = c.stats().unwrap();
    assert_eq!(s.queues[0].rx_packets, 20);
    assert_eq!(s.queues[0].rx_drops, 0);
    assert!(g.faults.is_empty(), "{:?}", g.faults);
}

#[test]
fn without_mrg_rxbuf_oversized_frames_are_dropped_and_counted() {
    let d = daemon(&["--queues", "1"]);
    let o = Options {
        features: F::REQUIRED & !F::MRG_RXBUF,
        ..opts(1, 256)
    };
    let mut g = Guest::connect_with(&d.socket, o, 1, false).unwrap();
    assert!(!g.drv.has(F::MRG_RXBUF));
    g.qps[0].rx.set_post_len(256);
    g.no_refill[0] = false;
    g.qps[0].rx.fill();
    let mut c = ctl(&d);
    gen_burst(
        &mut c,
        &FlowSpec::new().flows(1).count(5).rate(1000).size(1500),
    );
    wait_stats(&mut c, "5 too-big drops", |s| {
        s.queues[0].rx_drops_too_big == 5
    });
    // The ring is not stuck: small frames still arrive, one buffer each.
    gen_burst(
        &mut c,
        &FlowSpec::new().flows(1).count(5).rate(1000).size(200),
    );
    g.wait_until(T, "5 small frames", |g| g.stashed() >= 5)
        .unwrap();
    assert_eq!(g.stashed(), 5);
    for f in g.stash[0].drain(..) {
        assert_eq!(f.data.len(), 200);
        assert_eq!(f.used_lens, vec![(200 + NET_HDR_LEN) as u32]);
    }
    assert_eq!(c.stats().unwrap().queues[0].rx_packets, 5);
}

/// Queue 0 has no buffers: its frames are dropped and counted on queue 0
/// while queue 1 receives all of its frames.
#[test]
fn no_buffers_drops_only_that_queue() {
    let d = daemon(&["--queues", "2"]);
    let mut g = Guest::connect_with(&d.socket, opts(2, 256), 2, false).unwrap();
    g.no_refill[1] = false;
    g.qps[1].rx.fill();
    let mut c = ctl(&d);
    let p0 = (10000..=u16::MAX)
        .find(|&p| rss_queue(&gen_flow(p, 5001), 2) == 0)
        .unwrap();
    let p1 = (10000..=u16::MAX)
        .find(|&p| rss_queue(&gen_flow(p, 5001), 2) == 1)
        .unwrap();
    let a = c
        .gen_start(
            &FlowSpec::new()
                .flows(1)
                .sport(p0.to_string())
                .count(100)
                .rate(5000),
        )
        .unwrap();
    let b = c
        .gen_start(
            &FlowSpec::new()
                .flows(1)
                .sport(p1.to_string())
                .count(100)
                .rate(5000),
        )
        .unwrap();
    wait_gen_done(&mut c, a);
    wait_gen_done(&mut c, b);
    g.wait_until(T, "queue 1 frames", |g| g.stash[1].len() >= 100)
        .unwrap();
    let s = wait_stats(&mut c, "100 drops on queue 0", |s| {
        s.queues[0].rx_drops == 100
    });
    assert_eq!(s.queues[0].rx_drops_no_buffers, 100);
    assert_eq!(s.queues[0].rx_packets, 0);
    assert_eq!(s.queues[1].rx_packets, 100);
    assert_eq!(s.queues[1].rx_drops, 0);
    assert_eq!(g.stash[0].len(), 0);
    // Buffers on queue 0 now: its traffic resumes.
    g.no_refill[0] = false;
    g.qps[0].rx.fill();
    gen_burst(
        &mut c,
        &FlowSpec::new()
            .flows(1)
            .sport(p0.to_string())
            .count(10)
            .rate(5000),
    );
    g.wait_until(T, "queue 0 frames after refill", |g| g.stash[0].len() >= 10)
        .unwrap();
}

/// A filter moves a flow to the other pair's queue, which has no buffers:
/// the frames are handed from the worker that generates them to the other
/// worker (in batches) and each one is counted as a no-buffers drop on the
/// target queue, none lost and none on queue 0. Once the guest posts
/// buffers the flow is delivered there again, and from first to last every
/// generated frame is either delivered or counted as dropped.
#[test]
fn handed_off_frames_to_a_queue_without_buffers_are_counted_and_resume() {
    let d = daemon(&["--queues", "2"]);
    let mut g = Guest::connect_with(&d.socket, opts(2, 256), 2, false).unwrap();
    g.no_refill[0] = false;
    g.qps[0].rx.fill();
    let mut c = ctl(&d);
    wait_stats(&mut c, "2 pairs enabled", |s| s.enabled_pairs == 2);
    g.hello(T).unwrap();
    // A flow RSS puts on queue 0 (generated by worker 0), filtered to queue 1.
    let p = (10000..=u16::MAX)
        .find(|&p| rss_queue(&gen_flow(p, 5001), 2) == 0)
        .unwrap();
    let ack = g
        .add(vec![arfs::proto::AddOp::new(1, 1, &gen_flow(p, 5001))], T)
        .unwrap();
    assert!(
        ack.statuses.iter().all(|&x| x == arfs::OpStatus::Ok as u8),
        "{ack:?}"
    );
    let a = c
        .gen_start(
            &FlowSpec::new()
                .flows(1)
                .sport(p.to_string())
                .count(100)
                .rate(5000),
        )
        .unwrap();
    wait_gen_done(&mut c, a);
    let s = wait_stats(&mut c, "100 drops on queue 1", |s| {
        s.queues[1].rx_drops == 100
    });
    assert_eq!(s.queues[1].rx_drops_no_buffers, 100);
    assert_eq!(s.queues[1].rx_packets, 0);
    assert_eq!(s.queues[0].rx_drops, 0);
    // (Queue 0 only got the two management ACKs.)
    assert_eq!(s.queues[0].rx_filter + s.queues[0].rx_rss, 0);
    // Buffers on queue 1: the flow resumes there. (Frames generated before
    // worker 1 has seen the new buffers are still dropped, and counted.)
    g.no_refill[1] = false;
    g.qps[1].rx.fill();
    let mut sent = 100;
    for _ in 0..50 {
        gen_burst(
            &mut c,
            &FlowSpec::new()
                .flows(1)
                .sport(p.to_string())
                .count(10)
                .rate(5000),
        );
        sent += 10;
        if g.wait_until(Duration::from_millis(200), "frames on queue 1", |g| {
            g.stash[1].len() >= 10
        })
        .is_ok()
        {
            break;
        }
    }
    assert!(
        g.stash[1].len() >= 10,
        "no frame on queue 1 after refilling it"
    );
    let s = wait_stats(&mut c, "every frame delivered or dropped", |s| {
        s.queues[1].rx_packets + s.queues[1].rx_drops == sent
    });
    assert_eq!(s.queues[1].rx_filter, s.queues[1].rx_packets);
    assert_eq!(s.queues[1].rx_drops, s.queues[1].rx_drops_no_buffers);
    assert_eq!(s.queues[0].rx_filter + s.queues[0].rx_rss, 0);
    assert!(g.faults.is_empty(), "{:?}", g.faults);
}

#[test]
fn every_tx_layout_reaches_the_peer() {
    let d = daemon(&["--queues", "1"]);
    let mut g = guest(&d, 1, 1);
    let mut c = ctl(&d);
    let frame = build_frame(&FrameSpec {
        src_mac: GUEST_MAC,
        dst_mac: [0x02, 0x76, 0x6e, 0x69, 0x63, 0x01],
        src: GUEST_IP.parse().unwrap(),
        dst: GEN_IP.parse().unwrap(),
        proto: 17,
        sport: 7000,
        dport: 9,
        len: 300,
    });
    let before = c.stats().unwrap();
    for layout in [TxLayout::Single, TxLayout::SplitHeader, TxLayout::Indirect] {
        for _ in 0..50 {
            if g.qps[0].tx.push(&frame, layout).is_none() {
                assert!(g.qps[0].tx.ring.wait_used(1, T));
                g.qps[0].tx.reap().unwrap();
                g.qps[0].tx.push(&frame, layout).unwrap();
            }
        }
        g.qps[0].tx.ring.notify();
    }
    // tx_packets counts each frame as it is taken; the peer's sink counts
    // once per TX batch (its counters are shared by every worker), so the
    // two meet only when the batch has ended.
    let s = wait_stats(&mut c, "150 tx frames, all sunk", |s| {
        s.queues[0].tx_packets - before.queues[0].tx_packets == 150
            && s.peer.sink_packets - before.peer.sink_packets == 150
    });
    assert_eq!(s.queues[0].tx_bytes - before.queues[0].tx_bytes, 150 * 300);
    assert_eq!(s.peer.sink_packets - before.peer.sink_packets, 150);
    assert_eq!(s.queues[0].tx_bad_chains, 0);
    g.wait_until(T, "tx completions", |g| g.qps[0].tx.ring.in_flight() == 0)
        .unwrap();
    assert!(g.faults.is_empty(), "{:?}", g.faults);
}

#[test]
fn ipv6_flows_follow_toeplitz() {
    let d = daemon(&["--queues", "4"]);
    let mut g = guest(&d, 4, 4);
    let mut c = ctl(&d);
    gen_burst(
        &mut c,
        &FlowSpec::new()
            .flows(128)
            .src("fd00::1-fd00::8")
            .dst("fd00::15")
            .sport("40000-40015")
            .count(256)
            .rate(20000),
    );
    g.wait_until(T, "256 IPv6 frames", |g| g.stashed() >= 256)
        .unwrap();
    let mut per_q = [0u32; 4];
    for r in g.take_all() {
        let k = flow_of(&r.frame);
        assert!(k.src_ip().is_ipv6());
        assert_eq!(r.rxq, rss_queue(&k, 4), "{k}");
        per_q[r.rxq as usize] += 1;
    }
    assert!(per_q.iter().all(|&n| n > 0), "spread {per_q:?}");
}

/// The generator peer answers ARP for its address and ICMP echo (what a
/// guest's ping needs).
#[test]
fn generator_answers_arp_and_ping() {
    let d = daemon(&["--queues", "1"]);
    let mut g = guest(&d, 1, 1);
    let gen_ip: [u8; 4] = [10, 0, 2, 1];
    let me: [u8; 4] = [10, 0, 2, 15];
    g.send(0, &arp_request());
    g.wait_until(T, "ARP reply", |g| g.stashed() >= 1).unwrap();
    let r = g.stash[0].pop_front().unwrap().data;
    assert_eq!(&r[0..6], &GUEST_MAC);
    assert_eq!(&r[12..14], &[0x08, 0x06]);
    assert_eq!(&r[20..22], &[0, 2], "ARP op reply");
    assert_eq!(&r[28..32], &gen_ip, "sender is the generator");
    let gen_mac: [u8; 6] = r[22..28].try_into().unwrap();

    // ICMP echo request, id 0x1234 seq 7, 32 bytes of payload.
    let mut icmp = vec![8u8, 0, 0, 0, 0x12, 0x34, 0, 7];
    icmp.extend((0..32).map(|i| i as u8));
    let ck = inet_csum(&icmp);
    icmp[2..4].copy_from_slice(&ck.to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 1, 0, 0];
    ip.extend_from_slice(&me);
    ip.extend_from_slice(&gen_ip);
    let tot = (20 + icmp.len()) as u16;
    ip[2..4].copy_from_slice(&tot.to_be_bytes());
    let ck = inet_csum(&ip);
    ip[10..12].copy_from_slice(&ck.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&gen_mac);
    f.extend_from_slice(&GUEST_MAC);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&icmp);
    g.send(0, &f);
    g.wait_until(Duration::from_secs(30), "echo reply", |g| g.stashed() >= 1)
        .unwrap();
    let r = g.stash[0].pop_front().unwrap().data;
    assert_eq!(&r[0..6], &GUEST_MAC);
    assert_eq!(&r[26..30], &gen_ip, "reply from the generator");
    assert_eq!(&r[30..34], &me);
    let reply = &r[34..34 + icmp.len()];
    assert_eq!(reply[0], 0, "echo reply type");
    assert_eq!(&reply[4..8], &[0x12, 0x34, 0, 7], "id and seq echoed");
    assert_eq!(&reply[8..], &icmp[8..], "payload echoed");
    assert_eq!(inet_csum(reply), 0, "ICMP checksum valid");
    assert_eq!(inet_csum(&r[14..34]), 0, "IP checksum valid");
}

fn inet_csum(b: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in b.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// With EVENT_IDX the device must signal the call eventfd once the used
/// index passes the driver's `used_event` (RX and TX). The other tests poll
/// the used ring as a backstop; this one waits on the interrupt alone.
#[test]
fn used_event_interrupts_fire() {
    let d = daemon(&["--queues", "1"]);
    let mut g = guest(&d, 1, 1);
    assert!(g.drv.has(F::EVENT_IDX));
    let mut c = ctl(&d);
    // Drain whatever interrupt is pending, then ask for the next one.
    let rx = &g.qps[0].rx.ring;
    let _ = rx.call_fd().read();
    rx.set_used_event(rx.last_used());
    gen_burst(&mut c, &FlowSpec::new().flows(1).count(1).rate(1000));
    assert!(g.qps[0].rx.ring.wait_call(T), "no RX interrupt");
    assert_eq!(g.qps[0].rx.ring.pending_used(), 1);

    let tx = &g.qps[0].tx.ring;
    let _ = tx.call_fd().read();
    tx.set_used_event(tx.last_used());
    let frame = build_frame(&FrameSpec {
        src_mac: GUEST_MAC,
        dst_mac: [0xff; 6],
        src: GUEST_IP.parse().unwrap(),
        dst: GEN_IP.parse().unwrap(),
        proto: 17,
        sport: 7001,
        dport: 9,
        len: 80,
    });
    g.qps[0].tx.send(&frame).unwrap();
    assert!(g.qps[0].tx.ring.wait_call(T), "no TX completion interrupt");
    assert_eq!(g.qps[0].tx.ring.pending_used(), 1);
}
