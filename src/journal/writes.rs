//! The journal's writes, written once for both backends over a [`Tx`]: a
//! run's fenced step writes, a signal taken, an operator's resolution, a
//! task's retry. The caller opens the transaction and commits it; these
//! say what goes in it.

use std::time::Duration;

use anyhow::Result;

use super::reads::{signal_from, step_from};
use super::rows::StepTexts;
use super::sql;
use super::tx::{Arg, Tx, lease_at};
use super::{
    Resolution, ResolutionKind, RunEnd, RunStats, SignalRecord, StepRecord, StepWrite, WorkerRecord,
};
use crate::error::Failure;
use crate::json_text::JsonText;
use crate::lease::{self, Holder};

/// The fence of a run's write: fails unless `run` still holds the task
/// (and, for a write that `opens` a step, unless it was cancelled).
pub(crate) fn fence(tx: &mut dyn Tx, task: &str, run: u32, opens: bool) -> Result<()> {
    let standing = tx.query_opt(&sql::FENCE, &[task.into()], |row| {
        Ok((
            row.int(0)?.map(|run| run as u32),
            row.boolean(1)?.unwrap_or(false),
        ))
    })?;
    let (lease_run, cancelled) = standing.unwrap_or((None, false));
    super::fence(lease_run, cancelled, run, opens)?;
    Ok(())
}

/// A run's steps and counters, fenced. `in_doubt`: the same writes were
/// made before on a connection lost with its commit's outcome, so a fresh
/// row that is there already is written over rather than inserted twice.
pub(crate) fn put_steps(
    tx: &mut dyn Tx,
    task: &str,
    steps: &[StepWrite<'_>],
    run: u32,
    stats: Option<&RunStats>,
    in_doubt: bool,
) -> Result<()> {
    let opens = steps.iter().any(|write| {
        matches!(
            write.record.status,
            super::StepStatus::Pending | super::StepStatus::Waiting
        )
    });
    fence(tx, task, run, opens)?;
    // The steps replayed before these came before them.
    if let Some(stats) = stats {
        note_replayed(tx, task, run, stats)?;
    }
    for &StepWrite {
        record: step,
        fresh,
    } in steps
    {
        let fresh = fresh && !(in_doubt && step_is_there(tx, task, step.step)?);
        write_step(tx, task, step, fresh, run)?;
        step_event(tx, task, run, step, in_doubt)?;
    }
    if let Some(stats) = stats {
        write_stats(tx, task, run, stats)?;
    }
    Ok(())
}

/// The event a step's write makes (SPEC 20); `once`: the same write may
/// have been committed already, its event with it.
fn step_event(tx: &mut dyn Tx, task: &str, run: u32, step: &StepRecord, once: bool) -> Result<()> {
    let kind = match step.status {
        super::StepStatus::Pending => "step.opened",
        super::StepStatus::Committed => "step.finished",
        super::StepStatus::Failed => "step.failed",
        super::StepStatus::Waiting => "step.waiting",
        super::StepStatus::Discarded => return Ok(()),
    };
    let at = step.finished_at.as_deref().unwrap_or(&step.started_at);
    let insert = if once {
        &sql::INSERT_EVENT_ONCE
    } else {
        &sql::INSERT_EVENT
    };
    // With the COMMIT on PostgreSQL: a step's commit is three round
    // trips (its BEGIN with the fence, its row, the rest), not five.
    tx.execute_later(
        insert,
        &[
            task.into(),
            run.into(),
            kind.into(),
            step.step.into(),
            at.into(),
        ],
    )?;
    Ok(())
}

/// The steps `run` replayed since its counters were last written, as one
/// event; no statement when there are none new (most writes).
fn note_replayed(tx: &mut dyn Tx, task: &str, run: u32, stats: &RunStats) -> Result<()> {
    if stats.replayed_steps > stats.replays_noted {
        let now = crate::clock::now();
        tx.execute_later(
            &sql::NOTE_REPLAYED,
            &[
                task.into(),
                run.into(),
                stats.replayed_steps.into(),
                now.as_str().into(),
            ],
        )?;
    }
    Ok(())
}

/// Whether the step has a live row.
fn step_is_there(tx: &mut dyn Tx, task: &str, step: u64) -> Result<bool> {
    let there = tx.query_opt(&sql::STEP_IS_THERE, &[task.into(), step.into()], |row| {
        Ok(row.boolean(0)?.unwrap_or(false))
    })?;
    Ok(there.unwrap_or(false))
}

/// Inserts (`fresh`) or updates one step's row.
pub(crate) fn write_step(
    tx: &mut dyn Tx,
    task: &str,
    step: &StepRecord,
    fresh: bool,
    run: u32,
) -> Result<()> {
    let StepTexts {
        output,
        usage,
        error_code,
        error,
    } = StepTexts::of(step);
    let resolution = step.resolution.map(ResolutionKind::as_str);
    if fresh {
        // A conversation's repeated prefix is written once (SPEC 21).
        let compacted = if step.kind == super::StepKind::Proxy {
            super::chats::compact(tx, &step.args)?
        } else {
            None
        };
        let args = compacted.as_ref().unwrap_or(&step.args);
        tx.execute(
            &sql::INSERT_STEP,
            &[
                task.into(),
                step.step.into(),
                step.name.as_str().into(),
                step.kind.as_str().into(),
                step.effect.as_str().into(),
                args.as_str().into(),
                (&step.args_hash).into(),
                (&step.idempotency_key).into(),
                step.status.as_str().into(),
                step.attempts.into(),
                output.into(),
                error_code.into(),
                error.into(),
                usage.into(),
                step.tokens.into(),
                run.into(),
                (&step.created_at).into(),
                (&step.started_at).into(),
                step.finished_at.as_ref().into(),
                resolution.into(),
                step.seen_from.into(),
                step.wake_at.as_ref().into(),
                step.cost_nanos.into(),
                step.request_hash.as_ref().into(),
            ],
        )?;
        return Ok(());
    }
    let changed = tx.execute(
        &sql::UPDATE_STEP,
        &[
            task.into(),
            step.step.into(),
            step.status.as_str().into(),
            step.attempts.into(),
            output.into(),
            error_code.into(),
            error.into(),
            usage.into(),
            step.tokens.into(),
            run.into(),
            (&step.started_at).into(),
            step.finished_at.as_ref().into(),
            resolution.into(),
            step.seen_from.into(),
            step.wake_at.as_ref().into(),
            step.cost_nanos.into(),
        ],
    )?;
    anyhow::ensure!(
        changed == 1,
        "step {} of task {task} is missing from the journal",
        step.step
    );
    Ok(())
}

/// A run's counters.
pub(crate) fn write_stats(tx: &mut dyn Tx, task: &str, run: u32, stats: &RunStats) -> Result<()> {
    tx.execute_later(
        &sql::WRITE_STATS,
        &[
            task.into(),
            run.into(),
            stats.replayed_steps.into(),
            stats.executed_steps.into(),
            stats.tokens_spent.into(),
            stats.tokens_saved.into(),
            stats.cost.spent_nanos.into(),
            stats.cost.saved_nanos.into(),
            stats.cost.unpriced_steps.into(),
        ],
    )?;
    Ok(())
}

/// Keeps a signal for the task (once per `signal_id`); a live runner of it
/// and the workers hear of it at the commit. Whether it was new.
pub(crate) fn send_signal(tx: &mut dyn Tx, task: &str, signal: &SignalRecord) -> Result<bool> {
    let data = serde_json::to_string(&signal.data)?;
    let added = tx.execute(
        &sql::SEND_SIGNAL,
        &[
            task.into(),
            signal.name.as_str().into(),
            data.as_str().into(),
            signal.signal_id.as_ref().into(),
            signal.sent_by.as_str().into(),
            signal.sent_at.as_str().into(),
        ],
    )? == 1;
    if added {
        tx.notify(task, "signal")?;
        tx.notify_workers(super::news::SIGNAL)?;
    }
    Ok(added)
}

/// Takes the oldest signal waiting for `step` into it and writes the step,
/// fenced; a `fresh` step that found none is written as it is.
pub(crate) fn take_signal(
    tx: &mut dyn Tx,
    task: &str,
    run: u32,
    step: &mut StepRecord,
    fresh: bool,
) -> Result<Option<SignalRecord>> {
    fence(tx, task, run, true)?;
    let found = tx.query_opt(
        &sql::NEXT_SIGNAL,
        &[task.into(), step.name.as_str().into()],
        |row| Ok((row.some_int(0)?, signal_from(row, 1)?)),
    )?;
    match found {
        Some((id, mut signal)) => {
            signal.taken_by = Some(step.step);
            tx.execute(&sql::TAKE_SIGNAL, &[id.into(), step.step.into()])?;
            super::take_into(step, &signal);
            write_step(tx, task, step, fresh, run)?;
            step_event(tx, task, run, step, false)?;
            Ok(Some(signal))
        }
        None => {
            if fresh {
                write_step(tx, task, step, fresh, run)?;
                step_event(tx, task, run, step, false)?;
            }
            Ok(None)
        }
    }
}

/// An operator's word on a step (`durun resolve`), unless a live runner
/// holds the task.
pub(crate) fn resolve(
    tx: &mut dyn Tx,
    task: &str,
    step: u64,
    resolution: &Resolution,
    (me, stale): (&Holder, std::time::Duration),
) -> Result<StepRecord> {
    if let (Some(lease), now) = tx.lease(task)?
        && lease::is_live(&lease, me, now, stale)
    {
        return Err(super::locked(task, &lease).into());
    }
    let Some(mut record) = tx.query_opt(&sql::LIVE_STEP, &[task.into(), step.into()], step_from)?
    else {
        return Err(Failure::config(format!("task {task} has no step {step}"))
            .hint(format!("`durun inspect {task}` lists its steps"))
            .into());
    };
    let value = super::apply_resolution(&mut record, resolution);
    let StepTexts {
        error_code, error, ..
    } = StepTexts::of(&record);
    tx.execute(
        &sql::RESOLVE_STEP,
        &[
            task.into(),
            step.into(),
            record.status.as_str().into(),
            record.output.as_ref().map(JsonText::as_str).into(),
            error_code.into(),
            error.into(),
            record.finished_at.as_ref().into(),
            record.resolution.map(ResolutionKind::as_str).into(),
        ],
    )?;
    tx.execute(
        &sql::INSERT_RESOLUTION,
        &[
            task.into(),
            step.into(),
            resolution.action.kind().as_str().into(),
            value.as_ref().into(),
            (&resolution.by).into(),
            (&resolution.at).into(),
        ],
    )?;
    Ok(record)
}

/// The task's output, fenced.
pub(crate) fn set_output(tx: &mut dyn Tx, task: &str, run: u32, output: &str) -> Result<()> {
    fence(tx, task, run, false)?;
    tx.execute(
        &sql::SET_OUTPUT,
        &[task.into(), output.into(), super::now().as_str().into()],
    )?;
    Ok(())
}

/// Takes out the live steps from `step` on (`resume --from-step`),
/// fenced; returns them as they were.
pub(crate) fn discard_from(
    tx: &mut dyn Tx,
    task: &str,
    run: u32,
    step: u64,
) -> Result<Vec<StepRecord>> {
    fence(tx, task, run, true)?;
    let mut discarded = Vec::new();
    tx.query(&sql::DISCARDABLE, &[task.into(), step.into()], &mut |row| {
        discarded.push(step_from(row)?);
        Ok(())
    })?;
    tx.execute(&sql::DISCARD_FROM, &[task.into(), step.into()])?;
    super::chats::expand_all(tx, &mut discarded)?;
    Ok(discarded)
}

/// The end of a run, and the release of its lease if it still holds it
/// (a cancel that came meanwhile decides the task's status), and of a
/// worker's claim on the task (`end.release`).
pub(crate) fn end_run(
    tx: &mut dyn Tx,
    task: &str,
    run: u32,
    end: &RunEnd,
    stats: &RunStats,
) -> Result<()> {
    note_replayed(tx, task, run, stats)?;
    // None of these needs an answer: on PostgreSQL they go with the
    // COMMIT, the run's end one round trip.
    tx.execute_later(
        &sql::END_RUN,
        &[
            task.into(),
            run.into(),
            (&end.finished_at).into(),
            end.exit_code.into(),
            end.error.as_ref().into(),
            stats.replayed_steps.into(),
            stats.executed_steps.into(),
            stats.tokens_spent.into(),
            stats.tokens_saved.into(),
            stats.cost.spent_nanos.into(),
            stats.cost.saved_nanos.into(),
            stats.cost.unpriced_steps.into(),
        ],
    )?;
    tx.execute_later(
        &sql::END_TASK_RUN,
        &[
            task.into(),
            run.into(),
            end.status.as_str().into(),
            end.exit_code.into(),
            (&end.finished_at).into(),
        ],
    )?;
    let kind = match end.status {
        super::TaskStatus::Completed => "run.finished",
        super::TaskStatus::Failed => "run.failed",
        super::TaskStatus::Waiting | super::TaskStatus::Sleeping => "run.waiting",
        super::TaskStatus::Cancelled => "run.cancelled",
        super::TaskStatus::OverBudget => "run.over_budget",
        super::TaskStatus::Interrupted | super::TaskStatus::Running | super::TaskStatus::Queued => {
            "run.interrupted"
        }
    };
    tx.execute_later(
        &sql::INSERT_EVENT,
        &[
            task.into(),
            run.into(),
            kind.into(),
            Arg::Null,
            (&end.finished_at).into(),
        ],
    )?;
    if let Some(claim) = &end.release {
        release_claim(tx, task, &claim.worker)?;
        // The last write before the commit.
        claim.ending();
    }
    Ok(())
}

/// Cancels the task for good; whether a live runner holds it (it is told,
/// and keeps its lease to record what finishes, but may open no step:
/// every write it makes checks the mark).
pub(crate) fn request_cancel(
    tx: &mut dyn Tx,
    task: &str,
    (me, stale): (&Holder, std::time::Duration),
) -> Result<bool> {
    let now = super::now();
    let (lease, clock) = tx.lease(task)?;
    let live = lease.is_some_and(|lease| lease::is_live(&lease, me, clock, stale));
    if live {
        tx.execute(&sql::CANCEL_HELD, &[task.into(), now.as_str().into()])?;
        tx.notify(task, "cancel")?;
    } else {
        tx.execute(&sql::CANCEL_FREE, &[task.into(), now.as_str().into()])?;
    }
    Ok(live)
}

/// Deletes the finished tasks last updated before `finished_before` that
/// no live runner holds; their ids.
pub(crate) fn gc(
    tx: &mut dyn Tx,
    finished_before: &str,
    (me, stale): (&Holder, std::time::Duration),
) -> Result<Vec<String>> {
    let mut candidates = Vec::new();
    tx.query(&sql::GC_CANDIDATES, &[finished_before.into()], &mut |row| {
        candidates.push((row.some_text(0)?.to_owned(), lease_at(row, 1)?));
        Ok(())
    })?;
    let clock = tx.now_ms()?;
    let mut removed = Vec::new();
    for (id, lease) in candidates {
        if lease.is_some_and(|lease| lease::is_live(&lease, me, clock, stale)) {
            continue;
        }
        tx.execute(&sql::DELETE_TASK, &[id.as_str().into()])?;
        removed.push(id);
    }
    if !removed.is_empty() {
        super::chats::sweep(tx)?;
    }
    Ok(removed)
}

/// Lets go of a worker's claim on a task; the workers hear of it (the one
/// whose run released it fills its place at once).
pub(crate) fn release_claim(tx: &mut dyn Tx, task: &str, worker: &str) -> Result<()> {
    tx.execute_later(&sql::RELEASE_CLAIM, &[task.into(), worker.into()])?;
    tx.notify_workers(super::news::RELEASED)
}

/// Claims for `worker` those of `tasks` (all of `queue`) no other worker
/// holds, keeping the queue's running and claimed tasks within
/// `concurrency`; the ids claimed, in the order of `tasks`.
pub(crate) fn claim(
    tx: &mut dyn Tx,
    queue: &str,
    tasks: &[String],
    worker: &str,
    concurrency: Option<u32>,
    stale: Duration,
) -> Result<Vec<String>> {
    let stale = Arg::Int(i64::try_from(stale.as_millis()).unwrap_or(i64::MAX));
    let wanted = match concurrency {
        None => tasks,
        Some(limit) => {
            // One claimer of the queue at a time: the count stays true
            // until the commit.
            tx.query(&sql::LOCK_QUEUE, &[queue.into()], &mut |_| Ok(()))?;
            let active = tx
                .query_opt(&sql::ACTIVE_IN_QUEUE, &[queue.into(), stale], |row| {
                    row.some_int(0)
                })?
                .unwrap_or(0);
            let room = (i64::from(limit) - active).max(0) as usize;
            &tasks[..room.min(tasks.len())]
        }
    };
    let mut claimed = Vec::new();
    // With the COMMIT: a claim of tasks alone is one round trip.
    tx.query_last(
        &sql::CLAIM,
        &[Arg::Texts(wanted), worker.into(), stale],
        &mut |row| {
            claimed.push(row.some_text(0)?.to_owned());
            Ok(())
        },
    )?;
    claimed.sort_by_key(|id| wanted.iter().position(|wanted| wanted == id));
    Ok(claimed)
}

/// Records the worker as live, with the tasks it runs now.
pub(crate) fn worker_heartbeat(tx: &mut dyn Tx, worker: &WorkerRecord) -> Result<()> {
    let queues = serde_json::to_string(&worker.queues)?;
    let tasks = serde_json::to_string(&worker.tasks)?;
    tx.execute(
        &sql::WORKER_HEARTBEAT,
        &[
            worker.id.as_str().into(),
            worker.host.as_str().into(),
            worker.pid.into(),
            queues.as_str().into(),
            worker.jobs.into(),
            worker.started_at.as_str().into(),
            tasks.as_str().into(),
        ],
    )?;
    Ok(())
}

/// A worker that stopped: its row and its claims go.
pub(crate) fn worker_gone(tx: &mut dyn Tx, worker: &str) -> Result<()> {
    tx.execute(&sql::DELETE_WORKER, &[worker.into()])?;
    tx.execute(&sql::RELEASE_CLAIMS_OF, &[worker.into()])?;
    tx.notify_workers(super::news::WORKER)
}

/// Counts one of a task's retries and queues it again; false (and the
/// caller rolls back) when its retries ran out or it is not failed.
pub(crate) fn start_retry(tx: &mut dyn Tx, task: &str, used: u32) -> Result<bool> {
    let counted = tx.execute(&sql::COUNT_RETRY, &[task.into(), used.into()])?;
    let retried = tx.execute(
        &sql::RETRY_TASK,
        &[task.into(), crate::journal::now().as_str().into()],
    )?;
    Ok(counted == 1 && retried == 1)
}
