//! MCP Tasks through `durun mcp` (SPEC 22), driven by the official `mcp`
//! Python client's task API against a FastMCP server that counts its
//! effects per idempotency key, across restarts.

use serde_json::Value;

use crate::env::{TestEnv, agents_dir, read_json_lines, text};
use crate::mcp::mcp_sdk;

fn agent() -> String {
    agents_dir()
        .join("mcp_tasks_agent.py")
        .to_string_lossy()
        .into_owned()
}

/// An environment for the agent: `DURUN_BIN` for its `durun mcp`, and
/// its working directory `work`; the directory, as the agent's argument.
fn agent_env() -> (TestEnv, String) {
    let mut env = TestEnv::new();
    env.set(
        "DURUN_BIN",
        assert_cmd::cargo::cargo_bin("durun").to_string_lossy(),
    );
    let dir = env.path("work");
    std::fs::create_dir_all(&dir).expect("work dir");
    (env, dir.to_string_lossy().into_owned())
}

/// The last JSON line `output` printed: what the agent fetched.
fn printed(output: &std::process::Output) -> Value {
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .expect("the agent's print")
}

/// Runs task `t`: the agent in `mode` (none: the three breaks).
fn run_agent(env: &TestEnv, dir: &str, mode: Option<&str>) -> Value {
    let agent = agent();
    let mut args = vec!["run", "--task", "t", "--", "python3", &agent, dir];
    args.extend(mode);
    printed(&env.durun(&args))
}

/// Runs the agent's three breaks (a killed client, a killed `durun mcp`, a
/// cut server connection), with `[mcp.tracker] probe` or without: what
/// each client fetched, checked; the task ids, and the steps.
fn three_breaks(probe: bool) -> (TestEnv, Vec<Value>, Vec<Value>) {
    let (env, dir) = agent_env();
    if probe {
        env.write("durun.toml", "[mcp.tracker]\nprobe = \"issue_by_key\"\n");
    }
    let printed = run_agent(&env, &dir, None);

    // Each client got its task's result with tasks/result, after its break.
    let mut tasks = Vec::new();
    for (phase, issue) in [("one", "issue-1"), ("two", "issue-2"), ("three", "issue-3")] {
        let fetched = &printed[phase];
        assert_eq!(fetched["text"], issue, "{phase}: {printed}");
        assert_eq!(fetched["status"], "completed", "{phase}: {printed}");
        assert_eq!(fetched["related"]["taskId"], fetched["task"], "{phase}");
        assert_eq!(fetched["tasks_capability"], true, "{phase}: declared");
        assert_eq!(
            fetched["listed"],
            serde_json::json!([fetched["task"]]),
            "{phase}"
        );
        tasks.push(fetched["task"].clone());
    }
    assert_eq!(printed["three"]["task_support"], "optional");

    // One effect per task at the server, keyed by the task's id.
    let applied = read_json_lines(&env.path("work/applied.jsonl"));
    let keys: Vec<Value> = applied.iter().map(|line| line["key"].clone()).collect();
    assert_eq!(
        keys, tasks,
        "one effect per task, keyed by its id: {applied:?}"
    );

    // Each task is its step, and its id the step's key.
    let inspected = env.inspect("t");
    let steps: Vec<Value> = inspected["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["name"] == "mcp tracker/create_issue")
        .cloned()
        .collect();
    assert_eq!(steps.len(), 3, "{inspected}");
    for (step, task) in steps.iter().zip(&tasks) {
        assert_eq!(step["status"], "committed", "{step}");
        assert_eq!(&step["idempotency_key"], task);
    }
    assert_eq!(
        steps[0]["attempts"], 1,
        "the first ran on without its client"
    );
    (env, tasks, steps)
}

#[test]
fn a_task_survives_a_killed_client_a_killed_durun_mcp_and_a_cut_server_connection() {
    if !mcp_sdk() {
        return;
    }
    let (env, tasks, steps) = three_breaks(false);
    assert_eq!(steps[1]["attempts"], 2, "sent again after durun mcp died");
    // Without a probe, the calls in doubt went again with their keys.
    let calls: Vec<Value> = read_json_lines(&env.path("work/applied.jsonl.calls"))
        .into_iter()
        .map(|call| call["key"].clone())
        .collect();
    let times: Vec<usize> = tasks
        .iter()
        .map(|task| calls.iter().filter(|key| *key == task).count())
        .collect();
    assert_eq!(times, [1, 2, 2], "{calls:?}");
}

#[test]
fn with_a_probe_each_task_s_tool_runs_once_through_all_three_breaks() {
    if !mcp_sdk() {
        return;
    }
    let (env, tasks, steps) = three_breaks(true);
    let calls: Vec<Value> = read_json_lines(&env.path("work/applied.jsonl.calls"))
        .into_iter()
        .map(|call| call["key"].clone())
        .collect();
    assert_eq!(calls, tasks, "the tool ran once per task: {calls:?}");
    assert_eq!(steps[0]["resolution"], Value::Null);
    for step in &steps[1..] {
        assert_eq!(step["resolution"], "reconciled", "{step}");
        assert_eq!(step["attempts"], 1, "{step}");
    }
}

/// Runs the agent's `resumed` mode: it starts a task whose tool holds
/// (after its effect, or `before` it), durun is killed with SIGKILL, and
/// the resumed agent's client fetches the task by the id it kept. What it
/// fetched, the task's id, and the task's one step.
fn killed_then_fetched(probe: bool, hold_before: bool) -> (TestEnv, Value, String, Value) {
    let (mut env, dir) = agent_env();
    if probe {
        env.write("durun.toml", "[mcp.tracker]\nprobe = \"issue_by_key\"\n");
    }
    if hold_before {
        env.set("HOLD_BEFORE", "1");
    }
    let agent = agent();
    let mut durun = env.spawn(
        &[
            "run", "--task", "t", "--", "python3", &agent, &dir, "resumed",
        ],
        "run",
    );
    // The client keeps its task's id once it has it: the run is killed
    // after that, or its resume would have no task to fetch.
    crate::env::wait_for(
        "the tool's call, and its task's id kept",
        std::time::Duration::from_secs(60),
        || env.path("work/hold.reached").exists() && env.path("work/task").exists(),
    );
    let server: i32 = std::fs::read_to_string(env.path("work/hold.reached"))
        .expect("the server's pid")
        .parse()
        .expect("a pid");
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    // The run's processes end with it, but not in the same instant: the
    // held tool is released once its server is gone, so that it never
    // goes on to its effect (a loaded machine showed it could).
    crate::env::wait_for(
        "the killed run's MCP server to end",
        std::time::Duration::from_secs(30),
        || crate::env::process_gone(server),
    );
    std::fs::write(env.path("work/hold"), "").expect("release");

    let fetched = printed(&env.durun(&["resume", "t"]));
    let task = std::fs::read_to_string(env.path("work/task")).expect("the task id");
    assert_eq!(fetched["task"], task.as_str());
    assert_eq!(fetched["text"], "issue-1", "{fetched}");
    assert_eq!(fetched["status"], "completed");
    let applied = read_json_lines(&env.path("work/applied.jsonl"));
    assert_eq!(applied.len(), 1, "applied once: {applied:?}");
    assert_eq!(applied[0]["key"], task.as_str());
    let inspected = env.inspect("t");
    let step = inspected["steps"][0].clone();
    assert_eq!(step["idempotency_key"], task.as_str());
    assert_eq!(step["status"], "committed");
    (env, fetched, task, step)
}

/// How many times the server's `create_issue` was called.
fn calls(env: &TestEnv) -> usize {
    read_json_lines(&env.path("work/applied.jsonl.calls")).len()
}

#[test]
fn a_task_whose_run_was_killed_is_fetched_by_its_id_after_resume_and_applied_once() {
    if !mcp_sdk() {
        return;
    }
    let (env, _, _, step) = killed_then_fetched(false, false);
    assert_eq!(
        step["attempts"], 2,
        "sent again, with its key, in the new run"
    );
    assert_eq!(calls(&env), 2);
}

#[test]
fn a_call_in_doubt_that_took_effect_is_reconciled_by_the_servers_probe_tool() {
    if !mcp_sdk() {
        return;
    }
    let (env, _, _, step) = killed_then_fetched(true, false);
    assert_eq!(calls(&env), 1, "the probe settled it: not sent again");
    assert_eq!(step["resolution"], "reconciled", "{step}");
    assert_eq!(step["attempts"], 1);
    assert_eq!(step["output"]["content"][0]["text"], "issue-1");
}

#[test]
fn a_call_in_doubt_that_never_took_effect_goes_again_with_its_key_once_the_probe_says_so() {
    if !mcp_sdk() {
        return;
    }
    let (env, _, task, step) = killed_then_fetched(true, true);
    let seen = read_json_lines(&env.path("work/applied.jsonl.calls"));
    assert_eq!(
        seen.len(),
        2,
        "held before its effect, then sent again: {seen:?}"
    );
    assert!(
        seen.iter().all(|call| call["key"] == task.as_str()),
        "{seen:?}"
    );
    assert_eq!(step["resolution"], Value::Null, "{step}");
    assert_eq!(step["attempts"], 2);
}

#[test]
fn a_task_is_relayed_to_a_server_with_tasks_of_its_own_and_its_result_journaled() {
    if !mcp_sdk() {
        return;
    }
    let (env, dir) = agent_env();
    let fetched = run_agent(&env, &dir, Some("native"));
    assert_eq!(fetched["text"], "issue for native", "{fetched}");
    assert_eq!(fetched["status"], "completed");
    let seen = read_json_lines(&env.path("work/calls.jsonl"));
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["as_task"], true, "relayed as a task: {seen:?}");
    assert_eq!(seen[0]["key"], fetched["task"], "with the step's key");
    let step = &env.inspect("t")["steps"][0];
    assert_eq!(step["status"], "committed");
    assert_eq!(step["output"]["content"][0]["text"], "issue for native");
}

#[test]
fn a_cancelled_task_stays_cancelled_its_result_is_an_error_and_a_late_answer_is_still_journaled() {
    if !mcp_sdk() {
        return;
    }
    let (env, dir) = agent_env();
    let printed = run_agent(&env, &dir, Some("cancel"));
    assert_eq!(printed["cancelled"], "cancelled", "{printed}");
    assert_eq!(printed["status"], "cancelled");
    assert!(
        printed["result_error"]
            .as_str()
            .is_some_and(|error| error.contains("cancelled")),
        "{printed}"
    );
    assert!(
        printed["cancel_again"]
            .as_str()
            .is_some_and(|error| error.contains("cancelled already")),
        "{printed}"
    );
    // The server answered after the cancel: its effect happened, and the
    // step records it (a resume replays it, never runs it again).
    let step = &env.inspect("t")["steps"][0];
    assert_eq!(step["status"], "committed", "{step}");
    assert_eq!(read_json_lines(&env.path("work/applied.jsonl")).len(), 1);
}
