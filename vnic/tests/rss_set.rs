//! The RSS extension through the management channel (aRFS/PROTOCOL.md,
//! "The RSS extension"): a driver of `driver_version` 3 gets the 32-byte
//! CAPS with `features` 3, one of version 2 `features` 1; RSS_SET's table
//! places the frames no filter decides (an all-zero table: everything on
//! queue 0), is kept when the guest changes its enabled pairs (an entry
//! naming a pair that is not enabled falls back to the round-robin one)
//! and `default_indir` gives the device's round-robin table back; its key
//! replaces the hash RSS picks by, not the placement model's buckets;
//! `bad_key` and `bad_queue` change nothing; a new generation puts the
//! defaults back; `ctl table` and the trace (`rss_set`) show it.

// Test code: d = daemon, g = guest, c = control client, t = table.
#![allow(clippy::many_single_char_names)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arfs::proto::{self, AddOp, RssSetOp};
use arfs::rss::{key_to_hex, INDIRECTION_LEN, KEY_LEN};
use arfs::{EventKind, Message, OpStatus, Rss, RssConfig, Toeplitz, TraceRecord, DEFAULT_KEY};
use common::*;
use vnic_frontend::guest::Guest;

/// HELLO with `driver_version` `v`; the CAPS.
fn hello(g: &mut Guest, v: u32) -> proto::Caps {
    hello_caps(g, v, 0x5eed_0003)
}

/// The status of an RSS_SET.
fn rss_set(g: &mut Guest, op: &RssSetOp) -> OpStatus {
    let r = g.request(&Message::RssSet(Box::new(*op)), T).expect("ACK");
    let Message::Ack(a) = r.message else {
        panic!("not an ACK: {:?}", r.message)
    };
    assert_eq!(
        (a.frame_status, a.acked_type),
        (0, proto::MsgType::RssSet.code()),
        "{a:?}"
    );
    assert_eq!(a.statuses.len(), 1, "{a:?}");
    OpStatus::from_code(a.statuses[0]).expect("a known status")
}

fn table_op(t: [u16; INDIRECTION_LEN]) -> RssSetOp {
    RssSetOp::new(&RssConfig {
        key: None,
        indirection: Some(t),
    })
}

fn defaults() -> RssSetOp {
    RssSetOp::new(&RssConfig::default())
}

/// `n` source ports whose flows (to port 5001) RSS puts on queue `q` of
/// `enabled` with the default key.
fn ports_on(q: u16, enabled: u16, n: usize) -> Vec<u16> {
    (20000..=u16::MAX)
        .filter(|&p| rss_queue(&gen_flow(p, 5001), enabled) == q)
        .take(n)
        .collect()
}

/// Every frame of a burst of each flow arrived on `want(port)`.
fn assert_bursts(g: &mut Guest, c: &mut Client, ports: &[u16], want: impl Fn(u16) -> u16) {
    for &p in ports {
        let qs = burst_queues(g, c, p, 4);
        assert!(
            qs.iter().all(|&q| q == want(p)),
            "flow from port {p}: queues {qs:?}, expected {}",
            want(p)
        );
    }
}

fn trace_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vnic-rss-{tag}-{}.jsonl", std::process::id()))
}

/// The trace's `rss_set` lines once there are `n`.
fn rss_lines(c: &mut Client, trace: &Path, n: usize) -> Vec<TraceRecord> {
    let deadline = Instant::now() + T;
    loop {
        c.trace_flush().expect("trace_flush");
        let lines: Vec<TraceRecord> = std::fs::read_to_string(trace)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|r: &TraceRecord| r.event == EventKind::RssSet)
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "{lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn caps_announce_rss_to_a_driver_of_version_3() {
    let d = daemon(&["--queues", "2"]);
    let mut g = guest(&d, 2, 2);
    assert_eq!(hello(&mut g, 1).ext, None, "the 24-byte CAPS");
    for (v, rss) in [(2, false), (3, true), (4, true)] {
        let caps = hello(&mut g, v);
        assert_eq!(
            caps.ext,
            Some(proto::CapsExt {
                max_rules: 128,
                rss
            }),
            "driver_version {v}"
        );
        // The frame itself: body_len 32 and `features` (offset 40 of the
        // header, 54 of the frame) 1 or 3.
        let mut f = Vec::new();
        proto::encode_caps(&mut f, [2; 6], 1, 1, &caps).unwrap();
        assert_eq!(&f[28..30], &[0, 32]);
        assert_eq!(&f[54..58], &[0, 0, 0, if rss { 3 } else { 1 }]);
    }
    // Without the rule stage no long CAPS, so nothing announced; RSS_SET
    // is still taken.
    let d = daemon(&["--queues", "2", "--rule-locations", "0"]);
    let mut g = guest(&d, 2, 2);
    assert_eq!(hello(&mut g, 3).ext, None);
    assert_eq!(
        rss_set(&mut g, &table_op([0; INDIRECTION_LEN])),
        OpStatus::Ok
    );
}

#[test]
fn a_table_places_flows_without_a_filter_and_default_indir_gives_round_robin_back() {
    let trace = trace_path("table");
    let d = daemon(&["--queues", "2", "--trace", trace.to_str().unwrap()]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    assert!(hello(&mut g, 3).has_rss());
    let on0 = ports_on(0, 2, 3);
    let on1 = ports_on(1, 2, 3);
    let all: Vec<u16> = on0.iter().chain(&on1).copied().collect();
    assert_bursts(&mut g, &mut c, &all, |p| rss_queue(&gen_flow(p, 5001), 2));
    let rss = c.table().unwrap().rss.expect("rss shown");
    assert!(rss.default_indir && rss.default_key && rss.indir.is_none());
    assert_eq!(rss.key, key_to_hex(&DEFAULT_KEY));
    let rr: Vec<u16> = (0..INDIRECTION_LEN).map(|i| (i % 2) as u16).collect();
    assert_eq!(rss.effective, rr);

    // All zero: every flow on queue 0, the ones RSS put on 1 included.
    assert_eq!(
        rss_set(&mut g, &table_op([0; INDIRECTION_LEN])),
        OpStatus::Ok
    );
    assert_bursts(&mut g, &mut c, &all, |_| 0);
    let rss = c.table().unwrap().rss.unwrap();
    assert!(!rss.default_indir && rss.default_key);
    assert_eq!(rss.indir, Some(vec![0; INDIRECTION_LEN]));
    assert_eq!(rss.effective, vec![0; INDIRECTION_LEN]);

    // All one; a filter still decides its own flow.
    let f = on1[0];
    let ack = g
        .add(vec![AddOp::new(7, 0, &gen_flow(f, 5001))], T)
        .unwrap();
    assert_eq!(ack.statuses, [OpStatus::Ok as u8]);
    assert_eq!(
        rss_set(&mut g, &table_op([1; INDIRECTION_LEN])),
        OpStatus::Ok
    );
    assert_bursts(&mut g, &mut c, &all, |p| u16::from(p != f));

    // Back to the device's own table.
    assert_eq!(rss_set(&mut g, &defaults()), OpStatus::Ok);
    assert_bursts(&mut g, &mut c, &all, |p| {
        if p == f {
            0
        } else {
            rss_queue(&gen_flow(p, 5001), 2)
        }
    });
    assert_eq!(c.table().unwrap().rss.unwrap().effective, rr);

    let lines = rss_lines(&mut c, &trace, 3);
    let shape = |r: &TraceRecord| {
        (
            r.status,
            r.context,
            r.default_indir,
            r.default_key,
            r.key.clone(),
            r.indir.clone(),
            r.reason.clone(),
        )
    };
    let dk = Some(key_to_hex(&DEFAULT_KEY));
    assert_eq!(
        lines.iter().map(shape).collect::<Vec<_>>(),
        vec![
            (
                Some(OpStatus::Ok),
                Some(0),
                Some(false),
                Some(true),
                dk.clone(),
                Some(vec![0; INDIRECTION_LEN]),
                None
            ),
            (
                Some(OpStatus::Ok),
                Some(0),
                Some(false),
                Some(true),
                dk.clone(),
                Some(vec![1; INDIRECTION_LEN]),
                None
            ),
            (
                Some(OpStatus::Ok),
                Some(0),
                Some(true),
                Some(true),
                dk,
                None,
                None
            ),
        ]
    );
    assert!(lines.iter().all(|r| r.seq.is_some()));
    assert!(g.faults.is_empty(), "{:?}", g.faults);
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn a_drivers_table_stays_when_the_guest_changes_its_pairs() {
    let d = daemon(&["--queues", "4"]);
    let mut g = guest(&d, 4, 2);
    let mut c = ctl(&d);
    hello(&mut g, 3);
    let ports: Vec<u16> = (0..4).flat_map(|q| ports_on(q, 4, 2)).collect();
    // Pair 3 exists (an entry below max_queue_pairs is taken) but is not
    // enabled: each frame goes where the round-robin table over the two
    // enabled pairs puts it.
    assert_eq!(
        rss_set(&mut g, &table_op([3; INDIRECTION_LEN])),
        OpStatus::Ok
    );
    assert_bursts(&mut g, &mut c, &ports, |p| rss_queue(&gen_flow(p, 5001), 2));
    // The guest enables pairs 2 and 3: the table is the driver's still.
    g.drv.enable_pair(2, true).unwrap();
    g.drv.enable_pair(3, true).unwrap();
    wait_stats(&mut c, "4 enabled pairs", |s| s.enabled_pairs == 4);
    assert_bursts(&mut g, &mut c, &ports, |_| 3);
    let rss = c.table().unwrap().rss.unwrap();
    assert_eq!(rss.effective, vec![3; INDIRECTION_LEN]);
    // Pair 3 goes: round-robin over 3 for every entry.
    g.drv.enable_pair(3, false).unwrap();
    wait_stats(&mut c, "3 enabled pairs", |s| s.enabled_pairs == 3);
    assert_bursts(&mut g, &mut c, &ports, |p| rss_queue(&gen_flow(p, 5001), 3));
    assert_eq!(
        c.table().unwrap().rss.unwrap().indir,
        Some(vec![3; INDIRECTION_LEN])
    );
    assert_eq!(c.stats().unwrap().queues[3].rx_drops_disabled, 0);
}

#[test]
fn a_key_moves_what_rss_picks_but_not_the_buckets() {
    let d = daemon(&["--queues", "2", "--buckets", "16x4"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    hello(&mut g, 3);
    let key = [0xa5; KEY_LEN];
    let with_key = Rss::with_key(key, 2);
    // Flows the new key puts elsewhere than the default one does.
    let moved: Vec<u16> = (20000..=u16::MAX)
        .filter(|&p| with_key.queue_for_key(&gen_flow(p, 5001)) != rss_queue(&gen_flow(p, 5001), 2))
        .take(4)
        .collect();
    let op = RssSetOp::new(&RssConfig {
        key: Some(key),
        indirection: None,
    });
    assert_eq!(rss_set(&mut g, &op), OpStatus::Ok);
    assert_bursts(&mut g, &mut c, &moved, |p| {
        with_key.queue_for_key(&gen_flow(p, 5001))
    });
    let rss = c.table().unwrap().rss.unwrap();
    assert!(!rss.default_key && rss.default_indir);
    assert_eq!(rss.key, key_to_hex(&key));
    // A filter's bucket is the default key's hash, not the new key's.
    let (port, bucket) = (20000..=u16::MAX)
        .map(|p| (p, Toeplitz::default().hash_flow(&gen_flow(p, 5001)) % 16))
        .find(|&(p, b)| Toeplitz::new(key).hash_flow(&gen_flow(p, 5001)) % 16 != b)
        .unwrap();
    let ack = g
        .add(vec![AddOp::new(9, 1, &gen_flow(port, 5001))], T)
        .unwrap();
    assert_eq!(ack.statuses, [OpStatus::Ok as u8]);
    let t = c.table().unwrap();
    let f = t.filters.iter().find(|f| f.id == 9).unwrap();
    assert_eq!(f.bucket, Some(bucket));
}

#[test]
fn refused_rss_sets_change_nothing() {
    use OpStatus as S;
    let trace = trace_path("refused");
    let d = daemon(&["--queues", "2", "--trace", trace.to_str().unwrap()]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    hello(&mut g, 3);
    let ok = RssSetOp::new(&RssConfig {
        key: Some([7; KEY_LEN]),
        indirection: Some([1; INDIRECTION_LEN]),
    });
    assert_eq!(rss_set(&mut g, &ok), S::Ok);
    let before = c.table().unwrap().rss.unwrap();
    let on0 = ports_on(0, 2, 2);
    assert_bursts(&mut g, &mut c, &on0, |_| 1);
    let with = |f: &dyn Fn(&mut RssSetOp)| {
        let mut op = ok;
        f(&mut op);
        op
    };
    let cases = [
        (with(&|o| o.context = 1), S::BadKey),
        (with(&|o| o.hfunc = 0), S::BadKey),
        (with(&|o| o.hfunc = 2), S::BadKey),
        (with(&|o| o.flags = RssSetOp::DEFAULT_KEY), S::BadKey),
        (with(&|o| o.flags = RssSetOp::DEFAULT_INDIR), S::BadKey),
        // An entry at max_queue_pairs (2), then far past it.
        (with(&|o| o.indirection[127] = 2), S::BadQueue),
        (with(&|o| o.indirection[0] = u16::MAX), S::BadQueue),
        // bad_key before bad_queue
        (
            with(&|o| {
                o.context = 3;
                o.indirection[5] = 9;
            }),
            S::BadKey,
        ),
    ];
    for (op, want) in cases {
        assert_eq!(rss_set(&mut g, &op), want, "{op:?}");
        assert_eq!(c.table().unwrap().rss.unwrap(), before, "{op:?}");
    }
    assert_bursts(&mut g, &mut c, &on0, |_| 1);
    // A reserved flag bit is a malformed frame: NAKed, nothing applied.
    let mut bad = ok;
    bad.flags = 4;
    let r = g.request(&Message::RssSet(Box::new(bad)), T).unwrap();
    let Message::Ack(a) = r.message else { panic!() };
    assert_eq!(
        a.frame_status,
        proto::FrameError::ReservedNonzero.code(),
        "{a:?}"
    );
    assert_eq!(c.table().unwrap().rss.unwrap(), before);

    let lines = rss_lines(&mut c, &trace, 1 + cases.len());
    let statuses: Vec<Option<S>> = lines.iter().map(|r| r.status).collect();
    let mut want = vec![Some(S::Ok)];
    want.extend(cases.iter().map(|(_, s)| Some(*s)));
    assert_eq!(statuses, want);
    // A refused line carries the op as it came.
    let l = &lines[7];
    assert_eq!(l.indir.as_ref().map(|t| t[0]), Some(u16::MAX));
    assert_eq!(l.key, Some(key_to_hex(&[7; KEY_LEN])));
    assert_eq!(lines[1].context, Some(1));
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn a_new_generation_puts_the_defaults_back() {
    let trace = trace_path("gen");
    let d = daemon(&["--queues", "2", "--trace", trace.to_str().unwrap()]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    hello(&mut g, 3);
    let on1 = ports_on(1, 2, 3);
    let op = RssSetOp::new(&RssConfig {
        key: Some([9; KEY_LEN]),
        indirection: Some([0; INDIRECTION_LEN]),
    });
    assert_eq!(rss_set(&mut g, &op), OpStatus::Ok);
    assert_bursts(&mut g, &mut c, &on1, |_| 0);
    let gen = c.stats().unwrap().generation;
    drop(g);
    wait_stats(&mut c, "disconnect noticed", |s| !s.connected);
    let mut g = guest(&d, 2, 2);
    let s = c.stats().unwrap();
    assert_ne!(s.generation, gen);
    let rss = c.table().unwrap().rss.unwrap();
    assert!(rss.default_key && rss.default_indir, "{rss:?}");
    // The new session's frames follow the device's own RSS again.
    hello(&mut g, 3);
    assert_bursts(&mut g, &mut c, &on1, |_| 1);
    let lines = rss_lines(&mut c, &trace, 2);
    let reset = &lines[1];
    assert_eq!(
        (
            reset.seq,
            reset.reason.as_deref(),
            reset.status,
            reset.default_indir,
            reset.default_key,
            reset.indir.as_ref()
        ),
        (
            None,
            Some("reset"),
            Some(OpStatus::Ok),
            Some(true),
            Some(true),
            None
        )
    );
    assert_eq!(reset.gen, s.generation);
    let _ = std::fs::remove_file(&trace);
}
