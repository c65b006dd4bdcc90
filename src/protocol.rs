//! The JSON-lines wire protocol, version 1.
//!
//! `docs/protocol.md` is the reference for agent authors (every message
//! with examples, the replay rules, the key formula, the limits); this
//! module is its implementation, and keep the two in step.
//!
//! # Transport
//!
//! The agent writes requests on its stdout, one JSON object per line; durun
//! answers on the agent's stdin. A line that is not a JSON object with a
//! string member `op` is not a request: durun copies it to its own stdout.
//!
//! # Requests
//!
//! Every request has `op` and `id` (a string or an integer, echoed back).
//!
//! * `call`: `{"op":"call","id":1,"tool":"create_pr","args":{…}}`. durun
//!   runs the configured tool.
//! * `begin`: `{"op":"begin","id":2,"name":"llm.plan","args":{…},"effect":"read"}`.
//!   The agent runs the step itself unless the answer says `replayed`.
//! * `commit`: `{"op":"commit","id":3,"step":5,"output":…,"usage":{…}}`.
//! * `fail`: `{"op":"fail","id":3,"step":5,"error":"…","output":…}`.
//! * `result`: `{"op":"result","id":9,"output":…}`, the task's final output.
//!
//! An optional member sent as `null` counts as absent, except `args`.
//!
//! # Responses
//!
//! Every response has `id` and `ok`; `"ok": false` carries
//! `"error": {"code": …, "message": …}` with a code from [`ErrorCode`].
//!
//! Requests are decoded from a parsed `serde_json::Value` by hand rather than
//! with a derived tagged enum: serde's internally tagged enums lose numbers
//! under `arbitrary_precision` (which the step key needs), and a hand decoder
//! names the exact member that is wrong.

use serde::{Deserialize as _, Serialize};
use serde_json::{Map, Value};

use crate::json_text::JsonText;

/// The protocol version in `DURUN_PROTOCOL`.
pub const VERSION: u32 = 1;

/// The longest line durun reads whole; a longer one is answered
/// `bad_request` and skipped.
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// Whether a step is safe to repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    Read,
    Mutate,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Mutate => "mutate",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "read" => Some(Self::Read),
            "mutate" => Some(Self::Mutate),
            _ => None,
        }
    }
}

/// One request from the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Call {
        id: Value,
        tool: String,
        args: Value,
    },
    Begin {
        id: Value,
        name: String,
        args: Value,
        effect: Option<Effect>,
    },
    Commit {
        id: Value,
        step: u64,
        output: Value,
        usage: Option<Value>,
    },
    Fail {
        id: Value,
        step: u64,
        error: String,
        output: Option<Value>,
    },
    Result {
        id: Value,
        output: Value,
    },
}

impl Request {
    pub fn id(&self) -> &Value {
        match self {
            Self::Call { id, .. }
            | Self::Begin { id, .. }
            | Self::Commit { id, .. }
            | Self::Fail { id, .. }
            | Self::Result { id, .. } => id,
        }
    }
}

/// What one line from the agent is.
#[derive(Debug)]
pub enum Line {
    /// Not a request: copied to durun's stdout unchanged.
    Passthrough,
    Request(Request),
    /// A request that cannot be served; answered `bad_request`.
    Invalid {
        id: Value,
        message: String,
    },
}

/// The deepest nesting a request may have. Python's `json` reads a little
/// less than 1,000 levels, so no Python agent sends deeper.
pub const MAX_DEPTH: usize = 1000;

/// Classifies one line (without its `\n`).
///
/// Whatever Python's `json.loads` reads as an object with a string `op` is
/// a request and gets an answer: `NaN`, `Infinity` and lone surrogates,
/// which cannot be journaled as JSON, get `bad_request` naming them.
pub fn parse_line(bytes: &[u8]) -> Line {
    let object = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(object)) => object,
        Ok(_) => return Line::Passthrough,
        Err(err) => return parse_unusual(bytes, &err),
    };
    classify(object)
}

fn classify(object: Map<String, Value>) -> Line {
    let Some(Value::String(op)) = object.get("op") else {
        return Line::Passthrough;
    };
    let op = op.clone();
    match decode(&op, object) {
        Ok(request) => Line::Request(request),
        Err((id, message)) => Line::Invalid { id, message },
    }
}

/// A line serde's first reading refused: deeper than its default limit, or
/// holding what Python reads and JSON does not have.
fn parse_unusual(bytes: &[u8], err: &serde_json::Error) -> Line {
    if err.to_string().starts_with("recursion limit exceeded") {
        if depth(bytes) > MAX_DEPTH {
            let head = &bytes[..bytes.len().min(64 * 1024)];
            if bytes.trim_ascii_start().starts_with(b"{") && names_an_op(head) {
                return Line::Invalid {
                    id: sniff_id(head),
                    message: format!("the request is nested deeper than {MAX_DEPTH} levels"),
                };
            }
            return Line::Passthrough;
        }
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        deserializer.disable_recursion_limit();
        return match Value::deserialize(&mut deserializer).and_then(|value| {
            deserializer.end()?;
            Ok(value)
        }) {
            Ok(Value::Object(object)) => classify(object),
            Ok(_) => Line::Passthrough,
            Err(err) => parse_unusual_values(bytes, &err),
        };
    }
    parse_unusual_values(bytes, err)
}

/// `NaN`, `Infinity`, `-Infinity` and lone surrogate escapes: Python's
/// `json` writes and reads them, JSON has none of them.
fn parse_unusual_values(bytes: &[u8], _err: &serde_json::Error) -> Line {
    let Some((json, problem)) = without_python_extras(bytes) else {
        return Line::Passthrough;
    };
    if depth(&json) > MAX_DEPTH {
        return Line::Passthrough;
    }
    let mut deserializer = serde_json::Deserializer::from_slice(&json);
    deserializer.disable_recursion_limit();
    let Ok(Value::Object(object)) = Value::deserialize(&mut deserializer) else {
        return Line::Passthrough;
    };
    match classify(object) {
        Line::Passthrough => Line::Passthrough,
        Line::Request(request) => Line::Invalid {
            id: request.id().clone(),
            message: problem,
        },
        Line::Invalid { id, .. } => Line::Invalid {
            id,
            message: problem,
        },
    }
}

/// Whether the first bytes of a line name an `op`, as a request would.
pub fn names_an_op(head: &[u8]) -> bool {
    head.windows(4).any(|window| window == b"\"op\"")
}

/// The `id` of a request from the first bytes of its line, where it can be
/// read: a string or an integer after `"id":`.
pub fn sniff_id(head: &[u8]) -> Value {
    let Some(at) = head.windows(4).position(|w| w == b"\"id\"") else {
        return Value::Null;
    };
    let rest = &head[at + 4..];
    let rest = rest.trim_ascii_start();
    let Some(rest) = rest.strip_prefix(b":") else {
        return Value::Null;
    };
    let mut values =
        serde_json::Deserializer::from_slice(rest.trim_ascii_start()).into_iter::<Value>();
    match values.next() {
        Some(Ok(id @ Value::String(_))) => id,
        Some(Ok(Value::Number(n))) if !n.to_string().contains(['.', 'e', 'E']) => Value::Number(n),
        _ => Value::Null,
    }
}

/// How deep the line's brackets nest, strings skipped.
fn depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &byte in bytes {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The line with Python's extras replaced (`null` for the numbers, U+FFFD
/// for a lone surrogate), and what was found, as the answer's message; or
/// `None` when it holds none.
fn without_python_extras(bytes: &[u8]) -> Option<(Vec<u8>, String)> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut found: Option<String> = None;
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if in_string {
            match rest[0] {
                b'"' => {
                    in_string = false;
                    out.push(b'"');
                    i += 1;
                }
                b'\\' if rest.get(1) == Some(&b'u') => {
                    let unit = hex_unit(&rest[2..]);
                    let next = rest
                        .get(6..8)
                        .filter(|e| *e == b"\\u")
                        .and_then(|_| hex_unit(&rest[8..]));
                    match unit {
                        Some(0xD800..=0xDBFF)
                            if next.is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) =>
                        {
                            out.extend_from_slice(&rest[..12]);
                            i += 12;
                        }
                        Some(lone @ 0xD800..=0xDFFF) => {
                            found.get_or_insert_with(|| format!(
                                "a string holds a lone surrogate (\\u{lone:04x}), which is not text and cannot be journaled; send the bytes encoded (base64) or drop them"
                            ));
                            out.extend_from_slice(b"\\ufffd");
                            i += 6;
                        }
                        _ => {
                            out.extend_from_slice(&rest[..2.min(rest.len())]);
                            i += 2;
                        }
                    }
                }
                b'\\' => {
                    out.extend_from_slice(&rest[..2.min(rest.len())]);
                    i += 2;
                }
                byte => {
                    out.push(byte);
                    i += 1;
                }
            }
            continue;
        }
        let word = [&b"-Infinity"[..], b"Infinity", b"NaN"]
            .into_iter()
            .find(|word| rest.starts_with(word));
        if let Some(word) = word {
            let name = String::from_utf8_lossy(word);
            found.get_or_insert_with(|| format!(
                "the request holds {name}, which is not JSON and cannot be journaled; send null, a number or a string instead"
            ));
            out.extend_from_slice(b"null");
            i += word.len();
            continue;
        }
        if rest[0] == b'"' {
            in_string = true;
        }
        out.push(rest[0]);
        i += 1;
    }
    found.map(|problem| (out, problem))
}

/// The code unit of four hex digits at the start of `bytes`.
fn hex_unit(bytes: &[u8]) -> Option<u32> {
    let digits = std::str::from_utf8(bytes.get(..4)?).ok()?;
    u32::from_str_radix(digits, 16).ok()
}

type DecodeError = (Value, String);

fn decode(op: &str, mut object: Map<String, Value>) -> Result<Request, DecodeError> {
    let id = match object.remove("id") {
        Some(id @ Value::String(_)) => id,
        Some(Value::Number(number)) if is_integer_literal(&number.to_string()) => {
            Value::Number(number)
        }
        Some(Value::Null) | None => {
            return Err((Value::Null, format!("`{op}` request has no `id`")));
        }
        Some(_) => {
            return Err((
                Value::Null,
                "`id` must be a string or an integer".to_owned(),
            ));
        }
    };
    let fail = |message: String| (id.clone(), message);
    let request = match op {
        "call" => Request::Call {
            tool: required_string(&mut object, "tool", op).map_err(fail)?,
            args: object.remove("args").unwrap_or_else(empty_object),
            id: id.clone(),
        },
        "begin" => Request::Begin {
            name: required_string(&mut object, "name", op).map_err(fail)?,
            args: object.remove("args").unwrap_or_else(empty_object),
            effect: match optional(&mut object, "effect") {
                None => None,
                Some(Value::String(text)) => Some(Effect::parse(&text).ok_or_else(|| {
                    fail(format!(
                        "`effect` must be \"read\" or \"mutate\", not {text:?}"
                    ))
                })?),
                Some(_) => return Err(fail("`effect` must be a string".to_owned())),
            },
            id: id.clone(),
        },
        "commit" => Request::Commit {
            step: required_step(&mut object, op).map_err(fail)?,
            output: object.remove("output").unwrap_or(Value::Null),
            usage: match optional(&mut object, "usage") {
                None => None,
                Some(usage @ Value::Object(_)) => Some(usage),
                Some(_) => return Err(fail("`usage` must be an object".to_owned())),
            },
            id: id.clone(),
        },
        "fail" => Request::Fail {
            step: required_step(&mut object, op).map_err(fail)?,
            error: match optional(&mut object, "error") {
                Some(Value::String(text)) if text.contains('\0') => {
                    return Err(fail(
                        "`error` of a `fail` request must not hold a NUL character (\\u0000); put exact bytes in `output`"
                            .to_owned(),
                    ))
                }
                Some(Value::String(text)) => text,
                None => "failed".to_owned(),
                Some(_) => return Err(fail("`error` must be a string".to_owned())),
            },
            output: optional(&mut object, "output"),
            id: id.clone(),
        },
        "result" => Request::Result {
            output: object.remove("output").unwrap_or(Value::Null),
            id: id.clone(),
        },
        other => return Err(fail(format!("unknown op {other:?}"))),
    };
    Ok(request)
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

fn optional(object: &mut Map<String, Value>, name: &str) -> Option<Value> {
    object.remove(name).filter(|value| !value.is_null())
}

fn required_string(
    object: &mut Map<String, Value>,
    name: &str,
    op: &str,
) -> Result<String, String> {
    match optional(object, name) {
        // PostgreSQL takes no NUL in text: refused before anything is
        // written, on every journal alike.
        Some(Value::String(text)) if text.contains('\0') => Err(format!(
            "`{name}` of a `{op}` request must not hold a NUL character (\\u0000)"
        )),
        Some(Value::String(text)) if !text.is_empty() => Ok(text),
        Some(Value::String(_)) => Err(format!("`{name}` of a `{op}` request must not be empty")),
        Some(_) => Err(format!("`{name}` of a `{op}` request must be a string")),
        None => Err(format!("`{op}` request has no `{name}`")),
    }
}

fn required_step(object: &mut Map<String, Value>, op: &str) -> Result<u64, String> {
    match optional(object, "step") {
        Some(Value::Number(number)) => number
            .as_u64()
            .filter(|step| *step > 0)
            .ok_or_else(|| format!("`step` of a `{op}` request must be a positive integer")),
        Some(_) => Err(format!(
            "`step` of a `{op}` request must be a positive integer"
        )),
        None => Err(format!("`{op}` request has no `step`")),
    }
}

fn is_integer_literal(literal: &str) -> bool {
    !literal.contains(['.', 'e', 'E'])
}

/// The error codes of SPEC 2.4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    BadRequest,
    UnknownTool,
    ToolFailed,
    Timeout,
    Divergence,
    Cancelled,
    Journal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::UnknownTool => "unknown_tool",
            Self::ToolFailed => "tool_failed",
            Self::Timeout => "timeout",
            Self::Divergence => "divergence",
            Self::Cancelled => "cancelled",
            Self::Journal => "journal",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::BadRequest,
            Self::UnknownTool,
            Self::ToolFailed,
            Self::Timeout,
            Self::Divergence,
            Self::Cancelled,
            Self::Journal,
        ]
        .into_iter()
        .find(|code| code.as_str() == text)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// One response line to the agent.
#[derive(Debug, Clone, Serialize)]
pub struct Response {
    pub id: Value,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_doubt: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<JsonText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Response {
    pub fn ok(id: Value) -> Self {
        Self {
            id,
            ok: true,
            step: None,
            replayed: None,
            attempt: None,
            in_doubt: None,
            output: None,
            idempotency_key: None,
            error: None,
        }
    }

    pub fn error(id: Value, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(ErrorBody {
                code,
                message: message.into(),
            }),
            ..Self::ok(id)
        }
    }

    #[must_use]
    pub fn step(mut self, step: u64) -> Self {
        self.step = Some(step);
        self
    }

    /// The line to write, `\n` included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = Vec::new();
        self.write_line(&mut line);
        line
    }

    /// Appends the response and its newline to `out`.
    pub fn write_line(&self, out: &mut Vec<u8>) {
        serde_json::to_writer(&mut *out, self).expect("a response always serializes");
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(text: &str) -> Request {
        match parse_line(text.as_bytes()) {
            Line::Request(request) => request,
            other => panic!("{text} parsed as {other:?}"),
        }
    }

    fn invalid(text: &str) -> (Value, String) {
        match parse_line(text.as_bytes()) {
            Line::Invalid { id, message } => (id, message),
            other => panic!("{text} parsed as {other:?}"),
        }
    }

    #[test]
    fn lines_that_are_not_requests_pass_through() {
        for line in [
            "hello",
            "",
            "[1,2]",
            r#"{"op":1}"#,
            r#"{"x":"call"}"#,
            "\u{fffd}",
            "{\"op\":\"call\"",
        ] {
            assert!(
                matches!(parse_line(line.as_bytes()), Line::Passthrough),
                "{line}"
            );
        }
        assert!(matches!(parse_line(b"\xff\xfe"), Line::Passthrough));
    }

    #[test]
    fn decodes_every_op() {
        assert_eq!(
            request(r#"{"op":"call","id":1,"tool":"t"}"#),
            Request::Call {
                id: json!(1),
                tool: "t".into(),
                args: json!({})
            }
        );
        assert_eq!(
            request(r#"{"op":"begin","id":"a","name":"n","args":null,"effect":"mutate"}"#),
            Request::Begin {
                id: json!("a"),
                name: "n".into(),
                args: Value::Null,
                effect: Some(Effect::Mutate)
            }
        );
        assert_eq!(
            request(r#"{"op":"commit","id":2,"step":5,"output":"x","usage":null}"#),
            Request::Commit {
                id: json!(2),
                step: 5,
                output: json!("x"),
                usage: None
            }
        );
        assert_eq!(
            request(r#"{"op":"fail","id":3,"step":5,"error":"boom"}"#),
            Request::Fail {
                id: json!(3),
                step: 5,
                error: "boom".into(),
                output: None
            }
        );
        assert_eq!(
            request(r#"{"op":"result","id":9,"output":{"a":1}}"#),
            Request::Result {
                id: json!(9),
                output: json!({"a": 1})
            }
        );
    }

    #[test]
    fn bad_requests_name_their_id_where_it_can_be_read() {
        assert_eq!(invalid(r#"{"op":"call"}"#).0, Value::Null);
        assert_eq!(
            invalid(r#"{"op":"call","id":1.5,"tool":"t"}"#).0,
            Value::Null
        );
        let (id, message) = invalid(r#"{"op":"call","id":7}"#);
        assert_eq!(
            (id, message.as_str()),
            (json!(7), "`call` request has no `tool`")
        );
        assert_eq!(invalid(r#"{"op":"nope","id":"x"}"#).0, json!("x"));
        assert!(
            invalid(r#"{"op":"commit","id":1,"step":0}"#)
                .1
                .contains("positive")
        );
        assert!(
            invalid(r#"{"op":"begin","id":1,"name":"n","effect":"write"}"#)
                .1
                .contains("effect")
        );
    }

    #[test]
    fn what_python_writes_gets_an_answer() {
        for (line, says) in [
            (r#"{"op":"call","id":4,"tool":"t","args":{"x":NaN}}"#, "NaN"),
            (
                r#"{"op":"call","id":4,"tool":"t","args":[Infinity]}"#,
                "Infinity",
            ),
            (
                r#"{"op":"call","id":4,"tool":"t","args":[-Infinity]}"#,
                "-Infinity",
            ),
            (
                r#"{"op":"call","id":4,"tool":"t","args":"\udcff"}"#,
                "lone surrogate (\\udcff)",
            ),
            (
                r#"{"op":"call","id":4,"tool":"t","args":"a\ud800b"}"#,
                "lone surrogate (\\ud800)",
            ),
            (r#"{"op":"begin","id":4,"name":"a\u0000b"}"#, "NUL"),
            (r#"{"op":"fail","id":4,"step":1,"error":"a\u0000b"}"#, "NUL"),
        ] {
            let (id, message) = invalid(line);
            assert_eq!(id, json!(4), "{line}");
            assert!(message.contains(says), "{line}: {message}");
        }
        // A surrogate pair and "NaN" inside a string are fine.
        assert!(matches!(
            parse_line(
                r#"{"op":"call","id":1,"tool":"t","args":["\ud83d\ude00","NaN"]}"#.as_bytes()
            ),
            Line::Request(_)
        ));
        // Not requests: still passed through.
        assert!(matches!(parse_line(b"[NaN]"), Line::Passthrough));
        assert!(matches!(parse_line(br#"{"x": NaN}"#), Line::Passthrough));
    }

    #[test]
    fn deep_requests_are_read_to_a_thousand_levels() {
        let nested = |depth: usize| {
            format!(
                r#"{{"op":"call","id":9,"tool":"t","args":{}1{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        assert!(matches!(
            parse_line(nested(998).as_bytes()),
            Line::Request(_)
        ));
        let (id, message) = invalid(&nested(5000));
        assert_eq!(id, json!(9));
        assert!(message.contains("deeper than 1000"), "{message}");
        assert!(matches!(
            parse_line(format!("{}{}", "[".repeat(5000), "]".repeat(5000)).as_bytes()),
            Line::Passthrough
        ));
    }

    #[test]
    fn responses_echo_ids_exactly() {
        let id = request(r#"{"op":"result","id":123456789012345678901234567890}"#)
            .id()
            .clone();
        let line = Response::ok(id).to_line();
        assert_eq!(
            line,
            b"{\"id\":123456789012345678901234567890,\"ok\":true}\n"
        );
    }
}
