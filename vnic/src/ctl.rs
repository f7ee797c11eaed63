//! The control protocol (newline-delimited JSON over a unix stream socket,
//! documented in `vnic/CTL.md`): request handling for the daemon and a
//! small client.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use arfs::proto::FrameError;

use crate::clock::now_ns;
use crate::config::{rate_threshold, threshold_rate, Knob, PeerKind, RATE_ONE};
use crate::conn::Conn;
use crate::daemon::Shared;
use crate::mgmt::Snapshot;
use crate::peer::flows::{FlowSet, FlowSpec, MAX_FLOWS_TOTAL, MAX_SETS};
use crate::virtq::watchdog::RingView;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Req {
    cmd: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    id: Option<u32>,
    #[serde(default)]
    flow: Option<FlowSpec>,
}

fn err(msg: impl Into<String>) -> Value {
    json!({"ok": false, "error": msg.into()})
}

/// The request object of a line.
fn parse(line: &str) -> Result<Req, String> {
    serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))
}

/// `set`'s key, its value as text and the knob they name.
fn set_args(key: Option<String>, value: Option<Value>) -> Result<(String, String, Knob), String> {
    let Some(key) = key else {
        return Err("set needs \"key\"".into());
    };
    let value = match value {
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err("set needs \"value\" (string or number)".into()),
    };
    let knob = Knob::parse(&key, &value).map_err(|e| e.to_string())?;
    Ok((key, value, knob))
}

/// A `gen` request's op.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GenOp {
    List,
    Start,
    Set,
    Pause,
    Resume,
    Stop,
}

fn gen_op(op: Option<&str>) -> Result<GenOp, String> {
    match op {
        Some("list") => Ok(GenOp::List),
        Some("start") => Ok(GenOp::Start),
        Some("set") => Ok(GenOp::Set),
        Some("pause") => Ok(GenOp::Pause),
        Some("resume") => Ok(GenOp::Resume),
        Some("stop") => Ok(GenOp::Stop),
        Some(o) => Err(format!(
            "unknown gen op {o:?}: expected start, set, pause, resume, stop or list"
        )),
        None => Err("gen needs \"op\"".into()),
    }
}

/// Checks one request line as far as that needs no daemon: the JSON
/// object, the command, `set`'s key and value, `gen`'s op, id and flow
/// spec (validated against the default addresses and 4 workers). The
/// parsing code is the daemon's own ([`handle_line`] calls the same
/// functions); this is the fuzz target's entry (crate `arfs-fuzz`).
/// Returns the command name.
pub fn check_request(line: &str) -> Result<String, String> {
    let req = parse(line)?;
    match req.cmd.as_str() {
        "stats" | "trace_flush" | "table" | "knobs" => {}
        "set" => {
            set_args(req.key, req.value)?;
        }
        "gen" => {
            let op = gen_op(req.op.as_deref())?;
            if matches!(op, GenOp::Set) && req.id.is_none() {
                return Err("gen set needs \"id\"".into());
            }
            if matches!(op, GenOp::Start | GenOp::Set) {
                // `vnic serve`'s default --gen-ip and --guest-ip.
                FlowSet::new(
                    req.id.unwrap_or(1),
                    req.flow.unwrap_or_default(),
                    std::net::Ipv4Addr::new(10, 0, 2, 1),
                    std::net::Ipv4Addr::new(10, 0, 2, 15),
                    4,
                )
                .map_err(|e| {
                    let op = if matches!(op, GenOp::Set) {
                        "set"
                    } else {
                        "start"
                    };
                    format!("gen {op}: {e}")
                })?;
            }
        }
        other => {
            return Err(format!(
                "unknown command {other:?}: expected stats, table, knobs, set or gen"
            ))
        }
    }
    Ok(req.cmd)
}

/// Answers one request line.
pub fn handle_line(sh: &Shared, line: &str) -> Value {
    let req = match parse(line) {
        Ok(r) => r,
        Err(e) => return err(e),
    };
    match req.cmd.as_str() {
        "stats" => json!({"ok": true, "stats": stats_json(sh)}),
        // Everything traced before this request is in the file when the
        // reply comes (the writer otherwise flushes when idle for 50 ms).
        "trace_flush" => {
            if sh.tracer.flush(Duration::from_secs(5)) {
                json!({"ok": true})
            } else {
                err("the trace writer did not flush within 5 s")
            }
        }
        "table" => {
            let snap = sh.lock_mgmt().snapshot(true);
            json!({"ok": true, "table": table_json(sh, &snap)})
        }
        "knobs" => json!({"ok": true, "knobs": knobs_json(sh, &sh.lock_mgmt().snapshot(false))}),
        "set" => {
            let (key, value, knob) = match set_args(req.key, req.value) {
                Ok(a) => a,
                Err(e) => return err(e),
            };
            let path = match knob {
                Knob::Misroute(on) => Some((&sh.faults.misroute, if on { RATE_ONE } else { 0 })),
                Knob::MisrouteRate(p) => Some((&sh.faults.misroute, rate_threshold(p))),
                Knob::DropRate(p) => Some((&sh.faults.drop, rate_threshold(p))),
                Knob::CorruptRate(p) => Some((&sh.faults.corrupt, rate_threshold(p))),
                Knob::BadCsumRate(p) => Some((&sh.faults.bad_csum, rate_threshold(p))),
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
                    json!({"ok": true, "knobs": knobs_json(sh, &snap)})
                }
                Err(e) => err(format!("{key}: {e}")),
            }
        }
        "gen" => gen_cmd(sh, req.op.as_deref(), req.id, req.flow),
        other => err(format!(
            "unknown command {other:?}: expected stats, table, knobs, set or gen"
        )),
    }
}

fn gen_cmd(sh: &Shared, op: Option<&str>, id: Option<u32>, flow: Option<FlowSpec>) -> Value {
    if sh.cfg.peer != PeerKind::Gen {
        return err("gen commands need --peer gen");
    }
    let op = match gen_op(op) {
        Ok(op) => op,
        Err(e) => return err(e),
    };
    let g = &sh.gen;
    let reply = {
        let mut sets = g
            .sets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match op {
            GenOp::List => {
                return json!({"ok": true, "flows": sets.1.iter().map(|s| s.to_json()).collect::<Vec<_>>()})
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
                        json!({"ok": true, "id": nid})
                    }
                    Err(e) => return err(format!("gen start: {e}")),
                }
            }
            GenOp::Set => {
                let Some(id) = id else {
                    return err("gen set needs \"id\"");
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
                        let v = s.to_json();
                        sets.1[pos] = s;
                        json!({"ok": true, "flow": v})
                    }
                    Err(e) => return err(format!("gen set: {e}")),
                }
            }
            GenOp::Pause | GenOp::Resume => {
                // A paused set stays listed (with its final `sent`) and
                // keeps its sequence numbers: resumed, it goes on where it
                // stopped.
                let pause = op == GenOp::Pause;
                let name = if pause { "pause" } else { "resume" };
                let mut done = Vec::new();
                for s in sets.1.iter().filter(|s| id.is_none_or(|i| i == s.id)) {
                    s.stopped.store(pause, Ordering::Relaxed);
                    done.push(s.id);
                }
                if let (Some(id), true) = (id, done.is_empty()) {
                    return err(format!("gen {name}: no flow set {id}"));
                }
                json!({"ok": true, name: done})
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
                json!({"ok": true, "stopped": stopped})
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
pub fn stats_json(sh: &Shared) -> Value {
    let (conn, snap) = {
        let m = sh.lock_mgmt();
        (m.conn(), m.snapshot(false))
    };
    let kind = match &sh.cfg.peer {
        PeerKind::Gen => "gen".to_string(),
        PeerKind::Tap(n) => format!("tap:{n}"),
    };
    json!({
        "generation": sh.generation(),
        "uptime_s": sh.start.elapsed().as_secs_f64(),
        "connected": sh.connected.load(Ordering::Relaxed),
        "connections": sh.connections.load(Ordering::Relaxed),
        "queue_pairs": sh.cfg.queues,
        // Pairs RSS spreads over, CAPS reports and ops are checked against.
        "enabled_pairs": conn.as_ref().map_or(0, |c| c.pairs.count()),
        "queues": sh.stats.queues.iter().enumerate().map(|(i, q)| q.to_json(i)).collect::<Vec<_>>(),
        "mgmt": mgmt_json(sh, &snap),
        "table": table_stats_json(&snap),
        "peer": sh.stats.peer.to_json(&kind),
        "trace": sh.tracer.to_json(),
        "ctl": sh.stats.ctl.to_json(),
        "rings": conn.as_ref().map_or(Value::Null, |c| rings_json(c)),
    })
}

/// The rings as the connection's last 50 ms look saw them (see CTL.md):
/// where a stuck queue shows.
fn rings_json(c: &Conn) -> Value {
    let seen = c.watchdog.seen();
    let ring = |r: &RingView| {
        json!({
            "enabled": r.enabled,
            "ready": r.ready,
            "event_idx": r.event_idx,
            "avail": r.avail,
            "next_avail": r.next_avail,
            "next_used": r.next_used,
            "used_event": r.used_event,
            "nudged": r.nudged,
        })
    };
    json!({
        "age_ms": (seen.at_ns > 0).then(|| now_ns().saturating_sub(seen.at_ns) / 1_000_000),
        "watchdog_nudges": c.watchdog.nudges.load(Ordering::Relaxed),
        "pairs": seen.rings.iter().map(|p| p.as_ref().map_or(Value::Null, |[rx, tx]| {
            json!({"rx": ring(rx), "tx": ring(tx)})
        })).collect::<Vec<_>>(),
    })
}

fn knobs_json(sh: &Shared, s: &Snapshot) -> Value {
    let c = &s.table;
    json!({
        "misroute": sh.faults.misroute.load(Ordering::Relaxed) == RATE_ONE,
        "misroute_rate": threshold_rate(sh.faults.misroute.load(Ordering::Relaxed)),
        "drop_rate": threshold_rate(sh.faults.drop.load(Ordering::Relaxed)),
        "corrupt_rate": threshold_rate(sh.faults.corrupt.load(Ordering::Relaxed)),
        "bad_csum_rate": threshold_rate(sh.faults.bad_csum.load(Ordering::Relaxed)),
        "rogue_responder": s.rogue,
        "add_fail_rate": c.add_fail_rate,
        "mgmt_loss_rate": c.mgmt_loss_rate,
        "program_latency_us": c.latency_ns as f64 / 1000.0,
        "capacity": c.capacity,
        "buckets": c.buckets.map_or(0, |b| b.0),
        "ways": c.buckets.map_or(0, |b| b.1),
        "max_ops": s.max_ops,
    })
}

fn mgmt_json(sh: &Shared, s: &Snapshot) -> Value {
    let c = &s.counters;
    let mut bad = serde_json::Map::new();
    let mut bad_total = 0;
    for code in 1..=10u8 {
        if let Some(k) = FrameError::from_code(code) {
            bad.insert(k.name().to_string(), json!(c.bad[usize::from(code)]));
            bad_total += c.bad[usize::from(code)];
        }
    }
    json!({
        "frames_rx": c.frames_rx,
        "frames_ok": c.frames_ok,
        "frames_bad_total": bad_total,
        "frames_bad": bad,
        "acks_sent": c.acks_sent,
        "caps_sent": c.caps_sent,
        "rogue_sent": c.rogue_sent,
        "dst": {
            "hello_to_group": c.dst.hello_to_group,
            "to_device": c.dst.to_device,
            "to_broadcast": c.dst.to_broadcast,
            "to_other": c.dst.to_other,
        },
        "naks_sent": c.naks_sent,
        "dropped_by_loss": c.dropped_by_loss,
        "replies_dropped_by_loss": c.replies_dropped_by_loss,
        "replies_dropped_no_buffers": sh.stats.replies_dropped_no_buffers.get(),
        "out_of_order": c.out_of_order,
        "duplicates": c.duplicates,
        "duplicate_reacks": c.duplicate_reacks,
        "pending_requests": s.pending,
        "expected_seq": s.expected_seq,
    })
}

/// The table's counters. Not its lookup counters: the workers look flows
/// up in their replicas and count hits their own way (per filter,
/// `Hits`; per queue, `rx_filter` / `rx_rss`), so the table's would only
/// ever say 0.
fn table_stats_json(s: &Snapshot) -> Value {
    let mut v = serde_json::to_value(s.table_counters).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.remove("lookup_hits");
        m.remove("lookup_misses");
        m.insert("live".into(), json!(s.live));
        m.insert("capacity".into(), json!(s.capacity));
        m.insert(
            "generation_changes".into(),
            json!(s.counters.generation_changes),
        );
    }
    v
}

fn table_json(sh: &Shared, s: &Snapshot) -> Value {
    let filters: Vec<Value> = s
        .filters
        .iter()
        .map(|(e, hits)| json!({"id": e.id, "rxq": e.rxq, "flow": e.flow, "hits": hits, "installed_ns": e.installed_ns, "bucket": e.bucket}))
        .collect();
    json!({
        "generation": sh.generation(),
        "live": s.live,
        "capacity": s.capacity,
        "filters": filters,
    })
}

/// Sends one request and returns the reply.
pub fn request(path: &Path, req: &Value) -> Result<Value, CtlError> {
    let io = |source| CtlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(|source| CtlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut line = req.to_string();
    line.push('\n');
    // A daemon that refuses the client (too many clients, another uid)
    // writes its reason and closes, maybe before the request is written:
    // read what it said even when the write failed.
    let wrote = s.write_all(line.as_bytes());
    let mut r = BufReader::new(s);
    let mut out = String::new();
    let read = r.read_line(&mut out);
    if out.is_empty() {
        wrote.map_err(io)?;
        read.map_err(io)?;
        return Err(CtlError::Closed(path.to_path_buf()));
    }
    Ok(serde_json::from_str(&out)?)
}

/// Why `vnic ctl` got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("--ctl {}: cannot connect: {source}", path.display())]
    Connect {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("--ctl {}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("--ctl {}: connection closed without a reply", .0.display())]
    Closed(std::path::PathBuf),
    #[error("bad reply: {0}")]
    BadReply(#[from] serde_json::Error),
    #[error("{0}")]
    Refused(String),
}

#[cfg(test)]
mod tests {
    use super::check_request;

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
            let e = check_request(bad).expect_err(bad);
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
                super::stats_json(sh)["enabled_pairs"].as_u64().unwrap(),
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
        use clap::Parser;
        let crate::cli::Command::Serve(a) = crate::cli::Cli::try_parse_from([
            "vnic",
            "serve",
            "--socket",
            "/nonexistent/vnic.sock",
            "--queues",
            "2",
        ])
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
        let s = super::stats_json(&shared());
        let t = s["table"].as_object().unwrap();
        assert!(
            t.contains_key("requests") && t.contains_key("live"),
            "{t:?}"
        );
        assert!(!t.contains_key("lookup_hits"), "{t:?}");
        assert!(!t.contains_key("lookup_misses"), "{t:?}");
    }
}
