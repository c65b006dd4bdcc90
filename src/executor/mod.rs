//! Runs the tools an agent `call`s: argv templates from `durun.toml`, never a
//! shell.
//!
//! A tool runs in its own process group, gets SIGKILL if durun dies, and
//! sees the step's identity in `DURUN_TASK_ID`, `DURUN_STEP`, `DURUN_ATTEMPT`
//! and `DURUN_IDEMPOTENCY_KEY`. Every attempt of one step carries the same
//! key.

mod http;
pub(crate) mod probe;
mod shell;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::config::{Tool, ToolKind};
use crate::os;
use crate::protocol::ErrorCode;
use rustix::process::Signal;

/// One step's call of one tool.
#[derive(Debug, Clone)]
pub(crate) struct Invocation {
    pub(crate) tool: Arc<Tool>,
    pub(crate) args: Value,
    pub(crate) task_id: String,
    pub(crate) run: u32,
    pub(crate) step: u64,
    /// The attempt number of the first try in this invocation.
    pub(crate) attempt: u32,
    pub(crate) idempotency_key: String,
    pub(crate) cwd: PathBuf,
    /// The step's span, when traces are on: a `traceparent` header for an
    /// HTTP tool, `TRACEPARENT` for a command.
    pub(crate) traceparent: Option<String>,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Done {
        output: Value,
        usage: Option<Value>,
    },
    Failed {
        code: ErrorCode,
        message: String,
        output: Option<Value>,
        /// Worth another attempt (`retries`): a 4xx answer other than 429
        /// is not.
        retryable: bool,
        /// How long the service asked to wait (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// durun stopped it (a signal, a cancel): nothing to record.
    Cancelled,
}

#[derive(Debug, Clone)]
pub(crate) struct Finished {
    pub(crate) outcome: Outcome,
    /// The attempt number of the last try.
    pub(crate) last_attempt: u32,
}

/// Lets the supervisor stop a running tool from another thread.
#[derive(Debug, Default)]
pub(crate) struct Cancel {
    cancelled: AtomicBool,
    /// The process group of the running attempt, 0 when none runs.
    pgid: AtomicU32,
    /// Wakes a backoff sleeping between two tries.
    wake: (std::sync::Mutex<()>, std::sync::Condvar),
}

impl Cancel {
    /// Stops the tool: SIGKILL to its whole process group.
    pub(crate) fn cancel(&self) {
        {
            // Under the lock: a sleeper between its check and its wait
            // cannot miss the wake-up.
            let _held = self
                .wake
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.cancelled.store(true, Ordering::SeqCst);
        }
        self.wake.1.notify_all();
        let pgid = self.pgid.load(Ordering::SeqCst);
        if pgid != 0 {
            os::signal_group(pgid, Signal::KILL);
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn started(&self, pgid: u32) {
        self.pgid.store(pgid, Ordering::SeqCst);
        // A cancel that came while the process was starting still counts.
        if self.is_cancelled() {
            os::signal_group(pgid, Signal::KILL);
        }
    }

    fn ended(&self) {
        self.pgid.store(0, Ordering::SeqCst);
    }
}

/// The longest wait between two tries: the backoff's limit, and the most
/// a `Retry-After` is obeyed (a 429 asking for a day would otherwise park
/// the call a day).
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs the tool, retrying failures `tool.retries` times with exponential
/// backoff; every try carries the same idempotency key. A `Retry-After`
/// is obeyed up to [`MAX_BACKOFF`].
pub(crate) fn run(invocation: &Invocation, cancel: &Cancel) -> Finished {
    let mut attempt = invocation.attempt;
    let mut delay = Duration::from_millis(250);
    loop {
        let outcome = if cancel.is_cancelled() {
            Outcome::Cancelled
        } else {
            match &invocation.tool.kind {
                ToolKind::Http(spec) => http::run_once(invocation, spec, attempt, cancel),
                ToolKind::Command { argv, stdin_args } => {
                    shell::run_once(invocation, argv, *stdin_args, attempt, cancel)
                }
            }
        };
        let retries_left = invocation.attempt + invocation.tool.retries > attempt;
        let wait = match &outcome {
            Outcome::Failed {
                retryable: true,
                retry_after,
                ..
            } if retries_left => wait_before_retry(*retry_after, delay),
            _ => {
                return Finished {
                    outcome,
                    last_attempt: attempt,
                };
            }
        };
        if !sleep_unless_cancelled(wait, cancel) {
            return Finished {
                outcome: Outcome::Cancelled,
                last_attempt: attempt,
            };
        }
        attempt += 1;
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

/// `delay` times a factor between 0.5 and 1.5, so that many clients that
/// failed together do not retry together.
fn jittered(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    delay.mul_f64(0.5 + f64::from(nanos % 1000) / 1000.0)
}

/// How long to wait before the next try: what a `Retry-After` asked, up
/// to [`MAX_BACKOFF`], else the backoff `delay`, jittered.
fn wait_before_retry(retry_after: Option<Duration>, delay: Duration) -> Duration {
    retry_after.map_or_else(|| jittered(delay), |asked| asked.min(MAX_BACKOFF))
}

/// Sleeps `delay`, woken at once by a cancel; false if cancelled.
fn sleep_unless_cancelled(delay: Duration, cancel: &Cancel) -> bool {
    let deadline = std::time::Instant::now() + delay;
    let mut held = cancel
        .wake
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    while !cancel.is_cancelled() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        held = cancel
            .wake
            .1
            .wait_timeout(held, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    false
}

/// A tool's answer as its `output` mode reads it: the text itself, or the
/// JSON in it with its `usage` member, if any.
fn read_output(
    mode: crate::config::OutputMode,
    text: String,
) -> Result<(Value, Option<Value>), (String, serde_json::Error)> {
    match mode {
        crate::config::OutputMode::Text => Ok((Value::String(text), None)),
        crate::config::OutputMode::Json => match serde_json::from_str::<Value>(&text) {
            Ok(value) => {
                let usage = value
                    .get("usage")
                    .filter(|usage| usage.is_object())
                    .cloned();
                Ok((value, usage))
            }
            Err(err) => Err((text, err)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_after_is_obeyed_up_to_the_backoffs_limit() {
        let day = Duration::from_secs(86_400);
        assert_eq!(
            wait_before_retry(Some(day), Duration::from_millis(250)),
            MAX_BACKOFF
        );
        assert_eq!(
            wait_before_retry(Some(Duration::from_secs(2)), Duration::from_millis(250)),
            Duration::from_secs(2)
        );
        let jittered = wait_before_retry(None, Duration::from_secs(1));
        assert!(jittered >= Duration::from_millis(500) && jittered <= Duration::from_millis(1500));
    }

    #[test]
    fn a_cancel_wakes_a_backoff_at_once() {
        let cancel = std::sync::Arc::new(Cancel::default());
        let canceller = std::sync::Arc::clone(&cancel);
        let started = std::time::Instant::now();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            canceller.cancel();
        });
        assert!(!sleep_unless_cancelled(Duration::from_secs(60), &cancel));
        thread.join().expect("canceller");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        assert!(sleep_unless_cancelled(Duration::ZERO, &Cancel::default()));
    }
}
