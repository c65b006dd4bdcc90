//! The run's hold on its task's lease: when it was last renewed and
//! watched, and whether it was lost.
//!
//! # Invariant
//!
//! Once `fenced` is set the run has lost the lease: nothing more reaches
//! the agent or the journal, and it is never unset.

use std::time::{Duration, Instant};

pub(super) struct Holding {
    pub(super) last_heartbeat: Instant,
    /// [`crate::os::boot_clock`] when the lease was last renewed (the
    /// moment the renewal was sent, to err on the safe side).
    pub(super) renewed_at: Duration,
    /// The run lost its lease.
    pub(super) fenced: bool,
    pub(super) last_watch: Instant,
    pub(super) last_signal_look: Instant,
}

impl Holding {
    pub(super) fn new(leased_at: Duration) -> Self {
        let now = Instant::now();
        Self {
            last_heartbeat: now,
            renewed_at: leased_at,
            fenced: false,
            last_watch: now,
            last_signal_look: now,
        }
    }
}
