//! State shared between the threads of the daemon.
//!
//! - [`Shared`] lives as long as the daemon: configuration, counters, the
//!   management state (behind one mutex, used only on the management path),
//!   the generator's flow sets, the trace writer, the tap queues.
//! - [`Conn`] lives as long as one vhost-user connection: the per-worker
//!   inboxes (lock-free queues + an eventfd), the enabled-pairs mask, hit
//!   counters of the worker replicas.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arfs::TableEvent;
use crossbeam_queue::{ArrayQueue, SegQueue};
use vhost_user_backend::VringRwLock;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::Config;
use crate::gen::GenControl;
use crate::mgmt::Mgmt;
use crate::stats::{PeerStats, QueueStats};
use crate::trace::Tracer;

pub type Mem = GuestMemoryAtomic<GuestMemoryMmap>;
pub type Vring = VringRwLock<Mem>;

/// Frames in flight from other workers towards one rx queue.
pub const XRING_LEN: usize = 4096;
/// Size of the id space of filter ids (0..=0xFFFE).
pub const ID_SPACE: usize = 0xFFFF;

/// One worker's inbox: what other threads hand to it.
pub struct Inbox {
    /// Frames (virtio-net header space + frame) steered to this worker's
    /// rx queue by another worker. Byte 0 of the header space is 1 when the
    /// frame was steered by a filter, 0 when by RSS.
    pub frames: ArrayQueue<Vec<u8>>,
    /// Recycled frame buffers for `frames`.
    pub pool: ArrayQueue<Vec<u8>>,
    /// Table events to apply to the worker's replica, in table order.
    pub updates: SegQueue<Arc<TableEvent>>,
    /// Management frames to deliver on this pair's rx queue.
    pub replies: SegQueue<Vec<u8>>,
    /// Wakes the worker (registered with its epoll).
    pub kick: EventFd,
}

impl Inbox {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            frames: ArrayQueue::new(XRING_LEN),
            pool: ArrayQueue::new(XRING_LEN),
            updates: SegQueue::new(),
            replies: SegQueue::new(),
            kick: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    pub fn wake(&self) {
        let _ = self.kick.write(1);
    }
}

/// Per-connection state.
pub struct Conn {
    pub inbox: Box<[Inbox]>,
    /// Bit i set when rx queue i is enabled and started.
    pub enabled_mask: AtomicU32,
    /// Bit i set when the frontend's last SET_VRING_ENABLE for rx vring
    /// 2i enabled it (recorded by the relay before the handler sees it).
    pub frontend_enabled: AtomicU32,
    /// Whether any SET_VRING_ENABLE was seen on this connection.
    pub frontend_enable_seen: AtomicBool,
    /// Clones of each worker's vrings, registered by the worker on its first
    /// event, polled by the management thread for the enabled mask.
    pub vrings: Mutex<Vec<Option<Vec<Vring>>>>,
    /// Per worker, per filter id: frames steered by that filter (written by
    /// the worker only).
    pub hits: Box<[Box<[AtomicU64]>]>,
    pub event_idx: AtomicBool,
    pub acked_features: AtomicU64,
}

impl Conn {
    pub fn new(pairs: usize) -> std::io::Result<Self> {
        let mut inbox = Vec::with_capacity(pairs);
        for _ in 0..pairs {
            inbox.push(Inbox::new()?);
        }
        let hits = (0..pairs)
            .map(|_| {
                (0..ID_SPACE)
                    .map(|_| AtomicU64::new(0))
                    .collect::<Vec<_>>()
                    .into_boxed_slice()
            })
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Ok(Self {
            inbox: inbox.into_boxed_slice(),
            enabled_mask: AtomicU32::new(0),
            frontend_enabled: AtomicU32::new(0),
            frontend_enable_seen: AtomicBool::new(false),
            vrings: Mutex::new(vec![None; pairs]),
            hits,
            event_idx: AtomicBool::new(false),
            acked_features: AtomicU64::new(0),
        })
    }

    /// Number of enabled pairs counted from pair 0, as the frontend asked
    /// (the management path checks `rxq` against this: an ADD to a pair the
    /// guest has just enabled must not depend on the 50 ms vring poll).
    /// Before any SET_VRING_ENABLE, the polled vring state.
    pub fn enabled_pairs(&self) -> u16 {
        let m = if self.frontend_enable_seen.load(Ordering::Acquire) {
            self.frontend_enabled.load(Ordering::Acquire)
        } else {
            self.enabled_mask.load(Ordering::Relaxed)
        };
        m.trailing_ones() as u16
    }

    /// Pairs the workers' RSS spreads over: enabled and started vrings,
    /// counted from pair 0 (may trail `enabled_pairs` by one poll after an
    /// enable).
    pub fn rss_pairs(&self) -> u16 {
        self.enabled_mask.load(Ordering::Relaxed).trailing_ones() as u16
    }

    /// Records a frontend SET_VRING_ENABLE (rx vrings only: index 2i).
    pub fn note_vring_enable(&self, index: u32, enable: bool) {
        let pairs = self.inbox.len() as u32;
        if !index.is_multiple_of(2) || index / 2 >= pairs {
            return;
        }
        let bit = 1u32 << (index / 2);
        if enable {
            self.frontend_enabled.fetch_or(bit, Ordering::AcqRel);
        } else {
            self.frontend_enabled.fetch_and(!bit, Ordering::AcqRel);
            // The workers' RSS follows `enabled_mask`: drop the pair from it
            // now, not at the next poll, so no frame is steered to it.
            self.enabled_mask.fetch_and(!bit, Ordering::AcqRel);
        }
        self.frontend_enable_seen.store(true, Ordering::Release);
    }

    /// Whether the frontend allows pair `i` (always, before any
    /// SET_VRING_ENABLE was seen).
    pub fn frontend_allows(&self, i: usize) -> bool {
        !self.frontend_enable_seen.load(Ordering::Acquire)
            || self.frontend_enabled.load(Ordering::Acquire) & (1 << i) != 0
    }

    /// Sum of the replicas' hit counters of filter `id`.
    pub fn hits(&self, id: u16) -> u64 {
        self.hits
            .iter()
            .map(|h| {
                h.get(usize::from(id))
                    .map_or(0, |c| c.load(Ordering::Relaxed))
            })
            .sum()
    }

    /// Re-reads the enabled state of every registered vring.
    pub fn poll_enabled(&self) {
        let vr = self
            .vrings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut mask = 0u32;
        for (i, v) in vr.iter().enumerate() {
            if let Some(v) = v {
                if vring_running(&v[0]) && self.frontend_allows(i) {
                    mask |= 1 << i;
                }
            }
        }
        self.enabled_mask.store(mask, Ordering::Relaxed);
    }
}

/// Whether a vring is enabled and started.
pub fn vring_running(v: &Vring) -> bool {
    use vhost_user_backend::VringT;
    use virtio_queue::QueueT;
    let st = v.get_ref();
    st.is_enabled() && st.get_queue().ready()
}

/// Daemon-wide state.
pub struct Shared {
    pub cfg: Config,
    pub start: Instant,
    pub generation: AtomicU32,
    pub connected: AtomicBool,
    pub connections: AtomicU64,
    pub qstats: Box<[QueueStats]>,
    pub peer_stats: PeerStats,
    /// Management replies dropped because the rx queue had no buffer.
    pub replies_dropped_no_buffers: AtomicU64,
    pub mgmt: Mutex<Mgmt>,
    pub gen: GenControl,
    pub tracer: Tracer,
    /// Tap queues, one per pair (tap peer only).
    pub taps: Vec<File>,
    /// The current connection, if any.
    pub conn: Mutex<Option<Arc<Conn>>>,
}

impl Shared {
    /// Monotonic nanoseconds since the daemon started.
    pub fn now_ns(&self) -> u64 {
        process_now_ns()
    }

    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Relaxed)
    }

    pub fn pairs(&self) -> usize {
        usize::from(self.cfg.queues)
    }

    pub fn current_conn(&self) -> Option<Arc<Conn>> {
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn lock_mgmt(&self) -> std::sync::MutexGuard<'_, Mgmt> {
        self.mgmt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Puts `fd` in non-blocking mode (timerfds: a read after the timer was
/// re-armed or cleared between epoll and read must not block the thread).
pub fn set_nonblocking(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: F_GETFL on a descriptor the caller owns; no memory is passed.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an int flag argument on the same descriptor.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Monotonic nanoseconds since the process first asked (at daemon start).
pub fn process_now_ns() -> u64 {
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// An initial generation: derived from the wall clock and the pid so that
/// a restarted daemon never reuses its predecessor's; never 0.
pub fn initial_generation() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ (u64::from(std::process::id()) << 32);
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let g = x as u32;
    if g == 0 {
        1
    } else {
        g
    }
}

/// The generation after `g` (skips 0).
pub fn next_generation(g: u32) -> u32 {
    match g.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}
