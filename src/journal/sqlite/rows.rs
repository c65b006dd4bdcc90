//! What SQLite reads of a task outside the shared reads: its lease, and
//! who holds it and whether it was cancelled.

use crate::journal::sql;
use anyhow::Result;
use rusqlite::{Connection, OptionalExtension as _};

use crate::journal::tx::lease_at;
use crate::lease::Lease;

/// The task's lease, if a runner holds it.
pub(super) fn lease_of(conn: &Connection, task: &str) -> Result<Option<Lease>> {
    let mut statement = conn.prepare_cached(
        "SELECT lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run FROM tasks WHERE id = ?1",
    )?;
    let mut rows = statement.query([task])?;
    Ok(match rows.next()? {
        Some(row) => lease_at(row, 0)?,
        None => None,
    })
}

/// The task's lease holder (its run) and whether it was cancelled.
pub(super) fn standing_columns(conn: &Connection, task: &str) -> Result<(Option<u32>, bool)> {
    let columns = conn
        .prepare_cached(sql::STANDING.sqlite())?
        .query_row([task], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    Ok(columns.unwrap_or((None, false)))
}
