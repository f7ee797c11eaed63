//! The management-frame codec: exactly `aRFS/PROTOCOL.md`.
//!
//! [`decode_frame`] is the device-side decoder (it accepts only driver ->
//! device messages); [`decode_frame_driver`] is the driver-side one (CAPS and
//! ACK), used by tests and tools. Decoding is strict: every malformed frame
//! yields a [`DecodeError`] naming the [`FrameError`] code, the field and,
//! for op lists, the op index. [`encode`] and [`encode_into`] write a whole
//! Ethernet frame.

use core::fmt;

use serde::{Deserialize, Serialize};

use crate::flow::{FlowKey, IpFamily, L4Proto};
use crate::rss::{RssConfig, INDIRECTION_LEN, KEY_LEN};

/// EtherType of management frames (IEEE local experimental 1).
pub const ETHERTYPE_MGMT: u16 = 0x88B5;
/// Header magic ("vA").
pub const MAGIC: u16 = 0x7641;
/// Protocol version.
pub const VERSION: u8 = 1;
/// Length of the Ethernet header (management frames are never tagged).
pub const ETH_HEADER_LEN: usize = 14;
/// Length of the management header.
pub const HEADER_LEN: usize = 16;
/// Offset of the body in the frame.
pub const BODY_OFFSET: usize = ETH_HEADER_LEN + HEADER_LEN;
/// The MTU the protocol is sized for.
pub const MTU: usize = 1500;
/// Longest frame (Ethernet header + MTU).
pub const MAX_FRAME_LEN: usize = ETH_HEADER_LEN + MTU;
/// Longest body.
pub const MAX_BODY_LEN: usize = MTU - HEADER_LEN;
/// HELLO body length.
pub const HELLO_LEN: usize = 16;
/// CAPS body length.
pub const CAPS_LEN: usize = 24;
/// CAPS body length with the rule extension (answering a HELLO of
/// `driver_version` >= [`RULES_DRIVER_VERSION`]).
pub const CAPS_RULES_LEN: usize = 32;
/// The HELLO `driver_version` from which a driver understands the longer
/// CAPS and may send RULE_SET/RULE_DEL.
pub const RULES_DRIVER_VERSION: u32 = 2;
/// CAPS `features` bit: the device has the masked rule stage.
pub const FEATURE_RULES: u32 = 1;
/// The HELLO `driver_version` from which a driver also knows the RSS
/// extension: the device sets [`FEATURE_RSS`] in its CAPS.
pub const RSS_DRIVER_VERSION: u32 = 3;
/// CAPS `features` bit: the device takes RSS_SET (the RSS extension).
pub const FEATURE_RSS: u32 = 2;
/// RSS_SET op size in bytes (one op per frame).
pub const RSS_SET_OP_LEN: usize = 304;
/// RULE_SET op size in bytes.
pub const RULE_OP_LEN: usize = 88;
/// RULE_DEL op size in bytes.
pub const RULE_DEL_OP_LEN: usize = 4;
/// RULE_SET ops that fit one frame.
pub const MAX_RULE_OPS: u16 = (MAX_BODY_LEN / RULE_OP_LEN) as u16;
/// Length of one ADD op.
pub const ADD_OP_LEN: usize = 44;
/// Length of one DEL op.
pub const DEL_OP_LEN: usize = 4;
/// FLUSH body length.
pub const FLUSH_LEN: usize = 4;
/// Fixed part of the ACK body (before the statuses).
pub const ACK_FIXED_LEN: usize = 4;
/// Most ADD ops in one frame at MTU 1500: (1500 - 16) / 44 = 33.
pub const MAX_ADD_OPS: u16 = (MAX_BODY_LEN / ADD_OP_LEN) as u16;
/// Most DEL ops in one frame at MTU 1500: (1500 - 16) / 4 = 371.
pub const MAX_DEL_OPS: u16 = (MAX_BODY_LEN / DEL_OP_LEN) as u16;
/// The `max_ops` a device advertises by default: the ADD limit, applied to
/// ADD and DEL alike.
pub const DEFAULT_MAX_OPS: u16 = MAX_ADD_OPS;
/// Most statuses in one ACK: as many as the largest request has ops.
pub const MAX_ACK_STATUSES: u16 = MAX_DEL_OPS;
/// Source MAC of every device frame.
pub const DEVICE_MAC: [u8; 6] = [0x02, 0x76, 0x6e, 0x69, 0x63, 0x00];
/// Broadcast MAC (the device accepts driver frames whatever their
/// destination; the guest module never sends to it).
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];
/// Destination of HELLO: the link-local "nearest bridge" group address
/// (01-80-C2-00-00-0E), which no 802.1D/Q bridge forwards. Every later
/// driver frame is unicast to the address the CAPS came from.
pub const HELLO_GROUP_MAC: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e];

/// Most ops of `t` that fit one frame at MTU 1500 (0 for types without ops;
/// the status count for ACK).
pub const fn max_ops_per_frame(t: MsgType) -> u16 {
    match t {
        MsgType::Add => MAX_ADD_OPS,
        MsgType::Del | MsgType::RuleDel => MAX_DEL_OPS,
        MsgType::Ack => MAX_ACK_STATUSES,
        MsgType::RuleSet => MAX_RULE_OPS,
        MsgType::RssSet => 1,
        _ => 0,
    }
}

/// Whether an Ethernet frame is a management frame (untagged EtherType 0x88B5).
pub fn is_mgmt_frame(frame: &[u8]) -> bool {
    frame.len() >= ETH_HEADER_LEN && u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE_MGMT
}

/// TPIDs of VLAN tags a management frame may hide behind: 802.1Q, 802.1ad
/// (S-tag) and the pre-standard QinQ tags 0x9100..0x9300.
pub const VLAN_TPIDS: [u16; 5] = [0x8100, 0x88A8, 0x9100, 0x9200, 0x9300];

/// Most VLAN tags [`is_mgmt_behind_tags`] walks; a deeper stack is judged
/// as if its next EtherType were the management one (a frame no host sends
/// for any other reason).
pub const MAX_VLAN_TAGS: usize = 8;

/// Whether an Ethernet frame carries the management EtherType, untagged or
/// behind any stack of VLAN tags ([`VLAN_TPIDS`]): what a peer must never
/// deliver to the guest, since a guest that strips the tags (802.1ad,
/// QinQ, VID 0 priority tags) hands the inner frame to the module's packet
/// handler as if the device had sent it. A stack deeper than
/// [`MAX_VLAN_TAGS`], or cut short inside a tag, counts as one.
pub fn is_mgmt_behind_tags(frame: &[u8]) -> bool {
    let mut off = 12;
    for _ in 0..=MAX_VLAN_TAGS {
        let Some(t) = frame.get(off..off + 2) else {
            return false;
        };
        let ty = u16::from_be_bytes([t[0], t[1]]);
        if ty == ETHERTYPE_MGMT {
            return true;
        }
        if !VLAN_TPIDS.contains(&ty) {
            return false;
        }
        off += 4;
        if frame.len() < off + 2 {
            // a tag with no room for the next EtherType: not deliverable
            // as a management frame, but not a flow either
            return false;
        }
    }
    true
}

/// Who sends a message type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Driver (guest module) -> device (daemon).
    ToDevice,
    /// Device -> driver.
    ToDriver,
}

/// Message type (header byte 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MsgType {
    /// HELLO (1), driver -> device.
    Hello = 1,
    /// CAPS (2), device -> driver.
    Caps = 2,
    /// ADD (3), driver -> device.
    Add = 3,
    /// DEL (4), driver -> device.
    Del = 4,
    /// FLUSH (5), driver -> device.
    Flush = 5,
    /// ACK (6), device -> driver.
    Ack = 6,
    /// RULE_SET (7), driver -> device: masked rules at their locations.
    RuleSet = 7,
    /// RULE_DEL (8), driver -> device: rules removed by location.
    RuleDel = 8,
    /// RSS_SET (9), driver -> device: the RSS key and indirection table.
    RssSet = 9,
}

impl MsgType {
    /// Wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a wire code.
    pub const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::Hello,
            2 => Self::Caps,
            3 => Self::Add,
            4 => Self::Del,
            5 => Self::Flush,
            6 => Self::Ack,
            7 => Self::RuleSet,
            8 => Self::RuleDel,
            9 => Self::RssSet,
            _ => return None,
        })
    }

    /// Upper-case name as in PROTOCOL.md.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Hello => "HELLO",
            Self::Caps => "CAPS",
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Flush => "FLUSH",
            Self::Ack => "ACK",
            Self::RuleSet => "RULE_SET",
            Self::RuleDel => "RULE_DEL",
            Self::RssSet => "RSS_SET",
        }
    }

    /// Who sends it.
    pub const fn direction(self) -> Direction {
        match self {
            Self::Caps | Self::Ack => Direction::ToDriver,
            _ => Direction::ToDevice,
        }
    }
}

/// DEL/FLUSH reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DelReason {
    /// 1: `rps_may_expire_flow` said the flow is gone.
    Expired = 1,
    /// 2: the driver's time-based idle backstop.
    Idle = 2,
    /// 3: replaced (the flow moved to another filter).
    Replaced = 3,
    /// 4: flush.
    Flush = 4,
    /// 5: driver unload.
    Unload = 5,
    /// 6: a fixed lifetime ended (ice's 5 s UDP timer, the module's
    /// `expiry=ice`).
    Aged = 6,
}

impl DelReason {
    /// Every reason, in code order.
    pub const ALL: [Self; 6] = [
        Self::Expired,
        Self::Idle,
        Self::Replaced,
        Self::Flush,
        Self::Unload,
        Self::Aged,
    ];

    /// Wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a wire code (1..=6).
    pub const fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::Expired,
            2 => Self::Idle,
            3 => Self::Replaced,
            4 => Self::Flush,
            5 => Self::Unload,
            6 => Self::Aged,
            _ => return None,
        })
    }

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::Idle => "idle",
            Self::Replaced => "replaced",
            Self::Flush => "flush",
            Self::Unload => "unload",
            Self::Aged => "aged",
        }
    }
}

impl fmt::Display for DelReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Per-op status in an ACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpStatus {
    /// 0: applied.
    Ok = 0,
    /// 1: the table is at capacity.
    TableFull = 1,
    /// 2: the flow's bucket is full.
    BucketFull = 2,
    /// 3: rxq >= enabled queue pairs.
    BadQueue = 3,
    /// 4: bad family/proto or non-zero IPv4 padding.
    BadKey = 4,
    /// 5: the ADD-failure knob fired.
    InjectedFailure = 5,
    /// 6: DEL of an id that is not live.
    UnknownId = 6,
    /// 7: id 0xFFFF.
    BadId = 7,
}

impl OpStatus {
    /// Every status, in code order.
    pub const ALL: [Self; 8] = [
        Self::Ok,
        Self::TableFull,
        Self::BucketFull,
        Self::BadQueue,
        Self::BadKey,
        Self::InjectedFailure,
        Self::UnknownId,
        Self::BadId,
    ];

    /// Wire code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a wire code.
    pub const fn from_code(c: u8) -> Option<Self> {
        if (c as usize) < Self::ALL.len() {
            Some(Self::ALL[c as usize])
        } else {
            None
        }
    }

    /// Name as in PROTOCOL.md.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::TableFull => "table_full",
            Self::BucketFull => "bucket_full",
            Self::BadQueue => "bad_queue",
            Self::BadKey => "bad_key",
            Self::InjectedFailure => "injected_failure",
            Self::UnknownId => "unknown_id",
            Self::BadId => "bad_id",
        }
    }
}

impl fmt::Display for OpStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Malformed-frame codes (ACK `frame_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameError {
    /// 1: shorter than Ethernet + header, or than header + `body_len` (silent).
    TooShort = 1,
    /// 2: magic is not 0x7641 (silent).
    BadMagic = 2,
    /// 3: version is not 1 (silent).
    BadVersion = 3,
    /// 4: type not in 1..=9.
    UnknownType = 4,
    /// 5: a type meant for the other direction.
    WrongDirection = 5,
    /// 6: `body_len` is not what `type` and `count` require.
    BadLength = 6,
    /// 7: `count` > `max_ops`.
    TooManyOps = 7,
    /// 8: DEL/FLUSH reason outside 1..=6.
    BadReason = 8,
    /// 9: a reserved field is not zero.
    ReservedNonzero = 9,
    /// 10: `count` wrong for the type.
    BadCount = 10,
}

impl FrameError {
    /// Every code, in order.
    pub const ALL: [Self; 10] = [
        Self::TooShort,
        Self::BadMagic,
        Self::BadVersion,
        Self::UnknownType,
        Self::WrongDirection,
        Self::BadLength,
        Self::TooManyOps,
        Self::BadReason,
        Self::ReservedNonzero,
        Self::BadCount,
    ];

    /// Wire code (1..=10).
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Decodes a wire code.
    pub const fn from_code(c: u8) -> Option<Self> {
        if c >= 1 && (c as usize) <= Self::ALL.len() {
            Some(Self::ALL[c as usize - 1])
        } else {
            None
        }
    }

    /// Name as in PROTOCOL.md.
    pub const fn name(self) -> &'static str {
        match self {
            Self::TooShort => "too_short",
            Self::BadMagic => "bad_magic",
            Self::BadVersion => "bad_version",
            Self::UnknownType => "unknown_type",
            Self::WrongDirection => "wrong_direction",
            Self::BadLength => "bad_length",
            Self::TooManyOps => "too_many_ops",
            Self::BadReason => "bad_reason",
            Self::ReservedNonzero => "reserved_nonzero",
            Self::BadCount => "bad_count",
        }
    }

    /// Whether the protocol forbids replying (the header cannot be trusted).
    pub const fn is_silent(self) -> bool {
        matches!(self, Self::TooShort | Self::BadMagic | Self::BadVersion)
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The management header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Header {
    /// Message type code (raw: a NAK may acknowledge an unknown type).
    pub msg_type: u8,
    /// Sequence number.
    pub seq: u32,
    /// Device generation.
    pub generation: u32,
    /// Entries in the body.
    pub count: u16,
    /// Body length in bytes.
    pub body_len: u16,
}

impl Header {
    /// The message type, if known.
    pub const fn kind(&self) -> Option<MsgType> {
        MsgType::from_code(self.msg_type)
    }
}

/// HELLO body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Hello {
    /// Driver version (informational).
    pub driver_version: u32,
    /// Per-session nonce the device echoes in CAPS (the driver accepts
    /// only a CAPS that carries it).
    pub nonce: u32,
    /// The guest NIC's MAC; replies go to it.
    pub mac: [u8; 6],
}

/// CAPS body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Caps {
    /// Queue pairs the device has.
    pub max_queue_pairs: u16,
    /// Rx queues currently enabled by the guest.
    pub enabled_queue_pairs: u16,
    /// Most filters.
    pub capacity: u32,
    /// Placement buckets (0 = no placement model).
    pub buckets: u32,
    /// Filters per bucket (0 when `buckets` = 0).
    pub ways: u16,
    /// Most ops in one ADD or DEL frame.
    pub max_ops: u16,
    /// Modelled programming latency in microseconds.
    pub latency_us: u32,
    /// The nonce of the HELLO this CAPS answers.
    pub nonce: u32,
    /// The extensions (the 32-byte CAPS: `features`, `max_rules`); None:
    /// the 24-byte CAPS of a device without them, or of one answering a
    /// driver that predates them.
    pub ext: Option<CapsExt>,
}

impl Caps {
    /// The rule locations of the 32-byte CAPS (None: the 24-byte CAPS).
    pub fn max_rules(&self) -> Option<u16> {
        self.ext.map(|e| e.max_rules)
    }

    /// Whether the device offers RSS_SET (`features` bit 1).
    pub fn has_rss(&self) -> bool {
        self.ext.is_some_and(|e| e.rss)
    }
}

/// What the 32-byte CAPS adds. Its `features` always has the rule
/// extension's bit ([`FEATURE_RULES`]: the long CAPS exists for it) and
/// the RSS extension's ([`FEATURE_RSS`]) with `rss`; the driver side
/// decodes no other value (`reserved_nonzero`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CapsExt {
    /// Rule locations, 0 .. `max_rules` - 1.
    pub max_rules: u16,
    /// `features` bit 1: the device takes RSS_SET (sent only to a driver
    /// of `driver_version` >= [`RSS_DRIVER_VERSION`]).
    pub rss: bool,
}

impl CapsExt {
    /// The `features` word on the wire.
    pub const fn features(&self) -> u32 {
        if self.rss {
            FEATURE_RULES | FEATURE_RSS
        } else {
            FEATURE_RULES
        }
    }
}

/// One ADD op, raw as on the wire: family, proto and address padding are
/// checked when the op is applied (status `bad_key`), not when decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AddOp {
    /// Filter id.
    pub id: u16,
    /// Target rx queue.
    pub rxq: u16,
    /// 4 or 6.
    pub family: u8,
    /// 6 or 17.
    pub proto: u8,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Source address (IPv4 in bytes 0..4).
    pub src: [u8; 16],
    /// Destination address (IPv4 in bytes 0..4).
    pub dst: [u8; 16],
}

impl AddOp {
    /// The op installing `flow` as filter `id` on `rxq`.
    pub fn new(id: u16, rxq: u16, flow: &FlowKey) -> Self {
        Self {
            id,
            rxq,
            family: flow.family().wire(),
            proto: flow.proto().ip_proto(),
            src_port: flow.src_port(),
            dst_port: flow.dst_port(),
            src: flow.src_bytes(),
            dst: flow.dst_bytes(),
        }
    }

    /// The flow, or `None` when family/proto/padding make it a `bad_key`.
    pub fn key(&self) -> Option<FlowKey> {
        let family = IpFamily::from_wire(self.family)?;
        let proto = L4Proto::from_ip_proto(self.proto)?;
        FlowKey::from_raw(
            family,
            proto,
            self.src,
            self.src_port,
            self.dst,
            self.dst_port,
        )
    }
}

/// One RULE_SET op, raw as on the wire: the flow type and action codes are
/// checked when it is applied (status `bad_key`), not when decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RuleOp {
    /// Location.
    pub loc: u32,
    /// [`crate::RuleFlow`] code.
    pub flow: u8,
    /// 1 queue, 2 drop, 3 RSS context.
    pub action: u8,
    /// The queue (action 1), or the offset into the context (3).
    pub rxq: u16,
    /// The RSS context (action 3).
    pub context: u32,
    /// Upper-layer protocol and mask (`ip4`/`ip6`).
    pub l4_proto: u8,
    /// Its mask.
    pub l4_mask: u8,
    /// Source address (IPv4 in bytes 0..4) and mask.
    pub src: [u8; 16],
    /// Its mask.
    pub src_mask: [u8; 16],
    /// Destination address and mask.
    pub dst: [u8; 16],
    /// Its mask.
    pub dst_mask: [u8; 16],
    /// Source port.
    pub sport: u16,
    /// Its mask.
    pub sport_mask: u16,
    /// Destination port.
    pub dport: u16,
    /// Its mask.
    pub dport_mask: u16,
}

impl RuleOp {
    /// The op installing `r`.
    pub fn new(r: &crate::Rule) -> Self {
        let (action, rxq, context) = match r.action {
            crate::RuleAction::Queue(q) => (1, q, 0),
            crate::RuleAction::Drop => (2, 0, 0),
            crate::RuleAction::Context { ctx, offset } => (3, offset, ctx),
        };
        Self {
            loc: r.loc,
            flow: r.flow.code(),
            action,
            rxq,
            context,
            l4_proto: r.l4_proto,
            l4_mask: r.l4_mask,
            src: r.src,
            src_mask: r.src_mask,
            dst: r.dst,
            dst_mask: r.dst_mask,
            sport: r.sport,
            sport_mask: r.sport_mask,
            dport: r.dport,
            dport_mask: r.dport_mask,
        }
    }

    /// The rule, or `None` when the flow type or action code is unknown
    /// (status `bad_key`).
    pub fn rule(&self) -> Option<crate::Rule> {
        let flow = crate::RuleFlow::from_code(self.flow)?;
        let action = match self.action {
            1 => crate::RuleAction::Queue(self.rxq),
            2 => crate::RuleAction::Drop,
            3 => crate::RuleAction::Context {
                ctx: self.context,
                offset: self.rxq,
            },
            _ => return None,
        };
        Some(crate::Rule {
            loc: self.loc,
            flow,
            src: self.src,
            src_mask: self.src_mask,
            dst: self.dst,
            dst_mask: self.dst_mask,
            sport: self.sport,
            sport_mask: self.sport_mask,
            dport: self.dport,
            dport_mask: self.dport_mask,
            l4_proto: self.l4_proto,
            l4_mask: self.l4_mask,
            action,
        })
    }
}

/// The RSS_SET op (one per frame), raw as on the wire: `context`, `hfunc`
/// and the zeros the flags ask for are checked when it is applied (status
/// `bad_key`), as the queues of its table are (`bad_queue`); the reserved
/// bytes and flag bits when it is decoded (`reserved_nonzero`). Serde
/// writes the key as 80 hex digits and the table as an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RssSetOp {
    /// The RSS context (only 0, the default RSS, exists).
    pub context: u32,
    /// [`Self::DEFAULT_INDIR`], [`Self::DEFAULT_KEY`].
    pub flags: u8,
    /// The hash function: [`Self::HFUNC_TOEPLITZ`].
    pub hfunc: u8,
    /// The Toeplitz key (zero with [`Self::DEFAULT_KEY`]).
    #[serde(with = "crate::rss::serde_key")]
    pub key: [u8; KEY_LEN],
    /// The indirection table: 128 queue indices (zero with
    /// [`Self::DEFAULT_INDIR`]).
    #[serde(with = "crate::rss::serde_indirection")]
    pub indirection: [u16; INDIRECTION_LEN],
}

impl RssSetOp {
    /// `flags` bit 0: the device's own table (round-robin over the enabled
    /// queues, refilled when their number changes).
    pub const DEFAULT_INDIR: u8 = 1;
    /// `flags` bit 1: the default key.
    pub const DEFAULT_KEY: u8 = 2;
    /// `hfunc` Toeplitz (the kernel's `ETH_RSS_HASH_TOP`), the only one.
    pub const HFUNC_TOEPLITZ: u8 = 1;

    /// The op asking for `c` (context 0, Toeplitz).
    pub fn new(c: &RssConfig) -> Self {
        let mut flags = 0;
        if c.indirection.is_none() {
            flags |= Self::DEFAULT_INDIR;
        }
        if c.key.is_none() {
            flags |= Self::DEFAULT_KEY;
        }
        Self {
            context: 0,
            flags,
            hfunc: Self::HFUNC_TOEPLITZ,
            key: c.key.unwrap_or([0; KEY_LEN]),
            indirection: c.indirection.unwrap_or([0; INDIRECTION_LEN]),
        }
    }

    /// Whether it asks for the device's own table.
    pub const fn default_indir(&self) -> bool {
        self.flags & Self::DEFAULT_INDIR != 0
    }

    /// Whether it asks for the default key.
    pub const fn default_key(&self) -> bool {
        self.flags & Self::DEFAULT_KEY != 0
    }

    /// What it asks for, unchecked (a key and a table the flags say are
    /// the default's are dropped, whatever they hold).
    pub fn asked(&self) -> RssConfig {
        RssConfig {
            key: (!self.default_key()).then_some(self.key),
            indirection: (!self.default_indir()).then_some(self.indirection),
        }
    }

    /// What it asks for, or the status that refuses it (PROTOCOL.md, "The
    /// RSS extension"), in this order: `bad_key` (a context other than 0,
    /// a hash function other than Toeplitz, a key with `default_key` or a
    /// table with `default_indir` that is not all zero), `bad_queue` (an
    /// entry at or past `queue_pairs`, the device's queue pairs).
    pub fn config(&self, queue_pairs: u16) -> Result<RssConfig, OpStatus> {
        if self.context != 0
            || self.hfunc != Self::HFUNC_TOEPLITZ
            || (self.default_key() && self.key != [0; KEY_LEN])
            || (self.default_indir() && self.indirection != [0; INDIRECTION_LEN])
        {
            return Err(OpStatus::BadKey);
        }
        if !self.default_indir() && self.indirection.iter().any(|&q| q >= queue_pairs) {
            return Err(OpStatus::BadQueue);
        }
        Ok(self.asked())
    }
}

/// One DEL op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DelOp {
    /// Filter id.
    pub id: u16,
    /// Why the driver deletes it.
    pub reason: DelReason,
}

/// ACK body.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ack {
    /// Type code of the acknowledged request (raw: may be unknown in a NAK).
    pub acked_type: u8,
    /// 0, or a [`FrameError`] code.
    pub frame_status: u8,
    /// One [`OpStatus`] code per op, in op order (raw codes).
    pub statuses: Vec<u8>,
}

impl Ack {
    /// The frame status as a typed error (`None` for 0 or an unknown code).
    pub fn frame_error(&self) -> Option<FrameError> {
        FrameError::from_code(self.frame_status)
    }

    /// The statuses typed (`None` entries for unknown codes).
    pub fn op_statuses(&self) -> impl Iterator<Item = Option<OpStatus>> + '_ {
        self.statuses.iter().map(|&c| OpStatus::from_code(c))
    }
}

/// A decoded management message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// HELLO.
    Hello(Hello),
    /// CAPS.
    Caps(Caps),
    /// ADD with its ops.
    Add(Vec<AddOp>),
    /// DEL with its ops.
    Del(Vec<DelOp>),
    /// FLUSH with its reason.
    Flush(DelReason),
    /// ACK.
    Ack(Ack),
    /// RULE_SET with its ops.
    RuleSet(Vec<RuleOp>),
    /// RULE_DEL: the locations.
    RuleDel(Vec<u32>),
    /// RSS_SET: its one op.
    RssSet(Box<RssSetOp>),
}

impl Message {
    /// Its type.
    pub const fn msg_type(&self) -> MsgType {
        match self {
            Self::Hello(_) => MsgType::Hello,
            Self::Caps(_) => MsgType::Caps,
            Self::Add(_) => MsgType::Add,
            Self::Del(_) => MsgType::Del,
            Self::Flush(_) => MsgType::Flush,
            Self::Ack(_) => MsgType::Ack,
            Self::RuleSet(_) => MsgType::RuleSet,
            Self::RuleDel(_) => MsgType::RuleDel,
            Self::RssSet(_) => MsgType::RssSet,
        }
    }

    /// The header `count` it encodes with.
    pub fn count(&self) -> usize {
        match self {
            Self::Add(v) => v.len(),
            Self::Del(v) => v.len(),
            Self::Ack(a) => a.statuses.len(),
            Self::RuleSet(v) => v.len(),
            Self::RuleDel(v) => v.len(),
            Self::RssSet(_) => 1,
            _ => 0,
        }
    }

    /// The body length it encodes with.
    pub fn body_len(&self) -> usize {
        match self {
            Self::Hello(_) => HELLO_LEN,
            Self::Caps(c) if c.ext.is_some() => CAPS_RULES_LEN,
            Self::Caps(_) => CAPS_LEN,
            Self::Add(v) => v.len() * ADD_OP_LEN,
            Self::Del(v) => v.len() * DEL_OP_LEN,
            Self::Flush(_) => FLUSH_LEN,
            Self::Ack(a) => ACK_FIXED_LEN + a.statuses.len(),
            Self::RuleSet(v) => v.len() * RULE_OP_LEN,
            Self::RuleDel(v) => v.len() * RULE_DEL_OP_LEN,
            Self::RssSet(_) => RSS_SET_OP_LEN,
        }
    }
}

/// Why a frame did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// The malformed-frame code.
    pub kind: FrameError,
    /// The header, when it could be read (for a silent error it is not trustworthy).
    pub header: Option<Header>,
    /// The field at fault (`"magic"`, `"count"`, `"ops[].reserved"`...).
    pub field: &'static str,
    /// Index of the op at fault, for op lists.
    pub op: Option<u16>,
}

impl DecodeError {
    fn new(kind: FrameError, header: Option<Header>, field: &'static str) -> Self {
        Self {
            kind,
            header,
            field,
            op: None,
        }
    }

    fn at(kind: FrameError, header: Header, field: &'static str, op: usize) -> Self {
        Self {
            kind,
            header: Some(header),
            field,
            op: Some(op as u16),
        }
    }

    /// The header to NAK (an ACK with `frame_status` = [`Self::kind`]), or
    /// `None` when the protocol says to stay silent.
    pub fn nak_header(&self) -> Option<&Header> {
        if self.kind.is_silent() {
            None
        } else {
            self.header.as_ref()
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed management frame: {} (code {}) in field {}",
            self.kind,
            self.kind.code(),
            self.field
        )?;
        if let Some(op) = self.op {
            write!(f, " of op {op}")?;
        }
        if let Some(h) = &self.header {
            write!(f, " [type {} seq {}]", h.msg_type, h.seq)?;
        }
        Ok(())
    }
}

impl std::error::Error for DecodeError {}

#[inline]
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}

#[inline]
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Reads the header of a management frame without validating the body.
/// Returns `None` when the frame is shorter than Ethernet + header.
pub fn peek_header(frame: &[u8]) -> Option<Header> {
    if frame.len() < BODY_OFFSET {
        return None;
    }
    let h = &frame[ETH_HEADER_LEN..];
    Some(Header {
        msg_type: h[3],
        seq: be32(h, 4),
        generation: be32(h, 8),
        count: be16(h, 12),
        body_len: be16(h, 14),
    })
}

/// Device-side decode: accepts HELLO, ADD, DEL, FLUSH, RULE_SET, RULE_DEL
/// and RSS_SET; CAPS and ACK are `wrong_direction`. ADD and DEL may carry
/// up to [`DEFAULT_MAX_OPS`] ops (use [`decode_frame_limited`] when the
/// device advertises another `max_ops`).
pub fn decode_frame(frame: &[u8]) -> Result<(Header, Message), DecodeError> {
    decode(frame, Direction::ToDevice, DEFAULT_MAX_OPS)
}

/// Device-side decode with the `max_ops` the device advertised in CAPS
/// (ADD/DEL frames with more ops are `too_many_ops`).
pub fn decode_frame_limited(frame: &[u8], max_ops: u16) -> Result<(Header, Message), DecodeError> {
    decode(frame, Direction::ToDevice, max_ops)
}

/// Driver-side decode: accepts CAPS and ACK only.
pub fn decode_frame_driver(frame: &[u8]) -> Result<(Header, Message), DecodeError> {
    decode(frame, Direction::ToDriver, u16::MAX)
}

/// Decodes a frame travelling in direction `dir`; `max_ops` further limits
/// ADD/DEL op counts below the MTU limits.
///
/// Checks run in the order of PROTOCOL.md's "Decoding order" section, so
/// each malformed frame has exactly one error.
pub fn decode(
    frame: &[u8],
    dir: Direction,
    max_ops: u16,
) -> Result<(Header, Message), DecodeError> {
    use FrameError as E;
    let Some(h) = peek_header(frame) else {
        return Err(DecodeError::new(E::TooShort, None, "frame"));
    };
    if be16(frame, 12) != ETHERTYPE_MGMT {
        return Err(DecodeError::new(E::BadMagic, Some(h), "ethertype"));
    }
    let hb = &frame[ETH_HEADER_LEN..];
    if be16(hb, 0) != MAGIC {
        return Err(DecodeError::new(E::BadMagic, Some(h), "magic"));
    }
    if hb[2] != VERSION {
        return Err(DecodeError::new(E::BadVersion, Some(h), "version"));
    }
    let Some(t) = MsgType::from_code(h.msg_type) else {
        return Err(DecodeError::new(E::UnknownType, Some(h), "type"));
    };
    if t.direction() != dir {
        return Err(DecodeError::new(E::WrongDirection, Some(h), "type"));
    }
    let count = usize::from(h.count);
    // count
    let (min_count, max_count) = match t {
        MsgType::Add => (1, usize::from(MAX_ADD_OPS.min(max_ops))),
        MsgType::Del | MsgType::RuleDel => (1, usize::from(MAX_DEL_OPS.min(max_ops))),
        MsgType::Ack => (0, usize::from(MAX_ACK_STATUSES)),
        MsgType::RuleSet => (1, usize::from(MAX_RULE_OPS.min(max_ops))),
        // Exactly one op: 0 is bad_count, more too_many_ops.
        MsgType::RssSet => (1, 1),
        _ => (0, 0),
    };
    if count < min_count || (max_count == 0 && count != 0) {
        return Err(DecodeError::new(E::BadCount, Some(h), "count"));
    }
    if count > max_count {
        return Err(DecodeError::new(E::TooManyOps, Some(h), "count"));
    }
    // body_len
    let want = match t {
        MsgType::Hello => HELLO_LEN,
        MsgType::Caps if usize::from(h.body_len) == CAPS_RULES_LEN => CAPS_RULES_LEN,
        MsgType::Caps => CAPS_LEN,
        MsgType::Add => count * ADD_OP_LEN,
        MsgType::Del => count * DEL_OP_LEN,
        MsgType::Flush => FLUSH_LEN,
        MsgType::Ack => ACK_FIXED_LEN + count,
        MsgType::RuleSet => count * RULE_OP_LEN,
        MsgType::RuleDel => count * RULE_DEL_OP_LEN,
        MsgType::RssSet => RSS_SET_OP_LEN,
    };
    if usize::from(h.body_len) != want {
        return Err(DecodeError::new(E::BadLength, Some(h), "body_len"));
    }
    if frame.len() < BODY_OFFSET + want {
        return Err(DecodeError::new(E::TooShort, Some(h), "body"));
    }
    let b = &frame[BODY_OFFSET..BODY_OFFSET + want];
    let msg = match t {
        MsgType::Hello => {
            if be16(b, 14) != 0 {
                return Err(DecodeError::new(E::ReservedNonzero, Some(h), "reserved"));
            }
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&b[8..14]);
            Message::Hello(Hello {
                driver_version: be32(b, 0),
                nonce: be32(b, 4),
                mac,
            })
        }
        MsgType::Caps => {
            // The long CAPS exists for the rule extension: `features` is
            // its bit, alone or with the RSS extension's (others are
            // reserved; a device without the extensions sends the short
            // CAPS), so the codec stays canonical.
            let ext = if b.len() == CAPS_RULES_LEN {
                let rss = match be32(b, 24) {
                    FEATURE_RULES => false,
                    f if f == FEATURE_RULES | FEATURE_RSS => true,
                    _ => return Err(DecodeError::new(E::ReservedNonzero, Some(h), "features")),
                };
                if be16(b, 30) != 0 {
                    return Err(DecodeError::new(E::ReservedNonzero, Some(h), "reserved"));
                }
                Some(CapsExt {
                    max_rules: be16(b, 28),
                    rss,
                })
            } else {
                None
            };
            Message::Caps(Caps {
                max_queue_pairs: be16(b, 0),
                enabled_queue_pairs: be16(b, 2),
                capacity: be32(b, 4),
                buckets: be32(b, 8),
                ways: be16(b, 12),
                max_ops: be16(b, 14),
                latency_us: be32(b, 16),
                nonce: be32(b, 20),
                ext,
            })
        }
        MsgType::Add => {
            let mut ops = Vec::with_capacity(count);
            for (i, o) in b.chunks_exact(ADD_OP_LEN).enumerate() {
                if be16(o, 10) != 0 {
                    return Err(DecodeError::at(E::ReservedNonzero, h, "ops[].reserved", i));
                }
                let mut src = [0u8; 16];
                let mut dst = [0u8; 16];
                src.copy_from_slice(&o[12..28]);
                dst.copy_from_slice(&o[28..44]);
                ops.push(AddOp {
                    id: be16(o, 0),
                    rxq: be16(o, 2),
                    family: o[4],
                    proto: o[5],
                    src_port: be16(o, 6),
                    dst_port: be16(o, 8),
                    src,
                    dst,
                });
            }
            Message::Add(ops)
        }
        MsgType::Del => {
            let mut ops = Vec::with_capacity(count);
            for (i, o) in b.chunks_exact(DEL_OP_LEN).enumerate() {
                let Some(reason) = DelReason::from_code(o[2]) else {
                    return Err(DecodeError::at(E::BadReason, h, "ops[].reason", i));
                };
                if o[3] != 0 {
                    return Err(DecodeError::at(E::ReservedNonzero, h, "ops[].reserved", i));
                }
                ops.push(DelOp {
                    id: be16(o, 0),
                    reason,
                });
            }
            Message::Del(ops)
        }
        MsgType::Flush => {
            let Some(reason) = DelReason::from_code(b[0]) else {
                return Err(DecodeError::new(E::BadReason, Some(h), "reason"));
            };
            if b[1..4].iter().any(|&x| x != 0) {
                return Err(DecodeError::new(E::ReservedNonzero, Some(h), "reserved"));
            }
            Message::Flush(reason)
        }
        MsgType::Ack => {
            if be16(b, 2) != 0 {
                return Err(DecodeError::new(E::ReservedNonzero, Some(h), "reserved"));
            }
            Message::Ack(Ack {
                acked_type: b[0],
                frame_status: b[1],
                statuses: b[4..].to_vec(),
            })
        }
        MsgType::RuleSet => {
            let mut ops = Vec::with_capacity(count);
            for (i, o) in b.chunks_exact(RULE_OP_LEN).enumerate() {
                if be16(o, 14) != 0 {
                    return Err(DecodeError::at(E::ReservedNonzero, h, "ops[].reserved", i));
                }
                let a16 = |at: usize| {
                    let mut x = [0u8; 16];
                    x.copy_from_slice(&o[at..at + 16]);
                    x
                };
                ops.push(RuleOp {
                    loc: be32(o, 0),
                    flow: o[4],
                    action: o[5],
                    rxq: be16(o, 6),
                    context: be32(o, 8),
                    l4_proto: o[12],
                    l4_mask: o[13],
                    src: a16(16),
                    src_mask: a16(32),
                    dst: a16(48),
                    dst_mask: a16(64),
                    sport: be16(o, 80),
                    sport_mask: be16(o, 82),
                    dport: be16(o, 84),
                    dport_mask: be16(o, 86),
                });
            }
            Message::RuleSet(ops)
        }
        MsgType::RuleDel => Message::RuleDel(b.chunks_exact(4).map(|o| be32(o, 0)).collect()),
        MsgType::RssSet => {
            if b[4] & !(RssSetOp::DEFAULT_INDIR | RssSetOp::DEFAULT_KEY) != 0 {
                return Err(DecodeError::at(E::ReservedNonzero, h, "ops[].flags", 0));
            }
            if be16(b, 6) != 0 {
                return Err(DecodeError::at(E::ReservedNonzero, h, "ops[].reserved", 0));
            }
            let mut key = [0u8; KEY_LEN];
            key.copy_from_slice(&b[8..48]);
            let mut indirection = [0u16; INDIRECTION_LEN];
            for (q, o) in indirection.iter_mut().zip(b[48..].chunks_exact(2)) {
                *q = be16(o, 0);
            }
            Message::RssSet(Box::new(RssSetOp {
                context: be32(b, 0),
                flags: b[4],
                hfunc: b[5],
                key,
                indirection,
            }))
        }
    };
    Ok((h, msg))
}

/// Why a message could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// More ops/statuses than fit one frame (`max` is the limit for the type).
    TooManyOps {
        /// Ops in the message.
        count: usize,
        /// Limit for the type.
        max: usize,
    },
    /// The output buffer is smaller than the frame (`need` bytes).
    BufferTooSmall {
        /// Bytes the frame needs.
        need: usize,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyOps { count, max } => {
                write!(f, "{count} entries exceed the per-frame limit {max}")
            }
            Self::BufferTooSmall { need } => {
                write!(f, "output buffer smaller than the {need}-byte frame")
            }
        }
    }
}

impl std::error::Error for EncodeError {}

/// Addressing and header fields of a frame to encode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameMeta {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// Sequence number.
    pub seq: u32,
    /// Generation.
    pub generation: u32,
}

/// Length of the frame `msg` encodes to.
pub fn encoded_len(msg: &Message) -> usize {
    BODY_OFFSET + msg.body_len()
}

/// Encodes `msg` as a whole Ethernet frame into `buf`; returns its length.
pub fn encode_into(buf: &mut [u8], meta: &FrameMeta, msg: &Message) -> Result<usize, EncodeError> {
    let count = msg.count();
    let max = usize::from(max_ops_per_frame(msg.msg_type()));
    if count > max {
        return Err(EncodeError::TooManyOps { count, max });
    }
    let len = encoded_len(msg);
    if buf.len() < len {
        return Err(EncodeError::BufferTooSmall { need: len });
    }
    let out = &mut buf[..len];
    out.fill(0);
    out[0..6].copy_from_slice(&meta.dst);
    out[6..12].copy_from_slice(&meta.src);
    out[12..14].copy_from_slice(&ETHERTYPE_MGMT.to_be_bytes());
    let h = &mut out[ETH_HEADER_LEN..BODY_OFFSET];
    h[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    h[2] = VERSION;
    h[3] = msg.msg_type().code();
    h[4..8].copy_from_slice(&meta.seq.to_be_bytes());
    h[8..12].copy_from_slice(&meta.generation.to_be_bytes());
    h[12..14].copy_from_slice(&(count as u16).to_be_bytes());
    h[14..16].copy_from_slice(&(msg.body_len() as u16).to_be_bytes());
    let b = &mut out[BODY_OFFSET..];
    match msg {
        Message::Hello(m) => {
            b[0..4].copy_from_slice(&m.driver_version.to_be_bytes());
            b[4..8].copy_from_slice(&m.nonce.to_be_bytes());
            b[8..14].copy_from_slice(&m.mac);
        }
        Message::Caps(c) => {
            b[0..2].copy_from_slice(&c.max_queue_pairs.to_be_bytes());
            b[2..4].copy_from_slice(&c.enabled_queue_pairs.to_be_bytes());
            b[4..8].copy_from_slice(&c.capacity.to_be_bytes());
            b[8..12].copy_from_slice(&c.buckets.to_be_bytes());
            b[12..14].copy_from_slice(&c.ways.to_be_bytes());
            b[14..16].copy_from_slice(&c.max_ops.to_be_bytes());
            b[16..20].copy_from_slice(&c.latency_us.to_be_bytes());
            b[20..24].copy_from_slice(&c.nonce.to_be_bytes());
            if let Some(e) = c.ext {
                b[24..28].copy_from_slice(&e.features().to_be_bytes());
                b[28..30].copy_from_slice(&e.max_rules.to_be_bytes());
            }
        }
        Message::Add(ops) => {
            for (o, op) in b.chunks_exact_mut(ADD_OP_LEN).zip(ops) {
                o[0..2].copy_from_slice(&op.id.to_be_bytes());
                o[2..4].copy_from_slice(&op.rxq.to_be_bytes());
                o[4] = op.family;
                o[5] = op.proto;
                o[6..8].copy_from_slice(&op.src_port.to_be_bytes());
                o[8..10].copy_from_slice(&op.dst_port.to_be_bytes());
                o[12..28].copy_from_slice(&op.src);
                o[28..44].copy_from_slice(&op.dst);
            }
        }
        Message::Del(ops) => {
            for (o, op) in b.chunks_exact_mut(DEL_OP_LEN).zip(ops) {
                o[0..2].copy_from_slice(&op.id.to_be_bytes());
                o[2] = op.reason.code();
            }
        }
        Message::Flush(r) => b[0] = r.code(),
        Message::Ack(a) => {
            b[0] = a.acked_type;
            b[1] = a.frame_status;
            b[4..].copy_from_slice(&a.statuses);
        }
        Message::RuleSet(ops) => {
            for (o, op) in b.chunks_exact_mut(RULE_OP_LEN).zip(ops) {
                o[0..4].copy_from_slice(&op.loc.to_be_bytes());
                o[4] = op.flow;
                o[5] = op.action;
                o[6..8].copy_from_slice(&op.rxq.to_be_bytes());
                o[8..12].copy_from_slice(&op.context.to_be_bytes());
                o[12] = op.l4_proto;
                o[13] = op.l4_mask;
                o[16..32].copy_from_slice(&op.src);
                o[32..48].copy_from_slice(&op.src_mask);
                o[48..64].copy_from_slice(&op.dst);
                o[64..80].copy_from_slice(&op.dst_mask);
                o[80..82].copy_from_slice(&op.sport.to_be_bytes());
                o[82..84].copy_from_slice(&op.sport_mask.to_be_bytes());
                o[84..86].copy_from_slice(&op.dport.to_be_bytes());
                o[86..88].copy_from_slice(&op.dport_mask.to_be_bytes());
            }
        }
        Message::RuleDel(locs) => {
            for (o, loc) in b.chunks_exact_mut(RULE_DEL_OP_LEN).zip(locs) {
                o.copy_from_slice(&loc.to_be_bytes());
            }
        }
        Message::RssSet(op) => {
            b[0..4].copy_from_slice(&op.context.to_be_bytes());
            b[4] = op.flags;
            b[5] = op.hfunc;
            b[8..48].copy_from_slice(&op.key);
            for (o, q) in b[48..RSS_SET_OP_LEN]
                .chunks_exact_mut(2)
                .zip(op.indirection)
            {
                o.copy_from_slice(&q.to_be_bytes());
            }
        }
    }
    Ok(len)
}

/// Encodes `msg` as a whole Ethernet frame, replacing the contents of `out`.
pub fn encode(out: &mut Vec<u8>, meta: &FrameMeta, msg: &Message) -> Result<(), EncodeError> {
    out.clear();
    out.resize(encoded_len(msg), 0);
    let n = encode_into(out, meta, msg)?;
    out.truncate(n);
    Ok(())
}

/// Encodes the ACK of request `seq` (type `acked_type`) with per-op statuses,
/// from the device to `dst`.
pub fn encode_ack(
    out: &mut Vec<u8>,
    dst: [u8; 6],
    seq: u32,
    generation: u32,
    acked_type: MsgType,
    statuses: &[OpStatus],
) -> Result<(), EncodeError> {
    let msg = Message::Ack(Ack {
        acked_type: acked_type.code(),
        frame_status: 0,
        statuses: statuses.iter().map(|s| s.code()).collect(),
    });
    encode(
        out,
        &FrameMeta {
            dst,
            src: DEVICE_MAC,
            seq,
            generation,
        },
        &msg,
    )
}

/// Encodes the NAK for a malformed request (`count` = 0, `frame_status` =
/// the error's code), or returns `Ok(false)` and writes nothing when the
/// protocol says to stay silent.
pub fn encode_nak(
    out: &mut Vec<u8>,
    dst: [u8; 6],
    generation: u32,
    err: &DecodeError,
) -> Result<bool, EncodeError> {
    let Some(h) = err.nak_header() else {
        out.clear();
        return Ok(false);
    };
    let msg = Message::Ack(Ack {
        acked_type: h.msg_type,
        frame_status: err.kind.code(),
        statuses: Vec::new(),
    });
    encode(
        out,
        &FrameMeta {
            dst,
            src: DEVICE_MAC,
            seq: h.seq,
            generation,
        },
        &msg,
    )?;
    Ok(true)
}

/// Encodes CAPS answering HELLO `seq`.
pub fn encode_caps(
    out: &mut Vec<u8>,
    dst: [u8; 6],
    seq: u32,
    generation: u32,
    caps: &Caps,
) -> Result<(), EncodeError> {
    encode(
        out,
        &FrameMeta {
            dst,
            src: DEVICE_MAC,
            seq,
            generation,
        },
        &Message::Caps(*caps),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> FrameMeta {
        FrameMeta {
            dst: BROADCAST_MAC,
            src: [2, 0, 0, 0, 0, 1],
            seq: 7,
            generation: 3,
        }
    }

    #[test]
    fn limits() {
        assert_eq!(MAX_ADD_OPS, 33);
        assert_eq!(MAX_DEL_OPS, 371);
        let ops = vec![
            AddOp::new(
                1,
                0,
                &FlowKey::v4(L4Proto::Tcp, [1, 2, 3, 4].into(), 1, [5, 6, 7, 8].into(), 2)
            );
            33
        ];
        let msg = Message::Add(ops);
        assert_eq!(encoded_len(&msg), 14 + 16 + 33 * 44);
        assert!(encoded_len(&msg) <= MAX_FRAME_LEN);
    }

    #[test]
    fn hello_round_trip() {
        let msg = Message::Hello(Hello {
            driver_version: 1,
            nonce: 0xdead_beef,
            mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
        });
        let mut v = Vec::new();
        encode(&mut v, &meta(), &msg).unwrap();
        assert_eq!(v.len(), 46);
        let (h, m) = decode_frame(&v).unwrap();
        assert_eq!(h.seq, 7);
        assert_eq!(h.generation, 3);
        assert_eq!(m, msg);
        // The device side does not accept its own types.
        assert_eq!(
            decode_frame_driver(&v).unwrap_err().kind,
            FrameError::WrongDirection
        );
    }
}
