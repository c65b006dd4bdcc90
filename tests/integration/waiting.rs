//! Waiting for people and time (signals, approvals, durable sleep,
//! parking) and token budgets (tasks moved between journals are in
//! `transfer`). Real agents through the Python SDK; on SQLite by `cargo
//! test` and on PostgreSQL by `.ci/run`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, path_with_durun, sdk_path, text, wait_for};

pub(crate) fn waiter_env() -> TestEnv {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.set("PATH", path_with_durun());
    env.set("WAITER_LOG", env.path("ran.log").to_string_lossy());
    env
}

/// `durun run --task TASK [extra…] -- python3 waiter.py PLAN` as arguments.
pub(crate) fn waiter_args(env: &TestEnv, task: &str, plan: &Value, extra: &[&str]) -> Vec<String> {
    let plan_path = env.write(&format!("{task}.plan.json"), &plan.to_string());
    let mut args: Vec<String> = vec!["run".into(), "--task".into(), task.into()];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args.push("--".into());
    args.push("python3".into());
    args.push(
        agents_dir()
            .join("waiter.py")
            .to_string_lossy()
            .into_owned(),
    );
    args.push(plan_path.to_string_lossy().into_owned());
    args
}

pub(crate) fn run(env: &TestEnv, args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.durun(&args)
}

/// The step bodies that ran, in order.
pub(crate) fn ran(env: &TestEnv) -> Vec<String> {
    std::fs::read_to_string(env.path("ran.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Step `index`'s status, once the task exists.
fn status_of_step(env: &TestEnv, task: &str, index: usize) -> Option<String> {
    let output = env.durun(&["inspect", task, "--json"]);
    let task: Value = serde_json::from_slice(&output.stdout).ok()?;
    step_statuses(&task)
        .get(index)
        .map(|(_, status)| status.clone())
}

fn step_statuses(task: &Value) -> Vec<(String, String)> {
    task["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| {
            (
                step["name"].as_str().unwrap_or_default().to_owned(),
                step["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_parked_task_waits_for_approval_and_resumes_without_rerunning_a_step() {
    let env = waiter_env();
    let plan = json!([
        {"step": "plan"},
        {"approval": {"diff": "+1 line"}},
        {"step": "publish", "effect": "mutate"},
    ]);
    let first = run(
        &env,
        &waiter_args(&env, "t", &plan, &["--park-after", "0s"]),
    );
    assert_eq!(first.status.code(), Some(77), "{}", text(&first.stderr));
    let stderr = text(&first.stderr);
    assert!(
        stderr.contains("durun: task t waits for the signal `approval` (step 2)")
            && stderr.contains("durun approve t"),
        "{stderr}"
    );
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "waiting");
    assert_eq!(
        task["task"]["waiting_for"],
        json!({"step": 2, "kind": "wait", "name": "approval", "data": {"diff": "+1 line"}, "until": null, "live": false})
    );
    assert_eq!(task["steps"][1]["kind"], "wait");
    assert_eq!(task["steps"][1]["status"], "waiting");
    let shown = text(&env.durun(&["inspect", "t"]).stdout);
    assert!(
        shown.contains("waits    for the signal `approval` (step 2)")
            && shown.contains("for a signal"),
        "{shown}"
    );
    let listed = env.durun(&["inspect", "--status", "waiting", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert_eq!(listed["tasks"][0]["id"], "t");

    // No signal yet: resume parks again at once, without starting the agent.
    let again = env.durun(&["resume", "t"]);
    assert_eq!(again.status.code(), Some(77), "{}", text(&again.stderr));
    assert_eq!(
        env.inspect("t")["task"]["runs"].as_array().map(Vec::len),
        Some(1)
    );

    let approved = env.durun(&["approve", "t", "--data", r#"{"comment": "ship it"}"#]);
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(ran(&env), ["plan", "publish"], "no step ran twice");
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "completed");
    assert_eq!(task["task"]["output"][1], true, "approval() returned True");
    let signal = &task["task"]["signals"][0];
    assert_eq!(signal["name"], "approval");
    assert_eq!(
        signal["data"],
        json!({"approved": true, "comment": "ship it"})
    );
    assert_eq!(signal["taken_by_step"], 2);
    assert_eq!(task["steps"][1]["output"]["signal"], "approval");
    assert_eq!(task["steps"][1]["output"]["data"]["approved"], true);
    assert!(
        task["steps"][1]["output"]["by"]
            .as_str()
            .unwrap()
            .contains('@')
    );
    // The task is done: it takes no more signals.
    let late = env.durun(&["signal", "t", "approval"]);
    assert_eq!(late.status.code(), Some(64), "{}", text(&late.stderr));
}

#[test]
fn a_rejection_reaches_the_agent_as_false() {
    let env = waiter_env();
    let plan = json!([{"approval": "deploy?"}]);
    let first = run(
        &env,
        &waiter_args(&env, "t", &plan, &["--park-after", "0s"]),
    );
    assert_eq!(first.status.code(), Some(77));
    let rejected = env.durun(&["reject", "t", "--reason", "not today"]);
    assert!(rejected.status.success(), "{}", text(&rejected.stderr));
    assert!(
        text(&rejected.stderr).starts_with("durun: rejected task t (the signal `approval`)"),
        "{}",
        text(&rejected.stderr)
    );
    assert!(env.durun(&["resume", "t"]).status.success());
    let task = env.inspect("t");
    assert_eq!(task["task"]["output"], json!([false]));
    assert_eq!(
        task["task"]["signals"][0]["data"],
        json!({"approved": false, "reason": "not today"})
    );
    // Nothing waits any more: approve has nothing to answer.
    let stray = env.durun(&["approve", "t"]);
    assert_eq!(stray.status.code(), Some(64), "{}", text(&stray.stderr));
}

/// `--data` past what one argument may hold (Linux caps it at 128 KiB):
/// `@FILE` and `@-` read the JSON from a file or standard input.
#[test]
fn signal_data_comes_from_a_file_or_standard_input() {
    use std::io::Write as _;
    let env = waiter_env();
    let plan = json!([{"wait": "a"}, {"wait": "b"}]);
    let parked = run(
        &env,
        &waiter_args(&env, "t", &plan, &["--park-after", "0s"]),
    );
    assert_eq!(parked.status.code(), Some(77), "{}", text(&parked.stderr));
    let big = "x".repeat(200 * 1024);
    env.write("payload.json", &json!({"diff": big}).to_string());
    let from_file = env.durun(&["signal", "t", "a", "--data", "@payload.json"]);
    assert!(from_file.status.success(), "{}", text(&from_file.stderr));
    let mut from_stdin = env
        .command()
        .args(["signal", "t", "b", "--data", "@-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("durun signal");
    from_stdin
        .stdin
        .take()
        .expect("stdin")
        .write_all(br#"{"from": "stdin"}"#)
        .expect("write");
    let done = from_stdin.wait_with_output().expect("signal");
    assert!(done.status.success(), "{}", text(&done.stderr));
    let missing = env.durun(&["signal", "t", "a", "--data", "@no-such-file.json"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing.stderr).contains("cannot read no-such-file.json"),
        "{}",
        text(&missing.stderr)
    );
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let task = env.inspect("t");
    assert_eq!(
        task["task"]["output"][0]["data"]["diff"]
            .as_str()
            .map(str::len),
        Some(200 * 1024)
    );
    assert_eq!(task["task"]["output"][1]["data"], json!({"from": "stdin"}));
}

#[test]
fn a_signal_from_another_process_reaches_a_live_wait_at_once() {
    let env = waiter_env();
    let go = env.path("go");
    let plan = json!([{"step": "before"}, {"wait": "ci-passed", "data": {"sha": "4f2a"}},
        {"hold": go}, {"step": "after"}]);
    let args = waiter_args(&env, "t", &plan, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut runner = env.spawn(&args, "run");
    wait_for("the wait step", Duration::from_secs(30), || {
        status_of_step(&env, "t", 1).as_deref() == Some("waiting")
    });
    // Waiting live is waiting, as parked is: the operator's view is true.
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "waiting", "{task}");
    assert_eq!(task["task"]["waiting_for"]["name"], "ci-passed");
    assert_eq!(task["task"]["waiting_for"]["live"], true);
    assert_eq!(task["task"]["waiting_for"]["data"], json!({"sha": "4f2a"}));
    let listed = env.durun(&["inspect", "--status", "waiting", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("list JSON");
    assert_eq!(listed["tasks"][0]["id"], "t", "{listed}");
    assert_eq!(listed["tasks"][0]["status"], "waiting", "{listed}");
    let shown = text(&env.durun(&["inspect", "--status", "waiting"]).stdout);
    assert!(shown.contains("waiting"), "{shown}");
    let sent_at = Instant::now();
    let sent = env.durun(&[
        "signal",
        "t",
        "ci-passed",
        "--data",
        r#"{"green": true}"#,
        "--id",
        "build-7",
    ]);
    assert!(sent.status.success(), "{}", text(&sent.stderr));
    // The same id again is kept once.
    let twice = env.durun(&[
        "signal",
        "t",
        "ci-passed",
        "--data",
        r#"{"green": false}"#,
        "--id",
        "build-7",
    ]);
    assert!(twice.status.success());
    assert!(
        text(&twice.stderr).contains("kept once"),
        "{}",
        text(&twice.stderr)
    );
    // The signal taken, the task runs again.
    wait_for("the hold step", Duration::from_secs(30), || {
        ran(&env).contains(&"hold".to_owned())
    });
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "running", "{task}");
    assert_eq!(task["task"]["waiting_for"], Value::Null, "{task}");
    std::fs::write(&go, "").expect("go");
    let status = crate::env::wait_exit(&mut runner, Duration::from_secs(30));
    assert!(status.success(), "{}", env.log("run"));
    assert!(
        sent_at.elapsed() < Duration::from_secs(10),
        "the live run took the signal without parking"
    );
    let task = env.inspect("t");
    assert_eq!(task["task"]["output"][1]["data"], json!({"green": true}));
    assert_eq!(task["task"]["signals"].as_array().map(Vec::len), Some(1));
    assert_eq!(task["task"]["runs"].as_array().map(Vec::len), Some(1));
    assert_eq!(ran(&env), ["before", "hold", "after"]);
}

#[test]
fn a_wait_times_out_once_and_replays_its_timeout() {
    let env = waiter_env();
    let plan = json!([{"wait": "never", "timeout": "1s"}, {"step": "after"}]);
    let args = waiter_args(&env, "t", &plan, &[]);
    let done = run(&env, &args);
    assert!(done.status.success(), "{}", text(&done.stderr));
    let task = env.inspect("t");
    assert_eq!(task["steps"][0]["status"], "failed");
    assert_eq!(task["steps"][0]["error"]["code"], "timeout");
    assert!(
        task["task"]["output"][0]["timeout"]
            .as_str()
            .unwrap()
            .contains("never")
    );
    // From another step on, the timeout replays: resumed from step 2, the
    // agent meets the same timeout without waiting.
    let again = env.durun(&["resume", "t", "--from-step", "2"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(ran(&env), ["after", "after"]);
}

#[test]
fn a_short_sleep_is_waited_live_and_a_long_one_parks_until_its_time() {
    let env = waiter_env();
    let short = json!([{"sleep": 0.5}, {"step": "after"}]);
    let started = Instant::now();
    let done = run(&env, &waiter_args(&env, "short", &short, &[]));
    assert!(done.status.success(), "{}", text(&done.stderr));
    assert!(started.elapsed() >= Duration::from_millis(500));

    let long = json!([{"step": "before"}, {"sleep": 3}, {"step": "after"}]);
    let parked = run(
        &env,
        &waiter_args(&env, "long", &long, &["--park-after", "1s"]),
    );
    assert_eq!(parked.status.code(), Some(77), "{}", text(&parked.stderr));
    assert!(
        text(&parked.stderr).contains("sleeps until"),
        "{}",
        text(&parked.stderr)
    );
    let task = env.inspect("long");
    assert_eq!(task["task"]["status"], "sleeping");
    let until = task["task"]["waiting_for"]["until"]
        .as_str()
        .expect("until")
        .to_owned();
    assert_eq!(task["task"]["waiting_for"]["kind"], "sleep");
    let shown = text(&env.durun(&["inspect", "long"]).stdout);
    assert!(
        shown.contains(&format!("waits    until {until} (step 2, a sleep)")),
        "{shown}"
    );
    // Too early: parked again at once, the agent not started.
    let early = env.durun(&["resume", "long"]);
    assert_eq!(early.status.code(), Some(77));
    assert_eq!(ran(&env), ["after", "before"]);
    // Its time come (the clock durun reads set past it, not slept to).
    let later = humantime::format_rfc3339_millis(
        humantime::parse_rfc3339_weak(until.trim_end_matches('Z')).expect("a time")
            + Duration::from_secs(1),
    )
    .to_string();
    let woke = env
        .command()
        .env("DURUN_TEST_NOW", &later)
        .args(["resume", "long"])
        .output()
        .expect("durun");
    assert!(woke.status.success(), "{}", text(&woke.stderr));
    let task = env.inspect("long");
    assert_eq!(
        task["steps"][1]["output"]["woke_at"], until,
        "the wake time was fixed"
    );
    assert_eq!(ran(&env), ["after", "before", "after"]);
}

#[test]
fn resume_all_starts_only_the_parked_tasks_that_are_ready() {
    let env = waiter_env();
    let wait = json!([{"wait": "go"}, {"step": "done"}]);
    for task in ["signalled", "unsignalled"] {
        let parked = run(
            &env,
            &waiter_args(&env, task, &wait, &["--park-after", "0s"]),
        );
        assert_eq!(parked.status.code(), Some(77), "{}", text(&parked.stderr));
    }
    let sleep = json!([{"sleep": 1}, {"step": "done"}]);
    let parked = run(
        &env,
        &waiter_args(&env, "woken", &sleep, &["--park-after", "0s"]),
    );
    assert_eq!(parked.status.code(), Some(77));
    assert!(env.durun(&["signal", "signalled", "go"]).status.success());
    // A minute on: the sleep's time has come (the clock durun reads, not
    // a real minute).
    let later =
        humantime::format_rfc3339_millis(std::time::SystemTime::now() + Duration::from_secs(60))
            .to_string();
    let all = env
        .command()
        .env("DURUN_TEST_NOW", &later)
        .args(["resume", "--all"])
        .output()
        .expect("durun");
    assert!(all.status.success(), "{}", text(&all.stderr));
    assert!(
        text(&all.stderr).contains("1 parked task still waits"),
        "{}",
        text(&all.stderr)
    );
    assert_eq!(env.inspect("signalled")["task"]["status"], "completed");
    assert_eq!(env.inspect("woken")["task"]["status"], "completed");
    assert_eq!(env.inspect("unsignalled")["task"]["status"], "waiting");
}

#[test]
fn a_parked_task_resumes_on_another_host() {
    let env = waiter_env();
    let plan = json!([{"step": "one"}, {"wait": "go"}, {"step": "two"}]);
    let args = waiter_args(&env, "t", &plan, &["--park-after", "0s"]);
    let first = env
        .command()
        .env("DURUN_HOST_ID", "host-a")
        .args(&args)
        .output()
        .expect("run");
    assert_eq!(first.status.code(), Some(77), "{}", text(&first.stderr));
    let sent = env
        .command()
        .env("DURUN_HOST_ID", "host-c")
        .args(["signal", "t", "go", "--data", "42"])
        .output()
        .expect("signal");
    assert!(sent.status.success());
    let resumed = env
        .command()
        .env("DURUN_HOST_ID", "host-b")
        .args(["resume", "t"])
        .output()
        .expect("resume");
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let task = env.inspect("t");
    assert_eq!(task["task"]["runs"][1]["host"], "host-b");
    assert_eq!(task["task"]["output"][1]["data"], 42);
    assert_eq!(ran(&env), ["one", "two"]);
}

#[test]
fn a_killed_runner_never_gives_a_wait_two_signals() {
    let env = waiter_env();
    let plan = json!([{"wait": "go"}, {"wait": "go"}, {"step": "after"}]);
    let args = waiter_args(&env, "t", &plan, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut runner = env.spawn(&args, "run");
    wait_for("the first wait", Duration::from_secs(30), || {
        status_of_step(&env, "t", 0).as_deref() == Some("waiting")
    });
    runner.kill().expect("SIGKILL durun");
    runner.wait().expect("reap");
    for data in ["1", "2", "3"] {
        assert!(
            env.durun(&["signal", "t", "go", "--data", data])
                .status
                .success()
        );
    }
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let task = env.inspect("t");
    assert_eq!(task["task"]["output"][0]["data"], 1, "oldest first");
    assert_eq!(task["task"]["output"][1]["data"], 2);
    let taken: Vec<Value> = task["task"]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|signal| signal["taken_by_step"].clone())
        .collect();
    assert_eq!(taken, [json!(1), json!(2), Value::Null]);
    // Replayed again, the waits answer the same signals.
    let again = env.durun(&["resume", "t", "--from-step", "3"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(env.inspect("t")["task"]["output"][1]["data"], 2);
}

#[test]
fn shell_agents_wait_and_sleep_with_durun_commands() {
    let env = waiter_env();
    let script = env.write(
        "agent.sh",
        "set -e\nanswer=$(durun wait go --data '\"ready?\"')\necho \"got $answer\" >> \"$WAITER_LOG\"\ndurun sleep 200ms\necho slept >> \"$WAITER_LOG\"\n",
    );
    let script = script.to_string_lossy().into_owned();
    let parked = env.durun(&[
        "run",
        "--task",
        "sh",
        "--park-after",
        "0s",
        "--",
        "bash",
        &script,
    ]);
    assert_eq!(parked.status.code(), Some(77), "{}", text(&parked.stderr));
    assert!(
        env.durun(&["signal", "sh", "go", "--data", r#"{"n": 1}"#])
            .status
            .success()
    );
    let done = env.durun(&["resume", "sh"]);
    assert!(done.status.success(), "{}", text(&done.stderr));
    let log = ran(&env);
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(
        log[0].starts_with("got {") && log[0].contains("\"data\":{\"n\":1}"),
        "{log:?}"
    );
    assert_eq!(log[1], "slept");
    // Outside a run, sleep simply sleeps and wait says what it needs.
    let outside = env
        .command()
        .env_remove("DURUN_SOCKET")
        .args(["wait", "go"])
        .output()
        .unwrap();
    assert_eq!(outside.status.code(), Some(64), "{}", text(&outside.stderr));
}
