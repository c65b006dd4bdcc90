//! PostgreSQL rows in and out: the columns [`crate::journal::rows`]
//! decodes, the statements that write a step and a run's counters, and the
//! fence every run's write goes through.

use super::cached::Queries;
use anyhow::Result;
use postgres::Row;

use super::schema::NOW_MS;
use crate::journal::TaskRecord;
use crate::journal::rows::{self, TaskColumns};
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

/// The task columns, in the order [`TaskColumns`] reads them.
pub(super) const TASK_COLUMNS: &str = "t.id, t.status, t.argv, t.cwd, t.config, t.config_path, t.sync_mode, t.exit_code,
    t.output, t.runs, t.lease_host, t.lease_pid, t.lease_pid_start, t.lease_heartbeat, t.lease_run,
    t.created_at,
    greatest(t.updated_at, coalesce((SELECT coalesce(s.finished_at, s.started_at) FROM steps s
        WHERE s.task_id = t.id AND s.status <> 'discarded' ORDER BY s.step_index DESC LIMIT 1), '')),
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status <> 'discarded'),
    (SELECT coalesce(sum(r.tokens_spent), 0)::BIGINT FROM runs r WHERE r.task_id = t.id),
    (SELECT coalesce(sum(r.tokens_saved), 0)::BIGINT FROM runs r WHERE r.task_id = t.id),
    t.max_tokens, t.queue, t.imported_at";

pub(super) fn task_from_row(row: &Row) -> Result<TaskRecord> {
    TaskColumns {
        id: row.get(0),
        status: row.get(1),
        argv: row.get(2),
        cwd: row.get(3),
        config: row.get(4),
        config_path: row.get(5),
        sync: row.get(6),
        exit_code: row.get(7),
        output: row.get(8),
        runs: i64::from(row.get::<_, i32>(9)),
        lease: lease_at(row, 10),
        created_at: row.get(15),
        updated_at: row.get(16),
        steps: row.get(17),
        tokens_spent: row.get(18),
        tokens_saved: row.get(19),
        max_tokens: row.get(20),
        queue: row.get(21),
        imported_at: row.get(22),
    }
    .record()
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
