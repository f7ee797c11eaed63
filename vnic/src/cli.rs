//! Command line (clap): `vnic serve ...` and `vnic ctl ...`.

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use vnic_ctl_proto::{Client, FlowSpec, GenOp, Request};

use crate::config::{self, Config, PeerKind};

#[derive(Parser, Debug)]
#[command(
    name = "vnic",
    version,
    about = "A multi-queue vhost-user virtio-net device with an aRFS flow filter table",
    long_about = "vnic is a virtual NIC for QEMU served over vhost-user. Its receive side holds an \
aRFS flow filter table that the guest programs with in-band management frames (EtherType 0x88B5, \
see aRFS/PROTOCOL.md); every filter event can be traced. `vnic serve` runs the device, `vnic ctl` \
talks to a running one (protocol in vnic/CTL.md). Logging: RUST_LOG (default: warnings only)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the device on a vhost-user socket (QEMU connects to it).
    Serve(ServeArgs),
    /// Talk to a running daemon through its control socket.
    Ctl(CtlArgs),
    /// Summarise or plot a trace file written by `vnic serve --trace FILE`.
    Trace(vnic_trace::TraceArgs),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Path of the vhost-user socket to listen on (QEMU: -chardev socket,path=PATH). Created mode
    /// 0600 (0660 with --group) whatever the umask. A stale socket file (nobody listening) is replaced; a socket a live
    /// process answers on, or a path that is not a socket, is refused.
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// Number of queue pairs offered, 1..=16 (QEMU: -netdev vhost-user,queues=N may use up to
    /// this many). One worker thread per pair.
    #[arg(long, value_name = "N", default_value = "4", value_parser = config::parse_queues)]
    pub queues: u16,
    /// The far side of the NIC: `gen` (built-in generator/responder/sink, needs no privileges)
    /// or `tap:IFNAME` (a multi-queue tap with a virtio-net header, needs CAP_NET_ADMIN or a
    /// persistent tap owned by the user).
    #[arg(long, value_name = "gen|tap:IFNAME", default_value = "gen", value_parser = config::parse_peer)]
    pub peer: PeerKind,
    /// MAC address of the generator peer (what it answers ARP with and sends from). The guest
    /// NIC's own MAC is set by QEMU (-device virtio-net-pci,mac=...).
    #[arg(long, value_name = "MAC", default_value = "02:76:6e:69:63:01", value_parser = config::parse_mac)]
    pub mac: [u8; 6],
    /// IPv4 address of the generator peer: it answers ARP and ICMP echo for it. Give the guest
    /// an address in the same /24 (default guest address 10.0.2.15).
    #[arg(long, value_name = "IPV4", default_value = "10.0.2.1", value_parser = config::parse_ipv4)]
    pub gen_ip: Ipv4Addr,
    /// IPv6 address of the generator peer: it answers neighbour solicitation and ICMPv6 echo for
    /// it (the guest suite gives the guest fd00:2::15/64).
    #[arg(long, value_name = "IPV6", default_value = "fd00:2::1", value_parser = config::parse_ipv6)]
    pub gen_ip6: Ipv6Addr,
    /// IPv4 address of the guest: the default destination of generated flows.
    #[arg(long, value_name = "IPV4", default_value = "10.0.2.15", value_parser = config::parse_ipv4)]
    pub guest_ip: Ipv4Addr,
    /// Most filters the table holds, 1..=65535.
    #[arg(long, value_name = "N", default_value = "8192", value_parser = config::parse_capacity)]
    pub table_capacity: u32,
    /// Locations of the masked rule stage that `ethtool -N` programs (the rule extension of
    /// aRFS/PROTOCOL.md), 0..=1024; 0: a device without it (its CAPS never offers it, nor the
    /// RSS extension, which the same 32-byte CAPS announces; RSS_SET is still taken).
    #[arg(long, value_name = "N", default_value = "128",
          value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub rule_locations: u32,
    /// Hardware-like placement model: B buckets of W ways, chosen by the flow's Toeplitz hash
    /// (`1024x4`); a full bucket rejects an ADD with bucket_full. `none` for no placement model.
    #[arg(long, value_name = "BxW", default_value = "none", value_parser = parse_buckets_arg)]
    pub buckets: Buckets,
    /// Programming latency: table ops take effect (and are acknowledged) this long after the
    /// device receives them; packets follow the old state meanwhile. E.g. 0, 500us, 2ms; a bare
    /// number is microseconds. Changeable at run time (`vnic ctl set program_latency=...`).
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = config::parse_duration)]
    pub program_latency: Duration,
    /// Probability (0.0..=1.0) that a valid ADD op fails with injected_failure.
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub add_fail_rate: f64,
    /// Probability (0.0..=1.0) that a management frame is lost, drawn separately for each
    /// request received and each reply sent.
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub mgmt_loss_rate: f64,
    /// Fault: deliver every frame that hits a filter to the next enabled rx queue after the
    /// one the filter names (a NIC that steers wrongly; counted as peer.misrouted). For
    /// checking that a test watches where frames really arrive. Changeable at run time
    /// (`vnic ctl set misroute=1|0`).
    #[arg(long)]
    pub misroute: bool,
    /// Fault: deliver this fraction (0.0..=1.0) of the frames that hit a filter to the next
    /// enabled rx queue (counted after the hit; peer.misrouted). `--misroute` is rate 1.
    /// Changeable at run time (`vnic ctl set misroute_rate=P`).
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub misroute_rate: f64,
    /// Fault: drop this fraction (0.0..=1.0) of the frames that hit a filter, counting them as
    /// delivered by their queue (peer.fault_dropped counts the lie). `vnic ctl set drop_rate=P`.
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub drop_rate: f64,
    /// Fault: flip the last payload byte of this fraction (0.0..=1.0) of the UDP and TCP frames
    /// that hit a filter, keeping their checksum valid (peer.fault_corrupted). `vnic ctl set
    /// corrupt_rate=P`.
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub corrupt_rate: f64,
    /// Fault: as --corrupt-rate, but the checksum is left stale, so that the guest's stack
    /// drops the frame as a checksum error (peer.fault_bad_csum). `vnic ctl set bad_csum_rate=P`.
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub bad_csum_rate: f64,
    /// Fault: cut the last 16 payload bytes of this fraction (0.0..=1.0) of the UDP and TCP
    /// frames that hit a filter, IP/UDP lengths and checksums kept consistent, so that only the
    /// length the payload carries tells (peer.fault_truncated). `vnic ctl set truncate_rate=P`.
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub truncate_rate: f64,
    /// Fault: hold back this fraction (0.0..=1.0) of the frames that hit a filter and deliver
    /// each after its flow's next frame (peer.fault_reordered). `vnic ctl set reorder_rate=P`.
    #[arg(long, value_name = "P", default_value = "0", value_parser = config::parse_rate)]
    pub reorder_rate: f64,
    /// Seed of the fault-injection random draws (add failures, management loss).
    #[arg(long, value_name = "N", default_value = "1")]
    pub seed: u64,
    /// Write one JSON line per filter-table event to FILE (truncated at start).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Control socket path. Default: the vhost-user socket path with `.ctl` appended. Same rules
    /// as --socket (and not the same path); only clients of this user or root (or of --group)
    /// are served (SO_PEERCRED).
    #[arg(long, value_name = "SOCKET")]
    pub ctl: Option<PathBuf>,
    /// Share both sockets with a group (name or gid): they are created 0660 and owned by it, and
    /// the control socket also serves processes whose primary or supplementary group it is (e.g.
    /// QEMU running as another user of that group). The daemon must be allowed to chown to it.
    #[arg(long, value_name = "GROUP", value_parser = config::parse_group)]
    pub group: Option<u32>,
    /// Largest virtqueue size accepted (power of two, 256..=32768). QEMU's rx_queue_size /
    /// tx_queue_size must not exceed it.
    #[arg(long, value_name = "N", default_value = "1024", value_parser = config::parse_queue_size)]
    pub max_queue_size: u16,
    /// For benchmarks: install N filters (ids 0..N-1, 0..=--table-capacity) each time the device
    /// comes up, for frontends that cannot send management frames (DPDK's virtio-user; see
    /// scripts/bench-dpdk). A new connection or a device reset empties the table as always; the
    /// filters go in, through the same table path as the guest's ADD ops, once all --queues pairs
    /// are enabled (`ctl table` shows them). Which of them match traffic: --preload-match.
    #[arg(long, value_name = "N", default_value = "0", value_parser = config::parse_filter_count)]
    pub preload_filters: u32,
    /// For benchmarks: the first M preloaded filters match the flows `gen start --flows M` sends
    /// with its default addresses and ports (UDP --gen-ip:10000+i -> --guest-ip:5001, i < M),
    /// each steering its flow to the rx queue RSS picks for it; the other filters are UDP flows
    /// from 172.16.0.0/16 that nothing sends (generated frames miss them). 0..=N, at most 55536.
    #[arg(long, value_name = "M", default_value = "0", value_parser = config::parse_filter_count)]
    pub preload_match: u32,
    /// Busy-poll each tx ring for up to N microseconds after its last chain, and each rx ring
    /// for up to N after a frame found it out of buffers, before asking the driver for kicks
    /// again and sleeping (0: never). The spin is adaptive, as QEMU's iothreads poll, with a
    /// window per ring: it starts at 0 and grows (4 us, then doubling up to N) only after the
    /// worker slept and the ring's next entry came sooner than N; a gap longer than N halves
    /// it. So a guest that sends, or takes, a steady stream stops paying a kick and a wake-up
    /// per burst (a polling driver such as DPDK's virtio PMD otherwise kicks each time the
    /// worker catches up), while one that sends or refills now and then is never spun for:
    /// the cost is at most N us of one CPU after each burst that followed a short gap, during
    /// which this worker's other work waits. The spin yields the CPU at each turn (a vCPU
    /// thread sharing it still runs); the tx spin is skipped while the batch holds replies or
    /// frames for the guest, and the rx spin starts after the batch's frames are published.
    /// `ctl stats` counts it per queue (tx_spins, tx_spins_found, tx_spin_ns; rx_spins,
    /// rx_spins_found, rx_spin_ns). 0..=1000.
    #[arg(long, value_name = "N", default_value = "32", value_parser = config::parse_poll_us)]
    pub poll_us: u64,
    /// Spin the whole --poll-us every time a ring runs dry instead of adapting (the
    /// behaviour before the adaptive spin; a whole CPU whenever the gaps are shorter than N).
    #[arg(long)]
    pub poll_fixed: bool,
    /// How the device picks a frame's rx queue. `filters` (the default): parse the frame, look
    /// its flow up in the filter table, RSS on a miss, as an aRFS NIC does. `none`, for
    /// benchmarks of the data path alone (the same work as a vhost backend that does not
    /// steer): no parse and no lookup; a frame goes to the rx queue of the worker that has it,
    /// counted in rx_rss; filters can be installed but steer nothing; management frames from
    /// the peer are still refused.
    #[arg(long, value_name = "MODE", default_value = "filters", value_parser = ["filters", "none"])]
    pub steer: String,
    /// How the rx stage writes frame bytes into the guest's buffers. `auto` (the default): each
    /// worker keeps whichever of the two delivers more frames a second, probing the other now and
    /// then (a clock read every 8 rx batches): streamed stores (non-temporal, whole lines) leave
    /// the lines in memory, so a driver on another CPU does not take each one from the worker's
    /// cache; plain stores are cheaper when the driver runs on the worker's CPU. `stream` or
    /// `plain` fixes one (for benchmarks that must not adapt). The guest sees the same bytes,
    /// before the same used index, in every mode; `ctl stats` counts per queue the frames
    /// written plainly (rx_plain) and the mode changes (rx_store_switches).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = config::parse_rx_stores)]
    pub rx_stores: config::RxStores,
}

impl ServeArgs {
    pub(crate) fn into_config(self) -> Config {
        let ctl = self.ctl.unwrap_or_else(|| {
            let mut s = self.socket.clone().into_os_string();
            s.push(".ctl");
            PathBuf::from(s)
        });
        Config {
            socket: self.socket,
            ctl,
            queues: self.queues,
            max_queue_size: self.max_queue_size,
            peer: self.peer,
            gen_mac: self.mac,
            gen_ip: self.gen_ip,
            gen_ip6: self.gen_ip6,
            guest_ip: self.guest_ip,
            table_capacity: self.table_capacity,
            rule_locations: self.rule_locations,
            buckets: self.buckets.0,
            program_latency: self.program_latency,
            add_fail_rate: self.add_fail_rate,
            mgmt_loss_rate: self.mgmt_loss_rate,
            seed: self.seed,
            trace: self.trace,
            misroute: self.misroute,
            fault_rates: [
                self.misroute_rate,
                self.drop_rate,
                self.corrupt_rate,
                self.bad_csum_rate,
                self.truncate_rate,
                self.reorder_rate,
            ],
            group: self.group,
            preload: config::Preload {
                filters: self.preload_filters,
                matching: self.preload_match,
            },
            poll: config::PollCfg {
                max: Duration::from_micros(self.poll_us),
                fixed: self.poll_fixed,
            },
            steer_none: self.steer == "none",
            rx_stores: self.rx_stores,
        }
    }
}

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Control socket of the daemon (default: vnic.sock.ctl, what `vnic serve --socket
    /// vnic.sock` uses).
    #[arg(long, value_name = "SOCKET", default_value = "vnic.sock.ctl")]
    pub ctl: PathBuf,
    #[command(subcommand)]
    pub cmd: CtlCmd,
}

#[derive(Subcommand, Debug)]
pub enum CtlCmd {
    /// Print all counters (JSON).
    Stats,
    /// Dump the live filters with their hit counts (JSON).
    Table,
    /// Print the fault-injection knobs (JSON).
    Knobs,
    /// Change a knob: add_fail_rate=P, mgmt_loss_rate=P, program_latency=DURATION.
    Set {
        /// KEY=VALUE
        #[arg(value_name = "KEY=VALUE", value_parser = parse_kv)]
        kv: (String, String),
    },
    /// Control the generator's UDP flow sets.
    #[command(subcommand)]
    Gen(GenCmd),
    /// Send a raw JSON request line (see CTL.md) and print the reply.
    Raw {
        #[arg(value_name = "JSON")]
        json: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum GenCmd {
    /// Start a flow set; prints its id.
    Start(FlowArgs),
    /// Change a running flow set (only the given fields change; its packet count restarts).
    Set {
        /// Flow set id.
        id: u32,
        #[command(flatten)]
        flow: FlowArgs,
    },
    /// Stop one flow set, or all when no id is given.
    Stop {
        /// Flow set id.
        id: Option<u32>,
    },
    /// Pause one flow set, or all when no id is given: it sends nothing, stays listed with
    /// its count, and resumes with each flow's next sequence number.
    Pause {
        /// Flow set id.
        id: Option<u32>,
    },
    /// Resume one paused flow set, or all when no id is given.
    Resume {
        /// Flow set id.
        id: Option<u32>,
    },
    /// List flow sets with packets sent.
    List,
}

#[derive(Args, Debug, Default)]
pub struct FlowArgs {
    /// Number of distinct UDP 5-tuples (default 1).
    #[arg(long)]
    pub flows: Option<u32>,
    /// Source address or inclusive range A-B (default: the generator's address).
    #[arg(long)]
    pub src: Option<String>,
    /// Source port or inclusive range LO-HI (default 10000).
    #[arg(long)]
    pub sport: Option<String>,
    /// Destination address (default: the guest address).
    #[arg(long)]
    pub dst: Option<String>,
    /// Destination port or range (default 5001).
    #[arg(long)]
    pub dport: Option<String>,
    /// Total packets over all flows of the set; 0 = until stopped (default 0).
    #[arg(long)]
    pub count: Option<u64>,
    /// Packets per second over the whole set; 0 = as fast as possible (default 1000).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Ethernet frame size in bytes without FCS, 60..=1514 (default 64).
    #[arg(long)]
    pub size: Option<usize>,
    /// Stamp each frame's payload with its send time: a guest that echoes the
    /// datagrams back to the generator gives round-trip times (`stats`: peer.rtt).
    #[arg(long)]
    pub stamp: bool,
}

impl FlowArgs {
    /// The flow spec of the given options (a flag not given is left out).
    fn to_spec(&self) -> FlowSpec {
        FlowSpec {
            flows: self.flows,
            src: self.src.clone(),
            sport: self.sport.clone(),
            dst: self.dst.clone(),
            dport: self.dport.clone(),
            count: self.count,
            rate: self.rate,
            size: self.size,
            stamp: self.stamp.then_some(true),
        }
    }
}

/// The bucket geometry option (a newtype: clap treats a bare `Option` as "optional").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buckets(pub Option<(u32, u16)>);

fn parse_buckets_arg(s: &str) -> Result<Buckets, config::InvalidValue> {
    config::parse_buckets(s).map(Buckets)
}

fn parse_kv(s: &str) -> Result<(String, String), config::InvalidValue> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(config::InvalidValue(format!(
            "expected KEY=VALUE, got {s:?}"
        ))),
    }
}

/// `vnic serve`: runs the daemon until a signal ends the process.
pub fn serve(args: ServeArgs) -> Result<(), crate::error::Error> {
    crate::serve::run(args.into_config())
}

/// Why `vnic ctl` failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlFailed {
    /// No reply.
    #[error(transparent)]
    Ctl(#[from] vnic_ctl_proto::CtlError),
    /// `vnic ctl raw` with text that is not JSON.
    #[error("invalid JSON request: {0}")]
    BadJson(serde_json::Error),
    /// The daemon's error message (`"ok": false`).
    #[error("{0}")]
    Refused(String),
}

/// `vnic ctl`: one request, the reply pretty-printed.
pub fn run_ctl(args: &CtlArgs) -> Result<(), CtlFailed> {
    let gen = |op, id, flow| Request::gen(op, id, flow);
    let req = match &args.cmd {
        CtlCmd::Stats => Request::Stats,
        CtlCmd::Table => Request::Table,
        CtlCmd::Knobs => Request::Knobs,
        CtlCmd::Set { kv } => Request::set(kv.0.clone(), kv.1.clone()),
        CtlCmd::Gen(GenCmd::Start(f)) => gen(GenOp::Start, None, Some(f.to_spec())),
        CtlCmd::Gen(GenCmd::Set { id, flow }) => gen(GenOp::Set, Some(*id), Some(flow.to_spec())),
        CtlCmd::Gen(GenCmd::Stop { id }) => gen(GenOp::Stop, *id, None),
        CtlCmd::Gen(GenCmd::Pause { id }) => gen(GenOp::Pause, *id, None),
        CtlCmd::Gen(GenCmd::Resume { id }) => gen(GenOp::Resume, *id, None),
        CtlCmd::Gen(GenCmd::List) => gen(GenOp::List, None, None),
        CtlCmd::Raw { json } => {
            let v = serde_json::from_str(json).map_err(CtlFailed::BadJson)?;
            return print_reply(&Client::connect(&args.ctl)?.send_value(&v)?);
        }
    };
    let v = serde_json::to_value(&req).map_err(vnic_ctl_proto::CtlError::Encode)?;
    print_reply(&Client::connect(&args.ctl)?.send_value(&v)?)
}

/// Prints an `ok` reply; the daemon's error otherwise.
fn print_reply(reply: &Value) -> Result<(), CtlFailed> {
    if reply.get("ok") == Some(&Value::Bool(true)) {
        // A reader that went away (`vnic ctl stats | head`) ends the
        // output, not the process with a panic.
        let mut out = std::io::stdout().lock();
        let text = serde_json::to_string_pretty(reply).unwrap_or_default();
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
        Ok(())
    } else {
        Err(CtlFailed::Refused(
            reply
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("request failed")
                .to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("vnic").chain(args.iter().copied()))
    }

    #[test]
    fn serve_defaults() {
        let Command::Serve(a) = parse(&["serve", "--socket", "vnic.sock"]).unwrap().command else {
            panic!()
        };
        let c = a.into_config();
        assert_eq!(c.queues, 4);
        assert_eq!(c.peer, PeerKind::Gen);
        assert_eq!(c.ctl, PathBuf::from("vnic.sock.ctl"));
        assert_eq!(c.buckets, None);
        assert_eq!(c.program_latency, Duration::ZERO);
        assert_eq!(c.rx_stores, crate::config::RxStores::Auto);
        for (v, m) in [
            ("stream", crate::config::RxStores::Stream),
            ("plain", crate::config::RxStores::Plain),
        ] {
            let Command::Serve(a) = parse(&["serve", "--socket", "s", "--rx-stores", v])
                .unwrap()
                .command
            else {
                panic!()
            };
            assert_eq!(a.into_config().rx_stores, m);
        }
    }

    #[test]
    fn bad_values_name_the_option() {
        for (args, opt) in [
            (&["serve", "--socket", "s", "--queues", "0"][..], "--queues"),
            (
                &["serve", "--socket", "s", "--queues", "17"][..],
                "--queues",
            ),
            (
                &["serve", "--socket", "s", "--buckets", "12"][..],
                "--buckets",
            ),
            (
                &["serve", "--socket", "s", "--program-latency", "soon"][..],
                "--program-latency",
            ),
            (
                &["serve", "--socket", "s", "--add-fail-rate", "2"][..],
                "--add-fail-rate",
            ),
            (&["serve", "--socket", "s", "--peer", "tun0"][..], "--peer"),
            (&["serve", "--socket", "s", "--mac", "zz"][..], "--mac"),
            (
                &["serve", "--socket", "s", "--table-capacity", "0"][..],
                "--table-capacity",
            ),
            (
                &["serve", "--socket", "s", "--rx-stores", "nt"][..],
                "--rx-stores",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{args:?}");
            assert!(e.to_string().contains(opt), "{args:?}: {e}");
        }
        assert_eq!(
            parse(&["serve"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn ctl_commands() {
        let c = parse(&["ctl", "set", "mgmt_loss_rate=0.1"]).unwrap();
        let Command::Ctl(a) = c.command else { panic!() };
        assert!(
            matches!(a.cmd, CtlCmd::Set { ref kv } if kv.0 == "mgmt_loss_rate" && kv.1 == "0.1")
        );
        assert!(parse(&["ctl", "set", "novalue"]).is_err());
        let c = parse(&[
            "ctl", "--ctl", "x.ctl", "gen", "start", "--flows", "10", "--sport", "1-10", "--rate",
            "0",
        ])
        .unwrap();
        let Command::Ctl(a) = c.command else { panic!() };
        let CtlCmd::Gen(GenCmd::Start(f)) = a.cmd else {
            panic!()
        };
        assert_eq!(
            serde_json::to_value(f.to_spec()).unwrap(),
            serde_json::json!({"flows": 10, "sport": "1-10", "rate": 0})
        );
    }
}
