//! How the run ends: why durun stops it, the signal it forwarded, when
//! the agent gets SIGKILL, and what is known of the agent's exit.
//!
//! # Invariant
//!
//! Once `stop` is set it is never replaced by a weaker reason (the
//! `stopping` room decides), and once `exited` is set the agent is gone:
//! no answer is written to it after its stdout closed and the drain ended.

use std::process::ExitStatus;
use std::time::Instant;

#[derive(Default)]
pub(super) struct Ending {
    pub(super) stop: Option<Stop>,
    /// The signal durun forwarded to the agent (SIGINT, SIGTERM).
    pub(super) signal: Option<i32>,
    /// When the agent gets SIGKILL if it has not exited.
    pub(super) kill_at: Option<Instant>,
    pub(super) exited: Option<ExitStatus>,
    pub(super) exited_at: Option<Instant>,
    pub(super) stdout_closed: bool,
}

pub(super) enum Stop {
    Failure(anyhow::Error),
    Signal,
    /// `durun cancel` asked for it.
    Cancel,
    /// A step waits longer than `park_after`: the task is left `waiting`
    /// or `sleeping` (exit 77, with `notice` saying how to continue).
    Parked {
        status: crate::journal::TaskStatus,
        notice: anyhow::Error,
    },
    /// The token budget is spent (exit 78).
    OverBudget(anyhow::Error),
}
