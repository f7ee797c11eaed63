//! FilterTable: PROTOCOL.md's ADD/DEL/FLUSH semantics, knobs, counters, and
//! model-based property tests of the invariants.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use arfs::proto::{AddOp, DelOp, DelReason, MsgType, OpStatus};
use arfs::table::MAX_FILTER_ID;
use arfs::{FilterTable, FlowIndex, FlowKey, L4Proto, Request, TableConfig, TableEvent, Toeplitz};
use proptest::prelude::*;

fn flow(i: u16) -> FlowKey {
    FlowKey::v4(
        L4Proto::Udp,
        Ipv4Addr::new(192, 168, 1, (i % 250) as u8),
        10_000 + i,
        Ipv4Addr::new(10, 0, 0, 1),
        6000,
    )
}

fn add(id: u16, rxq: u16, f: &FlowKey) -> AddOp {
    AddOp::new(id, rxq, f)
}

fn del(id: u16, reason: DelReason) -> DelOp {
    DelOp { id, reason }
}

fn table(cfg: TableConfig) -> FilterTable {
    FilterTable::new(cfg).unwrap()
}

/// Applies a request now and returns (statuses, events).
fn run(
    t: &mut FilterTable,
    seq: u32,
    req: Request,
    enabled: u16,
) -> (Vec<OpStatus>, Vec<TableEvent>) {
    let mut ev = Vec::new();
    let st = t.apply_now(0, seq, req, enabled, &mut |e| ev.push(e));
    (st, ev)
}

#[test]
fn add_lookup_delete() {
    let mut t = table(TableConfig::default());
    let (st, ev) = run(
        &mut t,
        1,
        Request::Add(vec![add(5, 2, &flow(1)), add(6, 3, &flow(2))]),
        4,
    );
    assert_eq!(st, vec![OpStatus::Ok, OpStatus::Ok]);
    assert_eq!(
        ev[0],
        TableEvent::Added {
            seq: 1,
            id: 5,
            rxq: 2,
            flow: flow(1)
        }
    );
    assert_eq!(
        ev.last().unwrap(),
        &TableEvent::Completed {
            seq: 1,
            kind: MsgType::Add,
            statuses: st,
            due_ns: 0
        }
    );
    assert_eq!(t.lookup(&flow(1)), Some((5, 2)));
    assert_eq!(t.lookup(&flow(2)), Some((6, 3)));
    assert_eq!(t.lookup(&flow(3)), None);
    assert!(t.record_hits(5, 10, 1000));
    assert!(!t.record_hits(7, 1, 1000));
    let (st, ev) = run(
        &mut t,
        2,
        Request::Del(vec![del(5, DelReason::Expired), del(9, DelReason::Idle)]),
        4,
    );
    assert_eq!(st, vec![OpStatus::Ok, OpStatus::UnknownId]);
    assert_eq!(
        ev[0],
        TableEvent::Deleted {
            seq: 2,
            id: 5,
            rxq: 2,
            flow: flow(1),
            reason: DelReason::Expired,
            hits: 10
        }
    );
    assert_eq!(
        ev[1],
        TableEvent::UnknownDelete {
            seq: 2,
            id: 9,
            reason: DelReason::Idle
        }
    );
    assert_eq!(t.lookup(&flow(1)), None);
    let c = t.counters();
    assert_eq!(
        (c.adds, c.deletes.expired, c.unknown_deletes, c.requests),
        (2, 1, 1, 2)
    );
}

#[test]
fn add_on_live_id_replaces() {
    let mut t = table(TableConfig::default());
    run(&mut t, 1, Request::Add(vec![add(1, 0, &flow(1))]), 4);
    t.record_hits(1, 7, 50);
    // re-steer: same flow, new queue -> replace, hits kept
    let (st, ev) = run(&mut t, 2, Request::Add(vec![add(1, 3, &flow(1))]), 4);
    assert_eq!(st, vec![OpStatus::Ok]);
    assert_eq!(
        ev[0],
        TableEvent::Replaced {
            seq: 2,
            id: 1,
            rxq: 3,
            flow: flow(1),
            prev_id: 1,
            prev_rxq: 0,
            prev_flow: flow(1),
            prev_hits: 7
        }
    );
    assert_eq!(t.entry(1).unwrap().hits, 7);
    // new flow on the same id -> replace, old flow gone, hits reset
    let (_, ev) = run(&mut t, 3, Request::Add(vec![add(1, 2, &flow(2))]), 4);
    assert!(
        matches!(ev[0], TableEvent::Replaced { prev_flow, prev_hits: 7, .. } if prev_flow == flow(1))
    );
    assert_eq!(t.lookup(&flow(1)), None);
    assert_eq!(t.lookup(&flow(2)), Some((1, 2)));
    assert_eq!(t.entry(1).unwrap().hits, 0);
    assert_eq!(t.len(), 1);
    let c = t.counters();
    assert_eq!((c.adds, c.replaces, c.deletes.total()), (1, 2, 0));
}

/// An ADD identical to the live entry (a driver re-sending an applied ADD
/// whose ACKs it lost) is ok, changes nothing, emits no event, and is
/// counted as `unchanged`, not as a replace.
#[test]
fn identical_add_is_unchanged_not_a_replace() {
    let mut t = table(TableConfig::default());
    run(&mut t, 1, Request::Add(vec![add(1, 2, &flow(1))]), 4);
    t.record_hits(1, 5, 50);
    let (st, ev) = run(&mut t, 2, Request::Add(vec![add(1, 2, &flow(1))]), 4);
    assert_eq!(st, vec![OpStatus::Ok]);
    assert!(
        ev.iter().all(|e| matches!(e, TableEvent::Completed { .. })),
        "no table change event for an identical ADD: {ev:?}"
    );
    assert_eq!(t.lookup(&flow(1)), Some((1, 2)));
    assert_eq!(t.entry(1).unwrap().hits, 5, "hits kept");
    let c = t.counters();
    assert_eq!((c.adds, c.replaces, c.unchanged), (1, 0, 1));
    // Same id and flow, another queue: a replace as before.
    let (_, ev) = run(&mut t, 3, Request::Add(vec![add(1, 3, &flow(1))]), 4);
    assert!(matches!(ev[0], TableEvent::Replaced { .. }));
    let c = t.counters();
    assert_eq!((c.adds, c.replaces, c.unchanged), (1, 1, 1));
}

#[test]
fn add_of_flow_live_under_other_id_replaces_that_entry() {
    let mut t = table(TableConfig::default());
    run(
        &mut t,
        1,
        Request::Add(vec![add(1, 0, &flow(1)), add(2, 1, &flow(2))]),
        4,
    );
    // flow(1) moves from id 1 to the unused id 3
    let (_, ev) = run(&mut t, 2, Request::Add(vec![add(3, 2, &flow(1))]), 4);
    assert_eq!(
        ev[0],
        TableEvent::Replaced {
            seq: 2,
            id: 3,
            rxq: 2,
            flow: flow(1),
            prev_id: 1,
            prev_rxq: 0,
            prev_flow: flow(1),
            prev_hits: 0
        }
    );
    assert!(t.entry(1).is_none());
    assert_eq!(t.lookup(&flow(1)), Some((3, 2)));
    // flow(2) (under id 2) now goes to id 3, which is live with flow(1):
    // id 2 is deleted (reason replaced), id 3 is replaced.
    let (_, ev) = run(&mut t, 3, Request::Add(vec![add(3, 1, &flow(2))]), 4);
    assert_eq!(
        ev[0],
        TableEvent::Deleted {
            seq: 3,
            id: 2,
            rxq: 1,
            flow: flow(2),
            reason: DelReason::Replaced,
            hits: 0
        }
    );
    assert!(
        matches!(ev[1], TableEvent::Replaced { id: 3, prev_id: 3, prev_flow, .. } if prev_flow == flow(1))
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t.lookup(&flow(2)), Some((3, 1)));
    assert_eq!(t.lookup(&flow(1)), None);
    let c = t.counters();
    assert_eq!((c.adds, c.replaces, c.deletes.replaced), (2, 2, 1));
}

#[test]
fn op_validation_order_and_statuses() {
    let mut t = table(TableConfig {
        capacity: 2,
        ..TableConfig::default()
    });
    let mut bad_family = add(1, 0, &flow(1));
    bad_family.family = 5;
    let mut bad_proto = add(1, 0, &flow(1));
    bad_proto.proto = 1;
    let mut bad_pad = add(1, 0, &flow(1));
    bad_pad.src[9] = 1;
    let mut bad_id_and_key = add(0xFFFF, 0, &flow(1));
    bad_id_and_key.family = 0;
    let (st, ev) = run(
        &mut t,
        1,
        Request::Add(vec![
            add(0xFFFF, 0, &flow(1)),
            bad_id_and_key,
            bad_family,
            bad_proto,
            bad_pad,
            add(1, 4, &flow(1)),
            add(1, 3, &flow(1)),
            add(2, 0, &flow(2)),
            add(3, 0, &flow(3)),
            add(2, 0, &flow(4)), // replace on a full table is fine
        ]),
        4,
    );
    let want = {
        use OpStatus::*;
        vec![
            BadId, BadId, BadKey, BadKey, BadKey, BadQueue, Ok, Ok, TableFull, Ok,
        ]
    };
    assert_eq!(st, want);
    assert!(matches!(
        ev[2],
        TableEvent::Rejected {
            status: OpStatus::BadKey,
            flow: None,
            ..
        }
    ));
    assert!(matches!(
        ev[5],
        TableEvent::Rejected {
            status: OpStatus::BadQueue,
            id: 1,
            rxq: 4,
            flow: Some(_),
            ..
        }
    ));
    let r = t.counters().rejects;
    assert_eq!(
        (r.bad_id, r.bad_key, r.bad_queue, r.table_full, r.total()),
        (2, 3, 1, 1, 7)
    );
    assert_eq!(t.len(), 2);
}

#[test]
fn bucket_model_rejects_when_bucket_full_even_with_room() {
    let cfg = TableConfig {
        capacity: 100,
        buckets: Some((4, 2)),
        ..TableConfig::default()
    };
    let mut t = table(cfg);
    let tz = Toeplitz::default();
    // find three flows in bucket 1
    let same: Vec<FlowKey> = (0..2000)
        .map(flow)
        .filter(|f| tz.hash_flow(f) % 4 == 1)
        .take(3)
        .collect();
    let other = (0..2000)
        .map(flow)
        .find(|f| tz.hash_flow(f) % 4 == 2)
        .unwrap();
    assert_eq!(t.bucket_for(&same[0]), Some(1));
    let (st, _) = run(
        &mut t,
        1,
        Request::Add(vec![
            add(1, 0, &same[0]),
            add(2, 0, &same[1]),
            add(3, 0, &same[2]),
            add(4, 0, &other),
        ]),
        4,
    );
    assert_eq!(
        st,
        vec![
            OpStatus::Ok,
            OpStatus::Ok,
            OpStatus::BucketFull,
            OpStatus::Ok
        ]
    );
    assert_eq!(t.bucket_fill(1), 2);
    assert_eq!(t.entry(1).unwrap().bucket, Some(1));
    // replacing id 1's flow by same[2] (same bucket) frees its way: ok
    let (st, _) = run(&mut t, 2, Request::Add(vec![add(1, 0, &same[2])]), 4);
    assert_eq!(st, vec![OpStatus::Ok]);
    assert_eq!(t.bucket_fill(1), 2);
    // moving id 4 (bucket 2) to same[0] (bucket 1, full) fails and keeps id 4 as it was
    let (st, _) = run(&mut t, 3, Request::Add(vec![add(4, 0, &same[0])]), 4);
    assert_eq!(st, vec![OpStatus::BucketFull]);
    assert_eq!(t.lookup(&other), Some((4, 0)));
    // delete frees the way
    run(&mut t, 4, Request::Del(vec![del(2, DelReason::Idle)]), 4);
    assert_eq!(t.bucket_fill(1), 1);
    let (st, _) = run(&mut t, 5, Request::Add(vec![add(4, 0, &same[0])]), 4);
    assert_eq!(st, vec![OpStatus::Ok]);
    assert_eq!((t.bucket_fill(1), t.bucket_fill(2)), (2, 0));
    assert_eq!(t.counters().rejects.bucket_full, 2);
}

#[test]
fn latency_defers_effect_and_ack() {
    let mut t = table(TableConfig {
        latency_ns: 1000,
        ..TableConfig::default()
    });
    let due = t.submit(5000, 1, Request::Add(vec![add(1, 1, &flow(1))]));
    assert_eq!(due, 6000);
    assert_eq!(t.next_due(), Some(6000));
    let mut ev = Vec::new();
    assert_eq!(t.advance(5999, 4, &mut |e| ev.push(e)), 0);
    assert!(ev.is_empty());
    assert_eq!(
        t.lookup(&flow(1)),
        None,
        "not visible before it takes effect"
    );
    assert_eq!(t.advance(6000, 4, &mut |e| ev.push(e)), 1);
    assert_eq!(t.lookup(&flow(1)), Some((1, 1)));
    assert!(matches!(
        ev.last(),
        Some(TableEvent::Completed {
            seq: 1,
            due_ns: 6000,
            ..
        })
    ));
    assert_eq!(t.next_due(), None);
    assert_eq!(t.entry(1).unwrap().installed_ns, 6000);
}

#[test]
fn requests_never_overtake_when_latency_drops() {
    let mut t = table(TableConfig {
        latency_ns: 10_000,
        ..TableConfig::default()
    });
    t.submit(0, 1, Request::Add(vec![add(1, 0, &flow(1))]));
    t.set_latency_ns(0).unwrap();
    let due2 = t.submit(100, 2, Request::Del(vec![del(1, DelReason::Expired)]));
    assert_eq!(
        due2, 10_000,
        "a later request is due no earlier than the one before"
    );
    let mut seqs = Vec::new();
    t.advance(10_000, 4, &mut |e| {
        if let TableEvent::Completed { seq, .. } = e {
            seqs.push(seq);
        }
    });
    assert_eq!(seqs, vec![1, 2]);
    assert!(t.is_empty());
    assert_eq!(t.counters().unknown_deletes, 0);
}

#[test]
fn pending_queue_is_bounded_for_try_submit() {
    use arfs::table::MAX_PENDING_REQUESTS;
    let mut t = table(TableConfig {
        latency_ns: 1_000_000,
        ..TableConfig::default()
    });
    for seq in 0..MAX_PENDING_REQUESTS as u32 {
        assert!(t
            .try_submit(0, seq, Request::Flush(DelReason::Flush))
            .is_ok());
    }
    let req = Request::Del(vec![del(1, DelReason::Idle)]);
    assert_eq!(t.try_submit(0, 9999, req.clone()), Err(req));
    assert_eq!(t.pending(), MAX_PENDING_REQUESTS);
    let n = t.advance(1_000_000, 4, &mut |_| {});
    assert_eq!((n, t.pending()), (MAX_PENDING_REQUESTS, 0));
    assert!(t.try_submit(0, 1, Request::Flush(DelReason::Flush)).is_ok());
}

#[test]
fn flush_and_clear() {
    let mut t = table(TableConfig::default());
    run(
        &mut t,
        1,
        Request::Add((0..5).map(|i| add(i, 0, &flow(i))).collect()),
        4,
    );
    t.record_hits(3, 2, 9);
    let (st, ev) = run(&mut t, 2, Request::Flush(DelReason::Unload), 4);
    assert!(st.is_empty());
    assert_eq!(ev.len(), 5 + 2);
    assert_eq!(
        ev[3],
        TableEvent::Deleted {
            seq: 2,
            id: 3,
            rxq: 0,
            flow: flow(3),
            reason: DelReason::Unload,
            hits: 2
        }
    );
    assert_eq!(
        ev[5],
        TableEvent::Flushed {
            seq: 2,
            reason: DelReason::Unload,
            count: 5
        }
    );
    assert!(t.is_empty());
    assert_eq!(t.counters().deletes.unload, 5);
    assert_eq!(t.counters().flushes, 1);

    run(&mut t, 3, Request::Add(vec![add(9, 1, &flow(9))]), 4);
    t.set_latency_ns(500).unwrap();
    t.submit(0, 4, Request::Add(vec![add(10, 1, &flow(10))]));
    let mut ev = Vec::new();
    t.clear(&mut |e| ev.push(e));
    assert_eq!(
        ev,
        vec![
            TableEvent::Evicted {
                id: 9,
                rxq: 1,
                flow: flow(9),
                hits: 0
            },
            TableEvent::Cleared {
                count: 1,
                dropped_requests: 1
            }
        ]
    );
    assert!(t.is_empty());
    assert_eq!(t.pending(), 0);
    assert_eq!(t.next_due(), None);
    assert_eq!(t.counters().resets, 1);
    // After a clear a request is due at now + latency again.
    assert_eq!(t.submit(10, 5, Request::Flush(DelReason::Flush)), 510);
}

#[test]
fn reshape_only_while_empty_and_keeps_counters() {
    let mut t = table(TableConfig::default());
    run(&mut t, 1, Request::Add(vec![add(1, 0, &flow(1))]), 4);
    // In use: refused, nothing changes.
    let e = t.reshape(16, Some((64, 2))).unwrap_err();
    assert_eq!(e.field, "capacity");
    assert!(e.message.contains("1 live filters"), "{e}");
    assert_eq!(t.capacity(), 1024);
    assert_eq!(t.config().buckets, None);
    run(&mut t, 2, Request::Flush(DelReason::Unload), 4);
    // A pending request counts as in use too.
    t.set_latency_ns(500).unwrap();
    t.submit(0, 3, Request::Flush(DelReason::Flush));
    assert!(t.reshape(16, None).is_err());
    let mut ev = Vec::new();
    t.advance(1_000, 4, &mut |e| ev.push(e));
    t.set_latency_ns(0).unwrap();
    // Invalid geometry: refused with the field named.
    assert_eq!(t.reshape(0, None).unwrap_err().field, "capacity");
    assert_eq!(t.reshape(16, Some((0, 2))).unwrap_err().field, "buckets");
    // Empty: the new geometry applies, the counters are kept.
    t.reshape(2, Some((64, 1))).unwrap();
    assert_eq!(t.capacity(), 2);
    assert_eq!(t.counters().adds, 1);
    assert_eq!(t.counters().flushes, 2);
    let (st, _) = run(
        &mut t,
        4,
        Request::Add((10..13).map(|i| add(i, 0, &flow(i))).collect()),
        4,
    );
    assert_eq!(st.len(), 3);
    assert!(st.contains(&OpStatus::TableFull) || st.contains(&OpStatus::BucketFull));
    assert_eq!(t.len(), st.iter().filter(|s| **s == OpStatus::Ok).count());
    assert!(t.len() <= 2);
    // Growing back works and capacity is honoured.
    run(&mut t, 5, Request::Flush(DelReason::Flush), 4);
    t.reshape(8, None).unwrap();
    let (st, _) = run(
        &mut t,
        6,
        Request::Add((20..30).map(|i| add(i, 0, &flow(i))).collect()),
        4,
    );
    assert_eq!(st.iter().filter(|s| **s == OpStatus::Ok).count(), 8);
    assert_eq!(st.iter().filter(|s| **s == OpStatus::TableFull).count(), 2);
}

#[test]
fn caps_and_requests_from_messages() {
    use arfs::proto::Message;
    let t = table(TableConfig {
        capacity: 500,
        buckets: Some((64, 4)),
        latency_ns: 1_500,
        ..TableConfig::default()
    });
    let c = t.caps(8, 4);
    assert_eq!(
        (
            c.max_queue_pairs,
            c.enabled_queue_pairs,
            c.capacity,
            c.buckets,
            c.ways,
            c.max_ops,
            c.latency_us
        ),
        (8, 4, 500, 64, 4, 33, 2)
    );
    let t = table(TableConfig::default());
    assert_eq!(
        (
            t.caps(1, 1).buckets,
            t.caps(1, 1).ways,
            t.caps(1, 1).latency_us
        ),
        (0, 0, 0)
    );
    assert_eq!(
        Request::try_from(Message::Flush(DelReason::Idle)),
        Ok(Request::Flush(DelReason::Idle))
    );
    let del = vec![del(1, DelReason::Expired)];
    assert_eq!(
        Request::try_from(Message::Del(del.clone())),
        Ok(Request::Del(del))
    );
    assert!(Request::try_from(Message::Caps(c)).is_err());
}

#[test]
fn hits_and_entries_dump() {
    let mut t = table(TableConfig::default());
    run(
        &mut t,
        1,
        Request::Add(vec![add(7, 1, &flow(7)), add(2, 0, &flow(2))]),
        4,
    );
    assert_eq!(t.lookup_counted(&flow(7), 100), Some((7, 1)));
    assert_eq!(t.lookup_counted(&flow(7), 90), Some((7, 1)));
    assert_eq!(t.lookup_counted(&flow(99), 100), None);
    t.add_lookup_counts(10, 20);
    let c = t.counters();
    assert_eq!((c.lookup_hits, c.lookup_misses), (12, 21));
    let e = t.entries();
    assert_eq!(e.iter().map(|e| e.id).collect::<Vec<_>>(), vec![2, 7]);
    assert_eq!(
        (e[1].hits, e[1].last_hit_ns),
        (2, Some(100)),
        "last hit time never goes back"
    );
    assert_eq!((e[0].hits, e[0].last_hit_ns, e[0].bucket), (0, None, None));
    let j = serde_json::to_value(e[1]).unwrap();
    assert_eq!(j["flow"]["sport"], 10_007);
}

#[test]
fn config_validation_names_the_field() {
    let bad = [
        (
            TableConfig {
                capacity: 0,
                ..TableConfig::default()
            },
            "capacity",
        ),
        (
            TableConfig {
                capacity: 65_536,
                ..TableConfig::default()
            },
            "capacity",
        ),
        (
            TableConfig {
                buckets: Some((0, 4)),
                ..TableConfig::default()
            },
            "buckets",
        ),
        (
            TableConfig {
                buckets: Some((4, 0)),
                ..TableConfig::default()
            },
            "buckets",
        ),
        (
            TableConfig {
                latency_ns: u64::MAX,
                ..TableConfig::default()
            },
            "latency_ns",
        ),
        (
            TableConfig {
                add_fail_rate: 1.5,
                ..TableConfig::default()
            },
            "add_fail_rate",
        ),
        (
            TableConfig {
                add_fail_rate: f64::NAN,
                ..TableConfig::default()
            },
            "add_fail_rate",
        ),
        (
            TableConfig {
                mgmt_loss_rate: -0.1,
                ..TableConfig::default()
            },
            "mgmt_loss_rate",
        ),
    ];
    for (cfg, field) in bad {
        let e = FilterTable::new(cfg).unwrap_err();
        assert_eq!(e.field, field);
        assert!(e.to_string().contains(field));
    }
    assert!(TableConfig {
        capacity: 65_535,
        buckets: Some((1024, 8)),
        ..TableConfig::default()
    }
    .validate()
    .is_ok());
    let mut t = table(TableConfig::default());
    assert_eq!(t.set_add_fail_rate(2.0).unwrap_err().field, "add_fail_rate");
    assert_eq!(
        t.set_mgmt_loss_rate(f64::INFINITY).unwrap_err().field,
        "mgmt_loss_rate"
    );
    assert_eq!(t.set_latency_ns(u64::MAX).unwrap_err().field, "latency_ns");
    t.set_add_fail_rate(0.5).unwrap();
    assert!((t.config().add_fail_rate - 0.5).abs() < f64::EPSILON);
    // serde round trip of the config, key as hex
    let cfg = TableConfig {
        buckets: Some((8, 2)),
        seed: 9,
        ..TableConfig::default()
    };
    let j = serde_json::to_string(&cfg).unwrap();
    assert!(j.contains("6d5a56da255b0ec2"), "{j}");
    assert_eq!(serde_json::from_str::<TableConfig>(&j).unwrap(), cfg);
}

#[test]
fn injected_failures_are_deterministic_under_the_seed() {
    let statuses = |seed: u64, rate: f64| {
        let mut t = table(TableConfig {
            capacity: 65_535,
            add_fail_rate: rate,
            seed,
            ..TableConfig::default()
        });
        let mut all = Vec::new();
        for chunk in 0..100u16 {
            let ops = (0..30)
                .map(|i| add(chunk * 30 + i, 0, &flow(chunk * 30 + i)))
                .collect();
            all.extend(run(&mut t, u32::from(chunk), Request::Add(ops), 1).0);
        }
        (all, t.counters().rejects.injected_failure)
    };
    let (a, na) = statuses(7, 0.3);
    let (b, nb) = statuses(7, 0.3);
    let (c, _) = statuses(8, 0.3);
    assert_eq!(a, b);
    assert_eq!(na, nb);
    assert_ne!(a, c);
    assert!((800..1000).contains(&na), "about 30% of 3000: {na}");
    assert_eq!(statuses(1, 0.0).1, 0);
    assert_eq!(statuses(1, 1.0).1, 3000);
    assert!(a
        .iter()
        .all(|s| matches!(s, OpStatus::Ok | OpStatus::InjectedFailure)));
}

#[test]
fn mgmt_loss_is_deterministic_and_independent_of_add_failures() {
    let draws = |seed: u64, with_adds: bool| {
        let mut t = table(TableConfig {
            mgmt_loss_rate: 0.5,
            add_fail_rate: 0.5,
            seed,
            ..TableConfig::default()
        });
        let mut v = Vec::new();
        for i in 0..200u16 {
            if with_adds {
                run(
                    &mut t,
                    u32::from(i),
                    Request::Add(vec![add(i, 0, &flow(i))]),
                    1,
                );
            }
            v.push(t.mgmt_loss());
        }
        v
    };
    let a = draws(3, false);
    assert_eq!(a, draws(3, false));
    assert_eq!(a, draws(3, true), "ADD draws do not shift the loss stream");
    let lost = a.iter().filter(|&&x| x).count();
    assert!((70..130).contains(&lost), "{lost}");
    let mut t = table(TableConfig::default());
    assert!((0..1000).all(|_| !t.mgmt_loss()));
    t.set_mgmt_loss_rate(1.0).unwrap();
    assert!((0..1000).all(|_| t.mgmt_loss()));
}

// ---------------------------------------------------------------- model test

#[derive(Clone, Debug)]
enum Op {
    Add(Vec<(u16, u16, u16)>), // (id, rxq, flow index; >= POOL means a bad key)
    Del(Vec<(u16, u8)>),
    Flush,
    Tick(u64),
    SetQueues(u16),
    Hit(u16),
}

const POOL: u16 = 12;

fn pool_flow(i: u16) -> FlowKey {
    if i % 2 == 0 {
        flow(i)
    } else {
        FlowKey::v6(
            L4Proto::Tcp,
            format!("2001:db8::{i}").parse().unwrap(),
            i,
            "2001:db8::ffff".parse().unwrap(),
            80,
        )
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let id = prop_oneof![8 => 0u16..10, 1 => Just(0xFFFFu16), 1 => Just(MAX_FILTER_ID)];
    let add_op = (id, 0u16..5, 0u16..POOL + 1);
    prop_oneof![
        6 => proptest::collection::vec(add_op, 1..4).prop_map(Op::Add),
        3 => proptest::collection::vec((0u16..10, 1u8..=5), 1..3).prop_map(Op::Del),
        1 => Just(Op::Flush),
        3 => (0u64..300).prop_map(Op::Tick),
        1 => (1u16..5).prop_map(Op::SetQueues),
        2 => (0u16..10).prop_map(Op::Hit),
    ]
}

/// The naive reference: a map id -> (flow, rxq), O(n) scans.
#[derive(Default)]
struct Model {
    live: BTreeMap<u16, (FlowKey, u16)>,
    hits: BTreeMap<u16, u64>,
}

impl Model {
    fn bucket(cfg: &TableConfig, f: &FlowKey) -> Option<u32> {
        cfg.buckets
            .map(|(b, _)| Toeplitz::new(cfg.rss_key).hash_flow(f) % b)
    }

    fn add(&mut self, cfg: &TableConfig, op: &AddOp, enabled: u16) -> OpStatus {
        if op.id == 0xFFFF {
            return OpStatus::BadId;
        }
        let Some(key) = op.key() else {
            return OpStatus::BadKey;
        };
        if op.rxq >= enabled {
            return OpStatus::BadQueue;
        }
        let cur = self.live.get(&op.id).copied();
        let other = self
            .live
            .iter()
            .find(|(id, (f, _))| **id != op.id && *f == key)
            .map(|(id, _)| *id);
        if cur.is_none() && other.is_none() && self.live.len() >= cfg.capacity as usize {
            return OpStatus::TableFull;
        }
        if let (Some(b), Some((_, w))) = (Self::bucket(cfg, &key), cfg.buckets) {
            let fill = self
                .live
                .iter()
                .filter(|(id, (f, _))| {
                    Some(**id) != other && **id != op.id && Self::bucket(cfg, f) == Some(b)
                })
                .count();
            if fill >= usize::from(w) {
                return OpStatus::BucketFull;
            }
        }
        if let Some(o) = other {
            self.live.remove(&o);
            self.hits.remove(&o);
        }
        if cur.map(|c| c.0) != Some(key) {
            self.hits.insert(op.id, 0);
        }
        self.live.insert(op.id, (key, op.rxq));
        OpStatus::Ok
    }

    fn del(&mut self, id: u16) -> OpStatus {
        if self.live.remove(&id).is_some() {
            self.hits.remove(&id);
            OpStatus::Ok
        } else {
            OpStatus::UnknownId
        }
    }
}

fn to_request(op: &Op) -> Option<Request> {
    match op {
        Op::Add(v) => Some(Request::Add(
            v.iter()
                .map(|&(id, rxq, fi)| {
                    let mut a = AddOp::new(id, rxq, &pool_flow(fi % POOL));
                    if fi >= POOL {
                        a.proto = 1; // bad key
                    }
                    a
                })
                .collect(),
        )),
        Op::Del(v) => Some(Request::Del(
            v.iter()
                .map(|&(id, r)| DelOp {
                    id,
                    reason: DelReason::from_code(r).unwrap(),
                })
                .collect(),
        )),
        Op::Flush => Some(Request::Flush(DelReason::Flush)),
        _ => None,
    }
}

fn check(
    t: &FilterTable,
    m: &Model,
    replica: &FlowIndex,
    cfg: &TableConfig,
) -> Result<(), TestCaseError> {
    prop_assert!(t.len() <= cfg.capacity as usize, "size exceeds capacity");
    prop_assert_eq!(t.len(), m.live.len());
    let entries = t.entries();
    let got: BTreeMap<u16, (FlowKey, u16)> =
        entries.iter().map(|e| (e.id, (e.flow, e.rxq))).collect();
    prop_assert_eq!(got.len(), entries.len(), "ids unique");
    prop_assert_eq!(&got, &m.live);
    let mut flows: Vec<FlowKey> = entries.iter().map(|e| e.flow).collect();
    flows.sort();
    flows.dedup();
    prop_assert_eq!(flows.len(), entries.len(), "flows unique");
    for e in &entries {
        prop_assert_eq!(Some(e.hits), m.hits.get(&e.id).copied());
    }
    for i in 0..POOL {
        let f = pool_flow(i);
        let want = m
            .live
            .iter()
            .find(|(_, (k, _))| *k == f)
            .map(|(id, (_, q))| (*id, *q));
        prop_assert_eq!(t.lookup(&f), want, "lookup {}", f);
        prop_assert_eq!(replica.lookup(&f), want, "replica lookup {}", f);
    }
    prop_assert_eq!(replica.len(), t.len());
    if let Some((b, w)) = cfg.buckets {
        for bucket in 0..b {
            let n = entries.iter().filter(|e| e.bucket == Some(bucket)).count();
            prop_assert!(n <= usize::from(w), "bucket over its ways");
            prop_assert_eq!(usize::from(t.bucket_fill(bucket)), n);
        }
        for e in &entries {
            prop_assert_eq!(e.bucket, Model::bucket(cfg, &e.flow));
        }
    }
    let c = t.counters();
    prop_assert_eq!(
        c.adds - c.deletes.total(),
        t.len() as u64,
        "adds - deletes = size"
    );
    Ok(())
}

fn cfg_strategy() -> impl Strategy<Value = TableConfig> {
    (
        1u32..10,
        proptest::option::of((1u32..5, 1u16..4)),
        prop_oneof![Just(0u64), 1u64..500],
    )
        .prop_map(|(capacity, buckets, latency_ns)| TableConfig {
            capacity,
            buckets,
            latency_ns,
            ..TableConfig::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The table equals a naive model after every step, including between
    /// submission and due time (lookups see the old state), and a replica fed
    /// the events equals the table.
    #[test]
    fn table_matches_model(cfg in cfg_strategy(), ops in proptest::collection::vec(op_strategy(), 1..60)) {
        let mut t = FilterTable::new(cfg.clone()).unwrap();
        let mut m = Model::default();
        let mut replica = FlowIndex::new(cfg.capacity as usize);
        let mut now = 0u64;
        let mut enabled = 4u16;
        // pending model requests: (due, seq, request)
        let mut pending: Vec<(u64, u32, Request)> = Vec::new();
        let mut seq = 0u32;
        let mut events = Vec::new();
        for op in &ops {
            match op {
                Op::Tick(dt) => now += dt,
                Op::SetQueues(n) => enabled = *n,
                Op::Hit(id) => {
                    let live = t.record_hits(*id, 3, now);
                    prop_assert_eq!(live, m.live.contains_key(id));
                    if live {
                        *m.hits.get_mut(id).unwrap() += 3;
                    }
                }
                _ => {
                    let req = to_request(op).unwrap();
                    seq += 1;
                    let due = t.submit(now, seq, req.clone());
                    prop_assert!(due >= now + cfg.latency_ns);
                    pending.push((due, seq, req));
                }
            }
            events.clear();
            t.advance(now, enabled, &mut |e| events.push(e));
            // apply due model requests in order
            while pending.first().is_some_and(|p| p.0 <= now) {
                let (_, s, req) = pending.remove(0);
                let statuses: Vec<OpStatus> = match &req {
                    Request::Add(v) => v.iter().map(|a| m.add(&cfg, a, enabled)).collect(),
                    Request::Del(v) => v.iter().map(|d| m.del(d.id)).collect(),
                    Request::Flush(_) => { m.live.clear(); m.hits.clear(); Vec::new() }
                    // (to_request makes no rule requests: tests/rules.rs)
                    Request::RuleSet(_) | Request::RuleDel(_) | Request::RssSet(_) => unreachable!("no rule or RSS ops here"),
                };
                let done = events.iter().find_map(|e| match e {
                    TableEvent::Completed { seq, statuses, .. } if *seq == s => Some(statuses.clone()),
                    _ => None,
                });
                prop_assert_eq!(done, Some(statuses), "statuses of request {}", s);
            }
            for e in &events {
                replica.apply(e);
            }
            prop_assert_eq!(t.next_due(), pending.first().map(|p| p.0));
            check(&t, &m, &replica, &cfg)?;
        }
    }
}

/// RSS_SET (the RSS extension): applied after the programming latency
/// like any request, reported with its status; a refused op changes
/// nothing; a worker's `Rss` fed the events ends where the table is.
#[test]
fn rss_set_is_applied_refused_and_replayed() {
    use arfs::proto::RssSetOp;
    use arfs::rss::{INDIRECTION_LEN, KEY_LEN};
    use arfs::table::{ExtCause, RssChange};
    use arfs::{Rss, RssConfig};
    let mut t = table(TableConfig {
        latency_ns: 100,
        ..TableConfig::default()
    });
    t.set_queue_pairs(4);
    let mut worker = Rss::new(2);
    let feed = |t: &mut FilterTable, now: u64, worker: &mut Rss| {
        let mut ev = Vec::new();
        t.advance(now, 2, &mut |e| {
            worker.apply(&e);
            ev.push(e);
        });
        ev
    };
    let table3: [u16; INDIRECTION_LEN] = [3; INDIRECTION_LEN];
    let cfg = RssConfig {
        key: Some([0x11; KEY_LEN]),
        indirection: Some(table3),
    };
    let op = RssSetOp::new(&cfg);
    t.submit(0, 1, Request::RssSet(Box::new(op)));
    assert!(feed(&mut t, 99, &mut worker).is_empty(), "not due yet");
    assert!(t.rss().is_default());
    let ev = feed(&mut t, 100, &mut worker);
    assert_eq!(
        ev,
        vec![
            TableEvent::RssSet(Box::new(RssChange {
                seq: Some(1),
                status: OpStatus::Ok,
                op,
                cause: ExtCause::Op,
            })),
            TableEvent::Completed {
                seq: 1,
                kind: MsgType::RssSet,
                statuses: vec![OpStatus::Ok],
                due_ns: 100
            }
        ]
    );
    assert_eq!(*t.rss(), cfg);
    // Queue 3 is a queue pair of the device, not an enabled one: the
    // worker keeps the table and falls back to round-robin for it.
    assert_eq!(worker.driver_table(), Some(&table3));
    assert_eq!(worker.toeplitz().key(), &[0x11; KEY_LEN]);
    assert_eq!(worker.queue_for_hash(5), 1);
    // Refused: bad_queue (an entry at max_queue_pairs), bad_key; nothing
    // changes, each op is reported with its status.
    let mut bad_q = RssSetOp::new(&RssConfig::default());
    bad_q.flags = RssSetOp::DEFAULT_KEY;
    bad_q.indirection[7] = 4;
    let mut bad_k = RssSetOp::new(&RssConfig::default());
    bad_k.hfunc = 2;
    for (seq, op, status) in [(2, bad_q, OpStatus::BadQueue), (3, bad_k, OpStatus::BadKey)] {
        let (st, ev) = run(&mut t, seq, Request::RssSet(Box::new(op)), 2);
        assert_eq!(st, vec![status]);
        assert_eq!(
            ev[0],
            TableEvent::RssSet(Box::new(RssChange {
                seq: Some(seq),
                status,
                op,
                cause: ExtCause::Op,
            }))
        );
        assert!(!worker.apply(&ev[1]), "Completed is not RSS's");
        assert!(worker.apply(&ev[0]));
        assert_eq!(*t.rss(), cfg, "a refused op changes nothing");
        assert_eq!(worker.driver_table(), Some(&table3));
    }
    // default_indir with the same key: the round-robin table again.
    let rr = RssSetOp::new(&RssConfig {
        key: cfg.key,
        indirection: None,
    });
    let (st, ev) = run(&mut t, 4, Request::RssSet(Box::new(rr)), 2);
    assert_eq!(st, vec![OpStatus::Ok]);
    worker.apply(&ev[0]);
    assert_eq!(worker, Rss::with_key([0x11; KEY_LEN], 2));
    assert_eq!(t.rss().indirection, None);
    // Filters are not RSS's: a FLUSH leaves RSS as it is.
    run(&mut t, 5, Request::Flush(DelReason::Flush), 2);
    assert_eq!(t.rss().key, cfg.key);
}

/// A new generation puts the RSS defaults back: one `RssSet` event without
/// a seq before `Cleared` (none when they were the defaults already).
#[test]
fn clear_puts_the_rss_defaults_back() {
    use arfs::proto::RssSetOp;
    use arfs::rss::INDIRECTION_LEN;
    use arfs::{Rss, RssConfig};
    let mut t = table(TableConfig::default());
    let mut ev = Vec::new();
    t.clear(&mut |e| ev.push(e));
    assert!(matches!(ev.as_slice(), [TableEvent::Cleared { .. }]));
    let op = RssSetOp::new(&RssConfig {
        key: None,
        indirection: Some([0; INDIRECTION_LEN]),
    });
    run(&mut t, 1, Request::RssSet(Box::new(op)), 4);
    let mut worker = Rss::new(4);
    worker.configure(t.rss());
    assert!(worker.indirection().iter().all(|&q| q == 0));
    ev.clear();
    t.clear(&mut |e| ev.push(e));
    assert!(t.rss().is_default());
    let [TableEvent::RssSet(c), TableEvent::Cleared { .. }] = ev.as_slice() else {
        panic!("{ev:?}")
    };
    assert_eq!((c.seq, c.status), (None, OpStatus::Ok));
    assert_eq!(c.config(), Some(RssConfig::default()));
    assert!(worker.apply(&ev[0]));
    assert_eq!(worker, Rss::new(4));
}

/// The key RSS_SET gives RSS is not the placement model's: a flow's
/// bucket is the default key's hash before and after, and so is the
/// bucket an ADD then takes (the buckets are the device's own hash table).
#[test]
fn an_rss_key_does_not_move_bucket_placement() {
    use arfs::proto::RssSetOp;
    use arfs::rss::KEY_LEN;
    use arfs::RssConfig;
    let cfg = TableConfig {
        buckets: Some((16, 4)),
        ..TableConfig::default()
    };
    let mut t = table(cfg.clone());
    let before: Vec<Option<u32>> = (0..64).map(|i| t.bucket_for(&flow(i))).collect();
    let key = [0xa5; KEY_LEN];
    // The key would move most flows to another bucket if it were used.
    let moved = (0..64)
        .filter(|&i| Toeplitz::new(key).hash_flow(&flow(i)) % 16 != before[i as usize].unwrap())
        .count();
    assert!(moved > 32, "{moved}");
    let op = RssSetOp::new(&RssConfig {
        key: Some(key),
        indirection: None,
    });
    assert_eq!(
        run(&mut t, 1, Request::RssSet(Box::new(op)), 4).0,
        vec![OpStatus::Ok]
    );
    let after: Vec<Option<u32>> = (0..64).map(|i| t.bucket_for(&flow(i))).collect();
    assert_eq!(before, after);
    for i in 0..64 {
        assert_eq!(after[usize::from(i)], Model::bucket(&cfg, &flow(i)));
    }
    run(&mut t, 2, Request::Add(vec![add(1, 0, &flow(3))]), 4);
    assert_eq!(t.entry(1).unwrap().bucket, before[3]);
}

/// A FLUSH(unload) says the driver is going away: with its filters go its
/// rules and its RSS configuration (nobody would be left to see or remove
/// them), each reported with the FLUSH's seq and cause `unload`; any other
/// FLUSH (a reload's, a layout change's) leaves both alone.
#[test]
fn a_flush_of_unload_takes_the_rules_and_the_rss_configuration() {
    use arfs::proto::{RssSetOp, RuleOp};
    use arfs::rss::INDIRECTION_LEN;
    use arfs::table::ExtCause;
    use arfs::{RssConfig, Rule, RuleAction, RuleFlow};
    let mut t = table(TableConfig::default());
    let rule = Rule {
        dport: 4242,
        dport_mask: 0xffff,
        ..Rule::any(3, RuleFlow::Udp4, RuleAction::Queue(1))
    };
    let (st, _) = run(&mut t, 1, Request::RuleSet(vec![RuleOp::new(&rule)]), 4);
    assert_eq!(st, vec![OpStatus::Ok]);
    let op = RssSetOp::new(&RssConfig {
        key: None,
        indirection: Some([0; INDIRECTION_LEN]),
    });
    let (st, _) = run(&mut t, 2, Request::RssSet(Box::new(op)), 4);
    assert_eq!(st, vec![OpStatus::Ok]);

    let (_, ev) = run(&mut t, 3, Request::Flush(DelReason::Flush), 4);
    assert!(
        ev.iter()
            .all(|e| !matches!(e, TableEvent::RuleRemoved { .. } | TableEvent::RssSet(_))),
        "{ev:?}"
    );
    assert_eq!(t.rules().count(), 1);
    assert!(!t.rss().is_default());

    let (_, ev) = run(&mut t, 4, Request::Flush(DelReason::Unload), 4);
    assert_eq!(t.rules().count(), 0);
    assert!(t.rss().is_default());
    let removed: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            TableEvent::RuleRemoved { seq, rule, cause } => Some((*seq, rule.loc, *cause)),
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![(Some(4), 3, ExtCause::Unload)]);
    let rss: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            TableEvent::RssSet(c) => Some((c.seq, c.status, c.cause, c.config())),
            _ => None,
        })
        .collect();
    assert_eq!(
        rss,
        vec![(
            Some(4),
            OpStatus::Ok,
            ExtCause::Unload,
            Some(RssConfig::default())
        )]
    );
    let lines: Vec<_> = ev
        .iter()
        .filter(|e| matches!(e, TableEvent::RuleRemoved { .. } | TableEvent::RssSet(_)))
        .map(|e| arfs::trace::TraceRecord::from_event(1, 1, e).reason)
        .collect();
    assert_eq!(
        lines,
        vec![Some("unload".to_string()), Some("unload".to_string())]
    );
}
