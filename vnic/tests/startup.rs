//! Start-up refuses what would break another daemon or a user's file, and
//! the sockets it creates are private whatever the umask.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

/// `vnic serve` that must fail at start (killed after 5 s if it does not).
fn serve_fails(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vnic"))
        .arg("serve")
        .args(args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn vnic serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(!st.success(), "vnic serve {args:?} exited 0");
            let out = child.wait_with_output().unwrap();
            return String::from_utf8_lossy(&out.stderr).into_owned();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vnic serve {args:?} started where it must refuse");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
        counter(&c.stats().unwrap(), "queue_pairs") == 1,
        "the first daemon answers"
    );
    assert!(std::fs::symlink_metadata(&d.socket)
        .unwrap()
        .file_type()
        .is_socket());
    // The same for its control socket.
    let dir = std::env::temp_dir().join(format!("vnic-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = serve_fails(&["--socket", p(&dir.join("s")), "--ctl", p(&d.ctl)]);
    assert!(e.contains("live process"), "{e}");

    // A regular file is never deleted.
    let file = dir.join("precious.txt");
    std::fs::write(&file, "keep me").unwrap();
    let e = serve_fails(&["--socket", p(&file)]);
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    // A directory says so (not "address already in use").
    let e = serve_fails(&["--socket", p(&dir)]);
    assert!(e.contains("directory"), "{e}");
    // --ctl equal to --socket.
    let s = dir.join("same.sock");
    let e = serve_fails(&["--socket", p(&s), "--ctl", p(&s)]);
    assert!(e.contains("is the --socket path"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stale_socket_is_replaced_and_sockets_are_private_whatever_the_umask() {
    let dir = std::env::temp_dir().join(format!("vnic-stale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("vnic.sock");
    // A socket file nobody listens on (its daemon died).
    drop(UnixListener::bind(&sock).unwrap());
    // SAFETY: umask(2) has no preconditions; this test process starts the
    // daemon as a child, which inherits the permissive mask.
    let old = unsafe { libc::umask(0) };
    let mut child = Command::new(env!("CARGO_BIN_EXE_vnic"))
        .args(["serve", "--socket", p(&sock), "--ctl", p(&dir.join("ctl"))])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let ok = wait_until(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(dir.join("ctl")).is_ok()
    });
    let modes: Vec<u32> = [sock.clone(), dir.join("ctl")]
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.permissions().mode() & 0o777))
        .collect();
    // Another user (nobody) gets no answer even on a socket opened up for it.
    std::fs::set_permissions(dir.join("ctl"), std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let other: Output = Command::new(env!("CARGO_BIN_EXE_vnic"))
        .args(["ctl", "--ctl", p(&dir.join("ctl")), "stats"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "vnic serve did not replace the stale socket");
    assert_eq!(modes, [0o600, 0o600], "socket modes under umask 000");
    assert!(!other.status.success(), "a foreign uid was served");
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("daemon's user or root"), "{err}");
}

#[test]
fn group_sockets_are_0660_theirs_and_serve_the_group() {
    use std::os::unix::fs::MetadataExt;
    // Under /tmp itself: nobody must be able to reach it.
    let dir = std::path::PathBuf::from(format!("/tmp/vnic-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (sock, ctl) = (dir.join("vnic.sock"), dir.join("ctl"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_vnic"))
        .args([
            "serve",
            "--socket",
            p(&sock),
            "--ctl",
            p(&ctl),
            "--group",
            "65534",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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
        Command::new("setpriv")
            .args(["--reuid=65534", &format!("--regid={gid}"), &groups])
            .arg(env!("CARGO_BIN_EXE_vnic"))
            .args(["ctl", "--ctl", p(&ctl), "stats"])
            .output()
            .expect("setpriv (util-linux)")
    };
    let member = as_user(65534, "");
    let supplementary = as_user(4242, "65534");
    // The file mode alone keeps an outsider out (EACCES); opened up, the
    // daemon's own check (SO_PEERCRED / SO_PEERGROUPS) must refuse it.
    let shut_out = as_user(4242, "");
    std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o666)).unwrap();
    let outsider = as_user(4242, "");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
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
