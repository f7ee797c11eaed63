//! One worker per queue pair: event dispatch and the RX/TX batches.
//!
//! Worker `t` owns rx vring `2t` and tx vring `2t+1`, a [`Router`] (its
//! replica of the filter table, its RSS copy and the hand-off to the other
//! workers) and its end of the [`Peer`]. Every event is one batch: the rx
//! ring is opened once ([`RxBatch`]), everything that ends in it is
//! delivered, and one notification decision is made at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arfs::proto::ETHERTYPE_MGMT;
use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;

use crate::config::{PeerKind, PollCfg};
use crate::conn::Conn;
use crate::daemon::Shared;
use crate::handoff::{Router, RouterLinks, ToGuest};
use crate::lanes::Reply;
use crate::peer::gen::GenPeer;
use crate::peer::tap::TapPeer;
use crate::peer::{AnyPeer, Peer};
use crate::stats::add;
use crate::virtq::ring::{needs_notification, poll_avail};
use crate::virtq::rx::{RxBatch, RxCarry};
use crate::virtq::tx::{TxChain, TxRing};
use crate::virtq::{Mem, StopLatch, Vring, NET_HDR_LEN};

/// Most tx chains handled per event before yielding to other events.
const TX_BUDGET: usize = 1024;

/// Event ids of a worker's epoll (vring events are 0 = rx, 1 = tx; custom
/// ids must be above the number of queues).
pub(crate) const EV_RX: u16 = 0;
pub(crate) const EV_TX: u16 = 1;
/// The worker's inbox eventfd.
pub(crate) fn ev_inbox(nq: usize) -> u16 {
    nq as u16 + 1
}
/// The peer's descriptor (tap queue, generator timer).
pub(crate) fn ev_peer(nq: usize) -> u16 {
    nq as u16 + 2
}

pub(crate) struct Worker {
    router: Router,
    peer: AnyPeer,
    sh: Arc<Shared>,
    conn: Arc<Conn>,
    mem: Mem,
    registered: bool,
    txbuf: Vec<u8>,
    /// Management replies of the frames this worker handled itself.
    own: Vec<Reply>,
    tx_pending: bool,
    /// What the rx batches carry from one to the next: the driver's kicks
    /// on the rx ring (off while the device works) and the store choice.
    rx_carry: RxCarry,
    /// The rings the device stopped (a driver it cannot follow).
    rx_stop: StopLatch,
    tx_stop: StopLatch,
    /// How long to spin for tx chains, and for rx buffers, before sleeping
    /// (`--poll-us`).
    tx_poll: RingPoll,
    rx_poll: RingPoll,
}

impl Worker {
    pub(crate) fn new(
        id: usize,
        sh: &Arc<Shared>,
        conn: &Arc<Conn>,
        mem: &Mem,
    ) -> std::io::Result<Self> {
        let links = RouterLinks {
            lanes: conn.lanes.clone(),
            pairs: conn.pairs.clone(),
            stats: sh.stats.clone(),
            hits: conn.hits.clone(),
            tracer: sh.tracer.clone(),
            generation: sh.generation.clone(),
            faults: sh.faults.clone(),
        };
        let peer = match &sh.cfg.peer {
            PeerKind::Gen => AnyPeer::Gen(GenPeer::new(
                sh.gen.clone(),
                sh.stats.clone(),
                sh.cfg.gen_ip,
                sh.cfg.gen_ip6,
                sh.cfg.gen_mac,
            )?),
            PeerKind::Tap(_) => AnyPeer::Tap(TapPeer::new(sh.taps.clone(), id, sh.stats.clone())),
        };
        Ok(Self {
            router: Router::new(id, sh.cfg.table_capacity as usize, sh.cfg.steer_none, links),
            peer,
            sh: sh.clone(),
            conn: conn.clone(),
            mem: mem.clone(),
            registered: false,
            txbuf: vec![0; 4096],
            own: Vec::new(),
            tx_pending: false,
            rx_carry: RxCarry::new(sh.cfg.rx_stores),
            rx_stop: StopLatch::default(),
            tx_stop: StopLatch::default(),
            tx_poll: RingPoll::new(sh.cfg.poll),
            rx_poll: RingPoll::new(sh.cfg.poll),
        })
    }

    /// The descriptor of this worker's peer, for its epoll.
    pub(crate) fn peer_fd(&self) -> Option<std::os::fd::RawFd> {
        self.peer.fd()
    }

    pub(crate) fn handle(&mut self, ev: u16, vrings: &[Vring]) {
        let id = self.router.id;
        let nq = 2 * self.sh.pairs();
        if !self.registered {
            self.registered = true;
            self.conn.register_rings(id, vrings, &self.mem);
        }
        if vrings.len() < 2 {
            return;
        }
        {
            // Tell the enabled-pairs owner what this pair's ring looks like
            // (cheap when unchanged; the 50 ms poll also looks).
            let st = vrings[0].get_ref();
            self.conn
                .pairs
                .observe(id, st.get_queue().ready(), st.is_enabled());
        }
        self.router.sync(self.conn.mrg_rxbuf());
        log::trace!("pair {id}: event {ev}");
        match ev {
            EV_RX => self.rx_work(vrings, false),
            EV_TX => self.process_tx(vrings),
            e if e == ev_inbox(nq) => {
                let ib = self.router.inbox();
                let _ = ib.kick.read();
                let recheck = ib
                    .tx_recheck
                    .swap(false, std::sync::atomic::Ordering::AcqRel);
                if self.tx_pending || recheck {
                    self.tx_pending = false;
                    self.process_tx(vrings);
                }
                self.rx_work(vrings, false);
            }
            e if e == ev_peer(nq) => self.rx_work(vrings, true),
            _ => {}
        }
    }

    /// Everything that ends in this worker's rx queue: management replies,
    /// frames from other workers, frames from the peer.
    fn rx_work(&mut self, vrings: &[Vring], peer_event: bool) {
        let id = self.router.id;
        let mem = self.mem.memory();
        let mut rx = vrings[0].get_mut();
        let running = rx.is_enabled() && rx.get_queue().ready();
        let restarts = self.conn.ring_restarts(2 * id);
        let qs = &self.sh.stats.queues[id];
        if running {
            // A ring the frontend restarted since the device stopped it
            // runs again.
            self.rx_stop.holds(restarts, &qs.rx_stopped, id, "rx");
        }
        let rx_before = qs.rx_packets.get();
        let mut b = RxBatch::open(
            &mut rx,
            &mem,
            self.rx_stop.is_set(),
            &mut self.rx_carry,
            restarts,
        );
        b.time_stores(&mut self.rx_carry);
        match b.check_avail() {
            Err(why) => {
                self.rx_stop
                    .stop(restarts, why, &qs.rx_stops, &qs.rx_stopped, id, "rx");
                vrings[0].signal_err();
            }
            Ok(more) => {
                if more {
                    // Back at a ring that ran out of buffers: the gap.
                    self.rx_poll.woke_now();
                }
                // Out of buffers at the last look: has the driver added some?
                self.router.recheck_starved(|| more);
            }
        }
        self.router.begin();
        self.router.drain_inbox(&mut b, &mut self.own);
        let mut to_guest = ToGuest {
            router: &mut self.router,
            rx: &mut b,
        };
        self.peer.frames_for_guest(&mut to_guest, peer_event);
        self.router.release_stale(&mut b);
        self.finish(b, rx_before);
    }

    /// Ends a batch: hands over the frames for other workers and wakes
    /// them, publishes the rx ring and notifies the driver if it asked.
    /// `rx_before`: the queue's rx_packets when the batch opened (what it
    /// delivered counts in rx_plain when it copied plainly).
    fn finish(&mut self, b: RxBatch<'_>, rx_before: u64) {
        self.router.flush_kicks();
        // The batch's mode: set at open, changed only by b.finish.
        let plain = !self.rx_carry.streams();
        let r = &self.router;
        let end = b.finish(
            r.id,
            r.flags.added,
            r.flags.nobufs,
            &mut self.rx_carry,
            self.rx_poll.window(),
        );
        if end.again {
            r.inbox().wake();
        }
        if let Some(at) = end.slept_from {
            self.rx_poll.went_idle(at);
        }
        let w = r.stats();
        if let Some((took, found)) = end.spun {
            w.add(|q| &q.rx_spins, 1);
            w.add(|q| &q.rx_spin_ns, took.as_nanos() as u64);
            if found {
                w.add(|q| &q.rx_spins_found, 1);
            }
        }
        if plain {
            let n = w.queue().rx_packets.get().wrapping_sub(rx_before);
            if n > 0 {
                w.add(|q| &q.rx_plain, n);
            }
        }
        let switches = self.rx_carry.take_switches();
        if switches > 0 {
            w.add(|q| &q.rx_store_switches, switches);
        }
    }

    fn process_tx(&mut self, vrings: &[Vring]) {
        let id = self.router.id;
        let mem = self.mem.memory();
        let mut rx = vrings[0].get_mut();
        let mut tx = vrings[1].get_mut();
        if !(tx.is_enabled() && tx.get_queue().ready()) {
            return;
        }
        let q = &self.sh.stats.queues[id];
        let restarts = self.conn.ring_restarts(2 * id + 1);
        if self.tx_stop.holds(restarts, &q.tx_stopped, id, "tx") {
            return;
        }
        self.tx_poll.woke_now();
        let rx_restarts = self.conn.ring_restarts(2 * id);
        let rx_before = q.rx_packets.get();
        let mut b = RxBatch::open(
            &mut rx,
            &mem,
            self.rx_stop.is_set(),
            &mut self.rx_carry,
            rx_restarts,
        );
        self.router.begin();
        let mut done = 0usize;
        let mut mgmt_seen = false;
        let mut used = false;
        // Used index before the batch: the notification window of the
        // ring path (which leaves virtio-queue's num_added alone).
        let start_used = tx.get_queue().next_used();
        'outer: loop {
            // No kicks while the device is at work on the ring: with
            // EVENT_IDX through avail_event, without it through the used
            // ring's NO_NOTIFY flag (a driver that polls, like DPDK's
            // virtio PMD, otherwise kicks after every burst it adds).
            // Notifications through this batch's memory snapshot, never
            // the vring's current one: after a SET_MEM_TABLE in the middle
            // of the batch the two disagree on the avail index, and
            // enable_notification kept reporting entries the ring view
            // never found (the worker spun for ever holding the vring's
            // lock; ctl stats and SIGTERM waited on it: found by
            // vnic-fuzz-vhost, tests/vhost_fuzz.rs).
            if let Err(e) = tx.get_queue_mut().disable_notification(&*mem) {
                log::debug!("pair {id}: tx disable_notification: {e}");
            }
            let Some(mut ring) = TxRing::open(tx.get_queue(), &mem) else {
                break;
            };
            loop {
                if done == TX_BUDGET {
                    self.tx_pending = true;
                    self.router.inbox().wake();
                    ring.finish(tx.get_queue_mut());
                    break 'outer;
                }
                let r = match ring.next(&mut self.txbuf) {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(why) => {
                        // Nothing popped; no notification loop either (the
                        // avail index would read "more" for ever).
                        ring.finish(tx.get_queue_mut());
                        self.tx_stop
                            .stop(restarts, why, &q.tx_stops, &q.tx_stopped, id, "tx");
                        vrings[1].signal_err();
                        break 'outer;
                    }
                };
                done += 1;
                used = true;
                match r {
                    TxChain::Bad(why) => {
                        self.router.stats().count_bad_tx(why);
                        log::trace!("pair {id}: unusable tx chain consumed ({})", why.name());
                    }
                    TxChain::Ok { len } if len < NET_HDR_LEN + 14 => add(&q.tx_drops, 1),
                    TxChain::Ok { len } => {
                        let w = self.router.stats();
                        w.add(|q| &q.tx_packets, 1);
                        w.add(|q| &q.tx_bytes, (len - NET_HDR_LEN) as u64);
                        let pkt = &mut self.txbuf[..len];
                        let frame = &pkt[NET_HDR_LEN..];
                        if u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE_MGMT {
                            // Never reaches the peer.
                            self.sh.lock_mgmt().handle_frame(id, frame, &mut self.own);
                            mgmt_seen = true;
                        } else {
                            let mut to_guest = ToGuest {
                                router: &mut self.router,
                                rx: &mut b,
                            };
                            self.peer.guest_frame(pkt, &mut to_guest);
                        }
                    }
                }
            }
            // The queue's positions are current again before it decides
            // on notifications.
            ring.finish(tx.get_queue_mut());
            // --poll-us: wait for more chains with kicks still off; not
            // while the batch holds frames or management replies for the
            // guest (the spin would delay them).
            let window = if mgmt_seen || self.router.holds_output() {
                Duration::ZERO
            } else {
                self.tx_poll.window()
            };
            // The clock is read only when it is needed: for a spin, or
            // (below) when the worker goes to sleep without one.
            let mut dry = None;
            if !window.is_zero() {
                let start = *dry.insert(Instant::now());
                let q = tx.get_queue();
                let found = poll_avail(q, &*mem, q.next_avail(), window);
                let w = self.router.stats();
                w.add(|q| &q.tx_spins, 1);
                w.add(|q| &q.tx_spin_ns, start.elapsed().as_nanos() as u64);
                if found {
                    w.add(|q| &q.tx_spins_found, 1);
                    continue;
                }
            }
            match tx.get_queue_mut().enable_notification(&*mem) {
                Ok(true) => {}
                Ok(false) => {
                    self.tx_poll.went_idle(dry.unwrap_or_else(Instant::now));
                    break;
                }
                Err(e) => {
                    log::debug!("pair {id}: tx enable_notification: {e}");
                    break;
                }
            }
        }
        log::trace!(
            "pair {id}: tx {done} chain(s), next_avail {}",
            tx.get_queue().next_avail()
        );
        if used && needs_notification(tx.get_queue(), &*mem, start_used) {
            let _ = tx.signal_used_queue();
        }
        drop(tx);
        self.peer.tx_batch_end();
        if mgmt_seen {
            // Apply this worker's share of what the frames changed and
            // drain its inbox, so their replies wait only for the other
            // workers (see lanes::Lanes::may_send).
            self.router.sync(self.conn.mrg_rxbuf());
            self.router.drain_inbox(&mut b, &mut self.own);
        }
        self.finish(b, rx_before);
    }
}

/// The spin of `--poll-us` on one ring: how long a worker waits, kicks
/// still off, for more tx chains after the last, or for rx buffers after a
/// frame found none, before it re-enables kicks and sleeps. One per ring
/// and worker. Adaptive (unless `--poll-fixed`), as QEMU's iothreads and
/// KVM's halt polling are: the window starts at zero and is set by the
/// gaps the worker sees between the ring running dry and its next entry,
/// so a guest that sends (or refills) now and then is never spun for, and
/// one that sends a steady stream, or takes one, is not made to kick after
/// each burst (a polling driver's kick is a `write()` on an eventfd, and
/// the worker's wake-up after it).
#[derive(Debug)]
struct RingPoll {
    cfg: PollCfg,
    window: Duration,
    /// When the ring last ran dry before the worker slept.
    dry_since: Option<Instant>,
}

/// The first window after zero.
const POLL_START: Duration = Duration::from_micros(4);

impl RingPoll {
    fn new(cfg: PollCfg) -> Self {
        Self {
            cfg,
            window: if cfg.fixed { cfg.max } else { Duration::ZERO },
            dry_since: None,
        }
    }

    /// How long to spin now.
    fn window(&self) -> Duration {
        self.window
    }

    /// The ring ran dry at `at` (before any spin) and the worker sleeps.
    fn went_idle(&mut self, at: Instant) {
        self.dry_since = Some(at);
    }

    /// The worker finds the ring's next entry (the clock read only after a
    /// sleep).
    fn woke_now(&mut self) {
        if self.dry_since.is_some() {
            self.woke(Instant::now());
        }
    }

    /// The worker finds the ring's next entry at `now`.
    fn woke(&mut self, now: Instant) {
        if let Some(since) = self.dry_since.take() {
            if !self.cfg.fixed {
                self.adjust(now.saturating_duration_since(since));
            }
        }
    }

    /// After a sleep that a spin of `window` did not avoid: the next entry
    /// came `gap` after the ring ran dry. Within reach of `max`: a longer
    /// window would have saved the sleep and the driver's kick, so it
    /// grows (4 us, then doubling). Beyond: spinning would only have burnt
    /// the CPU, so it halves (to zero below 4 us).
    fn adjust(&mut self, gap: Duration) {
        let max = self.cfg.max;
        if gap <= self.window {
            return;
        }
        if gap > max {
            self.window /= 2;
            if self.window < POLL_START {
                self.window = Duration::ZERO;
            }
        } else if self.window < max {
            let grown = if self.window.is_zero() {
                POLL_START
            } else {
                self.window * 2
            };
            self.window = grown.min(max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Sleeps with the next chain `gap` after the ring ran dry; the window
    /// after it.
    fn sleep(p: &mut RingPoll, gap: Duration) -> Duration {
        // In the past: the gap is counted from the instant given, not from
        // when went_idle was called (the spin before the sleep counts).
        let now = Instant::now();
        let dry = now.checked_sub(Duration::from_millis(50)).unwrap_or(now);
        p.went_idle(dry);
        p.woke(dry + gap);
        p.window()
    }

    #[test]
    fn the_spin_grows_only_after_gaps_a_spin_could_have_covered() {
        let mut p = RingPoll::new(PollCfg {
            max: us(32),
            fixed: false,
        });
        // Nothing seen yet: no spin.
        assert_eq!(p.window(), Duration::ZERO);
        // A worker woken for something else than the tx ring after it
        // went dry is not a gap (no sleep recorded): no change.
        p.woke(Instant::now());
        assert_eq!(p.window(), Duration::ZERO);
        // Gaps beyond the ceiling never start it.
        for _ in 0..5 {
            assert_eq!(sleep(&mut p, us(500)), Duration::ZERO);
        }
        // Short gaps: 4 us, then doubling, capped at the ceiling.
        assert_eq!(sleep(&mut p, us(20)), us(4));
        assert_eq!(sleep(&mut p, us(20)), us(8));
        assert_eq!(sleep(&mut p, us(20)), us(16));
        assert_eq!(sleep(&mut p, us(20)), us(32));
        assert_eq!(sleep(&mut p, us(32)), us(32));
        // A gap the window covered (the spin should have found it): no
        // change either way.
        assert_eq!(sleep(&mut p, us(10)), us(32));
        // Long gaps halve it, and below 4 us it stops (a covered gap
        // below the ceiling does not grow it either: 16 stays 16).
        assert_eq!(sleep(&mut p, us(33)), us(16));
        assert_eq!(sleep(&mut p, us(9)), us(16));
        assert_eq!(sleep(&mut p, us(1000)), us(8));
        assert_eq!(sleep(&mut p, us(1000)), us(4));
        assert_eq!(sleep(&mut p, us(1000)), Duration::ZERO);
        // Each sleep counts once: a second wake-up without a new dry
        // spell changes nothing.
        assert_eq!(sleep(&mut p, us(5)), us(4));
        p.woke(Instant::now() + us(10_000));
        assert_eq!(p.window(), us(4));
    }

    #[test]
    fn a_ceiling_below_the_first_window_or_zero_bounds_the_spin() {
        let mut p = RingPoll::new(PollCfg {
            max: us(3),
            fixed: false,
        });
        assert_eq!(sleep(&mut p, us(1)), us(3));
        assert_eq!(sleep(&mut p, us(5)), Duration::ZERO);
        // --poll-us 0: never spins, whatever the gaps.
        let mut p = RingPoll::new(PollCfg {
            max: Duration::ZERO,
            fixed: false,
        });
        for g in [0, 1, 4, 100] {
            assert_eq!(sleep(&mut p, us(g)), Duration::ZERO);
        }
    }

    #[test]
    fn a_fixed_spin_is_the_whole_ceiling_whatever_the_gaps() {
        let mut p = RingPoll::new(PollCfg {
            max: us(50),
            fixed: true,
        });
        for g in [1, 49, 51, 10_000, 2] {
            assert_eq!(sleep(&mut p, us(g)), us(50));
        }
    }
}
