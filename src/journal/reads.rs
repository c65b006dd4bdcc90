//! The journal's reads, written once for both backends over a [`Tx`]:
//! a task's steps (in order, a page, by content, every version of one),
//! its runs, its signals, the tokens of each day. A backend runs them on
//! its connection ([`super::tx::Transact::read`]).

use std::time::Duration;

use anyhow::Result;

use super::rows::{CANDIDATE_WIDTH, SignalColumns, StepColumns, TaskColumns};
use super::sql;
use super::tx::{Arg, Row, Tx};
use super::{
    Candidate, Retryable, RunRecord, RunStats, SignalRecord, StepRecord, TaskRecord, TaskStatus,
    WorkerRecord,
};

/// A step row selected with [`super::rows::STEP_COLUMNS`].
pub(crate) fn step_from(row: &dyn Row) -> Result<StepRecord> {
    StepColumns {
        step: row.some_int(0)?,
        name: row.some_text(1)?.to_owned(),
        kind: row.some_text(2)?,
        effect: row.some_text(3)?,
        args: row.some_text(4)?,
        args_hash: row.some_text(5)?.to_owned(),
        idempotency_key: row.some_text(6)?.to_owned(),
        status: row.some_text(7)?,
        attempts: row.some_int(8)?,
        output: row.text(9)?,
        error_code: row.text(10)?,
        error: row.text(11)?.map(str::to_owned),
        usage: row.text(12)?,
        tokens: row.some_int(13)?,
        run: row.some_int(14)?,
        created_at: row.some_text(15)?.to_owned(),
        started_at: row.some_text(16)?.to_owned(),
        finished_at: row.text(17)?.map(str::to_owned),
        resolution: row.text(18)?,
        seen_from: row.int(20)?,
        wake_at: row.text(21)?.map(str::to_owned),
        cost_nanos: row.int(22)?,
        request_hash: row.text(23)?.map(str::to_owned),
    }
    .record()
}

/// The [`super::rows::SIGNAL_COLUMNS`] starting at `first`.
pub(crate) fn signal_from(row: &dyn Row, first: usize) -> Result<SignalRecord> {
    SignalColumns {
        name: row.some_text(first)?.to_owned(),
        data: row.some_text(first + 1)?,
        signal_id: row.text(first + 2)?.map(str::to_owned),
        sent_by: row.some_text(first + 3)?.to_owned(),
        sent_at: row.some_text(first + 4)?.to_owned(),
        taken_by: row.int(first + 5)?,
    }
    .record()
}

/// Hands the task's steps to `visit` in order (with the discarded ones
/// if asked, only the last `last` if given).
pub(crate) fn visit_steps(
    tx: &mut dyn Tx,
    task: &str,
    discarded: bool,
    last: Option<usize>,
    visit: &mut dyn FnMut(StepRecord) -> Result<()>,
) -> Result<()> {
    let statement = &sql::STEPS_OF_TASK[usize::from(discarded) * 2 + usize::from(last.is_some())];
    let args: &[Arg<'_>] = &[task.into(), last.map(|last| last as u64).into()];
    let args = if last.is_some() { args } else { &args[..1] };
    // A step is visited as it is read, unless a conversation's chain
    // (read after the query, on the same transaction) came before it:
    // from there on they wait, as written (small so), in order.
    let mut waiting = Vec::new();
    tx.query(statement, args, &mut |row| {
        let step = step_from(row)?;
        if waiting.is_empty() && !super::chats::names_a_chain(&step) {
            visit(step)
        } else {
            waiting.push(step);
            Ok(())
        }
    })?;
    let mut nodes = std::collections::HashMap::new();
    for mut step in waiting {
        super::chats::expand(tx, &mut step, &mut nodes)?;
        visit(step)?;
    }
    Ok(())
}

/// The steps `statement` selects, with `args`, with their whole args.
pub(crate) fn steps(
    tx: &mut dyn Tx,
    statement: &sql::Sql,
    args: &[Arg<'_>],
) -> Result<Vec<StepRecord>> {
    let mut steps = steps_as_written(tx, statement, args)?;
    super::chats::expand_all(tx, &mut steps)?;
    Ok(steps)
}

/// The steps `statement` selects, with `args`, as written: a proxied
/// request's conversation as the chain that stands for it (SPEC 21).
/// For replay, which matches requests by `args_hash`, never by args.
pub(crate) fn steps_as_written(
    tx: &mut dyn Tx,
    statement: &sql::Sql,
    args: &[Arg<'_>],
) -> Result<Vec<StepRecord>> {
    let mut steps = Vec::new();
    tx.query(statement, args, &mut |row| {
        steps.push(step_from(row)?);
        Ok(())
    })?;
    Ok(steps)
}

/// How many steps the task has, discarded ones included.
pub(crate) fn count_steps(tx: &mut dyn Tx, task: &str) -> Result<u64> {
    let count = tx.query_opt(&sql::COUNT_STEPS, &[task.into()], |row| row.some_int(0))?;
    Ok(count.unwrap_or(0) as u64)
}

/// How many live steps the task has, and the highest step number.
pub(crate) fn replay_bounds(tx: &mut dyn Tx, task: &str) -> Result<(u64, u64)> {
    let bounds = tx.query_opt(&sql::REPLAY_BOUNDS, &[task.into()], bounds_of)?;
    Ok(bounds.unwrap_or((0, 0)))
}

/// A row of [`sql::REPLAY_BOUNDS`].
pub(crate) fn bounds_of(row: &dyn Row) -> Result<(u64, u64)> {
    Ok((row.some_int(0)? as u64, row.int(1)?.unwrap_or(0) as u64))
}

/// The task's runs, in order.
pub(crate) fn runs(tx: &mut dyn Tx, task: &str) -> Result<Vec<RunRecord>> {
    let mut runs = Vec::new();
    tx.query(&sql::RUNS_OF_TASK, &[task.into()], &mut |row| {
        runs.push(RunRecord {
            run: row.some_int(0)? as u32,
            host: row.some_text(1)?.to_owned(),
            pid: row.some_int(2)? as u32,
            started_at: row.some_text(3)?.to_owned(),
            finished_at: row.text(4)?.map(str::to_owned),
            exit_code: row.int(5)?.map(|code| code as i32),
            stats: RunStats {
                replayed_steps: row.some_int(6)? as u64,
                replays_noted: row.some_int(6)? as u64,
                executed_steps: row.some_int(7)? as u64,
                tokens_spent: row.some_int(8)? as u64,
                tokens_saved: row.some_int(9)? as u64,
                cost: crate::journal::Cost {
                    spent_nanos: row.some_int(12)? as u64,
                    saved_nanos: row.some_int(13)? as u64,
                    unpriced_steps: row.some_int(14)? as u64,
                },
            },
            unreplayed: super::rows::step_list(row.text(10)?),
            error: row.text(11)?.map(str::to_owned),
        });
        Ok(())
    })?;
    Ok(runs)
}

/// The task's events from row `from` on, at most `limit`.
pub(crate) fn events(
    tx: &mut dyn Tx,
    task: &str,
    from: i64,
    limit: u64,
) -> Result<Vec<super::EventRow>> {
    let mut events = Vec::new();
    tx.query(
        &sql::EVENTS_FROM,
        &[task.into(), from.into(), limit.into()],
        &mut |row| {
            events.push(super::EventRow {
                id: row.some_int(0)?,
                run: row.some_int(1)? as u32,
                kind: row.some_text(2)?.to_owned(),
                step: row.int(3)?.map(|step| step as u64),
                last_step: row.int(4)?.map(|step| step as u64),
                at: row.some_text(5)?.to_owned(),
                name: row.text(6)?.map(str::to_owned),
                tokens: row.int(7)?.map(|tokens| tokens as u64),
            });
            Ok(())
        },
    )?;
    Ok(events)
}

/// `count` of the steps run `run` could replay (recorded by an earlier
/// run), after the first `skip`, as (number, name) in step order.
pub(crate) fn replayable_steps(
    tx: &mut dyn Tx,
    task: &str,
    run: u32,
    count: u64,
    skip: u64,
) -> Result<Vec<(u64, String)>> {
    let mut steps = Vec::new();
    tx.query(
        &sql::REPLAYABLE_STEPS,
        &[task.into(), run.into(), count.into(), skip.into()],
        &mut |row| {
            steps.push((row.some_int(0)? as u64, row.some_text(1)?.to_owned()));
            Ok(())
        },
    )?;
    Ok(steps)
}

/// Tokens spent and saved per day, oldest first.
pub(crate) fn token_days(tx: &mut dyn Tx) -> Result<Vec<(String, u64, u64)>> {
    let mut days = Vec::new();
    tx.query(&sql::TOKEN_DAYS, &[], &mut |row| {
        days.push((
            row.some_text(0)?.to_owned(),
            row.some_int(1)? as u64,
            row.some_int(2)? as u64,
        ));
        Ok(())
    })?;
    Ok(days)
}

/// The task's signals, oldest first.
pub(crate) fn signals(tx: &mut dyn Tx, task: &str) -> Result<Vec<SignalRecord>> {
    let mut signals = Vec::new();
    tx.query(&sql::SIGNALS_OF_TASK, &[task.into()], &mut |row| {
        signals.push(signal_from(row, 0)?);
        Ok(())
    })?;
    Ok(signals)
}

/// Whether a signal called `name` waits, untaken.
pub(crate) fn signal_waiting(tx: &mut dyn Tx, task: &str, name: &str) -> Result<bool> {
    let waiting = tx.query_opt(&sql::SIGNAL_WAITING, &[task.into(), name.into()], |row| {
        Ok(row.boolean(0)?.unwrap_or(false))
    })?;
    Ok(waiting.unwrap_or(false))
}

/// A task row selected with [`super::rows::TASK_COLUMNS`].
pub(crate) fn task_from(row: &dyn Row) -> Result<TaskRecord> {
    TaskColumns {
        id: row.some_text(0)?.to_owned(),
        status: row.some_text(1)?,
        argv: row.some_text(2)?,
        cwd: row.some_text(3)?.to_owned(),
        config: row.text(4)?.map(str::to_owned),
        config_path: row.text(5)?.map(str::to_owned),
        sync: row.some_text(6)?,
        exit_code: row.int(7)?.map(|code| code as i32),
        output: row.text(8)?,
        runs: row.some_int(9)?,
        lease: super::tx::lease_at(row, 10)?,
        created_at: row.some_text(15)?.to_owned(),
        updated_at: row.some_text(16)?.to_owned(),
        steps: row.some_int(17)?,
        tokens_spent: row.some_int(18)?,
        tokens_saved: row.some_int(19)?,
        max_tokens: row.int(20)?,
        queue: row.text(21)?.map(str::to_owned),
        imported_at: row.text(22)?.map(str::to_owned),
        launch: row.text(23)?,
        cost: [row.some_int(24)?, row.some_int(25)?, row.some_int(26)?],
        max_cost_nanos: row.int(27)?,
    }
    .record()
}

/// The tasks `statement` selects, with `args`.
fn tasks(tx: &mut dyn Tx, statement: &sql::Sql, args: &[Arg<'_>]) -> Result<Vec<TaskRecord>> {
    let mut tasks = Vec::new();
    tx.query(statement, args, &mut |row| {
        tasks.push(task_from(row)?);
        Ok(())
    })?;
    Ok(tasks)
}

/// Every task, newest first.
pub(crate) fn all_tasks(tx: &mut dyn Tx) -> Result<Vec<TaskRecord>> {
    tasks(tx, &sql::ALL_TASKS, &[])
}

/// One task, if the journal holds it.
pub(crate) fn task(tx: &mut dyn Tx, id: &str) -> Result<Option<TaskRecord>> {
    Ok(tasks(tx, &sql::TASK, &[id.into()])?.pop())
}

/// The tasks whose id starts with `prefix`, in id order.
pub(crate) fn tasks_with_prefix(tx: &mut dyn Tx, prefix: &str) -> Result<Vec<TaskRecord>> {
    let length = prefix.chars().count() as u64;
    tasks(tx, &sql::TASKS_WITH_PREFIX, &[prefix.into(), length.into()])
}

/// The greatest task id that starts with `prefix`, if any.
pub(crate) fn latest_task_id(tx: &mut dyn Tx, prefix: &str) -> Result<Option<String>> {
    let length = prefix.chars().count() as u64;
    let latest = tx.query_opt(
        &sql::LATEST_TASK_ID,
        &[prefix.into(), length.into()],
        |row| Ok(row.text(0)?.map(str::to_owned)),
    )?;
    Ok(latest.flatten())
}

/// The failed tasks with retries left.
pub(crate) fn retryable(tx: &mut dyn Tx) -> Result<Vec<Retryable>> {
    let mut retryable = Vec::new();
    tx.query(&sql::RETRYABLE, &[], &mut |row| {
        retryable.push(Retryable {
            id: row.some_text(0)?.to_owned(),
            queue: row.text(1)?.map(str::to_owned),
            failed_at: row.some_text(2)?.to_owned(),
            exit_code: row.int(3)?.map(|code| code as i32),
            retries: row.some_int(4)? as u32,
            backoff_ms: row.some_int(5)? as u64,
            used: row.some_int(6)? as u32,
        });
        Ok(())
    })?;
    Ok(retryable)
}

/// The tasks of `queues` `worker` might claim (see `Queue::claimable`),
/// and the clock that judges their leases (0 when none was found).
pub(crate) fn claimable(
    tx: &mut dyn Tx,
    queues: &[String],
    worker: &str,
    page: (usize, usize),
    stale: Duration,
) -> Result<(Vec<Candidate>, i64)> {
    let (limit, offset) = page;
    let mut candidates = Vec::new();
    let mut now = 0;
    tx.query(
        &sql::CLAIMABLE,
        &[
            Arg::Texts(queues),
            worker.into(),
            millis(stale),
            (limit as u64).into(),
            (offset as u64).into(),
        ],
        &mut |row| {
            // The clock comes after the task's columns.
            now = row.some_int(CANDIDATE_WIDTH)?;
            let status = row.some_text(1)?;
            candidates.push(Candidate {
                id: row.some_text(0)?.to_owned(),
                status: TaskStatus::parse(status)
                    .ok_or_else(|| super::rows::bad_column("task status", status))?,
                lease: super::tx::lease_at(row, 2)?,
                queue: row.text(7)?.map(str::to_owned),
                updated_at: row.some_text(8)?.to_owned(),
            });
            Ok(())
        },
    )?;
    Ok((candidates, now))
}

/// The workers whose heartbeat is younger than `stale`.
pub(crate) fn workers(tx: &mut dyn Tx, stale: Duration) -> Result<Vec<WorkerRecord>> {
    let mut workers = Vec::new();
    tx.query(&sql::WORKERS, &[millis(stale)], &mut |row| {
        workers.push(super::rows::worker(
            row.some_text(0)?.to_owned(),
            row.some_text(1)?.to_owned(),
            row.some_int(2)?,
            row.some_text(3)?,
            row.some_int(4)?,
            row.some_text(5)?.to_owned(),
            row.some_int(6)?,
            row.some_text(7)?,
        )?);
        Ok(())
    })?;
    Ok(workers)
}

fn millis(duration: Duration) -> Arg<'static> {
    Arg::Int(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
}
