//! A run's own transactions, the lease holder's side: renewing its lease,
//! looking for a takeover or a cancel on its channel, its fenced step
//! writes, and its end. The trait's methods of the same names make these
//! again on a new connection when the old one is lost (`reconnect`).

use anyhow::Result;

use super::cached::Queries as _;
use super::reconnect::Attempt;
use super::{PostgresJournal, channel};
use crate::journal::sql::NOW_MS;
use crate::journal::writes;
use crate::journal::{RunEnd, RunStats, Standing, StepWrite, sql};

impl PostgresJournal {
    /// Renews the run's lease: one transaction.
    pub(super) fn renew(&mut self, task: &str, run: u32) -> Result<Standing> {
        // A heartbeat need not survive a crash of the server: it does not
        // wait for the server's disk.
        let mut tx = self.client.begin(true, "");
        let row = tx.query_opt(
            &format!(
                "UPDATE tasks SET lease_heartbeat = {NOW_MS} WHERE id = $1 AND lease_run = $2
                 RETURNING cancel_requested_at IS NOT NULL"
            ),
            &[&task, &(run as i32)],
        )?;
        tx.commit()?;
        Ok(match row {
            None => Standing::Lost,
            Some(row) => crate::journal::standing_of(Some(run), row.get(0), run),
        })
    }

    /// What the run's channel said since the last look, or, after a new
    /// session replaced a lost one, what the task's row says.
    pub(super) fn look(&mut self, task: &str, run: u32) -> Result<Standing> {
        use postgres::fallible_iterator::FallibleIterator as _;
        // Polls the connection without waiting: a takeover or a cancel
        // arrives as a notification on the task's channel.
        let mut heard = false;
        {
            let mut notifications = self.client.client.notifications();
            let mut pending = notifications.iter();
            while pending.next()?.is_some() {
                heard = true;
            }
        }
        if !heard && !self.missed {
            return Ok(Standing::Held);
        }
        let row = self.client.query_opt(sql::STANDING.postgres(), &[&task])?;
        self.missed = false;
        Ok(match row {
            Some(row) => crate::journal::standing_of(
                row.get::<_, Option<i32>>(0).map(|run| run as u32),
                row.get(1),
                run,
            ),
            None => Standing::Lost,
        })
    }

    /// The steps and the run's counters, in one transaction. Made again
    /// after a lost connection, a row the lost commit may have written
    /// is written over rather than inserted twice.
    pub(super) fn write_steps(
        &mut self,
        task: &str,
        steps: &[StepWrite<'_>],
        run: u32,
        stats: Option<&RunStats>,
        attempt: Attempt,
    ) -> Result<()> {
        let mut tx = self.client.transaction();
        let in_doubt = attempt != Attempt::First;
        writes::put_steps(&mut tx, task, steps, run, stats, in_doubt)?;
        tx.commit()?;
        Ok(())
    }

    /// The end of a run, and the release of its lease if it still holds it.
    pub(super) fn record_end(
        &mut self,
        task: &str,
        run: u32,
        end: &RunEnd,
        stats: &RunStats,
    ) -> Result<()> {
        let mut tx = self.client.transaction();
        writes::end_run(&mut tx, task, run, end, stats)?;
        // A worker may take over what this run left (interrupted, parked),
        // or retry it (failed). A completed run leaves nothing to take:
        // its news only tells of room in its queue.
        let news = if end.status == crate::journal::TaskStatus::Completed {
            crate::journal::news::COMPLETED
        } else {
            crate::journal::news::RUN
        };
        tx.notify_channel("durun_work", news)?;
        // A worker's connection serves other tasks next.
        tx.commit_after(&format!("UNLISTEN {}", channel(task)))?;
        self.channel = None;
        Ok(())
    }
}
