//! `durun gc --older-than AGE`: delete finished tasks.

use std::time::SystemTime;

use anyhow::Result;

use crate::cli::GcArgs;
use crate::error::Failure;
use crate::journal::{Access, Location};
use crate::settings::Settings;

pub(crate) fn exec(args: &GcArgs, settings: &Settings) -> Result<i32> {
    let cutoff = SystemTime::now()
        .checked_sub(args.older_than)
        .filter(|cutoff| *cutoff >= SystemTime::UNIX_EPOCH)
        .ok_or_else(|| {
            Failure::usage(format!(
                "--older-than {} reaches back before 1970, older than any task",
                humantime::format_duration(args.older_than)
            ))
            .hint("use an age like 30d or 1y")
        })?;
    let cutoff = humantime::format_rfc3339_millis(cutoff).to_string();
    let location = Location::of(settings)?;
    if !location.exists()? {
        crate::report::say("no journal yet; nothing to remove");
        return Ok(0);
    }
    let mut journal = location.open(Access::Write, settings)?;
    let removed = journal.gc(&cutoff, settings.holder())?;
    // The ids go to stdout, for scripts; the summary to stderr.
    for id in &removed {
        println!("{id}");
    }
    crate::report::say(&format!(
        "removed {} finished task{} last updated before {cutoff}",
        removed.len(),
        if removed.len() == 1 { "" } else { "s" }
    ));
    Ok(0)
}
