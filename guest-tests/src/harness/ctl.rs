//! Client of vnic's control socket (JSON lines, vnic/CTL.md).

use super::{Context, Result};
use crate::bail;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub struct Ctl {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Ctl {
    pub fn connect(path: &Path) -> Result<Self> {
        let s = UnixStream::connect(path).ctx(format!("connecting to {}", path.display()))?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        s.set_write_timeout(Some(Duration::from_secs(20)))?;
        Ok(Ctl {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// Send one request, return the reply object (errors on `ok: false`).
    pub fn call(&mut self, req: &Value) -> Result<Value> {
        let mut line = serde_json::to_string(req)?;
        line.push('\n');
        self.writer.write_all(line.as_bytes()).ctx("ctl write")?;
        let mut reply = String::new();
        let n = self.reader.read_line(&mut reply).ctx("ctl read")?;
        if n == 0 {
            bail!("vnic closed the control connection");
        }
        let v: Value = serde_json::from_str(&reply).ctx(format!("ctl reply {reply:?}"))?;
        if v.get("ok") != Some(&Value::Bool(true)) {
            bail!(
                "vnic ctl {} failed: {}",
                req,
                v.get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("(no error text)")
            );
        }
        Ok(v)
    }

    pub fn stats(&mut self) -> Result<Value> {
        Ok(self.call(&json!({"cmd": "stats"}))?["stats"].clone())
    }

    pub fn table(&mut self) -> Result<Value> {
        Ok(self.call(&json!({"cmd": "table"}))?["table"].clone())
    }

    pub fn set(&mut self, key: &str, value: &Value) -> Result<Value> {
        Ok(self.call(&json!({"cmd": "set", "key": key, "value": value}))?["knobs"].clone())
    }

    /// Start a generator flow set; returns its id.
    pub fn gen_start(&mut self, spec: &Value) -> Result<u64> {
        let v = self.call(&json!({"cmd": "gen", "op": "start", "flow": spec}))?;
        v["id"]
            .as_u64()
            .ok_or_else(|| "gen start: no id in reply".into())
    }

    pub fn gen_stop_all(&mut self) -> Result<()> {
        self.call(&json!({"cmd": "gen", "op": "stop"}))?;
        Ok(())
    }

    pub fn gen_list(&mut self) -> Result<Value> {
        Ok(self.call(&json!({"cmd": "gen", "op": "list"}))?["flows"].clone())
    }
}

/// A u64 at a JSON pointer (e.g. `/table/adds`). Absent (or not a
/// number): 0, and the scenario fails ([`super::missing`]).
pub fn counter(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| {
            super::missing(format!("{pointer} (vnic ctl)"));
            0
        })
}
