//! The proxy's server: takes a request from the agent, asks the loop what
//! it is, and answers it from the journal or forwards it upstream,
//! relaying a stream chunk by chunk as it comes.
//!
//! # Invariant
//!
//! The agent has all of a finished answer only once its step is durable:
//! a plain body is sent after the loop's word, and a stream's chunks go
//! out as they arrive but its end (the last chunk of the HTTP message)
//! only after it. A forwarded request is served by a task of its own, so
//! an agent that goes away mid-answer does not stop the answer from being
//! read to its end and recorded: the call is paid for, and a retry gets
//! it from the journal.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::sync::{mpsc, oneshot};

use super::http::{Body, accept, error, full, is_secret};
use super::recording::{self, Answer};
use super::routes::Routes;
use super::{Ask, End, Inbox, ToLoop, Verdict};

/// The largest request body the proxy takes (the protocol's line limit).
const MAX_BODY: usize = crate::protocol::MAX_LINE;
/// How much of a body past [`MAX_BODY`] is read (and dropped) before the
/// 413, and for how long at most.
const DRAIN_MAX: usize = 256 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Chunks of a stream waiting for a slow agent before the upstream's
/// reading waits too.
const STREAM_BACKLOG: usize = 64;

/// Request headers never forwarded: they are about this hop, or (for
/// `proxy-authorization`) for proxies, or set by the proxy itself.
const NOT_FORWARDED: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    // The answer is recorded as it comes: ask for it uncompressed.
    "accept-encoding",
];

/// Answer headers not passed back: about the upstream's hop.
const NOT_RETURNED: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "trailer",
    "upgrade",
];

struct Shared {
    secret: String,
    routes: Arc<Routes>,
    inbox: Inbox,
    /// For `https://` upstreams, made on the first request that needs it:
    /// loading the system's roots takes milliseconds that a run whose calls
    /// go to a local `http://` gateway should not wait.
    tls: std::sync::OnceLock<reqwest::Client>,
    /// For `http://` upstreams: no roots to load.
    plain: std::sync::OnceLock<reqwest::Client>,
    /// A proxy for http:// URLs is reached over TLS: it needs the roots.
    tls_proxy: bool,
}

impl Shared {
    fn client(&self, url: &str) -> Result<&reqwest::Client, String> {
        let plain = url.starts_with("http://") && !self.tls_proxy;
        let cell = if plain { &self.plain } else { &self.tls };
        if let Some(client) = cell.get() {
            return Ok(client);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .tls_built_in_root_certs(!plain)
            .build()
            .map_err(|err| format!("durun could not set up its HTTP client: {err}"))?;
        Ok(cell.get_or_init(|| client))
    }
}

/// Serves `listener` on a thread of its own until `stopped` fires.
pub(super) fn spawn(
    listener: std::net::TcpListener,
    secret: String,
    routes: Arc<Routes>,
    inbox: Inbox,
    stopped: oneshot::Receiver<()>,
) -> io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let shared = Arc::new(Shared {
        secret,
        routes,
        inbox,
        tls: std::sync::OnceLock::new(),
        plain: std::sync::OnceLock::new(),
        tls_proxy: ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
            .iter()
            .any(|name| std::env::var(name).is_ok_and(|value| value.starts_with("https://"))),
    });
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

async fn handle(request: Request<Incoming>, shared: Arc<Shared>) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let mut segments = path.trim_start_matches('/').splitn(3, '/');
    let given = segments.next().unwrap_or_default();
    if !is_secret(given, &shared.secret) {
        // Not a word on what the URL should be.
        return error(StatusCode::NOT_FOUND, "not_found", "not found");
    }
    let route_name = segments.next().unwrap_or_default().to_owned();
    let rest = segments
        .next()
        .map(|rest| format!("/{rest}"))
        .unwrap_or_default();
    let Some(route) = shared.routes.get(&route_name) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("durun's proxy has no route `{route_name}`"),
        );
    };
    // What the upstream will act on: `..` may not take a request to another
    // route, or out of its route's base into another tier.
    let Some(normal) = super::routes::normalized(&rest) else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("`{rest}` leaves the base URL of route `{route_name}`"),
        );
    };
    if normal != rest && route.path(&normal).is_none() && route.path(&rest).is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("`{rest}` leaves the base URL of route `{route_name}`"),
        );
    }
    let rest = normal;
    let Some(path) = route.path(&rest).map(str::to_owned) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("`{rest}` is not under the base URL of route `{route_name}`"),
        );
    };
    let method = request.method().clone();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let effect = route.effect(method.as_str(), &path);
    let upstream = format!(
        "{}{path}{}{query}",
        route.upstream,
        if query.is_empty() { "" } else { "?" }
    );
    let (parts, body) = request.into_parts();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let args = recording::request_args(
        &body,
        &query,
        &shared.routes.ignore,
        &shared.routes.secret_query,
    );
    let canonical = match crate::step_key::canonical_json(&args) {
        Ok(canonical) => canonical,
        Err(err) => return error(StatusCode::BAD_REQUEST, "bad_request", err.to_string()),
    };
    let (reply, verdict) = oneshot::channel();
    let ask = Ask {
        name: format!("{route_name} {method} {path}"),
        effect,
        args,
        canonical,
        reply,
    };
    if !(shared.inbox)(ToLoop::Ask(ask)) {
        return ended();
    }
    let Ok(verdict) = verdict.await else {
        return ended();
    };
    match verdict {
        Verdict::Replay(output) => replay(&recording::output_answer(&output)),
        Verdict::Refuse {
            status,
            kind,
            message,
        } => error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            kind,
            message,
        ),
        Verdict::Forward {
            flight,
            key,
            own,
            traceparent,
        } => {
            let forward = Forward {
                traceparent,
                route: route_name,
                method,
                url: upstream,
                headers: parts.headers,
                body,
                key,
                flight,
                own,
            };
            let (head, answer) = oneshot::channel();
            tokio::spawn(exchange(Arc::clone(&shared), forward, head));
            answer.await.unwrap_or_else(|_| ended())
        }
    }
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
    let body = Bytes::from(answer.body.clone());
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

/// A recorded answer given from the journal, marked so.
fn replay(answer: &Answer) -> Response<Body> {
    let mut response = recorded(answer);
    response
        .headers_mut()
        .insert("x-durun-replayed", HeaderValue::from_static("true"));
    response
}

/// A request to forward, as the loop numbered it.
struct Forward {
    route: String,
    method: hyper::Method,
    url: String,
    headers: HeaderMap,
    body: Bytes,
    key: Option<String>,
    flight: u64,
    own: bool,
    traceparent: Option<String>,
}

/// Forwards a request, hands its answer's head to the agent through
/// `head`, and records its end with the loop.
async fn exchange(shared: Arc<Shared>, forward: Forward, head: oneshot::Sender<Response<Body>>) {
    let Forward {
        traceparent,
        route,
        method,
        url,
        headers,
        body,
        key,
        flight,
        own,
    } = forward;
    let done = |end: End| {
        let (reply, durable) = oneshot::channel();
        let sent = (shared.inbox)(ToLoop::Done {
            flight,
            own,
            end,
            reply,
        });
        async move { sent && durable.await.is_ok() }
    };
    let client = match shared.client(&url) {
        Ok(client) => client,
        Err(message) => {
            return give_up(&done, head, "upstream_unreachable", message).await;
        }
    };
    let mut request = client.request(method, &url).body(body);
    for (name, value) in &headers {
        let skip = NOT_FORWARDED.contains(&name.as_str())
            || (key.is_some() && name.as_str() == "idempotency-key");
        if !skip {
            request = request.header(name, value);
        }
    }
    if let Some(key) = &key {
        request = request.header("idempotency-key", key.as_str());
    }
    if let Some(traceparent) = traceparent.filter(|_| !headers.contains_key("traceparent")) {
        request = request.header("traceparent", traceparent);
    }
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            let message = format!(
                "durun could not reach the upstream of route `{route}`: {}",
                describe(&err)
            );
            return give_up(&done, head, "upstream_unreachable", message).await;
        }
    };
    let status = response.status();
    let mut returned = HeaderMap::new();
    for (name, value) in response.headers() {
        if !NOT_RETURNED.contains(&name.as_str()) {
            returned.append(name.clone(), value.clone());
        }
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let streamed = content_type
        .as_deref()
        .is_some_and(|value| value.starts_with("text/event-stream"))
        || response.content_length().is_none();
    let respond = |body: Body| {
        let mut answer = Response::new(body);
        *answer.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::OK);
        *answer.headers_mut() = returned.clone();
        answer
    };
    let cut_off = |route: &str, err: &reqwest::Error| {
        format!(
            "the upstream of route `{route}` cut its answer off: {}",
            describe(err)
        )
    };

    let max_record = shared.routes.max_record;
    // A body ended by closing the connection (no length, not chunked) is
    // whole only if its type says so (SPEC 17).
    let close_delimited = response.content_length().is_none()
        && !response
            .headers()
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .any(|value| value.to_str().is_ok_and(|value| value.contains("chunked")));
    let too_large = |route: &str| {
        format!(
            "the answer of route `{route}` is over [proxy] max_record ({} MiB): the agent got it whole, the journal did not, and the call is made again on resume",
            max_record >> 20
        )
    };

    if !status.is_success() || !streamed {
        // A plain answer: the agent gets it once it is durable.
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if body.len() + chunk.len() <= max_record => {
                    body.extend_from_slice(&chunk);
                }
                Ok(Some(chunk)) => {
                    // Too large to record: passed on as it comes, never
                    // held whole; the step stays an attempt.
                    let (frames, stream) = stream_body();
                    let _ = head.send(respond(stream));
                    body.extend_from_slice(&chunk);
                    let first = Bytes::from(body);
                    let agent_there = frames.send(Ok(Frame::data(first))).await.is_ok();
                    let end = match pass_on(&mut response, &frames, agent_there, None, &route).await
                    {
                        Ok(_) => End::TooLarge {
                            message: too_large(&route),
                        },
                        Err(message) => End::Lost { message },
                    };
                    done(end).await;
                    return;
                }
                Ok(None) => break,
                Err(err) => {
                    let message = cut_off(&route, &err);
                    return give_up(&done, head, "upstream_cut_off", message).await;
                }
            }
        }
        if close_delimited && !recording::whole(content_type.as_deref(), &body) {
            let message = format!(
                "the upstream of route `{route}` closed the connection before its answer was whole"
            );
            return give_up(&done, head, "upstream_cut_off", message).await;
        }
        let answer = Answer {
            status: status.as_u16(),
            content_type,
            body,
        };
        let usage = status
            .is_success()
            .then(|| recording::usage_of(&answer))
            .flatten();
        let body = Bytes::from(answer.body.clone());
        let unheard = head.is_closed();
        if done(End::Answered {
            answer,
            usage,
            unheard,
        })
        .await
            || !status.is_success()
        {
            let _ = head.send(respond(full(body)));
        } else {
            let _ = head.send(not_journaled());
        }
        return;
    }

    // A stream: every chunk goes on as it comes; the end waits for the
    // step to be durable. It is recorded up to `max_record`, never past.
    let (frames, stream) = stream_body();
    let _ = head.send(respond(stream));
    let mut body = Some(Vec::new());
    let agent_there = match pass_on(
        &mut response,
        &frames,
        true,
        Some((&mut body, max_record)),
        &route,
    )
    .await
    {
        Ok(agent_there) => agent_there,
        Err(message) => {
            done(End::Lost {
                message: message.clone(),
            })
            .await;
            let _ = frames.send(Err(io::Error::other(message))).await;
            return;
        }
    };
    let Some(body) = body else {
        // Passed on whole, not recorded: the agent has its end now.
        done(End::TooLarge {
            message: too_large(&route),
        })
        .await;
        return;
    };
    if close_delimited && !recording::whole(content_type.as_deref(), &body) {
        let message = format!(
            "the upstream of route `{route}` closed the connection before its stream was whole"
        );
        done(End::Lost {
            message: message.clone(),
        })
        .await;
        let _ = frames.send(Err(io::Error::other(message))).await;
        return;
    }
    let answer = Answer {
        status: status.as_u16(),
        content_type,
        body,
    };
    let usage = recording::usage_of(&answer);
    let unheard = !agent_there || frames.is_closed();
    if !done(End::Answered {
        answer,
        usage,
        unheard,
    })
    .await
    {
        // Not durable: the agent must not take the answer as whole.
        let _ = frames
            .send(Err(io::Error::other("durun could not journal the answer")))
            .await;
    }
}

type Frames = mpsc::Sender<Result<Frame<Bytes>, io::Error>>;

/// A body the agent reads as the frames sent on the channel come, at most
/// [`STREAM_BACKLOG`] of them waiting.
fn stream_body() -> (Frames, Body) {
    let (frames, backlog) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(STREAM_BACKLOG);
    let stream = futures_util::stream::unfold(backlog, |mut backlog| async move {
        backlog.recv().await.map(|frame| (frame, backlog))
    });
    (frames, StreamBody::new(stream).boxed())
}

/// Passes the rest of `response` on to the agent chunk by chunk, and into
/// `record` while it stays within its limit (past it, `record` becomes
/// `None` and its bytes are let go). Whether the agent still reads, or
/// why the upstream cut the answer off (the agent then gets an error).
async fn pass_on(
    response: &mut reqwest::Response,
    frames: &Frames,
    mut agent_there: bool,
    mut record: Option<(&mut Option<Vec<u8>>, usize)>,
    route: &str,
) -> Result<bool, String> {
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if let Some((kept, max)) = &mut record
                    && let Some(body) = kept.as_mut()
                {
                    if body.len() + chunk.len() > *max {
                        **kept = None;
                    } else {
                        body.extend_from_slice(&chunk);
                    }
                }
                if agent_there {
                    agent_there = frames.send(Ok(Frame::data(chunk))).await.is_ok();
                }
            }
            Ok(None) => return Ok(agent_there),
            Err(err) => {
                let message = format!(
                    "the upstream of route `{route}` cut its answer off: {}",
                    describe(&err)
                );
                if record.is_none() {
                    let _ = frames.send(Err(io::Error::other(message.clone()))).await;
                }
                return Err(message);
            }
        }
    }
}

/// No answer to record: the loop hears why, then the agent gets a 502.
async fn give_up<F: Future<Output = bool>>(
    done: &impl Fn(End) -> F,
    head: oneshot::Sender<Response<Body>>,
    kind: &str,
    message: String,
) {
    done(End::Lost {
        message: message.clone(),
    })
    .await;
    let _ = head.send(error(StatusCode::BAD_GATEWAY, kind, message));
}

/// The loop could not make the answer durable (the run is stopping, the
/// journal failed): the agent does not get it.
fn not_journaled() -> Response<Body> {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "durun_stopping",
        "durun could not journal the answer (the run is stopping); the call is retried on resume",
    )
}

/// An upstream error with its causes, one line.
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_headers_are_not_forwarded() {
        for name in NOT_FORWARDED.iter().chain(NOT_RETURNED) {
            assert!(
                hyper::header::HeaderName::from_bytes(name.as_bytes()).is_ok(),
                "{name}"
            );
        }
    }
}
