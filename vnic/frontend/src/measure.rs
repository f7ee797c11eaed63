//! What the bench binaries measure besides packets, in one place: a
//! process's CPU time (all threads, or the threads of one name) from
//! `/proc`, the host's load average, and medians. (A process's fds,
//! threads and RSS at rest: [`crate::harness::footprint`].)

use std::fmt;

/// A `/proc` stat file that could not be read or parsed.
#[derive(Debug)]
pub struct ProcError {
    pub path: String,
    pub why: String,
}

impl fmt::Display for ProcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.why)
    }
}

impl std::error::Error for ProcError {}

/// (command name, CPU seconds (user + system)) of a `/proc` stat file
/// (`/proc/PID/stat` or `/proc/PID/task/TID/stat`).
pub fn stat_cpu(path: &str) -> Result<(String, f64), ProcError> {
    let bad = |why: &str| ProcError {
        path: path.to_string(),
        why: why.to_string(),
    };
    let stat = std::fs::read_to_string(path).map_err(|e| bad(&e.to_string()))?;
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return Err(bad("no command name in the stat line"));
    };
    let comm = stat[open + 1..close].to_string();
    // Fields after the ")" that ends the command name; utime and stime are
    // fields 14 and 15 of the whole line, 12 and 13 after it.
    let f: Vec<&str> = stat
        .get(close + 2..)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    if f.len() < 13 {
        return Err(bad("short stat line"));
    }
    let ticks = |s: &str| s.parse::<f64>().map_err(|e| bad(&format!("{s}: {e}")));
    let t = ticks(f[11])? + ticks(f[12])?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((comm, t / hz))
}

/// CPU seconds process `pid` used so far, all threads.
pub fn cpu_seconds(pid: u32) -> Result<f64, ProcError> {
    stat_cpu(&format!("/proc/{pid}/stat")).map(|(_, s)| s)
}

/// CPU seconds the live threads of `pid` named `comm` used so far (a
/// thread that ends between the listing and its read is left out).
pub fn thread_cpu_seconds(pid: u32, comm: &str) -> Result<f64, ProcError> {
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| ProcError {
        path: dir,
        why: e.to_string(),
    })?;
    let mut sum = 0.0;
    for t in tasks.flatten() {
        if let Ok((c, s)) = stat_cpu(&format!("{}/stat", t.path().display())) {
            if c == comm {
                sum += s;
            }
        }
    }
    Ok(sum)
}

/// The host's load averages (1, 5 and 15 minutes) as `/proc/loadavg`
/// gives them, or "?" when it cannot be read.
pub fn loadavg() -> String {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let v: Vec<&str> = s.split_whitespace().take(3).collect();
    if v.is_empty() {
        "?".into()
    } else {
        v.join(" ")
    }
}

/// The median of the finite values of `v` (NaN when there are none).
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => f64::midpoint(s[n / 2 - 1], s[n / 2]),
    }
}

/// The time a cache line takes to go from CPU `a` to CPU `b` and back, ns:
/// two threads pinned to them take turns storing to one shared word, and
/// this is the median over 9 tries of 20,000 round trips. On a virtual
/// machine it tells how far apart the host has placed the two vCPUs at
/// that moment (on this project's CI host: ~70 ns, or ~300 ns when the
/// host runs them far apart), which moves every figure measured across
/// them. `None` for `a == b`, for a CPU this process may not run on, or
/// when a try takes over a second (the other thread did not get its CPU).
pub fn line_round_trip(a: usize, b: usize) -> Option<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    const N: u64 = 20_000;
    const TRIES: usize = 9;
    let allowed = allowed_cpus();
    if a == b || !allowed.contains(&a) || !allowed.contains(&b) {
        return None;
    }
    let mut tries = Vec::with_capacity(TRIES);
    for _ in 0..TRIES {
        let w = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (w2, stop2) = (w.clone(), stop.clone());
        let t0 = Instant::now();
        let echo = std::thread::spawn(move || {
            if pin(b) {
                for i in 0..N {
                    if !wait(&w2, 2 * i + 1, &stop2, t0) {
                        return;
                    }
                    w2.store(2 * i + 2, Ordering::Release);
                }
            } else {
                stop2.store(true, Ordering::Relaxed);
            }
        });
        let (w3, stop3) = (w.clone(), stop.clone());
        let ping = std::thread::spawn(move || {
            if !pin(a) {
                stop3.store(true, Ordering::Relaxed);
                return None;
            }
            let start = Instant::now();
            for i in 0..N {
                w3.store(2 * i + 1, Ordering::Release);
                if !wait(&w3, 2 * i + 2, &stop3, t0) {
                    return None;
                }
            }
            Some(start.elapsed().as_secs_f64() * 1e9 / N as f64)
        });
        let ns = ping.join().ok().flatten();
        let _ = echo.join();
        tries.push(ns?);
    }
    Some(median(&tries))
}

/// A try of [`line_round_trip`] longer than this is given up.
const ROUND_TRIP_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

// Spins until `w` holds `want`; false when `stop` is set meanwhile.
fn wait(
    w: &std::sync::atomic::AtomicU64,
    want: u64,
    stop: &std::sync::atomic::AtomicBool,
    t0: std::time::Instant,
) -> bool {
    use std::sync::atomic::Ordering;
    let mut spins = 0u32;
    while w.load(Ordering::Acquire) != want {
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096)
            && (stop.load(Ordering::Relaxed) || t0.elapsed() > ROUND_TRIP_LIMIT)
        {
            stop.store(true, Ordering::Relaxed);
            return false;
        }
    }
    true
}

/// The CPUs this process may run on (`[0]` when they cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: all-zero is a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most the given size into `set`,
    // which lives across the call.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc != 0 {
        return vec![0];
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the set is initialised.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`; false when that failed.
fn pin(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // inside it for cpu < CPU_SETSIZE (checked above), and
    // sched_setaffinity reads size_of::<cpu_set_t>() bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::float_cmp)] // exact: each median is one of the inputs or their exact midpoint
    fn medians() {
        assert!(median(&[]).is_nan());
        assert!(median(&[f64::NAN]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[1.0, f64::INFINITY, 5.0]), 3.0);
    }

    #[test]
    fn this_process_has_cpu_time_and_its_main_thread() {
        let pid = std::process::id();
        // Burn a little CPU so that the counters are not all zero.
        let mut x = 0u64;
        let t0 = std::time::Instant::now();
        while t0.elapsed().as_millis() < 50 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let all = cpu_seconds(pid).unwrap();
        assert!(all > 0.0, "{all}");
        let (comm, _) = stat_cpu(&format!("/proc/{pid}/stat")).unwrap();
        assert!(thread_cpu_seconds(pid, &comm).unwrap() <= all + 0.02);
        assert!(thread_cpu_seconds(pid, "no-such-thread").unwrap().abs() < f64::EPSILON);
        let e = cpu_seconds(u32::MAX).unwrap_err();
        assert!(e.to_string().contains("/proc/4294967295/stat"), "{e}");
        assert_eq!(loadavg().split(' ').count(), 3);
    }

    /// Between two CPUs it is a positive time; a CPU with itself, or one
    /// this process cannot run on, gives None at once instead of spinning.
    #[test]
    fn line_round_trip_measures_two_cpus_and_refuses_one() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert_eq!(line_round_trip(cpus[0], cpus[0]), None);
        assert_eq!(line_round_trip(cpus[0], libc::CPU_SETSIZE as usize), None);
        if let [a, b, ..] = cpus[..] {
            let ns = line_round_trip(a, b).expect("two CPUs this process may use");
            assert!(ns > 1.0 && ns < 1e6, "{ns} ns");
        }
    }
}
