//! What `durun mcp` does with the messages it relays: the server's name
//! and its tools' annotations are noted as they pass; a `tools/call` is
//! opened as a step of the run, answered from the journal when the run
//! replays it, and its result recorded before the client has it.
//!
//! Here, the client's side: requests, and a `tools/call` made a step (a
//! task-augmented one answered with its task). [`from_server`]: the
//! server's side. [`task_calls`]: the `tasks/*` requests and the calls
//! durun sends itself. [`probes`]: a call in doubt asked about first.

mod from_server;
mod probes;
mod task_calls;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use serde_json::{Value, json};

use super::ToClient;
use super::tasks::{self, Outcome, State, Tasks};
use crate::config::McpServerConfig;
use crate::protocol::client::{Answer, Connection, Outgoing};
use crate::report::say;
use task_calls::{answer_outcome, replayed_state};

/// Sends one message to the server; `false` once it is gone.
pub(crate) type ToServer = Box<dyn Fn(Vec<u8>) -> bool + Send + Sync>;

/// Where the idempotency key of a `mutate` call goes.
const KEY_META: &str = "io.durun/idempotency-key";

/// The answer to a call once the run `durun mcp` belonged to is gone.
const RUN_GONE: &str = "durun: the run this MCP server belongs to has ended: the call was not forwarded (resume the task to go on)";

/// A task's call whose server exited before it answered.
const SERVER_GONE_TASK: &str = "durun: the MCP server exited before it answered the call; it is in doubt, and a later tasks/get or resume runs it again with its key";

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
    /// The server runs tool calls as tasks of its own: a task's call is
    /// relayed as one, and its end fetched with `tasks/result`.
    server_tasks: std::sync::atomic::AtomicBool,
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
    /// MCP tasks (SPEC 22).
    tasks: Tasks,
    /// The tool and arguments of each task's call, to send it again.
    calls: Mutex<HashMap<String, (String, Value)>>,
    /// How this process's own requests reach the server (a call in doubt
    /// sent again), once the transport is up.
    to_server: OnceLock<ToServer>,
    /// Where answers that come later go (a task's `tasks/result`).
    client: ToClient,
    /// The last id of a request of durun's own.
    own_ids: AtomicU64,
    /// Itself, for the threads it starts.
    me: Weak<Journaling>,
}

/// What goes on to the client for a server's message.
enum Out {
    Same,
    Replaced(Value),
    /// Nothing: the client had its answer (a task's call ended).
    Nothing,
}

enum Watch {
    Initialize,
    ToolsList,
    Call {
        step: u64,
        /// The MCP task it runs as, if the client asked for one.
        task: Option<String>,
    },
    /// durun's own probe call: its answer goes to the one waiting for it.
    Probe {
        reply: std::sync::mpsc::Sender<Value>,
    },
    /// Another request of durun's own: its answer goes nowhere.
    Own,
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
        client: ToClient,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            had_run: run.is_some(),
            server_tasks: std::sync::atomic::AtomicBool::new(false),
            run: Mutex::new(run),
            name,
            server_name: Mutex::new(None),
            read_only: Mutex::new(HashMap::new()),
            config,
            max_message,
            watched: Mutex::new(HashMap::new()),
            tasks: Tasks::default(),
            calls: Mutex::new(HashMap::new()),
            to_server: OnceLock::new(),
            client,
            own_ids: AtomicU64::new(0),
            me: me.clone(),
        })
    }

    /// The transport is up: this is how a message reaches the server.
    pub(crate) fn connect_server(&self, to_server: ToServer) {
        let _ = self.to_server.set(to_server);
    }

    /// Waits until every task call this process sent has ended: the
    /// client left, and they run to their ends first (SPEC 22).
    pub(crate) fn drain(&self) {
        self.tasks.drain();
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
        if self.had_run
            && let Some(method) = method
                .as_deref()
                .filter(|method| method.starts_with("tasks/"))
        {
            self.task_request(&id, method, message.get("params"), client);
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
    /// answered here, `None` to relay it untouched (no run). A
    /// task-augmented call is answered with its task at once.
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
        let mutate = self.mutates(&tool);
        let name = format!("mcp {}/{tool}", self.server());
        let ttl = tasks::asked_ttl(params);
        let answer = match self.ask_run(&Outgoing::Begin {
            name: &name,
            args: &args,
            effect: if mutate { "mutate" } else { "read" },
            kind: Some("mcp"),
        }) {
            Ok(answer) => answer,
            // Outside a run: relayed as it is.
            Err(None) => return None,
            Err(Some(problem)) => {
                client.error(id, problem);
                return Some(false);
            }
        };
        if let Some(ttl) = &ttl {
            if answer.replayed {
                let key = answer.idempotency_key.clone().unwrap_or_default();
                self.tasks
                    .add(&key, ttl.clone(), replayed_state(&answer), None);
                self.answer_created(id, &key, client);
                return Some(false);
            }
            // The server's own task where it has them, else durun runs the
            // plain call as the task.
            if !self.server_tasks.load(Ordering::Relaxed) {
                params.remove("task");
            }
        }
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
        let key = answer.idempotency_key.unwrap_or_default();
        if answer.in_doubt
            && let Some(settled) = self.settled_by_probe(&key, step)
        {
            match (ttl, settled) {
                (Some(ttl), settled) => {
                    let state = settled.map_or_else(State::Failed, State::Completed);
                    self.tasks.add(&key, ttl, state, None);
                    self.answer_created(id, &key, client);
                }
                (None, Ok(result)) => answer_outcome(client, id, Outcome::Result(result)),
                (None, Err(error)) => answer_outcome(client, id, Outcome::Error(error)),
            }
            return Some(false);
        }
        if mutate {
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
        let task = ttl.map(|ttl| {
            self.calls
                .lock()
                .expect("calls lock")
                .insert(key.clone(), (tool.clone(), args.clone()));
            self.tasks
                .add(&key, ttl, State::Working { here: true }, Some(id.clone()));
            self.answer_created(id, &key, client);
            key
        });
        self.watch(id, Watch::Call { step, task });
        Some(true)
    }

    /// Asks the run: its answer; `Err(None)` outside a run, `Err(Some)`
    /// with the error for the client once the run is gone.
    fn ask_run(&self, request: &Outgoing<'_>) -> Result<Answer, Option<&'static str>> {
        let mut run = self.run.lock().expect("run lock");
        let Some(connection) = run.as_mut() else {
            return Err(self.had_run.then_some(RUN_GONE));
        };
        connection.request(request).map_err(|err| {
            *run = None;
            say(&format!(
                "lost the run ({err:#}); MCP calls from here on are refused, never forwarded unjournaled"
            ));
            Some(RUN_GONE)
        })
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
