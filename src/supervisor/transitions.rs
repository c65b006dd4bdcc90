//! A step's changes of state as one feed. The rooms say what happened to
//! a step (`Supervisor::transition`, in `state`); the observers read the feed: the
//! reporter (progress line, spans) and `durun test`'s kill points
//! (`crash::Trial`). Neither has a hook of its own in the rooms,
//! and a new observer (an event stream) reads the same transitions.

use std::time::Duration;

use crate::journal::StepRecord;
use crate::report::Event as Report;

/// What happened to a step.
#[derive(Clone, Copy, Debug)]
pub(super) enum Transition<'a> {
    /// Numbered (or matched by content) and about to run: a new step or
    /// another attempt of one.
    Opened {
        step: u64,
        name: &'a str,
        attempt: u32,
    },
    /// Answered from the journal; it does not run.
    Replayed { step: u64, name: &'a str },
    /// Let start: its intent is durable (for `mutate`) and its work begins
    /// now (the agent's, a tool's, the upstream's, a child task's).
    Started,
    /// Its result reached durun and is not durable yet.
    Returned,
    /// Its result is durable; its answer goes next.
    Finished {
        record: &'a StepRecord,
        elapsed: Duration,
    },
}

impl Transition<'_> {
    /// What the reporter shows of it, if anything.
    pub(super) fn report(&self) -> Option<Report<'_>> {
        match *self {
            Transition::Opened {
                step,
                name,
                attempt,
            } => Some(Report::StepStarted {
                step,
                name,
                attempt,
            }),
            Transition::Replayed { step, name } => Some(Report::StepReplayed { step, name }),
            Transition::Started | Transition::Returned => None,
            Transition::Finished { record, elapsed } => Some(Report::StepFinished {
                step: record.step,
                name: &record.name,
                status: record.status,
                elapsed,
                tokens: record.tokens,
                error: record.error.as_ref().map(|error| error.message.as_str()),
                record,
            }),
        }
    }
}
