//! A journal shared by several runners: racing runners, and a task taken
//! over from a dead runner on another host once its heartbeat is stale.
//! Run on SQLite by `cargo test` and on PostgreSQL by `.ci/run`.

use std::time::Duration;

use serde_json::json;

use crate::env::{TestEnv, read_pid, text, wait_for};
use crate::servers::FakeApi;

#[test]
fn of_runners_racing_for_one_task_exactly_one_runs_it() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    let plan = json!({"steps": [
        {"begin": "one", "args": {}, "do": {"value": 1}},
        {"begin": "gate", "args": {}, "do": {"exit_unless": env.path("go"), "code": 1}},
        {"begin": "charge", "effect": "mutate", "args": {"title": "once"}, "do": {"api": true}},
        {"begin": "hold", "args": {}, "do": {"wait_for": env.path("release")}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "race", "--"];
    args.extend(agent.iter().map(String::as_str));
    assert_eq!(
        env.durun(&args).status.code(),
        Some(1),
        "the first run stops at the gate"
    );
    std::fs::write(env.path("go"), "").expect("go");

    let runners: Vec<_> = (0..6)
        .map(|i| env.spawn(&["resume", "race"], &format!("r{i}")))
        .collect();
    wait_for("the losers to give up", Duration::from_secs(60), || {
        (0..6)
            .filter(|i| {
                env.log(&format!("r{i}"))
                    .contains("is being run by another durun")
            })
            .count()
            == 5
    });
    std::fs::write(env.path("release"), "").expect("release");
    let codes: Vec<Option<i32>> = runners
        .into_iter()
        .map(|mut child| child.wait().expect("runner").code())
        .collect();
    assert_eq!(
        codes.iter().filter(|code| **code == Some(0)).count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|code| **code == Some(75)).count(),
        5,
        "{codes:?}"
    );
    assert_eq!(api.keys().len(), 1, "the mutate step ran once");
    let view = env.inspect("race");
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(
        view["task"]["runs"].as_array().expect("runs").len(),
        2,
        "one failed run, one winner"
    );
}

#[test]
fn a_dead_runner_on_another_host_is_taken_over_once_its_heartbeat_is_stale() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    env.set("DURUN_HEARTBEAT_MS", "100");
    env.set("DURUN_LEASE_STALE_MS", "1500");
    let plan = json!({"pidfile": env.path("agent.pid"), "steps": [
        {"begin": "charge", "effect": "mutate", "args": {"title": "once"}, "do": {"api": true}},
        {"begin": "wait", "args": {}, "do": {"wait_for": env.path("release")}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "moved", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut host_a = env.command();
    host_a.env("DURUN_HOST_ID", "host-a");
    let mut first = host_a
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("runner on host-a");
    read_pid(&env.path("agent.pid"));
    wait_for("step 1 to be committed", Duration::from_secs(30), || {
        env.inspect("moved")["steps"][0]["status"] == "committed"
    });
    first.kill().expect("SIGKILL the runner on host-a");
    first.wait().expect("reap");
    std::fs::write(env.path("release"), "").expect("release");

    // host-b cannot see host-a's processes: it waits for the heartbeat to
    // go stale.
    let on_host_b = |env: &TestEnv| {
        env.command()
            .env("DURUN_HOST_ID", "host-b")
            .args(["resume", "moved"])
            .output()
            .expect("runner on host-b")
    };
    let early = on_host_b(&env);
    assert_eq!(early.status.code(), Some(75), "{}", text(&early.stderr));
    std::thread::sleep(Duration::from_millis(1600));
    let late = on_host_b(&env);
    assert!(late.status.success(), "{}", text(&late.stderr));
    let view = env.inspect("moved");
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(view["task"]["runs"][1]["host"], "host-b");
    assert_eq!(
        view["task"]["runs"][1]["replayed_steps"], 1,
        "the committed step was not repeated"
    );
    assert_eq!(api.keys().len(), 1);
}

#[test]
fn resume_all_takes_every_interrupted_task_and_no_other() {
    let env = TestEnv::new();
    let make_interrupted = |task: &str| {
        let pidfile = env.path(&format!("{task}.pid"));
        let plan = json!({"pidfile": pidfile, "steps": [
            {"begin": "one", "args": {}, "do": {"value": 1}},
            {"begin": "wait", "args": {}, "do": {"wait_for": env.path("release")}},
        ]});
        let agent = env.scripted_agent(&format!("{task}.json"), &plan);
        let mut args = vec!["run", "--task", task, "--"];
        args.extend(agent.iter().map(String::as_str));
        let mut runner = env.spawn(&args, task);
        read_pid(&pidfile);
        wait_for("step 1 to be committed", Duration::from_secs(30), || {
            env.inspect(task)["steps"][0]["status"] == "committed"
        });
        runner.kill().expect("SIGKILL");
        runner.wait().expect("reap");
    };
    make_interrupted("a");
    make_interrupted("b");
    assert!(
        env.durun(&["run", "--task", "done", "--", "true"])
            .status
            .success()
    );
    assert_eq!(
        env.durun(&["run", "--task", "broken", "--", "false"])
            .status
            .code(),
        Some(1)
    );
    std::fs::write(env.path("release"), "").expect("release");

    let output = env.durun(&["resume", "--all", "--jobs", "2"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("durun: resuming 2 interrupted tasks, 2 at a time"));
    for task in ["a", "b"] {
        let view = env.inspect(task);
        assert_eq!(view["task"]["status"], "completed", "{task}");
        assert_eq!(view["task"]["runs"][1]["replayed_steps"], 1);
    }
    assert_eq!(
        env.inspect("done")["task"]["runs"]
            .as_array()
            .expect("runs")
            .len(),
        1
    );
    assert_eq!(
        env.inspect("broken")["task"]["runs"]
            .as_array()
            .expect("runs")
            .len(),
        1,
        "a failed task is left alone"
    );
    let again = env.durun(&["resume", "--all"]);
    assert!(text(&again.stderr).contains("no interrupted task to resume"));
}
