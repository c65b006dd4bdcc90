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
use crate::protocol::Request;
use crate::proxy::Verdict;
use crate::supervisor::budget::{Fit, Worst};
use crate::supervisor::inbox::Conn;
use crate::usage::Asked;

/// How often a call held for calls of other runs in its task's tree looks
/// again.
const TREE_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

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
    /// The step the call is part of (0 for a request numbered when its
    /// answer is written), and its args' hash.
    fn key(&self) -> (u64, &str) {
        match self {
            Self::Own { record, .. } => (record.step, &record.args_hash),
            Self::Part { step, .. } => (*step, ""),
        }
    }

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
    /// The tasks whose budgets cover this run's task along with other
    /// tasks (its budgeted ancestors, and itself once it has children):
    /// each call also reserves against them in the journal, where the
    /// other tasks' runs reserve too.
    tree: Vec<String>,
    /// A call waits for calls of other runs in the tree to end, and when
    /// it last tried.
    for_tree: bool,
    tree_looked: Option<std::time::Instant>,
    /// The calls in flight, by reservation: each one's hold.
    flights: std::collections::HashMap<u64, crate::journal::budgets::Hold>,
    /// How many calls of each args hash numbered when their answer is
    /// written this run reserved (a hold's `nth`).
    nths: std::collections::HashMap<String, u64>,
}

impl Held {
    pub(super) fn new(tree: Vec<String>) -> Self {
        Self {
            tree,
            ..Self::default()
        }
    }
}

/// Whether a call fits the budgets of the task's tree.
enum TreeFit {
    /// Reserved, with its hold (in the journal if the tree shares it).
    Fits(crate::journal::budgets::Hold),
    /// Not beside the calls in flight in the tree.
    Later,
    /// Never: why, and the budget it does not fit.
    Never(String, crate::journal::budgets::Over),
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
            Fit::Reserved(reservation) => match self.fit_in_tree(call.key(), worst) {
                TreeFit::Fits(hold) => {
                    self.held.flights.insert(reservation, hold);
                    self.send_call(call, Some(reservation));
                }
                TreeFit::Later => {
                    self.budget.release(reservation);
                    self.held.for_tree = true;
                    self.held.calls.push_back((call, worst));
                }
                TreeFit::Never(why, over) => {
                    self.budget.release(reservation);
                    let (add, _) = super::waiting::raises_of(
                        over.max_nanos.is_some(),
                        over.max_tokens.is_some(),
                    );
                    let raise = format!("durun approve {} {add}", over.task);
                    self.never_fits(call, worst, &why, (&raise, Some(&over.task)));
                }
            },
            Fit::Later => self.held.calls.push_back((call, worst)),
            Fit::Never(why) => {
                let task = self.spec.task_id;
                let (add, _) = self.raises();
                let raise = format!("durun approve {task} {add}");
                self.never_fits(
                    call,
                    worst,
                    &format!("task {task} has {why}"),
                    (&raise, None),
                );
            }
        }
    }

    /// A call that does not fit what is left of a budget (of the task, or
    /// of `owner` in its tree), however the calls in flight end: held for
    /// `raise` (`--on-budget wait`), else refused, and the run stops over
    /// budget.
    fn never_fits(
        &mut self,
        call: Call,
        worst: Worst,
        why: &str,
        (raise, owner): (&str, Option<&str>),
    ) {
        if self.spec.budget_wait {
            // Held until `durun approve` raises the budget (`tick`).
            if !self.held.for_raise {
                self.reporter
                    .report(&crate::report::Event::Warning(&format!(
                        "{why}; the call waits for `{raise}`"
                    )));
            }
            self.held.for_raise = true;
            self.held.calls.push_back((call, worst));
        } else {
            call.refuse(Verdict::over_budget(why));
            match owner {
                Some(owner) => self.stop_over_tree_budget(why, owner, raise),
                None => self.stop_over_budget(why),
            }
        }
    }

    /// Reserves a call (its step and args hash) against the budgets of
    /// the task's tree, in the journal, where the tree's other runs
    /// reserve too.
    fn fit_in_tree(&mut self, (step, args_hash): (u64, &str), worst: Worst) -> TreeFit {
        let mut hold = crate::journal::budgets::Hold {
            task: self.spec.task_id.to_owned(),
            run: self.spec.run,
            step,
            args_hash: args_hash.to_owned(),
            nth: 0,
            worst: crate::journal::budgets::Amount {
                tokens: worst.tokens,
                nanos: worst.nanos,
            },
        };
        if step == 0 {
            hold.nth = self.held.nths.get(args_hash).copied().unwrap_or(0);
        }
        if !self.held.tree.is_empty() {
            let tree = self.held.tree.clone();
            let stale_ms = self.stale_ms();
            match self.journal().budget_hold(&tree, &hold, stale_ms) {
                Ok(None) => {}
                Ok(Some(over)) if over.in_flight => return TreeFit::Later,
                Ok(Some(over)) => {
                    return TreeFit::Never(
                        crate::supervisor::budget::tree_over(&over, worst),
                        over,
                    );
                }
                Err(err) => {
                    // Tried again with the next look; the call is not sent
                    // unreserved.
                    if !self.held.for_tree {
                        self.reporter.report(&crate::report::Event::Warning(&format!(
                            "cannot reserve a model call against the budgets of task {}'s tree in the journal, trying again: {err:#}",
                            self.spec.task_id
                        )));
                    }
                    return TreeFit::Later;
                }
            }
        }
        if step == 0 {
            *self.held.nths.entry(args_hash.to_owned()).or_default() += 1;
        }
        TreeFit::Fits(hold)
    }

    fn stale_ms(&self) -> u64 {
        u64::try_from(self.spec.lease.stale.as_millis()).unwrap_or(u64::MAX)
    }

    /// The run's task has a child now: its budget covers the child's calls
    /// too, so its own calls reserve in the journal from now on, the
    /// calls in flight first.
    pub(super) fn share_budget_with_children(&mut self) {
        let task = self.spec.task_id;
        if !self.budget.limited() || self.held.tree.iter().any(|held| held == task) {
            return;
        }
        let stale_ms = self.stale_ms();
        let in_flight: Vec<crate::journal::budgets::Hold> =
            self.held.flights.values().cloned().collect();
        for hold in in_flight {
            // Against no budget: these calls are on their way already.
            if let Err(err) = self.journal().budget_hold(&[], &hold, stale_ms) {
                self.reporter.report(&crate::report::Event::Warning(&format!(
                    "cannot record task {task}'s model calls in flight against its budget in the journal: {err:#}"
                )));
            }
        }
        self.held.tree.push(task.to_owned());
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
        self.held.flights.remove(&reservation);
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
        // A raise of an ancestor's budget is read by the call's next try.
        if !self.budget.raise(record.max_tokens, record.max_cost_nanos) && self.held.tree.is_empty()
        {
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

    /// With a call held for calls of other runs in the tree to end, tries
    /// the held calls again, now and then.
    pub(super) fn look_in_tree(&mut self) {
        if !self.held.for_tree
            || self
                .held
                .tree_looked
                .is_some_and(|at| at.elapsed() < TREE_LOOK_EVERY)
        {
            return;
        }
        self.held.tree_looked = Some(std::time::Instant::now());
        self.held.for_tree = false;
        for (call, worst) in std::mem::take(&mut self.held.calls) {
            self.try_call(call, worst);
        }
    }

    /// How long the loop may wait before [`Self::look_in_tree`] is due.
    pub(super) fn tree_bound(&self) -> Option<std::time::Duration> {
        self.held.for_tree.then_some(TREE_LOOK_EVERY)
    }

    /// The run stops: no held call goes out, no held request opens a step.
    pub(super) fn refuse_held(&mut self) {
        for (call, _) in std::mem::take(&mut self.held.calls) {
            call.refuse(Verdict::stopping());
        }
        for (conn, request) in std::mem::take(&mut self.held.requests) {
            self.refuse_stopping(conn, &request);
        }
    }
}
