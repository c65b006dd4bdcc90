//! The shared journal: PostgreSQL, for state that must outlive the machine
//! or be shared by runners on several machines.
//!
//! Same tables, columns and semantics as the SQLite journal. Each write
//! method is one transaction, committed (with `synchronous_commit = on`
//! unless the task chose `normal`) before durun acts on it. Taking a lease
//! locks the task's row (`FOR UPDATE`), so of two runners racing for one
//! task exactly one wins. The URL is never printed: it may hold a password.

mod cached;
mod open;
mod queue;
mod reconnect;
mod rows;
mod run;
mod start;
mod transfer;
mod tx;

use cached::Queries as _;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::Value;

pub(crate) use open::describe;

use super::{
    Journal, NewTask, Opened, RunEnd, RunStart, RunStats, Standing, StepWrite, TaskRecord,
};
use crate::config::SyncMode;
use crate::journal::sql;
use crate::journal::writes;
use crate::lease::Holder;

pub(crate) struct PostgresJournal {
    client: cached::Conn,
    /// To connect again (the URL parsed; it is never printed).
    config: postgres::Config,
    /// `LISTEN durun_work` was sent (a worker's connection).
    listening: bool,
    /// durun set the session's `synchronous_commit` on (sync mode `full`;
    /// `normal` is each transaction's, `Conn::unsynced`).
    synced_session: bool,
    /// How old another host's heartbeat may be before its lease is taken.
    stale: Duration,
    /// The task channel a run listens on, to listen again on a new session.
    channel: Option<String>,
    /// A new session replaced a lost one since the last watch: what it
    /// would have heard is read from the task's row.
    missed: bool,
    /// Says nothing of a lost connection (`--quiet`).
    quiet: bool,
    /// The server as messages name it (no password).
    name: String,
}

impl PostgresJournal {
    /// Sets the session's `synchronous_commit` on, whatever the server's
    /// default says.
    fn sync_session(&mut self) -> Result<()> {
        self.synced_session = false;
        self.client.batch_execute("SET synchronous_commit TO on")?;
        self.synced_session = true;
        Ok(())
    }
}

/// The channel on which a task's runner hears of a takeover or a cancel
/// (`LISTEN`/`NOTIFY`): an identifier, whatever the task id holds.
fn channel(task: &str) -> String {
    let hash = crate::step_key::args_hash(task);
    format!("durun_task_{}", &hash[..24])
}

/// Signals (SPEC 8): kept once per id, taken by `wait` steps in the
/// transaction that commits them; written once for both backends.
impl crate::journal::Signals for PostgresJournal {}

impl Journal for PostgresJournal {
    fn answers(&mut self) -> bool {
        // An empty query: one round trip.
        self.client.client.is_valid(Duration::from_secs(2)).is_ok()
    }

    fn set_sync(&mut self, sync: SyncMode) -> Result<()> {
        // `normal` costs no round trip: each transaction says so with its
        // BEGIN. `full` is the session's, set once: a worker's connection
        // serves run after run, each started unsynced, at no cost.
        self.client.unsynced = sync == SyncMode::Normal;
        if sync == SyncMode::Full && !self.synced_session {
            self.sync_session()?;
        }
        Ok(())
    }

    fn create_task(&mut self, task: &NewTask) -> Result<()> {
        // A plain task is one statement; one with retries or a queue is
        // one transaction, so no worker sees it without its retries.
        // A statement of its own would wait for the server's disk even
        // at sync mode `normal`: that one is a transaction too.
        if task.retries.is_none() && task.queue.is_none() && !self.client.unsynced {
            return insert_task(&mut self.client, task);
        }
        let mut tx = self.client.transaction();
        insert_task(&mut tx, task)?;
        if let Some((retries, backoff_ms)) = task.retries {
            tx.execute(
                sql::SET_RETRIES.postgres(),
                &[&task.id, &(retries as i32), &(backoff_ms as i64)],
            )?;
        }
        if task.queue.is_some() {
            // A worker listening hears of it once the task is there.
            tx.notify_channel("durun_work", crate::journal::news::SUBMIT)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn start_run(&mut self, task: &str, me: &Holder, now: &str) -> Result<RunStart> {
        let (_, start) = self.start(task, me, now, None)?;
        start.ok_or_else(|| anyhow::anyhow!("task {task} is not in the journal"))
    }

    fn open_run(
        &mut self,
        task: &str,
        me: &Holder,
        now: &str,
        startable: &dyn Fn(&TaskRecord) -> bool,
    ) -> Result<Opened> {
        Ok(match self.start(task, me, now, Some(startable))? {
            (None, _) => Opened::Unknown,
            (Some(record), None) => Opened::Read(record),
            (Some(record), Some(start)) => Opened::Tried(record, start),
        })
    }

    fn heartbeat(&mut self, task: &str, run: u32) -> Result<Standing> {
        self.again(|journal, _| journal.renew(task, run))
    }

    fn watch(&mut self, task: &str, run: u32) -> Result<Standing> {
        self.again(|journal, _| journal.look(task, run))
    }

    fn set_unreplayed(&mut self, task: &str, run: u32, steps: &[u64]) -> Result<()> {
        let steps = serde_json::to_string(steps)?;
        self.again(|journal, _| {
            journal.client.execute(
                sql::SET_UNREPLAYED.postgres(),
                &[&task, &(run as i32), &steps],
            )?;
            Ok(())
        })
    }

    fn put_steps(
        &mut self,
        task: &str,
        steps: &[StepWrite<'_>],
        run: u32,
        stats: Option<&RunStats>,
    ) -> Result<()> {
        self.again(|journal, attempt| journal.write_steps(task, steps, run, stats, attempt))
    }

    fn set_output(&mut self, task: &str, run: u32, output: &Value) -> Result<()> {
        let output = serde_json::to_string(output)?;
        self.again(|journal, _| {
            let mut tx = journal.client.transaction();
            writes::set_output(&mut tx, task, run, &output)?;
            tx.commit()?;
            Ok(())
        })
    }

    fn finish_run(&mut self, task: &str, run: u32, end: &RunEnd, stats: &RunStats) -> Result<()> {
        // Also when the server ended this session (a run paused inside a
        // transaction): the run's end is still worth recording, on a new
        // one. It changes the task only if the run holds the lease.
        self.again(|journal, _| journal.record_end(task, run, end, stats))?;
        if let Some(claim) = &end.release {
            claim.set_released();
        }
        Ok(())
    }
}

/// The task's row, queued when it names a queue.
fn insert_task(client: &mut impl cached::Queries, task: &NewTask) -> Result<()> {
    client
        .execute(
            "INSERT INTO tasks (id, status, argv, cwd, config, config_path, sync_mode, created_at, updated_at,
                 max_tokens, queue, launch, max_cost_nanos)
             VALUES ($1, CASE WHEN $9::TEXT IS NULL THEN 'running' ELSE 'queued' END, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, $11)",
            &[
                &task.id,
                &serde_json::to_string(&task.argv)?,
                &task.cwd,
                &task.config,
                &task.config_path,
                &task.sync.as_str(),
                &task.created_at,
                &task.max_tokens.map(|max| max as i64),
                &task.queue,
                &task.launch.column(),
                &task.max_cost_nanos.map(|max| max as i64),
            ],
        )
        .with_context(|| format!("failed to create task {}", task.id))?;
    Ok(())
}
