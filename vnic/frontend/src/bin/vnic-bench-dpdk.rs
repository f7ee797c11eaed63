//! vnic-bench-dpdk: vnic against DPDK's vhost PMD, both driven by DPDK
//! testpmd's `net_virtio_user` frontend over a vhost-user socket.
//!
//! Run it through `scripts/bench-dpdk`, which installs testpmd (Debian's
//! DPDK 22.11, unpacked under the vnic cache when it is not installed) and
//! builds vnic. Per case, a fresh backend (`vnic serve --peer gen` or
//! `dpdk-testpmd --vdev net_vhost0`) and a fresh frontend (`dpdk-testpmd
//! --vdev net_virtio_user0`, txonly or rxonly) are started on disjoint CPU
//! sets; after a warm-up, the packets the frontend's port counted (its
//! ethdev statistics, read through DPDK telemetry) and the CPU time the
//! backend process used (/proc/PID/stat) are sampled at both ends of the
//! measured window, and the frontend's counter every 250 ms inside it (so
//! a run whose rate jumped, as when the host moves the two CPUs, shows).
//! The backends alternate inside each round.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{ArgAction, Parser};
use serde_json::{json, Value};
use vnic_ctl_proto::{Client, CtlError, FlowSpec, QueueStats, Stats};
use vnic_frontend::harness::ctl as connect_ctl;
use vnic_frontend::measure::{self, loadavg, median, ProcError};

const ABOUT: &str = "\
vnic-bench-dpdk: vnic against DPDK's vhost PMD, with testpmd's net_virtio_user
as the frontend of both (normally run through scripts/bench-dpdk)";

const AFTER_HELP: &str = "\
Directions: TX = guest -> device (frontend txonly; vnic's gen peer or
testpmd rxonly sinks), RX = device -> guest (frontend rxonly; vnic's generator
sends 64 UDP flows at rate 0, or testpmd txonly). Filters (vnic only, RX only:
the table is looked up on the device -> guest path alone): 0; 65535 of which
64 match the generated flows; 65535 that no frame hits. They are installed as
the device comes up with vnic serve --preload-filters (testpmd sends no
management frames). Frames are 64 bytes.";

/// A CPU list as one value (`0-3,8`), not one value per item.
type CpuList = Vec<usize>;

// The command line; `parse_args` checks what needs several options, the
// file system or the CPU set. A repeated option takes its last value.
#[derive(Parser, Debug)]
#[command(
    name = "vnic-bench-dpdk",
    about = ABOUT,
    override_usage = "vnic-bench-dpdk --testpmd <PATH> --vnic <PATH> [OPTIONS]",
    after_help = AFTER_HELP,
    args_override_self = true
)]
struct Cli {
    /// Measured seconds per case [default: 15; --quick: 3]
    #[arg(long, value_name = "SECS", allow_negative_numbers = true, value_parser = duration)]
    duration: Option<f64>,
    /// Rounds over all cases [default: 2; --quick: 1]; the backends
    /// alternate inside each round (DPDK first in odd rounds, vnic
    /// first in even ones)
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = rounds,
          verbatim_doc_comment)]
    rounds: Option<usize>,
    /// Queue pairs, comma-separated, each 1..=16
    #[arg(long, value_name = "LIST", default_value = "1,2", value_delimiter = ',',
          action = ArgAction::Set, value_parser = pair_count)]
    pairs: Vec<u16>,
    /// --duration 3 --rounds 1 (unless given)
    #[arg(long)]
    quick: bool,
    /// Traffic before the window, in seconds
    #[arg(long, value_name = "SECS", default_value = "2", allow_negative_numbers = true,
          value_parser = warmup)]
    warmup: f64,
    /// dpdk-testpmd (DPDK 22.11); required
    #[arg(long, value_name = "PATH")]
    testpmd: Option<PathBuf>,
    /// Its libraries, when not installed system-wide: used as
    /// LD_LIBRARY_PATH, and the vhost, virtio and mempool-ring drivers
    /// are loaded from DIR/dpdk/pmds-23.0 with -d
    #[arg(long, value_name = "DIR", verbatim_doc_comment)]
    dpdk_libs: Option<PathBuf>,
    /// The vnic binary; required
    #[arg(long, value_name = "PATH")]
    vnic: Option<PathBuf>,
    /// Another (older) vnic binary, run as a third backend in every
    /// vnic case of the same rounds; a second table gives
    /// vnic/baseline per round (before/after of one run)
    #[arg(long, value_name = "PATH", verbatim_doc_comment)]
    baseline: Option<PathBuf>,
    /// One direction only
    #[arg(long, value_name = "tx|rx", value_parser = direction)]
    only: Option<Dir>,
    /// CPUs of the frontend, e.g. 2,3 or 4-7 (default: the upper half
    /// of the CPUs this process may use)
    #[arg(long, value_name = "LIST", value_parser = parse_cpus, verbatim_doc_comment)]
    frontend_cpus: Option<CpuList>,
    /// CPUs of the backend (default: the lower half)
    #[arg(long, value_name = "LIST", value_parser = parse_cpus)]
    backend_cpus: Option<CpuList>,
    /// Where the JSON and the per-run logs go
    #[arg(long, value_name = "DIR", default_value = "target/bench-dpdk")]
    out: PathBuf,
    /// Run every backend under valgrind's callgrind and count the
    /// instructions it executes in the window: backend instructions per
    /// frame the frontend counted. A figure no neighbour moves (rates
    /// under callgrind, ~50x slower, are not reported). Needs valgrind
    /// and callgrind_control; each run's dump is left in its log
    /// directory for callgrind_annotate
    #[arg(long, verbatim_doc_comment)]
    count_instructions: bool,
}

fn duration(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0)
        .ok_or_else(|| "--duration needs a positive number of seconds".into())
}

fn rounds(v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| "--rounds needs a positive integer".into())
}

/// One item of `--pairs`.
fn pair_count(v: &str) -> Result<u16, String> {
    v.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| (1..=16).contains(p))
        .ok_or_else(|| format!("--pairs {v:?}: a comma-separated list of 1..=16"))
}

fn warmup(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|v| *v >= 0.0)
        .ok_or_else(|| "--warmup needs a number of seconds".into())
}

fn direction(v: &str) -> Result<Dir, String> {
    match v.to_ascii_lowercase().as_str() {
        "tx" => Ok(Dir::Tx),
        "rx" => Ok(Dir::Rx),
        x => Err(format!("--only {x:?}: tx or rx")),
    }
}

/// Set by SIGINT / SIGTERM / SIGHUP: stop, clean up, exit.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn fail(msg: &str) -> ! {
    eprintln!("vnic-bench-dpdk: error: {msg}");
    std::process::exit(2);
}

fn log(msg: &str) {
    eprintln!(
        "[bench-dpdk {:>6.1}s] {msg}",
        started().elapsed().as_secs_f64()
    );
}

fn started() -> Instant {
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *T0.get_or_init(Instant::now)
}

/// Why a run failed (printed as `error: ...`, and kept in the JSON's
/// `interrupted_or_failed`).
#[derive(Debug, thiserror::Error)]
enum BenchError {
    /// SIGINT, SIGTERM or SIGHUP.
    #[error("interrupted")]
    Interrupted,
    /// A file or directory of the run (`path`) could not be made or read.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting {what} ({}): {source}", program.display())]
    Spawn {
        what: String,
        program: PathBuf,
        source: std::io::Error,
    },
    /// A process of the run exited; the end of its log.
    #[error("{what} exited ({}); last lines of {}:\n{tail}", describe(*status), log.display())]
    Exited {
        what: String,
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
    /// A socket call (`call`) on the way to a telemetry socket failed.
    #[error("telemetry {}: {call}: {source}", path.display())]
    TelemetrySocket {
        path: PathBuf,
        call: &'static str,
        source: std::io::Error,
    },
    #[error("telemetry socket path too long: {}", path.display())]
    TelemetryPathTooLong { path: PathBuf },
    #[error("telemetry read: {0}")]
    TelemetryRead(#[source] std::io::Error),
    #[error("telemetry write: {0}")]
    TelemetryWrite(#[source] std::io::Error),
    #[error("telemetry reply: {0}")]
    TelemetryReply(#[source] serde_json::Error),
    #[error("telemetry /ethdev/stats,0: unexpected reply {reply}")]
    TelemetryStats { reply: Value },
    /// A socket a process makes did not appear; the end of each log.
    #[error("{what} {} did not appear within {timeout:?}\n{logs}", path.display())]
    NoPath {
        what: &'static str,
        path: PathBuf,
        timeout: Duration,
        logs: String,
    },
    /// A request on vnic's control socket (`what`) failed.
    #[error("{what}: {source}")]
    Ctl {
        what: &'static str,
        source: CtlError,
    },
    /// vnic did not come up as the case needs it.
    #[error(
        "vnic: {pairs} pair(s) enabled and {want} filters live not reached within 1 min \
         (enabled_pairs {enabled}, live {live}); last lines of {}:\n{tail}",
        log.display()
    )]
    NotReady {
        pairs: u16,
        want: u64,
        enabled: u16,
        live: u64,
        log: PathBuf,
        tail: String,
    },
    /// No traffic: the end of both logs.
    #[error(
        "the frontend counted no {dir} packets within 30 s\nfrontend, {}:\n{front_tail}\nbackend, {}:\n{back_tail}",
        front_log.display(),
        back_log.display()
    )]
    NoTraffic {
        dir: &'static str,
        front_log: PathBuf,
        front_tail: String,
        back_log: PathBuf,
        back_tail: String,
    },
    #[error(transparent)]
    Proc(#[from] ProcError),
    #[error("callgrind_control (valgrind's): {0}")]
    CallgrindSpawn(#[source] std::io::Error),
    /// callgrind_control did not answer "OK"; its stdout and stderr.
    #[error("callgrind_control {args} {pid}: {output}")]
    CallgrindControl {
        args: String,
        pid: u32,
        output: String,
    },
    #[error("{}: no totals: line", path.display())]
    NoTotals { path: PathBuf },
    /// A filter case's frames were not steered as the case is about.
    #[error(
        "vnic filters {label}: {hit} frames steered by a filter and {rss} by RSS in the window: not what the case is about"
    )]
    FiltersMissed {
        label: &'static str,
        hit: u64,
        rss: u64,
    },
}

/// Sleeps `d`, in short naps so that a signal is acted on at once.
fn nap(d: Duration) -> Result<(), BenchError> {
    let end = Instant::now() + d;
    loop {
        if STOP.load(Ordering::SeqCst) {
            return Err(BenchError::Interrupted);
        }
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    /// Guest -> device: the frontend runs txonly.
    Tx,
    /// Device -> guest: the frontend runs rxonly.
    Rx,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Tx => "TX",
            Dir::Rx => "RX",
        }
    }
    fn frontend_mode(self) -> &'static str {
        match self {
            Dir::Tx => "txonly",
            Dir::Rx => "rxonly",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Filters {
    None,
    /// 65535, 64 of them for the generated flows.
    Match,
    /// 65535, none for the generated flows.
    Miss,
    /// `vnic serve --steer none`: no parse, no lookup, every frame to its
    /// worker's own queue: the same work as DPDK's vhost backend, which
    /// does not steer (the data paths compared alone).
    SteerOff,
}

impl Filters {
    fn label(self) -> &'static str {
        match self {
            Filters::None => "0",
            Filters::Match => "65535, 64 hit",
            Filters::Miss => "65535, all miss",
            Filters::SteerOff => "0, steering off (same work as DPDK)",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Filters::None => "0",
            Filters::Match => "65535-match64",
            Filters::Miss => "65535-miss",
            Filters::SteerOff => "steer-none",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Dpdk,
    Vnic(Filters),
    /// The `--baseline` vnic binary.
    Base(Filters),
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Dpdk => "dpdk",
            Backend::Vnic(_) => "vnic",
            Backend::Base(_) => "base",
        }
    }

    /// The filter case of a vnic backend (either binary).
    fn vnic_filters(self) -> Option<Filters> {
        match self {
            Backend::Dpdk => None,
            Backend::Vnic(f) | Backend::Base(f) => Some(f),
        }
    }
}

/// Generated flows (vnic: `gen start --flows 64 --sport 10000-10063`; the
/// matching preloaded filters are for them).
const GEN_FLOWS: u32 = 64;
const FILTERS_FULL: u32 = 65535;

struct Opts {
    duration: f64,
    rounds: usize,
    pairs: Vec<u16>,
    warmup: f64,
    testpmd: PathBuf,
    dpdk_libs: Option<PathBuf>,
    vnic: PathBuf,
    /// Another vnic binary run as a third backend (before/after in one run).
    baseline: Option<PathBuf>,
    dirs: Vec<Dir>,
    front_cpus: Vec<usize>,
    back_cpus: Vec<usize>,
    out: PathBuf,
    /// `--count-instructions`.
    count: bool,
}

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let a: usize = a.parse().map_err(|_| format!("bad CPU list {s:?}"))?;
        let b: usize = b.parse().map_err(|_| format!("bad CPU list {s:?}"))?;
        if a > b || b >= libc::CPU_SETSIZE as usize {
            return Err(format!("bad CPU list {s:?}"));
        }
        v.extend(a..=b);
    }
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        return Err(format!("empty CPU list {s:?}"));
    }
    Ok(v)
}

fn fmt_cpus(v: &[usize]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_args() -> Opts {
    let Cli {
        duration,
        rounds,
        mut pairs,
        quick,
        warmup,
        testpmd,
        dpdk_libs,
        vnic,
        baseline,
        only,
        frontend_cpus: front,
        backend_cpus: back,
        out,
        count_instructions: count,
    } = Cli::parse();
    pairs.dedup();
    let dirs = only.map_or_else(|| vec![Dir::Tx, Dir::Rx], |d| vec![d]);
    let testpmd = testpmd.unwrap_or_else(|| {
        fail("--testpmd PATH is required (scripts/bench-dpdk finds or installs it)")
    });
    if !testpmd.exists() {
        fail(&format!("--testpmd {}: no such file", testpmd.display()));
    }
    let vnic = vnic.unwrap_or_else(|| fail("--vnic PATH is required"));
    if !vnic.exists() {
        fail(&format!(
            "--vnic {}: no such file (cargo build --release -p vnic)",
            vnic.display()
        ));
    }
    if let Some(b) = &baseline {
        if !b.exists() {
            fail(&format!("--baseline {}: no such file", b.display()));
        }
    }
    let cpus = measure::allowed_cpus();
    let half = cpus.len().div_ceil(2).min(cpus.len() - 1).max(1);
    let back_cpus = back.unwrap_or_else(|| cpus[..half.min(cpus.len())].to_vec());
    let front_cpus = front.unwrap_or_else(|| {
        if cpus.len() > 1 {
            cpus[half..].to_vec()
        } else {
            cpus.clone()
        }
    });
    Opts {
        duration: duration.unwrap_or(if quick { 3.0 } else { 15.0 }),
        rounds: rounds.unwrap_or(if quick { 1 } else { 2 }),
        pairs,
        warmup,
        testpmd,
        dpdk_libs,
        vnic,
        baseline,
        dirs,
        front_cpus,
        back_cpus,
        out,
        count,
    }
}

/// The last `n` lines of a log file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    lines[from..]
        .iter()
        .map(|l| {
            format!(
                "    | {}",
                l.replace("\x1b[2J", "").replace("\x1b[1;1H", "")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A child process of the bench: pinned to its CPUs, killed with the
/// bench (PR_SET_PDEATHSIG), stdin held open (testpmd exits on EOF),
/// stdout and stderr in a log file; stopped and reaped on drop.
struct Proc {
    what: String,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    log: PathBuf,
    /// DPDK's runtime directory (/var/run/dpdk/PREFIX), removed once the
    /// process is gone.
    runtime_dir: Option<PathBuf>,
}

impl Proc {
    fn spawn(
        what: &str,
        mut cmd: Command,
        log: &Path,
        cpus: &[usize],
        runtime_dir: Option<PathBuf>,
    ) -> Result<Self, BenchError> {
        let file_err = |source| BenchError::File {
            path: log.to_path_buf(),
            source,
        };
        let f = File::create(log).map_err(file_err)?;
        let f2 = f.try_clone().map_err(file_err)?;
        cmd.stdin(Stdio::piped()).stdout(f).stderr(f2);
        let cpus = cpus.to_vec();
        // SAFETY: the closure runs in the child between fork and exec; it
        // only calls prctl and sched_setaffinity (async-signal-safe) on a
        // cpu_set_t on its own stack, and reads `cpus`, allocated before
        // the fork and not freed in the child.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                for &c in &cpus {
                    libc::CPU_SET(c, &mut set);
                }
                if libc::sched_setaffinity(
                    0,
                    std::mem::size_of::<libc::cpu_set_t>(),
                    &raw const set,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| BenchError::Spawn {
            what: what.to_string(),
            program: PathBuf::from(cmd.get_program()),
            source,
        })?;
        let stdin = child.stdin.take();
        Ok(Self {
            what: what.to_string(),
            child: Some(child),
            stdin,
            log: log.to_path_buf(),
            runtime_dir,
        })
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// An error naming the process and showing its log tail when it has
    /// exited.
    fn check(&mut self) -> Result<(), BenchError> {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                self.child = None;
                return Err(BenchError::Exited {
                    what: self.what.clone(),
                    status,
                    log: self.log.clone(),
                    tail: tail(&self.log, 25),
                });
            }
        }
        Ok(())
    }

    /// Sends `sig`, waits up to `timeout` for the exit (then SIGKILL).
    fn stop(&mut self, sig: libc::c_int, timeout: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: kill(2) on the pid of our own child, not yet reaped.
        unsafe { libc::kill(c.id().cast_signed(), sig) };
        let deadline = Instant::now() + timeout;
        let st = loop {
            match c.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    log(&format!(
                        "{} did not exit within {timeout:?}: SIGKILL",
                        self.what
                    ));
                    let _ = c.kill();
                    break c.wait().ok();
                }
            }
        };
        self.stdin = None;
        if let Some(d) = self.runtime_dir.take() {
            let _ = std::fs::remove_dir_all(&d);
            if let Some(p) = d.parent() {
                let _ = std::fs::remove_dir(p); // only when empty
            }
        }
        st
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop(libc::SIGTERM, Duration::from_secs(5));
        }
    }
}

fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => st.to_string(),
    }
}

/// DPDK's runtime directory of a file prefix.
fn dpdk_runtime_dir(prefix: &str) -> PathBuf {
    // SAFETY: geteuid(2) cannot fail.
    let base = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/var/run/dpdk")
    } else {
        std::env::var_os("XDG_RUNTIME_DIR").map_or_else(
            || PathBuf::from("/tmp/dpdk"),
            |d| PathBuf::from(d).join("dpdk"),
        )
    };
    base.join(prefix)
}

/// A client of DPDK's telemetry socket (SOCK_SEQPACKET, JSON replies).
struct Telemetry {
    sock: File,
    buf: Vec<u8>,
    /// The greeting: {"version": "DPDK 22.11.x", "pid": ..., ...}.
    hello: Value,
}

impl Telemetry {
    fn connect(path: &Path) -> Result<Self, BenchError> {
        let err = |call: &'static str| BenchError::TelemetrySocket {
            path: path.to_path_buf(),
            call,
            source: std::io::Error::last_os_error(),
        };
        // SAFETY: socket(2) with constant arguments.
        let fd =
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(err("socket"));
        }
        // SAFETY: `fd` is a socket just created and owned by nothing else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all-zero is a valid sockaddr_un.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= addr.sun_path.len() {
            return Err(BenchError::TelemetryPathTooLong {
                path: path.to_path_buf(),
            });
        }
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = s.cast_signed();
        }
        // SAFETY: `addr` is a valid sockaddr_un of the length given; it
        // lives across the call.
        let rc = unsafe {
            libc::connect(
                owned.as_raw_fd(),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(err("connect"));
        }
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: setsockopt reads a timeval of the given size from `tv`.
        let rc = unsafe {
            libc::setsockopt(
                owned.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(err("SO_RCVTIMEO"));
        }
        let mut t = Self {
            sock: File::from(owned),
            buf: vec![0; 1 << 16],
            hello: Value::Null,
        };
        t.hello = t.read()?;
        Ok(t)
    }

    fn read(&mut self) -> Result<Value, BenchError> {
        let n = self
            .sock
            .read(&mut self.buf)
            .map_err(BenchError::TelemetryRead)?;
        serde_json::from_slice(&self.buf[..n]).map_err(BenchError::TelemetryReply)
    }

    fn query(&mut self, cmd: &str) -> Result<Value, BenchError> {
        self.sock
            .write_all(cmd.as_bytes())
            .map_err(BenchError::TelemetryWrite)?;
        let v = self.read()?;
        let key = cmd.split(',').next().unwrap_or(cmd);
        Ok(v[key].clone())
    }

    /// (rx, tx) packets of ethdev port 0.
    fn port_packets(&mut self) -> Result<(u64, u64), BenchError> {
        let s = self.query("/ethdev/stats,0")?;
        match (s["ipackets"].as_u64(), s["opackets"].as_u64()) {
            (Some(i), Some(o)) => Ok((i, o)),
            _ => Err(BenchError::TelemetryStats { reply: s }),
        }
    }
}

/// Waits until `path` exists, both processes staying alive.
fn wait_path(
    path: &Path,
    what: &'static str,
    procs: &mut [&mut Proc],
    timeout: Duration,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        for p in procs.iter_mut() {
            p.check()?;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = procs
                .iter()
                .map(|p| format!("last lines of {}:\n{}", p.log.display(), tail(&p.log, 15)))
                .collect();
            return Err(BenchError::NoPath {
                what,
                path: path.to_path_buf(),
                timeout,
                logs: logs.join("\n"),
            });
        }
        nap(Duration::from_millis(20))?;
    }
    Ok(())
}

/// The packets the frontend's port counted in the case's direction.
fn pick(dir: Dir, (rx, tx): (u64, u64)) -> u64 {
    match dir {
        Dir::Rx => rx,
        Dir::Tx => tx,
    }
}

/// "RX-packets" / "TX-packets" of testpmd's "Accumulated forward
/// statistics for all ports", printed as it stops.
/// testpmd's busy cycles per packet over its whole run (`CPU
/// cycles/packet=` in the statistics it prints as it stops, with
/// `--record-core-cycles`): the cycles its forwarding lcores spent in
/// bursts that moved packets, per packet.
fn busy_cycles(log: &Path) -> Option<f64> {
    let text = String::from_utf8_lossy(&std::fs::read(log).ok()?).into_owned();
    let key = "CPU cycles/packet=";
    let i = text.rfind(key)? + key.len();
    text[i..].split_whitespace().next()?.parse().ok()
}

fn exit_totals(log: &Path) -> Option<(u64, u64)> {
    let text = String::from_utf8_lossy(&std::fs::read(log).ok()?).into_owned();
    let at = text.rfind("Accumulated forward statistics for all ports")?;
    let num = |key: &str| -> Option<u64> {
        let i = text[at..].find(key)? + at + key.len();
        text[i..].split_whitespace().next()?.parse().ok()
    };
    Some((num("RX-packets:")?, num("TX-packets:")?))
}

#[derive(Clone, Debug)]
struct Run {
    round: usize,
    dir: Dir,
    pairs: u16,
    backend: Backend,
    packets: u64,
    secs: f64,
    backend_cpu: f64,
    /// CPU seconds of the frontend process in the window: how much of its
    /// CPUs it got (a busy host shows here).
    frontend_cpu: f64,
    /// What the backend itself counted in the window (vnic: its rx/tx
    /// packet counters; DPDK: its port's), as a cross-check.
    backend_packets: u64,
    /// vnic RX: frames steered by a filter / by RSS in the window.
    rx_filter: Option<u64>,
    rx_rss: Option<u64>,
    /// vnic RX: frames its generator made in the window, and of them the
    /// ones dropped because the frontend had posted no buffer (the ring ran
    /// dry: the frontend's refill, not vnic, was the limit at that moment).
    gen_sent: Option<u64>,
    rx_no_buffers: Option<u64>,
    /// vnic RX: frames written into the frontend's buffers with plain
    /// stores in the window (`ctl stats` rx_plain; the rest streamed).
    rx_plain: Option<u64>,
    /// vnic RX: its spins for rx buffers in the window (`ctl stats`
    /// rx_spins, rx_spins_found: each found one a kick the frontend did
    /// not make and a sleep the worker did not take).
    rx_spins: Option<(u64, u64)>,
    /// The frontend's totals as it stopped (rx, tx).
    frontend_exit: Option<(u64, u64)>,
    /// testpmd's busy cycles per packet: the frontend's, and the
    /// backend's when it is DPDK ([`busy_cycles`]).
    frontend_cycles: Option<f64>,
    backend_cycles: Option<f64>,
    dpdk_version: String,
    /// `--count-instructions`: what callgrind counted in the backend
    /// process (every thread) from instrumentation on to the dump.
    instructions: Option<u64>,
    /// The part of that span outside the window (before its first
    /// sample, after its last), as a fraction of the window: the
    /// instruction count is high by about this fraction at most.
    count_edge: Option<f64>,
    /// The line round trip between the first backend and the first
    /// frontend CPU, just before the backend started and just after both
    /// stopped, ns ([`measure::line_round_trip`]; NaN when not measured).
    rtt: (f64, f64),
    /// The frontend's rate in each [`SLICE`] of the window, Mpps (the
    /// last slice may be shorter): whether the rate held through the
    /// window or jumped, as when the host moves the two CPUs apart or
    /// together.
    slices: Vec<f64>,
}

impl Run {
    /// The frontend's busy cycles per packet (NaN when not reported).
    fn front_busy(&self) -> f64 {
        self.frontend_cycles.unwrap_or(f64::NAN)
    }
    /// DPDK's backend busy cycles per packet (NaN for vnic).
    fn back_busy(&self) -> f64 {
        self.backend_cycles.unwrap_or(f64::NAN)
    }
    fn mpps(&self) -> f64 {
        self.packets as f64 / self.secs / 1e6
    }
    fn mpps_per_cpu(&self) -> f64 {
        if self.backend_cpu > 0.0 {
            self.packets as f64 / self.backend_cpu / 1e6
        } else {
            f64::NAN
        }
    }
    fn cores(&self) -> f64 {
        self.backend_cpu / self.secs
    }
    /// vnic RX: no-buffer drops in % of the frames generated in the window
    /// (NaN when not vnic RX).
    fn no_buf_pct(&self) -> f64 {
        match (self.gen_sent, self.rx_no_buffers) {
            (Some(g), Some(d)) if g > 0 => 100.0 * d as f64 / g as f64,
            _ => f64::NAN,
        }
    }
    /// vnic RX: the frames it wrote with plain stores in % of those it
    /// counted delivered (NaN when not vnic RX).
    fn plain_pct(&self) -> f64 {
        match (self.rx_plain, self.rx_filter, self.rx_rss) {
            (Some(p), Some(f), Some(r)) if f + r > 0 => 100.0 * p as f64 / (f + r) as f64,
            _ => f64::NAN,
        }
    }
    fn front_cores(&self) -> f64 {
        self.frontend_cpu / self.secs
    }
    /// Backend instructions per frame the frontend counted (NaN when not
    /// counted).
    fn ipp(&self) -> f64 {
        match self.instructions {
            Some(i) if self.packets > 0 => i as f64 / self.packets as f64,
            _ => f64::NAN,
        }
    }
    /// The slowest and the fastest [`Run::slices`] (NaN when none).
    fn slice_range(&self) -> (f64, f64) {
        if self.slices.is_empty() {
            return (f64::NAN, f64::NAN);
        }
        self.slices
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            })
    }
    /// Whether the rate held through the window: its slowest slice ran
    /// at least [`STEADY`] of its fastest.
    fn steady(&self) -> bool {
        let (lo, hi) = self.slice_range();
        lo >= STEADY * hi
    }
    /// [`Run::count_edge`] in % (NaN when not counted).
    fn edge_pct(&self) -> f64 {
        self.count_edge.map_or(f64::NAN, |e| 100.0 * e)
    }
    fn to_json(&self) -> Value {
        json!({
            "round": self.round,
            "dir": self.dir.name(),
            "frontend_mode": self.dir.frontend_mode(),
            "pairs": self.pairs,
            "backend": self.backend.name(),
            "filters": self.backend.vnic_filters().map_or(Value::Null, |f| Value::from(f.key())),
            "packets": self.packets,
            "secs": self.secs,
            "mpps": self.mpps(),
            "backend_cpu_s": self.backend_cpu,
            "mpps_per_backend_cpu_s": self.mpps_per_cpu(),
            "backend_cores": self.cores(),
            "frontend_cpu_s": self.frontend_cpu,
            "frontend_cores": self.front_cores(),
            "backend_counted_packets": self.backend_packets,
            "vnic_rx_filter": self.rx_filter,
            "vnic_rx_rss": self.rx_rss,
            "vnic_gen_sent": self.gen_sent,
            "vnic_rx_drops_no_buffers": self.rx_no_buffers,
            "vnic_rx_plain": self.rx_plain,
            "vnic_rx_spins": self.rx_spins.map(|s| s.0),
            "vnic_rx_spins_found": self.rx_spins.map(|s| s.1),
            "frontend_exit_rx_tx": self.frontend_exit,
            "frontend_busy_cycles_per_packet": self.frontend_cycles,
            "backend_busy_cycles_per_packet": self.backend_cycles,
            "backend_instructions": self.instructions,
            "backend_instructions_per_packet": self.instructions.map(|_| self.ipp()),
            "instruction_count_edge_fraction": self.count_edge,
            "line_round_trip_ns_before_after": [self.rtt.0, self.rtt.1],
            "slice_secs": SLICE.as_secs_f64(),
            "slice_mpps": self.slices,
            "steady": self.steady(),
        })
    }
}

/// One end of the measured window.
struct Sample {
    /// When the frontend's counter was read.
    t: Instant,
    /// The frontend's port counter of the case's direction.
    packets: u64,
    backend_cpu: f64,
    frontend_cpu: f64,
    /// The backend's own count of the direction.
    backend_packets: u64,
    /// vnic's `stats`.
    vnic_stats: Option<Stats>,
    /// `--count-instructions`, the window's end: when callgrind had
    /// dumped the backend's count (right after `packets` was read).
    dumped: Option<Instant>,
}

struct Bench {
    o: Opts,
    /// Per-invocation directory for logs and the JSON.
    dir: PathBuf,
    /// Sockets (short paths).
    sockdir: PathBuf,
    n: usize,
}

impl Bench {
    fn testpmd(&self, prefix: &str, lcores: &str, vdev: &str, pmds: &[&str]) -> Command {
        let mut c = Command::new(&self.o.testpmd);
        c.args([
            "--lcores",
            lcores,
            "--no-pci",
            "--no-huge",
            "-m",
            "1024",
            "--file-prefix",
            prefix,
        ]);
        if let Some(libs) = &self.o.dpdk_libs {
            c.env("LD_LIBRARY_PATH", libs);
            for p in pmds {
                c.arg("-d").arg(
                    libs.join("dpdk/pmds-23.0")
                        .join(format!("librte_{p}.so.23")),
                );
            }
        }
        c.args(["--vdev", vdev, "--"]);
        // Busy cycles per packet (and burst sizes) in the stats testpmd
        // prints as it stops: a figure of each side's own work that a
        // neighbour's load does not move (see `busy_cycles`).
        c.args(["--record-core-cycles", "--record-burst-stats"]);
        c
    }

    /// [`measure::line_round_trip`] between the first backend and the
    /// first frontend CPU, ns (NaN when it could not be measured).
    fn line_round_trip(&self) -> f64 {
        measure::line_round_trip(self.o.back_cpus[0], self.o.front_cpus[0]).unwrap_or(f64::NAN)
    }

    /// `--lcores`: the main lcore and `workers` forwarding lcores on `cpus`
    /// (forwarding lcore i on cpus[i % n]; the main one, which sleeps, on
    /// the first).
    fn lcores(cpus: &[usize], workers: u16) -> String {
        let mut s = format!("0@{}", cpus[0]);
        for i in 0..usize::from(workers) {
            let _ = write!(s, ",{}@{}", i + 1, cpus[i % cpus.len()]);
        }
        s
    }

    #[allow(clippy::many_single_char_names)]
    /// `cmd` itself, or under callgrind with `--count-instructions`
    /// (instrumentation off until the window; the dumps go to
    /// `rdir/CALLGRIND_OUT.N`).
    fn counted(&self, cmd: Command, rdir: &Path) -> Command {
        if !self.o.count {
            return cmd;
        }
        let mut v = Command::new("valgrind");
        v.arg("--tool=callgrind")
            .arg("--instr-atstart=no")
            .arg(format!(
                "--callgrind-out-file={}",
                rdir.join(CALLGRIND_OUT).display()
            ))
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, val) in cmd.get_envs() {
            match val {
                Some(val) => v.env(k, val),
                None => v.env_remove(k),
            };
        }
        v
    }

    fn run(
        &mut self,
        round: usize,
        dir: Dir,
        pairs: u16,
        backend: Backend,
    ) -> Result<Run, BenchError> {
        self.n += 1;
        let tag = match backend {
            Backend::Dpdk => format!("{:02}-{}-{}p-dpdk", self.n, dir.name(), pairs),
            Backend::Vnic(f) => format!("{:02}-{}-{}p-vnic-{}", self.n, dir.name(), pairs, f.key()),
            Backend::Base(f) => format!("{:02}-{}-{}p-base-{}", self.n, dir.name(), pairs, f.key()),
        };
        let rdir = self.dir.join(&tag);
        std::fs::create_dir_all(&rdir).map_err(|source| BenchError::File {
            path: rdir.clone(),
            source,
        })?;
        let sock = self.sockdir.join(format!("{}.sock", self.n));
        let ctl_path = self.sockdir.join(format!("{}.ctl", self.n));
        let prefix = format!("vnic-bench-dpdk-{}-{}", std::process::id(), self.n);
        let q = pairs.to_string();
        let label = match backend {
            Backend::Dpdk => "DPDK vhost".to_string(),
            Backend::Vnic(f) => format!("vnic, filters {}", f.label()),
            Backend::Base(f) => format!("vnic baseline, filters {}", f.label()),
        };
        let rtt_before = self.line_round_trip();
        log(&format!(
            "round {round}: {} {pairs} pair(s), {label} (logs {}); line round trip between the CPUs {} ns",
            dir.name(),
            rdir.display(),
            f2(rtt_before),
        ));

        // The backend.
        let mut back = match backend {
            Backend::Vnic(f) | Backend::Base(f) => {
                let bin = match (backend, &self.o.baseline) {
                    (Backend::Base(_), Some(b)) => b,
                    _ => &self.o.vnic,
                };
                let mut c = Command::new(bin);
                c.arg("serve")
                    .arg("--socket")
                    .arg(&sock)
                    .arg("--ctl")
                    .arg(&ctl_path)
                    .args(["--peer", "gen", "--queues", &q, "--table-capacity", "65535"]);
                match f {
                    Filters::None => {}
                    Filters::Match => {
                        c.args(["--preload-filters", "65535", "--preload-match", "64"]);
                    }
                    Filters::Miss => {
                        c.args(["--preload-filters", "65535", "--preload-match", "0"]);
                    }
                    Filters::SteerOff => {
                        c.args(["--steer", "none"]);
                    }
                }
                c.env("RUST_LOG", "info");
                Proc::spawn(
                    "vnic serve (backend)",
                    self.counted(c, &rdir),
                    &rdir.join("backend.log"),
                    &self.o.back_cpus,
                    None,
                )?
            }
            Backend::Dpdk => {
                let bprefix = format!("{prefix}-back");
                let mut c = self.testpmd(
                    &bprefix,
                    &Self::lcores(&self.o.back_cpus, pairs),
                    &format!("net_vhost0,iface={},queues={pairs}", sock.display()),
                    &["net_vhost", "mempool_ring"],
                );
                let mode = match dir {
                    Dir::Tx => "rxonly",
                    Dir::Rx => "txonly",
                };
                c.arg(format!("--forward-mode={mode}"))
                    .arg(format!("--nb-cores={pairs}"))
                    .arg(format!("--rxq={pairs}"))
                    .arg(format!("--txq={pairs}"))
                    .arg("--auto-start");
                Proc::spawn(
                    "dpdk-testpmd (vhost backend)",
                    self.counted(c, &rdir),
                    &rdir.join("backend.log"),
                    &self.o.back_cpus,
                    Some(dpdk_runtime_dir(&bprefix)),
                )?
            }
        };
        wait_path(
            &sock,
            "backend socket",
            &mut [&mut back],
            Duration::from_mins(1),
        )?;
        let mut ctl = match backend {
            Backend::Vnic(_) | Backend::Base(_) => {
                wait_path(
                    &ctl_path,
                    "vnic control socket",
                    &mut [&mut back],
                    Duration::from_secs(30),
                )?;
                Some(connect_ctl(&ctl_path).map_err(|source| BenchError::Ctl {
                    what: "vnic control socket",
                    source,
                })?)
            }
            Backend::Dpdk => None,
        };
        // The backend's telemetry (DPDK), for its own count.
        let mut back_tele = match backend {
            Backend::Dpdk => {
                let p = back
                    .runtime_dir
                    .clone()
                    .unwrap_or_default()
                    .join("dpdk_telemetry.v2");
                wait_path(
                    &p,
                    "backend telemetry socket",
                    &mut [&mut back],
                    Duration::from_secs(30),
                )?;
                Some(Telemetry::connect(&p)?)
            }
            Backend::Vnic(_) | Backend::Base(_) => None,
        };

        // The frontend.
        let fprefix = format!("{prefix}-front");
        let mut c = self.testpmd(
            &fprefix,
            &Self::lcores(&self.o.front_cpus, pairs),
            &format!(
                "net_virtio_user0,path={},queues={pairs},queue_size=1024,in_order=0,mrg_rxbuf=1",
                sock.display()
            ),
            &["net_virtio", "mempool_ring"],
        );
        c.arg(format!("--nb-cores={pairs}"))
            .arg(format!("--rxq={pairs}"))
            .arg(format!("--txq={pairs}"))
            .arg("--total-num-mbufs=8192")
            .arg(format!("--forward-mode={}", dir.frontend_mode()))
            .args(["--auto-start", "--stats-period", "5"]);
        let mut front = Proc::spawn(
            "dpdk-testpmd (virtio-user frontend)",
            c,
            &rdir.join("frontend.log"),
            &self.o.front_cpus,
            Some(dpdk_runtime_dir(&fprefix)),
        )?;
        let tele_path = front
            .runtime_dir
            .clone()
            .unwrap_or_default()
            .join("dpdk_telemetry.v2");
        wait_path(
            &tele_path,
            "frontend telemetry socket",
            &mut [&mut front, &mut back],
            Duration::from_mins(1),
        )?;
        let mut tele = Telemetry::connect(&tele_path)?;
        let dpdk_version = tele.hello["version"].as_str().unwrap_or("?").to_string();

        // vnic: every pair enabled, the filters in, the generator running.
        if let Some(c) = ctl.as_mut() {
            let deadline = Instant::now() + Duration::from_mins(1);
            loop {
                front.check()?;
                back.check()?;
                let s = c.stats().map_err(|source| BenchError::Ctl {
                    what: "vnic ctl stats",
                    source,
                })?;
                let live = s.table.live;
                let want = match backend {
                    Backend::Vnic(Filters::None | Filters::SteerOff)
                    | Backend::Base(Filters::None | Filters::SteerOff)
                    | Backend::Dpdk => 0,
                    Backend::Vnic(_) | Backend::Base(_) => u64::from(FILTERS_FULL),
                };
                if s.enabled_pairs == pairs && live == want {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(BenchError::NotReady {
                        pairs,
                        want,
                        enabled: s.enabled_pairs,
                        live,
                        log: back.log.clone(),
                        tail: tail(&back.log, 15),
                    });
                }
                nap(Duration::from_millis(50))?;
            }
            if dir == Dir::Rx {
                c.gen_start(
                    &FlowSpec::new()
                        .flows(GEN_FLOWS)
                        .sport("10000-10063")
                        .rate(0)
                        .size(64),
                )
                .map_err(|source| BenchError::Ctl {
                    what: "vnic gen start",
                    source,
                })?;
            }
        }
        // Traffic flows: the frontend's counter moves.
        let first = pick(dir, tele.port_packets()?);
        let deadline = Instant::now() + Duration::from_secs(30);
        while pick(dir, tele.port_packets()?) == first {
            front.check()?;
            back.check()?;
            if Instant::now() > deadline {
                return Err(BenchError::NoTraffic {
                    dir: dir.name(),
                    front_log: front.log.clone(),
                    front_tail: tail(&front.log, 20),
                    back_log: back.log.clone(),
                    back_tail: tail(&back.log, 20),
                });
            }
            nap(Duration::from_millis(50))?;
        }
        nap(Duration::from_secs_f64(self.o.warmup))?;

        // The window.
        let bpid = back.pid();
        let fpid = front.pid();
        let count = self.o.count;
        // `last`: the window's end, where a counted backend's dump is taken
        // as soon as the frontend's counter is read.
        let sample = |tele: &mut Telemetry,
                      back_tele: &mut Option<Telemetry>,
                      ctl: &mut Option<Client>,
                      last: bool|
         -> Result<Sample, BenchError> {
            let fcpu = measure::cpu_seconds(fpid)?;
            let cpu = measure::cpu_seconds(bpid)?;
            let t = Instant::now();
            let pk = pick(dir, tele.port_packets()?);
            let dumped = if count && last {
                callgrind_control(bpid, &["--dump"])?;
                Some(Instant::now())
            } else {
                None
            };
            let (bpk, vs) = match (back_tele.as_mut(), ctl.as_mut()) {
                (Some(bt), _) => {
                    // The backend's direction is the other one.
                    let (rx, tx) = bt.port_packets()?;
                    (if dir == Dir::Rx { tx } else { rx }, None)
                }
                (None, Some(client)) => {
                    let st = client.stats().map_err(|source| BenchError::Ctl {
                        what: "vnic ctl stats",
                        source,
                    })?;
                    let field: fn(&QueueStats) -> u64 = if dir == Dir::Rx {
                        |q| q.rx_packets
                    } else {
                        |q| q.tx_packets
                    };
                    (sum_queues(&st, field), Some(st))
                }
                (None, None) => (0, None),
            };
            Ok(Sample {
                t,
                packets: pk,
                backend_cpu: cpu,
                backend_packets: bpk,
                vnic_stats: vs,
                frontend_cpu: fcpu,
                dumped,
            })
        };
        // --count-instructions: instrumentation on right before the
        // window's first sample, the dump right after its last.
        let on = if self.o.count {
            callgrind_control(bpid, &["--instr=on"])?;
            Some(Instant::now())
        } else {
            None
        };
        let a = sample(&mut tele, &mut back_tele, &mut ctl, false)?;
        // The frontend's counter every SLICE, a telemetry query each (the
        // same for every backend; a few hundred microseconds of the
        // frontend's CPU a second at most).
        let end = a.t + Duration::from_secs_f64(self.o.duration);
        let mut marks = vec![(a.t, a.packets)];
        while Instant::now() + SLICE < end {
            let last = marks.last().map_or(a.t, |m| m.0);
            nap((last + SLICE).saturating_duration_since(Instant::now()))?;
            marks.push((Instant::now(), pick(dir, tele.port_packets()?)));
        }
        nap(end.saturating_duration_since(Instant::now()))?;
        let b = sample(&mut tele, &mut back_tele, &mut ctl, true)?;
        marks.push((b.t, b.packets));
        let slices = slice_rates(&marks);
        let (instructions, count_edge) = match (on, b.dumped) {
            (Some(on), Some(dumped)) => {
                let counted = callgrind_total(&rdir.join(format!("{CALLGRIND_OUT}.1")))?;
                let window = (b.t - a.t).as_secs_f64();
                let edge = ((a.t - on) + (dumped - b.t)).as_secs_f64() / window;
                (Some(counted), Some(edge))
            }
            _ => (None, None),
        };
        front.check()?;
        back.check()?;
        // vnic RX: what its counters grew by over the window.
        let (rx_filter, rx_rss, gen_sent, rx_no_buffers, rx_plain, rx_spins) =
            match (&a.vnic_stats, &b.vnic_stats) {
                (Some(sa), Some(sb)) if dir == Dir::Rx => {
                    let delta = |f: fn(&QueueStats) -> u64| {
                        sum_queues(sb, f).saturating_sub(sum_queues(sa, f))
                    };
                    (
                        Some(delta(|q| q.rx_filter)),
                        Some(delta(|q| q.rx_rss)),
                        Some(sb.peer.gen_sent.saturating_sub(sa.peer.gen_sent)),
                        Some(delta(|q| q.rx_drops_no_buffers)),
                        Some(delta(|q| q.rx_plain)),
                        Some((delta(|q| q.rx_spins), delta(|q| q.rx_spins_found))),
                    )
                }
                _ => (None, None, None, None, None, None),
            };
        drop(tele);
        drop(back_tele);
        drop(ctl);
        front.stop(libc::SIGINT, Duration::from_secs(20));
        let frontend_exit = exit_totals(&front.log);
        // testpmd's vhost PMD unlinks its socket as it exits: wait for it.
        let sig = if backend == Backend::Dpdk {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        back.stop(sig, Duration::from_secs(20));
        let rtt_after = self.line_round_trip();
        let frontend_cycles = busy_cycles(&front.log);
        let backend_cycles = if backend == Backend::Dpdk {
            busy_cycles(&back.log)
        } else {
            None
        };
        let run = Run {
            round,
            dir,
            pairs,
            backend,
            packets: b.packets - a.packets,
            secs: (b.t - a.t).as_secs_f64(),
            backend_cpu: b.backend_cpu - a.backend_cpu,
            frontend_cpu: b.frontend_cpu - a.frontend_cpu,
            backend_packets: b.backend_packets - a.backend_packets,
            rx_filter,
            rx_rss,
            gen_sent,
            rx_no_buffers,
            rx_plain,
            rx_spins,
            frontend_exit,
            frontend_cycles,
            backend_cycles,
            dpdk_version,
            instructions,
            count_edge,
            rtt: (rtt_before, rtt_after),
            slices,
        };
        // The filter cases measure what they claim to.
        if let (Some(f), Some(hit), Some(rss)) = (backend.vnic_filters(), rx_filter, rx_rss) {
            let ok = match f {
                Filters::None | Filters::Miss | Filters::SteerOff => hit == 0,
                Filters::Match => rss == 0 && hit > 0,
            };
            if !ok {
                return Err(BenchError::FiltersMissed {
                    label: f.label(),
                    hit,
                    rss,
                });
            }
        }
        let (lo, hi) = run.slice_range();
        log(&format!(
            "  {:.3} Mpps wall ({} slices of {} ms: {}..{}{}), backend {:.2} cores, {:.3} Mpps per backend CPU-s, frontend {:.2} cores ({} packets in {:.2} s; backend counted {}{})",
            run.mpps(),
            run.slices.len(),
            SLICE.as_millis(),
            f3(lo),
            f3(hi),
            if run.steady() { "" } else { ", not steady" },
            run.cores(),
            run.mpps_per_cpu(),
            run.front_cores(),
            run.packets,
            run.secs,
            run.backend_packets,
            match (run.gen_sent, run.rx_no_buffers) {
                (Some(made), Some(dropped)) => format!(
                    "; generated {made}, {dropped} dropped for want of a buffer ({} %); {} % written with plain stores; {} spins for rx buffers, {} found some",
                    f2(run.no_buf_pct()),
                    f2(run.plain_pct()),
                    run.rx_spins.map_or(0, |s| s.0),
                    run.rx_spins.map_or(0, |s| s.1)
                ),
                _ => String::new(),
            }
        ));
        if run.instructions.is_some() {
            log(&format!(
                "  backend instructions per frame: {:.1} (callgrind; window edges {} % of it; rates above are of a backend under callgrind)",
                run.ipp(),
                f2(run.edge_pct())
            ));
        }
        Ok(run)
    }
}

/// The callgrind dump file of a backend, in its run's log directory.
const CALLGRIND_OUT: &str = "backend.callgrind";

/// `callgrind_control ARGS PID`: returns once callgrind has carried the
/// command out (it answers "OK").
fn callgrind_control(pid: u32, args: &[&str]) -> Result<(), BenchError> {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .output()
        .map_err(BenchError::CallgrindSpawn)?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.contains("OK") {
        Ok(())
    } else {
        Err(BenchError::CallgrindControl {
            args: args.join(" "),
            pid,
            output: format!(
                "{}{}",
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// The instruction total of a callgrind dump (its `totals:` line).
fn callgrind_total(path: &Path) -> Result<u64, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::File {
        path: path.to_path_buf(),
        source,
    })?;
    parse_callgrind_total(&text).ok_or_else(|| BenchError::NoTotals {
        path: path.to_path_buf(),
    })
}

fn parse_callgrind_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("totals:"))?;
    line["totals:".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Sum of a per-queue counter of vnic's `stats`.
fn sum_queues(stats: &Stats, field: fn(&QueueStats) -> u64) -> u64 {
    stats.queues.iter().map(field).sum()
}

fn f2(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "-".into()
    }
}

fn f3(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "-".into()
    }
}

fn read_first_line(path: &str, prefix: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(prefix)
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_default()
}

fn command_out(cmd: &mut Command) -> String {
    cmd.output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// One line of the summary: a (direction, pairs, vnic filters) against
/// the DPDK runs of the same direction and pairs.
struct Row {
    dir: Dir,
    pairs: u16,
    filters: Filters,
    dpdk: Vec<Run>,
    vnic: Vec<Run>,
    base: Vec<Run>,
}

impl Row {
    /// The row's first three cells: direction, pairs, vnic filters.
    fn head(&self) -> String {
        format!(
            "{} | {} | {}",
            self.dir.name(),
            self.pairs,
            self.filters.label()
        )
    }

    /// Per round: vnic / DPDK of `f`.
    fn ratios(&self, f: impl Fn(&Run) -> f64) -> Vec<f64> {
        per_round(&self.vnic, &self.dpdk, f)
    }
}

/// The median of `f` over `v`.
fn med(v: &[Run], f: fn(&Run) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

/// `median x (each round's)`.
fn ratio(v: &[f64]) -> String {
    format!(
        "{}x ({})",
        f2(median(v)),
        v.iter().map(|x| f2(*x)).collect::<Vec<_>>().join(" ")
    )
}

/// Per round: `a` / `b` of `f`.
fn per_round(a: &[Run], b: &[Run], f: impl Fn(&Run) -> f64) -> Vec<f64> {
    a.iter()
        .filter_map(|v| {
            let d = b.iter().find(|d| d.round == v.round)?;
            Some(f(v) / f(d))
        })
        .collect()
}

fn summary(runs: &[Run], o: &Opts) -> (String, Vec<Value>) {
    let mut rows = Vec::new();
    for &pairs in &o.pairs {
        for &dir in &o.dirs {
            let dpdk: Vec<Run> = runs
                .iter()
                .filter(|r| r.dir == dir && r.pairs == pairs && r.backend == Backend::Dpdk)
                .cloned()
                .collect();
            for f in filter_cases(dir) {
                let vnic: Vec<Run> = runs
                    .iter()
                    .filter(|r| r.dir == dir && r.pairs == pairs && r.backend == Backend::Vnic(f))
                    .cloned()
                    .collect();
                let base: Vec<Run> = runs
                    .iter()
                    .filter(|r| r.dir == dir && r.pairs == pairs && r.backend == Backend::Base(f))
                    .cloned()
                    .collect();
                if !vnic.is_empty() || !dpdk.is_empty() {
                    rows.push(Row {
                        dir,
                        pairs,
                        filters: f,
                        dpdk: dpdk.clone(),
                        vnic,
                        base,
                    });
                }
            }
        }
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| dir | pairs | vnic filters | Mpps wall DPDK -> vnic | vnic/DPDK (per round) | Mpps per backend CPU-s DPDK -> vnic | vnic/DPDK (per round) | backend cores DPDK / vnic | frontend cores DPDK / vnic | frontend busy cycles/pkt DPDK / vnic | DPDK backend busy cycles/pkt | vnic frames steered by a filter |"
    );
    let _ = writeln!(
        md,
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let mut js = Vec::new();
    for r in &rows {
        let wall = r.ratios(Run::mpps);
        let cpu = r.ratios(Run::mpps_per_cpu);
        let hits: Vec<f64> = r
            .vnic
            .iter()
            .filter_map(|v| {
                let (h, s) = (v.rx_filter?, v.rx_rss?);
                Some(if h + s == 0 {
                    f64::NAN
                } else {
                    100.0 * h as f64 / (h + s) as f64
                })
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} -> {} | {} | {} -> {} | {} | {} / {} | {} / {} | {} / {} | {} | {} |",
            r.head(),
            f3(med(&r.dpdk, Run::mpps)),
            f3(med(&r.vnic, Run::mpps)),
            ratio(&wall),
            f3(med(&r.dpdk, Run::mpps_per_cpu)),
            f3(med(&r.vnic, Run::mpps_per_cpu)),
            ratio(&cpu),
            f2(med(&r.dpdk, Run::cores)),
            f2(med(&r.vnic, Run::cores)),
            f2(med(&r.dpdk, Run::front_cores)),
            f2(med(&r.vnic, Run::front_cores)),
            f2(med(&r.dpdk, Run::front_busy)),
            f2(med(&r.vnic, Run::front_busy)),
            f2(med(&r.dpdk, Run::back_busy)),
            if hits.is_empty() {
                "n/a".to_string()
            } else {
                format!("{} %", f2(median(&hits)))
            },
        );
        js.push(json!({
            "dir": r.dir.name(),
            "pairs": r.pairs,
            "vnic_filters": r.filters.key(),
            "mpps_dpdk_median": med(&r.dpdk, Run::mpps),
            "mpps_vnic_median": med(&r.vnic, Run::mpps),
            "mpps_ratio_per_round": wall,
            "mpps_ratio_median": median(&wall),
            "mpps_per_cpu_dpdk_median": med(&r.dpdk, Run::mpps_per_cpu),
            "mpps_per_cpu_vnic_median": med(&r.vnic, Run::mpps_per_cpu),
            "mpps_per_cpu_ratio_per_round": cpu,
            "mpps_per_cpu_ratio_median": median(&cpu),
            "backend_cores_dpdk_median": med(&r.dpdk, Run::cores),
            "backend_cores_vnic_median": med(&r.vnic, Run::cores),
            "frontend_cores_dpdk_median": med(&r.dpdk, Run::front_cores),
            "frontend_cores_vnic_median": med(&r.vnic, Run::front_cores),
            "frontend_busy_cycles_per_packet_dpdk_median": med(&r.dpdk, Run::front_busy),
            "frontend_busy_cycles_per_packet_vnic_median": med(&r.vnic, Run::front_busy),
            "dpdk_backend_busy_cycles_per_packet_median": med(&r.dpdk, Run::back_busy),
            "vnic_filter_hit_percent": hits,
        }));
    }
    if o.baseline.is_some() {
        md.push_str(&baseline_table(&rows, &mut js));
    }
    md.push_str(&near_table(&rows, runs, &mut js));
    if o.count {
        let mut top = instructions_table(&rows, &mut js);
        top.push_str(
            "\nThe rates below are of backends running under callgrind (tens of times slower): \
             they describe callgrind, not the backends.\n\n",
        );
        md.insert_str(0, &top);
    }
    let _ = writeln!(
        md,
        "\nEach run:\n\n| round | dir | pairs | backend | vnic filters | packets | s | Mpps wall | backend CPU-s | Mpps per backend CPU-s | backend cores | frontend cores | frontend busy cycles/pkt | DPDK backend busy cycles/pkt | backend's own count | vnic no-buffer drops, % of generated | vnic frames written plainly, % | backend instructions per frame | line round trip before / after, ns | slices Mpps min / median / max |"
    );
    let _ = writeln!(
        md,
        "| ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in runs {
        let (slowest, fastest) = r.slice_range();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} / {}{} |",
            r.round,
            r.dir.name(),
            r.pairs,
            r.backend.name(),
            r.backend.vnic_filters().map_or("", Filters::label),
            r.packets,
            r.secs,
            f3(r.mpps()),
            r.backend_cpu,
            f3(r.mpps_per_cpu()),
            f2(r.cores()),
            f2(r.front_cores()),
            f2(r.front_busy()),
            f2(r.back_busy()),
            r.backend_packets,
            f2(r.no_buf_pct()),
            f2(r.plain_pct()),
            f2(r.ipp()),
            f2(r.rtt.0),
            f2(r.rtt.1),
            f3(slowest),
            f3(median(&r.slices)),
            f3(fastest),
            if r.steady() { "" } else { " (not steady)" },
        );
    }
    (md, js)
}

/// `1.23x`, or `-` when `x` is not a number (no runs to divide).
fn times(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "-".into()
    }
}

/// The window is read in slices of this length ([`Run::slices`]).
const SLICE: Duration = Duration::from_millis(250);

/// A run is steady when its slowest slice ran at least this share of its
/// fastest. The host moving the two CPUs apart halves a rate here (~20 ->
/// ~10 Mpps); 250 ms slices of a run that stayed put spread by a few %.
const STEADY: f64 = 0.8;

/// The rate between consecutive `(time, packets)` marks, Mpps.
fn slice_rates(marks: &[(Instant, u64)]) -> Vec<f64> {
    marks
        .windows(2)
        .filter_map(|w| {
            let secs = (w[1].0 - w[0].0).as_secs_f64();
            (secs > 0.0).then(|| w[1].1.saturating_sub(w[0].1) as f64 / secs / 1e6)
        })
        .collect()
}

/// A run is "near" when both its line round trips are at most this many
/// times the bench's reference round trip ([`reference_round_trip`]),
/// and at least [`NEAR_FLOOR`] times it.
const NEAR_FACTOR: f64 = 2.0;

/// The lower edge of "near". On this host a rare reading near 29 ns sits
/// below the usual 59-70 ns (4 of ~1030 probes in a day's runs): another
/// placement of the two vCPUs (sharing a core, perhaps), not the usual
/// near one, and one DPDK RX run that began with it ran at 10.8 Mpps
/// against its usual 16.5-17.9. Such a run is left out of the near table
/// rather than counted as near.
const NEAR_FLOOR: f64 = 0.6;

/// The bench's reference line round trip: the first quartile of every
/// probe of every run (NaN when none was measured). Not the shortest: on
/// this host a rare ~30 ns reading sits below the usual ~65 ns one, and a
/// bar at twice it would call every run far (and [`NEAR_FLOOR`] keeps
/// runs with such a reading out of the near ones).
fn reference_round_trip(runs: &[Run]) -> f64 {
    let mut v: Vec<f64> = runs
        .iter()
        .flat_map(|r| [r.rtt.0, r.rtt.1])
        .filter(|x| x.is_finite())
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 4).copied().unwrap_or(f64::NAN)
}

/// Whether both line round trips of `r` stayed between [`NEAR_FLOOR`] and
/// [`NEAR_FACTOR`] times `reference`: the host had the two CPUs in their
/// usual near placement before the backend started and after both stopped
/// (it may still have moved them apart and back in between: the probes
/// bracket the run, they do not watch it).
fn near(r: &Run, reference: f64) -> bool {
    let usual = |x: f64| (reference * NEAR_FLOOR..=reference * NEAR_FACTOR).contains(&x);
    usual(r.rtt.0) && usual(r.rtt.1)
}

/// The rows again over the runs whose CPUs stayed near ([`near`]) and
/// whose rate held through the window ([`Run::steady`]), as medians of
/// each backend's runs (rounds cannot be paired once some of their runs
/// are left out); adds the figures to each row's JSON.
fn near_table(rows: &[Row], runs: &[Run], js: &mut [Value]) -> String {
    let reference = reference_round_trip(runs);
    if reference.is_nan() {
        return String::new();
    }
    let far = runs.iter().filter(|r| !near(r, reference)).count();
    let unsteady = runs
        .iter()
        .filter(|r| near(r, reference) && !r.steady())
        .count();
    let mut md = format!(
        "\nThe line round trip between the backend's and the frontend's first CPU was measured before and after each run: its first quartile over the bench was {} ns, and {far} of {} runs read over {NEAR_FACTOR}x that before or after (the host had the two CPUs far apart at that moment, which can slow every backend by up to 2x; see \"Each run\"), or under {NEAR_FLOOR}x that (a rarer placement, left out too). The probes bracket a run, they do not watch it; the frontend's counter, read every {} ms, does: of the runs near at both ends, {unsteady} were not steady (the slowest slice under {STEADY}x the fastest: the rate jumped inside the window, as when the host moves the CPUs apart in between). Over the near and steady runs, medians of each backend's runs:\n\n\
         | dir | pairs | vnic filters | runs DPDK / vnic | Mpps wall DPDK -> vnic | vnic/DPDK | Mpps per backend CPU-s DPDK -> vnic | vnic/DPDK |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n",
        f2(reference),
        runs.len(),
        SLICE.as_millis()
    );
    let near_runs = |v: &[Run]| -> Vec<Run> {
        v.iter()
            .filter(|x| near(x, reference) && x.steady())
            .cloned()
            .collect()
    };
    for (r, j) in rows.iter().zip(js.iter_mut()) {
        let (d, v) = (near_runs(&r.dpdk), near_runs(&r.vnic));
        let (dw, vw) = (med(&d, Run::mpps), med(&v, Run::mpps));
        let (dc, vc) = (med(&d, Run::mpps_per_cpu), med(&v, Run::mpps_per_cpu));
        let _ = writeln!(
            md,
            "| {} | {} / {} | {} -> {} | {} | {} -> {} | {} |",
            r.head(),
            d.len(),
            v.len(),
            f3(dw),
            f3(vw),
            times(vw / dw),
            f3(dc),
            f3(vc),
            times(vc / dc),
        );
        if let Some(m) = j.as_object_mut() {
            m.insert("near_runs_dpdk_vnic".into(), json!([d.len(), v.len()]));
            m.insert("near_mpps_dpdk_vnic_median".into(), json!([dw, vw]));
            m.insert("near_mpps_per_cpu_dpdk_vnic_median".into(), json!([dc, vc]));
        }
    }
    md
}

/// vnic against the `--baseline` binary, measured in the same rounds: the
/// before/after of one run (adds the figures to each row's JSON).
fn baseline_table(rows: &[Row], js: &mut [Value]) -> String {
    let mut md = String::from(
        "\nvnic against the baseline binary (`--baseline`), same rounds (the three backends alternate inside each round):\n\n\
         | dir | pairs | vnic filters | Mpps wall baseline -> vnic | vnic/baseline (per round) | Mpps per backend CPU-s baseline -> vnic | vnic/baseline (per round) | baseline/DPDK wall | vnic/DPDK wall |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (r, j) in rows.iter().zip(js.iter_mut()) {
        if r.base.is_empty() {
            continue;
        }
        let wall = per_round(&r.vnic, &r.base, Run::mpps);
        let cpu = per_round(&r.vnic, &r.base, Run::mpps_per_cpu);
        let base_dpdk = per_round(&r.base, &r.dpdk, Run::mpps);
        let _ = writeln!(
            md,
            "| {} | {} -> {} | {} | {} -> {} | {} | {}x | {}x |",
            r.head(),
            f3(med(&r.base, Run::mpps)),
            f3(med(&r.vnic, Run::mpps)),
            ratio(&wall),
            f3(med(&r.base, Run::mpps_per_cpu)),
            f3(med(&r.vnic, Run::mpps_per_cpu)),
            ratio(&cpu),
            f2(median(&base_dpdk)),
            f2(median(&r.ratios(Run::mpps))),
        );
        if let Some(m) = j.as_object_mut() {
            m.insert("mpps_base_median".into(), json!(med(&r.base, Run::mpps)));
            m.insert(
                "mpps_per_cpu_base_median".into(),
                json!(med(&r.base, Run::mpps_per_cpu)),
            );
            m.insert("mpps_vnic_over_base_per_round".into(), json!(wall));
            m.insert("mpps_per_cpu_vnic_over_base_per_round".into(), json!(cpu));
            m.insert("mpps_base_over_dpdk_per_round".into(), json!(base_dpdk));
        }
    }
    md
}

/// `--count-instructions`: backend instructions per frame, vnic against
/// DPDK (and the baseline), per round (adds the figures to each row's
/// JSON).
fn instructions_table(rows: &[Row], js: &mut [Value]) -> String {
    let mut md = String::from(
        "Backend instructions per frame the frontend counted (callgrind, every thread of the backend process; below 1 in a ratio: vnic runs fewer):\n\n\
         | dir | pairs | vnic filters | DPDK | vnic | vnic/DPDK (per round) | baseline | vnic/baseline (per round) | window edges, % (max) |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (r, j) in rows.iter().zip(js.iter_mut()) {
        let vd = r.ratios(Run::ipp);
        let vb = per_round(&r.vnic, &r.base, Run::ipp);
        let edge = r
            .dpdk
            .iter()
            .chain(&r.vnic)
            .chain(&r.base)
            .map(Run::edge_pct)
            .fold(f64::NAN, f64::max);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.head(),
            f2(med(&r.dpdk, Run::ipp)),
            f2(med(&r.vnic, Run::ipp)),
            ratio(&vd),
            if r.base.is_empty() {
                "-".to_string()
            } else {
                f2(med(&r.base, Run::ipp))
            },
            if vb.is_empty() {
                "-".to_string()
            } else {
                ratio(&vb)
            },
            f2(edge),
        );
        if let Some(m) = j.as_object_mut() {
            m.insert(
                "instructions_per_packet_dpdk_median".into(),
                json!(med(&r.dpdk, Run::ipp)),
            );
            m.insert(
                "instructions_per_packet_vnic_median".into(),
                json!(med(&r.vnic, Run::ipp)),
            );
            m.insert("instructions_vnic_over_dpdk_per_round".into(), json!(vd));
            m.insert("instructions_vnic_over_base_per_round".into(), json!(vb));
        }
    }
    md
}

/// Pair counts with more forwarding lcores than CPUs on a side: DPDK's
/// polling lcores then time-share a CPU, which says little about either
/// backend on a host with enough CPUs.
fn crowded_note(o: &Opts) -> Option<String> {
    let per_side = o.back_cpus.len().min(o.front_cpus.len());
    let over: Vec<String> = o
        .pairs
        .iter()
        .filter(|&&p| usize::from(p) > per_side)
        .map(ToString::to_string)
        .collect();
    (!over.is_empty()).then(|| {
        format!(
            "with {} pair(s), each side runs more forwarding threads than it has CPUs ({per_side} per side: backend {}, frontend {}): \
             testpmd's busy-polling lcores (the DPDK backend's, and the frontend's in every run) time-share a CPU, vnic's workers sleep when idle; \
             those rows describe an oversubscribed host, not the backends",
            over.join(", "),
            fmt_cpus(&o.back_cpus),
            fmt_cpus(&o.front_cpus)
        )
    })
}

/// vnic filter variants run in a direction: the table is only looked up
/// on the device -> guest path.
fn filter_cases(dir: Dir) -> Vec<Filters> {
    match dir {
        Dir::Tx => vec![Filters::None],
        Dir::Rx => vec![
            Filters::None,
            Filters::Match,
            Filters::Miss,
            Filters::SteerOff,
        ],
    }
}

fn main() {
    started();
    let o = parse_args();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let stamp = command_out(Command::new("date").args(["-u", "+%Y%m%dT%H%M%SZ"]));
    let dir = o.out.join(&stamp);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        fail(&format!("{}: {e}", dir.display()));
    }
    let sockdir = std::env::temp_dir().join(format!("vnic-bench-dpdk-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&sockdir) {
        fail(&format!("{}: {e}", sockdir.display()));
    }
    if o.front_cpus.iter().any(|c| o.back_cpus.contains(c)) {
        log("warning: frontend and backend CPUs overlap");
    }
    let load_start = loadavg();
    log(&format!(
        "{} round(s) x pairs {:?}, {} s per case after {} s warm-up; backend on CPU(s) {}, frontend on CPU(s) {}; load average {load_start}",
        o.rounds,
        o.pairs,
        o.duration,
        o.warmup,
        fmt_cpus(&o.back_cpus),
        fmt_cpus(&o.front_cpus)
    ));
    log("TX runs vnic with 0 filters only: the filter table is looked up on the device -> guest (RX) path alone");
    let crowded = crowded_note(&o);
    if let Some(n) = &crowded {
        log(&format!("warning: {n}"));
    }
    let mut b = Bench {
        o,
        dir: dir.clone(),
        sockdir: sockdir.clone(),
        n: 0,
    };
    let mut runs = Vec::new();
    let mut err = None;
    'all: for round in 1..=b.o.rounds {
        for pairs in b.o.pairs.clone() {
            for d in b.o.dirs.clone() {
                let mut order: Vec<Backend> = vec![Backend::Dpdk];
                for f in filter_cases(d) {
                    order.push(Backend::Vnic(f));
                    // (An older baseline binary may not know --steer none.)
                    if b.o.baseline.is_some() && f != Filters::SteerOff {
                        order.push(Backend::Base(f));
                    }
                }
                if round % 2 == 0 {
                    order.reverse();
                }
                for be in order {
                    match b.run(round, d, pairs, be) {
                        Ok(r) => runs.push(r),
                        Err(e) => {
                            err = Some(e);
                            break 'all;
                        }
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&sockdir);
    let o = &b.o;
    let (md, rows) = summary(&runs, o);
    let meta = json!({
        "started_utc": stamp,
        "duration_s": o.duration,
        "warmup_s": o.warmup,
        "rounds": o.rounds,
        "pairs": o.pairs,
        "frame_bytes": 64,
        "backend_cpus": o.back_cpus,
        "frontend_cpus": o.front_cpus,
        "cpus_online": measure::allowed_cpus().len(),
        "cpu_model": read_first_line("/proc/cpuinfo", "model name"),
        "kernel": command_out(Command::new("uname").arg("-r")),
        "load_average_start": load_start,
        "load_average_end": loadavg(),
        "nice": command_out(Command::new("sh").args(["-c", "ps -o ni= -p $PPID"])),
        "testpmd": o.testpmd,
        "dpdk_version": runs.first().map(|r| r.dpdk_version.clone()),
        "vnic": o.vnic,
        "vnic_version": command_out(Command::new(&o.vnic).arg("--version")),
        "baseline": o.baseline,
        "count_instructions": o.count,
        "directions": o.dirs.iter().map(|d| d.name()).collect::<Vec<_>>(),
        "frontend": "dpdk-testpmd --vdev net_virtio_user0,queues=N,queue_size=1024,in_order=0,mrg_rxbuf=1 --total-num-mbufs=8192 --forward-mode=txonly|rxonly",
        "tx_filters_note": "TX runs vnic with 0 filters only: the filter table is looked up on the device -> guest path alone",
        "interrupted_or_failed": err.as_ref().map(ToString::to_string),
        "crowded_cpus_note": crowded,
    });
    let out = json!({"meta": meta, "summary": rows, "runs": runs.iter().map(Run::to_json).collect::<Vec<_>>()});
    let json_path = dir.join("bench-dpdk.json");
    match std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&out).unwrap_or_default(),
    ) {
        Ok(()) => log(&format!("raw figures: {}", json_path.display())),
        Err(e) => log(&format!("writing {}: {e}", json_path.display())),
    }
    if !runs.is_empty() {
        println!(
            "vnic vs DPDK vhost PMD, frontend dpdk-testpmd net_virtio_user ({}), 64 B frames, {} round(s) of {} s per case, backend on CPU(s) {}, frontend on CPU(s) {}, load average {} -> {}\n",
            runs[0].dpdk_version,
            o.rounds,
            o.duration,
            fmt_cpus(&o.back_cpus),
            fmt_cpus(&o.front_cpus),
            out["meta"]["load_average_start"].as_str().unwrap_or(""),
            out["meta"]["load_average_end"].as_str().unwrap_or(""),
        );
        print!("{md}");
        println!(
            "\nTX (guest -> device) runs vnic with 0 filters only: the filter table is looked up on the device -> guest path alone. \
             Medians over rounds; \"per round\" lists each round's vnic/DPDK. Backend CPU: user + system of the whole backend process in the window \
             (DPDK's forwarding lcores poll, so they use their CPUs whether or not packets flow)."
        );
        if let Some(n) = &crowded {
            println!("\nWarning: {n}.");
        }
    }
    if let Some(e) = err {
        if STOP.load(Ordering::SeqCst) {
            eprintln!("vnic-bench-dpdk: interrupted; processes stopped");
            std::process::exit(130);
        }
        eprintln!("vnic-bench-dpdk: error: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `line` split at white space.
    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("vnic-bench-dpdk").chain(line.split_whitespace()))
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!((c.duration, c.rounds, c.quick), (None, None, false));
        assert_eq!(c.pairs, [1, 2]);
        assert!((c.warmup - 2.0).abs() < f64::EPSILON);
        assert_eq!(
            (c.testpmd, c.dpdk_libs, c.vnic, c.baseline),
            (None, None, None, None)
        );
        assert_eq!(
            (c.only, c.frontend_cpus, c.backend_cpus),
            (None, None, None)
        );
        assert_eq!(c.out, PathBuf::from("target/bench-dpdk"));
    }

    #[test]
    fn scripts_bench_dpdk_command_lines() {
        // What scripts/bench-dpdk execs: its fixed part, then what it passes on
        // (vnic/BENCH.md's examples).
        let fixed =
            "--testpmd /c/root/usr/bin/dpdk-testpmd --dpdk-libs /c/root/usr/lib/x86_64-linux-gnu \
                     --vnic /t/release/vnic --out /t/bench-dpdk";
        let c = parse(fixed).unwrap();
        assert_eq!(c.testpmd, Some("/c/root/usr/bin/dpdk-testpmd".into()));
        assert_eq!(c.dpdk_libs, Some("/c/root/usr/lib/x86_64-linux-gnu".into()));
        assert_eq!(c.vnic, Some("/t/release/vnic".into()));
        assert_eq!(c.out, PathBuf::from("/t/bench-dpdk"));
        assert!(parse(&format!("{fixed} --quick")).unwrap().quick);
        let c = parse(&format!("{fixed} --duration 3 --rounds 1 --pairs 1")).unwrap();
        assert_eq!(
            (c.duration, c.rounds, c.pairs),
            (Some(3.0), Some(1), vec![1])
        );
        let c = parse(&format!(
            "{fixed} --baseline /old/vnic --pairs 1 --duration 10 --rounds 2"
        ))
        .unwrap();
        assert_eq!(c.baseline, Some("/old/vnic".into()));
        assert_eq!(
            (c.duration, c.rounds, c.pairs),
            (Some(10.0), Some(2), vec![1])
        );
        let c = parse(&format!("{fixed} --only rx --pairs 1")).unwrap();
        assert_eq!((c.only, c.pairs), (Some(Dir::Rx), vec![1]));
        let c = parse(&format!(
            "{fixed} --warmup 0 --frontend-cpus 2-3 --backend-cpus 0,1 --only TX --pairs 2,1,16"
        ))
        .unwrap();
        assert!(c.warmup.abs() < f64::EPSILON);
        assert_eq!(
            (c.frontend_cpus, c.backend_cpus),
            (Some(vec![2, 3]), Some(vec![0, 1]))
        );
        assert_eq!((c.only, c.pairs), (Some(Dir::Tx), vec![2, 1, 16]));
        // a repeated option takes its last value, as before
        assert_eq!(parse("--pairs 1,2 --pairs 2").unwrap().pairs, [2]);
    }

    #[test]
    fn count_instructions_is_a_flag() {
        assert!(!parse("").unwrap().count_instructions);
        assert!(
            parse("--count-instructions --only rx")
                .unwrap()
                .count_instructions
        );
        assert!(parse("--count-instructions=1").is_err());
    }

    #[test]
    fn a_callgrind_dump_gives_its_totals() {
        let dump = "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: 4042\ncmd:  vnic serve\npart: 1\n\
                    desc: I1 cache: \npositions: line\nevents: Ir\nsummary: 4745290710\n\nfl=(1) a.rs\nfn=(1) f\n3 12\n\ntotals: 4745290710\n";
        assert_eq!(parse_callgrind_total(dump), Some(4_745_290_710));
        assert_eq!(parse_callgrind_total("summary: 5\n"), None);
        assert_eq!(parse_callgrind_total("totals: x\n"), None);
    }

    #[test]
    fn bad_values_are_refused() {
        for (bad, msg) in [
            (
                "--duration 0",
                "--duration needs a positive number of seconds",
            ),
            (
                "--duration -3",
                "--duration needs a positive number of seconds",
            ),
            ("--rounds 0", "--rounds needs a positive integer"),
            ("--pairs 1,17", "a comma-separated list of 1..=16"),
            ("--pairs 0", "a comma-separated list of 1..=16"),
            ("--warmup -1", "--warmup needs a number of seconds"),
            ("--only both", "--only \"both\": tx or rx"),
            ("--frontend-cpus 3-1", "bad CPU list \"3-1\""),
            ("--backend-cpus ,", "empty CPU list"),
            ("--out", "a value is required"),
            ("--baseline-cpus 1", "unexpected argument"),
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            assert!(e.to_string().contains(msg), "{bad:?}: {e}");
        }
    }

    /// A run of `backend` whose probes read `before` / `after` ns and that
    /// moved `mpps` million packets in 1 s on 1 backend CPU-s.
    fn probed(backend: Backend, mpps: f64, before: f64, after: f64) -> Run {
        Run {
            round: 1,
            dir: Dir::Rx,
            pairs: 1,
            backend,
            packets: (mpps * 1e6) as u64,
            secs: 1.0,
            backend_cpu: 1.0,
            frontend_cpu: 0.0,
            backend_packets: 0,
            rx_filter: None,
            rx_rss: None,
            gen_sent: None,
            rx_no_buffers: None,
            rx_spins: None,
            rx_plain: None,
            frontend_exit: None,
            frontend_cycles: None,
            backend_cycles: None,
            dpdk_version: String::new(),
            instructions: None,
            count_edge: None,
            rtt: (before, after),
            slices: vec![mpps; 4],
        }
    }

    /// Slices are the rates between consecutive reads; a run is steady
    /// when its slowest slice ran at least STEADY of its fastest.
    #[test]
    fn slices_are_rates_between_reads_and_a_jump_is_not_steady() {
        let t = Instant::now();
        let ms = |n: u64| t + Duration::from_millis(n);
        let marks = [
            (t, 0),
            (ms(250), 5_000_000),
            (ms(500), 7_500_000),
            (ms(600), 8_500_000),
        ];
        let r = slice_rates(&marks);
        assert_eq!(r.len(), 3);
        for (got, want) in r.iter().zip([20.0, 10.0, 10.0]) {
            assert!((got - want).abs() < 1e-9, "{r:?}");
        }
        let mut run = probed(Backend::Dpdk, 20.0, 65.0, 65.0);
        assert!(run.steady());
        run.slices = r;
        assert!(!run.steady());
        run.slices = vec![20.0, 16.1, 19.0];
        assert!(run.steady());
        run.slices = vec![20.0, 15.9, 19.0];
        assert!(!run.steady());
        run.slices.clear();
        assert!(!run.steady(), "no slices: not known to be steady");
    }

    /// The reference is the first quartile, so a rare short reading does
    /// not make every run far; a run is near only when both probes are,
    /// and a probe far under the reference is not near either.
    #[test]
    fn near_runs_are_judged_against_the_first_quartile() {
        let run = |before: f64, after: f64| probed(Backend::Dpdk, 0.0, before, after);
        let runs = [
            run(29.0, 66.0),
            run(65.0, 320.0),
            run(67.0, 68.0),
            run(330.0, 64.0),
            run(70.0, f64::NAN),
        ];
        let r = reference_round_trip(&runs);
        assert!((64.0..=67.0).contains(&r), "{r}");
        let judged: Vec<bool> = runs.iter().map(|x| near(x, r)).collect();
        assert_eq!(judged, [false, false, true, false, false]);
        assert!(near(&run(0.6 * r, 2.0 * r), r));
        assert!(!near(&run(0.59 * r, r), r));
        assert!(!near(&run(r, 2.01 * r), r));
        assert!(reference_round_trip(&[run(f64::NAN, f64::NAN)]).is_nan());
    }

    /// The near table divides the near runs' medians, and prints `-` (not
    /// a ratio) when one side has no near run.
    #[test]
    fn the_near_table_leaves_out_far_runs_and_says_when_none_is_left() {
        let vnic = Backend::Vnic(Filters::None);
        // Near at both ends, but the rate halved in the window.
        let mut jumped = probed(vnic, 5.0, 64.0, 65.0);
        jumped.slices = vec![6.0, 6.0, 3.0, 5.9];
        let row = |dpdk: Vec<Run>| Row {
            dir: Dir::Rx,
            pairs: 1,
            filters: Filters::None,
            dpdk,
            vnic: vec![
                probed(vnic, 12.0, 65.0, 66.0),
                probed(vnic, 3.0, 320.0, 66.0),
                jumped.clone(),
            ],
            base: Vec::new(),
        };
        let with = [
            probed(Backend::Dpdk, 8.0, 64.0, 67.0),
            probed(Backend::Dpdk, 1.0, 66.0, 330.0),
        ];
        let without = [probed(Backend::Dpdk, 8.0, 310.0, 320.0)];
        let runs: Vec<Run> = with
            .iter()
            .chain(&without)
            .cloned()
            .chain(row(Vec::new()).vnic)
            .collect();
        let rows = [row(with.to_vec()), row(without.to_vec())];
        let mut js = vec![json!({}), json!({})];
        let md = near_table(&rows, &runs, &mut js);
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| RX")).collect();
        assert_eq!(lines.len(), 2, "{md}");
        assert!(
            lines[0].contains("| 1 / 1 | 8.000 -> 12.000 | 1.50x |"),
            "{md}"
        );
        assert!(lines[1].contains("| 0 / 1 | - -> 12.000 | - |"), "{md}");
        assert!(md.contains("3 of 6 runs read over 2x"), "{md}");
        assert!(md.contains("1 were not steady"), "{md}");
    }
}
