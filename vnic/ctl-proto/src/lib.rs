//! vnic's control protocol as types (the wire is documented in
//! `vnic/CTL.md`): newline-delimited JSON over a unix stream socket.
//!
//! - [`Request`]: what a client writes (`{"cmd": ...}`), parsed by the
//!   daemon with [`Request::from_line`] (its errors are the daemon's error
//!   replies);
//! - the replies: the [`Reply`] envelope (`ok`, `error`) around a body per
//!   command ([`StatsReply`] with [`Stats`], [`TableReply`], [`KnobsReply`],
//!   the `gen` bodies); the daemon serializes these, clients read them, so
//!   a counter is a field checked at compile time on both sides;
//! - [`Client`]: the one blocking client, with a typed [`CtlError`].
//!
//! serde and serde_json only: every crate of the workspace can use it.

mod client;
mod reply;
mod request;

pub use client::{Client, CtlError, DEFAULT_TIMEOUT};
pub use reply::{
    CtlStats, Deletes, Empty, Family, Filter, Flow, FlowSetInfo, FramesBad, GenChanged, GenList,
    GenPaused, GenResumed, GenStarted, GenStopped, Knobs, KnobsReply, MgmtDst, MgmtStats,
    PeerStats, QueueStats, Rejects, Reply, ResolvedFlowSpec, Ring, RingPair, Rings, RssState,
    RttBucket, RttStats, RuleEntry, Stats, StatsReply, Table, TableReply, TableStats, TraceStats,
    VhostRefusals, VhostStats, L4,
};
pub use request::{FlowSpec, GenOp, Request, RequestError, SetValue};
