//! Building the pieces a guest boot needs. Kernels and the initramfs come
//! from the `images/` scripts (which cache them); the agent and the module
//! are built here for the exact kernel tree.

use super::{repo_root, Context, Result};
use crate::bail;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A guest kernel: the boot image and the built tree (KDIR) modules are
/// compiled against.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// Label used in reports: the series (`6.12`, `7.3`), `6.1-deb` or `custom`.
    pub label: String,
    pub bzimage: PathBuf,
    pub kdir: PathBuf,
    /// Modules of the kernel itself the initramfs carries and loads before
    /// the agent (a distribution kernel's virtio drivers), in load order.
    pub boot_modules: Vec<PathBuf>,
}

/// The suffix of a `--kernel` series meaning Debian's prebuilt kernel of
/// that series (`6.1-deb`) instead of one built from source.
pub const DISTRO_SUFFIX: &str = "-deb";

/// Debian's prebuilt kernel of `series` with its headers
/// (`images/fetch-distro-kernel`): nothing is compiled but the module.
pub fn kernel_distro(series: &str) -> Result<Kernel> {
    let script = repo_root().join("images/fetch-distro-kernel");
    let out = run_stdout(
        Command::new(&script).args(["--series", series]),
        &format!("images/fetch-distro-kernel --series {series}"),
    )?;
    let dir = PathBuf::from(out.lines().last().unwrap_or_default());
    let list = std::fs::read_to_string(dir.join("modules"))
        .ctx(format!("reading {}/modules", dir.display()))?;
    let k = Kernel {
        label: format!("{series}{DISTRO_SUFFIX}"),
        bzimage: dir.join("bzImage"),
        kdir: dir.join("build"),
        boot_modules: list
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect(),
    };
    if !k.bzimage.is_file() || !k.kdir.is_dir() || k.boot_modules.is_empty() {
        bail!(
            "images/fetch-distro-kernel printed {} but it has no bzImage/build/modules",
            dir.display()
        );
    }
    // What it must have, as built in or as a module the initramfs loads.
    let config = std::fs::read_to_string(k.kdir.join(".config"))
        .ctx(format!("reading {}/.config", k.kdir.display()))?;
    let missing: Vec<String> = missing_config(&config)
        .into_iter()
        .filter(|m| {
            !(MODULAR_OK
                .iter()
                .any(|o| m.starts_with(&format!("CONFIG_{o} ")))
                && m.ends_with("=m"))
        })
        .collect();
    if !missing.is_empty() {
        bail!(
            "Debian's {series} kernel lacks options the suite needs:\n  {}",
            missing.join("\n  ")
        );
    }
    Ok(k)
}

/// Options of [`NEEDED_CONFIG`] a distribution kernel may have as modules
/// (the initramfs loads them before the agent).
const MODULAR_OK: &[&str] = &["VIRTIO_PCI", "VIRTIO_NET", "VIRTIO_CONSOLE"];

/// Run a command, inheriting stderr (progress), returning trimmed stdout.
fn run_stdout(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .ctx(format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The cached kernel of a series, built by `images/build-kernel` if missing.
pub fn kernel_series(series: &str, variant: &str) -> Result<Kernel> {
    let script = repo_root().join("images/build-kernel");
    if !script.exists() {
        bail!(
            "{} not found: the images/ recipes are missing",
            script.display()
        );
    }
    let out = run_stdout(
        Command::new(&script).args(["--series", series, "--variant", variant]),
        &format!("images/build-kernel --series {series}"),
    )?;
    let dir = PathBuf::from(out.lines().last().unwrap_or_default());
    let k = Kernel {
        label: series.to_string(),
        bzimage: dir.join("bzImage"),
        kdir: dir.join("build"),
        boot_modules: Vec::new(),
    };
    if !k.bzimage.is_file() || !k.kdir.is_dir() {
        bail!(
            "images/build-kernel printed {} but it has no bzImage/build",
            dir.display()
        );
    }
    Ok(k)
}

/// A user's own kernel (`--kernel-image BZIMAGE --kdir TREE`).
pub fn kernel_custom(bzimage: &Path, kdir: &Path) -> Result<Kernel> {
    if !bzimage.is_file() {
        bail!("--kernel-image {}: no such file", bzimage.display());
    }
    if !kdir.join("include/config/kernel.release").is_file() {
        bail!(
            "--kdir {}: not a built kernel tree (no include/config/kernel.release)",
            kdir.display()
        );
    }
    let release = kernel_release(kdir)?;
    let image = std::fs::read(bzimage).ctx(format!("reading {}", bzimage.display()))?;
    match bzimage_release(&image) {
        Some(r) if r == release => {}
        Some(r) => bail!(
            "--kernel-image {} is release {r}, but --kdir {} is {release}: the module would not load",
            bzimage.display(),
            kdir.display()
        ),
        None => bail!(
            "--kernel-image {}: not an x86 bzImage (no kernel version in its setup header)",
            bzimage.display()
        ),
    }
    let config = std::fs::read_to_string(kdir.join(".config"))
        .ctx(format!("reading {}/.config", kdir.display()))?;
    let missing = missing_config(&config);
    if !missing.is_empty() {
        bail!(
            "--kdir {}: the kernel lacks what the suite needs (build it in, =y):\n  {}",
            kdir.display(),
            missing.join("\n  ")
        );
    }
    Ok(Kernel {
        label: "custom".into(),
        bzimage: bzimage.to_path_buf(),
        kdir: kdir.to_path_buf(),
        boot_modules: Vec::new(),
    })
}

/// What a guest kernel must have built in (`=y`) for the suite: the
/// initramfs loads no driver module of a kernel built here or of your own,
/// only vnic_arfs.ko and its test helpers (a distribution kernel may have
/// the virtio drivers as modules: [`kernel_distro`]).
const NEEDED_CONFIG: &[(&str, &str)] = &[
    ("SMP", "several vCPUs"),
    ("ACPI", "-smp N and power-off under QEMU"),
    ("PCI", "the virtio PCI devices"),
    ("BLK_DEV_INITRD", "the initramfs"),
    ("DEVTMPFS", "/dev in the initramfs"),
    ("PROC_FS", "/proc"),
    ("SYSFS", "/sys"),
    ("SERIAL_8250_CONSOLE", "the console log"),
    ("VIRTIO_PCI", "virtio over PCI"),
    ("VIRTIO_NET", "the NIC under test"),
    ("VIRTIO_CONSOLE", "the agent's virtio-serial port"),
    ("INET", "IPv4"),
    ("PACKET", "AF_PACKET (hostile-mgmt)"),
    ("RPS", "RPS/RFS"),
    ("RFS_ACCEL", "ndo_rx_flow_steer"),
    ("XPS", "per-CPU tx queues"),
    (
        "NET_RX_BUSY_POLL",
        "NAPI ids (SO_INCOMING_NAPI_ID: the guest-side queue check)",
    ),
    ("DEBUG_FS", "the module's counters"),
    ("MODULES", "loading vnic_arfs.ko"),
    ("MODULE_UNLOAD", "the unload scenarios"),
];

/// Each needed option the `.config` text does not set to `y`, with why it
/// is needed.
pub fn missing_config(config: &str) -> Vec<String> {
    NEEDED_CONFIG
        .iter()
        .filter(|(name, _)| {
            !config
                .lines()
                .any(|l| l.trim() == format!("CONFIG_{name}=y"))
        })
        .map(|(name, why)| {
            let now = config
                .lines()
                .find(|l| l.starts_with(&format!("CONFIG_{name}=")))
                .map_or("not set".to_string(), |l| l.trim().to_string());
            format!("CONFIG_{name} ({why}): {now}")
        })
        .collect()
}

/// The release in an x86 bzImage's setup header: the boot protocol's
/// `kernel_version` field (offset 0x20e) points, 0x200 bytes on, at the
/// version string whose first word is the release.
pub fn bzimage_release(image: &[u8]) -> Option<String> {
    if image.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let off = usize::from(u16::from_le_bytes([*image.get(0x20e)?, *image.get(0x20f)?])) + 0x200;
    let s = image.get(off..)?;
    let end = s.iter().position(|&b| b == 0 || b == b' ')?;
    std::str::from_utf8(&s[..end]).ok().map(String::from)
}

/// Kernel release of a built tree.
pub fn kernel_release(kdir: &Path) -> Result<String> {
    Ok(
        std::fs::read_to_string(kdir.join("include/config/kernel.release"))
            .ctx(format!(
                "reading {}/include/config/kernel.release",
                kdir.display()
            ))?
            .trim()
            .to_string(),
    )
}

/// Build the static guest agent (crate `vnic-agent`, `guest-tests/agent/`) into
/// `target/agent` (a target dir of its own, so the host build is not
/// invalidated by the different RUSTFLAGS). The crate depends on none of the
/// daemon's, so a change to vnic or arfs does not rebuild the agent.
pub fn agent() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("VNIC_AGENT") {
        return Ok(PathBuf::from(p));
    }
    let root = repo_root();
    let tdir = root.join("target/agent");
    eprintln!("[guest-tests] building the static guest agent (target/agent)");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C strip=debuginfo",
        )
        .env_remove("CARGO_TARGET_DIR")
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "vnic-agent",
            "--bin",
            "vnic-agent",
        ])
        .args(["--target", "x86_64-unknown-linux-gnu", "--target-dir"])
        .arg(&tdir)
        .stdin(Stdio::null())
        .status()
        .ctx("running cargo for the agent")?;
    if !status.success() {
        bail!("building vnic-agent failed ({status})");
    }
    let bin = tdir.join("x86_64-unknown-linux-gnu/release/vnic-agent");
    if !bin.is_file() {
        bail!("agent build produced no {}", bin.display());
    }
    Ok(bin)
}

/// The `vnic` binary: `VNIC_BIN`, else the workspace's release build
/// (built if missing).
pub fn vnic_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("VNIC_BIN") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("VNIC_BIN={} does not exist", p.display());
        }
        return Ok(p);
    }
    let root = repo_root();
    let target =
        std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), PathBuf::from);
    eprintln!("[guest-tests] building vnic (release)");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "vnic",
            "--bin",
            "vnic",
        ])
        .stdin(Stdio::null())
        .status()
        .ctx("running cargo for vnic")?;
    if !status.success() {
        bail!("building vnic failed ({status})");
    }
    let bin = target.join("release/vnic");
    if !bin.is_file() {
        bail!("no vnic binary at {}", bin.display());
    }
    Ok(bin)
}

/// Copies the kernel sources of `src` (`.c`, `.h`, `Kbuild`, `Makefile`)
/// into `dst`.
fn copy_kbuild_sources(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).ctx(format!("creating {}", dst.display()))?;
    for ent in std::fs::read_dir(src).ctx(format!("reading {}", src.display()))? {
        let ent = ent?;
        let name = ent.file_name();
        let n = name.to_string_lossy();
        let keep = n.ends_with(".c") || n.ends_with(".h") || n == "Kbuild" || n == "Makefile";
        if keep && ent.file_type()?.is_file() {
            std::fs::copy(ent.path(), dst.join(&name)).ctx(format!("copying {n}"))?;
        }
    }
    Ok(())
}

/// [`module_build`], once per kernel tree and run of the suite: later
/// boots of the same tree (other topologies, families, boot kinds) reuse
/// the first build's modules (or its error).
pub fn module(kdir: &Path, work: &Path) -> Result<Vec<PathBuf>> {
    type Built = std::collections::HashMap<PathBuf, std::result::Result<Vec<PathBuf>, String>>;
    static BUILT: std::sync::OnceLock<std::sync::Mutex<Built>> = std::sync::OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(r) = built.get(kdir) {
        if r.as_ref().is_ok_and(|kos| kos.iter().all(|k| k.is_file())) || r.is_err() {
            if r.is_ok() {
                eprintln!(
                    "[guest-tests] vnic_arfs.ko for {} built earlier in this run",
                    kdir.display()
                );
            }
            return r.clone().map_err(Into::into);
        }
    }
    let r = module_build(kdir, work);
    built.insert(
        kdir.to_path_buf(),
        r.as_ref().map(Clone::clone).map_err(|e| e.0.clone()),
    );
    r
}

/// Build `vnic_arfs.ko` and the test helper modules of `aRFS/kmod/tests/`
/// (`vnic_opswap.ko`, `vnic_flowgen.ko`, `vnic_flowhash.ko`) for one kernel tree; returns them, `vnic_arfs.ko`
/// first. The sources are copied into `work` first so builds for
/// different kernels never share objects.
pub fn module_build(kdir: &Path, work: &Path) -> Result<Vec<PathBuf>> {
    let src = repo_root().join("aRFS/kmod");
    if !src.join("Kbuild").is_file() {
        bail!(
            "{} has no Kbuild: the guest module is missing",
            src.display()
        );
    }
    let _ = std::fs::remove_dir_all(work);
    copy_kbuild_sources(&src, work)?;
    copy_kbuild_sources(&src.join("tests"), &work.join("tests"))?;
    eprintln!(
        "[guest-tests] building vnic_arfs.ko against {}",
        kdir.display()
    );
    let ko = make_module(kdir, work, "vnic_arfs.ko")?;
    let tests = work.join("tests");
    let opswap = make_module(kdir, &tests, "vnic_opswap.ko")?;
    let mut kos = vec![ko, opswap];
    for name in ["vnic_flowgen.ko", "vnic_flowhash.ko"] {
        let k = tests.join(name);
        if !k.is_file() {
            bail!("make produced no {}", k.display());
        }
        kos.push(k);
    }
    Ok(kos)
}

/// `make -C kdir M=dir modules`, its output kept in `dir/build.log`;
/// returns `dir/ko`.
fn make_module(kdir: &Path, dir: &Path, ko: &str) -> Result<PathBuf> {
    let out = Command::new("make")
        .arg("-C")
        .arg(kdir)
        .arg(format!("M={}", dir.display()))
        .arg("modules")
        .stdin(Stdio::null())
        .output()
        .ctx(format!("running make for {ko}"))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::write(dir.join("build.log"), &log);
    if !out.status.success() {
        bail!("building {ko} failed ({}):\n{log}", out.status);
    }
    let path = dir.join(ko);
    if !path.is_file() {
        bail!("make succeeded but produced no {}", path.display());
    }
    Ok(path)
}

/// An initramfs with busybox, the agent and the given modules, via
/// `images/build-initramfs`. Returns its path.
pub fn initramfs(kdir: &Path, agent: &Path, modules: &[PathBuf]) -> Result<PathBuf> {
    let script = repo_root().join("images/build-initramfs");
    if !script.exists() {
        bail!(
            "{} not found: the images/ recipes are missing",
            script.display()
        );
    }
    let mut cmd = Command::new(&script);
    cmd.arg("--kernel-dir").arg(kdir).arg("--agent").arg(agent);
    for m in modules {
        cmd.arg("--module").arg(m);
    }
    let out = run_stdout(&mut cmd, "images/build-initramfs")?;
    let p = PathBuf::from(out.lines().last().unwrap_or_default());
    if !p.is_file() {
        bail!(
            "images/build-initramfs printed {:?}, not a file",
            p.display()
        );
    }
    Ok(p)
}

/// Where the module lands inside the guest (build-initramfs installs
/// modules under /lib/modules/<release>/extra/).
pub fn guest_module_path(release: &str) -> String {
    format!("/lib/modules/{release}/extra/vnic_arfs.ko")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_config_names_each_option_and_its_state() {
        let full = NEEDED_CONFIG
            .iter()
            .map(|(n, _)| format!("CONFIG_{n}=y"))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        assert!(missing_config(&full).is_empty());
        let partial = full
            .replace("CONFIG_RFS_ACCEL=y\n", "# CONFIG_RFS_ACCEL is not set\n")
            .replace("CONFIG_VIRTIO_NET=y", "CONFIG_VIRTIO_NET=m");
        let m = missing_config(&partial);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(m[0].starts_with("CONFIG_VIRTIO_NET (") && m[0].ends_with("CONFIG_VIRTIO_NET=m"));
        assert!(m[1].starts_with("CONFIG_RFS_ACCEL (") && m[1].ends_with("not set"));
    }

    #[test]
    fn bzimage_release_reads_the_setup_header() {
        let mut img = vec![0u8; 0x600];
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x20e..0x210].copy_from_slice(&0x300u16.to_le_bytes());
        let v = b"6.12.118-vnic (root@vm) #1 SMP\0";
        img[0x500..0x500 + v.len()].copy_from_slice(v);
        assert_eq!(bzimage_release(&img).as_deref(), Some("6.12.118-vnic"));
        img[0x202] = b'X';
        assert_eq!(bzimage_release(&img), None);
        assert_eq!(bzimage_release(&[0u8; 16]), None);
    }
}
