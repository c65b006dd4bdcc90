//! MCP steps asked for by their key (SPEC 22): an MCP task's id is its
//! step's key, and a `durun mcp` that did not start the call (a client
//! came back through a new one) asks the run where the step stands; and
//! a connection that closes leaves its MCP steps in doubt.
//!
//! # Invariant
//!
//! A `find` never starts a step twice: a step someone still runs is
//! answered `running`, a finished one from the journal, and only a step
//! in doubt (its `durun mcp` died inside it, or an earlier run did) is
//! opened again, as its next attempt with the same key, for the asker.

use serde_json::Value;

use super::Supervisor;
use crate::journal::{StepKind, StepRecord, StepStatus};
use crate::protocol::{ErrorCode, Found, Response};
use crate::supervisor::inbox::{AGENT, Conn};
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::transitions::Transition;

impl Supervisor<'_> {
    /// Answers a `find`: where the task's MCP step with key `key` stands.
    pub(super) fn on_find(&mut self, conn: Conn, id: Value, key: &str) {
        if let Err(err) = self.load_contents() {
            return self.journal_failed(conn, &id, err);
        }
        if let Some(open) = self.steps.open_with_key(key) {
            let found = found("running", &open.record);
            let step = open.record.step;
            let mut response = Response::ok(id).step(step);
            response.found = Some(found);
            return self.respond(conn, &response);
        }
        if let Some(record) = self.steps.contents.take_pending_key(key) {
            return self.reopen(conn, id, record);
        }
        let task = self.spec.task_id;
        let record = match self.journal().mcp_step_by_key(task, key) {
            Ok(Some(record)) => record,
            Ok(None) => {
                let message = format!("no MCP call of task {task} has the key {key}");
                return self.respond(conn, &Response::error(id, ErrorCode::BadRequest, message));
            }
            Err(err) => return self.journal_failed(conn, &id, err),
        };
        let mut response = match record.status {
            StepStatus::Committed | StepStatus::Failed => {
                let found = found("finished", &record);
                let mut response = super::requests::replay_response(id, record);
                response.found = Some(found);
                response
            }
            // Written as in flight, and not open here: its end is on its
            // way to the journal (a write not yet durable), so someone
            // runs it still.
            _ => {
                let mut response = Response::ok(id).step(record.step);
                response.found = Some(found("running", &record));
                response
            }
        };
        response.idempotency_key = Some(key.to_owned());
        self.respond(conn, &response);
    }

    /// Opens the step in doubt `record` again for `conn`, once its next
    /// attempt is written.
    fn reopen(&mut self, conn: Conn, id: Value, record: StepRecord) {
        if self.over_budget(conn, &id, record.step) {
            self.steps.contents.keep_pending(record);
            return;
        }
        let record = self.next_attempt(record);
        self.transition(Transition::Opened {
            step: record.step,
            name: &record.name,
            attempt: record.attempts,
        });
        self.outbox.batch.push(Deferred {
            conn,
            record,
            fresh: false,
            then: Then::Reopened { id },
        });
    }

    /// A reopened step's attempt is durable: the asker runs it.
    pub(super) fn reopened(&mut self, conn: Conn, id: Value, record: StepRecord) {
        let mut response = Response::ok(id.clone()).step(record.step);
        response.found = Some(found("reopened", &record));
        self.opened_as(conn, id, record, false, true, response);
    }

    /// Connection `conn` closed: the MCP calls it had open are in doubt
    /// now, kept for whoever asks for them next (by key or by an equal
    /// call), never opened anew with another key.
    pub(super) fn mcp_gone(&mut self, conn: Conn) {
        if conn == AGENT {
            return;
        }
        for open in self.steps.take_mcp_of(conn) {
            if open.fresh {
                // Never written: nothing can have been sent for it.
                continue;
            }
            debug_assert_eq!(open.record.kind, StepKind::Mcp);
            self.steps.contents.keep_pending(open.record);
        }
    }
}

fn found(state: &'static str, record: &StepRecord) -> Found {
    Found {
        state,
        name: record.name.clone(),
        args: record.args.clone(),
    }
}
