//! Round-trip times through the guest, for request/response workloads on
//! the generator.
//!
//! A flow set started with `"stamp": true` writes [`STAMP_LEN`] bytes
//! right after each frame's UDP header: [`MAGIC`] and the time the frame
//! was generated (nanoseconds on the daemon's monotonic clock). A guest
//! application that echoes the datagram back to the generator's address
//! gives the generator the round trip: device RX ring, guest interrupt and
//! softirq (RPS/RFS steering included), the application's wake-up and
//! reply, guest TX, device TX. [`RttHist`] collects them per daemon; `ctl
//! stats` shows it under `peer.rtt`.
//!
//! The guest controls what it sends: a stamp from the future or older
//! than [`MAX_RTT`] is counted as `bad` and not recorded.

use super::flows::{ETH_P_IP, ETH_P_IPV6};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Bytes of the stamp in the payload: magic, then the send time.
pub(crate) const STAMP_LEN: usize = 16;
/// What starts a stamped payload.
pub(crate) const MAGIC: [u8; 8] = *b"vnic-rtt";

#[cfg(test)]
/// Writes the stamp into `frame` (an Ethernet frame with `hdr_len` bytes
/// of headers built by `flows::build_udp` with a zero head of at least
/// [`STAMP_LEN`] bytes) and folds it into the UDP checksum. `frame` must
/// hold `hdr_len + STAMP_LEN` bytes (the flow set checked its size).
pub(crate) fn stamp(frame: &mut [u8], hdr_len: usize, now: u64) {
    let mut head = [0u8; STAMP_LEN];
    head[..8].copy_from_slice(&MAGIC);
    head[8..].copy_from_slice(&now.to_be_bytes());
    let Some(p) = frame.get_mut(hdr_len..hdr_len + STAMP_LEN) else {
        return;
    };
    p.copy_from_slice(&head);
    super::flows::fold_head(frame, hdr_len, &head);
}

/// The send time carried by `frame` when it is a UDP datagram to one of
/// the generator's addresses whose payload starts with [`MAGIC`] (IPv4 of
/// any header length, unfragmented; IPv6 with UDP right after the fixed
/// header).
pub(crate) fn echoed_stamp(frame: &[u8], ip: Ipv4Addr, ip6: Ipv6Addr) -> Option<u64> {
    let et = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let payload = if et == ETH_P_IP {
        let h = frame.get(14..34)?;
        let ihl = usize::from(h[0] & 0x0f) * 4;
        let frag = u16::from_be_bytes([h[6], h[7]]) & 0x3fff;
        if h[0] >> 4 != 4 || ihl < 20 || h[9] != 17 || frag != 0 || h[16..20] != ip.octets() {
            return None;
        }
        frame.get(14 + ihl + 8..)?
    } else if et == ETH_P_IPV6 {
        let h = frame.get(14..54)?;
        if h[0] >> 4 != 6 || h[6] != 17 || h[24..40] != ip6.octets() {
            return None;
        }
        frame.get(62..)?
    } else {
        return None;
    };
    let s = payload.get(..STAMP_LEN)?;
    if s[..8] != MAGIC {
        return None;
    }
    Some(u64::from_be_bytes(s[8..16].try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::udp_checksum_ok;
    use crate::peer::flows::{build_udp, Tuple};

    /// A stamped frame is found again in its echo (addresses swapped, as a
    /// guest's reply has them), over IPv4 and IPv6, and the UDP checksum
    /// still verifies after the stamp.
    #[test]
    fn stamp_round_trip_v4_and_v6() {
        let gen4 = Ipv4Addr::new(10, 0, 2, 1);
        let gen6: Ipv6Addr = "fd00:2::1".parse().unwrap();
        for (g, guest) in [
            (
                std::net::IpAddr::V4(gen4),
                "10.0.2.15".parse::<std::net::IpAddr>().unwrap(),
            ),
            (std::net::IpAddr::V6(gen6), "fd00:2::15".parse().unwrap()),
        ] {
            let t = Tuple {
                src: g,
                sport: 9,
                dst: guest,
                dport: 20000,
            };
            let mut f = [0u8; 128];
            let hl = build_udp(&mut f, [2; 6], [4; 6], &t, 128, STAMP_LEN);
            stamp(&mut f, hl, 123_456_789);
            // The guest's echo: same payload, addresses swapped.
            let echo_t = Tuple {
                src: guest,
                sport: 20000,
                dst: g,
                dport: 9,
            };
            let mut e = [0u8; 128];
            let ehl = build_udp(&mut e, [4; 6], [2; 6], &echo_t, 128, STAMP_LEN);
            e[ehl..].copy_from_slice(&f[hl..]);
            assert_eq!(echoed_stamp(&e, gen4, gen6), Some(123_456_789));
            // Not to us: ignored.
            assert_eq!(echoed_stamp(&f, gen4, gen6), None);
            assert!(udp_checksum_ok(&f), "UDP checksum after the stamp");
        }
        // Truncated or foreign frames: no stamp, no panic.
        for n in 0..80 {
            let _ = echoed_stamp(&[0x45; 80][..n], gen4, gen6);
        }
    }
}
