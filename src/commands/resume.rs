//! `durun resume TASK`: relaunch the recorded command in the recorded
//! directory; finished steps replay from the journal.

use anyhow::Result;

use super::session;
use crate::cli::{GlobalArgs, ResumeArgs};
use crate::error::Failure;
use crate::journal::{self, Access, Location, TaskStatus};

pub fn exec(args: &ResumeArgs, global: &GlobalArgs) -> Result<i32> {
    let location = Location::resolve(global.journal.as_deref())?;
    let mut journal = journal::open(&location, Access::Write)?;
    let Some(task) = journal.task(&args.task)? else {
        return Err(unknown_task(&args.task, &location).into());
    };
    // With --from-step a completed task runs again from that step.
    if task.status == TaskStatus::Completed && args.from_step.is_none() {
        eprintln!(
            "durun: task {} already completed; nothing to resume",
            task.id
        );
        return Ok(0);
    }
    session::drive(journal.as_mut(), &task, args.from_step, global)
}

pub fn unknown_task(id: &str, location: &Location) -> Failure {
    let place = match location {
        Location::Sqlite(path) => format!("the journal at {}", path.display()),
        Location::Postgres(_) => "the PostgreSQL journal".to_owned(),
    };
    Failure::config(format!("no task {id} in {place}"))
        .hint("`durun inspect` lists the tasks; --journal or DURUN_JOURNAL chooses the journal")
}
