//! Group commit: the steps that are ready together are written in one
//! durable transaction, and only then does anything they wait for happen.
//!
//! # Invariant
//!
//! A write's continuation ([`Then`]: answer a finished step, answer a
//! `mutate` begin, start a `mutate` tool) runs only after the commit that
//! holds the write returned: a step's result is durable before its answer,
//! a `mutate` step's intent before its effect. [`Supervisor::commit_batch`]
//! writes and hands the continuations back; the loop runs them
//! ([`Supervisor::flush`]).

use std::time::Instant;

use serde_json::Value;

use super::inbox::Conn;
use super::state::{Deferred, Supervisor, Then};
use crate::journal::{Fenced, Standing, StepKind, StepRecord, StepStatus, StepWrite};
use crate::protocol::{ErrorCode, Response};
use crate::report::Event as Report;

impl Supervisor<'_> {
    /// Commits the batch and runs what each write waited for.
    pub(super) fn flush(&mut self) {
        for deferred in self.commit_batch() {
            self.carry_on(deferred);
        }
    }

    /// Writes the batch's steps in one durable commit and hands back the
    /// writes whose continuations may run now: all of them, or none when
    /// the commit failed (the requests they answer got their error).
    pub(super) fn commit_batch(&mut self) -> Vec<Deferred> {
        if self.batch.is_empty() {
            return Vec::new();
        }
        let mut batch = std::mem::take(&mut self.batch);
        if self.fenced {
            return Vec::new();
        }
        let mut stats = self.stats;
        let mut finished = false;
        for deferred in &mut batch {
            if let Then::Finished { .. } = deferred.then {
                finished = true;
                stats.executed_steps += 1;
                stats.tokens_spent += deferred.record.tokens;
                if deferred.record.kind != StepKind::Begin
                    && deferred.record.status == StepStatus::Failed
                {
                    // Answered right after this commit: a step the agent
                    // opens from here on, it opens knowing of the failure.
                    deferred.record.seen_from = Some(self.next_step);
                }
            }
        }
        let writes: Vec<StepWrite<'_>> = batch
            .iter()
            .map(|deferred| StepWrite {
                record: &deferred.record,
                fresh: deferred.fresh,
            })
            .collect();
        let written = self.journal.put_steps(
            self.spec.task_id,
            &writes,
            self.spec.run,
            // An intent changes no counter: one row less to write.
            finished.then_some(&stats),
        );
        drop(writes);
        match written {
            Ok(()) => {
                self.stats = stats;
                batch
            }
            Err(err) => {
                self.batch_failed(batch, err);
                Vec::new()
            }
        }
    }

    /// Answers every request of a batch that could not be written, and
    /// stops the run as the failure says.
    fn batch_failed(&mut self, batch: Vec<Deferred>, err: anyhow::Error) {
        let (code, message) = match err.downcast_ref::<Fenced>() {
            Some(Fenced(Standing::Cancelled)) => (
                ErrorCode::Cancelled,
                "the task was cancelled; the run stops".to_owned(),
            ),
            _ => (
                ErrorCode::Journal,
                format!("durun could not write the journal ({err:#}); the task stops"),
            ),
        };
        let mut batch = batch.into_iter();
        let first = batch.next().expect("the batch is not empty");
        for deferred in batch {
            let id = deferred.then.into_id();
            if !id.is_null() {
                self.respond(deferred.conn, &Response::error(id, code, message.clone()));
            }
        }
        self.write_failed(first.conn, &first.then.into_id(), err);
    }

    /// What a durable write waited for.
    fn carry_on(&mut self, deferred: Deferred) {
        let Deferred {
            conn, record, then, ..
        } = deferred;
        self.last_recorded = self.last_recorded.max(record.step);
        match then {
            Then::Marked => {}
            Then::Finished { id, started } => self.answer_finished(conn, id, &record, started),
            Then::Opened { id, in_doubt } => self.opened(conn, id, record, false, in_doubt),
            Then::Patched { id } => {
                let mut response = Response::ok(id).step(record.step);
                response.patched = Some(true);
                self.respond(conn, &response);
            }
            Then::Call { id, tool, args } => {
                if self.stop.is_some() || !self.check_renewal() {
                    // Its intent is recorded: the step is in doubt and runs
                    // again, with its key, on resume.
                    self.refuse_start(conn, id, record.step);
                } else {
                    self.start_call(conn, id, tool, args, record, false);
                }
            }
        }
    }

    /// Records a finished step with the batch; it is answered after the
    /// batch's commit.
    pub(super) fn finish_step(
        &mut self,
        conn: Conn,
        id: Value,
        mut record: StepRecord,
        fresh: bool,
        started: Instant,
    ) {
        record.finished_at = Some(crate::journal::now());
        self.batch.push(Deferred {
            conn,
            record,
            fresh,
            then: Then::Finished { id, started },
        });
    }

    /// Reports a step whose result is durable and answers it.
    pub(super) fn answer_finished(
        &mut self,
        conn: Conn,
        id: Value,
        record: &StepRecord,
        started: Instant,
    ) {
        self.reporter.report(&Report::StepFinished {
            step: record.step,
            name: &record.name,
            status: record.status,
            elapsed: started.elapsed(),
            tokens: record.tokens,
            error: record.error.as_ref().map(|error| error.message.as_str()),
        });
        let step = record.step;
        let response = match (record.kind, record.status) {
            (StepKind::Begin, _) => Response::ok(id).step(step),
            (StepKind::Call | StepKind::Wait | StepKind::Sleep, StepStatus::Committed) => {
                let mut response = Response::ok(id).step(step);
                response.replayed = Some(false);
                response.output.clone_from(&record.output);
                response.idempotency_key = Some(record.idempotency_key.clone());
                response
            }
            (StepKind::Call | StepKind::Wait | StepKind::Sleep, _) => {
                let error = record.error.as_ref().expect("a failed step has an error");
                let mut response =
                    Response::error(id, error.code, error.message.clone()).step(step);
                response.output.clone_from(&record.output);
                response
            }
        };
        self.respond(conn, &response);
    }
}
