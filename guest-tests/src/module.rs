//! What the suite knows about the guest module `vnic_arfs.ko`: its name,
//! parameters, and debugfs counters (aRFS/kmod/README.md).

use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

pub const NAME: &str = "vnic_arfs";
pub const DEBUGFS_DIR: &str = "/sys/kernel/debug/vnic_arfs";

/// Module parameters the scenarios set.
#[derive(Debug, Clone)]
pub struct ModuleParams {
    /// Period of the expiry pass.
    pub expire_interval_ms: u32,
    /// Filters checked per expiry pass.
    pub expire_quota: u32,
    /// Idle backstop: a filter without packets for this long is deleted.
    pub idle_timeout_ms: u32,
    /// Anything else, verbatim (`name=value ...`).
    pub extra: String,
}

impl Default for ModuleParams {
    fn default() -> Self {
        ModuleParams {
            expire_interval_ms: 100,
            expire_quota: 64,
            idle_timeout_ms: 2000,
            extra: String::new(),
        }
    }
}

impl ModuleParams {
    pub fn to_params(&self) -> String {
        format!(
            "expire_interval_ms={} expire_quota={} idle_timeout_ms={} {}",
            self.expire_interval_ms, self.expire_quota, self.idle_timeout_ms, self.extra
        )
        .trim()
        .to_string()
    }

    /// The longest a dead flow's filter may live, by the parameters: the
    /// idle timeout, plus enough expiry passes to visit every filter, plus
    /// one pass of slack for the pass that was running, plus 2 s for the DEL
    /// to be sent and acknowledged on a slow (TCG) guest.
    pub fn expiry_bound(&self, filters: usize) -> Duration {
        let passes = filters.div_ceil(self.expire_quota.max(1) as usize) as u64 + 1;
        Duration::from_millis(
            u64::from(self.idle_timeout_ms) + passes * u64::from(self.expire_interval_ms) + 2000,
        )
    }
}

/// The module's debugfs counters, flattened to `name -> value`.
#[derive(Debug, Clone, Default)]
pub struct ModuleCounters {
    pub raw: BTreeMap<String, u64>,
}

impl ModuleCounters {
    /// Accepts files holding one number (the file name is the counter) and
    /// files of `name: value` / `name value` lines. Sub-directories (one per
    /// attached device) prefix their names with `dir/`.
    pub fn parse(files: &BTreeMap<String, String>) -> Self {
        let mut raw = BTreeMap::new();
        for (path, text) in files {
            let (dir, file) = path
                .rsplit_once('/')
                .map_or(("", path.as_str()), |(d, f)| (d, f));
            let prefix = if dir.is_empty() {
                String::new()
            } else {
                format!("{dir}/")
            };
            let t = text.trim();
            if let Ok(v) = t.parse::<u64>() {
                raw.insert(format!("{prefix}{file}"), v);
                continue;
            }
            for line in t.lines() {
                let line = line.trim();
                let (k, v) = match line.split_once(':') {
                    Some((k, v)) => (k.trim(), v.trim()),
                    None => match line.rsplit_once(char::is_whitespace) {
                        Some((k, v)) => (k.trim(), v.trim()),
                        None => continue,
                    },
                };
                if let Ok(v) = v.parse::<u64>() {
                    raw.insert(format!("{prefix}{k}"), v);
                }
            }
        }
        ModuleCounters { raw }
    }

    /// Sum of every counter whose last path component is `name`.
    pub fn get(&self, name: &str) -> u64 {
        self.raw
            .iter()
            .filter(|(k, _)| k.rsplit('/').next() == Some(name))
            .map(|(_, v)| *v)
            .sum()
    }

    pub fn has(&self, name: &str) -> bool {
        self.raw.keys().any(|k| k.rsplit('/').next() == Some(name))
    }

    /// Sum of the counters whose last component starts with `prefix`.
    pub fn sum_prefix(&self, prefix: &str) -> u64 {
        self.raw
            .iter()
            .filter(|(k, _)| k.rsplit('/').next().is_some_and(|n| n.starts_with(prefix)))
            .map(|(_, v)| *v)
            .sum()
    }

    pub fn summary(&self) -> String {
        [
            "steer_calls",
            "adds",
            "resteers",
            "deletes",
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

    /// Compare with the device's `stats`; returns the disagreements.
    pub fn compare(&self, stats: &Value) -> Vec<String> {
        let dev = |p: &str| stats.pointer(p).and_then(Value::as_u64).unwrap_or(0);
        let dev_sum = |p: &str| {
            stats
                .pointer(p)
                .and_then(Value::as_object)
                .map_or(0, |o| o.values().filter_map(Value::as_u64).sum::<u64>())
        };
        let mut out = Vec::new();
        let mut eq = |what: &str, m: u64, d: u64| {
            if m != d {
                out.push(format!(
                    "module and device disagree on {what}: module {m}, device {d}"
                ));
            }
        };
        eq(
            "filters installed (adds)",
            self.get("adds"),
            dev("/table/adds"),
        );
        eq(
            "re-steers (replaces)",
            self.get("resteers"),
            dev("/table/replaces"),
        );
        eq("deletes", self.get("deletes"), dev_sum("/table/deletes"));
        eq(
            "rejects",
            self.get("device_rejects"),
            dev_sum("/table/rejects"),
        );
        if self.has("live") {
            eq("live filters", self.get("live"), dev("/table/live"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_counter_files() {
        let mut f = BTreeMap::new();
        f.insert(
            "eth0/stats".to_string(),
            "adds: 5\nresteers 2\nnot a counter\n".to_string(),
        );
        f.insert("steer_calls".to_string(), "77\n".to_string());
        let c = ModuleCounters::parse(&f);
        assert_eq!(c.get("adds"), 5);
        assert_eq!(c.get("resteers"), 2);
        assert_eq!(c.get("steer_calls"), 77);
        assert!(!c.has("deletes"));
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
