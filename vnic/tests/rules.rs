//! The masked rule stage (`ethtool -N` rules) through the management
//! channel: a driver that says it knows the extension (HELLO
//! `driver_version` 2) gets the longer CAPS with `max_rules`, an older one
//! the 24-byte CAPS it reads; RULE_SET and RULE_DEL take effect for the
//! next frame, a rule decides before a filter for the same flow, `drop`
//! takes the frame (counted, not delivered), refusals come back as ACK
//! statuses, and `ctl table` and the trace show the rules with their hits.

// Test code: d = daemon, g = guest, c = control client, s = stats, t = table.
#![allow(clippy::many_single_char_names)]

mod common;

use std::time::{Duration, Instant};

use arfs::proto::{self, AddOp, RuleOp};
use arfs::{EventKind, Message, OpStatus, Rule, RuleAction, RuleFlow, TraceRecord};
use common::*;
use vnic_frontend::guest::Guest;

fn st(v: &[OpStatus]) -> Vec<u8> {
    v.iter().map(|s| *s as u8).collect()
}

/// HELLO with `driver_version` `v`; the CAPS.
fn hello(g: &mut Guest, v: u32) -> proto::Caps {
    hello_caps(g, v, 0x5eed_0002)
}

/// The statuses of a rule request.
fn rules(g: &mut Guest, m: &Message) -> Vec<u8> {
    let r = g.request(m, T).expect("ACK");
    let Message::Ack(a) = r.message else {
        panic!("not an ACK: {:?}", r.message)
    };
    assert_eq!(a.frame_status, 0, "{a:?}");
    a.statuses
}

/// A rule for UDP to port 5001 from source port `sport`.
fn udp_rule(loc: u32, sport: u16, action: RuleAction) -> Rule {
    let mut r = Rule::any(loc, RuleFlow::Udp4, action);
    r.sport = sport;
    r.sport_mask = 0xffff;
    r.dport = 5001;
    r.dport_mask = 0xffff;
    r
}

#[test]
fn an_older_driver_gets_the_caps_it_reads() {
    let d = daemon(&["--queues", "2"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    wait_stats(&mut c, "2 enabled pairs", |s| s.enabled_pairs == 2);
    let v1 = hello(&mut g, 1);
    assert_eq!(v1.max_rules(), None);
    let v2 = hello(&mut g, 2);
    assert_eq!(v2.max_rules(), Some(128));
    assert_eq!(
        proto::Caps {
            ext: None,
            nonce: v1.nonce,
            ..v2
        },
        v1
    );
    // A device without the rule stage offers nothing to either.
    let d = daemon(&["--queues", "2", "--rule-locations", "0"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    wait_stats(&mut c, "2 enabled pairs", |s| s.enabled_pairs == 2);
    assert_eq!(hello(&mut g, 2).max_rules(), None);
}

#[test]
fn a_rule_decides_before_a_filter_and_goes_with_its_del() {
    let trace = std::env::temp_dir().join(format!("vnic-rules-{}.jsonl", std::process::id()));
    let d = daemon(&["--queues", "2", "--trace", trace.to_str().unwrap()]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    wait_stats(&mut c, "2 enabled pairs", |s| s.enabled_pairs == 2);
    assert_eq!(hello(&mut g, 2).max_rules(), Some(128));
    // A flow RSS sends to queue 0, and a filter that keeps it there.
    let sport = (20000..=u16::MAX)
        .find(|&p| rss_queue(&gen_flow(p, 5001), 2) == 0)
        .unwrap();
    let ack = g
        .add(vec![AddOp::new(3, 0, &gen_flow(sport, 5001))], T)
        .unwrap();
    assert_eq!(ack.statuses, st(&[OpStatus::Ok]));
    assert!(burst_queues(&mut g, &mut c, sport, 20)
        .iter()
        .all(|&q| q == 0));

    // A rule for the same flow to queue 1: it wins over the filter.
    let rule = udp_rule(5, sport, RuleAction::Queue(1));
    let s = rules(&mut g, &Message::RuleSet(vec![RuleOp::new(&rule)]));
    assert_eq!(s, st(&[OpStatus::Ok]));
    assert!(burst_queues(&mut g, &mut c, sport, 30)
        .iter()
        .all(|&q| q == 1));
    // Another flow to the same port is not the rule's.
    let other = sport.wrapping_add(1);
    assert!(burst_queues(&mut g, &mut c, other, 5)
        .iter()
        .all(|&q| q == rss_queue(&gen_flow(other, 5001), 2)));
    let t = c.table().unwrap();
    assert_eq!(t.rules.len(), 1, "{t:?}");
    assert_eq!(t.rules[0].hits, 30, "{t:?}");
    assert_eq!(t.rules[0].rule["loc"], 5);
    let f = t.filters.iter().find(|f| f.id == 3).unwrap();
    assert_eq!(f.hits, 20, "the filter counts only what it decided");

    // Drop at a lower location: nothing delivered, every frame counted.
    let drop = udp_rule(1, sport, RuleAction::Drop);
    assert_eq!(
        rules(&mut g, &Message::RuleSet(vec![RuleOp::new(&drop)])),
        st(&[OpStatus::Ok])
    );
    let before = c.stats().unwrap().peer.rule_dropped;
    gen_burst(
        &mut c,
        &FlowSpec::new()
            .flows(1)
            .sport(sport.to_string())
            .count(25)
            .rate(10000),
    );
    let s = wait_stats(&mut c, "25 frames dropped by the rule", |s| {
        s.peer.rule_dropped >= before + 25
    });
    assert_eq!(s.peer.rule_dropped, before + 25);
    g.poll();
    assert_eq!(g.stashed(), 0, "a dropped frame reached the guest");

    // Both rules go: the filter decides again.
    assert_eq!(
        rules(&mut g, &Message::RuleDel(vec![1, 5])),
        st(&[OpStatus::Ok, OpStatus::Ok])
    );
    assert!(burst_queues(&mut g, &mut c, sport, 10)
        .iter()
        .all(|&q| q == 0));
    assert!(c.table().unwrap().rules.is_empty());

    // The trace: each rule set and removed with its hits.
    let deadline = Instant::now() + T;
    let lines = loop {
        let lines: Vec<TraceRecord> = std::fs::read_to_string(&trace)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines
            .iter()
            .filter(|r| r.event == EventKind::RuleDel)
            .count()
            == 2
        {
            break lines;
        }
        assert!(Instant::now() < deadline, "{lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let of = |k: EventKind, loc: u32| {
        lines
            .iter()
            .find(|r| r.event == k && r.loc == Some(loc))
            .unwrap_or_else(|| panic!("no {k:?} of {loc}: {lines:?}"))
    };
    assert_eq!(of(EventKind::RuleSet, 5).rule, Some(rule));
    assert_eq!(of(EventKind::RuleDel, 5).hits, Some(30));
    assert_eq!(of(EventKind::RuleDel, 1).hits, Some(25));
    assert_eq!(
        of(EventKind::RuleDel, 1).reason.as_deref(),
        Some("rule_del")
    );
    assert!(g.faults.is_empty(), "{:?}", g.faults);
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn rule_refusals_are_op_statuses() {
    use OpStatus as S;
    let d = daemon(&["--queues", "2"]);
    let mut g = guest(&d, 2, 2);
    let mut c = ctl(&d);
    wait_stats(&mut c, "2 enabled pairs", |s| s.enabled_pairs == 2);
    hello(&mut g, 2);
    let ok = udp_rule(0, 1, RuleAction::Queue(0));
    let past = udp_rule(128, 1, RuleAction::Queue(0));
    let queue = udp_rule(2, 1, RuleAction::Queue(2));
    let mut ports_on_ip = Rule::any(3, RuleFlow::Ip4, RuleAction::Drop);
    ports_on_ip.dport_mask = 1;
    let mut bad_flow = RuleOp::new(&ok);
    bad_flow.loc = 4;
    bad_flow.flow = 9;
    let context = udp_rule(5, 1, RuleAction::Context { ctx: 1, offset: 0 });
    let s = rules(
        &mut g,
        &Message::RuleSet(vec![
            RuleOp::new(&ok),
            RuleOp::new(&past),
            RuleOp::new(&queue),
            RuleOp::new(&ports_on_ip),
            bad_flow,
            RuleOp::new(&context),
        ]),
    );
    assert_eq!(
        s,
        st(&[
            S::Ok,
            S::BadId,
            S::BadQueue,
            S::BadKey,
            S::BadKey,
            S::BadKey
        ])
    );
    assert_eq!(
        rules(&mut g, &Message::RuleDel(vec![7, 0, 0, 4096])),
        st(&[S::UnknownId, S::Ok, S::UnknownId, S::BadId])
    );
    // A reconnect (a new generation) takes the rules with the table.
    assert_eq!(
        rules(&mut g, &Message::RuleSet(vec![RuleOp::new(&ok)])),
        st(&[S::Ok])
    );
    drop(g);
    wait_stats(&mut c, "disconnect noticed", |s| !s.connected);
    let mut g = guest(&d, 2, 2);
    hello(&mut g, 2);
    assert!(c.table().unwrap().rules.is_empty());
}
