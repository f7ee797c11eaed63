//! Client of the guest agent (JSON lines over the virtio-serial port's
//! host-side unix socket).

use super::{BootError, Context, Error, Result};
use crate::bail;
use crate::proto::{Envelope, Info, Reply, Request};
use serde::de::DeserializeOwned;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

pub struct Agent {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    /// Every request and reply, for the artifacts.
    pub transcript: Vec<String>,
    /// Set when a request timed out (the request's name), cleared by the
    /// next reply: while set, requests wait at most [`WEDGED_TIMEOUT`] so
    /// a hung guest costs seconds, not minutes, per remaining request.
    pub unresponsive: Option<String>,
}

/// Longest wait for a reply while the agent is [`Agent::unresponsive`].
pub const WEDGED_TIMEOUT: Duration = Duration::from_secs(5);

impl Agent {
    /// Connect to QEMU's socket for the port and wait for the agent to
    /// answer `hello` (the guest boots meanwhile).
    pub fn connect(
        path: &Path,
        boot_timeout: Duration,
        alive: &mut dyn FnMut() -> Result<()>,
    ) -> Result<(Self, Info), BootError> {
        let start = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if start.elapsed() < Duration::from_secs(30) => {
                    alive()?;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    return Err(
                        format!("connecting to the agent socket {}: {e}", path.display()).into(),
                    )
                }
            }
        };
        let mut a = Agent {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            next_id: 1,
            transcript: Vec::new(),
            unresponsive: None,
        };
        loop {
            alive()?;
            match a.call::<Info>(&Request::Hello, Duration::from_secs(3)) {
                Ok(info) => return Ok((a, info)),
                Err(e) if e.0.contains("timed out") && start.elapsed() < boot_timeout => {}
                Err(e) => {
                    return Err(BootError::NoHello(Error(format!(
                        "agent did not answer hello within {boot_timeout:?}: {e}"
                    ))))
                }
            }
        }
    }

    /// Send a request and wait up to `timeout` for its reply. Replies to
    /// earlier, timed-out requests are skipped.
    pub fn call_value(&mut self, req: &Request, timeout: Duration) -> Result<serde_json::Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_string(&Envelope {
            id,
            req: req.clone(),
        })?;
        self.transcript.push(format!("> {line}"));
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .ctx("writing to the agent")?;
        let timeout = if self.unresponsive.is_some() {
            timeout.min(WEDGED_TIMEOUT)
        } else {
            timeout
        };
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let what = cmd_name(req);
                if let Some(first) = &self.unresponsive {
                    bail!("timed out after {timeout:?} waiting for the agent's reply to {what} (unresponsive since {first})");
                }
                self.unresponsive = Some(what.clone());
                bail!("timed out after {timeout:?} waiting for the agent's reply to {what}");
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
            let mut buf = String::new();
            match self.reader.read_line(&mut buf) {
                Ok(0) => bail!("the agent connection closed (guest gone?)"),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue
                }
                Err(e) => bail!("reading from the agent: {e}"),
            }
            let text = buf.trim();
            if text.is_empty() {
                continue;
            }
            let short: String = text.chars().take(2000).collect();
            self.transcript.push(format!("< {short}"));
            self.unresponsive = None;
            let reply: Reply = match serde_json::from_str(text) {
                Ok(r) => r,
                Err(e) => bail!("unparsable agent reply {short:?}: {e}"),
            };
            if reply.id != id {
                continue;
            }
            if let Some(e) = reply.error {
                bail!("agent {}: {e}", cmd_name(req));
            }
            return Ok(reply.result.unwrap_or(serde_json::Value::Null));
        }
    }

    pub fn call<T: DeserializeOwned>(&mut self, req: &Request, timeout: Duration) -> Result<T> {
        let v = self.call_value(req, timeout)?;
        serde_json::from_value(v).ctx(format!("decoding the reply to {}", cmd_name(req)))
    }

    /// A request with the default timeout (30 s: TCG under load is slow).
    #[allow(clippy::needless_pass_by_value)] // call sites build the request inline
    pub fn req<T: DeserializeOwned>(&mut self, req: Request) -> Result<T> {
        self.call(&req, Duration::from_secs(30))
    }

    pub fn read_file(&mut self, path: &str) -> Result<String> {
        self.req(Request::ReadFile { path: path.into() })
    }

    pub fn write_file(&mut self, path: &str, value: &str) -> Result<()> {
        self.call_value(
            &Request::WriteFile {
                path: path.into(),
                value: value.into(),
            },
            Duration::from_secs(30),
        )
        .map(drop)
    }
}

fn cmd_name(req: &Request) -> String {
    serde_json::to_value(req)
        .ok()
        .and_then(|v| v.get("cmd").and_then(|c| c.as_str().map(String::from)))
        .unwrap_or_else(|| "request".into())
}
