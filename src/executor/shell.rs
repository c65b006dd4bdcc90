//! One attempt of a command tool, through duct.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{Cancel, Invocation, Outcome};
use crate::config::OutputMode;
use crate::os;
use crate::protocol::ErrorCode;

/// How long a timed-out tool gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How much of a failed tool's stderr goes into the error message.
const STDERR_TAIL: usize = 2000;

pub fn run_once(invocation: &Invocation, attempt: u32, cancel: &Cancel) -> Outcome {
    let tool = &invocation.tool;
    let argv = match tool.argv(&invocation.args) {
        Ok(argv) => argv,
        Err(message) => return failed(ErrorCode::ToolFailed, message, None),
    };
    // A relative program path means the task's directory, wherever durun
    // was started from.
    // duct would look a `Path` up relative to the cwd, so pass a string.
    let program = if argv[0].contains('/') {
        invocation.cwd.join(&argv[0]).into_os_string()
    } else {
        argv[0].clone().into()
    };
    let mut expression = duct::cmd(&program, &argv[1..])
        .dir(&invocation.cwd)
        .env("DURUN_TASK_ID", &invocation.task_id)
        .env("DURUN_RUN", invocation.run.to_string())
        .env("DURUN_STEP", invocation.step.to_string())
        .env("DURUN_ATTEMPT", attempt.to_string())
        .env("DURUN_IDEMPOTENCY_KEY", &invocation.idempotency_key)
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .before_spawn(|command| {
            os::own_process_group(command);
            os::die_with_parent(command);
            Ok(())
        });
    expression = if tool.stdin_args {
        expression.stdin_bytes(serde_json::to_vec(&invocation.args).expect("JSON serializes"))
    } else {
        expression.stdin_null()
    };
    let handle = match expression.start() {
        Ok(handle) => std::sync::Arc::new(handle),
        Err(err) => {
            return failed(
                ErrorCode::ToolFailed,
                format!("cannot start `{}`: {err}", program.to_string_lossy()),
                None,
            )
        }
    };
    let pgid = handle.pids().first().copied().unwrap_or(0);
    cancel.started(pgid);
    let mut timed_out = false;
    let result = match tool.timeout {
        None => handle.wait().cloned(),
        Some(timeout) => {
            let (tx, rx) = mpsc::channel();
            let waiter = std::sync::Arc::clone(&handle);
            std::thread::spawn(move || {
                let _ = tx.send(waiter.wait().cloned());
            });
            match rx.recv_timeout(timeout) {
                Ok(result) => result,
                Err(_) => {
                    timed_out = true;
                    os::signal_group(pgid, libc::SIGTERM);
                    rx.recv_timeout(KILL_GRACE).unwrap_or_else(|_| {
                        os::signal_group(pgid, libc::SIGKILL);
                        rx.recv()
                            .unwrap_or_else(|_| Err(std::io::Error::other("tool waiter vanished")))
                    })
                }
            }
        }
    };
    cancel.ended();
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
            )
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = tail(&output.stderr);
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
    match tool.output {
        OutputMode::Text => Outcome::Done {
            output: Value::String(stdout),
            usage: None,
        },
        OutputMode::Json => match serde_json::from_str::<Value>(&stdout) {
            Ok(value) => Outcome::Done {
                usage: value
                    .get("usage")
                    .filter(|usage| usage.is_object())
                    .cloned(),
                output: value,
            },
            Err(err) => failed(
                ErrorCode::ToolFailed,
                format!(
                    "`{}` printed invalid JSON ({err}) but its output is \"json\"",
                    tool.name
                ),
                Some(json!({"stdout": stdout, "stderr": stderr})),
            ),
        },
    }
}

fn failed(code: ErrorCode, message: String, output: Option<Value>) -> Outcome {
    Outcome::Failed {
        code,
        message,
        output,
    }
}

/// The last `STDERR_TAIL` bytes of `bytes`, as text.
fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}
