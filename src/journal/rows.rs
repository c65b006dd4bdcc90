//! Rows into records, the same for every backend.
//!
//! A backend reads its row's columns (in the order of [`STEP_COLUMNS`] and
//! [`TASK_COLUMNS`]) into [`StepColumns`] or [`TaskColumns`]; everything
//! the columns mean (enum texts, JSON, defaults) is decided once, here.

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::{
    ResolutionKind, SignalRecord, StepError, StepKind, StepRecord, StepStatus, TaskRecord,
    TaskStatus, WorkerRecord,
};
use crate::config::SyncMode;
use crate::error::Failure;
use crate::json_text::JsonText;
use crate::lease::Lease;
use crate::protocol::{Effect, ErrorCode};

/// When task `t` or its last live step last changed (SQLite reads
/// `greatest` as its scalar `max`).
macro_rules! updated_at {
    () => {
        "greatest(t.updated_at, coalesce((SELECT coalesce(s.finished_at, s.started_at) FROM steps s
        WHERE s.task_id = t.id AND s.status <> 'discarded' ORDER BY s.step_index DESC LIMIT 1), ''))"
    };
}

/// The task columns every backend selects, in the order [`TaskColumns`]
/// reads them.
pub(crate) const TASK_COLUMNS: &str = concat!(
    "t.id, t.status, t.argv, t.cwd, t.config, t.config_path, t.sync_mode, t.exit_code,
    t.output, t.runs, t.lease_host, t.lease_pid, t.lease_pid_start, t.lease_heartbeat, t.lease_run,
    t.created_at, ",
    updated_at!(),
    ",
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status <> 'discarded'),
    (SELECT CAST(coalesce(sum(r.tokens_spent), 0) AS BIGINT) FROM runs r WHERE r.task_id = t.id),
    (SELECT CAST(coalesce(sum(r.tokens_saved), 0) AS BIGINT) FROM runs r WHERE r.task_id = t.id),
    t.max_tokens, t.queue, t.imported_at, t.launch,
    (SELECT CAST(coalesce(sum(r.cost_spent_nanos), 0) AS BIGINT) FROM runs r WHERE r.task_id = t.id),
    (SELECT CAST(coalesce(sum(r.cost_saved_nanos), 0) AS BIGINT) FROM runs r WHERE r.task_id = t.id),
    (SELECT CAST(coalesce(sum(r.unpriced_steps), 0) AS BIGINT) FROM runs r WHERE r.task_id = t.id),
    t.max_cost_nanos"
);

/// How many columns [`TASK_COLUMNS`] selects.
#[cfg(test)]
pub(crate) const TASK_WIDTH: usize = 28;

/// What a worker's look reads of a task into a [`super::Candidate`], in
/// this order: none of [`TASK_COLUMNS`]' counts and sums over the task's
/// steps and runs, which cost a look with a page of tasks more than all
/// the rest of it (about 45 µs a row on PostgreSQL).
pub(crate) const CANDIDATE_COLUMNS: &str = concat!(
    "t.id, t.status, t.lease_host, t.lease_pid, t.lease_pid_start, t.lease_heartbeat, t.lease_run, t.queue, ",
    updated_at!()
);

/// How many columns [`CANDIDATE_COLUMNS`] selects.
pub(crate) const CANDIDATE_WIDTH: usize = 9;

/// The step columns every backend selects, in this order.
pub(crate) const STEP_COLUMNS: &str = "step_index, tool_name, kind, effect, args, args_hash, idempotency_key, status,
    attempts, output, error_code, error, usage, tokens, run, created_at, started_at, finished_at, resolution, id,
    seen_from, wake_at, cost_nanos, request_hash";

/// A step row as read, before its texts are checked.
pub(crate) struct StepColumns<'a> {
    pub(crate) step: i64,
    pub(crate) name: String,
    pub(crate) kind: &'a str,
    pub(crate) effect: &'a str,
    pub(crate) args: &'a str,
    pub(crate) args_hash: String,
    pub(crate) idempotency_key: String,
    pub(crate) status: &'a str,
    pub(crate) attempts: i64,
    pub(crate) output: Option<&'a str>,
    pub(crate) error_code: Option<&'a str>,
    pub(crate) error: Option<String>,
    pub(crate) usage: Option<&'a str>,
    pub(crate) tokens: i64,
    pub(crate) run: i64,
    pub(crate) created_at: String,
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
    pub(crate) resolution: Option<&'a str>,
    pub(crate) seen_from: Option<i64>,
    pub(crate) wake_at: Option<String>,
    pub(crate) cost_nanos: Option<i64>,
    pub(crate) request_hash: Option<String>,
}

impl StepColumns<'_> {
    pub(crate) fn record(self) -> Result<StepRecord> {
        let error = match (self.error_code, self.error) {
            (code, Some(message)) => Some(StepError {
                code: match code {
                    Some(code) => {
                        ErrorCode::parse(code).ok_or_else(|| bad_column("error code", code))?
                    }
                    None => ErrorCode::ToolFailed,
                },
                message,
            }),
            _ => None,
        };
        Ok(StepRecord {
            step: self.step as u64,
            name: self.name,
            kind: StepKind::parse(self.kind).ok_or_else(|| bad_column("step kind", self.kind))?,
            effect: Effect::parse(self.effect).ok_or_else(|| bad_column("effect", self.effect))?,
            args: JsonText::from_text(self.args).context("the journal holds malformed args")?,
            args_hash: self.args_hash,
            idempotency_key: self.idempotency_key,
            status: StepStatus::parse(self.status)
                .ok_or_else(|| bad_column("step status", self.status))?,
            attempts: self.attempts as u32,
            output: json(self.output)?,
            error,
            usage: json(self.usage)?,
            tokens: self.tokens as u64,
            run: self.run as u32,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            resolution: self
                .resolution
                .map(|text| {
                    ResolutionKind::parse(text).ok_or_else(|| bad_column("resolution", text))
                })
                .transpose()?,
            seen_from: self.seen_from.map(|step| step as u64),
            wake_at: self.wake_at,
            cost_nanos: self.cost_nanos.map(|nanos| nanos as u64),
            request_hash: self.request_hash,
        })
    }
}

/// A task row as read, before its texts are checked; `lease` and the
/// counts come ready from the backend.
pub(crate) struct TaskColumns<'a> {
    pub(crate) id: String,
    pub(crate) status: &'a str,
    pub(crate) argv: &'a str,
    pub(crate) cwd: String,
    pub(crate) config: Option<String>,
    pub(crate) config_path: Option<String>,
    pub(crate) sync: &'a str,
    pub(crate) exit_code: Option<i32>,
    pub(crate) output: Option<&'a str>,
    pub(crate) runs: i64,
    pub(crate) lease: Option<Lease>,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
    pub(crate) steps: i64,
    pub(crate) tokens_spent: i64,
    pub(crate) tokens_saved: i64,
    pub(crate) max_tokens: Option<i64>,
    pub(crate) queue: Option<String>,
    pub(crate) imported_at: Option<String>,
    pub(crate) launch: Option<&'a str>,
    /// What its runs spent, saved by replay, and left unpriced.
    pub(crate) cost: [i64; 3],
    pub(crate) max_cost_nanos: Option<i64>,
}

impl TaskColumns<'_> {
    pub(crate) fn record(self) -> Result<TaskRecord> {
        Ok(TaskRecord {
            id: self.id,
            status: TaskStatus::parse(self.status)
                .ok_or_else(|| bad_column("task status", self.status))?,
            argv: serde_json::from_str(self.argv).context("the journal holds a malformed argv")?,
            cwd: self.cwd,
            config: self.config,
            config_path: self.config_path,
            sync: SyncMode::parse(self.sync).ok_or_else(|| bad_column("sync mode", self.sync))?,
            exit_code: self.exit_code,
            output: self
                .output
                .map(|text| {
                    serde_json::from_str::<Value>(text).context("the journal holds malformed JSON")
                })
                .transpose()?,
            runs: self.runs as u32,
            lease: self.lease,
            created_at: self.created_at,
            updated_at: self.updated_at,
            steps: self.steps as u64,
            tokens_spent: self.tokens_spent as u64,
            tokens_saved: self.tokens_saved as u64,
            max_tokens: self.max_tokens.map(|max| max as u64),
            max_cost_nanos: self.max_cost_nanos.map(|max| max as u64),
            queue: self.queue,
            imported_at: self.imported_at,
            launch: self
                .launch
                .map(|text| serde_json::from_str(text).map_err(|_| bad_column("launch", text)))
                .transpose()?
                .unwrap_or_default(),
            cost: crate::journal::Cost {
                spent_nanos: self.cost[0] as u64,
                saved_nanos: self.cost[1] as u64,
                unpriced_steps: self.cost[2] as u64,
            },
        })
    }
}

/// The signal columns every backend selects, in this order.
/// The text columns of a step's row, as both backends write them.
pub(crate) struct StepTexts<'a> {
    pub(crate) output: Option<&'a str>,
    pub(crate) usage: Option<&'a str>,
    pub(crate) error_code: Option<&'static str>,
    pub(crate) error: Option<&'a str>,
}

impl<'a> StepTexts<'a> {
    pub(crate) fn of(step: &'a StepRecord) -> Self {
        let (error_code, error) = match &step.error {
            Some(error) => (Some(error.code.as_str()), Some(error.message.as_str())),
            None => (None, None),
        };
        Self {
            output: step.output.as_ref().map(crate::json_text::JsonText::as_str),
            usage: step.usage.as_ref().map(crate::json_text::JsonText::as_str),
            error_code,
            error,
        }
    }
}

pub(crate) const SIGNAL_COLUMNS: &str = "name, data, signal_id, sent_by, sent_at, taken_by";

/// A signal row as read, before its data is checked.
pub(crate) struct SignalColumns<'a> {
    pub(crate) name: String,
    pub(crate) data: &'a str,
    pub(crate) signal_id: Option<String>,
    pub(crate) sent_by: String,
    pub(crate) sent_at: String,
    pub(crate) taken_by: Option<i64>,
}

impl SignalColumns<'_> {
    pub(crate) fn record(self) -> Result<SignalRecord> {
        Ok(SignalRecord {
            name: self.name,
            data: serde_json::from_str(self.data)
                .context("the journal holds a signal with malformed JSON data")?,
            signal_id: self.signal_id,
            sent_by: self.sent_by,
            sent_at: self.sent_at,
            taken_by: self.taken_by.map(|step| step as u64),
        })
    }
}

/// A worker's row, as both backends store it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn worker(
    id: String,
    host: String,
    pid: i64,
    queues: &str,
    jobs: i64,
    started_at: String,
    heartbeat_ms: i64,
    tasks: &str,
) -> Result<WorkerRecord> {
    Ok(WorkerRecord {
        id,
        host,
        pid: pid as u32,
        queues: serde_json::from_str(queues).context("the journal holds a malformed worker row")?,
        jobs: jobs as u32,
        started_at,
        heartbeat_ms,
        tasks: serde_json::from_str(tasks).context("the journal holds a malformed worker row")?,
    })
}

/// The columns of a lease, as both backends store them.
pub(crate) fn lease(
    host: Option<String>,
    pid: Option<i64>,
    pid_start: Option<i64>,
    heartbeat_ms: Option<i64>,
    run: Option<i64>,
) -> Option<Lease> {
    match (host, pid) {
        (Some(host), Some(pid)) => Some(Lease {
            host,
            pid: pid as u32,
            pid_start: pid_start.map(|start| start as u64),
            heartbeat_ms: heartbeat_ms.unwrap_or(0),
            run: run.unwrap_or(0) as u32,
        }),
        _ => None,
    }
}

/// A nullable JSON column: checked, kept as text.
fn json(text: Option<&str>) -> Result<Option<JsonText>> {
    text.map(|text| JsonText::from_text(text).context("the journal holds malformed JSON"))
        .transpose()
}

pub(crate) fn bad_column(column: &str, value: &str) -> anyhow::Error {
    Failure::journal(format!("the journal holds an unknown {column} {value:?}")).into()
}

/// A JSON array of step numbers as a column holds it (`runs.unreplayed`);
/// none for NULL or anything else.
pub(crate) fn step_list(text: Option<&str>) -> Vec<u64> {
    text.and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}
