//! The queue (SPEC 11): claims, worker heartbeats, and waiting for work.

use anyhow::Result;
use rusqlite::{TransactionBehavior, params};

use super::SqliteJournal;
use crate::journal::reads::task_from;
use crate::journal::rows::TASK_COLUMNS;
use crate::journal::sql::for_sqlite;
use crate::journal::{Heard, Queue, TaskRecord, WorkerRecord};

/// The tasks a worker might claim: made once, since a worker looks for
/// work every few hundred milliseconds.
static CLAIMABLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    for_sqlite(&format!(
        "SELECT {TASK_COLUMNS} FROM tasks t
         WHERE t.queue IN (SELECT value FROM json_each(?1))
           AND t.status IN ('queued', 'running', 'interrupted', 'waiting', 'sleeping')
           AND (t.claimed_by IS NULL OR t.claimed_by = ?2 OR t.claimed_at < ?3)
         ORDER BY t.created_at, t.rowid LIMIT ?4 OFFSET ?5"
    ))
});

impl Queue for SqliteJournal {
    fn claimable(
        &mut self,
        queues: &[String],
        worker: &str,
        limit: usize,
        offset: usize,
    ) -> Result<(Vec<TaskRecord>, i64)> {
        let now = crate::journal::now_ms();
        let queues = serde_json::to_string(queues)?;
        let mut statement = self.conn.prepare_cached(&CLAIMABLE)?;
        let mut rows = statement.query(params![
            queues,
            worker,
            now - self.stale.as_millis() as i64,
            limit as i64,
            offset as i64
        ])?;
        let mut tasks = Vec::new();
        while let Some(row) = rows.next()? {
            tasks.push(task_from(row)?);
        }
        Ok((tasks, now))
    }

    fn claim(
        &mut self,
        queue: &str,
        tasks: &[String],
        worker: &str,
        concurrency: Option<u32>,
    ) -> Result<Vec<String>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now = crate::journal::now_ms();
        let fresh = now - self.stale.as_millis() as i64;
        // Under the write lock: nobody claims or starts a run meanwhile.
        let active: i64 = tx
            .prepare_cached(
                "SELECT count(*) FROM tasks WHERE queue = ?1 AND (
                     (status = 'running' AND lease_heartbeat >= ?2)
                     OR (claimed_by IS NOT NULL AND claimed_at >= ?2))",
            )?
            .query_row(params![queue, fresh], |row| row.get(0))?;
        let room = concurrency.map_or(usize::MAX, |limit| {
            (i64::from(limit) - active).max(0) as usize
        });
        let mut claimed = Vec::new();
        for id in tasks.iter().take(room) {
            let changed = tx
                .prepare_cached(
                    "UPDATE tasks SET claimed_by = ?2, claimed_at = ?3
                     WHERE id = ?1 AND (claimed_by IS NULL OR claimed_by = ?2 OR claimed_at < ?4)",
                )?
                .execute(params![id, worker, now, fresh])?;
            if changed == 1 {
                claimed.push(id.clone());
            }
        }
        tx.commit()?;
        Ok(claimed)
    }

    fn worker_heartbeat(&mut self, worker: &WorkerRecord) -> Result<()> {
        // Like a lease's heartbeat, it need not survive a power cut.
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        let written = self
            .conn
            .prepare_cached(
                "INSERT INTO workers (id, host, pid, queues, jobs, started_at, heartbeat, tasks)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (id) DO UPDATE SET heartbeat = excluded.heartbeat, tasks = excluded.tasks",
            )
            .and_then(|mut statement| {
                statement.execute(params![
                    worker.id,
                    worker.host,
                    worker.pid,
                    serde_json::to_string(&worker.queues).expect("JSON"),
                    worker.jobs,
                    worker.started_at,
                    crate::journal::now_ms(),
                    serde_json::to_string(&worker.tasks).expect("JSON"),
                ])
            });
        self.conn
            .pragma_update(None, "synchronous", self.sync.as_str().to_ascii_uppercase())?;
        written?;
        Ok(())
    }

    fn workers(&mut self) -> Result<Vec<WorkerRecord>> {
        let fresh = crate::journal::now_ms() - self.stale.as_millis() as i64;
        let mut statement = self.conn.prepare_cached(
            "SELECT id, host, pid, queues, jobs, started_at, heartbeat, tasks FROM workers
             WHERE heartbeat >= ?1 ORDER BY started_at, id",
        )?;
        let mut rows = statement.query([fresh])?;
        let mut workers = Vec::new();
        while let Some(row) = rows.next()? {
            workers.push(crate::journal::rows::worker(
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get_ref(3)?.as_str()?,
                row.get(4)?,
                row.get(5)?,
                row.get(6)?,
                row.get_ref(7)?.as_str()?,
            )?);
        }
        Ok(workers)
    }

    fn wait_for_work(&mut self, timeout: std::time::Duration) -> Result<Heard> {
        // Another process's commit changes `data_version`: a submit, a
        // signal, a run that ended. Looked at every 20 ms.
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let version: i64 = self
                .conn
                .prepare_cached("PRAGMA data_version")?
                .query_row([], |row| row.get(0))?;
            if version != self.work_version {
                self.work_version = version;
                return Ok(Heard {
                    any: true,
                    run_ended: true,
                });
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(Heard::default());
            }
            std::thread::sleep((deadline - now).min(std::time::Duration::from_millis(20)));
        }
    }
}
