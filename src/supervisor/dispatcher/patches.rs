//! `patched`: a marker step for a change in the agent's code, recorded
//! where the journal holds nothing at its point, so a task started before
//! the change keeps its old path on resume.

use serde_json::Value;

use super::{Supervisor, Wanted};
use crate::journal::{self, StepKind, StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::protocol::{Effect, Response};
use crate::supervisor::inbox::Conn;
use crate::supervisor::outbox::{Deferred, Then};

impl Supervisor<'_> {
    /// `patched`: a step recording the patch where the journal holds
    /// nothing at this point or holds this patch (true); where it holds
    /// another step, the task's older path, nothing is consumed (false).
    pub(super) fn on_patched(&mut self, conn: Conn, id: Value, name: &str) {
        let recorded = match self.next_protocol_step() {
            Ok(step) => self.steps.recorded.take(step),
            Err(err) => return self.journal_failed(conn, &id, err),
        };
        let args = serde_json::json!({ "patch": name });
        let is_this_patch =
            |record: &StepRecord| record.name == PATCH_STEP && record.args.value() == args;
        match recorded {
            Some(record) if !is_this_patch(&record) => {
                // An older path: the request takes no step number.
                self.steps.recorded.put_back(record);
                let mut response = Response::ok(id);
                response.patched = Some(false);
                self.respond(conn, &response);
            }
            Some(record) => {
                self.steps.take_number(record.step);
                self.stats.replayed_steps += 1;
                let mut response = Response::ok(id).step(record.step);
                response.patched = Some(true);
                self.respond(conn, &response);
            }
            None => {
                let canonical = crate::step_key::canonical_json(&args).expect("JSON");
                let wanted = Wanted {
                    name: PATCH_STEP,
                    kind: StepKind::Begin,
                    effect: Effect::Read,
                    args: &args,
                    canonical: &canonical,
                    ask_first: false,
                    request_hash: None,
                };
                let Some((mut record, fresh, _)) = self.open_step(conn, &id, wanted) else {
                    return;
                };
                record.status = StepStatus::Committed;
                record.output = Some(JsonText::from_value(&Value::Bool(true)));
                record.finished_at = Some(journal::now());
                self.outbox.batch.push(Deferred {
                    conn,
                    record,
                    fresh,
                    then: Then::Patched { id },
                });
            }
        }
    }
}

/// The name of the step that records a patch (`patched`).
pub(super) const PATCH_STEP: &str = "durun.patched";
