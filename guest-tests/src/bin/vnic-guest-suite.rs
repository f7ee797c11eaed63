//! vnic-guest-suite: boots real kernels under QEMU on a real `vnic serve`
//! and runs the guest scenarios (`--list`), or the demo, or boots one
//! kernel of yours for poking at by hand (`run`).
//!
//! Prints one line per scenario and kernel, then `N passed, M failed`;
//! exits non-zero on any failure.

use clap::{ArgAction, Parser, Subcommand};
use guest_tests::harness::build::{self, Kernel};
use guest_tests::harness::{parse_num as num, repo_root, timestamp};
use guest_tests::scenarios::poke::{self, RunArgs};
use guest_tests::scenarios::{
    self, report_line, BootKind, Family, Outcome, Session, Settings, Tools, Topology,
};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const ABOUT: &str =
    "vnic-guest-suite: the vnic guest test suite (real kernels, real QEMU, real vnic)";

const AFTER_HELP: &str = "\
MATRIX:
    The suite runs every (topology, family) cell of --topology and --family
    on every kernel; without either it runs the default matrix: 4x4 IPv4
    and 4x4/ipv6 on every kernel, 2x4, 4x2, 1x2 and 2x4/mixed on one kernel
    each (round robin over --kernel). 4x4 IPv4 runs every selected
    scenario; other shapes the matrix scenarios (link, steer, migrate,
    misroute, drop, corrupt, bad-csum with 2+ pairs, rps with 1 pair); IPv6
    and mixed cells link, steer, migrate, expiry, misroute, drop, corrupt,
    bad-csum; --scenario runs what it names wherever it can run (--list).

ENVIRONMENT:
    VNIC_BIN     vnic binary (default: built with cargo --release)
    VNIC_AGENT   static guest agent (default: built into target/agent)
    VNIC_QEMU    qemu-system-x86_64 to use;  VNIC_ACCEL=tcg|kvm (default auto: KVM if its probe boot works)";

// The command line: the options, either alone (run the scenarios) or after
// `demo`. A repeated option takes its last value (--scenario adds up).
#[derive(Parser, Debug)]
#[command(
    name = "vnic-guest-suite",
    about = ABOUT,
    override_usage = "vnic-guest-suite [OPTIONS]          run the scenarios
       vnic-guest-suite demo [OPTIONS]     boot a 7.3 guest, steer ~256 flows, print a summary
       vnic-guest-suite run [OPTIONS]      boot your tree on a vnic of its own: a shell or --exec CMD",
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true,
    args_override_self = true
)]
struct Cli {
    #[command(flatten)]
    opts: Opts,
    #[command(subcommand)]
    mode: Option<Mode>,
}

/// What the command line asks for.
enum Parts {
    /// The suite (`false`) or the demo (`true`), and their options.
    Suite(bool, Opts),
    Run(RunArgs),
}

impl Cli {
    fn into_parts(self) -> Parts {
        match self.mode {
            Some(Mode::Demo(o)) => Parts::Suite(true, o),
            Some(Mode::Run(r)) => Parts::Run(r),
            None => Parts::Suite(false, self.opts),
        }
    }
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Boot a 7.3 guest, steer ~256 flows, print a summary (the options
    /// as without `demo`, some defaults differ; the first cell of the
    /// matrix is the guest's shape)
    #[command(after_help = AFTER_HELP, args_override_self = true, verbatim_doc_comment)]
    Demo(Opts),
    /// Boot one kernel (your built tree, or a cached series) on a vnic of
    /// its own (gen peer, trace on): the module built for it and loaded,
    /// a steered UDP workload from the gen peer, then a shell on the
    /// console or --exec CMD; at exit the filter-table summary and where
    /// the trace is (scripts/run-qemu --kernel-tree DIR runs this)
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
}

#[derive(clap::Args, Debug, Default)]
struct Opts {
    /// Kernel series to test, comma-separated (default 6.12,7.3; demo 7.3;
    /// built into the cache by images/build-kernel when missing);
    /// 6.1-deb: Debian bookworm's prebuilt 6.1 kernel and headers
    /// (images/fetch-distro-kernel; virtio drivers as modules, the
    /// module built with Debian's kbuild; no debug variant)
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          verbatim_doc_comment)]
    kernel: Option<Vec<String>>,
    /// Test your own kernel instead (with --kdir)
    #[arg(long, value_name = "BZIMAGE")]
    kernel_image: Option<PathBuf>,
    /// With --kernel-image: its built source tree
    #[arg(long, value_name = "TREE")]
    kdir: Option<PathBuf>,
    /// Run only these (repeatable or comma-separated; default: all, in
    /// canonical order). Each kernel boots once for the gen-peer
    /// scenarios, once more for tcp-tap (tap peer in a network
    /// namespace, needs root) and, for the kernels of --debug-kernel,
    /// once more on the debug variant (KASAN, lockdep, kmemleak) for
    /// unload-reload. --list shows them.
    #[arg(long, value_name = "NAME", value_delimiter = ',', verbatim_doc_comment)]
    scenario: Vec<String>,
    /// Guest shapes, comma-separated QUEUESxCPUS[/chN]: QUEUES queue
    /// pairs offered by vnic and QEMU, CPUS vCPUs, /chN `ethtool -L
    /// combined N` after boot (else the guest uses virtio_net's
    /// min(QUEUES, CPUS) pairs); see MATRIX below
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = topology, verbatim_doc_comment)]
    topology: Option<Vec<Topology>>,
    /// Address families of the steering flows: ipv4, ipv6, mixed (even
    /// flows IPv4, odd IPv6); the gen peer answers ARP/ICMP and
    /// NS/ICMPv6 echo; see MATRIX below
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = family, verbatim_doc_comment)]
    family: Option<Vec<Family>>,
    /// Every cell of the default matrix on every kernel
    #[arg(long)]
    full_matrix: bool,
    /// One topology: N vCPUs (with --queues, instead of --topology)
    #[arg(long, value_name = "N", value_parser = |v: &str| num(v, "--cpus", 1, 16).map(|n| n as u16))]
    cpus: Option<u16>,
    /// One topology: M queue pairs (with --cpus, instead of --topology)
    #[arg(long, value_name = "M", value_parser = |v: &str| num(v, "--queues", 1, 16).map(|n| n as u16))]
    queues: Option<u16>,
    /// With --cpus/--queues: `ethtool -L combined N` after boot
    #[arg(long, value_name = "N", value_parser = |v: &str| num(v, "--channels", 1, 16).map(|n| n as u16))]
    channels: Option<u16>,
    /// Kernels whose unload-reload runs on the debug variant (default:
    /// every --kernel; `none` for none). Other kernels run unload-reload
    /// in their default boot: same cycles and checks, without
    /// KASAN/kmemleak (the report says which). A debug build takes
    /// ~11-14 min on 2 cores the first time (cached after).
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          verbatim_doc_comment)]
    debug_kernel: Option<Vec<String>>,
    /// Flows in steer/migrate/expiry and the stress workloads (default 64; demo 256)
    #[arg(long, value_name = "N", value_parser = |v: &str| num(v, "--flows", 1, 4096).map(|n| n as usize))]
    flows: Option<usize>,
    /// Generator packets per second over all flows (default 2000; demo 4000)
    #[arg(long, value_name = "PPS", value_parser = |v: &str| num(v, "--rate", 1, 1_000_000).map(|n| n as u32))]
    rate: Option<u32>,
    /// Measurement window after warm-up, in seconds (default 5)
    #[arg(long, value_name = "SECS", value_parser = |v: &str| num(v, "--measure", 1, 600))]
    measure: Option<u64>,
    /// rps_flow_cnt per rx queue (default 262144, demo 1048576: low
    /// slot-collision odds)
    #[arg(long, value_name = "N", value_parser = |v: &str| num(v, "--flow-cnt", 1, 1 << 24).map(|n| n as u32),
          verbatim_doc_comment)]
    flow_cnt: Option<u32>,
    /// net.core.rps_sock_flow_entries (default 1048576; demo 4194304)
    #[arg(long, value_name = "N", value_parser = |v: &str| num(v, "--sock-flow-entries", 1, 1 << 29).map(|n| n as u32))]
    sock_flow_entries: Option<u32>,
    /// The idle backstop (expiry=idle:MS) the expiry scenarios turn on
    /// once the flows stopped (default 2000)
    #[arg(long, value_name = "MS", value_parser = |v: &str| num(v, "--idle-ms", 1, 600_000).map(|n| n as u32),
          verbatim_doc_comment)]
    idle_ms: Option<u32>,
    /// The kernel under test has the pre-fix set_rps_cpu()
    /// (images/patches/7.3-set-rps-cpu-prefix-flow-id.patch, built with
    /// images/build-kernel --variant debug --patch): rfs-unequal-tables
    /// asserts the out-of-bounds slot and KASAN's report instead of their
    /// absence
    #[arg(long, verbatim_doc_comment)]
    expect_rfs_oob: bool,
    /// Where logs, traces and snapshots go (default
    /// target/guest-tests/<UTC time>)
    #[arg(long, value_name = "DIR", verbatim_doc_comment)]
    artifacts: Option<PathBuf>,
    /// The scenarios and the boot each needs
    #[arg(long)]
    list: bool,
}

fn topology(v: &str) -> Result<Topology, String> {
    Topology::parse(v).map_err(|e| e.0)
}

fn family(v: &str) -> Result<Family, String> {
    Family::parse(v).map_err(|e| e.0)
}

struct Args {
    demo: bool,
    kernels: Vec<String>,
    custom: Option<(PathBuf, PathBuf)>,
    scenarios: Vec<String>,
    settings: Settings,
    artifacts: Option<PathBuf>,
    /// Kernel series whose debug-kind scenarios boot the debug variant.
    debug_kernels: Vec<String>,
    /// The (topology, family) cells to run, in order, and whether a cell
    /// runs on one kernel only (the default matrix spreads its extra shapes
    /// over the kernels, round robin, unless --full-matrix).
    cells: Vec<(Topology, Family, bool)>,
    full_matrix: bool,
    /// Scenarios were named with --scenario (not the default selection).
    explicit: bool,
}

/// The default matrix: today's 4x4 over IPv4 and over IPv6 on every
/// kernel; several CPUs per queue, more queues than CPUs, one queue (plain
/// RPS) and IPv4/IPv6 flows mixed on one kernel each (round robin over
/// --kernel; --full-matrix runs them on every kernel).
/// Boots that may need their second attempt (`Session::boot_in`: QEMU's
/// TCG assertion, a guest hung before its agent ran) in one run. Each is
/// shown on its scenarios' lines and counted in the summary; more fail the
/// run: a host that keeps hanging guests is not chance any more.
const MAX_RETRIED_BOOTS: usize = 1;

const DEFAULT_TOPOLOGIES: &str = "4x4,2x4,4x2,1x2";
const DEFAULT_CELLS: &[(&str, Family, bool)] = &[
    ("4x4", Family::Ipv4, false),
    ("4x4", Family::Ipv6, false),
    ("2x4", Family::Ipv4, true),
    ("4x2", Family::Ipv4, true),
    ("1x2", Family::Ipv4, true),
    ("2x4", Family::Mixed, true),
];

/// `--list`: the scenarios, the boot each needs and the default shapes
/// each can run on.
fn print_list() {
    let shapes: Vec<Topology> = DEFAULT_TOPOLOGIES
        .split(',')
        .filter_map(|t| Topology::parse(t).ok())
        .collect();
    for s in scenarios::SCENARIOS {
        let (name, k) = (s.name, s.boot);
        let fits: Vec<String> = shapes
            .iter()
            .filter(|t| s.fits(t))
            .map(ToString::to_string)
            .collect();
        println!(
            "{name:<18} boot: {:<8} variant {:<8} {} (can run on {})",
            format!("{k:?}"),
            k.variant(),
            if s.matrix {
                "every topology"
            } else {
                "4x4 only"
            },
            fits.join(" ")
        );
    }
}

/// Options clap accepts that together ask for no run ([`settle`]'s
/// checks across options); exit status 2.
#[derive(Debug, thiserror::Error)]
enum UsageError {
    #[error("--kernel-image and --kdir go together")]
    ImageWithoutTree,
    #[error("--topology and --cpus/--queues are alternatives")]
    TopologyAndShape,
    #[error("--channels goes with --cpus/--queues (in --topology: 4x2/ch4)")]
    ChannelsWithTopology,
    /// The shape --cpus/--queues/--channels make is not one the suite can
    /// boot (`Topology`'s message).
    #[error(transparent)]
    Shape(guest_tests::harness::Error),
    #[error("unknown scenario {name:?}; known: {}", scenarios::all().join(", "))]
    UnknownScenario { name: String },
    #[error(
        "--kernel {0:?}: expected a series like 6.12 or 7.3, or 6.1-deb (Debian's prebuilt kernel)"
    )]
    BadSeries(String),
    #[error("too many flows ({flows}; at most {max})")]
    TooManyFlows { flows: usize, max: u16 },
}

/// The run the options ask for (`demo`: the demo's), with the checks that
/// take more than one option.
fn settle(demo: bool, o: Opts) -> Result<Args, UsageError> {
    let mut a = Args {
        demo: false,
        kernels: vec!["6.12".into(), "7.3".into()],
        custom: None,
        scenarios: Vec::new(),
        settings: Settings::default(),
        artifacts: None,
        debug_kernels: Vec::new(),
        cells: Vec::new(),
        full_matrix: false,
        explicit: false,
    };
    if demo {
        a.demo = true;
        a.kernels = vec!["7.3".into()];
        a.settings.flows = 256;
        a.settings.rate = 4000;
        a.settings.sock_flow_entries = 1 << 22;
        a.settings.flow_cnt = 1 << 20;
    }
    let debug_given = o.debug_kernel.is_some();
    if let Some(v) = o.debug_kernel {
        a.debug_kernels = if v == ["none"] { Vec::new() } else { v };
    }
    if let Some(k) = o.kernel {
        a.kernels = k;
    }
    let (image, kdir) = (o.kernel_image, o.kdir);
    a.scenarios = o.scenario;
    let (topo_list, cpus, queues, channels) = (o.topology, o.cpus, o.queues, o.channels);
    a.full_matrix = o.full_matrix;
    let families = o.family;
    if let Some(n) = o.flows {
        a.settings.flows = n;
    }
    if let Some(n) = o.rate {
        a.settings.rate = n;
    }
    if let Some(n) = o.measure {
        a.settings.measure = Duration::from_secs(n);
    }
    if let Some(n) = o.flow_cnt {
        a.settings.flow_cnt = n;
    }
    if let Some(n) = o.sock_flow_entries {
        a.settings.sock_flow_entries = n;
    }
    if let Some(n) = o.idle_ms {
        a.settings.module.idle_timeout_ms = n;
    }
    a.artifacts = o.artifacts;
    a.settings.expect_rfs_oob = o.expect_rfs_oob;
    match (image, kdir) {
        (Some(i), Some(k)) => a.custom = Some((i, k)),
        (None, None) => {}
        _ => return Err(UsageError::ImageWithoutTree),
    }
    let shape_given =
        topo_list.is_some() || cpus.is_some() || queues.is_some() || channels.is_some();
    let topologies: Vec<Topology> = match (topo_list, cpus, queues) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => return Err(UsageError::TopologyAndShape),
        (Some(l), None, None) => {
            if channels.is_some() {
                return Err(UsageError::ChannelsWithTopology);
            }
            l
        }
        (None, None, None) if channels.is_none() => {
            // Only --family given: the default shape.
            vec![Topology::default()]
        }
        (None, n_cpus, n_queues) => {
            let default = Topology::default();
            let one = Topology {
                queues: n_queues.unwrap_or(default.queues),
                cpus: n_cpus.unwrap_or(default.cpus),
                channels,
            };
            one.validate().map_err(UsageError::Shape)?;
            vec![one]
        }
    };
    a.cells = if !shape_given && families.is_none() {
        DEFAULT_CELLS
            .iter()
            .map(|&(t, f, one)| {
                Topology::parse(t)
                    .map(|t| (t, f, one))
                    .map_err(UsageError::Shape)
            })
            .collect::<Result<_, _>>()?
    } else {
        let fams = families.unwrap_or_else(|| vec![Family::Ipv4]);
        topologies
            .iter()
            .flat_map(|&t| fams.iter().map(move |&f| (t, f, false)))
            .collect()
    };
    if a.demo {
        // The demo boots one guest: the first cell.
        a.cells.truncate(1);
        let (t, f, _) = a.cells[0];
        a.settings.set_topology(t);
        a.settings.family = f;
    }
    a.explicit = !a.scenarios.is_empty();
    for s in &a.scenarios {
        if !scenarios::all().contains(&s.as_str()) {
            return Err(UsageError::UnknownScenario { name: s.clone() });
        }
    }
    for k in &a.kernels {
        let series = k.strip_suffix(build::DISTRO_SUFFIX).unwrap_or(k);
        if !series
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        {
            return Err(UsageError::BadSeries(k.clone()));
        }
    }
    let max_flows = u16::MAX - scenarios::BASE_PORT;
    if a.settings.flows > usize::from(max_flows) {
        return Err(UsageError::TooManyFlows {
            flows: a.settings.flows,
            max: max_flows,
        });
    }
    if !debug_given {
        a.debug_kernels.clone_from(&a.kernels);
    }
    Ok(a)
}

fn main() -> ExitCode {
    let (is_demo, opts) = match Cli::parse().into_parts() {
        Parts::Suite(demo, o) => (demo, o),
        Parts::Run(r) => return poke::main(&r),
    };
    if opts.list {
        print_list();
        return ExitCode::SUCCESS;
    }
    let args = match settle(is_demo, opts) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let art_root = args
        .artifacts
        .clone()
        .unwrap_or_else(|| repo_root().join("target/guest-tests").join(timestamp()));
    if args.demo {
        return demo(&args, &art_root);
    }
    let selected: Vec<String> = if args.scenarios.is_empty() {
        scenarios::all().iter().map(|s| (*s).to_string()).collect()
    } else {
        // Canonical order: steer before migrate before expiry.
        scenarios::all()
            .iter()
            .filter(|s| args.scenarios.iter().any(|x| x == *s))
            .map(|s| (*s).to_string())
            .collect()
    };
    let start = Instant::now();
    eprintln!("[guest-tests] artifacts in {}", art_root.display());
    let mut outcomes: Vec<Outcome> = Vec::new();
    // Failures that are not a scenario's outcome (a teardown, a wedged
    // guest): the lines printed for them, recalled at the end.
    let mut extra_failures: Vec<String> = Vec::new();
    let mut retried_boots = 0usize;
    let tools = match Tools::build() {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("[guest-tests] cannot build the host tools: {e}");
            None
        }
    };
    let kernels: Vec<(String, Option<(PathBuf, PathBuf)>)> = match &args.custom {
        Some((i, k)) => vec![("custom".into(), Some((i.clone(), k.clone())))],
        None => args.kernels.iter().map(|k| (k.clone(), None)).collect(),
    };
    // Scenarios that need their own boot (the tap peer, the debug kernel)
    // run in one extra boot per kind and kernel, after the default boot.
    // A kernel left out of --debug-kernel (or a custom kernel) runs the
    // debug-kind scenarios in its default boot.
    let kind_for = |s: &str, label: &str, custom: bool| match scenarios::boot_kind(s) {
        BootKind::Debug | BootKind::Timed
            if custom
                || label.ends_with(build::DISTRO_SUFFIX)
                || !args.debug_kernels.iter().any(|k| k == label) =>
        {
            BootKind::Default
        }
        k => k,
    };
    let nkernels = kernels.len();
    for (ki, (label, custom)) in kernels.into_iter().enumerate() {
        let mut spread = 0;
        for &(topo, family, one_kernel) in &args.cells {
            if one_kernel && !args.full_matrix {
                // This cell runs on kernel number (its rank among such cells)
                // modulo the kernel count.
                spread += 1;
                if (spread - 1) % nkernels != ki {
                    continue;
                }
            }
            // Which selected scenarios this cell runs: all of them on 4x4
            // IPv4, the matrix ones on other shapes, the family-aware ones
            // in IPv6 and mixed cells, what --scenario named wherever it
            // can run; never one that cannot run with the pairs in use.
            let cell: Vec<String> = selected
                .iter()
                .filter(|s| {
                    scenarios::Scenario::find(s).is_some_and(|sc| {
                        let default = topo.is_default() && family == Family::Ipv4;
                        sc.fits(&topo)
                            && sc.speaks(family)
                            && (args.explicit
                                || default
                                || (family == Family::Ipv4 && sc.matrix)
                                || family != Family::Ipv4)
                    })
                })
                .cloned()
                .collect();
            let fam = if family == Family::Ipv4 {
                String::new()
            } else {
                format!("/{family}")
            };
            let skipped: Vec<&String> = selected.iter().filter(|s| !cell.contains(s)).collect();
            if !skipped.is_empty() && args.explicit {
                eprintln!(
                    "[guest-tests] {label}@{topo}{fam}: cannot run with {} pair(s) in use or {family} flows: {}",
                    topo.pairs(),
                    skipped
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            let mut kinds: Vec<BootKind> = cell
                .iter()
                .map(|s| kind_for(s, &label, custom.is_some()))
                .collect();
            kinds.sort();
            kinds.dedup();
            let mut settings = args.settings.clone();
            settings.set_topology(topo);
            settings.family = family;
            for &kind in &kinds {
                let group: Vec<String> = cell
                    .iter()
                    .filter(|s| kind_for(s, &label, custom.is_some()) == kind)
                    .cloned()
                    .collect();
                let blabel = format!("{label}{}@{topo}{fam}", kind.suffix());
                run_boot(
                    &blabel,
                    &label,
                    custom.as_ref(),
                    kind,
                    &group,
                    tools.as_ref(),
                    &settings,
                    &art_root,
                    &mut outcomes,
                    &mut extra_failures,
                    &mut retried_boots,
                );
            }
        }
    }
    let passed = outcomes.iter().filter(|o| o.passed()).count();
    // One retried boot (a TCG hang or a QEMU assertion) is tolerated and
    // shown; a second in one run is no longer chance and fails the run.
    if retried_boots > MAX_RETRIED_BOOTS {
        let line = format!(
            "retried boots: FAIL  {retried_boots} boots needed a second attempt, at most {MAX_RETRIED_BOOTS} tolerated per run"
        );
        println!("{line}");
        extra_failures.push(line);
    }
    let failed = outcomes.len() - passed + extra_failures.len();
    if failed > 0 {
        // Recalled last: a CI log that keeps only its tail still names them.
        println!("[guest-tests] what failed:");
        for o in outcomes.iter().filter(|o| !o.passed()) {
            println!("{}", report_line(o));
        }
        for line in &extra_failures {
            println!("{line}");
        }
    }
    eprintln!(
        "[guest-tests] done in {:.0}s; artifacts in {}",
        start.elapsed().as_secs_f64(),
        art_root.display()
    );
    println!("{passed} passed, {failed} failed, {retried_boots} retried boot(s)");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Boot `series` (or the custom kernel) for scenarios of one boot kind, run
/// them, tear down. Reports under `blabel` (`7.3`, `7.3-tap`, `7.3-debug`).
#[allow(clippy::too_many_arguments)] // the suite's loop state, passed through once
fn run_boot(
    blabel: &str,
    series: &str,
    custom: Option<&(PathBuf, PathBuf)>,
    kind: BootKind,
    group: &[String],
    tools: Option<&Tools>,
    settings: &Settings,
    art_root: &std::path::Path,
    outcomes: &mut Vec<Outcome>,
    extra_failures: &mut Vec<String>,
    retried_boots: &mut usize,
) {
    let fail_all = |group: &[String], why: &str, outcomes: &mut Vec<Outcome>| {
        for s in group {
            let o = Outcome {
                scenario: s.clone(),
                kernel: blabel.to_string(),
                figures: String::new(),
                failures: vec![format!("not run: {why}")],
                elapsed: Duration::ZERO,
                retried_boot: None,
            };
            println!("{}", report_line(&o));
            outcomes.push(o);
        }
    };
    let Some(tools) = tools else {
        fail_all(
            group,
            "the host tools (vnic, agent) did not build",
            outcomes,
        );
        return;
    };
    let kernel = match custom {
        Some(_) if kind.variant() != "default" => Err(guest_tests::harness::Error(format!(
            "needs the {} kernel variant; a custom kernel is booted as given",
            kind.variant()
        ))),
        Some((i, k)) => build::kernel_custom(i, k),
        None => match series.strip_suffix(build::DISTRO_SUFFIX) {
            Some(s) => build::kernel_distro(s),
            None => build::kernel_series(series, kind.variant()),
        },
    };
    let mut kernel: Kernel = match kernel {
        Ok(k) => k,
        Err(e) => {
            fail_all(
                group,
                &format!("kernel {blabel} unavailable: {e}"),
                outcomes,
            );
            return;
        }
    };
    kernel.label = blabel.to_string();
    eprintln!(
        "[guest-tests] booting {blabel} ({})",
        kernel.bzimage.display()
    );
    let boot = |dir: &str,
                group: &[String],
                outcomes: &mut Vec<Outcome>,
                retried_boots: &mut usize| match Session::boot_in(
        kernel.clone(),
        tools,
        settings.clone(),
        &art_root.join(dir.replace('/', "-")),
        kind,
        |why| eprintln!("[guest-tests] {blabel}: {why}"),
    ) {
        Ok(s) => {
            eprintln!(
                "[guest-tests] {blabel}: guest up in {:.1}s (kernel {})",
                s.guest.boot_time.as_secs_f64(),
                s.guest.info.kernel
            );
            if s.retried_boot.is_some() {
                *retried_boots += 1;
            }
            Some(s)
        }
        Err(e) => {
            fail_all(group, &format!("boot failed: {e}"), outcomes);
            None
        }
    };
    let Some(mut session) = boot(blabel, group, outcomes, retried_boots) else {
        return;
    };
    let mut reboots = 0;
    for (i, s) in group.iter().enumerate() {
        let o = session.run(s);
        println!("{}", report_line(&o));
        outcomes.push(o);
        let rest = &group[i + 1..];
        if !rest.is_empty() && session.wedged() {
            // A hung guest would fail every later scenario at its first
            // request: the one that hung it is reported above, the others
            // run on a fresh boot (its artifacts in <label>-rebootN/).
            reboots += 1;
            let line = format!(
                "teardown {blabel:<13} FAIL  guest unresponsive after {s}: rebooting for {} more scenario(s)",
                rest.len()
            );
            println!("{line}");
            extra_failures.push(line);
            drop(session);
            match boot(
                &format!("{blabel}-reboot{reboots}"),
                rest,
                outcomes,
                retried_boots,
            ) {
                Some(next) => session = next,
                None => return,
            }
        }
    }
    let problems = session.finish();
    if problems.is_empty() {
        println!(
            "teardown {blabel:<13} PASS  module unloaded, kernel log clean, guest powered off"
        );
    } else {
        let mut line = format!("teardown {blabel:<13} FAIL");
        for p in problems {
            let _ = write!(line, "\n    - {p}");
        }
        println!("{line}");
        extra_failures.push(line);
    }
}

fn demo(args: &Args, art_root: &std::path::Path) -> ExitCode {
    let run = || -> guest_tests::harness::Result<()> {
        let tools = Tools::build()?;
        let kernel = match &args.custom {
            Some((i, k)) => build::kernel_custom(i, k)?,
            None => match args.kernels[0].strip_suffix(build::DISTRO_SUFFIX) {
                Some(s) => build::kernel_distro(s)?,
                None => build::kernel_series(&args.kernels[0], "default")?,
            },
        };
        let label = kernel.label.clone();
        eprintln!(
            "[demo] booting {label} with {} vCPUs / {} queue pairs",
            args.settings.cpus, args.settings.queues
        );
        // As in the suite: a boot hung by TCG or the guest kernel before
        // any device (or with a stuck vCPU) is repeated once, said why.
        let mut s = Session::boot_in(
            kernel,
            &tools,
            args.settings.clone(),
            &art_root.join(&label),
            BootKind::Default,
            |m| eprintln!("[demo] {m}"),
        )?;
        eprintln!(
            "[demo] guest up in {:.1}s, kernel {}",
            s.guest.boot_time.as_secs_f64(),
            s.guest.info.kernel
        );
        eprintln!(
            "[demo] steering {} UDP flows from the gen peer ...",
            args.settings.flows
        );
        let o = s.run("steer");
        let trace = s.guest.vnic.trace.clone();
        let summary = scenarios::table_summary(&mut s);
        let problems = s.finish();
        println!("{}", report_line(&o));
        match summary {
            Ok(text) => println!("{text}"),
            Err(e) => println!("(no summary: {e})"),
        }
        println!("trace: {}", trace.display());
        println!("artifacts: {}", art_root.join(&label).display());
        if !o.passed() || !problems.is_empty() {
            for p in problems {
                println!("    - {p}");
            }
            return Err("the demo's steer run did not meet its assertions".into());
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `line` split at white space.
    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("vnic-guest-suite").chain(line.split_whitespace()))
    }

    /// What `main` makes of `line` (a clap error as its text).
    fn args(line: &str) -> Result<Args, String> {
        match parse(line).map_err(|e| e.to_string())?.into_parts() {
            Parts::Suite(demo, opts) => settle(demo, opts).map_err(|e| e.to_string()),
            Parts::Run(r) => Err(format!("run: {r:?}")),
        }
    }

    fn cells(a: &Args) -> Vec<String> {
        a.cells
            .iter()
            .map(|(t, f, one)| format!("{t}/{f}{}", if *one { "/one" } else { "" }))
            .collect()
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let a = args("").unwrap();
        assert!(!a.demo && !a.full_matrix && !a.explicit);
        assert_eq!(a.kernels, ["6.12", "7.3"]);
        assert_eq!(a.debug_kernels, a.kernels);
        assert_eq!((&a.custom, &a.artifacts), (&None, &None));
        assert!(a.scenarios.is_empty());
        assert_eq!(
            cells(&a),
            [
                "4x4/ipv4",
                "4x4/ipv6",
                "2x4/ipv4/one",
                "4x2/ipv4/one",
                "1x2/ipv4/one",
                "2x4/mixed/one"
            ]
        );
        let d = Settings::default();
        let s = &a.settings;
        assert_eq!((s.flows, s.rate, s.flow_cnt), (d.flows, d.rate, d.flow_cnt));
        assert_eq!(
            (s.sock_flow_entries, s.measure),
            (d.sock_flow_entries, d.measure)
        );
        assert_eq!(s.module.idle_timeout_ms, d.module.idle_timeout_ms);
    }

    #[test]
    fn scripts_test_command_lines() {
        // the guest suite, without and with --topologies/--families
        let a = args("--kernel 6.12,7.3 --debug-kernel 7.3").unwrap();
        assert_eq!(
            (a.kernels, a.debug_kernels),
            (vec!["6.12".into(), "7.3".into()], vec!["7.3".into()])
        );
        assert_eq!(a.cells.len(), DEFAULT_CELLS.len());
        let a = args("--kernel 6.12,7.3 --debug-kernel none --topology 4x4,2x4 --family ipv4,ipv6")
            .unwrap();
        assert!(a.debug_kernels.is_empty());
        assert_eq!(cells(&a), ["4x4/ipv4", "4x4/ipv6", "2x4/ipv4", "2x4/ipv6"]);
        let a = args("--kernel 7.3 --debug-kernel 6.12,7.3 --family mixed").unwrap();
        assert_eq!(a.debug_kernels, ["6.12", "7.3"]);
        assert_eq!(cells(&a), ["4x4/mixed"]);
        // the own-kernel path and the release mismatch
        for (line, scenarios) in [
            (
                "--kernel-image /o/linux/arch-bzImage --kdir /o/linux --debug-kernel none \
                 --topology 4x4 --scenario link,steer",
                &["link", "steer"][..],
            ),
            (
                "--kernel-image /k/6.12/bzImage --kdir /o/linux --debug-kernel none \
                 --topology 4x4 --scenario link",
                &["link"],
            ),
        ] {
            let a = args(line).unwrap();
            let (image, kdir) = a.custom.clone().unwrap();
            assert_eq!(kdir, PathBuf::from("/o/linux"));
            assert!(image.ends_with("bzImage") || image.ends_with("arch-bzImage"));
            assert!(a.explicit && a.debug_kernels.is_empty());
            assert_eq!(a.scenarios, scenarios);
            assert_eq!(cells(&a), ["4x4/ipv4"]);
        }
        // the distribution kernel
        let a = args(
            "--kernel 6.1-deb --debug-kernel none --topology 4x4 \
             --scenario link,steer,migrate,expiry,misroute",
        )
        .unwrap();
        assert_eq!(a.kernels, ["6.1-deb"]);
        assert_eq!(
            a.scenarios,
            ["link", "steer", "migrate", "expiry", "misroute"]
        );
    }

    #[test]
    fn demo() {
        // scripts/demo: `demo "$@"`
        let a = args("demo").unwrap();
        assert!(a.demo);
        assert_eq!(a.kernels, ["7.3"]);
        assert_eq!(a.debug_kernels, ["7.3"]);
        let s = &a.settings;
        assert_eq!((s.flows, s.rate), (256, 4000));
        assert_eq!((s.sock_flow_entries, s.flow_cnt), (1 << 22, 1 << 20));
        assert_eq!(cells(&a), ["4x4/ipv4"]);
        assert_eq!((s.queues, s.cpus, s.family), (4, 4, Family::Ipv4));
        let a =
            args("demo --flows 8 --flows 64 --topology 2x4/ch2,4x4 --family ipv6 --kernel 6.12")
                .unwrap();
        let s = &a.settings;
        assert_eq!(
            (s.flows, s.rate, a.kernels),
            (64, 4000, vec!["6.12".into()])
        );
        assert_eq!(
            (s.queues, s.cpus, s.channels, s.family),
            (2, 4, Some(2), Family::Ipv6)
        );
        assert!(matches!(
            parse("demo --list").unwrap().into_parts(),
            Parts::Suite(true, o) if o.list
        ));
    }

    #[test]
    fn run_takes_one_kernel_and_one_action() {
        let run = |line: &str| match parse(line).map(Cli::into_parts) {
            Ok(Parts::Run(r)) => Ok(r),
            Ok(Parts::Suite(..)) => Err("not run".to_string()),
            Err(e) => Err(e.to_string()),
        };
        let r = run("run --kernel-tree /k --exec true").unwrap();
        assert_eq!(
            (
                r.kernel_tree.as_deref(),
                r.exec.as_deref(),
                r.flows,
                r.queues,
                r.cpus
            ),
            (Some(std::path::Path::new("/k")), Some("true"), 16, 4, 4)
        );
        // --series is the run-qemu spelling of --kernel.
        assert_eq!(
            run("run --series 6.12").unwrap().kernel.as_deref(),
            Some("6.12")
        );
        for bad in [
            "run",                                // no kernel
            "run --kernel-tree /k --kernel 7.3",  // two kernels
            "run --kernel 7.3 --kernel-image /b", // --kernel-image goes with a tree
            "run --kernel 7.3 --exec x --shell",  // two actions
            "run --kernel 7.3 --flows 5000",      // out of range
            "run --kernel 7.3 --queues 0",
        ] {
            assert!(run(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn expect_rfs_oob_is_off_unless_asked() {
        assert!(!args("--kernel 7.3").unwrap().settings.expect_rfs_oob);
        let a = args(
            "--kernel-image /p/bzImage --kdir /p/build --debug-kernel none --topology 4x4 \
             --scenario rfs-unequal-tables --expect-rfs-oob",
        )
        .unwrap();
        assert!(a.settings.expect_rfs_oob && a.custom.is_some());
    }

    #[test]
    fn readme_command_lines_and_every_option() {
        let a = args("--kernel 7.3 --scenario steer").unwrap();
        assert_eq!(
            (a.kernels, a.scenarios),
            (vec!["7.3".into()], vec!["steer".into()])
        );
        assert_eq!(cells(&args("--queues 3 --cpus 4").unwrap()), ["3x4/ipv4"]);
        assert_eq!(
            cells(&args("--cpus 2 --channels 2").unwrap()),
            ["4x2/ch2/ipv4"]
        );
        assert_eq!(
            cells(&args("--topology 4x2/ch4 --scenario link,steer").unwrap()),
            ["4x2/ch4/ipv4"]
        );
        let a = args(
            "--flows 10 --rate 5 --measure 7 --flow-cnt 256 --sock-flow-entries 1024 --idle-ms 500 \
             --artifacts /a --full-matrix --scenario link --scenario steer,migrate --rate 6",
        )
        .unwrap();
        let s = &a.settings;
        assert_eq!(
            (s.flows, s.rate, s.measure),
            (10, 6, Duration::from_secs(7))
        );
        assert_eq!(
            (s.flow_cnt, s.sock_flow_entries, s.module.idle_timeout_ms),
            (256, 1024, 500)
        );
        assert_eq!(a.artifacts, Some(PathBuf::from("/a")));
        assert!(a.full_matrix);
        // --scenario adds up; the others take their last value
        assert_eq!(a.scenarios, ["link", "steer", "migrate"]);
        assert!(parse("--list").unwrap().opts.list);
    }

    #[test]
    fn bad_values_are_refused() {
        for (bad, msg) in [
            ("--cpus 17", "--cpus must be in 1..=16, got 17"),
            ("--flows x", "--flows: \"x\" is not a number"),
            ("--topology 4x4,4", "expected QUEUESxCPUS"),
            ("--topology 2x4/ch3", "more than the 2 queue pairs"),
            ("--family ipv5", "expected ipv4, ipv6 or mixed"),
            ("--kernel 7.3 demo", "cannot be used with"),
            ("demo demo", "unexpected argument"),
            ("help", "unrecognized subcommand"),
            ("--nope", "unexpected argument"),
        ] {
            let e = parse(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            assert!(e.to_string().contains(msg), "{bad:?}: {e}");
        }
        for (bad, msg) in [
            ("--kdir /l", "--kernel-image and --kdir go together"),
            (
                "--topology 4x4 --cpus 2",
                "--topology and --cpus/--queues are alternatives",
            ),
            (
                "--channels 2 --topology 4x4",
                "--channels goes with --cpus/--queues",
            ),
            ("--channels 5", "more than the 4 queue pairs"),
            (
                "--scenario link,nope",
                "unknown scenario \"nope\"; known: link, steer",
            ),
            (
                "--kernel 7.x",
                "--kernel \"7.x\": expected a series like 6.12 or 7.3",
            ),
            ("--kernel 6.12,", "--kernel \"\": expected a series"),
        ] {
            let e = args(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(e.contains(msg), "{bad:?}: {e}");
        }
    }
}
