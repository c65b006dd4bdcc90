//! durun's one HTTP client for its blocking code: HTTP tools, `durun mcp
//! --url` and the trace exporter. The proxy uses the same library
//! (reqwest, rustls, the system's roots and `SSL_CERT_FILE`, `HTTPS_PROXY`)
//! on its own runtime, so every request durun makes trusts the same
//! certificates and goes through the same proxy.

use std::sync::OnceLock;

/// The client, made at the first request (it loads the system's roots and
/// starts the thread it runs on). No timeout of its own: each request
/// sets the one it needs, and an event stream has none.
pub(crate) fn client() -> Result<&'static reqwest::blocking::Client, String> {
    static CLIENT: OnceLock<Result<reqwest::blocking::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::blocking::Client::builder()
                .user_agent(concat!("durun/", env!("CARGO_PKG_VERSION")))
                .timeout(None)
                .build()
                .map_err(|err| format!("cannot set up durun's HTTP client: {}", reason(&err)))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Makes the client on a thread of its own, so that the first request
/// does not wait for it.
pub(crate) fn warm() {
    let _ = std::thread::Builder::new()
        .name("http client".into())
        .spawn(|| {
            let _ = client();
        });
}

/// Why a request failed, with its causes and without its URL (messages
/// name the URL as the user wrote it, `${VAR}`s unexpanded).
pub(crate) fn reason(err: &reqwest::Error) -> String {
    // reqwest's own line ends with ` for url (URL)`: left out.
    let line = err.to_string();
    let head = line.split(" for url (").next().unwrap_or_default();
    match std::error::Error::source(err) {
        Some(cause) => format!("{head}: {}", crate::error::with_causes(cause)),
        None => head.to_owned(),
    }
}
