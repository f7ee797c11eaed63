//! Streaming reader of trace files: one JSON object per line, parsed into
//! [`arfs::TraceRecord`]. Lines that are not a valid record (bad JSON, an
//! unknown event, a missing field the event needs, an over-long line, a
//! truncated last line) are counted and skipped, never fatal; only I/O errors
//! stop the read.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arfs::{EventKind, TraceRecord};
use serde::Serialize;

/// Longest line accepted. A valid record is well under 1 KiB; anything longer
/// is skipped (without being held in memory) and counted as malformed.
pub const MAX_LINE: usize = 64 * 1024;

/// Malformed lines quoted in the report (the rest are only counted).
pub const MAX_EXAMPLES: usize = 5;

/// One malformed line quoted in the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Malformed {
    /// 1-based line number.
    pub line: u64,
    /// What is wrong with it.
    pub error: String,
}

/// What reading a file found, besides the records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LineStats {
    /// Lines read (the last one counts even without a final newline).
    pub total: u64,
    /// Lines that parsed as a trace record with the fields its event needs.
    pub records: u64,
    /// Empty or all-blank lines (skipped, not an error).
    pub blank: u64,
    /// Lines skipped as not a valid record.
    pub malformed: u64,
    /// The first few malformed lines.
    pub malformed_examples: Vec<Malformed>,
    /// Bytes read.
    pub bytes: u64,
}

impl LineStats {
    fn malformed(&mut self, line: u64, error: String) {
        self.malformed += 1;
        if self.malformed_examples.len() < MAX_EXAMPLES {
            self.malformed_examples.push(Malformed { line, error });
        }
    }
}

/// Why a trace file could not be read (a malformed line is not an error: it
/// is counted in [`LineStats`]).
#[derive(Debug)]
pub enum ReadError {
    /// The file cannot be opened.
    Open { path: PathBuf, source: io::Error },
    /// The path is a directory.
    IsDir { path: PathBuf },
    /// Reading failed after `after_line` lines.
    Read {
        path: PathBuf,
        after_line: u64,
        source: io::Error,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open { path, source } => write!(f, "{}: cannot open: {source}", path.display()),
            Self::IsDir { path } => {
                write!(f, "{}: is a directory, not a trace file", path.display())
            }
            Self::Read {
                path,
                after_line,
                source,
            } => write!(
                f,
                "{}: read error after line {after_line}: {source}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Open { source, .. } | Self::Read { source, .. } => Some(source),
            Self::IsDir { .. } => None,
        }
    }
}

/// A record without a field its event needs (from [`validate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissingField {
    /// The record's event.
    pub event: EventKind,
    /// The first missing field, as named in the trace.
    pub field: &'static str,
}

impl fmt::Display for MissingField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` record without `{}`",
            event_name(self.event),
            self.field
        )
    }
}

impl std::error::Error for MissingField {}

/// Checks that a record carries the fields its event needs to be counted
/// (TRACE.md, table "Events"). Other fields are optional here.
pub fn validate(r: &TraceRecord) -> Result<(), MissingField> {
    let need: &[(&str, bool)] = match r.event {
        EventKind::Add => &[
            ("id", r.id.is_some()),
            ("rxq", r.rxq.is_some()),
            ("flow", r.flow.is_some()),
        ],
        EventKind::Replace => &[
            ("id", r.id.is_some()),
            ("rxq", r.rxq.is_some()),
            ("flow", r.flow.is_some()),
            ("prev_id", r.prev_id.is_some()),
            ("prev_rxq", r.prev_rxq.is_some()),
            ("hits", r.hits.is_some()),
        ],
        EventKind::Del => &[
            ("id", r.id.is_some()),
            ("rxq", r.rxq.is_some()),
            ("hits", r.hits.is_some()),
            ("reason", r.reason.is_some()),
        ],
        EventKind::Evict => &[
            ("id", r.id.is_some()),
            ("rxq", r.rxq.is_some()),
            ("hits", r.hits.is_some()),
        ],
        EventKind::Reject
        | EventKind::UnknownDel
        | EventKind::BadFrame
        | EventKind::MgmtDrop
        | EventKind::Flush => &[("reason", r.reason.is_some())],
        EventKind::RuleSet => &[("loc", r.loc.is_some()), ("rule", r.rule.is_some())],
        EventKind::RuleDel => &[
            ("loc", r.loc.is_some()),
            ("rule", r.rule.is_some()),
            ("hits", r.hits.is_some()),
        ],
        EventKind::RuleReject => &[("loc", r.loc.is_some()), ("reason", r.reason.is_some())],
        EventKind::RssSet => &[
            ("status", r.status.is_some()),
            ("context", r.context.is_some()),
            ("default_indir", r.default_indir.is_some()),
            ("default_key", r.default_key.is_some()),
            ("key", r.key.is_some()),
        ],
        EventKind::Reset | EventKind::Ack | EventKind::GenChange => &[],
    };
    match need.iter().find(|(_, present)| !present) {
        Some(&(field, _)) => Err(MissingField {
            event: r.event,
            field,
        }),
        None => Ok(()),
    }
}

/// The `event` name of a kind, as in the trace.
pub fn event_name(k: EventKind) -> &'static str {
    match k {
        EventKind::Add => "add",
        EventKind::Replace => "replace",
        EventKind::Del => "del",
        EventKind::Reject => "reject",
        EventKind::UnknownDel => "unknown_del",
        EventKind::Flush => "flush",
        EventKind::Evict => "evict",
        EventKind::Reset => "reset",
        EventKind::Ack => "ack",
        EventKind::GenChange => "gen_change",
        EventKind::BadFrame => "bad_frame",
        EventKind::MgmtDrop => "mgmt_drop",
        EventKind::RuleSet => "rule_set",
        EventKind::RuleDel => "rule_del",
        EventKind::RuleReject => "rule_reject",
        EventKind::RssSet => "rss_set",
    }
}

/// Progress on stderr for long reads (only when stderr is a terminal).
struct Progress {
    enabled: bool,
    size: Option<u64>,
    start: Instant,
    last: Instant,
    shown: bool,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(2);

    fn new(size: Option<u64>) -> Self {
        let now = Instant::now();
        Self {
            enabled: io::stderr().is_terminal(),
            size,
            start: now,
            last: now,
            shown: false,
        }
    }

    fn tick(&mut self, path: &Path, bytes: u64) {
        if !self.enabled || self.last.elapsed() < Self::EVERY {
            return;
        }
        self.last = Instant::now();
        let mib = bytes as f64 / (1 << 20) as f64;
        let mut e = io::stderr().lock();
        let _ = match self.size {
            Some(s) if s > 0 => write!(
                e,
                "\rvnic trace: {}: {mib:.0} MiB read ({:.0}%, {:.0} s)",
                path.display(),
                bytes as f64 * 100.0 / s as f64,
                self.start.elapsed().as_secs_f64()
            ),
            _ => write!(e, "\rvnic trace: {}: {mib:.0} MiB read", path.display()),
        };
        self.shown = true;
    }

    fn done(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

/// Reads `path` line by line, calling `f` with every valid record in file
/// order. Memory use does not depend on the file size.
pub fn for_each_record(
    path: &Path,
    mut f: impl FnMut(&TraceRecord),
) -> Result<LineStats, ReadError> {
    let file = File::open(path).map_err(|source| ReadError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let size = file.metadata().ok().map(|m| m.len());
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(ReadError::IsDir {
            path: path.to_path_buf(),
        });
    }
    let mut r = BufReader::with_capacity(1 << 16, file);
    let mut stats = LineStats::default();
    let mut progress = Progress::new(size);
    let mut buf = Vec::with_capacity(1024);
    loop {
        let (n, too_long) = read_line(&mut r, &mut buf).map_err(|source| ReadError::Read {
            path: path.to_path_buf(),
            after_line: stats.total,
            source,
        })?;
        if n == 0 {
            break;
        }
        stats.total += 1;
        stats.bytes += n as u64;
        let line = stats.total;
        if too_long {
            stats.malformed(line, format!("longer than {MAX_LINE} bytes"));
        } else if buf.iter().all(u8::is_ascii_whitespace) {
            stats.blank += 1;
        } else {
            match serde_json::from_slice::<TraceRecord>(&buf) {
                Ok(rec) => match validate(&rec) {
                    Ok(()) => {
                        stats.records += 1;
                        f(&rec);
                    }
                    Err(e) => stats.malformed(line, e.to_string()),
                },
                Err(e) => stats.malformed(line, e.to_string()),
            }
        }
        if line % 65_536 == 0 {
            progress.tick(path, stats.bytes);
        }
    }
    progress.done();
    Ok(stats)
}

/// Reads one line (without its `\n`) into `buf`. Returns the bytes consumed
/// (0 at end of file) and whether the line exceeded [`MAX_LINE`] (then `buf`
/// is left empty and the rest of the line is skipped without being stored).
fn read_line(r: &mut impl BufRead, buf: &mut Vec<u8>) -> io::Result<(usize, bool)> {
    buf.clear();
    let mut consumed = 0usize;
    let mut too_long = false;
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok((consumed, too_long));
        }
        let (chunk, used, end) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], i + 1, true),
            None => (avail, avail.len(), false),
        };
        if !too_long {
            if buf.len() + chunk.len() > MAX_LINE {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        consumed += used;
        r.consume(used);
        if end {
            return Ok((consumed, too_long));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_capped() {
        let long = "x".repeat(MAX_LINE + 10);
        let text = format!("a\n\n{long}\nlast");
        let mut r = BufReader::with_capacity(16, text.as_bytes());
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (2, false));
        assert_eq!(buf, b"a");
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (1, false));
        assert!(buf.is_empty());
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (MAX_LINE + 11, true));
        assert!(buf.is_empty());
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (4, false));
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut r, &mut buf).unwrap(), (0, false));
    }

    #[test]
    fn a_record_without_a_needed_field_names_it() {
        let r: TraceRecord =
            serde_json::from_str(r#"{"ts_ns":1,"event":"replace","gen":0,"id":3,"rxq":1}"#)
                .unwrap();
        let e = validate(&r).unwrap_err();
        assert_eq!(
            e,
            MissingField {
                event: EventKind::Replace,
                field: "flow"
            }
        );
        assert_eq!(e.to_string(), "`replace` record without `flow`");
        let r: TraceRecord =
            serde_json::from_str(r#"{"ts_ns":1,"event":"reset","gen":0}"#).unwrap();
        assert_eq!(validate(&r), Ok(()));
    }

    #[test]
    fn read_errors_name_the_file_and_what_failed() {
        use std::error::Error as _;
        let dir = std::env::temp_dir().join(format!("vnic-trace-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("no-such-trace.jsonl");

        let e = for_each_record(&missing, |_| {}).unwrap_err();
        assert!(
            matches!(&e, ReadError::Open { path, source }
                if *path == missing && source.kind() == io::ErrorKind::NotFound),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}: cannot open: ", missing.display())),
            "{text}"
        );
        assert!(e.source().is_some());

        let e = for_each_record(&dir, |_| {}).unwrap_err();
        assert!(
            matches!(&e, ReadError::IsDir { path } if *path == dir),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("{}: is a directory, not a trace file", dir.display())
        );
        assert!(e.source().is_none());

        let e = ReadError::Read {
            path: "t.jsonl".into(),
            after_line: 7,
            source: io::Error::other("disk gone"),
        };
        assert_eq!(e.to_string(), "t.jsonl: read error after line 7: disk gone");
        assert!(e.source().is_some());
        std::fs::remove_dir(&dir).unwrap();
    }
}
