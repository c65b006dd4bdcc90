//! What a task or step argument completes to, for clap's dynamic
//! completion.
//!
//! The completion scripts call `durun` back (`COMPLETE=bash durun -- durun
//! …words…`); clap asks the functions here for the candidates. This runs in
//! the user's shell on every Tab, so it reads the environment and the words
//! being completed itself (there is no `lib::run` around it) and fails
//! silently.

use std::ffi::{OsStr, OsString};

use clap_complete::CompletionCandidate;

use crate::journal::{Access, Journal, Location, TaskStatus};
use crate::settings::Settings;
use crate::task;

/// The words of the command line being completed: what follows the `--`
/// the completion script puts after durun's own name.
fn words() -> Vec<OsString> {
    std::env::args_os()
        .skip_while(|word| word != "--")
        .skip(1)
        .collect()
}

/// The journal the command line being completed names (`--journal J`),
/// else `DURUN_JOURNAL`, else the default: a Tab in `durun --journal
/// hitl.db inspect` lists hitl.db's tasks.
fn journal() -> Option<Box<dyn Journal>> {
    let words = words();
    let named = words.iter().enumerate().find_map(|(i, word)| {
        let word = word.to_str()?;
        if word == "--journal" {
            words.get(i + 1)?.to_str().map(str::to_owned)
        } else {
            word.strip_prefix("--journal=").map(str::to_owned)
        }
    });
    let settings = Settings::from_env(named.or_else(|| std::env::var("DURUN_JOURNAL").ok()));
    let location = Location::of(&settings).ok()?;
    if !location.exists().unwrap_or(false) {
        return None;
    }
    location.open(Access::Read, &settings).ok()
}

/// Every task whose id starts with `current`, newest first, each with its
/// status and command.
pub(crate) fn task_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    tasks_where(current, |_| true)
}

/// The tasks a command can still act on: not completed, not cancelled
/// (`resume`, `cancel`, `signal`, `approve`, `reject`).
pub(crate) fn unfinished_task_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    tasks_where(current, |status| {
        !matches!(status, TaskStatus::Completed | TaskStatus::Cancelled)
    })
}

fn tasks_where(current: &OsStr, wanted: fn(TaskStatus) -> bool) -> Vec<CompletionCandidate> {
    let Some(prefix) = current.to_str() else {
        return Vec::new();
    };
    let settings = Settings::from_env(None);
    let Some(tasks) = journal().and_then(|mut journal| journal.tasks().ok()) else {
        return Vec::new();
    };
    tasks
        .into_iter()
        .filter(|task| task.id.starts_with(prefix))
        .filter_map(|task| {
            let status = task::shown_status(&task, &settings);
            wanted(status).then(|| {
                let help = format!("{}: {}", status.as_str(), task::shell_words(&task.argv));
                CompletionCandidate::new(task.id).help(Some(help.into()))
            })
        })
        .collect()
}

/// The steps of the task named on the command line (`durun resume TASK
/// --from-step <Tab>`), each with its name and status.
pub(crate) fn step_numbers(current: &OsStr) -> Vec<CompletionCandidate> {
    let Some(prefix) = current.to_str() else {
        return Vec::new();
    };
    let Some(mut journal) = journal() else {
        return Vec::new();
    };
    // The task is a word of the line that names a task in the journal.
    let words = words();
    let Some(task) = words
        .iter()
        .filter_map(|word| word.to_str())
        .find(|word| !word.starts_with('-') && journal.task(word).ok().flatten().is_some())
    else {
        return Vec::new();
    };
    let task = task.to_owned();
    let mut candidates = Vec::new();
    let _ = journal.visit_steps(&task, false, None, &mut |step| {
        let number = step.step.to_string();
        if number.starts_with(prefix) {
            let help = format!("{} ({})", step.name, step.status.as_str());
            candidates.push(CompletionCandidate::new(number).help(Some(help.into())));
        }
        Ok(())
    });
    candidates
}
