//! Split virtqueues laid out by the driver in guest memory (virtio 1.x,
//! section 2.7), plus deliberately broken chains for hostile-input tests.

use std::io;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::mem::GuestMem;

/// Descriptor continues via `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Buffer is device-writable.
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Buffer holds a table of indirect descriptors.
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
/// used.flags: the device asks not to be kicked (without EVENT_IDX).
pub const VRING_USED_F_NO_NOTIFY: u16 = 1;
/// Entries of one per-slot indirect table.
pub const INDIRECT_ENTRIES: u64 = 4;
/// Per-queue scratch area used by hostile chains (long indirect tables).
pub const SCRATCH_LEN: u64 = 128 * 1024;

/// A split-ring descriptor as the driver writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

/// One used-ring element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedElem {
    pub id: u32,
    pub len: u32,
}

/// Where one queue's structures live in guest memory.
#[derive(Clone, Copy, Debug)]
pub struct RingLayout {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    /// `size` buffers of `buf_len` bytes, buffer i belongs to descriptor slot i.
    pub bufs: u64,
    pub buf_len: u32,
    /// `size` indirect tables of `INDIRECT_ENTRIES` descriptors, table i for slot i.
    pub indirect: u64,
    pub scratch: u64,
}

const fn align(v: u64, a: u64) -> u64 {
    (v + a - 1) & !(a - 1)
}

impl RingLayout {
    /// Bytes one queue needs (rings, buffers, indirect tables, scratch).
    pub fn footprint(size: u16, buf_len: u32) -> u64 {
        let l = Self::at(0, size, buf_len);
        l.scratch + SCRATCH_LEN
    }

    /// Lay a queue out starting at `base` (page aligned).
    pub fn at(base: u64, size: u16, buf_len: u32) -> Self {
        let q = size as u64;
        let desc = align(base, 4096);
        let avail = desc + 16 * q;
        let used = align(avail + 6 + 2 * q, 4096);
        let bufs = align(used + 6 + 8 * q, 4096);
        let indirect = align(bufs + q * buf_len as u64, 4096);
        let scratch = align(indirect + q * 16 * INDIRECT_ENTRIES, 4096);
        RingLayout {
            size,
            desc,
            avail,
            used,
            bufs,
            buf_len,
            indirect,
            scratch,
        }
    }

    /// Guest address of the buffer owned by slot `slot`.
    pub fn buf(&self, slot: u16) -> u64 {
        self.bufs + slot as u64 * self.buf_len as u64
    }

    /// Guest address of the indirect table owned by slot `slot`.
    pub fn indirect_table(&self, slot: u16) -> u64 {
        self.indirect + slot as u64 * 16 * INDIRECT_ENTRIES
    }
}

/// The kinds of broken chains the driver can build. Each is something a
/// buggy or malicious guest can put in a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostile {
    /// A buffer address far outside guest memory.
    AddrOutOfMemory,
    /// A buffer that starts inside guest memory and runs past its end.
    StraddlesEnd,
    /// Two descriptors whose `next` fields point at each other.
    Loop,
    /// A single zero-length buffer.
    ZeroLength,
    /// Every descriptor of the ring chained, the last pointing back at the
    /// head: the walk exceeds the ring size. Needs an otherwise empty ring.
    ChainLongerThanRing,
    /// `next` names a descriptor index >= the ring size.
    NextOutOfRange,
    /// An indirect descriptor whose table lies outside guest memory.
    IndirectOutOfMemory,
    /// An indirect table whose length is not a multiple of 16.
    IndirectBadLength,
    /// An indirect table in memory whose entry points outside guest memory.
    IndirectEntryOutOfMemory,
    /// An indirect table containing another indirect descriptor.
    IndirectNested,
    /// An indirect table with more entries than the ring has descriptors.
    IndirectLongerThanRing,
    /// Device-writable buffers on TX, or read-only buffers on RX.
    WrongDirection,
    /// One buffer of 70,000 bytes inside guest memory (more than a tx
    /// chain may carry). TX only.
    TooLong,
    /// An avail entry naming a head index >= the ring size. TX only.
    BadHead,
}

impl Hostile {
    /// Every kind, for tests that walk all of them.
    pub const ALL: [Hostile; 12] = [
        Hostile::AddrOutOfMemory,
        Hostile::StraddlesEnd,
        Hostile::Loop,
        Hostile::ZeroLength,
        Hostile::ChainLongerThanRing,
        Hostile::NextOutOfRange,
        Hostile::IndirectOutOfMemory,
        Hostile::IndirectBadLength,
        Hostile::IndirectEntryOutOfMemory,
        Hostile::IndirectNested,
        Hostile::IndirectLongerThanRing,
        Hostile::WrongDirection,
    ];

    /// Kinds that are only broken on TX (an rx buffer may be that big;
    /// an out-of-range rx head is not tried).
    pub const TX_ONLY: [Hostile; 2] = [Hostile::TooLong, Hostile::BadHead];
}

/// An address no guest memory layout of this driver ever reaches.
pub const FAR_ADDR: u64 = 0x7ead_0000_0000;

/// A hostile chain that needs more free descriptors than its queue has
/// ([`SplitRing::push_hostile`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    pub kind: Hostile,
    pub need: usize,
    pub queue: usize,
    pub free: usize,
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} needs {} free descriptors, queue {} has {}",
            self.kind, self.need, self.queue, self.free
        )
    }
}

impl std::error::Error for NoRoom {}

/// Errors the driver detects in what the device wrote back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceFault {
    /// A used element names a descriptor that is not the head of an
    /// in-flight chain.
    BogusUsedId { queue: usize, id: u32 },
    /// A used element reports more bytes than the chain can hold.
    UsedLenTooBig {
        queue: usize,
        id: u32,
        len: u32,
        cap: u32,
    },
    /// An RX header with num_buffers 0 or more than the ring could hold.
    BadNumBuffers { queue: usize, num_buffers: u16 },
}

impl std::fmt::Display for DeviceFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// One split virtqueue as seen by the driver.
#[derive(Debug)]
pub struct SplitRing {
    mem: Arc<GuestMem>,
    layout: RingLayout,
    index: usize,
    event_idx: bool,
    kick: EventFd,
    call: EventFd,
    next_avail: u16,
    kicked_at: u16,
    last_used: u16,
    free: Vec<u16>,
    /// For an in-flight head: the number of descriptors of its chain.
    chain_len: Vec<u16>,
    /// Next slot of the chain, as the driver allocated it.
    link: Vec<u16>,
    /// Total bytes the chain offers (writable for RX).
    chain_cap: Vec<u32>,
    /// Kicks written to the kick eventfd.
    pub kicks: u64,
}

impl SplitRing {
    pub fn new(
        mem: Arc<GuestMem>,
        layout: RingLayout,
        index: usize,
        event_idx: bool,
    ) -> io::Result<Self> {
        let size = layout.size;
        assert!(size.is_power_of_two(), "queue size must be a power of two");
        // Clear descriptor table and both rings.
        mem.fill(layout.desc, 16 * size as usize, 0);
        mem.fill(layout.avail, 6 + 2 * size as usize, 0);
        mem.fill(layout.used, 6 + 8 * size as usize, 0);
        Ok(SplitRing {
            mem,
            layout,
            index,
            event_idx,
            kick: EventFd::new(EFD_NONBLOCK)?,
            call: EventFd::new(EFD_NONBLOCK)?,
            next_avail: 0,
            kicked_at: 0,
            last_used: 0,
            free: (0..size).rev().collect(),
            chain_len: vec![0; size as usize],
            link: vec![0; size as usize],
            chain_cap: vec![0; size as usize],
            kicks: 0,
        })
    }

    /// The vring index (0 = rx0, 1 = tx0, 2 = rx1, ...).
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    pub fn mem(&self) -> &Arc<GuestMem> {
        &self.mem
    }

    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }

    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// Descriptors not in flight.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Chains made available and not yet returned.
    pub fn in_flight(&self) -> usize {
        self.layout.size as usize - self.free.len()
    }

    /// The driver's avail index (published or not).
    pub fn avail_idx(&self) -> u16 {
        self.next_avail
    }

    /// Entries of the used ring the driver has consumed.
    pub fn last_used(&self) -> u16 {
        self.last_used
    }

    /// Take one free descriptor slot.
    pub fn alloc(&mut self) -> Option<u16> {
        self.free.pop()
    }

    /// Write descriptor `slot` of the table.
    pub fn write_desc(&self, slot: u16, d: Desc) {
        let a = self.layout.desc + 16 * slot as u64;
        self.mem.write_u64(a, d.addr);
        self.mem.write_u32(a + 8, d.len);
        self.mem.write_u16(a + 12, d.flags);
        self.mem.write_u16(a + 14, d.next);
    }

    /// Write entry `i` of an indirect table at `table`.
    pub fn write_indirect(&self, table: u64, i: u64, d: Desc) {
        let a = table + 16 * i;
        self.mem.write_u64(a, d.addr);
        self.mem.write_u32(a + 8, d.len);
        self.mem.write_u16(a + 12, d.flags);
        self.mem.write_u16(a + 14, d.next);
    }

    /// Put a chain on the avail ring (not yet published). `slots` are the
    /// descriptors the chain occupies, head first; `cap` the bytes it offers.
    pub fn push_chain(&mut self, slots: &[u16], cap: u32) {
        let head = slots[0];
        for w in slots.windows(2) {
            self.link[w[0] as usize] = w[1];
        }
        self.chain_len[head as usize] = slots.len() as u16;
        self.chain_cap[head as usize] = cap;
        self.push_head(head);
    }

    /// Put a one-descriptor chain on the avail ring (hot path, no allocation).
    pub fn push_single(&mut self, slot: u16, cap: u32) {
        self.chain_len[slot as usize] = 1;
        self.chain_cap[slot as usize] = cap;
        self.push_head(slot);
    }

    fn push_head(&mut self, head: u16) {
        let size = self.layout.size;
        let pos = self.next_avail & (size - 1);
        self.mem
            .write_u16(self.layout.avail + 4 + 2 * pos as u64, head);
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Publish an avail index `ahead` entries past the driver's own,
    /// without filling them (a broken driver), and kick.
    pub fn publish_jump(&mut self, ahead: u16) {
        self.mem
            .store_u16_release(self.layout.avail + 2, self.next_avail.wrapping_add(ahead));
        self.kick_now();
    }

    /// Publish the avail index (release) without kicking.
    pub fn publish(&self) {
        self.mem
            .store_u16_release(self.layout.avail + 2, self.next_avail);
    }

    /// Publish and kick the device if it asked to be kicked (EVENT_IDX
    /// avail_event, or no NO_NOTIFY flag). Returns whether it kicked.
    pub fn notify(&mut self) -> bool {
        self.publish();
        // The device must see the new avail idx before we read its event
        // index, or both sides may decide the other will act.
        fence(Ordering::SeqCst);
        let new = self.next_avail;
        let old = self.kicked_at;
        self.kicked_at = new;
        let need = if self.event_idx {
            let ev = self
                .mem
                .read_u16(self.layout.used + 4 + 8 * self.layout.size as u64);
            // vring_need_event(event, new, old)
            new.wrapping_sub(ev).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            self.mem.read_u16(self.layout.used) & VRING_USED_F_NO_NOTIFY == 0
        };
        if need && new != old {
            self.kick_now();
        }
        need && new != old
    }

    /// Publish and kick unconditionally.
    pub fn kick(&mut self) {
        self.publish();
        self.kicked_at = self.next_avail;
        self.kick_now();
    }

    fn kick_now(&mut self) {
        // A full eventfd counter cannot happen with one writer adding 1.
        let _ = self.kick.write(1);
        self.kicks += 1;
    }

    /// The device's used index (acquire).
    pub fn used_idx(&self) -> u16 {
        self.mem.load_u16_acquire(self.layout.used + 2)
    }

    /// used.flags as the device wrote them.
    pub fn used_flags(&self) -> u16 {
        self.mem.read_u16(self.layout.used)
    }

    /// Used entries the device published and the driver has not consumed.
    pub fn pending_used(&self) -> u16 {
        self.used_idx().wrapping_sub(self.last_used)
    }

    /// The `i`-th unconsumed used element (i < pending_used()).
    pub fn peek_used(&self, i: u16) -> UsedElem {
        let pos = self.last_used.wrapping_add(i) & (self.layout.size - 1);
        let a = self.layout.used + 4 + 8 * pos as u64;
        UsedElem {
            id: self.mem.read_u32(a),
            len: self.mem.read_u32(a + 4),
        }
    }

    /// Consume the next used element and free its chain. The caller must
    /// have seen pending_used() > 0.
    pub fn consume_used(&mut self) -> Result<UsedElem, DeviceFault> {
        let e = self.peek_used(0);
        self.last_used = self.last_used.wrapping_add(1);
        let id = e.id;
        if id >= self.layout.size as u32 || self.chain_len[id as usize] == 0 {
            return Err(DeviceFault::BogusUsedId {
                queue: self.index,
                id,
            });
        }
        let cap = self.chain_cap[id as usize];
        let mut slot = id as u16;
        let n = self.chain_len[id as usize];
        self.chain_len[id as usize] = 0;
        for _ in 0..n {
            self.free.push(slot);
            slot = self.link[slot as usize];
        }
        if e.len > cap {
            return Err(DeviceFault::UsedLenTooBig {
                queue: self.index,
                id,
                len: e.len,
                cap,
            });
        }
        Ok(e)
    }

    /// Ask for an interrupt when the device adds the next used entry
    /// (EVENT_IDX used_event; without EVENT_IDX interrupts are always on).
    pub fn set_used_event(&self, v: u16) {
        self.mem
            .write_u16(self.layout.avail + 4 + 2 * self.layout.size as u64, v);
        fence(Ordering::SeqCst);
    }

    /// Block until the call eventfd fires or `timeout` passes. Returns
    /// whether it fired (and clears it).
    pub fn wait_call(&self, timeout: Duration) -> bool {
        if poll_in(self.call.as_raw_fd_(), timeout) {
            let _ = self.call.read();
            true
        } else {
            false
        }
    }

    /// Wait until at least `n` used entries are pending, sleeping on the call
    /// eventfd (re-checking the ring every 20 ms in case an interrupt is
    /// suppressed). Returns false on timeout.
    pub fn wait_used(&self, n: u16, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            self.set_used_event(self.last_used);
            if self.pending_used() >= n {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            self.wait_call((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// Build one hostile chain of `kind` and make it available (not yet
    /// published). `rx` selects the direction a well-formed buffer of this
    /// queue would have (device-writable on RX). Returns the head.
    pub fn push_hostile(&mut self, kind: Hostile, rx: bool) -> Result<u16, NoRoom> {
        let dir = if rx { VIRTQ_DESC_F_WRITE } else { 0 };
        if kind == Hostile::BadHead {
            // No descriptor is used, and the device cannot give such a
            // head back: nothing goes in flight.
            let head = self.layout.size.wrapping_add(3);
            self.push_head(head);
            return Ok(head);
        }
        let len = self.layout.buf_len;
        let size = self.layout.size;
        let need = match kind {
            Hostile::Loop => 2,
            Hostile::ChainLongerThanRing => size as usize,
            _ => 1,
        };
        if self.free.len() < need {
            return Err(NoRoom {
                kind,
                need,
                queue: self.index,
                free: self.free.len(),
            });
        }
        let mut slots = Vec::with_capacity(need);
        for _ in 0..need {
            slots.push(self.free.pop().expect("checked"));
        }
        let s = slots[0];
        let buf = self.layout.buf(s);
        let table = self.layout.indirect_table(s);
        match kind {
            Hostile::AddrOutOfMemory => self.write_desc(
                s,
                Desc {
                    addr: FAR_ADDR,
                    len,
                    flags: dir,
                    next: 0,
                },
            ),
            Hostile::StraddlesEnd => self.write_desc(
                s,
                Desc {
                    addr: self.mem.end() - 64,
                    len: 4096,
                    flags: dir,
                    next: 0,
                },
            ),
            Hostile::Loop => {
                let t = slots[1];
                let half = len / 2;
                self.write_desc(
                    s,
                    Desc {
                        addr: buf,
                        len: half,
                        flags: dir | VIRTQ_DESC_F_NEXT,
                        next: t,
                    },
                );
                self.write_desc(
                    t,
                    Desc {
                        addr: self.layout.buf(t),
                        len: half,
                        flags: dir | VIRTQ_DESC_F_NEXT,
                        next: s,
                    },
                );
            }
            Hostile::ZeroLength => {
                self.write_desc(
                    s,
                    Desc {
                        addr: buf,
                        len: 0,
                        flags: dir,
                        next: 0,
                    },
                );
            }
            Hostile::ChainLongerThanRing => {
                for (i, &slot) in slots.iter().enumerate() {
                    let next = slots[(i + 1) % slots.len()];
                    self.write_desc(
                        slot,
                        Desc {
                            addr: self.layout.buf(slot),
                            len: 64,
                            flags: dir | VIRTQ_DESC_F_NEXT,
                            next,
                        },
                    );
                }
            }
            Hostile::NextOutOfRange => self.write_desc(
                s,
                Desc {
                    addr: buf,
                    len,
                    flags: dir | VIRTQ_DESC_F_NEXT,
                    next: size.wrapping_add(7),
                },
            ),
            Hostile::IndirectOutOfMemory => self.write_desc(
                s,
                Desc {
                    addr: FAR_ADDR,
                    len: 16 * 4,
                    flags: VIRTQ_DESC_F_INDIRECT,
                    next: 0,
                },
            ),
            Hostile::IndirectBadLength => {
                self.write_indirect(
                    table,
                    0,
                    Desc {
                        addr: buf,
                        len,
                        flags: dir,
                        next: 0,
                    },
                );
                self.write_desc(
                    s,
                    Desc {
                        addr: table,
                        len: 17,
                        flags: VIRTQ_DESC_F_INDIRECT,
                        next: 0,
                    },
                );
            }
            Hostile::IndirectEntryOutOfMemory => {
                self.write_indirect(
                    table,
                    0,
                    Desc {
                        addr: FAR_ADDR,
                        len,
                        flags: dir,
                        next: 0,
                    },
                );
                self.write_desc(
                    s,
                    Desc {
                        addr: table,
                        len: 16,
                        flags: VIRTQ_DESC_F_INDIRECT,
                        next: 0,
                    },
                );
            }
            Hostile::IndirectNested => {
                let inner = self.layout.scratch;
                self.write_indirect(
                    inner,
                    0,
                    Desc {
                        addr: buf,
                        len,
                        flags: dir,
                        next: 0,
                    },
                );
                self.write_indirect(
                    table,
                    0,
                    Desc {
                        addr: inner,
                        len: 16,
                        flags: VIRTQ_DESC_F_INDIRECT,
                        next: 0,
                    },
                );
                self.write_desc(
                    s,
                    Desc {
                        addr: table,
                        len: 16,
                        flags: VIRTQ_DESC_F_INDIRECT,
                        next: 0,
                    },
                );
            }
            Hostile::IndirectLongerThanRing => {
                let n = size as u64 + 1;
                let tab = self.layout.scratch;
                let data = tab + 16 * n;
                assert!(16 * n + 16 * n <= SCRATCH_LEN, "scratch too small");
                for i in 0..n {
                    let last = i + 1 == n;
                    self.write_indirect(
                        tab,
                        i,
                        Desc {
                            addr: data + 16 * i,
                            len: 16,
                            flags: dir | if last { 0 } else { VIRTQ_DESC_F_NEXT },
                            next: (i + 1) as u16,
                        },
                    );
                }
                self.write_desc(
                    s,
                    Desc {
                        addr: tab,
                        len: (16 * n) as u32,
                        flags: VIRTQ_DESC_F_INDIRECT,
                        next: 0,
                    },
                );
            }
            Hostile::TooLong => {
                const LEN: u64 = 70_000;
                const { assert!(LEN <= SCRATCH_LEN, "scratch too small") };
                self.mem.fill(self.layout.scratch, LEN as usize, 0);
                self.write_desc(
                    s,
                    Desc {
                        addr: self.layout.scratch,
                        len: LEN as u32,
                        flags: dir,
                        next: 0,
                    },
                );
            }
            Hostile::BadHead => unreachable!("handled above"),
            Hostile::WrongDirection => {
                let flags = if rx { 0 } else { VIRTQ_DESC_F_WRITE };
                // A plausible frame on TX so only the direction is wrong.
                self.mem.fill(buf, 64, 0);
                self.write_desc(
                    s,
                    Desc {
                        addr: buf,
                        len: 12 + 60,
                        flags,
                        next: 0,
                    },
                );
            }
        }
        // Record the slots the chain occupies so a returned head frees them
        // all; the device may report any length <= what it could write.
        let cap = if rx { u32::MAX } else { 0 };
        self.push_chain(&slots, cap);
        Ok(s)
    }
}

/// poll(2) one fd for input.
pub(crate) fn poll_in(fd: i32, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `p` is a valid pollfd array of length 1 living on our stack.
    let r = unsafe { libc::poll(&raw mut p, 1, ms) };
    r > 0 && p.revents & libc::POLLIN != 0
}

trait RawFdExt {
    fn as_raw_fd_(&self) -> i32;
}

impl RawFdExt for EventFd {
    fn as_raw_fd_(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_regions_are_aligned_and_disjoint() {
        for size in [64u16, 256, 1024] {
            let l = RingLayout::at(0x10_0000, size, 2048);
            let q = u64::from(size);
            assert_eq!(l.desc % 16, 0);
            assert_eq!(l.used % 4, 0);
            assert!(l.desc + 16 * q <= l.avail);
            assert!(l.avail + 6 + 2 * q <= l.used);
            assert!(l.used + 6 + 8 * q <= l.bufs);
            assert!(l.bufs + q * 2048 <= l.indirect);
            assert!(l.indirect + q * 16 * INDIRECT_ENTRIES <= l.scratch);
            assert_eq!(
                RingLayout::footprint(size, 2048),
                l.scratch + SCRATCH_LEN - 0x10_0000
            );
            // The long indirect table of a hostile chain fits in scratch.
            assert!(32 * (q + 1) <= SCRATCH_LEN);
        }
    }

    #[test]
    fn rings_in_memfd_memory_track_chains() {
        let mem = Arc::new(GuestMem::new(0x10_0000, 4 << 20).unwrap());
        let l = RingLayout::at(mem.base(), 8, 256);
        let mut r = SplitRing::new(mem.clone(), l, 0, true).unwrap();
        let a = r.alloc().unwrap();
        let b = r.alloc().unwrap();
        r.push_chain(&[a, b], 512);
        r.publish();
        assert_eq!(mem.read_u16(l.avail + 2), 1);
        assert_eq!(mem.read_u16(l.avail + 4), a);
        assert_eq!(r.in_flight(), 2);
        // Play device: one used element for head `a`.
        mem.write_u32(l.used + 4, u32::from(a));
        mem.write_u32(l.used + 8, 100);
        mem.store_u16_release(l.used + 2, 1);
        assert_eq!(r.pending_used(), 1);
        assert_eq!(
            r.consume_used().unwrap(),
            UsedElem {
                id: u32::from(a),
                len: 100
            }
        );
        assert_eq!(r.in_flight(), 0);
        // A used id that is not in flight is reported, not trusted.
        mem.write_u32(l.used + 12, 5);
        mem.store_u16_release(l.used + 2, 2);
        assert!(matches!(
            r.consume_used(),
            Err(DeviceFault::BogusUsedId { id: 5, .. })
        ));
        // Out-of-memory addresses are what the hostile builders rely on.
        assert!(!mem.contains(FAR_ADDR, 1));
        assert!(!mem.contains(mem.end() - 64, 4096));
    }

    #[test]
    fn notify_follows_avail_event() {
        let mem = Arc::new(GuestMem::new(0x10_0000, 1 << 20).unwrap());
        let l = RingLayout::at(mem.base(), 8, 64);
        let mut r = SplitRing::new(mem.clone(), l, 1, true).unwrap();
        let avail_event = l.used + 4 + 8 * 8;
        // Device wants a kick when avail idx passes 0: first push kicks.
        let s = r.alloc().unwrap();
        r.push_single(s, 0);
        assert!(r.notify());
        // Device says: kick me only after index 3.
        mem.write_u16(avail_event, 3);
        for _ in 0..2 {
            let s = r.alloc().unwrap();
            r.push_single(s, 0);
            assert!(!r.notify(), "idx {} <= 3", r.avail_idx());
        }
        let s = r.alloc().unwrap();
        r.push_single(s, 0);
        let s = r.alloc().unwrap();
        r.push_single(s, 0);
        assert!(r.notify(), "idx 5 passed event 3");
        assert_eq!(r.kicks, 2);
    }
}
