//! vnic guest integration suite: kernel text parsers and the host-side
//! harness that boots real kernels under QEMU on a real `vnic serve` and
//! drives the scenarios. The agent protocol is the agent crate's
//! (`vnic_agent::proto`), re-exported as [`proto`].

pub mod harness;
pub mod module;
pub mod procfs;
pub mod report;
pub mod scenarios;

pub use vnic_agent::proto;
