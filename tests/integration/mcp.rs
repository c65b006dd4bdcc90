//! `durun mcp` (SPEC 13) in front of real MCP servers: a FastMCP server
//! (the official `mcp` Python SDK) over stdio and streamable HTTP, and the
//! reference memory server from npm, driven by the official `mcp` client.

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, read_json_lines, sigkill_once, text, wait_for};

/// Whether the `mcp` package is installed: `.ci/run` installs it and sets
/// `DURUN_TEST_MCP=1`, which makes its absence a failure.
pub(crate) fn mcp_sdk() -> bool {
    crate::env::python_has(
        "mcp.server.fastmcp, mcp.client.stdio",
        "DURUN_TEST_MCP",
        "'mcp<2'",
    )
}

fn agent() -> String {
    agents_dir()
        .join("mcp_agent.py")
        .to_string_lossy()
        .into_owned()
}

fn server() -> String {
    agents_dir()
        .join("mcp_server.py")
        .to_string_lossy()
        .into_owned()
}

fn mcp_env() -> TestEnv {
    let mut env = TestEnv::new();
    env.set(
        "DURUN_BIN",
        assert_cmd::cargo::cargo_bin("durun").to_string_lossy(),
    );
    env
}

#[test]
fn a_mutating_tool_killed_mid_call_is_retried_with_the_same_key_and_reads_replay() {
    if !mcp_sdk() {
        return;
    }
    let mut env = mcp_env();
    let calls = env.path("calls.jsonl");
    let hold = env.path("hold");
    env.set(
        "MCP_SERVER",
        json!(["python3", server(), "stdio", calls, hold]).to_string(),
    );
    let mut durun = env.spawn(&["run", "--task", "t", "--", "python3", &agent()], "run");
    wait_for("the create_issue call", Duration::from_secs(60), || {
        env.path("hold.reached").exists()
    });
    let task = env.inspect("t");
    assert_eq!(task["steps"][0]["name"], "mcp tracker/lookup");
    assert_eq!(task["steps"][0]["effect"], "read", "readOnlyHint");
    assert_eq!(task["steps"][1]["name"], "mcp tracker/create_issue");
    assert_eq!(task["steps"][1]["effect"], "mutate");
    assert_eq!(
        task["steps"][1]["status"], "pending",
        "journaled before the call"
    );
    let key = task["steps"][1]["idempotency_key"].clone();
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    std::fs::write(&hold, "").expect("release");

    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let printed: Value = serde_json::from_slice(&resumed.stdout).expect("the agent's print");
    assert_eq!(
        printed["got"],
        json!([["facts about crashes"], ["issue-1"]])
    );
    let seen = read_json_lines(&calls);
    let lookups = seen.iter().filter(|call| call["tool"] == "lookup").count();
    assert_eq!(lookups, 1, "the lookup replayed: {seen:?}");
    let creates: Vec<&Value> = seen
        .iter()
        .filter(|call| call["tool"] == "create_issue")
        .collect();
    assert_eq!(creates.len(), 2, "{seen:?}");
    assert!(
        creates.iter().all(|call| call["key"] == key),
        "the same key both times: {seen:?}"
    );
    assert_eq!(seen[0]["key"], Value::Null, "a read carries no key");
    let task = env.inspect("t");
    assert_eq!(task["steps"][1]["status"], "committed");
    assert_eq!(task["steps"][1]["attempts"], 2);
    assert_eq!(task["steps"][1]["output"]["content"][0]["text"], "issue-1");
}

#[test]
fn the_streamable_http_transport_its_get_stream_and_durun_toml_overrides() {
    if !mcp_sdk() {
        return;
    }
    let mut env = mcp_env();
    let port_file = env.path("mcp.port");
    let calls = env.path("calls.jsonl");
    let mut server = std::process::Command::new("python3")
        .args([
            server(),
            "http".into(),
            port_file.to_string_lossy().into_owned(),
        ])
        .arg(&calls)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the MCP server");
    wait_for("the MCP server", Duration::from_secs(30), || {
        port_file.exists()
    });
    let port = std::fs::read_to_string(&port_file).expect("port");
    env.set("MCP_URL", format!("http://127.0.0.1:{port}/mcp"));
    // An operator who knows better than the server's annotations.
    env.write(
        "durun.toml",
        "[mcp.tracker]\nmutate = [\"lookup\"]\nread = [\"create_issue\"]\n",
    );
    // The server's own messages come on the GET stream durun opens.
    env.set("MCP_AWAIT_NOTICE", "1");
    // The section is the one `--name` names. Without it, the server's
    // calling itself `tracker` does not choose it (SPEC 17): its
    // annotations decide, and durun says why the section was passed by.
    let unnamed = env.durun(&["run", "--task", "unnamed", "--", "python3", &agent()]);
    assert!(unnamed.status.success(), "{}", text(&unnamed.stderr));
    assert!(
        text(&unnamed.stderr).contains("does not choose `[mcp.tracker]`"),
        "{}",
        text(&unnamed.stderr)
    );
    let task = env.inspect("unnamed");
    assert_eq!(task["steps"][0]["effect"], "read", "{task}");
    assert_eq!(task["steps"][1]["effect"], "mutate", "{task}");
    std::fs::remove_file(&calls).expect("the calls so far");
    env.set("MCP_NAME", "tracker");
    let run = env.durun(&["run", "--task", "t", "--", "python3", &agent()]);
    let _ = server.kill();
    let _ = server.wait();
    assert!(run.status.success(), "{}", text(&run.stderr));
    let printed: Value = serde_json::from_slice(&run.stdout).expect("the agent's print");
    assert_eq!(
        printed["got"],
        json!([["facts about crashes"], ["issue-2"]]),
        "the unnamed run made the server's first issue"
    );
    assert!(
        printed["announced_after"].is_u64(),
        "the server's notification never reached the client: {printed}"
    );
    let task = env.inspect("t");
    assert_eq!(task["steps"][0]["effect"], "mutate");
    assert_eq!(task["steps"][1]["effect"], "read");
    let seen = read_json_lines(&calls);
    assert_eq!(seen[0]["key"], task["steps"][0]["idempotency_key"]);
    assert_eq!(seen[1]["key"], Value::Null);
}

#[test]
fn outside_a_run_it_relays_and_says_so_once() {
    if !mcp_sdk() {
        return;
    }
    let env = mcp_env();
    let calls = env.path("calls.jsonl");
    let input = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "create_issue", "arguments": {"title": "x"}}}),
    ]
    .iter()
    .fold(String::new(), |mut lines, message| {
        lines.push_str(&message.to_string());
        lines.push('\n');
        lines
    });
    let mut mcp = env
        .command()
        .args(["mcp", "--", "python3", &server(), "stdio"])
        .arg(&calls)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("durun mcp");
    let mut stdin = mcp.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, input.as_bytes()).expect("the requests");
    // The end of input comes once both answers are out: the call's answer
    // is not lost to a client that stops writing.
    let stdout = mcp.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let answers: Vec<Value> = (0..2)
        .map(|_| {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    let _ = mcp.kill();
                    panic!("durun mcp did not answer")
                });
            serde_json::from_str(&line).expect("JSON-RPC")
        })
        .collect();
    drop(stdin);
    let output = mcp.wait_with_output().expect("durun mcp");
    let stderr = text(&output.stderr);
    assert_eq!(
        stderr.matches("not inside a durun run").count(),
        1,
        "{stderr}"
    );
    // The reader's end of the channel closes at the end of output.
    let more = rx.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(more, Err(std::sync::mpsc::RecvTimeoutError::Disconnected)),
        "one answer a request: {more:?}"
    );
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["result"]["serverInfo"]["name"], "tracker");
    assert_eq!(answers[1]["result"]["content"][0]["text"], "issue-1");
    assert_eq!(
        read_json_lines(&calls)[0]["key"],
        Value::Null,
        "no key outside a run"
    );
}

/// The reference memory server from npm, which `.ci/run` installs and
/// names in `DURUN_TEST_MCP_MEMORY` (its entry point).
#[test]
fn the_npm_memory_server_behind_durun_mcp_replays_on_resume() {
    if !mcp_sdk() {
        return;
    }
    let Ok(memory) = std::env::var("DURUN_TEST_MCP_MEMORY") else {
        assert!(
            std::env::var("DURUN_TEST_MCP").is_err(),
            "DURUN_TEST_MCP is set but DURUN_TEST_MCP_MEMORY is not"
        );
        crate::env::skipped(
            "set DURUN_TEST_MCP_MEMORY to @modelcontextprotocol/server-memory's dist/index.js",
        );
        return;
    };
    let mut env = mcp_env();
    let store = env.path("memory.jsonl");
    env.set(
        "MCP_SERVER",
        json!([
            "env",
            format!("MEMORY_FILE_PATH={}", store.display()),
            "node",
            memory
        ])
        .to_string(),
    );
    env.set(
        "MCP_CALLS",
        json!([
            ["create_entities", {"entities": [{"name": "durun", "entityType": "tool", "observations": ["journals steps"]}]}],
            ["read_graph", {}],
        ])
        .to_string(),
    );
    let agent = env.write(
        "agent.py",
        &format!(
            "import os, runpy\nrunpy.run_path({:?})\nif os.environ['DURUN_RUN'] == '1':\n    raise SystemExit(3)\n",
            agent()
        ),
    );
    let run = env.run_python("t", &agent);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let first: Value = serde_json::from_slice(&run.stdout).expect("print");
    let stored = std::fs::read_to_string(&store).expect("the memory file");
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let second: Value = serde_json::from_slice(&resumed.stdout).expect("print");
    assert_eq!(
        second["got"], first["got"],
        "the same answers, from the journal"
    );
    assert_eq!(
        std::fs::read_to_string(&store).expect("the memory file"),
        stored,
        "the entity was not created twice"
    );
    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(
        steps[0]["name"]
            .as_str()
            .unwrap()
            .ends_with("/create_entities"),
        "{steps:?}"
    );
    assert_eq!(steps[0]["effect"], "mutate");
    assert_eq!(task["task"]["runs"][1]["replayed_steps"], 2);
}

/// Whether the OpenAI Agents SDK is installed (with the same rule as the
/// other real packages).
fn agents_sdk() -> bool {
    crate::env::python_has("agents.mcp", "DURUN_TEST_MCP", "openai-agents")
}

#[test]
fn an_agents_sdk_loop_with_a_function_tool_and_an_mcp_server_replays_whole() {
    if !mcp_sdk() || !agents_sdk() {
        return;
    }
    let mut env = mcp_env();
    let llm = crate::servers::LlmServer::start(&env);
    env.set("OPENAI_BASE_URL", format!("{}/v1", llm.base()));
    env.set("OPENAI_API_KEY", "sk-agents-secret");
    let calls = env.path("calls.jsonl");
    let hold = env.path("hold");
    let server_argv = json!(["python3", server(), "stdio", calls, hold]).to_string();
    let agent = agents_dir().join("agents_sdk.py");
    let agent = agent.to_string_lossy();
    let mut durun = env.spawn(
        &["run", "--task", "t", "--", "python3", &agent, &server_argv],
        "run",
    );
    sigkill_once(
        &mut durun,
        "the create_issue call",
        Duration::from_secs(90),
        || env.path("hold.reached").exists(),
    );
    let before = llm.counts();
    assert_eq!(
        before.as_object().map(serde_json::Map::len),
        Some(3),
        "three model turns before the kill: {before}"
    );
    std::fs::write(&hold, "").expect("release");

    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(
        text(&resumed.stdout).trim(),
        "done: 5 / [{'type': 'text', 'text': 'facts about crashes'}] / [{'type': 'text', 'text': 'issue-1'}]"
    );
    let after = llm.counts();
    assert_eq!(
        after.as_object().map(serde_json::Map::len),
        Some(4),
        "{after}"
    );
    assert!(
        after.as_object().unwrap().values().all(|count| count == 1),
        "no model turn was sent twice: {after}"
    );
    let seen = read_json_lines(&calls);
    let tools: Vec<&str> = seen
        .iter()
        .map(|call| call["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["lookup", "create_issue", "create_issue"],
        "{seen:?}"
    );
    assert_eq!(seen[1]["key"], seen[2]["key"]);
    let task = env.inspect("t");
    let kinds: Vec<&str> = task["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["proxy", "proxy", "mcp", "proxy", "mcp", "proxy"],
        "{task}"
    );
}

/// SPEC 18: a tool that runs inside the agent's own process (an Agents SDK
/// `@function_tool`) is no request durun sees: it runs again on resume. The
/// one line `@durun.step(NAME, effect="mutate")` under `@function_tool`
/// makes it a journaled step, answered from the journal on resume.
#[test]
fn an_in_process_tool_runs_again_on_resume_unless_it_is_a_durun_step() {
    if !agents_sdk() {
        return;
    }
    let mut env = mcp_env();
    let llm = crate::servers::LlmServer::start(&env);
    env.set("OPENAI_BASE_URL", format!("{}/v1", llm.base()));
    env.set("OPENAI_API_KEY", "sk-agents-secret");
    env.set("PYTHONPATH", crate::env::sdk_path());
    let notes = env.path("notes");
    env.set("NOTES", notes.to_string_lossy());
    let agent = agents_dir().join("agents_sdk_tools.py");
    let agent = agent.to_string_lossy();
    let first = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    // The SDK keeps the agent's prints off its protocol pipe: on stderr.
    assert!(
        text(&resumed.stderr).contains("done: noted / noted / alive"),
        "{}",
        text(&resumed.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&notes).expect("notes"),
        "plain\njournaled\nplain\n",
        "the plain tool wrote twice, the journaled one once"
    );
    // Three turns before the crash, the last one after: none sent twice.
    let sent: u64 = llm
        .counts()
        .as_object()
        .unwrap()
        .values()
        .filter_map(serde_json::Value::as_u64)
        .sum();
    assert_eq!(sent, 4, "{}", llm.counts());
}
