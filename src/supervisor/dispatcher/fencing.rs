//! The run's hold on its task: heartbeats, a look for a cancel or a
//! takeover before a step starts, and the fence when the lease is lost.
//!
//! # Invariant
//!
//! No step starts and no answer goes out unless the run renewed its lease
//! less than half the stale time ago (on the boot clock, which counts a
//! suspended machine's time) and no takeover or cancel was seen. A run
//! that finds its lease lost kills its agent and tools at once and writes
//! nothing more: the new holder's rows are never touched.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::Supervisor;
use crate::error::{Failure, Kind};
use crate::journal::Standing;
use crate::os;
use crate::report::Event as Report;
use crate::supervisor::book::Closed;
use crate::supervisor::ending::Stop;
use crate::supervisor::inbox::AGENT;
use crate::supervisor::outbox::{Deferred, Then};
use rustix::process::Signal;

/// How long a `read` step runs before its row is written as in flight, so
/// that `inspect` shows it if the run dies (a quick step costs no write
/// before its commit).
const MARK_AFTER: Duration = Duration::from_secs(1);
/// How often the loop looks for a cancel or a takeover when no step asks.
const WATCH_EVERY: Duration = Duration::from_millis(250);

impl Supervisor<'_> {
    /// False, and the run fenced, when the lease has gone unrenewed for
    /// half the stale time: another host may be about to take it over.
    pub(super) fn check_renewal(&mut self) -> bool {
        if self.holding.fenced {
            return false;
        }
        let unrenewed = os::boot_clock().saturating_sub(self.holding.renewed_at);
        if unrenewed < self.spec.lease.stale / 2 {
            return true;
        }
        self.fence(format!(
            "the run could not renew the lease of task {} for {} (half the {} after which another runner may take it over); it stopped so that no two runners run its steps",
            self.spec.task_id,
            humantime::format_duration(Duration::from_millis(unrenewed.as_millis() as u64)),
            humantime::format_duration(self.spec.lease.stale),
        ));
        false
    }

    /// Whether a new step may start now: the lease is fresh, and neither a
    /// takeover nor a cancel came (a cheap look, see
    /// [`crate::journal::Journal::watch`]).
    pub(super) fn may_start(&mut self) -> bool {
        if !self.check_renewal() || self.ending.stop.is_some() {
            return false;
        }
        self.holding.last_watch = Instant::now();
        let Some(journal) = self.journal.as_deref_mut() else {
            // The committer looks right after the batch in flight.
            return true;
        };
        match journal.watch(self.spec.task_id, self.spec.run) {
            Ok(standing) => self.on_standing(standing),
            // The step's own journal writes will tell.
            Err(_) => true,
        }
    }

    /// Acts on where the run stands; true while it may go on.
    pub(super) fn on_standing(&mut self, standing: Standing) -> bool {
        match standing {
            Standing::Held => true,
            Standing::Cancelled => {
                self.stop(Stop::Cancel);
                false
            }
            Standing::Lost => {
                self.fence(format!(
                    "task {} was taken over by another runner while this run was paused or cut off; this run stopped without touching it",
                    self.spec.task_id
                ));
                false
            }
        }
    }

    /// The run lost its lease: the agent and its tools are killed at once,
    /// no answer reaches them, and nothing more is written (exit 75).
    fn fence(&mut self, message: String) {
        if self.holding.fenced {
            return;
        }
        self.holding.fenced = true;
        self.steps.contents.close(Closed::Fenced);
        if self.ending.exited.is_none() {
            os::signal_process(self.child_pid, Signal::KILL);
        }
        for (_, call) in self.steps.calls() {
            call.cancel.cancel();
        }
        // An HTTP call cannot be stopped mid-request; its answer is dropped.
        self.steps.forget_in_flight();
        self.outbox.batch.clear();
        self.io.stdin = None;
        self.io.out.clear();
        self.io.sent = 0;
        self.outbox.writers.clear();
        self.ending.kill_at = None;
        let failure = Failure::new(Kind::Locked, message).hint(format!(
            "`durun inspect {}` shows who runs it now; this run's steps up to here are in the journal",
            self.spec.task_id
        ));
        self.ending.stop = Some(Stop::Failure(failure.into()));
    }

    /// Timers: the kill after a stop's grace period, the marks of long
    /// steps, the look for a cancel or a takeover, the heartbeat.
    pub(super) fn tick(&mut self) {
        if let Some(kill_at) = self.ending.kill_at
            && Instant::now() >= kill_at
            && self.ending.exited.is_none()
        {
            os::signal_process(self.child_pid, Signal::KILL);
            self.ending.kill_at = None;
        }
        if self.holding.fenced {
            return;
        }
        self.mark_long_steps();
        if self.ending.stop.is_none() && self.holding.last_watch.elapsed() >= WATCH_EVERY {
            self.holding.last_watch = Instant::now();
            if let Some(journal) = self.journal.as_deref_mut()
                && let Ok(standing) = journal.watch(self.spec.task_id, self.spec.run)
            {
                self.on_standing(standing);
            }
        }
        if self.holding.last_heartbeat.elapsed() >= self.spec.lease.heartbeat {
            self.heartbeat();
        }
        self.tick_waits();
        if self.ending.stop.is_none() {
            self.look_for_raise();
            self.look_in_tree();
        }
    }

    fn heartbeat(&mut self) {
        self.holding.last_heartbeat = Instant::now();
        let sent_at = os::boot_clock();
        let (task, run) = (self.spec.task_id, self.spec.run);
        match self.journal().heartbeat(task, run) {
            Ok(standing) => {
                if standing != Standing::Lost {
                    self.holding.renewed_at = sent_at;
                }
                self.on_standing(standing);
            }
            Err(err) if crate::error::failure_of(&err).is_some() => {
                // The journal file is gone or broken: nothing more can be
                // recorded.
                self.journal_failed(AGENT, &Value::Null, err);
            }
            Err(err) => {
                let message = format!("failed to renew the task's lease: {err:#}");
                self.reporter.report(&Report::Warning(&message));
            }
        }
    }

    /// Writes the rows of `read` steps that have run for [`MARK_AFTER`]
    /// without one, as `pending`: if the run dies now, `inspect` shows the
    /// step it died in, and a resume runs it again as its next attempt.
    fn mark_long_steps(&mut self) {
        if self.ending.stop.is_some() {
            return;
        }
        let marks = self.steps.unmarked_after(MARK_AFTER);
        if marks.is_empty() {
            return;
        }
        self.outbox
            .batch
            .extend(marks.into_iter().map(|record| Deferred {
                conn: AGENT,
                record,
                fresh: true,
                then: Then::Marked,
            }));
        self.flush();
    }
}
