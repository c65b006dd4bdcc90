//! The run's side of `durun test`'s seeds and tool faults (SPEC 14): a
//! new model step answered with the reference's output, a tool call
//! failed in place of its tool. A run without them checks an empty map.

use serde_json::Value;

use super::Supervisor;
use crate::journal::{StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::supervisor::inbox::Conn;
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::transitions::Transition;

impl Supervisor<'_> {
    /// The reference's answer to a new `begin` like `record`, if `durun
    /// test` gave one. Nothing is looked up (or allocated) in a run
    /// without seeds.
    pub(super) fn take_seed(&mut self, record: &StepRecord) -> Option<(JsonText, Value)> {
        self.trial.seed(&record.name, &record.args_hash)
    }

    /// Records a seeded step as finished with the reference's output and
    /// usage, and answers the `begin` as a replay once it is durable.
    pub(super) fn answer_seeded(
        &mut self,
        conn: Conn,
        id: Value,
        mut record: StepRecord,
        (output, usage): (JsonText, Value),
    ) {
        self.transition(Transition::Started);
        record.status = StepStatus::Committed;
        record.output = Some(output);
        record.tokens = crate::usage::tokens_of(&usage);
        record.usage = Some(JsonText::from_value(&usage));
        record.finished_at = Some(crate::journal::now());
        self.transition(Transition::Returned);
        self.budget.add(record.tokens, record.cost_nanos);
        self.outbox.batch.push(Deferred {
            conn,
            record,
            fresh: true,
            then: Then::Seeded { id },
        });
    }

    /// The fault `durun test` makes of a `call` like `record`, the first
    /// time only. Nothing is looked up in a run without faults.
    pub(super) fn take_fault(&mut self, record: &StepRecord) -> Option<String> {
        self.trial.fault(&record.name, &record.args_hash)
    }
}
