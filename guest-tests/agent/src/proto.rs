//! The agent protocol: newline-delimited JSON over the `vnic.agent`
//! virtio-serial port.
//!
//! The harness sends one [`Envelope`] per line, the agent answers with one
//! [`Reply`] per line carrying the same `id`. Requests are handled in order;
//! workloads run in the background and are observed with their `*_stats`
//! commands, so a request never blocks for longer than its own timeout.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Name of the virtio-serial port the agent listens on.
pub const PORT_NAME: &str = "vnic.agent";

/// Version of this protocol; `hello` reports it, the harness checks it.
pub const PROTOCOL_VERSION: u32 = 3;

/// One request line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub id: u64,
    #[serde(flatten)]
    pub req: Request,
}

/// One reply line. Exactly one of `result` / `error` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    pub id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A request. Serialized as `{"cmd": "<snake_case name>", ...fields}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Answers [`Info`].
    Hello,
    /// Bring `lo` and `ifname` up, set `addr/prefix` on `ifname`.
    NetSetup {
        ifname: String,
        addr: String,
        prefix: u8,
        /// Also this IPv6 address (duplicate address detection off, so it
        /// is usable at once), with `prefix6`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        addr6: Option<String>,
        #[serde(default)]
        prefix6: u8,
    },
    /// Write `value` to a file under /proc/sys or /sys.
    WriteFile { path: String, value: String },
    /// Read a file (proc, sys, debugfs). Answers a string.
    ReadFile { path: String },
    /// Read every regular file under a directory, recursively (debugfs
    /// counter directories). Answers `{relative path: content}`.
    ReadDir { path: String },
    /// RFS set-up: net.core.rps_sock_flow_entries, every rx queue's
    /// rps_flow_cnt and (optionally) rps_cpus. Answers what was written.
    Rfs {
        ifname: String,
        sock_flow_entries: u32,
        flow_cnt: u32,
        #[serde(default)]
        rps_cpus: Option<String>,
    },
    /// Set an ethtool feature by its string name (e.g. `rx-ntuple-filter`)
    /// with ETHTOOL_SFEATURES. Answers the feature's active state after.
    SetFeature {
        ifname: String,
        feature: String,
        on: bool,
    },
    /// `ethtool -L IFNAME combined N` (ETHTOOL_SCHANNELS). Answers the
    /// combined count read back.
    SetChannels { ifname: String, combined: u32 },
    /// `ethtool -N IFNAME flow-type ... action Q|-1 [loc L]`
    /// (ETHTOOL_SRXCLSRLINS; `loc` None: RX_CLS_LOC_ANY, the driver picks
    /// one). Answers a [`RuleOp`]: the location the kernel copied back, or
    /// the call's errno (a refusal is an answer, not an error).
    RuleInsert {
        ifname: String,
        rule: RuleSpec,
        #[serde(default)]
        loc: Option<u32>,
    },
    /// `ethtool -N IFNAME delete L` (ETHTOOL_SRXCLSRLDEL). Answers a
    /// [`RuleOp`] (`loc` the one asked for when it succeeded).
    RuleDelete { ifname: String, loc: u32 },
    /// `ethtool -n IFNAME`: GRXCLSRLCNT, GRXCLSRLALL, then GRXCLSRULE for
    /// each location. Answers a [`RuleList`].
    RuleList { ifname: String },
    /// The NAPI id of each rx queue (netdev generic netlink; see
    /// [`RxQueueNapi`]). Answers an [`RxQueueNapi`].
    RxQueueNapi { ifname: String },
    /// finit_module(path, params).
    ModuleLoad {
        path: String,
        #[serde(default)]
        params: String,
    },
    /// delete_module(name).
    ModuleUnload { name: String },
    /// delete_module(name) while another thread measures how long an
    /// operation that needs RTNL waits: every `every_ms`, an ethtool
    /// ETHTOOL_GLINK ioctl on `ifname` (the kernel runs every ethtool ioctl
    /// under RTNL) and, with `toggle_ntuple`, rx-ntuple-filter off and on
    /// again. Answers [`ProbedUnload`].
    ProbedUnload {
        name: String,
        ifname: String,
        every_ms: u64,
        #[serde(default)]
        toggle_ntuple: bool,
    },
    /// ICMP echo to `addr` (raw socket). Answers [`PingResult`].
    /// ICMP (IPv4 address) or ICMPv6 (IPv6 address) echo.
    Ping {
        addr: String,
        count: u32,
        timeout_ms: u64,
    },
    /// Start a UDP workload (replaces none: at most one runs). Answers the
    /// number of flows started.
    UdpStart(UdpSpec),
    /// Move receivers: each (flow index, new cpu).
    UdpMigrate { moves: Vec<(usize, usize)> },
    /// Cumulative per-flow counters. Answers [`UdpStats`].
    UdpStats,
    /// Stop the UDP workload, join its threads. Answers the final [`UdpStats`].
    UdpStop,
    /// Start a TCP server: accepted connections get receivers pinned to
    /// `cpus[i % cpus.len()]` in accept order.
    TcpStart {
        port: u16,
        cpus: Vec<usize>,
        /// Echo what is read (request/response workloads).
        #[serde(default)]
        echo: bool,
    },
    /// Per-connection counters of the TCP server. Answers [`TcpStats`].
    TcpStats,
    /// Stop the TCP server and its connections. Answers final [`TcpStats`].
    TcpStop,
    /// Kernel log records with sequence number >= `since`. Answers [`Kmsg`].
    Dmesg {
        #[serde(default)]
        since: u64,
    },
    /// Run a program from the initramfs (busybox applets). Answers [`ExecResult`].
    Exec { argv: Vec<String>, timeout_ms: u64 },
    /// Start sending raw Ethernet frames from an AF_PACKET socket in the
    /// background (the hostile-guest tool: malformed management frames).
    /// At most one such job runs. Answers null.
    RawTxStart(RawTxSpec),
    /// Wait up to `timeout_ms` for the raw-frame job to finish (its linger
    /// included); answers [`RawTxReport`] (`done` false on timeout: the job
    /// keeps running). A finished job is cleared by this call.
    RawTxWait { timeout_ms: u64 },
    /// Sleep (lets the harness time phases from inside the guest).
    Sleep { ms: u64 },
    /// One thread pinned to each online CPU, each reporting from that CPU;
    /// waits up to `timeout_ms` for them. Answers [`CpuProbe`]. A CPU that
    /// never runs the thread pinned to it is stuck (its thread stays
    /// blocked in the migration to it; it is left behind).
    CpuProbe { timeout_ms: u64 },
    /// sync + reboot(RB_POWER_OFF). Answered before powering off.
    Poweroff,
}

/// An ntuple rule's flow type (ethtool's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleFlow {
    Tcp4,
    Udp4,
    /// Any IPv4 packet (`IPV4_USER_FLOW`): addresses and the protocol.
    Ip4,
    Tcp6,
    Udp6,
    /// Any IPv6 packet (`IPV6_USER_FLOW`).
    Ip6,
}

/// An address and its mask (a mask bit set: the packet's bit must equal
/// the address's; the kernel API's `m_u`, not ethtool's inverted `m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AddrMask {
    pub addr: std::net::IpAddr,
    pub mask: std::net::IpAddr,
}

/// A port and its mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PortMask {
    pub port: u16,
    pub mask: u16,
}

/// The upper-layer protocol of an `ip4`/`ip6` rule and its mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProtoMask {
    pub proto: u8,
    pub mask: u8,
}

/// What a rule does with the packets it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    /// To this rx queue (`action N`).
    Queue(u32),
    /// Dropped (`action -1`, RX_CLS_FLOW_DISC).
    Drop,
}

/// One ntuple rule (`struct ethtool_rx_flow_spec` without location):
/// a field that is None matches anything (value and mask zero). Ports on
/// tcp/udp flow types only, `l4_proto` on ip4/ip6 only
/// (`vnic_agent::ntuple` encodes it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RuleSpec {
    pub flow: RuleFlow,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<AddrMask>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<AddrMask>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<PortMask>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<PortMask>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l4_proto: Option<ProtoMask>,
    pub action: RuleAction,
}

/// The answer to [`Request::RuleInsert`] and [`Request::RuleDelete`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleOp {
    /// The rule's location (the kernel's copy-back for an insert); None
    /// when the call failed.
    pub loc: Option<u32>,
    /// The ioctl's errno, 0 when it succeeded.
    pub errno: i32,
    /// How long the ioctl took (the driver waits for the device's ACK).
    pub us: u64,
}

/// The answer to [`Request::RuleList`]: what `ethtool -n` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleList {
    /// GRXCLSRLCNT's `data`: the table size, with RX_CLS_LOC_SPECIAL
    /// (0x8000_0000) when the driver picks locations itself.
    pub size: u64,
    /// GRXCLSRLCNT's `rule_cnt`.
    pub count: u32,
    /// Each location GRXCLSRLALL named, with GRXCLSRULE's rule, in order.
    pub rules: Vec<(u32, RuleSpec)>,
}

/// What `hello` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Info {
    pub protocol: u32,
    pub kernel: String,
    pub cpus: usize,
    pub interfaces: Vec<Iface>,
    pub uptime_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Iface {
    pub name: String,
    pub mac: String,
    pub mtu: u32,
    pub up: bool,
    pub driver: String,
    pub rx_queues: usize,
    pub tx_queues: usize,
}

/// What [`Request::ProbedUnload`] saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbedUnload {
    /// How long delete_module took.
    pub unload_ms: f64,
    /// Its error, if it failed.
    pub unload_error: Option<String>,
    /// RTNL probes made while it ran (and one right after).
    pub probes: u64,
    /// The slowest probe.
    pub max_probe_ms: f64,
    /// Probes slower than 100 ms.
    pub slow_probes: u64,
    /// NTUPLE off+on rounds done while it ran.
    pub ntuple_toggles: u64,
    /// Probe or toggle errors (first few).
    pub errors: Vec<String>,
}

/// The answer to [`Request::CpuProbe`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CpuProbe {
    /// Online CPUs probed (0..cpus).
    pub cpus: usize,
    /// CPUs whose pinned thread ran on them within the timeout.
    pub ran: Vec<usize>,
    /// CPUs whose pinned thread did not (stuck, or not running it).
    pub missing: Vec<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PingResult {
    pub sent: u32,
    pub received: u32,
    pub rtt_us: Vec<u64>,
}

/// A UDP workload: K connected sockets, one receiver thread per socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UdpSpec {
    /// The peer the sockets connect to (the device's gen peer).
    pub peer: String,
    pub flows: Vec<UdpFlowSpec>,
    /// Connect each socket to peer:peer_port (default). RFS records flows
    /// only for connected UDP sockets; unconnected ones receive from any
    /// source (RPS experiments with many source addresses).
    #[serde(default = "yes")]
    pub connect: bool,
    /// Send every datagram received back to the peer (request/response:
    /// the generator times the round trip of its stamped datagrams).
    /// Needs `connect`.
    #[serde(default)]
    pub echo: bool,
    /// With `echo`: send back every Nth datagram of each flow only (0 or
    /// 1: all), so that a high-rate workload is timed on a sample.
    #[serde(default)]
    pub echo_every: u32,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UdpFlowSpec {
    pub local_port: u16,
    pub peer_port: u16,
    /// CPU the receiver thread is pinned to.
    pub cpu: usize,
    /// This flow's peer address, instead of the spec's `peer` (one workload
    /// may mix IPv4 and IPv6 flows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
}

/// Cumulative counters of one flow's receiver.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FlowCounters {
    pub local_port: u16,
    pub peer_port: u16,
    /// CPU the receiver is currently pinned to.
    pub cpu: usize,
    /// Packets received.
    pub packets: u64,
    /// Packets after which SO_INCOMING_CPU equalled the receiver's CPU.
    pub on_cpu: u64,
    /// Packets per SO_INCOMING_CPU value (index = CPU).
    pub by_cpu: Vec<u64>,
    /// recv() calls made while the thread was not on its CPU (must stay 0).
    pub off_cpu_recv: u64,
    /// Packets per SO_INCOMING_NAPI_ID value read after each receive:
    /// (napi id, packets), the NAPI instance (so the rx queue, see
    /// [`RxQueueNapi`]) that delivered them, as the guest kernel saw it.
    #[serde(default)]
    pub by_napi: Vec<(u32, u64)>,
    /// Packets whose NAPI id could not be read or did not fit the table.
    #[serde(default)]
    pub napi_unknown: u64,
    /// Receive errors other than timeouts.
    pub errors: u64,
    /// Datagrams sent back (`echo`), and sends that failed.
    #[serde(default)]
    pub echoed: u64,
    #[serde(default)]
    pub echo_errors: u64,
    /// What the datagrams carried (`crate::payload`): sequence numbers,
    /// tags and fill, checked on every datagram.
    #[serde(default)]
    pub delivery: Delivery,
    /// The last late datagrams (`crate::payload::LATE_LOG`), oldest first.
    #[serde(default)]
    pub late: Vec<Late>,
    /// Per NAPI id of `by_napi`: the earliest and the latest send time
    /// (the generator's stamp) of the intact datagrams counted under it:
    /// (napi id, first sent, last sent).
    #[serde(default)]
    pub napi_sent: Vec<(u32, u64, u64)>,
    /// The flow's way through the NAPI instances, in arrival order: one
    /// segment per run of datagrams under the same NAPI id, with the first
    /// and last send stamp and the datagrams of the run (the newest
    /// [`PATH_SEGMENTS`] runs).
    #[serde(default)]
    pub path: Vec<PathSeg>,
}

/// Runs of a flow's path kept (`FlowCounters::path`).
pub const PATH_SEGMENTS: usize = 64;

/// One run of a flow's datagrams under one NAPI id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathSeg {
    pub napi: u32,
    pub first: u64,
    pub last: u64,
    pub n: u64,
}

/// One flow's datagrams accounted by what they carry (cumulative since
/// `udp_start`; see [`crate::payload::SeqTrack`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Highest sequence number seen + 1.
    pub next: u64,
    pub distinct: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Tag or fill wrong.
    pub corrupted: u64,
    /// Too short to carry a sequence head.
    pub short: u64,
    /// Of `corrupted`: head and fill intact, but not as long as the head
    /// says (cut short or grown).
    #[serde(default)]
    pub bad_len: u64,
}

/// A late datagram (one that arrived after a higher sequence number of its
/// flow), with the datagram that had the highest sequence number when it
/// arrived: sequence numbers and send times (the generator's stamp, the
/// daemon's clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Late {
    pub seq: u64,
    pub sent: u64,
    pub over_seq: u64,
    pub over_sent: u64,
}

impl Delivery {
    /// Sequence numbers below the highest seen that never arrived.
    pub fn lost(&self) -> u64 {
        self.next.saturating_sub(self.distinct)
    }
}

/// Which NAPI instance serves each rx queue: `napi[q]` is rx queue `q`'s
/// NAPI id. `source`: `queue-get` (the kernel's netdev netlink QUEUE_GET
/// names it: exact) or `napi-order` (kernels whose driver does not
/// register it, e.g. 6.12's virtio_net: the netdev's NAPI ids in ascending
/// order, which is the order virtio_net created its rx NAPIs in).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RxQueueNapi {
    pub source: String,
    pub napi: Vec<u32>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UdpStats {
    pub running: bool,
    pub elapsed_ms: u64,
    pub flows: Vec<FlowCounters>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TcpConnCounters {
    pub peer: String,
    pub local_port: u16,
    pub cpu: usize,
    pub reads: u64,
    pub bytes: u64,
    pub on_cpu: u64,
    pub by_cpu: Vec<u64>,
    /// Reads per SO_INCOMING_NAPI_ID (see [`FlowCounters::by_napi`]).
    #[serde(default)]
    pub by_napi: Vec<(u32, u64)>,
    pub closed: bool,
    /// Bytes read that differ from the test stream's pattern
    /// ([`crate::payload::stream_byte`], keyed by the peer's port), and the
    /// stream offset of the first. Meaningful only for a client that sends
    /// that pattern (tcp-tap's).
    #[serde(default)]
    pub pattern_errors: u64,
    #[serde(default)]
    pub first_bad: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TcpStats {
    pub running: bool,
    pub accepted: u64,
    pub conns: Vec<TcpConnCounters>,
}

/// A raw-frame job: `rounds` times every frame of `frames` in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RawTxSpec {
    pub ifname: String,
    /// Whole Ethernet frames (header included), hex-encoded.
    pub frames: Vec<String>,
    pub rounds: u32,
    /// Frames per second over all frames; 0 = as fast as the socket takes them.
    pub pps: u32,
    /// Pin the sending thread (one CPU = one tx queue via XPS, so the
    /// device sees the frames in order).
    #[serde(default)]
    pub cpu: Option<usize>,
    /// Also capture every frame of this EtherType received on `ifname`
    /// while sending and for `linger_ms` after (at most 4096 frames).
    #[serde(default)]
    pub capture_ethertype: Option<u16>,
    #[serde(default)]
    pub linger_ms: u64,
}

/// What a raw-frame job did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RawTxReport {
    pub done: bool,
    /// Frames handed to the kernel, per entry of `frames` (a frame whose
    /// send failed with ENOBUFS/EAGAIN is retried, not counted twice).
    pub sent: Vec<u64>,
    /// Sends retried after ENOBUFS/EAGAIN.
    pub retries: u64,
    /// Sends that failed otherwise (first few messages).
    pub errors: Vec<String>,
    pub failed: u64,
    pub elapsed_ms: u64,
    /// Captured frames, hex-encoded, in arrival order.
    pub captured: Vec<String>,
}

/// Lower-case hex of `b`.
pub fn hex_encode(b: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// Why [`hex_decode`] refused a string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("odd-length hex string ({0} chars)")]
    OddLength(usize),
    /// The two bytes at offset `at` are not two hex digits.
    #[error("bad hex at {at}: {digits:?} is not a hex byte")]
    BadByte { at: usize, digits: String },
}

/// Bytes of a hex string (even length, no separators).
pub fn hex_decode(s: &str) -> Result<Vec<u8>, HexError> {
    if !s.len().is_multiple_of(2) {
        return Err(HexError::OddLength(s.len()));
    }
    // Byte pairs, not `&s[i..i + 2]`: a non-ASCII character would put a
    // slice boundary inside it (a panic).
    let digit = |b: u8| char::from(b).to_digit(16);
    s.as_bytes()
        .chunks_exact(2)
        .enumerate()
        .map(|(k, pair)| match (digit(pair[0]), digit(pair[1])) {
            (Some(hi), Some(lo)) => Ok((hi << 4 | lo) as u8),
            _ => Err(HexError::BadByte {
                at: 2 * k,
                digits: String::from_utf8_lossy(pair).into_owned(),
            }),
        })
        .collect()
}

/// One /dev/kmsg record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KmsgRecord {
    pub seq: u64,
    pub level: u8,
    pub ts_us: u64,
    pub msg: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Kmsg {
    pub records: Vec<KmsgRecord>,
    /// Records lost to ring-buffer overwrite since `since` (EPIPE on read).
    pub lost: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecResult {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

/// Files read by `read_dir`.
pub type DirContents = BTreeMap<String, String>;

#[cfg(test)]
mod tests {
    use super::{hex_decode, hex_encode, HexError};

    #[test]
    fn hex_round_trip_and_refusals() {
        let b = [0u8, 1, 0x7f, 0x80, 0xab, 0xff];
        assert_eq!(hex_decode(&hex_encode(&b)).unwrap(), b);
        assert_eq!(hex_decode("ABcd").unwrap(), [0xab, 0xcd]);
        assert_eq!(hex_decode("abc"), Err(HexError::OddLength(3)));
        let e = hex_decode("00zz").unwrap_err();
        assert_eq!(e.to_string(), "bad hex at 2: \"zz\" is not a hex byte");
        // Signs and non-ASCII text are refused, not sliced.
        assert!(hex_decode("+f").is_err());
        assert!(matches!(
            hex_decode("a\u{e9}0"),
            Err(HexError::BadByte { at: 0, .. })
        ));
    }
}
