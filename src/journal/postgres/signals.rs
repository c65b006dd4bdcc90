//! Signals (SPEC 8): kept once per id, taken by `wait` steps in the
//! transaction that commits them.

use super::cached::Queries as _;
use anyhow::Result;

use super::{PostgresJournal, channel};
use crate::journal::{SignalRecord, Signals};

impl Signals for PostgresJournal {
    fn send_signal(&mut self, task: &str, signal: &SignalRecord) -> Result<bool> {
        let mut tx = self.client.transaction()?;
        let added = tx.execute(
            "INSERT INTO signals (task_id, name, data, signal_id, sent_by, sent_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (task_id, signal_id) WHERE signal_id IS NOT NULL DO NOTHING",
            &[
                &task,
                &signal.name,
                &serde_json::to_string(&signal.data)?,
                &signal.signal_id,
                &signal.sent_by,
                &signal.sent_at,
            ],
        )?;
        if added == 1 {
            // A runner on any host hears of it on its next look.
            tx.execute("SELECT pg_notify($1, 'signal')", &[&channel(task)])?;
            tx.execute("SELECT pg_notify('durun_work', 'signal')", &[])?;
        }
        tx.commit()?;
        Ok(added == 1)
    }
}
