//! The tools of `durun mcp-server`: each is a durun command, run with
//! `--json` on the server's journal; its answer is what the command
//! printed (SPEC 22).

use serde_json::{Map, Value, json};

use super::INVALID_PARAMS;
use crate::own_command::{EditFile, durun};
use crate::settings::Settings;

/// A tool: its name, what it is for, its arguments' schema, and whether it
/// only reads or may destroy.
struct Tool {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    input: fn() -> Value,
    read_only: bool,
    destructive: bool,
}

const TASK: &str = "the task's id, as list_tasks shows it";

fn task_only() -> Value {
    schema(
        &[("task", json!({"type": "string", "description": TASK}))],
        &["task"],
    )
}

fn schema(properties: &[(&str, Value)], required: &[&str]) -> Value {
    let properties: Map<String, Value> = properties
        .iter()
        .map(|(name, schema)| ((*name).to_owned(), schema.clone()))
        .collect();
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

const TOOLS: &[Tool] = &[
    Tool {
        name: "list_tasks",
        title: "List tasks",
        description: "The journal's tasks, newest first, as `durun inspect --json` lists them: id, status, command, steps, tokens and cost spent and saved. `status` keeps one status; `search` keeps tasks whose id or command contains it.",
        input: || {
            schema(
                &[
                    (
                        "status",
                        json!({"type": "string", "enum": ["running", "completed", "failed", "interrupted", "cancelled", "waiting", "sleeping", "over_budget", "queued"]}),
                    ),
                    (
                        "search",
                        json!({"type": "string", "description": "text in the task's id or command"}),
                    ),
                ],
                &[],
            )
        },
        read_only: true,
        destructive: false,
    },
    Tool {
        name: "inspect_task",
        title: "Inspect a task",
        description: "A task with its runs and steps, as `durun inspect TASK --json` prints it: each step's name, kind, effect, status, args, output, error, tokens and cost.",
        input: task_only,
        read_only: true,
        destructive: false,
    },
    Tool {
        name: "inspect_step",
        title: "Inspect a step",
        description: "One step of a task, as `durun inspect TASK --step N --json` prints it, every attempt and resolution included: for a model call, the request and the answer whole.",
        input: || {
            schema(
                &[
                    ("task", json!({"type": "string", "description": TASK})),
                    ("step", json!({"type": "integer", "minimum": 1})),
                ],
                &["task", "step"],
            )
        },
        read_only: true,
        destructive: false,
    },
    Tool {
        name: "diff",
        title: "Compare two tasks",
        description: "Two tasks step by step, as `durun diff A B --json` prints them: where they part, the fields of each step that changed, and the difference in tokens and cost. For a task and its fork, or two runs of one agent.",
        input: || {
            schema(
                &[
                    ("a", json!({"type": "string", "description": TASK})),
                    ("b", json!({"type": "string", "description": TASK})),
                ],
                &["a", "b"],
            )
        },
        read_only: true,
        destructive: false,
    },
    Tool {
        name: "resume",
        title: "Resume a task",
        description: "Runs an unfinished task's agent again, as `durun resume TASK --json` does: its finished steps are answered from the journal, the rest run. Returns the task once the run ends (it may take as long as the agent does).",
        input: || {
            schema(
                &[
                    ("task", json!({"type": "string", "description": TASK})),
                    (
                        "from_step",
                        json!({"type": "integer", "minimum": 1, "description": "discard steps from this one and run them anew"}),
                    ),
                ],
                &["task"],
            )
        },
        read_only: false,
        destructive: false,
    },
    Tool {
        name: "fork",
        title: "Fork a task",
        description: "Copies a task's steps before step `at` into a new task that runs from step `at`, as `durun fork TASK --at N --json` does; with `output`, step `at` is answered with it instead of running (a model call's answer body, or another step's output as JSON). The original is not changed. Returns the new task; `resume` runs it.",
        input: || {
            schema(
                &[
                    ("task", json!({"type": "string", "description": TASK})),
                    ("at", json!({"type": "integer", "minimum": 1})),
                    (
                        "output",
                        json!({"type": "string", "description": "step `at`'s answer, as text"}),
                    ),
                    (
                        "new_task",
                        json!({"type": "string", "description": "the new task's id [default: a new one]"}),
                    ),
                ],
                &["task", "at"],
            )
        },
        read_only: false,
        destructive: false,
    },
    Tool {
        name: "approve",
        title: "Approve",
        description: "Approves what a task waits for (a signal {\"approved\": true} to its waiting step), or raises its budget, as `durun approve TASK --json` does. Returns the task.",
        input: || {
            schema(
                &[
                    ("task", json!({"type": "string", "description": TASK})),
                    (
                        "data",
                        json!({"type": "object", "description": "more data for the agent, merged into {\"approved\": true}"}),
                    ),
                    ("add_tokens", json!({"type": "integer", "minimum": 0})),
                    ("add_usd", json!({"type": "number", "minimum": 0})),
                ],
                &["task"],
            )
        },
        read_only: false,
        destructive: false,
    },
    Tool {
        name: "signal",
        title: "Send a signal",
        description: "Sends a signal to a task, as `durun signal TASK NAME --json` does: a `wait` step of that name takes it. Returns the task.",
        input: || {
            schema(
                &[
                    ("task", json!({"type": "string", "description": TASK})),
                    ("name", json!({"type": "string"})),
                    (
                        "data",
                        json!({"description": "the signal's data, any JSON"}),
                    ),
                ],
                &["task", "name"],
            )
        },
        read_only: false,
        destructive: false,
    },
    Tool {
        name: "cancel",
        title: "Cancel a task",
        description: "Stops a task for good, as `durun cancel TASK --json` does: its runner ends the agent, and it never resumes. Returns the task.",
        input: task_only,
        read_only: false,
        destructive: true,
    },
    Tool {
        name: "test",
        title: "Crash-test an agent",
        description: "Runs an agent command under `durun test --json`: once as a reference, then killed at every step and resumed, in a scratch journal; says whether every trial ended as the reference did, sent no finished model call again and kept one key per mutate step. Takes as long as all the trials.",
        input: || {
            schema(
                &[
                    (
                        "command",
                        json!({"type": "array", "items": {"type": "string"}, "minItems": 1, "description": "the agent's command and its arguments"}),
                    ),
                    (
                        "cwd",
                        json!({"type": "string", "description": "the directory to run it in [default: the server's]"}),
                    ),
                ],
                &["command"],
            )
        },
        read_only: false,
        destructive: false,
    },
];

/// `tools/list`'s tools.
pub(super) fn list() -> Vec<Value> {
    TOOLS
        .iter()
        .map(|tool| {
            json!({
                "name": tool.name,
                "title": tool.title,
                "description": tool.description,
                "inputSchema": (tool.input)(),
                "outputSchema": {"type": "object"},
                "annotations": {
                    "title": tool.title,
                    "readOnlyHint": tool.read_only,
                    "destructiveHint": tool.destructive,
                    "idempotentHint": tool.read_only,
                    "openWorldHint": false,
                },
            })
        })
        .collect()
}

/// `tools/call`: runs the tool's command and answers what it printed.
pub(super) fn call(params: &Value, settings: &Settings) -> Result<Value, (i64, String)> {
    let name = params["name"].as_str().unwrap_or_default();
    if !TOOLS.iter().any(|tool| tool.name == name) {
        return Err((
            INVALID_PARAMS,
            format!("durun mcp-server has no tool {name}"),
        ));
    }
    let empty = Map::new();
    let given = params["arguments"].as_object().unwrap_or(&empty);
    let Invocation { args, edit, cwd } =
        command(name, given).map_err(|why| (INVALID_PARAMS, why))?;
    let said = durun(settings, &args, cwd.as_deref());
    // The edited answer's file goes once the fork read it.
    drop(edit);
    let printed = serde_json::from_str::<Value>(&said.printed).ok();
    let printed = match (name, printed) {
        ("list_tasks", Some(listed)) => Some(searched(listed, given.get("search"))),
        (_, printed) => printed,
    };
    Ok(match printed {
        Some(structured) if structured.is_object() => {
            let mut text = structured.to_string();
            if !said.ok && !said.message.is_empty() {
                text = format!("{}\n{text}", said.message);
            }
            json!({
                "content": [{"type": "text", "text": text}],
                "structuredContent": structured,
                "isError": !said.ok,
            })
        }
        _ => {
            let message = if said.message.is_empty() {
                said.printed
            } else {
                said.message
            };
            json!({"content": [{"type": "text", "text": message}], "isError": true})
        }
    })
}

/// How a tool's call runs its command.
struct Invocation {
    /// durun's arguments.
    args: Vec<String>,
    /// The file that holds a fork's edited answer: kept until the command
    /// ran, removed when dropped.
    edit: Option<EditFile>,
    /// The directory to run it in, if not the server's.
    cwd: Option<std::path::PathBuf>,
}

/// A call's arguments, read for its command.
struct Given<'a> {
    tool: &'a str,
    map: &'a Map<String, Value>,
}

impl Given<'_> {
    fn text(&self, key: &str) -> Result<String, String> {
        self.map
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("{} needs `{key}`, a string", self.tool))
    }

    fn number(&self, key: &str) -> Result<Option<u64>, String> {
        self.map.get(key).map_or(Ok(None), |value| {
            value
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("{}'s `{key}` is a whole number", self.tool))
        })
    }

    fn step(&self, key: &str) -> Result<u64, String> {
        self.number(key)?
            .ok_or_else(|| format!("{} needs `{key}`, a step number", self.tool))
    }
}

/// How a call of tool `name` with `given` arguments runs its command:
/// options first, then `--` and the ids and names, so that an id that
/// starts with `-` is read as an id, never as an option.
fn command(name: &str, given: &Map<String, Value>) -> Result<Invocation, String> {
    let given = Given {
        tool: name,
        map: given,
    };
    let task = || given.text("task");
    let json = "--json".to_owned();
    let mut invocation = Invocation {
        args: Vec::new(),
        edit: None,
        cwd: None,
    };
    let (options, positional): (Vec<String>, Vec<String>) = match name {
        "list_tasks" => {
            let mut options = vec!["inspect".into(), json];
            if given.map.contains_key("status") {
                options.push(format!("--status={}", given.text("status")?));
            }
            (options, Vec::new())
        }
        "inspect_task" => (vec!["inspect".into(), json], vec![task()?]),
        "inspect_step" => (
            vec![
                "inspect".into(),
                json,
                format!("--step={}", given.step("step")?),
            ],
            vec![task()?],
        ),
        "diff" => (
            vec!["diff".into(), json],
            vec![given.text("a")?, given.text("b")?],
        ),
        "resume" => {
            let mut options = vec!["resume".into(), json];
            if let Some(step) = given.number("from_step")? {
                options.push(format!("--from-step={step}"));
            }
            (options, vec![task()?])
        }
        "fork" => {
            let mut options = vec!["fork".into(), json, format!("--at={}", given.step("at")?)];
            if given.map.contains_key("output") {
                let file = EditFile::new(&given.text("output")?)
                    .map_err(|err| format!("cannot keep the edit: {err}"))?;
                options.push(format!("--output={}", file.path().display()));
                invocation.edit = Some(file);
            }
            if given.map.contains_key("new_task") {
                options.push(format!("--task={}", given.text("new_task")?));
            }
            (options, vec![task()?])
        }
        "approve" => (approve(&given)?, vec![task()?]),
        "signal" => {
            let mut options = vec!["signal".into(), json];
            if let Some(data) = given.map.get("data") {
                options.push(format!("--data={data}"));
            }
            (options, vec![task()?, given.text("name")?])
        }
        "cancel" => (vec!["cancel".into(), json], vec![task()?]),
        "test" => {
            if given.map.contains_key("cwd") {
                invocation.cwd = Some(std::path::PathBuf::from(given.text("cwd")?));
            }
            let argv: Vec<String> = given
                .map
                .get("command")
                .and_then(Value::as_array)
                .map(|words| {
                    words
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .filter(|words: &Vec<String>| !words.is_empty())
                .ok_or("test needs `command`, the agent's command as a list of strings")?;
            (vec!["test".into(), json], argv)
        }
        _ => return Err(format!("durun mcp-server has no tool {name}")),
    };
    invocation.args = options;
    if !positional.is_empty() {
        invocation.args.push("--".into());
        invocation.args.extend(positional);
    }
    Ok(invocation)
}

/// `approve`'s options.
fn approve(given: &Given<'_>) -> Result<Vec<String>, String> {
    let mut options = vec!["approve".into(), "--json".into()];
    if let Some(data) = given.map.get("data") {
        options.push(format!("--data={data}"));
    }
    if let Some(tokens) = given.number("add_tokens")? {
        options.push(format!("--add-tokens={tokens}"));
    }
    if let Some(usd) = given.map.get("add_usd") {
        let usd = usd.as_f64().ok_or("approve's `add_usd` is a number")?;
        options.push(format!("--add-usd={usd}"));
    }
    Ok(options)
}

/// `inspect --json`'s list, the tasks whose id or command holds `search`.
fn searched(mut listed: Value, search: Option<&Value>) -> Value {
    let Some(search) = search
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
    else {
        return listed;
    };
    if let Some(tasks) = listed.get_mut("tasks").and_then(Value::as_array_mut) {
        tasks.retain(|task| {
            task["id"].as_str().is_some_and(|id| id.contains(search))
                || task["command"].as_array().is_some_and(|words| {
                    words
                        .iter()
                        .filter_map(Value::as_str)
                        .any(|word| word.contains(search))
                })
        });
    }
    listed
}
