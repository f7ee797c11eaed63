//! Which NAPI instance serves which rx queue, from the kernel's `netdev`
//! generic netlink family: the guest's own key to SO_INCOMING_NAPI_ID.
//!
//! - `QUEUE_GET` (dump, by ifindex) names the NAPI of each rx queue on
//!   kernels whose driver registers it (`netif_queue_set_napi`; virtio_net
//!   does since 6.13). Exact.
//! - Older kernels (6.12's virtio_net registers nothing): `NAPI_GET` lists
//!   the netdev's NAPI ids, and virtio_net's rx NAPIs got theirs in queue
//!   order: `virtnet_alloc_queues` adds rq 0, 1, ... one after the other
//!   and, before 6.13, `netif_napi_add` assigned each the next id (tx NAPIs
//!   get none). So rx queue i has the i-th smallest id. Reported with
//!   `source: "napi-order"` so the caller knows which rule applied.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use vnic_agent::proto::RxQueueNapi;

const NETLINK_GENERIC: i32 = 16;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const NETDEV_CMD_QUEUE_GET: u8 = 10;
const NETDEV_CMD_NAPI_GET: u8 = 11;
const NETDEV_A_QUEUE_ID: u16 = 1;
const NETDEV_A_QUEUE_IFINDEX: u16 = 2;
const NETDEV_A_QUEUE_TYPE: u16 = 3;
const NETDEV_A_QUEUE_NAPI_ID: u16 = 4;
const NETDEV_QUEUE_TYPE_RX: u32 = 0;
const NETDEV_A_NAPI_IFINDEX: u16 = 1;
const NETDEV_A_NAPI_ID: u16 = 2;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_F_MASK: u16 = 0x3fff;

struct Genl {
    fd: OwnedFd,
    seq: u32,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn put_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(align4(buf.len()), 0);
}

/// The attributes of one message payload: (type, data).
fn attrs(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut v = Vec::new();
    while b.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_F_MASK;
        if len < 4 || len > b.len() {
            break;
        }
        v.push((ty, &b[4..len]));
        b = &b[align4(len).min(b.len())..];
    }
    v
}

fn u32_of(d: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(d.get(..4)?.try_into().ok()?))
}

impl Genl {
    fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: setsockopt with a timeval that lives across the call.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        Ok(Self { fd, seq: 1 })
    }

    /// Sends one request and collects the payloads (after the genl header)
    /// of every reply message until DONE (dump) or the ACK.
    fn request(
        &mut self,
        family: u16,
        cmd: u8,
        flags: u16,
        attrs: &[u8],
    ) -> io::Result<Vec<Vec<u8>>> {
        self.seq += 1;
        let seq = self.seq;
        let mut m = Vec::with_capacity(20 + attrs.len());
        m.extend_from_slice(&((20 + attrs.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&family.to_ne_bytes());
        m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | flags).to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[cmd, 1, 0, 0]);
        m.extend_from_slice(attrs);
        // SAFETY: send(2) of a buffer that lives across the call.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: recv(2) into a buffer we own, at most its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut b = &buf[..n as usize];
            while b.len() >= 16 {
                let len = u32::from_ne_bytes(b[0..4].try_into().unwrap_or_default()) as usize;
                let ty = u16::from_ne_bytes([b[4], b[5]]);
                let mseq = u32::from_ne_bytes(b[8..12].try_into().unwrap_or_default());
                if len < 16 || len > b.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "short netlink message",
                    ));
                }
                let body = &b[16..len];
                b = &b[align4(len).min(b.len())..];
                if mseq != seq {
                    continue;
                }
                match ty {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let err = i32::from_ne_bytes(
                            body.get(..4)
                                .and_then(|s| s.try_into().ok())
                                .unwrap_or([0; 4]),
                        );
                        if err == 0 {
                            // The ACK: the end of a non-dump request.
                            if flags & NLM_F_DUMP == 0 {
                                return Ok(out);
                            }
                            continue;
                        }
                        return Err(io::Error::from_raw_os_error(-err));
                    }
                    _ => out.push(body.get(4..).unwrap_or_default().to_vec()),
                }
            }
        }
    }

    fn family(&mut self, name: &str) -> io::Result<u16> {
        let mut a = Vec::new();
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        put_attr(&mut a, CTRL_ATTR_FAMILY_NAME, &n);
        for msg in self.request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 0, &a)? {
            for (ty, d) in attrs(&msg) {
                if ty == CTRL_ATTR_FAMILY_ID && d.len() >= 2 {
                    return Ok(u16::from_ne_bytes([d[0], d[1]]));
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no genetlink family {name}"),
        ))
    }
}

fn ifindex(ifname: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"))?;
    // SAFETY: if_nametoindex reads a NUL-terminated string that lives across the call.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// The NAPI id of each rx queue of `ifname` (index = queue).
pub fn rx_queue_napi(ifname: &str) -> io::Result<RxQueueNapi> {
    let idx = ifindex(ifname)?;
    let mut g = Genl::open()?;
    let fam = match g.family("netdev") {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return nr_cpus_order(ifname),
        Err(e) => return Err(e),
    };
    let mut a = Vec::new();
    put_attr(&mut a, NETDEV_A_QUEUE_IFINDEX, &idx.to_ne_bytes());
    let mut by_queue: Vec<(u32, Option<u32>)> = Vec::new();
    for msg in g.request(fam, NETDEV_CMD_QUEUE_GET, NLM_F_DUMP, &a)? {
        let (mut id, mut ty, mut napi, mut ifi) = (None, None, None, None);
        for (t, d) in attrs(&msg) {
            match t {
                NETDEV_A_QUEUE_ID => id = u32_of(d),
                NETDEV_A_QUEUE_TYPE => ty = u32_of(d),
                NETDEV_A_QUEUE_NAPI_ID => napi = u32_of(d),
                NETDEV_A_QUEUE_IFINDEX => ifi = u32_of(d),
                _ => {}
            }
        }
        if let (Some(id), Some(NETDEV_QUEUE_TYPE_RX)) = (id, ty) {
            if ifi.is_none_or(|i| i == idx) {
                by_queue.push((id, napi));
            }
        }
    }
    by_queue.sort_unstable();
    if !by_queue.is_empty() && by_queue.iter().all(|(_, n)| n.is_some()) {
        return Ok(RxQueueNapi {
            source: "queue-get".into(),
            napi: by_queue.iter().map(|(_, n)| n.unwrap_or(0)).collect(),
        });
    }
    let mut a = Vec::new();
    put_attr(&mut a, NETDEV_A_NAPI_IFINDEX, &idx.to_ne_bytes());
    let mut ids = Vec::new();
    for msg in g.request(fam, NETDEV_CMD_NAPI_GET, NLM_F_DUMP, &a)? {
        let (mut id, mut ifi) = (None, None);
        for (t, d) in attrs(&msg) {
            match t {
                NETDEV_A_NAPI_ID => id = u32_of(d),
                NETDEV_A_NAPI_IFINDEX => ifi = u32_of(d),
                _ => {}
            }
        }
        if let (Some(id), Some(i)) = (id, ifi) {
            if i == idx {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    if ids.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("the netdev netlink family names no NAPI of {ifname}"),
        ));
    }
    Ok(RxQueueNapi {
        source: "napi-order".into(),
        napi: ids,
    })
}

/// Kernels before 6.3 have no netdev netlink family. Their NAPI ids come
/// from one counter that starts at MIN_NAPI_ID = NR_CPUS + 1, and
/// virtio_net registers its rx NAPIs first and in queue order (its tx
/// NAPIs are NO_BUSY_POLL and get no id); with virtio_net the only NAPI
/// device of the guest, rx queue i has id NR_CPUS + 1 + i. NR_CPUS is
/// /sys/devices/system/cpu/kernel_max + 1. The suite's `link` checks this
/// rule on every run (each flow seen on the queue RSS predicts).
fn nr_cpus_order(ifname: &str) -> io::Result<RxQueueNapi> {
    let kmax: u32 = std::fs::read_to_string("/sys/devices/system/cpu/kernel_max")?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("kernel_max: {e}")))?;
    let rxq = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues"))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count() as u32;
    let first = kmax + 2;
    Ok(RxQueueNapi {
        source: "nr-cpus-order".into(),
        napi: (0..rxq.max(1)).map(|i| first + i).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_with_padding() {
        let mut b = Vec::new();
        put_attr(&mut b, NETDEV_A_QUEUE_ID, &3u32.to_ne_bytes());
        put_attr(&mut b, CTRL_ATTR_FAMILY_NAME, b"netdev\0");
        put_attr(
            &mut b,
            NETDEV_A_QUEUE_NAPI_ID | 0x8000,
            &8193u32.to_ne_bytes(),
        );
        assert_eq!(b.len() % 4, 0);
        let a = attrs(&b);
        assert_eq!(a.len(), 3);
        assert_eq!((a[0].0, u32_of(a[0].1)), (NETDEV_A_QUEUE_ID, Some(3)));
        assert_eq!((a[1].0, a[1].1), (CTRL_ATTR_FAMILY_NAME, &b"netdev\0"[..]));
        // Flag bits (nested, byte order) are not part of the type.
        assert_eq!(
            (a[2].0, u32_of(a[2].1)),
            (NETDEV_A_QUEUE_NAPI_ID, Some(8193))
        );
    }

    #[test]
    fn truncated_attributes_stop_the_walk() {
        let mut b = Vec::new();
        put_attr(&mut b, 1, &7u32.to_ne_bytes());
        b.extend_from_slice(&[40, 0, 2, 0, 1, 2]); // claims 40 bytes, has 6
        let a = attrs(&b);
        assert_eq!(a.len(), 1);
        assert_eq!(u32_of(&[1, 2]), None);
    }
}
