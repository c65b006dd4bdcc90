//! Ending a run early, and how a run ended.
//!
//! # Invariant
//!
//! A stop is final for the run: once `stop` is set no new step starts, the
//! agent gets SIGTERM (or the signal that came) and then SIGKILL after a
//! grace period, and every running tool is killed. The task stays
//! resumable unless a cancel or a failure says otherwise.

use std::os::unix::process::ExitStatusExt as _;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Supervisor;
use crate::error::Failure;
use crate::exit_code;
use crate::journal::{Fenced, Standing, TaskStatus};
use crate::os;
use crate::protocol::{ErrorCode, Response};
use crate::supervisor::book::Closed;
use crate::supervisor::ending::Stop;
use crate::supervisor::inbox;
use rustix::process::Signal;

/// How long the agent gets to exit after durun ends a run itself.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long the agent gets to exit after a forwarded SIGTERM or SIGINT.
const SIGNAL_GRACE: Duration = Duration::from_secs(10);

impl Supervisor<'_> {
    /// A fenced write failed: the lease is lost, the task cancelled, or
    /// the journal broken. `id` is the request it answers (`null`: none).
    pub(super) fn write_failed(&mut self, conn: inbox::Conn, id: &Value, err: anyhow::Error) {
        match err.downcast_ref::<Fenced>() {
            Some(Fenced(standing)) => {
                let standing = *standing;
                if standing == Standing::Cancelled && !id.is_null() {
                    self.respond(
                        conn,
                        &Response::error(
                            id.clone(),
                            ErrorCode::Cancelled,
                            "the task was cancelled; the run stops",
                        ),
                    );
                }
                self.on_standing(standing);
            }
            None => self.journal_failed(conn, id, err),
        }
    }

    /// The journal could not be written: answer `journal`, stop the run.
    pub(super) fn journal_failed(&mut self, conn: inbox::Conn, id: &Value, err: anyhow::Error) {
        // A storage error says what happened (a full disk, a lock) and
        // what to do.
        let err = if crate::journal::connection_lost(&err) {
            err.context(
                Failure::journal(format!(
                    "lost the connection to the journal of task {}",
                    self.spec.task_id
                ))
                .hint(format!(
                    "the task is left interrupted: once the server is back, `durun resume {}` (or a worker) continues it",
                    self.spec.task_id
                )),
            )
        } else {
            crate::journal::explain(err)
        };
        // A write no request waits for (a heartbeat, a mark) answers none.
        if !id.is_null() {
            self.respond(
                conn,
                &Response::error(
                    id.clone(),
                    ErrorCode::Journal,
                    format!("durun could not write the journal ({err:#}); the task stops"),
                ),
            );
        }
        let err = if crate::error::failure_of(&err).is_some() {
            err
        } else {
            err.context(
                Failure::journal(format!(
                    "failed to write the journal of task {}",
                    self.spec.task_id
                ))
                .hint("check the disk and the journal file, then resume the task"),
            )
        };
        self.stop(Stop::Failure(err));
    }

    /// Ends the run early: the agent gets SIGTERM, then SIGKILL after a
    /// grace period; running tools are killed.
    pub(super) fn stop(&mut self, stop: Stop) {
        if self.ending.stop.is_some() {
            return;
        }
        // Before the agent hears of it: a request it sends after is
        // refused, the proxy's replays too.
        self.steps.contents.close(Closed::Stopping);
        if !matches!(stop, Stop::Signal) && self.ending.exited.is_none() {
            // The answers queued so far (the refusal that stops the run,
            // most often) go into the pipe before the signal: an agent
            // that hears SIGTERM from durun can read why.
            self.io.write_out();
            os::signal_process(self.child_pid, Signal::TERM);
            self.ending.kill_at = Some(Instant::now() + STOP_GRACE);
        }
        for (_, call) in self.steps.calls() {
            call.cancel.cancel();
        }
        self.refuse_held();
        // An HTTP call cannot be stopped mid-request: it is answered now and
        // left to finish on its own (its step stays in doubt).
        let http: Vec<u64> = self
            .steps
            .calls()
            .filter(|(_, call)| call.http)
            .map(|(step, _)| step)
            .collect();
        for step in http {
            if let Some(call) = self.steps.call_ended(step) {
                self.refuse_start(call.conn, call.id, step);
            }
        }
        self.ending.stop = Some(stop);
    }

    pub(super) fn on_signal(&mut self, signal: i32) {
        if self.ending.signal.is_some() {
            // A second signal: stop waiting.
            if self.ending.exited.is_none() {
                os::signal_process(self.child_pid, Signal::KILL);
            }
            return;
        }
        self.ending.signal = Some(signal);
        // The proxy replays nothing from here, before the agent hears of
        // the signal (the loop refuses the rest in `stop`).
        self.steps.contents.close(Closed::Stopping);
        // A Ctrl-C at a terminal reaches the agent directly (it shares
        // durun's process group); anything else is passed on.
        let from_terminal = signal == Signal::INT.as_raw() && self.interactive;
        if !from_terminal
            && self.ending.exited.is_none()
            && let Some(signal) = Signal::from_named_raw(signal)
        {
            os::signal_process(self.child_pid, signal);
        }
        if self.ending.exited.is_none() {
            self.ending.kill_at = Some(Instant::now() + SIGNAL_GRACE);
        }
        self.stop(Stop::Signal);
    }

    /// The task's status, durun's exit code, and why durun ended the run
    /// itself, if it did.
    pub(super) fn ending(&mut self) -> (TaskStatus, i32, Option<anyhow::Error>) {
        let (status, exit_code) = match self.ending.exited {
            Some(status) => match (status.code(), status.signal()) {
                (Some(0), _) => (TaskStatus::Completed, 0),
                (Some(code), _) if self.ending.signal.is_some() => (TaskStatus::Interrupted, code),
                (Some(code), _) => (TaskStatus::Failed, code),
                (None, Some(signal)) => (TaskStatus::Interrupted, exit_code::from_signal(signal)),
                (None, None) => (TaskStatus::Failed, exit_code::INTERNAL),
            },
            // The agent never reported its exit (it hung past every grace).
            None => (TaskStatus::Interrupted, exit_code::INTERNAL),
        };
        match self.ending.stop.take() {
            // A fenced run leaves the task to whoever holds it; a run that
            // lost its journal's server leaves it to the next resume.
            Some(Stop::Failure(err))
                if self.holding.fenced || crate::journal::connection_lost(&err) =>
            {
                (
                    TaskStatus::Interrupted,
                    crate::error::exit_code_of(&err),
                    Some(err),
                )
            }
            Some(Stop::Failure(err)) => (
                TaskStatus::Failed,
                crate::error::exit_code_of(&err),
                Some(err),
            ),
            Some(Stop::Cancel) => (TaskStatus::Cancelled, exit_code, None),
            Some(Stop::Parked { status, notice }) => (status, exit_code::PARKED, Some(notice)),
            Some(Stop::OverBudget(err)) => {
                (TaskStatus::OverBudget, exit_code::OVER_BUDGET, Some(err))
            }
            Some(Stop::Signal) | None => (status, exit_code, None),
        }
    }
}
