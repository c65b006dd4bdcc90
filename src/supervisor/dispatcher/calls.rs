//! `call`: durun runs a configured tool, on a thread of its own, and
//! records what it returned.
//!
//! # Invariant
//!
//! A `mutate` tool starts only after its intent's commit; a `read` tool
//! only after a look at the lease and the cancel mark. A tool's result is
//! durable before the agent hears of it; a tool stopped with the run
//! (a signal, a cancel) records nothing and runs again on resume.

use std::sync::Arc;

use serde_json::Value;

use super::{Supervisor, Wanted};
use crate::config::{InDoubt, Tool, ToolKind};
use crate::executor::probe::Probed;
use crate::executor::{self, Cancel, Finished, Invocation};
use crate::journal::{StepError, StepKind, StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::protocol::{Effect, ErrorCode, Response};
use crate::report::Event as Report;
use crate::step_key;
use crate::supervisor::inbox::{Conn, Event, Probing};
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::steps::CallInFlight;
use crate::supervisor::transitions::Transition;

impl Supervisor<'_> {
    pub(super) fn on_call(&mut self, conn: Conn, id: Value, name: &str, args: Value) {
        let Some(tool) = self.spec.tools.get(name).cloned() else {
            let known: Vec<&str> = self.spec.tools.keys().map(String::as_str).collect();
            let message = if known.is_empty() {
                format!("no tool `{name}`: the task's durun.toml declares no tools")
            } else {
                format!(
                    "no tool `{name}` in the task's durun.toml (it has: {})",
                    known.join(", ")
                )
            };
            self.respond(conn, &Response::error(id, ErrorCode::UnknownTool, message));
            return;
        };
        let canonical = match step_key::canonical_json(&args) {
            Ok(canonical) => canonical,
            Err(err) => {
                return self.respond(
                    conn,
                    &Response::error(id, ErrorCode::BadRequest, err.to_string()),
                );
            }
        };
        if let Err(message) = tool.check_args(&args) {
            return self.respond(conn, &Response::error(id, ErrorCode::BadRequest, message));
        }
        let asked = Wanted {
            name,
            kind: StepKind::Call,
            effect: tool.effect,
            args: &args,
            canonical: &canonical,
            // A probe asks the destination before a person is asked.
            ask_first: tool.in_doubt == InDoubt::Ask && tool.probe.is_none(),
            request_hash: None,
        };
        let Some((record, fresh, in_doubt)) = self.open_step(conn, &id, asked) else {
            return;
        };
        if in_doubt && tool.probe.is_some() {
            self.start_probe(conn, id, tool, args, record, fresh);
        } else {
            self.run_call(conn, id, tool, args, record, fresh);
        }
    }

    /// Runs a call's tool: once its intent is durable for a `mutate` tool.
    fn run_call(
        &mut self,
        conn: Conn,
        id: Value,
        tool: Arc<Tool>,
        args: Value,
        record: StepRecord,
        fresh: bool,
    ) {
        if record.effect == Effect::Mutate {
            // Write-ahead: the tool starts once the intent is durable.
            self.outbox.batch.push(Deferred {
                conn,
                record,
                fresh,
                then: Then::Call { id, tool, args },
            });
        } else if self.may_start() {
            self.start_call(conn, id, tool, args, record, fresh);
        } else {
            self.refuse_start(conn, id, record.step);
        }
    }

    /// Runs a `call`'s tool on a thread of its own.
    pub(super) fn start_call(
        &mut self,
        conn: Conn,
        id: Value,
        tool: Arc<Tool>,
        args: Value,
        record: StepRecord,
        fresh: bool,
    ) {
        self.transition(Transition::Started);
        let fault = self.take_fault(&record);
        let step = record.step;
        let http = matches!(tool.kind, ToolKind::Http(_));
        let invocation = self.invocation(tool, args, &record);
        let call = CallInFlight::new(conn, id, record, fresh, http);
        self.off_the_loop("tool", call, move |cancel| {
            let finished = match fault {
                Some(kind) => made_fault(&kind, invocation.attempt),
                None => executor::run(&invocation, cancel),
            };
            Event::ToolDone { step, finished }
        });
    }

    /// Asks a tool's destination, on a thread of its own, whether step
    /// `record.step`, left in doubt, took effect (SPEC 22).
    fn start_probe(
        &mut self,
        conn: Conn,
        id: Value,
        tool: Arc<Tool>,
        args: Value,
        record: StepRecord,
        fresh: bool,
    ) {
        let Some(probe) = tool.probe_tool() else {
            return self.run_call(conn, id, tool, args, record, fresh);
        };
        let step = record.step;
        // `{key}` is the step's key.
        let mut asked = args.clone();
        if let Some(fields) = asked.as_object_mut() {
            fields.insert(
                "key".to_owned(),
                Value::String(record.idempotency_key.clone()),
            );
        }
        let invocation = self.invocation(Arc::new(probe), asked, &record);
        let probing = Box::new(Probing { tool, args });
        let call = CallInFlight::new(conn, id, record, fresh, false);
        self.off_the_loop("probe", call, move |cancel| Event::Probed {
            step,
            probed: executor::probe::run(&invocation, cancel),
            probing,
        });
    }

    /// What a tool (or its probe) runs with for step `record`.
    fn invocation(&self, tool: Arc<Tool>, args: Value, record: &StepRecord) -> Invocation {
        let step = record.step;
        Invocation {
            tool,
            args,
            task_id: self.spec.task_id.to_owned(),
            run: self.spec.run,
            step,
            attempt: record.attempts,
            idempotency_key: record.idempotency_key.clone(),
            cwd: self.spec.cwd.to_owned(),
            traceparent: self
                .spec
                .traceparent
                .as_deref()
                .and_then(|run| crate::trace::step_traceparent(run, step)),
        }
    }

    /// Runs `work` (a tool, or its probe: `what`) for `call`'s step on a
    /// thread of its own; the call is in flight, and a stop cancels it,
    /// until the event `work` makes comes back to the loop.
    fn off_the_loop(
        &mut self,
        what: &str,
        call: CallInFlight,
        work: impl FnOnce(&Cancel) -> Event + Send + 'static,
    ) {
        let step = call.record.step;
        let cancel = Arc::clone(&call.cancel);
        let tx = self.events_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("{what}-{step}"))
            .spawn(move || {
                let _ = tx.send(work(&cancel));
            });
        match spawned {
            Ok(_) => self.steps.calling(step, call),
            Err(err) => self.respond(
                call.conn,
                &Response::error(
                    call.id,
                    ErrorCode::ToolFailed,
                    format!("cannot start a thread for the {what}: {err}"),
                )
                .step(step),
            ),
        }
    }

    /// A probe answered: the step is reconciled with what its destination
    /// says it returned, runs again with its key, or stays in doubt.
    pub(super) fn on_probed(&mut self, step: u64, probed: Probed, probing: Probing) {
        let Some(call) = self.steps.call_ended(step) else {
            return;
        };
        let CallInFlight {
            conn,
            id,
            mut record,
            fresh,
            started,
            ..
        } = call;
        let Probing { tool, args } = probing;
        match probed {
            Probed::Applied(output) => {
                // No attempt ran: the one the probe settled counts.
                record.status = StepStatus::Committed;
                record.output = Some(JsonText::from_value(&output));
                let said = super::closing::reconciled(&mut record, "its probe", "run");
                self.reporter.report(&Report::Warning(&said));
                self.finish_step(conn, id, record, fresh, started);
            }
            Probed::NotApplied => self.run_call(conn, id, tool, args, record, fresh),
            Probed::Unknown(why) if tool.in_doubt == InDoubt::Ask => {
                self.reporter.report(&Report::Warning(&format!(
                    "step {step} ({}): its probe could not tell whether it took effect: {why}",
                    record.name
                )));
                self.ask_operator(conn, &id, &record);
            }
            Probed::Unknown(why) => {
                self.reporter.report(&Report::Warning(&format!(
                    "step {step} ({}): its probe could not tell whether it took effect ({why}); it runs again with its key",
                    record.name
                )));
                self.run_call(conn, id, tool, args, record, fresh);
            }
        }
    }

    pub(super) fn on_tool_done(&mut self, step: u64, finished: Finished) {
        let Some(call) = self.steps.call_ended(step) else {
            return;
        };
        let conn = call.conn;
        let mut record = call.record;
        record.attempts = finished.last_attempt;
        match finished.outcome {
            executor::Outcome::Cancelled => {
                self.respond(
                    conn,
                    &Response::error(
                        call.id,
                        ErrorCode::Cancelled,
                        format!("step {step} was stopped with the run; it runs again on resume"),
                    )
                    .step(step),
                );
                return;
            }
            executor::Outcome::Done { output, usage } => {
                record.status = StepStatus::Committed;
                record.tokens = usage.as_ref().map_or(0, crate::usage::tokens_of);
                record.usage = usage.as_ref().map(JsonText::from_value);
                record.output = Some(JsonText::from_value(&output));
            }
            executor::Outcome::Failed {
                code,
                message,
                output,
                ..
            } => {
                record.status = StepStatus::Failed;
                record.error = Some(StepError {
                    code,
                    // A tool's stderr may hold NUL, which no text column
                    // of PostgreSQL takes; its exact bytes are in `output`.
                    message: message.replace('\0', "\u{fffd}"),
                });
                record.output = output.as_ref().map(JsonText::from_value);
            }
        }
        self.finish_step(conn, call.id, record, call.fresh, call.started);
    }
}

/// The failure `durun test --fault KIND@STEP` makes of a tool call, in
/// place of the tool.
fn made_fault(kind: &str, attempt: u32) -> Finished {
    let code = if kind == "timeout" {
        ErrorCode::Timeout
    } else {
        ErrorCode::ToolFailed
    };
    Finished {
        outcome: executor::Outcome::Failed {
            code,
            message: format!("{kind}: a fault made by durun test (--fault)"),
            output: Some(serde_json::json!({ "fault": kind })),
            retryable: false,
            retry_after: None,
        },
        last_attempt: attempt,
    }
}
