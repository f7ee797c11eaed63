//! Spreading a collision sweep over machines (issue 27): `vnic-experiment
//! collisions --shard I/N` runs every N-th point of the sweep and writes a
//! partial result; `--merge DIR...` checks the partials against each other
//! and combines them into the run a single unsharded invocation would have
//! written (guest-tests/docs/experiments.md, "Spreading a sweep over
//! machines").
//!
//! The sweep's point list is [`sweep`]: kernels, then rps_flow_cnt, then
//! variants, the order the unsharded run measures them in; shard I/N takes
//! the points whose index k has k % N == I - 1 ([`Shard::selects`]). A run's
//! record is a [`Run`]; its `points.json` is [`Run::to_json`] whether it is
//! whole, a shard or a merge, so a merge and a whole run cannot drift.

use super::experiments::{CollisionPoint, Variant};
use crate::harness::build::{self, Kernel};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};

/// Why `--shard` text is not `I/N` with 1 <= I <= N <= [`MAX_SHARDS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardSyntaxError {
    #[error("no '/' (expected I/N with 1 <= I <= N, e.g. 3/4)")]
    NoSlash,
    /// `which`: "I" or "N".
    #[error("{which} {text:?} is not a number (expected I/N with 1 <= I <= N, e.g. 3/4)")]
    NotANumber { which: &'static str, text: String },
    #[error("N is 0 (expected I/N with 1 <= I <= N, e.g. 3/4)")]
    NoShards,
    #[error("N is above {MAX_SHARDS} (expected I/N with 1 <= I <= N, e.g. 3/4)")]
    TooManyShards,
    #[error("I counts from 1 (expected I/N with 1 <= I <= N, e.g. 3/4)")]
    IndexZero,
    #[error("I is above N (expected I/N with 1 <= I <= N, e.g. 3/4)")]
    IndexAboveCount,
}

/// Why a partial result cannot be read ([`read_partial`],
/// [`Run::partial_from_json`]); `what` names it (its points.json).
#[derive(Debug, thiserror::Error)]
pub enum PartialError {
    #[error("{}: no partial result there (a shard's --out directory, or its points.json)", .0.display())]
    NotThere(PathBuf),
    #[error("{what}: {source}")]
    Read {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{0}: no `sweep` record: written before --shard existed, or not a collisions points.json"
    )]
    NoSweep(String),
    #[error("{0}: not a partial result (no `shard`): a whole run needs no merge")]
    Whole(String),
    #[error("{what}: shard {index}/{count}: {source}")]
    BadShard {
        what: String,
        index: usize,
        count: usize,
        #[source]
        source: ShardSyntaxError,
    },
    /// `shard.OF_indices` does not give one sweep index per point (`of`
    /// "point") or error (`of` "error").
    #[error("{what}: shard.{of}_indices holds {indices} indices for {items} {of}(s)")]
    IndexCount {
        what: String,
        of: &'static str,
        indices: usize,
        items: usize,
    },
}

/// Why [`merge`] refused its partial results (each path as given).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MergeError {
    #[error("{0}: not a partial result (no shard)")]
    NotPartial(String),
    #[error("--merge needs at least one partial result")]
    Nothing,
    #[error(
        "shard counts differ: {first_path} is shard {first}, {path} is shard {shard}: all shards of one sweep share N"
    )]
    CountsDiffer {
        first_path: String,
        first: Shard,
        path: String,
        shard: Shard,
    },
    #[error("shard {shard} given twice: {first_path} and {path}")]
    Twice {
        shard: Shard,
        first_path: String,
        path: String,
    },
    #[error("{path}: shard {shard} did not finish (its run was interrupted): run it again")]
    Unfinished { path: String, shard: Shard },
    /// `missing`: the shards not given, as `I/N`.
    #[error("shard {} missing: a merge needs all {count} shards of the sweep", .missing.join(", "))]
    Missing { missing: Vec<String>, count: usize },
    /// `difference`: the first setting that differs, `field: a vs b`.
    #[error("settings differ between {first_path} and {path}: {difference}")]
    Settings {
        first_path: String,
        path: String,
        difference: String,
    },
    #[error(transparent)]
    Kernel(Box<KernelDiffers>),
    #[error("{path}: the sweep records {recorded} points, its kernels x sizes x variants make {planned}")]
    PointCount {
        path: String,
        recorded: usize,
        planned: usize,
    },
    #[error("{path}: point {k} is outside the sweep's {points} points")]
    OutsideSweep {
        path: String,
        k: usize,
        points: usize,
    },
    #[error(
        "points overlap: point {k} ({kernel} rps_flow_cnt {rps_flow_cnt} {variant:?}) is in {first_path} and in {path}"
    )]
    Overlap {
        k: usize,
        kernel: String,
        rps_flow_cnt: u32,
        variant: Variant,
        first_path: String,
        path: String,
    },
    #[error("{path}: point {k} is not shard {shard}'s")]
    NotTheShards {
        path: String,
        k: usize,
        shard: Shard,
    },
    /// Point `k` of `path` measured something else than the sweep's point
    /// `k` (`got`, `want`: kernel label, rps_flow_cnt, variant).
    #[error(
        "{path}: point {k} is {} rps_flow_cnt {} {:?}, the sweep's point {k} is {} rps_flow_cnt {} {:?}",
        .got.0, .got.1, .got.2, .want.0, .want.1, .want.2
    )]
    WrongPoint {
        path: String,
        k: usize,
        got: (String, u32, Variant),
        want: (String, u32, Variant),
    },
}

/// Two shards saw one fact of a kernel differently: `what` is "release"
/// or "config hash ..." (what the host read of it), or "its guest ran
/// release" (uname -r in its guests).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel {label} differs: {what} {a} in {a_path}, {b} in {b_path}")]
pub struct KernelDiffers {
    pub label: String,
    pub what: &'static str,
    pub a: String,
    pub a_path: String,
    pub b: String,
    pub b_path: String,
}

/// Shard I of N (1 <= I <= N): the points whose index k has k % N == I - 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

/// The most shards a sweep can be cut into (a sweep is at most a few
/// hundred points; a larger N only leaves shards empty).
pub const MAX_SHARDS: usize = 1000;

impl Shard {
    /// `I/N` as `--shard` takes it.
    pub fn parse(s: &str) -> Result<Shard, ShardSyntaxError> {
        let (i, n) = s.split_once('/').ok_or(ShardSyntaxError::NoSlash)?;
        let num = |v: &str, which: &'static str| -> Result<usize, ShardSyntaxError> {
            v.trim()
                .parse::<usize>()
                .map_err(|_| ShardSyntaxError::NotANumber {
                    which,
                    text: v.to_string(),
                })
        };
        let (index, count) = (num(i, "I")?, num(n, "N")?);
        if count == 0 {
            return Err(ShardSyntaxError::NoShards);
        }
        if count > MAX_SHARDS {
            return Err(ShardSyntaxError::TooManyShards);
        }
        if index == 0 {
            return Err(ShardSyntaxError::IndexZero);
        }
        if index > count {
            return Err(ShardSyntaxError::IndexAboveCount);
        }
        Ok(Shard { index, count })
    }

    /// Whether point `k` of the sweep (0-based) is this shard's.
    pub fn selects(self, k: usize) -> bool {
        k % self.count == self.index - 1
    }

    /// This shard's points of a sweep of `total`, in order.
    pub fn points(self, total: usize) -> Vec<usize> {
        (0..total).filter(|&k| self.selects(k)).collect()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// One point of a sweep: what it measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointKey {
    /// Index into the sweep's kernels.
    pub kernel: usize,
    pub rps_flow_cnt: u32,
    pub variant: Variant,
}

/// The sweep's points in the order the unsharded run measures them: each
/// kernel in turn (one boot each), within it each rps_flow_cnt, within that
/// each variant. The one list both `--shard` and `--merge` cut.
pub fn sweep(kernels: usize, flow_cnts: &[u32], variants: &[Variant]) -> Vec<PointKey> {
    let mut v = Vec::with_capacity(kernels * flow_cnts.len() * variants.len());
    for kernel in 0..kernels {
        for &rps_flow_cnt in flow_cnts {
            for &variant in variants {
                v.push(PointKey {
                    kernel,
                    rps_flow_cnt,
                    variant,
                });
            }
        }
    }
    v
}

/// What a kernel of the sweep was, as far as the host can tell without
/// booting it: its label, the release in its bzImage's setup header and an
/// FNV-1a 64 hash of its tree's whole `.config` (toolchain lines
/// included). `None`: not looked at (a shard with no point on it), or
/// unreadable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelId {
    pub label: String,
    pub release: Option<String>,
    pub config_fnv64: Option<String>,
}

impl KernelId {
    /// A kernel the run did not look at.
    pub fn unused(label: &str) -> KernelId {
        KernelId {
            label: label.to_string(),
            release: None,
            config_fnv64: None,
        }
    }

    /// Reads `k`'s bzImage header and `.config`.
    pub fn of(k: &Kernel) -> KernelId {
        KernelId {
            label: k.label.clone(),
            release: std::fs::read(&k.bzimage)
                .ok()
                .and_then(|b| build::bzimage_release(&b)),
            config_fnv64: std::fs::read(k.kdir.join(".config"))
                .ok()
                .map(|c| format!("{:016x}", fnv64(&c))),
        }
    }
}

/// FNV-1a, 64 bits: stable across Rust versions (unlike `DefaultHasher`).
pub fn fnv64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The sweep a run belongs to: its kernels, sizes and variants, and its
/// number of points (all shards together).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepDef {
    pub kernels: Vec<KernelId>,
    pub flow_cnts: Vec<u32>,
    pub variants: Vec<Variant>,
    pub points: usize,
}

impl SweepDef {
    pub fn plan(&self) -> Vec<PointKey> {
        sweep(self.kernels.len(), &self.flow_cnts, &self.variants)
    }
}

/// What a partial result adds: its shard, and the sweep index of each of
/// its points and errors (parallel to `points` and `errors`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub index: usize,
    pub count: usize,
    pub point_indices: Vec<usize>,
    pub error_indices: Vec<usize>,
}

/// A shard result a merge was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergedFrom {
    pub path: String,
    pub shard: String,
    pub command: String,
    pub machine: String,
    pub started: String,
    pub elapsed_s: f64,
}

/// A collision run's record: what `points.json` holds.
#[derive(Debug, Clone)]
pub struct Run {
    pub command: String,
    pub machine: String,
    pub started: String,
    pub finished: bool,
    pub elapsed_s: f64,
    /// The guest and workload settings (as the run recorded them).
    pub guest: Value,
    pub workload: Value,
    pub sweep: SweepDef,
    /// `Some`: a partial result, this shard's points only.
    pub shard: Option<Shard>,
    /// The shards a merged run was made from (empty otherwise).
    pub merged_from: Vec<MergedFrom>,
    /// Problems, each with the sweep index of the point it belongs to.
    pub errors: Vec<(usize, String)>,
    /// Points measured, each with its sweep index, in sweep order.
    pub points: Vec<(usize, CollisionPoint)>,
}

/// `points.json` as written and read (field order = file order).
#[derive(Serialize, Deserialize)]
struct File {
    command: String,
    machine: String,
    started: String,
    finished: bool,
    elapsed_s: f64,
    guest: Value,
    workload: Value,
    sweep: SweepDef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shard: Option<ShardInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    merged_from: Vec<MergedFrom>,
    errors: Vec<String>,
    points: Vec<CollisionPoint>,
}

impl Run {
    /// The `points.json` of the run.
    pub fn to_json(&self) -> Value {
        let f = File {
            command: self.command.clone(),
            machine: self.machine.clone(),
            started: self.started.clone(),
            finished: self.finished,
            elapsed_s: self.elapsed_s,
            guest: self.guest.clone(),
            workload: self.workload.clone(),
            sweep: self.sweep.clone(),
            shard: self.shard.map(|s| ShardInfo {
                index: s.index,
                count: s.count,
                point_indices: self.points.iter().map(|p| p.0).collect(),
                error_indices: self.errors.iter().map(|e| e.0).collect(),
            }),
            merged_from: self.merged_from.clone(),
            errors: self.errors.iter().map(|e| e.1.clone()).collect(),
            points: self.points.iter().map(|p| p.1.clone()).collect(),
        };
        // A derived Serialize of plain data and JSON values cannot fail.
        serde_json::to_value(f).unwrap_or(Value::Null)
    }

    /// A partial result as [`Run::to_json`] wrote it; `what` names it in
    /// errors.
    pub fn partial_from_json(v: Value, what: &str) -> Result<Run, PartialError> {
        if v.get("sweep").is_none() {
            return Err(PartialError::NoSweep(what.to_string()));
        }
        let f: File = serde_json::from_value(v).map_err(|source| PartialError::Json {
            what: what.to_string(),
            source,
        })?;
        let Some(s) = f.shard else {
            return Err(PartialError::Whole(what.to_string()));
        };
        let shard = Shard::parse(&format!("{}/{}", s.index, s.count)).map_err(|source| {
            PartialError::BadShard {
                what: what.to_string(),
                index: s.index,
                count: s.count,
                source,
            }
        })?;
        let lens = |indices: usize, items: usize, of: &'static str| {
            if indices == items {
                Ok(())
            } else {
                Err(PartialError::IndexCount {
                    what: what.to_string(),
                    of,
                    indices,
                    items,
                })
            }
        };
        lens(s.point_indices.len(), f.points.len(), "point")?;
        lens(s.error_indices.len(), f.errors.len(), "error")?;
        Ok(Run {
            command: f.command,
            machine: f.machine,
            started: f.started,
            finished: f.finished,
            elapsed_s: f.elapsed_s,
            guest: f.guest,
            workload: f.workload,
            sweep: f.sweep,
            shard: Some(shard),
            merged_from: f.merged_from,
            errors: s.error_indices.into_iter().zip(f.errors).collect(),
            points: s.point_indices.into_iter().zip(f.points).collect(),
        })
    }

    /// The bare points, in sweep order.
    pub fn bare_points(&self) -> Vec<CollisionPoint> {
        self.points.iter().map(|p| p.1.clone()).collect()
    }

    /// The problems, in sweep order.
    pub fn error_lines(&self) -> Vec<String> {
        self.errors.iter().map(|e| e.1.clone()).collect()
    }
}

/// Whether a `points.json` value is a partial result.
pub fn is_partial(v: &Value) -> Option<String> {
    let s = v.get("shard")?;
    Some(format!("{}/{}", s.get("index")?, s.get("count")?))
}

/// The `points.json` of `path`: the file, or `DIR/points.json`.
pub fn points_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("points.json")
    } else {
        path.to_path_buf()
    }
}

/// Reads the partial result at `path` (a directory or its points.json).
pub fn read_partial(path: &Path) -> Result<Run, PartialError> {
    let file = points_file(path);
    let what = file.display().to_string();
    if !file.is_file() {
        return Err(PartialError::NotThere(path.to_path_buf()));
    }
    let text = std::fs::read_to_string(&file).map_err(|source| PartialError::Read {
        what: what.clone(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|source| PartialError::Json {
        what: what.clone(),
        source,
    })?;
    Run::partial_from_json(v, &what)
}

/// The first place two JSON values differ, as "path: a vs b".
fn first_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(left), Value::Object(right)) => {
            let mut keys: Vec<&String> = left.keys().chain(right.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|key| {
                first_difference(
                    &format!("{path}.{key}"),
                    left.get(key).unwrap_or(&Value::Null),
                    right.get(key).unwrap_or(&Value::Null),
                )
            })
        }
        _ if a == b => None,
        _ => Some(format!("{path}: {a} vs {b}")),
    }
}

/// Combines the partial results `parts` (path, run) into the run a single
/// unsharded invocation would have recorded, or refuses: different
/// settings, kernels or shard counts, a shard missing or given twice, an
/// unfinished shard, points that overlap or are not their shard's.
/// `command` is the merge's own command line.
pub fn merge(parts: Vec<(String, Run)>, command: &str) -> Result<Run, MergeError> {
    let mut parts: Vec<(String, Shard, Run)> = parts
        .into_iter()
        .map(|(path, r)| match r.shard {
            Some(s) => Ok((path, s, r)),
            None => Err(MergeError::NotPartial(path)),
        })
        .collect::<Result<_, _>>()?;
    let Some((first_path, first_shard, _)) = parts.first() else {
        return Err(MergeError::Nothing);
    };
    let n = first_shard.count;
    let mut seen: Vec<Option<&str>> = vec![None; n];
    for (path, s, r) in &parts {
        if s.count != n {
            return Err(MergeError::CountsDiffer {
                first_path: first_path.clone(),
                first: *first_shard,
                path: path.clone(),
                shard: *s,
            });
        }
        if let Some(other) = seen[s.index - 1] {
            return Err(MergeError::Twice {
                shard: *s,
                first_path: other.to_string(),
                path: path.clone(),
            });
        }
        seen[s.index - 1] = Some(path);
        if !r.finished {
            return Err(MergeError::Unfinished {
                path: path.clone(),
                shard: *s,
            });
        }
    }
    let missing: Vec<String> = (1..=n)
        .filter(|i| seen[i - 1].is_none())
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(MergeError::Missing { missing, count: n });
    }
    parts.sort_by_key(|p| p.1.index);
    let (first_path, first) = (&parts[0].0, &parts[0].2);
    let settings = |r: &Run| {
        serde_json::json!({
            "guest": r.guest, "workload": r.workload,
            "sweep": {"kernels": r.sweep.kernels.iter().map(|k| &k.label).collect::<Vec<_>>(),
                      "flow_cnts": r.sweep.flow_cnts, "variants": r.sweep.variants,
                      "points": r.sweep.points},
        })
    };
    for (path, _, r) in &parts[1..] {
        if let Some(d) = first_difference("", &settings(first), &settings(r)) {
            return Err(MergeError::Settings {
                first_path: first_path.clone(),
                path: path.clone(),
                difference: d.trim_start_matches('.').to_string(),
            });
        }
    }
    let kernels = kernel_ids(&parts)?;
    let plan = first.sweep.plan();
    if plan.len() != first.sweep.points {
        return Err(MergeError::PointCount {
            path: first_path.clone(),
            recorded: first.sweep.points,
            planned: plan.len(),
        });
    }
    let mut owner: Vec<Option<&str>> = vec![None; plan.len()];
    let mut releases: Vec<Option<(&str, &str)>> = vec![None; kernels.len()];
    let mut points = Vec::new();
    let mut errors = Vec::new();
    for (path, s, r) in &parts {
        for (k, p) in &r.points {
            let Some(key) = plan.get(*k) else {
                return Err(MergeError::OutsideSweep {
                    path: path.clone(),
                    k: *k,
                    points: plan.len(),
                });
            };
            if let Some(other) = owner[*k] {
                return Err(MergeError::Overlap {
                    k: *k,
                    kernel: p.kernel.clone(),
                    rps_flow_cnt: p.rps_flow_cnt,
                    variant: key.variant,
                    first_path: other.to_string(),
                    path: path.clone(),
                });
            }
            owner[*k] = Some(path);
            if !s.selects(*k) {
                return Err(MergeError::NotTheShards {
                    path: path.clone(),
                    k: *k,
                    shard: *s,
                });
            }
            let label = &kernels[key.kernel].label;
            if p.kernel != *label
                || p.rps_flow_cnt != key.rps_flow_cnt
                || p.variant() != key.variant
            {
                return Err(MergeError::WrongPoint {
                    path: path.clone(),
                    k: *k,
                    got: (p.kernel.clone(), p.rps_flow_cnt, p.variant()),
                    want: (label.clone(), key.rps_flow_cnt, key.variant),
                });
            }
            match releases[key.kernel] {
                Some((rel, other)) if rel != p.release => {
                    return Err(MergeError::Kernel(Box::new(KernelDiffers {
                        label: label.clone(),
                        what: "its guest ran release",
                        a: rel.to_string(),
                        a_path: other.to_string(),
                        b: p.release.clone(),
                        b_path: path.clone(),
                    })))
                }
                Some(_) => {}
                None => releases[key.kernel] = Some((&p.release, path)),
            }
            points.push((*k, p.clone()));
        }
        errors.extend(r.errors.iter().cloned());
    }
    points.sort_by_key(|p| p.0);
    // Stable: at one point, the shards' order and each shard's own.
    errors.sort_by_key(|e| e.0);
    let mut machines: Vec<&str> = Vec::new();
    for (_, _, r) in &parts {
        if !machines.contains(&r.machine.as_str()) {
            machines.push(&r.machine);
        }
    }
    Ok(Run {
        command: command.to_string(),
        machine: machines.join("; "),
        started: parts
            .iter()
            .map(|p| p.2.started.clone())
            .min()
            .unwrap_or_default(),
        finished: true,
        elapsed_s: parts.iter().map(|p| p.2.elapsed_s).sum(),
        guest: first.guest.clone(),
        workload: first.workload.clone(),
        sweep: SweepDef {
            kernels,
            ..first.sweep.clone()
        },
        shard: None,
        merged_from: parts
            .iter()
            .map(|(path, s, r)| MergedFrom {
                path: path.clone(),
                shard: s.to_string(),
                command: r.command.clone(),
                machine: r.machine.clone(),
                started: r.started.clone(),
                elapsed_s: r.elapsed_s,
            })
            .collect(),
        errors,
        points,
    })
}

/// The sweep's kernels as the shards that looked at them saw them (a shard
/// with no point on a kernel records its label only); refuses when two
/// shards saw a different release or `.config`.
fn kernel_ids(parts: &[(String, Shard, Run)]) -> Result<Vec<KernelId>, MergeError> {
    let labels = &parts[0].2.sweep.kernels;
    let mut out: Vec<KernelId> = labels.iter().map(|k| KernelId::unused(&k.label)).collect();
    // Who set each field, for the message.
    let mut by: Vec<[&str; 2]> = vec![[""; 2]; out.len()];
    for (path, _, r) in parts {
        for (i, id) in r.sweep.kernels.iter().enumerate() {
            let k = &mut out[i];
            for (f, name, mine, theirs) in [
                (0, "release", &mut k.release, &id.release),
                (
                    1,
                    "config hash (FNV-1a 64 of its .config)",
                    &mut k.config_fnv64,
                    &id.config_fnv64,
                ),
            ] {
                match (mine.as_ref(), theirs) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(MergeError::Kernel(Box::new(KernelDiffers {
                            label: k.label.clone(),
                            what: name,
                            a: a.clone(),
                            a_path: by[i][f].to_string(),
                            b: b.clone(),
                            b_path: path.clone(),
                        })))
                    }
                    (None, Some(b)) => {
                        *mine = Some(b.clone());
                        by[i][f] = path;
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CNTS: [u32; 3] = [256, 512, 1024];
    const VARIANTS: [Variant; 2] = [Variant::One, Variant::Fast];
    /// Points that fail in the synthetic sweep (an error, no point).
    const FAILS: [usize; 2] = [4, 7];

    fn id(label: &str) -> KernelId {
        KernelId {
            label: label.into(),
            release: Some(format!("{label}.9")),
            config_fnv64: Some(format!("{:016x}", fnv64(label.as_bytes()))),
        }
    }

    /// What a run of the sweep 2 kernels x CNTS x VARIANTS records, whole
    /// (`shard` None) or one shard, with its points selected by the
    /// function the binary uses ([`Shard::points`]).
    fn fake_run(shard: Option<Shard>) -> Run {
        let labels = ["6.12", "7.3"];
        let plan = sweep(labels.len(), &CNTS, &VARIANTS);
        let mine = shard.map_or_else(|| (0..plan.len()).collect(), |s| s.points(plan.len()));
        let mut r = Run {
            command: format!(
                "scripts/experiment collisions --flow-cnt 256,512,1024 --variant one,fast{}",
                shard.map_or_else(String::new, |s| format!(" --shard {s}"))
            ),
            machine: "host: 2 CPUs".into(),
            started: format!("2026-12-0{} 10:00:00 UTC", shard.map_or(1, |s| s.index)),
            finished: true,
            elapsed_s: 60.0 * mine.len() as f64,
            guest: json!({"vcpus": 4, "queue_pairs": 4}),
            workload: json!({"flows_per_iteration": 332, "rate_pps": 2000, "duration_s": 60}),
            sweep: SweepDef {
                kernels: labels
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        if mine.iter().any(|&k| plan[k].kernel == i) {
                            id(l)
                        } else {
                            KernelId::unused(l)
                        }
                    })
                    .collect(),
                flow_cnts: CNTS.to_vec(),
                variants: VARIANTS.to_vec(),
                points: plan.len(),
            },
            shard,
            merged_from: Vec::new(),
            errors: Vec::new(),
            points: Vec::new(),
        };
        for k in mine {
            let key = &plan[k];
            let label = labels[key.kernel];
            if FAILS.contains(&k) {
                r.errors
                    .push((k, format!("{label} point {k}: workload failed")));
                continue;
            }
            r.points.push((
                k,
                CollisionPoint {
                    kernel: label.into(),
                    release: format!("{label}.9"),
                    rps_flow_cnt: key.rps_flow_cnt,
                    variant: Some(key.variant),
                    iterations: 1,
                    adds: 1000 + k as u64,
                    steer_calls: 3000 + k as u64,
                    duration_s: 60.0,
                    ..CollisionPoint::default()
                },
            ));
        }
        r
    }

    /// The partial results of an N-way split, read back from their json.
    fn partials(n: usize) -> Vec<(String, Run)> {
        (1..=n)
            .map(|i| {
                let r = fake_run(Some(Shard { index: i, count: n }));
                let path = format!("shard{i}");
                let back = Run::partial_from_json(r.to_json(), &path).unwrap();
                (path, back)
            })
            .collect()
    }

    /// A run's json without what legitimately differs between a merge
    /// and a whole run: when and where it ran (command, machine, started,
    /// elapsed_s) and the merge's record of its shards (merged_from).
    fn comparable(r: &Run) -> Value {
        let mut v = r.to_json();
        let o = v.as_object_mut().unwrap();
        for k in ["command", "machine", "started", "elapsed_s", "merged_from"] {
            o.remove(k);
        }
        v
    }

    #[test]
    fn shard_syntax() {
        assert_eq!(Shard::parse("3/4"), Ok(Shard { index: 3, count: 4 }));
        assert_eq!(Shard::parse("1/1"), Ok(Shard { index: 1, count: 1 }));
        assert_eq!(Shard::parse(" 2 / 4").unwrap().to_string(), "2/4");
        for (bad, why) in [
            ("0/2", "I counts from 1"),
            ("3/2", "I is above N"),
            ("1/0", "N is 0"),
            ("0/0", "N is 0"),
            ("2", "no '/'"),
            ("", "no '/'"),
            ("a/2", "I \"a\" is not a number"),
            ("1/", "N \"\" is not a number"),
            ("-1/2", "is not a number"),
            ("1/2/3", "N \"2/3\" is not a number"),
            ("1/1001", "N is above 1000"),
        ] {
            let e = Shard::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(why) && e.contains("expected I/N"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn shards_partition_the_sweep() {
        let plan = sweep(2, &CNTS, &VARIANTS);
        assert_eq!(plan.len(), 12);
        // The unsharded order: kernel, then size, then variant.
        assert_eq!(
            (plan[0].kernel, plan[0].rps_flow_cnt, plan[0].variant),
            (0, 256, Variant::One)
        );
        assert_eq!(
            (plan[1].kernel, plan[1].rps_flow_cnt, plan[1].variant),
            (0, 256, Variant::Fast)
        );
        assert_eq!((plan[6].kernel, plan[6].rps_flow_cnt), (1, 256));
        for n in 1..=14 {
            let mut owners = vec![0; plan.len()];
            for i in 1..=n {
                let s = Shard { index: i, count: n };
                for k in s.points(plan.len()) {
                    assert!(s.selects(k) && k % n == i - 1);
                    owners[k] += 1;
                }
            }
            assert!(owners.iter().all(|&o| o == 1), "N={n}: {owners:?}");
        }
        assert_eq!(Shard { index: 2, count: 3 }.points(12), [1, 4, 7, 10]);
    }

    #[test]
    fn partial_records_its_shard_and_the_sweep() {
        let v = fake_run(Some(Shard { index: 2, count: 3 })).to_json();
        assert_eq!(v["shard"]["index"], 2);
        assert_eq!(v["shard"]["count"], 3);
        // Points 1, 10 measured; 4 and 7 failed (errors, no points).
        assert_eq!(v["shard"]["point_indices"], json!([1, 10]));
        assert_eq!(v["shard"]["error_indices"], json!([4, 7]));
        assert_eq!(v["sweep"]["points"], 12);
        assert_eq!(v["sweep"]["kernels"][1]["release"], "7.3.9");
        assert_eq!(v["points"].as_array().unwrap().len(), 2);
        assert_eq!(is_partial(&v).as_deref(), Some("2/3"));
        // A whole run has no shard record.
        let whole = fake_run(None).to_json();
        assert!(whole.get("shard").is_none() && is_partial(&whole).is_none());
        let e = Run::partial_from_json(whole, "w").unwrap_err().to_string();
        assert!(e.contains("not a partial result"), "{e}");
        let e = Run::partial_from_json(json!({"points": []}), "old")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `sweep` record"), "{e}");
    }

    #[test]
    fn merged_shards_equal_the_whole_run() {
        let whole = fake_run(None);
        for n in [1, 2, 3, 4, 5, 12, 13] {
            let mut parts = partials(n);
            // The order of the directories on the command line is free.
            parts.reverse();
            let m = merge(parts, "scripts/experiment collisions --merge ...").unwrap();
            assert_eq!(comparable(&m), comparable(&whole), "N={n}");
            assert!(m.shard.is_none() && m.finished);
            assert_eq!(m.merged_from.len(), n);
            assert_eq!(m.merged_from[0].shard, format!("1/{n}"));
            assert_eq!(m.started, "2026-12-01 10:00:00 UTC");
            assert!((m.elapsed_s - whole.elapsed_s).abs() < 1e-9);
        }
    }

    fn refused(parts: Vec<(String, Run)>) -> String {
        merge(parts, "merge").unwrap_err().to_string()
    }

    #[test]
    fn merge_refuses_shard_sets_that_are_not_a_sweep() {
        let mut p = partials(3);
        p.remove(1);
        assert_eq!(
            refused(p),
            "shard 2/3 missing: a merge needs all 3 shards of the sweep"
        );
        let mut p = partials(3);
        p.push(p[0].clone());
        p[3].0 = "again".into();
        assert_eq!(refused(p), "shard 1/3 given twice: shard1 and again");
        let mut p = partials(3);
        p[2] = partials(2).remove(1);
        let e = refused(p);
        assert!(
            e.starts_with("shard counts differ: shard1 is shard 1/3, shard2 is shard 2/2"),
            "{e}"
        );
        let mut p = partials(2);
        p[1].1.finished = false;
        assert!(refused(p).contains("shard 2/2 did not finish"));
        let mut p = partials(2);
        p[0].1.shard = None;
        assert!(refused(p).contains("shard1: not a partial result"));
        assert!(refused(Vec::new()).contains("at least one"));
    }

    #[test]
    fn merge_refuses_other_settings_or_kernels() {
        let mut p = partials(2);
        p[1].1.workload["duration_s"] = json!(40);
        assert_eq!(
            refused(p),
            "settings differ between shard1 and shard2: workload.duration_s: 60 vs 40"
        );
        let mut p = partials(2);
        p[0].1.sweep.flow_cnts.push(2048);
        assert!(refused(p).contains("sweep.flow_cnts"));
        let mut p = partials(2);
        p[1].1.sweep.kernels[1].label = "7.2".into();
        assert!(refused(p).contains("sweep.kernels"));
        let mut p = partials(2);
        p[1].1.sweep.kernels[1].release = Some("7.3.10".into());
        assert_eq!(
            refused(p),
            "kernel 7.3 differs: release 7.3.9 in shard1, 7.3.10 in shard2"
        );
        let mut p = partials(2);
        p[1].1.sweep.kernels[0].config_fnv64 = Some("0123".into());
        let e = refused(p);
        assert!(e.starts_with("kernel 6.12 differs: config hash"), "{e}");
        // What the guests reported (uname -r) must agree too.
        let mut p = partials(2);
        p[1].1.points[0].1.release = "6.12.10".into();
        let e = refused(p);
        assert!(
            e.contains(
                "kernel 6.12 differs: its guest ran release 6.12.9 in shard1, 6.12.10 in shard2"
            ),
            "{e}"
        );
        // A shard with no point on a kernel records its label only: no conflict.
        let mut p = partials(2);
        p[1].1.sweep.kernels[0] = KernelId::unused("6.12");
        assert!(merge(p, "m").is_ok());
    }

    #[test]
    fn merge_refuses_points_that_overlap_or_stray() {
        // Shard 2 also holds shard 1's point 0.
        let mut p = partials(2);
        let stray = p[0].1.points[0].clone();
        p[1].1.points.push(stray.clone());
        let e = refused(p);
        assert!(
            e.starts_with(
                "points overlap: point 0 (6.12 rps_flow_cnt 256 One) is in shard1 and in shard2"
            ),
            "{e}"
        );
        // ... and shard 1 lost it.
        let mut p = partials(2);
        p[0].1.points.remove(0);
        p[1].1.points.push(stray);
        assert_eq!(refused(p), "shard2: point 0 is not shard 2/2's");
        let mut p = partials(2);
        p[0].1.points[0].0 = 12;
        assert!(refused(p).contains("point 12 is outside the sweep's 12 points"));
        let mut p = partials(2);
        p[0].1.points[1].1.rps_flow_cnt = 4096;
        let e = refused(p);
        assert!(e.contains("point 2 is 6.12 rps_flow_cnt 4096 One, the sweep's point 2 is 6.12 rps_flow_cnt 512 One"), "{e}");
        // A shard's index lists must match its points and errors.
        let mut v = fake_run(Some(Shard { index: 1, count: 2 })).to_json();
        v["shard"]["point_indices"] = json!([0]);
        let e = Run::partial_from_json(v, "p").unwrap_err().to_string();
        assert!(
            e.contains("point_indices holds 1 indices for 5 point(s)"),
            "{e}"
        );
        let mut v = fake_run(Some(Shard { index: 1, count: 2 })).to_json();
        v["shard"]["index"] = json!(3);
        let e = Run::partial_from_json(v, "p").unwrap_err().to_string();
        assert!(e.contains("shard 3/2: I is above N"), "{e}");
    }
}
