//! The [`Journal`] trait: storage for tasks, runs and steps, the same on
//! every backend.
//!
//! Invariant for every backend: when a method that writes returns `Ok`, the
//! write is durable (to the sync mode in force). The runner answers the agent
//! or starts a side effect only after that.

use anyhow::Result;
use serde_json::Value;

use super::queue::Queue;
use super::tx::{Transact, committed, committed_unsynced, read};
use super::{
    NewTask, Opened, Resolution, RunEnd, RunRecord, RunStart, RunStats, SignalRecord, Standing,
    StepRecord, TaskRecord, TaskRows,
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
