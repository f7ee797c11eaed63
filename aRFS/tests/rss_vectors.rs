//! The published Microsoft RSS verification suite (default key): IPv4 and
//! IPv6, with ports (4-tuple) and without (2-tuple). Input order is src
//! addr, dst addr, src port, dst port.

use std::net::{Ipv4Addr, Ipv6Addr};

use arfs::{parse_frame, FlowKey, L4Proto, Rss, Toeplitz};

struct V4 {
    dst: &'static str,
    dport: u16,
    src: &'static str,
    sport: u16,
    with_ports: u32,
    without: u32,
}

const V4_VECTORS: [V4; 5] = [
    V4 {
        dst: "161.142.100.80",
        dport: 1766,
        src: "66.9.149.187",
        sport: 2794,
        with_ports: 0x51cc_c178,
        without: 0x323e_8fc2,
    },
    V4 {
        dst: "65.69.140.83",
        dport: 4739,
        src: "199.92.111.2",
        sport: 14230,
        with_ports: 0xc626_b0ea,
        without: 0xd718_262a,
    },
    V4 {
        dst: "12.22.207.184",
        dport: 38024,
        src: "24.19.198.95",
        sport: 12898,
        with_ports: 0x5c2b_394a,
        without: 0xd2d0_a5de,
    },
    V4 {
        dst: "209.142.163.6",
        dport: 2217,
        src: "38.27.205.30",
        sport: 48228,
        with_ports: 0xafc7_327f,
        without: 0x8298_9176,
    },
    V4 {
        dst: "202.188.127.2",
        dport: 1303,
        src: "153.39.163.191",
        sport: 44251,
        with_ports: 0x10e8_28a2,
        without: 0x5d18_09c5,
    },
];

struct V6 {
    dst: &'static str,
    dport: u16,
    src: &'static str,
    sport: u16,
    with_ports: u32,
    without: u32,
}

const V6_VECTORS: [V6; 3] = [
    V6 {
        dst: "3ffe:2501:200:3::1",
        dport: 1766,
        src: "3ffe:2501:200:1fff::7",
        sport: 2794,
        with_ports: 0x4020_7d3d,
        without: 0x2cc1_8cd5,
    },
    V6 {
        dst: "ff02::1",
        dport: 4739,
        src: "3ffe:501:8::260:97ff:fe40:efab",
        sport: 14230,
        with_ports: 0xdde5_1bbf,
        without: 0x0f0c_461c,
    },
    V6 {
        dst: "fe80::200:f8ff:fe21:67cf",
        dport: 38024,
        src: "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
        sport: 44251,
        with_ports: 0x02d1_feef,
        without: 0x4b61_e985,
    },
];

#[test]
fn ipv4_vectors() {
    let t = Toeplitz::default();
    for v in &V4_VECTORS {
        let s: Ipv4Addr = v.src.parse().unwrap();
        let d: Ipv4Addr = v.dst.parse().unwrap();
        assert_eq!(
            t.hash_v4_ports(s.octets(), d.octets(), v.sport, v.dport),
            v.with_ports,
            "{} 4-tuple",
            v.src
        );
        assert_eq!(
            t.hash_v4(s.octets(), d.octets()),
            v.without,
            "{} 2-tuple",
            v.src
        );
        let k = FlowKey::v4(L4Proto::Tcp, s, v.sport, d, v.dport);
        assert_eq!(t.hash_flow(&k), v.with_ports);
        assert_eq!(t.hash_pair(&k.ip_pair()), v.without);
        // generic and bit-by-bit paths agree
        let mut input = Vec::new();
        input.extend_from_slice(&s.octets());
        input.extend_from_slice(&d.octets());
        input.extend_from_slice(&v.sport.to_be_bytes());
        input.extend_from_slice(&v.dport.to_be_bytes());
        assert_eq!(t.hash(&input), v.with_ports);
        assert_eq!(t.hash_slow(&input), v.with_ports);
        assert_eq!(
            Rss::new(4).queue_for_key(&k),
            (v.with_ports & 127) as u16 % 4
        );
    }
}

#[test]
fn ipv6_vectors() {
    let t = Toeplitz::default();
    for v in &V6_VECTORS {
        let s: Ipv6Addr = v.src.parse().unwrap();
        let d: Ipv6Addr = v.dst.parse().unwrap();
        assert_eq!(
            t.hash_v6_ports(&s.octets(), &d.octets(), v.sport, v.dport),
            v.with_ports,
            "{} 4-tuple",
            v.src
        );
        assert_eq!(
            t.hash_v6(&s.octets(), &d.octets()),
            v.without,
            "{} 2-tuple",
            v.src
        );
        let k = FlowKey::v6(L4Proto::Udp, s, v.sport, d, v.dport);
        assert_eq!(t.hash_flow(&k), v.with_ports);
        assert_eq!(t.hash_pair(&k.ip_pair()), v.without);
    }
}

#[test]
fn parsed_frames_hash_like_the_vectors() {
    // A TCP/IPv4 frame of the first vector: parse, then hash the frame.
    let v = &V4_VECTORS[0];
    let src: Ipv4Addr = v.src.parse().unwrap();
    let dst: Ipv4Addr = v.dst.parse().unwrap();
    let mut f = vec![0u8; 14 + 20 + 20];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&40u16.to_be_bytes());
    f[14 + 9] = 6;
    f[26..30].copy_from_slice(&src.octets());
    f[30..34].copy_from_slice(&dst.octets());
    f[34..36].copy_from_slice(&v.sport.to_be_bytes());
    f[36..38].copy_from_slice(&v.dport.to_be_bytes());
    f[34 + 12] = 0x50;
    let parsed = parse_frame(&f).unwrap();
    let t = Toeplitz::default();
    assert_eq!(t.hash_frame(&parsed), Some(v.with_ports));
    // Mark it a fragment: 2-tuple.
    f[14 + 6] = 0x20; // MF
    let parsed = parse_frame(&f).unwrap();
    assert_eq!(t.hash_frame(&parsed), Some(v.without));
}
