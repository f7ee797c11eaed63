//! What the suite knows about the guest module `vnic_arfs.ko`: its name,
//! parameters and debugfs files (aRFS/kmod/README.md).

use std::collections::BTreeMap;
use std::time::Duration;
use vnic_ctl_proto::Stats;

pub const NAME: &str = "vnic_arfs";
pub const DEBUGFS_DIR: &str = "/sys/kernel/debug/vnic_arfs";
/// Run-time writable parameters live here.
pub const PARAMS_DIR: &str = "/sys/module/vnic_arfs/parameters";

/// The run-time `expiry` parameter: `rps`, `ice` or `idle:MS`.
pub fn expiry_param() -> String {
    format!("{PARAMS_DIR}/expiry")
}

/// `expiry` with the idle backstop on after `ms`, or the default (`rps`)
/// for 0.
pub fn idle_expiry(ms: u32) -> String {
    if ms == 0 {
        "rps".to_string()
    } else {
        format!("idle:{ms}")
    }
}

/// Module parameters the scenarios use.
#[derive(Debug, Clone)]
pub struct ModuleParams {
    /// Period of the work item (send, retransmit check, expiry pass).
    pub interval_ms: u32,
    /// Filters examined per expiry pass.
    pub expire_quota: u32,
    /// Idle backstop (`expiry=idle:MS`) used by the expiry scenarios once
    /// the flows stopped. While flows run the module keeps its default
    /// (`expiry=rps`, what users meet): the module only sees steer calls,
    /// and a working filter stops them, so a live flow would lose its
    /// filter after this long.
    pub idle_timeout_ms: u32,
    /// Anything else, verbatim (`name=value ...`).
    pub extra: String,
}

impl Default for ModuleParams {
    fn default() -> Self {
        ModuleParams {
            interval_ms: 100,
            expire_quota: 64,
            idle_timeout_ms: 2000,
            extra: String::new(),
        }
    }
}

impl ModuleParams {
    /// Load-time parameters: the module's default expiry (`rps`).
    pub fn to_params(&self, ifname: &str) -> String {
        format!(
            "ifnames={ifname} interval_ms={} expire_quota={} {}",
            self.interval_ms, self.expire_quota, self.extra
        )
        .trim()
        .to_string()
    }

    /// The longest a dead flow's filter may live once the idle backstop is
    /// on: the idle timeout, plus enough expiry passes to visit every
    /// filter, plus one pass for the one under way, plus 2 s for the DEL to
    /// be sent and acknowledged on a slow (TCG) guest.
    pub fn expiry_bound(&self, filters: usize) -> Duration {
        let passes = filters.div_ceil(self.expire_quota.max(1) as usize) as u64 + 1;
        Duration::from_millis(
            u64::from(self.idle_timeout_ms) + passes * u64::from(self.interval_ms) + 2000,
        )
    }
}

/// The module's debugfs `counters` and `state` (`name value` lines),
/// flattened to `ifname/name -> value`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ModuleCounters {
    pub raw: BTreeMap<String, u64>,
    /// Word-valued state fields (e.g. `state active`).
    pub words: BTreeMap<String, String>,
}

impl ModuleCounters {
    /// `files` is `read_dir` of the debugfs directory: `eth0/counters`,
    /// `eth0/state`, `eth0/filters`. Only counters and state are parsed.
    pub fn parse(files: &BTreeMap<String, String>) -> Self {
        let mut c = ModuleCounters::default();
        for (path, text) in files {
            let (dir, file) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
            if file != "counters" && file != "state" {
                continue;
            }
            let prefix = if dir.is_empty() {
                String::new()
            } else {
                format!("{dir}/")
            };
            for line in text.lines() {
                let mut it = line.split_whitespace();
                let (Some(k), Some(v), None) = (it.next(), it.next(), it.next()) else {
                    continue;
                };
                match v.parse::<u64>() {
                    Ok(n) => {
                        c.raw.insert(format!("{prefix}{k}"), n);
                    }
                    Err(_) => {
                        c.words.insert(format!("{prefix}{k}"), v.to_string());
                    }
                }
            }
        }
        c
    }

    /// Sum over devices of the counter `name`. Absent: 0, and the
    /// scenario fails ([`crate::harness::missing`]).
    pub fn get(&self, name: &str) -> u64 {
        if !self.has(name) {
            crate::harness::missing(format!("{name} (module debugfs)"));
            return 0;
        }
        self.raw
            .iter()
            .filter(|(k, _)| k.rsplit('/').next() == Some(name))
            .map(|(_, v)| *v)
            .sum()
    }

    pub fn has(&self, name: &str) -> bool {
        self.raw.keys().any(|k| k.rsplit('/').next() == Some(name))
    }

    /// The `state` word of one device (`probing`, `active`, ...).
    pub fn state(&self, ifname: &str) -> Option<&str> {
        self.words
            .get(&format!("{ifname}/state"))
            .map(String::as_str)
    }

    pub fn summary(&self) -> String {
        [
            "steer_calls",
            "steer_dedup",
            "adds",
            "resteers",
            "add_ok",
            "deletes_expired",
            "deletes_idle",
            "busy",
            "frames_sent",
            "acks",
            "retransmits",
        ]
        .iter()
        .filter(|n| self.has(n))
        .map(|n| format!("{n}={}", self.get(n)))
        .collect::<Vec<_>>()
        .join(",")
    }

    /// Compare with the device's `stats` (vnic/CTL.md), counted since
    /// `since` when given; returns every disagreement. Exact equalities that hold when no management frame
    /// was lost (the suite's scenarios inject no loss).
    pub fn compare(&self, stats: &Stats, since: Option<&Stats>) -> Vec<String> {
        // The device's count since `since` (gauges such as `live` come out
        // right when they were 0 then).
        let dev = |f: fn(&Stats) -> u64| f(stats).saturating_sub(since.map_or(0, f));
        let mut out = Vec::new();
        let mut eq = |what: &str, m: u64, d: u64| {
            if m != d {
                out.push(format!(
                    "module and device disagree on {what}: module {m}, device {d}"
                ));
            }
        };
        eq(
            "ADD ops applied (module add_ok vs device adds+replaces)",
            self.get("add_ok"),
            dev(|s| s.table.adds) + dev(|s| s.table.replaces),
        );
        let deletes: [(&str, crate::scenarios::Counter); 4] = [
            ("expired", |s| s.table.deletes.expired),
            ("idle", |s| s.table.deletes.idle),
            ("flush", |s| s.table.deletes.flush),
            ("unload", |s| s.table.deletes.unload),
        ];
        for (r, d) in deletes {
            eq(
                &format!("deletes by reason {r}"),
                self.get(&format!("deletes_{r}")),
                dev(d),
            );
        }
        eq(
            "DELs of unknown ids",
            self.get("deletes_unknown_id"),
            dev(|s| s.table.unknown_deletes),
        );
        let m_rej: u64 = [
            "table_full",
            "bucket_full",
            "bad_queue",
            "bad_key",
            "injected_failure",
            "bad_id",
        ]
        .iter()
        .map(|r| self.get(&format!("reject_{r}")))
        .sum();
        let d_rej: u64 = dev(|s| s.table.rejects.table_full)
            + dev(|s| s.table.rejects.bucket_full)
            + dev(|s| s.table.rejects.bad_queue)
            + dev(|s| s.table.rejects.bad_key)
            + dev(|s| s.table.rejects.injected_failure)
            + dev(|s| s.table.rejects.bad_id);
        eq("rejected ADD ops", m_rej, d_rej);
        eq("live filters", self.get("live"), dev(|s| s.table.live));
        eq(
            "ACKs (module acks vs device acks_sent)",
            self.get("acks"),
            dev(|s| s.mgmt.acks_sent),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_debugfs() {
        let mut f = BTreeMap::new();
        f.insert(
            "eth0/counters".to_string(),
            "steer_calls 77\nadds 5\nresteers 2\n".to_string(),
        );
        f.insert(
            "eth0/state".to_string(),
            "state active\nlive 3\ncapacity 8192\n".to_string(),
        );
        f.insert(
            "eth0/filters".to_string(),
            "# id rxq ...\n1 2 udp 10.0.2.1:10000 10.0.2.15:20000 5 active\n".to_string(),
        );
        let c = ModuleCounters::parse(&f);
        assert_eq!(c.get("adds"), 5);
        assert_eq!(c.get("steer_calls"), 77);
        assert_eq!(c.get("live"), 3);
        assert_eq!(c.state("eth0"), Some("active"));
        assert!(!c.has("deletes_idle"));
        assert_eq!(c.raw.len(), 5, "{:?}", c.raw);
    }

    #[test]
    fn compare_finds_disagreements() {
        let mut f = BTreeMap::new();
        f.insert(
            "eth0/counters".to_string(),
            "add_ok 10\ndeletes_idle 10\nacks 12\nreject_table_full 1\n".to_string(),
        );
        f.insert("eth0/state".to_string(), "live 0\n".to_string());
        let c = ModuleCounters::parse(&f);
        let mut stats = Stats::default();
        stats.table.adds = 8;
        stats.table.replaces = 2;
        stats.table.deletes.idle = 10;
        stats.table.rejects.table_full = 1;
        stats.mgmt.acks_sent = 12;
        assert!(
            c.compare(&stats, None).is_empty(),
            "{:?}",
            c.compare(&stats, None)
        );
        // Since an earlier look: the same counts on top of it.
        let mut base = Stats::default();
        base.table.adds = 100;
        base.mgmt.acks_sent = 7;
        let mut later = stats.clone();
        later.table.adds += 100;
        later.mgmt.acks_sent += 7;
        assert!(c.compare(&later, Some(&base)).is_empty());
        let mut stats2 = Stats::default();
        stats2.table.adds = 9;
        stats2.table.live = 1;
        stats2.mgmt.acks_sent = 12;
        let d = c.compare(&stats2, None);
        assert!(d.iter().any(|m| m.contains("ADD ops")), "{d:?}");
        assert!(d.iter().any(|m| m.contains("live")), "{d:?}");
    }

    #[test]
    fn bound_grows_with_passes() {
        let p = ModuleParams::default();
        assert_eq!(p.expiry_bound(1), Duration::from_millis(2000 + 200 + 2000));
        assert_eq!(
            p.expiry_bound(129),
            Duration::from_millis(2000 + 400 + 2000)
        );
    }
}

/// One ADD op the module left unacknowledged at a window reset (debugfs
/// `resets`, aRFS/kmod/README.md): the device may or may not have applied it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ResetOp {
    pub seq: u32,
    pub id: u16,
    pub rxq: u16,
}

/// One window reset (a stall or a new generation) of the module's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    pub nr: u64,
    pub table_lost: bool,
    pub una: u32,
    pub next_seq: u32,
    /// Unacknowledged ADD ops, all of them (`ops` may hold fewer).
    pub add_ops: u32,
    pub ops: Vec<ResetOp>,
}

/// Why the module's `resets` text is not a log [`ResetLog::parse`] accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetLogError {
    #[error("resets: first line {0:?}")]
    FirstLine(String),
    /// Field `what` of `line` is missing or not a number of its type.
    #[error("resets: bad {what} in {line:?}")]
    BadNumber { what: &'static str, line: String },
    #[error("resets: {0:?} before any reset")]
    OpBeforeReset(String),
    #[error("resets: unexpected line {0:?}")]
    UnexpectedLine(String),
    #[error("resets: reset {nr} says {logged} logged of {add_ops} ops, lists {listed}")]
    OpCount {
        nr: u64,
        logged: usize,
        add_ops: u32,
        listed: usize,
    },
    /// The kept resets are not the last ones, consecutive, oldest first.
    #[error("resets: {resets} resets, kept numbers {kept:?}")]
    KeptNumbers { resets: u64, kept: Vec<u64> },
}

/// Why [`ResetLog::unacked_since`] cannot name every unacknowledged ADD op.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incomplete {
    #[error("resets went back from {since} to {now}")]
    WentBack { since: u64, now: u64 },
    #[error("{since} resets since, the module's log keeps the last {kept}")]
    TooMany { since: u64, kept: usize },
    #[error("reset {nr} is no longer in the module's log ({resets} resets, {kept} kept)")]
    Gone { nr: u64, resets: u64, kept: usize },
    #[error("reset {nr} left {add_ops} ADD ops unacknowledged, the log keeps {kept}")]
    Truncated { nr: u64, add_ops: u32, kept: usize },
}

/// The module's debugfs `resets`: resets since attach and the last few kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetLog {
    pub resets: u64,
    pub kept: Vec<Reset>,
}

impl ResetLog {
    /// The path of one netdev's log.
    pub fn path(ifname: &str) -> String {
        format!("{DEBUGFS_DIR}/{ifname}/resets")
    }

    /// Parse the file; anything malformed or inconsistent is an error (the
    /// text comes from the guest).
    pub fn parse(text: &str) -> Result<Self, ResetLogError> {
        fn num<T: std::str::FromStr>(
            w: Option<&str>,
            what: &'static str,
            line: &str,
        ) -> Result<T, ResetLogError> {
            w.and_then(|w| w.parse().ok())
                .ok_or_else(|| ResetLogError::BadNumber {
                    what,
                    line: line.to_string(),
                })
        }
        let mut log = ResetLog::default();
        let mut lines = text.lines();
        let first = lines.next().unwrap_or_default();
        let mut w = first.split_whitespace();
        if w.next() != Some("resets") {
            return Err(ResetLogError::FirstLine(first.to_string()));
        }
        log.resets = num(w.next(), "count", first)?;
        let mut logged = Vec::new();
        for line in lines {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["reset", nr, "table_lost", tl, "una", una, "next_seq", ns, "add_ops", a, "logged", l] =>
                {
                    log.kept.push(Reset {
                        nr: num(Some(nr), "reset number", line)?,
                        table_lost: num::<u8>(Some(tl), "table_lost", line)? != 0,
                        una: num(Some(una), "una", line)?,
                        next_seq: num(Some(ns), "next_seq", line)?,
                        add_ops: num(Some(a), "add_ops", line)?,
                        ops: Vec::new(),
                    });
                    logged.push(num::<usize>(Some(l), "logged", line)?);
                }
                ["add", seq, id, rxq] => {
                    let r = log
                        .kept
                        .last_mut()
                        .ok_or_else(|| ResetLogError::OpBeforeReset(line.to_string()))?;
                    r.ops.push(ResetOp {
                        seq: num(Some(seq), "seq", line)?,
                        id: num(Some(id), "id", line)?,
                        rxq: num(Some(rxq), "rxq", line)?,
                    });
                }
                _ => return Err(ResetLogError::UnexpectedLine(line.to_string())),
            }
        }
        for (r, &l) in log.kept.iter().zip(&logged) {
            if r.ops.len() != l || l > r.add_ops as usize {
                return Err(ResetLogError::OpCount {
                    nr: r.nr,
                    logged: l,
                    add_ops: r.add_ops,
                    listed: r.ops.len(),
                });
            }
        }
        // The kept resets are the last ones, consecutive, oldest first.
        let got: Vec<u64> = log.kept.iter().map(|r| r.nr).collect();
        let consecutive = got.windows(2).all(|w| w[0].checked_add(1) == Some(w[1]));
        if !consecutive
            || got.last().is_some_and(|&l| l != log.resets)
            || got.len() as u64 > log.resets
        {
            return Err(ResetLogError::KeptNumbers {
                resets: log.resets,
                kept: got,
            });
        }
        Ok(log)
    }

    /// The unacknowledged ADD ops of every reset after `since` (the
    /// `resets` count of an earlier read), or why the log cannot give all
    /// of them (resets no longer kept, ops beyond the per-reset bound): a
    /// check matching against it must then fail, not pass on a part.
    pub fn unacked_since(&self, since: u64) -> Result<Vec<ResetOp>, Incomplete> {
        if self.resets < since {
            return Err(Incomplete::WentBack {
                since,
                now: self.resets,
            });
        }
        if self.resets - since > self.kept.len() as u64 {
            return Err(Incomplete::TooMany {
                since: self.resets - since,
                kept: self.kept.len(),
            });
        }
        let mut out = Vec::new();
        for nr in since + 1..=self.resets {
            let r = self
                .kept
                .iter()
                .find(|r| r.nr == nr)
                .ok_or(Incomplete::Gone {
                    nr,
                    resets: self.resets,
                    kept: self.kept.len(),
                })?;
            if r.ops.len() != r.add_ops as usize {
                return Err(Incomplete::Truncated {
                    nr,
                    add_ops: r.add_ops,
                    kept: r.ops.len(),
                });
            }
            out.extend_from_slice(&r.ops);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod reset_log_tests {
    use super::{ResetLog, ResetOp};

    const TWO: &str = "resets 9\n\
        reset 8 table_lost 0 una 10 next_seq 14 add_ops 0 logged 0\n\
        reset 9 table_lost 0 una 30 next_seq 33 add_ops 2 logged 2\n\
        add 30 5 1\nadd 32 7 3\n";

    #[test]
    fn parses_and_gives_the_unacked_ops_since_an_earlier_read() {
        let log = ResetLog::parse(TWO).unwrap();
        assert_eq!(log.resets, 9);
        assert_eq!(log.kept.len(), 2);
        assert_eq!(
            log.unacked_since(7).unwrap(),
            [
                ResetOp {
                    seq: 30,
                    id: 5,
                    rxq: 1
                },
                ResetOp {
                    seq: 32,
                    id: 7,
                    rxq: 3
                }
            ]
        );
        assert_eq!(log.unacked_since(9).unwrap(), []);
        // Reset 7 is gone: the log cannot tell what it left.
        assert!(log.unacked_since(6).is_err());
        assert!(log.unacked_since(10).is_err());
        assert_eq!(
            ResetLog::parse("resets 0\n")
                .unwrap()
                .unacked_since(0)
                .unwrap(),
            []
        );
    }

    #[test]
    fn a_truncated_reset_is_not_a_complete_answer() {
        let t =
            "resets 1\nreset 1 table_lost 0 una 1 next_seq 70 add_ops 300 logged 1\nadd 1 2 3\n";
        let log = ResetLog::parse(t).unwrap();
        assert!(log.unacked_since(0).is_err());
    }

    #[test]
    fn hostile_text_is_an_error_not_a_panic() {
        for t in [
            "",
            "resets\n",
            "resets x\n",
            "add 1 2 3\n",
            "resets 1\nadd 1 2 3\n",
            "resets 1\nreset 1 table_lost 0 una 1 next_seq 2 add_ops 1 logged 2\nadd 1 2 3\n",
            "resets 1\nreset 1 table_lost 0 una 1 next_seq 2 add_ops 1 logged 1\nadd 1 70000 3\n",
            "resets 2\nreset 1 table_lost 0 una 1 next_seq 2 add_ops 0 logged 0\n",
            "resets 0\nreset 1 table_lost 0 una 1 next_seq 2 add_ops 0 logged 0\n",
            "resets 18446744073709551615\nreset 18446744073709551615 table_lost 0 una 1 next_seq 2 add_ops 0 logged 0\n",
        ] {
            let _ = ResetLog::parse(t).map(|l| l.unacked_since(0));
        }
        assert!(ResetLog::parse("resets 1\nadd 1 2 3\n").is_err());
        assert!(ResetLog::parse(
            "resets 2\nreset 1 table_lost 0 una 1 next_seq 2 add_ops 0 logged 0\n"
        )
        .is_err());
    }
}
