//! `vnic trace summary` / `vnic trace plot` run as a user runs them (the
//! built binary), on trace files produced by a real `arfs::FilterTable`
//! whose events are turned into lines by `arfs::TraceRecord` exactly as the
//! daemon does.

mod common;

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use arfs::proto::{decode_frame, Direction, MsgType};
use arfs::{
    AddOp, DelOp, DelReason, DropCause, FilterTable, FlowKey, L4Proto, Request, TableConfig,
    TraceRecord,
};
use serde_json::{json, Value};

const MS: u64 = 1_000_000;

/// Run `vnic ARGS` to its end (guarded: killed if this test panics first).
fn vnic(args: &[&str]) -> Output {
    vnic_frontend::harness::ChildGuard::spawn(
        Command::new(env!("CARGO_BIN_EXE_vnic"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .and_then(vnic_frontend::harness::ChildGuard::wait_with_output)
    .expect("run vnic")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok_json(args: &[&str]) -> Value {
    let o = vnic(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("summary --json is JSON")
}

/// A scratch directory, removed on drop unless the test failed (then it is
/// kept for a look at the files).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test files kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn tmpdir(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("vnic-trace-tool-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn flow(sport: u16) -> FlowKey {
    FlowKey::v4(
        L4Proto::Udp,
        Ipv4Addr::new(10, 0, 2, 1),
        sport,
        Ipv4Addr::new(10, 0, 2, 15),
        5001,
    )
}

/// A filter table driven like the daemon drives it, recording trace lines.
struct Run {
    table: FilterTable,
    gen: u32,
    queues: u16,
    recs: Vec<TraceRecord>,
}

impl Run {
    fn new(capacity: u32, queues: u16) -> Self {
        let table = FilterTable::new(TableConfig {
            capacity,
            ..TableConfig::default()
        })
        .unwrap();
        Self {
            table,
            gen: 1,
            queues,
            recs: vec![TraceRecord::gen_change(0, 0, 1, "start")],
        }
    }

    fn req(&mut self, ts: u64, seq: u32, r: Request) {
        let (gen, recs) = (self.gen, &mut self.recs);
        self.table.apply_now(ts, seq, r, self.queues, &mut |e| {
            recs.push(TraceRecord::from_event(ts, gen, &e));
        });
    }

    fn add(&mut self, ts: u64, seq: u32, ops: &[(u16, u16, FlowKey)]) {
        let ops = ops
            .iter()
            .map(|(id, q, f)| AddOp::new(*id, *q, f))
            .collect();
        self.req(ts, seq, Request::Add(ops));
    }

    fn del(&mut self, ts: u64, seq: u32, id: u16, reason: DelReason) {
        self.req(ts, seq, Request::Del(vec![DelOp { id, reason }]));
    }

    fn hits(&mut self, id: u16, n: u64, ts: u64) {
        assert!(self.table.record_hits(id, n, ts));
    }

    fn new_generation(&mut self, ts: u64, cause: &str) {
        let prev = self.gen;
        self.gen += 1;
        self.recs
            .push(TraceRecord::gen_change(ts, prev, self.gen, cause));
        let (gen, recs) = (self.gen, &mut self.recs);
        self.table
            .clear(&mut |e| recs.push(TraceRecord::from_event(ts, gen, &e)));
    }
}

/// The scripted run whose counts the tests assert (worked out by hand in
/// the comments; the table's own counters cross-check them).
fn scripted() -> Run {
    let (fa, fb, fc, fd, fe) = (flow(1), flow(2), flow(3), flow(4), flow(5));
    let mut run = Run::new(3, 2);
    // 2 adds (rxq0: A as 1, rxq1: B as 2).
    run.add(MS, 1, &[(1, 0, fa), (2, 1, fb)]);
    run.hits(1, 5, MS);
    // add C as 3 on rxq0; D is refused: table_full (capacity 3).
    run.add(2 * MS, 2, &[(3, 0, fc), (4, 1, fd)]);
    // bad_queue: rxq 5 of 2.
    run.add(3 * MS, 3, &[(5, 5, fe)]);
    // del expired id 1 (rxq0, 5 hits).
    run.del(4 * MS, 4, 1, DelReason::Expired);
    // unknown_del idle.
    run.del(5 * MS, 5, 9, DelReason::Idle);
    // A thrashes: added and expired three more times on rxq1, 1 hit each.
    for i in 0..3u16 {
        let t = u64::from(6 + 2 * i) * MS;
        let seq = u32::from(6 + 2 * i);
        run.add(t, seq, &[(10 + i, 1, fa)]);
        run.hits(10 + i, 1, t);
        run.del(t + MS, seq + 1, 10 + i, DelReason::Expired);
    }
    // B re-steered rxq1 -> rxq0 (replace, resteer, 0 hits), then 4 hits.
    run.add(12 * MS, 12, &[(2, 0, fb)]);
    run.hits(2, 4, 12 * MS);
    // C moves from id 3 (rxq0) to id 20 on rxq1 (replace, moved).
    run.add(13 * MS, 13, &[(20, 1, fc)]);
    // id 2 (B) takes C: del id 20 reason replaced (rxq1), replace new_flow
    // (prev B on rxq0, 4 hits).
    run.add(14 * MS, 14, &[(2, 0, fc)]);
    let bad = decode_frame(&[0u8; 10]).unwrap_err();
    run.recs
        .push(TraceRecord::bad_frame(15 * MS, run.gen, &bad));
    run.recs.push(TraceRecord::mgmt_drop(
        15 * MS,
        run.gen,
        Direction::ToDevice,
        Some(15),
        Some(MsgType::Add.code()),
        DropCause::Loss,
    ));
    // FLUSH: del id 2 (C, rxq0, 0 hits) reason flush.
    run.req(16 * MS, 15, Request::Flush(DelReason::Flush));
    // D added on rxq1, 9 hits, then evicted by a reconnect.
    run.add(17 * MS, 16, &[(7, 1, fd)]);
    run.hits(7, 9, 17 * MS);
    run.new_generation(18 * MS, "reconnect");
    // The new generation: A again on rxq0, still live at the end (6 hits).
    run.add(19 * MS, 1, &[(1, 0, fa)]);
    run.hits(1, 6, 19 * MS);
    run
}

fn write_trace(path: &Path, recs: &[TraceRecord], garbage: bool) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for (i, rec) in recs.iter().enumerate() {
        serde_json::to_writer(&mut f, rec).unwrap();
        f.write_all(b"\n").unwrap();
        if garbage && i == 3 {
            f.write_all(b"this is not json\n\n").unwrap();
            f.write_all(br#"{"ts_ns":5,"event":"teleport","gen":1}"#)
                .unwrap();
            f.write_all(b"\n").unwrap();
            f.write_all(br#"{"ts_ns":5,"event":"add","gen":1,"id":3}"#)
                .unwrap();
            f.write_all(b"\n").unwrap();
            f.write_all(&vec![b'x'; 100_000]).unwrap();
            f.write_all(b"\n").unwrap();
        }
    }
    if garbage {
        // A truncated last line, as after a crash mid-write.
        f.write_all(br#"{"ts_ns":99999999999,"event":"add""#)
            .unwrap();
    }
    f.flush().unwrap();
}

#[test]
fn summary_counts_a_scripted_run_exactly() {
    let d = tmpdir("summary");
    let run = scripted();
    let trace = d.join("trace.jsonl");
    write_trace(&trace, &run.recs, true);
    let ms1 = d.join("counters.eth0");
    let ms2 = d.join("counters.eth1");
    std::fs::write(&ms1, "steer_calls 100\nadds 10\nbusy 0\n").unwrap();
    std::fs::write(&ms2, "steer_calls 23\nbusy 2\n").unwrap();

    let s = ok_json(&[
        "trace",
        "summary",
        p(&trace),
        "--module-stats",
        p(&ms1),
        p(&ms2),
        "--json",
        "--top",
        "1",
    ]);
    assert_eq!(s["format"], "vnic-trace-summary");
    assert_eq!(s["version"], 1);
    // Lines: every record, 1 blank, 5 malformed (not JSON, unknown event,
    // add without rxq/flow, over-long, truncated last line).
    let n = run.recs.len() as u64;
    assert_eq!(s["lines"]["records"], n);
    assert_eq!(s["lines"]["blank"], 1);
    assert_eq!(s["lines"]["malformed"], 5);
    assert_eq!(s["lines"]["total"], n + 6);
    let ex = s["lines"]["malformed_examples"].as_array().unwrap();
    assert_eq!(ex.len(), 5);
    assert_eq!(ex[0]["line"], 5);
    assert!(
        ex[2]["error"].as_str().unwrap().contains("without `rxq`"),
        "{ex:?}"
    );
    assert!(
        ex[3]["error"].as_str().unwrap().contains("longer than"),
        "{ex:?}"
    );
    assert_eq!(ex[4]["line"], n + 6);

    assert_eq!(s["time"]["first_ts_ns"], 0);
    assert_eq!(s["time"]["last_ts_ns"], 19 * MS);
    assert_eq!(s["steer_calls"], 123);
    assert_eq!(
        s["module"]["counters"],
        json!({"adds": 10, "busy": 2, "steer_calls": 123})
    );

    assert_eq!(s["add"], 8);
    assert_eq!(
        s["replace"],
        json!({"total": 3, "resteer": 1, "new_flow": 1, "moved": 1})
    );
    assert_eq!(
        s["del"],
        json!({"total": 6, "by_reason": {"expired": 4, "idle": 0, "replaced": 1, "flush": 1, "unload": 0, "aged": 0}})
    );
    assert_eq!(
        s["reject"],
        json!({"total": 2, "by_reason": {"bad_id": 0, "bad_key": 0, "bad_queue": 1, "bucket_full": 0, "injected_failure": 0, "table_full": 1}})
    );
    assert_eq!(s["unknown_del"]["total"], 1);
    assert_eq!(s["unknown_del"]["by_reason"]["idle"], 1);
    assert_eq!(s["flushes"], 1);
    assert_eq!(s["evict"], 1);
    assert_eq!(s["resets"], 1);
    assert_eq!(s["acks"], 17);
    assert_eq!(
        s["bad_frames"],
        json!({"total": 1, "by_reason": {"too_short": 1}})
    );
    assert_eq!(
        s["mgmt_drops"],
        json!({"total": 1, "by_reason": {"loss": 1}})
    );
    assert_eq!(
        s["gen_changes"],
        json!({"total": 2, "by_reason": {"reconnect": 1, "start": 1}})
    );
    // (8 adds + 3 replaces + 6 dels) / 0.019 s.
    let churn = s["churn_per_s"].as_f64().unwrap();
    assert!((churn - 17.0 / 0.019).abs() < 1e-6, "{churn}");
    assert_eq!(s["live"], json!({"end": 1, "peak": 3}));
    // A programmed 5 times, C 3 times, B twice (not thrashing), D once.
    assert_eq!(s["thrashing"]["threshold"], 2);
    assert_eq!(s["thrashing"]["distinct_flows"], 4);
    assert_eq!(s["thrashing"]["flows"], 2);
    assert_eq!(s["thrashing"]["programmings"], 8);
    assert_eq!(
        s["thrashing"]["top"],
        json!([{"flow": serde_json::to_value(flow(1)).unwrap(), "programmed": 5}])
    );
    assert_eq!(
        s["per_rxq"],
        json!([
            {"rxq": 0, "programmed": 5, "removed": 4, "hits": 9, "live_end": 1},
            {"rxq": 1, "programmed": 6, "removed": 6, "hits": 12, "live_end": 0},
        ])
    );
    assert_eq!(
        s["inconsistencies"],
        json!({"remove_not_live": 0, "add_already_live": 0, "live_at_reset": 0})
    );

    // The example in TRACE-TOOLS.md is this output (paths shortened, one
    // malformed example shown).
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/TRACE-TOOLS.md")).unwrap();
    let block = doc.split("### `--json`").nth(1).unwrap();
    let block = block.split("```json").nth(1).unwrap();
    let doc_json: Value = serde_json::from_str(block.split("```").next().unwrap()).unwrap();
    let mut shown = s.clone();
    shown["file"] = json!("trace.jsonl");
    shown["module"]["files"] = json!(["counters.eth0", "counters.eth1"]);
    shown["lines"]["malformed_examples"] = json!([s["lines"]["malformed_examples"][0]]);
    assert_eq!(doc_json, shown);

    // The table's own counters agree with what the tool read from the trace.
    let c = run.table.counters();
    assert_eq!(s["add"], c.adds);
    assert_eq!(s["replace"]["total"], c.replaces);
    assert_eq!(s["del"]["total"], c.deletes.total());
    assert_eq!(s["reject"]["total"], c.rejects.total());
    assert_eq!(s["unknown_del"]["total"], c.unknown_deletes);
    assert_eq!(s["live"]["end"], run.table.len() as u64);
}

#[test]
fn summary_table_text_and_final_table() {
    let d = tmpdir("text");
    let run = scripted();
    let trace = d.join("trace.jsonl");
    write_trace(&trace, &run.recs, false);
    // `vnic ctl table` reply shape (CTL.md), from the live table.
    let filters: Vec<Value> = run
        .table
        .entries()
        .iter()
        .map(|e| json!({"id": e.id, "rxq": e.rxq, "flow": e.flow, "hits": e.hits}))
        .collect();
    let table = d.join("table.json");
    std::fs::write(
        &table,
        json!({"ok": true, "table": {"generation": 2, "live": filters.len(), "capacity": 3, "filters": filters}})
            .to_string(),
    )
    .unwrap();

    let s = ok_json(&[
        "trace",
        "summary",
        p(&trace),
        "--final-table",
        p(&table),
        "--json",
    ]);
    assert_eq!(s["steer_calls"], Value::Null);
    assert_eq!(s["lines"]["malformed"], 0);
    assert_eq!(s["per_rxq"][0]["table_live"], 1);
    assert_eq!(s["per_rxq"][0]["table_hits"], 6);
    assert_eq!(s["per_rxq"][1]["table_live"], 0);
    assert_eq!(s["per_rxq"][1]["table_hits"], 0);

    let o = vnic(&["trace", "summary", p(&trace)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.starts_with("| Add |"))
        .unwrap_or_else(|| panic!("no table header in:\n{text}"));
    let cells: Vec<&str> = lines[head]
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        ["Add", "Del", "Replace", "Reject", "Steer-C", "Duration", "Churn/s"]
    );
    let row: Vec<&str> = lines[head + 2]
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(&row[..5], ["8", "6", "3", "2", "-"], "{text}");
    assert_eq!(row[5], "19.000 ms");
    assert!(
        text.contains(
            "Del by reason:      6 (aged 0, expired 4, flush 1, idle 0, replaced 1, unload 0)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "Thrashing:          2 of 4 flows programmed more than 2 times (8 programmings)"
        ),
        "{text}"
    );
    assert!(text.contains("udp 10.0.2.1:1 -> 10.0.2.15:5001"), "{text}");
    assert!(text.contains("Legend"), "{text}");
}

#[test]
fn summary_units_and_counts_at_scale() {
    // 10,000 flows each added and expired twice: the patch's units kick in.
    let d = tmpdir("scale");
    let mut r = Run::new(16_384, 4);
    let mut seq = 1;
    for round in 0..2u64 {
        for i in 0..10_000u16 {
            let t = (round * 10_000 + u64::from(i)) * 1000;
            r.add(t, seq, &[(i, i % 4, flow(i))]);
            r.del(t + 500, seq + 1, i, DelReason::Expired);
            seq += 2;
        }
    }
    let trace = d.join("trace.jsonl");
    write_trace(&trace, &r.recs, false);
    let s = ok_json(&["trace", "summary", p(&trace), "--json"]);
    assert_eq!(s["add"], 20_000);
    assert_eq!(s["del"]["by_reason"]["expired"], 20_000);
    assert_eq!(s["thrashing"]["flows"], 0);
    assert_eq!(s["thrashing"]["distinct_flows"], 10_000);
    assert_eq!(s["live"], json!({"end": 0, "peak": 1}));
    for q in 0..4 {
        assert_eq!(s["per_rxq"][q]["programmed"], 5000);
    }
    let o = vnic(&["trace", "summary", p(&trace)]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("| 20.0 K | 20.0 K |"), "{text}");
    let o = vnic(&["trace", "summary", p(&trace), "--exact"]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("| 20000 | 20000 |"), "{text}");
}

/// The `points` of every polyline drawn in `stroke`.
fn polylines(svg: &str, stroke: &str) -> Vec<Vec<(i64, i64)>> {
    svg.split("<polyline")
        .skip(1)
        .filter(|el| el.contains(&format!("stroke=\"{stroke}\"")))
        .map(|el| {
            let pts = el.split("points=\"").nth(1).unwrap();
            let pts = &pts[..pts.find('"').unwrap()];
            pts.split_whitespace()
                .map(|xy| {
                    let (x, y) = xy.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

#[test]
fn plot_writes_an_svg_with_the_series() {
    let d = tmpdir("plot");
    let run = scripted();
    let trace = d.join("trace.jsonl");
    write_trace(&trace, &run.recs, true);
    let out = d.join("out.svg");
    let o = vnic(&["trace", "plot", p(&trace), "-o", p(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let msg = stderr(&o);
    // 19 ms span: 100 us buckets, 191 of them.
    assert!(msg.contains("191 buckets of 100 us"), "{msg}");
    assert!(msg.contains("5 malformed lines skipped"), "{msg}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
    assert!(svg.trim_end().ends_with("</svg>"));
    let texts: Vec<&str> = svg
        .split("<text")
        .skip(1)
        .map(|t| {
            let body = &t[t.find('>').unwrap() + 1..];
            body[..body.find("</text>").unwrap()].trim()
        })
        .collect();
    for label in [
        "add",
        "del",
        "replace",
        "live filters (end of bucket)",
        "Table occupancy",
        "Filter table writes per 100 us bucket",
        "time since the first event (s)",
    ] {
        assert!(texts.contains(&label), "no {label:?} in {texts:?}");
    }
    // One line per series with one point per bucket (occupancy: plus the
    // origin). Colours: add blue, del red, replace dark green, occupancy black.
    for (stroke, points) in [
        ("#0000FF", 191),
        ("#FF0000", 191),
        ("#009600", 191),
        ("#000000", 192),
    ] {
        let lines = polylines(&svg, stroke);
        let series: Vec<_> = lines.iter().filter(|l| l.len() == points).collect();
        assert_eq!(
            series.len(),
            1,
            "{stroke}: {:?}",
            lines.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    // Occupancy peaks at 3 live filters around 2..11 ms and ends at 1: the
    // highest point (smallest y) is inside, the last point is lower.
    let live = polylines(&svg, "#000000")
        .into_iter()
        .find(|l| l.len() == 192)
        .unwrap();
    let top = live.iter().map(|p| p.1).min().unwrap();
    let first_top = live.iter().position(|p| p.1 == top).unwrap();
    assert!((20..=30).contains(&first_top), "peak at point {first_top}");
    assert!(live.last().unwrap().1 > top);
    assert_eq!(live[0].1, live.iter().map(|p| p.1).max().unwrap());
}

#[test]
fn bad_arguments_name_the_file_or_option() {
    let d = tmpdir("errors");
    let missing = d.join("no-such-trace.jsonl");
    let o = vnic(&["trace", "summary", p(&missing)]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("{}: cannot open", missing.display())),
        "{}",
        stderr(&o)
    );

    let o = vnic(&["trace", "summary", p(&d)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is a directory"), "{}", stderr(&o));

    let trace = d.join("trace.jsonl");
    write_trace(&trace, &scripted().recs, false);
    let o = vnic(&["trace", "summary", p(&trace), "--module-stats", p(&missing)]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--module-stats") && e.contains("no-such-trace.jsonl"),
        "{e}"
    );

    let state = d.join("state");
    std::fs::write(&state, "generation 3\nstate ready\n").unwrap();
    let o = vnic(&["trace", "summary", p(&trace), "--module-stats", p(&state)]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(&format!("{}:2", state.display())) && e.contains("state"),
        "{e}"
    );

    let no_steer = d.join("counters");
    std::fs::write(&no_steer, "adds 3\n").unwrap();
    let o = vnic(&[
        "trace",
        "summary",
        p(&trace),
        "--module-stats",
        p(&no_steer),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no steer_calls"), "{}", stderr(&o));

    let o = vnic(&["trace", "summary", p(&trace), "--final-table", p(&trace)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--final-table"), "{}", stderr(&o));

    let o = vnic(&["trace", "plot", p(&trace)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--output"), "{}", stderr(&o));

    let out = d.join("no-such-dir").join("out.svg");
    let o = vnic(&["trace", "plot", p(&trace), "-o", p(&out)]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("{}: cannot write", out.display())),
        "{}",
        stderr(&o)
    );

    let junk = d.join("junk.jsonl");
    std::fs::write(&junk, "nope\n{}\n").unwrap();
    let o = vnic(&["trace", "plot", p(&junk), "-o", p(&d.join("j.svg"))]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no valid trace records"),
        "{}",
        stderr(&o)
    );
    // A summary of the same file is not an error: it reports the lines.
    let s = ok_json(&["trace", "summary", p(&junk), "--json"]);
    assert_eq!(s["lines"]["malformed"], 2);
    assert_eq!(s["churn_per_s"], Value::Null);
}

/// A real daemon: `vnic serve --trace` driven by the Rust vhost-user
/// frontend (management frames and generator traffic), then summarised. The
/// counts must match the daemon's own counters, and the hits its table dump.
#[test]
fn summary_of_a_real_daemon_trace() {
    let d = tmpdir("daemon");
    let trace = d.join("trace.jsonl");
    let mut dm = common::daemon(&[
        "--queues",
        "2",
        "--table-capacity",
        "2",
        "--trace",
        p(&trace),
    ]);
    let mut g = common::guest(&dm, 2, 2);
    let mut c = common::ctl(&dm);
    // The daemon notices vring enables asynchronously: wait for both pairs
    // (an ADD to rxq 1 before that is refused with bad_queue).
    common::wait_stats(&mut c, "2 enabled pairs", |s| s.enabled_pairs == 2);
    let caps = g.hello(common::T).expect("HELLO");
    assert_eq!(caps.enabled_queue_pairs, 2);
    let (fa, fb, fc) = (
        common::gen_flow(10000, 5001),
        common::gen_flow(10001, 5001),
        common::gen_flow(10002, 5001),
    );
    let burst =
        |g: &mut vnic_frontend::guest::Guest, c: &mut common::Client, sport: u16, count: u64| {
            common::gen_burst(
                c,
                &common::FlowSpec::new()
                    .flows(1)
                    .sport(sport.to_string())
                    .count(count)
                    .rate(10000),
            );
            g.wait_until(common::T, "burst frames", |g| g.stashed() as u64 >= count)
                .unwrap();
            g.take_all();
        };
    g.add(
        vec![AddOp::new(1, 0, &fa), AddOp::new(2, 1, &fb)],
        common::T,
    )
    .unwrap();
    burst(&mut g, &mut c, 10000, 20);
    burst(&mut g, &mut c, 10001, 30);
    // Table full (capacity 2); then B re-steered to rxq0 (30 hits on rxq1 end).
    g.add(vec![AddOp::new(3, 0, &fc)], common::T).unwrap();
    g.add(vec![AddOp::new(2, 0, &fb)], common::T).unwrap();
    burst(&mut g, &mut c, 10001, 10);
    g.del(
        vec![
            DelOp {
                id: 1,
                reason: DelReason::Expired,
            },
            DelOp {
                id: 9,
                reason: DelReason::Idle,
            },
        ],
        common::T,
    )
    .unwrap();
    let stats = c.stats().unwrap();
    let table = d.join("table.json");
    std::fs::write(&table, serde_json::to_string(&c.table().unwrap()).unwrap()).unwrap();
    dm.terminate(common::T).unwrap();

    let s = ok_json(&[
        "trace",
        "summary",
        p(&trace),
        "--final-table",
        p(&table),
        "--json",
    ]);
    assert_eq!(s["lines"]["malformed"], 0);
    // start, connect + its reset, 2 add + ack, reject + ack, replace + ack,
    // del + unknown_del + ack; the daemon dropped none.
    assert_eq!(s["lines"]["records"], 13);
    assert_eq!(stats.trace.dropped, 0);
    assert_eq!(s["add"], 2);
    assert_eq!(s["add"], stats.table.adds);
    assert_eq!(
        s["replace"],
        json!({"total": 1, "resteer": 1, "new_flow": 0, "moved": 0})
    );
    assert_eq!(s["replace"]["total"], stats.table.replaces);
    assert_eq!(s["del"]["total"], 1);
    assert_eq!(s["del"]["by_reason"]["expired"], 1);
    assert_eq!(s["reject"]["by_reason"]["table_full"], 1);
    assert_eq!(s["reject"]["total"], 1);
    assert_eq!(s["unknown_del"]["total"], stats.table.unknown_deletes);
    assert_eq!(s["unknown_del"]["by_reason"]["idle"], 1);
    assert_eq!(s["acks"], 4);
    // The daemon counts resets; the trace also has its `start` line.
    assert_eq!(s["gen_changes"]["by_reason"]["start"], 1);
    assert_eq!(
        s["gen_changes"]["total"].as_u64().unwrap(),
        stats.table.generation_changes + 1
    );
    assert_eq!(s["live"]["end"], 1);
    // rxq0: A's 20 (del) + B's 10 still live (table dump); rxq1: B's 30
    // before the re-steer (replace).
    assert_eq!(
        s["per_rxq"],
        json!([
            {"rxq": 0, "programmed": 2, "removed": 1, "hits": 20, "live_end": 1, "table_live": 1, "table_hits": 10},
            {"rxq": 1, "programmed": 1, "removed": 1, "hits": 30, "live_end": 0, "table_live": 0, "table_hits": 0},
        ])
    );
    assert_eq!(
        s["inconsistencies"],
        json!({"remove_not_live": 0, "add_already_live": 0, "live_at_reset": 0})
    );
}

#[test]
fn summary_flags_a_trace_with_missing_lines() {
    // The scripted trace without its first two `add` lines (as when the
    // daemon drops records): the del of id 1 and the re-steer of id 2 name
    // ids the trace never installed.
    let d = tmpdir("missing");
    let mut recs = scripted().recs;
    recs.retain(|r| !(r.event == arfs::EventKind::Add && r.seq == Some(1) && r.gen == 1));
    let trace = d.join("trace.jsonl");
    write_trace(&trace, &recs, false);
    let s = ok_json(&["trace", "summary", p(&trace), "--json"]);
    assert_eq!(s["add"], 6);
    assert_eq!(
        s["inconsistencies"],
        json!({"remove_not_live": 2, "add_already_live": 0, "live_at_reset": 0})
    );
    let o = vnic(&["trace", "summary", p(&trace)]);
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains("WARNING: the trace contradicts itself (records missing?): 2 removals"),
        "{text}"
    );
}

/// A trace target that takes no data (`/dev/full`): every record the
/// daemon produced is counted as a write error, none as written, and the
/// daemon keeps serving. A target that cannot be opened fails at start.
#[test]
fn trace_write_failures_are_counted_and_unopenable_targets_refused() {
    let dm = common::daemon(&["--queues", "1", "--trace", "/dev/full"]);
    let mut g = common::guest(&dm, 1, 1);
    let mut c = common::ctl(&dm);
    common::wait_stats(&mut c, "1 enabled pair", |s| s.enabled_pairs == 1);
    g.hello(common::T).expect("HELLO");
    let ops: Vec<AddOp> = (0..8)
        .map(|i| AddOp::new(i, 0, &common::gen_flow(11000 + i, 5001)))
        .collect();
    g.add(ops, common::T).unwrap();
    c.trace_flush().unwrap();
    let st = c.stats().unwrap();
    let (written, errors) = (st.trace.written, st.trace.write_errors);
    assert_eq!(written, 0, "{:?}", st.trace);
    // The generation change and the 8 ADDs at least.
    assert!(errors >= 9, "{:?}", st.trace);
    assert_eq!(st.table.live, 8, "the daemon serves on");
    // More records after the first failure are counted, not logged again.
    g.add(
        vec![AddOp::new(20, 0, &common::gen_flow(11100, 5001))],
        common::T,
    )
    .unwrap();
    c.trace_flush().unwrap();
    let s2 = c.stats().unwrap();
    assert!(s2.trace.write_errors > errors);
    let log = dm.log_text();
    assert_eq!(
        log.matches("trace: writing").count(),
        1,
        "the failure is logged once: {log}"
    );

    let d = tmpdir("no-trace-dir");
    let bad = d.join("missing/trace.jsonl");
    let o = vnic(&["serve", "--socket", p(&d.join("s")), "--trace", p(&bad)]);
    assert!(!o.status.success(), "started with an unopenable trace");
    assert!(stderr(&o).contains("trace"), "{}", stderr(&o));
}
