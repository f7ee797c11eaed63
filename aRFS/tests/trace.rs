//! Trace records: the exact JSON shape documented in TRACE.md.

use std::net::Ipv4Addr;

use arfs::proto::{decode_frame, DelReason, Direction, MsgType, OpStatus};
use arfs::{DropCause, FlowKey, L4Proto, TableEvent, TraceRecord};

fn flow(p: u16) -> FlowKey {
    FlowKey::v4(
        L4Proto::Udp,
        Ipv4Addr::new(10, 0, 0, 2),
        p,
        Ipv4Addr::new(10, 0, 0, 1),
        6000,
    )
}

const F5000: &str = r#"{"family":"ipv4","proto":"udp","src":"10.0.0.2","dst":"10.0.0.1","sport":5000,"dport":6000}"#;
const F5001: &str = r#"{"family":"ipv4","proto":"udp","src":"10.0.0.2","dst":"10.0.0.1","sport":5001,"dport":6000}"#;

fn line(r: &TraceRecord) -> String {
    let s = serde_json::to_string(r).unwrap();
    // every line parses back to the same record
    assert_eq!(&serde_json::from_str::<TraceRecord>(&s).unwrap(), r);
    s
}

#[test]
fn table_event_lines() {
    let cases: Vec<(TableEvent, String)> = vec![
        (
            TableEvent::Added { seq: 4, id: 17, rxq: 2, flow: flow(5000) },
            format!(r#"{{"ts_ns":100,"event":"add","gen":3,"seq":4,"id":17,"rxq":2,"flow":{F5000}}}"#),
        ),
        (
            TableEvent::Replaced { seq: 5, id: 17, rxq: 1, flow: flow(5001), prev_id: 9, prev_rxq: 2, prev_flow: flow(5000), prev_hits: 42 },
            format!(r#"{{"ts_ns":100,"event":"replace","gen":3,"seq":5,"id":17,"rxq":1,"flow":{F5001},"prev_id":9,"prev_rxq":2,"prev_flow":{F5000},"hits":42}}"#),
        ),
        (
            TableEvent::Deleted { seq: 6, id: 17, rxq: 1, flow: flow(5001), reason: DelReason::Expired, hits: 7 },
            format!(r#"{{"ts_ns":100,"event":"del","gen":3,"seq":6,"id":17,"rxq":1,"flow":{F5001},"hits":7,"reason":"expired"}}"#),
        ),
        (
            TableEvent::Rejected { seq: 7, id: 3, rxq: 9, flow: Some(flow(5000)), status: OpStatus::BadQueue },
            format!(r#"{{"ts_ns":100,"event":"reject","gen":3,"seq":7,"id":3,"rxq":9,"flow":{F5000},"reason":"bad_queue"}}"#),
        ),
        (
            TableEvent::Rejected { seq: 7, id: 3, rxq: 0, flow: None, status: OpStatus::BadKey },
            r#"{"ts_ns":100,"event":"reject","gen":3,"seq":7,"id":3,"rxq":0,"reason":"bad_key"}"#.to_string(),
        ),
        (
            TableEvent::UnknownDelete { seq: 8, id: 99, reason: DelReason::Idle },
            r#"{"ts_ns":100,"event":"unknown_del","gen":3,"seq":8,"id":99,"reason":"idle"}"#.to_string(),
        ),
        (
            TableEvent::Flushed { seq: 9, reason: DelReason::Unload, count: 12 },
            r#"{"ts_ns":100,"event":"flush","gen":3,"seq":9,"reason":"unload","count":12}"#.to_string(),
        ),
        (
            TableEvent::Evicted { id: 1, rxq: 0, flow: flow(5000), hits: 5 },
            format!(r#"{{"ts_ns":100,"event":"evict","gen":3,"id":1,"rxq":0,"flow":{F5000},"hits":5,"reason":"reset"}}"#),
        ),
        (
            TableEvent::Cleared { count: 4, dropped_requests: 2 },
            r#"{"ts_ns":100,"event":"reset","gen":3,"reason":"reset","count":4,"dropped":2}"#.to_string(),
        ),
        (
            TableEvent::Completed { seq: 10, kind: MsgType::Add, statuses: vec![OpStatus::Ok, OpStatus::TableFull], due_ns: 90 },
            r#"{"ts_ns":100,"event":"ack","gen":3,"seq":10,"count":2,"msg_type":"ADD","statuses":["ok","table_full"]}"#.to_string(),
        ),
    ];
    for (ev, want) in cases {
        assert_eq!(line(&TraceRecord::from_event(100, 3, &ev)), want, "{ev:?}");
    }
}

#[test]
fn device_lines() {
    assert_eq!(
        line(&TraceRecord::gen_change(5, 1, 2, "reconnect")),
        r#"{"ts_ns":5,"event":"gen_change","gen":2,"reason":"reconnect","prev_gen":1}"#
    );

    // a NAKable error carries seq; a silent one does not
    let mut f = vec![0xffu8; 6];
    f.extend([0u8; 6]);
    f.extend([
        0x88, 0xb5, 0x76, 0x41, 1, 4, 0, 0, 0, 42, 0, 0, 0, 0, 0, 1, 0, 4, 1, 7, 0, 0,
    ]);
    let e = decode_frame(&f).unwrap_err();
    assert_eq!(
        line(&TraceRecord::bad_frame(6, 2, &e)),
        r#"{"ts_ns":6,"event":"bad_frame","gen":2,"seq":42,"reason":"bad_reason","msg_type":"DEL","field":"ops[].reason","op":0}"#
    );
    f[14] = 0;
    let e = decode_frame(&f).unwrap_err();
    assert_eq!(
        line(&TraceRecord::bad_frame(6, 2, &e)),
        r#"{"ts_ns":6,"event":"bad_frame","gen":2,"reason":"bad_magic","msg_type":"DEL","field":"magic"}"#
    );
    let e = decode_frame(&f[..20]).unwrap_err();
    assert_eq!(
        line(&TraceRecord::bad_frame(6, 2, &e)),
        r#"{"ts_ns":6,"event":"bad_frame","gen":2,"reason":"too_short","field":"frame"}"#
    );

    assert_eq!(
        line(&TraceRecord::mgmt_drop(
            7,
            2,
            Direction::ToDevice,
            Some(11),
            Some(3),
            DropCause::Loss
        )),
        r#"{"ts_ns":7,"event":"mgmt_drop","gen":2,"seq":11,"reason":"loss","msg_type":"ADD","dir":"to_device"}"#
    );
    assert_eq!(
        line(&TraceRecord::mgmt_drop(
            7,
            2,
            Direction::ToDriver,
            Some(11),
            Some(6),
            DropCause::NoBuffer
        )),
        r#"{"ts_ns":7,"event":"mgmt_drop","gen":2,"seq":11,"reason":"no_buffer","msg_type":"ACK","dir":"to_driver"}"#
    );
    assert_eq!(
        line(&TraceRecord::mgmt_drop(
            7,
            2,
            Direction::ToDevice,
            None,
            Some(99),
            DropCause::Spoofed
        )),
        r#"{"ts_ns":7,"event":"mgmt_drop","gen":2,"reason":"spoofed","msg_type":"99","dir":"to_device"}"#
    );
}

/// `rss_set` lines (TRACE.md): `status`, `context`, the two flags, `key`
/// (80 hex digits: the key RSS hashes with after an applied op, the op's
/// as it came after a refused one), `indir` (the driver's table after an
/// applied op, absent with `default_indir`; the op's as it came after a
/// refused one); a new generation's line has no `seq` and reason `reset`.
#[test]
fn rss_set_lines() {
    use arfs::proto::RssSetOp;
    use arfs::rss::{key_to_hex, INDIRECTION_LEN, KEY_LEN};
    use arfs::table::RssChange;
    use arfs::{RssConfig, DEFAULT_KEY};
    let ev = |seq: Option<u32>, status, op| {
        TableEvent::RssSet(Box::new(RssChange {
            seq,
            status,
            op,
            cause: if seq.is_some() {
                arfs::table::ExtCause::Op
            } else {
                arfs::table::ExtCause::Reset
            },
        }))
    };
    let zeros = format!("[{}]", vec!["0"; INDIRECTION_LEN].join(","));
    let rr: Vec<String> = (0..INDIRECTION_LEN).map(|i| (i % 2).to_string()).collect();
    let rr = format!("[{}]", rr.join(","));
    let default_key = key_to_hex(&DEFAULT_KEY);
    let key = "11".repeat(KEY_LEN);

    // An applied op with the driver's key and table.
    let table: [u16; INDIRECTION_LEN] = core::array::from_fn(|i| (i % 2) as u16);
    let op = RssSetOp::new(&RssConfig {
        key: Some([0x11; KEY_LEN]),
        indirection: Some(table),
    });
    assert_eq!(
        line(&TraceRecord::from_event(
            100,
            3,
            &ev(Some(8), OpStatus::Ok, op)
        )),
        format!(
            r#"{{"ts_ns":100,"event":"rss_set","gen":3,"seq":8,"status":"ok","context":0,"default_indir":false,"default_key":false,"key":"{key}","indir":{rr}}}"#
        )
    );
    // An applied op asking for the defaults: the default key, no table.
    let d = RssSetOp::new(&RssConfig::default());
    assert_eq!(
        line(&TraceRecord::from_event(
            100,
            3,
            &ev(Some(9), OpStatus::Ok, d)
        )),
        format!(
            r#"{{"ts_ns":100,"event":"rss_set","gen":3,"seq":9,"status":"ok","context":0,"default_indir":true,"default_key":true,"key":"{default_key}"}}"#
        )
    );
    // A refused op: as it came (here: a context that does not exist).
    let mut bad = d;
    bad.context = 2;
    assert_eq!(
        line(&TraceRecord::from_event(
            100,
            3,
            &ev(Some(10), OpStatus::BadKey, bad)
        )),
        format!(
            r#"{{"ts_ns":100,"event":"rss_set","gen":3,"seq":10,"status":"bad_key","context":2,"default_indir":true,"default_key":true,"key":"{}","indir":{zeros}}}"#,
            "00".repeat(KEY_LEN)
        )
    );
    // A new generation puts the defaults back.
    assert_eq!(
        line(&TraceRecord::from_event(100, 4, &ev(None, OpStatus::Ok, d))),
        format!(
            r#"{{"ts_ns":100,"event":"rss_set","gen":4,"reason":"reset","status":"ok","context":0,"default_indir":true,"default_key":true,"key":"{default_key}"}}"#
        )
    );
}
