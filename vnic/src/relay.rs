//! A message relay between the frontend (QEMU) and the vhost-user request
//! handler of `vhost` / `vhost-user-backend`.
//!
//! Why it exists: QEMU's virtio-net sends `SET_VRING_ENABLE` for the first
//! queue pair right after the session setup, before any `SET_FEATURES`
//! (observed with QEMU 10.0: GET_FEATURES, GET/SET_PROTOCOL_FEATURES,
//! GET_QUEUE_NUM, SET_OWNER, SET_VRING_CALL/ERR..., SET_VRING_ENABLE). The
//! vhost-user spec ties that request to VHOST_USER_F_PROTOCOL_FEATURES having
//! been negotiated, and `vhost` 0.18 checks it against the features *acked*
//! by SET_FEATURES: it refuses the request and drops the connection, so QEMU
//! reconnects forever. The relay forwards every message unchanged (file
//! descriptors included) and, when SET_VRING_ENABLE arrives before any
//! SET_FEATURES, first hands the handler a SET_FEATURES that acks only
//! VHOST_USER_F_PROTOCOL_FEATURES (no reply requested). The frontend's own
//! SET_FEATURES later replaces it. Only control messages cross the relay:
//! the rings live in shared memory and the kicks/calls are eventfds.
//!
//! It is also the gate in front of the handler: a frontend's message with
//! a payload over 64 KiB or more than 32 fds, a connection that ends in
//! the middle of a message, and a memory region (SET_MEM_TABLE,
//! ADD_MEM_REG) that reaches past the end of its file are refused here,
//! reported to the refusal hook, and end the connection. The last one is
//! not refused by `vhost-user-backend` 0.24 / `vm-memory` 0.18: mapping a
//! file beyond its end succeeds, and the first read of a vring placed
//! there (the worker's, or the 50 ms poll's) killed the daemon with
//! SIGBUS (found by `vnic-fuzz-vhost`; device test
//! `tests/vhost_fuzz.rs`).
//!
//! It stays an adapter: it is the one place that knows about that QEMU /
//! `vhost` ordering, it keeps no state another module reads, and it only
//! reports each SET_VRING_ENABLE and each refusal to the hooks it is given
//! (the owner of the enabled pairs, `pairs::Pairs`; the daemon's counters).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

const HDR_LEN: usize = 12;
/// Largest payload accepted (vhost's MAX_MSG_SIZE is 4 KiB; leave room).
const MAX_PAYLOAD: usize = 0x10000;
/// Most fds one message may carry (vhost's MAX_ATTACHED_FD_ENTRIES).
const MAX_FDS: usize = 32;

const SET_FEATURES: u32 = 2;
const RESET_OWNER: u32 = 4;
const SET_MEM_TABLE: u32 = 5;
const ADD_MEM_REG: u32 = 37;
const SET_VRING_ENABLE: u32 = 18;
const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;

struct Msg {
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Msg {
    fn code(&self) -> u32 {
        u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
    }
}

/// Why the relay refused a frontend's message (the connection is closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A payload over [`MAX_PAYLOAD`].
    TooBig,
    /// More than [`MAX_FDS`] descriptors.
    TooManyFds,
    /// The frontend closed the connection in the middle of a message.
    Truncated,
    /// A memory region reaching past the end of its file.
    RegionPastEof,
}

/// Called with every refusal (and what was refused) before the relay
/// closes the connection.
pub(crate) type RefuseHook = Box<dyn Fn(Refused, &str) + Send>;

/// What ends a relay direction.
#[derive(Debug)]
enum Stop {
    Io(io::Error),
    Refused(Refused, String),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Self {
        Stop::Io(e)
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Io(e) => write!(f, "{e}"),
            Stop::Refused(r, why) => write!(f, "refused ({r:?}): {why}"),
        }
    }
}

/// Receives up to `buf.len()` bytes and any fds attached to them.
fn recv_with_fds(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for MAX_FDS descriptors, aligned for cmsghdr.
    let mut cmsg = [0u64; (MAX_FDS * 4 + 64) / 8];
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg) as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (which covers `buf`) and at `cmsg`,
        // all alive and exclusively borrowed for the call; the kernel writes
        // at most iov_len bytes into buf and msg_controllen bytes into cmsg.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled
    // (msg_controllen was updated to what it wrote); each SCM_RIGHTS entry
    // holds (cmsg_len - CMSG_LEN(0)) / 4 descriptors that are now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let sz = std::mem::size_of::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / sz;
                for i in 0..count {
                    let mut fd: RawFd = -1;
                    std::ptr::copy_nonoverlapping(data.add(i * sz), (&raw mut fd).cast::<u8>(), sz);
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // The kernel closed the descriptors that did not fit.
        return Err(io::Error::new(io::ErrorKind::InvalidData, CTRUNC));
    }
    Ok(n)
}

/// Sends `buf` with `fds` attached to its first byte.
fn send_with_fds(sock: &UnixStream, buf: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    if fds.is_empty() {
        return (&*sock).write_all(buf);
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: buf.len(),
    };
    let mut cmsg = [0u64; (MAX_FDS * 4 + 64) / 8];
    // SAFETY: all-zero msghdr is valid; filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure computation.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE((raw.len() * std::mem::size_of::<RawFd>()) as u32) } as _;
    // SAFETY: `cmsg` is large enough for CMSG_SPACE(raw.len() * 4) (raw.len()
    // <= MAX_FDS); CMSG_FIRSTHDR points into it; we write one header and the
    // descriptors. sendmsg only reads `buf` (through iov, not mutated) and cmsg.
    let r = unsafe {
        let c = libc::CMSG_FIRSTHDR(&raw const msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN((raw.len() * std::mem::size_of::<RawFd>()) as u32) as _;
        std::ptr::copy_nonoverlapping(
            raw.as_ptr().cast::<u8>(),
            libc::CMSG_DATA(c),
            raw.len() * std::mem::size_of::<RawFd>(),
        );
        libc::sendmsg(sock.as_raw_fd(), &raw const msg, libc::MSG_NOSIGNAL)
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let sent = r as usize;
    if sent < buf.len() {
        (&*sock).write_all(&buf[sent..])?;
    }
    Ok(())
}

const CTRUNC: &str = "too many file descriptors in one message";

/// Reads one vhost-user message (header, payload, fds). `None` at EOF.
fn read_msg(sock: &UnixStream) -> Result<Option<Msg>, Stop> {
    let mut buf = vec![0u8; HDR_LEN];
    let mut fds = Vec::new();
    let mut got = 0;
    let too_many = |e: io::Error| {
        if e.kind() == io::ErrorKind::InvalidData && e.to_string() == CTRUNC {
            Stop::Refused(Refused::TooManyFds, format!("more than {MAX_FDS} fds"))
        } else {
            Stop::Io(e)
        }
    };
    while got < HDR_LEN {
        let n = recv_with_fds(sock, &mut buf[got..], &mut fds).map_err(too_many)?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(Stop::Refused(
                    Refused::Truncated,
                    format!("connection closed after {got} bytes of a header"),
                ))
            };
        }
        got += n;
    }
    let size = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
    if size > MAX_PAYLOAD {
        return Err(Stop::Refused(
            Refused::TooBig,
            format!("a payload of {size} bytes (request {})", code_of(&buf)),
        ));
    }
    buf.resize(HDR_LEN + size, 0);
    if let Err(e) = (&*sock).read_exact(&mut buf[HDR_LEN..]) {
        return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
            Stop::Refused(
                Refused::Truncated,
                format!(
                    "connection closed inside the {size}-byte payload of request {}",
                    code_of(&buf)
                ),
            )
        } else {
            Stop::Io(e)
        });
    }
    Ok(Some(Msg { buf, fds }))
}

fn code_of(buf: &[u8]) -> u32 {
    u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Bytes of the file behind `fd` (`None`: fstat failed).
fn file_size(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: all-zero is a valid `stat`; fstat writes into it and reads
    // nothing else; `fd` is open (we own it).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), &raw mut st) };
    (r == 0).then_some(st.st_size as u64)
}

/// The memory regions of a SET_MEM_TABLE or ADD_MEM_REG must lie inside
/// their files: `vm-memory` maps a file beyond its end without complaint,
/// and a read there is a SIGBUS that kills the daemon. Messages whose
/// region and fd counts disagree are left to the handler (it refuses
/// them).
fn check_regions(m: &Msg) -> Result<(), Stop> {
    let payload = &m.buf[HDR_LEN..];
    // (offset of the first region in the payload, regions)
    let (first, n) = match m.code() {
        SET_MEM_TABLE if payload.len() >= 8 => {
            let n = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
            if payload.len() != 8 + 32 * n {
                return Ok(());
            }
            (8, n)
        }
        ADD_MEM_REG if payload.len() == 40 => (8, 1),
        _ => return Ok(()),
    };
    if m.fds.len() != n {
        return Ok(());
    }
    for (i, fd) in m.fds.iter().enumerate() {
        let r = first + 32 * i;
        let (gpa, size, offset) = (
            u64_at(payload, r),
            u64_at(payload, r + 8),
            u64_at(payload, r + 24),
        );
        let file = file_size(fd);
        let inside = offset
            .checked_add(size)
            .zip(file)
            .is_some_and(|(end, file)| end <= file);
        if !inside {
            return Err(Stop::Refused(
                Refused::RegionPastEof,
                format!(
                    "request {}: region {i} (guest {gpa:#x}, {size:#x} bytes at file offset {offset:#x}) \
                     reaches past the end of its file ({})",
                    m.code(),
                    file.map_or("size unknown".into(), |f| format!("{f:#x} bytes"))
                ),
            ));
        }
    }
    Ok(())
}

fn set_features_msg(features: u64) -> Msg {
    let mut buf = Vec::with_capacity(HDR_LEN + 8);
    buf.extend_from_slice(&SET_FEATURES.to_le_bytes());
    buf.extend_from_slice(&1u32.to_le_bytes()); // version 1, no reply wanted
    buf.extend_from_slice(&8u32.to_le_bytes());
    buf.extend_from_slice(&features.to_le_bytes());
    Msg {
        buf,
        fds: Vec::new(),
    }
}

/// Called with (vring index, enable) for every SET_VRING_ENABLE the
/// frontend sends, before it is forwarded.
pub(crate) type EnableHook = Box<dyn Fn(u32, bool) + Send>;

fn pump(
    from: &UnixStream,
    to: &UnixStream,
    fix_enable: bool,
    on_enable: Option<&EnableHook>,
) -> Result<(), Stop> {
    let mut features_set = false;
    while let Some(m) = read_msg(from)? {
        if fix_enable {
            check_regions(&m)?;
        }
        if let (Some(hook), SET_VRING_ENABLE) = (on_enable, m.code()) {
            // VhostUserVringState { index: u32, num: u32 }, little-endian.
            if let Some(p) = m.buf.get(HDR_LEN..HDR_LEN + 8) {
                let index = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
                let num = u32::from_le_bytes([p[4], p[5], p[6], p[7]]);
                hook(index, num != 0);
            }
        }
        if fix_enable {
            match m.code() {
                SET_FEATURES => features_set = true,
                RESET_OWNER => features_set = false,
                SET_VRING_ENABLE if !features_set => {
                    log::debug!(
                        "SET_VRING_ENABLE before SET_FEATURES: acking PROTOCOL_FEATURES first"
                    );
                    let f = set_features_msg(PROTOCOL_FEATURES_BIT);
                    send_with_fds(to, &f.buf, &f.fds)?;
                    features_set = true;
                }
                _ => {}
            }
        }
        send_with_fds(to, &m.buf, &m.fds)?;
    }
    Ok(())
}

/// Relays between `frontend` and `backend` until either side closes; then
/// shuts both down. `on_enable` sees every SET_VRING_ENABLE request. Returns
/// the two relay threads.
pub(crate) fn start(
    frontend: UnixStream,
    backend: UnixStream,
    on_enable: EnableHook,
    on_refuse: RefuseHook,
) -> io::Result<[JoinHandle<()>; 2]> {
    let (f2, b2) = (frontend.try_clone()?, backend.try_clone()?);
    let down = |a: &UnixStream, b: &UnixStream| {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    };
    let t1 = std::thread::Builder::new()
        .name("vnic-relay-req".into())
        .spawn(move || {
            match pump(&frontend, &backend, true, Some(&on_enable)) {
                Ok(()) => {}
                Err(Stop::Refused(r, why)) => on_refuse(r, &why),
                Err(Stop::Io(e)) => log::debug!("vhost-user relay (requests): {e}"),
            }
            down(&frontend, &backend);
        })?;
    let t2 = std::thread::Builder::new()
        .name("vnic-relay-rep".into())
        .spawn(move || {
            if let Err(e) = pump(&b2, &f2, false, None) {
                log::debug!("vhost-user relay (replies): {e}");
            }
            down(&b2, &f2);
        })?;
    Ok([t1, t2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relays_messages_with_fds_and_fixes_early_enable() {
        let (qemu, relay_out) = UnixStream::pair().unwrap();
        let (relay_in, backend) = UnixStream::pair().unwrap();
        let _t = start(
            relay_out,
            relay_in,
            Box::new(|_, _| {}),
            Box::new(|_, _| {}),
        )
        .unwrap();
        // A message with an fd.
        let file = std::fs::File::open("/dev/null").unwrap();
        let mut m = vec![13u8, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0];
        m.extend_from_slice(&0u64.to_le_bytes());
        send_with_fds(&qemu, &m, &[OwnedFd::from(file)]).unwrap();
        let got = read_msg(&backend).unwrap().unwrap();
        assert_eq!(got.buf, m);
        assert_eq!(got.fds.len(), 1);
        // SET_VRING_ENABLE before SET_FEATURES: a SET_FEATURES(PROTOCOL) goes first.
        let mut e = vec![18u8, 0, 0, 0, 9, 0, 0, 0, 8, 0, 0, 0];
        e.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0]);
        (&qemu).write_all(&e).unwrap();
        let f = read_msg(&backend).unwrap().unwrap();
        assert_eq!(f.code(), SET_FEATURES);
        assert_eq!(
            u64::from_le_bytes(f.buf[12..20].try_into().unwrap()),
            PROTOCOL_FEATURES_BIT
        );
        assert_eq!(read_msg(&backend).unwrap().unwrap().buf, e);
        // Not again.
        (&qemu).write_all(&e).unwrap();
        assert_eq!(read_msg(&backend).unwrap().unwrap().buf, e);
        // Replies flow back.
        let r = vec![
            18u8, 0, 0, 0, 5, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        (&backend).write_all(&r).unwrap();
        assert_eq!(read_msg(&qemu).unwrap().unwrap().buf, r);
        // Closing one side closes the other.
        drop(qemu);
        assert!(read_msg(&backend).unwrap().is_none());
    }
}
