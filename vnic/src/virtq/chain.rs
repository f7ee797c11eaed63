//! The one descriptor-chain walker of both directions.
//!
//! [`Chain`] follows a split-ring chain from its head and yields its buffer
//! descriptors, indirect tables followed (one level, as the spec allows),
//! and stops at the first fault in the chain's links, naming it
//! ([`LinkFault`]). What a buffer may be (readable for tx, writable for
//! rx) and where its bytes go is the caller's business; the chain's shape
//! is checked here once:
//!
//! - a head or `next` index outside its table: [`LinkFault::BadIndex`];
//! - a descriptor or an indirect table outside guest memory:
//!   [`LinkFault::OutOfRange`];
//! - an indirect descriptor the spec forbids (inside a table, a table
//!   length that is 0, not a multiple of 16 or over 2^16 entries), or
//!   more buffers through a table than the ring has entries:
//!   [`LinkFault::Indirect`];
//! - more links than the table has entries (a loop), or more buffers than
//!   the ring has entries: [`LinkFault::Loop`].
//!
//! The descriptor table is read through a host slice when it lies in one
//! region, or by guest address when a guest placed it across regions (an
//! indirect table too). Nothing here panics or allocates, on any input.

use virtio_queue::desc::split::Descriptor;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    VolatileSlice,
};

use super::ring::Area;

/// What is wrong with a chain's links (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LinkFault {
    BadIndex,
    OutOfRange,
    Indirect,
    Loop,
}

/// Where the descriptors being walked are.
enum Table<'a> {
    /// Host memory (the ring's table, or an indirect table in one region).
    Slice(VolatileSlice<'a, ()>),
    /// Guest memory, read descriptor by descriptor (a table across
    /// regions).
    Guest(GuestAddress),
}

/// One chain being walked (see the module's doc).
pub(crate) struct Chain<'a> {
    mem: &'a GuestMemoryMmap,
    table: Table<'a>,
    /// Entries of the table being walked.
    table_len: u16,
    /// Entries of the ring (the most buffers a chain may have).
    ring_size: u16,
    indirect: bool,
    idx: u16,
    /// Links left before the walk is a loop.
    left: u16,
    /// Buffers yielded so far.
    buffers: usize,
    done: bool,
}

impl<'a> Chain<'a> {
    /// The chain at `head` of a ring of `size` entries whose descriptor
    /// table is `desc` (host memory, or by guest address when the table
    /// lies across regions: see [`Area`]).
    #[inline]
    pub(crate) fn in_ring(mem: &'a GuestMemoryMmap, desc: Area<'a>, size: u16, head: u16) -> Self {
        let table = match desc {
            Area::Host(s) => Table::Slice(s),
            Area::Guest(a) => Table::Guest(a),
        };
        Self::new(mem, table, size, head)
    }

    #[inline]
    fn new(mem: &'a GuestMemoryMmap, table: Table<'a>, size: u16, head: u16) -> Self {
        Self {
            mem,
            table,
            table_len: size,
            ring_size: size,
            indirect: false,
            idx: head,
            left: size,
            buffers: 0,
            done: false,
        }
    }

    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn read(&self, i: u16) -> Option<Descriptor> {
        let at = 16 * usize::from(i);
        match &self.table {
            Table::Slice(t) => t.read_obj(at).ok(),
            Table::Guest(base) => base
                .checked_add(at as u64)
                .and_then(|a| self.mem.read_obj(a).ok()),
        }
    }

    /// The indirect table `d` names, and its entries (a table across
    /// regions is read by guest address; one that leaves guest memory is
    /// refused whole). Takes no `self`: the walk's state stays in
    /// registers on the hot path (a call on `&mut self` here, out of line,
    /// would make every step load and store it).
    #[cold]
    fn indirect_table(
        mem: &'a GuestMemoryMmap,
        d: &Descriptor,
    ) -> Result<(Table<'a>, u16), LinkFault> {
        let n = d.len() / 16;
        if !d.len().is_multiple_of(16) || n == 0 || n > u32::from(u16::MAX) {
            return Err(LinkFault::Indirect);
        }
        let len = d.len() as usize;
        let slice = mem
            .to_region_addr(d.addr())
            .and_then(|(r, off)| r.get_slice(off, len).ok());
        let table = match slice {
            Some(t) => Table::Slice(t),
            None if mem.check_range(d.addr(), len) => Table::Guest(d.addr()),
            None => return Err(LinkFault::OutOfRange),
        };
        Ok((table, n as u16))
    }

    /// The chain's next buffer descriptor; `Ok(None)` after its last.
    /// After an `Err` the walk is over.
    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn next_buffer(&mut self) -> Result<Option<Descriptor>, LinkFault> {
        if self.done {
            return Ok(None);
        }
        let r = self.step();
        if !matches!(r, Ok(Some(_))) {
            self.done = true;
        }
        r
    }

    // Per-frame path, inlined as a group: with #[inline] alone, callgrind (TX 64 B)
    // showed Chain::step, RingView::pop_head and push_used out of line.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn step(&mut self) -> Result<Option<Descriptor>, LinkFault> {
        loop {
            if self.idx >= self.table_len {
                return Err(LinkFault::BadIndex);
            }
            if self.left == 0 {
                return Err(LinkFault::Loop);
            }
            let d = self.read(self.idx).ok_or(LinkFault::OutOfRange)?;
            if d.refers_to_indirect_table() {
                if self.indirect {
                    return Err(LinkFault::Indirect);
                }
                let (table, n) = Self::indirect_table(self.mem, &d)?;
                self.table = table;
                self.table_len = n;
                self.left = n;
                self.indirect = true;
                self.idx = 0;
                continue;
            }
            self.buffers += 1;
            if self.buffers > usize::from(self.ring_size) {
                // Spec 2.7.5.3.1: no chain longer than the queue size.
                return Err(if self.indirect {
                    LinkFault::Indirect
                } else {
                    LinkFault::Loop
                });
            }
            if d.has_next() {
                self.idx = d.next();
                self.left -= 1;
            } else {
                self.done = true;
            }
            return Ok(Some(d));
        }
    }

    /// Walks what is left of the chain without looking at its buffers:
    /// the first fault in its links, if any.
    #[inline]
    pub(crate) fn link_fault(&mut self) -> Option<LinkFault> {
        loop {
            match self.next_buffer() {
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(f) => return Some(f),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};

    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const IND: u16 = VRING_DESC_F_INDIRECT as u16;
    const TABLE: u64 = 0x1000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    fn put(m: &GuestMemoryMmap, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        m.write_obj(
            Descriptor::new(addr, len, flags, next),
            GuestAddress(table + 16 * u64::from(i)),
        )
        .unwrap();
    }

    /// Both ways of reaching the table give the same walk.
    fn walk(m: &GuestMemoryMmap, size: u16, head: u16) -> (Vec<u64>, Option<LinkFault>) {
        let mut out = Vec::new();
        let mut results = Vec::new();
        for by_slice in [false, true] {
            let mut c = if by_slice {
                let s = m
                    .get_slice(GuestAddress(TABLE), 16 * usize::from(size))
                    .unwrap();
                Chain::in_ring(m, Area::Host(s), size, head)
            } else {
                Chain::in_ring(m, Area::Guest(GuestAddress(TABLE)), size, head)
            };
            let mut addrs = Vec::new();
            let fault = loop {
                match c.next_buffer() {
                    Ok(Some(d)) => addrs.push(d.addr().0),
                    Ok(None) => break None,
                    Err(f) => break Some(f),
                }
            };
            assert!(matches!(c.next_buffer(), Ok(None)), "the walk stays over");
            results.push((addrs.clone(), fault));
            out = addrs;
        }
        assert_eq!(results[0], results[1]);
        (out, results[0].1)
    }

    #[test]
    fn a_plain_chain_yields_its_buffers_in_order() {
        let m = mem();
        put(&m, TABLE, 0, 0x8000, 10, NEXT, 2);
        put(&m, TABLE, 2, 0x9000, 20, NEXT, 1);
        put(&m, TABLE, 1, 0xa000, 30, 0, 0);
        assert_eq!(walk(&m, 4, 0), (vec![0x8000, 0x9000, 0xa000], None));
    }

    #[test]
    fn broken_links_are_named() {
        let m = mem();
        // next out of the table
        put(&m, TABLE, 0, 0x8000, 10, NEXT, 9);
        assert_eq!(walk(&m, 4, 0), (vec![0x8000], Some(LinkFault::BadIndex)));
        // head out of the table
        assert_eq!(walk(&m, 4, 4).1, Some(LinkFault::BadIndex));
        // a loop
        put(&m, TABLE, 0, 0x8000, 10, NEXT, 1);
        put(&m, TABLE, 1, 0x8000, 10, NEXT, 0);
        assert_eq!(walk(&m, 4, 0).1, Some(LinkFault::Loop));
        // a table outside memory (by address; a slice cannot be made)
        let mut c = Chain::in_ring(&m, Area::Guest(GuestAddress(0xffff_0000)), 4, 0);
        assert!(matches!(c.next_buffer(), Err(LinkFault::OutOfRange)));
    }

    #[test]
    fn indirect_tables_are_followed_once_and_checked() {
        let m = mem();
        let ind = 0x4000;
        put(&m, ind, 0, 0x8000, 10, NEXT, 1);
        put(&m, ind, 1, 0x9000, 10, 0, 0);
        put(&m, TABLE, 0, ind, 32, IND, 0);
        assert_eq!(walk(&m, 4, 0), (vec![0x8000, 0x9000], None));
        // nested
        put(&m, ind, 1, ind, 32, IND, 0);
        assert_eq!(walk(&m, 4, 0).1, Some(LinkFault::Indirect));
        // a length that is not whole descriptors, or 0
        for len in [0, 24] {
            put(&m, TABLE, 0, ind, len, IND, 0);
            assert_eq!(walk(&m, 4, 0).1, Some(LinkFault::Indirect), "len {len}");
        }
        // more buffers than the ring has entries, through a table
        for i in 0..5 {
            put(&m, ind, i, 0x8000, 1, NEXT, i + 1);
        }
        put(&m, ind, 5, 0x8000, 1, 0, 0);
        put(&m, TABLE, 0, ind, 6 * 16, IND, 0);
        assert_eq!(walk(&m, 4, 0).1, Some(LinkFault::Indirect));
        // a table outside memory
        put(&m, TABLE, 0, 0xfff0, 64, IND, 0);
        assert_eq!(walk(&m, 4, 0).1, Some(LinkFault::OutOfRange));
    }

    #[test]
    fn link_fault_finishes_the_walk() {
        let m = mem();
        put(&m, TABLE, 0, 0x8000, 10, NEXT, 1);
        put(&m, TABLE, 1, 0x8000, 10, NEXT, 7);
        let mut c = Chain::in_ring(&m, Area::Guest(GuestAddress(TABLE)), 4, 0);
        assert!(c.next_buffer().unwrap().is_some());
        assert_eq!(c.link_fault(), Some(LinkFault::BadIndex));
    }
}
