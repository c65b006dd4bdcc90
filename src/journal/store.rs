//! The [`Journal`] trait: storage for tasks, runs and steps, the same on
//! every backend.
//!
//! Invariant for every backend: when a method that writes returns `Ok`, the
//! write is durable (to the sync mode in force). The runner answers the agent
//! or starts a side effect only after that.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use serde_json::Value;

use super::tx::{Commit, Transact, Tx, committed, committed_unsynced, read};
use super::{
    Candidate, NewTask, Opened, Resolution, Retryable, RunEnd, RunRecord, RunStart, RunStats,
    SignalRecord, Standing, StepRecord, TaskRecord, TaskRows, WorkerRecord,
};
use super::{reads, sql, writes};
use crate::config::SyncMode;
use crate::lease::Holder;

/// Storage for tasks, runs and steps.
pub(crate) trait Journal: Signals + Transfer + Queue + Transact + Send {
    /// Sets how hard commits are pushed to disk from now on.
    fn set_sync(&mut self, sync: SyncMode) -> Result<()>;
    /// Whether the journal still answers: a connection that sat idle may
    /// have been ended by the server since (a restart). A file always does.
    fn answers(&mut self) -> bool {
        true
    }
    fn create_task(&mut self, task: &NewTask) -> Result<()>;
    fn task(&mut self, id: &str) -> Result<Option<TaskRecord>> {
        read(self, |tx| reads::task(tx, id))
    }
    /// Every task, newest first.
    fn tasks(&mut self) -> Result<Vec<TaskRecord>> {
        read(self, reads::all_tasks)
    }
    fn runs(&mut self, task: &str) -> Result<Vec<RunRecord>> {
        read(self, |tx| reads::runs(tx, task))
    }
    /// The task's events (SPEC 20) from row `from` on, at most `limit`.
    fn events(&mut self, task: &str, from: i64, limit: u64) -> Result<Vec<super::EventRow>> {
        read(self, |tx| reads::events(tx, task, from, limit))
    }
    /// `count` of the steps run `run` could replay, after the first `skip`.
    fn replayable_steps(
        &mut self,
        task: &str,
        run: u32,
        count: u64,
        skip: u64,
    ) -> Result<Vec<(u64, String)>> {
        read(self, |tx| {
            reads::replayable_steps(tx, task, run, count, skip)
        })
    }
    /// A request's turn under limit `name` (SPEC 19): how long it waits.
    fn limit_turn(&mut self, name: &str, interval_ms: u64, tokens_ms: u64) -> Result<u64> {
        committed_unsynced(self, |tx| {
            super::limits::turn(tx, name, interval_ms, tokens_ms)
        })
    }
    /// Pauses limit `name` for `ms`.
    fn limit_pause(&mut self, name: &str, ms: u64) -> Result<()> {
        committed_unsynced(self, |tx| super::limits::pause(tx, name, ms))
    }
    /// A slot of limit `name` for a request in flight, if one is free.
    fn limit_take_slot(
        &mut self,
        name: &str,
        max: u64,
        me: &Holder,
        stale_ms: i64,
    ) -> Result<Option<i64>> {
        committed_unsynced(self, |tx| {
            super::limits::take_slot(tx, name, max, me, stale_ms)
        })
    }
    /// Frees a slot taken by [`Journal::limit_take_slot`].
    fn limit_free_slot(&mut self, slot: i64) -> Result<()> {
        committed_unsynced(self, |tx| super::limits::free_slot(tx, slot))
    }
    /// Reserves a model call's worst case against the budgets of
    /// `budgeted` and their trees (SPEC 19): the first it does not fit.
    fn budget_hold(
        &mut self,
        budgeted: &[String],
        hold: &super::budgets::Hold,
        stale_ms: u64,
    ) -> Result<Option<super::budgets::Over>> {
        committed_unsynced(self, |tx| {
            super::budgets::reserve(tx, budgeted, hold, stale_ms)
        })
    }
    /// Tokens spent and saved per day (`YYYY-MM-DD`, UTC), oldest first.
    fn token_days(&mut self) -> Result<Vec<(String, u64, u64)>> {
        read(self, reads::token_days)
    }
    /// The task's steps that take part in replay, in step order; with
    /// `discarded`, also the steps `resume --from-step` took out, each
    /// before its replacement.
    fn steps(&mut self, task: &str, discarded: bool) -> Result<Vec<StepRecord>> {
        let mut steps = Vec::new();
        self.visit_steps(task, discarded, None, &mut |step| {
            steps.push(step);
            Ok(())
        })?;
        Ok(steps)
    }
    /// Hands the task's steps to `visit` one by one as they are read, in
    /// order (only the last `last` of them if given), so a long task is
    /// never held whole.
    fn visit_steps(
        &mut self,
        task: &str,
        discarded: bool,
        last: Option<usize>,
        visit: &mut dyn FnMut(StepRecord) -> Result<()>,
    ) -> Result<()> {
        read(self, |tx| {
            reads::visit_steps(tx, task, discarded, last, visit)
        })
    }
    /// Every step of the task (discarded ones included), or only its last
    /// `last`.
    fn steps_tail(&mut self, task: &str, last: Option<usize>) -> Result<Vec<StepRecord>> {
        let mut steps = Vec::new();
        self.visit_steps(task, true, last, &mut |step| {
            steps.push(step);
            Ok(())
        })?;
        Ok(steps)
    }
    /// How many steps the task has, discarded ones included.
    fn count_steps(&mut self, task: &str) -> Result<u64> {
        read(self, |tx| reads::count_steps(tx, task))
    }
    /// Every row of step `step` (a discarded one before its replacement).
    fn step_versions(&mut self, task: &str, step: u64) -> Result<Vec<StepRecord>> {
        read(self, |tx| {
            reads::steps(tx, &sql::STEP_VERSIONS, &[task.into(), step.into()])
        })
    }
    /// Takes the task's lease for `me` and opens a new run, unless a live
    /// runner holds it or the task was cancelled. Atomic: of two racing
    /// runners one wins.
    fn start_run(&mut self, task: &str, me: &Holder, now: &str) -> Result<RunStart>;
    /// The task's row and, where `startable` says so of it, a run of it
    /// started as [`Journal::start_run`] starts one. A backend with round
    /// trips reads the row in the start's first one, under its lock, and
    /// writes nothing when the row says not to start.
    fn open_run(
        &mut self,
        task: &str,
        me: &Holder,
        now: &str,
        startable: &dyn Fn(&TaskRecord) -> bool,
    ) -> Result<Opened> {
        let Some(record) = self.task(task)? else {
            return Ok(Opened::Unknown);
        };
        if !startable(&record) {
            return Ok(Opened::Read(record));
        }
        let start = self.start_run(task, me, now)?;
        Ok(Opened::Tried(record, start))
    }
    /// [`Journal::create_task`], then [`Journal::start_run`] for its first
    /// run: in one transaction where the backend can (one commit fewer at
    /// every `durun run`). An error leaves no task behind only there.
    fn create_and_start(&mut self, task: &NewTask, me: &Holder, now: &str) -> Result<RunStart> {
        self.create_task(task)?;
        self.start_run(&task.id, me, now)
    }
    /// Renews the lease of `run`, if it still holds it, and says where it
    /// stands.
    fn heartbeat(&mut self, task: &str, run: u32) -> Result<Standing>;
    /// Where `run` stands, cheaply: answers [`Standing::Held`] without a
    /// query when nothing was written to the task since the last look
    /// (another runner's takeover, a cancel).
    fn watch(&mut self, task: &str, run: u32) -> Result<Standing>;
    /// The task's live steps after step `after`, in order, at most `limit`:
    /// replay reads a long task page by page, each row once.
    fn steps_page(&mut self, task: &str, after: u64, limit: usize) -> Result<Vec<StepRecord>> {
        page(self, &sql::STEPS_PAGE, (task, after, limit))
    }
    /// [`Journal::steps_page`] for a run's numbering: the steps replayed
    /// by content come without their args (`null`) and output
    /// ([`sql::NUMBERING_PAGE`]).
    fn numbering_page(&mut self, task: &str, after: u64, limit: usize) -> Result<Vec<StepRecord>> {
        page(self, &sql::NUMBERING_PAGE, (task, after, limit))
    }
    /// Records which steps replayed by content no request of `run` asked
    /// for (`inspect` shows them `not replayed`).
    fn set_unreplayed(&mut self, task: &str, run: u32, steps: &[u64]) -> Result<()>;
    /// The task's live steps replayed by content (SPEC 12, 13), in order,
    /// as written: a conversation's args as their chain (SPEC 21; replay
    /// matches by `args_hash`). [`Journal::whole_args`] expands one.
    fn steps_by_content(&mut self, task: &str) -> Result<Vec<StepRecord>> {
        read(self, |tx| {
            reads::steps_as_written(tx, &sql::STEPS_BY_CONTENT, &[task.into()])
        })
    }
    /// Gives a step read as written its whole args back.
    fn whole_args(&mut self, step: &mut StepRecord) -> Result<()> {
        read(self, |tx| {
            super::chats::expand(tx, step, &mut std::collections::HashMap::new())
        })
    }
    /// The task's live MCP step whose key is `key`: an MCP task asked for
    /// by its id (SPEC 22).
    fn mcp_step_by_key(&mut self, task: &str, key: &str) -> Result<Option<StepRecord>> {
        read(self, |tx| {
            reads::steps(tx, &sql::MCP_STEP_BY_KEY, &[task.into(), key.into()])
        })
        .map(|steps| steps.into_iter().next())
    }
    /// How many live steps the task has, and the highest step number.
    fn replay_bounds(&mut self, task: &str) -> Result<(u64, u64)> {
        read(self, |tx| reads::replay_bounds(tx, task))
    }
    /// Writes steps, each new (`fresh`) or updated, and the run's counters
    /// if given, in one durable transaction: steps that finish together
    /// share one commit (group commit).
    ///
    /// Fenced: the same transaction checks that `run` still holds the
    /// task's lease, and fails with [`super::Fenced`] without writing if it does
    /// not, or if the task was cancelled and a step would be opened.
    fn put_steps(
        &mut self,
        task: &str,
        steps: &[StepWrite<'_>],
        run: u32,
        stats: Option<&RunStats>,
    ) -> Result<()> {
        committed(self, |tx| {
            writes::put_steps(tx, task, steps, run, stats, false)
        })
    }
    /// Stores the task's final output; fenced like [`Journal::put_steps`].
    fn set_output(&mut self, task: &str, run: u32, output: &Value) -> Result<()> {
        let output = serde_json::to_string(output)?;
        committed(self, |tx| writes::set_output(tx, task, run, &output))
    }
    /// Closes the run and, if it still holds the lease, releases it and
    /// records the task's status (`cancelled` if a cancel came meanwhile).
    fn finish_run(&mut self, task: &str, run: u32, end: &RunEnd, stats: &RunStats) -> Result<()> {
        committed(self, |tx| writes::end_run(tx, task, run, end, stats))?;
        if let Some(claim) = &end.release {
            claim.set_released();
        }
        Ok(())
    }
    /// Takes steps `step` and later out of replay (kept as `discarded`) and
    /// returns them as they were; fenced like [`Journal::put_steps`].
    fn discard_from(&mut self, task: &str, run: u32, step: u64) -> Result<Vec<StepRecord>> {
        committed(self, |tx| writes::discard_from(tx, task, run, step))
    }
    /// Settles a step by hand and keeps the resolution; refused while a live
    /// runner holds the task.
    fn resolve(
        &mut self,
        task: &str,
        step: u64,
        resolution: &Resolution,
        me: &Holder,
    ) -> Result<StepRecord> {
        let stale = self.stale();
        committed(self, |tx| {
            writes::resolve(tx, task, step, resolution, (me, stale))
        })
    }
    /// Cancels the task for good: from this commit on no run may start and
    /// no running one may open a step. Returns whether a live runner holds
    /// it (it is told, and stops its agent).
    fn request_cancel(&mut self, task: &str, me: &Holder) -> Result<bool> {
        let stale = self.stale();
        committed(self, |tx| writes::request_cancel(tx, task, (me, stale)))
    }
    /// Deletes finished tasks (completed, failed, cancelled) last updated
    /// before `finished_before`, never one a live runner holds; returns
    /// their ids.
    fn gc(&mut self, finished_before: &str, me: &Holder) -> Result<Vec<String>> {
        let stale = self.stale();
        committed(self, |tx| writes::gc(tx, finished_before, (me, stale)))
    }
    /// Sets the task's token budget (SPEC 9); `None` removes it.
    fn set_max_tokens(&mut self, task: &str, max_tokens: Option<u64>) -> Result<()> {
        committed(self, |tx| {
            tx.execute(&sql::SET_MAX_TOKENS, &[task.into(), max_tokens.into()])?;
            Ok(())
        })
    }
    /// Sets the task's budget in nano-dollars (SPEC 19); `None` removes it.
    fn set_max_cost(&mut self, task: &str, max_nanos: Option<u64>) -> Result<()> {
        committed(self, |tx| {
            tx.execute(&sql::SET_MAX_COST, &[task.into(), max_nanos.into()])?;
            Ok(())
        })
    }
    /// Removes a task whose first and only run failed before the agent
    /// opened a step or was sent a signal: nothing of it is worth keeping
    /// or resuming. True when it was removed.
    fn forget_unstarted(&mut self, task: &str) -> Result<bool> {
        committed(self, |tx| {
            Ok(tx.execute(&sql::FORGET_UNSTARTED, &[task.into()])? > 0)
        })
    }
}

/// Signals for `wait` steps (SPEC 8), on every backend.
pub(crate) trait Signals: Transact {
    /// Records a signal for the task and wakes a live runner of it;
    /// false when a signal with the same `signal_id` was recorded before
    /// (nothing is written then).
    fn send_signal(&mut self, task: &str, signal: &SignalRecord) -> Result<bool> {
        committed(self, |tx| writes::send_signal(tx, task, signal))
    }
    /// The task's signals, oldest first.
    fn signals(&mut self, task: &str) -> Result<Vec<SignalRecord>> {
        read(self, |tx| reads::signals(tx, task))
    }
    /// Whether a signal called `name` waits, untaken: a cheap read, for
    /// a runner that waits live and for `resume` of a parked task.
    fn signal_waiting(&mut self, task: &str, name: &str) -> Result<bool> {
        read(self, |tx| reads::signal_waiting(tx, task, name))
    }
    /// Fenced like [`Journal::put_steps`]: takes the oldest untaken signal
    /// called `step.name` for `step` and commits the step with it as its
    /// output (updating `step`), in one transaction. With no such signal
    /// the step is written as it is (`waiting`) when `fresh`, and `None`
    /// comes back.
    fn take_signal(
        &mut self,
        task: &str,
        run: u32,
        step: &mut StepRecord,
        fresh: bool,
    ) -> Result<Option<SignalRecord>> {
        committed(self, |tx| writes::take_signal(tx, task, run, step, fresh))
    }
}

/// A task's rows out of and into a journal (SPEC 10).
pub(crate) trait Transfer: Transact {
    /// Every row of the task (runs, steps with discarded ones, signals,
    /// resolutions) with every column, as JSON (SPEC 10); `None` for an
    /// unknown task.
    fn export(&mut self, task: &str) -> Result<Option<TaskRows>>;
    /// Writes the rows of one task in one transaction: all or nothing.
    /// An existing task of that id is refused unless `replace`, and never
    /// replaced while a live runner holds it.
    fn import(&mut self, rows: &TaskRows, replace: bool, me: &Holder) -> Result<()>;
}

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
/// end releases in its own transaction ([`RunEnd::release`]).
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

/// One row of a [`Journal::put_steps`] write.
#[derive(Clone, Copy)]
pub(crate) struct StepWrite<'a> {
    pub(crate) record: &'a StepRecord,
    /// The row is new (an insert), not an update of the step's row.
    pub(crate) fresh: bool,
}

/// How a command means to use the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Creates the journal if missing and may write it.
    Write,
    /// Reads an existing journal; never creates or migrates one.
    Read,
}

/// The task's live steps after step `after`, at most `limit`, as
/// `statement` (a page statement) selects them.
fn page(
    journal: &mut (impl Transact + ?Sized),
    statement: &sql::Sql,
    (task, after, limit): (&str, u64, usize),
) -> Result<Vec<StepRecord>> {
    read(journal, |tx| {
        reads::steps_as_written(
            tx,
            statement,
            &[task.into(), after.into(), (limit as u64).into()],
        )
    })
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
