//! SQLite rows in and out: the columns [`crate::journal::rows`] decodes,
//! and the statements that write a step, a run's counters, and read a
//! task's lease.

use crate::journal::sql;
use anyhow::Result;
use rusqlite::{Connection, OptionalExtension as _, Row};
use serde_json::Value;

use crate::journal::TaskRecord;
use crate::journal::rows::{self, TaskColumns};
use crate::lease::Lease;

pub(super) fn json_text(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value always serializes")
}

/// The task columns, in the order [`TaskColumns`] reads them.
pub(super) const TASK_COLUMNS: &str = "t.id, t.status, t.argv, t.cwd, t.config, t.config_path, t.sync_mode, t.exit_code,
    t.output, t.runs, t.lease_host, t.lease_pid, t.lease_pid_start, t.lease_heartbeat, t.lease_run,
    t.created_at,
    max(t.updated_at, coalesce((SELECT coalesce(s.finished_at, s.started_at) FROM steps s
        WHERE s.task_id = t.id AND s.status <> 'discarded' ORDER BY s.step_index DESC LIMIT 1), '')),
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status <> 'discarded'),
    (SELECT coalesce(sum(r.tokens_spent), 0) FROM runs r WHERE r.task_id = t.id),
    (SELECT coalesce(sum(r.tokens_saved), 0) FROM runs r WHERE r.task_id = t.id),
    t.max_tokens, t.queue, t.imported_at";

pub(super) fn task_from_row(row: &Row<'_>) -> Result<TaskRecord> {
    TaskColumns {
        id: row.get(0)?,
        status: row.get_ref(1)?.as_str()?,
        argv: row.get_ref(2)?.as_str()?,
        cwd: row.get(3)?,
        config: row.get(4)?,
        config_path: row.get(5)?,
        sync: row.get_ref(6)?.as_str()?,
        exit_code: row.get(7)?,
        output: row.get_ref(8)?.as_str_or_null()?,
        runs: row.get(9)?,
        lease: lease_from(row, 10)?,
        created_at: row.get(15)?,
        updated_at: row.get(16)?,
        steps: row.get(17)?,
        tokens_spent: row.get(18)?,
        tokens_saved: row.get(19)?,
        max_tokens: row.get(20)?,
        queue: row.get(21)?,
        imported_at: row.get(22)?,
    }
    .record()
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
