//! The library half of the vnic guest agent: what the agent and the host
//! harness (`guest-tests`) share. The agent binary is `main.rs` with its
//! modules `rawtx`, `sys` and `workload`; it depends on nothing of the
//! daemon, so changes there never rebuild the static agent.

pub mod kmsg;
pub mod ntuple;
pub mod payload;
pub mod proto;
