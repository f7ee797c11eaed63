//! Time and generations: the daemon's monotonic clock, device generation
//! numbers, and the non-blocking timerfds the threads pace themselves with.

use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Instant;

use vmm_sys_util::timerfd::TimerFd;

static START: OnceLock<Instant> = OnceLock::new();

/// Monotonic nanoseconds since the process first asked (at daemon start).
pub(crate) fn now_ns() -> u64 {
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// An initial generation: derived from the wall clock and the pid so that
/// a restarted daemon never reuses its predecessor's; never 0.
pub(crate) fn initial_generation() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ (u64::from(std::process::id()) << 32);
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let g = x as u32;
    if g == 0 {
        1
    } else {
        g
    }
}

/// The generation after `g` (skips 0).
pub(crate) fn next_generation(g: u32) -> u32 {
    match g.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

/// A timerfd in non-blocking mode: a read after the timer was re-armed or
/// cleared between epoll and read must not block the thread.
pub(crate) fn timer() -> std::io::Result<TimerFd> {
    let t = TimerFd::new()?;
    let fd = t.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor `t` owns; no memory is passed.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an int flag argument on the same descriptor.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(t)
}
