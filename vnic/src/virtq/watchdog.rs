//! The notification watchdog: makes up for used-buffer interrupts and
//! kicks lost around a call-fd switch (see [`super::Vring`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestMemoryMmap};

use super::{used_event_addr, Vring};

/// Per pair, the last look at its (rx, tx) rings.
pub(crate) struct Watchdog {
    watch: Mutex<Vec<[Snap; 2]>>,
    /// What the last look saw, for `ctl stats` (copied at the end of each
    /// look, so a reader never waits for a look in progress).
    seen: Mutex<Seen>,
    /// Lost notifications made up for (interrupts re-sent, tx rings re-polled).
    pub nudges: AtomicU64,
}

/// The rings as the last look saw them.
#[derive(Clone, Default)]
pub(crate) struct Seen {
    /// When the look ended (`clock::now_ns`); 0: no look yet.
    pub at_ns: u64,
    /// Per pair, (rx, tx); `None`: the pair's worker has not registered
    /// its rings yet.
    pub rings: Vec<Option<[RingView; 2]>>,
}

/// One ring at one look: the device's and the driver's positions.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct RingView {
    pub enabled: bool,
    pub ready: bool,
    pub event_idx: bool,
    /// The driver's avail index (guest memory).
    pub avail: Option<u16>,
    /// The device's next avail entry to take.
    pub next_avail: u16,
    /// The device's next used entry (published at the end of each batch).
    pub next_used: u16,
    /// The driver's `used_event` (EVENT_IDX only).
    pub used_event: Option<u16>,
    /// The watchdog already made up for a lost notification in this state.
    pub nudged: bool,
}

impl Watchdog {
    pub(crate) fn new(pairs: usize) -> Self {
        Self {
            watch: Mutex::new(vec![[Snap::default(); 2]; pairs]),
            seen: Mutex::new(Seen::default()),
            nudges: AtomicU64::new(0),
        }
    }

    /// The rings as the last look saw them.
    pub(crate) fn seen(&self) -> Seen {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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
    /// `vr`: each pair's registered (rx, tx) rings; `poll_tx(pair)` asks
    /// that pair's worker to poll its tx ring.
    pub(crate) fn check(
        &self,
        mem: &GuestMemoryMmap,
        vr: &[Option<Vec<Vring>>],
        poll_tx: impl Fn(usize),
    ) {
        let mut watch = self
            .watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut seen = vec![None; vr.len()];
        for (pair, v) in vr.iter().enumerate() {
            let (Some(v), Some(w)) = (v, watch.get_mut(pair)) else {
                continue;
            };
            let views = seen[pair].insert([RingView::default(); 2]);
            for (k, ring) in v.iter().take(2).enumerate() {
                let st = ring.get_ref();
                let q = st.get_queue();
                let ready = q.ready();
                let avail = if ready {
                    q.avail_idx(mem, Ordering::Acquire).ok().map(|a| a.0)
                } else {
                    None
                };
                let used_event = if ready && q.event_idx_enabled() {
                    used_event_addr(q)
                        .and_then(|a| mem.read_obj::<u16>(a).ok())
                        .map(u16::from_le)
                } else {
                    None
                };
                views[k] = RingView {
                    enabled: st.is_enabled(),
                    ready,
                    event_idx: q.event_idx_enabled(),
                    avail,
                    next_avail: q.next_avail(),
                    next_used: q.next_used(),
                    used_event,
                    nudged: false,
                };
                if !(st.is_enabled() && ready && q.event_idx_enabled()) {
                    w[k] = Snap::default();
                    continue;
                }
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
                    views[k].nudged = true;
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
                    poll_tx(pair);
                }
                if owed || unpolled {
                    self.nudges.fetch_add(1, Ordering::Relaxed);
                    w[k].nudged = true;
                    views[k].nudged = true;
                }
            }
        }
        drop(watch);
        *self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Seen {
            at_ns: crate::clock::now_ns(),
            rings: seen,
        };
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

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::sync::atomic::AtomicBool;

    use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use super::super::Mem;
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
        let wd = Watchdog::new(1);
        let rings = vec![Some(vec![rx.clone(), tx.clone()])];
        let polled = AtomicBool::new(false);
        let m = mem.memory();
        let look = || wd.check(&m, &rings, |_| polled.store(true, Ordering::Relaxed));
        let used_event = GuestAddress(AVAIL + 4 + 2 * u64::from(SIZE));

        // rx: the device published 3 buffers, the driver asked for an
        // interrupt after the first (used_event 0) and never got it.
        rx.set_queue_next_used(3);
        m.write_obj(0u16, used_event).unwrap();
        look();
        assert!(!signalled(&rx_efd), "first look only records the state");
        look();
        assert!(
            signalled(&rx_efd),
            "no progress for a period: interrupt again"
        );
        look();
        look();
        assert!(!signalled(&rx_efd), "once per stalled state");
        // The driver caught up: nothing is owed.
        m.write_obj(3u16, used_event).unwrap();
        look();
        look();
        assert!(!signalled(&rx_efd));

        // tx: the driver posted 2 chains (avail idx 2) the worker never took.
        m.write_obj(2u16, GuestAddress(AVAIL + 2)).unwrap();
        look();
        assert!(!polled.load(Ordering::Relaxed));
        look();
        assert!(
            polled.swap(false, Ordering::Relaxed),
            "worker asked to poll"
        );
        look();
        assert!(!polled.load(Ordering::Relaxed));
        assert_eq!(wd.nudges.load(Ordering::Relaxed), 2);
    }
}
