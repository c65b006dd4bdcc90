//! What every command says about a task: the status a person sees, its
//! command as a shell line, and the error for a task that is not there.

use crate::error::Failure;
use crate::journal::{self, Location, TaskRecord, TaskStatus};
use crate::lease;
use crate::settings::Settings;

/// The status a person should see: a `running` task whose runner is gone
/// is `interrupted`.
pub(crate) fn shown_status(task: &TaskRecord, settings: &Settings) -> TaskStatus {
    if task.status != TaskStatus::Running {
        return task.status;
    }
    let live = task.lease.as_ref().is_some_and(|lease| {
        lease::is_live(
            lease,
            &settings.holder,
            journal::now_ms(),
            settings.lease.stale,
        )
    });
    if live {
        TaskStatus::Running
    } else {
        TaskStatus::Interrupted
    }
}

/// An argv as a person would type it.
pub(crate) fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|word| {
            if !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c))
            {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn unknown_task(id: &str, location: &Location) -> Failure {
    let place = location.describe();
    Failure::config(format!("no task {id} in {place}"))
        .hint("`durun inspect` lists the tasks; --journal or DURUN_JOURNAL chooses the journal")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_reads_as_a_shell_line() {
        assert_eq!(
            shell_words(&["python3".into(), "my agent.py".into(), "it's".into()]),
            r"python3 'my agent.py' 'it'\''s'"
        );
    }
}
