//! What `durun mcp` does with the messages it relays: the server's name
//! and its tools' annotations are noted as they pass; a `tools/call` is
//! opened as a step of the run, answered from the journal when the run
//! replays it, and its result recorded before the client has it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use serde_json::{Value, json};

use super::ToClient;
use super::tasks::{self, Outcome, State, Tasks};
use crate::config::McpServerConfig;
use crate::protocol::client::{Answer, Connection, Outgoing};
use crate::report::say;

/// Sends one message to the server; `false` once it is gone.
pub(crate) type ToServer = Box<dyn Fn(Vec<u8>) -> bool + Send + Sync>;

/// Where the idempotency key of a `mutate` call goes.
const KEY_META: &str = "io.durun/idempotency-key";

/// The answer to a call once the run `durun mcp` belonged to is gone.
const RUN_GONE: &str = "durun: the run this MCP server belongs to has ended: the call was not forwarded (resume the task to go on)";

/// How long a probe may take to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

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
            && let Some(result) = self.probed(&key)
        {
            let (state, reply) = match self.reconcile(id, step, &result) {
                Ok(()) => (
                    State::Completed(result.clone()),
                    json!({"jsonrpc": "2.0", "id": id, "result": result}),
                ),
                Err(unrecorded) => (State::Failed(unrecorded["error"].clone()), unrecorded),
            };
            match ttl {
                Some(ttl) => {
                    self.tasks.add(&key, ttl, state, None);
                    self.answer_created(id, &key, client);
                }
                None => {
                    client.send(reply.to_string().as_bytes());
                }
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

    /// Answers request `id` with the `CreateTaskResult` of task `task`.
    fn answer_created(&self, id: &Value, task: &str, client: &ToClient) {
        let shown = self.tasks.shown(task).unwrap_or(Value::Null);
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": {"task": shown}});
        client.send(reply.to_string().as_bytes());
    }

    /// A message from the server: noted, and for a call's answer recorded;
    /// what goes on to the client, if anything.
    pub(crate) fn on_server_message(&self, line: Vec<u8>) -> Option<Vec<u8>> {
        match serde_json::from_slice::<Value>(&line) {
            Ok(Value::Object(message)) => match self.server_message(&message) {
                Out::Same => Some(line),
                Out::Replaced(replaced) => Some(replaced.to_string().into_bytes()),
                Out::Nothing => None,
            },
            // A batch's answers, each taken as a single one.
            Ok(Value::Array(batch)) => {
                let mut changed = false;
                let answers: Vec<Value> = batch
                    .into_iter()
                    .filter_map(|answer| match &answer {
                        Value::Object(message) => match self.server_message(message) {
                            Out::Same => Some(answer),
                            Out::Replaced(replaced) => {
                                changed = true;
                                Some(replaced)
                            }
                            Out::Nothing => {
                                changed = true;
                                None
                            }
                        },
                        _ => Some(answer),
                    })
                    .collect();
                if !changed {
                    Some(line)
                } else if answers.is_empty() {
                    None
                } else {
                    Some(Value::Array(answers).to_string().into_bytes())
                }
            }
            _ => Some(line),
        }
    }

    /// One message of the server's: noted, a call's answer recorded; what
    /// goes on to the client.
    fn server_message(&self, message: &serde_json::Map<String, Value>) -> Out {
        if message.contains_key("method") {
            return Out::Same;
        }
        let Some(id) = message.get("id") else {
            return Out::Same;
        };
        let Some(watch) = self
            .watched
            .lock()
            .expect("watch lock")
            .remove(&id.to_string())
        else {
            return Out::Same;
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
                if result
                    .and_then(|result| result.pointer("/capabilities/tasks/requests/tools/call"))
                    .is_some()
                {
                    self.server_tasks.store(true, Ordering::Relaxed);
                }
                if self.had_run && result.is_some() {
                    // durun runs any tool call as a task (SPEC 22).
                    let mut message = Value::Object(message.clone());
                    if let Some(capabilities) = message
                        .pointer_mut("/result/capabilities")
                        .and_then(Value::as_object_mut)
                    {
                        capabilities.insert(
                            "tasks".to_owned(),
                            json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
                        );
                        return Out::Replaced(message);
                    }
                }
            }
            Watch::ToolsList => return self.tools_listed(message),
            Watch::Call {
                step,
                task: Some(task),
            } if server_task(result).is_some() => {
                self.follow_server_task(step, task, server_task(result).unwrap_or_default());
                return Out::Nothing;
            }
            Watch::Call { step, task } => {
                let recorded = self.record(id, step, message, false);
                let Some(task) = task else {
                    return recorded.map_or(Out::Same, Out::Replaced);
                };
                let state = match (recorded, result) {
                    (None, Some(result)) => State::Completed(result.clone()),
                    (None, None) => {
                        State::Failed(message.get("error").cloned().unwrap_or(Value::Null))
                    }
                    (Some(unrecorded), _) => {
                        State::Failed(unrecorded.get("error").cloned().unwrap_or(Value::Null))
                    }
                };
                self.end_task(&task, state);
                return Out::Nothing;
            }
            Watch::Probe { reply } => {
                let _ = reply.send(Value::Object(message.clone()));
                return Out::Nothing;
            }
            Watch::Own => return Out::Nothing,
            Watch::Relayed | Watch::Other => {}
        }
        Out::Same
    }

    /// Notes which tools are read-only; inside a run, every tool may be
    /// called as a task, which durun runs (SPEC 22).
    fn tools_listed(&self, message: &serde_json::Map<String, Value>) -> Out {
        let tools = message.get("result").and_then(|result| result.get("tools"));
        {
            let mut read_only = self.read_only.lock().expect("tools lock");
            for tool in tools.and_then(Value::as_array).into_iter().flatten() {
                if let Some(name) = tool.get("name").and_then(Value::as_str) {
                    let hint =
                        tool.pointer("/annotations/readOnlyHint") == Some(&Value::Bool(true));
                    read_only.insert(name.to_owned(), hint);
                }
            }
        }
        if !self.had_run || tools.is_none() {
            return Out::Same;
        }
        let mut message = Value::Object(message.clone());
        for tool in message
            .pointer_mut("/result/tools")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(tool) = tool.as_object_mut() else {
                continue;
            };
            let execution = tool.entry("execution").or_insert_with(|| json!({}));
            if let Some(execution) = execution.as_object_mut()
                && execution.get("taskSupport").and_then(Value::as_str) != Some("required")
            {
                execution.insert("taskSupport".to_owned(), json!("optional"));
            }
        }
        Out::Replaced(message)
    }

    /// The server made task `server` of task `task`'s call: its end is
    /// fetched with `tasks/result`, and recorded as the call's.
    fn follow_server_task(&self, step: u64, task: String, server: &str) {
        self.tasks.server_task(&task, server);
        let own = self.own_id();
        let message = json!({
            "jsonrpc": "2.0",
            "id": own,
            "method": "tasks/result",
            "params": {"taskId": server},
        });
        self.watch(
            &own,
            Watch::Call {
                step,
                task: Some(task),
            },
        );
        if !self.send_server(message.to_string().into_bytes()) {
            self.give_up(&own, "the server is gone");
        }
    }

    /// Task `task` ended: the `tasks/result` requests waiting get its end.
    fn end_task(&self, task: &str, state: State) {
        for (request, outcome) in self.tasks.end(task, state) {
            answer_outcome(&self.client, &request, outcome);
        }
    }

    /// Records a call's answer: a result (one with `isError` too) finishes
    /// the step, a JSON-RPC error fails it. The client gets the answer once
    /// the run has it; if it could not, an error instead.
    fn record(
        &self,
        id: &Value,
        step: u64,
        message: &serde_json::Map<String, Value>,
        reconciled: bool,
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
                reconciled,
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
    /// exited before it answered them (SPEC 17). A task's call fails its
    /// task; its step stays in doubt, and runs again with its key.
    pub(crate) fn server_gone(&self, client: &ToClient) {
        let in_flight: Vec<(String, Watch)> =
            self.watched.lock().expect("watch lock").drain().collect();
        for (id, watch) in in_flight {
            let id: Value = serde_json::from_str(&id).unwrap_or(Value::Null);
            match watch {
                Watch::Call {
                    task: Some(task), ..
                } => self.end_task(
                    &task,
                    State::Failed(json!({"code": -32000, "message": SERVER_GONE_TASK})),
                ),
                Watch::Call { .. } | Watch::Relayed => {
                    client.error(&id, "durun: the MCP server exited before it answered the call (resume the task to run it again)");
                }
                _ => {
                    client.error(
                        &id,
                        "durun: the MCP server exited before it answered the request",
                    );
                }
            }
        }
    }

    /// A task's call that went out over a connection that broke before its
    /// answer came (streamable HTTP): the message to send again, under an
    /// id of durun's own, with the same key; `None` when `id` is no such
    /// call.
    pub(crate) fn resend(&self, id: &Value) -> Option<(Vec<u8>, Value)> {
        let mut watched = self.watched.lock().expect("watch lock");
        let key = id.to_string();
        if !matches!(watched.get(&key), Some(Watch::Call { task: Some(_), .. })) {
            return None;
        }
        let watch = watched.remove(&key)?;
        let Watch::Call {
            step,
            task: Some(task),
        } = watch
        else {
            return None;
        };
        drop(watched);
        // In doubt now: the probe, if there is one, is asked first.
        if let Some(result) = self.probed(&task) {
            let state = match self.reconcile(&Value::Null, step, &result) {
                Ok(()) => State::Completed(result),
                Err(unrecorded) => State::Failed(unrecorded["error"].clone()),
            };
            self.end_task(&task, state);
            return None;
        }
        let (message, own) = self.own_call(&task)?;
        self.watch(
            &own,
            Watch::Call {
                step,
                task: Some(task),
            },
        );
        Some((message, own))
    }

    /// A request of durun's own got no answer (its connection broke): a
    /// probe waiting for it hears so at once.
    pub(crate) fn unanswered(&self, id: &Value) {
        let mut watched = self.watched.lock().expect("watch lock");
        if matches!(watched.get(&id.to_string()), Some(Watch::Probe { .. }))
            && let Some(Watch::Probe { reply }) = watched.remove(&id.to_string())
        {
            let _ = reply
                .send(json!({"error": {"message": "its connection broke before it answered"}}));
        }
    }

    /// Whether request `id` is a task's call still waiting for its answer.
    pub(crate) fn awaits_task(&self, id: &Value) -> bool {
        matches!(
            self.watched
                .lock()
                .expect("watch lock")
                .get(&id.to_string()),
            Some(Watch::Call { task: Some(_), .. })
        )
    }

    /// A task's call could not be delivered: it fails, its step stays in
    /// doubt (`problem` says why).
    pub(crate) fn give_up(&self, id: &Value, problem: &str) {
        let watch = self
            .watched
            .lock()
            .expect("watch lock")
            .remove(&id.to_string());
        if let Some(Watch::Call {
            task: Some(task), ..
        }) = watch
        {
            self.end_task(
                &task,
                State::Failed(json!({"code": -32000, "message": format!("durun could not reach the MCP server: {problem}; the call is in doubt, and a later tasks/get or resume runs it again with its key")})),
            );
        }
    }

    /// The `tools/call` of task `task` as durun sends it itself: its tool
    /// and arguments as the journal has them, its key, a fresh id.
    fn own_call(&self, task: &str) -> Option<(Vec<u8>, Value)> {
        let (tool, args) = self.calls.lock().expect("calls lock").get(task).cloned()?;
        let own = self.own_id();
        let message = json!({
            "jsonrpc": "2.0",
            "id": own,
            "method": "tools/call",
            "params": {"name": tool, "arguments": args, "_meta": {KEY_META: task}},
        });
        Some((message.to_string().into_bytes(), own))
    }

    /// Answers `tasks/get`, `tasks/result`, `tasks/list` or `tasks/cancel`
    /// (SPEC 22), now or, for a result still to come, when it comes.
    fn task_request(&self, id: &Value, method: &str, params: Option<&Value>, client: &ToClient) {
        if method == "tasks/list" {
            let reply = json!({"jsonrpc": "2.0", "id": id, "result": self.tasks.list()});
            client.send(reply.to_string().as_bytes());
            return;
        }
        let Some(task) = params
            .and_then(|params| params.get("taskId"))
            .and_then(Value::as_str)
        else {
            invalid(client, id, &format!("durun: {method} needs params.taskId"));
            return;
        };
        if !self.tasks.knows(task)
            && let Err(problem) = self.find(task)
        {
            invalid(client, id, &problem);
            return;
        }
        match method {
            "tasks/get" => {
                let shown = self.tasks.shown(task).unwrap_or(Value::Null);
                let reply = json!({"jsonrpc": "2.0", "id": id, "result": shown});
                client.send(reply.to_string().as_bytes());
            }
            "tasks/result" => {
                if let Some(outcome) = self.tasks.result_or_wait(task, id) {
                    answer_outcome(client, id, outcome);
                } else if matches!(self.tasks.state(task), Some(State::Working { here: false })) {
                    self.watch_elsewhere(task);
                }
            }
            "tasks/cancel" => match self.tasks.cancel(task) {
                Ok((sent_as, server_task)) => {
                    let cancel = if let Some(server_task) = server_task {
                        let own = self.own_id();
                        self.watch(&own, Watch::Own);
                        Some(json!({
                            "jsonrpc": "2.0",
                            "id": own,
                            "method": "tasks/cancel",
                            "params": {"taskId": server_task},
                        }))
                    } else {
                        sent_as.map(|sent_as| json!({
                            "jsonrpc": "2.0",
                            "method": "notifications/cancelled",
                            "params": {"requestId": sent_as, "reason": "the client cancelled its task"},
                        }))
                    };
                    if let Some(cancel) = cancel {
                        self.send_server(cancel.to_string().into_bytes());
                    }
                    for waiting in self.tasks.take_waiting(task) {
                        answer_outcome(
                            client,
                            &waiting,
                            Outcome::Error(
                                json!({"code": -32000, "message": "durun: the task was cancelled"}),
                            ),
                        );
                    }
                    let shown = self.tasks.shown(task).unwrap_or(Value::Null);
                    let reply = json!({"jsonrpc": "2.0", "id": id, "result": shown});
                    client.send(reply.to_string().as_bytes());
                }
                Err(status) => invalid(
                    client,
                    id,
                    &format!("durun: task {task} is {status} already; it cannot be cancelled"),
                ),
            },
            _ => invalid(client, id, &format!("durun: unknown method {method}")),
        }
    }

    /// Learns task `task` from the run: a call of an earlier `durun mcp`
    /// (or run) ended, runs elsewhere, or was in doubt and is sent again
    /// from here, with its key.
    fn find(&self, task: &str) -> Result<(), String> {
        let unknown = || format!("durun: no task {task} in this durun task's journal");
        let answer = self
            .ask_run(&Outgoing::Find {
                idempotency_key: task,
            })
            .map_err(|_| unknown())?;
        let Some(found) = answer.found.as_ref() else {
            return Err(unknown());
        };
        match found.state.as_str() {
            "finished" => {
                self.tasks
                    .add(task, Value::Null, replayed_state(&answer), None);
            }
            "running" => {
                self.tasks
                    .add(task, Value::Null, State::Working { here: false }, None);
            }
            _ => {
                self.tasks
                    .add(task, Value::Null, State::Working { here: true }, None);
                self.resume_found(task, &answer);
            }
        }
        Ok(())
    }

    /// Task `task` runs in another `durun mcp`: its end is looked for in
    /// the run until it comes.
    fn watch_elsewhere(&self, task: &str) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let task = task.to_owned();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let answer = me.ask_run(&Outgoing::Find {
                    idempotency_key: &task,
                });
                let state = match answer {
                    Err(_) => State::Failed(json!({"code": -32000, "message": RUN_GONE})),
                    Ok(answer) => match answer.found.as_ref().map(|found| found.state.as_str()) {
                        Some("finished") => replayed_state(&answer),
                        Some("running") => continue,
                        // In doubt: sent again from here.
                        Some(_) => {
                            me.resume_found(&task, &answer);
                            return;
                        }
                        None => {
                            State::Failed(json!({"code": -32000, "message": answer.error_text()}))
                        }
                    },
                };
                me.end_task(&task, state);
                return;
            }
        });
    }

    /// A task's step was in doubt and the run reopened it for this
    /// process (`find`): its call goes out from here, with its key.
    fn resume_found(&self, task: &str, answer: &Answer) {
        let (Some(found), Some(step)) = (answer.found.as_ref(), answer.step) else {
            return;
        };
        let prefix = format!("mcp {}/", self.server());
        let tool = found
            .name
            .strip_prefix(&prefix)
            .or_else(|| found.name.split_once('/').map(|(_, tool)| tool))
            .unwrap_or(&found.name)
            .to_owned();
        self.calls
            .lock()
            .expect("calls lock")
            .insert(task.to_owned(), (tool, found.args.clone()));
        if let Some(result) = self.probed(task) {
            let state = match self.reconcile(&Value::Null, step, &result) {
                Ok(()) => State::Completed(result),
                Err(unrecorded) => State::Failed(unrecorded["error"].clone()),
            };
            self.end_task(task, state);
            return;
        }
        let Some((message, own)) = self.own_call(task) else {
            return;
        };
        self.tasks.sending(task, &own);
        self.watch(
            &own,
            Watch::Call {
                step,
                task: Some(task.to_owned()),
            },
        );
        if !self.send_server(message) {
            self.give_up(&own, "the server is gone");
        }
    }

    /// A fresh id for a request of durun's own.
    fn own_id(&self) -> Value {
        json!(format!(
            "durun-{}",
            self.own_ids.fetch_add(1, Ordering::Relaxed) + 1
        ))
    }

    /// Asks the server whether the call in doubt with key `key` took
    /// effect, when `[mcp.NAME] probe` names a tool for it (SPEC 22): its
    /// result when it did (not `isError`), else `None` (it did not, or the
    /// probe could not tell), and the call goes again with its key.
    fn probed(&self, key: &str) -> Option<Value> {
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

    /// Records `result`, a probe's, as the end of the step in doubt `step`
    /// (`reconciled`): the error for request `id` if it could not be.
    fn reconcile(&self, id: &Value, step: u64, result: &Value) -> Result<(), Value> {
        let mut message = serde_json::Map::new();
        message.insert("result".to_owned(), result.clone());
        self.record(id, step, &message, true).map_or(Ok(()), Err)
    }

    /// Sends a message of durun's own to the server.
    fn send_server(&self, message: Vec<u8>) -> bool {
        self.to_server.get().is_some_and(|send| send(message))
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

/// A task's state from a recorded end (a replayed `begin` or a `find`).
fn replayed_state(answer: &Answer) -> State {
    if answer.ok {
        State::Completed(answer.output.clone())
    } else if answer.output.get("code").is_some() {
        // A recorded JSON-RPC error.
        State::Failed(answer.output.clone())
    } else {
        State::Failed(json!({"code": -32000, "message": format!("durun: {}", answer.error_text())}))
    }
}

/// Answers `tasks/result` request `request` with a task's end.
fn answer_outcome(client: &ToClient, request: &Value, outcome: Outcome) {
    let reply = match outcome {
        Outcome::Result(result) => json!({"jsonrpc": "2.0", "id": request, "result": result}),
        Outcome::Error(error) => json!({"jsonrpc": "2.0", "id": request, "error": error}),
    };
    client.send(reply.to_string().as_bytes());
}

/// Answers request `id` with JSON-RPC's invalid-params error.
fn invalid(client: &ToClient, id: &Value, message: &str) {
    let reply = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32602, "message": message},
    });
    client.send(reply.to_string().as_bytes());
}

/// The id of the server's own task, when `result` is its `CreateTaskResult`
/// (a task, and no content).
fn server_task(result: Option<&Value>) -> Option<&str> {
    let result = result?;
    if result.get("content").is_some() {
        return None;
    }
    result.pointer("/task/taskId").and_then(Value::as_str)
}
