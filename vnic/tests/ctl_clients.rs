//! Hostile control clients: one that pipelines requests and never reads,
//! one that sends an empty line, one that sends a line over the limit, more
//! clients than allowed. None of them may stall the others or SIGTERM.

// Test code: d = daemon, c = control client, e/r = replies, s = stats.
#![allow(clippy::many_single_char_names)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn connect(d: &vnic_frontend::harness::Daemon) -> UnixStream {
    let s = UnixStream::connect(&d.ctl).expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn one_reply(s: &UnixStream) -> Value {
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .expect("a reply line");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

#[test]
fn a_client_that_never_reads_stalls_nobody_and_is_dropped() {
    let mut d = daemon(&["--queues", "1"]);
    // 2000 pipelined requests, replies never read: far more than the
    // socket buffers hold.
    let mut hog = connect(&d);
    hog.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let req = b"{\"cmd\":\"stats\"}\n".repeat(2000);
    let _ = hog.write_all(&req);
    std::thread::sleep(Duration::from_millis(300));

    // Another client is answered at once.
    let other = connect(&d);
    let t0 = Instant::now();
    (&other).write_all(b"{\"cmd\":\"stats\"}\n").unwrap();
    let st = one_reply(&other);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "the other client waited {:?}",
        t0.elapsed()
    );
    assert_eq!(st["ok"], true, "{st}");
    assert!(st["stats"]["ctl"]["clients"].as_u64().unwrap() >= 2, "{st}");

    // An empty line gets an error reply.
    (&other).write_all(b"\n").unwrap();
    let e = one_reply(&other);
    assert_eq!(e["ok"], false, "{e}");
    assert!(e["error"].as_str().unwrap().contains("empty"), "{e}");

    // The hog is disconnected once its replies made no progress for 10 s.
    let mut c = ctl(&d);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.stats().unwrap();
        if counter(&s, "ctl.dropped_slow") == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hog was never dropped: {}",
            s["ctl"]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut rest = Vec::new();
    hog.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = hog.read_to_end(&mut rest);

    // A new hog, then SIGTERM: the daemon exits within a second anyway.
    let hog2 = connect(&d);
    let _ = (&hog2).write_all(&req[..req.len() / 2]);
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    d.terminate(Duration::from_secs(5))
        .expect("exit on SIGTERM");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "SIGTERM took {:?} with a stuck client",
        t0.elapsed()
    );
}

#[test]
fn overlong_lines_and_too_many_clients_are_refused_with_a_reason() {
    let d = daemon(&["--queues", "1"]);
    // A line over 1 MiB: an error reply, then the connection is closed.
    let long = connect(&d);
    let junk = vec![b'x'; (1 << 20) + 4096];
    let _ = (&long).write_all(&junk);
    let e = one_reply(&long);
    assert_eq!(e["ok"], false, "{e}");
    assert!(e["error"].as_str().unwrap().contains("longer than"), "{e}");
    let mut rest = Vec::new();
    assert_eq!(
        (&long).read_to_end(&mut rest).unwrap_or(0),
        0,
        "closed after the error"
    );

    // 64 clients at once (this control client and 63 more); the 65th is
    // told and disconnected.
    let mut c = ctl(&d);
    let held: Vec<UnixStream> = (0..63).map(|_| connect(&d)).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.stats().unwrap()["ctl"]["clients"].as_u64().unwrap_or(0) < 64 {
        assert!(Instant::now() < deadline, "64 clients not seen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let extra = connect(&d);
    let r = one_reply(&extra);
    assert_eq!(r["ok"], false, "{r}");
    assert!(r["error"].as_str().unwrap().contains("too many"), "{r}");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.stats().unwrap();
        if s["ctl"]["refused"].as_u64().unwrap() >= 1 && s["ctl"]["lines_too_long"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", s["ctl"]);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What a control client can make the daemon allocate is bounded: flows per
/// set, flows over all sets, live sets; each refusal names the limit, and
/// stopping sets makes room again.
#[test]
fn generator_allocations_are_bounded_with_clear_errors() {
    let d = daemon(&["--queues", "1"]);
    let mut c = ctl(&d);
    let start = |c: &mut vnic_frontend::harness::Ctl, flows: u32| {
        c.gen_start(&serde_json::json!({"flows": flows, "sport": "1024-65535",
            "dport": "5001-5100", "rate": 1}))
            .map_err(|e| e.to_string())
    };
    let e = start(&mut c, 65_537).expect_err("65537 flows in one set");
    assert!(e.contains("1..=65536"), "{e}");
    for _ in 0..4 {
        start(&mut c, 65_536).expect("4 sets of 65536 flows");
    }
    let e = start(&mut c, 1).expect_err("one flow over the total");
    assert!(e.contains("262144"), "{e}");
    c.request(&serde_json::json!({"cmd": "gen", "op": "stop"}))
        .expect("gen stop");
    start(&mut c, 1000).expect("room again after gen stop");
    // At most 1024 live sets.
    for _ in 1..1024 {
        start(&mut c, 1).expect("up to 1024 sets");
    }
    let e = start(&mut c, 1).expect_err("set 1025");
    assert!(e.contains("1024 flow sets"), "{e}");
}
