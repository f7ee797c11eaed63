//! Structure-aware fuzzing of the daemon's two sockets, for the binary
//! `vnic-fuzz-vhost` and the device tests that replay what it found.
//!
//! - [`vhost`]: sequences of raw vhost-user messages (valid, edge and
//!   malformed) over one connection to the vhost-user socket, with real
//!   memfds and eventfds attached, and a small guest data path running
//!   between them;
//! - [`ctl`]: sequences of control-socket request lines (valid, edge,
//!   malformed, huge, cut short).
//!
//! Everything a sequence does follows from its seed ([`Rng`]): the same
//! seed sends the same bytes (the daemon's answers may differ in timing,
//! not in what is sent before the first of them is read).

pub mod ctl;
pub mod vhost;
mod wire;

pub use wire::{RawConn, ReadError};

/// SplitMix64: small, fast, and the same on every platform; a sequence is
/// its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p` percent.
    pub fn chance(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// An "interesting" 64-bit value: boundaries, powers of two around
    /// them, or anything.
    pub fn edge_u64(&mut self) -> u64 {
        match self.below(6) {
            0 => *self.pick(&[0, 1, 2, 0xff, 0x100, 0xffff, 0x1_0000, 0xffff_ffff]),
            1 => *self.pick(&[u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1, 1 << 32]),
            2 => 1u64 << self.below(64),
            3 => (1u64 << self.below(64)).wrapping_sub(1),
            4 => (1u64 << self.below(64)).wrapping_add(1),
            _ => self.next_u64(),
        }
    }

    /// An "interesting" 32-bit value.
    pub fn edge_u32(&mut self) -> u32 {
        match self.below(4) {
            0 => *self.pick(&[0, 1, 2, 0xff, 0x100, 0x3ff, 0x400, 0x401, 0xffff, 0x1_0000]),
            1 => *self.pick(&[u32::MAX, u32::MAX - 1, 1 << 31]),
            2 => 1u32 << self.below(32),
            _ => self.next_u32(),
        }
    }
}

/// The seed of sequence `i` of a run seeded `master` (what `--repro`
/// takes).
pub fn sequence_seed(master: u64, i: u64) -> u64 {
    let mut r = Rng::new(master ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03));
    r.next_u64();
    r.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_spreads() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..100).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        assert!(a.iter().all(|&x| x == r.next_u64()));
        let mut r = Rng::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[r.below(10) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
        assert_ne!(sequence_seed(1, 0), sequence_seed(1, 1));
        assert_ne!(sequence_seed(1, 0), sequence_seed(2, 0));
        assert_eq!(sequence_seed(3, 4), sequence_seed(3, 4));
    }
}
