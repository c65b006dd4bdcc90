//! `durun cancel TASK`: stop a task for good.
//!
//! The task is marked cancelled in the journal at once: no run may start
//! it again, on any host, even if its runner dies before it hears of the
//! cancel. A live runner hears of it through the journal (so a runner on
//! another host does too), opens no other step, and ends the agent;
//! `cancel` waits for that.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cli::CancelArgs;
use crate::journal::{self, Access, Location, TaskStatus};
use crate::lease;
use crate::settings::Settings;
use crate::task::unknown_task;

/// How long `cancel` waits for a live runner to stop.
const WAIT: Duration = Duration::from_secs(30);

pub(crate) fn exec(args: &CancelArgs, settings: &Settings) -> Result<i32> {
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    let Some(task) = journal.task(&args.task)? else {
        return Err(unknown_task(&args.task, &location).into());
    };
    match task.status {
        TaskStatus::Completed | TaskStatus::Cancelled => {
            crate::report::say(&format!(
                "task {} is already {}; nothing to cancel",
                task.id,
                task.status.as_str()
            ));
            return Ok(0);
        }
        _ => {}
    }
    let held = journal.request_cancel(&task.id, settings.holder())?;
    cancel_children(journal.as_mut(), &task.id, settings)?;
    if !held {
        crate::report::say(&format!("task {} cancelled", task.id));
        return Ok(0);
    }
    crate::report::say(&format!(
        "task {} cancelled; waiting for its runner to stop the agent",
        task.id
    ));
    // From the cancel's commit on, the runner may open no step: every write
    // it makes checks the mark, and it looks before any `read` step starts.
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let Some(task) = journal.task(&args.task)? else {
            break;
        };
        let running = task.lease.as_ref().is_some_and(|lease| {
            lease::is_live(
                lease,
                settings.holder(),
                journal::now_ms(),
                settings.lease.stale,
            )
        });
        if !running {
            crate::report::say(&format!("no runner holds task {} any more", task.id));
            return Ok(0);
        }
    }
    crate::report::say(&format!(
        "the runner of task {} has not stopped yet; it starts no other step and stops when it looks",
        args.task
    ));
    Ok(0)
}

/// Cancels the task's children (SPEC 16), `ID-sN`, and theirs, that have
/// not ended: their runners stop as the parent's does.
fn cancel_children(
    journal: &mut dyn crate::journal::Journal,
    id: &str,
    settings: &Settings,
) -> Result<()> {
    let mut parents = vec![id.to_owned()];
    while let Some(parent) = parents.pop() {
        for child in crate::task::children(journal, &parent)? {
            parents.push(child.id.clone());
            if matches!(
                child.status,
                TaskStatus::Completed | TaskStatus::Cancelled | TaskStatus::Failed
            ) {
                continue;
            }
            journal.request_cancel(&child.id, settings.holder())?;
            crate::report::say(&format!(
                "task {} cancelled with its parent {parent}",
                child.id
            ));
        }
    }
    Ok(())
}
