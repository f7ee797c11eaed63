//! Shared helpers for the device tests: start a real `vnic serve`, connect
//! the Rust vhost-user frontend, talk to the control socket, and predict
//! steering with the `arfs` crate.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
use std::time::Duration;

use arfs::{FlowKey, L4Proto, Rss};
#[allow(unused_imports)] // each test binary uses a different subset
pub use vnic_ctl_proto::{Client, FlowSpec, QueueStats, SetValue, Stats};
use vnic_frontend::guest::Guest;
use vnic_frontend::harness::Daemon;
use vnic_frontend::{parse_flow, Options, RxFrame};

/// Generous: the machine is 2 shared cores and may be loaded.
pub const T: Duration = Duration::from_mins(1);

/// The generator's default addresses (see vnic/CTL.md).
pub const GEN_IP: &str = "10.0.2.1";
pub const GUEST_IP: &str = "10.0.2.15";

/// A broadcast ARP request from the guest (GUEST_MAC, GUEST_IP) for the
/// generator's address, which the generator answers.
pub fn arp_request() -> Vec<u8> {
    let mut arp = vec![0u8; 60];
    arp[0..6].copy_from_slice(&[0xff; 6]);
    arp[6..12].copy_from_slice(&vnic_frontend::guest::GUEST_MAC);
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    arp[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp[22..28].copy_from_slice(&vnic_frontend::guest::GUEST_MAC);
    arp[28..32].copy_from_slice(&[10, 0, 2, 15]);
    arp[38..42].copy_from_slice(&[10, 0, 2, 1]);
    arp
}

pub fn daemon(args: &[&str]) -> Daemon {
    Daemon::start(Path::new(env!("CARGO_BIN_EXE_vnic")), args)
        .unwrap_or_else(|e| panic!("starting vnic serve {args:?}: {e}"))
}

pub fn ctl(d: &Daemon) -> Client {
    vnic_frontend::harness::ctl(&d.ctl)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", d.ctl.display()))
}

pub fn opts(pairs: u16, queue_size: u16) -> Options {
    Options {
        pairs,
        queue_size,
        ..Options::default()
    }
}

/// Connect a guest with `pairs` pairs laid out, `enable` of them enabled,
/// rx buffers posted on all.
/// Returns once the daemon reports the `enable` pairs as enabled (it learns
/// that asynchronously; `filters::pairs_count_as_enabled_as_soon_as_enable_is_acked`
/// tests that window on its own).
pub fn guest(d: &Daemon, pairs: u16, enable: u16) -> Guest {
    let g = Guest::connect(&d.socket, opts(pairs, 1024), enable)
        .unwrap_or_else(|e| panic!("frontend connect: {e}\n{}", d.log_text()));
    let mut c = ctl(d);
    wait_stats(&mut c, &format!("{enable} pairs enabled"), |s| {
        s.connected && s.enabled_pairs == enable
    });
    g
}

/// Poll `stats` until `pred` holds; return the stats that satisfied it.
pub fn wait_stats(c: &mut Client, what: &str, pred: impl Fn(&Stats) -> bool) -> Stats {
    let mut last = None;
    vnic_frontend::harness::wait_for(T, what, || {
        let s = c.stats().expect("ctl stats");
        let done = pred(&s).then(|| s.clone());
        last = Some(s);
        done
    })
    .unwrap_or_else(|e| panic!("{e}; last stats: {last:#?}"))
}

/// The flow key of a received data frame (via the driver's own parser,
/// independent of the daemon's).
pub fn flow_of(f: &RxFrame) -> FlowKey {
    let p = parse_flow(&f.data).unwrap_or_else(|| panic!("unparsable frame {:02x?}", f.data));
    let proto = match p.proto {
        6 => L4Proto::Tcp,
        17 => L4Proto::Udp,
        x => panic!("unexpected IP protocol {x}"),
    };
    FlowKey::new(proto, p.src, p.sport, p.dst, p.dport).expect("same family")
}

/// A UDP flow as the generator sends it (remote -> guest).
pub fn gen_flow(sport: u16, dport: u16) -> FlowKey {
    FlowKey::new(
        L4Proto::Udp,
        GEN_IP.parse().unwrap(),
        sport,
        GUEST_IP.parse().unwrap(),
        dport,
    )
    .unwrap()
}

/// The rx queue RSS picks for `k` with `enabled` pairs.
pub fn rss_queue(k: &FlowKey, enabled: u16) -> u16 {
    Rss::new(enabled).queue_for_key(k)
}

/// Start a generator flow set and wait until it has sent everything.
pub fn gen_burst(c: &mut Client, spec: &FlowSpec) -> u32 {
    let id = c.gen_start(spec).expect("gen start");
    wait_gen_done(c, id);
    id
}

/// Send `count` generator frames of flow sport/dport=5001 and return the
/// queues they arrived on.
pub fn burst_queues(
    g: &mut vnic_frontend::guest::Guest,
    c: &mut Client,
    sport: u16,
    count: u64,
) -> Vec<u16> {
    gen_burst(
        c,
        &FlowSpec::new()
            .flows(1)
            .sport(sport.to_string())
            .count(count)
            .rate(10000),
    );
    g.wait_until(T, "burst frames", |g| g.stashed() as u64 >= count)
        .unwrap();
    let got = g.take_all();
    assert_eq!(got.len() as u64, count);
    for r in &got {
        assert_eq!(flow_of(&r.frame), gen_flow(sport, 5001));
    }
    got.into_iter().map(|r| r.rxq).collect()
}

/// Wait until flow set `id` is inactive (sent its `count`).
pub fn wait_gen_done(c: &mut Client, id: u32) {
    let mut last = None;
    let r = vnic_frontend::harness::wait_for(T, &format!("gen flow set {id} to finish"), || {
        let flows = c.gen_list().expect("gen list");
        let set = flows
            .iter()
            .find(|f| f.id == id)
            .cloned()
            .unwrap_or_else(|| panic!("flow set {id} not listed: {flows:?}"));
        let done = !set.active;
        last = Some(set);
        done.then_some(())
    });
    if let Err(e) = r {
        panic!("{e}: last listing {last:?}; stats {:?}", c.stats().unwrap());
    }
}

/// Sum of a per-queue counter over all queues.
pub fn sum_queues(stats: &Stats, field: impl Fn(&QueueStats) -> u64) -> u64 {
    stats.queues.iter().map(field).sum()
}

/// HELLO with `driver_version` `v` (and `nonce`); the CAPS. Sets the
/// guest's generation to the CAPS's.
pub fn hello_caps(g: &mut Guest, v: u32, nonce: u32) -> arfs::proto::Caps {
    let r = g
        .request(
            &arfs::Message::Hello(arfs::proto::Hello {
                driver_version: v,
                nonce,
                mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
            }),
            T,
        )
        .expect("CAPS");
    let arfs::Message::Caps(c) = r.message else {
        panic!("not a CAPS: {:?}", r.message)
    };
    g.generation = r.header.generation;
    c
}
