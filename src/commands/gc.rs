//! `durun gc --older-than AGE`: delete finished tasks.

use std::time::SystemTime;

use anyhow::Result;

use crate::cli::{GcArgs, GlobalArgs};
use crate::journal::{self, Access, Location};
use crate::lease::Holder;

pub fn exec(args: &GcArgs, global: &GlobalArgs) -> Result<i32> {
    let location = Location::resolve(global.journal.as_deref())?;
    if matches!(&location, Location::Sqlite(path) if !path.exists()) {
        eprintln!("durun: no journal yet; nothing to remove");
        return Ok(0);
    }
    let cutoff = SystemTime::now()
        .checked_sub(args.older_than)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let cutoff = humantime::format_rfc3339_millis(cutoff).to_string();
    let mut journal = journal::open(&location, Access::Write)?;
    let removed = journal.gc(&cutoff, &Holder::current())?;
    // The ids go to stdout, for scripts; the summary to stderr.
    for id in &removed {
        println!("{id}");
    }
    eprintln!(
        "durun: removed {} finished task{} last updated before {cutoff}",
        removed.len(),
        if removed.len() == 1 { "" } else { "s" }
    );
    Ok(0)
}
