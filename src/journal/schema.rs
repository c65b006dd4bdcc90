//! The journal's schema, written once for both backends: an append-only
//! list of migrations in PostgreSQL's types, which SQLite reads with its
//! own (`INTEGER` is 64 bits there, and `INTEGER PRIMARY KEY` is its row
//! id). SQLite's format number is the number of migrations applied;
//! PostgreSQL's first format made the first two at once, so its number is
//! one less.

/// Never edit a migration that has shipped: append a new one.
const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE tasks (
    id              TEXT PRIMARY KEY NOT NULL,
    status          TEXT NOT NULL,
    argv            TEXT NOT NULL,
    cwd             TEXT NOT NULL,
    config          TEXT,
    config_path     TEXT,
    sync_mode       TEXT NOT NULL,
    exit_code       INTEGER,
    output          TEXT,
    runs            INTEGER NOT NULL DEFAULT 0,
    lease_host      TEXT,
    lease_pid       BIGINT,
    lease_pid_start BIGINT,
    lease_heartbeat BIGINT,
    lease_run       INTEGER,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE INDEX tasks_by_created_at ON tasks (created_at);

CREATE TABLE runs (
    task_id        TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run            INTEGER NOT NULL,
    host           TEXT NOT NULL,
    pid            BIGINT NOT NULL,
    started_at     TEXT NOT NULL,
    finished_at    TEXT,
    exit_code      INTEGER,
    replayed_steps BIGINT NOT NULL DEFAULT 0,
    executed_steps BIGINT NOT NULL DEFAULT 0,
    tokens_spent   BIGINT NOT NULL DEFAULT 0,
    tokens_saved   BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, run)
);

CREATE TABLE steps (
    id              BIGSERIAL PRIMARY KEY,
    task_id         TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_index      BIGINT NOT NULL,
    tool_name       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    effect          TEXT NOT NULL,
    args            TEXT NOT NULL,
    args_hash       TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL,
    output          TEXT,
    error_code      TEXT,
    error           TEXT,
    usage           TEXT,
    tokens          BIGINT NOT NULL DEFAULT 0,
    run             INTEGER NOT NULL,
    created_at      TEXT NOT NULL,
    started_at      TEXT NOT NULL,
    finished_at     TEXT
);
-- Discarded steps stay for the audit trail; one live row per step number.
CREATE UNIQUE INDEX steps_live ON steps (task_id, step_index) WHERE status <> 'discarded';
",
    r"
ALTER TABLE tasks ADD COLUMN cancel_requested_at TEXT;
ALTER TABLE steps ADD COLUMN resolution TEXT;
-- Finds a task's discarded steps; live rows are not in it, so it costs
-- nothing on the per-step write path.
CREATE INDEX steps_discarded ON steps (task_id) WHERE status = 'discarded';
-- Every hand-made decision about a step (`durun resolve`), for the audit trail.
CREATE TABLE resolutions (
    id          BIGSERIAL PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_index  BIGINT NOT NULL,
    action      TEXT NOT NULL,
    value       TEXT,
    resolved_by TEXT NOT NULL,
    resolved_at TEXT NOT NULL
);
",
    r"
-- For a failed step, the first step number the agent could open knowing
-- of the failure: it replays only if the journal holds a step from there.
ALTER TABLE steps ADD COLUMN seen_from BIGINT;
",
    r"
-- SPEC 8 and 9: a token budget per task, the wake time of a `sleep` step
-- (or the timeout of a `wait`), and the signals sent to tasks.
ALTER TABLE tasks ADD COLUMN max_tokens BIGINT;
ALTER TABLE steps ADD COLUMN wake_at TEXT;
CREATE TABLE signals (
    id        BIGSERIAL PRIMARY KEY,
    task_id   TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    name      TEXT NOT NULL,
    data      TEXT NOT NULL,
    signal_id TEXT,
    sent_by   TEXT NOT NULL,
    sent_at   TEXT NOT NULL,
    taken_by  BIGINT
);
-- The same `--id` twice is kept once.
CREATE UNIQUE INDEX signals_by_id ON signals (task_id, signal_id) WHERE signal_id IS NOT NULL;
-- A waiting step looks for the oldest untaken signal of its name.
CREATE INDEX signals_untaken ON signals (task_id, name, id) WHERE taken_by IS NULL;
",
    r"
-- SPEC 11: the queue a submitted task waits in, the worker that claimed
-- it (until its run takes the lease), and the live workers.
ALTER TABLE tasks ADD COLUMN queue TEXT;
ALTER TABLE tasks ADD COLUMN claimed_by TEXT;
ALTER TABLE tasks ADD COLUMN claimed_at BIGINT;
CREATE INDEX tasks_by_queue ON tasks (queue, created_at) WHERE queue IS NOT NULL;
CREATE TABLE workers (
    id         TEXT PRIMARY KEY NOT NULL,
    host       TEXT NOT NULL,
    pid        BIGINT NOT NULL,
    queues     TEXT NOT NULL,
    jobs       INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    heartbeat  BIGINT NOT NULL,
    tasks      TEXT NOT NULL
);
",
    r"
-- SPEC 10: when a task was imported, so that its first resume shows what
-- it runs, and where, before it starts.
ALTER TABLE tasks ADD COLUMN imported_at TEXT;
",
    r"
-- SPEC 12: the recorded proxy and MCP steps no request of a run asked
-- for (JSON array of step numbers): `inspect` shows them `not replayed`.
ALTER TABLE runs ADD COLUMN unreplayed TEXT;
",
    r"
-- SPEC 16: a submitted task's retries: how many runs after failed ones it
-- may have, the first backoff (doubling), and how many it had.
CREATE TABLE task_retries (
    task_id    TEXT PRIMARY KEY NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    retries    INTEGER NOT NULL,
    backoff_ms BIGINT NOT NULL,
    used       INTEGER NOT NULL DEFAULT 0
);
",
    r"
-- SPEC 15: why durun ended a run, as it told the user (a divergence with
-- its diff, a journal error, a spent budget): `inspect` and the web view
-- show it after the terminal is gone.
ALTER TABLE runs ADD COLUMN error TEXT;
",
    r"
-- SPEC 17 and 18: what the task's first run was started with beyond its
-- command, directory and config (JSON: the agent's stdin as `--stdin`
-- chose it, the model upstreams durun's environment named), so that every
-- resume starts the agent the same way.
ALTER TABLE tasks ADD COLUMN launch TEXT;
",
    r"
-- SPEC 19: what a step cost at its model's price, in nano-dollars (NULL:
-- no usage, or a model without a price), and what each run spent, saved
-- by replay, and left unpriced (steps with tokens and no price).
ALTER TABLE steps ADD COLUMN cost_nanos BIGINT;
ALTER TABLE runs ADD COLUMN cost_spent_nanos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cost_saved_nanos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN unpriced_steps BIGINT NOT NULL DEFAULT 0;
",
    r"
-- SPEC 20: what happened to a task, in the order it was written (the row
-- id is the event's id): a run opened or ended, a step opened, finished,
-- failed or waiting, and the steps a run replayed (`step` to `last_step`:
-- the first and last of them counted in the run, not step numbers).
-- `GET /api/tasks/ID/events` and `inspect --follow --json` stream it.
CREATE TABLE events (
    id        BIGSERIAL PRIMARY KEY,
    task_id   TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run       INTEGER NOT NULL,
    kind      TEXT NOT NULL,
    step      BIGINT,
    last_step BIGINT,
    at        TEXT NOT NULL
);
CREATE INDEX events_by_task ON events (task_id, id);
",
    r"
-- SPEC 19: a budget in money beside the token budget, in nano-dollars.
ALTER TABLE tasks ADD COLUMN max_cost_nanos BIGINT;
",
    r"
-- SPEC 19: limits every run and worker on the journal share
-- ([limits.NAME] in durun.toml). Requests are paced: `next_at` is when
-- the next request may go (ms), `tokens_at` when the next request's
-- tokens may, and `paused_until` when an upstream's Retry-After ends.
-- A request in flight holds a slot while the limit caps concurrency.
CREATE TABLE limits (
    name         TEXT PRIMARY KEY NOT NULL,
    next_at      BIGINT NOT NULL DEFAULT 0,
    tokens_at    BIGINT NOT NULL DEFAULT 0,
    paused_until BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE limit_slots (
    id       BIGSERIAL PRIMARY KEY,
    name     TEXT NOT NULL,
    host     TEXT NOT NULL,
    pid      BIGINT NOT NULL,
    taken_at BIGINT NOT NULL
);
CREATE INDEX limit_slots_by_name ON limit_slots (name);
",
    r"
-- SPEC 19: what the model calls in flight in a tree of tasks under a
-- budget may spend at worst: a run reserves against the budgets of its
-- task's ancestors (and its own, once it has children) here.
CREATE TABLE budget_holds (
    id         BIGSERIAL PRIMARY KEY,
    task_id    TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run        INTEGER NOT NULL,
    -- The call's step, or 0 for a request numbered when its answer is
    -- written: then the `nth` (from 0) of the run's calls of its args_hash.
    step_index BIGINT NOT NULL,
    args_hash  TEXT NOT NULL,
    nth        BIGINT NOT NULL,
    tokens     BIGINT NOT NULL,
    nanos      BIGINT NOT NULL
);
CREATE INDEX budget_holds_by_task ON budget_holds (task_id);
",
    r"
-- SPEC 21: a conversation's messages, each stored once. A node is one
-- message and the node of the messages before it; a proxied request's
-- args name the last node of its conversation instead of repeating it.
CREATE TABLE chat_nodes (
    hash    TEXT PRIMARY KEY NOT NULL,
    parent  TEXT,
    message TEXT NOT NULL
);
",
    r"
-- A proxied request's bytes as the agent sent them, hashed with what else
-- makes its args (its name, query and the proxy's ignore and secret
-- lists): a resume replays a byte-identical request without parsing it.
-- Rows written before have none and are matched by their args.
ALTER TABLE steps ADD COLUMN request_hash TEXT;
",
    r"
-- A worker's look reads the tasks it may claim, oldest first: only the
-- active tasks of a queue, in order, not every task the queue ever ran.
CREATE INDEX tasks_active_by_queue ON tasks (queue, created_at, id)
    WHERE status IN ('queued', 'running', 'interrupted', 'waiting', 'sleeping');
",
];

/// The SQLite format this durun writes.
pub(crate) const SQLITE_VERSION: usize = MIGRATIONS.len();

/// The PostgreSQL format this durun writes.
pub(crate) const POSTGRES_VERSION: usize = MIGRATIONS.len() - 1;

/// The migrations that take a SQLite journal from format `from` to
/// [`SQLITE_VERSION`], each with the format it makes.
pub(crate) fn sqlite_from(from: usize) -> impl Iterator<Item = (usize, String)> {
    MIGRATIONS
        .iter()
        .enumerate()
        .skip(from)
        .map(|(index, sql)| {
            (
                index + 1,
                sql.replace("BIGSERIAL", "INTEGER")
                    .replace("BIGINT", "INTEGER"),
            )
        })
}

/// The migrations that take a PostgreSQL journal from format `from` to
/// [`POSTGRES_VERSION`], each with the format it makes.
pub(crate) fn postgres_from(from: usize) -> impl Iterator<Item = (usize, String)> {
    let first = MIGRATIONS[..2].concat();
    std::iter::once(first)
        .chain(MIGRATIONS[2..].iter().map(|sql| (*sql).to_owned()))
        .enumerate()
        .skip(from)
        .map(|(index, sql)| (index + 1, sql))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite gets its own types, so that a new journal's tables read as
    /// they always have (`INTEGER PRIMARY KEY` is the row id).
    #[test]
    fn sqlite_reads_the_schema_in_its_types() {
        let all: String = sqlite_from(0).map(|(_, sql)| sql).collect();
        assert!(!all.contains("BIG"), "{all}");
        assert!(all.contains("id              INTEGER PRIMARY KEY,"));
        assert_eq!(
            sqlite_from(0).last().map(|(version, _)| version),
            Some(SQLITE_VERSION)
        );
    }

    /// A PostgreSQL journal of format 1 had both first migrations.
    #[test]
    fn postgresql_formats_are_one_behind() {
        let formats: Vec<usize> = postgres_from(0).map(|(version, _)| version).collect();
        assert_eq!(formats, (1..=POSTGRES_VERSION).collect::<Vec<_>>());
        let (_, first) = postgres_from(0).next().expect("a first migration");
        assert!(
            first.contains("cancel_requested_at") && first.contains("CREATE TABLE resolutions")
        );
        assert_eq!(postgres_from(POSTGRES_VERSION).count(), 0);
    }
}
