//! Steering: which rx queue a frame from the peer goes to.
//!
//! [`Steer`] is one worker's view: its replica of the filter table (a
//! [`FlowIndex`] fed with the table's events), RSS over the enabled pairs,
//! and the path-fault knobs. [`Steer::decide`] takes the frame's bytes and
//! returns a [`Decision`]: the rx queue, the filter hit (if any) and the
//! faults drawn for it. It touches no ring, no counter and no other
//! thread: the worker ([`crate::handoff::Router`]) counts what the
//! decision says and hands the frame to the queue. The path faults are
//! drawn after the hit, so the device's own figures stay blind to them;
//! [`corrupt_payload`] is the damage the corrupt and bad-checksum faults do,
//! [`truncate_payload`] the truncate fault's (the reorder fault's hold is
//! the router's).

use arfs::{FlowIndex, FlowKey, Rss, RuleAction, RuleInput, TableEvent, L3};

use crate::frame::{checksum, tcp_payload, udp_payload};

/// [`Decision::flags`]: the `drop_rate` fault chose the frame.
pub(crate) const FAULT_DROP: u16 = 1;
/// [`Decision::flags`]: the `corrupt_rate` fault chose the frame.
pub(crate) const FAULT_CORRUPT: u16 = 2;
/// [`Decision::flags`]: the `bad_csum_rate` fault chose the frame.
pub(crate) const FAULT_BAD_CSUM: u16 = 4;
/// [`Decision::flags`]: the `misroute_rate` fault moved the frame to
/// another queue than its filter's.
pub(crate) const MISROUTED: u16 = 8;
/// [`Decision::flags`]: the frame did not parse; it goes to queue 0.
pub(crate) const UNPARSABLE: u16 = 16;
/// [`Decision::flags`]: the `truncate_rate` fault chose the frame.
pub(crate) const FAULT_TRUNCATE: u16 = 32;
/// [`Decision::flags`]: the `reorder_rate` fault chose the frame.
pub(crate) const FAULT_REORDER: u16 = 64;
/// [`Decision::flags`]: the `delay_effect_ms` fault kept the hit on the
/// queue its flow had before the filter was added or re-steered.
pub(crate) const DELAYED: u16 = 128;
/// [`Decision::flags`]: an `ethtool -N` rule with action drop matched:
/// the frame is not delivered (counted in `peer.rule_dropped`).
pub(crate) const RULE_DROP: u16 = 256;
/// Payload bytes the `truncate_rate` fault cuts off.
pub(crate) const TRUNCATE_BYTES: usize = 16;

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The rx queue.
    pub q: usize,
    /// The filter it hit (its id), or None: a rule or RSS chose the queue.
    pub hit: Option<u16>,
    /// [`FAULT_DROP`], [`FAULT_CORRUPT`], [`FAULT_BAD_CSUM`],
    /// [`FAULT_TRUNCATE`], [`FAULT_REORDER`], [`MISROUTED`], [`DELAYED`],
    /// [`UNPARSABLE`], [`RULE_DROP`].
    pub flags: u16,
    /// The rule (its location) that decided, ahead of any filter.
    pub rule: Option<u16>,
}

/// One worker's steering state (see the module's doc).
pub(crate) struct Steer {
    index: FlowIndex<u16>,
    rss: Rss,
    /// Enabled pairs (bit i: pair i; always a prefix).
    mask: u32,
    /// The path faults' thresholds (probability * 2^32): misroute, drop,
    /// corrupt, bad checksum, truncate, reorder.
    fault: [u64; 6],
    /// Whether any of `fault` is set: the hit path tests one flag, not
    /// four words.
    faults_on: bool,
    /// The fault draws' state (xorshift64*, seeded per worker).
    rng: u64,
    /// The `delay_effect_ms` fault (ns; 0: off) and the time of the last
    /// [`Steer::set_delay`] (the replica's sync, the clock of the trace).
    delay_ns: u64,
    now_ns: u64,
    /// Filters applied under the delay: (id, until, queue meanwhile; None:
    /// RSS's). Short: only filters of the last `delay_ns`.
    delayed: Vec<(u16, u64, Option<u16>)>,
    /// `--steer none`: no parse, no lookup (see [`Steer::new`]).
    off: bool,
    /// The worker's own pair.
    own: usize,
    /// The replica of the `ethtool -N` rule stage (decides before the
    /// filters; empty: not looked at).
    rules: arfs::RuleSet,
}

impl Steer {
    /// Worker `id`'s steering, for a table of `capacity` filters, with no
    /// pair enabled yet. `off` (`--steer none`, benchmarks of the data
    /// path alone): no frame is parsed or looked up; each goes to the
    /// worker's own rx queue (queue 0 while that one is not enabled) as an
    /// RSS decision, and only a management frame from the peer is still
    /// refused.
    pub(crate) fn new(id: usize, capacity: usize, off: bool) -> Self {
        Self {
            index: FlowIndex::new(capacity),
            rss: Rss::new(1),
            mask: 0,
            fault: [0; 6],
            faults_on: false,
            rng: 0x9e37_79b9_7f4a_7c15 ^ ((id as u64 + 1) << 32),
            delay_ns: 0,
            now_ns: 0,
            delayed: Vec::new(),
            off,
            own: id,
            rules: arfs::RuleSet::new(arfs::table::MAX_RULES),
        }
    }

    /// Applies one event of the filter table to the replica.
    #[inline]
    pub(crate) fn apply(&mut self, e: &TableEvent) {
        if self.rules.apply(e) || self.rss.apply(e) {
            return;
        }
        self.index.apply(e);
        if self.delay_ns == 0 && self.delayed.is_empty() {
            return;
        }
        let (id, old) = match *e {
            TableEvent::Added { id, .. } => (id, Some(None)),
            // A re-steer keeps its hits on the queue it had; an id given
            // to another flow starts from RSS's.
            TableEvent::Replaced {
                id,
                flow,
                prev_flow,
                prev_rxq,
                ..
            } => (id, Some((flow == prev_flow).then_some(prev_rxq))),
            TableEvent::Deleted { id, .. } | TableEvent::Evicted { id, .. } => (id, None),
            TableEvent::Cleared { .. } => {
                self.delayed.clear();
                return;
            }
            _ => return,
        };
        self.delayed.retain(|d| d.0 != id);
        if let (Some(old), true) = (old, self.delay_ns > 0) {
            self.delayed
                .push((id, self.now_ns.saturating_add(self.delay_ns), old));
        }
    }

    /// The `delay_effect_ms` fault (ns) and the time now: filters the
    /// next [`Steer::apply`] installs take effect `delay_ns` from `now_ns`;
    /// those whose delay is over (all of them once it is 0) take effect.
    pub(crate) fn set_delay(&mut self, delay_ns: u64, now_ns: u64) {
        self.delay_ns = delay_ns;
        self.now_ns = now_ns;
        if !self.delayed.is_empty() {
            self.delayed.retain(|d| delay_ns > 0 && d.1 > now_ns);
        }
    }

    /// The enabled pairs (bit i: pair i); RSS spreads over them (the
    /// device's table is refilled; a driver's is kept, its entries past
    /// them falling back to the round-robin ones).
    pub(crate) fn set_mask(&mut self, mask: u32) {
        if mask != self.mask {
            self.mask = mask;
            self.rss.set_enabled(mask.trailing_ones().max(1) as u16);
        }
    }

    pub(crate) fn mask(&self) -> u32 {
        self.mask
    }

    /// The path faults' thresholds: misroute, drop, corrupt, bad checksum,
    /// truncate, reorder (each a probability times 2^32).
    pub(crate) fn set_faults(&mut self, f: [u64; 6]) {
        self.fault = f;
        self.faults_on = f != [0; 6];
    }

    /// Where `frame` (an Ethernet frame, no virtio-net header) goes: a
    /// filter hit gives the filter's queue, otherwise RSS; `None` for a
    /// frame with the management EtherType (never delivered: a peer must
    /// not speak for the device).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn decide(&mut self, frame: &[u8]) -> Option<Decision> {
        if self.off {
            return self.unsteered(frame);
        }
        // The common frame, an untagged IPv4 TCP/UDP flow, without building
        // a whole ParsedFrame (the same checks: arfs' tests hold the two
        // to agreeing on every frame); every other frame is parsed in full.
        if let Some(k) = arfs::ipv4_flow(frame) {
            if !self.rules.is_empty() {
                if let Some(d) = self.decide_rule(&RuleInput::of_flow(&k), Some(&k)) {
                    return Some(d);
                }
            }
            return Some(self.decide_flow(&k));
        }
        // A peer must not speak for the device, whatever tags it wraps its
        // frame in: the guest strips 802.1ad/QinQ/VID-0 tags before its
        // packet handlers see the frame.
        if arfs::proto::is_mgmt_behind_tags(frame) {
            return None;
        }
        let Ok(p) = arfs::parse_frame(frame) else {
            return Some(Decision {
                q: 0,
                hit: None,
                flags: UNPARSABLE,
                rule: None,
            });
        };
        if !self.rules.is_empty() {
            let input = match &p.l3 {
                L3::Flow(k) => Some((RuleInput::of_flow(k), Some(k))),
                L3::Ip(ip) => Some((RuleInput::of_ip(ip), None)),
                L3::NonIp => None,
            };
            if let Some(d) = input.and_then(|(i, k)| self.decide_rule(&i, k)) {
                return Some(d);
            }
        }
        let L3::Flow(k) = &p.l3 else {
            return Some(Decision {
                q: usize::from(self.rss.queue_for(&p)),
                hit: None,
                flags: 0,
                rule: None,
            });
        };
        Some(self.decide_flow(k))
    }

    /// The decision for a TCP/UDP flow: its filter, else RSS; the fault
    /// knobs on a hit.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn decide_flow(&mut self, k: &FlowKey) -> Decision {
        // (An empty table is not looked at: its slots are cold.)
        let Some((id, q)) = (!self.index.is_empty())
            .then(|| self.index.lookup(k))
            .flatten()
        else {
            return Decision {
                q: usize::from(self.rss.queue_for_key(k)),
                hit: None,
                flags: 0,
                rule: None,
            };
        };
        let mut q = usize::from(q);
        let mut flags = 0;
        if !self.delayed.is_empty() {
            if let Some(&(_, _, old)) = self.delayed.iter().find(|d| d.0 == id) {
                q = old.map_or_else(|| usize::from(self.rss.queue_for_key(k)), usize::from);
                flags |= DELAYED;
            }
        }
        if self.faults_on {
            if self.draw(self.fault[0]) {
                let to = self.misroute(q);
                if to != q {
                    flags |= MISROUTED;
                }
                q = to;
            }
            if self.draw(self.fault[1]) {
                flags |= FAULT_DROP;
            }
            if self.draw(self.fault[2]) {
                flags |= FAULT_CORRUPT;
            }
            if self.draw(self.fault[3]) {
                flags |= FAULT_BAD_CSUM;
            }
            if self.draw(self.fault[4]) {
                flags |= FAULT_TRUNCATE;
            }
            if self.draw(self.fault[5]) {
                flags |= FAULT_REORDER;
            }
        }
        Decision {
            q,
            hit: Some(id),
            flags,
            rule: None,
        }
    }

    /// The decision of the rule stage for a packet, or None when no rule
    /// matches. A context's queue is RSS's over the enabled queues (the
    /// default context; others are refused when the rule is set) plus the
    /// rule's offset, wrapped to the enabled queues.
    #[cold]
    #[inline(never)]
    fn decide_rule(&mut self, input: &RuleInput, k: Option<&FlowKey>) -> Option<Decision> {
        let (loc, action) = self.rules.lookup(input)?;
        let n = (self.mask.trailing_ones() as usize).max(1);
        let (q, flags) = match action {
            RuleAction::Queue(q) => (usize::from(q), 0),
            RuleAction::Drop => (0, RULE_DROP),
            RuleAction::Context { offset, .. } => {
                let rss = k.map_or(0, |k| usize::from(self.rss.queue_for_key(k)));
                ((rss + usize::from(offset)) % n, 0)
            }
        };
        Some(Decision {
            q,
            hit: None,
            flags,
            rule: Some(loc as u16),
        })
    }

    /// `--steer none`'s decision: the worker's own queue, no parse.
    #[inline(never)]
    fn unsteered(&self, frame: &[u8]) -> Option<Decision> {
        if arfs::proto::is_mgmt_behind_tags(frame) {
            return None;
        }
        let own = 1u32.checked_shl(self.own as u32).unwrap_or(0);
        Some(Decision {
            q: if self.mask & own != 0 { self.own } else { 0 },
            hit: None,
            flags: 0,
            rule: None,
        })
    }

    /// One fault draw: true with probability `thr / 2^32` (xorshift64*).
    #[inline]
    fn draw(&mut self, thr: u64) -> bool {
        if thr == 0 {
            return false;
        }
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) < thr
    }

    /// The `misroute` fault: the next enabled queue after `q` (`q` itself
    /// when only one is enabled).
    fn misroute(&self, q: usize) -> usize {
        let n = (self.mask.trailing_ones() as usize).max(1);
        (q + 1) % n
    }
}

/// The `corrupt_rate` fault: flips every bit of the last byte of a UDP
/// datagram's or TCP segment's payload and, with `keep_csum`, updates its
/// checksum to match (RFC 1624), so that only a check of the payload's
/// content can see it (without: the `bad_csum_rate` fault, a checksum error
/// for the guest's stack). `false` (frame untouched) for anything but UDP
/// or TCP with a payload.
pub(crate) fn corrupt_payload(frame: &mut [u8], keep_csum: bool) -> bool {
    // (L4 offset, payload offset in the segment, payload length, checksum
    // offset in the segment, UDP)
    let (l4, hdr, len, csum_at, udp) = if let Some((l4, p)) = udp_payload(frame) {
        (l4, 8, p.len(), 6, true)
    } else if let Some((l4, doff, p)) = tcp_payload(frame) {
        (l4, doff, p.len(), 16, false)
    } else {
        return false;
    };
    if len == 0 {
        return false;
    }
    // The last byte of the payload: the low half of its checksum word when
    // its offset in the segment is odd, else the high half of a word
    // padded with zero.
    let j = hdr + len - 1;
    let at = l4 + j;
    let b = frame[at];
    let (old, new) = if j & 1 == 1 {
        let hi = u16::from(frame[at - 1]) << 8;
        (hi | u16::from(b), hi | u16::from(!b))
    } else {
        (u16::from(b) << 8, u16::from(!b) << 8)
    };
    frame[at] = !b;
    if !keep_csum {
        return true;
    }
    let cs = l4 + csum_at;
    let c = u16::from_be_bytes([frame[cs], frame[cs + 1]]);
    if c == 0 && udp && l4 == 34 {
        return true; // IPv4 UDP without a checksum
    }
    let mut sum = u32::from(!c) + u32::from(!old) + u32::from(new);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let mut c = !(sum as u16);
    if c == 0 && udp {
        c = 0xffff; // UDP sends a computed 0 as all ones (0 = none)
    }
    frame[cs..cs + 2].copy_from_slice(&c.to_be_bytes());
    true
}

/// The `truncate_rate` fault: cuts the last [`TRUNCATE_BYTES`] bytes off a
/// UDP datagram's or TCP segment's payload and rewrites what describes it
/// to match: the IPv4 total length and header checksum or the IPv6 payload
/// length, the UDP length, the UDP or TCP checksum (over the shorter
/// segment). The guest's stack finds nothing wrong: only a length the
/// payload itself carries tells. Returns the frame's new length (bytes
/// past it are to be dropped), or `None` (frame untouched) for anything but
/// UDP or TCP with more than [`TRUNCATE_BYTES`] bytes of payload.
pub(crate) fn truncate_payload(frame: &mut [u8]) -> Option<usize> {
    let (l4, hdr, len, udp) = if let Some((l4, p)) = udp_payload(frame) {
        (l4, 8, p.len(), true)
    } else if let Some((l4, doff, p)) = tcp_payload(frame) {
        (l4, doff, p.len(), false)
    } else {
        return None;
    };
    if len <= TRUNCATE_BYTES {
        return None;
    }
    let seg = hdr + len - TRUNCATE_BYTES;
    let end = l4 + seg;
    let seg16 = u16::try_from(seg).ok()?;
    let v4 = l4 == 34;
    if v4 {
        frame[16..18].copy_from_slice(&u16::try_from(end - 14).ok()?.to_be_bytes());
        frame[24..26].fill(0);
        let c = checksum(&[&frame[14..34]], 0);
        frame[24..26].copy_from_slice(&c.to_be_bytes());
    } else {
        frame[18..20].copy_from_slice(&seg16.to_be_bytes());
    }
    let cs = l4 + if udp { 6 } else { 16 };
    if udp {
        frame[l4 + 4..l4 + 6].copy_from_slice(&seg16.to_be_bytes());
        if v4 && frame[cs..cs + 2] == [0, 0] {
            return Some(end); // IPv4 UDP without a checksum
        }
    }
    let proto = if udp { 17 } else { 6 };
    let mut pseudo = [0u8; 40];
    let pl = if v4 {
        pseudo[..8].copy_from_slice(&frame[26..34]);
        pseudo[9] = proto;
        pseudo[10..12].copy_from_slice(&seg16.to_be_bytes());
        12
    } else {
        pseudo[..32].copy_from_slice(&frame[22..54]);
        pseudo[32..36].copy_from_slice(&u32::from(seg16).to_be_bytes());
        pseudo[39] = proto;
        40
    };
    frame[cs..cs + 2].fill(0);
    let mut c = checksum(&[&pseudo[..pl], &frame[l4..end]], 0);
    if c == 0 && udp {
        c = 0xffff;
    }
    frame[cs..cs + 2].copy_from_slice(&c.to_be_bytes());
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{checksum, ETH_P_IP, ETH_P_IPV6};
    use arfs::proto::ETHERTYPE_MGMT;
    use arfs::{FlowKey, L4Proto};

    /// A UDP/IPv4 frame of flow `sport -> dport`.
    fn udp4(sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&50u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 2, 1]);
        f[30..34].copy_from_slice(&[10, 0, 2, 15]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[38..40].copy_from_slice(&30u16.to_be_bytes());
        let c = checksum(&[&f[14..34]], 0);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f
    }

    fn key(sport: u16, dport: u16) -> FlowKey {
        FlowKey::v4(
            L4Proto::Udp,
            [10, 0, 2, 1].into(),
            sport,
            [10, 0, 2, 15].into(),
            dport,
        )
    }

    fn add(s: &mut Steer, id: u16, k: FlowKey, q: u16) {
        s.apply(&TableEvent::Added {
            seq: 0,
            id,
            rxq: q,
            flow: k,
        });
    }

    /// An applied RSS_SET reaches the replica's RSS: a miss follows the
    /// driver's table (kept across a change of the enabled pairs, an entry
    /// past them falling back to round-robin), a hit its filter; a refused
    /// one changes nothing; the defaults' op gives round-robin back.
    #[test]
    fn an_rss_set_event_sets_the_replicas_rss() {
        use arfs::proto::{OpStatus, RssSetOp};
        use arfs::rss::INDIRECTION_LEN;
        use arfs::table::RssChange;
        use arfs::RssConfig;
        let ev = |status, t: Option<[u16; INDIRECTION_LEN]>| {
            TableEvent::RssSet(Box::new(RssChange {
                seq: Some(1),
                status,
                op: RssSetOp::new(&RssConfig {
                    key: None,
                    indirection: t,
                }),
                cause: arfs::table::ExtCause::Op,
            }))
        };
        let mut s = Steer::new(0, 64, false);
        s.set_mask(0b11);
        add(&mut s, 7, key(1000, 80), 0);
        let q = |s: &mut Steer, sport| s.decide(&udp4(sport, 2000)).unwrap().q;
        s.apply(&ev(OpStatus::Ok, Some([2; INDIRECTION_LEN])));
        // Queue 2 is not enabled: round-robin over the two that are.
        for p in 0..32 {
            assert_eq!(
                q(&mut s, p),
                usize::from(Rss::new(2).queue_for_key(&key(p, 2000)))
            );
        }
        s.set_mask(0b111);
        assert!((0..32).all(|p| q(&mut s, p) == 2));
        assert_eq!(s.decide(&udp4(1000, 80)).unwrap().hit, Some(7));
        s.apply(&ev(OpStatus::BadQueue, Some([1; INDIRECTION_LEN])));
        assert!(
            (0..32).all(|p| q(&mut s, p) == 2),
            "a refused op changes nothing"
        );
        s.apply(&ev(OpStatus::Ok, None));
        for p in 0..32 {
            assert_eq!(
                q(&mut s, p),
                usize::from(Rss::new(3).queue_for_key(&key(p, 2000)))
            );
        }
    }

    /// Rules decide first, lowest location first: a queue, a drop, the
    /// default context's RSS queue plus an offset; their removal gives the
    /// frame back to the filter.
    #[test]
    fn a_rule_decides_before_the_filter() {
        use arfs::{Rule, RuleAction, RuleFlow};
        let mut s = Steer::new(0, 64, false);
        s.set_mask(0b1111);
        add(&mut s, 7, key(1000, 80), 3);
        let set = |s: &mut Steer, loc, action, dport: u16| {
            let mut r = Rule::any(loc, RuleFlow::Udp4, action);
            r.dport = dport;
            r.dport_mask = 0xffff;
            s.apply(&TableEvent::RuleSet {
                seq: 1,
                rule: r,
                prev: None,
            });
            r
        };
        let queue = set(&mut s, 9, RuleAction::Queue(1), 80);
        let d = s.decide(&udp4(1000, 80)).unwrap();
        assert_eq!((d.q, d.hit, d.rule, d.flags), (1, None, Some(9), 0));
        // Another port: the rule does not match, RSS decides.
        let d = s.decide(&udp4(1000, 81)).unwrap();
        assert_eq!((d.hit, d.rule), (None, None));
        set(&mut s, 2, RuleAction::Drop, 80);
        let d = s.decide(&udp4(1000, 80)).unwrap();
        assert_eq!((d.rule, d.flags), (Some(2), RULE_DROP));
        set(&mut s, 2, RuleAction::Context { ctx: 0, offset: 1 }, 80);
        let rss = usize::from(s.rss.queue_for_key(&key(1000, 80)));
        let d = s.decide(&udp4(1000, 80)).unwrap();
        assert_eq!((d.q, d.rule), ((rss + 1) % 4, Some(2)));
        for loc in [2, 9] {
            s.apply(&TableEvent::RuleRemoved {
                seq: None,
                rule: Rule { loc, ..queue },
                cause: arfs::table::ExtCause::Reset,
            });
        }
        let d = s.decide(&udp4(1000, 80)).unwrap();
        assert_eq!((d.q, d.hit, d.rule), (3, Some(7), None));
    }

    #[test]
    fn a_hit_takes_the_filters_queue_a_miss_rss() {
        let mut s = Steer::new(0, 64, false);
        s.set_mask(0b1111);
        let rss = Rss::new(4);
        // Empty table: RSS.
        let d = s.decide(&udp4(1000, 2000)).unwrap();
        assert_eq!(
            d,
            Decision {
                q: usize::from(rss.queue_for_key(&key(1000, 2000))),
                hit: None,
                flags: 0,
                rule: None,
            }
        );
        // A filter to a queue RSS would not pick.
        let want = (rss.queue_for_key(&key(1000, 2000)) + 1) % 4;
        add(&mut s, 7, key(1000, 2000), want);
        let d = s.decide(&udp4(1000, 2000)).unwrap();
        assert_eq!(
            d,
            Decision {
                q: usize::from(want),
                hit: Some(7),
                flags: 0,
                rule: None,
            }
        );
        // Another flow still goes by RSS.
        let d = s.decide(&udp4(1001, 2000)).unwrap();
        assert_eq!(
            (d.hit, d.q),
            (None, usize::from(rss.queue_for_key(&key(1001, 2000))))
        );
        // Deleted: RSS again.
        s.apply(&TableEvent::Deleted {
            seq: 1,
            id: 7,
            rxq: want,
            flow: key(1000, 2000),
            reason: arfs::DelReason::Expired,
            hits: 0,
        });
        assert_eq!(s.decide(&udp4(1000, 2000)).unwrap().hit, None);
    }

    #[test]
    fn management_frames_are_refused_and_garbage_goes_to_queue_0() {
        let mut s = Steer::new(0, 64, false);
        s.set_mask(0b11);
        let mut m = udp4(1, 2);
        m[12..14].copy_from_slice(&ETHERTYPE_MGMT.to_be_bytes());
        assert_eq!(s.decide(&m), None);
        assert_eq!(s.decide(&m[..14]), None);
        // Behind an 802.1ad S-tag and an 802.1Q C-tag (QinQ), or a VID-0
        // priority tag: refused all the same.
        for tags in [&[0x88a8u16, 0x8100][..], &[0x8100], &[0x88a8]] {
            let mut q = m[..12].to_vec();
            for t in tags {
                q.extend_from_slice(&t.to_be_bytes());
                q.extend_from_slice(&[0, 0]);
            }
            q.extend_from_slice(&m[12..]);
            assert_eq!(s.decide(&q), None, "{tags:x?}");
        }
        for n in 0..14 {
            let d = s.decide(&vec![0xffu8; n]).unwrap();
            assert_eq!((d.q, d.hit, d.flags), (0, None, UNPARSABLE));
        }
    }

    /// `--steer none`: every frame to the worker's own queue (queue 0 while
    /// that is not enabled), a filter for the flow steers nothing, garbage
    /// is not parsed, management frames are still refused.
    #[test]
    fn steer_none_keeps_frames_on_the_workers_queue() {
        let mut s = Steer::new(2, 64, true);
        s.set_mask(0b1111);
        add(&mut s, 7, key(1000, 5001), 3);
        let own = Decision {
            q: 2,
            hit: None,
            flags: 0,
            rule: None,
        };
        assert_eq!(s.decide(&udp4(1000, 5001)), Some(own));
        assert_eq!(s.decide(&udp4(1001, 5001)), Some(own));
        assert_eq!(s.decide(&[0u8; 20]), Some(own));
        let mut m = udp4(1000, 5001);
        m[12..14].copy_from_slice(&ETHERTYPE_MGMT.to_be_bytes());
        assert_eq!(s.decide(&m), None);
        s.set_mask(0b11);
        assert_eq!(s.decide(&udp4(1000, 5001)).map(|d| d.q), Some(0));
    }

    #[test]
    fn rss_follows_the_enabled_pairs() {
        let mut s = Steer::new(0, 64, false);
        for (mask, n) in [(0b1u32, 1u16), (0b11, 2), (0b111, 3), (0b1111, 4)] {
            s.set_mask(mask);
            let rss = Rss::new(n);
            for sport in 1000..1100 {
                let d = s.decide(&udp4(sport, 2000)).unwrap();
                assert_eq!(d.q, usize::from(rss.queue_for_key(&key(sport, 2000))));
                assert!(d.q < usize::from(n));
            }
        }
    }

    /// Each fault is drawn for filter hits only, at its rate (within 5
    /// sigma over 20,000 draws), and a misroute goes to the next enabled
    /// queue.
    #[test]
    fn faults_hit_filter_hits_only_at_their_rate() {
        let rate = |p: f64| (p * f64::from(1u32 << 31) * 2.0) as u64;
        for (i, flag) in [
            MISROUTED,
            FAULT_DROP,
            FAULT_CORRUPT,
            FAULT_BAD_CSUM,
            FAULT_TRUNCATE,
            FAULT_REORDER,
        ]
        .into_iter()
        .enumerate()
        {
            let mut s = Steer::new(3, 64, false);
            s.set_mask(0b1111);
            add(&mut s, 1, key(1000, 2000), 2);
            let mut f = [0; 6];
            f[i] = rate(0.25);
            s.set_faults(f);
            let n = 20_000;
            let mut hit = 0;
            for _ in 0..n {
                let d = s.decide(&udp4(1000, 2000)).unwrap();
                assert_eq!(d.hit, Some(1));
                assert_eq!(d.flags & !flag, 0);
                if d.flags & flag != 0 {
                    hit += 1;
                    if flag == MISROUTED {
                        assert_eq!(d.q, 3);
                    }
                } else {
                    assert_eq!(d.q, 2);
                }
                // A miss never draws.
                assert_eq!(s.decide(&udp4(1001, 2000)).unwrap().flags, 0);
            }
            let sigma = (f64::from(n) * 0.25 * 0.75).sqrt();
            assert!(
                (f64::from(hit) - f64::from(n) * 0.25).abs() < 5.0 * sigma,
                "{flag}: {hit}"
            );
        }
        // One enabled queue: a misroute has nowhere to go.
        let mut s = Steer::new(0, 64, false);
        s.set_mask(0b1);
        add(&mut s, 1, key(1000, 2000), 0);
        s.set_faults([rate(1.0) - 1, 0, 0, 0, 0, 0]);
        assert_eq!(
            s.decide(&udp4(1000, 2000)).unwrap(),
            Decision {
                q: 0,
                hit: Some(1),
                flags: 0,
                rule: None,
            }
        );
    }

    /// `delay_effect_ms`: a filter added (or re-steered) under the delay
    /// is hit, yet its frames go where they went before (RSS's queue, the
    /// replaced entry's) until the delay is over, flagged [`DELAYED`]; a
    /// filter applied with the knob at 0 takes effect at once, and turning
    /// the knob off ends every delay.
    #[test]
    fn delay_effect_keeps_the_old_queue_for_its_time() {
        const MS: u64 = 1_000_000;
        let rss = Rss::new(4);
        let flow = key(1000, 2000);
        let rss_q = rss.queue_for_key(&flow);
        let (qa, qb) = ((rss_q + 1) % 4, (rss_q + 2) % 4);
        let mut s = Steer::new(0, 64, false);
        s.set_mask(0b1111);
        s.set_delay(300 * MS, 1000 * MS);
        add(&mut s, 7, flow, qa);
        let at = |s: &mut Steer, t: u64| {
            s.set_delay(300 * MS, t * MS);
            let d = s.decide(&udp4(1000, 2000)).unwrap();
            (d.q, d.hit, d.flags)
        };
        assert_eq!(at(&mut s, 1000), (usize::from(rss_q), Some(7), DELAYED));
        assert_eq!(at(&mut s, 1299), (usize::from(rss_q), Some(7), DELAYED));
        assert_eq!(at(&mut s, 1300), (usize::from(qa), Some(7), 0));
        // A re-steer of the same flow keeps the old filter's queue.
        s.apply(&TableEvent::Replaced {
            seq: 1,
            id: 7,
            rxq: qb,
            flow,
            prev_id: 7,
            prev_rxq: qa,
            prev_flow: flow,
            prev_hits: 5,
        });
        assert_eq!(at(&mut s, 1400), (usize::from(qa), Some(7), DELAYED));
        assert_eq!(at(&mut s, 1700), (usize::from(qb), Some(7), 0));
        // Other flows are not touched; the knob at 0 ends the delay.
        add(&mut s, 8, key(1001, 2000), qa);
        assert_eq!(s.decide(&udp4(1001, 2000)).unwrap().flags, DELAYED);
        s.set_delay(0, 1701 * MS);
        assert_eq!(s.decide(&udp4(1001, 2000)).unwrap().flags, 0);
        add(&mut s, 9, key(1002, 2000), qa);
        assert_eq!(
            s.decide(&udp4(1002, 2000)).unwrap(),
            Decision {
                q: usize::from(qa),
                hit: Some(9),
                flags: 0,
                rule: None,
            }
        );
    }

    /// A TCP segment (20-byte header plus options `opt`, `len` payload
    /// bytes) in an Ethernet frame, with a valid checksum.
    fn tcp_frame(v6: bool, opt: usize, len: usize) -> Vec<u8> {
        let (l4, et) = if v6 { (54, ETH_P_IPV6) } else { (34, ETH_P_IP) };
        let seg = 20 + opt + len;
        let mut f = vec![0u8; l4 + seg];
        f[12..14].copy_from_slice(&et.to_be_bytes());
        if v6 {
            f[14] = 0x60;
            f[18..20].copy_from_slice(&(seg as u16).to_be_bytes());
            f[20] = 6;
            f[22..38].copy_from_slice(&[0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            f[38..54].copy_from_slice(&[0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x15]);
        } else {
            f[14] = 0x45;
            f[16..18].copy_from_slice(&((20 + seg) as u16).to_be_bytes());
            f[23] = 6;
            f[26..30].copy_from_slice(&[10, 0, 2, 1]);
            f[30..34].copy_from_slice(&[10, 0, 2, 15]);
        }
        f[l4 + 12] = (((20 + opt) / 4) as u8) << 4;
        for (k, b) in f[l4 + 20..].iter_mut().enumerate() {
            *b = (k as u8).wrapping_mul(7).wrapping_add(3);
        }
        let c = !tcp_sum(&f);
        f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        assert!(tcp_ok(&f));
        f
    }

    /// Ones' complement sum of a frame's TCP segment with its pseudo-header.
    fn tcp_sum(f: &[u8]) -> u16 {
        let l4 = if f[12..14] == ETH_P_IPV6.to_be_bytes() {
            54
        } else {
            34
        };
        let seg = &f[l4..];
        let mut pseudo = Vec::new();
        if l4 == 54 {
            pseudo.extend_from_slice(&f[22..54]);
            pseudo.extend_from_slice(&(seg.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 6]);
        } else {
            pseudo.extend_from_slice(&f[26..34]);
            pseudo.extend_from_slice(&[0, 6]);
            pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
        }
        !checksum(&[&pseudo, seg], 0)
    }

    fn tcp_ok(f: &[u8]) -> bool {
        tcp_sum(f) == 0xffff
    }

    /// The corrupt fault on TCP (tcp-tap's byte-stream check): the last
    /// payload byte flips, the checksum still verifies with `keep_csum`
    /// and no longer does without; a segment without payload is left alone.
    #[test]
    fn corrupt_keeps_a_tcp_segment_checksum_valid() {
        for v6 in [false, true] {
            for (opt, len) in [(0, 1), (0, 128), (12, 128), (12, 1447), (40, 3)] {
                let f = tcp_frame(v6, opt, len);
                let (_, doff, p) = tcp_payload(&f).unwrap();
                assert_eq!((doff, p.len()), (20 + opt, len));
                let mut bad = f.clone();
                assert!(corrupt_payload(&mut bad, false));
                assert!(!tcp_ok(&bad), "v6 {v6} opt {opt} len {len}: stale checksum");
                let mut g = f.clone();
                assert!(corrupt_payload(&mut g, true));
                assert!(tcp_ok(&g), "v6 {v6} opt {opt} len {len}: corrupted");
                let l4 = if v6 { 54 } else { 34 };
                let diff: Vec<usize> = (0..f.len()).filter(|&i| g[i] != f[i]).collect();
                assert_eq!(diff.last(), Some(&(f.len() - 1)), "{diff:?}");
                assert!(diff[..diff.len() - 1]
                    .iter()
                    .all(|&i| i == l4 + 16 || i == l4 + 17));
            }
            let mut ack = tcp_frame(v6, 12, 0);
            let before = ack.clone();
            assert!(!corrupt_payload(&mut ack, true));
            assert_eq!(ack, before);
        }
    }

    /// The truncate fault: 16 payload bytes fewer, every length and
    /// checksum consistent (UDP over IPv4 and IPv6, TCP), the bytes before
    /// the cut untouched; a payload of 16 bytes or less is left alone.
    #[test]
    fn truncate_keeps_lengths_and_checksums_consistent() {
        use crate::frame::udp_checksum_ok;
        // UDP, IPv4 and IPv6.
        for v6 in [false, true] {
            let (l4, et) = if v6 { (54, ETH_P_IPV6) } else { (34, ETH_P_IP) };
            for len in [0usize, 16, 17, 86, 1400] {
                let mut frame = vec![0u8; l4 + 8 + len];
                frame[12..14].copy_from_slice(&et.to_be_bytes());
                let ulen = (8 + len) as u16;
                let mut pseudo = Vec::new();
                if v6 {
                    frame[14] = 0x60;
                    frame[18..20].copy_from_slice(&ulen.to_be_bytes());
                    frame[20] = 17;
                    frame[22] = 0xfd;
                    frame[53] = 0x15;
                    pseudo.extend_from_slice(&frame[22..54]);
                    pseudo.extend_from_slice(&u32::from(ulen).to_be_bytes());
                    pseudo.extend_from_slice(&[0, 0, 0, 17]);
                } else {
                    frame[14] = 0x45;
                    frame[16..18].copy_from_slice(&(ulen + 20).to_be_bytes());
                    frame[23] = 17;
                    frame[26..34].copy_from_slice(&[10, 0, 2, 1, 10, 0, 2, 15]);
                    pseudo.extend_from_slice(&frame[26..34]);
                    pseudo.extend_from_slice(&[0, 17]);
                    pseudo.extend_from_slice(&ulen.to_be_bytes());
                }
                frame[l4 + 4..l4 + 6].copy_from_slice(&ulen.to_be_bytes());
                for (k, b) in frame[l4 + 8..].iter_mut().enumerate() {
                    *b = k as u8;
                }
                let sum = match checksum(&[&pseudo, &frame[l4..]], 0) {
                    0 => 0xffff,
                    c => c,
                };
                frame[l4 + 6..l4 + 8].copy_from_slice(&sum.to_be_bytes());
                assert!(udp_checksum_ok(&frame));
                let before = frame.clone();
                let r = truncate_payload(&mut frame);
                if len <= TRUNCATE_BYTES {
                    assert_eq!(r, None);
                    assert_eq!(frame, before);
                    continue;
                }
                let end = r.unwrap();
                assert_eq!(end, before.len() - TRUNCATE_BYTES);
                let cut = &frame[..end];
                assert!(udp_checksum_ok(cut), "v6 {v6} len {len}");
                let (_, p) = udp_payload(cut).unwrap();
                assert_eq!(p, &before[l4 + 8..end], "the bytes before the cut");
                if !v6 {
                    assert_eq!(checksum(&[&cut[14..34]], 0), 0, "IPv4 header checksum");
                }
            }
        }
        for v6 in [false, true] {
            for (opt, len) in [(0, 16), (0, 17), (12, 128), (12, 1447)] {
                let f = tcp_frame(v6, opt, len);
                let mut g = f.clone();
                match truncate_payload(&mut g) {
                    None => assert!(len <= TRUNCATE_BYTES),
                    Some(end) => {
                        g.truncate(end);
                        assert!(tcp_ok(&g), "v6 {v6} opt {opt} len {len}");
                        let (_, _, p) = tcp_payload(&g).unwrap();
                        assert_eq!(p.len(), len - TRUNCATE_BYTES);
                        if !v6 {
                            assert_eq!(checksum(&[&g[14..34]], 0), 0);
                        }
                    }
                }
            }
        }
        // Garbage never panics.
        for n in 0..80 {
            let _ = truncate_payload(&mut vec![0x45u8; n]);
        }
    }
}
