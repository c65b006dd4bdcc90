//! Requests replayed by content become steps: the model/API proxy's (SPEC
//! 12), answered from the journal, forwarded as a step of their own, or
//! counted as part of an agent's open step; and MCP tool calls (SPEC 13),
//! which `durun mcp` opens with a `begin` of kind `mcp`.
//!
//! # Invariant
//!
//! A recorded answer is given to at most one request of a run; a `mutate`
//! request's intent is durable before it is forwarded, and a step in
//! doubt goes out again only with its own key; an answer is durable
//! before the proxy lets the agent have all of it.

use std::time::Instant;

use serde_json::Value;
use tokio::sync::oneshot;

use super::reserving::Call;
use super::{Supervisor, Wanted};
use crate::journal::{StepError, StepKind, StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::protocol::{Effect, ErrorCode};
use crate::proxy::{Ask, End, ToLoop, Verdict};
use crate::report::Event as Report;
use crate::step_key;
use crate::supervisor::contents::InFlight;
use crate::supervisor::decide::{ByContent as Decided, decide_by_content};
use crate::supervisor::inbox::{Conn, PROXY};
use crate::supervisor::outbox::{Deferred, ProxyThen, Then};
use crate::supervisor::transitions::Transition;
use crate::task::live::Stream;

impl Supervisor<'_> {
    pub(super) fn on_proxy(&mut self, message: ToLoop) {
        // A replay the proxy gave before this request came is counted
        // before it.
        self.count_taken();
        match message {
            ToLoop::Ask(ask) => self.on_ask(ask),
            ToLoop::Done {
                flight,
                own,
                end,
                reply,
            } => self.on_proxy_done(flight, own, end, reply),
        }
    }

    /// Reads the task's steps replayed by content, once: the proxy takes
    /// their answers from the same book ([`crate::proxy::Answers`]).
    pub(super) fn load_contents(&mut self) -> anyhow::Result<()> {
        if self.steps.contents.loaded() {
            return Ok(());
        }
        let task = self.spec.task_id;
        let recorded = self.journal().steps_by_content(task)?;
        self.steps.contents.load(recorded);
        Ok(())
    }

    /// Counts the steps the proxy replayed since the last look. Called
    /// before each request and at the run's end: the proxy shelves a step
    /// before the agent has its answer, so a replay is counted before
    /// anything the agent sent after it.
    pub(super) fn count_taken(&mut self) {
        for record in self.steps.contents.taken() {
            self.count_replayed(&record);
        }
    }

    fn on_ask(&mut self, ask: Ask) {
        // Whether the request is part of one of the agent's steps depends
        // on what the agent wrote before it sent the request: a `begin`
        // whose body makes this call, or the commit of a step that ended
        // just before it. So that is read first: counted into a closed
        // step, the call would be in no record of its own, and a resume
        // would pay for it again.
        if self.may_read() {
            self.read_agent();
        }
        if self.holding.fenced {
            // The reply is dropped: the agent hears the run ended.
            return;
        }
        if self.ending.stop.is_some() || self.ending.exited.is_some() {
            let _ = ask.reply.send(Verdict::stopping());
            return;
        }
        let wanted = Wanted {
            name: &ask.name,
            kind: StepKind::Proxy,
            effect: ask.effect,
            args: &ask.args,
            canonical: &ask.canonical,
            ask_first: false,
            request_hash: Some(&ask.request_hash),
        };
        let (record, fresh, in_doubt) = match self.by_content(PROXY, &Value::Null, &wanted) {
            ByContent::Replay(record) => {
                let output = record.output.unwrap_or_else(JsonText::null);
                let _ = ask.reply.send(Verdict::Replay(output));
                return;
            }
            ByContent::Run {
                record,
                fresh,
                in_doubt,
            } => {
                if fresh {
                    self.hint_ignore(&ask.name, &ask.args);
                }
                (record, fresh, in_doubt)
            }
            ByContent::OpenStep(step) => {
                let asked = ask.asked;
                self.forward_within_budget(
                    Call::Part {
                        reply: ask.reply,
                        step,
                    },
                    asked.as_ref(),
                );
                return;
            }
            ByContent::OverBudget => {
                let _ = ask.reply.send(self.budget_refusal());
                return;
            }
            // The reply is dropped: the run stops.
            ByContent::Failed => return,
        };
        if record.effect == Effect::Mutate {
            // Write-ahead: forwarded once the intent is durable.
            self.outbox.batch.push(Deferred {
                conn: PROXY,
                record,
                fresh,
                then: Then::Proxied(ProxyThen::Forward {
                    reply: ask.reply,
                    in_doubt,
                    asked: ask.asked,
                }),
            });
        } else if self.may_start() {
            let asked = ask.asked;
            self.forward_within_budget(
                Call::Own {
                    reply: ask.reply,
                    record: Box::new(record),
                    fresh,
                    canonical: Some(ask.canonical),
                },
                asked.as_ref(),
            );
        } else {
            let _ = ask.reply.send(Verdict::stopping());
        }
    }

    /// A request that a recorded one of its name, no request of this run
    /// had, would have replayed but for a few fields of its body: says once
    /// a run, paste-ready, what `[proxy] ignore` replays it (SPEC 18). The
    /// request goes upstream, as any new one.
    fn hint_ignore(&mut self, name: &str, args: &Value) {
        if self.ignore_hinted {
            return;
        }
        let Some(mut recorded) = self.steps.contents.first_unreplayed(name) else {
            return;
        };
        // Read as written: its conversation is a chain until expanded.
        if self.journal().whole_args(&mut recorded).is_err() {
            return;
        }
        let Some(hint) = crate::diff::ignore_hint(&recorded.args.value(), args) else {
            return;
        };
        self.ignore_hinted = true;
        self.reporter.report(&Report::Hint(&hint));
    }

    /// A `begin` of an MCP tool call (`durun mcp`): replayed by content,
    /// else opened as a step the caller closes with `commit` or `fail`.
    pub(super) fn on_mcp_begin(
        &mut self,
        conn: Conn,
        id: Value,
        name: &str,
        args: &Value,
        effect: Effect,
    ) {
        let Some(canonical) = self.canonical_args(conn, &id, args) else {
            return;
        };
        let wanted = Wanted {
            name,
            kind: StepKind::Mcp,
            effect,
            args,
            canonical: &canonical,
            ask_first: false,
            request_hash: None,
        };
        match self.by_content(conn, &id, &wanted) {
            ByContent::Replay(record) => {
                self.respond(conn, &super::requests::replay_response(id, record));
            }
            ByContent::Run {
                record,
                fresh,
                in_doubt,
            } => {
                // Its intent first, `read` or not: every MCP step number
                // is in the journal from the commit that gives it.
                self.outbox.batch.push(Deferred {
                    conn,
                    record,
                    fresh,
                    then: Then::Opened { id, in_doubt },
                });
            }
            // Answered already (over budget, a journal failure).
            ByContent::OpenStep(_) | ByContent::OverBudget | ByContent::Failed => {}
        }
    }

    /// What a request replayed by content meets: a recorded answer no
    /// request of this run had, a `mutate` step in doubt (run again with
    /// its key), an agent's open step it is part of (proxy requests only),
    /// or nothing (a new step).
    fn by_content(&mut self, conn: Conn, id: &Value, wanted: &Wanted<'_>) -> ByContent {
        if let Err(err) = self.load_contents() {
            self.journal_failed(conn, id, err);
            return ByContent::Failed;
        }
        let args_hash = step_key::args_hash(wanted.canonical);
        // One call, one record: a request made inside a step the agent
        // journals itself (an SDK's `wrap`) is part of that step.
        let part_of = if wanted.kind == StepKind::Proxy {
            self.steps.innermost_begin()
        } else {
            None
        };
        let decided = decide_by_content(&mut self.steps.contents, wanted.name, &args_hash, part_of);
        let (mut record, fresh, in_doubt) = match decided {
            Decided::Replay(record) => {
                self.count_replayed(&record);
                return ByContent::Replay(record);
            }
            Decided::PartOf(step) => return ByContent::OpenStep(step),
            Decided::Retry(record) => {
                if self.over_budget(conn, id, record.step) {
                    return ByContent::OverBudget;
                }
                (self.next_attempt(record), false, true)
            }
            Decided::Run => {
                // A proxy `read` request is numbered when its answer is
                // written, in the same commit: a number the journal lacks
                // is then always one of the agent's own protocol steps
                // (see `next_protocol_step`). Every other step here writes
                // its intent now, with its number.
                let later = wanted.kind == StepKind::Proxy && wanted.effect == Effect::Read;
                let shown = self.steps.peek_new(0);
                if self.over_budget(conn, id, shown) {
                    return ByContent::OverBudget;
                }
                let step = if later { 0 } else { self.steps.new_number() };
                (self.new_record(step, wanted, args_hash), true, false)
            }
        };
        record.effect = wanted.effect;
        if record.step != 0 {
            self.transition(Transition::Opened {
                step: record.step,
                name: &record.name,
                attempt: record.attempts,
            });
        }
        ByContent::Run {
            record,
            fresh,
            in_doubt,
        }
    }

    /// Sends a request on its way. `canonical`: its args' canonical form,
    /// for the key of a step numbered when it is written.
    pub(super) fn forward(
        &mut self,
        reply: oneshot::Sender<Verdict>,
        record: StepRecord,
        fresh: bool,
        canonical: Option<String>,
        reservation: Option<u64>,
    ) {
        self.transition(Transition::Started);
        let key = (record.effect == Effect::Mutate).then(|| record.idempotency_key.clone());
        let traceparent = self.traceparent(record.step);
        let step = record.step;
        // A request by content runs a later attempt only when a run died
        // inside the one before (a failed one is a new request).
        let in_doubt = !fresh && record.attempts > 1;
        let flight = self.steps.contents.take_off(InFlight {
            record,
            fresh,
            canonical,
            started: Instant::now(),
            reservation,
        });
        if reply
            .send(Verdict::Forward {
                flight,
                key,
                own: true,
                traceparent,
                tap: self.tap(if step == 0 {
                    Stream::Call(flight)
                } else {
                    Stream::Step(step)
                }),
                in_doubt,
            })
            .is_err()
        {
            // The agent left before it was sent: a `mutate` step stays in
            // doubt for an equal request.
            self.lost(flight);
        }
    }

    /// Sends a request that is part of the agent's open step `step`.
    pub(super) fn forward_part(&mut self, reply: oneshot::Sender<Verdict>, step: u64) {
        let traceparent = self.traceparent(step);
        let _ = reply.send(Verdict::Forward {
            flight: step,
            key: None,
            own: false,
            traceparent,
            tap: self.tap(Stream::Step(step)),
            in_doubt: false,
        });
    }

    /// A forwarded request that ended without an answer to record.
    fn lost(&mut self, flight: u64) {
        let Some(flight) = self.steps.contents.landed(flight) else {
            return;
        };
        self.release(flight.reservation);
        if !flight.fresh {
            self.steps.contents.keep_pending(flight.record);
        }
    }

    /// The `traceparent` of a proxied request of step `step`: the step's
    /// span, or the run's for a `read` request, numbered only when its
    /// answer is written.
    fn traceparent(&self, step: u64) -> Option<String> {
        let run = self.spec.traceparent.as_deref()?;
        if step == 0 {
            Some(run.to_owned())
        } else {
            crate::trace::step_traceparent(run, step)
        }
    }

    /// Where a forwarded stream is copied, if someone watches the task's
    /// events (SPEC 20).
    fn tap(&self, stream: Stream) -> Option<crate::task::live::Tap> {
        self.spec.live.as_ref()?.tap(self.spec.run, stream)
    }

    /// A forwarded request's end. `flight`: the step of the agent's it is
    /// part of when not `own`, else what [`Verdict::Forward`] said.
    fn on_proxy_done(&mut self, flight: u64, own: bool, end: End, reply: oneshot::Sender<()>) {
        if !own {
            let prices = self.spec.prices;
            if let (
                Some(open),
                End::Answered {
                    usage: Some(usage),
                    answer,
                    model,
                    ..
                },
            ) = (self.steps.open_mut(flight), &end)
                && (200..300).contains(&answer.status)
            {
                open.proxied.push(usage.clone());
                let cost = model.as_deref().and_then(|model| prices.cost(model, usage));
                open.proxied_cost = open.proxied_cost.zip(cost).map(|(sum, one)| sum + one);
            }
            // Its reservation holds until the step ends and what the call
            // spent counts (see `finish_step`).
            let _ = reply.send(());
            return;
        }
        let mut reconciled = false;
        let (answer, usage, model, unheard) = match end {
            End::Answered {
                answer,
                usage,
                model,
                unheard,
            } => (answer, usage, model, unheard),
            End::Reconciled { answer } => {
                reconciled = true;
                (answer, None, None, false)
            }
            End::Lost { message } => {
                self.reporter.report(&Report::Warning(&format!(
                    "{message}; the agent was answered 502"
                )));
                self.lost(flight);
                let _ = reply.send(());
                return;
            }
            End::TooLarge { message } => {
                self.reporter.report(&Report::Warning(&message));
                self.lost(flight);
                let _ = reply.send(());
                return;
            }
        };
        let Some(flight) = self.steps.contents.landed(flight) else {
            return;
        };
        self.transition(Transition::Returned);
        let mut record = flight.record;
        if record.step == 0 {
            // Numbered now, in the commit that writes it.
            record.step = self.steps.new_number();
            let canonical = flight.canonical.as_deref().unwrap_or_default();
            record.idempotency_key =
                step_key::idempotency_key(self.spec.task_id, record.step, canonical);
        }
        record.finished_at = Some(crate::journal::now());
        record.output = Some(crate::proxy::answer_output_text(&answer));
        if reconciled {
            let said = super::closing::reconciled(&mut record, "its route's probe", "sent");
            self.reporter.report(&Report::Warning(&said));
        }
        if (200..300).contains(&answer.status) {
            record.status = StepStatus::Committed;
            record.tokens = usage.as_ref().map_or(0, crate::usage::tokens_of);
            record.cost_nanos = usage
                .as_ref()
                .zip(model.as_deref())
                .and_then(|(usage, model)| self.spec.prices.cost(model, usage));
            record.usage = usage.as_ref().map(JsonText::from_value);
        } else {
            // An attempt, never a finished step: the agent's own retry is
            // a new request.
            record.status = StepStatus::Failed;
            record.error = Some(StepError {
                code: ErrorCode::ToolFailed,
                message: format!("HTTP {}", answer.status),
            });
        }
        self.budget.add(record.tokens, record.cost_nanos);
        self.outbox.batch.push(Deferred {
            conn: PROXY,
            record,
            fresh: flight.fresh,
            then: Then::Proxied(ProxyThen::Done {
                reply,
                started: flight.started,
                unheard,
            }),
        });
        // What it spent counts now: its worst case goes.
        self.release(flight.reservation);
    }

    /// What a durable proxy write waited for.
    pub(super) fn carry_on_proxied(&mut self, record: StepRecord, then: ProxyThen) {
        match then {
            ProxyThen::Forward {
                reply,
                in_doubt,
                asked,
            } => {
                if self.ending.stop.is_some() || !self.check_renewal() {
                    // Its intent is recorded: in doubt, retried with its
                    // key on resume.
                    let _ = reply.send(Verdict::stopping());
                    return;
                }
                if in_doubt {
                    self.reporter.report(&Report::Warning(&format!(
                        "step {} ({}) was in doubt (a run died inside it): it goes again with the same idempotency key, unless its route's probe finds it took effect",
                        record.step, record.name
                    )));
                }
                self.forward_within_budget(
                    Call::Own {
                        reply,
                        record: Box::new(record),
                        fresh: false,
                        canonical: None,
                    },
                    asked.as_ref(),
                );
            }
            ProxyThen::Done {
                reply,
                started,
                unheard,
            } => {
                if unheard && record.status == StepStatus::Committed {
                    // Paid for and never heard: the agent's retry has it
                    // from the journal.
                    self.steps.contents.keep_finished(record.clone());
                }
                self.transition(Transition::Finished {
                    record: &record,
                    elapsed: started.elapsed(),
                });
                let _ = reply.send(());
            }
        }
    }

    /// Says which recorded requests no request of this run asked for: the
    /// agent's path changed (a prompt that embeds the time, say). Not an
    /// error; `[proxy] ignore` leaves such parts out of matching.
    pub(super) fn report_unreplayed(&mut self) {
        let unreplayed = self.steps.contents.unreplayed();
        if unreplayed.is_empty() || self.ending.stop.is_some() || self.holding.fenced {
            return;
        }
        let (task, run) = (self.spec.task_id, self.spec.run);
        if let Err(err) = self.journal().set_unreplayed(task, run, &unreplayed) {
            let message = format!("could not record which steps were not replayed: {err:#}");
            self.reporter.report(&Report::Warning(&message));
        }
        let list: Vec<String> = unreplayed.iter().map(u64::to_string).collect();
        let message = format!(
            "{} recorded request(s) were not replayed, no request of this run matched them (step {}): \
             the agent's path changed, or a request embeds something that changes (a time, an id); \
             `[proxy] ignore` in durun.toml leaves such parts out of matching",
            unreplayed.len(),
            list.join(", ")
        );
        self.reporter.report(&Report::Warning(&message));
    }

    /// The answer to a request over the task's token budget.
    fn budget_refusal(&self) -> Verdict {
        Verdict::over_budget(&format!(
            "task {} has {}",
            self.spec.task_id,
            self.budget
                .spent_out()
                .unwrap_or_else(|| "reached its budget".to_owned())
        ))
    }
}

/// What a request replayed by content meets.
enum ByContent {
    Replay(StepRecord),
    Run {
        record: StepRecord,
        fresh: bool,
        in_doubt: bool,
    },
    /// Part of the agent's open step N.
    OpenStep(u64),
    /// Answered: over the budget; the run stops.
    OverBudget,
    /// Answered: the journal failed; the run stops.
    Failed,
}
