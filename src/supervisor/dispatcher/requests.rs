//! Requests become steps: a `call` runs its tool, a `begin` hands the
//! step to the agent, a `commit` or `fail` closes it, a `result` stores the
//! task's output.
//!
//! # Invariant
//!
//! Steps are numbered in the order their requests arrive, and each number
//! meets the journal once ([`decide`]): replayed from the record, run
//! again with the record's key, or run new. A step whose effect is
//! `mutate` waits for its intent's commit before its tool starts or the
//! agent hears of it; a `read` step starts only after a look at the lease
//! and the cancel mark.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Supervisor, Wanted};
use crate::error::{Failure, Kind};
use crate::journal::{self, Journal, StepKind, StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::protocol::{Effect, ErrorCode, Request, Response};
use crate::report::Event as Report;
use crate::step_key;
use crate::supervisor::decide::{Asked, Decision, decide};
use crate::supervisor::ending::Stop;
use crate::supervisor::inbox::{AGENT, Conn};
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::recorded::Recorded;
use crate::supervisor::steps::OpenStep;
use crate::supervisor::transitions::Transition;

/// Names a task whose runs panic at the agent's first request, as a bug
/// would: for the tests of a worker's isolation.
pub(crate) const PANIC_TASK: &str = "DURUN_TEST_PANIC_TASK";

/// When a retried `mutate` step deserves a warning.
const KEY_MEMORY: Duration = Duration::from_secs(24 * 60 * 60);

impl Supervisor<'_> {
    pub(super) fn on_request(&mut self, conn: Conn, request: Request) {
        // The tests' stand-in for a bug: a worker contains it (SPEC 16).
        assert!(
            !self.spec.panic_on_request,
            "{PANIC_TASK} names task {}",
            self.spec.task_id
        );
        // A replay the proxy gave before this request came is counted
        // before it.
        self.count_taken();
        if self.ending.stop.is_some() {
            return self.refuse_stopping(conn, &request);
        }
        let Some((conn, request)) = self.hold_for_raise(conn, request) else {
            return;
        };
        match request {
            Request::Call { id, tool, args } => self.on_call(conn, id, &tool, args),
            Request::Begin {
                id,
                name,
                args,
                effect,
                mcp: false,
            } => self.on_begin(conn, id, &name, &args, effect.unwrap_or(Effect::Read)),
            Request::Begin {
                id,
                name,
                args,
                effect,
                mcp: true,
            } => self.on_mcp_begin(conn, id, &name, &args, effect.unwrap_or(Effect::Mutate)),
            Request::Commit {
                id,
                step,
                output,
                usage,
            } => self.on_close(conn, id, step, Ok((output, usage))),
            Request::Reconciled { id, step, output } => {
                self.reconciling(conn, &step);
                self.on_close(conn, id, step, Ok((output, None)));
            }
            Request::Fail {
                id,
                step,
                error,
                output,
            } => self.on_close(conn, id, step, Err((error, output))),
            Request::Wait {
                id,
                name,
                data,
                timeout,
            } => self.on_wait(conn, id, &name, &data, timeout),
            Request::Sleep { id, args, wake } => self.on_sleep(conn, id, &args, wake),
            Request::Spawn { id, spawn } => {
                let spawn = *spawn;
                self.on_spawn(
                    conn,
                    id,
                    &spawn.name,
                    (spawn.command, spawn.args, spawn.queue),
                );
            }
            Request::Join { id, task, timeout } => self.on_join(conn, id, &task, timeout),
            Request::Retry { id, step } => self.on_retry(conn, id, step),
            Request::Patched { id, name } => self.on_patched(conn, id, &name),
            Request::Ahead { id } => self.on_ahead(conn, id),
            Request::Replayed { id, through, key } => self.on_replayed(conn, id, through, &key),
            Request::Find { id, key } => self.on_find(conn, id, &key),
            Request::Result { id, output } => {
                // Steps that came before it are recorded first.
                self.flush();
                if self.holding.fenced {
                    return;
                }
                let (task, run) = (self.spec.task_id, self.spec.run);
                match self.journal().set_output(task, run, &output) {
                    Ok(()) => self.respond(conn, &Response::ok(id)),
                    Err(err) => self.write_failed(conn, &id, err),
                }
            }
        }
    }

    /// Reads the first page of recorded steps while the agent starts, not
    /// at its first request: a resume's first step would wait for it. A
    /// failure is left to that request, which reads again and reports it.
    pub(super) fn read_first_page(&mut self) {
        let _ = self.page_for(self.steps.next_step());
    }

    /// Reads the next page of recorded steps once an `ahead` answer offered
    /// the last one in memory: the agent replays those itself meanwhile,
    /// and its next request would wait for the read. A failure is left to
    /// that request, which reads again and reports it.
    pub(super) fn read_next_page(&mut self) {
        if self.steps.recorded.wants_next() {
            let task = self.spec.task_id;
            let (recorded, journal) = self.recorded_and_journal();
            let _ = recorded.read_next(journal, task);
        }
    }

    /// Makes sure the recorded page in memory holds `step`, if the journal
    /// does: reads the next page once the one in memory is used up (unless
    /// it was read ahead).
    fn page_for(&mut self, step: u64) -> anyhow::Result<()> {
        if self.steps.recorded.needs_page(step) {
            let task = self.spec.task_id;
            let (recorded, journal) = self.recorded_and_journal();
            recorded.read_page(journal, task, step)?;
        }
        Ok(())
    }

    /// The recorded steps and the journal to read them from, home: a batch
    /// in flight lands first, so a page holds every commit before it.
    fn recorded_and_journal(&mut self) -> (&mut Recorded, &mut dyn Journal) {
        self.settle();
        let journal = self.journal.as_deref_mut().expect("the journal is home");
        (&mut self.steps.recorded, journal)
    }

    /// The number the agent's next protocol step takes; nothing is taken
    /// yet. Recorded steps replayed by content are passed over; a number
    /// the journal lacks below its highest is the agent's own (a `read`
    /// step a dead run never finished leaves one: every proxy and MCP
    /// number is written in the commit that gives it), and past the
    /// recorded steps it is a number no step holds. Read from the journal
    /// only once a page of recorded steps is used up.
    pub(super) fn next_protocol_step(&mut self) -> anyhow::Result<u64> {
        let mut step = self.steps.next_step();
        loop {
            self.page_for(step)?;
            match self.steps.recorded.kind_at(step) {
                Some(kind) if kind.by_content() => {
                    // Never a protocol step's number, and gone from the
                    // page once passed: passed for good, so that a request
                    // that takes no number (`ahead`, a `patched` on an
                    // older path) leaves the numbering where it found it.
                    self.steps.passed(step);
                    step += 1;
                }
                Some(_) => return Ok(step),
                None if step <= self.steps.recorded.last() => return Ok(step),
                None => return Ok(self.steps.peek_new(step)),
            }
        }
    }

    /// Answers a request that comes while the run stops.
    pub(super) fn refuse_stopping(&mut self, conn: Conn, request: &Request) {
        self.respond(
            conn,
            &Response::error(
                request.id().clone(),
                ErrorCode::Cancelled,
                "the run is stopping; the task can be resumed",
            ),
        );
    }

    /// Answers a step that may not start because the run is stopping.
    pub(super) fn refuse_start(&mut self, conn: Conn, id: Value, step: u64) {
        self.respond(
            conn,
            &Response::error(
                id,
                ErrorCode::Cancelled,
                format!("step {step} was stopped with the run; it runs again on resume"),
            )
            .step(step),
        );
    }

    /// The args' canonical form, or `bad_request` answered (`NaN`, a lone
    /// surrogate: what a key cannot be made of).
    pub(super) fn canonical_args(
        &mut self,
        conn: Conn,
        id: &Value,
        args: &Value,
    ) -> Option<String> {
        match step_key::canonical_json(args) {
            Ok(canonical) => Some(canonical),
            Err(err) => {
                self.respond(
                    conn,
                    &Response::error(id.clone(), ErrorCode::BadRequest, err.to_string()),
                );
                None
            }
        }
    }

    fn on_begin(&mut self, conn: Conn, id: Value, name: &str, args: &Value, effect: Effect) {
        let Some(canonical) = self.canonical_args(conn, &id, args) else {
            return;
        };
        let asked = Wanted {
            name,
            kind: StepKind::Begin,
            effect,
            args,
            canonical: &canonical,
            ask_first: false,
            request_hash: None,
        };
        let Some((record, fresh, in_doubt)) = self.open_step(conn, &id, asked) else {
            return;
        };
        if fresh && let Some(seed) = self.take_seed(&record) {
            return self.answer_seeded(conn, id, record, seed);
        }
        if record.effect == Effect::Mutate {
            // Write-ahead: the agent hears of the step once its intent is
            // durable.
            self.outbox.batch.push(Deferred {
                conn,
                record,
                fresh,
                then: Then::Opened { id, in_doubt },
            });
        } else if self.may_start() {
            self.opened(conn, id, record, fresh, in_doubt);
        } else {
            self.refuse_start(conn, id, record.step);
        }
    }

    /// Answers a `begin` and keeps its step open until its commit or fail.
    pub(super) fn opened(
        &mut self,
        conn: Conn,
        id: Value,
        record: StepRecord,
        fresh: bool,
        in_doubt: bool,
    ) {
        let response = Response::ok(id.clone()).step(record.step);
        self.opened_as(conn, id, record, fresh, in_doubt, response);
    }

    /// [`Self::opened`], answered with `response` as it is so far.
    pub(super) fn opened_as(
        &mut self,
        conn: Conn,
        id: Value,
        record: StepRecord,
        fresh: bool,
        in_doubt: bool,
        mut response: Response,
    ) {
        if record.kind == StepKind::Mcp && conn != AGENT && !self.outbox.writers.contains_key(&conn)
        {
            // Its `durun mcp` left while the intent was written: in doubt
            // for whoever asks next.
            if !fresh {
                self.steps.contents.keep_pending(record);
            }
            return;
        }
        response.replayed = Some(false);
        response.attempt = Some(record.attempts);
        response.idempotency_key = Some(record.idempotency_key.clone());
        response.in_doubt = in_doubt.then_some(true);
        self.steps.opened(
            record.step,
            OpenStep {
                record,
                begun_by: (conn, id),
                fresh,
                started: Instant::now(),
                proxied: Vec::new(),
                proxied_cost: Some(0),
            },
        );
        self.respond(conn, &response);
        self.transition(Transition::Started);
    }

    /// Numbers the next step and decides, against the journal, whether it
    /// runs (returned, with whether its row is new and whether it is in
    /// doubt) or is answered here (replay, divergence, journal failure).
    pub(super) fn open_step(
        &mut self,
        conn: Conn,
        id: &Value,
        wanted: Wanted<'_>,
    ) -> Option<(StepRecord, bool, bool)> {
        let step = match self.next_protocol_step() {
            Ok(step) => step,
            Err(err) => {
                self.journal_failed(conn, id, err);
                return None;
            }
        };
        self.steps.take_number(step);
        let args_hash = step_key::args_hash(wanted.canonical);
        let recorded = self.steps.recorded.take(step);
        let asked = Asked {
            name: wanted.name,
            args_hash: &args_hash,
            ask_first: wanted.ask_first,
        };
        let (mut record, fresh, in_doubt) = match (
            decide(recorded.as_ref(), &asked, self.steps.last_recorded()),
            recorded,
        ) {
            (Decision::Run, _) | (_, None) => {
                if self.over_budget(conn, id, step) {
                    return None;
                }
                (self.new_record(step, &wanted, args_hash), true, false)
            }
            (Decision::Await, Some(mut recorded)) => {
                recorded.run = self.spec.run;
                (recorded, false, false)
            }
            (Decision::Diverge, Some(recorded)) => {
                self.diverge(conn, id, &recorded, wanted.name, wanted.args);
                return None;
            }
            (Decision::AskOperator, Some(recorded)) => {
                self.ask_operator(conn, id, &recorded);
                return None;
            }
            (Decision::Replay, Some(recorded)) => {
                // Answered from the window read ahead: no round trip
                // of its own, and the output moves into the answer
                // uncopied.
                self.count_replayed(&recorded);
                self.respond(conn, &replay_response(id.clone(), recorded));
                return None;
            }
            (Decision::Retry { in_doubt }, Some(recorded)) => {
                if self.over_budget(conn, id, step) {
                    return None;
                }
                (self.next_attempt(recorded), false, in_doubt)
            }
        };
        record.effect = wanted.effect;
        self.transition(Transition::Opened {
            step,
            name: wanted.name,
            attempt: record.attempts,
        });
        Some((record, fresh, in_doubt))
    }

    /// Counts a step answered from the journal, as `inspect` and the
    /// progress show it.
    pub(super) fn count_replayed(&mut self, record: &StepRecord) {
        self.stats.replayed_steps += 1;
        self.stats.tokens_saved += record.tokens;
        self.stats.cost.saved_nanos += record.cost_nanos.unwrap_or(0);
        self.transition(Transition::Replayed {
            step: record.step,
            name: &record.name,
        });
    }

    /// The row of a step the journal does not hold yet: attempt 1.
    pub(super) fn new_record(
        &self,
        step: u64,
        wanted: &Wanted<'_>,
        args_hash: String,
    ) -> StepRecord {
        let now = journal::now();
        StepRecord {
            step,
            name: wanted.name.to_owned(),
            kind: wanted.kind,
            effect: wanted.effect,
            args: JsonText::from_value(wanted.args),
            args_hash,
            idempotency_key: step_key::idempotency_key(self.spec.task_id, step, wanted.canonical),
            status: StepStatus::Pending,
            attempts: 1,
            output: None,
            error: None,
            usage: None,
            tokens: 0,
            run: self.spec.run,
            created_at: now.clone(),
            started_at: now,
            finished_at: None,
            resolution: None,
            seen_from: None,
            wake_at: None,
            cost_nanos: None,
            request_hash: wanted.request_hash.map(str::to_owned),
        }
    }

    /// A recorded step run again (a run died inside it, or the agent died
    /// on its failure): the next attempt, the same key.
    pub(super) fn next_attempt(&mut self, mut record: StepRecord) -> StepRecord {
        if record.effect == Effect::Mutate && older_than(&record.created_at, KEY_MEMORY) {
            let message = format!(
                "step {} ({}) is retried more than 24 hours after its first attempt; \
                 many APIs forget idempotency keys by then, so check it did not take effect twice",
                record.step, record.name
            );
            self.reporter.report(&Report::Warning(&message));
        }
        // An operator's `retry` allows one more attempt, not all.
        record.resolution = None;
        record.attempts += 1;
        record.status = StepStatus::Pending;
        record.started_at = journal::now();
        record.finished_at = None;
        record.error = None;
        record.output = None;
        record.seen_from = None;
        record.run = self.spec.run;
        record
    }

    fn diverge(&mut self, conn: Conn, id: &Value, recorded: &StepRecord, name: &str, args: &Value) {
        let step = recorded.step;
        let show =
            |value: &Value| step_key::canonical_json(value).unwrap_or_else(|_| value.to_string());
        self.respond(
            conn,
            &Response::error(
                id.clone(),
                ErrorCode::Divergence,
                format!(
                    "step {step} diverged: the journal holds `{}`, the agent asked for `{name}` with other args",
                    recorded.name
                ),
            )
            .step(step),
        );
        let mut details = format!(
            "journal: step {step} `{}` args {}\nagent:   step {step} `{name}` args {}",
            recorded.name,
            show(&recorded.args.value()),
            show(args)
        );
        if recorded.name == name {
            details.push_str("\ndifference:");
            for line in crate::diff::args_diff(&recorded.args.value(), args) {
                details.push('\n');
                details.push_str(&line);
            }
        }
        let failure = Failure::new(Kind::Divergence,
            format!(
                "step {step} of task {} diverged from the journal: the agent took another path since it was recorded",
                self.spec.task_id
            ),
        )
        .details(details)
        .hint(format!(
            "durun never runs a new step over a recorded one: `durun resume {task} --from-step {step}` runs the new path from step {step} (it lists what already took effect), or start the agent as a new task",
            task = self.spec.task_id
        ));
        self.stop(Stop::Failure(failure.into()));
    }

    /// A step of an `in_doubt = "ask"` tool may have taken effect and its API
    /// takes no key: stop until an operator decides (exit 76).
    pub(super) fn ask_operator(&mut self, conn: Conn, id: &Value, record: &StepRecord) {
        let step = record.step;
        let task = self.spec.task_id;
        self.respond(
            conn,
            &Response::error(
                id.clone(),
                ErrorCode::Cancelled,
                format!("step {step} is in doubt and waits for `durun resolve`; the run stops"),
            )
            .step(step),
        );
        let failure = Failure::new(Kind::InDoubt,
            format!(
                "step {step} ({}) of task {task} may or may not have taken effect, and its tool is `in_doubt = \"ask\"`",
                record.name
            ),
        )
        .details(format!(
            "args {}\nkey  {}\nattempts so far: {}, the last started {}",
            step_key::canonical_json(&record.args.value()).unwrap_or_default(),
            record.idempotency_key,
            record.attempts,
            record.started_at
        ))
        .hint(format!(
            "check whether it happened, then `durun resolve {task} {step} --retry | --output JSON | --fail MESSAGE` and `durun resume {task}`"
        ));
        self.stop(Stop::Failure(failure.into()));
    }
}

/// The answer to a step the journal holds: its output, or its failure.
pub(super) fn replay_response(id: Value, recorded: StepRecord) -> Response {
    let mut response = match (&recorded.status, &recorded.error) {
        (StepStatus::Failed, Some(error)) => {
            Response::error(id, error.code, error.message.as_str())
        }
        (StepStatus::Failed, None) => Response::error(id, ErrorCode::ToolFailed, "failed"),
        _ => Response::ok(id),
    };
    response.step = Some(recorded.step);
    response.replayed = Some(true);
    response.output = Some(recorded.output.unwrap_or_else(JsonText::null));
    response.idempotency_key = Some(recorded.idempotency_key);
    response
}

/// Whether the RFC 3339 time `then` is more than `age` ago.
fn older_than(then: &str, age: Duration) -> bool {
    humantime::parse_rfc3339(then)
        .ok()
        .and_then(|then| then.elapsed().ok())
        .is_some_and(|elapsed| elapsed > age)
}
