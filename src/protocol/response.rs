//! Answers, one JSON line each, matched to requests by `id`.
//!
//! # Format
//!
//! Every answer has `id` (the request's, echoed exactly) and `ok`. The
//! other members appear only where they mean something:
//!
//! ## `call`
//!
//! `{"id":1,"ok":true,"step":4,"replayed":false,"output":…,"idempotency_key":"…"}`;
//! a failure `{"id":1,"ok":false,"step":4,"error":{…},"output":…}`; a
//! recorded one with `"replayed":true`.
//!
//! ## `begin`
//!
//! A step to run: `{"id":2,"ok":true,"step":5,"replayed":false,"attempt":1,"idempotency_key":"…"}`
//! (`"in_doubt":true` when a run died inside it); a recorded one:
//! `{"id":2,"ok":true,"step":5,"replayed":true,"output":…}`.
//!
//! ## `commit`, `fail`
//!
//! `{"id":3,"ok":true,"step":5}` once the record is durable.
//!
//! ## `result`
//!
//! `{"id":9,"ok":true}`.
//!
//! ## `wait`, `sleep`
//!
//! Like a `call`: `{"id":7,"ok":true,"step":6,"replayed":false,"output":{"signal":…,"data":…,"by":…,"at":…}}`
//! for a `wait`, `"output":{"woke_at":…}` for a `sleep`; a timed-out
//! `wait` fails with code `timeout`.
//!
//! ## `patched`
//!
//! `{"id":4,"ok":true,"patched":true,"step":7}` on a new path (the patch
//! recorded as step 7), `{"id":4,"ok":true,"patched":false}` where the
//! task's recorded path from before the patch goes on.
//!
//! ## `retry`
//!
//! Like `begin`'s: `{"id":5,"ok":true,"step":5,"replayed":false,"attempt":2,"idempotency_key":"…"}`.
//!
//! ## `ahead`, `replayed`
//!
//! `{"id":6,"ok":true,"steps":[{"step":5,"name":"…","idempotency_key":"…","output":…},…]}`:
//! the recorded steps a `begin` would replay, from the agent's next one
//! on; `{"id":7,"ok":true,"step":9}` once steps through 9 are counted
//! replayed.
//!
//! ## `find`
//!
//! An MCP step by its key: `{"id":8,"ok":true,"step":5,"found":{"state":"running",…}}`
//! while it runs; a finished one answered as a replayed `begin`; one in
//! doubt opened for the asker as a `begin` is (`"in_doubt":true`), with
//! `found.name` and `found.args` to run it by.
//!
//! ## Errors
//!
//! `{"id":…,"ok":false,"error":{"code":…,"message":…}}` with a code from
//! [`ErrorCode`]; `"id": null` when the request's id could not be read.

use serde::Serialize;
use serde_json::Value;

use crate::json_text::JsonText;

/// The error codes of SPEC 2.4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    BadRequest,
    UnknownTool,
    ToolFailed,
    Timeout,
    Divergence,
    Cancelled,
    Journal,
    BudgetExceeded,
}

impl ErrorCode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::UnknownTool => "unknown_tool",
            Self::ToolFailed => "tool_failed",
            Self::Timeout => "timeout",
            Self::Divergence => "divergence",
            Self::Cancelled => "cancelled",
            Self::Journal => "journal",
            Self::BudgetExceeded => "budget_exceeded",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        [
            Self::BadRequest,
            Self::UnknownTool,
            Self::ToolFailed,
            Self::Timeout,
            Self::Divergence,
            Self::Cancelled,
            Self::Journal,
            Self::BudgetExceeded,
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
pub(crate) struct ErrorBody {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

/// One response line to the agent.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Response {
    pub(crate) id: Value,
    pub(crate) ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) replayed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) in_doubt: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output: Option<JsonText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) patched: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<ErrorBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) steps: Option<Vec<AheadStep>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) found: Option<Found>,
}

/// What a `find` found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Found {
    /// `running` (an open step someone runs), `finished` (answered as a
    /// replay), `reopened` (it was in doubt: the asker runs it now).
    pub(crate) state: &'static str,
    pub(crate) name: String,
    pub(crate) args: JsonText,
}

/// A recorded step in an `ahead` answer: what a `begin` of this name and
/// key would be answered.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AheadStep {
    pub(crate) step: u64,
    pub(crate) name: String,
    pub(crate) idempotency_key: String,
    pub(crate) output: JsonText,
}

impl Response {
    pub(crate) fn ok(id: Value) -> Self {
        Self {
            id,
            ok: true,
            step: None,
            replayed: None,
            attempt: None,
            in_doubt: None,
            output: None,
            idempotency_key: None,
            patched: None,
            error: None,
            steps: None,
            found: None,
        }
    }

    pub(crate) fn error(id: Value, code: ErrorCode, message: impl Into<String>) -> Self {
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
    pub(crate) fn step(mut self, step: u64) -> Self {
        self.step = Some(step);
        self
    }

    /// The line to write, `\n` included.
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let mut line = Vec::new();
        self.write_line(&mut line);
        line
    }

    /// Appends the response and its newline to `out`.
    pub(crate) fn write_line(&self, out: &mut Vec<u8>) {
        serde_json::to_writer(&mut *out, self).expect("a response always serializes");
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Line, parse_line};

    #[test]
    fn responses_echo_ids_exactly() {
        let id = match parse_line(br#"{"op":"result","id":123456789012345678901234567890}"#) {
            Line::Request(request) => request.id().clone(),
            other => panic!("{other:?}"),
        };
        let line = Response::ok(id).to_line();
        assert_eq!(
            line,
            b"{\"id\":123456789012345678901234567890,\"ok\":true}\n"
        );
    }
}
