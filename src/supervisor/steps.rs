//! The steps of this run, by where each stands: recorded before the run
//! started, open (a `begin` the agent runs), a tool running (`call`),
//! waited on live (`wait`, `sleep`), or failed and retryable.
//!
//! # Invariant
//!
//! A step number is in at most one of `open`, `calls` and `waits` (and, in
//! the `commit` room, the batch) at a time; the methods that put a step in
//! one of them check that it is in no other. `next_step` is one past every
//! step this run opened and every recorded step replayed by content that
//! the numbering passed, `last_recorded` the highest step number the
//! journal holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::contents::Contents;
use super::inbox::Conn;
use super::recorded::Recorded;
use crate::executor::Cancel;
use crate::journal::StepRecord;

pub(super) struct Steps {
    /// The steps the journal held when the run started, read as reached.
    pub(super) recorded: Recorded,
    /// The highest step number in the journal.
    pub(super) last_recorded: u64,
    /// One past the agent's last protocol step.
    pub(super) next_step: u64,
    /// One past every step number the journal held or this run gave.
    next_new: u64,
    /// Steps replayed by content: proxy and MCP requests.
    pub(super) contents: Contents,
    /// Steps the agent began and has not closed yet.
    pub(super) open: HashMap<u64, OpenStep>,
    /// `call`s whose tool runs.
    pub(super) calls: HashMap<u64, CallInFlight>,
    /// `wait` and `sleep` steps waited on live.
    pub(super) waits: HashMap<u64, Waiter>,
    /// `begin` steps that failed in this run, which the agent may `retry`.
    pub(super) failed: HashMap<u64, StepRecord>,
}

impl Steps {
    pub(super) fn new(last_recorded: u64) -> Self {
        Self {
            recorded: Recorded::new(last_recorded),
            last_recorded,
            next_step: 1,
            next_new: last_recorded + 1,
            contents: Contents::default(),
            open: HashMap::new(),
            calls: HashMap::new(),
            waits: HashMap::new(),
            failed: HashMap::new(),
        }
    }

    /// A step number no step holds, `at_least` or more; not taken yet.
    pub(super) fn peek_new(&self, at_least: u64) -> u64 {
        self.next_new.max(at_least)
    }

    /// Takes a new step number for a step replayed by content.
    pub(super) fn new_number(&mut self) -> u64 {
        let step = self.next_new;
        self.next_new += 1;
        step
    }

    /// The agent's protocol step takes `step`: the next one comes after it.
    pub(super) fn take_number(&mut self, step: u64) {
        self.next_step = step + 1;
        self.next_new = self.next_new.max(step + 1);
    }

    /// Whether `step` is open, running or waited on.
    pub(super) fn in_flight(&self, step: u64) -> bool {
        self.open.contains_key(&step)
            || self.calls.contains_key(&step)
            || self.waits.contains_key(&step)
    }

    /// The agent runs `step` itself from now on.
    pub(super) fn opened(&mut self, step: u64, open: OpenStep) {
        debug_assert!(!self.in_flight(step), "step {step} is in flight already");
        self.open.insert(step, open);
    }

    /// The open step that the `begin` with `id` on `conn` opened.
    pub(super) fn begun_by(&self, conn: Conn, id: &Value) -> Option<u64> {
        self.open
            .iter()
            .find(|(_, open)| open.begun_by.0 == conn && open.begun_by.1 == *id)
            .map(|(step, _)| *step)
    }

    /// durun runs `step`'s tool from now on.
    pub(super) fn calling(&mut self, step: u64, call: CallInFlight) {
        debug_assert!(!self.in_flight(step), "step {step} is in flight already");
        self.calls.insert(step, call);
    }

    /// The run waits on `step` live from now on.
    pub(super) fn waiting(&mut self, step: u64, waiter: Waiter) {
        debug_assert!(!self.in_flight(step), "step {step} is in flight already");
        self.waits.insert(step, waiter);
    }
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
    /// The connection and request `id` of the `begin` that opened it: a
    /// `commit` or `fail` may name the step by them.
    pub(super) begun_by: (Conn, Value),
    /// Its row is not written yet (a `read` step).
    pub(super) fresh: bool,
    pub(super) started: Instant,
    /// The usage of model calls made through the proxy while it was open
    /// (one call, one record: they are part of this step).
    pub(super) proxied: Vec<Value>,
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
