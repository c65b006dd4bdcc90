//! The steps of this run, by where each stands: recorded before the run
//! started, open (a `begin` the agent runs), a tool running (`call`),
//! waited on live (`wait`, `sleep`), or failed and retryable.
//!
//! # Invariant
//!
//! A step number is in at most one of `open`, `calls` and `waits` (and, in
//! the `commit` room, the batch) at a time; the methods that put a step in
//! one of them check that it is in no other. The four maps are private:
//! every change to where a step stands goes through a method here.
//!
//! `next_step` is one past every step this run opened and every recorded
//! step replayed by content that the numbering passed, `last_recorded` the
//! highest step number the journal holds; both only grow.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::contents::Contents;
use super::inbox::Conn;
use super::recorded::Recorded;
use crate::executor::Cancel;
use crate::journal::{StepKind, StepRecord};

pub(super) struct Steps {
    /// The steps the journal held when the run started, read as reached.
    pub(super) recorded: Recorded,
    /// The highest step number in the journal.
    last_recorded: u64,
    /// One past the agent's last protocol step.
    next_step: u64,
    /// One past every step number the journal held or this run gave.
    next_new: u64,
    /// Steps replayed by content: proxy and MCP requests.
    pub(super) contents: Contents,
    /// Steps the agent began and has not closed yet.
    open: HashMap<u64, OpenStep>,
    /// `call`s whose tool runs.
    calls: HashMap<u64, CallInFlight>,
    /// `wait` and `sleep` steps waited on live.
    waits: HashMap<u64, Waiter>,
    /// `begin` steps that failed in this run, which the agent may `retry`
    /// (the last [`MAX_RETRYABLE`]).
    failed: HashMap<u64, StepRecord>,
}

/// How many failed steps of a run the agent may still `retry`.
const MAX_RETRYABLE: usize = 64;

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

    /// One past the agent's last protocol step.
    pub(super) fn next_step(&self) -> u64 {
        self.next_step
    }

    /// The numbering passed `step`, a step replayed by content, for good.
    pub(super) fn passed(&mut self, step: u64) {
        self.next_step = self.next_step.max(step + 1);
    }

    /// The highest step number in the journal.
    pub(super) fn last_recorded(&self) -> u64 {
        self.last_recorded
    }

    /// The journal holds `step` now.
    pub(super) fn recorded_up_to(&mut self, step: u64) {
        self.last_recorded = self.last_recorded.max(step);
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

    /// The open step whose key is `key`, and who began it.
    pub(super) fn open_with_key(&self, key: &str) -> Option<&OpenStep> {
        self.open
            .values()
            .find(|open| open.record.idempotency_key == key)
    }

    /// Takes the open MCP steps `conn` began: it is gone, and they are in
    /// doubt now (`durun mcp` died inside them).
    pub(super) fn take_mcp_of(&mut self, conn: Conn) -> Vec<OpenStep> {
        let steps: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, open)| open.begun_by.0 == conn && open.record.kind == StepKind::Mcp)
            .map(|(step, _)| *step)
            .collect();
        steps
            .into_iter()
            .filter_map(|step| self.open.remove(&step))
            .collect()
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

    /// Closes the open `step` (a `commit` or `fail` came): what it was, or
    /// why it cannot be closed.
    pub(super) fn close(&mut self, step: u64) -> Result<OpenStep, NotOpen> {
        match self.open.remove(&step) {
            Some(open) => Ok(open),
            None if self.calls.contains_key(&step) => Err(NotOpen::Call),
            None => Err(NotOpen::Closed),
        }
    }

    /// The open `step`, if it is.
    pub(super) fn open_mut(&mut self, step: u64) -> Option<&mut OpenStep> {
        self.open.get_mut(&step)
    }

    /// The latest open step the agent journals itself (`begin`): a model
    /// call made inside it is part of it.
    pub(super) fn innermost_begin(&self) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, open)| open.record.kind == StepKind::Begin)
            .map(|(step, _)| *step)
            .max()
    }

    /// The tool of `step` ended (or was given up on): its call.
    pub(super) fn call_ended(&mut self, step: u64) -> Option<CallInFlight> {
        self.calls.remove(&step)
    }

    /// The calls whose tools run.
    pub(super) fn calls(&self) -> impl Iterator<Item = (u64, &CallInFlight)> {
        self.calls.iter().map(|(step, call)| (*step, call))
    }

    /// Whether no tool runs.
    pub(super) fn no_calls(&self) -> bool {
        self.calls.is_empty()
    }

    /// Forgets every step in flight: the run lost its lease, and nothing it
    /// has open may be written or answered.
    pub(super) fn forget_in_flight(&mut self) {
        self.open.clear();
        self.calls.clear();
        self.waits.clear();
    }

    /// The open steps and calls that have run for `after` without a row
    /// written, from now on marked as written: their records, to write as
    /// `pending`.
    pub(super) fn unmarked_after(&mut self, after: std::time::Duration) -> Vec<StepRecord> {
        let opens = self
            .open
            .values_mut()
            .map(|open| (&mut open.fresh, open.started, &open.record));
        let calls = self
            .calls
            .values_mut()
            .map(|call| (&mut call.fresh, call.started, &call.record));
        let mut marks = Vec::new();
        for (fresh, started, record) in opens.chain(calls) {
            if *fresh && started.elapsed() >= after {
                *fresh = false;
                marks.push(record.clone());
            }
        }
        marks
    }

    /// `step` failed in this run: the agent may `retry` it (the oldest of
    /// more than [`MAX_RETRYABLE`] is forgotten).
    pub(super) fn failed(&mut self, step: u64, record: StepRecord) {
        if self.failed.len() >= MAX_RETRYABLE
            && let Some(oldest) = self.failed.keys().min().copied()
        {
            self.failed.remove(&oldest);
        }
        self.failed.insert(step, record);
    }

    /// The failed `step`, to run again (`retry`), if the agent may.
    pub(super) fn take_failed(&mut self, step: u64) -> Option<StepRecord> {
        self.failed.remove(&step)
    }

    /// Whether no step is waited on live.
    pub(super) fn no_waits(&self) -> bool {
        self.waits.is_empty()
    }

    /// The steps waited on live, in order.
    pub(super) fn waits_in_order(&self) -> Vec<u64> {
        let mut steps: Vec<u64> = self.waits.keys().copied().collect();
        steps.sort_unstable();
        steps
    }

    /// The wait of `step`, taken out to be looked at (put it back with
    /// [`Self::waiting`]).
    pub(super) fn take_wait(&mut self, step: u64) -> Option<Waiter> {
        self.waits.remove(&step)
    }

    /// The steps waited on live.
    pub(super) fn waits(&self) -> impl Iterator<Item = &Waiter> {
        self.waits.values()
    }
}

/// Why a `commit` or `fail` cannot close a step.
pub(super) enum NotOpen {
    /// It is a `call`: durun closes it when the tool ends.
    Call,
    /// It was never opened, or is closed already.
    Closed,
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
    /// What those calls cost at their models' prices; `None` once one of
    /// them had no price.
    pub(super) proxied_cost: Option<u64>,
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

impl CallInFlight {
    /// A call that starts now, cancelled by nobody yet.
    pub(super) fn new(conn: Conn, id: Value, record: StepRecord, fresh: bool, http: bool) -> Self {
        Self {
            conn,
            http,
            id,
            record,
            fresh,
            cancel: Arc::new(Cancel::default()),
            started: Instant::now(),
        }
    }
}
