//! The vnic flow-steering engine: flow keys, RSS, the filter table and the
//! management-frame protocol. No I/O, no threads, no allocation on the
//! lookup path.
//!
//! - [`flow`]: [`FlowKey`] and the Ethernet frame parser [`parse_frame`].
//! - [`rss`]: the table-driven [`Toeplitz`] hash and [`Rss`] (key + indirection).
//! - [`index`]: [`FlowIndex`], the O(1) exact-match index (worker replicas).
//! - [`table`]: [`FilterTable`], the authoritative table model with latency
//!   and fault-injection knobs, reporting [`TableEvent`]s.
//! - [`proto`]: the management-frame codec (`aRFS/PROTOCOL.md`).
//! - [`trace`]: trace records (`aRFS/TRACE.md`).
#![warn(missing_docs)]

pub mod flow;
pub mod index;
pub mod proto;
pub mod rng;
pub mod rss;
pub mod table;
pub mod trace;

pub use flow::{
    parse_frame, FlowKey, IpFamily, IpPair, L4Proto, Layer, ParseError, ParsedFrame, L3,
};
pub use index::{FilterId, FlowIndex, IndexError};
pub use proto::{
    decode_frame, AddOp, DecodeError, DelOp, DelReason, FrameError, Header, Message, MsgType,
    OpStatus,
};
pub use rss::{Rss, Toeplitz, DEFAULT_KEY};
pub use table::{ConfigError, Counters, Entry, FilterTable, Request, TableConfig, TableEvent};
pub use trace::{DropCause, EventKind, TraceRecord};
