//! `vnic trace summary`: counts over a trace, in the table format of the
//! 2025 slot-collision patch (Add / Del / Steer-C), plus the breakdowns.
//! The JSON form (`--json`) is [`Summary`]; its shape is documented in
//! `vnic/TRACE-TOOLS.md` and only grows (fields keep their meaning).

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::io;
use std::path::{Path, PathBuf};

use arfs::{DelReason, EventKind, FlowKey, OpStatus, TraceRecord};
use serde::Serialize;

use super::reader::{self, LineStats, ReadError};

/// Value of [`Summary::format`].
pub const FORMAT: &str = "vnic-trace-summary";
/// Value of [`Summary::version`].
pub const VERSION: u32 = 1;
/// A flow programmed more than this many times is "thrashing".
pub const THRASH_THRESHOLD: u32 = 2;

/// Counts by name (reason, status, cause), sorted by name.
pub type ByName = BTreeMap<String, u64>;

/// A count with its breakdown by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Reasons {
    /// Sum of `by_reason`.
    pub total: u64,
    /// Per reason name. Every documented name is present (0 when absent
    /// from the trace); names the trace uses that are not documented are
    /// added as they appear.
    pub by_reason: ByName,
}

impl Reasons {
    fn with_names(names: impl IntoIterator<Item = &'static str>) -> Self {
        Self {
            total: 0,
            by_reason: names.into_iter().map(|n| (n.to_string(), 0)).collect(),
        }
    }

    fn bump(&mut self, name: &str) {
        self.total += 1;
        if let Some(v) = self.by_reason.get_mut(name) {
            *v += 1;
        } else {
            self.by_reason.insert(name.to_string(), 1);
        }
    }
}

/// Time covered by the trace (the daemon's monotonic clock).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimeSpan {
    /// Smallest `ts_ns` (null for a trace without records).
    pub first_ts_ns: Option<u64>,
    /// Largest `ts_ns`.
    pub last_ts_ns: Option<u64>,
    /// `(last_ts_ns - first_ts_ns)` in seconds (0 without records).
    pub duration_s: f64,
}

/// Replace lines, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Replaces {
    /// All `replace` lines.
    pub total: u64,
    /// Same id, same flow: a re-steer to another queue (or the same one).
    pub resteer: u64,
    /// Same id, another flow: the id was reused for a new flow.
    pub new_flow: u64,
    /// The flow moved to another id (`prev_id` != `id`).
    pub moved: u64,
}

/// Filters alive in the table, as tracked through the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Live {
    /// Live at the last line of the trace.
    pub end: u64,
    /// Most live at any point.
    pub peak: u64,
}

/// One thrashing flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Offender {
    /// The flow (the trace's `flow` object).
    pub flow: FlowKey,
    /// Times it was programmed (`add` + `replace` naming it as the new flow).
    pub programmed: u32,
}

/// Flows programmed more than [`THRASH_THRESHOLD`] times.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Thrashing {
    /// The threshold: a flow programmed more than this many times counts.
    pub threshold: u32,
    /// Distinct flows ever programmed.
    pub distinct_flows: u64,
    /// Flows programmed more than `threshold` times.
    pub flows: u64,
    /// Programmings (add + replace-to) of those flows, in total.
    pub programmings: u64,
    /// The worst flows, most programmed first (ties: by flow), at most `--top`.
    pub top: Vec<Offender>,
}

/// Per rx queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Rxq {
    /// Queue index.
    pub rxq: u16,
    /// Filters installed steering to this queue (`add`, and `replace` with this `rxq`).
    pub programmed: u64,
    /// Filters that stopped steering to this queue (`del`, `evict`, and
    /// `replace` with this `prev_rxq`).
    pub removed: u64,
    /// Packets steered here by filters that ended within the trace: the
    /// `hits` of `del` and `evict` lines (their `rxq`) and of `replace`
    /// lines (their `prev_rxq`).
    pub hits: u64,
    /// Filters steering here that are still live at the end of the trace.
    pub live_end: u64,
    /// With `--final-table`: filters on this queue in that table dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_live: Option<u64>,
    /// With `--final-table`: their hits (packets not in any trace line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_hits: Option<u64>,
}

/// Lines that disagree with the table state tracked from earlier lines
/// (a trace that starts mid-run, or records the daemon dropped: see
/// `trace.dropped` in `vnic ctl stats`). 0 everywhere in a complete trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Inconsistencies {
    /// `del`/`evict`/`replace` of an id that was not live.
    pub remove_not_live: u64,
    /// `add` of an id that was already live.
    pub add_already_live: u64,
    /// Filters still tracked as live when a `reset` line said the table was emptied.
    pub live_at_reset: u64,
}

/// The guest module counters (`--module-stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ModuleStats {
    /// The files read, in the order given.
    pub files: Vec<PathBuf>,
    /// Every counter, summed over the files.
    pub counters: BTreeMap<String, u64>,
}

/// The summary of one trace file (`--json` prints this).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Always [`FORMAT`].
    pub format: &'static str,
    /// Always [`VERSION`] for this shape.
    pub version: u32,
    /// The trace file.
    pub file: PathBuf,
    /// Lines read, valid records, blank and malformed lines.
    pub lines: LineStats,
    /// Time covered.
    pub time: TimeSpan,
    /// Steer-C: sum of `steer_calls` over the `--module-stats` files; null without them.
    pub steer_calls: Option<u64>,
    /// The module counters, when `--module-stats` was given.
    pub module: Option<ModuleStats>,
    /// `add` lines: filters installed under an id that was not live.
    pub add: u64,
    /// `replace` lines.
    pub replace: Replaces,
    /// `del` lines (DEL ops, one per filter of a FLUSH, and filters displaced
    /// by an ADD with reason `replaced`), by reason. Evictions are not in it.
    pub del: Reasons,
    /// `reject` lines (ADD ops refused), by op status.
    pub reject: Reasons,
    /// `unknown_del` lines (DEL of an id that was not live), by DEL reason.
    pub unknown_del: Reasons,
    /// `flush` lines (FLUSH requests that took effect).
    pub flushes: u64,
    /// `evict` lines: filters dropped because the device reset its table.
    pub evict: u64,
    /// `reset` lines: table resets for a new generation.
    pub resets: u64,
    /// `ack` lines: requests that took effect and were acknowledged.
    pub acks: u64,
    /// `bad_frame` lines, by frame-error name.
    pub bad_frames: Reasons,
    /// `mgmt_drop` lines, by cause.
    pub mgmt_drops: Reasons,
    /// `gen_change` lines, by cause.
    pub gen_changes: Reasons,
    /// The rule stage's lines (`rule_set`, `rule_del`, `rule_reject`), by
    /// event (`set`, `del`) and, for refusals, by status.
    pub rule_events: Reasons,
    /// `rss_set` lines, by status (`ok`, `bad_key`, `bad_queue`), and
    /// `reset` for a new generation's return to the defaults.
    pub rss_events: Reasons,
    /// `(add + replace.total + del.total) / time.duration_s`: table writes per
    /// second. Null when the duration is 0.
    pub churn_per_s: Option<f64>,
    /// Live filters.
    pub live: Live,
    /// Flows programmed more than twice.
    pub thrashing: Thrashing,
    /// Per rx queue, by queue index (queues that appear in the trace or the final table).
    pub per_rxq: Vec<Rxq>,
    /// The `--final-table` file, when given.
    pub final_table: Option<PathBuf>,
    /// Lines that contradict the tracked table state.
    pub inconsistencies: Inconsistencies,
}

/// Options of a summary.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Guest module counters files.
    pub module_stats: Vec<PathBuf>,
    /// A `vnic ctl table` dump taken after the trace ended.
    pub final_table: Option<PathBuf>,
    /// Offenders listed.
    pub top: usize,
}

#[derive(Default)]
struct RxqAcc {
    programmed: u64,
    removed: u64,
    hits: u64,
}

struct Acc {
    first: Option<u64>,
    last: Option<u64>,
    add: u64,
    replace: Replaces,
    del: Reasons,
    reject: Reasons,
    unknown_del: Reasons,
    flushes: u64,
    evict: u64,
    resets: u64,
    acks: u64,
    bad_frames: Reasons,
    mgmt_drops: Reasons,
    gen_changes: Reasons,
    rule_events: Reasons,
    rss_events: Reasons,
    /// Live filters: id -> rx queue.
    live: HashMap<u16, u16>,
    peak: u64,
    programmed: HashMap<FlowKey, u32>,
    rxq: BTreeMap<u16, RxqAcc>,
    inc: Inconsistencies,
}

impl Acc {
    fn new() -> Self {
        Self {
            first: None,
            last: None,
            add: 0,
            replace: Replaces::default(),
            del: Reasons::with_names(DelReason::ALL.map(DelReason::name)),
            reject: Reasons::with_names(
                OpStatus::ALL
                    .into_iter()
                    .filter(|s| !matches!(s, OpStatus::Ok | OpStatus::UnknownId))
                    .map(OpStatus::name),
            ),
            unknown_del: Reasons::with_names(DelReason::ALL.map(DelReason::name)),
            flushes: 0,
            evict: 0,
            resets: 0,
            acks: 0,
            bad_frames: Reasons::with_names([]),
            mgmt_drops: Reasons::with_names([]),
            gen_changes: Reasons::with_names([]),
            rule_events: Reasons::with_names([]),
            rss_events: Reasons::with_names([]),
            live: HashMap::new(),
            peak: 0,
            programmed: HashMap::new(),
            rxq: BTreeMap::new(),
            inc: Inconsistencies::default(),
        }
    }

    fn install(&mut self, id: u16, rxq: u16, flow: FlowKey) {
        self.live.insert(id, rxq);
        self.peak = self.peak.max(self.live.len() as u64);
        self.rxq.entry(rxq).or_default().programmed += 1;
        *self.programmed.entry(flow).or_default() += 1;
    }

    fn remove(&mut self, id: u16, rxq: u16, hits: u64) {
        if self.live.remove(&id).is_none() {
            self.inc.remove_not_live += 1;
        }
        let q = self.rxq.entry(rxq).or_default();
        q.removed += 1;
        q.hits += hits;
    }

    // `validate` guarantees the fields each arm unwraps; the `let ... else`
    // arms only guard against a caller that skipped it.
    fn record(&mut self, r: &TraceRecord) {
        self.first = Some(self.first.map_or(r.ts_ns, |f| f.min(r.ts_ns)));
        self.last = Some(self.last.map_or(r.ts_ns, |l| l.max(r.ts_ns)));
        let reason = r.reason.as_deref().unwrap_or("unknown");
        match r.event {
            EventKind::Add => {
                let (Some(id), Some(rxq), Some(flow)) = (r.id, r.rxq, r.flow) else {
                    return;
                };
                self.add += 1;
                if self.live.contains_key(&id) {
                    self.inc.add_already_live += 1;
                }
                self.install(id, rxq, flow);
            }
            EventKind::Replace => {
                let (Some(id), Some(rxq), Some(flow), Some(prev_id), Some(prev_rxq)) =
                    (r.id, r.rxq, r.flow, r.prev_id, r.prev_rxq)
                else {
                    return;
                };
                self.replace.total += 1;
                if prev_id != id {
                    self.replace.moved += 1;
                } else if r.prev_flow.is_some_and(|p| p == flow) {
                    self.replace.resteer += 1;
                } else {
                    self.replace.new_flow += 1;
                }
                self.remove(prev_id, prev_rxq, r.hits.unwrap_or(0));
                if prev_id != id && self.live.contains_key(&id) {
                    self.inc.add_already_live += 1;
                }
                self.install(id, rxq, flow);
            }
            EventKind::Del => {
                let (Some(id), Some(rxq)) = (r.id, r.rxq) else {
                    return;
                };
                self.del.bump(reason);
                self.remove(id, rxq, r.hits.unwrap_or(0));
            }
            EventKind::Evict => {
                let (Some(id), Some(rxq)) = (r.id, r.rxq) else {
                    return;
                };
                self.evict += 1;
                self.remove(id, rxq, r.hits.unwrap_or(0));
            }
            EventKind::Reset => {
                self.resets += 1;
                self.inc.live_at_reset += self.live.len() as u64;
                self.live.clear();
            }
            EventKind::Reject => self.reject.bump(reason),
            EventKind::UnknownDel => self.unknown_del.bump(reason),
            EventKind::Flush => self.flushes += 1,
            EventKind::Ack => self.acks += 1,
            EventKind::BadFrame => self.bad_frames.bump(reason),
            EventKind::MgmtDrop => self.mgmt_drops.bump(reason),
            EventKind::GenChange => self.gen_changes.bump(reason),
            EventKind::RuleSet => self.rule_events.bump("set"),
            EventKind::RuleDel => self.rule_events.bump("del"),
            EventKind::RuleReject => self.rule_events.bump(&format!("reject_{reason}")),
            EventKind::RssSet => {
                let status = r.status.map_or("unknown", |s| s.name());
                self.rss_events
                    .bump(if r.seq.is_none() { reason } else { status });
            }
        }
    }
}

/// Why [`summarize`] failed: a `--module-stats` or `--final-table` file is
/// not what it should be, or the trace cannot be read.
#[derive(Debug)]
pub enum SummaryError {
    /// A `--module-stats` file cannot be read.
    ModuleStatsRead { path: PathBuf, source: io::Error },
    /// A `--module-stats` line (1-based) is not `name value`.
    ModuleStatsLine {
        path: PathBuf,
        line: usize,
        text: String,
    },
    /// A `--module-stats` value is not a decimal integer.
    ModuleStatsValue {
        path: PathBuf,
        line: usize,
        name: String,
        value: String,
    },
    /// A `--module-stats` file has no `steer_calls` line.
    ModuleStatsNoSteerCalls { path: PathBuf },
    /// The `--final-table` file cannot be read.
    FinalTableRead { path: PathBuf, source: io::Error },
    /// The `--final-table` file is not JSON.
    FinalTableJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The `--final-table` JSON has no `filters`.
    FinalTableNoFilters { path: PathBuf },
    /// The `--final-table` `filters` are not filters.
    FinalTableFilters {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The trace file cannot be read.
    Trace(ReadError),
}

impl fmt::Display for SummaryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ModuleStatsRead { path, source } => {
                write!(f, "--module-stats {}: cannot read: {source}", path.display())
            }
            Self::ModuleStatsLine { path, line, text } => write!(
                f,
                "--module-stats {}:{line}: expected `name value`, got {text:?}",
                path.display()
            ),
            Self::ModuleStatsValue {
                path,
                line,
                name,
                value,
            } => write!(
                f,
                "--module-stats {}:{line}: value of {name} is not a decimal integer: {value:?} \
                 (is this the `counters` file?)",
                path.display()
            ),
            Self::ModuleStatsNoSteerCalls { path } => write!(
                f,
                "--module-stats {}: no steer_calls line (expected the vnic_arfs debugfs `counters` file)",
                path.display()
            ),
            Self::FinalTableRead { path, source } => {
                write!(f, "--final-table {}: cannot read: {source}", path.display())
            }
            Self::FinalTableJson { path, source } => {
                write!(f, "--final-table {}: not JSON: {source}", path.display())
            }
            Self::FinalTableNoFilters { path } => write!(
                f,
                "--final-table {}: no `filters` array (expected the output of `vnic ctl table`)",
                path.display()
            ),
            Self::FinalTableFilters { path, source } => {
                write!(f, "--final-table {}: bad `filters`: {source}", path.display())
            }
            Self::Trace(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SummaryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::ModuleStatsRead { source, .. } | Self::FinalTableRead { source, .. } => {
                Some(source)
            }
            Self::FinalTableJson { source, .. } | Self::FinalTableFilters { source, .. } => {
                Some(source)
            }
            // The trace's own error names the file and carries the io error.
            Self::Trace(e) => e.source(),
            Self::ModuleStatsLine { .. }
            | Self::ModuleStatsValue { .. }
            | Self::ModuleStatsNoSteerCalls { .. }
            | Self::FinalTableNoFilters { .. } => None,
        }
    }
}

impl From<ReadError> for SummaryError {
    fn from(e: ReadError) -> Self {
        Self::Trace(e)
    }
}

/// Reads a guest module `counters` file (debugfs, `name value` lines).
fn read_module_stats(path: &Path, into: &mut BTreeMap<String, u64>) -> Result<(), SummaryError> {
    let text = std::fs::read_to_string(path).map_err(|source| SummaryError::ModuleStatsRead {
        path: path.to_path_buf(),
        source,
    })?;
    let mut saw_steer = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(name), Some(value), None) = (it.next(), it.next(), it.next()) else {
            return Err(SummaryError::ModuleStatsLine {
                path: path.to_path_buf(),
                line: i + 1,
                text: line.to_string(),
            });
        };
        let v: u64 = value.parse().map_err(|_| SummaryError::ModuleStatsValue {
            path: path.to_path_buf(),
            line: i + 1,
            name: name.to_string(),
            value: value.to_string(),
        })?;
        saw_steer |= name == "steer_calls";
        let slot = into.entry(name.to_string()).or_default();
        *slot = slot.saturating_add(v);
    }
    if !saw_steer {
        return Err(SummaryError::ModuleStatsNoSteerCalls {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct TableFilter {
    rxq: u16,
    hits: u64,
}

/// Reads a `vnic ctl table` dump: the whole reply or its `table` object.
fn read_final_table(path: &Path) -> Result<Vec<TableFilter>, SummaryError> {
    let path_buf = || path.to_path_buf();
    let text = std::fs::read_to_string(path).map_err(|source| SummaryError::FinalTableRead {
        path: path_buf(),
        source,
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| SummaryError::FinalTableJson {
            path: path_buf(),
            source,
        })?;
    let table = v.get("table").unwrap_or(&v);
    let filters = table
        .get("filters")
        .cloned()
        .ok_or_else(|| SummaryError::FinalTableNoFilters { path: path_buf() })?;
    serde_json::from_value(filters).map_err(|source| SummaryError::FinalTableFilters {
        path: path_buf(),
        source,
    })
}

/// Summarises `path`.
pub fn summarize(path: &Path, opts: &Options) -> Result<Summary, SummaryError> {
    // Read the small inputs first so that their errors come before a long read.
    let module = if opts.module_stats.is_empty() {
        None
    } else {
        let mut m = ModuleStats {
            files: opts.module_stats.clone(),
            counters: BTreeMap::new(),
        };
        for f in &opts.module_stats {
            read_module_stats(f, &mut m.counters)?;
        }
        Some(m)
    };
    let table = opts
        .final_table
        .as_deref()
        .map(read_final_table)
        .transpose()?;

    let mut acc = Acc::new();
    let lines = reader::for_each_record(path, |r| acc.record(r))?;

    let duration_s = match (acc.first, acc.last) {
        (Some(f), Some(l)) => (l - f) as f64 / 1e9,
        _ => 0.0,
    };
    let writes = acc.add + acc.replace.total + acc.del.total;
    let churn_per_s = (duration_s > 0.0).then(|| writes as f64 / duration_s);

    let mut offenders: Vec<Offender> = acc
        .programmed
        .iter()
        .filter(|(_, &n)| n > THRASH_THRESHOLD)
        .map(|(f, &n)| Offender {
            flow: *f,
            programmed: n,
        })
        .collect();
    offenders.sort_unstable_by(|a, b| b.programmed.cmp(&a.programmed).then(a.flow.cmp(&b.flow)));
    let thrashing = Thrashing {
        threshold: THRASH_THRESHOLD,
        distinct_flows: acc.programmed.len() as u64,
        flows: offenders.len() as u64,
        programmings: offenders.iter().map(|o| u64::from(o.programmed)).sum(),
        top: offenders.into_iter().take(opts.top).collect(),
    };

    let mut live_by_q: BTreeMap<u16, u64> = BTreeMap::new();
    for &q in acc.live.values() {
        *live_by_q.entry(q).or_default() += 1;
    }
    let mut table_by_q: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    for f in table.iter().flatten() {
        let e = table_by_q.entry(f.rxq).or_default();
        e.0 += 1;
        e.1 += f.hits;
    }
    let mut queues: Vec<u16> = acc
        .rxq
        .keys()
        .chain(live_by_q.keys())
        .chain(table_by_q.keys())
        .copied()
        .collect();
    queues.sort_unstable();
    queues.dedup();
    let per_rxq = queues
        .into_iter()
        .map(|q| {
            let a = acc.rxq.get(&q);
            let t = table_by_q.get(&q).copied();
            Rxq {
                rxq: q,
                programmed: a.map_or(0, |a| a.programmed),
                removed: a.map_or(0, |a| a.removed),
                hits: a.map_or(0, |a| a.hits),
                live_end: live_by_q.get(&q).copied().unwrap_or(0),
                table_live: table.as_ref().map(|_| t.map_or(0, |t| t.0)),
                table_hits: table.as_ref().map(|_| t.map_or(0, |t| t.1)),
            }
        })
        .collect();

    Ok(Summary {
        format: FORMAT,
        version: VERSION,
        file: path.to_path_buf(),
        lines,
        time: TimeSpan {
            first_ts_ns: acc.first,
            last_ts_ns: acc.last,
            duration_s,
        },
        steer_calls: module
            .as_ref()
            .map(|m| m.counters.get("steer_calls").copied().unwrap_or(0)),
        module,
        add: acc.add,
        replace: acc.replace,
        del: acc.del,
        reject: acc.reject,
        unknown_del: acc.unknown_del,
        flushes: acc.flushes,
        evict: acc.evict,
        resets: acc.resets,
        acks: acc.acks,
        bad_frames: acc.bad_frames,
        mgmt_drops: acc.mgmt_drops,
        gen_changes: acc.gen_changes,
        rule_events: acc.rule_events,
        rss_events: acc.rss_events,
        churn_per_s,
        live: Live {
            end: acc.live.len() as u64,
            peak: acc.peak,
        },
        thrashing,
        per_rxq,
        final_table: opts.final_table.clone(),
        inconsistencies: acc.inc,
    })
}

/// A count in the patch's units: exact below 10,000, then `12.1 K`, `3.5 M`.
pub fn units(n: u64) -> String {
    if n < 10_000 {
        n.to_string()
    } else if n < 1_000_000 {
        format!("{:.1} K", n as f64 / 1e3)
    } else {
        format!("{:.1} M", n as f64 / 1e6)
    }
}

fn reasons_line(r: &Reasons) -> String {
    if r.by_reason.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = r
        .by_reason
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    format!(" ({})", parts.join(", "))
}

fn duration_text(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.3} ms", s * 1e3)
    }
}

/// The human-readable report. `exact` prints exact counts in the table
/// instead of the patch's K/M units.
pub fn render(s: &Summary, exact: bool) -> String {
    let num = |v: u64| if exact { v.to_string() } else { units(v) };
    let mut o = String::new();
    let lines_read = &s.lines;
    let _ = writeln!(
        o,
        "trace {}: {} records in {} lines ({} malformed, {} blank)",
        s.file.display(),
        lines_read.records,
        lines_read.total,
        lines_read.malformed,
        lines_read.blank
    );
    for m in &lines_read.malformed_examples {
        let _ = writeln!(o, "  malformed line {}: {}", m.line, m.error);
    }
    if lines_read.malformed > lines_read.malformed_examples.len() as u64 {
        let _ = writeln!(
            o,
            "  ... and {} more malformed lines",
            lines_read.malformed - lines_read.malformed_examples.len() as u64
        );
    }
    match (s.time.first_ts_ns, s.time.last_ts_ns) {
        (Some(f), Some(t)) => {
            let _ = writeln!(
                o,
                "covers {} (ts_ns {f} .. {t})",
                duration_text(s.time.duration_s)
            );
        }
        _ => {
            let _ = writeln!(o, "covers nothing (no records)");
        }
    }
    o.push('\n');

    let steer = s.steer_calls.map_or_else(|| "-".to_string(), num);
    let churn = s
        .churn_per_s
        .map_or_else(|| "-".to_string(), |c| format!("{c:.1}"));
    let row = [
        num(s.add),
        num(s.del.total),
        num(s.replace.total),
        num(s.reject.total),
        steer,
        duration_text(s.time.duration_s),
        churn,
    ];
    let head = [
        "Add", "Del", "Replace", "Reject", "Steer-C", "Duration", "Churn/s",
    ];
    let widths: Vec<usize> = head
        .iter()
        .zip(&row)
        .map(|(h, r)| h.len().max(r.len()))
        .collect();
    let fmt_row = |cells: &[&str]| {
        let mut line = String::from("|");
        for (c, w) in cells.iter().zip(&widths) {
            let _ = write!(line, " {c:>w$} |");
        }
        line
    };
    let head_line = fmt_row(&head);
    let _ = writeln!(o, "{head_line}");
    let _ = writeln!(o, "{}", "-".repeat(head_line.len()));
    let row_refs: Vec<&str> = row.iter().map(String::as_str).collect();
    let _ = writeln!(o, "{}", fmt_row(&row_refs));
    o.push('\n');

    let _ = writeln!(
        o,
        "Del by reason:      {}{}",
        s.del.total,
        reasons_line(&s.del)
    );
    let _ = writeln!(
        o,
        "Replace:            {} (resteer {}, new_flow {}, moved {})",
        s.replace.total, s.replace.resteer, s.replace.new_flow, s.replace.moved
    );
    let _ = writeln!(
        o,
        "Reject by reason:   {}{}",
        s.reject.total,
        reasons_line(&s.reject)
    );
    let _ = writeln!(
        o,
        "Unknown-delete:     {}{}",
        s.unknown_del.total,
        reasons_line(&s.unknown_del)
    );
    let _ = writeln!(
        o,
        "Flushes:            {}; evicted by device resets: {} (resets: {})",
        s.flushes, s.evict, s.resets
    );
    let _ = writeln!(
        o,
        "Bad mgmt frames:    {}{}",
        s.bad_frames.total,
        reasons_line(&s.bad_frames)
    );
    let _ = writeln!(
        o,
        "Mgmt frames dropped: {}{}",
        s.mgmt_drops.total,
        reasons_line(&s.mgmt_drops)
    );
    let _ = writeln!(
        o,
        "Generation changes: {}{}",
        s.gen_changes.total,
        reasons_line(&s.gen_changes)
    );
    if s.rule_events.total > 0 {
        let _ = writeln!(
            o,
            "Rule events:        {}{}",
            s.rule_events.total,
            reasons_line(&s.rule_events)
        );
    }
    if s.rss_events.total > 0 {
        let _ = writeln!(
            o,
            "RSS_SET lines:      {}{}",
            s.rss_events.total,
            reasons_line(&s.rss_events)
        );
    }
    let _ = writeln!(o, "Acks:               {}", s.acks);
    let _ = writeln!(
        o,
        "Live filters:       {} at end, {} at peak",
        s.live.end, s.live.peak
    );
    let thr = &s.thrashing;
    let _ = writeln!(
        o,
        "Thrashing:          {} of {} flows programmed more than {} times ({} programmings)",
        thr.flows, thr.distinct_flows, thr.threshold, thr.programmings
    );
    for off in &thr.top {
        let _ = writeln!(o, "  {:>8}  {}", off.programmed, off.flow);
    }
    if let Some(m) = &s.module {
        let files: Vec<String> = m.files.iter().map(|f| f.display().to_string()).collect();
        let _ = writeln!(o, "Module counters:    {}", files.join(", "));
        for key in [
            "steer_calls",
            "adds",
            "resteers",
            "busy",
            "add_ops",
            "del_ops",
        ] {
            if let Some(v) = m.counters.get(key) {
                let _ = writeln!(o, "  {key:<12} {v}");
            }
        }
    }
    let inc = &s.inconsistencies;
    if inc.remove_not_live + inc.add_already_live + inc.live_at_reset > 0 {
        let _ = writeln!(
            o,
            "WARNING: the trace contradicts itself (records missing?): {} removals of ids not \
             live, {} adds of ids already live, {} filters left at a reset",
            inc.remove_not_live, inc.add_already_live, inc.live_at_reset
        );
    }
    o.push('\n');

    let with_table = s.final_table.is_some();
    let _ = write!(
        o,
        "| rxq | Programmed | Removed |       Hits | Live at end |"
    );
    if with_table {
        let _ = write!(o, " Table live | Table hits |");
    }
    o.push('\n');
    for q in &s.per_rxq {
        let _ = write!(
            o,
            "| {:>3} | {:>10} | {:>7} | {:>10} | {:>11} |",
            q.rxq, q.programmed, q.removed, q.hits, q.live_end
        );
        if with_table {
            let _ = write!(
                o,
                " {:>10} | {:>10} |",
                q.table_live.unwrap_or(0),
                q.table_hits.unwrap_or(0)
            );
        }
        o.push('\n');
    }
    if s.per_rxq.is_empty() {
        let _ = writeln!(o, "(no filters)");
    }
    o.push('\n');
    o.push_str(LEGEND);
    o
}

/// What each number counts.
pub const LEGEND: &str = "\
Legend (counts are trace lines unless said otherwise):
  Add       filters installed under an id that was not live (`add`)
  Del       filters removed (`del`): by DEL ops (any reason), one per filter of a FLUSH,
            and filters displaced when an ADD moved their flow (reason `replaced`);
            not evictions by a device reset
  Replace   ADD ops that overwrote a live filter (`replace`): resteer = same id and flow,
            new_flow = same id reused for another flow, moved = flow moved to another id
  Reject    ADD ops the device refused, by op status (`reject`)
  Steer-C   ndo_rx_flow_steer calls in the guest: sum of steer_calls over the
            --module-stats files; \"-\" without them
  Unknown-delete  DEL ops naming an id that was not live (`unknown_del`)
  Duration  last ts_ns - first ts_ns (the daemon's monotonic clock)
  Churn/s   (Add + Replace + Del) / Duration: filter table writes per second
  Thrashing flows programmed (`add`, or `replace` naming the flow as the new one) more than
            twice; table replays after a generation change count too
  Hits      packets steered, from the `hits` of del and evict lines (their rxq) and replace
            lines (the replaced entry, prev_rxq): only filters that ended within the trace;
            --final-table adds the filters still live in a `vnic ctl table` dump
  Live at end  filters the trace leaves installed (add/replace minus del/evict/replace-from)
  Units     K = 1,000, M = 1,000,000 (exact below 10,000; --exact prints exact counts)
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_the_patch() {
        assert_eq!(units(4119), "4119");
        assert_eq!(units(12_100), "12.1 K");
        assert_eq!(units(644_400), "644.4 K");
        assert_eq!(units(3_500_000), "3.5 M");
    }

    #[test]
    fn bad_inputs_are_reported_by_kind_with_the_same_text() {
        use std::error::Error as _;
        let dir = std::env::temp_dir().join(format!("vnic-trace-summary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("trace.jsonl");
        std::fs::write(&trace, "{\"ts_ns\":1,\"event\":\"reset\",\"gen\":0}\n").unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let missing = dir.join("missing");
        let run = |module_stats: &[&PathBuf], final_table: Option<&PathBuf>, path: &Path| {
            summarize(
                path,
                &Options {
                    module_stats: module_stats.iter().map(|p| (*p).clone()).collect(),
                    final_table: final_table.cloned(),
                    top: 10,
                },
            )
            .unwrap_err()
        };
        let d = |p: &PathBuf| p.display().to_string();

        let e = run(&[&missing], None, &trace);
        assert!(matches!(&e, SummaryError::ModuleStatsRead { path, .. } if *path == missing));
        assert!(e
            .to_string()
            .starts_with(&format!("--module-stats {}: cannot read: ", d(&missing))));
        assert!(e.source().is_some());

        let bad = file("line", "steer_calls 1\nsteer_calls 2 3\n");
        let e = run(&[&bad], None, &trace);
        assert!(
            matches!(&e, SummaryError::ModuleStatsLine { line: 2, .. }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "--module-stats {}:2: expected `name value`, got \"steer_calls 2 3\"",
                d(&bad)
            )
        );

        let bad = file("value", "steer_calls x1\n");
        let e = run(&[&bad], None, &trace);
        assert!(
            matches!(&e, SummaryError::ModuleStatsValue { line: 1, name, value, .. }
                if name == "steer_calls" && value == "x1"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "--module-stats {}:1: value of steer_calls is not a decimal integer: \"x1\" \
                 (is this the `counters` file?)",
                d(&bad)
            )
        );

        let bad = file("nosteer", "adds 1\n");
        let e = run(&[&bad], None, &trace);
        assert!(
            matches!(&e, SummaryError::ModuleStatsNoSteerCalls { .. }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "--module-stats {}: no steer_calls line (expected the vnic_arfs debugfs \
                 `counters` file)",
                d(&bad)
            )
        );
        assert!(e.source().is_none());

        let e = run(&[], Some(&missing), &trace);
        assert!(matches!(&e, SummaryError::FinalTableRead { .. }), "{e:?}");
        assert!(e
            .to_string()
            .starts_with(&format!("--final-table {}: cannot read: ", d(&missing))));

        let bad = file("notjson", "table?");
        let e = run(&[], Some(&bad), &trace);
        assert!(matches!(&e, SummaryError::FinalTableJson { .. }), "{e:?}");
        assert!(e
            .to_string()
            .starts_with(&format!("--final-table {}: not JSON: ", d(&bad))));
        assert!(e.source().is_some());

        let bad = file("nofilters", r#"{"table":{"capacity":4}}"#);
        let e = run(&[], Some(&bad), &trace);
        assert!(
            matches!(&e, SummaryError::FinalTableNoFilters { .. }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "--final-table {}: no `filters` array (expected the output of `vnic ctl table`)",
                d(&bad)
            )
        );

        let bad = file("badfilters", r#"{"filters":[{"rxq":"one"}]}"#);
        let e = run(&[], Some(&bad), &trace);
        assert!(
            matches!(&e, SummaryError::FinalTableFilters { .. }),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .starts_with(&format!("--final-table {}: bad `filters`: ", d(&bad))));

        let e = run(&[], None, &missing);
        assert!(
            matches!(&e, SummaryError::Trace(ReadError::Open { path, .. }) if *path == missing),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .starts_with(&format!("{}: cannot open: ", d(&missing))));
        assert!(e.source().is_some());

        std::fs::remove_dir_all(&dir).unwrap();
    }
}
