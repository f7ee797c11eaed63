//! `vnic serve --preload-filters N --preload-match M` (for benchmark
//! frontends that cannot send management frames): the filters are in the
//! table once every pair is enabled, again after each new connection, the
//! matching ones steer the generator's flows and the others are never hit;
//! bad values are refused at start with the reason.

// Test code: d = daemon, g = guest, c = control client, s = stats, t = table.
#![allow(clippy::many_single_char_names)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use vnic_ctl_proto::Table;

/// Waits until the table holds `n` filters; returns the `table` reply.
fn wait_live(c: &mut Client, n: u64) -> Table {
    let mut last = 0;
    vnic_frontend::harness::wait_for(T, &format!("{n} filters live"), || {
        let t = c.table().expect("ctl table");
        last = t.live;
        (last == n).then_some(t)
    })
    .unwrap_or_else(|e| panic!("{e} (last: {last})"))
}

/// Sends `count` frames of the generator's 64 default flows (sport
/// 10000..=10063) and returns the rx queue each arrived on, by sport.
fn burst(g: &mut vnic_frontend::guest::Guest, c: &mut Client, count: u64) -> Vec<(u16, u16)> {
    gen_burst(
        c,
        &FlowSpec::new()
            .flows(64)
            .sport("10000-10063")
            .count(count)
            .rate(20000),
    );
    g.wait_until(T, "burst frames", |g| g.stashed() as u64 >= count)
        .unwrap();
    let got = g.take_all();
    assert_eq!(got.len() as u64, count);
    got.iter()
        .map(|r| (flow_of(&r.frame).src_port(), r.rxq))
        .collect()
}

#[test]
fn preloaded_filters_match_the_generator_or_miss_everything() {
    // 65535 filters, 64 of them for the generator's flows: as the DPDK
    // benchmark runs it.
    let d = daemon(&[
        "--queues",
        "2",
        "--table-capacity",
        "65535",
        "--preload-filters",
        "65535",
        "--preload-match",
        "64",
    ]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    let t = wait_live(&mut c, 65535);
    for i in 0..64u16 {
        let f = t
            .filters
            .iter()
            .find(|f| f.id == i)
            .unwrap_or_else(|| panic!("filter {i} missing"));
        let k = gen_flow(10000 + i, 5001);
        assert_eq!(f.flow.sport, 10000 + i, "{f:?}");
        assert_eq!(f.flow.dport, 5001, "{f:?}");
        assert_eq!(f.flow.src.to_string(), GEN_IP, "{f:?}");
        assert_eq!(f.flow.dst.to_string(), GUEST_IP, "{f:?}");
        assert_eq!(f.rxq, rss_queue(&k, 2), "{f:?}");
    }
    let before = c.stats().unwrap();
    let got = burst(&mut g, &mut c, 640);
    for (sport, q) in &got {
        assert_eq!(*q, rss_queue(&gen_flow(*sport, 5001), 2), "sport {sport}");
    }
    let after = c.stats().unwrap();
    let delta = |f: fn(&QueueStats) -> u64| sum_queues(&after, f) - sum_queues(&before, f);
    assert_eq!(
        (delta(|q| q.rx_filter), delta(|q| q.rx_rss)),
        (640, 0),
        "every frame hits"
    );
    let t = c.table().unwrap();
    let hits: u64 = t.filters.iter().map(|f| f.hits).sum();
    assert_eq!(hits, 640, "hits are counted on the matching filters");

    // A new connection empties the table; the preload comes back.
    drop(g);
    let g = guest(&d, 2, 2);
    wait_live(&mut c, 65535);
    assert_eq!(c.stats().unwrap().connections, 2);
    drop(g);
}

#[test]
fn non_matching_preload_is_never_hit_and_waits_for_all_pairs() {
    let d = daemon(&[
        "--queues",
        "2",
        "--preload-filters",
        "4096",
        "--preload-match",
        "0",
    ]);
    // One pair of two enabled: nothing yet (the filters would name the
    // queues RSS picks over all pairs).
    let g = guest(&d, 2, 1);
    let mut c = ctl(&d);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.table().unwrap().live, 0);
    drop(g);
    let mut g = guest(&d, 2, 2);
    let t = wait_live(&mut c, 4096);
    assert!(t
        .filters
        .iter()
        .all(|f| f.flow.src.to_string().starts_with("172.16.")));
    let before = c.stats().unwrap();
    let got = burst(&mut g, &mut c, 320);
    for (sport, q) in &got {
        assert_eq!(*q, rss_queue(&gen_flow(*sport, 5001), 2), "sport {sport}");
    }
    let after = c.stats().unwrap();
    let delta = |f: fn(&QueueStats) -> u64| sum_queues(&after, f) - sum_queues(&before, f);
    assert_eq!(
        (delta(|q| q.rx_filter), delta(|q| q.rx_rss)),
        (0, 320),
        "every lookup misses"
    );
    let t = c.table().unwrap();
    assert!(t.filters.iter().all(|f| f.hits == 0));
}

/// `vnic serve` that must fail at start; returns its stderr.
fn serve_fails(args: &[&str]) -> String {
    let tmp = vnic_frontend::harness::TempDir::new("preload").unwrap();
    let sock = tmp.path().join("vnic.sock");
    // Killed when this function panics (the guard drops).
    let mut child = vnic_frontend::harness::ChildGuard::spawn(
        Command::new(env!("CARGO_BIN_EXE_vnic"))
            .arg("serve")
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null()),
    )
    .expect("spawn vnic serve");
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "vnic serve {args:?} started where it must refuse"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    assert!(!st.success(), "vnic serve {args:?} exited 0");
    assert!(!sock.exists());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_preload_values_are_refused_with_the_reason() {
    for (args, want) in [
        (
            &["--preload-filters", "9000"][..],
            "--preload-filters 9000 exceeds --table-capacity 8192",
        ),
        (
            &["--preload-filters", "10", "--preload-match", "11"][..],
            "--preload-match 11 exceeds --preload-filters 10",
        ),
        (
            &[
                "--table-capacity",
                "65535",
                "--preload-filters",
                "65535",
                "--preload-match",
                "60000",
            ][..],
            "--preload-match 60000: at most 55536",
        ),
        (
            &["--preload-filters", "65536"][..],
            "invalid filter count 65536: expected 0..=65535",
        ),
        (
            &["--preload-filters", "many"][..],
            "invalid filter count \"many\"",
        ),
    ] {
        let e = serve_fails(args);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}
