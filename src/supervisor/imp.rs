//! The supervisor loop: one agent process, its requests, the journal.
//!
//! # Invariant
//!
//! A step's result is durable in the journal before its response line is
//! written to the agent, and a `mutate` step's intent (`pending`) is durable
//! before its tool starts or the agent is told to run it. A `read` step is
//! written once, when it finishes: repeating it after a crash is safe.
//!
//! # Threads
//!
//! The loop owns the journal and all state, and reads the agent's stdout and
//! writes its stdin itself, without blocking (`poll`): a step costs one
//! wake-up of durun and one of the agent, no hand-off between threads.
//! Other threads only send it [`Event`]s and wake it through a pipe: one
//! waits for the agent to exit, one turns signals into events, one per tool
//! call runs the tool, and the socket's serve `durun step` clients. One
//! more copies the agent's prints to durun's stdout ([`Passthrough`]).
//!
//! # Fencing
//!
//! Every write the run makes checks, in its own transaction, that the run
//! still holds the task's lease (SPEC 4). A run that finds the lease lost
//! (another runner took the task over while this one was paused) stops at
//! once: no tool starts, no answer reaches the agent, and the agent and its
//! tools are killed. A run that could not renew its heartbeat for half the
//! stale time stops the same way before anyone may take it over, and a
//! `read` step (no write before it runs) starts only after a look at the
//! lease and the cancel mark ([`Journal::watch`]).
//!
//! # Group commit
//!
//! The loop takes every request and event that is ready, then writes all
//! their steps in one transaction, then answers: steps that arrive together
//! (parallel `call`s) share one durable commit.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{self, TryRecvError};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::lines::{Chunk, LineReader};
use super::passthrough::Passthrough;
use super::recorded::Recorded;
use crate::config::{InDoubt, Tool, ToolKind};
use crate::error::Failure;
use crate::executor::{self, Cancel, Finished, Invocation};
use crate::exit_code;
use crate::journal::{
    self, Fenced, Journal, RunStats, Standing, StepError, StepKind, StepRecord, StepStatus,
    StepWrite, TaskStatus,
};
use crate::json_text::JsonText;
use crate::lease;
use crate::os;
use crate::protocol::{self, Effect, ErrorCode, Line, Request, Response};
use crate::report::{Event as Report, Reporter};
use crate::step_key;

/// How long the agent gets to exit after durun ends a run itself.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long the agent gets to exit after a forwarded SIGTERM or SIGINT.
const SIGNAL_GRACE: Duration = Duration::from_secs(10);
/// How long to wait for the agent's stdout to close once it has exited (a
/// grandchild may hold it open).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long the loop looks for the agent's next request before it sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// When a retried `mutate` step deserves a warning.
const KEY_MEMORY: Duration = Duration::from_secs(24 * 60 * 60);
/// How long a `read` step runs before its row is written as in flight, so
/// that `inspect` shows it if the run dies (a quick step costs no write
/// before its commit).
const MARK_AFTER: Duration = Duration::from_secs(1);
/// How often the loop looks for a cancel or a takeover when no step asks.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// The most answers (bytes) waiting for the agent to read them: past it,
/// durun stops reading the agent's requests until it reads its answers. An
/// agent that writes every request before reading any answer works up to
/// about 180,000 requests.
const ANSWER_BOUND: usize = 16 * 1024 * 1024;

/// What the supervisor needs to know about the run.
pub struct RunSpec<'a> {
    pub task_id: &'a str,
    pub run: u32,
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub tools: &'a BTreeMap<String, Arc<Tool>>,
    /// [`os::boot_clock`] just before the lease was taken: the run's
    /// first heartbeat.
    pub leased_at: Duration,
}

/// How the run ended.
pub struct Outcome {
    pub status: TaskStatus,
    pub exit_code: i32,
    pub stats: RunStats,
    /// Why durun ended the run itself (divergence, a journal failure, an
    /// agent that could not start): printed after the run is recorded.
    pub failure: Option<anyhow::Error>,
    /// The agent's prints still on their way to durun's stdout: finished
    /// after the run is recorded, so a slow reader never holds up the
    /// journal.
    pub output: Option<Output>,
}

/// The rest of the agent's prints.
pub struct Output {
    passthrough: Passthrough,
    /// Give up on a stdout that takes nothing for this long (a run stopped
    /// by a signal), or wait for every byte.
    stall: Option<Duration>,
    /// Hears when the agent's stderr, copied through the progress line,
    /// has closed and gone out.
    stderr_done: Option<mpsc::Receiver<()>>,
}

impl Output {
    /// Waits until the agent's stderr went out, so that durun's closing
    /// lines come after it.
    pub fn finish_stderr(&mut self) {
        if let Some(done) = self.stderr_done.take() {
            // A process the agent left running may hold its stderr open.
            let _ = done.recv_timeout(DRAIN_GRACE);
        }
    }

    /// Writes what is left of the agent's prints to durun's stdout.
    pub fn finish(mut self) {
        self.finish_stderr();
        self.passthrough.finish(self.stall);
    }
}

/// How long a run stopped by a signal waits for a stdout that takes
/// nothing before it exits anyway.
const OUTPUT_STALL: Duration = Duration::from_secs(5);

/// A protocol connection: 0 is the agent's stdin/stdout, others are
/// clients of `DURUN_SOCKET` (`durun step`, `durun call`).
type Conn = usize;

pub(super) enum Event {
    Line(Conn, Line),
    /// A client connected to the socket; its answers go to this sender.
    Connected(Conn, super::socket::Answers),
    Disconnected(Conn),
    Oversized(Conn, Value),
    Exited(ExitStatus),
    ToolDone {
        step: u64,
        finished: Finished,
    },
    Signal(i32),
}

/// Sends [`Event`]s to the loop and wakes it.
#[derive(Clone)]
pub(super) struct Events {
    tx: mpsc::Sender<Event>,
    wake: Arc<OwnedFd>,
}

impl Events {
    pub fn send(&self, event: Event) -> Result<(), mpsc::SendError<Event>> {
        self.tx.send(event)?;
        // A full pipe already wakes the loop; nothing else can go wrong
        // with a pipe whose read end the loop holds.
        // SAFETY: a one-byte write from a live buffer to an open descriptor.
        unsafe {
            libc::write(self.wake.as_raw_fd(), b"!".as_ptr().cast(), 1);
        }
        Ok(())
    }
}

/// The agent's end of the protocol: its stdout, read without blocking, and
/// its stdin, written without blocking from a buffer.
struct AgentIo {
    reader: LineReader<BufReader<ChildStdout>>,
    stdin: Option<ChildStdin>,
    /// Answers not yet taken by the agent's stdin pipe: `out[sent..]`.
    out: Vec<u8>,
    sent: usize,
    /// When an answer last went out, for the short spin in `wait`.
    answered_at: Option<Instant>,
    wake: OwnedFd,
    /// Copies the agent's prints to durun's stdout, off the loop, so a slow
    /// reader of durun's stdout holds up only the agent's prints.
    passthrough: Passthrough,
    /// A print the copier had no room for: until it goes, the agent's
    /// stdout is not read (the agent waits, as it would without durun).
    held: Option<Vec<u8>>,
    /// When the agent's stdout last gave bytes, for the drain after exit.
    read_at: Instant,
}

/// A journal write that waits for the batch's commit, and what follows it.
struct Deferred {
    conn: Conn,
    record: StepRecord,
    fresh: bool,
    then: Then,
}

impl Then {
    /// The request the step answers.
    fn into_id(self) -> Value {
        match self {
            Then::Finished { id, .. } | Then::Opened { id, .. } | Then::Call { id, .. } => id,
            Then::Marked => Value::Null,
        }
    }
}

enum Then {
    /// A long `read` step is written as in flight: nothing to do.
    Marked,
    /// The step finished: answer it.
    Finished { id: Value, started: Instant },
    /// A `mutate` begin's intent is written: answer the begin.
    Opened { id: Value, in_doubt: bool },
    /// A `mutate` call's intent is written: start its tool.
    Call {
        id: Value,
        tool: Arc<Tool>,
        args: Value,
    },
}

/// A step the agent began and has not closed yet.
struct OpenStep {
    record: StepRecord,
    fresh: bool,
    started: Instant,
}

/// A step as the agent asks for it.
#[derive(Clone, Copy)]
struct Asked<'a> {
    name: &'a str,
    kind: StepKind,
    effect: Effect,
    args: &'a Value,
    canonical: &'a str,
    /// The tool wants an operator to decide before a step in doubt runs again.
    ask_first: bool,
}

/// A `call` whose tool is running.
struct CallInFlight {
    conn: Conn,
    /// An HTTP call has no process to kill: on a stop it is answered at
    /// once and left to finish on its own (its step stays in doubt).
    http: bool,
    id: Value,
    record: StepRecord,
    fresh: bool,
    cancel: Arc<Cancel>,
    started: Instant,
}

enum Stop {
    Failure(anyhow::Error),
    Signal,
    /// `durun cancel` asked for it.
    Cancel,
}

/// Runs the agent of `spec` to its end, serving its requests.
pub fn supervise(
    spec: &RunSpec<'_>,
    journal: &mut dyn Journal,
    reporter: &mut dyn Reporter,
) -> anyhow::Result<Outcome> {
    let (recorded_steps, last_recorded) = journal.replay_bounds(spec.task_id)?;
    reporter.report(&Report::RunStarted {
        task: spec.task_id,
        run: spec.run,
        recorded_steps: recorded_steps as usize,
    });

    let (tx, events) = mpsc::channel();
    let (wake_rx, wake_tx) = os::wake_pipe()
        .map_err(|err| anyhow::anyhow!("failed to create a pipe for the run: {err}"))?;
    let events_tx = Events {
        tx,
        wake: Arc::new(wake_tx),
    };
    // Signals are caught before the agent starts, so none is lost between.
    let signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])?;
    let signals_handle = signals.handle();
    spawn_signal_thread(signals, events_tx.clone());

    let socket = super::socket::listen(events_tx.clone())
        .map_err(|err| anyhow::anyhow!("failed to create the socket for `durun step`: {err}"))?;
    let mut command = Command::new(program_path(&spec.argv[0], spec.cwd));
    command
        .args(&spec.argv[1..])
        .current_dir(spec.cwd)
        .env("DURUN_TASK_ID", spec.task_id)
        .env("DURUN_RUN", spec.run.to_string())
        .env("DURUN_PROTOCOL", protocol::VERSION.to_string())
        .env("DURUN_SOCKET", &socket.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // On a terminal the agent's stderr goes through the progress line;
    // elsewhere it is the agent's own, untouched.
    let copier = reporter.stderr_copier();
    command.stderr(if copier.is_some() {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });
    os::die_with_parent(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            signals_handle.close();
            let failure = Failure::new(
                exit_code::CANNOT_START,
                format!("cannot start `{}`: {err}", spec.argv[0]),
            )
            .hint(format!(
                "check the command and that it exists in {}",
                spec.cwd.display()
            ));
            return Ok(Outcome {
                status: TaskStatus::Failed,
                exit_code: exit_code::CANNOT_START,
                stats: RunStats::default(),
                failure: Some(failure.into()),
                output: None,
            });
        }
    };
    let child_pid = child.id();
    let stderr_done = match (copier, child.stderr.take()) {
        (Some(copy), Some(stderr)) => Some(spawn_stderr_copier(stderr, copy)),
        _ => None,
    };
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    // The agent started; it dies with durun (parent-death signal) if this
    // fails.
    os::set_nonblocking(&stdin)
        .and_then(|()| os::set_nonblocking(&stdout))
        .map_err(|err| anyhow::anyhow!("failed to set up the agent's pipes: {err}"))?;
    let passthrough = Passthrough::start()
        .map_err(|err| anyhow::anyhow!("failed to start a thread for the agent's output: {err}"))?;
    let io = AgentIo {
        reader: LineReader::streaming(BufReader::with_capacity(64 * 1024, stdout)),
        stdin: Some(stdin),
        out: Vec::new(),
        sent: 0,
        answered_at: None,
        wake: wake_rx,
        passthrough,
        held: None,
        read_at: Instant::now(),
    };
    let exit_tx = events_tx.clone();
    std::thread::spawn(move || {
        if let Ok(status) = child.wait() {
            let _ = exit_tx.send(Event::Exited(status));
        }
    });

    let mut supervisor = Supervisor {
        spec,
        journal,
        reporter,
        recorded: Recorded::new(last_recorded),
        last_recorded,
        next_step: 1,
        open: HashMap::new(),
        calls: HashMap::new(),
        stats: RunStats::default(),
        writers: HashMap::new(),
        io,
        batch: Vec::new(),
        conn: 0,
        events_tx,
        child_pid,
        interactive: os::stdin_is_terminal(),
        stop: None,
        signal: None,
        kill_at: None,
        exited: None,
        exited_at: None,
        stdout_closed: false,
        last_heartbeat: Instant::now(),
        // Several heartbeats fit in the time a run may go without one.
        heartbeat_every: lease::heartbeat_every().min(lease::stale_after() / 4),
        renewed_at: spec.leased_at,
        fence_after: lease::stale_after() / 2,
        fenced: false,
        last_watch: Instant::now(),
    };
    supervisor.serve(&events);
    signals_handle.close();
    drop(socket);
    let mut outcome = supervisor.outcome();
    if let Some(output) = &mut outcome.output {
        output.stderr_done = stderr_done;
    }
    Ok(outcome)
}

/// Copies the agent's stderr through `copy` a line at a time (a part line
/// once nothing more came for a moment), bytes unchanged. The receiver
/// hears when the agent's stderr has closed and every byte went out.
fn spawn_stderr_copier(
    stderr: std::process::ChildStderr,
    mut copy: crate::report::StderrCopier,
) -> mpsc::Receiver<()> {
    let (chunks_tx, chunks) = mpsc::channel::<Vec<u8>>();
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut stderr = stderr;
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match stderr.read(&mut buffer) {
                Ok(0) => return,
                Ok(n) => {
                    if chunks_tx.send(buffer[..n].to_vec()).is_err() {
                        return;
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    std::thread::spawn(move || {
        let mut pending: Vec<u8> = Vec::new();
        loop {
            match chunks.recv_timeout(Duration::from_millis(100)) {
                Ok(chunk) => {
                    pending.extend_from_slice(&chunk);
                    if let Some(last) = pending.iter().rposition(|&b| b == b'\n') {
                        copy(&pending[..=last]);
                        pending.drain(..=last);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // A prompt without a newline still shows.
                    if !pending.is_empty() {
                        copy(&pending);
                        pending.clear();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    if !pending.is_empty() {
                        copy(&pending);
                    }
                    let _ = done_tx.send(());
                    return;
                }
            }
        }
    });
    done
}

/// A relative program path with a `/` means the task's directory.
fn program_path(program: &str, cwd: &Path) -> std::path::PathBuf {
    if program.contains('/') {
        cwd.join(program)
    } else {
        program.into()
    }
}

fn spawn_signal_thread(mut signals: signal_hook::iterator::Signals, tx: Events) {
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if tx.send(Event::Signal(signal)).is_err() {
                break;
            }
        }
    });
}

impl AgentIo {
    /// Waits for the agent's stdout, room in its stdin (when answers wait),
    /// or a wake-up from another thread, at most `wait`.
    fn wait(&mut self, wait: Duration, read: bool) {
        let wait = if !read && self.held.is_some() {
            // Try the held line again soon.
            wait.min(Duration::from_millis(10))
        } else if read && self.reader.has_buffered() {
            Duration::ZERO
        } else {
            wait
        };
        let mut fds = [
            libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative descriptor is skipped.
                fd: if read {
                    self.reader.get_ref().as_raw_fd()
                } else {
                    -1
                },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: match &self.stdin {
                    Some(stdin) if self.sent < self.out.len() => stdin.as_raw_fd(),
                    _ => -1,
                },
                events: libc::POLLOUT,
                revents: 0,
            },
        ];
        // Right after an answer, the agent's next request usually comes
        // within microseconds: look for it briefly before sleeping, since a
        // wake-up from sleep costs tens of microseconds on many machines.
        let spin_until = self.answered_at.take().map(|at| at + SPIN);
        let mut ready = false;
        if let Some(until) = spin_until {
            while Instant::now() < until {
                if os::poll(&mut fds, Duration::ZERO).is_ok()
                    && fds.iter().any(|fd| fd.revents != 0)
                {
                    ready = true;
                    break;
                }
                // On a shared core, the agent gets to run.
                std::thread::yield_now();
            }
        }
        if !ready && os::poll(&mut fds, wait).is_err() {
            // Not expected for valid descriptors; a short sleep keeps a
            // failing poll from spinning.
            std::thread::sleep(Duration::from_millis(10));
        }
        if fds[0].revents != 0 {
            let mut drain = [0u8; 256];
            // SAFETY: reads into a live buffer of the given size.
            while unsafe {
                libc::read(
                    self.wake.as_raw_fd(),
                    drain.as_mut_ptr().cast(),
                    drain.len(),
                )
            } > 0
            {}
        }
    }

    /// Hands the held print to the copier if it has room; true when none
    /// is held.
    fn release_held(&mut self) -> bool {
        if let Some(piece) = self.held.take() {
            self.held = self.passthrough.offer(piece).err();
        }
        self.held.is_none()
    }

    /// Hands a print to the copier; false (and held) when it has no room.
    fn pass_on(&mut self, piece: Vec<u8>) -> bool {
        self.held = self.passthrough.offer(piece).err();
        self.held.is_none()
    }

    /// Answers written but not yet taken by the agent.
    fn unread(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Queues an answer for the agent, unless its stdin is closed.
    fn push(&mut self, response: &Response) {
        if self.stdin.is_none() {
            return;
        }
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        } else if self.sent > self.out.len() / 2 {
            // Moves the unsent half down, at most once per byte sent.
            self.out.drain(..self.sent);
            self.sent = 0;
        }
        response.write_line(&mut self.out);
    }

    /// Writes what the agent's stdin pipe takes now.
    fn write_out(&mut self) {
        let Some(stdin) = &mut self.stdin else {
            self.out.clear();
            self.sent = 0;
            return;
        };
        while self.sent < self.out.len() {
            match stdin.write(&self.out[self.sent..]) {
                Ok(0) => break,
                Ok(n) => {
                    self.sent += n;
                    self.answered_at = Some(Instant::now());
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // A child that closed its stdin gets no more answers;
                    // the loop learns of its exit from the waiter.
                    self.stdin = None;
                    self.out.clear();
                    self.sent = 0;
                    return;
                }
            }
        }
    }
}

struct Supervisor<'a> {
    spec: &'a RunSpec<'a>,
    journal: &'a mut dyn Journal,
    reporter: &'a mut dyn Reporter,
    /// The steps the journal held when the run started, read as reached.
    recorded: Recorded,
    /// The highest step number in the journal.
    last_recorded: u64,
    next_step: u64,
    open: HashMap<u64, OpenStep>,
    calls: HashMap<u64, CallInFlight>,
    stats: RunStats,
    /// Where answers go, by socket connection (the agent's go to `io`).
    writers: HashMap<Conn, super::socket::Answers>,
    /// The agent's pipes; its answers are written after each batch.
    io: AgentIo,
    /// Steps to write in the next commit.
    batch: Vec<Deferred>,
    /// The connection of the request being answered.
    conn: Conn,
    events_tx: Events,
    child_pid: u32,
    /// Whether a Ctrl-C from the terminal reaches the agent by itself.
    interactive: bool,
    stop: Option<Stop>,
    signal: Option<i32>,
    kill_at: Option<Instant>,
    exited: Option<ExitStatus>,
    exited_at: Option<Instant>,
    stdout_closed: bool,
    last_heartbeat: Instant,
    heartbeat_every: Duration,
    /// [`os::boot_clock`] when the lease was last renewed (the moment the
    /// renewal was sent, to err on the safe side).
    renewed_at: Duration,
    /// Half the stale time: a run that has not renewed for this long stops
    /// before another host may take the task over.
    fence_after: Duration,
    /// The run lost its lease: nothing more reaches the agent or the
    /// journal.
    fenced: bool,
    last_watch: Instant,
}

impl Supervisor<'_> {
    fn serve(&mut self, events: &mpsc::Receiver<Event>) {
        loop {
            if let Some(exited_at) = self.exited_at {
                // Every print of the agent (and of what it left running
                // with its stdout) goes out before durun exits; a
                // leftover process that holds the pipe silently gets a
                // grace period.
                // A run stopped by a signal does not wait on a reader of
                // durun's stdout that never reads.
                let quiet = exited_at.elapsed() >= DRAIN_GRACE
                    && (self.signal.is_some()
                        || (self.io.read_at.elapsed() >= DRAIN_GRACE && self.io.held.is_none()));
                if (self.stdout_closed || quiet || self.fenced) && self.calls.is_empty() {
                    return;
                }
            }
            let mut wait = Duration::from_millis(500).min(self.heartbeat_every);
            if let Some(kill_at) = self.kill_at {
                wait = wait.min(kill_at.saturating_duration_since(Instant::now()));
            }
            let read =
                !self.stdout_closed && self.io.release_held() && self.io.unread() < ANSWER_BOUND;
            self.io.wait(wait, read);
            // A pause (SIGSTOP, a suspended machine) may have outlasted
            // the lease: look before acting on anything.
            self.check_renewal();
            if read {
                self.read_agent();
            }
            loop {
                match events.try_recv() {
                    Ok(event) => self.handle(event),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            self.commit_batch();
            if self.check_renewal() {
                self.io.write_out();
            }
            self.tick();
        }
    }

    /// Writes the rows of `read` steps that have run for [`MARK_AFTER`]
    /// without one, as `pending`: if the run dies now, `inspect` shows the
    /// step it died in, and a resume runs it again as its next attempt.
    fn mark_long_steps(&mut self) {
        if self.stop.is_some() || self.fenced {
            return;
        }
        let mut marks = Vec::new();
        for open in self.open.values_mut() {
            if open.fresh && open.started.elapsed() >= MARK_AFTER {
                open.fresh = false;
                marks.push(open.record.clone());
            }
        }
        for call in self.calls.values_mut() {
            if call.fresh && call.started.elapsed() >= MARK_AFTER {
                call.fresh = false;
                marks.push(call.record.clone());
            }
        }
        if marks.is_empty() {
            return;
        }
        self.batch.extend(marks.into_iter().map(|record| Deferred {
            conn: 0,
            record,
            fresh: true,
            then: Then::Marked,
        }));
        self.commit_batch();
    }

    /// False, and the run fenced, when the lease has gone unrenewed for
    /// half the stale time: another host may be about to take it over.
    fn check_renewal(&mut self) -> bool {
        if self.fenced {
            return false;
        }
        let unrenewed = os::boot_clock().saturating_sub(self.renewed_at);
        if unrenewed < self.fence_after {
            return true;
        }
        self.fence(format!(
            "the run could not renew the lease of task {} for {} (half the {} after which another runner may take it over); it stopped so that no two runners run its steps",
            self.spec.task_id,
            humantime::format_duration(Duration::from_millis(unrenewed.as_millis() as u64)),
            humantime::format_duration(lease::stale_after()),
        ));
        false
    }

    /// Whether a new step may start now: the lease is fresh, and neither a
    /// takeover nor a cancel came (a cheap look, see [`Journal::watch`]).
    fn may_start(&mut self) -> bool {
        if !self.check_renewal() || self.stop.is_some() {
            return false;
        }
        self.last_watch = Instant::now();
        match self.journal.watch(self.spec.task_id, self.spec.run) {
            Ok(standing) => self.on_standing(standing),
            // The step's own journal writes will tell.
            Err(_) => true,
        }
    }

    /// Acts on where the run stands; true while it may go on.
    fn on_standing(&mut self, standing: Standing) -> bool {
        match standing {
            Standing::Held => true,
            Standing::Cancelled => {
                self.stop(Stop::Cancel);
                false
            }
            Standing::Lost => {
                self.fence(format!(
                    "task {} was taken over by another runner while this run was paused or cut off; this run stopped without touching it",
                    self.spec.task_id
                ));
                false
            }
        }
    }

    /// The run lost its lease: the agent and its tools are killed at once,
    /// no answer reaches them, and nothing more is written (exit 75).
    fn fence(&mut self, message: String) {
        if self.fenced {
            return;
        }
        self.fenced = true;
        if self.exited.is_none() {
            os::signal_process(self.child_pid, libc::SIGKILL);
        }
        for call in self.calls.values() {
            call.cancel.cancel();
        }
        // An HTTP call cannot be stopped mid-request; its answer is dropped.
        self.calls.clear();
        self.open.clear();
        self.batch.clear();
        self.io.stdin = None;
        self.io.out.clear();
        self.io.sent = 0;
        self.writers.clear();
        self.kill_at = None;
        let failure = Failure::new(exit_code::LOCKED, message).hint(format!(
            "`durun inspect {}` shows who runs it now; this run's steps up to here are in the journal",
            self.spec.task_id
        ));
        self.stop = Some(Stop::Failure(failure.into()));
    }

    /// Handles the lines the agent's stdout holds now (a bounded number, so
    /// a flood cannot starve the other events).
    fn read_agent(&mut self) {
        for _ in 0..4096 {
            if self.fenced {
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
                    line => self.handle(Event::Line(0, line)),
                },
                Ok(Some(Chunk::Text(bytes))) => {
                    if !self.io.pass_on(bytes) {
                        return;
                    }
                }
                Ok(Some(Chunk::Oversized { id })) => self.handle(Event::Oversized(0, id)),
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(None) | Err(_) => {
                    self.stdout_closed = true;
                    return;
                }
            }
        }
    }

    fn tick(&mut self) {
        if let Some(kill_at) = self.kill_at
            && Instant::now() >= kill_at
            && self.exited.is_none()
        {
            os::signal_process(self.child_pid, libc::SIGKILL);
            self.kill_at = None;
        }
        if self.fenced {
            return;
        }
        self.mark_long_steps();
        if self.stop.is_none() && self.last_watch.elapsed() >= WATCH_EVERY {
            self.last_watch = Instant::now();
            if let Ok(standing) = self.journal.watch(self.spec.task_id, self.spec.run) {
                self.on_standing(standing);
            }
        }
        if self.last_heartbeat.elapsed() >= self.heartbeat_every {
            self.last_heartbeat = Instant::now();
            let sent_at = os::boot_clock();
            match self.journal.heartbeat(self.spec.task_id, self.spec.run) {
                Ok(standing) => {
                    if standing != Standing::Lost {
                        self.renewed_at = sent_at;
                    }
                    self.on_standing(standing);
                }
                Err(err) if crate::error::failure_of(&err).is_some() => {
                    // The journal file is gone or broken: nothing more can
                    // be recorded.
                    self.journal_failed(&Value::Null, err);
                }
                Err(err) => {
                    let message = format!("failed to renew the task's lease: {err:#}");
                    self.reporter.report(&Report::Warning(&message));
                }
            }
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Line(conn, Line::Request(request)) if self.exited.is_some() => {
                // What the agent left running may not open steps for a
                // task whose run is ending.
                self.conn = conn;
                self.respond(&Response::error(
                    request.id().clone(),
                    ErrorCode::BadRequest,
                    "the agent has exited; a request from a process it left running is refused",
                ));
            }
            Event::Line(conn, Line::Request(request)) => {
                self.conn = conn;
                self.on_request(request);
            }
            Event::Line(conn, Line::Invalid { id, message }) => {
                self.conn = conn;
                self.respond(&Response::error(id, ErrorCode::BadRequest, message));
            }
            Event::Line(conn, Line::Passthrough) => {
                // On the socket every line must be a request.
                self.conn = conn;
                self.respond(&Response::error(
                    Value::Null,
                    ErrorCode::BadRequest,
                    "not a request: a JSON object with an `op`",
                ));
            }
            Event::Connected(conn, writer) => {
                self.writers.insert(conn, writer);
            }
            Event::Disconnected(conn) => {
                self.writers.remove(&conn);
            }
            Event::Oversized(conn, id) => {
                self.conn = conn;
                self.respond(&Response::error(
                    id,
                    ErrorCode::BadRequest,
                    format!(
                        "line longer than the {} MiB limit",
                        protocol::MAX_LINE >> 20
                    ),
                ));
            }
            Event::Exited(status) => {
                self.exited = Some(status);
                self.exited_at = Some(Instant::now());
                self.kill_at = None;
            }
            Event::ToolDone { step, finished } => self.on_tool_done(step, finished),
            Event::Signal(signal) => self.on_signal(signal),
        }
    }

    /// Answers on the connection of the request being handled.
    fn respond(&mut self, response: &Response) {
        if self.fenced {
            return;
        }
        if self.conn == 0 {
            self.io.push(response);
        } else if let Some(writer) = self.writers.get(&self.conn) {
            writer.send(response.to_line());
        }
    }

    fn on_request(&mut self, request: Request) {
        if self.stop.is_some() {
            self.respond(&Response::error(
                request.id().clone(),
                ErrorCode::Cancelled,
                "the run is stopping; the task can be resumed",
            ));
            return;
        }
        match request {
            Request::Call { id, tool, args } => self.on_call(id, &tool, args),
            Request::Begin {
                id,
                name,
                args,
                effect,
            } => self.on_begin(id, &name, &args, effect.unwrap_or(Effect::Read)),
            Request::Commit {
                id,
                step,
                output,
                usage,
            } => self.on_close(id, step, Ok((output, usage))),
            Request::Fail {
                id,
                step,
                error,
                output,
            } => self.on_close(id, step, Err((error, output))),
            Request::Result { id, output } => {
                // Steps that came before it are recorded first.
                let conn = self.conn;
                self.commit_batch();
                self.conn = conn;
                if self.fenced {
                    return;
                }
                match self
                    .journal
                    .set_output(self.spec.task_id, self.spec.run, &output)
                {
                    Ok(()) => self.respond(&Response::ok(id)),
                    Err(err) => self.write_failed(&id, err),
                }
            }
        }
    }

    fn on_call(&mut self, id: Value, name: &str, args: Value) {
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
            self.respond(&Response::error(id, ErrorCode::UnknownTool, message));
            return;
        };
        let canonical = match step_key::canonical_json(&args) {
            Ok(canonical) => canonical,
            Err(err) => {
                return self.respond(&Response::error(id, ErrorCode::BadRequest, err.to_string()));
            }
        };
        if let Err(message) = tool.check_args(&args) {
            return self.respond(&Response::error(id, ErrorCode::BadRequest, message));
        }
        let asked = Asked {
            name,
            kind: StepKind::Call,
            effect: tool.effect,
            args: &args,
            canonical: &canonical,
            ask_first: tool.in_doubt == InDoubt::Ask,
        };
        let Some((record, fresh, _)) = self.open_step(&id, asked) else {
            return;
        };
        if record.effect == Effect::Mutate {
            // Write-ahead: the tool starts once the intent is durable.
            self.batch.push(Deferred {
                conn: self.conn,
                record,
                fresh,
                then: Then::Call { id, tool, args },
            });
        } else if self.may_start() {
            self.start_call(id, tool, args, record, fresh);
        } else {
            self.refuse_start(id, record.step);
        }
    }

    /// Answers a step that may not start because the run is stopping.
    fn refuse_start(&mut self, id: Value, step: u64) {
        self.respond(
            &Response::error(
                id,
                ErrorCode::Cancelled,
                format!("step {step} was stopped with the run; it runs again on resume"),
            )
            .step(step),
        );
    }

    /// Runs a `call`'s tool on a thread of its own.
    fn start_call(
        &mut self,
        id: Value,
        tool: Arc<Tool>,
        args: Value,
        record: StepRecord,
        fresh: bool,
    ) {
        let step = record.step;
        let invocation_is_http = matches!(tool.kind, ToolKind::Http(_));
        let invocation = Invocation {
            tool,
            args,
            task_id: self.spec.task_id.to_owned(),
            run: self.spec.run,
            step,
            attempt: record.attempts,
            idempotency_key: record.idempotency_key.clone(),
            cwd: self.spec.cwd.to_owned(),
        };
        let cancel = Arc::new(Cancel::default());
        let worker_cancel = Arc::clone(&cancel);
        let tx = self.events_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("tool-{step}"))
            .spawn(move || {
                let finished = executor::run(&invocation, &worker_cancel);
                let _ = tx.send(Event::ToolDone { step, finished });
            });
        if let Err(err) = spawned {
            self.respond(
                &Response::error(
                    id,
                    ErrorCode::ToolFailed,
                    format!("cannot start a thread for the tool: {err}"),
                )
                .step(step),
            );
            return;
        }
        self.calls.insert(
            step,
            CallInFlight {
                conn: self.conn,
                http: invocation_is_http,
                id,
                record,
                fresh,
                cancel,
                started: Instant::now(),
            },
        );
    }

    fn on_begin(&mut self, id: Value, name: &str, args: &Value, effect: Effect) {
        let canonical = match step_key::canonical_json(args) {
            Ok(canonical) => canonical,
            Err(err) => {
                return self.respond(&Response::error(id, ErrorCode::BadRequest, err.to_string()));
            }
        };
        let asked = Asked {
            name,
            kind: StepKind::Begin,
            effect,
            args,
            canonical: &canonical,
            ask_first: false,
        };
        let Some((record, fresh, in_doubt)) = self.open_step(&id, asked) else {
            return;
        };
        if record.effect == Effect::Mutate {
            // Write-ahead: the agent hears of the step once its intent is
            // durable.
            self.batch.push(Deferred {
                conn: self.conn,
                record,
                fresh,
                then: Then::Opened { id, in_doubt },
            });
        } else if self.may_start() {
            self.opened(id, record, fresh, in_doubt);
        } else {
            self.refuse_start(id, record.step);
        }
    }

    /// Answers a `begin` and keeps its step open until its commit or fail.
    fn opened(&mut self, id: Value, record: StepRecord, fresh: bool, in_doubt: bool) {
        let mut response = Response::ok(id).step(record.step);
        response.replayed = Some(false);
        response.attempt = Some(record.attempts);
        response.idempotency_key = Some(record.idempotency_key.clone());
        response.in_doubt = in_doubt.then_some(true);
        self.open.insert(
            record.step,
            OpenStep {
                record,
                fresh,
                started: Instant::now(),
            },
        );
        self.respond(&response);
    }

    /// Numbers the next step and decides, against the journal, whether it
    /// runs (returned, with whether its row is new and whether it is in
    /// doubt) or is answered here (replay, divergence, journal failure).
    fn open_step(&mut self, id: &Value, asked: Asked<'_>) -> Option<(StepRecord, bool, bool)> {
        let Asked {
            name,
            kind,
            effect,
            args,
            canonical,
            ask_first,
        } = asked;
        let step = self.next_step;
        self.next_step += 1;
        let args_hash = step_key::args_hash(canonical);
        let recorded = match self
            .recorded
            .take(&mut *self.journal, self.spec.task_id, step)
        {
            Ok(recorded) => recorded,
            Err(err) => {
                self.journal_failed(id, err);
                return None;
            }
        };
        let (mut record, fresh, in_doubt) = match recorded {
            None => {
                let now = journal::now();
                let record = StepRecord {
                    step,
                    name: name.to_owned(),
                    kind,
                    effect,
                    args: JsonText::from_value(args),
                    args_hash,
                    idempotency_key: step_key::idempotency_key(self.spec.task_id, step, canonical),
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
                };
                (record, true, false)
            }
            Some(recorded) if recorded.name != name || recorded.args_hash != args_hash => {
                self.diverge(id, &recorded, name, args);
                return None;
            }
            // A failure the agent went on from, or that an operator
            // recorded, replays as a failure.
            Some(recorded)
                if recorded.status == StepStatus::Committed
                    || (recorded.status == StepStatus::Failed
                        && failure_replays(&recorded, self.last_recorded)) =>
            {
                // Answered from the window read ahead: no round trip of its
                // own, and the output moves into the answer uncopied.
                self.stats.replayed_steps += 1;
                self.stats.tokens_saved += recorded.tokens;
                self.reporter.report(&Report::StepReplayed {
                    step,
                    name: &recorded.name,
                });
                self.respond(&replay_response(id.clone(), recorded));
                return None;
            }
            Some(mut record) => {
                // Pending (a run died inside it) or the last step and failed
                // (the agent died on it): run it again, same key.
                let in_doubt = record.status == StepStatus::Pending;
                if in_doubt && ask_first && record.resolution.as_deref() != Some("retry") {
                    self.ask_operator(id, &record);
                    return None;
                }
                // An operator's `retry` allows one more attempt, not all.
                record.resolution = None;
                if record.effect == Effect::Mutate && older_than(&record.created_at, KEY_MEMORY) {
                    let message = format!(
                        "step {step} ({name}) is retried more than 24 hours after its first attempt; \
                         many APIs forget idempotency keys by then, so check it did not take effect twice"
                    );
                    self.reporter.report(&Report::Warning(&message));
                }
                record.attempts += 1;
                record.status = StepStatus::Pending;
                record.started_at = journal::now();
                record.finished_at = None;
                record.error = None;
                record.output = None;
                record.seen_from = None;
                record.run = self.spec.run;
                (record, false, in_doubt)
            }
        };
        record.effect = effect;
        self.reporter.report(&Report::StepStarted {
            step,
            name,
            attempt: record.attempts,
        });
        Some((record, fresh, in_doubt))
    }

    fn diverge(&mut self, id: &Value, recorded: &StepRecord, name: &str, args: &Value) {
        let step = recorded.step;
        let show =
            |value: &Value| step_key::canonical_json(value).unwrap_or_else(|_| value.to_string());
        self.respond(
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
            for line in args_diff(&recorded.args.value(), args) {
                details.push('\n');
                details.push_str(&line);
            }
        }
        let failure = Failure::new(
            exit_code::DIVERGENCE,
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
    fn ask_operator(&mut self, id: &Value, record: &StepRecord) {
        let step = record.step;
        let task = self.spec.task_id;
        self.respond(
            &Response::error(
                id.clone(),
                ErrorCode::Cancelled,
                format!("step {step} is in doubt and waits for `durun resolve`; the run stops"),
            )
            .step(step),
        );
        let failure = Failure::new(
            exit_code::IN_DOUBT,
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

    /// A fenced write failed: the lease is lost, the task cancelled, or the
    /// journal broken.
    fn write_failed(&mut self, id: &Value, err: anyhow::Error) {
        match err.downcast_ref::<Fenced>() {
            Some(Fenced(standing)) => {
                let standing = *standing;
                if standing == Standing::Cancelled && !id.is_null() {
                    self.respond(&Response::error(
                        id.clone(),
                        ErrorCode::Cancelled,
                        "the task was cancelled; the run stops",
                    ));
                }
                self.on_standing(standing);
            }
            None => self.journal_failed(id, err),
        }
    }

    fn journal_failed(&mut self, id: &Value, err: anyhow::Error) {
        // A write no request waits for (a heartbeat, a mark) answers none.
        if !id.is_null() {
            self.respond(&Response::error(
                id.clone(),
                ErrorCode::Journal,
                format!("durun could not write the journal ({err:#}); the task stops"),
            ));
        }
        // A storage error that already says what happened (a full disk)
        // leads; anything else gets a general line.
        let explained = crate::error::failure_of(&err).is_some();
        let err = if explained {
            err
        } else {
            err.context(
                Failure::journal(format!(
                    "failed to write the journal of task {}",
                    self.spec.task_id
                ))
                .hint("check the disk and the journal file, then resume the task"),
            )
        };
        self.stop(Stop::Failure(err));
    }

    /// Ends the run early: the agent gets SIGTERM, then SIGKILL after a
    /// grace period; running tools are killed.
    fn stop(&mut self, stop: Stop) {
        if self.stop.is_some() {
            return;
        }
        if !matches!(stop, Stop::Signal) && self.exited.is_none() {
            os::signal_process(self.child_pid, libc::SIGTERM);
            self.kill_at = Some(Instant::now() + STOP_GRACE);
        }
        for call in self.calls.values() {
            call.cancel.cancel();
        }
        let http: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, call)| call.http)
            .map(|(step, _)| *step)
            .collect();
        for step in http {
            if let Some(call) = self.calls.remove(&step) {
                self.conn = call.conn;
                self.respond(
                    &Response::error(
                        call.id,
                        ErrorCode::Cancelled,
                        format!("step {step} was stopped with the run; it runs again on resume"),
                    )
                    .step(step),
                );
            }
        }
        self.stop = Some(stop);
    }

    fn on_signal(&mut self, signal: i32) {
        if self.signal.is_some() {
            // A second signal: stop waiting.
            if self.exited.is_none() {
                os::signal_process(self.child_pid, libc::SIGKILL);
            }
            return;
        }
        self.signal = Some(signal);
        // A Ctrl-C at a terminal reaches the agent directly (it shares
        // durun's process group); anything else is passed on.
        let from_terminal = signal == libc::SIGINT && self.interactive;
        if !from_terminal && self.exited.is_none() {
            os::signal_process(self.child_pid, signal);
        }
        if self.exited.is_none() {
            self.kill_at = Some(Instant::now() + SIGNAL_GRACE);
        }
        self.stop(Stop::Signal);
    }

    fn on_tool_done(&mut self, step: u64, finished: Finished) {
        let Some(call) = self.calls.remove(&step) else {
            return;
        };
        self.conn = call.conn;
        let mut record = call.record;
        record.attempts = finished.last_attempt;
        match finished.outcome {
            executor::Outcome::Cancelled => {
                self.respond(
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
                record.tokens = usage.as_ref().map_or(0, executor::tokens_of);
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
                    code: code.as_str().to_owned(),
                    // A tool's stderr may hold NUL, which no text column
                    // of PostgreSQL takes; its exact bytes are in `output`.
                    message: message.replace('\0', "\u{fffd}"),
                });
                record.output = output.as_ref().map(JsonText::from_value);
            }
        }
        self.finish_step(call.id, record, call.fresh, call.started);
    }

    fn on_close(
        &mut self,
        id: Value,
        step: u64,
        result: Result<(Value, Option<Value>), (String, Option<Value>)>,
    ) {
        let Some(open) = self.open.remove(&step) else {
            let message = if self.calls.contains_key(&step) {
                format!("step {step} is a `call`: durun closes it when the tool ends")
            } else {
                format!("step {step} is not open: commit or fail a step once, after its `begin`")
            };
            return self.respond(&Response::error(id, ErrorCode::BadRequest, message).step(step));
        };
        let mut record = open.record;
        match result {
            Ok((output, usage)) => {
                record.status = StepStatus::Committed;
                record.tokens = usage.as_ref().map_or(0, executor::tokens_of);
                record.usage = usage.as_ref().map(JsonText::from_value);
                record.output = Some(JsonText::from_value(&output));
            }
            Err((message, output)) => {
                record.status = StepStatus::Failed;
                record.error = Some(StepError {
                    code: ErrorCode::ToolFailed.as_str().to_owned(),
                    message,
                });
                record.output = output.as_ref().map(JsonText::from_value);
                // The agent reported the failure: it knows of it from here.
                record.seen_from = Some(self.next_step);
            }
        }
        self.finish_step(id, record, open.fresh, open.started);
    }

    /// Records a finished step with the batch; it is answered after the
    /// batch's commit.
    fn finish_step(&mut self, id: Value, mut record: StepRecord, fresh: bool, started: Instant) {
        record.finished_at = Some(journal::now());
        self.batch.push(Deferred {
            conn: self.conn,
            record,
            fresh,
            then: Then::Finished { id, started },
        });
    }

    /// Writes the batch's steps in one durable commit, then does what each
    /// was waiting for: answer, or start a tool.
    fn commit_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.batch);
        if self.fenced {
            return;
        }
        let mut stats = self.stats;
        let mut finished = false;
        for deferred in &mut batch {
            if let Then::Finished { .. } = deferred.then {
                finished = true;
                stats.executed_steps += 1;
                stats.tokens_spent += deferred.record.tokens;
                if deferred.record.kind == StepKind::Call
                    && deferred.record.status == StepStatus::Failed
                {
                    // Answered right after this commit: a step the agent
                    // opens from here on, it opens knowing of the failure.
                    deferred.record.seen_from = Some(self.next_step);
                }
            }
        }
        let writes: Vec<StepWrite<'_>> = batch
            .iter()
            .map(|deferred| StepWrite {
                record: &deferred.record,
                fresh: deferred.fresh,
            })
            .collect();
        let written = self
            .journal
            // An intent changes no counter: one row less to write.
            .put_steps(
                self.spec.task_id,
                &writes,
                self.spec.run,
                finished.then_some(&stats),
            );
        drop(writes);
        if let Err(err) = written {
            let (code, message) = match err.downcast_ref::<Fenced>() {
                Some(Fenced(Standing::Cancelled)) => (
                    ErrorCode::Cancelled,
                    "the task was cancelled; the run stops".to_owned(),
                ),
                _ => (
                    ErrorCode::Journal,
                    format!("durun could not write the journal ({err:#}); the task stops"),
                ),
            };
            let mut batch = batch.into_iter();
            let first = batch.next().expect("the batch is not empty");
            for deferred in batch {
                self.conn = deferred.conn;
                let id = deferred.then.into_id();
                if !id.is_null() {
                    self.respond(&Response::error(id, code, message.clone()));
                }
            }
            self.conn = first.conn;
            return self.write_failed(&first.then.into_id(), err);
        }
        self.stats = stats;
        for Deferred {
            conn, record, then, ..
        } in batch
        {
            self.conn = conn;
            self.last_recorded = self.last_recorded.max(record.step);
            match then {
                Then::Marked => {}
                Then::Finished { id, started } => self.answer_finished(id, &record, started),
                Then::Opened { id, in_doubt } => self.opened(id, record, false, in_doubt),
                Then::Call { id, tool, args } => {
                    if self.stop.is_some() || !self.check_renewal() {
                        // Its intent is recorded: the step is in doubt and
                        // runs again, with its key, on resume.
                        self.refuse_start(id, record.step);
                    } else {
                        self.start_call(id, tool, args, record, false);
                    }
                }
            }
        }
    }

    /// Reports a step whose result is durable and answers it.
    fn answer_finished(&mut self, id: Value, record: &StepRecord, started: Instant) {
        self.reporter.report(&Report::StepFinished {
            step: record.step,
            name: &record.name,
            status: record.status,
            elapsed: started.elapsed(),
            tokens: record.tokens,
            error: record.error.as_ref().map(|error| error.message.as_str()),
        });
        let step = record.step;
        let response = match (record.kind, record.status) {
            (StepKind::Begin, _) => Response::ok(id).step(step),
            (StepKind::Call, StepStatus::Committed) => {
                let mut response = Response::ok(id).step(step);
                response.replayed = Some(false);
                response.output.clone_from(&record.output);
                response.idempotency_key = Some(record.idempotency_key.clone());
                response
            }
            (StepKind::Call, _) => {
                let error = record.error.as_ref().expect("a failed step has an error");
                let code = ErrorCode::parse(&error.code).unwrap_or(ErrorCode::ToolFailed);
                let mut response = Response::error(id, code, error.message.clone()).step(step);
                response.output.clone_from(&record.output);
                response
            }
        };
        self.respond(&response);
    }

    fn outcome(self) -> Outcome {
        let exited = self.exited;
        let (mut status, mut exit_code) = match exited {
            Some(status) => match (status.code(), status.signal()) {
                (Some(0), _) => (TaskStatus::Completed, 0),
                (Some(code), _) if self.signal.is_some() => (TaskStatus::Interrupted, code),
                (Some(code), _) => (TaskStatus::Failed, code),
                (None, Some(signal)) => (TaskStatus::Interrupted, exit_code::from_signal(signal)),
                (None, None) => (TaskStatus::Failed, exit_code::INTERNAL),
            },
            // The agent never reported its exit (it hung past every grace).
            None => (TaskStatus::Interrupted, exit_code::INTERNAL),
        };
        let failure = match self.stop {
            // A fenced run leaves the task to whoever holds it, or, if
            // nobody took it, resumable.
            Some(Stop::Failure(err)) if self.fenced => {
                status = TaskStatus::Interrupted;
                exit_code = crate::error::exit_code_of(&err);
                Some(err)
            }
            Some(Stop::Failure(err)) => {
                status = TaskStatus::Failed;
                exit_code = crate::error::exit_code_of(&err);
                Some(err)
            }
            Some(Stop::Cancel) => {
                status = TaskStatus::Cancelled;
                None
            }
            Some(Stop::Signal) | None => None,
        };
        Outcome {
            status,
            exit_code,
            stats: self.stats,
            failure,
            output: Some(Output {
                passthrough: self.io.passthrough,
                stall: self.signal.map(|_| OUTPUT_STALL),
                stderr_done: None,
            }),
        }
    }
}

/// The answer to a step the journal holds: its output, or its failure.
fn replay_response(id: Value, recorded: StepRecord) -> Response {
    let mut response = match (&recorded.status, &recorded.error) {
        (StepStatus::Failed, error) => Response::error(
            id,
            ErrorCode::ToolFailed,
            error
                .as_ref()
                .map_or("failed", |error| error.message.as_str()),
        ),
        _ => Response::ok(id),
    };
    response.step = Some(recorded.step);
    response.replayed = Some(true);
    response.output = Some(recorded.output.unwrap_or_else(JsonText::null));
    response.idempotency_key = Some(recorded.idempotency_key);
    response
}

/// Whether a recorded failure replays as a failure (SPEC 3.2): an operator
/// recorded it, or the agent opened a later step after it was answered with
/// it. A failure the agent never saw, or saw only after it had opened every
/// later step (parallel calls), runs again with the same key.
fn failure_replays(recorded: &StepRecord, last_recorded: u64) -> bool {
    if recorded.resolution.as_deref() == Some("fail") {
        return true;
    }
    match recorded.seen_from {
        Some(seen_from) => last_recorded >= seen_from,
        // Recorded before durun kept `seen_from`: the older rule.
        None => recorded.step < last_recorded,
    }
}

/// Whether the RFC 3339 time `then` is more than `age` ago.
fn older_than(then: &str, age: Duration) -> bool {
    humantime::parse_rfc3339(then)
        .ok()
        .and_then(|then| then.elapsed().ok())
        .is_some_and(|elapsed| elapsed > age)
}

/// A line per leaf that differs between the recorded and the asked args,
/// with its path: `args.files[2].path: "a" -> "b"`.
fn args_diff(recorded: &Value, asked: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    diff_at("args", recorded, asked, &mut lines);
    lines
}

fn diff_at(path: &str, recorded: &Value, asked: &Value, lines: &mut Vec<String>) {
    const MOST: usize = 20;
    if recorded == asked || lines.len() >= MOST {
        return;
    }
    match (recorded, asked) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let child = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff_at(&child, x, y, lines),
                    (Some(x), None) => lines.push(format!("- {child}: {x}")),
                    (None, Some(y)) => lines.push(format!("+ {child}: {y}")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let child = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => diff_at(&child, x, y, lines),
                    (Some(x), None) => lines.push(format!("- {child}: {x}")),
                    (None, Some(y)) => lines.push(format!("+ {child}: {y}")),
                    (None, None) => {}
                }
            }
        }
        _ => lines.push(format!("  {path}: {recorded} -> {asked}")),
    }
}

/// An object line that names an `op` but did not parse: most likely a
/// request the agent got wrong (truncated, or not UTF-8).
fn looks_like_a_request(line: &[u8]) -> bool {
    line.trim_ascii_start().starts_with(b"{") && line.windows(4).any(|window| window == b"\"op\"")
}

#[cfg(test)]
mod tests {
    use super::args_diff;
    use serde_json::json;

    #[test]
    fn diffs_name_the_path_of_each_change() {
        let recorded =
            json!({"title": "Fix typo", "files": [{"path": "a"}, {"path": "b"}], "draft": true});
        let asked = json!({"title": "Fix typo", "files": [{"path": "a"}, {"path": "c"}, {"path": "d"}], "labels": []});
        assert_eq!(
            args_diff(&recorded, &asked),
            [
                "- args.draft: true",
                "  args.files[1].path: \"b\" -> \"c\"",
                "+ args.files[2]: {\"path\":\"d\"}",
                "+ args.labels: []",
            ]
        );
        assert_eq!(args_diff(&json!(1), &json!("1")), ["  args: 1 -> \"1\""]);
    }
}
