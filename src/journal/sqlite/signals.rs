//! Signals (SPEC 8): kept once per id, taken by `wait` steps in the
//! transaction that commits them.

use anyhow::Result;
use rusqlite::{OptionalExtension as _, TransactionBehavior, params};

use super::SqliteJournal;
use super::rows::{
    SIGNAL_COLUMNS, json_text, signal_columns, signal_from_row, standing_columns, write_step,
};
use crate::journal::sql;
use crate::journal::{SignalRecord, Signals, StepRecord};

impl Signals for SqliteJournal {
    fn send_signal(&mut self, task: &str, signal: &SignalRecord) -> Result<bool> {
        // Another connection's write changes `data_version`: a live
        // runner's next look sees it.
        let added = self
            .conn
            .prepare_cached(
                "INSERT INTO signals (task_id, name, data, signal_id, sent_by, sent_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
            )?
            .execute(params![
                task,
                signal.name,
                json_text(&signal.data),
                signal.signal_id,
                signal.sent_by,
                signal.sent_at
            ])?;
        self.check_identity()?;
        Ok(added == 1)
    }

    fn signals(&mut self, task: &str) -> Result<Vec<SignalRecord>> {
        let mut statement = self.conn.prepare_cached(sql::SIGNALS_OF_TASK.sqlite())?;
        let mut rows = statement.query([task])?;
        let mut signals = Vec::new();
        while let Some(row) = rows.next()? {
            signals.push(signal_from_row(row)?);
        }
        Ok(signals)
    }

    fn signal_waiting(&mut self, task: &str, name: &str) -> Result<bool> {
        let waiting = self
            .conn
            .prepare_cached(sql::SIGNAL_WAITING.sqlite())?
            .query_row(params![task, name], |row| row.get(0))?;
        Ok(waiting)
    }

    fn take_signal(
        &mut self,
        task: &str,
        run: u32,
        step: &mut StepRecord,
        fresh: bool,
    ) -> Result<Option<SignalRecord>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (lease_run, cancelled) = standing_columns(&tx, task)?;
        crate::journal::fence(lease_run, cancelled, run, true)?;
        let found = tx
            .prepare_cached(&format!(
                "SELECT id, {SIGNAL_COLUMNS} FROM signals
                 WHERE task_id = ?1 AND name = ?2 AND taken_by IS NULL ORDER BY id LIMIT 1"
            ))?
            .query_row(params![task, step.name], |row| {
                Ok((row.get::<_, i64>(0)?, signal_columns(row, 1)?.record()))
            })
            .optional()?;
        let taken = match found {
            Some((id, signal)) => {
                let mut signal = signal?;
                signal.taken_by = Some(step.step);
                tx.prepare_cached(sql::TAKE_SIGNAL.sqlite())?
                    .execute(params![id, step.step as i64])?;
                crate::journal::take_into(step, &signal);
                write_step(&tx, task, step, fresh, run)?;
                Some(signal)
            }
            None if fresh => {
                write_step(&tx, task, step, fresh, run)?;
                None
            }
            None => None,
        };
        tx.commit()?;
        self.check_identity()?;
        Ok(taken)
    }
}
