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

use crate::config::PeerKind;
use crate::conn::Conn;
use crate::daemon::Shared;
use crate::handoff::{Router, RouterLinks, ToGuest};
use crate::lanes::Reply;
use crate::peer::gen::GenPeer;
use crate::peer::tap::TapPeer;
use crate::peer::{AnyPeer, Peer};
use crate::stats::add;
use crate::virtq::ring::needs_notification;
use crate::virtq::rx::{RxBatch, RxKicks};
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
    /// The driver's kicks on the rx ring (off while the device works).
    rx_kicks: RxKicks,
    /// The rings the device stopped (a driver it cannot follow).
    rx_stop: StopLatch,
    tx_stop: StopLatch,
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
            rx_kicks: RxKicks::default(),
            rx_stop: StopLatch::default(),
            tx_stop: StopLatch::default(),
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
        let mut b = RxBatch::open(
            &mut rx,
            &mem,
            self.rx_stop.is_set(),
            &mut self.rx_kicks,
            restarts,
        );
        match b.check_avail() {
            Err(why) => {
                self.rx_stop
                    .stop(restarts, why, &qs.rx_stops, &qs.rx_stopped, id, "rx");
                vrings[0].signal_err();
            }
            // Out of buffers at the last look: has the driver added some?
            Ok(more) => self.router.recheck_starved(|| more),
        }
        self.router.begin();
        self.router.drain_inbox(&mut b, &mut self.own);
        let mut to_guest = ToGuest {
            router: &mut self.router,
            rx: &mut b,
        };
        self.peer.frames_for_guest(&mut to_guest, peer_event);
        self.finish(b);
    }

    /// Ends a batch: hands over the frames for other workers and wakes
    /// them, publishes the rx ring and notifies the driver if it asked.
    fn finish(&mut self, b: RxBatch<'_>) {
        self.router.flush_kicks();
        let r = &self.router;
        if b.finish(r.id, r.flags.added, r.flags.nobufs, &mut self.rx_kicks) {
            r.inbox().wake();
        }
    }

    fn process_tx(&mut self, vrings: &[Vring]) {
        let id = self.router.id;
        let mem = self.mem.memory();
        let poll = self.sh.cfg.poll;
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
        let rx_restarts = self.conn.ring_restarts(2 * id);
        let mut b = RxBatch::open(
            &mut rx,
            &mem,
            self.rx_stop.is_set(),
            &mut self.rx_kicks,
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
            // --poll-us: wait for more chains with kicks still off.
            if !poll.is_zero() && poll_tx(tx.get_queue(), &*mem, poll) {
                continue;
            }
            match tx.get_queue_mut().enable_notification(&*mem) {
                Ok(true) => {}
                Ok(false) => break,
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
        self.finish(b);
    }
}

/// Spins for up to `poll` until the driver makes a chain available on `q`
/// (`--poll-us`); true when it did.
fn poll_tx<M: vm_memory::GuestMemory>(q: &virtio_queue::Queue, mem: &M, poll: Duration) -> bool {
    let start = Instant::now();
    let next = std::num::Wrapping(q.next_avail());
    loop {
        match q.avail_idx(mem, std::sync::atomic::Ordering::Acquire) {
            Ok(i) if i != next => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        if start.elapsed() >= poll {
            return false;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    #[test]
    fn poll_tx_waits_for_a_chain_and_no_longer_than_asked() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let mq = MockSplitQueue::new(&m, 16);
        let q: virtio_queue::Queue = mq.create_queue().unwrap();
        // Nothing available: it gives up after the time asked.
        let t = Instant::now();
        assert!(!poll_tx(&q, &m, Duration::from_micros(300)));
        assert!(t.elapsed() >= Duration::from_micros(300));
        // A chain available: found at once.
        mq.build_desc_chain(&[RawDescriptor::from(SplitDescriptor::new(
            0x8000,
            64,
            VRING_DESC_F_WRITE as u16,
            0,
        ))])
        .unwrap();
        let t = Instant::now();
        assert!(poll_tx(&q, &m, Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
