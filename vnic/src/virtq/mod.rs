//! The virtqueues of the packet path, treated as hostile: everything the
//! guest put in a ring is checked, a chain that cannot be used is consumed
//! with length 0 and counted, never left in the ring and never allowed to
//! stop the queue.
//!
//! - [`rx`]: filling rx chains (one delivery algorithm over [`rx::RxAccess`],
//!   with a batch ring view and a per-frame virtio-queue fallback) and the
//!   used-buffer notification of a batch;
//! - [`tx`]: gathering tx chains;
//! - [`watchdog`]: making up for notifications lost around a call-fd switch.

use std::fs::File;
use std::io;

use vhost_user_backend::{VringRwLock, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as VirtQueError, QueueT};
use vm_memory::{Address, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

pub mod rx;
pub mod tx;
pub mod watchdog;

/// Guest memory as the daemon and its workers share it.
pub type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// Size of `struct virtio_net_hdr_v1` (VERSION_1 always uses it, with or
/// without MRG_RXBUF).
pub const NET_HDR_LEN: usize = 12;

/// Guest address of a split ring's `used_event` field (the last entry of
/// the avail ring, VIRTIO_F_EVENT_IDX): `None` if it overflows.
pub fn used_event_addr<Q: QueueT>(q: &Q) -> Option<GuestAddress> {
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
#[derive(Clone)]
pub struct Vring(VringRwLock<Mem>);

impl<'a> VringStateGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateGuard<'a, Mem>>::G;
}

impl<'a> VringStateMutGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateMutGuard<'a, Mem>>::G;
}

impl VringT<Mem> for Vring {
    fn new(mem: Mem, max_queue_size: u16) -> Result<Self, VirtQueError> {
        VringRwLock::new(mem, max_queue_size).map(Self)
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
        self.0.set_err(file);
    }
}
