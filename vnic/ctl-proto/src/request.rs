//! Requests: what a client writes, one JSON object per line.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One request (CTL.md "Commands"). On the wire: `{"cmd": "<name>", ...}`.
///
/// Deserializing goes through the daemon's own checks
/// ([`Request::from_line`]): a request that names an unknown command, lacks
/// a field its command needs or carries a field no command has is refused
/// with the daemon's message ([`RequestError`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "cmd",
    rename_all = "snake_case",
    deny_unknown_fields,
    try_from = "RawRequest"
)]
pub enum Request {
    /// `{"cmd":"stats"}`: the reply carries [`StatsReply`](crate::StatsReply).
    Stats,
    /// `{"cmd":"table"}`: [`TableReply`](crate::TableReply).
    Table,
    /// `{"cmd":"trace_flush"}`: an empty reply once every trace record of an
    /// event before the request is in the file.
    TraceFlush,
    /// `{"cmd":"set","key":K,"value":V}`: [`KnobsReply`](crate::KnobsReply)
    /// (all knobs after the change).
    Set { key: String, value: SetValue },
    /// `{"cmd":"knobs"}`: [`KnobsReply`](crate::KnobsReply).
    Knobs,
    /// `{"cmd":"gen","op":OP,"id":N,"flow":SPEC}` (`id` and `flow` as the op
    /// needs them; `set` needs `id`).
    Gen {
        op: GenOp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        flow: Option<FlowSpec>,
    },
}

impl Request {
    /// `set KEY=VALUE`.
    pub fn set(key: impl Into<String>, value: impl Into<SetValue>) -> Self {
        Request::Set {
            key: key.into(),
            value: value.into(),
        }
    }

    /// A `gen` request.
    pub fn gen(op: GenOp, id: Option<u32>, flow: Option<FlowSpec>) -> Self {
        Request::Gen { op, id, flow }
    }

    /// The request of one line, checked as the daemon checks it. The
    /// daemon's request parser: its errors are the daemon's error replies.
    pub fn from_line(line: &str) -> Result<Self, RequestError> {
        let raw: RawRequest = serde_json::from_str(line).map_err(RequestError::Json)?;
        Request::try_from(raw)
    }

    /// The command's name on the wire (`stats`, `trace_flush`, `gen`, ...).
    pub fn cmd(&self) -> &'static str {
        match self {
            Request::Stats => "stats",
            Request::Table => "table",
            Request::TraceFlush => "trace_flush",
            Request::Set { .. } => "set",
            Request::Knobs => "knobs",
            Request::Gen { .. } => "gen",
        }
    }
}

impl fmt::Display for Request {
    /// The request's JSON line (without the newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_string(self) {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "{{\"cmd\":\"{}\"}}", self.cmd()),
        }
    }
}

/// `set`'s value: a string or a number (CTL.md: "`V` in `set` is a string
/// or a number").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SetValue {
    Text(String),
    Number(serde_json::Number),
}

impl SetValue {
    /// The value as the knob parser reads it (a number in its JSON form).
    pub fn as_text(&self) -> String {
        match self {
            SetValue::Text(s) => s.clone(),
            SetValue::Number(n) => n.to_string(),
        }
    }
}

impl fmt::Display for SetValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_text())
    }
}

impl From<&str> for SetValue {
    fn from(s: &str) -> Self {
        SetValue::Text(s.to_string())
    }
}

impl From<String> for SetValue {
    fn from(s: String) -> Self {
        SetValue::Text(s)
    }
}

impl From<u64> for SetValue {
    fn from(n: u64) -> Self {
        SetValue::Number(n.into())
    }
}

impl From<u32> for SetValue {
    fn from(n: u32) -> Self {
        SetValue::Number(n.into())
    }
}

impl From<i64> for SetValue {
    fn from(n: i64) -> Self {
        SetValue::Number(n.into())
    }
}

impl From<i32> for SetValue {
    fn from(n: i32) -> Self {
        SetValue::Number(n.into())
    }
}

impl From<f64> for SetValue {
    /// A finite float as a JSON number; NaN and the infinities as text
    /// (which the daemon refuses as it refuses any non-rate).
    fn from(x: f64) -> Self {
        serde_json::Number::from_f64(x)
            .map_or_else(|| SetValue::Text(x.to_string()), SetValue::Number)
    }
}

/// A `gen` request's op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenOp {
    Start,
    Set,
    Pause,
    Resume,
    Stop,
    List,
}

impl GenOp {
    pub fn name(self) -> &'static str {
        match self {
            GenOp::Start => "start",
            GenOp::Set => "set",
            GenOp::Pause => "pause",
            GenOp::Resume => "resume",
            GenOp::Stop => "stop",
            GenOp::List => "list",
        }
    }

    fn parse(op: Option<&str>) -> Result<Self, RequestError> {
        Ok(match op {
            Some("list") => GenOp::List,
            Some("start") => GenOp::Start,
            Some("set") => GenOp::Set,
            Some("pause") => GenOp::Pause,
            Some("resume") => GenOp::Resume,
            Some("stop") => GenOp::Stop,
            Some(o) => return Err(RequestError::UnknownGenOp(o.to_string())),
            None => return Err(RequestError::GenNeedsOp),
        })
    }
}

/// A flow set as given over the control socket (CTL.md "Generator flow
/// sets"): every field optional; in `gen set` only the given fields change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    /// Carry a send time stamp in each frame's payload, so that a guest
    /// echoing the payload back to the generator gives a round-trip time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stamp: Option<bool>,
}

// The address and port setters take anything printable (a port as a
// number, a range as text); they only print it.
#[allow(clippy::needless_pass_by_value)]
impl FlowSpec {
    /// A spec with nothing set (every field its default).
    pub fn new() -> Self {
        Self::default()
    }

    #[must_use]
    pub fn flows(mut self, n: u32) -> Self {
        self.flows = Some(n);
        self
    }

    /// An address or an inclusive range `A-B`.
    #[must_use]
    pub fn src(mut self, a: impl ToString) -> Self {
        self.src = Some(a.to_string());
        self
    }

    /// A port or an inclusive range `LO-HI`.
    #[must_use]
    pub fn sport(mut self, p: impl ToString) -> Self {
        self.sport = Some(p.to_string());
        self
    }

    #[must_use]
    pub fn dst(mut self, a: impl ToString) -> Self {
        self.dst = Some(a.to_string());
        self
    }

    /// A port or an inclusive range `LO-HI`.
    #[must_use]
    pub fn dport(mut self, p: impl ToString) -> Self {
        self.dport = Some(p.to_string());
        self
    }

    #[must_use]
    pub fn count(mut self, n: u64) -> Self {
        self.count = Some(n);
        self
    }

    #[must_use]
    pub fn rate(mut self, pps: u64) -> Self {
        self.rate = Some(pps);
        self
    }

    #[must_use]
    pub fn size(mut self, bytes: usize) -> Self {
        self.size = Some(bytes);
        self
    }

    #[must_use]
    pub fn stamp(mut self, on: bool) -> Self {
        self.stamp = Some(on);
        self
    }

    /// `self` with the fields of `over` that are set.
    #[must_use]
    pub fn merged(&self, over: &FlowSpec) -> FlowSpec {
        FlowSpec {
            flows: over.flows.or(self.flows),
            src: over.src.clone().or_else(|| self.src.clone()),
            sport: over.sport.clone().or_else(|| self.sport.clone()),
            dst: over.dst.clone().or_else(|| self.dst.clone()),
            dport: over.dport.clone().or_else(|| self.dport.clone()),
            count: over.count.or(self.count),
            rate: over.rate.or(self.rate),
            size: over.size.or(self.size),
            stamp: over.stamp.or(self.stamp),
        }
    }
}

/// Why a request line is refused before it reaches a command. The
/// `Display` text is the daemon's error reply.
#[derive(Debug)]
pub enum RequestError {
    /// Not a JSON object of the request's fields (includes unknown fields).
    Json(serde_json::Error),
    UnknownCommand(String),
    SetNeedsKey,
    /// No `value`, or one that is neither a string nor a number.
    SetNeedsValue,
    GenNeedsOp,
    UnknownGenOp(String),
    GenSetNeedsId,
}

impl RequestError {
    /// A `gen` request's own error (its op or id): the daemon answers a
    /// `gen` without `--peer gen` with that first.
    pub fn is_gen(&self) -> bool {
        matches!(
            self,
            RequestError::GenNeedsOp | RequestError::UnknownGenOp(_) | RequestError::GenSetNeedsId
        )
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Json(e) => write!(f, "bad request: {e}"),
            RequestError::UnknownCommand(c) => write!(
                f,
                "unknown command {c:?}: expected stats, table, knobs, set or gen"
            ),
            RequestError::SetNeedsKey => f.write_str("set needs \"key\""),
            RequestError::SetNeedsValue => f.write_str("set needs \"value\" (string or number)"),
            RequestError::GenNeedsOp => f.write_str("gen needs \"op\""),
            RequestError::UnknownGenOp(o) => write!(
                f,
                "unknown gen op {o:?}: expected start, set, pause, resume, stop or list"
            ),
            RequestError::GenSetNeedsId => f.write_str("gen set needs \"id\""),
        }
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RequestError::Json(e) => Some(e),
            _ => None,
        }
    }
}

/// Every field any command takes: a field outside these is refused
/// (typos must not pass silently); one a command does not use is ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    cmd: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    value: Option<Value>,
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    id: Option<u32>,
    #[serde(default)]
    flow: Option<FlowSpec>,
}

impl TryFrom<RawRequest> for Request {
    type Error = RequestError;

    fn try_from(r: RawRequest) -> Result<Self, RequestError> {
        Ok(match r.cmd.as_str() {
            "stats" => Request::Stats,
            "table" => Request::Table,
            "trace_flush" => Request::TraceFlush,
            "knobs" => Request::Knobs,
            "set" => {
                let key = r.key.ok_or(RequestError::SetNeedsKey)?;
                let value = match r.value {
                    Some(Value::String(s)) => SetValue::Text(s),
                    Some(Value::Number(n)) => SetValue::Number(n),
                    _ => return Err(RequestError::SetNeedsValue),
                };
                Request::Set { key, value }
            }
            "gen" => {
                let op = GenOp::parse(r.op.as_deref())?;
                if op == GenOp::Set && r.id.is_none() {
                    return Err(RequestError::GenSetNeedsId);
                }
                Request::Gen {
                    op,
                    id: r.id,
                    flow: r.flow,
                }
            }
            other => return Err(RequestError::UnknownCommand(other.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_serialize_as_ctl_md_writes_them() {
        for (r, wire) in [
            (Request::Stats, r#"{"cmd":"stats"}"#),
            (Request::TraceFlush, r#"{"cmd":"trace_flush"}"#),
            (
                Request::set("add_fail_rate", 0.5),
                r#"{"cmd":"set","key":"add_fail_rate","value":0.5}"#,
            ),
            (
                Request::set("program_latency", "2ms"),
                r#"{"cmd":"set","key":"program_latency","value":"2ms"}"#,
            ),
            (
                Request::gen(GenOp::Stop, None, None),
                r#"{"cmd":"gen","op":"stop"}"#,
            ),
            (
                Request::gen(
                    GenOp::Set,
                    Some(3),
                    Some(FlowSpec::new().flows(10).sport("1-10")),
                ),
                r#"{"cmd":"gen","op":"set","id":3,"flow":{"flows":10,"sport":"1-10"}}"#,
            ),
        ] {
            assert_eq!(r.to_string(), wire);
            assert_eq!(Request::from_line(wire).unwrap(), r, "{wire}");
            assert_eq!(serde_json::from_str::<Request>(wire).unwrap(), r, "{wire}");
        }
    }

    #[test]
    fn bad_requests_get_the_daemons_messages() {
        for (bad, why) in [
            ("{", "bad request"),
            (r#"{"cmd":"stats","extra":1}"#, "unknown field"),
            (r#"{"cmd":"nope"}"#, "unknown command \"nope\""),
            (r#"{"cmd":"set","value":1}"#, "set needs \"key\""),
            (
                r#"{"cmd":"set","key":"a","value":true}"#,
                "set needs \"value\"",
            ),
            (r#"{"cmd":"gen"}"#, "gen needs \"op\""),
            (r#"{"cmd":"gen","op":"go"}"#, "unknown gen op \"go\""),
            (
                r#"{"cmd":"gen","op":"set","flow":{}}"#,
                "gen set needs \"id\"",
            ),
            (
                r#"{"cmd":"gen","op":"start","flow":{"flow":1}}"#,
                "unknown field",
            ),
        ] {
            let e = Request::from_line(bad).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
