//! One raw stream connection: bytes out with file descriptors attached
//! (SCM_RIGHTS), vhost-user replies in, every wait bounded.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Why no reply came.
#[derive(Debug)]
pub enum ReadError {
    /// The daemon closed the connection.
    Closed,
    /// Nothing (or only part of a reply) within the time allowed.
    Timeout,
    Io(io::Error),
}

/// A connection to one of the daemon's unix sockets.
#[derive(Debug)]
pub struct RawConn {
    sock: UnixStream,
}

impl RawConn {
    /// Connect, with writes bounded by `write_timeout` (a daemon that stops
    /// reading shows as an error, not as a fuzzer that hangs).
    pub fn connect(path: &Path, write_timeout: Duration) -> io::Result<Self> {
        let sock = UnixStream::connect(path)?;
        sock.set_write_timeout(Some(write_timeout))?;
        Ok(RawConn { sock })
    }

    pub fn stream(&self) -> &UnixStream {
        &self.sock
    }

    /// Write `buf` whole, `fds` attached to its first bytes (none: a plain
    /// write). At most 253 fds (the kernel's SCM_MAX_FD).
    pub fn send(&self, buf: &[u8], fds: &[RawFd]) -> io::Result<()> {
        if fds.is_empty() || buf.is_empty() {
            return (&self.sock).write_all(buf);
        }
        let fd_bytes = std::mem::size_of_val(fds);
        // Room for the header and up to 253 descriptors, u64-aligned.
        let mut cmsg = [0u64; 160];
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
        if space > std::mem::size_of_val(&cmsg) {
            return Err(io::Error::other("too many fds for one message"));
        }
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr().cast_mut().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: all-zero is a valid msghdr; the pointers are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `cmsg` holds `space` bytes (checked above), so the first
        // header and its `fd_bytes` of data fit; CMSG_FIRSTHDR is non-null
        // for a control buffer at least one header long. sendmsg reads
        // `buf` through `iov` and the control buffer, both alive here.
        let r = unsafe {
            let c = libc::CMSG_FIRSTHDR(&raw const msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes);
            libc::sendmsg(self.sock.as_raw_fd(), &raw const msg, libc::MSG_NOSIGNAL)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let sent = r as usize;
        if sent < buf.len() {
            (&self.sock).write_all(&buf[sent..])?;
        }
        Ok(())
    }

    /// Whether bytes (or the end of the stream) wait to be read.
    pub fn readable(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `p` is one valid pollfd on our stack.
        let r = unsafe { libc::poll(&raw mut p, 1, ms) };
        r > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Read exactly `buf.len()` bytes within `deadline`.
    fn read_full(&self, buf: &mut [u8], deadline: Instant) -> Result<(), ReadError> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.readable(left) {
                return Err(ReadError::Timeout);
            }
            match (&self.sock).read(&mut buf[got..]) {
                Ok(0) => return Err(ReadError::Closed),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(ReadError::Closed)
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        Ok(())
    }

    /// One vhost-user reply: (request code, flags, payload). File
    /// descriptors a reply may carry are dropped by the plain read (the
    /// kernel closes them).
    pub fn read_vhost_reply(&self, timeout: Duration) -> Result<(u32, u32, Vec<u8>), ReadError> {
        let deadline = Instant::now() + timeout;
        let mut hdr = [0u8; 12];
        self.read_full(&mut hdr, deadline)?;
        let word = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
        let size = word(8) as usize;
        if size > 0x1000 {
            return Err(ReadError::Io(io::Error::other(format!(
                "reply of {size} bytes (more than vhost-user's 4 KiB)"
            ))));
        }
        let mut payload = vec![0u8; size];
        self.read_full(&mut payload, deadline)?;
        Ok((word(0), word(4), payload))
    }

    /// Read whatever is there now (without waiting); `Err(Closed)` at the
    /// end of the stream.
    pub fn drain(&self) -> Result<usize, ReadError> {
        let mut total = 0;
        let mut buf = [0u8; 4096];
        while self.readable(Duration::ZERO) {
            match (&self.sock).read(&mut buf) {
                Ok(0) => return Err(ReadError::Closed),
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(ReadError::Closed)
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        Ok(total)
    }

    /// Read until `total` newlines have arrived on this connection in
    /// all (counted across calls in `lines`), within `timeout`; returns
    /// the count reached.
    pub fn read_lines_until(
        &self,
        lines: &mut u64,
        total: u64,
        timeout: Duration,
    ) -> Result<u64, ReadError> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 16384];
        while *lines < total {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.readable(left) {
                return Err(ReadError::Timeout);
            }
            match (&self.sock).read(&mut buf) {
                Ok(0) => return Err(ReadError::Closed),
                Ok(n) => *lines += newlines(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(ReadError::Closed)
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        Ok(*lines)
    }
}

/// Newlines in `b`.
fn newlines(b: &[u8]) -> u64 {
    let mut n = 0;
    for &c in b {
        n += u64::from(c == b'\n');
    }
    n
}
