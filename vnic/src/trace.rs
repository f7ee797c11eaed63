//! The trace writer: a dedicated thread fed by a bounded channel. Producers
//! (the management path) never block: when the channel is full the record
//! is dropped and counted.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arfs::TraceRecord;

/// Capacity of the channel between producers and the writer thread.
pub const TRACE_QUEUE: usize = 65_536;

enum Msg {
    Rec(Box<TraceRecord>),
    Flush(SyncSender<()>),
}

/// Counters of the trace writer.
#[derive(Default)]
pub struct TraceCounters {
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub write_errors: AtomicU64,
}

/// Handle to the trace writer (cheap to share; `emit` never blocks).
pub struct Tracer {
    tx: Option<SyncSender<Msg>>,
    pub counters: Arc<TraceCounters>,
    _thread: Option<JoinHandle<()>>,
}

impl Tracer {
    /// A tracer that records nothing.
    pub fn disabled() -> Self {
        Self {
            tx: None,
            counters: Arc::default(),
            _thread: None,
        }
    }

    /// Creates (truncates) `path` and starts the writer thread.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::create(path)?;
        let (tx, rx) = sync_channel(TRACE_QUEUE);
        let counters = Arc::new(TraceCounters::default());
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name("vnic-trace".into())
            .spawn(move || writer(BufWriter::with_capacity(1 << 16, file), &rx, &c))?;
        Ok(Self {
            tx: Some(tx),
            counters,
            _thread: Some(thread),
        })
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a record; drops (and counts) it when the writer is behind.
    pub fn emit(&self, rec: TraceRecord) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(Msg::Rec(Box::new(rec))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Writes out everything queued so far (waits at most `timeout`).
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(tx) = &self.tx else { return true };
        let (atx, arx) = sync_channel(1);
        // Blocking send is fine here: the writer always drains the channel
        // (workers never block on it: they drop and count when it is full).
        if tx.send(Msg::Flush(atx)).is_err() {
            return false;
        }
        arx.recv_timeout(timeout).is_ok()
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "enabled": self.enabled(),
            "written": self.counters.written.load(Ordering::Relaxed),
            "dropped": self.counters.dropped.load(Ordering::Relaxed),
            "write_errors": self.counters.write_errors.load(Ordering::Relaxed),
        })
    }
}

fn writer(mut out: BufWriter<File>, rx: &Receiver<Msg>, c: &TraceCounters) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut dirty = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Msg::Rec(rec)) => {
                let ok =
                    serde_json::to_writer(&mut out, &rec).is_ok() && out.write_all(b"\n").is_ok();
                if ok {
                    c.written.fetch_add(1, Ordering::Relaxed);
                } else {
                    c.write_errors.fetch_add(1, Ordering::Relaxed);
                }
                dirty = true;
            }
            Ok(Msg::Flush(ack)) => {
                if out.flush().is_err() {
                    c.write_errors.fetch_add(1, Ordering::Relaxed);
                }
                dirty = false;
                let _ = ack.send(());
            }
            // Flush when idle so that `tail -f` and tests see lines promptly.
            Err(RecvTimeoutError::Timeout) => {
                if dirty {
                    let _ = out.flush();
                    dirty = false;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = out.flush();
}
