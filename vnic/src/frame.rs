//! Frame bytes: where an Ethernet frame's L4 segment and payload are (IPv4
//! without options, IPv6 with the L4 header after the fixed header,
//! unfragmented) and the Internet checksum. A leaf: the generator builds
//! frames with it, steering's fault knobs damage them with it. Nothing here
//! panics on any input.

pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_ARP: u16 = 0x0806;
pub(crate) const ETH_P_IPV6: u16 = 0x86DD;

/// The L4 protocol and the span of the L4 segment of an Ethernet frame
/// (IPv4 without options or IPv6 with the L4 header after the fixed
/// header, unfragmented): (protocol, start, end). `None` for anything else
/// or a length field past the frame (never panics on any input).
fn ip_l4(frame: &[u8]) -> Option<(u8, usize, usize)> {
    let et = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let (proto, l4, end) = if et == ETH_P_IP {
        let ip = frame.get(14..34)?;
        let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
        if ip[0] != 0x45 || frag != 0 {
            return None;
        }
        (
            ip[9],
            34,
            14 + usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        )
    } else if et == ETH_P_IPV6 {
        let ip = frame.get(14..54)?;
        if ip[0] >> 4 != 6 {
            return None;
        }
        (
            ip[6],
            54,
            54 + usize::from(u16::from_be_bytes([ip[4], ip[5]])),
        )
    } else {
        return None;
    };
    (l4 <= end && end <= frame.len()).then_some((proto, l4, end))
}

/// The UDP payload of an Ethernet frame (see [`ip_l4`]), with the offset
/// of its UDP header: `None` for anything else.
pub(crate) fn udp_payload(frame: &[u8]) -> Option<(usize, &[u8])> {
    let (proto, l4, end) = ip_l4(frame)?;
    if proto != 17 {
        return None;
    }
    let udp = &frame[l4..end];
    let ulen = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    if ulen < 8 || ulen > udp.len() {
        return None;
    }
    Some((l4, &udp[8..ulen]))
}

/// The TCP payload of an Ethernet frame (see [`ip_l4`]): the offset of its
/// TCP header, the header's length (data offset) and the payload. `None`
/// for anything else.
pub(crate) fn tcp_payload(frame: &[u8]) -> Option<(usize, usize, &[u8])> {
    let (proto, l4, end) = ip_l4(frame)?;
    if proto != 6 {
        return None;
    }
    let tcp = &frame[l4..end];
    let doff = usize::from(*tcp.get(12)? >> 4) * 4;
    if doff < 20 || doff > tcp.len() {
        return None;
    }
    Some((l4, doff, &tcp[doff..]))
}

#[cfg(test)]
/// Whether the UDP checksum of `frame` verifies (IPv4: 0 = none counts as
/// valid; IPv6: 0 is invalid). `false` for a frame [`udp_payload`] refuses.
pub(crate) fn udp_checksum_ok(frame: &[u8]) -> bool {
    let Some((l4, payload)) = udp_payload(frame) else {
        return false;
    };
    let ulen = 8 + payload.len();
    let udp = &frame[l4..l4 + ulen];
    let mut pseudo = [0u8; 40];
    let pl = if l4 == 34 {
        if udp[6..8] == [0, 0] {
            return true;
        }
        pseudo[..8].copy_from_slice(&frame[26..34]);
        pseudo[9] = 17;
        pseudo[10..12].copy_from_slice(&(ulen as u16).to_be_bytes());
        12
    } else {
        if udp[6..8] == [0, 0] {
            return false;
        }
        pseudo[..32].copy_from_slice(&frame[22..54]);
        pseudo[32..36].copy_from_slice(&(ulen as u32).to_be_bytes());
        pseudo[39] = 17;
        40
    };
    checksum(&[&pseudo[..pl], udp], 0) == 0
}

/// Internet checksum over the concatenation of `parts` (each even-length
/// except possibly the last), plus `init`.
pub(crate) fn checksum(parts: &[&[u8]], init: u32) -> u16 {
    let mut sum = u64::from(init);
    for p in parts {
        let mut ch = p.chunks_exact(2);
        for w in &mut ch {
            sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [b] = ch.remainder() {
            sum += u64::from(*b) << 8;
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
