//! Replays an SDK answers itself: `ahead` hands the agent the recorded
//! steps a `begin` would replay, and `replayed` counts the ones it used.
//! A replayed step then costs the agent no round trip to durun.
//!
//! # Invariant
//!
//! A step is offered only if a `begin` of its recorded name and args would
//! be answered with its output ([`offered`]), and the steps offered are
//! consecutive in the protocol's numbering (steps replayed by content are
//! passed over, as [`Supervisor::next_protocol_step`] does), so the agent's
//! n-th `begin` meets the n-th offered step exactly as it would meet it
//! here. Only `replayed` moves the numbering, and only over steps it
//! checks again, the last one by its key.

use std::sync::atomic::Ordering;

use serde_json::Value;

use super::Supervisor;
use super::patches::PATCH_STEP;
use crate::journal::{StepKind, StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::protocol::{AheadStep, ErrorCode, Response};
use crate::supervisor::inbox::{AGENT, Conn};

/// Steps offered in one answer.
const MAX_STEPS: usize = 256;

/// Bytes of output offered in one answer (the step that passes it is the
/// last): a long task's answers stay small lines.
const MAX_BYTES: usize = 1 << 20;

/// Answer bytes a connection may leave unread before `ahead` offers it
/// nothing: asking again costs the agent nothing, so unread answers must
/// not pile up a copy of the journal each.
const UNREAD_BOUND: usize = 4 << 20;

impl Supervisor<'_> {
    /// Answers `ahead`: the recorded steps from the agent's next one on
    /// that a `begin` would replay, up to the first that it would not.
    pub(super) fn on_ahead(&mut self, conn: Conn, id: Value) {
        let from = match self.next_protocol_step() {
            Ok(step) => step,
            Err(err) => return self.journal_failed(conn, &id, err),
        };
        let budget = MAX_BYTES.min(UNREAD_BOUND.saturating_sub(self.unread_answers(conn)));
        let mut steps = Vec::new();
        let mut bytes = 0;
        for (expected, record) in (from..).zip(self.steps.recorded.ahead(from)) {
            if record.step != expected || steps.len() == MAX_STEPS || bytes >= budget {
                break;
            }
            if record.kind.by_content() {
                continue;
            }
            if !offered(record) {
                break;
            }
            let output = record.output.clone().unwrap_or_else(JsonText::null);
            bytes += output.as_str().len();
            steps.push(AheadStep {
                step: record.step,
                name: record.name.clone(),
                idempotency_key: record.idempotency_key.clone(),
                output,
            });
        }
        if let Some(offered) = steps.last() {
            self.steps.recorded.offered_through(offered.step);
        }
        let mut response = Response::ok(id);
        response.steps = Some(steps);
        self.respond(conn, &response);
    }

    /// Answers `replayed`: the agent's steps up to `through`, whose key is
    /// `key`, were answered from an `ahead` answer; they count as replayed
    /// here, and the next step is numbered after them.
    pub(super) fn on_replayed(&mut self, conn: Conn, id: Value, through: u64, key: &str) {
        loop {
            let step = match self.next_protocol_step() {
                Ok(step) => step,
                Err(err) => return self.journal_failed(conn, &id, err),
            };
            let refused = if step > through {
                Some(format!("durun's next step is {step}"))
            } else {
                match self.steps.recorded.take(step) {
                    Some(record) if !offered(&record) => {
                        let why = format!("step {step} is not a recorded step a `begin` replays");
                        self.steps.recorded.put_back(record);
                        Some(why)
                    }
                    Some(record) if step == through && record.idempotency_key != key => {
                        self.steps.recorded.put_back(record);
                        Some(format!("step {step} has another idempotency key"))
                    }
                    Some(record) => {
                        self.steps.take_number(step);
                        self.count_replayed(&record);
                        if step == through {
                            self.respond(conn, &Response::ok(id).step(step));
                            return;
                        }
                        None
                    }
                    None => Some(format!("the journal holds no step {step}")),
                }
            };
            if let Some(why) = refused {
                let message = format!("cannot count steps through {through} as replayed: {why}");
                return self.respond(conn, &Response::error(id, ErrorCode::BadRequest, message));
            }
        }
    }

    /// Bytes of answers on `conn` that its client has not read yet.
    fn unread_answers(&self, conn: Conn) -> usize {
        if conn == AGENT {
            return self.io.unread();
        }
        self.outbox
            .writers
            .get(&conn)
            .map_or(0, |writer| writer.unwritten.load(Ordering::SeqCst))
    }
}

/// Whether a `begin` of the record's own name and args is answered with
/// its output: a committed step the agent ran itself (not a patch, which
/// `patched` asks for).
fn offered(record: &StepRecord) -> bool {
    record.kind == StepKind::Begin
        && record.status == StepStatus::Committed
        && record.name != PATCH_STEP
}
