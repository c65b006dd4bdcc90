//! Child tasks (SPEC 16): `spawn` makes task `PARENT-sN` as step N of the
//! parent (kind `spawn`, effect `mutate`), and `join` waits for a child to
//! end as `wait` waits for a signal: live, then parked.
//!
//! # Invariant
//!
//! A child is made only once its parent's `spawn` step is durable, under
//! the id the step fixes: a replay or a retry of the step never makes a
//! second child. A `join` step commits the child's status and output once
//! the child has ended (completed, failed or cancelled).

use std::time::Instant;

use serde_json::{Value, json};

use super::{Supervisor, Wanted};
use crate::journal::{NewTask, StepError, StepKind, StepRecord, StepStatus, TaskStatus};
use crate::json_text::JsonText;
use crate::protocol::{Effect, ErrorCode};
use crate::supervisor::inbox;
use crate::supervisor::inbox::Conn;
use crate::supervisor::outbox::{Deferred, Then};
use crate::supervisor::steps::Waiter;
use crate::supervisor::transitions::Transition;

/// The id of the child a parent's step `step` spawns.
fn child_id(parent: &str, step: u64) -> String {
    format!("{parent}-s{step}")
}

/// Whether a task has ended for good: what `join` waits for.
fn ended(status: TaskStatus) -> bool {
    matches!(
        status,
        TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
    )
}

impl Supervisor<'_> {
    pub(super) fn on_spawn(
        &mut self,
        conn: Conn,
        id: Value,
        name: &str,
        (command, args, queue): (Vec<String>, Value, Option<String>),
    ) {
        let step_args = json!({ "command": command, "args": args, "queue": queue });
        let Some(canonical) = self.canonical_args(conn, &id, &step_args) else {
            return;
        };
        // A replay answers from the journal; its child, if it has no queue
        // and no runner now (the parent's last runner died), runs again.
        let next = self.next_protocol_step().ok();
        let wanted = Wanted {
            name,
            kind: StepKind::Spawn,
            effect: Effect::Mutate,
            args: &step_args,
            canonical: &canonical,
            ask_first: false,
            request_hash: None,
        };
        let Some((mut record, fresh, _)) = self.open_step(conn, &id, wanted) else {
            if let Some(step) = next
                && queue.is_none()
            {
                self.keep_child_running(&child_id(self.spec.task_id, step));
            }
            return;
        };
        record.kind = StepKind::Spawn;
        // Write-ahead: the child is made once the step's intent is durable.
        self.outbox.batch.push(Deferred {
            conn,
            record,
            fresh,
            then: Then::Spawn {
                id,
                started: Instant::now(),
            },
        });
    }

    /// A `spawn` step's intent is durable: the child is made (once: its id
    /// is the step's), the step finished with its id, and a child without
    /// a queue started beside the agent.
    pub(super) fn spawned(
        &mut self,
        conn: Conn,
        id: Value,
        mut record: StepRecord,
        started: Instant,
    ) {
        if self.ending.stop.is_some() || !self.may_start() {
            return self.refuse_start(conn, id, record.step);
        }
        let args = record.args.value();
        let command: Vec<String> = args["command"]
            .as_array()
            .map(|words| {
                words
                    .iter()
                    .filter_map(|word| word.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let queue = args["queue"].as_str().map(str::to_owned);
        let child = child_id(self.spec.task_id, record.step);
        // Started before the child is made: `durun test`'s kill points fall
        // before it and after.
        self.transition(Transition::Started);
        // The task's budget covers the child's calls from its first.
        self.share_budget_with_children();
        if let Err(err) = self.make_child(&child, command, queue.clone()) {
            return self.write_failed(conn, &id, err);
        }
        record.status = StepStatus::Committed;
        record.output = Some(JsonText::from_value(&json!({ "task": child })));
        self.finish_step(conn, id, record, false, started);
        self.flush();
        if queue.is_none() && self.ending.stop.is_none() {
            self.start_child(&child);
        }
    }

    fn make_child(
        &mut self,
        child: &str,
        command: Vec<String>,
        queue: Option<String>,
    ) -> anyhow::Result<()> {
        let parent = self.spec.task_id;
        let spent = self.budget.spent();
        let journal = self.journal();
        if journal.task(child)?.is_some() {
            return Ok(());
        }
        let Some(parent) = journal.task(parent)? else {
            anyhow::bail!("task {parent} is gone from the journal");
        };
        // A child's tokens count against its parent's budget: it gets
        // what is left of it.
        let left = parent
            .max_tokens
            .map(|max| max.saturating_sub(spent.tokens));
        let cost_left = parent
            .max_cost_nanos
            .map(|max| max.saturating_sub(spent.nanos));
        journal.create_task(&NewTask {
            id: child.to_owned(),
            argv: command,
            cwd: parent.cwd,
            config: parent.config,
            config_path: parent.config_path,
            sync: parent.sync,
            created_at: crate::journal::now(),
            max_tokens: left,
            max_cost_nanos: cost_left,
            queue,
            retries: None,
            // A child's agent reads what its config says, not the stdin
            // its parent's run was given; its model calls go where its
            // parent's do.
            launch: crate::journal::Launch {
                stdin: None,
                upstreams: parent.launch.upstreams,
                preset: None,
            },
        })
    }

    /// Runs the child beside the agent now, or once a runner ends when
    /// `child_jobs` run already.
    fn start_child(&mut self, child: &str) {
        let jobs = self.spec.child_jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        });
        if self.children.admit(child, jobs) {
            self.run_child(child);
        }
    }

    /// A child's runner ended: the next waiting child gets its place.
    pub(super) fn child_ended(&mut self, child: &str) {
        if let Some(next) = self.children.ended(child, self.ending.stop.is_none()) {
            self.run_child(&next);
        }
    }

    /// Says which children had not ended when the run ended as `status`:
    /// their runners die with this durun and leave them interrupted, for a
    /// resume (SPEC 16), which a completed parent never gets.
    pub(super) fn say_unfinished_children(&mut self, status: TaskStatus) {
        let left = self.children.unfinished();
        if left.is_empty() || status == TaskStatus::Cancelled {
            return;
        }
        let how = match left.as_slice() {
            [one] => format!("`durun resume {one}` carries it on"),
            _ => "`durun resume --all` carries them on".to_owned(),
        };
        let said = format!(
            "child task{} {} had not ended when task {}'s run ended: stopped with it, {} left interrupted; {how}",
            if left.len() == 1 { "" } else { "s" },
            left.join(", "),
            self.spec.task_id,
            if left.len() == 1 { "it is" } else { "they are" },
        );
        self.reporter.report(&crate::report::Event::Warning(&said));
    }

    /// Starts `durun resume CHILD` beside the agent: it takes the child's
    /// lease as any run does, and dies with this durun (its task is then
    /// left for the parent's next run, or `resume --all`).
    fn run_child(&mut self, child: &str) {
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let mut command = std::process::Command::new(exe);
        if let Some(journal) = self.spec.journal_arg {
            command.env("DURUN_JOURNAL", journal);
        }
        command
            .args(["-q", "resume", child])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        crate::os::die_with_parent(&mut command);
        match command.spawn() {
            Ok(mut runner) => {
                self.children.started(child);
                // Reaped by a thread of its own, which tells the loop.
                let events = self.events_tx.clone();
                let ended = inbox::Event::ChildEnded(child.to_owned());
                let _ = std::thread::Builder::new()
                    .name(format!("child {child}"))
                    .spawn(move || {
                        let _ = runner.wait();
                        let _ = events.send(ended);
                    });
            }
            Err(err) => self
                .reporter
                .report(&crate::report::Event::Warning(&format!(
                    "could not start child task {child} ({err}); `durun resume {child}` runs it"
                ))),
        }
    }

    /// Starts a replayed step's child again unless it has ended: its
    /// runner died with the parent's. A child another runner holds, or
    /// parked and not ready, stops at once (exit 75, 77) without starting
    /// its agent.
    fn keep_child_running(&mut self, child: &str) {
        let Ok(Some(task)) = self.journal().task(child) else {
            return;
        };
        if task.queue.is_none() && !ended(task.status) {
            self.start_child(child);
        }
    }

    pub(super) fn on_join(
        &mut self,
        conn: Conn,
        id: Value,
        task: &str,
        timeout: Option<std::time::Duration>,
    ) {
        let args = json!({ "task": task });
        let Some((waiter, fresh)) =
            self.start_waiting(conn, id, ("join", StepKind::Join, &args), timeout)
        else {
            return;
        };
        self.look_for_child(waiter, fresh);
    }

    /// Answers a `join` whose child has ended; or keeps it waiting
    /// (written `waiting` if new), parks the run after `park_after`, or
    /// fails the step at its timeout or for a child that does not exist.
    pub(super) fn look_for_child(&mut self, waiter: Waiter, fresh: bool) {
        let child = waiter.record.args.value()["task"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let timed_out = waiter.until.is_some_and(|until| self.spec.now() >= until);
        let found = match self.journal().task(&child) {
            Ok(found) => found,
            Err(err) => return self.journal_failed(waiter.conn, &waiter.id, err),
        };
        let failure = match &found {
            None => Some((
                ErrorCode::BadRequest,
                format!("there is no task {child} to join"),
            )),
            Some(_) if timed_out => Some((
                ErrorCode::Timeout,
                format!(
                    "task {child} had not ended at the join's timeout ({})",
                    waiter.record.wake_at.as_deref().unwrap_or("?")
                ),
            )),
            Some(_) => None,
        };
        let mut record = waiter.record;
        if let Some(task) = found.as_ref().filter(|task| ended(task.status)) {
            record.status = StepStatus::Committed;
            record.output = Some(JsonText::from_value(&json!({
                "task": child,
                "status": task.status.as_str(),
                "output": task.output,
            })));
            self.finish_step(waiter.conn, waiter.id, record, fresh, waiter.since);
            self.flush();
            return;
        }
        if let Some((code, message)) = failure {
            record.status = StepStatus::Failed;
            record.error = Some(StepError { code, message });
            self.finish_step(waiter.conn, waiter.id, record, fresh, waiter.since);
            self.flush();
            return;
        }
        let waiter = Waiter { record, ..waiter };
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
        self.steps.recorded_up_to(waiter.record.step);
        // A child without a queue runs beside this agent and would end with
        // this durun: its join waits live, it never parks.
        let beside = found.as_ref().is_some_and(|task| task.queue.is_none());
        if !beside && waiter.since.elapsed() >= self.spec.park_after {
            self.park(waiter);
        } else {
            self.steps.waiting(waiter.record.step, waiter);
        }
    }
}
