//! A `vnic serve` child process with its sockets, trace and log in a
//! temporary run directory. Killed on drop.

use super::ctl::Ctl;
use super::{kill_child, wait_for, Context, Result};
use crate::bail;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Options of one daemon (the guest tests use the gen peer).
#[derive(Debug, Clone)]
pub struct VnicOptions {
    pub queues: u16,
    /// Extra `vnic serve` arguments (table capacity, buckets, fault knobs...).
    pub extra: Vec<String>,
}

impl Default for VnicOptions {
    fn default() -> Self {
        VnicOptions {
            queues: 4,
            extra: Vec::new(),
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
        let socket = dir.join("vnic.sock");
        let ctl = dir.join("vnic.ctl");
        let trace = dir.join("vnic-trace.jsonl");
        let log = dir.join("vnic.log");
        for p in [&socket, &ctl] {
            let _ = std::fs::remove_file(p);
        }
        let logf = std::fs::File::create(&log).ctx(format!("creating {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--ctl")
            .arg(&ctl)
            .arg("--trace")
            .arg(&trace)
            .args(["--peer", "gen", "--queues", &opts.queues.to_string()])
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

    pub fn connect_ctl(&self) -> Result<Ctl> {
        Ctl::connect(&self.ctl)
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
