//! QEMU 10 attached to vnic over vhost-user, the way scripts/run-qemu does
//! it: memfd shared memory, `-netdev vhost-user,queues=N`,
//! `-device virtio-net-pci,mq=on,vectors=2N+2`, the agent's virtio-serial
//! port on a unix socket, the serial console in a log file. Killed on drop.

use super::{kill_child, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

#[derive(Debug, Clone)]
pub struct QemuOptions {
    pub cpus: u16,
    pub queues: u16,
    pub mem_mb: u32,
    /// Extra kernel command line.
    pub append: String,
    /// `tcg` (default) or `kvm` (env VNIC_ACCEL).
    pub accel: String,
    /// `reconnect-ms` of the vhost-user chardev: QEMU reconnects to a
    /// restarted daemon after this long (None: a dead daemon stays dead).
    pub reconnect_ms: Option<u32>,
}

impl Default for QemuOptions {
    fn default() -> Self {
        QemuOptions {
            cpus: 4,
            queues: 4,
            mem_mb: 768,
            append: String::new(),
            accel: std::env::var("VNIC_ACCEL").unwrap_or_else(|_| "tcg".into()),
            reconnect_ms: Some(250),
        }
    }
}

pub struct Qemu {
    child: Child,
    pub agent_socket: PathBuf,
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
        let _ = std::fs::remove_file(&agent_socket);
        let accel: Vec<String> = if opts.accel == "kvm" {
            vec!["-accel".into(), "kvm".into(), "-cpu".into(), "host".into()]
        } else {
            vec![
                "-accel".into(),
                "tcg,thread=multi".into(),
                "-cpu".into(),
                "max".into(),
            ]
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
                format!("console=ttyS0 panic=-1 loglevel=6 vnic.agent=exec {}", opts.append)
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
                format!("file,id=con0,path={}", console.display()),
                "-serial".into(),
                "chardev:con0".into(),
                "-monitor".into(),
                "none".into(),
            ],
        );
        let qemu = std::env::var("VNIC_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into());
        let log = std::fs::File::create(dir.join("qemu.log"))?;
        let child = Command::new(&qemu)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .ctx(format!("starting {qemu}"))?;
        let mut cmdline = vec![qemu];
        cmdline.extend(args);
        Ok(Qemu {
            child,
            agent_socket,
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

impl Drop for Qemu {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}
