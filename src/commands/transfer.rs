//! `durun export`, `durun import`, `durun fork` (SPEC 10): a task's rows
//! moved between journals as checksummed JSON lines, or copied into a new
//! task that runs from a chosen step.

use std::io::{BufRead as _, Write as _};
use std::path::Path;

use anyhow::{Context as _, Result};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use crate::cli::{ExportArgs, ForkArgs, ImportArgs};
use crate::error::Failure;
use crate::journal::{self, Access, Location, TaskRows};
use crate::settings::Settings;
use crate::step_key::hex;
use crate::task::{check_task_id, new_task_id, unknown_task};

/// The export format this durun writes and reads.
const FORMAT: u64 = 1;

/// The member that names each kind of line after the header.
const KINDS: &[&str] = &["run", "step", "signal", "resolution"];

pub(crate) fn export(args: &ExportArgs, settings: &Settings) -> Result<i32> {
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Read, settings)?;
    let Some(rows) = journal.export(&args.task)? else {
        return Err(unknown_task(&args.task, &location).into());
    };
    let text = to_lines(&rows);
    match &args.output {
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
        Some(path) => {
            write_private(path, text.as_bytes())?;
            crate::report::say(&format!(
                "wrote task {} ({} steps) to {}",
                args.task,
                rows.steps.len(),
                path.display()
            ));
        }
    }
    Ok(0)
}

pub(crate) fn import(args: &ImportArgs, settings: &Settings) -> Result<i32> {
    if let Some(id) = &args.task {
        check_task_id(id)?;
    }
    let name = args.file.display().to_string();
    let text = if args.file == Path::new("-") {
        let mut text = String::new();
        for line in std::io::stdin().lock().lines() {
            text.push_str(&line?);
            text.push('\n');
        }
        text
    } else {
        std::fs::read_to_string(&args.file).map_err(|err| {
            Failure::config(format!("cannot read {name}: {err}"))
                .hint("pass a file `durun export TASK -o FILE` wrote")
        })?
    };
    let mut rows = from_lines(&text).map_err(|problem| {
        Failure::config(format!("{name} is not a whole durun export: {problem}"))
            .hint("nothing was imported; export the task again (`durun export TASK -o FILE`) and copy the file whole")
    })?;
    if let Some(id) = &args.task {
        rename(&mut rows, id);
    }
    // No runner holds it here: whatever ran it is gone.
    release(&mut rows.task);
    // Only a person hands an imported task to workers, by naming a queue:
    // a file must not start a command on every worker of this journal.
    if let Some(queue) = &args.queue {
        crate::task::check_queue(queue)?;
        let status = rows.task.get("status").and_then(Value::as_str);
        if !matches!(status, Some("completed" | "cancelled")) {
            rows.task.insert("status".to_owned(), json!("queued"));
        }
    }
    rows.task.insert("queue".to_owned(), json!(args.queue));
    rows.task
        .insert("imported_at".to_owned(), json!(journal::now()));
    let id = journal::task_id(&rows)?;
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    journal.import(&rows, args.replace, settings.holder())?;
    let status = rows
        .task
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("interrupted");
    let next = match status {
        "completed" => "it is completed; `durun inspect` shows it".to_owned(),
        "cancelled" => "it was cancelled and never runs again".to_owned(),
        "queued" => format!(
            "a `durun worker` of queue {} runs it",
            args.queue.as_deref().unwrap_or("default")
        ),
        "waiting" | "sleeping" => format!("{status}; `durun resume {id}` continues it when ready"),
        _ => format!("`durun resume {id}` continues it"),
    };
    crate::report::say(&format!(
        "imported task {id} ({} steps) into {}; {next}",
        rows.steps.len(),
        location.describe()
    ));
    say_what_it_runs(&rows.task);
    Ok(0)
}

pub(crate) fn fork(args: &ForkArgs, settings: &Settings) -> Result<i32> {
    if let Some(id) = &args.new_task {
        check_task_id(id)?;
    }
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    let Some(mut rows) = journal.export(&args.task)? else {
        return Err(unknown_task(&args.task, &location).into());
    };
    let from = args.from_step;
    let index = |row: &Map<String, Value>, column: &str| row.get(column).and_then(Value::as_u64);
    let live = |row: &Map<String, Value>| row.get("status") != Some(&json!("discarded"));
    let last = rows
        .steps
        .iter()
        .filter(|row| live(row))
        .filter_map(|row| index(row, "step_index"))
        .max()
        .unwrap_or(0);
    if from > last + 1 {
        return Err(Failure::config(format!(
            "task {} has {last} steps; a fork runs from step {} at the latest",
            args.task,
            last + 1
        ))
        .hint(format!("`durun inspect {}` lists its steps", args.task))
        .into());
    }
    // With `--output`, step N is copied too, answered with the file.
    let copied = if let Some(file) = &args.output {
        if from > last {
            return Err(Failure::config(format!(
                "task {} has {last} steps: there is no step {from} to answer with {}",
                args.task,
                file.display()
            ))
            .hint(format!("`durun inspect {}` lists its steps", args.task))
            .into());
        }
        let row = rows
            .steps
            .iter_mut()
            .find(|row| live(row) && index(row, "step_index") == Some(from))
            .ok_or_else(|| Failure::config(format!("task {} has no step {from}", args.task)))?;
        edited(row, file)?;
        from + 1
    } else {
        from
    };
    rows.steps
        .retain(|row| live(row) && index(row, "step_index").is_some_and(|step| step < copied));
    rows.signals
        .retain(|row| index(row, "taken_by").is_some_and(|step| step < copied));
    rows.resolutions
        .retain(|row| index(row, "step_index").is_some_and(|step| step < from));
    rows.runs.clear();
    let id = args.new_task.clone().unwrap_or_else(new_task_id);
    rename(&mut rows, &id);
    let now = journal::now();
    for (column, value) in [
        ("status", json!("interrupted")),
        ("runs", json!(0)),
        ("exit_code", Value::Null),
        ("output", Value::Null),
        ("cancel_requested_at", Value::Null),
        ("created_at", json!(now)),
        ("updated_at", json!(now)),
    ] {
        rows.task.insert(column.to_owned(), value);
    }
    release(&mut rows.task);
    rows.task.insert("imported_at".to_owned(), Value::Null);
    journal.import(&rows, false, settings.holder())?;
    crate::report::say(&if copied > from {
        format!(
            "forked task {} into {id}: steps 1-{} replay from the copy, step {from} answers with the edited output, step {copied} on runs anew; `durun resume {id}` runs it",
            args.task,
            from - 1
        )
    } else {
        format!(
            "forked task {} into {id}: steps 1-{} replay from the copy, step {from} on runs anew; `durun resume {id}` runs it",
            args.task,
            from - 1
        )
    });
    if args.json {
        drop(journal);
        crate::commands::inspect::print_task_json(settings, &id)?;
    } else {
        println!("{id}");
    }
    Ok(0)
}

/// The task as JSON lines: a header, one line per row, and an end line
/// that counts and checksums the lines before it.
fn to_lines(rows: &TaskRows) -> String {
    let mut text = String::new();
    let mut push = |line: Value| {
        text.push_str(&line.to_string());
        text.push('\n');
    };
    push(json!({"durun_export": FORMAT, "task": rows.task}));
    for (kind, list) in
        KINDS
            .iter()
            .zip([&rows.runs, &rows.steps, &rows.signals, &rows.resolutions])
    {
        for row in list {
            push(json!({ *kind: row }));
        }
    }
    let lines = text.lines().count();
    let sha256 = hex(&Sha256::digest(text.as_bytes()));
    text.push_str(&json!({"end": true, "lines": lines, "sha256": sha256}).to_string());
    text.push('\n');
    text
}

/// Reads an export back, refusing anything but a whole, unaltered one.
fn from_lines(text: &str) -> Result<TaskRows, String> {
    let Some(body_end) = text.trim_end_matches('\n').rfind('\n').map(|at| at + 1) else {
        return Err("it has no end line (truncated?)".to_owned());
    };
    let (body, end) = text.split_at(body_end);
    let end: Value = serde_json::from_str(end.trim_end())
        .map_err(|_| "its last line is not the end line (truncated?)")?;
    if end["end"] != true {
        return Err("its last line is not the end line (truncated?)".to_owned());
    }
    let lines = body.lines().count();
    if end["lines"].as_u64() != Some(lines as u64) {
        return Err(format!(
            "it has {lines} lines where its end line counts {}",
            end["lines"]
        ));
    }
    if end["sha256"].as_str() != Some(hex(&Sha256::digest(body.as_bytes())).as_str()) {
        return Err("its checksum does not match: it was altered".to_owned());
    }
    let mut rows = TaskRows::default();
    for (number, line) in body.lines().enumerate() {
        let Ok(Value::Object(mut object)) = serde_json::from_str::<Value>(line) else {
            return Err(format!("line {} is not a JSON object", number + 1));
        };
        if number == 0 {
            match object.get("durun_export").and_then(Value::as_u64) {
                Some(FORMAT) => {}
                Some(format) => {
                    return Err(format!(
                        "it is export format {format}, and this durun reads format {FORMAT} (upgrade durun)"
                    ));
                }
                None => return Err("its first line is not a durun export header".to_owned()),
            }
            match object.remove("task") {
                Some(Value::Object(task)) => rows.task = task,
                _ => return Err("its header holds no task".to_owned()),
            }
            journal::check_row("task", &rows.task)
                .map_err(|problem| format!("line 1, the task: {problem}"))?;
            continue;
        }
        let Some((kind, Value::Object(row))) = object.into_iter().next() else {
            return Err(format!("line {} is not a row", number + 1));
        };
        journal::check_row(&kind, &row)
            .map_err(|problem| format!("line {}, a {kind}: {problem}", number + 1))?;
        match kind.as_str() {
            "run" => rows.runs.push(row),
            "step" => rows.steps.push(row),
            "signal" => rows.signals.push(row),
            "resolution" => rows.resolutions.push(row),
            other => {
                return Err(format!(
                    "line {} holds an unknown kind {other:?}",
                    number + 1
                ));
            }
        }
    }
    if rows.task.is_empty() {
        return Err("it holds no task".to_owned());
    }
    journal::check_numbering(&rows.steps)?;
    Ok(rows)
}

/// The command and directory of an imported task, for the person who is
/// about to run what a file says.
fn say_what_it_runs(task: &Map<String, Value>) {
    let argv: Vec<String> = task
        .get("argv")
        .and_then(Value::as_str)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    let cwd = task.get("cwd").and_then(Value::as_str).unwrap_or("?");
    crate::report::say(&format!("it runs {}", crate::task::runs_in(&argv, cwd)));
}

/// Gives the rows another task id.
fn rename(rows: &mut TaskRows, id: &str) {
    rows.task.insert("id".to_owned(), json!(id));
    for row in rows
        .runs
        .iter_mut()
        .chain(&mut rows.steps)
        .chain(&mut rows.signals)
        .chain(&mut rows.resolutions)
    {
        row.insert("task_id".to_owned(), json!(id));
    }
}

/// Clears the lease and any worker's claim: whatever ran it is gone, and
/// a `running` or `queued` task becomes `interrupted`, resumable by hand.
fn release(task: &mut Map<String, Value>) {
    for column in [
        "lease_host",
        "lease_pid",
        "lease_pid_start",
        "lease_heartbeat",
        "lease_run",
        "claimed_by",
        "claimed_at",
    ] {
        if task.contains_key(column) {
            task.insert(column.to_owned(), Value::Null);
        }
    }
    if matches!(
        task.get("status").and_then(Value::as_str),
        Some("running" | "queued")
    ) {
        task.insert("status".to_owned(), json!("interrupted"));
    }
}

/// Writes `bytes` to `path` readable by its owner only, whole or not at
/// all (a temporary file renamed into place).
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    let mut temporary = path.to_path_buf();
    temporary.set_file_name(format!(".{}.tmp", name.to_string_lossy()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    };
    write().map_err(|err| {
        let _ = std::fs::remove_file(&temporary);
        Failure::config(format!("cannot write {}: {err}", path.display()))
            .hint("choose a file in a directory you can write")
            .into()
    })
}

/// A step's row answered with `file` (SPEC 20): a finished step with the
/// file as its output, marked `edited`, that costs nothing. A model call's
/// file is the answer body the agent gets, with status 200 and the
/// recorded content type; any other step's is its output JSON.
fn edited(row: &mut Map<String, Value>, file: &std::path::Path) -> Result<()> {
    let text = std::fs::read_to_string(file).map_err(|err| {
        Failure::config(format!("cannot read {}: {err}", file.display()))
            .hint("--output takes a text file: an answer body, or an output as JSON")
    })?;
    let recorded: Value = row
        .get("output")
        .and_then(Value::as_str)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(Value::Null);
    let output = if row.get("kind") == Some(&json!("proxy")) {
        let content_type = recorded
            .get("content_type")
            .and_then(Value::as_str)
            .unwrap_or("application/json")
            .to_owned();
        match serde_json::from_str::<Value>(&text) {
            Ok(body) if content_type.contains("json") => {
                json!({"status": 200, "content_type": content_type, "body": body})
            }
            _ => json!({"status": 200, "content_type": content_type, "text": text}),
        }
    } else {
        serde_json::from_str::<Value>(&text).map_err(|err| {
            Failure::config(format!("{} is not JSON: {err}", file.display()))
                .hint("a step's output is JSON; a model call's answer body may be any text")
        })?
    };
    let now = journal::now();
    for (column, value) in [
        ("status", json!("committed")),
        ("output", json!(output.to_string())),
        ("error_code", Value::Null),
        ("error", Value::Null),
        ("usage", Value::Null),
        ("tokens", json!(0)),
        ("cost_nanos", Value::Null),
        ("resolution", json!("edited")),
        ("finished_at", json!(now)),
    ] {
        row.insert(column.to_owned(), value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> TaskRows {
        let mut rows = TaskRows {
            task: json!({"id": "t1", "status": "running", "sync_mode": "full",
                "argv": "[\"true\"]", "cwd": "/", "created_at": "2026-12-01T09:00:00.000Z"})
            .as_object()
            .unwrap()
            .clone(),
            ..TaskRows::default()
        };
        let hash = "0".repeat(64);
        rows.steps.push(
            json!({"task_id": "t1", "step_index": 1, "output": "{\"a\":1}", "status": "committed",
                "kind": "begin", "effect": "read", "args": "{}", "attempts": 1,
                "args_hash": hash, "idempotency_key": hash})
            .as_object()
            .unwrap()
            .clone(),
        );
        rows
    }

    #[test]
    fn an_export_reads_back_as_itself() {
        let text = to_lines(&rows());
        assert_eq!(from_lines(&text).unwrap(), rows());
        assert_eq!(text.lines().count(), 3);
    }

    #[test]
    fn a_truncated_or_altered_export_is_refused() {
        let text = to_lines(&rows());
        let cut = &text[..text.len() - 20];
        assert!(from_lines(cut).unwrap_err().contains("truncated"), "{cut}");
        let without_end = text.lines().take(2).collect::<Vec<_>>().join("\n") + "\n";
        assert!(from_lines(&without_end).is_err());
        let altered = text.replace("\\\"a\\\":1", "\\\"a\\\":2");
        assert_ne!(altered, text);
        assert!(from_lines(&altered).unwrap_err().contains("altered"));
        assert!(from_lines("").is_err());
    }
}
