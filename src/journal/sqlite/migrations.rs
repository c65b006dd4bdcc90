//! The SQLite journal's schema: an append-only list of migrations, tracked
//! by `PRAGMA user_version`, and the mark that says a file is durun's.

/// Never edit a migration that has shipped: append a new one.
pub(super) const MIGRATIONS: &[&str] = &[
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
    lease_pid       INTEGER,
    lease_pid_start INTEGER,
    lease_heartbeat INTEGER,
    lease_run       INTEGER,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE INDEX tasks_by_created_at ON tasks (created_at);

CREATE TABLE runs (
    task_id        TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run            INTEGER NOT NULL,
    host           TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    started_at     TEXT NOT NULL,
    finished_at    TEXT,
    exit_code      INTEGER,
    replayed_steps INTEGER NOT NULL DEFAULT 0,
    executed_steps INTEGER NOT NULL DEFAULT 0,
    tokens_spent   INTEGER NOT NULL DEFAULT 0,
    tokens_saved   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, run)
);

CREATE TABLE steps (
    id              INTEGER PRIMARY KEY,
    task_id         TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_index      INTEGER NOT NULL,
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
    tokens          INTEGER NOT NULL DEFAULT 0,
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
    id          INTEGER PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_index  INTEGER NOT NULL,
    action      TEXT NOT NULL,
    value       TEXT,
    resolved_by TEXT NOT NULL,
    resolved_at TEXT NOT NULL
);
",
    r"
-- For a failed step, the first step number the agent could open knowing
-- of the failure: it replays only if the journal holds a step from there.
ALTER TABLE steps ADD COLUMN seen_from INTEGER;
",
    r"
-- SPEC 8 and 9: a token budget per task, the wake time of a `sleep` step
-- (or the timeout of a `wait`), and the signals sent to tasks.
ALTER TABLE tasks ADD COLUMN max_tokens INTEGER;
ALTER TABLE steps ADD COLUMN wake_at TEXT;
CREATE TABLE signals (
    id        INTEGER PRIMARY KEY,
    task_id   TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    name      TEXT NOT NULL,
    data      TEXT NOT NULL,
    signal_id TEXT,
    sent_by   TEXT NOT NULL,
    sent_at   TEXT NOT NULL,
    taken_by  INTEGER
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
ALTER TABLE tasks ADD COLUMN claimed_at INTEGER;
CREATE INDEX tasks_by_queue ON tasks (queue, created_at) WHERE queue IS NOT NULL;
CREATE TABLE workers (
    id         TEXT PRIMARY KEY NOT NULL,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    queues     TEXT NOT NULL,
    jobs       INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    heartbeat  INTEGER NOT NULL,
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
    backoff_ms INTEGER NOT NULL,
    used       INTEGER NOT NULL DEFAULT 0
);
",
    r"
-- SPEC 15: why durun ended a run, as it told the user (a divergence with
-- its diff, a journal error, a spent budget): `inspect` and the web view
-- show it after the terminal is gone.
ALTER TABLE runs ADD COLUMN error TEXT;
",
];

/// `PRAGMA application_id` of a durun journal ("durn"): a file with other
/// tables and another id belongs to another program and is left alone.
pub(super) const APPLICATION_ID: i32 = 0x6475_726e;
