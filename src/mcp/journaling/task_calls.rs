//! MCP tasks in a run (SPEC 22), `durun mcp`'s side: the `tasks/*`
//! requests answered, a task the run knows by key found and taken up, a
//! server's own task followed to its end, and a task's call sent again by
//! durun itself when its connection broke.
//!
//! # Invariant
//!
//! A call goes again only with its key, and only once it is in doubt: its
//! `durun mcp` died (the run reopened it for this one), or its connection
//! broke; the probe, if there is one, is asked first.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use super::super::ToClient;
use super::super::tasks::{Outcome, State};
use super::{Journaling, KEY_META, RUN_GONE, Watch};
use crate::protocol::client::{Answer, Outgoing};

impl Journaling {
    /// Answers request `id` with the `CreateTaskResult` of task `task`.
    pub(super) fn answer_created(&self, id: &Value, task: &str, client: &ToClient) {
        let shown = self.tasks.shown(task).unwrap_or(Value::Null);
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": {"task": shown}});
        client.send(reply.to_string().as_bytes());
    }

    /// The server made task `server` of task `task`'s call: its end is
    /// fetched with `tasks/result`, and recorded as the call's.
    pub(super) fn follow_server_task(&self, step: u64, task: String, server: &str) {
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
    pub(super) fn end_task(&self, task: &str, state: State) {
        for (request, outcome) in self.tasks.end(task, state) {
            answer_outcome(&self.client, &request, outcome);
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
        if let Some(settled) = self.settled_by_probe(&task, step) {
            self.end_task(&task, settled.map_or_else(State::Failed, State::Completed));
            return None;
        }
        self.call_again(step, &task)
    }

    /// Task `task`'s call (step `step`) as durun sends it again, watched
    /// as the task's: its message and its request id.
    fn call_again(&self, step: u64, task: &str) -> Option<(Vec<u8>, Value)> {
        let (message, own) = self.own_call(task)?;
        self.watch(
            &own,
            Watch::Call {
                step,
                task: Some(task.to_owned()),
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

    /// Whether a client waits for the answer to request `id`: not a
    /// task's call (answered with its task), nor a request of durun's own.
    pub(crate) fn client_awaits(&self, id: &Value) -> bool {
        !matches!(
            self.watched
                .lock()
                .expect("watch lock")
                .get(&id.to_string()),
            Some(Watch::Call { task: Some(_), .. } | Watch::Probe { .. } | Watch::Own)
        )
    }

    /// Whether request `id` is a probe still waiting for its answer.
    pub(crate) fn awaits_probe(&self, id: &Value) -> bool {
        matches!(
            self.watched
                .lock()
                .expect("watch lock")
                .get(&id.to_string()),
            Some(Watch::Probe { .. })
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
    pub(super) fn own_call(&self, task: &str) -> Option<(Vec<u8>, Value)> {
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
    pub(super) fn task_request(
        &self,
        id: &Value,
        method: &str,
        params: Option<&Value>,
        client: &ToClient,
    ) {
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
    pub(super) fn find(&self, task: &str) -> Result<(), String> {
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
    pub(super) fn watch_elsewhere(&self, task: &str) {
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
    pub(super) fn resume_found(&self, task: &str, answer: &Answer) {
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
        if let Some(settled) = self.settled_by_probe(task, step) {
            self.end_task(task, settled.map_or_else(State::Failed, State::Completed));
            return;
        }
        let Some((message, own)) = self.call_again(step, task) else {
            return;
        };
        self.tasks.sending(task, &own);
        if !self.send_server(message) {
            self.give_up(&own, "the server is gone");
        }
    }

    /// A fresh id for a request of durun's own.
    pub(super) fn own_id(&self) -> Value {
        json!(format!(
            "durun-{}",
            self.own_ids.fetch_add(1, Ordering::Relaxed) + 1
        ))
    }

    /// Sends a message of durun's own to the server.
    pub(super) fn send_server(&self, message: Vec<u8>) -> bool {
        self.to_server.get().is_some_and(|send| send(message))
    }
}

/// A task's state from a recorded end (a replayed `begin` or a `find`).
pub(super) fn replayed_state(answer: &Answer) -> State {
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
pub(super) fn answer_outcome(client: &ToClient, request: &Value, outcome: Outcome) {
    let reply = match outcome {
        Outcome::Result(result) => json!({"jsonrpc": "2.0", "id": request, "result": result}),
        Outcome::Error(error) => json!({"jsonrpc": "2.0", "id": request, "error": error}),
    };
    client.send(reply.to_string().as_bytes());
}

/// Answers request `id` with JSON-RPC's invalid-params error.
pub(super) fn invalid(client: &ToClient, id: &Value, message: &str) {
    let reply = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32602, "message": message},
    });
    client.send(reply.to_string().as_bytes());
}

/// The id of the server's own task, when `result` is its `CreateTaskResult`
/// (a task, and no content).
pub(super) fn server_task(result: Option<&Value>) -> Option<&str> {
    let result = result?;
    if result.get("content").is_some() {
        return None;
    }
    result.pointer("/task/taskId").and_then(Value::as_str)
}
