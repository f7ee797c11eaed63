//! A vhost-user virtio-net *frontend* (the part QEMU plays) for tests and the
//! benchmark: it connects to a device socket with the `vhost` crate's
//! [`Frontend`], shares memfd-backed guest memory, lays split rings out in
//! it, negotiates features, and moves frames through RX/TX queue pairs. It
//! can also build broken descriptor chains to check the device survives a
//! hostile guest.
//!
//! Vring numbering follows virtio-net: pair `p` is rx vring `2p` and tx vring
//! `2p + 1`.

pub mod fuzz;
pub mod guest;
pub mod harness;
pub mod measure;
pub mod mem;
pub mod net;
pub mod pump;
pub mod ring;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VringConfigData};

pub use mem::GuestMem;
pub use net::{
    build_frame, parse_flow, FrameSpec, NetHdr, ParsedFlow, RxFrame, RxQueue, TxLayout, TxQueue,
    NET_HDR_LEN,
};
pub use ring::{Desc, DeviceFault, Hostile, RingLayout, SplitRing, UsedElem};

/// virtio-net feature bits.
pub mod features {
    pub const MRG_RXBUF: u64 = 1 << 15;
    pub const MQ: u64 = 1 << 22;
    pub const INDIRECT_DESC: u64 = 1 << 28;
    pub const EVENT_IDX: u64 = 1 << 29;
    pub const PROTOCOL_FEATURES: u64 = 1 << 30;
    pub const VERSION_1: u64 = 1 << 32;
    /// What the issue requires the device to offer.
    pub const REQUIRED: u64 =
        VERSION_1 | MQ | MRG_RXBUF | EVENT_IDX | INDIRECT_DESC | PROTOCOL_FEATURES;
}

/// Errors of the test frontend.
#[derive(Debug)]
pub enum Error {
    /// A vhost-user request failed.
    Vhost(&'static str, vhost::Error),
    /// An OS call failed.
    Io(std::io::Error),
    /// The device lacks something the driver needs.
    Missing(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Vhost(what, e) => write!(f, "vhost-user {what}: {e}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::Missing(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

fn vh<T>(what: &'static str, r: vhost::Result<T>) -> Result<T> {
    r.map_err(|e| Error::Vhost(what, e))
}

/// How the driver connects and lays out its queues.
#[derive(Clone, Debug)]
pub struct Options {
    /// Ring size of every queue (power of two).
    pub queue_size: u16,
    /// Bytes of the buffer behind each descriptor slot.
    pub buf_len: u32,
    /// Queue pairs to lay out memory for (<= what the device offers).
    pub pairs: u16,
    /// Virtio features to ask for (intersected with what the device offers).
    pub features: u64,
    /// Protocol features to ask for (intersected with the offer).
    pub protocol: VhostUserProtocolFeatures,
    /// Send the memory table with ADD_MEM_REG (CONFIGURE_MEM_SLOTS) instead
    /// of SET_MEM_TABLE.
    pub add_mem_reg: bool,
    /// Guest-physical address of guest memory (nonzero so that address 0 is
    /// outside it too).
    pub mem_base: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            queue_size: 256,
            buf_len: 2048,
            pairs: 1,
            features: features::REQUIRED,
            protocol: VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS,
            add_mem_reg: false,
            mem_base: 0x10_0000,
        }
    }
}

/// One queue pair's two halves.
#[derive(Debug)]
pub struct QueuePair {
    pub pair: u16,
    pub rx: RxQueue,
    pub tx: TxQueue,
}

/// A connected frontend: one vhost-user session with its guest memory.
pub struct Driver {
    fe: Frontend,
    mem: Arc<GuestMem>,
    opts: Options,
    /// Features the device offered.
    pub offered: u64,
    /// Features acknowledged with SET_FEATURES.
    pub acked: u64,
    /// Protocol features the device offered.
    pub offered_protocol: VhostUserProtocolFeatures,
    /// Protocol features acknowledged.
    pub acked_protocol: VhostUserProtocolFeatures,
    /// GET_QUEUE_NUM: vrings the device has.
    pub queue_num: u64,
    /// Max memory slots (GET_MAX_MEM_SLOTS) when CONFIGURE_MEM_SLOTS is acked.
    pub max_mem_slots: Option<u64>,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("offered", &format_args!("{:#x}", self.offered))
            .field("acked", &format_args!("{:#x}", self.acked))
            .field("queue_num", &self.queue_num)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Connect to `socket`, retrying until `timeout` while the daemon starts,
    /// then negotiate (see [`Driver::handshake`]).
    pub fn connect(socket: &Path, timeout: Duration, opts: Options) -> Result<Driver> {
        let deadline = Instant::now() + timeout;
        let fe = loop {
            match Frontend::connect(socket, 2 * opts.pairs as u64) {
                Ok(fe) => break fe,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(Error::Vhost("connect", e)),
            }
        };
        Self::handshake(fe, opts)
    }

    /// The QEMU-like session start: SET_OWNER, GET_FEATURES,
    /// GET/SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, SET_FEATURES, memory table.
    pub fn handshake(mut fe: Frontend, opts: Options) -> Result<Driver> {
        vh("SET_OWNER", fe.set_owner())?;
        let offered = vh("GET_FEATURES", fe.get_features())?;
        if offered & features::PROTOCOL_FEATURES == 0 {
            return Err(Error::Missing(format!(
                "device does not offer VHOST_USER_F_PROTOCOL_FEATURES (features {offered:#x})"
            )));
        }
        let offered_protocol = vh("GET_PROTOCOL_FEATURES", fe.get_protocol_features())?;
        let acked_protocol = offered_protocol & opts.protocol;
        vh(
            "SET_PROTOCOL_FEATURES",
            fe.set_protocol_features(acked_protocol),
        )?;
        if acked_protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            // Every request asks for an ACK so a device-side failure shows up
            // at the request that caused it.
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        let queue_num = if acked_protocol.contains(VhostUserProtocolFeatures::MQ) {
            vh("GET_QUEUE_NUM", fe.get_queue_num())?
        } else {
            2
        };
        if u64::from(opts.pairs) * 2 > queue_num {
            return Err(Error::Missing(format!(
                "asked for {} queue pairs, device has {queue_num} vrings",
                opts.pairs
            )));
        }
        let acked = offered & (opts.features | features::PROTOCOL_FEATURES);
        vh("SET_FEATURES", fe.set_features(acked))?;

        let per_queue = RingLayout::footprint(opts.queue_size, opts.buf_len);
        let size = (per_queue * 2 * opts.pairs as u64).next_multiple_of(2 << 20);
        let mem = Arc::new(GuestMem::new(opts.mem_base, size as usize)?);
        let mut max_mem_slots = None;
        if acked_protocol.contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS) {
            max_mem_slots = Some(vh("GET_MAX_MEM_SLOTS", fe.get_max_mem_slots())?);
        }
        let region = mem.region_info();
        if opts.add_mem_reg {
            vh("ADD_MEM_REG", fe.add_mem_region(&region))?;
        } else {
            vh("SET_MEM_TABLE", fe.set_mem_table(&[region]))?;
        }
        Ok(Driver {
            fe,
            mem,
            opts,
            offered,
            acked,
            offered_protocol,
            acked_protocol,
            queue_num,
            max_mem_slots,
        })
    }

    /// The raw vhost-user connection, for tests that send requests by hand.
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.fe
    }

    pub fn mem(&self) -> &Arc<GuestMem> {
        &self.mem
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    pub fn has(&self, feature: u64) -> bool {
        self.acked & feature == feature
    }

    /// Memory layout of vring `index`.
    pub fn layout(&self, index: usize) -> RingLayout {
        let per_queue = RingLayout::footprint(self.opts.queue_size, self.opts.buf_len);
        RingLayout::at(
            self.opts.mem_base + per_queue * index as u64,
            self.opts.queue_size,
            self.opts.buf_len,
        )
    }

    /// Give the device vring `index`: SET_VRING_NUM, SET_VRING_BASE,
    /// SET_VRING_ADDR, SET_VRING_KICK, SET_VRING_CALL (QEMU's order). The
    /// ring starts empty at index 0. Not enabled yet.
    pub fn setup_ring(&mut self, index: usize) -> Result<SplitRing> {
        if index >= 2 * self.opts.pairs as usize {
            return Err(Error::Missing(format!(
                "vring {index} is beyond the {} pairs laid out",
                self.opts.pairs
            )));
        }
        let l = self.layout(index);
        let ring = SplitRing::new(self.mem.clone(), l, index, self.has(features::EVENT_IDX))?;
        vh("SET_VRING_NUM", self.fe.set_vring_num(index, l.size))?;
        vh("SET_VRING_BASE", self.fe.set_vring_base(index, 0))?;
        let cfg = VringConfigData {
            queue_max_size: l.size,
            queue_size: l.size,
            flags: 0,
            desc_table_addr: self.mem.host_addr(l.desc),
            used_ring_addr: self.mem.host_addr(l.used),
            avail_ring_addr: self.mem.host_addr(l.avail),
            log_addr: None,
        };
        vh("SET_VRING_ADDR", self.fe.set_vring_addr(index, &cfg))?;
        vh(
            "SET_VRING_KICK",
            self.fe.set_vring_kick(index, ring.kick_fd()),
        )?;
        vh(
            "SET_VRING_CALL",
            self.fe.set_vring_call(index, ring.call_fd()),
        )?;
        Ok(ring)
    }

    /// Set up both vrings of `pair` (not enabled).
    pub fn setup_pair(&mut self, pair: u16) -> Result<QueuePair> {
        let rx = self.setup_ring(2 * pair as usize)?;
        let tx = self.setup_ring(2 * pair as usize + 1)?;
        Ok(QueuePair {
            pair,
            rx: RxQueue::new(rx, self.has(features::MRG_RXBUF)),
            tx: TxQueue::new(tx),
        })
    }

    /// SET_VRING_ENABLE on both vrings of `pair`.
    pub fn enable_pair(&mut self, pair: u16, on: bool) -> Result<()> {
        vh(
            "SET_VRING_ENABLE",
            self.fe.set_vring_enable(2 * pair as usize, on),
        )?;
        vh(
            "SET_VRING_ENABLE",
            self.fe.set_vring_enable(2 * pair as usize + 1, on),
        )?;
        Ok(())
    }

    /// Set up and enable pairs `0..n` (the usual start).
    pub fn start_pairs(&mut self, n: u16) -> Result<Vec<QueuePair>> {
        let mut v = Vec::with_capacity(n as usize);
        for p in 0..n {
            v.push(self.setup_pair(p)?);
        }
        for p in 0..n {
            self.enable_pair(p, true)?;
        }
        Ok(v)
    }

    /// SET_VRING_ERR: the eventfd the device signals when it stops the
    /// ring.
    pub fn set_vring_err(
        &mut self,
        index: usize,
        fd: &vmm_sys_util::eventfd::EventFd,
    ) -> Result<()> {
        vh("SET_VRING_ERR", self.fe.set_vring_err(index, fd))
    }

    /// SET_MEM_TABLE with `mem`'s one region, the driver's own memory left
    /// as it is: for tests that change the device's memory under running
    /// rings.
    pub fn send_mem_table(&mut self, mem: &GuestMem) -> Result<()> {
        vh("SET_MEM_TABLE", self.fe.set_mem_table(&[mem.region_info()])).map(|_| ())
    }

    /// GET_VRING_BASE: stops the ring in the device and returns its next
    /// avail index.
    pub fn get_vring_base(&mut self, index: usize) -> Result<u32> {
        vh("GET_VRING_BASE", self.fe.get_vring_base(index))
    }
}
