//! A run's start: the task's lease taken under its row's lock, the run's
//! row written, and what it may replay read, in two round trips. A
//! resume may read the task's row in the first of them, and go on only
//! where the row says to.

use anyhow::Result;
use postgres::SimpleQueryRow;

use super::cached::{Queries as _, Tx as Batch};
use super::{PostgresJournal, channel};
use crate::journal::sql::{self, NOW_MS, Sql};
use crate::journal::tx::{Arg, Row, Tx, lease_at};
use crate::journal::{RunStart, TaskRecord, reads};
use crate::lease::{self, Holder};

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

/// Whether a task read at its start is to be started.
pub(super) type Startable<'a> = &'a dyn Fn(&TaskRecord) -> bool;

/// What a start found: the task's row when it was asked for (`None`
/// only where the journal holds no such task), and the start unless the
/// row said not to.
pub(super) type Started = (Option<TaskRecord>, Option<RunStart>);

/// The lease as the start reads it: whether the task was cancelled, its
/// run count, the lease, the server's clock.
type LeaseRead = (bool, i64, Option<crate::lease::Lease>, i64);

impl PostgresJournal {
    /// Takes task `task`'s lease for `me` and opens a run (see
    /// [`crate::journal::Journal::start_run`]). With `startable`, the
    /// task's row is read after the lock, in the same round trip, and the
    /// transaction rolls back, having written nothing, where it says no.
    pub(super) fn start(
        &mut self,
        task: &str,
        me: &Holder,
        now: &str,
        startable: Option<Startable<'_>>,
    ) -> Result<Started> {
        // The run hears of a takeover or a cancel from its commit on (a
        // start that does not commit does not listen).
        let listen = format!("LISTEN {}", channel(task));
        let stale = self.stale;
        let mut tx = self.client.begin(false, &listen);
        let FirstReads {
            lease: found,
            record,
            recorded,
        } = first_reads(&mut tx, task, startable.is_some())?;
        let Some((cancelled, runs, taken_over, server_now)) = found else {
            if startable.is_some() {
                return Ok((None, None));
            }
            anyhow::bail!("task {task} is not in the journal");
        };
        if let Some(startable) = startable
            && !record.as_ref().is_some_and(startable)
        {
            // Dropped: the `ROLLBACK` ends it, the `LISTEN` with it.
            return Ok((record, None));
        }
        if cancelled {
            return Ok((record, Some(RunStart::Cancelled)));
        }
        if let Some(lease) = &taken_over
            && lease::is_live(lease, me, server_now, stale)
        {
            return Ok((record, Some(RunStart::Locked(lease.clone()))));
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
        Ok((
            record,
            Some(RunStart::Started {
                run: run as u32,
                leased_at,
                recorded,
            }),
        ))
    }
}

/// What a start reads before it writes.
struct FirstReads {
    /// `None` where the journal holds no such task.
    lease: Option<LeaseRead>,
    /// The task's row, when it was asked for.
    record: Option<TaskRecord>,
    /// How many live steps the task has, and its highest step.
    recorded: (u64, u64),
}

/// The start's first round trip, sent with its `BEGIN`: the lease, locked
/// (`FOR UPDATE`: a racing runner waits here, then sees our lease); the
/// task's row if `read`; how many steps it has and its highest. The
/// steps are read after the lock, which a step's commit holds too (its
/// fence reads the row `FOR SHARE`): they are all the steps there will be
/// before the run's own.
fn first_reads(tx: &mut Batch<'_>, task: &str, read: bool) -> Result<FirstReads> {
    let args = [task.into()];
    let mut statements: Vec<&Sql> = vec![&START_LEASE];
    if read {
        statements.push(&sql::TASK);
    }
    statements.push(&sql::REPLAY_BOUNDS);
    let Some(results) = together(tx, &statements, &args)? else {
        // A text no statement can hold (a NUL): as prepared statements.
        let tx = tx as &mut dyn Tx;
        let found = tx.query_opt(&START_LEASE, &args, lease_columns)?;
        let record = if read { reads::task(tx, task)? } else { None };
        let recorded = reads::replay_bounds(tx, task)?;
        return Ok(FirstReads {
            lease: found,
            record,
            recorded,
        });
    };
    let mut results = results.iter();
    let mut next = || results.next().and_then(|rows| rows.first());
    let found = next().map(|row| lease_columns(row)).transpose()?;
    let record = if read {
        next().map(|row| reads::task_from(row)).transpose()?
    } else {
        None
    };
    let recorded = next().map_or(Ok((0, 0)), |row| reads::bounds_of(row))?;
    Ok(FirstReads {
        lease: found,
        record,
        recorded,
    })
}

fn lease_columns(row: &dyn Row) -> Result<LeaseRead> {
    Ok((
        row.boolean(6)?.unwrap_or(false),
        row.some_int(0)?,
        lease_at(row, 1)?,
        row.some_int(7)?,
    ))
}

/// `statements`, each with `args`, after what waits to be sent, in one
/// round trip: each one's rows, in order. `None`, with nothing sent, when
/// a value cannot be written into a statement.
fn together(
    tx: &mut Batch<'_>,
    statements: &[&Sql],
    args: &[Arg<'_>],
) -> Result<Option<Vec<Vec<SimpleQueryRow>>>> {
    let mut batch = String::new();
    for statement in statements {
        let Some(executed) = tx.executed(statement.postgres(), args) else {
            return Ok(None);
        };
        if !batch.is_empty() {
            batch.push_str("; ");
        }
        batch.push_str(&executed);
    }
    let results = tx.with_unsent(&batch)?;
    if results.len() != statements.len() {
        anyhow::bail!(
            "the server answered {} statements with {} results",
            statements.len(),
            results.len()
        );
    }
    Ok(Some(results))
}
