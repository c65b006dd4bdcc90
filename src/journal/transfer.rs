//! What both backends share when they load a task's rows (SPEC 10): the
//! tables in the order they are written, and the checks made first.

use anyhow::Result;
use serde_json::{Map, Value};

use super::TaskRows;
use crate::error::Failure;

/// The tables of a task, parents first.
pub(crate) const TABLES: &[&str] = &["tasks", "runs", "steps", "signals", "resolutions"];

/// The id of the task the rows hold, checked against every row.
pub(crate) fn task_id(rows: &TaskRows) -> Result<String> {
    let Some(Value::String(id)) = rows.task.get("id") else {
        return Err(Failure::config("the task's row has no id").into());
    };
    let children = rows
        .runs
        .iter()
        .chain(&rows.steps)
        .chain(&rows.signals)
        .chain(&rows.resolutions);
    for row in children {
        if row.get("task_id") != Some(&Value::String(id.clone())) {
            return Err(Failure::config(format!("a row does not belong to task {id}")).into());
        }
    }
    Ok(id.clone())
}

/// The error for an import over a task that exists.
pub(crate) fn exists(id: &str) -> Failure {
    Failure::config(format!("the journal already holds a task {id}"))
        .hint("`--task NEW_ID` imports it under another id; `--replace` overwrites the one here")
}

/// The error for a column this journal does not have.
pub(crate) fn unknown_column(table: &str, column: &str) -> Failure {
    Failure::config(format!(
        "the export has a column {table}.{column} this journal does not know"
    ))
    .hint("it was written by a newer durun: import it with that version")
}

/// A row of an export, checked as `run` checks its own input (SPEC 10): a
/// checksum proves the file whole, not honest. `Err` names what is wrong.
pub(crate) fn check_row(kind: &str, row: &Map<String, Value>) -> Result<(), String> {
    use crate::journal::{ResolutionKind, StepKind, StepStatus, TaskStatus};
    use crate::protocol::{Effect, ErrorCode};
    for (column, value) in row {
        // Times are RFC 3339 text; `claimed_at` is milliseconds.
        if column.ends_with("_at") && column != "claimed_at" {
            match value {
                Value::Null => {}
                Value::String(text) if crate::clock::parse(text).is_some() => {}
                _ => return Err(format!("{column} is not a time: {value}")),
            }
        }
    }
    let text = |column: &str| row.get(column).and_then(Value::as_str);
    let known = |column: &str, ok: fn(&str) -> bool| match text(column) {
        Some(value) if ok(value) => Ok(()),
        _ => Err(format!(
            "{column} {} is not one durun knows",
            row.get(column).unwrap_or(&Value::Null)
        )),
    };
    let json_text = |column: &str, nullable: bool| match row.get(column) {
        None | Some(Value::Null) if nullable => Ok(None),
        Some(Value::String(text)) => serde_json::from_str::<Value>(text)
            .map(Some)
            .map_err(|err| format!("{column} is not JSON text: {err}")),
        other => Err(format!(
            "{column} is not JSON text: {}",
            other.unwrap_or(&Value::Null)
        )),
    };
    let count = |column: &str, least: u64| match row.get(column).and_then(Value::as_u64) {
        Some(n) if n >= least && n <= 1 << 53 => Ok(()),
        _ => Err(format!(
            "{column} {} is not a number of {least} or more",
            row.get(column).unwrap_or(&Value::Null)
        )),
    };
    match kind {
        "task" => {
            let id = text("id").unwrap_or_default();
            crate::names::check_task_id(id).map_err(|err| {
                format!(
                    "{err} ({})",
                    crate::error::failure_of(&err)
                        .and_then(|failure| failure.hint.clone())
                        .unwrap_or_default()
                )
            })?;
            known("status", |s| TaskStatus::parse(s).is_some())?;
            known("sync_mode", |s| crate::config::SyncMode::parse(s).is_some())?;
            match json_text("argv", false)? {
                Some(Value::Array(words))
                    if !words.is_empty() && words.iter().all(Value::is_string) => {}
                _ => return Err("argv is not a list of words".to_owned()),
            }
            json_text("output", true)?;
            if !row.get("cwd").is_some_and(Value::is_string) {
                return Err("cwd is not a directory name".to_owned());
            }
            if let Some(Value::String(config)) = row.get("config") {
                crate::config::Config::parse(config)
                    .map_err(|err| format!("config is not a durun.toml: {err}"))?;
            }
        }
        "run" => {
            count("run", 1)?;
        }
        "step" => {
            count("step_index", 1)?;
            count("attempts", 0)?;
            known("status", |s| StepStatus::parse(s).is_some())?;
            known("kind", |s| StepKind::parse(s).is_some())?;
            known("effect", |s| Effect::parse(s).is_some())?;
            if !matches!(row.get("error_code"), None | Some(Value::Null)) {
                known("error_code", |s| ErrorCode::parse(s).is_some())?;
            }
            json_text("args", false)?;
            json_text("output", true)?;
            json_text("usage", true)?;
            for column in ["args_hash", "idempotency_key", "request_hash"] {
                // A request hash is for a proxied step's request alone.
                let absent = column == "request_hash" && row.get(column).is_none_or(Value::is_null);
                if !absent && !text(column).is_some_and(is_sha256) {
                    return Err(format!("{column} is not a SHA-256 in hex"));
                }
            }
        }
        "signal" => {
            json_text("data", false)?;
            if !matches!(row.get("taken_by"), None | Some(Value::Null)) {
                count("taken_by", 1)?;
            }
        }
        "resolution" => {
            count("step_index", 1)?;
            known("action", |s| ResolutionKind::parse(s).is_some())?;
        }
        _ => {}
    }
    Ok(())
}

/// The task's steps numbered 1..n without gaps, one live row per number
/// (a discarded row keeps its number beside its replacement): `Err` names
/// the first number that breaks it.
pub(crate) fn check_numbering(steps: &[Map<String, Value>]) -> Result<(), String> {
    let mut live = std::collections::BTreeSet::new();
    let mut all = std::collections::BTreeSet::new();
    for row in steps {
        let index = row.get("step_index").and_then(Value::as_u64).unwrap_or(0);
        all.insert(index);
        if row.get("status").and_then(Value::as_str) != Some("discarded") && !live.insert(index) {
            return Err(format!("step {index} appears twice"));
        }
    }
    for (expected, index) in (1..).zip(&all) {
        if *index != expected {
            return Err(format!("the steps jump from {} to {index}", expected - 1));
        }
    }
    Ok(())
}

/// Whether `hash` is a SHA-256 in hex.
fn is_sha256(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}
