//! `durun mcp-server` (SPEC 22) driven by the official MCP Python client:
//! each tool answers what its command prints with `--json`, read tools
//! say they only read and `cancel` that it destroys; `durun skill
//! install` writes the skill.

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, text};
use crate::waiting::{run, waiter_args, waiter_env};

/// Three tasks: `alpha` completed in two steps, `waits` parked on a
/// signal, `budget` stopped over its token budget.
fn three_tasks(env: &TestEnv) {
    let done = run(
        env,
        &waiter_args(env, "alpha", &json!([{"step": "x"}, {"step": "y"}]), &[]),
    );
    assert!(done.status.success(), "{}", text(&done.stderr));
    let parked = run(
        env,
        &waiter_args(
            env,
            "waits",
            &json!([{"step": "x"}, {"wait": "go"}]),
            &["--park-after", "0s"],
        ),
    );
    assert_eq!(parked.status.code(), Some(77), "{}", text(&parked.stderr));
    let over = run(
        env,
        &waiter_args(
            env,
            "budget",
            &json!([{"step": "a", "tokens": 100}, {"step": "b", "tokens": 100}, {"step": "c"}]),
            &["--max-tokens", "150"],
        ),
    );
    assert_eq!(over.status.code(), Some(78), "{}", text(&over.stderr));
}

#[test]
fn an_mcp_client_lists_inspects_forks_resumes_diffs_and_approves_as_the_commands_do() {
    if !crate::mcp::mcp_sdk() {
        return;
    }
    let env = waiter_env();
    three_tasks(&env);
    let calls = json!([
        {"tool": "list_tasks", "arguments": {}, "then": ["inspect", "--json"]},
        {"tool": "list_tasks", "arguments": {"status": "waiting"}, "then": ["inspect", "--json", "--status", "waiting"]},
        {"tool": "list_tasks", "arguments": {"search": "alph"}},
        {"tool": "inspect_task", "arguments": {"task": "alpha"}, "then": ["inspect", "alpha", "--json"]},
        {"tool": "inspect_step", "arguments": {"task": "alpha", "step": 2}, "then": ["inspect", "alpha", "--step", "2", "--json"]},
        {"tool": "fork", "arguments": {"task": "alpha", "at": 2, "new_task": "alpha-fork"}, "then": ["inspect", "alpha-fork", "--json"]},
        {"tool": "resume", "arguments": {"task": "alpha-fork"}, "then": ["inspect", "alpha-fork", "--json"]},
        {"tool": "diff", "arguments": {"a": "alpha", "b": "alpha-fork"}, "then": ["diff", "alpha", "alpha-fork", "--json"]},
        {"tool": "signal", "arguments": {"task": "waits", "name": "go", "data": {"ok": 1}}, "then": ["inspect", "waits", "--json"]},
        {"tool": "approve", "arguments": {"task": "budget", "add_tokens": 1000}, "then": ["inspect", "budget", "--json"]},
        {"tool": "cancel", "arguments": {"task": "waits"}, "then": ["inspect", "waits", "--json"]},
        {"tool": "inspect_task", "arguments": {"task": "--version"}},
        {"tool": "test", "arguments": {"command": ["python3", agents_dir().join("waiter.py"), env.write("one.json", r#"[{"step": "x"}]"#)]}},
    ]);
    let answered = mcp_client(&env, &calls);
    assert_eq!(answered["server"], "durun");
    check_tools(answered["tools"].as_array().expect("tools"));
    let results = answered["results"].as_array().expect("results");
    for (call, result) in calls.as_array().expect("calls").iter().zip(results) {
        if call.get("then").is_none() {
            continue;
        }
        assert_eq!(result["is_error"], false, "{call}: {result}");
        assert_eq!(result["structured"], result["direct"], "{call}");
        // The text is the same JSON, for clients that read no structure.
        let said: Value =
            serde_json::from_str(result["text"][0].as_str().expect("text")).expect("JSON");
        assert_eq!(said, result["structured"], "{call}");
    }
    let searched = &results[2]["structured"]["tasks"];
    assert_eq!(searched.as_array().map(Vec::len), Some(1), "{searched}");
    assert_eq!(searched[0]["id"], "alpha");
    assert_eq!(results[6]["structured"]["task"]["status"], "completed");
    assert_eq!(
        results[8]["structured"]["task"]["signals"][0]["name"], "go",
        "{}",
        results[8]
    );
    assert_eq!(results[9]["structured"]["task"]["max_tokens"], 1150);
    assert_eq!(results[10]["structured"]["task"]["status"], "cancelled");
    // The crash test of a one-step agent: a reference and three trials.
    let tested = &results[12];
    assert_eq!(tested["is_error"], false, "{tested}");
    assert_eq!(tested["structured"]["ok"], true, "{tested}");
    assert_eq!(
        tested["structured"]["trials"].as_array().map(Vec::len),
        Some(3),
        "{tested}"
    );
    // An id that looks like an option is an id: no such task.
    let unknown = &results[11];
    assert_eq!(unknown["is_error"], true, "{unknown}");
    assert!(
        unknown["text"][0]
            .as_str()
            .is_some_and(|said| said.contains("--version")),
        "{unknown}"
    );
}

#[test]
fn skill_install_writes_the_skill_with_its_front_matter() {
    let env = TestEnv::new();
    let installed = env.durun(&["skill", "install", "--dir", "skills/durun"]);
    assert!(installed.status.success(), "{}", text(&installed.stderr));
    assert!(text(&installed.stderr).contains("wrote the durun skill to skills/durun/SKILL.md"));
    let skill = std::fs::read_to_string(env.path("skills/durun/SKILL.md")).expect("SKILL.md");
    assert!(
        skill.starts_with("---\nname: durun\ndescription: "),
        "{skill}"
    );
    assert!(skill.contains("durun mcp-server"));
    let default = env.durun(&["skill", "install"]);
    assert!(default.status.success(), "{}", text(&default.stderr));
    assert!(env.path(".claude/skills/durun/SKILL.md").exists());
}

/// A long call (a `resume` whose agent waits) does not hold back the
/// client's other calls: the inspection is answered while the resume runs,
/// and the resume ends once the agent may go on.
#[test]
fn a_long_call_does_not_hold_back_the_calls_after_it() {
    if !crate::mcp::mcp_sdk() {
        return;
    }
    let env = waiter_env();
    let go = env.path("go");
    let args = waiter_args(&env, "slow", &json!([{"step": "x"}, {"hold": go}]), &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = env.spawn(&args, "first");
    crate::env::wait_for(
        "the agent to hold",
        std::time::Duration::from_secs(30),
        || crate::waiting::ran(&env).contains(&"hold".to_owned()),
    );
    first.kill().expect("SIGKILL durun");
    first.wait().expect("reap");
    let calls = json!([
        {"tool": "resume", "arguments": {"task": "slow"}, "background": true},
        {"tool": "inspect_task", "arguments": {"task": "slow"}, "touch": go},
    ]);
    let answered = mcp_client(&env, &calls);
    let results = answered["results"].as_array().expect("results");
    // The inspection first, answered while the resume ran; then the resume.
    let shown = &results[0]["structured"]["task"]["status"];
    assert!(shown == "running" || shown == "interrupted", "{shown}");
    assert_eq!(results[1]["is_error"], false, "{}", results[1]);
    assert_eq!(results[1]["structured"]["task"]["status"], "completed");
}

/// The same client on the streamable HTTP transport (`durun mcp-server
/// --listen`): the same answers; a request without the token is refused.
#[test]
fn mcp_server_listen_serves_the_same_tools_over_http_to_a_bearer_of_its_token() {
    if !crate::mcp::mcp_sdk() {
        return;
    }
    let mut env = waiter_env();
    three_tasks(&env);
    let mut server = env.spawn(&["mcp-server", "--listen", "127.0.0.1:0"], "server");
    let printed = || std::fs::read_to_string(env.path("server.out")).unwrap_or_default();
    crate::env::wait_for(
        "the URL and the token",
        std::time::Duration::from_secs(30),
        || printed().lines().count() >= 2,
    );
    let printed = printed();
    let mut lines = printed.lines();
    let (url, token) = (
        lines.next().expect("url").to_owned(),
        lines.next().expect("token").to_owned(),
    );
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    let refused = unauthorized(&url);
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    env.set("MCP_URL", &url);
    env.set("MCP_TOKEN", &token);
    let calls = json!([
        {"tool": "list_tasks", "arguments": {}, "then": ["inspect", "--json"]},
        {"tool": "inspect_task", "arguments": {"task": "budget"}, "then": ["inspect", "budget", "--json"]},
        {"tool": "approve", "arguments": {"task": "budget", "add_tokens": 10}, "then": ["inspect", "budget", "--json"]},
    ]);
    let answered = mcp_client(&env, &calls);
    check_tools(answered["tools"].as_array().expect("tools"));
    for (call, result) in calls
        .as_array()
        .expect("calls")
        .iter()
        .zip(answered["results"].as_array().expect("results"))
    {
        assert_eq!(result["is_error"], false, "{call}: {result}");
        assert_eq!(result["structured"], result["direct"], "{call}");
    }
    crate::env::signal(i32::try_from(server.id()).expect("pid"), libc::SIGTERM);
    crate::env::wait_exit(&mut server, std::time::Duration::from_secs(30));
}

/// A POST to `url` without the token: the status line and the rest.
fn unauthorized(url: &str) -> String {
    use std::io::{Read as _, Write as _};
    let address = url.trim_start_matches("http://").trim_end_matches("/mcp");
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut said = String::new();
    stream.read_to_string(&mut said).expect("read");
    said
}

/// Runs tests/agents/mcp_server_client.py with `calls`, as durun's own
/// commands run (the same journal): what it printed.
fn mcp_client(env: &TestEnv, calls: &Value) -> Value {
    let calls_file = env.write("calls.json", &calls.to_string());
    // The client starts `durun mcp-server` as durun's own commands start,
    // on the same journal.
    let durun = env.command();
    let mut client = std::process::Command::new("python3");
    client.env_clear();
    for (name, value) in durun.get_envs() {
        if let Some(value) = value {
            client.env(name, value);
        }
    }
    let client = client
        .current_dir(env.path(""))
        .arg(agents_dir().join("mcp_server_client.py"))
        .arg(&calls_file)
        .output()
        .expect("python3");
    assert!(client.status.success(), "{}", text(&client.stderr));
    let answered: Value = serde_json::from_slice(&client.stdout).expect("the client's JSON");

    answered
}

/// The tools, in order, with their hints and output schema.
fn check_tools(tools: &[Value]) {
    let names: Vec<&str> = tools
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "list_tasks",
            "inspect_task",
            "inspect_step",
            "diff",
            "resume",
            "fork",
            "approve",
            "signal",
            "cancel",
            "test"
        ]
    );
    let hint = |name: &str, hint: &str| {
        tools
            .iter()
            .find(|tool| tool["name"] == name)
            .expect("tool")["annotations"][hint]
            .clone()
    };
    for read in ["list_tasks", "inspect_task", "inspect_step", "diff"] {
        assert_eq!(hint(read, "readOnlyHint"), true, "{read}");
    }
    assert_eq!(hint("resume", "readOnlyHint"), false);
    assert_eq!(hint("cancel", "destructiveHint"), true);
    assert!(
        tools
            .iter()
            .all(|tool| tool["outputSchema"]["type"] == "object")
    );
}
