//! The shared journal: PostgreSQL, for state that must outlive the machine
//! or be shared by runners on several machines.
//!
//! Same tables, columns and semantics as the SQLite journal. Each write
//! method is one transaction, committed (with `synchronous_commit = on`
//! unless the task chose `normal`) before durun acts on it. Taking a lease
//! locks the task's row (`FOR UPDATE`), so of two runners racing for one
//! task exactly one wins. The URL is never printed: it may hold a password.

use anyhow::{Context as _, Result};
use postgres::{Client, NoTls, Row, Transaction};
use serde_json::Value;

use super::{
    Journal, NewTask, Resolution, RunEnd, RunRecord, RunStart, RunStats, Standing, StepError,
    StepKind, StepRecord, StepStatus, StepWrite, TaskRecord, TaskStatus,
};
use crate::config::SyncMode;
use crate::error::Failure;
use crate::json_text::JsonText;
use crate::lease::{self, Holder, Lease};
use crate::protocol::Effect;

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
const MIGRATIONS: &[&str] = &[
    SCHEMA,
    // For a failed step, the first step number the agent could open knowing
    // of the failure: it replays only if the journal holds a step from there.
    "ALTER TABLE steps ADD COLUMN seen_from BIGINT",
];

/// The schema version this durun writes.
const VERSION: i32 = MIGRATIONS.len() as i32;

/// The server's clock in milliseconds: every lease time is stamped and
/// compared on the one clock all runners share, so hosts whose clocks
/// disagree still agree on whether a heartbeat is stale.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

const TASK_COLUMNS: &str = "t.id, t.status, t.argv, t.cwd, t.config, t.config_path, t.sync_mode, t.exit_code,
    t.output, t.runs, t.lease_host, t.lease_pid, t.lease_pid_start, t.lease_heartbeat, t.lease_run,
    t.created_at,
    greatest(t.updated_at, coalesce((SELECT coalesce(s.finished_at, s.started_at) FROM steps s
        WHERE s.task_id = t.id AND s.status <> 'discarded' ORDER BY s.step_index DESC LIMIT 1), '')),
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status <> 'discarded'),
    (SELECT coalesce(sum(r.tokens_spent), 0)::BIGINT FROM runs r WHERE r.task_id = t.id),
    (SELECT coalesce(sum(r.tokens_saved), 0)::BIGINT FROM runs r WHERE r.task_id = t.id)";

const STEP_COLUMNS: &str = "step_index, tool_name, kind, effect, args, args_hash, idempotency_key, status,
    attempts, output, error_code, error, usage, tokens, run, created_at, started_at, finished_at, resolution, id,
    seen_from";

pub struct PostgresJournal {
    client: Client,
}

/// The channel on which a task's runner hears of a takeover or a cancel
/// (`LISTEN`/`NOTIFY`): an identifier, whatever the task id holds.
fn channel(task: &str) -> String {
    let hash = crate::step_key::args_hash(task);
    format!("durun_task_{}", &hash[..24])
}

/// What the server said, for messages: `postgres::Error` prints only its
/// kind ("db error"), the reason is in its source.
pub fn reason(err: &postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => {
            let mut text = err.to_string();
            let mut cause = std::error::Error::source(err);
            while let Some(inner) = cause {
                text.push_str(": ");
                text.push_str(&inner.to_string());
                cause = inner.source();
            }
            text
        }
    }
}

/// How a PostgreSQL URL is named in messages: host, port and database,
/// never the user or password.
pub fn describe(url: &str) -> String {
    match url.parse::<postgres::Config>() {
        Ok(config) => {
            let host = match config.get_hosts().first() {
                Some(postgres::config::Host::Tcp(host)) => host.clone(),
                #[cfg(unix)]
                Some(postgres::config::Host::Unix(path)) => path.display().to_string(),
                None => "localhost".to_owned(),
            };
            let port = config.get_ports().first().copied().unwrap_or(5432);
            format!(
                "the PostgreSQL journal at {host}:{port}/{}",
                config.get_dbname().unwrap_or("postgres")
            )
        }
        Err(_) => "the PostgreSQL journal".to_owned(),
    }
}

impl PostgresJournal {
    pub fn open(url: &str, write: bool) -> Result<Self> {
        let config: postgres::Config = url.parse().map_err(|err| {
            Failure::config(format!("the journal URL is not a PostgreSQL URL: {err}"))
                .hint("postgres://USER@HOST:PORT/DATABASE, e.g. postgres://postgres@127.0.0.1/test")
        })?;
        let client = config.connect(NoTls).map_err(|err| {
            Failure::journal(format!("cannot reach {}: {}", describe(url), reason(&err)))
                .hint("check that the server runs and accepts this user, or choose another journal with --journal")
        })?;
        let mut journal = Self { client };
        journal.migrate(write)?;
        Ok(journal)
    }

    fn migrate(&mut self, write: bool) -> Result<()> {
        let mut tx = self.client.transaction()?;
        // One migrating durun at a time, whatever the schema holds.
        tx.execute("SELECT pg_advisory_xact_lock(7238312)", &[])?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS durun_schema (version INTEGER NOT NULL)")?;
        let version: Option<i32> = tx
            .query_opt("SELECT max(version) FROM durun_schema", &[])?
            .and_then(|row| row.get(0));
        let version = version.unwrap_or(0);
        if version > VERSION {
            if write {
                return Err(Failure::journal(format!(
                    "the PostgreSQL journal was written by a newer durun (format {version}; this durun knows up to {VERSION})"
                ))
                .hint("upgrade durun to use this journal")
                .into());
            }
        } else if version < VERSION {
            for (index, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                tx.batch_execute(sql).with_context(|| {
                    format!("failed to migrate the journal to format {}", index + 1)
                })?;
            }
            tx.execute("DELETE FROM durun_schema", &[])?;
            tx.execute(
                "INSERT INTO durun_schema (version) VALUES ($1)",
                &[&VERSION],
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}

fn json_column(text: Option<&str>) -> Result<Option<JsonText>> {
    text.map(|text| JsonText::from_text(text).context("the journal holds malformed JSON"))
        .transpose()
}

fn bad_column(column: &str, value: &str) -> anyhow::Error {
    Failure::journal(format!("the journal holds an unknown {column} {value:?}")).into()
}

fn lease_at(row: &Row, first: usize) -> Option<Lease> {
    match (
        row.get::<_, Option<String>>(first),
        row.get::<_, Option<i64>>(first + 1),
    ) {
        (Some(host), Some(pid)) => Some(Lease {
            host,
            pid: pid as u32,
            pid_start: row
                .get::<_, Option<i64>>(first + 2)
                .map(|start| start as u64),
            heartbeat_ms: row.get::<_, Option<i64>>(first + 3).unwrap_or(0),
            run: row.get::<_, Option<i32>>(first + 4).unwrap_or(0) as u32,
        }),
        _ => None,
    }
}

fn task_from_row(row: &Row) -> Result<TaskRecord> {
    let status: String = row.get(1);
    let argv: String = row.get(2);
    let sync: String = row.get(6);
    let output: Option<String> = row.get(8);
    Ok(TaskRecord {
        id: row.get(0),
        status: TaskStatus::parse(&status).ok_or_else(|| bad_column("task status", &status))?,
        argv: serde_json::from_str(&argv).context("the journal holds a malformed argv")?,
        cwd: row.get(3),
        config: row.get(4),
        config_path: row.get(5),
        sync: SyncMode::parse(&sync).ok_or_else(|| bad_column("sync mode", &sync))?,
        exit_code: row.get(7),
        output: output
            .map(|text| serde_json::from_str(&text).context("the journal holds malformed JSON"))
            .transpose()?,
        runs: row.get::<_, i32>(9) as u32,
        lease: lease_at(row, 10),
        created_at: row.get(15),
        updated_at: row.get(16),
        steps: row.get::<_, i64>(17) as u64,
        tokens_spent: row.get::<_, i64>(18) as u64,
        tokens_saved: row.get::<_, i64>(19) as u64,
    })
}

fn step_from_row(row: &Row) -> Result<StepRecord> {
    let kind: String = row.get(2);
    let effect: String = row.get(3);
    let status: String = row.get(7);
    let error = match (
        row.get::<_, Option<String>>(10),
        row.get::<_, Option<String>>(11),
    ) {
        (code, Some(message)) => Some(StepError {
            code: code.unwrap_or_else(|| "tool_failed".to_owned()),
            message,
        }),
        _ => None,
    };
    Ok(StepRecord {
        step: row.get::<_, i64>(0) as u64,
        name: row.get(1),
        kind: StepKind::parse(&kind).ok_or_else(|| bad_column("step kind", &kind))?,
        effect: Effect::parse(&effect).ok_or_else(|| bad_column("effect", &effect))?,
        args: JsonText::from_text(row.get::<_, &str>(4))
            .context("the journal holds malformed args")?,
        args_hash: row.get(5),
        idempotency_key: row.get(6),
        status: StepStatus::parse(&status).ok_or_else(|| bad_column("step status", &status))?,
        attempts: row.get::<_, i32>(8) as u32,
        output: json_column(row.get(9))?,
        error,
        usage: json_column(row.get(12))?,
        tokens: row.get::<_, i64>(13) as u64,
        run: row.get::<_, i32>(14) as u32,
        created_at: row.get(15),
        started_at: row.get(16),
        finished_at: row.get(17),
        resolution: row.get(18),
        seen_from: row.get::<_, Option<i64>>(20).map(|step| step as u64),
    })
}

/// Inserts (`fresh`) or updates one step's row.
fn write_step(
    tx: &mut Transaction<'_>,
    task: &str,
    step: &StepRecord,
    fresh: bool,
    run: u32,
) -> Result<()> {
    let output = step.output.as_ref().map(JsonText::as_str);
    let usage = step.usage.as_ref().map(JsonText::as_str);
    let (error_code, error) = match &step.error {
        Some(error) => (Some(error.code.as_str()), Some(error.message.as_str())),
        None => (None, None),
    };
    let index = step.step as i64;
    let attempts = step.attempts as i32;
    let tokens = step.tokens as i64;
    let run_number = run as i32;
    let seen_from = step.seen_from.map(|step| step as i64);
    if fresh {
        tx.execute(
            "INSERT INTO steps (task_id, step_index, tool_name, kind, effect, args, args_hash, idempotency_key,
                 status, attempts, output, error_code, error, usage, tokens, run, created_at, started_at,
                 finished_at, resolution, seen_from)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)",
            &[
                &task,
                &index,
                &step.name,
                &step.kind.as_str(),
                &step.effect.as_str(),
                &step.args.as_str(),
                &step.args_hash,
                &step.idempotency_key,
                &step.status.as_str(),
                &attempts,
                &output,
                &error_code,
                &error,
                &usage,
                &tokens,
                &run_number,
                &step.created_at,
                &step.started_at,
                &step.finished_at,
                &step.resolution,
                &seen_from,
            ],
        )?;
    } else {
        let changed = tx.execute(
            "UPDATE steps SET status = $3, attempts = $4, output = $5, error_code = $6, error = $7,
                 usage = $8, tokens = $9, run = $10, started_at = $11, finished_at = $12, resolution = $13,
                 seen_from = $14
             WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded'",
            &[
                &task,
                &index,
                &step.status.as_str(),
                &attempts,
                &output,
                &error_code,
                &error,
                &usage,
                &tokens,
                &run_number,
                &step.started_at,
                &step.finished_at,
                &step.resolution,
                &seen_from,
            ],
        )?;
        anyhow::ensure!(
            changed == 1,
            "step {} of task {task} is missing from the journal",
            step.step
        );
    }
    Ok(())
}

fn write_stats(tx: &mut Transaction<'_>, task: &str, run: u32, stats: &RunStats) -> Result<()> {
    tx.execute(
        "UPDATE runs SET replayed_steps = $3, executed_steps = $4, tokens_spent = $5, tokens_saved = $6
         WHERE task_id = $1 AND run = $2",
        &[
            &task,
            &(run as i32),
            &(stats.replayed_steps as i64),
            &(stats.executed_steps as i64),
            &(stats.tokens_spent as i64),
            &(stats.tokens_saved as i64),
        ],
    )?;
    Ok(())
}

/// The task's lease, locked until the transaction ends, and the server's
/// clock.
fn lease_of(tx: &mut Transaction<'_>, task: &str) -> Result<(Option<Lease>, i64)> {
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

/// The fence of a run's write: the task's holder and cancel mark, read
/// `FOR SHARE` so that no takeover or cancel commits before this
/// transaction does.
fn fence(tx: &mut Transaction<'_>, task: &str, run: u32, opens: bool) -> Result<()> {
    let row = tx.query_opt(
        "SELECT lease_run, cancel_requested_at IS NOT NULL FROM tasks WHERE id = $1 FOR SHARE",
        &[&task],
    )?;
    let (lease_run, cancelled) = match row {
        Some(row) => (
            row.get::<_, Option<i32>>(0).map(|run| run as u32),
            row.get(1),
        ),
        None => (None, false),
    };
    super::fence(lease_run, cancelled, run, opens)?;
    Ok(())
}

impl Journal for PostgresJournal {
    fn set_sync(&mut self, sync: SyncMode) -> Result<()> {
        let setting = match sync {
            SyncMode::Full => "on",
            SyncMode::Normal => "off",
        };
        self.client
            .batch_execute(&format!("SET synchronous_commit TO {setting}"))?;
        Ok(())
    }

    fn create_task(&mut self, task: &NewTask) -> Result<()> {
        self.client
            .execute(
                "INSERT INTO tasks (id, status, argv, cwd, config, config_path, sync_mode, created_at, updated_at)
                 VALUES ($1, 'running', $2, $3, $4, $5, $6, $7, $7)",
                &[
                    &task.id,
                    &serde_json::to_string(&task.argv)?,
                    &task.cwd,
                    &task.config,
                    &task.config_path,
                    &task.sync.as_str(),
                    &task.created_at,
                ],
            )
            .with_context(|| format!("failed to create task {}", task.id))?;
        Ok(())
    }

    fn task(&mut self, id: &str) -> Result<Option<TaskRecord>> {
        let row = self.client.query_opt(
            &format!("SELECT {TASK_COLUMNS} FROM tasks t WHERE t.id = $1"),
            &[&id],
        )?;
        row.as_ref().map(task_from_row).transpose()
    }

    fn tasks(&mut self) -> Result<Vec<TaskRecord>> {
        let rows = self.client.query(
            &format!("SELECT {TASK_COLUMNS} FROM tasks t ORDER BY t.created_at DESC, t.id DESC"),
            &[],
        )?;
        rows.iter().map(task_from_row).collect()
    }

    fn runs(&mut self, task: &str) -> Result<Vec<RunRecord>> {
        let rows = self.client.query(
            "SELECT run, host, pid, started_at, finished_at, exit_code,
                    replayed_steps, executed_steps, tokens_spent, tokens_saved
             FROM runs WHERE task_id = $1 ORDER BY run",
            &[&task],
        )?;
        Ok(rows
            .iter()
            .map(|row| RunRecord {
                run: row.get::<_, i32>(0) as u32,
                host: row.get(1),
                pid: row.get::<_, i64>(2) as u32,
                started_at: row.get(3),
                finished_at: row.get(4),
                exit_code: row.get(5),
                stats: RunStats {
                    replayed_steps: row.get::<_, i64>(6) as u64,
                    executed_steps: row.get::<_, i64>(7) as u64,
                    tokens_spent: row.get::<_, i64>(8) as u64,
                    tokens_saved: row.get::<_, i64>(9) as u64,
                },
            })
            .collect())
    }

    fn visit_steps(
        &mut self,
        task: &str,
        discarded: bool,
        last: Option<usize>,
        visit: &mut dyn FnMut(StepRecord) -> Result<()>,
    ) -> Result<()> {
        let live = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND status <> 'discarded'"
        );
        let all = format!(
            "{live} UNION ALL SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND status = 'discarded'"
        );
        let body = if discarded { all } else { live };
        let rows = match last {
            Some(last) => self.client.query(
                &format!("SELECT * FROM ({body} ORDER BY step_index DESC, id DESC LIMIT $2) AS tail ORDER BY step_index, id"),
                &[&task, &(last as i64)],
            )?,
            None => self.client.query(&format!("{body} ORDER BY step_index, id"), &[&task])?,
        };
        for row in &rows {
            visit(step_from_row(row)?)?;
        }
        Ok(())
    }

    fn count_steps(&mut self, task: &str) -> Result<u64> {
        let row = self
            .client
            .query_one("SELECT count(*) FROM steps WHERE task_id = $1", &[&task])?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    fn step_versions(&mut self, task: &str, step: u64) -> Result<Vec<StepRecord>> {
        let rows = self.client.query(
            &format!("SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND step_index = $2 ORDER BY (status <> 'discarded'), id"),
            &[&task, &(step as i64)],
        )?;
        rows.iter().map(step_from_row).collect()
    }

    fn start_run(&mut self, task: &str, me: &Holder, now: &str) -> Result<RunStart> {
        let mut tx = self.client.transaction()?;
        // FOR UPDATE: a racing runner waits here, then sees our lease.
        let row = tx.query_one(
            &format!(
                "SELECT runs, lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run,
                        cancel_requested_at IS NOT NULL OR status = 'cancelled', {NOW_MS}
                 FROM tasks WHERE id = $1 FOR UPDATE"
            ),
            &[&task],
        )?;
        if row.get::<_, bool>(6) {
            return Ok(RunStart::Cancelled);
        }
        let runs = row.get::<_, i32>(0);
        let server_now: i64 = row.get(7);
        let taken_over = lease_at(&row, 1);
        if let Some(lease) = &taken_over
            && lease::is_live(lease, me, server_now)
        {
            return Ok(RunStart::Locked(lease.clone()));
        }
        let run = runs + 1;
        let leased_at = crate::os::boot_clock();
        let pid = i64::from(me.pid);
        let pid_start = me.pid_start.map(|start| start as i64);
        tx.execute(
            &format!(
                "UPDATE tasks SET status = 'running', runs = $2, exit_code = NULL, lease_host = $3, lease_pid = $4,
                     lease_pid_start = $5, lease_heartbeat = {NOW_MS}, lease_run = $2, updated_at = $6
                 WHERE id = $1"
            ),
            &[&task, &run, &me.host, &pid, &pid_start, &now],
        )?;
        tx.execute(
            "INSERT INTO runs (task_id, run, host, pid, started_at) VALUES ($1, $2, $3, $4, $5)",
            &[&task, &run, &me.host, &pid, &now],
        )?;
        if taken_over.is_some() {
            // A holder that was only paused hears of it on its next look.
            tx.execute("SELECT pg_notify($1, 'taken')", &[&channel(task)])?;
        }
        tx.commit()?;
        self.client
            .batch_execute(&format!("LISTEN {}", channel(task)))?;
        Ok(RunStart::Started {
            run: run as u32,
            leased_at,
        })
    }

    fn heartbeat(&mut self, task: &str, run: u32) -> Result<Standing> {
        let mut tx = self.client.transaction()?;
        // A heartbeat need not survive a crash of the server: it does not
        // wait for the server's disk.
        tx.batch_execute("SET LOCAL synchronous_commit TO off")?;
        let row = tx.query_opt(
            &format!(
                "UPDATE tasks SET lease_heartbeat = {NOW_MS} WHERE id = $1 AND lease_run = $2
                 RETURNING cancel_requested_at IS NOT NULL"
            ),
            &[&task, &(run as i32)],
        )?;
        tx.commit()?;
        Ok(match row {
            None => Standing::Lost,
            Some(row) => super::standing_of(Some(run), row.get(0), run),
        })
    }

    fn watch(&mut self, task: &str, run: u32) -> Result<Standing> {
        use postgres::fallible_iterator::FallibleIterator as _;
        // Polls the connection without waiting: a takeover or a cancel
        // arrives as a notification on the task's channel.
        let mut heard = false;
        {
            let mut notifications = self.client.notifications();
            let mut pending = notifications.iter();
            while pending.next()?.is_some() {
                heard = true;
            }
        }
        if !heard {
            return Ok(Standing::Held);
        }
        let row = self.client.query_opt(
            "SELECT lease_run, cancel_requested_at IS NOT NULL FROM tasks WHERE id = $1",
            &[&task],
        )?;
        Ok(match row {
            Some(row) => super::standing_of(
                row.get::<_, Option<i32>>(0).map(|run| run as u32),
                row.get(1),
                run,
            ),
            None => Standing::Lost,
        })
    }

    fn steps_page(&mut self, task: &str, after: u64, limit: usize) -> Result<Vec<StepRecord>> {
        let rows = self.client.query(
            &format!(
                "SELECT {STEP_COLUMNS} FROM steps
                 WHERE task_id = $1 AND status <> 'discarded' AND step_index > $2
                 ORDER BY step_index LIMIT $3"
            ),
            &[&task, &(after as i64), &(limit as i64)],
        )?;
        rows.iter().map(step_from_row).collect()
    }

    fn replay_bounds(&mut self, task: &str) -> Result<(u64, u64)> {
        let row = self.client.query_one(
            "SELECT count(*), max(step_index) FROM steps WHERE task_id = $1 AND status <> 'discarded'",
            &[&task],
        )?;
        let last: Option<i64> = row.get(1);
        Ok((row.get::<_, i64>(0) as u64, last.unwrap_or(0) as u64))
    }

    fn put_steps(
        &mut self,
        task: &str,
        steps: &[StepWrite<'_>],
        run: u32,
        stats: Option<&RunStats>,
    ) -> Result<()> {
        let mut tx = self.client.transaction()?;
        let opens = steps
            .iter()
            .any(|write| write.record.status == StepStatus::Pending);
        fence(&mut tx, task, run, opens)?;
        for &StepWrite {
            record: step,
            fresh,
        } in steps
        {
            write_step(&mut tx, task, step, fresh, run)?;
        }
        if let Some(stats) = stats {
            write_stats(&mut tx, task, run, stats)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn set_output(&mut self, task: &str, run: u32, output: &Value) -> Result<()> {
        let mut tx = self.client.transaction()?;
        fence(&mut tx, task, run, false)?;
        tx.execute(
            "UPDATE tasks SET output = $2, updated_at = $3 WHERE id = $1",
            &[&task, &serde_json::to_string(output)?, &super::now()],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn finish_run(&mut self, task: &str, run: u32, end: &RunEnd, stats: &RunStats) -> Result<()> {
        let mut tx = self.client.transaction()?;
        tx.execute(
            "UPDATE runs SET finished_at = $3, exit_code = $4 WHERE task_id = $1 AND run = $2",
            &[&task, &(run as i32), &end.finished_at, &end.exit_code],
        )?;
        write_stats(&mut tx, task, run, stats)?;
        tx.execute(
            "UPDATE tasks SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE $3 END,
                 exit_code = $4, updated_at = $5, lease_host = NULL, lease_pid = NULL,
                 lease_pid_start = NULL, lease_heartbeat = NULL, lease_run = NULL
             WHERE id = $1 AND lease_run = $2",
            &[&task, &(run as i32), &end.status.as_str(), &end.exit_code, &end.finished_at],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn discard_from(&mut self, task: &str, run: u32, step: u64) -> Result<Vec<StepRecord>> {
        let mut tx = self.client.transaction()?;
        fence(&mut tx, task, run, true)?;
        let rows = tx.query(
            &format!(
                "SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND step_index >= $2 AND status <> 'discarded'
                 ORDER BY step_index FOR UPDATE"
            ),
            &[&task, &(step as i64)],
        )?;
        let discarded = rows.iter().map(step_from_row).collect::<Result<Vec<_>>>()?;
        tx.execute(
            "UPDATE steps SET status = 'discarded' WHERE task_id = $1 AND step_index >= $2 AND status <> 'discarded'",
            &[&task, &(step as i64)],
        )?;
        tx.commit()?;
        Ok(discarded)
    }

    fn resolve(
        &mut self,
        task: &str,
        step: u64,
        resolution: &Resolution,
        me: &Holder,
    ) -> Result<StepRecord> {
        let mut tx = self.client.transaction()?;
        if let (Some(lease), server_now) = lease_of(&mut tx, task)?
            && lease::is_live(&lease, me, server_now)
        {
            return Err(super::locked(task, &lease).into());
        }
        let row = tx.query_opt(
            &format!("SELECT {STEP_COLUMNS} FROM steps WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded'"),
            &[&task, &(step as i64)],
        )?;
        let Some(row) = row else {
            return Err(Failure::config(format!("task {task} has no step {step}"))
                .hint(format!("`durun inspect {task}` lists its steps"))
                .into());
        };
        let mut record = step_from_row(&row)?;
        let value = super::apply_resolution(&mut record, resolution);
        let (error_code, error) = match &record.error {
            Some(error) => (Some(error.code.as_str()), Some(error.message.as_str())),
            None => (None, None),
        };
        tx.execute(
            "UPDATE steps SET status = $3, output = $4, error_code = $5, error = $6, finished_at = $7, resolution = $8
             WHERE task_id = $1 AND step_index = $2 AND status <> 'discarded'",
            &[
                &task,
                &(step as i64),
                &record.status.as_str(),
                &record.output.as_ref().map(JsonText::as_str),
                &error_code,
                &error,
                &record.finished_at,
                &record.resolution,
            ],
        )?;
        tx.execute(
            "INSERT INTO resolutions (task_id, step_index, action, value, resolved_by, resolved_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &task,
                &(step as i64),
                &resolution.action.name(),
                &value,
                &resolution.by,
                &resolution.at,
            ],
        )?;
        tx.commit()?;
        Ok(record)
    }

    fn request_cancel(&mut self, task: &str, me: &Holder) -> Result<bool> {
        let mut tx = self.client.transaction()?;
        let now = super::now();
        let (lease, server_now) = lease_of(&mut tx, task)?;
        let live = lease.is_some_and(|lease| lease::is_live(&lease, me, server_now));
        if live {
            // The runner keeps its lease to record what finishes, but may
            // open no step: every write it makes checks this mark.
            tx.execute(
                "UPDATE tasks SET status = 'cancelled', updated_at = $2,
                     cancel_requested_at = coalesce(cancel_requested_at, $2)
                 WHERE id = $1",
                &[&task, &now],
            )?;
            tx.execute("SELECT pg_notify($1, 'cancel')", &[&channel(task)])?;
        } else {
            tx.execute(
                "UPDATE tasks SET status = 'cancelled', cancel_requested_at = $2, updated_at = $2, lease_host = NULL,
                     lease_pid = NULL, lease_pid_start = NULL, lease_heartbeat = NULL, lease_run = NULL
                 WHERE id = $1",
                &[&task, &now],
            )?;
        }
        tx.commit()?;
        Ok(live)
    }

    fn gc(&mut self, finished_before: &str, me: &Holder) -> Result<Vec<String>> {
        let mut tx = self.client.transaction()?;
        let rows = tx.query(
            &format!("SELECT id, lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run, {NOW_MS} FROM tasks
                      WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < $1 FOR UPDATE"),
            &[&finished_before],
        )?;
        let now_ms = rows.first().map_or(0, |row| row.get::<_, i64>(6));
        let mut removed = Vec::new();
        for row in &rows {
            let id: String = row.get(0);
            if lease_at(row, 1).is_some_and(|lease| lease::is_live(&lease, me, now_ms)) {
                continue;
            }
            tx.execute("DELETE FROM tasks WHERE id = $1", &[&id])?;
            removed.push(id);
        }
        tx.commit()?;
        Ok(removed)
    }
}
