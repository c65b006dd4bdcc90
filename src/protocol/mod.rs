//! The JSON-lines wire protocol, version 1.
//!
//! `docs/protocol.md` is the reference for agent authors (every message
//! with examples, the replay rules, the key formula, the limits); this
//! module is its implementation, and keep the two in step. Requests and
//! their decoding are in `request`, what Python writes beyond JSON in
//! `lenient`, answers in `response`.
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
//! * `wait`: `{"op":"wait","id":7,"name":"approve-deploy","data":…,"timeout":"48h"}`,
//!   a step answered by a signal (SPEC 8).
//! * `sleep`: `{"op":"sleep","id":8,"seconds":3600}` or `{"op":"sleep","id":8,"until":"…"}`.
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

pub(crate) mod client;
mod lenient;
mod request;
mod response;

use serde::Serialize;

pub(crate) use lenient::{names_an_op, sniff_id};
pub(crate) use request::{Closes, Line, MAX_SLEEP_SECONDS, Request, Wake, parse_line};
pub(crate) use response::{AheadStep, ErrorCode, Found, Response};

/// The protocol version in `DURUN_PROTOCOL`.
pub(crate) const VERSION: u32 = 1;

/// The deepest nesting a request may have. Python's `json` reads a little
/// less than 1,000 levels, so no Python agent sends deeper.
pub(crate) const MAX_DEPTH: usize = 1000;

/// The longest line durun reads whole; a longer one is answered
/// `bad_request` and skipped.
pub(crate) const MAX_LINE: usize = 64 * 1024 * 1024;

/// Whether a step is safe to repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Effect {
    Read,
    Mutate,
}

impl Effect {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Mutate => "mutate",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "read" => Some(Self::Read),
            "mutate" => Some(Self::Mutate),
            _ => None,
        }
    }
}
