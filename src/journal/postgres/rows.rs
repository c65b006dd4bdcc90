//! PostgreSQL rows in and out: the columns [`crate::journal::rows`]
//! decodes, the statements that write a step and a run's counters, and the
//! fence every run's write goes through.

use super::cached::Queries;
use anyhow::Result;
use postgres::Row;

use super::schema::NOW_MS;
use crate::journal::TaskRecord;
use crate::journal::rows::{self};
use crate::lease::Lease;

/// The lease columns starting at `first`: host, pid, pid start, heartbeat, run.
pub(super) fn lease_at(row: &Row, first: usize) -> Option<Lease> {
    rows::lease(
        row.get(first),
        row.get(first + 1),
        row.get(first + 2),
        row.get(first + 3),
        row.get::<_, Option<i32>>(first + 4).map(i64::from),
    )
}

/// A task row selected with [`crate::journal::rows::TASK_COLUMNS`].
pub(super) fn task_from_row(row: &Row) -> Result<TaskRecord> {
    crate::journal::reads::task_from(row)
}

/// The task's lease, locked until the transaction ends, and the server's
/// clock.
pub(super) fn lease_of(tx: &mut impl Queries, task: &str) -> Result<(Option<Lease>, i64)> {
    let row = tx.query_opt(
        &format!(
            "SELECT lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run, {NOW_MS}
                  FROM tasks WHERE id = $1 FOR UPDATE"
        ),
        &[&task],
    )?;
    Ok(match row {
        Some(row) => (lease_at(&row, 0), row.get(5)),
        None => (None, 0),
    })
}
