//! Parsers for the kernel text files the harness collects from the guest:
//! /dev/kmsg records, /proc/interrupts, /proc/softirqs, /proc/net/softnet_stat.
//! Pure functions, unit-tested on host with captured text. The /dev/kmsg
//! parser is the agent's (it reads /dev/kmsg in the guest), re-exported here.

use std::collections::BTreeMap;
pub use vnic_agent::kmsg::parse_kmsg_record;

/// Kernel log lines that fail a test: warnings, bugs, oopses, sanitizer and
/// lockdep reports, RCU stalls, hung tasks.
pub fn is_kernel_failure(msg: &str) -> bool {
    const PATTERNS: &[&str] = &[
        "WARNING:",
        "BUG:",
        "BUG ",
        "Oops",
        "kernel BUG at",
        "general protection fault",
        "Kernel panic",
        "KASAN:",
        "UBSAN:",
        "KFENCE:",
        "kmemleak:",
        "possible circular locking dependency",
        "possible recursive locking",
        "inconsistent lock state",
        "suspicious RCU usage",
        "INFO: rcu_sched self-detected stall",
        "rcu: INFO:",
        "INFO: task ",
        "watchdog: BUG: soft lockup",
        "Call Trace:",
        "unreferenced object",
    ];
    // kmemleak's informational "Kernel memory leak detector initialized" is fine;
    // only its reports ("unreferenced object", "N new suspected memory leaks") fail.
    if msg.contains("suspected memory leaks") {
        return true;
    }
    if msg.starts_with("kmemleak: Kernel memory leak detector")
        || msg.contains("kmemleak: Automatic memory scanning")
    {
        return false;
    }
    PATTERNS.iter().any(|p| msg.contains(p))
}

/// /proc/interrupts: IRQ label (e.g. `virtio0-input.0`, or the number) ->
/// per-CPU counts.
pub fn parse_interrupts(text: &str) -> BTreeMap<String, Vec<u64>> {
    let mut lines = text.lines();
    let ncpu = lines.next().map_or(0, |h| h.split_whitespace().count());
    let mut out = BTreeMap::new();
    for line in lines {
        let Some((irq, rest)) = line.split_once(':') else {
            continue;
        };
        let toks: Vec<&str> = rest.split_whitespace().collect();
        let counts: Vec<u64> = toks
            .iter()
            .take(ncpu)
            .map_while(|t| t.parse().ok())
            .collect();
        if counts.len() != ncpu {
            // NMI/LOC/ERR style rows with fewer columns: keep what parsed.
            if counts.is_empty() {
                continue;
            }
        }
        let label = toks
            .last()
            .filter(|_| toks.len() > ncpu)
            .map_or(irq.trim().to_string(), |l| (*l).to_string());
        out.insert(label, counts);
    }
    out
}

/// /proc/softirqs: softirq name (e.g. `NET_RX`) -> per-CPU counts.
pub fn parse_softirqs(text: &str) -> BTreeMap<String, Vec<u64>> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            Some((
                name.trim().to_string(),
                rest.split_whitespace()
                    .filter_map(|t| t.parse().ok())
                    .collect(),
            ))
        })
        .collect()
}

/// One /proc/net/softnet_stat row (one per online CPU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Softnet {
    pub processed: u64,
    pub dropped: u64,
    pub time_squeeze: u64,
    pub received_rps: u64,
    pub flow_limit: u64,
    /// CPU the row belongs to (column 12 on kernels that print it).
    pub cpu: Option<u64>,
}

pub fn parse_softnet(text: &str) -> Vec<Softnet> {
    text.lines()
        .filter_map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .map(|t| u64::from_str_radix(t, 16))
                .collect::<Result<_, _>>()
                .ok()?;
            if v.len() < 11 {
                return None;
            }
            Some(Softnet {
                processed: v[0],
                dropped: v[1],
                time_squeeze: v[2],
                received_rps: v[9],
                flow_limit: v[10],
                cpu: v.get(12).copied(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures() {
        assert!(is_kernel_failure(
            "WARNING: CPU: 1 PID: 0 at net/core/dev.c:123 set_rps_cpu+0x1/0x2"
        ));
        assert!(is_kernel_failure(
            "BUG: KASAN: slab-use-after-free in vnic_arfs_work"
        ));
        assert!(is_kernel_failure(
            "Oops: general protection fault, probably for non-canonical address"
        ));
        assert!(is_kernel_failure(
            "WARNING: possible circular locking dependency detected"
        ));
        assert!(is_kernel_failure(
            "kmemleak: 3 new suspected memory leaks (see /sys/kernel/debug/kmemleak)"
        ));
        assert!(!is_kernel_failure(
            "kmemleak: Kernel memory leak detector initialized (mem pool available: 15)"
        ));
        assert!(!is_kernel_failure("virtio_net virtio0 eth0: renamed"));
        assert!(!is_kernel_failure(
            "vnic_arfs: attached to eth0 (4 rx queues)"
        ));
    }

    #[test]
    fn interrupts() {
        let t = "           CPU0       CPU1       \n  0:         44          0   IO-APIC   2-edge      timer\n 24:          0          0   PCI-MSIX-0000:00:02.0   0-edge      virtio0-config\n 25:        100          3   PCI-MSIX-0000:00:02.0   1-edge      virtio0-input.0\nNMI:          0          0   Non-maskable interrupts\nERR:          0\n";
        let m = parse_interrupts(t);
        assert_eq!(m["virtio0-input.0"], vec![100, 3]);
        assert_eq!(m["timer"], vec![44, 0]);
        assert_eq!(m["ERR"], vec![0]);
    }

    #[test]
    fn softirqs() {
        let t = "                    CPU0       CPU1\n          HI:          1          0\n      NET_RX:        735        120\n";
        let m = parse_softirqs(t);
        assert_eq!(m["NET_RX"], vec![735, 120]);
    }

    #[test]
    fn softnet() {
        let t = "0000a0b1 00000000 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000010 00000000 00000000 00000000\n";
        let v = parse_softnet(t);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].processed, 0xa0b1);
        assert_eq!(v[0].time_squeeze, 2);
        assert_eq!(v[0].received_rps, 16);
        assert_eq!(v[0].cpu, Some(0));
    }
}
