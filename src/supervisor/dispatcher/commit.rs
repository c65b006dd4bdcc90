//! Group commit: the steps that are ready together are written in one
//! durable transaction, and only then does anything they wait for happen.
//!
//! # Invariant
//!
//! A write's continuation ([`Then`]: answer a finished step, answer a
//! `mutate` begin, start a `mutate` tool) runs only after the commit that
//! holds the write returned: a step's result is durable before its answer,
//! a `mutate` step's intent before its effect. Batches are committed one
//! at a time, in the order they were made, so a commit is durable no later
//! than the intent of any step opened after it.
//!
//! # Off the loop
//!
//! A batch no one waits for (the commits of an agent that does not wait
//! for their answers, as the SDKs do) is written on the committer thread:
//! the loop lends it the journal with the batch ([`crate::supervisor::committer::Job`]) and goes on
//! reading requests and answering those that need no write (a `read`
//! step's `begin`, a replayed step) while the disk works; the steps that
//! arrive meanwhile make the next batch. The journal comes back with the
//! batch ([`Landed`]) and the loop runs the continuations. A batch someone
//! waits for (an intent, a tool's result, a commit of an agent that waits)
//! is written on the loop, which is quicker than two hand-offs. Anything
//! else the loop asks of the journal waits for it to be home
//! ([`Supervisor::journal`]), so the journal sees one writer, in order.

use std::time::Instant;

use serde_json::Value;

use super::Supervisor;
use crate::journal::{Fenced, Journal, Standing, StepKind, StepRecord, StepStatus};
use crate::protocol::{ErrorCode, Response};
use crate::supervisor::committer;
use crate::supervisor::committer::Landed;
use crate::supervisor::inbox::Conn;
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::transitions::Transition;

impl Supervisor<'_> {
    /// Takes back a batch the committer wrote, if one is back, and runs
    /// what its writes waited for; then writes the next batch, if one is
    /// ready and none is in flight.
    pub(super) fn flush(&mut self) {
        self.land(false);
        self.lend();
    }

    /// The journal, home: waits for a batch in flight to land first, so
    /// every other use of the journal comes after the commits before it.
    pub(super) fn journal(&mut self) -> &mut dyn Journal {
        self.settle();
        self.journal
            .as_deref_mut()
            .expect("the journal is home once no batch is in flight")
    }

    /// Waits for the batch in flight, if any, to land.
    pub(super) fn settle(&mut self) {
        self.land(true);
    }

    /// Whether a batch is being committed now.
    pub(super) fn in_flight(&self) -> bool {
        self.journal.is_none()
    }
}

impl<'a> Supervisor<'a> {
    /// Writes the batch, if it has steps and the journal is home: on the
    /// loop when someone waits for it, else on the committer thread.
    fn lend(&mut self) {
        if self.outbox.batch.is_empty() || self.in_flight() {
            return;
        }
        let mut batch = std::mem::take(&mut self.outbox.batch);
        if self.holding.fenced {
            return;
        }
        let mut stats = self.stats;
        let mut finished = false;
        for deferred in &mut batch {
            if deferred.then.finishes() {
                finished = true;
                stats.executed_steps += 1;
                stats.tokens_spent += deferred.record.tokens;
                match deferred.record.cost_nanos {
                    Some(nanos) => stats.cost.spent_nanos += nanos,
                    None if deferred.record.tokens > 0 => stats.cost.unpriced_steps += 1,
                    None => {}
                }
                if !matches!(
                    deferred.record.kind,
                    StepKind::Begin | StepKind::Proxy | StepKind::Mcp
                ) && deferred.record.status == StepStatus::Failed
                {
                    // Answered right after this commit: a step the agent
                    // opens from here on, it opens knowing of the failure.
                    deferred.record.seen_from = Some(self.steps.next_step());
                }
            }
        }
        // Steps replayed since the last write go in with this batch (the
        // copy keeps how many were noted before, for their event).
        if stats.replayed_steps > stats.replays_noted {
            finished = true;
            self.stats.replays_noted = stats.replayed_steps;
        }
        // An answer to the agent's own `commit` waits on this batch.
        let agent_commit = batch.iter().any(Deferred::is_agent_commit);
        // No one waits for what the batch holds: a pipelining agent's
        // commits, written while the loop goes on.
        let off_the_loop = self.outbox.pipelined && batch.iter().all(Deferred::is_agent_commit);
        let journal = self.journal.take().expect("the journal is home");
        let job = committer::Job {
            journal,
            batch,
            stats,
            finished,
        };
        if !off_the_loop {
            // Someone waits for this commit (an intent, a tool's result, a
            // commit's answer): a hand-off to the committer and back would
            // only add two wake-ups to the wait.
            let landed = self.committer.write(job);
            self.take_landed(landed);
            if agent_commit
                && !self.outbox.pipelined
                && !self.holding.fenced
                && self.io.agent_has_more()
            {
                self.outbox.pipelined = true;
            }
            return;
        }
        if let Some(landed) = self.committer.lend(job) {
            self.take_landed(landed);
        }
    }

    /// Takes back the batch in flight, if any; with `wait`, waits for it.
    fn land(&mut self, wait: bool) {
        if !self.in_flight() {
            return;
        }
        if let Some(landed) = self.committer.landed(wait) {
            self.take_landed(landed);
        }
    }

    fn take_landed(&mut self, landed: Landed<'a>) {
        let Landed {
            journal,
            batch,
            stats,
            written,
            standing,
        } = landed;
        self.journal = Some(journal);
        if self.holding.fenced {
            return;
        }
        match written {
            Ok(()) => {
                self.stats = stats;
                for deferred in batch {
                    self.carry_on(deferred);
                }
                if let Some(standing) = standing {
                    self.on_standing(standing);
                }
            }
            Err(err) => self.batch_failed(batch, err),
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
        self.steps.recorded_up_to(record.step);
        match then {
            Then::Marked => {}
            Then::Finished { id, started } => self.answer_finished(conn, id, &record, started),
            Then::Opened { id, in_doubt } => self.opened(conn, id, record, false, in_doubt),
            Then::Reopened { id } => self.reopened(conn, id, record),
            Then::Patched { id } => {
                let mut response = Response::ok(id).step(record.step);
                response.patched = Some(true);
                self.respond(conn, &response);
            }
            Then::Proxied(then) => self.carry_on_proxied(record, then),
            Then::Seeded { id } => {
                self.respond(conn, &super::requests::replay_response(id, record));
            }
            Then::Spawn { id, started } => self.spawned(conn, id, record, started),
            Then::Call { id, tool, args } => {
                if self.ending.stop.is_some() || !self.check_renewal() {
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
        self.transition(Transition::Returned);
        record.finished_at = Some(crate::journal::now());
        self.budget.add(record.tokens, record.cost_nanos);
        let step = record.step;
        self.outbox.batch.push(Deferred {
            conn,
            record,
            fresh,
            then: Then::Finished { id, started },
        });
        // The model calls made inside it count now: their worst cases go.
        self.release_parts(step);
    }

    /// Reports a step whose result is durable and answers it.
    pub(super) fn answer_finished(
        &mut self,
        conn: Conn,
        id: Value,
        record: &StepRecord,
        started: Instant,
    ) {
        self.transition(Transition::Finished {
            record,
            elapsed: started.elapsed(),
        });
        let step = record.step;
        let response = match (record.kind, record.status) {
            (StepKind::Begin | StepKind::Proxy | StepKind::Mcp, _) => Response::ok(id).step(step),
            (
                StepKind::Call
                | StepKind::Wait
                | StepKind::Sleep
                | StepKind::Spawn
                | StepKind::Join,
                StepStatus::Committed,
            ) => {
                let mut response = Response::ok(id).step(step);
                response.replayed = Some(false);
                response.output.clone_from(&record.output);
                response.idempotency_key = Some(record.idempotency_key.clone());
                response
            }
            (
                StepKind::Call
                | StepKind::Wait
                | StepKind::Sleep
                | StepKind::Spawn
                | StepKind::Join,
                _,
            ) => {
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
