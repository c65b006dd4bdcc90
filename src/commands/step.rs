//! `durun step` and `durun call`: the protocol for shell agents, over
//! `DURUN_SOCKET` (SPEC 2.5).

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};
use serde_json::{Map, Value, json};

use crate::cli::{CallArgs, SleepArgs, StepArgs, WaitArgs};
use crate::error::Failure;
use crate::exit_code;
use crate::protocol::ErrorCode;
use crate::protocol::client::{Answer, Connection, Outgoing};
use crate::report::say;
use crate::settings::Settings;
use rustix::process::Signal;

/// The most stdout a step records; more still passes through.
const RECORD_LIMIT: usize = 32 * 1024 * 1024;

/// A connection to the running durun, if this runs inside one.
fn connect(settings: &Settings) -> Result<Option<Connection>> {
    settings
        .socket
        .as_deref()
        .map(|path| {
            Connection::connect(path).map_err(|err| {
                err.context(
                    Failure::journal(format!("cannot reach the running durun at {}", path.display()))
                        .hint("durun step and durun call work inside the `durun run` that started this script"),
                )
            })
        })
        .transpose()
}

/// The exit code for an error answer durun gave this client.
fn error_exit(answer: &Answer) -> i32 {
    match answer.code() {
        Some(ErrorCode::Divergence) => exit_code::DIVERGENCE,
        Some(ErrorCode::Journal) => exit_code::JOURNAL,
        Some(ErrorCode::BadRequest | ErrorCode::UnknownTool) => exit_code::USAGE,
        Some(ErrorCode::Cancelled) => exit_code::from_signal(Signal::TERM.as_raw()),
        Some(ErrorCode::BudgetExceeded) => exit_code::OVER_BUDGET,
        _ => 1,
    }
}

pub(crate) fn exec(args: &StepArgs, settings: &Settings) -> Result<i32> {
    let mut step_args = Map::new();
    step_args.insert("argv".to_owned(), json!(args.command));
    match &args.args {
        None => {}
        Some(Value::Object(extra)) => {
            step_args.extend(
                extra
                    .iter()
                    .filter(|(key, _)| *key != "argv")
                    .map(|(key, value)| (key.clone(), value.clone())),
            );
        }
        Some(other) => {
            return Err(
                Failure::usage(format!("--args is not a JSON object: {other}"))
                    .hint("for example --args '{\"version\": \"1.4.0\"}'")
                    .into(),
            );
        }
    }
    let Some(mut client) = connect(settings)? else {
        // Outside a run the script works as if durun were not there.
        return Ok(run_plain(&args.command));
    };
    let step_args = Value::Object(step_args);
    let answer = client.request(&Outgoing::Begin {
        name: &args.name,
        args: &step_args,
        effect: &args.effect,
        kind: None,
    })?;
    if answer.replayed {
        // Recorded: print what it printed, exit as it exited.
        let output = &answer.output;
        let recorded = recorded_stdout(output)?;
        let mut out = std::io::stdout().lock();
        out.write_all(&recorded)?;
        out.flush()?;
        let code = output["exit_code"]
            .as_i64()
            .unwrap_or(i64::from(!answer.ok));
        return Ok(i32::try_from(code).unwrap_or(1));
    }
    if !answer.ok {
        say(&format!(
            "step {} refused: {}",
            args.name,
            answer.error_text()
        ));
        return Ok(error_exit(&answer));
    }
    let step = answer.step.unwrap_or(0);
    if let Some(file) = &args.usage_json {
        // What an earlier step left there is not this step's usage.
        let _ = std::fs::remove_file(file);
    }
    let (code, stdout, truncated) = run_recorded(&args.command, &answer)?;
    let mut output = stdout_json(&stdout);
    output["exit_code"] = json!(code);
    if truncated {
        output["truncated"] = json!(true);
    }
    let usage = usage_of(args.usage_json.as_deref(), &stdout)?;
    let error = format!("exit status {code}");
    let closing = if code == 0 {
        Outgoing::Commit {
            step,
            output: &output,
            usage: &usage,
            reconciled: false,
        }
    } else {
        Outgoing::Fail {
            step,
            error: &error,
            output: &output,
        }
    };
    let closed = client.request(&closing)?;
    if !closed.ok {
        say(&format!(
            "step {} could not be recorded: {}",
            args.name,
            closed.error_text()
        ));
        return Ok(error_exit(&closed));
    }
    Ok(code)
}

/// The step's token usage: what the command wrote to `--usage-json FILE`,
/// or the `usage` member of a JSON object it printed.
fn usage_of(file: Option<&std::path::Path>, stdout: &[u8]) -> Result<Value> {
    if let Some(file) = file {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            // The command wrote none: no usage, not an error.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Value::Null),
            Err(err) => {
                return Err(err).with_context(|| format!("failed to read {}", file.display()));
            }
        };
        return match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(object)) => Ok(object
                .get("usage")
                .cloned()
                .unwrap_or(Value::Object(object))),
            _ => Err(Failure::usage(format!(
                "{} does not hold a JSON object of token usage",
                file.display()
            ))
            .hint("write e.g. {\"input_tokens\": 812, \"output_tokens\": 96}")
            .into()),
        };
    }
    Ok(match serde_json::from_slice::<Value>(stdout) {
        Ok(Value::Object(object)) => match object.get("usage") {
            Some(usage @ Value::Object(_)) => usage.clone(),
            _ => Value::Null,
        },
        _ => Value::Null,
    })
}

/// A step's stdout as its output records it, byte for byte: `stdout` as
/// text when it is UTF-8 that JSON carries without growing past base64,
/// else `stdout_base64`.
fn stdout_json(bytes: &[u8]) -> Value {
    use base64::Engine as _;
    let escaped: usize = bytes
        .iter()
        .map(|&b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum();
    let base64_len = bytes.len().div_ceil(3) * 4;
    match std::str::from_utf8(bytes) {
        Ok(text) if escaped <= base64_len => json!({ "stdout": text }),
        _ => json!({ "stdout_base64": base64::engine::general_purpose::STANDARD.encode(bytes) }),
    }
}

/// The bytes a recorded step printed.
fn recorded_stdout(output: &Value) -> Result<Vec<u8>> {
    use base64::Engine as _;
    if let Some(encoded) = output["stdout_base64"].as_str() {
        return base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .context("the recorded stdout_base64 is not base64");
    }
    Ok(output["stdout"]
        .as_str()
        .map(|text| text.as_bytes().to_vec())
        .unwrap_or_default())
}

/// Runs `argv` with the step's identity, passing its stdout through and
/// recording it; returns its exit code (128+N for signal N).
fn run_recorded(argv: &[String], answer: &Answer) -> Result<(i32, Vec<u8>, bool)> {
    let mut child = match Command::new(&argv[0])
        .args(&argv[1..])
        .env(
            "DURUN_IDEMPOTENCY_KEY",
            answer.idempotency_key.as_deref().unwrap_or_default(),
        )
        .env("DURUN_STEP", answer.step.unwrap_or(0).to_string())
        .env("DURUN_ATTEMPT", answer.attempt.unwrap_or(1).to_string())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => {
            say(&format!("cannot start `{}`: {err}", argv[0]));
            return Ok((exit_code::CANNOT_START, Vec::new(), false));
        }
    };
    let mut pipe = child.stdout.take().expect("stdout is piped");
    let mut recorded = Vec::new();
    let mut truncated = false;
    let mut buffer = [0u8; 16 * 1024];
    let mut out = std::io::stdout();
    loop {
        let n = match pipe.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err).context("failed to read the step's output"),
        };
        // The output passes through as it comes, even past what is recorded.
        let _ = out.write_all(&buffer[..n]).and_then(|()| out.flush());
        let room = RECORD_LIMIT.saturating_sub(recorded.len());
        truncated |= n > room;
        recorded.extend_from_slice(&buffer[..n.min(room)]);
    }
    let status = child
        .wait()
        .context("failed to wait for the step's command")?;
    let code = exit_code::of(status);
    Ok((code, recorded, truncated))
}

/// The command alone, as if durun were not there.
fn run_plain(argv: &[String]) -> i32 {
    match Command::new(&argv[0]).args(&argv[1..]).status() {
        Ok(status) => exit_code::of(status),
        Err(err) => {
            say(&format!("cannot start `{}`: {err}", argv[0]));
            exit_code::CANNOT_START
        }
    }
}

pub(crate) fn call(args: &CallArgs, settings: &Settings) -> Result<i32> {
    let tool_args = args.args.clone().unwrap_or_else(|| json!({}));
    let Some(mut client) = connect(settings)? else {
        // Outside a run the tool runs as durun.toml says, once, journaled
        // nowhere: an agent works without durun as it does with it.
        return call_standalone(&args.tool, tool_args, args.json, settings);
    };
    let answer = client.request(&Outgoing::Call {
        tool: &args.tool,
        args: &tool_args,
    })?;
    if answer.ok {
        return print_output(&answer.output, args.json);
    }
    let (code, message) = answer
        .error
        .as_ref()
        .map_or(("error", "no message"), |error| {
            (error.code.as_str(), error.message.as_str())
        });
    Ok(call_failed(&args.tool, code, message, args.json))
}

/// A tool's output on stdout: the JSON itself, or `{"ok": true, "output"}`
/// with `--json`.
fn print_output(output: &Value, answer: bool) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    if answer {
        serde_json::to_writer(&mut out, &json!({"ok": true, "output": output}))?;
    } else {
        serde_json::to_writer(&mut out, output)?;
    }
    writeln!(out)?;
    Ok(0)
}

/// A failed `durun call`: the `durun:` line on stderr, and with `--json`
/// the error on stdout for the caller to classify. Exits 1.
fn call_failed(tool: &str, code: &str, message: &str, answer: bool) -> i32 {
    say(&format!("call {tool} failed: {code}: {message}"));
    if answer {
        print_error(code, message);
    }
    1
}

/// `--json`'s answer for a failure: `{"ok": false, "error": {…}}`.
fn print_error(code: &str, message: &str) {
    println!(
        "{}",
        json!({"ok": false, "error": {"code": code, "message": message}})
    );
}

pub(crate) fn wait(args: &WaitArgs, settings: &Settings) -> Result<i32> {
    let data = args.data.clone().unwrap_or(Value::Null);
    let Some(mut client) = connect(settings)? else {
        return Err(
            Failure::config(format!("durun wait {} needs a running durun", args.name))
                .hint("run the script with `durun run -- …`; DURUN_SOCKET is not set")
                .into(),
        );
    };
    let answer = client.request(&Outgoing::Wait {
        name: &args.name,
        data: &data,
        // As humantime writes it, the protocol reads it back exactly.
        timeout: args
            .timeout
            .map(|timeout| humantime::format_duration(timeout).to_string()),
    })?;
    if answer.ok {
        return print_output(&answer.output, false);
    }
    say(&format!(
        "wait {} ended: {}",
        args.name,
        answer.error_text()
    ));
    Ok(error_exit(&answer))
}

pub(crate) fn sleep(args: &SleepArgs, settings: &Settings) -> Result<i32> {
    let request = match (&args.duration, &args.until) {
        (Some(duration), _) => Outgoing::Sleep {
            seconds: Some(duration.as_secs_f64()),
            until: None,
        },
        (None, Some(until)) => Outgoing::Sleep {
            seconds: None,
            until: Some(until),
        },
        (None, None) => unreachable!("clap requires one"),
    };
    let Some(mut client) = connect(settings)? else {
        // Outside a run the script works as if durun were not there.
        let duration = match (&args.duration, &args.until) {
            (Some(duration), _) => *duration,
            // Checked by clap already.
            (None, Some(until)) => crate::clock::parse(until)
                .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
                .unwrap_or_default(),
            (None, None) => unreachable!("clap requires one"),
        };
        std::thread::sleep(duration);
        return Ok(0);
    };
    let answer = client.request(&request)?;
    if answer.ok {
        return Ok(0);
    }
    say(&format!("sleep ended: {}", answer.error_text()));
    Ok(error_exit(&answer))
}

/// `durun call` outside a run: the tool from `./durun.toml` (or
/// `DURUN_CONFIG`) runs once with a key of its own, and nothing is
/// journaled.
fn call_standalone(tool: &str, args: Value, answer: bool, settings: &Settings) -> Result<i32> {
    let cwd = std::env::current_dir().context("failed to read the current directory")?;
    let (config, path) = crate::config::Config::discover(settings.config.as_deref(), &cwd)?;
    let Some(found) = config.tools.get(tool) else {
        let place = path.map_or_else(
            || "no durun.toml here".to_owned(),
            |path| format!("{} has no tool `{tool}`", path.display()),
        );
        let message = format!("durun call {tool}: not inside a run, and {place}");
        if answer {
            print_error("not_under_durun", &message);
        }
        return Err(Failure::config(message)
            .hint("run the script with `durun run -- …`, or declare the tool in durun.toml")
            .into());
    };
    if let Err(message) = found.check_args(&args) {
        return Ok(call_failed(tool, "bad_request", &message, answer));
    }
    let canonical = crate::step_key::canonical_json(&args)?;
    // A key of its own: no journal remembers this call.
    let nonce = format!(
        "standalone-{}-{}",
        std::process::id(),
        crate::journal::now_ms()
    );
    let invocation = crate::executor::Invocation {
        tool: found.clone(),
        args,
        task_id: String::new(),
        run: 0,
        step: 0,
        attempt: 1,
        idempotency_key: crate::step_key::idempotency_key(&nonce, 0, &canonical),
        cwd,
        // Outside a run, a command tool inherits the caller's TRACEPARENT.
        traceparent: None,
    };
    let finished = crate::executor::run(&invocation, &crate::executor::Cancel::default());
    match finished.outcome {
        crate::executor::Outcome::Done { output, .. } => print_output(&output, answer),
        crate::executor::Outcome::Failed { code, message, .. } => {
            Ok(call_failed(tool, &code.to_string(), &message, answer))
        }
        crate::executor::Outcome::Cancelled => Ok(exit_code::from_signal(Signal::TERM.as_raw())),
    }
}
