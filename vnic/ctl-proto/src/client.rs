//! The one blocking client of the control socket: `vnic ctl`, the device
//! tests, the frontend's harness, the benches and the guest suite use it.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::reply::{
    FlowSetInfo, GenChanged, GenList, GenPaused, GenResumed, GenStarted, GenStopped, Knobs,
    KnobsReply, Stats, StatsReply, Table, TableReply,
};
use crate::request::{FlowSpec, GenOp, Request, SetValue};

/// How long a reply may take (read timeout) unless
/// [`Client::set_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to a daemon's control socket; any number of requests, one
/// at a time.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects (once); replies may take [`DEFAULT_TIMEOUT`].
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, CtlError> {
        let path = path.as_ref();
        let s = UnixStream::connect(path).map_err(|source| CtlError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_stream(path, s)
    }

    /// Connects, retrying for up to `wait` while the socket does not exist
    /// yet or nobody listens on it yet (a daemon starting).
    pub fn connect_wait(path: impl AsRef<Path>, wait: Duration) -> Result<Self, CtlError> {
        let path = path.as_ref();
        let deadline = Instant::now() + wait;
        loop {
            match UnixStream::connect(path) {
                Ok(s) => return Self::from_stream(path, s),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => {
                    return Err(CtlError::Connect {
                        path: path.to_path_buf(),
                        source,
                    })
                }
            }
        }
    }

    fn from_stream(path: &Path, s: UnixStream) -> Result<Self, CtlError> {
        let io = |source| CtlError::Io {
            path: path.to_path_buf(),
            source,
        };
        s.set_read_timeout(Some(DEFAULT_TIMEOUT)).map_err(io)?;
        Ok(Client {
            path: path.to_path_buf(),
            reader: BufReader::new(s.try_clone().map_err(io)?),
            writer: s,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How long a reply may take, and a request's write (`None`: forever).
    pub fn set_timeout(&mut self, t: Option<Duration>) -> Result<(), CtlError> {
        self.writer
            .set_read_timeout(t)
            .and_then(|()| self.writer.set_write_timeout(t))
            .map_err(|e| self.io(e))
    }

    fn io(&self, source: io::Error) -> CtlError {
        CtlError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Sends one JSON object as a request line (whatever it holds: `vnic
    /// ctl raw`) and returns the reply object as it came, `ok` or not.
    pub fn send_value(&mut self, req: &Value) -> Result<Value, CtlError> {
        self.send_line(&req.to_string())
    }

    fn send_line(&mut self, req: &str) -> Result<Value, CtlError> {
        let mut line = req.to_string();
        line.push('\n');
        // A daemon that refuses the client (too many clients, another uid)
        // writes its reason and closes, maybe before the request is
        // written: read what it said even when the write failed.
        let wrote = self.writer.write_all(line.as_bytes());
        let mut reply = String::new();
        let read = self.reader.read_line(&mut reply);
        if reply.is_empty() {
            wrote.map_err(|e| self.io(e))?;
            read.map_err(|e| self.io(e))?;
            return Err(CtlError::Closed(self.path.clone()));
        }
        serde_json::from_str(&reply).map_err(|source| CtlError::BadReply { reply, source })
    }

    /// Sends `req`; the whole reply object when it is `ok`, else the
    /// daemon's error ([`CtlError::Failed`]).
    pub fn request(&mut self, req: &Request) -> Result<Value, CtlError> {
        let v = self.send_line(&serde_json::to_string(req).map_err(CtlError::Encode)?)?;
        if v.get("ok") == Some(&Value::Bool(true)) {
            return Ok(v);
        }
        Err(CtlError::Failed {
            request: req.to_string(),
            error: v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("(no error text)")
                .to_string(),
        })
    }

    /// Sends `req` and reads its `ok` reply as `T` (a reply body type:
    /// [`StatsReply`], [`GenStarted`], ...).
    pub fn call<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T, CtlError> {
        let v = self.request(req)?;
        serde_json::from_value(v).map_err(|source| CtlError::Shape {
            request: req.to_string(),
            source,
        })
    }

    /// `stats`.
    pub fn stats(&mut self) -> Result<Stats, CtlError> {
        Ok(self.call::<StatsReply>(&Request::Stats)?.stats)
    }

    /// `table`.
    pub fn table(&mut self) -> Result<Table, CtlError> {
        Ok(self.call::<TableReply>(&Request::Table)?.table)
    }

    /// `knobs`.
    pub fn knobs(&mut self) -> Result<Knobs, CtlError> {
        Ok(self.call::<KnobsReply>(&Request::Knobs)?.knobs)
    }

    /// `set KEY=VALUE`: all knobs after the change.
    pub fn set(&mut self, key: &str, value: impl Into<SetValue>) -> Result<Knobs, CtlError> {
        Ok(self.call::<KnobsReply>(&Request::set(key, value))?.knobs)
    }

    /// `trace_flush`.
    pub fn trace_flush(&mut self) -> Result<(), CtlError> {
        self.request(&Request::TraceFlush).map(drop)
    }

    /// `gen start`: the new flow set's id.
    pub fn gen_start(&mut self, flow: &FlowSpec) -> Result<u32, CtlError> {
        let r: GenStarted = self.call(&Request::gen(GenOp::Start, None, Some(flow.clone())))?;
        Ok(r.id)
    }

    /// `gen set`: the flow set after the change.
    pub fn gen_set(&mut self, id: u32, flow: &FlowSpec) -> Result<FlowSetInfo, CtlError> {
        let r: GenChanged = self.call(&Request::gen(GenOp::Set, Some(id), Some(flow.clone())))?;
        Ok(r.flow)
    }

    /// `gen pause` of one set, or of all with `None`: the sets paused.
    pub fn gen_pause(&mut self, id: Option<u32>) -> Result<Vec<u32>, CtlError> {
        let r: GenPaused = self.call(&Request::gen(GenOp::Pause, id, None))?;
        Ok(r.pause)
    }

    /// `gen resume` of one set, or of all with `None`: the sets resumed.
    pub fn gen_resume(&mut self, id: Option<u32>) -> Result<Vec<u32>, CtlError> {
        let r: GenResumed = self.call(&Request::gen(GenOp::Resume, id, None))?;
        Ok(r.resume)
    }

    /// `gen stop` of one set, or of all with `None`: the sets stopped.
    pub fn gen_stop(&mut self, id: Option<u32>) -> Result<Vec<u32>, CtlError> {
        let r: GenStopped = self.call(&Request::gen(GenOp::Stop, id, None))?;
        Ok(r.stopped)
    }

    /// `gen list`.
    pub fn gen_list(&mut self) -> Result<Vec<FlowSetInfo>, CtlError> {
        let r: GenList = self.call(&Request::gen(GenOp::List, None, None))?;
        Ok(r.flows)
    }
}

/// Why a request got no usable reply.
#[derive(Debug)]
pub enum CtlError {
    /// The socket could not be connected.
    Connect { path: PathBuf, source: io::Error },
    /// Writing the request or reading the reply failed (a timeout too).
    Io { path: PathBuf, source: io::Error },
    /// The daemon closed the connection without a reply.
    Closed(PathBuf),
    /// The request could not be encoded.
    Encode(serde_json::Error),
    /// The reply line is not JSON.
    BadReply {
        reply: String,
        source: serde_json::Error,
    },
    /// The reply is JSON but not the shape its command answers.
    Shape {
        request: String,
        source: serde_json::Error,
    },
    /// The daemon answered `"ok": false` with this error.
    Failed { request: String, error: String },
}

impl CtlError {
    /// The daemon's error message, when it answered `"ok": false`.
    pub fn daemon_error(&self) -> Option<&str> {
        match self {
            CtlError::Failed { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtlError::Connect { path, source } => {
                write!(
                    f,
                    "control socket {}: cannot connect: {source}",
                    path.display()
                )
            }
            CtlError::Io { path, source } => {
                write!(f, "control socket {}: {source}", path.display())
            }
            CtlError::Closed(path) => write!(
                f,
                "control socket {}: connection closed without a reply",
                path.display()
            ),
            CtlError::Encode(e) => write!(f, "cannot encode the request: {e}"),
            CtlError::BadReply { reply, source } => {
                write!(f, "bad reply {:?}: {source}", reply.trim_end())
            }
            CtlError::Shape { request, source } => {
                write!(f, "unexpected reply to {request}: {source}")
            }
            CtlError::Failed { request, error } => write!(f, "{request} failed: {error}"),
        }
    }
}

impl std::error::Error for CtlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CtlError::Connect { source, .. } | CtlError::Io { source, .. } => Some(source),
            CtlError::Encode(source)
            | CtlError::BadReply { source, .. }
            | CtlError::Shape { source, .. } => Some(source),
            CtlError::Closed(_) | CtlError::Failed { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A daemon stand-in: answers each line with the next of `replies`,
    /// then closes.
    fn fake(replies: &'static [&'static str]) -> (PathBuf, std::thread::JoinHandle<Vec<String>>) {
        let dir = std::env::temp_dir().join(format!(
            "vnic-ctl-proto-{}-{}",
            std::process::id(),
            replies.len()
        ));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("ctl");
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            let mut got = Vec::new();
            for reply in replies {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                got.push(line);
                w.write_all(reply.as_bytes()).unwrap();
                w.write_all(b"\n").unwrap();
            }
            got
        });
        (path, t)
    }

    #[test]
    fn typed_calls_read_their_bodies_and_failures_carry_the_daemons_error() {
        let (path, t) = fake(&[
            r#"{"ok":true,"id":7}"#,
            r#"{"ok":false,"error":"gen stop: no flow set 9"}"#,
            r#"{"ok":true,"stopped":"not a list"}"#,
            "not json",
        ]);
        let mut c = Client::connect(&path).unwrap();
        assert_eq!(c.gen_start(&FlowSpec::default()).unwrap(), 7);
        let e = c.gen_stop(Some(9)).unwrap_err();
        assert_eq!(e.daemon_error(), Some("gen stop: no flow set 9"));
        assert_eq!(
            e.to_string(),
            r#"{"cmd":"gen","op":"stop","id":9} failed: gen stop: no flow set 9"#
        );
        assert!(matches!(c.gen_stop(None), Err(CtlError::Shape { .. })));
        assert!(matches!(c.stats(), Err(CtlError::BadReply { .. })));
        // The stand-in is gone: the write fails (EPIPE) or the read finds
        // the end.
        assert!(matches!(
            c.stats(),
            Err(CtlError::Closed(_) | CtlError::Io { .. })
        ));
        let sent = t.join().unwrap();
        assert_eq!(sent[0], "{\"cmd\":\"gen\",\"op\":\"start\",\"flow\":{}}\n");
        let _ = std::fs::remove_file(&path);
    }
}
