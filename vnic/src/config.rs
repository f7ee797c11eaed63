//! Daemon configuration and the parsers for option values (used by clap and
//! by the control socket's `set`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

/// An option or knob value that does not parse or is out of range; the
/// message names the value and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(pub String);

fn invalid(msg: String) -> InvalidValue {
    InvalidValue(msg)
}

/// The far side of the NIC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerKind {
    /// The built-in generator / responder / sink.
    Gen,
    /// A multi-queue tap device.
    Tap(String),
}

/// Everything `vnic serve` needs.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub socket: PathBuf,
    pub ctl: PathBuf,
    pub queues: u16,
    pub max_queue_size: u16,
    pub peer: PeerKind,
    pub gen_mac: [u8; 6],
    pub gen_ip: Ipv4Addr,
    pub gen_ip6: Ipv6Addr,
    pub guest_ip: Ipv4Addr,
    pub table_capacity: u32,
    pub rule_locations: u32,
    pub buckets: Option<(u32, u16)>,
    pub program_latency: Duration,
    pub add_fail_rate: f64,
    pub mgmt_loss_rate: f64,
    pub seed: u64,
    pub trace: Option<PathBuf>,
    /// Start with the `misroute` fault on.
    pub misroute: bool,
    /// Path fault rates at start (`misroute_rate`, `drop_rate`,
    /// `corrupt_rate`, `bad_csum_rate`, `truncate_rate`, `reorder_rate`;
    /// `misroute` sets the first to 1).
    pub fault_rates: [f64; 6],
    /// `--group`: sockets 0660 owned by this gid, whose members are served
    /// on the control socket.
    pub group: Option<u32>,
    /// `--preload-filters` / `--preload-match` (benchmarks).
    pub preload: Preload,
    /// `--poll-us` / `--poll-fixed`: how a worker busy-polls its tx ring
    /// after the last chain.
    pub poll: PollCfg,
    /// `--steer none`: no parse and no lookup; a frame goes to the rx
    /// queue of the worker that has it (benchmarks of the data path).
    pub steer_none: bool,
    /// `--rx-stores`: how the rx stage writes frames into the guest's
    /// buffers.
    pub rx_stores: RxStores,
}

/// `--rx-stores`: streamed (non-temporal) or plain stores of frame bytes
/// into the guest's rx buffers, or a per-worker choice between the two
/// from the frames each delivers per second. The guest sees the same
/// bytes before the same used index in every mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxStores {
    /// Each worker keeps the mode that delivers more frames a second
    /// (`virtq::stores::StoreChoice`).
    Auto,
    /// Always streamed.
    Stream,
    /// Always plain.
    Plain,
}

/// `--rx-stores`: `auto`, `stream` or `plain`.
pub(crate) fn parse_rx_stores(s: &str) -> Result<RxStores, String> {
    match s {
        "auto" => Ok(RxStores::Auto),
        "stream" => Ok(RxStores::Stream),
        "plain" => Ok(RxStores::Plain),
        _ => Err(format!("{s:?}: one of auto, stream, plain")),
    }
}

/// How a worker waits for more tx chains before it sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PollCfg {
    /// `--poll-us`: the longest spin (zero: never spin).
    pub(crate) max: Duration,
    /// `--poll-fixed`: spin the whole of `max` every time the ring runs
    /// dry, instead of a window adapted to the gaps the worker sees.
    pub(crate) fixed: bool,
}

/// `--poll-us`: 0..=1000 microseconds.
pub(crate) fn parse_poll_us(s: &str) -> Result<u64, String> {
    let v: u64 = s
        .parse()
        .map_err(|_| format!("{s:?}: a whole number of microseconds"))?;
    if v > 1000 {
        return Err(format!("{v}: at most 1000 (1 ms)"));
    }
    Ok(v)
}

/// Filters installed into the table each time the device comes up
/// (`vnic serve --preload-filters N --preload-match M`), for benchmark
/// frontends that cannot send management frames (DPDK's virtio-user).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Preload {
    /// How many (ids `0..filters`); 0: none.
    pub filters: u32,
    /// The first `matching` of them match the generator's default flows.
    pub matching: u32,
}

impl Preload {
    /// Source port of the generator's first flow and the destination
    /// port of all (its defaults, CTL.md): matching filter `i` is for
    /// sport `SPORT + i`.
    pub(crate) const SPORT: u16 = 10000;
    pub(crate) const DPORT: u16 = 5001;
    /// Most matching filters: sports `SPORT..=65535`.
    pub(crate) const MAX_MATCHING: u32 = 65536 - Self::SPORT as u32;

    /// Checks the pair against the table capacity; the message names the
    /// options and the limit.
    pub(crate) fn check(self, table_capacity: u32) -> Result<(), InvalidValue> {
        if self.filters > table_capacity {
            return Err(invalid(format!(
                "--preload-filters {} exceeds --table-capacity {table_capacity}",
                self.filters
            )));
        }
        if self.matching > self.filters {
            return Err(invalid(format!(
                "--preload-match {} exceeds --preload-filters {} (the matching filters are among the preloaded ones)",
                self.matching, self.filters
            )));
        }
        if self.matching > Self::MAX_MATCHING {
            return Err(invalid(format!(
                "--preload-match {}: at most {} (source ports {}..=65535)",
                self.matching,
                Self::MAX_MATCHING,
                Self::SPORT
            )));
        }
        Ok(())
    }
}

/// Parses a group name or a numeric gid (`--group`).
pub(crate) fn parse_group(s: &str) -> Result<u32, InvalidValue> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(s)
        .map_err(|_| InvalidValue(format!("group {s:?}: contains a NUL byte")))?;
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: all-zero is a valid `struct group` (null pointers, gid 0).
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrnam_r writes the entry into `grp` and its strings into
    // `buf` (its length given), and a pointer to `grp` (or null) into
    // `out`; all of them outlive the call and nothing keeps them after.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &raw mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &raw mut out,
        )
    };
    if rc != 0 {
        return Err(InvalidValue(format!(
            "group {s:?}: {}",
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    if out.is_null() {
        return Err(InvalidValue(format!("no group named {s:?}")));
    }
    Ok(grp.gr_gid)
}

/// Parses `gen` or `tap:IFNAME`.
pub(crate) fn parse_peer(s: &str) -> Result<PeerKind, InvalidValue> {
    if s == "gen" {
        return Ok(PeerKind::Gen);
    }
    if let Some(name) = s.strip_prefix("tap:") {
        if name.is_empty()
            || name.len() > 15
            || name.contains('/')
            || name.contains(char::is_whitespace)
        {
            return Err(invalid(format!(
                "invalid tap interface name {name:?} (1..=15 characters, no '/' or spaces)"
            )));
        }
        return Ok(PeerKind::Tap(name.to_string()));
    }
    Err(invalid(format!(
        "unknown peer {s:?}: expected `gen` or `tap:IFNAME`"
    )))
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub(crate) fn parse_mac(s: &str) -> Result<[u8; 6], InvalidValue> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(invalid(format!(
            "invalid MAC address {s:?}: expected six hex bytes like 02:76:6e:69:63:01"
        )));
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return Err(invalid(format!(
                "invalid MAC address {s:?}: byte {p:?} is not two hex digits"
            )));
        }
        m[i] = u8::from_str_radix(p, 16)
            .map_err(|_| invalid(format!("invalid MAC address {s:?}: {p:?} is not hex")))?;
    }
    if m[0] & 1 != 0 {
        return Err(invalid(format!(
            "invalid MAC address {s:?}: multicast bit set"
        )));
    }
    Ok(m)
}

pub(crate) fn fmt_mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Parses `BxW` (buckets x ways), e.g. `1024x4`; `0` or `none` for no placement model.
pub(crate) fn parse_buckets(s: &str) -> Result<Option<(u32, u16)>, InvalidValue> {
    if s == "0" || s == "none" {
        return Ok(None);
    }
    let (b, w) = s.split_once(['x', 'X']).ok_or_else(|| {
        invalid(format!(
            "invalid bucket geometry {s:?}: expected BxW, e.g. 1024x4, or `none`"
        ))
    })?;
    let b: u32 = b
        .parse()
        .map_err(|_| invalid(format!("invalid bucket count {b:?} in {s:?}")))?;
    let w: u16 = w
        .parse()
        .map_err(|_| invalid(format!("invalid way count {w:?} in {s:?}")))?;
    if b == 0 || w == 0 {
        return Err(invalid(format!(
            "invalid bucket geometry {s:?}: buckets and ways must be at least 1"
        )));
    }
    if b > arfs::table::MAX_BUCKETS {
        return Err(invalid(format!(
            "invalid bucket geometry {s:?}: at most {} buckets",
            arfs::table::MAX_BUCKETS
        )));
    }
    Ok(Some((b, w)))
}

/// Parses a duration: `0`, `250us`, `2ms`, `1.5s`, `100ns`; a bare number is microseconds.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, InvalidValue> {
    let s = s.trim();
    let (num, mult_ns) = if let Some(n) = s.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e9)
    } else {
        (s, 1e3)
    };
    let v: f64 = num.trim().parse().map_err(|_| {
        invalid(format!(
            "invalid duration {s:?}: expected e.g. 0, 500us, 2ms, 1s"
        ))
    })?;
    if !v.is_finite() || v < 0.0 {
        return Err(invalid(format!(
            "invalid duration {s:?}: must be a non-negative number"
        )));
    }
    let ns = v * mult_ns;
    if ns > arfs::table::MAX_LATENCY_NS as f64 {
        return Err(invalid(format!(
            "duration {s:?} too large (at most {} s)",
            arfs::table::MAX_LATENCY_NS / 1_000_000_000
        )));
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// Parses a probability 0.0..=1.0.
pub(crate) fn parse_rate(s: &str) -> Result<f64, InvalidValue> {
    let v: f64 = s.trim().parse().map_err(|_| {
        invalid(format!(
            "invalid probability {s:?}: expected a number in 0.0..=1.0"
        ))
    })?;
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(format!(
            "invalid probability {s:?}: must be in 0.0..=1.0"
        )));
    }
    Ok(v)
}

/// Parses the number of queue pairs, 1..=16.
pub(crate) fn parse_queues(s: &str) -> Result<u16, InvalidValue> {
    let v: u16 = s
        .parse()
        .map_err(|_| invalid(format!("invalid queue pair count {s:?}: expected 1..=16")))?;
    if !(1..=16).contains(&v) {
        return Err(invalid(format!(
            "invalid queue pair count {v}: expected 1..=16"
        )));
    }
    Ok(v)
}

/// Parses the filter table capacity, 1..=65535.
pub(crate) fn parse_capacity(s: &str) -> Result<u32, InvalidValue> {
    let v: u32 = s
        .parse()
        .map_err(|_| invalid(format!("invalid table capacity {s:?}: expected 1..=65535")))?;
    if !(1..=arfs::table::MAX_CAPACITY).contains(&v) {
        return Err(invalid(format!(
            "invalid table capacity {v}: expected 1..=65535"
        )));
    }
    Ok(v)
}

/// Parses a filter count of `--preload-filters` / `--preload-match`,
/// 0..=65535 (checked against the table capacity at start).
pub(crate) fn parse_filter_count(s: &str) -> Result<u32, InvalidValue> {
    let v: u32 = s
        .parse()
        .map_err(|_| invalid(format!("invalid filter count {s:?}: expected 0..=65535")))?;
    if v > arfs::table::MAX_CAPACITY {
        return Err(invalid(format!(
            "invalid filter count {v}: expected 0..=65535"
        )));
    }
    Ok(v)
}

/// Parses the largest virtqueue size offered: a power of two 256..=32768.
pub(crate) fn parse_queue_size(s: &str) -> Result<u16, InvalidValue> {
    let v: u16 = s
        .parse()
        .map_err(|_| invalid(format!("invalid queue size {s:?}")))?;
    if !v.is_power_of_two() || !(256..=32768).contains(&v) {
        return Err(invalid(format!(
            "invalid queue size {v}: a power of two in 256..=32768"
        )));
    }
    Ok(v)
}

/// Parses an IPv4 address.
pub(crate) fn parse_ipv4(s: &str) -> Result<Ipv4Addr, InvalidValue> {
    s.parse()
        .map_err(|_| invalid(format!("invalid IPv4 address {s:?}")))
}

pub(crate) fn parse_ipv6(s: &str) -> Result<Ipv6Addr, InvalidValue> {
    s.parse()
        .map_err(|_| invalid(format!("invalid IPv6 address {s:?}")))
}

/// Parses an inclusive port range `LO-HI` or a single port.
pub(crate) fn parse_port_range(s: &str) -> Result<(u16, u16), InvalidValue> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let lo: u16 = a
        .trim()
        .parse()
        .map_err(|_| invalid(format!("invalid port {a:?} in {s:?}")))?;
    let hi: u16 = b
        .trim()
        .parse()
        .map_err(|_| invalid(format!("invalid port {b:?} in {s:?}")))?;
    if lo > hi {
        return Err(invalid(format!(
            "invalid port range {s:?}: low end above high end"
        )));
    }
    Ok((lo, hi))
}

/// Parses an inclusive address range `A-B` or a single address (both ends of one family).
pub(crate) fn parse_addr_range(text: &str) -> Result<(IpAddr, IpAddr), InvalidValue> {
    let s = text;
    let (first, last) = s.split_once('-').unwrap_or((s, s));
    let lo: IpAddr = first
        .trim()
        .parse()
        .map_err(|_| invalid(format!("invalid address {first:?} in {s:?}")))?;
    let hi: IpAddr = last
        .trim()
        .parse()
        .map_err(|_| invalid(format!("invalid address {last:?} in {s:?}")))?;
    let ok = match (lo, hi) {
        (IpAddr::V4(l4), IpAddr::V4(h4)) => u32::from(l4) <= u32::from(h4),
        (IpAddr::V6(l6), IpAddr::V6(h6)) => u128::from(l6) <= u128::from(h6),
        _ => {
            return Err(invalid(format!(
                "invalid address range {s:?}: mixed families"
            )))
        }
    };
    if !ok {
        return Err(invalid(format!(
            "invalid address range {s:?}: low end above high end"
        )));
    }
    Ok((lo, hi))
}

/// Parses `0`/`1`, `off`/`on`, `false`/`true`.
pub(crate) fn parse_bool(s: &str) -> Result<bool, InvalidValue> {
    match s.trim() {
        "0" | "off" | "false" => Ok(false),
        "1" | "on" | "true" => Ok(true),
        _ => Err(invalid(format!(
            "invalid switch {s:?}: expected 0/1, off/on or false/true"
        ))),
    }
}

/// Parses `drop_acks`: how many of the next replies to requests to lose
/// (0..=65535).
/// `delay_effect_ms`: milliseconds, at most a minute.
pub(crate) fn parse_delay_ms(s: &str) -> Result<u32, InvalidValue> {
    match s.trim().parse::<u32>() {
        Ok(n) if n <= 60_000 => Ok(n),
        _ => Err(invalid(format!(
            "invalid delay {s:?}: expected milliseconds, 0..=60000"
        ))),
    }
}

pub(crate) fn parse_drop_acks(s: &str) -> Result<u32, InvalidValue> {
    match s.trim().parse::<u32>() {
        Ok(n) if n <= 65535 => Ok(n),
        _ => Err(invalid(format!(
            "invalid count {s:?}: expected a number of replies, 0..=65535"
        ))),
    }
}

/// Faults of the packet path, read by every worker once per event. Each
/// is a probability per filter hit as a threshold out of 2^32 (0: off,
/// [`RATE_ONE`]: every hit), drawn after the hit is counted, so that the
/// device's own counters (hits, per-queue filter deliveries) cannot see it.
#[derive(Debug, Default)]
pub(crate) struct PathFaults {
    /// A hit is delivered to the next enabled rx queue after the filter's
    /// (a NIC that steers wrongly); counted in `peer.misrouted`.
    pub misroute: std::sync::atomic::AtomicU64,
    /// A hit is counted as delivered by its queue but never written
    /// (`peer.fault_dropped`).
    pub drop: std::sync::atomic::AtomicU64,
    /// A hit's last UDP payload byte is flipped, its checksum kept valid
    /// (`peer.fault_corrupted`).
    pub corrupt: std::sync::atomic::AtomicU64,
    /// As `corrupt`, but the UDP checksum is left as it was, so that the
    /// guest's stack drops the frame (`peer.fault_bad_csum`).
    pub bad_csum: std::sync::atomic::AtomicU64,
    /// A hit loses the last [`crate::steer::TRUNCATE_BYTES`] bytes of its
    /// UDP or TCP payload, its IP and UDP lengths and checksums kept
    /// consistent (`peer.fault_truncated`).
    pub truncate: std::sync::atomic::AtomicU64,
    /// A hit is held back and delivered after its flow's next frame
    /// (`peer.fault_reordered`).
    pub reorder: std::sync::atomic::AtomicU64,
    /// Not a rate: nanoseconds for which a filter an ADD installed or
    /// re-steered, though applied, traced and acknowledged, leaves its
    /// hits where they went before (RSS's queue, or the replaced entry's);
    /// the hits are counted as the filter's (`peer.fault_delayed`).
    pub delay_effect_ns: std::sync::atomic::AtomicU64,
}

impl PathFaults {
    /// The thresholds in [`crate::steer::Steer::set_faults`]'s order.
    pub(crate) fn thresholds(&self) -> [u64; 6] {
        use std::sync::atomic::Ordering::Relaxed;
        [
            self.misroute.load(Relaxed),
            self.drop.load(Relaxed),
            self.corrupt.load(Relaxed),
            self.bad_csum.load(Relaxed),
            self.truncate.load(Relaxed),
            self.reorder.load(Relaxed),
        ]
    }
}

/// [`PathFaults`]: the threshold of a probability of 1.
pub(crate) const RATE_ONE: u64 = 1 << 32;

/// The [`PathFaults`] threshold of probability `p` (0.0..=1.0).
pub(crate) fn rate_threshold(p: f64) -> u64 {
    (p.clamp(0.0, 1.0) * RATE_ONE as f64).round() as u64
}

/// The probability of a [`PathFaults`] threshold.
pub(crate) fn threshold_rate(t: u64) -> f64 {
    t as f64 / RATE_ONE as f64
}

/// A fault knob the control socket sets at run time (`set KEY VALUE`),
/// parsed and checked before the management lock is taken.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Knob {
    AddFailRate(f64),
    MgmtLossRate(f64),
    ProgramLatency(Duration),
    TableCapacity(u32),
    Buckets(Option<(u32, u16)>),
    Misroute(bool),
    RogueResponder(bool),
    RogueNonce(bool),
    DropAcks(u32),
    ForgeAcks(bool),
    MisrouteRate(f64),
    DropRate(f64),
    CorruptRate(f64),
    BadCsumRate(f64),
    TruncateRate(f64),
    ReorderRate(f64),
    DelayEffectMs(u32),
    WrongTrace(bool),
}

impl Knob {
    /// The knob names, as `set` takes them.
    pub(crate) const NAMES: &'static str =
        "add_fail_rate, mgmt_loss_rate, program_latency, table_capacity, buckets, misroute, misroute_rate, drop_rate, corrupt_rate, bad_csum_rate, truncate_rate, reorder_rate, delay_effect_ms, rogue_responder, rogue_nonce, drop_acks, forge_acks or wrong_trace";

    pub(crate) fn parse(key: &str, value: &str) -> Result<Self, KnobError> {
        let bad = |err| KnobError::Value {
            key: key.to_string(),
            err,
        };
        Ok(match key {
            "add_fail_rate" => Self::AddFailRate(parse_rate(value).map_err(bad)?),
            "mgmt_loss_rate" => Self::MgmtLossRate(parse_rate(value).map_err(bad)?),
            "program_latency" => Self::ProgramLatency(parse_duration(value).map_err(bad)?),
            "table_capacity" => Self::TableCapacity(parse_capacity(value).map_err(bad)?),
            "buckets" => Self::Buckets(parse_buckets(value).map_err(bad)?),
            "misroute" => Self::Misroute(parse_bool(value).map_err(bad)?),
            "rogue_responder" => Self::RogueResponder(parse_bool(value).map_err(bad)?),
            "rogue_nonce" => Self::RogueNonce(parse_bool(value).map_err(bad)?),
            "drop_acks" => Self::DropAcks(parse_drop_acks(value).map_err(bad)?),
            "forge_acks" => Self::ForgeAcks(parse_bool(value).map_err(bad)?),
            "misroute_rate" => Self::MisrouteRate(parse_rate(value).map_err(bad)?),
            "drop_rate" => Self::DropRate(parse_rate(value).map_err(bad)?),
            "corrupt_rate" => Self::CorruptRate(parse_rate(value).map_err(bad)?),
            "bad_csum_rate" => Self::BadCsumRate(parse_rate(value).map_err(bad)?),
            "truncate_rate" => Self::TruncateRate(parse_rate(value).map_err(bad)?),
            "reorder_rate" => Self::ReorderRate(parse_rate(value).map_err(bad)?),
            "delay_effect_ms" => Self::DelayEffectMs(parse_delay_ms(value).map_err(bad)?),
            "wrong_trace" => Self::WrongTrace(parse_bool(value).map_err(bad)?),
            _ => return Err(KnobError::Unknown(key.to_string())),
        })
    }
}

/// Why `set KEY VALUE` was refused before reaching the device.
#[derive(Debug, thiserror::Error)]
pub enum KnobError {
    #[error("unknown knob {0:?}: expected {names}", names = Knob::NAMES)]
    Unknown(String),
    #[error("{key}: {err}")]
    Value { key: String, err: InvalidValue },
}

#[cfg(test)]
mod tests {

    #[test]
    fn poll_us_is_bounded() {
        assert_eq!(parse_poll_us("0"), Ok(0));
        assert_eq!(parse_poll_us("1000"), Ok(1000));
        assert!(parse_poll_us("1001").unwrap_err().contains("at most 1000"));
        assert!(parse_poll_us("-1").is_err());
        assert!(parse_poll_us("5us").is_err());
    }

    use super::*;

    #[test]
    fn values() {
        assert_eq!(parse_peer("gen"), Ok(PeerKind::Gen));
        assert_eq!(parse_peer("tap:vnic0"), Ok(PeerKind::Tap("vnic0".into())));
        assert!(parse_peer("tap:").is_err());
        assert!(parse_peer("tun").unwrap_err().0.contains("gen"));
        assert_eq!(parse_mac("02:00:00:00:00:01"), Ok([2, 0, 0, 0, 0, 1]));
        assert!(parse_mac("01:00:00:00:00:01").is_err());
        assert!(parse_mac("02:00:00:00:00").is_err());
        assert_eq!(parse_buckets("1024x4"), Ok(Some((1024, 4))));
        assert_eq!(parse_buckets("none"), Ok(None));
        assert!(parse_buckets("0x4").is_err());
        assert!(parse_buckets("12").is_err());
        assert_eq!(parse_duration("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration("250"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("-1ms").is_err());
        assert!(parse_duration("fast").is_err());
        assert_eq!(parse_rate("0.25"), Ok(0.25));
        assert_eq!(parse_drop_acks("3"), Ok(3));
        assert!(parse_drop_acks("65536").is_err());
        assert!(parse_drop_acks("-1").is_err());
        assert_eq!(Knob::parse("drop_acks", "2").unwrap(), Knob::DropAcks(2));
        assert_eq!(
            Knob::parse("rogue_nonce", "on").unwrap(),
            Knob::RogueNonce(true)
        );
        assert!(parse_rate("1.5").is_err());
        assert!(parse_queues("0").is_err());
        assert!(parse_queues("17").is_err());
        assert_eq!(parse_queues("16"), Ok(16));
        assert!(parse_capacity("65536").is_err());
        assert!(parse_queue_size("1000").is_err());
        assert_eq!(parse_port_range("10-20"), Ok((10, 20)));
        assert!(parse_port_range("20-10").is_err());
        assert!(parse_addr_range("10.0.0.1-::1").is_err());
        assert_eq!(parse_filter_count("65535"), Ok(65535));
        assert!(parse_filter_count("65536").is_err());
        assert!(parse_filter_count("-1").is_err());
        let p = |filters, matching| Preload { filters, matching };
        assert_eq!(p(65535, 64).check(65535), Ok(()));
        assert_eq!(p(0, 0).check(1), Ok(()));
        assert!(p(9000, 0)
            .check(8192)
            .unwrap_err()
            .0
            .contains("--table-capacity 8192"));
        assert!(p(10, 11)
            .check(8192)
            .unwrap_err()
            .0
            .contains("--preload-filters 10"));
        assert!(p(65535, 55537)
            .check(65535)
            .unwrap_err()
            .0
            .contains("at most 55536"));
    }
}
