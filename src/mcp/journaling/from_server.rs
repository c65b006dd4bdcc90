//! The server's messages as they pass to the client: its name and its
//! tools' hints noted, `tasks` declared for it inside a run, a call's
//! answer recorded before the client has it (or, for a task, ending the
//! task), and the calls in flight when the server exits.

use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::super::ToClient;
use super::super::tasks::State;
use super::task_calls::server_task;
use super::{Journaling, Out, SERVER_GONE_TASK, Watch};
use crate::protocol::client::Outgoing;

impl Journaling {
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
    pub(super) fn server_message(&self, message: &serde_json::Map<String, Value>) -> Out {
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
    pub(super) fn tools_listed(&self, message: &serde_json::Map<String, Value>) -> Out {
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

    /// Records a call's answer: a result (one with `isError` too) finishes
    /// the step, a JSON-RPC error fails it. The client gets the answer once
    /// the run has it; if it could not, an error instead.
    pub(super) fn record(
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
    pub(super) fn unrecorded(id: &Value, problem: &str) -> Value {
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
}
