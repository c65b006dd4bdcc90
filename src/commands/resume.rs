//! `durun resume TASK`: relaunch the recorded command in the recorded
//! directory; finished steps replay from the journal.

use anyhow::Result;

use super::session;
use crate::cli::ResumeArgs;
use crate::config::SyncMode;
use crate::error::Failure;
use crate::journal::{self, Access, Journal, Location, Opened, TaskRecord, TaskStatus};
use crate::settings::Settings;
use crate::task::unknown_task;

pub(crate) fn exec(args: &ResumeArgs, settings: &Settings) -> Result<i32> {
    if args.jobs.is_some() && !args.all {
        return Err(Failure::usage("--jobs goes with --all")
            .hint("durun resume --all --jobs 4")
            .into());
    }
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    let Some(id) = &args.task else {
        return resume_all(journal.as_mut(), args.jobs.unwrap_or(1), settings);
    };
    resume_task(journal.as_mut(), id, args, settings, None)
}

/// Resumes task `id`: `durun resume TASK`, and a worker's run of a task
/// on a thread of its own (`worker`).
pub(super) fn resume_task(
    journal: &mut dyn Journal,
    id: &str,
    args: &ResumeArgs,
    settings: &Settings,
    worker: Option<&session::ForWorker<'_>>,
) -> Result<i32> {
    // A plain resume (no step to go back to, no budget to change) reads
    // the task with its start.
    let plain = args.from_step.is_none()
        && args.limits.max_tokens.is_none()
        && args.limits.max_cost_nanos.is_none();
    let opened = if plain {
        open(journal, id, settings)?
    } else {
        journal.task(id)?.map(|task| (task, session::Begun::Not))
    };
    let Some((task, begun)) = opened else {
        return Err(unknown_task(id, &Location::of(settings)?).into());
    };
    // With --from-step a completed task runs again from that step.
    if task.status == TaskStatus::Completed && args.from_step.is_none() {
        crate::report::say(&format!(
            "task {} already completed; nothing to resume",
            task.id
        ));
        return Ok(0);
    }
    if let Some(imported_at) = &task.imported_at {
        // The first run since the import: say what a file is about to run.
        let runs = journal.runs(&task.id)?;
        if runs.iter().all(|run| run.started_at < *imported_at) {
            crate::report::say(&format!(
                "task {} was imported {imported_at}; it runs {}",
                task.id,
                crate::task::runs_in(&task.argv, &task.cwd)
            ));
        }
    }
    let task = session::raise_budget(journal, task, &args.limits)?;
    session::drive(
        journal,
        &task,
        begun,
        args.from_step,
        crate::cli::Limits {
            child_jobs: args.jobs,
            ..args.limits
        },
        settings,
        worker,
    )
}

/// Task `id` (`None` if the journal holds none), and its run started
/// with the read where the task's row says nothing is to be asked first
/// (it is not completed, cancelled, parked or imported): PostgreSQL reads
/// the row in the start's first round trip, under its lock.
fn open(
    journal: &mut dyn Journal,
    id: &str,
    settings: &Settings,
) -> Result<Option<(TaskRecord, session::Begun)>> {
    let startable = |task: &TaskRecord| {
        !matches!(task.status, TaskStatus::Completed | TaskStatus::Cancelled)
            && !task.status.is_parked()
            && task.imported_at.is_none()
    };
    // Unsynced, as `start` writes a start; the task's own mode once the
    // row says it.
    journal.set_sync(SyncMode::Normal)?;
    let (task, start) =
        match journal.open_run(id, settings.holder(), &journal::now(), &startable)? {
            Opened::Unknown => return Ok(None),
            Opened::Read(task) => (task, None),
            Opened::Tried(task, start) => (task, Some(start)),
        };
    journal.set_sync(task.sync)?;
    let begun = match start {
        None => session::Begun::Not,
        Some(start) => session::Begun::Started(session::Start::of(&task.id, start, false)?),
    };
    Ok(Some((task, begun)))
}

/// Resumes every interrupted task, `jobs` at a time, each in a `durun
/// resume TASK` of its own; a task another runner took first (exit 75) is
/// fine. Exits 0 when every task completed or was taken, 1 otherwise.
fn resume_all(journal: &mut dyn Journal, jobs: u32, settings: &Settings) -> Result<i32> {
    use std::process::{Child, Command};
    let mut pending = std::collections::VecDeque::new();
    let (mut interrupted, mut ready, mut parked) = (0, 0, 0);
    for task in journal.tasks()?.into_iter().rev() {
        match crate::task::shown_status(&task, settings) {
            TaskStatus::Interrupted => {
                interrupted += 1;
                pending.push_back(task.id);
            }
            // Parked tasks whose signal or time came; the others wait on.
            status if status.is_parked() => {
                if crate::task::is_ready(journal, &task.id, settings.now())? {
                    ready += 1;
                    pending.push_back(task.id);
                } else {
                    parked += 1;
                }
            }
            _ => {}
        }
    }
    let plural = |count: usize| if count == 1 { "" } else { "s" };
    let still = if parked > 0 {
        format!(
            "; {parked} parked task{} still wait{}",
            plural(parked),
            if parked == 1 { "s" } else { "" }
        )
    } else {
        String::new()
    };
    if pending.is_empty() {
        crate::report::say(&format!("no interrupted task to resume{still}"));
        return Ok(0);
    }
    let total = pending.len();
    let what = match (interrupted, ready) {
        (_, 0) => format!("{total} interrupted task{}", plural(total)),
        (0, _) => format!(
            "{total} parked task{} whose signal or time came",
            plural(total)
        ),
        _ => format!(
            "{interrupted} interrupted task{} and {ready} parked task{} whose signal or time came",
            plural(interrupted),
            plural(ready)
        ),
    };
    crate::report::say(&format!("resuming {what}, {jobs} at a time{still}"));
    let me = std::env::current_exe()?;
    let mut running: Vec<(String, Child)> = Vec::new();
    let mut failed = 0;
    while !pending.is_empty() || !running.is_empty() {
        while running.len() < jobs as usize {
            let Some(id) = pending.pop_front() else { break };
            let mut command = Command::new(&me);
            if let Some(journal) = settings.journal_arg() {
                command.env("DURUN_JOURNAL", journal);
            }
            if settings.quiet {
                command.arg("-q");
            }
            let child = command.args(["resume", &id]).spawn()?;
            running.push((id, child));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut index = 0;
        while index < running.len() {
            if let Some(status) = running[index].1.try_wait()? {
                let (id, _) = running.remove(index);
                let code = status.code().unwrap_or(1);
                // Parked again (a wait in a later step) is not a failure.
                if code != 0 && code != crate::exit_code::LOCKED && code != crate::exit_code::PARKED
                {
                    failed += 1;
                }
                crate::report::say(&format!("task {id} finished with exit {code}"));
            } else {
                index += 1;
            }
        }
    }
    crate::report::say(&format!(
        "resumed {total} task{}; {failed} did not complete",
        if total == 1 { "" } else { "s" }
    ));
    Ok(i32::from(failed > 0))
}
