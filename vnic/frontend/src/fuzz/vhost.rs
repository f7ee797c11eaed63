//! Sequences of raw vhost-user messages over one connection.
//!
//! A sequence is a seed. It opens a connection to the daemon's vhost-user
//! socket and sends up to `max_messages` messages, each drawn as
//! - *valid* (70%): the next step of a QEMU-like session (SET_OWNER,
//!   features, protocol features, queue count, the memory table, each
//!   ring's NUM/BASE/ADDR/KICK/CALL, enables), and once rings run, guest
//!   traffic on them (tx frames, rx buffers, kicks), ring restarts
//!   (GET_VRING_BASE then a fresh set-up), enable toggles, a repeated
//!   memory table;
//! - *edge* (22%): well-formed but hostile: requests out of order (before
//!   SET_OWNER / SET_FEATURES), memory tables with overlapping,
//!   zero-length, huge, unaligned, past-the-file or wrapping regions and
//!   missing, extra or unmappable fds, vring addresses outside memory or
//!   unaligned, SET_VRING_NUM 0 / odd / over the maximum, SET_VRING_BASE
//!   past the ring, kicks and calls on vrings never set up (and the
//!   eventfds then signalled), GET_VRING_BASE on running rings, vring
//!   indexes beyond the device's, features and protocol features never
//!   offered, NEED_REPLY where REPLY_ACK is not negotiated, requests of
//!   features vnic does not offer (log, inflight, config, status, backend
//!   channel, device state), memory slots added and removed under running
//!   rings, hostile descriptor chains;
//! - *malformed* (8%): unknown request codes, payload sizes that do not
//!   match the request, a bad version or the reply bit, fds on requests
//!   that take none, more fds than a message may carry, payloads over
//!   vhost-user's 4 KiB and over the relay's 64 KiB, and disconnects in the
//!   middle of a header or a payload.
//!
//! A request the daemon refuses ends the connection (vhost-user-backend
//! drops the session on any error): the rest of the sequence is not sent.
//! Replies are read when one is due (GET_* requests; NEED_REPLY with
//! REPLY_ACK negotiated, as the sequence tracks it), everything else the
//! daemon writes is drained as it comes.

// Message builders: b = bytes, e/v/m = the class, i = vring index, l = layout.
#![allow(clippy::many_single_char_names)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{RawConn, ReadError, Rng};
use crate::features;
use crate::guest::discard_frame;
use crate::mem::GuestMem;
use crate::net::{RxQueue, TxQueue};
use crate::ring::{Hostile, RingLayout, SplitRing};

// Request codes (vhost-user spec, "Front-end message types").
pub const GET_FEATURES: u32 = 1;
pub const SET_FEATURES: u32 = 2;
pub const SET_OWNER: u32 = 3;
pub const RESET_OWNER: u32 = 4;
pub const SET_MEM_TABLE: u32 = 5;
pub const SET_LOG_BASE: u32 = 6;
pub const SET_LOG_FD: u32 = 7;
pub const SET_VRING_NUM: u32 = 8;
pub const SET_VRING_ADDR: u32 = 9;
pub const SET_VRING_BASE: u32 = 10;
pub const GET_VRING_BASE: u32 = 11;
pub const SET_VRING_KICK: u32 = 12;
pub const SET_VRING_CALL: u32 = 13;
pub const SET_VRING_ERR: u32 = 14;
pub const GET_PROTOCOL_FEATURES: u32 = 15;
pub const SET_PROTOCOL_FEATURES: u32 = 16;
pub const GET_QUEUE_NUM: u32 = 17;
pub const SET_VRING_ENABLE: u32 = 18;
pub const SEND_RARP: u32 = 19;
pub const NET_SET_MTU: u32 = 20;
pub const SET_BACKEND_REQ_FD: u32 = 21;
pub const IOTLB_MSG: u32 = 22;
pub const SET_VRING_ENDIAN: u32 = 23;
pub const GET_CONFIG: u32 = 24;
pub const SET_CONFIG: u32 = 25;
pub const GET_INFLIGHT_FD: u32 = 31;
pub const SET_INFLIGHT_FD: u32 = 32;
pub const RESET_DEVICE: u32 = 34;
pub const VRING_KICK: u32 = 35;
pub const GET_MAX_MEM_SLOTS: u32 = 36;
pub const ADD_MEM_REG: u32 = 37;
pub const REM_MEM_REG: u32 = 38;
pub const SET_STATUS: u32 = 39;
pub const GET_STATUS: u32 = 40;
pub const SET_DEVICE_STATE_FD: u32 = 42;
pub const CHECK_DEVICE_STATE: u32 = 43;

/// Header flags: version 1, the reply bit, NEED_REPLY.
pub const VERSION: u32 = 0x1;
pub const REPLY: u32 = 0x4;
pub const NEED_REPLY: u32 = 0x8;

/// Protocol feature REPLY_ACK (bit 3).
const PF_REPLY_ACK: u64 = 1 << 3;
/// Kick/call/err payload bit: no fd attached.
const NO_FD: u64 = 0x100;

/// What one sequence may do.
#[derive(Clone, Debug)]
pub struct Config {
    /// Queue pairs the daemon was started with (`--queues`).
    pub pairs: u16,
    /// Most messages of one sequence (each sequence draws 1..=this).
    pub max_messages: usize,
    /// How long a due reply may take before the sequence reports it.
    pub reply_timeout: Duration,
    /// Record a line per message sent (`--repro` prints them).
    pub trace: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pairs: 2,
            max_messages: 64,
            reply_timeout: Duration::from_secs(10),
            trace: false,
        }
    }
}

/// Message classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Valid,
    Edge,
    Malformed,
}

/// What one sequence did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Messages written whole to the socket.
    pub messages: u64,
    /// Per class and kind (`edge:mem_past_eof`, ...), messages written.
    pub kinds: BTreeMap<(Class, &'static str), u64>,
    /// The daemon closed the connection (it refused something).
    pub closed_by_daemon: bool,
    /// The sequence ended in the middle of a message.
    pub cut: bool,
    /// Replies read.
    pub replies: u64,
    /// A due reply that did not come in time, or a write the daemon did
    /// not take in time (the request that waited).
    pub stalled: Option<String>,
    /// Frames the guest side put on tx rings.
    pub frames: u64,
    /// One line per message (with `Config::trace`).
    pub trace: Vec<String>,
}

/// One pair's guest side.
struct Pair {
    rx: RxQueue,
    tx: TxQueue,
}

/// One message ready to go.
struct Msg {
    class: Class,
    kind: &'static str,
    bytes: Vec<u8>,
    fds: Vec<RawFd>,
    /// A reply is due (given what the sequence believes was negotiated).
    reply_due: bool,
    /// Write only this many bytes, then close (a disconnect mid-message).
    cut_at: Option<usize>,
}

fn header(code: u32, flags: u32, size: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + size as usize);
    b.extend_from_slice(&code.to_le_bytes());
    b.extend_from_slice(&flags.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b
}

fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// A memfd of `size` bytes.
fn memfd(size: u64) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the
    // returned descriptor (checked) is ours alone.
    let fd = unsafe { libc::memfd_create(c"vnic-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size)?;
    Ok(f.into())
}

/// A memory region as SET_MEM_TABLE / ADD_MEM_REG carry it.
#[derive(Clone, Copy, Debug)]
struct Region {
    gpa: u64,
    size: u64,
    uaddr: u64,
    offset: u64,
}

impl Region {
    /// A region mapped from the start of its file.
    fn at(gpa: u64, size: u64, uaddr: u64) -> Self {
        Region {
            gpa,
            size,
            uaddr,
            offset: 0,
        }
    }

    fn put(&self, b: &mut Vec<u8>) {
        put64(b, self.gpa);
        put64(b, self.size);
        put64(b, self.uaddr);
        put64(b, self.offset);
    }
}

/// The state of one sequence.
struct Seq<'a> {
    rng: Rng,
    cfg: &'a Config,
    conn: RawConn,
    out: Outcome,
    mem: Arc<GuestMem>,
    layout_queue: u16,
    owner: bool,
    got_features: bool,
    offered: u64,
    offered_protocol: u64,
    protocol_acked: u64,
    features_acked: bool,
    /// Features sent with the last valid SET_FEATURES.
    acked: u64,
    mem_set: bool,
    /// Per vring (0..2*pairs): set-up steps done (0..=5) and its ring.
    rings: Vec<(u8, Option<SplitRing>)>,
    /// Per pair, its guest queues once both rings are set up.
    pairs: Vec<Option<Pair>>,
    /// Vrings set up and not yet enabled (the set-up's last step).
    to_enable: Vec<u32>,
    /// Regions sent in edge tables: addresses vrings may be pointed into.
    odd_regions: Vec<Region>,
    /// Memfds, eventfds and other fds sent: kept open until the end.
    keep: Vec<OwnedFd>,
    keep_events: Vec<EventFd>,
    dead: bool,
    frame: Vec<u8>,
}

/// Runs the sequence `seed` against the vhost-user socket at `socket`.
pub fn run(socket: &Path, seed: u64, cfg: &Config) -> io::Result<Outcome> {
    let conn = RawConn::connect(socket, cfg.reply_timeout)?;
    let queue = 64u16;
    let per = RingLayout::footprint(queue, 2048);
    let size = (per * 2 * u64::from(cfg.pairs)).next_multiple_of(2 << 20);
    let mem = Arc::new(GuestMem::new(0x10_0000, size as usize)?);
    let nrings = 2 * cfg.pairs as usize;
    let mut s = Seq {
        rng: Rng::new(seed),
        cfg,
        conn,
        out: Outcome::default(),
        mem,
        layout_queue: queue,
        owner: false,
        got_features: false,
        offered: 0,
        offered_protocol: 0,
        protocol_acked: 0,
        features_acked: false,
        acked: 0,
        mem_set: false,
        rings: (0..nrings).map(|_| (0, None)).collect(),
        pairs: (0..cfg.pairs).map(|_| None).collect(),
        to_enable: Vec::new(),
        odd_regions: Vec::new(),
        keep: Vec::new(),
        keep_events: Vec::new(),
        dead: false,
        frame: discard_frame(),
    };
    let n = s.rng.range(1, cfg.max_messages.max(1) as u64);
    // Most sequences set the device up whole before the first hostile
    // message (8 session messages, 5 per ring, 2 enables per pair; a
    // refusal ends the connection, so without this few sequences would
    // reach running rings); the others turn hostile at any point of the
    // set-up.
    let setup = 8 + 7 * u64::from(cfg.pairs);
    let prefix = if s.rng.chance(60) {
        setup + s.rng.below(8)
    } else {
        s.rng.below(setup)
    };
    let mut i = 0;
    while i < n && !s.dead {
        let m = if i < prefix { s.valid()? } else { s.draw()? };
        s.send(m);
        i += 1;
        if !s.dead && s.rng.chance(30) {
            s.traffic();
        }
    }
    if !s.dead && s.rng.chance(8) {
        // The last message cut short: a disconnect mid-message.
        let m = s.malformed_cut();
        s.send(m);
    }
    Ok(s.out)
}

impl Seq<'_> {
    fn reply_ack(&self) -> bool {
        self.got_features && self.protocol_acked & PF_REPLY_ACK != 0
    }

    fn flags(&mut self) -> u32 {
        // QEMU asks for an ACK on most requests once REPLY_ACK is on.
        if self.reply_ack() && self.rng.chance(70) {
            VERSION | NEED_REPLY
        } else {
            VERSION
        }
    }

    fn msg(&self, class: Class, kind: &'static str, bytes: Vec<u8>, fds: Vec<RawFd>) -> Msg {
        let code = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let flags = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let get = matches!(
            code,
            GET_FEATURES
                | GET_PROTOCOL_FEATURES
                | GET_QUEUE_NUM
                | GET_VRING_BASE
                | GET_MAX_MEM_SLOTS
        );
        let acked = matches!(
            code,
            SET_OWNER
                | RESET_OWNER
                | SET_FEATURES
                | SET_MEM_TABLE
                | SET_VRING_NUM
                | SET_VRING_ADDR
                | SET_VRING_BASE
                | SET_VRING_KICK
                | SET_VRING_CALL
                | SET_VRING_ERR
                | SET_PROTOCOL_FEATURES
                | SET_VRING_ENABLE
                | ADD_MEM_REG
                | REM_MEM_REG
        ) && flags & NEED_REPLY != 0;
        let reply_due = class != Class::Malformed
            && flags & (REPLY | !0xf) == 0
            && flags & 0x3 == VERSION
            && (get || (acked && self.reply_ack()));
        Msg {
            class,
            kind,
            bytes,
            fds,
            reply_due,
            cut_at: None,
        }
    }

    /// A payload-only request (8-byte u64).
    fn u64_req(&mut self, code: u32, v: u64) -> Vec<u8> {
        let f = self.flags();
        let mut b = header(code, f, 8);
        put64(&mut b, v);
        b
    }

    fn state_req(&mut self, code: u32, index: u32, num: u32) -> Vec<u8> {
        let f = self.flags();
        let mut b = header(code, f, 8);
        put32(&mut b, index);
        put32(&mut b, num);
        b
    }

    fn empty_req(&mut self, code: u32) -> Vec<u8> {
        let f = self.flags();
        header(code, f, 0)
    }

    fn nrings(&self) -> u32 {
        2 * u32::from(self.cfg.pairs)
    }

    /// A vring index: mostly ours, sometimes the device's last ones,
    /// beyond them, or far off.
    fn vring_index(&mut self) -> u32 {
        match self.rng.below(10) {
            0 => self.nrings() + self.rng.below(4) as u32,
            1 => *self.rng.pick(&[255, 256, 0x1_0000, u32::MAX]),
            2 => 32 + self.rng.below(200) as u32,
            _ => self.rng.below(u64::from(self.nrings())) as u32,
        }
    }

    fn layout(&self, index: usize) -> RingLayout {
        let per = RingLayout::footprint(self.layout_queue, 2048);
        RingLayout::at(
            self.mem.base() + per * index as u64,
            self.layout_queue,
            2048,
        )
    }

    fn region_of_mem(&self) -> Region {
        let r = self.mem.region_info();
        Region {
            gpa: r.guest_phys_addr,
            size: r.memory_size,
            uaddr: r.userspace_addr,
            offset: r.mmap_offset,
        }
    }

    fn mem_fd(&self) -> RawFd {
        self.mem.region_info().mmap_handle
    }

    fn new_event(&mut self) -> io::Result<RawFd> {
        let e = EventFd::new(EFD_NONBLOCK)?;
        let fd = e.as_raw_fd();
        self.keep_events.push(e);
        Ok(fd)
    }

    fn new_memfd(&mut self, size: u64) -> io::Result<RawFd> {
        let f = memfd(size)?;
        let fd = f.as_raw_fd();
        self.keep.push(f);
        Ok(fd)
    }

    /// An fd nobody can map as guest memory.
    fn unmappable_fd(&mut self) -> io::Result<RawFd> {
        Ok(match self.rng.below(4) {
            0 => self.new_event()?,
            1 => {
                let f: OwnedFd = File::open("/dev/null")?.into();
                let fd = f.as_raw_fd();
                self.keep.push(f);
                fd
            }
            2 => {
                let (a, b) = std::os::unix::net::UnixStream::pair()?;
                let fd = a.as_raw_fd();
                self.keep.push(a.into());
                self.keep.push(b.into());
                fd
            }
            _ => {
                // A read-only view of a memfd: a shared writable mapping
                // of it fails.
                let m = memfd(1 << 20)?;
                let path = format!("/proc/self/fd/{}", m.as_raw_fd());
                let ro: OwnedFd = File::open(path)?.into();
                let fd = ro.as_raw_fd();
                self.keep.push(m);
                self.keep.push(ro);
                fd
            }
        })
    }

    // ---- drawing --------------------------------------------------------

    fn draw(&mut self) -> io::Result<Msg> {
        let r = self.rng.below(100);
        if r < 70 {
            self.valid()
        } else if r < 92 {
            self.edge()
        } else {
            self.malformed()
        }
    }

    /// The next step of a well-behaved session, or an action on a
    /// running one.
    fn valid(&mut self) -> io::Result<Msg> {
        let v = Class::Valid;
        if !self.owner {
            self.owner = true;
            let b = self.empty_req(SET_OWNER);
            return Ok(self.msg(v, "SET_OWNER", b, vec![]));
        }
        if !self.got_features {
            self.got_features = true;
            let b = header(GET_FEATURES, VERSION, 0);
            return Ok(self.msg(v, "GET_FEATURES", b, vec![]));
        }
        if self.offered_protocol == 0 {
            let b = header(GET_PROTOCOL_FEATURES, VERSION, 0);
            return Ok(self.msg(v, "GET_PROTOCOL_FEATURES", b, vec![]));
        }
        if self.protocol_acked == 0 {
            // MQ | REPLY_ACK | CONFIGURE_MEM_SLOTS, as far as offered;
            // now and then without REPLY_ACK.
            let mut want = (1 << 0) | PF_REPLY_ACK | (1 << 15);
            if self.rng.chance(25) {
                want &= !PF_REPLY_ACK;
            }
            self.protocol_acked = (self.offered_protocol & want) | (1 << 0);
            let b = self.u64_req(SET_PROTOCOL_FEATURES, self.protocol_acked);
            return Ok(self.msg(v, "SET_PROTOCOL_FEATURES", b, vec![]));
        }
        if !self.features_acked {
            self.features_acked = true;
            let mut f = self.offered & (features::REQUIRED | features::PROTOCOL_FEATURES);
            if self.rng.chance(20) {
                // Drop some optional features (EVENT_IDX, MRG_RXBUF, ...).
                f &= !(self.rng.next_u64()
                    & (features::EVENT_IDX | features::MRG_RXBUF | features::INDIRECT_DESC));
            }
            self.acked = f;
            let b = self.u64_req(SET_FEATURES, f);
            return Ok(self.msg(v, "SET_FEATURES", b, vec![]));
        }
        if !self.mem_set {
            self.mem_set = true;
            return Ok(self.mem_table_msg(
                v,
                "SET_MEM_TABLE",
                &[self.region_of_mem()],
                vec![self.mem_fd()],
            ));
        }
        // The next ring step, else something on a running device.
        if let Some(i) = self.to_enable.pop() {
            let b = self.state_req(SET_VRING_ENABLE, i, 1);
            return Ok(self.msg(v, "SET_VRING_ENABLE", b, vec![]));
        }
        if let Some(i) = self.rings.iter().position(|r| r.0 < 5) {
            return self.ring_step(i);
        }
        match self.rng.below(8) {
            0 | 1 => {
                let p = self.rng.below(u64::from(self.cfg.pairs)) as u32;
                let on = u32::from(self.rng.chance(80));
                let i = 2 * p + self.rng.below(2) as u32;
                let b = self.state_req(SET_VRING_ENABLE, i, on);
                Ok(self.msg(v, "SET_VRING_ENABLE", b, vec![]))
            }
            2 => {
                // Restart a ring: GET_VRING_BASE now, a fresh set-up next.
                let i = self.rng.below(u64::from(self.nrings())) as usize;
                let p = i / 2;
                self.rings[2 * p] = (0, None);
                self.rings[2 * p + 1] = (0, None);
                self.pairs[p] = None;
                let b = self.state_req(GET_VRING_BASE, i as u32, 0);
                Ok(self.msg(v, "GET_VRING_BASE(restart)", b, vec![]))
            }
            3 => Ok(self.mem_table_msg(
                v,
                "SET_MEM_TABLE(again)",
                &[self.region_of_mem()],
                vec![self.mem_fd()],
            )),
            4 => {
                let b = header(GET_QUEUE_NUM, VERSION, 0);
                Ok(self.msg(v, "GET_QUEUE_NUM", b, vec![]))
            }
            5 => {
                let b = header(GET_MAX_MEM_SLOTS, VERSION, 0);
                Ok(self.msg(v, "GET_MAX_MEM_SLOTS", b, vec![]))
            }
            _ => {
                let b = header(GET_FEATURES, VERSION, 0);
                Ok(self.msg(v, "GET_FEATURES", b, vec![]))
            }
        }
    }

    fn ring_step(&mut self, i: usize) -> io::Result<Msg> {
        let v = Class::Valid;
        let l = self.layout(i);
        let step = self.rings[i].0;
        self.rings[i].0 += 1;
        Ok(match step {
            0 => {
                let ring = SplitRing::new(
                    self.mem.clone(),
                    l,
                    i,
                    self.acked & features::EVENT_IDX != 0,
                )?;
                self.rings[i].1 = Some(ring);
                let b = self.state_req(SET_VRING_NUM, i as u32, u32::from(l.size));
                self.msg(v, "SET_VRING_NUM", b, vec![])
            }
            1 => {
                let b = self.state_req(SET_VRING_BASE, i as u32, 0);
                self.msg(v, "SET_VRING_BASE", b, vec![])
            }
            2 => {
                let (d, u, a) = (
                    self.mem.host_addr(l.desc),
                    self.mem.host_addr(l.used),
                    self.mem.host_addr(l.avail),
                );
                let b = self.vring_addr(i as u32, 0, d, u, a, 0);
                self.msg(v, "SET_VRING_ADDR", b, vec![])
            }
            3 | 4 => {
                let ring = self.rings[i].1.as_ref().expect("set at step 0");
                let fd = if step == 3 {
                    ring.kick_fd().as_raw_fd()
                } else {
                    ring.call_fd().as_raw_fd()
                };
                let code = if step == 3 {
                    SET_VRING_KICK
                } else {
                    SET_VRING_CALL
                };
                let b = self.u64_req(code, i as u64);
                let m = self.msg(
                    v,
                    if step == 3 {
                        "SET_VRING_KICK"
                    } else {
                        "SET_VRING_CALL"
                    },
                    b,
                    vec![fd],
                );
                if step == 4 {
                    self.pair_ready(i / 2);
                }
                m
            }
            _ => unreachable!("ring steps are 0..5"),
        })
    }

    /// Both rings of pair `p` set up: build its guest queues.
    fn pair_ready(&mut self, p: usize) {
        let (r, t) = (2 * p, 2 * p + 1);
        if self.rings[r].0 >= 5 && self.rings[t].0 >= 5 {
            let (Some(rx), Some(tx)) = (self.rings[r].1.take(), self.rings[t].1.take()) else {
                return;
            };
            self.to_enable.extend([t as u32, r as u32]);
            self.pairs[p] = Some(Pair {
                rx: RxQueue::new(rx, self.acked & features::MRG_RXBUF != 0),
                tx: TxQueue::new(tx),
            });
        }
    }

    fn vring_addr(
        &mut self,
        index: u32,
        flags: u32,
        desc: u64,
        used: u64,
        avail: u64,
        log: u64,
    ) -> Vec<u8> {
        let f = self.flags();
        let mut b = header(SET_VRING_ADDR, f, 40);
        put32(&mut b, index);
        put32(&mut b, flags);
        put64(&mut b, desc);
        put64(&mut b, used);
        put64(&mut b, avail);
        put64(&mut b, log);
        b
    }

    fn mem_table_msg(
        &mut self,
        class: Class,
        kind: &'static str,
        regions: &[Region],
        fds: Vec<RawFd>,
    ) -> Msg {
        let f = self.flags();
        let mut b = header(SET_MEM_TABLE, f, 8 + 32 * regions.len() as u32);
        put32(&mut b, regions.len() as u32);
        put32(&mut b, 0);
        for r in regions {
            r.put(&mut b);
        }
        self.msg(class, kind, b, fds)
    }

    /// Guest traffic on the pairs that are set up (not a message).
    fn traffic(&mut self) {
        let frame = self.frame.clone();
        let mut sent = 0;
        for p in self.pairs.iter_mut().flatten() {
            p.rx.fill();
            let _ = p.tx.reap();
            while let Ok(Some(_)) = p.rx.recv_discard() {}
            if p.tx.ring.free_slots() > 0 && p.tx.send(&frame).is_some() {
                sent += 1;
            }
        }
        self.out.frames += sent;
    }

    /// Well-formed, hostile.
    fn edge(&mut self) -> io::Result<Msg> {
        let e = Class::Edge;
        let kinds = 24;
        Ok(match self.rng.below(kinds) {
            0 => {
                // A set-up request out of order (before SET_OWNER,
                // SET_FEATURES or the memory table, or again).
                let code = *self.rng.pick(&[
                    SET_VRING_NUM,
                    SET_VRING_BASE,
                    SET_VRING_ENABLE,
                    GET_VRING_BASE,
                    SET_FEATURES,
                    SET_PROTOCOL_FEATURES,
                    SET_OWNER,
                    GET_QUEUE_NUM,
                    GET_MAX_MEM_SLOTS,
                ]);
                let b = match code {
                    SET_FEATURES => self.u64_req(code, features::REQUIRED),
                    SET_PROTOCOL_FEATURES => self.u64_req(code, 0x8009),
                    SET_OWNER => self.empty_req(code),
                    GET_QUEUE_NUM | GET_MAX_MEM_SLOTS => header(code, VERSION, 0),
                    _ => {
                        let i = self.vring_index();
                        self.state_req(code, i, 1)
                    }
                };
                self.msg(e, "out_of_order", b, vec![])
            }
            1..=5 => self.edge_mem_table()?,
            6 | 7 => {
                // Vring addresses outside memory, straddling its end,
                // unaligned, in an odd region, or with the log flag.
                let i = self.vring_index();
                let l = self.layout(i.min(self.nrings() - 1) as usize);
                let good = (
                    self.mem.host_addr(l.desc),
                    self.mem.host_addr(l.used),
                    self.mem.host_addr(l.avail),
                );
                let end = self.mem.host_addr(self.mem.end() - 1) + 1;
                let mut a = [good.0, good.1, good.2];
                let which = self.rng.below(3) as usize;
                a[which] = match self.rng.below(6) {
                    0 => self.rng.edge_u64(),
                    1 => end - self.rng.range(1, 64),
                    2 => a[which] + self.rng.range(1, 15),
                    3 => end + self.rng.below(1 << 20),
                    4 => match self.odd_regions.last() {
                        Some(r) => r.uaddr.wrapping_add(self.rng.below(r.size.max(1)) & !0xf),
                        None => self.rng.edge_u64(),
                    },
                    _ => 0,
                };
                let flags = u32::from(self.rng.chance(20));
                let log = if flags == 1 { self.rng.edge_u64() } else { 0 };
                let b = self.vring_addr(i, flags, a[0], a[1], a[2], log);
                self.msg(e, "vring_addr_outside", b, vec![])
            }
            8 => {
                let i = self.vring_index();
                let num = *self.rng.pick(&[
                    0,
                    1,
                    3,
                    255,
                    257,
                    1023,
                    1025,
                    2048,
                    4096,
                    32768,
                    65535,
                    65536,
                    u32::MAX,
                ]);
                let b = self.state_req(SET_VRING_NUM, i, num);
                self.msg(e, "vring_num_edge", b, vec![])
            }
            9 => {
                let i = self.vring_index();
                let base = match self.rng.below(3) {
                    0 => u32::from(self.layout_queue) + self.rng.below(1000) as u32,
                    1 => 0xffff - self.rng.below(4) as u32,
                    _ => self.rng.edge_u32(),
                };
                let b = self.state_req(SET_VRING_BASE, i, base);
                self.msg(e, "vring_base_past_ring", b, vec![])
            }
            10 | 11 => {
                // Kick / call / err eventfds on a vring never set up (or
                // beyond the device's), signalled right away; or the
                // no-fd flag.
                let i = self.vring_index() & 0xff;
                let code = *self
                    .rng
                    .pick(&[SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR]);
                let nofd = self.rng.chance(20);
                let fd = self.new_event()?;
                if let Some(ev) = self.keep_events.last() {
                    let _ = ev.write(1);
                }
                let b = self.u64_req(code, u64::from(i) | if nofd { NO_FD } else { 0 });
                self.msg(
                    e,
                    "kick_call_unset_vring",
                    b,
                    if nofd { vec![] } else { vec![fd] },
                )
            }
            12 => {
                // GET_VRING_BASE on a running ring (the device stops it;
                // the sequence goes on using its old state).
                let i = self.rng.below(u64::from(self.nrings())) as u32;
                let b = self.state_req(GET_VRING_BASE, i, 0);
                self.msg(e, "get_vring_base_running", b, vec![])
            }
            13 => {
                let i = self.vring_index();
                let on = *self.rng.pick(&[0, 1, 2, u32::MAX]);
                let b = self.state_req(SET_VRING_ENABLE, i, on);
                self.msg(e, "vring_enable_edge", b, vec![])
            }
            14 => {
                let bits = self.rng.next_u64() | (1 << self.rng.below(64));
                let b = self.u64_req(SET_FEATURES, bits);
                self.msg(e, "features_not_offered", b, vec![])
            }
            15 => {
                let bits = self.rng.next_u64() | (1 << self.rng.below(64));
                self.protocol_acked = bits;
                let b = self.u64_req(SET_PROTOCOL_FEATURES, bits);
                self.msg(e, "protocol_features_not_offered", b, vec![])
            }
            16 => {
                // NEED_REPLY on a request where REPLY_ACK is not on (or
                // is): whatever comes back is drained.
                let mut b = self.state_req(SET_VRING_ENABLE, 0, 1);
                b[4..8].copy_from_slice(&(VERSION | NEED_REPLY).to_le_bytes());
                let mut m = self.msg(e, "need_reply_not_negotiated", b, vec![]);
                m.reply_due = self.reply_ack();
                m
            }
            17 => self.unoffered_request()?,
            18 | 19 => self.edge_mem_slot()?,
            20 => {
                let b = self.empty_req(RESET_OWNER);
                self.owner = false;
                self.msg(e, "reset_owner", b, vec![])
            }
            21 => {
                // A hostile chain on a running ring.
                let kinds = Hostile::ALL;
                let k = *self.rng.pick(&kinds);
                let rx = self.rng.chance(50);
                if let Some(p) = self.pairs.iter_mut().flatten().next() {
                    let ring = if rx { &mut p.rx.ring } else { &mut p.tx.ring };
                    if ring.free_slots() > 8 && ring.push_hostile(k, rx).is_ok() {
                        ring.kick();
                    }
                }
                let b = header(GET_FEATURES, VERSION, 0);
                self.msg(e, "hostile_chain", b, vec![])
            }
            22 => {
                // The avail index jumps (the device stops that ring and
                // signals its error eventfd).
                if let Some(p) = self.pairs.iter_mut().flatten().next() {
                    p.tx.ring.publish_jump(1000);
                    p.tx.ring.kick();
                }
                let b = header(GET_FEATURES, VERSION, 0);
                self.msg(e, "avail_jump", b, vec![])
            }
            _ => {
                let b = header(VRING_KICK, VERSION | NEED_REPLY, 8);
                let mut b = b;
                let i = self.vring_index();
                put32(&mut b, i);
                put32(&mut b, 0);
                self.msg(e, "vring_kick_msg", b, vec![])
            }
        })
    }

    /// SET_MEM_TABLE, hostile.
    fn edge_mem_table(&mut self) -> io::Result<Msg> {
        let e = Class::Edge;
        let good = self.region_of_mem();
        let gfd = self.mem_fd();
        let small = 64 * 1024;
        let mut regions = Vec::new();
        let mut fds = Vec::new();
        let keep_good = self.rng.chance(70);
        if keep_good {
            regions.push(good);
            fds.push(gfd);
        }
        let kind: &'static str;
        let uaddr = 0x7000_0000_0000u64 + (self.rng.below(1 << 20) << 12);
        let gpa_free = good.gpa + good.size + (self.rng.below(64) << 20);
        match self.rng.below(12) {
            0 => {
                kind = "mem_overlap";
                let fd = self.new_memfd(2 << 20)?;
                regions.push(Region::at(
                    good.gpa + 0x1000 * self.rng.below(16),
                    2 << 20,
                    uaddr,
                ));
                fds.push(fd);
            }
            1 => {
                kind = "mem_zero_length";
                let fd = self.new_memfd(small)?;
                regions.push(Region::at(gpa_free, 0, uaddr));
                fds.push(fd);
            }
            2 => {
                kind = "mem_huge";
                let fd = self.new_memfd(small)?;
                let size = *self.rng.pick(&[1 << 40, 1 << 46, 1 << 47, !0xfff, 1 << 63]);
                regions.push(Region {
                    gpa: gpa_free,
                    size,
                    uaddr,
                    offset: 0,
                });
                fds.push(fd);
            }
            3 => {
                kind = "mem_unaligned";
                let fd = self.new_memfd(small)?;
                let (gpa, size, offset) = match self.rng.below(3) {
                    0 => (gpa_free, small, self.rng.range(1, 4095)),
                    1 => (gpa_free + self.rng.range(1, 4095), small, 0),
                    _ => (gpa_free, small - self.rng.range(1, 4095), 0),
                };
                regions.push(Region {
                    gpa,
                    size,
                    uaddr: uaddr + self.rng.below(4096),
                    offset,
                });
                fds.push(fd);
            }
            4 => {
                // Bigger than its file: mapping succeeds, reading past the
                // end of the file would fault.
                kind = "mem_past_eof";
                let fd = self.new_memfd(small)?;
                let r = Region::at(gpa_free, 4 << 20, uaddr);
                self.odd_regions.push(r);
                regions.push(r);
                fds.push(fd);
            }
            5 => {
                kind = "mem_offset_past_eof";
                let fd = self.new_memfd(small)?;
                let r = Region {
                    gpa: gpa_free,
                    size: small,
                    uaddr,
                    offset: 1 << 20,
                };
                self.odd_regions.push(r);
                regions.push(r);
                fds.push(fd);
            }
            6 => {
                kind = "mem_gpa_wraps";
                let fd = self.new_memfd(2 * small)?;
                regions.push(Region::at(u64::MAX - small + 1, 2 * small, uaddr));
                fds.push(fd);
            }
            7 => {
                kind = "mem_fewer_fds";
                let fd = self.new_memfd(small)?;
                regions.push(Region::at(gpa_free, small, uaddr));
                regions.push(Region::at(gpa_free + (1 << 20), small, uaddr + (1 << 20)));
                fds.push(fd);
                if self.rng.chance(50) {
                    fds.clear();
                }
            }
            8 => {
                kind = "mem_extra_fds";
                let fd = self.new_memfd(small)?;
                regions.push(Region::at(gpa_free, small, uaddr));
                fds.push(fd);
                for _ in 0..self.rng.range(1, 4) {
                    let x = self.new_event()?;
                    fds.push(x);
                }
            }
            9 => {
                kind = "mem_unmappable_fd";
                let fd = self.unmappable_fd()?;
                regions.push(Region::at(gpa_free, small, uaddr));
                fds.push(fd);
            }
            10 => {
                kind = "mem_same_uaddr";
                let fd = self.new_memfd(small)?;
                regions.push(Region::at(gpa_free, small, good.uaddr));
                fds.push(fd);
            }
            _ => {
                kind = "mem_many_regions";
                let n = *self.rng.pick(&[0u64, 8, 9, 32, 33, 64]);
                regions.clear();
                fds.clear();
                for k in 0..n {
                    let fd = self.new_memfd(4096)?;
                    regions.push(Region::at(gpa_free + (k << 20), 4096, uaddr + (k << 20)));
                    if fds.len() < 32 {
                        fds.push(fd);
                    }
                }
            }
        }
        if self.rng.chance(15) {
            // num_regions that disagrees with the payload.
            let f = self.flags();
            let mut b = header(SET_MEM_TABLE, f, 8 + 32 * regions.len() as u32);
            put32(&mut b, regions.len() as u32 + 1);
            put32(&mut b, 0);
            for r in &regions {
                r.put(&mut b);
            }
            return Ok(self.msg(e, "mem_count_mismatch", b, fds));
        }
        Ok(self.mem_table_msg(e, kind, &regions, fds))
    }

    /// ADD_MEM_REG / REM_MEM_REG (CONFIGURE_MEM_SLOTS), hostile.
    fn edge_mem_slot(&mut self) -> io::Result<Msg> {
        let e = Class::Edge;
        let good = self.region_of_mem();
        let small = 64 * 1024;
        let uaddr = 0x7100_0000_0000u64 + (self.rng.below(1 << 20) << 12);
        let gpa_free = good.gpa + good.size + (self.rng.below(64) << 20);
        let (code, kind, region, fds) = match self.rng.below(6) {
            0 => {
                let fd = self.new_memfd(small)?;
                (
                    ADD_MEM_REG,
                    "add_mem_reg",
                    Region::at(gpa_free, small, uaddr),
                    vec![fd],
                )
            }
            1 => {
                let fd = self.new_memfd(small)?;
                let r = Region::at(gpa_free, 4 << 20, uaddr);
                self.odd_regions.push(r);
                (ADD_MEM_REG, "add_mem_reg_past_eof", r, vec![fd])
            }
            2 => {
                let fd = self.new_memfd(small)?;
                (
                    ADD_MEM_REG,
                    "add_mem_reg_overlap",
                    Region::at(good.gpa, small, uaddr),
                    vec![fd],
                )
            }
            3 => {
                let n = self.rng.below(3);
                let mut fds = Vec::new();
                for _ in 0..n {
                    fds.push(self.new_memfd(small)?);
                }
                if n == 1 {
                    fds.push(self.new_memfd(small)?);
                }
                (
                    ADD_MEM_REG,
                    "add_mem_reg_bad_fds",
                    Region::at(gpa_free, small, uaddr),
                    fds,
                )
            }
            4 => (REM_MEM_REG, "rem_mem_reg_in_use", good, vec![]),
            _ => (
                REM_MEM_REG,
                "rem_mem_reg_unknown",
                Region::at(gpa_free, small, uaddr),
                vec![],
            ),
        };
        let f = self.flags();
        let mut b = header(code, f, 40);
        put64(&mut b, 0);
        region.put(&mut b);
        Ok(self.msg(e, kind, b, fds))
    }

    /// Requests of features vnic does not offer (the device must refuse
    /// them, not act on them).
    fn unoffered_request(&mut self) -> io::Result<Msg> {
        let e = Class::Edge;
        let code = *self.rng.pick(&[
            SET_LOG_BASE,
            SET_LOG_FD,
            SEND_RARP,
            NET_SET_MTU,
            SET_BACKEND_REQ_FD,
            IOTLB_MSG,
            SET_VRING_ENDIAN,
            GET_CONFIG,
            SET_CONFIG,
            GET_INFLIGHT_FD,
            SET_INFLIGHT_FD,
            RESET_DEVICE,
            SET_STATUS,
            GET_STATUS,
            SET_DEVICE_STATE_FD,
            CHECK_DEVICE_STATE,
        ]);
        let f = self.flags();
        let (b, fds) = match code {
            SET_LOG_BASE => {
                let mut b = header(code, f, 16);
                put64(&mut b, 4096);
                put64(&mut b, 0);
                (b, vec![self.new_memfd(4096)?])
            }
            SET_LOG_FD | SET_BACKEND_REQ_FD => {
                let b = header(code, f, 0);
                let fd = if code == SET_LOG_FD {
                    self.new_event()?
                } else {
                    self.unmappable_fd()?
                };
                (b, vec![fd])
            }
            GET_CONFIG | SET_CONFIG => {
                let mut b = header(code, f, 12 + 8);
                put32(&mut b, 0);
                put32(&mut b, 8);
                put32(&mut b, 0);
                put64(&mut b, 0);
                (b, vec![])
            }
            GET_INFLIGHT_FD | SET_INFLIGHT_FD => {
                let mut b = header(code, f, 24);
                put64(&mut b, 4096);
                put64(&mut b, 0);
                put64(&mut b, 0x0040_0004);
                let fds = if code == SET_INFLIGHT_FD {
                    vec![self.new_memfd(4096)?]
                } else {
                    vec![]
                };
                (b, fds)
            }
            SET_DEVICE_STATE_FD => {
                let mut b = header(code, f, 8);
                put32(&mut b, 0);
                put32(&mut b, 0);
                (b, vec![self.new_event()?])
            }
            RESET_DEVICE | GET_STATUS | CHECK_DEVICE_STATE => (header(code, f, 0), vec![]),
            IOTLB_MSG => {
                let mut b = header(code, f, 40);
                for _ in 0..5 {
                    put64(&mut b, self.rng.edge_u64());
                }
                (b, vec![])
            }
            _ => {
                let v = self.rng.edge_u64();
                (self.u64_req(code, v), vec![])
            }
        };
        Ok(self.msg(e, "not_offered", b, fds))
    }

    /// Malformed at the framing level.
    fn malformed(&mut self) -> io::Result<Msg> {
        let m = Class::Malformed;
        Ok(match self.rng.below(9) {
            0 => {
                let code = match self.rng.below(3) {
                    0 => 0,
                    1 => 45 + self.rng.below(100) as u32,
                    _ => match self.rng.edge_u32() {
                        c @ 1..=44 => c + 1000,
                        c => c,
                    },
                };
                let size = self.rng.below(64) as u32;
                let mut b = header(code, VERSION, size);
                b.resize(12 + size as usize, 0xa5);
                self.msg(m, "unknown_code", b, vec![])
            }
            1 | 2 => {
                // A known request with a payload of the wrong size (the
                // header tells the truth about what follows).
                let code = self.rng.range(1, 44) as u32;
                let size = *self.rng.pick(&[0u32, 1, 4, 7, 9, 12, 16, 39, 41, 100]);
                let mut b = header(code, VERSION, size);
                for _ in 0..size {
                    b.push(self.rng.next_u32() as u8);
                }
                self.msg(m, "wrong_size", b, vec![])
            }
            3 => {
                let flags =
                    *self
                        .rng
                        .pick(&[0, 2, 3, VERSION | REPLY, 0xffff_ffff, VERSION | 0x10]);
                let mut b = header(GET_FEATURES, flags, 0);
                if self.rng.chance(50) {
                    b = header(SET_VRING_NUM, flags, 8);
                    put32(&mut b, 0);
                    put32(&mut b, 64);
                }
                self.msg(m, "bad_flags", b, vec![])
            }
            4 => {
                let fd = self.new_event()?;
                let b = header(GET_FEATURES, VERSION, 0);
                self.msg(m, "fds_on_fdless_request", b, vec![fd])
            }
            5 => {
                let n = self.rng.range(33, 64);
                let mut fds = Vec::new();
                for _ in 0..n {
                    fds.push(self.new_event()?);
                }
                let b = self.u64_req(SET_VRING_KICK, 0);
                self.msg(m, "too_many_fds", b, fds)
            }
            6 => {
                // Over vhost-user's 4 KiB (sent whole), or over the
                // relay's 64 KiB (the header alone, then nothing).
                if self.rng.chance(60) {
                    let size = self.rng.range(0x1001, 0x10000) as u32;
                    let mut b = header(SET_MEM_TABLE, VERSION, size);
                    b.resize(12 + size as usize, 0);
                    self.msg(m, "oversized", b, vec![])
                } else {
                    let size = self.rng.range(0x1_0001, u64::from(u32::MAX)) as u32;
                    let b = header(SET_MEM_TABLE, VERSION, size);
                    self.msg(m, "oversized_relay", b, vec![])
                }
            }
            7 => {
                // The header promises less than follows: the rest is read
                // as the next header.
                let mut b = header(SET_VRING_NUM, VERSION, 4);
                put32(&mut b, 0);
                put32(&mut b, 64);
                put64(&mut b, self.rng.next_u64());
                self.msg(m, "short_size", b, vec![])
            }
            _ => self.malformed_cut(),
        })
    }

    /// A message cut short, then the connection closed.
    fn malformed_cut(&mut self) -> Msg {
        let m = Class::Malformed;
        let (b, kind) = if self.rng.chance(50) {
            (header(GET_FEATURES, VERSION, 0), "cut_header")
        } else {
            let l = self.layout(0);
            let (d, u, a) = (l.desc, l.used, l.avail);
            (self.vring_addr(0, 0, d, u, a, 0), "cut_payload")
        };
        let cut = if kind == "cut_header" {
            self.rng.range(1, 11) as usize
        } else {
            self.rng.range(12, b.len() as u64 - 1) as usize
        };
        let mut msg = self.msg(m, kind, b, vec![]);
        msg.cut_at = Some(cut);
        msg.reply_due = false;
        msg
    }

    // ---- sending --------------------------------------------------------

    fn send(&mut self, mut m: Msg) {
        // Whatever class drew it, a well-formed SET_PROTOCOL_FEATURES
        // changes what the handler acks (it stores the value before it
        // answers): follow it, or a reply would be awaited in vain.
        if m.cut_at.is_none() && m.bytes.len() == 20 {
            let w = |i: usize| {
                u32::from_le_bytes([m.bytes[i], m.bytes[i + 1], m.bytes[i + 2], m.bytes[i + 3]])
            };
            if w(0) == SET_PROTOCOL_FEATURES && w(4) & !(NEED_REPLY) == VERSION && w(8) == 8 {
                self.protocol_acked =
                    u64::from_le_bytes(m.bytes[12..20].try_into().expect("8 bytes"));
                if m.class != Class::Malformed {
                    m.reply_due = w(4) & NEED_REPLY != 0 && self.reply_ack();
                }
            }
        }
        let bytes = match m.cut_at {
            Some(n) => &m.bytes[..n],
            None => &m.bytes[..],
        };
        let code = u32::from_le_bytes([m.bytes[0], m.bytes[1], m.bytes[2], m.bytes[3]]);
        if self.cfg.trace {
            self.out.trace.push(format!(
                "{:?} {} code {code} len {} fds {}{}",
                m.class,
                m.kind,
                m.bytes.len() - 12,
                m.fds.len(),
                m.cut_at
                    .map_or(String::new(), |n| format!(" cut at {n} then closed"))
            ));
        }
        match self.conn.send(bytes, &m.fds) {
            Ok(()) => {}
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                self.out.stalled = Some(format!(
                    "{} (code {code}): the daemon took no bytes for {:?}",
                    m.kind, self.cfg.reply_timeout
                ));
                self.dead = true;
                return;
            }
            Err(_) => {
                self.out.closed_by_daemon = true;
                self.dead = true;
                return;
            }
        }
        if m.cut_at.is_some() {
            self.out.cut = true;
            self.dead = true;
            return;
        }
        self.out.messages += 1;
        *self.out.kinds.entry((m.class, m.kind)).or_default() += 1;
        if m.reply_due {
            match self.conn.read_vhost_reply(self.cfg.reply_timeout) {
                Ok((rcode, _flags, payload)) => {
                    self.out.replies += 1;
                    if rcode == code && payload.len() == 8 {
                        let v = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
                        match code {
                            GET_FEATURES => self.offered = v,
                            GET_PROTOCOL_FEATURES => self.offered_protocol = v.max(1),
                            _ => {}
                        }
                    }
                }
                Err(ReadError::Closed | ReadError::Io(_)) => {
                    self.out.closed_by_daemon = true;
                    self.dead = true;
                }
                Err(ReadError::Timeout) => {
                    self.out.stalled = Some(format!(
                        "{} (code {code}): no reply within {:?}",
                        m.kind, self.cfg.reply_timeout
                    ));
                    self.dead = true;
                }
            }
        } else if let Err(ReadError::Closed | ReadError::Io(_)) = self.conn.drain() {
            self.out.closed_by_daemon = true;
            self.dead = true;
        }
        if code == GET_PROTOCOL_FEATURES && self.offered_protocol == 0 {
            // No usable reply: still move on in the session.
            self.offered_protocol = 1;
        }
    }
}
