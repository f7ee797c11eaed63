//! The built-in generator peer of one worker: answers ARP and ICMP echo
//! for its IPv4 address, neighbour solicitation and ICMPv6 echo for its
//! IPv6 address, sinks everything else the guest sends, learns the
//! guest's MAC from its frames, and sends this worker's share of the UDP
//! flow sets (see [`super::flows`]), paced by a 1 ms timerfd (rate 0: as
//! fast as the rx rings take them).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::timerfd::TimerFd;

use super::flows::{
    checksum, fold_sum, local_sets, seq_offset, seq_tag, word_sum, GenControl, LocalSet, ETH_P_ARP,
    ETH_P_IP, ETH_P_IPV6, MAX_FRAME, SEQ_LEN,
};
use super::{Peer, Sink};
use crate::stats::{add, Stats};
use crate::virtq::NET_HDR_LEN;

/// Most frames generated per event in unlimited mode.
const GEN_BUDGET: usize = 1024;

/// The generator as one worker runs it.
pub(crate) struct GenPeer {
    ctl: Arc<GenControl>,
    stats: Arc<Stats>,
    ip: Ipv4Addr,
    ip6: Ipv6Addr,
    mac: [u8; 6],
    timer: TimerFd,
    timer_armed: bool,
    /// The flow-set version and guest MAC the local sets were built for.
    version: u64,
    guest_mac: u64,
    sets: Vec<LocalSet>,
    unlimited: bool,
    last_tick: Instant,
    reply: Vec<u8>,
    pkt: Vec<u8>,
    /// Frames and bytes sunk in this tx batch, not yet counted.
    sunk: (u64, u64),
}

impl GenPeer {
    pub(crate) fn new(
        ctl: Arc<GenControl>,
        stats: Arc<Stats>,
        ip: Ipv4Addr,
        ip6: Ipv6Addr,
        mac: [u8; 6],
    ) -> std::io::Result<Self> {
        Ok(Self {
            ctl,
            stats,
            ip,
            ip6,
            mac,
            timer: crate::clock::timer()?,
            timer_armed: false,
            version: u64::MAX,
            guest_mac: u64::MAX,
            sets: Vec::new(),
            unlimited: false,
            last_tick: Instant::now(),
            reply: Vec::with_capacity(MAX_FRAME),
            pkt: Vec::with_capacity(NET_HDR_LEN + MAX_FRAME),
            sunk: (0, 0),
        })
    }

    /// Rebuilds this worker's share when the flow sets or the guest's MAC
    /// changed, and arms or clears the pacing timer.
    fn check_sets(&mut self, id: usize) {
        let v = self.ctl.version.load(Ordering::Acquire);
        let mac = self.ctl.guest_mac.load(Ordering::Relaxed);
        if v == self.version && mac == self.guest_mac {
            return;
        }
        self.version = v;
        self.guest_mac = mac;
        let dst = if mac == 0 {
            [0xff; 6]
        } else {
            mac_from_u64(mac)
        };
        self.sets = local_sets(&self.ctl.snapshot(), id, dst, self.mac);
        self.unlimited = self.sets.iter().any(|s| s.rate == 0.0);
        log::debug!(
            "pair {id}: generator version {v}: {} local flow set(s)",
            self.sets.len()
        );
        let want = !self.sets.is_empty();
        if want != self.timer_armed {
            let r = if want {
                self.timer
                    .reset(Duration::from_millis(1), Some(Duration::from_millis(1)))
            } else {
                self.timer.clear()
            };
            if let Err(e) = r {
                log::warn!("pair {id}: generator timer: {e}");
            }
            self.timer_armed = want;
        }
        self.last_tick = Instant::now();
    }

    fn run(&mut self, r: &mut impl Sink) {
        let now = Instant::now();
        let dt = now.duration_since(self.last_tick).as_secs_f64();
        self.last_tick = now;
        let mut total = 0u64;
        let mut changed = false;
        r.clear_congestion();
        for s in &mut self.sets {
            let mut n = if s.rate > 0.0 {
                s.credit = (s.credit + s.rate * dt).min((s.rate * 0.02).max(32.0));
                s.credit.floor() as u64
            } else {
                GEN_BUDGET as u64
            };
            if let Some(rem) = s.remaining {
                n = n.min(rem);
            }
            if s.set.stopped.load(Ordering::Relaxed) {
                n = 0;
            }
            let size = s.set.size;
            let stamp = s.set.stamp;
            let hl = s.hdr_len;
            let seq_at = seq_offset(stamp);
            let with_seq = s.var >= seq_at + SEQ_LEN;
            let unlimited = s.rate == 0.0;
            let sent = r.table_ns();
            let len = (size - hl) as u64;
            let want = n;
            n = 0;
            while n < want {
                let i = s.next;
                s.next = if i + 1 == s.headers.len() { 0 } else { i + 1 };
                let frame = &mut s.buf[NET_HDR_LEN..NET_HDR_LEN + size];
                frame[..hl].copy_from_slice(&s.headers[i][..hl]);
                // The head: the send stamp, then the flow's sequence
                // number, its tag, the send time and the payload's
                // length, written in place; their 16-bit words' sum is
                // folded into the template's checksum.
                let mut sum = 0u64;
                if stamp {
                    let now = crate::clock::now_ns();
                    frame[hl..hl + 8].copy_from_slice(&super::rtt::MAGIC);
                    frame[hl + 8..hl + 16].copy_from_slice(&now.to_be_bytes());
                    sum += word_sum(u64::from_be_bytes(super::rtt::MAGIC)) + word_sum(now);
                }
                if with_seq {
                    let ti = s.idx[i];
                    let tuple = &s.set.tuples[ti];
                    let next = &s.set.seq[ti];
                    let seq = next.load(Ordering::Relaxed);
                    next.store(seq + 1, Ordering::Relaxed);
                    let tag = seq_tag(tuple.sport, tuple.dport, seq, sent, len);
                    let at = hl + seq_at;
                    frame[at..at + 8].copy_from_slice(&seq.to_be_bytes());
                    frame[at + 8..at + 16].copy_from_slice(&tag.to_be_bytes());
                    frame[at + 16..at + 24].copy_from_slice(&sent.to_be_bytes());
                    frame[at + 24..at + 32].copy_from_slice(&len.to_be_bytes());
                    sum += word_sum(seq) + word_sum(tag) + word_sum(sent) + word_sum(len);
                }
                if stamp || with_seq {
                    fold_sum(frame, hl, sum);
                }
                r.frame(&mut s.buf[..NET_HDR_LEN + size]);
                n += 1;
                // Unlimited sets stop at the first full destination.
                if unlimited && r.congested() {
                    break;
                }
            }
            if s.rate > 0.0 {
                s.credit -= n as f64;
            }
            if let Some(rem) = &mut s.remaining {
                *rem -= n;
                if *rem == 0 {
                    changed = true;
                }
            }
            s.set.sent[r.pair()].fetch_add(n, Ordering::Relaxed);
            total += n;
        }
        add(&self.stats.peer.gen_sent, total);
        if changed {
            self.sets.retain(|s| s.remaining != Some(0));
            self.unlimited = self.sets.iter().any(|s| s.rate == 0.0);
        }
        // Unlimited mode: come back at once unless a destination queue is
        // out of room (then the guest's rx kick or the 1 ms timer resumes):
        // as fast as the rx rings take the frames, not faster.
        if self.unlimited && !r.congested() {
            r.wake_self();
        }
    }
}

impl Peer for GenPeer {
    fn fd(&self) -> Option<RawFd> {
        Some(self.timer.as_raw_fd())
    }

    fn guest_frame(&mut self, pkt: &mut [u8], r: &mut impl Sink) {
        let frame = &pkt[NET_HDR_LEN..];
        let mut src = [0u8; 6];
        src.copy_from_slice(&frame[6..12]);
        if src[0] & 1 == 0 {
            let m = mac_to_u64(src);
            // Read first: a swap per frame would take the shared line for
            // writing on every frame, from every worker.
            if self.ctl.guest_mac.load(Ordering::Relaxed) != m
                && self.ctl.guest_mac.swap(m, Ordering::Relaxed) != m
            {
                self.ctl.bump();
                r.wake_all();
            }
        }
        let peer = &self.stats.peer;
        if let Some(sent) = super::rtt::echoed_stamp(frame, self.ip, self.ip6) {
            peer.rtt.record(sent, crate::clock::now_ns());
            return;
        }
        let me = Me {
            ip: self.ip,
            ip6: self.ip6,
            mac: self.mac,
        };
        match respond(frame, &me, &mut self.reply) {
            Response::Sink => {
                // Counted per batch (`tx_batch_end`): the counters are
                // shared by every worker.
                self.sunk.0 += 1;
                self.sunk.1 += frame.len() as u64;
            }
            resp => {
                add(
                    match resp {
                        Response::Arp => &peer.arp_replies,
                        Response::Neighbor => &peer.nd_replies,
                        _ => &peer.icmp_echo_replies,
                    },
                    1,
                );
                self.pkt.clear();
                self.pkt.resize(NET_HDR_LEN, 0);
                self.pkt.extend_from_slice(&self.reply);
                r.frame(&mut self.pkt);
            }
        }
    }

    fn tx_batch_end(&mut self) {
        let (n, bytes) = std::mem::take(&mut self.sunk);
        if n > 0 {
            add(&self.stats.peer.sink_packets, n);
            add(&self.stats.peer.sink_bytes, bytes);
        }
    }

    fn frames_for_guest(&mut self, r: &mut impl Sink, fd_event: bool) {
        if fd_event {
            let _ = self.timer.wait();
        }
        self.check_sets(r.pair());
        if !self.sets.is_empty() {
            self.run(r);
        }
    }
}

/// What the responder did with a frame from the guest.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Response {
    /// An ARP reply was written to `out`.
    Arp,
    /// An ICMP or ICMPv6 echo reply was written to `out`.
    Echo,
    /// A neighbour advertisement (the answer to a neighbour solicitation)
    /// was written to `out`.
    Neighbor,
    /// Nothing to answer: sunk.
    Sink,
}

/// The addresses the responder answers for.
pub(crate) struct Me {
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
    pub mac: [u8; 6],
}

/// ICMPv6 types (RFC 4443, RFC 4861).
const ICMP6_ECHO_REQUEST: u8 = 128;
const ICMP6_ECHO_REPLY: u8 = 129;
const ICMP6_NEIGHBOR_SOLICIT: u8 = 135;
const ICMP6_NEIGHBOR_ADVERT: u8 = 136;
const IPPROTO_ICMPV6: u8 = 58;

/// The ICMPv6 checksum of `body` (checksum field zeroed) between `src`
/// and `dst`: over the pseudo-header of RFC 8200 8.1 and the message.
fn icmp6_checksum(src: &[u8], dst: &[u8], body: &[u8]) -> u16 {
    let mut pseudo = [0u8; 40];
    pseudo[0..16].copy_from_slice(src);
    pseudo[16..32].copy_from_slice(dst);
    pseudo[32..36].copy_from_slice(&(body.len() as u32).to_be_bytes());
    pseudo[39] = IPPROTO_ICMPV6;
    checksum(&[&pseudo, body], 0)
}

/// Answers ARP requests and ICMP echo requests for `me.ip`, neighbour
/// solicitations and ICMPv6 echo requests for `me.ip6`.
pub(crate) fn respond(frame: &[u8], me: &Me, out: &mut Vec<u8>) -> Response {
    if frame.len() < 14 {
        return Response::Sink;
    }
    let (my_ip, my_mac) = (me.ip, me.mac);
    let et = u16::from_be_bytes([frame[12], frame[13]]);
    if et == ETH_P_ARP && frame.len() >= 42 {
        let a = &frame[14..42];
        // Ethernet/IPv4 request for my address.
        if a[0..2] == [0, 1]
            && a[2..4] == [8, 0]
            && a[4] == 6
            && a[5] == 4
            && a[6..8] == [0, 1]
            && a[24..28] == my_ip.octets()
        {
            out.clear();
            out.resize(60, 0);
            out[0..6].copy_from_slice(&a[8..14]);
            out[6..12].copy_from_slice(&my_mac);
            out[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
            let r = &mut out[14..42];
            r[0..6].copy_from_slice(&[0, 1, 8, 0, 6, 4]);
            r[6..8].copy_from_slice(&[0, 2]);
            r[8..14].copy_from_slice(&my_mac);
            r[14..18].copy_from_slice(&my_ip.octets());
            r[18..24].copy_from_slice(&a[8..14]);
            r[24..28].copy_from_slice(&a[14..18]);
            return Response::Arp;
        }
        return Response::Sink;
    }
    if et == ETH_P_IP && frame.len() >= 34 {
        let ip = &frame[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
        if ip[0] >> 4 != 4
            || ihl < 20
            || tot < ihl + 8
            || tot > ip.len()
            || ip[9] != 1
            || frag != 0
            || ip[16..20] != my_ip.octets()
        {
            return Response::Sink;
        }
        if frame[0..6] != my_mac && frame[0] & 1 == 0 {
            return Response::Sink;
        }
        let icmp = &ip[ihl..tot];
        if icmp[0] != 8 || icmp[1] != 0 {
            return Response::Sink;
        }
        out.clear();
        out.extend_from_slice(&frame[..14 + tot]);
        out[0..6].copy_from_slice(&frame[6..12]);
        out[6..12].copy_from_slice(&my_mac);
        let oip = &mut out[14..14 + tot];
        let (s, d) = (
            [ip[12], ip[13], ip[14], ip[15]],
            [ip[16], ip[17], ip[18], ip[19]],
        );
        oip[12..16].copy_from_slice(&d);
        oip[16..20].copy_from_slice(&s);
        oip[8] = 64;
        oip[10..12].fill(0);
        let c = checksum(&[&oip[..ihl]], 0);
        oip[10..12].copy_from_slice(&c.to_be_bytes());
        let ic = &mut oip[ihl..];
        ic[0] = 0;
        ic[2..4].fill(0);
        let c = checksum(&[ic], 0);
        ic[2..4].copy_from_slice(&c.to_be_bytes());
        if out.len() < 60 {
            out.resize(60, 0);
        }
        return Response::Echo;
    }
    if et == ETH_P_IPV6 {
        return respond6(frame, me, out);
    }
    Response::Sink
}

/// The IPv6 part of [`respond`]: only ICMPv6 directly after the fixed
/// header (no extension headers), with a valid checksum.
fn respond6(frame: &[u8], me: &Me, out: &mut Vec<u8>) -> Response {
    let Some(ip) = frame.get(14..54) else {
        return Response::Sink;
    };
    let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let Some(icmp) = frame.get(54..54 + plen) else {
        return Response::Sink;
    };
    if ip[0] >> 4 != 6 || ip[6] != IPPROTO_ICMPV6 || icmp.len() < 8 {
        return Response::Sink;
    }
    let (src, dst) = (&ip[8..24], &ip[24..40]);
    if icmp6_checksum(src, dst, icmp) != 0 {
        return Response::Sink;
    }
    let mine = me.ip6.octets();
    match icmp[0] {
        // RFC 4861 7.1.1: hop limit 255, code 0, 24+ bytes, target is ours.
        ICMP6_NEIGHBOR_SOLICIT
            if ip[7] == 255 && icmp[1] == 0 && icmp.len() >= 24 && icmp[8..24] == mine =>
        {
            // To the soliciting address, or all nodes when it was unspecified (DAD).
            let to: [u8; 16] = if src.iter().all(|&b| b == 0) {
                Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets()
            } else {
                src.try_into().unwrap_or([0; 16])
            };
            let dst_mac: [u8; 6] = if src.iter().all(|&b| b == 0) {
                [0x33, 0x33, 0, 0, 0, 1]
            } else {
                frame[6..12].try_into().unwrap_or([0; 6])
            };
            out.clear();
            out.resize(14 + 40 + 32, 0);
            out[0..6].copy_from_slice(&dst_mac);
            out[6..12].copy_from_slice(&me.mac);
            out[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
            let o = &mut out[14..];
            o[0] = 0x60;
            o[4..6].copy_from_slice(&32u16.to_be_bytes());
            o[6] = IPPROTO_ICMPV6;
            o[7] = 255;
            o[8..24].copy_from_slice(&mine);
            o[24..40].copy_from_slice(&to);
            let na = &mut o[40..72];
            na[0] = ICMP6_NEIGHBOR_ADVERT;
            // Solicited (unless answering DAD) and Override.
            na[4] = if src.iter().all(|&b| b == 0) {
                0x20
            } else {
                0x60
            };
            na[8..24].copy_from_slice(&mine);
            // Target link-layer address option.
            na[24] = 2;
            na[25] = 1;
            na[26..32].copy_from_slice(&me.mac);
            let c = icmp6_checksum(&mine, &to, na);
            na[2..4].copy_from_slice(&c.to_be_bytes());
            Response::Neighbor
        }
        ICMP6_ECHO_REQUEST if icmp[1] == 0 && dst == mine => {
            if frame[0..6] != me.mac && frame[0] & 1 == 0 {
                return Response::Sink;
            }
            out.clear();
            out.extend_from_slice(&frame[..54 + plen]);
            out[0..6].copy_from_slice(&frame[6..12]);
            out[6..12].copy_from_slice(&me.mac);
            let o = &mut out[14..];
            o[7] = 64;
            o[8..24].copy_from_slice(&mine);
            o[24..40].copy_from_slice(src);
            let (hdr, body) = o.split_at_mut(40);
            body[0] = ICMP6_ECHO_REPLY;
            body[2..4].fill(0);
            let c = icmp6_checksum(&hdr[8..24], &hdr[24..40], body);
            body[2..4].copy_from_slice(&c.to_be_bytes());
            if out.len() < 60 {
                out.resize(60, 0);
            }
            Response::Echo
        }
        _ => Response::Sink,
    }
}

pub(crate) fn mac_to_u64(m: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[2..].copy_from_slice(&m);
    u64::from_be_bytes(b)
}

pub(crate) fn mac_from_u64(v: u64) -> [u8; 6] {
    let b = v.to_be_bytes();
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[2..]);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 1);
    const GUEST6: Ipv6Addr = Ipv6Addr::new(0xfd00, 2, 0, 0, 0, 0, 0, 0x15);

    fn respond(frame: &[u8], ip: Ipv4Addr, mac: [u8; 6], out: &mut Vec<u8>) -> Response {
        super::respond(frame, &Me { ip, ip6: ME6, mac }, out)
    }

    /// An IPv6/ICMPv6 frame from the guest with a valid checksum.
    fn icmp6_frame(
        dst_mac: [u8; 6],
        src: Ipv6Addr,
        dst: Ipv6Addr,
        hop: u8,
        body: &[u8],
    ) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[0..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
        f[14] = 0x60;
        f[18..20].copy_from_slice(&(body.len() as u16).to_be_bytes());
        f[20] = IPPROTO_ICMPV6;
        f[21] = hop;
        f[22..38].copy_from_slice(&src.octets());
        f[38..54].copy_from_slice(&dst.octets());
        let mut b = body.to_vec();
        b[2..4].fill(0);
        let c = icmp6_checksum(&src.octets(), &dst.octets(), &b);
        b[2..4].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&b);
        f
    }

    #[test]
    fn neighbour_solicitation_and_icmpv6_echo() {
        let mac = [2, 0, 0, 0, 0, 9];
        let v4 = Ipv4Addr::new(10, 0, 2, 1);
        let mut out = Vec::new();
        // NS for our address from the guest (to the solicited-node group).
        let mut ns = vec![0u8; 32];
        ns[0] = ICMP6_NEIGHBOR_SOLICIT;
        ns[8..24].copy_from_slice(&ME6.octets());
        ns[24..32].copy_from_slice(&[1, 1, 2, 0, 0, 0, 0, 1]);
        let snm = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 1);
        let f = icmp6_frame([0x33, 0x33, 0xff, 0, 0, 1], GUEST6, snm, 255, &ns);
        assert_eq!(respond(&f, v4, mac, &mut out), Response::Neighbor);
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 0, 1], "to the soliciting MAC");
        assert_eq!(&out[6..12], &mac);
        assert_eq!(out[21], 255, "hop limit 255");
        assert_eq!(&out[22..38], &ME6.octets());
        assert_eq!(&out[38..54], &GUEST6.octets());
        let na = &out[54..];
        assert_eq!(na[0], ICMP6_NEIGHBOR_ADVERT);
        assert_eq!(na[4], 0x60, "solicited + override");
        assert_eq!(&na[8..24], &ME6.octets());
        assert_eq!(&na[24..32], &[2, 1, 2, 0, 0, 0, 0, 9]);
        assert_eq!(icmp6_checksum(&out[22..38], &out[38..54], na), 0);
        // Not for us, a forwarded one (hop limit < 255), a bad checksum: sunk.
        let mut other = ns.clone();
        other[23] = 2;
        let f2 = icmp6_frame([0x33, 0x33, 0xff, 0, 0, 2], GUEST6, snm, 255, &other);
        assert_eq!(respond(&f2, v4, mac, &mut out), Response::Sink);
        let f3 = icmp6_frame([0x33, 0x33, 0xff, 0, 0, 1], GUEST6, snm, 64, &ns);
        assert_eq!(respond(&f3, v4, mac, &mut out), Response::Sink);
        let mut f4 = f.clone();
        f4[60] ^= 1;
        assert_eq!(respond(&f4, v4, mac, &mut out), Response::Sink);
        // Truncated frames never panic.
        for n in 0..f.len() {
            let _ = respond(&f[..n], v4, mac, &mut out);
        }

        // Echo request -> reply with swapped addresses and a valid checksum.
        let mut echo = vec![0u8; 8 + 16];
        echo[0] = ICMP6_ECHO_REQUEST;
        echo[4..8].copy_from_slice(&[0, 7, 0, 1]);
        let f = icmp6_frame(mac, GUEST6, ME6, 64, &echo);
        assert_eq!(respond(&f, v4, mac, &mut out), Response::Echo);
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&out[22..38], &ME6.octets());
        assert_eq!(&out[38..54], &GUEST6.octets());
        assert_eq!(out[54], ICMP6_ECHO_REPLY);
        assert_eq!(&out[58..62], &[0, 7, 0, 1]);
        assert_eq!(icmp6_checksum(&out[22..38], &out[38..54], &out[54..]), 0);
        // Echo to another address: sunk.
        let f = icmp6_frame(mac, GUEST6, GUEST6, 64, &echo);
        assert_eq!(respond(&f, v4, mac, &mut out), Response::Sink);
        for n in 0..f.len() {
            let _ = respond(&f[..n], v4, mac, &mut out);
        }
    }

    #[test]
    fn arp_and_ping() {
        let me = Ipv4Addr::new(10, 0, 2, 1);
        let guest_ip = Ipv4Addr::new(10, 0, 2, 15);
        let mac = [2, 0, 0, 0, 0, 9];
        let guest_mac = [2, 0, 0, 0, 0, 1];
        let mut arp = vec![0u8; 42];
        arp[0..6].copy_from_slice(&[0xff; 6]);
        arp[6..12].copy_from_slice(&guest_mac);
        arp[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
        arp[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        arp[22..28].copy_from_slice(&guest_mac);
        arp[28..32].copy_from_slice(&guest_ip.octets());
        arp[38..42].copy_from_slice(&me.octets());
        let mut out = Vec::new();
        assert_eq!(respond(&arp, me, mac, &mut out), Response::Arp);
        assert_eq!(&out[0..6], &guest_mac);
        assert_eq!(&out[22..28], &mac);
        assert_eq!(&out[28..32], &me.octets());
        // ICMP echo request
        let mut f = vec![0u8; 14 + 20 + 16];
        f[0..6].copy_from_slice(&mac);
        f[6..12].copy_from_slice(&guest_mac);
        f[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&36u16.to_be_bytes());
        f[22] = 64;
        f[23] = 1;
        f[26..30].copy_from_slice(&guest_ip.octets());
        f[30..34].copy_from_slice(&me.octets());
        f[34] = 8;
        f[38..42].copy_from_slice(&[0, 7, 0, 1]);
        let c = checksum(&[&f[34..50]], 0);
        f[36..38].copy_from_slice(&c.to_be_bytes());
        assert_eq!(respond(&f, me, mac, &mut out), Response::Echo);
        assert_eq!(out[34], 0);
        assert_eq!(&out[30..34], &guest_ip.octets());
        assert_eq!(checksum(&[&out[14..34]], 0), 0);
        assert_eq!(checksum(&[&out[34..50]], 0), 0);
        // Not for me: sunk.
        f[33] = 99;
        assert_eq!(respond(&f, me, mac, &mut out), Response::Sink);
    }
}
