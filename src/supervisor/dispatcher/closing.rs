//! A step the agent opened is closed: `commit` finishes it, `fail` makes
//! it a failed attempt, and a `commit` with `"reconciled": true` finishes
//! one that was in doubt with what its destination said (SPEC 22). Also
//! where every probe's "it took effect" is recorded as such.
//!
//! # Invariant
//!
//! A step closes once, by the connection that may: a `commit` or `fail`
//! for a step not open is refused and changes nothing.

use serde_json::Value;

use super::Supervisor;
use crate::journal::{ResolutionKind, StepError, StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::protocol::{Closes, ErrorCode, Response};
use crate::report::Event as Report;
use crate::supervisor::inbox::Conn;
use crate::supervisor::steps::NotOpen;

impl Supervisor<'_> {
    pub(super) fn on_close(
        &mut self,
        conn: Conn,
        id: Value,
        closes: Closes,
        result: Result<(Value, Option<Value>), (String, Option<Value>)>,
    ) {
        let step = match closes {
            Closes::Step(step) => step,
            Closes::Begin(begin) => match self.steps.begun_by(conn, &begin) {
                Some(step) => step,
                None => {
                    let message = format!(
                        "no open step was opened by the `begin` with id {begin}: it was refused (its answer says why), or its step is closed already"
                    );
                    return self
                        .respond(conn, &Response::error(id, ErrorCode::BadRequest, message));
                }
            },
        };
        let open = match self.steps.close(step) {
            Ok(open) => open,
            Err(not_open) => {
                let message = match not_open {
                    NotOpen::Call => {
                        format!("step {step} is a `call`: durun closes it when the tool ends")
                    }
                    NotOpen::Closed => format!(
                        "step {step} is not open: commit or fail a step once, after its `begin`"
                    ),
                };
                return self.respond(
                    conn,
                    &Response::error(id, ErrorCode::BadRequest, message).step(step),
                );
            }
        };
        let mut record = open.record;
        match result {
            Ok((output, usage)) => {
                // The agent's own count, else that of the model calls the
                // proxy saw while the step was open: counted once.
                if usage.is_none() && !open.proxied.is_empty() {
                    record.cost_nanos = open.proxied_cost;
                }
                let usage = usage.or_else(|| crate::usage::sum(&open.proxied));
                record.status = StepStatus::Committed;
                record.tokens = usage.as_ref().map_or(0, crate::usage::tokens_of);
                record.usage = usage.as_ref().map(JsonText::from_value);
                record.output = Some(JsonText::from_value(&output));
            }
            Err((message, output)) => {
                record.status = StepStatus::Failed;
                record.error = Some(StepError {
                    code: ErrorCode::ToolFailed,
                    message,
                });
                record.output = output.as_ref().map(JsonText::from_value);
                // The agent reported the failure: it knows of it from here.
                record.seen_from = Some(self.steps.next_step());
                self.steps.failed(step, record.clone());
            }
        }
        self.finish_step(conn, id, record, open.fresh, open.started);
    }

    /// The step a `commit` with `"reconciled": true` closes was in doubt,
    /// and its destination said it took effect (`durun mcp`'s probe).
    pub(super) fn reconciling(&mut self, conn: Conn, closes: &Closes) {
        let step = match closes {
            Closes::Step(step) => Some(*step),
            Closes::Begin(begin) => self.steps.begun_by(conn, begin),
        };
        if let Some(open) = step.and_then(|step| self.steps.open_mut(step)) {
            let said = reconciled(&mut open.record, "its probe", "run");
            self.reporter.report(&Report::Warning(&said));
        }
    }
}

/// Marks `record` as settled by `probe`, which found it took effect while
/// it was in doubt: `reconciled`, and no attempt ran beyond the one the
/// probe settled. The line that says so (it was not `again` again).
pub(super) fn reconciled(record: &mut StepRecord, probe: &str, again: &str) -> String {
    record.attempts = record.attempts.saturating_sub(1).max(1);
    record.resolution = Some(ResolutionKind::Reconciled);
    format!(
        "step {} ({}) was in doubt; {probe} says it took effect: reconciled, not {again} again",
        record.step, record.name
    )
}
