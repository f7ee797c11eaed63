//! The hostile-guest tool: sends raw Ethernet frames (malformed management
//! frames, usually) from an AF_PACKET socket in a background thread, and
//! optionally captures the frames of one EtherType the device answers with.

use crate::sys;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vnic_agent::proto::{hex_decode, hex_encode, HexError, RawTxReport, RawTxSpec};

const MAX_CAPTURE: usize = 4096;

pub struct Job {
    thread: Option<JoinHandle<RawTxReport>>,
    done: Arc<AtomicBool>,
}

/// Why a raw-frame job did not start (raw_tx_start's reply text, as
/// `workload::handle` sends it).
#[derive(Debug, thiserror::Error)]
pub enum RawTxError {
    #[error("frame {index}: {source}")]
    BadFrame {
        index: usize,
        #[source]
        source: HexError,
    },
    #[error("every frame must be 14..=1514 bytes (frame {index} has {len})")]
    FrameSize { index: usize, len: usize },
    #[error("{ifname}: {source}")]
    NoInterface {
        ifname: String,
        #[source]
        source: io::Error,
    },
    /// The AF_PACKET socket `dir` ("tx" or "rx") could not be opened or bound.
    #[error("AF_PACKET {dir} socket: {source}")]
    Socket {
        dir: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("spawn: {0}")]
    Spawn(#[source] io::Error),
}

impl Job {
    pub fn start(spec: RawTxSpec) -> Result<Self, RawTxError> {
        let frames: Vec<Vec<u8>> = spec
            .frames
            .iter()
            .enumerate()
            .map(|(index, h)| {
                hex_decode(h).map_err(|source| RawTxError::BadFrame { index, source })
            })
            .collect::<Result<_, _>>()?;
        if let Some((index, f)) = frames
            .iter()
            .enumerate()
            .find(|(_, f)| f.len() < 14 || f.len() > 1514)
        {
            return Err(RawTxError::FrameSize {
                index,
                len: f.len(),
            });
        }
        let ifindex = ifindex(&spec.ifname).map_err(|source| RawTxError::NoInterface {
            ifname: spec.ifname.clone(),
            source,
        })?;
        let socket = |dir, ethertype| {
            packet_socket(ifindex, ethertype).map_err(|source| RawTxError::Socket { dir, source })
        };
        let tx = socket("tx", 0)?;
        let rx = spec
            .capture_ethertype
            .map(|t| socket("rx", t))
            .transpose()?;
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let thread = std::thread::Builder::new()
            .name("rawtx".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let r = run(&spec, &frames, &tx, rx.as_ref());
                d.store(true, Ordering::Release);
                r
            })
            .map_err(RawTxError::Spawn)?;
        Ok(Job {
            thread: Some(thread),
            done,
        })
    }

    /// Wait up to `timeout` for the job; `None` when it is still running.
    pub fn wait(&mut self, timeout: Duration) -> Option<RawTxReport> {
        let deadline = Instant::now() + timeout;
        while !self.done.load(Ordering::Acquire) {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let t = self.thread.take()?;
        Some(t.join().unwrap_or_else(|_| RawTxReport {
            done: true,
            errors: vec!["rawtx thread panicked".into()],
            ..RawTxReport::default()
        }))
    }
}

fn ifindex(name: &str) -> io::Result<i32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::last_os_error());
    }
    i32::try_from(i).map_err(|_| io::ErrorKind::InvalidData.into())
}

/// An AF_PACKET/SOCK_RAW socket bound to `ifindex`. `ethertype` 0: send
/// only (no receive hook is registered); otherwise it receives that type.
fn packet_socket(ifindex: i32, ethertype: u16) -> io::Result<OwnedFd> {
    let proto = i32::from(ethertype.to_be());
    // SAFETY: plain socket(2) call; the fd is owned right below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ethertype.to_be();
    sll.sll_ifindex = ifindex;
    // SAFETY: `sll` is a valid, initialised sockaddr_ll and its exact size
    // is passed; `fd` is an open AF_PACKET socket.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn run(spec: &RawTxSpec, frames: &[Vec<u8>], tx: &OwnedFd, rx: Option<&OwnedFd>) -> RawTxReport {
    let start = Instant::now();
    let mut rep = RawTxReport {
        sent: vec![0; frames.len()],
        ..RawTxReport::default()
    };
    if let Some(cpu) = spec.cpu {
        if let Err(e) = sys::pin_to_cpu(cpu) {
            rep.errors.push(format!("pin to cpu {cpu}: {e}"));
        }
    }
    let captured = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let capture = rx.map(|rx| {
        // SAFETY: dup(2) of an open fd; the copy is owned right below.
        let fd = unsafe { libc::dup(rx.as_raw_fd()) };
        // SAFETY: `fd` is a fresh duplicate nobody else owns (or -1, checked).
        let fd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        let (c, s) = (captured.clone(), stop.clone());
        std::thread::spawn(move || {
            if let Some(fd) = fd {
                capture_loop(&fd, &c, &s);
            }
        })
    });
    let total = u64::from(spec.rounds) * frames.len() as u64;
    let mut k: u64 = 0;
    'rounds: for _ in 0..spec.rounds {
        for (i, f) in frames.iter().enumerate() {
            if spec.pps > 0 {
                let due = start + Duration::from_secs_f64(k as f64 / f64::from(spec.pps));
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
            k += 1;
            let mut tries = 0u32;
            loop {
                // SAFETY: `f` is a live buffer of f.len() bytes; `tx` is an
                // open, bound AF_PACKET socket.
                let n = unsafe { libc::send(tx.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
                if n >= 0 {
                    rep.sent[i] += 1;
                    break;
                }
                let e = io::Error::last_os_error();
                let raw = e.raw_os_error().unwrap_or(0);
                if (raw == libc::ENOBUFS || raw == libc::EAGAIN) && tries < 10_000 {
                    tries += 1;
                    rep.retries += 1;
                    std::thread::sleep(Duration::from_micros(500));
                    continue;
                }
                rep.failed += 1;
                if rep.errors.len() < 8 {
                    rep.errors.push(format!("send frame {i}: {e}"));
                }
                if rep.failed > total / 10 + 100 {
                    break 'rounds;
                }
                break;
            }
        }
    }
    if capture.is_some() {
        std::thread::sleep(Duration::from_millis(spec.linger_ms));
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = capture {
        let _ = t.join();
    }
    rep.captured = std::mem::take(
        &mut *captured
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    rep.elapsed_ms = start.elapsed().as_millis() as u64;
    rep.done = true;
    rep
}

fn capture_loop(fd: &OwnedFd, out: &Mutex<Vec<String>>, stop: &AtomicBool) {
    let mut buf = vec![0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let n = unsafe { libc::poll(&raw mut pfd, 1, 20) };
        if n <= 0 {
            continue;
        }
        // SAFETY: `buf` is writable for buf.len() bytes; `fd` is open.
        let got = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if got <= 0 {
            continue;
        }
        let mut v = out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if v.len() < MAX_CAPTURE {
            v.push(hex_encode(&buf[..got as usize]));
        }
    }
}
