//! What `vnic-fuzz-vhost` found, each reproduced by hand, and a short run
//! of its sequences: a frontend's vhost-user messages and a control
//! client's lines are hostile input too.

// Test code: d = daemon, c = control client, g = guest, s = stats.
#![allow(clippy::many_single_char_names)]

mod common;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::*;
use vnic_frontend::fuzz::vhost::{self, *};
use vnic_frontend::fuzz::{ctl as fctl, sequence_seed, RawConn, ReadError};
use vnic_frontend::GuestMem;

fn msg(code: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&code.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(payload);
    b
}

fn words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn state(index: u32, num: u32) -> Vec<u8> {
    words(&[u64::from(index) | u64::from(num) << 32])
}

fn memfd(size: u64) -> OwnedFd {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the fd
    // returned (checked) is ours alone.
    let fd = unsafe { libc::memfd_create(c"vnic-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor nobody else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f.into()
}

/// The daemon closes the connection (a refusal), within 10 s.
fn closed(conn: &RawConn) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Err(ReadError::Closed) = conn.drain() {
            return true;
        }
        conn.readable(Duration::from_millis(50));
    }
    false
}

/// Found by vnic-fuzz-vhost (first run, seed 0x1, sequence #295, seed
/// 0x3efb974f6ecf00bc of the first version of the generator): a memory
/// region that reaches past the end of its file. vm-memory maps it
/// without complaint; vhost-user-backend reads the vring's used index
/// when SET_VRING_ADDR places the used ring there, and the daemon died of
/// SIGBUS. The relay now refuses the region (`region_past_eof`), for
/// SET_MEM_TABLE and ADD_MEM_REG, size or offset past the end.
#[test]
fn memory_region_past_its_file_is_refused_not_a_sigbus() {
    let mut d = daemon(&["--queues", "2"]);
    let mut c = ctl(&d);
    let good = GuestMem::new(0x10_0000, 2 << 20).unwrap();
    let r = good.region_info();
    let small = 64 * 1024;
    let odd_ua = 0x7f00_0000_0000u64;
    // (request, region: gpa, size, user address, file offset)
    let cases: [(u32, [u64; 4]); 3] = [
        (SET_MEM_TABLE, [0x40_0000, small, odd_ua, 1 << 20]),
        (SET_MEM_TABLE, [0x40_0000, 4 << 20, odd_ua, 0]),
        (ADD_MEM_REG, [0x40_0000, 4 << 20, odd_ua, 0]),
    ];
    for (i, (code, odd)) in cases.iter().enumerate() {
        let conn = RawConn::connect(&d.socket, Duration::from_secs(10)).unwrap();
        conn.send(&msg(SET_OWNER, VERSION, &[]), &[]).unwrap();
        conn.send(&msg(GET_FEATURES, VERSION, &[]), &[]).unwrap();
        conn.read_vhost_reply(Duration::from_secs(10)).unwrap();
        let file = memfd(small);
        let good_region = words(&[
            r.guest_phys_addr,
            r.memory_size,
            r.userspace_addr,
            r.mmap_offset,
        ]);
        if *code == SET_MEM_TABLE {
            let mut p = words(&[2]);
            p.extend_from_slice(&good_region);
            p.extend_from_slice(&words(odd));
            conn.send(
                &msg(SET_MEM_TABLE, VERSION, &p),
                &[r.mmap_handle, file.as_raw_fd()],
            )
            .unwrap();
        } else {
            // Protocol features (CONFIGURE_MEM_SLOTS) first, then the
            // good table, then the odd slot.
            conn.send(&msg(GET_PROTOCOL_FEATURES, VERSION, &[]), &[])
                .unwrap();
            conn.read_vhost_reply(Duration::from_secs(10)).unwrap();
            conn.send(
                &msg(SET_PROTOCOL_FEATURES, VERSION, &words(&[1 << 15])),
                &[],
            )
            .unwrap();
            let mut p = words(&[1]);
            p.extend_from_slice(&good_region);
            conn.send(&msg(SET_MEM_TABLE, VERSION, &p), &[r.mmap_handle])
                .unwrap();
            let mut p = words(&[0]);
            p.extend_from_slice(&words(odd));
            conn.send(&msg(ADD_MEM_REG, VERSION, &p), &[file.as_raw_fd()])
                .unwrap();
        }
        // A vring whose used ring lies past the end of the odd file:
        // reading its index was the SIGBUS.
        let _ = conn.send(&msg(SET_VRING_NUM, VERSION, &state(0, 64)), &[]);
        let _ = conn.send(&msg(SET_VRING_BASE, VERSION, &state(0, 0)), &[]);
        let mut addr = state(0, 0);
        // (file offset 1 MiB of a 64 KiB file; or 1 MiB into a 4 MiB
        // region of one)
        let used = if odd[3] > 0 {
            odd_ua + 0x100
        } else {
            odd_ua + (1 << 20)
        };
        addr.extend_from_slice(&words(&[
            r.userspace_addr,
            used,
            r.userspace_addr + 0x1000,
            0,
        ]));
        let _ = conn.send(&msg(SET_VRING_ADDR, VERSION, &addr), &[]);
        assert!(closed(&conn), "case {i}: the daemon kept the connection");
        let s = wait_stats(&mut c, "the refusal counted", |s| {
            s.vhost.refused.region_past_eof == i as u64 + 1 && !s.connected
        });
        assert_eq!(s.vhost.refused_total, i as u64 + 1, "{:?}", s.vhost);
        assert!(
            d.try_wait().unwrap().is_none(),
            "case {i}: the daemon died:\n{}",
            d.log_text()
        );
    }
    // Still serving a well-behaved frontend.
    let mut g = guest(&d, 2, 2);
    let frame = vnic_frontend::guest::discard_frame();
    g.send(1, &frame);
    wait_stats(&mut c, "the frame counted", |s| s.queues[1].tx_packets >= 1);
    assert!(d.log_text().contains("region_past_eof"), "{}", d.log_text());
}

/// Found by vnic-fuzz-vhost --ctl (seed 0x3, sequence seed
/// 0xa814c22e1c8fe57b): a request line over the 1 MiB limit whose newline
/// came in the same read as the bytes over the limit was answered as a
/// request (up to 4 KiB over), and the connection stayed open. It is now
/// refused with one error reply and a disconnect, as CTL.md says.
#[test]
fn ctl_line_over_the_limit_is_refused_even_with_its_newline() {
    let d = daemon(&["--queues", "1"]);
    let mut c = ctl(&d);
    let conn = RawConn::connect(&d.ctl, Duration::from_secs(10)).unwrap();
    let mut line = vec![b' '; (1 << 20) + 100];
    line.extend_from_slice(b"{\"cmd\":\"stats\"}\n");
    conn.send(&line, &[]).unwrap();
    let mut lines = 0;
    conn.read_lines_until(&mut lines, 1, Duration::from_secs(10))
        .unwrap();
    assert!(
        matches!(
            conn.read_lines_until(&mut lines, 2, Duration::from_secs(10)),
            Err(ReadError::Closed)
        ),
        "the connection stayed open ({lines} lines)"
    );
    let s = wait_stats(&mut c, "counted", |s| s.ctl.lines_too_long == 1);
    assert_eq!(s.ctl.clients, 1);
    // A line of exactly the limit is still a request.
    let conn = RawConn::connect(&d.ctl, Duration::from_secs(10)).unwrap();
    let mut line = vec![b' '; (1 << 20) - 15];
    line.extend_from_slice(b"{\"cmd\":\"stats\"}\n");
    assert_eq!(line.len(), (1 << 20) + 1);
    conn.send(&line, &[]).unwrap();
    let mut lines = 0;
    conn.read_lines_until(&mut lines, 1, Duration::from_secs(10))
        .unwrap();
    assert!(conn.drain().is_ok(), "a line of 1 MiB must be served");
    assert_eq!(c.stats().unwrap().ctl.lines_too_long, 1);
}

/// Every refused request is counted by reason in `ctl stats` and logged
/// at most once a second.
#[test]
fn refusals_are_counted_by_reason_and_logged_at_most_once_a_second() {
    let d = daemon(&["--queues", "1"]);
    let mut c = ctl(&d);
    let t0 = Instant::now();
    let n = 40u64;
    for i in 0..n {
        let conn = RawConn::connect(&d.socket, Duration::from_secs(10)).unwrap();
        match i % 4 {
            // An unknown request: the handler's invalid_message.
            0 => conn.send(&msg(1000, VERSION, &[]), &[]).unwrap(),
            // SET_VRING_NUM of 0: invalid_param.
            1 => {
                conn.send(&msg(SET_OWNER, VERSION, &[]), &[]).unwrap();
                conn.send(&msg(SET_VRING_NUM, VERSION, &state(0, 0)), &[])
                    .unwrap();
            }
            // A payload over 64 KiB: the relay's too_big.
            2 => conn
                .send(&msg(SET_MEM_TABLE, VERSION, &[])[..8], &[])
                .and_then(|()| conn.send(&(1u32 << 20).to_le_bytes(), &[]))
                .unwrap(),
            // A header cut short, then closed: truncated.
            _ => conn
                .send(&msg(GET_FEATURES, VERSION, &[])[..5], &[])
                .unwrap(),
        }
        if i % 4 != 3 {
            assert!(closed(&conn), "request {i} was not refused");
        }
        drop(conn);
        wait_stats(&mut c, "refusal counted", |s| {
            s.vhost.refused_total == i + 1 && !s.connected
        });
    }
    let s = c.stats().unwrap();
    let r = s.vhost.refused;
    assert_eq!(
        (r.invalid_message, r.invalid_param, r.too_big, r.truncated),
        (n / 4, n / 4, n / 4, n / 4),
        "{r:?}"
    );
    let secs = t0.elapsed().as_secs() + 1;
    let lines = d
        .log_text()
        .lines()
        .filter(|l| l.contains("vhost-user request refused"))
        .count() as u64;
    assert!(
        (1..=secs).contains(&lines),
        "{lines} refusal lines in {secs} s:\n{}",
        d.log_text()
    );
}

/// A short run of the fuzzer's sequences (both sockets): the daemon lives,
/// answers, and serves a well-behaved frontend after them.
#[test]
fn fuzz_sequences_leave_the_daemon_serving() {
    let mut d = daemon(&["--queues", "2"]);
    let mut c = ctl(&d);
    let cfg = vhost::Config::default();
    for i in 0..40 {
        let seed = sequence_seed(0x28, i);
        let o = vhost::run(&d.socket, seed, &cfg).unwrap();
        assert!(o.stalled.is_none(), "seed {seed:#x}: {:?}", o.stalled);
        wait_stats(&mut c, "sequence's connection gone", |s| {
            s.connections > i && !s.connected
        });
        assert!(
            d.try_wait().unwrap().is_none(),
            "seed {seed:#x}:\n{}",
            d.log_text()
        );
    }
    let fcfg = fctl::Config::default();
    for i in 0..20 {
        let seed = sequence_seed(0x29, i);
        let o = fctl::run(&d.ctl, seed, &fcfg).unwrap();
        assert!(
            o.stalled.is_none() && o.violation.is_none(),
            "seed {seed:#x}: {o:?}"
        );
    }
    let _ = c.gen_stop(None);
    let s = wait_stats(&mut c, "only this client left", |s| s.ctl.clients == 1);
    assert!(s.vhost.refused_total > 0, "{:?}", s.vhost);
    let g = guest(&d, 2, 2);
    drop(g);
    assert!(!d.log_text().contains("panicked"), "{}", d.log_text());
}

/// Found by vnic-fuzz-vhost (seed 0x28, sequence seed 0x508fb0992cb881d6,
/// after 517,635 messages): a SET_MEM_TABLE that maps the rings' guest
/// addresses to other memory while a tx batch runs. The worker read the
/// ring through its snapshot of the old memory and re-enabled
/// notifications through the vring's current one: the new memory's avail
/// index said "more", the old one "nothing", and the worker looped for
/// ever holding the vring's lock; `ctl stats` (the 50 ms poll waits for
/// that lock on the same thread) and SIGTERM hung with it. With
/// `--poll-us 1000 --poll-fixed` the batch stays open for 1 ms, which makes the window
/// wide.
#[test]
fn memory_table_swapped_under_a_tx_batch_does_not_hang_the_worker() {
    let d = daemon(&["--queues", "1", "--poll-us", "1000", "--poll-fixed"]);
    // The rounds run on a thread: when the worker hangs, so does the
    // frontend's next request (the handler waits on the vring's lock);
    // this thread reports it, and the daemon's drop ends the rest.
    let (socket, ctl_path) = (d.socket.clone(), d.ctl.clone());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut c = vnic_frontend::harness::ctl(&ctl_path).unwrap();
        c.set_timeout(Some(Duration::from_secs(20))).unwrap();
        let frame = vnic_frontend::guest::discard_frame();
        for round in 0..30 {
            let mut g = vnic_frontend::guest::Guest::connect(&socket, opts(1, 1024), 1).unwrap();
            let size = g.drv.mem().size() as usize;
            let base = g.drv.mem().base();
            for _ in 0..5 {
                // A frame (the worker opens a batch and polls for 1 ms),
                // then the same guest addresses backed by fresh, zeroed
                // memory (the device keeps its own mapping of it).
                g.send(0, &frame);
                let other = GuestMem::new(base, size).unwrap();
                let _ = g.drv.send_mem_table(&other);
            }
            if let Err(e) = c.stats() {
                let _ = done_tx.send(Err(format!("round {round}: ctl stats: {e}")));
                return;
            }
            drop(g);
            wait_stats(&mut c, "disconnected", |s| !s.connected);
        }
        let _ = done_tx.send(Ok(()));
    });
    match done_rx.recv_timeout(Duration::from_mins(3)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{e}\n{}", d.log_text()),
        Err(e) => panic!(
            "the rounds hung ({e}: a worker spinning with its vring locked?)\n{}",
            d.log_text()
        ),
    }
}
