//! `vnic trace ...`: offline tools over a trace written by `vnic serve
//! --trace FILE` (format: `aRFS/TRACE.md`; commands: `vnic/TRACE-TOOLS.md`).

pub mod plot;
pub mod reader;
pub mod summary;

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    pub cmd: TraceCmd,
}

#[derive(Subcommand, Debug)]
pub enum TraceCmd {
    /// Count what the filter table did (a table in the style of the slot-collision patch).
    ///
    /// Add / Del / Replace / Reject with their reasons, Steer-C from the guest module's
    /// counters, churn per second, thrashing flows and per-queue filter hits; a legend says
    /// what each number counts. `--json` prints the same for scripts (vnic/TRACE-TOOLS.md).
    Summary(SummaryArgs),
    /// Plot table writes and table occupancy over time into one SVG file.
    ///
    /// Top panel: add, del and replace lines per time bucket (auto-sized, at most ~200
    /// buckets); bottom panel: live filters at the end of each bucket. Time in seconds
    /// since the first event.
    Plot(PlotArgs),
}

#[derive(Args, Debug)]
pub struct SummaryArgs {
    /// Trace file (JSON lines from `vnic serve --trace FILE`). Read as a stream; malformed
    /// lines are counted and reported, not fatal.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The guest module's debugfs `counters` file(s)
    /// (/sys/kernel/debug/vnic_arfs/IFNAME/counters, copied out): Steer-C is the sum of their
    /// `steer_calls`. Repeat the option or list several files (then put FILE first:
    /// `summary trace.jsonl --module-stats a b`).
    #[arg(long, value_name = "FILE", num_args = 1.., action = clap::ArgAction::Append)]
    pub module_stats: Vec<PathBuf>,
    /// A `vnic ctl table` dump taken after the trace ended: adds the hits of the filters
    /// still live (which no trace line reports) to the per-queue table.
    #[arg(long, value_name = "FILE")]
    pub final_table: Option<PathBuf>,
    /// Print the summary as one JSON object (shape in vnic/TRACE-TOOLS.md) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Exact counts in the table instead of the patch's K / M units.
    #[arg(long)]
    pub exact: bool,
    /// Thrashing flows listed (most programmed first).
    #[arg(long, value_name = "N", default_value = "10")]
    pub top: usize,
}

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// Trace file (JSON lines from `vnic serve --trace FILE`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Output SVG file (overwritten).
    #[arg(short = 'o', long = "output", value_name = "OUT.svg")]
    pub output: PathBuf,
}

/// Why `vnic trace ...` failed.
#[derive(Debug)]
pub enum TraceError {
    /// `vnic trace summary`: the trace or a side file is not usable.
    Summary(summary::SummaryError),
    /// `vnic trace summary --json`: the summary cannot be encoded.
    Json(serde_json::Error),
    /// `vnic trace plot` failed.
    Plot(plot::PlotError),
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Summary(e) => e.fmt(f),
            Self::Json(e) => write!(f, "cannot encode the summary as JSON: {e}"),
            Self::Plot(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Summary(e) => Some(e),
            Self::Json(e) => Some(e),
            Self::Plot(e) => Some(e),
        }
    }
}

/// Runs `vnic trace ...`.
pub fn run(args: &TraceArgs) -> Result<(), TraceError> {
    match &args.cmd {
        TraceCmd::Summary(a) => {
            let s = summary::summarize(
                &a.file,
                &summary::Options {
                    module_stats: a.module_stats.clone(),
                    final_table: a.final_table.clone(),
                    top: a.top,
                },
            )
            .map_err(TraceError::Summary)?;
            if a.json {
                let text = serde_json::to_string_pretty(&s).map_err(TraceError::Json)?;
                println!("{text}");
            } else {
                print!("{}", summary::render(&s, a.exact));
            }
            Ok(())
        }
        TraceCmd::Plot(a) => {
            let msg = plot::plot(&a.file, &a.output).map_err(TraceError::Plot)?;
            eprintln!("{msg}");
            Ok(())
        }
    }
}
