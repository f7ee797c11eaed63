//! Flow keys and the Ethernet frame parser.
//!
//! [`parse_frame`] classifies an Ethernet frame (no virtio header) into a
//! matchable [`FlowKey`] (TCP/UDP over IPv4/IPv6, not fragmented), an IP
//! 2-tuple ([`IpPair`]: fragments and other IP protocols) or non-IP traffic.
//! It never panics and never allocates; malformed or truncated frames return a
//! [`ParseError`] naming what was wrong.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// EtherType of an IEEE 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Length of an untagged Ethernet header.
pub const ETH_HLEN: usize = 14;

/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// Most IPv6 extension headers the parser walks before giving up.
pub const MAX_IPV6_EXT_HEADERS: usize = 8;

/// Address family of a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl IpFamily {
    /// The family's code on the management wire (4 or 6).
    pub const fn wire(self) -> u8 {
        match self {
            Self::Ipv4 => 4,
            Self::Ipv6 => 6,
        }
    }

    /// Decodes a wire family code (4 or 6).
    pub const fn from_wire(code: u8) -> Option<Self> {
        match code {
            4 => Some(Self::Ipv4),
            6 => Some(Self::Ipv6),
            _ => None,
        }
    }

    /// Number of meaningful address bytes (4 or 16).
    pub const fn addr_len(self) -> usize {
        match self {
            Self::Ipv4 => 4,
            Self::Ipv6 => 16,
        }
    }
}

/// Transport protocol of a matchable flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum L4Proto {
    /// TCP (IP protocol 6).
    Tcp,
    /// UDP (IP protocol 17).
    Udp,
}

impl L4Proto {
    /// The IP protocol number (6 or 17), also the management-wire code.
    pub const fn ip_proto(self) -> u8 {
        match self {
            Self::Tcp => IPPROTO_TCP,
            Self::Udp => IPPROTO_UDP,
        }
    }

    /// Decodes an IP protocol number; only TCP and UDP are matchable.
    pub const fn from_ip_proto(proto: u8) -> Option<Self> {
        match proto {
            IPPROTO_TCP => Some(Self::Tcp),
            IPPROTO_UDP => Some(Self::Udp),
            _ => None,
        }
    }

    /// Lower-case name: `tcp` or `udp`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

impl fmt::Display for L4Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An exact-match flow: family, L4 protocol, source and destination address
/// and port, as received by the guest (`src` is the remote peer).
///
/// IPv4 addresses are stored in the first four bytes of a 16-byte array with
/// zeros after, the same encoding as the management wire, so equality and
/// hashing never see stale bytes.
///
/// The key is held as the five little-endian 64-bit words it is hashed
/// and compared as, and every constructor writes whole words. A key built
/// on the per-frame path and read back at once (to hash it, then to
/// compare it) is then written and read with 8-byte accesses only: built
/// from bytes and 2-byte fields instead, its first word was read back
/// across several narrower stores, which the CPU cannot forward, and each
/// lookup waited for the stores before it (the frames' copies into guest
/// memory among them) to reach the cache.
///
/// Serialized (serde) as the structured object used by the trace:
/// `{"family":"ipv4","proto":"udp","src":"10.0.0.2","dst":"10.0.0.1","sport":5000,"dport":6000}`.
#[derive(Clone, Copy, Eq, Serialize, Deserialize)]
#[serde(into = "FlowRepr", try_from = "FlowRepr")]
pub struct FlowKey {
    /// `family as u8 | (proto as u8) << 8 | src_port << 16 | dst_port << 32`
    /// (bits 48..64 zero): see [`head`].
    head: u64,
    /// The source address's 16 wire bytes as two little-endian words.
    src: [u64; 2],
    /// The destination address, likewise.
    dst: [u64; 2],
}

/// A key's first word: family, protocol and ports.
#[inline]
const fn head(family: IpFamily, proto: L4Proto, src_port: u16, dst_port: u16) -> u64 {
    (family as u64) | ((proto as u64) << 8) | ((src_port as u64) << 16) | ((dst_port as u64) << 32)
}

/// 16 address bytes as two little-endian words.
#[inline]
fn addr_words(b: &[u8; 16]) -> [u64; 2] {
    let v = u128::from_le_bytes(*b);
    [v as u64, (v >> 64) as u64]
}

/// [`addr_words`] undone.
#[inline]
fn addr_bytes(w: [u64; 2]) -> [u8; 16] {
    (u128::from(w[0]) | (u128::from(w[1]) << 64)).to_le_bytes()
}

impl PartialOrd for FlowKey {
    fn partial_cmp(&self, o: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for FlowKey {
    /// Field by field: family, protocol, source port, destination port,
    /// source address bytes, destination address bytes.
    fn cmp(&self, o: &Self) -> core::cmp::Ordering {
        let f = |k: &Self| {
            (
                k.family(),
                k.proto(),
                k.src_port(),
                k.dst_port(),
                k.src_bytes(),
                k.dst_bytes(),
            )
        };
        f(self).cmp(&f(o))
    }
}

impl PartialEq for FlowKey {
    /// Branch-free: the five words XORed and ORed together.
    #[inline]
    fn eq(&self, o: &Self) -> bool {
        let (a, b) = (self.words(), o.words());
        (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) | (a[4] ^ b[4]) == 0
    }
}

impl core::hash::Hash for FlowKey {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        // Every field, as `eq` compares every field.
        state.write_u64(self.mix64());
    }
}

/// An IPv4 address's words: its four bytes are the low half of the first
/// (the wire encoding, zeros after).
#[inline]
fn v4_words(octets: [u8; 4]) -> [u64; 2] {
    [u64::from(u32::from_le_bytes(octets)), 0]
}

impl FlowKey {
    /// An IPv4 flow.
    pub fn v4(proto: L4Proto, src: Ipv4Addr, src_port: u16, dst: Ipv4Addr, dst_port: u16) -> Self {
        Self {
            head: head(IpFamily::Ipv4, proto, src_port, dst_port),
            src: v4_words(src.octets()),
            dst: v4_words(dst.octets()),
        }
    }

    /// An IPv6 flow.
    pub fn v6(proto: L4Proto, src: Ipv6Addr, src_port: u16, dst: Ipv6Addr, dst_port: u16) -> Self {
        Self {
            head: head(IpFamily::Ipv6, proto, src_port, dst_port),
            src: addr_words(&src.octets()),
            dst: addr_words(&dst.octets()),
        }
    }

    /// A flow from two addresses of the same family; `None` when the families differ.
    pub fn new(
        proto: L4Proto,
        src: IpAddr,
        src_port: u16,
        dst: IpAddr,
        dst_port: u16,
    ) -> Option<Self> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(Self::v4(proto, s, src_port, d, dst_port)),
            (IpAddr::V6(s), IpAddr::V6(d)) => Some(Self::v6(proto, s, src_port, d, dst_port)),
            _ => None,
        }
    }

    /// Builds a key from raw wire bytes. For IPv4, bytes 4..16 of each address
    /// must be zero; otherwise `None`.
    pub fn from_raw(
        family: IpFamily,
        proto: L4Proto,
        src: [u8; 16],
        src_port: u16,
        dst: [u8; 16],
        dst_port: u16,
    ) -> Option<Self> {
        if family == IpFamily::Ipv4
            && (src[4..].iter().any(|&b| b != 0) || dst[4..].iter().any(|&b| b != 0))
        {
            return None;
        }
        Some(Self {
            head: head(family, proto, src_port, dst_port),
            src: addr_words(&src),
            dst: addr_words(&dst),
        })
    }

    /// Address family.
    pub const fn family(&self) -> IpFamily {
        if self.head & 0xff == IpFamily::Ipv4 as u64 {
            IpFamily::Ipv4
        } else {
            IpFamily::Ipv6
        }
    }

    /// L4 protocol.
    pub const fn proto(&self) -> L4Proto {
        if (self.head >> 8) & 0xff == L4Proto::Tcp as u64 {
            L4Proto::Tcp
        } else {
            L4Proto::Udp
        }
    }

    /// Source port.
    pub const fn src_port(&self) -> u16 {
        (self.head >> 16) as u16
    }

    /// Destination port.
    pub const fn dst_port(&self) -> u16 {
        (self.head >> 32) as u16
    }

    /// Source address.
    pub fn src_ip(&self) -> IpAddr {
        addr_of(self.family(), &self.src_bytes())
    }

    /// Destination address.
    pub fn dst_ip(&self) -> IpAddr {
        addr_of(self.family(), &self.dst_bytes())
    }

    /// Source address in wire encoding (IPv4 in bytes 0..4, zeros after).
    pub fn src_bytes(&self) -> [u8; 16] {
        addr_bytes(self.src)
    }

    /// Destination address in wire encoding (IPv4 in bytes 0..4, zeros after).
    pub fn dst_bytes(&self) -> [u8; 16] {
        addr_bytes(self.dst)
    }

    /// An IPv4 key's source address octets ([`v4_words`] undone: the
    /// first four wire bytes, without building all sixteen).
    #[inline]
    pub(crate) fn src_v4(&self) -> [u8; 4] {
        (self.src[0] as u32).to_le_bytes()
    }

    /// An IPv4 key's destination address octets (see [`FlowKey::src_v4`]).
    #[inline]
    pub(crate) fn dst_v4(&self) -> [u8; 4] {
        (self.dst[0] as u32).to_le_bytes()
    }

    /// The same flow seen from the other side (addresses and ports swapped).
    #[must_use]
    pub const fn reversed(&self) -> Self {
        Self {
            head: head(
                self.family(),
                self.proto(),
                self.dst_port(),
                self.src_port(),
            ),
            src: self.dst,
            dst: self.src,
        }
    }

    /// The flow's 2-tuple (addresses only), as used for RSS of fragments.
    pub fn ip_pair(&self) -> IpPair {
        IpPair {
            family: self.family(),
            proto: self.proto().ip_proto(),
            fragment: false,
            src: self.src_bytes(),
            dst: self.dst_bytes(),
        }
    }

    /// A 64-bit mix of every field, for hash tables (not cryptographic: a
    /// folded 64x64->128 multiply, as in foldhash/wyhash).
    #[inline]
    pub(crate) fn mix64(&self) -> u64 {
        const K1: u64 = 0x243F_6A88_85A3_08D3;
        const K2: u64 = 0x1319_8A2E_0370_7344;
        let [head, src_lo, src_hi, dst_lo, dst_hi] = self.words();
        let lo = src_lo ^ src_hi.rotate_left(23) ^ K1;
        let hi = dst_lo ^ dst_hi.rotate_left(41) ^ head ^ K2;
        let r = u128::from(lo).wrapping_mul(u128::from(hi));
        (r as u64) ^ ((r >> 64) as u64)
    }

    /// The key as five little-endian words: family, protocol and ports
    /// ([`head`]), then each address as two halves. They are the fields
    /// themselves: comparing two keys is five XORs, not a field walk.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn words(&self) -> [u64; 5] {
        [
            self.head,
            self.src[0],
            self.src[1],
            self.dst[0],
            self.dst[1],
        ]
    }
}

fn addr_of(family: IpFamily, b: &[u8; 16]) -> IpAddr {
    match family {
        IpFamily::Ipv4 => IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
        IpFamily::Ipv6 => IpAddr::V6(Ipv6Addr::from(*b)),
    }
}

fn fmt_endpoint(
    f: &mut fmt::Formatter<'_>,
    family: IpFamily,
    b: &[u8; 16],
    port: u16,
) -> fmt::Result {
    match addr_of(family, b) {
        IpAddr::V4(a) => write!(f, "{a}:{port}"),
        IpAddr::V6(a) => write!(f, "[{a}]:{port}"),
    }
}

impl fmt::Display for FlowKey {
    /// `udp 10.0.0.2:5000 -> 10.0.0.1:6000`, `tcp [fe80::1]:80 -> [fe80::2]:1234`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.proto())?;
        fmt_endpoint(f, self.family(), &self.src_bytes(), self.src_port())?;
        f.write_str(" -> ")?;
        fmt_endpoint(f, self.family(), &self.dst_bytes(), self.dst_port())
    }
}

/// Error from parsing a [`FlowKey`] from text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowKeyParseError(String);

impl fmt::Display for FlowKeyParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad flow {:?}: expected `tcp|udp SRC:PORT -> DST:PORT` (IPv6 as [ADDR]:PORT)",
            self.0
        )
    }
}

impl std::error::Error for FlowKeyParseError {}

impl core::str::FromStr for FlowKey {
    type Err = FlowKeyParseError;

    /// Parses the `Display` form: `udp 10.0.0.2:5000 -> 10.0.0.1:6000`,
    /// `tcp [2001:db8::1]:80 -> [2001:db8::2]:1234`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || FlowKeyParseError(text.to_string());
        let mut it = text.split_whitespace();
        let (Some(proto), Some(src), Some("->"), Some(dst), None) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            return Err(err());
        };
        let proto = match proto.to_ascii_lowercase().as_str() {
            "tcp" => L4Proto::Tcp,
            "udp" => L4Proto::Udp,
            _ => return Err(err()),
        };
        let src: std::net::SocketAddr = src.parse().map_err(|_| err())?;
        let dst: std::net::SocketAddr = dst.parse().map_err(|_| err())?;
        FlowKey::new(proto, src.ip(), src.port(), dst.ip(), dst.port()).ok_or_else(err)
    }
}

impl fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FlowKey({self})")
    }
}

/// The serde shape of a [`FlowKey`] (also the trace's `flow` object).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRepr {
    /// `ipv4` or `ipv6`.
    pub family: IpFamily,
    /// `tcp` or `udp`.
    pub proto: L4Proto,
    /// Source address (remote peer).
    pub src: IpAddr,
    /// Destination address (the guest).
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
}

impl From<FlowKey> for FlowRepr {
    fn from(k: FlowKey) -> Self {
        Self {
            family: k.family(),
            proto: k.proto(),
            src: k.src_ip(),
            dst: k.dst_ip(),
            sport: k.src_port(),
            dport: k.dst_port(),
        }
    }
}

impl TryFrom<FlowRepr> for FlowKey {
    // A String: the only user is serde (`try_from = "FlowRepr"`), which makes
    // it the message of a deserialize error.
    type Error = String;

    fn try_from(r: FlowRepr) -> Result<Self, String> {
        let k = FlowKey::new(r.proto, r.src, r.sport, r.dst, r.dport)
            .ok_or_else(|| "src and dst are of different families".to_string())?;
        if k.family() != r.family {
            return Err(format!(
                "family {:?} does not match the addresses",
                r.family
            ));
        }
        Ok(k)
    }
}

/// An IP 2-tuple: what RSS hashes when there are no ports (fragments, other
/// IP protocols). Not matchable by a filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPair {
    family: IpFamily,
    proto: u8,
    fragment: bool,
    src: [u8; 16],
    dst: [u8; 16],
}

impl IpPair {
    /// Address family.
    pub const fn family(&self) -> IpFamily {
        self.family
    }

    /// The upper-layer protocol number (after IPv6 extension headers), as far
    /// as it could be determined; for a non-first fragment it is the
    /// fragmented protocol.
    pub const fn proto(&self) -> u8 {
        self.proto
    }

    /// Whether the packet is an IP fragment (any fragment, first included).
    pub const fn is_fragment(&self) -> bool {
        self.fragment
    }

    /// Source address.
    pub fn src_ip(&self) -> IpAddr {
        addr_of(self.family, &self.src)
    }

    /// Destination address.
    pub fn dst_ip(&self) -> IpAddr {
        addr_of(self.family, &self.dst)
    }

    /// Source address in wire encoding.
    pub const fn src_bytes(&self) -> &[u8; 16] {
        &self.src
    }

    /// Destination address in wire encoding.
    pub const fn dst_bytes(&self) -> &[u8; 16] {
        &self.dst
    }
}

/// Layer-3/4 classification of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L3 {
    /// TCP or UDP over IPv4/IPv6, not fragmented: matchable by a filter, RSS over the 4-tuple.
    Flow(FlowKey),
    /// IP without usable ports (fragment, other protocol): RSS over the 2-tuple.
    Ip(IpPair),
    /// Not IP (ARP, LLDP, management frames...).
    NonIp,
}

/// A parsed Ethernet frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedFrame {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// The 802.1Q tag control information (PCP/DEI/VID), when tagged.
    pub vlan_tci: Option<u16>,
    /// EtherType after the optional VLAN tag.
    pub ethertype: u16,
    /// Offset of the L3 header in the frame.
    pub l3_offset: usize,
    /// L3/L4 classification.
    pub l3: L3,
}

impl ParsedFrame {
    /// The matchable flow key, if any.
    pub const fn flow(&self) -> Option<&FlowKey> {
        match &self.l3 {
            L3::Flow(k) => Some(k),
            _ => None,
        }
    }
}

/// Which header a [`ParseError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// The Ethernet header.
    Ethernet,
    /// The 802.1Q tag.
    Vlan,
    /// The IPv4 header.
    Ipv4,
    /// The IPv6 fixed header.
    Ipv6,
    /// An IPv6 extension header.
    Ipv6Ext,
    /// The TCP header.
    Tcp,
    /// The UDP header.
    Udp,
}

impl Layer {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ethernet => "ethernet",
            Self::Vlan => "vlan",
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
            Self::Ipv6Ext => "ipv6_ext",
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// Why a frame could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParseError {
    /// The frame ends inside the named header.
    Truncated(Layer),
    /// The IP version nibble does not match the EtherType.
    BadIpVersion(u8),
    /// IPv4 IHL below 5 (value given).
    BadIhl(u8),
    /// IPv4 total length smaller than the header or larger than the frame.
    BadIpv4TotalLength(u16),
    /// IPv6 payload length larger than the frame, or zero (jumbograms are not supported).
    BadIpv6PayloadLength(u16),
    /// An IPv6 extension header runs past the payload.
    BadExtHeader(u8),
    /// More than [`MAX_IPV6_EXT_HEADERS`] IPv6 extension headers.
    TooManyExtHeaders,
    /// TCP data offset below 5 or past the IP payload (value given).
    BadTcpDataOffset(u8),
    /// UDP length below 8 or past the IP payload (value given).
    BadUdpLength(u16),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated(l) => write!(f, "frame truncated in the {} header", l.name()),
            Self::BadIpVersion(v) => write!(f, "IP version {v} does not match the EtherType"),
            Self::BadIhl(v) => write!(f, "IPv4 header length {v} is below 5"),
            Self::BadIpv4TotalLength(v) => write!(
                f,
                "IPv4 total length {v} is inconsistent with the header or the frame"
            ),
            Self::BadIpv6PayloadLength(v) => {
                write!(f, "IPv6 payload length {v} is zero or exceeds the frame")
            }
            Self::BadExtHeader(nh) => write!(f, "IPv6 extension header {nh} runs past the payload"),
            Self::TooManyExtHeaders => {
                write!(f, "more than {MAX_IPV6_EXT_HEADERS} IPv6 extension headers")
            }
            Self::BadTcpDataOffset(v) => write!(
                f,
                "TCP data offset {v} is below 5 or exceeds the IP payload"
            ),
            Self::BadUdpLength(v) => {
                write!(f, "UDP length {v} is below 8 or exceeds the IP payload")
            }
        }
    }
}

impl std::error::Error for ParseError {}

#[inline]
fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Parses an Ethernet frame (no virtio header). Never panics, never allocates.
#[inline]
pub fn parse_frame(frame: &[u8]) -> Result<ParsedFrame, ParseError> {
    if frame.len() < ETH_HLEN {
        return Err(ParseError::Truncated(Layer::Ethernet));
    }
    let mut dst_mac = [0u8; 6];
    let mut src_mac = [0u8; 6];
    dst_mac.copy_from_slice(&frame[0..6]);
    src_mac.copy_from_slice(&frame[6..12]);
    let mut ethertype = be16(frame, 12);
    let mut off = ETH_HLEN;
    let mut vlan_tci = None;
    if ethertype == ETHERTYPE_VLAN {
        if frame.len() < off + 4 {
            return Err(ParseError::Truncated(Layer::Vlan));
        }
        vlan_tci = Some(be16(frame, off));
        ethertype = be16(frame, off + 2);
        off += 4;
    }
    let l3 = match ethertype {
        ETHERTYPE_IPV4 => parse_ipv4(&frame[off..])?,
        ETHERTYPE_IPV6 => parse_ipv6(&frame[off..])?,
        _ => L3::NonIp,
    };
    Ok(ParsedFrame {
        dst_mac,
        src_mac,
        vlan_tci,
        ethertype,
        l3_offset: off,
        l3,
    })
}

/// The flow of an untagged, unfragmented IPv4 TCP or UDP frame, read
/// without building a [`ParsedFrame`]: the steering fast path for the
/// common frame. `Some(key)` exactly when [`parse_frame`] gives `Ok` with
/// no VLAN tag and `l3 == L3::Flow(key)` over IPv4 (the same checks);
/// `None` for every other frame, which the caller hands to
/// [`parse_frame`]. Never panics.
// Always inlined: the key then stays in registers on the per-frame path
// (out of line, it is returned through memory and read back at once).
#[allow(clippy::inline_always)]
#[inline(always)]
pub fn ipv4_flow(frame: &[u8]) -> Option<FlowKey> {
    let p = frame.get(ETH_HLEN..)?;
    if be16(frame, 12) != ETHERTYPE_IPV4 || p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let hlen = usize::from(p[0] & 0x0f) * 4;
    let total = usize::from(be16(p, 2));
    // (hlen >= 20 is IHL >= 5; total <= p.len() also bounds hlen.)
    if hlen < 20 || total < hlen || total > p.len() || be16(p, 6) & 0x3fff != 0 {
        return None;
    }
    let payload = &p[hlen..total];
    let proto = match p[9] {
        6 => {
            let doff = usize::from(*payload.get(12)? >> 4);
            if payload.len() < 20 || doff < 5 || doff * 4 > payload.len() {
                return None;
            }
            L4Proto::Tcp
        }
        17 => {
            if payload.len() < 8 {
                return None;
            }
            let len = usize::from(be16(payload, 4));
            if len < 8 || len > payload.len() {
                return None;
            }
            L4Proto::Udp
        }
        _ => return None,
    };
    // Whole words (see FlowKey). (p.len() >= 20: no bounds check.)
    Some(FlowKey {
        head: head(IpFamily::Ipv4, proto, be16(payload, 0), be16(payload, 2)),
        src: v4_words([p[12], p[13], p[14], p[15]]),
        dst: v4_words([p[16], p[17], p[18], p[19]]),
    })
}

/// Parses an IPv4 packet (starting at its header).
#[inline]
fn parse_ipv4(p: &[u8]) -> Result<L3, ParseError> {
    if p.len() < 20 {
        return Err(ParseError::Truncated(Layer::Ipv4));
    }
    let version = p[0] >> 4;
    if version != 4 {
        return Err(ParseError::BadIpVersion(version));
    }
    let ihl = p[0] & 0x0f;
    if ihl < 5 {
        return Err(ParseError::BadIhl(ihl));
    }
    let hlen = usize::from(ihl) * 4;
    if p.len() < hlen {
        return Err(ParseError::Truncated(Layer::Ipv4));
    }
    let total = be16(p, 2);
    if usize::from(total) < hlen || usize::from(total) > p.len() {
        return Err(ParseError::BadIpv4TotalLength(total));
    }
    let frag = be16(p, 6);
    let is_fragment = frag & 0x3fff != 0; // MF set or offset != 0
    let proto = p[9];
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src[..4].copy_from_slice(&p[12..16]);
    dst[..4].copy_from_slice(&p[16..20]);
    let pair = IpPair {
        family: IpFamily::Ipv4,
        proto,
        fragment: is_fragment,
        src,
        dst,
    };
    if is_fragment {
        return Ok(L3::Ip(pair));
    }
    l4(pair, &p[hlen..usize::from(total)])
}

/// Parses the L4 header of an unfragmented packet into a flow, or returns the pair.
#[inline]
fn l4(pair: IpPair, payload: &[u8]) -> Result<L3, ParseError> {
    let Some(proto) = L4Proto::from_ip_proto(pair.proto) else {
        return Ok(L3::Ip(pair));
    };
    match proto {
        L4Proto::Tcp => {
            if payload.len() < 20 {
                return Err(ParseError::Truncated(Layer::Tcp));
            }
            let doff = payload[12] >> 4;
            if doff < 5 || usize::from(doff) * 4 > payload.len() {
                return Err(ParseError::BadTcpDataOffset(doff));
            }
        }
        L4Proto::Udp => {
            if payload.len() < 8 {
                return Err(ParseError::Truncated(Layer::Udp));
            }
            let len = be16(payload, 4);
            if len < 8 || usize::from(len) > payload.len() {
                return Err(ParseError::BadUdpLength(len));
            }
        }
    }
    Ok(L3::Flow(FlowKey {
        head: head(pair.family, proto, be16(payload, 0), be16(payload, 2)),
        src: addr_words(&pair.src),
        dst: addr_words(&pair.dst),
    }))
}

/// Parses an IPv6 packet (starting at its fixed header), walking
/// hop-by-hop, routing, destination-options, AH and fragment headers.
fn parse_ipv6(p: &[u8]) -> Result<L3, ParseError> {
    if p.len() < 40 {
        return Err(ParseError::Truncated(Layer::Ipv6));
    }
    let version = p[0] >> 4;
    if version != 6 {
        return Err(ParseError::BadIpVersion(version));
    }
    let plen = be16(p, 4);
    if plen == 0 || usize::from(plen) > p.len() - 40 {
        return Err(ParseError::BadIpv6PayloadLength(plen));
    }
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&p[8..24]);
    dst.copy_from_slice(&p[24..40]);
    let payload = &p[40..40 + usize::from(plen)];
    let mut nh = p[6];
    let mut off = 0usize;
    let mut fragment = false;
    let mut walked = 0usize;
    loop {
        match nh {
            // hop-by-hop, routing, destination options: (len + 1) * 8 bytes
            0 | 43 | 60 | 51 => {
                walked += 1;
                if walked > MAX_IPV6_EXT_HEADERS {
                    return Err(ParseError::TooManyExtHeaders);
                }
                if payload.len() < off + 2 {
                    return Err(ParseError::Truncated(Layer::Ipv6Ext));
                }
                let len = if nh == 51 {
                    (usize::from(payload[off + 1]) + 2) * 4 // AH counts 4-byte words minus 2
                } else {
                    (usize::from(payload[off + 1]) + 1) * 8
                };
                if payload.len() < off + len {
                    return Err(ParseError::BadExtHeader(nh));
                }
                nh = payload[off];
                off += len;
            }
            // fragment header: 8 bytes
            44 => {
                walked += 1;
                if walked > MAX_IPV6_EXT_HEADERS {
                    return Err(ParseError::TooManyExtHeaders);
                }
                if payload.len() < off + 8 {
                    return Err(ParseError::Truncated(Layer::Ipv6Ext));
                }
                let fo = be16(payload, off + 2);
                // A fragment header with offset 0 and M clear is an "atomic
                // fragment" (RFC 6946): the whole datagram, ports usable.
                if fo & 0xfff9 != 0 {
                    fragment = true;
                }
                nh = payload[off];
                off += 8;
                if fragment {
                    break;
                }
            }
            _ => break,
        }
    }
    let pair = IpPair {
        family: IpFamily::Ipv6,
        proto: nh,
        fragment,
        src,
        dst,
    };
    if fragment {
        return Ok(L3::Ip(pair));
    }
    l4(pair, &payload[off..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_v4_v6() {
        let k = FlowKey::v4(
            L4Proto::Udp,
            Ipv4Addr::new(10, 0, 0, 2),
            5000,
            Ipv4Addr::new(10, 0, 0, 1),
            6000,
        );
        assert_eq!(k.to_string(), "udp 10.0.0.2:5000 -> 10.0.0.1:6000");
        let k6 = FlowKey::v6(
            L4Proto::Tcp,
            "fe80::1".parse().unwrap(),
            80,
            "fe80::2".parse().unwrap(),
            1234,
        );
        assert_eq!(k6.to_string(), "tcp [fe80::1]:80 -> [fe80::2]:1234");
    }

    #[test]
    fn keys_differing_in_any_one_field_are_different_flows() {
        // An IPv4 key and an IPv6 key with the same 16 address bytes
        // (1.2.3.4 and 102:304::), and each field changed alone: never
        // equal, and an index holding the base key finds none of them.
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&[1, 2, 3, 4]);
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&[5, 6, 7, 8]);
        let base = FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Tcp, a, 1, b, 2).unwrap();
        let others = [
            FlowKey::from_raw(IpFamily::Ipv6, L4Proto::Tcp, a, 1, b, 2).unwrap(),
            FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Udp, a, 1, b, 2).unwrap(),
            FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Tcp, b, 1, b, 2).unwrap(),
            FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Tcp, a, 3, b, 2).unwrap(),
            FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Tcp, a, 1, a, 2).unwrap(),
            FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Tcp, a, 1, b, 3).unwrap(),
        ];
        let mut index = crate::FlowIndex::new(16);
        index.insert(base, 7, 1).unwrap();
        assert_eq!(index.lookup(&base), Some((7, 1)));
        for k in others {
            assert_ne!(k, base, "{k:?}");
            assert_eq!(index.lookup(&k), None, "{k:?}");
        }
    }

    #[test]
    fn from_raw_rejects_v4_padding() {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&[1, 2, 3, 4]);
        assert!(FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Tcp, a, 1, a, 2).is_some());
        a[7] = 1;
        assert!(FlowKey::from_raw(IpFamily::Ipv4, L4Proto::Tcp, a, 1, [0; 16], 2).is_none());
        assert!(FlowKey::from_raw(IpFamily::Ipv6, L4Proto::Tcp, a, 1, [0; 16], 2).is_some());
    }

    /// The five words are the documented layout whichever way a key is
    /// built (the index's hash and equality read them; the per-frame path
    /// builds keys with `ipv4_flow`, the rest with the constructors and
    /// `parse_frame`), and keys sort field by field, addresses last, as
    /// when the key was a struct of those fields in that order.
    #[test]
    fn words_are_the_fields_and_keys_sort_field_by_field() {
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
        let expect = |k: &FlowKey| {
            let (s, d) = (k.src_bytes(), k.dst_bytes());
            [
                (k.family() as u64)
                    | ((k.proto() as u64) << 8)
                    | (u64::from(k.src_port()) << 16)
                    | (u64::from(k.dst_port()) << 32),
                word(&s[..8]),
                word(&s[8..]),
                word(&d[..8]),
                word(&d[8..]),
            ]
        };
        let v4 = FlowKey::v4(
            L4Proto::Udp,
            Ipv4Addr::new(10, 0, 0, 2),
            5000,
            Ipv4Addr::new(192, 168, 7, 1),
            6000,
        );
        assert_eq!(
            v4.words(),
            [0x1770_1388_0100, 0x0200_000a, 0, 0x0107_a8c0, 0]
        );
        // The same flow from a frame, by both parsers.
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[23] = IPPROTO_UDP;
        f[26..30].copy_from_slice(&[10, 0, 0, 2]);
        f[30..34].copy_from_slice(&[192, 168, 7, 1]);
        f[34..36].copy_from_slice(&5000u16.to_be_bytes());
        f[36..38].copy_from_slice(&6000u16.to_be_bytes());
        f[38..40].copy_from_slice(&8u16.to_be_bytes());
        let fast = ipv4_flow(&f).unwrap();
        assert_eq!(fast.words(), v4.words());
        assert_eq!(parse_frame(&f).unwrap().l3, L3::Flow(v4));
        let v6 = FlowKey::v6(
            L4Proto::Tcp,
            "2001:db8::1".parse().unwrap(),
            80,
            "fe80::2".parse().unwrap(),
            443,
        );
        assert_eq!(
            v6.words(),
            [
                0x01bb_0050_0001,
                0xb80d_0120,
                0x0100_0000_0000_0000,
                0x80fe,
                0x0200_0000_0000_0000
            ]
        );
        let mut keys = vec![v4, v6, v4.reversed(), v6.reversed()];
        for k in [v4, v6] {
            for (sp, dp) in [(1, 65535), (65535, 1), (0, 0)] {
                keys.push(
                    FlowKey::from_raw(
                        k.family(),
                        L4Proto::Tcp,
                        k.src_bytes(),
                        sp,
                        k.dst_bytes(),
                        dp,
                    )
                    .unwrap(),
                );
            }
        }
        for k in &keys {
            assert_eq!(k.words(), expect(k), "{k}");
        }
        let fields = |k: &FlowKey| {
            (
                k.family(),
                k.proto(),
                k.src_port(),
                k.dst_port(),
                k.src_bytes(),
                k.dst_bytes(),
            )
        };
        let mut by_key = keys.clone();
        by_key.sort();
        let mut by_fields = keys;
        by_fields.sort_by_key(fields);
        assert_eq!(by_key, by_fields);
    }

    #[test]
    fn from_str_round_trips_display() {
        for text in [
            "udp 10.0.0.2:5000 -> 10.0.0.1:6000",
            "tcp [fe80::1]:80 -> [fe80::2]:1234",
        ] {
            let k: FlowKey = text.parse().unwrap();
            assert_eq!(k.to_string(), text);
        }
        for bad in [
            "",
            "udp 10.0.0.2:5000 10.0.0.1:6000",
            "icmp 10.0.0.2:5000 -> 10.0.0.1:6000",
            "udp 10.0.0.2 -> 10.0.0.1:6000",
            "udp 10.0.0.2:5000 -> [::1]:6000",
            "udp 10.0.0.2:5000 -> 10.0.0.1:6000 extra",
        ] {
            assert!(bad.parse::<FlowKey>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn new_rejects_mixed_families() {
        assert!(FlowKey::new(
            L4Proto::Tcp,
            "1.2.3.4".parse().unwrap(),
            1,
            "::1".parse().unwrap(),
            2
        )
        .is_none());
    }

    /// Equality, hashing and order read the key as words; they must agree
    /// with the fields: every field alone makes a key differ (a word
    /// left out of `words`, or a shift that makes two fields overlap, would
    /// make two different flows one), and equal keys hash alike.
    #[test]
    fn equality_hash_and_order_follow_every_field() {
        use std::hash::BuildHasher;
        let h = std::collections::hash_map::RandomState::new();
        let key = |family, proto, src: u128, sport, dst: u128, dport| {
            FlowKey::from_raw(
                family,
                proto,
                src.to_be_bytes(),
                sport,
                dst.to_be_bytes(),
                dport,
            )
            .unwrap()
        };
        let (v6, udp, tcp) = (IpFamily::Ipv6, L4Proto::Udp, L4Proto::Tcp);
        let (a, b) = (0x2001_0db8 << 96 | 1, 0x2001_0db8 << 96 | 2);
        let base = key(v6, udp, a, 1000, b, 2000);
        let mut others = vec![
            key(v6, tcp, a, 1000, b, 2000),
            key(v6, udp, a, 1001, b, 2000),
            key(v6, udp, a, 1000, b, 2001),
            // Ports swapped: the head word must keep them apart.
            key(v6, udp, a, 2000, b, 1000),
            base.reversed(),
            // The same bytes, told apart by the family alone.
            key(IpFamily::Ipv4, udp, 0, 1000, 0, 2000),
            key(v6, udp, 0, 1000, 0, 2000),
        ];
        // Each address byte alone, in either address.
        for i in 0..16 {
            let bit = 1u128 << (8 * i);
            others.push(key(v6, udp, a ^ bit, 1000, b, 2000));
            others.push(key(v6, udp, a, 1000, b ^ bit, 2000));
        }
        for (n, o) in others.iter().enumerate() {
            assert_ne!(base, *o, "#{n}: {o}");
            assert_ne!(base.cmp(o), std::cmp::Ordering::Equal, "#{n}: {o}");
            for p in &others[n + 1..] {
                assert_ne!(o, p, "{o} / {p}");
            }
            let same = key(
                o.family(),
                o.proto(),
                u128::from_be_bytes(o.src_bytes()),
                o.src_port(),
                u128::from_be_bytes(o.dst_bytes()),
                o.dst_port(),
            );
            assert_eq!(same, *o);
            assert_eq!(h.hash_one(same), h.hash_one(o));
        }
    }
}
