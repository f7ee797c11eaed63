//! Gathering tx chains: each chain's readable bytes are copied into one
//! buffer and the chain is completed at once (length 0).

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemory};

use super::NET_HDR_LEN;

/// Largest tx chain accepted (header + 64 KiB frame).
pub const MAX_TX_LEN: usize = NET_HDR_LEN + 65_536;

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
            Some(TxChain::Ok { len: 72 })
        );
        assert_eq!(&buf[..12], &[9u8; 12]);
        assert_eq!(&buf[12..72], &[5u8; 60]);
        assert_eq!(gather_tx(&mut q, &m, &mut buf), Some(TxChain::Bad));
        assert_eq!(gather_tx(&mut q, &m, &mut buf), None);
        assert_eq!(q.next_used(), 2);
    }
}
