//! One [`Session`] is one booted guest (one kernel): its boot and
//! teardown, the runner of one scenario ([`Session::run`]), and the
//! prerequisites scenarios ask for (network up, module loaded). The steering
//! workload the scenarios share is in `workload.rs`.

use super::{
    stress, BootKind, Family, Flow, Scenario, Topology, GUEST_IP, GUEST_IP6, GUEST_PREFIX,
    GUEST_PREFIX6, IFNAME,
};
use crate::harness::build::{self, Kernel};
use crate::harness::guest::{BootSpec, Guest};
use crate::harness::qemu::QemuOptions;
use crate::harness::vnic::VnicOptions;
use crate::harness::{wait_for, Artifacts, BootError, Context, Result};
use crate::module::{self, ModuleCounters, ModuleParams};
use crate::proto::Request;
use crate::{bail, ensure};
use arfs::Rss;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vnic_ctl_proto::Stats;

/// Knobs of a run. Durations are short on purpose (TCG); the assertions are not.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cpus: u16,
    /// Queue pairs vnic and QEMU offer.
    pub queues: u16,
    /// Queue pairs set with `ethtool -L` once the network is up (None:
    /// virtio_net's default, min(queues, cpus)).
    pub channels: Option<u16>,
    /// Address family of the steering workload's flows.
    pub family: Family,
    pub flows: usize,
    /// Generator packets per second over all flows.
    pub rate: u32,
    /// Packets per flow in the link scenario.
    pub link_packets: u32,
    /// rps_flow_cnt per rx queue. The issue-4 scenarios test steering,
    /// not slot collisions (issue 6 does). A collision is not a device
    /// bug, but 7.3 then never asks to steer one of the flows and 6.12
    /// makes them fight over the filter, so the run would fail: the shared
    /// steering workload chooses its ports so that no two flows share a
    /// slot in this boot (ports.rs); the other workloads rely on the size
    /// (64 flows in 2^18 slots: about 1 in 1,000 placements collides).
    pub flow_cnt: u32,
    /// net.core.rps_sock_flow_entries (power of two). Two flows sharing an
    /// entry lose RFS while they overwrite each other: 64 flows in 2^20
    /// entries collide with about 0.2% probability, which the steering
    /// workload's port choice also rules out (ports.rs).
    pub sock_flow_entries: u32,
    /// Measurement window after warm-up.
    pub measure: Duration,
    /// Time given to the guest to program every filter (warm-up bound).
    pub warmup_timeout: Duration,
    /// Minimum share of a flow's packets processed on its receiver's CPU.
    pub min_on_cpu: f64,
    pub module: ModuleParams,
    pub boot_timeout: Duration,
    /// A shell on the guest's console, which is this terminal (the agent
    /// runs beside it: `vnic-guest-suite run --shell`).
    pub shell: bool,
    /// The kernel under test has the pre-fix `set_rps_cpu()`
    /// (images/patches/7.3-set-rps-cpu-prefix-flow-id.patch):
    /// rfs-unequal-tables asserts the out-of-bounds slot and KASAN's report
    /// instead of their absence.
    pub expect_rfs_oob: bool,
}

impl Settings {
    pub fn topology(&self) -> Topology {
        Topology {
            queues: self.queues,
            cpus: self.cpus,
            channels: self.channels,
        }
    }

    pub fn set_topology(&mut self, t: Topology) {
        self.queues = t.queues;
        self.cpus = t.cpus;
        self.channels = t.channels;
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cpus: 4,
            queues: 4,
            channels: None,
            family: Family::Ipv4,
            flows: 64,
            rate: 2000,
            link_packets: 40,
            flow_cnt: 1 << 18,
            sock_flow_entries: 1 << 20,
            measure: Duration::from_secs(5),
            warmup_timeout: Duration::from_mins(1),
            min_on_cpu: 0.95,
            module: ModuleParams::default(),
            boot_timeout: Duration::from_mins(3),
            shell: false,
            expect_rfs_oob: false,
        }
    }
}

/// What one scenario on one kernel gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub scenario: String,
    pub kernel: String,
    pub figures: String,
    pub failures: Vec<String>,
    pub elapsed: Duration,
    /// Why the boot this scenario ran in was a second attempt
    /// ([`Session::boot_in`]), if it was: shown on the scenario's line.
    pub retried_boot: Option<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Collects assertion failures of one scenario (all are reported, not only the first).
#[derive(Default)]
pub(super) struct Checks {
    pub(super) failures: Vec<String>,
}

impl Checks {
    pub(super) fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(msg());
        }
    }
}

pub struct Session {
    pub kernel: Kernel,
    pub guest: Guest,
    pub settings: Settings,
    pub(super) module_path: String,
    /// Why the module could not be built for this kernel (then every
    /// scenario that needs it fails with this reason).
    pub(super) module_error: Option<String>,
    /// RSS over the queue pairs in use.
    pub(super) rss: Rss,
    /// The queue pairs the guest uses now (`ethtool -L` changes it).
    pub pairs: u16,
    /// The rx queue local to each CPU with `pairs` pairs.
    pub(super) cpu_q: Vec<usize>,
    pub(super) net_up: bool,
    pub(super) module_loaded: bool,
    /// The running steering workload (flows and their current CPUs).
    pub(super) flows: Vec<Flow>,
    pub(super) gen_running: bool,
    /// Generator set of each workload flow.
    pub(super) gen_sets: Vec<u32>,
    /// The workload's last quiet point (issue 23's delivery check starts
    /// from it); None when no workload runs.
    pub(super) delivery_mark: Option<super::delivery::Mark>,
    /// The span of the last delivery window (`Session::check_order` judges it).
    pub(super) last_span: Option<super::delivery::Span>,
    /// Trace lines consumed so far (scenarios look at what came after).
    pub(super) trace_mark: usize,
    /// The host network namespace of a tap boot (dropped after the guest).
    pub(super) tapnet: Option<stress::TapNet>,
    /// What this boot is (a debug boot runs the debug kernel variant).
    pub(super) kind: BootKind,
    /// The table capacity vnic started with (fault scenarios shrink it and
    /// put this back).
    pub(super) boot_capacity: u32,
    /// Why this boot is the second attempt of [`Session::boot_in`] (the
    /// first hung or QEMU aborted), if it is. Every scenario's line in it
    /// says so, and the suite counts it.
    pub retried_boot: Option<String>,
}

/// Paths of the host-side pieces shared by all kernels.
pub struct Tools {
    pub vnic_bin: PathBuf,
    pub agent: PathBuf,
}

impl Tools {
    /// Build (or find up to date) the vnic daemon and the static agent.
    pub fn build() -> Result<Self> {
        Ok(Tools {
            agent: build::agent()?,
            vnic_bin: build::vnic_bin()?,
        })
    }
}

impl Session {
    /// Build the module and initramfs for `kernel`, boot it on a fresh vnic.
    /// The failures [`Session::boot_in`] may repeat a boot for have their
    /// own [`BootError`] kinds.
    pub fn boot(
        kernel: Kernel,
        tools: &Tools,
        settings: Settings,
        art: Artifacts,
        kind: BootKind,
    ) -> Result<Self, BootError> {
        // One vCPU: under instruction counting the vCPUs take turns, and a
        // lock held on one would be charged the others' turns.
        let settings = if kind == BootKind::Timed {
            Settings {
                cpus: 1,
                ..settings
            }
        } else {
            settings
        };
        let (kos, module_error) = match build::module(&kernel.kdir, &art.path("kmod-build")) {
            Ok(kos) => (kos, None),
            Err(e) => (Vec::new(), Some(e.0)),
        };
        let mut all_kos = kernel.boot_modules.clone();
        all_kos.extend(kos.iter().cloned());
        let initrd = build::initramfs(&kernel.kdir, &tools.agent, &all_kos)?;
        // The kernel's own modules (a distribution kernel's virtio drivers)
        // are loaded by /init before the agent starts.
        let names: Vec<String> = kernel
            .boot_modules
            .iter()
            .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .collect();
        let mut append = if names.is_empty() {
            String::new()
        } else {
            format!("vnic.modules={}", names.join(","))
        };
        if settings.shell {
            // /init starts the agent in the background and a shell on the
            // console (images/init.sh).
            append.push_str(" vnic.agent=shell");
        }
        let release = build::kernel_release(&kernel.kdir)?;
        let mut vnic = VnicOptions {
            queues: settings.queues,
            ..VnicOptions::default()
        };
        if matches!(kind, BootKind::Debug | BootKind::Timed) {
            // debugfs-65k and lock-holds fill the protocol's whole id space.
            vnic.extra
                .extend(["--table-capacity".to_string(), "65535".to_string()]);
        }
        let tapnet = match kind {
            BootKind::Tap => Some(stress::TapNet::create(&mut vnic)?),
            BootKind::Default | BootKind::Debug | BootKind::Timed => None,
        };
        let spec = BootSpec {
            kernel: &kernel,
            initrd: &initrd,
            vnic_bin: &tools.vnic_bin,
            vnic,
            qemu: QemuOptions {
                cpus: settings.cpus,
                queues: settings.queues,
                append,
                console_stdio: settings.shell,
                icount: kind == BootKind::Timed,
                ..QemuOptions::default()
            },
            boot_timeout: settings.boot_timeout,
        };
        let mut guest = Guest::boot(&spec, art)?;
        // Every vCPU runs: a TCG vCPU that stopped scheduling early in a boot
        // (seen 2026-12-03: CPU 2 of 4 answered no IPI from 1.5 s on, no
        // timer softirq, its pinned receivers never ran) would otherwise fail
        // the scenarios that pin work to it, as if the device had.
        let probe: crate::proto::CpuProbe = guest.agent.call(
            &Request::CpuProbe {
                timeout_ms: CPU_PROBE_MS,
            },
            Duration::from_millis(CPU_PROBE_MS + 5_000),
        )?;
        let configured = usize::from(settings.cpus);
        if !probe.missing.is_empty() || probe.cpus != configured {
            return Err(BootError::StuckVcpu {
                probe,
                configured,
                timeout: Duration::from_millis(CPU_PROBE_MS),
            });
        }
        let capacity = guest.ctl.stats()?.table.capacity;
        let boot_capacity = Some(capacity)
            .filter(|&c| c > 0)
            .ok_or_else(|| format!("vnic reports a table capacity of {capacity}"))?;
        let pairs = settings.topology().pairs();
        let mut s = Session {
            rss: Rss::new(pairs),
            pairs,
            cpu_q: Topology::cpu_queue_map(pairs, settings.cpus),
            kernel,
            guest,
            settings,
            module_path: build::guest_module_path(&release),
            module_error,
            net_up: false,
            module_loaded: false,
            flows: Vec::new(),
            gen_running: false,
            gen_sets: Vec::new(),
            delivery_mark: None,
            last_span: None,
            trace_mark: 0,
            tapnet,
            kind,
            boot_capacity,
            retried_boot: None,
        };
        if let Some(t) = &s.tapnet {
            t.configure()?;
        }
        let bad = s.guest.kernel_failures()?;
        if !bad.is_empty() {
            return Err(BootError::KernelProblems(bad));
        }
        Ok(s)
    }

    /// [`Session::boot`] with its artifacts in `dir`, and once more into
    /// `dir/retry` when QEMU itself aborted on an internal assertion (TCG
    /// under load sometimes does early in a boot: seen iotlb_to_section,
    /// msix_table_mmio_read), or when the guest never answered the agent's
    /// hello (a TCG guest once hung in SMP bring-up, its console stopping
    /// after the MTRR lines, before virtio-net probed), or when the kernel
    /// reported its first problem before it had enumerated any PCI device
    /// ([`before_any_device`]), or when a guest CPU ran no thread pinned to
    /// it ([`vcpu_stuck`]). None is vnic's doing; `say` is told why the boot is repeated, with the first
    /// error. Any other failure, or a second failure, is returned: a
    /// guest that cannot boot at all fails twice.
    pub fn boot_in(
        kernel: Kernel,
        tools: &Tools,
        settings: Settings,
        dir: &std::path::Path,
        kind: BootKind,
        say: impl Fn(&str),
    ) -> Result<Self> {
        let art = Artifacts::new(dir.to_path_buf())?;
        match Self::boot(kernel.clone(), tools, settings.clone(), art, kind) {
            Err(e) => match repeat_reason(dir, &e) {
                Some(why) => {
                    say(&format!("{why}; booting once more ({e})"));
                    let art = Artifacts::new(dir.join("retry"))?;
                    let mut s = Self::boot(kernel, tools, settings, art, kind)?;
                    s.retried_boot = Some(why);
                    Ok(s)
                }
                None => Err(e.into()),
            },
            Ok(s) => Ok(s),
        }
    }

    /// `rmmod` the guest module (its FLUSH empties the device table).
    pub(super) fn rmmod(&mut self, timeout: Duration) -> Result<()> {
        self.guest.agent.call_value(
            &Request::ModuleUnload {
                name: module::NAME.into(),
            },
            timeout,
        )?;
        self.module_loaded = false;
        Ok(())
    }

    /// Wait (up to 10 s) until the device holds no filter.
    pub(super) fn wait_device_empty(&mut self, what: &str) -> Result<()> {
        let ctl = &mut self.guest.ctl;
        wait_for(Duration::from_secs(10), what, || {
            Ok((ctl.table()?.live == 0).then_some(()))
        })
    }

    /// Whether the guest stopped answering and did not answer again since
    /// (one `hello`, waited for up to [`crate::harness::agent::WEDGED_TIMEOUT`]).
    pub fn wedged(&mut self) -> bool {
        if self.guest.agent.unresponsive.is_none() {
            return false;
        }
        let _ = self
            .guest
            .agent
            .call_value(&Request::Hello, Duration::from_secs(5));
        self.guest.agent.unresponsive.is_some()
    }

    /// Run one scenario, never panicking; the outcome carries the verdict.
    pub fn run(&mut self, name: &str) -> Outcome {
        let start = Instant::now();
        // What boot or an earlier teardown read is not this scenario's.
        let _ = crate::harness::take_missing();
        let mut checks = Checks::default();
        let r = match Scenario::find(name) {
            Some(sc) => sc.call(self, &mut checks),
            None => Err(format!("unknown scenario {name:?}").into()),
        };
        if let Some(first) = self.guest.agent.unresponsive.clone() {
            // Look at the hung guest before anything else moves.
            let report = self.guest.stall_report(name);
            checks.failures.push(format!(
                "guest unresponsive (no reply to {first}):\n{report}"
            ));
        }
        if name == "link" {
            // link's workload is its own: make sure it is gone even when
            // the scenario stopped half-way (errors here mean it already is).
            let _ = self
                .guest
                .agent
                .call_value(&Request::UdpStop, Duration::from_secs(30));
            let _ = self.guest.ctl.gen_stop(None);
        }
        let figures = match r {
            Ok(f) => f,
            Err(e) => {
                checks.failures.push(format!("error: {e}"));
                String::new()
            }
        };
        for m in crate::harness::take_missing() {
            checks.failures.push(format!(
                "counter {m} was read but is absent (never read as 0)"
            ));
        }
        // Any WARN/BUG/oops/KASAN/lockdep report fails the scenario it happened in.
        match self.guest.kernel_failures() {
            Ok(bad) => {
                for b in bad {
                    checks.failures.push(format!("kernel: {b}"));
                }
            }
            Err(e) => {
                checks
                    .failures
                    .push(format!("cannot read the guest kernel log: {e}"));
                // The guest may be gone (panic): the console still tells.
                for line in self.guest.qemu.console_text().lines() {
                    if crate::procfs::is_kernel_failure(line) {
                        checks.failures.push(format!("console: {line}"));
                    }
                }
                if let Some(st) = self.guest.qemu.exited() {
                    checks.failures.push(format!(
                        "QEMU exited ({st}); console tail:\n{}",
                        crate::harness::guest::tail(&self.guest.qemu.console_text(), 15)
                    ));
                }
            }
        }
        self.guest.collect(
            &format!("after-{name}"),
            Some(module::DEBUGFS_DIR).filter(|_| self.module_loaded),
        );
        Outcome {
            scenario: name.to_string(),
            kernel: self.kernel.label.clone(),
            figures,
            failures: checks.failures,
            elapsed: start.elapsed(),
            retried_boot: self.retried_boot.clone(),
        }
    }

    /// Unload the module (clean teardown is part of what is tested), check
    /// the log, power off.
    pub fn finish(mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.gen_running {
            let _ = self.guest.ctl.gen_stop(None);
        }
        let _ = self
            .guest
            .agent
            .call_value(&Request::UdpStop, Duration::from_secs(30));
        if self.module_loaded {
            if let Err(e) = self.rmmod(Duration::from_secs(30)) {
                problems.push(format!("rmmod {}: {e}", module::NAME));
            } else if let Err(e) =
                // Unloading flushes the device table.
                self.wait_device_empty("the device table to be flushed on rmmod")
            {
                problems.push(e.0);
            }
        }
        // A real virtio_net driver never posts a broken chain nor runs its
        // avail index ahead: anything counted here means the device
        // misread a ring.
        match self.guest.ctl.stats() {
            Ok(st) => problems.extend(ring_problems(&st, self.settings.queues)),
            Err(e) => problems.push(format!("ctl stats at teardown: {e}")),
        }
        match self.guest.kernel_failures() {
            Ok(bad) => problems.extend(
                bad.into_iter()
                    .map(|b| format!("kernel (at teardown): {b}")),
            ),
            Err(e) => problems.push(format!("cannot read the guest kernel log at teardown: {e}")),
        }
        for m in crate::harness::take_missing() {
            problems.push(format!(
                "counter {m} was read at teardown but is absent (never read as 0)"
            ));
        }
        self.guest.collect("final", None);
        if let Err(e) = self.guest.shutdown() {
            problems.push(format!("shutdown: {e}"));
        }
        problems
    }

    // ---- prerequisites -------------------------------------------------

    pub(super) fn ensure_net(&mut self) -> Result<()> {
        if self.net_up {
            return Ok(());
        }
        self.guest.agent.call_value(
            &Request::NetSetup {
                ifname: IFNAME.into(),
                addr: GUEST_IP.to_string(),
                prefix: GUEST_PREFIX,
                addr6: Some(GUEST_IP6.to_string()),
                prefix6: GUEST_PREFIX6,
            },
            Duration::from_secs(30),
        )?;
        self.net_up = true;
        if let Some(ch) = self.settings.channels {
            let got: u32 = self.guest.agent.req(Request::SetChannels {
                ifname: IFNAME.into(),
                combined: u32::from(ch),
            })?;
            ensure!(
                got == u32::from(ch),
                "ethtool -L {IFNAME} combined {ch}: the device has {got}"
            );
            self.set_pairs(ch);
        }
        Ok(())
    }

    /// The rx queue local to `cpu` with the pairs in use.
    pub(super) fn queue_of_cpu(&self, cpu: usize) -> usize {
        self.cpu_q.get(cpu).copied().unwrap_or(0)
    }

    /// The guest now uses `n` queue pairs (after `ethtool -L`): RSS, the
    /// CPU -> queue map and every flow's queues follow.
    pub(super) fn set_pairs(&mut self, n: u16) {
        self.pairs = n;
        self.rss = Rss::new(n);
        self.cpu_q = Topology::cpu_queue_map(n, self.settings.cpus);
        for i in 0..self.flows.len() {
            let f = &self.flows[i];
            let (rss_q, rx_q) = (
                usize::from(self.rss.queue_for_key(&f.key)),
                self.queue_of_cpu(f.cpu),
            );
            self.flows[i].rss_q = rss_q;
            self.flows[i].rx_q = rx_q;
        }
    }

    pub(super) fn ensure_module(&mut self) -> Result<()> {
        self.ensure_net()?;
        if self.module_loaded {
            return Ok(());
        }
        if let Some(e) = &self.module_error {
            bail!("the guest module is not available for this kernel: {e}");
        }
        let st = &self.settings;
        let entries = st.sock_flow_entries.next_power_of_two();
        self.guest.agent.req::<serde_json::Value>(Request::Rfs {
            ifname: IFNAME.into(),
            sock_flow_entries: entries,
            flow_cnt: st.flow_cnt,
            rps_cpus: None,
        })?;
        let params = st.module.to_params(IFNAME);
        self.guest
            .agent
            .call_value(
                &Request::ModuleLoad {
                    path: self.module_path.clone(),
                    params,
                },
                Duration::from_mins(1),
            )
            .ctx("loading vnic_arfs.ko")?;
        self.module_loaded = true;
        // The module installs itself (ndo, rmap, NTUPLE) once the device
        // answered its HELLO with CAPS.
        let mut last = String::new();
        let r = wait_for(
            Duration::from_secs(30),
            "the module to attach to eth0 (state active)",
            || {
                let m = self.module_counters()?;
                last = m.state(IFNAME).unwrap_or("<no debugfs state>").to_string();
                Ok((last == "active").then_some(()))
            },
        );
        if let Err(e) = r {
            bail!("{e}: last state {last:?}");
        }
        // What a user would do (`ethtool -K eth0 ntuple on`): must be accepted
        // and leave the feature on.
        self.guest.agent.req::<bool>(Request::SetFeature {
            ifname: IFNAME.into(),
            feature: "rx-ntuple-filter".into(),
            on: true,
        })?;
        Ok(())
    }

    pub(super) fn module_counters(&mut self) -> Result<ModuleCounters> {
        let files: crate::proto::DirContents = self.guest.agent.req(Request::ReadDir {
            path: module::DEBUGFS_DIR.into(),
        })?;
        Ok(ModuleCounters::parse(&files))
    }
}

/// One line of the suite's report.
pub fn report_line(o: &Outcome) -> String {
    let retried = o
        .retried_boot
        .as_ref()
        .map(|why| format!("[retried boot: {why}] "))
        .unwrap_or_default();
    let mut s = format!(
        "{:<8} {:<13} {:<4} {:>6.1}s  {retried}{}",
        o.scenario,
        o.kernel,
        if o.passed() { "PASS" } else { "FAIL" },
        o.elapsed.as_secs_f64(),
        o.figures
    );
    for f in &o.failures {
        let _ = write!(s, "\n    - {f}");
    }
    s
}

/// What `ctl stats` shows wrong with the rings of a daemon that offered
/// `queues` queue pairs and served a real virtio_net driver: a bad chain
/// counted, a ring stopped, or any of it missing. A real driver never
/// posts a broken chain nor runs its avail index ahead, so a count here
/// means the device misread a ring; and a counter that is absent (no
/// `queues` array, fewer entries than queue pairs, a field gone) is a
/// problem too, never read as 0.
pub(super) fn ring_problems(st: &Stats, queues: u16) -> Vec<String> {
    // (A reply without `queues`, or a queue without one of these fields,
    // is not a `Stats`: `ctl stats` fails and that is the problem.)
    let mut problems = Vec::new();
    let qs = &st.queues;
    if qs.len() != usize::from(queues) {
        problems.push(format!(
            "ctl stats lists {} queue(s), the daemon offers {queues} pairs",
            qs.len()
        ));
    }
    for q in 0..usize::from(queues) {
        let Some(e) = qs.get(q) else {
            problems.push(format!("queue {q}: absent from ctl stats"));
            continue;
        };
        if e.index != q {
            problems.push(format!("queue {q}: listed with index {}", e.index));
        }
        for (f, v) in [
            ("rx_bad_chains", e.rx_bad_chains),
            ("tx_bad_chains", e.tx_bad_chains),
        ] {
            if v != 0 {
                problems.push(format!("queue {q}: {f} {v} from a real driver"));
            }
        }
        for (f, v) in [("rx_stopped", &e.rx_stopped), ("tx_stopped", &e.tx_stopped)] {
            if let Some(v) = v {
                problems.push(format!("queue {q}: {f} {v:?}"));
            }
        }
    }
    problems
}

/// How long every guest CPU gets to run a thread pinned to it at boot.
const CPU_PROBE_MS: u64 = 10_000;

/// Why the failed boot `e` (artifacts in `dir`) is not the device's doing
/// and is repeated once, if it is:
/// - QEMU itself aborted on an internal assertion ([`qemu_aborted`]);
/// - the guest never answered the agent's hello: it hung in boot;
/// - a guest CPU ran nothing after boot. That is QEMU's or the guest
///   kernel's state, which the device cannot cause (a vhost-user backend
///   that stalled QEMU would stall its I/O thread and every vCPU's device
///   access, not one vCPU's scheduling; and the module under test was not
///   yet loaded);
/// - the kernel's first problem came before it enumerated any PCI device
///   ([`before_any_device`]).
///
/// A second such boot in one run fails it (`MAX_RETRIED_BOOTS`).
fn repeat_reason(dir: &std::path::Path, e: &BootError) -> Option<String> {
    if let Some(why) = qemu_aborted(dir) {
        return Some(format!("QEMU aborted during boot ({why})"));
    }
    match e {
        BootError::NoHello(_) => {
            Some("the guest did not answer the agent's hello: hung in boot".to_string())
        }
        BootError::StuckVcpu { .. } => {
            Some("a guest CPU ran nothing after boot (stuck vCPU)".to_string())
        }
        BootError::KernelProblems(lines) => before_any_device(dir, lines),
        BootError::Other(_) => None,
    }
}

/// Why a boot whose kernel reported `problems` is not the device's doing:
/// the first problem stands in the boot's kernel log (`dmesg.txt` in
/// `dir`) before the first `pci 0000:` line, i.e. before the kernel had
/// enumerated any PCI device, so before the NIC, its driver or the module
/// under test existed. Seen once on the TCG debug kernel (7.3,
/// 2026-12-03): a KASAN report from an edge interrupt taken in
/// `identify_cpu` at 0.004 s. `None` for a problem after the first PCI
/// line, or no kernel log.
fn before_any_device(dir: &std::path::Path, problems: &[String]) -> Option<String> {
    // "[    0.003737] BUG: ..." -> "BUG: ..."
    let first = problems.first()?;
    let msg = first
        .split_once("] ")
        .map_or(first.as_str(), |(_, m)| m)
        .trim();
    if msg.is_empty() {
        return None;
    }
    let log = std::fs::read_to_string(dir.join("dmesg.txt")).ok()?;
    let at = |pred: &dyn Fn(&str) -> bool| log.lines().position(pred);
    let problem = at(&|l| l.contains(msg))?;
    let pci = at(&|l| l.contains("pci 0000:")).unwrap_or(usize::MAX);
    (problem < pci).then(|| {
        format!("the guest kernel reported a problem before it enumerated any PCI device ({msg})")
    })
}

/// The assertion line of a QEMU that aborted in the boot whose artifacts
/// are in `dir`, if it did.
fn qemu_aborted(dir: &std::path::Path) -> Option<String> {
    let log = std::fs::read_to_string(dir.join("qemu.log")).ok()?;
    log.lines()
        .find(|l| l.contains("Assertion") && l.contains("failed"))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::{
        before_any_device, qemu_aborted, repeat_reason, ring_problems, BootError, Duration,
    };
    use crate::harness::Error;
    use serde_json::json;
    use vnic_ctl_proto::{QueueStats, Stats};

    fn queue(i: usize) -> QueueStats {
        QueueStats {
            index: i,
            ..QueueStats::default()
        }
    }

    fn stats(queues: Vec<QueueStats>) -> Stats {
        Stats {
            queues,
            ..Stats::default()
        }
    }

    #[test]
    fn ring_check_fails_on_missing_counters_not_only_on_bad_ones() {
        let good = stats(vec![queue(0), queue(1)]);
        assert!(ring_problems(&good, 2).is_empty());
        // The vacuous case: no `queues` at all must not pass (it is no
        // `Stats`: the request fails).
        let full = serde_json::to_value(&good).unwrap();
        for bad in [json!({}), {
            let mut v = full.clone();
            v["queues"] = json!(null);
            v
        }] {
            assert!(serde_json::from_value::<Stats>(bad).is_err());
        }
        // A queue missing, a counter missing, a counter set, a ring stopped.
        assert!(!ring_problems(&stats(vec![queue(0)]), 2).is_empty());
        for (field, v) in [
            ("tx_bad_chains", None),
            ("rx_bad_chains", Some(json!(3))),
            ("rx_stopped", Some(json!("bad_avail_jump"))),
            ("tx_stopped", None),
        ] {
            let mut q1 = serde_json::to_value(queue(1)).unwrap();
            match v {
                Some(v) => q1[field] = v,
                None => {
                    q1.as_object_mut().unwrap().remove(field);
                }
            }
            let mut v = full.clone();
            v["queues"][1] = q1;
            let p = match serde_json::from_value::<Stats>(v) {
                Ok(st) => ring_problems(&st, 2),
                // A counter missing: no `Stats`, the request fails naming it.
                Err(e) => vec![format!("queue 1: {e}")],
            };
            assert_eq!(p.len(), 1, "{field}: {p:?}");
            assert!(
                p[0].starts_with("queue 1: ") && p[0].contains(field),
                "{p:?}"
            );
        }
        // Queues out of order are not queue 0 and 1.
        assert!(!ring_problems(&stats(vec![queue(1), queue(0)]), 2).is_empty());
    }

    /// What decides a repeat is the error's kind, never its text: an
    /// `Other` error whose message reads like a hang is not repeated.
    #[test]
    fn a_boot_failure_is_repeated_by_its_kind_not_its_text() {
        let dir = std::env::temp_dir().join(format!("vnic-kind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hung = BootError::NoHello(Error("agent did not answer hello within 180s".into()));
        assert!(repeat_reason(&dir, &hung).unwrap().contains("hung in boot"));
        for text in [
            "agent did not answer hello within 180s",
            "guest CPU probe: 3 of 4 online CPUs (a stuck vCPU)",
            "kernel reported problems during boot:\n[ 0.0] BUG: x",
            "vnic reports a table capacity of 0",
        ] {
            assert_eq!(repeat_reason(&dir, &BootError::Other(text.into())), None);
        }
        // Kernel problems with no kernel log to place them: not repeated.
        let bug = BootError::KernelProblems(vec!["[    0.003737] BUG: x".into()]);
        assert_eq!(repeat_reason(&dir, &bug), None);
        // A QEMU assertion in qemu.log repeats any failure.
        std::fs::write(
            dir.join("qemu.log"),
            "qemu: physmem.c:2678: iotlb_to_section: Assertion `x' failed.\n",
        )
        .unwrap();
        let why = repeat_reason(&dir, &BootError::Other("QEMU exited".into())).unwrap();
        assert!(why.starts_with("QEMU aborted during boot"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn qemu_abort_is_told_from_other_boot_failures() {
        let dir = std::env::temp_dir().join(format!("vnic-qemu-aborted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(qemu_aborted(&dir), None, "no qemu.log: not an abort");
        let log = dir.join("qemu.log");
        std::fs::write(&log, "qemu-system-x86_64: terminating on signal 15\n").unwrap();
        assert_eq!(qemu_aborted(&dir), None);
        let line = "qemu-system-x86_64: ../system/physmem.c:2678: iotlb_to_section: Assertion `section_index < d->map.sections_nb' failed.";
        std::fs::write(&log, format!("VNC server running\n{line}\n")).unwrap();
        assert_eq!(qemu_aborted(&dir).as_deref(), Some(line));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A kernel problem before the first PCI line is not the device's; one
    /// after it, or another failure, is not retried.
    #[test]
    fn a_kernel_problem_before_any_pci_device_is_retried() {
        let dir = std::env::temp_dir().join(format!("vnic-early-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bug = "BUG: KASAN: wild-memory-access in do_raw_spin_lock+0x109/0x240";
        let err = vec![
            format!("[    0.003737] {bug}"),
            "[    0.005584] Call Trace:".to_string(),
        ];
        let early = format!(
            "[    0.000000] <5> Linux version 7.3.4-vnic\n[    0.003737] <3> {bug}\n[    6.212100] <6> pci 0000:00:00.0: [8086:29c0] type 00\n"
        );
        std::fs::write(dir.join("dmesg.txt"), &early).unwrap();
        let why = before_any_device(&dir, &err).expect("retried");
        assert!(why.contains("before it enumerated any PCI device"), "{why}");
        assert!(why.contains("KASAN"), "{why}");
        let late = format!(
            "[    0.000000] <5> Linux version 7.3.4-vnic\n[    6.212100] <6> pci 0000:00:00.0: [8086:29c0] type 00\n[   60.000001] <3> {bug}\n"
        );
        std::fs::write(dir.join("dmesg.txt"), &late).unwrap();
        assert_eq!(before_any_device(&dir, &err), None);
        assert_eq!(before_any_device(&dir, &[]), None);
        std::fs::remove_file(dir.join("dmesg.txt")).unwrap();
        assert_eq!(
            before_any_device(&dir, &err),
            None,
            "no kernel log: not retried"
        );
        let _ = std::fs::remove_dir(&dir);
    }

    /// A CPU probe that misses a CPU, or sees fewer online CPUs than
    /// configured, is a repeated boot, and its message names the CPUs.
    #[test]
    fn a_stuck_vcpu_is_a_repeated_boot() {
        let dir = std::env::temp_dir().join(format!("vnic-vcpu-{}", std::process::id()));
        let stuck = |cpus, ran: Vec<usize>, missing: Vec<usize>| BootError::StuckVcpu {
            probe: crate::proto::CpuProbe { cpus, ran, missing },
            configured: 4,
            timeout: Duration::from_secs(10),
        };
        let e = stuck(4, vec![0, 1, 3], vec![2]);
        assert!(e.to_string().contains("3 of 4 online CPUs"), "{e}");
        assert!(e.to_string().contains("not running: [2]"), "{e}");
        assert!(repeat_reason(&dir, &e).unwrap().contains("stuck vCPU"));
        let fewer = stuck(3, vec![0, 1, 2], vec![]);
        let text = fewer.to_string();
        assert!(text.contains("3 of 3 online CPUs (4 configured)"), "{text}");
        assert!(repeat_reason(&dir, &fewer).is_some());
        // The message survives the conversion to the suite's error.
        assert_eq!(Error::from(fewer).0, text);
    }
}
