//! The PostgreSQL journal's schema: the same tables and columns as the
//! SQLite journal, versioned in `durun_schema`, and the server's clock.

const SCHEMA: &str = r"
CREATE TABLE tasks (
    id                  TEXT PRIMARY KEY NOT NULL,
    status              TEXT NOT NULL,
    argv                TEXT NOT NULL,
    cwd                 TEXT NOT NULL,
    config              TEXT,
    config_path         TEXT,
    sync_mode           TEXT NOT NULL,
    exit_code           INTEGER,
    output              TEXT,
    runs                INTEGER NOT NULL DEFAULT 0,
    lease_host          TEXT,
    lease_pid           BIGINT,
    lease_pid_start     BIGINT,
    lease_heartbeat     BIGINT,
    lease_run           INTEGER,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL,
    cancel_requested_at TEXT
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
    finished_at     TEXT,
    resolution      TEXT
);
CREATE UNIQUE INDEX steps_live ON steps (task_id, step_index) WHERE status <> 'discarded';
CREATE INDEX steps_discarded ON steps (task_id) WHERE status = 'discarded';
CREATE TABLE resolutions (
    id          BIGSERIAL PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_index  BIGINT NOT NULL,
    action      TEXT NOT NULL,
    value       TEXT,
    resolved_by TEXT NOT NULL,
    resolved_at TEXT NOT NULL
);
";

/// Never edit a migration that has shipped: append a new one. The
/// journal's version is the number of migrations applied.
pub(super) const MIGRATIONS: &[&str] = &[
    SCHEMA,
    // For a failed step, the first step number the agent could open knowing
    // of the failure: it replays only if the journal holds a step from there.
    "ALTER TABLE steps ADD COLUMN seen_from BIGINT",
    // SPEC 8 and 9: a token budget per task, the wake time of a `sleep`
    // step (or the timeout of a `wait`), and the signals sent to tasks.
    r"
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
CREATE UNIQUE INDEX signals_by_id ON signals (task_id, signal_id) WHERE signal_id IS NOT NULL;
CREATE INDEX signals_untaken ON signals (task_id, name, id) WHERE taken_by IS NULL;
",
    // SPEC 11: the queue a submitted task waits in, the worker that
    // claimed it (until its run takes the lease), and the live workers.
    r"
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
    // SPEC 10: when a task was imported, so that its first resume shows
    // what it runs, and where, before it starts.
    "ALTER TABLE tasks ADD COLUMN imported_at TEXT",
    // SPEC 12: the recorded proxy and MCP steps no request of a run asked
    // for (JSON array of step numbers): `inspect` shows them `not replayed`.
    "ALTER TABLE runs ADD COLUMN unreplayed TEXT",
    // SPEC 16: a submitted task's retries: how many runs after failed ones
    // it may have, the first backoff (doubling), and how many it had.
    r"
CREATE TABLE task_retries (
    task_id    TEXT PRIMARY KEY NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    retries    INTEGER NOT NULL,
    backoff_ms BIGINT NOT NULL,
    used       INTEGER NOT NULL DEFAULT 0
);
",
    // SPEC 15: why durun ended a run, as it told the user (a divergence
    // with its diff, a journal error, a spent budget): `inspect` and the
    // web view show it after the terminal is gone.
    "ALTER TABLE runs ADD COLUMN error TEXT",
];

/// The schema version this durun writes.
pub(super) const VERSION: i32 = MIGRATIONS.len() as i32;

/// The server's clock in milliseconds: every lease time is stamped and
/// compared on the one clock all runners share, so hosts whose clocks
/// disagree still agree on whether a heartbeat is stale.
pub(super) const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";
