//! The trace writer: a dedicated thread fed by a bounded channel. Producers
//! (the management path) never block: when the channel is full the record
//! is dropped and counted. Every record is accounted for: `written` once it
//! reached the file, `write_errors` when the write of its batch failed (the
//! batch is discarded, the first failure logged), `dropped` when the
//! channel was full.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arfs::TraceRecord;

/// Capacity of the channel between producers and the writer thread.
pub(crate) const TRACE_QUEUE: usize = 65_536;

/// Bytes of serialized records the writer batches before writing them out
/// (it also writes when idle for 50 ms and on a flush request).
const BATCH_BYTES: usize = 1 << 16;

enum Msg {
    Rec(Box<TraceRecord>),
    Flush(SyncSender<()>),
}

/// Counters of the trace writer.
#[derive(Default)]
pub(crate) struct TraceCounters {
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub write_errors: AtomicU64,
}

/// Handle to the trace writer (cheap to share; `emit` never blocks).
pub(crate) struct Tracer {
    tx: Option<SyncSender<Msg>>,
    pub counters: Arc<TraceCounters>,
    _thread: Option<JoinHandle<()>>,
}

impl Tracer {
    /// A tracer that records nothing.
    pub(crate) fn disabled() -> Self {
        Self {
            tx: None,
            counters: Arc::default(),
            _thread: None,
        }
    }

    /// Creates (truncates) `path` and starts the writer thread.
    pub(crate) fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::create(path)?;
        let (tx, rx) = sync_channel(TRACE_QUEUE);
        let counters = Arc::new(TraceCounters::default());
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name("vnic-trace".into())
            .spawn(move || writer(file, &rx, &c))?;
        Ok(Self {
            tx: Some(tx),
            counters,
            _thread: Some(thread),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a record; drops (and counts) it when the writer is behind.
    pub(crate) fn emit(&self, rec: TraceRecord) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(Msg::Rec(Box::new(rec))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Writes out everything queued so far (waits at most `timeout`).
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let Some(tx) = &self.tx else { return true };
        let (atx, arx) = sync_channel(1);
        // Blocking send is fine here: the writer always drains the channel
        // (workers never block on it: they drop and count when it is full).
        if tx.send(Msg::Flush(atx)).is_err() {
            return false;
        }
        arx.recv_timeout(timeout).is_ok()
    }

    /// The writer's accounting as `ctl stats` shows it (`trace`).
    pub(crate) fn to_wire(&self) -> vnic_ctl_proto::TraceStats {
        vnic_ctl_proto::TraceStats {
            enabled: self.enabled(),
            written: self.counters.written.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            write_errors: self.counters.write_errors.load(Ordering::Relaxed),
        }
    }
}

/// Records serialized but not yet written, and how many.
struct Batch {
    buf: Vec<u8>,
    records: u64,
    /// A write failed before (logged once).
    failed_before: bool,
}

impl Batch {
    /// Writes the batch out: its records count as written, or all as write
    /// errors when the write fails (the batch is discarded either way).
    fn write_out(&mut self, out: &mut impl Write, c: &TraceCounters) -> bool {
        if self.records == 0 {
            return true;
        }
        let ok = out.write_all(&self.buf).and_then(|()| out.flush());
        let n = std::mem::take(&mut self.records);
        self.buf.clear();
        match ok {
            Ok(()) => {
                c.written.fetch_add(n, Ordering::Relaxed);
                true
            }
            Err(e) => {
                c.write_errors.fetch_add(n, Ordering::Relaxed);
                if !self.failed_before {
                    self.failed_before = true;
                    log::error!(
                        "trace: writing {n} record(s) failed: {e}; further failures are counted in trace.write_errors"
                    );
                }
                false
            }
        }
    }
}

fn writer(mut out: impl Write, rx: &Receiver<Msg>, c: &TraceCounters) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut b = Batch {
        buf: Vec::with_capacity(BATCH_BYTES + 1024),
        records: 0,
        failed_before: false,
    };
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Msg::Rec(rec)) => {
                let len = b.buf.len();
                if serde_json::to_writer(&mut b.buf, &rec).is_ok() {
                    b.buf.push(b'\n');
                    b.records += 1;
                } else {
                    b.buf.truncate(len);
                    c.write_errors.fetch_add(1, Ordering::Relaxed);
                }
                if b.buf.len() >= BATCH_BYTES {
                    b.write_out(&mut out, c);
                }
            }
            Ok(Msg::Flush(ack)) => {
                b.write_out(&mut out, c);
                let _ = ack.send(());
            }
            // Write out when idle so that `tail -f` and tests see lines promptly.
            Err(RecvTimeoutError::Timeout) => {
                b.write_out(&mut out, c);
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    b.write_out(&mut out, c);
}

#[cfg(test)]
mod tests {
    use super::*;
    use arfs::TraceRecord;

    /// A sink that fails every write after the first `ok` bytes.
    struct Full {
        ok: usize,
        got: Vec<u8>,
    }

    impl Write for Full {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.got.len() + b.len() > self.ok {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.got.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn rec(i: u64) -> TraceRecord {
        TraceRecord::gen_change(i, 1, 2, "test")
    }

    #[test]
    fn every_record_is_written_or_counted_as_a_write_error() {
        let c = TraceCounters::default();
        let (tx, rx) = sync_channel(16);
        for i in 0..3 {
            tx.send(Msg::Rec(Box::new(rec(i)))).unwrap();
        }
        let (atx, arx) = sync_channel(1);
        tx.send(Msg::Flush(atx)).unwrap();
        for i in 3..8 {
            tx.send(Msg::Rec(Box::new(rec(i)))).unwrap();
        }
        drop(tx);
        // Room for the first batch (3 lines) only.
        let mut line = serde_json::to_vec(&rec(0)).unwrap();
        line.push(b'\n');
        let sink = Full {
            ok: 3 * line.len() + 10,
            got: Vec::new(),
        };
        writer(sink, &rx, &c);
        arx.recv().unwrap();
        assert_eq!(c.written.load(Ordering::Relaxed), 3);
        assert_eq!(
            c.write_errors.load(Ordering::Relaxed),
            5,
            "the failed batch is counted"
        );
    }
}
