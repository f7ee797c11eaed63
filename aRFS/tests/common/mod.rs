//! Frame builders shared by the integration tests.
#![allow(dead_code)] // each test binary uses a subset

pub const MAC_A: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
pub const MAC_B: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];

/// Ethernet header, optionally with one 802.1Q tag, then `payload`.
pub fn eth(ethertype: u16, vlan: Option<u16>, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&MAC_A);
    f.extend_from_slice(&MAC_B);
    if let Some(tci) = vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&tci.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An IPv4 header (no options unless `options` given) + payload.
pub fn ipv4(
    proto: u8,
    src: [u8; 4],
    dst: [u8; 4],
    frag: u16,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    assert!(options.len() % 4 == 0);
    let hlen = 20 + options.len();
    let total = hlen + payload.len();
    let mut p = vec![0u8; 20];
    p[0] = 0x40 | (hlen / 4) as u8;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6..8].copy_from_slice(&frag.to_be_bytes());
    p[8] = 64;
    p[9] = proto;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p.extend_from_slice(options);
    p.extend_from_slice(payload);
    p
}

/// An IPv6 fixed header with next header `nh` + payload (extension headers included).
pub fn ipv6(nh: u8, src: [u8; 16], dst: [u8; 16], payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    p[6] = nh;
    p[7] = 64;
    p[8..24].copy_from_slice(&src);
    p[24..40].copy_from_slice(&dst);
    p.extend_from_slice(payload);
    p
}

/// A generic IPv6 extension header (hop-by-hop, routing, dest-opts) of
/// `(len8 + 1) * 8` bytes.
pub fn ext(nh: u8, len8: u8) -> Vec<u8> {
    let mut e = vec![0u8; (usize::from(len8) + 1) * 8];
    e[0] = nh;
    e[1] = len8;
    e
}

/// An IPv6 fragment header.
pub fn frag6(nh: u8, offset8: u16, more: bool) -> Vec<u8> {
    let mut e = vec![0u8; 8];
    e[0] = nh;
    let v = (offset8 << 3) | u16::from(more);
    e[2..4].copy_from_slice(&v.to_be_bytes());
    e[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    e
}

/// A TCP header (data offset 5) + payload.
pub fn tcp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[12] = 0x50;
    t[13] = 0x10;
    t.extend_from_slice(payload);
    t
}

/// A UDP header + payload.
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; 8];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(payload);
    u
}

pub const V6_A: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub const V6_B: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
