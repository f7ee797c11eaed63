//! Round-trip times through the guest, for request/response workloads on
//! the generator.
//!
//! A flow set started with `"stamp": true` writes [`STAMP_LEN`] bytes
//! right after each frame's UDP header: [`MAGIC`] and the time the frame
//! was generated (nanoseconds on the daemon's monotonic clock). A guest
//! application that echoes the datagram back to the generator's address
//! gives the generator the round trip: device RX ring, guest interrupt and
//! softirq (RPS/RFS steering included), the application's wake-up and
//! reply, guest TX, device TX. [`RttHist`] collects them per daemon; `ctl
//! stats` shows it under `peer.rtt`.
//!
//! The guest controls what it sends: a stamp from the future or older
//! than [`MAX_RTT`] is counted as `bad` and not recorded.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::flows::{ETH_P_IP, ETH_P_IPV6};

/// Bytes of the stamp in the payload: magic, then the send time.
pub const STAMP_LEN: usize = 16;
/// What starts a stamped payload.
pub const MAGIC: [u8; 8] = *b"vnic-rtt";
/// Longest round trip recorded; older stamps are `bad`.
pub const MAX_RTT: Duration = Duration::from_mins(1);

/// Sub-buckets per power of two (each 1/8 of its octave wide: a
/// percentile read from the histogram is within 12.5% of the true value).
const SUB: u32 = 8;
/// Buckets: exact below 8 ns, then 8 per octave up to 2^36 ns (> MAX_RTT).
const BUCKETS: usize = ((36 - 2) * SUB) as usize;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since the daemon's first call (monotonic).
pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

#[cfg(test)]
/// Writes the stamp into `frame` (an Ethernet frame with `hdr_len` bytes
/// of headers built by `flows::build_udp` with a zero head of at least
/// [`STAMP_LEN`] bytes) and folds it into the UDP checksum. `frame` must
/// hold `hdr_len + STAMP_LEN` bytes (the flow set checked its size).
pub fn stamp(frame: &mut [u8], hdr_len: usize, now: u64) {
    let mut head = [0u8; STAMP_LEN];
    head[..8].copy_from_slice(&MAGIC);
    head[8..].copy_from_slice(&now.to_be_bytes());
    let Some(p) = frame.get_mut(hdr_len..hdr_len + STAMP_LEN) else {
        return;
    };
    p.copy_from_slice(&head);
    super::flows::fold_head(frame, hdr_len, &head);
}

/// The send time carried by `frame` when it is a UDP datagram to one of
/// the generator's addresses whose payload starts with [`MAGIC`] (IPv4 of
/// any header length, unfragmented; IPv6 with UDP right after the fixed
/// header).
pub fn echoed_stamp(frame: &[u8], ip: Ipv4Addr, ip6: Ipv6Addr) -> Option<u64> {
    let et = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let payload = if et == ETH_P_IP {
        let h = frame.get(14..34)?;
        let ihl = usize::from(h[0] & 0x0f) * 4;
        let frag = u16::from_be_bytes([h[6], h[7]]) & 0x3fff;
        if h[0] >> 4 != 4 || ihl < 20 || h[9] != 17 || frag != 0 || h[16..20] != ip.octets() {
            return None;
        }
        frame.get(14 + ihl + 8..)?
    } else if et == ETH_P_IPV6 {
        let h = frame.get(14..54)?;
        if h[0] >> 4 != 6 || h[6] != 17 || h[24..40] != ip6.octets() {
            return None;
        }
        frame.get(62..)?
    } else {
        return None;
    };
    let s = payload.get(..STAMP_LEN)?;
    if s[..8] != MAGIC {
        return None;
    }
    Some(u64::from_be_bytes(s[8..16].try_into().ok()?))
}

/// The bucket of `ns`.
fn bucket(ns: u64) -> usize {
    if ns < u64::from(SUB) {
        return ns as usize;
    }
    let e = ns.ilog2();
    let sub = (ns >> (e - 3)) & u64::from(SUB - 1);
    (((e - 2) * SUB) as usize + sub as usize).min(BUCKETS - 1)
}

/// The range [lo, hi) of bucket `i`, in ns.
pub fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB as usize {
        return (i as u64, i as u64 + 1);
    }
    let e = i as u32 / SUB + 2;
    let sub = (i as u32 % SUB) as u64;
    ((8 + sub) << (e - 3), (9 + sub) << (e - 3))
}

/// Round trips seen by the generator (any worker records: relaxed RMW).
pub struct RttHist {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
    bad: AtomicU64,
}

impl Default for RttHist {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            bad: AtomicU64::new(0),
        }
    }
}

impl RttHist {
    /// Records the round trip of a stamp sent at `sent` and echoed back at
    /// `now`; a stamp from the future or older than [`MAX_RTT`] is `bad`.
    pub fn record(&self, sent: u64, now: u64) {
        match now.checked_sub(sent) {
            Some(d) if d <= MAX_RTT.as_nanos() as u64 => {
                self.buckets[bucket(d)].fetch_add(1, Ordering::Relaxed);
                self.sum_ns.fetch_add(d, Ordering::Relaxed);
                self.count.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                self.bad.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// `{"replies", "sum_ns", "bad", "buckets": [[lo_ns, hi_ns, n], ...]}`
    /// (non-empty buckets only, ascending).
    pub fn to_json(&self) -> Value {
        let buckets: Vec<Value> = self
            .buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let n = b.load(Ordering::Relaxed);
                (n > 0).then(|| {
                    let (lo, hi) = bucket_range(i);
                    json!([lo, hi, n])
                })
            })
            .collect();
        json!({
            "replies": self.count.load(Ordering::Relaxed),
            "sum_ns": self.sum_ns.load(Ordering::Relaxed),
            "bad": self.bad.load(Ordering::Relaxed),
            "buckets": buckets,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::udp_checksum_ok;
    use crate::peer::flows::{build_udp, Tuple};

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut prev_hi = 0;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_range(i);
            assert_eq!(
                lo,
                prev_hi,
                "bucket {i} starts where {} ended",
                i.max(1) - 1
            );
            assert!(hi > lo);
            assert_eq!(bucket(lo), i);
            assert_eq!(bucket(hi - 1), i);
            // At most 1/8 of the bucket's lower edge wide (beyond the exact ones).
            if lo >= 8 {
                assert!((hi - lo) * 8 <= lo, "bucket {i} [{lo},{hi}) too wide");
            }
            prev_hi = hi;
        }
        assert!(prev_hi > MAX_RTT.as_nanos() as u64);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn record_sorts_good_and_bad() {
        let h = RttHist::default();
        h.record(1_000, 251_000); // 250 us
        h.record(1_000, 1_001_000); // 1 ms
        h.record(5_000, 4_000); // from the future
        h.record(0, MAX_RTT.as_nanos() as u64 + 1); // too old
        let v = h.to_json();
        assert_eq!(v["replies"], 2);
        assert_eq!(v["bad"], 2);
        assert_eq!(v["sum_ns"], 1_250_000);
        let b = v["buckets"].as_array().unwrap();
        assert_eq!(b.len(), 2);
        let (lo, hi) = (b[0][0].as_u64().unwrap(), b[0][1].as_u64().unwrap());
        assert!(lo <= 250_000 && 250_000 < hi);
    }

    /// A stamped frame is found again in its echo (addresses swapped, as a
    /// guest's reply has them), over IPv4 and IPv6, and the UDP checksum
    /// still verifies after the stamp.
    #[test]
    fn stamp_round_trip_v4_and_v6() {
        let gen4 = Ipv4Addr::new(10, 0, 2, 1);
        let gen6: Ipv6Addr = "fd00:2::1".parse().unwrap();
        for (g, guest) in [
            (
                std::net::IpAddr::V4(gen4),
                "10.0.2.15".parse::<std::net::IpAddr>().unwrap(),
            ),
            (std::net::IpAddr::V6(gen6), "fd00:2::15".parse().unwrap()),
        ] {
            let t = Tuple {
                src: g,
                sport: 9,
                dst: guest,
                dport: 20000,
            };
            let mut f = [0u8; 128];
            let hl = build_udp(&mut f, [2; 6], [4; 6], &t, 128, STAMP_LEN);
            stamp(&mut f, hl, 123_456_789);
            // The guest's echo: same payload, addresses swapped.
            let echo_t = Tuple {
                src: guest,
                sport: 20000,
                dst: g,
                dport: 9,
            };
            let mut e = [0u8; 128];
            let ehl = build_udp(&mut e, [4; 6], [2; 6], &echo_t, 128, STAMP_LEN);
            e[ehl..].copy_from_slice(&f[hl..]);
            assert_eq!(echoed_stamp(&e, gen4, gen6), Some(123_456_789));
            // Not to us: ignored.
            assert_eq!(echoed_stamp(&f, gen4, gen6), None);
            assert!(udp_checksum_ok(&f), "UDP checksum after the stamp");
        }
        // Truncated or foreign frames: no stamp, no panic.
        for n in 0..80 {
            let _ = echoed_stamp(&[0x45; 80][..n], gen4, gen6);
        }
    }
}
