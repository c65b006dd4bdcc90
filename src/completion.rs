//! What a task argument completes to, for clap's dynamic completion.
//!
//! The completion scripts call `durun` back (`COMPLETE=bash durun …`);
//! clap asks [`task_ids`] for the candidates. This runs in the user's shell
//! on every Tab, so it reads the environment itself (there is no `lib::run`
//! around it) and fails silently.

use std::ffi::OsStr;

use clap_complete::CompletionCandidate;

use crate::journal::{Access, Location};
use crate::settings::Settings;
use crate::task;

/// The ids of the tasks in the journal that start with `current`, newest
/// first, each with its status and command: what a task argument
/// completes to. Silent on any error (no journal yet, no access).
pub(crate) fn task_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    let Some(prefix) = current.to_str() else {
        return Vec::new();
    };
    let settings = Settings::from_env(std::env::var("DURUN_JOURNAL").ok());
    let Ok(location) = Location::of(&settings) else {
        return Vec::new();
    };
    if !location.exists().unwrap_or(false) {
        return Vec::new();
    }
    let Ok(tasks) = location
        .open(Access::Read, &settings)
        .and_then(|mut journal| journal.tasks())
    else {
        return Vec::new();
    };
    tasks
        .into_iter()
        .filter(|task| task.id.starts_with(prefix))
        .map(|task| {
            let help = format!(
                "{}: {}",
                task::shown_status(&task, &settings).as_str(),
                task::shell_words(&task.argv)
            );
            CompletionCandidate::new(task.id).help(Some(help.into()))
        })
        .collect()
}
