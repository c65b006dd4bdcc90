//! One attempt of an HTTP tool, through durun's HTTP client ([`crate::web`]).
//!
//! The args are the JSON body (none for GET and DELETE), the step's key
//! the `Idempotency-Key` header. Headers take `${VAR}` from the environment
//! at each call; their values are never journaled. A connection error,
//! 429 or 5xx may be retried (honouring `Retry-After`); another 4xx not.

use std::io::Read as _;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Cancel, Invocation, Outcome};
use crate::config::{HttpSpec, Secrets, expand_env_noting};
use crate::protocol::ErrorCode;

/// The most body an answer may have; more fails the step.
const BODY_LIMIT: u64 = 32 * 1024 * 1024;
/// How long an attempt may take when the tool sets no `timeout`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

pub(super) fn run_once(
    invocation: &Invocation,
    spec: &HttpSpec,
    attempt: u32,
    cancel: &Cancel,
) -> Outcome {
    let mut secrets = Secrets::default();
    let mut outcome = call(invocation, spec, attempt, cancel, &mut secrets);
    // Whatever came back (an error that quotes the URL or a header, a
    // body that echoes a token) goes on with the values as `${VAR}`.
    match &mut outcome {
        Outcome::Done { output, usage } => {
            secrets.redact_value(output);
            if let Some(usage) = usage {
                secrets.redact_value(usage);
            }
        }
        Outcome::Failed {
            message, output, ..
        } => {
            *message = secrets.redact(message);
            if let Some(output) = output {
                secrets.redact_value(output);
            }
        }
        Outcome::Cancelled => {}
    }
    outcome
}

fn call(
    invocation: &Invocation,
    spec: &HttpSpec,
    attempt: u32,
    cancel: &Cancel,
    secrets: &mut Secrets,
) -> Outcome {
    let tool = &invocation.tool;
    // Messages name the URL with its `${VAR}`s unexpanded.
    let shown_url = tool
        .expand(&spec.url, &invocation.args)
        .unwrap_or_else(|_| spec.url.clone());
    let url = match tool
        .expand(&spec.url, &invocation.args)
        .and_then(|url| expand_env_noting(&url, secrets))
    {
        Ok(url) => url,
        Err(message) => {
            return failed(
                ErrorCode::ToolFailed,
                format!("url of `{}`: {message}", tool.name),
                None,
                false,
                None,
            );
        }
    };
    let timeout = tool.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let client = match crate::web::client() {
        Ok(client) => client,
        Err(message) => return failed(ErrorCode::ToolFailed, message, None, true, None),
    };
    let Ok(method) = reqwest::Method::from_bytes(spec.method.as_bytes()) else {
        let message = format!("`{}` has no HTTP method {}", tool.name, spec.method);
        return failed(ErrorCode::ToolFailed, message, None, false, None);
    };
    // Every status is an answer to read (a 429's Retry-After, a 4xx's
    // body), not an error.
    let mut request = client
        .request(method, &url)
        .timeout(timeout)
        .header("Idempotency-Key", &invocation.idempotency_key)
        .header("Durun-Task", &invocation.task_id)
        .header("Durun-Step", invocation.step.to_string())
        .header("Durun-Attempt", attempt.to_string());
    if let Some(traceparent) = &invocation.traceparent {
        request = request.header("traceparent", traceparent);
    }
    request = match with_headers(request, spec, &tool.name, secrets) {
        Ok(request) => request,
        Err(message) => return failed(ErrorCode::ToolFailed, message, None, false, None),
    };
    if cancel.is_cancelled() {
        return Outcome::Cancelled;
    }
    if !matches!(spec.method.as_str(), "GET" | "DELETE") {
        request = request
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&invocation.args).expect("JSON serializes"));
    }
    let request = match request.build() {
        Ok(request) => request,
        Err(err) => {
            // The message may quote a header's value: redacted by the caller.
            let message = format!(
                "`{}` cannot send its request: {}",
                tool.name,
                crate::web::reason(&err)
            );
            return failed(ErrorCode::ToolFailed, message, None, false, None);
        }
    };
    match client.execute(request) {
        Ok(response) => answered(&tool.name, tool.output, response),
        Err(err) => {
            let code = if err.is_timeout() {
                ErrorCode::Timeout
            } else {
                ErrorCode::ToolFailed
            };
            failed(
                code,
                format!(
                    "`{}` could not reach {shown_url}: {}",
                    tool.name,
                    crate::web::reason(&err)
                ),
                None,
                true,
                None,
            )
        }
    }
}

/// `request` with the tool's configured headers, their `${VAR}`s expanded
/// (the variables' values noted as secrets to redact).
fn with_headers(
    mut request: reqwest::blocking::RequestBuilder,
    spec: &HttpSpec,
    tool: &str,
    secrets: &mut Secrets,
) -> Result<reqwest::blocking::RequestBuilder, String> {
    for (name, value) in &spec.headers {
        let mut used = Secrets::default();
        match expand_env_noting(value, &mut used) {
            Ok(value) if value.contains(['\r', '\n']) => {
                // Named by its variables, never by its value.
                let message = format!(
                    "header {name} of `{}` would hold a line break (from {}); fix the variable's value",
                    tool,
                    used.names()
                        .iter()
                        .map(|var| format!("${{{var}}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                return Err(message);
            }
            Ok(expanded) => {
                request = request.header(name.as_str(), expanded);
                secrets.extend(used);
            }
            Err(message) => return Err(format!("header {name} of `{tool}`: {message}")),
        }
    }
    Ok(request)
}

/// What an answer of the tool's endpoint makes of the step: its output
/// (below 400), or a failure that a 429 or a 5xx leaves retryable.
fn answered(
    tool: &str,
    output: crate::config::OutputMode,
    response: reqwest::blocking::Response,
) -> Outcome {
    let status = response.status().as_u16();
    match status {
        ok if ok < 400 => {
            let (body, too_big) = read_body(response);
            if too_big {
                let message = format!("`{}` answered more than {} MiB", tool, BODY_LIMIT >> 20);
                return failed(ErrorCode::ToolFailed, message, None, false, None);
            }
            match super::read_output(output, body) {
                Ok((output, usage)) => Outcome::Done { output, usage },
                Err((body, err)) => failed(
                    ErrorCode::ToolFailed,
                    format!("`{tool}` answered HTTP {status} with invalid JSON ({err})"),
                    Some(json!({"status": status, "body": body})),
                    false,
                    None,
                ),
            }
        }
        _ => {
            let retry_after = response
                .headers()
                .get("Retry-After")
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let (body, _) = read_body(response);
            let tail: String = body
                .chars()
                .rev()
                .take(500)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            failed(
                ErrorCode::ToolFailed,
                format!("HTTP {status}: {}", tail.trim()),
                Some(json!({"status": status, "body": body})),
                status == 429 || status >= 500,
                retry_after,
            )
        }
    }
}

fn read_body(response: reqwest::blocking::Response) -> (String, bool) {
    let mut bytes = Vec::new();
    let mut reader = response.take(BODY_LIMIT + 1);
    let _ = reader.read_to_end(&mut bytes);
    let too_big = bytes.len() as u64 > BODY_LIMIT;
    (String::from_utf8_lossy(&bytes).into_owned(), too_big)
}

fn failed(
    code: ErrorCode,
    message: String,
    output: Option<Value>,
    retryable: bool,
    retry_after: Option<Duration>,
) -> Outcome {
    Outcome::Failed {
        code,
        message,
        output,
        retryable,
        retry_after,
    }
}
