//! The host view of one split virtqueue for one batch, shared by the rx
//! and tx ring paths ([`super::rx::RxRing`], [`super::tx::TxRing`]).
//!
//! The descriptor table, avail ring and used ring are resolved to host
//! memory once when the batch starts; the avail index is read once per
//! batch (and again only when the entries seen run out); used entries are
//! written as chains complete and the used index is published every
//! [`PUBLISH_EVERY`] entries and at [`RingView::finish`]; buffers are
//! reached through the region of the last buffer.
//!
//! The queue's own `next_avail` / `next_used` are stale while the batch
//! runs: the caller holds the vring's lock from [`RingView::open`] to
//! [`RingView::finish`] and uses nothing else on this queue in between.
//! `Queue::add_used` is not called, so the queue's `num_added` does not
//! move: decide on used-buffer notifications with
//! [`super::rx::needs_notification`].

use std::num::Wrapping;
use std::sync::atomic::Ordering;

use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MemoryRegionAddress, VolatileSlice,
};

use super::RingStop;

/// Used entries published at most this many at a time while a batch runs
/// (the driver can consume the first ones while the device writes more).
pub const PUBLISH_EVERY: u16 = 64;

pub struct RingView<'a> {
    pub mem: &'a GuestMemoryMmap,
    pub desc_table: GuestAddress,
    pub desc: VolatileSlice<'a, ()>,
    avail: VolatileSlice<'a, ()>,
    used: VolatileSlice<'a, ()>,
    pub size: u16,
    next_avail: Wrapping<u16>,
    /// Avail index as last read from the ring.
    avail_idx: Wrapping<u16>,
    next_used: Wrapping<u16>,
    published: Wrapping<u16>,
    /// Region of the last buffer (most buffers share it).
    region: Option<&'a GuestRegionMmap>,
}

impl<'a> RingView<'a> {
    /// Resolves the rings of `q`. `None` when the queue is not ready, its
    /// size is not a power of two, or a ring area is not one contiguous
    /// piece of host memory: the caller then goes through virtio-queue.
    pub fn open(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        let size = q.size();
        if !q.ready() || size == 0 || !size.is_power_of_two() {
            return None;
        }
        let n = usize::from(size);
        let ev = if q.event_idx_enabled() { 2 } else { 0 };
        let desc_table = GuestAddress(q.desc_table());
        let desc = mem.get_slice(desc_table, 16 * n).ok()?;
        let avail = mem
            .get_slice(GuestAddress(q.avail_ring()), 4 + 2 * n + ev)
            .ok()?;
        let used = mem
            .get_slice(GuestAddress(q.used_ring()), 4 + 8 * n + ev)
            .ok()?;
        let next_avail = Wrapping(q.next_avail());
        let next_used = Wrapping(q.next_used());
        Some(Self {
            mem,
            desc_table,
            desc,
            avail,
            used,
            size,
            next_avail,
            avail_idx: next_avail,
            next_used,
            published: next_used,
            region: None,
        })
    }

    /// Publishes the used index and hands the ring positions back to `q`.
    /// Returns the used index.
    pub fn finish(mut self, q: &mut Queue) -> u16 {
        self.publish();
        q.set_next_avail(self.next_avail.0);
        q.set_next_used(self.next_used.0);
        self.next_used.0
    }

    fn publish(&mut self) {
        if self.published != self.next_used {
            // Release: the used elements and the buffers' contents are
            // visible before the index that hands them to the driver.
            let _ = self
                .used
                .store(u16::to_le(self.next_used.0), 2, Ordering::Release);
            self.published = self.next_used;
        }
    }

    /// The head of the next available chain: `Ok(None)` when there is
    /// none; `Err` when the avail index runs more than a ring ahead of the
    /// device (the driver is broken; virtio-queue refuses such a ring in
    /// the same way) or cannot be read. Nothing is popped then.
    #[inline]
    pub fn pop_head(&mut self) -> Result<Option<u16>, RingStop> {
        if self.next_avail == self.avail_idx {
            let idx = Wrapping(u16::from_le(
                self.avail
                    .load::<u16>(2, Ordering::Acquire)
                    .map_err(|_| RingStop::AvailUnreadable)?,
            ));
            if (idx - self.next_avail).0 > self.size {
                return Err(RingStop::AvailJump);
            }
            self.avail_idx = idx;
            if idx == self.next_avail {
                return Ok(None);
            }
        }
        let slot = usize::from(self.next_avail.0 & (self.size - 1));
        let head = u16::from_le(
            self.avail
                .load::<u16>(4 + 2 * slot, Ordering::Relaxed)
                .map_err(|_| RingStop::AvailUnreadable)?,
        );
        self.next_avail += Wrapping(1);
        Ok(Some(head))
    }

    /// Gives back the last `n` popped heads.
    #[inline]
    pub fn unpop(&mut self, n: usize) {
        self.next_avail -= Wrapping(n as u16);
    }

    /// The avail index as last read, and the device's position in it.
    #[inline]
    pub fn positions(&self) -> (u16, u16) {
        (self.avail_idx.0, self.next_avail.0)
    }

    /// Whether the next [`RingView::push_used`] publishes the used index.
    #[inline]
    pub fn publishes_next(&self) -> bool {
        (self.next_used - self.published).0 + 1 >= PUBLISH_EVERY
    }

    /// Writes the used entry (`head`, `len`), publishing every
    /// [`PUBLISH_EVERY`].
    #[inline]
    pub fn push_used(&mut self, head: u16, len: u32) {
        let slot = usize::from(self.next_used.0 & (self.size - 1));
        let mut e = [0u8; 8];
        e[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        e[4..].copy_from_slice(&len.to_le_bytes());
        let _ = self.used.write_slice(&e, 4 + 8 * slot);
        self.next_used += Wrapping(1);
        if (self.next_used - self.published).0 >= PUBLISH_EVERY {
            self.publish();
        }
    }

    /// Host memory of `len` bytes at `addr` when they lie in one region.
    #[inline]
    pub fn buffer(&mut self, addr: GuestAddress, len: usize) -> Option<VolatileSlice<'a, ()>> {
        let r = match self.region {
            Some(r) if addr >= r.start_addr() && addr <= r.last_addr() => r,
            _ => {
                let r = self.mem.find_region(addr)?;
                self.region = Some(r);
                r
            }
        };
        let off = addr.unchecked_offset_from(r.start_addr());
        r.get_slice(MemoryRegionAddress(off), len).ok()
    }
}
