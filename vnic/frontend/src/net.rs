//! virtio-net RX/TX queues on top of [`SplitRing`], the 12-byte
//! `virtio_net_hdr_v1`, and small frame builders/parsers for tests.

use std::net::IpAddr;

use super::ring::{
    Desc, DeviceFault, SplitRing, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
};

/// Size of `virtio_net_hdr_v1` (VERSION_1 or MRG_RXBUF negotiated).
pub const NET_HDR_LEN: usize = 12;

/// `virtio_net_hdr_v1`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    pub num_buffers: u16,
}

impl NetHdr {
    pub fn to_bytes(self) -> [u8; NET_HDR_LEN] {
        let mut b = [0u8; NET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; NET_HDR_LEN]) -> Self {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        NetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
            num_buffers: u(10),
        }
    }
}

/// A frame received on an RX queue.
#[derive(Clone, Debug)]
pub struct RxFrame {
    pub hdr: NetHdr,
    /// The Ethernet frame, header stripped.
    pub data: Vec<u8>,
    /// Buffers the frame spans (1 without MRG_RXBUF).
    pub num_buffers: u16,
    /// used.len of each buffer, in order.
    pub used_lens: Vec<u32>,
}

/// The RX half of a queue pair.
#[derive(Debug)]
pub struct RxQueue {
    pub ring: SplitRing,
    mrg_rxbuf: bool,
    /// Length given to the device for each posted buffer (<= layout buf_len).
    post_len: u32,
    /// Used entries returned with fewer bytes than the virtio-net header.
    pub short_used: u64,
}

impl RxQueue {
    pub fn new(ring: SplitRing, mrg_rxbuf: bool) -> Self {
        let post_len = ring.layout().buf_len;
        RxQueue {
            ring,
            mrg_rxbuf,
            post_len,
            short_used: 0,
        }
    }

    /// Post buffers of `len` bytes from now on (MRG_RXBUF tests use small
    /// buffers so one frame spans several).
    pub fn set_post_len(&mut self, len: u32) {
        assert!(len <= self.ring.layout().buf_len);
        self.post_len = len;
    }

    /// Post up to `n` empty buffers (not yet published). Returns how many.
    pub fn post(&mut self, n: usize) -> usize {
        let mut k = 0;
        while k < n {
            let Some(slot) = self.ring.alloc() else { break };
            self.ring.write_desc(
                slot,
                Desc {
                    addr: self.ring.layout().buf(slot),
                    len: self.post_len,
                    flags: VIRTQ_DESC_F_WRITE,
                    next: 0,
                },
            );
            self.ring.push_single(slot, self.post_len);
            k += 1;
        }
        k
    }

    /// Post every free buffer, publish, kick if the device wants it.
    pub fn fill(&mut self) -> usize {
        let n = self.post(usize::MAX);
        if n > 0 {
            self.ring.notify();
        }
        n
    }

    /// Number of buffers of the next pending frame, if its header is visible.
    /// Used entries shorter than the virtio-net header (buffers the device
    /// gave back unused, e.g. after rejecting a broken chain) are consumed
    /// and counted in `short_used` first.
    fn next_frame_buffers(&mut self) -> Result<Option<u16>, DeviceFault> {
        loop {
            if self.ring.pending_used() == 0 {
                return Ok(None);
            }
            let e = self.ring.peek_used(0);
            if e.len < NET_HDR_LEN as u32 {
                self.ring.consume_used()?;
                self.short_used += 1;
                continue;
            }
            if !self.mrg_rxbuf || e.id >= u32::from(self.ring.size()) {
                return Ok(Some(1)); // consume_used reports a bad id
            }
            let a = self.ring.layout().buf(e.id as u16) + 10;
            let n = self.ring.mem().read_u16(a);
            if n == 0 || n > self.ring.size() {
                return Err(DeviceFault::BadNumBuffers {
                    queue: self.ring.index(),
                    num_buffers: n,
                });
            }
            return Ok(Some(n));
        }
    }

    /// Take the next complete frame off the used ring, if one is there.
    pub fn recv(&mut self) -> Result<Option<RxFrame>, DeviceFault> {
        let Some(nbuf) = self.next_frame_buffers()? else {
            return Ok(None);
        };
        if self.ring.pending_used() < nbuf {
            return Ok(None); // the device has not published all its buffers yet
        }
        let mut data = Vec::new();
        let mut used_lens = Vec::with_capacity(nbuf as usize);
        let mut hdr = NetHdr::default();
        for i in 0..nbuf {
            let e = self.ring.consume_used()?;
            let buf = self.ring.layout().buf(e.id as u16);
            let mut bytes = vec![0u8; e.len as usize];
            self.ring.mem().read(buf, &mut bytes);
            if i == 0 {
                if bytes.len() < NET_HDR_LEN {
                    return Err(DeviceFault::UsedLenTooBig {
                        queue: self.ring.index(),
                        id: e.id,
                        len: e.len,
                        cap: NET_HDR_LEN as u32,
                    });
                }
                let mut h = [0u8; NET_HDR_LEN];
                h.copy_from_slice(&bytes[..NET_HDR_LEN]);
                hdr = NetHdr::from_bytes(&h);
                data.extend_from_slice(&bytes[NET_HDR_LEN..]);
            } else {
                data.extend_from_slice(&bytes);
            }
            used_lens.push(e.len);
        }
        Ok(Some(RxFrame {
            hdr,
            data,
            num_buffers: nbuf,
            used_lens,
        }))
    }

    /// Benchmark fast path: consume the next frame without copying it.
    /// Returns (frame bytes without header, buffers).
    pub fn recv_discard(&mut self) -> Result<Option<(u32, u16)>, DeviceFault> {
        let Some(nbuf) = self.next_frame_buffers()? else {
            return Ok(None);
        };
        if self.ring.pending_used() < nbuf {
            return Ok(None);
        }
        let mut bytes = 0u32;
        for _ in 0..nbuf {
            bytes += self.ring.consume_used()?.len;
        }
        Ok(Some((bytes.saturating_sub(NET_HDR_LEN as u32), nbuf)))
    }
}

/// How a TX frame is laid out in descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxLayout {
    /// Header and frame in one descriptor.
    Single,
    /// Header in one descriptor, frame in a second.
    SplitHeader,
    /// One indirect descriptor whose table holds header and frame.
    Indirect,
}

/// The TX half of a queue pair.
#[derive(Debug)]
pub struct TxQueue {
    pub ring: SplitRing,
    /// Frames the device completed.
    pub completed: u64,
}

impl TxQueue {
    pub fn new(ring: SplitRing) -> Self {
        TxQueue { ring, completed: 0 }
    }

    /// Largest frame (without virtio header) one slot's buffer holds.
    pub fn max_frame(&self) -> usize {
        self.ring.layout().buf_len as usize - NET_HDR_LEN
    }

    /// Queue `frame` (not yet published). Returns the head, or None when the
    /// ring is full.
    pub fn push(&mut self, frame: &[u8], layout: TxLayout) -> Option<u16> {
        assert!(
            frame.len() <= self.max_frame(),
            "frame larger than a tx buffer"
        );
        let need = if layout == TxLayout::SplitHeader {
            2
        } else {
            1
        };
        if self.ring.free_slots() < need {
            return None;
        }
        let s = self.ring.alloc()?;
        let buf = self.ring.layout().buf(s);
        let mem = self.ring.mem().clone();
        mem.write(buf, &NetHdr::default().to_bytes());
        mem.write(buf + NET_HDR_LEN as u64, frame);
        let total = (NET_HDR_LEN + frame.len()) as u32;
        match layout {
            TxLayout::Single => {
                self.ring.write_desc(
                    s,
                    Desc {
                        addr: buf,
                        len: total,
                        flags: 0,
                        next: 0,
                    },
                );
                self.ring.push_single(s, 0);
            }
            TxLayout::SplitHeader => {
                let t = self.ring.alloc().expect("checked");
                self.ring.write_desc(
                    s,
                    Desc {
                        addr: buf,
                        len: NET_HDR_LEN as u32,
                        flags: VIRTQ_DESC_F_NEXT,
                        next: t,
                    },
                );
                self.ring.write_desc(
                    t,
                    Desc {
                        addr: buf + NET_HDR_LEN as u64,
                        len: frame.len() as u32,
                        flags: 0,
                        next: 0,
                    },
                );
                self.ring.push_chain(&[s, t], 0);
            }
            TxLayout::Indirect => {
                let table = self.ring.layout().indirect_table(s);
                self.ring.write_indirect(
                    table,
                    0,
                    Desc {
                        addr: buf,
                        len: NET_HDR_LEN as u32,
                        flags: VIRTQ_DESC_F_NEXT,
                        next: 1,
                    },
                );
                self.ring.write_indirect(
                    table,
                    1,
                    Desc {
                        addr: buf + NET_HDR_LEN as u64,
                        len: frame.len() as u32,
                        flags: 0,
                        next: 0,
                    },
                );
                self.ring.write_desc(
                    s,
                    Desc {
                        addr: table,
                        len: 32,
                        flags: VIRTQ_DESC_F_INDIRECT,
                        next: 0,
                    },
                );
                self.ring.push_single(s, 0);
            }
        }
        Some(s)
    }

    /// Queue, publish and kick one frame (single descriptor).
    pub fn send(&mut self, frame: &[u8]) -> Option<u16> {
        let h = self.push(frame, TxLayout::Single)?;
        self.ring.notify();
        Some(h)
    }

    /// Write `frame` (with a zero header) into every slot's buffer once, so
    /// the benchmark can send with [`TxQueue::push_prebuilt`].
    pub fn prebuild(&mut self, frame: &[u8]) {
        let mem = self.ring.mem().clone();
        for s in 0..self.ring.size() {
            let buf = self.ring.layout().buf(s);
            mem.write(buf, &NetHdr::default().to_bytes());
            mem.write(buf + NET_HDR_LEN as u64, frame);
        }
    }

    /// Benchmark fast path: queue the frame prebuilt in the slot's buffer.
    pub fn push_prebuilt(&mut self, frame_len: usize) -> bool {
        let Some(s) = self.ring.alloc() else {
            return false;
        };
        let buf = self.ring.layout().buf(s);
        self.ring.write_desc(
            s,
            Desc {
                addr: buf,
                len: (NET_HDR_LEN + frame_len) as u32,
                flags: 0,
                next: 0,
            },
        );
        self.ring.push_single(s, 0);
        true
    }

    /// Consume every completion the device published. Returns how many.
    pub fn reap(&mut self) -> Result<usize, DeviceFault> {
        let n = self.ring.pending_used();
        for _ in 0..n {
            self.ring.consume_used()?;
        }
        self.completed += n as u64;
        Ok(n as usize)
    }
}

/// Parameters of a UDP (or TCP) test frame.
#[derive(Clone, Debug)]
pub struct FrameSpec {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    /// Total Ethernet frame length (without FCS); padded/filled to this.
    pub len: usize,
}

fn csum_fold(mut s: u32) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn csum_add(mut s: u32, b: &[u8]) -> u32 {
    let mut it = b.chunks_exact(2);
    for c in &mut it {
        s += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [x] = it.remainder() {
        s += (*x as u32) << 8;
    }
    s
}

/// Build an Ethernet/IPv4-or-IPv6/UDP-or-TCP frame of `spec.len` bytes.
pub fn build_frame(spec: &FrameSpec) -> Vec<u8> {
    let (l3len, ethertype) = match spec.src {
        IpAddr::V4(_) => (20usize, 0x0800u16),
        IpAddr::V6(_) => (40usize, 0x86DDu16),
    };
    let l4len = if spec.proto == 6 { 20 } else { 8 };
    let min = 14 + l3len + l4len;
    let len = spec.len.max(min).max(60);
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&spec.dst_mac);
    f[6..12].copy_from_slice(&spec.src_mac);
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let ip_payload = (len - 14 - l3len) as u16;
    match (spec.src, spec.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = &mut f[14..34];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(20 + ip_payload).to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = 64;
            ip[9] = spec.proto;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = csum_fold(csum_add(0, ip));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ip = &mut f[14..54];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&ip_payload.to_be_bytes());
            ip[6] = spec.proto;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
        }
        _ => panic!("mixed address families"),
    }
    let l4 = 14 + l3len;
    f[l4..l4 + 2].copy_from_slice(&spec.sport.to_be_bytes());
    f[l4 + 2..l4 + 4].copy_from_slice(&spec.dport.to_be_bytes());
    if spec.proto == 6 {
        f[l4 + 12] = 0x50; // data offset 5
        f[l4 + 13] = 0x10; // ACK
        f[l4 + 14..l4 + 16].copy_from_slice(&0xffffu16.to_be_bytes());
    } else {
        f[l4 + 4..l4 + 6].copy_from_slice(&ip_payload.to_be_bytes());
    }
    for (i, b) in f[l4 + l4len..].iter_mut().enumerate() {
        *b = i as u8;
    }
    f
}

/// The flow of a received frame, as the guest would dissect it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParsedFlow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// Parse Ethernet/IPv4|IPv6/TCP|UDP (no VLAN, no IPv6 extension headers,
/// IPv4 fragments have ports 0). None for anything else.
pub fn parse_flow(f: &[u8]) -> Option<ParsedFlow> {
    if f.len() < 14 {
        return None;
    }
    let et = u16::from_be_bytes([f[12], f[13]]);
    let (src, dst, proto, l4, frag) = match et {
        0x0800 => {
            let ip = f.get(14..34)?;
            let ihl = (ip[0] & 0xf) as usize * 4;
            let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
            let s: [u8; 4] = ip[12..16].try_into().ok()?;
            let d: [u8; 4] = ip[16..20].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), ip[9], 14 + ihl, frag)
        }
        0x86DD => {
            let ip = f.get(14..54)?;
            let s: [u8; 16] = ip[8..24].try_into().ok()?;
            let d: [u8; 16] = ip[24..40].try_into().ok()?;
            (IpAddr::from(s), IpAddr::from(d), ip[6], 54, false)
        }
        _ => return None,
    };
    let (sport, dport) = if frag || !(proto == 6 || proto == 17) {
        (0, 0)
    } else {
        let p = f.get(l4..l4 + 4)?;
        (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        )
    };
    Some(ParsedFlow {
        src,
        dst,
        proto,
        sport,
        dport,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_hdr_roundtrip_little_endian() {
        let h = NetHdr {
            flags: 1,
            gso_type: 3,
            hdr_len: 0x1234,
            gso_size: 0x5678,
            csum_start: 14,
            csum_offset: 16,
            num_buffers: 0x0102,
        };
        let b = h.to_bytes();
        assert_eq!(b[10..12], [0x02, 0x01]);
        assert_eq!(NetHdr::from_bytes(&b), h);
    }

    #[test]
    fn built_frames_parse_back_with_valid_ipv4_checksum() {
        for (src, dst, proto) in [
            ("10.0.2.1", "10.0.2.15", 17u8),
            ("10.0.2.1", "10.0.2.15", 6),
            ("fd00::1", "fd00::15", 17),
        ] {
            let spec = FrameSpec {
                src_mac: [2, 0, 0, 0, 0, 1],
                dst_mac: [2, 0, 0, 0, 0, 2],
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                proto,
                sport: 1234,
                dport: 80,
                len: 100,
            };
            let f = build_frame(&spec);
            assert_eq!(f.len(), 100);
            let p = parse_flow(&f).unwrap();
            assert_eq!(
                (p.src, p.dst, p.proto, p.sport, p.dport),
                (spec.src, spec.dst, proto, 1234, 80)
            );
            if f[12..14] == [0x08, 0x00] {
                assert_eq!(
                    csum_fold(csum_add(0, &f[14..34])),
                    0,
                    "IPv4 header checksum"
                );
            }
        }
    }

    #[test]
    fn short_and_non_ip_frames_do_not_parse() {
        assert!(parse_flow(&[0u8; 10]).is_none());
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(parse_flow(&arp).is_none());
    }
}
