//! Kernel interfaces the agent uses directly: interface ioctls, ethtool
//! features, module syscalls, ICMP, /dev/kmsg, CPU affinity, power-off.
//! No netlink library, no NSS: everything here is a plain syscall.

use std::ffi::CString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};
use vnic_agent::proto::{Iface, Kmsg, PingResult};

const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFADDR: libc::c_ulong = 0x8916;
const SIOCSIFNETMASK: libc::c_ulong = 0x891c;
const SIOCETHTOOL: libc::c_ulong = 0x8946;

const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GLINK: u32 = 0x0000_000a;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETHTOOL_SFEATURES: u32 = 0x3b;
const ETH_SS_FEATURES: u32 = 4;
const ETH_GSTRING_LEN: usize = 32;

/// `struct ifreq` on x86_64: 16-byte name, 24-byte union (largest member
/// `struct ifmap`; pointer-aligned).
#[repr(C, align(8))]
struct IfReq {
    name: [u8; 16],
    data: [u8; 24],
}

impl IfReq {
    fn new(ifname: &str) -> io::Result<Self> {
        let b = ifname.as_bytes();
        if b.is_empty() || b.len() >= 16 || b.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad interface name",
            ));
        }
        let mut r = IfReq {
            name: [0; 16],
            data: [0; 24],
        };
        r.name[..b.len()].copy_from_slice(b);
        Ok(r)
    }

    fn set_sockaddr_in(&mut self, addr: Ipv4Addr) {
        // struct sockaddr_in: family (host order u16), port (be16), addr (4 bytes), zero[8]
        self.data = [0; 24];
        self.data[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        self.data[4..8].copy_from_slice(&addr.octets());
    }
}

fn inet_dgram_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call with constant arguments; the returned fd
    // is checked and then owned by OwnedFd.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ioctl_ifreq(fd: &OwnedFd, req: libc::c_ulong, ifr: &mut IfReq) -> io::Result<()> {
    // SAFETY: every request used with this helper takes a `struct ifreq *`;
    // IfReq has the kernel's layout and size (40 bytes), lives for the call,
    // and the kernel writes at most sizeof(struct ifreq) into it.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req, std::ptr::from_mut(ifr)) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Set IFF_UP on an interface.
pub fn link_up(ifname: &str) -> io::Result<()> {
    let fd = inet_dgram_socket()?;
    let mut ifr = IfReq::new(ifname)?;
    ioctl_ifreq(&fd, SIOCGIFFLAGS, &mut ifr)?;
    let flags = i16::from_ne_bytes([ifr.data[0], ifr.data[1]]) | libc::IFF_UP as i16;
    ifr.data[0..2].copy_from_slice(&flags.to_ne_bytes());
    ioctl_ifreq(&fd, SIOCSIFFLAGS, &mut ifr)
}

/// Set an IPv4 address and netmask (the kernel adds the prefix route).
pub fn set_ipv4(ifname: &str, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
    if prefix > 32 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "prefix > 32"));
    }
    let fd = inet_dgram_socket()?;
    let mut ifr = IfReq::new(ifname)?;
    ifr.set_sockaddr_in(addr);
    ioctl_ifreq(&fd, SIOCSIFADDR, &mut ifr)?;
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    ifr.set_sockaddr_in(Ipv4Addr::from(mask));
    ioctl_ifreq(&fd, SIOCSIFNETMASK, &mut ifr)
}

/// `struct in6_ifreq` (linux/ipv6.h).
#[repr(C)]
struct In6IfReq {
    addr: [u8; 16],
    prefixlen: u32,
    ifindex: libc::c_int,
}

/// Add an IPv6 address (the kernel adds the prefix route): SIOCSIFADDR on
/// an AF_INET6 socket with a `struct in6_ifreq`.
pub fn set_ipv6(ifname: &str, addr: Ipv6Addr, prefix: u8) -> io::Result<()> {
    if prefix > 128 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "prefix > 128"));
    }
    let name = CString::new(ifname)?;
    // SAFETY: a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    let req = In6IfReq {
        addr: addr.octets(),
        prefixlen: u32::from(prefix),
        ifindex: libc::c_int::try_from(index)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ifindex"))?,
    };
    // SAFETY: plain socket(2) call with constant arguments; checked below.
    let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh valid descriptor, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: SIOCSIFADDR on an AF_INET6 socket reads one struct in6_ifreq,
    // which `req` is (repr(C), the kernel's layout) for the whole call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), SIOCSIFADDR, &raw const req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// SIOCETHTOOL with a u32 buffer as `ifr_data`.
fn ethtool(ifname: &str, buf: &mut [u32]) -> io::Result<()> {
    let fd = inet_dgram_socket()?;
    let mut ifr = IfReq::new(ifname)?;
    let ptr = buf.as_mut_ptr() as usize as u64;
    ifr.data[0..8].copy_from_slice(&ptr.to_ne_bytes());
    ioctl_ifreq(&fd, SIOCETHTOOL, &mut ifr)
}

/// ETHTOOL_GLINK: whether the link is up (an ethtool ioctl: runs under RTNL).
pub fn link_detected(ifname: &str) -> io::Result<bool> {
    // struct ethtool_value { u32 cmd; u32 data; }
    let mut v = [ETHTOOL_GLINK, 0];
    ethtool(ifname, &mut v)?;
    Ok(v[1] != 0)
}

/// The feature strings of a device (ETH_SS_FEATURES), in bit order.
fn feature_names(ifname: &str) -> io::Result<Vec<String>> {
    // struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[1]; }
    let mut info = [0u32; 5];
    info[0] = ETHTOOL_GSSET_INFO;
    let mask = 1u64 << ETH_SS_FEATURES;
    info[2] = mask as u32;
    info[3] = (mask >> 32) as u32;
    ethtool(ifname, &mut info)?;
    let n = info[4] as usize;
    if n == 0 || n > 4096 {
        return Err(io::Error::other(format!("implausible feature count {n}")));
    }
    // struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[]; }
    let mut buf = vec![0u32; 3 + n * ETH_GSTRING_LEN / 4];
    buf[0] = ETHTOOL_GSTRINGS;
    buf[1] = ETH_SS_FEATURES;
    buf[2] = n as u32;
    ethtool(ifname, &mut buf)?;
    let bytes: Vec<u8> = buf[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(bytes
        .chunks(ETH_GSTRING_LEN)
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect())
}

/// Active state of feature bit `bit` (ETHTOOL_GFEATURES).
fn feature_active(ifname: &str, bit: usize, blocks: usize) -> io::Result<bool> {
    // struct ethtool_gfeatures { u32 cmd; u32 size; {available, requested, active, never_changed}[size] }
    let mut buf = vec![0u32; 2 + 4 * blocks];
    buf[0] = ETHTOOL_GFEATURES;
    buf[1] = blocks as u32;
    ethtool(ifname, &mut buf)?;
    let active = buf[2 + 4 * (bit / 32) + 2];
    Ok(active & (1 << (bit % 32)) != 0)
}

/// Turn a named feature on or off; returns its active state afterwards.
pub fn set_feature(ifname: &str, feature: &str, on: bool) -> io::Result<bool> {
    let names = feature_names(ifname)?;
    let bit = names.iter().position(|n| n == feature).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("no feature {feature:?}"))
    })?;
    let blocks = names.len().div_ceil(32);
    // struct ethtool_sfeatures { u32 cmd; u32 size; {valid, requested}[size] }
    let mut buf = vec![0u32; 2 + 2 * blocks];
    buf[0] = ETHTOOL_SFEATURES;
    buf[1] = blocks as u32;
    buf[2 + 2 * (bit / 32)] = 1 << (bit % 32);
    if on {
        buf[2 + 2 * (bit / 32) + 1] = 1 << (bit % 32);
    }
    // A positive return (ETHTOOL_F_WISH etc.) still succeeds; the active
    // state read back below is what counts.
    ethtool(ifname, &mut buf)?;
    feature_active(ifname, bit, blocks)
}

const ETHTOOL_GCHANNELS: u32 = 0x3c;
const ETHTOOL_SCHANNELS: u32 = 0x3d;

/// `ethtool -L IFNAME combined N`; returns the combined count read back.
pub fn set_channels(ifname: &str, combined: u32) -> io::Result<u32> {
    // struct ethtool_channels { cmd; max_rx; max_tx; max_other; max_combined;
    //                           rx_count; tx_count; other_count; combined_count; }
    let mut ch = [0u32; 9];
    ch[0] = ETHTOOL_GCHANNELS;
    ethtool(ifname, &mut ch)?;
    if combined == 0 || combined > ch[4] {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("combined must be 1..={}", ch[4]),
        ));
    }
    ch[0] = ETHTOOL_SCHANNELS;
    ch[8] = combined;
    ethtool(ifname, &mut ch)?;
    let mut rd = [0u32; 9];
    rd[0] = ETHTOOL_GCHANNELS;
    ethtool(ifname, &mut rd)?;
    Ok(rd[8])
}

/// finit_module(2).
pub fn module_load(path: &str, params: &str) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    let params = CString::new(params)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in params"))?;
    // SAFETY: finit_module(fd, const char *params, int flags): fd is open for
    // the call, params is a NUL-terminated string that outlives it.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), params.as_ptr(), 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// delete_module(2), non-blocking (fails with EWOULDBLOCK/EBUSY when in use).
pub fn module_unload(name: &str) -> io::Result<()> {
    let name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
    // SAFETY: delete_module(const char *name, unsigned flags) with a valid
    // NUL-terminated string that outlives the call.
    let rc = unsafe { libc::syscall(libc::SYS_delete_module, name.as_ptr(), libc::O_NONBLOCK) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from(c[0]) << 8
        };
        sum += u32::from(w);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// ICMP echo over a raw socket; one request at a time, each waiting up to
/// `timeout` for its reply.
/// `count` echo requests to `addr` (ICMP or ICMPv6), one at a time, each
/// waited for up to `timeout`.
pub fn ping(addr: IpAddr, count: u32, timeout: Duration) -> io::Result<PingResult> {
    match addr {
        IpAddr::V4(a) => {
            let ident = (std::process::id() as u16) ^ 0x7641;
            let dst = sockaddr_in(a, 0);
            // A raw ICMP socket: replies come with their IPv4 header.
            echo(
                &raw_socket(libc::AF_INET, libc::IPPROTO_ICMP)?,
                (
                    std::ptr::from_ref(&dst).cast(),
                    size_of::<libc::sockaddr_in>(),
                ),
                count,
                timeout,
                |seq| echo_request(8, ident, seq, true),
                |buf, _, seq| {
                    let ihl = usize::from(buf.first().copied().unwrap_or(0) & 0x0f) * 4;
                    buf.len() >= 20
                        && buf.len() >= ihl + 8
                        && buf[12..16] == a.octets()
                        && is_echo_reply(&buf[ihl..], 0, ident, seq)
                },
            )
        }
        IpAddr::V6(a) => {
            let ident = (std::process::id() as u16) ^ 0x7636;
            // SAFETY: sockaddr_in6 is plain data; all-zero is a valid value.
            let mut dst: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            dst.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            dst.sin6_addr.s6_addr = a.octets();
            // A raw ICMPv6 socket: the kernel fills in the checksum (it
            // always does for ICMPv6) and hands back messages without the
            // IPv6 header; the sender comes from recvfrom.
            echo(
                &raw_socket(libc::AF_INET6, libc::IPPROTO_ICMPV6)?,
                (
                    std::ptr::from_ref(&dst).cast(),
                    size_of::<libc::sockaddr_in6>(),
                ),
                count,
                timeout,
                |seq| echo_request(128, ident, seq, false),
                |buf, from, seq| {
                    // SAFETY: recvfrom on an AF_INET6 socket fills a
                    // sockaddr_in6, which fits in (and is aligned as) the storage.
                    let from6 = unsafe { &*std::ptr::from_ref(from).cast::<libc::sockaddr_in6>() };
                    from6.sin6_addr.s6_addr == a.octets() && is_echo_reply(buf, 129, ident, seq)
                },
            )
        }
    }
}

fn raw_socket(family: libc::c_int, proto: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; fd checked and owned below.
    let fd = unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh valid descriptor, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An echo request of type `ty` with 32 bytes of payload; the ICMP
/// checksum is computed when `sum` (ICMPv6's is the kernel's).
fn echo_request(ty: u8, ident: u16, seq: u16, sum: bool) -> [u8; 40] {
    let mut pkt = [0u8; 8 + 32];
    pkt[0] = ty;
    pkt[4..6].copy_from_slice(&ident.to_be_bytes());
    pkt[6..8].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in pkt[8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    if sum {
        let ck = checksum(&pkt);
        pkt[2..4].copy_from_slice(&ck.to_be_bytes());
    }
    pkt
}

fn is_echo_reply(icmp: &[u8], ty: u8, ident: u16, seq: u16) -> bool {
    icmp.len() >= 8
        && icmp[0] == ty
        && icmp[4..6] == ident.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
}

/// Sends `count` echo requests (`request(seq)`) to `dst` on `fd`, one at a
/// time; each waits up to `timeout` for a datagram `is_reply(data, sender,
/// seq)` accepts.
fn echo(
    fd: &OwnedFd,
    dst: (*const libc::sockaddr, usize),
    count: u32,
    timeout: Duration,
    request: impl Fn(u16) -> [u8; 40],
    is_reply: impl Fn(&[u8], &libc::sockaddr_storage, u16) -> bool,
) -> io::Result<PingResult> {
    let mut res = PingResult {
        sent: 0,
        received: 0,
        rtt_us: Vec::new(),
    };
    for seq in 0..count {
        let seq16 = seq as u16;
        let pkt = request(seq16);
        let start = Instant::now();
        // SAFETY: pkt is valid for its length and dst points at a socket
        // address of dst.1 bytes (the caller's) during the call.
        let rc = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                dst.0,
                dst.1 as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        res.sent += 1;
        let deadline = start + timeout;
        let mut buf = [0u8; 1500];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, 10_000) as libc::c_int;
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&raw mut pfd, 1, ms) };
            if n <= 0 {
                continue;
            }
            // SAFETY: plain data, all-zero valid; filled by recvfrom.
            let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut flen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // SAFETY: buf, from and flen are writable for their lengths.
            let got = unsafe {
                libc::recvfrom(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    std::ptr::from_mut(&mut from).cast(),
                    &raw mut flen,
                )
            };
            let Ok(got) = usize::try_from(got) else {
                continue;
            };
            if is_reply(&buf[..got], &from, seq16) {
                res.received += 1;
                res.rtt_us.push(start.elapsed().as_micros() as u64);
                break;
            }
        }
    }
    Ok(res)
}

fn sockaddr_in(addr: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr.octets()),
        },
        sin_zero: [0; 8],
    }
}

/// Read /dev/kmsg from the start; keep records with seq >= since.
pub fn kmsg(since: u64) -> io::Result<Kmsg> {
    let path = CString::new("/dev/kmsg").expect("static string");
    // SAFETY: open(2) with a valid path; fd checked and owned below.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh valid descriptor, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut out = Kmsg::default();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: buf is writable for its length; /dev/kmsg returns one record per read.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => break,
                Some(libc::EPIPE) => {
                    out.lost = true;
                    continue;
                }
                Some(libc::EINTR) => continue,
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf[..n as usize]);
        if let Some(r) = vnic_agent::kmsg::parse_kmsg_record(&text) {
            if r.seq >= since {
                out.records.push(r);
            }
        }
    }
    Ok(out)
}

/// Pin the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cpu out of range",
        ));
    }
    // SAFETY: cpu_set_t is plain data, all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET on a valid set with an index checked against CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 = calling thread; set is a valid cpu_set_t of the given size.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The CPU the calling thread runs on.
pub fn current_cpu() -> i32 {
    // SAFETY: sched_getcpu has no arguments and no preconditions.
    unsafe { libc::sched_getcpu() }
}

/// getsockopt(SO_INCOMING_CPU): the CPU that last processed a packet for
/// this socket in softirq (-1 before the first).
pub fn incoming_cpu(fd: &impl AsRawFd) -> io::Result<i32> {
    sockopt_int(fd, libc::SO_INCOMING_CPU)
}

/// An int-valued SOL_SOCKET option.
fn sockopt_int(fd: &impl AsRawFd, opt: libc::c_int) -> io::Result<i32> {
    let mut v: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writing and sized for an int option.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

/// SO_INCOMING_NAPI_ID of a socket: the NAPI instance that delivered the
/// last packet it received (connected UDP and TCP sockets record it per
/// packet). 0 when none did.
pub fn incoming_napi_id(fd: &impl AsRawFd) -> io::Result<u32> {
    sockopt_int(fd, libc::SO_INCOMING_NAPI_ID).map(i32::cast_unsigned)
}

/// sync, then reboot(RB_POWER_OFF). Does not return on success.
pub fn poweroff() -> ! {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    // SAFETY: reboot(2) with the power-off command; we are root in the guest.
    unsafe { libc::reboot(libc::RB_POWER_OFF) };
    // Not allowed (not root?): there is nothing sensible left to do.
    std::process::exit(1);
}

/// Interfaces from /sys/class/net.
pub fn interfaces() -> Vec<Iface> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return out;
    };
    for ent in dir.flatten() {
        let p = ent.path();
        let rd = |f: &str| {
            std::fs::read_to_string(p.join(f))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let count = |prefix: &str| {
            std::fs::read_dir(p.join("queues")).map_or(0, |d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .count()
            })
        };
        let flags = u32::from_str_radix(rd("flags").trim_start_matches("0x"), 16).unwrap_or(0);
        let driver = std::fs::read_link(p.join("device/driver"))
            .ok()
            .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        out.push(Iface {
            name: ent.file_name().to_string_lossy().into_owned(),
            mac: rd("address"),
            mtu: rd("mtu").parse().unwrap_or(0),
            up: flags & libc::IFF_UP as u32 != 0,
            driver,
            rx_queues: count("rx-"),
            tx_queues: count("tx-"),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Kernel release (uname -r).
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid utsname for writing.
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return String::new();
    }
    // SAFETY: the kernel NUL-terminates release within the array.
    let c = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    c.to_string_lossy().into_owned()
}

pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// SIOCETHTOOL with a byte buffer as `ifr_data` (a `struct ethtool_rxnfc`,
/// `vnic_agent::ntuple`): the kernel copies it in, and back for the
/// commands that answer.
fn ethtool_bytes(ifname: &str, buf: &mut [u8]) -> io::Result<()> {
    let fd = inet_dgram_socket()?;
    let mut ifr = IfReq::new(ifname)?;
    let ptr = buf.as_mut_ptr() as usize as u64;
    ifr.data[0..8].copy_from_slice(&ptr.to_ne_bytes());
    ioctl_ifreq(&fd, SIOCETHTOOL, &mut ifr)
}

/// `ethtool -N IFNAME ... [loc L]` (ETHTOOL_SRXCLSRLINS): the location the
/// kernel copied back.
pub fn rule_insert(
    ifname: &str,
    rule: &vnic_agent::proto::RuleSpec,
    loc: Option<u32>,
) -> io::Result<u32> {
    use vnic_agent::ntuple;
    let mut b = ntuple::insert_request(rule, loc.unwrap_or(ntuple::RX_CLS_LOC_ANY))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    ethtool_bytes(ifname, &mut b)?;
    Ok(ntuple::location(&b))
}

/// `ethtool -N IFNAME delete L` (ETHTOOL_SRXCLSRLDEL).
pub fn rule_delete(ifname: &str, loc: u32) -> io::Result<()> {
    use vnic_agent::ntuple;
    let mut b = ntuple::request(ntuple::ETHTOOL_SRXCLSRLDEL, loc);
    ethtool_bytes(ifname, &mut b)
}

/// `ethtool -n IFNAME`: the count and size, the locations, each rule.
pub fn rule_list(ifname: &str) -> io::Result<vnic_agent::proto::RuleList> {
    use vnic_agent::ntuple;
    let mut b = ntuple::request(ntuple::ETHTOOL_GRXCLSRLCNT, 0);
    ethtool_bytes(ifname, &mut b)?;
    let (count, size) = ntuple::count_answer(&b);
    let mut all = ntuple::list_request(count);
    ethtool_bytes(ifname, &mut all)?;
    let (_, locs) = ntuple::list_answer(&all);
    let mut rules = Vec::with_capacity(locs.len());
    for loc in locs {
        let mut r = ntuple::request(ntuple::ETHTOOL_GRXCLSRULE, loc);
        ethtool_bytes(ifname, &mut r)?;
        let (at, spec) =
            ntuple::decode_rule(&r).map_err(|e| io::Error::other(format!("rule at {loc}: {e}")))?;
        if at != loc {
            return Err(io::Error::other(format!(
                "GRXCLSRULE of location {loc} answered location {at}"
            )));
        }
        rules.push((loc, spec));
    }
    Ok(vnic_agent::proto::RuleList { size, count, rules })
}
