//! MCP Tasks (SPEC 22): a task-augmented `tools/call` is answered with a
//! task at once and runs to its end as its step; `tasks/get`, `tasks/result`,
//! `tasks/list` and `tasks/cancel` are answered here. A task's id is its
//! step's idempotency key, so a `durun mcp` that did not start it (the
//! client came back through a new one, in this run or a later one) finds
//! it in the journal.
//!
//! # Invariant
//!
//! A task is `working` until its step's end is recorded; `tasks/result`
//! answers only a recorded end. Nothing here starts a call: a call runs
//! again only as the run's `find` reopens a step in doubt, with its key.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

use serde_json::{Value, json};

/// How often a client is told to poll, in milliseconds.
pub(super) const POLL_MS: u64 = 500;

/// Where `_meta` names the task a result belongs to.
const RELATED: &str = "io.modelcontextprotocol/related-task";

/// The tasks this `durun mcp` knows, by id.
#[derive(Default)]
pub(super) struct Tasks {
    by_id: Mutex<HashMap<String, McpTask>>,
    /// Signalled whenever a task ends.
    ended: Condvar,
}

struct McpTask {
    created_at: String,
    updated_at: String,
    ttl: Value,
    state: State,
    /// `tasks/result` requests that wait for its end.
    waiting: Vec<Value>,
    /// The request it went to the server as, while it runs here.
    sent_as: Option<Value>,
    /// The server's own task for it, where the server has them.
    server_task: Option<String>,
}

/// Where a task stands.
#[derive(Clone, Debug)]
pub(super) enum State {
    /// Its call is on its way: `here` when this process sent it, else
    /// another `durun mcp` runs it.
    Working {
        here: bool,
    },
    /// The call's result (`isError` or not), recorded.
    Completed(Value),
    /// The call's JSON-RPC error, or durun's, recorded or not.
    Failed(Value),
    Cancelled,
}

impl State {
    fn status(&self) -> &'static str {
        match self {
            Self::Working { .. } => "working",
            Self::Completed(result) if result.get("isError") == Some(&Value::Bool(true)) => {
                "failed"
            }
            Self::Completed(_) => "completed",
            Self::Failed(_) => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    fn ended(&self) -> bool {
        !matches!(self, Self::Working { .. })
    }
}

/// What a cancelled task's call went out as: the request, the server's task.
pub(super) type Cancelled = (Option<Value>, Option<String>);

/// What a client gets for `tasks/result` of an ended task.
pub(super) enum Outcome {
    Result(Value),
    Error(Value),
}

impl Tasks {
    /// Notes a task; an existing one with this id is left as it is.
    pub(super) fn add(&self, id: &str, ttl: Value, state: State, sent_as: Option<Value>) {
        let now = crate::clock::now();
        self.by_id
            .lock()
            .expect("tasks lock")
            .entry(id.to_owned())
            .or_insert_with(|| McpTask {
                created_at: now.clone(),
                updated_at: now,
                ttl,
                state,
                waiting: Vec::new(),
                sent_as,
                server_task: None,
            });
    }

    /// Task `id`'s call goes out from here now, as request `request`.
    pub(super) fn sending(&self, id: &str, request: &Value) {
        let mut tasks = self.by_id.lock().expect("tasks lock");
        if let Some(task) = tasks.get_mut(id)
            && !task.state.ended()
        {
            task.state = State::Working { here: true };
            task.sent_as = Some(request.clone());
        }
    }

    /// The server runs task `id`'s call as its task `server`.
    pub(super) fn server_task(&self, id: &str, server: &str) {
        let mut tasks = self.by_id.lock().expect("tasks lock");
        if let Some(task) = tasks.get_mut(id) {
            task.server_task = Some(server.to_owned());
        }
    }

    pub(super) fn knows(&self, id: &str) -> bool {
        self.by_id.lock().expect("tasks lock").contains_key(id)
    }

    /// The task as `tasks/get` shows it.
    pub(super) fn shown(&self, id: &str) -> Option<Value> {
        let tasks = self.by_id.lock().expect("tasks lock");
        tasks.get(id).map(|task| show(id, task))
    }

    /// Every task, as `tasks/list` shows them.
    pub(super) fn list(&self) -> Value {
        let tasks = self.by_id.lock().expect("tasks lock");
        let mut shown: Vec<Value> = tasks.iter().map(|(id, task)| show(id, task)).collect();
        shown.sort_by(|a, b| a["createdAt"].as_str().cmp(&b["createdAt"].as_str()));
        json!({ "tasks": shown })
    }

    /// Where task `id` stands, if it is known.
    pub(super) fn state(&self, id: &str) -> Option<State> {
        let tasks = self.by_id.lock().expect("tasks lock");
        tasks.get(id).map(|task| task.state.clone())
    }

    /// Task `id` ended (unless it was cancelled): the `tasks/result`
    /// requests that waited for it, each with what to answer.
    pub(super) fn end(&self, id: &str, state: State) -> Vec<(Value, Outcome)> {
        let mut tasks = self.by_id.lock().expect("tasks lock");
        let Some(task) = tasks.get_mut(id) else {
            return Vec::new();
        };
        if !task.state.ended() {
            task.state = state;
            task.updated_at = crate::clock::now();
        }
        task.sent_as = None;
        let waiting = std::mem::take(&mut task.waiting);
        let answers = waiting
            .into_iter()
            .map(|request| (request, outcome(id, &task.state)))
            .collect();
        self.ended.notify_all();
        answers
    }

    /// What `tasks/result` of task `id` answers now, or `None` when it
    /// must wait (the request is kept and answered by [`Self::end`]).
    pub(super) fn result_or_wait(&self, id: &str, request: &Value) -> Option<Outcome> {
        let mut tasks = self.by_id.lock().expect("tasks lock");
        let task = tasks.get_mut(id)?;
        if task.state.ended() {
            return Some(outcome(id, &task.state));
        }
        task.waiting.push(request.clone());
        None
    }

    /// Cancels task `id`: the request its call went out as, if it was
    /// sent from here, and the server's task for it, if it made one; `Err`
    /// with the task's status when it had ended.
    pub(super) fn cancel(&self, id: &str) -> Result<Cancelled, &'static str> {
        let mut tasks = self.by_id.lock().expect("tasks lock");
        let Some(task) = tasks.get_mut(id) else {
            return Ok((None, None));
        };
        if task.state.ended() {
            return Err(task.state.status());
        }
        task.state = State::Cancelled;
        task.updated_at = crate::clock::now();
        self.ended.notify_all();
        Ok((task.sent_as.take(), task.server_task.clone()))
    }

    /// The `tasks/result` requests of cancelled task `id`.
    pub(super) fn take_waiting(&self, id: &str) -> Vec<Value> {
        let mut tasks = self.by_id.lock().expect("tasks lock");
        tasks
            .get_mut(id)
            .map(|task| std::mem::take(&mut task.waiting))
            .unwrap_or_default()
    }

    /// Waits until no call this process sent is still on its way: the
    /// client left, and the calls run to their ends first (SPEC 22).
    pub(super) fn drain(&self) {
        let mut tasks = self.by_id.lock().expect("tasks lock");
        while tasks
            .values()
            .any(|task| matches!(task.state, State::Working { here: true }))
        {
            tasks = self.ended.wait(tasks).expect("tasks lock");
        }
    }
}

fn show(id: &str, task: &McpTask) -> Value {
    let mut shown = json!({
        "taskId": id,
        "status": task.state.status(),
        "createdAt": task.created_at,
        "lastUpdatedAt": task.updated_at,
        "ttl": task.ttl,
        "pollInterval": POLL_MS,
    });
    let message = match &task.state {
        State::Failed(error) => error.get("message").and_then(Value::as_str),
        State::Cancelled => Some("cancelled by the client"),
        _ => None,
    };
    if let Some(message) = message {
        shown["statusMessage"] = Value::String(message.to_owned());
    }
    shown
}

fn outcome(id: &str, state: &State) -> Outcome {
    match state {
        State::Completed(result) => {
            let mut result = result.clone();
            if let Some(result) = result.as_object_mut() {
                let meta = result.entry("_meta").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(RELATED.to_owned(), json!({ "taskId": id }));
                }
            }
            Outcome::Result(result)
        }
        State::Failed(error) => Outcome::Error(error.clone()),
        State::Cancelled => Outcome::Error(json!({
            "code": -32000,
            "message": "durun: the task was cancelled",
        })),
        State::Working { .. } => Outcome::Error(json!({
            "code": -32000,
            "message": "durun: the task has not ended",
        })),
    }
}

/// The task-augmented request's `task` member, if it is one.
pub(super) fn asked_ttl(params: &serde_json::Map<String, Value>) -> Option<Value> {
    let task = params.get("task")?.as_object()?;
    Some(task.get("ttl").cloned().unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_waits_for_the_end_and_names_its_task() {
        let tasks = Tasks::default();
        tasks.add("k", json!(1000), State::Working { here: true }, None);
        assert!(tasks.result_or_wait("k", &json!(7)).is_none());
        assert_eq!(tasks.shown("k").unwrap()["status"], "working");
        let answers = tasks.end("k", State::Completed(json!({"content": []})));
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].0, json!(7));
        let Outcome::Result(result) = &answers[0].1 else {
            panic!("a result")
        };
        assert_eq!(result["_meta"][RELATED]["taskId"], "k");
        assert_eq!(tasks.shown("k").unwrap()["status"], "completed");
    }

    #[test]
    fn a_cancelled_task_stays_cancelled_and_an_ended_one_cannot_be() {
        let tasks = Tasks::default();
        tasks.add(
            "k",
            Value::Null,
            State::Working { here: true },
            Some(json!("r1")),
        );
        assert_eq!(tasks.cancel("k"), Ok((Some(json!("r1")), None)));
        tasks.end("k", State::Completed(json!({})));
        assert_eq!(tasks.shown("k").unwrap()["status"], "cancelled");
        assert_eq!(tasks.cancel("k"), Err("cancelled"));
    }
}
