//! What a generator datagram carries, checked in the guest: every frame of
//! vnic's gen peer has, at the start of its UDP payload (after the 16-byte
//! send stamp of a stamped set, which starts with `vnic-rtt`), its flow's
//! sequence number and a tag derived from (flow, sequence number), both
//! u64 big endian, then a fixed fill ([`fill_byte`]) up to its end. The
//! daemon's side is `vnic/src/peer/flows.rs` (`seq_tag`, `fill_byte`): the
//! two must agree, and the device test `generator_frames_carry_seq_and_pattern`
//! checks the daemon's frames with [`verify`].
//!
//! [`SeqTrack`] accounts one flow's datagrams from what they carry:
//! distinct, duplicated, reordered, corrupted, and (from the gaps) lost.
//! Everything here takes guest-received bytes: it never panics on them.

/// Bytes of the sequence head (sequence number, tag).
use crate::proto::Delivery;

pub const SEQ_LEN: usize = 16;
/// Bytes of the send stamp a stamped set puts before the head.
pub const STAMP_LEN: usize = 16;
/// What starts a send stamp.
pub const STAMP_MAGIC: &[u8; 8] = b"vnic-rtt";

/// The tag of sequence number `seq` of the flow `sport -> dport` (ports as
/// the generator sends them: `sport` is the generator's).
#[inline]
pub fn seq_tag(sport: u16, dport: u16, seq: u64) -> u64 {
    // One multiply by an odd constant: a bijection, so another sequence
    // number (below 2^32) or another flow never gives the same tag.
    (seq ^ ((u64::from(sport) << 48) | (u64::from(dport) << 32)))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Byte `k` of the UDP payload after the head.
#[inline]
pub fn fill_byte(k: usize) -> u8 {
    (k as u8).wrapping_mul(31).wrapping_add(0xa5)
}

/// What one datagram's payload says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Intact, with this sequence number.
    Seq(u64),
    /// Too short to carry a head.
    Short,
    /// The tag or a fill byte is wrong.
    Corrupt,
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
    let mut s = [0u8; 8];
    s.copy_from_slice(&head[..8]);
    let seq = u64::from_be_bytes(s);
    s.copy_from_slice(&head[8..]);
    if u64::from_be_bytes(s) != seq_tag(sport, dport, seq) {
        return Verdict::Corrupt;
    }
    let fill_ok = payload
        .iter()
        .enumerate()
        .skip(at + SEQ_LEN)
        .all(|(k, &b)| b == fill_byte(k));
    if fill_ok {
        Verdict::Seq(seq)
    } else {
        Verdict::Corrupt
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

/// One flow's accounting by sequence number: the counts the agent reports
/// ([`Delivery`]) and the window of sequence numbers seen.
#[derive(Debug, Clone)]
pub struct SeqTrack {
    /// `next` is the highest sequence number seen + 1 (0: none yet); a
    /// datagram with a sequence number too far below it to tell is counted
    /// as duplicated.
    pub counts: Delivery,
    seen: Box<[u64; (WINDOW / 64) as usize]>,
}

impl Default for SeqTrack {
    fn default() -> Self {
        Self {
            counts: Delivery::default(),
            seen: Box::new([0; (WINDOW / 64) as usize]),
        }
    }
}

impl SeqTrack {
    fn bit(&mut self, seq: u64) -> (&mut u64, u64) {
        let i = seq % WINDOW;
        (&mut self.seen[(i / 64) as usize], 1u64 << (i % 64))
    }

    /// Accounts one datagram.
    pub fn record(&mut self, v: Verdict) {
        let seq = match v {
            Verdict::Seq(s) => s,
            Verdict::Short => {
                self.counts.short += 1;
                return;
            }
            Verdict::Corrupt => {
                self.counts.corrupted += 1;
                return;
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
            }
        }
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
        p[at..at + 8].copy_from_slice(&seq.to_be_bytes());
        p[at + 8..at + 16].copy_from_slice(&seq_tag(10000, 20001, seq).to_be_bytes());
        p
    }

    #[test]
    fn verify_finds_every_flipped_byte() {
        for stamp in [false, true] {
            let p = payload(77, 86, stamp);
            assert_eq!(verify(&p, 10000, 20001), Verdict::Seq(77));
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

    #[test]
    fn track_counts_loss_duplicates_and_reorders() {
        let mut t = SeqTrack::default();
        for s in [0, 1, 2, 4, 3, 3, 7, 6, 6] {
            t.record(Verdict::Seq(s));
        }
        t.record(Verdict::Corrupt);
        t.record(Verdict::Short);
        assert_eq!(t.counts.next, 8);
        assert_eq!(t.counts.distinct, 7);
        assert_eq!(t.counts.duplicated, 2);
        assert_eq!(t.counts.reordered, 2);
        assert_eq!(t.counts.lost(), 1); // 5
        assert_eq!((t.counts.corrupted, t.counts.short), (1, 1));
        // Far ahead, then something far behind: a duplicate we cannot tell.
        t.record(Verdict::Seq(100_000));
        t.record(Verdict::Seq(3));
        assert_eq!(t.counts.duplicated, 3);
        t.record(Verdict::Seq(100_000 - 5));
        assert_eq!(t.counts.reordered, 3);
        t.record(Verdict::Seq(100_000 - 5));
        assert_eq!(t.counts.duplicated, 4);
        // A first datagram far from 0, and u64::MAX: no overflow.
        let mut u = SeqTrack::default();
        u.record(Verdict::Seq(1 << 40));
        assert_eq!((u.counts.distinct, u.counts.lost()), (1, 1 << 40));
        u.record(Verdict::Seq(u64::MAX));
        u.record(Verdict::Seq(u64::MAX - 1));
    }
}
