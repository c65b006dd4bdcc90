//! `inspect --json` (SPEC 6): the task list, and one task with its runs and
//! steps. Step JSON is embedded as the journal holds it, never parsed and
//! printed again, and streamed: 100,000 steps stay fast.

use serde_json::{Value, json};

use crate::journal::{ResolutionKind, RunRecord, SignalRecord, StepKind, StepRecord, TaskRecord};
use crate::json_text::JsonText;
use crate::task::Shown;

/// A worker; `stale` when it missed two heartbeats (`late`).
pub(super) fn worker_json(
    worker: &crate::journal::WorkerRecord,
    now_ms: i64,
    late: std::time::Duration,
) -> Value {
    let beat = now_ms.saturating_sub(worker.heartbeat_ms);
    json!({
        "stale": beat > late.as_millis() as i64,
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": worker.queues,
        "jobs": worker.jobs,
        "tasks": worker.tasks,
        "started_at": worker.started_at,
        "heartbeat_ms": worker.heartbeat_ms,
    })
}

/// The holder of a running task's lease: the worker (or runner) on it,
/// also while it keeps the agent waiting.
fn held_by(task: &TaskRecord, shown: &Shown) -> Value {
    match &task.lease {
        Some(lease) if shown.driven() => {
            json!({"host": lease.host, "pid": lease.pid, "run": lease.run})
        }
        _ => Value::Null,
    }
}

pub(super) fn task_summary_json(task: &TaskRecord, shown: &Shown) -> Value {
    json!({
        "id": task.id,
        "status": shown.status.as_str(),
        "queue": task.queue,
        "held_by": held_by(task, shown),
        "command": task.argv,
        "steps": task.steps,
        "tokens_spent": task.tokens_spent,
        "tokens_saved": task.tokens_saved,
        "cost_usd": crate::prices::usd(task.cost.spent_nanos),
        "cost_saved_usd": crate::prices::usd(task.cost.saved_nanos),
        "unpriced_steps": task.cost.unpriced_steps,
        "max_tokens": task.max_tokens,
        "max_usd": task.max_cost_nanos.map(crate::prices::usd),
        "created_at": task.created_at,
        "updated_at": task.updated_at,
    })
}

/// `inspect TASK --json` (SPEC 6) is `{"task": TaskOut, "steps": [StepOut]}`.
/// Step JSON is embedded as the journal holds it, never parsed and printed
/// again, and streamed: 100,000 steps stay fast.
#[derive(serde::Serialize)]
pub(super) struct TaskOut<'a> {
    id: &'a str,
    status: &'static str,
    command: &'a [String],
    cwd: &'a str,
    exit_code: Option<i32>,
    output: &'a Option<Value>,
    sync: &'static str,
    config_path: &'a Option<String>,
    steps: u64,
    tokens_spent: u64,
    tokens_saved: u64,
    /// What its runs spent at their models' prices (SPEC 19), what replay
    /// saved, and the steps that reported tokens at a model without a
    /// price (their cost is not in the sums).
    cost_usd: f64,
    cost_saved_usd: f64,
    unpriced_steps: u64,
    max_tokens: Option<u64>,
    max_usd: Option<f64>,
    queue: &'a Option<String>,
    held_by: Value,
    waiting_for: Option<Value>,
    created_at: &'a str,
    updated_at: &'a str,
    runs: Vec<RunOut<'a>>,
    signals: Vec<SignalOut<'a>>,
    /// SPEC 16: the task that spawned it, and those it spawned.
    parent: Option<&'a str>,
    children: Vec<Value>,
}

#[derive(serde::Serialize)]
pub(super) struct SignalOut<'a> {
    name: &'a str,
    data: &'a Value,
    id: &'a Option<String>,
    by: &'a str,
    at: &'a str,
    taken_by_step: Option<u64>,
}

#[derive(serde::Serialize)]
pub(super) struct RunOut<'a> {
    run: u32,
    exit_code: Option<i32>,
    replayed_steps: u64,
    executed_steps: u64,
    tokens_spent: u64,
    tokens_saved: u64,
    cost_usd: f64,
    cost_saved_usd: f64,
    unpriced_steps: u64,
    host: &'a str,
    pid: u32,
    started_at: &'a str,
    finished_at: &'a Option<String>,
    /// Recorded proxy and MCP steps no request of this run asked for.
    #[serde(skip_serializing_if = "<[u64]>::is_empty")]
    not_replayed: &'a [u64],
    /// Why durun ended the run (a divergence and its diff, say), as it
    /// told the user.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: &'a Option<String>,
}

#[derive(serde::Serialize)]
pub(super) struct StepOut<'a> {
    step: u64,
    name: &'a str,
    kind: &'static str,
    effect: &'static str,
    status: &'static str,
    args: &'a JsonText,
    args_hash: &'a str,
    idempotency_key: &'a str,
    attempts: u32,
    output: &'a Option<JsonText>,
    error: Option<ErrorOut<'a>>,
    usage: &'a Option<JsonText>,
    tokens: u64,
    /// Its cost at its model's price; `null` without usage or a price.
    cost_usd: Option<f64>,
    resolution: Option<&'static str>,
    created_at: &'a str,
    started_at: &'a str,
    finished_at: &'a Option<String>,
}

#[derive(serde::Serialize)]
pub(super) struct ErrorOut<'a> {
    code: &'a str,
    message: &'a str,
}

pub(super) fn task_out<'a>(
    task: &'a TaskRecord,
    runs: &'a [RunRecord],
    shown: &Shown,
    signals: &'a [SignalRecord],
    family: &'a crate::task::Family,
) -> TaskOut<'a> {
    TaskOut {
        parent: family.parent.as_deref(),
        children: family
            .children
            .iter()
            .map(|(id, status)| json!({"id": id, "status": status.as_str()}))
            .collect(),
        id: &task.id,
        status: shown.status.as_str(),
        command: &task.argv,
        cwd: &task.cwd,
        exit_code: task.exit_code,
        output: &task.output,
        sync: task.sync.as_str(),
        config_path: &task.config_path,
        steps: task.steps,
        tokens_spent: task.tokens_spent,
        tokens_saved: task.tokens_saved,
        cost_usd: crate::prices::usd(task.cost.spent_nanos),
        cost_saved_usd: crate::prices::usd(task.cost.saved_nanos),
        unpriced_steps: task.cost.unpriced_steps,
        max_tokens: task.max_tokens,
        max_usd: task.max_cost_nanos.map(crate::prices::usd),
        queue: &task.queue,
        held_by: held_by(task, shown),
        waiting_for: shown.waiting.as_ref().map(|step| {
            json!({
                "step": step.step,
                "kind": step.kind.as_str(),
                "name": step.name,
                "data": match step.kind {
                    StepKind::Wait => step.args.value().get("data").cloned().unwrap_or(Value::Null),
                    _ => Value::Null,
                },
                "until": step.wake_at,
                "live": shown.live,
            })
        }),
        created_at: &task.created_at,
        updated_at: &task.updated_at,
        signals: signals
            .iter()
            .map(|signal| SignalOut {
                name: &signal.name,
                data: &signal.data,
                id: &signal.signal_id,
                by: &signal.sent_by,
                at: &signal.sent_at,
                taken_by_step: signal.taken_by,
            })
            .collect(),
        runs: runs
            .iter()
            .map(|run| RunOut {
                run: run.run,
                exit_code: run.exit_code,
                replayed_steps: run.stats.replayed_steps,
                executed_steps: run.stats.executed_steps,
                tokens_spent: run.stats.tokens_spent,
                tokens_saved: run.stats.tokens_saved,
                cost_usd: crate::prices::usd(run.stats.cost.spent_nanos),
                cost_saved_usd: crate::prices::usd(run.stats.cost.saved_nanos),
                unpriced_steps: run.stats.cost.unpriced_steps,
                host: &run.host,
                pid: run.pid,
                started_at: &run.started_at,
                finished_at: &run.finished_at,
                not_replayed: &run.unreplayed,
                error: &run.error,
            })
            .collect(),
    }
}

pub(super) fn step_json(step: &StepRecord) -> StepOut<'_> {
    StepOut {
        step: step.step,
        name: &step.name,
        kind: step.kind.as_str(),
        effect: step.effect.as_str(),
        status: step.status.as_str(),
        args: &step.args,
        args_hash: &step.args_hash,
        idempotency_key: &step.idempotency_key,
        attempts: step.attempts,
        output: &step.output,
        error: step.error.as_ref().map(|error| ErrorOut {
            code: error.code.as_str(),
            message: &error.message,
        }),
        usage: &step.usage,
        tokens: step.tokens,
        cost_usd: step.cost_nanos.map(crate::prices::usd),
        resolution: step.resolution.map(ResolutionKind::as_str),
        created_at: &step.created_at,
        started_at: &step.started_at,
        finished_at: &step.finished_at,
    }
}
