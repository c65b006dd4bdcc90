//! The write-ahead journal: tasks, runs and steps (SPEC 4).
//!
//! The runner talks to storage only through [`Journal`], so a backend is
//! plain records in and out: `SQLite` ([`sqlite::SqliteJournal`]), the
//! embedded default, and PostgreSQL ([`postgres::PostgresJournal`]), the
//! shared one. Rows become records in [`rows`], the same for both.

pub(crate) mod budgets;
pub(crate) mod chats;
mod dialect;
mod explain;
mod fence;
pub(crate) mod limits;
mod location;
pub(crate) mod postgres;
mod queue;
pub(crate) mod reads;
mod records;
mod rows;
mod schema;
mod sql;
pub(crate) mod sqlite;
mod store;
#[cfg(test)]
mod story;
mod transfer;
pub(crate) mod tx;
pub(crate) mod writes;

pub(crate) use crate::clock::{now, now_ms};
pub(crate) use explain::{connection_lost, explain};
pub(crate) use fence::{Fenced, Standing, fence, locked, standing_of};
pub(crate) use location::Location;
pub(crate) use queue::{Claim, Heard, Look, Queue, news};
pub(crate) use records::{
    Candidate, Cost, EventRow, Launch, NewTask, Opened, Resolution, ResolutionAction,
    ResolutionKind, Retryable, RunEnd, RunRecord, RunStart, RunStats, SignalRecord, StepError,
    StepKind, StepRecord, StepStatus, TaskRecord, TaskRows, TaskStatus, WorkerRecord,
    apply_resolution,
};
pub(crate) use store::{Access, Journal, Signals, StepWrite, Transfer};
pub(crate) use transfer::{TABLES, check_numbering, check_row, task_id};

use crate::json_text;

/// How the journal tells a person what happens while a command works on
/// (a lost connection, its return): the binary sets it to its stderr
/// lines; unset, the journal says nothing (as in unit tests).
static NOTICES: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Sends the journal's notices to `say`.
pub(crate) fn notices_to(say: fn(&str)) {
    let _ = NOTICES.set(say);
}

/// Says `message` where [`notices_to`] sends it.
fn notice(message: &str) {
    if let Some(say) = NOTICES.get() {
        say(message);
    }
}

/// A `wait` step answered by `signal`: committed, the signal its output.
pub(crate) fn take_into(step: &mut StepRecord, signal: &SignalRecord) {
    step.status = StepStatus::Committed;
    step.output = Some(json_text::JsonText::from_value(&signal.output()));
    step.error = None;
    step.finished_at = Some(now());
}
