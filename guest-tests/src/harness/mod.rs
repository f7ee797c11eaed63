//! Host-side harness: builds what a guest needs (static agent, module,
//! initramfs, kernel via `images/`), starts `vnic serve` and QEMU, drives the
//! agent and the control socket (`vnic-ctl-proto`'s client), and collects
//! artifacts. Every process it
//! starts is killed when its handle drops; every wait has a timeout.

pub mod accel;
pub mod agent;
pub mod build;
pub mod guest;
pub mod qemu;
pub mod vnic;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A harness error: a message with context, meant for a human.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(e.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error(format!("json: {e}"))
    }
}

impl From<vnic_ctl_proto::CtlError> for Error {
    fn from(e: vnic_ctl_proto::CtlError) -> Self {
        Error(format!("vnic ctl {e}"))
    }
}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Error(s)
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Self {
        Error(s.to_string())
    }
}

/// Typed errors of the suite's own parsers, for `?` in scenarios (their
/// text is the message).
macro_rules! message_of {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error(e.to_string())
            }
        }
    )*};
}
message_of!(
    crate::module::ResetLogError,
    crate::proto::HexError,
    crate::scenarios::slots::FlowhashLineError,
    crate::scenarios::slots::NoSlotRule
);

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a guest boot failed, typed where the suite decides whether the
/// failure is the guest's own (QEMU/TCG, the guest kernel before any
/// device) and the boot is repeated, or a verdict
/// (`Session::boot_in`). Nothing is decided by matching message text.
#[derive(Debug)]
pub enum BootError {
    /// The agent never answered `hello` within the boot timeout: the guest
    /// hung before its userspace ran.
    NoHello(Error),
    /// The boot's CPU probe: fewer CPUs online than `configured`, or one
    /// that ran no thread pinned to it (a stuck vCPU).
    StuckVcpu {
        probe: crate::proto::CpuProbe,
        configured: usize,
        timeout: Duration,
    },
    /// The kernel logged problems during boot: their lines, oldest first,
    /// each `[seconds.micros] message`.
    KernelProblems(Vec<String>),
    /// Anything else.
    Other(Error),
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootError::NoHello(e) | BootError::Other(e) => e.fmt(f),
            BootError::StuckVcpu {
                probe,
                configured,
                timeout,
            } => write!(
                f,
                "guest CPU probe: {} of {} online CPUs ({configured} configured) ran a thread \
                 pinned to them within {} s; not running: {:?} (a stuck vCPU)",
                probe.ran.len(),
                probe.cpus,
                timeout.as_secs(),
                probe.missing
            ),
            BootError::KernelProblems(lines) => {
                write!(
                    f,
                    "kernel reported problems during boot:\n{}",
                    lines.join("\n")
                )
            }
        }
    }
}

impl std::error::Error for BootError {}

/// Every harness error is a boot error of no particular kind.
macro_rules! other_boot_error {
    ($($t:ty),*) => {$(
        impl From<$t> for BootError {
            fn from(e: $t) -> Self {
                BootError::Other(e.into())
            }
        }
    )*};
}
other_boot_error!(
    Error,
    std::io::Error,
    serde_json::Error,
    vnic_ctl_proto::CtlError,
    String,
    &str
);

impl From<BootError> for Error {
    fn from(e: BootError) -> Self {
        match e {
            BootError::NoHello(e) | BootError::Other(e) => e,
            other => Error(other.to_string()),
        }
    }
}

/// Return early with a formatted [`Error`].
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::harness::Error(format!($($t)*))) };
}

/// Fail with a formatted [`Error`] unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($c:expr, $($t:tt)*) => { if !$c { $crate::bail!($($t)*); } };
}

/// Add context to an error.
pub trait Context<T> {
    fn ctx(self, what: impl fmt::Display) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error(format!("{what}: {e}")))
    }
}

/// Poll `f` every 50 ms..500 ms until it yields `Some`, or fail after `timeout`.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    settle(timeout, || {
        let v = f()?;
        let done = v.is_some();
        Ok((v, done))
    })?
    .ok_or_else(|| {
        Error(format!(
            "timed out after {:.1}s waiting for {what}",
            timeout.as_secs_f64()
        ))
    })
}

/// Calls `f` (50 ms apart at first, backing off to 500 ms) until it says
/// done or `timeout` has passed, and returns its last value either way:
/// for reads that must agree once what is in flight has landed, where the
/// caller's own checks judge a value that never settled.
pub fn settle<T>(timeout: Duration, mut f: impl FnMut() -> Result<(T, bool)>) -> Result<T> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(50);
    loop {
        let (v, done) = f()?;
        if done || start.elapsed() >= timeout {
            return Ok(v);
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// The repository root: `VNIC_REPO`, else the parent of this crate's manifest dir.
pub fn repo_root() -> PathBuf {
    if let Ok(p) = std::env::var("VNIC_REPO") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// A directory for one test's artifacts (console log, vnic log and trace,
/// stats snapshots, module counters, dmesg).
#[derive(Debug, Clone)]
pub struct Artifacts {
    pub dir: PathBuf,
}

impl Artifacts {
    pub fn new(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir).ctx(format!("creating {}", dir.display()))?;
        Ok(Artifacts { dir })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Write (replace) a text artifact. Failures are reported, not fatal:
    /// losing an artifact must not change a test's verdict.
    pub fn write(&self, name: &str, text: &str) {
        if let Err(e) = std::fs::write(self.path(name), text) {
            eprintln!("warning: writing artifact {name}: {e}");
        }
    }

    pub fn write_json(&self, name: &str, v: &impl serde::Serialize) {
        match serde_json::to_string_pretty(v) {
            Ok(s) => self.write(name, &s),
            Err(e) => eprintln!("warning: encoding artifact {name}: {e}"),
        }
    }
}

/// A command-line number `s` for option `name`, within `lo..=hi`: clap's
/// `value_parser` for the numeric options (its `String` error is what clap
/// prints).
pub fn parse_num(s: &str, name: &str, lo: u64, hi: u64) -> std::result::Result<u64, String> {
    let v: u64 = s
        .parse()
        .map_err(|_| format!("{name}: {s:?} is not a number"))?;
    if v < lo || v > hi {
        return Err(format!("{name} must be in {lo}..={hi}, got {v}"));
    }
    Ok(v)
}

/// Seconds since the Unix epoch as `YYYYmmdd-HHMMSS` (UTC), for directory names.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Kill a child process and reap it (used by every Drop).
pub(crate) fn kill_child(child: &mut std::process::Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Counters a scenario asked for that were not there (see [`missing`]).
static MISSING: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Records that a counter was absent where one was read: the reader gets
/// 0 to go on with, and the scenario fails (the runner takes the list with
/// [`take_missing`]): an absent counter is never silently read as 0.
pub fn missing(what: String) {
    MISSING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(what);
}

/// The absent counters recorded since the last call (deduplicated).
pub fn take_missing() -> Vec<String> {
    let mut v = std::mem::take(
        &mut *MISSING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_shape() {
        let t = timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert_eq!(&t[8..9], "-");
        assert!(t.starts_with("20"), "{t}");
    }

    #[test]
    fn wait_for_times_out() {
        let e = wait_for::<()>(Duration::from_millis(120), "nothing", || Ok(None)).unwrap_err();
        assert!(e.0.contains("waiting for nothing"), "{e}");
        let mut n = 0;
        let v = wait_for(Duration::from_secs(5), "three polls", || {
            n += 1;
            Ok((n == 3).then_some(7))
        })
        .unwrap();
        assert_eq!((v, n), (7, 3));
    }
}
