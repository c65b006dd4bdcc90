//! The queue (SPEC 11): claims, worker heartbeats, and waiting for work.

use super::cached::{Queries, Tx};
use std::time::Duration;

use anyhow::Result;

use super::PostgresJournal;
use super::clock::NOW_MS;
use crate::journal::reads::task_from;
use crate::journal::rows::TASK_COLUMNS;
use crate::journal::{Heard, Look, Looked, Queue, TaskRecord, WorkerRecord};

impl Queue for PostgresJournal {
    fn claimable(
        &mut self,
        queues: &[String],
        worker: &str,
        limit: usize,
        offset: usize,
    ) -> Result<(Vec<TaskRecord>, i64)> {
        claimable(&mut self.client, queues, worker, limit, offset, self.stale)
    }

    fn look(&mut self, look: &Look<'_>) -> Result<Looked> {
        let mut looked = Looked::default();
        // Tasks to claim alone (a submit came): one query, no more.
        if let Look {
            heartbeat: None,
            workers: false,
            claimable: Some((queues, worker, limit)),
            retryable: false,
        } = *look
        {
            (looked.claimable, looked.now_ms) =
                claimable(&mut self.client, queues, worker, limit, 0, self.stale)?;
            return Ok(looked);
        }
        // Else one transaction, whatever it holds: an idle worker's look
        // costs the server one (SPEC 16).
        let mut tx = self.client.transaction()?;
        if let Some(worker) = look.heartbeat {
            heartbeat(&mut tx, worker)?;
        }
        if look.workers {
            looked.workers = workers(&mut tx, self.stale)?;
        }
        if let Some((queues, worker, limit)) = look.claimable {
            (looked.claimable, looked.now_ms) =
                claimable(&mut tx, queues, worker, limit, 0, self.stale)?;
        }
        if look.retryable {
            looked.retryable = crate::journal::reads::retryable(&mut tx)?;
        }
        tx.commit()?;
        Ok(looked)
    }

    fn claim(
        &mut self,
        queue: &str,
        tasks: &[String],
        worker: &str,
        concurrency: Option<u32>,
    ) -> Result<Vec<String>> {
        let stale = self.stale.as_millis() as i64;
        let take = format!(
            "UPDATE tasks SET claimed_by = $2, claimed_at = {NOW_MS}
             WHERE id = ANY($1) AND (claimed_by IS NULL OR claimed_by = $2 OR claimed_at < {NOW_MS} - $3)
             RETURNING id"
        );
        // One statement: a row another worker claimed first fails the
        // condition when it is checked again after that worker's commit. A
        // claim need not survive a crash of the server (it is void after
        // the stale time; the lease is what fences a run): it does not
        // wait for the server's disk.
        let mut tx = self.client.transaction()?;
        tx.batch_execute("SET LOCAL synchronous_commit TO off")?;
        let wanted: Vec<&String> = match concurrency {
            None => tasks.iter().collect(),
            Some(limit) => {
                // One claimer per queue at a time: the count below stays
                // true until this transaction commits.
                tx.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('durun_queue:' || $1))",
                    &[&queue],
                )?;
                let active: i64 = tx
                    .query_one(
                        &format!(
                            "SELECT count(*) FROM tasks WHERE queue = $1 AND (
                                 (status = 'running' AND lease_heartbeat >= {NOW_MS} - $2)
                                 OR (claimed_by IS NOT NULL AND claimed_at >= {NOW_MS} - $2))"
                        ),
                        &[&queue, &stale],
                    )?
                    .get(0);
                let room = (i64::from(limit) - active).max(0) as usize;
                tasks.iter().take(room).collect()
            }
        };
        let claimed = tx
            .query(&take, &[&wanted, &worker, &stale])?
            .iter()
            .map(|row| row.get(0))
            .collect();
        tx.commit()?;
        Ok(claimed)
    }

    fn worker_heartbeat(&mut self, worker: &WorkerRecord) -> Result<()> {
        let mut tx = self.client.transaction()?;
        heartbeat(&mut tx, worker)?;
        tx.commit()?;
        Ok(())
    }

    fn workers(&mut self) -> Result<Vec<WorkerRecord>> {
        workers(&mut self.client, self.stale)
    }

    fn wait_for_work(&mut self, timeout: Duration) -> Result<Heard> {
        use postgres::fallible_iterator::FallibleIterator as _;
        if !self.listening {
            // Submits, signals and ended runs notify this channel.
            self.client.batch_execute("LISTEN durun_work")?;
            self.listening = true;
            return Ok(Heard {
                any: true,
                run_ended: true,
            });
        }
        let mut heard = Heard::default();
        let mut notifications = self.client.client.notifications();
        let mut note = |notification: postgres::Notification| {
            heard.any = true;
            heard.run_ended |= notification.payload() != "submit";
        };
        if let Some(notification) = notifications.timeout_iter(timeout).next()? {
            note(notification);
        }
        // Take what else came with it: one look serves them all.
        let mut pending = notifications.iter();
        while let Some(notification) = pending.next()? {
            note(notification);
        }
        Ok(heard)
    }
}

fn claimable(
    db: &mut impl Queries,
    queues: &[String],
    worker: &str,
    limit: usize,
    offset: usize,
    stale: Duration,
) -> Result<(Vec<TaskRecord>, i64)> {
    let stale = stale.as_millis() as i64;
    let rows = db.query(
        &format!(
            "SELECT {TASK_COLUMNS}, {NOW_MS} FROM tasks t
             WHERE t.queue = ANY($1)
               AND t.status IN ('queued', 'running', 'interrupted', 'waiting', 'sleeping')
               AND (t.claimed_by IS NULL OR t.claimed_by = $2 OR t.claimed_at < {NOW_MS} - $3)
             ORDER BY t.created_at, t.id LIMIT $4 OFFSET $5"
        ),
        &[&queues, &worker, &stale, &(limit as i64), &(offset as i64)],
    )?;
    // The server's clock, for the leases of the tasks found; with none
    // found nobody asks.
    let now = rows.first().map_or(0, |row| row.get(23));
    let tasks = rows
        .iter()
        .map(|row| task_from(row))
        .collect::<Result<_>>()?;
    Ok((tasks, now))
}

/// The worker's heartbeat, which need not survive a crash of the server:
/// the transaction does not wait for the server's disk.
fn heartbeat(tx: &mut Tx<'_>, worker: &WorkerRecord) -> Result<()> {
    tx.batch_execute("SET LOCAL synchronous_commit TO off")?;
    tx.execute(
        &format!(
            "INSERT INTO workers (id, host, pid, queues, jobs, started_at, heartbeat, tasks)
             VALUES ($1, $2, $3, $4, $5, $6, {NOW_MS}, $7)
             ON CONFLICT (id) DO UPDATE SET heartbeat = excluded.heartbeat, tasks = excluded.tasks"
        ),
        &[
            &worker.id,
            &worker.host,
            &i64::from(worker.pid),
            &serde_json::to_string(&worker.queues)?,
            &(worker.jobs as i32),
            &worker.started_at,
            &serde_json::to_string(&worker.tasks)?,
        ],
    )?;
    Ok(())
}

fn workers(db: &mut impl Queries, stale: Duration) -> Result<Vec<WorkerRecord>> {
    let stale = stale.as_millis() as i64;
    let rows = db.query(
        &format!(
            "SELECT id, host, pid, queues, jobs, started_at, heartbeat, tasks FROM workers
             WHERE heartbeat >= {NOW_MS} - $1 ORDER BY started_at, id"
        ),
        &[&stale],
    )?;
    rows.iter()
        .map(|row| {
            crate::journal::rows::worker(
                row.get(0),
                row.get(1),
                row.get(2),
                row.get(3),
                i64::from(row.get::<_, i32>(4)),
                row.get(5),
                row.get(6),
                row.get(7),
            )
        })
        .collect()
}
