//! `durun run`: start an agent as a new task, or carry on `--task ID`.

use anyhow::{Context as _, Result};

use super::session;
use crate::cli::RunArgs;
use crate::config::{Config, SyncMode};
use crate::error::Failure;
use crate::exit_code;
use crate::journal::{self, Access, Location, NewTask, TaskStatus};
use crate::settings::Settings;
use crate::task::shell_words;

pub(crate) fn exec(args: &RunArgs, settings: &Settings) -> Result<i32> {
    if let Some(id) = &args.task {
        check_task_id(id)?;
    }
    let cwd = std::env::current_dir().context("failed to read the current directory")?;
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;

    let existing = match &args.task {
        Some(id) => journal.task(id)?,
        None => None,
    };
    let task = if let Some(task) = existing {
        task
    } else {
        let (config, config_path) = Config::discover(args.config.as_deref(), &cwd)?;
        let task = NewTask {
            id: args.task.clone().unwrap_or_else(new_task_id),
            argv: args.command.clone(),
            cwd: cwd.to_string_lossy().into_owned(),
            config: config_path.is_some().then(|| config.source.clone()),
            config_path: config_path.map(|path| path.to_string_lossy().into_owned()),
            sync: settings.sync()?.or(config.sync).unwrap_or(SyncMode::Full),
            created_at: journal::now(),
            max_tokens: args.limits.max_tokens.or(config.max_tokens),
        };
        if let Err(err) = journal.create_task(&task) {
            // Another `run --task` with the same id may have won the race;
            // then carry on with its task, as if it had been there first.
            if journal.task(&task.id)?.is_none() {
                return Err(err);
            }
        }
        journal
            .task(&task.id)?
            .context("the task vanished right after it was created")?
    };
    eprintln!("{}", task.id);
    if task.argv != args.command {
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
        eprintln!("durun: task {} already completed; nothing to run", task.id);
        return Ok(0);
    }
    let task = session::raise_budget(journal.as_mut(), task, args.limits.max_tokens)?;
    session::drive(journal.as_mut(), &task, None, args.limits, settings)
}

fn check_task_id(id: &str) -> Result<()> {
    let fine = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if fine {
        Ok(())
    } else {
        Err(
            Failure::new(exit_code::USAGE, format!("invalid task id {id:?}"))
                .hint("a task id is 1 to 128 characters of letters, digits, `-`, `_`, `.` and `:`")
                .into(),
        )
    }
}

/// A new id that sorts by time: `20261129-121608-3fa9c2`.
fn new_task_id() -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let digits: String = now.chars().filter(char::is_ascii_digit).collect();
    let mut random = [0u8; 3];
    if let Ok(mut urandom) = std::fs::File::open("/dev/urandom") {
        use std::io::Read as _;
        let _ = urandom.read_exact(&mut random);
    }
    if random == [0; 3] {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        random = (nanos ^ std::process::id()).to_le_bytes()[..3]
            .try_into()
            .expect("3 bytes");
    }
    format!(
        "{}-{}-{:02x}{:02x}{:02x}",
        &digits[..8],
        &digits[8..14],
        random[0],
        random[1],
        random[2]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_words() {
        let id = new_task_id();
        assert_eq!(id.len(), 22, "{id}");
        assert!(check_task_id(&id).is_ok());
        assert!(check_task_id("ci-1234:build.2").is_ok());
        assert!(check_task_id("a b").is_err());
        assert!(check_task_id("").is_err());
    }
}
