//! The queue of submitted tasks and the workers that take them (SPEC 11,
//! 16): what a worker may claim, its claims, its looks, and the news the
//! journal sends waiting workers. The same on every backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;

use super::tx::{Commit, Transact, Tx, committed, committed_unsynced, read};
use super::{Candidate, Retryable, TaskRecord, WorkerRecord};
use super::{reads, writes};

/// The queue of submitted tasks and the workers that take them (SPEC 11).
pub(crate) trait Queue: Transact {
    /// Tasks of `queues` a worker might take (SPEC 11), oldest submitted
    /// first, at most `limit` after the first `offset`: queued, running
    /// (the caller checks the lease), interrupted, waiting and sleeping
    /// ones that no other worker claimed within `stale`. Also the
    /// journal's clock, in milliseconds (0 when no task was found).
    fn claimable(
        &mut self,
        queues: &[String],
        worker: &str,
        limit: usize,
        offset: usize,
    ) -> Result<(Vec<Candidate>, i64)> {
        let stale = self.stale();
        read(self, |tx| {
            reads::claimable(tx, queues, worker, (limit, offset), stale)
        })
    }
    /// Claims for `worker` those of `tasks` (all of `queue`) no other
    /// worker holds, keeping the queue's running and claimed tasks within
    /// `concurrency`; one transaction, so of workers racing for a task
    /// exactly one claims it. Returns the ids claimed.
    fn claim(
        &mut self,
        queue: &str,
        tasks: &[String],
        worker: &str,
        concurrency: Option<u32>,
    ) -> Result<Vec<String>> {
        // A claim need not survive a crash: it is void after the stale
        // time, and the lease is what fences a run.
        let stale = self.stale();
        committed_unsynced(self, |tx| {
            writes::claim(tx, queue, tasks, worker, concurrency, stale)
        })
    }
    /// Gives up `worker`'s claim of the task (its run has ended), and
    /// wakes the workers: the one whose run it was fills its place. As a
    /// claim, its release need not survive a crash (a claim of a task
    /// whose run has ended keeps no one from it past the stale time), and
    /// does not wait for the disk: the run's end did.
    fn release_claim(&mut self, task: &str, worker: &str) -> Result<()> {
        committed_unsynced(self, |tx| writes::release_claim(tx, task, worker))
    }
    /// A worker's look: what `look` asks for. Tasks to claim alone (a
    /// submit came) is one query, no more; anything else one transaction,
    /// whatever it holds, so that an idle worker's look costs the server
    /// one (SPEC 16); its heartbeat need not survive a power cut.
    fn look(&mut self, look: &Look<'_>) -> Result<Looked> {
        let stale = self.stale();
        let each = |tx: &mut dyn Tx| -> Result<Looked> {
            let mut looked = Looked::default();
            if let Some(worker) = look.heartbeat {
                writes::worker_heartbeat(tx, worker)?;
            }
            if look.workers {
                looked.workers = reads::workers(tx, stale)?;
            }
            if let Some((queues, worker, limit)) = look.claimable {
                (looked.claimable, looked.now_ms) =
                    reads::claimable(tx, queues, worker, (limit, 0), stale)?;
            }
            if look.retryable {
                looked.retryable = reads::retryable(tx)?;
            }
            Ok(looked)
        };
        if look.heartbeat.is_none() && !look.workers && !look.retryable {
            return read(self, each);
        }
        committed_unsynced(self, each)
    }
    /// Takes the worker off the list, and its claims with it.
    fn worker_gone(&mut self, worker: &str) -> Result<()> {
        committed(self, |tx| writes::worker_gone(tx, worker))
    }
    /// The workers whose heartbeat is younger than the stale time.
    fn workers(&mut self) -> Result<Vec<WorkerRecord>> {
        let stale = self.stale();
        read(self, |tx| reads::workers(tx, stale))
    }
    /// Waits up to `timeout` for news a worker may act on (a submit, a
    /// signal, a run that ended).
    fn wait_for_work(&mut self, timeout: std::time::Duration) -> Result<Heard>;
    /// The greatest task id that starts with `prefix` (a schedule's last
    /// tick), if any.
    fn latest_task_id(&mut self, prefix: &str) -> Result<Option<String>> {
        read(self, |tx| reads::latest_task_id(tx, prefix))
    }
    /// Counts the task's retry (it had `used`) and leaves it interrupted
    /// for a worker to claim, in one transaction; false if another worker
    /// did first or the task is no longer failed.
    fn start_retry(&mut self, task: &str, used: u32) -> Result<bool> {
        let mut retried = false;
        self.transact(Commit::Durable, &mut |tx| {
            retried = writes::start_retry(tx, task, used)?;
            Ok(retried)
        })?;
        Ok(retried)
    }
    /// The tasks whose id starts with `prefix` (a parent's children,
    /// `PARENT-s`), in id order.
    fn tasks_with_prefix(&mut self, prefix: &str) -> Result<Vec<TaskRecord>> {
        read(self, |tx| reads::tasks_with_prefix(tx, prefix))
    }
}

/// What a worker reads and writes on one look (SPEC 16).
#[derive(Default)]
pub(crate) struct Look<'a> {
    /// Its heartbeat, when due or when its tasks changed.
    pub(crate) heartbeat: Option<&'a WorkerRecord>,
    /// The live workers: those of its host that died free their claims.
    pub(crate) workers: bool,
    /// Tasks it may claim: of its queues, by its id, at most so many.
    pub(crate) claimable: Option<(&'a [String], &'a str, usize)>,
    /// The failed tasks with retries left.
    pub(crate) retryable: bool,
}

/// A worker's claim on the task its run runs (SPEC 16), which the run's
/// end releases in its own transaction ([`super::RunEnd::release`]).
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub(crate) worker: String,
    /// Set just before the commit that releases the claim: the commit's
    /// news wakes the worker, which must then find the run ended.
    ended: Arc<AtomicBool>,
    /// The run's end released it.
    released: Arc<AtomicBool>,
}

impl Claim {
    pub(crate) fn new(worker: String, ended: Arc<AtomicBool>) -> Self {
        Self {
            worker,
            ended,
            released: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Says the run has ended, to a worker that wakes before its thread does.
    pub(crate) fn ending(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// Whether the run's end released the claim.
    pub(crate) fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    pub(crate) fn set_released(&self) {
        self.released.store(true, Ordering::Release);
    }
}

/// What a worker heard while it waited.
#[derive(Clone, Copy, Default)]
pub(crate) struct Heard {
    /// Some news came.
    pub(crate) any: bool,
    /// A run may have ended (and failed: a retry may be due).
    pub(crate) run_ended: bool,
}

impl Heard {
    /// Takes one piece of [`news`] in.
    pub(crate) fn note(&mut self, news: &str) {
        self.any = true;
        self.run_ended |= !matches!(news, news::SUBMIT | news::RELEASED | news::COMPLETED);
    }
}

/// What the journal tells waiting workers (PostgreSQL's `NOTIFY
/// durun_work`; SQLite's workers see any write).
pub(crate) mod news {
    /// A task was queued.
    pub(crate) const SUBMIT: &str = "submit";
    /// A signal came for a task.
    pub(crate) const SIGNAL: &str = "signal";
    /// A worker's claim was let go: its place is free.
    pub(crate) const RELEASED: &str = "released";
    /// A worker left: its claims are free.
    pub(crate) const WORKER: &str = "worker";
    /// A run completed: room in its queue, nothing to take over or retry.
    pub(crate) const COMPLETED: &str = "completed";
    /// A run ended otherwise: its task may be taken over, or retried.
    pub(crate) const RUN: &str = "run";
}

/// What a [`Look`] found.
#[derive(Default)]
pub(crate) struct Looked {
    pub(crate) workers: Vec<WorkerRecord>,
    pub(crate) claimable: Vec<Candidate>,
    /// The journal's clock, in milliseconds (0 when no task was found).
    pub(crate) now_ms: i64,
    pub(crate) retryable: Vec<Retryable>,
}

#[cfg(test)]
mod tests {
    use super::{Heard, news};

    #[test]
    fn only_news_of_a_run_that_may_have_failed_sends_workers_to_look_for_retries() {
        for (said, retry) in [
            (news::SUBMIT, false),
            (news::RELEASED, false),
            (news::COMPLETED, false),
            (news::RUN, true),
            (news::SIGNAL, true),
            (news::WORKER, true),
        ] {
            let mut heard = Heard::default();
            heard.note(said);
            assert!(heard.any, "{said}");
            assert_eq!(heard.run_ended, retry, "{said}");
        }
    }
}
