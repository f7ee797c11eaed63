//! A tiny deterministic RNG (SplitMix64) for the fault-injection knobs.

/// SplitMix64: 64-bit state, full period, good enough for Bernoulli draws.
/// Same seed, same sequence, on every platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in [0, 1) with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (always draws, so the stream does not depend on `p`).
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_roughly_fair() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        let mut hits = 0;
        for _ in 0..100_000 {
            assert_eq!(a.next_u64(), b.next_u64());
            if a.chance(0.25) {
                hits += 1;
            }
            b.next_u64();
        }
        assert!((23_000..27_000).contains(&hits), "{hits}");
        let mut z = SplitMix64::new(1);
        assert!(!z.chance(0.0));
        assert!(z.chance(1.0));
    }
}
