//! [`FlowIndex`]: the exact-match lookup structure of the filter table.
//!
//! Open addressing with linear probing over a power-of-two slot array sized
//! at construction to at least twice the capacity (load factor <= 1/2), with
//! backward-shift deletion (no tombstones, so churn never degrades lookups).
//! The probe runs over a separate array of 32-bit hash tags, 16 to a cache
//! line: a miss (on average ~2.5 probes at load 1/2) is resolved from the
//! tag line alone, and only a slot whose tag matches (the entry itself,
//! or a 31-bit tag collision) is read. Each slot (48 bytes) holds the key,
//! the filter id and the rx queue. A direct id -> slot map makes removal by
//! filter id O(1).
//!
//! Lookup never allocates. The structure is `Clone`: the daemon keeps one per
//! worker thread as a lookup-only replica of the authoritative
//! [`FilterTable`](crate::FilterTable), updated with [`FlowIndex::apply`].

use crate::flow::FlowKey;

mod sealed {
    pub trait Sealed {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
}

/// A filter id type: `u16` (the protocol's ids) or `u32` (large synthetic
/// tables, e.g. benchmarks beyond 65535 filters).
pub trait FilterId: Copy + Eq + core::fmt::Debug + sealed::Sealed {
    /// The id as an array index.
    fn index(self) -> usize;
}

impl FilterId for u16 {
    #[inline]
    fn index(self) -> usize {
        usize::from(self)
    }
}

impl FilterId for u32 {
    #[inline]
    fn index(self) -> usize {
        self as usize
    }
}

/// Why [`FlowIndex::insert`] refused an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexError {
    /// The index holds `capacity` entries already.
    Full,
    /// The id is outside the index's id space.
    BadId,
}

impl core::fmt::Display for IndexError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::Full => "flow index is full",
            Self::BadId => "filter id outside the id space",
        })
    }
}

impl std::error::Error for IndexError {}

const EMPTY: u32 = 0;
const NO_SLOT: u32 = u32::MAX;
const TAG_BIT: u32 = 0x8000_0000;

#[derive(Clone, Copy)]
struct Slot<I> {
    key: FlowKey,
    id: I,
    rxq: u16,
}

/// Fixed-capacity exact-match index `FlowKey -> (filter id, rx queue)`.
///
/// Invariants: each key and each id appears at most once; `len() <= capacity()`.
#[derive(Clone)]
pub struct FlowIndex<I: FilterId = u16> {
    /// Per position: 0 when empty; otherwise the high 32 bits of the key's
    /// hash with bit 31 set. An entry's home position is `tag & mask`.
    tags: Box<[u32]>,
    /// Per position: the entry (meaningless where the tag is empty).
    slots: Box<[Slot<I>]>,
    mask: usize,
    /// id -> slot position, `NO_SLOT` when the id is not live.
    by_id: Box<[u32]>,
    len: usize,
    capacity: usize,
}

impl<I: FilterId> core::fmt::Debug for FlowIndex<I> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FlowIndex")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

#[inline]
fn tag_of(k: &FlowKey) -> u32 {
    ((k.mix64() >> 32) as u32) | TAG_BIT
}

impl FlowIndex<u16> {
    /// An index for up to `capacity` filters with protocol ids 0..=0xFFFE
    /// (`capacity` is clamped to 65535, the size of the id space).
    pub fn new(capacity: usize) -> Self {
        Self::build(capacity.min(0xFFFF), 0xFFFF, 0)
    }
}

impl FlowIndex<u32> {
    /// An index for up to `capacity` entries with ids `0..id_space`
    /// (`capacity` is clamped to 2^30).
    pub fn with_id_space(capacity: usize, id_space: u32) -> Self {
        Self::build(capacity.min(1 << 30), id_space as usize, 0)
    }
}

impl<I: FilterId> FlowIndex<I> {
    fn build(capacity: usize, id_space: usize, zero_id: I) -> Self
    where
        I: Copy,
    {
        let nslots = (capacity * 2).max(8).next_power_of_two();
        let dummy = Slot {
            key: FlowKey::v4(
                crate::L4Proto::Tcp,
                [0, 0, 0, 0].into(),
                0,
                [0, 0, 0, 0].into(),
                0,
            ),
            id: zero_id,
            rxq: 0,
        };
        Self {
            tags: vec![EMPTY; nslots].into_boxed_slice(),
            slots: vec![dummy; nslots].into_boxed_slice(),
            mask: nslots - 1,
            by_id: vec![NO_SLOT; id_space].into_boxed_slice(),
            len: 0,
            capacity,
        }
    }

    /// Number of live entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most entries the index accepts.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Size of the id space (ids are `0..id_space()`).
    pub fn id_space(&self) -> usize {
        self.by_id.len()
    }

    /// Looks a flow up: `(filter id, rx queue)`. O(1), no allocation.
    // Always inlined into the per-frame path, with the key its caller just
    // built (see `ipv4_flow`).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub fn lookup(&self, key: &FlowKey) -> Option<(I, u16)> {
        self.lookup_tagged(key, tag_of(key))
    }

    /// Looks up a burst of flows: `out[i] = lookup(&keys[i])` for
    /// `i < min(keys.len(), out.len())`. It first loads the home tag and
    /// slot of every key of a group of 16, so their cache misses overlap,
    /// then probes: for tables larger than the caches this is several
    /// times faster per key than one-by-one lookups. No allocation.
    pub fn lookup_batch(&self, keys: &[FlowKey], out: &mut [Option<(I, u16)>]) {
        const GROUP: usize = 16;
        for (kc, oc) in keys.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
            let mut tags = [0u32; GROUP];
            let mut touch = 0u32;
            for (t, k) in tags.iter_mut().zip(kc) {
                *t = tag_of(k);
                let home = *t as usize & self.mask;
                touch ^= self.tags[home] ^ u32::from(self.slots[home].rxq);
            }
            // Keep the warming loads: their only purpose is to start the misses.
            core::hint::black_box(touch);
            for ((o, k), &t) in oc.iter_mut().zip(kc).zip(&tags) {
                *o = self.lookup_tagged(k, t);
            }
        }
    }

    #[inline]
    fn lookup_tagged(&self, key: &FlowKey, tag: u32) -> Option<(I, u16)> {
        let s = &self.slots[self.probe(key, tag)?];
        Some((s.id, s.rxq))
    }

    /// The position of `key` (whose tag is `tag`): the probe reads tags
    /// only, and a slot only where the tag matches.
    #[inline]
    fn probe(&self, key: &FlowKey, tag: u32) -> Option<usize> {
        let mut i = tag as usize & self.mask;
        loop {
            let t = self.tags[i];
            if t == EMPTY {
                return None;
            }
            if t == tag && self.slots[i].key == *key {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    fn find_pos(&self, key: &FlowKey) -> Option<usize> {
        self.probe(key, tag_of(key))
    }

    /// The flow and rx queue of a live id.
    pub fn get(&self, id: I) -> Option<(FlowKey, u16)> {
        let pos = *self.by_id.get(id.index())?;
        if pos == NO_SLOT {
            return None;
        }
        let s = &self.slots[pos as usize];
        Some((s.key, s.rxq))
    }

    /// Whether `id` is live.
    pub fn contains_id(&self, id: I) -> bool {
        self.by_id.get(id.index()).is_some_and(|&p| p != NO_SLOT)
    }

    /// Installs `key -> (id, rxq)`. An entry already holding `id` and an entry
    /// already holding `key` are removed first (replace semantics), so both
    /// stay unique. Fails with [`IndexError::Full`] only when nothing was
    /// replaced and the index is at capacity; a failed insert changes nothing.
    pub fn insert(&mut self, key: FlowKey, id: I, rxq: u16) -> Result<(), IndexError> {
        let idx = id.index();
        if idx >= self.by_id.len() {
            return Err(IndexError::BadId);
        }
        let id_live = self.by_id[idx] != NO_SLOT;
        let key_pos = self.find_pos(&key);
        if !id_live && key_pos.is_none() && self.len >= self.capacity {
            return Err(IndexError::Full);
        }
        if let Some(p) = key_pos {
            if self.slots[p].id == id {
                // Same id, same key: update in place.
                self.slots[p].rxq = rxq;
                return Ok(());
            }
            self.remove_at(p);
        }
        if id_live {
            self.remove_at(self.by_id[idx] as usize);
        }
        let tag = tag_of(&key);
        let mut i = tag as usize & self.mask;
        while self.tags[i] != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.tags[i] = tag;
        self.slots[i] = Slot { key, id, rxq };
        self.by_id[idx] = i as u32;
        self.len += 1;
        Ok(())
    }

    /// Removes the entry with `id`, returning its flow and rx queue.
    pub fn remove_by_id(&mut self, id: I) -> Option<(FlowKey, u16)> {
        let pos = *self.by_id.get(id.index())?;
        if pos == NO_SLOT {
            return None;
        }
        let s = self.slots[pos as usize];
        self.remove_at(pos as usize);
        Some((s.key, s.rxq))
    }

    /// Removes the entry for `key`, returning its id and rx queue.
    pub fn remove_by_key(&mut self, key: &FlowKey) -> Option<(I, u16)> {
        let pos = self.find_pos(key)?;
        let s = self.slots[pos];
        self.remove_at(pos);
        Some((s.id, s.rxq))
    }

    /// Backward-shift deletion of the occupied slot at `pos`.
    fn remove_at(&mut self, pos: usize) {
        let mask = self.mask;
        let id = self.slots[pos].id;
        self.by_id[id.index()] = NO_SLOT;
        self.tags[pos] = EMPTY;
        self.len -= 1;
        let mut hole = pos;
        let mut j = pos;
        loop {
            j = (j + 1) & mask;
            let t = self.tags[j];
            if t == EMPTY {
                return;
            }
            let home = t as usize & mask;
            // The entry at j may move back to the hole iff the hole lies
            // cyclically within [home, j).
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j];
                self.tags[hole] = t;
                self.by_id[self.slots[hole].id.index()] = hole as u32;
                self.tags[j] = EMPTY;
                hole = j;
            }
        }
    }

    /// Removes every entry (O(slots)).
    pub fn clear(&mut self) {
        if self.len == 0 {
            return;
        }
        self.tags.fill(EMPTY);
        self.by_id.fill(NO_SLOT);
        self.len = 0;
    }

    /// Iterates over `(flow, id, rxq)` in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (FlowKey, I, u16)> + '_ {
        self.tags
            .iter()
            .zip(self.slots.iter())
            .filter(|(&t, _)| t != EMPTY)
            .map(|(_, s)| (s.key, s.id, s.rxq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::L4Proto;
    use std::net::Ipv4Addr;

    fn k(i: u32) -> FlowKey {
        FlowKey::v4(
            L4Proto::Udp,
            Ipv4Addr::from(0x0a00_0000 + i),
            1000 + (i % 7) as u16,
            Ipv4Addr::new(10, 1, 1, 1),
            80,
        )
    }

    #[test]
    fn insert_lookup_remove() {
        let mut ix = FlowIndex::new(100);
        for i in 0..100u16 {
            ix.insert(k(u32::from(i)), i, i % 4).unwrap();
        }
        assert_eq!(ix.len(), 100);
        assert_eq!(ix.insert(k(1000), 500, 0), Err(IndexError::Full));
        for i in 0..100u16 {
            assert_eq!(ix.lookup(&k(u32::from(i))), Some((i, i % 4)));
        }
        for i in (0..100u16).step_by(2) {
            assert_eq!(ix.remove_by_id(i), Some((k(u32::from(i)), i % 4)));
        }
        for i in 0..100u16 {
            let want = (i % 2 == 1).then_some((i, i % 4));
            assert_eq!(ix.lookup(&k(u32::from(i))), want);
        }
        assert_eq!(ix.len(), 50);
        assert_eq!(ix.remove_by_id(0), None);
        assert_eq!(ix.insert(k(0), 0xFFFF, 0), Err(IndexError::BadId));
    }

    #[test]
    fn batch_lookup_equals_single_lookups() {
        let mut ix = FlowIndex::new(1000);
        for i in 0..1000u16 {
            ix.insert(k(u32::from(i) * 2), i, i % 3).unwrap();
        }
        // hits and misses interleaved, lengths not a multiple of the group size
        let keys: Vec<FlowKey> = (0..1037u32).map(k).collect();
        let mut out = vec![Some((0xAAAA, 0xAAAA)); keys.len()];
        ix.lookup_batch(&keys, &mut out);
        for (key, got) in keys.iter().zip(&out) {
            assert_eq!(*got, ix.lookup(key));
        }
        assert_eq!(out.iter().filter(|o| o.is_some()).count(), 519);
        // a shorter output slice bounds the work
        let mut short = [None; 5];
        ix.lookup_batch(&keys, &mut short);
        assert_eq!(short[0], Some((0, 0)));
        assert_eq!(short[1], None);
    }

    #[test]
    fn replace_semantics() {
        let mut ix = FlowIndex::new(4);
        ix.insert(k(1), 1, 0).unwrap();
        ix.insert(k(2), 2, 0).unwrap();
        // same id, new flow
        ix.insert(k(3), 1, 1).unwrap();
        assert_eq!(ix.lookup(&k(1)), None);
        assert_eq!(ix.lookup(&k(3)), Some((1, 1)));
        // same flow, new id
        ix.insert(k(2), 7, 3).unwrap();
        assert_eq!(ix.get(2), None);
        assert_eq!(ix.lookup(&k(2)), Some((7, 3)));
        // both: id 1 holds k(3), k(2) is under 7 -> install k(2) under 1
        ix.insert(k(2), 1, 2).unwrap();
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.lookup(&k(2)), Some((1, 2)));
        assert_eq!(ix.lookup(&k(3)), None);
        assert!(!ix.contains_id(7));
    }

    #[test]
    fn churn_keeps_lookups_exact() {
        // Small table, heavy churn: exercises wrap-around and backward shift.
        let mut ix = FlowIndex::new(8);
        let mut live: Vec<Option<u32>> = vec![None; 8];
        let mut x = 12345u32;
        for step in 0..20000u32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let id = (x % 8) as u16;
            if x & 0x100 == 0 {
                let flow = step;
                ix.insert(k(flow), id, 0).unwrap();
                live[usize::from(id)] = Some(flow);
            } else {
                let got = ix.remove_by_id(id).map(|(key, _)| key);
                assert_eq!(got, live[usize::from(id)].map(k));
                live[usize::from(id)] = None;
            }
            for (i, l) in live.iter().enumerate() {
                if let Some(f) = l {
                    assert_eq!(ix.lookup(&k(*f)), Some((i as u16, 0)));
                }
            }
            assert_eq!(ix.len(), live.iter().filter(|l| l.is_some()).count());
        }
    }
}
