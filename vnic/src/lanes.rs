//! One connection's lanes between threads: each worker's [`Inbox`] (frames
//! other workers steered to its rx queue, packed in [`FrameBatch`]es;
//! management replies; table events for its replica; its wake-up eventfd),
//! and the ACK barrier of [`Lanes`]: a management ACK leaves only once the
//! change it acknowledges holds for every frame, that is every worker's
//! replica has applied the table events that came before it and every
//! frame steered by the older state has left the inboxes (delivered or
//! dropped). The barrier's state is private here; the management path
//! publishes and replies, the workers apply, drain and ask.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arfs::TableEvent;
use crossbeam_queue::{ArrayQueue, SegQueue};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Batches in flight from other workers towards one rx queue (up to
/// [`HANDOFF_FRAMES`] frames each).
pub(crate) const XRING_LEN: usize = 64;
/// Frames per hand-off batch: a worker sends a batch to another worker's
/// inbox when it holds this many frames (or [`HANDOFF_BYTES`]), and at the
/// end of every batch of its own work, with one kick per destination.
pub(crate) const HANDOFF_FRAMES: usize = 32;
/// Bytes per hand-off batch before it is sent.
pub(crate) const HANDOFF_BYTES: usize = 64 * 1024;
/// Record header of a frame in a [`FrameBatch`]: length (u32 LE), flag, padding.
const REC_HDR: usize = 8;
/// Frames handed from one worker to another worker's rx queue, packed back
/// to back in one buffer (recycled through the destination's pool), so a
/// hand-off costs one ring operation and one kick per batch, not per frame.
/// Each frame carries its virtio-net header space and whether a filter
/// steered it.
#[derive(Default)]
pub(crate) struct FrameBatch {
    buf: Vec<u8>,
    count: usize,
}

impl FrameBatch {
    pub(crate) fn new() -> Self {
        Self {
            buf: Vec::with_capacity(HANDOFF_BYTES + 2048),
            count: 0,
        }
    }

    /// Appends a frame (header space included); `drop`: the `drop_rate`
    /// fault chose it (the receiving worker counts it delivered and drops it).
    pub(crate) fn push(&mut self, pkt: &[u8], filter: bool, drop: bool) {
        let mut h = [0u8; REC_HDR];
        h[..4].copy_from_slice(&(pkt.len() as u32).to_le_bytes());
        h[4] = u8::from(filter);
        h[5] = u8::from(drop);
        self.buf.extend_from_slice(&h);
        self.buf.extend_from_slice(pkt);
        self.count += 1;
    }

    /// Frames in the batch.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether the batch's frames take more than `bytes` bytes.
    pub(crate) fn holds_more_than(&self, bytes: usize) -> bool {
        self.buf.len() > bytes
    }

    /// Whether the batch should be sent now.
    pub(crate) fn is_full(&self) -> bool {
        self.count >= HANDOFF_FRAMES || self.buf.len() >= HANDOFF_BYTES
    }

    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
    }

    /// The frame at `*off` (start with 0) and its filter flag, advancing
    /// `*off`; `None` at the end.
    pub(crate) fn next_mut(&mut self, off: &mut usize) -> Option<(&mut [u8], bool, bool)> {
        let h = self.buf.get(*off..*off + REC_HDR)?;
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let filter = h[4] == 1;
        let drop = h[5] == 1;
        let start = *off + REC_HDR;
        let pkt = self.buf.get_mut(start..start + len)?;
        *off = start + len;
        Some((pkt, filter, drop))
    }
}

/// A management reply for the guest: the frame with its virtio-net header
/// space in front, and the number of table events every replica must have
/// applied before it may leave (what an ACK promises: PROTOCOL.md).
pub(crate) struct Reply {
    pub pkt: Vec<u8>,
    pub needs: u64,
}

/// One worker's inbox: what other threads hand to it.
pub(crate) struct Inbox {
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
    updates: SegQueue<Arc<TableEvent>>,
    /// Table events this worker's replica has applied.
    applied: AtomicU64,
    /// This worker drained its inbox after every replica had applied this
    /// many table events: no frame steered by an older state waits here.
    drained: AtomicU64,
    /// Management replies to deliver on this pair's rx queue.
    pub replies: SegQueue<Reply>,
    /// Wakes the worker (registered with its epoll).
    pub kick: EventFd,
    /// Set (before a wake) when the worker must poll its tx ring.
    pub tx_recheck: AtomicBool,
    /// The worker holds frames back (the `reorder_rate` fault): the 50 ms
    /// poll wakes it, so that a flow that went quiet gets them.
    pub holding: AtomicBool,
}

impl Inbox {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            frames: ArrayQueue::new(XRING_LEN),
            pool: ArrayQueue::new(2 * XRING_LEN),
            starved: AtomicBool::new(false),
            waiters: AtomicU32::new(0),
            updates: SegQueue::new(),
            applied: AtomicU64::new(0),
            drained: AtomicU64::new(0),
            replies: SegQueue::new(),
            kick: EventFd::new(EFD_NONBLOCK)?,
            tx_recheck: AtomicBool::new(false),
            holding: AtomicBool::new(false),
        })
    }

    pub(crate) fn wake(&self) {
        let _ = self.kick.write(1);
    }

    /// Asks the worker to poll its tx ring (a kick may have been lost).
    pub(crate) fn recheck_tx(&self) {
        self.tx_recheck.store(true, Ordering::Release);
        self.wake();
    }
}

/// The inboxes of one connection's workers.
pub(crate) struct Lanes {
    inbox: Box<[Inbox]>,
    /// Table events published to every replica so far.
    published: AtomicU64,
    /// Workers (bit per worker) holding a reply that waits for the
    /// replicas: woken by each worker that applies table events.
    ack_waiters: AtomicU32,
}

impl Lanes {
    pub(crate) fn new(pairs: usize) -> std::io::Result<Self> {
        let mut inbox = Vec::with_capacity(pairs);
        for _ in 0..pairs {
            inbox.push(Inbox::new()?);
        }
        Ok(Self {
            inbox: inbox.into_boxed_slice(),
            published: AtomicU64::new(0),
            ack_waiters: AtomicU32::new(0),
        })
    }

    pub(crate) fn get(&self, i: usize) -> Option<&Inbox> {
        self.inbox.get(i)
    }

    /// Worker `w`'s inbox (`w` < the pairs the lanes were made for).
    #[inline]
    pub(crate) fn inbox(&self, w: usize) -> &Inbox {
        &self.inbox[w]
    }

    /// Worker `w` applies the table events published to it, in order, to
    /// its replica (`apply`), and says so ([`Self::applied_by`]).
    pub(crate) fn apply_updates(&self, w: usize, mut apply: impl FnMut(&TableEvent)) {
        let ib = &self.inbox[w];
        let mut n = 0;
        while let Some(e) = ib.updates.pop() {
            apply(&e);
            n += 1;
        }
        if n > 0 {
            self.applied_by(w, ib.applied.load(Ordering::Relaxed) + n);
        }
    }

    /// The next table event waiting for worker `w` (tests of the
    /// management path look at what it published).
    #[cfg(test)]
    pub(crate) fn pop_update(&self, w: usize) -> Option<Arc<TableEvent>> {
        self.inbox[w].updates.pop()
    }

    pub(crate) fn wake_all(&self) {
        for ib in &*self.inbox {
            ib.wake();
        }
    }

    /// Every worker's inbox.
    pub(crate) fn all(&self) -> &[Inbox] {
        &self.inbox
    }

    /// Hands a table event to every replica (applied at each worker's
    /// next wake-up, before anything it routes).
    pub(crate) fn publish(&self, e: TableEvent) {
        let e = Arc::new(e);
        for ib in &*self.inbox {
            ib.updates.push(e.clone());
        }
        self.published.fetch_add(1, Ordering::SeqCst);
    }

    /// A management reply for worker `w`'s rx queue. It leaves once every
    /// replica has applied what was published before it; the workers that
    /// still have to are woken. When `w` is the caller (`caller`, a worker
    /// handling a management frame) the reply is returned for it to
    /// deliver itself; otherwise it goes on `w`'s inbox and `w` is woken.
    pub(crate) fn reply(&self, w: usize, pkt: Vec<u8>, caller: Option<usize>) -> Option<Reply> {
        let needs = self.published.load(Ordering::SeqCst);
        for (i, o) in self.inbox.iter().enumerate() {
            if Some(i) != caller && o.applied.load(Ordering::SeqCst) < needs {
                o.wake();
            }
        }
        let r = Reply { pkt, needs };
        if caller == Some(w) {
            return Some(r);
        }
        let ib = self.inbox.get(w)?;
        ib.replies.push(r);
        ib.wake();
        None
    }

    /// Table events every replica has applied.
    pub(crate) fn min_applied(&self) -> u64 {
        self.inbox
            .iter()
            .map(|ib| ib.applied.load(Ordering::SeqCst))
            .min()
            .unwrap_or(0)
    }

    /// Whether a reply needing `needs` may leave now: every worker drained
    /// its inbox after all replicas had applied `needs` events. If not,
    /// worker `w` waits to be woken, and the workers still behind are
    /// woken to catch up.
    pub(crate) fn may_send(&self, w: usize, needs: u64) -> bool {
        let done = |ib: &Inbox| ib.drained.load(Ordering::SeqCst) >= needs;
        if self.inbox.iter().all(done) {
            return true;
        }
        // Register first, then look again (SeqCst on both sides: a worker
        // that moved in between either sees the bit or is seen here).
        self.ack_waiters.fetch_or(1 << w, Ordering::SeqCst);
        let mut all = true;
        for (i, ib) in self.inbox.iter().enumerate() {
            if !done(ib) {
                all = false;
                if i != w {
                    ib.wake();
                }
            }
        }
        // This worker itself may be the one behind: it drained before the
        // others had applied `needs`, and they applied and drained since,
        // before the bit above was set, so none of them will wake it. If
        // every replica has applied `needs` now, one more drain of its own
        // inbox lets the reply go: wake itself for it. (If some replica
        // has not, that worker's `applied_by` comes after the bit was set
        // and wakes everyone.)
        if !done(&self.inbox[w]) && self.min_applied() >= needs {
            self.inbox[w].wake();
        }
        all
    }

    /// Called by a worker after it applied table events: while a reply
    /// waits, every worker must drain its inbox again.
    pub(crate) fn applied_by(&self, w: usize, n: u64) {
        self.inbox[w].applied.store(n, Ordering::SeqCst);
        if self.ack_waiters.load(Ordering::SeqCst) != 0 {
            self.wake_all();
        }
    }

    /// Called by a worker that drained its inbox after all replicas had
    /// applied `floor` events: wakes the workers holding replies.
    pub(crate) fn drained_by(&self, w: usize, floor: u64) {
        let d = &self.inbox[w].drained;
        if d.load(Ordering::Relaxed) >= floor {
            return;
        }
        d.store(floor, Ordering::SeqCst);
        if self.ack_waiters.load(Ordering::SeqCst) != 0 {
            let mut k = self.ack_waiters.swap(0, Ordering::SeqCst);
            while k != 0 {
                let q = k.trailing_zeros() as usize;
                k &= k - 1;
                if let Some(ib) = self.inbox.get(q) {
                    ib.wake();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pending wake-ups of worker `w` (reads and clears its eventfd).
    fn woken(l: &Lanes, w: usize) -> bool {
        l.inbox(w).kick.read().is_ok_and(|n| n > 0)
    }

    /// Worker 0 handles a management frame and holds its reply; worker 1
    /// applies the event and drains in the window between worker 0's drain
    /// and its check. Nobody else will wake worker 0 then: it must wake
    /// itself, drain again and send (found as a 60 s ACK stall in the bench).
    #[test]
    fn reply_holder_that_drained_too_early_wakes_itself() {
        let l = Lanes::new(2).unwrap();
        l.published.store(1, Ordering::SeqCst);
        let needs = 1;
        // Worker 0 applied the event and drained while worker 1 had not applied.
        l.applied_by(0, 1);
        l.drained_by(0, l.min_applied());
        assert_eq!(l.inbox[0].drained.load(Ordering::SeqCst), 0);
        // Worker 1 applies and drains before worker 0 registers as a waiter.
        l.applied_by(1, 1);
        l.drained_by(1, l.min_applied());
        while woken(&l, 0) || woken(&l, 1) {}
        // Worker 0 checks its reply: not yet (its own drain is behind) ...
        assert!(!l.may_send(0, needs));
        // ... but it was woken, and after one more drain the reply goes.
        assert!(woken(&l, 0), "the reply holder was left without a wake-up");
        l.drained_by(0, l.min_applied());
        assert!(l.may_send(0, needs));
    }

    /// The other order: worker 1 has not applied yet when worker 0 checks;
    /// worker 1 is woken, and its apply wakes worker 0.
    #[test]
    fn reply_waits_for_a_replica_behind_and_is_woken_by_it() {
        let l = Lanes::new(2).unwrap();
        l.published.store(1, Ordering::SeqCst);
        l.applied_by(0, 1);
        l.drained_by(0, l.min_applied());
        assert!(!l.may_send(0, 1));
        assert!(woken(&l, 1), "the replica behind was not woken");
        assert!(
            !woken(&l, 0),
            "no point waking the holder before the replica applied"
        );
        l.applied_by(1, 1);
        assert!(woken(&l, 0), "applying did not wake the reply holder");
        l.drained_by(1, l.min_applied());
        l.drained_by(0, l.min_applied());
        assert!(l.may_send(0, 1));
    }
}
