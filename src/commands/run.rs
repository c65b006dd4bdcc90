//! `durun run`: start an agent as a new task, or carry on `--task ID`.

use anyhow::{Context as _, Result};

use super::session::{self, Begun};
use crate::cli::RunArgs;
use crate::error::Failure;
use crate::journal::{self, Access, Location, RunStart, TaskStatus};
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
    let (task, begun) = if let Some(task) = existing {
        (task, Begun::Not)
    } else {
        let mut task = crate::task::new_task(
            args.new.task.clone().unwrap_or_else(new_task_id),
            &args.new.command,
            &cwd,
            args.new.config.as_deref(),
            crate::task::Budget {
                tokens: args.limits.max_tokens,
                cost_nanos: args.limits.max_cost_nanos,
            },
            None,
            settings,
        )?;
        // Every resume starts the agent as this run does.
        task.launch = crate::journal::Launch {
            stdin: args.limits.stdin,
            upstreams: crate::proxy::upstreams_from_env(),
            preset: args.limits.preset.map(|choice| choice.name().to_owned()),
        };
        // The task and its first run: one transaction (one commit), and
        // no fsync of their own (see `session::unsynced`).
        let started = session::unsynced(journal.as_mut(), task.sync, |journal| {
            journal.create_and_start(&task, settings.holder(), &journal::now())
        })?;
        match started {
            // Not read back: preparing the task query costs a start-up
            // more than all its writes (callgrind).
            Ok(start @ RunStart::Started { .. }) => (
                task.record(),
                Begun::Started(session::Start::of(&task.id, start, true)?),
            ),
            // Another `run --task` with the same id may have won the race;
            // then carry on with its task, as if it had been there first.
            other => match journal.task(&task.id)? {
                Some(found) => (found, Begun::Not),
                None => {
                    return Err(other.err().unwrap_or_else(|| {
                        anyhow::anyhow!("task {} was removed as it started", task.id)
                    }));
                }
            },
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
    let task = session::raise_budget(journal.as_mut(), task, &args.limits)?;
    let limits = crate::cli::Limits {
        child_jobs: args.jobs,
        ..args.limits
    };
    session::drive(journal.as_mut(), &task, begun, None, limits, settings, None)
}
