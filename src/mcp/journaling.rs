//! What `durun mcp` does with the messages it relays: the server's name
//! and its tools' annotations are noted as they pass; a `tools/call` is
//! opened as a step of the run, answered from the journal when the run
//! replays it, and its result recorded before the client has it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::{Value, json};

use super::ToClient;
use crate::config::McpServerConfig;
use crate::protocol::client::{Connection, Outgoing};
use crate::report::say;

/// Where the idempotency key of a `mutate` call goes.
const KEY_META: &str = "io.durun/idempotency-key";

/// The answer to a call once the run `durun mcp` belonged to is gone.
const RUN_GONE: &str = "durun: the run this MCP server belongs to has ended: the call was not forwarded (resume the task to go on)";

/// A client message that goes on to the server.
enum Sent {
    /// As it came.
    Same(Value),
    /// Changed: it carries a key now.
    Changed(Value),
}

impl Sent {
    /// The message's bytes: the client's own line when it is unchanged
    /// and alone.
    fn into_bytes(self, line: Vec<u8>) -> Vec<u8> {
        match self {
            Self::Same(_) => line,
            Self::Changed(message) => message.to_string().into_bytes(),
        }
    }

    fn into_value(self) -> Value {
        match self {
            Self::Same(message) | Self::Changed(message) => message,
        }
    }
}

pub(crate) struct Journaling {
    /// The run, while it is there to talk to.
    run: Mutex<Option<Connection>>,
    /// Whether `durun mcp` started inside a run: once that run is gone, a
    /// call is refused, never forwarded unjournaled (SPEC 17).
    had_run: bool,
    /// `--name`.
    name: Option<String>,
    /// The name the server gave itself in its `initialize` answer.
    server_name: Mutex<Option<String>>,
    /// Tools by name: whether the server marked them `readOnlyHint`.
    read_only: Mutex<HashMap<String, bool>>,
    config: BTreeMap<String, McpServerConfig>,
    /// `[mcp] max_message`.
    max_message: usize,
    /// Requests whose answers matter, by id.
    watched: Mutex<HashMap<String, Watch>>,
}

enum Watch {
    Initialize,
    ToolsList,
    Call {
        step: u64,
    },
    /// A call relayed outside a run: nothing to record, but in flight.
    Relayed,
    /// Any other request: in flight until answered.
    Other,
}

impl Journaling {
    pub(crate) fn new(
        run: Option<Connection>,
        name: Option<String>,
        config: BTreeMap<String, McpServerConfig>,
        max_message: usize,
    ) -> Self {
        Self {
            had_run: run.is_some(),
            run: Mutex::new(run),
            name,
            server_name: Mutex::new(None),
            read_only: Mutex::new(HashMap::new()),
            config,
            max_message,
            watched: Mutex::new(HashMap::new()),
        }
    }

    /// The largest message relayed either way, in bytes.
    pub(crate) fn max_message(&self) -> usize {
        self.max_message
    }

    /// A message from the client: what goes on to the server (it may carry
    /// a key now), or `None` when it was answered here. A JSON-RPC batch is
    /// taken message by message: what is answered here leaves the batch.
    pub(crate) fn on_client_message(&self, line: Vec<u8>, client: &ToClient) -> Option<Vec<u8>> {
        match serde_json::from_slice::<Value>(&line) {
            Ok(Value::Array(batch)) if !batch.is_empty() => {
                let forward: Vec<Value> = batch
                    .into_iter()
                    .filter_map(|message| self.client_message(message, client))
                    .map(Sent::into_value)
                    .collect();
                (!forward.is_empty()).then(|| Value::Array(forward).to_string().into_bytes())
            }
            Ok(message @ Value::Object(_)) => self
                .client_message(message, client)
                .map(|forward| forward.into_bytes(line)),
            _ => Some(line),
        }
    }

    /// One message of the client's: what goes on to the server, if
    /// anything.
    fn client_message(&self, message: Value, client: &ToClient) -> Option<Sent> {
        let Value::Object(mut message) = message else {
            return Some(Sent::Same(message));
        };
        let Some(id) = message.get("id").filter(|id| !id.is_null()).cloned() else {
            return Some(Sent::Same(Value::Object(message)));
        };
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if method.is_some() && self.in_flight(&id) {
            client.error(
                &id,
                &format!(
                    "durun: request id {id} is already in flight; a request needs an id of its own"
                ),
            );
            return None;
        }
        let watch = match method.as_deref() {
            Some("initialize") => Watch::Initialize,
            Some("tools/list") => Watch::ToolsList,
            Some("tools/call") => {
                return match self.call(&id, &mut message, client) {
                    None => {
                        self.watch(&id, Watch::Relayed);
                        Some(Sent::Same(Value::Object(message)))
                    }
                    Some(true) => Some(Sent::Changed(Value::Object(message))),
                    Some(false) => None,
                };
            }
            // A request: its id is in flight until the server answers.
            Some(_) => Watch::Other,
            // The client's answer to a request of the server's.
            None => return Some(Sent::Same(Value::Object(message))),
        };
        self.watch(&id, watch);
        Some(Sent::Same(Value::Object(message)))
    }

    fn in_flight(&self, id: &Value) -> bool {
        self.watched
            .lock()
            .expect("watch lock")
            .contains_key(&id.to_string())
    }

    /// Opens a `tools/call` as a step: `Some(true)` to forward it (its
    /// message changed to carry the key), `Some(false)` when it was
    /// answered here, `None` to relay it untouched (no run).
    fn call(
        &self,
        id: &Value,
        message: &mut serde_json::Map<String, Value>,
        client: &ToClient,
    ) -> Option<bool> {
        let params = message.get_mut("params")?.as_object_mut()?;
        let tool = params.get("name")?.as_str()?.to_owned();
        let args = params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let server = self.server();
        let mutate = self.mutates(&tool);
        let name = format!("mcp {server}/{tool}");
        let answer = {
            let mut run = self.run.lock().expect("run lock");
            let Some(connection) = run.as_mut() else {
                // Outside a run: relayed as it is. After the run: refused.
                if !self.had_run {
                    return None;
                }
                client.error(id, RUN_GONE);
                return Some(false);
            };
            let answer = connection.request(&Outgoing::Begin {
                name: &name,
                args: &args,
                effect: if mutate { "mutate" } else { "read" },
                kind: Some("mcp"),
            });
            match answer {
                Ok(answer) => answer,
                Err(err) => {
                    *run = None;
                    say(&format!(
                        "lost the run ({err:#}); MCP calls from here on are refused, never forwarded unjournaled"
                    ));
                    client.error(id, RUN_GONE);
                    return Some(false);
                }
            }
        };
        if !answer.ok {
            client.error(id, &format!("durun: {}", answer.error_text()));
            return Some(false);
        }
        if answer.replayed {
            let reply = json!({"jsonrpc": "2.0", "id": id, "result": answer.output});
            client.send(reply.to_string().as_bytes());
            return Some(false);
        }
        let Some(step) = answer.step else {
            client.error(
                id,
                "durun: the run opened no step for the call; it was not forwarded",
            );
            return Some(false);
        };
        if mutate && let Some(key) = &answer.idempotency_key {
            let meta = params
                .entry("_meta")
                .or_insert_with(|| json!({}))
                .as_object_mut();
            match meta {
                Some(meta) => {
                    meta.insert(KEY_META.to_owned(), Value::String(key.clone()));
                }
                None => {
                    params.insert("_meta".to_owned(), json!({ KEY_META: key }));
                }
            }
        }
        self.watch(id, Watch::Call { step });
        Some(true)
    }

    /// A message from the server: noted, and for a call's answer recorded;
    /// what goes on to the client.
    pub(crate) fn on_server_message(&self, line: Vec<u8>) -> Vec<u8> {
        match serde_json::from_slice::<Value>(&line) {
            Ok(Value::Object(message)) => self
                .server_message(&message)
                .map_or(line, |replaced| replaced.to_string().into_bytes()),
            // A batch's answers, each taken as a single one.
            Ok(Value::Array(batch)) => {
                let mut changed = false;
                let answers: Vec<Value> = batch
                    .into_iter()
                    .map(|answer| match &answer {
                        Value::Object(message) => {
                            self.server_message(message).map_or(answer, |replaced| {
                                changed = true;
                                replaced
                            })
                        }
                        _ => answer,
                    })
                    .collect();
                if changed {
                    Value::Array(answers).to_string().into_bytes()
                } else {
                    line
                }
            }
            _ => line,
        }
    }

    /// One message of the server's: noted, a call's answer recorded; what
    /// replaces it for the client, if anything does.
    fn server_message(&self, message: &serde_json::Map<String, Value>) -> Option<Value> {
        if message.contains_key("method") {
            return None;
        }
        let id = message.get("id")?;
        let watch = self
            .watched
            .lock()
            .expect("watch lock")
            .remove(&id.to_string())?;
        let result = message.get("result");
        match watch {
            Watch::Initialize => {
                if let Some(name) = result
                    .and_then(|result| result.pointer("/serverInfo/name"))
                    .and_then(Value::as_str)
                {
                    if self.name.is_none() && self.config.contains_key(name) {
                        crate::report::say(&format!(
                            "the MCP server calls itself `{name}`, which does not choose `[mcp.{name}]` in durun.toml: start it with `durun mcp --name {name} -- …` for that section to apply"
                        ));
                    }
                    *self.server_name.lock().expect("name lock") = Some(name.to_owned());
                }
            }
            Watch::ToolsList => {
                let tools = result.and_then(|result| result.get("tools"));
                let mut read_only = self.read_only.lock().expect("tools lock");
                for tool in tools.and_then(Value::as_array).into_iter().flatten() {
                    if let Some(name) = tool.get("name").and_then(Value::as_str) {
                        let hint =
                            tool.pointer("/annotations/readOnlyHint") == Some(&Value::Bool(true));
                        read_only.insert(name.to_owned(), hint);
                    }
                }
            }
            Watch::Call { step } => return self.record(id, step, message),
            Watch::Relayed | Watch::Other => {}
        }
        None
    }

    /// Records a call's answer: a result (one with `isError` too) finishes
    /// the step, a JSON-RPC error fails it. The client gets the answer once
    /// the run has it; if it could not, an error instead.
    fn record(
        &self,
        id: &Value,
        step: u64,
        message: &serde_json::Map<String, Value>,
    ) -> Option<Value> {
        let mut run = self.run.lock().expect("run lock");
        let Some(connection) = run.as_mut() else {
            return Some(Self::unrecorded(id, "the run has ended"));
        };
        let answer = match message.get("result") {
            Some(result) => connection.request(&Outgoing::Commit {
                step,
                output: result,
                usage: &Value::Null,
            }),
            None => {
                let error = message
                    .get("error")
                    .and_then(|error| error.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("JSON-RPC error");
                connection.request(&Outgoing::Fail {
                    step,
                    error,
                    output: message.get("error").unwrap_or(&Value::Null),
                })
            }
        };
        let problem = match answer {
            Ok(answer) if answer.ok => return None,
            Ok(answer) => answer.error_text(),
            Err(err) => {
                *run = None;
                format!("{err:#}")
            }
        };
        Some(Self::unrecorded(id, &problem))
    }

    /// The error a client gets for a call whose answer durun could not
    /// record: it runs again on resume.
    fn unrecorded(id: &Value, problem: &str) -> Value {
        json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32000, "message": format!("durun could not record the call: {problem}")},
        })
    }

    /// Answers every request still in flight with an error: the server
    /// exited before it answered them (SPEC 17).
    pub(crate) fn server_gone(&self, client: &ToClient) {
        let in_flight: Vec<(String, Watch)> =
            self.watched.lock().expect("watch lock").drain().collect();
        for (id, watch) in in_flight {
            let id: Value = serde_json::from_str(&id).unwrap_or(Value::Null);
            client.error(
                &id,
                if matches!(watch, Watch::Call { .. } | Watch::Relayed) {
                    "durun: the MCP server exited before it answered the call (resume the task to run it again)"
                } else {
                    "durun: the MCP server exited before it answered the request"
                },
            );
        }
    }

    fn watch(&self, id: &Value, watch: Watch) {
        self.watched
            .lock()
            .expect("watch lock")
            .insert(id.to_string(), watch);
    }

    /// The server's name in step names.
    fn server(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.server_name.lock().expect("name lock").clone())
            .unwrap_or_else(|| "server".to_owned())
    }

    /// Whether `tool` may change the world: durun.toml's `[mcp.NAME]`
    /// first, then the server's `readOnlyHint`, else it may. The section is
    /// the one `--name` names: a server cannot take another's `read` list
    /// by giving itself that server's name.
    fn mutates(&self, tool: &str) -> bool {
        if let Some(config) = self.name.as_ref().and_then(|name| self.config.get(name)) {
            if config.mutate.iter().any(|name| name == tool) {
                return true;
            }
            if config.read.iter().any(|name| name == tool) {
                return false;
            }
        }
        self.read_only.lock().expect("tools lock").get(tool) != Some(&true)
    }
}
