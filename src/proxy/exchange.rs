//! One forwarded request: sent upstream, its answer passed to the agent
//! and recorded, its end told to the loop.
//!
//! # Invariant
//!
//! The agent has all of a finished answer only once its step is durable:
//! a plain body is sent after the loop's word, and a stream's chunks go out
//! as they arrive but its end (the last chunk of the HTTP message) only
//! after it. An answer is a finished step only when it is whole (SPEC 17):
//! its length reached, its last chunk read, or, for a body ended by a
//! close, whole by its type. Nothing past `[proxy] max_record` is held: a
//! larger answer reaches the agent as it comes and stays an attempt.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper::header::{self, HeaderMap};
use hyper::{Response, StatusCode};
use tokio::sync::{mpsc, oneshot};

use super::http::{Body, error, full};
use super::recording::{self, Answer};
use super::{End, Inbox, ToLoop};

/// Chunks of a stream waiting for a slow agent before the upstream's
/// reading waits too.
const STREAM_BACKLOG: usize = 64;

/// Request headers never forwarded: they are about this hop, or (for
/// `proxy-authorization`) for proxies, or set by the proxy itself.
pub(super) const NOT_FORWARDED: &[&str] = &[
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

/// The HTTP clients that reach upstreams, each made on first use.
pub(super) struct Clients {
    /// For `https://` upstreams, made on the first request that needs it:
    /// loading the system's roots takes milliseconds that a run whose calls
    /// go to a local `http://` gateway should not wait.
    tls: std::sync::OnceLock<reqwest::Client>,
    /// For `http://` upstreams: no roots to load.
    plain: std::sync::OnceLock<reqwest::Client>,
    /// A proxy for http:// URLs is reached over TLS: it needs the roots.
    tls_proxy: bool,
}

impl Clients {
    pub(super) fn new() -> Self {
        Self {
            tls: std::sync::OnceLock::new(),
            plain: std::sync::OnceLock::new(),
            tls_proxy: ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
                .iter()
                .any(|name| std::env::var(name).is_ok_and(|value| value.starts_with("https://"))),
        }
    }

    pub(super) fn client(&self, url: &str) -> Result<&reqwest::Client, String> {
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

/// A request to forward, as the loop numbered it.
pub(super) struct Forward {
    pub(super) route: String,
    pub(super) method: hyper::Method,
    pub(super) url: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// durun asked for the usage the agent did not: the agent's stream
    /// goes without it ([`super::usage`]).
    pub(super) hide_usage: bool,
    pub(super) key: Option<String>,
    /// The model the request names, if it is a model call.
    pub(super) model: Option<String>,
    pub(super) flight: u64,
    pub(super) own: bool,
    pub(super) traceparent: Option<String>,
    /// Where a stream is copied for watchers (SPEC 20).
    pub(super) tap: Option<crate::task::live::Tap>,
    /// About how many tokens it may take, for a `tpm` limit.
    pub(super) tokens: u64,
}

/// Where an exchange tells its end: the loop, which answers once the end
/// is durable.
struct Done<'a> {
    inbox: &'a Inbox,
    flight: u64,
    own: bool,
    /// The model the request named, for the answer's price.
    model: Option<String>,
}

impl Done<'_> {
    /// Tells the loop `end`; whether it is durable now.
    async fn tell(&self, end: End) -> bool {
        let (reply, durable) = oneshot::channel();
        let sent = (self.inbox)(ToLoop::Done {
            flight: self.flight,
            own: self.own,
            end,
            reply,
        });
        sent && durable.await.is_ok()
    }

    /// A whole answer: recorded, and whether it is durable now.
    async fn answered(
        &self,
        answer: Answer,
        usage: Option<serde_json::Value>,
        unheard: bool,
    ) -> bool {
        self.tell(End::Answered {
            answer,
            usage,
            model: self.model.clone(),
            unheard,
        })
        .await
    }

    /// No answer to record: the loop hears why, then the agent gets a 502.
    async fn give_up(&self, head: oneshot::Sender<Response<Body>>, kind: &str, message: String) {
        self.tell(End::Lost {
            message: message.clone(),
        })
        .await;
        let _ = head.send(error(StatusCode::BAD_GATEWAY, kind, message));
    }
}

/// An upstream's answer, from its head on.
struct Upstream {
    response: reqwest::Response,
    route: String,
    /// The head the agent gets: the upstream's status and its headers but
    /// [`NOT_RETURNED`].
    status: StatusCode,
    headers: HeaderMap,
    content_type: Option<String>,
    /// An event stream, or a body of no length: passed on as it comes.
    streamed: bool,
    /// Ended by closing the connection (no length, not chunked): whole
    /// only if its type says so.
    close_delimited: bool,
    /// `[proxy] max_record`.
    max_record: usize,
    /// What durun added to the stream, taken out of the agent's.
    hidden: Option<super::usage::Hidden>,
}

impl Upstream {
    fn new(response: reqwest::Response, route: String, max_record: usize) -> Self {
        let headers = response
            .headers()
            .iter()
            .filter(|(name, _)| !NOT_RETURNED.contains(&name.as_str()))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let no_length = response.content_length().is_none();
        let chunked = response
            .headers()
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .any(|value| value.to_str().is_ok_and(|value| value.contains("chunked")));
        Self {
            status: StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::OK),
            streamed: no_length
                || content_type
                    .as_deref()
                    .is_some_and(|value| value.starts_with("text/event-stream")),
            close_delimited: no_length && !chunked,
            headers,
            content_type,
            response,
            route,
            max_record,
            hidden: None,
        }
    }

    /// The agent's answer, with `body`.
    fn respond(&self, body: Body) -> Response<Body> {
        let mut answer = Response::new(body);
        *answer.status_mut() = self.status;
        *answer.headers_mut() = self.headers.clone();
        answer
    }

    fn cut_off(&self, err: &reqwest::Error) -> String {
        format!(
            "the upstream of route `{}` cut its answer off: {}",
            self.route,
            describe(err)
        )
    }

    fn closed_early(&self) -> String {
        format!(
            "the upstream of route `{}` closed the connection before its answer was whole",
            self.route
        )
    }

    fn too_large(&self) -> String {
        format!(
            "the answer of route `{}` is over [proxy] max_record ({} MiB): the agent got it whole, the journal did not, and the call is made again on resume",
            self.route,
            self.max_record >> 20
        )
    }

    /// Whether `body`, all that came, is the whole answer.
    fn whole(&self, body: &[u8]) -> bool {
        !self.close_delimited || recording::whole(self.content_type.as_deref(), body)
    }

    fn into_answer(self, body: Vec<u8>) -> Answer {
        Answer {
            status: self.status.as_u16(),
            content_type: self.content_type,
            body: body.into(),
        }
    }

    /// Passes the rest of the answer on to the agent chunk by chunk, and
    /// into `record` while it stays within `max_record` (past it, `record`
    /// becomes `None` and its bytes are let go). Whether the agent still
    /// reads, or why the upstream cut the answer off (the agent then gets
    /// an error).
    async fn pass_on(
        &mut self,
        frames: &Frames,
        mut agent_there: bool,
        record: &mut Option<Vec<u8>>,
        tap: &mut Option<crate::task::live::Tap>,
    ) -> Result<bool, String> {
        loop {
            match self.response.chunk().await {
                Ok(Some(chunk)) => {
                    if let Some(tap) = tap.as_mut() {
                        tap.write(&chunk);
                    }
                    if let Some(body) = record.as_mut() {
                        if body.len() + chunk.len() > self.max_record {
                            *record = None;
                        } else {
                            body.extend_from_slice(&chunk);
                        }
                    }
                    let chunk = match self.hidden.as_mut() {
                        Some(hidden) => Bytes::from(hidden.feed(&chunk)),
                        None => chunk,
                    };
                    if agent_there && !chunk.is_empty() {
                        agent_there = frames.send(Ok(Frame::data(chunk))).await.is_ok();
                    }
                }
                Ok(None) => {
                    let rest = self.hidden.as_mut().map(super::usage::Hidden::finish);
                    if let Some(rest) = rest.filter(|rest| agent_there && !rest.is_empty()) {
                        agent_there = frames.send(Ok(Frame::data(rest.into()))).await.is_ok();
                    }
                    return Ok(agent_there);
                }
                Err(err) => return Err(self.cut_off(&err)),
            }
        }
    }
}

/// Forwards a request, hands its answer's head to the agent through
/// `head`, and records its end with the loop.
pub(super) async fn exchange(
    clients: &Clients,
    inbox: &Inbox,
    (max_record, limiter): (usize, Option<&std::sync::Arc<crate::limits::Limiter>>),
    mut forward: Forward,
    head: oneshot::Sender<Response<Body>>,
) {
    let done = Done {
        inbox,
        flight: forward.flight,
        own: forward.own,
        model: forward.model.clone(),
    };
    let route = forward.route.clone();
    let hide_usage = forward.hide_usage;
    let tap = forward.tap.take();
    let limiter = limiter.filter(|limiter| limiter.holds(&route, forward.model.as_deref()));
    let (response, slots) = match limited(clients, limiter, &forward).await {
        (Ok(response), slots) => (response, slots),
        (Err(message), slots) => {
            if let Some(limiter) = limiter {
                limiter.done(slots).await;
            }
            return done.give_up(head, "upstream_unreachable", message).await;
        }
    };
    let mut upstream = Upstream::new(response, route, max_record);
    if upstream.status.is_success() && upstream.streamed {
        if hide_usage {
            upstream.hidden = Some(super::usage::Hidden::default());
        }
        stream(upstream, head, &done, tap).await;
    } else {
        plain(upstream, head, &done).await;
    }
    if let Some(limiter) = limiter {
        limiter.done(slots).await;
    }
}

/// How many times a request a limit holds is sent again after an
/// upstream's 429 or 503 with `Retry-After`.
const LIMITED_RETRIES: usize = 5;

/// Sends `forward` when the limits that hold it let it go (SPEC 19). A
/// 429 or 503 with `Retry-After` pauses those limits for every run and is
/// sent again after the pause, a few times: the agent sees a slower
/// answer, not the refusal.
async fn limited(
    clients: &Clients,
    limiter: Option<&std::sync::Arc<crate::limits::Limiter>>,
    forward: &Forward,
) -> (Result<reqwest::Response, String>, crate::limits::Slots) {
    let Some(limiter) = limiter else {
        return (
            send(clients, forward).await,
            crate::limits::Slots::default(),
        );
    };
    let model = forward.model.as_deref();
    let mut tries = 0;
    loop {
        let slots = limiter
            .wait_turn(&forward.route, model, forward.tokens)
            .await;
        let sent = send(clients, forward).await;
        let wait = sent.as_ref().ok().and_then(|response| {
            let refused = matches!(response.status().as_u16(), 429 | 503);
            response
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .filter(|_| refused)
                .and_then(|value| value.to_str().ok())
                .map(crate::limits::retry_after)
        });
        match wait {
            Some(wait) if tries < LIMITED_RETRIES => {
                tries += 1;
                limiter.done(slots).await;
                limiter.pause(&forward.route, model, wait).await;
            }
            _ => return (sent, slots),
        }
    }
}

/// Sends `forward` upstream: its headers but [`NOT_FORWARDED`], the step's
/// key in place of the agent's, the step's `traceparent` unless the agent
/// sent one.
async fn send(clients: &Clients, forward: &Forward) -> Result<reqwest::Response, String> {
    let Forward {
        route,
        method,
        url,
        headers,
        body,
        key,
        traceparent,
        ..
    } = forward;
    let mut request = clients
        .client(url)?
        .request(method.clone(), url)
        .body(body.clone());
    for (name, value) in headers {
        let skip = NOT_FORWARDED.contains(&name.as_str())
            || (key.is_some() && name.as_str() == "idempotency-key");
        if !skip {
            request = request.header(name, value);
        }
    }
    if let Some(key) = &key {
        request = request.header("idempotency-key", key.as_str());
    }
    if let Some(traceparent) = traceparent
        .as_deref()
        .filter(|_| !headers.contains_key("traceparent"))
    {
        request = request.header("traceparent", traceparent);
    }
    request.send().await.map_err(|err| {
        format!(
            "durun could not reach the upstream of route `{route}`: {}",
            describe(&err)
        )
    })
}

/// A plain answer: the agent gets it once it is durable. One over
/// `max_record` goes on as it comes instead, an attempt.
async fn plain(mut upstream: Upstream, head: oneshot::Sender<Response<Body>>, done: &Done<'_>) {
    let mut body = Vec::new();
    loop {
        match upstream.response.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() <= upstream.max_record => {
                body.extend_from_slice(&chunk);
            }
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                return too_large_to_record(upstream, head, done, body).await;
            }
            Ok(None) => break,
            Err(err) => {
                let message = upstream.cut_off(&err);
                return done.give_up(head, "upstream_cut_off", message).await;
            }
        }
    }
    if !upstream.whole(&body) {
        let message = upstream.closed_early();
        return done.give_up(head, "upstream_cut_off", message).await;
    }
    let success = upstream.status.is_success();
    let respond = upstream.respond(full(Bytes::new()));
    let answer = upstream.into_answer(body);
    let usage = success.then(|| recording::usage_of(&answer)).flatten();
    let body = answer.body.clone();
    let unheard = head.is_closed();
    let durable = done.answered(answer, usage, unheard).await;
    let _ = head.send(if durable || !success {
        respond.map(|_| full(body))
    } else {
        not_journaled()
    });
}

/// A plain answer past `max_record`: passed on as it comes, never held
/// whole; the step stays an attempt.
async fn too_large_to_record(
    mut upstream: Upstream,
    head: oneshot::Sender<Response<Body>>,
    done: &Done<'_>,
    first: Vec<u8>,
) {
    let (frames, body) = stream_body();
    let _ = head.send(upstream.respond(body));
    let agent_there = frames
        .send(Ok(Frame::data(Bytes::from(first))))
        .await
        .is_ok();
    let end = match upstream
        .pass_on(&frames, agent_there, &mut None, &mut None)
        .await
    {
        Ok(_) => End::TooLarge {
            message: upstream.too_large(),
        },
        Err(message) => {
            let _ = frames.send(Err(io::Error::other(message.clone()))).await;
            End::Lost { message }
        }
    };
    done.tell(end).await;
}

/// A stream: every chunk goes on as it comes; the end waits for the step
/// to be durable. It is recorded up to `max_record`, never past.
async fn stream(
    mut upstream: Upstream,
    head: oneshot::Sender<Response<Body>>,
    done: &Done<'_>,
    mut tap: Option<crate::task::live::Tap>,
) {
    let (frames, body) = stream_body();
    let _ = head.send(upstream.respond(body));
    let mut record = Some(Vec::new());
    let cut = match upstream.pass_on(&frames, true, &mut record, &mut tap).await {
        Ok(agent_there) => match record {
            // Passed on whole, not recorded: the agent has its end now.
            None => {
                done.tell(End::TooLarge {
                    message: upstream.too_large(),
                })
                .await;
                return;
            }
            Some(body) if upstream.whole(&body) => {
                let unheard = !agent_there || frames.is_closed();
                let answer = upstream.into_answer(body);
                let usage = recording::usage_of(&answer);
                if done.answered(answer, usage, unheard).await {
                    return;
                }
                // Not durable: the agent must not take the answer as whole.
                let _ = frames
                    .send(Err(io::Error::other("durun could not journal the answer")))
                    .await;
                return;
            }
            Some(_) => upstream.closed_early(),
        },
        Err(message) => message,
    };
    done.tell(End::Lost {
        message: cut.clone(),
    })
    .await;
    let _ = frames.send(Err(io::Error::other(cut))).await;
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
pub(super) fn describe(err: &reqwest::Error) -> String {
    crate::error::with_causes(err)
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
