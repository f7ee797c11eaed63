//! The guest scenarios of the suite: the issue-4 ones (link, steer,
//! migrate, expiry: `basic.rs`), the faults and stress groups, and the
//! experiment workloads.
//!
//! One [`Session`] (`session.rs`) is one booted guest (one kernel).
//! Scenarios run in canonical order in the same boot; each makes sure its
//! prerequisites hold, so any subset can be selected.

use std::net::Ipv4Addr;

/// The gen peer and the guest, as vnic's gen defaults them (vnic/CTL.md).
pub const GEN_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
pub const GUEST_PREFIX: u8 = 24;
pub const IFNAME: &str = "eth0";
/// All flows come from this gen port; flow i goes to guest port BASE_PORT + i.
pub const GEN_PORT: u16 = 10000;
pub const BASE_PORT: u16 = 20000;

/// The issue-4 scenarios, in their canonical order.
pub const BASIC: [&str; 4] = ["link", "steer", "migrate", "expiry"];

mod basic;
pub mod experiments;
mod faults;
mod session;
mod stress;
mod workload;

use session::Checks;
pub use session::{report_line, Outcome, Session, Settings, Tools};
pub use workload::{table_summary, Flow, Window};

/// Every scenario the default boot of a kernel can run, in canonical order.
pub fn all() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = BASIC.to_vec();
    v.extend_from_slice(faults::NAMES);
    v.extend_from_slice(stress::NAMES);
    v.extend_from_slice(experiments::NAMES);
    v
}

/// What a scenario needs booted. Scenarios of one kind share a boot; the
/// suite boots each kernel once per kind it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BootKind {
    /// The default kernel variant on vnic's gen peer.
    Default,
    /// vnic's tap peer, the tap in a host network namespace (stress::TapNet).
    Tap,
    /// The debug kernel variant (KASAN, lockdep, kmemleak) on the gen peer.
    Debug,
}

impl BootKind {
    /// The `images/build-kernel --variant` it boots.
    pub fn variant(self) -> &'static str {
        match self {
            BootKind::Default | BootKind::Tap => "default",
            BootKind::Debug => "debug",
        }
    }

    /// Appended to the kernel label in reports and artifact directories.
    pub fn suffix(self) -> &'static str {
        match self {
            BootKind::Default => "",
            BootKind::Tap => "-tap",
            BootKind::Debug => "-debug",
        }
    }
}

/// The boot scenario `name` runs in.
pub fn boot_kind(name: &str) -> BootKind {
    stress::boot_kind(name).unwrap_or(BootKind::Default)
}
