//! The generator's flow sets: what the control socket starts (`gen start`),
//! how a set's tuples and rate are shared among the workers, and the
//! prebuilt headers of each worker's share ([`local_sets`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::{parse_addr_range, parse_port_range, InvalidValue};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86DD;
/// Largest frame the generator builds.
pub const MAX_FRAME: usize = 1514;

/// Most flows in one flow set.
pub const MAX_FLOWS_PER_SET: u32 = 65_536;
/// Most flows over all live flow sets (each flow costs a tuple and one
/// prebuilt header per worker: about 100 bytes per worker).
pub const MAX_FLOWS_TOTAL: u64 = 262_144;
/// Most live flow sets.
pub const MAX_SETS: usize = 1024;

/// A flow set as given over the control socket (every field optional).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    /// Carry a send time stamp in each frame's payload, so that a guest
    /// echoing the payload back to the generator gives a round-trip time
    /// (see [`super::rtt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<bool>,
}

impl FlowSpec {
    /// `self` with the fields of `over` that are set.
    #[must_use]
    pub fn merged(&self, over: &FlowSpec) -> FlowSpec {
        FlowSpec {
            flows: over.flows.or(self.flows),
            src: over.src.clone().or_else(|| self.src.clone()),
            sport: over.sport.clone().or_else(|| self.sport.clone()),
            dst: over.dst.clone().or_else(|| self.dst.clone()),
            dport: over.dport.clone().or_else(|| self.dport.clone()),
            count: over.count.or(self.count),
            rate: over.rate.or(self.rate),
            size: over.size.or(self.size),
            stamp: over.stamp.or(self.stamp),
        }
    }
}

/// One UDP 5-tuple (as sent: `src` is the generator side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple {
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
}

/// A validated flow set.
pub struct FlowSet {
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
    pub stopped: AtomicBool,
}

impl FlowSet {
    /// Validates `spec` (defaults filled in from the daemon's addresses).
    pub fn new(
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
            (IpAddr::V6(a), IpAddr::V6(b)) => u128::from(b) - u128::from(a) + 1,
            _ => 1,
        };
        let (splo, sphi) = if let Some(r) = spec.sport.as_deref() {
            parse_port_range(r).map_err(|e| bad(format!("sport: {e}")))?
        } else {
            // No source port given: as many as `flows` needs beside the
            // other ranges, from 10000 up (lower when that runs past 65535).
            let other = u128::from(dphi - dplo + 1) * nsrc;
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
        let distinct = u128::from(nsp) * u128::from(ndp) * nsrc;
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
            stopped: AtomicBool::new(false),
        })
    }

    /// Whether worker `w` generates tuple `i`.
    pub fn owns(&self, i: usize, w: usize) -> bool {
        self.owner.get(i).is_some_and(|&o| usize::from(o) == w)
    }

    /// Packets and rate worker `w` must send (count 0 = unlimited).
    pub fn share(&self, w: usize) -> (u64, f64) {
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

    pub fn sent(&self) -> u64 {
        self.sent.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }

    pub fn active(&self) -> bool {
        !self.stopped.load(Ordering::Relaxed) && (self.count == 0 || self.sent() < self.count)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "spec": {
                "flows": self.tuples.len(),
                "src": self.spec.src,
                "sport": self.spec.sport,
                "dst": self.spec.dst,
                "dport": self.spec.dport,
                "count": self.count,
                "rate": self.rate,
                "size": self.size,
                "stamp": self.stamp,
            },
            "sent": self.sent(),
            "active": self.active(),
        })
    }
}

/// The generator's flow sets, changed by the control socket; workers copy
/// their share when `version` moves.
#[derive(Default)]
pub struct GenControl {
    pub sets: Mutex<(u32, Vec<Arc<FlowSet>>)>,
    pub version: AtomicU64,
    /// The guest's MAC as learned from its frames (0: unknown, broadcast).
    pub guest_mac: AtomicU64,
}

impl GenControl {
    pub fn snapshot(&self) -> Vec<Arc<FlowSet>> {
        self.sets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            .clone()
    }

    pub fn bump(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }
}

/// Writes a UDP frame for `t` into `buf` (at least `size` bytes; the
/// payload is zero), returning the header length. `buf` past the headers
/// is zeroed up to `size`.
pub fn build_udp(
    buf: &mut [u8],
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    t: &Tuple,
    size: usize,
) -> usize {
    buf[..size].fill(0);
    buf[0..6].copy_from_slice(&dst_mac);
    buf[6..12].copy_from_slice(&src_mac);
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
            let udp = &mut buf[34..42];
            udp[0..2].copy_from_slice(&t.sport.to_be_bytes());
            udp[2..4].copy_from_slice(&t.dport.to_be_bytes());
            udp[4..6].copy_from_slice(&(tot - 20).to_be_bytes());
            // UDP checksum 0: none (allowed over IPv4).
            42
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            buf[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
            let plen = (size - 54) as u16;
            let ip = &mut buf[14..54];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&plen.to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            let udp_start = 54;
            buf[udp_start..udp_start + 2].copy_from_slice(&t.sport.to_be_bytes());
            buf[udp_start + 2..udp_start + 4].copy_from_slice(&t.dport.to_be_bytes());
            buf[udp_start + 4..udp_start + 6].copy_from_slice(&plen.to_be_bytes());
            // Pseudo-header sum + UDP header (payload is zero).
            let mut pseudo = [0u8; 40];
            pseudo[0..16].copy_from_slice(&s.octets());
            pseudo[16..32].copy_from_slice(&d.octets());
            pseudo[32..36].copy_from_slice(&u32::from(plen).to_be_bytes());
            pseudo[39] = 17;
            let mut c = checksum(&[&pseudo, &buf[udp_start..udp_start + 8]], 0);
            if c == 0 {
                c = 0xffff;
            }
            buf[udp_start + 6..udp_start + 8].copy_from_slice(&c.to_be_bytes());
            62
        }
        _ => 0,
    }
}

/// Internet checksum over the concatenation of `parts` (each even-length
/// except possibly the last), plus `init`.
pub fn checksum(parts: &[&[u8]], init: u32) -> u16 {
    let mut sum = u64::from(init);
    for p in parts {
        let mut ch = p.chunks_exact(2);
        for w in &mut ch {
            sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [b] = ch.remainder() {
            sum += u64::from(*b) << 8;
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A worker's share of one flow set.
pub struct LocalSet {
    pub set: Arc<FlowSet>,
    /// Prebuilt headers, one per tuple (`hdr_len` bytes each).
    pub headers: Vec<[u8; 62]>,
    pub hdr_len: usize,
    pub remaining: Option<u64>,
    pub rate: f64,
    pub credit: f64,
    pub next: usize,
}

/// Builds the share of worker `w` (see [`FlowSet::owner`]).
pub fn local_sets(
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
        let tuples: Vec<Tuple> = s
            .tuples
            .iter()
            .enumerate()
            .filter(|(i, _)| s.owns(*i, w))
            .map(|(_, t)| *t)
            .collect();
        if tuples.is_empty() {
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
        let mut buf = [0u8; MAX_FRAME];
        let mut hdr_len = 0;
        let headers = tuples
            .iter()
            .map(|t| {
                hdr_len = build_udp(&mut buf, dst_mac, src_mac, t, s.size);
                let mut h = [0u8; 62];
                h[..hdr_len].copy_from_slice(&buf[..hdr_len]);
                h
            })
            .collect();
        out.push(LocalSet {
            set: s.clone(),
            headers,
            hdr_len,
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
        build_udp(&mut buf, [2; 6], [4; 6], &s.tuples[1], 64);
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
        build_udp(&mut buf, [2; 6], [4; 6], &s.tuples[0], 100);
        assert!(arfs::parse_frame(&buf[..100]).unwrap().flow().is_some());
        let mut pseudo = [0u8; 40];
        pseudo[0..16].copy_from_slice(&buf[22..38]);
        pseudo[16..32].copy_from_slice(&buf[38..54]);
        pseudo[35] = 46;
        pseudo[39] = 17;
        assert_eq!(checksum(&[&pseudo, &buf[54..100]], 0), 0);
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
