//! Which accelerator the guests run under: KVM when it works on this host,
//! TCG otherwise, decided the way `scripts/run-qemu --accel auto` does and
//! sharing its cached answer.
//!
//! `/dev/kvm` being there is not enough (on some hosts it opens, and a
//! guest then spins in the kernel without printing a line): a short probe
//! boot of the guest kernel without an initrd must print its banner within
//! 20 s. The answer is cached per host boot in `$VNIC_CACHE/kvm-probe`
//! (line 1: the boot id, line 2: `ok` or `fail`), the file run-qemu
//! writes and reads. `VNIC_ACCEL=tcg|kvm` forces a choice.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The accelerator of every guest of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Tcg,
    Kvm,
}

impl Accel {
    /// QEMU's arguments for it.
    pub fn qemu_args(self) -> [&'static str; 4] {
        match self {
            Accel::Kvm => ["-accel", "kvm", "-cpu", "host"],
            Accel::Tcg => ["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG (software emulation)",
        }
    }
}

/// What to do, from what is known without booting anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Use this, for this reason.
    Use(Accel, String),
    /// Boot the probe (then cache its answer).
    Probe,
}

/// The decision: `requested` is `VNIC_ACCEL` (`auto` when unset),
/// `kvm_rw` whether /dev/kvm opens for reading and writing, `stamp` the
/// probe cache's text if any, `boot_id` this host boot's id.
pub fn decide(requested: &str, kvm_rw: bool, stamp: Option<&str>, boot_id: &str) -> Step {
    match requested {
        "tcg" => return Step::Use(Accel::Tcg, "VNIC_ACCEL=tcg".into()),
        "kvm" => return Step::Use(Accel::Kvm, "VNIC_ACCEL=kvm".into()),
        _ => {}
    }
    if !kvm_rw {
        return Step::Use(Accel::Tcg, "no usable /dev/kvm".into());
    }
    let mut lines = stamp.unwrap_or_default().lines();
    match (lines.next(), lines.next()) {
        (Some(id), Some("ok")) if id == boot_id => {
            Step::Use(Accel::Kvm, "KVM probe boot passed (cached)".into())
        }
        (Some(id), Some("fail")) if id == boot_id => Step::Use(
            Accel::Tcg,
            "KVM probe boot printed nothing within 20 s (cached)".into(),
        ),
        _ => Step::Probe,
    }
}

fn cache_dir() -> PathBuf {
    std::env::var_os("VNIC_CACHE").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/vnic")
        },
        PathBuf::from,
    )
}

/// Boots `kernel` under KVM without an initrd: true if it printed its
/// banner within 20 s.
fn probe(qemu: &str, kernel: &Path) -> bool {
    let log = std::env::temp_dir().join(format!("vnic-kvm-probe-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let child = Command::new(qemu)
        .args([
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-machine",
            "q35",
            "-m",
            "256M",
            "-smp",
            "1",
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
            "-serial",
        ])
        .arg(format!("file:{}", log.display()))
        .arg("-kernel")
        .arg(kernel)
        .args(["-append", "console=ttyS0 panic=-1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return false;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut ok = false;
    while std::time::Instant::now() < deadline {
        if std::fs::read_to_string(&log).is_ok_and(|t| t.contains("Linux version")) {
            ok = true;
            break;
        }
        if child.try_wait().ok().flatten().is_some() {
            ok = std::fs::read_to_string(&log).is_ok_and(|t| t.contains("Linux version"));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&log);
    ok
}

static CHOICE: OnceLock<Accel> = OnceLock::new();

/// The accelerator chosen by [`resolve`], if a guest booted yet.
pub fn chosen() -> Option<Accel> {
    CHOICE.get().copied()
}

/// The accelerator for guests of `kernel` (decided once per process) and
/// why; the first call prints it.
pub fn resolve(qemu: &str, kernel: &Path) -> Accel {
    *CHOICE.get_or_init(|| {
        let requested = std::env::var("VNIC_ACCEL").unwrap_or_else(|_| "auto".into());
        let kvm_rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        let stamp_path = cache_dir().join("kvm-probe");
        let stamp = std::fs::read_to_string(&stamp_path).ok();
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
        let (accel, why) = match decide(&requested, kvm_rw, stamp.as_deref(), &boot_id) {
            Step::Use(a, why) => (a, why),
            Step::Probe => {
                eprintln!(
                    "[guest-tests] probing KVM with a short boot (cached per host boot in {})",
                    stamp_path.display()
                );
                let ok = probe(qemu, kernel);
                let _ = std::fs::create_dir_all(cache_dir());
                let _ = std::fs::write(
                    &stamp_path,
                    format!("{boot_id}\n{}\n", if ok { "ok" } else { "fail" }),
                );
                if ok {
                    (Accel::Kvm, "KVM probe boot passed".to_string())
                } else {
                    (
                        Accel::Tcg,
                        "KVM probe boot printed nothing within 20 s".to_string(),
                    )
                }
            }
        };
        eprintln!("[guest-tests] guests run under {} ({why})", accel.name());
        accel
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_follows_the_probe_and_the_override() {
        let id = "b0a7";
        assert_eq!(
            decide("tcg", true, Some("b0a7\nok\n"), id),
            Step::Use(Accel::Tcg, "VNIC_ACCEL=tcg".into())
        );
        assert!(matches!(
            decide("kvm", false, None, id),
            Step::Use(Accel::Kvm, _)
        ));
        // No /dev/kvm: TCG without a probe.
        assert!(matches!(
            decide("auto", false, Some("b0a7\nok\n"), id),
            Step::Use(Accel::Tcg, _)
        ));
        // A probe of this boot decides; one of another boot, or none, is redone.
        assert!(matches!(
            decide("auto", true, Some("b0a7\nok\n"), id),
            Step::Use(Accel::Kvm, _)
        ));
        assert!(matches!(
            decide("auto", true, Some("b0a7\nfail\n"), id),
            Step::Use(Accel::Tcg, _)
        ));
        assert_eq!(decide("auto", true, Some("old\nok\n"), id), Step::Probe);
        assert_eq!(decide("auto", true, None, id), Step::Probe);
        assert_eq!(decide("auto", true, Some("garbage"), id), Step::Probe);
    }

    #[test]
    fn qemu_arguments() {
        assert_eq!(Accel::Kvm.qemu_args(), ["-accel", "kvm", "-cpu", "host"]);
        assert_eq!(Accel::Tcg.qemu_args()[1], "tcg,thread=multi");
    }
}
