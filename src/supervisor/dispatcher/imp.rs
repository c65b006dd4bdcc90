//! The supervisor loop: one agent process, its requests, the journal.
//!
//! # Invariant
//!
//! A step's result is durable in the journal before its answer is written
//! to the agent, and a `mutate` step's intent (`pending`) is durable before
//! its tool starts or the agent is told to run it. A `read` step is written
//! once, when it finishes: repeating it after a crash is safe.
//!
//! # Threads
//!
//! The loop owns the journal and all state, and reads the agent's stdout
//! and writes its stdin itself, without blocking ([`AgentIo`]): a step
//! costs one wake-up of durun and one of the agent, no hand-off between
//! threads. Other threads only send it events ([`crate::supervisor::inbox`]): one per
//! tool call runs the tool, the socket's serve `durun step` clients, and
//! the model proxy's serves its clients; those two start at their first
//! client (the loop polls their listeners until then), and the agent's
//! exit and durun's signals wake the loop's `poll` itself where the
//! kernel allows (a pidfd, the wake pipe). One more copies the agent's
//! prints to durun's stdout ([`crate::supervisor::passthrough::Passthrough`]), from
//! the first print.
//! And the committer borrows the journal to write a batch no one waits for
//! (the commits of an agent that does not wait for their answers), so
//! that the loop answers the agent's next `read` step during the fsync
//! (see [`super::commit`]); it starts with the first such batch.
//!
//! # The rooms
//!
//! Requests become steps in `requests` (with the replay decision, a pure
//! function, in `decide`); steps that arrive together are written in one
//! commit in `commit` (on the loop, or off it when no one waits); the
//! lease is renewed and fenced in `fencing`; a stop (a signal, a
//! divergence, a journal failure) is handled in `stopping`.

use std::sync::mpsc::{self, TryRecvError};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Parts, Supervisor};
use crate::error::{Failure, Kind};
use crate::exit_code;
use crate::journal::{Journal, RunStats, TaskStatus};
use crate::os;
use crate::protocol::{self, ErrorCode, Line, Response};
use crate::report::{Event as Report, Reporter};
use crate::supervisor::agent_io::AgentIo;
use crate::supervisor::book::Closed;
use crate::supervisor::committer::Committer;
use crate::supervisor::inbox::{AGENT, Conn, Event, Events};
use crate::supervisor::lines::Chunk;
use crate::supervisor::outbox::Deferred;
use crate::supervisor::spec::{DRAIN_GRACE, Outcome, Output, RunSpec};
use crate::supervisor::{child, committer, socket};

/// The most answers (bytes) waiting for the agent to read them: past it,
/// durun stops reading the agent's requests until it reads its answers. An
/// agent that writes every request before reading any answer works up to
/// about 180,000 requests.
const ANSWER_BOUND: usize = 16 * 1024 * 1024;
/// Runs the agent of `spec` to its end, serving its requests.
pub(crate) fn supervise(
    spec: &RunSpec<'_>,
    journal: &mut dyn Journal,
    reporter: &mut dyn Reporter,
) -> anyhow::Result<Outcome> {
    let (recorded_steps, last_recorded) = spec.recorded;
    reporter.report(&Report::RunStarted {
        task: spec.task_id,
        run: spec.run,
        recorded_steps: recorded_steps as usize,
    });

    let (events_tx, events, wake) = Events::new()
        .map_err(|err| anyhow::anyhow!("failed to create a pipe for the run: {err}"))?;
    // Signals are caught before the agent starts, so none is lost between;
    // a worker's runs get them from the worker.
    let caught = match &spec.stops {
        Some(_) => None,
        None => Some(child::Caught::new(events_tx.wake())?),
    };
    let _joined = spec
        .stops
        .as_ref()
        .map(|stops| stops.join(events_tx.clone()));

    let mut socket = socket::listen(events_tx.clone(), spec.runtime_dir.as_deref())
        .map_err(|err| anyhow::anyhow!("failed to create the socket for `durun step`: {err}"))?;
    let mut proxy = start_proxy(spec, &events_tx)?;
    let agent_env = agent_env(spec, proxy.as_ref(), last_recorded);
    // A CLI that reads no base URL variable is told the proxy in its
    // arguments (Codex's `-c`).
    let argv = match (spec.preset, &proxy) {
        (Some((preset, Some(at))), Some(proxy)) => {
            preset.argv(spec.argv, at, |route| proxy.route_url(route))
        }
        _ => spec.argv.to_vec(),
    };
    let copier = reporter.stderr_copier();
    let mut child =
        match child::spawn_agent(spec, &argv, &socket.path, &agent_env, copier.is_some()) {
            Ok(child) => child,
            Err(err) => return Ok(cannot_start(spec, &err)),
        };
    let child_pid = child.pid;
    // Dropped when this function returns, or with durun: the keeper then
    // ends whatever of the agent's tree is still alive.
    let lifeline = child.lifeline;
    let stderr_done = match (copier, child.stderr.take()) {
        (Some(copy), Some(stderr)) => Some(child::spawn_stderr_copier(stderr, copy)),
        _ => None,
    };
    let mut io = AgentIo::new(child.stdin, child.stdout, wake)?;
    // The keeper says the agent's exit once the agent's whole tree has
    // ended, and exits with the agent's status.
    if !io.watch_exit(child.keeper, child.status) {
        child::spawn_exit_waiter(child.keeper, events_tx.clone());
    }
    socket.sweep_once();
    // The HTTP client loads the system's roots when it is made: done while
    // the agent starts, not in its first HTTP tool's call.
    if spec
        .tools
        .values()
        .any(|tool| matches!(tool.kind, crate::config::ToolKind::Http(_)))
    {
        crate::web::warm();
    }

    let committer_events = events_tx.clone();
    let mut outcome = std::thread::scope(|scope| {
        let (jobs_tx, jobs) = mpsc::channel();
        let (landed, landed_rx) = mpsc::channel();
        // Started by the first batch no one waits for: an agent that waits
        // for its answers never needs the thread.
        let start: Box<dyn FnOnce() -> std::io::Result<()> + '_> = Box::new(move || {
            std::thread::Builder::new()
                .name("durun-committer".into())
                .spawn_scoped(scope, move || {
                    committer::committer(&jobs, &landed, &committer_events, spec.task_id, spec.run);
                })
                .map(drop)
        });
        let mut supervisor = Supervisor::new(Parts {
            spec,
            journal,
            committer: Committer::new((jobs_tx, landed_rx), start, spec.task_id, spec.run),
            reporter,
            io,
            events_tx,
            socket: &mut socket,
            last_recorded,
        });
        supervisor.child_pid = child_pid;
        supervisor.interactive = os::stdin_is_terminal();
        supervisor.caught = caught.as_ref();
        supervisor.proxy = proxy.as_mut();
        supervisor.read_first_page();
        supervisor.serve(&events);
        supervisor.count_taken();
        supervisor.report_unreplayed();
        // The journal comes home before the run's end is recorded; the
        // committer ends with its channel.
        supervisor.journal();
        anyhow::Ok(supervisor.outcome())
    })?;
    drop(lifeline);
    drop(caught);
    drop(proxy);
    drop(socket);
    if let Some(output) = &mut outcome.output {
        output.stderr_done = stderr_done;
    }
    Ok(outcome)
}

impl Supervisor<'_> {
    fn serve(&mut self, events: &mpsc::Receiver<Event>) {
        loop {
            if self.finished() {
                return;
            }
            let mut wait = Duration::from_millis(500).min(self.spec.lease.heartbeat);
            if let Some(kill_at) = self.ending.kill_at {
                wait = wait.min(kill_at.saturating_duration_since(Instant::now()));
            }
            if let Some(bound) = self.wait_bound() {
                wait = wait.min(bound);
            }
            if let Some(bound) = self.tree_bound() {
                wait = wait.min(bound);
            }
            let read = self.may_read();
            let listeners = [
                self.proxy
                    .as_deref()
                    .and_then(crate::proxy::Proxy::idle_listener),
                self.socket.idle_listener(),
            ];
            let [proxy_client, socket_client] = self.io.wait(wait, read, listeners);
            if proxy_client {
                // Before the proxy reads its first request: a resumed
                // request byte-identical to a recorded one is then
                // replayed without being parsed, the first one too. A
                // journal error here is met again, and said, at the
                // request.
                let _ = self.load_contents();
            }
            if proxy_client
                && let Some(proxy) = self.proxy.as_deref_mut()
                && let Err(err) = proxy.serve(self.steps.contents.book())
            {
                self.not_serving("the model proxy", &err);
            }
            if socket_client && let Err(err) = self.socket.serve() {
                self.not_serving("the socket of `durun step`", &err);
            }
            // A pause (SIGSTOP, a suspended machine) may have outlasted
            // the lease: look before acting on anything.
            self.check_renewal();
            if read {
                self.read_agent();
            }
            if let Some(status) = self.io.reaped() {
                self.handle(Event::Exited(status));
            }
            if let Some(caught) = self.caught {
                caught.take(|signal| self.handle(Event::Signal(signal)));
            }
            loop {
                match events.try_recv() {
                    Ok(event) => self.handle(event),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if read && self.only_commits_wait() && self.io.spin_for_more() {
                // The agent's next request, most often a step opened right
                // after this commit, joins the same batch: a `mutate`
                // step's intent then costs no commit of its own.
                self.read_agent();
            }
            // What is answered already owes nothing to the batch (an answer
            // that does is pushed by the batch's continuation, after its
            // commit): it goes out before the disk's wait.
            if self.check_renewal() {
                self.io.write_out();
            }
            self.flush();
            if self.check_renewal() {
                self.io.write_out();
            }
            self.tick();
            // With the answers out: the agent works meanwhile.
            self.read_next_page();
        }
    }

    /// A listener's thread could not start at its first client: it was
    /// closed, so its clients are refused rather than left waiting.
    fn not_serving(&mut self, what: &str, err: &std::io::Error) {
        let message = format!("cannot start {what}: {err}; its clients are refused");
        self.reporter.report(&Report::Warning(&message));
    }

    /// Whether the agent's stdout may be read now: it is open, no print of
    /// the agent's waits for the copier, and the agent takes its answers.
    pub(super) fn may_read(&mut self) -> bool {
        !self.ending.stdout_closed && self.io.release_held() && self.io.unread() < ANSWER_BOUND
    }

    /// Whether the batch holds only commits of a pipelining agent, which
    /// no one waits for, and nothing is being committed: the batch may wait
    /// a moment for more.
    fn only_commits_wait(&self) -> bool {
        self.outbox.pipelined
            && !self.in_flight()
            && !self.outbox.batch.is_empty()
            && self.outbox.batch.iter().all(Deferred::is_agent_commit)
    }

    /// Whether the run is over: the agent exited, its prints are all read
    /// (or a leftover process holds its stdout silently past a grace
    /// period), and no tool runs.
    fn finished(&self) -> bool {
        let Some(exited_at) = self.ending.exited_at else {
            return false;
        };
        // A run stopped by a signal does not wait on a reader of durun's
        // stdout that never reads.
        let quiet = exited_at.elapsed() >= DRAIN_GRACE
            && (self.ending.signal.is_some()
                || (self.io.read_at.elapsed() >= DRAIN_GRACE && self.io.held.is_none()));
        (self.ending.stdout_closed || quiet || self.holding.fenced)
            && self.steps.no_calls()
            && !self.in_flight()
    }

    /// Handles the lines the agent's stdout holds now (a bounded number, so
    /// a flood cannot starve the other events).
    pub(super) fn read_agent(&mut self) {
        for _ in 0..4096 {
            if self.holding.fenced {
                return;
            }
            let chunk = self.io.reader.next_line();
            if matches!(chunk, Ok(Some(_))) {
                self.io.read_at = Instant::now();
            }
            match chunk {
                Ok(Some(Chunk::Line { mut bytes, ended })) => match protocol::parse_line(&bytes) {
                    Line::Passthrough => {
                        if looks_like_a_request(&bytes) {
                            let head = String::from_utf8_lossy(&bytes[..bytes.len().min(120)]);
                            let message = format!(
                                "the agent printed a line that looks like a request but is not valid JSON; \
                                 it was passed through to stdout, not answered: {head}"
                            );
                            self.reporter.report(&Report::Warning(&message));
                        }
                        if ended {
                            bytes.push(b'\n');
                        }
                        if !self.io.pass_on(bytes) {
                            return;
                        }
                    }
                    line => self.handle(Event::Line(AGENT, line)),
                },
                Ok(Some(Chunk::Text(bytes))) => {
                    if !self.io.pass_on(bytes) {
                        return;
                    }
                }
                Ok(Some(Chunk::Oversized { id })) => self.handle(Event::Oversized(AGENT, id)),
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(None) | Err(_) => {
                    self.ending.stdout_closed = true;
                    return;
                }
            }
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Line(conn, Line::Request(request))
                if self.ending.exited.is_some() && !request.closes_a_step() =>
            {
                // What the agent left running may not open steps for a
                // task whose run is ending. A step it closed is recorded:
                // an agent that does not wait for its commits may exit
                // before durun reads the last of them.
                self.respond(
                    conn,
                    &Response::error(
                        request.id().clone(),
                        ErrorCode::BadRequest,
                        "the agent has exited; a request from a process it left running is refused",
                    ),
                );
            }
            Event::Line(conn, Line::Request(request)) => self.on_request(conn, request),
            Event::Line(conn, Line::Invalid { id, message }) => {
                self.respond(conn, &Response::error(id, ErrorCode::BadRequest, message));
            }
            Event::Line(conn, Line::Passthrough) => {
                // On the socket every line must be a request.
                self.respond(
                    conn,
                    &Response::error(
                        Value::Null,
                        ErrorCode::BadRequest,
                        "not a request: a JSON object with an `op`",
                    ),
                );
            }
            Event::Connected(conn, writer) => {
                self.outbox.writers.insert(conn, writer);
            }
            Event::Disconnected(conn) => {
                self.outbox.writers.remove(&conn);
                self.mcp_gone(conn);
            }
            Event::Oversized(conn, id) => {
                let message = format!(
                    "line longer than the {} MiB limit",
                    protocol::MAX_LINE >> 20
                );
                self.respond(conn, &Response::error(id, ErrorCode::BadRequest, message));
            }
            Event::Exited(status) => {
                self.steps.contents.close(Closed::Stopping);
                self.ending.exited = Some(status);
                self.ending.exited_at = Some(Instant::now());
                self.ending.kill_at = None;
            }
            Event::ToolDone { step, finished } => self.on_tool_done(step, finished),
            Event::Probed {
                step,
                probed,
                probing,
            } => self.on_probed(step, probed, *probing),
            Event::Signal(signal) => self.on_signal(signal),
            // Taken in `flush`, after this round's requests.
            Event::Landed => {}
            Event::ChildEnded(child) => self.child_ended(&child),
            Event::Proxy(message) => {
                // A step's `begin` is written before its body can call the
                // model; one the agent did not wait for may still be in the
                // pipe: read first, the call is that step's, not a step of
                // its own.
                if self.may_read() {
                    self.read_agent();
                }
                self.on_proxy(*message);
            }
        }
    }

    /// Answers on connection `conn`; nothing goes out once the run is
    /// fenced.
    pub(super) fn respond(&mut self, conn: Conn, response: &Response) {
        if self.holding.fenced {
            return;
        }
        if conn == AGENT {
            self.io.push(response);
        } else if let Some(writer) = self.outbox.writers.get(&conn) {
            writer.send(response.to_line());
        }
    }

    /// The run's end, and what is left of the agent's prints.
    pub(super) fn outcome(mut self) -> Outcome {
        let (status, exit_code, failure) = self.ending();
        self.say_unfinished_children(status);
        Outcome {
            status,
            exit_code,
            stats: self.stats,
            failure,
            output: Some(Output {
                passthrough: self.io.passthrough,
                signalled: self.ending.signal.is_some(),
                stderr_done: None,
                stops: self.spec.stops.clone(),
            }),
        }
    }
}

/// An object line that names an `op` but did not parse: most likely a
/// request the agent got wrong (truncated, or not UTF-8).
fn looks_like_a_request(line: &[u8]) -> bool {
    line.trim_ascii_start().starts_with(b"{") && protocol::names_an_op(line)
}

/// The run's model/API proxy (SPEC 12), unless it is off.
fn start_proxy(
    spec: &RunSpec<'_>,
    events_tx: &Events,
) -> anyhow::Result<Option<crate::proxy::Proxy>> {
    Ok(match spec.proxy {
        Some(config) => {
            crate::os::raise_open_files();
            // The environment's upstreams, else those the task recorded.
            let mut routes = crate::proxy::Routes::new(config, |name| {
                std::env::var(name)
                    .ok()
                    .or_else(|| spec.upstreams.get(name).cloned())
            });
            // The fields the agent's CLI changes on every call.
            if let Some((preset, _)) = spec.preset {
                preset.extend_ignore(&mut routes.ignore);
            }
            routes.limiter.clone_from(&spec.limiter);
            let events = events_tx.clone();
            let inbox: crate::proxy::Inbox =
                Box::new(move |message| events.send(Event::Proxy(Box::new(message))).is_ok());
            Some(crate::proxy::Proxy::start(routes, inbox).map_err(|err| {
                Failure::new(
                    Kind::CannotStart,
                    format!("cannot start the model proxy: {err}"),
                )
                .hint("`--no-proxy` (or `[proxy] enabled = false` in durun.toml) runs without it")
            })?)
        }
        None => None,
    })
}

/// What the agent's environment gets on top of durun's own, beside
/// `DURUN_*` (set where it is started): the proxy's URLs, the trace, a
/// child task's parent, and how many steps the journal held.
fn agent_env(
    spec: &RunSpec<'_>,
    proxy: Option<&crate::proxy::Proxy>,
    last_recorded: u64,
) -> Vec<(String, String)> {
    let mut agent_env = proxy.map(crate::proxy::Proxy::env).unwrap_or_default();
    if let (Some((preset, _)), Some(proxy)) = (spec.preset, proxy) {
        agent_env.extend(preset.env(|route| proxy.route_url(route)));
    }
    if let Some(traceparent) = &spec.traceparent {
        agent_env.push(("TRACEPARENT".to_owned(), traceparent.clone()));
    }
    // A child task's agent knows its parent and what it was spawned with.
    if let Some((parent, args)) = &spec.parent {
        agent_env.push(("DURUN_PARENT_TASK".to_owned(), parent.clone()));
        agent_env.push(("DURUN_ARGS".to_owned(), args.clone()));
    }
    // A `read` step the agent opens once its answers have reached this
    // number is new: it cannot be a replay or a divergence, so an SDK may
    // run it without waiting for the `begin`'s answer. Not said where a new
    // step may be answered as a replay (`durun test`'s seeds), nor where a
    // token budget may refuse it (a model call must not run past one).
    if spec.max_tokens.is_none()
        && spec.max_cost_nanos.is_none()
        && spec
            .seeds
            .as_ref()
            .is_none_or(std::collections::HashMap::is_empty)
    {
        agent_env.push(("DURUN_JOURNAL_STEPS".to_owned(), last_recorded.to_string()));
    }
    agent_env
}

/// The end of a run whose agent could not be started, and why, in the
/// user's words.
fn cannot_start(spec: &RunSpec<'_>, err: &std::io::Error) -> Outcome {
    let keeper_missing = match err.get_ref() {
        Some(inner) => inner.is::<crate::spawn::KeeperMissing>(),
        None => false,
    };
    let failure = if keeper_missing {
        Failure::new(Kind::CannotStart, format!("{err}"))
            .hint("durun's binary was removed or replaced while this durun ran: start durun again")
    } else if spec.cwd.is_dir() {
        Failure::new(
            Kind::CannotStart,
            format!("cannot start `{}`: {err}", spec.argv[0]),
        )
        .hint(format!(
            "check the command and that it exists in {}",
            spec.cwd.display()
        ))
    } else {
        // A task submitted on one host and taken by a worker on another
        // that lacks its directory.
        Failure::new(
            Kind::CannotStart,
            format!(
                "cannot start `{}`: the task's directory {} does not exist on this host",
                spec.argv[0],
                spec.cwd.display()
            ),
        )
        .hint("run workers where the task's directory exists (the same checkout path on every host), or submit it from such a path")
    };
    Outcome {
        status: TaskStatus::Failed,
        exit_code: exit_code::CANNOT_START,
        stats: RunStats::default(),
        failure: Some(failure.into()),
        output: None,
    }
}
