//! vnic: a multi-queue vhost-user virtio-net device whose receive side holds an
//! aRFS flow filter table programmed by the guest through in-band management
//! frames (see `aRFS/PROTOCOL.md`). Architecture: `vnic/README.md`.
//!
//! The library is the daemon's binary split for testing; only the CLI is
//! public.

// Only what another crate uses is `pub`: everything else is `pub(crate)`
// or private (the lint keeps it so).
#![deny(unreachable_pub)]

mod backend;
pub mod cli;
mod clock;
mod config;
mod conn;
mod ctl;
mod ctlsock;
mod daemon;
mod error;
mod frame;
mod handoff;
mod lanes;
mod mgmt;
mod pairs;
mod peer;
mod relay;
mod serve;
mod stats;
mod steer;
mod trace;
mod virtq;
mod worker;

/// Pure entry points for the fuzz targets (crate `arfs-fuzz`): the
/// daemon's own parsing code, with no daemon around it.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::ctl::check_request as ctl_check_request;
}
