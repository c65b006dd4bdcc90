//! Signals (SPEC 8): kept once per id, taken by `wait` steps in the
//! transaction that commits them.

use anyhow::Result;
use rusqlite::params;

use super::SqliteJournal;
use super::rows::json_text;
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
}
