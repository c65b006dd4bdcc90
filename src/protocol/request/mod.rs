//! Requests: a line from the agent classified (a print, a request, or a
//! request that cannot be served) and decoded by hand from a parsed
//! `serde_json::Value`.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

use super::Effect;
use super::MAX_DEPTH;
use super::lenient::{self, Reread};

/// One request from the agent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Request {
    Call {
        id: Value,
        tool: String,
        args: Value,
    },
    Begin {
        id: Value,
        name: String,
        args: Value,
        effect: Option<Effect>,
        /// `"kind": "mcp"`: an MCP tool call (`durun mcp`), replayed by
        /// content, not position (SPEC 13).
        mcp: bool,
    },
    Commit {
        id: Value,
        step: Closes,
        output: Value,
        usage: Option<Value>,
    },
    /// A `commit` with `"reconciled": true`: the step was in doubt, and
    /// asking its destination (a probe) found it took effect: `output` is
    /// what the destination says, and nothing ran again.
    Reconciled {
        id: Value,
        step: Closes,
        output: Value,
    },
    Fail {
        id: Value,
        step: Closes,
        error: String,
        output: Option<Value>,
    },
    Result {
        id: Value,
        output: Value,
    },
    /// Opens step `step`, which failed in this run, again as its next
    /// attempt with the same key: retries in the agent's own code.
    Retry {
        id: Value,
        step: u64,
    },
    /// Whether the code past patch `name` runs here: true on a new path
    /// (recorded as a step), false where the task's recorded path, from
    /// before the patch, goes on.
    Patched {
        id: Value,
        name: String,
    },
    /// Waits for a signal called `name` (SPEC 8).
    Wait {
        id: Value,
        name: String,
        data: Value,
        timeout: Option<Duration>,
    },
    /// Waits until a time: `args` as sent are the step's args.
    Sleep {
        id: Value,
        args: Value,
        wake: Wake,
    },
    /// Starts a child task (SPEC 16): `PARENT-sN`, with `command`, the
    /// parent's directory and config, and `args` in its `DURUN_ARGS`;
    /// queued for workers with `queue`, else run beside the agent.
    Spawn {
        id: Value,
        spawn: Box<SpawnArgs>,
    },
    /// Waits for a child task to end, as `wait` waits for a signal.
    Join {
        id: Value,
        task: String,
        timeout: Option<Duration>,
    },
    /// The recorded steps from the agent's next one on that a `begin` of
    /// the same name and key would replay: an SDK answers them itself,
    /// then says so with `replayed`. Nothing is counted as replayed yet.
    Ahead {
        id: Value,
    },
    /// The agent replayed its steps through `through` (whose key it names)
    /// from an `ahead` answer, without asking: durun counts them as
    /// replayed and numbers the next step after them.
    Replayed {
        id: Value,
        through: u64,
        key: String,
    },
    /// Where the task's MCP step with idempotency key `key` stands: an MCP
    /// task asked for by its id (`durun mcp`, SPEC 22). A step in doubt
    /// is opened for the asker, as an equal `begin` would open it.
    Find {
        id: Value,
        key: String,
    },
}

/// The step a `commit` or `fail` closes: by its number, or by the `id`
/// of the `begin` that opened it (`"begin": ID`), for an agent that posts
/// a `read` step's `begin` and `commit` together, not waiting to learn
/// its number.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Closes {
    Step(u64),
    /// Boxed: a request is moved whole between threads.
    Begin(Box<Value>),
}

/// What a `spawn` asks for (boxed: the other requests are smaller).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SpawnArgs {
    pub(crate) name: String,
    pub(crate) command: Vec<String>,
    pub(crate) args: Value,
    pub(crate) queue: Option<String>,
}

/// When a `sleep` ends, as the agent asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Wake {
    /// This long after the step is first opened.
    After(Duration),
    /// At this time.
    At(SystemTime),
}

impl Request {
    /// Whether it closes a step the agent opened (`commit`, `fail`)
    /// rather than opening or asking anything.
    pub(crate) fn closes_a_step(&self) -> bool {
        matches!(
            self,
            Self::Commit { .. } | Self::Reconciled { .. } | Self::Fail { .. }
        )
    }

    pub(crate) fn id(&self) -> &Value {
        match self {
            Self::Call { id, .. }
            | Self::Begin { id, .. }
            | Self::Commit { id, .. }
            | Self::Reconciled { id, .. }
            | Self::Fail { id, .. }
            | Self::Result { id, .. }
            | Self::Retry { id, .. }
            | Self::Patched { id, .. }
            | Self::Wait { id, .. }
            | Self::Sleep { id, .. }
            | Self::Spawn { id, .. }
            | Self::Join { id, .. }
            | Self::Ahead { id }
            | Self::Replayed { id, .. }
            | Self::Find { id, .. } => id,
        }
    }
}

/// What one line from the agent is.
#[derive(Debug)]
pub(crate) enum Line {
    /// Not a request: copied to durun's stdout unchanged.
    Passthrough,
    Request(Request),
    /// A request that cannot be served; answered `bad_request`.
    Invalid {
        id: Value,
        message: String,
    },
}

/// Classifies one line (without its `\n`).
///
/// Whatever Python's `json.loads` reads as an object with a string `op` is
/// a request and gets an answer: `NaN`, `Infinity` and lone surrogates,
/// which cannot be journaled as JSON, get `bad_request` naming them.
/// The longest `sleep` durun takes, in seconds (about 3,000 years): a
/// wake time past it is a mistake, and times that far do not print.
pub(crate) const MAX_SLEEP_SECONDS: f64 = 1e11;

pub(crate) fn parse_line(bytes: &[u8]) -> Line {
    let object = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(object)) => object,
        Ok(_) => return Line::Passthrough,
        Err(err) => return reread(bytes, &err),
    };
    classify(object)
}

/// A line serde refused, read again as Python would: a request still gets
/// an answer, `bad_request` naming what JSON cannot hold.
fn reread(bytes: &[u8], err: &serde_json::Error) -> Line {
    match lenient::reread(bytes, err) {
        Reread::Nothing => Line::Passthrough,
        Reread::Object(object) => classify(object),
        Reread::TooDeep(id) => Line::Invalid {
            id,
            message: format!("the request is nested deeper than {MAX_DEPTH} levels"),
        },
        Reread::Extras(object, problem) => match classify(object) {
            Line::Passthrough => Line::Passthrough,
            Line::Request(request) => Line::Invalid {
                id: request.id().clone(),
                message: problem,
            },
            Line::Invalid { id, .. } => Line::Invalid {
                id,
                message: problem,
            },
        },
    }
}

fn classify(object: Map<String, Value>) -> Line {
    let Some(Value::String(op)) = object.get("op") else {
        return Line::Passthrough;
    };
    let op = op.clone();
    match decode(&op, object) {
        Ok(request) => Line::Request(request),
        Err((id, message)) => Line::Invalid { id, message },
    }
}

type DecodeError = (Value, String);

fn decode(op: &str, mut object: Map<String, Value>) -> Result<Request, DecodeError> {
    let id = request_id(op, &mut object).map_err(|message| (Value::Null, message))?;
    let fail = |message: String| (id.clone(), message);
    let request = match op {
        "call" => Request::Call {
            tool: required_name(&mut object, "tool", op).map_err(fail)?,
            args: object.remove("args").unwrap_or_else(empty_object),
            id: id.clone(),
        },
        "begin" => Request::Begin {
            name: required_name(&mut object, "name", op).map_err(fail)?,
            args: object.remove("args").unwrap_or_else(empty_object),
            effect: effect(&mut object).map_err(fail)?,
            mcp: is_mcp(&mut object).map_err(fail)?,
            id: id.clone(),
        },
        "commit" if optional(&mut object, "reconciled") == Some(Value::Bool(true)) => {
            Request::Reconciled {
                step: closes(&mut object, op).map_err(fail)?,
                output: object.remove("output").unwrap_or(Value::Null),
                id: id.clone(),
            }
        }
        "commit" => Request::Commit {
            step: closes(&mut object, op).map_err(fail)?,
            output: object.remove("output").unwrap_or(Value::Null),
            usage: usage(&mut object).map_err(fail)?,
            id: id.clone(),
        },
        "fail" => Request::Fail {
            step: closes(&mut object, op).map_err(fail)?,
            error: failure(&mut object).map_err(fail)?,
            output: optional(&mut object, "output"),
            id: id.clone(),
        },
        "result" => Request::Result {
            output: object.remove("output").unwrap_or(Value::Null),
            id: id.clone(),
        },
        "patched" => Request::Patched {
            name: required_name(&mut object, "name", op).map_err(fail)?,
            id: id.clone(),
        },
        "retry" => Request::Retry {
            step: required_step(&mut object, op).map_err(fail)?,
            id: id.clone(),
        },
        "wait" => Request::Wait {
            name: required_name(&mut object, "name", op).map_err(fail)?,
            data: object.remove("data").unwrap_or(Value::Null),
            timeout: timeout(&mut object).map_err(fail)?,
            id: id.clone(),
        },
        "sleep" => {
            let (args, wake) = sleep(&mut object).map_err(fail)?;
            Request::Sleep {
                args,
                wake,
                id: id.clone(),
            }
        }
        "spawn" => Request::Spawn {
            spawn: Box::new(spawn(&mut object, op).map_err(fail)?),
            id: id.clone(),
        },
        "join" => Request::Join {
            task: required_string(&mut object, "task", op).map_err(fail)?,
            timeout: timeout(&mut object).map_err(fail)?,
            id: id.clone(),
        },
        "ahead" => Request::Ahead { id: id.clone() },
        "replayed" => Request::Replayed {
            through: match optional(&mut object, "through") {
                Some(Value::Number(number)) => number.as_u64().filter(|step| *step > 0),
                _ => None,
            }
            .ok_or_else(|| {
                fail("`through` of a `replayed` request must be a positive integer".to_owned())
            })?,
            key: required_string(&mut object, "idempotency_key", op).map_err(fail)?,
            id: id.clone(),
        },
        "find" => Request::Find {
            key: required_string(&mut object, "idempotency_key", op).map_err(fail)?,
            id: id.clone(),
        },
        other => return Err(fail(format!("unknown op {other:?}"))),
    };
    Ok(request)
}

/// A request's `id`: a string or an integer.
fn request_id(op: &str, object: &mut Map<String, Value>) -> Result<Value, String> {
    match object.remove("id") {
        Some(id @ Value::String(_)) => Ok(id),
        Some(Value::Number(number)) if is_integer_literal(&number.to_string()) => {
            Ok(Value::Number(number))
        }
        Some(Value::Null) | None => Err(format!("`{op}` request has no `id`")),
        Some(_) => Err("`id` must be a string or an integer".to_owned()),
    }
}

/// The `effect` of a `begin`, if it names one.
fn effect(object: &mut Map<String, Value>) -> Result<Option<Effect>, String> {
    match optional(object, "effect") {
        None => Ok(None),
        Some(Value::String(text)) => Effect::parse(&text)
            .map(Some)
            .ok_or_else(|| format!("`effect` must be \"read\" or \"mutate\", not {text:?}")),
        Some(_) => Err("`effect` must be a string".to_owned()),
    }
}

/// Whether a `begin` is an MCP tool call (`"kind": "mcp"`).
fn is_mcp(object: &mut Map<String, Value>) -> Result<bool, String> {
    match optional(object, "kind") {
        None => Ok(false),
        Some(Value::String(kind)) if kind == "mcp" => Ok(true),
        Some(Value::String(kind)) if kind == "begin" => Ok(false),
        Some(_) => Err(
            "`kind` must be \"begin\" or \"mcp\" (an MCP tool call, as `durun mcp` sends)"
                .to_owned(),
        ),
    }
}

/// The `usage` of a `commit`, checked.
fn usage(object: &mut Map<String, Value>) -> Result<Option<Value>, String> {
    match optional(object, "usage") {
        None => Ok(None),
        Some(usage @ Value::Object(_)) => {
            crate::usage::check_usage(&usage)?;
            Ok(Some(usage))
        }
        Some(_) => Err("`usage` must be an object".to_owned()),
    }
}

/// The `error` of a `fail`.
fn failure(object: &mut Map<String, Value>) -> Result<String, String> {
    match optional(object, "error") {
        Some(Value::String(text)) if text.contains('\0') => Err(
            "`error` of a `fail` request must not hold a NUL character (\\u0000); put exact bytes in `output`"
                .to_owned(),
        ),
        Some(Value::String(text)) => Ok(text),
        None => Ok("failed".to_owned()),
        Some(_) => Err("`error` must be a string".to_owned()),
    }
}

/// A `sleep`'s args as journaled, and when it wakes.
fn sleep(object: &mut Map<String, Value>) -> Result<(Value, Wake), String> {
    let seconds = optional(object, "seconds");
    let until = optional(object, "until");
    match (seconds, until) {
        (Some(seconds), None) => {
            let wake = match seconds.as_f64() {
                Some(n) if (0.0..MAX_SLEEP_SECONDS).contains(&n) => {
                    Wake::After(Duration::from_secs_f64(n))
                }
                Some(n) if n >= MAX_SLEEP_SECONDS => {
                    return Err(format!(
                        "`seconds` of a `sleep` is too far: {seconds} is past the limit of {MAX_SLEEP_SECONDS:e} seconds (about 3,000 years)"
                    ));
                }
                _ => {
                    return Err("`seconds` of a `sleep` must be a number, 0 or more".to_owned());
                }
            };
            Ok((serde_json::json!({ "seconds": seconds }), wake))
        }
        (None, Some(Value::String(until))) => {
            let at = crate::clock::parse(&until)
                .ok_or_else(|| {
                    format!(
                        "`until` of a `sleep` must be an RFC 3339 time in UTC like \"2026-12-01T09:00:00Z\", not {until:?}"
                    )
                })?;
            Ok((serde_json::json!({ "until": until }), Wake::At(at)))
        }
        (None, Some(_)) => Err("`until` of a `sleep` must be a string".to_owned()),
        _ => Err("a `sleep` request has either `seconds` or `until`".to_owned()),
    }
}

/// The child of a `spawn`.
fn spawn(object: &mut Map<String, Value>, op: &str) -> Result<SpawnArgs, String> {
    Ok(SpawnArgs {
        name: required_name(object, "name", op)?,
        command: match object.remove("command") {
            Some(Value::Array(words))
                if !words.is_empty() && words.iter().all(Value::is_string) =>
            {
                words
                    .into_iter()
                    .filter_map(|word| match word {
                        Value::String(word) => Some(word),
                        _ => None,
                    })
                    .collect()
            }
            _ => {
                return Err(
                    "`command` of a `spawn` must be a non-empty array of strings, the child's argv"
                        .to_owned(),
                );
            }
        },
        args: object.remove("args").unwrap_or(Value::Null),
        queue: match optional(object, "queue") {
            None => None,
            Some(Value::String(queue)) => {
                crate::names::check_queue(&queue).map_err(|err| format!("{err:#}"))?;
                Some(queue)
            }
            Some(_) => return Err("`queue` must be a string".to_owned()),
        },
    })
}

/// The `timeout` of a `wait` or `join`, if it has one.
fn timeout(object: &mut Map<String, Value>) -> Result<Option<Duration>, String> {
    optional(object, "timeout")
        .map(|value| {
            duration(&value).ok_or_else(|| {
                "`timeout` must be a duration like \"48h\" or \"90s\", or a number of seconds"
                    .to_owned()
            })
        })
        .transpose()
}

/// A duration as `"48h"`, `"1h 30m"` or a number of seconds.
fn duration(value: &Value) -> Option<Duration> {
    match value {
        Value::String(text) => humantime::parse_duration(text).ok(),
        Value::Number(number) => number
            .as_f64()
            .filter(|seconds| seconds.is_finite() && *seconds >= 0.0 && *seconds < 1e11)
            .map(Duration::from_secs_f64),
        _ => None,
    }
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

fn optional(object: &mut Map<String, Value>, name: &str) -> Option<Value> {
    object.remove(name).filter(|value| !value.is_null())
}

/// A name (a step's, a tool's, a signal's): a string that shows on one
/// line of stderr and in `inspect`, so no newline or control character.
fn required_name(object: &mut Map<String, Value>, name: &str, op: &str) -> Result<String, String> {
    let text = required_string(object, name, op)?;
    crate::names::check_name(&text)
        .map_err(|why| format!("`{name}` of a `{op}` request must not hold {why}"))?;
    Ok(text)
}

fn required_string(
    object: &mut Map<String, Value>,
    name: &str,
    op: &str,
) -> Result<String, String> {
    match optional(object, name) {
        // PostgreSQL takes no NUL in text: refused before anything is
        // written, on every journal alike.
        Some(Value::String(text)) if text.contains('\0') => Err(format!(
            "`{name}` of a `{op}` request must not hold a NUL character (\\u0000)"
        )),
        Some(Value::String(text)) if !text.is_empty() => Ok(text),
        Some(Value::String(_)) => Err(format!("`{name}` of a `{op}` request must not be empty")),
        Some(_) => Err(format!("`{name}` of a `{op}` request must be a string")),
        None => Err(format!("`{op}` request has no `{name}`")),
    }
}

fn required_step(object: &mut Map<String, Value>, op: &str) -> Result<u64, String> {
    match optional(object, "step") {
        Some(Value::Number(number)) => number
            .as_u64()
            .filter(|step| *step > 0)
            .ok_or_else(|| format!("`step` of a `{op}` request must be a positive integer")),
        Some(_) => Err(format!(
            "`step` of a `{op}` request must be a positive integer"
        )),
        None => Err(format!("`{op}` request has no `step`")),
    }
}

/// `step`, or `begin`: the id of the `begin` that opened the step.
fn closes(object: &mut Map<String, Value>, op: &str) -> Result<Closes, String> {
    match optional(object, "begin") {
        None => required_step(object, op).map(Closes::Step),
        Some(_) if optional(object, "step").is_some() => Err(format!(
            "a `{op}` request names its step by `step` or by `begin`, not both"
        )),
        Some(begin @ Value::String(_)) => Ok(Closes::Begin(Box::new(begin))),
        Some(Value::Number(number)) if is_integer_literal(&number.to_string()) => {
            Ok(Closes::Begin(Box::new(Value::Number(number))))
        }
        Some(_) => Err(format!(
            "`begin` of a `{op}` request must be the `id` of a `begin` (a string or an integer)"
        )),
    }
}

fn is_integer_literal(literal: &str) -> bool {
    !literal.contains(['.', 'e', 'E'])
}

#[cfg(test)]
mod properties;
#[cfg(test)]
mod spelled;
#[cfg(test)]
mod tests;
