//! Tasks a worker found it cannot take yet: parked ones whose signal or
//! time has not come, and agents that keep dying (see `task::crashes`). Finding
//! that out costs a query or two a task, and such tasks can sit at the
//! head of a queue for days (a wait for an approval), so a worker notes
//! each and passes it by without a query until its time comes, its row
//! changes, news comes (a submit, a signal, a run's end: whatever could
//! make it ready), or `RECHECK` has passed, whichever is first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::journal::{Candidate, Journal, TaskStatus};
use crate::settings::Settings;

/// The longest a task is passed by unlooked at: the bound on how late a
/// worker sees a change that brought no news.
const RECHECK: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct NotReady {
    /// Task id → its row's `updated_at` when looked at, and when to look
    /// again.
    tasks: HashMap<String, (String, Instant)>,
}

impl NotReady {
    /// Whether a task is one to run now: queued, left by a run that is
    /// gone (unless its agent keeps dying), or parked and ready.
    pub(super) fn may_take(
        &mut self,
        journal: &mut dyn Journal,
        task: &Candidate,
        settings: &Settings,
        now_ms: i64,
    ) -> Result<bool> {
        let now = settings.now();
        Ok(match task.status {
            TaskStatus::Queued => true,
            TaskStatus::Running => !task.lease.as_ref().is_some_and(|held| {
                crate::lease::is_live(held, settings.holder(), now_ms, settings.lease.stale)
            }),
            TaskStatus::Interrupted | TaskStatus::Waiting | TaskStatus::Sleeping
                if self.skip(task) =>
            {
                false
            }
            TaskStatus::Interrupted => {
                let left = crate::task::crashes::left(&journal.runs(&task.id)?, now);
                self.note(task, left.is_zero(), Some(left));
                left.is_zero()
            }
            status if status.is_parked() => {
                let (ready, wake) = crate::task::readiness(journal, &task.id, now)?;
                let left = wake.map(|at| at.duration_since(now).unwrap_or_default());
                self.note(task, ready, left);
                ready
            }
            _ => false,
        })
    }

    /// Whether `task` was found not ready and nothing since says to look
    /// again.
    fn skip(&self, task: &Candidate) -> bool {
        self.tasks.get(&task.id).is_some_and(|(updated_at, again)| {
            *updated_at == task.updated_at && Instant::now() < *again
        })
    }

    /// Notes what a look found: `ready`, or not until `time_left` (when
    /// known).
    fn note(&mut self, task: &Candidate, ready: bool, time_left: Option<Duration>) {
        if ready {
            self.tasks.remove(&task.id);
            return;
        }
        let wait = time_left.map_or(RECHECK, |left| left.min(RECHECK));
        self.tasks.insert(
            task.id.clone(),
            (task.updated_at.clone(), Instant::now() + wait),
        );
    }

    /// News came: every task is looked at again.
    pub(super) fn forget(&mut self) {
        self.tasks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeping(updated_at: &str) -> Candidate {
        Candidate {
            id: "t".into(),
            status: TaskStatus::Sleeping,
            lease: None,
            updated_at: updated_at.into(),
            queue: Some("q".into()),
        }
    }

    #[test]
    fn a_task_not_ready_is_passed_by_until_its_time_its_row_changes_or_news_comes() {
        let mut not_ready = NotReady::default();
        let task = sleeping("2026-12-03T10:00:01Z");
        assert!(!not_ready.skip(&task));
        not_ready.note(&task, false, None);
        assert!(not_ready.skip(&task));
        // Its row changed (a signal, a run): looked at again.
        assert!(!not_ready.skip(&sleeping("2026-12-03T10:00:02Z")));
        // News: every task looked at again.
        not_ready.forget();
        assert!(!not_ready.skip(&task));
        // Its time has come.
        not_ready.note(&task, false, Some(Duration::ZERO));
        assert!(!not_ready.skip(&task));
        // Found ready: no longer noted.
        not_ready.note(&task, false, None);
        not_ready.note(&task, true, None);
        assert!(!not_ready.skip(&task));
    }
}
