//! Plain records that cross the journal boundary.

use serde_json::Value;

use crate::json_text::JsonText;

use crate::config::{StdinMode, SyncMode};
use crate::lease::Lease;
use crate::protocol::{Effect, ErrorCode};

macro_rules! text_enum {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            pub(crate) fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
            pub(crate) fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some(Self::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskStatus {
    Running,
    Completed,
    Failed,
    Interrupted,
    Cancelled,
    /// Parked on a `wait` step until a signal comes (SPEC 8).
    Waiting,
    /// Parked on a `sleep` step until its time comes.
    Sleeping,
    /// Its token budget is spent (SPEC 9).
    OverBudget,
    /// Submitted, not run yet: a worker takes it (SPEC 11).
    Queued,
}
text_enum!(TaskStatus {
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Interrupted => "interrupted",
    Cancelled => "cancelled",
    Waiting => "waiting",
    Sleeping => "sleeping",
    OverBudget => "over_budget",
    Queued => "queued",
});

impl TaskStatus {
    /// Parked: resumable once its signal or its time comes.
    pub(crate) fn is_parked(self) -> bool {
        matches!(self, Self::Waiting | Self::Sleeping)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepKind {
    Call,
    Begin,
    /// Waits for a signal (SPEC 8).
    Wait,
    /// Waits for a time.
    Sleep,
    /// A request through the model/API proxy (SPEC 12), replayed by
    /// content, not position.
    Proxy,
    /// An MCP `tools/call` (SPEC 13), replayed by content.
    Mcp,
    /// Starts a child task (SPEC 16).
    Spawn,
    /// Waits for a child task to end.
    Join,
}
text_enum!(StepKind { Call => "call", Begin => "begin", Wait => "wait", Sleep => "sleep", Proxy => "proxy", Mcp => "mcp", Spawn => "spawn", Join => "join" });

impl StepKind {
    /// Replayed by content (a request matched by name and args), not by
    /// its place among the agent's protocol steps.
    pub(crate) fn by_content(self) -> bool {
        matches!(self, StepKind::Proxy | StepKind::Mcp)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepStatus {
    Pending,
    Committed,
    Failed,
    Discarded,
    /// A `wait` or `sleep` step whose signal or time has not come.
    Waiting,
}
text_enum!(StepStatus {
    Pending => "pending",
    Committed => "committed",
    Failed => "failed",
    Discarded => "discarded",
    Waiting => "waiting",
});

/// A task as `run` creates it.
#[derive(Debug, Clone)]
pub(crate) struct NewTask {
    pub(crate) id: String,
    pub(crate) argv: Vec<String>,
    pub(crate) cwd: String,
    /// The text of the `durun.toml` the task started with.
    pub(crate) config: Option<String>,
    pub(crate) config_path: Option<String>,
    pub(crate) sync: SyncMode,
    pub(crate) created_at: String,
    /// The token budget (SPEC 9), if any.
    pub(crate) max_tokens: Option<u64>,
    /// The budget in nano-dollars (SPEC 19), if any.
    pub(crate) max_cost_nanos: Option<u64>,
    /// `submit`: the queue the task waits in, `queued`, for a worker.
    pub(crate) queue: Option<String>,
    /// `submit`: runs after failed ones and the first one's backoff in
    /// milliseconds (SPEC 16), recorded with the task, in its transaction:
    /// a worker never sees the task without them.
    pub(crate) retries: Option<(u32, u64)>,
    /// What every run of the task is started with.
    pub(crate) launch: Launch,
}

/// What a task's first run was started with beyond its command, directory
/// and config, so that every resume (in another shell, on a worker) starts
/// its agent the same way (SPEC 17, 18). Stored as JSON; a field a newer
/// durun added is passed over.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Launch {
    /// The agent's stdin, when `--stdin` chose it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stdin: Option<StdinMode>,
    /// The model upstreams durun's environment named, by variable
    /// (`OPENAI_BASE_URL`): a resume without them sends the agent's model
    /// calls where the first run did.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) upstreams: std::collections::BTreeMap<String, String>,
    /// The preset `--preset` chose (a name, or `none`); else the one
    /// found by the program's name at each start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) preset: Option<String>,
}

impl Launch {
    /// As the journal's column holds it: nothing when there is nothing.
    pub(crate) fn column(&self) -> Option<String> {
        (*self != Self::default()).then(|| serde_json::to_string(self).unwrap_or_default())
    }
}

impl NewTask {
    /// The task as [`crate::journal::Journal::create_task`] writes it and
    /// [`crate::journal::Journal::task`] would read it back: nothing run,
    /// nothing spent, no lease (both journals' story checks the two agree).
    pub(crate) fn record(&self) -> TaskRecord {
        TaskRecord {
            id: self.id.clone(),
            status: if self.queue.is_some() {
                TaskStatus::Queued
            } else {
                TaskStatus::Running
            },
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            config: self.config.clone(),
            config_path: self.config_path.clone(),
            sync: self.sync,
            exit_code: None,
            output: None,
            runs: 0,
            lease: None,
            created_at: self.created_at.clone(),
            updated_at: self.created_at.clone(),
            steps: 0,
            tokens_spent: 0,
            tokens_saved: 0,
            max_tokens: self.max_tokens,
            max_cost_nanos: self.max_cost_nanos,
            queue: self.queue.clone(),
            imported_at: None,
            launch: self.launch.clone(),
            cost: Cost::default(),
        }
    }
}

/// A task a worker might claim, as its look reads it: what decides
/// whether to take it, nothing more.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) id: String,
    /// As stored: `running` even when its runner died (see `lease`).
    pub(crate) status: TaskStatus,
    pub(crate) lease: Option<Lease>,
    /// When the task or its last live step last changed.
    pub(crate) updated_at: String,
    pub(crate) queue: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct TaskRecord {
    pub(crate) id: String,
    /// As stored: `running` even when its runner died (see `lease`).
    pub(crate) status: TaskStatus,
    pub(crate) argv: Vec<String>,
    pub(crate) cwd: String,
    pub(crate) config: Option<String>,
    pub(crate) config_path: Option<String>,
    pub(crate) sync: SyncMode,
    pub(crate) exit_code: Option<i32>,
    pub(crate) output: Option<Value>,
    pub(crate) runs: u32,
    pub(crate) lease: Option<Lease>,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
    /// Steps that take part in replay.
    pub(crate) steps: u64,
    pub(crate) tokens_spent: u64,
    pub(crate) tokens_saved: u64,
    /// The token budget over all runs, if any.
    pub(crate) max_tokens: Option<u64>,
    /// The budget in nano-dollars over all runs, if any.
    pub(crate) max_cost_nanos: Option<u64>,
    /// The queue of a submitted task.
    pub(crate) queue: Option<String>,
    /// When the task was imported (SPEC 10), if it was.
    pub(crate) imported_at: Option<String>,
    /// What every run of the task is started with.
    pub(crate) launch: Launch,
    /// What its runs spent and saved, in money (SPEC 19).
    pub(crate) cost: Cost,
}

/// Money (SPEC 19), in nano-dollars: what steps cost at their model's
/// price, and how many steps reported tokens at a model without one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cost {
    pub(crate) spent_nanos: u64,
    /// What the steps answered from the journal cost when they ran.
    pub(crate) saved_nanos: u64,
    pub(crate) unpriced_steps: u64,
}

/// What one run did, as counted while it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RunStats {
    pub(crate) replayed_steps: u64,
    /// Of the replayed steps, how many the journal's events hold already
    /// (not a column): a write notes the rest as one `step.replayed` event.
    pub(crate) replays_noted: u64,
    pub(crate) executed_steps: u64,
    pub(crate) tokens_spent: u64,
    pub(crate) tokens_saved: u64,
    pub(crate) cost: Cost,
}

/// One row of a task's events (SPEC 20), with the name and tokens of the
/// step it is about as the step stands now.
#[derive(Debug, Clone)]
pub(crate) struct EventRow {
    pub(crate) id: i64,
    pub(crate) run: u32,
    /// `run.opened`, `step.finished`, ...
    pub(crate) kind: String,
    /// The step's number; for `step.replayed`, the first of the run's
    /// replayed steps, counted from 1.
    pub(crate) step: Option<u64>,
    /// For `step.replayed`: the last of them.
    pub(crate) last_step: Option<u64>,
    pub(crate) at: String,
    pub(crate) name: Option<String>,
    pub(crate) tokens: Option<u64>,
}

#[derive(Debug, Clone)]
pub(crate) struct RunRecord {
    pub(crate) run: u32,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) stats: RunStats,
    /// Recorded proxy and MCP steps no request of this run asked for.
    pub(crate) unreplayed: Vec<u64>,
    /// Why durun ended the run, as it told the user: `durun: …` and the
    /// lines after it (a divergence's diff); None when the agent's exit
    /// ended it.
    pub(crate) error: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) enum RunStart {
    /// `leased_at` is [`crate::os::boot_clock`] just before the lease was
    /// stamped, after any wait for a lock: the run's first heartbeat.
    ///
    /// `recorded` is how many live steps the task has and its highest step
    /// number, read once the lease was ours: what the run may replay.
    Started {
        run: u32,
        leased_at: std::time::Duration,
        recorded: (u64, u64),
    },
    Locked(Lease),
    /// `durun cancel` ended the task: it never runs again.
    Cancelled,
}

/// What [`super::Journal::open_run`] did with a task.
#[derive(Debug)]
pub(crate) enum Opened {
    /// The journal holds no such task.
    Unknown,
    /// The task, which was not to be started here: nothing was written.
    Read(TaskRecord),
    /// The task, as read before the start, and the start.
    Tried(TaskRecord, RunStart),
}

#[derive(Debug, Clone)]
pub(crate) struct RunEnd {
    pub(crate) status: TaskStatus,
    pub(crate) exit_code: Option<i32>,
    pub(crate) finished_at: String,
    /// See [`RunRecord::error`].
    pub(crate) error: Option<String>,
    /// A worker's claim on the task, released in the end's transaction.
    pub(crate) release: Option<super::Claim>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StepError {
    /// The protocol error code the step failed with.
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

#[derive(Debug, Clone)]
pub(crate) struct StepRecord {
    pub(crate) step: u64,
    /// The tool of a `call`, the name of a `begin`.
    pub(crate) name: String,
    pub(crate) kind: StepKind,
    pub(crate) effect: Effect,
    pub(crate) args: JsonText,
    pub(crate) args_hash: String,
    pub(crate) idempotency_key: String,
    pub(crate) status: StepStatus,
    pub(crate) attempts: u32,
    pub(crate) output: Option<JsonText>,
    pub(crate) error: Option<StepError>,
    pub(crate) usage: Option<JsonText>,
    /// Input plus output tokens from `usage`.
    pub(crate) tokens: u64,
    /// The run that last wrote the step.
    pub(crate) run: u32,
    pub(crate) created_at: String,
    /// When its latest attempt started.
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
    /// How an operator settled the step, if one did.
    pub(crate) resolution: Option<ResolutionKind>,
    /// For a failed step: the first step number the agent could open after
    /// its failure reached it. A failure replays only if the journal holds
    /// a step from there on (the agent went on knowing of it); otherwise
    /// it runs again (SPEC 3.2).
    pub(crate) seen_from: Option<u64>,
    /// A `sleep` step's wake time, or a `wait` step's timeout, fixed when
    /// the step is first opened (RFC 3339).
    pub(crate) wake_at: Option<String>,
    /// What it cost at its model's price (SPEC 19), in nano-dollars; `None`
    /// without usage, or for a model without a price.
    pub(crate) cost_nanos: Option<u64>,
    /// A proxied request's bytes as sent, hashed with what else makes its
    /// args (`proxy::request::request_hash`); `None` for any other step, and for a
    /// request recorded before durun kept it.
    pub(crate) request_hash: Option<String>,
}

/// A failed task with retries left (SPEC 16).
#[derive(Debug, Clone)]
pub(crate) struct Retryable {
    pub(crate) id: String,
    pub(crate) queue: Option<String>,
    /// When it last changed: when its run failed.
    pub(crate) failed_at: String,
    pub(crate) exit_code: Option<i32>,
    pub(crate) retries: u32,
    pub(crate) backoff_ms: u64,
    /// Retries it had.
    pub(crate) used: u32,
}

/// A signal sent to a task (SPEC 8), as the journal keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SignalRecord {
    pub(crate) name: String,
    pub(crate) data: Value,
    /// The sender's id for it (`--id`): the same id twice is kept once.
    pub(crate) signal_id: Option<String>,
    /// `user@host` of the sender.
    pub(crate) sent_by: String,
    pub(crate) sent_at: String,
    /// The `wait` step that took it.
    pub(crate) taken_by: Option<u64>,
}

impl SignalRecord {
    /// The output of the `wait` step that takes it.
    pub(crate) fn output(&self) -> Value {
        serde_json::json!({
            "signal": self.name,
            "data": self.data,
            "by": self.sent_by,
            "at": self.sent_at,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ResolutionAction {
    /// Run the step again on the next resume, even for an `in_doubt = "ask"` tool.
    Retry,
    /// The step took effect with this output.
    Output(Value),
    /// The step failed with this message; it replays as a failure.
    Fail(String),
}

impl ResolutionAction {
    pub(crate) fn kind(&self) -> ResolutionKind {
        match self {
            Self::Retry => ResolutionKind::Retry,
            Self::Output(_) => ResolutionKind::Output,
            Self::Fail(_) => ResolutionKind::Fail,
        }
    }
}

/// How an operator settled a step, as the journal keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResolutionKind {
    /// Run it again (once) on the next resume.
    Retry,
    /// It took effect with the given output.
    Output,
    /// It failed; it replays as a failure.
    Fail,
    /// Its output was edited by `durun fork --output` (SPEC 20): it
    /// replays with the edited output.
    Edited,
    /// It was in doubt, and its probe said it took effect, with this
    /// output (SPEC 22).
    Reconciled,
}
text_enum!(ResolutionKind {
    Retry => "retry",
    Output => "output",
    Fail => "fail",
    Edited => "edited",
    Reconciled => "reconciled",
});

#[derive(Debug, Clone)]
pub(crate) struct Resolution {
    pub(crate) action: ResolutionAction,
    /// `user@host` of the operator.
    pub(crate) by: String,
    pub(crate) at: String,
}

/// What a resolution does to its step, the same on every backend; returns
/// the value the resolutions table keeps (the output or the message).
pub(crate) fn apply_resolution(record: &mut StepRecord, resolution: &Resolution) -> Option<String> {
    let value = match &resolution.action {
        ResolutionAction::Retry => {
            record.status = StepStatus::Pending;
            None
        }
        ResolutionAction::Output(output) => {
            record.status = StepStatus::Committed;
            record.output = Some(crate::json_text::JsonText::from_value(output));
            record.error = None;
            record.finished_at = Some(resolution.at.clone());
            Some(serde_json::to_string(output).expect("JSON serializes"))
        }
        ResolutionAction::Fail(message) => {
            record.status = StepStatus::Failed;
            record.error = Some(StepError {
                code: ErrorCode::ToolFailed,
                message: message.clone(),
            });
            record.finished_at = Some(resolution.at.clone());
            Some(message.clone())
        }
    };
    record.resolution = Some(resolution.action.kind());
    value
}

/// One task's rows as JSON objects, column name to value, as the journal
/// holds them: what `export` writes and `import` and `fork` load.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TaskRows {
    pub(crate) task: serde_json::Map<String, Value>,
    pub(crate) runs: Vec<serde_json::Map<String, Value>>,
    pub(crate) steps: Vec<serde_json::Map<String, Value>>,
    pub(crate) signals: Vec<serde_json::Map<String, Value>>,
    pub(crate) resolutions: Vec<serde_json::Map<String, Value>>,
}

/// A worker as the journal lists it (SPEC 11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerRecord {
    /// `host:pid`.
    pub(crate) id: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) queues: Vec<String>,
    pub(crate) jobs: u32,
    pub(crate) started_at: String,
    /// Milliseconds since the epoch, on the journal's clock.
    pub(crate) heartbeat_ms: i64,
    /// The tasks it runs now.
    pub(crate) tasks: Vec<String>,
}

#[cfg(test)]
impl StepRecord {
    /// Step `n`, a `mutate` `begin` named `llm` with status `status`:
    /// tests change what they need of it.
    pub(crate) fn sample(n: u64, status: StepStatus) -> Self {
        Self {
            step: n,
            name: "llm".into(),
            kind: StepKind::Begin,
            effect: Effect::Mutate,
            args: JsonText::null(),
            args_hash: "h".into(),
            idempotency_key: "k".into(),
            status,
            cost_nanos: None,
            attempts: 1,
            output: None,
            error: None,
            usage: None,
            tokens: 0,
            run: 1,
            created_at: String::new(),
            started_at: String::new(),
            finished_at: None,
            resolution: None,
            seen_from: None,
            wake_at: None,
            request_hash: None,
        }
    }
}
