//! `struct ethtool_rxnfc` for the ntuple rule commands (`ethtool -N`):
//! ETHTOOL_SRXCLSRLINS, SRXCLSRLDEL, GRXCLSRLCNT, GRXCLSRULE,
//! GRXCLSRLALL, as bytes (the agent issues them with SIOCETHTOOL).
//!
//! The layout is the kernel's (`include/uapi/linux/ethtool.h`) on x86_64,
//! checked with `offsetof` against 6.12's header (the struct has not
//! changed since `rule_locs` became a flexible array):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | `cmd` |
//! | 4 | 4 | `flow_type` (GRXFH only) |
//! | 8 | 8 | `data` (GRXCLSRLCNT: the table size; GRXCLSRLALL: too) |
//! | 16 | 168 | `fs`: `struct ethtool_rx_flow_spec` |
//! | 16 | 4 | `fs.flow_type` |
//! | 20 | 52 | `fs.h_u` (`union ethtool_flow_union`) |
//! | 72 | 20 | `fs.h_ext` |
//! | 92 | 52 | `fs.m_u` |
//! | 144 | 20 | `fs.m_ext` |
//! | 168 | 8 | `fs.ring_cookie` (aligned: 4 bytes of padding before it in `fs`) |
//! | 176 | 4 | `fs.location` |
//! | 184 | 4 | `rule_cnt` / `rss_context` (after `fs`'s tail padding) |
//! | 188 | 4 x n | `rule_locs[]` (GRXCLSRLALL) |
//!
//! 192 bytes in all (the struct's size: 188 rounded up to its 8-byte
//! alignment). Integers are the CPU's byte order; addresses and ports in
//! the flow union are big-endian (`__be32`, `__be16`).
//!
//! In the flow union: `tcp_ip4_spec`/`udp_ip4_spec` ip4src 0, ip4dst 4,
//! psrc 8, pdst 10, tos 12; `usr_ip4_spec` ip4src 0, ip4dst 4, l4_4_bytes
//! 8, tos 12, ip_ver 13, proto 14; `tcp_ip6_spec`/`udp_ip6_spec` ip6src 0,
//! ip6dst 16, psrc 32, pdst 34, tclass 36; `usr_ip6_spec` ip6src 0, ip6dst
//! 16, l4_4_bytes 32, tclass 36, l4_proto 37.

use crate::proto::{AddrMask, PortMask, RuleAction, RuleFlow, RuleSpec};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const ETHTOOL_GRXCLSRLCNT: u32 = 0x2e;
pub const ETHTOOL_GRXCLSRULE: u32 = 0x2f;
pub const ETHTOOL_GRXCLSRLALL: u32 = 0x30;
pub const ETHTOOL_SRXCLSRLDEL: u32 = 0x31;
pub const ETHTOOL_SRXCLSRLINS: u32 = 0x32;

pub const TCP_V4_FLOW: u32 = 0x01;
pub const UDP_V4_FLOW: u32 = 0x02;
pub const TCP_V6_FLOW: u32 = 0x05;
pub const UDP_V6_FLOW: u32 = 0x06;
pub const IPV4_USER_FLOW: u32 = 0x0d;
pub const IPV6_USER_FLOW: u32 = 0x0e;
/// `usr_ip4_spec.ip_ver` of an IPv4 rule.
pub const ETH_RX_NFC_IP4: u8 = 1;

/// `fs.location`: let the driver pick a free location.
pub const RX_CLS_LOC_ANY: u32 = 0xffff_ffff;
/// `fs.ring_cookie`: drop.
pub const RX_CLS_FLOW_DISC: u64 = u64::MAX;

/// sizeof(struct ethtool_rxnfc).
pub const RXNFC_LEN: usize = 192;
pub const OFF_CMD: usize = 0;
pub const OFF_DATA: usize = 8;
pub const OFF_FS: usize = 16;
pub const OFF_FLOW_TYPE: usize = OFF_FS;
pub const OFF_H_U: usize = OFF_FS + 4;
pub const OFF_H_EXT: usize = OFF_FS + 56;
pub const OFF_M_U: usize = OFF_FS + 76;
pub const OFF_M_EXT: usize = OFF_FS + 128;
pub const OFF_RING_COOKIE: usize = OFF_FS + 152;
pub const OFF_LOCATION: usize = OFF_FS + 160;
pub const OFF_RULE_CNT: usize = 184;
pub const OFF_RULE_LOCS: usize = 188;
/// sizeof(union ethtool_flow_union).
pub const FLOW_UNION_LEN: usize = 52;

/// A rule the agent cannot encode, or a kernel answer it cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NtupleError {
    #[error("{what} is {got}, the flow type {flow:?} needs an {want} address")]
    Family {
        what: &'static str,
        got: IpAddr,
        flow: RuleFlow,
        want: &'static str,
    },
    #[error("flow type {0:?} has no ports")]
    PortsOnIp(RuleFlow),
    #[error("flow type {0:?} has no upper-layer protocol field (it is the flow type)")]
    L4OnTcpUdp(RuleFlow),
    #[error("the kernel's rule has flow_type {0:#x}, which the agent does not read")]
    UnknownFlowType(u32),
    #[error("the kernel's rule uses {0}, which the agent does not read")]
    Unread(&'static str),
    #[error("buffer of {0} bytes, struct ethtool_rxnfc has {RXNFC_LEN}")]
    Short(usize),
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(a)
}

/// A bare request: `cmd`, and `fs.location` (GRXCLSRULE, SRXCLSRLDEL).
pub fn request(cmd: u32, location: u32) -> [u8; RXNFC_LEN] {
    let mut b = [0u8; RXNFC_LEN];
    put_u32(&mut b, OFF_CMD, cmd);
    put_u32(&mut b, OFF_LOCATION, location);
    b
}

/// GRXCLSRLALL for up to `n` rules: the struct and room for `rule_locs`.
pub fn list_request(n: u32) -> Vec<u8> {
    let mut b = vec![0u8; RXNFC_LEN + 4 * n as usize];
    put_u32(&mut b, OFF_CMD, ETHTOOL_GRXCLSRLALL);
    put_u32(&mut b, OFF_RULE_CNT, n);
    b
}

/// `rule_cnt`, `data` and the locations of a GRXCLSRLALL answer.
pub fn list_answer(b: &[u8]) -> (u64, Vec<u32>) {
    let n = get_u32(b, OFF_RULE_CNT) as usize;
    let room = b.len().saturating_sub(OFF_RULE_LOCS) / 4;
    let locs = (0..n.min(room))
        .map(|i| get_u32(b, OFF_RULE_LOCS + 4 * i))
        .collect();
    (get_u64(b, OFF_DATA), locs)
}

/// `rule_cnt` and `data` (the table size, with RX_CLS_LOC_SPECIAL when the
/// driver picks locations) of a GRXCLSRLCNT answer.
pub fn count_answer(b: &[u8]) -> (u32, u64) {
    (get_u32(b, OFF_RULE_CNT), get_u64(b, OFF_DATA))
}

/// The location the kernel copied back into an SRXCLSRLINS request.
pub fn location(b: &[u8]) -> u32 {
    get_u32(b, OFF_LOCATION)
}

fn v4(
    a: Option<&AddrMask>,
    what: &'static str,
    flow: RuleFlow,
) -> Result<[[u8; 4]; 2], NtupleError> {
    let Some(a) = a else {
        return Ok([[0; 4]; 2]);
    };
    let bad = |got| NtupleError::Family {
        what,
        got,
        flow,
        want: "IPv4",
    };
    match (a.addr, a.mask) {
        (IpAddr::V4(x), IpAddr::V4(m)) => Ok([x.octets(), m.octets()]),
        (IpAddr::V4(_), m) => Err(bad(m)),
        (x, _) => Err(bad(x)),
    }
}

fn v6(
    a: Option<&AddrMask>,
    what: &'static str,
    flow: RuleFlow,
) -> Result<[[u8; 16]; 2], NtupleError> {
    let Some(a) = a else {
        return Ok([[0; 16]; 2]);
    };
    let bad = |got| NtupleError::Family {
        what,
        got,
        flow,
        want: "IPv6",
    };
    match (a.addr, a.mask) {
        (IpAddr::V6(x), IpAddr::V6(m)) => Ok([x.octets(), m.octets()]),
        (IpAddr::V6(_), m) => Err(bad(m)),
        (x, _) => Err(bad(x)),
    }
}

fn port(p: Option<&PortMask>) -> [[u8; 2]; 2] {
    p.map_or([[0; 2]; 2], |p| {
        [p.port.to_be_bytes(), p.mask.to_be_bytes()]
    })
}

/// The SRXCLSRLINS request for `rule` at `location` (or
/// [`RX_CLS_LOC_ANY`]).
#[allow(clippy::many_single_char_names)] // b buffer, h/m value/mask bases, s/d addresses: as the uapi's layout
pub fn insert_request(rule: &RuleSpec, location: u32) -> Result<[u8; RXNFC_LEN], NtupleError> {
    let mut b = request(ETHTOOL_SRXCLSRLINS, location);
    let flow = rule.flow;
    let (code, h, m) = (flow_code(flow), OFF_H_U, OFF_M_U);
    put_u32(&mut b, OFF_FLOW_TYPE, code);
    let ports = [port(rule.sport.as_ref()), port(rule.dport.as_ref())];
    let l4 = rule.l4_proto.map_or((0, 0), |p| (p.proto, p.mask));
    match flow {
        RuleFlow::Tcp4 | RuleFlow::Udp4 | RuleFlow::Ip4 => {
            let [s, sm] = v4(rule.src.as_ref(), "src", flow)?;
            let [d, dm] = v4(rule.dst.as_ref(), "dst", flow)?;
            for (base, src, dst) in [(h, s, d), (m, sm, dm)] {
                b[base..base + 4].copy_from_slice(&src);
                b[base + 4..base + 8].copy_from_slice(&dst);
            }
            if flow == RuleFlow::Ip4 {
                if rule.sport.is_some() || rule.dport.is_some() {
                    return Err(NtupleError::PortsOnIp(flow));
                }
                b[h + 13] = ETH_RX_NFC_IP4;
                b[h + 14] = l4.0;
                b[m + 14] = l4.1;
            } else {
                if rule.l4_proto.is_some() {
                    return Err(NtupleError::L4OnTcpUdp(flow));
                }
                b[h + 8..h + 10].copy_from_slice(&ports[0][0]);
                b[m + 8..m + 10].copy_from_slice(&ports[0][1]);
                b[h + 10..h + 12].copy_from_slice(&ports[1][0]);
                b[m + 10..m + 12].copy_from_slice(&ports[1][1]);
            }
        }
        RuleFlow::Tcp6 | RuleFlow::Udp6 | RuleFlow::Ip6 => {
            let [s, sm] = v6(rule.src.as_ref(), "src", flow)?;
            let [d, dm] = v6(rule.dst.as_ref(), "dst", flow)?;
            for (base, src, dst) in [(h, s, d), (m, sm, dm)] {
                b[base..base + 16].copy_from_slice(&src);
                b[base + 16..base + 32].copy_from_slice(&dst);
            }
            if flow == RuleFlow::Ip6 {
                if rule.sport.is_some() || rule.dport.is_some() {
                    return Err(NtupleError::PortsOnIp(flow));
                }
                b[h + 37] = l4.0;
                b[m + 37] = l4.1;
            } else {
                if rule.l4_proto.is_some() {
                    return Err(NtupleError::L4OnTcpUdp(flow));
                }
                b[h + 32..h + 34].copy_from_slice(&ports[0][0]);
                b[m + 32..m + 34].copy_from_slice(&ports[0][1]);
                b[h + 34..h + 36].copy_from_slice(&ports[1][0]);
                b[m + 34..m + 36].copy_from_slice(&ports[1][1]);
            }
        }
    }
    put_u64(
        &mut b,
        OFF_RING_COOKIE,
        match rule.action {
            RuleAction::Queue(q) => u64::from(q),
            RuleAction::Drop => RX_CLS_FLOW_DISC,
        },
    );
    Ok(b)
}

/// The kernel's `flow_type` of a flow type.
pub const fn flow_code(f: RuleFlow) -> u32 {
    match f {
        RuleFlow::Tcp4 => TCP_V4_FLOW,
        RuleFlow::Udp4 => UDP_V4_FLOW,
        RuleFlow::Ip4 => IPV4_USER_FLOW,
        RuleFlow::Tcp6 => TCP_V6_FLOW,
        RuleFlow::Udp6 => UDP_V6_FLOW,
        RuleFlow::Ip6 => IPV6_USER_FLOW,
    }
}

/// An address field that is set: value or mask non-zero.
fn addr(x: IpAddr, m: IpAddr) -> Option<AddrMask> {
    let zero = |a: IpAddr| a.is_unspecified();
    (!zero(x) || !zero(m)).then_some(AddrMask { addr: x, mask: m })
}

fn port_at(b: &[u8], value: usize, mask: usize) -> Option<PortMask> {
    let port = u16::from_be_bytes([b[value], b[value + 1]]);
    let mask = u16::from_be_bytes([b[mask], b[mask + 1]]);
    (port != 0 || mask != 0).then_some(PortMask { port, mask })
}

fn ip4(b: &[u8], off: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(b[off], b[off + 1], b[off + 2], b[off + 3]))
}

fn ip6(b: &[u8], off: usize) -> IpAddr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    IpAddr::V6(Ipv6Addr::from(a))
}

/// The rule and location of a GRXCLSRULE answer (or of an SRXCLSRLINS
/// request: the same struct). Unset fields (value and mask zero) are None,
/// as [`RuleSpec`] writes them; fields the agent never sets (tos, tclass,
/// l4_4_bytes, the extensions, an `ip_ver` other than IPv4's) are refused.
#[allow(clippy::many_single_char_names)] // as in insert_request
pub fn decode_rule(b: &[u8]) -> Result<(u32, RuleSpec), NtupleError> {
    if b.len() < RXNFC_LEN {
        return Err(NtupleError::Short(b.len()));
    }
    let code = get_u32(b, OFF_FLOW_TYPE);
    let flow = match code {
        TCP_V4_FLOW => RuleFlow::Tcp4,
        UDP_V4_FLOW => RuleFlow::Udp4,
        IPV4_USER_FLOW => RuleFlow::Ip4,
        TCP_V6_FLOW => RuleFlow::Tcp6,
        UDP_V6_FLOW => RuleFlow::Udp6,
        IPV6_USER_FLOW => RuleFlow::Ip6,
        c => return Err(NtupleError::UnknownFlowType(c)),
    };
    if b[OFF_H_EXT..OFF_M_U]
        .iter()
        .chain(&b[OFF_M_EXT..OFF_RING_COOKIE])
        .any(|&x| x != 0)
    {
        return Err(NtupleError::Unread("h_ext/m_ext"));
    }
    let (h, m) = (OFF_H_U, OFF_M_U);
    let mut r = RuleSpec {
        flow,
        src: None,
        dst: None,
        sport: None,
        dport: None,
        l4_proto: None,
        action: match get_u64(b, OFF_RING_COOKIE) {
            RX_CLS_FLOW_DISC => RuleAction::Drop,
            c => RuleAction::Queue(u32::try_from(c).map_err(|_| NtupleError::Unread("a VF ring"))?),
        },
    };
    let l4 =
        |p: u8, k: u8| (p != 0 || k != 0).then_some(crate::proto::ProtoMask { proto: p, mask: k });
    match flow {
        RuleFlow::Tcp4 | RuleFlow::Udp4 | RuleFlow::Ip4 => {
            r.src = addr(ip4(b, h), ip4(b, m));
            r.dst = addr(ip4(b, h + 4), ip4(b, m + 4));
            if flow == RuleFlow::Ip4 {
                if b[h + 8..h + 13]
                    .iter()
                    .chain(&b[m + 8..m + 14])
                    .any(|&x| x != 0)
                    || b[h + 13] != ETH_RX_NFC_IP4
                {
                    return Err(NtupleError::Unread("l4_4_bytes, tos or ip_ver"));
                }
                r.l4_proto = l4(b[h + 14], b[m + 14]);
            } else {
                if b[h + 12] != 0 || b[m + 12] != 0 {
                    return Err(NtupleError::Unread("tos"));
                }
                r.sport = port_at(b, h + 8, m + 8);
                r.dport = port_at(b, h + 10, m + 10);
            }
        }
        RuleFlow::Tcp6 | RuleFlow::Udp6 | RuleFlow::Ip6 => {
            r.src = addr(ip6(b, h), ip6(b, m));
            r.dst = addr(ip6(b, h + 16), ip6(b, m + 16));
            if flow == RuleFlow::Ip6 {
                if b[h + 32..h + 37]
                    .iter()
                    .chain(&b[m + 32..m + 37])
                    .any(|&x| x != 0)
                {
                    return Err(NtupleError::Unread("l4_4_bytes or tclass"));
                }
                r.l4_proto = l4(b[h + 37], b[m + 37]);
            } else {
                if b[h + 36] != 0 || b[m + 36] != 0 {
                    return Err(NtupleError::Unread("tclass"));
                }
                r.sport = port_at(b, h + 32, m + 32);
                r.dport = port_at(b, h + 34, m + 34);
            }
        }
    }
    Ok((location(b), r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ProtoMask;

    #[allow(clippy::unnecessary_wraps)] // RuleSpec's fields are Options
    fn am(a: &str, m: &str) -> Option<AddrMask> {
        Some(AddrMask {
            addr: a.parse().unwrap(),
            mask: m.parse().unwrap(),
        })
    }

    #[allow(clippy::unnecessary_wraps)]
    fn pm(port: u16, mask: u16) -> Option<PortMask> {
        Some(PortMask { port, mask })
    }

    fn udp4() -> RuleSpec {
        RuleSpec {
            flow: RuleFlow::Udp4,
            src: am("10.0.2.1", "255.255.255.255"),
            dst: am("10.0.2.15", "255.255.255.0"),
            sport: pm(10000, 0xffff),
            dport: pm(20001, 0xff00),
            l4_proto: None,
            action: RuleAction::Queue(3),
        }
    }

    #[test]
    fn layout_offsets() {
        // The uapi's offsetof() on x86_64 (6.12 and 7.3 headers).
        assert_eq!(RXNFC_LEN, 192);
        assert_eq!((OFF_FS, OFF_H_U, OFF_H_EXT, OFF_M_U), (16, 20, 72, 92));
        assert_eq!((OFF_M_EXT, OFF_RING_COOKIE, OFF_LOCATION), (144, 168, 176));
        assert_eq!((OFF_RULE_CNT, OFF_RULE_LOCS), (184, 188));
        // The union is 52 bytes and the extension 20: m_u follows h_ext.
        assert_eq!(OFF_H_U + FLOW_UNION_LEN + 20, OFF_M_U);
        assert_eq!(OFF_M_U + FLOW_UNION_LEN + 20 + 4, OFF_RING_COOKIE); // 4: u64 alignment
        assert_eq!(OFF_RING_COOKIE % 8, 0);
    }

    #[test]
    fn udp4_bytes_at_their_offsets() {
        let b = insert_request(&udp4(), RX_CLS_LOC_ANY).unwrap();
        assert_eq!(get_u32(&b, 0), ETHTOOL_SRXCLSRLINS);
        assert_eq!(get_u32(&b, 4), 0, "rxnfc.flow_type is GRXFH's");
        assert_eq!(get_u32(&b, 16), UDP_V4_FLOW);
        assert_eq!(&b[20..24], &[10, 0, 2, 1]);
        assert_eq!(&b[24..28], &[10, 0, 2, 15]);
        assert_eq!(&b[28..30], &10000u16.to_be_bytes());
        assert_eq!(&b[30..32], &20001u16.to_be_bytes());
        assert_eq!(&b[92..96], &[255; 4]);
        assert_eq!(&b[96..100], &[255, 255, 255, 0]);
        assert_eq!(&b[100..102], &[0xff, 0xff]);
        assert_eq!(&b[102..104], &[0xff, 0x00]);
        assert_eq!(get_u64(&b, 168), 3);
        assert_eq!(get_u32(&b, 176), RX_CLS_LOC_ANY);
        // Nothing else is set.
        let set: Vec<usize> = (0..RXNFC_LEN).filter(|&i| b[i] != 0).collect();
        let expected: Vec<usize> = [0..1, 16..17, 20..32, 92..104, 168..169, 176..180]
            .into_iter()
            .flatten()
            .filter(|&i| b[i] != 0)
            .collect();
        assert_eq!(set, expected);
        assert_eq!(decode_rule(&b).unwrap(), (RX_CLS_LOC_ANY, udp4()));
    }

    #[test]
    fn every_flow_type_round_trips() {
        let v6 = |f, action| RuleSpec {
            flow: f,
            src: am("2001:db8::7", "ffff:ffff::"),
            dst: am("fd00:2::15", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
            sport: pm(1, 0xffff),
            dport: None,
            l4_proto: None,
            action,
        };
        let ip = |f, src: Option<AddrMask>| RuleSpec {
            flow: f,
            src,
            dst: None,
            sport: None,
            dport: None,
            l4_proto: Some(ProtoMask {
                proto: 17,
                mask: 0xff,
            }),
            action: RuleAction::Drop,
        };
        let cases = [
            udp4(),
            RuleSpec {
                flow: RuleFlow::Tcp4,
                ..udp4()
            },
            v6(RuleFlow::Tcp6, RuleAction::Queue(0)),
            v6(RuleFlow::Udp6, RuleAction::Drop),
            ip(RuleFlow::Ip4, am("198.51.100.0", "255.255.255.0")),
            ip(RuleFlow::Ip6, am("2001:db8::", "ffff:ffff::")),
        ];
        for (loc, r) in cases.iter().enumerate() {
            let b = insert_request(r, loc as u32).unwrap();
            assert_eq!(decode_rule(&b).unwrap(), (loc as u32, r.clone()), "{r:?}");
        }
        // tcp6: ports after the two 16-byte addresses.
        let b = insert_request(&cases[2], 0).unwrap();
        assert_eq!(get_u32(&b, 16), TCP_V6_FLOW);
        assert_eq!(&b[20..22], &[0x20, 0x01]);
        assert_eq!(&b[52..54], &1u16.to_be_bytes());
        assert_eq!(&b[92 + 32..92 + 34], &[0xff, 0xff]);
        assert_eq!(get_u64(&b, 168), 0);
        // ip4: ip_ver 1 in the value, protocol at 14; drop is all ones.
        let b = insert_request(&cases[4], 0).unwrap();
        assert_eq!(
            (get_u32(&b, 16), b[20 + 13], b[20 + 14], b[92 + 14]),
            (IPV4_USER_FLOW, 1, 17, 0xff)
        );
        assert_eq!(b[92 + 13], 0, "no mask on ip_ver");
        assert_eq!(get_u64(&b, 168), u64::MAX);
        // ip6: l4_proto at 37.
        let b = insert_request(&cases[5], 0).unwrap();
        assert_eq!(
            (get_u32(&b, 16), b[20 + 37], b[92 + 37]),
            (IPV6_USER_FLOW, 17, 0xff)
        );
    }

    #[test]
    fn refusals() {
        let mut r = udp4();
        r.src = am("fd00::1", "::");
        assert!(matches!(
            insert_request(&r, 0),
            Err(NtupleError::Family { what: "src", .. })
        ));
        let mut r = udp4();
        r.flow = RuleFlow::Ip4;
        assert_eq!(
            insert_request(&r, 0),
            Err(NtupleError::PortsOnIp(RuleFlow::Ip4))
        );
        let mut r = udp4();
        r.l4_proto = Some(ProtoMask { proto: 6, mask: 1 });
        assert_eq!(
            insert_request(&r, 0),
            Err(NtupleError::L4OnTcpUdp(RuleFlow::Udp4))
        );
        let mut b = insert_request(&udp4(), 0).unwrap();
        b[OFF_H_EXT + 2] = 1;
        assert!(decode_rule(&b).is_err());
        let mut b = insert_request(&udp4(), 0).unwrap();
        put_u32(&mut b, OFF_FLOW_TYPE, 0x10);
        assert_eq!(decode_rule(&b), Err(NtupleError::UnknownFlowType(0x10)));
    }

    #[test]
    fn list_and_count() {
        let mut b = list_request(3);
        assert_eq!(b.len(), 192 + 12);
        assert_eq!((get_u32(&b, 0), get_u32(&b, 184)), (ETHTOOL_GRXCLSRLALL, 3));
        // The kernel's answer: rule_cnt 2, locations at 188.
        put_u32(&mut b, OFF_RULE_CNT, 2);
        put_u64(&mut b, OFF_DATA, 128);
        put_u32(&mut b, 188, 5);
        put_u32(&mut b, 192, 9);
        assert_eq!(list_answer(&b), (128, vec![5, 9]));
        let mut c = request(ETHTOOL_GRXCLSRLCNT, 0);
        put_u32(&mut c, OFF_RULE_CNT, 4);
        put_u64(&mut c, OFF_DATA, 128 | 0x8000_0000);
        assert_eq!(count_answer(&c), (4, 0x8000_0080));
        let d = request(ETHTOOL_SRXCLSRLDEL, 7);
        assert_eq!((get_u32(&d, 0), location(&d)), (0x31, 7));
    }
}
