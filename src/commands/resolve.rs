//! `durun resolve TASK STEP --retry | --output JSON | --fail MESSAGE`.

use anyhow::Result;

use crate::cli::ResolveArgs;
use crate::journal::{self, Access, Location, Resolution, ResolutionAction};
use crate::settings::Settings;
use crate::task::unknown_task;

pub(crate) fn exec(args: &ResolveArgs, settings: &Settings) -> Result<i32> {
    let action = if args.retry {
        ResolutionAction::Retry
    } else if let Some(output) = &args.output {
        ResolutionAction::Output(output.clone())
    } else {
        ResolutionAction::Fail(args.fail.clone().unwrap_or_default())
    };
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    if journal.task(&args.task)?.is_none() {
        return Err(unknown_task(&args.task, &location).into());
    }
    let resolution = Resolution {
        action,
        by: settings.operator(),
        at: journal::now(),
    };
    let step = journal.resolve(&args.task, args.step, &resolution, settings.holder())?;
    let what = match &resolution.action {
        ResolutionAction::Retry => "it runs again on the next resume".to_owned(),
        ResolutionAction::Output(_) => "recorded as done with the given output".to_owned(),
        ResolutionAction::Fail(message) => format!("recorded as failed: {message}"),
    };
    crate::report::say(&format!(
        "step {} ({}) of task {}: {what}; continue with `durun resume {}`",
        step.step, step.name, args.task, args.task
    ));
    Ok(0)
}
