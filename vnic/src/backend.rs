//! The vhost-user backend of one connection: the `VhostUserBackend` trait
//! implementation, and nothing else. Events go to the pair's [`Worker`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringEpollHandler};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::conn::Conn;
use crate::daemon::Shared;
use crate::virtq::{Mem, Vring};
use crate::worker::{ev_inbox, ev_peer, Worker};

/// Virtio features the device offers.
pub(crate) const DEVICE_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_NET_F_MQ)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC);

pub(crate) struct VnicBackend {
    sh: Arc<Shared>,
    conn: Arc<Conn>,
    workers: Vec<Mutex<Worker>>,
    /// The exit-event consumer fds handed to vhost-user-backend. Its
    /// `VringEpollHandler::new` (0.24) takes them with `into_raw_fd` and
    /// never closes them: one leaked fd per worker and connection. They are
    /// closed here once the workers are gone ([`VnicBackend::close_exit_fds`]).
    exit_fds: Mutex<Vec<std::os::fd::RawFd>>,
}

impl VnicBackend {
    pub(crate) fn new(sh: &Arc<Shared>, conn: &Arc<Conn>, mem: &Mem) -> io::Result<Self> {
        let workers = (0..sh.pairs())
            .map(|t| Worker::new(t, sh, conn, mem).map(Mutex::new))
            .collect::<io::Result<_>>()?;
        Ok(Self {
            sh: sh.clone(),
            conn: conn.clone(),
            workers,
            exit_fds: Mutex::new(Vec::new()),
        })
    }

    /// Closes the exit-event fds vhost-user-backend leaked. Only call once
    /// every worker thread of this connection has exited (no epoll of theirs
    /// can still be waiting on them).
    pub(crate) fn close_exit_fds(&self) {
        let fds = std::mem::take(
            &mut *self
                .exit_fds
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for fd in fds {
            // SAFETY: `fd` is an eventfd this backend created in
            // `exit_event` and whose ownership vhost-user-backend released
            // with `into_raw_fd` without closing it; nothing else owns or
            // closes it, and the worker threads that used it have exited, so
            // closing it here is the one close it gets.
            drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        }
    }

    /// Registers the workers' own fds (inbox eventfd, peer) with their
    /// epoll loops.
    pub(crate) fn register(
        &self,
        handlers: &[Arc<VringEpollHandler<Arc<VnicBackend>>>],
    ) -> io::Result<()> {
        let nq = self.num_queues();
        for (t, h) in handlers.iter().enumerate() {
            let Some(ib) = self.conn.lanes.get(t) else {
                continue;
            };
            h.register_listener(ib.kick.as_raw_fd(), EventSet::IN, u64::from(ev_inbox(nq)))?;
            let fd = self.workers[t]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .peer_fd();
            if let Some(fd) = fd {
                h.register_listener(fd, EventSet::IN, u64::from(ev_peer(nq)))?;
            }
            // Pick up the generator's flow sets at once.
            ib.wake();
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
        let (consumer, notifier) = new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()?;
        // The library keeps the consumer's fd number and never closes it:
        // remember it so that `close_exit_fds` can.
        self.exit_fds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // The frontend stops the device (guest reset, reboot, driver
        // unbind) by stopping its rings; rx 0 is always among them. Like a
        // hardware reset this empties the table and moves the generation.
        if queue_index == 0 {
            self.sh.lock_mgmt().reset(None, "reset");
        }
        self.conn.ring_stopped(queue_index as usize);
        self.conn.pairs.stop((queue_index / 2) as usize);
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
