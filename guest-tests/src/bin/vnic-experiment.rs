//! vnic-experiment: the issue-6 experiments on real kernels under QEMU on a
//! real `vnic serve` (guest-tests/docs/experiments.md).
//!
//! `collisions` reproduces the 2025 rps_dev_flow slot-collision measurement
//! (Steer-C / Add / Del per rps_flow_cnt, old vs new kernel code); `rps`
//! shows plain RPS on one queue (per-CPU softirqs and softnet_stat).

use clap::{ArgAction, CommandFactory, Parser};
use guest_tests::harness::build::{self, Kernel};
use guest_tests::harness::{self, parse_num as num, repo_root, timestamp};
use guest_tests::report::ReportError;
use guest_tests::scenarios::experiments::{
    self, CollisionPoint, CollisionWorkload, RpsPhase, Variant,
};
use guest_tests::scenarios::shard::{
    self, KernelId, MergeError, PartialError, PointKey, Run, Shard, SweepDef,
};
use guest_tests::scenarios::{BootKind, Session, Settings, Tools};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use vnic_trace::plot::{self, DrawError, Line, Panel};
use vnic_trace::summary::units;

const ABOUT: &str = "vnic-experiment: the vnic experiments (real kernels, real QEMU, real vnic)";

const USAGE: &str = "\
vnic-experiment collisions [OPTIONS]   rps_dev_flow slot collisions: Steer-C / Add / Del
                                              per rps_flow_cnt, old (6.12) vs new (7.3) kernel code
       vnic-experiment collisions --check     the short acceptance run (rps_flow_cnt 256 only)
       vnic-experiment collisions --shard I/N [OPTIONS]   every N-th point of the sweep, a partial result
       vnic-experiment collisions --merge DIR... [--out DIR] [--report DIR]   the shards as one run
       vnic-experiment rps [OPTIONS]          plain RPS on one queue: per-CPU NET_RX softirqs and
                                              softnet_stat for many sources vs one heavy flow
       vnic-experiment rps --check            the same, 10 s per phase (the test suite's run)";

const AFTER_HELP: &str = "\
RPS:
    Phases per kernel: RPS off with the balanced traffic, RPS on balanced, RPS on one flow.
    Asserted (check: lines, exit 1 when one fails): RPS off puts >= 95% of the processing
    (softnet_stat column 0) on the interrupt CPU and sends no RPS IPI; with RPS on each CPU
    processes what the flows' hashes (vnic_flowhash.ko) and the rps_map predict, within 1% + 50
    packets, with RPS IPIs; RPS on puts one flow >= 95% on one CPU. Drops (column 1) are
    reported per CPU.

Progress goes to stderr, tables to stdout. Guests run under KVM when a probe boot shows it works, else TCG (VNIC_ACCEL=tcg|kvm forces):
counts per second are a few thousand packets, far below a real NIC (guest-tests/docs/experiments.md).

ENVIRONMENT:
    VNIC_BIN     vnic binary (default: built with cargo --release)
    VNIC_AGENT   static guest agent (default: built into target/agent)
    VNIC_QEMU    qemu-system-x86_64 to use;  VNIC_ACCEL=tcg|kvm (default auto: KVM if its probe boot works)";

const KERNELS: &str = "Kernels (both commands)";
const BOTH: &str = "Options of both commands";
const COLLISIONS: &str = "Collisions options";
const RPS: &str = "Rps options";

/// The variants of `--variant`, as one value.
type Variants = Vec<Variant>;

// The command line: the command first, then its options (one list for both
// commands: `settle` refuses those of the other command, as it checks what
// takes more than one option). A repeated option takes its last value.
#[derive(Parser, Debug)]
#[command(
    name = "vnic-experiment",
    about = ABOUT,
    override_usage = USAGE,
    after_help = AFTER_HELP,
    args_override_self = true
)]
struct Cli {
    /// collisions or rps
    #[arg(value_name = "COMMAND", value_parser = command)]
    cmd: Option<Cmd>,

    /// Kernel series, comma-separated, each booted once (collisions
    /// default 6.12,7.3; rps default 7.3). Built into the cache by
    /// images/build-kernel when missing.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          help_heading = KERNELS, verbatim_doc_comment)]
    kernel: Option<Vec<String>>,
    /// Also run your own kernel (with --kdir TREE: its built source
    /// tree; the guest module is built against it). Alone it replaces
    /// the default list; with --kernel it runs after the listed series.
    #[arg(long, value_name = "BZIMAGE", help_heading = KERNELS, verbatim_doc_comment)]
    kernel_image: Option<PathBuf>,
    /// With --kernel-image: its built source tree
    #[arg(long, value_name = "TREE", help_heading = KERNELS)]
    kdir: Option<PathBuf>,

    /// collisions: workload time per point (default 60; --check: 40);
    /// rps: time per phase (default 20; --check: 10)
    #[arg(long, value_name = "SECS", value_parser = |v: &str| num(v, "--duration", 1, 3600),
          help_heading = BOTH, verbatim_doc_comment)]
    duration: Option<u64>,
    /// Generator packets per second over all flows (collisions default
    /// 2000; rps default 20000)
    #[arg(long, value_name = "PPS",
          value_parser = |v: &str| num(v, "--rate", 1, 1_000_000).map(|n| n as u32),
          help_heading = BOTH, verbatim_doc_comment)]
    rate: Option<u32>,
    /// collisions: acceptance: at rps_flow_cnt 256 the old kernel
    /// (first) programs at least 10x the filters of the new one
    /// (second), the new one at most 1.5x the number of flows, and on
    /// the new one >= 90% of the flows needing a filter that kept their
    /// RFS slot hold their queue at the end (a live filter to their
    /// receiver's queue in the device table, and >= 95% of their
    /// packets of the last 10 s there, guest-side; the old kernel's
    /// figure is printed beside it); exits 1 with the reason otherwise.
    /// rps: the test suite's run: 10 s phases; exits 1 when an
    /// assertion fails (as without it)
    #[arg(long, help_heading = BOTH, verbatim_doc_comment)]
    check: bool,
    /// Results: tables.md / points.json / plot.svg (collisions),
    /// rps.md / rps.json (rps). Default
    /// target/experiments/<command>-<UTC time>
    #[arg(long, value_name = "DIR", help_heading = BOTH, verbatim_doc_comment)]
    out: Option<PathBuf>,
    /// Guest logs, traces, snapshots (default <out>/artifacts)
    #[arg(long, value_name = "DIR", help_heading = BOTH)]
    artifacts: Option<PathBuf>,

    /// rps_flow_cnt values per rx queue, comma-separated (default
    /// 256,512,1024,2048,4096,8192,16384,32768)
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = |v: &str| num(v.trim(), "--flow-cnt", 1, 1 << 24).map(|n| n as u32),
          help_heading = COLLISIONS, verbatim_doc_comment)]
    flow_cnt: Option<Vec<u32>>,
    /// one (flows live the whole point), five (flows replaced every
    /// duration/iterations), fast (one iteration at --fast-rate with
    /// the device programming filters --fast-program-latency after
    /// each ADD: the regime where the old kernel calls
    /// ndo_rx_flow_steer many times per filter), both (= one,five) or
    /// all (default all; --check: one); comma-separated
    #[arg(long, value_name = "LIST", value_parser = variants, help_heading = COLLISIONS,
          verbatim_doc_comment)]
    variant: Option<Variants>,
    /// Iterations of the `five` variant (default 5)
    #[arg(long, value_name = "N",
          value_parser = |v: &str| num(v, "--iterations", 2, 20).map(|n| n as u32),
          help_heading = COLLISIONS)]
    iterations: Option<u32>,
    /// The `fast` variant's packets per second over all flows
    /// (default 24000)
    #[arg(long, value_name = "PPS",
          value_parser = |v: &str| num(v, "--fast-rate", 1, 1_000_000).map(|n| n as u32),
          help_heading = COLLISIONS, verbatim_doc_comment)]
    fast_rate: Option<u32>,
    /// The device's programming latency in the `fast` variant
    /// (default 100)
    #[arg(long, value_name = "MS",
          value_parser = |v: &str| num(v, "--fast-program-latency", 0, 10_000).map(|n| n as u32),
          help_heading = COLLISIONS, verbatim_doc_comment)]
    fast_program_latency: Option<u32>,
    /// Flows per iteration (default 332 = 83 per queue with 4 queues,
    /// the original's 12K flows over 144 queues)
    #[arg(long, value_name = "N",
          value_parser = |v: &str| num(v, "--flows", 1, 8000).map(|n| n as usize),
          help_heading = COLLISIONS, verbatim_doc_comment)]
    flows: Option<usize>,
    /// Queue pairs = vCPUs (default 4)
    #[arg(long, value_name = "N",
          value_parser = |v: &str| num(v, "--queues", 1, 16).map(|n| n as u16),
          help_heading = COLLISIONS)]
    queues: Option<u16>,
    /// The device's programming latency in the `one` and `five`
    /// variants (default 0: a filter takes effect when its ADD arrives)
    #[arg(long, value_name = "MS",
          value_parser = |v: &str| num(v, "--program-latency", 0, 10_000).map(|n| n as u32),
          help_heading = COLLISIONS, verbatim_doc_comment)]
    program_latency: Option<u32>,
    /// No request/response: the guest does not echo, no Latency column
    /// (default: the device stamps every datagram, the guest's
    /// receivers echo them, the device times the round trip; `fast`
    /// echoes a sample of the same rate as the others)
    #[arg(long, help_heading = COLLISIONS, verbatim_doc_comment)]
    no_latency: bool,
    /// Also write a reader's page into DIR: report.md with our points
    /// beside the 2025 patch's published numbers at the same
    /// rps_flow_cnt, and latency.svg / add.svg / del.svg / steer-c.svg /
    /// steer-l.svg (ours solid, the patch dashed). Needs two kernels
    /// (original code first). With --render: the page of that earlier
    /// run.
    #[arg(long, value_name = "DIR", help_heading = COLLISIONS, verbatim_doc_comment)]
    report: Option<PathBuf>,
    /// No guest: print the tables of an earlier run again and rewrite
    /// its tables.md / plot.svg next to it (counts from the device
    /// counters)
    #[arg(long, value_name = "POINTS.json", help_heading = COLLISIONS, verbatim_doc_comment)]
    render: Option<PathBuf>,
    /// Run shard I of N only: the points of the sweep (kernels, then
    /// rps_flow_cnt, then variants, the order of a whole run) whose
    /// index k has k % N = I-1, each kernel booted once if it has one.
    /// Writes a partial result: points.json marked as shard I/N with
    /// the sweep's settings and kernels (release, .config hash), no
    /// tables.md, plot.svg or report. Run all N with the same options
    /// (--out aside), then --merge their directories
    #[arg(long, value_name = "I/N", value_parser = |v: &str| Shard::parse(v),
          help_heading = COLLISIONS, verbatim_doc_comment)]
    shard: Option<Shard>,
    /// No guest: combine the partial results of --shard 1/N ... N/N
    /// (directories, or their points.json) into the points.json,
    /// tables.md and plot.svg (and --report) a single run would have
    /// written. Refused when they disagree on settings, kernels or N,
    /// when a shard is missing, given twice or unfinished, or when
    /// points overlap. Takes --out and --report only
    #[arg(long, value_name = "DIR", num_args = 1.., action = ArgAction::Append,
          help_heading = COLLISIONS, verbatim_doc_comment)]
    merge: Option<Vec<PathBuf>>,

    /// Guest vCPUs, all in rx-0's rps_cpus (default 4)
    #[arg(long, value_name = "N",
          value_parser = |v: &str| num(v, "--cpus", 1, 16).map(|n| n as u16),
          help_heading = RPS)]
    cpus: Option<u16>,
    /// Source addresses of the balanced phase (default 40)
    #[arg(long, value_name = "N",
          value_parser = |v: &str| num(v, "--sources", 2, 150).map(|n| n as u32),
          help_heading = RPS)]
    sources: Option<u32>,
}

fn command(v: &str) -> Result<Cmd, String> {
    match v {
        "collisions" => Ok(Cmd::Collisions),
        "rps" => Ok(Cmd::Rps),
        other => Err(format!("unknown command {other:?} (collisions or rps)")),
    }
}

/// `--variant`: `all`, or a list of one, five, fast and both.
fn variants(list: &str) -> Result<Variants, String> {
    if list == "all" {
        return Ok(vec![Variant::One, Variant::Five, Variant::Fast]);
    }
    let mut v = Vec::new();
    for name in list.split(',') {
        match name {
            "one" => v.push(Variant::One),
            "five" => v.push(Variant::Five),
            "fast" => v.push(Variant::Fast),
            "both" => v.extend([Variant::One, Variant::Five]),
            _ => {
                return Err(format!(
                    "--variant {name:?}: one, five, fast, both (one,five) or all"
                ))
            }
        }
    }
    v.dedup();
    Ok(v)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cmd {
    Collisions,
    Rps,
}

/// A command line clap accepts that asks for something the experiments
/// do not do ([`settle`]'s checks across options); exit status 2.
#[derive(Debug, thiserror::Error)]
enum UsageError {
    #[error("unknown command {0:?} (collisions or rps)")]
    UnknownCommand(String),
    #[error("{0} belongs to `collisions` (see --help)")]
    CollisionsOnly(&'static str),
    /// `instead`: what `collisions` has in its place, if anything.
    #[error(
        "{option} belongs to `rps`{}",
        .instead.map_or(String::new(), |i| format!(" (collisions: {i})"))
    )]
    RpsOnly {
        option: &'static str,
        instead: Option<&'static str>,
    },
    #[error("--shard runs part of a sweep: no {0}")]
    NotWithShard(&'static str),
    #[error("--shard writes a partial result only: give --report to --merge")]
    ReportWithShard,
    #[error(
        "--merge takes the settings from the partial results: no {0} (only --out and --report)"
    )]
    NotWithMerge(&'static str),
    #[error("--kernel-image and --kdir go together")]
    ImageWithoutTree,
    #[error("--kernel {0:?}: expected a series like 6.12 or 7.3")]
    BadSeries(String),
    #[error("--check runs the one-iteration variant only (no --variant)")]
    CheckWithVariant,
    #[error("--check compares exactly two kernels: old code first, new code second")]
    CheckKernels,
    #[error(
        "{flows} flows x {iterations} iterations do not fit in the guest port range 20000..65535"
    )]
    PortRange { flows: usize, iterations: u32 },
}

/// Why an experiment (or `--merge`, `--render`) failed; exit status 1.
#[derive(Debug, thiserror::Error)]
enum ExperimentError {
    #[error("no kernel selected")]
    NoKernel,
    #[error("kernel {label} unavailable: {source}")]
    KernelUnavailable {
        label: String,
        #[source]
        source: harness::Error,
    },
    #[error(
        "kernel {label}: the build gave label {built} (the sweep's point list would not match)"
    )]
    KernelLabel { label: String, built: String },
    #[error("{label}: boot: {source}")]
    Boot {
        label: String,
        #[source]
        source: harness::Error,
    },
    /// A phase of the `rps` experiment on kernel `label` failed.
    #[error("{label} {phase}: {source}")]
    RpsPhase {
        label: String,
        phase: String,
        #[source]
        source: harness::Error,
    },
    /// The harness failed (building the tools or a kernel, a guest request).
    #[error(transparent)]
    Harness(#[from] harness::Error),
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{}: {source}", .path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The file's `points` are not collision points.
    #[error("{}: points: {source}", .path.display())]
    Points {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot encode JSON: {0}")]
    Encode(#[source] serde_json::Error),
    #[error(
        "{}: a partial result (shard {shard}): --merge all the shards' directories, which writes the tables",
        .path.display()
    )]
    RenderPartial { path: PathBuf, shard: String },
    #[error(
        "--out {} holds the partial result {}: the merge would overwrite it (choose another --out)",
        .out.display(),
        .file.display()
    )]
    MergeOverwrites { out: PathBuf, file: PathBuf },
    #[error(transparent)]
    Partial(#[from] PartialError),
    #[error(transparent)]
    Merge(#[from] MergeError),
    #[error(transparent)]
    Plot(#[from] DrawError),
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The acceptance check's verdict: what did not hold.
    #[error("acceptance check failed: {}", .0.join("; "))]
    CheckFailed(Vec<String>),
    /// The run ended, with these problems.
    #[error("{} problem(s):\n  {}", .0.len(), .0.join("\n  "))]
    Problems(Vec<String>),
}

type Result<T, E = ExperimentError> = std::result::Result<T, E>;

struct Args {
    cmd: Cmd,
    kernels: Vec<String>,
    kernels_given: bool,
    custom: Option<(PathBuf, PathBuf)>,
    flow_cnts: Vec<u32>,
    duration: Option<u64>,
    variants: Vec<Variant>,
    iterations: u32,
    fast_rate: u32,
    fast_latency_ms: u32,
    flows: usize,
    queues: u16,
    cpus: u16,
    rate: Option<u32>,
    sources: u32,
    check: bool,
    out: Option<PathBuf>,
    artifacts: Option<PathBuf>,
    /// Re-render tables and plot from a points.json.
    render: Option<PathBuf>,
    /// Run one shard of the sweep (a partial result).
    shard: Option<Shard>,
    /// Combine these shards' partial results instead of running.
    merge: Option<Vec<PathBuf>>,
    report: Option<PathBuf>,
    latency: bool,
    program_latency_ms: u32,
    /// The arguments after the command, for the record.
    argv: Vec<String>,
}

/// The run `cli` asks for, with the checks that take more than one option;
/// `argv`: the arguments (after the program's name) it was parsed from.
fn settle(cli: Cli, argv: &[String]) -> Result<Args, UsageError> {
    // The command comes first, as the usage says (argv[1..] is the record
    // of its options).
    let cmd = match (cli.cmd, argv.first()) {
        (Some(cmd), Some(first)) if command(first) == Ok(cmd) => cmd,
        (_, first) => {
            return Err(UsageError::UnknownCommand(
                first.cloned().unwrap_or_default(),
            ))
        }
    };
    let coll = |name: &'static str, given: bool| {
        if given && cmd != Cmd::Collisions {
            Err(UsageError::CollisionsOnly(name))
        } else {
            Ok(())
        }
    };
    coll("--flow-cnt", cli.flow_cnt.is_some())?;
    coll("--variant", cli.variant.is_some())?;
    coll("--fast-rate", cli.fast_rate.is_some())?;
    coll("--fast-program-latency", cli.fast_program_latency.is_some())?;
    coll("--iterations", cli.iterations.is_some())?;
    coll("--flows", cli.flows.is_some())?;
    coll("--queues", cli.queues.is_some())?;
    coll("--program-latency", cli.program_latency.is_some())?;
    coll("--no-latency", cli.no_latency)?;
    coll("--render", cli.render.is_some())?;
    coll("--report", cli.report.is_some())?;
    coll("--shard", cli.shard.is_some())?;
    coll("--merge", cli.merge.is_some())?;
    if cli.shard.is_some() {
        for (name, given) in [
            ("--check", cli.check),
            ("--render", cli.render.is_some()),
            ("--merge", cli.merge.is_some()),
        ] {
            if given {
                return Err(UsageError::NotWithShard(name));
            }
        }
        if cli.report.is_some() {
            return Err(UsageError::ReportWithShard);
        }
    }
    if cli.merge.is_some() {
        // The settings come from the partial results.
        for (name, given) in [
            ("--check", cli.check),
            ("--render", cli.render.is_some()),
            ("--kernel", cli.kernel.is_some()),
            ("--kernel-image", cli.kernel_image.is_some()),
            ("--kdir", cli.kdir.is_some()),
            ("--duration", cli.duration.is_some()),
            ("--rate", cli.rate.is_some()),
            ("--artifacts", cli.artifacts.is_some()),
            ("--flow-cnt", cli.flow_cnt.is_some()),
            ("--variant", cli.variant.is_some()),
            ("--iterations", cli.iterations.is_some()),
            ("--fast-rate", cli.fast_rate.is_some()),
            ("--fast-program-latency", cli.fast_program_latency.is_some()),
            ("--flows", cli.flows.is_some()),
            ("--queues", cli.queues.is_some()),
            ("--program-latency", cli.program_latency.is_some()),
            ("--no-latency", cli.no_latency),
        ] {
            if given {
                return Err(UsageError::NotWithMerge(name));
            }
        }
    }
    if cmd != Cmd::Rps {
        if cli.cpus.is_some() {
            return Err(UsageError::RpsOnly {
                option: "--cpus",
                instead: Some("--queues"),
            });
        }
        if cli.sources.is_some() {
            return Err(UsageError::RpsOnly {
                option: "--sources",
                instead: None,
            });
        }
    }
    let kernels_given = cli.kernel.is_some();
    let mut a = Args {
        cmd,
        kernels: match cli.kernel {
            Some(list) => list.into_iter().filter(|s| !s.is_empty()).collect(),
            None if cmd == Cmd::Rps => vec!["7.3".into()],
            None => vec!["6.12".into(), "7.3".into()],
        },
        kernels_given,
        custom: None,
        flow_cnts: cli
            .flow_cnt
            .unwrap_or_else(|| vec![256, 512, 1024, 2048, 4096, 8192, 16384, 32768]),
        duration: cli.duration,
        variants: Vec::new(),
        iterations: cli.iterations.unwrap_or(5),
        fast_rate: cli.fast_rate.unwrap_or(FAST_RATE),
        fast_latency_ms: cli.fast_program_latency.unwrap_or(FAST_PROGRAM_LATENCY_MS),
        flows: cli.flows.unwrap_or(332),
        queues: cli.queues.unwrap_or(4),
        cpus: cli.cpus.unwrap_or(4),
        rate: cli.rate,
        sources: cli.sources.unwrap_or(40),
        check: cli.check,
        out: cli.out,
        artifacts: cli.artifacts,
        render: cli.render,
        shard: cli.shard,
        merge: cli.merge,
        report: cli.report,
        latency: !cli.no_latency,
        program_latency_ms: cli.program_latency.unwrap_or(0),
        argv: argv[1..].to_vec(),
    };
    let (image, kdir) = (cli.kernel_image, cli.kdir);
    let variant = cli.variant;
    match (image, kdir) {
        (Some(i), Some(k)) => {
            a.custom = Some((i, k));
            if !a.kernels_given {
                a.kernels.clear();
            }
        }
        (None, None) => {}
        _ => return Err(UsageError::ImageWithoutTree),
    }
    for k in &a.kernels {
        if !k
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        {
            return Err(UsageError::BadSeries(k.clone()));
        }
    }
    if a.check && cmd == Cmd::Collisions {
        // The acceptance figure is defined at rps_flow_cnt 256.
        a.flow_cnts = vec![256];
        if variant.is_some() {
            return Err(UsageError::CheckWithVariant);
        }
        if a.kernels.len() + usize::from(a.custom.is_some()) != 2 {
            return Err(UsageError::CheckKernels);
        }
    }
    a.variants = match variant {
        None if a.check => vec![Variant::One],
        None => vec![Variant::One, Variant::Five, Variant::Fast],
        Some(v) => v,
    };
    let max_iters = if a.variants.contains(&Variant::Five) {
        a.iterations
    } else {
        1
    };
    if a.cmd == Cmd::Collisions && 20000 + a.flows * max_iters as usize > 65535 {
        return Err(UsageError::PortRange {
            flows: a.flows,
            iterations: a.iterations,
        });
    }
    Ok(a)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        // No command: the help, as with --help.
        let _ = Cli::command().print_help();
        return ExitCode::SUCCESS;
    }
    let cli =
        Cli::parse_from(std::iter::once("vnic-experiment".to_string()).chain(argv.iter().cloned()));
    let args = match settle(cli, &argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &args.render {
        return match render_again(path, args.report.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let name = match args.cmd {
        Cmd::Collisions if args.check => "collisions-check".to_string(),
        Cmd::Collisions if args.merge.is_some() => "collisions-merged".to_string(),
        Cmd::Collisions => match args.shard {
            Some(s) => format!("collisions-shard{}of{}", s.index, s.count),
            None => "collisions".to_string(),
        },
        Cmd::Rps if args.check => "rps-check".to_string(),
        Cmd::Rps => "rps".to_string(),
    };
    let out = args.out.clone().unwrap_or_else(|| {
        repo_root()
            .join("target/experiments")
            .join(format!("{name}-{}", timestamp()))
    });
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("error: cannot create {}: {e}", out.display());
        return ExitCode::from(2);
    }
    if let Some(dirs) = &args.merge {
        return match merge(&args, dirs, &out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("[experiment] merge FAILED: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // Absolute paths: the module is built with `make M=<artifacts>/...`,
    // which kbuild resolves from the kernel tree.
    let out = std::fs::canonicalize(&out).unwrap_or(out);
    let art = args
        .artifacts
        .clone()
        .unwrap_or_else(|| out.join("artifacts"));
    if let Err(e) = std::fs::create_dir_all(&art) {
        eprintln!("error: cannot create {}: {e}", art.display());
        return ExitCode::from(2);
    }
    let art = std::fs::canonicalize(&art).unwrap_or(art);
    eprintln!(
        "[experiment] results in {}, guest artifacts in {}",
        out.display(),
        art.display()
    );
    let r = match args.cmd {
        Cmd::Collisions => collisions(&args, &out, &art),
        Cmd::Rps => rps(&args, &out, &art),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("[experiment] FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The kernels to boot, in order.
fn kernels(args: &Args) -> Result<Vec<Kernel>> {
    Ok(kernels_where(args, &|_| true)?
        .into_iter()
        .flatten()
        .collect())
}

/// The labels of the kernels `args` selects, in order, known before they
/// are built: the series, then `custom` for --kernel-image.
fn kernel_labels(args: &Args) -> Vec<String> {
    let mut v = args.kernels.clone();
    if args.custom.is_some() {
        v.push("custom".into());
    }
    v
}

/// The kernels of [`kernel_labels`], each built or found when `need(i)`
/// holds (`None` otherwise: a shard with no point on it).
fn kernels_where(args: &Args, need: &dyn Fn(usize) -> bool) -> Result<Vec<Option<Kernel>>> {
    let labels = kernel_labels(args);
    if labels.is_empty() {
        return Err(ExperimentError::NoKernel);
    }
    let mut out = Vec::new();
    for (i, label) in labels.iter().enumerate() {
        if !need(i) {
            out.push(None);
            continue;
        }
        let k = match &args.custom {
            Some((image, kdir)) if i == args.kernels.len() => build::kernel_custom(image, kdir)?,
            _ => build::kernel_series(label, "default").map_err(|source| {
                ExperimentError::KernelUnavailable {
                    label: label.clone(),
                    source,
                }
            })?,
        };
        if k.label != *label {
            return Err(ExperimentError::KernelLabel {
                label: label.clone(),
                built: k.label,
            });
        }
        out.push(Some(k));
    }
    Ok(out)
}

fn boot(kernel: Kernel, tools: &Tools, settings: Settings, art: &Path) -> Result<Session> {
    let label = kernel.label.clone();
    eprintln!(
        "[experiment] booting {label} ({}) with {} vCPUs / {} queue pairs",
        kernel.bzimage.display(),
        settings.cpus,
        settings.queues
    );
    let s = Session::boot_in(
        kernel,
        tools,
        settings,
        &art.join(&label),
        BootKind::Default,
        |why| eprintln!("[experiment] {label}: {why}"),
    )
    .map_err(|source| ExperimentError::Boot {
        label: label.clone(),
        source,
    })?;
    eprintln!(
        "[experiment] {label}: guest up in {:.1}s (kernel {})",
        s.guest.boot_time.as_secs_f64(),
        s.guest.info.kernel
    );
    Ok(s)
}

/// What the results were obtained on.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let n = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    // Decided (and printed) when the first guest booted.
    let accel =
        guest_tests::harness::accel::chosen().map_or("TCG or KVM (no guest booted)", |a| a.name());
    format!(
        "host: {n} CPUs ({model}), {} GiB RAM; guests under QEMU {accel}",
        mem_kb / (1 << 20)
    )
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M:%S UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| ExperimentError::Write {
        path: path.to_path_buf(),
        source,
    })
}

// ---- collisions ---------------------------------------------------------

/// The high-rate variant's packet rate over all flows (pps), and the
/// device's programming latency during it (guest-tests/docs/experiments.md: what this
/// machine's TCG guests sustain).
const FAST_RATE: u32 = 24000;
const FAST_PROGRAM_LATENCY_MS: u32 = 100;

fn variant_name(p: &CollisionPoint) -> String {
    p.variant().name(p.iterations)
}

/// "Original code" / "New code" for the two stock series, else the release.
fn code_name(label: &str, release: &str) -> String {
    match label {
        "6.12" => format!("Original code ({release}: no slot-collision fix)"),
        "7.3" => format!("New code ({release}: with the slot-collision fix)"),
        _ => format!("kernel {release}"),
    }
}

/// One table in the layout of the patch (Latency from the device's round
/// trips, Steer-L from the guest module's lookups), with what the device
/// trace adds.
fn table(title: &str, points: &[&CollisionPoint]) -> String {
    let mut s = String::new();
    let head = "| RPS | Latency | p99 | Add | Del | Steer-C | Steer-L | Replace | Reject | Thrash | Flows |";
    let width = head.len().max(title.len() + 12);
    let rule = "-".repeat(width);
    let pad = (width - title.len() - 2) / 2;
    let _ = writeln!(
        s,
        "{} {title} {}",
        "-".repeat(pad),
        "-".repeat(width - title.len() - 2 - pad)
    );
    let _ = writeln!(s, "{head}");
    let _ = writeln!(s, "{rule}");
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.rps_flow_cnt,
            p.latency
                .as_ref()
                .filter(|l| l.replies > 0)
                .map_or_else(|| "-".into(), |l| format!("{:.0}", l.mean_us)),
            p.latency
                .as_ref()
                .filter(|l| l.replies > 0)
                .map_or_else(|| "-".into(), |l| format!("{:.0}", l.p99_us)),
            units(p.adds),
            units(p.dels),
            units(p.steer_calls),
            p.steer_walked.map_or_else(|| "-".into(), units),
            units(p.replaces),
            units(p.rejects),
            p.thrashing,
            p.flows_per_iteration as u64 * u64::from(p.iterations),
        );
    }
    let _ = writeln!(s, "{rule}");
    s
}

const LEGEND: &str = "\
Latency: mean round trip in us of the workload's own datagrams: the device stamps each one,
         the guest's receiver echoes it, the device times it (p99: 99th percentile)
Steer-C: ndo_rx_flow_steer calls (the guest module's steer_calls)
Steer-L: flow-table entries those calls' lookups compared (module steer_walked; the
         analogue of the aRFS entries ice_arfs_flow_steer walks: an rhashtable here)
Add:     filters programmed in the device (device counters; the trace's add lines agree)
Del:     filters deleted, any reason (device counters; reasons in points.json)
Replace: filters moved to another queue in place (re-steer of a known flow)
Reject:  ADD ops the device refused
Thrash:  flows programmed more than twice (add + replace) during the point
Flows:   flows run (x iterations)
Units:   K = 1,000, M = 1,000,000 (below 10,000 exact)
";

fn render_tables(points: &[CollisionPoint]) -> String {
    let mut out = String::new();
    let mut variants: Vec<Variant> = points.iter().map(CollisionPoint::variant).collect();
    variants.sort_unstable();
    variants.dedup();
    let mut kernels: Vec<(String, String)> = Vec::new();
    for p in points {
        if !kernels.iter().any(|(l, _)| *l == p.kernel) {
            kernels.push((p.kernel.clone(), p.release.clone()));
        }
    }
    for v in &variants {
        for (label, release) in &kernels {
            let ps: Vec<&CollisionPoint> = points
                .iter()
                .filter(|p| p.variant() == *v && p.kernel == *label)
                .collect();
            if ps.is_empty() {
                continue;
            }
            let mut title = format!("{}, {}", variant_name(ps[0]), code_name(label, release));
            if *v == Variant::Fast {
                let _ = write!(
                    title,
                    ", {} pps, programming {} ms",
                    ps[0].rate_pps, ps[0].program_latency_ms
                );
            }
            out.push_str(&table(&title, &ps));
        }
    }
    out
}

fn render_plot(points: &[CollisionPoint], title: &str, out: &Path) -> Result<()> {
    let mut keys: Vec<(String, String, Variant)> = Vec::new();
    for p in points {
        let k = (p.kernel.clone(), p.release.clone(), p.variant());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut kernel_order: Vec<String> = Vec::new();
    for (l, _, _) in &keys {
        if !kernel_order.contains(l) {
            kernel_order.push(l.clone());
        }
    }
    let line = |f: &dyn Fn(&CollisionPoint) -> u64| -> Vec<Line> {
        keys.iter()
            .map(|(label, release, v)| Line {
                name: format!(
                    "{release}, {}",
                    points
                        .iter()
                        .find(|p| p.variant() == *v)
                        .map_or_else(String::new, |p| variant_name(p).to_lowercase())
                ),
                // Colours: one per kernel; the high-rate variant gets two more.
                color: kernel_order.iter().position(|k| k == label).unwrap_or(0)
                    + if *v == Variant::Fast { 2 } else { 0 },
                dashed: *v == Variant::Five,
                points: points
                    .iter()
                    .filter(|p| p.kernel == *label && p.variant() == *v)
                    .map(|p| (f64::from(p.rps_flow_cnt), f(p) as f64))
                    .collect(),
            })
            .collect()
    };
    let x = "rps_flow_cnt (slots per rx queue)".to_string();
    let panels = [
        Panel {
            caption: "Add: filters programmed".into(),
            x_desc: x.clone(),
            y_desc: "adds".into(),
            lines: line(&|p| p.adds),
        },
        Panel {
            caption: "Steer-C: ndo_rx_flow_steer calls".into(),
            x_desc: x,
            y_desc: "calls".into(),
            lines: line(&|p| p.steer_calls),
        },
    ];
    let svg = plot::render_panels(title, &panels, out)?;
    write(out, &svg)
}

/// The collisions settings of `args`: the guest's, the time per point and
/// the base rate.
fn collision_settings(args: &Args) -> (Settings, Duration, u32) {
    let duration = Duration::from_secs(args.duration.unwrap_or(if args.check { 40 } else { 60 }));
    let rate = args.rate.unwrap_or(2000);
    let settings = Settings {
        cpus: args.queues,
        queues: args.queues,
        flows: args.flows,
        rate,
        flow_cnt: args.flow_cnts[0],
        // Large enough that two flows rarely share a global socket-table
        // entry (332 flows in 2^20 entries): the experiment is about the
        // per-queue rps_dev_flow slots.
        sock_flow_entries: 1 << 20,
        ..Settings::default()
    };
    (settings, duration, rate)
}

/// The whole sweep's points in order, and the indices of those this run
/// measures: its shard's ([`Shard::points`]), or all.
fn sweep_points(args: &Args) -> (Vec<PointKey>, Vec<usize>) {
    let plan = shard::sweep(kernel_labels(args).len(), &args.flow_cnts, &args.variants);
    let mine = match args.shard {
        Some(s) => s.points(plan.len()),
        None => (0..plan.len()).collect(),
    };
    (plan, mine)
}

/// The record a collisions run starts with (no point yet): its command,
/// settings and sweep; `kernels`: what it knows of each kernel.
fn new_run(args: &Args, kernels: Vec<KernelId>) -> Run {
    let (settings, duration, rate) = collision_settings(args);
    Run {
        command: format!("scripts/experiment collisions {}", args.argv.join(" "))
            .trim_end()
            .to_string(),
        machine: machine(),
        started: utc_now(),
        finished: false,
        elapsed_s: 0.0,
        guest: serde_json::json!({"vcpus": args.queues, "queue_pairs": args.queues,
                  "rps_sock_flow_entries": settings.sock_flow_entries,
                  "module": {"interval_ms": settings.module.interval_ms,
                             "expire_quota": settings.module.expire_quota,
                             "expiry": "rps"}}),
        workload: serde_json::json!({"flows_per_iteration": args.flows, "rate_pps": rate,
                     "duration_s": duration.as_secs(), "variants": args.variants,
                     "iterations": args.iterations,
                     "latency": args.latency, "program_latency_ms": args.program_latency_ms,
                     "fast": {"rate_pps": args.fast_rate,
                              "program_latency_ms": args.fast_latency_ms}}),
        sweep: SweepDef {
            points: kernels.len() * args.flow_cnts.len() * args.variants.len(),
            kernels,
            flow_cnts: args.flow_cnts.clone(),
            variants: args.variants.clone(),
        },
        shard: args.shard,
        merged_from: Vec::new(),
        errors: Vec::new(),
        points: Vec::new(),
    }
}

fn collisions(args: &Args, out: &Path, art: &Path) -> Result<()> {
    let (settings, duration, rate) = collision_settings(args);
    let labels = kernel_labels(args);
    let (plan, mine) = sweep_points(args);
    let uses = |i: usize| mine.iter().any(|&k| plan[k].kernel == i);
    let kernels = kernels_where(args, &uses)?;
    let npoints = mine.len();
    let booted = kernels.iter().flatten().count();
    let est = npoints as u64 * (duration.as_secs() + 15) + booted as u64 * 120;
    eprintln!(
        "[experiment] collisions: {} kernel(s) x {} variant(s) x {} rps_flow_cnt = {} points of {}s ({} flows, {} queues, {rate} pps){}; about {} min",
        labels.len(),
        args.variants.len(),
        args.flow_cnts.len(),
        plan.len(),
        duration.as_secs(),
        args.flows,
        args.queues,
        args.shard.map_or_else(String::new, |s| format!(
            "; shard {s}: {npoints} of them on {booted} kernel(s)"
        )),
        est.div_ceil(60)
    );
    let t0 = Instant::now();
    let ids = labels
        .iter()
        .zip(&kernels)
        .map(|(l, k)| k.as_ref().map_or_else(|| KernelId::unused(l), KernelId::of))
        .collect();
    let mut run = new_run(args, ids);
    let json_path = out.join("points.json");
    let save = |run: &mut Run| -> Result<()> {
        // Decided (and named) when the first guest booted.
        run.machine = machine();
        run.elapsed_s = t0.elapsed().as_secs_f64();
        write(&json_path, &pretty(&run.to_json())?)
    };
    let tools = if npoints == 0 {
        eprintln!(
            "[experiment] this shard has no point (the sweep has {}): an empty partial result",
            plan.len()
        );
        None
    } else {
        Some(Tools::build()?)
    };
    let mut done = 0usize;
    for (ki, kernel) in kernels.into_iter().enumerate() {
        let (Some(kernel), Some(tools)) = (kernel, &tools) else {
            continue;
        };
        let todo: Vec<usize> = mine
            .iter()
            .copied()
            .filter(|&k| plan[k].kernel == ki)
            .collect();
        // A kernel's problems belong to its first point (boot) or its
        // last (teardown), so that a merge puts them in their place.
        let (first, last) = (todo[0], todo[todo.len() - 1]);
        let label = kernel.label.clone();
        let mut s = match boot(kernel, tools, settings.clone(), art) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("[experiment] {e}");
                run.errors.push((first, e.to_string()));
                done += todo.len();
                continue;
            }
        };
        // Without the module there is nothing to measure on this kernel.
        if let Err(e) = experiments::prepare_collisions(&mut s) {
            let msg = format!("{label}: {e}; its points are skipped");
            eprintln!("[experiment] {msg}");
            run.errors.push((first, msg));
            done += todo.len();
            for p in s.finish() {
                run.errors.push((last, format!("{label} teardown: {p}")));
            }
            continue;
        }
        // The variants of a size back to back: a problem with either
        // shows in the first minutes of a long run.
        for &k in &todo {
            let PointKey {
                rps_flow_cnt: cnt,
                variant,
                ..
            } = plan[k];
            let fast = variant == Variant::Fast;
            let iters = if variant == Variant::Five {
                args.iterations
            } else {
                1
            };
            let w = CollisionWorkload {
                flows: args.flows,
                rate: if fast { args.fast_rate } else { rate },
                duration,
                iterations: iters,
                variant,
                latency: args.latency,
                // The high-rate variant times as many round trips per
                // second as the others.
                echo_every: if fast {
                    args.fast_rate.div_ceil(rate).max(1)
                } else {
                    1
                },
                program_latency_ms: if fast {
                    args.fast_latency_ms
                } else {
                    args.program_latency_ms
                },
            };
            done += 1;
            eprintln!(
                "[experiment] ({done}/{npoints}, {:.0} min so far) {label} {} rps_flow_cnt={cnt}: running {}s",
                t0.elapsed().as_secs_f64() / 60.0,
                variant.name(iters).to_lowercase(),
                duration.as_secs()
            );
            match experiments::collision_point(&mut s, &w, cnt) {
                Ok(p) => {
                    eprintln!("{}", point_line(&p));
                    if !p.kernel_problems.is_empty() {
                        run.errors.push((
                            k,
                            format!(
                                "{label} rps_flow_cnt={cnt}: kernel reported {:?}",
                                p.kernel_problems
                            ),
                        ));
                    }
                    run.points.push((k, p));
                }
                Err(e) => {
                    let msg = format!(
                        "{label} {} rps_flow_cnt={cnt}: {e}",
                        variant.name(iters).to_lowercase()
                    );
                    eprintln!("[experiment]   ERROR {msg}");
                    run.errors.push((k, msg));
                    if s.guest.qemu.exited().is_some() {
                        run.errors.push((
                            k,
                            format!("{label}: the guest is gone, skipping its other points"),
                        ));
                        break;
                    }
                }
            }
            save(&mut run)?;
        }
        s.guest
            .collect("final-experiment", Some(guest_tests::module::DEBUGFS_DIR));
        let problems = s.finish();
        for p in problems {
            eprintln!("[experiment] {label} teardown: {p}");
            run.errors.push((last, format!("{label} teardown: {p}")));
        }
    }
    run.finished = true;
    save(&mut run)?;
    let mut errors = run.error_lines();
    errors.extend(write_collisions(&run, out, args.report.as_deref())?);
    if args.check {
        return check(&run.bare_points(), args.flows, &errors);
    }
    problems(&errors)
}

/// A point's figures, for the progress lines.
fn point_line(p: &CollisionPoint) -> String {
    format!(
        "[experiment]   Latency {} Add {} Del {} Steer-C {} Steer-L {} Replace {} Reject {} thrashing flows {} (reset {:.1}s{}, {} pkts sent, {} received, host load {}){}",
        p.latency.as_ref().map_or_else(
            || "-".into(),
            |l| format!(
                "{:.0}us (p99 {:.0}us, {} round trips)",
                l.mean_us, l.p99_us, l.replies
            )
        ),
        p.adds,
        p.dels,
        p.steer_calls,
        p.steer_walked.unwrap_or(0),
        p.replaces,
        p.rejects,
        p.thrashing,
        p.reset_s,
        if p.reset_used_idle { ", idle backstop used" } else { "" },
        p.sent,
        p.received,
        p.host_load.map_or("?".into(), |l| format!("{l:.1}")),
        if p.kernel_problems.is_empty() {
            String::new()
        } else {
            format!("; KERNEL PROBLEMS: {:?}", p.kernel_problems)
        }
    )
}

fn pretty(v: &serde_json::Value) -> Result<String> {
    serde_json::to_string_pretty(v).map_err(ExperimentError::Encode)
}

/// What every collisions run writes at its end, whole, shard or merge
/// (one path, so that a merge writes what a whole run would): points.json;
/// for a whole or merged run also the tables on stdout, tables.md,
/// plot.svg and, with `report`, the reader's page. A shard prints its
/// tables marked partial and writes points.json only. Returns the problems
/// of the plot and the report.
fn write_collisions(run: &Run, out: &Path, report: Option<&Path>) -> Result<Vec<String>> {
    write(&out.join("points.json"), &pretty(&run.to_json())?)?;
    let mut errors = Vec::new();
    let points = run.bare_points();
    let tables = render_tables(&points);
    let (w, g) = (&run.workload, &run.guest);
    let (flows, queues) = (
        w["flows_per_iteration"].as_u64().unwrap_or(0),
        g["queue_pairs"].as_u64().unwrap_or(0),
    );
    let header = format!(
        "{flows} flows per iteration over {queues} rx queues ({} per queue), {} pps in total, {}s per point; {}\n",
        flows / queues.max(1),
        w["rate_pps"],
        w["duration_s"],
        run.machine
    );
    let minutes = run.elapsed_s / 60.0;
    if let Some(s) = run.shard {
        println!(
            "PARTIAL RESULT: shard {s} of the sweep, {} of its {} points ({}/points.json; --merge all {} shards' directories for the tables)",
            points.len(),
            run.sweep.points,
            out.display(),
            s.count
        );
        print!("{header}\n{tables}\n{LEGEND}");
        eprintln!(
            "[experiment] shard {s} done in {minutes:.1} min: {}/points.json (a partial result: no tables.md, plot.svg or report)",
            out.display()
        );
        return Ok(errors);
    }
    print!("{header}\n{tables}\n{LEGEND}");
    let mut md = String::new();
    let _ = writeln!(md, "# Slot-collision sweep, {}\n", run.started);
    let _ = writeln!(md, "Command: `{}`  ", run.command);
    if run.merged_from.is_empty() {
        let _ = writeln!(md, "Run time: {minutes:.0} min. {header}");
    } else {
        let longest = run
            .merged_from
            .iter()
            .map(|m| m.elapsed_s)
            .fold(0.0, f64::max);
        let _ = writeln!(
            md,
            "Run time: {minutes:.0} min over {} shards (the longest {:.0} min). {header}",
            run.merged_from.len(),
            longest / 60.0
        );
        let _ = writeln!(md, "Merged from:\n");
        for m in &run.merged_from {
            let _ = writeln!(
                md,
                "- shard {} ({}): `{}`, {}, {:.0} min; {}",
                m.shard,
                m.path,
                m.command,
                m.started,
                m.elapsed_s / 60.0,
                m.machine
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "```\n{tables}\n{LEGEND}```");
    if !run.errors.is_empty() {
        let _ = writeln!(md, "\nErrors:\n");
        for e in &run.errors {
            let _ = writeln!(md, "- {}", e.1);
        }
    }
    write(&out.join("tables.md"), &md)?;
    if !points.is_empty() {
        let title = format!(
            "Slot collisions: {flows} flows over {queues} queues, {}s per point",
            w["duration_s"]
        );
        if let Err(e) = render_plot(&points, &title, &out.join("plot.svg")) {
            errors.push(format!("plot: {e}"));
        }
    }
    eprintln!(
        "[experiment] done in {minutes:.1} min: {}/tables.md, points.json, plot.svg",
        out.display()
    );
    if let Some(dir) = report {
        let about = format!("`{}`, {}; {header}", run.command, run.started);
        match guest_tests::report::write_report(&points, about.trim_end(), dir) {
            Ok(files) => eprintln!("[experiment] report: {}", files[0].display()),
            Err(e) => errors.push(format!("report: {e}")),
        }
    }
    Ok(errors)
}

/// `--merge`: the partial results of `dirs` as one run, written into `out`
/// as a whole run writes it.
fn merge(args: &Args, dirs: &[PathBuf], out: &Path) -> Result<()> {
    let own = std::fs::canonicalize(out.join("points.json")).ok();
    let mut parts = Vec::new();
    for d in dirs {
        let file = shard::points_file(d);
        if own.is_some() && std::fs::canonicalize(&file).ok() == own {
            return Err(ExperimentError::MergeOverwrites {
                out: out.to_path_buf(),
                file,
            });
        }
        parts.push((d.display().to_string(), shard::read_partial(d)?));
    }
    let command = format!("scripts/experiment collisions {}", args.argv.join(" "));
    let run = shard::merge(parts, command.trim_end())?;
    if run
        .merged_from
        .iter()
        .any(|m| m.machine != run.merged_from[0].machine)
    {
        eprintln!(
            "[experiment] note: the shards ran on different machines (or accelerators): {}",
            run.machine
        );
    }
    eprintln!(
        "[experiment] merged {} shards: {} of the sweep's {} points, {} problem(s) recorded",
        run.merged_from.len(),
        run.points.len(),
        run.sweep.points,
        run.errors.len()
    );
    let mut errors = run.error_lines();
    errors.extend(write_collisions(&run, out, args.report.as_deref())?);
    problems(&errors)
}

/// `--render`: tables and plot again from a points.json (e.g. after a
/// change of layout), Add/Del/Replace/Reject taken from the device counters.
fn render_again(path: &Path, report: Option<&Path>) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| ExperimentError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    if let Some(shard) = shard::is_partial(&v) {
        return Err(ExperimentError::RenderPartial {
            path: path.to_path_buf(),
            shard,
        });
    }
    let mut points: Vec<CollisionPoint> =
        serde_json::from_value(v["points"].clone()).map_err(|source| ExperimentError::Points {
            path: path.to_path_buf(),
            source,
        })?;
    for p in &mut points {
        p.counts_from_device();
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let tables = render_tables(&points);
    let w = &v["workload"];
    let header = format!(
        "{} flows per iteration over {} rx queues, {} pps in total, {}s per point; {}\n",
        w["flows_per_iteration"],
        v["guest"]["queue_pairs"],
        w["rate_pps"],
        w["duration_s"],
        v["machine"].as_str().unwrap_or("")
    );
    print!("{header}\n{tables}\n{LEGEND}");
    let md = format!(
        "# Slot-collision sweep, {}\n\nCommand: `{}`  \nRun time: {:.0} min. {header}\n```\n{tables}\n{LEGEND}```\n",
        v["started"].as_str().unwrap_or(""),
        v["command"].as_str().unwrap_or(""),
        v["elapsed_s"].as_f64().unwrap_or(0.0) / 60.0
    );
    write(&dir.join("tables.md"), &md)?;
    let title = format!(
        "Slot collisions: {} flows over {} queues, {}s per point",
        w["flows_per_iteration"], v["guest"]["queue_pairs"], w["duration_s"]
    );
    render_plot(&points, &title, &dir.join("plot.svg"))?;
    if let Some(rdir) = report {
        let about = format!(
            "`{}`, {}; {header}",
            v["command"].as_str().unwrap_or(""),
            v["started"].as_str().unwrap_or("")
        );
        let files = guest_tests::report::write_report(&points, about.trim_end(), rdir)?;
        eprintln!("report: {}", files[0].display());
    }
    Ok(())
}

/// The acceptance check of issue 6 on one-iteration points at rps_flow_cnt
/// 256: old/new Add ratio >= 10, new Add <= 1.5 x flows, and the lower
/// bound on the new kernel (issue 23): >= 90% of the flows that kept their
/// slot hold their queue at the end ([`guest_tests::scenarios::slots::held_at_end`]).
fn check(points: &[CollisionPoint], flows: usize, errors: &[String]) -> Result<()> {
    let mut fails: Vec<String> = errors.to_vec();
    let at = |i: usize| -> Option<&CollisionPoint> {
        let mut labels: Vec<&str> = Vec::new();
        for p in points {
            if !labels.contains(&p.kernel.as_str()) {
                labels.push(&p.kernel);
            }
        }
        let l = labels.get(i)?;
        points
            .iter()
            .find(|p| p.kernel == *l && p.rps_flow_cnt == 256 && p.variant() == Variant::One)
    };
    match (at(0), at(1)) {
        (Some(old), Some(new)) => {
            let ratio = if new.adds == 0 {
                f64::INFINITY
            } else {
                old.adds as f64 / new.adds as f64
            };
            println!(
                "check: rps_flow_cnt 256, {flows} flows: Add {} ({}) / Add {} ({}) = {ratio:.1} (needs >= 10); new-code Add {} vs 1.5 x flows = {:.0}",
                old.adds, old.release, new.adds, new.release, new.adds, 1.5 * flows as f64
            );
            if new.adds == 0 {
                fails.push(format!(
                    "{} programmed no filter at all: the workload did not steer (see the artifacts)",
                    new.release
                ));
            } else if ratio < 10.0 {
                fails.push(format!(
                    "Add({}) / Add({}) = {} / {} = {ratio:.1}, below 10: the old code's slot thrash did not show (thrashing flows: {} vs {})",
                    old.release, new.release, old.adds, new.adds, old.thrashing, new.thrashing
                ));
            }
            if new.adds as f64 > 1.5 * flows as f64 {
                fails.push(format!(
                    "{} programmed {} filters for {flows} flows (more than 1.5x): the new code re-programs",
                    new.release, new.adds
                ));
            }
            // The lower bound: every flow that kept its slot holds its
            // queue at the end (a live filter to its receiver's queue, and
            // >= 95% of the last window's packets there, guest-side). The
            // old code's figure is printed beside it, without a bar.
            let sl = new.slots;
            println!(
                "check: lower bound, flows needing a filter that kept their slot: {}",
                [(new, true), (old, false)]
                    .iter()
                    .map(|(p, bar)| lower_bound_figures(p, *bar))
                    .collect::<Vec<_>>()
                    .join("  |  ")
            );
            if new.slot_rule.is_none() {
                fails.push(format!(
                    "{}: no filter whose slot could be compared with its flow hash",
                    new.release
                ));
            } else if new.end_window_s.is_none() {
                fails.push(format!(
                    "{}: the point has no end-of-point counts (live filters, guest-side queues)",
                    new.release
                ));
            } else if sl.own_slot == 0 {
                fails.push(format!("{}: no flow kept its slot", new.release));
            } else if (sl.own_slot_on_queue as f64) < 0.9 * sl.own_slot as f64 {
                fails.push(format!(
                    "{}: {} of the {} flows that kept their slot hold their queue at the end (live filter to it and >= 95% of the last window's packets there, guest-side): under 90% (first misses: {})",
                    new.release,
                    sl.own_slot_on_queue,
                    sl.own_slot,
                    new.end_misses.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
                ));
            }
            if sl.hash_unknown * 20 > new.flows_needing_filter {
                fails.push(format!(
                    "{}: no flow hash recorded for {} of the {} flows needing a filter",
                    new.release, sl.hash_unknown, new.flows_needing_filter
                ));
            }
            if new.flowhash_full > 0 {
                fails.push(format!(
                    "{}: vnic_flowhash had no room for {} packets' flows",
                    new.release, new.flowhash_full
                ));
            }
        }
        _ => fails.push("the check needs a one-iteration point at rps_flow_cnt 256 on both kernels; some are missing".into()),
    }
    if fails.is_empty() {
        println!("check: PASS");
        Ok(())
    } else {
        println!("check: FAIL");
        for f in &fails {
            println!("  - {f}");
        }
        Err(ExperimentError::CheckFailed(fails))
    }
}

/// "7.3.4 (slot rule hash32): kept slot K, live filter to expected queue
/// L, >= 95% guest-side in last 10 s G = G/K% (needs >= 90%)", for the
/// lower bound's line; `bar`: the kernel the check holds to 90%.
fn lower_bound_figures(p: &CollisionPoint, bar: bool) -> String {
    let sl = p.slots;
    let rule = p
        .slot_rule
        .map_or("unknown".to_string(), |r| format!("{r:?}").to_lowercase());
    let verdict = if bar { "needs >= 90%" } else { "no bar" };
    let Some(w) = p.end_window_s else {
        return format!(
            "{} (slot rule {rule}): kept slot {}, no end-of-point counts in this point ({verdict})",
            p.release, sl.own_slot
        );
    };
    let window = if p.end_window_half {
        format!("last {w:.0} s (the second half: iterations under 15 s)")
    } else {
        format!("last {w:.0} s")
    };
    let pct = if sl.own_slot == 0 {
        "-".to_string()
    } else {
        format!(
            "{:.1}%",
            100.0 * sl.own_slot_on_queue as f64 / sl.own_slot as f64
        )
    };
    format!(
        "{} (slot rule {rule}): kept slot {}, live filter to expected queue {}, >= 95% guest-side in {window} {} = {pct} ({verdict}; any ADD {}; sharing a slot {}, of those holding their queue at the end {})",
        p.release,
        sl.own_slot,
        sl.own_slot_live,
        sl.own_slot_on_queue,
        sl.own_slot_added,
        sl.shared_slot,
        sl.shared_slot_held
    )
}

// ---- rps ----------------------------------------------------------------

fn rps_block(p: &RpsPhase) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "- {} ({}): {} sources, {} pkts sent, {} received by the socket, {} dropped by the device (no rx buffers), {:.0}s, rps_cpus={}:",
        p.name, p.release, p.sources, p.sent, p.received, p.device_rx_drops, p.duration_s, p.rps_cpus
    );
    for c in &p.cpus {
        let _ = writeln!(
            s,
            "{}: ok={:08} drop={:08} time={:08} rps={:08}  NET_RX={}",
            c.cpu, c.processed, c.dropped, c.time_squeeze, c.rps, c.net_rx
        );
    }
    s
}

fn rps(args: &Args, out: &Path, art: &Path) -> Result<()> {
    let duration = Duration::from_secs(args.duration.unwrap_or(if args.check { 10 } else { 20 }));
    let rate = args.rate.unwrap_or(20000);
    let settings = Settings {
        cpus: args.cpus,
        queues: 1,
        ..Settings::default()
    };
    let kernels = kernels(args)?;
    let tools = Tools::build()?;
    let started = utc_now();
    let t0 = Instant::now();
    let mut phases: Vec<RpsPhase> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    for kernel in kernels {
        let label = kernel.label.clone();
        let mut s = boot(kernel, &tools, settings.clone(), art)?;
        let first = phases.len();
        let r = (|| -> Result<()> {
            let mask = experiments::rps_setup(&mut s)?;
            for (name, sources, on) in [
                (
                    format!("RPS off, {} source IP addresses", args.sources),
                    args.sources,
                    false,
                ),
                (
                    format!("{} source IP addresses (balanced)", args.sources),
                    args.sources,
                    true,
                ),
                ("1 source IP address (one heavy flow)".to_string(), 1, true),
            ] {
                let mask = if on { mask.as_str() } else { "0" };
                experiments::rps_set_mask(&mut s, mask)?;
                eprintln!(
                    "[experiment] {label}: {name}, {rate} pps for {}s",
                    duration.as_secs()
                );
                let p = experiments::rps_phase(&mut s, &name, sources, rate, duration, mask)
                    .map_err(|source| ExperimentError::RpsPhase {
                        label: label.clone(),
                        phase: name.clone(),
                        source,
                    })?;
                if !p.kernel_problems.is_empty() {
                    errors.push(format!("{label}: kernel reported {:?}", p.kernel_problems));
                }
                eprint!("{}", rps_block(&p));
                phases.push(p);
            }
            Ok(())
        })();
        if let Err(e) = r {
            eprintln!("[experiment] {e}");
            errors.push(e.to_string());
        } else if let [off, balanced, heavy] = &phases[first..] {
            // The background material's pattern, asserted.
            for (holds, what) in experiments::rps_pattern(Some(off), balanced, heavy) {
                println!(
                    "check: {label}: {} {what}",
                    if holds { "PASS" } else { "FAIL" }
                );
                if !holds {
                    errors.push(format!("{label}: {what}: does not hold"));
                }
            }
        }
        s.guest.collect("final-experiment", None);
        for p in s.finish() {
            errors.push(format!("{label} teardown: {p}"));
        }
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Plain RPS on one rx queue over {} vCPUs (RFS off, no aRFS), {rate} pps of 128-byte UDP frames per phase; per-CPU deltas of /proc/net/softnet_stat (columns 0 processed, 1 dropped, 2 time squeeze, 9 rps; decimal) and NET_RX softirqs. {}\n",
        args.cpus,
        machine()
    );
    for p in &phases {
        text.push_str(&rps_block(p));
    }
    print!("{text}");
    let json = serde_json::json!({
        "command": format!("scripts/experiment rps {}", args.argv.join(" ")).trim_end(),
        "machine": machine(),
        "started": started,
        "elapsed_s": t0.elapsed().as_secs_f64(),
        "errors": errors,
        "phases": phases,
    });
    write(
        &out.join("rps.json"),
        &serde_json::to_string_pretty(&json).map_err(ExperimentError::Encode)?,
    )?;
    write(
        &out.join("rps.md"),
        &format!(
            "# RPS, {started}\n\nCommand: `scripts/experiment rps {}`\n\n```\n{text}```\n",
            args.argv.join(" ")
        ),
    )?;
    problems(&errors)
}

/// `Ok` when nothing went wrong, else one error listing every problem.
fn problems(errors: &[String]) -> Result<()> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ExperimentError::Problems(errors.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use guest_tests::scenarios::slots::{SlotCounts, SlotRule};

    fn point(kernel: &str, cnt: u32, iterations: u32, adds: u64) -> CollisionPoint {
        CollisionPoint {
            kernel: kernel.into(),
            release: format!("{kernel}.0"),
            rps_flow_cnt: cnt,
            iterations,
            flows_per_iteration: 332,
            adds,
            steer_calls: adds * 3,
            flows_needing_filter: 249,
            slot_rule: Some(SlotRule::Hash32),
            slots: SlotCounts {
                own_slot: 200,
                own_slot_added: 200,
                own_slot_live: 195,
                own_slot_on_queue: 190,
                shared_slot: 49,
                shared_slot_held: 24,
                hash_unknown: 0,
            },
            end_window_s: Some(10.0),
            ..CollisionPoint::default()
        }
    }

    #[test]
    fn check_verdicts() {
        let ok = [point("6.12", 256, 1, 3000), point("7.3", 256, 1, 250)];
        assert!(check(&ok, 332, &[]).is_ok());
        // Ratio below 10.
        let low = [point("6.12", 256, 1, 2400), point("7.3", 256, 1, 250)];
        let e = check(&low, 332, &[]).unwrap_err().to_string();
        assert!(e.contains("below 10"), "{e}");
        // New code re-programs: ratio fine but Add > 1.5 x flows.
        let many = [point("6.12", 256, 1, 60000), point("7.3", 256, 1, 600)];
        let e = check(&many, 332, &[]).unwrap_err().to_string();
        assert!(e.contains("more than 1.5x"), "{e}");
        // Nothing steered on the new kernel is a failure, not an infinite ratio.
        let none = [point("6.12", 256, 1, 3000), point("7.3", 256, 1, 0)];
        assert!(check(&none, 332, &[]).is_err());
        // Only the five-iteration variant or another size: no verdict.
        let other = [point("6.12", 512, 1, 3000), point("7.3", 256, 5, 250)];
        assert!(check(&other, 332, &[]).is_err());
        // The new kernel: every flow that kept its slot got an ADD, but
        // fewer than 90% hold their queue at the end (filters gone or to
        // another queue, or the guest saw their packets elsewhere).
        let mut few = ok.clone();
        few[1].slots.own_slot_on_queue = 179;
        few[1].end_misses = vec![":20007 live filter to q2, expected q1".into()];
        let e = check(&few, 332, &[]).unwrap_err().to_string();
        assert!(
            e.contains("179 of the 200") && e.contains("under 90%"),
            "{e}"
        );
        assert!(e.contains(":20007 live filter to q2"), "{e}");
        few[1].slots.own_slot_on_queue = 180;
        assert!(check(&few, 332, &[]).is_ok());
        // The old code's figure has no bar.
        let mut old_low = ok.clone();
        old_low[0].slots.own_slot_on_queue = 3;
        assert!(check(&old_low, 332, &[]).is_ok());
        // A point without the end-of-point counts (an older points.json)
        // cannot pass on the new kernel, whatever its ADDs.
        let mut unmeasured = ok.clone();
        unmeasured[1].end_window_s = None;
        let e = check(&unmeasured, 332, &[]).unwrap_err().to_string();
        assert!(e.contains("no end-of-point counts"), "{e}");
        let mut unknown = ok.clone();
        unknown[1].slot_rule = None;
        assert!(check(&unknown, 332, &[]).is_err());
        // Errors during the run fail the check even with good figures.
        assert!(check(&ok, 332, &["boot failed".to_string()]).is_err());
    }

    #[test]
    fn lower_bound_line_names_k_l_g() {
        let p = point("7.3", 256, 1, 250);
        assert_eq!(
            lower_bound_figures(&p, true),
            "7.3.0 (slot rule hash32): kept slot 200, live filter to expected queue 195, >= 95% guest-side in last 10 s 190 = 95.0% (needs >= 90%; any ADD 200; sharing a slot 49, of those holding their queue at the end 24)"
        );
        let mut short = point("6.12", 256, 1, 3000);
        short.end_window_s = Some(6.0);
        short.end_window_half = true;
        let l = lower_bound_figures(&short, false);
        assert!(
            l.contains("in last 6 s (the second half: iterations under 15 s) 190")
                && l.contains("(no bar;"),
            "{l}"
        );
        short.end_window_s = None;
        assert!(lower_bound_figures(&short, false).contains("no end-of-point counts"));
        // Old points.json files still read: the new fields default.
        let old: CollisionPoint = serde_json::from_str(
            r#"{"kernel": "7.3", "rps_flow_cnt": 256, "slots": {"own_slot": 187, "own_slot_added": 187, "hash_unknown": 0}}"#,
        )
        .unwrap();
        assert_eq!((old.slots.own_slot, old.end_window_s), (187, None));
    }

    #[test]
    fn tables_follow_the_patch_layout() {
        let pts = [
            point("6.12", 256, 1, 3_500_000),
            point("6.12", 512, 1, 12_345),
            point("7.3", 256, 1, 250),
            point("6.12", 256, 5, 900),
        ];
        let t = render_tables(&pts);
        let one = t.find("One iteration, Original code").unwrap();
        let new = t.find("One iteration, New code").unwrap();
        let five = t.find("Five iterations, Original code").unwrap();
        assert!(one < new && new < five, "{t}");
        assert!(
            t.contains("| RPS | Latency | p99 | Add | Del | Steer-C | Steer-L |"),
            "{t}"
        );
        assert!(t.contains("| 256 | - | - | 3.5 M | 0 | 10.5 M |"), "{t}");
        assert!(t.contains("| 512 | - | - | 12.3 K |"), "{t}");
        assert!(
            t.contains("| 256 | - | - | 900 | 0 | 2700 | - | 0 | 0 | 0 | 1660 |"),
            "{t}"
        );
        // The high-rate variant gets its own table, after the others, with
        // its rate and programming latency; latency is shown when measured.
        let mut fast = point("6.12", 256, 1, 3000);
        fast.variant = Some(Variant::Fast);
        fast.rate_pps = 24000;
        fast.program_latency_ms = 100;
        fast.latency = Some(experiments::Latency {
            replies: 10,
            mean_us: 1234.4,
            p50_us: 1000.0,
            p99_us: 5678.0,
            bad: 0,
        });
        let mut with_fast = pts.to_vec();
        with_fast.push(fast);
        let t = render_tables(&with_fast);
        let hr = t
            .find("High rate, Original code (6.12.0: no slot-collision fix), 24000 pps, programming 100 ms")
            .unwrap_or_else(|| panic!("{t}"));
        assert!(hr > t.find("Five iterations").unwrap(), "{t}");
        assert!(t.contains("| 256 | 1234 | 5678 | 3000 |"), "{t}");
    }
}

#[cfg(test)]
mod cli_tests {
    use super::*;

    /// What `main` makes of `line`, split at white space (a clap error as
    /// its text).
    fn args(line: &str) -> Result<Args, String> {
        let argv: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let cli = Cli::try_parse_from(
            std::iter::once("vnic-experiment".to_string()).chain(argv.iter().cloned()),
        )
        .map_err(|e| e.to_string())?;
        settle(cli, &argv).map_err(|e| e.to_string())
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let a = args("collisions").unwrap();
        assert_eq!(a.cmd, Cmd::Collisions);
        assert_eq!(a.kernels, ["6.12", "7.3"]);
        assert!(!a.kernels_given && a.custom.is_none() && !a.check);
        assert_eq!(
            a.flow_cnts,
            [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
        );
        assert_eq!(a.variants, [Variant::One, Variant::Five, Variant::Fast]);
        assert_eq!((a.duration, a.rate, a.iterations), (None, None, 5));
        assert_eq!(
            (a.fast_rate, a.fast_latency_ms),
            (FAST_RATE, FAST_PROGRAM_LATENCY_MS)
        );
        assert_eq!(
            (a.flows, a.queues, a.program_latency_ms, a.latency),
            (332, 4, 0, true)
        );
        assert_eq!(
            (&a.out, &a.artifacts, &a.render, &a.report),
            (&None, &None, &None, &None)
        );
        assert!(a.argv.is_empty());
        let a = args("rps").unwrap();
        assert_eq!((a.cmd, a.kernels), (Cmd::Rps, vec!["7.3".into()]));
        assert_eq!((a.cpus, a.sources), (4, 40));
    }

    #[test]
    fn scripts_test_command_lines() {
        let a = args("collisions --check").unwrap();
        assert!(a.check);
        assert_eq!((a.flow_cnts, a.variants), (vec![256], vec![Variant::One]));
        assert_eq!(a.argv, ["--check"]);
        let a = args("rps --check --kernel 7.3").unwrap();
        assert!(a.check && a.kernels_given);
        assert_eq!((a.cmd, a.kernels), (Cmd::Rps, vec!["7.3".into()]));
        assert_eq!(a.argv, ["--check", "--kernel", "7.3"]);
    }

    #[test]
    fn documented_command_lines() {
        // guest-tests/docs: experiments.md and the results' recorded commands
        let a = args("collisions --duration 40 --out /w/full --report /w/full/report").unwrap();
        assert_eq!(a.duration, Some(40));
        assert_eq!(
            (a.out, a.report),
            (Some("/w/full".into()), Some("/w/full/report".into()))
        );
        let line = "collisions --kernel 6.12,7.3 --flow-cnt 8192,16384,32768 --duration 40 \
                    --variant one,fast --out /work/item6/run";
        let a = args(line).unwrap();
        assert_eq!(a.flow_cnts, [8192, 16384, 32768]);
        assert_eq!(a.variants, [Variant::One, Variant::Fast]);
        assert_eq!(
            a.argv.join(" "),
            line.split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" ")
        );
        let a = args(
            "collisions --kernel 6.12,7.3 --flow-cnt 8192,16384,32768 --duration 60 --variant one",
        )
        .unwrap();
        assert_eq!((a.duration, a.variants), (Some(60), vec![Variant::One]));
        assert_eq!(
            args("rps --out /tmp/exp-rps").unwrap().out,
            Some("/tmp/exp-rps".into())
        );
        let a = args("collisions --render DIR/points.json").unwrap();
        assert_eq!(a.render, Some("DIR/points.json".into()));
        let a = args("collisions --kernel 6.12 --kernel-image /l/arch/x86/boot/bzImage --kdir /l")
            .unwrap();
        assert_eq!(a.kernels, ["6.12"]);
        assert_eq!(
            a.custom,
            Some(("/l/arch/x86/boot/bzImage".into(), "/l".into()))
        );
        // alone, the own kernel replaces the default list
        let a = args("rps --kernel-image /l/bzImage --kdir /l").unwrap();
        assert!(a.kernels.is_empty() && a.custom.is_some());
    }

    #[test]
    fn every_option() {
        let a = args(
            "collisions --kernel 7.2,,7.3 --flow-cnt 256,512 --variant both,fast,five --iterations 3 \
             --fast-rate 1000 --fast-program-latency 0 --flows 100 --queues 2 --rate 500 \
             --program-latency 7 --no-latency --artifacts /a --duration 9 --rate 600",
        )
        .unwrap();
        assert_eq!(a.kernels, ["7.2", "7.3"]);
        assert_eq!(a.flow_cnts, [256, 512]);
        assert_eq!(
            a.variants,
            [Variant::One, Variant::Five, Variant::Fast, Variant::Five]
        );
        assert_eq!((a.iterations, a.fast_rate, a.fast_latency_ms), (3, 1000, 0));
        assert_eq!(
            (a.flows, a.queues, a.rate, a.duration),
            (100, 2, Some(600), Some(9))
        );
        assert_eq!((a.program_latency_ms, a.latency), (7, false));
        assert_eq!(a.artifacts, Some("/a".into()));
        assert_eq!(args("collisions --variant all").unwrap().variants.len(), 3);
        // list items are trimmed
        let cli = Cli::try_parse_from(["vnic-experiment", "collisions", "--flow-cnt", " 256, 512"]);
        assert_eq!(cli.unwrap().flow_cnt, Some(vec![256, 512]));
        let a = args("rps --cpus 2 --sources 150 --rate 100").unwrap();
        assert_eq!((a.cpus, a.sources, a.rate), (2, 150, Some(100)));
    }

    #[test]
    fn bad_values_are_refused() {
        for (bad, msg) in [
            ("collide", "unknown command \"collide\" (collisions or rps)"),
            (
                "--check rps",
                "unknown command \"--check\" (collisions or rps)",
            ),
            ("collisions rps", "unexpected argument"),
            (
                "rps --flow-cnt 256",
                "--flow-cnt belongs to `collisions` (see --help)",
            ),
            ("rps --no-latency", "--no-latency belongs to `collisions`"),
            ("rps --queues 2", "--queues belongs to `collisions`"),
            ("rps --report r", "--report belongs to `collisions`"),
            (
                "collisions --cpus 2",
                "--cpus belongs to `rps` (collisions: --queues)",
            ),
            ("collisions --sources 9", "--sources belongs to `rps`"),
            (
                "collisions --flow-cnt 256,0",
                "--flow-cnt must be in 1..=16777216, got 0",
            ),
            (
                "collisions --variant one,all",
                "--variant \"all\": one, five, fast, both (one,five) or all",
            ),
            (
                "collisions --iterations 1",
                "--iterations must be in 2..=20, got 1",
            ),
            ("rps --sources 1", "--sources must be in 2..=150, got 1"),
            ("rps --duration x", "--duration: \"x\" is not a number"),
            (
                "collisions --kdir /l",
                "--kernel-image and --kdir go together",
            ),
            ("collisions --kernel 7", ""),
            (
                "collisions --kernel 7.x",
                "--kernel \"7.x\": expected a series like 6.12 or 7.3",
            ),
            (
                "collisions --check --variant one",
                "--check runs the one-iteration variant only",
            ),
            (
                "collisions --check --kernel 7.3",
                "--check compares exactly two kernels",
            ),
            (
                "collisions --flows 8000 --iterations 20",
                "do not fit in the guest port range",
            ),
            ("rps --frobnicate", "unexpected argument"),
        ] {
            if let Ok(a) = args(bad) {
                // `--kernel 7` is a series
                assert_eq!(
                    (bad, a.kernels),
                    ("collisions --kernel 7", vec!["7".into()])
                );
                continue;
            }
            let e = args(bad).err().unwrap();
            assert!(e.contains(msg), "{bad:?}: {e}");
        }
    }
}

#[cfg(test)]
mod shard_tests {
    use super::*;

    /// A fresh scratch directory for this test process.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vnic-exp-shard-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn args(line: &str) -> Args {
        let argv: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let cli = Cli::try_parse_from(
            std::iter::once("vnic-experiment".to_string()).chain(argv.iter().cloned()),
        )
        .unwrap();
        settle(cli, &argv).unwrap()
    }

    const SWEEP: &str = "collisions --flow-cnt 256,512 --variant one,five,fast --duration 30";
    /// The point that fails in every synthetic run.
    const FAILS: usize = 8;

    /// What `collisions` records for `a` with synthetic measurements: the
    /// binary's own point list and selection ([`sweep_points`]) and
    /// record ([`new_run`]), the guests replaced by a formula.
    fn measured(a: &Args) -> Run {
        let (plan, mine) = sweep_points(a);
        let labels = kernel_labels(a);
        let ids = labels
            .iter()
            .enumerate()
            .map(|(i, l)| KernelId {
                label: l.clone(),
                release: mine
                    .iter()
                    .any(|&k| plan[k].kernel == i)
                    .then(|| format!("{l}.4")),
                config_fnv64: None,
            })
            .collect();
        let mut r = new_run(a, ids);
        (r.machine, r.started) = ("host: test".into(), "2026-12-05 08:00:00 UTC".into());
        r.elapsed_s = 100.0 * mine.len() as f64;
        for k in mine {
            let key = &plan[k];
            if k == FAILS {
                r.errors.push((k, format!("point {k}: guest gone")));
                continue;
            }
            let iterations = if key.variant == Variant::Five { 5 } else { 1 };
            r.points.push((
                k,
                CollisionPoint {
                    kernel: labels[key.kernel].clone(),
                    release: format!("{}.4", labels[key.kernel]),
                    rps_flow_cnt: key.rps_flow_cnt,
                    variant: Some(key.variant),
                    iterations,
                    flows_per_iteration: 332,
                    adds: (5000 >> (key.kernel * 4)) + k as u64 * 7,
                    dels: 4000 >> (key.kernel * 4),
                    steer_calls: 9000 + k as u64,
                    ..CollisionPoint::default()
                },
            ));
        }
        r.finished = true;
        r
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// points.json without what differs legitimately between a merge and
    /// a whole run: command, machine, started, elapsed_s, merged_from.
    fn comparable(dir: &Path) -> serde_json::Value {
        let mut v: serde_json::Value =
            serde_json::from_str(&read(&dir.join("points.json"))).unwrap();
        for k in ["command", "machine", "started", "elapsed_s", "merged_from"] {
            v.as_object_mut().unwrap().remove(k);
        }
        v
    }

    /// tables.md from its tables on (the lines above name the command, the
    /// run time and, for a merge, the shards).
    fn tables(dir: &Path) -> String {
        let md = read(&dir.join("tables.md"));
        md[md.find("```").unwrap()..].to_string()
    }

    #[test]
    fn merged_shards_write_what_the_whole_run_writes() {
        let root = scratch("merge");
        let whole = root.join("whole");
        std::fs::create_dir_all(&whole).unwrap();
        let w = measured(&args(SWEEP));
        assert_eq!((w.sweep.points, w.points.len()), (12, 11));
        let extra = write_collisions(&w, &whole, Some(&whole.join("report"))).unwrap();
        assert!(extra.is_empty(), "{extra:?}");
        // Three shards, as three machines would run them.
        let mut dirs = Vec::new();
        for i in 1..=3 {
            let d = root.join(format!("shard{i}"));
            std::fs::create_dir_all(&d).unwrap();
            let r = measured(&args(&format!(
                "{SWEEP} --shard {i}/3 --out {}",
                d.display()
            )));
            assert_eq!(r.points.len() + r.errors.len(), 4);
            write_collisions(&r, &d, None).unwrap();
            // A partial result: points.json only.
            assert!(d.join("points.json").is_file());
            assert!(!d.join("tables.md").exists() && !d.join("plot.svg").exists());
            dirs.push(d);
        }
        let out = root.join("merged");
        std::fs::create_dir_all(&out).unwrap();
        let line = format!(
            "collisions --merge {} {} {} --out {} --report {}",
            dirs[2].display(),
            dirs[0].display(),
            dirs[1].display(),
            out.display(),
            out.join("report").display()
        );
        let a = args(&line);
        // The failed point is the merged run's problem, as the whole run's.
        let e = merge(&a, a.merge.as_deref().unwrap(), &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("point 8: guest gone"), "{e}");
        assert_eq!(comparable(&out), comparable(&whole));
        assert_eq!(tables(&out), tables(&whole));
        assert!(tables(&whole).contains("- point 8: guest gone"));
        let md = read(&out.join("tables.md"));
        assert!(
            md.contains(&format!("Command: `scripts/experiment {line}`")),
            "{md}"
        );
        assert!(
            md.contains("Run time: 20 min over 3 shards (the longest 7 min)"),
            "{md}"
        );
        assert!(
            md.contains(&format!(
                "- shard 1/3 ({}): `scripts/experiment {SWEEP} --shard 1/3",
                dirs[0].display()
            )),
            "{md}"
        );
        for f in [
            "plot.svg",
            "report/add.svg",
            "report/steer-c.svg",
            "report/latency.svg",
        ] {
            assert_eq!(read(&out.join(f)), read(&whole.join(f)), "{f}");
        }
        let ours = |d: &Path| -> Vec<String> {
            read(&d.join("report/report.md"))
                .lines()
                .filter(|l| !l.starts_with("Ours: "))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(ours(&out), ours(&whole));
        let merged: serde_json::Value =
            serde_json::from_str(&read(&out.join("points.json"))).unwrap();
        assert_eq!(merged["merged_from"].as_array().unwrap().len(), 3);
        assert_eq!(merged["sweep"]["kernels"][1]["release"], "7.3.4");
        // The merged run re-renders like any run; a shard does not.
        assert!(render_again(&out.join("points.json"), None).is_ok());
        let e = render_again(&dirs[0].join("points.json"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a partial result (shard 1/3)"), "{e}");
        // Merging into a shard's own directory would overwrite it.
        let e = merge(&a, a.merge.as_deref().unwrap(), &dirs[1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("the merge would overwrite it"), "{e}");
        // A shard run with other settings is refused, naming them.
        let odd = root.join("odd");
        std::fs::create_dir_all(&odd).unwrap();
        let r = measured(&args(&format!("{SWEEP} --rate 3000 --shard 2/3")));
        write_collisions(&r, &odd, None).unwrap();
        let e = merge(&a, &[dirs[0].clone(), odd.clone(), dirs[2].clone()], &out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("settings differ") && e.contains("workload.rate_pps: 2000 vs 3000"),
            "{e}"
        );
        let e = merge(&a, &[dirs[0].clone(), dirs[2].clone()], &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("shard 2/3 missing"), "{e}");
        let e = merge(&a, &[root.join("nowhere")], &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no partial result there"), "{e}");
        let e = merge(&a, std::slice::from_ref(&whole), &out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a partial result"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn shard_and_merge_options() {
        let a = args("collisions --shard 2/4");
        assert_eq!(a.shard, Some(Shard { index: 2, count: 4 }));
        let (plan, mine) = sweep_points(&a);
        assert_eq!((plan.len(), mine.len()), (48, 12));
        assert_eq!(&mine[..3], [1, 5, 9]);
        let a = args("collisions --merge a b --merge c --report r");
        assert_eq!(a.merge, Some(vec!["a".into(), "b".into(), "c".into()]));
        let bad = |line: &str| -> String {
            let argv: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            match Cli::try_parse_from(std::iter::once("x".to_string()).chain(argv.iter().cloned()))
            {
                Err(e) => e.to_string(),
                Ok(cli) => settle(cli, &argv)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            }
        };
        for (line, msg) in [
            ("collisions --shard 0/2", "I counts from 1"),
            ("collisions --shard 3/2", "I is above N"),
            ("collisions --shard 1/0", "N is 0"),
            ("collisions --shard 1", "no '/'"),
            ("collisions --shard 1/x", "N \"x\" is not a number"),
            ("rps --shard 1/2", "--shard belongs to `collisions`"),
            ("rps --merge a", "--merge belongs to `collisions`"),
            (
                "collisions --shard 1/2 --check",
                "--shard runs part of a sweep: no --check",
            ),
            ("collisions --shard 1/2 --merge a", "no --merge"),
            ("collisions --shard 1/2 --render p.json", "no --render"),
            (
                "collisions --shard 1/2 --report r",
                "give --report to --merge",
            ),
            (
                "collisions --merge a --kernel 7.3",
                "--merge takes the settings from the partial results: no --kernel",
            ),
            ("collisions --merge a --variant one", "no --variant"),
            ("collisions --merge a --check", "no --check"),
            ("collisions --merge a --artifacts x", "no --artifacts"),
            ("collisions --merge", "a value is required"),
        ] {
            let e = bad(line);
            assert!(e.contains(msg), "{line:?}: {e}");
        }
    }
}
