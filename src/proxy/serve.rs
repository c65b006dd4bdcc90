//! The proxy's server: takes a request from the agent, asks the loop what
//! it is, and answers it from the journal or forwards it upstream
//! (`exchange.rs`).
//!
//! # Invariant
//!
//! A forwarded request is served by a task of its own, so an agent that
//! goes away mid-answer does not stop the answer from being read to its
//! end and recorded: the call is paid for, and a retry gets it from the
//! journal.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::sync::oneshot;

use super::exchange::{Clients, Forward, exchange};
use super::http::{Body, accept, error, full, is_secret};
use super::probe::{probed, reconciled};
use super::recording::{self, Answer};
use super::routes::{Routes, Unresolved};
use super::{Answers, Ask, Inbox, Taken, ToLoop, Verdict};

/// The largest request body the proxy takes (the protocol's line limit).
const MAX_BODY: usize = crate::protocol::MAX_LINE;
/// How much of a body past [`MAX_BODY`] is read (and dropped) before the
/// 413, and for how long at most.
const DRAIN_MAX: usize = 256 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

pub(super) struct Shared {
    secret: String,
    routes: Arc<Routes>,
    inbox: Inbox,
    clients: Clients,
    answers: Arc<dyn Answers>,
}

impl Shared {
    pub(super) fn new(
        secret: String,
        routes: Arc<Routes>,
        inbox: Inbox,
        answers: Arc<dyn Answers>,
    ) -> Self {
        Self {
            secret,
            routes,
            inbox,
            clients: Clients::new(),
            answers,
        }
    }
}

/// Serves `listener` on a thread of its own until `stopped` fires.
pub(super) fn spawn(
    listener: std::net::TcpListener,
    shared: Shared,
    stopped: oneshot::Receiver<()>,
) -> io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let shared = Arc::new(shared);
    std::thread::Builder::new()
        .name("durun-proxy".into())
        .spawn(move || {
            runtime.block_on(accept(listener, shared, stopped, |request, shared| {
                Box::pin(async move { Ok(handle(request, shared).await) })
            }));
            // In-flight exchanges end with the runtime.
            runtime.shutdown_background();
        })
}

/// The request's body, or the answer that refuses it: 413 past
/// [`MAX_BODY`]. The rest of a body past the limit is read and dropped
/// (up to [`DRAIN_MAX`] bytes, for up to [`DRAIN_TIME`]) before the 413:
/// closing the connection on a client still sending resets it, and the
/// client sees a broken connection instead of the answer.
async fn read_body(mut body: Incoming) -> Result<Bytes, Response<Body>> {
    let unreadable = |err: hyper::Error| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("the request body could not be read: {err}"),
        )
    };
    // One allocation when the client said the length.
    let said = hyper::body::Body::size_hint(&body).lower();
    let mut kept = Vec::with_capacity(usize::try_from(said).map_or(0, |said| said.min(MAX_BODY)));
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(unreadable)?.into_data() else {
            continue;
        };
        if kept.len() + data.len() > MAX_BODY {
            let _ = tokio::time::timeout(DRAIN_TIME, async {
                let mut dropped = 0;
                while let Some(Ok(frame)) = body.frame().await {
                    dropped += frame.data_ref().map_or(0, Bytes::len);
                    if dropped > DRAIN_MAX {
                        break;
                    }
                }
            })
            .await;
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                format!(
                    "the request body is over durun's {} MiB limit",
                    MAX_BODY >> 20
                ),
            ));
        }
        kept.extend_from_slice(&data);
    }
    Ok(Bytes::from(kept))
}

/// The model a request names: in its body, or (Gemini) in its path.
fn model_of(args: &serde_json::Value, path: &str) -> Option<String> {
    args["body"]["model"]
        .as_str()
        .or_else(|| {
            let after = path.split("/models/").nth(1)?;
            after.split([':', '/']).next()
        })
        .map(str::to_owned)
}

async fn handle(request: Request<Incoming>, shared: Arc<Shared>) -> Response<Body> {
    let (route_name, route, path) = match target(request.uri().path(), &shared) {
        Ok(target) => target,
        Err(refused) => return *refused,
    };
    let method = request.method().clone();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let effect = route.effect(method.as_str(), &path);
    let (parts, body) = request.into_parts();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let name = format!("{route_name} {method} {path}");
    let request_hash = match known(&shared, (&name, &query), (&route_name, &path), &body) {
        Seen::Answered(answer) => return answer,
        Seen::Ask(request_hash) => request_hash,
    };
    let args = super::request::request_args(
        &body,
        &query,
        &shared.routes.ignore,
        &shared.routes.secret_query,
    );
    // Journaled as the agent sent it; sent asking for usage if it did not.
    let asked = super::usage::asked(&route_name, &path, &body, &args["body"]);
    let hide_usage = asked.is_some();
    let model = model_of(&args, &path);
    let canonical = match crate::step_key::canonical_json(&args) {
        Ok(canonical) => canonical,
        Err(err) => return error(StatusCode::BAD_REQUEST, "bad_request", err.to_string()),
    };
    let (reply, verdict) = oneshot::channel();
    let wants = model
        .as_deref()
        .map(|model| crate::usage::Asked::of(model, &args["body"]));
    let tokens = wants.as_ref().map_or(0, crate::usage::Asked::rate_tokens);
    let ask = Ask {
        name,
        effect,
        args,
        canonical,
        request_hash,
        asked: wants,
        reply,
    };
    if !(shared.inbox)(ToLoop::Ask(ask)) {
        return ended();
    }
    let Ok(verdict) = verdict.await else {
        return ended();
    };
    match verdict {
        Verdict::Replay(output) => replay(&output, || hide_usage),
        Verdict::Refuse {
            status,
            kind,
            message,
        } => refused(status, kind, message),
        Verdict::Forward {
            flight,
            key,
            own,
            traceparent,
            tap,
            in_doubt,
        } => {
            if in_doubt
                && let Some(settled) = settled(
                    &shared,
                    (&route_name, route),
                    key.as_deref(),
                    (flight, own),
                    &parts.headers,
                )
                .await
            {
                return settled;
            }
            let forward = Forward {
                traceparent,
                tap,
                tokens,
                route: route_name,
                method,
                url: upstream_url(route, &path, &query),
                headers: parts.headers,
                body: asked.unwrap_or(body),
                hide_usage,
                key,
                model,
                flight,
                own,
            };
            forwarded(&shared, forward).await
        }
    }
}

/// Where `route` forwards a request for `path` with `query`.
fn upstream_url(route: &super::routes::Route, path: &str, query: &str) -> String {
    let mark = if query.is_empty() { "" } else { "?" };
    format!("{}{path}{mark}{query}", route.upstream)
}

/// What [`known`] made of a request.
enum Seen {
    /// Replayed by its bytes, or refused.
    Answered(Response<Body>),
    /// To ask the loop with its args; its `request_hash`.
    Ask(String),
}

/// A request byte-identical to one the journal answered ([`Answers`]):
/// replayed without being parsed, or refused as any request is while the
/// run stops. Any other, and one this run had every recorded answer to
/// already, is asked with its args.
fn known(
    shared: &Shared,
    (name, query): (&str, &str),
    (route, path): (&str, &str),
    body: &[u8],
) -> Seen {
    let routes = &shared.routes;
    let request_hash =
        super::request::request_hash(name, query, body, &routes.ignore, &routes.secret_query);
    match shared.answers.take(&request_hash) {
        // Hidden as when it was recorded: the same bytes asked the same.
        Taken::Output(output) => Seen::Answered(replay(&output, || {
            super::usage::would_ask(route, path, body)
        })),
        Taken::Ask => Seen::Ask(request_hash),
        Taken::Stopping => Seen::Answered(stopping()),
        Taken::Ended => Seen::Answered(ended()),
    }
}

/// The answer to any request while the run stops.
fn stopping() -> Response<Body> {
    // The loop's refusal, the one place it is written.
    let Verdict::Refuse {
        status,
        kind,
        message,
    } = Verdict::stopping()
    else {
        return ended();
    };
    refused(status, kind, message)
}

/// The loop's refusal of a request, as the agent gets it.
fn refused(status: u16, kind: &'static str, message: String) -> Response<Body> {
    error(
        StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
        kind,
        message,
    )
}

/// A request in doubt whose route's probe says it took effect (SPEC 22):
/// the probe's answer, for the agent once it is the step's end; `None`
/// when the request is to go again.
async fn settled(
    shared: &Shared,
    route: (&str, &super::routes::Route),
    key: Option<&str>,
    (flight, own): (u64, bool),
    headers: &hyper::HeaderMap,
) -> Option<Response<Body>> {
    let limits = (&shared.clients, shared.routes.max_record);
    let answer = probed(limits, route, key, headers).await?;
    let durable = reconciled(&shared.inbox, flight, own, answer.clone()).await;
    Some(if durable { recorded(&answer) } else { ended() })
}

/// Sends `forward` upstream on a task of its own: the agent's answer.
async fn forwarded(shared: &Arc<Shared>, forward: Forward) -> Response<Body> {
    let (head, answer) = oneshot::channel();
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let limits = (shared.routes.max_record, shared.routes.limiter.as_ref());
        exchange(&shared.clients, &shared.inbox, limits, forward, head).await;
    });
    answer.await.unwrap_or_else(|_| ended())
}

/// The route a request's path names and the path under its base, or the
/// answer that refuses it: 404 without the run's secret (not a word on
/// what the URL should be) or on no route; 400 for a path that `..` takes
/// out of its route's base (SPEC 17).
fn target<'s>(
    path: &str,
    shared: &'s Shared,
) -> Result<(String, &'s super::routes::Route, String), Box<Response<Body>>> {
    let mut segments = path.trim_start_matches('/').splitn(3, '/');
    let given = segments.next().unwrap_or_default();
    if !is_secret(given, &shared.secret) {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "not_found",
            "not found",
        )));
    }
    let route_name = segments.next().unwrap_or_default().to_owned();
    let rest = segments
        .next()
        .map(|rest| format!("/{rest}"))
        .unwrap_or_default();
    let Some(route) = shared.routes.get(&route_name) else {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("durun's proxy has no route `{route_name}`"),
        )));
    };
    let refused = match route.resolve(&rest) {
        Ok(path) => return Ok((route_name, route, path)),
        Err(Unresolved::LeavesBase) => error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("`{rest}` leaves the base URL of route `{route_name}`"),
        ),
        Err(Unresolved::NotUnderBase) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("`{rest}` is not under the base URL of route `{route_name}`"),
        ),
    };
    Err(Box::new(refused))
}

/// The run is over or stopping: nothing is forwarded.
fn ended() -> Response<Body> {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "durun_stopping",
        "durun's run is stopping or has ended; nothing was forwarded",
    )
}

/// A recorded answer, as it came the first time (a stream as a stream).
pub(crate) fn recorded(answer: &Answer) -> Response<Body> {
    let body = answer.body.clone();
    let body = if answer.is_stream() {
        let frames = futures_util::stream::iter([Ok::<_, io::Error>(Frame::data(body))]);
        StreamBody::new(frames).boxed()
    } else {
        full(body)
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    if let Some(content_type) = answer
        .content_type
        .as_deref()
        .and_then(|value| HeaderValue::from_str(value).ok())
    {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    response
}

/// A recorded answer given from the journal, marked so; without the
/// usage durun asked for in the agent's name (`hide_usage`).
fn replay(
    output: &crate::json_text::JsonText,
    hide_usage: impl FnOnce() -> bool,
) -> Response<Body> {
    let mut answer = recording::kept_answer(output);
    // Asked only of a stream, the one answer it changes.
    if answer.is_stream() && hide_usage() {
        answer.body = super::usage::Hidden::whole(&answer.body).into();
    }
    let mut response = recorded(&answer);
    response
        .headers_mut()
        .insert("x-durun-replayed", HeaderValue::from_static("true"));
    response
}
