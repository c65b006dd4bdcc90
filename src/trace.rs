//! OpenTelemetry traces (SPEC 15): a span per run, a child span per step,
//! sent as OTLP/HTTP JSON to `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`, or `[otel] endpoint`).
//!
//! # Invariant
//!
//! Export never slows or fails a run: spans go to a thread of their own
//! over a bounded channel and are dropped, counted, when it is full or the
//! collector does not answer; the run's end waits for the last batch at
//! most [`LAST_BATCH`].
//!
//! Written against the OTLP/HTTP JSON encoding rather than with the
//! OpenTelemetry SDK crates: durun makes two kinds of span and has its own
//! HTTP client and thread, and the SDK would bring a runtime, a
//! protobuf stack and their build time for them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::journal::{StepRecord, StepStatus};
use crate::json_text::JsonText;
use crate::report::{Event, Reporter, StderrCopier};

/// How long the run's end waits for its last spans to be sent.
const LAST_BATCH: Duration = Duration::from_millis(500);
/// Spans waiting for the exporter before more are dropped.
const BACKLOG: usize = 4096;
/// Spans a request carries at most.
const BATCH: usize = 256;
/// How long the exporter gathers spans for a request once one came.
const GATHER: Duration = Duration::from_millis(200);

/// Where spans go, from the environment (or durun.toml's `[otel]
/// endpoint`); `None`: no tracing.
pub(crate) fn endpoint(configured: Option<&str>) -> Option<String> {
    let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| {
            var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .or_else(|| configured.map(str::to_owned))
                .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
        })
        .filter(|url| url.starts_with("http://") || url.starts_with("https://"))
}

/// A run's place in a trace: its trace, its own span, and the span it is
/// a child of (from `TRACEPARENT`, when durun was started inside a trace).
#[derive(Clone, Debug)]
pub(crate) struct Context {
    trace_id: String,
    run_span: String,
    parent: Option<String>,
}

impl Context {
    /// A new span for the run, in the trace of `traceparent` if it is one
    /// (W3C Trace Context: `00-TRACE-SPAN-FLAGS`), else in a new trace.
    pub(crate) fn new(traceparent: Option<&str>) -> Self {
        let parsed = traceparent.and_then(|text| {
            let parts: Vec<&str> = text.trim().split('-').collect();
            let hex = |part: &str, len: usize| {
                part.len() == len
                    && part.bytes().all(|byte| byte.is_ascii_hexdigit())
                    && part.bytes().any(|byte| byte != b'0')
            };
            (parts.len() >= 4 && hex(parts[1], 32) && hex(parts[2], 16))
                .then(|| (parts[1].to_ascii_lowercase(), parts[2].to_ascii_lowercase()))
        });
        match parsed {
            Some((trace_id, parent)) => Self {
                trace_id,
                run_span: random_hex(8),
                parent: Some(parent),
            },
            None => Self {
                trace_id: random_hex(16),
                run_span: random_hex(8),
                parent: None,
            },
        }
    }

    /// The run's span as `TRACEPARENT` for the agent.
    pub(crate) fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.run_span)
    }
}

/// The span id of step `step` of the run whose span is `run_span`:
/// derived, not drawn, so that the runner hands a step's tools and
/// proxied requests their parent before the step's span is made (one span
/// per step and run; a step's attempts are inside it).
fn step_span_id(run_span: &str, step: u64) -> String {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(format!("{run_span}/{step}").as_bytes());
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    // All zeros is no span id.
    format!("{:016x}", u64::from_be_bytes(id).max(1))
}

/// Step `step`'s span as a `traceparent`, for the run's `traceparent`.
pub(crate) fn step_traceparent(run: &str, step: u64) -> Option<String> {
    let mut parts = run.split('-');
    let (version, trace_id, run_span) = (parts.next()?, parts.next()?, parts.next()?);
    Some(format!(
        "{version}-{trace_id}-{}-01",
        step_span_id(run_span, step)
    ))
}

fn random_hex(bytes: usize) -> String {
    use std::io::Read as _;
    let mut buffer = vec![0u8; bytes];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut buffer))
        .is_err()
    {
        // Unique enough for a span id where /dev/urandom is missing.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for (i, byte) in buffer.iter_mut().enumerate() {
            *byte = (nanos >> ((i % 16) * 8)) as u8 ^ (std::process::id() as u8);
        }
    }
    buffer.iter().fold(String::new(), |mut hex, byte| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

/// The GenAI attributes of a model call: its model (from the args, or the
/// proxied request's body) and its tokens, in and out.
fn gen_ai(record: &StepRecord) -> Vec<(&'static str, Value)> {
    let Some(usage) = record.usage.as_ref().map(JsonText::value) else {
        return Vec::new();
    };
    let mut attributes = Vec::new();
    let args = record.args.value();
    if let Some(model) = args
        .get("model")
        .or_else(|| args.pointer("/body/model"))
        .and_then(Value::as_str)
    {
        attributes.push(("gen_ai.request.model", json!(model)));
    }
    let count = |names: [&str; 2]| names.iter().find_map(|name| usage.get(*name)?.as_u64());
    if let Some(input) = count(["input_tokens", "prompt_tokens"]) {
        attributes.push(("gen_ai.usage.input_tokens", json!(input)));
    }
    if let Some(output) = count(["output_tokens", "completion_tokens"]) {
        attributes.push(("gen_ai.usage.output_tokens", json!(output)));
    }
    attributes
}

fn nanos(time: SystemTime) -> String {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        .to_string()
}

fn attribute(key: &str, value: Value) -> Value {
    let value = match value {
        Value::Bool(flag) => json!({"boolValue": flag}),
        Value::Number(number) if number.is_u64() || number.is_i64() => {
            json!({"intValue": number.to_string()})
        }
        Value::String(text) => json!({"stringValue": text}),
        other => json!({"stringValue": other.to_string()}),
    };
    json!({"key": key, "value": value})
}

/// A finished span, as the loop hands it to the exporter: turned into
/// OTLP's JSON there, off the loop's thread.
struct Span {
    name: String,
    id: String,
    parent: Option<String>,
    times: (SystemTime, SystemTime),
    attributes: Vec<(&'static str, Value)>,
    error: Option<String>,
}

impl Span {
    fn to_json(&self, trace_id: &str) -> Value {
        let mut span = json!({
            "traceId": trace_id,
            "spanId": self.id,
            "name": self.name,
            "kind": 1,
            "startTimeUnixNano": nanos(self.times.0),
            "endTimeUnixNano": nanos(self.times.1),
            "attributes": self
                .attributes
                .iter()
                .map(|(key, value)| attribute(key, value.clone()))
                .collect::<Vec<_>>(),
        });
        if let Some(parent) = &self.parent {
            span["parentSpanId"] = json!(parent);
        }
        if let Some(message) = &self.error {
            span["status"] = json!({"code": 2, "message": message});
        }
        span
    }
}

/// What a step's span is made of.
struct StepSpan<'a> {
    step: u64,
    name: &'a str,
    times: (SystemTime, SystemTime),
    attempt: u32,
    replayed: bool,
    /// How it ended, its tokens, and its failure; `None` for a replay.
    status: Option<(StepStatus, u64, Option<&'a str>)>,
    record: Option<&'a StepRecord>,
}

/// A reporter that passes every event on and makes spans of them.
pub(crate) struct Tracer {
    inner: Box<dyn Reporter>,
    context: Context,
    task: String,
    run: u32,
    started: SystemTime,
    /// Steps started and not finished: when, and their attempt.
    open: HashMap<u64, (SystemTime, u32)>,
    spans: Option<mpsc::SyncSender<Span>>,
    exporter: Option<std::thread::JoinHandle<()>>,
    /// Where spans go, for the line that says how many did not.
    endpoint: String,
    /// Spans made, sent or not.
    made: u64,
    /// Spans the collector took, counted by the exporter.
    delivered: Arc<AtomicU64>,
}

impl Tracer {
    pub(crate) fn new(inner: Box<dyn Reporter>, endpoint: String, context: Context) -> Self {
        let (spans, batches) = mpsc::sync_channel(BACKLOG);
        let trace_id = context.trace_id.clone();
        let delivered = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&delivered);
        let to = endpoint.clone();
        let exporter = std::thread::Builder::new()
            .name("durun-otlp".into())
            .spawn(move || export(&to, &trace_id, &batches, &counted))
            .ok();
        Self {
            inner,
            context,
            task: String::new(),
            run: 0,
            started: SystemTime::now(),
            open: HashMap::new(),
            spans: Some(spans),
            exporter,
            endpoint,
            made: 0,
            delivered,
        }
    }

    fn span(
        name: String,
        span_id: String,
        parent: Option<String>,
        times: (SystemTime, SystemTime),
        attributes: Vec<(&'static str, Value)>,
        error: Option<&str>,
    ) -> Span {
        Span {
            name,
            id: span_id,
            parent,
            times,
            attributes,
            error: error.map(str::to_owned),
        }
    }

    /// Hands a span to the exporter; one that finds its queue full is
    /// dropped, and counted with the rest not sent.
    fn send(&mut self, span: Span) {
        self.made += 1;
        if let Some(spans) = &self.spans {
            let _ = spans.try_send(span);
        }
    }

    fn step_span(&mut self, step: &StepSpan<'_>) {
        let name = step.name;
        let mut attributes = vec![
            ("durun.task", json!(self.task)),
            ("durun.step", json!(step.step)),
            ("durun.step.name", json!(name)),
            ("durun.replayed", json!(step.replayed)),
            ("durun.attempt", json!(step.attempt)),
        ];
        if let Some(record) = step.record {
            attributes.push(("durun.effect", json!(record.effect.as_str())));
            attributes.extend(gen_ai(record));
            if let Some(nanos) = record.cost_nanos {
                attributes.push(("durun.cost_usd", json!(crate::prices::usd(nanos))));
            }
        }
        let mut error = None;
        if let Some((status, tokens, failure)) = step.status {
            attributes.push(("durun.status", json!(status.as_str())));
            if tokens > 0 {
                attributes.push(("durun.tokens", json!(tokens)));
            }
            error = failure;
        }
        let times = step.times;
        let id = step_span_id(&self.context.run_span, step.step);
        let span = Self::span(
            format!("step {name}"),
            id,
            Some(self.context.run_span.clone()),
            times,
            attributes,
            error,
        );
        self.send(span);
    }

    /// Ends the export: the last batch goes, or is given up on; the spans
    /// the collector did not take (dropped, refused, or still on their way
    /// when the run ends) are said once (SPEC 17).
    fn finish(&mut self) {
        drop(self.spans.take());
        let Some(exporter) = self.exporter.take() else {
            return;
        };
        let deadline = std::time::Instant::now() + LAST_BATCH;
        while !exporter.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if exporter.is_finished() {
            let _ = exporter.join();
        }
        // Still sending: left to the process's end, and not counted sent.
        let unsent = self
            .made
            .saturating_sub(self.delivered.load(Ordering::SeqCst));
        if unsent > 0 {
            // After the run's last line, in SPEC 17's words.
            crate::report::say(&format!(
                "{unsent} span{} not sent to {}",
                if unsent == 1 { "" } else { "s" },
                self.endpoint
            ));
        }
    }
}

impl Reporter for Tracer {
    fn report(&mut self, event: &Event<'_>) {
        let now = SystemTime::now();
        match event {
            Event::RunStarted { task, run, .. } => {
                (*task).clone_into(&mut self.task);
                self.run = *run;
                self.started = now;
            }
            Event::StepStarted { step, attempt, .. } => {
                self.open.insert(*step, (now, *attempt));
            }
            Event::StepReplayed { step, name } => {
                self.step_span(&StepSpan {
                    step: *step,
                    name,
                    times: (now, now),
                    attempt: 1,
                    replayed: true,
                    status: None,
                    record: None,
                });
            }
            Event::StepFinished {
                step,
                name,
                status,
                elapsed,
                tokens,
                error,
                record,
            } => {
                let (started, attempt) = self
                    .open
                    .remove(step)
                    .unwrap_or((now.checked_sub(*elapsed).unwrap_or(now), 1));
                let failure = (*status == StepStatus::Failed).then_some(error.unwrap_or("failed"));
                self.step_span(&StepSpan {
                    step: *step,
                    name,
                    times: (started, now),
                    attempt,
                    replayed: false,
                    status: Some((*status, *tokens, failure)),
                    record: Some(record),
                });
            }
            Event::RunFinished {
                status,
                exit_code,
                stats,
                ..
            } => {
                let attributes = vec![
                    ("durun.task", json!(self.task)),
                    ("durun.run", json!(self.run)),
                    ("durun.status", json!(status.as_str())),
                    ("durun.exit_code", json!(exit_code)),
                    ("durun.replayed_steps", json!(stats.replayed_steps)),
                    ("durun.executed_steps", json!(stats.executed_steps)),
                    ("durun.tokens_saved", json!(stats.tokens_saved)),
                    (
                        "durun.cost_usd",
                        json!(crate::prices::usd(stats.cost.spent_nanos)),
                    ),
                    (
                        "durun.cost_saved_usd",
                        json!(crate::prices::usd(stats.cost.saved_nanos)),
                    ),
                ];
                let failed = (*exit_code != 0).then(|| format!("exit {exit_code}"));
                let span = Self::span(
                    format!("durun run {}", self.task),
                    self.context.run_span.clone(),
                    self.context.parent.clone(),
                    (self.started, now),
                    attributes,
                    failed.as_deref(),
                );
                self.send(span);
                self.inner.report(event);
                self.finish();
                return;
            }
            Event::Warning(_) | Event::Hint(_) => {}
        }
        self.inner.report(event);
    }

    fn stderr_copier(&self) -> Option<StderrCopier> {
        self.inner.stderr_copier()
    }
}

/// The exporter's thread: batches of spans to `endpoint` until the channel
/// closes, counting in `delivered` those the collector took.
fn export(endpoint: &str, trace_id: &str, spans: &mpsc::Receiver<Span>, delivered: &AtomicU64) {
    let client = crate::web::client();
    let mut batch = Vec::new();
    // After a failed send, spans are dropped unsent for a while: a
    // collector that is away costs a connection attempt per five seconds,
    // not one per batch.
    let mut resting_until: Option<std::time::Instant> = None;
    loop {
        let mut closed = match spans.recv_timeout(Duration::from_millis(200)) {
            Ok(span) => {
                batch.push(span);
                false
            }
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            Err(mpsc::RecvTimeoutError::Disconnected) => true,
        };
        // A request per batch, not per step: gather for a while (the
        // run's end, which closes the channel, sends at once).
        let deadline = std::time::Instant::now() + GATHER;
        while !closed && !batch.is_empty() && batch.len() < BATCH {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match spans.recv_timeout(left) {
                Ok(span) => batch.push(span),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => closed = true,
            }
        }
        if resting_until.is_some_and(|until| std::time::Instant::now() < until) {
            batch.clear();
        }
        if !batch.is_empty() {
            let body = json!({"resourceSpans": [{
                "resource": {"attributes": [attribute("service.name", json!("durun"))]},
                "scopeSpans": [{
                    "scope": {"name": "durun", "version": env!("CARGO_PKG_VERSION")},
                    "spans": batch.drain(..).map(|span| span.to_json(trace_id)).collect::<Vec<_>>(),
                }],
            }]});
            let count = body["resourceSpans"][0]["scopeSpans"][0]["spans"]
                .as_array()
                .map_or(0, Vec::len) as u64;
            let sent = client.as_ref().is_ok_and(|client| {
                client
                    .post(endpoint)
                    .timeout(Duration::from_secs(2))
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .is_ok_and(|answer| answer.status().is_success())
            });
            if sent {
                delivered.fetch_add(count, Ordering::SeqCst);
            } else {
                resting_until = Some(std::time::Instant::now() + Duration::from_secs(5));
            }
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_joins_the_trace_it_was_started_in() {
        let context = Context::new(Some(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ));
        assert_eq!(context.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.parent.as_deref(), Some("00f067aa0ba902b7"));
        let traceparent = context.traceparent();
        assert!(traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert_ne!(&traceparent[36..52], "00f067aa0ba902b7");
        // Anything else starts a trace of its own.
        for bad in [
            "",
            "junk",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            let context = Context::new(Some(bad));
            assert!(context.parent.is_none(), "{bad}");
            assert_eq!(context.trace_id.len(), 32);
        }
    }
}
