//! One attempt of a command tool, through duct.

use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Cancel, Invocation, Outcome};
use crate::os;
use crate::protocol::ErrorCode;

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
        handle,
        pgid,
        keeping,
        stdout,
        stderr,
    } = started;
    let stdout_thread = std::thread::spawn(move || read_capped(stdout, STDOUT_LIMIT));
    let stderr_thread = std::thread::spawn(move || read_tail(stderr, STDERR_KEEP));
    cancel.started(pgid);
    let (result, timed_out) = wait(&handle, pgid, tool.timeout);
    // Whatever the tool left running in its group goes with it: no tool
    // process outlives its step (and holds its output pipes open).
    os::signal_group(pgid, libc::SIGKILL);
    drop(keeping);
    cancel.ended();
    let (stdout, overflow) = stdout_thread.join().unwrap_or_default();
    let stderr = stderr_thread.join().unwrap_or_default();
    if cancel.is_cancelled() {
        return Outcome::Cancelled;
    }
    let output = match result {
        Ok(output) => output,
        Err(err) => {
            return failed(
                ErrorCode::ToolFailed,
                format!("failed to wait for the tool: {err}"),
                None,
            );
        }
    };
    judge(tool, &output, &stdout, &stderr, overflow, timed_out)
}

/// A tool started: its keeper's handle, its process group, and the read
/// ends of its stdout and stderr.
struct Started {
    handle: duct::Handle,
    /// The tool leads a process group of its own, which its keeper is not in.
    pgid: u32,
    /// Held until the tool's step is over: its close ends what is left.
    keeping: crate::keeper::Keeping,
    stdout: std::io::PipeReader,
    stderr: std::io::PipeReader,
}

/// Starts the tool under a keeper: whatever it starts, in any session,
/// ends with it or with durun. Its output goes through pipes read with a
/// cap, never into memory whole.
fn start(
    invocation: &Invocation,
    argv: &[String],
    stdin_args: bool,
    attempt: u32,
) -> Result<Started, String> {
    // A relative program path means the task's directory, wherever durun
    // was started from.
    // duct would look a `Path` up relative to the cwd, so pass a string.
    let program = if argv[0].contains('/') {
        invocation.cwd.join(&argv[0]).into_os_string()
    } else {
        argv[0].clone().into()
    };
    let cannot_start =
        |err: std::io::Error| format!("cannot start `{}`: {err}", program.to_string_lossy());
    let mut keeping = crate::keeper::Keeping::new().map_err(cannot_start)?;
    let command: Vec<std::ffi::OsString> = std::iter::once(program.clone())
        .chain(argv[1..].iter().map(Into::into))
        .collect();
    let (exe, keeper_args) =
        crate::keeper::Keeping::command_line(&command, true).map_err(cannot_start)?;
    let mut expression = duct::cmd(exe, keeper_args)
        .dir(&invocation.cwd)
        .env("DURUN_TASK_ID", &invocation.task_id)
        .env("DURUN_RUN", invocation.run.to_string())
        .env("DURUN_STEP", invocation.step.to_string())
        .env("DURUN_ATTEMPT", attempt.to_string())
        .env("DURUN_IDEMPOTENCY_KEY", &invocation.idempotency_key)
        .unchecked()
        .before_spawn(keeping.hand_over());
    if let Some(traceparent) = &invocation.traceparent {
        expression = expression.env("TRACEPARENT", traceparent);
    }
    expression = if stdin_args {
        expression.stdin_bytes(serde_json::to_vec(&invocation.args).expect("JSON serializes"))
    } else {
        expression.stdin_null()
    };
    let (stdout, stdout_writer) =
        std::io::pipe().map_err(|err| format!("cannot create pipes for the tool: {err}"))?;
    let (stderr, stderr_writer) =
        std::io::pipe().map_err(|err| format!("cannot create pipes for the tool: {err}"))?;
    let started = expression
        .stdout_file(stdout_writer)
        .stderr_file(stderr_writer)
        .start();
    // The expression holds the pipes' write ends: drop it so that the
    // readers see the end of output when the tool's processes are gone.
    drop(expression);
    let handle = started.map_err(cannot_start)?;
    let pgid = match keeping.started() {
        Ok(pid) => pid,
        Err(err) => {
            // The keeper exits at once when the tool could not start.
            let _ = handle.wait();
            return Err(cannot_start(err));
        }
    };
    Ok(Started {
        handle,
        pgid,
        keeping,
        stdout,
        stderr,
    })
}

/// Waits for the tool; past `timeout`, SIGTERM to its whole group, then
/// SIGKILL after a grace. Its output, and whether it timed out.
fn wait(
    handle: &duct::Handle,
    pgid: u32,
    timeout: Option<Duration>,
) -> (std::io::Result<std::process::Output>, bool) {
    let Some(timeout) = timeout else {
        return (handle.wait().cloned(), false);
    };
    match handle.wait_timeout(timeout) {
        Ok(Some(output)) => (Ok(output.clone()), false),
        Ok(None) => {
            os::signal_group(pgid, libc::SIGTERM);
            let output = match handle.wait_timeout(KILL_GRACE) {
                Ok(Some(output)) => Ok(output.clone()),
                Ok(None) => {
                    os::signal_group(pgid, libc::SIGKILL);
                    handle.wait().cloned()
                }
                Err(err) => Err(err),
            };
            (output, true)
        }
        Err(err) => (Err(err), false),
    }
}

/// The step's outcome from how the tool ended and what it printed.
fn judge(
    tool: &crate::config::Tool,
    output: &std::process::Output,
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
    if !output.status.success() {
        use std::os::unix::process::ExitStatusExt as _;
        let (how, exit_code) = match (output.status.code(), output.status.signal()) {
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
