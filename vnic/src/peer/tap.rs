//! The tap peer: a multi-queue tap device (`IFF_TAP | IFF_NO_PI |
//! IFF_VNET_HDR | IFF_MULTI_QUEUE`), one queue per pair, read and written by
//! that pair's worker. The 12-byte virtio-net header is used on the tap too
//! (`TUNSETVNETHDRSZ`), so frames pass with no reformatting. The device
//! offers no offloads to the guest, so the tap is told to send none
//! (`TUNSETOFFLOAD 0`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;

use super::{Peer, Sink};
use crate::stats::{add, Stats};
use crate::virtq::NET_HDR_LEN;

/// Most frames read from the tap per event.
const TAP_BUDGET: usize = 256;

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
pub(crate) fn open_tap(name: &str, queues: usize) -> io::Result<Vec<File>> {
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

/// One worker's queue of the tap.
pub(crate) struct TapPeer {
    queues: Arc<[File]>,
    id: usize,
    stats: Arc<Stats>,
    buf: Vec<u8>,
}

impl TapPeer {
    /// Worker `id`'s queue of `queues` (one per pair, opened by [`open_tap`]).
    pub(crate) fn new(queues: Arc<[File]>, id: usize, stats: Arc<Stats>) -> Self {
        Self {
            queues,
            id,
            stats,
            buf: vec![0; NET_HDR_LEN + 65_536],
        }
    }
}

impl Peer for TapPeer {
    fn fd(&self) -> Option<RawFd> {
        self.queues.get(self.id).map(AsRawFd::as_raw_fd)
    }

    fn guest_frame(&mut self, pkt: &mut [u8], _to_guest: &mut impl Sink) {
        let Some(mut tap) = self.queues.get(self.id) else {
            return;
        };
        // We offer no offloads: hand the tap a clean header.
        pkt[..NET_HDR_LEN].fill(0);
        // A tap write takes a whole frame or fails: no partial writes.
        match tap.write_all(pkt) {
            Ok(()) => add(&self.stats.peer.tap_tx, 1),
            Err(e) => {
                add(&self.stats.peer.tap_tx_errors, 1);
                add(&self.stats.queues[self.id].tx_drops, 1);
                log::debug!("pair {}: tap write: {e}", self.id);
            }
        }
    }

    fn frames_for_guest(&mut self, r: &mut impl Sink, fd_event: bool) {
        if !fd_event {
            return;
        }
        let Some(mut tap) = self.queues.get(self.id) else {
            return;
        };
        for _ in 0..TAP_BUDGET {
            match tap.read(&mut self.buf) {
                Ok(n) if n >= NET_HDR_LEN + 14 => {
                    add(&self.stats.peer.tap_rx, 1);
                    r.frame(&mut self.buf[..n]);
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("pair {}: tap read: {e}", self.id);
                    break;
                }
            }
        }
    }
}
