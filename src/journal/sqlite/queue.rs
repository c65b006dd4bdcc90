//! The queue (SPEC 11): claims, worker heartbeats, and waiting for work.

use anyhow::Result;

use super::SqliteJournal;
use crate::journal::{Heard, Queue};

impl Queue for SqliteJournal {
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
