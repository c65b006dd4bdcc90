//! `durun cancel TASK`: stop a task for good.
//!
//! With a live runner, durun asks it through the journal (so a runner on
//! another host sees it too) and waits for it to end the agent; without
//! one, the task is marked cancelled at once.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::inspect::shown_status;
use super::resume::unknown_task;
use crate::cli::{CancelArgs, GlobalArgs};
use crate::journal::{self, Access, Location, TaskStatus};
use crate::lease::Holder;

/// How long `cancel` waits for a live runner to stop.
const WAIT: Duration = Duration::from_secs(30);

pub fn exec(args: &CancelArgs, global: &GlobalArgs) -> Result<i32> {
    let location = Location::resolve(global.journal.as_deref())?;
    let mut journal = journal::open(&location, Access::Write)?;
    let Some(task) = journal.task(&args.task)? else {
        return Err(unknown_task(&args.task, &location).into());
    };
    match task.status {
        TaskStatus::Completed | TaskStatus::Cancelled => {
            eprintln!(
                "durun: task {} is already {}; nothing to cancel",
                task.id,
                task.status.as_str()
            );
            return Ok(0);
        }
        _ => {}
    }
    if !journal.request_cancel(&task.id, &Holder::current())? {
        eprintln!("durun: task {} cancelled", task.id);
        return Ok(0);
    }
    eprintln!(
        "durun: asked the runner of task {} to stop its agent; waiting",
        task.id
    );
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let Some(task) = journal.task(&args.task)? else {
            break;
        };
        if shown_status(&task) != TaskStatus::Running {
            eprintln!("durun: task {} cancelled", task.id);
            return Ok(0);
        }
    }
    eprintln!(
        "durun: the runner of task {} has not stopped yet; it will, and the task will not resume",
        args.task
    );
    Ok(0)
}
