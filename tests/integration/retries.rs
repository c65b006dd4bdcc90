//! Task retries (SPEC 16): `submit --retries N --backoff D` and
//! `[queues.Q] retries`: a run that failed is resumed by a worker after
//! the backoff, doubling, up to N times; then the task stays failed. A
//! step the failed run finished is replayed, not run again.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::env::{TestEnv, text, wait_for};
use crate::workers::{stop, worker, worker_log};

/// An agent that counts its runs in `runs-TASK.txt`, journals one step,
/// and exits with its second argument in its first (first argument) runs
/// (`kill`: SIGKILLs itself, as the OOM killer would).
const AGENT: &str = r#"
import json, os, signal, sys
fail_runs, exit_code = int(sys.argv[1]), sys.argv[2]
counter = "runs-" + os.environ["DURUN_TASK_ID"] + ".txt"
n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(n))
def ask(message):
    sys.stdout.write(json.dumps(message) + "\n"); sys.stdout.flush()
    return json.loads(sys.stdin.readline())
opened = ask({"op": "begin", "id": 1, "name": "plan", "args": {}})
if not opened.get("replayed"):
    open("plans-" + os.environ["DURUN_TASK_ID"] + ".txt", "a").write("plan\n")
    ask({"op": "commit", "id": 2, "step": opened["step"], "output": "the plan"})
if n <= fail_runs:
    if exit_code == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(exit_code))
ask({"op": "result", "id": 3, "output": {"runs": n}})
"#;

fn retry_env() -> TestEnv {
    let mut env = TestEnv::new();
    env.set("DURUN_HEARTBEAT_MS", "250");
    env.set("DURUN_LEASE_STALE_MS", "1500");
    env.write("agent.py", AGENT);
    env
}

/// Submits the agent as task `id`, failing its first `fail_runs` runs
/// with `exit_code`.
fn submit(env: &TestEnv, id: &str, (fail_runs, exit_code): (&str, &str), extra: &[&str]) {
    let mut args = vec!["-q", "submit", "--queue", "q", "--task", id];
    args.extend(extra);
    args.extend(["--", "python3", "agent.py", fail_runs, exit_code]);
    let output = env.durun(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

fn at(text: &Value) -> SystemTime {
    humantime::parse_rfc3339(text.as_str().expect("a time")).expect("a time")
}

/// Asserts that each run (by index) started at least so many ms after
/// the run before it ended.
fn assert_waited(runs: &[Value], waits: &[(usize, u64)]) {
    for &(index, least) in waits {
        let waited = at(&runs[index]["started_at"])
            .duration_since(at(&runs[index - 1]["finished_at"]))
            .expect("in order");
        assert!(
            waited >= Duration::from_millis(least),
            "run {} started {waited:?} after the run before it ended",
            index + 1
        );
    }
}

#[test]
fn a_failed_run_is_resumed_after_its_backoff_doubling_until_it_completes() {
    let env = retry_env();
    submit(
        &env,
        "flaky",
        ("2", "3"),
        &["--retries", "3", "--backoff", "1s"],
    );
    let mut pool = worker(&env, "w1", &["--queue", "q"]);
    wait_for("the task to complete", Duration::from_secs(40), || {
        env.inspect("flaky")["task"]["status"] == "completed"
    });
    assert!(stop(&mut pool).success());
    let task = env.inspect("flaky");
    let runs = task["task"]["runs"].as_array().expect("runs").clone();
    assert_eq!(runs.len(), 3, "{task}");
    assert_eq!(task["task"]["output"]["runs"], 3);
    // The backoff: 1 s after the first failure, 2 s after the second.
    assert_waited(&runs, &[(1, 1000), (2, 2000)]);
    // The step the first run finished was replayed, never run again.
    assert_eq!(
        std::fs::read_to_string(env.path("plans-flaky.txt")).expect("plans"),
        "plan\n"
    );
    let log = worker_log(&env, "w1");
    assert!(
        log.contains("task flaky failed (exit 3); retry 1 of 3"),
        "{log}"
    );
    assert!(
        log.contains("task flaky failed (exit 3); retry 2 of 3"),
        "{log}"
    );
    assert!(!log.contains("retry 3 of 3"), "{log}");
}

#[test]
fn retries_run_out_and_the_task_stays_failed_and_listed() {
    let env = retry_env();
    submit(
        &env,
        "doomed",
        ("99", "3"),
        &["--retries", "2", "--backoff", "0s"],
    );
    let mut pool = worker(&env, "w1", &["--queue", "q"]);
    wait_for("three runs", Duration::from_secs(30), || {
        env.inspect("doomed")["task"]["runs"]
            .as_array()
            .is_some_and(|runs| runs.len() == 3)
            && env.inspect("doomed")["task"]["status"] == "failed"
    });
    // Nothing more comes.
    std::thread::sleep(Duration::from_secs(2));
    assert!(stop(&mut pool).success());
    let task = env.inspect("doomed");
    assert_eq!(
        task["task"]["runs"].as_array().map(Vec::len),
        Some(3),
        "{task}"
    );
    let failed = env.durun(&["inspect", "--status", "failed", "--json"]);
    let failed: Value = serde_json::from_slice(&failed.stdout).expect("JSON");
    assert_eq!(failed["tasks"][0]["id"], "doomed", "{failed}");
}

#[test]
fn an_exit_that_needs_a_person_is_not_retried_and_a_queue_can_set_retries() {
    // Exit 65 (a divergence) needs a person: no retry, however many.
    let env = retry_env();
    submit(
        &env,
        "diverged",
        ("99", "65"),
        &["--retries", "3", "--backoff", "0s"],
    );
    // The queue's retries, from the durun.toml where it is submitted: a
    // task that fails once, then completes.
    env.write("durun.toml", "[queues.q]\nretries = 1\nbackoff = \"0s\"\n");
    submit(&env, "queued-policy", ("1", "3"), &[]);
    let mut pool = worker(&env, "w1", &["--queue", "q"]);
    wait_for("both tasks to end", Duration::from_secs(30), || {
        env.inspect("diverged")["task"]["status"] == "failed"
            && env.inspect("queued-policy")["task"]["status"] == "completed"
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(stop(&mut pool).success());
    assert_eq!(
        env.inspect("diverged")["task"]["runs"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        env.inspect("queued-policy")["task"]["runs"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[test]
fn an_agent_killed_at_every_start_is_resumed_at_once_then_after_a_doubling_wait() {
    // No retries are set: a crash is no failure, the task is left
    // interrupted and a worker resumes it. But an agent that dies each
    // time it starts must not be started again at once, forever.
    let env = retry_env();
    submit(&env, "oom", ("3", "kill"), &[]);
    let mut pool = worker(&env, "w1", &["--queue", "q"]);
    wait_for(
        "the worker to see the task complete",
        Duration::from_secs(40),
        || worker_log(&env, "w1").contains("task oom completed"),
    );
    assert!(stop(&mut pool).success());
    let task = env.inspect("oom");
    let runs = task["task"]["runs"].as_array().expect("runs").clone();
    assert_eq!(runs.len(), 4, "{task}");
    assert_eq!(runs[0]["exit_code"], 137, "{task}");
    // The first crash is resumed at once; the second after 1 s, the third
    // after 2 s.
    assert_waited(&runs, &[(2, 1000), (3, 2000)]);
    assert_eq!(
        std::fs::read_to_string(env.path("plans-oom.txt")).expect("plans"),
        "plan\n"
    );
    let log = worker_log(&env, "w1");
    for said in [
        "task oom ended: its agent was killed by signal 9 (exit 137); it is resumed at once",
        "task oom ended: its agent was killed by signal 9 (exit 137), 2 runs in a row; it is resumed in 1s",
        "task oom ended: its agent was killed by signal 9 (exit 137), 3 runs in a row; it is resumed in 2s",
    ] {
        assert!(log.contains(said), "{said:?} not in:\n{log}");
    }
}
