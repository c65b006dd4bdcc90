//! HTTP tools against servers on loopback: the key as `Idempotency-Key`,
//! headers from the environment that never reach the journal, retries on
//! 429 and 5xx that honour `Retry-After`, no retry on other 4xx, timeouts,
//! token usage from the answer, and a lost answer after a crash.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, text};
use crate::servers::FakeApi;

#[derive(Clone, Debug)]
struct Seen {
    method: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One scripted answer: status, headers, body, and a delay in milliseconds.
type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str, u64);

/// A server that answers with the scripted (status, headers, body, delay)
/// in turn, then 200 `{}`; it records every request.
fn scripted_server(script: Vec<Answer>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/hook", server.server_addr().to_ip().expect("ip"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let mut body = String::new();
            let _ = request.as_reader().read_to_string(&mut body);
            record.lock().expect("seen").push(Seen {
                method: request.method().to_string(),
                headers: request
                    .headers()
                    .iter()
                    .map(|h| (h.field.to_string(), h.value.to_string()))
                    .collect(),
                body,
            });
            let (status, headers, answer, delay) = script
                .lock()
                .expect("script")
                .pop_front()
                .unwrap_or((200, vec![], "{}", 0));
            std::thread::sleep(Duration::from_millis(delay));
            let mut response = tiny_http::Response::from_string(answer).with_status_code(status);
            for (name, value) in headers {
                response.add_header(tiny_http::Header::from_bytes(name, value).expect("header"));
            }
            let _ = request.respond(response);
        }
    });
    (url, seen)
}

/// Sends `lines` through `probe.py` as task `task`; the run must succeed.
fn probe(env: &TestEnv, task: &str, lines: &[&str]) -> Vec<Value> {
    let script: Vec<Value> = lines.iter().map(|line| json!({"send": line})).collect();
    let (output, answers) = env.probe(task, &Value::from(script));
    assert!(output.status.success(), "{}", text(&output.stderr));
    answers
}

#[test]
fn retries_honour_retry_after_and_secrets_stay_out_of_the_journal() {
    let (url, seen) = scripted_server(vec![
        (429, vec![("Retry-After", "0")], "slow down", 0),
        (503, vec![], "try later", 0),
        (
            200,
            vec![],
            r#"{"choices": [{"text": "hello"}], "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}}"#,
            0,
        ),
    ]);
    let mut env = TestEnv::new();
    env.set("HOOK_TOKEN", "s3cret-token");
    env.write(
        "durun.toml",
        &format!(
            "[tools.llm]\neffect = \"read\"\nhttp = {{ method = \"POST\", url = \"{url}\" }}\nheaders = {{ Authorization = \"Bearer ${{HOOK_TOKEN}}\" }}\nretries = 3\n"
        ),
    );
    let answers = probe(
        &env,
        "h",
        &[r#"{"op":"call","id":1,"tool":"llm","args":{"prompt":"hi"}}"#],
    );
    assert_eq!(answers[0]["ok"], true, "{}", answers[0]);
    assert_eq!(answers[0]["output"]["choices"][0]["text"], "hello");
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 3, "a 429 and a 503 were retried");
    let key = answers[0]["idempotency_key"].as_str().expect("key");
    for request in &seen {
        assert_eq!(request.method, "POST");
        assert_eq!(
            request.header("Idempotency-Key"),
            Some(key),
            "every attempt carries the step's key"
        );
        assert_eq!(request.header("Authorization"), Some("Bearer s3cret-token"));
        assert_eq!(
            serde_json::from_str::<Value>(&request.body).expect("JSON body"),
            json!({"prompt": "hi"})
        );
    }
    let view = env.inspect("h");
    assert_eq!(view["steps"][0]["attempts"], 3);
    assert_eq!(view["steps"][0]["tokens"], 42);
    // The secret is expanded for the request only.
    for file in ["state/journal.db", "state/journal.db-wal"] {
        let bytes = std::fs::read(env.path(file)).unwrap_or_default();
        assert!(
            !bytes.windows(12).any(|w| w == b"s3cret-token"),
            "{file} holds the secret"
        );
    }
}

#[test]
fn other_4xx_are_not_retried_and_timeouts_are_timeouts() {
    let (url, seen) = scripted_server(vec![
        (404, vec![], "no such hook", 0),
        (200, vec![], "late", 2000),
    ]);
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!(
            "[tools.hook]\nhttp = {{ url = \"{url}\" }}\nretries = 3\n\n[tools.slow]\neffect = \"read\"\nhttp = {{ method = \"GET\", url = \"{url}?q={{q}}\" }}\noutput = \"text\"\ntimeout = \"300ms\"\n"
        ),
    );
    let answers = probe(
        &env,
        "f",
        &[
            r#"{"op":"call","id":1,"tool":"hook","args":{}}"#,
            r#"{"op":"call","id":2,"tool":"slow","args":{"q":"x"}}"#,
            r#"{"op":"call","id":3,"tool":"slow","args":{}}"#,
        ],
    );
    assert_eq!(answers[0]["error"]["code"], "tool_failed");
    assert!(
        answers[0]["error"]["message"]
            .as_str()
            .expect("message")
            .starts_with("HTTP 404")
    );
    assert_eq!(answers[0]["output"]["status"], 404);
    assert_eq!(answers[1]["error"]["code"], "timeout", "{}", answers[1]);
    assert_eq!(
        answers[2]["error"]["code"], "bad_request",
        "the URL needs args.q"
    );
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 2, "the 404 was not retried");
    assert_eq!(seen[1].method, "GET");
    assert!(seen[1].body.is_empty());
    assert_eq!(env.inspect("f")["steps"][0]["attempts"], 1);
}

#[test]
fn an_http_mutate_whose_answer_is_lost_creates_one_resource() {
    let api = FakeApi::start();
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!("[tools.create_pr]\neffect = \"mutate\"\nhttp = {{ method = \"POST\", url = \"{}\" }}\n", api.url),
    );
    let plan = json!({"steps": [
        {"begin": "plan", "args": {}, "do": {"value": "p"}},
        {"call": "create_pr", "args": {"title": "Fix typo"}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut durun = api.spawn_until_held(&env, "pr", &agent);
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    api.release();
    let resumed = env.durun(&["resume", "pr"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let keys = api.keys();
    assert_eq!(keys.len(), 2, "the server saw the request twice");
    assert_eq!(keys[0], keys[1], "with the same Idempotency-Key");
    assert_eq!(api.resources(), 1, "and created one resource");
    let view = env.inspect("pr");
    assert_eq!(view["steps"][1]["output"]["id"], "res-1");
    assert_eq!(view["steps"][1]["attempts"], 2);
}

/// Everything durun said or kept about task `task`: its answers, its
/// stderr, `inspect` in every form, and the journal's bytes.
fn everything_said(env: &TestEnv, task: &str, answers: &[Value], stderr: &str) -> Vec<u8> {
    let mut said = stderr.as_bytes().to_vec();
    said.extend(serde_json::to_vec(answers).expect("JSON"));
    for args in [
        vec!["inspect", task, "--json"],
        vec!["inspect", task],
        vec!["inspect", task, "--step", "1"],
        vec!["inspect"],
    ] {
        let output = env.durun(&args);
        said.extend(output.stdout);
        said.extend(output.stderr);
    }
    if env.postgres.is_none() {
        for file in ["state/journal.db", "state/journal.db-wal"] {
            said.extend(std::fs::read(env.path(file)).unwrap_or_default());
        }
    }
    said
}

#[test]
fn an_expanded_secret_appears_nowhere_even_when_it_breaks_the_request() {
    let (url, seen) = scripted_server(vec![]);
    let mut env = TestEnv::new();
    // A token pasted with its line break, and a secret in a URL that
    // cannot be reached.
    env.set("BROKEN_TOKEN", "sk-live-BROKEN42\r\n");
    env.set("PATH_TOKEN", "sk-live-PATH42");
    env.write(
        "durun.toml",
        &format!(
            "[tools.hook]\neffect = \"read\"\nhttp = {{ url = \"{url}\" }}\nheaders = {{ Authorization = \"Bearer ${{BROKEN_TOKEN}}\" }}\n\n\
             [tools.away]\neffect = \"read\"\nhttp = {{ url = \"http://127.0.0.1:9/${{PATH_TOKEN}}/x\" }}\n"
        ),
    );
    let script = json!([
        {"send": r#"{"op":"call","id":1,"tool":"hook","args":{}}"#},
        {"send": r#"{"op":"call","id":2,"tool":"away","args":{}}"#},
    ]);
    let (output, answers) = env.probe("s", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        seen.lock().expect("seen").is_empty(),
        "the broken header was sent"
    );
    assert_eq!(answers[0]["error"]["code"], "tool_failed");
    let message = answers[0]["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("line break (from ${BROKEN_TOKEN})"),
        "{message}"
    );
    let message = answers[1]["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("could not reach http://127.0.0.1:9/${PATH_TOKEN}/x"),
        "{message}"
    );
    let said = everything_said(&env, "s", &answers, &text(&output.stderr));
    for secret in [&b"sk-live-BROKEN42"[..], b"sk-live-PATH42"] {
        assert!(
            !said.windows(secret.len()).any(|w| w == secret),
            "{} leaked",
            String::from_utf8_lossy(secret)
        );
    }
}
