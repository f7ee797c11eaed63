//! Gathering tx chains: each chain's readable bytes are copied into one
//! buffer and the chain is completed at once (length 0). A chain that
//! cannot be used is completed the same way and reported with the reason
//! ([`BadTx`]); a ring whose avail index the device cannot trust is
//! reported as [`RingStop`] without touching it.

use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::chain::{Chain, LinkFault};
use super::ring::RingView;
use super::{RingStop, NET_HDR_LEN};

/// Largest tx chain accepted (header + 64 KiB frame).
pub(crate) const MAX_TX_LEN: usize = NET_HDR_LEN + 65_536;

pub(crate) use crate::stats::BadTx;

/// Result of gathering one tx chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxChain {
    /// `len` bytes (header included) gathered into the buffer.
    Ok { len: usize },
    /// Unusable chain, consumed and completed with length 0.
    Bad(BadTx),
}

/// The reason a broken link gives a tx chain.
fn link_reason(f: LinkFault) -> BadTx {
    match f {
        LinkFault::BadIndex => BadTx::BadIndex,
        LinkFault::OutOfRange => BadTx::OutOfRange,
        LinkFault::Indirect => BadTx::Indirect,
        LinkFault::Loop => BadTx::Loop,
    }
}

/// Copies the readable buffers of `chain` into `buf` (`copy` reads one
/// buffer: false when it is outside guest memory) and says what the chain
/// was. A broken link is the reason even when a buffer was at fault
/// first (a loop of big buffers is a loop, not a long frame), so the walk
/// goes on over the links after a bad buffer.
#[inline]
fn gather(
    chain: &mut Chain<'_>,
    buf: &mut Vec<u8>,
    mut copy: impl FnMut(GuestAddress, &mut [u8]) -> bool,
) -> TxChain {
    let mut off = 0usize;
    let bad = loop {
        let d = match chain.next_buffer() {
            Ok(Some(d)) => d,
            Ok(None) => break None,
            Err(f) => return TxChain::Bad(link_reason(f)),
        };
        if d.is_write_only() {
            break Some(BadTx::Writable);
        }
        let len = d.len() as usize;
        if off + len > MAX_TX_LEN {
            break Some(BadTx::TooLong);
        }
        if buf.len() < off + len {
            buf.resize(off + len, 0);
        }
        if !copy(d.addr(), &mut buf[off..off + len]) {
            break Some(BadTx::OutOfRange);
        }
        off += len;
    };
    match bad {
        Some(b) => TxChain::Bad(chain.link_fault().map_or(b, link_reason)),
        None if off < NET_HDR_LEN => TxChain::Bad(BadTx::ShortHeader),
        None => TxChain::Ok { len: off },
    }
}

/// The one path out of a tx ring: a view of the split ring for one batch
/// ([`RingView`]: rings resolved once per batch, the avail index read once
/// per batch, used entries written as chains complete, the used index
/// published every [`super::ring::PUBLISH_EVERY`] entries and at
/// [`TxRing::finish`], one notification decision per batch by the caller,
/// with [`super::ring::needs_notification`]). Chains are walked by
/// [`Chain`]. The caller holds the vring's lock from [`TxRing::open`] to
/// [`TxRing::finish`].
pub(crate) struct TxRing<'a> {
    r: RingView<'a>,
}

impl<'a> TxRing<'a> {
    /// Resolves the rings of `q`; `None` when the queue is not ready (see
    /// [`RingView::open`]).
    pub(crate) fn open(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        RingView::open(q, mem).map(|r| Self { r })
    }

    /// As [`TxRing::open`], every ring area reached by guest address.
    #[cfg(test)]
    fn open_by_address(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        RingView::open_by_address(q, mem).map(|r| Self { r })
    }

    /// Publishes the used index and hands the ring positions back to `q`.
    pub(crate) fn finish(self, q: &mut Queue) {
        self.r.finish(q);
    }

    /// Pops the next chain, copies its readable bytes into `buf` (resized
    /// as needed up to [`MAX_TX_LEN`]) and completes it with length 0.
    /// `Ok(None)` when the ring is empty; `Err` when the driver's avail
    /// index runs more than a ring ahead of the device or cannot be read
    /// (see [`RingView::refresh_avail`]): nothing is popped then, and the
    /// caller stops using the ring.
    pub(crate) fn next(&mut self, buf: &mut Vec<u8>) -> Result<Option<TxChain>, RingStop> {
        let Some(head) = self.r.pop_head()? else {
            return Ok(None);
        };
        if let Some(len) = self.single(head, buf) {
            self.r.push_used(head, 0);
            return Ok(Some(TxChain::Ok { len }));
        }
        Ok(Some(self.walk(head, buf)))
    }

    /// The common chain: one readable descriptor (no `NEXT`, not
    /// indirect) of [`NET_HDR_LEN`]..=[`MAX_TX_LEN`] bytes in one memory
    /// region (a driver that puts the virtio-net header in front of the
    /// frame, as Linux's virtio_net and DPDK's virtio PMD do). Copied as
    /// the walk would copy it, without the walk; the frame's length. `None`
    /// for any other chain: nothing was read, and the walk takes it.
    #[inline]
    fn single(&mut self, head: u16, buf: &mut Vec<u8>) -> Option<usize> {
        let d = self.r.host_desc(head)?;
        let len = d.len() as usize;
        let plain = d.flags()
            & (VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE) as u16
            == 0;
        if !plain || !(NET_HDR_LEN..=MAX_TX_LEN).contains(&len) {
            return None;
        }
        let src = self.r.buffer(d.addr(), len)?;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        src.copy_to(&mut buf[..len]);
        Some(len)
    }

    /// [`TxRing::next`] for any chain: walks it and completes it.
    #[inline(never)]
    fn walk(&mut self, head: u16, buf: &mut Vec<u8>) -> TxChain {
        let (mem, desc, size) = (self.r.mem, self.r.desc, self.r.size);
        let mut chain = Chain::in_ring(mem, desc, size, head);
        let r = &mut self.r;
        let out = gather(&mut chain, buf, |addr, dst| {
            match r.buffer(addr, dst.len()) {
                Some(src) => {
                    src.copy_to(dst);
                    true
                }
                // Outside guest memory, or across regions.
                None => mem.read_slice(dst, addr).is_ok(),
            }
        });
        if head < self.r.size {
            // An out-of-range head cannot be completed: the used entry
            // would name a descriptor that does not exist.
            self.r.push_used(head, 0);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::QueueT;
    use vm_memory::{Address, GuestAddress, GuestMemoryMmap};

    use super::*;

    const BUF: u64 = 0x10_0000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap()
    }

    /// The ring's areas in host memory, and by guest address (a ring a
    /// guest placed across regions).
    const AREAS: [(&str, bool); 2] = [("host", false), ("by address", true)];

    /// One chain of `q` through a ring view (`by_address`: see [`AREAS`]).
    fn next(
        by_address: bool,
        q: &mut Queue,
        m: &GuestMemoryMmap,
        buf: &mut Vec<u8>,
    ) -> Result<Option<TxChain>, RingStop> {
        let mut r = if by_address {
            TxRing::open_by_address(q, m)
        } else {
            TxRing::open(q, m)
        }
        .expect("ready");
        let out = r.next(buf);
        r.finish(q);
        out
    }

    #[test]
    fn tx_gathers_chain_and_rejects_writable() {
        for (areas, open) in AREAS {
            let m = mem();
            let mq = MockSplitQueue::new(&m, 16);
            m.write_slice(&[9u8; 12], GuestAddress(BUF)).unwrap();
            m.write_slice(&[5u8; 60], GuestAddress(BUF + 0x1000))
                .unwrap();
            let descs = [
                RawDescriptor::from(SplitDescriptor::new(BUF, 12, VRING_DESC_F_NEXT as u16, 1)),
                RawDescriptor::from(SplitDescriptor::new(BUF + 0x1000, 60, 0, 0)),
                RawDescriptor::from(SplitDescriptor::new(
                    BUF + 0x2000,
                    60,
                    VRING_DESC_F_WRITE as u16,
                    0,
                )),
            ];
            mq.build_multiple_desc_chains(&descs).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let mut buf = Vec::new();
            assert_eq!(
                next(open, &mut q, &m, &mut buf),
                Ok(Some(TxChain::Ok { len: 72 })),
                "{areas}"
            );
            assert_eq!(&buf[..12], &[9u8; 12]);
            assert_eq!(&buf[12..72], &[5u8; 60]);
            assert_eq!(
                next(open, &mut q, &m, &mut buf),
                Ok(Some(TxChain::Bad(BadTx::Writable))),
                "{areas}"
            );
            assert_eq!(next(open, &mut q, &m, &mut buf), Ok(None), "{areas}");
            assert_eq!(q.next_used(), 2, "{areas}");
            let used_idx: u16 = m.read_obj(mq.used_addr().checked_add(2).unwrap()).unwrap();
            assert_eq!(used_idx, 2, "{areas}: published");
        }
    }

    #[test]
    fn a_loop_of_big_buffers_is_a_loop_and_a_jump_stops_without_popping() {
        for (areas, open) in AREAS {
            let m = mem();
            let mq = MockSplitQueue::new(&m, 16);
            // Two 60 KiB descriptors pointing at each other: the length
            // check trips first, the reason is still the loop.
            let descs = [
                RawDescriptor::from(SplitDescriptor::new(
                    BUF,
                    60_000,
                    VRING_DESC_F_NEXT as u16,
                    1,
                )),
                RawDescriptor::from(SplitDescriptor::new(
                    BUF,
                    60_000,
                    VRING_DESC_F_NEXT as u16,
                    0,
                )),
            ];
            mq.add_desc_chains(&descs, 0).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let mut buf = Vec::new();
            assert_eq!(
                next(open, &mut q, &m, &mut buf),
                Ok(Some(TxChain::Bad(BadTx::Loop))),
                "{areas}"
            );
            // The driver now says 40 more entries are there on a 16-entry
            // ring.
            let idx = mq.avail().idx().load();
            mq.avail().idx().store(idx.wrapping_add(40));
            let next_avail = q.next_avail();
            assert_eq!(
                next(open, &mut q, &m, &mut buf),
                Err(RingStop::AvailJump),
                "{areas}"
            );
            assert_eq!(q.next_avail(), next_avail, "{areas}: nothing popped");
        }
    }

    #[test]
    fn the_single_descriptor_path_gathers_what_the_walk_gathers() {
        // Random rings (descriptor flags, lengths from 0 past MAX_TX_LEN,
        // buffers in one region, across two, past the end of memory;
        // heads in and out of the table; NEXT and INDIRECT links) taken by
        // `next` (which takes its single-descriptor path where it can) and
        // by the walk alone, on two copies of the same guest memory: what
        // each chain gave (frame bytes, or the reason it was bad), the
        // ring positions and every byte of guest memory must agree.
        use crate::virtq::random_ring::{addr, heads, posted, snapshot, Draw};
        let mut draw = Draw(0x2545_F491_4F6C_DD1D);
        let (mut oks, mut bads) = (0u32, 0u32);
        for round in 0..300 {
            let descs: Vec<RawDescriptor> = (0..16u16)
                .map(|i| {
                    let a = addr(&mut draw, BUF + u64::from(i) * 0x1_0000);
                    let len = match draw.below(8) {
                        0 => 0,
                        1 => 11,
                        2 => 12,
                        3 => 60,
                        4 => (MAX_TX_LEN + 1) as u32,
                        5 => MAX_TX_LEN as u32,
                        _ => 1 + draw.below(2000) as u32,
                    };
                    let (flags, next) = match draw.below(10) {
                        0 => (VRING_DESC_F_WRITE as u16, 0),
                        1 => (VRING_DESC_F_NEXT as u16, draw.below(20) as u16),
                        2 => (VRING_DESC_F_INDIRECT as u16, 0),
                        _ => (0, 0),
                    };
                    RawDescriptor::from(SplitDescriptor::new(a, len, flags, next))
                })
                .collect();
            let heads = heads(&mut draw);
            let run = |walk_only: bool| {
                let (m, mut q) = posted(&descs, &heads, |m| {
                    for i in 0..16u64 {
                        let fill: Vec<u8> = (0..0x1_0000u64).map(|k| (k ^ i) as u8).collect();
                        m.write_slice(&fill, GuestAddress(BUF + i * 0x1_0000))
                            .unwrap();
                    }
                });
                let mut r = TxRing::open(&q, &m).unwrap();
                let mut got = Vec::new();
                let mut buf = Vec::new();
                loop {
                    let out = if walk_only {
                        match r.r.pop_head() {
                            Ok(Some(head)) => Ok(Some(r.walk(head, &mut buf))),
                            Ok(None) => Ok(None),
                            Err(e) => Err(e),
                        }
                    } else {
                        r.next(&mut buf)
                    };
                    match out {
                        Ok(Some(TxChain::Ok { len })) => got.push(Ok(buf[..len].to_vec())),
                        Ok(Some(TxChain::Bad(b))) => got.push(Err(b)),
                        Ok(None) | Err(_) => break,
                    }
                }
                r.finish(&mut q);
                (got, q.next_avail(), q.next_used(), snapshot(&m))
            };
            let (got, avail, used, mem_a) = run(false);
            let (got_b, avail_b, used_b, mem_b) = run(true);
            assert_eq!(got, got_b, "round {round}");
            assert_eq!((avail, used), (avail_b, used_b), "round {round}");
            assert!(mem_a == mem_b, "round {round}: guest memory differs");
            oks += got.iter().filter(|g| g.is_ok()).count() as u32;
            bads += got.iter().filter(|g| g.is_err()).count() as u32;
        }
        // Both kinds of chain were there to compare.
        assert!(oks > 300 && bads > 300, "{oks} {bads}");
    }

    /// A ring whose avail ring leaves guest memory cannot be read: the
    /// ring stops, nothing popped.
    #[test]
    fn an_avail_ring_outside_memory_is_unreadable() {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        let mut q: Queue = mq.create_queue().unwrap();
        q.set_avail_ring_address(Some(0x7fff_0000), Some(0));
        q.set_ready(true);
        let mut buf = Vec::new();
        let mut r = TxRing::open(&q, &m).expect("ready");
        assert_eq!(r.next(&mut buf), Err(RingStop::AvailUnreadable));
        r.finish(&mut q);
        assert_eq!(q.next_avail(), 0);
    }
}
