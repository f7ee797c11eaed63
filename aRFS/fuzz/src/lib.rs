//! The fuzz target bodies: each takes arbitrary bytes, must never panic,
//! and asserts the invariants its code promises. One copy, called by the
//! cargo-fuzz entry points (`libfuzzer/fuzz_targets/*.rs`, one line each)
//! and by the stable-Rust driver `arfs-fuzz` (`src/main.rs`), which runs
//! them over the corpus and mutated inputs (README.md beside this crate).

use arfs::proto::{
    decode, decode_frame as decode_request, encode, encode_nak, Direction, FrameMeta,
};
use arfs::{
    parse_frame as parse_eth, FilterTable, FlowIndex, FlowKey, Request, Rss, TableConfig, L3,
};

/// A fuzz target: its name (the corpus and artifact directory) and body.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Tokens the driver's mutator splices in (JSON keys and values).
    pub dict: &'static [&'static str],
}

/// Every target, in the order the driver runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "decode_frame",
        run: decode_frame,
        dict: &[],
    },
    Target {
        name: "parse_frame",
        run: parse_frame,
        dict: &[],
    },
    Target {
        name: "table_ops",
        run: table_ops,
        dict: &[],
    },
    Target {
        name: "ctl_request",
        run: ctl_request,
        dict: CTL_DICT,
    },
    Target {
        name: "agent_request",
        run: agent_request,
        dict: AGENT_DICT,
    },
];

const JSON_DICT: [&str; 16] = [
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "false",
    "-1",
    "0",
    "1e999",
    "18446744073709551616",
    "-9223372036854775809",
    "\\u0000",
];

const CTL_DICT: &[&str] = &[
    "\"cmd\"",
    "\"stats\"",
    "\"table\"",
    "\"knobs\"",
    "\"set\"",
    "\"gen\"",
    "\"trace_flush\"",
    "\"key\"",
    "\"value\"",
    "\"op\"",
    "\"start\"",
    "\"stop\"",
    "\"list\"",
    "\"id\"",
    "\"flow\"",
    "\"flows\"",
    "\"src\"",
    "\"dst\"",
    "\"sport\"",
    "\"dport\"",
    "\"count\"",
    "\"rate\"",
    "\"size\"",
    "\"stamp\"",
    "\"add_fail_rate\"",
    "\"mgmt_loss_rate\"",
    "\"program_latency\"",
    "\"misroute\"",
    "\"0-65535\"",
    "\"1-0\"",
    "\"10.0.0.0-10.255.255.255\"",
    "\"::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff\"",
    "\"fd00::1-fd00::ffff\"",
    "\"0.0.0.0-255.255.255.255\"",
    "65536",
    "4294967296",
    "\"1.5\"",
    "\"NaN\"",
    "\"inf\"",
    "\"1e308\"",
    "\"-0\"",
    "\n",
    // the JSON tokens (JSON_DICT) are added to every JSON target's dictionary
];

const AGENT_DICT: &[&str] = &[
    "\"id\"",
    "\"cmd\"",
    "\"hello\"",
    "\"net_setup\"",
    "\"write_file\"",
    "\"read_file\"",
    "\"read_dir\"",
    "\"rfs\"",
    "\"set_feature\"",
    "\"set_channels\"",
    "\"rx_queue_napi\"",
    "\"module_load\"",
    "\"module_unload\"",
    "\"probed_unload\"",
    "\"ping\"",
    "\"udp_start\"",
    "\"udp_migrate\"",
    "\"udp_stats\"",
    "\"udp_stop\"",
    "\"tcp_start\"",
    "\"tcp_stats\"",
    "\"tcp_stop\"",
    "\"dmesg\"",
    "\"exec\"",
    "\"raw_tx_start\"",
    "\"raw_tx_wait\"",
    "\"sleep\"",
    "\"poweroff\"",
    "\"ifname\"",
    "\"addr\"",
    "\"prefix\"",
    "\"addr6\"",
    "\"prefix6\"",
    "\"path\"",
    "\"moves\"",
    "\"flows\"",
    "\"peer\"",
    "\"local_port\"",
    "\"peer_port\"",
    "\"cpu\"",
    "\"frames\"",
    "\"argv\"",
    "\"timeout_ms\"",
    "\"ms\"",
    "\"result\"",
    "\"error\"",
    "[[0,1]]",
    "256",
    "65536",
    // the JSON tokens (JSON_DICT) are added to every JSON target's dictionary
];

/// The JSON tokens every JSON target also gets.
pub fn json_dict() -> &'static [&'static str] {
    &JSON_DICT
}

/// Management codec: decoding arbitrary frames on both sides never
/// panics, every accepted frame re-encodes to the same bytes, every error
/// names a field, and a NAK is sent exactly when PROTOCOL.md says.
pub fn decode_frame(data: &[u8]) {
    for dir in [Direction::ToDevice, Direction::ToDriver] {
        match decode(data, dir, u16::MAX) {
            Ok((h, m)) => {
                let mut out = Vec::new();
                let mut meta = FrameMeta {
                    dst: [0; 6],
                    src: [0; 6],
                    seq: h.seq,
                    generation: h.generation,
                };
                meta.dst.copy_from_slice(&data[0..6]);
                meta.src.copy_from_slice(&data[6..12]);
                encode(&mut out, &meta, &m).expect("a decoded message encodes");
                assert_eq!(&out[..], &data[..out.len()], "codec is canonical");
                assert_eq!(m.msg_type().direction(), dir);
            }
            Err(e) => {
                assert!(!e.field.is_empty());
                let mut out = Vec::new();
                let sent = encode_nak(&mut out, [2; 6], 1, &e).expect("NAK encodes");
                assert_eq!(sent, !e.kind.is_silent() && e.header.is_some());
                if sent {
                    let (_, reply) = decode(&out, Direction::ToDriver, u16::MAX)
                        .expect("the NAK decodes on the driver side");
                    assert_eq!(reply.msg_type(), arfs::MsgType::Ack);
                }
            }
        }
    }
}

/// Frame parser: arbitrary Ethernet frames never panic; a parsed flow
/// hashes and steers in range, and its key survives a round trip through
/// its raw bytes; steering's IPv4 fast path agrees with the full parser.
pub fn parse_frame(data: &[u8]) {
    static RSS: std::sync::LazyLock<Rss> = std::sync::LazyLock::new(|| Rss::new(4));
    let rss = &*RSS;
    // The steering fast path says what the full parser says, on every input.
    let fast = arfs::ipv4_flow(data);
    let full = parse_eth(data);
    match (&full, fast) {
        (Ok(p), Some(k)) => assert!(p.l3 == L3::Flow(k) && p.vlan_tci.is_none()),
        (Err(_), Some(k)) => panic!("ipv4_flow answered {k:?} for a frame parse_frame refuses"),
        (Ok(p), None) => assert!(
            !(p.vlan_tci.is_none()
                && matches!(p.l3, L3::Flow(k) if k.family() == arfs::IpFamily::Ipv4)),
            "ipv4_flow missed {p:?}"
        ),
        (Err(_), None) => {}
    }
    if let Ok(p) = full {
        assert!(p.l3_offset <= data.len());
        let q = rss.queue_for(&p);
        assert!(q < 4);
        if let L3::Flow(k) = p.l3 {
            let back = FlowKey::from_raw(
                k.family(),
                k.proto(),
                k.src_bytes(),
                k.src_port(),
                k.dst_bytes(),
                k.dst_port(),
            );
            assert_eq!(back, Some(k));
            assert_eq!(rss.queue_for_key(&k), q);
        }
    }
}

/// Filter table: arbitrary device-side request frames applied to a small
/// table never panic and keep the invariants (size <= capacity, lookups
/// agree with the entries, a replica fed the events equals the table).
/// Input: one knob byte (capacity, buckets, latency), then frames, each
/// prefixed by its length in one byte.
pub fn table_ops(data: &[u8]) {
    let Some((&knobs, mut rest)) = data.split_first() else {
        return;
    };
    let cfg = TableConfig {
        capacity: u32::from(knobs & 0x0f) + 1,
        buckets: (knobs & 0x30 != 0).then_some((u32::from((knobs >> 4) & 3) + 1, 2)),
        latency_ns: u64::from(knobs >> 6) * 100,
        ..TableConfig::default()
    };
    let mut t = FilterTable::new(cfg.clone()).expect("valid config");
    let mut replica = FlowIndex::new(cfg.capacity as usize);
    let mut now = 0u64;
    let mut seq = 0u32;
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        let (frame, next) = tail.split_at(n);
        rest = next;
        now += 150;
        if let Ok((_, msg)) = decode_request(frame) {
            if let Ok(req) = Request::try_from(msg) {
                seq += 1;
                t.submit(now, seq, req);
            }
        }
        t.advance(now, 3, &mut |e| {
            replica.apply(&e);
        });
        assert!(t.len() <= cfg.capacity as usize);
        assert_eq!(replica.len(), t.len());
        for e in t.entries() {
            assert_eq!(t.lookup(&e.flow), Some((e.id, e.rxq)));
            assert_eq!(replica.lookup(&e.flow), Some((e.id, e.rxq)));
            assert!(e.rxq < 3);
        }
    }
}

/// The daemon's control socket: each line (as `ctlsock.rs` cuts them: at
/// '\n', lossy UTF-8, trimmed, empty lines skipped) through the daemon's
/// request parser and checks (`vnic::fuzzing::ctl_check_request`): never
/// panics, answers the same twice, an error always says something.
pub fn ctl_request(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for line in text.split('\n') {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let r = vnic::fuzzing::ctl_check_request(line).map_err(|e| e.to_string());
        if let Err(e) = &r {
            assert!(!e.is_empty(), "an empty error for {line:?}");
        }
        assert_eq!(
            r,
            vnic::fuzzing::ctl_check_request(line).map_err(|e| e.to_string()),
            "not deterministic"
        );
    }
}

/// The guest agent's requests: each line (as the agent reads them: UTF-8
/// lines, trimmed, empty ones skipped) parsed as an `Envelope` with the
/// agent's own serde types; an accepted request re-encodes, and the
/// encoding parses back to the same encoding. The host's side of the
/// protocol (`Reply`) gets the same round trip.
pub fn agent_request(data: &[u8]) {
    use vnic_agent::proto::{Envelope, Reply};
    // The agent reads with read_line: a line that is not UTF-8 is an error
    // there, never parsed.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.split('\n') {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Ok(env) = serde_json::from_str::<Envelope>(line) {
            let once = serde_json::to_string(&env).expect("a parsed request encodes");
            let back: Envelope = serde_json::from_str(&once)
                .unwrap_or_else(|e| panic!("{once} does not parse back: {e}"));
            let twice = serde_json::to_string(&back).expect("encodes again");
            assert_eq!(once, twice, "the request's encoding is not stable");
        }
        // A reply's `result` is free-form JSON: serde_json (without its
        // float_roundtrip feature) may move a float by one ULP on the way
        // through (found by this target: README.md, "Findings"), so a
        // reply only has to parse back, not to re-encode byte for byte.
        if let Ok(reply) = serde_json::from_str::<Reply>(line) {
            let once = serde_json::to_string(&reply).expect("a parsed reply encodes");
            let back: Reply = serde_json::from_str(&once)
                .unwrap_or_else(|e| panic!("{once} does not parse back: {e}"));
            assert_eq!(back.id, reply.id);
            assert_eq!(back.error, reply.error);
            assert_eq!(back.result.is_some(), reply.result.is_some());
        }
    }
}
