//! QEMU 10 attached to vnic over vhost-user, the way scripts/run-qemu does
//! it: memfd shared memory, `-netdev vhost-user,queues=N`,
//! `-device virtio-net-pci,mq=on,vectors=2N+2`, the agent's virtio-serial
//! port on a unix socket, the serial console in a log file. Killed on drop.

use super::{kill_child, Context, Result};
use crate::bail;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

#[derive(Debug, Clone)]
pub struct QemuOptions {
    pub cpus: u16,
    pub queues: u16,
    pub mem_mb: u32,
    /// Extra kernel command line.
    pub append: String,
    /// `auto` (default: KVM when its probe boot works, see
    /// [`super::accel`]), `tcg` or `kvm` (env VNIC_ACCEL).
    pub accel: String,
    /// `reconnect-ms` of the vhost-user chardev: QEMU reconnects to a
    /// restarted daemon after this long (None: a dead daemon stays dead).
    pub reconnect_ms: Option<u32>,
    /// The serial console on this process's terminal (stdin/stdout, QEMU's
    /// Ctrl-A escapes: Ctrl-A x quits) instead of `console.log`: for a
    /// shell in the guest (`vnic-guest-suite run --shell`).
    pub console_stdio: bool,
    /// Under TCG, count instructions (`-icount shift=0`: the guest's
    /// clocks advance 1 ns per instruction its vCPUs execute, one vCPU at
    /// a time): guest time then measures work done, not the host's load.
    /// No effect under KVM.
    pub icount: bool,
}

impl Default for QemuOptions {
    fn default() -> Self {
        QemuOptions {
            cpus: 4,
            queues: 4,
            mem_mb: 768,
            append: String::new(),
            accel: std::env::var("VNIC_ACCEL").unwrap_or_else(|_| "auto".into()),
            reconnect_ms: Some(250),
            console_stdio: false,
            icount: false,
        }
    }
}

pub struct Qemu {
    child: Child,
    pub agent_socket: PathBuf,
    /// QMP socket (for [`Qemu::vcpu_report`] when the guest hangs).
    pub qmp_socket: PathBuf,
    pub console: PathBuf,
    pub cmdline: Vec<String>,
}

/// The guest NIC's MAC (same default as scripts/run-qemu).
pub const GUEST_MAC: &str = "52:54:00:12:34:56";

impl Qemu {
    pub fn start(
        bzimage: &Path,
        initrd: &Path,
        vhost_socket: &Path,
        dir: &Path,
        opts: &QemuOptions,
    ) -> Result<Self> {
        let agent_socket = dir.join("agent.sock");
        let console = dir.join("console.log");
        let qmp_socket = dir.join("qmp.sock");
        let _ = std::fs::remove_file(&agent_socket);
        let _ = std::fs::remove_file(&qmp_socket);
        let qemu_bin = std::env::var("VNIC_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into());
        let accel = match opts.accel.as_str() {
            "kvm" => super::accel::Accel::Kvm,
            "tcg" => super::accel::Accel::Tcg,
            _ => super::accel::resolve(&qemu_bin, bzimage),
        };
        let accel: Vec<String> = match accel {
            super::accel::Accel::Tcg if opts.icount => [
                "-accel",
                "tcg,thread=single",
                "-icount",
                "shift=0,sleep=on",
                "-cpu",
                "max",
            ]
            .map(String::from)
            .to_vec(),
            a => a.qemu_args().map(String::from).to_vec(),
        };
        let mem = format!("{}M", opts.mem_mb);
        let q = opts.queues;
        let mut args: Vec<String> = vec!["-name".into(), "vnic-guest-test".into()];
        args.extend(accel);
        args.extend(
            [
                "-smp".to_string(),
                opts.cpus.to_string(),
                "-m".into(),
                mem.clone(),
                "-object".into(),
                format!("memory-backend-memfd,id=mem,size={mem},share=on"),
                "-machine".into(),
                "q35,memory-backend=mem".into(),
                "-nodefaults".into(),
                "-no-user-config".into(),
                "-display".into(),
                "none".into(),
                "-no-reboot".into(),
                "-kernel".into(),
                bzimage.display().to_string(),
                "-initrd".into(),
                initrd.display().to_string(),
                "-append".into(),
                // no_timer_check: under TCG on a loaded host the boot-time
                // check that the timer interrupt comes through the IO-APIC
                // can miss its window and panic ("IO-APIC + timer doesn't
                // work!"); the timer is fine, the check is skipped.
                format!("console=ttyS0 panic=-1 loglevel=6 no_timer_check vnic.agent=exec {}", opts.append)
                    .trim()
                    .to_string(),
                "-chardev".into(),
                format!(
                    "socket,id=c0,path={}{}",
                    vhost_socket.display(),
                    opts.reconnect_ms
                        .map(|ms| format!(",reconnect-ms={ms}"))
                        .unwrap_or_default()
                ),
                "-netdev".into(),
                format!("vhost-user,id=n0,chardev=c0,queues={q}"),
                "-device".into(),
                format!(
                    "virtio-net-pci,netdev=n0,mac={GUEST_MAC},mq=on,vectors={},rx_queue_size=1024,tx_queue_size=1024,romfile=",
                    2 * q + 2
                ),
                "-device".into(),
                "virtio-serial-pci,id=vser0".into(),
                "-chardev".into(),
                format!("socket,id=agent,path={},server=on,wait=off", agent_socket.display()),
                "-device".into(),
                "virtserialport,bus=vser0.0,chardev=agent,name=vnic.agent".into(),
                "-chardev".into(),
                if opts.console_stdio {
                    "stdio,id=con0,mux=on,signal=off".into()
                } else {
                    format!("file,id=con0,path={}", console.display())
                },
                "-serial".into(),
                "chardev:con0".into(),
                "-monitor".into(),
                "none".into(),
                "-qmp".into(),
                format!("unix:{},server=on,wait=off", qmp_socket.display()),
            ],
        );
        let qemu = qemu_bin;
        let log = std::fs::File::create(dir.join("qemu.log"))?;
        let (stdin, stdout) = if opts.console_stdio {
            (Stdio::inherit(), Stdio::inherit())
        } else {
            (Stdio::null(), Stdio::from(log.try_clone()?))
        };
        let child = Command::new(&qemu)
            .args(&args)
            .stdin(stdin)
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .ctx(format!("starting {qemu}"))?;
        let mut cmdline = vec![qemu];
        cmdline.extend(args);
        Ok(Qemu {
            child,
            agent_socket,
            qmp_socket,
            console,
            cmdline,
        })
    }

    /// `Some(status)` once QEMU has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Wait up to `timeout` for QEMU to exit by itself (after a guest power-off).
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        while start.elapsed() < timeout {
            if self.exited().is_some() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        false
    }

    pub fn console_text(&self) -> String {
        std::fs::read(&self.console)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl Qemu {
    /// Where each vCPU is, from QMP's `info registers -a`: one line per
    /// CPU with its RIP resolved against `system_map` (the kernel's
    /// System.map) and whether it is halted (idle). For a guest that stopped
    /// answering: a vCPU spinning in one function shows up here.
    pub fn vcpu_report(&self, system_map: &Path) -> Result<String> {
        let regs = self.hmp("info registers -a")?;
        let syms = read_system_map(system_map);
        let mut out = Vec::new();
        let mut cpu = None;
        for line in regs.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("CPU#") {
                cpu = rest.split_whitespace().next().map(String::from);
            }
            if let Some(rip) = line.strip_prefix("RIP=") {
                let hex: String = rip.chars().take_while(char::is_ascii_hexdigit).collect();
                let halted = line.contains("HLT=1");
                let addr = u64::from_str_radix(&hex, 16).unwrap_or(0);
                out.push(format!(
                    "cpu{} rip={hex} {}{}",
                    cpu.as_deref().unwrap_or("?"),
                    resolve(&syms, addr),
                    if halted { " (halted)" } else { "" }
                ));
            }
        }
        if out.is_empty() {
            bail!(
                "no RIP in `info registers -a`: {}",
                regs.chars().take(300).collect::<String>()
            );
        }
        Ok(out.join("; "))
    }

    /// One HMP command over QMP (`human-monitor-command`).
    fn hmp(&self, command: &str) -> Result<String> {
        use std::io::{BufRead, BufReader, Write};
        let s = std::os::unix::net::UnixStream::connect(&self.qmp_socket)
            .ctx(format!("connecting to {}", self.qmp_socket.display()))?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        let mut r = BufReader::new(s.try_clone()?);
        let mut w = s;
        let mut line = String::new();
        r.read_line(&mut line).ctx("QMP greeting")?;
        let cmd = serde_json::json!({"execute": "human-monitor-command",
                                     "arguments": {"command-line": command}});
        writeln!(w, "{{\"execute\": \"qmp_capabilities\"}}\n{cmd}")?;
        loop {
            line.clear();
            if r.read_line(&mut line).ctx("QMP reply")? == 0 {
                bail!("QMP closed");
            }
            let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
            if let Some(text) = v.get("return").and_then(serde_json::Value::as_str) {
                return Ok(text.to_string());
            }
            if let Some(e) = v.get("error") {
                bail!("QMP {command}: {e}");
            }
        }
    }
}

/// Text symbols of a System.map, sorted by address.
fn read_system_map(p: &Path) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let mut v: Vec<(u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let a = u64::from_str_radix(it.next()?, 16).ok()?;
            let t = it.next()?;
            let name = it.next()?;
            matches!(t, "t" | "T").then(|| (a, name.to_string()))
        })
        .collect();
    v.sort_unstable();
    v
}

fn resolve(syms: &[(u64, String)], addr: u64) -> String {
    match syms.partition_point(|(a, _)| *a <= addr) {
        0 => "?".into(),
        i if addr - syms[i - 1].0 < 0x10_0000 => {
            let (a, name) = &syms[i - 1];
            format!("{name}+{:#x}", addr - a)
        }
        _ => "(module or user)".into(),
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}
