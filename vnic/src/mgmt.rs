//! The management path: the authoritative filter table, the go-back-N
//! sequence state of `PROTOCOL.md` ("Reliable delivery"), the ACK cache, the
//! loss knob, and the distribution of table events to the worker replicas.
//!
//! It runs under one mutex ([`crate::shared::Shared::mgmt`]), taken by a
//! worker that received a management frame and by the management thread
//! when delayed requests come due. The packet path never takes it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use arfs::proto::{self, Caps, Direction, FrameError, MsgType};
use arfs::{DropCause, FilterTable, Message, Request, TableConfig, TableEvent, TraceRecord};
use serde_json::{json, Value};
use vmm_sys_util::timerfd::TimerFd;

use crate::shared::{next_generation, Conn, Shared, ID_SPACE};

/// ACKs kept for duplicate requests.
pub const ACK_CACHE: usize = 256;

/// Management counters (under the mutex).
#[derive(Default, Clone)]
pub struct MgmtCounters {
    pub frames_rx: u64,
    pub frames_ok: u64,
    pub bad: [u64; 11],
    pub acks_sent: u64,
    pub caps_sent: u64,
    pub naks_sent: u64,
    pub dropped_by_loss: u64,
    pub replies_dropped_by_loss: u64,
    pub out_of_order: u64,
    pub duplicates: u64,
    pub duplicate_reacks: u64,
    pub generation_changes: u64,
}

/// Where a reply goes.
#[derive(Clone, Copy)]
struct Route {
    worker: usize,
    dst: [u8; 6],
}

pub struct Mgmt {
    pub table: FilterTable,
    /// Next expected sequence number; `None` before the first request of a
    /// generation (the first request then starts the window).
    expected: Option<u32>,
    cache: VecDeque<(u32, Vec<u8>)>,
    pending: HashMap<u32, Route>,
    pub c: MgmtCounters,
    hits_base: Box<[u64]>,
    conn: Option<Arc<Conn>>,
    timer: TimerFd,
    armed_for: Option<u64>,
    pub max_ops: u16,
    /// The capacity the table started with: the workers' replicas are sized
    /// for it, so a runtime `table_capacity` may not exceed it.
    replica_capacity: u32,
}

impl Mgmt {
    pub fn new(cfg: TableConfig) -> Result<Self, String> {
        let cfg_capacity = cfg.capacity;
        let table = FilterTable::new(cfg).map_err(|e| e.to_string())?;
        let timer = TimerFd::new().map_err(|e| format!("timerfd: {e}"))?;
        {
            use std::os::fd::AsRawFd;
            crate::shared::set_nonblocking(timer.as_raw_fd())
                .map_err(|e| format!("timerfd: {e}"))?;
        }
        Ok(Self {
            table,
            expected: None,
            cache: VecDeque::with_capacity(ACK_CACHE),
            pending: HashMap::new(),
            c: MgmtCounters::default(),
            hits_base: vec![0; ID_SPACE].into_boxed_slice(),
            conn: None,
            timer,
            armed_for: None,
            max_ops: proto::MAX_ADD_OPS,
            replica_capacity: cfg_capacity,
        })
    }

    /// The timer that fires when a delayed request comes due.
    pub fn timer_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.timer.as_raw_fd()
    }

    pub fn conn(&self) -> Option<&Arc<Conn>> {
        self.conn.as_ref()
    }

    /// Hits of filter `id` since it was (re)installed.
    pub fn hits(&self, id: u16) -> u64 {
        let h = self.conn.as_ref().map_or(0, |c| c.hits(id));
        h.saturating_sub(self.hits_base[usize::from(id)])
    }

    /// A device reset or a new connection: new generation, empty table,
    /// no session. `conn` becomes the connection replies go to.
    pub fn reset(&mut self, sh: &Shared, conn: Option<Arc<Conn>>, cause: &str) {
        let now = sh.now_ns();
        let prev = sh.generation();
        let gen = next_generation(prev);
        sh.generation
            .store(gen, std::sync::atomic::Ordering::Relaxed);
        self.c.generation_changes += 1;
        sh.tracer
            .emit(TraceRecord::gen_change(now, prev, gen, cause));
        let mut evs = Vec::new();
        self.table.clear(&mut |e| evs.push(e));
        for e in evs {
            self.publish(sh, now, e);
        }
        if let Some(c) = conn {
            self.conn = Some(c);
        }
        self.hits_base.fill(0);
        if let Some(c) = &self.conn {
            for i in 0..ID_SPACE {
                self.hits_base[i] = c.hits(i as u16);
            }
        }
        self.expected = None;
        self.cache.clear();
        self.pending.clear();
        self.rearm();
        log::info!("generation {prev:#x} -> {gen:#x} ({cause})");
    }

    /// The connection closed. Its state is kept until the next reset
    /// (so the evictions of that reset still report their hits); replies
    /// queued meanwhile go nowhere.
    pub fn detach(&mut self) {}

    /// Handles one management frame sent by the guest on pair `worker`.
    /// Replies are queued on the worker's inbox; other workers are woken,
    /// `worker` itself is expected to drain its inbox afterwards.
    pub fn handle_frame(&mut self, sh: &Shared, worker: usize, frame: &[u8]) {
        let now = sh.now_ns();
        let gen = sh.generation();
        self.c.frames_rx += 1;
        let hdr = proto::peek_header(frame);
        if self.table.mgmt_loss() {
            self.c.dropped_by_loss += 1;
            sh.tracer.emit(TraceRecord::mgmt_drop(
                now,
                gen,
                Direction::ToDevice,
                hdr.map(|h| h.seq),
                hdr.map(|h| h.msg_type),
                DropCause::Loss,
            ));
            return;
        }
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&frame[6..12]);
        let route = Route { worker, dst };
        match proto::decode_frame_limited(frame, self.max_ops) {
            Err(e) => {
                self.c.bad[usize::from(e.kind.code()).min(10)] += 1;
                sh.tracer.emit(TraceRecord::bad_frame(now, gen, &e));
                log::debug!("pair {worker}: {e}");
                let Some(h) = e.nak_header().copied() else {
                    return;
                };
                if !self.in_order(sh, now, gen, h.seq, h.msg_type, route) {
                    return;
                }
                let mut out = Vec::new();
                if matches!(proto::encode_nak(&mut out, dst, gen, &e), Ok(true)) {
                    self.c.naks_sent += 1;
                    self.remember(h.seq, &out);
                    self.send(sh, now, route, out, Some(worker));
                }
            }
            Ok((h, msg)) => {
                self.c.frames_ok += 1;
                match msg {
                    Message::Hello(hello) => {
                        // HELLO (re)starts the session whatever its seq.
                        self.expected = Some(h.seq.wrapping_add(1));
                        self.cache.clear();
                        let caps = self.caps(sh);
                        let mut out = Vec::new();
                        let dst = if hello.mac == [0; 6] || hello.mac[0] & 1 != 0 {
                            dst
                        } else {
                            hello.mac
                        };
                        if proto::encode_caps(&mut out, dst, h.seq, gen, &caps).is_ok() {
                            self.c.caps_sent += 1;
                            self.remember(h.seq, &out);
                            self.send(sh, now, Route { worker, dst }, out, Some(worker));
                        }
                    }
                    Message::Add(ops) => {
                        self.request(sh, now, gen, h.seq, Request::Add(ops), route);
                    }
                    Message::Del(ops) => {
                        self.request(sh, now, gen, h.seq, Request::Del(ops), route);
                    }
                    Message::Flush(r) => {
                        self.request(sh, now, gen, h.seq, Request::Flush(r), route);
                    }
                    // decode_frame rejects device->driver types.
                    Message::Caps(_) | Message::Ack(_) => {}
                }
            }
        }
    }

    fn request(&mut self, sh: &Shared, now: u64, gen: u32, seq: u32, req: Request, route: Route) {
        if !self.in_order(sh, now, gen, seq, req.kind().code(), route) {
            return;
        }
        self.pending.insert(seq, route);
        self.table.submit(now, seq, req);
        self.advance(sh, now, Some(route.worker));
    }

    /// Go-back-N window check. Returns true when `seq` is the expected one
    /// (and advances the window); handles duplicates and out-of-order.
    fn in_order(
        &mut self,
        sh: &Shared,
        now: u64,
        gen: u32,
        seq: u32,
        ty: u8,
        route: Route,
    ) -> bool {
        let exp = *self.expected.get_or_insert(seq);
        let d = seq.wrapping_sub(exp).cast_signed();
        if d == 0 {
            self.expected = Some(exp.wrapping_add(1));
            return true;
        }
        if d < 0 {
            self.c.duplicates += 1;
            sh.tracer.emit(TraceRecord::mgmt_drop(
                now,
                gen,
                Direction::ToDevice,
                Some(seq),
                Some(ty),
                DropCause::Duplicate,
            ));
            if let Some((_, f)) = self.cache.iter().rev().find(|(s, _)| *s == seq) {
                let mut f = f.clone();
                // Replies go to the sender of the duplicate.
                f[0..6].copy_from_slice(&route.dst);
                self.c.duplicate_reacks += 1;
                self.send(sh, now, route, f, Some(route.worker));
            }
        } else {
            self.c.out_of_order += 1;
            sh.tracer.emit(TraceRecord::mgmt_drop(
                now,
                gen,
                Direction::ToDevice,
                Some(seq),
                Some(ty),
                DropCause::OutOfOrder,
            ));
        }
        false
    }

    fn remember(&mut self, seq: u32, frame: &[u8]) {
        if self.cache.len() == ACK_CACHE {
            self.cache.pop_front();
        }
        self.cache.push_back((seq, frame.to_vec()));
    }

    /// Applies what is due at `now`, sends the ACKs, re-arms the timer.
    /// `self_worker` is the worker calling (not woken).
    pub fn advance(&mut self, sh: &Shared, now: u64, self_worker: Option<usize>) {
        let enabled = self.conn.as_ref().map_or(0, |c| c.enabled_pairs());
        let mut evs = Vec::new();
        self.table.advance(now, enabled, &mut |e| evs.push(e));
        let gen = sh.generation();
        for e in evs {
            if let TableEvent::Completed {
                seq,
                kind,
                statuses,
                ..
            } = &e
            {
                sh.tracer.emit(TraceRecord::from_event(now, gen, &e));
                let Some(route) = self.pending.remove(seq) else {
                    continue;
                };
                let mut out = Vec::new();
                if proto::encode_ack(&mut out, route.dst, *seq, gen, *kind, statuses).is_ok() {
                    self.c.acks_sent += 1;
                    self.remember(*seq, &out);
                    self.send(sh, now, route, out, self_worker);
                }
            } else {
                self.publish(sh, now, e);
            }
        }
        self.rearm();
    }

    /// Traces a table event and hands it to every worker replica.
    fn publish(&mut self, sh: &Shared, now: u64, e: TableEvent) {
        let gen = sh.generation();
        let mut rec = TraceRecord::from_event(now, gen, &e);
        match &e {
            TableEvent::Added { id, .. } => {
                self.rebase(*id);
            }
            TableEvent::Replaced { id, prev_id, .. } => {
                rec.hits = Some(self.hits(*prev_id));
                self.rebase(*id);
            }
            TableEvent::Deleted { id, .. } | TableEvent::Evicted { id, .. } => {
                rec.hits = Some(self.hits(*id));
            }
            _ => {}
        }
        sh.tracer.emit(rec);
        let replica_relevant = matches!(
            e,
            TableEvent::Added { .. }
                | TableEvent::Replaced { .. }
                | TableEvent::Deleted { .. }
                | TableEvent::Evicted { .. }
        );
        if replica_relevant {
            if let Some(c) = &self.conn {
                let e = Arc::new(e);
                for ib in &*c.inbox {
                    ib.updates.push(e.clone());
                }
            }
        }
    }

    fn rebase(&mut self, id: u16) {
        let cur = self.conn.as_ref().map_or(0, |c| c.hits(id));
        self.hits_base[usize::from(id)] = cur;
    }

    fn send(
        &mut self,
        sh: &Shared,
        now: u64,
        route: Route,
        frame: Vec<u8>,
        self_worker: Option<usize>,
    ) {
        if self.table.mgmt_loss() {
            self.c.replies_dropped_by_loss += 1;
            let h = proto::peek_header(&frame);
            sh.tracer.emit(TraceRecord::mgmt_drop(
                now,
                sh.generation(),
                Direction::ToDriver,
                h.map(|h| h.seq),
                h.map(|h| h.msg_type),
                DropCause::Loss,
            ));
            return;
        }
        if let Some(c) = &self.conn {
            if let Some(ib) = c.inbox.get(route.worker) {
                ib.replies.push(frame);
                if self_worker != Some(route.worker) {
                    ib.wake();
                }
            }
        }
    }

    fn caps(&self, sh: &Shared) -> Caps {
        let cfg = self.table.config();
        Caps {
            max_queue_pairs: sh.cfg.queues,
            enabled_queue_pairs: self.conn.as_ref().map_or(0, |c| c.enabled_pairs()),
            capacity: cfg.capacity,
            buckets: cfg.buckets.map_or(0, |b| b.0),
            ways: cfg.buckets.map_or(0, |b| b.1),
            max_ops: self.max_ops,
            latency_us: (cfg.latency_ns / 1000) as u32,
        }
    }

    fn rearm(&mut self) {
        let due = self.table.next_due();
        if due == self.armed_for {
            return;
        }
        self.armed_for = due;
        // Relative timer: the management thread calls advance() on expiry.
        let res = match due {
            Some(d) => {
                let now = crate::shared::process_now_ns();
                let wait = d.saturating_sub(now).max(1_000);
                self.timer.reset(Duration::from_nanos(wait), None)
            }
            None => self.timer.clear(),
        };
        if let Err(e) = res {
            log::warn!("management timer: {e}");
        }
    }

    /// Called by the management thread when its timer fired.
    pub fn on_timer(&mut self, sh: &Shared) {
        let _ = self.timer.wait();
        self.armed_for = None;
        self.advance(sh, sh.now_ns(), None);
    }

    /// Sets a knob; returns an error message naming the problem.
    pub fn set_knob(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "add_fail_rate" => {
                let v = crate::config::parse_rate(value)?;
                self.table.set_add_fail_rate(v).map_err(|e| e.to_string())
            }
            "mgmt_loss_rate" => {
                let v = crate::config::parse_rate(value)?;
                self.table.set_mgmt_loss_rate(v).map_err(|e| e.to_string())
            }
            "program_latency" => {
                let v = crate::config::parse_duration(value)?;
                self.table
                    .set_latency_ns(v.as_nanos() as u64)
                    .map_err(|e| e.to_string())
            }
            "table_capacity" => {
                let v = crate::config::parse_capacity(value)?;
                if v > self.replica_capacity {
                    return Err(format!(
                        "{v} exceeds the capacity the daemon started with ({}): restart it with a larger --table-capacity",
                        self.replica_capacity
                    ));
                }
                let buckets = self.table.config().buckets;
                self.table.reshape(v, buckets).map_err(|e| {
                    format!("{e}; unload the guest driver (its FLUSH empties the table) and retry")
                })
            }
            "buckets" => {
                let v = crate::config::parse_buckets(value)?;
                let cap = self.table.capacity();
                self.table.reshape(cap, v).map_err(|e| {
                    format!("{e}; unload the guest driver (its FLUSH empties the table) and retry")
                })
            }
            _ => Err(format!(
                "unknown knob {key:?}: expected add_fail_rate, mgmt_loss_rate, program_latency, table_capacity or buckets"
            )),
        }
    }

    pub fn knobs_json(&self) -> Value {
        let c = self.table.config();
        json!({
            "add_fail_rate": c.add_fail_rate,
            "mgmt_loss_rate": c.mgmt_loss_rate,
            "program_latency_us": c.latency_ns as f64 / 1000.0,
            "capacity": c.capacity,
            "buckets": c.buckets.map_or(0, |b| b.0),
            "ways": c.buckets.map_or(0, |b| b.1),
            "max_ops": self.max_ops,
        })
    }

    pub fn stats_json(&self, sh: &Shared) -> Value {
        let c = &self.c;
        let mut bad = serde_json::Map::new();
        let mut bad_total = 0;
        for code in 1..=10u8 {
            if let Some(k) = FrameError::from_code(code) {
                bad.insert(k.name().to_string(), json!(c.bad[usize::from(code)]));
                bad_total += c.bad[usize::from(code)];
            }
        }
        json!({
            "frames_rx": c.frames_rx,
            "frames_ok": c.frames_ok,
            "frames_bad_total": bad_total,
            "frames_bad": bad,
            "acks_sent": c.acks_sent,
            "caps_sent": c.caps_sent,
            "naks_sent": c.naks_sent,
            "dropped_by_loss": c.dropped_by_loss,
            "replies_dropped_by_loss": c.replies_dropped_by_loss,
            "replies_dropped_no_buffers": sh.replies_dropped_no_buffers.load(std::sync::atomic::Ordering::Relaxed),
            "out_of_order": c.out_of_order,
            "duplicates": c.duplicates,
            "duplicate_reacks": c.duplicate_reacks,
            "pending_requests": self.table.pending(),
            "expected_seq": self.expected,
        })
    }

    pub fn table_stats_json(&self) -> Value {
        let mut v = serde_json::to_value(self.table.counters()).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("live".into(), json!(self.table.len()));
            m.insert("capacity".into(), json!(self.table.capacity()));
            m.insert(
                "generation_changes".into(),
                json!(self.c.generation_changes),
            );
        }
        v
    }

    pub fn table_json(&self, sh: &Shared) -> Value {
        let filters: Vec<Value> = self
            .table
            .entries()
            .into_iter()
            .map(|e| json!({"id": e.id, "rxq": e.rxq, "flow": e.flow, "hits": self.hits(e.id), "installed_ns": e.installed_ns, "bucket": e.bucket}))
            .collect();
        json!({
            "generation": sh.generation(),
            "live": self.table.len(),
            "capacity": self.table.capacity(),
            "filters": filters,
        })
    }

    /// The message type name for a code (for logs).
    pub fn type_name(code: u8) -> String {
        MsgType::from_code(code).map_or_else(|| code.to_string(), |t| t.name().to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use arfs::proto::{decode_frame_driver, encode, FrameMeta, Hello, BROADCAST_MAC};
    use arfs::{AddOp, FlowKey, L4Proto, Message, OpStatus};

    use super::*;
    use crate::config::{Config, PeerKind, DEFAULT_GEN_IP, DEFAULT_GEN_MAC, DEFAULT_GUEST_IP};

    const GUEST: [u8; 6] = [2, 0, 0, 0, 0, 0x15];

    fn setup(latency: Duration) -> (Arc<Shared>, Arc<Conn>) {
        let cfg = Config {
            socket: "unused.sock".into(),
            ctl: "unused.ctl".into(),
            queues: 2,
            max_queue_size: 1024,
            peer: PeerKind::Gen,
            gen_mac: DEFAULT_GEN_MAC,
            gen_ip: DEFAULT_GEN_IP,
            guest_ip: DEFAULT_GUEST_IP,
            table_capacity: 64,
            buckets: None,
            program_latency: latency,
            add_fail_rate: 0.0,
            mgmt_loss_rate: 0.0,
            seed: 1,
            trace: None,
        };
        let sh = crate::serve::build(cfg).unwrap();
        let conn = Arc::new(Conn::new(2).unwrap());
        // Both pairs enabled.
        conn.enabled_mask
            .store(0b11, std::sync::atomic::Ordering::Relaxed);
        sh.lock_mgmt().reset(&sh, Some(conn.clone()), "test");
        (sh, conn)
    }

    fn frame(seq: u32, msg: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        encode(
            &mut out,
            &FrameMeta {
                dst: BROADCAST_MAC,
                src: GUEST,
                seq,
                generation: 0,
            },
            msg,
        )
        .unwrap();
        out
    }

    fn add(id: u16, sport: u16) -> Message {
        let k = FlowKey::v4(
            L4Proto::Udp,
            Ipv4Addr::new(10, 0, 2, 1),
            sport,
            Ipv4Addr::new(10, 0, 2, 15),
            5001,
        );
        Message::Add(vec![AddOp::new(id, 1, &k)])
    }

    fn replies(conn: &Conn, worker: usize) -> Vec<(u32, Message)> {
        let mut out = Vec::new();
        while let Some(f) = conn.inbox[worker].replies.pop() {
            assert_eq!(&f[0..6], &GUEST);
            let (hdr, msg) = decode_frame_driver(&f).unwrap();
            out.push((hdr.seq, msg));
        }
        out
    }

    #[test]
    fn go_back_n_sequence() {
        let (sh, c) = setup(Duration::ZERO);
        let gen = sh.generation();
        let hello = Message::Hello(Hello {
            driver_version: 1,
            mac: GUEST,
        });
        sh.lock_mgmt().handle_frame(&sh, 1, &frame(10, &hello));
        let r = replies(&c, 1);
        assert!(
            matches!(r.as_slice(), [(10, Message::Caps(caps))] if caps.max_queue_pairs == 2 && caps.enabled_queue_pairs == 2)
        );
        // In order: applied and acknowledged, the replica update is queued.
        sh.lock_mgmt().handle_frame(&sh, 1, &frame(11, &add(7, 1)));
        let r = replies(&c, 1);
        assert!(
            matches!(r.as_slice(), [(11, Message::Ack(a))] if a.statuses == vec![OpStatus::Ok.code()])
        );
        assert_eq!(sh.lock_mgmt().table.len(), 1);
        assert!(c.inbox[0].updates.pop().is_some());
        // Duplicate: same ACK again, nothing applied.
        sh.lock_mgmt().handle_frame(&sh, 1, &frame(11, &add(8, 2)));
        let r = replies(&c, 1);
        assert!(matches!(r.as_slice(), [(11, Message::Ack(_))]));
        assert_eq!(sh.lock_mgmt().table.len(), 1);
        // Ahead of the window: dropped silently.
        sh.lock_mgmt().handle_frame(&sh, 1, &frame(13, &add(9, 3)));
        assert!(replies(&c, 1).is_empty());
        let m = sh.lock_mgmt();
        assert_eq!(
            (m.c.duplicates, m.c.duplicate_reacks, m.c.out_of_order),
            (1, 1, 1)
        );
        assert_eq!(m.table.len(), 1);
        assert_eq!(sh.generation(), gen);
    }

    #[test]
    fn malformed_frames_are_naked_or_ignored() {
        let (sh, c) = setup(Duration::ZERO);
        let mut f = frame(5, &add(1, 1));
        // body_len mismatch -> NAK with the frame status, nothing applied.
        f[14 + 14] = 0;
        f[14 + 15] = 40;
        sh.lock_mgmt().handle_frame(&sh, 0, &f);
        let r = replies(&c, 0);
        assert!(
            matches!(r.as_slice(), [(5, Message::Ack(a))] if a.frame_status == FrameError::BadLength.code() && a.statuses.is_empty())
        );
        // Bad magic: silent.
        let mut f = frame(6, &add(1, 1));
        f[14] = 0;
        sh.lock_mgmt().handle_frame(&sh, 0, &f);
        assert!(replies(&c, 0).is_empty());
        let m = sh.lock_mgmt();
        assert_eq!(m.c.bad[usize::from(FrameError::BadLength.code())], 1);
        assert_eq!(m.c.bad[usize::from(FrameError::BadMagic.code())], 1);
        assert_eq!(m.table.len(), 0);
    }

    #[test]
    fn latency_delays_effect_and_ack() {
        let (sh, c) = setup(Duration::from_hours(1));
        sh.lock_mgmt().handle_frame(&sh, 0, &frame(1, &add(7, 1)));
        assert!(replies(&c, 0).is_empty(), "ACK before the ops took effect");
        assert_eq!(sh.lock_mgmt().table.len(), 0);
        assert!(c.inbox[0].updates.pop().is_none());
        // Time passes (the management timer calls advance).
        let later = sh.now_ns() + 3_700_000_000_000;
        sh.lock_mgmt().advance(&sh, later, None);
        let r = replies(&c, 0);
        assert!(matches!(r.as_slice(), [(1, Message::Ack(_))]));
        assert_eq!(sh.lock_mgmt().table.len(), 1);
        assert!(c.inbox[1].updates.pop().is_some());
    }

    #[test]
    fn reset_bumps_generation_and_empties_the_table() {
        let (sh, c) = setup(Duration::ZERO);
        sh.lock_mgmt().handle_frame(&sh, 0, &frame(1, &add(7, 1)));
        let _ = replies(&c, 0);
        while c.inbox[0].updates.pop().is_some() {}
        let g = sh.generation();
        sh.lock_mgmt().reset(&sh, None, "reset");
        assert_ne!(sh.generation(), g);
        assert_ne!(sh.generation(), 0);
        assert_eq!(sh.lock_mgmt().table.len(), 0);
        // The replicas hear about the eviction.
        let e = c.inbox[0].updates.pop().expect("evict event");
        assert!(matches!(*e, TableEvent::Evicted { id: 7, .. }));
        // A request of the old session starts a new window and carries the new generation.
        sh.lock_mgmt().handle_frame(&sh, 0, &frame(2, &add(7, 1)));
        assert_eq!(replies(&c, 0).len(), 1);
    }
}
