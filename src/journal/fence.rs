//! Fenced leases (SPEC 4): every write a run makes checks, in its own
//! transaction, that the run still holds its task's lease.

use anyhow::Result;

use crate::error::{Failure, Kind};
use crate::lease::Lease;

/// Where a run stands with its task's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// The run holds the lease; it may go on.
    Held,
    /// Another run took the task over, or the lease was cleared: the run
    /// must stop at once without writing.
    Lost,
    /// `durun cancel` came: the run may record steps that finished but
    /// must open none.
    Cancelled,
}

/// A fenced write refused because the run no longer may write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fenced(pub Standing);

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Standing::Cancelled => "the task was cancelled",
            Standing::Held | Standing::Lost => "this run no longer holds the task's lease",
        })
    }
}

impl std::error::Error for Fenced {}

/// The fence of every write a run makes: refuse when `lease_run` (the
/// task's current holder) is not `run`, or when the task was cancelled and
/// the write would open a step.
pub(crate) fn fence(
    lease_run: Option<u32>,
    cancelled: bool,
    run: u32,
    opens: bool,
) -> Result<Standing> {
    let standing = standing_of(lease_run, cancelled, run);
    match standing {
        Standing::Lost => Err(Fenced(Standing::Lost).into()),
        Standing::Cancelled if opens => Err(Fenced(Standing::Cancelled).into()),
        _ => Ok(standing),
    }
}

/// Where `run` stands, from the task row's lease holder and cancel mark.
pub(crate) fn standing_of(lease_run: Option<u32>, cancelled: bool, run: u32) -> Standing {
    if lease_run != Some(run) {
        Standing::Lost
    } else if cancelled {
        Standing::Cancelled
    } else {
        Standing::Held
    }
}

/// The error for a task a live runner holds (exit 75).
pub(crate) fn locked(task: &str, lease: &Lease) -> Failure {
    Failure::new(
        Kind::Locked,
        format!(
            "task {task} is being run by another durun (pid {} on {}, run {})",
            lease.pid, lease.host, lease.run
        ),
    )
    .hint("wait for that run to end; if its runner dies, the task is free again")
}
