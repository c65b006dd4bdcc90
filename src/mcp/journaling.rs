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

pub(crate) struct Journaling {
    /// The run, while it is there to talk to.
    run: Mutex<Option<Connection>>,
    /// `--name`.
    name: Option<String>,
    /// The name the server gave itself in its `initialize` answer.
    server_name: Mutex<Option<String>>,
    /// Tools by name: whether the server marked them `readOnlyHint`.
    read_only: Mutex<HashMap<String, bool>>,
    config: BTreeMap<String, McpServerConfig>,
    /// Requests whose answers matter, by id.
    watched: Mutex<HashMap<String, Watch>>,
}

enum Watch {
    Initialize,
    ToolsList,
    Call { step: u64 },
}

impl Journaling {
    pub(crate) fn new(
        run: Option<Connection>,
        name: Option<String>,
        config: BTreeMap<String, McpServerConfig>,
    ) -> Self {
        Self {
            run: Mutex::new(run),
            name,
            server_name: Mutex::new(None),
            read_only: Mutex::new(HashMap::new()),
            config,
            watched: Mutex::new(HashMap::new()),
        }
    }

    /// A message from the client: what goes on to the server (it may carry
    /// a key now), or `None` when it was answered here.
    pub(crate) fn on_client_message(&self, line: Vec<u8>, client: &ToClient) -> Option<Vec<u8>> {
        let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(&line) else {
            return Some(line);
        };
        let Some(id) = message.get("id").filter(|id| !id.is_null()).cloned() else {
            return Some(line);
        };
        let watch = match message.get("method").and_then(Value::as_str) {
            Some("initialize") => Watch::Initialize,
            Some("tools/list") => Watch::ToolsList,
            Some("tools/call") => {
                return self
                    .call(&id, &mut message, client)
                    .map_or(Some(line), |forward| {
                        forward.then(|| Value::Object(message).to_string().into_bytes())
                    });
            }
            _ => return Some(line),
        };
        self.watch(&id, watch);
        Some(line)
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
            let connection = run.as_mut()?;
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
                        "lost the run ({err:#}); MCP calls from here on are relayed without being journaled"
                    ));
                    return None;
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
        let step = answer.step?;
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
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(&line) else {
            return line;
        };
        if message.contains_key("method") {
            return line;
        }
        let Some(id) = message.get("id") else {
            return line;
        };
        let Some(watch) = self
            .watched
            .lock()
            .expect("watch lock")
            .remove(&id.to_string())
        else {
            return line;
        };
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
            Watch::Call { step } => return self.record(id, step, &message, line),
        }
        line
    }

    /// Records a call's answer: a result (one with `isError` too) finishes
    /// the step, a JSON-RPC error fails it. The client gets the answer once
    /// the run has it; if it could not, an error instead.
    fn record(
        &self,
        id: &Value,
        step: u64,
        message: &serde_json::Map<String, Value>,
        line: Vec<u8>,
    ) -> Vec<u8> {
        let mut run = self.run.lock().expect("run lock");
        let Some(connection) = run.as_mut() else {
            return line;
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
            Ok(answer) if answer.ok => return line,
            Ok(answer) => answer.error_text(),
            Err(err) => {
                *run = None;
                format!("{err:#}")
            }
        };
        let error = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": -32000, "message": format!("durun could not record the call: {problem}")},
        });
        error.to_string().into_bytes()
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
