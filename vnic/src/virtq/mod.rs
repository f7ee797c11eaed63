//! The virtqueues of the packet path, treated as hostile: everything the
//! guest put in a ring is checked, a chain that cannot be used is consumed
//! with length 0 and counted by reason, never left in the ring and never
//! allowed to stop the queue. Only a ring the device cannot follow at all
//! (its avail index more than a ring ahead: [`RingStop`]) is stopped, with
//! the reason in `ctl stats`, until the frontend re-initialises it.
//!
//! - [`ring`]: the one path into a ring for both directions (a batch view
//!   of the split ring), its avail-index check and its used-buffer
//!   notification rule;
//! - [`chain`]: the one descriptor-chain walker;
//! - [`rx`]: filling rx chains;
//! - [`stores`]: each worker's choice between streamed and plain stores
//!   into rx buffers;
//! - [`tx`]: gathering tx chains;
//! - [`watchdog`]: making up for notifications lost around a call-fd switch.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::stats::{add, SharedCounter};

use vhost_user_backend::{VringRwLock, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as VirtQueError, QueueT};
use vm_memory::{Address, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

pub(crate) mod chain;
pub(crate) mod ring;
pub(crate) mod rx;
pub(crate) mod stores;
pub(crate) mod tx;
pub(crate) mod watchdog;

/// Guest memory as the daemon and its workers share it.
pub(crate) type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// Size of `struct virtio_net_hdr_v1` (VERSION_1 always uses it, with or
/// without MRG_RXBUF).
pub(crate) const NET_HDR_LEN: usize = 12;

pub(crate) use crate::stats::RingStop;

/// A ring's stop as its worker keeps it: the frontend's restart count of
/// the ring (see `Conn::ring_restarts`) when the device stopped it.
#[derive(Default)]
pub(crate) struct StopLatch(Option<u32>);

impl StopLatch {
    /// Whether the ring is still stopped. A ring the frontend restarted
    /// since (`restarts` moved) runs again: the latch and the queue's
    /// `*_stopped` state are cleared.
    pub(crate) fn holds(&mut self, restarts: u32, now: &AtomicU64, pair: usize, dir: &str) -> bool {
        match self.0 {
            Some(r) if r == restarts => true,
            Some(_) => {
                self.0 = None;
                now.store(0, Ordering::Relaxed);
                log::info!("pair {pair}: {dir} ring restarted by the frontend: running again");
                false
            }
            None => false,
        }
    }

    /// Whether the ring was stopped (without looking for a restart).
    pub(crate) fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Stops the ring for `why`: counted once in `stops`, the reason kept
    /// in `now`, one log line (rate-limited over all rings).
    pub(crate) fn stop(
        &mut self,
        restarts: u32,
        why: RingStop,
        stops: &[SharedCounter; 2],
        now: &AtomicU64,
        pair: usize,
        dir: &str,
    ) {
        self.0 = Some(restarts);
        let code = why.code();
        add(&stops[(code - 1) as usize], 1);
        now.store(code, Ordering::Relaxed);
        if STOP_LOG.allow() {
            log::warn!(
                "pair {pair}: {dir} ring stopped ({why}): the driver broke the ring; it stays stopped until the frontend restarts it"
            );
        } else {
            log::debug!("pair {pair}: {dir} ring stopped ({why})");
        }
    }
}

/// At most one line a second for ring stops a guest can cause.
static STOP_LOG: RateLimit = RateLimit::new();

/// Lets one log line through per second; the others go to debug.
pub(crate) struct RateLimit {
    last: AtomicU64,
}

impl RateLimit {
    pub(crate) const fn new() -> Self {
        Self {
            last: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now (then no other for a second).
    pub(crate) fn allow(&self) -> bool {
        let now = crate::clock::now_ns().max(1);
        let last = self.last.load(Ordering::Relaxed);
        (last == 0 || now.saturating_sub(last) >= 1_000_000_000)
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// Guest address of a split ring's `used_event` field (the last entry of
/// the avail ring, VIRTIO_F_EVENT_IDX): `None` if it overflows.
pub(crate) fn used_event_addr<Q: QueueT>(q: &Q) -> Option<GuestAddress> {
    GuestAddress(q.avail_ring()).checked_add(4 + 2 * u64::from(q.size()))
}

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
///
/// It also keeps a copy of the ring's error eventfd (`SET_VRING_ERR`),
/// which the library stores but offers no way to signal: [`Vring::signal_err`]
/// tells the frontend that the device stopped the ring (QEMU reports
/// "vhost vring error in virtqueue N").
#[derive(Clone)]
pub(crate) struct Vring(
    VringRwLock<Mem>,
    std::sync::Arc<std::sync::Mutex<Option<File>>>,
);

impl Vring {
    /// Signals the ring's error eventfd, if the frontend gave one.
    pub(crate) fn signal_err(&self) {
        let err = self
            .1
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = err.as_ref() {
            use std::io::Write;
            if let Err(e) = (&*f).write_all(&1u64.to_ne_bytes()) {
                log::debug!("vring error eventfd: {e}");
            }
        }
    }
}

impl<'a> VringStateGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateGuard<'a, Mem>>::G;
}

impl<'a> VringStateMutGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateMutGuard<'a, Mem>>::G;
}

impl VringT<Mem> for Vring {
    fn new(mem: Mem, max_queue_size: u16) -> Result<Self, VirtQueError> {
        VringRwLock::new(mem, max_queue_size).map(|v| Self(v, std::sync::Arc::default()))
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
        let copy = file.as_ref().and_then(|f| f.try_clone().ok());
        *self
            .1
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = copy;
        self.0.set_err(file);
    }
}

/// Random split rings of 16 entries, for the tests that hold the rx and tx
/// single-descriptor paths to the chain walk.
#[cfg(test)]
pub(crate) mod random_ring {
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::Queue;
    use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

    /// The end of guest memory: two regions of 2 MiB.
    pub(crate) const END: u64 = 0x40_0000;

    /// xorshift64: the same draws on every run.
    pub(crate) struct Draw(pub(crate) u64);

    impl Draw {
        /// A draw in `0..n`.
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// A buffer's address: mostly `home`, else across the two regions,
    /// across the end of memory, or outside it.
    pub(crate) fn addr(d: &mut Draw, home: u64) -> u64 {
        match d.below(10) {
            0 => END / 2 - 40,
            1 => END - 40,
            2 => 0x4000_0000,
            _ => home,
        }
    }

    /// Heads for the avail ring: up to 16, one in 12 outside the table.
    pub(crate) fn heads(d: &mut Draw) -> Vec<u16> {
        (0..d.below(17))
            .map(|_| {
                if d.below(12) == 0 {
                    16 + d.below(100) as u16
                } else {
                    d.below(16) as u16
                }
            })
            .collect()
    }

    /// Fresh guest memory (`fill` writes what the buffers hold) with
    /// `descs` in a 16-entry table and `heads` in the avail ring, and the
    /// queue over them.
    pub(crate) fn posted(
        descs: &[RawDescriptor],
        heads: &[u16],
        fill: impl FnOnce(&GuestMemoryMmap),
    ) -> (GuestMemoryMmap, Queue) {
        let m = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), (END / 2) as usize),
            (GuestAddress(END / 2), (END / 2) as usize),
        ])
        .unwrap();
        fill(&m);
        let q = {
            let mq = MockSplitQueue::new(&m, 16);
            for (i, d) in descs.iter().enumerate() {
                mq.desc_table().store(i as u16, *d).unwrap();
            }
            let avail = mq.avail_addr();
            for (i, h) in heads.iter().enumerate() {
                m.write_obj(*h, avail.unchecked_add(4 + 2 * i as u64))
                    .unwrap();
            }
            m.write_obj(heads.len() as u16, avail.unchecked_add(2))
                .unwrap();
            mq.create_queue().unwrap()
        };
        (m, q)
    }

    /// Every byte of guest memory.
    pub(crate) fn snapshot(m: &GuestMemoryMmap) -> Vec<u8> {
        let mut all = vec![0u8; END as usize];
        m.read_slice(&mut all, GuestAddress(0)).unwrap();
        all
    }
}
