//! What both backends share when they load a task's rows (SPEC 10): the
//! tables in the order they are written, and the checks made first.

use anyhow::Result;
use serde_json::Value;

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
