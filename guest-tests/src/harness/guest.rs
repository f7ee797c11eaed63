//! One booted guest: vnic + QEMU + the agent, with artifact collection and
//! the kernel-log watchdog. Dropping it kills QEMU, then vnic.

use super::agent::Agent;
use super::build::Kernel;
use super::qemu::{Qemu, QemuOptions};
use super::vnic::{Vnic, VnicOptions};
use super::{Artifacts, BootError, Context, Error, Result};
use crate::bail;
use crate::procfs;
use crate::proto::{Info, Kmsg, KmsgRecord, Request};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};
use vnic_ctl_proto::Client;

/// Everything needed to boot one guest.
pub struct BootSpec<'a> {
    pub kernel: &'a Kernel,
    pub initrd: &'a Path,
    pub vnic_bin: &'a Path,
    pub vnic: VnicOptions,
    pub qemu: QemuOptions,
    /// How long the guest may take until the agent answers.
    pub boot_timeout: Duration,
}

pub struct Guest {
    // Field order = drop order: the agent connection, QEMU, then vnic.
    pub agent: Agent,
    pub qemu: Qemu,
    pub ctl: Client,
    pub vnic: Vnic,
    pub info: Info,
    pub art: Artifacts,
    pub boot_time: Duration,
    /// Next /dev/kmsg sequence number not yet fetched.
    kmsg_next: u64,
    /// Every kernel log record seen.
    pub kmsg: Vec<KmsgRecord>,
    vnic_bin: std::path::PathBuf,
    vnic_opts: VnicOptions,
    /// Times the daemon was restarted ([`Guest::restart_vnic`]).
    pub vnic_restarts: u32,
    /// The booted kernel's System.map (for [`Guest::stall_report`]).
    system_map: std::path::PathBuf,
}

impl Guest {
    /// Start vnic and QEMU and wait for the agent's `hello`; a guest whose
    /// agent never answers is [`BootError::NoHello`].
    pub fn boot(spec: &BootSpec<'_>, art: Artifacts) -> Result<Self, BootError> {
        let start = Instant::now();
        let vnic = Vnic::start(spec.vnic_bin, &art.dir, &spec.vnic)?;
        let ctl = vnic.connect_ctl()?;
        let mut qemu = Qemu::start(
            &spec.kernel.bzimage,
            spec.initrd,
            &vnic.socket,
            &art.dir,
            &spec.qemu,
        )?;
        art.write("qemu-cmdline.txt", &qemu.cmdline.join(" "));
        let console = qemu.console.clone();
        let agent_socket = qemu.agent_socket.clone();
        let mut vnic = vnic;
        let connected = {
            let qemu_ref = &mut qemu;
            let vnic_ref = &mut vnic;
            let mut alive = || -> Result<()> {
                if let Some(st) = qemu_ref.exited() {
                    let con = std::fs::read_to_string(&console).unwrap_or_default();
                    bail!(
                        "QEMU exited during boot ({st}); console tail:\n{}",
                        tail(&con, 30)
                    );
                }
                if !vnic_ref.alive() {
                    bail!("vnic died during boot; its log:\n{}", vnic_ref.log_tail(30));
                }
                Ok(())
            };
            Agent::connect(&agent_socket, spec.boot_timeout, &mut alive)
        };
        let (agent, info) = match connected {
            Ok(x) => x,
            Err(e) => {
                art.write("console.tail.txt", &tail(&qemu.console_text(), 200));
                let with_tail = |e| {
                    Error(format!(
                        "{e}\nconsole tail:\n{}",
                        tail(&qemu.console_text(), 25)
                    ))
                };
                return Err(match e {
                    BootError::NoHello(e) => BootError::NoHello(with_tail(e)),
                    BootError::Other(e) => BootError::Other(with_tail(e)),
                    other => other,
                });
            }
        };
        let g = Guest {
            agent,
            qemu,
            ctl,
            vnic,
            info,
            art,
            boot_time: start.elapsed(),
            kmsg_next: 0,
            kmsg: Vec::new(),
            vnic_bin: spec.vnic_bin.to_path_buf(),
            vnic_opts: spec.vnic.clone(),
            vnic_restarts: 0,
            system_map: spec.kernel.kdir.join("System.map"),
        };
        g.art.write_json("guest-info.json", &g.info);
        Ok(g)
    }

    /// Kill `vnic serve` (SIGKILL), leave it dead for `down`, start a new
    /// one on the same sockets (QEMU reconnects by itself: `reconnect_ms`)
    /// with its own trace and log (`vnic-trace-N.jsonl`, `vnic-N.log`), and
    /// reconnect the control client. The guest keeps running.
    pub fn restart_vnic(&mut self, down: Duration) -> Result<()> {
        self.vnic.kill();
        std::thread::sleep(down);
        self.vnic_restarts += 1;
        let tag = format!("-{}", self.vnic_restarts);
        self.vnic = Vnic::start_tagged(&self.vnic_bin, &self.art.dir, &self.vnic_opts, &tag)
            .ctx("restarting vnic serve")?;
        self.ctl = self.vnic.connect_ctl()?;
        Ok(())
    }

    /// What a hung guest looks like from outside, in a few lines for the
    /// report (everything the CI log shows): each vCPU's RIP, each ring's
    /// positions as vnic's last poll saw them, the console's and the
    /// daemon's last lines. Saved whole as `stall-*.txt`.
    pub fn stall_report(&mut self, tag: &str) -> String {
        let mut r = String::new();
        match self.qemu.vcpu_report(&self.system_map) {
            Ok(v) => {
                let _ = writeln!(r, "vCPUs: {v}");
            }
            Err(e) => {
                let _ = writeln!(r, "vCPUs: <{e}>");
            }
        }
        match self.ctl.stats() {
            Ok(st) => {
                let _ = writeln!(r, "rings: {}", rings_summary(st.rings.as_ref()));
                self.art
                    .write_json(&format!("stall-{tag}-vnic-stats.json"), &st);
            }
            Err(e) => {
                let _ = writeln!(r, "rings: <vnic ctl stats: {e}>");
            }
        }
        let _ = writeln!(r, "console tail:\n{}", tail(&self.qemu.console_text(), 12));
        let _ = write!(r, "vnic log tail:\n{}", self.vnic.log_tail(8));
        self.art.write(&format!("stall-{tag}.txt"), &r);
        r
    }

    /// Fetch new kernel log records; return the ones that must fail a test
    /// (WARN, BUG, oops, KASAN, lockdep, ...), with a little context.
    pub fn kernel_failures(&mut self) -> Result<Vec<String>> {
        let k: Kmsg = self.agent.req(Request::Dmesg {
            since: self.kmsg_next,
        })?;
        let mut bad = Vec::new();
        for r in &k.records {
            if procfs::is_kernel_failure(&r.msg) {
                bad.push(format!(
                    "[{:>5}.{:06}] {}",
                    r.ts_us / 1_000_000,
                    r.ts_us % 1_000_000,
                    r.msg
                ));
            }
            self.kmsg_next = self.kmsg_next.max(r.seq + 1);
        }
        if k.lost {
            bad.push(
                "kernel log records were lost (ring buffer overrun): cannot vouch for a clean log"
                    .into(),
            );
        }
        self.kmsg.extend(k.records);
        self.write_dmesg();
        Ok(bad)
    }

    fn write_dmesg(&self) {
        let mut s = String::new();
        for r in &self.kmsg {
            let _ = writeln!(
                s,
                "[{:>5}.{:06}] <{}> {}",
                r.ts_us / 1_000_000,
                r.ts_us % 1_000_000,
                r.level,
                r.msg
            );
        }
        self.art.write("dmesg.txt", &s);
    }

    /// Save a snapshot of device and guest state under `tag`.
    pub fn collect(&mut self, tag: &str, module_debugfs: Option<&str>) {
        match self.ctl.stats() {
            Ok(v) => self.art.write_json(&format!("{tag}-vnic-stats.json"), &v),
            Err(e) => self
                .art
                .write(&format!("{tag}-vnic-stats.err"), &e.to_string()),
        }
        match self.ctl.table() {
            Ok(v) => self.art.write_json(&format!("{tag}-vnic-table.json"), &v),
            Err(e) => self
                .art
                .write(&format!("{tag}-vnic-table.err"), &e.to_string()),
        }
        if let Some(dir) = module_debugfs {
            match self
                .agent
                .req::<crate::proto::DirContents>(Request::ReadDir { path: dir.into() })
            {
                Ok(v) => self
                    .art
                    .write_json(&format!("{tag}-module-debugfs.json"), &v),
                Err(e) => self.art.write(&format!("{tag}-module-debugfs.err"), &e.0),
            }
        }
        let mut procs = String::new();
        for f in [
            "/proc/interrupts",
            "/proc/softirqs",
            "/proc/net/softnet_stat",
        ] {
            let _ = writeln!(procs, "==> {f}");
            procs.push_str(
                &self
                    .agent
                    .read_file(f)
                    .unwrap_or_else(|e| format!("<{e}>\n")),
            );
        }
        self.art.write(&format!("{tag}-guest-proc.txt"), &procs);
    }

    /// Power the guest off and wait for QEMU to exit; save the transcript.
    pub fn shutdown(mut self) -> Result<()> {
        self.art
            .write("agent-transcript.txt", &self.agent.transcript.join("\n"));
        let r = self
            .agent
            .call_value(&Request::Poweroff, Duration::from_secs(10));
        let exited = self.qemu.wait_exit(Duration::from_secs(30));
        self.art
            .write("console.log.copy", &self.qemu.console_text());
        r.ctx("poweroff")?;
        if !exited {
            bail!("QEMU did not exit within 30 s of the guest's power-off");
        }
        Ok(())
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.art
            .write("agent-transcript.txt", &self.agent.transcript.join("\n"));
    }
}

/// `ctl stats`' `rings` in one line: per pair, rx and tx as
/// `avail/next_avail/next_used/used_event` with `!` for rings not enabled
/// or not ready and `*` where the watchdog already nudged.
pub fn rings_summary(rings: Option<&vnic_ctl_proto::Rings>) -> String {
    let n = |v: Option<u64>| v.map_or("-".to_string(), |x| x.to_string());
    let ring = |v: &vnic_ctl_proto::Ring| {
        format!(
            "{}{}/{}/{}/{}{}",
            if v.enabled && v.ready { "" } else { "!" },
            n(v.avail.map(u64::from)),
            v.next_avail,
            v.next_used,
            n(v.used_event.map(u64::from)),
            if v.nudged { "*" } else { "" }
        )
    };
    let pairs: Vec<String> = rings
        .map(|r| {
            r.pairs
                .iter()
                .enumerate()
                .map(|(i, p)| match p {
                    None => format!("{i}: unregistered"),
                    Some(p) => format!("{i}: rx {} tx {}", ring(&p.rx), ring(&p.tx)),
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "[avail/next_avail/next_used/used_event] {} (nudges {}, poll {} ms ago)",
        pairs.join(", "),
        n(rings.map(|r| r.watchdog_nudges)),
        n(rings.and_then(|r| r.age_ms))
    )
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
