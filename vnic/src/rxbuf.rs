//! Virtqueue buffer handling for the packet path: filling rx chains (with
//! `VIRTIO_NET_F_MRG_RXBUF`) and gathering tx chains. Everything the guest
//! put in a ring is treated as hostile: a chain that cannot be used is
//! consumed with length 0 and counted, never left in the ring and never
//! allowed to stop the queue.

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

/// Size of `struct virtio_net_hdr_v1` (VERSION_1 always uses it, with or
/// without MRG_RXBUF).
pub const NET_HDR_LEN: usize = 12;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_OFF: usize = 10;
/// Most rx chains one frame may span.
pub const MAX_BUFS_PER_FRAME: usize = 64;
/// Largest tx chain accepted (header + 64 KiB frame).
pub const MAX_TX_LEN: usize = NET_HDR_LEN + 65_536;

/// What became of a frame offered to an rx queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxOutcome {
    /// Written into `buffers` chains and published in the used ring.
    Delivered { buffers: u16 },
    /// The ring ran out of buffers: nothing was published (chains put back).
    NoBuffers,
    /// The frame needs more chains than allowed (or one chain without MRG_RXBUF).
    TooBig,
}

/// Writes `pkt` (12-byte virtio-net header space followed by the frame) into
/// rx chains of `queue`. The header is written as all zero except
/// `num_buffers`. `bad` is incremented for each unusable chain (consumed with
/// length 0). Used-ring entries are added but the guest is not notified: the
/// caller calls `needs_notification` once per batch.
pub fn deliver<M: GuestMemory>(
    queue: &mut Queue,
    mem: &M,
    pkt: &mut [u8],
    mrg: bool,
    bad: &mut u64,
) -> RxOutcome {
    debug_assert!(pkt.len() >= NET_HDR_LEN);
    pkt[..NET_HDR_LEN].fill(0);
    // num_buffers = 1 is the common case, patched later when more are used.
    pkt[NUM_BUFFERS_OFF] = 1;
    let total = pkt.len();
    let max_bufs = if mrg { MAX_BUFS_PER_FRAME } else { 1 };
    let qsize = usize::from(queue.size());

    // (head, bytes written) of the chains taken for this frame, in order:
    // inline for the common case, spilled to the heap past 8 chains.
    let mut used = Used::default();
    let mut nused = 0usize;
    // Guest addresses of the two num_buffers bytes.
    let mut nb_addr: [Option<GuestAddress>; 2] = [None, None];
    let mut off = 0usize;

    while off < total {
        if nused == max_bufs {
            undo(queue, nused);
            return RxOutcome::TooBig;
        }
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            undo(queue, nused);
            return RxOutcome::NoBuffers;
        };
        let head = chain.head_index();
        let start = off;
        let mut ok = true;
        let mut ndesc = 0usize;
        let mut last_next = false;
        // Walk the whole chain even once the frame is written: a chain that
        // is broken further on (loop, next out of range, bad indirect table,
        // descriptor outside memory) is rejected as a whole.
        for desc in chain {
            ndesc += 1;
            last_next = desc.has_next();
            let len = desc.len() as usize;
            if !desc.is_write_only() {
                ok = false;
                break;
            }
            // One walk over the descriptor's memory validates all of it and
            // writes the part of the frame that goes there.
            let mut doff = 0usize;
            let Ok(slices) = mem.get_slices(desc.addr(), len, Permissions::Write) else {
                ok = false;
                break;
            };
            for slice in slices {
                let Ok(slice) = slice else {
                    ok = false;
                    break;
                };
                let n = slice.len().min(total - off);
                if n > 0 {
                    slice.copy_from(&pkt[off..off + n]);
                    for (i, slot) in nb_addr.iter_mut().enumerate() {
                        let b = NUM_BUFFERS_OFF + i;
                        if slot.is_none() && b >= off && b < off + n {
                            *slot = desc.addr().checked_add((doff + b - off) as u64);
                        }
                    }
                    off += n;
                }
                doff += slice.len();
            }
            if !ok {
                break;
            }
        }
        // The iterator ends silently on a broken link: a last descriptor that
        // still says NEXT means the chain was cut short.
        // Longer than the ring (possible through an indirect table): invalid.
        if last_next || ndesc > qsize {
            ok = false;
        }
        // The first chain must at least hold the whole header.
        if ok && (ndesc == 0 || off == start || (nused == 0 && off < NET_HDR_LEN.min(total))) {
            ok = false;
        }
        if !ok {
            // Unusable chain. Give back what was already taken for this frame
            // as zero-length completions first (used-ring order must stay the
            // pop order), then the bad chain, and start the frame over.
            *bad += 1;
            for &(h, _) in used.as_slice(nused) {
                let _ = queue.add_used(mem, h, 0);
            }
            let _ = queue.add_used(mem, head, 0);
            nused = 0;
            nb_addr = [None, None];
            off = 0;
            continue;
        }
        used.push(nused, (head, (off - start) as u32));
        nused += 1;
    }

    if nused > 1 {
        let nb = (nused as u16).to_le_bytes();
        for (i, a) in nb_addr.iter().enumerate() {
            if let Some(a) = a {
                let _ = mem.write_slice(&nb[i..=i], *a);
            }
        }
    }
    for &(h, len) in used.as_slice(nused) {
        let _ = queue.add_used(mem, h, len);
    }
    RxOutcome::Delivered {
        buffers: nused as u16,
    }
}

/// The chains taken for one frame: 8 inline, more on the heap.
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

    fn as_slice(&self, n: usize) -> &[(u16, u32)] {
        if n <= self.small.len() {
            &self.small[..n]
        } else {
            &self.big[..n]
        }
    }
}

fn undo(queue: &mut Queue, n: usize) {
    for _ in 0..n {
        queue.go_to_previous_position();
    }
}

/// Result of gathering one tx chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxChain {
    /// `len` bytes (header included) gathered into the buffer.
    Ok { len: usize },
    /// Unusable chain (write-only descriptor, address outside guest memory,
    /// longer than [`MAX_TX_LEN`], shorter than the header, or cut short by
    /// a broken link).
    Bad,
}

/// Pops one tx chain, copies its readable bytes into `buf` (resized as
/// needed up to [`MAX_TX_LEN`]), and completes it with length 0. Returns
/// `None` when the ring is empty.
pub fn gather_tx<M: GuestMemory>(queue: &mut Queue, mem: &M, buf: &mut Vec<u8>) -> Option<TxChain> {
    let qsize = usize::from(queue.size());
    let chain = queue.pop_descriptor_chain(mem)?;
    let head = chain.head_index();
    let mut off = 0usize;
    let mut ok = true;
    let mut ndesc = 0usize;
    let mut last_next = false;
    for desc in chain {
        ndesc += 1;
        last_next = desc.has_next();
        if desc.is_write_only() {
            ok = false;
            break;
        }
        let len = desc.len() as usize;
        if off + len > MAX_TX_LEN {
            ok = false;
            break;
        }
        if buf.len() < off + len {
            buf.resize(off + len, 0);
        }
        if mem
            .read_slice(&mut buf[off..off + len], desc.addr())
            .is_err()
        {
            ok = false;
            break;
        }
        off += len;
    }
    let _ = queue.add_used(mem, head, 0);
    // Broken link (loop, next out of range, bad indirect table), nothing in
    // it, or not even a virtio-net header: unusable.
    if !ok || ndesc == 0 || ndesc > qsize || last_next || off < NET_HDR_LEN {
        return Some(TxChain::Bad);
    }
    Some(TxChain::Ok { len: off })
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

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

    fn used(m: &GuestMemoryMmap, mq: &MockSplitQueue<'_, GuestMemoryMmap>, i: u16) -> (u32, u32) {
        let base = mq.used_addr().checked_add(4 + u64::from(i) * 8).unwrap();
        (
            m.read_obj::<u32>(base).unwrap(),
            m.read_obj::<u32>(base.checked_add(4).unwrap()).unwrap(),
        )
    }

    #[test]
    fn small_frame_one_buffer() {
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

    #[test]
    fn no_buffers_puts_chains_back() {
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
            Some(TxChain::Ok { len: 72 })
        );
        assert_eq!(&buf[..12], &[9u8; 12]);
        assert_eq!(&buf[12..72], &[5u8; 60]);
        assert_eq!(gather_tx(&mut q, &m, &mut buf), Some(TxChain::Bad));
        assert_eq!(gather_tx(&mut q, &m, &mut buf), None);
        assert_eq!(q.next_used(), 2);
    }
}
