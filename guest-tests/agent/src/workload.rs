//! Request dispatch and the workloads (connected UDP receivers, a TCP server).
//!
//! A handler fails with a [`WorkloadError`]; main.rs turns it into the text
//! of the reply's `"error"` field (its `Display`), the one place it
//! becomes a string. Nothing in the agent acts on its kind.

use crate::rawtx::RawTxError;
use crate::sys;
use serde::Serialize;
use serde_json::Value;
use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{
    AddrParseError, IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream,
    UdpSocket,
};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vnic_agent::payload::{self, SeqTrack};
use vnic_agent::proto::{
    Delivery, DirContents, ExecResult, FlowCounters, Info, Late, PathSeg, Request, TcpConnCounters,
    TcpStats, UdpSpec, UdpStats, PATH_SEGMENTS, PROTOCOL_VERSION,
};

/// Receiver threads need little stack.
const STACK: usize = 256 * 1024;
/// recv() timeout: how quickly receivers notice stop and migrate requests.
const POLL: Duration = Duration::from_millis(100);
/// How long `udp_stop` waits for the receivers to see the stop flag.
const STOP_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct State {
    udp: Option<UdpRun>,
    tcp: Option<TcpRun>,
    raw: Option<crate::rawtx::Job>,
}

impl State {
    pub fn stop_all(&mut self) {
        if let Some(u) = self.udp.take() {
            // At power-off: stuck receivers (already reported) do not matter.
            let _ = u.stop();
        }
        if let Some(t) = self.tcp.take() {
            t.stop();
        }
    }
}

/// Why a request failed. Its `Display` is the reply's `"error"` text.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    // ---- a request field the agent cannot use
    /// `what`: "IPv4 address", "IPv6 address", "address", "peer address".
    #[error("bad {what} {addr:?}: {source}")]
    BadAddress {
        what: &'static str,
        addr: String,
        #[source]
        source: AddrParseError,
    },
    #[error("refusing to write {0:?}: only /proc and /sys")]
    PathRefused(String),
    #[error("bad move ({flow}, {cpu})")]
    BadMove { flow: usize, cpu: usize },
    #[error("bad cpu list {cpus:?} ({ncpu} CPUs)")]
    BadCpuList { cpus: Vec<usize>, ncpu: usize },
    #[error("cpu {cpu} out of range ({ncpu} CPUs)")]
    CpuOutOfRange { cpu: usize, ncpu: usize },
    #[error("no flows")]
    NoFlows,
    #[error("echo needs connected sockets (connect: true)")]
    EchoNeedsConnect,
    #[error("empty argv")]
    EmptyArgv,

    // ---- the agent's state does not allow the request
    #[error("a UDP workload is already running (udp_stop first)")]
    UdpRunning,
    #[error("a TCP server is already running")]
    TcpRunning,
    #[error("a raw-frame job is already running (raw_tx_wait first)")]
    RawTxRunning,
    /// No such workload: `0` is "UDP workload", "TCP server" or
    /// "raw-frame job".
    #[error("no {0}")]
    NotRunning(&'static str),

    // ---- the system refused
    /// A system call (or a group of them: ethtool, netlink, a socket
    /// set-up) failed; `what` names it.
    #[error("{what}: {source}")]
    Sys {
        what: String,
        #[source]
        source: io::Error,
    },
    /// Reading a file or directory (procfs, sysfs, debugfs) failed.
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    /// Writing a procfs or sysfs file failed.
    #[error("{path}: {source}")]
    Write {
        path: String,
        #[source]
        source: io::Error,
    },
    /// `exec` could not start its program.
    #[error("{prog}: {source}")]
    Exec {
        prog: String,
        #[source]
        source: io::Error,
    },
    #[error("{feature} is {} after setting it {}", onoff(*.active), onoff(*.wanted))]
    FeatureNotSet {
        feature: String,
        active: bool,
        wanted: bool,
    },
    #[error("asked for {asked} combined channels, the device has {got}")]
    ChannelsNotSet { asked: u32, got: u32 },
    /// `udp_stop`: receivers still running after `waited` (each
    /// `:PORT (cpuN)`), left behind with their sockets.
    #[error(
        "{} UDP receiver(s) did not stop within {waited:?}, left running: {}",
        .stuck.len(),
        .stuck.join(", ")
    )]
    StuckReceivers {
        stuck: Vec<String>,
        waited: Duration,
    },
    #[error(transparent)]
    RawTx(#[from] RawTxError),
    /// The reply's result could not be encoded as JSON.
    #[error("{0}")]
    Encode(#[from] serde_json::Error),
}

type Result<T, E = WorkloadError> = std::result::Result<T, E>;

fn to_value<T: Serialize>(v: &T) -> Result<Value> {
    Ok(serde_json::to_value(v)?)
}

/// An ethtool rule call's answer: its location, or its errno (a refusal
/// is what the harness asks about, not an agent error).
fn rule_op(r: io::Result<u32>, t: Instant) -> vnic_agent::proto::RuleOp {
    let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
    match r {
        Ok(loc) => vnic_agent::proto::RuleOp {
            loc: Some(loc),
            errno: 0,
            us,
        },
        Err(e) => vnic_agent::proto::RuleOp {
            loc: None,
            errno: e.raw_os_error().unwrap_or(-1),
            us,
        },
    }
}

/// `map_err` for a failed system call named `what`.
fn sys_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> WorkloadError {
    move |source| WorkloadError::Sys {
        what: what.into(),
        source,
    }
}

fn read_err(path: &str) -> impl FnOnce(io::Error) -> WorkloadError + '_ {
    move |source| WorkloadError::Read {
        path: path.to_string(),
        source,
    }
}

fn write_err(path: &str) -> impl FnOnce(io::Error) -> WorkloadError + '_ {
    move |source| WorkloadError::Write {
        path: path.to_string(),
        source,
    }
}

/// `addr` as an address of the kind `what` names (see
/// [`WorkloadError::BadAddress`]).
fn parse_addr<T: std::str::FromStr<Err = AddrParseError>>(
    what: &'static str,
    addr: &str,
) -> Result<T> {
    addr.parse().map_err(|source| WorkloadError::BadAddress {
        what,
        addr: addr.to_string(),
        source,
    })
}

/// Runs one request; main.rs sends the error's text as the reply's
/// `"error"`.
pub fn handle(st: &mut State, req: Request) -> Result<Value> {
    match req {
        Request::Hello => to_value(&Info {
            protocol: PROTOCOL_VERSION,
            kernel: sys::kernel_release(),
            cpus: sys::online_cpus(),
            interfaces: sys::interfaces(),
            uptime_s: std::fs::read_to_string("/proc/uptime")
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
                .unwrap_or(0.0),
        }),
        Request::NetSetup {
            ifname,
            addr,
            prefix,
            addr6,
            prefix6,
        } => {
            let a: Ipv4Addr = parse_addr("IPv4 address", &addr)?;
            let a6: Option<Ipv6Addr> = addr6
                .as_deref()
                .map(|s| parse_addr("IPv6 address", s))
                .transpose()?;
            sys::link_up("lo").map_err(sys_err("lo up"))?;
            sys::set_ipv4(&ifname, a, prefix).map_err(sys_err("set address"))?;
            if a6.is_some() {
                // No duplicate address detection: the address is usable at
                // once (a tentative one cannot be bound or sent from).
                let path = format!("/proc/sys/net/ipv6/conf/{ifname}/accept_dad");
                std::fs::write(&path, "0").map_err(write_err(&path))?;
            }
            sys::link_up(&ifname).map_err(sys_err("link up"))?;
            if let Some(a6) = a6 {
                sys::set_ipv6(&ifname, a6, prefix6).map_err(sys_err("set IPv6 address"))?;
            }
            Ok(Value::Null)
        }
        Request::WriteFile { path, value } => {
            check_path(&path)?;
            std::fs::write(&path, value.as_bytes()).map_err(write_err(&path))?;
            Ok(Value::Null)
        }
        Request::ReadFile { path } => std::fs::read_to_string(&path)
            .map(Value::String)
            .map_err(read_err(&path)),
        Request::ReadDir { path } => {
            let mut out = DirContents::new();
            read_dir(Path::new(&path), "", &mut out, 0).map_err(read_err(&path))?;
            to_value(&out)
        }
        Request::Rfs {
            ifname,
            sock_flow_entries,
            flow_cnt,
            rps_cpus,
        } => rfs(&ifname, sock_flow_entries, flow_cnt, rps_cpus.as_deref()),
        Request::SetFeature {
            ifname,
            feature,
            on,
        } => {
            let active =
                sys::set_feature(&ifname, &feature, on).map_err(sys_err("ethtool features"))?;
            if active != on {
                return Err(WorkloadError::FeatureNotSet {
                    feature,
                    active,
                    wanted: on,
                });
            }
            Ok(Value::Bool(active))
        }
        Request::RxQueueNapi { ifname } => {
            to_value(&crate::netlink::rx_queue_napi(&ifname).map_err(sys_err("netdev netlink"))?)
        }
        Request::RuleInsert { ifname, rule, loc } => {
            let t = Instant::now();
            let r = sys::rule_insert(&ifname, &rule, loc);
            to_value(&rule_op(r, t))
        }
        Request::RuleDelete { ifname, loc } => {
            let t = Instant::now();
            let r = sys::rule_delete(&ifname, loc).map(|()| loc);
            to_value(&rule_op(r, t))
        }
        Request::RuleList { ifname } => {
            to_value(&sys::rule_list(&ifname).map_err(sys_err("ethtool -n"))?)
        }
        Request::SetChannels { ifname, combined } => {
            let got = sys::set_channels(&ifname, combined).map_err(sys_err("ethtool channels"))?;
            if got != combined {
                return Err(WorkloadError::ChannelsNotSet {
                    asked: combined,
                    got,
                });
            }
            Ok(Value::from(got))
        }
        Request::ModuleLoad { path, params } => {
            sys::module_load(&path, &params).map_err(sys_err(format!("finit_module {path}")))?;
            Ok(Value::Null)
        }
        Request::ModuleUnload { name } => {
            sys::module_unload(&name).map_err(sys_err(format!("delete_module {name}")))?;
            Ok(Value::Null)
        }
        Request::ProbedUnload {
            name,
            ifname,
            every_ms,
            toggle_ntuple,
        } => to_value(&probed_unload(&name, &ifname, every_ms, toggle_ntuple)),
        Request::Ping {
            addr,
            count,
            timeout_ms,
        } => to_value(
            &sys::ping(
                parse_addr::<IpAddr>("address", &addr)?,
                count,
                Duration::from_millis(timeout_ms),
            )
            .map_err(sys_err("ping"))?,
        ),
        Request::UdpStart(spec) => {
            if st.udp.is_some() {
                return Err(WorkloadError::UdpRunning);
            }
            let n = spec.flows.len();
            st.udp = Some(UdpRun::start(&spec)?);
            Ok(Value::from(n))
        }
        Request::UdpMigrate { moves } => {
            let run = st.udp.as_ref().ok_or(NO_UDP)?;
            let ncpu = sys::online_cpus();
            for &(flow, cpu) in &moves {
                if flow >= run.flows.len() || cpu >= ncpu {
                    return Err(WorkloadError::BadMove { flow, cpu });
                }
            }
            for (flow, cpu) in moves {
                run.flows[flow].target.store(cpu, Ordering::Relaxed);
            }
            Ok(Value::Null)
        }
        Request::UdpStats => to_value(&st.udp.as_ref().ok_or(NO_UDP)?.stats(true)),
        Request::UdpStop => {
            let run = st.udp.take().ok_or(NO_UDP)?;
            to_value(&run.stop()?)
        }
        Request::TcpStart { port, cpus, echo } => {
            if st.tcp.is_some() {
                return Err(WorkloadError::TcpRunning);
            }
            let ncpu = sys::online_cpus();
            if cpus.is_empty() || cpus.iter().any(|&c| c >= ncpu) {
                return Err(WorkloadError::BadCpuList { cpus, ncpu });
            }
            st.tcp = Some(TcpRun::start(port, cpus, echo)?);
            Ok(Value::Null)
        }
        Request::TcpStats => to_value(&st.tcp.as_ref().ok_or(NO_TCP)?.stats(true)),
        Request::TcpStop => {
            let run = st.tcp.take().ok_or(NO_TCP)?;
            to_value(&run.stop())
        }
        Request::Dmesg { since } => to_value(&sys::kmsg(since).map_err(sys_err("/dev/kmsg"))?),
        Request::Exec { argv, timeout_ms } => {
            to_value(&exec(&argv, Duration::from_millis(timeout_ms))?)
        }
        Request::RawTxStart(spec) => {
            if st.raw.is_some() {
                return Err(WorkloadError::RawTxRunning);
            }
            st.raw = Some(crate::rawtx::Job::start(spec)?);
            Ok(Value::Null)
        }
        Request::RawTxWait { timeout_ms } => {
            let job = st
                .raw
                .as_mut()
                .ok_or(WorkloadError::NotRunning("raw-frame job"))?;
            match job.wait(Duration::from_millis(timeout_ms.min(600_000))) {
                Some(r) => {
                    st.raw = None;
                    to_value(&r)
                }
                None => to_value(&vnic_agent::proto::RawTxReport::default()),
            }
        }
        Request::Sleep { ms } => {
            std::thread::sleep(Duration::from_millis(ms.min(600_000)));
            Ok(Value::Null)
        }
        Request::CpuProbe { timeout_ms } => {
            to_value(&cpu_probe(Duration::from_millis(timeout_ms.min(60_000))))
        }
        Request::Poweroff => {
            st.stop_all();
            Ok(Value::Null)
        }
    }
}

/// [`Request::CpuProbe`]: a thread per online CPU pins itself there and
/// reports the CPU it then runs on. `sched_setaffinity` on oneself returns
/// only once the thread runs on the new CPU, so the thread of a CPU that
/// never schedules stays blocked there (it is detached and left behind).
fn cpu_probe(timeout: Duration) -> vnic_agent::proto::CpuProbe {
    let cpus = sys::online_cpus();
    let (tx, rx) = std::sync::mpsc::channel();
    for cpu in 0..cpus {
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("cpu-probe-{cpu}"))
            .spawn(move || {
                if sys::pin_to_cpu(cpu).is_ok() && usize::try_from(sys::current_cpu()) == Ok(cpu) {
                    let _ = tx.send(cpu);
                }
            });
        drop(spawned);
    }
    drop(tx);
    let deadline = std::time::Instant::now() + timeout;
    let mut ran = Vec::new();
    while ran.len() < cpus {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(cpu) => ran.push(cpu),
            Err(_) => break,
        }
    }
    ran.sort_unstable();
    let missing = (0..cpus).filter(|c| !ran.contains(c)).collect();
    vnic_agent::proto::CpuProbe { cpus, ran, missing }
}

fn onoff(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

const NO_UDP: WorkloadError = WorkloadError::NotRunning("UDP workload");
const NO_TCP: WorkloadError = WorkloadError::NotRunning("TCP server");

/// Writes only go to the kernel's own trees.
fn check_path(path: &str) -> Result<()> {
    if (path.starts_with("/proc/") || path.starts_with("/sys/")) && !path.contains("..") {
        Ok(())
    } else {
        Err(WorkloadError::PathRefused(path.to_string()))
    }
}

fn read_dir(dir: &Path, prefix: &str, out: &mut DirContents, depth: usize) -> std::io::Result<()> {
    if depth > 4 {
        return Ok(());
    }
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let name = format!("{prefix}{}", ent.file_name().to_string_lossy());
        let ft = ent.file_type()?;
        if ft.is_dir() {
            read_dir(&ent.path(), &format!("{name}/"), out, depth + 1)?;
        } else if ft.is_file() {
            // Some debugfs files are write-only or fail to read: record why.
            let v = std::fs::read_to_string(ent.path()).unwrap_or_else(|e| format!("<error: {e}>"));
            out.insert(name, v);
        }
    }
    Ok(())
}

fn rfs(ifname: &str, entries: u32, flow_cnt: u32, rps_cpus: Option<&str>) -> Result<Value> {
    let mut written = serde_json::Map::new();
    let mut put = |path: String, v: String| -> Result<()> {
        std::fs::write(&path, v.as_bytes()).map_err(write_err(&path))?;
        written.insert(path, Value::String(v));
        Ok(())
    };
    put(
        "/proc/sys/net/core/rps_sock_flow_entries".into(),
        entries.to_string(),
    )?;
    let qdir = format!("/sys/class/net/{ifname}/queues");
    let mut rx: Vec<String> = std::fs::read_dir(&qdir)
        .map_err(read_err(&qdir))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("rx-"))
        .collect();
    rx.sort();
    for q in rx {
        put(format!("{qdir}/{q}/rps_flow_cnt"), flow_cnt.to_string())?;
        if let Some(m) = rps_cpus {
            put(format!("{qdir}/{q}/rps_cpus"), m.to_string())?;
        }
    }
    Ok(Value::Object(written))
}

fn exec(argv: &[String], timeout: Duration) -> Result<ExecResult> {
    let (prog, args) = argv.split_first().ok_or(WorkloadError::EmptyArgv)?;
    let mut child = std::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|source| WorkloadError::Exec {
            prog: prog.clone(),
            source,
        })?;
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait().map_err(sys_err("wait"))? {
            Some(s) => break s,
            None if Instant::now() >= deadline => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().map_err(sys_err("wait"))?;
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    Ok(ExecResult {
        status: status.code(),
        stdout: to.join().unwrap_or_default(),
        stderr: te.join().unwrap_or_default(),
        timed_out,
    })
}

/// Lock-free counters of one receiver.
/// Distinct NAPI ids counted per flow (more go to `napi_unknown`).
const NAPI_SLOTS: usize = 8;

struct Counters {
    /// (napi id, packets); id 0 = free slot. Written by the receiver only.
    napi: [(AtomicU32, AtomicU64); NAPI_SLOTS],
    /// Per slot of `napi`: the earliest and latest send stamp seen.
    napi_sent: [(AtomicU64, AtomicU64); NAPI_SLOTS],
    napi_unknown: AtomicU64,
    packets: AtomicU64,
    on_cpu: AtomicU64,
    off_cpu_recv: AtomicU64,
    errors: AtomicU64,
    echoed: AtomicU64,
    echo_errors: AtomicU64,
    /// The receiver's [`SeqTrack`], mirrored after every datagram.
    delivery: [AtomicU64; 7],
    /// Its late datagrams, mirrored after each late one.
    late: Mutex<Vec<Late>>,
    /// Its path through the NAPI instances ([`PathSeg`] runs).
    path: Mutex<VecDeque<PathSeg>>,
    by_cpu: Vec<AtomicU64>,
    /// CPU the receiver is pinned to now.
    cpu: AtomicUsize,
}

impl Counters {
    fn new(ncpu: usize, cpu: usize) -> Self {
        Counters {
            napi: std::array::from_fn(|_| (AtomicU32::new(0), AtomicU64::new(0))),
            napi_sent: std::array::from_fn(|_| (AtomicU64::new(u64::MAX), AtomicU64::new(0))),
            napi_unknown: AtomicU64::new(0),
            packets: AtomicU64::new(0),
            on_cpu: AtomicU64::new(0),
            off_cpu_recv: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            echoed: AtomicU64::new(0),
            echo_errors: AtomicU64::new(0),
            delivery: std::array::from_fn(|_| AtomicU64::new(0)),
            late: Mutex::new(Vec::new()),
            path: Mutex::new(VecDeque::new()),
            by_cpu: (0..ncpu).map(|_| AtomicU64::new(0)).collect(),
            cpu: AtomicUsize::new(cpu),
        }
    }

    /// Account one received packet, given the socket's SO_INCOMING_CPU
    /// and SO_INCOMING_NAPI_ID (`None`: unreadable).
    fn count(&self, incoming: i32, napi: Option<u32>, pinned: usize) {
        self.packets.fetch_add(1, Ordering::Relaxed);
        let slot = napi.filter(|&id| id != 0).and_then(|id| {
            self.napi.iter().find(|(s, _)| {
                let cur = s.load(Ordering::Relaxed);
                if cur == 0 {
                    s.store(id, Ordering::Relaxed);
                }
                cur == 0 || cur == id
            })
        });
        match slot {
            Some((_, n)) => {
                n.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.napi_unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Ok(c) = usize::try_from(incoming) {
            if let Some(b) = self.by_cpu.get(c) {
                b.fetch_add(1, Ordering::Relaxed);
            }
            if c == pinned {
                self.on_cpu.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Check the scheduler honoured the pinning (it must).
        if usize::try_from(sys::current_cpu()).ok() != Some(pinned) {
            self.off_cpu_recv.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Mirrors `t` (and its late log when `late`: a late datagram came).
    fn publish(&self, t: &SeqTrack, late: bool) {
        let d = &t.counts;
        let v = [
            d.next,
            d.distinct,
            d.duplicated,
            d.reordered,
            d.corrupted,
            d.short,
            d.bad_len,
        ];
        for (a, v) in self.delivery.iter().zip(v) {
            a.store(v, Ordering::Relaxed);
        }
        if late {
            let mut l = self.late.lock().unwrap_or_else(PoisonError::into_inner);
            l.clear();
            l.extend(t.late.iter().copied());
        }
    }

    fn delivery(&self) -> Delivery {
        let [next, distinct, duplicated, reordered, corrupted, short, bad_len] =
            std::array::from_fn(|i| self.delivery[i].load(Ordering::Relaxed));
        Delivery {
            next,
            distinct,
            duplicated,
            reordered,
            corrupted,
            short,
            bad_len,
        }
    }

    fn late(&self) -> Vec<Late> {
        self.late
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records the send stamp `sent` of a datagram counted under NAPI `id`.
    fn napi_sent(&self, id: u32, sent: u64) {
        let slot = self
            .napi
            .iter()
            .position(|(s, _)| s.load(Ordering::Relaxed) == id);
        if let Some((lo, hi)) = slot.and_then(|i| self.napi_sent.get(i)) {
            if sent < lo.load(Ordering::Relaxed) {
                lo.store(sent, Ordering::Relaxed);
            }
            if sent > hi.load(Ordering::Relaxed) {
                hi.store(sent, Ordering::Relaxed);
            }
        }
    }

    /// Extends the path with a datagram sent at `sent` counted under `id`.
    fn path_step(&self, id: u32, sent: u64) {
        let mut p = self.path.lock().unwrap_or_else(PoisonError::into_inner);
        match p.back_mut() {
            Some(seg) if seg.napi == id => {
                seg.first = seg.first.min(sent);
                seg.last = seg.last.max(sent);
                seg.n += 1;
            }
            _ => {
                if p.len() == PATH_SEGMENTS {
                    p.pop_front();
                }
                p.push_back(PathSeg {
                    napi: id,
                    first: sent,
                    last: sent,
                    n: 1,
                });
            }
        }
    }

    fn path(&self) -> Vec<PathSeg> {
        let p = self.path.lock().unwrap_or_else(PoisonError::into_inner);
        p.iter().copied().collect()
    }

    fn by_napi_sent(&self) -> Vec<(u32, u64, u64)> {
        self.napi
            .iter()
            .zip(&self.napi_sent)
            .map(|((s, _), (lo, hi))| {
                (
                    s.load(Ordering::Relaxed),
                    lo.load(Ordering::Relaxed),
                    hi.load(Ordering::Relaxed),
                )
            })
            .filter(|&(s, lo, _)| s != 0 && lo != u64::MAX)
            .collect()
    }

    fn by_napi(&self) -> Vec<(u32, u64)> {
        self.napi
            .iter()
            .map(|(s, n)| (s.load(Ordering::Relaxed), n.load(Ordering::Relaxed)))
            .filter(|&(s, _)| s != 0)
            .collect()
    }

    fn by_cpu(&self) -> Vec<u64> {
        self.by_cpu
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

struct UdpFlow {
    local_port: u16,
    peer_port: u16,
    /// Where the receiver should be; it re-pins itself when this changes.
    target: Arc<AtomicUsize>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

struct UdpRun {
    started: Instant,
    stop: Arc<AtomicBool>,
    flows: Vec<UdpFlow>,
}

impl UdpRun {
    fn start(spec: &UdpSpec) -> Result<Self> {
        let parse = |p: &str| -> Result<IpAddr> { parse_addr("peer address", p) };
        let default_peer = parse(&spec.peer)?;
        let ncpu = sys::online_cpus();
        if spec.flows.is_empty() {
            return Err(WorkloadError::NoFlows);
        }
        if spec.echo && !spec.connect {
            return Err(WorkloadError::EchoNeedsConnect);
        }
        // Open every socket first: a bind failure aborts before any thread runs.
        let mut socks = Vec::with_capacity(spec.flows.len());
        for f in &spec.flows {
            if f.cpu >= ncpu {
                return Err(WorkloadError::CpuOutOfRange { cpu: f.cpu, ncpu });
            }
            let peer = match &f.peer {
                Some(p) => parse(p)?,
                None => default_peer,
            };
            let any = match peer {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            };
            let s = UdpSocket::bind(SocketAddr::new(any, f.local_port))
                .map_err(sys_err(format!("bind udp {}", f.local_port)))?;
            // Connected: the kernel records the flow for RFS only on
            // sockets with a destination (inet_daddr set).
            if spec.connect {
                s.connect(SocketAddr::new(peer, f.peer_port))
                    .map_err(sys_err(format!("connect udp {}", f.peer_port)))?;
            }
            s.set_read_timeout(Some(POLL))
                .map_err(sys_err("SO_RCVTIMEO"))?;
            socks.push(s);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut flows = Vec::with_capacity(socks.len());
        for (f, sock) in spec.flows.iter().zip(socks) {
            let target = Arc::new(AtomicUsize::new(f.cpu));
            let counters = Arc::new(Counters::new(ncpu, f.cpu));
            let (t, c, s) = (target.clone(), counters.clone(), stop.clone());
            // The sender's port is the connected peer's, or (unconnected:
            // 0) each datagram's own. Sequence accounting assumes one flow
            // per socket, so it means something for connected sockets only.
            let ports = (if spec.connect { f.peer_port } else { 0 }, f.local_port);
            let echo = if spec.echo {
                u64::from(spec.echo_every.max(1))
            } else {
                0
            };
            let thread = std::thread::Builder::new()
                .name(format!("udp-{}", f.local_port))
                .stack_size(STACK)
                .spawn(move || udp_receiver(&sock, echo, ports, &t, &c, &s))
                .map_err(sys_err("spawn"))?;
            flows.push(UdpFlow {
                local_port: f.local_port,
                peer_port: f.peer_port,
                target,
                counters,
                thread: Some(thread),
            });
        }
        Ok(UdpRun {
            started: Instant::now(),
            stop,
            flows,
        })
    }

    fn stats(&self, running: bool) -> UdpStats {
        UdpStats {
            running,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            flows: self
                .flows
                .iter()
                .map(|f| {
                    let c = &f.counters;
                    FlowCounters {
                        local_port: f.local_port,
                        peer_port: f.peer_port,
                        cpu: c.cpu.load(Ordering::Relaxed),
                        packets: c.packets.load(Ordering::Relaxed),
                        on_cpu: c.on_cpu.load(Ordering::Relaxed),
                        by_cpu: c.by_cpu(),
                        by_napi: c.by_napi(),
                        napi_unknown: c.napi_unknown.load(Ordering::Relaxed),
                        off_cpu_recv: c.off_cpu_recv.load(Ordering::Relaxed),
                        errors: c.errors.load(Ordering::Relaxed),
                        echoed: c.echoed.load(Ordering::Relaxed),
                        echo_errors: c.echo_errors.load(Ordering::Relaxed),
                        delivery: c.delivery(),
                        late: c.late(),
                        napi_sent: c.by_napi_sent(),
                        path: c.path(),
                    }
                })
                .collect(),
        }
    }

    /// Stops the receivers: each sees the flag within its 100 ms receive
    /// timeout. One that has not finished after [`STOP_WAIT`] is left
    /// behind (its socket with it) and named in the error, so that a
    /// stuck guest CPU fails the request instead of hanging the agent.
    fn stop(mut self) -> Result<UdpStats> {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + STOP_WAIT;
        while Instant::now() < deadline
            && self
                .flows
                .iter()
                .any(|f| f.thread.as_ref().is_some_and(|t| !t.is_finished()))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let stats = self.stats(false);
        let mut stuck = Vec::new();
        for f in &mut self.flows {
            match f.thread.take() {
                Some(t) if t.is_finished() => {
                    let _ = t.join();
                }
                Some(t) => {
                    stuck.push(format!(
                        ":{} (cpu{})",
                        f.local_port,
                        f.target.load(Ordering::Relaxed)
                    ));
                    drop(t);
                }
                None => {}
            }
        }
        if stuck.is_empty() {
            Ok(stats)
        } else {
            Err(WorkloadError::StuckReceivers {
                stuck,
                waited: STOP_WAIT,
            })
        }
    }
}

/// `echo`: send every `echo`th datagram back (0: none). `ports`: (the
/// peer's, ours), for the payload check.
fn udp_receiver(
    sock: &UdpSocket,
    echo: u64,
    ports: (u16, u16),
    target: &AtomicUsize,
    c: &Counters,
    stop: &AtomicBool,
) {
    let mut pinned = usize::MAX;
    let mut buf = [0u8; 2048];
    let mut n_recv = 0u64;
    let mut track = SeqTrack::default();
    while !stop.load(Ordering::Relaxed) {
        let want = target.load(Ordering::Relaxed);
        if want != pinned {
            if sys::pin_to_cpu(want).is_err() {
                c.errors.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(POLL);
                continue;
            }
            pinned = want;
            c.cpu.store(want, Ordering::Relaxed);
        }
        // recv_from: an unconnected socket receives from many ports, and
        // the tag is checked against the sender's.
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                let inc = sys::incoming_cpu(sock).unwrap_or(-1);
                let sport = if ports.0 == 0 { from.port() } else { ports.0 };
                let v = payload::verify(buf.get(..n).unwrap_or(&[]), sport, ports.1);
                let late = track.record(v);
                c.publish(&track, late);
                let napi = sys::incoming_napi_id(sock).ok();
                c.count(inc, napi, pinned);
                if let (payload::Verdict::Seq { sent, .. }, Some(id)) = (v, napi) {
                    c.napi_sent(id, sent);
                    c.path_step(id, sent);
                }
                n_recv += 1;
                if echo > 0 && n_recv.is_multiple_of(echo) {
                    let ctr = match sock.send(&buf[..n]) {
                        Ok(_) => &c.echoed,
                        Err(_) => &c.echo_errors,
                    };
                    ctr.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            // ICMP port unreachable from an earlier send etc.: count, keep going.
            Err(_) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

struct TcpConn {
    peer: String,
    local_port: u16,
    counters: Arc<Counters>,
    reads: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    /// Pattern mismatches and the first one's offset (u64::MAX: none).
    pattern_errors: Arc<AtomicU64>,
    first_bad: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct TcpRun {
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    conns: Arc<Mutex<Vec<TcpConn>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl TcpRun {
    fn start(port: u16, cpus: Vec<usize>, echo: bool) -> Result<Self> {
        // [::] takes IPv4 connections too (v4-mapped peers); a kernel
        // without IPv6 gets the IPv4 wildcard.
        let l = TcpListener::bind(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port))
            .or_else(|_| TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)))
            .map_err(sys_err("bind tcp"))?;
        l.set_nonblocking(true).map_err(sys_err("nonblocking"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let conns: Arc<Mutex<Vec<TcpConn>>> = Arc::default();
        let (s, a, cs) = (stop.clone(), accepted.clone(), conns.clone());
        let ncpu = sys::online_cpus();
        let acceptor = std::thread::Builder::new()
            .name("tcp-accept".into())
            .stack_size(STACK)
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((stream, peer)) => {
                            let n = a.fetch_add(1, Ordering::Relaxed) as usize;
                            let cpu = cpus[n % cpus.len()];
                            if let Some(c) =
                                spawn_tcp_conn(stream, peer.to_string(), cpu, ncpu, echo, &s)
                            {
                                cs.lock()
                                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                                    .push(c);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(sys_err("spawn"))?;
        Ok(TcpRun {
            stop,
            accepted,
            conns,
            acceptor: Some(acceptor),
        })
    }

    fn stats(&self, running: bool) -> TcpStats {
        let conns = self
            .conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        TcpStats {
            running,
            accepted: self.accepted.load(Ordering::Relaxed),
            conns: conns
                .iter()
                .map(|c| TcpConnCounters {
                    peer: c.peer.clone(),
                    local_port: c.local_port,
                    cpu: c.counters.cpu.load(Ordering::Relaxed),
                    reads: c.reads.load(Ordering::Relaxed),
                    bytes: c.bytes.load(Ordering::Relaxed),
                    on_cpu: c.counters.on_cpu.load(Ordering::Relaxed),
                    by_cpu: c.counters.by_cpu(),
                    by_napi: c.counters.by_napi(),
                    closed: c.closed.load(Ordering::Relaxed),
                    pattern_errors: c.pattern_errors.load(Ordering::Relaxed),
                    first_bad: Some(c.first_bad.load(Ordering::Relaxed)).filter(|&o| o != u64::MAX),
                })
                .collect(),
        }
    }

    fn stop(mut self) -> TcpStats {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        {
            let mut conns = self
                .conns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for c in conns.iter_mut() {
                if let Some(t) = c.thread.take() {
                    let _ = t.join();
                }
            }
        }
        self.stats(false)
    }
}

fn spawn_tcp_conn(
    mut stream: TcpStream,
    peer: String,
    cpu: usize,
    ncpu: usize,
    echo: bool,
    stop: &Arc<AtomicBool>,
) -> Option<TcpConn> {
    let local_port = stream.local_addr().map_or(0, |a| a.port());
    let peer_port = stream.peer_addr().map_or(0, |a| a.port());
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(POLL)).ok()?;
    let counters = Arc::new(Counters::new(ncpu, cpu));
    let reads = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicBool::new(false));
    let pattern_errors = Arc::new(AtomicU64::new(0));
    let first_bad = Arc::new(AtomicU64::new(u64::MAX));
    let (ctr, nreads, nbytes, done, stop, perr, pfirst) = (
        counters.clone(),
        reads.clone(),
        bytes.clone(),
        closed.clone(),
        stop.clone(),
        pattern_errors.clone(),
        first_bad.clone(),
    );
    let thread = std::thread::Builder::new()
        .name(format!("tcp-{peer}"))
        .stack_size(STACK)
        .spawn(move || {
            if sys::pin_to_cpu(cpu).is_err() {
                ctr.errors.fetch_add(1, Ordering::Relaxed);
            }
            let mut buf = vec![0u8; 64 * 1024];
            while !stop.load(Ordering::Relaxed) {
                match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        // This thread is the only writer of `nbytes`: its
                        // value is this chunk's stream offset.
                        let off = nbytes.load(Ordering::Relaxed);
                        let (bad, first) =
                            vnic_agent::payload::stream_mismatches(peer_port, off, &buf[..n]);
                        if bad > 0 {
                            perr.fetch_add(bad, Ordering::Relaxed);
                            if let Some(f) = first {
                                let _ = pfirst.compare_exchange(
                                    u64::MAX,
                                    f,
                                    Ordering::Relaxed,
                                    Ordering::Relaxed,
                                );
                            }
                        }
                        nreads.fetch_add(1, Ordering::Relaxed);
                        nbytes.fetch_add(n as u64, Ordering::Relaxed);
                        ctr.count(
                            sys::incoming_cpu(&stream).unwrap_or(-1),
                            sys::incoming_napi_id(&stream).ok(),
                            cpu,
                        );
                        if echo && stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                        ) => {}
                    Err(_) => break,
                }
            }
            done.store(true, Ordering::Relaxed);
        })
        .ok()?;
    Some(TcpConn {
        peer,
        local_port,
        counters,
        reads,
        bytes,
        pattern_errors,
        first_bad,
        closed,
        thread: Some(thread),
    })
}

/// delete_module while a second thread times RTNL-taking operations (see
/// `Request::ProbedUnload`).
fn probed_unload(
    name: &str,
    ifname: &str,
    every_ms: u64,
    toggle_ntuple: bool,
) -> vnic_agent::proto::ProbedUnload {
    use vnic_agent::proto::ProbedUnload;
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let done = done.clone();
        let ifname = ifname.to_string();
        std::thread::spawn(move || {
            let mut r = ProbedUnload::default();
            let note = |r: &mut ProbedUnload, e: String| {
                if r.errors.len() < 5 {
                    r.errors.push(e);
                }
            };
            loop {
                // One more probe after the unload returned.
                let last = done.load(Ordering::Acquire);
                let t = Instant::now();
                if let Err(e) = sys::link_detected(&ifname) {
                    note(&mut r, format!("ETHTOOL_GLINK {ifname}: {e}"));
                }
                let ms = t.elapsed().as_secs_f64() * 1e3;
                r.probes += 1;
                r.max_probe_ms = r.max_probe_ms.max(ms);
                if ms > 100.0 {
                    r.slow_probes += 1;
                }
                if toggle_ntuple && !last {
                    let off = sys::set_feature(&ifname, "rx-ntuple-filter", false);
                    let on = sys::set_feature(&ifname, "rx-ntuple-filter", true);
                    match (off, on) {
                        (Ok(_), Ok(_)) => r.ntuple_toggles += 1,
                        (Err(e), _) | (_, Err(e)) => note(&mut r, format!("ntuple toggle: {e}")),
                    }
                }
                if last {
                    return r;
                }
                std::thread::sleep(Duration::from_millis(every_ms.max(1)));
            }
        })
    };
    // Let the prober take its first measurement before the unload starts.
    std::thread::sleep(Duration::from_millis(every_ms.max(1)));
    let t = Instant::now();
    let unload = sys::module_unload(name);
    let unload_ms = t.elapsed().as_secs_f64() * 1e3;
    done.store(true, Ordering::Release);
    let mut r = prober.join().unwrap_or_else(|_| ProbedUnload {
        errors: vec!["prober thread panicked".into()],
        ..ProbedUnload::default()
    });
    r.unload_ms = unload_ms;
    r.unload_error = unload.err().map(|e| format!("delete_module {name}: {e}"));
    r
}

#[cfg(test)]
mod tests {
    /// On the host every online CPU runs its pinned thread; a zero timeout
    /// still reports each CPU as ran or missing, never both.
    #[test]
    fn cpu_probe_sees_every_online_cpu() {
        let p = super::cpu_probe(std::time::Duration::from_secs(10));
        assert_eq!(p.cpus, super::sys::online_cpus());
        assert_eq!(p.ran, (0..p.cpus).collect::<Vec<_>>(), "{p:?}");
        assert!(p.missing.is_empty(), "{p:?}");
        let q = super::cpu_probe(std::time::Duration::ZERO);
        assert_eq!(q.ran.len() + q.missing.len(), q.cpus, "{q:?}");
        assert!(q.ran.iter().all(|c| !q.missing.contains(c)), "{q:?}");
    }
}
