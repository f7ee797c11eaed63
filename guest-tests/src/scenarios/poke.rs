//! `vnic-guest-suite run`: one guest of a kernel (a user's built tree or a
//! cached series) on a vnic of its own, for poking at aRFS by hand. The
//! same boot as the suite's ([`Session::boot`]: the module built for the
//! tree, the agent's initramfs, `vnic serve` with the gen peer and its
//! trace), then the module loaded, optionally a steered UDP workload from
//! the gen peer, and either a shell on the console or one command run in
//! the guest. At the end: the filter-table summary and where the trace is.

use super::{device_summary, BootKind, Session, Settings, Tools, Topology};
use crate::harness::build::{self, Kernel};
use crate::harness::{parse_num as num, repo_root, timestamp, Result};
use crate::proto::{ExecResult, Request};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// `vnic-guest-suite run`'s options.
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["kernel_tree", "kernel"])))]
pub struct RunArgs {
    /// Your built kernel tree: its arch/x86/boot/bzImage is booted and the
    /// module is built against it (checked first: release, options)
    #[arg(long, value_name = "DIR")]
    pub kernel_tree: Option<PathBuf>,
    /// With --kernel-tree: boot this bzImage instead of the tree's own
    #[arg(
        long,
        value_name = "BZIMAGE",
        requires = "kernel_tree",
        conflicts_with = "kernel"
    )]
    pub kernel_image: Option<PathBuf>,
    /// Or a cached kernel: a series built by images/build-kernel (6.12,
    /// 7.3; built when missing) or 6.1-deb (Debian's prebuilt 6.1)
    #[arg(
        long,
        alias = "series",
        value_name = "SERIES",
        conflicts_with = "kernel_tree",
        verbatim_doc_comment
    )]
    pub kernel: Option<String>,
    /// Run `sh -c CMD` in the guest (busybox), print its output, exit
    /// with its status (124: it ran past --timeout)
    #[arg(
        long,
        value_name = "CMD",
        conflicts_with = "shell",
        verbatim_doc_comment
    )]
    pub exec: Option<String>,
    /// A shell on the guest's console, in this terminal (the default):
    /// exit it, or Ctrl-A x, to power the guest off
    #[arg(long, verbatim_doc_comment)]
    pub shell: bool,
    /// UDP flows from the gen peer to receivers in the guest, pinned
    /// round robin over the vCPUs, which the guest steers with aRFS
    /// (0: no workload)
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = |v: &str| num(v, "--flows", 0, 4096).map(|n| n as usize),
          verbatim_doc_comment)]
    pub flows: usize,
    /// Generator packets per second over all flows
    #[arg(long, value_name = "PPS", default_value_t = 2000,
          value_parser = |v: &str| num(v, "--rate", 1, 1_000_000).map(|n| n as u32))]
    pub rate: u32,
    /// Queue pairs vnic and QEMU offer
    #[arg(long, value_name = "M", default_value_t = 4,
          value_parser = |v: &str| num(v, "--queues", 1, 16).map(|n| n as u16))]
    pub queues: u16,
    /// vCPUs
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = |v: &str| num(v, "--cpus", 1, 16).map(|n| n as u16))]
    pub cpus: u16,
    /// How long --exec's command may run, in seconds
    #[arg(long, value_name = "SECS", default_value_t = 600,
          value_parser = |v: &str| num(v, "--timeout", 1, 86_400))]
    pub timeout: u64,
    /// Where the console log, vnic's log and trace go (default
    /// target/guest-tests/run-<UTC time>)
    #[arg(long, value_name = "DIR", verbatim_doc_comment)]
    pub artifacts: Option<PathBuf>,
}

/// `vnic-guest-suite run`.
pub fn main(a: &RunArgs) -> ExitCode {
    let action = match &a.exec {
        Some(c) => Action::Exec(c.clone()),
        None => Action::Shell,
    };
    if action == Action::Shell && !std::io::stdin().is_terminal() {
        eprintln!(
            "error: --shell needs a terminal on stdin; give --exec 'CMD' to run a command instead"
        );
        return ExitCode::from(2);
    }
    let topo = Topology {
        queues: a.queues,
        cpus: a.cpus,
        channels: None,
    };
    if let Err(e) = topo.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let kernel = match resolve_kernel(a) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut settings = Settings {
        rate: a.rate,
        ..Settings::default()
    };
    settings.set_topology(topo);
    let dir = a.artifacts.clone().unwrap_or_else(|| {
        repo_root()
            .join("target/guest-tests")
            .join(format!("run-{}", timestamp()))
    });
    let poke = Poke {
        action,
        flows: a.flows,
        timeout: Duration::from_secs(a.timeout),
    };
    match run(kernel, settings, &poke, &dir) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("[run] failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The kernel `a` names, checked (a tree: built, its release that of the
/// bzImage, the options the module and the boot need).
fn resolve_kernel(a: &RunArgs) -> Result<Kernel> {
    if let Some(tree) = &a.kernel_tree {
        let image = a
            .kernel_image
            .clone()
            .unwrap_or_else(|| tree.join("arch/x86/boot/bzImage"));
        if !image.is_file() {
            crate::bail!(
                "--kernel-tree {}: no {} (build the tree first: make bzImage modules_prepare)",
                tree.display(),
                image.display()
            );
        }
        return build::kernel_custom(&image, tree);
    }
    let series = a.kernel.as_deref().unwrap_or("7.3");
    match series.strip_suffix(build::DISTRO_SUFFIX) {
        Some(s) => build::kernel_distro(s),
        None => build::kernel_series(series, "default"),
    }
}

/// What to do once the guest is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A shell on the console (this terminal) until it exits.
    Shell,
    /// `sh -c CMD` in the guest; its status is the run's.
    Exec(String),
}

#[derive(Debug, Clone)]
pub struct Poke {
    pub action: Action,
    /// UDP flows from the gen peer, steered by the guest (0: none).
    pub flows: usize,
    /// How long `--exec` may run.
    pub timeout: Duration,
}

/// Exit status of a command the agent killed at its time-out (as
/// coreutils' `timeout`).
pub const TIMED_OUT: u8 = 124;

/// Boots `kernel` and does `poke`; the process's exit status: the
/// command's (`--exec`), 0 after the shell. `Err`: the guest could not be
/// booted or reached.
pub fn run(kernel: Kernel, mut settings: Settings, poke: &Poke, dir: &Path) -> Result<u8> {
    let tools = Tools::build()?;
    settings.shell = poke.action == Action::Shell;
    settings.flows = poke.flows;
    let label = kernel.label.clone();
    say(&format!(
        "booting {label} ({}) with {} vCPUs / {} queue pairs; artifacts in {}",
        kernel.bzimage.display(),
        settings.cpus,
        settings.queues,
        dir.display()
    ));
    // As in the suite: a boot that TCG or the guest kernel hung before any
    // device (or one with a stuck vCPU) is repeated once, said why.
    let mut s = Session::boot_in(kernel, &tools, settings, dir, BootKind::Default, say)?;
    say(&format!(
        "guest up in {:.1}s, kernel {}; vnic: vhost-user {}, control {} (vnic ctl --ctl {} table)",
        s.guest.boot_time.as_secs_f64(),
        s.guest.info.kernel,
        s.guest.vnic.socket.display(),
        s.guest.vnic.ctl.display(),
        s.guest.vnic.ctl.display()
    ));
    let module = match s.ensure_module() {
        Ok(()) => {
            say("vnic_arfs loaded and attached to eth0 (debugfs /sys/kernel/debug/vnic_arfs/)");
            true
        }
        Err(e) => {
            say(&format!("warning: the module is not loaded: {e}"));
            false
        }
    };
    if module && poke.flows > 0 {
        match s.setup_steering() {
            Ok(t) => say(&format!(
                "{} UDP flows from the gen peer ({} pps), all steered after {:.1}s; they keep running",
                poke.flows,
                s.settings.rate,
                t.as_secs_f64()
            )),
            Err(e) => say(&format!("warning: the steered workload did not settle: {e}")),
        }
    }
    let status = match &poke.action {
        Action::Exec(cmd) => {
            say(&format!("exec: {cmd}"));
            let timeout_ms = u64::try_from(poke.timeout.as_millis()).unwrap_or(u64::MAX);
            let r: ExecResult = s.guest.agent.call(
                &Request::Exec {
                    argv: vec!["/bin/sh".into(), "-c".into(), cmd.clone()],
                    timeout_ms,
                },
                poke.timeout + Duration::from_secs(30),
            )?;
            print!("{}", r.stdout);
            eprint!("{}", r.stderr);
            exec_status(&r)
        }
        Action::Shell => {
            say("shell on the console: exit it (or Ctrl-A x) to power the guest off");
            while s.guest.qemu.exited().is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
            0
        }
    };
    if let Action::Exec(_) = poke.action {
        if let Err(e) = s.guest.ctl.gen_stop(None) {
            say(&format!("warning: stopping the generator: {e}"));
        }
    }
    let trace = s.guest.vnic.trace.clone();
    let when = match poke.action {
        Action::Exec(_) => "whole run",
        // vnic resets the device when the guest goes away.
        Action::Shell => "whole run; live: after the guest powered off",
    };
    match device_summary(&trace, &mut s.guest.ctl) {
        Ok(t) => println!("filter table summary ({when}):\n{t}"),
        Err(e) => println!("(no filter table summary: {e})"),
    }
    println!("trace: {}", trace.display());
    println!("artifacts: {}", dir.display());
    if let Action::Exec(_) = poke.action {
        // rmmod, the ring and kernel-log checks, power-off: what is wrong
        // is said, and leaves the command's status alone.
        for p in s.finish() {
            say(&format!("warning: at teardown: {p}"));
        }
    }
    Ok(status)
}

/// The run's exit status for the agent's answer: the command's status,
/// [`TIMED_OUT`] when the agent killed it, 128 + 9 for a command it could
/// not report a status for (killed by a signal).
pub fn exec_status(r: &ExecResult) -> u8 {
    if r.timed_out {
        return TIMED_OUT;
    }
    match r.status {
        Some(c) => u8::try_from(c & 0xff).unwrap_or(1),
        None => 128 + 9,
    }
}

fn say(msg: &str) {
    eprintln!("[run] {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(status: Option<i32>, timed_out: bool) -> ExecResult {
        ExecResult {
            status,
            stdout: String::new(),
            stderr: String::new(),
            timed_out,
        }
    }

    #[test]
    fn the_commands_status_is_the_runs() {
        assert_eq!(exec_status(&res(Some(0), false)), 0);
        assert_eq!(exec_status(&res(Some(3), false)), 3);
        assert_eq!(exec_status(&res(Some(256 + 7), false)), 7);
        assert_eq!(exec_status(&res(None, false)), 137);
        assert_eq!(exec_status(&res(Some(0), true)), TIMED_OUT);
    }
}
