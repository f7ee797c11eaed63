//! Guest topologies: how many vCPUs, how many queue pairs the device
//! offers, how many the guest uses, and which rx queue is local to which
//! CPU. The suite's predictions (RSS over the pairs in use, the queue a
//! filter must name for a receiver's CPU) come from here, and `link`
//! checks them against what the booted guest reports.

use crate::harness::Result;
use crate::{bail, ensure};

/// One topology of the matrix: `queues` pairs offered by vnic (and QEMU's
/// `-netdev vhost-user,queues=`), `cpus` vCPUs, and optionally the pairs
/// the suite sets with `ethtool -L` after boot (`channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    pub queues: u16,
    pub cpus: u16,
    pub channels: Option<u16>,
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            queues: 4,
            cpus: 4,
            channels: None,
        }
    }
}

/// Most vCPUs or queue pairs the suite boots (QEMU under TCG on a small
/// host; the receivers pin one thread per CPU).
pub const MAX: u16 = 16;

impl Topology {
    /// `QxC` (queue pairs x vCPUs), optionally `QxC/chN` (`ethtool -L
    /// combined N` after boot).
    pub fn parse(s: &str) -> Result<Self> {
        let (shape, ch) = match s.split_once("/ch") {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let Some((q, c)) = shape.split_once('x') else {
            bail!("topology {s:?}: expected QUEUESxCPUS like 2x4 (optionally /chN)");
        };
        let num = |v: &str, what: &str| -> Result<u16> {
            match v.parse::<u16>() {
                Ok(n) if (1..=MAX).contains(&n) => Ok(n),
                _ => bail!("topology {s:?}: {what} must be 1..={MAX}, got {v:?}"),
            }
        };
        let t = Topology {
            queues: num(q, "queue pairs")?,
            cpus: num(c, "vCPUs")?,
            channels: ch.map(|v| num(v, "channels")).transpose()?,
        };
        t.validate()?;
        Ok(t)
    }

    pub fn validate(&self) -> Result<()> {
        ensure!(
            (1..=MAX).contains(&self.queues) && (1..=MAX).contains(&self.cpus),
            "{self}: queue pairs and vCPUs must be 1..={MAX}"
        );
        if let Some(ch) = self.channels {
            ensure!(
                (1..=self.queues).contains(&ch),
                "{self}: --channels {ch} is more than the {} queue pairs the device offers",
                self.queues
            );
        }
        Ok(())
    }

    /// The queue pairs the guest uses: `ethtool -L` if the suite sets it,
    /// else virtio_net's default, min(pairs offered, online CPUs).
    pub fn pairs(&self) -> u16 {
        self.channels.unwrap_or(self.queues.min(self.cpus))
    }

    /// Whether this is the topology every scenario was written for (and
    /// the one the tap and debug boots use).
    pub fn is_default(&self) -> bool {
        *self == Topology::default()
    }

    /// Which rx queue is local to each CPU when `pairs` pairs are in use
    /// on `cpus` CPUs: virtio_net's virtnet_set_affinity() gives queue i a
    /// group of `stride = max(cpus / pairs, 1)` consecutive CPUs, one more
    /// for the first `cpus % pairs` queues when there are at least as many
    /// CPUs as queues, wrapping; the rx_cpu_rmap is updated queue by queue,
    /// so a CPU in several groups ends up with the last one.
    pub fn cpu_queue_map(pairs: u16, cpus: u16) -> Vec<usize> {
        let (nq, ncpu) = (usize::from(pairs.max(1)), usize::from(cpus.max(1)));
        let stride = (ncpu / nq).max(1);
        let stragglers = if ncpu >= nq { ncpu % nq } else { 0 };
        let mut map = vec![0; ncpu];
        let mut cpu = 0;
        for q in 0..nq {
            for _ in 0..stride + usize::from(q < stragglers) {
                map[cpu] = q;
                cpu = (cpu + 1) % ncpu;
            }
        }
        map
    }
}

/// The address family of the steering workload's flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    #[default]
    Ipv4,
    Ipv6,
    /// Even flows IPv4, odd flows IPv6, in one workload.
    Mixed,
}

impl Family {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "ipv4" | "v4" => Family::Ipv4,
            "ipv6" | "v6" => Family::Ipv6,
            "mixed" => Family::Mixed,
            _ => bail!("family {s:?}: expected ipv4, ipv6 or mixed"),
        })
    }

    /// Whether flow `i` of a workload is IPv6.
    pub fn v6(self, i: usize) -> bool {
        match self {
            Family::Ipv4 => false,
            Family::Ipv6 => true,
            Family::Mixed => i % 2 == 1,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
            Family::Mixed => "mixed",
        })
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.queues, self.cpus)?;
        if let Some(ch) = self.channels {
            write!(f, "/ch{ch}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Family, Topology};

    #[test]
    fn families() {
        assert_eq!(Family::parse("ipv6").unwrap(), Family::Ipv6);
        assert_eq!(Family::parse("mixed").unwrap().to_string(), "mixed");
        assert!(Family::parse("ipx").is_err());
        let m = Family::Mixed;
        assert_eq!(
            (0..4).map(|i| m.v6(i)).collect::<Vec<_>>(),
            [false, true, false, true]
        );
        assert!(!Family::Ipv4.v6(1) && Family::Ipv6.v6(0));
    }

    #[test]
    fn parse_and_print() {
        let t = Topology::parse("2x4").unwrap();
        assert_eq!((t.queues, t.cpus, t.channels), (2, 4, None));
        assert_eq!(t.to_string(), "2x4");
        let t = Topology::parse("4x2/ch4").unwrap();
        assert_eq!((t.queues, t.cpus, t.channels), (4, 2, Some(4)));
        assert_eq!(t.to_string(), "4x2/ch4");
        assert!(Topology::default().is_default());
        for bad in ["4", "0x2", "2x0", "2x17", "x", "4x4/ch5", "4x4/ch0", "ax4"] {
            assert!(Topology::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn pairs_follow_virtio_net_default() {
        let p = |s: &str| Topology::parse(s).unwrap().pairs();
        assert_eq!(p("4x4"), 4);
        assert_eq!(p("2x4"), 2);
        assert_eq!(p("4x2"), 2, "virtio_net uses min(pairs, online CPUs)");
        assert_eq!(p("4x2/ch4"), 4);
        assert_eq!(p("1x2"), 1);
    }

    #[test]
    fn cpu_queue_map_spreads_like_virtnet_set_affinity() {
        let m = Topology::cpu_queue_map;
        assert_eq!(m(4, 4), [0, 1, 2, 3]);
        assert_eq!(m(2, 4), [0, 0, 1, 1]);
        assert_eq!(m(3, 4), [0, 0, 1, 2], "the first queue takes the straggler");
        assert_eq!(m(2, 2), [0, 1]);
        assert_eq!(m(1, 2), [0, 0]);
        // More queues than CPUs: groups of one, wrapping; the later queue wins.
        assert_eq!(m(4, 2), [2, 3]);
        assert_eq!(m(3, 2), [2, 1]);
    }
}
