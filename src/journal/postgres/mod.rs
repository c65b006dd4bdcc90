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
mod transfer;
mod tx;

use cached::Queries as _;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::journal::sql::NOW_MS;
use crate::journal::tx::lease_at;

pub(crate) use open::describe;

use super::{Journal, NewTask, RunEnd, RunStart, RunStats, Standing, StepWrite};
use crate::config::SyncMode;
use crate::journal::sql::{self, Sql};
use crate::journal::{reads, writes};
use crate::lease::{self, Holder};

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

/// A run's start reads the task's lease, locked: a racing runner waits,
/// then sees the lease of the first.
static START_LEASE: Sql = Sql::made(|| {
    format!(
        "SELECT runs, lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run,
                cancel_requested_at IS NOT NULL OR status = 'cancelled', {NOW_MS}
         FROM tasks WHERE id = $1 FOR UPDATE"
    )
});

/// A run's start: its lease, its row and its event, in one statement.
static START_OPEN: Sql = Sql::made(|| {
    format!(
        "WITH leased AS (
             UPDATE tasks SET status = 'running', runs = $2, exit_code = NULL, lease_host = $3,
                 lease_pid = $4, lease_pid_start = $5, lease_heartbeat = {NOW_MS}, lease_run = $2,
                 updated_at = $6
             WHERE id = $1
         ), opened AS (
             INSERT INTO runs (task_id, run, host, pid, started_at) VALUES ($1, $2, $3, $4, $6)
         )
         INSERT INTO events (task_id, run, kind, step, at) VALUES ($1, $2, 'run.opened', NULL, $6)"
    )
});

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
        use crate::journal::tx::{Row, Tx};
        // The run hears of a takeover or a cancel from its commit on (a
        // start that does not commit does not listen).
        let listen = format!("LISTEN {}", channel(task));
        let mut tx = self.client.begin(false, &listen);
        // FOR UPDATE: a racing runner waits here, then sees our lease.
        // The task's steps are read after the lock, which a step's commit
        // holds too (its fence reads the row FOR SHARE): they are all the
        // steps there will be before the run's own. All with the BEGIN:
        // one round trip.
        let args = [task.into()];
        let lease_columns = |row: &dyn Row| {
            Ok((
                row.boolean(6)?.unwrap_or(false),
                row.some_int(0)?,
                lease_at(row, 1)?,
                row.some_int(7)?,
            ))
        };
        let (found, recorded) = match (
            tx.executed(START_LEASE.postgres(), &args),
            tx.executed(sql::REPLAY_BOUNDS.postgres(), &args),
        ) {
            (Some(lease), Some(bounds)) => {
                let rows = tx.with_unsent(&format!("{lease}; {bounds}"))?;
                let [lease, bounds] = &rows[..] else {
                    anyhow::bail!(
                        "the server answered a run's start with {} results",
                        rows.len()
                    );
                };
                let found = lease.first().map(|row| lease_columns(row)).transpose()?;
                let recorded = match bounds.first() {
                    Some(row) => reads::bounds_of(row)?,
                    None => (0, 0),
                };
                (found, recorded)
            }
            // A text no statement can hold (a NUL): as prepared statements.
            // (Both or neither: they take the same argument.)
            _ => {
                let tx = &mut tx as &mut dyn Tx;
                let found = tx.query_opt(&START_LEASE, &args, lease_columns)?;
                (found, reads::replay_bounds(tx, task)?)
            }
        };
        let Some((cancelled, runs, taken_over, server_now)) = found else {
            anyhow::bail!("task {task} is not in the journal");
        };
        if cancelled {
            return Ok(RunStart::Cancelled);
        }
        if let Some(lease) = &taken_over
            && lease::is_live(lease, me, server_now, self.stale)
        {
            return Ok(RunStart::Locked(lease.clone()));
        }
        let run = runs + 1;
        let leased_at = crate::os::boot_clock();
        let pid = i64::from(me.pid);
        let pid_start = me.pid_start.map(|start| start as i64);
        // The lease, the run's row and its event in one statement, sent
        // with the COMMIT: the start's second and last round trip.
        tx.execute_later(
            &START_OPEN,
            &[
                task.into(),
                run.into(),
                me.host.as_str().into(),
                pid.into(),
                pid_start.into(),
                now.into(),
            ],
        )?;
        if taken_over.is_some() {
            // A holder that was only paused hears of it on its next look.
            tx.notify_channel(&channel(task), "taken")?;
        }
        tx.commit()?;
        self.channel = Some(channel(task));
        Ok(RunStart::Started {
            run: run as u32,
            leased_at,
            recorded,
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
