//! Receive-side scaling: the Toeplitz hash and the indirection table.
//!
//! [`Toeplitz`] precomputes, for every input byte position and byte value,
//! the 32-bit contribution of that byte, so hashing an input of `n` bytes is
//! `n` table loads and XORs (12 for an IPv4 4-tuple, 36 for IPv6).

use crate::flow::{FlowKey, IpFamily, IpPair, ParsedFrame, L3};

/// Length of a Toeplitz key in bytes.
pub const KEY_LEN: usize = 40;

/// Size of the indirection table.
pub const INDIRECTION_LEN: usize = 128;

/// The longest hash input: IPv6 4-tuple (16 + 16 + 2 + 2 bytes).
pub const MAX_INPUT: usize = 36;

/// The well-known default key (Microsoft's RSS verification key).
pub const DEFAULT_KEY: [u8; KEY_LEN] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// The key as 80 lower-case hex digits.
pub fn key_to_hex(key: &[u8; KEY_LEN]) -> String {
    use core::fmt::Write;
    let mut s = String::with_capacity(KEY_LEN * 2);
    for b in key {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Why [`key_from_hex`] refused a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyParseError {
    /// Not `2 * KEY_LEN` hex digits once the `:` separators are dropped: the
    /// number of digits found.
    Length(usize),
    /// A pair of digits is not text (a multi-byte character cut in two).
    NotAscii,
    /// A pair of digits that is not a hex byte.
    BadByte(String),
}

impl core::fmt::Display for KeyParseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Length(n) => write!(f, "an RSS key is {} hex digits, got {n}", KEY_LEN * 2),
            Self::NotAscii => f.write_str("RSS key is not ASCII hex"),
            Self::BadByte(hex) => write!(f, "RSS key: {hex:?} is not a hex byte"),
        }
    }
}

impl std::error::Error for KeyParseError {}

/// Parses a key from 80 hex digits (`:` separators allowed, as ethtool prints).
pub fn key_from_hex(text: &str) -> Result<[u8; KEY_LEN], KeyParseError> {
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b':').collect();
    if digits.len() != KEY_LEN * 2 {
        return Err(KeyParseError::Length(digits.len()));
    }
    let mut key = [0u8; KEY_LEN];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let hex = core::str::from_utf8(pair).map_err(|_| KeyParseError::NotAscii)?;
        key[i] =
            u8::from_str_radix(hex, 16).map_err(|_| KeyParseError::BadByte(hex.to_string()))?;
    }
    Ok(key)
}

/// Serde for a key as 80 hex digits (serde has no impls for arrays this
/// long).
pub(crate) mod serde_key {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::KEY_LEN;

    pub fn serialize<S: Serializer>(key: &[u8; KEY_LEN], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::key_to_hex(key))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; KEY_LEN], D::Error> {
        let text = String::deserialize(d)?;
        super::key_from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// Serde for an indirection table as an array of its 128 entries.
pub(crate) mod serde_indirection {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::INDIRECTION_LEN;

    pub fn serialize<S: Serializer>(t: &[u16; INDIRECTION_LEN], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(t)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<[u16; INDIRECTION_LEN], D::Error> {
        let v = Vec::<u16>::deserialize(d)?;
        let n = v.len();
        v.try_into().map_err(|_| {
            serde::de::Error::custom(format!(
                "an indirection table has {INDIRECTION_LEN} entries, got {n}"
            ))
        })
    }
}

/// A Toeplitz hasher for one key, with per-byte lookup tables.
#[derive(Clone)]
pub struct Toeplitz {
    key: [u8; KEY_LEN],
    /// `table[i][b]`: contribution of byte value `b` at input position `i`.
    table: Box<[[u32; 256]; MAX_INPUT]>,
}

impl core::fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Toeplitz")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Default for Toeplitz {
    fn default() -> Self {
        Self::new(DEFAULT_KEY)
    }
}

impl PartialEq for Toeplitz {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Toeplitz {}

/// The 32-bit window of `key` starting at bit `bit` (MSB first).
fn key_window(key: &[u8; KEY_LEN], bit: usize) -> u32 {
    let mut w = 0u32;
    for i in 0..32 {
        let b = bit + i;
        let v = (key[b / 8] >> (7 - (b % 8))) & 1;
        w = (w << 1) | u32::from(v);
    }
    w
}

impl Toeplitz {
    /// Builds the tables for `key`.
    pub fn new(key: [u8; KEY_LEN]) -> Self {
        let mut table: Box<[[u32; 256]; MAX_INPUT]> = vec![[0u32; 256]; MAX_INPUT]
            .into_boxed_slice()
            .try_into()
            .expect("MAX_INPUT rows");
        for (pos, row) in table.iter_mut().enumerate() {
            let windows: [u32; 8] = core::array::from_fn(|bit| key_window(&key, pos * 8 + bit));
            for (val, slot) in row.iter_mut().enumerate() {
                let mut h = 0u32;
                for (bit, w) in windows.iter().enumerate() {
                    if val & (0x80 >> bit) != 0 {
                        h ^= w;
                    }
                }
                *slot = h;
            }
        }
        Self { key, table }
    }

    /// The key.
    pub const fn key(&self) -> &[u8; KEY_LEN] {
        &self.key
    }

    /// Hashes arbitrary input in Toeplitz byte order. Only the first
    /// [`MAX_INPUT`] (36) bytes are used: a 40-byte key covers no more.
    #[inline]
    pub fn hash(&self, input: &[u8]) -> u32 {
        let mut h = 0u32;
        for (row, &b) in self.table.iter().zip(input) {
            h ^= row[usize::from(b)];
        }
        h
    }

    /// Hashes the bytes at the given positions (an unrolled helper).
    #[inline]
    fn at(&self, pos: usize, b: u8) -> u32 {
        self.table[pos][usize::from(b)]
    }

    /// IPv4 2-tuple: src addr, dst addr.
    #[inline]
    pub fn hash_v4(&self, src: [u8; 4], dst: [u8; 4]) -> u32 {
        let mut h = 0;
        for i in 0..4 {
            h ^= self.at(i, src[i]) ^ self.at(4 + i, dst[i]);
        }
        h
    }

    /// IPv4 4-tuple: src addr, dst addr, src port, dst port.
    #[inline]
    pub fn hash_v4_ports(&self, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> u32 {
        let sp = sport.to_be_bytes();
        let dp = dport.to_be_bytes();
        self.hash_v4(src, dst)
            ^ self.at(8, sp[0])
            ^ self.at(9, sp[1])
            ^ self.at(10, dp[0])
            ^ self.at(11, dp[1])
    }

    /// IPv6 2-tuple.
    #[inline]
    pub fn hash_v6(&self, src: &[u8; 16], dst: &[u8; 16]) -> u32 {
        let mut h = 0;
        for i in 0..16 {
            h ^= self.at(i, src[i]) ^ self.at(16 + i, dst[i]);
        }
        h
    }

    /// IPv6 4-tuple.
    #[inline]
    pub fn hash_v6_ports(&self, src: &[u8; 16], dst: &[u8; 16], sport: u16, dport: u16) -> u32 {
        let sp = sport.to_be_bytes();
        let dp = dport.to_be_bytes();
        self.hash_v6(src, dst)
            ^ self.at(32, sp[0])
            ^ self.at(33, sp[1])
            ^ self.at(34, dp[0])
            ^ self.at(35, dp[1])
    }

    /// The 4-tuple hash of a flow.
    #[inline]
    pub fn hash_flow(&self, k: &FlowKey) -> u32 {
        match k.family() {
            IpFamily::Ipv4 => {
                self.hash_v4_ports(k.src_v4(), k.dst_v4(), k.src_port(), k.dst_port())
            }
            IpFamily::Ipv6 => {
                self.hash_v6_ports(&k.src_bytes(), &k.dst_bytes(), k.src_port(), k.dst_port())
            }
        }
    }

    /// The 2-tuple hash of an address pair.
    #[inline]
    pub fn hash_pair(&self, p: &IpPair) -> u32 {
        match p.family() {
            IpFamily::Ipv4 => {
                let s = p.src_bytes();
                let d = p.dst_bytes();
                self.hash_v4([s[0], s[1], s[2], s[3]], [d[0], d[1], d[2], d[3]])
            }
            IpFamily::Ipv6 => self.hash_v6(p.src_bytes(), p.dst_bytes()),
        }
    }

    /// The RSS hash of a parsed frame: 4-tuple for flows, 2-tuple for other
    /// IP traffic, `None` for non-IP frames.
    #[inline]
    pub fn hash_frame(&self, f: &ParsedFrame) -> Option<u32> {
        match &f.l3 {
            L3::Flow(k) => Some(self.hash_flow(k)),
            L3::Ip(p) => Some(self.hash_pair(p)),
            L3::NonIp => None,
        }
    }

    /// Reference bit-by-bit Toeplitz (slow; for tests and cross-checks).
    pub fn hash_slow(&self, input: &[u8]) -> u32 {
        let mut h = 0u32;
        for (i, &b) in input.iter().take(MAX_INPUT).enumerate() {
            for bit in 0..8 {
                if b & (0x80 >> bit) != 0 {
                    h ^= key_window(&self.key, i * 8 + bit);
                }
            }
        }
        h
    }
}

/// RSS state: Toeplitz key and the 128-entry indirection table.
///
/// The table frames follow is the device's own (round-robin over the
/// enabled queues, refilled when their number changes), or a driver's
/// ([`Rss::set_table`], RSS_SET): kept as it is when the enabled count
/// changes, each entry naming a queue that is not enabled replaced by the
/// round-robin entry (`(hash & 127) % enabled`, PROTOCOL.md "The RSS
/// extension"). The table looked up per frame is that result, computed
/// when either changes, so a frame costs the same with either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rss {
    toeplitz: Toeplitz,
    /// The table frames follow (see the type's doc).
    indirection: [u16; INDIRECTION_LEN],
    enabled: u16,
    /// `q` when every indirection entry is `q` (one enabled queue, or a
    /// table pointing at one queue): every hash then selects `q`, so the
    /// queue of an IP frame is known without hashing it; else [`MIXED`].
    /// (A `u16`, not an `Option`: it fits in the struct's padding, so the
    /// layout of every struct holding an `Rss` stays as it was.)
    single: u16,
    /// The driver's table as it set it (None: the device's round-robin).
    /// Read only when the table or the enabled count changes.
    driver: Option<Box<[u16; INDIRECTION_LEN]>>,
}

/// [`Rss`]'s `single` when the entries differ. A table whose entries are
/// all `MIXED` is hashed like a mixed one, with the same answer.
const MIXED: u16 = u16::MAX;

/// The table frames follow with `enabled` queues enabled (0 is treated as
/// 1): round-robin (`i % enabled`) without a driver's table; with one, its
/// entries, each naming a queue at or past `enabled` replaced by the
/// round-robin entry.
pub fn effective_indirection(
    driver: Option<&[u16; INDIRECTION_LEN]>,
    enabled: u16,
) -> [u16; INDIRECTION_LEN] {
    let n = enabled.max(1);
    core::array::from_fn(|i| {
        let rr = (i % usize::from(n)) as u16;
        match driver {
            Some(t) if t[i] < n => t[i],
            _ => rr,
        }
    })
}

impl Rss {
    /// Default key, indirection spread round-robin over `enabled_queues`
    /// (a count of 0 is treated as 1).
    pub fn new(enabled_queues: u16) -> Self {
        Self::with_toeplitz(Toeplitz::default(), enabled_queues)
    }

    /// A given key, indirection spread over `enabled_queues` (0 is treated as 1).
    pub fn with_key(key: [u8; KEY_LEN], enabled_queues: u16) -> Self {
        Self::with_toeplitz(Toeplitz::new(key), enabled_queues)
    }

    /// A prebuilt hasher, indirection spread over `enabled_queues` (0 is treated as 1).
    pub fn with_toeplitz(toeplitz: Toeplitz, enabled_queues: u16) -> Self {
        let mut r = Self {
            toeplitz,
            indirection: [0; INDIRECTION_LEN],
            enabled: 1,
            single: 0,
            driver: None,
        };
        r.set_enabled(enabled_queues);
        r
    }

    /// The number of enabled queues changed (a count of 0 is treated as
    /// 1): the device's table is refilled round-robin (`indirection[i] = i
    /// % n`); a driver's stays, its entries past the enabled queues
    /// falling back to the round-robin ones.
    pub fn set_enabled(&mut self, enabled_queues: u16) {
        self.enabled = enabled_queues.max(1);
        self.refill();
    }

    fn refill(&mut self) {
        self.indirection = effective_indirection(self.driver.as_deref(), self.enabled);
        self.single = single_queue(&self.indirection);
    }

    /// Number of enabled queues.
    pub const fn enabled(&self) -> u16 {
        self.enabled
    }

    /// The table frames follow now (with the fallback applied; see the
    /// type's doc).
    pub const fn indirection(&self) -> &[u16; INDIRECTION_LEN] {
        &self.indirection
    }

    /// The driver's table, as it set it (None: the device's round-robin).
    pub fn driver_table(&self) -> Option<&[u16; INDIRECTION_LEN]> {
        self.driver.as_deref()
    }

    /// A driver's table (kept across [`Self::set_enabled`]; entries are not
    /// checked: one naming a queue that is not enabled falls back to the
    /// round-robin entry), or None for the device's round-robin.
    pub fn set_table(&mut self, table: Option<[u16; INDIRECTION_LEN]>) {
        self.driver = table.map(Box::new);
        self.refill();
    }

    /// Replaces the key (the hash tables are rebuilt only when it differs).
    pub fn set_key(&mut self, key: [u8; KEY_LEN]) {
        if *self.toeplitz.key() != key {
            self.toeplitz = Toeplitz::new(key);
        }
    }

    /// Applies an RSS configuration: `key` (None: [`DEFAULT_KEY`]) and the
    /// driver's table (None: round-robin).
    pub fn configure(&mut self, c: &RssConfig) {
        self.set_key(c.key.unwrap_or(DEFAULT_KEY));
        self.set_table(c.indirection);
    }

    /// The hasher.
    pub const fn toeplitz(&self) -> &Toeplitz {
        &self.toeplitz
    }

    /// Queue for a hash: `indirection[hash & 127]`.
    #[inline]
    pub fn queue_for_hash(&self, hash: u32) -> u16 {
        self.indirection[(hash as usize) & (INDIRECTION_LEN - 1)]
    }

    /// Queue for a flow (4-tuple): `queue_for_hash` of its hash, which is
    /// not computed when the table has one queue only (the same answer).
    #[inline]
    pub fn queue_for_key(&self, k: &FlowKey) -> u16 {
        if self.single == MIXED {
            self.queue_for_hash(self.toeplitz.hash_flow(k))
        } else {
            self.single
        }
    }

    /// Queue for a parsed frame; non-IP frames go to queue 0. As
    /// `queue_for_key`, an IP frame is not hashed when the table has one
    /// queue only.
    #[inline]
    pub fn queue_for(&self, f: &ParsedFrame) -> u16 {
        match (&f.l3, self.single) {
            (L3::NonIp, _) => 0,
            (_, q) if q != MIXED => q,
            _ => self
                .toeplitz
                .hash_frame(f)
                .map_or(0, |h| self.queue_for_hash(h)),
        }
    }
}

/// What a driver set with RSS_SET (aRFS/PROTOCOL.md, "The RSS extension"):
/// each part None while it is the device's default (the default key, the
/// round-robin table). `Default` is the device's own configuration, which
/// a new generation puts back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RssConfig {
    /// The Toeplitz key RSS hashes with (None: [`DEFAULT_KEY`]).
    pub key: Option<[u8; KEY_LEN]>,
    /// The driver's indirection table (None: round-robin over the enabled
    /// queues).
    pub indirection: Option<[u16; INDIRECTION_LEN]>,
}

impl RssConfig {
    /// Whether it is the device's default (no key, no table of a driver).
    pub const fn is_default(&self) -> bool {
        self.key.is_none() && self.indirection.is_none()
    }

    /// The key RSS hashes with.
    pub fn key_or_default(&self) -> [u8; KEY_LEN] {
        self.key.unwrap_or(DEFAULT_KEY)
    }
}

/// `q` when every entry of `table` is `q`, else [`MIXED`].
fn single_queue(table: &[u16; INDIRECTION_LEN]) -> u16 {
    let q = table[0];
    if table.iter().all(|&e| e == q) {
        q
    } else {
        MIXED
    }
}

impl Default for Rss {
    fn default() -> Self {
        Self::new(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_bitwise() {
        let t = Toeplitz::default();
        let input: Vec<u8> = (0u8..36).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for n in 0..=36 {
            assert_eq!(t.hash(&input[..n]), t.hash_slow(&input[..n]), "len {n}");
        }
    }

    #[test]
    fn indirection_round_robin() {
        let mut r = Rss::new(3);
        assert_eq!(r.indirection()[0..6], [0, 1, 2, 0, 1, 2]);
        assert_eq!(r.queue_for_hash(4), 1);
        assert_eq!(r.queue_for_hash(128 + 4), 1);
        r.set_enabled(0);
        assert_eq!(r.enabled(), 1);
        assert!(r.indirection().iter().all(|&q| q == 0));
    }

    /// The queue is `indirection[hash & 127]` whether or not the hash is
    /// skipped: for tables with one queue (the skip), with one entry
    /// different (no skip), round-robin, and every queue count, over random
    /// keys, IPv4/IPv6 flows and 2-tuples; non-IP frames go to queue 0.
    #[test]
    fn the_queue_is_the_indirection_of_the_hash_with_one_queue_or_many() {
        use crate::flow::L4Proto;
        use crate::rng::SplitMix64;
        use std::net::{Ipv4Addr, Ipv6Addr};
        let mut rng = SplitMix64::new(26);
        for round in 0..400 {
            let mut key = [0u8; KEY_LEN];
            for b in &mut key {
                *b = rng.next_u64() as u8;
            }
            let mut rss = Rss::with_key(key, 1 + (rng.next_u64() % 8) as u16);
            let queue = (rng.next_u64() % 8) as u16;
            match round % 4 {
                0 => rss.set_table(Some([queue; INDIRECTION_LEN])),
                1 => {
                    let mut t = [queue; INDIRECTION_LEN];
                    t[(rng.next_u64() % 128) as usize] = queue + 1;
                    rss.set_table(Some(t));
                }
                2 => rss.set_enabled((rng.next_u64() % 3) as u16),
                _ => {}
            }
            let expect = |h: u32| rss.indirection()[(h & 127) as usize];
            for _ in 0..20 {
                let (a, b) = (rng.next_u64(), rng.next_u64());
                let k = if a & 1 == 0 {
                    let v4 = |x: u64| Ipv4Addr::from(x as u32);
                    FlowKey::v4(
                        L4Proto::Udp,
                        v4(a),
                        (a >> 32) as u16,
                        v4(b),
                        (b >> 32) as u16,
                    )
                } else {
                    let v6 = |x: u64| Ipv6Addr::from(u128::from(x) << 64 | u128::from(!x));
                    FlowKey::v6(
                        L4Proto::Tcp,
                        v6(a),
                        (a >> 48) as u16,
                        v6(b),
                        (b >> 48) as u16,
                    )
                };
                let h = rss.toeplitz().hash_flow(&k);
                assert_eq!(rss.queue_for_key(&k), expect(h), "round {round} {k}");
                let frame = |l3| ParsedFrame {
                    dst_mac: [0; 6],
                    src_mac: [0; 6],
                    vlan_tci: None,
                    ethertype: 0x0800,
                    l3_offset: 14,
                    l3,
                };
                assert_eq!(rss.queue_for(&frame(L3::Flow(k))), expect(h));
                let pair = k.ip_pair();
                let h2 = rss.toeplitz().hash_pair(&pair);
                assert_eq!(rss.queue_for(&frame(L3::Ip(pair))), expect(h2));
                assert_eq!(rss.queue_for(&frame(L3::NonIp)), 0);
            }
        }
    }

    /// A driver's table stays when the enabled count changes; an entry
    /// naming a queue that is not enabled goes where the round-robin table
    /// would put it (`(hash & 127) % enabled`); back to None, the
    /// round-robin table over the enabled queues.
    #[test]
    fn a_drivers_table_is_kept_and_falls_back_entry_by_entry() {
        let mut rss = Rss::new(4);
        let mut t = [3u16; INDIRECTION_LEN];
        t[0] = 0;
        t[1] = 9;
        rss.set_table(Some(t));
        assert_eq!(rss.driver_table(), Some(&t));
        assert_eq!(rss.indirection()[..4], [0, 1, 3, 3]);
        assert_eq!(rss.queue_for_hash(128 + 1), 1, "9 is not enabled: 1 % 4");
        // Two queues: the 3s fall back too, entry by entry.
        rss.set_enabled(2);
        assert_eq!(rss.driver_table(), Some(&t));
        let rr: Vec<u16> = (0..INDIRECTION_LEN).map(|i| (i % 2) as u16).collect();
        assert_eq!(rss.indirection()[..], rr[..]);
        rss.set_enabled(4);
        assert_eq!(rss.indirection()[..4], [0, 1, 3, 3]);
        // All zero: one queue, every frame to it without a hash.
        rss.set_table(Some([0; INDIRECTION_LEN]));
        assert!(rss.indirection().iter().all(|&q| q == 0));
        rss.set_table(None);
        assert_eq!(rss, Rss::new(4));
        assert_eq!(effective_indirection(None, 0), [0; INDIRECTION_LEN]);
    }

    /// A key replaces the hash RSS picks the queue by; the default key and
    /// round-robin table give back the device's own RSS.
    #[test]
    fn configure_sets_the_key_and_the_table() {
        use crate::flow::L4Proto;
        let key = [0x3c; KEY_LEN];
        let mut rss = Rss::new(8);
        rss.configure(&RssConfig {
            key: Some(key),
            indirection: None,
        });
        let other = Rss::with_key(key, 8);
        assert_eq!(rss, other);
        for p in 0..64u16 {
            let k = FlowKey::v4(
                L4Proto::Udp,
                [10, 0, 0, 1].into(),
                p,
                [10, 0, 0, 2].into(),
                80,
            );
            let h = Toeplitz::new(key).hash_flow(&k);
            assert_eq!(rss.queue_for_key(&k), ((h & 127) % 8) as u16);
        }
        rss.configure(&RssConfig::default());
        assert_eq!(rss, Rss::new(8));
        assert!(RssConfig::default().is_default());
        assert_eq!(RssConfig::default().key_or_default(), DEFAULT_KEY);
    }

    #[test]
    fn key_from_hex_names_what_is_wrong() {
        let hex = key_to_hex(&DEFAULT_KEY);
        assert_eq!(key_from_hex(&hex), Ok(DEFAULT_KEY));
        // ethtool's form: bytes separated by `:`.
        let colons: Vec<String> = DEFAULT_KEY.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(key_from_hex(&colons.join(":")), Ok(DEFAULT_KEY));

        let e = key_from_hex("6d5a").unwrap_err();
        assert_eq!(e, KeyParseError::Length(4));
        assert_eq!(e.to_string(), "an RSS key is 80 hex digits, got 4");

        let e = key_from_hex(&format!("zz{}", &hex[2..])).unwrap_err();
        assert_eq!(e, KeyParseError::BadByte("zz".into()));
        assert_eq!(e.to_string(), "RSS key: \"zz\" is not a hex byte");

        // A two-byte character split across two digit pairs.
        let e = key_from_hex(&format!("0\u{e9}{}", &hex[3..])).unwrap_err();
        assert_eq!(e, KeyParseError::NotAscii);
        assert_eq!(e.to_string(), "RSS key is not ASCII hex");
    }
}
