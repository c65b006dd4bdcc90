//! Probes of MCP servers (SPEC 22): before a call in doubt goes again,
//! `[mcp.NAME] probe` names a tool that says whether its key took effect;
//! a result finishes the step as `reconciled`.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Journaling, Watch};
use crate::report::say;

/// How long a probe may take to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

impl Journaling {
    /// Asks the server whether the call in doubt with key `key` took
    /// effect, when `[mcp.NAME] probe` names a tool for it (SPEC 22): its
    /// result when it did (not `isError`), else `None` (it did not, or the
    /// probe could not tell), and the call goes again with its key.
    pub(super) fn probed(&self, key: &str) -> Option<Value> {
        let tool = self
            .name
            .as_ref()
            .and_then(|name| self.config.get(name))
            .and_then(|config| config.probe.clone())?;
        let own = self.own_id();
        let (reply, answer) = std::sync::mpsc::channel();
        self.watch(&own, Watch::Probe { reply });
        let message = json!({
            "jsonrpc": "2.0",
            "id": own,
            "method": "tools/call",
            "params": {"name": tool, "arguments": {"idempotency_key": key}},
        });
        let why = if self.send_server(message.to_string().into_bytes()) {
            match answer.recv_timeout(PROBE_TIMEOUT) {
                Ok(answer) => match answer.get("result") {
                    Some(result) if result.get("isError") != Some(&Value::Bool(true)) => {
                        return Some(result.clone());
                    }
                    Some(_) => {
                        say(&format!(
                            "the probe `{tool}` says the call in doubt with key {key} did not take effect: it goes again with its key"
                        ));
                        return None;
                    }
                    None => format!(
                        "it answered an error: {}",
                        answer
                            .pointer("/error/message")
                            .and_then(Value::as_str)
                            .unwrap_or("no message")
                    ),
                },
                Err(_) => format!("no answer in {} s", PROBE_TIMEOUT.as_secs()),
            }
        } else {
            "the server is gone".to_owned()
        };
        self.watched
            .lock()
            .expect("watch lock")
            .remove(&own.to_string());
        say(&format!(
            "the probe `{tool}` could not tell whether the call in doubt with key {key} took effect ({why}): it goes again with its key"
        ));
        None
    }

    /// Asks the probe about the call in doubt with `key`, step `step`:
    /// when it took effect, its result, recorded as the step's end
    /// (`reconciled`), or the error that it could not be; `None` when the
    /// call is to go again.
    pub(super) fn settled_by_probe(&self, key: &str, step: u64) -> Option<Result<Value, Value>> {
        let result = self.probed(key)?;
        let mut message = serde_json::Map::new();
        message.insert("result".to_owned(), result.clone());
        Some(match self.record(&Value::Null, step, &message, true) {
            None => Ok(result),
            Some(unrecorded) => Err(unrecorded["error"].clone()),
        })
    }
}
