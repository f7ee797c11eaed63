//! What a generator datagram carries, checked in the guest: every frame of
//! vnic's gen peer has, at the start of its UDP payload (after the 16-byte
//! send stamp of a stamped set, which starts with `vnic-rtt`), a head of
//! four u64 big endian: its flow's sequence number, a tag derived from
//! (flow, sequence number, send time, length), the send time (the daemon's
//! clock, the one its trace uses) and the length of the whole UDP payload;
//! then a fixed fill ([`fill_byte`]) up to its end. The daemon's side is
//! `vnic/src/peer/flows.rs` (`seq_tag`, `fill_byte`): the two must agree,
//! and the device test `generator_frames_carry_seq_and_pattern` checks the
//! daemon's frames with [`verify`].
//!
//! [`SeqTrack`] accounts one flow's datagrams from what they carry:
//! distinct, duplicated, reordered (with the send times of the last few
//! late datagrams and of what overtook them), corrupted (a wrong length
//! among them), and (from the gaps) lost. Everything here takes
//! guest-received bytes: it never panics on them.

use crate::proto::{Delivery, Late};

/// Bytes of the sequence head (sequence number, tag, send time, length).
pub const SEQ_LEN: usize = 32;
/// Bytes of the send stamp a stamped set puts before the head.
pub const STAMP_LEN: usize = 16;
/// What starts a send stamp.
pub const STAMP_MAGIC: &[u8; 8] = b"vnic-rtt";

/// The tag of sequence number `seq` of the flow `sport -> dport` (ports as
/// the generator sends them: `sport` is the generator's), sent at `sent`
/// with `len` bytes of UDP payload.
#[inline]
pub fn seq_tag(sport: u16, dport: u16, seq: u64, sent: u64, len: u64) -> u64 {
    // Each term a bijection of its field, xor'ed: for the others fixed,
    // another value of any one field never gives the same tag.
    (seq ^ ((u64::from(sport) << 48) | (u64::from(dport) << 32)))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ sent.wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(17)
        ^ len.wrapping_mul(0x94d0_49bb_1331_11eb).rotate_left(41)
}

/// Byte `k` of the UDP payload after the head.
#[inline]
pub fn fill_byte(k: usize) -> u8 {
    (k as u8).wrapping_mul(31).wrapping_add(0xa5)
}

/// What one datagram's payload says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Intact, with this sequence number and send time.
    Seq { seq: u64, sent: u64 },
    /// Too short to carry a head.
    Short,
    /// The tag or a fill byte is wrong.
    Corrupt,
    /// Head and fill intact, but the datagram is not as long as its head
    /// says (a corrupted datagram too).
    BadLen,
}

/// Checks a datagram's payload from the generator's port `sport` to the
/// receiver's port `dport`.
pub fn verify(payload: &[u8], sport: u16, dport: u16) -> Verdict {
    let at = if payload.len() >= STAMP_LEN && payload.starts_with(STAMP_MAGIC) {
        STAMP_LEN
    } else {
        0
    };
    let Some(head) = payload.get(at..at + SEQ_LEN) else {
        return Verdict::Short;
    };
    let word = |i: usize| {
        let mut s = [0u8; 8];
        s.copy_from_slice(&head[8 * i..8 * i + 8]);
        u64::from_be_bytes(s)
    };
    let (seq, tag, sent, len) = (word(0), word(1), word(2), word(3));
    if tag != seq_tag(sport, dport, seq, sent, len) {
        return Verdict::Corrupt;
    }
    let fill_ok = payload
        .iter()
        .enumerate()
        .skip(at + SEQ_LEN)
        .all(|(k, &b)| b == fill_byte(k));
    if !fill_ok {
        Verdict::Corrupt
    } else if len != payload.len() as u64 {
        Verdict::BadLen
    } else {
        Verdict::Seq { seq, sent }
    }
}

/// Byte `off` of the TCP test stream a client sends from port `port` (the
/// tcp-tap scenario's host client writes it, the agent's TCP server checks
/// every byte it reads). Not periodic: a segment lost, repeated or put at
/// another offset leaves bytes that do not match (each with probability
/// 255/256).
#[inline]
pub fn stream_byte(port: u16, off: u64) -> u8 {
    ((off ^ (u64::from(port) << 48)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// Bytes of `chunk`, read at stream offset `off` of the stream from client
/// port `port`, that differ from [`stream_byte`]: the count and the stream
/// offset of the first.
pub fn stream_mismatches(port: u16, off: u64, chunk: &[u8]) -> (u64, Option<u64>) {
    let mut n = 0;
    let mut first = None;
    for (k, &b) in chunk.iter().enumerate() {
        let at = off + k as u64;
        if b != stream_byte(port, at) {
            n += 1;
            first.get_or_insert(at);
        }
    }
    (n, first)
}

/// Sequence numbers remembered below the highest one (to tell a late
/// datagram from a duplicate).
const WINDOW: u64 = 4096;

/// Late datagrams remembered per flow (the last ones), with what overtook
/// them (`crate::proto::Late`).
pub const LATE_LOG: usize = 16;

/// One flow's accounting by sequence number: the counts the agent reports
/// ([`Delivery`]), the last late datagrams, and the window of sequence
/// numbers seen.
#[derive(Debug, Clone)]
pub struct SeqTrack {
    /// `next` is the highest sequence number seen + 1 (0: none yet); a
    /// datagram with a sequence number too far below it to tell is counted
    /// as duplicated.
    pub counts: Delivery,
    /// The last [`LATE_LOG`] late datagrams, oldest first.
    pub late: std::collections::VecDeque<Late>,
    /// The send time of the datagram with the highest sequence number.
    hi_sent: u64,
    seen: Box<[u64; (WINDOW / 64) as usize]>,
}

impl Default for SeqTrack {
    fn default() -> Self {
        Self {
            counts: Delivery::default(),
            late: std::collections::VecDeque::with_capacity(LATE_LOG),
            hi_sent: 0,
            seen: Box::new([0; (WINDOW / 64) as usize]),
        }
    }
}

impl SeqTrack {
    fn bit(&mut self, seq: u64) -> (&mut u64, u64) {
        let i = seq % WINDOW;
        (&mut self.seen[(i / 64) as usize], 1u64 << (i % 64))
    }

    /// Accounts one datagram; true when it was late (a new entry in
    /// [`SeqTrack::late`]).
    pub fn record(&mut self, v: Verdict) -> bool {
        let (seq, sent) = match v {
            Verdict::Seq { seq, sent } => (seq, sent),
            Verdict::Short => {
                self.counts.short += 1;
                return false;
            }
            Verdict::Corrupt => {
                self.counts.corrupted += 1;
                return false;
            }
            Verdict::BadLen => {
                self.counts.corrupted += 1;
                self.counts.bad_len += 1;
                return false;
            }
        };
        if seq >= self.counts.next {
            // Forget what falls out of the window as it moves up.
            // (At most WINDOW - 1 of them.)
            let from = self.counts.next.max(seq.saturating_sub(WINDOW - 1));
            for s in from..seq {
                let (w, m) = self.bit(s);
                *w &= !m;
            }
            let (w, m) = self.bit(seq);
            *w |= m;
            self.counts.next = seq.saturating_add(1);
            self.counts.distinct += 1;
            self.hi_sent = sent;
        } else if self.counts.next - seq > WINDOW {
            self.counts.duplicated += 1;
        } else {
            let (w, m) = self.bit(seq);
            if *w & m != 0 {
                self.counts.duplicated += 1;
            } else {
                *w |= m;
                self.counts.distinct += 1;
                self.counts.reordered += 1;
                if self.late.len() == LATE_LOG {
                    self.late.pop_front();
                }
                self.late.push_back(Late {
                    seq,
                    sent,
                    over_seq: self.counts.next - 1,
                    over_sent: self.hi_sent,
                });
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(seq: u64, len: usize, stamp: bool) -> Vec<u8> {
        let at = if stamp { STAMP_LEN } else { 0 };
        let mut p: Vec<u8> = (0..len).map(fill_byte).collect();
        if stamp {
            p[..8].copy_from_slice(STAMP_MAGIC);
            p[8..16].copy_from_slice(&42u64.to_be_bytes());
        }
        let sent = seq.wrapping_add(100);
        let tag = seq_tag(10000, 20001, seq, sent, len as u64);
        p[at..at + 8].copy_from_slice(&seq.to_be_bytes());
        p[at + 8..at + 16].copy_from_slice(&tag.to_be_bytes());
        p[at + 16..at + 24].copy_from_slice(&sent.to_be_bytes());
        p[at + 24..at + 32].copy_from_slice(&(len as u64).to_be_bytes());
        p
    }

    /// A datagram cut short (or made longer) with its head and the fill
    /// before the cut intact is counted corrupted, as a wrong length.
    #[test]
    fn a_datagram_of_another_length_than_it_carries_is_caught() {
        for stamp in [false, true] {
            let p = payload(5, 86, stamp);
            assert_eq!(verify(&p, 10000, 20001), seq(5));
            for cut in [1, 16, 86 - SEQ_LEN - if stamp { STAMP_LEN } else { 0 }] {
                assert_eq!(
                    verify(&p[..86 - cut], 10000, 20001),
                    Verdict::BadLen,
                    "{cut}"
                );
            }
            let mut longer = p.clone();
            longer.push(fill_byte(86));
            assert_eq!(verify(&longer, 10000, 20001), Verdict::BadLen);
            // A head whose length was rewritten to match: the tag says no.
            let mut forged = p[..70].to_vec();
            let at = if stamp { STAMP_LEN } else { 0 };
            forged[at + 24..at + 32].copy_from_slice(&70u64.to_be_bytes());
            assert_eq!(verify(&forged, 10000, 20001), Verdict::Corrupt);
        }
        let mut t = SeqTrack::default();
        t.record(Verdict::BadLen);
        assert_eq!((t.counts.corrupted, t.counts.bad_len), (1, 1));
    }

    #[test]
    fn verify_finds_every_flipped_byte() {
        for stamp in [false, true] {
            let p = payload(77, 86, stamp);
            assert_eq!(verify(&p, 10000, 20001), seq(77));
            // Another flow's datagram does not pass as this one's.
            assert_eq!(verify(&p, 10000, 20002), Verdict::Corrupt);
            let from = if stamp { STAMP_LEN } else { 0 };
            for i in from..p.len() {
                let mut q = p.clone();
                q[i] ^= 0xff;
                assert_eq!(verify(&q, 10000, 20001), Verdict::Corrupt, "byte {i}");
            }
        }
        assert_eq!(verify(&[0; 15], 1, 2), Verdict::Short);
        for n in 0..40 {
            let _ = verify(&vec![0xa5; n], 1, 2);
        }
    }

    #[test]
    fn stream_pattern_catches_flips_losses_and_repeats() {
        let port = 53730;
        let stream: Vec<u8> = (0..4096).map(|o| stream_byte(port, o)).collect();
        assert_eq!(stream_mismatches(port, 0, &stream), (0, None));
        // Read in pieces at their offsets: still clean.
        assert_eq!(
            stream_mismatches(port, 1000, &stream[1000..1500]),
            (0, None)
        );
        // One flipped byte is found where it is.
        let mut bad = stream.clone();
        bad[777] ^= 0x01;
        assert_eq!(stream_mismatches(port, 0, &bad), (1, Some(777)));
        // A lost 128-byte segment shifts what follows: nearly every byte
        // after it mismatches.
        let lost = [&stream[..1024], &stream[1152..]].concat();
        let (n, first) = stream_mismatches(port, 0, &lost);
        assert!(
            n > 2900 && first.is_some_and(|f| (1024..1030).contains(&f)),
            "{n} {first:?}"
        );
        // A repeated segment likewise.
        let dup = [&stream[..1152], &stream[1024..]].concat();
        let (n, first) = stream_mismatches(port, 0, &dup);
        assert!(
            n > 3000 && first.is_some_and(|f| (1152..1160).contains(&f)),
            "{n} {first:?}"
        );
        // Another connection's stream does not pass as this one's.
        let other: Vec<u8> = (0..4096).map(|o| stream_byte(port + 1, o)).collect();
        assert!(stream_mismatches(port, 0, &other).0 > 4000);
    }

    fn seq(s: u64) -> Verdict {
        Verdict::Seq {
            seq: s,
            sent: s.wrapping_add(100),
        }
    }

    #[test]
    fn track_counts_loss_duplicates_and_reorders() {
        let mut t = SeqTrack::default();
        for s in [0, 1, 2, 4, 3, 3, 7, 6, 6] {
            t.record(seq(s));
        }
        // The late ones, with what had overtaken them.
        let late: Vec<(u64, u64, u64, u64)> = t
            .late
            .iter()
            .map(|l| (l.seq, l.sent, l.over_seq, l.over_sent))
            .collect();
        assert_eq!(late, vec![(3, 103, 4, 104), (6, 106, 7, 107)]);
        t.record(Verdict::Corrupt);
        t.record(Verdict::Short);
        assert_eq!(t.counts.next, 8);
        assert_eq!(t.counts.distinct, 7);
        assert_eq!(t.counts.duplicated, 2);
        assert_eq!(t.counts.reordered, 2);
        assert_eq!(t.counts.lost(), 1); // 5
        assert_eq!((t.counts.corrupted, t.counts.short), (1, 1));
        // Far ahead, then something far behind: a duplicate we cannot tell.
        t.record(seq(100_000));
        t.record(seq(3));
        assert_eq!(t.counts.duplicated, 3);
        t.record(seq(100_000 - 5));
        assert_eq!(t.counts.reordered, 3);
        t.record(seq(100_000 - 5));
        assert_eq!(t.counts.duplicated, 4);
        // A first datagram far from 0, and u64::MAX: no overflow.
        let mut u = SeqTrack::default();
        u.record(seq(1 << 40));
        assert_eq!((u.counts.distinct, u.counts.lost()), (1, 1 << 40));
        u.record(seq(u64::MAX));
        u.record(seq(u64::MAX - 1));
        // The log keeps the last LATE_LOG late datagrams.
        let mut v = SeqTrack::default();
        for k in 0..100u64 {
            v.record(seq(2 * k + 1));
            assert!(v.record(seq(2 * k)));
        }
        assert_eq!(v.late.len(), LATE_LOG);
        assert_eq!(v.late.back().map(|l| l.seq), Some(198));
        assert_eq!(v.counts.reordered, 100);
    }
}
