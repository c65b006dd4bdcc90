//! `durun mcp` (SPEC 13): an MCP server that relays every message between
//! the client on its stdin/stdout and the real server (a command, or a URL
//! on the streamable HTTP transport), and makes each `tools/call` a step of
//! the run it finds itself in.
//!
//! # Invariant
//!
//! A `tools/call` answered from the journal never reaches the server; one
//! that is not read-only reaches it only once its intent is durable, with
//! the step's key in `params._meta["io.durun/idempotency-key"]`; and the
//! client gets a result only once it is recorded.

mod http;
mod journaling;
mod run;
mod stdio;
mod tasks;

use std::io::Write as _;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

pub(crate) use journaling::Journaling;
pub(crate) use run::find_socket;
pub(crate) use stdio::{for_each_line, relay_command};

/// The client's side: where messages to it go, one line each.
#[derive(Clone)]
pub(crate) struct ToClient(Arc<Mutex<std::io::Stdout>>);

impl ToClient {
    pub(crate) fn new() -> Self {
        Self(Arc::new(Mutex::new(std::io::stdout())))
    }

    /// Writes one message; `false` once the client is gone.
    pub(crate) fn send(&self, message: &[u8]) -> bool {
        let mut out = self.0.lock().expect("stdout lock");
        out.write_all(message)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush())
            .is_ok()
    }

    /// Answers request `id` with a JSON-RPC error.
    pub(crate) fn error(&self, id: &Value, message: &str) -> bool {
        let answer = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32000, "message": message},
        });
        self.send(answer.to_string().as_bytes())
    }
}

pub(crate) use http::relay_url;
