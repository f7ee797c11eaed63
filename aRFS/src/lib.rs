//! The vnic flow-steering engine: flow keys, RSS, the filter table and the
//! management-frame protocol. No I/O, no threads, no allocation on the
//! lookup path.
//!
//! - [`flow`]: [`FlowKey`] and the Ethernet frame parser [`parse_frame`].
//! - [`rss`]: the table-driven [`Toeplitz`] hash and [`Rss`] (key + indirection;
//!   [`RssConfig`], what a driver's RSS_SET asks for).
//! - [`index`]: [`FlowIndex`], the O(1) exact-match index (worker replicas).
//! - [`rules`]: [`RuleSet`], the masked `ethtool -N` rule stage ahead of
//!   the filters (RULE_SET/RULE_DEL, the protocol's rule extension).
//! - [`table`]: [`FilterTable`], the authoritative table model with latency
//!   and fault-injection knobs, reporting [`TableEvent`]s.
//! - [`proto`]: the management-frame codec (`aRFS/PROTOCOL.md`).
//! - [`trace`]: trace records (`aRFS/TRACE.md`).
//!
//! # The device's two paths
//!
//! ```
//! use arfs::proto::{self, AddOp, FrameMeta, Message, MsgType, BROADCAST_MAC};
//! use arfs::{parse_frame, FilterTable, FlowKey, Request, Rss, TableConfig, TableEvent, TraceRecord};
//!
//! // Management path: one authoritative table, 2 us programming latency.
//! let mut table = FilterTable::new(TableConfig { latency_ns: 2_000, ..TableConfig::default() })?;
//! let mut replica = table.index().clone(); // a worker's lookup-only copy
//! let rss = Rss::new(4);
//!
//! // The guest's module asks to steer a flow to rx queue 3.
//! let flow: FlowKey = "udp 10.0.0.2:5000 -> 10.0.0.1:6000".parse()?;
//! let mut frame = Vec::new();
//! let meta = FrameMeta { dst: BROADCAST_MAC, src: [0x52, 0x54, 0, 0, 0, 1], seq: 7, generation: 1 };
//! proto::encode(&mut frame, &meta, &Message::Add(vec![AddOp::new(42, 3, &flow)]))?;
//!
//! // The device decodes it (a malformed frame would give a DecodeError to NAK or ignore).
//! assert!(proto::is_mgmt_frame(&frame));
//! let (hdr, msg) = proto::decode_frame(&frame)?;
//! let req = Request::try_from(msg).expect("ADD is a table request");
//! let due = table.submit(1_000, hdr.seq, req);
//! assert_eq!(due, 3_000);
//!
//! // Before the latency has elapsed nothing changed: packets follow RSS.
//! assert_eq!(replica.lookup(&flow), None);
//!
//! // At the due time the ADD takes effect: events update the replica, become
//! // trace lines, and `Completed` is the moment to send the ACK.
//! let mut ack = Vec::new();
//! table.advance(3_000, 4, &mut |ev| {
//!     replica.apply(&ev);
//!     let _line = TraceRecord::from_event(3_000, 1, &ev); // serde_json::to_writer(...)
//!     if let TableEvent::Completed { seq, kind, statuses, .. } = &ev {
//!         proto::encode_ack(&mut ack, meta.src, *seq, 1, *kind, statuses).unwrap();
//!     }
//! });
//! let (ack_hdr, ack_msg) = proto::decode_frame_driver(&ack)?;
//! assert_eq!(ack_hdr.seq, 7);
//! assert!(matches!(ack_msg, Message::Ack(a) if a.acked_type == MsgType::Add.code() && a.statuses == [0]));
//!
//! // Packet path (a worker): parse, look the flow up, else RSS.
//! let mut pkt = vec![0u8; 14 + 20 + 8];
//! pkt[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
//! pkt[14] = 0x45;
//! pkt[16..18].copy_from_slice(&28u16.to_be_bytes());
//! pkt[23] = 17;
//! pkt[26..30].copy_from_slice(&[10, 0, 0, 2]);
//! pkt[30..34].copy_from_slice(&[10, 0, 0, 1]);
//! pkt[34..36].copy_from_slice(&5000u16.to_be_bytes());
//! pkt[36..38].copy_from_slice(&6000u16.to_be_bytes());
//! pkt[38..40].copy_from_slice(&8u16.to_be_bytes());
//! let parsed = parse_frame(&pkt)?;
//! let rxq = match parsed.flow().and_then(|k| replica.lookup(k)) {
//!     Some((id, q)) => {
//!         assert_eq!(id, 42);
//!         q
//!     }
//!     None => rss.queue_for(&parsed),
//! };
//! assert_eq!(rxq, 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod flow;
pub mod index;
pub mod proto;
pub mod rng;
pub mod rss;
pub mod rules;
pub mod table;
pub mod trace;

pub use flow::{
    ipv4_flow, parse_frame, FlowKey, IpFamily, IpPair, L4Proto, Layer, ParseError, ParsedFrame, L3,
};
pub use index::{FilterId, FlowIndex, IndexError};
pub use proto::{
    decode_frame, AddOp, DecodeError, DelOp, DelReason, FrameError, Header, Message, MsgType,
    OpStatus,
};
pub use rss::{KeyParseError, Rss, RssConfig, Toeplitz, DEFAULT_KEY};
pub use rules::{Rule, RuleAction, RuleError, RuleFlow, RuleInput, RuleSet};
pub use table::{ConfigError, Counters, Entry, FilterTable, Request, TableConfig, TableEvent};
pub use trace::{DropCause, EventKind, TraceRecord};
