//! Start-up refuses what would break another daemon or a user's file, and
//! the sockets it creates are private whatever the umask.
//!
//! Every process started here is held by a `ChildGuard` (killed on drop,
//! also on panic) and has stdout/stderr of its own, never the test
//! harness's pipe. The checks that run `vnic` as uid 65534 run a copy of it
//! in a 0755 directory under /tmp (`SharedBinary`): the build may sit in a
//! home directory of mode 0700, which that uid cannot enter.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use vnic_frontend::harness::{ChildGuard, SharedBinary, TempDir};

const VNIC: &str = env!("CARGO_BIN_EXE_vnic");

/// `vnic serve` that must fail at start (killed after 5 s if it does not).
fn serve_fails(args: &[&str]) -> String {
    let mut child = ChildGuard::spawn(
        Command::new(VNIC)
            .arg("serve")
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null()),
    )
    .expect("spawn vnic serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(!st.success(), "vnic serve {args:?} exited 0");
            let out = child.wait_with_output().unwrap();
            return String::from_utf8_lossy(&out.stderr).into_owned();
        }
        // The guard kills the daemon when this panic unwinds.
        assert!(
            std::time::Instant::now() < deadline,
            "vnic serve {args:?} started where it must refuse"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// These checks run `vnic` as uid 65534: only root can. Without root the
/// test fails saying so (it is never reported as passing what it did not
/// check); leave it out with `--skip NAME` where root is not to be had.
fn require_root(test: &str) {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "{test}: needs root to run `vnic ctl` as uid 65534 (euid is {euid}); \
         not checked. Run as root, or leave it out with --skip {test}"
    );
}

/// A copy of the daemon binary that uid 65534 can run.
fn shared_vnic() -> SharedBinary {
    SharedBinary::new(Path::new(VNIC))
        .unwrap_or_else(|e| panic!("a copy of {VNIC} that uid 65534 can run: {e}"))
}

/// Run `cmd` to its end, guarded; its stdout and stderr piped.
fn output(cmd: &mut Command) -> Output {
    ChildGuard::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))
        .and_then(ChildGuard::wait_with_output)
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_live_daemon_a_file_a_directory_and_ctl_equal_socket_are_refused() {
    let d = daemon(&["--queues", "1"]);
    // A second daemon on the live one's socket: refused; the first is intact.
    let e = serve_fails(&["--socket", p(&d.socket), "--ctl", "/tmp/vnic-second-ctl"]);
    assert!(e.contains("live process"), "{e}");
    let mut c = ctl(&d);
    assert!(
        c.stats().unwrap().queue_pairs == 1,
        "the first daemon answers"
    );
    assert!(std::fs::symlink_metadata(&d.socket)
        .unwrap()
        .file_type()
        .is_socket());
    // The same for its control socket.
    let tmp = TempDir::new("startup").unwrap();
    let dir = tmp.path();
    let e = serve_fails(&["--socket", p(&dir.join("s")), "--ctl", p(&d.ctl)]);
    assert!(e.contains("live process"), "{e}");

    // A regular file is never deleted.
    let file = dir.join("precious.txt");
    std::fs::write(&file, "keep me").unwrap();
    let e = serve_fails(&["--socket", p(&file)]);
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    // A directory says so (not "address already in use").
    let e = serve_fails(&["--socket", p(dir)]);
    assert!(e.contains("directory"), "{e}");
    // --ctl equal to --socket.
    let s = dir.join("same.sock");
    let e = serve_fails(&["--socket", p(&s), "--ctl", p(&s)]);
    assert!(e.contains("is the --socket path"), "{e}");
}

#[test]
fn a_stale_socket_is_replaced_and_sockets_are_private_whatever_the_umask() {
    require_root("a_stale_socket_is_replaced_and_sockets_are_private_whatever_the_umask");
    // Under /tmp itself, 0755: uid 65534 must reach the control socket.
    let tmp = TempDir::public("stale").unwrap();
    let dir = tmp.path();
    let (sock, ctlp) = (dir.join("vnic.sock"), dir.join("ctl"));
    let other_vnic = shared_vnic();
    // A socket file nobody listens on (its daemon died).
    drop(UnixListener::bind(&sock).unwrap());
    let mut cmd = Command::new(VNIC);
    cmd.args(["serve", "--socket", p(&sock), "--ctl", p(&ctlp)])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec; umask(2) is
    // async-signal-safe, allocates nothing and cannot fail. Only the
    // daemon gets the permissive mask, not this (multi-threaded) test
    // process.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let _daemon = ChildGuard::spawn(&mut cmd).expect("spawn vnic serve");
    let ok = wait_until(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&ctlp).is_ok()
    });
    assert!(ok, "vnic serve did not replace the stale socket");
    let modes: Vec<u32> = [&sock, &ctlp]
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.permissions().mode() & 0o777))
        .collect();
    assert_eq!(modes, [0o600, 0o600], "socket modes under umask 000");
    // Another user (nobody) gets no answer even on a socket opened up for it.
    std::fs::set_permissions(&ctlp, std::fs::Permissions::from_mode(0o666)).unwrap();
    let other = output(
        Command::new(other_vnic.path())
            .args(["ctl", "--ctl", p(&ctlp), "stats"])
            .uid(65534)
            .gid(65534),
    );
    assert!(!other.status.success(), "a foreign uid was served");
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("daemon's user or root"), "{err}");
}

#[test]
fn group_sockets_are_0660_theirs_and_serve_the_group() {
    use std::os::unix::fs::MetadataExt;
    require_root("group_sockets_are_0660_theirs_and_serve_the_group");
    // Under /tmp itself, 0755: nobody must be able to reach it.
    let tmp = TempDir::public("group").unwrap();
    let dir = tmp.path();
    let (sock, ctl) = (dir.join("vnic.sock"), dir.join("ctl"));
    let other_vnic = shared_vnic();
    let _daemon = ChildGuard::spawn(
        Command::new(VNIC)
            .args([
                "serve",
                "--socket",
                p(&sock),
                "--ctl",
                p(&ctl),
                "--group",
                "65534",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("spawn vnic serve --group");
    let ok = wait_until(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&ctl).is_ok()
    });
    let meta: Vec<(u32, u32)> = [&sock, &ctl]
        .iter()
        .map(|f| std::fs::metadata(f).map_or((0, 0), |m| (m.mode() & 0o777, m.gid())))
        .collect();
    // setpriv (util-linux) drops to uid nobody with the given groups.
    let as_user = |gid: u32, groups: &str| -> Output {
        let groups = if groups.is_empty() {
            "--clear-groups".to_string()
        } else {
            format!("--groups={groups}")
        };
        output(
            Command::new("setpriv")
                .args(["--reuid=65534", &format!("--regid={gid}"), &groups])
                .arg(other_vnic.path())
                .args(["ctl", "--ctl", p(&ctl), "stats"]),
        )
    };
    let member = as_user(65534, "");
    let supplementary = as_user(4242, "65534");
    // The file mode alone keeps an outsider out (EACCES); opened up, the
    // daemon's own check (SO_PEERCRED / SO_PEERGROUPS) must refuse it.
    let shut_out = as_user(4242, "");
    std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o666)).unwrap();
    let outsider = as_user(4242, "");
    assert!(ok, "vnic serve --group did not start");
    assert_eq!(meta, [(0o660, 65534), (0o660, 65534)], "modes and groups");
    assert!(
        member.status.success(),
        "primary group member refused: {}",
        String::from_utf8_lossy(&member.stderr)
    );
    assert!(
        supplementary.status.success(),
        "supplementary group member refused: {}",
        String::from_utf8_lossy(&supplementary.stderr)
    );
    assert!(
        String::from_utf8_lossy(&shut_out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&shut_out.stderr)
    );
    assert!(
        !outsider.status.success(),
        "a process outside the group was served"
    );
    assert!(
        String::from_utf8_lossy(&outsider.stderr).contains("--group"),
        "{}",
        String::from_utf8_lossy(&outsider.stderr)
    );
    // An unknown group name is refused at start with its name.
    let err = serve_fails(&[
        "--socket",
        "/tmp/vnic-nogroup.sock",
        "--group",
        "no-such-group-vnic",
    ]);
    assert!(err.contains("no-such-group-vnic"), "{err}");
}

fn wait_until(t: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + t;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
