//! Sequences of control-socket request lines over one connection.
//!
//! Each line is drawn as *valid* (every command with sane arguments; `gen`
//! flow sets small and slow), *edge* (well-formed JSON at the limits:
//! knob values out of range or of the wrong type, unknown keys and
//! fields, flow specs with zero, huge or reversed ranges and bad
//! addresses, ids nobody started, JSON that is not an object, duplicate
//! keys, deep nesting, odd whitespace, CRLF, a byte-order mark, unicode)
//! or *malformed* (random bytes with NULs and invalid UTF-8, JSON cut
//! short, empty lines). A sequence may also send a line over the 1 MiB
//! limit (the daemon answers with an error and closes) or end in the
//! middle of a line and disconnect. The daemon answers every complete
//! line with exactly one line, in order (CTL.md): the sequence reads them
//! back, with a bound on the wait, pipelining a few lines at a time.
//! Every sequence ends with `gen stop` so that no flow set it started
//! outlives it.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::Duration;

use super::vhost::Class;
use super::{RawConn, ReadError, Rng};

/// The daemon's request line limit (CTL.md).
pub const LINE_LIMIT: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct Config {
    /// Most lines of one sequence (each sequence draws 1..=this).
    pub max_lines: usize,
    /// How long the daemon may take to answer what was sent.
    pub reply_timeout: Duration,
    pub trace: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_lines: 48,
            reply_timeout: Duration::from_secs(10),
            trace: false,
        }
    }
}

#[derive(Debug, Default)]
pub struct Outcome {
    /// Complete lines written.
    pub requests: u64,
    /// Reply lines read.
    pub replies: u64,
    pub kinds: BTreeMap<(Class, &'static str), u64>,
    /// The daemon closed the connection (after an over-long line).
    pub closed_by_daemon: bool,
    /// The sequence ended in the middle of a line.
    pub cut: bool,
    /// Replies that did not come in time.
    pub stalled: Option<String>,
    /// The daemon broke its protocol (CTL.md): what it did.
    pub violation: Option<String>,
    pub trace: Vec<String>,
}

const KNOBS: [&str; 19] = [
    "add_fail_rate",
    "mgmt_loss_rate",
    "program_latency",
    "table_capacity",
    "buckets",
    "misroute",
    "misroute_rate",
    "drop_rate",
    "corrupt_rate",
    "bad_csum_rate",
    "truncate_rate",
    "reorder_rate",
    "delay_effect_ms",
    "wrong_trace",
    "rogue_responder",
    "rogue_nonce",
    "drop_acks",
    "forge_acks",
    "nonsense_knob",
];

fn q(s: &&str) -> String {
    serde_json::Value::String((*s).to_owned()).to_string()
}

struct Seq<'a> {
    rng: Rng,
    cfg: &'a Config,
    out: Outcome,
}

/// Runs sequence `seed` against the control socket at `path`.
pub fn run(path: &Path, seed: u64, cfg: &Config) -> io::Result<Outcome> {
    let conn = RawConn::connect(path, cfg.reply_timeout)?;
    let mut s = Seq {
        rng: Rng::new(seed),
        cfg,
        out: Outcome::default(),
    };
    let n = s.rng.range(1, cfg.max_lines.max(1) as u64);
    let mut sent = 0u64;
    let mut read = 0u64;
    let mut lines = 0u64;
    let mut i = 0;
    while i < n {
        // A burst of 1..=8 lines, then their replies.
        let burst = s.rng.range(1, 8).min(n - i);
        let mut batch = Vec::new();
        for _ in 0..burst {
            let (class, kind, mut line) = s.draw();
            if s.cfg.trace {
                let shown: String = String::from_utf8_lossy(&line[..line.len().min(160)]).into();
                s.out
                    .trace
                    .push(format!("{class:?} {kind} ({} bytes): {shown}", line.len()));
            }
            line.push(b'\n');
            *s.out.kinds.entry((class, kind)).or_default() += 1;
            batch.extend_from_slice(&line);
            sent += 1;
        }
        i += burst;
        if conn.send(&batch, &[]).is_err() {
            s.out.closed_by_daemon = true;
            return Ok(s.finish(sent, read));
        }
        match conn.read_lines_until(&mut lines, sent, cfg.reply_timeout) {
            Ok(l) => read = l,
            Err(ReadError::Closed | ReadError::Io(_)) => {
                s.out.closed_by_daemon = true;
                read = lines;
                return Ok(s.finish(sent, read));
            }
            Err(ReadError::Timeout) => {
                s.out.stalled = Some(format!(
                    "{} of {sent} request lines answered within {:?}",
                    lines, cfg.reply_timeout
                ));
                return Ok(s.finish(sent, lines));
            }
        }
    }
    // Whatever the sequence started, it stops.
    let stop = b"{\"cmd\":\"gen\",\"op\":\"stop\"}\n";
    if conn.send(stop, &[]).is_ok() {
        sent += 1;
        match conn.read_lines_until(&mut lines, sent, cfg.reply_timeout) {
            Ok(l) => read = l,
            Err(ReadError::Timeout) => {
                s.out.stalled = Some(format!(
                    "no reply to the closing gen stop within {:?}",
                    cfg.reply_timeout
                ));
            }
            Err(_) => s.out.closed_by_daemon = true,
        }
    }
    // The end: close cleanly, after a huge line, or mid-line.
    match s.rng.below(40) {
        0 => {
            let mut big = vec![b' '; LINE_LIMIT + 1 + s.rng.below(4096) as usize];
            big.extend_from_slice(b"{\"cmd\":\"stats\"}\n");
            *s.out
                .kinds
                .entry((Class::Malformed, "line_over_limit"))
                .or_default() += 1;
            if conn.send(&big, &[]).is_ok() {
                sent += 1;
                // One error reply, then the daemon closes.
                match conn.read_lines_until(&mut lines, sent, cfg.reply_timeout) {
                    Ok(l) => read = l,
                    Err(ReadError::Timeout) => {
                        s.out.stalled = Some("no reply to a line over the limit".into());
                    }
                    Err(_) => {}
                }
                match conn.read_lines_until(&mut lines, sent + 1, cfg.reply_timeout) {
                    Err(ReadError::Closed) => s.out.closed_by_daemon = true,
                    _ => {
                        s.out.violation = Some(format!(
                            "a request line of {} bytes (over the {LINE_LIMIT}-byte limit) was not refused with one error reply and a disconnect",
                            big.len() - 1
                        ));
                    }
                }
            }
        }
        1..=3 => {
            let (_, kind, line) = s.draw();
            let cut = s.rng.below(line.len().max(1) as u64) as usize;
            *s.out
                .kinds
                .entry((Class::Malformed, "cut_line"))
                .or_default() += 1;
            let _ = kind;
            let _ = conn.send(&line[..cut.max(1).min(line.len())], &[]);
            s.out.cut = true;
        }
        _ => {}
    }
    Ok(s.finish(sent, read))
}

impl Seq<'_> {
    fn finish(mut self, sent: u64, read: u64) -> Outcome {
        self.out.requests = sent;
        self.out.replies = read;
        self.out
    }

    fn draw(&mut self) -> (Class, &'static str, Vec<u8>) {
        let r = self.rng.below(100);
        if r < 55 {
            let (k, l) = self.valid();
            (Class::Valid, k, l.into_bytes())
        } else if r < 88 {
            let (k, l) = self.edge();
            (Class::Edge, k, l)
        } else {
            let (k, l) = self.malformed();
            (Class::Malformed, k, l)
        }
    }

    fn flow_spec(&mut self) -> String {
        let mut f = Vec::new();
        if self.rng.chance(70) {
            f.push(format!("\"flows\":{}", self.rng.range(1, 8)));
        }
        if self.rng.chance(50) {
            let lo = 10_000 + self.rng.below(50_000);
            f.push(format!("\"sport\":\"{lo}-{}\"", lo + self.rng.below(8)));
        }
        if self.rng.chance(30) {
            f.push(format!("\"dport\":\"{}\"", self.rng.range(1, 65535)));
        }
        f.push(format!("\"count\":{}", self.rng.range(1, 200)));
        f.push(format!("\"rate\":{}", self.rng.range(1, 1000)));
        if self.rng.chance(30) {
            f.push(format!("\"size\":{}", self.rng.range(64, 1500)));
        }
        if self.rng.chance(20) {
            f.push(format!("\"stamp\":{}", self.rng.chance(50)));
        }
        format!("{{{}}}", f.join(","))
    }

    fn valid(&mut self) -> (&'static str, String) {
        match self.rng.below(12) {
            0..=2 => ("stats", r#"{"cmd":"stats"}"#.into()),
            3 => ("table", r#"{"cmd":"table"}"#.into()),
            4 => ("knobs", r#"{"cmd":"knobs"}"#.into()),
            5 => ("trace_flush", r#"{"cmd":"trace_flush"}"#.into()),
            6 | 7 => {
                let (k, v) = match self.rng.below(8) {
                    0 => (
                        "add_fail_rate",
                        format!("{}", self.rng.below(100) as f64 / 100.0),
                    ),
                    1 => ("mgmt_loss_rate", "0".into()),
                    2 => ("program_latency", q(self.rng.pick(&["0", "500us", "2ms"]))),
                    3 => ("misroute", q(self.rng.pick(&["0", "off"]))),
                    4 => ("drop_rate", "0".into()),
                    5 => ("rogue_responder", "0".into()),
                    6 => ("buckets", q(self.rng.pick(&["none", "64x2", "128x4"]))),
                    _ => ("table_capacity", format!("{}", self.rng.range(1, 8192))),
                };
                ("set", format!(r#"{{"cmd":"set","key":"{k}","value":{v}}}"#))
            }
            8 | 9 => {
                let spec = self.flow_spec();
                (
                    "gen_start",
                    format!(r#"{{"cmd":"gen","op":"start","flow":{spec}}}"#),
                )
            }
            10 => {
                let op = *self.rng.pick(&["list", "pause", "resume", "stop"]);
                if self.rng.chance(50) || op == "list" {
                    ("gen_op", format!(r#"{{"cmd":"gen","op":"{op}"}}"#))
                } else {
                    let id = self.rng.range(1, 40);
                    (
                        "gen_op_id",
                        format!(r#"{{"cmd":"gen","op":"{op}","id":{id}}}"#),
                    )
                }
            }
            _ => {
                let id = self.rng.range(1, 40);
                let spec = self.flow_spec();
                (
                    "gen_set",
                    format!(r#"{{"cmd":"gen","op":"set","id":{id},"flow":{spec}}}"#),
                )
            }
        }
    }

    fn edge_value(&mut self) -> String {
        match self.rng.below(12) {
            0 => "-1".into(),
            1 => "2.5".into(),
            2 => "1e308".into(),
            3 => "1e999".into(),
            4 => "18446744073709551616".into(),
            5 => q(self.rng.pick(&[
                "nan",
                "inf",
                "-0",
                "",
                "   ",
                "1s1",
                "999999999999s",
                "0x10",
                "65536x65536",
                "0x0",
                "1x0",
            ])),
            6 => "null".into(),
            7 => "true".into(),
            8 => "[1,2]".into(),
            9 => "{\"a\":1}".into(),
            10 => format!("{}", self.rng.edge_u64()),
            _ => q(&"\u{1F600}\u{0}\u{202E}"),
        }
    }

    fn edge(&mut self) -> (&'static str, Vec<u8>) {
        let s: (&'static str, String) = match self.rng.below(14) {
            0..=2 => {
                let k = *self.rng.pick(&KNOBS);
                let v = self.edge_value();
                (
                    "set_edge",
                    format!(r#"{{"cmd":"set","key":"{k}","value":{v}}}"#),
                )
            }
            3 | 4 => {
                let field = *self.rng.pick(&[
                    "flows", "sport", "dport", "src", "dst", "count", "rate", "size", "stamp",
                    "bogus",
                ]);
                let v = match self.rng.below(6) {
                    0 => "0".into(),
                    1 => format!("{}", self.rng.edge_u64()),
                    2 => q(self.rng.pick(&[
                        "65535-1",
                        "0-65535",
                        "1-",
                        "-",
                        "10.0.0.300",
                        "::1-::ffff",
                        "10.0.0.1-9.0.0.1",
                        "a-b",
                        "70000",
                    ])),
                    3 => "-5".into(),
                    4 => "1.5".into(),
                    _ => self.edge_value(),
                };
                let op = *self.rng.pick(&["start", "set"]);
                (
                    "gen_edge",
                    format!(
                        r#"{{"cmd":"gen","op":"{op}","id":1,"flow":{{"{field}":{v},"count":1,"rate":1}}}}"#
                    ),
                )
            }
            5 => {
                let id = match self.rng.below(3) {
                    0 => "0".into(),
                    1 => format!("{}", self.rng.edge_u64()),
                    _ => self.edge_value(),
                };
                let op = *self
                    .rng
                    .pick(&["pause", "resume", "stop", "set", "list", "frob", ""]);
                (
                    "gen_bad_id",
                    format!(r#"{{"cmd":"gen","op":"{op}","id":{id}}}"#),
                )
            }
            6 => (
                "unknown_cmd",
                format!(
                    r#"{{"cmd":{}}}"#,
                    q(self.rng.pick(&["", "STATS", "stats ", "reboot", "\u{0}"]))
                ),
            ),
            7 => ("extra_field", r#"{"cmd":"stats","extra":1}"#.into()),
            8 => (
                "not_an_object",
                (*self.rng.pick(&[
                    "[]",
                    "[{\"cmd\":\"stats\"}]",
                    "42",
                    "\"stats\"",
                    "null",
                    "true",
                    "{}",
                ]))
                .into(),
            ),
            9 => ("duplicate_key", r#"{"cmd":"stats","cmd":"table"}"#.into()),
            10 => {
                let d = *self.rng.pick(&[64usize, 127, 128, 129, 1000, 100_000]);
                let mut s = String::with_capacity(2 * d + 20);
                s.push_str("{\"cmd\":\"stats\",\"x\":");
                s.push_str(&"[".repeat(d));
                s.push_str(&"]".repeat(d));
                s.push('}');
                ("deep_nesting", s)
            }
            11 => {
                let l = *self.rng.pick(&[
                    " {\"cmd\":\"stats\"} ",
                    "\t{ \"cmd\" : \"knobs\" }\t",
                    "{\"cmd\":\"stats\"}\r",
                    "\u{FEFF}{\"cmd\":\"stats\"}",
                    "{\"cmd\":\"st\\u0061ts\"}",
                ]);
                ("odd_whitespace", l.into())
            }
            12 => {
                // A long line under the limit (a big unknown field).
                let n = *self
                    .rng
                    .pick(&[4096usize, 65536, 512 * 1024, LINE_LIMIT - 64]);
                let mut s = String::with_capacity(n + 40);
                s.push_str("{\"cmd\":\"stats\",\"pad\":\"");
                s.push_str(&"x".repeat(n));
                s.push_str("\"}");
                ("long_line", s)
            }
            _ => (
                "gen_flows_huge",
                format!(
                    r#"{{"cmd":"gen","op":"start","flow":{{"flows":{},"count":1,"rate":1}}}}"#,
                    *self
                        .rng
                        .pick(&[0u64, 65536, 1 << 20, u64::from(u32::MAX), 1 << 32])
                ),
            ),
        };
        (s.0, s.1.into_bytes())
    }

    fn malformed(&mut self) -> (&'static str, Vec<u8>) {
        match self.rng.below(4) {
            0 => {
                let n = self.rng.range(1, 200) as usize;
                let mut b: Vec<u8> = (0..n).map(|_| self.rng.next_u32() as u8).collect();
                b.retain(|&c| c != b'\n');
                if b.is_empty() {
                    b.push(0xff);
                }
                ("random_bytes", b)
            }
            1 => {
                let (_, l) = self.valid();
                let cut = self.rng.range(1, l.len() as u64 - 1) as usize;
                ("truncated_json", l.as_bytes()[..cut].to_vec())
            }
            2 => ("empty_line", Vec::new()),
            _ => {
                let (_, l) = self.valid();
                let mut b = l.into_bytes();
                let i = self.rng.below(b.len() as u64) as usize;
                b[i] = *self.rng.pick(&[0u8, 0xc3, 0xff, b'"', b'}', b'\\']);
                ("corrupted_json", b)
            }
        }
    }
}
