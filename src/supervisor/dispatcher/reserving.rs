//! A model call's way past the task's budget (SPEC 19): its worst case is
//! reserved before it is forwarded. One that does not fit beside the
//! calls in flight waits, inside durun, for one of them to end; one that
//! can never fit is refused and the run stops over budget (exit 78). The
//! reservation goes when the call ends, and what the call really spent
//! counts from its step's end. With `--on-budget wait`, a call that can
//! never fit, and an agent's request for a new step once the budget is
//! spent, wait for `durun approve` instead.

use tokio::sync::oneshot;

use super::Supervisor;
use crate::journal::StepRecord;
use crate::protocol::{ErrorCode, Request, Response};
use crate::proxy::Verdict;
use crate::supervisor::budget::{Fit, Worst};
use crate::supervisor::inbox::Conn;
use crate::usage::Asked;

/// A call on its way upstream, held until its worst case fits.
pub(super) enum Call {
    /// A step of its own (see `Supervisor::forward`).
    Own {
        reply: oneshot::Sender<Verdict>,
        record: Box<StepRecord>,
        fresh: bool,
        canonical: Option<String>,
    },
    /// Part of the agent's open step `step`.
    Part {
        reply: oneshot::Sender<Verdict>,
        step: u64,
    },
}

impl Call {
    fn refuse(self, verdict: Verdict) {
        let (Self::Own { reply, .. } | Self::Part { reply, .. }) = self;
        let _ = reply.send(verdict);
    }
}

/// The calls waiting for room in the budget, in the order they came.
#[derive(Default)]
pub(super) struct Held {
    calls: std::collections::VecDeque<(Call, Worst)>,
    /// The reservations of calls that are part of an open step, by step.
    parts: std::collections::HashMap<u64, Vec<u64>>,
    /// The agent's requests from the first that would open a new step
    /// with the budget spent (`--on-budget wait`), in the order they came:
    /// the later ones wait behind it, so the steps keep their numbers.
    requests: std::collections::VecDeque<(Conn, Request)>,
    /// A call waits for `durun approve` to raise the budget
    /// (`--on-budget wait`), and when the journal was last read for it.
    for_raise: bool,
    looked: Option<std::time::Instant>,
}

impl Supervisor<'_> {
    /// Sends `call` on its way once its worst case fits the task's budget:
    /// at once when no budget holds the task, or `asked` is not a model
    /// call.
    pub(super) fn forward_within_budget(&mut self, call: Call, asked: Option<&Asked>) {
        let Some(asked) = asked.filter(|_| self.budget.limited()) else {
            self.send_call(call, None);
            return;
        };
        match self.budget.worst_of(asked, self.spec.prices) {
            Ok(worst) => self.try_call(call, worst),
            Err(why) => {
                let why = format!(
                    "task {} cannot keep to its budget: {why}",
                    self.spec.task_id
                );
                call.refuse(Verdict::over_budget(&why));
                self.stop_over_budget(&why);
            }
        }
    }

    fn try_call(&mut self, call: Call, worst: Worst) {
        match self.budget.reserve(worst) {
            Fit::Reserved(reservation) => self.send_call(call, Some(reservation)),
            Fit::Later => self.held.calls.push_back((call, worst)),
            Fit::Never(why) if self.spec.budget_wait => {
                // Held until `durun approve` raises the budget (`tick`).
                if !self.held.for_raise {
                    let task = self.spec.task_id;
                    let (add, _) = self.raises();
                    self.reporter
                        .report(&crate::report::Event::Warning(&format!(
                            "task {task} has {why}; the call waits for `durun approve {task} {add}`"
                        )));
                }
                self.held.for_raise = true;
                self.held.calls.push_back((call, worst));
            }
            Fit::Never(why) => {
                let why = format!("task {} has {why}", self.spec.task_id);
                call.refuse(Verdict::over_budget(&why));
                self.stop_over_budget(&why);
            }
        }
    }

    fn send_call(&mut self, call: Call, reservation: Option<u64>) {
        match call {
            Call::Own {
                reply,
                record,
                fresh,
                canonical,
            } => self.forward(reply, *record, fresh, canonical, reservation),
            Call::Part { reply, step } => {
                if let Some(reservation) = reservation {
                    self.held.parts.entry(step).or_default().push(reservation);
                }
                self.forward_part(reply, step);
            }
        }
    }

    /// A call ended: its reservation goes, and the calls held for room
    /// are tried again.
    pub(super) fn release(&mut self, reservation: Option<u64>) {
        let Some(reservation) = reservation else {
            return;
        };
        self.budget.release(reservation);
        let held = std::mem::take(&mut self.held.calls);
        for (call, worst) in held {
            if self.ending.stop.is_some() {
                call.refuse(Verdict::stopping());
            } else {
                self.try_call(call, worst);
            }
        }
    }

    /// Step `step` ended, and what the model calls made inside it spent
    /// counts: their reservations go.
    pub(super) fn release_parts(&mut self, step: u64) {
        for reservation in self.held.parts.remove(&step).unwrap_or_default() {
            self.release(Some(reservation));
        }
    }

    /// Holds `request` for a raise of the budget (`--on-budget wait`) when
    /// it would open a new step with the budget spent, or comes after one
    /// that does; gives it back otherwise.
    pub(super) fn hold_for_raise(
        &mut self,
        conn: Conn,
        request: Request,
    ) -> Option<(Conn, Request)> {
        let opens_a_step = matches!(
            request,
            Request::Call { .. }
                | Request::Begin { .. }
                | Request::Spawn { .. }
                | Request::Wait { .. }
                | Request::Sleep { .. }
                | Request::Join { .. }
                | Request::Retry { .. }
        );
        let hold = self.spec.budget_wait
            && (!self.held.requests.is_empty()
                || (opens_a_step
                    // A step the journal holds replays for free.
                    && self.steps.next_step() > self.steps.recorded.last()
                    && self.budget.spent_out().is_some()));
        if !hold {
            return Some((conn, request));
        }
        if self.held.requests.is_empty() && !self.held.for_raise {
            let task = self.spec.task_id;
            let spent = self.budget.spent_out().unwrap_or_default();
            let (add, _) = self.raises();
            self.reporter
                .report(&crate::report::Event::Warning(&format!(
                    "task {task} has {spent}; its next step waits for `durun approve {task} {add}`"
                )));
        }
        self.held.for_raise = true;
        self.held.requests.push_back((conn, request));
        None
    }

    /// With a call or a request held for a raise of the budget, reads the
    /// task's budgets from the journal now and then; once raised, the held
    /// calls are tried again and the held requests handled in turn.
    pub(super) fn look_for_raise(&mut self) {
        const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
        if !self.held.for_raise || self.held.looked.is_some_and(|at| at.elapsed() < LOOK_EVERY) {
            return;
        }
        self.held.looked = Some(std::time::Instant::now());
        let task = self.spec.task_id;
        let Ok(Some(record)) = self.journal().task(task) else {
            return;
        };
        if !self.budget.raise(record.max_tokens, record.max_cost_nanos) {
            return;
        }
        self.held.for_raise = false;
        for (call, worst) in std::mem::take(&mut self.held.calls) {
            self.try_call(call, worst);
        }
        for (conn, request) in std::mem::take(&mut self.held.requests) {
            self.on_request(conn, request);
        }
    }

    /// The run stops: no held call goes out, no held request opens a step.
    pub(super) fn refuse_held(&mut self) {
        for (call, _) in std::mem::take(&mut self.held.calls) {
            call.refuse(Verdict::stopping());
        }
        for (conn, request) in std::mem::take(&mut self.held.requests) {
            self.respond(
                conn,
                &Response::error(
                    request.id().clone(),
                    ErrorCode::Cancelled,
                    "the run is stopping; the task can be resumed",
                ),
            );
        }
    }
}
