//! Steps that wait for the world (SPEC 8): `wait` for a signal, `sleep`
//! for a time, waited on live for up to `park_after` and then parked.
//!
//! # Invariant
//!
//! A `wait` step is answered by at most one signal, taken in the same
//! transaction that commits the step (so a signal is never lost nor given
//! twice, whatever is killed when); a `sleep` step's wake time is durable
//! before the run waits on it or parks. Parking ends the agent as a stop
//! does: the waiting step stays `waiting` and the next run waits on it.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use super::{Supervisor, Wanted};
use crate::error::{Failure, Kind};
use crate::journal::{StepError, StepKind, StepRecord, StepStatus, TaskStatus};
use crate::json_text::JsonText;
use crate::protocol::{Effect, ErrorCode, Response, Wake};
use crate::step_key;
use crate::supervisor::ending::Stop;
use crate::supervisor::inbox::Conn;
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::steps::Waiter;

/// How often a run that waits live looks for its signal: one indexed read
/// of the journal, on every backend, so that a signal sent from any host
/// arrives within this.
pub(super) const SIGNAL_LOOK: Duration = Duration::from_millis(100);

impl Supervisor<'_> {
    pub(super) fn on_wait(
        &mut self,
        conn: Conn,
        id: Value,
        name: &str,
        data: &Value,
        timeout: Option<Duration>,
    ) {
        let args = json!({ "data": data });
        if let Some((waiter, fresh)) =
            self.start_waiting(conn, id, (name, StepKind::Wait, &args), timeout)
        {
            self.look_for_signal(waiter, fresh);
        }
    }

    /// Opens a `wait` or `join` step with its timeout (fixed when it is
    /// first opened) and records what came before it: the waiter, and
    /// whether its row is new; `None` when it was answered here.
    pub(super) fn start_waiting(
        &mut self,
        conn: Conn,
        id: Value,
        (name, kind, args): (&str, StepKind, &Value),
        timeout: Option<Duration>,
    ) -> Option<(Waiter, bool)> {
        let (mut record, fresh) = self.open_waiting(conn, &id, name, kind, args)?;
        if fresh {
            record.wake_at = timeout.map(|timeout| crate::clock::stamp(self.spec.now() + timeout));
        }
        let waiter = Waiter::new(conn, id, record);
        // What the agent finished before it is recorded first.
        self.flush();
        if self.ending.stop.is_some() || !self.may_start() {
            self.refuse_start(waiter.conn, waiter.id, waiter.record.step);
            return None;
        }
        Some((waiter, fresh))
    }

    pub(super) fn on_sleep(&mut self, conn: Conn, id: Value, args: &Value, wake: Wake) {
        let Some((mut record, fresh)) =
            self.open_waiting(conn, &id, "sleep", StepKind::Sleep, args)
        else {
            return;
        };
        // The wake time is fixed when the step is first opened.
        if record.wake_at.is_none() {
            let at = match wake {
                Wake::After(duration) => self.spec.now() + duration,
                Wake::At(at) => at,
            };
            record.wake_at = Some(crate::clock::stamp(at));
        }
        let waiter = Waiter::new(conn, id, record);
        let until = waiter.until.unwrap_or_else(SystemTime::now);
        if self.spec.now() >= until {
            return self.wake(waiter, fresh);
        }
        if !self.may_start() {
            return self.refuse_start(waiter.conn, waiter.id, waiter.record.step);
        }
        if fresh {
            self.outbox.batch.push(Deferred {
                conn: waiter.conn,
                record: waiter.record.clone(),
                fresh: true,
                then: Then::Marked,
            });
            self.flush();
            if self.ending.stop.is_some() {
                return;
            }
        }
        let left = until.duration_since(self.spec.now()).unwrap_or_default();
        if left > self.spec.park_after {
            self.park(waiter);
        } else {
            self.steps.waiting(waiter.record.step, waiter);
        }
    }

    /// Opens a `wait` or `sleep` step: `None` when it was answered here
    /// (a replay, a divergence, the budget).
    fn open_waiting(
        &mut self,
        conn: Conn,
        id: &Value,
        name: &str,
        kind: StepKind,
        args: &Value,
    ) -> Option<(StepRecord, bool)> {
        let canonical = match step_key::canonical_json(args) {
            Ok(canonical) => canonical,
            Err(err) => {
                self.respond(
                    conn,
                    &Response::error(id.clone(), ErrorCode::BadRequest, err.to_string()),
                );
                return None;
            }
        };
        let wanted = Wanted {
            name,
            kind,
            effect: Effect::Read,
            args,
            canonical: &canonical,
            ask_first: false,
            request_hash: None,
        };
        let (mut record, fresh, _) = self.open_step(conn, id, wanted)?;
        record.kind = kind;
        record.status = StepStatus::Waiting;
        Some((record, fresh))
    }

    /// Takes a signal for a `wait` step if one came, answering it; or
    /// keeps the step waiting (written `waiting` if new), or fails it if
    /// its timeout passed.
    fn look_for_signal(&mut self, mut waiter: Waiter, fresh: bool) {
        if waiter.until.is_some_and(|until| self.spec.now() >= until) {
            let mut record = waiter.record;
            record.status = StepStatus::Failed;
            record.error = Some(StepError {
                code: ErrorCode::Timeout,
                message: format!(
                    "no signal `{}` came before the wait's timeout ({})",
                    record.name,
                    record.wake_at.as_deref().unwrap_or("?")
                ),
            });
            self.finish_step(waiter.conn, waiter.id, record, fresh, waiter.since);
            self.flush();
            return;
        }
        let (task, run) = (self.spec.task_id, self.spec.run);
        match self
            .journal()
            .take_signal(task, run, &mut waiter.record, fresh)
        {
            Ok(Some(_)) => {
                self.stats.executed_steps += 1;
                self.steps.recorded_up_to(waiter.record.step);
                self.answer_finished(waiter.conn, waiter.id, &waiter.record, waiter.since);
            }
            Ok(None) => {
                self.steps.recorded_up_to(waiter.record.step);
                if waiter.since.elapsed() >= self.spec.park_after {
                    self.park(waiter);
                } else {
                    self.steps.waiting(waiter.record.step, waiter);
                }
            }
            Err(err) => self.write_failed(waiter.conn, &waiter.id, err),
        }
    }

    /// A `sleep` whose time came: committed with the time it woke at.
    fn wake(&mut self, waiter: Waiter, fresh: bool) {
        let mut record = waiter.record;
        record.status = StepStatus::Committed;
        record.output = Some(JsonText::from_value(&json!({ "woke_at": record.wake_at })));
        self.finish_step(waiter.conn, waiter.id, record, fresh, waiter.since);
    }

    /// Timers of the steps that wait live: a sleep's time, a wait's
    /// timeout, a look for signals, and parking after `park_after`.
    pub(super) fn tick_waits(&mut self) {
        if self.steps.no_waits() || self.ending.stop.is_some() || self.holding.fenced {
            return;
        }
        let look = self.holding.last_signal_look.elapsed() >= SIGNAL_LOOK;
        if look {
            self.holding.last_signal_look = Instant::now();
        }
        for step in self.steps.waits_in_order() {
            if self.ending.stop.is_some() {
                return;
            }
            let Some(waiter) = self.steps.take_wait(step) else {
                continue;
            };
            let due = waiter.until.is_some_and(|until| self.spec.now() >= until);
            match waiter.record.kind {
                StepKind::Join if due || look || waiter.since.elapsed() >= self.spec.park_after => {
                    self.look_for_child(waiter, false);
                }
                StepKind::Join => self.steps.waiting(step, waiter),
                StepKind::Sleep if due => self.wake(waiter, false),
                StepKind::Sleep => {
                    self.steps.waiting(step, waiter);
                }
                _ if due || waiter.since.elapsed() >= self.spec.park_after => {
                    self.look_for_signal(waiter, false);
                }
                _ if look => {
                    let task = self.spec.task_id;
                    match self.journal().signal_waiting(task, &waiter.record.name) {
                        Ok(true) => self.look_for_signal(waiter, false),
                        Ok(false) => {
                            self.steps.waiting(step, waiter);
                        }
                        Err(err) => self.journal_failed(waiter.conn, &waiter.id, err),
                    }
                }
                _ => {
                    self.steps.waiting(step, waiter);
                }
            }
        }
        self.flush();
    }

    /// How long the loop may sleep before a waiting step needs it.
    pub(super) fn wait_bound(&self) -> Option<Duration> {
        if self.steps.no_waits() {
            return None;
        }
        let now = self.spec.now();
        let mut bound = SIGNAL_LOOK;
        for waiter in self.steps.waits() {
            if let Some(until) = waiter.until {
                bound = bound.min(until.duration_since(now).unwrap_or_default());
            }
        }
        Some(bound)
    }

    /// Ends the run to wait without it: the agent is ended as on SIGTERM,
    /// the task is left `waiting` or `sleeping`, durun exits 77.
    pub(super) fn park(&mut self, waiter: Waiter) {
        let task = self.spec.task_id;
        let step = waiter.record.step;
        let status = match waiter.record.kind {
            StepKind::Sleep => TaskStatus::Sleeping,
            _ => TaskStatus::Waiting,
        };
        let notice = crate::task::parked_notice(task, &waiter.record);
        self.respond(
            waiter.conn,
            &Response::error(
                waiter.id,
                ErrorCode::Cancelled,
                format!("step {step} waits; the run parks and the task continues on resume"),
            )
            .step(step),
        );
        self.stop(Stop::Parked {
            status,
            notice: notice.into(),
        });
    }

    /// Answers `budget_exceeded` and stops the run when the task's tokens
    /// are spent: true when it did.
    pub(super) fn over_budget(&mut self, conn: Conn, id: &Value, step: u64) -> bool {
        let Some(spent) = self.budget.spent_out() else {
            return false;
        };
        let task = self.spec.task_id;
        self.respond(
            conn,
            &Response::error(
                id.clone(),
                ErrorCode::BudgetExceeded,
                format!("task {task} has {spent}; step {step} does not start"),
            )
            .step(step),
        );
        self.stop_over_budget(&format!(
            "task {task} has {spent}; step {step} did not start"
        ));
        true
    }

    /// Stops the run over its budget (exit 78), `why` in a sentence.
    pub(super) fn stop_over_budget(&mut self, why: &str) {
        let task = self.spec.task_id;
        let (add, max) = self.raises();
        let failure = Failure::new(Kind::OverBudget, why).hint(format!(
            "`durun approve {task} {add}` (or `durun resume {task} {max}`) raises the budget and goes on; the steps before replay for free"
        ));
        self.stop(Stop::OverBudget(failure.into()));
    }

    /// Stops the run over the budget of `owner`, an ancestor of the run's
    /// task (or the task with its children), which `raise` raises.
    pub(super) fn stop_over_tree_budget(&mut self, why: &str, owner: &str, raise: &str) {
        let task = self.spec.task_id;
        let failure = Failure::new(Kind::OverBudget, why).hint(format!(
            "`{raise}` raises the budget of task {owner} and its child tasks; `durun resume {task}` then goes on, the steps before replay for free"
        ));
        self.stop(Stop::OverBudget(failure.into()));
    }
}

impl Supervisor<'_> {
    /// The options of `durun approve` and of `durun resume` that raise
    /// the task's budgets.
    pub(super) fn raises(&self) -> (&'static str, &'static str) {
        raises_of(
            self.spec.max_cost_nanos.is_some(),
            self.spec.max_tokens.is_some(),
        )
    }
}

/// The options of `durun approve` and of `durun resume` that raise a
/// budget in dollars (`usd`), in tokens, or both.
pub(super) fn raises_of(usd: bool, tokens: bool) -> (&'static str, &'static str) {
    match (usd, tokens) {
        (true, true) => (
            "--add-usd X or --add-tokens N",
            "--max-usd X or --max-tokens N",
        ),
        (true, false) => ("--add-usd X", "--max-usd X"),
        _ => ("--add-tokens N", "--max-tokens N"),
    }
}

impl Waiter {
    fn new(conn: Conn, id: Value, record: StepRecord) -> Self {
        let until = crate::task::wake_time(&record);
        Self {
            conn,
            id,
            record,
            since: Instant::now(),
            until,
        }
    }
}
