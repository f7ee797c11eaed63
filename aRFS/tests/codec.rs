//! Management codec: the malformed-frame corpus, byte-exact layouts from
//! PROTOCOL.md, round trips, and never-panic properties.

use arfs::proto::{
    decode, decode_frame, decode_frame_driver, decode_frame_limited, encode, encode_ack,
    encode_caps, encode_into, encode_nak, is_mgmt_behind_tags, is_mgmt_frame, max_ops_per_frame,
    Ack, AddOp, Caps, CapsExt, DelOp, DelReason, Direction, EncodeError, FrameError, FrameMeta,
    Hello, Message, MsgType, OpStatus, RssSetOp, BROADCAST_MAC, DEFAULT_MAX_OPS, DEVICE_MAC,
    MAX_ADD_OPS, MAX_DEL_OPS,
};
use arfs::rss::{INDIRECTION_LEN, KEY_LEN};
use arfs::{FlowKey, L4Proto};
use proptest::prelude::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

const GUEST: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

fn meta(seq: u32) -> FrameMeta {
    FrameMeta {
        dst: BROADCAST_MAC,
        src: GUEST,
        seq,
        generation: 0,
    }
}

#[test]
fn malformed_corpus() {
    let text = include_str!("corpus/malformed.txt");
    let mut n = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 6, "corpus line {line:?}");
        let (side, err, field, op, name, frame) =
            (cols[0], cols[1], cols[2], cols[3], cols[4], unhex(cols[5]));
        let got = match side {
            "device" => decode_frame(&frame),
            "driver" => decode_frame_driver(&frame),
            other => panic!("side {other}"),
        };
        let e = got.expect_err(name);
        assert_eq!(e.kind.name(), err, "{name}: {e}");
        assert_eq!(e.field, field, "{name}: {e}");
        let want_op = if op == "-" {
            None
        } else {
            Some(op.parse::<u16>().unwrap())
        };
        assert_eq!(e.op, want_op, "{name}: {e}");
        // The NAK decision follows PROTOCOL.md: silent for too_short, bad_magic, bad_version.
        match e.nak_header() {
            None => assert!(e.kind.is_silent(), "{name}: no NAK header for {err}"),
            Some(h) => {
                assert!(!e.kind.is_silent(), "{name}");
                assert_eq!(h.seq, 0x0102_0304, "{name}");
                let mut out = Vec::new();
                assert!(encode_nak(&mut out, GUEST, 77, &e).unwrap());
                let (nh, msg) = decode_frame_driver(&out).unwrap();
                assert_eq!((nh.seq, nh.generation, nh.count), (0x0102_0304, 77, 0));
                let Message::Ack(a) = msg else {
                    panic!("NAK is an ACK")
                };
                assert_eq!(
                    (a.acked_type, a.frame_error(), a.statuses.len()),
                    (h.msg_type, Some(e.kind), 0)
                );
                assert_eq!(&out[0..6], &GUEST);
                assert_eq!(&out[6..12], &DEVICE_MAC);
            }
        }
        if e.kind.is_silent() {
            let mut out = vec![1, 2, 3];
            assert!(!encode_nak(&mut out, GUEST, 1, &e).unwrap());
            assert!(out.is_empty());
        }
        assert!(e.to_string().contains(err));
        n += 1;
    }
    // every frame error code appears in the corpus
    for fe in FrameError::ALL {
        assert!(
            text.contains(&format!("\t{}\t", fe.name())),
            "corpus lacks {}",
            fe.name()
        );
    }
    assert!(n >= 40);
}

/// Byte-exact layouts, written from PROTOCOL.md's tables (offsets in comments).
#[test]
fn golden_layouts() {
    let mut out = Vec::new();
    // HELLO seq 0x11223344 gen 0
    encode(
        &mut out,
        &meta(0x1122_3344),
        &Message::Hello(Hello {
            driver_version: 1,
            nonce: 0xa1b2_c3d4,
            mac: GUEST,
        }),
    )
    .unwrap();
    let want = concat!(
        "ffffffffffff",
        "525400123456",
        "88b5", // ethernet
        "7641",
        "01",
        "01",
        "11223344",
        "00000000",
        "0000",
        "0010", // magic ver type seq gen count body_len
        "00000001",
        "a1b2c3d4",
        "525400123456",
        "0000" // driver_version nonce mac reserved
    );
    assert_eq!(hex(&out), want);

    // CAPS
    let caps = Caps {
        max_queue_pairs: 8,
        enabled_queue_pairs: 4,
        capacity: 1024,
        buckets: 256,
        ways: 4,
        max_ops: 33,
        latency_us: 50,
        nonce: 0xa1b2_c3d4,
        ext: None,
    };
    encode_caps(&mut out, GUEST, 0x1122_3344, 5, &caps).unwrap();
    let want = concat!(
        "525400123456",
        "02766e696300",
        "88b5",
        "7641",
        "01",
        "02",
        "11223344",
        "00000005",
        "0000",
        "0018",
        "0008",
        "0004",
        "00000400",
        "00000100",
        "0004",
        "0021",
        "00000032",
        "a1b2c3d4"
    );
    assert_eq!(hex(&out), want);

    // ADD: one IPv4 and one IPv6 op
    let k4 = FlowKey::v4(
        L4Proto::Udp,
        [10, 0, 0, 2].into(),
        5000,
        [10, 0, 0, 1].into(),
        6000,
    );
    let k6 = FlowKey::v6(
        L4Proto::Tcp,
        "2001:db8::1".parse().unwrap(),
        443,
        "2001:db8::2".parse().unwrap(),
        40000,
    );
    encode(
        &mut out,
        &meta(7),
        &Message::Add(vec![AddOp::new(0x0102, 3, &k4), AddOp::new(0xFFFE, 0, &k6)]),
    )
    .unwrap();
    let want = concat!(
        "ffffffffffff",
        "525400123456",
        "88b5",
        "7641",
        "01",
        "03",
        "00000007",
        "00000000",
        "0002",
        "0058",
        "0102",
        "0003",
        "04",
        "11",
        "1388",
        "1770",
        "0000",
        "0a000002000000000000000000000000",
        "0a000001000000000000000000000000",
        "fffe",
        "0000",
        "06",
        "06",
        "01bb",
        "9c40",
        "0000",
        "20010db8000000000000000000000001",
        "20010db8000000000000000000000002"
    );
    assert_eq!(hex(&out), want);
    assert_eq!(out.len(), 14 + 16 + 88);

    // DEL
    encode(
        &mut out,
        &meta(8),
        &Message::Del(vec![
            DelOp {
                id: 5,
                reason: DelReason::Expired,
            },
            DelOp {
                id: 6,
                reason: DelReason::Unload,
            },
        ]),
    )
    .unwrap();
    assert_eq!(
        hex(&out[14..]),
        concat!(
            "7641", "01", "04", "00000008", "00000000", "0002", "0008", "0005", "01", "00", "0006",
            "05", "00"
        )
    );

    // FLUSH
    encode(&mut out, &meta(9), &Message::Flush(DelReason::Flush)).unwrap();
    assert_eq!(
        hex(&out[14..]),
        concat!("7641", "01", "05", "00000009", "00000000", "0000", "0004", "04000000")
    );

    // ACK of an ADD with two statuses
    encode_ack(
        &mut out,
        GUEST,
        7,
        3,
        MsgType::Add,
        &[OpStatus::Ok, OpStatus::BucketFull],
    )
    .unwrap();
    assert_eq!(
        hex(&out[14..]),
        concat!(
            "7641", "01", "06", "00000007", "00000003", "0002", "0006", "03", "00", "0000", "00",
            "02"
        )
    );
}

/// The RSS extension's layouts, written from PROTOCOL.md's tables: the
/// RSS_SET op (`context` at 0, `flags` 4, `hfunc` 5, reserved 6..8, `key`
/// 8..48, `indirection` 48..304 as big-endian u16) and the 32-byte CAPS
/// (`features` at 40, `max_rules` 44, reserved 46) with `features` 1 for a
/// driver of version 2 and 3 for one of version 3.
#[test]
fn rss_set_and_long_caps_layouts() {
    let mut out = Vec::new();
    let key: [u8; KEY_LEN] = core::array::from_fn(|i| i as u8);
    let table: [u16; INDIRECTION_LEN] = core::array::from_fn(|i| (i % 3) as u16 + 0x100);
    let op = RssSetOp {
        context: 0,
        flags: 0,
        hfunc: RssSetOp::HFUNC_TOEPLITZ,
        key,
        indirection: table,
    };
    encode(&mut out, &meta(0x0a0b_0c0d), &Message::RssSet(Box::new(op))).unwrap();
    let mut want = String::from(concat!(
        "ffffffffffff",
        "525400123456",
        "88b5",
        "7641",
        "01",
        "09",
        "0a0b0c0d",
        "00000000",
        "0001",
        "0130", // magic ver type seq gen count=1 body_len=304
        "00000000",
        "00",
        "01",
        "0000", // context flags hfunc reserved
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021222324252627",
    ));
    for i in 0..INDIRECTION_LEN {
        want.push_str(["0100", "0101", "0102"][i % 3]);
    }
    assert_eq!(hex(&out), want);
    assert_eq!(out.len(), 14 + 16 + 304);
    let (h, back) = decode_frame(&out).unwrap();
    assert_eq!((h.count, h.body_len), (1, 304));
    assert_eq!(back, Message::RssSet(Box::new(op)));

    // The defaults: flags 3, key and table zero.
    let d = RssSetOp::new(&arfs::RssConfig::default());
    assert_eq!((d.flags, d.hfunc, d.context), (3, 1, 0));
    assert!(d.default_indir() && d.default_key());
    encode(&mut out, &meta(1), &Message::RssSet(Box::new(d))).unwrap();
    assert_eq!(hex(&out[30..38]), "0000000003010000");
    assert!(out[38..].iter().all(|&b| b == 0));

    let caps = |ext| Caps {
        max_queue_pairs: 4,
        enabled_queue_pairs: 2,
        capacity: 1024,
        buckets: 0,
        ways: 0,
        max_ops: 33,
        latency_us: 0,
        nonce: 9,
        ext,
    };
    for (rss, features) in [(false, "00000001"), (true, "00000003")] {
        let c = caps(Some(CapsExt {
            max_rules: 128,
            rss,
        }));
        encode_caps(&mut out, GUEST, 5, 1, &c).unwrap();
        assert_eq!(out.len(), 14 + 16 + 32);
        assert_eq!(hex(&out[28..30]), "0020", "body_len 32");
        assert_eq!(hex(&out[54..62]), format!("{features}00800000"));
        let (_, m) = decode_frame_driver(&out).unwrap();
        assert_eq!(m, Message::Caps(c));
        let Message::Caps(back) = m else { panic!() };
        assert_eq!((back.max_rules(), back.has_rss()), (Some(128), rss));
    }
    let short = caps(None);
    assert_eq!((short.max_rules(), short.has_rss()), (None, false));
    // Any other `features` is reserved_nonzero: bit 1 without bit 0, none,
    // a bit past the two.
    for f in [0u32, 2, 4, 5, 7, 0x8000_0001] {
        encode_caps(
            &mut out,
            GUEST,
            5,
            1,
            &caps(Some(CapsExt {
                max_rules: 1,
                rss: true,
            })),
        )
        .unwrap();
        out[54..58].copy_from_slice(&f.to_be_bytes());
        let e = decode_frame_driver(&out).unwrap_err();
        assert_eq!(
            (e.kind, e.field),
            (FrameError::ReservedNonzero, "features"),
            "features {f}"
        );
    }
}

/// An RSS_SET op's status, checked in PROTOCOL.md's order: `bad_key` (a
/// context other than 0, an hfunc other than Toeplitz, a key with
/// `default_key` or a table with `default_indir` not all zero) before
/// `bad_queue` (an entry at or past `max_queue_pairs`); otherwise what it
/// asks for.
#[test]
fn rss_set_statuses() {
    let cfg = arfs::RssConfig {
        key: Some([7; KEY_LEN]),
        indirection: Some(core::array::from_fn(|i| (i % 4) as u16)),
    };
    let ok = RssSetOp::new(&cfg);
    assert_eq!(ok.flags, 0);
    assert_eq!(ok.config(4), Ok(cfg));
    assert_eq!(ok.asked(), cfg);
    // An entry at max_queue_pairs.
    assert_eq!(ok.config(3), Err(OpStatus::BadQueue));
    let bad_key = |f: &dyn Fn(&mut RssSetOp)| {
        let mut op = ok;
        f(&mut op);
        // bad_key wins over the bad queue
        assert_eq!(op.config(3), Err(OpStatus::BadKey), "{op:?}");
        assert_eq!(op.config(4), Err(OpStatus::BadKey), "{op:?}");
    };
    bad_key(&|op| op.context = 1);
    bad_key(&|op| op.context = u32::MAX);
    bad_key(&|op| op.hfunc = 0);
    bad_key(&|op| op.hfunc = 2);
    bad_key(&|op| op.flags = RssSetOp::DEFAULT_KEY);
    bad_key(&|op| op.flags = RssSetOp::DEFAULT_INDIR);
    // With the flags, zeros: the defaults, whatever max_queue_pairs.
    let mut d = ok;
    d.flags = RssSetOp::DEFAULT_INDIR;
    d.indirection = [0; INDIRECTION_LEN];
    assert_eq!(
        d.config(1),
        Ok(arfs::RssConfig {
            key: cfg.key,
            indirection: None
        })
    );
    d.flags |= RssSetOp::DEFAULT_KEY;
    d.key = [0; KEY_LEN];
    assert_eq!(d.config(1), Ok(arfs::RssConfig::default()));
    // A driver's all-zero table is a table, not the default.
    let zero = RssSetOp::new(&arfs::RssConfig {
        key: None,
        indirection: Some([0; INDIRECTION_LEN]),
    });
    assert_eq!(
        zero.config(1).unwrap().indirection,
        Some([0; INDIRECTION_LEN])
    );
    // Entries are checked against every queue pair, not the enabled ones.
    let hi = RssSetOp::new(&arfs::RssConfig {
        key: None,
        indirection: Some([65534; INDIRECTION_LEN]),
    });
    assert_eq!(hi.config(65535).map(|c| c.indirection.is_some()), Ok(true));
    assert_eq!(hi.config(65534), Err(OpStatus::BadQueue));
}

#[test]
fn codes_match_protocol_tables() {
    let ops: Vec<(u8, &str)> = OpStatus::ALL.iter().map(|s| (s.code(), s.name())).collect();
    assert_eq!(
        ops,
        vec![
            (0, "ok"),
            (1, "table_full"),
            (2, "bucket_full"),
            (3, "bad_queue"),
            (4, "bad_key"),
            (5, "injected_failure"),
            (6, "unknown_id"),
            (7, "bad_id")
        ]
    );
    let fe: Vec<(u8, &str)> = FrameError::ALL
        .iter()
        .map(|s| (s.code(), s.name()))
        .collect();
    assert_eq!(
        fe,
        vec![
            (1, "too_short"),
            (2, "bad_magic"),
            (3, "bad_version"),
            (4, "unknown_type"),
            (5, "wrong_direction"),
            (6, "bad_length"),
            (7, "too_many_ops"),
            (8, "bad_reason"),
            (9, "reserved_nonzero"),
            (10, "bad_count")
        ]
    );
    for c in 0..=255u8 {
        assert_eq!(
            FrameError::from_code(c).map(FrameError::code),
            (1..=10).contains(&c).then_some(c)
        );
        assert_eq!(
            OpStatus::from_code(c).map(OpStatus::code),
            (c <= 7).then_some(c)
        );
        assert_eq!(
            DelReason::from_code(c).map(DelReason::code),
            (1..=6).contains(&c).then_some(c)
        );
        assert_eq!(
            MsgType::from_code(c).map(MsgType::code),
            (1..=9).contains(&c).then_some(c)
        );
    }
    assert_eq!(max_ops_per_frame(MsgType::Add), 33);
    assert_eq!(max_ops_per_frame(MsgType::Del), 371);
    assert_eq!(max_ops_per_frame(MsgType::Hello), 0);
    assert_eq!(max_ops_per_frame(MsgType::RuleSet), 16);
    assert_eq!(max_ops_per_frame(MsgType::RuleDel), 371);
    assert_eq!(max_ops_per_frame(MsgType::RssSet), 1);
    assert_eq!(MsgType::RssSet.name(), "RSS_SET");
    assert_eq!(MsgType::RssSet.direction(), Direction::ToDevice);
    assert_eq!(
        (
            arfs::proto::FEATURE_RULES,
            arfs::proto::FEATURE_RSS,
            arfs::proto::RULES_DRIVER_VERSION,
            arfs::proto::RSS_DRIVER_VERSION,
            arfs::proto::RSS_SET_OP_LEN,
        ),
        (1, 2, 2, 3, 304)
    );
    assert_eq!(
        (
            RssSetOp::DEFAULT_INDIR,
            RssSetOp::DEFAULT_KEY,
            RssSetOp::HFUNC_TOEPLITZ
        ),
        (1, 2, 1)
    );
}

#[test]
fn padding_is_ignored_and_limits_apply() {
    let mut out = Vec::new();
    encode(&mut out, &meta(1), &Message::Flush(DelReason::Unload)).unwrap();
    assert_eq!(out.len(), 34);
    out.resize(60, 0xAA); // Ethernet minimum with junk padding
    assert!(is_mgmt_frame(&out));
    assert_eq!(
        decode_frame(&out).unwrap().1,
        Message::Flush(DelReason::Unload)
    );

    let k = FlowKey::v4(L4Proto::Tcp, [1, 2, 3, 4].into(), 1, [5, 6, 7, 8].into(), 2);
    encode(
        &mut out,
        &meta(2),
        &Message::Add(vec![AddOp::new(1, 0, &k); 10]),
    )
    .unwrap();
    assert!(decode_frame_limited(&out, 10).is_ok());
    let e = decode_frame_limited(&out, 9).unwrap_err();
    assert_eq!((e.kind, e.field), (FrameError::TooManyOps, "count"));
    // full-MTU frames
    encode(
        &mut out,
        &meta(3),
        &Message::Add(vec![AddOp::new(1, 0, &k); usize::from(MAX_ADD_OPS)]),
    )
    .unwrap();
    assert!(out.len() <= 1514);
    assert!(decode_frame(&out).is_ok());
    encode(
        &mut out,
        &meta(3),
        &Message::Del(vec![
            DelOp {
                id: 1,
                reason: DelReason::Idle
            };
            usize::from(MAX_DEL_OPS)
        ]),
    )
    .unwrap();
    assert!(out.len() <= 1514);
    // fits the MTU, but the device's default max_ops is 33 for DEL too
    assert_eq!(decode_frame(&out).unwrap_err().kind, FrameError::TooManyOps);
    assert!(decode_frame_limited(&out, MAX_DEL_OPS).is_ok());
    let del33 = vec![
        DelOp {
            id: 1,
            reason: DelReason::Idle
        };
        usize::from(DEFAULT_MAX_OPS)
    ];
    encode(&mut out, &meta(3), &Message::Del(del33)).unwrap();
    assert!(decode_frame(&out).is_ok());
    // encode refuses what does not fit
    let too_many = Message::Add(vec![AddOp::new(1, 0, &k); usize::from(MAX_ADD_OPS) + 1]);
    assert_eq!(
        encode(&mut out, &meta(4), &too_many),
        Err(EncodeError::TooManyOps { count: 34, max: 33 })
    );
    let mut small = [0u8; 40];
    assert_eq!(
        encode_into(&mut small, &meta(5), &Message::Flush(DelReason::Idle)),
        Ok(34)
    );
    assert_eq!(
        encode_into(
            &mut small,
            &meta(5),
            &Message::Hello(Hello {
                driver_version: 1,
                nonce: 1,
                mac: GUEST
            })
        ),
        Err(EncodeError::BufferTooSmall { need: 46 })
    );
    assert!(!is_mgmt_frame(&[0u8; 13]));
}

#[test]
fn bad_key_ops_decode_and_are_flagged_by_key() {
    // family/proto/padding problems are per-op statuses, not frame errors.
    let k = FlowKey::v4(L4Proto::Tcp, [1, 2, 3, 4].into(), 1, [5, 6, 7, 8].into(), 2);
    let mut op = AddOp::new(1, 0, &k);
    op.family = 5;
    let mut op2 = AddOp::new(2, 0, &k);
    op2.dst[15] = 1;
    let mut out = Vec::new();
    encode(
        &mut out,
        &meta(1),
        &Message::Add(vec![op, op2, AddOp::new(3, 0, &k)]),
    )
    .unwrap();
    let (_, m) = decode_frame(&out).unwrap();
    let Message::Add(ops) = m else { panic!() };
    assert_eq!(ops[0].key(), None);
    assert_eq!(ops[1].key(), None);
    assert_eq!(ops[2].key(), Some(k));
}

fn flow_strategy() -> impl Strategy<Value = FlowKey> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u16>(),
        any::<u16>(),
    )
        .prop_map(|(v6, t, s, d, sp, dp)| {
            let proto = if t { L4Proto::Tcp } else { L4Proto::Udp };
            if v6 {
                FlowKey::v6(proto, s.into(), sp, d.into(), dp)
            } else {
                FlowKey::v4(
                    proto,
                    [s[0], s[1], s[2], s[3]].into(),
                    sp,
                    [d[0], d[1], d[2], d[3]].into(),
                    dp,
                )
            }
        })
}

fn reason() -> impl Strategy<Value = DelReason> {
    proptest::sample::select(DelReason::ALL.to_vec())
}

fn message_strategy() -> impl Strategy<Value = Message> {
    prop_oneof![
        (any::<u32>(), any::<u32>(), any::<[u8; 6]>()).prop_map(|(v, nonce, mac)| {
            Message::Hello(Hello {
                driver_version: v,
                nonce,
                mac,
            })
        }),
        (
            any::<(u16, u16, u32, u32, u16, u16, u32, u32)>(),
            any::<Option<(u16, bool)>>()
        )
            .prop_map(|((a, b, c, d, e, f, g, nonce), ext)| {
                Message::Caps(Caps {
                    ext: ext.map(|(max_rules, rss)| CapsExt { max_rules, rss }),
                    max_queue_pairs: a,
                    enabled_queue_pairs: b,
                    capacity: c,
                    buckets: d,
                    ways: e,
                    max_ops: f,
                    latency_us: g,
                    nonce,
                })
            }),
        proptest::collection::vec(
            (any::<u16>(), any::<u16>(), flow_strategy())
                .prop_map(|(id, q, k)| AddOp::new(id, q, &k)),
            1..=usize::from(MAX_ADD_OPS)
        )
        .prop_map(Message::Add),
        proptest::collection::vec(
            (any::<u16>(), reason()).prop_map(|(id, reason)| DelOp { id, reason }),
            1..=usize::from(MAX_DEL_OPS)
        )
        .prop_map(Message::Del),
        reason().prop_map(Message::Flush),
        (
            any::<u8>(),
            any::<u8>(),
            proptest::collection::vec(any::<u8>(), 0..=usize::from(MAX_DEL_OPS))
        )
            .prop_map(|(t, s, st)| Message::Ack(Ack {
                acked_type: t,
                frame_status: s,
                statuses: st
            })),
        proptest::collection::vec(rule_op(), 1..=usize::from(arfs::proto::MAX_RULE_OPS))
            .prop_map(Message::RuleSet),
        proptest::collection::vec(any::<u32>(), 1..=usize::from(MAX_DEL_OPS))
            .prop_map(Message::RuleDel),
        rss_op().prop_map(|op| Message::RssSet(Box::new(op))),
    ]
}

/// An RSS_SET op with every field arbitrary but the reserved flag bits
/// (context, hfunc, key and table are checked when it is applied).
fn rss_op() -> impl Strategy<Value = RssSetOp> {
    (
        any::<u32>(),
        0u8..4,
        any::<u8>(),
        any::<[u8; 32]>(),
        any::<[u8; 8]>(),
        proptest::collection::vec(any::<u16>(), INDIRECTION_LEN),
    )
        .prop_map(|(context, flags, hfunc, k0, k1, t)| {
            let mut key = [0u8; KEY_LEN];
            key[..32].copy_from_slice(&k0);
            key[32..].copy_from_slice(&k1);
            RssSetOp {
                context,
                flags,
                hfunc,
                key,
                indirection: t.try_into().unwrap(),
            }
        })
}

/// A RULE_SET op with every field arbitrary (codes included: they are
/// checked when the op is applied, not decoded).
fn rule_op() -> impl Strategy<Value = arfs::proto::RuleOp> {
    (
        (
            any::<u32>(),
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            any::<u32>(),
        ),
        (any::<u8>(), any::<u8>()),
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
        ),
        any::<(u16, u16, u16, u16)>(),
    )
        .prop_map(
            |(
                (loc, flow, action, rxq, context),
                (l4_proto, l4_mask),
                (src, src_mask, dst, dst_mask),
                (sport, sport_mask, dport, dport_mask),
            )| {
                arfs::proto::RuleOp {
                    loc,
                    flow,
                    action,
                    rxq,
                    context,
                    l4_proto,
                    l4_mask,
                    src,
                    src_mask,
                    dst,
                    dst_mask,
                    sport,
                    sport_mask,
                    dport,
                    dport_mask,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// encode -> decode (on the receiving side) gives the same header and message.
    #[test]
    fn round_trip(msg in message_strategy(), seq in any::<u32>(), gen in any::<u32>(), pad in 0usize..40) {
        let m = FrameMeta { dst: GUEST, src: DEVICE_MAC, seq, generation: gen };
        let mut out = Vec::new();
        encode(&mut out, &m, &msg).unwrap();
        out.extend(std::iter::repeat_n(0x5a, pad));
        let side = msg.msg_type().direction();
        let (h, back) = decode(&out, side, u16::MAX).unwrap();
        prop_assert_eq!(&back, &msg);
        prop_assert_eq!((h.seq, h.generation, h.msg_type, usize::from(h.count)), (seq, gen, msg.msg_type().code(), msg.count()));
        // the other side refuses it as wrong_direction
        let other = if side == Direction::ToDevice { Direction::ToDriver } else { Direction::ToDevice };
        prop_assert_eq!(decode(&out, other, u16::MAX).unwrap_err().kind, FrameError::WrongDirection);
    }

    /// Arbitrary bytes behind a valid Ethernet + magic prefix never panic, and
    /// whatever decodes re-encodes to the same bytes (the codec is canonical).
    #[test]
    fn arbitrary_frames_never_panic(t in 0u8..11, count in 0u16..40, body_len in prop_oneof![0u16..200, 300u16..310, any::<u16>()], body in proptest::collection::vec(any::<u8>(), 0..320)) {
        let mut f = Vec::new();
        f.extend_from_slice(&BROADCAST_MAC);
        f.extend_from_slice(&GUEST);
        f.extend_from_slice(&0x88B5u16.to_be_bytes());
        f.extend_from_slice(&0x7641u16.to_be_bytes());
        f.push(1);
        f.push(t);
        f.extend_from_slice(&5u32.to_be_bytes());
        f.extend_from_slice(&0u32.to_be_bytes());
        f.extend_from_slice(&count.to_be_bytes());
        f.extend_from_slice(&body_len.to_be_bytes());
        f.extend_from_slice(&body);
        for dir in [Direction::ToDevice, Direction::ToDriver] {
            if let Ok((h, m)) = decode(&f, dir, u16::MAX) {
                let mut out = Vec::new();
                encode(&mut out, &FrameMeta { dst: BROADCAST_MAC, src: GUEST, seq: h.seq, generation: h.generation }, &m).unwrap();
                prop_assert_eq!(&out[..], &f[..out.len()]);
            }
        }
    }

    #[test]
    fn random_bytes_never_panic(f in proptest::collection::vec(any::<u8>(), 0..120)) {
        let _ = decode_frame(&f);
        let _ = decode_frame_driver(&f);
    }
}

#[test]
fn management_frames_behind_any_tag_stack_are_recognised() {
    let mut base = vec![0u8; 12];
    base.extend_from_slice(&[0x88, 0xB5]);
    base.extend_from_slice(&[0u8; 40]);
    assert!(is_mgmt_behind_tags(&base));
    let tagged = |tpids: &[u16], inner: u16| {
        let mut f = vec![0u8; 12];
        for t in tpids {
            f.extend_from_slice(&t.to_be_bytes());
            f.extend_from_slice(&[0, 0]); // VID 0: a priority tag
        }
        f.extend_from_slice(&inner.to_be_bytes());
        f.extend_from_slice(&[0u8; 40]);
        f
    };
    // 802.1Q, 802.1ad, QinQ (S-tag then C-tag), the old 0x9100 QinQ.
    for stack in [
        &[0x8100][..],
        &[0x88A8],
        &[0x88A8, 0x8100],
        &[0x9100, 0x8100],
        &[0x8100, 0x8100, 0x8100],
    ] {
        assert!(is_mgmt_behind_tags(&tagged(stack, 0x88B5)), "{stack:x?}");
        assert!(!is_mgmt_behind_tags(&tagged(stack, 0x0800)), "{stack:x?}");
    }
    // Deeper than the walk: judged as management (no host sends it).
    assert!(is_mgmt_behind_tags(&tagged(&[0x8100; 9], 0x0800)));
    assert!(!is_mgmt_behind_tags(&tagged(&[0x8100; 8], 0x0800)));
    // Short frames never panic.
    for n in 0..20 {
        let f = tagged(&[0x88A8, 0x8100], 0x88B5);
        let _ = is_mgmt_behind_tags(&f[..n]);
    }
    assert!(!is_mgmt_behind_tags(&[0u8; 13]));
}
