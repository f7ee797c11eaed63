//! The masked rule stage ahead of the exact-match filters: what `ethtool -N`
//! programs through a driver's `set_rxnfc` (the kernel's
//! `struct ethtool_rx_flow_spec`), in the device's own terms.
//!
//! A [`Rule`] matches TCP or UDP over IPv4 or IPv6 (flow types `tcp4`,
//! `udp4`, `tcp6`, `udp6`: addresses and ports, each under a mask) or any
//! IP packet of one family (`ip4`, `ip6`: addresses and the upper-layer
//! protocol under masks). A mask bit set means the packet's bit must equal
//! the rule's (the kernel API's `m_u`; ethtool's command line inverts its
//! own `m` option into it); a field whose mask is zero matches anything.
//! Its action sends the packet to an rx queue, drops it, or hands it to an
//! RSS context with a queue offset.
//!
//! [`RuleSet`] holds the rules by location (0 .. capacity, as the ethtool
//! API numbers them): the lowest location that matches decides, before any
//! aRFS filter or RSS is consulted (mlx5 and ice put their ethtool rules
//! ahead of aRFS the same way). It counts the packets each rule decided.
//! Lookup walks the rules in order with no allocation: a device's rule
//! TCAM is small (CAPS `max_rules` says how small; vnic's default is 128
//! locations), the filters' table is where O(1) matters.

use serde::{Deserialize, Serialize};

use crate::flow::{FlowKey, IpFamily, IpPair, L4Proto};

/// A rule's flow type (the ethtool API's `flow_type` without its flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleFlow {
    /// `tcp4`: TCP over IPv4.
    Tcp4 = 1,
    /// `udp4`: UDP over IPv4.
    Udp4 = 2,
    /// `ip4`: any IPv4 packet (the `l4_proto` field selects one).
    Ip4 = 3,
    /// `tcp6`: TCP over IPv6.
    Tcp6 = 4,
    /// `udp6`: UDP over IPv6.
    Udp6 = 5,
    /// `ip6`: any IPv6 packet.
    Ip6 = 6,
}

impl RuleFlow {
    /// Wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a wire code (1..=6).
    pub const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::Tcp4,
            2 => Self::Udp4,
            3 => Self::Ip4,
            4 => Self::Tcp6,
            5 => Self::Udp6,
            6 => Self::Ip6,
            _ => return None,
        })
    }

    /// ethtool's name for it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Tcp4 => "tcp4",
            Self::Udp4 => "udp4",
            Self::Ip4 => "ip4",
            Self::Tcp6 => "tcp6",
            Self::Udp6 => "udp6",
            Self::Ip6 => "ip6",
        }
    }

    /// The address family it matches.
    pub const fn family(self) -> IpFamily {
        match self {
            Self::Tcp4 | Self::Udp4 | Self::Ip4 => IpFamily::Ipv4,
            Self::Tcp6 | Self::Udp6 | Self::Ip6 => IpFamily::Ipv6,
        }
    }

    /// The transport it requires (None: `ip4`/`ip6`, any).
    pub const fn l4(self) -> Option<L4Proto> {
        match self {
            Self::Tcp4 | Self::Tcp6 => Some(L4Proto::Tcp),
            Self::Udp4 | Self::Udp6 => Some(L4Proto::Udp),
            Self::Ip4 | Self::Ip6 => None,
        }
    }
}

/// What a rule does with the packets it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    /// To this rx queue.
    Queue(u16),
    /// Dropped (the ethtool API's `RX_CLS_FLOW_DISC`, `action -1`).
    Drop,
    /// To RSS context `ctx`, whose queues start at `offset` (`context N`
    /// with `action` as the offset).
    Context {
        /// The context (0: the device's default RSS).
        ctx: u32,
        /// Added to the queue the context's RSS picks.
        offset: u16,
    },
}

/// One rule. IPv4 addresses and their masks take the first 4 bytes of the
/// 16 (the rest zero), as in [`FlowKey`]'s wire encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rule {
    /// Its location: the lower one decides first.
    pub loc: u32,
    /// The flow type.
    pub flow: RuleFlow,
    /// Source address.
    pub src: [u8; 16],
    /// Its mask (a bit set: must equal `src`'s).
    pub src_mask: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// Its mask.
    pub dst_mask: [u8; 16],
    /// Source port (`tcp*`/`udp*` only).
    pub sport: u16,
    /// Its mask.
    pub sport_mask: u16,
    /// Destination port (`tcp*`/`udp*` only).
    pub dport: u16,
    /// Its mask.
    pub dport_mask: u16,
    /// The upper-layer protocol (`ip4`/`ip6` only).
    pub l4_proto: u8,
    /// Its mask.
    pub l4_mask: u8,
    /// What it does.
    pub action: RuleAction,
}

/// Why a rule cannot be installed, or a location not removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleError {
    /// The location is at or past the capacity.
    BadLocation,
    /// Every location below the capacity holds a rule (an insert at a free
    /// one cannot happen then; kept for a device with fewer slots than
    /// locations).
    Full,
    /// A mask on a field its flow type does not have (ports of `ip4`, a
    /// protocol of `tcp4`), or IPv4 address bytes past the fourth.
    BadKey,
    /// The action's queue is not an enabled rx queue.
    BadQueue,
    /// `remove` of a location that holds no rule.
    NoRule,
}

/// What a packet offers a rule: its family, upper-layer protocol,
/// addresses and (TCP/UDP, not a fragment) ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleInput {
    family: IpFamily,
    proto: u8,
    src: [u8; 16],
    dst: [u8; 16],
    ports: Option<(u16, u16)>,
}

impl RuleInput {
    /// A TCP/UDP flow's packet.
    pub fn of_flow(k: &FlowKey) -> Self {
        Self {
            family: k.family(),
            proto: k.proto().ip_proto(),
            src: k.src_bytes(),
            dst: k.dst_bytes(),
            ports: Some((k.src_port(), k.dst_port())),
        }
    }

    /// An IP packet without usable ports (another protocol, a fragment).
    pub fn of_ip(p: &IpPair) -> Self {
        Self {
            family: p.family(),
            proto: p.proto(),
            src: *p.src_bytes(),
            dst: *p.dst_bytes(),
            ports: None,
        }
    }
}

fn masked_eq(a: &[u8; 16], b: &[u8; 16], m: &[u8; 16]) -> bool {
    let (a, b, m) = (
        u128::from_ne_bytes(*a),
        u128::from_ne_bytes(*b),
        u128::from_ne_bytes(*m),
    );
    (a ^ b) & m == 0
}

impl Rule {
    /// A rule of `flow` at `loc` that matches every packet of its type and
    /// sends it to `rxq`; narrow it with the fields.
    pub const fn any(loc: u32, flow: RuleFlow, action: RuleAction) -> Self {
        Self {
            loc,
            flow,
            src: [0; 16],
            src_mask: [0; 16],
            dst: [0; 16],
            dst_mask: [0; 16],
            sport: 0,
            sport_mask: 0,
            dport: 0,
            dport_mask: 0,
            l4_proto: 0,
            l4_mask: 0,
            action,
        }
    }

    /// Whether its fields fit its flow type: no port mask on `ip4`/`ip6`,
    /// no protocol mask on `tcp*`/`udp*`, no IPv4 address or mask bytes
    /// past the fourth.
    pub fn check(&self) -> Result<(), RuleError> {
        let ports = self.sport_mask != 0 || self.dport_mask != 0;
        if (self.flow.l4().is_none() && ports) || (self.flow.l4().is_some() && self.l4_mask != 0) {
            return Err(RuleError::BadKey);
        }
        if self.flow.family() == IpFamily::Ipv4 {
            let tail = |a: &[u8; 16]| a[4..].iter().any(|&b| b != 0);
            if tail(&self.src) || tail(&self.src_mask) || tail(&self.dst) || tail(&self.dst_mask) {
                return Err(RuleError::BadKey);
            }
        }
        Ok(())
    }

    /// Whether the packet `p` matches it.
    #[inline]
    pub fn matches(&self, p: &RuleInput) -> bool {
        if p.family != self.flow.family() {
            return false;
        }
        match self.flow.l4() {
            Some(l4) => {
                let Some((sp, dp)) = p.ports else {
                    return false;
                };
                if p.proto != l4.ip_proto()
                    || (sp ^ self.sport) & self.sport_mask != 0
                    || (dp ^ self.dport) & self.dport_mask != 0
                {
                    return false;
                }
            }
            None => {
                if (p.proto ^ self.l4_proto) & self.l4_mask != 0 {
                    return false;
                }
            }
        }
        masked_eq(&p.src, &self.src, &self.src_mask) && masked_eq(&p.dst, &self.dst, &self.dst_mask)
    }
}

/// The rules by location, with the packets each decided (see the
/// module's doc).
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    /// Sorted by location, no two alike.
    rules: Vec<(Rule, u64)>,
    capacity: u32,
}

impl RuleSet {
    /// An empty set of `capacity` locations.
    pub fn new(capacity: u32) -> Self {
        Self {
            rules: Vec::new(),
            capacity,
        }
    }

    /// Locations (0 .. capacity).
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Rules installed.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether no rule is installed.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Installs `rule` at its location after [`Rule::check`]; returns the
    /// rule it replaced there, with its hits. `queues`: the enabled rx
    /// queues (a queue action, or a context's offset, must be below it).
    pub fn insert(&mut self, rule: Rule, queues: u16) -> Result<Option<(Rule, u64)>, RuleError> {
        if rule.loc >= self.capacity {
            return Err(RuleError::BadLocation);
        }
        rule.check()?;
        match rule.action {
            RuleAction::Queue(q) | RuleAction::Context { offset: q, .. } if q >= queues => {
                return Err(RuleError::BadQueue);
            }
            _ => {}
        }
        match self.rules.binary_search_by_key(&rule.loc, |(r, _)| r.loc) {
            Ok(i) => Ok(Some(core::mem::replace(&mut self.rules[i], (rule, 0)))),
            Err(i) => {
                if self.rules.len() >= self.capacity as usize {
                    return Err(RuleError::Full);
                }
                self.rules.insert(i, (rule, 0));
                Ok(None)
            }
        }
    }

    /// Installs `rule` at its location unchecked (a replica following a
    /// table that checked it), replacing what was there; its hits start
    /// at 0.
    pub fn put(&mut self, rule: Rule) {
        match self.rules.binary_search_by_key(&rule.loc, |(r, _)| r.loc) {
            Ok(i) => self.rules[i] = (rule, 0),
            Err(i) => self.rules.insert(i, (rule, 0)),
        }
    }

    /// Removes the rule at `loc`; returns it with its hits.
    pub fn remove(&mut self, loc: u32) -> Result<(Rule, u64), RuleError> {
        if loc >= self.capacity {
            return Err(RuleError::BadLocation);
        }
        match self.rules.binary_search_by_key(&loc, |(r, _)| r.loc) {
            Ok(i) => Ok(self.rules.remove(i)),
            Err(_) => Err(RuleError::NoRule),
        }
    }

    /// Removes every rule; returns them with their hits, by location.
    pub fn clear(&mut self) -> Vec<(Rule, u64)> {
        core::mem::take(&mut self.rules)
    }

    /// The rule at `loc` and its hits.
    pub fn get(&self, loc: u32) -> Option<&(Rule, u64)> {
        self.rules
            .binary_search_by_key(&loc, |(r, _)| r.loc)
            .ok()
            .map(|i| &self.rules[i])
    }

    /// The rules and their hits, by location.
    pub fn iter(&self) -> impl Iterator<Item = &(Rule, u64)> {
        self.rules.iter()
    }

    /// The rule that decides packet `p` (the lowest location that matches)
    /// and counts the hit on it; None: no rule matches.
    #[inline]
    pub fn lookup(&mut self, p: &RuleInput) -> Option<(u32, RuleAction)> {
        let (r, hits) = self.rules.iter_mut().find(|(r, _)| r.matches(p))?;
        *hits += 1;
        Some((r.loc, r.action))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn udp4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> RuleInput {
        RuleInput::of_flow(&FlowKey::v4(
            L4Proto::Udp,
            Ipv4Addr::from(src),
            sport,
            Ipv4Addr::from(dst),
            dport,
        ))
    }

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut b = [0; 16];
        b[..4].copy_from_slice(&a);
        b
    }

    #[test]
    fn masks_select_bits_and_types_select_packets() {
        let mut r = Rule::any(0, RuleFlow::Udp4, RuleAction::Queue(2));
        r.dst = v4([192, 0, 2, 0]);
        r.dst_mask = v4([255, 255, 255, 0]);
        r.dport = 4000;
        r.dport_mask = 0xffff;
        assert!(r.matches(&udp4([10, 0, 0, 1], 1, [192, 0, 2, 77], 4000)));
        assert!(!r.matches(&udp4([10, 0, 0, 1], 1, [192, 0, 3, 77], 4000)));
        assert!(!r.matches(&udp4([10, 0, 0, 1], 1, [192, 0, 2, 77], 4001)));
        // tcp4 and udp6 packets are not udp4's.
        let tcp = RuleInput::of_flow(&FlowKey::v4(
            L4Proto::Tcp,
            Ipv4Addr::new(10, 0, 0, 1),
            1,
            Ipv4Addr::new(192, 0, 2, 77),
            4000,
        ));
        assert!(!r.matches(&tcp));
        let v6 = RuleInput::of_flow(&FlowKey::v6(
            L4Proto::Udp,
            Ipv6Addr::LOCALHOST,
            1,
            Ipv6Addr::LOCALHOST,
            4000,
        ));
        assert!(!r.matches(&v6));
        // ip4 with protocol 17 takes UDP and nothing else of the family.
        let mut ip = Rule::any(1, RuleFlow::Ip4, RuleAction::Drop);
        ip.l4_proto = 17;
        ip.l4_mask = 0xff;
        assert!(ip.matches(&udp4([1, 1, 1, 1], 1, [2, 2, 2, 2], 2)));
        assert!(!ip.matches(&tcp));
        assert!(!ip.matches(&v6));
    }

    #[test]
    fn fields_must_fit_the_flow_type() {
        let mut r = Rule::any(0, RuleFlow::Ip6, RuleAction::Queue(0));
        r.dport_mask = 1;
        assert_eq!(r.check(), Err(RuleError::BadKey));
        let mut r = Rule::any(0, RuleFlow::Tcp4, RuleAction::Queue(0));
        r.l4_mask = 0xff;
        assert_eq!(r.check(), Err(RuleError::BadKey));
        let mut r = Rule::any(0, RuleFlow::Tcp4, RuleAction::Queue(0));
        r.src_mask[4] = 1;
        assert_eq!(r.check(), Err(RuleError::BadKey));
        let mut s = RuleSet::new(4);
        assert_eq!(s.insert(r, 4), Err(RuleError::BadKey));
        assert_eq!(
            s.insert(Rule::any(4, RuleFlow::Tcp4, RuleAction::Queue(0)), 4),
            Err(RuleError::BadLocation)
        );
        assert_eq!(
            s.insert(Rule::any(0, RuleFlow::Tcp4, RuleAction::Queue(4)), 4),
            Err(RuleError::BadQueue)
        );
        assert_eq!(s.remove(3), Err(RuleError::NoRule));
        assert!(s.is_empty());
    }

    #[test]
    fn the_lowest_location_decides_and_counts() {
        let mut s = RuleSet::new(8);
        let mut narrow = Rule::any(5, RuleFlow::Udp4, RuleAction::Queue(3));
        narrow.dport = 7;
        narrow.dport_mask = 0xffff;
        let wide = Rule::any(6, RuleFlow::Udp4, RuleAction::Drop);
        assert_eq!(s.insert(wide, 4), Ok(None));
        assert_eq!(s.insert(narrow, 4), Ok(None));
        let p7 = udp4([1, 1, 1, 1], 1, [2, 2, 2, 2], 7);
        let p8 = udp4([1, 1, 1, 1], 1, [2, 2, 2, 2], 8);
        assert_eq!(s.lookup(&p7), Some((5, RuleAction::Queue(3))));
        assert_eq!(s.lookup(&p8), Some((6, RuleAction::Drop)));
        assert_eq!(s.lookup(&p8), Some((6, RuleAction::Drop)));
        // A rule at a lower location takes over; the others keep counting.
        let first = Rule::any(0, RuleFlow::Udp4, RuleAction::Queue(1));
        assert_eq!(s.insert(first, 4), Ok(None));
        assert_eq!(s.lookup(&p7), Some((0, RuleAction::Queue(1))));
        let hits: Vec<(u32, u64)> = s.iter().map(|(r, h)| (r.loc, *h)).collect();
        assert_eq!(hits, [(0, 1), (5, 1), (6, 2)]);
        // Replacing at a location returns the old rule and its hits.
        let old = s.insert(Rule::any(6, RuleFlow::Tcp4, RuleAction::Drop), 4);
        assert_eq!(old, Ok(Some((wide, 2))));
        assert_eq!(s.remove(5), Ok((narrow, 1)));
        assert_eq!(
            s.get(6).map(|(r, h)| (r.flow, *h)),
            Some((RuleFlow::Tcp4, 0))
        );
        assert_eq!(s.clear().len(), 2);
        assert_eq!(s.lookup(&p7), None);
    }

    #[test]
    fn full_means_every_location_taken() {
        let mut s = RuleSet::new(2);
        for loc in 0..2 {
            assert_eq!(
                s.insert(Rule::any(loc, RuleFlow::Ip4, RuleAction::Drop), 1),
                Ok(None)
            );
        }
        // Only replacements remain possible.
        assert!(s
            .insert(Rule::any(1, RuleFlow::Ip6, RuleAction::Drop), 1)
            .is_ok());
        assert_eq!(s.len(), 2);
    }

    proptest! {
        /// Lookup agrees with the definition: the lowest-location rule of
        /// those whose every masked bit equals the packet's.
        #[test]
        fn lookup_is_the_lowest_matching_location(
            rules in proptest::collection::vec(
                (0u32..16, any::<u8>(), any::<u8>(), any::<u16>(), any::<u16>(), any::<bool>()),
                0..12,
            ),
            src in any::<[u8; 4]>(),
            dst in any::<[u8; 4]>(),
            sport in any::<u16>(),
            dport in any::<u16>(),
        ) {
            let mut s = RuleSet::new(16);
            let mut model = std::collections::BTreeMap::<u32, Rule>::new();
            for (loc, a, m, p, pm, tcp) in rules {
                let flow = if tcp { RuleFlow::Tcp4 } else { RuleFlow::Udp4 };
                let mut r = Rule::any(loc, flow, RuleAction::Queue((loc % 4) as u16));
                r.dst = v4([a, 0, 0, 0]);
                r.dst_mask = v4([m, 0, 0, 0]);
                r.dport = p;
                r.dport_mask = pm;
                s.insert(r, 4).unwrap();
                model.insert(loc, r);
            }
            let p = udp4(src, sport, dst, dport);
            let want = model.values().find(|r| {
                r.flow == RuleFlow::Udp4
                    && (dst[0] ^ r.dst[0]) & r.dst_mask[0] == 0
                    && (dport ^ r.dport) & r.dport_mask == 0
            });
            prop_assert_eq!(s.lookup(&p), want.map(|r| (r.loc, r.action)));
        }
    }
}
