//! A small "guest": a connected [`Driver`] with its queue pairs, a stash of
//! received frames per rx queue, and a management-channel session (HELLO,
//! ADD, DEL, FLUSH with sequence numbers, replies matched by `seq`) built on
//! the `arfs` codec. Tests and the benchmark use it.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use arfs::proto::AddOp;
use arfs::proto::{self, Ack, Caps, DelOp, FrameMeta, Header, Hello, Message, MsgType};

use super::net::RxFrame;
use super::{DeviceFault, Driver, Options, QueuePair, Result};

/// The MAC the test guest uses.
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

/// A 128-byte UDP frame from the guest (10.0.2.15:40000) to the gen peer's
/// discard port (10.0.2.1:9), which the peer takes and counts: what a test
/// sends to see a tx queue move.
pub fn discard_frame() -> Vec<u8> {
    super::net::build_frame(&super::net::FrameSpec {
        src_mac: GUEST_MAC,
        dst_mac: [0xff; 6],
        src: std::net::Ipv4Addr::new(10, 0, 2, 15).into(),
        dst: std::net::Ipv4Addr::new(10, 0, 2, 1).into(),
        proto: 17,
        sport: 40000,
        dport: 9,
        len: 128,
    })
}

/// A received frame and the rx queue it came on.
#[derive(Clone, Debug)]
pub struct Received {
    pub rxq: u16,
    pub frame: RxFrame,
}

/// A management reply (CAPS or ACK) and where it arrived.
#[derive(Clone, Debug)]
pub struct Reply {
    pub rxq: u16,
    /// The Ethernet source (the device's MAC, or another station's).
    pub src: [u8; 6],
    pub header: Header,
    pub message: Message,
}

impl Reply {
    /// The ACK body; panics with the reply when it is something else.
    pub fn ack(&self) -> &Ack {
        match &self.message {
            Message::Ack(a) => a,
            m => panic!("expected an ACK, got {m:?}"),
        }
    }

    /// The CAPS body; panics with the reply when it is something else.
    pub fn caps(&self) -> &Caps {
        match &self.message {
            Message::Caps(c) => c,
            m => panic!("expected CAPS, got {m:?}"),
        }
    }
}

/// Driver + queues + stash + management session.
pub struct Guest {
    pub drv: Driver,
    pub qps: Vec<QueuePair>,
    /// Data frames received and not yet taken, per rx queue.
    pub stash: Vec<VecDeque<RxFrame>>,
    /// Management replies received and not yet matched.
    pub replies: Vec<Reply>,
    /// Management frames the device sent that did not decode.
    pub bad_replies: Vec<String>,
    /// Next management sequence number.
    pub seq: u32,
    /// Generation seen in the last device frame.
    pub generation: u32,
    /// Which tx queue management requests go out on.
    pub mgmt_txq: u16,
    /// Faults the driver detected in what the device wrote.
    pub faults: Vec<DeviceFault>,
    /// Rx queues `poll` must not refill (tests that post buffers by hand).
    pub no_refill: Vec<bool>,
}

impl std::fmt::Debug for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest")
            .field("pairs", &self.qps.len())
            .field("seq", &self.seq)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Guest {
    /// Connect, set up and enable `enable` of the `opts.pairs` pairs, and
    /// post rx buffers on all of them.
    pub fn connect(socket: &Path, opts: Options, enable: u16) -> Result<Guest> {
        Self::connect_with(socket, opts, enable, true)
    }

    /// As [`Guest::connect`]; with `fill` false no rx buffer is posted and
    /// `poll` refills nothing until `no_refill` is cleared.
    pub fn connect_with(socket: &Path, opts: Options, enable: u16, fill: bool) -> Result<Guest> {
        let pairs = opts.pairs;
        let mut drv = Driver::connect(socket, Duration::from_secs(20), opts)?;
        let mut qps = Vec::new();
        for p in 0..pairs {
            qps.push(drv.setup_pair(p)?);
        }
        for p in 0..enable {
            drv.enable_pair(p, true)?;
        }
        if fill {
            for qp in &mut qps {
                qp.rx.fill();
            }
        }
        Ok(Guest {
            drv,
            qps,
            stash: (0..pairs).map(|_| VecDeque::new()).collect(),
            replies: Vec::new(),
            bad_replies: Vec::new(),
            seq: 1,
            generation: 0,
            mgmt_txq: 0,
            faults: Vec::new(),
            no_refill: vec![!fill; pairs as usize],
        })
    }

    /// Drain every rx queue once (sorting management replies from data
    /// frames), reap tx completions, repost buffers. Returns frames taken.
    pub fn poll(&mut self) -> usize {
        let mut n = 0;
        for (q, qp) in self.qps.iter_mut().enumerate() {
            loop {
                match qp.rx.recv() {
                    Ok(Some(f)) => {
                        n += 1;
                        if proto::is_mgmt_frame(&f.data) {
                            match proto::decode_frame_driver(&f.data) {
                                Ok((header, message)) => {
                                    self.generation = header.generation;
                                    let mut src = [0u8; 6];
                                    src.copy_from_slice(&f.data[6..12]);
                                    self.replies.push(Reply {
                                        rxq: q as u16,
                                        src,
                                        header,
                                        message,
                                    });
                                }
                                Err(e) => self.bad_replies.push(format!("rxq {q}: {e}")),
                            }
                        } else {
                            self.stash[q].push_back(f);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.faults.push(e);
                        break;
                    }
                }
            }
            if let Err(e) = qp.tx.reap() {
                self.faults.push(e);
            }
            if !self.no_refill[q] {
                qp.rx.fill();
            }
        }
        n
    }

    /// Wait (polling, sleeping on rx interrupts) until `done(self)` holds.
    pub fn wait_until(
        &mut self,
        timeout: Duration,
        what: &str,
        mut done: impl FnMut(&mut Guest) -> bool,
    ) -> std::result::Result<(), GuestError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.poll();
            if done(self) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(GuestError::TimedOut {
                    what: what.to_string(),
                    after: timeout,
                    stash: self.stash.iter().map(VecDeque::len).collect(),
                    replies: self.replies.len(),
                    faults: self.faults.clone(),
                });
            }
            // Sleep on rx queue 0's interrupt briefly; any queue's frames are
            // picked up by the next poll.
            for qp in &self.qps {
                qp.rx.ring.set_used_event(qp.rx.ring.last_used());
            }
            if let Some(qp) = self.qps.first() {
                qp.rx.ring.wait_call(Duration::from_millis(5));
            }
        }
    }

    /// Send a raw frame on tx queue `txq`.
    pub fn send(&mut self, txq: u16, frame: &[u8]) {
        let tx = &mut self.qps[txq as usize].tx;
        if tx.ring.free_slots() == 0 {
            // Give the device a moment to complete what is queued.
            let _ = tx.ring.wait_used(1, Duration::from_secs(10));
            if let Err(e) = tx.reap() {
                self.faults.push(e);
            }
        }
        tx.send(frame).expect("tx ring has room");
    }

    /// Encode `msg` with the next sequence number, send it, return the seq.
    pub fn send_mgmt(&mut self, msg: &Message) -> u32 {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let frame = self.encode_mgmt(seq, msg);
        self.send(self.mgmt_txq, &frame);
        seq
    }

    /// Encode `msg` as a driver->device frame with sequence number `seq`.
    pub fn encode_mgmt(&self, seq: u32, msg: &Message) -> Vec<u8> {
        // As the guest module addresses them (PROTOCOL.md).
        let dst = if matches!(msg, Message::Hello(_)) {
            proto::HELLO_GROUP_MAC
        } else {
            proto::DEVICE_MAC
        };
        let meta = FrameMeta {
            dst,
            src: GUEST_MAC,
            seq,
            generation: self.generation,
        };
        let mut out = Vec::new();
        proto::encode(&mut out, &meta, msg).expect("test frames encode");
        out
    }

    /// Wait for the reply carrying `seq` (and of a type answering
    /// `request`), remove it from the pending replies and return it.
    pub fn wait_reply(
        &mut self,
        seq: u32,
        timeout: Duration,
    ) -> std::result::Result<Reply, GuestError> {
        let mut found = None;
        self.wait_until(timeout, &format!("management reply seq {seq}"), |g| {
            if let Some(i) = g.replies.iter().position(|r| r.header.seq == seq) {
                found = Some(g.replies.remove(i));
                true
            } else {
                false
            }
        })?;
        Ok(found.expect("set when done"))
    }

    /// Send a request and wait for its reply.
    pub fn request(
        &mut self,
        msg: &Message,
        timeout: Duration,
    ) -> std::result::Result<Reply, GuestError> {
        let seq = self.send_mgmt(msg);
        self.wait_reply(seq, timeout)
    }

    /// HELLO -> CAPS (starts the session).
    pub fn hello(&mut self, timeout: Duration) -> std::result::Result<Caps, GuestError> {
        let r = self.request(
            &Message::Hello(Hello {
                driver_version: 1,
                nonce: 0x5eed_0001,
                mac: GUEST_MAC,
            }),
            timeout,
        )?;
        match r.message {
            Message::Caps(c) => Ok(c),
            m => Err(GuestError::Unexpected {
                request: "HELLO",
                answer: Box::new(m),
            }),
        }
    }

    /// ADD `ops` in one frame; returns the ACK's per-op statuses.
    pub fn add(
        &mut self,
        ops: Vec<AddOp>,
        timeout: Duration,
    ) -> std::result::Result<Ack, GuestError> {
        let r = self.request(&Message::Add(ops), timeout)?;
        check_ack(r, MsgType::Add)
    }

    /// DEL `ops` in one frame; returns the ACK.
    pub fn del(
        &mut self,
        ops: Vec<DelOp>,
        timeout: Duration,
    ) -> std::result::Result<Ack, GuestError> {
        let r = self.request(&Message::Del(ops), timeout)?;
        check_ack(r, MsgType::Del)
    }

    /// Take every stashed data frame of every queue.
    pub fn take_all(&mut self) -> Vec<Received> {
        let mut v = Vec::new();
        for (q, s) in self.stash.iter_mut().enumerate() {
            v.extend(s.drain(..).map(|frame| Received {
                rxq: q as u16,
                frame,
            }));
        }
        v
    }

    /// Data frames currently stashed, over all queues.
    pub fn stashed(&self) -> usize {
        self.stash.iter().map(VecDeque::len).sum()
    }
}

fn check_ack(r: Reply, t: MsgType) -> std::result::Result<Ack, GuestError> {
    match r.message {
        Message::Ack(a) if a.acked_type == t as u8 => Ok(a),
        m => Err(GuestError::Unexpected {
            request: match t {
                MsgType::Add => "ADD",
                MsgType::Del => "DEL",
                _ => "request",
            },
            answer: Box::new(m),
        }),
    }
}

/// Why a wait or a management exchange of a [`Guest`] failed.
#[derive(Clone, PartialEq, Eq)]
pub enum GuestError {
    /// `what` did not happen within `after`; what the guest held then.
    TimedOut {
        what: String,
        after: Duration,
        /// Data frames stashed per rx queue.
        stash: Vec<usize>,
        /// Management replies not yet taken.
        replies: usize,
        /// What the driver found wrong in the device's writes.
        faults: Vec<DeviceFault>,
    },
    /// The device answered `request` with another message.
    Unexpected {
        request: &'static str,
        answer: Box<Message>,
    },
}

impl std::fmt::Display for GuestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestError::TimedOut {
                what,
                after,
                stash,
                replies,
                faults,
            } => write!(
                f,
                "timed out after {after:?} waiting for {what}; stash per rxq {stash:?}, replies {replies}, faults {faults:?}"
            ),
            GuestError::Unexpected { request, answer } => {
                write!(f, "{request} answered with {answer:?}")
            }
        }
    }
}

/// As Display: what a failed test's `unwrap` prints.
impl std::fmt::Debug for GuestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for GuestError {}
