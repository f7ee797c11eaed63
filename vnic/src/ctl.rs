//! The control protocol (newline-delimited JSON over a unix stream socket,
//! documented in `vnic/CTL.md`, typed in the `vnic-ctl-proto` crate):
//! request handling for the daemon, replies built from `mgmt::Snapshot`
//! after the lock is released. The socket itself is `ctlsock.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use vnic_ctl_proto::{self as wire, GenOp, Reply, Request, RequestError};

use arfs::proto::{DelReason, FrameError, OpStatus};

use crate::clock::now_ns;
use crate::config::{
    rate_threshold, threshold_rate, InvalidValue, Knob, KnobError, PeerKind, RATE_ONE,
};
use crate::conn::Conn;
use crate::daemon::Shared;
use crate::mgmt::Snapshot;
use crate::peer::flows::{FlowSet, FlowSpec, MAX_FLOWS_TOTAL, MAX_SETS};
use crate::virtq::watchdog::{RingView, Seen};

/// An error reply.
pub(crate) fn err(msg: impl Into<String>) -> Value {
    to_value(&Reply::error(msg))
}

/// An `ok` reply with `body`'s fields.
fn ok<T: Serialize>(body: T) -> Value {
    to_value(&Reply::ok(body))
}

/// A reply as a JSON value: serde_json's maps sort their keys, so the
/// bytes on the wire are those of the replies `json!` built before the
/// protocol had types (tests `*_are_pinned`).
fn to_value<T: Serialize>(r: &T) -> Value {
    serde_json::to_value(r).unwrap_or_else(|e| {
        // (An error reply of a string always encodes.)
        serde_json::to_value(Reply::error(format!("cannot encode the reply: {e}")))
            .unwrap_or(Value::Null)
    })
}

/// `set`'s key, its value as text and the knob they name.
fn set_args(key: &str, value: &wire::SetValue) -> Result<(String, Knob), KnobError> {
    let value = value.as_text();
    let knob = Knob::parse(key, &value)?;
    Ok((value, knob))
}

/// Why [`check_request`] refused a line. The `Display` text is the
/// daemon's error reply to that line.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Not a request: bad JSON, an unknown command, a missing field.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// `set` names no knob, or a value the knob does not take.
    #[error(transparent)]
    Knob(#[from] KnobError),
    /// `gen start`/`gen set` with a flow spec the generator refuses.
    #[error("gen {op}: {source}")]
    Gen {
        op: &'static str,
        source: InvalidValue,
    },
}

/// Checks one request line as far as that needs no daemon: the JSON
/// object, the command, `set`'s key and value, `gen`'s op, id and flow
/// spec (validated against the default addresses and 4 workers). The
/// parsing code is the daemon's own ([`handle_line`] calls the same
/// functions); this is the fuzz target's entry (crate `arfs-fuzz`).
/// Returns the command name.
pub fn check_request(line: &str) -> Result<String, CheckError> {
    let req = Request::from_line(line)?;
    match &req {
        Request::Stats | Request::TraceFlush | Request::Table | Request::Knobs => {}
        Request::Set { key, value } => {
            set_args(key, value)?;
        }
        Request::Gen { op, id, flow } => {
            if matches!(op, GenOp::Start | GenOp::Set) {
                // `vnic serve`'s default --gen-ip and --guest-ip.
                FlowSet::new(
                    id.unwrap_or(1),
                    flow.clone().unwrap_or_default(),
                    std::net::Ipv4Addr::new(10, 0, 2, 1),
                    std::net::Ipv4Addr::new(10, 0, 2, 15),
                    4,
                )
                .map_err(|source| CheckError::Gen {
                    op: op.name(),
                    source,
                })?;
            }
        }
    }
    Ok(req.cmd().to_string())
}

/// Answers one request line.
pub(crate) fn handle_line(sh: &Shared, line: &str) -> Value {
    let req = match Request::from_line(line) {
        Ok(r) => r,
        // A gen request is refused for want of the gen peer before its
        // own faults are looked at.
        Err(e) if e.is_gen() && sh.cfg.peer != PeerKind::Gen => {
            return err("gen commands need --peer gen")
        }
        Err(e) => return err(e.to_string()),
    };
    match req {
        Request::Stats => ok(wire::StatsReply { stats: stats(sh) }),
        // Everything traced before this request is in the file when the
        // reply comes (the writer otherwise flushes when idle for 50 ms).
        Request::TraceFlush => {
            if sh.tracer.flush(Duration::from_secs(5)) {
                ok(wire::Empty {})
            } else {
                err("the trace writer did not flush within 5 s")
            }
        }
        Request::Table => {
            let snap = sh.lock_mgmt().snapshot(true);
            ok(wire::TableReply {
                table: table(sh, &snap),
            })
        }
        Request::Knobs => ok(wire::KnobsReply {
            knobs: knobs(sh, &sh.lock_mgmt().snapshot(false)),
        }),
        Request::Set { key, value } => {
            let (value, knob) = match set_args(&key, &value) {
                Ok(a) => a,
                Err(e) => return err(e.to_string()),
            };
            let path = match knob {
                Knob::Misroute(on) => Some((&sh.faults.misroute, if on { RATE_ONE } else { 0 })),
                Knob::MisrouteRate(p) => Some((&sh.faults.misroute, rate_threshold(p))),
                Knob::DropRate(p) => Some((&sh.faults.drop, rate_threshold(p))),
                Knob::CorruptRate(p) => Some((&sh.faults.corrupt, rate_threshold(p))),
                Knob::BadCsumRate(p) => Some((&sh.faults.bad_csum, rate_threshold(p))),
                Knob::TruncateRate(p) => Some((&sh.faults.truncate, rate_threshold(p))),
                Knob::ReorderRate(p) => Some((&sh.faults.reorder, rate_threshold(p))),
                Knob::DelayEffectMs(ms) => {
                    Some((&sh.faults.delay_effect_ns, u64::from(ms) * 1_000_000))
                }
                _ => None,
            };
            let r = if let Some((f, t)) = path {
                f.store(t, Ordering::Relaxed);
                Ok(sh.lock_mgmt().snapshot(false))
            } else {
                let mut m = sh.lock_mgmt();
                m.set_knob(knob).map(|()| m.snapshot(false))
            };
            match r {
                Ok(snap) => {
                    log::info!("knob {key} = {value}");
                    ok(wire::KnobsReply {
                        knobs: knobs(sh, &snap),
                    })
                }
                Err(e) => err(format!("{key}: {e}")),
            }
        }
        Request::Gen { op, id, flow } => gen_cmd(sh, op, id, flow),
    }
}

fn gen_cmd(sh: &Shared, op: GenOp, id: Option<u32>, flow: Option<FlowSpec>) -> Value {
    if sh.cfg.peer != PeerKind::Gen {
        return err("gen commands need --peer gen");
    }
    let g = &sh.gen;
    let reply = {
        let mut sets = g
            .sets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match op {
            GenOp::List => {
                return ok(wire::GenList {
                    flows: sets.1.iter().map(|s| s.to_wire()).collect(),
                })
            }
            GenOp::Start => {
                let spec = flow.unwrap_or_default();
                if sets.1.len() >= MAX_SETS {
                    return err(format!(
                        "gen start: {MAX_SETS} flow sets are live already (gen stop some)"
                    ));
                }
                let live: u64 = sets.1.iter().map(|s| s.tuples.len() as u64).sum();
                let want = u64::from(spec.flows.unwrap_or(1));
                if live + want > MAX_FLOWS_TOTAL {
                    return err(format!(
                        "gen start: {want} more flows would make {} over all sets, more than {MAX_FLOWS_TOTAL}",
                        live + want
                    ));
                }
                let nid = sets.0 + 1;
                match FlowSet::new(nid, spec, sh.cfg.gen_ip, sh.cfg.guest_ip, sh.pairs()) {
                    Ok(s) => {
                        sets.0 = nid;
                        sets.1.push(Arc::new(s));
                        ok(wire::GenStarted { id: nid })
                    }
                    Err(e) => return err(format!("gen start: {e}")),
                }
            }
            GenOp::Set => {
                let Some(id) = id else {
                    return err(RequestError::GenSetNeedsId.to_string());
                };
                let Some(pos) = sets.1.iter().position(|s| s.id == id) else {
                    return err(format!("gen set: no flow set {id}"));
                };
                let spec = sets.1[pos].spec.merged(&flow.unwrap_or_default());
                let others: u64 = sets
                    .1
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != pos)
                    .map(|(_, s)| s.tuples.len() as u64)
                    .sum();
                let want = u64::from(spec.flows.unwrap_or(1));
                if others + want > MAX_FLOWS_TOTAL {
                    return err(format!(
                        "gen set: {want} flows would make {} over all sets, more than {MAX_FLOWS_TOTAL}",
                        others + want
                    ));
                }
                match FlowSet::new(id, spec, sh.cfg.gen_ip, sh.cfg.guest_ip, sh.pairs()) {
                    Ok(s) => {
                        sets.1[pos].stopped.store(true, Ordering::Relaxed);
                        let s = Arc::new(s);
                        let flow = s.to_wire();
                        sets.1[pos] = s;
                        ok(wire::GenChanged { flow })
                    }
                    Err(e) => return err(format!("gen set: {e}")),
                }
            }
            GenOp::Pause | GenOp::Resume => {
                // A paused set stays listed (with its final `sent`) and
                // keeps its sequence numbers: resumed, it goes on where it
                // stopped.
                let pause = op == GenOp::Pause;
                let mut done = Vec::new();
                for s in sets.1.iter().filter(|s| id.is_none_or(|i| i == s.id)) {
                    s.stopped.store(pause, Ordering::Relaxed);
                    done.push(s.id);
                }
                if let (Some(id), true) = (id, done.is_empty()) {
                    return err(format!("gen {}: no flow set {id}", op.name()));
                }
                if pause {
                    ok(wire::GenPaused { pause: done })
                } else {
                    ok(wire::GenResumed { resume: done })
                }
            }
            GenOp::Stop => {
                let stopped: Vec<u32> = match id {
                    Some(id) => {
                        let Some(pos) = sets.1.iter().position(|s| s.id == id) else {
                            return err(format!("gen stop: no flow set {id}"));
                        };
                        let s = sets.1.remove(pos);
                        s.stopped.store(true, Ordering::Relaxed);
                        vec![id]
                    }
                    None => sets
                        .1
                        .drain(..)
                        .map(|s| {
                            s.stopped.store(true, Ordering::Relaxed);
                            s.id
                        })
                        .collect(),
                };
                ok(wire::GenStopped { stopped })
            }
        }
    };
    g.bump();
    if let Some(c) = sh.current_conn() {
        c.lanes.wake_all();
    }
    reply
}

/// The `stats` object (shape in CTL.md).
pub(crate) fn stats(sh: &Shared) -> wire::Stats {
    let (conn, snap) = {
        let m = sh.lock_mgmt();
        (m.conn(), m.snapshot(false))
    };
    let kind = match &sh.cfg.peer {
        PeerKind::Gen => "gen".to_string(),
        PeerKind::Tap(n) => format!("tap:{n}"),
    };
    wire::Stats {
        generation: sh.generation(),
        uptime_s: sh.start.elapsed().as_secs_f64(),
        connected: sh.connected.load(Ordering::Relaxed),
        connections: sh.connections.load(Ordering::Relaxed),
        queue_pairs: sh.cfg.queues,
        // Pairs RSS spreads over, CAPS reports and ops are checked against.
        enabled_pairs: conn.as_ref().map_or(0, |c| c.pairs.count()),
        queues: sh
            .stats
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| q.to_wire(i))
            .collect(),
        mgmt: mgmt(sh, &snap),
        table: table_stats(&snap),
        peer: sh.stats.peer.to_wire(kind),
        trace: sh.tracer.to_wire(),
        ctl: sh.stats.ctl.to_wire(),
        vhost: sh.stats.vhost.to_wire(),
        rings: conn.as_ref().map(|c| rings(c)),
    }
}

/// The rings as the connection's last 50 ms look saw them (see CTL.md):
/// where a stuck queue shows.
fn rings(c: &Conn) -> wire::Rings {
    rings_seen(
        &c.watchdog.seen(),
        c.watchdog.nudges.load(Ordering::Relaxed),
        now_ns(),
    )
}

fn rings_seen(seen: &Seen, nudges: u64, now: u64) -> wire::Rings {
    let ring = |r: &RingView| wire::Ring {
        enabled: r.enabled,
        ready: r.ready,
        event_idx: r.event_idx,
        avail: r.avail,
        next_avail: r.next_avail,
        next_used: r.next_used,
        used_event: r.used_event,
        nudged: r.nudged,
    };
    wire::Rings {
        age_ms: (seen.at_ns > 0).then(|| now.saturating_sub(seen.at_ns) / 1_000_000),
        watchdog_nudges: nudges,
        pairs: seen
            .rings
            .iter()
            .map(|p| {
                p.as_ref().map(|[rx, tx]| wire::RingPair {
                    rx: ring(rx),
                    tx: ring(tx),
                })
            })
            .collect(),
    }
}

fn knobs(sh: &Shared, s: &Snapshot) -> wire::Knobs {
    let c = &s.table;
    wire::Knobs {
        misroute: sh.faults.misroute.load(Ordering::Relaxed) == RATE_ONE,
        misroute_rate: threshold_rate(sh.faults.misroute.load(Ordering::Relaxed)),
        drop_rate: threshold_rate(sh.faults.drop.load(Ordering::Relaxed)),
        corrupt_rate: threshold_rate(sh.faults.corrupt.load(Ordering::Relaxed)),
        bad_csum_rate: threshold_rate(sh.faults.bad_csum.load(Ordering::Relaxed)),
        truncate_rate: threshold_rate(sh.faults.truncate.load(Ordering::Relaxed)),
        reorder_rate: threshold_rate(sh.faults.reorder.load(Ordering::Relaxed)),
        delay_effect_ms: sh.faults.delay_effect_ns.load(Ordering::Relaxed) / 1_000_000,
        wrong_trace: s.wrong_trace,
        rogue_responder: s.rogue,
        rogue_nonce: s.rogue_nonce,
        drop_acks: s.drop_acks,
        forge_acks: s.forge_acks,
        add_fail_rate: c.add_fail_rate,
        mgmt_loss_rate: c.mgmt_loss_rate,
        program_latency_us: c.latency_ns as f64 / 1000.0,
        capacity: c.capacity,
        buckets: c.buckets.map_or(0, |b| b.0),
        ways: c.buckets.map_or(0, |b| b.1),
        max_ops: s.max_ops,
    }
}

fn mgmt(sh: &Shared, s: &Snapshot) -> wire::MgmtStats {
    let c = &s.counters;
    let bad = |e: FrameError| c.bad[usize::from(e.code())];
    let frames_bad = wire::FramesBad {
        too_short: bad(FrameError::TooShort),
        bad_magic: bad(FrameError::BadMagic),
        bad_version: bad(FrameError::BadVersion),
        unknown_type: bad(FrameError::UnknownType),
        wrong_direction: bad(FrameError::WrongDirection),
        bad_length: bad(FrameError::BadLength),
        too_many_ops: bad(FrameError::TooManyOps),
        bad_reason: bad(FrameError::BadReason),
        reserved_nonzero: bad(FrameError::ReservedNonzero),
        bad_count: bad(FrameError::BadCount),
    };
    wire::MgmtStats {
        frames_rx: c.frames_rx,
        frames_ok: c.frames_ok,
        frames_bad_total: FrameError::ALL.iter().map(|&e| bad(e)).sum(),
        frames_bad,
        acks_sent: c.acks_sent,
        caps_sent: c.caps_sent,
        rogue_sent: c.rogue_sent,
        forged_sent: c.forged_sent,
        wrong_traced: c.wrong_traced,
        dst: wire::MgmtDst {
            hello_to_group: c.dst.hello_to_group,
            to_device: c.dst.to_device,
            to_broadcast: c.dst.to_broadcast,
            to_other: c.dst.to_other,
        },
        naks_sent: c.naks_sent,
        dropped_by_loss: c.dropped_by_loss,
        replies_dropped_by_loss: c.replies_dropped_by_loss,
        replies_dropped_no_buffers: sh.stats.replies_dropped_no_buffers.get(),
        out_of_order: c.out_of_order,
        duplicates: c.duplicates,
        duplicate_reacks: c.duplicate_reacks,
        pending_requests: s.pending as u64,
        expected_seq: s.expected_seq,
    }
}

/// The table's counters. Not its lookup counters: the workers look flows
/// up in their replicas and count hits their own way (per filter,
/// `Hits`; per queue, `rx_filter` / `rx_rss`), so the table's would only
/// ever say 0.
fn table_stats(s: &Snapshot) -> wire::TableStats {
    let t = &s.table_counters;
    let del = |r: DelReason| t.deletes.get(r);
    let rej = |st: OpStatus| match st {
        OpStatus::TableFull => t.rejects.table_full,
        OpStatus::BucketFull => t.rejects.bucket_full,
        OpStatus::BadQueue => t.rejects.bad_queue,
        OpStatus::BadKey => t.rejects.bad_key,
        OpStatus::InjectedFailure => t.rejects.injected_failure,
        OpStatus::BadId => t.rejects.bad_id,
        OpStatus::Ok | OpStatus::UnknownId => 0,
    };
    wire::TableStats {
        live: s.live as u64,
        capacity: s.capacity,
        adds: t.adds,
        replaces: t.replaces,
        unchanged: t.unchanged,
        deletes: wire::Deletes {
            expired: del(DelReason::Expired),
            idle: del(DelReason::Idle),
            replaced: del(DelReason::Replaced),
            flush: del(DelReason::Flush),
            unload: del(DelReason::Unload),
            aged: del(DelReason::Aged),
        },
        rejects: wire::Rejects {
            table_full: rej(OpStatus::TableFull),
            bucket_full: rej(OpStatus::BucketFull),
            bad_queue: rej(OpStatus::BadQueue),
            bad_key: rej(OpStatus::BadKey),
            injected_failure: rej(OpStatus::InjectedFailure),
            bad_id: rej(OpStatus::BadId),
        },
        unknown_deletes: t.unknown_deletes,
        flushes: t.flushes,
        resets: t.resets,
        requests: t.requests,
        generation_changes: s.counters.generation_changes,
    }
}

/// A filter's flow as the protocol carries it.
fn flow(k: &arfs::FlowKey) -> wire::Flow {
    wire::Flow {
        family: match k.family() {
            arfs::IpFamily::Ipv4 => wire::Family::Ipv4,
            arfs::IpFamily::Ipv6 => wire::Family::Ipv6,
        },
        proto: match k.proto() {
            arfs::L4Proto::Tcp => wire::L4::Tcp,
            arfs::L4Proto::Udp => wire::L4::Udp,
        },
        src: k.src_ip(),
        dst: k.dst_ip(),
        sport: k.src_port(),
        dport: k.dst_port(),
    }
}

fn table(sh: &Shared, s: &Snapshot) -> wire::Table {
    wire::Table {
        generation: sh.generation(),
        live: s.live as u64,
        capacity: s.capacity,
        filters: s
            .filters
            .iter()
            .map(|(e, hits)| wire::Filter {
                id: e.id,
                rxq: e.rxq,
                hits: *hits,
                installed_ns: e.installed_ns,
                bucket: e.bucket,
                flow: flow(&e.flow),
            })
            .collect(),
        rules: s
            .rules
            .iter()
            .map(|(r, hits)| wire::RuleEntry {
                rule: serde_json::to_value(r).unwrap_or_default(),
                hits: *hits,
            })
            .collect(),
        rss: Some(rss(&s.rss, s.enabled_pairs)),
    }
}

/// The RSS configuration as `table` shows it, with the table frames
/// follow over `enabled` pairs.
fn rss(c: &arfs::RssConfig, enabled: u16) -> wire::RssState {
    wire::RssState {
        default_key: c.key.is_none(),
        key: arfs::rss::key_to_hex(&c.key_or_default()),
        default_indir: c.indirection.is_none(),
        indir: c.indirection.map(|t| t.to_vec()),
        effective: arfs::rss::effective_indirection(c.indirection.as_ref(), enabled).to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::check_request;
    use serde::Serialize;
    use serde_json::Value;
    use vnic_ctl_proto::{self as wire, GenOp, Reply, Request};

    use arfs::proto::{DelReason, FrameError, OpStatus};

    #[test]
    fn check_request_takes_what_the_daemon_takes_and_says_why_not() {
        for ok in [
            r#"{"cmd":"stats"}"#,
            r#"{"cmd":"set","key":"add_fail_rate","value":0.5}"#,
            r#"{"cmd":"gen","op":"start","flow":{"flows":10,"sport":"10000-10009"}}"#,
            r#"{"cmd":"gen","op":"stop"}"#,
        ] {
            assert!(check_request(ok).is_ok(), "{ok}: {:?}", check_request(ok));
        }
        for (bad, why) in [
            ("{", "bad request"),
            (r#"{"cmd":"stats","extra":1}"#, "unknown field"),
            (r#"{"cmd":"nope"}"#, "unknown command \"nope\""),
            (
                r#"{"cmd":"set","key":"add_fail_rate"}"#,
                "set needs \"value\"",
            ),
            (
                r#"{"cmd":"set","key":"no_such_knob","value":1}"#,
                "no_such_knob",
            ),
            (r#"{"cmd":"gen"}"#, "gen needs \"op\""),
            (
                r#"{"cmd":"gen","op":"set","flow":{}}"#,
                "gen set needs \"id\"",
            ),
            (
                r#"{"cmd":"gen","op":"start","flow":{"flows":0}}"#,
                "gen start: flows must be",
            ),
        ] {
            let e = check_request(bad).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// The connection as the control socket (`enabled_pairs` in `stats`)
    /// and the management path (CAPS, preload, op checks) see it: the
    /// same, while connected and after the frontend went away.
    #[test]
    fn stats_and_management_agree_on_the_connection_after_a_disconnect() {
        let sh = shared();
        let conn = std::sync::Arc::new(crate::conn::Conn::new(2).unwrap());
        conn.pairs.observe(0, true, true);
        conn.pairs.observe(1, true, true);
        // As serve_one installs a connection ...
        sh.lock_mgmt().reset(Some(conn.clone()), "connect");
        let views = |sh: &crate::daemon::Shared| {
            (
                u64::from(super::stats(sh).enabled_pairs),
                u64::from(sh.lock_mgmt().enabled_pairs()),
            )
        };
        assert_eq!(views(&sh), (2, 2));
        // ... and ends it once its workers are gone.
        sh.lock_mgmt().disconnect();
        let (stats, mgmt) = views(&sh);
        assert_eq!(
            stats, mgmt,
            "after the disconnect: ctl stats says {stats} enabled pairs, the management path {mgmt}"
        );
        assert_eq!(stats, 0);
    }

    /// The daemon's state of `vnic serve --queues 2` (no socket, no tap).
    fn shared() -> std::sync::Arc<crate::daemon::Shared> {
        shared_with(&[])
    }

    /// The same with more `vnic serve` arguments.
    fn shared_with(extra: &[&str]) -> std::sync::Arc<crate::daemon::Shared> {
        use clap::Parser;
        let args = [
            "vnic",
            "serve",
            "--socket",
            "/nonexistent/vnic.sock",
            "--queues",
            "2",
        ];
        let crate::cli::Command::Serve(a) =
            crate::cli::Cli::try_parse_from(args.iter().chain(extra))
                .unwrap()
                .command
        else {
            panic!()
        };
        crate::daemon::Shared::build(a.into_config()).unwrap()
    }

    /// Hits are the workers' (per filter, per queue): `stats` shows no
    /// table lookup counters that nothing feeds.
    #[test]
    fn stats_table_has_no_dead_lookup_counters() {
        let s = serde_json::to_value(super::stats(&shared())).unwrap();
        let t = s["table"].as_object().unwrap();
        assert!(
            t.contains_key("requests") && t.contains_key("live"),
            "{t:?}"
        );
        assert!(!t.contains_key("lookup_hits"), "{t:?}");
        assert!(!t.contains_key("lookup_misses"), "{t:?}");
    }

    // ---- The wire format, pinned ----
    //
    // The replies of a daemon state with a distinct value in every counter,
    // compared key for key (and value type for value type) with the files
    // in `vnic/tests/ctl-wire/`. Those files were written by the daemon
    // that built its replies with `json!` (before `vnic-ctl-proto`), with
    // `VNIC_CTL_WIRE_BLESS=1`; they are not to be rewritten for a change
    // that claims to keep the wire.

    fn render_stats(sh: &crate::daemon::Shared) -> serde_json::Value {
        serde_json::to_value(super::stats(sh)).unwrap()
    }

    fn render_mgmt(sh: &crate::daemon::Shared, s: &crate::mgmt::Snapshot) -> serde_json::Value {
        serde_json::to_value(super::mgmt(sh, s)).unwrap()
    }

    fn render_table_stats(s: &crate::mgmt::Snapshot) -> serde_json::Value {
        serde_json::to_value(super::table_stats(s)).unwrap()
    }

    fn render_knobs(sh: &crate::daemon::Shared, s: &crate::mgmt::Snapshot) -> serde_json::Value {
        serde_json::to_value(super::knobs(sh, s)).unwrap()
    }

    fn render_table(sh: &crate::daemon::Shared, s: &crate::mgmt::Snapshot) -> serde_json::Value {
        serde_json::to_value(super::table(sh, s)).unwrap()
    }

    fn render_rings(
        seen: &crate::virtq::watchdog::Seen,
        nudges: u64,
        now: u64,
    ) -> serde_json::Value {
        serde_json::to_value(super::rings_seen(seen, nudges, now)).unwrap()
    }

    /// Zeroes what changes from run to run (`generation`, `uptime_s`).
    fn steady(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if k == "generation" || k == "uptime_s" {
                        *x = serde_json::json!(0);
                    } else {
                        steady(x);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(steady),
            _ => {}
        }
    }

    fn pinned(name: &str, mut actual: serde_json::Value) {
        steady(&mut actual);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/ctl-wire")
            .join(format!("{name}.json"));
        if std::env::var_os("VNIC_CTL_WIRE_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut text = serde_json::to_string_pretty(&actual).unwrap();
            text.push('\n');
            std::fs::write(&path, text).unwrap();
            return;
        }
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let want: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            actual, want,
            "{name}: the reply changed on the wire\n got: {actual:#}\nwant: {want:#}"
        );
        // Same bytes on the wire too (serde_json's maps sort their keys).
        assert_eq!(actual.to_string(), want.to_string(), "{name}");
    }

    /// Shared of `vnic serve --queues 2` with a distinct value in every
    /// counter `stats` shows.
    fn counted() -> std::sync::Arc<crate::daemon::Shared> {
        use crate::stats::BadTx;
        use std::sync::atomic::Ordering::Relaxed;
        let sh = shared();
        let mut n = 100u64;
        let mut next = || {
            n += 1;
            n
        };
        for q in 0..2 {
            let owner = sh.stats.claim(q);
            let w = owner.writer();
            w.add(|q| &q.rx_packets, next());
            w.add(|q| &q.rx_bytes, next());
            w.add(|q| &q.rx_drops_too_big, next());
            w.add(|q| &q.rx_filter, next());
            w.add(|q| &q.rx_rss, next());
            w.add(|q| &q.tx_packets, next());
            w.add(|q| &q.tx_bytes, next());
            w.add(|q| &q.tx_spins, next());
            w.add(|q| &q.tx_spins_found, next());
            w.add(|q| &q.tx_spin_ns, next());
            w.add(|q| &q.rx_bad_chains, next());
            // Counters added to the wire later: values of their own, so
            // the pinned values of the others stay as they were.
            w.add(|q| &q.rx_plain, 1001 + 10 * q as u64);
            w.add(|q| &q.rx_store_switches, 1002 + 10 * q as u64);
            w.add(|q| &q.rx_spins, 1003 + 10 * q as u64);
            w.add(|q| &q.rx_spins_found, 1004 + 10 * q as u64);
            w.add(|q| &q.rx_spin_ns, 1005 + 10 * q as u64);
            for (i, r) in BadTx::ALL.iter().enumerate() {
                for _ in 0..=(i + q) {
                    w.count_bad_tx(*r);
                }
            }
            let qs = &sh.stats.queues[q];
            qs.rx_drops_no_buffers.add(next());
            qs.rx_drops_ring_full.add(next());
            qs.rx_drops_disabled.add(next());
            qs.tx_drops.add(next());
            for c in qs.rx_stops.iter().chain(&qs.tx_stops) {
                c.add(next());
            }
            qs.rx_stopped.store(u64::from(q == 0), Relaxed);
            qs.tx_stopped.store(if q == 0 { 0 } else { 2 }, Relaxed);
        }
        let p = &sh.stats.peer;
        for c in [
            &p.spoofed_mgmt_dropped,
            &p.unparsable,
            &p.misrouted,
            &p.fault_dropped,
            &p.fault_corrupted,
            &p.fault_bad_csum,
            &p.fault_truncated,
            &p.fault_reordered,
            &p.fault_delayed,
            &p.gen_sent,
            &p.sink_packets,
            &p.sink_bytes,
            &p.arp_replies,
            &p.icmp_echo_replies,
            &p.nd_replies,
            &p.tap_tx,
            &p.tap_rx,
            &p.tap_tx_errors,
        ] {
            c.add(next());
        }
        p.rtt.record(1_000, 1_500);
        p.rtt.record(1_000, 9_000);
        p.rtt.record(1_000, 9_100);
        p.rtt.record(2_000, 1_000);
        sh.stats.replies_dropped_no_buffers.add(next());
        p.rule_dropped.add(9_001);
        let c = &sh.stats.ctl;
        for a in [&c.clients, &c.refused, &c.dropped_slow, &c.lines_too_long] {
            a.store(next(), Relaxed);
        }
        sh.connections.store(next(), Relaxed);
        sh.connected.store(true, Relaxed);
        // Refusal reason i counted i + 1 times.
        for (i, r) in crate::stats::Refusal::ALL.iter().enumerate() {
            for _ in 0..=i {
                sh.stats.vhost.count(*r);
            }
        }
        {
            let mut m = sh.lock_mgmt();
            m.c = mgmt_counters(&mut next);
        }
        sh
    }

    fn mgmt_counters(next: &mut impl FnMut() -> u64) -> crate::mgmt::MgmtCounters {
        let mut c = crate::mgmt::MgmtCounters::default();
        for b in &mut c.bad {
            *b = next();
        }
        c.frames_rx = next();
        c.frames_ok = next();
        c.acks_sent = next();
        c.caps_sent = next();
        c.rogue_sent = next();
        c.forged_sent = next();
        c.wrong_traced = next();
        c.dst.hello_to_group = next();
        c.dst.to_device = next();
        c.dst.to_broadcast = next();
        c.dst.to_other = next();
        c.naks_sent = next();
        c.dropped_by_loss = next();
        c.replies_dropped_by_loss = next();
        c.out_of_order = next();
        c.duplicates = next();
        c.duplicate_reacks = next();
        c.generation_changes = next();
        c
    }

    /// A snapshot with a distinct value everywhere, two filters.
    fn snapshot() -> crate::mgmt::Snapshot {
        let mut n = 500u64;
        let mut next = || {
            n += 1;
            n
        };
        let mut t = arfs::table::Counters::default();
        for c in [
            &mut t.adds,
            &mut t.replaces,
            &mut t.unchanged,
            &mut t.deletes.expired,
            &mut t.deletes.idle,
            &mut t.deletes.replaced,
            &mut t.deletes.flush,
            &mut t.deletes.unload,
            &mut t.deletes.aged,
            &mut t.rejects.table_full,
            &mut t.rejects.bucket_full,
            &mut t.rejects.bad_queue,
            &mut t.rejects.bad_key,
            &mut t.rejects.injected_failure,
            &mut t.rejects.bad_id,
            &mut t.unknown_deletes,
            &mut t.flushes,
            &mut t.resets,
            &mut t.requests,
            &mut t.lookup_hits,
            &mut t.lookup_misses,
        ] {
            *c = next();
        }
        let table = arfs::table::TableConfig {
            capacity: 4096,
            buckets: Some((64, 2)),
            latency_ns: 2_500,
            add_fail_rate: 0.125,
            mgmt_loss_rate: 0.5,
            ..arfs::table::TableConfig::default()
        };
        let f4 = arfs::FlowKey::v4(
            arfs::L4Proto::Udp,
            "10.0.2.1".parse().unwrap(),
            10000,
            "10.0.2.15".parse().unwrap(),
            5001,
        );
        let f6 = arfs::FlowKey::v6(
            arfs::L4Proto::Tcp,
            "fd00::1".parse().unwrap(),
            443,
            "fd00::2".parse().unwrap(),
            40000,
        );
        let entry = |id, rxq, flow, installed_ns, bucket| arfs::table::Entry {
            id,
            rxq,
            flow,
            hits: 0,
            last_hit_ns: None,
            installed_ns,
            bucket,
        };
        crate::mgmt::Snapshot {
            counters: mgmt_counters(&mut next),
            table_counters: t,
            table,
            live: 2,
            capacity: 4096,
            pending: 3,
            expected_seq: Some(6),
            max_ops: 64,
            rogue: true,
            rogue_nonce: false,
            drop_acks: 0,
            forge_acks: false,
            wrong_trace: false,
            filters: vec![
                (entry(7, 1, f4, 1_206_565_407, None), 120),
                (entry(9, 0, f6, 1_206_600_000, Some(33)), 0),
            ],
            rules: Vec::new(),
            // A driver's table naming pairs 0..4 with 2 enabled: its 2s
            // and 3s fall back to round-robin in `effective`.
            rss: arfs::RssConfig {
                key: None,
                indirection: Some(core::array::from_fn(|i| (i % 4) as u16)),
            },
            enabled_pairs: 2,
        }
    }

    #[test]
    fn stats_are_pinned() {
        let sh = counted();
        pinned("stats", render_stats(&sh));
        // With a connection: `enabled_pairs` and `rings`.
        let conn = std::sync::Arc::new(crate::conn::Conn::new(2).unwrap());
        conn.pairs.observe(0, true, true);
        sh.lock_mgmt().reset(Some(conn), "connect");
        let mut v = render_stats(&sh);
        // `reset` moved the generation counters: only the connection's parts.
        pinned(
            "stats-connected",
            serde_json::json!({"enabled_pairs": v["enabled_pairs"].take(), "rings": v["rings"].take()}),
        );
    }

    #[test]
    fn stats_parts_are_pinned() {
        let sh = shared();
        let s = snapshot();
        pinned("mgmt", render_mgmt(&sh, &s));
        pinned("table-stats", render_table_stats(&s));
        pinned("knobs", render_knobs(&sh, &s));
        pinned("table", render_table(&sh, &s));
        let view = |i: u16, on: bool| crate::virtq::watchdog::RingView {
            enabled: on,
            ready: true,
            event_idx: !on,
            avail: if on { Some(10 + i) } else { None },
            next_avail: 20 + i,
            next_used: 30 + i,
            used_event: if on { None } else { Some(40 + i) },
            nudged: on,
        };
        let seen = crate::virtq::watchdog::Seen {
            at_ns: 5_000_000,
            rings: vec![Some([view(1, true), view(2, false)]), None],
        };
        pinned("rings", render_rings(&seen, 4, 36_000_000));
        let none = crate::virtq::watchdog::Seen::default();
        pinned("rings-unseen", render_rings(&none, 0, 36_000_000));
    }

    /// Every command's reply as `handle_line` answers it, errors included.
    #[test]
    fn replies_are_pinned() {
        let sh = shared();
        let mut out = Vec::new();
        for line in [
            r#"{"cmd":"knobs"}"#,
            r#"{"cmd":"set","key":"misroute_rate","value":0.25}"#,
            r#"{"cmd":"set","key":"program_latency","value":"2ms"}"#,
            r#"{"cmd":"set","key":"drop_rate","value":"0.5"}"#,
            r#"{"cmd":"set","key":"buckets","value":"64x2"}"#,
            r#"{"cmd":"set","key":"rogue_responder","value":1}"#,
            r#"{"cmd":"set","key":"add_fail_rate","value":2}"#,
            r#"{"cmd":"set","key":"add_fail_rate","value":true}"#,
            r#"{"cmd":"set","value":1}"#,
            r#"{"cmd":"table"}"#,
            r#"{"cmd":"trace_flush"}"#,
            r#"{"cmd":"gen","op":"start","flow":{"flows":3,"count":5,"sport":"7000-7002","stamp":true,"size":128}}"#,
            r#"{"cmd":"gen","op":"start"}"#,
            r#"{"cmd":"gen","op":"start","flow":{"flows":0}}"#,
            r#"{"cmd":"gen","op":"set","id":2,"flow":{"rate":50,"dport":"6000-6001","flows":2}}"#,
            r#"{"cmd":"gen","op":"set","id":5,"flow":{}}"#,
            r#"{"cmd":"gen","op":"set"}"#,
            r#"{"cmd":"gen","op":"pause","id":1}"#,
            r#"{"cmd":"gen","op":"pause","id":4}"#,
            r#"{"cmd":"gen","op":"list"}"#,
            r#"{"cmd":"gen","op":"resume"}"#,
            r#"{"cmd":"gen","op":"stop","id":1}"#,
            r#"{"cmd":"gen","op":"stop","id":1}"#,
            r#"{"cmd":"gen","op":"stop"}"#,
            r#"{"cmd":"gen","op":"list"}"#,
            r#"{"cmd":"gen","op":"go"}"#,
            r#"{"cmd":"gen"}"#,
            r#"{"cmd":"nope"}"#,
            r#"{"cmd":"stats","extra":1}"#,
            r#"{"cmd":"gen","op":"start","flow":{"flow":1}}"#,
            "[1]",
            "{",
        ] {
            out.push(serde_json::json!({"request": line, "reply": super::handle_line(&sh, line)}));
        }
        pinned("replies", serde_json::Value::Array(out));
        // A daemon with the tap peer refuses every gen request alike.
        // (Built with the gen peer, no tap opened; then told it is a tap.)
        let mut tap = shared();
        std::sync::Arc::get_mut(&mut tap)
            .expect("one owner")
            .cfg
            .peer = crate::config::PeerKind::Tap("vnic-none".into());
        let mut out = Vec::new();
        for line in [
            r#"{"cmd":"gen","op":"list"}"#,
            r#"{"cmd":"gen","op":"go"}"#,
            r#"{"cmd":"gen"}"#,
            r#"{"cmd":"gen","op":"set"}"#,
        ] {
            out.push(serde_json::json!({"request": line, "reply": super::handle_line(&tap, line)}));
        }
        pinned("replies-tap", serde_json::Value::Array(out));
    }

    /// The pinned replies read into the protocol's types and written back
    /// unchanged: every key the daemon sends is a field of the type, and
    /// every field is a key it sends (an `Option` field it left out would
    /// come back as `null`).
    #[test]
    fn pinned_replies_are_exactly_the_protocols_types() {
        use serde::de::DeserializeOwned;
        fn same<T: DeserializeOwned + Serialize>(name: &str, v: &Value) {
            let t: T =
                serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{name}: {e}\n{v:#}"));
            assert_eq!(&serde_json::to_value(&t).unwrap(), v, "{name}");
        }
        let file = |name: &str| -> Value {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/ctl-wire")
                .join(format!("{name}.json"));
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let mut stats = file("stats");
        // `pinned` wrote the run's uptime as 0; the daemon sends a float.
        stats["uptime_s"] = serde_json::json!(0.0);
        same::<wire::Stats>("stats", &stats);
        same::<wire::MgmtStats>("mgmt", &file("mgmt"));
        same::<wire::TableStats>("table-stats", &file("table-stats"));
        same::<wire::Knobs>("knobs", &file("knobs"));
        same::<wire::Table>("table", &file("table"));
        same::<wire::Rings>("rings", &file("rings"));
        same::<wire::Rings>("rings-unseen", &file("rings-unseen"));
        let connected = file("stats-connected");
        same::<wire::Rings>("stats-connected", &connected["rings"]);
        let mut checked = 0;
        for name in ["replies", "replies-tap"] {
            for r in file(name).as_array().unwrap() {
                let reply = &r["reply"];
                if reply["ok"] != true {
                    same::<Reply<wire::Empty>>(name, reply);
                    checked += 1;
                    continue;
                }
                let req = Request::from_line(r["request"].as_str().unwrap()).unwrap();
                match req {
                    Request::Stats => same::<Reply<wire::StatsReply>>(name, reply),
                    Request::Table => same::<Reply<wire::TableReply>>(name, reply),
                    Request::Knobs | Request::Set { .. } => {
                        same::<Reply<wire::KnobsReply>>(name, reply);
                    }
                    Request::TraceFlush => same::<Reply<wire::Empty>>(name, reply),
                    Request::Gen { op, .. } => match op {
                        GenOp::Start => same::<Reply<wire::GenStarted>>(name, reply),
                        GenOp::Set => same::<Reply<wire::GenChanged>>(name, reply),
                        GenOp::Pause => same::<Reply<wire::GenPaused>>(name, reply),
                        GenOp::Resume => same::<Reply<wire::GenResumed>>(name, reply),
                        GenOp::Stop => same::<Reply<wire::GenStopped>>(name, reply),
                        GenOp::List => same::<Reply<wire::GenList>>(name, reply),
                    },
                }
                checked += 1;
            }
        }
        assert!(checked > 30, "{checked}");
    }

    /// The counters by reason are named fields of the protocol's types:
    /// each reason of the daemon's enums has its field, and no field is
    /// left over (a reason added on one side only fails here).
    #[test]
    fn every_reason_has_its_field() {
        fn keys<T: Serialize + Default>() -> std::collections::BTreeSet<String> {
            match serde_json::to_value(T::default()).unwrap() {
                Value::Object(m) => m.keys().cloned().collect(),
                v => panic!("{v}"),
            }
        }
        let names =
            |it: &mut dyn Iterator<Item = &'static str>| -> std::collections::BTreeSet<String> {
                it.map(str::to_string).collect()
            };
        assert_eq!(
            keys::<wire::FramesBad>(),
            names(&mut FrameError::ALL.iter().map(|e| e.name()))
        );
        assert_eq!(
            keys::<wire::Deletes>(),
            names(&mut DelReason::ALL.iter().map(|r| r.name()))
        );
        assert_eq!(
            keys::<wire::Rejects>(),
            names(
                &mut OpStatus::ALL
                    .iter()
                    .filter(|s| !matches!(s, OpStatus::Ok | OpStatus::UnknownId))
                    .map(|s| s.name())
            )
        );
        let q = keys::<wire::QueueStats>();
        let tx_bad: std::collections::BTreeSet<String> = q
            .iter()
            .filter(|k| k.starts_with("tx_bad_") && *k != "tx_bad_chains" && !k.contains("avail"))
            .cloned()
            .collect();
        let want: std::collections::BTreeSet<String> = crate::stats::BadTx::ALL
            .iter()
            .map(|r| format!("tx_bad_{}", r.name()))
            .collect();
        assert_eq!(tx_bad, want);
        for dir in ["rx", "tx"] {
            for code in 1..=2 {
                let name = crate::stats::RingStop::name_of(code).unwrap();
                assert!(q.contains(&format!("{dir}_bad_{name}")), "{dir} {name}");
            }
            assert_eq!(crate::stats::RingStop::name_of(3), Some("unknown"));
        }
    }
}
