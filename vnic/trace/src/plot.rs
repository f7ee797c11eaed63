//! `vnic trace plot`: table writes over time and table occupancy, one SVG
//! with two panels (plotters, SVG backend, no system fonts).
//!
//! Two streaming passes over the file: the first finds the time span, the
//! second counts events into buckets of a "nice" width (1, 2 or 5 x 10^k ns)
//! chosen so that there are at most [`MAX_BUCKETS`] buckets.

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use arfs::{EventKind, TraceRecord};
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;

use super::reader::{self, LineStats, ReadError};

/// Most buckets in the time axis.
pub const MAX_BUCKETS: u64 = 200;

/// The binned series.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Smallest ts_ns: time 0 of the plot.
    pub t0_ns: u64,
    /// Bucket width in ns.
    pub bucket_ns: u64,
    /// `add` lines per bucket.
    pub adds: Vec<u64>,
    /// `del` lines per bucket.
    pub dels: Vec<u64>,
    /// `replace` lines per bucket.
    pub replaces: Vec<u64>,
    /// Live filters at the end of each bucket (the last value before it when
    /// the bucket has no event).
    pub live: Vec<u64>,
    /// Lines of the second pass.
    pub lines: LineStats,
}

/// The smallest 1/2/5 x 10^k at least `x` (x >= 1).
pub fn nice_ceil(x: u64) -> u64 {
    let mut p: u64 = 1;
    loop {
        for m in [1, 2, 5] {
            let v = p.saturating_mul(m);
            if v >= x || v == u64::MAX {
                return v;
            }
        }
        p = p.saturating_mul(10);
    }
}

/// Bucket width for a span (ns).
pub fn bucket_width(span_ns: u64) -> u64 {
    nice_ceil(span_ns.div_ceil(MAX_BUCKETS).max(1))
}

/// A duration in ns as text (`50 ms`, `2 s`, `500 us`).
pub fn ns_text(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 && n % 1_000_000_000 == 0 => format!("{} s", n / 1_000_000_000),
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{} ms", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{} us", n / 1_000),
        n => format!("{n} ns"),
    }
}

/// Plotters failed to draw (into a string: it has no file to fail on).
#[derive(Debug)]
pub struct DrawError {
    /// The SVG file the picture was for (named in the message).
    pub out: PathBuf,
    /// What plotters reported.
    pub source: DrawingAreaErrorKind<io::Error>,
}

impl fmt::Display for DrawError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: cannot draw the plot: {}",
            self.out.display(),
            self.source
        )
    }
}

impl std::error::Error for DrawError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// For callers that report errors as text (the guest-tests' sweep plots,
/// `?` in functions returning `Result<_, String>`).
impl From<DrawError> for String {
    fn from(e: DrawError) -> Self {
        e.to_string()
    }
}

/// Why `vnic trace plot` failed.
#[derive(Debug)]
pub enum PlotError {
    /// The trace cannot be read.
    Read(ReadError),
    /// The trace has no valid record: nothing to plot.
    NoRecords { path: PathBuf },
    /// Drawing failed.
    Draw(DrawError),
    /// The SVG file cannot be written.
    Write { out: PathBuf, source: io::Error },
}

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read(e) => e.fmt(f),
            Self::NoRecords { path } => {
                write!(f, "{}: no valid trace records to plot", path.display())
            }
            Self::Draw(e) => e.fmt(f),
            Self::Write { out, source } => write!(f, "{}: cannot write: {source}", out.display()),
        }
    }
}

impl std::error::Error for PlotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Read and Draw are transparent: their text is this error's.
        match self {
            Self::Read(e) => e.source(),
            Self::Draw(e) => e.source(),
            Self::Write { source, .. } => Some(source),
            Self::NoRecords { .. } => None,
        }
    }
}

impl From<ReadError> for PlotError {
    fn from(e: ReadError) -> Self {
        Self::Read(e)
    }
}

impl From<DrawError> for PlotError {
    fn from(e: DrawError) -> Self {
        Self::Draw(e)
    }
}

/// Reads `path` twice and bins it.
pub fn bin(path: &Path) -> Result<Series, PlotError> {
    let mut span: Option<(u64, u64)> = None;
    reader::for_each_record(path, |r| {
        span = Some(span.map_or((r.ts_ns, r.ts_ns), |(a, b)| {
            (a.min(r.ts_ns), b.max(r.ts_ns))
        }));
    })?;
    let Some((t0, t1)) = span else {
        return Err(PlotError::NoRecords {
            path: path.to_path_buf(),
        });
    };
    let width = bucket_width(t1 - t0);
    let n = ((t1 - t0) / width + 1) as usize;
    let mut s = Series {
        t0_ns: t0,
        bucket_ns: width,
        adds: vec![0; n],
        dels: vec![0; n],
        replaces: vec![0; n],
        live: vec![0; n],
        lines: LineStats::default(),
    };
    // Live ids (as in the summary): robust to a missing line, never negative.
    let mut live: HashSet<u16> = HashSet::new();
    let mut set: Vec<Option<u64>> = vec![None; n];
    s.lines = reader::for_each_record(path, |r: &TraceRecord| {
        // A file that grew between the passes: clamp into the last bucket.
        let b = (((r.ts_ns.max(t0) - t0) / width) as usize).min(n - 1);
        match r.event {
            EventKind::Add => {
                s.adds[b] += 1;
                live.extend(r.id);
            }
            EventKind::Replace => {
                s.replaces[b] += 1;
                if let Some(p) = r.prev_id {
                    live.remove(&p);
                }
                live.extend(r.id);
            }
            EventKind::Del => {
                s.dels[b] += 1;
                if let Some(id) = r.id {
                    live.remove(&id);
                }
            }
            EventKind::Evict => {
                if let Some(id) = r.id {
                    live.remove(&id);
                }
            }
            EventKind::Reset => live.clear(),
            _ => return,
        }
        set[b] = Some(live.len() as u64);
    })?;
    let mut cur = 0;
    for (v, x) in s.live.iter_mut().zip(&set) {
        if let Some(x) = x {
            cur = *x;
        }
        *v = cur;
    }
    Ok(s)
}

fn err(out: &Path) -> impl Fn(DrawingAreaErrorKind<io::Error>) -> DrawError + '_ {
    move |source| DrawError {
        out: out.to_path_buf(),
        source,
    }
}

/// Draws `s` as SVG text.
pub fn render(s: &Series, title: &str, out: &Path) -> Result<String, DrawError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 760)).into_drawing_area();
        root.fill(&WHITE).map_err(err(out))?;
        let root = root.titled(title, ("sans-serif", 28)).map_err(err(out))?;
        let (upper, lower) = root.split_vertically(370);
        let n = s.adds.len();
        let w_s = s.bucket_ns as f64 / 1e9;
        let x_max = (n as f64 * w_s).max(f64::MIN_POSITIVE);
        // Counts at bucket centres, occupancy at bucket ends from (0, 0).
        let centre = |i: usize| (i as f64 + 0.5) * w_s;
        let ops_max = s
            .adds
            .iter()
            .chain(&s.dels)
            .chain(&s.replaces)
            .copied()
            .max()
            .unwrap_or(0);
        let bucket = ns_text(s.bucket_ns);

        let mut c = ChartBuilder::on(&upper)
            .margin(12)
            .margin_right(30)
            .caption(
                format!("Filter table writes per {bucket} bucket"),
                ("sans-serif", 24),
            )
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, 0u64..(ops_max + ops_max / 10 + 1))
            .map_err(err(out))?;
        c.configure_mesh()
            .label_style(("sans-serif", 18))
            .axis_desc_style(("sans-serif", 20))
            .x_desc("time since the first event (s)")
            .y_desc(format!("lines per {bucket}"))
            .draw()
            .map_err(err(out))?;
        for (name, data, color) in [
            ("add", &s.adds, BLUE),
            ("del", &s.dels, RED),
            ("replace", &s.replaces, RGBColor(0, 150, 0)),
        ] {
            c.draw_series(LineSeries::new(
                data.iter().enumerate().map(|(i, &v)| (centre(i), v)),
                color.stroke_width(2),
            ))
            .map_err(err(out))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 20))
            .draw()
            .map_err(err(out))?;

        let live_max = s.live.iter().copied().max().unwrap_or(0);
        let mut c = ChartBuilder::on(&lower)
            .margin(12)
            .margin_right(30)
            .caption("Table occupancy", ("sans-serif", 24))
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, 0u64..(live_max + live_max / 10 + 1))
            .map_err(err(out))?;
        c.configure_mesh()
            .label_style(("sans-serif", 18))
            .axis_desc_style(("sans-serif", 20))
            .x_desc("time since the first event (s)")
            .y_desc("live filters")
            .draw()
            .map_err(err(out))?;
        c.draw_series(LineSeries::new(
            std::iter::once((0.0, 0)).chain(
                s.live
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| ((i + 1) as f64 * w_s, v)),
            ),
            BLACK.stroke_width(2),
        ))
        .map_err(err(out))?
        .label("live filters (end of bucket)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 20))
            .draw()
            .map_err(err(out))?;
        root.present().map_err(err(out))?;
    }
    Ok(svg)
}

/// One line of a [`Panel`]: a name for the legend, a colour index and the
/// points (x, y); `dashed` draws it dashed (a variant of another line).
#[derive(Clone, Debug)]
pub struct Line {
    pub name: String,
    pub color: usize,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// One panel of [`render_panels`]: both axes logarithmic (sweeps over table
/// sizes, counts spanning several orders of magnitude).
#[derive(Clone, Debug)]
pub struct Panel {
    pub caption: String,
    pub x_desc: String,
    pub y_desc: String,
    pub lines: Vec<Line>,
}

/// Colours of [`Line::color`], in order.
const PALETTE: [RGBColor; 4] = [BLUE, RED, RGBColor(0, 150, 0), BLACK];

/// Draws log-log panels stacked vertically as SVG text, in the style of
/// [`render`] (used by the guest-tests experiments for sweep plots). Points
/// with a non-positive coordinate cannot be drawn on a log axis and are left
/// out (the caller's table still shows them).
pub fn render_panels(title: &str, panels: &[Panel], out: &Path) -> Result<String, DrawError> {
    let mut svg = String::new();
    {
        let height = 60 + 380 * panels.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err(out))?;
        let root = root.titled(title, ("sans-serif", 28)).map_err(err(out))?;
        let areas = root.split_evenly((panels.len().max(1), 1));
        for (p, area) in panels.iter().zip(&areas) {
            let pts = || {
                p.lines
                    .iter()
                    .flat_map(|l| l.points.iter())
                    .filter(|(x, y)| *x > 0.0 && *y > 0.0)
            };
            let (x0, x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| {
                (a.min(*x), b.max(*x))
            });
            let (y0, y1) = pts().fold((f64::MAX, f64::MIN), |(a, b), (_, y)| {
                (a.min(*y), b.max(*y))
            });
            // x: powers of two (table sizes); y: whole decades, so that
            // both axes always carry labelled ticks.
            let (x0, x1) = if x0 > x1 {
                (1.0, 16.0)
            } else {
                (x0 / 1.2, x1 * 1.2)
            };
            let (y0, y1) = if y0 > y1 {
                (1.0, 10.0)
            } else {
                let lo = 10f64.powf(y0.log10().floor());
                (lo, 10f64.powf((y1 * 1.01).log10().ceil()).max(lo * 10.0))
            };
            let mut c = ChartBuilder::on(area)
                .margin(12)
                .margin_right(30)
                .caption(&p.caption, ("sans-serif", 24))
                .x_label_area_size(50)
                .y_label_area_size(90)
                .build_cartesian_2d((x0..x1).log_scale().base(2.0), (y0..y1).log_scale())
                .map_err(err(out))?;
            c.configure_mesh()
                .label_style(("sans-serif", 18))
                .axis_desc_style(("sans-serif", 20))
                .x_desc(p.x_desc.as_str())
                .y_desc(p.y_desc.as_str())
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| super::summary::units(v.round() as u64))
                .draw()
                .map_err(err(out))?;
            for l in &p.lines {
                let color = PALETTE[l.color % PALETTE.len()];
                let pts: Vec<(f64, f64)> = l
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| *x > 0.0 && *y > 0.0)
                    .collect();
                let style = color.stroke_width(2);
                let dashed = l.dashed;
                if dashed {
                    c.draw_series(DashedLineSeries::new(pts.clone(), 8, 6, style))
                        .map_err(err(out))?
                } else {
                    c.draw_series(LineSeries::new(pts.clone(), style))
                        .map_err(err(out))?
                }
                .label(l.name.as_str())
                .legend(move |(x, y)| {
                    // Dashed lines get a dashed legend glyph.
                    let gap = if dashed { 6 } else { 0 };
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (10 - gap / 2, 0)], color.stroke_width(2))
                        + PathElement::new(vec![(10 + gap / 2, 0), (20, 0)], color.stroke_width(2))
                });
                c.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))
                    .map_err(err(out))?;
            }
            c.configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 18))
                .draw()
                .map_err(err(out))?;
        }
        root.present().map_err(err(out))?;
    }
    Ok(svg)
}

/// `vnic trace plot FILE -o OUT`: returns a one-line report.
pub fn plot(path: &Path, out: &Path) -> Result<String, PlotError> {
    let s = bin(path)?;
    let title = format!(
        "vnic trace {}",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into_owned()
        )
    );
    let svg = render(&s, &title, out)?;
    std::fs::write(out, svg).map_err(|source| PlotError::Write {
        out: out.to_path_buf(),
        source,
    })?;
    Ok(format!(
        "wrote {}: {} records, {} buckets of {} ({} malformed lines skipped)",
        out.display(),
        s.lines.records,
        s.adds.len(),
        ns_text(s.bucket_ns),
        s.lines.malformed
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_nice_and_few() {
        assert_eq!(nice_ceil(1), 1);
        assert_eq!(nice_ceil(3), 5);
        assert_eq!(nice_ceil(7), 10);
        assert_eq!(nice_ceil(11), 20);
        assert_eq!(bucket_width(0), 1);
        // 10 s: 50 ms buckets, 201 of them.
        assert_eq!(bucket_width(10_000_000_000), 50_000_000);
        for span in [0, 1, 999, 10_000_000_000, 600_000_000_000, u64::MAX] {
            assert!(span / bucket_width(span) <= MAX_BUCKETS, "{span}");
        }
        assert_eq!(ns_text(50_000_000), "50 ms");
        assert_eq!(ns_text(2_000_000_000), "2 s");
    }

    #[test]
    fn panels_draw_lines_and_skip_what_log_axes_cannot_show() {
        let panel = Panel {
            caption: "Add".into(),
            x_desc: "rps_flow_cnt".into(),
            y_desc: "adds".into(),
            lines: vec![
                Line {
                    name: "old code".into(),
                    color: 0,
                    dashed: false,
                    points: vec![(256.0, 3500.0), (512.0, 1200.0), (1024.0, 0.0)],
                },
                Line {
                    name: "new code".into(),
                    color: 1,
                    dashed: true,
                    points: vec![(256.0, 250.0), (512.0, 251.0)],
                },
            ],
        };
        let svg = render_panels("sweep", &[panel.clone(), panel], Path::new("x.svg")).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        assert!(svg.contains("old code") && svg.contains("new code"));
        assert!(svg.contains("sweep"));
        // Two panels x (2 + 2 drawable points) markers; the zero is left out.
        assert_eq!(svg.matches("<circle").count(), 8, "{svg}");
        // No panel at all still gives a valid (empty) picture.
        assert!(render_panels("none", &[], Path::new("x.svg")).is_ok());
    }

    #[test]
    fn failures_are_reported_by_kind_with_the_same_text() {
        use std::error::Error as _;
        let dir = std::env::temp_dir().join(format!("vnic-trace-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();

        let missing = dir.join("missing.jsonl");
        let e = plot(&missing, &dir.join("out.svg")).unwrap_err();
        assert!(
            matches!(&e, PlotError::Read(ReadError::Open { .. })),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .starts_with(&format!("{}: cannot open: ", missing.display())));

        let empty = dir.join("empty.jsonl");
        std::fs::write(&empty, "\nnot json\n").unwrap();
        let e = plot(&empty, &dir.join("out.svg")).unwrap_err();
        assert!(
            matches!(&e, PlotError::NoRecords { path } if *path == empty),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("{}: no valid trace records to plot", empty.display())
        );
        assert!(e.source().is_none());

        let trace = dir.join("trace.jsonl");
        std::fs::write(&trace, "{\"ts_ns\":1,\"event\":\"reset\",\"gen\":0}\n").unwrap();
        let out = dir.join("no-such-dir").join("out.svg");
        let e = plot(&trace, &out).unwrap_err();
        assert!(
            matches!(&e, PlotError::Write { out: o, .. } if *o == out),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .starts_with(&format!("{}: cannot write: ", out.display())));
        assert!(e.source().is_some());

        let e = DrawError {
            out: "x.svg".into(),
            source: DrawingAreaErrorKind::LayoutError,
        };
        assert_eq!(e.to_string(), "x.svg: cannot draw the plot: Bad layout");
        assert!(e.source().is_some());
        assert_eq!(String::from(e), "x.svg: cannot draw the plot: Bad layout");

        std::fs::remove_dir_all(&dir).unwrap();
    }
}
