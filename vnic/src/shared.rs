//! State shared between the threads of the daemon.
//!
//! - [`Shared`] lives as long as the daemon: configuration, counters, the
//!   management state (behind one mutex, used only on the management path),
//!   the generator's flow sets, the trace writer, the tap queues.
//! - [`Conn`] lives as long as one vhost-user connection: the per-worker
//!   inboxes (lock-free queues + an eventfd), the enabled-pairs mask, hit
//!   counters of the worker replicas.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arfs::TableEvent;
use crossbeam_queue::{ArrayQueue, SegQueue};
use vhost_user_backend::{VringRwLock, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as VirtQueError, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::Config;
use crate::gen::GenControl;
use crate::mgmt::Mgmt;
use crate::stats::{PeerStats, QueueStats};
use crate::trace::Tracer;

pub type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// A vring of the device: `vhost-user-backend`'s `VringRwLock`, except that
/// a call eventfd installed on a running ring is signalled once.
///
/// Why: the frontend switches the call fd of a running ring whenever the
/// guest masks or unmasks the ring's MSI-X vector (QEMU points it at a
/// private "masked" eventfd while masked). `SET_VRING_CALL` expects no
/// reply, and QEMU checks the masked eventfd right after sending the
/// unmasking `SET_VRING_CALL`: a used-buffer notification the worker sends
/// to the old (masked) fd between that check and the moment the request
/// handler installs the new fd is lost. With `VIRTIO_RING_F_EVENT_IDX` a
/// single lost notification stalls the queue for good (the driver does not
/// move `used_event` until it is interrupted, so `needs_notification`
/// stays false for every later batch). One extra notification on the new
/// fd, after it is installed (`set_call` takes the ring's write lock, so
/// every signal of the worker either went to the old fd before it or goes
/// to the new one after it), covers that window; a spurious interrupt costs
/// the driver one look at the used ring. libvhost-user does the same.
#[derive(Clone)]
pub struct Vring(VringRwLock<Mem>);

impl<'a> VringStateGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateGuard<'a, Mem>>::G;
}

impl<'a> VringStateMutGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateMutGuard<'a, Mem>>::G;
}

impl VringT<Mem> for Vring {
    fn new(mem: Mem, max_queue_size: u16) -> Result<Self, VirtQueError> {
        VringRwLock::new(mem, max_queue_size).map(Self)
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, Mem>>::G {
        self.0.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, Mem>>::G {
        self.0.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        self.0.add_used(desc_index, len)
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.0.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        self.0.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        self.0.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        self.0.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.0.set_enabled(enabled);
    }

    fn set_queue_info(
        &self,
        desc_table: u64,
        avail_ring: u64,
        used_ring: u64,
    ) -> Result<(), VirtQueError> {
        self.0.set_queue_info(desc_table, avail_ring, used_ring)
    }

    fn queue_next_avail(&self) -> u16 {
        self.0.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.0.set_queue_next_avail(base);
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.0.set_queue_next_used(idx);
    }

    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        self.0.queue_used_idx()
    }

    fn set_queue_size(&self, num: u16) {
        self.0.set_queue_size(num);
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.0.set_queue_event_idx(enabled);
    }

    fn set_queue_ready(&self, ready: bool) {
        self.0.set_queue_ready(ready);
    }

    fn set_kick(&self, file: Option<File>) {
        self.0.set_kick(file);
    }

    fn read_kick(&self) -> io::Result<bool> {
        self.0.read_kick()
    }

    fn set_call(&self, file: Option<File>) {
        self.0.set_call(file);
        let st = self.0.get_ref();
        if st.get_queue().ready() && st.get_call().is_some() {
            log::debug!("call fd replaced on a running ring: signalling it once");
            if let Err(e) = st.signal_used_queue() {
                log::debug!("signal after SET_VRING_CALL: {e}");
            }
        }
    }

    fn set_err(&self, file: Option<File>) {
        self.0.set_err(file);
    }
}

/// Batches in flight from other workers towards one rx queue (up to
/// [`HANDOFF_FRAMES`] frames each).
pub const XRING_LEN: usize = 64;
/// Frames per hand-off batch: a worker sends a batch to another worker's
/// inbox when it holds this many frames (or [`HANDOFF_BYTES`]), and at the
/// end of every batch of its own work, with one kick per destination.
pub const HANDOFF_FRAMES: usize = 32;
/// Bytes per hand-off batch before it is sent.
pub const HANDOFF_BYTES: usize = 64 * 1024;
/// Record header of a frame in a [`FrameBatch`]: length (u32 LE), flag, padding.
const REC_HDR: usize = 8;

/// Frames handed from one worker to another worker's rx queue, packed back
/// to back in one buffer (recycled through the destination's pool), so a
/// hand-off costs one ring operation and one kick per batch, not per frame.
/// Each frame carries its virtio-net header space and whether a filter
/// steered it.
#[derive(Default)]
pub struct FrameBatch {
    buf: Vec<u8>,
    count: usize,
}

impl FrameBatch {
    pub fn new() -> Self {
        Self {
            buf: Vec::with_capacity(HANDOFF_BYTES + 2048),
            count: 0,
        }
    }

    /// Appends a frame (header space included).
    pub fn push(&mut self, pkt: &[u8], filter: bool) {
        let mut h = [0u8; REC_HDR];
        h[..4].copy_from_slice(&(pkt.len() as u32).to_le_bytes());
        h[4] = u8::from(filter);
        self.buf.extend_from_slice(&h);
        self.buf.extend_from_slice(pkt);
        self.count += 1;
    }

    /// Frames in the batch.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether the batch should be sent now.
    pub fn is_full(&self) -> bool {
        self.count >= HANDOFF_FRAMES || self.buf.len() >= HANDOFF_BYTES
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
    }

    /// The frame at `*off` (start with 0) and its filter flag, advancing
    /// `*off`; `None` at the end.
    pub fn next_mut(&mut self, off: &mut usize) -> Option<(&mut [u8], bool)> {
        let h = self.buf.get(*off..*off + REC_HDR)?;
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let filter = h[4] == 1;
        let start = *off + REC_HDR;
        let pkt = self.buf.get_mut(start..start + len)?;
        *off = start + len;
        Some((pkt, filter))
    }
}
/// Size of the id space of filter ids (0..=0xFFFE).
pub const ID_SPACE: usize = 0xFFFF;

/// One worker's inbox: what other threads hand to it.
pub struct Inbox {
    /// Batches of frames steered to this worker's rx queue by another worker.
    pub frames: ArrayQueue<FrameBatch>,
    /// Recycled batches for `frames`.
    pub pool: ArrayQueue<FrameBatch>,
    /// This worker's rx queue had no buffer for a frame and has not seen
    /// new buffers since: other workers drop what they would hand over (as
    /// `rx_drops_no_buffers`) instead of sending it, and their unlimited
    /// generators pause, until this worker sees buffers again.
    pub starved: AtomicBool,
    /// Workers (bit per worker) whose unlimited generator paused on this
    /// inbox (full, or `starved`): woken when it is drained and not starved.
    pub waiters: AtomicU32,
    /// Table events to apply to the worker's replica, in table order.
    pub updates: SegQueue<Arc<TableEvent>>,
    /// Management frames to deliver on this pair's rx queue.
    pub replies: SegQueue<Vec<u8>>,
    /// Wakes the worker (registered with its epoll).
    pub kick: EventFd,
    /// Set (before a wake) when the worker must poll its tx ring.
    pub tx_recheck: AtomicBool,
}

impl Inbox {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            frames: ArrayQueue::new(XRING_LEN),
            pool: ArrayQueue::new(2 * XRING_LEN),
            starved: AtomicBool::new(false),
            waiters: AtomicU32::new(0),
            updates: SegQueue::new(),
            replies: SegQueue::new(),
            kick: EventFd::new(EFD_NONBLOCK)?,
            tx_recheck: AtomicBool::new(false),
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
    /// Guest memory, set by the first worker that registers its vrings
    /// (read by the notification watchdog of [`Conn::poll_enabled`]).
    pub mem: Mutex<Option<Mem>>,
    /// Watchdog state per pair: last (rx, tx) snapshots.
    watch: Mutex<Vec<[Snap; 2]>>,
    /// Lost notifications the watchdog made up for (interrupts re-sent,
    /// tx rings re-polled).
    pub nudges: AtomicU64,
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
            mem: Mutex::new(None),
            watch: Mutex::new(vec![[Snap::default(); 2]; pairs]),
            nudges: AtomicU64::new(0),
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

    /// Re-reads the enabled state of every registered vring, and runs the
    /// notification watchdog ([`Conn::watchdog`]).
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
        self.watchdog(&vr);
    }

    /// With `VIRTIO_RING_F_EVENT_IDX` one lost notification stalls a ring
    /// for good: a lost used-buffer interrupt leaves the driver's
    /// `used_event` behind, so no later batch asks for an interrupt again;
    /// a lost kick leaves `avail_event` behind, so the driver never kicks
    /// again. Called every poll period (50 ms): a ring whose state has not
    /// moved for a whole period while the driver is owed an interrupt
    /// (the used index passed `used_event`) gets one more interrupt, and a
    /// tx ring holding unprocessed chains gets its worker to poll it. Once
    /// per stalled state: an idle driver is not interrupted again and again.
    fn watchdog(&self, vr: &[Option<Vec<Vring>>]) {
        let Some(mem) = self
            .mem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
        else {
            return;
        };
        let mem = mem.memory();
        let mut watch = self
            .watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (pair, v) in vr.iter().enumerate() {
            let (Some(v), Some(w)) = (v, watch.get_mut(pair)) else {
                continue;
            };
            for (k, ring) in v.iter().take(2).enumerate() {
                let st = ring.get_ref();
                let q = st.get_queue();
                if !(st.is_enabled() && q.ready() && q.event_idx_enabled()) {
                    w[k] = Snap::default();
                    continue;
                }
                let used_event_addr =
                    GuestAddress(q.avail_ring()).checked_add(4 + 2 * u64::from(q.size()));
                let used_event = used_event_addr
                    .and_then(|a| mem.read_obj::<u16>(a).ok())
                    .map(u16::from_le);
                let avail = q.avail_idx(&*mem, Ordering::Acquire).ok().map(|a| a.0);
                let (Some(used_event), Some(avail)) = (used_event, avail) else {
                    continue;
                };
                let now = Snap {
                    valid: true,
                    used_event,
                    next_used: q.next_used(),
                    avail,
                    next_avail: q.next_avail(),
                    nudged: false,
                };
                let same = w[k].valid && w[k].same(&now);
                if !same {
                    w[k] = now;
                    continue;
                }
                if w[k].nudged {
                    continue;
                }
                // The used index went past used_event: the driver asked for
                // an interrupt it has not acted on for a whole period.
                let owed = now.next_used.wrapping_sub(now.used_event).wrapping_sub(1) < 0x8000;
                // Tx chains the worker has not taken for a whole period.
                let unpolled = k == 1 && now.avail != now.next_avail;
                if owed {
                    log::debug!(
                        "pair {pair}: {} ring: used {} past used_event {} with no progress: interrupting again",
                        if k == 0 { "rx" } else { "tx" },
                        now.next_used,
                        now.used_event
                    );
                    let _ = st.signal_used_queue();
                }
                if unpolled {
                    log::debug!(
                        "pair {pair}: tx ring: avail {} next_avail {} with no progress: polling it",
                        now.avail,
                        now.next_avail
                    );
                    if let Some(ib) = self.inbox.get(pair) {
                        ib.tx_recheck.store(true, Ordering::Release);
                        ib.wake();
                    }
                }
                if owed || unpolled {
                    self.nudges.fetch_add(1, Ordering::Relaxed);
                    w[k].nudged = true;
                }
            }
        }
    }
}

/// What the watchdog saw of one ring at the previous poll.
#[derive(Clone, Copy, Default)]
struct Snap {
    valid: bool,
    used_event: u16,
    next_used: u16,
    avail: u16,
    next_avail: u16,
    /// A notification was already made up for in this state.
    nudged: bool,
}

impl Snap {
    fn same(&self, o: &Snap) -> bool {
        (self.used_event, self.next_used, self.avail, self.next_avail)
            == (o.used_event, o.next_used, o.avail, o.next_avail)
    }
}

/// Whether a vring is enabled and started.
pub fn vring_running(v: &Vring) -> bool {
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

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, FromRawFd};

    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;

    const SIZE: u16 = 256;
    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x3000;
    const USED: u64 = 0x4000;

    /// A running EVENT_IDX ring whose call fd is `efd`.
    fn ring(mem: &Mem, efd: &EventFd) -> Vring {
        let v = Vring::new(mem.clone(), SIZE).unwrap();
        v.set_queue_size(SIZE);
        v.set_queue_info(DESC, AVAIL, USED).unwrap();
        v.set_queue_event_idx(true);
        v.set_queue_ready(true);
        v.set_enabled(true);
        // SAFETY: dup returns a new descriptor that nothing else owns; the
        // File takes sole ownership of it.
        let f = unsafe { File::from_raw_fd(libc::dup(efd.as_raw_fd())) };
        v.set_call(Some(f));
        v
    }

    fn signalled(efd: &EventFd) -> bool {
        efd.read().is_ok()
    }

    #[test]
    fn call_fd_installed_on_a_running_ring_is_signalled_once() {
        let mem: Mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap(),
        );
        let efd = EventFd::new(EFD_NONBLOCK).unwrap();
        let _v = ring(&mem, &efd);
        assert!(signalled(&efd));
        assert!(!signalled(&efd));
    }

    #[test]
    fn watchdog_makes_up_for_a_lost_interrupt_and_a_lost_kick_once() {
        let mem: Mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap(),
        );
        let (rx_efd, tx_efd) = (
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        );
        let (rx, tx) = (ring(&mem, &rx_efd), ring(&mem, &tx_efd));
        let _ = (signalled(&rx_efd), signalled(&tx_efd));
        let conn = Conn::new(1).unwrap();
        conn.vrings.lock().unwrap()[0] = Some(vec![rx.clone(), tx.clone()]);
        *conn.mem.lock().unwrap() = Some(mem.clone());
        let m = mem.memory();
        let used_event = GuestAddress(AVAIL + 4 + 2 * u64::from(SIZE));

        // rx: the device published 3 buffers, the driver asked for an
        // interrupt after the first (used_event 0) and never got it.
        rx.set_queue_next_used(3);
        m.write_obj(0u16, used_event).unwrap();
        conn.poll_enabled();
        assert!(!signalled(&rx_efd), "first look only records the state");
        conn.poll_enabled();
        assert!(
            signalled(&rx_efd),
            "no progress for a period: interrupt again"
        );
        conn.poll_enabled();
        conn.poll_enabled();
        assert!(!signalled(&rx_efd), "once per stalled state");
        // The driver caught up: nothing is owed.
        m.write_obj(3u16, used_event).unwrap();
        conn.poll_enabled();
        conn.poll_enabled();
        assert!(!signalled(&rx_efd));

        // tx: the driver posted 2 chains (avail idx 2) the worker never took.
        assert!(!conn.inbox[0].tx_recheck.load(Ordering::Relaxed));
        m.write_obj(2u16, GuestAddress(AVAIL + 2)).unwrap();
        conn.poll_enabled();
        assert!(!conn.inbox[0].tx_recheck.load(Ordering::Relaxed));
        conn.poll_enabled();
        assert!(conn.inbox[0].tx_recheck.swap(false, Ordering::Relaxed));
        assert!(conn.inbox[0].kick.read().is_ok(), "worker woken");
        conn.poll_enabled();
        assert!(!conn.inbox[0].tx_recheck.load(Ordering::Relaxed));
        assert_eq!(conn.nudges.load(Ordering::Relaxed), 2);
    }
}
