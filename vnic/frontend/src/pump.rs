//! Busy driver loops for the benchmark: one thread per queue pair keeps its
//! RX ring stocked with buffers and counts what arrives, or keeps its TX ring
//! full of prebuilt frames and counts completions. Interrupts (call eventfd
//! with EVENT_IDX) wake a loop that has nothing to do, so idle loops do not
//! steal the CPU the device needs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::net::{RxQueue, TxQueue};
use super::ring::DeviceFault;

/// Counters a pump thread publishes while it runs.
#[derive(Debug, Default)]
pub struct PumpStats {
    pub frames: AtomicU64,
    pub bytes: AtomicU64,
    /// Times the loop slept on the call eventfd.
    pub waits: AtomicU64,
    pub kicks: AtomicU64,
}

/// Publish local counts every this many frames.
const FLUSH_EVERY: u64 = 256;

/// Receive until `stop`: consume frames, give buffers back in batches.
pub fn rx_loop(
    rx: &mut RxQueue,
    stop: &AtomicBool,
    stats: &Arc<PumpStats>,
) -> Result<(), DeviceFault> {
    rx.fill();
    let (mut frames, mut bytes) = (0u64, 0u64);
    let refill_at = (rx.ring.size() / 4).max(1) as usize;
    while !stop.load(Ordering::Relaxed) {
        let mut got = 0u64;
        while let Some((b, _n)) = rx.recv_discard()? {
            frames += 1;
            bytes += b as u64;
            got += 1;
            if rx.ring.free_slots() >= refill_at {
                rx.fill();
            }
            if frames % FLUSH_EVERY == 0 {
                stats.frames.fetch_add(FLUSH_EVERY, Ordering::Relaxed);
                stats.bytes.fetch_add(bytes, Ordering::Relaxed);
                bytes = 0;
            }
        }
        if got == 0 {
            rx.fill();
            // Ask for an interrupt on the next used entry, then re-check
            // before sleeping (the device may have added one meanwhile).
            rx.ring.set_used_event(rx.ring.last_used());
            if rx.ring.pending_used() == 0 {
                stats.waits.fetch_add(1, Ordering::Relaxed);
                rx.ring.wait_call(Duration::from_millis(5));
            }
        }
    }
    stats
        .frames
        .fetch_add(frames % FLUSH_EVERY, Ordering::Relaxed);
    stats.bytes.fetch_add(bytes, Ordering::Relaxed);
    stats.kicks.store(rx.ring.kicks, Ordering::Relaxed);
    Ok(())
}

/// Transmit until `stop`: keep the ring full of the frame prebuilt with
/// [`TxQueue::prebuild`] (`frame_len` bytes), count completions.
pub fn tx_loop(
    tx: &mut TxQueue,
    frame_len: usize,
    stop: &AtomicBool,
    stats: &Arc<PumpStats>,
) -> Result<(), DeviceFault> {
    let mut done = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let n = tx.reap()? as u64;
        done += n;
        let mut pushed = 0;
        while tx.push_prebuilt(frame_len) {
            pushed += 1;
        }
        if pushed > 0 {
            tx.ring.notify();
        }
        if done >= FLUSH_EVERY {
            stats.frames.fetch_add(done, Ordering::Relaxed);
            stats
                .bytes
                .fetch_add(done * frame_len as u64, Ordering::Relaxed);
            done = 0;
        }
        if n == 0 && pushed == 0 {
            // Ring full and nothing completed: sleep until half of it is.
            let half = (tx.ring.in_flight() / 2) as u16;
            tx.ring
                .set_used_event(tx.ring.last_used().wrapping_add(half));
            if tx.ring.pending_used() <= half {
                stats.waits.fetch_add(1, Ordering::Relaxed);
                tx.ring.wait_call(Duration::from_millis(5));
            }
        }
    }
    done += tx.reap()? as u64;
    stats.frames.fetch_add(done, Ordering::Relaxed);
    stats
        .bytes
        .fetch_add(done * frame_len as u64, Ordering::Relaxed);
    stats.kicks.store(tx.ring.kicks, Ordering::Relaxed);
    Ok(())
}
