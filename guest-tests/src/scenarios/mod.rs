//! The guest scenarios of the suite, all in one table ([`SCENARIOS`]): the
//! issue-4 ones (link, steer, migrate, expiry: `basic.rs`), plain RPS on
//! one queue (`rps.rs`), the faults group (`faults/`), the stress group
//! (`stress/`), ethtool ntuple rules (`rules.rs`, `rules_faults.rs`) and
//! unequal per-queue RFS tables (`rfs_tables.rs`, the out-of-bounds slot of
//! pre-7.0 `set_rps_cpu()`). Topologies (queue
//! pairs x vCPUs) are in `topology.rs`. `experiments.rs`
//! holds the experiment workloads of `vnic-experiment`, which are not
//! scenarios of the suite; `shard.rs` cuts its collision sweep into shards
//! and merges their results.
//!
//! One [`Session`] (`session.rs`) is one booted guest (one kernel).
//! Scenarios run in canonical order in the same boot; each makes sure its
//! prerequisites hold, so any subset can be selected.
//!
//! Adding a scenario: a function `fn(&mut Session, &mut Checks) ->
//! Result<String>` (it records failed assertions in the `Checks` and
//! returns the figures of its report line) and one line in [`SCENARIOS`]
//! (its boot, its set-up, the queue pairs it can run with, whether it runs
//! on every topology of the matrix). Predict queues with `Flow::rx_q` and
//! `Flow::needs_filter`, never by assuming rx queue = CPU.

use crate::harness::Result;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The gen peer and the guest, as vnic's gen defaults them (vnic/CTL.md).
pub const GEN_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
pub const GUEST_PREFIX: u8 = 24;
/// The gen peer's IPv6 address (vnic's `--gen-ip6` default) and the guest's.
pub const GEN_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 1);
pub const GUEST_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 0x15);
pub const GUEST_PREFIX6: u8 = 64;
pub const IFNAME: &str = "eth0";
/// All flows come from this gen port; flow i goes to guest port BASE_PORT + i.
pub const GEN_PORT: u16 = 10000;
pub const BASE_PORT: u16 = 20000;

mod basic;
mod delivery;
mod effect;
pub mod experiments;
mod faults;
mod lies;
mod order;
pub mod poke;
mod ports;
mod rfs_tables;
mod rps;
mod rules;
mod rules_faults;
mod session;
pub mod shard;
pub mod slots;
mod stress;
pub mod topology;
mod tracecheck;
mod workload;

use session::Checks;

/// One device counter of `vnic ctl stats`, read from the typed reply.
pub(crate) type Counter = fn(&vnic_ctl_proto::Stats) -> u64;

/// A filter's flow of `vnic ctl table` as the aRFS key (the protocol's
/// flow is the trace's object: aRFS reads and checks it).
pub(crate) fn flow_key(f: &vnic_ctl_proto::Flow) -> Result<arfs::FlowKey> {
    use crate::harness::Context;
    let v = serde_json::to_value(f)?;
    serde_json::from_value(v.clone()).ctx(format!("table flow {v}"))
}
pub use session::{report_line, Outcome, Session, Settings, Tools};
pub use topology::{Family, Topology};
pub use workload::{device_summary, table_summary, Flow, Window};

/// Every scenario of the suite, in canonical order (the order they run in
/// within a boot, and the order of `--list`).
#[rustfmt::skip]
pub const SCENARIOS: &[Scenario] = &[
    // issue 4 (basic.rs)
    Scenario { name: "link",              boot: BootKind::Default, setup: Setup::Shared, pairs: ANY, matrix: true , v6: true , run: basic::link },
    Scenario { name: "steer",             boot: BootKind::Default, setup: Setup::Shared, pairs: ANY, matrix: true , v6: true , run: basic::steer },
    Scenario { name: "migrate",           boot: BootKind::Default, setup: Setup::Shared, pairs: ANY, matrix: true , v6: true , run: basic::migrate },
    Scenario { name: "expiry",            boot: BootKind::Default, setup: Setup::Shared, pairs: MQ,  matrix: false, v6: true , run: basic::expiry },
    // issue 5, faults (faults/)
    Scenario { name: "table-full",        boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::table::table_full },
    Scenario { name: "bucket-collisions", boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::table::bucket_collisions },
    Scenario { name: "lossy-mgmt",        boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::device::lossy_mgmt },
    Scenario { name: "slow-hw",           boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::device::slow_hw },
    Scenario { name: "add-failures",      boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::device::add_failures },
    Scenario { name: "live-flows",        boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::expiry::live_flows },
    Scenario { name: "handshake",         boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::handshake::handshake },
    // issue 46, the module as a driver under faults (faults/driver.rs)
    Scenario { name: "rebind",            boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::driver::rebind },
    Scenario { name: "lost-ack-resteer",  boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::driver::lost_ack_resteer },
    Scenario { name: "reset-after-flush", boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::driver::reset_after_flush },
    Scenario { name: "holdoff",           boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::driver::holdoff },
    Scenario { name: "ntuple-toggle",     boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::driver::ntuple_toggle },
    Scenario { name: "spoof-mgmt",        boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::driver::spoof_mgmt },
    Scenario { name: "params",            boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: faults::driver::params },
    Scenario { name: "rps",               boot: BootKind::Default, setup: Setup::Fresh,  pairs: ONE, matrix: true , v6: false, run: rps::rps },
    Scenario { name: "misroute",          boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: true , v6: true , run: delivery::misroute },
    Scenario { name: "drop",              boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: true , v6: true , run: delivery::drop },
    Scenario { name: "corrupt",           boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: true , v6: true , run: delivery::corrupt },
    Scenario { name: "bad-csum",          boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: true , v6: true , run: delivery::bad_csum },
    Scenario { name: "truncate",          boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: true , run: delivery::truncate },
    Scenario { name: "reorder",           boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: true , run: delivery::reorder },
    // issue 48, ethtool ntuple rules with aRFS filters (rules.rs). Before the
    // lies: its trace checks replay the daemon's whole trace, and the REPLACE
    // lines wrong-trace falsifies on purpose stay in it for the boot's life.
    Scenario { name: "rules-mixed",       boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: rules::rules_mixed },
    Scenario { name: "delay-effect",      boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: true , run: lies::delay_effect },
    Scenario { name: "wrong-trace",       boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: true , run: lies::wrong_trace },
    Scenario { name: "reconfig",          boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ3, matrix: false, v6: false, run: faults::reconfig::reconfig },
    Scenario { name: "relayout",          boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ3, matrix: false, v6: false, run: faults::reconfig::relayout },
    Scenario { name: "relayout-4k",       boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ3, matrix: false, v6: false, run: faults::reconfig::relayout_4k },
    // issue 48, ethtool ntuple rules under faults (rules_faults.rs; rules-mixed is above)
    Scenario { name: "rules-faults",      boot: BootKind::Default, setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: rules_faults::rules_faults },
    // issue 5, stress (stress/)
    Scenario { name: "hostile-mgmt",      boot: BootKind::Default, setup: Setup::Shared, pairs: MQ,  matrix: false, v6: false, run: stress::hostile::hostile_mgmt },
    Scenario { name: "device-restart",    boot: BootKind::Default, setup: Setup::Shared, pairs: MQ,  matrix: false, v6: false, run: stress::device_restart },
    Scenario { name: "tcp-tap",           boot: BootKind::Tap,     setup: Setup::Shared, pairs: MQ,  matrix: false, v6: false, run: stress::tap::tcp_tap },
    Scenario { name: "spoof-tap",         boot: BootKind::Tap,     setup: Setup::Shared, pairs: MQ,  matrix: false, v6: false, run: stress::spoof::spoof_tap },
    Scenario { name: "unload-reload",     boot: BootKind::Debug,   setup: Setup::Shared, pairs: MQ,  matrix: false, v6: false, run: stress::unload_reload },
    Scenario { name: "unload-rtnl",       boot: BootKind::Debug,   setup: Setup::Shared, pairs: MQ,  matrix: false, v6: false, run: stress::unload_rtnl },
    Scenario { name: "stacked-ops",       boot: BootKind::Debug,   setup: Setup::Shared, pairs: MQ,  matrix: false, v6: false, run: stress::stacked_ops },
    Scenario { name: "debugfs-65k",       boot: BootKind::Debug,   setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: stress::bigtable::debugfs_65k },
    Scenario { name: "lock-holds",        boot: BootKind::Timed,   setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: stress::bigtable::lock_holds },
    // issue 47, an RFS bug caught by KASAN (rfs_tables.rs)
    Scenario { name: "rfs-unequal-tables", boot: BootKind::Debug,  setup: Setup::Fresh,  pairs: MQ,  matrix: false, v6: false, run: rfs_tables::rfs_unequal_tables },
];

/// Any number of queue pairs in use.
const ANY: (u16, u16) = (1, u16::MAX);
/// Two or more pairs in use: the scenario needs flows that aRFS moves.
const MQ: (u16, u16) = (2, u16::MAX);
/// Three or more (it shrinks the layout with `ethtool -L` to 2 and 3).
const MQ3: (u16, u16) = (3, u16::MAX);
/// Exactly one (plain RPS: aRFS has nothing to steer).
const ONE: (u16, u16) = (1, 1);

/// One scenario: one line of [`SCENARIOS`].
pub struct Scenario {
    /// What `--scenario` selects it by and the report calls it.
    pub name: &'static str,
    /// The boot it runs in.
    pub boot: BootKind,
    setup: Setup,
    /// The queue pairs in use it can run with (min, max).
    pairs: (u16, u16),
    /// Whether it runs on every topology of the matrix by default; the
    /// others run on the default topology (4x4) unless selected by name.
    pub matrix: bool,
    /// Whether its workload follows the address family (`--family`): only
    /// these run in the IPv6 and mixed cells.
    pub v6: bool,
    run: Run,
}

/// A scenario's body: assertions go to the [`Checks`], the figures of its
/// report line are the result (an error fails it too).
type Run = fn(&mut Session, &mut Checks) -> Result<String>;

/// How a scenario starts and ends.
enum Setup {
    /// In the session as the scenarios before it left it.
    Shared,
    /// From an unloaded module and an empty device table, and afterwards,
    /// whatever happened, the session is put back: knobs, table geometry,
    /// channels, module unloaded (`faults::isolated`).
    Fresh,
}

impl Scenario {
    /// The scenario called `name`.
    pub fn find(name: &str) -> Option<&'static Scenario> {
        SCENARIOS.iter().find(|s| s.name == name)
    }

    /// Whether it can run with the pairs `t` puts in use.
    pub fn fits(&self, t: &Topology) -> bool {
        (self.pairs.0..=self.pairs.1).contains(&t.pairs())
    }

    /// Whether it can run with flows of family `f`.
    pub fn speaks(&self, f: Family) -> bool {
        f == Family::Ipv4 || self.v6
    }

    /// Run it in `s` (see [`Session::run`], which never fails).
    fn call(&self, s: &mut Session, c: &mut Checks) -> Result<String> {
        match self.setup {
            Setup::Shared => (self.run)(s, c),
            Setup::Fresh => faults::isolated(s, c, self.run),
        }
    }
}

/// Every scenario's name, in canonical order.
pub fn all() -> Vec<&'static str> {
    SCENARIOS.iter().map(|s| s.name).collect()
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
    /// The debug kernel variant with instruction counting under TCG
    /// (`QemuOptions::icount`): the guest's clock measures the work its
    /// CPUs did, so a time the module measures (a lock hold) does not
    /// include the host preempting a vCPU thread.
    Timed,
}

impl BootKind {
    /// The `images/build-kernel --variant` it boots.
    pub fn variant(self) -> &'static str {
        match self {
            BootKind::Default | BootKind::Tap => "default",
            BootKind::Debug | BootKind::Timed => "debug",
        }
    }

    /// Appended to the kernel label in reports and artifact directories.
    pub fn suffix(self) -> &'static str {
        match self {
            BootKind::Default => "",
            BootKind::Tap => "-tap",
            BootKind::Debug => "-debug",
            BootKind::Timed => "-debug-icount",
        }
    }
}

/// The boot scenario `name` runs in.
pub fn boot_kind(name: &str) -> BootKind {
    Scenario::find(name).map_or(BootKind::Default, |s| s.boot)
}
