//! The generator's flow sets: what the control socket starts (`gen start`),
//! how a set's tuples and rate are shared among the workers, and the
//! prebuilt headers of each worker's share ([`local_sets`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{parse_addr_range, parse_port_range, InvalidValue};
pub(crate) use crate::frame::checksum;
use crate::virtq::NET_HDR_LEN;

pub(crate) use crate::frame::{ETH_P_ARP, ETH_P_IP, ETH_P_IPV6};
/// Largest frame the generator builds.
pub(crate) const MAX_FRAME: usize = 1514;

/// Most flows in one flow set.
pub(crate) const MAX_FLOWS_PER_SET: u32 = 65_536;
/// Most flows over all live flow sets (each flow costs a tuple and one
/// prebuilt header per worker: about 100 bytes per worker).
pub(crate) const MAX_FLOWS_TOTAL: u64 = 262_144;
/// Most live flow sets.
pub(crate) const MAX_SETS: usize = 1024;

/// A flow set as given over the control socket (every field optional):
/// the protocol's type.
pub(crate) use vnic_ctl_proto::FlowSpec;

/// One UDP 5-tuple (as sent: `src` is the generator side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tuple {
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
}

/// A validated flow set.
pub(crate) struct FlowSet {
    pub id: u32,
    pub spec: FlowSpec,
    pub tuples: Vec<Tuple>,
    /// The worker that generates each tuple: the one whose rx queue RSS
    /// picks for it with every pair enabled, so that by default a frame is
    /// steered to the worker that built it and crosses no thread. (The
    /// steering decision is still made per frame: a filter or RSS over
    /// fewer enabled pairs sends it to another worker's queue.)
    pub owner: Vec<u16>,
    pub count: u64,
    pub rate: u64,
    pub size: usize,
    /// Frames carry a send stamp ([`super::rtt::STAMP_LEN`] bytes after the headers).
    pub stamp: bool,
    /// Packets sent, per worker.
    pub sent: Box<[AtomicU64]>,
    /// The next sequence number of each tuple (frames sent to it so far;
    /// written by the tuple's owner only). It survives the workers'
    /// rebuilds of their shares and `gen pause` / `gen resume`.
    pub seq: Box<[AtomicU64]>,
    pub stopped: AtomicBool,
}

impl FlowSet {
    /// Validates `spec` (defaults filled in from the daemon's addresses).
    pub(crate) fn new(
        id: u32,
        spec: FlowSpec,
        gen_ip: Ipv4Addr,
        guest_ip: Ipv4Addr,
        workers: usize,
    ) -> Result<Self, InvalidValue> {
        let bad = InvalidValue;
        let flows = spec.flows.unwrap_or(1);
        if !(1..=MAX_FLOWS_PER_SET).contains(&flows) {
            return Err(bad(format!(
                "flows must be 1..={MAX_FLOWS_PER_SET}, got {flows}"
            )));
        }
        let (slo, shi) = parse_addr_range(spec.src.as_deref().unwrap_or(&gen_ip.to_string()))
            .map_err(|e| bad(format!("src: {e}")))?;
        let (dlo, dhi) = parse_addr_range(spec.dst.as_deref().unwrap_or(&guest_ip.to_string()))
            .map_err(|e| bad(format!("dst: {e}")))?;
        if dlo != dhi {
            return Err(bad("dst must be a single address".into()));
        }
        if slo.is_ipv4() != dlo.is_ipv4() {
            return Err(bad("src and dst must be of the same family".into()));
        }
        let (dplo, dphi) = parse_port_range(spec.dport.as_deref().unwrap_or("5001"))
            .map_err(|e| bad(format!("dport: {e}")))?;
        let nsrc: u128 = match (slo, shi) {
            (IpAddr::V4(a), IpAddr::V4(b)) => u128::from(u32::from(b) - u32::from(a)) + 1,
            // the whole IPv6 space is 2^128 addresses: saturate (refused below)
            (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(b) - u128::from(a)).saturating_add(1),
            _ => 1,
        };
        let (splo, sphi) = if let Some(r) = spec.sport.as_deref() {
            parse_port_range(r).map_err(|e| bad(format!("sport: {e}")))?
        } else {
            // No source port given: as many as `flows` needs beside the
            // other ranges, from 10000 up (lower when that runs past 65535).
            let other = (u128::from(dphi - dplo) + 1).saturating_mul(nsrc);
            let need = u128::from(flows).div_ceil(other).clamp(1, 65_536);
            let lo = 10_000u128.min(65_536 - need);
            (lo as u16, (lo + need - 1) as u16)
        };
        let size = spec.size.unwrap_or(64);
        let stamp = spec.stamp.unwrap_or(false);
        let hdr = if slo.is_ipv4() { 42 } else { 62 };
        let min = if stamp {
            (hdr + super::rtt::STAMP_LEN).max(60)
        } else {
            hdr.max(60)
        };
        if !(min..=MAX_FRAME).contains(&size) {
            return Err(bad(format!(
                "size must be {min}..={MAX_FRAME} bytes{}, got {size}",
                if stamp { " with a stamp" } else { "" }
            )));
        }
        let nsp = u64::from(sphi - splo) + 1;
        let ndp = u64::from(dphi - dplo) + 1;
        // saturating: a whole IPv6 range is already u128::MAX (refused only if
        // `flows` exceeds it, which it cannot)
        let distinct = (u128::from(nsp) * u128::from(ndp)).saturating_mul(nsrc);
        if u128::from(flows) > distinct {
            return Err(bad(format!(
                "flows = {flows} but the address/port ranges only give {distinct} distinct tuples"
            )));
        }
        let tuples: Vec<Tuple> = (0..u64::from(flows))
            .map(|i| {
                let sport = splo + (i % nsp) as u16;
                let dport = dplo + ((i / nsp) % ndp) as u16;
                let k = u128::from(i / nsp / ndp);
                let src = match slo {
                    IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) + k as u32)),
                    IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) + k)),
                };
                Tuple {
                    src,
                    sport,
                    dst: dlo,
                    dport,
                }
            })
            .collect();
        let rss = arfs::Rss::new(workers.max(1) as u16);
        let owner = tuples
            .iter()
            .map(|t| {
                arfs::FlowKey::new(arfs::L4Proto::Udp, t.src, t.sport, t.dst, t.dport)
                    .map_or(0, |k| rss.queue_for_key(&k))
            })
            .collect();
        // Record the resolved spec (defaults filled in) for `gen list` and `gen set`.
        let spec = FlowSpec {
            flows: Some(flows),
            src: Some(spec.src.unwrap_or_else(|| gen_ip.to_string())),
            sport: Some(spec.sport.unwrap_or_else(|| "10000".into())),
            dst: Some(spec.dst.unwrap_or_else(|| guest_ip.to_string())),
            dport: Some(spec.dport.unwrap_or_else(|| "5001".into())),
            count: Some(spec.count.unwrap_or(0)),
            rate: Some(spec.rate.unwrap_or(1000)),
            size: Some(size),
            stamp: Some(stamp),
        };
        Ok(Self {
            id,
            count: spec.count.unwrap_or(0),
            rate: spec.rate.unwrap_or(1000),
            size,
            stamp,
            spec,
            tuples,
            owner,
            sent: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            seq: (0..flows).map(|_| AtomicU64::new(0)).collect(),
            stopped: AtomicBool::new(false),
        })
    }

    /// Whether worker `w` generates tuple `i`.
    pub(crate) fn owns(&self, i: usize, w: usize) -> bool {
        self.owner.get(i).is_some_and(|&o| usize::from(o) == w)
    }

    /// Packets and rate worker `w` must send (count 0 = unlimited).
    pub(crate) fn share(&self, w: usize) -> (u64, f64) {
        let f = self.tuples.len() as u64;
        let mine: u64 = (0..f).filter(|&i| self.owns(i as usize, w)).count() as u64;
        let count = if self.count == 0 {
            0
        } else {
            (0..f)
                .filter(|&i| self.owns(i as usize, w))
                .map(|i| self.count / f + u64::from(i < self.count % f))
                .sum::<u64>()
        };
        let rate = self.rate as f64 * mine as f64 / f as f64;
        (count, rate)
    }

    pub(crate) fn sent(&self) -> u64 {
        self.sent.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }

    pub(crate) fn active(&self) -> bool {
        !self.stopped.load(Ordering::Relaxed) && (self.count == 0 || self.sent() < self.count)
    }

    /// The set as `gen list` and `gen set` show it.
    pub(crate) fn to_wire(&self) -> vnic_ctl_proto::FlowSetInfo {
        vnic_ctl_proto::FlowSetInfo {
            id: self.id,
            spec: vnic_ctl_proto::ResolvedFlowSpec {
                flows: self.tuples.len() as u32,
                src: self.spec.src.clone().unwrap_or_default(),
                sport: self.spec.sport.clone().unwrap_or_default(),
                dst: self.spec.dst.clone().unwrap_or_default(),
                dport: self.spec.dport.clone().unwrap_or_default(),
                count: self.count,
                rate: self.rate,
                size: self.size,
                stamp: self.stamp,
            },
            sent: self.sent(),
            active: self.active(),
        }
    }
}

/// The generator's flow sets, changed by the control socket; workers copy
/// their share when `version` moves.
#[derive(Default)]
pub(crate) struct GenControl {
    pub sets: Mutex<(u32, Vec<Arc<FlowSet>>)>,
    pub version: AtomicU64,
    /// The guest's MAC as learned from its frames (0: unknown, broadcast).
    pub guest_mac: AtomicU64,
}

impl GenControl {
    pub(crate) fn snapshot(&self) -> Vec<Arc<FlowSet>> {
        self.sets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            .clone()
    }

    pub(crate) fn bump(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }
}

/// Bytes of the checked head of a generated payload, four u64 big endian:
/// the flow's sequence number, a tag derived from (flow, sequence number,
/// send time, length), the send time (`crate::clock::now_ns`, the clock of
/// the trace: see [`super::Sink::table_ns`]) and the length of the whole
/// UDP payload (stamp, head and fill). It starts the UDP payload, or
/// follows the send stamp ([`super::rtt::STAMP_LEN`] bytes) of a stamped
/// set. The guest agent verifies the tag, the fill after the head and the
/// length against what it received (`vnic_agent::payload`, which must
/// agree with [`seq_tag`] and [`fill_byte`]).
pub(crate) const SEQ_LEN: usize = 32;

/// The tag of sequence number `seq` of the flow from port `sport` to port
/// `dport`, sent at `sent` with `len` bytes of UDP payload: a frame of
/// another flow, or with a damaged sequence number, send time or length,
/// does not carry it.
#[inline]
pub(crate) fn seq_tag(sport: u16, dport: u16, seq: u64, sent: u64, len: u64) -> u64 {
    // Each term a bijection of its field (a multiply by an odd constant,
    // a rotation) and xor'ed: for the others fixed, another value of any
    // one field never gives the same tag.
    (seq ^ ((u64::from(sport) << 48) | (u64::from(dport) << 32)))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ sent.wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(17)
        ^ len.wrapping_mul(0x94d0_49bb_1331_11eb).rotate_left(41)
}

/// Byte `k` of a generated UDP payload after its head (`k` counts from
/// the start of the UDP payload): fixed, so that it is written once per
/// flow set and the checksum covers it from the template on.
#[inline]
pub(crate) fn fill_byte(k: usize) -> u8 {
    (k as u8).wrapping_mul(31).wrapping_add(0xa5)
}

/// Offset of the sequence head in the UDP payload of a set's frames.
#[inline]
pub(crate) fn seq_offset(stamp: bool) -> usize {
    if stamp {
        super::rtt::STAMP_LEN
    } else {
        0
    }
}

/// Writes a UDP frame for `t` into `buf` (at least `size` bytes),
/// returning the header length: the payload is [`fill_byte`] with a zero
/// head (stamp and sequence head, when the payload has room for them:
/// `var` bytes), and the UDP checksum (IPv4 and IPv6) covers it, so that
/// the per-frame head can be folded in incrementally ([`fold_head`]).
pub(crate) fn build_udp(
    buf: &mut [u8],
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    t: &Tuple,
    size: usize,
    var: usize,
) -> usize {
    buf[..size].fill(0);
    buf[0..6].copy_from_slice(&dst_mac);
    buf[6..12].copy_from_slice(&src_mac);
    let hdr = match (t.src, t.dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => 42,
        (IpAddr::V6(_), IpAddr::V6(_)) => 62,
        _ => return 0,
    };
    for (k, b) in buf[hdr..size].iter_mut().enumerate() {
        *b = if k < var { 0 } else { fill_byte(k) };
    }
    let mut pseudo = [0u8; 40];
    let plen;
    match (t.src, t.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            buf[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
            let ip = &mut buf[14..34];
            let tot = (size - 14) as u16;
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&tot.to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = checksum(&[ip], 0);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            plen = tot - 20;
            pseudo[..4].copy_from_slice(&s.octets());
            pseudo[4..8].copy_from_slice(&d.octets());
            pseudo[9] = 17;
            pseudo[10..12].copy_from_slice(&plen.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            buf[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
            plen = (size - 54) as u16;
            let ip = &mut buf[14..54];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&plen.to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            pseudo[0..16].copy_from_slice(&s.octets());
            pseudo[16..32].copy_from_slice(&d.octets());
            pseudo[32..36].copy_from_slice(&u32::from(plen).to_be_bytes());
            pseudo[39] = 17;
        }
        _ => return 0,
    }
    let l4 = hdr - 8;
    buf[l4..l4 + 2].copy_from_slice(&t.sport.to_be_bytes());
    buf[l4 + 2..l4 + 4].copy_from_slice(&t.dport.to_be_bytes());
    buf[l4 + 4..l4 + 6].copy_from_slice(&plen.to_be_bytes());
    let pl = if hdr == 42 { 12 } else { 40 };
    let mut c = checksum(&[&pseudo[..pl], &buf[l4..size]], 0);
    if c == 0 {
        c = 0xffff;
    }
    buf[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
    hdr
}

/// The ones' complement sum of the four 16-bit words of `x` (as written
/// big endian), not yet folded to 16 bits.
#[inline]
pub(crate) fn word_sum(x: u64) -> u64 {
    (x >> 32) + (x & 0xffff_ffff)
}

/// Folds `sum` (a [`word_sum`] total of the words written over the zero
/// head of a frame [`build_udp`] made) into the frame's UDP checksum:
/// RFC 1624's incremental update.
#[inline]
pub(crate) fn fold_sum(frame: &mut [u8], hdr_len: usize, sum: u64) {
    let at = hdr_len - 2;
    let old = u16::from_be_bytes([frame[at], frame[at + 1]]);
    // `sum` is at most six word_sum totals (each < 2^33), so `s` < 2^36:
    // three 16-bit folds leave at most 0xffff (< 2^16 + 2^20, then
    // < 2^16 + 2^5, then <= 0xffff), with no loop per frame.
    debug_assert!(sum < 6 << 33);
    let mut s = u64::from(!old) + sum;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    let mut c = !(s as u16);
    if c == 0 {
        c = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
/// Folds `head` (bytes written over the zero head at the start of the UDP
/// payload of a frame [`build_udp`] made, an even number of bytes) into
/// the frame's UDP checksum: RFC 1624's incremental update, so a frame
/// costs a sum over its head, not over its payload.
#[inline]
pub(crate) fn fold_head(frame: &mut [u8], hdr_len: usize, head: &[u8]) {
    let at = hdr_len - 2;
    let old = u16::from_be_bytes([frame[at], frame[at + 1]]);
    let mut c = checksum(&[head], u32::from(!old));
    if c == 0 {
        c = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

/// A worker's share of one flow set.
pub(crate) struct LocalSet {
    pub set: Arc<FlowSet>,
    /// Prebuilt headers, one per tuple (`hdr_len` bytes each).
    pub headers: Vec<[u8; 62]>,
    /// The index in `set.tuples` of each of them (for `set.seq`).
    pub idx: Vec<usize>,
    pub hdr_len: usize,
    /// The set's frame buffer (virtio-net header space, then `size`
    /// bytes): the payload's fill is written once here, each frame only
    /// copies its header and writes its head.
    pub buf: Vec<u8>,
    /// Bytes of the head (stamp and sequence head) that each frame writes
    /// at the start of its payload (0: the payload has no room for it).
    pub var: usize,
    pub remaining: Option<u64>,
    pub rate: f64,
    pub credit: f64,
    pub next: usize,
}

/// Builds the share of worker `w` (see [`FlowSet::owner`]).
pub(crate) fn local_sets(
    sets: &[Arc<FlowSet>],
    w: usize,
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
) -> Vec<LocalSet> {
    let mut out = Vec::new();
    for s in sets {
        if !s.active() {
            continue;
        }
        let idx: Vec<usize> = (0..s.tuples.len()).filter(|&i| s.owns(i, w)).collect();
        if idx.is_empty() {
            continue;
        }
        let (count, rate) = s.share(w);
        let sent = s.sent[w].load(Ordering::Relaxed);
        let remaining = if s.count == 0 {
            None
        } else {
            Some(count.saturating_sub(sent))
        };
        if remaining == Some(0) {
            continue;
        }
        let mut buf = vec![0u8; NET_HDR_LEN + s.size];
        let mut hdr_len = 0;
        let hdr = if s.tuples[idx[0]].src.is_ipv4() {
            42
        } else {
            62
        };
        let room = s.size - hdr;
        let var = if room >= seq_offset(s.stamp) + SEQ_LEN {
            seq_offset(s.stamp) + SEQ_LEN
        } else if s.stamp {
            super::rtt::STAMP_LEN
        } else {
            0
        };
        let headers = idx
            .iter()
            .map(|&i| {
                hdr_len = build_udp(
                    &mut buf[NET_HDR_LEN..],
                    dst_mac,
                    src_mac,
                    &s.tuples[i],
                    s.size,
                    var,
                );
                let mut h = [0u8; 62];
                h[..hdr_len].copy_from_slice(&buf[NET_HDR_LEN..NET_HDR_LEN + hdr_len]);
                h
            })
            .collect();
        out.push(LocalSet {
            set: s.clone(),
            headers,
            idx,
            hdr_len,
            buf,
            var,
            remaining,
            rate,
            credit: 0.0,
            next: 0,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{udp_checksum_ok, udp_payload};

    fn gen_ip() -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 2, 1)
    }
    fn guest_ip() -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 2, 15)
    }

    #[test]
    fn udp_v4_parses_as_flow() {
        let s = FlowSet::new(
            1,
            FlowSpec {
                flows: Some(4),
                sport: Some("100-101".into()),
                dport: Some("7-8".into()),
                ..Default::default()
            },
            gen_ip(),
            guest_ip(),
            2,
        )
        .unwrap();
        assert_eq!(s.tuples.len(), 4);
        assert_eq!(
            s.tuples[3],
            Tuple {
                src: gen_ip().into(),
                sport: 101,
                dst: guest_ip().into(),
                dport: 8
            }
        );
        let mut buf = [0u8; MAX_FRAME];
        build_udp(&mut buf, [2; 6], [4; 6], &s.tuples[1], 64, SEQ_LEN);
        assert!(udp_checksum_ok(&buf[..64]));
        let p = arfs::parse_frame(&buf[..64]).unwrap();
        let k = p.flow().unwrap();
        assert_eq!(
            *k,
            arfs::FlowKey::v4(arfs::L4Proto::Udp, gen_ip(), 101, guest_ip(), 7)
        );
        // IPv4 header checksum verifies.
        assert_eq!(checksum(&[&buf[14..34]], 0), 0);
    }

    #[test]
    fn udp_v6_checksum() {
        let s = FlowSet::new(
            1,
            FlowSpec {
                src: Some("fd00::1".into()),
                dst: Some("fd00::2".into()),
                size: Some(100),
                ..Default::default()
            },
            gen_ip(),
            guest_ip(),
            1,
        )
        .unwrap();
        let mut buf = [0u8; MAX_FRAME];
        build_udp(&mut buf, [2; 6], [4; 6], &s.tuples[0], 100, SEQ_LEN);
        assert!(arfs::parse_frame(&buf[..100]).unwrap().flow().is_some());
        let mut pseudo = [0u8; 40];
        pseudo[0..16].copy_from_slice(&buf[22..38]);
        pseudo[16..32].copy_from_slice(&buf[38..54]);
        pseudo[35] = 46;
        pseudo[39] = 17;
        assert_eq!(checksum(&[&pseudo, &buf[54..100]], 0), 0);
    }

    /// fold_sum's three folds against the folding loop they replace, on
    /// sums whose carry runs through every fold and on random ones.
    #[test]
    fn fold_sum_folds_as_far_as_the_loop() {
        fn by_loop(old: u16, sum: u64) -> u16 {
            let mut s = u64::from(!old) + sum;
            while s >> 16 != 0 {
                s = (s & 0xffff) + (s >> 16);
            }
            match !(s as u16) {
                0 => 0xffff,
                c => c,
            }
        }
        let mut cases = vec![
            (0xffff, 0x1_0000_ffff),
            (0x0000, 0x1_0000_0000),
            (0xffff, (1 << 35) - 1),
            (0x0000, (1 << 35) - 1),
            (0x1234, 0),
            (0xffff, 0),
            (0x0000, 0xffff),
        ];
        let mut rng = arfs::rng::SplitMix64::new(0x2545_f491_4f6c_dd1d);
        for _ in 0..10_000 {
            let x = rng.next_u64();
            cases.push(((x >> 48) as u16, x & ((1 << 35) - 1)));
        }
        for (old, sum) in cases {
            let mut f = [0u8; 8];
            f[6..8].copy_from_slice(&old.to_be_bytes());
            fold_sum(&mut f, 8, sum);
            assert_eq!(
                u16::from_be_bytes([f[6], f[7]]),
                by_loop(old, sum),
                "old {old:#x} sum {sum:#x}"
            );
        }
    }

    /// The head folded in per frame keeps the checksum valid (IPv4 and
    /// IPv6, odd and even payload lengths), the fill is where the agent
    /// looks for it, and the corrupt fault flips one byte and keeps the
    /// checksum valid.
    #[test]
    fn seq_head_fill_and_corrupt_keep_the_checksum() {
        for (src, dst) in [("10.0.2.1", "10.0.2.15"), ("fd00:2::1", "fd00:2::15")] {
            for size in [100, 101, 128, 1514] {
                let t = Tuple {
                    src: src.parse().unwrap(),
                    sport: 10000,
                    dst: dst.parse().unwrap(),
                    dport: 20007,
                };
                let mut f = vec![0u8; size];
                let hl = build_udp(&mut f, [2; 6], [4; 6], &t, size, SEQ_LEN);
                assert!(udp_checksum_ok(&f), "{src} {size}: template");
                let mut rng = arfs::rng::SplitMix64::new(0x9e37_79b9_7f4a_7c15);
                let mut seqs = vec![0u64, 1, 0xffff_ffff_ffff, u64::MAX];
                seqs.extend((0..200).map(|_| rng.next_u64()));
                for seq in seqs {
                    let sent = seq.rotate_left(7) ^ 0x1234_5678;
                    let len = (size - hl) as u64;
                    let tag = seq_tag(10000, 20007, seq, sent, len);
                    let mut head = [0u8; SEQ_LEN];
                    head[..8].copy_from_slice(&seq.to_be_bytes());
                    head[8..16].copy_from_slice(&tag.to_be_bytes());
                    head[16..24].copy_from_slice(&sent.to_be_bytes());
                    head[24..].copy_from_slice(&len.to_be_bytes());
                    let mut g = f.clone();
                    g[hl..hl + SEQ_LEN].copy_from_slice(&head);
                    let mut via_sum = g.clone();
                    fold_head(&mut g, hl, &head);
                    assert!(udp_checksum_ok(&g), "{src} {size} seq {seq}");
                    fold_sum(
                        &mut via_sum,
                        hl,
                        word_sum(seq) + word_sum(tag) + word_sum(sent) + word_sum(len),
                    );
                    assert_eq!(g, via_sum, "fold_sum agrees with fold_head");
                    let (_, p) = udp_payload(&g).unwrap();
                    assert_eq!(p.len(), size - hl);
                    assert_eq!(&p[..SEQ_LEN], &head);
                    assert!(p
                        .iter()
                        .enumerate()
                        .skip(SEQ_LEN)
                        .all(|(k, &b)| b == fill_byte(k)));
                    let before = g.clone();
                    // Truncated: 16 bytes fewer than the head says, the
                    // checksum valid.
                    let mut short = g.clone();
                    let end = crate::steer::truncate_payload(&mut short).unwrap();
                    short.truncate(end);
                    assert!(udp_checksum_ok(&short), "{src} {size} seq {seq}: truncated");
                    let (_, p) = udp_payload(&short).unwrap();
                    assert_eq!(p.len() as u64 + 16, len);
                    assert_eq!(p.get(..SEQ_LEN).unwrap_or(p), &head[..SEQ_LEN.min(p.len())]);
                    let mut bad = g.clone();
                    assert!(crate::steer::corrupt_payload(&mut bad, false));
                    assert!(
                        !udp_checksum_ok(&bad),
                        "{src} {size} seq {seq}: stale checksum"
                    );
                    assert!(crate::steer::corrupt_payload(&mut g, true));
                    assert!(udp_checksum_ok(&g), "{src} {size} seq {seq}: corrupted");
                    let diff: Vec<usize> = (0..size).filter(|&i| g[i] != before[i]).collect();
                    assert_eq!(diff.last(), Some(&(size - 1)), "{diff:?}");
                    assert!(
                        diff[..diff.len() - 1]
                            .iter()
                            .all(|&i| i == hl - 2 || i == hl - 1),
                        "only the last byte and the checksum change: {diff:?}"
                    );
                }
            }
        }
        // Not UDP, truncated: untouched, no panic.
        for n in 0..64 {
            let mut f = vec![0x45u8; n];
            assert!(!crate::steer::corrupt_payload(&mut f, true));
        }
    }

    #[test]
    fn shares_add_up() {
        let s = FlowSet::new(
            1,
            FlowSpec {
                flows: Some(5),
                sport: Some("1-5".into()),
                count: Some(103),
                rate: Some(1000),
                ..Default::default()
            },
            gen_ip(),
            guest_ip(),
            3,
        )
        .unwrap();
        let tot: u64 = (0..3).map(|w| s.share(w).0).sum();
        assert_eq!(tot, 103);
        let rate: f64 = (0..3).map(|w| s.share(w).1).sum();
        assert!((rate - 1000.0).abs() < 1e-6);
    }

    #[test]
    fn flows_without_a_port_range_spread_over_source_ports() {
        let sports = |spec: FlowSpec| {
            let s = FlowSet::new(1, spec, gen_ip(), guest_ip(), 1).unwrap();
            let v: Vec<u16> = s.tuples.iter().map(|t| t.sport).collect();
            let distinct: std::collections::BTreeSet<_> =
                s.tuples.iter().map(|t| (t.src, t.sport, t.dport)).collect();
            assert_eq!(distinct.len(), v.len(), "tuples distinct");
            v
        };
        let v = sports(FlowSpec {
            flows: Some(64),
            ..Default::default()
        });
        assert_eq!((v[0], v[63]), (10_000, 10_063));
        // With a dport range, only the ports still needed.
        let v = sports(FlowSpec {
            flows: Some(64),
            dport: Some("5001-5016".into()),
            ..Default::default()
        });
        assert_eq!(
            (v.iter().min(), v.iter().max()),
            (Some(&10_000), Some(&10_003))
        );
        // More than 55,536: the range ends at 65535.
        let v = sports(FlowSpec {
            flows: Some(65_536),
            ..Default::default()
        });
        assert_eq!((v[0], v[65_535]), (0, 65_535));
        assert_eq!(
            sports(FlowSpec {
                flows: Some(1),
                ..Default::default()
            }),
            vec![10_000]
        );
    }

    #[test]
    fn whole_ipv6_source_range_does_not_overflow() {
        // The fuzzer's find: the whole IPv6 space as the source range, with
        // and without port ranges, overflowed the distinct-tuple product.
        for sport in [None, Some("0-65535".to_string())] {
            let s = FlowSet::new(
                1,
                FlowSpec {
                    flows: Some(3),
                    src: Some("::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".into()),
                    dst: Some("fd00::2".into()),
                    dport: Some("0-65535".into()),
                    sport,
                    ..Default::default()
                },
                gen_ip(),
                guest_ip(),
                2,
            )
            .unwrap();
            assert_eq!(s.tuples.len(), 3);
        }
    }

    #[test]
    fn bad_specs() {
        let f = |spec: FlowSpec| {
            FlowSet::new(1, spec, gen_ip(), guest_ip(), 1)
                .err()
                .unwrap()
                .0
        };
        assert!(f(FlowSpec {
            flows: Some(10),
            sport: Some("10000".into()),
            ..Default::default()
        })
        .contains("distinct"));
        assert!(f(FlowSpec {
            size: Some(20),
            ..Default::default()
        })
        .contains("size"));
        assert!(f(FlowSpec {
            src: Some("fd00::1".into()),
            ..Default::default()
        })
        .contains("family"));
        assert!(f(FlowSpec {
            sport: Some("9-1".into()),
            ..Default::default()
        })
        .contains("sport"));
    }
}
