//! The state of one vhost-user connection, shared by its workers, the
//! management path and the 50 ms poll: the workers' inboxes, the enabled
//! pairs, the replicas' hit counters, the registered rings (for the poll
//! and the notification watchdog) and the negotiated features.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vhost_user_backend::VringT;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;

use crate::lanes::Lanes;
use crate::pairs::Pairs;
use crate::stats::Hits;
use crate::virtq::watchdog::Watchdog;
use crate::virtq::{Mem, Vring};

pub(crate) struct Conn {
    pub lanes: Arc<Lanes>,
    pub pairs: Arc<Pairs>,
    pub hits: Arc<Hits>,
    /// Clones of each worker's vrings, registered by the worker on its
    /// first event, looked at by the 50 ms poll.
    rings: Mutex<Vec<Option<Vec<Vring>>>>,
    /// Guest memory, set by the first worker that registers its vrings.
    mem: Mutex<Option<Mem>>,
    pub watchdog: Watchdog,
    pub event_idx: AtomicBool,
    pub acked_features: AtomicU64,
    /// Per vring: how many times the frontend stopped it
    /// (`GET_VRING_BASE`). A ring the device stopped runs again once this
    /// moves (see [`crate::virtq::StopLatch`]).
    ring_restarts: Box<[AtomicU32]>,
}

impl Conn {
    pub(crate) fn new(pairs: usize) -> std::io::Result<Self> {
        Ok(Self {
            lanes: Arc::new(Lanes::new(pairs)?),
            pairs: Arc::new(Pairs::new(pairs)),
            hits: Arc::new(Hits::new(pairs)),
            rings: Mutex::new(vec![None; pairs]),
            mem: Mutex::new(None),
            watchdog: Watchdog::new(pairs),
            event_idx: AtomicBool::new(false),
            acked_features: AtomicU64::new(0),
            ring_restarts: (0..2 * pairs).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// The frontend stopped vring `index`.
    pub(crate) fn ring_stopped(&self, index: usize) {
        if let Some(r) = self.ring_restarts.get(index) {
            r.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// How many times the frontend stopped vring `index`.
    pub(crate) fn ring_restarts(&self, index: usize) -> u32 {
        self.ring_restarts
            .get(index)
            .map_or(0, |r| r.load(Ordering::Acquire))
    }

    /// Whether the driver acked VIRTIO_NET_F_MRG_RXBUF.
    pub(crate) fn mrg_rxbuf(&self) -> bool {
        self.acked_features.load(Ordering::Relaxed) & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0
    }

    /// Worker `pair` hands over its vrings and the guest memory.
    pub(crate) fn register_rings(&self, pair: usize, vrings: &[Vring], mem: &Mem) {
        if let Some(slot) = self
            .rings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(pair)
        {
            *slot = Some(vrings.to_vec());
        }
        *self
            .mem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(mem.clone());
    }

    /// The 50 ms poll: the rings' state goes to the enabled pairs (a
    /// disable raises no event), then the notification watchdog looks;
    /// workers holding frames back are woken.
    pub(crate) fn poll(&self) {
        for ib in self.lanes.all() {
            if ib.holding.load(std::sync::atomic::Ordering::Relaxed) {
                ib.wake();
            }
        }
        let rings = self
            .rings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (i, v) in rings.iter().enumerate() {
            if let Some(rx) = v.as_ref().and_then(|v| v.first()) {
                let st = rx.get_ref();
                self.pairs
                    .observe(i, st.get_queue().ready(), st.is_enabled());
            }
        }
        let mem = self
            .mem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(mem) = mem {
            self.watchdog.check(&mem.memory(), &rings, |pair| {
                if let Some(ib) = self.lanes.get(pair) {
                    ib.recheck_tx();
                }
            });
        }
    }
}
