//! Guest ports for the steering workload such that no two flows share an
//! RFS slot, so that a steer-style verdict never depends on where the
//! boot's hash secret happened to put two flows.
//!
//! Two flows whose hashes map to the same `rps_dev_flow` slot of a queue's
//! table fight over it: on 7.x the loser is never steered (the slot already
//! holds an active filter), on 6.12 they take the filter from each other.
//! With 64 flows in 2^18 slots that happens about once per 1,000 workload
//! placements: no device defect, but a failed steer check. Likewise two
//! flows sharing an `rps_sock_flow_table` entry (2^20) overwrite each
//! other's CPU.
//!
//! A flow's hash is keyed with a secret chosen at boot and can only be
//! read in the guest: the probe sends a few packets of every candidate flow
//! (no socket listens yet, so RFS records nothing and no filter is asked
//! for) while the test helper `vnic_flowhash.ko` records each flow's hash
//! ([`super::slots`]). Then [`choose`] keeps each default flow unless its
//! slot is taken, and otherwise puts a spare port in its place with the
//! same family and the same RSS queue (so which flows need a filter, in
//! every rotation, is what the default workload gives).
//!
//! The rule is conservative in two ways. It does not depend on the kernel:
//! slots must differ under both the 6.12 rule (`hash & mask`) and the 7.x
//! rule (`hash_32(hash, log)`). And it does not depend on queues: `migrate`
//! moves every receiver to the next CPU, round after round, so over the
//! rotations any two flows meet in some queue's table; requiring distinct
//! slots over all flows covers every rotation at once.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use arfs::FlowKey;

use super::slots::{self, SlotRule};
use super::workload::Flow;
use super::Session;
use crate::harness::Result;

/// The slots a flow of hash `h` takes: (rule, rps_dev_flow slot, sock
/// flow entry), under each rule.
fn footprint(h: u32, flow_log: u32, sock_log: u32) -> [(SlotRule, u32, u32); 2] {
    SlotRule::ALL.map(|r| (r, r.slot(h, flow_log), r.slot(h, sock_log)))
}

/// Why a flow of hash `h` cannot join `taken`, if it cannot.
fn clash(h: u32, taken: &[(FlowKey, u32)], flow_log: u32, sock_log: u32) -> Option<String> {
    let mine = footprint(h, flow_log, sock_log);
    for &(k, other) in taken {
        for ((rule, slot, sock), (_, oslot, osock)) in
            mine.iter().zip(footprint(other, flow_log, sock_log))
        {
            if *slot == oslot {
                return Some(format!(
                    "{k} (hash {other:#010x}) has the same rps_dev_flow slot {slot} under {rule:?} (log {flow_log}) as hash {h:#010x}"
                ));
            }
            if *sock == osock {
                return Some(format!(
                    "{k} (hash {other:#010x}) has the same rps_sock_flow entry {sock} under {rule:?} (log {sock_log}) as hash {h:#010x}"
                ));
            }
        }
    }
    None
}

/// Of `keys` (each with a hash in `hashes`), those that share a slot with
/// another ([`clash`]), and one line per such pair.
fn shared_slots(
    keys: &[FlowKey],
    hashes: &HashMap<FlowKey, u32>,
    flow_log: u32,
    sock_log: u32,
) -> (BTreeSet<FlowKey>, Vec<String>) {
    let mut out = BTreeSet::new();
    let mut why = Vec::new();
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[..i] {
            if let Some(w) = clash(hashes[a], &[(*b, hashes[b])], flow_log, sock_log) {
                out.insert(*a);
                out.insert(*b);
                why.push(format!("{a}: {w}"));
            }
        }
    }
    (out, why)
}

/// What [`choose`] did.
#[derive(Debug, Default)]
pub struct Choice {
    pub flows: Vec<Flow>,
    /// One line per default flow that was replaced, with the proof (the
    /// hashes and the shared slot).
    pub replaced: Vec<String>,
    /// Flows kept although their slot could not be shown free (no hash
    /// recorded, or no spare left): the verdicts on them are not
    /// chance-free, and the caller fails rather than runs them.
    pub unproven: Vec<String>,
}

/// Keep each flow of `default` (in order) whose slots are free, else the
/// first unused spare with the same family and RSS queue whose slots are.
pub fn choose(
    default: &[Flow],
    spares: &[Flow],
    hashes: &HashMap<FlowKey, u32>,
    flow_log: u32,
    sock_log: u32,
) -> Choice {
    let mut c = Choice::default();
    let mut taken: Vec<(FlowKey, u32)> = Vec::new();
    let mut used: BTreeSet<u16> = default.iter().map(|f| f.local_port).collect();
    // First every default flow that fits (earlier ones first), then a spare
    // for each of the others, checked against all of those.
    let mut out: Vec<Option<Flow>> = Vec::with_capacity(default.len());
    let mut displaced = Vec::new();
    for (i, f) in default.iter().enumerate() {
        let why = match hashes.get(&f.key) {
            None => "no hash recorded".to_string(),
            Some(&h) => match clash(h, &taken, flow_log, sock_log) {
                None => {
                    taken.push((f.key, h));
                    out.push(Some(f.clone()));
                    continue;
                }
                Some(why) => why,
            },
        };
        out.push(None);
        displaced.push((i, why));
    }
    for (i, why) in displaced {
        let f = &default[i];
        let spare = spares
            .iter()
            .filter(|s| {
                s.key.family() == f.key.family()
                    && s.rss_q == f.rss_q
                    && !used.contains(&s.local_port)
            })
            .find_map(|s| {
                let h = *hashes.get(&s.key)?;
                clash(h, &taken, flow_log, sock_log)
                    .is_none()
                    .then_some((s, h))
            });
        out[i] = Some(if let Some((s, h)) = spare {
            used.insert(s.local_port);
            taken.push((s.key, h));
            c.replaced
                .push(format!("port {} -> {}: {why}", f.local_port, s.local_port));
            Flow {
                cpu: f.cpu,
                rx_q: f.rx_q,
                ..s.clone()
            }
        } else {
            c.unproven
                .push(format!("port {}: {why}, no spare left", f.local_port));
            f.clone()
        });
    }
    c.flows = out.into_iter().flatten().collect();
    c
}

impl Session {
    /// The steering workload's flows, chosen so that no two share an RFS
    /// slot or a socket flow entry (see the module doc), from hashes
    /// probed in this boot. The proof goes to `ports.txt` in the
    /// artifacts; a flow whose slot cannot be shown free is an error.
    pub(super) fn steering_flows(&mut self, n: usize) -> Result<Vec<Flow>> {
        let default = self.make_flows(n);
        let top = default
            .iter()
            .map(|f| f.local_port)
            .max()
            .unwrap_or(super::BASE_PORT);
        // Spares above every default port, in the families in use (a mixed
        // workload's alternate between IPv4 and IPv6, as its flows do).
        let spares = self.flows_at(top.saturating_add(1), n.max(16));
        let probe: Vec<Flow> = default.iter().chain(&spares).cloned().collect();
        self.load_flowhash(probe.len())?;
        // Three packets of each: a lost one still leaves a hash.
        let rate = self.settings.rate.max(1000);
        self.gen_sets_for(&probe, rate, 3)?;
        let secs = (probe.len() as u64 * 3).div_ceil(u64::from(rate)) + 1;
        std::thread::sleep(Duration::from_secs(secs));
        self.guest.ctl.gen_stop(None)?;
        self.gen_running = false;
        self.gen_sets.clear();
        let (hashes, full) = self.read_flowhash()?;
        crate::ensure!(
            full == 0,
            "vnic_flowhash had no room for {full} packets' flows"
        );
        let hashes: HashMap<FlowKey, u32> = hashes.into_iter().collect();
        let flow_log = slots::table_log(self.settings.flow_cnt);
        let sock_log = slots::table_log(self.settings.sock_flow_entries);
        let c = choose(&default, &spares, &hashes, flow_log, sock_log);
        let mut text = format!(
            "# steering workload: {} flows, rps_dev_flow log {flow_log}, rps_sock_flow log {sock_log}, {} probed, {} hashes\n",
            c.flows.len(),
            probe.len(),
            hashes.len()
        );
        for l in c.replaced.iter().chain(&c.unproven) {
            let _ = writeln!(text, "{l}");
        }
        for f in &c.flows {
            let h = hashes.get(&f.key).copied();
            let _ = writeln!(
                text,
                "{} cpu {} rss_q {} rx_q {} hash {}",
                f.key,
                f.cpu,
                f.rss_q,
                f.rx_q,
                h.map_or("?".to_string(), |h| format!("{h:#010x}"))
            );
        }
        self.guest.art.write("ports.txt", &text);
        if !c.replaced.is_empty() {
            eprintln!(
                "[guest-tests] steering ports: {} flow(s) moved off a shared RFS slot: {}",
                c.replaced.len(),
                c.replaced.join("; ")
            );
        }
        crate::ensure!(
            c.unproven.is_empty(),
            "steering workload: no collision-free port for {} flow(s): {}",
            c.unproven.len(),
            c.unproven.join("; ")
        );
        Ok(c.flows)
    }

    /// Of `keys` (flows whose ports the scenario could not choose, such as
    /// a TCP client's ephemeral ones, already sending), those that share an
    /// RFS slot or a socket flow entry with another under either kernel's
    /// rule, with one line per shared pair. `vnic_flowhash` must have been
    /// loaded (empty) before the flows began; this waits up to `wait` for
    /// it to hold every key, then unloads it. A key it never saw is an
    /// error: its slot could not be shown free.
    pub(super) fn colliding_flows(
        &mut self,
        keys: &[FlowKey],
        wait: Duration,
    ) -> Result<(BTreeSet<FlowKey>, Vec<String>)> {
        // The last read is the one judged; the helper goes after it.
        let hashes = crate::harness::settle(wait, || {
            let text = self
                .guest
                .agent
                .read_file(super::experiments::FLOWHASH_FLOWS)?;
            let (seen, _) = slots::parse_flowhash(&text)?;
            let all = keys.iter().all(|k| seen.contains_key(k));
            Ok((seen, all))
        })?;
        self.unload_flowhash()?;
        let unseen: Vec<String> = keys
            .iter()
            .filter(|k| !hashes.contains_key(k))
            .map(ToString::to_string)
            .collect();
        crate::ensure!(
            unseen.is_empty(),
            "vnic_flowhash recorded no hash for {} flow(s) in {wait:?}, so their slots cannot be shown free: {}",
            unseen.len(),
            unseen.join(", ")
        );
        Ok(shared_slots(
            keys,
            &hashes,
            slots::table_log(self.settings.flow_cnt),
            slots::table_log(self.settings.sock_flow_entries),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arfs::L4Proto;

    fn flow(port: u16, rss_q: usize) -> Flow {
        Flow {
            local_port: port,
            cpu: 0,
            key: FlowKey::v4(
                L4Proto::Udp,
                "10.0.2.1".parse().unwrap(),
                9,
                "10.0.2.15".parse().unwrap(),
                port,
            ),
            rss_q,
            rx_q: 0,
        }
    }

    #[test]
    fn a_shared_slot_is_replaced_by_a_spare_of_the_same_rss_queue() {
        let default = [flow(1, 0), flow(2, 1), flow(3, 2)];
        let spares = [flow(10, 0), flow(11, 1), flow(12, 1)];
        // Port 2 shares port 1's slot under `hash & mask` (log 8); spare 11
        // shares port 3's (a default flow after it); spare 12 is free.
        let (h3, h11) = (0x0000_0777, 0x0000_1177);
        let hashes: HashMap<FlowKey, u32> = [
            (flow(1, 0).key, 0x1234),
            (flow(2, 1).key, 0x5634),
            (flow(3, 2).key, h3),
            (flow(10, 0).key, 0x4321),
            (flow(11, 1).key, h11),
            (flow(12, 1).key, 0x0000_a5a5),
        ]
        .into_iter()
        .collect();
        let c = choose(&default, &spares, &hashes, 8, 8);
        let ports: Vec<u16> = c.flows.iter().map(|f| f.local_port).collect();
        assert_eq!(ports, [1, 12, 3], "{:?}", c.replaced);
        assert_eq!(c.replaced.len(), 1);
        assert!(c.replaced[0].contains("Mask"), "{}", c.replaced[0]);
        assert!(c.unproven.is_empty());
        // Every pair now differs under both rules.
        let hs: Vec<u32> = c.flows.iter().map(|f| hashes[&f.key]).collect();
        for (i, &a) in hs.iter().enumerate() {
            for &b in &hs[i + 1..] {
                for r in SlotRule::ALL {
                    assert_ne!(r.slot(a, 8), r.slot(b, 8));
                }
            }
        }
    }

    #[test]
    fn both_flows_of_a_shared_slot_are_named_and_only_they() {
        let keys = [
            flow(1, 0).key,
            flow(2, 1).key,
            flow(3, 2).key,
            flow(4, 3).key,
        ];
        // Ports 1 and 3 share a slot under `hash & mask` (log 8); 2 and 4
        // are apart from everything under both rules.
        let hashes: HashMap<FlowKey, u32> = [
            (keys[0], 0x1234),
            (keys[1], 0x0000_a5a5),
            (keys[2], 0x9934),
            (keys[3], 0x0000_5a17),
        ]
        .into_iter()
        .collect();
        let (shared, why) = shared_slots(&keys, &hashes, 8, 12);
        assert_eq!(shared, [keys[0], keys[2]].into_iter().collect(), "{why:?}");
        assert_eq!(why.len(), 1);
        assert!(why[0].contains("Mask"), "{}", why[0]);
        // Nothing shared, nothing named.
        let (none, why) = shared_slots(&[keys[1], keys[3]], &hashes, 8, 12);
        assert!(none.is_empty() && why.is_empty(), "{why:?}");
    }

    #[test]
    fn no_hash_or_no_spare_is_unproven_not_silently_kept() {
        let default = [flow(1, 0), flow(2, 1)];
        let hashes: HashMap<FlowKey, u32> = [(flow(1, 0).key, 0x1234)].into_iter().collect();
        let c = choose(&default, &[], &hashes, 8, 8);
        assert_eq!(c.unproven.len(), 1);
        assert!(c.unproven[0].contains("no hash recorded"));
    }
}
