//! The management fault knobs' frames (vnic/CTL.md): what a second station
//! (`rogue_responder`, `rogue_nonce`) and a forger (`forge_acks`) send, and
//! the replies the channel loses (`mgmt_loss_rate`, `drop_acks`); the
//! trace lines `wrong_trace` falsifies.

use arfs::proto::{self, Direction};
use arfs::{DropCause, TraceRecord};

use super::{Mgmt, Route};
use crate::virtq::NET_HDR_LEN;

/// Destination of the `forge_acks` knob's copy for another host.
pub(crate) const OTHER_HOST_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x0b, 0xad, 0x02];

/// Source of the `rogue_responder` knob's frames: a second station on the
/// link answering the driver's HELLO (locally administered, not
/// [`proto::DEVICE_MAC`]).
pub(crate) const ROGUE_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x0b, 0xad, 0x01];

impl Mgmt {
    /// The `forge_acks` knob's two forgeries for the ACK `pkt`, sent ahead
    /// of it: the last cached reply replayed, and `pkt` to another host,
    /// both from the device's address with the generation + 1.
    pub(super) fn forge(&mut self, route: Route, pkt: &[u8]) {
        let replay = self.cache.back().map(|(_, f)| f.clone());
        let mut other = pkt.to_vec();
        other[NET_HDR_LEN..NET_HDR_LEN + 6].copy_from_slice(&OTHER_HOST_MAC);
        for mut f in replay.into_iter().chain([other]) {
            if !bump_generation(&mut f) {
                continue;
            }
            self.c.forged_sent += 1;
            if let Some(c) = &self.conn {
                if let Some(r) = c.lanes.reply(route.worker, f, self.caller) {
                    self.own.push(r);
                }
            }
        }
    }

    /// The second responder's copy of the reply `pkt` (`rogue_responder`),
    /// sent ahead of it.
    pub(super) fn send_rogue(&mut self, route: Route, pkt: &[u8]) {
        let Some(fake) = rogue_copy(pkt, self.rogue_nonce) else {
            return;
        };
        self.c.rogue_sent += 1;
        if let Some(c) = &self.conn {
            if let Some(r) = c.lanes.reply(route.worker, fake, self.caller) {
                self.own.push(r);
            }
        }
    }

    /// `wrong_trace`: a `replace` line that moves a flow to another queue
    /// names the new queue as `prev_rxq` (counted in `mgmt.wrong_traced`).
    pub(super) fn falsify(&mut self, rec: &mut TraceRecord) {
        if self.wrong_trace && rec.prev_rxq.is_some() && rec.prev_rxq != rec.rxq {
            rec.prev_rxq = rec.rxq;
            self.c.wrong_traced += 1;
        }
    }

    /// A reply the channel loses (`mgmt_loss_rate`, `drop_acks`): counted
    /// and traced as a loss toward the driver.
    pub(super) fn lose(&mut self, now: u64, pkt: &[u8]) {
        self.c.replies_dropped_by_loss += 1;
        let h = proto::peek_header(&pkt[NET_HDR_LEN..]);
        self.tracer.emit(TraceRecord::mgmt_drop(
            now,
            self.generation(),
            Direction::ToDriver,
            h.map(|h| h.seq),
            h.map(|h| h.msg_type),
            DropCause::Loss,
        ));
    }
}

/// Adds one to the generation of the reply `f` (virtio-net header +
/// management frame); false when `f` is too short to carry one.
fn bump_generation(f: &mut [u8]) -> bool {
    const GEN: usize = NET_HDR_LEN + 14 + 8;
    match f.get_mut(GEN..GEN + 4) {
        Some(g) => {
            let v = u32::from_be_bytes([g[0], g[1], g[2], g[3]]).wrapping_add(1);
            g.copy_from_slice(&v.to_be_bytes());
            true
        }
        None => false,
    }
}

/// What a second responder on the link would send for the reply `pkt`
/// (virtio-net header + frame): the same frame from [`ROGUE_MAC`], and for a
/// CAPS one that did not see the HELLO (its nonce is wrong) unless
/// `saw_hello` (it echoes the nonce). `None` for a reply too short to be a
/// management frame.
pub(super) fn rogue_copy(pkt: &[u8], saw_hello: bool) -> Option<Vec<u8>> {
    const NONCE: usize = NET_HDR_LEN + proto::BODY_OFFSET + 20;
    let h = proto::peek_header(pkt.get(NET_HDR_LEN..)?)?;
    let mut f = pkt.to_vec();
    f.get_mut(NET_HDR_LEN + 6..NET_HDR_LEN + 12)?
        .copy_from_slice(&ROGUE_MAC);
    if h.kind() == Some(proto::MsgType::Caps) && !saw_hello {
        for b in f.get_mut(NONCE..NONCE + 4)? {
            *b ^= 0xa5;
        }
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use arfs::proto::{decode_frame_driver, Ack, Caps};
    use arfs::Message;

    use super::*;
    use crate::mgmt::encode_reply;

    const GUEST: [u8; 6] = [2, 0, 0, 0, 0, 0x15];

    #[test]
    fn rogue_copy_is_another_station_with_a_wrong_nonce() {
        let caps = Caps {
            max_queue_pairs: 4,
            enabled_queue_pairs: 4,
            capacity: 1024,
            buckets: 0,
            ways: 0,
            max_ops: 33,
            latency_us: 0,
            nonce: 0x1234_5678,
            ext: None,
        };
        let real = encode_reply(GUEST, 9, 2, &Message::Caps(caps)).unwrap();
        let fake = rogue_copy(&real, false).unwrap();
        assert_eq!(&fake[NET_HDR_LEN + 6..NET_HDR_LEN + 12], &ROGUE_MAC);
        let (h, m) = decode_frame_driver(&fake[NET_HDR_LEN..]).unwrap();
        assert_eq!(h.seq, 9);
        let Message::Caps(c) = m else {
            panic!("not a CAPS: {m:?}")
        };
        assert_ne!(c.nonce, caps.nonce);
        assert_eq!(
            Caps {
                nonce: caps.nonce,
                ..c
            },
            caps
        );
        // `rogue_nonce`: a station that saw the HELLO echoes its nonce;
        // only the source tells it from the device.
        let knowing = rogue_copy(&real, true).unwrap();
        assert_eq!(&knowing[NET_HDR_LEN + 6..NET_HDR_LEN + 12], &ROGUE_MAC);
        assert_eq!(&knowing[NET_HDR_LEN + 12..], &real[NET_HDR_LEN + 12..]);
        // An ACK keeps its body: only the source differs.
        let ack = Ack {
            acked_type: 3,
            frame_status: 0,
            statuses: vec![0],
        };
        let ack = encode_reply(GUEST, 10, 2, &Message::Ack(ack)).unwrap();
        let fake = rogue_copy(&ack, false).unwrap();
        assert_eq!(&fake[NET_HDR_LEN + 12..], &ack[NET_HDR_LEN + 12..]);
        assert!(rogue_copy(&ack[..NET_HDR_LEN + 10], false).is_none());
    }
}
