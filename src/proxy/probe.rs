//! A route's probe (SPEC 22): before a request in doubt goes again, the
//! upstream is asked whether its key was applied; a 2xx answer with a
//! body finishes the step with that answer, which the agent gets.
//!
//! # Invariant
//!
//! A probe's answer is the step's only once it is durable, as any
//! answer's; one that cannot tell sends the request again with its key.

use std::time::Duration;

use hyper::header::{self, HeaderMap};
use tokio::sync::oneshot;

use super::exchange::{Clients, NOT_FORWARDED, describe};
use super::recording::Answer;
use super::routes::Route;
use super::{End, Inbox, ToLoop};

/// Asks the route's probe, if it has one, whether the request in doubt
/// with `key` took effect (SPEC 22): the probe's answer when it did;
/// `None` when it did not or cannot tell, and the request goes again
/// with its key.
pub(super) async fn probed(
    (clients, max): (&Clients, usize),
    (name, route): (&str, &Route),
    key: Option<&str>,
    headers: &HeaderMap,
) -> Option<Answer> {
    let (method, url) = route.probe(key?)?;
    match probe(clients, &method, &url, headers, max).await {
        Probed::Applied(answer) => Some(answer),
        Probed::NotApplied => None,
        Probed::Unknown(why) => {
            crate::report::say(&format!(
                "the probe of route `{name}` could not tell whether a request in doubt took effect ({why}): it goes again with its key"
            ));
            None
        }
    }
}

/// Records the probe's `answer` as the end of the request in doubt
/// `flight`: whether it is durable, and the agent may have it.
pub(super) async fn reconciled(inbox: &Inbox, flight: u64, own: bool, answer: Answer) -> bool {
    let (reply, durable) = oneshot::channel();
    let sent = inbox(ToLoop::Done {
        flight,
        own,
        end: End::Reconciled { answer },
        reply,
    });
    sent && durable.await.is_ok()
}

/// What a route's probe says of a request in doubt (SPEC 22).
enum Probed {
    /// It took effect: the probe's answer (2xx, with a body).
    Applied(Answer),
    /// It did not (404).
    NotApplied,
    /// No plain answer, and why.
    Unknown(String),
}

/// Asks `METHOD URL` (a route's probe) whether a request in doubt took
/// effect, with the agent's headers (its credentials) but no body.
async fn probe(
    clients: &Clients,
    method: &str,
    url: &str,
    headers: &HeaderMap,
    max: usize,
) -> Probed {
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return Probed::Unknown(format!("{method} is not an HTTP method"));
    };
    let client = match clients.client(url) {
        Ok(client) => client,
        Err(err) => return Probed::Unknown(err),
    };
    let mut request = client.request(method, url).timeout(Duration::from_secs(30));
    for (name, value) in headers {
        let body_header = matches!(name.as_str(), "content-type" | "idempotency-key");
        if !NOT_FORWARDED.contains(&name.as_str()) && !body_header {
            request = request.header(name, value);
        }
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => return Probed::Unknown(describe(&err)),
    };
    let status = response.status().as_u16();
    if status == 404 {
        return Probed::NotApplied;
    }
    if !(200..300).contains(&status) {
        return Probed::Unknown(format!("it answered HTTP {status}"));
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    match response.bytes().await {
        Ok(body) if body.is_empty() => Probed::Unknown("it answered with no body".to_owned()),
        Ok(body) if body.len() > max => {
            Probed::Unknown("its answer is over [proxy] max_record".to_owned())
        }
        Ok(body) => Probed::Applied(Answer {
            status,
            content_type,
            body,
        }),
        Err(err) => Probed::Unknown(describe(&err)),
    }
}
