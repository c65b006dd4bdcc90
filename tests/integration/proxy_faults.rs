//! The proxy when something fails: an upstream that cannot be reached or
//! hangs, bodies too big, an agent that hangs up mid-stream, and SPEC 17's
//! edges: an answer ended by closing the connection is a finished step
//! only when it is whole by its type, and one too large to record reaches
//! the agent whole while its step stays an attempt.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, text};
use crate::proxy::llm_env;
use crate::servers::{FakeApi, llm_clients};

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

#[test]
fn an_upstream_that_cannot_be_reached_gets_the_agent_a_502_naming_the_route() {
    let mut env = TestEnv::new();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    env.set("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"));
    let agent = env.write(
        "agent.py",
        r#"
import json, os, urllib.request, urllib.error
open("secret", "w").write(os.environ["DURUN_PROXY"].rsplit("/", 1)[1])
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                 data=b'{"model": "m"}', method="POST")
try:
    urllib.request.urlopen(request)
except urllib.error.HTTPError as err:
    print(err.code, json.loads(err.read())["error"]["message"])
"#,
    );
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let printed = text(&run.stdout);
    assert!(
        printed.starts_with("502 durun could not reach the upstream of route `openai`"),
        "{printed}"
    );
    let secret = std::fs::read_to_string(env.path("secret")).expect("the secret segment");
    assert!(
        !printed.contains(&secret),
        "the 502 never names the secret: {printed}"
    );
    assert!(
        !text(&run.stderr).contains(&secret),
        "{}",
        text(&run.stderr)
    );
    assert_eq!(env.inspect("t")["steps"], serde_json::json!([]));
}

#[test]
fn big_bodies_a_hung_upstream_and_a_request_after_the_run_each_have_a_clear_outcome() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    // An upstream that takes connections and never answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_port = hung.local_addr().expect("addr").port();
    env.write(
        "durun.toml",
        &format!(
            "[proxy.routes.api]\nenv = \"MY_API\"\nupstream = \"{}\"\n\n[proxy.routes.hung]\nenv = \"HUNG_API\"\nupstream = \"http://127.0.0.1:{hung_port}\"\n",
            api.url.trim_end_matches('/')
        ),
    );
    env.set("PROXY_FILE", env.path("proxy-url").to_string_lossy());
    let agent = env.write(
        "agent.py",
        r#"
import os, socket, urllib.request, urllib.error
open(os.environ["PROXY_FILE"], "w").write(os.environ["MY_API"])
def post(url, body, timeout=60):
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code
    except (socket.timeout, urllib.error.URLError) as err:
        return "timeout"
base = os.environ["MY_API"]
print("50 MB, not JSON:", post(base + "/upload", b"\xff" * (50 << 20)))
print("over 64 MiB:", post(base + "/upload", b"\xff" * (96 << 20)))
print("hung upstream:", post(os.environ["HUNG_API"] + "/x", b"{}", timeout=1))
"#,
    );
    let started = std::time::Instant::now();
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        text(&run.stdout),
        "50 MB, not JSON: 200\nover 64 MiB: 413\nhung upstream: timeout\n"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a hung upstream does not hold the run's end"
    );
    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    assert_eq!(
        steps.len(),
        2,
        "the upload, and the hung call's intent: {steps:?}"
    );
    assert_eq!(steps[0]["args"]["body"]["bytes"], 50 << 20);
    assert_eq!(
        steps[0]["args"]["body"]["sha256"].as_str().map(str::len),
        Some(64)
    );
    assert_eq!(steps[0]["status"], "committed");
    assert_eq!(steps[1]["name"], "hung POST /x");
    assert_eq!(
        steps[1]["status"], "pending",
        "in doubt: it may have reached the API"
    );
    assert_eq!(api.resources(), 1);

    // After the run, its proxy is gone.
    let url = std::fs::read_to_string(env.path("proxy-url")).expect("the proxy's URL");
    let port = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .expect("port")
        .parse::<u16>()
        .expect("a port");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    drop(hung);
}

#[test]
fn an_agent_that_hangs_up_mid_stream_still_gets_the_call_from_the_journal() {
    if !llm_clients() {
        return;
    }
    let (mut env, server) = llm_env();
    env.set("RELEASE", env.path("llm.port.release").to_string_lossy());
    let agent = env.write(
        "agent.py",
        r#"
import json, os, socket, urllib.parse
import openai
base = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "slow stream"}]})
raw = socket.create_connection((base.hostname, base.port))
raw.sendall((f"POST {base.path}/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
             f"content-length: {len(body)}\r\n\r\n{body}").encode())
seen = b""
while b"data:" not in seen:
    seen += raw.recv(65536)
raw.shutdown(socket.SHUT_RDWR)   # hangs up mid-stream
raw.close()
import time
time.sleep(0.3)
open(os.environ["RELEASE"], "w").close()
time.sleep(0.5)                  # the stream goes on to its end without the agent
# The stream went on to its end without the agent, and was recorded: the
# agent's retry is answered from the journal.
client = openai.OpenAI(api_key="k", max_retries=0)
stream = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "slow stream"}], stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
"#,
    );
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let counts = server.counts();
    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["status"], "committed");
    assert_eq!(text(&run.stdout), "first second\n");
    assert_eq!(
        counts["/v1/chat/completions slow stream"], 1,
        "the retry came from the journal"
    );
}

/// A resumed run that stops (SIGTERM) while its agent goes on: a request
/// the journal holds the answer to is refused like any other, not
/// replayed, and nothing goes upstream; the one replayed before the stop
/// is counted.
#[test]
fn a_recorded_request_after_the_run_stops_is_refused_not_replayed() {
    let (mut env, server) = llm_env();
    env.set("STARTED", env.path("started").to_string_lossy());
    let agent = env.write(
        "agent.py",
        r#"
import json, os, signal, sys, time, urllib.error, urllib.request
def ask(content):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body,
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status, answer.headers.get("x-durun-replayed"), ""
    except urllib.error.HTTPError as err:
        return err.code, None, json.load(err)["error"]["type"]
if os.environ.get("DURUN_RUN") == "1":
    ask("first"); ask("second")
    sys.exit(1)
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
print(*ask("first"))
open(os.environ["STARTED"], "w").close()
while not stopped:
    time.sleep(0.01)
print(*ask("second"))
"#,
    );
    let agent = agent.to_string_lossy().into_owned();
    let first = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert_eq!(first.status.code(), Some(1), "{}", text(&first.stderr));
    let before = server.counts();

    let mut durun = env.spawn(&["resume", "t"], "resume");
    crate::env::wait_for("the replayed call", Duration::from_secs(30), || {
        env.path("started").exists()
    });
    crate::env::signal(i32::try_from(durun.id()).expect("pid"), libc::SIGTERM);
    crate::env::wait_exit(&mut durun, Duration::from_secs(30));
    let said = std::fs::read_to_string(env.path("resume.out")).expect("the agent's prints");
    assert!(said.contains("200 true \n"), "the first replayed: {said}");
    assert!(
        said.contains("503 None durun_stopping\n"),
        "the second refused: {said}"
    );
    assert_eq!(server.counts(), before, "nothing went upstream again");
    let task = env.inspect("t");
    assert_eq!(task["task"]["runs"][1]["replayed_steps"], 1, "{task}");
}

/// A plain answer reaches the agent whole only once its step is durable
/// (SPEC 17). The agent holds the journal's write lock itself while it
/// calls, so durun's write waits; what it has read by then is counted.
#[test]
fn a_plain_answer_is_not_whole_at_the_agent_before_its_write() {
    let (env, server) = llm_env();
    if env.postgres.is_some() {
        crate::env::skipped(crate::env::SQLITE_ONLY);
        return;
    }
    env.write(
        "agent.py",
        r#"
import json, os, socket, sqlite3, urllib.parse
base = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "not yet"}]}).encode()
journal = sqlite3.connect(os.environ["DURUN_JOURNAL"], timeout=30, isolation_level=None)
journal.execute("BEGIN IMMEDIATE")
call = socket.create_connection((base.hostname, base.port))
call.sendall(b"POST %s/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (base.path.encode(), len(body), body))
call.settimeout(1.5)
got = b""
try:
    while True:
        more = call.recv(65536)
        if not more:
            break
        got += more
except socket.timeout:
    pass
held = len(got)
journal.execute("ROLLBACK")
call.settimeout(30)
while b"\r\n\r\n" not in got:
    more = call.recv(65536)
    if not more:
        raise SystemExit(f"the connection closed before the answer's head: {got!r}")
    got += more
head, _, whole = got.partition(b"\r\n\r\n")
length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length")))
while len(whole) < length:
    more = call.recv(65536)
    if not more:
        break
    whole += more
answer = json.loads(whole)["choices"][0]["message"]["content"]
with open("got.json", "w") as out:
    json.dump({"held": held, "head": len(head) + 4, "length": length, "whole": len(whole),
               "answer": answer}, out)
"#,
    );
    let output = env.durun(&["run", "--task", "not-yet", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let got: Value =
        serde_json::from_slice(&std::fs::read(env.path("got.json")).expect("got")).expect("JSON");
    let number = |name: &str| got[name].as_u64().expect("a number");
    assert!(number("length") > 100, "{got}");
    assert!(
        number("held") < number("head") + number("length"),
        "while the write waited the agent had less than the whole answer: {got}"
    );
    assert_eq!(number("whole"), number("length"), "{got}");
    assert_eq!(got["answer"], "echo: not yet", "{got}");
    let view = env.inspect("not-yet");
    assert_eq!(view["steps"][0]["status"], "committed", "{view}");
    assert_eq!(server.counts()["/v1/chat/completions not yet"], 1);
}
