//! `spoof-tap`: a peer on the wire speaks for the device. From the tap
//! peer's side (a raw socket in the host namespace that holds vnic's tap),
//! management frames forged with the device's address, wrapped the ways a
//! guest's stack unwraps before its packet handlers see them (802.1ad,
//! QinQ, a VID-0 802.1Q tag, a 0x9100 tag) or sent bare, to the guest or
//! to another station. The device must drop every one of them and count
//! each (`peer.spoofed_mgmt_dropped`, exactly the number sent), none may
//! reach the module (its receive counters stand still, no new generation,
//! no stall), and programming goes on afterwards (a batch of filters from
//! the test helper `vnic_flowgen.ko` reaches the device).

use super::bigtable::module_field;
use super::hostile::{guest_mac, raw_frame};
use super::{Checks, Session, IFNAME};
use crate::bail;
use crate::harness::{wait_for, Context, Result};
use arfs::proto as wire;
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::Duration;

/// Copies of each forged frame.
const COPIES: u64 = 40;
/// A station that is neither the guest nor the device.
const OTHER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x99];
/// Filters the helper asks for once the frames are sent.
const AFTER: u32 = 64;
/// The module's receive counters none of the forged frames may move.
const RX_COUNTERS: [&str; 10] = [
    "acks",
    "rx_malformed",
    "rx_stale",
    "rx_wrong_generation",
    "rx_foreign",
    "rx_not_host",
    "rx_bad_nonce",
    "rx_rebind",
    "naks",
    "generation_changes",
];

/// The forged frames: (what, bytes). An ACK of the module's newest frame
/// from another generation: through, it would start a resync on a module
/// that trusts it.
fn forged(seq: u32, gen: u32) -> Vec<(&'static str, Vec<u8>)> {
    // hostile.rs's frame, from the EtherType on: addresses and tags below
    let ack = raw_frame(
        wire::MsgType::Ack.code(),
        seq,
        gen.wrapping_add(1),
        0,
        0,
        &[],
    );
    let mgmt = &ack[12..];
    let frame = |dst: [u8; 6], tags: &[(u16, u16)]| {
        let mut f = Vec::with_capacity(64);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&wire::DEVICE_MAC);
        for &(tpid, vid) in tags {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&vid.to_be_bytes());
        }
        f.extend_from_slice(mgmt);
        f.resize(f.len().max(60), 0);
        f
    };
    let guest = guest_mac();
    vec![
        ("bare", frame(guest, &[])),
        ("other-host", frame(OTHER_MAC, &[])),
        ("vid0", frame(guest, &[(0x8100, 0)])),
        ("802.1ad", frame(guest, &[(0x88a8, 5)])),
        ("qinq", frame(guest, &[(0x88a8, 5), (0x8100, 7)])),
        ("0x9100", frame(guest, &[(0x9100, 9)])),
    ]
}

/// Send `frames`, each `COPIES` times, out of the tap `tap` of the host
/// namespace `ns` (towards vnic, hence the guest).
fn send_from_tap(ns: &str, tap: &str, frames: Vec<Vec<u8>>) -> Result<()> {
    let ns_path = format!("/run/netns/{ns}");
    let tap = std::ffi::CString::new(tap).ctx("tap name")?;
    std::thread::spawn(move || -> Result<()> {
        let nsf = std::fs::File::open(&ns_path).ctx(format!("opening {ns_path}"))?;
        // SAFETY: setns(2) on an open netns fd; affects only this thread.
        if unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns {ns_path}: {}", std::io::Error::last_os_error());
        }
        // SAFETY: if_nametoindex reads a NUL-terminated string we own.
        let ifindex = unsafe { libc::if_nametoindex(tap.as_ptr()) };
        if ifindex == 0 {
            bail!("no interface {tap:?} in {ns_path}");
        }
        // SAFETY: plain socket(2); the fd is owned by `sock` below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        if fd < 0 {
            bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh socket nothing else owns.
        let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = ifindex.cast_signed();
        sa.sll_halen = 6;
        for f in &frames {
            sa.sll_addr[..6].copy_from_slice(&f[..6]);
            for _ in 0..COPIES {
                // SAFETY: `f` and `sa` outlive the call; lengths are theirs.
                let n = unsafe {
                    libc::sendto(
                        sock.as_raw_fd(),
                        f.as_ptr().cast(),
                        f.len(),
                        0,
                        (&raw const sa).cast(),
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if n != f.len().cast_signed() {
                    bail!("sendto on {tap:?}: {}", std::io::Error::last_os_error());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    })
    .join()
    .map_err(|_| "the sending thread panicked")?
}

pub(in crate::scenarios) fn spoof_tap(s: &mut Session, c: &mut Checks) -> Result<String> {
    let Some((ns, tap)) = s.tapnet.as_ref().map(|t| (t.ns.clone(), t.tap.clone())) else {
        bail!("spoof-tap needs the tap boot (the suite runs it in one)");
    };
    s.ensure_module()?;
    let dir = format!("{}/{IFNAME}", crate::module::DEBUGFS_DIR);
    let seq = module_field(s, &dir, "state", "seq_next")?;
    let gen = module_field(s, &dir, "state", "generation")?;
    #[allow(clippy::cast_possible_truncation)] // both are u32 in the module
    let frames = forged((seq as u32).wrapping_sub(1), gen as u32);
    let kinds: Vec<&str> = frames.iter().map(|f| f.0).collect();
    let want = COPIES * frames.len() as u64;
    let d0 = s.guest.ctl.stats()?;
    let m0 = s.module_counters()?;
    send_from_tap(&ns, &tap, frames.into_iter().map(|f| f.1).collect())?;
    let base = d0.peer.spoofed_mgmt_dropped;
    let ctl = &mut s.guest.ctl;
    let mut dropped = 0;
    let _ = wait_for(
        Duration::from_secs(10),
        "the device to drop them all",
        || {
            dropped = ctl.stats()?.peer.spoofed_mgmt_dropped - base;
            Ok((dropped >= want).then_some(()))
        },
    );
    // Any later one would be a frame counted twice.
    std::thread::sleep(Duration::from_millis(500));
    let dropped = s.guest.ctl.stats()?.peer.spoofed_mgmt_dropped - base;
    c.check(dropped == want, || {
        format!(
            "the device counted {dropped} spoofed management frames, {want} were sent ({COPIES} each of {})",
            kinds.join(", ")
        )
    });
    let m1 = s.module_counters()?;
    // The module's own ACKs go on (keepalives): only the forged ones would
    // be extra, and they would also move one of the other counters.
    let moved: Vec<String> = RX_COUNTERS[1..]
        .iter()
        .filter_map(|k| {
            let d = super::super::faults::delta(&m1, &m0, k);
            (d != 0).then(|| format!("{k} +{d}"))
        })
        .collect();
    c.check(moved.is_empty(), || {
        format!("forged frames reached the module: {}", moved.join(", "))
    });
    let module_saw = if moved.is_empty() {
        "module receive counters still".to_string()
    } else {
        format!("module receive counters moved: {}", moved.join(", "))
    };

    // Programming goes on. The helper's filters are named by no RFS slot:
    // the module's expiry would take them (as in debugfs-65k), so it is off
    // meanwhile (this boot is shared: put back afterwards).
    let quota_param = format!("{}/expire_quota", crate::module::PARAMS_DIR);
    let quota = s.guest.agent.read_file(&quota_param)?;
    s.guest.agent.write_file(&quota_param, "0")?;
    let live0 = s.guest.ctl.stats()?.table.live;
    super::flowgen_load(s, AFTER, Duration::from_mins(1))?;
    let ctl = &mut s.guest.ctl;
    let got = wait_for(
        Duration::from_secs(30),
        &format!("{AFTER} more filters on the device"),
        || {
            let live = ctl.stats()?.table.live;
            Ok((live >= live0 + u64::from(AFTER)).then_some(live))
        },
    );
    super::flowgen_unload(s);
    s.guest.agent.write_file(&quota_param, quota.trim())?;
    let live = got?;
    let acks = super::super::faults::delta(&s.module_counters()?, &m1, RX_COUNTERS[0]);
    Ok(format!(
        "sent {want} ({COPIES} x {}), device dropped {dropped}, {module_saw}; then {} filters programmed ({acks} ACKs)",
        kinds.join(" "),
        live - live0
    ))
}
