//! The supervisor's state: the loop's one struct and the records of the
//! steps in flight, shared by the rooms that act on them (`requests`,
//! `calls`, `commit`, `fencing`, `stopping`), none of which imports
//! another.
//!
//! # Invariant
//!
//! A step number is in at most one of `open` (a `begin` the agent runs),
//! `calls` (a tool durun runs), `waits` (a `wait` or `sleep` waited on
//! live) and the batch or the batch in flight (a write waiting for its
//! commit) at a time; `next_step` is one past every step this run opened.

use std::collections::HashMap;
use std::process::ExitStatus;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::agent_io::AgentIo;
use super::inbox::{Answers, Conn, Events};
use super::recorded::Recorded;
use super::spec::RunSpec;
use crate::config::Tool;
use crate::executor::Cancel;
use crate::journal::{Journal, RunStats, Standing, StepKind, StepRecord};
use crate::protocol::Effect;
use crate::report::Reporter;

pub(super) struct Supervisor<'a> {
    pub(super) spec: &'a RunSpec<'a>,
    /// The journal when it is home; `None` while it is lent to the
    /// committer thread with a batch (the `commit` room).
    pub(super) journal: Option<&'a mut dyn Journal>,
    /// The way to the committer thread and back.
    pub(super) committer: Committer<'a>,
    pub(super) reporter: &'a mut dyn Reporter,
    /// The steps the journal held when the run started, read as reached.
    pub(super) recorded: Recorded,
    /// The highest step number in the journal.
    pub(super) last_recorded: u64,
    pub(super) next_step: u64,
    /// Steps the agent began and has not closed yet.
    pub(super) open: HashMap<u64, OpenStep>,
    /// `call`s whose tool runs.
    pub(super) calls: HashMap<u64, CallInFlight>,
    pub(super) stats: RunStats,
    /// Where answers go, by socket connection (the agent's go to `io`).
    pub(super) writers: HashMap<Conn, Answers>,
    /// The agent's pipes; its answers are written after each batch.
    pub(super) io: AgentIo,
    /// Steps to write in the next commit.
    pub(super) batch: Vec<Deferred>,
    /// The agent asked for more before a commit of its own was answered: it
    /// does not wait for its commits, so they are written off the loop.
    pub(super) pipelined: bool,
    /// Tokens of the steps this run finished, their commits written or
    /// not yet: what the budget counts.
    pub(super) tokens_finished: u64,
    pub(super) events_tx: Events,
    pub(super) child_pid: u32,
    /// Whether a Ctrl-C from the terminal reaches the agent by itself.
    pub(super) interactive: bool,
    pub(super) stop: Option<Stop>,
    pub(super) signal: Option<i32>,
    pub(super) kill_at: Option<Instant>,
    pub(super) exited: Option<ExitStatus>,
    pub(super) exited_at: Option<Instant>,
    pub(super) stdout_closed: bool,
    pub(super) last_heartbeat: Instant,
    /// [`crate::os::boot_clock`] when the lease was last renewed (the moment the
    /// renewal was sent, to err on the safe side).
    pub(super) renewed_at: Duration,
    /// The run lost its lease: nothing more reaches the agent or the
    /// journal.
    pub(super) fenced: bool,
    pub(super) last_watch: Instant,
    /// `begin` steps that failed in this run, which the agent may `retry`.
    pub(super) failed: HashMap<u64, StepRecord>,
    /// `wait` and `sleep` steps waited on live.
    pub(super) waits: HashMap<u64, Waiter>,
    pub(super) last_signal_look: Instant,
}

/// A `wait` or `sleep` step the run waits on live.
pub(super) struct Waiter {
    pub(super) conn: Conn,
    pub(super) id: Value,
    pub(super) record: StepRecord,
    /// When this run began to wait on it.
    pub(super) since: Instant,
    /// A sleep's wake time, a wait's timeout.
    pub(super) until: Option<std::time::SystemTime>,
}

/// A step the agent began and has not closed yet.
pub(super) struct OpenStep {
    pub(super) record: StepRecord,
    /// Its row is not written yet (a `read` step).
    pub(super) fresh: bool,
    pub(super) started: Instant,
}

/// A step as the agent asks for it.
#[derive(Clone, Copy)]
pub(super) struct Wanted<'a> {
    pub(super) name: &'a str,
    pub(super) kind: StepKind,
    pub(super) effect: Effect,
    pub(super) args: &'a Value,
    pub(super) canonical: &'a str,
    /// The tool wants an operator to decide before a step in doubt runs again.
    pub(super) ask_first: bool,
}

/// A `call` whose tool is running.
pub(super) struct CallInFlight {
    pub(super) conn: Conn,
    /// An HTTP call has no process to kill: on a stop it is answered at
    /// once and left to finish on its own (its step stays in doubt).
    pub(super) http: bool,
    pub(super) id: Value,
    pub(super) record: StepRecord,
    /// Its row is not written yet (a `read` tool).
    pub(super) fresh: bool,
    pub(super) cancel: Arc<Cancel>,
    pub(super) started: Instant,
}

/// A journal write that waits for the batch's commit, and what follows it.
pub(super) struct Deferred {
    /// The connection the continuation answers on.
    pub(super) conn: Conn,
    pub(super) record: StepRecord,
    /// The row is new (an insert), not an update.
    pub(super) fresh: bool,
    pub(super) then: Then,
}

impl Deferred {
    /// The agent's own `commit` of a step: a pipelining agent does not
    /// wait for its answer.
    pub(super) fn is_agent_commit(&self) -> bool {
        self.conn == super::inbox::AGENT
            && self.record.kind == StepKind::Begin
            && matches!(self.then, Then::Finished { .. })
    }
}

/// The committer thread's two channels.
pub(super) struct Committer<'a> {
    pub(super) jobs: mpsc::Sender<Job<'a>>,
    pub(super) landed: mpsc::Receiver<Landed<'a>>,
}

/// A batch to commit, with the journal lent to write it.
pub(super) struct Job<'a> {
    pub(super) journal: &'a mut dyn Journal,
    pub(super) batch: Vec<Deferred>,
    /// The run's counters once the batch is written.
    pub(super) stats: RunStats,
    /// Whether the counters change (an intent alone changes none).
    pub(super) finished: bool,
}

/// A batch back from the committer, and the journal with it.
pub(super) struct Landed<'a> {
    pub(super) journal: &'a mut dyn Journal,
    pub(super) batch: Vec<Deferred>,
    pub(super) stats: RunStats,
    pub(super) written: anyhow::Result<()>,
    /// Where the run stood right after the commit (a cancel, a takeover).
    pub(super) standing: Option<Standing>,
}

/// What follows a write once it is durable.
pub(super) enum Then {
    /// A long `read` step is written as in flight: nothing.
    Marked,
    /// The step finished: answer it.
    Finished { id: Value, started: Instant },
    /// A `mutate` begin's intent is written: answer the begin.
    Opened { id: Value, in_doubt: bool },
    /// A patch's marker is written: answer `patched: true`.
    Patched { id: Value },
    /// A `mutate` call's intent is written: start its tool.
    Call {
        id: Value,
        tool: Arc<Tool>,
        args: Value,
    },
}

impl Then {
    /// The request the write answers; `null` for none.
    pub(super) fn into_id(self) -> Value {
        match self {
            Then::Finished { id, .. }
            | Then::Opened { id, .. }
            | Then::Call { id, .. }
            | Then::Patched { id } => id,
            Then::Marked => Value::Null,
        }
    }
}

pub(super) enum Stop {
    Failure(anyhow::Error),
    Signal,
    /// `durun cancel` asked for it.
    Cancel,
    /// A step waits longer than `park_after`: the task is left `waiting`
    /// or `sleeping` (exit 77, with `notice` saying how to continue).
    Parked {
        status: crate::journal::TaskStatus,
        notice: anyhow::Error,
    },
    /// The token budget is spent (exit 78).
    OverBudget(anyhow::Error),
}
