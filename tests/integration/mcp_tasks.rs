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

#[test]
fn a_task_survives_a_killed_client_a_killed_durun_mcp_and_a_cut_server_connection() {
    if !mcp_sdk() {
        return;
    }
    let mut env = TestEnv::new();
    env.set(
        "DURUN_BIN",
        assert_cmd::cargo::cargo_bin("durun").to_string_lossy(),
    );
    let dir = env.path("work");
    std::fs::create_dir_all(&dir).expect("work dir");
    let dir = dir.to_string_lossy().into_owned();
    let run = env.durun(&["run", "--task", "t", "--", "python3", &agent(), &dir]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let printed: Value = text(&run.stdout)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .expect("the agent's print");

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

    // The tool ran once per task: the server applied each key once.
    let applied = read_json_lines(&env.path("work/applied.jsonl"));
    let keys: Vec<Value> = applied.iter().map(|line| line["key"].clone()).collect();
    assert_eq!(
        keys, tasks,
        "one effect per task, keyed by its id: {applied:?}"
    );

    // Each task is its step, and its id the step's key.
    let inspected = env.inspect("t");
    let steps: Vec<&Value> = inspected["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["name"] == "mcp tracker/create_issue")
        .collect();
    assert_eq!(steps.len(), 3, "{inspected}");
    for (step, task) in steps.iter().zip(&tasks) {
        assert_eq!(step["status"], "committed", "{step}");
        assert_eq!(&step["idempotency_key"], task);
    }
    assert_eq!(steps[1]["attempts"], 2, "sent again after durun mcp died");
    assert_eq!(
        steps[0]["attempts"], 1,
        "the first ran on without its client"
    );
}

#[test]
fn a_task_whose_run_was_killed_is_fetched_by_its_id_after_resume_and_applied_once() {
    if !mcp_sdk() {
        return;
    }
    let mut env = TestEnv::new();
    env.set(
        "DURUN_BIN",
        assert_cmd::cargo::cargo_bin("durun").to_string_lossy(),
    );
    let dir = env.path("work");
    std::fs::create_dir_all(&dir).expect("work dir");
    let dir = dir.to_string_lossy().into_owned();
    let mut durun = env.spawn(
        &[
            "run",
            "--task",
            "t",
            "--",
            "python3",
            &agent(),
            &dir,
            "resumed",
        ],
        "run",
    );
    crate::env::wait_for(
        "the tool's effect",
        std::time::Duration::from_secs(60),
        || env.path("work/hold.reached").exists(),
    );
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    std::fs::write(env.path("work/hold"), "").expect("release");

    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let fetched: Value = text(&resumed.stdout)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .expect("the agent's print");
    let task = std::fs::read_to_string(env.path("work/task")).expect("the task id");
    assert_eq!(fetched["task"], task.as_str());
    assert_eq!(fetched["text"], "issue-1", "{fetched}");
    assert_eq!(fetched["status"], "completed");
    let applied = read_json_lines(&env.path("work/applied.jsonl"));
    assert_eq!(applied.len(), 1, "applied once: {applied:?}");
    assert_eq!(applied[0]["key"], task.as_str());
    let inspected = env.inspect("t");
    let step = &inspected["steps"][0];
    assert_eq!(step["idempotency_key"], task.as_str());
    assert_eq!(step["status"], "committed");
    assert_eq!(
        step["attempts"], 2,
        "sent again, with its key, in the new run"
    );
}
