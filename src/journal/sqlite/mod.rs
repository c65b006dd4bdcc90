//! The embedded journal: one `SQLite` file in WAL mode.
//!
//! `synchronous=FULL` by default: a commit is fsync'd before durun acts on
//! it, so a step that took effect is never forgotten, even on power loss.
//! Migrations are an append-only list tracked by `PRAGMA user_version`; a
//! journal from a newer durun is refused rather than written.

mod open;
mod queue;
mod rows;
mod transfer;
mod tx;

use anyhow::{Context as _, Result};
use rusqlite::{OptionalExtension as _, TransactionBehavior, params};

use crate::journal::tx::lease_at;
pub(crate) use open::{SqliteJournal, holds_tables};
use rows::standing_columns;

use super::{Journal, NewTask, RunStart, Standing};
use crate::config::SyncMode;
use crate::journal::sql;
use crate::lease::{self, Holder, Lease};

/// Signals (SPEC 8): kept once per id, taken by `wait` steps in the
/// transaction that commits them; written once for both backends.
impl crate::journal::Signals for SqliteJournal {}

impl Journal for SqliteJournal {
    fn set_sync(&mut self, sync: SyncMode) -> Result<()> {
        self.conn
            .pragma_update(None, "synchronous", sync.as_str().to_ascii_uppercase())?;
        self.sync = sync;
        Ok(())
    }

    fn create_task(&mut self, task: &NewTask) -> Result<()> {
        // One transaction when the task comes with retries; a task
        // without is one statement.
        let tx = task
            .retries
            .is_some()
            .then(|| self.conn.unchecked_transaction())
            .transpose()?;
        insert_task(&self.conn, task)?;
        if let Some(tx) = tx {
            tx.commit()?;
        }
        Ok(())
    }

    fn create_and_start(&mut self, task: &NewTask, me: &Holder, now: &str) -> Result<RunStart> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        insert_task(&tx, task)?;
        let started = start_in(&tx, &task.id, me, now, self.stale)?;
        tx.commit()?;
        Ok(started)
    }

    fn start_run(&mut self, task: &str, me: &Holder, now: &str) -> Result<RunStart> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let started = start_in(&tx, task, me, now, self.stale)?;
        // Nothing was written unless a run started.
        if matches!(started, RunStart::Started { .. }) {
            tx.commit()?;
        }
        Ok(started)
    }

    fn heartbeat(&mut self, task: &str, run: u32) -> Result<Standing> {
        // A heartbeat need not survive a power cut, and an fsync on a busy
        // disk must not hold up the lease: it commits without one (the
        // next step's fsync takes it along).
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        let cancelled: rusqlite::Result<Option<bool>> = self
            .conn
            .prepare_cached(
                "UPDATE tasks SET lease_heartbeat = ?3 WHERE id = ?1 AND lease_run = ?2
                 RETURNING cancel_requested_at IS NOT NULL",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(params![task, run, super::now_ms()], |row| row.get(0))
                    .optional()
            });
        self.conn
            .pragma_update(None, "synchronous", self.sync.as_str().to_ascii_uppercase())?;
        let cancelled = cancelled?;
        self.check_identity()?;
        Ok(match cancelled {
            None => Standing::Lost,
            Some(cancelled) => super::standing_of(Some(run), cancelled, run),
        })
    }

    fn watch(&mut self, task: &str, run: u32) -> Result<Standing> {
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |row| row.get(0))?;
        if version == self.data_version {
            return Ok(Standing::Held);
        }
        self.data_version = version;
        let (lease_run, cancelled) = standing_columns(&self.conn, task)?;
        Ok(super::standing_of(lease_run, cancelled, run))
    }

    fn set_unreplayed(&mut self, task: &str, run: u32, steps: &[u64]) -> Result<()> {
        let steps = serde_json::to_string(steps)?;
        self.conn
            .prepare_cached(sql::SET_UNREPLAYED.sqlite())?
            .execute(params![task, run, steps])?;
        Ok(())
    }
}

/// The task's row (and its retries), as [`Journal::create_task`] writes it.
fn insert_task(conn: &rusqlite::Connection, task: &NewTask) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO tasks (id, status, argv, cwd, config, config_path, sync_mode, created_at, updated_at,
             max_tokens, queue, launch, max_cost_nanos)
         VALUES (?1, CASE WHEN ?9 IS NULL THEN 'running' ELSE 'queued' END, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        task.id,
        serde_json::to_string(&task.argv)?,
        task.cwd,
        task.config,
        task.config_path,
        task.sync.as_str(),
        task.created_at,
        task.max_tokens.map(|max| max as i64),
        task.queue,
        task.launch.column(),
        task.max_cost_nanos.map(|max| max as i64),
    ])
    .with_context(|| format!("failed to create task {}", task.id))?;
    if let Some((retries, backoff_ms)) = task.retries {
        conn.prepare_cached(sql::SET_RETRIES.sqlite())?
            .execute(params![task.id, retries, backoff_ms as i64])?;
    }
    Ok(())
}

/// [`Journal::start_run`] inside the caller's IMMEDIATE transaction, which
/// commits it when a run started.
fn start_in(
    tx: &rusqlite::Transaction<'_>,
    task: &str,
    me: &Holder,
    now: &str,
    stale: std::time::Duration,
) -> Result<RunStart> {
    let (runs, current, cancelled): (u32, Option<Lease>, bool) = {
        let mut statement = tx.prepare_cached(
            "SELECT runs, lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run,
                    cancel_requested_at IS NOT NULL OR status = 'cancelled'
             FROM tasks WHERE id = ?1",
        )?;
        let mut rows = statement.query([task])?;
        let row = rows.next()?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
        (row.get(0)?, lease_at(row, 1)?, row.get(6)?)
    };
    if cancelled {
        return Ok(RunStart::Cancelled);
    }
    let now_ms = super::now_ms();
    if let Some(lease) = current
        && lease::is_live(&lease, me, now_ms, stale)
    {
        return Ok(RunStart::Locked(lease));
    }
    let run = runs + 1;
    let leased_at = crate::os::boot_clock();
    tx.execute(
        "UPDATE tasks SET status = 'running', runs = ?2, exit_code = NULL, lease_host = ?3, lease_pid = ?4,
             lease_pid_start = ?5, lease_heartbeat = ?6, lease_run = ?2, updated_at = ?7
         WHERE id = ?1",
        params![task, run, me.host, me.pid, me.pid_start.map(|start| start as i64), now_ms, now],
    )?;
    tx.execute(
        sql::INSERT_RUN.sqlite(),
        params![task, run, me.host, me.pid, now],
    )?;
    tx.prepare_cached(sql::INSERT_EVENT.sqlite())?
        .execute(params![task, run, "run.opened", None::<i64>, now])?;
    let recorded = tx
        .prepare_cached(sql::REPLAY_BOUNDS.sqlite())?
        .query_row([task], |row| {
            Ok((
                row.get::<_, i64>(0)? as u64,
                row.get::<_, Option<i64>>(1)?.unwrap_or(0) as u64,
            ))
        })?;
    Ok(RunStart::Started {
        run,
        leased_at,
        recorded,
    })
}
