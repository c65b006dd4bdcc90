//! The HTTP/1.1 loop the proxy, `durun test`'s recorder and `durun ui`
//! share: a handler per server, each connection a task of its own, and
//! the error answer and secret check they have in common.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use tokio::sync::oneshot;

/// An answer's body: whole, or a stream relayed as it comes.
pub(crate) type Body = http_body_util::combinators::BoxBody<Bytes, io::Error>;

/// What serves one request: its answer, or `Err` to close the connection
/// without one.
pub(crate) type Handler<S> =
    fn(
        Request<Incoming>,
        Arc<S>,
    ) -> std::pin::Pin<Box<dyn Future<Output = io::Result<Response<Body>>> + Send>>;

/// The most connections a listener serves at once (SPEC 17): more wait in
/// the kernel's queue until one ends, so that no client, another local
/// user's included, can run durun out of file descriptors.
const MAX_CONNECTIONS: usize = 256;

/// How long a connection has to send a request's headers (SPEC 17); one
/// that takes longer, or sits idle that long between requests, is closed.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves HTTP/1.1 on `listener` until `stopped` fires, each request by
/// `handle` with `shared`, each connection as a task of its own, at most
/// [`MAX_CONNECTIONS`] at once.
pub(crate) async fn accept<S: Send + Sync + 'static>(
    listener: std::net::TcpListener,
    shared: Arc<S>,
    mut stopped: oneshot::Receiver<()>,
    handle: Handler<S>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            _ = &mut stopped => return,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors for a moment: try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request| handle(request, Arc::clone(&shared)));
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            drop(slot);
        });
    }
}

/// An error answer in the shape OpenAI's and Anthropic's clients read.
pub(crate) fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response<Body> {
    let body = json!({"error": {"type": kind, "message": message.into()}});
    let mut response = Response::new(full(body.to_string().into_bytes()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub(super) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// Whether `given` is the secret, in time that does not depend on where
/// they differ.
pub(crate) fn is_secret(given: &str, secret: &str) -> bool {
    given.len() == secret.len()
        && given
            .bytes()
            .zip(secret.bytes())
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_compared_whole() {
        assert!(is_secret("abc", "abc"));
        assert!(!is_secret("abd", "abc"));
        assert!(!is_secret("ab", "abc"));
        assert!(!is_secret("", "abc"));
    }
}
