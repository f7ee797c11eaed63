//! vnic-guest-suite: boots real kernels under QEMU on a real `vnic serve`
//! and runs the guest scenarios (`--list`), or the demo.
//!
//! Prints one line per scenario and kernel, then `N passed, M failed`;
//! exits non-zero on any failure.

use guest_tests::harness::build::{self, Kernel};
use guest_tests::harness::{parse_num as num, repo_root, timestamp, Artifacts};
use guest_tests::scenarios::{
    self, report_line, BootKind, Family, Outcome, Session, Settings, Tools, Topology,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const HELP: &str = "\
vnic-guest-suite: the vnic guest test suite (real kernels, real QEMU, real vnic)

USAGE:
    vnic-guest-suite [OPTIONS]          run the scenarios
    vnic-guest-suite demo [OPTIONS]     boot a 7.3 guest, steer ~256 flows, print a summary

OPTIONS:
    --kernel LIST         kernel series to test, comma-separated (default 6.12,7.3;
                          built into the cache by images/build-kernel when missing);
                          6.1-deb: Debian bookworm's prebuilt 6.1 kernel and headers
                          (images/fetch-distro-kernel; virtio drivers as modules, the
                          module built with Debian's kbuild; no debug variant)
    --kernel-image BZIMAGE --kdir TREE
                          test your own kernel instead (TREE: its built source tree)
    --scenario NAME       run only these (repeatable or comma-separated; default: all,
                          in canonical order). Each kernel boots once for the gen-peer
                          scenarios, once more for tcp-tap (tap peer in a network
                          namespace, needs root) and, for the kernels of --debug-kernel,
                          once more on the debug variant (KASAN, lockdep, kmemleak) for
                          unload-reload. --list shows them.
    --topology LIST       guest shapes, comma-separated QUEUESxCPUS[/chN]: QUEUES queue
                          pairs offered by vnic and QEMU, CPUS vCPUs, /chN `ethtool -L
                          combined N` after boot (else the guest uses virtio_net's
                          min(QUEUES, CPUS) pairs)
    --family LIST         address families of the steering flows: ipv4, ipv6, mixed (even
                          flows IPv4, odd IPv6); the gen peer answers ARP/ICMP and
                          NS/ICMPv6 echo
                          The suite runs every (topology, family) cell of these two lists
                          on every kernel; without either it runs the default matrix:
                          4x4 IPv4 and 4x4/ipv6 on every kernel, 2x4, 4x2, 1x2 and
                          2x4/mixed on one kernel each (round robin over --kernel).
                          4x4 IPv4 runs every selected scenario; other shapes the matrix
                          scenarios (link, steer, migrate, misroute, drop, corrupt, bad-csum with 2+
                          pairs, rps with 1 pair); IPv6 and mixed cells link, steer,
                          migrate, expiry, misroute, drop, corrupt, bad-csum; --scenario runs what it names wherever it
                          can run (--list).
    --full-matrix         every cell of the default matrix on every kernel
    --cpus N --queues M   one topology: M queue pairs x N vCPUs (instead of --topology)
    --channels N          with --cpus/--queues: `ethtool -L combined N` after boot
    --debug-kernel LIST   kernels whose unload-reload runs on the debug variant (default:
                          every --kernel; `none` for none). Other kernels run unload-reload
                          in their default boot: same cycles and checks, without
                          KASAN/kmemleak (the report says which). A debug build takes
                          ~11-14 min on 2 cores the first time (cached after).
    --flows N             flows in steer/migrate/expiry and the stress workloads (default 64; demo 256)
    --rate PPS            generator packets per second over all flows (default 2000; demo 4000)
    --measure SECS        measurement window after warm-up (default 5)
    --flow-cnt N          rps_flow_cnt per rx queue (default 262144, demo 1048576: low slot-collision odds)
    --sock-flow-entries N net.core.rps_sock_flow_entries (default 1048576; demo 4194304)
    --idle-ms MS          the idle backstop (expiry=idle:MS) the expiry scenarios
                          turn on once the flows stopped (default 2000)
    --artifacts DIR       where logs, traces and snapshots go
                          (default target/guest-tests/<UTC time>)
    --list                the scenarios and the boot each needs
    -h, --help            this text

ENVIRONMENT:
    VNIC_BIN     vnic binary (default: built with cargo --release)
    VNIC_AGENT   static guest agent (default: built into target/agent)
    VNIC_QEMU    qemu-system-x86_64 to use;  VNIC_ACCEL=tcg|kvm (default auto: KVM if its probe boot works)
";

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

fn parse_args() -> Result<Args, String> {
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
    let (mut topo_list, mut cpus, mut queues, mut channels) = (None, None, None, None);
    let mut families: Option<Vec<Family>> = None;
    let mut debug_given = false;
    let mut it = std::env::args().skip(1).peekable();
    if it.peek().map(String::as_str) == Some("demo") {
        it.next();
        a.demo = true;
        a.kernels = vec!["7.3".into()];
        a.settings.flows = 256;
        a.settings.rate = 4000;
        a.settings.sock_flow_entries = 1 << 22;
        a.settings.flow_cnt = 1 << 20;
    }
    let (mut image, mut kdir) = (None, None);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value (see --help)"))
        };
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            "--list" => {
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
                std::process::exit(0);
            }
            "--debug-kernel" => {
                let v = val("--debug-kernel")?;
                debug_given = true;
                a.debug_kernels = if v == "none" {
                    Vec::new()
                } else {
                    v.split(',').map(str::to_string).collect()
                };
            }
            "--kernel" => a.kernels = val("--kernel")?.split(',').map(str::to_string).collect(),
            "--kernel-image" => image = Some(PathBuf::from(val("--kernel-image")?)),
            "--kdir" => kdir = Some(PathBuf::from(val("--kdir")?)),
            "--scenario" => a
                .scenarios
                .extend(val("--scenario")?.split(',').map(str::to_string)),
            "--topology" => topo_list = Some(val("--topology")?),
            "--full-matrix" => a.full_matrix = true,
            "--family" => {
                families = Some(
                    val("--family")?
                        .split(',')
                        .map(|f| Family::parse(f).map_err(|e| e.0))
                        .collect::<Result<_, _>>()?,
                );
            }
            "--cpus" => cpus = Some(num(&val("--cpus")?, "--cpus", 1, 16)? as u16),
            "--queues" => queues = Some(num(&val("--queues")?, "--queues", 1, 16)? as u16),
            "--channels" => channels = Some(num(&val("--channels")?, "--channels", 1, 16)? as u16),
            "--flows" => a.settings.flows = num(&val("--flows")?, "--flows", 1, 4096)? as usize,
            "--rate" => a.settings.rate = num(&val("--rate")?, "--rate", 1, 1_000_000)? as u32,
            "--measure" => {
                a.settings.measure =
                    Duration::from_secs(num(&val("--measure")?, "--measure", 1, 600)?);
            }
            "--flow-cnt" => {
                a.settings.flow_cnt = num(&val("--flow-cnt")?, "--flow-cnt", 1, 1 << 24)? as u32;
            }
            "--sock-flow-entries" => {
                a.settings.sock_flow_entries = num(
                    &val("--sock-flow-entries")?,
                    "--sock-flow-entries",
                    1,
                    1 << 29,
                )? as u32;
            }
            "--idle-ms" => {
                a.settings.module.idle_timeout_ms =
                    num(&val("--idle-ms")?, "--idle-ms", 1, 600_000)? as u32;
            }
            "--artifacts" => a.artifacts = Some(PathBuf::from(val("--artifacts")?)),
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    match (image, kdir) {
        (Some(i), Some(k)) => a.custom = Some((i, k)),
        (None, None) => {}
        _ => return Err("--kernel-image and --kdir go together".into()),
    }
    let shape_given =
        topo_list.is_some() || cpus.is_some() || queues.is_some() || channels.is_some();
    let topologies: Vec<Topology> = match (topo_list, cpus, queues) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err("--topology and --cpus/--queues are alternatives".into())
        }
        (Some(l), None, None) => {
            if channels.is_some() {
                return Err("--channels goes with --cpus/--queues (in --topology: 4x2/ch4)".into());
            }
            l.split(',')
                .map(|t| Topology::parse(t).map_err(|e| e.0))
                .collect::<Result<_, _>>()?
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
            one.validate().map_err(|e| e.0)?;
            vec![one]
        }
    };
    a.cells = if !shape_given && families.is_none() {
        DEFAULT_CELLS
            .iter()
            .map(|&(t, f, one)| Topology::parse(t).map(|t| (t, f, one)).map_err(|e| e.0))
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
            return Err(format!(
                "unknown scenario {s:?}; known: {}",
                scenarios::all().join(", ")
            ));
        }
    }
    for k in &a.kernels {
        let series = k.strip_suffix(build::DISTRO_SUFFIX).unwrap_or(k);
        if !series
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        {
            return Err(format!(
                "--kernel {k:?}: expected a series like 6.12 or 7.3, or 6.1-deb (Debian's prebuilt kernel)"
            ));
        }
    }
    if a.settings.flows > usize::from(u16::MAX - scenarios::BASE_PORT) {
        return Err("too many flows".into());
    }
    if !debug_given {
        a.debug_kernels.clone_from(&a.kernels);
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
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
    let mut extra_failures = 0usize;
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
        BootKind::Debug
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
    let mut failed = outcomes.len() - passed + extra_failures;
    // One retried boot (a TCG hang or a QEMU assertion) is tolerated and
    // shown; a second in one run is no longer chance and fails the run.
    if retried_boots > MAX_RETRIED_BOOTS {
        failed += 1;
        println!(
            "retried boots: FAIL  {retried_boots} boots needed a second attempt, at most {MAX_RETRIED_BOOTS} tolerated per run"
        );
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
    extra_failures: &mut usize,
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
            *extra_failures += 1;
            println!(
                "teardown {blabel:<13} FAIL  guest unresponsive after {s}: rebooting for {} more scenario(s)",
                rest.len()
            );
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
        *extra_failures += 1;
        println!("teardown {blabel:<13} FAIL");
        for p in problems {
            println!("    - {p}");
        }
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
        let art = Artifacts::new(art_root.join(&label))?;
        eprintln!(
            "[demo] booting {label} with {} vCPUs / {} queue pairs",
            args.settings.cpus, args.settings.queues
        );
        let mut s = Session::boot(
            kernel,
            &tools,
            args.settings.clone(),
            art,
            BootKind::Default,
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
