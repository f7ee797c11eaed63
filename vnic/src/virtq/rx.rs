//! Filling rx chains (with `VIRTIO_NET_F_MRG_RXBUF`).
//!
//! One delivery algorithm, [`deliver`], over the one ring path,
//! [`RxRing`]: a batch view of a split ring ([`RingView`], resolved once
//! per batch). [`RxBatch`] is what a worker holds for one batch of
//! deliveries: at the end it publishes the batch and decides on one
//! used-buffer notification.

use std::num::Wrapping;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vhost_user_backend::VringState;
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, Permissions, VolatileSlice,
};

use super::chain::Chain as Walk;
use super::ring::{needs_notification, poll_avail, RingView};
use super::stores::StoreChoice;
use super::{Mem, RingStop, NET_HDR_LEN};
use crate::config::RxStores;

/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_OFF: usize = 10;
/// Most rx chains one frame may span.
pub(crate) const MAX_BUFS_PER_FRAME: usize = 64;

/// What became of a frame offered to an rx queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxOutcome {
    /// Written into `buffers` chains and published in the used ring.
    Delivered { buffers: u16 },
    /// The ring ran out of buffers: nothing was published (chains put back).
    NoBuffers,
    /// The frame needs more chains than allowed (or one chain without MRG_RXBUF).
    TooBig,
}

/// A chain that cannot be used: a descriptor outside guest memory or
/// read-only, a broken link or loop, a bad indirect table, no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BadChain;

/// Writes `pkt` (12-byte virtio-net header space followed by the frame)
/// into rx chains of `r`. The header is written as all zero except
/// `num_buffers`. `bad` is incremented for each unusable chain (consumed
/// with length 0; the frame then starts over on the next chain). Used-ring
/// entries are added but the guest is not notified: the caller decides on
/// one notification per batch ([`needs_notification`]).
#[inline]
pub(crate) fn deliver(r: &mut RxRing<'_>, pkt: &mut [u8], mrg: bool, bad: &mut u64) -> RxOutcome {
    debug_assert!(pkt.len() >= NET_HDR_LEN);
    pkt[..NET_HDR_LEN].fill(0);
    // num_buffers = 1 is the common case, patched later when more are used.
    pkt[NUM_BUFFERS_OFF] = 1;
    if let Some(out) = r.deliver_single(pkt) {
        return out;
    }
    walk(r, pkt, mrg, bad)
}

/// [`deliver`] for any chain: walks the chains it takes (`pkt`'s header
/// already written). Out of line: inlined, its state made every frame's
/// call save and restore more registers.
#[inline(never)]
fn walk(r: &mut RxRing<'_>, pkt: &[u8], mrg: bool, bad: &mut u64) -> RxOutcome {
    let total = pkt.len();
    let max_bufs = if mrg { MAX_BUFS_PER_FRAME } else { 1 };
    // (head, bytes written) of the chains taken for this frame, in order:
    // r.used[..nused] (kept in the ring view, not built per frame).
    let mut nused = 0usize;
    let mut nb_addr: [Option<GuestAddress>; 2] = [None, None];
    let mut off = 0usize;
    while off < total {
        if nused == max_bufs {
            r.unpop(nused);
            return RxOutcome::TooBig;
        }
        let Some(head) = r.pop() else {
            r.unpop(nused);
            return RxOutcome::NoBuffers;
        };
        let start = off;
        let res = r.fill(head, pkt, &mut off, &mut nb_addr);
        // The first chain must at least hold the whole header; every
        // chain must take some of the frame.
        let ok = res.is_ok() && off != start && !(nused == 0 && off < NET_HDR_LEN.min(total));
        if !ok {
            // Unusable chain. Give back what was already taken for this
            // frame as zero-length completions first (used-ring order must
            // stay the pop order), then the bad chain, and start over.
            *bad += 1;
            for i in 0..nused {
                r.add_used(r.used.get(i, nused).0, 0);
            }
            r.add_used(head, 0);
            nused = 0;
            nb_addr = [None, None];
            off = 0;
            continue;
        }
        r.used.push(nused, (head, (off - start) as u32));
        nused += 1;
    }
    if nused > 1 {
        let nb = (nused as u16).to_le_bytes();
        for (i, a) in nb_addr.iter().enumerate() {
            if let Some(a) = a {
                r.write(&nb[i..=i], *a);
            }
        }
    }
    for i in 0..nused {
        let (h, len) = r.used.get(i, nused);
        r.add_used(h, len);
    }
    RxOutcome::Delivered {
        buffers: nused as u16,
    }
}

/// The chains taken for one frame: 8 inline, more on the heap. One per
/// ring view, reused frame after frame (built per frame, its zeroing cost
/// ~30-40 instructions a frame).
#[derive(Default)]
struct Used {
    small: [(u16, u32); 8],
    big: Vec<(u16, u32)>,
}

impl Used {
    fn push(&mut self, n: usize, e: (u16, u32)) {
        if n < self.small.len() {
            self.small[n] = e;
        } else {
            if n == self.small.len() {
                self.big.clear();
                self.big.extend_from_slice(&self.small);
            }
            self.big.push(e);
        }
    }

    /// Entry `i` of a frame that took `n` (> `i`) chains: once a frame
    /// takes more than `small` holds, `big` has them all.
    #[inline]
    fn get(&self, i: usize, n: usize) -> (u16, u32) {
        let all = if n <= self.small.len() {
            &self.small[..]
        } else {
            &self.big[..]
        };
        all.get(i).copied().unwrap_or_default()
    }
}

/// The one path into an rx ring: a view of the split ring for one batch
/// of frames ([`RingView`]: rings resolved once per batch, the avail
/// index read once per batch, used entries written as frames are delivered
/// and the used index published every [`super::ring::PUBLISH_EVERY`]
/// entries and at [`RxRing::finish`]). Per frame this costs no
/// guest-memory region lookup except one range check per descriptor
/// buffer (against the last region used). Small pieces of frames are
/// copied into their buffers a burst at a time ([`Stage`]).
///
/// The caller holds the vring's lock from [`RxRing::open`] to
/// [`RxRing::finish`] and decides on notifications with
/// [`needs_notification`] (see [`RingView`]). Frames go in through
/// [`deliver`].
pub(crate) struct RxRing<'a> {
    r: RingView<'a>,
    stage: Stage<'a>,
    /// The chains of the frame being delivered (see [`deliver`]).
    used: Used,
}

/// Whether the frame's first buffer `buf` already holds the virtio-net
/// header `src` starts with, in cache lines of its own: the frame's data
/// then starts at a line boundary (a driver that puts the header in the
/// headroom before its packet data, as DPDK's virtio PMD does). Then the
/// header is not written again (as DPDK's vhost library does with
/// `ASSIGN_UNLESS_EQUAL`): its line is read, never taken from the driver's
/// CPU for writing. When the header shares a line with the data, the line
/// is written anyway and the header goes with it, unread.
///
/// With the data at a line boundary the header starts 4 bytes past an
/// 8-byte boundary, so it is read as one aligned `u32` and one aligned
/// `u64` (two loads, where a copy of 12 bytes was a call to `memcpy`).
#[inline]
fn header_holds(buf: VolatileSlice<'_, ()>, src: &[u8]) -> bool {
    let data = buf.ptr_guard().as_ptr() as usize + NET_HDR_LEN;
    if !data.is_multiple_of(64) || src.len() < NET_HDR_LEN {
        return false;
    }
    let (Ok(head), Ok(tail)) = (
        buf.load::<u32>(0, Ordering::Relaxed),
        buf.load::<u64>(4, Ordering::Relaxed),
    ) else {
        return false;
    };
    let want_head = u32::from_ne_bytes([src[0], src[1], src[2], src[3]]);
    let want_tail = u64::from_ne_bytes([
        src[4], src[5], src[6], src[7], src[8], src[9], src[10], src[11],
    ]);
    head == want_head && tail == want_tail
}

/// Pieces of at most this many bytes are staged (see [`Stage`]).
const STAGE_PIECE: usize = 128;
/// Staged pieces at most.
const STAGE_SLOTS: usize = 32;

/// Small frame pieces waiting to be copied into guest memory together.
///
/// A copy into a guest buffer stores to cache lines the driver's CPU
/// last held; each store waits for its line. Made one frame at a time,
/// between the parsing and steering of the next frames, those waits stall
/// the worker one after another; made back to back for a burst of frames,
/// they overlap. The destination lines are not prefetched: a PREFETCHW
/// of each piece as it was staged measured level or slower once the
/// header was left in place, with testpmd's virtio PMD as the driver
/// (which reads each frame's first line for its multicast count), so it
/// was taken out (vnic/BENCH.md). Pieces are copied in the order they
/// were staged, and always before the used index that hands their chains
/// to the driver is published, and before any other write into guest
/// memory made by this ring (a large piece, a `num_buffers` field), so that what the driver
/// sees is what the one-by-one copies would have left.
struct Stage<'a> {
    data: [[u8; STAGE_PIECE]; STAGE_SLOTS],
    dst: [Option<(VolatileSlice<'a, ()>, u8)>; STAGE_SLOTS],
    n: usize,
    /// Whether whole lines may be streamed ([`write_piece`]); the worker's
    /// [`StoreChoice`] sets it per batch.
    stream: bool,
}

impl<'a> Stage<'a> {
    fn new() -> Self {
        Self {
            data: [[0; STAGE_PIECE]; STAGE_SLOTS],
            dst: [None; STAGE_SLOTS],
            n: 0,
            stream: true,
        }
    }

    /// Stages `src` (at most [`STAGE_PIECE`] bytes) for `dst`; copies
    /// what was staged first when it is full.
    #[inline]
    fn push(&mut self, dst: VolatileSlice<'a, ()>, src: &[u8]) {
        if self.n == STAGE_SLOTS {
            self.flush();
        }
        let i = self.n;
        self.data[i][..src.len()].copy_from_slice(src);
        self.dst[i] = Some((dst, src.len() as u8));
        self.n += 1;
    }

    /// Copies every staged piece into guest memory, in order (see
    /// [`write_piece`]); the streamed lines are ordered before every later
    /// store of the worker (the used index that hands them over) by one
    /// store fence at the end.
    #[inline]
    fn flush(&mut self) {
        let mut streamed = false;
        for i in 0..self.n {
            if let Some((dst, len)) = self.dst[i].take() {
                streamed |= write_piece(dst, &self.data[i][..usize::from(len)], self.stream);
            }
        }
        if streamed {
            store_fence();
        }
        self.n = 0;
    }
}

/// Writes `src` at the start of `dst` (which is at least as long). With
/// `stream`, the whole cache lines of a piece that starts at a line
/// boundary are written with non-temporal stores, the rest with a plain
/// copy (without, all of it is copied plainly); returns whether
/// any line was streamed (a [`store_fence`] must then come before the
/// stores that publish it).
///
/// A plain store into a line the driver's CPU holds (testpmd's virtio PMD
/// reads each frame's first line for its multicast count; a kernel driver
/// reads the whole frame) first takes the line from that CPU and then
/// writes it; a non-temporal store of the whole line takes nothing: it
/// invalidates the other copies and writes the line to memory, as a NIC's
/// DMA does. With the two CPUs far apart on the host (a ~300 ns line round
/// trip), taking the lines back was half of the worker's time (perf,
/// vnic/BENCH.md).
#[inline]
fn write_piece(dst: VolatileSlice<'_, ()>, src: &[u8], stream: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let whole = src.len() & !63;
        let p = dst.ptr_guard_mut().as_ptr();
        if stream && whole > 0 && (p as usize).is_multiple_of(64) && dst.len() >= src.len() {
            for (n, line) in src[..whole].chunks_exact(64).enumerate() {
                // Casts: `_mm_loadu_si128` takes any alignment; the
                // stream target's alignment is argued below.
                #[allow(clippy::cast_ptr_alignment)]
                // SAFETY: SSE2 is part of x86_64. The four 16-byte targets
                // `p + 64 n + 16 k` (k < 4) are 16-byte aligned (p is
                // 64-byte aligned) and lie in `dst` (64 n + 64 <= whole <=
                // src.len() <= dst.len()), guest memory that stays mapped
                // while the slice's borrow lives; the guest may touch it
                // at the same time, as it may during any copy into its
                // buffers. The sources are the line's four 16-byte
                // quarters (unaligned loads).
                unsafe {
                    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
                    let from = line.as_ptr().cast::<__m128i>();
                    let to = p.add(64 * n).cast::<__m128i>();
                    let q0 = _mm_loadu_si128(from);
                    let q1 = _mm_loadu_si128(from.add(1));
                    let q2 = _mm_loadu_si128(from.add(2));
                    let q3 = _mm_loadu_si128(from.add(3));
                    _mm_stream_si128(to, q0);
                    _mm_stream_si128(to.add(1), q1);
                    _mm_stream_si128(to.add(2), q2);
                    _mm_stream_si128(to.add(3), q3);
                }
            }
            if whole < src.len() {
                if let Ok(tail) = dst.offset(whole) {
                    tail.copy_from(&src[whole..]);
                }
            }
            return true;
        }
    }
    dst.copy_from(src);
    false
}

/// Orders the non-temporal stores made so far before every later store
/// (SFENCE); they are weakly ordered otherwise.
#[inline]
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64; a fence reads and writes no memory.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

impl<'a> RxRing<'a> {
    /// Resolves the rings of `q`; `None` when the queue is not ready
    /// (see [`RingView::open`]).
    pub(crate) fn open(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        RingView::open(q, mem).map(Self::on)
    }

    /// As [`RxRing::open`], every ring area reached by guest address.
    #[cfg(test)]
    fn open_by_address(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        RingView::open_by_address(q, mem).map(Self::on)
    }

    fn on(r: RingView<'a>) -> Self {
        Self {
            r,
            stage: Stage::new(),
            used: Used::default(),
        }
    }

    /// Copies the staged pieces, publishes the used index and hands the
    /// ring positions back to `q`. Returns the used index.
    pub(crate) fn finish(mut self, q: &mut Queue) -> u16 {
        self.stage.flush();
        self.r.finish(q)
    }

    /// The head of the next available chain, if any.
    // Per-frame path: with #[inline] alone it stayed out of line once two
    // paths called it (~17 instructions a frame of saves and restores).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn pop_head(&mut self) -> Option<u16> {
        match self.r.pop_head() {
            // No descriptor prefetch ahead: paired vnic-bench runs (RX 64 B,
            // 1 pair, against 6434693) read 0.91-0.94 with it and 0.98-1.00
            // without it (BENCH.md).
            Ok(h) => h,
            Err(e) => {
                let (idx, next) = self.r.positions();
                log::debug!("rx ring: {e} (avail idx {idx}, device at {next})");
                None
            }
        }
    }

    #[inline]
    fn fill_chain(
        &mut self,
        head: u16,
        src: &[u8],
        off: &mut usize,
        nb: &mut [Option<GuestAddress>; 2],
    ) -> Result<(), BadChain> {
        let total = src.len();
        let mut chain = Walk::in_ring(self.r.mem, self.r.desc, self.r.size, head);
        let mut bytes = 0u32;
        while let Some(d) = chain.next_buffer().map_err(|_| BadChain)? {
            if !d.is_write_only() {
                return Err(BadChain);
            }
            bytes = bytes.checked_add(d.len()).ok_or(BadChain)?;
            let len = d.len() as usize;
            let n = len.min(total - *off);
            if let Some(buf) = self.r.buffer(d.addr(), len) {
                let (buf, piece) = if *off == 0 && n > NET_HDR_LEN && header_holds(buf, src) {
                    // The header's line stays the driver's (see header_holds).
                    match buf.offset(NET_HDR_LEN) {
                        Ok(rest) => (rest, &src[NET_HDR_LEN..n]),
                        Err(_) => (buf, &src[..n]),
                    }
                } else {
                    (buf, &src[*off..*off + n])
                };
                if !piece.is_empty() && piece.len() <= STAGE_PIECE {
                    self.stage.push(buf, piece);
                } else if !piece.is_empty() {
                    self.stage.flush();
                    buf.copy_from(piece);
                }
            } else {
                self.stage.flush();
                // Outside guest memory, or across regions: check (and
                // write) it piece by piece.
                let mut done = 0usize;
                let slices = GuestMemory::get_slices(self.r.mem, d.addr(), len, Permissions::Write)
                    .map_err(|_| BadChain)?;
                for slice in slices {
                    let slice = slice.map_err(|_| BadChain)?;
                    let k = slice.len().min(n.saturating_sub(done));
                    if k > 0 {
                        slice.copy_from(&src[*off + done..*off + done + k]);
                    }
                    done += slice.len();
                }
                if done != len {
                    return Err(BadChain);
                }
            }
            if n > 0 {
                if *off == 0 && n > NUM_BUFFERS_OFF + 1 {
                    // The usual first buffer: both bytes in it.
                    *nb = [
                        d.addr().checked_add(NUM_BUFFERS_OFF as u64),
                        d.addr().checked_add(NUM_BUFFERS_OFF as u64 + 1),
                    ];
                } else if *off <= NUM_BUFFERS_OFF + 1 {
                    for (i, slot) in nb.iter_mut().enumerate() {
                        let b = NUM_BUFFERS_OFF + i;
                        if slot.is_none() && b >= *off && b < *off + n {
                            *slot = d.addr().checked_add((b - *off) as u64);
                        }
                    }
                }
                *off += n;
            }
        }
        Ok(())
    }
}

impl RxRing<'_> {
    /// The common frame: the next chain is one writable descriptor (no
    /// `NEXT`, not indirect) whose buffer holds the whole frame and lies
    /// in one region (what virtio-net drivers post with mergeable rx
    /// buffers). It is written and its used entry added as [`deliver`]'s
    /// walk would, without the walk. `None`: nothing was taken (any other
    /// chain, or one whose checks fail); the walk then takes the same
    /// chain.
    #[inline]
    fn deliver_single(&mut self, pkt: &[u8]) -> Option<RxOutcome> {
        let Some(head) = self.pop() else {
            return Some(RxOutcome::NoBuffers);
        };
        let total = pkt.len();
        let buf = self
            .r
            .host_desc(head)
            .filter(|d| {
                d.flags() & (VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT) as u16 == 0
                    && d.is_write_only()
                    && d.len() as usize >= total
            })
            .and_then(|d| self.r.buffer(d.addr(), d.len() as usize));
        let Some(buf) = buf else {
            self.unpop(1);
            return None;
        };
        let (buf, piece) = if total > NET_HDR_LEN && header_holds(buf, pkt) {
            // The header's line stays the driver's (see header_holds).
            match buf.offset(NET_HDR_LEN) {
                Ok(rest) => (rest, &pkt[NET_HDR_LEN..]),
                Err(_) => (buf, pkt),
            }
        } else {
            (buf, pkt)
        };
        if piece.len() <= STAGE_PIECE {
            self.stage.push(buf, piece);
        } else {
            self.stage.flush();
            buf.copy_from(piece);
        }
        self.add_used(head, total as u32);
        Some(RxOutcome::Delivered { buffers: 1 })
    }

    /// Takes the next available chain (its head); `None` when the ring
    /// holds no more.
    #[inline]
    fn pop(&mut self) -> Option<u16> {
        self.pop_head()
    }

    /// Puts back the last `n` chains taken.
    #[inline]
    fn unpop(&mut self, n: usize) {
        self.r.unpop(n);
    }

    /// Writes `src[*off..]` into the chain at `head` from its start,
    /// advancing `*off`, and validates the whole chain even when the frame
    /// ends early. `nb`: guest addresses of the two `num_buffers` bytes,
    /// recorded where they are written.
    #[inline]
    fn fill(
        &mut self,
        head: u16,
        src: &[u8],
        off: &mut usize,
        nb: &mut [Option<GuestAddress>; 2],
    ) -> Result<(), BadChain> {
        self.fill_chain(head, src, off, nb)
    }

    /// Adds a used-ring entry (published every
    /// [`super::ring::PUBLISH_EVERY`] and at [`RxRing::finish`]).
    #[inline]
    fn add_used(&mut self, head: u16, len: u32) {
        if self.r.publishes_next() {
            self.stage.flush();
        }
        self.r.push_used(head, len);
    }

    /// Writes `bytes` at guest address `at`.
    #[inline]
    fn write(&mut self, bytes: &[u8], at: GuestAddress) {
        self.stage.flush();
        let _ = self.r.mem.write_slice(bytes, at);
    }
}

/// What a worker's rx batches carry from one to the next: the state of
/// the driver's kicks and the worker's [`StoreChoice`].
///
/// Kicks: the device needs no kick to use rx buffers while it is at work
/// (it takes them as frames come), so kicks are off
/// (`VRING_USED_F_NO_NOTIFY`; with EVENT_IDX, `avail_event` is left
/// behind) from the first batch on, and turned on only when the ring runs
/// out of buffers, with the usual re-check of the avail index after
/// turning them on ([`RxBatch::finish`]); the next batch turns them off
/// again. A polling driver otherwise writes the kick eventfd after every
/// refill.
#[derive(Default)]
pub(crate) struct RxCarry {
    /// Kicks were turned off under this restart count of the ring (a
    /// restarted ring starts with them on).
    off: Option<u32>,
    /// Avail index at the last retry after kicks were turned on again.
    retry_avail: Option<Wrapping<u16>>,
    /// Streamed or plain stores for the next batches.
    store: StoreChoice,
}

impl RxCarry {
    /// A worker's state, its stores as `--rx-stores` asks.
    pub(crate) fn new(stores: RxStores) -> Self {
        Self {
            store: StoreChoice::new(stores),
            ..Self::default()
        }
    }

    /// Whether the worker's next rx batches stream whole lines.
    pub(crate) fn streams(&self) -> bool {
        self.store.stream()
    }

    /// The store mode changes since the last call ([`StoreChoice`]).
    pub(crate) fn take_switches(&mut self) -> u64 {
        self.store.take_switches()
    }
}

/// A worker's rx queue during one batch of deliveries (taken with the
/// vring's lock held for the whole batch): the ring view while the queue
/// is enabled, started and not stopped by the device.
pub(crate) struct RxBatch<'m> {
    vring: &'m mut VringState<Mem>,
    mem: &'m GuestMemoryMmap,
    /// The ring view; `None` when the queue is not enabled, not started or
    /// stopped by the device (set at open, taken by [`RxBatch::check_avail`]
    /// when the driver broke the ring).
    ring: Option<RxRing<'m>>,
    /// Used index when the batch started: the notification window.
    start_used: u16,
    /// The clock is read at the batch's end for the [`StoreChoice`]
    /// ([`RxBatch::time_stores`]).
    timed: bool,
}

impl<'m> RxBatch<'m> {
    /// Opens a batch; `stopped`: the device stopped this ring (frames for
    /// it are dropped as for a disabled queue); `restarts`: the frontend's
    /// restart count of the ring (see [`RxCarry`]).
    pub(crate) fn open(
        vring: &'m mut VringState<Mem>,
        mem: &'m GuestMemoryMmap,
        stopped: bool,
        carry: &mut RxCarry,
        restarts: u32,
    ) -> Self {
        let on = !stopped && vring.is_enabled();
        let q = vring.get_queue();
        let start_used = q.next_used();
        let mut ring = if on { RxRing::open(q, mem) } else { None };
        if let Some(r) = &mut ring {
            r.stage.stream = carry.store.stream();
        }
        if ring.is_some() && carry.off != Some(restarts) {
            match vring.disable_notification() {
                Ok(()) => carry.off = Some(restarts),
                Err(e) => log::debug!("rx disable_notification: {e}"),
            }
        }
        Self {
            vring,
            mem,
            ring,
            start_used,
            timed: false,
        }
    }

    /// Has the clock read at this batch's end for the worker's
    /// [`StoreChoice`] if it is the one rx batch in `CHOICE_SAMPLE`
    /// (called for batches of the rx path only, so that the reads come at
    /// a steady pace of rx batches; a tx batch's frames are counted all
    /// the same).
    pub(crate) fn time_stores(&mut self, carry: &mut RxCarry) {
        self.timed = self.ring.is_some() && carry.store.sample();
    }

    /// Whether the queue is enabled and started.
    #[inline]
    pub(crate) fn ready(&self) -> bool {
        self.ring.is_some()
    }

    /// Reads the driver's avail index ([`RingView::refresh_avail`]):
    /// whether buffers wait past the device's position. `Err`: the ring
    /// must be stopped, and this batch delivers nothing on it (it reads as
    /// not [`RxBatch::ready`]).
    pub(crate) fn check_avail(&mut self) -> Result<bool, RingStop> {
        let Some(r) = &mut self.ring else {
            return Ok(false);
        };
        r.r.refresh_avail().inspect_err(|_| {
            if let Some(r) = self.ring.take() {
                // Nothing was popped: the positions stay as they were.
                r.finish(self.vring.get_queue_mut());
            }
        })
    }

    /// Delivers `pkt` (header space + frame) on this queue (see
    /// [`deliver`]); the caller has checked [`RxBatch::ready`] (a queue
    /// that is not reads as having no buffers).
    #[inline]
    pub(crate) fn deliver(&mut self, pkt: &mut [u8], mrg: bool, bad: &mut u64) -> RxOutcome {
        match &mut self.ring {
            Some(r) => deliver(r, pkt, mrg, bad),
            None => RxOutcome::NoBuffers,
        }
    }

    /// Ends the batch: publishes what it added, interrupts the driver if
    /// it asked for it (`added`: the batch used chains), and when a frame
    /// found the queue out of buffers (`nobufs`) waits for the driver to
    /// add some: spins for up to `spin` with kicks still off (`--poll-us`;
    /// the used index is already published, so the driver can take the
    /// frames and refill while the worker spins), then asks the driver for
    /// a kick. With EVENT_IDX, buffers the driver added before it saw the
    /// new `avail_event` raise no kick: [`RxEnd::again`] then (kept by
    /// [`RxCarry`] to once per avail index: a ring holding too few buffers
    /// for the frame also reads as "more arrived", and must not spin).
    pub(crate) fn finish(
        mut self,
        pair: usize,
        added: bool,
        nobufs: bool,
        carry: &mut RxCarry,
        spin: Duration,
    ) -> RxEnd {
        let ready = self.ring.is_some();
        // The avail index as the batch last read it.
        let mut seen = 0;
        if let Some(r) = self.ring.take() {
            seen = r.r.positions().0;
            let used = r.finish(self.vring.get_queue_mut());
            carry.store.delivered(used.wrapping_sub(self.start_used));
            if self.timed {
                carry.store.tick(Instant::now());
            }
        }
        let rx = &mut *self.vring;
        if added {
            let r = needs_notification(rx.get_queue(), self.mem, self.start_used);
            log::trace!(
                "pair {pair}: rx used {} needs_notification {r:?} call {}",
                rx.get_queue().next_used(),
                rx.get_call().is_some()
            );
            if r {
                if let Err(e) = rx.signal_used_queue() {
                    log::debug!("pair {pair}: rx signal: {e}");
                }
            }
        }
        let mut end = RxEnd::default();
        if !(nobufs && ready) {
            return end;
        }
        // The ring ran dry now: the start of the gap the spin adapts to.
        let dry = if spin.is_zero() {
            None
        } else {
            let start = Instant::now();
            let found = poll_avail(rx.get_queue(), self.mem, seen, spin);
            end.spun = Some((start.elapsed(), found));
            if found {
                end.again = true;
                return end;
            }
            Some(start)
        };
        let on = rx.enable_notification();
        if on.is_ok() {
            carry.off = None;
        }
        match on {
            Ok(false) => {}
            Ok(true) => {
                let avail = rx.get_queue().avail_idx(self.mem, Ordering::Acquire).ok();
                if avail.is_some() && avail != carry.retry_avail {
                    carry.retry_avail = avail;
                    end.again = true;
                    return end;
                }
            }
            Err(e) => {
                log::debug!("pair {pair}: rx enable_notification: {e}");
                return end;
            }
        }
        end.slept_from = Some(dry.unwrap_or_else(Instant::now));
        end
    }
}

/// How an rx batch ended ([`RxBatch::finish`]).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RxEnd {
    /// The worker must come back at once: buffers arrived during the spin,
    /// or before the driver could see that kicks are on again.
    pub(crate) again: bool,
    /// The spin for buffers: how long it took, whether it found some.
    pub(crate) spun: Option<(Duration, bool)>,
    /// Kicks are on and the worker waits for one: the queue ran out of
    /// buffers at this instant (before the spin).
    pub(crate) slept_from: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtq::ring::PUBLISH_EVERY;
    use virtio_bindings::bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{
        GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress,
    };

    const BUF: u64 = 0x10_0000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap()
    }

    /// Posts `n` single-descriptor writable chains of `size` bytes.
    fn post(mq: &MockSplitQueue<'_, GuestMemoryMmap>, n: u16, size: u32) {
        let descs: Vec<RawDescriptor> = (0..n)
            .map(|i| {
                RawDescriptor::from(SplitDescriptor::new(
                    BUF + u64::from(i) * 0x1000,
                    size,
                    VRING_DESC_F_WRITE as u16,
                    0,
                ))
            })
            .collect();
        let mut chains = Vec::new();
        for d in descs {
            chains.push(vec![d]);
        }
        mq.build_multiple_desc_chains(&chains.concat()).unwrap();
    }

    type DeliverFn = fn(&mut Queue, &GuestMemoryMmap, &mut [u8], bool, &mut u64) -> RxOutcome;

    /// One frame through the ring view, its areas in host memory: a batch
    /// of one.
    fn host(
        q: &mut Queue,
        m: &GuestMemoryMmap,
        pkt: &mut [u8],
        mrg: bool,
        bad: &mut u64,
    ) -> RxOutcome {
        let mut r = RxRing::open(q, m).expect("rings resolve");
        let out = deliver(&mut r, pkt, mrg, bad);
        r.finish(q);
        out
    }

    /// One frame through the ring view, its areas reached by guest address
    /// (a ring a guest placed across regions): a batch of one.
    fn by_address(
        q: &mut Queue,
        m: &GuestMemoryMmap,
        pkt: &mut [u8],
        mrg: bool,
        bad: &mut u64,
    ) -> RxOutcome {
        let mut r = RxRing::open_by_address(q, m).expect("ready");
        let out = deliver(&mut r, pkt, mrg, bad);
        r.finish(q);
        out
    }

    /// Both ways of reaching the ring's areas under the one path.
    const PATHS: [(&str, DeliverFn); 2] = [("by address", by_address), ("host", host)];

    fn used_idx(m: &GuestMemoryMmap, mq: &MockSplitQueue<'_, GuestMemoryMmap>) -> u16 {
        m.read_obj::<u16>(mq.used_addr().checked_add(2).unwrap())
            .unwrap()
    }

    fn used(m: &GuestMemoryMmap, mq: &MockSplitQueue<'_, GuestMemoryMmap>, i: u16) -> (u32, u32) {
        let base = mq.used_addr().checked_add(4 + u64::from(i) * 8).unwrap();
        (
            m.read_obj::<u32>(base).unwrap(),
            m.read_obj::<u32>(base.checked_add(4).unwrap()).unwrap(),
        )
    }

    #[test]
    fn small_frame_one_buffer() {
        for (path, deliver) in PATHS {
            eprintln!("{path}");
            small_frame_one_buffer_with(deliver);
        }
    }

    fn small_frame_one_buffer_with(deliver: DeliverFn) {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        post(&mq, 4, 2048);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut pkt = vec![0xAAu8; NET_HDR_LEN + 60];
        let mut bad = 0;
        assert_eq!(
            deliver(&mut q, &m, &mut pkt, true, &mut bad),
            RxOutcome::Delivered { buffers: 1 }
        );
        assert_eq!(bad, 0);
        assert_eq!(used(&m, &mq, 0), (0, 72));
        let mut hdr = [0u8; 12];
        m.read_slice(&mut hdr, GuestAddress(BUF)).unwrap();
        assert_eq!(&hdr[..10], &[0u8; 10]);
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1);
        let mut body = [0u8; 60];
        m.read_slice(&mut body, GuestAddress(BUF + 12)).unwrap();
        assert!(body.iter().all(|&b| b == 0xAA));
    }

    #[test]
    fn mergeable_spans_buffers_and_sets_num_buffers() {
        for (path, deliver) in PATHS {
            eprintln!("{path}");
            mergeable_spans_buffers_and_sets_num_buffers_with(deliver);
        }
    }

    fn mergeable_spans_buffers_and_sets_num_buffers_with(deliver: DeliverFn) {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        post(&mq, 4, 512);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut pkt: Vec<u8> = (0..NET_HDR_LEN + 1500).map(|i| i as u8).collect();
        let mut bad = 0;
        assert_eq!(
            deliver(&mut q, &m, &mut pkt, true, &mut bad),
            RxOutcome::Delivered { buffers: 3 }
        );
        assert_eq!(used(&m, &mq, 0), (0, 512));
        assert_eq!(used(&m, &mq, 1), (1, 512));
        assert_eq!(used(&m, &mq, 2), (2, 1512 - 1024));
        let mut hdr = [0u8; 12];
        m.read_slice(&mut hdr, GuestAddress(BUF)).unwrap();
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3);
        let mut b = [0u8; 4];
        m.read_slice(&mut b, GuestAddress(BUF + 0x1000)).unwrap();
        assert_eq!(b, [pkt[512], pkt[513], pkt[514], pkt[515]]);
    }

    /// A driver whose buffers put the header in a line of its own (the
    /// data at a line boundary): a header that differs is written, one
    /// that is already there is left as it is, and a frame over several
    /// buffers still gets its `num_buffers`; the data is right in all.
    #[test]
    fn a_header_already_in_place_is_left_alone() {
        for (path, deliver) in PATHS {
            let m = mem();
            let mq = MockSplitQueue::new(&m, 16);
            let w = VRING_DESC_F_WRITE as u16;
            // Buffers at BUF + k * 0x1000 + 52: data from + 64 on.
            let descs: Vec<RawDescriptor> = (0..4u64)
                .map(|k| {
                    RawDescriptor::from(SplitDescriptor::new(BUF + k * 0x1000 + 52, 512, w, 0))
                })
                .collect();
            mq.build_multiple_desc_chains(&descs).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let mut bad = 0;
            let hdr_at = |k: u64| GuestAddress(BUF + k * 0x1000 + 52);
            let read = |a: GuestAddress, n: usize| {
                let mut v = vec![0u8; n];
                m.read_slice(&mut v, a).unwrap();
                v
            };
            // 1: garbage where the header goes: written.
            m.write_slice(&[0xee; 12], hdr_at(0)).unwrap();
            let mut pkt = vec![7u8; NET_HDR_LEN + 100];
            assert_eq!(
                deliver(&mut q, &m, &mut pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 1 },
                "{path}"
            );
            let mut want_hdr = [0u8; 12];
            want_hdr[10] = 1;
            assert_eq!(read(hdr_at(0), 12), want_hdr, "{path}: header written");
            assert_eq!(read(hdr_at(0).unchecked_add(12), 100), vec![7u8; 100]);
            // 2: the header already there: the frame's data lands.
            m.write_slice(&want_hdr, hdr_at(1)).unwrap();
            let mut pkt = vec![8u8; NET_HDR_LEN + 100];
            deliver(&mut q, &m, &mut pkt, true, &mut bad);
            assert_eq!(read(hdr_at(1), 12), want_hdr, "{path}");
            assert_eq!(
                read(hdr_at(1).unchecked_add(12), 100),
                vec![8u8; 100],
                "{path}"
            );
            // 3: in place, but the frame takes two buffers: num_buffers 2.
            m.write_slice(&want_hdr, hdr_at(2)).unwrap();
            let mut pkt = vec![9u8; NET_HDR_LEN + 700];
            assert_eq!(
                deliver(&mut q, &m, &mut pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 2 },
                "{path}"
            );
            let h = read(hdr_at(2), 12);
            assert_eq!(u16::from_le_bytes([h[10], h[11]]), 2, "{path}: num_buffers");
            assert_eq!(
                read(hdr_at(2).unchecked_add(12), 500),
                vec![9u8; 500],
                "{path}"
            );
            assert_eq!(read(hdr_at(3), 200), vec![9u8; 200], "{path}");
            assert_eq!(bad, 0);
        }
    }

    #[test]
    fn a_piece_lands_whole_streamed_or_not() {
        // Every length a staged piece can have, at a line boundary (whole
        // lines streamed, the tail copied) and 8 bytes past one (copied):
        // exactly the piece's bytes change.
        // Without `stream`, nothing is streamed.
        let m = mem();
        for (at, stream) in [(BUF, true), (BUF + 8, true), (BUF, false)] {
            for len in 1..=STAGE_PIECE {
                m.write_slice(&[0xcc; 256], GuestAddress(at)).unwrap();
                let src: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) | 1).collect();
                let dst = m.find_region(GuestAddress(at)).unwrap();
                let dst = dst.get_slice(MemoryRegionAddress(at), 200).unwrap();
                let streamed = write_piece(dst, &src, stream);
                store_fence();
                assert_eq!(
                    streamed,
                    stream && at % 64 == 0 && len >= 64,
                    "at {at:#x} len {len}"
                );
                let mut got = vec![0u8; 256];
                m.read_slice(&mut got, GuestAddress(at)).unwrap();
                assert_eq!(&got[..len], &src[..], "at {at:#x} len {len}");
                assert!(
                    got[len..].iter().all(|&b| b == 0xcc),
                    "at {at:#x} len {len}"
                );
            }
        }
    }

    #[test]
    fn a_header_that_differs_in_any_one_byte_is_written() {
        // header_holds compares the 12 bytes as two loads: a byte that
        // differs in either of them must make the header be written.
        let mut want_hdr = [0u8; 12];
        want_hdr[10] = 1;
        for (path, deliver) in PATHS {
            for i in 0..NET_HDR_LEN {
                let m = mem();
                let mq = MockSplitQueue::new(&m, 16);
                let w = VRING_DESC_F_WRITE as u16;
                // Data from BUF + 64 on: the header has lines of its own.
                let d = RawDescriptor::from(SplitDescriptor::new(BUF + 52, 512, w, 0));
                mq.build_multiple_desc_chains(&[d]).unwrap();
                let mut q: Queue = mq.create_queue().unwrap();
                let mut held = want_hdr;
                held[i] ^= 0x40;
                m.write_slice(&held, GuestAddress(BUF + 52)).unwrap();
                let mut pkt = vec![5u8; NET_HDR_LEN + 64];
                let mut bad = 0;
                assert_eq!(
                    deliver(&mut q, &m, &mut pkt, true, &mut bad),
                    RxOutcome::Delivered { buffers: 1 },
                    "{path}"
                );
                let mut got = [0u8; 12];
                m.read_slice(&mut got, GuestAddress(BUF + 52)).unwrap();
                assert_eq!(got, want_hdr, "{path}: byte {i} differed");
            }
        }
    }

    #[test]
    fn a_frame_over_many_chains_keeps_their_order() {
        // 15 chains: the first in place, 8 inline, the rest on the heap.
        for (path, deliver) in PATHS {
            eprintln!("{path}");
            let m = mem();
            let mq = MockSplitQueue::new(&m, 32);
            post(&mq, 20, 100);
            let mut q: Queue = mq.create_queue().unwrap();
            let mut pkt: Vec<u8> = (0..NET_HDR_LEN + 1400).map(|i| i as u8).collect();
            let mut bad = 0;
            assert_eq!(
                deliver(&mut q, &m, &mut pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 15 }
            );
            for i in 0..14u16 {
                assert_eq!(used(&m, &mq, i), (u32::from(i), 100));
            }
            assert_eq!(used(&m, &mq, 14), (14, 12));
            assert_eq!(used_idx(&m, &mq), 15);
            let mut hdr = [0u8; 12];
            m.read_slice(&mut hdr, GuestAddress(BUF)).unwrap();
            assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 15);
            let mut b = [0u8; 12];
            m.read_slice(&mut b, GuestAddress(BUF + 14 * 0x1000))
                .unwrap();
            assert_eq!(&b[..], &pkt[1400..1412]);
        }
    }

    #[test]
    fn no_buffers_puts_chains_back() {
        for (path, deliver) in PATHS {
            eprintln!("{path}");
            no_buffers_puts_chains_back_with(deliver);
        }
    }

    fn no_buffers_puts_chains_back_with(deliver: DeliverFn) {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        post(&mq, 2, 512);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut pkt = vec![1u8; NET_HDR_LEN + 1500];
        let mut bad = 0;
        assert_eq!(
            deliver(&mut q, &m, &mut pkt, true, &mut bad),
            RxOutcome::NoBuffers
        );
        assert_eq!(q.next_avail(), 0);
        assert_eq!(q.next_used(), 0);
        // A small frame still fits afterwards.
        let mut small = vec![1u8; NET_HDR_LEN + 100];
        assert_eq!(
            deliver(&mut q, &m, &mut small, true, &mut bad),
            RxOutcome::Delivered { buffers: 1 }
        );
    }

    #[test]
    fn without_mrg_a_frame_needs_one_chain() {
        for (path, deliver) in PATHS {
            eprintln!("{path}");
            without_mrg_a_frame_needs_one_chain_with(deliver);
        }
    }

    fn without_mrg_a_frame_needs_one_chain_with(deliver: DeliverFn) {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        post(&mq, 4, 512);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut pkt = vec![1u8; NET_HDR_LEN + 1500];
        let mut bad = 0;
        assert_eq!(
            deliver(&mut q, &m, &mut pkt, false, &mut bad),
            RxOutcome::TooBig
        );
        assert_eq!(q.next_avail(), 0);
    }

    #[test]
    fn bad_chains_are_consumed_and_counted() {
        for (path, deliver) in PATHS {
            eprintln!("{path}");
            bad_chains_are_consumed_and_counted_with(deliver);
        }
    }

    fn bad_chains_are_consumed_and_counted_with(deliver: DeliverFn) {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        // chain 0: read-only descriptor (invalid on rx); chain 1: outside
        // memory; chain 2: zero length; chain 3: good.
        let descs = [
            RawDescriptor::from(SplitDescriptor::new(BUF, 512, 0, 0)),
            RawDescriptor::from(SplitDescriptor::new(
                0x4000_0000,
                512,
                VRING_DESC_F_WRITE as u16,
                0,
            )),
            RawDescriptor::from(SplitDescriptor::new(
                BUF + 0x2000,
                0,
                VRING_DESC_F_WRITE as u16,
                0,
            )),
            RawDescriptor::from(SplitDescriptor::new(
                BUF + 0x3000,
                2048,
                VRING_DESC_F_WRITE as u16,
                0,
            )),
        ];
        mq.build_multiple_desc_chains(&descs).unwrap();
        let mut q: Queue = mq.create_queue().unwrap();
        let mut pkt = vec![7u8; NET_HDR_LEN + 100];
        let mut bad = 0;
        assert_eq!(
            deliver(&mut q, &m, &mut pkt, true, &mut bad),
            RxOutcome::Delivered { buffers: 1 }
        );
        assert_eq!(bad, 3);
        assert_eq!(used(&m, &mq, 0), (0, 0));
        assert_eq!(used(&m, &mq, 1), (1, 0));
        assert_eq!(used(&m, &mq, 2), (2, 0));
        assert_eq!(used(&m, &mq, 3), (3, 112));
    }

    #[test]
    fn rx_chain_with_a_loop_is_rejected_even_if_the_frame_fits() {
        for (path, deliver) in PATHS {
            eprintln!("{path}");
            rx_chain_with_a_loop_is_rejected_even_if_the_frame_fits_with(deliver);
        }
    }

    fn rx_chain_with_a_loop_is_rejected_even_if_the_frame_fits_with(deliver: DeliverFn) {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        let w = VRING_DESC_F_WRITE as u16;
        let n = VRING_DESC_F_NEXT as u16;
        let descs = [
            // chain 0: 0 -> 1 -> 0 ... (loop)
            RawDescriptor::from(SplitDescriptor::new(BUF, 2048, w | n, 1)),
            RawDescriptor::from(SplitDescriptor::new(BUF + 0x1000, 2048, w | n, 0)),
        ];
        mq.add_desc_chains(&descs, 0).unwrap();
        // chain 2: next out of range; chain 3: good.
        mq.add_desc_chains(
            &[RawDescriptor::from(SplitDescriptor::new(
                BUF + 0x2000,
                2048,
                w | n,
                999,
            ))],
            2,
        )
        .unwrap();
        mq.add_desc_chains(
            &[RawDescriptor::from(SplitDescriptor::new(
                BUF + 0x3000,
                2048,
                w,
                0,
            ))],
            3,
        )
        .unwrap();
        let mut q: Queue = mq.create_queue().unwrap();
        let mut pkt = vec![7u8; NET_HDR_LEN + 100];
        let mut bad = 0;
        assert_eq!(
            deliver(&mut q, &m, &mut pkt, true, &mut bad),
            RxOutcome::Delivered { buffers: 1 }
        );
        assert_eq!(bad, 2);
        assert_eq!(used(&m, &mq, 2), (3, 112));
    }

    /// Makes `n` more single-buffer chains available (descriptors `first..`,
    /// `size` bytes each), as a driver refilling the ring does.
    fn repost(
        m: &GuestMemoryMmap,
        mq: &MockSplitQueue<'_, GuestMemoryMmap>,
        first: u16,
        n: u16,
        size: u32,
    ) {
        let descs: Vec<RawDescriptor> = (0..n)
            .map(|i| {
                RawDescriptor::from(SplitDescriptor::new(
                    BUF + u64::from(first + i) * 0x1000,
                    size,
                    VRING_DESC_F_WRITE as u16,
                    0,
                ))
            })
            .collect();
        mq.add_desc_chains(&descs, first).unwrap();
        let _ = m;
    }

    #[test]
    fn batch_out_of_buffers_midway_drops_the_rest_and_recovers() {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        post(&mq, 5, 2048);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut bad = 0;
        let mut r = RxRing::open(&q, &m).unwrap();
        let outs: Vec<RxOutcome> = (0..8)
            .map(|i| {
                let mut pkt = vec![i as u8; NET_HDR_LEN + 60];
                deliver(&mut r, &mut pkt, true, &mut bad)
            })
            .collect();
        let delivered = outs
            .iter()
            .filter(|o| **o == RxOutcome::Delivered { buffers: 1 })
            .count();
        assert_eq!(delivered, 5);
        assert_eq!(&outs[5..], &[RxOutcome::NoBuffers; 3]);
        // Nothing is published before the batch ends (fewer than PUBLISH_EVERY).
        assert_eq!(used_idx(&m, &mq), 0);
        assert_eq!(r.finish(&mut q), 5);
        assert_eq!(used_idx(&m, &mq), 5);
        assert_eq!((q.next_avail(), q.next_used()), (5, 5));
        for i in 0..5 {
            assert_eq!(used(&m, &mq, i), (u32::from(i), 72));
        }
        // The driver adds 3 buffers: the next batch uses exactly those.
        repost(&m, &mq, 5, 3, 2048);
        let mut r = RxRing::open(&q, &m).unwrap();
        for i in 0..4 {
            let mut pkt = vec![9u8; NET_HDR_LEN + 60];
            // Used entries 5, 6 and 7 fit; the fourth frame finds none.
            let want = if i < 3 {
                RxOutcome::Delivered { buffers: 1 }
            } else {
                RxOutcome::NoBuffers
            };
            assert_eq!(deliver(&mut r, &mut pkt, true, &mut bad), want);
        }
        assert_eq!(r.finish(&mut q), 8);
        assert_eq!(used_idx(&m, &mq), 8);
        assert_eq!(used(&m, &mq, 7), (7, 72));
        assert_eq!(bad, 0);
    }

    #[test]
    fn batch_puts_back_the_chains_of_a_frame_that_does_not_fit() {
        // Mergeable buffers of 512 bytes: a 1500-byte frame needs 3, only 2
        // are left after the first small frame; the small frame after it
        // still gets the next buffer, in order.
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        post(&mq, 3, 512);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut bad = 0;
        let mut r = RxRing::open(&q, &m).unwrap();
        let mut small = vec![1u8; NET_HDR_LEN + 60];
        let mut big = vec![2u8; NET_HDR_LEN + 1500];
        assert_eq!(
            deliver(&mut r, &mut small, true, &mut bad),
            RxOutcome::Delivered { buffers: 1 }
        );
        assert_eq!(
            deliver(&mut r, &mut big, true, &mut bad),
            RxOutcome::NoBuffers
        );
        assert_eq!(
            deliver(&mut r, &mut small, true, &mut bad),
            RxOutcome::Delivered { buffers: 1 }
        );
        r.finish(&mut q);
        assert_eq!((q.next_avail(), q.next_used()), (2, 2));
        assert_eq!(used(&m, &mq, 0), (0, 72));
        assert_eq!(used(&m, &mq, 1), (1, 72));
    }

    #[test]
    fn frames_after_a_long_one_in_one_batch_keep_their_own_chains() {
        // The chains of a frame are kept in the ring view from frame to
        // frame: a 3-chain frame after a 10-chain one (its list on the
        // heap) must complete its own chains, with their own lengths.
        let m = mem();
        let mq = MockSplitQueue::new(&m, 32);
        post(&mq, 16, 100);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut bad = 0;
        let mut r = RxRing::open(&q, &m).unwrap();
        let mut long = vec![3u8; NET_HDR_LEN + 988];
        let mut short = vec![4u8; NET_HDR_LEN + 238];
        assert_eq!(
            deliver(&mut r, &mut long, true, &mut bad),
            RxOutcome::Delivered { buffers: 10 }
        );
        assert_eq!(
            deliver(&mut r, &mut short, true, &mut bad),
            RxOutcome::Delivered { buffers: 3 }
        );
        r.finish(&mut q);
        assert_eq!(used_idx(&m, &mq), 13);
        for i in 0..10u16 {
            assert_eq!(used(&m, &mq, i), (u32::from(i), 100));
        }
        assert_eq!(used(&m, &mq, 10), (10, 100));
        assert_eq!(used(&m, &mq, 11), (11, 100));
        assert_eq!(used(&m, &mq, 12), (12, 50));
        let mut hdr = [0u8; 12];
        m.read_slice(&mut hdr, GuestAddress(BUF + 10 * 0x1000))
            .unwrap();
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3);
    }

    #[test]
    fn long_batches_publish_as_they_go() {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 256);
        post(&mq, 200, 256);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut bad = 0;
        let mut r = RxRing::open(&q, &m).unwrap();
        for _ in 0..usize::from(PUBLISH_EVERY) + 6 {
            let mut pkt = vec![3u8; NET_HDR_LEN + 60];
            assert_eq!(
                deliver(&mut r, &mut pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 1 }
            );
        }
        // The driver already sees the first PUBLISH_EVERY frames.
        assert_eq!(used_idx(&m, &mq), PUBLISH_EVERY);
        r.finish(&mut q);
        assert_eq!(used_idx(&m, &mq), PUBLISH_EVERY + 6);
    }

    #[test]
    fn staged_frames_are_in_memory_before_their_used_index() {
        // More frames than the stage holds and than one publish covers,
        // each with its own bytes: every frame the driver can see (used
        // index published) is already in its buffer, mid-batch and at
        // the end.
        let m = mem();
        let mq = MockSplitQueue::new(&m, 256);
        // virtio-queue's mock lays the used ring out over the second half
        // of the avail ring (it sizes the avail ring in entries, not
        // bytes): the used index shares avail entry 129, so post fewer
        // chains than that (the tail of the avail ring then reads 0).
        post(&mq, 120, 256);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut bad = 0;
        let frame = |i: u16| -> Vec<u8> {
            let mut p = vec![0u8; NET_HDR_LEN + 60];
            p[NET_HDR_LEN..].fill(i as u8 ^ 0x5A);
            p
        };
        let check = |upto: u16| {
            for i in 0..upto {
                let mut body = [0u8; 60];
                m.read_slice(&mut body, GuestAddress(BUF + u64::from(i) * 0x1000 + 12))
                    .unwrap();
                assert!(
                    body.iter().all(|&b| b == i as u8 ^ 0x5A),
                    "frame {i} of {upto}"
                );
            }
        };
        let mut r = RxRing::open(&q, &m).unwrap();
        let n = PUBLISH_EVERY + STAGE_SLOTS as u16 + 3;
        for i in 0..n {
            let mut pkt = frame(i);
            assert_eq!(
                deliver(&mut r, &mut pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 1 }
            );
            check(used_idx(&m, &mq));
        }
        assert_eq!(used_idx(&m, &mq), PUBLISH_EVERY);
        r.finish(&mut q);
        assert_eq!(used_idx(&m, &mq), n);
        check(n);
    }

    #[test]
    fn staged_pieces_keep_num_buffers_and_order() {
        // Mergeable buffers of 64 bytes: a 200-byte frame goes out in 4
        // staged pieces, then its num_buffers (3 -> 4) is written over the
        // first: it must survive the staged copy of that piece.
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        post(&mq, 8, 64);
        let mut q: Queue = mq.create_queue().unwrap();
        let mut bad = 0;
        let mut r = RxRing::open(&q, &m).unwrap();
        let mut pkt: Vec<u8> = (0..NET_HDR_LEN + 188).map(|i| i as u8).collect();
        assert_eq!(
            deliver(&mut r, &mut pkt, true, &mut bad),
            RxOutcome::Delivered { buffers: 4 }
        );
        r.finish(&mut q);
        let mut hdr = [0u8; 12];
        m.read_slice(&mut hdr, GuestAddress(BUF)).unwrap();
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 4);
        let mut b = [0u8; 64];
        m.read_slice(&mut b, GuestAddress(BUF + 3 * 0x1000))
            .unwrap();
        assert_eq!(&b[..8], &pkt[192..200]);

        // A driver that lists the same chain twice: a small frame (staged)
        // then a large one (copied at once) into the same buffer. The
        // buffer ends up holding the second, as with one-by-one copies.
        let mq = MockSplitQueue::new(&m, 16);
        mq.build_desc_chain(&[RawDescriptor::from(SplitDescriptor::new(
            BUF,
            2048,
            VRING_DESC_F_WRITE as u16,
            0,
        ))])
        .unwrap();
        let avail = mq.avail_addr();
        m.write_obj(0u16, avail.checked_add(4 + 2).unwrap())
            .unwrap();
        m.write_obj(2u16, avail.checked_add(2).unwrap()).unwrap();
        let mut q: Queue = mq.create_queue().unwrap();
        let mut r = RxRing::open(&q, &m).unwrap();
        let mut small = vec![7u8; NET_HDR_LEN + 60];
        let mut large = vec![9u8; NET_HDR_LEN + 1000];
        for pkt in [&mut small, &mut large] {
            assert_eq!(
                deliver(&mut r, pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 1 }
            );
        }
        r.finish(&mut q);
        let mut buf = [0u8; NET_HDR_LEN + 1000];
        m.read_slice(&mut buf, GuestAddress(BUF)).unwrap();
        assert!(buf[NET_HDR_LEN..].iter().all(|&b| b == 9));
        assert_eq!(bad, 0);
    }

    #[test]
    fn indirect_chains_both_ways() {
        for (path, deliver) in PATHS {
            let m = mem();
            let mq = MockSplitQueue::new(&m, 16);
            let w = VRING_DESC_F_WRITE as u16;
            let n = VRING_DESC_F_NEXT as u16;
            let ind = VRING_DESC_F_INDIRECT as u16;
            // Table at BUF+0x8000: two writable buffers of 40 and 2048.
            let table = GuestAddress(BUF + 0x8000);
            m.write_obj(SplitDescriptor::new(BUF, 40, w | n, 1), table)
                .unwrap();
            m.write_obj(
                SplitDescriptor::new(BUF + 0x1000, 2048, w, 0),
                table.checked_add(16).unwrap(),
            )
            .unwrap();
            // Nested table (invalid): an indirect descriptor inside a table.
            let nested = GuestAddress(BUF + 0x9000);
            m.write_obj(SplitDescriptor::new(BUF + 0x8000, 32, ind, 0), nested)
                .unwrap();
            mq.add_desc_chains(
                &[
                    RawDescriptor::from(SplitDescriptor::new(BUF + 0x9000, 16, ind, 0)),
                    // Table outside guest memory.
                    RawDescriptor::from(SplitDescriptor::new(0x4000_0000, 32, ind, 0)),
                    // Table length not a multiple of 16.
                    RawDescriptor::from(SplitDescriptor::new(BUF + 0x8000, 24, ind, 0)),
                    RawDescriptor::from(SplitDescriptor::new(BUF + 0x8000, 32, ind, 0)),
                ],
                0,
            )
            .unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let mut pkt: Vec<u8> = (0..NET_HDR_LEN + 100).map(|i| i as u8).collect();
            let mut bad = 0;
            assert_eq!(
                deliver(&mut q, &m, &mut pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 1 },
                "{path}"
            );
            assert_eq!(bad, 3, "{path}");
            assert_eq!(used(&m, &mq, 3), (3, 112), "{path}");
            let mut got = [0u8; 112];
            m.read_slice(&mut got[..40], GuestAddress(BUF)).unwrap();
            m.read_slice(&mut got[40..], GuestAddress(BUF + 0x1000))
                .unwrap();
            assert_eq!(&got[NET_HDR_LEN..], &pkt[NET_HDR_LEN..], "{path}");
        }
    }

    /// A ring a guest placed across two memory regions (its descriptor
    /// table starts 128 bytes before the boundary): the ring view reaches
    /// that area by guest address, the rest in host memory, and frames go
    /// through as in one region, on rx and tx.
    #[test]
    fn a_ring_across_two_regions_carries_frames() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x1_0000),
            (GuestAddress(0x1_0000), 0x40_0000 - 0x1_0000),
        ])
        .unwrap();
        let mq = MockSplitQueue::create(&m, GuestAddress(0x1_0000 - 0x80), 16);
        post(&mq, 4, 2048);
        let mut q: Queue = mq.create_queue().unwrap();
        let r = RxRing::open(&q, &m).expect("ready");
        assert!(matches!(r.r.desc, super::super::ring::Area::Guest(_)));
        r.finish(&mut q);
        let mut bad = 0;
        for i in 0..3u8 {
            let mut pkt = vec![i; NET_HDR_LEN + 100];
            assert_eq!(
                host(&mut q, &m, &mut pkt, true, &mut bad),
                RxOutcome::Delivered { buffers: 1 }
            );
            let mut got = [0u8; 100];
            m.read_slice(&mut got, GuestAddress(BUF + u64::from(i) * 0x1000 + 12))
                .unwrap();
            assert_eq!(got, [i; 100]);
        }
        assert_eq!(bad, 0);
        assert_eq!(used_idx(&m, &mq), 3);
        assert_eq!(used(&m, &mq, 2), (2, 112));
    }

    /// [`deliver`] without its single-descriptor path: the walk alone.
    fn walk_only(r: &mut RxRing<'_>, pkt: &mut [u8], mrg: bool, bad: &mut u64) -> RxOutcome {
        pkt[..NET_HDR_LEN].fill(0);
        pkt[NUM_BUFFERS_OFF] = 1;
        walk(r, pkt, mrg, bad)
    }

    #[test]
    fn the_single_descriptor_path_writes_what_the_walk_writes() {
        // Random rings (descriptor flags, lengths, buffers in one region,
        // across two, past the end of memory; heads in and out of the
        // table; NEXT and INDIRECT links) and random frames, delivered by
        // `deliver` (which takes its single-descriptor path where it can)
        // and by the walk alone, into two copies of the same guest memory:
        // the outcomes, the bad-chain counts and every byte of guest
        // memory (buffers, used ring) must agree.
        use crate::virtq::random_ring::{addr, heads, posted, snapshot, Draw};
        let mut d = Draw(0x9E37_79B9_7F4A_7C15);
        let (mut singles, mut bads) = (0u32, 0u64);
        for round in 0..400 {
            let mrg = d.below(4) != 0;
            let descs: Vec<RawDescriptor> = (0..16u16)
                .map(|i| {
                    let a = addr(&mut d, BUF + u64::from(i) * 0x1000);
                    let len = match d.below(8) {
                        0 => 0,
                        1 => 12,
                        2 => 40,
                        3 => 76,
                        4 => 200,
                        5 => d.below(300) as u32,
                        _ => 2048,
                    };
                    let w = VRING_DESC_F_WRITE as u16;
                    let (flags, next) = match d.below(10) {
                        0 => (0, 0),
                        1 => (w | VRING_DESC_F_NEXT as u16, d.below(20) as u16),
                        2 => (w | VRING_DESC_F_INDIRECT as u16, 0),
                        _ => (w, 0),
                    };
                    RawDescriptor::from(SplitDescriptor::new(a, len, flags, next))
                })
                .collect();
            let heads = heads(&mut d);
            let frames: Vec<Vec<u8>> = (0..=d.below(8))
                .map(|_| {
                    (0..NET_HDR_LEN as u64 + d.below(300))
                        .map(|_| d.below(256) as u8)
                        .collect()
                })
                .collect();
            let run = |deliver: DeliverOne| {
                let (m, mut q) = posted(&descs, &heads, |_| {});
                let mut r = RxRing::open(&q, &m).unwrap();
                let mut bad = 0;
                let outs: Vec<RxOutcome> = frames
                    .iter()
                    .map(|f| deliver(&mut r, &mut f.clone(), mrg, &mut bad))
                    .collect();
                r.finish(&mut q);
                (outs, bad, snapshot(&m))
            };
            let (outs, bad, mem_a) = run(deliver);
            let (outs_b, bad_b, mem_b) = run(walk_only);
            assert_eq!((&outs, bad), (&outs_b, bad_b), "round {round}");
            assert!(mem_a == mem_b, "round {round}: guest memory differs");
            singles += outs
                .iter()
                .filter(|o| **o == RxOutcome::Delivered { buffers: 1 })
                .count() as u32;
            bads += bad;
        }
        // Both kinds of chain were there to compare.
        assert!(singles > 300 && bads > 300, "{singles} {bads}");
    }

    type DeliverOne = fn(&mut RxRing<'_>, &mut [u8], bool, &mut u64) -> RxOutcome;

    #[test]
    fn notification_window_follows_used_event() {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        let mut q: Queue = mq.create_queue().unwrap();
        // Without EVENT_IDX: always.
        assert!(needs_notification(&q, &m, 0));
        q.set_event_idx(true);
        q.set_next_used(5);
        let used_event = mq.avail_addr().checked_add(4 + 2 * 16).unwrap();
        // Used index moved 0 -> 5: the driver asked for an interrupt after
        // entry used_event, i.e. when the index passes it.
        for (ev, want) in [
            (0u16, true),
            (2, true),
            (4, true),
            (5, false),
            (9, false),
            (0xFFFF, false),
        ] {
            m.write_obj(ev, used_event).unwrap();
            assert_eq!(needs_notification(&q, &m, 0), want, "used_event {ev}");
        }
        // A window that does not reach used_event: 3 -> 5 with used_event 1.
        m.write_obj(1u16, used_event).unwrap();
        assert!(!needs_notification(&q, &m, 3));
        // Nothing added: never.
        m.write_obj(4u16, used_event).unwrap();
        assert!(!needs_notification(&q, &m, 5));
    }

    /// Without EVENT_IDX, the driver's `VRING_AVAIL_F_NO_INTERRUPT` says
    /// no; with EVENT_IDX the flag is not looked at (`used_event` rules).
    #[test]
    fn no_interrupt_flag_is_honoured_without_event_idx() {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        let mut q: Queue = mq.create_queue().unwrap();
        q.set_next_used(1);
        m.write_obj(1u16, mq.avail_addr()).unwrap();
        assert!(!needs_notification(&q, &m, 0));
        m.write_obj(0u16, mq.avail_addr()).unwrap();
        assert!(needs_notification(&q, &m, 0));
        q.set_event_idx(true);
        m.write_obj(1u16, mq.avail_addr()).unwrap();
        let used_event = mq.avail_addr().checked_add(4 + 2 * 16).unwrap();
        m.write_obj(0u16, used_event).unwrap();
        assert!(needs_notification(&q, &m, 0));
    }

    /// The vring of `mq` as the frontend leaves it: sized, placed, ready
    /// and enabled.
    fn running_vring(
        m: &GuestMemoryMmap,
        mq: &MockSplitQueue<'_, GuestMemoryMmap>,
    ) -> vhost_user_backend::VringRwLock<Mem> {
        use vhost_user_backend::{VringRwLock, VringT};
        let vring = VringRwLock::new(Mem::new(m.clone()), 16).unwrap();
        vring.set_queue_size(16);
        vring
            .set_queue_info(mq.desc_table_addr().0, mq.avail_addr().0, mq.used_addr().0)
            .unwrap();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        vring
    }

    /// The driver's rx kicks are off from the first batch (NO_NOTIFY in the
    /// used ring's flags), on again when the ring runs out of buffers, off
    /// again at the next batch; a restarted ring gets them turned off anew.
    #[test]
    fn rx_kicks_are_off_while_working_and_on_when_starved() {
        use vhost_user_backend::VringT;
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        let vring = running_vring(&m, &mq);
        let flags = |m: &GuestMemoryMmap| m.read_obj::<u16>(mq.used_addr()).unwrap();
        let mut carry = RxCarry::default();
        let mut st = vring.get_mut();
        let b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        assert_eq!(flags(&m), 1, "off at the first batch");
        assert_eq!(
            b.finish(0, false, false, &mut carry, NO_SPIN),
            RxEnd::default()
        );
        assert_eq!(flags(&m), 1, "still off after a batch with buffers");
        let b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        b.finish(0, false, true, &mut carry, NO_SPIN);
        assert_eq!(flags(&m), 0, "on when the ring ran out of buffers");
        let b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        assert_eq!(flags(&m), 1, "off again at the next batch");
        b.finish(0, false, false, &mut carry, NO_SPIN);
        // The frontend set the ring up again (flags back to 0).
        m.write_obj(0u16, mq.used_addr()).unwrap();
        let b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        assert_eq!(flags(&m), 0, "same restart count: the latch holds");
        b.finish(0, false, false, &mut carry, NO_SPIN);
        let b = RxBatch::open(&mut st, &m, false, &mut carry, 1);
        assert_eq!(flags(&m), 1, "a restarted ring: off anew");
        b.finish(0, false, false, &mut carry, NO_SPIN);
    }

    const NO_SPIN: Duration = Duration::ZERO;

    /// Out of buffers, the worker spins for new ones with kicks still off:
    /// buffers the driver added since the batch last read the avail index
    /// end the spin (the worker comes back at once, no kick asked), and
    /// buffers it had already seen do not (too few for the frame: waiting
    /// on them would spin for ever); a spin that finds none turns kicks on
    /// and reports when the ring ran dry.
    #[test]
    fn out_of_buffers_the_worker_spins_for_new_ones_only() {
        use vhost_user_backend::VringT;
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        let vring = running_vring(&m, &mq);
        let flags = |m: &GuestMemoryMmap| m.read_obj::<u16>(mq.used_addr()).unwrap();
        let mut carry = RxCarry::default();
        let mut st = vring.get_mut();
        let long = Duration::from_secs(5);
        // Added after the batch's last look: found at once.
        let mut b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        assert_eq!(b.check_avail(), Ok(false));
        post(&mq, 1, 2048);
        let t = Instant::now();
        let end = b.finish(0, false, true, &mut carry, long);
        assert!(t.elapsed() < Duration::from_secs(1), "{end:?}");
        assert!(end.again, "{end:?}");
        assert!(matches!(end.spun, Some((_, true))), "{end:?}");
        assert_eq!(end.slept_from, None);
        assert_eq!(flags(&m), 1, "kicks still off");
        // The same buffer, now seen by the batch: the spin runs its whole
        // window, then kicks go on (and the once-per-avail-index re-check
        // brings the worker back once).
        let window = Duration::from_millis(2);
        let mut b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        assert_eq!(b.check_avail(), Ok(true));
        let t = Instant::now();
        let end = b.finish(0, false, true, &mut carry, window);
        assert!(t.elapsed() >= window, "{end:?}");
        assert!(
            matches!(end.spun, Some((d, false)) if d >= window),
            "{end:?}"
        );
        assert!(end.again, "{end:?}");
        assert_eq!(flags(&m), 0, "kicks on");
        // Again on the same buffer: the worker sleeps, dry since before
        // the spin.
        let mut b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        assert_eq!(b.check_avail(), Ok(true));
        let t = Instant::now();
        let end = b.finish(0, false, true, &mut carry, window);
        assert!(matches!(end.spun, Some((_, false))), "{end:?}");
        assert!(!end.again, "{end:?}");
        assert!(
            end.slept_from.is_some_and(|at| at >= t && at <= t + window),
            "{end:?}"
        );
        assert_eq!(flags(&m), 0, "kicks on");
        // Without a window: no spin.
        let b = RxBatch::open(&mut st, &m, false, &mut carry, 0);
        let end = b.finish(0, false, true, &mut carry, NO_SPIN);
        assert_eq!(end.spun, None);
        assert!(end.slept_from.is_some());
    }
}
