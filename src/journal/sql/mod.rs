//! The queries both backends run, written once in PostgreSQL's `$N` form
//! and read by SQLite as [`super::dialect`] says; a query whose dialects
//! differ beyond that is written in both, side by side
//! ([`Sql::dialects`]).

pub(crate) use super::dialect::{NOW_MS, Sql};
use super::rows::{SIGNAL_COLUMNS, STEP_COLUMNS, TASK_COLUMNS};

mod budgets;
mod limits;
mod queue;
pub(crate) use budgets::*;
pub(crate) use limits::*;
pub(crate) use queue::*;

/// A task's steps in order, the discarded ones too if asked (after the
/// live ones, in separate statements, so that the live ones use the
/// partial index), or the last `$2` of them; in `$N` form.
pub(crate) fn steps_of_task(discarded: bool, last: bool) -> String {
    let live =
        format!("SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND status <> 'discarded'");
    let body = if discarded {
        format!(
            "{live} UNION ALL SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND status = 'discarded'"
        )
    } else {
        live
    };
    if last {
        // The last rows, still in order.
        format!(
            "SELECT * FROM ({body} ORDER BY step_index DESC, id DESC LIMIT $2) AS tail ORDER BY step_index, id"
        )
    } else if discarded {
        format!("{body} ORDER BY step_index, id")
    } else {
        format!("{body} ORDER BY step_index")
    }
}

/// A signal, kept once per sender's id.
pub(crate) static SEND_SIGNAL: Sql = Sql::new(
    "INSERT INTO signals (task_id, name, data, signal_id, sent_by, sent_at)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (task_id, signal_id) WHERE signal_id IS NOT NULL DO NOTHING",
);

/// One task.
pub(crate) static TASK: Sql =
    Sql::made(|| format!("SELECT {TASK_COLUMNS} FROM tasks t WHERE t.id = $1"));

/// Every task, newest first; SQLite orders a millisecond's tasks as they
/// were made (`rowid`).
pub(crate) static ALL_TASKS: Sql = Sql::dialects(
    || format!("SELECT {TASK_COLUMNS} FROM tasks t ORDER BY t.created_at DESC, t.id DESC"),
    || format!("SELECT {TASK_COLUMNS} FROM tasks t ORDER BY t.created_at DESC, t.rowid DESC"),
);

/// The tasks whose id starts with `$1` (`$2` characters long), in id order.
pub(crate) static TASKS_WITH_PREFIX: Sql = Sql::made(|| {
    format!("SELECT {TASK_COLUMNS} FROM tasks t WHERE substr(t.id, 1, $2) = $1 ORDER BY t.id")
});

/// A task's signals, oldest first.
pub(crate) static SIGNALS_OF_TASK: Sql =
    Sql::made(|| format!("SELECT {SIGNAL_COLUMNS} FROM signals WHERE task_id = $1 ORDER BY id"));

/// A task's steps, as [`steps_of_task`] makes them: live only or with the
/// discarded ones, all or the last `$2`.
pub(crate) static STEPS_OF_TASK: [Sql; 4] = [
    Sql::made(|| steps_of_task(false, false)),
    Sql::made(|| steps_of_task(false, true)),
    Sql::made(|| steps_of_task(true, false)),
    Sql::made(|| steps_of_task(true, true)),
];

/// How many steps a task has, discarded ones included (two counts, so
/// that the live one uses the partial index).
pub(crate) static COUNT_STEPS: Sql = Sql::new(
    "SELECT (SELECT count(*) FROM steps WHERE task_id = $1 AND status <> 'discarded')
          + (SELECT count(*) FROM steps WHERE task_id = $1 AND status = 'discarded')",
);

/// Every row of a step, a discarded one before its replacement.
pub(crate) static STEP_VERSIONS: Sql = Sql::made(|| {
    format!(
        "SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded'
         UNION ALL
         SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND step_index = $2 AND status = 'discarded'
         ORDER BY id"
    )
});

/// The kinds of step replayed by content, not position
/// ([`crate::journal::StepKind::by_content`]), as an SQL list.
const BY_CONTENT: &str = "('proxy', 'mcp')";

/// A page of a task's live steps, after a step number.
pub(crate) static STEPS_PAGE: Sql = Sql::made(|| page_of(STEP_COLUMNS));

/// [`STEPS_PAGE`] for a run's numbering of its protocol steps: a step
/// replayed by content (a proxy or MCP request) comes without its args
/// and output. The numbering only passes over such a step, and the run
/// takes its answer from the steps [`STEPS_BY_CONTENT`] read, so a resumed
/// task's model answers are read once, not twice (and never held twice).
pub(crate) static NUMBERING_PAGE: Sql = Sql::made(|| {
    let columns = STEP_COLUMNS
        .replacen(
            " args,",
            &format!(" CASE WHEN kind IN {BY_CONTENT} THEN 'null' ELSE args END,"),
            1,
        )
        .replacen(
            " output,",
            &format!(" CASE WHEN kind IN {BY_CONTENT} THEN NULL ELSE output END,"),
            1,
        );
    page_of(&columns)
});

/// A page of a task's live steps after step `$2`, at most `$3`, each row
/// as `columns` select it.
fn page_of(columns: &str) -> String {
    format!(
        "SELECT {columns} FROM steps
         WHERE task_id = $1 AND status <> 'discarded' AND step_index > $2
         ORDER BY step_index LIMIT $3"
    )
}

/// The live steps replayed by content (proxy and MCP requests), in order.
pub(crate) static STEPS_BY_CONTENT: Sql = Sql::made(|| {
    format!(
        "SELECT {STEP_COLUMNS} FROM steps
         WHERE task_id = $1 AND status <> 'discarded' AND kind IN {BY_CONTENT}
         ORDER BY step_index"
    )
});

/// The live MCP step with an idempotency key (an MCP task's id).
pub(crate) static MCP_STEP_BY_KEY: Sql = Sql::made(|| {
    format!(
        "SELECT {STEP_COLUMNS} FROM steps
         WHERE task_id = $1 AND idempotency_key = $2 AND status <> 'discarded' AND kind = 'mcp'"
    )
});

/// One live step.
pub(crate) static LIVE_STEP: Sql = Sql::made(|| {
    format!(
        "SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded'"
    )
});

/// Whether a signal of a name waits, untaken.
pub(crate) static SIGNAL_WAITING: Sql = Sql::new(
    "SELECT EXISTS (SELECT 1 FROM signals WHERE task_id = $1 AND name = $2 AND taken_by IS NULL)",
);

/// A signal taken by a step.
pub(crate) static TAKE_SIGNAL: Sql = Sql::new("UPDATE signals SET taken_by = $2 WHERE id = $1");

/// Tokens by day (UTC), over every task: spent by the steps that reported
/// usage (on the day each finished), saved by the runs that replayed them
/// (on the day each started).
pub(crate) static TOKEN_DAYS: Sql = Sql::new(
    "SELECT day, CAST(SUM(spent) AS BIGINT), CAST(SUM(saved) AS BIGINT) FROM (
         SELECT substr(COALESCE(finished_at, started_at), 1, 10) AS day, tokens AS spent, 0 AS saved
             FROM steps WHERE tokens > 0
         UNION ALL
         SELECT substr(started_at, 1, 10), 0, tokens_saved FROM runs WHERE tokens_saved > 0
     ) AS used GROUP BY day ORDER BY day",
);

/// The greatest task id that starts with `$1` (`$2` its length in
/// characters).
pub(crate) static LATEST_TASK_ID: Sql =
    Sql::new("SELECT max(id) FROM tasks WHERE substr(id, 1, $2) = $1");

/// A task's retries (SPEC 16), set when it is submitted.
pub(crate) static SET_RETRIES: Sql = Sql::new(
    "INSERT INTO task_retries (task_id, retries, backoff_ms, used) VALUES ($1, $2, $3, 0)",
);

/// Failed tasks with retries left.
pub(crate) static RETRYABLE: Sql = Sql::new(
    "SELECT t.id, t.queue, t.updated_at, t.exit_code, r.retries, r.backoff_ms, r.used
     FROM task_retries r JOIN tasks t ON t.id = r.task_id
     WHERE t.status = 'failed' AND r.used < r.retries",
);

/// A retry counted, if no other worker counted it first.
pub(crate) static COUNT_RETRY: Sql =
    Sql::new("UPDATE task_retries SET used = used + 1 WHERE task_id = $1 AND used = $2");

/// A failed task left for a worker to resume.
pub(crate) static RETRY_TASK: Sql = Sql::new(
    "UPDATE tasks SET status = 'interrupted', updated_at = $2 WHERE id = $1 AND status = 'failed'",
);

/// A task's runs, in order.
pub(crate) static RUNS_OF_TASK: Sql = Sql::new(
    "SELECT run, host, pid, started_at, finished_at, exit_code,
                    replayed_steps, executed_steps, tokens_spent, tokens_saved, unreplayed, error,
                    cost_spent_nanos, cost_saved_nanos, unpriced_steps
             FROM runs WHERE task_id = $1 ORDER BY run",
);

/// The recorded steps replayed by content that no request of a run asked
/// for.
pub(crate) static SET_UNREPLAYED: Sql =
    Sql::new("UPDATE runs SET unreplayed = $3 WHERE task_id = $1 AND run = $2");

/// A run starts.
pub(crate) static INSERT_RUN: Sql =
    Sql::new("INSERT INTO runs (task_id, run, host, pid, started_at) VALUES ($1, $2, $3, $4, $5)");

/// An event of a run or a step (SPEC 20).
pub(crate) static INSERT_EVENT: Sql =
    Sql::new("INSERT INTO events (task_id, run, kind, step, at) VALUES ($1, $2, $3, $4, $5)");

/// An event of a step written again after a commit whose outcome was
/// lost with its connection: kept once.
pub(crate) static INSERT_EVENT_ONCE: Sql = Sql::new(
    "INSERT INTO events (task_id, run, kind, step, at)
     SELECT CAST($1 AS TEXT), CAST($2 AS INTEGER), CAST($3 AS TEXT), CAST($4 AS BIGINT), CAST($5 AS TEXT)
     WHERE NOT EXISTS (SELECT 1 FROM events WHERE task_id = $1 AND run = $2 AND kind = $3 AND step = $4)",
);

/// The steps a run replayed since its counters were last written, as one
/// event: none when the count has not grown.
pub(crate) static NOTE_REPLAYED: Sql = Sql::new(
    "INSERT INTO events (task_id, run, kind, step, last_step, at)
     SELECT task_id, run, 'step.replayed', replayed_steps + 1, CAST($3 AS BIGINT), CAST($4 AS TEXT)
     FROM runs WHERE task_id = $1 AND run = $2 AND replayed_steps < CAST($3 AS BIGINT)",
);

/// A task's events from row `$2` on, at most `$3`, with the name of the
/// step each is about.
pub(crate) static EVENTS_FROM: Sql = Sql::new(
    "SELECT e.id, e.run, e.kind, e.step, e.last_step, e.at, s.tool_name, s.tokens
     FROM events e LEFT JOIN steps s
       ON e.kind <> 'step.replayed' AND s.task_id = e.task_id AND s.step_index = e.step
          AND s.status <> 'discarded'
     WHERE e.task_id = $1 AND e.id >= $2 ORDER BY e.id LIMIT $3",
);

/// `$3` steps a run `$2` could replay (recorded by an earlier run), in
/// step order, after the first `$4`.
pub(crate) static REPLAYABLE_STEPS: Sql = Sql::new(
    "SELECT step_index, tool_name FROM steps
     WHERE task_id = $1 AND status <> 'discarded' AND run < $2
     ORDER BY step_index LIMIT $3 OFFSET $4",
);

/// How many live steps a task has, and the highest number.
pub(crate) static REPLAY_BOUNDS: Sql = Sql::new(
    "SELECT count(*), max(step_index) FROM steps WHERE task_id = $1 AND status <> 'discarded'",
);

/// The task's result.
pub(crate) static SET_OUTPUT: Sql =
    Sql::new("UPDATE tasks SET output = $2, updated_at = $3 WHERE id = $1");

/// A run's end, with its counts (one statement: each one a start-up
/// prepares costs it as much as its execution).
pub(crate) static END_RUN: Sql = Sql::new(
    "UPDATE runs SET finished_at = $3, exit_code = $4, error = $5, replayed_steps = $6,
         executed_steps = $7, tokens_spent = $8, tokens_saved = $9, cost_spent_nanos = $10,
         cost_saved_nanos = $11, unpriced_steps = $12
     WHERE task_id = $1 AND run = $2",
);

/// The task's status after a run, and its lease released, if this run holds it.
pub(crate) static END_TASK_RUN: Sql = Sql::new(
    "UPDATE tasks SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE $3 END,
                 exit_code = $4, updated_at = $5, lease_host = NULL, lease_pid = NULL,
                 lease_pid_start = NULL, lease_heartbeat = NULL, lease_run = NULL
             WHERE id = $1 AND lease_run = $2",
);

/// Steps N and later out of replay (`resume --from-step`).
pub(crate) static DISCARD_FROM: Sql = Sql::new(
    "UPDATE steps SET status = 'discarded' WHERE task_id = $1 AND step_index >= $2 AND status <> 'discarded'",
);

/// A step settled by `durun resolve`.
pub(crate) static RESOLVE_STEP: Sql = Sql::new(
    "UPDATE steps SET status = $3, output = $4, error_code = $5, error = $6, finished_at = $7, resolution = $8
             WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded'",
);

/// The record of a resolution.
pub(crate) static INSERT_RESOLUTION: Sql = Sql::new(
    "INSERT INTO resolutions (task_id, step_index, action, value, resolved_by, resolved_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
);

/// A cancel of a task a live runner holds: it stops at its next look.
pub(crate) static CANCEL_HELD: Sql = Sql::new(
    "UPDATE tasks SET status = 'cancelled', updated_at = $2,
                     cancel_requested_at = coalesce(cancel_requested_at, $2)
                 WHERE id = $1",
);

/// A cancel of a task no live runner holds: its lease is cleared.
pub(crate) static CANCEL_FREE: Sql = Sql::new(
    "UPDATE tasks SET status = 'cancelled', cancel_requested_at = $2, updated_at = $2, lease_host = NULL,
                     lease_pid = NULL, lease_pid_start = NULL, lease_heartbeat = NULL, lease_run = NULL
                 WHERE id = $1",
);

/// Whether a conversation's node is there (SPEC 21).
pub(crate) static CHAT_NODE_THERE: Sql = Sql::new("SELECT 1 FROM chat_nodes WHERE hash = $1");

/// A conversation's node: one message, and the node before it.
pub(crate) static INSERT_CHAT_NODE: Sql = Sql::new(
    "INSERT INTO chat_nodes (hash, parent, message) VALUES ($1, $2, $3) ON CONFLICT (hash) DO NOTHING",
);

/// A node's parent and message.
pub(crate) static CHAT_NODE: Sql =
    Sql::new("SELECT parent, message FROM chat_nodes WHERE hash = $1");

/// The args of every step that names a conversation's chain.
pub(crate) static CHAIN_TIPS: Sql =
    Sql::new("SELECT args FROM steps WHERE kind = 'proxy' AND args LIKE '%durun_chain%'");

/// Every node and its parent.
pub(crate) static CHAT_NODE_PARENTS: Sql = Sql::new("SELECT hash, parent FROM chat_nodes");

/// A node no step leads to.
pub(crate) static DELETE_CHAT_NODE: Sql = Sql::new("DELETE FROM chat_nodes WHERE hash = $1");

/// A task, and its rows with it (ON DELETE CASCADE).
pub(crate) static DELETE_TASK: Sql = Sql::new("DELETE FROM tasks WHERE id = $1");

/// Finished tasks last updated before a time, with their leases, locked:
/// what `durun gc` may delete.
pub(crate) static GC_CANDIDATES: Sql = Sql::new(
    "SELECT id, lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run FROM tasks
     WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < $1 FOR UPDATE",
);

/// A task whose agent never started.
pub(crate) static FORGET_UNSTARTED: Sql = Sql::new(
    "DELETE FROM tasks WHERE id = $1 AND runs = 1 AND status = 'failed'
                 AND NOT EXISTS (SELECT 1 FROM steps WHERE task_id = $1)
                 AND NOT EXISTS (SELECT 1 FROM signals WHERE task_id = $1)",
);

/// A task's token budget; a task stopped over its budget may go on again
/// (`resume`, a worker) once it is set (SPEC 19).
pub(crate) static SET_MAX_TOKENS: Sql = Sql::new(
    "UPDATE tasks SET max_tokens = $2,
         status = CASE WHEN status = 'over_budget' THEN 'interrupted' ELSE status END
     WHERE id = $1",
);

/// A task's budget in nano-dollars; as [`SET_MAX_TOKENS`], a task stopped
/// over its budget may go on again.
pub(crate) static SET_MAX_COST: Sql = Sql::new(
    "UPDATE tasks SET max_cost_nanos = $2,
         status = CASE WHEN status = 'over_budget' THEN 'interrupted' ELSE status END
     WHERE id = $1",
);

/// Who holds the task, and whether it was cancelled.
pub(crate) static STANDING: Sql =
    Sql::new("SELECT lease_run, cancel_requested_at IS NOT NULL FROM tasks WHERE id = $1");

/// The fence of a run's write: who holds the task and whether it was
/// cancelled, read `FOR SHARE` so that no takeover or cancel commits
/// before the write does.
pub(crate) static FENCE: Sql = Sql::new(
    "SELECT lease_run, cancel_requested_at IS NOT NULL FROM tasks WHERE id = $1 FOR SHARE",
);

/// The oldest signal of a name not taken yet, locked: of two runners only
/// the lease holder gets this far, and still no signal is taken twice.
pub(crate) static NEXT_SIGNAL: Sql = Sql::made(|| {
    format!(
        "SELECT id, {SIGNAL_COLUMNS} FROM signals
         WHERE task_id = $1 AND name = $2 AND taken_by IS NULL ORDER BY id LIMIT 1 FOR UPDATE"
    )
});

/// The live steps from a step number on, locked, in order: what
/// `resume --from-step` takes out.
pub(crate) static DISCARDABLE: Sql = Sql::made(|| {
    format!(
        "SELECT {STEP_COLUMNS} FROM steps
         WHERE task_id = $1 AND step_index >= $2 AND status <> 'discarded' ORDER BY step_index FOR UPDATE"
    )
});

/// Whether a step has a live row (a commit whose outcome was lost may have
/// written it).
pub(crate) static STEP_IS_THERE: Sql = Sql::new(
    "SELECT EXISTS (SELECT 1 FROM steps WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded')",
);

/// A new step row.
pub(crate) static INSERT_STEP: Sql = Sql::new(
    "INSERT INTO steps (task_id, step_index, tool_name, kind, effect, args, args_hash, idempotency_key,
                 status, attempts, output, error_code, error, usage, tokens, run, created_at, started_at,
                 finished_at, resolution, seen_from, wake_at, cost_nanos, request_hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)",
);

/// A step's row as it stands now.
pub(crate) static UPDATE_STEP: Sql = Sql::new(
    "UPDATE steps SET status = $3, attempts = $4, output = $5, error_code = $6, error = $7,
                 usage = $8, tokens = $9, run = $10, started_at = $11, finished_at = $12, resolution = $13,
                 seen_from = $14, wake_at = $15, cost_nanos = $16
             WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded'",
);

/// A run's counters.
pub(crate) static WRITE_STATS: Sql = Sql::new(
    "UPDATE runs SET replayed_steps = $3, executed_steps = $4, tokens_spent = $5, tokens_saved = $6,
         cost_spent_nanos = $7, cost_saved_nanos = $8, unpriced_steps = $9
         WHERE task_id = $1 AND run = $2",
);

/// Whether a task is there.
pub(crate) static TASK_EXISTS: Sql = Sql::new("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)");

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement, for the checks that each must pass.
    static EVERY: &[&Sql] = &[
        &SIGNALS_OF_TASK,
        &STEPS_PAGE,
        &NUMBERING_PAGE,
        &STEPS_OF_TASK[0],
        &STEPS_OF_TASK[1],
        &STEPS_OF_TASK[2],
        &STEPS_OF_TASK[3],
        &COUNT_STEPS,
        &STEP_VERSIONS,
        &STEPS_BY_CONTENT,
        &MCP_STEP_BY_KEY,
        &CHAT_NODE_THERE,
        &INSERT_CHAT_NODE,
        &CHAT_NODE,
        &CHAIN_TIPS,
        &CHAT_NODE_PARENTS,
        &DELETE_CHAT_NODE,
        &LIVE_STEP,
        &SIGNAL_WAITING,
        &TAKE_SIGNAL,
        &RELEASE_CLAIM,
        &DELETE_WORKER,
        &RELEASE_CLAIMS_OF,
        &RUNS_OF_TASK,
        &TOKEN_DAYS,
        &LATEST_TASK_ID,
        &TASK,
        &SEND_SIGNAL,
        &TASKS_WITH_PREFIX,
        &ALL_TASKS,
        &SET_RETRIES,
        &RETRYABLE,
        &COUNT_RETRY,
        &RETRY_TASK,
        &SET_UNREPLAYED,
        &INSERT_RUN,
        &INSERT_EVENT,
        &LIMIT_ROW,
        &LIMIT_TURN,
        &LIMIT_PAUSE,
        &LIMIT_LOCK,
        &LIMIT_SLOTS,
        &LIMIT_SLOT_FREE,
        &LIMIT_SLOT_TAKE,
        &INSERT_EVENT_ONCE,
        &NOTE_REPLAYED,
        &EVENTS_FROM,
        &REPLAYABLE_STEPS,
        &REPLAY_BOUNDS,
        &SET_OUTPUT,
        &END_RUN,
        &END_TASK_RUN,
        &DISCARD_FROM,
        &RESOLVE_STEP,
        &INSERT_RESOLUTION,
        &CANCEL_HELD,
        &CANCEL_FREE,
        &DELETE_TASK,
        &GC_CANDIDATES,
        &FORGET_UNSTARTED,
        &SET_MAX_TOKENS,
        &SET_MAX_COST,
        &STANDING,
        &FENCE,
        &NEXT_SIGNAL,
        &DISCARDABLE,
        &STEP_IS_THERE,
        &INSERT_STEP,
        &UPDATE_STEP,
        &WRITE_STATS,
        &TASK_EXISTS,
        &CLAIMABLE,
        &WORKERS,
        &LOCK_QUEUE,
        &ACTIVE_IN_QUEUE,
        &CLAIM,
        &WORKER_HEARTBEAT,
        &BUDGET_OF,
        &TREE_SPENT,
        &TREE_HOLDS_DROP,
        &TREE_HELD,
        &BUDGET_HOLD,
    ];

    /// The SQL list of kinds replayed by content is the one the run's
    /// numbering passes over.
    #[test]
    fn the_kinds_replayed_by_content_are_the_runs() {
        use crate::journal::StepKind::*;
        for kind in [Call, Begin, Wait, Sleep, Proxy, Mcp, Spawn, Join] {
            let listed = BY_CONTENT.contains(&format!("'{}'", kind.as_str()));
            assert_eq!(listed, kind.by_content(), "{kind:?}");
        }
    }

    #[test]
    fn every_dollar_is_a_numbered_placeholder() {
        for sql in EVERY {
            let text = sql.postgres();
            for (at, _) in text.match_indices('$') {
                assert!(
                    text[at + 1..].starts_with(|c: char| c.is_ascii_digit()),
                    "{text}"
                );
            }
            assert!(!sql.sqlite().contains('$'), "{}", sql.sqlite());
            assert!(!sql.sqlite().contains(" FOR "), "{}", sql.sqlite());
        }
        assert!(FENCE.postgres().ends_with(" FOR SHARE"));
        assert_eq!(
            TAKE_SIGNAL.sqlite(),
            TAKE_SIGNAL
                .postgres()
                .replace("$2", "?2")
                .replace("$1", "?1")
        );
    }

    /// A worker's clock is SQLite's own there, the server's on PostgreSQL.
    #[test]
    fn the_workers_clock_is_each_dialects() {
        assert!(WORKERS.postgres().contains(NOW_MS));
        assert!(!WORKERS.sqlite().contains("extract"));
        assert!(WORKERS.sqlite().contains("julianday"));
    }

    /// The queries read a task's columns by position, a look's clock
    /// after them.
    #[test]
    fn a_task_is_task_width_columns_wide() {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        for (_, migration) in crate::journal::schema::sqlite_from(0) {
            conn.execute_batch(&migration).expect("migrate");
        }
        let width = |sql: &Sql| conn.prepare(sql.sqlite()).expect("prepare").column_count();
        assert_eq!(width(&TASK), crate::journal::rows::TASK_WIDTH);
        assert_eq!(width(&CLAIMABLE), crate::journal::rows::CANDIDATE_WIDTH + 1);
    }
}
