//! SPEC 17's `durun mcp` under faults: its run gone, its server dead, a
//! reused request id, a batch, a message too large. The server is
//! `tests/agents/plain_mcp_server.py`, a bare JSON-RPC server that logs
//! every call it receives.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, read_json_lines, text, wait_exit};

/// `durun mcp` in front of the plain server, with a thread that hands
/// over each message it writes.
struct Relay {
    child: Child,
    input: ChildStdin,
    said: mpsc::Receiver<Value>,
}

impl Relay {
    fn start(env: &TestEnv, socket: Option<&std::path::Path>) -> Self {
        let mut command = env.command();
        if let Some(socket) = socket {
            command.env("DURUN_SOCKET", socket);
        }
        let mut child = command
            .args(["mcp", "--", "python3"])
            .arg(agents_dir().join("plain_mcp_server.py"))
            .arg(env.path("calls.jsonl"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("durun mcp");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, said) = mpsc::channel();
        std::thread::spawn(move || {
            for line in output.lines() {
                let Ok(line) = line else { return };
                if tx.send(serde_json::from_str(&line).expect("JSON")).is_err() {
                    return;
                }
            }
        });
        Self { child, input, said }
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.input, "{message}").expect("write to durun mcp");
    }

    fn next(&self) -> Value {
        self.said
            .recv_timeout(Duration::from_secs(30))
            .expect("an answer from durun mcp")
    }
}

fn call(id: u64, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {"n": id}}})
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}})
}

fn calls(env: &TestEnv) -> Vec<Value> {
    let path = env.path("calls.jsonl");
    if path.exists() {
        read_json_lines(&path)
    } else {
        Vec::new()
    }
}

#[test]
fn a_call_after_its_run_is_gone_is_refused_and_never_forwarded() {
    let env = TestEnv::new();
    let socket = env.path("run.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).expect("a socket");
    let mut relay = Relay::start(&env, Some(&socket));
    // The run takes the connection, then is gone.
    let (connection, _) = listener.accept().expect("durun mcp connects");
    drop(connection);
    drop(listener);
    relay.send(&initialize());
    assert_eq!(relay.next()["id"], 0);
    relay.send(&call(1, "echo"));
    let answer = relay.next();
    assert_eq!(answer["id"], 1, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("durun:") && message.contains("not forwarded"),
        "{answer}"
    );
    assert!(calls(&env).is_empty(), "forwarded: {:?}", calls(&env));
    drop(relay.input);
    wait_exit(&mut relay.child, Duration::from_secs(30));
}

#[test]
fn a_server_that_exits_fails_the_calls_in_flight_and_durun_mcp_exits_with_it() {
    let env = TestEnv::new();
    let mut relay = Relay::start(&env, None);
    relay.send(&initialize());
    assert_eq!(relay.next()["id"], 0);
    relay.send(&call(7, "die"));
    // Any request, not only a call, is answered when the server is gone.
    relay.send(&json!({"jsonrpc": "2.0", "id": 8, "method": "ping"}));
    let mut answered: Vec<Value> = (0..2).map(|_| relay.next()).collect();
    answered.sort_by_key(|answer| answer["id"].as_u64());
    assert_eq!(
        answered
            .iter()
            .map(|answer| answer["id"].clone())
            .collect::<Vec<_>>(),
        [json!(7), json!(8)]
    );
    for answer in &answered {
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("exited before it answered")),
            "{answer}"
        );
    }
    // The client's stdin is still open: durun mcp exits on its own.
    let status = wait_exit(&mut relay.child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(3));
}

#[test]
fn a_request_id_already_in_flight_is_refused() {
    let env = TestEnv::new();
    let mut relay = Relay::start(&env, None);
    relay.send(&call(5, "slow"));
    relay.send(&call(5, "echo"));
    let first = relay.next();
    assert_eq!(first["id"], 5);
    assert!(
        first["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("already in flight")),
        "{first}"
    );
    let second = relay.next();
    assert_eq!(
        second["result"]["content"][0]["text"], "{\"n\": 5}",
        "{second}"
    );
    let names: Vec<Value> = calls(&env)
        .iter()
        .map(|call| call["name"].clone())
        .collect();
    assert_eq!(names, [json!("slow")]);
    // Any request's id is in flight until its answer, not only a call's.
    relay.send(&call(9, "slow"));
    relay.send(&json!({"jsonrpc": "2.0", "id": 8, "method": "ping"}));
    relay.send(&call(8, "echo"));
    let refused = relay.next();
    assert_eq!(refused["id"], 8, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("already in flight")),
        "{refused}"
    );
    let mut rest: Vec<Value> = (0..2).map(|_| relay.next()).collect();
    rest.sort_by_key(|answer| answer["id"].as_u64());
    assert_eq!(rest[0]["error"]["message"], "no such method", "{rest:?}");
    assert_eq!(rest[1]["id"], 9, "{rest:?}");
    let names: Vec<Value> = calls(&env)
        .iter()
        .map(|call| call["name"].clone())
        .collect();
    assert_eq!(
        names,
        [json!("slow"), json!("slow")],
        "the echo was not forwarded"
    );
    drop(relay.input);
    wait_exit(&mut relay.child, Duration::from_secs(30));
}

#[test]
fn a_batch_is_journaled_call_by_call_and_a_message_too_large_is_refused() {
    let env = TestEnv::new();
    env.write("durun.toml", "[mcp]\nmax_message = 2000\n");
    let server = agents_dir().join("plain_mcp_server.py");
    env.write(
        "agent.py",
        &format!(
            r#"
import json, subprocess, sys
relay = subprocess.Popen(["durun", "mcp", "--", "python3", {server:?}, "calls.jsonl"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def send(message):
    relay.stdin.write(json.dumps(message) + "\n")
    relay.stdin.flush()
    return json.loads(relay.stdout.readline())
said = [send({{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {{}}}})]
call = lambda id: {{"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {{"name": "echo", "arguments": {{"n": id}}}}}}
said.append(send([call(1), call(2)]))
said.append(send({{"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                   "params": {{"name": "echo", "arguments": {{"pad": "x" * 5000}}}}}}))
said.append(send(call(4)))
relay.stdin.close()
relay.wait()
print(json.dumps(said[1:]))
"#
        ),
    );
    let output = env.durun(&["run", "--task", "batch", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let said: Value = serde_json::from_slice(&output.stdout).expect("the agent's print");
    let batch = said[0].as_array().expect("a batch answered as a batch");
    assert_eq!(batch.len(), 2, "{said}");
    assert_eq!(said[1]["id"], Value::Null, "{said}");
    assert!(
        said[1]["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("max_message")),
        "{said}"
    );
    assert_eq!(said[2]["id"], 4, "the next message is relayed: {said}");
    let view = env.inspect("batch");
    let names: Vec<&str> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["mcp plain/echo"; 3], "{view}");
    let keys: Vec<Value> = calls(&env).iter().map(|call| call["key"].clone()).collect();
    assert_eq!(keys.len(), 3);
    assert!(
        keys.iter().all(Value::is_string),
        "each call carried its key: {keys:?}"
    );
}
