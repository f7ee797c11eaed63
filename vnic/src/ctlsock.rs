//! The control socket (CTL.md): accepts clients of the daemon's user,
//! root or `--group`, cuts their input into request lines, answers each
//! with [`ctl::handle_line`], and enforces the limits of CTL.md "Limits"
//! without ever blocking the `vnic-mgmt` loop that drives it.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use event_manager::{EventOps, Events};
use vmm_sys_util::epoll::EventSet;
use vnic_ctl_proto::Reply;

use crate::ctl;
use crate::daemon::Shared;

/// Event data of the first client; the loop's own sources are below it.
pub(crate) const FIRST_CLIENT: u32 = 100;

/// Limits of the control socket (CTL.md "Limits").
/// Longest request line; a longer one gets an error reply and the client
/// is disconnected.
const CTL_MAX_LINE: usize = 1 << 20;
/// Clients at once; one more is told so and disconnected.
const CTL_MAX_CLIENTS: usize = 64;
/// Unsent reply bytes above which a client's further requests wait (read
/// no more from it until it reads what it was sent).
const CTL_OUT_SOFT: usize = 256 << 10;
/// A client whose unsent replies made no progress for this long is
/// disconnected.
const CTL_STALL: Duration = Duration::from_secs(10);

/// The uid of the process at the other end of `s` (SO_PEERCRED) when it
/// is neither this process's effective uid nor root, nor in `group`
/// (its primary group, or a supplementary one: SO_PEERGROUPS).
fn foreign_peer(s: &UnixStream, group: Option<u32>) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(SO_PEERCRED) writes at most `len` bytes into
    // `cred`, a properly sized and aligned struct ucred; both live across
    // the call.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast(),
            &raw mut len,
        )
    };
    // SAFETY: geteuid(2) cannot fail and has no preconditions.
    let me = unsafe { libc::geteuid() };
    if rc != 0 {
        // No credentials: refuse (a unix stream socket always has them).
        return Some(u32::MAX);
    }
    if cred.uid == me || cred.uid == 0 {
        return None;
    }
    match group {
        Some(g) if cred.gid == g || peer_groups(s).contains(&g) => None,
        _ => Some(cred.uid),
    }
}

/// The supplementary groups of the process at the other end of `s`
/// (SO_PEERGROUPS; empty if the kernel cannot say).
fn peer_groups(s: &UnixStream) -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
    // SAFETY: getsockopt(SO_PEERGROUPS) writes at most `len` bytes into
    // `groups` (that large) and the length it wrote into `len`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Vec::new();
    }
    groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
    groups
}

struct CtlConn {
    stream: UnixStream,
    /// Bytes read, not yet a complete line.
    buf: Vec<u8>,
    /// Reply bytes not yet written (the socket is non-blocking).
    out: Vec<u8>,
    /// When `out` last shrank or became non-empty.
    progress: Instant,
    /// What the client's fd is registered for.
    registered: EventSet,
    /// Read no more; close once `out` is written (the client shut its
    /// write side, or sent a too-long line).
    closing: bool,
}

impl CtlConn {
    /// Writes what it can of `out`; false when the peer is gone.
    fn flush_out(&mut self) -> bool {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return false,
                Ok(n) => {
                    self.out.drain(..n);
                    self.progress = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    fn reply(&mut self, v: &serde_json::Value) {
        if self.out.is_empty() {
            self.progress = Instant::now();
        }
        let _ = serde_json::to_writer(&mut self.out, v);
        self.out.push(b'\n');
    }
}

/// The listening socket and its clients (driven by the `vnic-mgmt` loop).
pub(crate) struct CtlSocket {
    sh: Arc<Shared>,
    listener: UnixListener,
    conns: HashMap<u32, CtlConn>,
    next: u32,
}

/// A refusal line: the reason, then the client is closed.
fn refusal(msg: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&Reply::error(msg)).unwrap_or_default();
    line.push(b'\n');
    line
}

impl CtlSocket {
    /// `listener` is non-blocking.
    pub(crate) fn new(sh: Arc<Shared>, listener: UnixListener) -> Self {
        Self {
            sh,
            listener,
            conns: HashMap::new(),
            next: FIRST_CLIENT,
        }
    }

    /// The listening socket (to register for readability).
    pub(crate) fn listener(&self) -> &UnixListener {
        &self.listener
    }

    pub(crate) fn accept(&mut self, ops: &mut EventOps) {
        loop {
            match self.listener.accept() {
                Ok((mut s, _)) => {
                    if let Some(uid) = foreign_peer(&s, self.sh.cfg.group) {
                        self.sh.stats.ctl.refused.fetch_add(1, Ordering::Relaxed);
                        log::warn!(
                            "control client of uid {uid} refused (not ours, not root, not in --group)"
                        );
                        let _ = s.set_nonblocking(true);
                        let _ = s.write_all(&refusal(
                            "control clients must run as the daemon's user or root (or be in its --group)",
                        ));
                        continue;
                    }
                    if self.conns.len() >= CTL_MAX_CLIENTS {
                        self.sh.stats.ctl.refused.fetch_add(1, Ordering::Relaxed);
                        let _ = s.set_nonblocking(true);
                        let _ = s.write_all(&refusal(&format!(
                            "too many control clients (limit {CTL_MAX_CLIENTS})"
                        )));
                        continue;
                    }
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let d = self.next;
                    self.next = self.next.wrapping_add(1).max(FIRST_CLIENT);
                    if ops
                        .add(Events::with_data(
                            &s,
                            d,
                            EventSet::IN | EventSet::READ_HANG_UP,
                        ))
                        .is_ok()
                    {
                        self.sh.stats.ctl.clients.fetch_add(1, Ordering::Relaxed);
                        self.conns.insert(
                            d,
                            CtlConn {
                                stream: s,
                                buf: Vec::new(),
                                out: Vec::new(),
                                progress: Instant::now(),
                                registered: EventSet::IN | EventSet::READ_HANG_UP,
                                closing: false,
                            },
                        );
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("control socket accept: {e}");
                    break;
                }
            }
        }
    }

    /// Serves one client: writes pending replies, then (while its unsent
    /// replies stay under [`CTL_OUT_SOFT`]) reads and answers its request
    /// lines. Never blocks: a client that does not read its replies only
    /// stops its own requests from being served.
    pub(crate) fn serve(&mut self, d: u32, ops: &mut EventOps) {
        let Some(c) = self.conns.get_mut(&d) else {
            return;
        };
        let mut closed = !c.flush_out();
        let mut tmp = [0u8; 4096];
        while !closed && !c.closing && c.out.len() < CTL_OUT_SOFT {
            // Answer the complete lines read so far. A line over the limit
            // is refused whether or not its end came in the same read as
            // the bytes over the limit.
            let newline = c.buf.iter().position(|&b| b == b'\n');
            if let Some(pos) = newline.filter(|&p| p <= CTL_MAX_LINE) {
                let line: Vec<u8> = c.buf.drain(..=pos).collect();
                let text = String::from_utf8_lossy(&line);
                let text = text.trim();
                let reply = if text.is_empty() {
                    ctl::err("empty request line (one JSON object per line, see CTL.md)")
                } else {
                    ctl::handle_line(&self.sh, text)
                };
                c.reply(&reply);
                closed = !c.flush_out();
                continue;
            }
            if newline.is_some() || c.buf.len() > CTL_MAX_LINE {
                self.sh
                    .stats
                    .ctl
                    .lines_too_long
                    .fetch_add(1, Ordering::Relaxed);
                c.buf.clear();
                c.reply(&ctl::err(format!(
                    "request line longer than {CTL_MAX_LINE} bytes; disconnecting"
                )));
                c.closing = true;
                closed = !c.flush_out();
                break;
            }
            match c.stream.read(&mut tmp) {
                // The client is done sending: answer what it sent, then close.
                Ok(0) => c.closing = true,
                Ok(n) => c.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => closed = true,
            }
        }
        if c.closing && c.out.is_empty() {
            closed = true;
        }
        if !closed {
            // Wait for writability while replies are pending (not for its
            // hang-up once it shut its side: that would fire until then),
            // else for input.
            let set = if c.out.is_empty() {
                EventSet::IN | EventSet::READ_HANG_UP
            } else if c.closing {
                EventSet::OUT
            } else {
                EventSet::OUT | EventSet::READ_HANG_UP
            };
            if set != c.registered {
                if ops.modify(Events::with_data(&c.stream, d, set)).is_ok() {
                    c.registered = set;
                } else {
                    closed = true;
                }
            }
        }
        if closed {
            self.close(d, ops);
        }
    }

    fn close(&mut self, d: u32, ops: &mut EventOps) {
        if let Some(c) = self.conns.remove(&d) {
            let _ = ops.remove(Events::with_data(&c.stream, d, c.registered));
            self.sh.stats.ctl.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Disconnects clients whose unsent replies made no progress for
    /// [`CTL_STALL`].
    pub(crate) fn drop_stalled(&mut self, ops: &mut EventOps) {
        let stalled: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.out.is_empty() && c.progress.elapsed() > CTL_STALL)
            .map(|(&d, _)| d)
            .collect();
        for d in stalled {
            self.sh
                .stats
                .ctl
                .dropped_slow
                .fetch_add(1, Ordering::Relaxed);
            log::warn!("control client left replies unread for {CTL_STALL:?}: disconnected");
            self.close(d, ops);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The refusal lines are the bytes the daemon wrote before they were
    /// built from the protocol's types.
    #[test]
    fn refusals_keep_their_bytes() {
        assert_eq!(
            super::refusal("too many control clients (limit 64)"),
            b"{\"ok\":false,\"error\":\"too many control clients (limit 64)\"}\n"
        );
    }
}
