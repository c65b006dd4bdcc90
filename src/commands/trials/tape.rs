//! The recorder of `durun test`: the model routes' upstream for every run
//! the test makes. In the reference run it forwards each model call to the
//! real upstream and keeps the answer; in the trials it answers from what
//! it kept, by content, so trials spend no tokens, and counts every call
//! each trial made, which is how a model call sent again is found.
//!
//! # Invariant
//!
//! A trial never reaches a real model: a call the reference did not make
//! is answered 400 and kept as a miss, with its difference from the
//! nearest call that was made.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::cli::FaultKind;
use crate::config::{MODEL_ROUTES, ProxyConfig};
use crate::proxy::{Answer, Body, Routes, accept, error, recorded, request_args};

/// What a call is matched by: its name (`ROUTE METHOD PATH`) and the hash
/// of its args, as the proxy journals them.
pub(crate) type Content = (String, String);

/// What one trial asked of the recorder.
#[derive(Clone, Debug, Default)]
pub(crate) struct Calls {
    /// Every model call that reached the recorder, faults included.
    pub(crate) requests: u64,
    /// Calls the reference never made: a line each, with the difference.
    pub(crate) misses: Vec<String>,
    /// The calls answered from the recording, by content (not the faults
    /// made, nor the misses).
    pub(crate) seen: HashMap<Content, u64>,
    /// Every call that reached the recorder, by content, held and faulted
    /// ones too.
    pub(crate) received: HashMap<Content, u64>,
    asked: HashMap<Content, usize>,
    faulted: Vec<Content>,
}

#[derive(Default)]
struct State {
    recording: bool,
    kept: HashMap<Content, Vec<Answer>>,
    /// Every call's args as the reference made them, by name: for the
    /// difference of a miss.
    made: HashMap<String, Vec<Value>>,
    calls: HashMap<String, Calls>,
    faults: HashMap<Content, FaultKind>,
    /// A `during` trial's model call, by the trial: held the first time
    /// it comes, so that durun is killed while it is in flight (SPEC 18).
    held: HashMap<String, Content>,
}

struct Shared {
    /// The real model routes, as durun would reach them.
    routes: Routes,
    ignore: Vec<String>,
    secret_query: Vec<String>,
    state: Mutex<State>,
    client: reqwest::Client,
    /// How long a `timeout` fault holds a call.
    hold: Duration,
}

pub(crate) struct Tape {
    port: u16,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Tape {
    /// Starts recording on a free port of 127.0.0.1.
    pub(crate) fn start(config: &ProxyConfig, hold: Duration) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(io::Error::other)?;
        let shared = Arc::new(Shared {
            routes: Routes::new(config, |name| {
                (name != crate::proxy::TAPE)
                    .then(|| std::env::var(name).ok())
                    .flatten()
            }),
            ignore: config.ignore.clone(),
            secret_query: crate::proxy::secret_query(config),
            state: Mutex::new(State {
                recording: true,
                ..State::default()
            }),
            client,
            hold,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("durun-test-tape".into())
            .spawn(move || {
                runtime.block_on(accept(listener, serving, stopped, |request, shared| {
                    Box::pin(handle(request, shared))
                }));
                runtime.shutdown_background();
            })?;
        Ok(Self {
            port,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The base URL a run's model calls go to, counted as `run`'s.
    pub(crate) fn url(&self, run: &str) -> String {
        format!("http://127.0.0.1:{}/{run}", self.port)
    }

    /// From now on calls are answered from the recording.
    pub(crate) fn replay(&self, faults: HashMap<Content, FaultKind>) {
        let mut state = self.shared.state.lock().expect("tape lock");
        state.recording = false;
        state.faults = faults;
    }

    /// Holds the trial `run`'s first call with `content` (its `during`
    /// step's model call) until durun is gone.
    pub(crate) fn hold_during(&self, run: &str, content: Content) {
        let mut state = self.shared.state.lock().expect("tape lock");
        state.held.insert(run.to_owned(), content);
    }

    /// Whether the reference made a call with this content.
    pub(crate) fn has(&self, content: &Content) -> bool {
        let state = self.shared.state.lock().expect("tape lock");
        state.kept.contains_key(content)
    }

    /// What `run` asked so far.
    pub(crate) fn calls(&self, run: &str) -> Calls {
        let state = self.shared.state.lock().expect("tape lock");
        state.calls.get(run).cloned().unwrap_or_default()
    }
}

impl Drop for Tape {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `Err` closes the connection without an answer (a `reset` fault).
async fn handle(request: Request<Incoming>, shared: Arc<Shared>) -> io::Result<Response<Body>> {
    let path = request.uri().path().to_owned();
    let mut segments = path.trim_start_matches('/').splitn(3, '/');
    let run = segments.next().unwrap_or_default().to_owned();
    let route = segments.next().unwrap_or_default().to_owned();
    let rest = segments
        .next()
        .map(|rest| format!("/{rest}"))
        .unwrap_or_default();
    let Some(upstream) = MODEL_ROUTES
        .contains(&route.as_str())
        .then(|| shared.routes.get(&route))
        .flatten()
    else {
        return Ok(error(StatusCode::NOT_FOUND, "not_found", "not found"));
    };
    let query = request.uri().query().unwrap_or_default().to_owned();
    let url = format!(
        "{}{rest}{}{query}",
        upstream.upstream,
        if query.is_empty() { "" } else { "?" }
    );
    let method = request.method().clone();
    let name = format!("{route} {method} {rest}");
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                err.to_string(),
            ));
        }
    };
    let args = request_args(&body, &query, &shared.ignore, &shared.secret_query);
    let Ok(canonical) = crate::step_key::canonical_json(&args) else {
        return Ok(error(StatusCode::BAD_REQUEST, "bad_request", "args"));
    };
    let content = (name.clone(), crate::step_key::args_hash(&canonical));

    let asked = Asked {
        run,
        name,
        args,
        content,
    };
    let recording = shared.state.lock().expect("tape lock").recording;
    if recording {
        let forward = Forward {
            method,
            url: &url,
            headers: &parts.headers,
            body,
            route: &route,
        };
        return record(&shared, forward, asked).await;
    }
    let (answer, fault) = shared.state.lock().expect("tape lock").answer(&asked);
    let name = asked.name;
    let Some(answer) = answer else {
        return Ok(error(
            StatusCode::BAD_REQUEST,
            "durun_test_unrecorded",
            format!(
                "durun test: the reference run made no model call `{name}` with these args; \
                 a trial answers only the calls the reference made"
            ),
        ));
    };
    faulty(answer, fault, shared.hold).await
}

fn head_value(value: Option<&str>) -> Option<HeaderValue> {
    value.and_then(|value| HeaderValue::from_str(value).ok())
}

/// A model call as the recorder keys it.
struct Asked {
    run: String,
    name: String,
    args: Value,
    content: Content,
}

/// A call to pass on to the real upstream while recording.
struct Forward<'a> {
    method: hyper::Method,
    url: &'a str,
    headers: &'a hyper::HeaderMap,
    body: Bytes,
    route: &'a str,
}

/// Passes a call of the reference run on to the upstream and keeps its
/// answer.
async fn record(shared: &Shared, forward: Forward<'_>, asked: Asked) -> io::Result<Response<Body>> {
    let mut upstream = shared
        .client
        .request(forward.method, forward.url)
        .body(forward.body);
    for (header_name, value) in forward.headers {
        if !matches!(
            header_name.as_str(),
            "host" | "connection" | "content-length" | "transfer-encoding" | "accept-encoding"
        ) {
            upstream = upstream.header(header_name, value);
        }
    }
    let answer = match upstream.send().await {
        Ok(answer) => answer,
        Err(err) => {
            return Ok(error(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                format!(
                    "durun test could not reach {}'s upstream: {err}",
                    forward.route
                ),
            ));
        }
    };
    let status = answer.status().as_u16();
    let content_type = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let Ok(bytes) = answer.bytes().await else {
        return Err(io::Error::other("the upstream's answer was cut off"));
    };
    let answer = Answer {
        status,
        content_type,
        body: bytes,
    };
    if (200..300).contains(&status) {
        let mut state = shared.state.lock().expect("tape lock");
        state
            .kept
            .entry(asked.content.clone())
            .or_default()
            .push(answer.clone());
        state.made.entry(asked.name).or_default().push(asked.args);
        let calls = state.calls.entry(asked.run).or_default();
        calls.requests += 1;
        *calls.seen.entry(asked.content).or_default() += 1;
    }
    Ok(recorded(&answer))
}

impl State {
    /// A trial's answer to `asked`, as the reference got it, and the fault
    /// to make of it the first time, if any.
    fn answer(&mut self, asked: &Asked) -> (Option<Answer>, Option<FaultKind>) {
        let held = self.held.get(&asked.run) == Some(&asked.content);
        let fault = if held {
            Some(FaultKind::Timeout)
        } else {
            self.faults.get(&asked.content).copied()
        };
        let State {
            kept, made, calls, ..
        } = self;
        let calls = calls.entry(asked.run.clone()).or_default();
        calls.requests += 1;
        *calls.received.entry(asked.content.clone()).or_default() += 1;
        let fault = fault.filter(|_| {
            let first = !calls.faulted.contains(&asked.content);
            if first {
                calls.faulted.push(asked.content.clone());
            }
            first
        });
        let answer = kept.get(&asked.content).map(|answers| {
            let times = calls.asked.entry(asked.content.clone()).or_default();
            let answer = answers[(*times).min(answers.len() - 1)].clone();
            if fault.is_none() {
                *times += 1;
                *calls.seen.entry(asked.content.clone()).or_default() += 1;
            }
            answer
        });
        if answer.is_none() {
            calls
                .misses
                .push(miss(&asked.name, &asked.args, made.get(&asked.name)));
        }
        (answer, fault)
    }
}

/// The answer, or the fault made of it.
async fn faulty(
    answer: Answer,
    fault: Option<FaultKind>,
    hold: std::time::Duration,
) -> io::Result<Response<Body>> {
    match fault {
        None => Ok(recorded(&answer)),
        Some(FaultKind::Http429) => {
            let mut response = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "durun test: a 429 made on purpose (--fault)",
            );
            response
                .headers_mut()
                .insert("retry-after-ms", HeaderValue::from_static("10"));
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("0"));
            Ok(response)
        }
        Some(FaultKind::Http500) => Ok(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "durun test: a 500 made on purpose (--fault)",
        )),
        Some(FaultKind::Timeout) => {
            tokio::time::sleep(hold).await;
            Err(io::Error::other("held until the trial's time was up"))
        }
        Some(FaultKind::Reset) => Err(io::Error::other("reset on purpose (--fault)")),
        Some(FaultKind::Truncate) => {
            let half = answer.body.slice(..answer.body.len() / 2);
            let frames = futures_util::stream::iter([
                Ok(Frame::data(half)),
                Err(io::Error::other("cut off on purpose (--fault)")),
            ]);
            let mut response = Response::new(StreamBody::new(frames).boxed());
            if let Some(content_type) = head_value(answer.content_type.as_deref()) {
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, content_type);
            }
            // The whole length announced, half of it sent.
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, answer.body.len().into());
            Ok(response)
        }
    }
}

/// A call the reference never made, with its difference from the nearest
/// one of the same name that it did make.
fn miss(name: &str, args: &Value, made: Option<&Vec<Value>>) -> String {
    let nearest = made.and_then(|made| {
        made.iter()
            .map(|recorded| (crate::diff::request_diff(recorded, args), recorded))
            .min_by_key(|(diff, _)| diff.len())
    });
    match nearest {
        Some((diff, recorded)) => {
            let mut said = format!(
                "model call `{name}` not made by the reference; nearest it made:\n    {}",
                diff.join("\n    ")
            );
            // As a resume says it: what `[proxy] ignore` replays it with.
            if let Some(hint) = crate::diff::ignore_hint(recorded, args) {
                let _ = write!(said, "\n    {hint}");
            }
            said
        }
        None => format!("model call `{name}`: the reference made none of this name"),
    }
}
