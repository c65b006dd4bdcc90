//! `durun inspect`: the task list, or one task's runs and steps.
//!
//! `--json` prints the shape of SPEC 6 for scripts; without it, tables for
//! people. Reading never writes the journal and never waits on a runner.

use std::io::Write as _;

use anyhow::Result;
use serde_json::{json, Value};

use super::resume::unknown_task;
use super::run::shell_words;
use crate::cli::{GlobalArgs, InspectArgs};
use crate::journal::{self, Access, Location, RunRecord, StepRecord, TaskRecord, TaskStatus};
use crate::lease::{self, Holder};
use crate::report::thousands;

pub fn exec(args: &InspectArgs, global: &GlobalArgs) -> Result<i32> {
    let location = Location::resolve(global.journal.as_deref())?;
    let missing = matches!(&location, Location::Sqlite(path) if !path.exists());
    let mut out = std::io::stdout().lock();
    match &args.task {
        None if missing => {
            // No journal yet: no tasks.
            if args.json {
                writeln!(out, "{}", json!({"tasks": []}))?;
            } else {
                writeln!(out, "no tasks yet")?;
            }
        }
        None => {
            let mut journal = journal::open(&location, Access::Read)?;
            let tasks = journal.tasks()?;
            if args.json {
                let tasks: Vec<Value> = tasks.iter().map(task_summary_json).collect();
                serde_json::to_writer(&mut out, &json!({ "tasks": tasks }))?;
                writeln!(out)?;
            } else {
                print_task_list(&mut out, &tasks)?;
            }
        }
        Some(id) => {
            if missing {
                return Err(unknown_task(id, &location).into());
            }
            let mut journal = journal::open(&location, Access::Read)?;
            let Some(task) = journal.task(id)? else {
                return Err(unknown_task(id, &location).into());
            };
            let runs = journal.runs(id)?;
            let steps = journal.steps(id, true)?;
            if args.json {
                serde_json::to_writer(&mut out, &task_json(&task, &runs, &steps))?;
                writeln!(out)?;
            } else {
                print_task(&mut out, &task, &runs, &steps)?;
            }
        }
    }
    out.flush()?;
    Ok(0)
}

/// The status a person should see: a `running` task whose runner is gone
/// is `interrupted`.
pub fn shown_status(task: &TaskRecord) -> TaskStatus {
    if task.status != TaskStatus::Running {
        return task.status;
    }
    let live = task
        .lease
        .as_ref()
        .is_some_and(|lease| lease::is_live(lease, &Holder::current(), journal::now_ms()));
    if live {
        TaskStatus::Running
    } else {
        TaskStatus::Interrupted
    }
}

fn task_summary_json(task: &TaskRecord) -> Value {
    json!({
        "id": task.id,
        "status": shown_status(task).as_str(),
        "command": task.argv,
        "steps": task.steps,
        "tokens_spent": task.tokens_spent,
        "tokens_saved": task.tokens_saved,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
    })
}

fn task_json(task: &TaskRecord, runs: &[RunRecord], steps: &[StepRecord]) -> Value {
    let runs: Vec<Value> = runs
        .iter()
        .map(|run| {
            json!({
                "run": run.run,
                "exit_code": run.exit_code,
                "replayed_steps": run.stats.replayed_steps,
                "executed_steps": run.stats.executed_steps,
                "tokens_spent": run.stats.tokens_spent,
                "tokens_saved": run.stats.tokens_saved,
                "host": run.host,
                "pid": run.pid,
                "started_at": run.started_at,
                "finished_at": run.finished_at,
            })
        })
        .collect();
    let steps: Vec<Value> = steps.iter().map(step_json).collect();
    json!({
        "task": {
            "id": task.id,
            "status": shown_status(task).as_str(),
            "command": task.argv,
            "cwd": task.cwd,
            "exit_code": task.exit_code,
            "output": task.output,
            "sync": task.sync.as_str(),
            "config_path": task.config_path,
            "steps": task.steps,
            "tokens_spent": task.tokens_spent,
            "tokens_saved": task.tokens_saved,
            "created_at": task.created_at,
            "updated_at": task.updated_at,
            "runs": runs,
        },
        "steps": steps,
    })
}

fn step_json(step: &StepRecord) -> Value {
    json!({
        "step": step.step,
        "name": step.name,
        "kind": step.kind.as_str(),
        "effect": step.effect.as_str(),
        "status": step.status.as_str(),
        "args": step.args,
        "args_hash": step.args_hash,
        "idempotency_key": step.idempotency_key,
        "attempts": step.attempts,
        "output": step.output,
        "error": step.error.as_ref().map(|error| json!({"code": error.code, "message": error.message})),
        "usage": step.usage,
        "tokens": step.tokens,
        "resolution": step.resolution,
        "created_at": step.created_at,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
    })
}

fn print_task_list(out: &mut impl std::io::Write, tasks: &[TaskRecord]) -> Result<()> {
    if tasks.is_empty() {
        writeln!(out, "no tasks yet")?;
        return Ok(());
    }
    let rows: Vec<[String; 6]> = tasks
        .iter()
        .map(|task| {
            [
                task.id.clone(),
                shown_status(task).as_str().to_owned(),
                task.steps.to_string(),
                thousands(task.tokens_saved),
                task.updated_at.clone(),
                shell_words(&task.argv),
            ]
        })
        .collect();
    print_table(
        out,
        &["TASK", "STATUS", "STEPS", "SAVED", "UPDATED", "COMMAND"],
        &rows,
    )
}

fn print_task(
    out: &mut impl std::io::Write,
    task: &TaskRecord,
    runs: &[RunRecord],
    steps: &[StepRecord],
) -> Result<()> {
    writeln!(out, "task     {}", task.id)?;
    writeln!(out, "status   {}", shown_status(task).as_str())?;
    writeln!(out, "command  {}", shell_words(&task.argv))?;
    writeln!(out, "cwd      {}", task.cwd)?;
    writeln!(out, "runs     {}", task.runs)?;
    writeln!(
        out,
        "tokens   {} spent, {} saved",
        thousands(task.tokens_spent),
        thousands(task.tokens_saved)
    )?;
    for run in runs {
        let exit = run
            .exit_code
            .map_or_else(|| "-".to_owned(), |code| code.to_string());
        writeln!(
            out,
            "run {:<4} exit {exit:<4} {} replayed, {} executed, {} tokens saved   {}",
            run.run,
            run.stats.replayed_steps,
            run.stats.executed_steps,
            thousands(run.stats.tokens_saved),
            run.started_at
        )?;
    }
    if let Some(output) = &task.output {
        writeln!(out, "output   {}", preview(output, 80))?;
    }
    writeln!(out)?;
    let rows: Vec<[String; 8]> = steps
        .iter()
        .map(|step| {
            [
                step.step.to_string(),
                step.name.clone(),
                step.kind.as_str().to_owned(),
                step.effect.as_str().to_owned(),
                step.status.as_str().to_owned(),
                step.attempts.to_string(),
                thousands(step.tokens),
                step.error.as_ref().map_or_else(
                    || {
                        step.output
                            .as_ref()
                            .map_or_else(String::new, |output| preview(output, 40))
                    },
                    |error| {
                        format!(
                            "{}: {}",
                            error.code,
                            error.message.lines().next().unwrap_or_default()
                        )
                    },
                ),
            ]
        })
        .collect();
    print_table(
        out,
        &[
            "STEP", "NAME", "KIND", "EFFECT", "STATUS", "TRIES", "TOKENS", "OUTPUT",
        ],
        &rows,
    )
}

fn preview(value: &Value, width: usize) -> String {
    let text = match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > width {
        let cut: String = flat.chars().take(width.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

fn print_table<const N: usize>(
    out: &mut impl std::io::Write,
    header: &[&str; N],
    rows: &[[String; N]],
) -> Result<()> {
    let mut widths = header.map(|title| title.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        use std::fmt::Write as _;
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        text.trim_end().to_owned()
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_cut_long_values() {
        assert_eq!(preview(&json!("a\nb"), 10), "a b");
        assert_eq!(preview(&json!("abcdefghijkl"), 5), "abcd…");
        assert_eq!(preview(&json!({"a": 1}), 20), r#"{"a":1}"#);
    }
}
