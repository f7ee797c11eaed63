//! The host view of one split virtqueue for one batch: the one ring path
//! of both directions ([`super::rx::RxRing`], [`super::tx::TxRing`]).
//!
//! The descriptor table, avail ring and used ring are resolved once when
//! the batch starts ([`Area`]: host memory when the area lies in one
//! region, which is what every frontend does; by guest address, access by
//! access, when a guest placed it across regions); the avail index is read
//! once per batch (and again only when the entries seen run out); used
//! entries are kept in a local shadow as chains complete and written to
//! the used ring together, with the used index after them, every
//! [`PUBLISH_EVERY`] entries and at [`RingView::finish`] (the used ring's
//! lines, which the driver's CPU reads, are then taken once per burst
//! instead of once per chain, between the copies); buffers are
//! reached through the region of the last buffer. The avail-index check
//! ([`RingView::pop_head`]) and the used-buffer notification rule
//! ([`needs_notification`]) are the only ones of the daemon.
//!
//! The queue's own `next_avail` / `next_used` are stale while the batch
//! runs: the caller holds the vring's lock from [`RingView::open`] to
//! [`RingView::finish`] and uses nothing else on this queue in between.
//! `Queue::add_used` is not called, so the queue's `num_added` does not
//! move: decide on used-buffer notifications with [`needs_notification`].

use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use virtio_bindings::bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion, GuestRegionMmap, MemoryRegionAddress, VolatileSlice,
};

use super::{used_event_addr, RingStop};

/// Where one ring area (descriptor table, avail ring, used ring) is.
#[derive(Clone, Copy)]
pub(crate) enum Area<'a> {
    /// In one region: host memory.
    Host(VolatileSlice<'a, ()>),
    /// Across regions (or partly outside guest memory): every access goes
    /// through the guest address, and one that leaves guest memory fails.
    Guest(GuestAddress),
}

impl<'a> Area<'a> {
    /// The area of `len` bytes at `addr`.
    fn resolve(mem: &'a GuestMemoryMmap, addr: GuestAddress, len: usize) -> Self {
        match mem.get_slice(addr, len) {
            Ok(s) => Area::Host(s),
            Err(_) => Area::Guest(addr),
        }
    }

    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn load_u16(&self, mem: &GuestMemoryMmap, off: usize, order: Ordering) -> Option<u16> {
        match self {
            Area::Host(s) => s.load::<u16>(off, order).ok(),
            Area::Guest(a) => mem.load::<u16>(a.checked_add(off as u64)?, order).ok(),
        }
        .map(u16::from_le)
    }

    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn store_u16(&self, mem: &GuestMemoryMmap, off: usize, v: u16, order: Ordering) {
        let v = u16::to_le(v);
        let _ = match self {
            Area::Host(s) => s.store(v, off, order).is_ok(),
            Area::Guest(a) => a
                .checked_add(off as u64)
                .is_some_and(|a| mem.store(v, a, order).is_ok()),
        };
    }

    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn write(&self, mem: &GuestMemoryMmap, bytes: &[u8], off: usize) {
        let _ = match self {
            Area::Host(s) => s.write_slice(bytes, off).is_ok(),
            Area::Guest(a) => a
                .checked_add(off as u64)
                .is_some_and(|a| mem.write_slice(bytes, a).is_ok()),
        };
    }
}

/// Used entries published at most this many at a time while a batch runs
/// (the driver can consume the first ones while the device writes more).
pub(crate) const PUBLISH_EVERY: u16 = 64;

pub(crate) struct RingView<'a> {
    pub(crate) mem: &'a GuestMemoryMmap,
    pub(crate) desc: Area<'a>,
    avail: Area<'a>,
    used: Area<'a>,
    pub(crate) size: u16,
    next_avail: Wrapping<u16>,
    /// Avail index as last read from the ring.
    avail_idx: Wrapping<u16>,
    next_used: Wrapping<u16>,
    published: Wrapping<u16>,
    /// Used entries not yet written to the ring (the first is at
    /// `published`), as the ring's little-endian bytes.
    shadow: [[u8; 8]; PUBLISH_EVERY as usize],
    /// Region of the last buffer (most buffers share it).
    region: Option<&'a GuestRegionMmap>,
}

impl<'a> RingView<'a> {
    /// Resolves the rings of `q`. `None` when the queue is not ready or its
    /// size is not a power of two (virtio-queue refuses such a size, so the
    /// queue cannot be ready with it): nothing may be taken from it.
    pub(crate) fn open(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        let size = q.size();
        if !q.ready() || size == 0 || !size.is_power_of_two() {
            return None;
        }
        let n = usize::from(size);
        let ev = if q.event_idx_enabled() { 2 } else { 0 };
        let desc = Area::resolve(mem, GuestAddress(q.desc_table()), 16 * n);
        let avail = Area::resolve(mem, GuestAddress(q.avail_ring()), 4 + 2 * n + ev);
        let used = Area::resolve(mem, GuestAddress(q.used_ring()), 4 + 8 * n + ev);
        Some(Self::with_areas(q, mem, desc, avail, used))
    }

    /// As [`RingView::open`], every area reached by guest address (the
    /// path of a ring placed across regions), for the tests.
    #[cfg(test)]
    pub(crate) fn open_by_address(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        let size = q.size();
        if !q.ready() || size == 0 || !size.is_power_of_two() {
            return None;
        }
        let (desc, avail, used) = (
            Area::Guest(GuestAddress(q.desc_table())),
            Area::Guest(GuestAddress(q.avail_ring())),
            Area::Guest(GuestAddress(q.used_ring())),
        );
        Some(Self::with_areas(q, mem, desc, avail, used))
    }

    fn with_areas(
        q: &Queue,
        mem: &'a GuestMemoryMmap,
        desc: Area<'a>,
        avail: Area<'a>,
        used: Area<'a>,
    ) -> Self {
        let size = q.size();
        let next_avail = Wrapping(q.next_avail());
        let next_used = Wrapping(q.next_used());
        Self {
            mem,
            desc,
            avail,
            used,
            size,
            next_avail,
            avail_idx: next_avail,
            next_used,
            published: next_used,
            shadow: [[0; 8]; PUBLISH_EVERY as usize],
            region: None,
        }
    }

    /// Publishes the used index and hands the ring positions back to `q`.
    /// Returns the used index.
    pub(crate) fn finish(mut self, q: &mut Queue) -> u16 {
        self.publish();
        q.set_next_avail(self.next_avail.0);
        q.set_next_used(self.next_used.0);
        self.next_used.0
    }

    /// Writes the shadowed used entries to the ring, then the used index.
    fn publish(&mut self) {
        let n = (self.next_used - self.published).0;
        if n == 0 {
            return;
        }
        let mut slot = self.published.0 & (self.size - 1);
        let mut done = 0u16;
        while done < n {
            // Up to the ring's end, then from its start.
            let run = (n - done).min(self.size - slot);
            let entries = &self.shadow[usize::from(done)..usize::from(done + run)];
            self.used
                .write(self.mem, entries.as_flattened(), 4 + 8 * usize::from(slot));
            done += run;
            slot = 0;
        }
        // Release: the used elements and the buffers' contents are visible
        // before the index that hands them to the driver.
        self.used
            .store_u16(self.mem, 2, self.next_used.0, Ordering::Release);
        self.published = self.next_used;
    }

    /// Reads the driver's avail index: whether entries wait past the
    /// device's position. `Err` when the index runs more than a ring ahead
    /// of the device (the driver published entries it cannot have filled;
    /// virtio-queue refuses such a ring in the same way) or cannot be read:
    /// nothing may be popped then. The daemon's one avail-index check.
    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn refresh_avail(&mut self) -> Result<bool, RingStop> {
        let idx = Wrapping(
            self.avail
                .load_u16(self.mem, 2, Ordering::Acquire)
                .ok_or(RingStop::AvailUnreadable)?,
        );
        if (idx - self.next_avail).0 > self.size {
            return Err(RingStop::AvailJump);
        }
        self.avail_idx = idx;
        Ok(idx != self.next_avail)
    }

    /// The head of the next available chain: `Ok(None)` when there is
    /// none; `Err` as [`RingView::refresh_avail`] (nothing is popped then).
    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn pop_head(&mut self) -> Result<Option<u16>, RingStop> {
        if self.next_avail == self.avail_idx && !self.refresh_avail()? {
            return Ok(None);
        }
        let slot = usize::from(self.next_avail.0 & (self.size - 1));
        let head = self
            .avail
            .load_u16(self.mem, 4 + 2 * slot, Ordering::Relaxed)
            .ok_or(RingStop::AvailUnreadable)?;
        self.next_avail += Wrapping(1);
        Ok(Some(head))
    }

    /// Gives back the last `n` popped heads.
    #[inline]
    pub(crate) fn unpop(&mut self, n: usize) {
        self.next_avail -= Wrapping(n as u16);
    }

    /// The avail index as last read, and the device's position in it.
    #[inline]
    pub(crate) fn positions(&self) -> (u16, u16) {
        (self.avail_idx.0, self.next_avail.0)
    }

    /// Whether the next [`RingView::push_used`] publishes the used index.
    #[inline]
    pub(crate) fn publishes_next(&self) -> bool {
        (self.next_used - self.published).0 + 1 >= PUBLISH_EVERY
    }

    /// Adds the used entry (`head`, `len`) to the shadow, publishing every
    /// [`PUBLISH_EVERY`].
    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn push_used(&mut self, head: u16, len: u32) {
        let i = usize::from((self.next_used - self.published).0);
        let e = &mut self.shadow[i];
        e[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        e[4..].copy_from_slice(&len.to_le_bytes());
        self.next_used += Wrapping(1);
        if i + 1 >= usize::from(PUBLISH_EVERY) {
            self.publish();
        }
    }

    /// Descriptor `head` of the table, read from host memory; `None` when
    /// the table lies across regions (reached by guest address) or `head`
    /// is outside it: the chain walker then reads it, and names the fault.
    #[inline]
    pub(crate) fn host_desc(&self, head: u16) -> Option<Descriptor> {
        match &self.desc {
            Area::Host(t) if head < self.size => {
                t.read_obj::<Descriptor>(16 * usize::from(head)).ok()
            }
            _ => None,
        }
    }

    /// Host memory of `len` bytes at `addr` when they lie in one region.
    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn buffer(
        &mut self,
        addr: GuestAddress,
        len: usize,
    ) -> Option<VolatileSlice<'a, ()>> {
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

/// Whether the driver wants a used-buffer notification after the used
/// index moved from `old` to the queue's `next_used`: with
/// VIRTIO_F_EVENT_IDX, when `used_event` lies in that window; without it,
/// unless the driver set `VRING_AVAIL_F_NO_INTERRUPT` (a polling driver
/// does: each interrupt it did not ask for is an eventfd write on the
/// device's side and a wake-up on its own). The one notification rule of
/// both directions, applied once per batch after [`RingView::finish`]
/// (the ring path leaves virtio-queue's `num_added` alone, so
/// `Queue::needs_notification`, which also ignores the flag, would not
/// know the batch).
pub(crate) fn needs_notification<M: GuestMemory>(q: &Queue, mem: &M, old: u16) -> bool {
    // The used index and elements are written before the driver's wishes
    // are read.
    fence(Ordering::SeqCst);
    if !q.event_idx_enabled() {
        let flags = mem.load::<u16>(GuestAddress(q.avail_ring()), Ordering::Relaxed);
        return flags.map_or(true, |f| {
            u16::from_le(f) & VRING_AVAIL_F_NO_INTERRUPT as u16 == 0
        });
    }
    let new = Wrapping(q.next_used());
    let Some(addr) = used_event_addr(q) else {
        return true;
    };
    let Ok(ev) = mem.load::<u16>(addr, Ordering::Relaxed) else {
        return true;
    };
    let ev = Wrapping(u16::from_le(ev));
    (new - ev - Wrapping(1)) < (new - Wrapping(old))
}

/// Spins for up to `window` until the driver's avail index of `q` moves
/// from `seen` (`--poll-us`: more tx chains, or rx buffers for frames that
/// found none); true when it did. `seen`: the index the batch last read
/// (an rx ring may still hold buffers too few for a frame: only new ones
/// end the spin); `mem`: the memory the batch used.
pub(crate) fn poll_avail<M: GuestMemory>(q: &Queue, mem: &M, seen: u16, window: Duration) -> bool {
    let start = Instant::now();
    let seen = Wrapping(seen);
    loop {
        match q.avail_idx(mem, Ordering::Acquire) {
            Ok(i) if i != seen => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        if start.elapsed() >= window {
            return false;
        }
        // Give the CPU up at each turn: where the driver's thread (a TCG
        // vCPU, a test frontend) shares this CPU, keeping it would starve
        // the thread that adds the entry this spin waits for (found by
        // tests/poll.rs's burst test: 0 of 15 spins found in some runs).
        // Alone on its CPU the call returns at once.
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;

    /// Shadowed used entries land in their slots across the ring's end,
    /// and the index follows them, on both ways of reaching the ring.
    #[test]
    fn shadowed_used_entries_wrap_around_the_ring() {
        for by_address in [false, true] {
            let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
            let mq = MockSplitQueue::new(&m, 16);
            let mut q: Queue = mq.create_queue().unwrap();
            q.set_next_used(10);
            let mut r = if by_address {
                RingView::open_by_address(&q, &m)
            } else {
                RingView::open(&q, &m)
            }
            .unwrap();
            for i in 0..12u16 {
                r.push_used(100 + i, 1000 + u32::from(i));
            }
            let idx: u16 = m.read_obj(mq.used_addr().unchecked_add(2)).unwrap();
            assert_eq!(idx, 0, "nothing published before the burst ends");
            assert_eq!(r.finish(&mut q), 22);
            let idx: u16 = m.read_obj(mq.used_addr().unchecked_add(2)).unwrap();
            assert_eq!(idx, 22);
            for i in 0..12u16 {
                let slot = u64::from((10 + i) % 16);
                let at = mq.used_addr().unchecked_add(4 + 8 * slot);
                let id: u32 = m.read_obj(at).unwrap();
                let len: u32 = m.read_obj(at.unchecked_add(4)).unwrap();
                assert_eq!(
                    (id, len),
                    (100 + u32::from(i), 1000 + u32::from(i)),
                    "entry {i}"
                );
            }
        }
    }

    #[test]
    fn poll_avail_waits_for_an_entry_and_no_longer_than_asked() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let mq = MockSplitQueue::new(&m, 16);
        let q: Queue = mq.create_queue().unwrap();
        // Nothing available: it gives up after the time asked.
        let t = Instant::now();
        assert!(!poll_avail(&q, &m, 0, Duration::from_micros(300)));
        assert!(t.elapsed() >= Duration::from_micros(300));
        // An entry available: found at once.
        mq.build_desc_chain(&[RawDescriptor::from(SplitDescriptor::new(
            0x8000,
            64,
            VRING_DESC_F_WRITE as u16,
            0,
        ))])
        .unwrap();
        let t = Instant::now();
        assert!(poll_avail(&q, &m, 0, Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
