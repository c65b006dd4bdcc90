//! The streamable HTTP transport: each message from the client is POSTed
//! to the server's URL; its answer comes back as JSON or as an event
//! stream of messages.

use std::io::BufRead;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::stdio::for_each_line;
use super::{Journaling, ToClient};

/// Relays between this process's stdin/stdout and the server at `url`
/// until the client closes its end.
pub(crate) fn relay_url(url: &str, journaling: Arc<Journaling>, client: &ToClient) {
    let server = Arc::new(Server {
        url: url.to_owned(),
        session: Mutex::new(None),
        journaling,
        client: client.clone(),
    });
    {
        // durun's own messages (a task's call in doubt, a cancel) go out
        // as the client's do.
        let sender = Arc::clone(&server);
        server
            .journaling
            .connect_server(Box::new(move |message: Vec<u8>| {
                let server = Arc::clone(&sender);
                let parsed: Value = serde_json::from_slice(&message).unwrap_or(Value::Null);
                std::thread::spawn(move || server.send(message, &parsed));
                true
            }));
    }
    let mut posts = Vec::new();
    let max = server.journaling.max_message();
    let too_long = || {
        client.error(
            &Value::Null,
            &format!("durun: a message over {max} bytes ([mcp] max_message) was refused"),
        );
    };
    for_each_line(std::io::stdin().lock(), max, too_long, |message| {
        let Some(forward) = server.journaling.on_client_message(message, client) else {
            return true;
        };
        let parsed: Value = serde_json::from_slice(&forward).unwrap_or(Value::Null);
        if parsed.get("method").and_then(Value::as_str) == Some("initialize") {
            // The session starts with its answer: nothing goes before it.
            server.post(&forward, &parsed);
            let listener = Arc::clone(&server);
            // Detached: it ends when the server ends the stream or this
            // process exits with the client.
            std::thread::spawn(move || listener.listen());
        } else {
            let server = Arc::clone(&server);
            posts.push(std::thread::spawn(move || server.send(forward, &parsed)));
        }
        true
    });
    for post in posts {
        let _ = post.join();
    }
    // The client left; its tasks' calls run to their ends (SPEC 22).
    server.journaling.drain();
}

/// How many times a task's call is sent again after its connection broke.
const RESENDS: u32 = 6;

struct Server {
    url: String,
    /// `Mcp-Session-Id`, once the server gave one.
    session: Mutex<Option<String>>,
    journaling: Arc<Journaling>,
    client: ToClient,
}

impl Server {
    /// Posts a message; a task's call whose connection broke before its
    /// answer came goes again, with its key, a few times with backoff. So
    /// does a probe, as it was: it only asks, and a connection the server's
    /// side had just closed (a pooled one, say) must not make it say "could
    /// not tell", which sends the call in doubt again.
    fn send(&self, mut message: Vec<u8>, parsed: &Value) {
        let mut id = parsed.get("id").filter(|id| !id.is_null()).cloned();
        let mut parsed = parsed.clone();
        for attempt in 0..=RESENDS {
            self.post(&message, &parsed);
            let Some(sent) = &id else {
                return;
            };
            let backoff = std::time::Duration::from_millis(100 << attempt);
            if attempt < RESENDS && self.journaling.awaits_probe(sent) {
                std::thread::sleep(backoff);
                continue;
            }
            self.journaling.unanswered(sent);
            let Some((again, own)) = self.journaling.resend(sent) else {
                return;
            };
            if attempt == RESENDS {
                self.journaling
                    .give_up(&own, "its connection broke, every time it was sent");
                return;
            }
            std::thread::sleep(backoff);
            message = again;
            parsed = serde_json::json!({ "id": own });
            id = Some(own);
        }
    }

    fn post(&self, message: &[u8], parsed: &Value) {
        // A task's call was answered with its task: its failures are the
        // task's, never a second answer to the request; those of durun's
        // own requests are its own.
        let id = parsed
            .get("id")
            .filter(|id| !id.is_null() && self.journaling.client_awaits(id));
        let answer = crate::web::client().and_then(|client| {
            let mut request = client
                .post(&self.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream");
            if let Some(session) = self.session.lock().expect("session lock").as_deref() {
                request = request.header("mcp-session-id", session);
            }
            request
                .body(message.to_vec())
                .send()
                .map_err(|err| crate::web::reason(&err))
        });
        let response = match answer {
            Ok(response) => response,
            Err(err) => {
                if let Some(id) = id {
                    self.client
                        .error(id, &format!("durun could not reach the MCP server: {err}"));
                }
                return;
            }
        };
        if let Some(session) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|value| value.to_str().ok())
        {
            *self.session.lock().expect("session lock") = Some(session.to_owned());
        }
        let status = response.status().as_u16();
        let event_stream = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        if !(200..300).contains(&status) {
            if let Some(id) = id {
                self.client
                    .error(id, &format!("the MCP server answered HTTP {status}"));
            }
            return;
        }
        let mut body = std::io::BufReader::new(response);
        if event_stream {
            self.read_events(&mut body);
        } else {
            // Read to `max_message` and no further (SPEC 17): a larger
            // answer is refused, never held.
            let max = self.journaling.max_message();
            let mut bytes = Vec::new();
            let _ = std::io::Read::read_to_end(
                &mut std::io::Read::take(&mut body, max as u64 + 1),
                &mut bytes,
            );
            if bytes.len() > max {
                self.too_large(id);
            } else if !bytes.trim_ascii().is_empty() {
                self.deliver(bytes.trim_ascii().to_vec());
            }
        }
    }

    /// The stream the server may open for messages of its own (SPEC 13,
    /// streamable HTTP): a GET once the session has its id, read until the
    /// server ends it. A server without one answers 405, and that is all.
    fn listen(&self) {
        let Some(session) = self.session.lock().expect("session lock").clone() else {
            return;
        };
        let Ok(response) = crate::web::client().and_then(|client| {
            client
                .get(&self.url)
                .header("accept", "text/event-stream")
                .header("mcp-session-id", session)
                .send()
                .map_err(|err| crate::web::reason(&err))
        }) else {
            return;
        };
        let event_stream = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        if response.status().is_success() && event_stream {
            self.read_events(&mut std::io::BufReader::new(response));
        }
    }

    /// Delivers each event's data, one message each, until the stream ends.
    /// An event over `max_message` is read past and refused, never held.
    fn read_events(&self, body: &mut impl BufRead) {
        let max = self.journaling.max_message();
        let mut data = Vec::new();
        let mut over = false;
        let mut line = Vec::new();
        loop {
            line.clear();
            match std::io::Read::take(&mut *body, max as u64 + 2).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") && line.len() > max {
                // The rest of an over-long line, dropped as it comes.
                over = true;
                data = Vec::new();
                continue;
            }
            let text = line.trim_ascii_end();
            if text.is_empty() {
                if over {
                    self.too_large(None);
                    over = false;
                } else if !data.is_empty() {
                    self.deliver(std::mem::take(&mut data));
                }
            } else if let Some(more) = text.strip_prefix(b"data:") {
                if over {
                    continue;
                }
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(more.trim_ascii_start());
                if data.len() > max {
                    over = true;
                    data = Vec::new();
                }
            }
        }
        if !data.is_empty() {
            self.deliver(data);
        }
    }

    /// Says that a message from the server was over `max_message`.
    fn too_large(&self, id: Option<&Value>) {
        self.client.error(
            id.unwrap_or(&Value::Null),
            &format!(
                "durun: the MCP server sent a message over {} bytes ([mcp] max_message); it was dropped",
                self.journaling.max_message()
            ),
        );
    }

    fn deliver(&self, message: Vec<u8>) {
        if let Some(message) = self.journaling.on_server_message(message) {
            self.client.send(&message);
        }
    }
}
