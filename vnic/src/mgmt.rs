//! The management path: the authoritative filter table, the go-back-N
//! sequence state of `PROTOCOL.md` ("Reliable delivery"), the ACK cache, the
//! loss knob, and the distribution of table events to the worker replicas.
//!
//! It runs under one mutex (`daemon::Shared::mgmt`), taken by a worker that
//! received a management frame, by the management thread when delayed
//! requests come due, and by the control socket for a snapshot or a knob.
//! It holds protocol state only: the control socket renders its JSON from
//! a [`Snapshot`] after the lock is released. The packet path never takes
//! it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arfs::proto::{self, Ack, AddOp, Caps, CapsExt, Direction, FrameMeta, DEVICE_MAC};
use arfs::{
    DropCause, FilterTable, FlowKey, L4Proto, Message, OpStatus, Request, Rss, TableConfig,
    TableEvent, TraceRecord,
};
use vmm_sys_util::timerfd::TimerFd;

use crate::clock::{next_generation, now_ns};
use crate::config::{Knob, Preload};
use crate::conn::Conn;
use crate::lanes::Reply;
use crate::stats::{Hits, ID_SPACE};
use crate::trace::Tracer;
use crate::virtq::NET_HDR_LEN;

mod faults;
mod hits;
mod snapshot;

#[cfg(test)]
use faults::OTHER_HOST_MAC;
pub(crate) use snapshot::Snapshot;

/// ACKs kept for duplicate requests.
pub(crate) const ACK_CACHE: usize = 256;

/// Management counters (under the mutex).
#[derive(Default, Clone)]
pub(crate) struct MgmtCounters {
    pub frames_rx: u64,
    pub frames_ok: u64,
    pub bad: [u64; 11],
    pub acks_sent: u64,
    pub caps_sent: u64,
    /// Frames sent as the `rogue_responder` knob's second responder.
    pub rogue_sent: u64,
    /// Frames sent as the `forge_acks` knob's forgeries.
    pub forged_sent: u64,
    /// `replace` trace lines the `wrong_trace` knob falsified.
    pub wrong_traced: u64,
    /// Destinations of the driver's frames.
    pub dst: DstCounters,
    pub naks_sent: u64,
    pub dropped_by_loss: u64,
    pub replies_dropped_by_loss: u64,
    pub out_of_order: u64,
    pub duplicates: u64,
    pub duplicate_reacks: u64,
    pub generation_changes: u64,
}

/// Destination MACs of the frames the driver sent.
#[derive(Default, Clone)]
pub(crate) struct DstCounters {
    /// HELLO to [`proto::HELLO_GROUP_MAC`].
    pub hello_to_group: u64,
    /// Any other type to [`DEVICE_MAC`].
    pub to_device: u64,
    /// To ff:ff:ff:ff:ff:ff.
    pub to_broadcast: u64,
    /// Anything else (a HELLO to the device, a request to the group...).
    pub to_other: u64,
}

/// Where a reply goes.
#[derive(Clone, Copy)]
struct Route {
    worker: usize,
    dst: [u8; 6],
}

pub(crate) struct Mgmt {
    pub table: FilterTable,
    tracer: Arc<Tracer>,
    generation: Arc<AtomicU32>,
    max_pairs: u16,
    /// The worker handling a frame, while it holds the lock: its own
    /// replies go to `own` instead of its inbox.
    caller: Option<usize>,
    own: Vec<Reply>,
    /// Next expected sequence number; `None` before the first request of a
    /// generation (the first request then starts the window).
    expected: Option<u32>,
    /// Replies as sent (header space included), by sequence number.
    cache: VecDeque<(u32, Vec<u8>)>,
    pending: HashMap<u32, Route>,
    pub c: MgmtCounters,
    hits_base: Box<[u64]>,
    /// Per rule location, as `hits_base` per filter id.
    rule_hits_base: Box<[u64]>,
    /// The current connection, if any: its one owner. The control socket
    /// (`enabled_pairs`, rings), the 50 ms poll and the management path
    /// (CAPS, preload, op checks, replies, replica events) all read it
    /// here. Set by [`Mgmt::reset`] for a new connection, cleared by
    /// [`Mgmt::disconnect`].
    conn: Option<Arc<Conn>>,
    /// The hit counters of the connection that steered by this table:
    /// kept after a disconnect, so that the evictions of the next reset
    /// still report their hits.
    hits: Option<Arc<Hits>>,
    timer: TimerFd,
    armed_for: Option<u64>,
    pub max_ops: u16,
    /// The capacity the table started with: the workers' replicas are sized
    /// for it, so a runtime `table_capacity` may not exceed it.
    replica_capacity: u32,
    /// `--preload-filters`: what to install as the device comes up, and
    /// the generator's default addresses the matching ones are for.
    preload: Option<(Preload, Ipv4Addr, Ipv4Addr)>,
    /// The table was emptied since the last preload.
    preload_due: bool,
    /// `rogue_responder`: every CAPS and ACK is preceded by a copy from
    /// [`ROGUE_MAC`], a CAPS with a wrong nonce.
    rogue: bool,
    /// `rogue_nonce`: the rogue's CAPS echoes the HELLO's nonce (a station
    /// that saw the HELLO, which is multicast until the driver is bound).
    rogue_nonce: bool,
    /// `drop_acks`: the next this many replies to requests (ACK or NAK of
    /// ADD, DEL, FLUSH) are lost on their first transmission. The request
    /// is applied and its reply cached, so a duplicate gets it again: the
    /// one lost ACK a driver's retransmission recovers from.
    drop_acks: u32,
    /// `forge_acks`: every ACK is preceded by two forgeries from the
    /// device's own address, each of another generation: the previous
    /// reply replayed (a seq the driver has no longer in flight), and this
    /// ACK addressed to another host ([`OTHER_HOST_MAC`]). A driver must
    /// take neither as news of a device restart.
    forge_acks: bool,
    /// `wrong_trace`: each `replace` line that moves a flow to another
    /// queue names the new queue as `prev_rxq` (the table, the replicas
    /// and the ACK are right; only the trace lies).
    wrong_trace: bool,
}

impl Mgmt {
    pub(crate) fn new(
        cfg: TableConfig,
        tracer: Arc<Tracer>,
        generation: Arc<AtomicU32>,
        max_pairs: u16,
    ) -> Result<Self, crate::error::Error> {
        let cfg_capacity = cfg.capacity;
        let mut table = FilterTable::new(cfg)?;
        // RSS_SET's table may name any queue pair the device has.
        table.set_queue_pairs(max_pairs);
        let timer = crate::clock::timer().map_err(crate::error::Error::Timer)?;
        Ok(Self {
            table,
            tracer,
            generation,
            max_pairs,
            caller: None,
            own: Vec::new(),
            expected: None,
            cache: VecDeque::with_capacity(ACK_CACHE),
            pending: HashMap::new(),
            c: MgmtCounters::default(),
            hits_base: vec![0; ID_SPACE].into_boxed_slice(),
            rule_hits_base: vec![0; arfs::table::MAX_RULES as usize].into_boxed_slice(),
            conn: None,
            hits: None,
            timer,
            armed_for: None,
            max_ops: proto::MAX_ADD_OPS,
            replica_capacity: cfg_capacity,
            preload: None,
            preload_due: false,
            rogue: false,
            rogue_nonce: false,
            drop_acks: 0,
            forge_acks: false,
            wrong_trace: false,
        })
    }

    /// `--preload-filters`: install `p` (matching flows from `gen_ip` to
    /// `guest_ip`) each time the device comes up; see [`Self::preload_if_ready`].
    pub(crate) fn set_preload(&mut self, p: Preload, gen_ip: Ipv4Addr, guest_ip: Ipv4Addr) {
        if p.filters > 0 {
            self.preload = Some((p, gen_ip, guest_ip));
            self.preload_due = true;
        }
    }

    /// Installs the `--preload-filters` set when the table was emptied
    /// (start, new connection, device reset) and every pair the device
    /// offers is enabled (each matching filter names the queue RSS picks
    /// among all of them). The ops take the table path a guest's ADD takes
    /// (applied at once, whatever the programming latency): table events,
    /// trace records and replica updates as for any ADD, but no ACK. Called
    /// by the 50 ms poll; returns whether it installed anything.
    pub(crate) fn preload_if_ready(&mut self) -> bool {
        let Some((p, gen_ip, guest_ip)) = self.preload else {
            return false;
        };
        let enabled = self.enabled_pairs();
        if !self.preload_due || enabled < self.max_pairs {
            return false;
        }
        self.preload_due = false;
        let now = now_ns();
        let rss = Rss::new(enabled);
        let mut ok = 0u32;
        let mut refused: BTreeMap<OpStatus, u32> = BTreeMap::new();
        let ids: Vec<u16> = (0..p.filters).map(|i| i as u16).collect();
        for chunk in ids.chunks(usize::from(self.max_ops.max(1))) {
            let ops = chunk
                .iter()
                .map(|&id| preload_op(p, id, gen_ip, guest_ip, &rss, enabled))
                .collect();
            let mut evs = Vec::new();
            let statuses = self
                .table
                .apply_now(now, 0, Request::Add(ops), enabled, &mut |e| evs.push(e));
            let gen = self.generation();
            for e in evs {
                if matches!(e, TableEvent::Completed { .. }) {
                    self.tracer.emit(TraceRecord::from_event(now, gen, &e));
                } else {
                    self.publish(now, e);
                }
            }
            for s in statuses {
                if s == OpStatus::Ok {
                    ok += 1;
                } else {
                    *refused.entry(s).or_default() += 1;
                }
            }
        }
        if let Some(c) = &self.conn {
            c.lanes.wake_all();
        }
        if refused.is_empty() {
            log::info!(
                "preloaded {ok} filters ({} matching the generator's flows)",
                p.matching
            );
        } else {
            log::warn!(
                "preloaded {ok} of {} filters; refused: {refused:?}",
                p.filters
            );
        }
        true
    }

    /// The timer that fires when a delayed request comes due.
    pub(crate) fn timer_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.timer.as_raw_fd()
    }

    fn generation(&self) -> u32 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Enabled queue pairs of the current connection.
    pub(crate) fn enabled_pairs(&self) -> u16 {
        self.conn.as_ref().map_or(0, |c| c.pairs.count())
    }

    /// The current connection.
    pub(crate) fn conn(&self) -> Option<Arc<Conn>> {
        self.conn.clone()
    }

    /// The frontend went away and the connection's workers are gone: no
    /// current connection until the next one (its reset). The table and
    /// its hit counters stay until then.
    pub(crate) fn disconnect(&mut self) {
        self.conn = None;
    }

    /// A device reset or a new connection: new generation, empty table,
    /// no session. `conn` becomes the connection replies go to.
    pub(crate) fn reset(&mut self, conn: Option<Arc<Conn>>, cause: &str) {
        let now = now_ns();
        let prev = self.generation();
        let gen = next_generation(prev);
        self.generation.store(gen, Ordering::Relaxed);
        self.c.generation_changes += 1;
        self.tracer
            .emit(TraceRecord::gen_change(now, prev, gen, cause));
        let mut evs = Vec::new();
        self.table.clear(&mut |e| evs.push(e));
        for e in evs {
            self.publish(now, e);
        }
        if let Some(c) = conn {
            self.hits = Some(c.hits.clone());
            self.conn = Some(c);
        }
        self.rebase_all();
        self.expected = None;
        self.cache.clear();
        self.pending.clear();
        self.preload_due = self.preload.is_some();
        self.rearm();
        log::info!("generation {prev:#x} -> {gen:#x} ({cause})");
    }

    /// Handles one management frame sent by the guest on pair `worker`.
    /// Replies for other pairs go to their inboxes; the replies for
    /// `worker` itself are appended to `own`, for it to deliver.
    pub(crate) fn handle_frame(&mut self, worker: usize, frame: &[u8], own: &mut Vec<Reply>) {
        self.count_destination(frame);
        self.caller = Some(worker);
        self.frame(worker, frame);
        self.caller = None;
        own.append(&mut self.own);
    }

    /// Where the driver addressed the frame: a HELLO of a driver not bound
    /// yet to the link-local group, everything else (a bound driver's
    /// keepalive HELLO included) to the device (PROTOCOL.md, "Ethernet
    /// header"); any other destination is counted apart, it is not refused.
    fn count_destination(&mut self, frame: &[u8]) {
        let Some(dst) = frame.get(..6) else { return };
        let hello = proto::peek_header(frame).and_then(|h| h.kind()) == Some(proto::MsgType::Hello);
        let d = &mut self.c.dst;
        match (dst == proto::HELLO_GROUP_MAC, dst == DEVICE_MAC, hello) {
            (true, _, true) => d.hello_to_group += 1,
            (_, true, _) => d.to_device += 1,
            _ if dst == proto::BROADCAST_MAC => d.to_broadcast += 1,
            _ => d.to_other += 1,
        }
    }

    fn frame(&mut self, worker: usize, frame: &[u8]) {
        let now = now_ns();
        let gen = self.generation();
        self.c.frames_rx += 1;
        let hdr = proto::peek_header(frame);
        if self.table.mgmt_loss() {
            self.c.dropped_by_loss += 1;
            self.tracer.emit(TraceRecord::mgmt_drop(
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
                self.tracer.emit(TraceRecord::bad_frame(now, gen, &e));
                log::debug!("pair {worker}: {e}");
                let Some(h) = e.nak_header().copied() else {
                    return;
                };
                if !self.in_order(now, gen, h.seq, h.msg_type, route) {
                    return;
                }
                let nak = Message::Ack(Ack {
                    acked_type: h.msg_type,
                    frame_status: e.kind.code(),
                    statuses: Vec::new(),
                });
                if let Some(pkt) = encode_reply(dst, h.seq, gen, &nak) {
                    self.c.naks_sent += 1;
                    self.remember(h.seq, &pkt);
                    self.send(now, route, pkt);
                }
            }
            Ok((h, msg)) => {
                self.c.frames_ok += 1;
                match msg {
                    Message::Hello(hello) => {
                        // HELLO (re)starts the session whatever its seq.
                        self.expected = Some(h.seq.wrapping_add(1));
                        self.cache.clear();
                        // A driver that knows the rule extension gets the
                        // longer CAPS; an older one the 24 bytes it reads.
                        // Its `features` has the RSS extension's bit for a
                        // driver that knows that one too (the long CAPS
                        // exists for the rule stage: without one, no
                        // extension is announced; RSS_SET works anyway).
                        let rules = self.table.config().rules;
                        let v = hello.driver_version;
                        let caps = Caps {
                            nonce: hello.nonce,
                            ext: (v >= proto::RULES_DRIVER_VERSION && rules > 0).then(|| CapsExt {
                                max_rules: rules.min(u32::from(u16::MAX)) as u16,
                                rss: v >= proto::RSS_DRIVER_VERSION,
                            }),
                            ..self.caps()
                        };
                        let dst = if hello.mac == [0; 6] || hello.mac[0] & 1 != 0 {
                            dst
                        } else {
                            hello.mac
                        };
                        if let Some(pkt) = encode_reply(dst, h.seq, gen, &Message::Caps(caps)) {
                            self.c.caps_sent += 1;
                            self.remember(h.seq, &pkt);
                            self.send(now, Route { worker, dst }, pkt);
                        }
                    }
                    Message::Add(ops) => {
                        self.request(now, gen, h.seq, Request::Add(ops), route);
                    }
                    Message::Del(ops) => {
                        self.request(now, gen, h.seq, Request::Del(ops), route);
                    }
                    Message::Flush(r) => {
                        self.request(now, gen, h.seq, Request::Flush(r), route);
                    }
                    Message::RuleSet(ops) => {
                        self.request(now, gen, h.seq, Request::RuleSet(ops), route);
                    }
                    Message::RuleDel(locs) => {
                        self.request(now, gen, h.seq, Request::RuleDel(locs), route);
                    }
                    Message::RssSet(op) => {
                        self.request(now, gen, h.seq, Request::RssSet(op), route);
                    }
                    // decode_frame rejects device->driver types.
                    Message::Caps(_) | Message::Ack(_) => {}
                }
            }
        }
    }

    fn request(&mut self, now: u64, gen: u32, seq: u32, req: Request, route: Route) {
        if !self.in_order(now, gen, seq, req.kind().code(), route) {
            return;
        }
        self.pending.insert(seq, route);
        self.table.submit(now, seq, req);
        self.advance(now);
    }

    /// Go-back-N window check. Returns true when `seq` is the expected one
    /// (and advances the window); handles duplicates and out-of-order.
    fn in_order(&mut self, now: u64, gen: u32, seq: u32, ty: u8, route: Route) -> bool {
        let exp = *self.expected.get_or_insert(seq);
        let d = seq.wrapping_sub(exp).cast_signed();
        if d == 0 {
            self.expected = Some(exp.wrapping_add(1));
            return true;
        }
        if d < 0 {
            self.c.duplicates += 1;
            self.tracer.emit(TraceRecord::mgmt_drop(
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
                f[NET_HDR_LEN..NET_HDR_LEN + 6].copy_from_slice(&route.dst);
                self.c.duplicate_reacks += 1;
                self.send(now, route, f);
            }
        } else {
            self.c.out_of_order += 1;
            self.tracer.emit(TraceRecord::mgmt_drop(
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
    pub(crate) fn advance(&mut self, now: u64) {
        let enabled = self.enabled_pairs();
        let mut evs = Vec::new();
        self.table.advance(now, enabled, &mut |e| evs.push(e));
        let gen = self.generation();
        for e in evs {
            if let TableEvent::Completed {
                seq,
                kind,
                statuses,
                ..
            } = &e
            {
                self.tracer.emit(TraceRecord::from_event(now, gen, &e));
                let Some(route) = self.pending.remove(seq) else {
                    continue;
                };
                let ack = Message::Ack(Ack {
                    acked_type: kind.code(),
                    frame_status: 0,
                    statuses: statuses.iter().map(|s: &OpStatus| s.code()).collect(),
                });
                if let Some(pkt) = encode_reply(route.dst, *seq, gen, &ack) {
                    if self.forge_acks {
                        self.forge(route, &pkt);
                    }
                    self.c.acks_sent += 1;
                    self.remember(*seq, &pkt);
                    if self.drop_acks > 0 {
                        self.drop_acks -= 1;
                        self.lose(now, &pkt);
                        continue;
                    }
                    self.send(now, route, pkt);
                }
            } else {
                self.publish(now, e);
            }
        }
        self.rearm();
    }

    /// Traces a table event and hands it to every worker replica.
    fn publish(&mut self, now: u64, e: TableEvent) {
        let gen = self.generation();
        let mut rec = TraceRecord::from_event(now, gen, &e);
        match &e {
            TableEvent::Added { id, .. } => {
                self.rebase(*id);
            }
            TableEvent::Replaced { id, prev_id, .. } => {
                rec.hits = Some(self.hits(*prev_id));
                self.falsify(&mut rec);
                self.rebase(*id);
            }
            TableEvent::Deleted { id, .. } | TableEvent::Evicted { id, .. } => {
                rec.hits = Some(self.hits(*id));
            }
            TableEvent::RuleSet { rule, .. } => {
                self.rebase_rule(rule.loc);
            }
            TableEvent::RuleRemoved { rule, .. } => {
                rec.hits = Some(self.rule_hits(rule.loc));
            }
            _ => {}
        }
        self.tracer.emit(rec);
        let replica_relevant = matches!(
            e,
            TableEvent::Added { .. }
                | TableEvent::Replaced { .. }
                | TableEvent::Deleted { .. }
                | TableEvent::Evicted { .. }
                | TableEvent::RuleSet { .. }
                | TableEvent::RuleRemoved { .. }
                | TableEvent::RssSet(_)
        );
        if replica_relevant {
            if let Some(c) = &self.conn {
                c.lanes.publish(e);
            }
        }
    }

    /// Sends a reply (unless the loss knob drops it) to the worker of its
    /// route; see `lanes::Lanes::reply` for when it leaves.
    fn send(&mut self, now: u64, route: Route, pkt: Vec<u8>) {
        if self.table.mgmt_loss() {
            self.lose(now, &pkt);
            return;
        }
        if self.rogue {
            self.send_rogue(route, &pkt);
        }
        if let Some(c) = &self.conn {
            if let Some(r) = c.lanes.reply(route.worker, pkt, self.caller) {
                self.own.push(r);
            }
        }
    }

    fn caps(&self) -> Caps {
        let mut caps = self.table.caps(self.max_pairs, self.enabled_pairs());
        caps.max_ops = self.max_ops;
        caps
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
                let now = now_ns();
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
    pub(crate) fn on_timer(&mut self) {
        let _ = self.timer.wait();
        self.armed_for = None;
        self.advance(now_ns());
    }

    /// Sets a knob (parsed by the caller, see [`Knob::parse`]).
    pub(crate) fn set_knob(&mut self, knob: Knob) -> Result<(), KnobRefused> {
        match knob {
            Knob::AddFailRate(v) => self.table.set_add_fail_rate(v)?,
            Knob::MgmtLossRate(v) => self.table.set_mgmt_loss_rate(v)?,
            Knob::ProgramLatency(v) => self.table.set_latency_ns(v.as_nanos() as u64)?,
            Knob::TableCapacity(v) => {
                if v > self.replica_capacity {
                    return Err(KnobRefused::BeyondReplicas {
                        asked: v,
                        max: self.replica_capacity,
                    });
                }
                let buckets = self.table.config().buckets;
                self.table
                    .reshape(v, buckets)
                    .map_err(KnobRefused::Reshape)?;
            }
            Knob::Buckets(v) => {
                let cap = self.table.capacity();
                self.table.reshape(cap, v).map_err(KnobRefused::Reshape)?;
            }
            // A packet-path fault, not the table's: the control socket
            // sets it (`config::PathFaults`).
            Knob::Misroute(_)
            | Knob::MisrouteRate(_)
            | Knob::DropRate(_)
            | Knob::CorruptRate(_)
            | Knob::BadCsumRate(_)
            | Knob::TruncateRate(_)
            | Knob::ReorderRate(_)
            | Knob::DelayEffectMs(_) => {}
            Knob::WrongTrace(on) => self.wrong_trace = on,
            Knob::RogueResponder(on) => self.rogue = on,
            Knob::RogueNonce(on) => self.rogue_nonce = on,
            Knob::DropAcks(n) => self.drop_acks = n,
            Knob::ForgeAcks(on) => self.forge_acks = on,
        }
        Ok(())
    }
}

/// Why the device refused a knob value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KnobRefused {
    #[error("{0}")]
    Table(#[from] arfs::ConfigError),
    #[error("{0}; unload the guest driver (its FLUSH empties the table) and retry")]
    Reshape(arfs::ConfigError),
    #[error("{asked} exceeds the capacity the daemon started with ({max}): restart it with a larger --table-capacity")]
    BeyondReplicas { asked: u32, max: u32 },
}

/// Filter `id` of a preload with `pairs` pairs enabled: the first
/// `matching` are the generator's default flows (UDP `gen_ip`:10000+id ->
/// `guest_ip`:5001) on the queue RSS picks for them, the rest UDP flows
/// from 172.16.0.0/16 to port 80 that nothing sends.
fn preload_op(
    p: Preload,
    id: u16,
    gen_ip: Ipv4Addr,
    guest_ip: Ipv4Addr,
    rss: &Rss,
    pairs: u16,
) -> AddOp {
    if u32::from(id) < p.matching {
        let k = FlowKey::v4(
            L4Proto::Udp,
            gen_ip,
            Preload::SPORT + id,
            guest_ip,
            Preload::DPORT,
        );
        return AddOp::new(id, rss.queue_for_key(&k), &k);
    }
    let src = Ipv4Addr::new(172, 16, (id >> 8) as u8, id as u8);
    let k = FlowKey::v4(L4Proto::Udp, src, 1024 + id % 50000, guest_ip, 80);
    AddOp::new(id, id % pairs.max(1), &k)
}

/// A reply frame from the device, with the virtio-net header space in
/// front (delivered as is).
fn encode_reply(dst: [u8; 6], seq: u32, generation: u32, msg: &Message) -> Option<Vec<u8>> {
    let meta = FrameMeta {
        dst,
        src: DEVICE_MAC,
        seq,
        generation,
    };
    let mut pkt = vec![0u8; NET_HDR_LEN + proto::encoded_len(msg)];
    let n = proto::encode_into(&mut pkt[NET_HDR_LEN..], &meta, msg).ok()?;
    pkt.truncate(NET_HDR_LEN + n);
    Some(pkt)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use arfs::proto::{decode_frame_driver, encode, FrameError, FrameMeta, Hello, BROADCAST_MAC};
    use arfs::{AddOp, FlowKey, L4Proto, Message, OpStatus};

    use super::*;
    use std::sync::Mutex;

    const GUEST: [u8; 6] = [2, 0, 0, 0, 0, 0x15];

    /// The management state of a 2-pair device, as the daemon holds it.
    struct Dev {
        mgmt: Mutex<Mgmt>,
        generation: Arc<AtomicU32>,
    }

    impl Dev {
        fn lock_mgmt(&self) -> std::sync::MutexGuard<'_, Mgmt> {
            self.mgmt.lock().unwrap()
        }

        fn generation(&self) -> u32 {
            self.generation.load(Ordering::Relaxed)
        }
    }

    fn setup(latency: Duration) -> (Dev, Arc<Conn>) {
        let cfg = TableConfig {
            capacity: 64,
            latency_ns: latency.as_nanos() as u64,
            ..TableConfig::default()
        };
        let generation = Arc::new(AtomicU32::new(1));
        let m = Mgmt::new(cfg, Arc::new(Tracer::disabled()), generation.clone(), 2).unwrap();
        let sh = Dev {
            mgmt: Mutex::new(m),
            generation,
        };
        let conn = Arc::new(Conn::new(2).unwrap());
        // Both pairs enabled.
        conn.pairs.observe(0, true, true);
        conn.pairs.observe(1, true, true);
        sh.lock_mgmt().reset(Some(conn.clone()), "test");
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

    /// A management frame handled by worker `w` with the lock held, as
    /// a worker does; its own replies are returned.
    fn handle(sh: &Dev, w: usize, f: &[u8]) -> Vec<Reply> {
        let mut own = Vec::new();
        sh.lock_mgmt().handle_frame(w, f, &mut own);
        own
    }

    /// Decodes replies (header space in front, addressed to the guest).
    fn decode(rs: Vec<Reply>) -> Vec<(u32, Message)> {
        rs.into_iter()
            .map(|r| {
                let f = &r.pkt[NET_HDR_LEN..];
                assert_eq!(&f[0..6], &GUEST);
                let (hdr, msg) = decode_frame_driver(f).unwrap();
                (hdr.seq, msg)
            })
            .collect()
    }

    /// Replies queued on worker `w`'s inbox.
    fn queued(conn: &Conn, w: usize) -> Vec<(u32, Message)> {
        let ib = conn.lanes.get(w).unwrap();
        let mut out = Vec::new();
        while let Some(r) = ib.replies.pop() {
            out.push(r);
        }
        decode(out)
    }

    /// A driver's HELLO (nonce `nonce`) as frame `seq` on pair 0.
    fn hello(seq: u32, nonce: u32) -> Vec<u8> {
        frame(
            seq,
            &Message::Hello(Hello {
                driver_version: 1,
                nonce,
                mac: GUEST,
            }),
        )
    }

    #[test]
    fn go_back_n_sequence() {
        let (sh, c) = setup(Duration::ZERO);
        let gen = sh.generation();
        let hello = Message::Hello(Hello {
            driver_version: 1,
            nonce: 0x1234_5678,
            mac: GUEST,
        });
        let r = decode(handle(&sh, 1, &frame(10, &hello)));
        assert!(
            matches!(r.as_slice(), [(10, Message::Caps(caps))] if caps.max_queue_pairs == 2 && caps.enabled_queue_pairs == 2 && caps.nonce == 0x1234_5678)
        );
        // In order: applied and acknowledged, the replica update is queued.
        let own = handle(&sh, 1, &frame(11, &add(7, 1)));
        // The ACK may leave only once every replica applied the ADD.
        assert!(own.iter().all(|r| r.needs == 1));
        let r = decode(own);
        assert!(
            matches!(r.as_slice(), [(11, Message::Ack(a))] if a.statuses == vec![OpStatus::Ok.code()])
        );
        assert_eq!(sh.lock_mgmt().table.len(), 1);
        assert!(c.lanes.pop_update(0).is_some());
        // Duplicate: same ACK again, nothing applied.
        let r = decode(handle(&sh, 1, &frame(11, &add(8, 2))));
        assert!(matches!(r.as_slice(), [(11, Message::Ack(_))]));
        assert_eq!(sh.lock_mgmt().table.len(), 1);
        // Ahead of the window: dropped silently.
        assert!(handle(&sh, 1, &frame(13, &add(9, 3))).is_empty());
        assert!(queued(&c, 1).is_empty());
        let m = sh.lock_mgmt();
        assert_eq!(
            (m.c.duplicates, m.c.duplicate_reacks, m.c.out_of_order),
            (1, 1, 1)
        );
        assert_eq!(m.table.len(), 1);
        assert_eq!(sh.generation(), gen);
    }

    #[test]
    fn drop_acks_loses_the_first_reply_only_and_the_duplicate_gets_it() {
        let (sh, _c) = setup(Duration::ZERO);
        assert_eq!(decode(handle(&sh, 0, &hello(20, 7))).len(), 1);
        sh.lock_mgmt().set_knob(Knob::DropAcks(1)).unwrap();
        // Applied, its ACK lost; the knob is spent.
        assert!(decode(handle(&sh, 0, &frame(21, &add(7, 1)))).is_empty());
        assert_eq!(sh.lock_mgmt().table.len(), 1);
        assert_eq!(sh.lock_mgmt().drop_acks, 0);
        assert_eq!(sh.lock_mgmt().c.replies_dropped_by_loss, 1);
        // The driver's retransmission: the cached ACK, nothing applied again.
        let r = decode(handle(&sh, 0, &frame(21, &add(7, 1))));
        assert!(
            matches!(r.as_slice(), [(21, Message::Ack(a))] if a.statuses == vec![OpStatus::Ok.code()])
        );
        // The next request is answered as usual.
        assert_eq!(decode(handle(&sh, 0, &frame(22, &add(8, 2)))).len(), 1);
        assert_eq!(sh.lock_mgmt().table.len(), 2);
    }

    #[test]
    fn forge_acks_sends_a_replay_and_a_copy_for_another_host_of_another_generation() {
        let (sh, _c) = setup(Duration::ZERO);
        let gen = sh.generation();
        assert_eq!(decode(handle(&sh, 0, &hello(30, 7))).len(), 1);
        sh.lock_mgmt().set_knob(Knob::ForgeAcks(true)).unwrap();
        let out = handle(&sh, 0, &frame(31, &add(7, 1)));
        let frames: Vec<Vec<u8>> = out.iter().map(|r| r.pkt.clone()).collect();
        assert_eq!(frames.len(), 3, "replay, copy for another host, the ACK");
        let hdr = |f: &[u8]| {
            let (h, _) = decode_frame_driver(&f[NET_HDR_LEN..]).unwrap();
            (
                f[NET_HDR_LEN..NET_HDR_LEN + 6].to_vec(),
                f[NET_HDR_LEN + 6..NET_HDR_LEN + 12].to_vec(),
                h.seq,
                h.generation,
            )
        };
        // The previous reply (the CAPS of seq 30), one generation on.
        assert_eq!(
            hdr(&frames[0]),
            (GUEST.to_vec(), DEVICE_MAC.to_vec(), 30, gen + 1)
        );
        // This ACK for another host, one generation on.
        assert_eq!(
            hdr(&frames[1]),
            (OTHER_HOST_MAC.to_vec(), DEVICE_MAC.to_vec(), 31, gen + 1)
        );
        // The real one, unchanged.
        assert_eq!(
            hdr(&frames[2]),
            (GUEST.to_vec(), DEVICE_MAC.to_vec(), 31, gen)
        );
        assert_eq!(sh.lock_mgmt().c.forged_sent, 2);
    }

    /// `wrong_trace`: a REPLACE line that moves its flow names the new
    /// queue as `prev_rxq`, counted; one that keeps the queue, and every
    /// line with the knob off, is left as it was.
    #[test]
    fn wrong_trace_names_the_new_queue_as_the_previous_one() {
        let (sh, _c) = setup(Duration::ZERO);
        let k = FlowKey::v4(
            L4Proto::Udp,
            Ipv4Addr::new(10, 0, 2, 1),
            1,
            Ipv4Addr::new(10, 0, 2, 15),
            5001,
        );
        let line = |m: &mut Mgmt, prev_rxq: u16| {
            let e = TableEvent::Replaced {
                seq: 3,
                id: 7,
                rxq: 1,
                flow: k,
                prev_id: 7,
                prev_rxq,
                prev_flow: k,
                prev_hits: 0,
            };
            let mut rec = TraceRecord::from_event(0, 1, &e);
            m.falsify(&mut rec);
            rec.prev_rxq
        };
        let mut m = sh.lock_mgmt();
        assert_eq!(line(&mut m, 0), Some(0));
        m.set_knob(Knob::WrongTrace(true)).unwrap();
        assert!(m.snapshot(false).wrong_trace);
        assert_eq!(line(&mut m, 0), Some(1));
        assert_eq!(line(&mut m, 1), Some(1));
        assert_eq!(m.c.wrong_traced, 1);
    }

    #[test]
    fn malformed_frames_are_naked_or_ignored() {
        let (sh, c) = setup(Duration::ZERO);
        let mut f = frame(5, &add(1, 1));
        // body_len mismatch -> NAK with the frame status, nothing applied.
        f[14 + 14] = 0;
        f[14 + 15] = 40;
        let r = decode(handle(&sh, 0, &f));
        assert!(
            matches!(r.as_slice(), [(5, Message::Ack(a))] if a.frame_status == FrameError::BadLength.code() && a.statuses.is_empty())
        );
        // Bad magic: silent.
        let mut f = frame(6, &add(1, 1));
        f[14] = 0;
        assert!(handle(&sh, 0, &f).is_empty());
        assert!(queued(&c, 0).is_empty());
        let m = sh.lock_mgmt();
        assert_eq!(m.c.bad[usize::from(FrameError::BadLength.code())], 1);
        assert_eq!(m.c.bad[usize::from(FrameError::BadMagic.code())], 1);
        assert_eq!(m.table.len(), 0);
    }

    #[test]
    fn latency_delays_effect_and_ack() {
        let (sh, c) = setup(Duration::from_hours(1));
        assert!(
            handle(&sh, 0, &frame(1, &add(7, 1))).is_empty(),
            "ACK before the ops took effect"
        );
        assert!(queued(&c, 0).is_empty());
        assert_eq!(sh.lock_mgmt().table.len(), 0);
        assert!(c.lanes.pop_update(0).is_none());
        // Time passes (the management timer calls advance): the ACK goes
        // to the inbox of the pair the request came on.
        let later = now_ns() + 3_700_000_000_000;
        sh.lock_mgmt().advance(later);
        let r = queued(&c, 0);
        assert!(matches!(r.as_slice(), [(1, Message::Ack(_))]));
        assert_eq!(sh.lock_mgmt().table.len(), 1);
        assert!(c.lanes.pop_update(1).is_some());
    }

    #[test]
    fn reset_bumps_generation_and_empties_the_table() {
        let (sh, c) = setup(Duration::ZERO);
        let _ = handle(&sh, 0, &frame(1, &add(7, 1)));
        while c.lanes.pop_update(0).is_some() {}
        let g = sh.generation();
        sh.lock_mgmt().reset(None, "reset");
        assert_ne!(sh.generation(), g);
        assert_ne!(sh.generation(), 0);
        assert_eq!(sh.lock_mgmt().table.len(), 0);
        // The replicas hear about the eviction.
        let e = c.lanes.pop_update(0).expect("evict event");
        assert!(matches!(*e, TableEvent::Evicted { id: 7, .. }));
        // A request of the old session starts a new window and carries the new generation.
        assert_eq!(handle(&sh, 0, &frame(2, &add(7, 1))).len(), 1);
    }
}
