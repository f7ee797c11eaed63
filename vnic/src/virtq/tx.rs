//! Gathering tx chains: each chain's readable bytes are copied into one
//! buffer and the chain is completed at once (length 0). A chain that
//! cannot be used is completed the same way and reported with the reason
//! ([`BadTx`]); a ring whose avail index the device cannot trust is
//! reported as [`RingStop`] without touching it.

use std::num::Wrapping;
use std::sync::atomic::Ordering;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Error as QueueError, Queue, QueueOwnedT, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice,
};

use super::ring::RingView;
use super::{RingStop, NET_HDR_LEN};

/// Largest tx chain accepted (header + 64 KiB frame).
pub const MAX_TX_LEN: usize = NET_HDR_LEN + 65_536;

pub use crate::stats::BadTx;

/// Result of gathering one tx chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxChain {
    /// `len` bytes (header included) gathered into the buffer.
    Ok { len: usize },
    /// Unusable chain, consumed and completed with length 0.
    Bad(BadTx),
}

/// Pops one tx chain, copies its readable bytes into `buf` (resized as
/// needed up to [`MAX_TX_LEN`]), and completes it with length 0. Returns
/// `Ok(None)` when the ring is empty or not started, and `Err` when the
/// driver's avail index runs more than a ring ahead of the device (or
/// cannot be read): nothing is popped then, and the caller stops using
/// the ring.
pub fn gather_tx<M: GuestMemory>(
    queue: &mut Queue,
    mem: &M,
    buf: &mut Vec<u8>,
) -> Result<Option<TxChain>, RingStop> {
    let qsize = queue.size();
    let desc_table = GuestAddress(queue.desc_table());
    // Queue::pop_descriptor_chain would log every refusal: a driver that
    // kicks in a loop must not flood the log.
    let chain = match queue.iter(mem) {
        Ok(mut it) => match it.next() {
            Some(c) => c,
            None => return Ok(None),
        },
        Err(QueueError::QueueNotReady) => return Ok(None),
        Err(QueueError::InvalidAvailRingIndex) => return Err(RingStop::AvailJump),
        Err(_) => return Err(RingStop::AvailUnreadable),
    };
    let head = chain.head_index();
    let mut off = 0usize;
    let mut bad = None;
    let mut ndesc = 0usize;
    let mut last_next = false;
    for desc in chain {
        ndesc += 1;
        last_next = desc.has_next();
        if desc.is_write_only() {
            bad = Some(BadTx::Writable);
            break;
        }
        let len = desc.len() as usize;
        if off + len > MAX_TX_LEN {
            bad = Some(BadTx::TooLong);
            break;
        }
        if buf.len() < off + len {
            buf.resize(off + len, 0);
        }
        if mem
            .read_slice(&mut buf[off..off + len], desc.addr())
            .is_err()
        {
            bad = Some(BadTx::OutOfRange);
            break;
        }
        off += len;
    }
    if head < qsize {
        // (virtio-queue refuses, and logs, an out-of-range head.)
        let _ = queue.add_used(mem, head, 0);
    }
    // Broken link (loop, next out of range, bad indirect table) or too
    // many descriptors: the walk ended early. A broken structure is the
    // reason even when a buffer check stopped the walk first (a loop of
    // big buffers is a loop, not a long frame).
    let broken = ndesc == 0 || ndesc > usize::from(qsize) || last_next;
    if broken || bad.is_some() {
        if let Some(r) = structure_fault(mem, desc_table, qsize, head) {
            return Ok(Some(TxChain::Bad(r)));
        }
    }
    if let Some(r) = bad {
        return Ok(Some(TxChain::Bad(r)));
    }
    if broken {
        // The structure walk found nothing, yet the iterator stopped: the
        // only case left is a chain over 4 GiB in total.
        return Ok(Some(TxChain::Bad(BadTx::TooLong)));
    }
    if off < NET_HDR_LEN {
        return Ok(Some(TxChain::Bad(BadTx::ShortHeader)));
    }
    Ok(Some(TxChain::Ok { len: off }))
}

/// A worker's tx ring during one batch, read without virtio-queue's
/// per-chain calls ([`RingView`]: rings resolved to host memory once per
/// batch, the avail index read once per batch, used entries written as
/// chains complete, the used index published every
/// [`super::ring::PUBLISH_EVERY`] entries and at [`TxRing::finish`], one
/// notification decision per batch by the caller, with
/// [`super::rx::needs_notification`]).
///
/// Chains are checked as [`gather_tx`] checks them and a bad one is named
/// by the same rules ([`structure_fault`] on the bad path), so the counters
/// do not depend on which path ran. The caller holds the vring's lock from
/// [`TxRing::open`] to [`TxRing::finish`].
pub struct TxRing<'a> {
    r: RingView<'a>,
}

impl<'a> TxRing<'a> {
    /// Resolves the rings of `q`; `None` when [`RingView::open`] cannot
    /// (the caller then uses [`gather_tx`]).
    pub fn open(q: &Queue, mem: &'a GuestMemoryMmap) -> Option<Self> {
        RingView::open(q, mem).map(|r| Self { r })
    }

    /// Publishes the used index and hands the ring positions back to `q`.
    pub fn finish(self, q: &mut Queue) {
        self.r.finish(q);
    }

    /// The next chain, gathered into `buf` and completed (length 0), as
    /// [`gather_tx`] does it.
    pub fn next(&mut self, buf: &mut Vec<u8>) -> Result<Option<TxChain>, RingStop> {
        let Some(head) = self.r.pop_head()? else {
            return Ok(None);
        };
        let walk = self.walk(head, buf);
        if head < self.r.size {
            // (An out-of-range head is not completed, as on the other path.)
            self.r.push_used(head, 0);
        }
        Ok(Some(match walk {
            Ok(len) if len < NET_HDR_LEN => TxChain::Bad(BadTx::ShortHeader),
            Ok(len) => TxChain::Ok { len },
            Err(bad) => TxChain::Bad(
                structure_fault(self.r.mem, self.r.desc_table, self.r.size, head)
                    .or(bad)
                    // The links are sound and no buffer was at fault: the
                    // only case left is a chain over 4 GiB in total.
                    .unwrap_or(BadTx::TooLong),
            ),
        }))
    }

    /// Copies the readable buffers of the chain at `head` into `buf`:
    /// `Ok(bytes)`, or `Err` with the buffer at fault (`None` when the walk
    /// stopped on the chain's links; [`structure_fault`] names those).
    #[inline]
    fn walk(&mut self, head: u16, buf: &mut Vec<u8>) -> Result<usize, Option<BadTx>> {
        let mut table = self.r.desc;
        let mut table_len = self.r.size;
        let mut indirect = false;
        let mut idx = head;
        let mut ttl = table_len;
        let mut ndesc = 0usize;
        let mut off = 0usize;
        let mut copied: Vec<u8> = Vec::new();
        loop {
            if idx >= table_len {
                return Err(None);
            }
            let d: Descriptor = table.read_obj(16 * usize::from(idx)).map_err(|_| None)?;
            if d.refers_to_indirect_table() {
                if indirect || !d.len().is_multiple_of(16) || d.len() == 0 || d.len() / 16 > 0xFFFF
                {
                    return Err(None);
                }
                let len = d.len() as usize;
                table = if let Ok(t) = self.r.mem.get_slice(d.addr(), len) {
                    t
                } else {
                    copied.resize(len, 0);
                    self.r
                        .mem
                        .read_slice(&mut copied, d.addr())
                        .map_err(|_| None)?;
                    VolatileSlice::from(copied.as_mut_slice())
                };
                table_len = (len / 16) as u16;
                ttl = table_len;
                indirect = true;
                idx = 0;
                continue;
            }
            ndesc += 1;
            if ndesc > usize::from(self.r.size) {
                return Err(None);
            }
            if d.is_write_only() {
                return Err(Some(BadTx::Writable));
            }
            let len = d.len() as usize;
            if off + len > MAX_TX_LEN {
                return Err(Some(BadTx::TooLong));
            }
            if buf.len() < off + len {
                buf.resize(off + len, 0);
            }
            match self.r.buffer(d.addr(), len) {
                Some(src) => {
                    src.copy_to(&mut buf[off..off + len]);
                }
                None => {
                    // Outside guest memory, or across regions.
                    self.r
                        .mem
                        .read_slice(&mut buf[off..off + len], d.addr())
                        .map_err(|_| Some(BadTx::OutOfRange))?;
                }
            }
            off += len;
            if !d.has_next() {
                return Ok(off);
            }
            ttl -= 1;
            if ttl == 0 {
                return Err(None);
            }
            idx = d.next();
        }
    }
}

/// Walks the chain at `head` the way virtio-queue does (only on the bad
/// path) and names what is wrong with its links, if anything: `None` when
/// the links are sound and only a buffer is at fault.
fn structure_fault<M: GuestMemory>(
    mem: &M,
    desc_table: GuestAddress,
    qsize: u16,
    head: u16,
) -> Option<BadTx> {
    let (mut table, mut size, mut idx) = (desc_table, qsize, head);
    let mut indirect = false;
    let mut left = qsize;
    let mut walked = 0usize;
    loop {
        if idx >= size {
            return Some(BadTx::BadIndex);
        }
        if left == 0 {
            return Some(BadTx::Loop);
        }
        let Some(Ok(d)) = table
            .checked_add(u64::from(idx) * 16)
            .map(|a| mem.read_obj::<Descriptor>(a))
        else {
            return Some(BadTx::OutOfRange);
        };
        if d.refers_to_indirect_table() {
            let n = d.len() / 16;
            if indirect || d.len() % 16 != 0 || n == 0 || n > u32::from(u16::MAX) {
                return Some(BadTx::Indirect);
            }
            (table, size, idx, left, indirect) = (d.addr(), n as u16, 0, n as u16, true);
            continue;
        }
        walked += 1;
        if walked > usize::from(qsize) {
            // Spec 2.7.5.3.1: no chain longer than the queue size.
            return Some(if indirect {
                BadTx::Indirect
            } else {
                BadTx::Loop
            });
        }
        if !d.has_next() {
            return None;
        }
        idx = d.next();
        left -= 1;
    }
}

/// Whether the avail index runs more than a ring ahead of the device's
/// position (the driver published entries it cannot have filled).
pub fn avail_ahead<M: GuestMemory>(queue: &Queue, mem: &M) -> Result<(), RingStop> {
    match queue.avail_idx(mem, Ordering::Acquire) {
        Ok(idx) if (idx - Wrapping(queue.next_avail())).0 > queue.size() => {
            Err(RingStop::AvailJump)
        }
        Ok(_) => Ok(()),
        Err(_) => Err(RingStop::AvailUnreadable),
    }
}

#[cfg(test)]
mod tests {
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;

    const BUF: u64 = 0x10_0000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap()
    }

    #[test]
    fn tx_gathers_chain_and_rejects_writable() {
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
            gather_tx(&mut q, &m, &mut buf),
            Ok(Some(TxChain::Ok { len: 72 }))
        );
        assert_eq!(&buf[..12], &[9u8; 12]);
        assert_eq!(&buf[12..72], &[5u8; 60]);
        assert_eq!(
            gather_tx(&mut q, &m, &mut buf),
            Ok(Some(TxChain::Bad(BadTx::Writable)))
        );
        assert_eq!(gather_tx(&mut q, &m, &mut buf), Ok(None));
        assert_eq!(q.next_used(), 2);
    }

    #[test]
    fn a_loop_of_big_buffers_is_a_loop_and_a_jump_stops_without_popping() {
        let m = mem();
        let mq = MockSplitQueue::new(&m, 16);
        // Two 60 KiB descriptors pointing at each other: the length check
        // trips first, the reason is still the loop.
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
            gather_tx(&mut q, &m, &mut buf),
            Ok(Some(TxChain::Bad(BadTx::Loop)))
        );
        // The driver now says 40 more entries are there on a 16-entry ring.
        let idx = mq.avail().idx().load();
        mq.avail().idx().store(idx.wrapping_add(40));
        let next = q.next_avail();
        assert_eq!(avail_ahead(&q, &m), Err(RingStop::AvailJump));
        assert_eq!(gather_tx(&mut q, &m, &mut buf), Err(RingStop::AvailJump));
        assert_eq!(q.next_avail(), next, "nothing popped");
    }
}
