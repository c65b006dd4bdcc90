//! One attempt of a command tool.

use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Cancel, Invocation, Outcome};
use crate::os;
use crate::protocol::ErrorCode;
use rustix::process::Signal;

/// How long a timed-out tool gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How much of a failed tool's stderr goes into the error message.
const STDERR_TAIL: usize = 2000;
/// The most stdout a tool may print; more fails the step rather than
/// filling durun's memory and the journal.
const STDOUT_LIMIT: usize = 32 * 1024 * 1024;
/// How much of a tool's stderr durun keeps (the end of it).
const STDERR_KEEP: usize = 64 * 1024;

pub(super) fn run_once(
    invocation: &Invocation,
    templates: &[String],
    stdin_args: bool,
    attempt: u32,
    cancel: &Cancel,
) -> Outcome {
    let tool = &invocation.tool;
    let argv = match tool.argv(templates, &invocation.args) {
        Ok(argv) => argv,
        Err(message) => return failed(ErrorCode::ToolFailed, message, None),
    };
    let started = match start(invocation, &argv, stdin_args, attempt) {
        Ok(started) => started,
        Err(message) => return failed(ErrorCode::ToolFailed, message, None),
    };
    let Started {
        keeper,
        pgid,
        lifeline,
        stdout,
        stderr,
    } = started;
    let stdout_thread = std::thread::spawn(move || read_capped(stdout, STDOUT_LIMIT));
    let stderr_thread = std::thread::spawn(move || read_tail(stderr, STDERR_KEEP));
    cancel.started(pgid);
    let (result, timed_out) = wait(keeper, pgid, tool.timeout);
    // Whatever the tool left running in its group goes with it: no tool
    // process outlives its step (and holds its output pipes open).
    os::signal_group(pgid, Signal::KILL);
    drop(lifeline);
    cancel.ended();
    let (stdout, overflow) = stdout_thread.join().unwrap_or_default();
    let stderr = stderr_thread.join().unwrap_or_default();
    if cancel.is_cancelled() {
        return Outcome::Cancelled;
    }
    let status = match result {
        Ok(status) => status,
        Err(err) => {
            return failed(
                ErrorCode::ToolFailed,
                format!("failed to wait for the tool: {err}"),
                None,
            );
        }
    };
    judge(tool, status, &stdout, &stderr, overflow, timed_out)
}

/// A tool started: its keeper, its process group, and the read ends of its
/// stdout and stderr.
struct Started {
    /// The keeper, durun's child: it exits with the tool's status once the
    /// tool and everything it started have ended.
    keeper: u32,
    /// The tool leads a process group of its own, which its keeper is not in.
    pgid: u32,
    /// Held until the tool's step is over: its close ends what is left.
    lifeline: std::os::fd::OwnedFd,
    stdout: std::process::ChildStdout,
    stderr: std::process::ChildStderr,
}

/// Starts the tool under a keeper (from the nursery where there is one):
/// whatever it starts, in any session, ends with it or with durun. Its
/// output goes through pipes read with a cap, never into memory whole.
fn start(
    invocation: &Invocation,
    argv: &[String],
    stdin_args: bool,
    attempt: u32,
) -> Result<Started, String> {
    // A relative program path means the task's directory, wherever durun
    // was started from.
    let mut argv = argv.to_vec();
    if argv[0].contains('/') {
        argv[0] = invocation.cwd.join(&argv[0]).to_string_lossy().into_owned();
    }
    let cannot_start = |err: std::io::Error| format!("cannot start `{}`: {err}", argv[0]);
    let mut env = vec![
        ("DURUN_TASK_ID", invocation.task_id.clone().into()),
        ("DURUN_RUN", invocation.run.to_string().into()),
        ("DURUN_STEP", invocation.step.to_string().into()),
        ("DURUN_ATTEMPT", attempt.to_string().into()),
        (
            "DURUN_IDEMPOTENCY_KEY",
            invocation.idempotency_key.clone().into(),
        ),
    ];
    if let Some(traceparent) = &invocation.traceparent {
        env.push(("TRACEPARENT", traceparent.into()));
    }
    let spawned = crate::spawn::spawn(&crate::spawn::Plan {
        argv: &argv,
        cwd: &invocation.cwd,
        stdin: crate::config::StdinMode::Protocol,
        env,
        pipe_stderr: true,
        own_group: true,
    })
    .map_err(cannot_start)?;
    let mut stdin = spawned.stdin;
    if stdin_args {
        // On a thread: args larger than the pipe's buffer would block here
        // until the tool read them, and a tool may never read them.
        let args = serde_json::to_vec(&invocation.args).expect("JSON serializes");
        std::thread::spawn(move || {
            use std::io::Write as _;
            let _ = stdin.write_all(&args);
        });
    } else {
        drop(stdin);
    }
    Ok(Started {
        keeper: spawned.keeper,
        pgid: spawned.pid,
        lifeline: spawned.lifeline,
        stdout: spawned.stdout,
        stderr: spawned.stderr.expect("a tool's stderr is piped"),
    })
}

/// Waits for the tool's keeper; past `timeout`, SIGTERM to the tool's
/// whole group, then SIGKILL after a grace. How it ended, and whether it
/// timed out.
fn wait(
    keeper: u32,
    pgid: u32,
    timeout: Option<Duration>,
) -> (std::io::Result<std::process::ExitStatus>, bool) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(reap(keeper));
    });
    let Some(timeout) = timeout else {
        return (rx.recv().unwrap_or_else(|_| Err(gone())), false);
    };
    match rx.recv_timeout(timeout) {
        Ok(status) => (status, false),
        Err(_) => {
            os::signal_group(pgid, Signal::TERM);
            let status = rx.recv_timeout(KILL_GRACE).unwrap_or_else(|_| {
                os::signal_group(pgid, Signal::KILL);
                rx.recv().unwrap_or_else(|_| Err(gone()))
            });
            (status, true)
        }
    }
}

/// Waits for `pid`, a child of durun's.
fn reap(pid: u32) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt as _;
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(gone)?;
    loop {
        match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => {
                return Ok(std::process::ExitStatus::from_raw(status.as_raw()));
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
}

fn gone() -> std::io::Error {
    std::io::Error::other("the tool's keeper is gone")
}

/// The step's outcome from how the tool ended and what it printed.
fn judge(
    tool: &crate::config::Tool,
    status: std::process::ExitStatus,
    stdout: &[u8],
    stderr: &str,
    overflow: bool,
    timed_out: bool,
) -> Outcome {
    let stdout = String::from_utf8_lossy(stdout).into_owned();
    let stderr = tail(stderr.as_bytes());
    if overflow {
        return failed(
            ErrorCode::ToolFailed,
            format!(
                "`{}` printed more than {} MiB on stdout",
                tool.name,
                STDOUT_LIMIT >> 20
            ),
            Some(json!({"stderr": stderr})),
        );
    }
    if timed_out {
        let limit =
            humantime::format_duration(tool.timeout.expect("timed out only with a timeout"));
        return failed(
            ErrorCode::Timeout,
            format!("`{}` timed out after {limit}", tool.name),
            Some(json!({"stdout": stdout, "stderr": stderr})),
        );
    }
    if !status.success() {
        use std::os::unix::process::ExitStatusExt as _;
        let (how, exit_code) = match (status.code(), status.signal()) {
            (Some(code), _) => (format!("exit status {code}"), Value::from(code)),
            (None, Some(signal)) => (format!("killed by signal {signal}"), Value::Null),
            (None, None) => ("ended abnormally".to_owned(), Value::Null),
        };
        let message = if stderr.trim().is_empty() {
            how
        } else {
            format!("{how}: {}", stderr.trim())
        };
        return failed(
            ErrorCode::ToolFailed,
            message,
            Some(json!({"exit_code": exit_code, "stdout": stdout, "stderr": stderr})),
        );
    }
    match super::read_output(tool.output, stdout) {
        Ok((output, usage)) => Outcome::Done { output, usage },
        Err((stdout, err)) => failed(
            ErrorCode::ToolFailed,
            format!(
                "`{}` printed invalid JSON ({err}) but its output is \"json\"",
                tool.name
            ),
            Some(json!({"stdout": stdout, "stderr": stderr})),
        ),
    }
}

fn failed(code: ErrorCode, message: String, output: Option<Value>) -> Outcome {
    Outcome::Failed {
        code,
        message,
        output,
        retryable: true,
        retry_after: None,
    }
}

/// The last `STDERR_TAIL` bytes of `bytes`, as text.
fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// Reads up to `limit` bytes, then drains the rest; true if there was more.
fn read_capped(mut reader: impl Read, limit: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let _ = (&mut reader).take(limit as u64).read_to_end(&mut kept);
    let overflow = std::io::copy(&mut reader, &mut std::io::sink()).is_ok_and(|more| more > 0);
    (kept, overflow)
}

/// Reads everything, keeping the last `keep` bytes as text.
fn read_tail(mut reader: impl Read, keep: usize) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match reader.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buffer[..n]);
                if kept.len() > 2 * keep {
                    kept.drain(..kept.len() - keep);
                }
            }
        }
    }
    let start = kept.len().saturating_sub(keep);
    String::from_utf8_lossy(&kept[start..]).into_owned()
}
