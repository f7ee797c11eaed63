//! vnic-fuzz-vhost: a structure-aware fuzzer of `vnic serve`'s vhost-user
//! message stream (default) or of its control socket (`--ctl`), with
//! oracles after every sequence.
//!
//! `cargo run --release -p vnic-frontend --bin vnic-fuzz-vhost -- --seconds 40`

// a = arguments, c = control client, d = daemon, g = guest, f = footprint,
// s = stats.
#![allow(clippy::many_single_char_names)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use vnic_ctl_proto::{Client, CtlError, FlowSpec, Stats};
use vnic_frontend::fuzz::vhost::Class;
use vnic_frontend::fuzz::{ctl as fctl, sequence_seed, vhost};
use vnic_frontend::guest::{discard_frame, Guest};
use vnic_frontend::harness::{footprint, settled_footprint, vnic_binary, wait_for, Daemon};
use vnic_frontend::Options;

const AFTER_HELP: &str = "\
A run starts one `vnic serve --queues P` (killed when the run ends) and
sends it sequences; sequence i's seed is derived from --seed and i. A
vhost-user sequence opens a connection, sends 1..=--max-len raw messages
(valid, edge and malformed: see the module doc of vnic_frontend::fuzz::vhost)
with memfds and eventfds attached, runs guest traffic on the rings it set
up, and closes (sometimes in the middle of a message). A control-socket
sequence (--ctl) sends request lines (valid, edge, malformed, over the
1 MiB limit, cut short) and reads every reply.

Oracles, after every sequence: the daemon runs (no exit, no signal, no
`panicked` in its output), `ctl stats` answers within 10 s (else: a hang),
the connection is seen gone within 20 s (else: a hang), a due vhost-user
reply came within 10 s and the daemon took every byte written within 10 s
(else: a hang); in --ctl mode every complete request line got its one
reply line and the control clients drop back to the oracle's own. After 20
warm-up sequences, every --check-every sequences and at the end: a fresh well-behaved frontend
connects P pairs, one frame crosses every tx queue to the peer, generator
frames reach every rx queue, and the daemon's fds, threads and RSS at rest
stay within the soak's allowance (vnic-soak: fds +2, threads +0, RSS
+8 MiB over the highest sample of the run's first tenth).

A failure prints the sequence's seed and the command that replays it
(--repro SEED: that one sequence on a fresh daemon, each message listed,
then every oracle), copies the daemon's log next to the fuzzer's temp
files, and exits 1. The report: messages (or request lines), sequences,
messages by class and kind, connections the daemon closed, the daemon's
refusals by reason (`ctl stats` vhost.refused), crashes, hangs, leaks.";

#[derive(Parser, Debug)]
#[command(
    name = "vnic-fuzz-vhost",
    about = "vnic-fuzz-vhost: structure-aware fuzzing of vnic serve's vhost-user socket (or --ctl: its control socket), with oracles",
    after_help = AFTER_HELP,
    args_override_self = true
)]
struct Args {
    /// Seed of the run (decimal or 0x hex; default: from the clock,
    /// printed).
    #[arg(long, value_name = "S", value_parser = number)]
    seed: Option<u64>,
    /// Stop after this many messages (--ctl: request lines) have been
    /// sent.
    #[arg(long, value_name = "N", value_parser = number)]
    messages: Option<u64>,
    /// Stop after this many seconds (with neither --messages nor
    /// --seconds: 60).
    #[arg(long, value_name = "S", value_parser = number)]
    seconds: Option<u64>,
    /// Fuzz the control socket's request parser instead of the vhost-user
    /// socket.
    #[arg(long)]
    ctl: bool,
    /// Replay the one sequence of this seed (as a failure prints it),
    /// listing what it sends, then check every oracle.
    #[arg(long, value_name = "SEED", value_parser = number)]
    repro: Option<u64>,
    /// Queue pairs of the daemon (`--queues`), 1..=16.
    #[arg(long, value_name = "P", default_value = "2", value_parser = pairs)]
    pairs: u16,
    /// Most messages (request lines) of one sequence.
    #[arg(long, value_name = "L", default_value = "64", value_parser = number)]
    max_len: u64,
    /// Run the data-path and footprint oracles every K sequences (and at
    /// the end).
    #[arg(long, value_name = "K", default_value = "200", value_parser = number)]
    check_every: u64,
    /// The vnic binary (default: next to this one, built with
    /// `cargo build` first when run through cargo)
    #[arg(long, value_name = "PATH", verbatim_doc_comment)]
    vnic: Option<PathBuf>,
}

fn number(v: &str) -> Result<u64, String> {
    let r = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    r.map_err(|_| format!("not a number: {v}"))
}

fn pairs(v: &str) -> Result<u16, String> {
    let p = number(v)?;
    if !(1..=16).contains(&p) {
        return Err("--pairs must be 1..=16".into());
    }
    Ok(p as u16)
}

/// Why a run failed.
#[derive(Debug)]
enum Failure {
    Crash(String),
    Hang(String),
    Leak(String),
    Broken(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Crash(s) => write!(f, "CRASH: {s}"),
            Failure::Hang(s) => write!(f, "HANG: {s}"),
            Failure::Leak(s) => write!(f, "LEAK: {s}"),
            Failure::Broken(s) => write!(f, "BROKEN: {s}"),
        }
    }
}

/// Why the daemon under test could not be started ([`Target::start`]).
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("starting {}: {source}", bin.display())]
    Daemon {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("daemon has no pid")]
    NoPid,
    #[error("ctl connect: {0}")]
    CtlConnect(#[source] CtlError),
    #[error("ctl timeout: {0}")]
    CtlTimeout(#[source] CtlError),
}

/// The running daemon and what the oracles know of it.
struct Target {
    d: Daemon,
    pid: u32,
    c: Client,
    pairs: u16,
    /// Connections the daemon should have counted by now.
    conns: u64,
    /// Footprint at rest after the warm-up, and RSS's early peak.
    base: Option<(usize, usize, u64)>,
    rss_early: u64,
    rss_last: [u64; 2],
    last: (usize, usize, u64),
    checks: u64,
}

/// Sequences before the base footprint is taken.
const WARM_UP: u64 = 20;

const STATS_TIMEOUT: Duration = Duration::from_secs(10);

impl Target {
    fn start(bin: &Path, pairs: u16) -> Result<Target, StartError> {
        let d = Daemon::start(bin, &["--queues", &pairs.to_string()]).map_err(|source| {
            StartError::Daemon {
                bin: bin.to_path_buf(),
                source,
            }
        })?;
        let pid = d.pid().ok_or(StartError::NoPid)?;
        let mut c = vnic_frontend::harness::ctl(&d.ctl).map_err(StartError::CtlConnect)?;
        c.set_timeout(Some(STATS_TIMEOUT))
            .map_err(StartError::CtlTimeout)?;
        Ok(Target {
            d,
            pid,
            c,
            pairs,
            conns: 0,
            base: None,
            rss_early: 0,
            rss_last: [0; 2],
            last: (0, 0, 0),
            checks: 0,
        })
    }

    /// The daemon runs and nothing in its output says it panicked.
    fn alive(&mut self) -> Result<(), Failure> {
        match self.d.try_wait() {
            Ok(None) => {}
            Ok(Some(st)) => return Err(Failure::Crash(format!("vnic serve exited: {st}"))),
            Err(e) => return Err(Failure::Crash(format!("waiting on vnic serve: {e}"))),
        }
        let log = self.d.log_text();
        if let Some(l) = log
            .lines()
            .find(|l| l.contains("panicked") || l.contains("fatal runtime error"))
        {
            return Err(Failure::Crash(format!("daemon output: {l}")));
        }
        Ok(())
    }

    /// `ctl stats` within the timeout; a fresh client after an error.
    fn stats(&mut self) -> Result<Stats, Failure> {
        match self.c.stats() {
            Ok(s) => Ok(s),
            Err(e) => {
                // Three more tries on fresh clients (on a loaded shared
                // host a nice-19 daemon can be starved for seconds), then
                // a hang, with what the daemon's threads were doing.
                let mut errors = vec![e.to_string()];
                for _ in 0..3 {
                    self.alive()?;
                    let c = Client::connect(&self.d.ctl).and_then(|mut c| {
                        c.set_timeout(Some(STATS_TIMEOUT))?;
                        Ok(c)
                    });
                    match c {
                        Ok(c) => {
                            self.c = c;
                            match self.c.stats() {
                                Ok(s) => return Ok(s),
                                Err(e) => errors.push(e.to_string()),
                            }
                        }
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                Err(Failure::Hang(format!(
                    "ctl stats did not answer within {STATS_TIMEOUT:?}, 4 times: {}; daemon threads: {}; load average {}",
                    errors.join("; "),
                    thread_states(self.pid),
                    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
                )))
            }
        }
    }

    /// Wait until the daemon counted `self.conns` connections and none is
    /// open (and, in --ctl mode, only the oracle's control client is left).
    fn settle(&mut self, ctl_clients: bool) -> Result<Stats, Failure> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.alive()?;
            let s = self.stats()?;
            if s.connections >= self.conns && !s.connected && (!ctl_clients || s.ctl.clients == 1) {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(Failure::Hang(format!(
                    "after 20 s the daemon reports connections {} (expected {}), connected {}, control clients {}",
                    s.connections, self.conns, s.connected, s.ctl.clients
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A fresh well-behaved frontend moves frames both ways on every pair.
    fn datapath(&mut self) -> Result<(), Failure> {
        let broken = |e: String| Failure::Broken(e);
        let _ = self.c.gen_stop(None);
        let before = self.settle(false)?;
        let opts = Options {
            pairs: self.pairs,
            queue_size: 256,
            ..Options::default()
        };
        let mut g = Guest::connect(&self.d.socket, opts, self.pairs)
            .map_err(|e| broken(format!("well-behaved frontend: connect: {e}")))?;
        self.conns += 1;
        let t = Duration::from_secs(30);
        let frame = discard_frame();
        for p in 0..self.pairs {
            g.send(p, &frame);
        }
        let pairs = usize::from(self.pairs);
        let mut last = None;
        let c = &mut self.c;
        wait_for(t, "a frame counted on every tx queue", || {
            let s = c.stats().ok()?;
            let done = s.enabled_pairs == self.pairs
                && (0..pairs).all(|p| s.queues[p].tx_packets > before.queues[p].tx_packets);
            last = Some(s);
            done.then_some(())
        })
        .map_err(|e| broken(format!("{e}; last stats: {last:?}")))?;
        let id = self
            .c
            .gen_start(&FlowSpec::new().flows(64).sport("20000-20063").rate(2000))
            .map_err(|e| broken(format!("gen start: {e}")))?;
        let r = g.wait_until(t, "generator frames on every rx queue", |g| {
            g.stash.iter().all(|q| !q.is_empty())
        });
        let _ = self.c.gen_stop(Some(id));
        r.map_err(|e| broken(e.to_string()))?;
        if !g.faults.is_empty() {
            return Err(broken(format!(
                "the device wrote bad used entries: {:?}",
                g.faults
            )));
        }
        drop(g);
        self.settle(false)?;
        Ok(())
    }

    /// The footprint at rest against the allowance.
    fn footprint(&mut self, early: bool, last: bool) -> Result<(), Failure> {
        let f = settled_footprint(self.pid);
        self.last = f;
        let Some(base) = self.base else {
            self.base = Some(f);
            self.rss_early = f.2;
            self.rss_last = [f.2; 2];
            return Ok(());
        };
        if early {
            self.rss_early = self.rss_early.max(f.2);
        }
        let mut bad = Vec::new();
        // A leak does not settle: look again before calling it one.
        let mut f = f;
        let deadline = Instant::now() + Duration::from_secs(10);
        while (f.0 > base.0 + 2 || f.1 > base.1) && Instant::now() < deadline {
            f = settled_footprint(self.pid);
        }
        if f.0 > base.0 + 2 {
            bad.push(format!("fds {} -> {}", base.0, f.0));
        }
        if f.1 > base.1 {
            bad.push(format!("threads {} -> {}", base.1, f.1));
        }
        self.rss_last = [self.rss_last[1], f.2];
        // RSS moves by several MiB either way as glibc's heap and arenas
        // fill and trim (1 MiB control lines, memory tables): as the soak
        // does, the end (the lower of the last two samples) is held
        // against the highest sample of the run's first tenth.
        let rss_end = self.rss_last[0].min(self.rss_last[1]);
        if last && rss_end > self.rss_early + 8 * 1024 {
            bad.push(format!(
                "RSS {rss_end} kB (the lower of the last two samples), more than 8 MiB over the first tenth's peak {} kB",
                self.rss_early
            ));
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Failure::Leak(bad.join(", ")))
        }
    }

    /// Data path and footprint.
    fn full_check(&mut self, early: bool, last: bool) -> Result<(), Failure> {
        self.checks += 1;
        self.datapath()?;
        self.footprint(early, last)
    }

    /// An RSS sample of the first tenth (the daemon at rest: between
    /// sequences).
    fn sample_early(&mut self) {
        if self.base.is_some() {
            self.rss_early = self.rss_early.max(footprint(self.pid).2);
        }
    }
}

/// Each thread of `pid`: name, state (R runnable, S sleeping, D in the
/// kernel) and where it sleeps.
fn thread_states(pid: u32) -> String {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return "?".into();
    };
    let mut v = Vec::new();
    for t in dir.flatten() {
        let p = t.path();
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        let name = stat
            .split('(')
            .nth(1)
            .and_then(|r| r.split(')').next())
            .unwrap_or("?");
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or("?");
        let wchan = std::fs::read_to_string(p.join("wchan")).unwrap_or_default();
        v.push(format!("{name} {state} {wchan}"));
    }
    v.join(", ")
}

#[derive(Default)]
struct Totals {
    sequences: u64,
    messages: u64,
    replies: u64,
    closed: u64,
    cut: u64,
    frames: u64,
    kinds: BTreeMap<(Class, &'static str), u64>,
    /// The slowest sequence (with its oracles) and its seed.
    slowest: (Duration, u64),
}

impl Totals {
    fn add_kinds(&mut self, k: &BTreeMap<(Class, &'static str), u64>) {
        for (key, n) in k {
            *self.kinds.entry(*key).or_default() += n;
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("vnic-fuzz-vhost: {msg}");
    std::process::exit(2)
}

/// One sequence: (messages or lines sent, its outcome summarized).
fn run_one(
    a: &Args,
    t: &mut Target,
    seed: u64,
    trace: bool,
    tot: &mut Totals,
) -> Result<(), Failure> {
    if a.ctl {
        let cfg = fctl::Config {
            max_lines: a.max_len as usize,
            trace,
            ..fctl::Config::default()
        };
        let o = fctl::run(&t.d.ctl, seed, &cfg)
            .map_err(|e| Failure::Hang(format!("connecting to the control socket: {e}")))?;
        tot.sequences += 1;
        tot.messages += o.requests;
        tot.replies += o.replies;
        tot.closed += u64::from(o.closed_by_daemon);
        tot.cut += u64::from(o.cut);
        tot.add_kinds(&o.kinds);
        print_trace(&o.trace);
        if let Some(s) = o.stalled {
            return Err(Failure::Hang(s));
        }
        if let Some(v) = o.violation {
            return Err(Failure::Broken(v));
        }
        if !o.closed_by_daemon && o.replies < o.requests {
            return Err(Failure::Broken(format!(
                "{} request lines, {} replies",
                o.requests, o.replies
            )));
        }
        t.alive()?;
        t.settle(true)?;
        Ok(())
    } else {
        let cfg = vhost::Config {
            pairs: t.pairs,
            max_messages: a.max_len as usize,
            trace,
            ..vhost::Config::default()
        };
        let o = vhost::run(&t.d.socket, seed, &cfg)
            .map_err(|e| Failure::Hang(format!("connecting to the vhost-user socket: {e}")))?;
        t.conns += 1;
        tot.sequences += 1;
        tot.messages += o.messages;
        tot.replies += o.replies;
        tot.closed += u64::from(o.closed_by_daemon);
        tot.cut += u64::from(o.cut);
        tot.frames += o.frames;
        tot.add_kinds(&o.kinds);
        print_trace(&o.trace);
        if let Some(s) = o.stalled {
            return Err(Failure::Hang(s));
        }
        t.alive()?;
        t.settle(false)?;
        Ok(())
    }
}

fn print_trace(trace: &[String]) {
    for (i, l) in trace.iter().enumerate() {
        println!("  {:>3} {l}", i + 1);
    }
}

fn repro_cmd(a: &Args, seed: u64) -> String {
    format!(
        "cargo run --release -p vnic-frontend --bin vnic-fuzz-vhost --{} --pairs {} --max-len {} --repro {seed:#x}",
        if a.ctl { " --ctl" } else { "" },
        a.pairs,
        a.max_len
    )
}

fn report_failure(
    a: &Args,
    t: &mut Target,
    f: &Failure,
    what: &str,
    seed: Option<u64>,
    master: u64,
    sent: u64,
) -> ! {
    println!("FAIL: {f}");
    println!("  in {what}");
    if let Some(s) = seed {
        println!("  sequence seed {s:#x}; replay it: {}", repro_cmd(a, s));
    }
    println!(
        "  the whole run: cargo run --release -p vnic-frontend --bin vnic-fuzz-vhost --{} --pairs {} --max-len {} --check-every {} --seed {master:#x} --messages {sent}",
        if a.ctl { " --ctl" } else { "" },
        a.pairs,
        a.max_len,
        a.check_every
    );
    let keep = std::env::temp_dir().join(format!("vnic-fuzz-{}.log", std::process::id()));
    let log = t.d.log_text();
    if std::fs::write(&keep, &log).is_ok() {
        println!("  daemon log: {}", keep.display());
    }
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    println!("  its last lines:");
    for l in tail.iter().rev() {
        println!("    {l}");
    }
    let _ = std::io::stdout().flush();
    // exit() runs no destructors: end the daemon here.
    let _ = t.d.terminate(Duration::from_secs(2));
    std::process::exit(1)
}

fn print_refusals(s: &Stats) {
    println!("daemon: {} connections", s.connections);
    let v = serde_json::to_value(s).unwrap_or_default();
    if let Some(r) = v.get("vhost") {
        println!("daemon refusals (ctl stats vhost): {r}");
    }
    println!(
        "daemon control socket: refused {}, dropped_slow {}, lines_too_long {}",
        s.ctl.refused, s.ctl.dropped_slow, s.ctl.lines_too_long
    );
}

fn main() {
    let a = Args::parse();
    let bin = vnic_binary(a.vnic.clone()).unwrap_or_else(|e| fail(&e.to_string()));
    let mut t = Target::start(&bin, a.pairs).unwrap_or_else(|e| fail(&e.to_string()));
    let mode = if a.ctl {
        "control socket"
    } else {
        "vhost-user"
    };
    let unit = if a.ctl { "request lines" } else { "messages" };

    if let Some(seed) = a.repro {
        println!(
            "vnic-fuzz-vhost: replaying {mode} sequence {seed:#x} on a fresh daemon (pid {})",
            t.pid
        );
        let mut tot = Totals::default();
        let r = run_one(&a, &mut t, seed, true, &mut tot);
        let what = format!("sequence {seed:#x}");
        if let Err(f) = r {
            report_failure(&a, &mut t, &f, &what, Some(seed), 0, 0);
        }
        if let Err(f) = t.full_check(false, false) {
            report_failure(
                &a,
                &mut t,
                &f,
                &format!("the oracles after {what}"),
                Some(seed),
                0,
                0,
            );
        }
        let s = t.stats().unwrap_or_default();
        print_refusals(&s);
        println!(
            "PASS: {} {unit}, daemon alive, stats answer, frames cross every pair",
            tot.messages
        );
        return;
    }

    let master = a.seed.unwrap_or_else(|| {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        n ^ u64::from(std::process::id()) << 32
    });
    let budget_s = match (a.messages, a.seconds) {
        (None, None) => Some(60),
        (_, s) => s,
    };
    println!(
        "vnic-fuzz-vhost: {mode}, seed {master:#x}, {} pairs, sequences of 1..={} {unit}, data-path check every {} sequences; budget: {}{}; daemon pid {}",
        a.pairs,
        a.max_len,
        a.check_every,
        a.messages.map_or(String::new(), |m| format!("{m} {unit} ")),
        budget_s.map_or(String::new(), |s| format!("{s} s")),
        t.pid
    );
    let t0 = Instant::now();
    let progress = |tot: &Totals| -> f64 {
        let m = a.messages.map_or(0.0, |m| tot.messages as f64 / m as f64);
        let s = budget_s.map_or(0.0, |s| t0.elapsed().as_secs_f64() / s as f64);
        m.max(s)
    };
    let mut tot = Totals::default();
    // Warm-up: a first check, 20 sequences (allocator arenas, buffers
    // grown to their working size), then the base footprint.
    if let Err(f) = t.datapath() {
        report_failure(
            &a,
            &mut t,
            &f,
            "the first check (before any fuzzing)",
            None,
            master,
            0,
        );
    }
    let mut i = 0u64;
    while i < WARM_UP {
        let seed = sequence_seed(master, i);
        if let Err(f) = run_one(&a, &mut t, seed, false, &mut tot) {
            report_failure(
                &a,
                &mut t,
                &f,
                &format!("sequence #{i} (warm-up)"),
                Some(seed),
                master,
                tot.messages,
            );
        }
        i += 1;
    }
    if let Err(f) = t.full_check(true, false) {
        report_failure(
            &a,
            &mut t,
            &f,
            "the check after the warm-up",
            None,
            master,
            tot.messages,
        );
    }
    let mut last_print = Instant::now();
    loop {
        let p = progress(&tot);
        if p >= 1.0 {
            break;
        }
        let seed = sequence_seed(master, i);
        let began = Instant::now();
        if let Err(f) = run_one(&a, &mut t, seed, false, &mut tot) {
            report_failure(
                &a,
                &mut t,
                &f,
                &format!("sequence #{i}"),
                Some(seed),
                master,
                tot.messages,
            );
        }
        if p < 0.1 {
            t.sample_early();
        }
        if began.elapsed() > tot.slowest.0 {
            tot.slowest = (began.elapsed(), seed);
        }
        i += 1;
        if i.is_multiple_of(a.check_every.max(1)) {
            if let Err(f) = t.full_check(p < 0.1, false) {
                report_failure(
                    &a,
                    &mut t,
                    &f,
                    &format!(
                        "the check after sequence #{} (sequences #{}..#{} since the last)",
                        i - 1,
                        i.saturating_sub(a.check_every),
                        i - 1
                    ),
                    None,
                    master,
                    tot.messages,
                );
            }
        }
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = Instant::now();
            let f = footprint(t.pid);
            println!(
                "[{:>6.0} s] {} sequences, {} {unit} ({:.0}/s), {} closed by the daemon, slowest {:.2} s ({:#x}); daemon fds {} threads {} RSS {} kB",
                t0.elapsed().as_secs_f64(),
                tot.sequences,
                tot.messages,
                tot.messages as f64 / t0.elapsed().as_secs_f64().max(1e-9),
                tot.closed,
                tot.slowest.0.as_secs_f64(),
                tot.slowest.1,
                f.0,
                f.1,
                f.2
            );
            let _ = std::io::stdout().flush();
        }
    }
    if let Err(f) = t.full_check(false, true) {
        report_failure(
            &a,
            &mut t,
            &f,
            "the final check",
            None,
            master,
            tot.messages,
        );
    }
    let el = t0.elapsed().as_secs_f64();
    println!(
        "done in {el:.1} s: {} sequences, {} {unit} ({:.0}/s), {} replies read, {} connections closed by the daemon, {} cut mid-message, {} guest frames, {} data-path checks",
        tot.sequences,
        tot.messages,
        tot.messages as f64 / el.max(1e-9),
        tot.replies,
        tot.closed,
        tot.cut,
        tot.frames,
        t.checks
    );
    for class in [Class::Valid, Class::Edge, Class::Malformed] {
        let kinds: Vec<String> = tot
            .kinds
            .iter()
            .filter(|((c, _), _)| *c == class)
            .map(|((_, k), n)| format!("{k} {n}"))
            .collect();
        let n: u64 = tot
            .kinds
            .iter()
            .filter(|((c, _), _)| *c == class)
            .map(|(_, n)| n)
            .sum();
        println!("  {class:?} ({n}): {}", kinds.join(", "));
    }
    let s = t.stats().unwrap_or_default();
    print_refusals(&s);
    let base = t.base.unwrap_or_default();
    println!(
        "footprint at rest: fds {} -> {}, threads {} -> {}, RSS {} -> {} kB (early peak {})",
        base.0, t.last.0, base.1, t.last.1, base.2, t.last.2, t.rss_early
    );
    println!("PASS: crashes 0, hangs 0, leaks 0");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("vnic-fuzz-vhost").chain(args.iter().copied()))
    }

    #[test]
    fn command_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn arguments() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            (a.seed, a.messages, a.seconds, a.ctl, a.repro, a.pairs),
            (None, None, None, false, None, 2)
        );
        let a = parse(&[
            "--seed",
            "0x10",
            "--messages",
            "1000000",
            "--ctl",
            "--repro",
            "42",
            "--pairs",
            "4",
        ])
        .unwrap();
        assert_eq!(
            (a.seed, a.messages, a.ctl, a.repro, a.pairs),
            (Some(16), Some(1_000_000), true, Some(42), 4)
        );
        for bad in [&["--pairs", "0"][..], &["--seed", "x"], &["--frob"]] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
