//! What a request meets in the journal (SPEC 3.2), as pure functions: by
//! position for the agent's protocol steps ([`decide`]), by name and args
//! for the requests replayed by content, proxied and MCP calls
//! ([`decide_by_content`]).
//!
//! # Invariant
//!
//! Nothing new ever runs over a recorded step: a step whose name or args
//! differ from the record is a divergence; a recorded one with the same
//! identity is replayed, or run again with its own key, never with another.
//! No I/O here: the loop does what the [`Decision`] says.

use super::contents::Contents;
use crate::journal::{ResolutionKind, StepRecord, StepStatus};

/// A step as the agent asks for it, as far as the decision needs it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asked<'a> {
    pub(super) name: &'a str,
    pub(super) args_hash: &'a str,
    /// The tool wants an operator to decide before a step in doubt runs
    /// again (`in_doubt = "ask"`).
    pub(super) ask_first: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// The journal has no such step: run it as attempt 1.
    Run,
    /// Answer the recorded output (or failure); nothing runs.
    Replay,
    /// Run it again as the next attempt, with the same key; `in_doubt` when
    /// a run died inside it (it may have taken effect).
    Retry { in_doubt: bool },
    /// The agent asked for another step than the journal holds.
    Diverge,
    /// In doubt, and its tool takes no key: wait for `durun resolve`.
    AskOperator,
    /// A `wait` or `sleep` step still waiting for its signal or time:
    /// wait on, the same row (nothing ran, nothing is in doubt).
    Await,
}

/// Decides step `recorded.step` (or a new one) for `asked`, given the
/// highest step number the journal holds.
pub(super) fn decide(
    recorded: Option<&StepRecord>,
    asked: &Asked<'_>,
    last_recorded: u64,
) -> Decision {
    let Some(recorded) = recorded else {
        return Decision::Run;
    };
    if recorded.name != asked.name || recorded.args_hash != asked.args_hash {
        return Decision::Diverge;
    }
    match recorded.status {
        StepStatus::Committed => Decision::Replay,
        StepStatus::Failed if failure_replays(recorded, last_recorded) => Decision::Replay,
        StepStatus::Failed => Decision::Retry { in_doubt: false },
        StepStatus::Waiting => Decision::Await,
        StepStatus::Pending
            if asked.ask_first && recorded.resolution != Some(ResolutionKind::Retry) =>
        {
            Decision::AskOperator
        }
        // A discarded row is never handed to the decision; treat it as the
        // pending row it was.
        StepStatus::Pending | StepStatus::Discarded => Decision::Retry { in_doubt: true },
    }
}

/// Whether a recorded failure replays as a failure: an operator recorded
/// it, or the agent opened a later step after it was answered with it. A
/// failure the agent never saw, or saw only after it had opened every
/// later step (parallel calls), runs again with the same key.
fn failure_replays(recorded: &StepRecord, last_recorded: u64) -> bool {
    if recorded.resolution == Some(ResolutionKind::Fail) {
        return true;
    }
    match recorded.seen_from {
        Some(seen_from) => last_recorded >= seen_from,
        // Recorded before durun kept `seen_from`: the older rule, a later
        // step exists.
        None => recorded.step < last_recorded,
    }
}

/// What a request replayed by content meets (SPEC 12, 13).
#[derive(Debug)]
pub(super) enum ByContent {
    /// A finished step with its name and args that no request of this run
    /// had, the earliest: answer it; nothing runs.
    Replay(StepRecord),
    /// The agent's open step it is part of (a proxied call inside a step
    /// the agent journals itself): no step of its own.
    PartOf(u64),
    /// A `mutate` step with its name and args that a run died inside: run
    /// it again as its next attempt, with its key.
    Retry(StepRecord),
    /// A new step.
    Run,
}

/// Decides a request by content: `contents` holds the task's recorded
/// steps by name and args (a step it answers is taken out: one answer a
/// step); `part_of` is the agent's open step the request would be part of.
pub(super) fn decide_by_content(
    contents: &mut Contents,
    name: &str,
    args_hash: &str,
    part_of: Option<u64>,
) -> ByContent {
    if let Some(record) = contents.take_finished(name, args_hash) {
        return ByContent::Replay(record);
    }
    if let Some(step) = part_of {
        return ByContent::PartOf(step);
    }
    match contents.take_pending(name, args_hash) {
        Some(record) => ByContent::Retry(record),
        None => ByContent::Run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{StepKind, StepRecord};

    fn content(step: u64, status: StepStatus, args_hash: &str) -> StepRecord {
        StepRecord {
            name: "POST /v1/chat/completions".into(),
            kind: StepKind::Proxy,
            args_hash: args_hash.into(),
            ..StepRecord::sample(step, status)
        }
    }

    /// By content: each finished step answers one request, earliest
    /// first; then the agent's open step takes the request; then a step in
    /// doubt runs again; else it is new. A failed attempt is no answer.
    #[test]
    fn every_row_of_the_content_table() {
        let mut contents = Contents::default();
        contents.load(vec![
            content(2, StepStatus::Committed, "a"),
            content(5, StepStatus::Committed, "a"),
            content(7, StepStatus::Pending, "b"),
            content(8, StepStatus::Failed, "c"),
        ]);
        let name = "POST /v1/chat/completions";
        let mut decide = |args_hash: &str, part_of: Option<u64>| match decide_by_content(
            &mut contents,
            name,
            args_hash,
            part_of,
        ) {
            ByContent::Replay(record) => format!("replay {}", record.step),
            ByContent::Retry(record) => format!("retry {}", record.step),
            ByContent::PartOf(step) => format!("part of {step}"),
            ByContent::Run => "run".to_owned(),
        };
        assert_eq!(decide("a", Some(9)), "replay 2", "a finished step first");
        assert_eq!(decide("a", None), "replay 5", "then the next equal one");
        assert_eq!(decide("a", Some(9)), "part of 9", "each answers once");
        assert_eq!(decide("a", None), "run");
        assert_eq!(decide("b", Some(9)), "part of 9", "before a step in doubt");
        assert_eq!(decide("b", None), "retry 7");
        assert_eq!(decide("b", None), "run", "retried once");
        assert_eq!(decide("c", None), "run", "a failed attempt is no answer");
        let other = decide_by_content(&mut contents, "another", "a", None);
        assert!(matches!(other, ByContent::Run), "{other:?}");
    }

    fn record(status: StepStatus) -> StepRecord {
        StepRecord {
            name: "create_pr".into(),
            kind: StepKind::Call,
            ..StepRecord::sample(4, status)
        }
    }

    const ASKED: Asked<'static> = Asked {
        name: "create_pr",
        args_hash: "h",
        ask_first: false,
    };

    /// One row per line of the table in SPEC 3.2.
    #[test]
    fn every_row_of_the_replay_table() {
        // nothing: run it.
        assert_eq!(decide(None, &ASKED, 3), Decision::Run);
        // committed, same identity: replay.
        assert_eq!(
            decide(Some(&record(StepStatus::Committed)), &ASKED, 4),
            Decision::Replay
        );
        // pending (a run died inside it): run again in doubt, same key...
        assert_eq!(
            decide(Some(&record(StepStatus::Pending)), &ASKED, 4),
            Decision::Retry { in_doubt: true }
        );
        // ...unless its tool is `in_doubt = "ask"`: wait for an operator,
        let ask = Asked {
            ask_first: true,
            ..ASKED
        };
        assert_eq!(
            decide(Some(&record(StepStatus::Pending)), &ask, 4),
            Decision::AskOperator
        );
        // who may allow one more attempt.
        let mut allowed = record(StepStatus::Pending);
        allowed.resolution = Some(ResolutionKind::Retry);
        assert_eq!(
            decide(Some(&allowed), &ask, 4),
            Decision::Retry { in_doubt: true }
        );
        // failed, and the last step: the agent died on it; run it again.
        assert_eq!(
            decide(Some(&record(StepStatus::Failed)), &ASKED, 4),
            Decision::Retry { in_doubt: false }
        );
        // waiting for a signal or a time: wait on.
        assert_eq!(
            decide(Some(&record(StepStatus::Waiting)), &ASKED, 4),
            Decision::Await
        );
        // anything, other name or args: divergence.
        for status in [
            StepStatus::Committed,
            StepStatus::Pending,
            StepStatus::Failed,
            StepStatus::Waiting,
        ] {
            let other_args = Asked {
                args_hash: "other",
                ..ASKED
            };
            let other_name = Asked {
                name: "merge_pr",
                ..ASKED
            };
            assert_eq!(
                decide(Some(&record(status)), &other_args, 4),
                Decision::Diverge
            );
            assert_eq!(
                decide(Some(&record(status)), &other_name, 4),
                Decision::Diverge
            );
        }
    }

    /// The failed-step rows: replay only a failure the agent went on from.
    #[test]
    fn a_failure_replays_only_if_the_agent_went_on_from_it() {
        let mut failed = record(StepStatus::Failed);
        // Answered when step 6 was the next to open; steps 5 and 6 exist.
        failed.seen_from = Some(6);
        assert_eq!(decide(Some(&failed), &ASKED, 6), Decision::Replay);
        // Step 5 was opened before the answer (parallel calls), nothing
        // after it: run it again.
        assert_eq!(
            decide(Some(&failed), &ASKED, 5),
            Decision::Retry { in_doubt: false }
        );
        // An operator's `--fail` always replays.
        failed.resolution = Some(ResolutionKind::Fail);
        assert_eq!(decide(Some(&failed), &ASKED, 4), Decision::Replay);
        // A failure recorded before `seen_from`: later steps mean it replays.
        let old = record(StepStatus::Failed);
        assert_eq!(decide(Some(&old), &ASKED, 7), Decision::Replay);
        assert_eq!(
            decide(Some(&old), &ASKED, 4),
            Decision::Retry { in_doubt: false }
        );
    }
}
