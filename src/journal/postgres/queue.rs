//! The queue (SPEC 11): claims, worker heartbeats, and waiting for work.

use super::cached::Queries;
use std::time::Duration;

use anyhow::Result;

use super::PostgresJournal;
use crate::journal::{Heard, Queue};

impl Queue for PostgresJournal {
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
        let mut note = |notification: postgres::Notification| heard.note(notification.payload());
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
