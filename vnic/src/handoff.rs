//! The hand-off between workers.
//!
//! A frame from the peer is steered by the worker that got it ([`Router`]
//! asks [`crate::steer`]: a filter hit gives the filter's rx queue,
//! otherwise RSS) and counted. A frame for
//! the worker's own queue is written at once ([`crate::virtq::rx`]); a
//! frame for another pair's queue is packed into a [`FrameBatch`] for that
//! pair's [`Inbox`], sent when full and at the end of the batch, with one
//! eventfd kick per destination. A destination out of buffers or with a
//! full inbox makes the sender drop (counted) and pause its unlimited
//! generator until the destination wakes it. Nothing ever waits for a
//! guest, and no lock shared by the pairs is taken here.
//!
//! [`Lanes`] are one connection's inboxes, plus the bookkeeping that lets
//! a management ACK leave only once the change it acknowledges holds for
//! every frame: every worker's replica has applied the table events that
//! came before it, and every frame steered by the older state has left the
//! inboxes (delivered or dropped).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arfs::TableEvent;
use crossbeam_queue::{ArrayQueue, SegQueue};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::config::PathFaults;
use crate::pairs::Pairs;
use crate::stats::{add, Hits, HitsOwner, QueueOwner, QueueWriter, SharedCounter, Stats};
use crate::steer::{
    corrupt_payload, Steer, FAULT_BAD_CSUM, FAULT_CORRUPT, FAULT_DROP, MISROUTED, UNPARSABLE,
};
use crate::trace::Tracer;
use crate::virtq::rx::{RxBatch, RxOutcome};
use crate::virtq::NET_HDR_LEN;

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
/// Hand-off batches queued at another worker's inbox beyond which an
/// unlimited generator pauses until that worker has taken them.
const INFLIGHT_BATCHES: usize = 16;
/// Management replies kept while the rx queue has no buffer.
const REPLY_BACKLOG: usize = 256;

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

    /// Appends a frame (header space included); `drop`: the `drop_rate`
    /// fault chose it (the receiving worker counts it delivered and drops it).
    pub fn push(&mut self, pkt: &[u8], filter: bool, drop: bool) {
        let mut h = [0u8; REC_HDR];
        h[..4].copy_from_slice(&(pkt.len() as u32).to_le_bytes());
        h[4] = u8::from(filter);
        h[5] = u8::from(drop);
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
    pub fn next_mut(&mut self, off: &mut usize) -> Option<(&mut [u8], bool, bool)> {
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
pub struct Reply {
    pub pkt: Vec<u8>,
    pub needs: u64,
}

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
    /// Table events this worker's replica has applied.
    pub applied: AtomicU64,
    /// This worker drained its inbox after every replica had applied this
    /// many table events: no frame steered by an older state waits here.
    drained: AtomicU64,
    /// Management replies to deliver on this pair's rx queue.
    pub replies: SegQueue<Reply>,
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
            applied: AtomicU64::new(0),
            drained: AtomicU64::new(0),
            replies: SegQueue::new(),
            kick: EventFd::new(EFD_NONBLOCK)?,
            tx_recheck: AtomicBool::new(false),
        })
    }

    pub fn wake(&self) {
        let _ = self.kick.write(1);
    }

    /// Asks the worker to poll its tx ring (a kick may have been lost).
    pub fn recheck_tx(&self) {
        self.tx_recheck.store(true, Ordering::Release);
        self.wake();
    }
}

/// The inboxes of one connection's workers.
pub struct Lanes {
    inbox: Box<[Inbox]>,
    /// Table events published to every replica so far.
    published: AtomicU64,
    /// Workers (bit per worker) holding a reply that waits for the
    /// replicas: woken by each worker that applies table events.
    ack_waiters: AtomicU32,
}

impl Lanes {
    pub fn new(pairs: usize) -> std::io::Result<Self> {
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

    pub fn get(&self, i: usize) -> Option<&Inbox> {
        self.inbox.get(i)
    }

    pub fn wake_all(&self) {
        for ib in &*self.inbox {
            ib.wake();
        }
    }

    /// Hands a table event to every replica (applied at each worker's
    /// next wake-up, before anything it routes).
    pub fn publish(&self, e: TableEvent) {
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
    pub fn reply(&self, w: usize, pkt: Vec<u8>, caller: Option<usize>) -> Option<Reply> {
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
    fn min_applied(&self) -> u64 {
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
    fn may_send(&self, w: usize, needs: u64) -> bool {
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
    fn applied_by(&self, w: usize, n: u64) {
        self.inbox[w].applied.store(n, Ordering::SeqCst);
        if self.ack_waiters.load(Ordering::SeqCst) != 0 {
            self.wake_all();
        }
    }

    /// Called by a worker that drained its inbox after all replicas had
    /// applied `floor` events: wakes the workers holding replies.
    fn drained_by(&self, w: usize, floor: u64) {
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

/// Steering and delivery state of one worker for its rx queue.
pub struct Router {
    pub id: usize,
    lanes: Arc<Lanes>,
    pairs: Arc<Pairs>,
    stats: Arc<Stats>,
    /// The one writer of this worker's queue counters and hit row.
    owner: QueueOwner,
    hits: HitsOwner,
    tracer: Arc<Tracer>,
    generation: Arc<AtomicU32>,
    faults: Arc<PathFaults>,
    /// The replica, RSS and fault draws (knobs read at each
    /// [`Router::sync`], once per event, not per frame).
    steer: Steer,
    /// The copy of a frame the `corrupt_rate` fault damages.
    scratch: Vec<u8>,
    applied: u64,
    /// Other workers to wake at the end of the batch.
    kick: u32,
    /// Frames waiting to be handed to each other worker (sent when full
    /// and at the end of the batch).
    out: Vec<Option<FrameBatch>>,
    /// Management replies waiting for buffers or for the replicas.
    backlog: VecDeque<Reply>,
    pub mrg: bool,
    pub flags: BatchFlags,
}

/// What happened to the rx side during one batch of work.
#[derive(Default)]
pub struct BatchFlags {
    /// The batch used rx chains.
    pub added: bool,
    /// The batch found this worker's rx queue out of buffers.
    pub nobufs: bool,
    /// Another worker's queue could not take frames during this batch.
    pub nobufs_remote: bool,
}

/// This worker's own rx queue, as [`Local::deliver`] needs it (borrowed
/// field by field, so a caller may hold other parts of the router).
struct Local<'a> {
    q: QueueWriter<'a>,
    starved: &'a AtomicBool,
    mrg: bool,
    id: usize,
}

impl Local<'_> {
    #[inline]
    fn deliver(
        &self,
        flags: &mut BatchFlags,
        b: &mut RxBatch<'_>,
        pkt: &mut [u8],
        filter: Option<bool>,
        fake_drop: bool,
    ) -> bool {
        let w = &self.q;
        let q = w.queue();
        if !b.ready() {
            add(&q.rx_drops_disabled, 1);
            return false;
        }
        if fake_drop {
            // The `drop_rate` fault: counted as a filter delivery, never
            // written (a NIC that loses frames it reports delivered).
            w.add(|q| &q.rx_packets, 1);
            w.add(|q| &q.rx_bytes, (pkt.len() - NET_HDR_LEN) as u64);
            w.add(|q| &q.rx_filter, 1);
            return true;
        }
        let mut bad = 0;
        let out = b.deliver(pkt, self.mrg, &mut bad);
        if bad > 0 {
            w.add(|q| &q.rx_bad_chains, bad);
            flags.added = true;
            log::debug!("pair {}: {bad} unusable rx chain(s) consumed", self.id);
        }
        match out {
            RxOutcome::Delivered { .. } => {
                flags.added = true;
                w.add(|q| &q.rx_packets, 1);
                w.add(|q| &q.rx_bytes, (pkt.len() - NET_HDR_LEN) as u64);
                match filter {
                    Some(true) => w.add(|q| &q.rx_filter, 1),
                    Some(false) => w.add(|q| &q.rx_rss, 1),
                    None => {}
                }
                true
            }
            RxOutcome::NoBuffers => {
                flags.nobufs = true;
                if !self.starved.load(Ordering::Relaxed) {
                    self.starved.store(true, Ordering::Relaxed);
                }
                if filter.is_some() {
                    // Shared: the other workers count their frames for
                    // this queue here too (`Router::starved_drops`).
                    add(&q.rx_drops_no_buffers, 1);
                }
                false
            }
            RxOutcome::TooBig => {
                w.add(|q| &q.rx_drops_too_big, 1);
                false
            }
        }
    }
}

/// What a [`Router`] shares with the rest of its connection and daemon.
pub struct RouterLinks {
    pub lanes: Arc<Lanes>,
    pub pairs: Arc<Pairs>,
    pub stats: Arc<Stats>,
    pub hits: Arc<Hits>,
    pub tracer: Arc<Tracer>,
    pub generation: Arc<AtomicU32>,
    pub faults: Arc<PathFaults>,
}

impl Router {
    pub fn new(id: usize, capacity: usize, l: RouterLinks) -> Self {
        Self {
            id,
            lanes: l.lanes,
            pairs: l.pairs,
            owner: l.stats.claim(id),
            stats: l.stats,
            hits: l.hits.claim(id),
            tracer: l.tracer,
            generation: l.generation,
            faults: l.faults,
            steer: Steer::new(id, capacity),
            scratch: Vec::new(),
            applied: 0,
            kick: 0,
            out: Vec::new(),
            backlog: VecDeque::new(),
            mrg: true,
            flags: BatchFlags::default(),
        }
    }

    /// This worker's queue counters, as their one writer.
    #[inline]
    pub fn stats(&self) -> QueueWriter<'_> {
        self.owner.writer()
    }

    /// This worker's inbox.
    pub fn inbox(&self) -> &Inbox {
        &self.lanes.inbox[self.id]
    }

    pub fn lanes(&self) -> &Lanes {
        &self.lanes
    }

    /// Starts a batch of work on the rx queue.
    pub fn begin(&mut self) {
        self.flags.added = false;
        self.flags.nobufs = false;
    }

    /// Applies pending table events and picks up enabled-pair changes.
    pub fn sync(&mut self, mrg: bool) {
        let ib = &self.lanes.inbox[self.id];
        let mut n = 0;
        while let Some(e) = ib.updates.pop() {
            self.steer.apply(&e);
            n += 1;
        }
        if n > 0 {
            self.applied += n;
            self.lanes.applied_by(self.id, self.applied);
        }
        self.steer.set_faults([
            self.faults.misroute.load(Ordering::Relaxed),
            self.faults.drop.load(Ordering::Relaxed),
            self.faults.corrupt.load(Ordering::Relaxed),
            self.faults.bad_csum.load(Ordering::Relaxed),
        ]);
        self.steer.set_mask(self.pairs.mask());
        self.mrg = mrg;
    }

    /// Delivers `pkt` (header space + frame) into this worker's rx queue.
    /// `filter`: Some(true/false) for steered frames (counted as filter /
    /// RSS), None for management replies; `fake_drop`: the `drop_rate`
    /// fault (counted delivered, not written).
    #[inline]
    pub fn deliver_local(
        &mut self,
        b: &mut RxBatch<'_>,
        pkt: &mut [u8],
        filter: Option<bool>,
        fake_drop: bool,
    ) -> bool {
        let local = Local {
            q: self.owner.writer(),
            starved: &self.lanes.inbox[self.id].starved,
            mrg: self.mrg,
            id: self.id,
        };
        local.deliver(&mut self.flags, b, pkt, filter, fake_drop)
    }

    /// A frame with the management EtherType arrived from the peer: dropped,
    /// counted and traced (the trace drops, and counts, what it cannot take).
    fn spoofed(&self, frame: &[u8]) {
        add(&self.stats.peer.spoofed_mgmt_dropped, 1);
        if self.tracer.enabled() {
            let h = arfs::proto::peek_header(frame);
            self.tracer.emit(arfs::TraceRecord::mgmt_drop(
                crate::clock::now_ns(),
                self.generation.load(Ordering::Relaxed),
                arfs::proto::Direction::ToDriver,
                h.map(|h| h.seq),
                h.map(|h| h.msg_type),
                arfs::DropCause::Spoofed,
            ));
        }
    }

    /// Steers and delivers (or hands over) a frame from the peer: `pkt` is
    /// the header space followed by the frame. What [`Steer::decide`] says
    /// is counted here: the hit, and the faults after it.
    #[inline]
    pub fn route(&mut self, rx: &mut RxBatch<'_>, pkt: &mut [u8]) {
        let Some(d) = self.steer.decide(&pkt[NET_HDR_LEN..]) else {
            self.spoofed(&pkt[NET_HDR_LEN..]);
            return;
        };
        if let Some(id) = d.hit {
            self.hits.count(id);
        }
        if d.flags == 0 {
            self.route_to(rx, pkt, d.q, d.hit.is_some(), false);
            return;
        }
        if d.flags & UNPARSABLE != 0 {
            add(&self.stats.peer.unparsable, 1);
        }
        if d.flags & MISROUTED != 0 {
            add(&self.stats.peer.misrouted, 1);
        }
        let drop = d.flags & FAULT_DROP != 0;
        if drop {
            add(&self.stats.peer.fault_dropped, 1);
        }
        if d.flags & (FAULT_CORRUPT | FAULT_BAD_CSUM) != 0 {
            // Corrupt a copy: the peer's buffer (the generator's template)
            // stays as it was.
            let mut copy = std::mem::take(&mut self.scratch);
            copy.clear();
            copy.extend_from_slice(pkt);
            let keep = d.flags & FAULT_CORRUPT != 0;
            if corrupt_payload(&mut copy[NET_HDR_LEN..], keep) {
                add(
                    if keep {
                        &self.stats.peer.fault_corrupted
                    } else {
                        &self.stats.peer.fault_bad_csum
                    },
                    1,
                );
            }
            self.route_to(rx, &mut copy, d.q, d.hit.is_some(), drop);
            self.scratch = copy;
            return;
        }
        self.route_to(rx, pkt, d.q, d.hit.is_some(), drop);
    }

    /// Delivers (or hands over) a steered frame to rx queue `q`.
    #[inline]
    fn route_to(
        &mut self,
        rx: &mut RxBatch<'_>,
        pkt: &mut [u8],
        q: usize,
        filter: bool,
        drop: bool,
    ) {
        if q == self.id {
            self.deliver_local(rx, pkt, Some(filter), drop);
            return;
        }
        let Some(ib) = self.lanes.inbox.get(q) else {
            add(&self.stats.queues[self.id].rx_drops_disabled, 1);
            return;
        };
        if ib.starved.load(Ordering::Relaxed) {
            // That queue is out of buffers: its worker would drop the frame.
            // (It asked the driver for a kick when it ran out, clears the
            // flag when it sees new buffers, and then wakes the workers
            // that paused on it.)
            add(self.starved_drops(q), 1);
            self.pause_on(q);
            return;
        }
        if self.out.len() <= q {
            self.out.resize_with(q + 1, || None);
        }
        let batch =
            self.out[q].get_or_insert_with(|| ib.pool.pop().unwrap_or_else(FrameBatch::new));
        batch.push(pkt, filter, drop);
        if batch.is_full() {
            self.send(q);
        }
    }

    /// Hands the frames waiting for worker `q` to its inbox (or counts
    /// them as dropped when the inbox is full).
    fn send(&mut self, q: usize) {
        let Some(batch) = self.out.get_mut(q).and_then(Option::take) else {
            return;
        };
        if batch.is_empty() {
            self.out[q] = Some(batch);
            return;
        }
        let ib = &self.lanes.inbox[q];
        if ib.starved.load(Ordering::Relaxed) {
            let mut batch = batch;
            add(self.starved_drops(q), batch.len() as u64);
            batch.clear();
            self.out[q] = Some(batch);
            self.pause_on(q);
            return;
        }
        match ib.frames.push(batch) {
            Err(mut batch) => {
                add(&self.stats.queues[q].rx_drops_ring_full, batch.len() as u64);
                batch.clear();
                self.out[q] = Some(batch);
                self.pause_on(q);
            }
            // Enough in flight to keep that worker busy: pause this
            // worker's unlimited generator until it has taken them.
            Ok(()) if ib.frames.len() >= INFLIGHT_BATCHES => self.pause_on(q),
            Ok(()) => {}
        }
        self.kick |= 1 << q;
    }

    /// The counter of frames dropped because queue `q` was out of buffers
    /// (or, if it was disabled since, because it is disabled).
    fn starved_drops(&self, q: usize) -> &SharedCounter {
        let st = &self.stats.queues[q];
        if self.steer.mask() & (1 << q) == 0 {
            &st.rx_drops_disabled
        } else {
            &st.rx_drops_no_buffers
        }
    }

    /// Frames for worker `q` cannot go on now (out of buffers, or enough
    /// of them in flight): an unlimited generator stops for this batch,
    /// and `q` wakes this worker when it can take frames again.
    fn pause_on(&mut self, q: usize) {
        self.flags.nobufs_remote = true;
        let w = &self.lanes.inbox[q].waiters;
        let bit = 1u32 << self.id;
        if w.load(Ordering::Relaxed) & bit == 0 {
            w.fetch_or(bit, Ordering::AcqRel);
        }
    }

    /// Sends every waiting hand-off batch and wakes their workers.
    pub fn flush_kicks(&mut self) {
        for q in 0..self.out.len() {
            if self.out[q].as_ref().is_some_and(|b| !b.is_empty()) {
                self.send(q);
            }
        }
        let mut k = std::mem::take(&mut self.kick);
        while k != 0 {
            let q = k.trailing_zeros() as usize;
            k &= k - 1;
            self.lanes.inbox[q].wake();
        }
    }

    /// Delivers what other threads handed to this worker: frames other
    /// workers steered here, and management replies (`own`: the replies
    /// of the frames this worker just handled itself). Then wakes the
    /// workers that paused on this inbox if it can take frames again.
    pub fn drain_inbox(&mut self, rx: &mut RxBatch<'_>, own: &mut Vec<Reply>) {
        let lanes = &*self.lanes;
        let ib = &lanes.inbox[self.id];
        let local = Local {
            q: self.owner.writer(),
            starved: &ib.starved,
            mrg: self.mrg,
            id: self.id,
        };
        // Every frame a worker steered before it applied `floor` events
        // was pushed before it said so: this drain takes all of them.
        let floor = lanes.min_applied();
        while let Some(mut fb) = ib.frames.pop() {
            let mut off = 0;
            while let Some((pkt, filter, drop)) = fb.next_mut(&mut off) {
                local.deliver(&mut self.flags, rx, pkt, Some(filter), drop);
            }
            fb.clear();
            let _ = ib.pool.push(fb);
        }
        lanes.drained_by(self.id, floor);
        self.drain_replies(rx, own);
        let ib = &self.lanes.inbox[self.id];
        // Workers that paused on this inbox (full, or this queue out of
        // buffers) can go on once it is drained and the queue has buffers.
        if ib.waiters.load(Ordering::Relaxed) != 0 && !ib.starved.load(Ordering::Relaxed) {
            self.kick |= ib.waiters.swap(0, Ordering::AcqRel);
        }
    }

    /// Delivers management replies in order; one that waits for the
    /// replicas holds back those behind it.
    fn drain_replies(&mut self, rx: &mut RxBatch<'_>, own: &mut Vec<Reply>) {
        let lanes = &*self.lanes;
        let ib = &lanes.inbox[self.id];
        while let Some(r) = ib.replies.pop() {
            self.backlog.push_back(r);
        }
        self.backlog.extend(own.drain(..));
        let local = Local {
            q: self.owner.writer(),
            starved: &ib.starved,
            mrg: self.mrg,
            id: self.id,
        };
        while let Some(r) = self.backlog.front_mut() {
            if !lanes.may_send(self.id, r.needs) {
                break;
            }
            let ready = rx.ready();
            let mut pkt = std::mem::take(&mut r.pkt);
            if ready && local.deliver(&mut self.flags, rx, &mut pkt, None, false) {
                self.backlog.pop_front();
                continue;
            }
            if !ready || self.backlog.len() > REPLY_BACKLOG {
                self.backlog.pop_front();
                add(&self.stats.replies_dropped_no_buffers, 1);
                continue;
            }
            if let Some(r) = self.backlog.front_mut() {
                r.pkt = pkt;
            }
            break;
        }
    }

    /// Whether this worker's rx queue is starved and the driver has added
    /// buffers since: then it is not starved any more.
    pub fn recheck_starved(&self, avail_moved: impl FnOnce() -> bool) {
        let st = &self.lanes.inbox[self.id].starved;
        if st.load(Ordering::Relaxed) && avail_moved() {
            st.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pending wake-ups of worker `w` (reads and clears its eventfd).
    fn woken(l: &Lanes, w: usize) -> bool {
        l.inbox[w].kick.read().is_ok_and(|n| n > 0)
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
