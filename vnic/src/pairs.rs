//! The enabled queue pairs: one owner, one published value.
//!
//! Two sources say whether pair `i` can carry frames:
//! - the frontend's `SET_VRING_ENABLE` for rx vring `2i` (seen by the relay
//!   before the handler applies it, so a pair the guest has just enabled is
//!   usable at once, not at the next 50 ms poll);
//! - the state of the pair's rx ring: started (between the kick that starts
//!   it and the `GET_VRING_BASE` that stops it) and enabled, observed by the
//!   pair's worker on its events, by the 50 ms poll and by `stop_vring`.
//!
//! A pair is enabled when the frontend enabled it and its ring was not seen
//! stopped since (a stop, e.g. a guest reset, takes it out until the ring
//! is seen started again or the frontend enables it again). A stop is
//! `GET_VRING_BASE` ([`Pairs::stop`]) or a ring seen started and then seen
//! not started; a ring not yet started is not a stopped one. QEMU sends
//! `SET_VRING_ENABLE` before it sets the rings up, on the first connection
//! and on a reconnect alike: counting the gap until a ring's kick as a stop
//! made the pair count flap (0xf -> 0x7 -> 0xf) while the guest, whose
//! driver changed nothing, replayed its filters after a daemon restart, and
//! three adds to queue 3 were refused `bad_queue`, which no real NIC would
//! have said. Before any
//! `SET_VRING_ENABLE` (e.g. without `VHOST_USER_F_PROTOCOL_FEATURES`), a
//! pair is enabled when its ring is started and enabled. Every writer goes through the one
//! mutex here and the result is published as one mask; RSS, the
//! management path (op validation, CAPS) and `ctl stats` all read it. No
//! writer can bring back a bit another one just cleared: each source keeps
//! its own bits and the mask is recomputed from both.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Default)]
struct Sources {
    /// Bit i: the frontend's last SET_VRING_ENABLE for rx vring 2i enabled it.
    frontend: u32,
    /// Whether any SET_VRING_ENABLE was seen on this connection.
    frontend_seen: bool,
    /// Bit i: pair i's rx ring was stopped, and neither seen started nor
    /// enabled by the frontend since.
    stopped: u32,
    /// Bit i: pair i's rx ring was last seen started (0 until it is seen
    /// started on this connection).
    started: u32,
    /// Bit i: pair i's rx ring was last seen started and enabled.
    running: u32,
}

pub(crate) struct Pairs {
    count: u32,
    sources: Mutex<Sources>,
    /// `started | running << 32` as last recorded (read without the lock
    /// by workers, to skip the lock when nothing changed).
    seen: AtomicU64,
    published: AtomicU32,
}

impl Pairs {
    pub(crate) fn new(pairs: usize) -> Self {
        Self {
            count: pairs as u32,
            sources: Mutex::new(Sources::default()),
            seen: AtomicU64::new(0),
            published: AtomicU32::new(0),
        }
    }

    /// Bit i set: pair i is enabled.
    pub(crate) fn mask(&self) -> u32 {
        self.published.load(Ordering::Acquire)
    }

    /// Enabled pairs counted from pair 0: what RSS spreads over, what
    /// CAPS reports and what an op's rx queue is checked against.
    pub(crate) fn count(&self) -> u16 {
        self.mask().trailing_ones() as u16
    }

    fn update(&self, f: impl FnOnce(&mut Sources)) {
        let mut s = self
            .sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = self.published.load(Ordering::Relaxed);
        f(&mut s);
        self.seen.store(
            u64::from(s.started) | u64::from(s.running) << 32,
            Ordering::Release,
        );
        let m = if s.frontend_seen {
            s.frontend & !s.stopped
        } else {
            s.running
        };
        self.published.store(m, Ordering::Release);
        if m != before {
            log::info!("enabled queue pairs now {m:#x}");
        }
    }

    /// The frontend's SET_VRING_ENABLE (any vring; rx vrings decide).
    pub(crate) fn frontend_enable(&self, vring: u32, enable: bool) {
        if !vring.is_multiple_of(2) || vring / 2 >= self.count {
            return;
        }
        let bit = 1u32 << (vring / 2);
        self.update(|s| {
            if enable {
                s.frontend |= bit;
                s.stopped &= !bit;
            } else {
                s.frontend &= !bit;
            }
            s.frontend_seen = true;
        });
    }

    /// Pair `pair`'s rx ring is (not) started, and (not) enabled. Cheap
    /// when nothing changed.
    pub(crate) fn observe(&self, pair: usize, started: bool, enabled: bool) {
        let bit = 1u32 << pair;
        let running = started && enabled;
        let seen = self.seen.load(Ordering::Acquire);
        let was = (seen as u32 & bit != 0, (seen >> 32) as u32 & bit != 0);
        if was == (started, running) {
            return;
        }
        self.update(|s| {
            if started {
                s.stopped &= !bit;
                s.started |= bit;
            } else if s.started & bit != 0 {
                // Seen started before: it stopped.
                s.stopped |= bit;
                s.started &= !bit;
            }
            s.running = (s.running & !bit) | if running { bit } else { 0 };
        });
    }

    /// Pair `pair`'s rx ring was stopped (`GET_VRING_BASE`): out until it
    /// is seen started again or the frontend enables it again.
    pub(crate) fn stop(&self, pair: usize) {
        let bit = 1u32.checked_shl(pair as u32).unwrap_or(0);
        self.update(|s| {
            s.stopped |= bit;
            s.started &= !bit;
            s.running &= !bit;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_from_both_sources() {
        let p = Pairs::new(4);
        // Without SET_VRING_ENABLE: started and enabled rings decide.
        p.observe(0, true, true);
        p.observe(1, true, true);
        p.observe(2, true, false);
        assert_eq!((p.mask(), p.count()), (0b11, 2));
        // The frontend enables pairs 0..3; its word counts at once, before
        // the handler has enabled the rings or a worker has looked.
        for v in [0, 2, 4, 6] {
            p.frontend_enable(v, true);
        }
        assert_eq!(p.count(), 4);
        // A disable wins over a running ring, and a later poll that still
        // sees the ring running cannot bring the bit back.
        p.frontend_enable(4, false);
        p.observe(2, true, true);
        assert_eq!(p.count(), 2);
        // A stopped ring drops its pair even while the frontend enables it,
        // until it is seen started again (or enabled again).
        p.observe(0, false, false);
        assert_eq!((p.mask(), p.count()), (0b1010, 0));
        p.observe(0, false, false);
        assert_eq!(p.mask(), 0b1010);
        p.observe(0, true, true);
        assert_eq!(p.mask(), 0b1011);
        p.observe(3, false, false);
        p.frontend_enable(6, true);
        assert_eq!(p.mask(), 0b1011);
        // Tx vrings and pairs out of range are ignored.
        p.frontend_enable(1, false);
        p.frontend_enable(40, true);
        assert_eq!(p.mask(), 0b1011);
    }

    /// QEMU enables the vrings before it sets them up (first connection
    /// and reconnect after a daemon restart): a poll in that gap sees rings
    /// not yet started, which must not take their pairs out (the guest's
    /// driver configured 4 pairs and changed nothing). Only a ring seen
    /// started and then not, or GET_VRING_BASE, is a stop.
    #[test]
    fn a_ring_not_yet_started_is_not_a_stopped_one() {
        let p = Pairs::new(4);
        for v in [0, 2, 4, 6] {
            p.frontend_enable(v, true);
        }
        for i in 0..4 {
            p.observe(i, false, false);
        }
        assert_eq!((p.mask(), p.count()), (0b1111, 4));
        for i in 0..4 {
            p.observe(i, true, true);
        }
        assert_eq!(p.count(), 4);
        // Seen started, then seen not started: stopped.
        p.observe(3, false, false);
        assert_eq!(p.mask(), 0b0111);
        p.observe(3, true, true);
        assert_eq!(p.mask(), 0b1111);
        // GET_VRING_BASE stops a pair whether or not a poll saw it started.
        p.stop(2);
        assert_eq!(p.mask(), 0b1011);
        p.observe(2, false, false);
        assert_eq!(p.mask(), 0b1011);
        p.frontend_enable(4, true);
        assert_eq!(p.mask(), 0b1111);
        let q = Pairs::new(2);
        q.frontend_enable(0, true);
        q.frontend_enable(2, true);
        q.stop(1);
        assert_eq!(q.mask(), 0b01, "stopped before it was ever seen started");
        q.stop(40);
        assert_eq!(q.mask(), 0b01);
    }
}
