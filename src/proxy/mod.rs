//! The model/API proxy (SPEC 12): an HTTP server on 127.0.0.1 that a run
//! points the agent's model clients at, through the base-URL variables
//! they already read, so that an agent that never heard of durun has its
//! model and API calls journaled.
//!
//! # Where it sits
//!
//! The proxy runs on a thread of its own with a small tokio runtime
//! (hyper serves the agent, reqwest reaches the upstream). It owns no
//! journal: a request byte-identical to a recorded one is answered from
//! the run's recorded answers, which it shares with the loop
//! ([`Answers`]); any other is handed to the supervisor loop as a
//! [`ToLoop`] message through the same inbox the socket uses, and the loop
//! answers with a [`Verdict`] (replay this, forward as step N, refuse).
//! When the answer is in, the proxy hands it to the loop again
//! ([`ToLoop::Done`]) and lets the agent have the end of it only once the
//! loop says it is durable.
//!
//! # Invariant
//!
//! A request without the run's secret path segment is answered 404 and
//! goes nowhere; the secret and the request's headers are never printed
//! or journaled.

pub(crate) mod conversation;
mod exchange;
mod http;
mod probe;
mod recording;
mod request;
mod routes;
mod serve;
mod skim;
mod usage;

use std::io;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::oneshot;

pub(crate) use http::{Body, accept, error, is_secret};
pub(crate) use recording::{Answer, answer_output_text, answer_text, summary};
pub(crate) use request::request_args;
pub(crate) use routes::{Routes, TAPE, secret_query, upstreams_from_env};
pub(crate) use serve::recorded;

use crate::protocol::Effect;

/// What the proxy asks of the supervisor loop.
pub(crate) enum ToLoop {
    /// A request to journal: the loop says what to do with it.
    Ask(Ask),
    /// A forwarded request's end.
    Done {
        /// As [`Verdict::Forward`] gave it.
        flight: u64,
        /// The request is a step of its own, not part of an agent's step.
        own: bool,
        end: End,
        /// Answered once the end is durable; dropped if it cannot be.
        reply: oneshot::Sender<()>,
    },
}

/// A request, as a step.
pub(crate) struct Ask {
    /// `ROUTE METHOD PATH`.
    pub(crate) name: String,
    pub(crate) effect: Effect,
    pub(crate) args: Value,
    /// `args` in the canonical form keys are made of.
    pub(crate) canonical: String,
    /// The request's bytes, hashed with what else makes its args
    /// ([`request::request_hash`]): kept with its step.
    pub(crate) request_hash: String,
    /// For a model call: its model, and what a budget reserves for it.
    pub(crate) asked: Option<crate::usage::Asked>,
    pub(crate) reply: oneshot::Sender<Verdict>,
}

/// The journal's answers to requests, as the proxy takes them itself: a
/// request byte-identical to a recorded one (its bytes hashed with what
/// else makes its args, [`request::request_hash`]; a query's secret is in
/// a hash, never in clear) is answered before it is parsed and without a
/// round trip to the loop, so a resumed chat's requests, each the whole
/// conversation again, cost a hash each (SPEC 21).
pub(crate) trait Answers: Send + Sync {
    /// The recorded answer to the request whose bytes hash to
    /// `request_hash`, taken: no other request of the run gets it.
    fn take(&self, request_hash: &str) -> Taken;
}

/// What [`Answers::take`] found.
pub(crate) enum Taken {
    /// The recorded step's output.
    Output(crate::json_text::JsonText),
    /// No answer kept for these bytes (none recorded, or every one had):
    /// the loop is asked, with the request's args.
    Ask,
    /// The run stops: refused, as the loop refuses any request then.
    Stopping,
    /// Another runner holds the task: the agent hears the run ended.
    Ended,
}

/// What the loop says to do with a request.
pub(crate) enum Verdict {
    /// Answer it from the journal; the step's output as kept.
    Replay(crate::json_text::JsonText),
    /// Forward it. `flight`: what its end comes back with. `key`: a
    /// `mutate` step's idempotency key, sent as `Idempotency-Key`. `own`:
    /// it is a step of its own, not part of an agent's open step (whose
    /// number `flight` is then).
    Forward {
        flight: u64,
        key: Option<String>,
        own: bool,
        /// The span the request belongs to, when traces are on: sent as
        /// `traceparent` unless the agent sent its own.
        traceparent: Option<String>,
        /// Where a streamed answer is copied as it comes, for someone
        /// watching the task's events (SPEC 20).
        tap: Option<crate::task::live::Tap>,
        /// A run died inside it: it may have taken effect, and its route's
        /// probe, if it has one, is asked first (SPEC 22).
        in_doubt: bool,
    },
    /// Answer it with this status and error, forwarding nothing.
    Refuse {
        status: u16,
        kind: &'static str,
        message: String,
    },
}

impl Verdict {
    /// The answer to a request that comes while the run stops.
    pub(crate) fn stopping() -> Self {
        Self::Refuse {
            status: 503,
            kind: "durun_stopping",
            message: "durun's run is stopping; nothing was forwarded, and the task can be resumed"
                .into(),
        }
    }

    /// The answer to a model call that does not fit the task's budget
    /// (`why`, a sentence).
    pub(crate) fn over_budget(why: &str) -> Self {
        Self::Refuse {
            status: 429,
            kind: "budget_exceeded",
            message: format!("{why}; durun stops it (exit 78)"),
        }
    }
}

/// How a forwarded request ended.
pub(crate) enum End {
    /// The upstream answered in full; a 2xx answer finishes the step, any
    /// other is a failed attempt.
    Answered {
        answer: Answer,
        usage: Option<Value>,
        /// The model the request named (its price makes the step's cost).
        model: Option<String>,
        /// The agent hung up before the end: an equal request of this run
        /// may have the answer from the journal.
        unheard: bool,
    },
    /// No full answer: the upstream could not be reached, or cut it off.
    Lost { message: String },
    /// A whole answer over `[proxy] max_record`: the agent got it, the
    /// journal did not; the step stays an attempt (SPEC 17).
    TooLarge { message: String },
    /// Nothing was sent: the request was in doubt, and its route's probe
    /// says it took effect; `answer` is the probe's (SPEC 22).
    Reconciled { answer: Answer },
}

/// How the proxy reaches the loop: `false` once the loop is gone.
pub(crate) type Inbox = Box<dyn Fn(ToLoop) -> bool + Send + Sync>;

/// The proxy of a run: its port is bound at once (the agent's
/// environment names it), its thread and runtime start with the first
/// client (most runs never call a model through durun, and the thread
/// cost every start a few hundred microseconds); it stops when dropped.
pub(crate) struct Proxy {
    /// `http://127.0.0.1:PORT/SECRET`.
    base: String,
    routes: Arc<Routes>,
    /// Until the first client: what the thread is started with.
    idle: Option<Idle>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A proxy bound but not yet serving.
struct Idle {
    listener: std::net::TcpListener,
    secret: String,
    inbox: Inbox,
}

impl Proxy {
    /// Binds the proxy to a free port of 127.0.0.1; [`Proxy::serve`]
    /// starts it.
    pub(crate) fn start(routes: Routes, inbox: Inbox) -> io::Result<Self> {
        let secret = secret()?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let base = format!("http://{}/{secret}", listener.local_addr()?);
        Ok(Self {
            base,
            routes: Arc::new(routes),
            idle: Some(Idle {
                listener,
                secret,
                inbox,
            }),
            stop: None,
            thread: None,
        })
    }

    /// The listener while no thread serves it: a client waiting on it (it
    /// polls readable) is the time to [`Proxy::serve`].
    pub(crate) fn idle_listener(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd as _;
        self.idle.as_ref().map(|idle| idle.listener.as_fd())
    }

    /// Starts serving on a thread of its own, once, taking recorded
    /// answers from `answers`. On failure the port is closed, so that
    /// clients are refused rather than left waiting.
    pub(crate) fn serve(&mut self, answers: Arc<dyn Answers>) -> io::Result<()> {
        let Some(Idle {
            listener,
            secret,
            inbox,
        }) = self.idle.take()
        else {
            return Ok(());
        };
        let (stop, stopped) = oneshot::channel();
        let thread = serve::spawn(
            listener,
            serve::Shared::new(secret, Arc::clone(&self.routes), inbox, answers),
            stopped,
        )?;
        self.stop = Some(stop);
        self.thread = Some(thread);
        Ok(())
    }

    /// The URL an agent reaches route `name` at (`…/openai/v1`).
    pub(crate) fn route_url(&self, name: &str) -> Option<String> {
        self.routes.url(&self.base, name)
    }

    /// The variables the agent's environment gets: each route's base URL,
    /// and `DURUN_PROXY`.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let mut env = self.routes.env(&self.base);
        env.push(("DURUN_PROXY".into(), self.base.clone()));
        // An agent whose environment sends HTTP through a company proxy
        // would send its calls to durun there too, where 127.0.0.1 is not
        // durun: loopback is left out of proxying.
        for name in ["NO_PROXY", "no_proxy"] {
            let listed = std::env::var(name).unwrap_or_default();
            env.push((name.to_owned(), with_loopback(&listed)));
        }
        env
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A `NO_PROXY` list with 127.0.0.1 and localhost in it.
fn with_loopback(listed: &str) -> String {
    let mut hosts: Vec<&str> = listed
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .collect();
    for loopback in ["127.0.0.1", "localhost"] {
        if !hosts.contains(&loopback) {
            hosts.push(loopback);
        }
    }
    hosts.join(",")
}

/// 192 random bits, as hex: the path segment every URL of a run's proxy
/// starts with.
pub(crate) fn secret() -> io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().fold(String::new(), |mut hex, byte| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}");
        hex
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_added_to_no_proxy_once() {
        assert_eq!(super::with_loopback(""), "127.0.0.1,localhost");
        assert_eq!(
            super::with_loopback("corp.example, localhost"),
            "corp.example,localhost,127.0.0.1"
        );
    }
}
