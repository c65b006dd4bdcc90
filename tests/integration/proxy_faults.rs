//! SPEC 17's proxy edges: an answer ended by closing the connection is a
//! finished step only when it is whole by its type, and one too large to
//! record reaches the agent whole while its step stays an attempt.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use crate::env::{TestEnv, text};

/// An upstream that answers each request by its path, with no length and
/// no chunking: the body ends when it closes the connection. Counts the
/// requests it was sent.
fn closing_upstream() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let count = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&count);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counted.fetch_add(1, Ordering::SeqCst);
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let head = String::from_utf8_lossy(&request);
            let path = head
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            let (content_type, body) = match path.as_str() {
                "/cut.json" => ("application/json", "{\"answer\": [1, 2".to_owned()),
                "/whole.json" => ("application/json", "{\"answer\": [1, 2]}".to_owned()),
                "/cut-stream" => (
                    "text/event-stream",
                    "data: {\"object\":\"chat.completion.chunk\",\"n\":1}\n\n".to_owned(),
                ),
                _ => (
                    "application/json",
                    format!("{{\"big\": \"{}\"}}", "x".repeat(5000)),
                ),
            };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nConnection: close\r\n\r\n{body}"
            );
        }
    });
    (url, count)
}

#[test]
fn an_answer_cut_by_a_close_is_an_attempt_and_one_too_large_to_record_reaches_the_agent_whole() {
    let (upstream, requests) = closing_upstream();
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!(
            "[proxy]\nmax_record = 1000\n\n[proxy.routes.api]\nenv = \"MY_API\"\nupstream = \"{upstream}\"\n"
        ),
    );
    env.write(
        "agent.py",
        r#"
import json, os, urllib.error, urllib.request
def get(path):
    try:
        with urllib.request.urlopen(os.environ["MY_API"] + path, timeout=30) as reply:
            return [reply.status, len(reply.read())]
    except urllib.error.HTTPError as err:
        return [err.code, json.loads(err.read())["error"]["type"]]
    except Exception as err:
        return ["cut", type(err).__name__]
got = [get("/whole.json"), get("/cut.json"), get("/cut-stream"), get("/big")]
with open(f"got-{os.environ['DURUN_RUN']}.json", "w") as out:
    json.dump(got, out)
if os.environ["DURUN_RUN"] == "1":
    os.kill(int(os.environ["DURUN_PID"]), 9)
"#,
    );
    let output = env.durun(&["run", "--task", "edges", "--", "python3", "agent.py"]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&output.status),
        Some(9),
        "{}",
        text(&output.stderr)
    );
    let got: Value =
        serde_json::from_slice(&std::fs::read(env.path("got-1.json")).expect("got")).expect("JSON");
    assert_eq!(got[0], serde_json::json!([200, 18]), "{got}");
    // No length: the answer goes on as it comes, and its cut reaches the
    // agent as a broken body.
    assert_eq!(
        got[1][0], "cut",
        "the agent saw the cut JSON end badly: {got}"
    );
    assert_eq!(
        got[2][0], "cut",
        "the agent saw the cut stream end badly: {got}"
    );
    assert_eq!(
        got[3],
        serde_json::json!([200, 5011]),
        "passed on whole: {got}"
    );
    let stderr = text(&output.stderr);
    assert!(stderr.contains("over [proxy] max_record"), "{stderr}");
    assert!(stderr.contains("closed the connection before"), "{stderr}");
    let view = env.inspect("edges");
    let finished: Vec<&str> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["status"] == "committed")
        .map(|step| step["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(finished, ["api GET /whole.json"], "{view}");
    // On resume the finished call replays; the rest are made again.
    assert_eq!(requests.load(Ordering::SeqCst), 4);
    let resumed = env.durun(&["resume", "edges"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(
        requests.load(Ordering::SeqCst),
        7,
        "{}",
        text(&resumed.stderr)
    );
    let again: Value =
        serde_json::from_slice(&std::fs::read(env.path("got-2.json")).expect("got")).expect("JSON");
    // The replayed JSON is the recorded value, re-serialized.
    assert_eq!(again[0][0], 200, "{again}");
    assert_eq!(
        again.as_array().map(|a| &a[1..]),
        got.as_array().map(|a| &a[1..]),
        "the resume's answers are the first run's"
    );
}
