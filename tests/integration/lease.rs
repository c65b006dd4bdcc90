//! One live runner per task (exit 75), and `run --task` as a retried CI job.

use serde_json::json;

use crate::env::{TestEnv, read_pid, text};

#[test]
fn a_second_runner_of_a_live_task_exits_75() {
    let env = TestEnv::new();
    let release = env.path("release");
    let plan = json!({
        "pidfile": env.path("agent.pid"),
        "steps": [{"begin": "wait", "args": {}, "do": {"wait_for": release}}],
    });
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "busy", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut first = env.spawn(&args, "first");
    read_pid(&env.path("agent.pid"));

    let second = env.durun(&["resume", "busy"]);
    assert_eq!(second.status.code(), Some(75), "{}", text(&second.stderr));
    let stderr = text(&second.stderr);
    assert!(
        stderr.starts_with("durun: task busy is being run by another durun"),
        "{stderr}"
    );
    let third = env.durun(&args);
    assert_eq!(third.status.code(), Some(75), "{}", text(&third.stderr));
    assert_eq!(env.inspect("busy")["task"]["status"], "running");

    std::fs::write(&release, "").expect("release");
    let status = first.wait().expect("first run");
    assert!(status.success(), "{}", env.log("first"));
    assert_eq!(env.inspect("busy")["task"]["status"], "completed");
    assert_eq!(
        env.inspect("busy")["task"]["runs"]
            .as_array()
            .expect("runs")
            .len(),
        1
    );
}

#[test]
fn a_dead_runner_leaves_the_task_interrupted_and_free() {
    let env = TestEnv::new();
    let plan = json!({
        "pidfile": env.path("agent.pid"),
        "steps": [{"begin": "wait", "args": {}, "do": {"wait_for": env.path("never")}}],
    });
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "t", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut first = env.spawn(&args, "first");
    read_pid(&env.path("agent.pid"));
    first.kill().expect("SIGKILL durun");
    first.wait().expect("reap durun");
    assert_eq!(env.inspect("t")["task"]["status"], "interrupted");
    let list = env.durun(&["inspect", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).expect("JSON");
    assert_eq!(list["tasks"][0]["status"], "interrupted");

    // The lease of a dead runner is taken over.
    std::fs::remove_file(env.path("agent.pid")).expect("rm pid");
    let mut second = env.spawn(&["resume", "t"], "second");
    read_pid(&env.path("agent.pid"));
    assert_eq!(env.inspect("t")["task"]["status"], "running");
    second.kill().expect("kill");
    second.wait().expect("reap");
}

#[test]
fn a_retried_ci_job_picks_up_where_the_failed_one_stopped() {
    let env = TestEnv::new();
    let fixed = env.path("fixed");
    let plan = json!({"steps": [
        {"begin": "checkout", "args": {"ref": "main"}, "do": {"value": "abc123"}},
        {"begin": "build", "args": {}, "do": {"value": "built"}},
        {"begin": "test", "args": {}, "do": {"exit_unless": fixed, "code": 1}},
        {"begin": "deploy", "effect": "mutate", "args": {}, "do": {"value": "deployed"}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "ci-42", "--"];
    args.extend(agent.iter().map(String::as_str));

    let failed = env.durun(&args);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed.stderr));
    assert_eq!(
        text(&failed.stderr).lines().next(),
        Some("ci-42"),
        "run prints the task id first"
    );
    assert_eq!(env.inspect("ci-42")["task"]["status"], "failed");

    std::fs::write(&fixed, "").expect("fix the build");
    let retried = env.durun(&args);
    assert!(retried.status.success(), "{}", text(&retried.stderr));
    let view = env.inspect("ci-42");
    assert_eq!(view["task"]["status"], "completed");
    let runs = view["task"]["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["replayed_steps"], 2);
    assert_eq!(runs[1]["executed_steps"], 2);
    assert_eq!(runs[0]["exit_code"], 1);
    assert_eq!(runs[1]["exit_code"], 0);

    // A third try of a completed task runs nothing.
    std::fs::remove_file(&fixed).expect("unfix");
    let again = env.durun(&args);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("already completed"));
    assert_eq!(
        env.inspect("ci-42")["task"]["runs"]
            .as_array()
            .expect("runs")
            .len(),
        2
    );

    // Another command under the same id is refused.
    let other = env.durun(&["run", "--task", "ci-42", "--", "python3", "other.py"]);
    assert_eq!(other.status.code(), Some(64), "{}", text(&other.stderr));
    assert!(text(&other.stderr).contains("was started with another command"));
}
