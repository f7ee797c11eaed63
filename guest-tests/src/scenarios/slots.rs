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

use std::collections::{HashMap, HashSet};
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

/// `vnic_flowhash`'s `flows` file: flow -> hash, and the packets of flows
/// it had no room for. Lines: `udp SRC SPORT DST DPORT hash 0x.. rxq Q
/// packets N`, after `# flows N full M`.
pub fn parse_flowhash(text: &str) -> Result<(HashMap<FlowKey, u32>, u64), String> {
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
        let bad = || format!("vnic_flowhash: cannot parse {line:?}");
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
pub fn parse_flowhash_packets(text: &str) -> Result<Vec<(FlowKey, u32, u64)>, String> {
    let (hashes, _) = parse_flowhash(text)?;
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("vnic_flowhash: cannot parse {line:?}");
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
) -> Result<Option<SlotRule>, String> {
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
    Err(format!(
        "neither `hash & mask` nor `hash_32` maps the flow hashes of the {} filters to their flow_id (table log {log})",
        known.len()
    ))
}

/// Slot figures of one set of concurrent flows (one iteration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotCounts {
    /// Flows needing a filter whose (target queue, slot) no other such
    /// flow shares.
    pub own_slot: u64,
    /// Of those, flows that got a filter.
    pub own_slot_added: u64,
    /// Flows needing a filter with no recorded hash (not counted above).
    pub hash_unknown: u64,
}

impl std::ops::AddAssign for SlotCounts {
    fn add_assign(&mut self, o: Self) {
        self.own_slot += o.own_slot;
        self.own_slot_added += o.own_slot_added;
        self.hash_unknown += o.hash_unknown;
    }
}

/// Counts, for flows that run at the same time, which keep their slot and
/// which of those got a filter.
pub fn slot_counts<S: BuildHasher, T: BuildHasher>(
    flows: &[Flow],
    hashes: &HashMap<FlowKey, u32, S>,
    added: &HashSet<FlowKey, T>,
    rule: SlotRule,
    log: u32,
) -> SlotCounts {
    let mut c = SlotCounts::default();
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
        if users[&at] == 1 {
            c.own_slot += 1;
            if added.contains(&f.key) {
                c.own_slot_added += 1;
            }
        }
    }
    c
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

    #[test]
    fn a_shared_slot_is_not_owned() {
        let flow = |sport: u16, rx_q: usize| Flow {
            local_port: 5001,
            cpu: rx_q,
            key: key(sport),
            rss_q: 0,
            rx_q,
        };
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
        let c = slot_counts(&flows, &hashes, &added, SlotRule::Mask, 8);
        assert_eq!(
            c,
            SlotCounts {
                own_slot: 1,
                own_slot_added: 1,
                hash_unknown: 1
            }
        );
    }
}
