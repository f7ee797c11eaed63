//! Running a real `vnic serve` process for tests and the benchmark: a private
//! temporary directory for its sockets, the child process (killed on drop,
//! its stderr kept in a log file to show on failure), and polling helpers.
//!
//! Every process a test starts is held by a [`ChildGuard`] (or a [`Daemon`],
//! which holds one): it is killed and reaped when the guard drops, also
//! while a test panics, so a failed test leaves no daemon behind that holds
//! the test harness's output pipe open (with that pipe open `cargo test`
//! never returns).

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vnic_ctl_proto::{Client, CtlError};

/// A directory removed (recursively) on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A new directory under `$TMPDIR` (or `/tmp`).
    pub fn new(tag: &str) -> io::Result<Self> {
        Self::new_in(&std::env::temp_dir(), tag)
    }

    /// A new directory under `base`.
    pub fn new_in(base: &Path, tag: &str) -> io::Result<Self> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("vnic-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path)?;
        Ok(TempDir { path })
    }

    /// A new directory of mode 0755 under `/tmp` itself (not `$TMPDIR`,
    /// which may sit in a home directory of mode 0700), for files that
    /// another uid must reach. Fails, saying why, if another uid could not
    /// reach it (an ancestor without search permission for others).
    pub fn public(tag: &str) -> io::Result<Self> {
        let d = Self::new_in(Path::new("/tmp"), tag)?;
        fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755))?;
        others_can_reach(d.path())?;
        Ok(d)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Whether a process of another uid (neither owner nor group) can search
/// every directory down to `path`: an error naming the first that it
/// cannot.
pub fn others_can_reach(path: &Path) -> io::Result<()> {
    let path = fs::canonicalize(path)?;
    for dir in path.ancestors() {
        let meta = fs::metadata(dir)?;
        let mode = meta.permissions().mode();
        if meta.is_dir() && mode & 0o001 == 0 {
            return Err(io::Error::other(format!(
                "{} (mode {:o}) cannot be searched by other users, so {} is out of their reach",
                dir.display(),
                mode & 0o7777,
                path.display()
            )));
        }
    }
    Ok(())
}

/// A copy of an executable that any uid can run: in a 0755 directory
/// under `/tmp`, mode 0755, removed on drop. A test that runs a binary of
/// the build as another uid (`nobody`) needs one: the build's own
/// `target/` may sit in a home directory of mode 0700 (root's is), where
/// that uid cannot reach it.
#[derive(Debug)]
pub struct SharedBinary {
    path: PathBuf,
    _dir: TempDir,
}

impl SharedBinary {
    pub fn new(bin: &Path) -> io::Result<Self> {
        let dir = TempDir::public("bin")?;
        let name = bin
            .file_name()
            .ok_or_else(|| io::Error::other(format!("{}: no file name", bin.display())))?;
        let path = dir.path().join(name);
        // A hard link shares the file's mode (0755 as cargo writes it) and
        // costs nothing; across file systems, a copy.
        if fs::hard_link(bin, &path).is_err() {
            fs::copy(bin, &path)?;
        }
        let mode = fs::metadata(&path)?.permissions().mode();
        if mode & 0o005 != 0o005 {
            // Never chmod a hard link: that would change the build's file.
            fs::remove_file(&path)?;
            fs::copy(bin, &path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
        }
        others_can_reach(&path)?;
        Ok(SharedBinary { path, _dir: dir })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A child process that is killed (SIGKILL) and reaped when the guard
/// drops, also when the test holding it panics. Spawn every process of a
/// test through one (or through [`Daemon`]).
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    /// Spawn `cmd`. Its stdin is /dev/null; give it a stdout and stderr of
    /// its own (a file, a pipe, /dev/null): one inherited from a test is
    /// the test harness's output pipe, and a process that outlives the
    /// test holding it keeps `cargo test` from returning. A child that
    /// shares this process's stdout or stderr pipe is killed at once and
    /// refused with an error saying so.
    pub fn spawn(cmd: &mut Command) -> io::Result<Self> {
        let child = cmd.stdin(Stdio::null()).spawn()?;
        let mut g = ChildGuard { child: Some(child) };
        for fd in [1, 2] {
            let ours = fs::read_link(format!("/proc/self/fd/{fd}"));
            let theirs = fs::read_link(format!("/proc/{}/fd/{fd}", g.id().unwrap_or(0)));
            if let (Ok(ours), Ok(theirs)) = (ours, theirs) {
                // The same pipe or socket (a file, /dev/null or a terminal
                // opened twice reads the same too, but holds nobody up).
                let shared = ours.to_string_lossy();
                if ours == theirs && (shared.starts_with("pipe:") || shared.starts_with("socket:"))
                {
                    g.kill();
                    return Err(io::Error::other(format!(
                        "{cmd:?} would share this process's fd {fd} ({}): give it a stdout and stderr of its own",
                        ours.display()
                    )));
                }
            }
        }
        Ok(g)
    }

    /// The process id (`None` once reaped by [`ChildGuard::kill`] or
    /// [`ChildGuard::wait_with_output`]).
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => c.try_wait(),
            None => Err(io::Error::other("already reaped")),
        }
    }

    /// Wait for the exit and collect piped output (blocks until it exits:
    /// call it once `try_wait` saw the exit, or on a process that ends by
    /// itself).
    pub fn wait_with_output(mut self) -> io::Result<Output> {
        match self.child.take() {
            Some(c) => c.wait_with_output(),
            None => Err(io::Error::other("already reaped")),
        }
    }

    /// The process, to take its pipes or wait for it (still killed when
    /// the guard drops).
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// The process itself (not killed on drop any more).
    pub fn into_inner(mut self) -> Option<Child> {
        self.child.take()
    }

    /// Kill and reap now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `vnic serve` child process.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
    pub ctl: PathBuf,
    pub log: PathBuf,
    pub dir: TempDir,
}

impl Daemon {
    /// Start `bin serve --socket DIR/vnic.sock --ctl DIR/ctl.sock` plus
    /// `args`, and wait until both sockets exist.
    pub fn start<S: AsRef<std::ffi::OsStr>>(bin: &Path, args: &[S]) -> io::Result<Daemon> {
        let dir = TempDir::new("dev")?;
        let socket = dir.path().join("vnic.sock");
        let ctl = dir.path().join("ctl.sock");
        let log = dir.path().join("vnic.log");
        let mut argv: Vec<OsString> = vec![
            "serve".into(),
            "--socket".into(),
            socket.clone().into(),
            "--ctl".into(),
            ctl.clone().into(),
        ];
        argv.extend(args.iter().map(|a| a.as_ref().to_owned()));
        let logf = fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .env(
                "RUST_LOG",
                std::env::var("VNIC_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .spawn()?;
        let mut d = Daemon {
            child: Some(child),
            socket,
            ctl,
            log,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(d.socket.exists() && d.ctl.exists()) {
            if let Some(st) = d.try_wait()? {
                return Err(io::Error::other(format!(
                    "vnic serve {argv:?} exited early with {st}:\n{}",
                    d.log_text()
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "vnic serve did not create {} and {} within 30 s:\n{}",
                    d.socket.display(),
                    d.ctl.display(),
                    d.log_text()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    /// What the daemon printed so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => c.try_wait(),
            None => Ok(None),
        }
    }

    /// Send SIGTERM and wait for the exit (up to `timeout`).
    pub fn terminate(&mut self, timeout: Duration) -> io::Result<ExitStatus> {
        let Some(mut c) = self.child.take() else {
            return Err(io::Error::other("already reaped"));
        };
        // SAFETY: kill(2) on the pid of our own, not yet reaped child.
        unsafe { libc::kill(c.id().cast_signed(), libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return Err(io::Error::other("vnic did not exit after SIGTERM"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- vnic daemon log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// What [`wait_for`] waited for in vain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    pub what: String,
    pub after: Duration,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.after, self.what
        )
    }
}

impl std::error::Error for TimedOut {}

/// Poll `f` until it returns `Some`, or fail after `timeout` naming `what`.
pub fn wait_for<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, TimedOut> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(TimedOut {
                what: what.to_string(),
                after: timeout,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// A client of the daemon's control socket at `path` (`vnic-ctl-proto`'s),
/// connecting for up to 20 s while the daemon has created the socket file
/// but is not listening yet (ECONNREFUSED) or not created it.
pub fn ctl(path: &Path) -> Result<Client, CtlError> {
    Client::connect_wait(path, Duration::from_secs(20))
}

/// Why [`vnic_binary`] found no daemon binary.
#[derive(Debug, thiserror::Error)]
pub enum VnicBinaryError {
    /// The running executable's path, next to which the daemon is looked
    /// for, is unknown.
    #[error("the path of the running executable: {0}")]
    CurrentExe(#[source] io::Error),
    /// The running executable's path has no directory.
    #[error("{}: no parent directory", exe.display())]
    NoParent { exe: PathBuf },
    /// `cargo build` could not be run.
    #[error("running cargo build: {0}")]
    CargoSpawn(#[source] io::Error),
    /// `cargo build` ran and failed.
    #[error("cargo build -p vnic --bin vnic failed ({status})")]
    CargoFailed { status: ExitStatus },
    /// No `vnic` next to the running executable.
    #[error(
        "{} not found: build the daemon into the same target directory first \
         (cargo build --release -p vnic) or pass --vnic PATH",
        path.display()
    )]
    NotFound { path: PathBuf },
}

/// The `vnic` daemon binary for the bench binaries: `explicit`, or else
/// `vnic` next to the running executable. Under `cargo run` (only the
/// bench itself is built) it first runs `cargo build [--release] -p vnic
/// --bin vnic` with the same profile.
pub fn vnic_binary(explicit: Option<PathBuf>) -> Result<PathBuf, VnicBinaryError> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    let me = std::env::current_exe().map_err(VnicBinaryError::CurrentExe)?;
    let dir = me
        .parent()
        .ok_or_else(|| VnicBinaryError::NoParent { exe: me.clone() })?
        .to_path_buf();
    if let Ok(cargo) = std::env::var("CARGO") {
        // Under `cargo run` only this binary is built: build the daemon too.
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "vnic", "--bin", "vnic"]);
        // The daemon is another package of this workspace: name its manifest
        // (cargo run sets CARGO_MANIFEST_DIR to this package's directory), so
        // the build works whatever directory `cargo run` was started from.
        if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
            let manifest = PathBuf::from(dir).join("../Cargo.toml");
            if manifest.exists() {
                cmd.arg("--manifest-path").arg(manifest);
            }
        }
        if !cfg!(debug_assertions) {
            cmd.arg("--release");
        }
        eprintln!("building the vnic daemon binary...");
        let status = cmd.status().map_err(VnicBinaryError::CargoSpawn)?;
        if !status.success() {
            return Err(VnicBinaryError::CargoFailed { status });
        }
    }
    let p = dir.join("vnic");
    if p.exists() {
        Ok(p)
    } else {
        Err(VnicBinaryError::NotFound { path: p })
    }
}

/// File descriptors, threads and resident kB of process `pid` at rest: read
/// until two readings 100 ms apart agree on fds and threads (at most 5 s).
/// Between connections `vnic serve` tears the last one down (its worker
/// threads exit, then their fds are closed) and builds the next one (16
/// pairs: 16 worker threads and their eventfds) before it accepts; a
/// reading taken in the middle of that is neither state.
pub fn settled_footprint(pid: u32) -> (usize, usize, u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = footprint(pid);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let f = footprint(pid);
        if (f.0, f.1) == (last.0, last.1) || Instant::now() > deadline {
            return f;
        }
        last = f;
    }
}

/// File descriptors, threads and resident kB of process `pid`.
pub fn footprint(pid: u32) -> (usize, usize, u64) {
    let count = |dir: String| std::fs::read_dir(dir).map_or(0, Iterator::count);
    let rss_kb = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    (
        count(format!("/proc/{pid}/fd")),
        count(format!("/proc/{pid}/task")),
        rss_kb,
    )
}
