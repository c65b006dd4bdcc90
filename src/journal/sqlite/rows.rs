//! SQLite rows in and out: the columns [`crate::journal::rows`] decodes,
//! and the statements that write a step, a run's counters, and read a
//! task's lease.

use crate::journal::sql;
use anyhow::Result;
use rusqlite::{Connection, OptionalExtension as _, Row};

use crate::journal::TaskRecord;
use crate::journal::rows::{self};
use crate::lease::Lease;

/// A task row selected with [`crate::journal::rows::TASK_COLUMNS`].
pub(super) fn task_from_row(row: &Row<'_>) -> Result<TaskRecord> {
    crate::journal::reads::task_from(row)
}

/// The lease columns starting at `first`: host, pid, pid start, heartbeat, run.
pub(super) fn lease_from(row: &Row<'_>, first: usize) -> rusqlite::Result<Option<Lease>> {
    Ok(rows::lease(
        row.get(first)?,
        row.get(first + 1)?,
        row.get(first + 2)?,
        row.get(first + 3)?,
        row.get(first + 4)?,
    ))
}

pub(super) fn lease_of(tx: &rusqlite::Connection, task: &str) -> Result<Option<Lease>> {
    let lease = tx
        .query_row(
            "SELECT lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run FROM tasks WHERE id = ?1",
            [task],
            |row| lease_from(row, 0),
        )
        .optional()?
        .flatten();
    Ok(lease)
}

/// The task's lease holder (its run) and whether it was cancelled.
pub(super) fn standing_columns(conn: &Connection, task: &str) -> Result<(Option<u32>, bool)> {
    let columns = conn
        .prepare_cached(sql::STANDING.sqlite())?
        .query_row([task], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    Ok(columns.unwrap_or((None, false)))
}
