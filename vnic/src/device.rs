//! The vhost-user backend: one worker thread per queue pair.
//!
//! Worker `t` owns rx vring `2t` and tx vring `2t+1` (`queues_per_thread`
//! = `0b11 << 2t`), a replica of the filter table ([`arfs::FlowIndex`]) fed
//! by table events through its lock-free inbox, an RSS copy, its share of
//! the generator's flows and its tap queue. Frames steered to another
//! pair's rx queue go through that pair's bounded inbox ring and eventfd.
//! Nothing on the packet path takes a lock shared by the pairs (each
//! worker's own state mutex is only ever taken by its own thread).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arfs::proto::ETHERTYPE_MGMT;
use arfs::{FlowIndex, Rss, TableEvent, L3};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringState, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::timerfd::TimerFd;

use crate::config::PeerKind;
use crate::gen::{local_sets, respond, LocalSet, Response, MAX_FRAME};
use crate::rxbuf::{
    deliver, gather_tx, needs_notification, RxOutcome, RxRing, TxChain, NET_HDR_LEN,
};
use crate::shared::{Conn, FrameBatch, Mem, Shared, Vring};
use crate::stats::{add, add_owned};

pub const VIRTIO_NET_F_MRG_RXBUF: u64 = 15;
pub const VIRTIO_NET_F_MQ: u64 = 22;
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 = 28;
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 29;
pub const VIRTIO_F_VERSION_1: u64 = 32;

/// Virtio features the device offers.
pub const DEVICE_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_NET_F_MQ)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC);

/// Most tx chains handled per event before yielding to other events.
const TX_BUDGET: usize = 1024;
/// Most frames generated per event in unlimited mode.
const GEN_BUDGET: usize = 1024;
/// Most frames read from the tap per event.
const TAP_BUDGET: usize = 256;
/// Hand-off batches queued at another worker's inbox beyond which an
/// unlimited generator pauses until that worker has taken them.
const INFLIGHT_BATCHES: usize = 16;
/// Management replies kept while the rx queue has no buffer.
const REPLY_BACKLOG: usize = 256;

const EV_RX: u16 = 0;
const EV_TX: u16 = 1;

/// Custom event ids (must be > num_queues).
pub fn ev_inbox(nq: usize) -> u16 {
    nq as u16 + 1
}
pub fn ev_timer(nq: usize) -> u16 {
    nq as u16 + 2
}
pub fn ev_tap(nq: usize) -> u16 {
    nq as u16 + 3
}

/// The backend of one connection.
pub struct VnicBackend {
    sh: Arc<Shared>,
    pub conn: Arc<Conn>,
    workers: Vec<Mutex<Worker>>,
}

impl VnicBackend {
    pub fn new(sh: &Arc<Shared>, conn: &Arc<Conn>, mem: &Mem) -> io::Result<Self> {
        let mut workers = Vec::new();
        for t in 0..sh.pairs() {
            workers.push(Mutex::new(Worker::new(
                t,
                sh.clone(),
                conn.clone(),
                mem.clone(),
            )?));
        }
        Ok(Self {
            sh: sh.clone(),
            conn: conn.clone(),
            workers,
        })
    }

    /// Registers the workers' own fds (inbox eventfd, timer, tap) with
    /// their epoll loops.
    pub fn register(
        &self,
        handlers: &[Arc<VringEpollHandler<Arc<VnicBackend>>>],
    ) -> io::Result<()> {
        let nq = self.num_queues();
        for (t, h) in handlers.iter().enumerate() {
            let w = self.workers[t]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            h.register_listener(
                self.conn.inbox[t].kick.as_raw_fd(),
                EventSet::IN,
                u64::from(ev_inbox(nq)),
            )?;
            h.register_listener(w.timer.as_raw_fd(), EventSet::IN, u64::from(ev_timer(nq)))?;
            if let Some(tap) = self.sh.taps.get(t) {
                h.register_listener(tap.as_raw_fd(), EventSet::IN, u64::from(ev_tap(nq)))?;
            }
            drop(w);
            // Pick up the generator's flow sets at once.
            self.conn.inbox[t].wake();
        }
        Ok(())
    }
}

impl VhostUserBackend for VnicBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        2 * self.sh.pairs()
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.sh.cfg.max_queue_size)
    }

    fn features(&self) -> u64 {
        DEVICE_FEATURES | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        self.conn.acked_features.store(features, Ordering::Relaxed);
        log::debug!("acked features {features:#x}");
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.conn.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, _mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        // The daemon and the workers share one GuestMemoryAtomic: nothing to do.
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.sh.pairs()).map(|i| 0b11u64 << (2 * i)).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // The frontend stops the device (guest reset, reboot, driver
        // unbind) by stopping its rings; rx 0 is always among them. Like a
        // hardware reset this empties the table and moves the generation.
        if queue_index == 0 {
            self.sh.lock_mgmt().reset(&self.sh, None, "reset");
        }
        self.conn
            .enabled_mask
            .fetch_and(!(1u32 << (queue_index / 2)), Ordering::Relaxed);
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        let Some(w) = self.workers.get(thread_id) else {
            return Ok(());
        };
        let mut w = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        w.handle(device_event, vrings);
        // Never return an error: it would kill this worker for good.
        Ok(())
    }
}

/// This worker's rx queue during one batch of deliveries (taken with the
/// vring's lock held for the whole batch): the fast ring view when the
/// rings resolve to host memory, the per-frame virtio-queue path otherwise.
struct RxBatch<'m> {
    ring: Option<RxRing<'m>>,
    /// The queue is enabled and started (cannot change while the lock is held).
    ready: bool,
    /// Used index when the batch started: the notification window.
    start_used: u16,
}

impl<'m> RxBatch<'m> {
    fn open(rx: &VringState<Mem>, mem: &'m GuestMemoryMmap) -> Self {
        let ready = Ctx::rx_ready(rx);
        let q = rx.get_queue();
        Self {
            ring: if ready { RxRing::open(q, mem) } else { None },
            ready,
            start_used: q.next_used(),
        }
    }

    /// Publishes what the batch added and hands the ring positions back
    /// to the queue.
    fn close(&mut self, rx: &mut VringState<Mem>) {
        if let Some(r) = self.ring.take() {
            r.finish(rx.get_queue_mut());
        }
    }
}

/// Steering and delivery state of one worker (split from the buffers so
/// both can be borrowed at once).
struct Ctx {
    id: usize,
    sh: Arc<Shared>,
    conn: Arc<Conn>,
    index: FlowIndex<u16>,
    rss: Rss,
    mask: u32,
    /// Other workers to wake at the end of the batch.
    kick: u32,
    /// Frames waiting to be handed to each other worker (sent when full
    /// and at the end of the batch).
    out: Vec<Option<FrameBatch>>,
    mrg: bool,
    added: bool,
    nobufs: bool,
    /// Another worker's inbox ring was full during this batch.
    nobufs_remote: bool,
}

impl Ctx {
    fn rx_ready(rx: &VringState<Mem>) -> bool {
        rx.is_enabled() && rx.get_queue().ready()
    }

    /// Delivers `pkt` (header space + frame) into this worker's rx queue.
    /// `filter`: Some(true/false) for steered frames (counted as filter /
    /// RSS), None for management replies.
    fn deliver_local(
        &mut self,
        rx: &mut VringState<Mem>,
        b: &mut RxBatch<'_>,
        mem: &GuestMemoryMmap,
        pkt: &mut [u8],
        filter: Option<bool>,
    ) -> bool {
        let q = &self.sh.qstats[self.id];
        if !b.ready {
            add(&q.rx_drops_disabled, 1);
            return false;
        }
        let mut bad = 0;
        let out = match &mut b.ring {
            Some(r) => r.deliver(pkt, self.mrg, &mut bad),
            None => deliver(rx.get_queue_mut(), mem, pkt, self.mrg, &mut bad),
        };
        if bad > 0 {
            add_owned(&q.rx_bad_chains, bad);
            self.added = true;
            log::debug!("pair {}: {bad} unusable rx chain(s) consumed", self.id);
        }
        match out {
            RxOutcome::Delivered { .. } => {
                self.added = true;
                add_owned(&q.rx_packets, 1);
                add_owned(&q.rx_bytes, (pkt.len() - NET_HDR_LEN) as u64);
                match filter {
                    Some(true) => add_owned(&q.rx_filter, 1),
                    Some(false) => add_owned(&q.rx_rss, 1),
                    None => {}
                }
                true
            }
            RxOutcome::NoBuffers => {
                self.nobufs = true;
                let st = &self.conn.inbox[self.id].starved;
                if !st.load(Ordering::Relaxed) {
                    st.store(true, Ordering::Relaxed);
                }
                if filter.is_some() {
                    add_owned(&q.rx_drops_no_buffers, 1);
                }
                false
            }
            RxOutcome::TooBig => {
                add_owned(&q.rx_drops_too_big, 1);
                false
            }
        }
    }

    /// Picks the rx queue of a frame from the peer: a filter hit gives its
    /// queue, otherwise RSS. `None`: drop (management EtherType, spoofed).
    fn steer(&mut self, frame: &[u8]) -> Option<(usize, bool)> {
        let Ok(p) = arfs::parse_frame(frame) else {
            if frame.len() >= 14 && u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE_MGMT {
                self.spoofed(frame);
                return None;
            }
            add(&self.sh.peer_stats.unparsable, 1);
            return Some((0, false));
        };
        if p.ethertype == ETHERTYPE_MGMT {
            self.spoofed(frame);
            return None;
        }
        if let L3::Flow(k) = &p.l3 {
            if let Some((id, q)) = self.index.lookup(k) {
                if let Some(h) = self.conn.hits[self.id].get(usize::from(id)) {
                    // Single writer: a plain load/store is enough.
                    h.store(h.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }
                return Some((usize::from(q), true));
            }
            return Some((usize::from(self.rss.queue_for_key(k)), false));
        }
        Some((usize::from(self.rss.queue_for(&p)), false))
    }

    /// A frame with the management EtherType arrived from the peer: dropped,
    /// counted and traced (the trace drops, and counts, what it cannot take).
    fn spoofed(&self, frame: &[u8]) {
        add(&self.sh.peer_stats.spoofed_mgmt_dropped, 1);
        if self.sh.tracer.enabled() {
            let h = arfs::proto::peek_header(frame);
            self.sh.tracer.emit(arfs::TraceRecord::mgmt_drop(
                self.sh.now_ns(),
                self.sh.generation(),
                arfs::proto::Direction::ToDriver,
                h.map(|h| h.seq),
                h.map(|h| h.msg_type),
                arfs::DropCause::Spoofed,
            ));
        }
    }

    /// Steers and delivers (or forwards) a frame from the peer.
    fn route(
        &mut self,
        rx: &mut VringState<Mem>,
        b: &mut RxBatch<'_>,
        mem: &GuestMemoryMmap,
        pkt: &mut [u8],
    ) {
        let Some((q, filter)) = self.steer(&pkt[NET_HDR_LEN..]) else {
            return;
        };
        if q == self.id {
            self.deliver_local(rx, b, mem, pkt, Some(filter));
            return;
        }
        let Some(ib) = self.conn.inbox.get(q) else {
            add(&self.sh.qstats[self.id].rx_drops_disabled, 1);
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
        let b = self.out[q].get_or_insert_with(|| ib.pool.pop().unwrap_or_else(FrameBatch::new));
        b.push(pkt, filter);
        if b.is_full() {
            self.send(q);
        }
    }

    /// Hands the frames waiting for worker `q` to its inbox (or counts
    /// them as dropped when the inbox is full).
    fn send(&mut self, q: usize) {
        let Some(b) = self.out.get_mut(q).and_then(Option::take) else {
            return;
        };
        if b.is_empty() {
            self.out[q] = Some(b);
            return;
        }
        let ib = &self.conn.inbox[q];
        if ib.starved.load(Ordering::Relaxed) {
            let mut b = b;
            add(self.starved_drops(q), b.len() as u64);
            b.clear();
            self.out[q] = Some(b);
            self.pause_on(q);
            return;
        }
        match ib.frames.push(b) {
            Err(mut b) => {
                add(&self.sh.qstats[q].rx_drops_ring_full, b.len() as u64);
                b.clear();
                self.out[q] = Some(b);
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
    fn starved_drops(&self, q: usize) -> &std::sync::atomic::AtomicU64 {
        let st = &self.sh.qstats[q];
        if self.mask & (1 << q) == 0 {
            &st.rx_drops_disabled
        } else {
            &st.rx_drops_no_buffers
        }
    }

    /// Frames for worker `q` cannot go on now (out of buffers, or enough
    /// of them in flight): an unlimited generator stops for this batch,
    /// and `q` wakes this worker when it can take frames again.
    fn pause_on(&mut self, q: usize) {
        self.nobufs_remote = true;
        let w = &self.conn.inbox[q].waiters;
        let bit = 1u32 << self.id;
        if w.load(Ordering::Relaxed) & bit == 0 {
            w.fetch_or(bit, Ordering::AcqRel);
        }
    }

    fn flush_kicks(&mut self) {
        for q in 0..self.out.len() {
            if self.out[q].as_ref().is_some_and(|b| !b.is_empty()) {
                self.send(q);
            }
        }
        let mut k = std::mem::take(&mut self.kick);
        while k != 0 {
            let q = k.trailing_zeros() as usize;
            k &= k - 1;
            self.conn.inbox[q].wake();
        }
    }

    /// Applies pending table events and picks up enabled-queue changes.
    fn sync(&mut self) {
        let ib = &self.conn.inbox[self.id];
        while let Some(e) = ib.updates.pop() {
            if let TableEvent::Added { .. }
            | TableEvent::Replaced { .. }
            | TableEvent::Deleted { .. }
            | TableEvent::Evicted { .. } = &*e
            {
                self.index.apply(&e);
            }
        }
        let mask = self.conn.enabled_mask.load(Ordering::Relaxed);
        if mask != self.mask {
            self.mask = mask;
            self.rss.set_enabled(mask.trailing_ones().max(1) as u16);
        }
        self.mrg =
            self.conn.acked_features.load(Ordering::Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
    }
}

pub struct Worker {
    ctx: Ctx,
    mem: Mem,
    timer: TimerFd,
    timer_armed: bool,
    registered: bool,
    txbuf: Vec<u8>,
    genbuf: Vec<u8>,
    peerbuf: Vec<u8>,
    reply: Vec<u8>,
    tapbuf: Vec<u8>,
    backlog: VecDeque<Vec<u8>>,
    tx_pending: bool,
    /// Avail index at the last retry after rx notifications were re-enabled.
    rx_retry_avail: Option<std::num::Wrapping<u16>>,
    gen_version: u64,
    gen_mac: u64,
    sets: Vec<LocalSet>,
    unlimited: bool,
    last_tick: Instant,
}

impl Worker {
    fn new(id: usize, sh: Arc<Shared>, conn: Arc<Conn>, mem: Mem) -> io::Result<Self> {
        let capacity = sh.cfg.table_capacity as usize;
        let timer = TimerFd::new()?;
        crate::shared::set_nonblocking(timer.as_raw_fd())?;
        Ok(Self {
            ctx: Ctx {
                id,
                index: FlowIndex::new(capacity),
                rss: Rss::new(1),
                mask: 0,
                kick: 0,
                out: Vec::new(),
                mrg: true,
                added: false,
                nobufs: false,
                nobufs_remote: false,
                sh,
                conn,
            },
            mem,
            timer,
            timer_armed: false,
            registered: false,
            txbuf: vec![0; 4096],
            genbuf: vec![0; NET_HDR_LEN + MAX_FRAME],
            peerbuf: Vec::with_capacity(NET_HDR_LEN + MAX_FRAME),
            reply: Vec::with_capacity(MAX_FRAME),
            tapbuf: vec![0; NET_HDR_LEN + 65_536],
            backlog: VecDeque::new(),
            tx_pending: false,
            rx_retry_avail: None,
            gen_version: u64::MAX,
            gen_mac: u64::MAX,
            sets: Vec::new(),
            unlimited: false,
            last_tick: Instant::now(),
        })
    }

    fn handle(&mut self, ev: u16, vrings: &[Vring]) {
        let nq = 2 * self.ctx.sh.pairs();
        if !self.registered {
            self.registered = true;
            let mut vr = self
                .ctx
                .conn
                .vrings
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            vr[self.ctx.id] = Some(vrings.to_vec());
            drop(vr);
            *self
                .ctx
                .conn
                .mem
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(self.mem.clone());
        }
        if vrings.len() < 2 {
            return;
        }
        {
            // Publish this pair's enabled bit right away (the management
            // thread also polls it, for disables which raise no event).
            let st = vrings[0].get_ref();
            let bit = 1u32 << self.ctx.id;
            if st.is_enabled()
                && st.get_queue().ready()
                && self.ctx.conn.frontend_allows(self.ctx.id)
            {
                self.ctx.conn.enabled_mask.fetch_or(bit, Ordering::Relaxed);
            }
        }
        self.ctx.sync();
        log::trace!("pair {}: event {ev}", self.ctx.id);
        match ev {
            EV_RX => {
                self.rx_work(vrings, true);
            }
            EV_TX => self.process_tx(vrings),
            e if e == ev_inbox(nq) => {
                let _ = self.ctx.conn.inbox[self.ctx.id].kick.read();
                let recheck = self.ctx.conn.inbox[self.ctx.id]
                    .tx_recheck
                    .swap(false, Ordering::AcqRel);
                if self.tx_pending || recheck {
                    self.tx_pending = false;
                    self.process_tx(vrings);
                }
                self.rx_work(vrings, true);
            }
            e if e == ev_timer(nq) => {
                let _ = self.timer.wait();
                self.rx_work(vrings, true);
            }
            e if e == ev_tap(nq) => self.read_tap(vrings),
            _ => {}
        }
    }

    fn check_gen(&mut self) {
        let sh = &self.ctx.sh;
        if sh.cfg.peer != PeerKind::Gen {
            return;
        }
        let v = sh.gen.version.load(Ordering::Acquire);
        let mac = sh.gen.guest_mac.load(Ordering::Relaxed);
        if v == self.gen_version && mac == self.gen_mac {
            return;
        }
        self.gen_version = v;
        self.gen_mac = mac;
        let dst = if mac == 0 {
            [0xff; 6]
        } else {
            mac_from_u64(mac)
        };
        self.sets = local_sets(&sh.gen.snapshot(), self.ctx.id, dst, sh.cfg.gen_mac);
        self.unlimited = self.sets.iter().any(|s| s.rate == 0.0);
        log::debug!(
            "pair {}: generator version {v}: {} local flow set(s)",
            self.ctx.id,
            self.sets.len()
        );
        let want = !self.sets.is_empty();
        if want != self.timer_armed {
            let r = if want {
                self.timer
                    .reset(Duration::from_millis(1), Some(Duration::from_millis(1)))
            } else {
                self.timer.clear()
            };
            if let Err(e) = r {
                log::warn!("pair {}: generator timer: {e}", self.ctx.id);
            }
            self.timer_armed = want;
        }
        self.last_tick = Instant::now();
    }

    /// Everything that ends in this worker's rx queue: management replies,
    /// frames from other workers, generated frames.
    fn rx_work(&mut self, vrings: &[Vring], gen: bool) {
        self.check_gen();
        let mem = self.mem.memory();
        let mut rx = vrings[0].get_mut();
        let conn = self.ctx.conn.clone();
        let ib = &conn.inbox[self.ctx.id];
        if ib.starved.load(Ordering::Relaxed) && Ctx::rx_ready(&rx) {
            // Out of buffers at the last look: has the driver added some?
            let q = rx.get_queue();
            if q.avail_idx(&*mem, Ordering::Acquire).ok()
                != Some(std::num::Wrapping(q.next_avail()))
            {
                ib.starved.store(false, Ordering::Relaxed);
            }
        }
        let mut b = RxBatch::open(&rx, &mem);
        self.ctx.added = false;
        self.ctx.nobufs = false;
        self.drain_replies(&mut rx, &mut b, &mem);
        while let Some(mut fb) = ib.frames.pop() {
            let mut off = 0;
            while let Some((pkt, filter)) = fb.next_mut(&mut off) {
                self.ctx
                    .deliver_local(&mut rx, &mut b, &mem, pkt, Some(filter));
            }
            fb.clear();
            let _ = ib.pool.push(fb);
        }
        // Workers that paused on this inbox (full, or this queue out of
        // buffers) can go on once it is drained and the queue has buffers.
        if ib.waiters.load(Ordering::Relaxed) != 0 && !ib.starved.load(Ordering::Relaxed) {
            self.ctx.kick |= ib.waiters.swap(0, Ordering::AcqRel);
        }
        if gen && !self.sets.is_empty() {
            self.run_gen(&mut rx, &mut b, &mem);
        }
        self.finish_rx(&mut rx, b, &mem);
    }

    /// Ends a batch: publishes it, wakes the workers frames were handed
    /// to, interrupts the driver if it asked for it, and asks for a kick
    /// when the queue ran out of buffers.
    fn finish_rx(&mut self, rx: &mut VringState<Mem>, mut b: RxBatch<'_>, mem: &GuestMemoryMmap) {
        b.close(rx);
        self.ctx.flush_kicks();
        if self.ctx.added {
            let r = needs_notification(rx.get_queue(), mem, b.start_used);
            log::trace!(
                "pair {}: rx used {} needs_notification {r:?} call {}",
                self.ctx.id,
                rx.get_queue().next_used(),
                rx.get_call().is_some()
            );
            if r {
                if let Err(e) = rx.signal_used_queue() {
                    log::debug!("pair {}: rx signal: {e}", self.ctx.id);
                }
            }
        }
        if self.ctx.nobufs && Ctx::rx_ready(rx) {
            // Ask for a kick when the guest adds buffers. With EVENT_IDX
            // this publishes avail_event; buffers the guest added before
            // it saw the new value raise no kick: come back for them.
            // (Once per avail index: a ring holding too few buffers for
            // the frame also reads as "more arrived", and must not spin.)
            match rx.enable_notification() {
                Ok(false) => {}
                Ok(true) => {
                    let avail = rx.get_queue().avail_idx(mem, Ordering::Acquire).ok();
                    if avail.is_some() && avail != self.rx_retry_avail {
                        self.rx_retry_avail = avail;
                        self.ctx.conn.inbox[self.ctx.id].wake();
                    }
                }
                Err(e) => log::debug!("pair {}: rx enable_notification: {e}", self.ctx.id),
            }
        }
    }

    fn drain_replies(
        &mut self,
        rx: &mut VringState<Mem>,
        b: &mut RxBatch<'_>,
        mem: &GuestMemoryMmap,
    ) {
        let ib = &self.ctx.conn.inbox[self.ctx.id];
        while let Some(f) = ib.replies.pop() {
            self.backlog.push_back(f);
        }
        while let Some(f) = self.backlog.front() {
            self.peerbuf.clear();
            self.peerbuf.resize(NET_HDR_LEN, 0);
            self.peerbuf.extend_from_slice(f);
            let ready = b.ready;
            if ready && self.ctx.deliver_local(rx, b, mem, &mut self.peerbuf, None) {
                self.backlog.pop_front();
                continue;
            }
            if !ready || self.backlog.len() > REPLY_BACKLOG {
                self.backlog.pop_front();
                add(&self.ctx.sh.replies_dropped_no_buffers, 1);
                continue;
            }
            break;
        }
    }

    fn run_gen(&mut self, rx: &mut VringState<Mem>, b: &mut RxBatch<'_>, mem: &GuestMemoryMmap) {
        let now = Instant::now();
        let dt = now.duration_since(self.last_tick).as_secs_f64();
        self.last_tick = now;
        let mut total = 0u64;
        let mut changed = false;
        self.ctx.nobufs_remote = false;
        for s in &mut self.sets {
            let mut n = if s.rate > 0.0 {
                s.credit = (s.credit + s.rate * dt).min((s.rate * 0.02).max(32.0));
                s.credit.floor() as u64
            } else {
                GEN_BUDGET as u64
            };
            if let Some(r) = s.remaining {
                n = n.min(r);
            }
            if s.set.stopped.load(Ordering::Relaxed) {
                n = 0;
            }
            let size = s.set.size;
            let unlimited = s.rate == 0.0;
            let want = n;
            n = 0;
            while n < want {
                let i = s.next;
                s.next = if i + 1 == s.headers.len() { 0 } else { i + 1 };
                self.genbuf[NET_HDR_LEN..NET_HDR_LEN + s.hdr_len]
                    .copy_from_slice(&s.headers[i][..s.hdr_len]);
                self.ctx
                    .route(rx, b, mem, &mut self.genbuf[..NET_HDR_LEN + size]);
                n += 1;
                // Unlimited sets stop at the first full destination.
                if unlimited && (self.ctx.nobufs || self.ctx.nobufs_remote) {
                    break;
                }
            }
            if s.rate > 0.0 {
                s.credit -= n as f64;
            }
            if let Some(r) = &mut s.remaining {
                *r -= n;
                if *r == 0 {
                    changed = true;
                }
            }
            s.set.sent[self.ctx.id].fetch_add(n, Ordering::Relaxed);
            total += n;
        }
        add(&self.ctx.sh.peer_stats.gen_sent, total);
        if changed {
            self.sets.retain(|s| s.remaining != Some(0));
            self.unlimited = self.sets.iter().any(|s| s.rate == 0.0);
        }
        // Unlimited mode: come back at once unless a destination queue is
        // out of room (then the guest's rx kick or the 1 ms timer resumes):
        // as fast as the rx rings take the frames, not faster.
        if self.unlimited && !self.ctx.nobufs && !self.ctx.nobufs_remote {
            self.ctx.conn.inbox[self.ctx.id].wake();
        }
    }

    fn process_tx(&mut self, vrings: &[Vring]) {
        let mem = self.mem.memory();
        let event_idx = self.ctx.conn.event_idx.load(Ordering::Relaxed);
        let mut rx = vrings[0].get_mut();
        let mut tx = vrings[1].get_mut();
        if !(tx.is_enabled() && tx.get_queue().ready()) {
            return;
        }
        let mut b = RxBatch::open(&rx, &mem);
        self.ctx.added = false;
        self.ctx.nobufs = false;
        let mut done = 0usize;
        let mut mgmt_seen = false;
        let mut used = false;
        'outer: loop {
            if event_idx {
                if let Err(e) = tx.disable_notification() {
                    log::debug!("pair {}: tx disable_notification: {e}", self.ctx.id);
                }
            }
            loop {
                if done == TX_BUDGET {
                    self.tx_pending = true;
                    self.ctx.conn.inbox[self.ctx.id].wake();
                    break 'outer;
                }
                let Some(r) = gather_tx(tx.get_queue_mut(), &*mem, &mut self.txbuf) else {
                    break;
                };
                done += 1;
                used = true;
                let q = &self.ctx.sh.qstats[self.ctx.id];
                match r {
                    TxChain::Bad => {
                        add_owned(&q.tx_bad_chains, 1);
                        log::debug!("pair {}: unusable tx chain consumed", self.ctx.id);
                    }
                    TxChain::Ok { len } if len < NET_HDR_LEN + 14 => add(&q.tx_drops, 1),
                    TxChain::Ok { len } => {
                        add_owned(&q.tx_packets, 1);
                        add_owned(&q.tx_bytes, (len - NET_HDR_LEN) as u64);
                        if self.guest_frame(&mut rx, &mut b, &mem, len) {
                            mgmt_seen = true;
                        }
                    }
                }
            }
            if !event_idx {
                break;
            }
            match tx.enable_notification() {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    log::debug!("pair {}: tx enable_notification: {e}", self.ctx.id);
                    break;
                }
            }
        }
        log::trace!(
            "pair {}: tx {done} chain(s), next_avail {}",
            self.ctx.id,
            tx.get_queue().next_avail()
        );
        if used {
            match tx.needs_notification() {
                Ok(true) => {
                    let _ = tx.signal_used_queue();
                }
                Ok(false) => {}
                Err(e) => log::debug!("pair {}: tx needs_notification: {e}", self.ctx.id),
            }
        }
        drop(tx);
        if mgmt_seen {
            self.drain_replies(&mut rx, &mut b, &mem);
        }
        self.finish_rx(&mut rx, b, &mem);
    }

    /// A frame the guest sent (`txbuf[..len]`, header included). Returns
    /// true when it was a management frame.
    fn guest_frame(
        &mut self,
        rx: &mut VringState<Mem>,
        b: &mut RxBatch<'_>,
        mem: &GuestMemoryMmap,
        len: usize,
    ) -> bool {
        let frame = &self.txbuf[NET_HDR_LEN..len];
        let sh = &self.ctx.sh;
        if u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE_MGMT {
            sh.lock_mgmt().handle_frame(sh, self.ctx.id, frame);
            return true;
        }
        match &sh.cfg.peer {
            PeerKind::Gen => {
                let mut src = [0u8; 6];
                src.copy_from_slice(&frame[6..12]);
                if src[0] & 1 == 0 {
                    let m = mac_to_u64(src);
                    if sh.gen.guest_mac.swap(m, Ordering::Relaxed) != m {
                        sh.gen.bump();
                        for ib in &*self.ctx.conn.inbox {
                            ib.wake();
                        }
                    }
                }
                match respond(frame, sh.cfg.gen_ip, sh.cfg.gen_mac, &mut self.reply) {
                    Response::Sink => {
                        add(&sh.peer_stats.sink_packets, 1);
                        add(&sh.peer_stats.sink_bytes, frame.len() as u64);
                    }
                    r => {
                        add(
                            if r == Response::Arp {
                                &sh.peer_stats.arp_replies
                            } else {
                                &sh.peer_stats.icmp_echo_replies
                            },
                            1,
                        );
                        self.peerbuf.clear();
                        self.peerbuf.resize(NET_HDR_LEN, 0);
                        self.peerbuf.extend_from_slice(&self.reply);
                        self.ctx.route(rx, b, mem, &mut self.peerbuf);
                    }
                }
            }
            PeerKind::Tap(_) => {
                if let Some(mut tap) = sh.taps.get(self.ctx.id) {
                    // We offer no offloads: hand the tap a clean header.
                    self.txbuf[..NET_HDR_LEN].fill(0);
                    // A tap write takes a whole frame or fails: no partial writes.
                    match tap.write_all(&self.txbuf[..len]) {
                        Ok(()) => add(&sh.peer_stats.tap_tx, 1),
                        Err(e) => {
                            add(&sh.peer_stats.tap_tx_errors, 1);
                            add(&sh.qstats[self.ctx.id].tx_drops, 1);
                            log::debug!("pair {}: tap write: {e}", self.ctx.id);
                        }
                    }
                }
            }
        }
        false
    }

    fn read_tap(&mut self, vrings: &[Vring]) {
        let sh = self.ctx.sh.clone();
        let Some(mut tap) = sh.taps.get(self.ctx.id) else {
            return;
        };
        let mem = self.mem.memory();
        let mut rx = vrings[0].get_mut();
        let mut b = RxBatch::open(&rx, &mem);
        self.ctx.added = false;
        self.ctx.nobufs = false;
        for _ in 0..TAP_BUDGET {
            match tap.read(&mut self.tapbuf) {
                Ok(n) if n >= NET_HDR_LEN + 14 => {
                    add(&sh.peer_stats.tap_rx, 1);
                    self.ctx.route(&mut rx, &mut b, &mem, &mut self.tapbuf[..n]);
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("pair {}: tap read: {e}", self.ctx.id);
                    break;
                }
            }
        }
        self.finish_rx(&mut rx, b, &mem);
        if self.ctx.kick == 0 {
            return;
        }
        self.ctx.flush_kicks();
    }
}

pub fn mac_to_u64(m: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[2..].copy_from_slice(&m);
    u64::from_be_bytes(b)
}

pub fn mac_from_u64(v: u64) -> [u8; 6] {
    let b = v.to_be_bytes();
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[2..]);
    m
}
