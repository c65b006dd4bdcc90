//! `durun inspect`: the task list, one task's runs and steps, one step
//! whole, or a running task followed live.
//!
//! `--json` prints the shape of SPEC 6 for scripts; without it, tables for
//! people that fit the terminal. Reading never writes the journal and
//! never waits for a runner (WAL readers do not block writers).

mod follow;
mod json;
mod money;
mod step_view;
mod tree;
mod views;

use std::io::Write;

use anyhow::Result;
use serde_json::{Value, json};

use crate::cli::{InspectArgs, StatusFilter};
use crate::journal::{Access, Journal, Location, RunRecord, TaskRecord, TaskStatus};
use crate::report::table::Style;
use crate::report::thousands;
use crate::settings::Settings;
use crate::task::{Shown, shown, unknown_task};
use json::{StepOut, step_json, task_out, task_summary_json};
pub(crate) use money::{budget_left, cost_line};
pub(crate) use views::{age, held, took};

/// How many steps the task view shows unless `--all` says every one.
const VIEW_LIMIT: usize = 500;

pub(crate) fn exec(args: &InspectArgs, settings: &Settings) -> Result<i32> {
    let location = Location::of(settings)?;
    let missing = !location.exists()?;
    let style = Style::stdout(settings);
    let mut out = std::io::stdout().lock();
    if args.workers {
        show_workers(args, settings, (&location, missing), &style, &mut out)?;
        return Ok(0);
    }
    let Some(id) = &args.task else {
        // No journal yet: no tasks.
        let journal = if missing {
            None
        } else {
            Some(location.open(Access::Read, settings)?)
        };
        show_tasks(args, settings, journal, &style, &mut out)?;
        return Ok(0);
    };
    if missing {
        return Err(unknown_task(id, &location).into());
    }
    let mut journal = location.open(Access::Read, settings)?;
    let Some(task) = journal.task(id)? else {
        return Err(unknown_task(id, &location).into());
    };
    if args.follow {
        drop(out);
        if args.json {
            let cursor = match args.after.as_deref() {
                None => crate::task::events::Cursor::default(),
                Some(id) => crate::task::events::Cursor::after(id).ok_or_else(|| {
                    crate::error::Failure::usage(format!(
                        "--after {id}: not an event id durun gave"
                    ))
                    .hint("an event's id is its `id` member, e.g. 41 or 42.3")
                })?,
            };
            return follow::follow_events(journal.as_mut(), task, cursor, settings);
        }
        return follow::follow(journal.as_mut(), task, &style, settings);
    }
    let runs = journal.runs(id)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, out);
    if args.json && args.step.is_none() {
        task_json(journal.as_mut(), &task, &runs, settings, &mut out)?;
    } else if let Some(n) = args.step {
        show_step(
            journal.as_mut(),
            (&task, &runs),
            n,
            args.json,
            settings,
            &style,
            &mut out,
        )?;
    } else {
        show_task(
            journal.as_mut(),
            (&task, &runs),
            args.all,
            settings,
            &style,
            &mut out,
        )?;
    }
    out.flush()?;
    Ok(0)
}

/// Prints task `id` as `inspect ID --json` does: what `resume`, `fork`,
/// `approve`, `reject`, `signal` and `cancel` print with `--json` once
/// done.
pub(crate) fn print_task_json(settings: &Settings, id: &str) -> Result<()> {
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Read, settings)?;
    let Some(task) = journal.task(id)? else {
        return Err(unknown_task(id, &location).into());
    };
    let runs = journal.runs(id)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    task_json(journal.as_mut(), &task, &runs, settings, &mut out)?;
    out.flush()?;
    Ok(())
}

/// `inspect --workers`: the workers that share the journal.
fn show_workers(
    args: &InspectArgs,
    settings: &Settings,
    (location, missing): (&Location, bool),
    style: &Style,
    out: &mut dyn Write,
) -> Result<()> {
    let workers = if missing {
        Vec::new()
    } else {
        location.open(Access::Read, settings)?.workers()?
    };
    let now_ms = crate::journal::now_ms();
    let late = settings.lease.heartbeat * 2;
    if args.json {
        let workers: Vec<Value> = workers
            .iter()
            .map(|worker| json::worker_json(worker, now_ms, late))
            .collect();
        writeln!(out, "{}", json!({ "workers": workers }))?;
    } else {
        out.write_all(views::worker_list(style, &workers, now_ms, late).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// `inspect` with no task: the task list, or with `--tree` the families.
fn show_tasks(
    args: &InspectArgs,
    settings: &Settings,
    mut journal: Option<Box<dyn Journal>>,
    style: &Style,
    out: &mut dyn Write,
) -> Result<()> {
    if args.tree {
        let tasks = match journal.as_mut() {
            Some(journal) => listed(journal.as_mut(), settings, usize::MAX, &|_, _| true)?,
            None => Vec::new(),
        };
        tree::print(&tasks, args, out)?;
        return Ok(());
    }
    let tasks = match journal.as_mut() {
        Some(journal) => listed(
            journal.as_mut(),
            settings,
            args.limit.unwrap_or(usize::MAX),
            &|_, shown| {
                args.status
                    .is_none_or(|wanted| status_matches(wanted, shown.status))
            },
        )?,
        None => Vec::new(),
    };
    if args.json {
        list_json(&tasks, out)?;
    } else {
        out.write_all(views::task_list(style, &tasks, settings.now()).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// `inspect TASK --step N`: every version of one step.
fn show_step(
    journal: &mut dyn Journal,
    (task, runs): (&TaskRecord, &[RunRecord]),
    n: u64,
    as_json: bool,
    settings: &Settings,
    style: &Style,
    out: &mut dyn Write,
) -> Result<()> {
    let id = &task.id;
    let steps = journal.step_versions(id, n)?;
    if as_json {
        let steps: Vec<StepOut<'_>> = steps.iter().map(step_json).collect();
        let shown = shown(journal, task, settings)?;
        let signals = journal.signals(id)?;
        let family = crate::task::family(journal, task, settings)?;
        serde_json::to_writer(
            &mut *out,
            &json!({"task": task_out(task, runs, &shown, &signals, &family), "steps": steps}),
        )?;
        writeln!(out)?;
        return Ok(());
    }
    // A live runner's pending step is pending, else interrupted.
    let driven = crate::task::shown_status(task, settings) == TaskStatus::Running;
    if steps.is_empty() {
        return Err(
            crate::error::Failure::config(format!("task {id} has no step {n}"))
                .hint(format!("`durun inspect {id}` lists its steps"))
                .into(),
        );
    }
    for (i, step) in steps.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        out.write_all(step_view::step_view(style, task, driven, step, settings.now()).as_bytes())?;
    }
    Ok(())
}

/// `inspect TASK`: the task, its runs and its last steps (`all`: every
/// one).
fn show_task(
    journal: &mut dyn Journal,
    (task, runs): (&TaskRecord, &[RunRecord]),
    all: bool,
    settings: &Settings,
    style: &Style,
    out: &mut dyn Write,
) -> Result<()> {
    let id = &task.id;
    let total = journal.count_steps(id)?;
    let last = (!all && total > VIEW_LIMIT as u64).then_some(VIEW_LIMIT);
    let steps = journal.steps_tail(id, last)?;
    let shown = shown(journal, task, settings)?;
    let family = crate::task::family(journal, task, settings)?;
    out.write_all(
        views::task_view(style, (task, &shown, &family), runs, &steps, settings.now()).as_bytes(),
    )?;
    if last.is_some() {
        writeln!(
            out,
            "… the last {VIEW_LIMIT} of {} steps; `--all` shows every one, `--json` prints them for scripts",
            thousands(total)
        )?;
    }
    Ok(())
}

/// The tasks, newest first, as they are shown, that `keep` keeps: at most
/// `limit` of them.
pub(crate) fn listed(
    journal: &mut dyn Journal,
    settings: &Settings,
    limit: usize,
    keep: &dyn Fn(&TaskRecord, &Shown) -> bool,
) -> Result<Vec<(TaskRecord, Shown)>> {
    let mut tasks = Vec::new();
    for task in journal.tasks()? {
        if tasks.len() >= limit {
            break;
        }
        let shown = shown(journal, &task, settings)?;
        if keep(&task, &shown) {
            tasks.push((task, shown));
        }
    }
    Ok(tasks)
}

/// `inspect --json`'s task list (SPEC 6), also `/api/tasks` of `durun ui`.
pub(crate) fn list_json(tasks: &[(TaskRecord, Shown)], out: &mut dyn Write) -> Result<()> {
    let tasks: Vec<Value> = tasks
        .iter()
        .map(|(task, shown)| task_summary_json(task, shown))
        .collect();
    writeln!(out, "{}", json!({ "tasks": tasks }))?;
    Ok(())
}

/// `inspect TASK --json` (SPEC 6), also `/api/tasks/ID` of `durun ui`.
/// Streamed: each step is written as it is read.
pub(crate) fn task_json(
    journal: &mut dyn Journal,
    task: &TaskRecord,
    runs: &[RunRecord],
    settings: &Settings,
    out: &mut dyn Write,
) -> Result<()> {
    out.write_all(b"{\"task\":")?;
    let shown = shown(journal, task, settings)?;
    let signals = journal.signals(&task.id)?;
    let family = crate::task::family(journal, task, settings)?;
    serde_json::to_writer(&mut *out, &task_out(task, runs, &shown, &signals, &family))?;
    out.write_all(b",\"steps\":[")?;
    let mut first = true;
    journal.visit_steps(&task.id, true, None, &mut |step| {
        if !std::mem::take(&mut first) {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, &step_json(&step))?;
        Ok(())
    })?;
    out.write_all(b"]}\n")?;
    Ok(())
}

pub(super) fn status_matches(wanted: StatusFilter, status: TaskStatus) -> bool {
    matches!(
        (wanted, status),
        (StatusFilter::Running, TaskStatus::Running)
            | (StatusFilter::Completed, TaskStatus::Completed)
            | (StatusFilter::Failed, TaskStatus::Failed)
            | (StatusFilter::Interrupted, TaskStatus::Interrupted)
            | (StatusFilter::Cancelled, TaskStatus::Cancelled)
            | (StatusFilter::Waiting, TaskStatus::Waiting)
            | (StatusFilter::Sleeping, TaskStatus::Sleeping)
            | (StatusFilter::OverBudget, TaskStatus::OverBudget)
            | (StatusFilter::Queued, TaskStatus::Queued)
    )
}
