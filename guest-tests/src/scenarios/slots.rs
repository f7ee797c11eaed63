//! Which flows of a collision point share an `rps_dev_flow` slot.
//!
//! A flow's slot in its target queue's RFS table comes from the flow hash
//! the guest's stack computed, keyed with a secret chosen at boot: it can
//! only be read inside the guest. The test helper `vnic_flowhash.ko`
//! records the hash of every received flow; the guest module's `filters`
//! file gives the slot (`flow_id`) the kernel passed with each filter. The
//! two together tell which rule the kernel uses to turn a hash into a slot
//! (6.12: the low bits, `hash & mask`; 7.x: `hash_32(hash, log)`, the top
//! bits of a multiplicative hash), without trusting a version number.
//!
//! A flow that needs a filter "keeps its slot" when no other flow steered
//! into the same queue maps to the same slot: on a kernel with the 2025
//! fix, each of those must get a filter (a collision may cost the loser
//! its filter; nothing else should).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::net::IpAddr;

use arfs::{FlowKey, L4Proto};
use serde::{Deserialize, Serialize};

use super::workload::Flow;

/// How a kernel turns a flow hash into a slot of a table of `2^log` entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotRule {
    /// `hash & (2^log - 1)` (before the rps_tag_ptr tables).
    Mask,
    /// `hash_32(hash, log)`: `(hash * GOLDEN_RATIO_32) >> (32 - log)`.
    Hash32,
}

impl SlotRule {
    pub const ALL: [SlotRule; 2] = [SlotRule::Mask, SlotRule::Hash32];

    pub fn slot(self, hash: u32, log: u32) -> u32 {
        if log == 0 {
            return 0;
        }
        match self {
            SlotRule::Mask => hash & ((1u32 << log) - 1),
            SlotRule::Hash32 => hash.wrapping_mul(0x61C8_8647) >> (32 - log),
        }
    }
}

/// log2 of the table size the kernel allocates for `rps_flow_cnt`
/// (rounded up to a power of two).
pub fn table_log(flow_cnt: u32) -> u32 {
    flow_cnt.max(1).next_power_of_two().trailing_zeros()
}

fn parse_proto(s: &str) -> Option<L4Proto> {
    match s {
        "udp" => Some(L4Proto::Udp),
        "tcp" => Some(L4Proto::Tcp),
        _ => None,
    }
}

/// A line of `vnic_flowhash`'s `flows` file that is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("vnic_flowhash: cannot parse {line:?}")]
pub struct FlowhashLineError {
    pub line: String,
}

/// No slot rule explains where the kernel put the filtered flows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "neither `hash & mask` nor `hash_32` maps the flow hashes of the {filters} filters to their flow_id (table log {log})"
)]
pub struct NoSlotRule {
    pub filters: usize,
    pub log: u32,
}

/// `vnic_flowhash`'s `flows` file: flow -> hash, and the packets of flows
/// it had no room for. Lines: `udp SRC SPORT DST DPORT hash 0x.. rxq Q
/// packets N`, after `# flows N full M`.
pub fn parse_flowhash(text: &str) -> Result<(HashMap<FlowKey, u32>, u64), FlowhashLineError> {
    let mut out = HashMap::new();
    let mut full = 0;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() == Some(&"#") {
            if let Some(i) = w.iter().position(|&x| x == "full") {
                full = w.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(0);
            }
            continue;
        }
        if w.is_empty() {
            continue;
        }
        let bad = || FlowhashLineError {
            line: line.to_string(),
        };
        if w.len() < 7 || w[5] != "hash" {
            return Err(bad());
        }
        let proto = parse_proto(w[0]).ok_or_else(bad)?;
        let src: IpAddr = w[1].parse().map_err(|_| bad())?;
        let sport: u16 = w[2].parse().map_err(|_| bad())?;
        let dst: IpAddr = w[3].parse().map_err(|_| bad())?;
        let dport: u16 = w[4].parse().map_err(|_| bad())?;
        let hash = u32::from_str_radix(w[6].trim_start_matches("0x"), 16).map_err(|_| bad())?;
        let key = FlowKey::new(proto, src, sport, dst, dport).ok_or_else(bad)?;
        out.insert(key, hash);
    }
    Ok((out, full))
}

/// `vnic_flowhash`'s `flows` file with each flow's packet count: (flow,
/// hash, packets) per line.
pub fn parse_flowhash_packets(text: &str) -> Result<Vec<(FlowKey, u32, u64)>, FlowhashLineError> {
    let (hashes, _) = parse_flowhash(text)?;
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        let bad = || FlowhashLineError {
            line: line.to_string(),
        };
        let i = w.iter().position(|&x| x == "packets").ok_or_else(bad)?;
        let packets: u64 = w.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let proto = parse_proto(w[0]).ok_or_else(bad)?;
        let key = FlowKey::new(
            proto,
            w[1].parse().map_err(|_| bad())?,
            w[2].parse().map_err(|_| bad())?,
            w[3].parse().map_err(|_| bad())?,
            w[4].parse().map_err(|_| bad())?,
        )
        .ok_or_else(bad)?;
        let hash = *hashes.get(&key).ok_or_else(bad)?;
        out.push((key, hash, packets));
    }
    Ok(out)
}

/// The CPU plain RPS gives a packet of hash `hash` with `map` as the rx
/// queue's `rps_map` (its CPUs in mask order): `map->cpus[reciprocal_scale(
/// hash, map->len)]`, `reciprocal_scale(h, n) = (h * n) >> 32`
/// (net/core/dev.c `get_rps_cpu`).
pub fn rps_cpu(hash: u32, map: &[usize]) -> Option<usize> {
    let i = (u64::from(hash) * map.len() as u64) >> 32;
    map.get(usize::try_from(i).ok()?).copied()
}

/// The CPUs of a hex `rps_cpus` mask, in order (the kernel's `rps_map`).
pub fn rps_map_of(mask: &str) -> Option<Vec<usize>> {
    let m = u64::from_str_radix(mask.trim().trim_start_matches("0x"), 16).ok()?;
    Some((0..64).filter(|c| m >> c & 1 == 1).collect())
}

/// The rule that maps the hash of every filtered flow to the slot the
/// kernel gave it: `Ok(None)` with no filter to compare; an error when
/// neither rule explains all of them.
pub fn infer_rule<S: BuildHasher>(
    filters: &[(FlowKey, u32)],
    hashes: &HashMap<FlowKey, u32, S>,
    log: u32,
) -> Result<Option<SlotRule>, NoSlotRule> {
    let known: Vec<(u32, u32)> = filters
        .iter()
        .filter_map(|(k, id)| Some((*hashes.get(k)?, *id)))
        .collect();
    if known.is_empty() {
        return Ok(None);
    }
    for rule in SlotRule::ALL {
        if known.iter().all(|&(h, id)| rule.slot(h, log) == id) {
            return Ok(Some(rule));
        }
    }
    Err(NoSlotRule {
        filters: known.len(),
        log,
    })
}

/// Slot figures of one set of concurrent flows (one iteration).
///
/// The lower bound of the acceptance check is `own_slot_on_queue /
/// own_slot`: a flow that kept its slot counts only when, at the end, the
/// device holds a live filter sending it to its receiver's queue *and* the
/// guest saw at least [`ON_QUEUE_BAR`] of its last window's packets arrive
/// there. `own_slot_added` (any ADD in the trace, to any queue, surviving
/// or not) is kept for the record: the old kernel scores 100% on it too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlotCounts {
    /// Flows needing a filter whose (target queue, slot) no other such
    /// flow shares.
    pub own_slot: u64,
    /// Of those, flows with at least one ADD in the trace (any queue).
    pub own_slot_added: u64,
    /// Of those, flows the device's live table (dumped at the end of the
    /// point) holds a filter for whose rx queue is the flow's receiver's
    /// queue (0 in points from before this count).
    pub own_slot_live: u64,
    /// Of `own_slot_live`, flows of which the guest saw >= [`ON_QUEUE_BAR`]
    /// of the packets of the point's last window arrive on that queue
    /// (SO_INCOMING_NAPI_ID): the lower bound's numerator.
    pub own_slot_on_queue: u64,
    /// Flows needing a filter that share their (target queue, slot) with
    /// another such flow, and how many of those hold their queue at the
    /// end as above (no bar: with the 2025 fix one flow per shared slot
    /// is expected to, without it the flows of a slot take turns).
    pub shared_slot: u64,
    pub shared_slot_held: u64,
    /// Flows needing a filter with no recorded hash (not counted above).
    pub hash_unknown: u64,
}

impl std::ops::AddAssign for SlotCounts {
    fn add_assign(&mut self, o: Self) {
        self.own_slot += o.own_slot;
        self.own_slot_added += o.own_slot_added;
        self.own_slot_live += o.own_slot_live;
        self.own_slot_on_queue += o.own_slot_on_queue;
        self.shared_slot += o.shared_slot;
        self.shared_slot_held += o.shared_slot_held;
        self.hash_unknown += o.hash_unknown;
    }
}

/// The share of a flow's last-window packets that must have arrived on its
/// receiver's queue, guest-side, for it to count in the lower bound.
pub const ON_QUEUE_BAR: f64 = 0.95;

/// What the end of one iteration shows, per flow of it.
#[derive(Debug, Clone, Default)]
pub struct AtEnd {
    /// The rx queue of the flow's filter in the device's live table, read
    /// at the end (absent: no live filter, e.g. deleted).
    pub live_q: HashMap<FlowKey, usize>,
    /// The flow's packets of the last window by the rx queue the guest
    /// kernel says delivered them (SO_INCOMING_NAPI_ID through the NAPI ->
    /// queue map; `usize::MAX`: an unknown NAPI). Deltas of two snapshots.
    pub last: HashMap<FlowKey, BTreeMap<usize, u64>>,
}

/// Share of the packets of `by_queue` that arrived on queue `q` (0 without
/// a packet). Unknown NAPIs count against it.
pub fn share_on(by_queue: &BTreeMap<usize, u64>, q: usize) -> f64 {
    let total: u64 = by_queue.values().sum();
    if total == 0 {
        return 0.0;
    }
    by_queue.get(&q).copied().unwrap_or(0) as f64 / total as f64
}

/// Whether flow `f` holds its queue at the end: `Ok` when the device's
/// live table has a filter for it to `f.rx_q` and >= [`ON_QUEUE_BAR`] of
/// its last window's packets arrived there guest-side; else `Err((live,
/// why))`, `live` telling whether the first half holds.
pub fn held_at_end(f: &Flow, end: &AtEnd) -> std::result::Result<(), (bool, String)> {
    let empty = BTreeMap::new();
    let last = end.last.get(&f.key).unwrap_or(&empty);
    let total: u64 = last.values().sum();
    let share = share_on(last, f.rx_q);
    let port = f.key.dst_port();
    match end.live_q.get(&f.key) {
        None => Err((
            false,
            format!(
                ":{port} no live filter at the end (expected q{}; {:.0}% of {total} packets there)",
                f.rx_q,
                100.0 * share
            ),
        )),
        Some(&q) if q != f.rx_q => Err((
            false,
            format!(":{port} live filter to q{q}, expected q{}", f.rx_q),
        )),
        Some(_) if share < ON_QUEUE_BAR => Err((
            true,
            format!(
                ":{port} filter to q{} but the guest saw {:.1}% of its {total} packets there",
                f.rx_q,
                100.0 * share
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// Counts, for flows that run at the same time, which keep their slot, and
/// which of those got a filter (`added`: ADD in the trace) and hold their
/// queue at the end ([`held_at_end`]). Also returns why each flow that kept
/// its slot but does not hold its queue fails.
pub fn slot_counts<S: BuildHasher, T: BuildHasher>(
    flows: &[Flow],
    hashes: &HashMap<FlowKey, u32, S>,
    added: &HashSet<FlowKey, T>,
    end: &AtEnd,
    rule: SlotRule,
    log: u32,
) -> (SlotCounts, Vec<String>) {
    let mut c = SlotCounts::default();
    let mut misses = Vec::new();
    let mut users: HashMap<(usize, u32), u64> = HashMap::new();
    let mut placed = Vec::new();
    for f in flows.iter().filter(|f| f.needs_filter()) {
        match hashes.get(&f.key) {
            Some(&h) => {
                let at = (f.rx_q, rule.slot(h, log));
                *users.entry(at).or_default() += 1;
                placed.push((f, at));
            }
            None => c.hash_unknown += 1,
        }
    }
    for (f, at) in placed {
        if users[&at] > 1 {
            c.shared_slot += 1;
            c.shared_slot_held += u64::from(held_at_end(f, end).is_ok());
        } else {
            c.own_slot += 1;
            if added.contains(&f.key) {
                c.own_slot_added += 1;
            }
            match held_at_end(f, end) {
                Ok(()) => {
                    c.own_slot_live += 1;
                    c.own_slot_on_queue += 1;
                }
                Err((live, why)) => {
                    c.own_slot_live += u64::from(live);
                    misses.push(why);
                }
            }
        }
    }
    (c, misses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sport: u16) -> FlowKey {
        FlowKey::new(
            L4Proto::Udp,
            "10.0.2.1".parse().unwrap(),
            sport,
            "10.0.2.15".parse().unwrap(),
            5001,
        )
        .unwrap()
    }

    #[test]
    fn rules_match_the_kernels() {
        // hash_32 of include/linux/hash.h: (val * 0x61C88647) >> (32 - bits).
        assert_eq!(SlotRule::Hash32.slot(1, 8), 0x61);
        assert_eq!(
            SlotRule::Hash32.slot(0xdead_beef, 8),
            (0xdead_beefu32.wrapping_mul(0x61C8_8647)) >> 24
        );
        assert_eq!(SlotRule::Mask.slot(0x1234, 8), 0x34);
        assert_eq!(SlotRule::Mask.slot(7, 0), 0);
        assert_eq!(table_log(256), 8);
        assert_eq!(table_log(300), 9);
    }

    #[test]
    fn parses_the_hashes_and_infers_the_rule() {
        let fh = "# flows 2 full 3\n\
                  udp 10.0.2.1 10000 10.0.2.15 5001 hash 0x00001234 rxq 2 packets 40\n\
                  udp fd00::1 10001 fd00::15 5001 hash 0xdeadbeef rxq -1 packets 1\n";
        let (h, full) = parse_flowhash(fh).unwrap();
        assert_eq!(full, 3);
        assert_eq!(h[&key(10000)], 0x1234);
        assert_eq!(h.len(), 2);
        let f = vec![(key(10000), 0x34)];
        assert_eq!(infer_rule(&f, &h, 8), Ok(Some(SlotRule::Mask)));
        let f32 = vec![(key(10000), SlotRule::Hash32.slot(0x1234, 8))];
        assert_eq!(infer_rule(&f32, &h, 8), Ok(Some(SlotRule::Hash32)));
        assert!(infer_rule(&[(key(10000), 1)], &h, 8).is_err());
        assert_eq!(infer_rule(&[], &h, 8), Ok(None));
        assert!(parse_flowhash("udp 1 2 3").is_err());
    }

    #[test]
    fn rps_cpu_is_reciprocal_scale_over_the_map() {
        let map = rps_map_of("f").unwrap();
        assert_eq!(map, [0, 1, 2, 3]);
        assert_eq!(rps_map_of("5").unwrap(), [0, 2]);
        assert_eq!(rps_cpu(0, &map), Some(0));
        assert_eq!(rps_cpu(0x3fff_ffff, &map), Some(0));
        assert_eq!(rps_cpu(0x4000_0000, &map), Some(1));
        assert_eq!(rps_cpu(0xffff_ffff, &map), Some(3));
        assert_eq!(rps_cpu(0x8000_0000, &[0, 2]), Some(2));
        assert_eq!(rps_cpu(7, &[]), None);
        assert!(rps_map_of("zz").is_none());
        let fh = "# flows 1 full 0\nudp 10.0.2.1 10000 10.0.2.15 5001 hash 0x00001234 rxq 0 packets 40\n";
        assert_eq!(
            parse_flowhash_packets(fh).unwrap(),
            [(key(10000), 0x1234, 40)]
        );
        assert!(
            parse_flowhash_packets("udp 10.0.2.1 10000 10.0.2.15 5001 hash 0x1 rxq 0\n").is_err()
        );
    }

    fn flow(sport: u16, rx_q: usize) -> Flow {
        Flow {
            local_port: 5001,
            cpu: rx_q,
            key: key(sport),
            rss_q: 0,
            rx_q,
        }
    }

    /// Every flow of `flows` with a live filter to its queue and all of its
    /// 100 last-window packets there.
    fn all_held(flows: &[Flow]) -> AtEnd {
        AtEnd {
            live_q: flows.iter().map(|f| (f.key, f.rx_q)).collect(),
            last: flows
                .iter()
                .map(|f| (f.key, [(f.rx_q, 100)].into_iter().collect()))
                .collect(),
        }
    }

    #[test]
    fn a_shared_slot_is_not_owned() {
        // Flows 1 and 2 share queue 1's slot 0x34; flow 3 has queue 2's
        // slot 0x34 to itself; flow 4 stays on RSS (no filter needed).
        let flows = vec![flow(1, 1), flow(2, 1), flow(3, 2), flow(4, 0), flow(5, 3)];
        let hashes: HashMap<FlowKey, u32> = [
            (key(1), 0x134),
            (key(2), 0x234),
            (key(3), 0x34),
            (key(4), 0x34),
        ]
        .into_iter()
        .collect();
        let added: HashSet<FlowKey> = [key(1), key(3)].into_iter().collect();
        // Flow 2 lost the shared slot: no live filter at the end.
        let mut end = all_held(&flows);
        end.live_q.remove(&key(2));
        let (c, misses) = slot_counts(&flows, &hashes, &added, &end, SlotRule::Mask, 8);
        assert_eq!(
            c,
            SlotCounts {
                own_slot: 1,
                own_slot_added: 1,
                own_slot_live: 1,
                own_slot_on_queue: 1,
                shared_slot: 2,
                shared_slot_held: 1,
                hash_unknown: 1
            }
        );
        assert!(misses.is_empty(), "{misses:?}");
    }

    #[test]
    fn only_a_live_filter_to_the_queue_with_the_packets_there_counts() {
        // Seven flows to queue 1, each in a slot of its own, every one with
        // an ADD in the trace; only flow 1 holds its queue at the end.
        let flows: Vec<Flow> = (1..=7).map(|p| flow(p, 1)).collect();
        let hashes: HashMap<FlowKey, u32> = (1..=7).map(|p| (key(p), u32::from(p))).collect();
        let added: HashSet<FlowKey> = (1..=7).map(key).collect();
        let mut end = all_held(&flows);
        let q = |v: &[(usize, u64)]| v.iter().copied().collect::<BTreeMap<usize, u64>>();
        // 2: its live filter names queue 3, and its packets went there.
        end.live_q.insert(key(2), 3);
        end.last.insert(key(2), q(&[(3, 100)]));
        // 3: filter to queue 1, but only 94 of 100 packets arrived there.
        end.last.insert(key(3), q(&[(1, 94), (0, 6)]));
        // 4: its filter was deleted before the end (ADD and DEL in the
        // trace, not in the table), though the window's packets were on q1.
        end.live_q.remove(&key(4));
        // 5: filter to queue 1, packets there, but 6 of 100 from an unknown
        // NAPI: they count against it.
        end.last.insert(key(5), q(&[(1, 94), (usize::MAX, 6)]));
        // 6: filter to queue 1, no packet at all in the window.
        end.last.remove(&key(6));
        // 7: exactly the bar (95 of 100) counts.
        end.last.insert(key(7), q(&[(1, 95), (0, 5)]));
        let (c, misses) = slot_counts(&flows, &hashes, &added, &end, SlotRule::Mask, 8);
        assert_eq!(
            c,
            SlotCounts {
                own_slot: 7,
                own_slot_added: 7,
                own_slot_live: 5,
                own_slot_on_queue: 2,
                shared_slot: 0,
                shared_slot_held: 0,
                hash_unknown: 0
            },
            "{misses:?}"
        );
        assert_eq!(misses.len(), 5, "{misses:?}");
        assert!(misses
            .iter()
            .any(|m| m.contains(":5001 live filter to q3, expected q1")));
        assert!(misses.iter().any(|m| m.contains("no live filter")));
        assert!(misses
            .iter()
            .any(|m| m.contains("94.0% of its 100 packets")));
        assert!(misses.iter().any(|m| m.contains("0.0% of its 0 packets")));
        // The verdict per flow, as the check reads it.
        assert_eq!(held_at_end(&flows[0], &end), Ok(()));
        assert!(matches!(held_at_end(&flows[1], &end), Err((false, _))));
        assert!(matches!(held_at_end(&flows[2], &end), Err((true, _))));
        assert!(matches!(held_at_end(&flows[3], &end), Err((false, _))));
        assert!((share_on(&q(&[(1, 3), (2, 1)]), 1) - 0.75).abs() < 1e-12);
        assert!(share_on(&BTreeMap::new(), 1).abs() < 1e-12);
    }

    #[test]
    fn old_points_without_the_end_counts_read_as_zero() {
        let c: SlotCounts =
            serde_json::from_str(r#"{"own_slot": 187, "own_slot_added": 187, "hash_unknown": 0}"#)
                .unwrap();
        assert_eq!(
            (c.own_slot, c.own_slot_live, c.own_slot_on_queue),
            (187, 0, 0)
        );
    }
}
