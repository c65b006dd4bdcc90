//! `durun run`: start an agent as a new task, or carry on `--task ID`.

use anyhow::{Context as _, Result};

use super::session;
use crate::cli::RunArgs;
use crate::config::SyncMode;
use crate::error::Failure;
use crate::journal::{Access, Location, TaskStatus};
use crate::settings::Settings;
use crate::task::{check_task_id, new_task_id, shell_words};

pub(crate) fn exec(args: &RunArgs, settings: &Settings) -> Result<i32> {
    if let Some(id) = &args.new.task {
        check_task_id(id)?;
    }
    let cwd = std::env::current_dir().context("failed to read the current directory")?;
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;

    let existing = match &args.new.task {
        Some(id) => journal.task(id)?,
        None => None,
    };
    let fresh = existing.is_none();
    let task = if let Some(task) = existing {
        task
    } else {
        let task = crate::task::new_task(
            args.new.task.clone().unwrap_or_else(new_task_id),
            &args.new.command,
            &cwd,
            args.new.config.as_deref(),
            args.limits.max_tokens,
            None,
            settings,
        )?;
        // The task's row need not reach the disk alone: the first write
        // at the task's own sync mode takes it along (one fsync fewer
        // before the agent starts).
        journal.set_sync(SyncMode::Normal)?;
        match journal.create_task(&task) {
            // Not read back: preparing the task query costs a start-up
            // more than all its writes (callgrind).
            Ok(()) => task.record(),
            // Another `run --task` with the same id may have won the race;
            // then carry on with its task, as if it had been there first.
            Err(err) => journal.task(&task.id)?.ok_or(err)?,
        }
    };
    eprintln!("{}", task.id);
    if task.argv != args.new.command {
        return Err(Failure::config(format!(
            "task {} was started with another command: {}",
            task.id,
            shell_words(&task.argv)
        ))
        .hint(format!(
            "use a new --task id, or `durun resume {}` to run it as recorded",
            task.id
        ))
        .into());
    }
    if task.status == TaskStatus::Completed {
        crate::report::say(&format!(
            "task {} already completed; nothing to run",
            task.id
        ));
        return Ok(0);
    }
    let task = session::raise_budget(journal.as_mut(), task, args.limits.max_tokens)?;
    let limits = crate::cli::Limits {
        child_jobs: args.jobs,
        ..args.limits
    };
    session::drive(journal.as_mut(), &task, fresh, None, limits, settings, None)
}
