//! vnic guest integration suite: the agent protocol, kernel text parsers,
//! and the host-side harness that boots real kernels under QEMU on a real
//! `vnic serve` and drives the scenarios.

pub mod harness;
pub mod module;
pub mod procfs;
pub mod proto;
pub mod scenarios;
