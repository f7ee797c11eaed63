//! Frame parser: every classification and every error, plus "never panics"
//! properties over arbitrary and mutated frames.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use arfs::{ipv4_flow, parse_frame, FlowKey, IpFamily, L4Proto, Layer, ParseError, L3};
use common::*;
use proptest::prelude::*;

const A4: [u8; 4] = [10, 0, 0, 2];
const B4: [u8; 4] = [10, 0, 0, 1];

fn v4_key(proto: L4Proto, sport: u16, dport: u16) -> FlowKey {
    FlowKey::v4(proto, Ipv4Addr::from(A4), sport, Ipv4Addr::from(B4), dport)
}

fn v6_key(proto: L4Proto, sport: u16, dport: u16) -> FlowKey {
    FlowKey::v6(
        proto,
        Ipv6Addr::from(V6_A),
        sport,
        Ipv6Addr::from(V6_B),
        dport,
    )
}

#[test]
fn ipv4_tcp_and_udp() {
    let f = eth(
        0x0800,
        None,
        &ipv4(6, A4, B4, 0x4000, &[], &tcp(5000, 80, b"hello")),
    );
    let p = parse_frame(&f).unwrap();
    assert_eq!(p.l3, L3::Flow(v4_key(L4Proto::Tcp, 5000, 80)));
    assert_eq!(p.ethertype, 0x0800);
    assert_eq!(p.vlan_tci, None);
    assert_eq!(p.l3_offset, 14);
    assert_eq!(p.src_mac, MAC_B);
    assert_eq!(p.dst_mac, MAC_A);
    let f = eth(
        0x0800,
        None,
        &ipv4(17, A4, B4, 0, &[], &udp(5000, 6000, &[0; 100])),
    );
    let p = parse_frame(&f).unwrap();
    assert_eq!(
        p.flow().unwrap().to_string(),
        "udp 10.0.0.2:5000 -> 10.0.0.1:6000"
    );
}

#[test]
fn ipv4_options_and_ethernet_padding() {
    // IHL 7 (8 bytes of options); frame padded past the IP total length.
    let mut f = eth(0x0800, None, &ipv4(17, A4, B4, 0, &[1; 8], &udp(1, 2, &[])));
    f.resize(60, 0xEE);
    assert_eq!(
        parse_frame(&f).unwrap().l3,
        L3::Flow(v4_key(L4Proto::Udp, 1, 2))
    );
}

#[test]
fn vlan_tag() {
    let f = eth(
        0x0800,
        Some(0x2064),
        &ipv4(6, A4, B4, 0, &[], &tcp(1, 2, &[])),
    );
    let p = parse_frame(&f).unwrap();
    assert_eq!(p.vlan_tci, Some(0x2064));
    assert_eq!(p.ethertype, 0x0800);
    assert_eq!(p.l3_offset, 18);
    assert_eq!(p.l3, L3::Flow(v4_key(L4Proto::Tcp, 1, 2)));
    // A second tag is not parsed: the inner EtherType is reported as is.
    let f = eth(0x8100, Some(5), &[0, 7, 0x08, 0x00]);
    let p = parse_frame(&f).unwrap();
    assert_eq!((p.ethertype, p.l3), (0x8100, L3::NonIp));
}

#[test]
fn ipv4_fragments_are_two_tuples() {
    for frag in [
        0x2000u16, /* MF, offset 0 */
        0x0010,    /* offset 16 */
        0x2010,
    ] {
        let f = eth(
            0x0800,
            None,
            &ipv4(17, A4, B4, frag, &[], &udp(1, 2, &[0; 8])),
        );
        match parse_frame(&f).unwrap().l3 {
            L3::Ip(p) => {
                assert!(p.is_fragment());
                assert_eq!(p.proto(), 17);
                assert_eq!(p.family(), IpFamily::Ipv4);
                assert_eq!(p.src_ip(), Ipv4Addr::from(A4));
                assert_eq!(p.dst_ip(), Ipv4Addr::from(B4));
            }
            other => panic!("frag {frag:#x}: {other:?}"),
        }
    }
    // DF alone is not a fragment.
    let f = eth(
        0x0800,
        None,
        &ipv4(17, A4, B4, 0x4000, &[], &udp(1, 2, &[])),
    );
    assert!(matches!(parse_frame(&f).unwrap().l3, L3::Flow(_)));
}

#[test]
fn other_ip_protocols_are_two_tuples() {
    let f = eth(
        0x0800,
        None,
        &ipv4(1, A4, B4, 0, &[], &[8, 0, 0, 0, 0, 0, 0, 0]),
    );
    match parse_frame(&f).unwrap().l3 {
        L3::Ip(p) => assert_eq!((p.proto(), p.is_fragment()), (1, false)),
        other => panic!("{other:?}"),
    }
    let f = eth(0x86DD, None, &ipv6(58, V6_A, V6_B, &[128, 0, 0, 0]));
    match parse_frame(&f).unwrap().l3 {
        L3::Ip(p) => assert_eq!((p.proto(), p.family()), (58, IpFamily::Ipv6)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn non_ip() {
    let f = eth(0x0806, None, &[0; 28]);
    let p = parse_frame(&f).unwrap();
    assert_eq!((p.ethertype, p.l3), (0x0806, L3::NonIp));
    let f = eth(0x88B5, None, &[0; 16]);
    assert_eq!(parse_frame(&f).unwrap().l3, L3::NonIp);
    // 802.3 length field
    let f = eth(0x0040, None, &[0; 64]);
    assert_eq!(parse_frame(&f).unwrap().l3, L3::NonIp);
}

#[test]
fn ipv6_tcp_udp_and_extension_headers() {
    let f = eth(0x86DD, None, &ipv6(6, V6_A, V6_B, &tcp(443, 5555, b"x")));
    assert_eq!(
        parse_frame(&f).unwrap().l3,
        L3::Flow(v6_key(L4Proto::Tcp, 443, 5555))
    );

    // hop-by-hop -> routing -> dest-opts -> UDP
    let mut pl = ext(43, 0);
    pl.extend(ext(60, 1));
    pl.extend(ext(17, 0));
    pl.extend(udp(53, 9999, b"q"));
    let f = eth(0x86DD, Some(3), &ipv6(0, V6_A, V6_B, &pl));
    assert_eq!(
        parse_frame(&f).unwrap().l3,
        L3::Flow(v6_key(L4Proto::Udp, 53, 9999))
    );

    // AH (length in 4-byte units minus 2): 12-byte AH -> payload len field 1
    let mut ah = vec![0u8; 12];
    ah[0] = 6;
    ah[1] = 1;
    ah.extend(tcp(1, 2, &[]));
    let f = eth(0x86DD, None, &ipv6(51, V6_A, V6_B, &ah));
    assert_eq!(
        parse_frame(&f).unwrap().l3,
        L3::Flow(v6_key(L4Proto::Tcp, 1, 2))
    );

    // atomic fragment (offset 0, M clear): the whole datagram, ports usable
    let mut pl = frag6(17, 0, false);
    pl.extend(udp(7, 8, &[]));
    let f = eth(0x86DD, None, &ipv6(44, V6_A, V6_B, &pl));
    assert_eq!(
        parse_frame(&f).unwrap().l3,
        L3::Flow(v6_key(L4Proto::Udp, 7, 8))
    );
}

#[test]
fn ipv6_fragments_are_two_tuples() {
    // first fragment (ports present) and a later fragment: both 2-tuple,
    // so all fragments of a datagram hash alike.
    for (off, more) in [(0u16, true), (185, false), (185, true)] {
        let mut pl = ext(44, 0); // hop-by-hop first
        pl.extend(frag6(17, off, more));
        pl.extend(udp(7, 8, &[0; 16]));
        let f = eth(0x86DD, None, &ipv6(0, V6_A, V6_B, &pl));
        match parse_frame(&f).unwrap().l3 {
            L3::Ip(p) => {
                assert!(p.is_fragment());
                assert_eq!(p.proto(), 17);
                assert_eq!(p.src_ip(), Ipv6Addr::from(V6_A));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn no_next_header_and_esp_are_two_tuples() {
    for nh in [59u8, 50] {
        let f = eth(0x86DD, None, &ipv6(nh, V6_A, V6_B, &[0; 8]));
        assert!(
            matches!(parse_frame(&f).unwrap().l3, L3::Ip(p) if p.proto() == nh && !p.is_fragment())
        );
    }
}

/// Every error the parser can return, each from a minimal frame.
#[test]
fn errors() {
    let ok4 = ipv4(6, A4, B4, 0, &[], &tcp(1, 2, &[]));
    let cases: Vec<(&str, Vec<u8>, ParseError)> = vec![
        ("empty", vec![], ParseError::Truncated(Layer::Ethernet)),
        (
            "13 bytes",
            vec![0; 13],
            ParseError::Truncated(Layer::Ethernet),
        ),
        (
            "vlan cut",
            {
                let mut f = eth(0x8100, None, &[0, 1]);
                f.truncate(16);
                f
            },
            ParseError::Truncated(Layer::Vlan),
        ),
        (
            "ipv4 19 bytes",
            eth(0x0800, None, &ok4[..19]),
            ParseError::Truncated(Layer::Ipv4),
        ),
        (
            "ipv4 version 6",
            {
                let mut p = ok4.clone();
                p[0] = 0x65;
                eth(0x0800, None, &p)
            },
            ParseError::BadIpVersion(6),
        ),
        (
            "ihl 4",
            {
                let mut p = ok4.clone();
                p[0] = 0x44;
                eth(0x0800, None, &p)
            },
            ParseError::BadIhl(4),
        ),
        (
            "ihl past frame",
            {
                let mut p = ok4.clone();
                p[0] = 0x4f;
                eth(0x0800, None, &p[..40])
            },
            ParseError::Truncated(Layer::Ipv4),
        ),
        (
            "total < ihl",
            {
                let mut p = ok4.clone();
                p[2..4].copy_from_slice(&19u16.to_be_bytes());
                eth(0x0800, None, &p)
            },
            ParseError::BadIpv4TotalLength(19),
        ),
        (
            "total > frame",
            {
                let mut p = ok4.clone();
                p[2..4].copy_from_slice(&41u16.to_be_bytes());
                eth(0x0800, None, &p)
            },
            ParseError::BadIpv4TotalLength(41),
        ),
        (
            "tcp cut",
            eth(0x0800, None, &ipv4(6, A4, B4, 0, &[], &[0; 19])),
            ParseError::Truncated(Layer::Tcp),
        ),
        (
            "tcp doff 4",
            {
                let mut t = tcp(1, 2, &[]);
                t[12] = 0x40;
                eth(0x0800, None, &ipv4(6, A4, B4, 0, &[], &t))
            },
            ParseError::BadTcpDataOffset(4),
        ),
        (
            "tcp doff past payload",
            {
                let mut t = tcp(1, 2, &[]);
                t[12] = 0x60;
                eth(0x0800, None, &ipv4(6, A4, B4, 0, &[], &t))
            },
            ParseError::BadTcpDataOffset(6),
        ),
        (
            "udp cut",
            eth(0x0800, None, &ipv4(17, A4, B4, 0, &[], &[0; 7])),
            ParseError::Truncated(Layer::Udp),
        ),
        (
            "udp len 7",
            {
                let mut u = udp(1, 2, &[]);
                u[4..6].copy_from_slice(&7u16.to_be_bytes());
                eth(0x0800, None, &ipv4(17, A4, B4, 0, &[], &u))
            },
            ParseError::BadUdpLength(7),
        ),
        (
            "udp len > ip",
            {
                let mut u = udp(1, 2, &[]);
                u[4..6].copy_from_slice(&9u16.to_be_bytes());
                eth(0x0800, None, &ipv4(17, A4, B4, 0, &[], &u))
            },
            ParseError::BadUdpLength(9),
        ),
        (
            "ipv6 39 bytes",
            eth(0x86DD, None, &ipv6(6, V6_A, V6_B, &[])[..39]),
            ParseError::Truncated(Layer::Ipv6),
        ),
        (
            "ipv6 version 4",
            {
                let mut p = ipv6(6, V6_A, V6_B, &tcp(1, 2, &[]));
                p[0] = 0x45;
                eth(0x86DD, None, &p)
            },
            ParseError::BadIpVersion(4),
        ),
        (
            "ipv6 plen 0",
            eth(0x86DD, None, &ipv6(59, V6_A, V6_B, &[])),
            ParseError::BadIpv6PayloadLength(0),
        ),
        (
            "ipv6 plen > frame",
            {
                let mut p = ipv6(6, V6_A, V6_B, &tcp(1, 2, &[]));
                p[4..6].copy_from_slice(&21u16.to_be_bytes());
                eth(0x86DD, None, &p)
            },
            ParseError::BadIpv6PayloadLength(21),
        ),
        (
            "ext cut",
            eth(0x86DD, None, &ipv6(0, V6_A, V6_B, &[6])),
            ParseError::Truncated(Layer::Ipv6Ext),
        ),
        (
            "ext past payload",
            eth(
                0x86DD,
                None,
                &ipv6(60, V6_A, V6_B, &{
                    let mut e = ext(6, 1);
                    e.truncate(10);
                    e
                }),
            ),
            ParseError::BadExtHeader(60),
        ),
        (
            "frag hdr cut",
            eth(0x86DD, None, &ipv6(44, V6_A, V6_B, &[17, 0, 0, 0])),
            ParseError::Truncated(Layer::Ipv6Ext),
        ),
        (
            "9 ext headers",
            {
                let mut pl = Vec::new();
                for _ in 0..9 {
                    pl.extend(ext(60, 0));
                }
                pl.extend(udp(1, 2, &[]));
                eth(0x86DD, None, &ipv6(60, V6_A, V6_B, &pl))
            },
            ParseError::TooManyExtHeaders,
        ),
        (
            "ipv6 tcp cut",
            eth(0x86DD, None, &ipv6(6, V6_A, V6_B, &[0; 10])),
            ParseError::Truncated(Layer::Tcp),
        ),
        (
            "ipv6 udp cut",
            eth(0x86DD, None, &ipv6(17, V6_A, V6_B, &[0; 4])),
            ParseError::Truncated(Layer::Udp),
        ),
    ];
    for (name, frame, want) in cases {
        assert_eq!(parse_frame(&frame), Err(want), "{name}");
        assert!(!want.to_string().is_empty());
    }
    // 8 extension headers are fine.
    let mut pl = Vec::new();
    for _ in 0..7 {
        pl.extend(ext(60, 0));
    }
    pl.extend(ext(17, 0));
    pl.extend(udp(1, 2, &[]));
    assert!(parse_frame(&eth(0x86DD, None, &ipv6(60, V6_A, V6_B, &pl))).is_ok());
}

/// Checks that `ipv4_flow` says what `parse_frame` says on `f`.
fn fast_path_agrees(f: &[u8]) -> Result<(), String> {
    let full = parse_frame(f);
    match (ipv4_flow(f), full) {
        (Some(k), Ok(p)) if p.l3 == L3::Flow(k) && p.vlan_tci.is_none() => Ok(()),
        (Some(k), full) => Err(format!("fast path {k:?}, parse_frame {full:?}")),
        (None, Ok(p))
            if p.vlan_tci.is_none()
                && matches!(p.l3, L3::Flow(k) if k.family() == IpFamily::Ipv4) =>
        {
            Err(format!("fast path missed the flow of {p:?}"))
        }
        (None, _) => Ok(()),
    }
}

/// Every single-byte change (each position, each value) and every cut of
/// IPv4 TCP and UDP frames (with and without options) and their
/// neighbours: the fast path agrees with parse_frame on all of them.
#[test]
fn ipv4_flow_agrees_on_every_one_byte_change_and_cut() {
    let frames = [
        eth(0x0800, None, &ipv4(6, A4, B4, 0, &[], &tcp(1, 2, b"abc"))),
        eth(0x0800, None, &ipv4(6, A4, B4, 0, &[0; 4], &tcp(1, 2, &[]))),
        eth(0x0800, None, &ipv4(17, A4, B4, 0, &[], &udp(1, 2, b"abc"))),
        eth(0x0800, None, &ipv4(17, A4, B4, 0, &[0; 8], &udp(1, 2, &[]))),
        // Source port 12: with IHL 4 its bytes would read as a UDP length
        // that fits, so a fast path without the IHL check would answer.
        eth(0x0800, None, &ipv4(17, A4, B4, 0, &[], &udp(12, 2, b"abc"))),
        eth(
            0x0800,
            Some(7),
            &ipv4(17, A4, B4, 0, &[], &udp(1, 2, b"abc")),
        ),
    ];
    let mut checked = 0u32;
    for f in &frames {
        fast_path_agrees(f).unwrap();
        for n in 0..f.len() {
            fast_path_agrees(&f[..n]).unwrap_or_else(|e| panic!("cut at {n}: {e}"));
        }
        for i in 0..f.len() {
            for v in 0..=255u8 {
                let mut g = f.clone();
                g[i] = v;
                fast_path_agrees(&g).unwrap_or_else(|e| panic!("byte {i} = {v}: {e}"));
                checked += 1;
            }
        }
    }
    assert!(checked > 50_000, "{checked}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_frame(&bytes);
    }

    /// Valid frames with one byte changed or truncated anywhere never panic,
    /// and a frame that still parses as a flow reports in-bounds ports.
    #[test]
    fn never_panics_on_mutated_frames(which in 0usize..4, pos in any::<prop::sample::Index>(), val in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut pl = ext(44, 0);
        pl.extend(frag6(6, 0, false));
        pl.extend(tcp(1, 2, &[1, 2, 3]));
        let frames = [
            eth(0x0800, None, &ipv4(6, A4, B4, 0, &[0; 4], &tcp(1, 2, b"abc"))),
            eth(0x0800, Some(7), &ipv4(17, A4, B4, 0, &[], &udp(1, 2, b"abc"))),
            eth(0x86DD, None, &ipv6(0, V6_A, V6_B, &pl)),
            eth(0x86DD, Some(1), &ipv6(17, V6_A, V6_B, &udp(9, 10, &[0; 30]))),
        ];
        let mut f = frames[which].clone();
        let i = pos.index(f.len());
        f[i] = val;
        let _ = parse_frame(&f);
        let n = cut.index(f.len() + 1);
        let _ = parse_frame(&f[..n]);
    }

    /// The fast path says what parse_frame says, on every frame it
    /// answers for, and answers for every untagged IPv4 flow parse_frame
    /// finds: mutated and cut frames of each kind, and arbitrary bytes.
    #[test]
    fn ipv4_flow_agrees_with_parse_frame(which in 0usize..6, pos in any::<prop::sample::Index>(), val in any::<u8>(), cut in any::<prop::sample::Index>(), mode in 0u8..4, noise in proptest::collection::vec(any::<u8>(), 0..80)) {
        let frames = [
            eth(0x0800, None, &ipv4(6, A4, B4, 0, &[0; 4], &tcp(1, 2, b"abc"))),
            eth(0x0800, None, &ipv4(17, A4, B4, 0, &[], &udp(1, 2, b"abc"))),
            eth(0x0800, Some(7), &ipv4(17, A4, B4, 0, &[], &udp(1, 2, b"abc"))),
            eth(0x0800, None, &ipv4(1, A4, B4, 0, &[], &[0; 8])),
            eth(0x86DD, None, &ipv6(17, V6_A, V6_B, &udp(9, 10, &[0; 30]))),
            noise,
        ];
        // mode: 0 intact, 1 one byte changed, 2 cut short, 3 both.
        let mut f = frames[which].clone();
        if mode & 1 != 0 && !f.is_empty() {
            let i = pos.index(f.len());
            f[i] = val;
        }
        let n = if mode & 2 != 0 { cut.index(f.len() + 1) } else { f.len() };
        let f = &f[..n];
        let full = parse_frame(f);
        match ipv4_flow(f) {
            Some(k) => {
                let p = full.expect("the fast path answered for a frame parse_frame refuses");
                prop_assert_eq!(p.l3, L3::Flow(k));
                prop_assert_eq!(p.vlan_tci, None);
                prop_assert_eq!(k.family(), IpFamily::Ipv4);
            }
            None => {
                if let Ok(p) = full {
                    let v4_flow = matches!(p.l3, L3::Flow(k) if k.family() == IpFamily::Ipv4);
                    prop_assert!(!(v4_flow && p.vlan_tci.is_none()), "parse_frame found an untagged IPv4 flow the fast path missed: {:?}", p);
                }
            }
        }
    }

    /// Any v4/v6 TCP/UDP flow written into a frame parses back to itself.
    #[test]
    fn flow_round_trip(v6 in any::<bool>(), tcp_p in any::<bool>(), s in any::<[u8; 16]>(), d in any::<[u8; 16]>(), sp in any::<u16>(), dp in any::<u16>(), vlan in proptest::option::of(any::<u16>())) {
        let (proto, l4) = if tcp_p { (L4Proto::Tcp, tcp(sp, dp, &[])) } else { (L4Proto::Udp, udp(sp, dp, &[])) };
        let (key, frame) = if v6 {
            (FlowKey::v6(proto, Ipv6Addr::from(s), sp, Ipv6Addr::from(d), dp), eth(0x86DD, vlan, &ipv6(proto.ip_proto(), s, d, &l4)))
        } else {
            let s4 = [s[0], s[1], s[2], s[3]];
            let d4 = [d[0], d[1], d[2], d[3]];
            (FlowKey::v4(proto, Ipv4Addr::from(s4), sp, Ipv4Addr::from(d4), dp), eth(0x0800, vlan, &ipv4(proto.ip_proto(), s4, d4, 0, &[], &l4)))
        };
        let p = parse_frame(&frame).unwrap();
        prop_assert_eq!(p.l3, L3::Flow(key));
        prop_assert_eq!(p.vlan_tci, vlan);
        prop_assert_eq!(ipv4_flow(&frame), (!v6 && vlan.is_none()).then_some(key));
    }
}

#[test]
fn flow_key_serde_shape() {
    let k = v4_key(L4Proto::Udp, 5000, 6000);
    let j = serde_json::to_string(&k).unwrap();
    assert_eq!(
        j,
        r#"{"family":"ipv4","proto":"udp","src":"10.0.0.2","dst":"10.0.0.1","sport":5000,"dport":6000}"#
    );
    assert_eq!(serde_json::from_str::<FlowKey>(&j).unwrap(), k);
    let k6 = v6_key(L4Proto::Tcp, 1, 2);
    let j6 = serde_json::to_string(&k6).unwrap();
    assert_eq!(
        j6,
        r#"{"family":"ipv6","proto":"tcp","src":"2001:db8::1","dst":"2001:db8::2","sport":1,"dport":2}"#
    );
    assert_eq!(serde_json::from_str::<FlowKey>(&j6).unwrap(), k6);
    // inconsistent family is refused
    let bad =
        r#"{"family":"ipv6","proto":"tcp","src":"1.2.3.4","dst":"1.2.3.5","sport":1,"dport":2}"#;
    assert!(serde_json::from_str::<FlowKey>(bad).is_err());
    let mixed =
        r#"{"family":"ipv4","proto":"tcp","src":"1.2.3.4","dst":"::1","sport":1,"dport":2}"#;
    assert!(serde_json::from_str::<FlowKey>(mixed).is_err());
}
