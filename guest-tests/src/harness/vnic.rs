//! A `vnic serve` child process with its sockets, trace and log in a
//! temporary run directory. Killed on drop.

use super::{kill_child, wait_for, Context, Result};
use crate::bail;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use vnic_ctl_proto::Client;

/// Options of one daemon (the guest tests use the gen peer).
#[derive(Debug, Clone)]
pub struct VnicOptions {
    pub queues: u16,
    /// Extra `vnic serve` arguments (table capacity, buckets, fault knobs...).
    pub extra: Vec<String>,
    /// `--peer` (default `gen`; `tap:IFNAME` for the tap peer).
    pub peer: String,
    /// Command prefix the daemon runs under (e.g. `ip netns exec NS`);
    /// it must exec the daemon (the child's pid is the daemon's).
    pub wrap: Vec<String>,
}

impl Default for VnicOptions {
    fn default() -> Self {
        VnicOptions {
            queues: 4,
            extra: Vec::new(),
            peer: "gen".into(),
            wrap: Vec::new(),
        }
    }
}

pub struct Vnic {
    child: Child,
    pub socket: PathBuf,
    pub ctl: PathBuf,
    pub trace: PathBuf,
    pub log: PathBuf,
}

impl Vnic {
    /// Start `bin serve` with its files in `dir`; wait until both sockets exist.
    pub fn start(bin: &Path, dir: &Path, opts: &VnicOptions) -> Result<Self> {
        Self::start_tagged(bin, dir, opts, "")
    }

    /// Like [`Vnic::start`], with `tag` appended to the names of the trace
    /// and the log (a restarted daemon writes its own files; the sockets
    /// keep their paths so QEMU reconnects to the same one).
    pub fn start_tagged(bin: &Path, dir: &Path, opts: &VnicOptions, tag: &str) -> Result<Self> {
        let socket = dir.join("vnic.sock");
        let ctl = dir.join("vnic.ctl");
        let trace = dir.join(format!("vnic-trace{tag}.jsonl"));
        let log = dir.join(format!("vnic{tag}.log"));
        for p in [&socket, &ctl] {
            let _ = std::fs::remove_file(p);
        }
        let logf = std::fs::File::create(&log).ctx(format!("creating {}", log.display()))?;
        let mut cmd = match opts.wrap.split_first() {
            Some((prog, rest)) => {
                let mut c = Command::new(prog);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--ctl")
            .arg(&ctl)
            .arg("--trace")
            .arg(&trace)
            .args(["--peer", &opts.peer, "--queues", &opts.queues.to_string()])
            .args(&opts.extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        let child = cmd
            .spawn()
            .ctx(format!("starting {} serve", bin.display()))?;
        let mut v = Vnic {
            child,
            socket,
            ctl,
            trace,
            log,
        };
        let r = wait_for(Duration::from_secs(20), "vnic's sockets", || {
            if let Some(st) = v.child.try_wait()? {
                bail!("vnic serve exited ({st}) at start:\n{}", v.log_tail(40));
            }
            Ok((v.socket.exists() && v.ctl.exists()).then_some(()))
        });
        r?;
        Ok(v)
    }

    /// A client of the daemon's control socket (replies may take 20 s).
    pub fn connect_ctl(&self) -> Result<Client> {
        let mut c =
            Client::connect(&self.ctl).ctx(format!("connecting to {}", self.ctl.display()))?;
        c.set_timeout(Some(Duration::from_secs(20)))?;
        Ok(c)
    }

    /// Kill the daemon (SIGKILL: a crash, no clean shutdown) and reap it.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// Whether the daemon is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last `n` lines of the daemon's log.
    pub fn log_tail(&self, n: usize) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Vnic {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}
