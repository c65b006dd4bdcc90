//! Signals (SPEC 8): kept once per id, taken by `wait` steps in the
//! transaction that commits them.

use anyhow::Result;
use rusqlite::params;

use super::SqliteJournal;
use super::rows::{json_text, signal_from_row};
use crate::journal::sql;
use crate::journal::{SignalRecord, Signals};

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
}
