//! vnic-bench: packet rate of the real `vnic serve` daemon, driven through
//! its vhost-user socket by the Rust test frontend (`vnic_frontend`).
//!
//! RX: the built-in generator peer sends UDP flows as fast as it can; one
//! frontend thread per queue pair keeps that pair's rx ring stocked and
//! counts frames. TX: one frontend thread per pair keeps its tx ring full of
//! prebuilt UDP frames towards the generator, which sinks them. Each case
//! runs against a fresh daemon, with 0 or 65535 filters installed through
//! management ADD frames (32 ops each), for 64 B and 1500 B frames and 1 and
//! 2 queue pairs.
//!
//! Reported per case: wall-clock Mpps (total and per worker), and Mpps per
//! CPU-second of the daemon's worker threads (`vring_worker`, the threads
//! that generate, steer and deliver: the figure the per-worker
//! target is about, comparable on a busy host), besides per CPU-second of
//! the whole daemon. `--baseline OLD_VNIC` runs every case against an
//! older daemon binary too and reports the ratios from that one run: both
//! daemons are set up for the case side by side, and the measured time
//! alternates between them in short slices (old new, new old, ...), only
//! one being driven at a time, so that the slow phases of a shared machine
//! fall on both alike instead of on whichever ran during them.
//!
//! `cargo run --release -p vnic-frontend --bin vnic-bench [-- --quick]`
//!
//! The daemon under test is the `vnic` binary of package `vnic` (another
//! crate of this workspace): `--vnic PATH`, or else `vnic` next to this
//! executable in the same target directory. Under `cargo run` the bench first
//! runs `cargo build [--release] -p vnic --bin vnic` itself (same profile as
//! the bench); run directly, build the daemon first.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arfs::proto::{Ack, AddOp};
use arfs::{FlowKey, L4Proto, OpStatus};
use clap::{ArgAction, CommandFactory, Parser};
use vnic_ctl_proto::{Client, CtlError, FlowSpec, QueueStats, Stats};
use vnic_frontend::guest::{Guest, GuestError, GUEST_MAC};
use vnic_frontend::harness::{ctl, vnic_binary, Daemon, TimedOut};
use vnic_frontend::measure::{self, loadavg, median, ProcError};
use vnic_frontend::pump::{rx_loop, tx_loop, PumpStats};
use vnic_frontend::{build_frame, DeviceFault, FrameSpec, Options};

const AFTER_HELP: &str = "\
Cases: RX and TX, 64 B and 1500 B frames, 1 and 2 pairs, 0 and 65535
filters. The 64 filters that match the generator's flows steer each flow
to the queue RSS picks for it, which is the worker that generates it
(steer \"rss\"): 0 vs 65535 filters then differs by the lookup only. RX with
2 pairs also runs steer \"cross\": every flow's filter points at the other
pair, so every frame is handed from the generating worker to the other
one (the cost of aRFS moving flows between queues).";

// The command line. A repeated option takes its last value.
#[derive(Parser, Debug)]
#[command(
    name = "vnic-bench",
    about = "vnic-bench: RX/TX packet rate of vnic serve through its vhost-user socket",
    after_help = AFTER_HELP,
    args_override_self = true
)]
struct Args {
    /// 1 s per case (--seconds can only make it shorter), 64 B frames only
    #[arg(long)]
    quick: bool,
    /// Measured seconds per case (warm-up is 1 s extra).
    #[arg(long, value_name = "S", default_value = "3", allow_negative_numbers = true,
          value_parser = seconds)]
    seconds: f64,
    /// Run the whole matrix N times, report median and min..max.
    #[arg(long, value_name = "N", default_value = "1", allow_negative_numbers = true,
          value_parser = |v: &str| positive(v, "--repeat"))]
    repeat: usize,
    /// The vnic binary (default: next to this one, built with
    /// `cargo build` first when run through cargo)
    #[arg(long, value_name = "PATH", verbatim_doc_comment)]
    vnic: Option<PathBuf>,
    /// Also run every case against this (older) vnic binary and
    /// report the new/old ratios of that run: both daemons are set up
    /// for the case, and the measured seconds alternate between them
    /// in K slices (old new, new old, ...; only one is driven at a
    /// time), so a slow phase of a shared machine falls on both alike
    #[arg(long, value_name = "PATH", value_parser = existing, verbatim_doc_comment)]
    baseline: Option<PathBuf>,
    /// Slices per case and binary (0.5 s each by default)
    #[arg(long, value_name = "K", default_value = "6", allow_negative_numbers = true,
          value_parser = |v: &str| positive(v, "--slices"))]
    slices: usize,
    /// Run one direction only.
    #[arg(long, value_name = "rx|tx", value_parser = direction)]
    only: Option<Dir>,
    /// Only the cases with N pairs (1 or 2).
    #[arg(long, value_name = "N", value_parser = pair_count)]
    pairs: Option<u16>,
    /// Only the cases with B-byte frames (64 or 1500).
    #[arg(long, value_name = "B", value_parser = frame_size)]
    size: Option<usize>,
    /// Filter counts to run, comma-separated (e.g. 0,1024,65535 for
    /// the cost curve); the first 64 of any count match the
    /// generator's flows
    #[arg(long, value_name = "LIST", default_value = "0,65535", value_delimiter = ',',
          action = ArgAction::Set, value_parser = filter_count, verbatim_doc_comment)]
    filters: Vec<u32>,
}

fn seconds(v: &str) -> Result<f64, String> {
    v.parse()
        .ok()
        .filter(|s: &f64| *s > 0.0)
        .ok_or_else(|| "--seconds needs a positive number".into())
}

fn positive(v: &str, name: &str) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|n: &usize| *n > 0)
        .ok_or_else(|| format!("{name} needs a positive integer"))
}

fn existing(v: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(v);
    if !p.exists() {
        return Err(format!("--baseline: {} does not exist", p.display()));
    }
    Ok(p)
}

fn direction(v: &str) -> Result<Dir, String> {
    match v {
        "rx" => Ok(Dir::Rx),
        "tx" => Ok(Dir::Tx),
        _ => Err("--only takes rx or tx".into()),
    }
}

fn pair_count(v: &str) -> Result<u16, String> {
    match v {
        "1" => Ok(1),
        "2" => Ok(2),
        _ => Err("--pairs takes 1 or 2".into()),
    }
}

fn frame_size(v: &str) -> Result<usize, String> {
    match v {
        "64" => Ok(64),
        "1500" => Ok(1500),
        _ => Err("--size takes 64 or 1500".into()),
    }
}

/// One item of `--filters`.
fn filter_count(v: &str) -> Result<u32, String> {
    match v.trim().parse::<u32>() {
        Ok(n) if n <= FILTERS_FULL => Ok(n),
        _ => Err(format!(
            "--filters: {v:?} is not a filter count 0..={FILTERS_FULL}"
        )),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Rx,
    Tx,
}

/// Why a case could not be run (printed as `FAILED: ...`).
#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("starting {}: {source}", bin.display())]
    Daemon {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("daemon has no pid")]
    NoPid,
    /// A request on the daemon's control socket (`what`) failed.
    #[error("{what}: {source}")]
    Ctl {
        what: &'static str,
        source: CtlError,
    },
    /// The test frontend could not connect to the daemon.
    #[error("frontend connect: {0}")]
    Connect(#[source] vnic_frontend::Error),
    /// A management exchange of the test frontend (`what`) failed.
    #[error("{what}: {source}")]
    Mgmt {
        what: &'static str,
        source: GuestError,
    },
    #[error(transparent)]
    TimedOut(#[from] TimedOut),
    #[error("ADD seq {seq} rejected: {ack:?}")]
    AddRejected { seq: u32, ack: Ack },
    #[error("{live} filters live, wanted {wanted}")]
    FiltersLive { live: u64, wanted: u32 },
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// What a pump thread's driver found wrong in the device's writes
    /// (`DeviceFault` is no `std::error::Error`: carried, not a source).
    #[error("{0}")]
    Pump(DeviceFault),
    #[error("pump thread panicked")]
    PumpPanicked,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    dir: Dir,
    size: usize,
    pairs: u16,
    filters: u32,
    steer: Steer,
}

#[derive(Debug, Default)]
struct Outcome {
    frames: u64,
    secs: f64,
    device_frames: u64,
    device_drops: u64,
    /// RX drops by reason: no_buffers, ring_full, too_big, disabled.
    drops_by_reason: [u64; 4],
    /// RX frames the daemon wrote with plain stores (`rx_plain`; the
    /// rest streamed; 0 from a daemon older than `--rx-stores`).
    device_plain: u64,
    /// CPU seconds the daemon used during the measurement (all threads).
    device_cpu: f64,
    /// CPU seconds of the daemon's worker threads (`vring_worker`).
    worker_cpu: f64,
    waits: u64,
}

/// Generator flows in the RX cases.
const GEN_FLOWS: u16 = 64;
const GEN_SPORT: u16 = 10000;
const GEN_DPORT: u16 = 5001;
const FILTERS_FULL: u32 = 65535;

fn gen_flow(i: u16) -> FlowKey {
    FlowKey::new(
        L4Proto::Udp,
        "10.0.2.1".parse().unwrap(),
        GEN_SPORT + i,
        "10.0.2.15".parse().unwrap(),
        GEN_DPORT,
    )
    .unwrap()
}

/// How the filters of the generator's own flows choose their rx queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Steer {
    /// The queue RSS would pick anyway (the daemon generates each flow on
    /// that queue's worker): 0 vs 65535 filters then differs only by the
    /// lookup (hit) cost.
    Rss,
    /// The next queue after the RSS one: with 2 pairs every frame crosses
    /// from the generating worker to the other.
    Cross,
}

impl Steer {
    fn name(self) -> &'static str {
        match self {
            Steer::Rss => "rss",
            Steer::Cross => "cross",
        }
    }
}

/// Filter `id`: the first GEN_FLOWS are the generator's flows; the rest are
/// synthetic flows from other hosts that never match.
fn filter_op(id: u16, pairs: u16, steer: Steer) -> AddOp {
    if id < GEN_FLOWS {
        let k = gen_flow(id);
        let rss = arfs::Rss::new(pairs).queue_for_key(&k);
        let q = match steer {
            Steer::Rss => rss,
            Steer::Cross => (rss + 1) % pairs,
        };
        return AddOp::new(id, q, &k);
    }
    let n = u32::from(id);
    let src = std::net::Ipv4Addr::new(172, 16, (n >> 8) as u8, n as u8);
    let k = FlowKey::new(
        L4Proto::Udp,
        src.into(),
        1024 + (id % 50000),
        "10.0.2.15".parse().unwrap(),
        80,
    )
    .unwrap();
    AddOp::new(id, id % pairs, &k)
}

/// Install `n` filters with ADD frames of 32 ops, keeping a window of 32
/// frames unacknowledged.
fn install_filters(g: &mut Guest, n: u32, pairs: u16, steer: Steer) -> Result<(), BenchError> {
    let ids: Vec<u16> = (0..n).map(|i| i as u16).collect();
    let chunks: Vec<&[u16]> = ids.chunks(32).collect();
    let mut pending = std::collections::VecDeque::new();
    let timeout = Duration::from_mins(1);
    for (i, ch) in chunks.iter().enumerate() {
        let ops = ch.iter().map(|&id| filter_op(id, pairs, steer)).collect();
        pending.push_back(g.send_mgmt(&arfs::proto::Message::Add(ops)));
        if pending.len() >= 32 || i + 1 == chunks.len() {
            while let Some(seq) = pending.pop_front() {
                let r = g
                    .wait_reply(seq, timeout)
                    .map_err(|source| BenchError::Mgmt {
                        what: "ADD reply",
                        source,
                    })?;
                let a = r.ack();
                if a.frame_status != 0 || a.statuses.iter().any(|&s| s != OpStatus::Ok as u8) {
                    return Err(BenchError::AddRejected {
                        seq,
                        ack: a.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// CPU seconds used so far by process `pid`: (all threads, the
/// `vring_worker` threads).
fn cpu_seconds(pid: u32) -> Result<(f64, f64), ProcError> {
    let all = measure::cpu_seconds(pid)?;
    let workers = measure::thread_cpu_seconds(pid, "vring_worker")?;
    Ok((all, workers))
}

/// One daemon under test, connected and ready (filters installed, for RX
/// its generator running once [`Side::start_gen`] was called).
struct Side {
    _d: Daemon,
    c: Client,
    g: Guest,
    qps: Vec<vnic_frontend::QueuePair>,
    dpid: u32,
    stats: Vec<Arc<PumpStats>>,
    gen_id: Option<u32>,
}

impl Side {
    fn setup(bin: &std::path::Path, case: Case, frame: &[u8]) -> Result<Self, BenchError> {
        let pairs_s = case.pairs.to_string();
        let d = Daemon::start(
            bin,
            &[
                "--queues",
                &pairs_s,
                "--peer",
                "gen",
                "--table-capacity",
                "65535",
            ],
        )
        .map_err(|source| BenchError::Daemon {
            bin: bin.to_path_buf(),
            source,
        })?;
        let mut c = ctl(&d.ctl).map_err(|source| BenchError::Ctl {
            what: "connecting to the control socket",
            source,
        })?;
        let dpid = d.pid().ok_or(BenchError::NoPid)?;
        let opts = Options {
            pairs: case.pairs,
            queue_size: 1024,
            ..Options::default()
        };
        let mut g = Guest::connect(&d.socket, opts, case.pairs).map_err(BenchError::Connect)?;
        // The daemon learns of enabled pairs asynchronously: wait until it
        // reports all of them before any ADD.
        vnic_frontend::harness::wait_for(Duration::from_secs(30), "all pairs enabled", || {
            c.stats().ok().filter(|s| s.enabled_pairs == case.pairs)
        })?;
        g.hello(Duration::from_secs(30))
            .map_err(|source| BenchError::Mgmt {
                what: "HELLO",
                source,
            })?;
        if case.filters > 0 {
            let t0 = Instant::now();
            install_filters(&mut g, case.filters, case.pairs, case.steer)?;
            let live = c
                .table()
                .map_err(|source| BenchError::Ctl {
                    what: "ctl table",
                    source,
                })?
                .live;
            if live != u64::from(case.filters) {
                return Err(BenchError::FiltersLive {
                    live,
                    wanted: case.filters,
                });
            }
            eprintln!(
                "  installed {} filters in {:.2?}",
                case.filters,
                t0.elapsed()
            );
        }
        let mut qps = std::mem::take(&mut g.qps);
        if case.dir == Dir::Tx {
            for qp in &mut qps {
                qp.tx.prebuild(frame);
            }
        }
        Ok(Self {
            _d: d,
            c,
            g,
            qps,
            dpid,
            stats: (0..case.pairs).map(|_| Arc::default()).collect(),
            gen_id: None,
        })
    }

    /// RX: the generator sends as fast as the rx rings take frames (when
    /// this side's pumps are paused its rings fill and it idles).
    fn start_gen(&mut self, case: Case) -> Result<(), BenchError> {
        if case.dir == Dir::Rx {
            self.gen_id = Some(
                self.c
                    .gen_start(
                        &FlowSpec::new()
                            .flows(GEN_FLOWS.into())
                            .sport(format!("{}-{}", GEN_SPORT, GEN_SPORT + GEN_FLOWS - 1))
                            .dport(GEN_DPORT)
                            .rate(0)
                            .size(case.size),
                    )
                    .map_err(|source| BenchError::Ctl {
                        what: "ctl gen start",
                        source,
                    })?,
            );
        }
        Ok(())
    }

    /// Runs this side's pumps for `dur`; with `acc`, adds what the slice
    /// measured to it.
    fn slice(
        &mut self,
        case: Case,
        frame_len: usize,
        dur: Duration,
        acc: Option<&mut Outcome>,
    ) -> Result<(), BenchError> {
        let stop = AtomicBool::new(false);
        let frames = |st: &[Arc<PumpStats>]| -> u64 {
            st.iter().map(|s| s.frames.load(Ordering::Relaxed)).sum()
        };
        let waits = |st: &[Arc<PumpStats>]| -> u64 {
            st.iter().map(|s| s.waits.load(Ordering::Relaxed)).sum()
        };
        let (f0, w0) = (frames(&self.stats), waits(&self.stats));
        let s0 = self.c.stats().map_err(|source| BenchError::Ctl {
            what: "ctl stats",
            source,
        })?;
        let (cpu0, wcpu0) = cpu_seconds(self.dpid)?;
        let t0 = Instant::now();
        std::thread::scope(|s| -> Result<(), BenchError> {
            let mut handles = Vec::new();
            for (qp, st) in self.qps.iter_mut().zip(&self.stats) {
                let stop = &stop;
                handles.push(s.spawn(move || match case.dir {
                    Dir::Rx => rx_loop(&mut qp.rx, stop, st),
                    Dir::Tx => tx_loop(&mut qp.tx, frame_len, stop, st),
                }));
            }
            std::thread::sleep(dur);
            stop.store(true, Ordering::Relaxed);
            for h in handles {
                h.join()
                    .map_err(|_| BenchError::PumpPanicked)?
                    .map_err(BenchError::Pump)?;
            }
            Ok(())
        })?;
        let el = t0.elapsed().as_secs_f64();
        let (cpu1, wcpu1) = cpu_seconds(self.dpid)?;
        let s1 = self.c.stats().map_err(|source| BenchError::Ctl {
            what: "ctl stats",
            source,
        })?;
        let Some(o) = acc else { return Ok(()) };
        let sum = |v: &Stats, f: fn(&QueueStats) -> u64| -> u64 {
            v.queues[..usize::from(case.pairs)].iter().map(f).sum()
        };
        let d = |f: fn(&QueueStats) -> u64| sum(&s1, f) - sum(&s0, f);
        o.frames += frames(&self.stats) - f0;
        o.waits += waits(&self.stats) - w0;
        o.secs += el;
        o.device_cpu += cpu1 - cpu0;
        o.worker_cpu += wcpu1 - wcpu0;
        match case.dir {
            Dir::Rx => {
                o.device_frames += d(|q| q.rx_packets);
                o.device_drops += d(|q| q.rx_drops);
                o.device_plain += d(|q| q.rx_plain);
                // In the order of `drops_by_reason` (see its report).
                let reasons: [fn(&QueueStats) -> u64; 4] = [
                    |q| q.rx_drops_no_buffers,
                    |q| q.rx_drops_ring_full,
                    |q| q.rx_drops_too_big,
                    |q| q.rx_drops_disabled,
                ];
                for (i, r) in reasons.into_iter().enumerate() {
                    o.drops_by_reason[i] += d(r);
                }
            }
            Dir::Tx => {
                o.device_frames += d(|q| q.tx_packets);
                o.device_drops += d(|q| q.tx_drops);
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), BenchError> {
        if let Some(id) = self.gen_id {
            self.c
                .gen_stop(Some(id))
                .map_err(|source| BenchError::Ctl {
                    what: "ctl gen stop",
                    source,
                })?;
        }
        drop(self.g);
        Ok(())
    }
}

/// Runs `case` on every binary of `bins` at once: each gets its daemon,
/// then after a 1 s warm-up each, the measured time is cut into `slices`
/// slices that alternate between the binaries (A B, B A, A B, ...), only
/// one daemon being driven at a time. A slow phase of the shared machine
/// then falls on all of them alike. One [`Outcome`] per binary.
fn run_case(
    bins: &[&std::path::Path],
    case: Case,
    secs: f64,
    slices: usize,
) -> Result<Vec<Outcome>, BenchError> {
    let frame = build_frame(&FrameSpec {
        src_mac: GUEST_MAC,
        dst_mac: [0x02, 0, 0, 0, 0, 1],
        src: "10.0.2.15".parse().unwrap(),
        dst: "10.0.2.1".parse().unwrap(),
        proto: 17,
        sport: 7000,
        dport: 9,
        len: case.size,
    });
    let mut sides = bins
        .iter()
        .map(|b| Side::setup(b, case, &frame))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out: Vec<Outcome> = bins.iter().map(|_| Outcome::default()).collect();
    for side in &mut sides {
        side.start_gen(case)?;
        side.slice(case, frame.len(), Duration::from_secs(1), None)?;
    }
    let dur = Duration::from_secs_f64(secs / slices as f64);
    for k in 0..slices {
        let n = sides.len();
        for j in 0..n {
            let i = if k % 2 == 0 { j } else { n - 1 - j };
            sides[i].slice(case, frame.len(), dur, Some(&mut out[i]))?;
        }
    }
    for side in sides {
        side.finish()?;
    }
    Ok(out)
}

fn main() {
    let Args {
        quick,
        seconds: mut secs,
        repeat,
        vnic,
        baseline,
        slices,
        only,
        pairs: only_pairs,
        size: only_size,
        filters: filter_counts,
    } = Args::parse();
    if quick {
        secs = secs.min(1.0);
    }
    let bin = vnic_binary(vnic).unwrap_or_else(|e| fail(&e.to_string()));
    let mut cases = Vec::new();
    for dir in [Dir::Rx, Dir::Tx] {
        if only.is_some_and(|o| o != dir) {
            continue;
        }
        let sizes: &[usize] = if quick { &[64] } else { &[64, 1500] };
        for &size in sizes {
            if only_size.is_some_and(|s| s != size) {
                continue;
            }
            for pairs in [1u16, 2] {
                if only_pairs.is_some_and(|p| p != pairs) {
                    continue;
                }
                for &filters in &filter_counts {
                    let mut steers = vec![Steer::Rss];
                    if dir == Dir::Rx && pairs == 2 && filters > 0 {
                        steers.push(Steer::Cross);
                    }
                    for steer in steers {
                        cases.push(Case {
                            dir,
                            size,
                            pairs,
                            filters,
                            steer,
                        });
                    }
                }
            }
        }
    }
    if cases.is_empty() {
        fail("no case left after --only/--pairs/--size");
    }
    // (label, binary) of each daemon under test; the baseline first.
    let mut bins: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(b) = &baseline {
        bins.push(("old", b.clone()));
    }
    bins.push(("new", bin));
    // Rounds run the whole matrix in turn; within a case the binaries run
    // side by side, alternating in short slices (see run_case), so slow
    // phases of a shared machine spread over all of them.
    let mut results: Vec<Vec<Vec<Outcome>>> = bins
        .iter()
        .map(|_| cases.iter().map(|_| Vec::new()).collect())
        .collect();
    let load0 = loadavg();
    let t_start = std::time::SystemTime::now();
    let paths: Vec<&std::path::Path> = bins.iter().map(|(_, p)| p.as_path()).collect();
    for round in 0..repeat {
        for (i, case) in cases.iter().enumerate() {
            eprintln!(
                "[round {}/{repeat}, case {}/{}] {case:?}",
                round + 1,
                i + 1,
                cases.len()
            );
            let outcomes = match run_case(&paths, *case, secs, slices) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("  FAILED: {e}");
                    std::process::exit(1);
                }
            };
            for (b, o) in outcomes.into_iter().enumerate() {
                let detail = ["no_buffers", "ring_full", "too_big", "disabled"]
                    .iter()
                    .zip(o.drops_by_reason)
                    .map(|(r, n)| format!("{r} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                eprintln!(
                    "  {}: {:.3} Mpps ({} frames in {:.2} s; workers {:.2} CPU-s = {:.2} Mpps per worker CPU-s; daemon {:.2} CPU-s; device counted {:.3} Mpps, {:.0} % written plainly; drops {}: {detail}; driver sleeps {})",
                    bins[b].0,
                    o.frames as f64 / o.secs / 1e6,
                    o.frames,
                    o.secs,
                    o.worker_cpu,
                    o.frames as f64 / o.worker_cpu.max(1e-3) / 1e6,
                    o.device_cpu,
                    o.device_frames as f64 / o.secs / 1e6,
                    plain_pct(o.device_plain, o.device_frames),
                    o.device_drops,
                    o.waits
                );
                results[b][i].push(o);
            }
        }
    }
    let load1 = loadavg();
    let started = t_start
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    println!();
    println!(
        "vnic-bench: {secs} s per case, {repeat} round(s); started at unix time {started}; load average (1, 5, 15 min) {load0} at the start, {load1} at the end"
    );
    println!();
    println!("Mpps = million frames per second. \"per worker CPU-s\": frames divided by the CPU seconds the daemon's vring_worker threads used in its slices (the per-worker rate a worker with a whole core would reach); each round sums a case's slices; medians of the rounds.");
    println!();
    println!("\"rx plain\": the share of the RX frames the daemon wrote into the guest's buffers with plain stores rather than streamed ones (`ctl stats` rx_plain; `vnic serve --rx-stores`), over all rounds; a daemon older than `--rx-stores` does not count it and reads 0 %.");
    println!();
    let head = "| dir | frame | pairs | filters | steer | Mpps wall (median) | min..max | wall Mpps / worker | worker CPU (cores) | Mpps per worker CPU-s | Mpps per daemon CPU-s | device drops | rx plain |";
    let sep = "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |";
    for (b, (label, path)) in bins.iter().enumerate() {
        if bins.len() > 1 {
            println!("{label}: {}", path.display());
            println!();
        }
        println!("{head}");
        println!("{sep}");
        for (case, runs) in cases.iter().zip(&results[b]) {
            let m = Summary::of(runs);
            println!(
                "| {} | {} B | {} | {} | {} | {:.2} | {:.2}..{:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |",
                if case.dir == Dir::Rx { "RX" } else { "TX" },
                case.size,
                case.pairs,
                case.filters,
                case.steer.name(),
                m.wall,
                m.wall_min,
                m.wall_max,
                m.wall / f64::from(case.pairs),
                m.worker_cores,
                m.per_worker_cpu,
                m.per_daemon_cpu,
                m.drops,
                if case.dir == Dir::Rx {
                    let plain = runs.iter().map(|o| o.device_plain).sum();
                    let frames = runs.iter().map(|o| o.device_frames).sum();
                    format!("{:.0} %", plain_pct(plain, frames))
                } else {
                    "-".to_string()
                }
            );
        }
        println!();
    }
    if bins.len() == 2 {
        println!("new / old, same run. \"paired\": the median over the rounds of each round's new/old ratio (old and new of a round ran in alternating slices, so the pair shares the machine's state); \"of medians\": the ratio of the medians of the tables above.");
        println!();
        println!("| dir | frame | pairs | filters | steer | Mpps per worker CPU-s old -> new | paired | of medians | rounds | Mpps wall old -> new | paired | of medians |");
        println!(
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"
        );
        for (i, case) in cases.iter().enumerate() {
            let o = Summary::of(&results[0][i]);
            let n = Summary::of(&results[1][i]);
            let paired = |f: fn(&Outcome) -> f64| -> Vec<f64> {
                results[0][i]
                    .iter()
                    .zip(&results[1][i])
                    .map(|(a, b)| f(b) / f(a).max(1e-9))
                    .collect()
            };
            let cpu = paired(|r| r.frames as f64 / r.worker_cpu.max(1e-3));
            let wall = paired(|r| r.frames as f64 / r.secs.max(1e-9));
            println!(
                "| {} | {} B | {} | {} | {} | {:.2} -> {:.2} | {:.2}x | {:.2}x | {} | {:.2} -> {:.2} | {:.2}x | {:.2}x |",
                if case.dir == Dir::Rx { "RX" } else { "TX" },
                case.size,
                case.pairs,
                case.filters,
                case.steer.name(),
                o.per_worker_cpu,
                n.per_worker_cpu,
                median(&cpu),
                n.per_worker_cpu / o.per_worker_cpu.max(1e-9),
                cpu.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
                o.wall,
                n.wall,
                median(&wall),
                n.wall / o.wall.max(1e-9),
            );
        }
    }
}

/// The share of `frames` RX frames the daemon wrote plainly, in %.
fn plain_pct(plain: u64, frames: u64) -> f64 {
    100.0 * plain as f64 / frames.max(1) as f64
}

/// Medians over the rounds of one case.
struct Summary {
    wall: f64,
    wall_min: f64,
    wall_max: f64,
    worker_cores: f64,
    per_worker_cpu: f64,
    per_daemon_cpu: f64,
    drops: u64,
}

impl Summary {
    fn of(runs: &[Outcome]) -> Self {
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[0], v[v.len() - 1])
        };
        let (wall, wall_min, wall_max) = med(runs
            .iter()
            .map(|o| o.frames as f64 / o.secs / 1e6)
            .collect());
        let (per_worker_cpu, _, _) = med(runs
            .iter()
            .map(|o| o.frames as f64 / o.worker_cpu.max(1e-3) / 1e6)
            .collect());
        let (per_daemon_cpu, _, _) = med(runs
            .iter()
            .map(|o| o.frames as f64 / o.device_cpu.max(1e-3) / 1e6)
            .collect());
        let (worker_cores, _, _) = med(runs.iter().map(|o| o.worker_cpu / o.secs).collect());
        Summary {
            wall,
            wall_min,
            wall_max,
            worker_cores,
            per_worker_cpu,
            per_daemon_cpu,
            drops: runs.iter().map(|o| o.device_drops).sum::<u64>() / runs.len() as u64,
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!(
        "vnic-bench: {msg}\n\n{}\n\nFor more information, try '--help'.",
        Args::command().render_usage()
    );
    std::process::exit(2);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_argv(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("vnic-bench").chain(args.iter().copied()))
    }

    /// `line` split at white space.
    fn parse(line: &str) -> Result<Args, clap::Error> {
        parse_argv(&line.split_whitespace().collect::<Vec<_>>())
    }

    #[test]
    fn command_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let a = parse("").unwrap();
        assert!(!a.quick);
        assert!((a.seconds - 3.0).abs() < f64::EPSILON);
        assert_eq!((a.repeat, a.slices), (1, 6));
        assert_eq!((a.vnic, a.baseline), (None, None));
        assert_eq!((a.only, a.pairs, a.size), (None, None, None));
        assert_eq!(a.filters, [0, FILTERS_FULL]);
    }

    #[test]
    fn documented_command_lines() {
        // vnic/BENCH.md and vnic/README.md (OLD: any existing file)
        let old = env!("CARGO_MANIFEST_DIR");
        assert!(parse("--quick").unwrap().quick);
        assert_eq!(parse("--repeat 3").unwrap().repeat, 3);
        let a = parse(&format!("--repeat 3 --baseline {old}")).unwrap();
        assert_eq!((a.repeat, a.baseline), (3, Some(PathBuf::from(old))));
        let a = parse(&format!("--size 64 --repeat 3 --baseline {old}")).unwrap();
        assert_eq!((a.size, a.repeat), (Some(64), 3));
        let a = parse("--only rx --size 64 --filters 0,1024,65535 --repeat 3").unwrap();
        assert_eq!((a.only, a.size, a.repeat), (Some(Dir::Rx), Some(64), 3));
        assert_eq!(a.filters, [0, 1024, 65535]);
        let a = parse("--only rx --pairs 1 --size 64").unwrap();
        assert_eq!((a.only, a.pairs), (Some(Dir::Rx), Some(1)));
    }

    #[test]
    fn every_option() {
        let a = parse("--quick --seconds 0.5 --slices 2 --vnic v --only tx --pairs 2 --size 1500")
            .unwrap();
        assert!(a.quick);
        assert!((a.seconds - 0.5).abs() < f64::EPSILON);
        assert_eq!((a.slices, a.vnic), (2, Some(PathBuf::from("v"))));
        assert_eq!(
            (a.only, a.pairs, a.size),
            (Some(Dir::Tx), Some(2), Some(1500))
        );
        // list items are trimmed; a repeated option takes its last value
        assert_eq!(parse_argv(&["--filters", " 7, 8"]).unwrap().filters, [7, 8]);
        assert_eq!(parse("--filters 7,8 --filters 9").unwrap().filters, [9]);
        assert_eq!(parse("--repeat 2 --repeat 5").unwrap().repeat, 5);
    }

    #[test]
    fn bad_values_are_refused() {
        for (bad, msg) in [
            ("--seconds 0", "--seconds needs a positive number"),
            ("--seconds -1", "--seconds needs a positive number"),
            ("--repeat 0", "--repeat needs a positive integer"),
            ("--slices x", "--slices needs a positive integer"),
            ("--only both", "--only takes rx or tx"),
            ("--pairs 4", "--pairs takes 1 or 2"),
            ("--size 128", "--size takes 64 or 1500"),
            ("--filters 0,65536", "is not a filter count 0..=65535"),
            ("--filters 0,,1", "\"\" is not a filter count"),
            ("--baseline /nonexistent/vnic", "does not exist"),
            ("--vnic", "a value is required"),
            ("--fast", "unexpected argument"),
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            assert!(e.to_string().contains(msg), "{bad:?}: {e}");
        }
    }
}
