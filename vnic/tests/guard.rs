//! The tests' process guards (`vnic_frontend::harness::{Daemon,
//! ChildGuard}`): a test that panics after starting daemons leaves none
//! behind, and none of them holds the test's output pipe (with it held,
//! `cargo test` never returns: the harness waits for EOF on that pipe).
//!
//! The check runs a test of this binary as a child process, exactly as
//! cargo test / nextest run one, with its stdout and stderr on a pipe: the
//! inner test starts a daemon through the harness and one through a bare
//! `ChildGuard`, prints their pids, and panics. The outer test then needs
//! EOF on the pipe within a minute, the inner to have failed, and both
//! pids to be gone.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};

use common::*;
use vnic_frontend::harness::{ChildGuard, TempDir};

const VNIC: &str = env!("CARGO_BIN_EXE_vnic");

/// Whether `pid` is a live process (not gone, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        // the state is the field after the parenthesised command name
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X")
    })
}

/// Run by `a_test_that_panics_after_starting_daemons_leaves_none_behind`
/// (ignored on its own: alone it only panics).
#[test]
#[ignore = "the inner half of a_test_that_panics_after_starting_daemons_leaves_none_behind"]
fn inner_panics_with_daemons_running() {
    let tmp = TempDir::new("guard").unwrap();
    let sock = tmp.path().join("raw.sock");
    let d = daemon(&["--queues", "1"]);
    let raw = ChildGuard::spawn(
        Command::new(VNIC)
            .args(["serve", "--queues", "1", "--socket"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("spawn vnic serve");
    let pids = [d.pid().unwrap(), raw.id().unwrap()];
    vnic_frontend::harness::wait_for(T, "both daemons up", || {
        (pids.iter().all(|&p| running(p)) && sock.exists()).then_some(())
    })
    .unwrap();
    println!("daemons running: {} {}", pids[0], pids[1]);
    // A child that would inherit this test's stdout (the pipe) is refused.
    match ChildGuard::spawn(Command::new("sleep").arg("600")) {
        Ok(g) => println!("inherited stdout accepted: pid {:?}", g.id()),
        Err(e) => println!("inherited stdout refused: {e}"),
    }
    panic!("deliberate panic with two daemons running (guard test)");
}

#[test]
fn a_test_that_panics_after_starting_daemons_leaves_none_behind() {
    let me = std::env::current_exe().unwrap();
    let mut child = ChildGuard::spawn(
        Command::new(me)
            .args([
                "--exact",
                "inner_panics_with_daemons_running",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .expect("run the inner test");
    let child = child_parts(&mut child);
    // Read both pipes to EOF on threads; EOF needs every holder gone.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let _ = tx.send((1, s));
    });
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        let _ = tx2.send((2, s));
    });
    let mut text = [String::new(), String::new()];
    for _ in 0..2 {
        let (fd, s) = rx
            .recv_timeout(T)
            .expect("no EOF on the inner test's output within a minute: a process holds it");
        text[fd - 1] = s;
    }
    let st = child.wait().unwrap();
    let all = format!("stdout:\n{}\nstderr:\n{}", text[0], text[1]);
    assert!(!st.success(), "the inner test did not fail:\n{all}");
    assert!(
        text[1].contains("deliberate panic"),
        "the inner test failed otherwise:\n{all}"
    );
    assert!(
        text[0].contains("inherited stdout refused"),
        "a child sharing the test's stdout pipe was not refused:\n{all}"
    );
    let pids: Vec<u32> = text[0]
        .lines()
        .find_map(|l| l.split_once("daemons running: ").map(|(_, p)| p))
        .unwrap_or_else(|| panic!("the inner test printed no pids:\n{all}"))
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{all}");
    for pid in pids {
        assert!(!running(pid), "daemon {pid} outlived the panicking test");
    }
}

/// The guarded child itself (for its pipes); the guard still kills it.
fn child_parts(g: &mut ChildGuard) -> &mut std::process::Child {
    g.child_mut().expect("not reaped")
}
