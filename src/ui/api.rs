//! Triggers from outside, without a shell: a webhook sends a task a
//! signal (`POST /api/tasks/ID/signals/NAME`, the body its data) or queues
//! a new task (`POST /api/tasks`, with `--allow-submit`). Each runs the
//! `durun` command it stands for, as the page's buttons do, and answers
//! JSON: `{"ok": true, …}`, or `{"ok": false, "message": …}` with the
//! command's own words.

use hyper::StatusCode;
use serde_json::{Value, json};

use super::Shared;
use super::actions::durun;
use super::http::{Reply, Req};

fn answer(status: StatusCode, body: &Value) -> Reply {
    Reply::json(body.to_string().into_bytes()).status(status)
}

fn refused(status: StatusCode, message: &str) -> Reply {
    answer(status, &json!({"ok": false, "message": message}))
}

/// The body as JSON; an empty body is `null`.
fn body_json(req: &Req) -> Result<Value, Reply> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&req.body).map_err(|err| {
        refused(
            StatusCode::BAD_REQUEST,
            &format!("the body is not JSON: {err}"),
        )
    })
}

/// `POST /api/tasks/ID/signals/NAME`: the body (JSON, or nothing) is the
/// signal's data; an `Idempotency-Key` header (or `?id=`) is its id, so a
/// webhook delivered twice is kept once.
pub(super) fn signal(req: &Req, shared: &Shared, id: &str, name: &str) -> Reply {
    let data = match body_json(req) {
        Ok(data) => data,
        Err(reply) => return reply,
    };
    // Options as `--name=VALUE` and the task id and name after `--`: a
    // name that starts with `-` is a name, never an option.
    let mut args = vec!["signal".to_owned(), format!("--data={data}")];
    if let Some(signal_id) = req
        .header("idempotency-key")
        .or_else(|| req.query.get("id").map(String::as_str))
    {
        args.push(format!("--id={signal_id}"));
    }
    args.extend(["--".to_owned(), id.to_owned(), name.to_owned()]);
    let said = durun(shared, &args, None);
    if said.ok {
        answer(
            StatusCode::OK,
            &json!({"ok": true, "message": said.message}),
        )
    } else {
        refused(StatusCode::UNPROCESSABLE_ENTITY, &said.message)
    }
}

/// `POST /api/tasks` with `{"command": [..], "task"?, "queue"?, "cwd"?,
/// "max_tokens"?}`: `durun submit`, in `cwd` (the server's directory if
/// not given). Only with `durun ui --allow-submit`: the token then lets
/// its holder run any command as the workers' user.
pub(super) fn submit(req: &Req, shared: &Shared) -> Reply {
    if !shared.allow_submit {
        return refused(
            StatusCode::FORBIDDEN,
            "submitting tasks over HTTP is off: start `durun ui` with --allow-submit to allow it",
        );
    }
    let body = match body_json(req) {
        Ok(Value::Object(body)) => body,
        Ok(_) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "the body must be a JSON object: {\"command\": [\"python3\", \"agent.py\"], \"queue\": \"default\"}",
            );
        }
        Err(reply) => return reply,
    };
    let command: Option<Vec<String>> = body.get("command").and_then(|command| {
        command
            .as_array()?
            .iter()
            .map(|word| word.as_str().map(str::to_owned))
            .collect()
    });
    let Some(command) = command.filter(|command| !command.is_empty()) else {
        return refused(
            StatusCode::BAD_REQUEST,
            "`command` must be a non-empty array of strings, the agent's argv",
        );
    };
    let mut args = vec!["submit".to_owned()];
    for (field, flag) in [("task", "--task"), ("queue", "--queue")] {
        match body.get(field) {
            None | Some(Value::Null) => {}
            // `--task=VALUE`: a value that starts with `-` stays a value.
            Some(Value::String(value)) => args.push(format!("{flag}={value}")),
            Some(_) => {
                return refused(
                    StatusCode::BAD_REQUEST,
                    &format!("`{field}` must be a string"),
                );
            }
        }
    }
    match body.get("max_tokens") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_u64().is_some() => {
            args.extend(["--max-tokens".to_owned(), n.to_string()]);
        }
        Some(_) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "`max_tokens` must be a whole number",
            );
        }
    }
    let cwd = match body.get("cwd") {
        None | Some(Value::Null) => None,
        Some(Value::String(cwd)) if std::path::Path::new(cwd).is_dir() => {
            Some(std::path::PathBuf::from(cwd))
        }
        Some(_) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "`cwd` must be a directory that exists on the server",
            );
        }
    };
    args.push("--".to_owned());
    args.extend(command);
    let said = durun(shared, &args, cwd.as_deref());
    if said.ok {
        answer(
            StatusCode::CREATED,
            &json!({"ok": true, "task": said.printed, "message": said.message}),
        )
    } else {
        refused(StatusCode::UNPROCESSABLE_ENTITY, &said.message)
    }
}
