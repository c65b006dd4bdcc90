//! `retry`: a step that failed in this run, opened again by the agent as
//! its next attempt, with the same key.

use serde_json::Value;

use super::Supervisor;
use crate::protocol::{Effect, ErrorCode, Response};
use crate::supervisor::inbox::Conn;
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::transitions::Transition;

impl Supervisor<'_> {
    /// Opens a step that failed in this run again, as its next attempt
    /// with the same key (the agent's own retries: each attempt is in the
    /// journal).
    pub(super) fn on_retry(&mut self, conn: Conn, id: Value, step: u64) {
        let Some(record) = self.steps.take_failed(step) else {
            return self.respond(
                conn,
                &Response::error(
                    id,
                    ErrorCode::BadRequest,
                    format!("step {step} is not a step that failed in this run: `retry` follows its `fail`"),
                )
                .step(step),
            );
        };
        if self.over_budget(conn, &id, step) {
            return;
        }
        let record = self.next_attempt(record);
        self.transition(Transition::Opened {
            step,
            name: &record.name,
            attempt: record.attempts,
        });
        if record.effect == Effect::Mutate {
            // The new attempt's intent is durable before the agent runs it.
            self.outbox.batch.push(Deferred {
                conn,
                record,
                fresh: false,
                then: Then::Opened {
                    id,
                    in_doubt: false,
                },
            });
        } else if self.may_start() {
            self.opened(conn, id, record, false, false);
        } else {
            self.refuse_start(conn, id, step);
        }
    }
}
