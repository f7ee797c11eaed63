//! vnic-soak: what a long-lived `vnic serve` keeps per connection.
//!
//! QEMU reconnects to its backend on every guest reboot and every backend
//! restart, so a daemon that lives for weeks sees thousands of frontend
//! connections. This binary starts one daemon, connects the Rust frontend
//! with N queue pairs, enables them all, passes a frame on every pair,
//! disconnects, and does that `--cycles` times. It samples the daemon's open
//! file descriptors, threads and resident memory (from /proc) after a
//! warm-up and every `--every` cycles, prints them, and fails (exit 1) if
//! any grew past the allowance: fds by 2, threads by 0, RSS by 8 MiB (RSS
//! from the highest sample of the run's first tenth to the lower of its
//! last two: glibc's arenas move it by several MiB either way).
//!
//! `cargo run --release -p vnic-frontend --bin vnic-soak [-- --cycles 10000]`

// a = arguments, c = control client, d = daemon, g = guest, f = footprint.
#![allow(clippy::many_single_char_names)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use vnic_ctl_proto::Client;
use vnic_frontend::guest::{Guest, GUEST_MAC};
use vnic_frontend::harness::{ctl, footprint, settled_footprint, vnic_binary, wait_for, Daemon};
use vnic_frontend::{build_frame, FrameSpec, Options};

const AFTER_HELP: &str = "\
Each cycle: connect, set up and enable P pairs, post rx buffers, send one
frame on every pair and see the daemon count it, disconnect, see the daemon
report the connection gone. The first 20 cycles are a warm-up (allocator
arenas, thread stacks); growth is measured from there (each sample is
taken at rest: two readings 100 ms apart agree; between connections the
daemon holds the next connection's worker threads and eventfds, built
before it accepts). Exit status 1 when fds grew by more
than 2, threads at all, or RSS by more than 8 MiB (from the highest sample
of the first tenth to the lower of the last two samples: glibc's per-thread
arenas move RSS by several MiB either way).";

fn fail(msg: &str) -> ! {
    eprintln!("vnic-soak: {msg}");
    std::process::exit(2)
}

// The command line. A repeated option takes its last value.
#[derive(Parser, Debug)]
#[command(
    name = "vnic-soak",
    about = "vnic-soak: connect/disconnect cycles against one vnic serve; fds, threads, RSS",
    after_help = AFTER_HELP,
    args_override_self = true
)]
struct Args {
    /// Connect/disconnect cycles after the warm-up.
    #[arg(long, value_name = "N", default_value = "10000", value_parser = number)]
    cycles: u64,
    /// Queue pairs of the device and of every connection, 1..=16.
    #[arg(long, value_name = "P", default_value = "16", value_parser = pairs)]
    pairs: u16,
    /// Print a sample every K cycles (0 counts as 1).
    #[arg(long, value_name = "K", default_value = "1000", value_parser = every)]
    every: u64,
    /// The vnic binary (default: next to this one, built with
    /// `cargo build` first when run through cargo)
    #[arg(long, value_name = "PATH", verbatim_doc_comment)]
    vnic: Option<PathBuf>,
}

fn number(v: &str) -> Result<u64, String> {
    v.parse().map_err(|_| format!("not a number: {v}"))
}

fn pairs(v: &str) -> Result<u16, String> {
    let p = number(v)?;
    if !(1..=16).contains(&p) {
        return Err("--pairs must be 1..=16".into());
    }
    Ok(p as u16)
}

fn every(v: &str) -> Result<u64, String> {
    number(v).map(|k| k.max(1))
}

fn main() {
    let a = Args::parse();
    let bin = vnic_binary(a.vnic.clone()).unwrap_or_else(|e| fail(&e.to_string()));
    let pairs = a.pairs.to_string();
    let d = Daemon::start(&bin, &["--queues", pairs.as_str()])
        .unwrap_or_else(|e| fail(&format!("starting {}: {e}", bin.display())));
    let pid = d.pid().unwrap_or_else(|| fail("daemon has no pid"));
    let mut c = ctl(&d.ctl).unwrap_or_else(|e| fail(&format!("ctl: {e}")));
    let frame = build_frame(&FrameSpec {
        src_mac: GUEST_MAC,
        dst_mac: [0xff; 6],
        src: "10.0.2.15".parse().unwrap(),
        dst: "10.0.2.1".parse().unwrap(),
        proto: 17,
        sport: 40000,
        dport: 9,
        len: 128,
    });
    let t = Duration::from_mins(1);
    let mut n = 0u64;
    let mut cycle = |c: &mut Client| {
        n += 1;
        let opts = Options {
            pairs: a.pairs,
            queue_size: 256,
            ..Options::default()
        };
        let mut g = Guest::connect(&d.socket, opts, a.pairs)
            .unwrap_or_else(|e| fail(&format!("cycle {n}: connect: {e}\n{}", d.log_text())));
        let before = c.stats().unwrap_or_else(|e| fail(&format!("stats: {e}")));
        for p in 0..a.pairs {
            g.send(p, &frame);
        }
        wait_for(t, "frames counted and pairs enabled", || {
            let s = c.stats().ok()?;
            (s.connections == n
                && s.enabled_pairs == a.pairs
                && (0..usize::from(a.pairs))
                    .all(|p| s.queues[p].tx_packets > before.queues[p].tx_packets))
            .then_some(())
        })
        .unwrap_or_else(|e| fail(&format!("cycle {n}: {e}")));
        drop(g);
        wait_for(t, "disconnected", || {
            let s = c.stats().ok()?;
            (!s.connected).then_some(())
        })
        .unwrap_or_else(|e| fail(&format!("cycle {n}: {e}")));
    };
    let start = footprint(pid);
    for _ in 0..20 {
        cycle(&mut c);
    }
    let base = settled_footprint(pid);
    println!(
        "vnic-soak: {} pairs, {} cycles after 20 warm-up; daemon pid {pid}",
        a.pairs, a.cycles
    );
    println!(
        "{:>8} {:>6} {:>8} {:>9} {:>8}",
        "cycles", "fds", "threads", "RSS kB", "s"
    );
    println!(
        "{:>8} {:>6} {:>8} {:>9} {:>8}",
        "start", start.0, start.1, start.2, "-"
    );
    println!(
        "{:>8} {:>6} {:>8} {:>9} {:>8.1}",
        0, base.0, base.1, base.2, 0.0
    );
    let t0 = Instant::now();
    let mut peak = base;
    // RSS moves by several MiB either way as glibc's per-thread arenas fill
    // and trim: the allowance is counted from the highest sample of the
    // first tenth of the run, and the end is the lower of the last two.
    let mut rss_early = base.2;
    let mut rss_last = [base.2; 2];
    for i in 1..=a.cycles {
        cycle(&mut c);
        if i % a.every == 0 || i == a.cycles {
            let f = settled_footprint(pid);
            peak = (peak.0.max(f.0), peak.1.max(f.1), peak.2.max(f.2));
            if i <= a.cycles.div_ceil(10) {
                rss_early = rss_early.max(f.2);
            }
            rss_last = [rss_last[1], f.2];
            println!(
                "{:>8} {:>6} {:>8} {:>9} {:>8.1}",
                i,
                f.0,
                f.1,
                f.2,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    let end = settled_footprint(pid);
    let rss_end = rss_last[0].min(rss_last[1]);
    let rate = a.cycles as f64 / t0.elapsed().as_secs_f64().max(1e-9);
    println!(
        "after {} cycles ({rate:.1} cycles/s): fds {} -> {} (peak {}), threads {} -> {} (peak {}), RSS {} -> {} kB (peak {})",
        a.cycles, base.0, end.0, peak.0, base.1, end.1, peak.1, base.2, end.2, peak.2
    );
    let mut bad = Vec::new();
    if end.0 > base.0 + 2 {
        bad.push(format!("fds grew by {}", end.0 - base.0));
    }
    if end.1 > base.1 {
        bad.push(format!("threads grew by {}", end.1 - base.1));
    }
    if rss_end > rss_early + 8 * 1024 {
        bad.push(format!(
            "RSS grew by {} kB (end {rss_end} kB, first tenth's peak {rss_early} kB)",
            rss_end - rss_early
        ));
    }
    if bad.is_empty() {
        println!("PASS: nothing grew with the number of connections");
    } else {
        println!("FAIL: {}", bad.join(", "));
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("vnic-soak").chain(args.iter().copied()))
    }

    #[test]
    fn command_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            (a.cycles, a.pairs, a.every, a.vnic),
            (10_000, 16, 1000, None)
        );
    }

    #[test]
    fn documented_and_full_command_lines() {
        // vnic/README.md: `vnic-soak -- --cycles 10000`
        assert_eq!(parse(&["--cycles", "10000"]).unwrap().cycles, 10_000);
        let a = parse(&[
            "--cycles", "50", "--pairs", "2", "--every", "0", "--vnic", "/x/vnic", "--pairs", "3",
        ])
        .unwrap();
        assert_eq!((a.cycles, a.pairs, a.every), (50, 3, 1));
        assert_eq!(a.vnic, Some(PathBuf::from("/x/vnic")));
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["--pairs", "17"][..],
            &["--pairs", "0"],
            &["--cycles", "many"],
            &["--every"],
            &["--frobnicate"],
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        let e = parse(&["--pairs", "17"]).err().unwrap().to_string();
        assert!(e.contains("--pairs must be 1..=16"), "{e}");
        let e = parse(&["--cycles", "x"]).err().unwrap().to_string();
        assert!(e.contains("not a number: x"), "{e}");
    }
}
