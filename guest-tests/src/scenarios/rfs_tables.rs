//! `rfs-unequal-tables`: rx queues whose `rps_flow_cnt` differ, and flows
//! that aRFS moves from a queue with the larger table to one with the
//! smaller (issue 47, item 2).
//!
//! Before "net: do not pass flow_id to set_rps_cpu()" (2026-02, in 7.3)
//! `get_rps_cpu()` computed `flow_id` in the table of the queue a packet
//! arrived on and `set_rps_cpu()` used it to index the target queue's
//! table: with a larger arrival table that reads (and, once the driver
//! granted the filter, writes) past the end of the target's. 7.3 computes
//! the slot in the target's table. `images/patches/7.3-set-rps-cpu-prefix-flow-id.patch`
//! puts the old code back on 7.3 (`images/build-kernel --variant debug
//! --patch`), so that KASAN can be seen catching it.
//!
//! The tables: the lower half of the queues in use get [`BIG`] slots, the
//! upper half [`SMALL`]. A table is allocated with at least a page
//! (`store_rps_dev_flow_table_cnt`), so 256 slots of 12 bytes live in a
//! 4096-byte kmalloc object: a slot index from 342 on starts past its end,
//! in the slab's redzone (the object is 4096-aligned, the next one 8192
//! bytes on under KASAN), where generic KASAN reports the first access and
//! no other object is touched. With [`BIG`] = 512 a third of the flows
//! moving from a big to a small table get such an index. Every flow of the
//! workload is such a move: RSS queue in the lower half, receiver on a CPU
//! whose queue is in the upper half.
//!
//! Proven from two sides. The driver's side: the module records the
//! `flow_id` the kernel passed to `ndo_rx_flow_steer` for each filter
//! (debugfs `filters`); a slot number the target queue's table does not
//! have is the bug, seen on any kernel, debug or not. The kernel's side:
//! KASAN's report. On a stock kernel every `flow_id` is inside its
//! target's table and the log stays clean (a KASAN kernel: the debug boot).
//! With `--expect-rfs-oob` (the pre-fix kernel) the scenario asserts the
//! opposite: KASAN's out-of-bounds report in the RFS code (the module's
//! `flow_id`s past the target's table are shown, not required: a flow whose
//! index lands past the table reads zeroed or stale memory there, which
//! often passes for another flow's active slot, and the kernel then never
//! asks the driver for it); any other kernel problem still fails it.

use super::session::Checks;
use super::{Flow, Session, BASE_PORT, IFNAME};
use crate::harness::{wait_for, Result};
use std::collections::BTreeMap;
use std::time::Duration;

/// `rps_flow_cnt` of the lower half of the queues in use (the flows' RSS
/// queues).
const BIG: u32 = 512;
/// `rps_flow_cnt` of the upper half (the queues the flows are steered to).
const SMALL: u32 = 256;
/// `sizeof(struct rps_dev_flow)` in 7.x: cpu, filter (u16), last_qtail,
/// hash (u32).
const SLOT_BYTES: u64 = 12;
/// The smallest table allocation (`PAGE_SIZE`, x86-64).
const MIN_ALLOC: u64 = 4096;
/// Flows of the workload: with a third of them reaching past the small
/// table's allocation on the pre-fix kernel, none doing so has odds of
/// (2/3)^32, about 2e-6.
const FLOWS: usize = 32;
/// Generator rate over all flows: a KASAN kernel under TCG handles a few
/// hundred packets per second (as the debug boot's light workload).
const RATE: u32 = 160;
/// How long the kernel has to ask for the flows' filters.
const ASKED: Duration = Duration::from_mins(1);
/// The module's table is settled when it did not grow for this long (each
/// flow sends 5 packets/s).
const STILL: Duration = Duration::from_secs(5);

/// The sysfs file of rx queue `q`'s RFS table size.
fn flow_cnt_path(q: usize) -> String {
    format!("/sys/class/net/{IFNAME}/queues/rx-{q}/rps_flow_cnt")
}

/// Bytes of the table allocation for `cnt` slots (at least a page).
fn alloc_bytes(cnt: u32) -> u64 {
    (u64::from(cnt.next_power_of_two()) * SLOT_BYTES).max(MIN_ALLOC)
}

/// A KASAN out-of-bounds report in the RFS code (set_rps_cpu() is static
/// and may be inlined into its caller).
fn is_rfs_oob(msg: &str) -> bool {
    msg.contains("KASAN:")
        && msg.contains("out-of-bounds")
        && ["set_rps_cpu", "get_rps_cpu", "netif_receive_skb"]
            .iter()
            .any(|f| msg.contains(f))
}

/// What the first KASAN report says about the access: its "Read/Write of
/// size" line and where the address lies ("N bytes to the right of
/// allocated M-byte region").
fn report_detail(s: &Session) -> String {
    let msgs: Vec<&str> = s
        .guest
        .kmsg
        .iter()
        .map(|r| r.msg.as_str())
        .skip_while(|m| !is_rfs_oob(m))
        .take(200)
        .collect();
    let find = |pat: &str| {
        msgs.iter()
            .find(|m| m.contains(pat))
            .map(|m| m.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    [find(" of size "), find("bytes to the right of")]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

/// A filter's `flow_id` against its target queue's table: inside it, past
/// it but inside the allocation, or past the allocation (where KASAN sees
/// the access).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reach {
    Inside,
    PastTable,
    PastAlloc,
}

fn reach(flow_id: u32, cnt: u32) -> Reach {
    if flow_id < cnt.next_power_of_two() {
        Reach::Inside
    } else if (u64::from(flow_id) + 1) * SLOT_BYTES <= alloc_bytes(cnt) {
        Reach::PastTable
    } else {
        Reach::PastAlloc
    }
}

/// The flows of the workload among `candidates`: RSS queue below `half`,
/// receiver's queue from `half` on.
fn crossing(candidates: Vec<Flow>, half: usize) -> Vec<Flow> {
    candidates
        .into_iter()
        .filter(|f| f.rss_q < half && f.rx_q >= half)
        .take(FLOWS)
        .collect()
}

pub(super) fn rfs_unequal_tables(s: &mut Session, c: &mut Checks) -> Result<String> {
    let expect_oob = s.settings.expect_rfs_oob;
    let kasan = s
        .guest
        .kmsg
        .iter()
        .any(|r| r.msg.contains("KernelAddressSanitizer initialized"));
    c.check(kasan || !expect_oob, || {
        "--expect-rfs-oob on a kernel without KASAN (no \"KernelAddressSanitizer initialized\" at boot)".into()
    });
    s.ensure_module()?;
    let pairs = usize::from(s.pairs);
    let half = pairs / 2;
    let cnt_of = |q: usize| if q < half { BIG } else { SMALL };
    for q in 0..pairs {
        s.guest
            .agent
            .write_file(&flow_cnt_path(q), &cnt_of(q).to_string())?;
        let got = s.guest.agent.read_file(&flow_cnt_path(q))?;
        c.check(got.trim() == cnt_of(q).to_string(), || {
            format!(
                "rx-{q}: rps_flow_cnt reads {:?} after writing {}",
                got.trim(),
                cnt_of(q)
            )
        });
    }
    let flows = crossing(s.flows_at(BASE_PORT, 16 * FLOWS), half);
    if flows.len() < FLOWS / 2 {
        return Err(format!(
            "only {} of {} candidate flows go from a queue below {half} to one from {half} on",
            flows.len(),
            16 * FLOWS
        )
        .into());
    }
    s.udp_start(&flows)?;
    s.flows = flows;
    s.trace_since_mark()?;
    s.start_mark()?;
    s.start_gen_per_flow(RATE.min(s.settings.rate))?;

    // The kernel asks on a flow's first packets that reach set_rps_cpu().
    // Not every flow gets a filter: in 256-slot tables some of the 32
    // flows share a slot, and 7.x never asks for the second one while the
    // first is active. So the wait ends when the module's table stopped
    // growing for [`STILL`], or, on the pre-fix kernel, at the report. The
    // kernel log read meanwhile is kept: the report is taken here
    // (expected or not), anything else fails the scenario as it would
    // anywhere.
    let want = s.flows.len();
    let mut bad: Vec<String> = Vec::new();
    let mut last = (0usize, std::time::Instant::now());
    let waited = wait_for(ASKED, "the module's table to stop growing", || {
        bad.extend(s.guest.kernel_failures()?);
        let n = s.module_filters()?.len();
        if n != last.0 {
            last = (n, std::time::Instant::now());
        }
        let still = n > 0 && last.1.elapsed() >= STILL;
        let reported = expect_oob && bad.iter().any(|l| is_rfs_oob(l));
        Ok((still || reported).then_some(()))
    });
    if let Err(e) = waited {
        c.check(expect_oob, || e.0.clone());
    }
    let filters = s.module_filters()?;
    let mut by_reach: BTreeMap<Reach, Vec<(u16, u32)>> = BTreeMap::new();
    for f in filters.values() {
        let cnt = cnt_of(usize::from(f.rxq));
        by_reach
            .entry(reach(f.flow_id, cnt))
            .or_default()
            .push((f.rxq, f.flow_id));
    }
    let count = |r: Reach| by_reach.get(&r).map_or(0, Vec::len);
    let (inside, past_table, past_alloc) = (
        count(Reach::Inside),
        count(Reach::PastTable),
        count(Reach::PastAlloc),
    );
    let show = |r: Reach| {
        by_reach.get(&r).map_or("none".into(), |v| {
            v.iter()
                .map(|(q, id)| format!("rx-{q}:{id}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
    };

    let (oob, other): (Vec<String>, Vec<String>) = bad.into_iter().partition(|l| is_rfs_oob(l));
    let report_lines = expect_oob && !oob.is_empty();
    for l in other {
        // A report's own call trace is part of it.
        if !(report_lines && l.contains("Call Trace:")) {
            c.failures.push(format!("kernel: {l}"));
        }
    }
    let report = oob.first().cloned();
    if expect_oob {
        c.check(report.is_some(), || {
            format!(
                "--expect-rfs-oob: no KASAN out-of-bounds report in the RFS code (filters' flow_id past the target table: {}; past its allocation: {})",
                show(Reach::PastTable),
                show(Reach::PastAlloc)
            )
        });
    } else {
        c.check(filters.len() * 2 >= want, || {
            format!(
                "the kernel asked for {} of {want} flows' filters (slot sharing in 256-slot tables costs a few, not half)",
                filters.len()
            )
        });
        c.check(past_table + past_alloc == 0, || {
            format!(
                "flow_id past the target queue's table (rx-q:flow_id): {}; past its allocation: {}",
                show(Reach::PastTable),
                show(Reach::PastAlloc)
            )
        });
        for l in &oob {
            c.failures.push(format!("kernel: {l}"));
        }
    }
    let kasan_fig = match (&report, kasan) {
        (Some(r), _) => format!("KASAN report: {} ({})", r.trim(), report_detail(s)),
        (None, true) => "KASAN: no report".into(),
        (None, false) => "KASAN: n/a (not a KASAN kernel)".into(),
    };
    Ok(format!(
        "rps_flow_cnt rx<{half}={BIG} rx>={half}={SMALL} flows={want} filters={} flow_id inside={inside} past_table={past_table} past_alloc={past_alloc} {kasan_fig}",
        filters.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reach_follows_the_table_and_its_page() {
        // 256 slots: 3072 bytes in a 4096-byte allocation.
        assert_eq!(reach(255, SMALL), Reach::Inside);
        assert_eq!(reach(256, SMALL), Reach::PastTable);
        assert_eq!(reach(340, SMALL), Reach::PastTable);
        // slot 341 ends at byte 4104
        assert_eq!(reach(341, SMALL), Reach::PastAlloc);
        assert_eq!(reach(511, SMALL), Reach::PastAlloc);
        assert_eq!(reach(511, BIG), Reach::Inside);
        assert_eq!(alloc_bytes(BIG), 6144);
        assert_eq!(alloc_bytes(1), 4096);
    }

    #[test]
    fn only_rfs_oob_reports_are_taken() {
        assert!(is_rfs_oob(
            "BUG: KASAN: slab-out-of-bounds in set_rps_cpu+0x1a2/0x5d0"
        ));
        assert!(is_rfs_oob(
            "BUG: KASAN: slab-out-of-bounds in netif_receive_skb_list_internal+0x9e1/0x1100"
        ));
        assert!(!is_rfs_oob(
            "BUG: KASAN: use-after-free in set_rps_cpu+0x1a2/0x5d0"
        ));
        assert!(!is_rfs_oob(
            "BUG: KASAN: slab-out-of-bounds in virtnet_poll+0x10/0x20"
        ));
        assert!(!is_rfs_oob("WARNING: CPU: 1 PID: 0 at net/core/dev.c:5140"));
    }
}
