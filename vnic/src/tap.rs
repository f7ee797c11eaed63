//! The tap peer: a multi-queue tap device (`IFF_TAP | IFF_NO_PI |
//! IFF_VNET_HDR | IFF_MULTI_QUEUE`), one queue per pair, read and written by
//! that pair's worker. The 12-byte virtio-net header is used on the tap too
//! (`TUNSETVNETHDRSZ`), so frames pass with no reformatting. The device
//! offers no offloads to the guest, so the tap is told to send none
//! (`TUNSETOFFLOAD 0`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens `queues` queues of tap `name` (created if missing; needs
/// CAP_NET_ADMIN, or a persistent tap owned by the user).
pub fn open_tap(name: &str, queues: usize) -> io::Result<Vec<File>> {
    if name.is_empty() || name.len() > 15 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "tap name must be 1..=15 bytes",
        ));
    }
    let mut out = Vec::with_capacity(queues);
    for _ in 0..queues {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let mut req = IfReq {
            name: [0; 16],
            flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq` (40 bytes); `req`
        // is a properly sized, initialised #[repr(C)] ifreq that outlives the
        // call, and `f` is an open tun fd.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, &raw mut req) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")));
        }
        let hdr: libc::c_int = 12;
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer; `hdr`
        // lives across the call.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETVNETHDRSZ, &raw const hdr) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned
        // long of TUN_F_* flags); 0 = no offloads. No memory is accessed.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETOFFLOAD, 0 as libc::c_ulong) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        out.push(f);
    }
    Ok(out)
}
