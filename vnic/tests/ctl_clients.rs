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
use serde::de::DeserializeOwned;
use vnic_ctl_proto::{Empty, Reply, StatsReply};

fn connect(d: &vnic_frontend::harness::Daemon) -> UnixStream {
    let s = UnixStream::connect(&d.ctl).expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// The next reply line, read as the protocol's reply with body `T`.
fn one_reply<T: DeserializeOwned>(s: &UnixStream) -> Reply<T> {
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
    let st: Reply<StatsReply> = st;
    assert!(st.ok, "{st:?}");
    assert!(st.body.stats.ctl.clients >= 2, "{st:?}");

    // An empty line gets an error reply.
    (&other).write_all(b"\n").unwrap();
    let e: Reply<Empty> = one_reply(&other);
    assert!(!e.ok, "{e:?}");
    assert!(e.error.as_deref().unwrap().contains("empty"), "{e:?}");

    // The hog is disconnected once its replies made no progress for 10 s.
    let mut c = ctl(&d);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.stats().unwrap();
        if s.ctl.dropped_slow == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hog was never dropped: {:?}",
            s.ctl
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
    let e: Reply<Empty> = one_reply(&long);
    assert!(!e.ok, "{e:?}");
    assert!(e.error.as_deref().unwrap().contains("longer than"), "{e:?}");
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
    while c.stats().unwrap().ctl.clients < 64 {
        assert!(Instant::now() < deadline, "64 clients not seen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let extra = connect(&d);
    let r: Reply<Empty> = one_reply(&extra);
    assert!(!r.ok, "{r:?}");
    assert!(r.error.as_deref().unwrap().contains("too many"), "{r:?}");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.stats().unwrap();
        if s.ctl.refused >= 1 && s.ctl.lines_too_long == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", s.ctl);
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
    let start = |c: &mut Client, flows: u32| {
        c.gen_start(
            &FlowSpec::new()
                .flows(flows)
                .sport("1024-65535")
                .dport("5001-5100")
                .rate(1),
        )
        .map_err(|e| e.to_string())
    };
    let e = start(&mut c, 65_537).expect_err("65537 flows in one set");
    assert!(e.contains("1..=65536"), "{e}");
    for _ in 0..4 {
        start(&mut c, 65_536).expect("4 sets of 65536 flows");
    }
    let e = start(&mut c, 1).expect_err("one flow over the total");
    assert!(e.contains("262144"), "{e}");
    c.gen_stop(None).expect("gen stop");
    start(&mut c, 1000).expect("room again after gen stop");
    // At most 1024 live sets.
    for _ in 1..1024 {
        start(&mut c, 1).expect("up to 1024 sets");
    }
    let e = start(&mut c, 1).expect_err("set 1025");
    assert!(e.contains("1024 flow sets"), "{e}");
}

/// `vnic ctl gen pause|resume` (one set, or all): the set stops sending
/// and goes on; and `vnic ctl stats` into a reader that closes early ends
/// quietly instead of panicking on the broken pipe.
#[test]
fn vnic_ctl_pauses_and_resumes_and_survives_a_closed_pipe() {
    use std::process::{Command, Stdio};
    let d = daemon(&["--queues", "1"]);
    let bin = env!("CARGO_BIN_EXE_vnic");
    let run = |args: &[&str]| {
        let out = Command::new(bin)
            .args(["ctl", "--ctl"])
            .arg(&d.ctl)
            .args(args)
            .output()
            .expect("run vnic ctl");
        assert!(
            out.status.success(),
            "vnic ctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("a JSON reply")
    };
    let id = run(&["gen", "start", "--rate", "1000"])["id"].clone();
    let id = id.to_string();
    assert_eq!(
        run(&["gen", "pause", &id])["pause"],
        serde_json::json!([id.parse::<u32>().unwrap()])
    );
    let sent = |v: serde_json::Value| v["flows"][0]["sent"].as_u64().unwrap();
    let a = sent(run(&["gen", "list"]));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sent(run(&["gen", "list"])), a, "a paused set sends nothing");
    assert!(!run(&["gen", "resume"])["resume"]
        .as_array()
        .unwrap()
        .is_empty());
    let t0 = Instant::now();
    while sent(run(&["gen", "list"])) == a {
        assert!(t0.elapsed() < T, "the resumed set never sent");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A reader that takes one byte and goes away, from a reply larger
    // than the pipe holds (400 paused sets: about 200 KB of JSON).
    let mut c = ctl(&d);
    for _ in 0..400 {
        let id = c.gen_start(&FlowSpec::new().rate(1)).unwrap();
        c.gen_pause(Some(id)).unwrap();
    }
    let mut child = Command::new(bin)
        .args(["ctl", "--ctl"])
        .arg(&d.ctl)
        .args(["gen", "list"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut b = [0u8; 1];
    out.read_exact(&mut b).unwrap();
    drop(out);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.status.success(), "{:?}: {err}", o.status);
}
