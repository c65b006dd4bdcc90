//! The queries of workers and their queues (SPEC 11): what a worker may
//! claim, how many of a queue's tasks are active, claims and their
//! release, and the list of live workers.

use super::{NOW_MS, Sql};
use crate::journal::rows::CANDIDATE_COLUMNS;

/// A worker gives up its claim on a task.
pub(crate) static RELEASE_CLAIM: Sql = Sql::new(
    "UPDATE tasks SET claimed_by = NULL, claimed_at = NULL WHERE id = $1 AND claimed_by = $2",
);

/// A worker leaves the list.
pub(crate) static DELETE_WORKER: Sql = Sql::new("DELETE FROM workers WHERE id = $1");

/// Every claim of a worker that left.
pub(crate) static RELEASE_CLAIMS_OF: Sql =
    Sql::new("UPDATE tasks SET claimed_by = NULL, claimed_at = NULL WHERE claimed_by = $1");

/// The tasks of the queues `$1` a worker (`$2`) might claim: no other
/// worker claimed them within `$3` ms; oldest submitted first, `$4` of
/// them after the first `$5`; and the clock. SQLite orders a
/// millisecond's tasks as they were submitted (`rowid`).
///
/// PostgreSQL reads each queue's active tasks in the order of
/// `tasks_active_by_queue` and stops at the page's end: `queue = ANY($1)`
/// would read every active task of the queues and sort them (0.7 ms a
/// look with 1,000 queued, growing with the queue).
pub(crate) static CLAIMABLE: Sql = Sql::dialects(
    || {
        format!(
            "SELECT {CANDIDATE_COLUMNS}, {NOW_MS}
             FROM (SELECT DISTINCT unnest($1::TEXT[]) AS name) q
             CROSS JOIN LATERAL (
                 SELECT * FROM tasks t
                 WHERE t.queue = q.name
                   AND t.status IN ('queued', 'running', 'interrupted', 'waiting', 'sleeping')
                   AND (t.claimed_by IS NULL OR t.claimed_by = $2 OR t.claimed_at < {NOW_MS} - $3)
                 ORDER BY t.created_at, t.id LIMIT $4::BIGINT + $5::BIGINT) t
             ORDER BY t.created_at, t.id LIMIT $4 OFFSET $5"
        )
    },
    || {
        format!(
            "SELECT {CANDIDATE_COLUMNS}, {NOW_MS} FROM tasks t
             WHERE t.queue IN (SELECT value FROM json_each($1))
               AND t.status IN ('queued', 'running', 'interrupted', 'waiting', 'sleeping')
               AND (t.claimed_by IS NULL OR t.claimed_by = $2 OR t.claimed_at < {NOW_MS} - $3)
             ORDER BY t.created_at, t.rowid LIMIT $4 OFFSET $5"
        )
    },
);

/// The workers whose heartbeat is younger than `$1` ms.
pub(crate) static WORKERS: Sql = Sql::made(|| {
    format!(
        "SELECT id, host, pid, queues, jobs, started_at, heartbeat, tasks FROM workers
         WHERE heartbeat >= {NOW_MS} - $1 ORDER BY started_at, id"
    )
});

/// Holds a queue's claims until the transaction ends, so that its count
/// of active tasks stays true: PostgreSQL's advisory lock; SQLite's write
/// transaction holds the whole file already.
pub(crate) static LOCK_QUEUE: Sql = Sql::dialects(
    || "SELECT pg_advisory_xact_lock(hashtext('durun_queue:' || $1))".to_owned(),
    || "SELECT $1".to_owned(),
);

/// How many of queue `$1`'s tasks run or are claimed, within `$2` ms.
pub(crate) static ACTIVE_IN_QUEUE: Sql = Sql::made(|| {
    format!(
        "SELECT count(*) FROM tasks WHERE queue = $1 AND (
             (status = 'running' AND lease_heartbeat >= {NOW_MS} - $2)
             OR (claimed_by IS NOT NULL AND claimed_at >= {NOW_MS} - $2))"
    )
});

/// Claims the tasks `$1` for worker `$2` where no other worker claimed
/// them within `$3` ms: one statement, so a row another worker claimed
/// first fails the condition when it is checked again after that worker's
/// commit.
pub(crate) static CLAIM: Sql = Sql::dialects(
    || {
        format!(
            "UPDATE tasks SET claimed_by = $2, claimed_at = {NOW_MS}
             WHERE id = ANY($1) AND (claimed_by IS NULL OR claimed_by = $2 OR claimed_at < {NOW_MS} - $3)
             RETURNING id"
        )
    },
    || {
        format!(
            "UPDATE tasks SET claimed_by = $2, claimed_at = {NOW_MS}
             WHERE id IN (SELECT value FROM json_each($1))
               AND (claimed_by IS NULL OR claimed_by = $2 OR claimed_at < {NOW_MS} - $3)
             RETURNING id"
        )
    },
);

/// A worker's heartbeat, with the tasks it runs.
pub(crate) static WORKER_HEARTBEAT: Sql = Sql::made(|| {
    format!(
        "INSERT INTO workers (id, host, pid, queues, jobs, started_at, heartbeat, tasks)
         VALUES ($1, $2, $3, $4, $5, $6, {NOW_MS}, $7)
         ON CONFLICT (id) DO UPDATE SET heartbeat = excluded.heartbeat, tasks = excluded.tasks"
    )
});
