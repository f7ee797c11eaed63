//! The collision experiment's reader's page (`scripts/experiment
//! collisions --report DIR`): our points beside the numbers the 2025
//! slot-collision patch published, for the same rps_flow_cnt, as one
//! markdown page and one SVG per column, so that the shapes can be
//! compared at a glance.
//!
//! The two setups differ in scale, not in kind: the patch ran 12K TCP
//! connections over 144 queues of an E810 (ice driver) for 10 minutes per
//! point; this device runs a few hundred UDP flows over 4 queues of an
//! emulated guest for under a minute. Compare shapes and old/new ratios,
//! not absolute counts.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use vnic_trace::plot::{self, Line, Panel};
use vnic_trace::summary::units;

use crate::scenarios::experiments::{CollisionPoint, Variant};

/// Why the reader's page was not written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Creating the directory or writing a file of the page failed.
    #[error("{}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the report compares two kernels (original code first, new code second); the points have {0}"
    )]
    Kernels(usize),
    #[error(transparent)]
    Plot(#[from] plot::DrawError),
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// One row of the patch's tables.
#[derive(Clone, Copy, Debug)]
pub struct PatchRow {
    pub iterations: u32,
    pub new_code: bool,
    pub rps: u32,
    pub latency_us: f64,
    pub add: f64,
    pub del: f64,
    pub steer_c: f64,
    pub steer_l: f64,
}

/// A row: variant, code, rps_flow_cnt, then [Latency, Add, Del, Steer-C,
/// Steer-L].
const fn row(iterations: u32, new_code: bool, rps: u32, v: [f64; 5]) -> PatchRow {
    PatchRow {
        iterations,
        new_code,
        rps,
        latency_us: v[0],
        add: v[1],
        del: v[2],
        steer_c: v[3],
        steer_l: v[4],
    }
}

const K: f64 = 1e3;
const M: f64 = 1e6;

/// Where [`PATCH`] comes from.
pub const PATCH_SOURCE: &str =
    "the 2025 patch on rps_dev_flow slot collisions (its commit message): \
12K TCP connections on an E810 NIC (ice driver, 144 queues), 10 min per point in one \
iteration, or 5 x 2 min with new connections each time (60K in all); Latency in us";

/// The patch's published tables, as printed (K and M rounded there).
#[rustfmt::skip]
pub const PATCH: [PatchRow; 32] = [
    row(1, false, 256, [229.05, 3.5 * M, 3.5 * M, 114.4 * M, 274.8 * M]),
    row(1, false, 512, [225.01, 12.0 * M, 12.0 * M, 58.2 * M, 194.2 * M]),
    row(1, false, 1024, [228.86, 16.9 * M, 16.9 * M, 26.9 * M, 191.5 * M]),
    row(1, false, 2048, [218.46, 10.1 * M, 10.1 * M, 12.3 * M, 113.9 * M]),
    row(1, false, 4096, [224.93, 5.5 * M, 5.5 * M, 6.3 * M, 63.6 * M]),
    row(1, false, 8192, [218.22, 3.0 * M, 3.0 * M, 3.5 * M, 36.3 * M]),
    row(1, false, 16384, [219.62, 1.3 * M, 1.3 * M, 1.5 * M, 15.9 * M]),
    row(1, false, 32768, [225.29, 644.4 * K, 632.5 * K, 752.1 * K, 7.1 * M]),
    row(1, true, 256, [202.32, 12.1 * K, 4119.0, 12.4 * K, 66.9 * K]),
    row(1, true, 512, [201.22, 11.0 * K, 304.0, 11.0 * K, 57.0 * K]),
    row(1, true, 1024, [200.63, 11.5 * K, 68.0, 11.5 * K, 62.0 * K]),
    row(1, true, 2048, [201.60, 11.7 * K, 47.0, 11.7 * K, 64.3 * K]),
    row(1, true, 4096, [207.21, 11.8 * K, 47.0, 11.8 * K, 65.5 * K]),
    row(1, true, 8192, [201.91, 11.9 * K, 45.0, 12.0 * K, 66.4 * K]),
    row(1, true, 16384, [201.80, 11.9 * K, 6.0, 12.0 * K, 66.2 * K]),
    row(1, true, 32768, [202.27, 11.9 * K, 1.0, 12.0 * K, 66.3 * K]),
    row(5, false, 256, [241.39, 1.8 * M, 1.8 * M, 126.8 * M, 308.2 * M]),
    row(5, false, 512, [239.41, 9.9 * M, 9.9 * M, 80.4 * M, 264.2 * M]),
    row(5, false, 1024, [252.52, 13.8 * M, 13.7 * M, 97.7 * M, 507.5 * M]),
    row(5, false, 2048, [277.41, 7.9 * M, 7.9 * M, 137.8 * M, 630.2 * M]),
    row(5, false, 4096, [278.36, 3.9 * M, 3.9 * M, 127.4 * M, 604.5 * M]),
    row(5, false, 8192, [287.86, 2.1 * M, 2.1 * M, 122.8 * M, 586.1 * M]),
    row(5, false, 16384, [285.90, 1.0 * M, 989.8 * K, 124.0 * M, 593.4 * M]),
    row(5, false, 32768, [283.82, 510.8 * K, 498.9 * K, 124.8 * M, 600.9 * M]),
    row(5, true, 256, [218.30, 54.1 * K, 47.4 * K, 231.4 * K, 1.1 * M]),
    row(5, true, 512, [220.20, 54.7 * K, 47.1 * K, 125.7 * K, 786.4 * K]),
    row(5, true, 1024, [221.11, 56.2 * K, 46.5 * K, 116.0 * K, 749.0 * K]),
    row(5, true, 2048, [215.96, 57.7 * K, 46.3 * K, 96.6 * K, 715.2 * K]),
    row(5, true, 4096, [212.95, 58.5 * K, 46.8 * K, 85.2 * K, 699.9 * K]),
    row(5, true, 8192, [213.57, 59.1 * K, 47.2 * K, 79.2 * K, 695.8 * K]),
    row(5, true, 16384, [217.85, 59.2 * K, 47.4 * K, 84.6 * K, 705.5 * K]),
    row(5, true, 32768, [212.84, 59.3 * K, 47.4 * K, 73.5 * K, 690.0 * K]),
];

/// The patch's row for (variant, code, rps_flow_cnt); five-iteration
/// points of ours (any iteration count > 1) meet its five-run tables, the
/// one-iteration and high-rate ones its one-run tables.
pub fn patch_row(iterations: u32, new_code: bool, rps: u32) -> Option<&'static PatchRow> {
    let it = if iterations > 1 { 5 } else { 1 };
    PATCH
        .iter()
        .find(|r| r.iterations == it && r.new_code == new_code && r.rps == rps)
}

/// A column of both tables.
#[derive(Clone, Copy)]
struct Column {
    name: &'static str,
    file: &'static str,
    ours: fn(&CollisionPoint) -> Option<f64>,
    patch: fn(&PatchRow) -> f64,
}

const COLUMNS: [Column; 5] = [
    Column {
        name: "Latency",
        file: "latency.svg",
        ours: |p| {
            p.latency
                .as_ref()
                .filter(|l| l.replies > 0)
                .map(|l| l.mean_us)
        },
        patch: |r| r.latency_us,
    },
    Column {
        name: "Add",
        file: "add.svg",
        ours: |p| Some(p.adds as f64),
        patch: |r| r.add,
    },
    Column {
        name: "Del",
        file: "del.svg",
        ours: |p| Some(p.dels as f64),
        patch: |r| r.del,
    },
    Column {
        name: "Steer-C",
        file: "steer-c.svg",
        ours: |p| Some(p.steer_calls as f64),
        patch: |r| r.steer_c,
    },
    Column {
        name: "Steer-L",
        file: "steer-l.svg",
        ours: |p| p.steer_walked.map(|v| v as f64),
        patch: |r| r.steer_l,
    },
];

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| units(v.round() as u64))
}

/// A latency in us: whole microseconds, thousands separated ("57,459").
fn fmt_us(v: Option<f64>) -> String {
    let Some(v) = v else {
        return "-".into();
    };
    let digits = format!("{}", v.round() as u64);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// ACK->guest: median / p99 ms of a point's "ACK to first steered frame".
fn ack_cell(p: Option<&CollisionPoint>) -> String {
    match p.and_then(|p| p.ack_to_first.as_ref()).filter(|a| a.n > 0) {
        Some(a) => format!("{:.1} / {:.1}", a.p50_ms, a.p99_ms),
        None => "-".into(),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a / b < 10.0 => format!("{:.1}x", a / b),
        (Some(a), Some(b)) if b > 0.0 => format!("{:.0}x", a / b),
        _ => "-".into(),
    }
}

/// The kernels of `points` in order: the first is the original code,
/// the second the new (as `--check` reads them).
fn kernels(points: &[CollisionPoint]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    for p in points {
        if !v.iter().any(|(k, _)| *k == p.kernel) {
            v.push((p.kernel.clone(), p.release.clone()));
        }
    }
    v
}

/// Writes `report.md` and one SVG per column into `dir`; returns the files.
/// `about` describes our run (command, date, machine).
pub fn write_report(
    points: &[CollisionPoint],
    about: &str,
    dir: &Path,
) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    let ks = kernels(points);
    if ks.len() != 2 {
        return Err(ReportError::Kernels(ks.len()));
    }
    let (old, new) = (&ks[0], &ks[1]);
    let mut variants: Vec<Variant> = points.iter().map(CollisionPoint::variant).collect();
    variants.sort_unstable();
    variants.dedup();
    let at = |kernel: &str, v: Variant, rps: u32| {
        points
            .iter()
            .find(|p| p.kernel == kernel && p.variant() == v && p.rps_flow_cnt == rps)
    };
    // The patch's table a variant meets: its five-run one for ours with
    // iterations, its one-run one otherwise.
    let patch_it = |v: Variant| if v == Variant::Five { 5 } else { 1 };
    let mut md = String::new();
    let _ = writeln!(md, "# Slot collisions on vnic beside the 2025 patch\n");
    let _ = writeln!(md, "Ours: {about}  ");
    let _ = writeln!(
        md,
        "Original code: {} ({}); new code: {} ({}).  ",
        old.0, old.1, new.0, new.1
    );
    let _ = writeln!(md, "Patch: {PATCH_SOURCE}.\n");
    let _ = writeln!(
        md,
        "Each cell is **ours / patch** at the same rps_flow_cnt. The setups differ in scale \
         (a few hundred flows for under a minute against 12K connections for 10 minutes), \
         so compare the shapes and the old/new ratios, not the counts. Steer-L: the patch \
         counts the aRFS entries ice's steer call walks in a hash list; ours counts the \
         entries vnic_arfs's rhashtable lookups compare (about one per call, \
         `-` for runs before the counter existed). Latency: the patch's is its workload's \
         (patch: {:.0}-{:.0} us old, {:.0}-{:.0} us new); ours is the mean round trip of the \
         workload's own datagrams, stamped and timed by the device and echoed by the guest's \
         receivers, under TCG emulation: compare old against new at the same rps_flow_cnt, \
         not against the patch's microseconds. ACK->guest (ours only): Latency's guest-side \
         twin, from each ADD's or REPLACE's trace time (its ACK) to the first frame of the \
         flow the guest got on the queue it names, median and p99 in ms over the point's \
         lines (`-` for runs before it).\n",
        PATCH
            .iter()
            .filter(|r| !r.new_code)
            .map(|r| r.latency_us)
            .fold(f64::MAX, f64::min),
        PATCH
            .iter()
            .filter(|r| !r.new_code)
            .map(|r| r.latency_us)
            .fold(0.0, f64::max),
        PATCH
            .iter()
            .filter(|r| r.new_code)
            .map(|r| r.latency_us)
            .fold(f64::MAX, f64::min),
        PATCH
            .iter()
            .filter(|r| r.new_code)
            .map(|r| r.latency_us)
            .fold(0.0, f64::max),
    );
    for &v in &variants {
        let first = points.iter().find(|p| p.variant() == v);
        let title = match (v, first) {
            (Variant::Five, Some(p)) => format!("{} iterations (patch: 5)", p.iterations),
            (Variant::Fast, Some(p)) => format!(
                "High rate: {} pps, programming latency {} ms (patch: its one-iteration table)",
                p.rate_pps, p.program_latency_ms
            ),
            _ => "One iteration".to_string(),
        };
        let it = patch_it(v);
        let _ = writeln!(md, "## {title}\n");
        let _ = writeln!(
            md,
            "| RPS | Latency old | Latency new | ACK->guest old | ACK->guest new | Add old | Add new | Add old/new | Del old | Del new | Steer-C old | Steer-C new | Steer-C/Add old | Steer-L old | Steer-L new |"
        );
        let _ = writeln!(
            md,
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        let mut cnts: Vec<u32> = points
            .iter()
            .filter(|p| p.variant() == v)
            .map(|p| p.rps_flow_cnt)
            .collect();
        cnts.sort_unstable();
        cnts.dedup();
        for rps in cnts {
            let (po, pn) = (at(&old.0, v, rps), at(&new.0, v, rps));
            let (ro, rn) = (patch_row(it, false, rps), patch_row(it, true, rps));
            let cell = |c: &Column, p: Option<&CollisionPoint>, r: Option<&PatchRow>| {
                let f = if c.name == "Latency" { fmt_us } else { fmt };
                format!("{} / {}", f(p.and_then(c.ours)), f(r.map(c.patch)))
            };
            let [lat, add, del, sc, sl] = &COLUMNS;
            let _ = writeln!(
                md,
                "| {rps} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} / {} | {} | {} |",
                cell(lat, po, ro),
                cell(lat, pn, rn),
                ack_cell(po),
                ack_cell(pn),
                cell(add, po, ro),
                cell(add, pn, rn),
                ratio(po.and_then(add.ours), pn.and_then(add.ours)),
                ratio(ro.map(add.patch), rn.map(add.patch)),
                cell(del, po, ro),
                cell(del, pn, rn),
                cell(sc, po, ro),
                cell(sc, pn, rn),
                ratio(po.and_then(sc.ours), po.and_then(add.ours)),
                ratio(ro.map(sc.patch), ro.map(add.patch)),
                cell(sl, po, ro),
                cell(sl, pn, rn),
            );
        }
        let _ = writeln!(md);
    }
    let mut files = vec![dir.join("report.md")];
    let _ = writeln!(md, "## Plots\n");
    for c in &COLUMNS {
        let panels: Vec<Panel> = variants
            .iter()
            .map(|&v| {
                let mut lines = Vec::new();
                for (code, (k, release)) in [(false, old), (true, new)] {
                    let ours: Vec<(f64, f64)> = points
                        .iter()
                        .filter(|p| p.kernel == *k && p.variant() == v)
                        .filter_map(|p| Some((f64::from(p.rps_flow_cnt), (c.ours)(p)?)))
                        .collect();
                    if !ours.is_empty() {
                        lines.push(Line {
                            name: format!("ours, {release}"),
                            color: usize::from(code),
                            dashed: false,
                            points: ours,
                        });
                    }
                    let patch_it = patch_it(v);
                    lines.push(Line {
                        name: format!("patch, {} code", if code { "new" } else { "original" }),
                        color: usize::from(code),
                        dashed: true,
                        points: PATCH
                            .iter()
                            .filter(|r| r.iterations == patch_it && r.new_code == code)
                            .map(|r| (f64::from(r.rps), (c.patch)(r)))
                            .collect(),
                    });
                }
                Panel {
                    caption: format!(
                        "{}: {}",
                        c.name,
                        match v {
                            Variant::One => "one iteration",
                            Variant::Five => "iterations",
                            Variant::Fast => "high rate",
                        }
                    ),
                    x_desc: "rps_flow_cnt (slots per rx queue)".into(),
                    y_desc: c.name.to_lowercase(),
                    lines,
                }
            })
            .collect();
        let path = dir.join(c.file);
        let svg = plot::render_panels(
            &format!("{}: ours (solid) and the patch (dashed)", c.name),
            &panels,
            &path,
        )?;
        std::fs::write(&path, svg).map_err(write_err(&path))?;
        let _ = writeln!(md, "![{}]({})\n", c.name, c.file);
        files.push(path);
    }
    std::fs::write(&files[0], md).map_err(write_err(&files[0]))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(kernel: &str, rps: u32, adds: u64) -> CollisionPoint {
        CollisionPoint {
            kernel: kernel.into(),
            release: format!("{kernel}.0"),
            rps_flow_cnt: rps,
            iterations: 1,
            adds,
            steer_calls: adds * 2,
            ..CollisionPoint::default()
        }
    }

    #[test]
    fn latency_cells_are_whole_microseconds() {
        assert_eq!(fmt_us(Some(57_459.4)), "57,459");
        assert_eq!(fmt_us(Some(1_017_139.0)), "1,017,139");
        assert_eq!(fmt_us(Some(229.05)), "229");
        assert_eq!(fmt_us(None), "-");
    }

    #[test]
    fn the_patch_tables_are_complete() {
        for it in [1, 5] {
            for code in [false, true] {
                for k in 8..=15 {
                    assert!(
                        patch_row(it, code, 1 << k).is_some(),
                        "{it} {code} {}",
                        1 << k
                    );
                }
            }
        }
        let r = patch_row(1, false, 256).unwrap();
        let n = |v: f64| v.round() as u64;
        assert_eq!((n(r.add), n(r.steer_c)), (3_500_000, 114_400_000));
        assert_eq!(n(patch_row(3, true, 32768).unwrap().add), 59_300);
    }

    #[test]
    fn the_page_puts_ours_beside_the_patch() {
        let dir = std::env::temp_dir().join(format!("vnic-report-{}", std::process::id()));
        let mut pts = [point("6.12", 256, 13148), point("7.3", 256, 217)];
        // ACK->guest: unknown for the old point, measured for the new.
        pts[1].ack_to_first = Some(crate::scenarios::experiments::AckToFirst {
            n: 217,
            unmeasured: 0,
            p50_ms: 12.5,
            p99_ms: 31.0,
            max_ms: 40.0,
        });
        let files = write_report(&pts, "test run", &dir).unwrap();
        let md = std::fs::read_to_string(&files[0]).unwrap();
        assert!(
            md.contains(
                "| 256 | - / 229 | - / 202 | - | 12.5 / 31.0 | 13.1 K / 3.5 M | 217 / 12.1 K | 61x / 289x |"
            ),
            "{md}"
        );
        assert!(
            md.contains("- / 274.8 M"),
            "Steer-L unknown for old points: {md}"
        );
        assert_eq!(files.len(), 6);
        assert!(std::fs::read_to_string(&files[1]).unwrap().contains("<svg"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(write_report(&pts[..1], "one kernel", &dir).is_err());
    }
}
