//! `durun resolve TASK STEP --retry | --output JSON | --fail MESSAGE`.

use anyhow::Result;

use crate::cli::{GlobalArgs, ResolveArgs};
use crate::error::Failure;
use crate::exit_code;
use crate::journal::{self, Access, Location, Resolution, ResolutionAction};
use crate::lease::{self, Holder};
use crate::task::unknown_task;

pub fn exec(args: &ResolveArgs, global: &GlobalArgs) -> Result<i32> {
    let action = if args.retry {
        ResolutionAction::Retry
    } else if let Some(text) = &args.output {
        let output = serde_json::from_str(text).map_err(|err| {
            Failure::new(exit_code::USAGE, format!("--output is not JSON: {err}"))
                .hint("quote it for the shell, e.g. --output '{\"url\": \"https://…\"}' or --output '\"text\"'")
        })?;
        ResolutionAction::Output(output)
    } else {
        ResolutionAction::Fail(args.fail.clone().unwrap_or_default())
    };
    let location = Location::resolve(global.journal.as_deref())?;
    let mut journal = journal::open(&location, Access::Write)?;
    if journal.task(&args.task)?.is_none() {
        return Err(unknown_task(&args.task, &location).into());
    }
    let resolution = Resolution {
        action,
        by: format!(
            "{}@{}",
            std::env::var("USER")
                .or_else(|_| std::env::var("LOGNAME"))
                .unwrap_or_else(|_| "unknown".to_owned()),
            lease::host_id()
        ),
        at: journal::now(),
    };
    let step = journal.resolve(&args.task, args.step, &resolution, &Holder::current())?;
    let what = match &resolution.action {
        ResolutionAction::Retry => "it runs again on the next resume".to_owned(),
        ResolutionAction::Output(_) => "recorded as done with the given output".to_owned(),
        ResolutionAction::Fail(message) => format!("recorded as failed: {message}"),
    };
    eprintln!(
        "durun: step {} ({}) of task {}: {what}; continue with `durun resume {}`",
        step.step, step.name, args.task, args.task
    );
    Ok(0)
}
