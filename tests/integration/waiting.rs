//! Waiting for people and time (signals, approvals, durable sleep,
//! parking), token budgets, and tasks moved between journals (export,
//! import, fork). Real agents through the Python SDK; on SQLite by `cargo
//! test` and on PostgreSQL by `.ci/run`.

use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, path_with_durun, sdk_path, text, wait_for};

fn waiter_env() -> TestEnv {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.set("PATH", path_with_durun());
    env.set("WAITER_LOG", env.path("ran.log").to_string_lossy());
    env
}

/// `durun run --task TASK [extra…] -- python3 waiter.py PLAN` as arguments.
fn waiter_args(env: &TestEnv, task: &str, plan: &Value, extra: &[&str]) -> Vec<String> {
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

fn run(env: &TestEnv, args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.durun(&args)
}

/// The step bodies that ran, in order.
fn ran(env: &TestEnv) -> Vec<String> {
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
fn a_token_budget_stops_the_task_and_a_raise_continues_it() {
    let env = waiter_env();
    let plan = json!([
        {"step": "a", "tokens": 100},
        {"step": "b", "tokens": 100},
        {"step": "c", "tokens": 100},
        {"step": "d", "tokens": 100},
    ]);
    let first = run(
        &env,
        &waiter_args(&env, "t", &plan, &["--max-tokens", "250"]),
    );
    assert_eq!(first.status.code(), Some(78), "{}", text(&first.stderr));
    let stderr = text(&first.stderr);
    assert!(
        stderr.contains("spent its token budget: 300 of 250"),
        "{stderr}"
    );
    assert!(stderr.contains("--max-tokens"), "{stderr}");
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "over_budget");
    assert_eq!(task["task"]["max_tokens"], 250);
    assert_eq!(ran(&env), ["a", "b", "c"]);
    // Without a raise the replayed steps are free and step 4 is refused again.
    let again = env.durun(&["resume", "t"]);
    assert_eq!(again.status.code(), Some(78));
    assert_eq!(ran(&env), ["a", "b", "c"]);
    let raised = env.durun(&["resume", "t", "--max-tokens", "1000"]);
    assert!(raised.status.success(), "{}", text(&raised.stderr));
    assert_eq!(ran(&env), ["a", "b", "c", "d"]);
    let task = env.inspect("t");
    assert_eq!(task["task"]["max_tokens"], 1000);
    assert_eq!(task["task"]["tokens_spent"], 400);
    let shown = env.durun(&["inspect", "t"]);
    assert!(
        text(&shown.stdout).contains("budget 1,000 (600 left)"),
        "{}",
        text(&shown.stdout)
    );
}

#[test]
fn a_budget_from_durun_toml_is_recorded_with_the_task() {
    let env = waiter_env();
    env.write(
        "durun.toml",
        "[budget]\nmax_tokens = 150\n\n[wait]\npark_after = \"0s\"\n",
    );
    let plan = json!([{"step": "a", "tokens": 100}, {"step": "b", "tokens": 100}, {"wait": "x"}]);
    let first = run(&env, &waiter_args(&env, "t", &plan, &[]));
    assert_eq!(first.status.code(), Some(78), "{}", text(&first.stderr));
    let raised = env.durun(&["resume", "t", "--max-tokens", "500"]);
    assert_eq!(
        raised.status.code(),
        Some(77),
        "parks at once by [wait] park_after: {}",
        text(&raised.stderr)
    );
}

/// Starts a task whose `mutate` step is in flight, kills durun with
/// SIGKILL, and returns the step's key.
fn crash_inside_a_mutate_step(env: &TestEnv) -> String {
    let plan = json!([{"step": "one"}, {"hold": env.path("release")}, {"step": "two"}]);
    let args = waiter_args(env, "t", &plan, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut runner = env.spawn(&args, "run");
    wait_for("the mutate step", Duration::from_secs(30), || {
        ran(env).contains(&"hold".to_owned())
    });
    runner.kill().expect("SIGKILL durun");
    runner.wait().expect("reap");
    let task = env.inspect("t");
    assert_eq!(task["steps"][1]["status"], "pending");
    task["steps"][1]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_owned()
}

#[test]
fn an_exported_task_resumes_in_another_journal_with_the_same_keys() {
    let env = waiter_env();
    let key = crash_inside_a_mutate_step(&env);
    let exported = env.durun(&["export", "t", "-o", "t.jsonl"]);
    assert!(exported.status.success(), "{}", text(&exported.stderr));
    let file = env.path("t.jsonl");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let lines: Vec<Value> = crate::env::read_json_lines(&file);
    assert_eq!(lines[0]["durun_export"], 1);
    assert_eq!(lines[0]["task"]["id"], "t");
    let end = lines.last().unwrap();
    assert_eq!(end["end"], true);
    assert_eq!(end["lines"], lines.len() - 1);
    // Standard output gets the same lines.
    let stdout = env.durun(&["export", "t"]);
    assert_eq!(
        text(&stdout.stdout),
        std::fs::read_to_string(&file).unwrap()
    );

    // Another machine: a fresh journal, no shared disk but the file.
    let mut other = waiter_env();
    other.set("WAITER_LOG", env.path("ran.log").to_string_lossy());
    std::fs::copy(&file, other.path("t.jsonl")).expect("copy");
    let imported = other.durun(&["import", "t.jsonl"]);
    assert!(imported.status.success(), "{}", text(&imported.stderr));
    assert_eq!(other.inspect("t")["task"]["status"], "interrupted");
    let twice = other.durun(&["import", "t.jsonl"]);
    assert_eq!(twice.status.code(), Some(64), "{}", text(&twice.stderr));
    assert!(
        other
            .durun(&["import", "t.jsonl", "--replace"])
            .status
            .success()
    );
    std::fs::write(env.path("release"), "").expect("release");
    let resumed = other.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let task = other.inspect("t");
    assert_eq!(
        task["steps"][1]["idempotency_key"],
        key.as_str(),
        "the same key"
    );
    assert_eq!(task["steps"][1]["attempts"], 2);
    assert_eq!(
        ran(&env),
        ["one", "hold", "hold", "two"],
        "step 1 replayed, step 2 retried"
    );

    // Under another id: recorded steps keep their keys.
    let renamed = other.durun(&["import", "t.jsonl", "--task", "t-copy"]);
    assert!(renamed.status.success(), "{}", text(&renamed.stderr));
    assert_eq!(
        other.inspect("t-copy")["steps"][1]["idempotency_key"],
        key.as_str()
    );
}

/// Task `t` of two steps, run to its end and exported.
fn two_step_export(env: &TestEnv) -> String {
    let plan = json!([{"step": "one"}, {"step": "two"}]);
    assert!(
        run(env, &waiter_args(env, "t", &plan, &[]))
            .status
            .success()
    );
    text(&env.durun(&["export", "t"]).stdout)
}

#[test]
fn a_truncated_or_altered_export_is_refused_and_writes_nothing() {
    let env = waiter_env();
    let whole = two_step_export(&env);
    let other = waiter_env();
    let truncated = &whole[..whole.len() / 2];
    let altered = whole.replacen("\"one\"", "\"0ne\"", 1);
    assert_ne!(altered, whole);
    for (name, contents) in [
        ("cut.jsonl", truncated.to_owned()),
        ("altered.jsonl", altered),
    ] {
        other.write(name, &contents);
        let refused = other.durun(&["import", name]);
        assert_eq!(
            refused.status.code(),
            Some(64),
            "{name}: {}",
            text(&refused.stderr)
        );
        assert!(
            text(&refused.stderr).contains("nothing was imported"),
            "{}",
            text(&refused.stderr)
        );
    }
    let listed = other.durun(&["inspect", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert_eq!(listed["tasks"], json!([]));
}

/// An export's lines as `durun export` would write them, sealed with a
/// true count and checksum: what a person who edits a file can make.
fn sealed(lines: &[Value]) -> String {
    use sha2::Digest as _;
    let mut body = String::new();
    for line in lines {
        body.push_str(&line.to_string());
        body.push('\n');
    }
    let sha256 =
        sha2::Sha256::digest(body.as_bytes())
            .iter()
            .fold(String::new(), |mut hex, byte| {
                use std::fmt::Write as _;
                let _ = write!(hex, "{byte:02x}");
                hex
            });
    let end = json!({"end": true, "lines": lines.len(), "sha256": sha256});
    format!("{body}{end}\n")
}

#[test]
fn an_import_checks_every_row_and_never_hands_a_task_to_workers_unasked() {
    let env = waiter_env();
    let mut lines: Vec<Value> = two_step_export(&env)
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect();
    lines.pop();
    let other = waiter_env();
    every_bad_row_is_refused_and_nothing_written(&other, &lines);
    an_imported_task_runs_only_when_asked(&other, &lines);
}

/// `lines`, edited, sealed again as an export file.
fn edited(lines: &[Value], edit: &dyn Fn(&mut Vec<Value>)) -> String {
    let mut copy = lines.to_vec();
    edit(&mut copy);
    sealed(&copy)
}

/// Every row an export holds is checked: ids, step numbers, statuses,
/// JSON, times.
fn every_bad_row_is_refused_and_nothing_written(other: &TestEnv, lines: &[Value]) {
    let edited = |edit: &dyn Fn(&mut Vec<Value>)| edited(lines, edit);
    let rename = |id: &str| {
        let id = id.to_owned();
        move |lines: &mut Vec<Value>| {
            lines[0]["task"]["id"] = json!(id);
            for line in lines.iter_mut().skip(1) {
                for row in line.as_object_mut().unwrap().values_mut() {
                    row["task_id"] = json!(id);
                }
            }
        }
    };
    let step = |n: usize, column: &'static str, value: Value| {
        move |lines: &mut Vec<Value>| {
            let steps: Vec<&mut Value> = lines
                .iter_mut()
                .filter_map(|line| line.get_mut("step"))
                .collect();
            let mut steps = steps;
            steps[n][column] = value.clone();
        }
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("dots", edited(&rename("../../etc/evil")), "invalid task id"),
        ("newline", edited(&rename("a\nb")), "invalid task id"),
        (
            "osc",
            edited(&rename("a\u{1b}]0;X\u{7}")),
            "invalid task id",
        ),
        (
            "bidi",
            edited(&rename("evil\u{202e}fdp")),
            "invalid task id",
        ),
        (
            "long",
            edited(&rename(&"x".repeat(5000))),
            "invalid task id",
        ),
        (
            "negative",
            edited(&step(0, "step_index", json!(-5))),
            "step_index -5",
        ),
        (
            "zero",
            edited(&step(0, "step_index", json!(0))),
            "step_index 0",
        ),
        (
            "huge",
            edited(&step(1, "step_index", json!(1u64 << 62))),
            "step_index",
        ),
        (
            "gap",
            edited(&step(1, "step_index", json!(3))),
            "jump from 1 to 3",
        ),
        (
            "status",
            edited(&step(0, "status", json!("weird"))),
            "status \"weird\"",
        ),
        (
            "output",
            edited(&step(0, "output", json!("not json{"))),
            "output is not JSON",
        ),
        (
            "time",
            edited(&step(0, "created_at", json!("yesterday"))),
            "created_at is not a time",
        ),
        (
            "task status",
            edited(&|lines: &mut Vec<Value>| lines[0]["task"]["status"] = json!("owned")),
            "status \"owned\"",
        ),
    ];
    for (name, contents, says) in cases {
        let file = format!("{}.jsonl", name.replace(' ', "-"));
        other.write(&file, &contents);
        let refused = other.durun(&["import", &file]);
        let stderr = text(&refused.stderr);
        assert_eq!(refused.status.code(), Some(64), "{name}: {stderr}");
        assert!(stderr.contains(says), "{name}: {stderr}");
        assert!(stderr.contains("nothing was imported"), "{name}: {stderr}");
        assert!(
            !stderr.contains('\u{1b}'),
            "{name}: raw escape in {stderr:?}"
        );
    }
    let listed: Value =
        serde_json::from_slice(&other.durun(&["inspect", "--json"]).stdout).expect("JSON");
    assert_eq!(listed["tasks"], json!([]), "nothing was written");
}

/// A file that says its task is queued does not get it run: it arrives
/// interrupted, with no queue, until someone resumes or queues it.
fn an_imported_task_runs_only_when_asked(other: &TestEnv, lines: &[Value]) {
    let edited = |edit: &dyn Fn(&mut Vec<Value>)| edited(lines, edit);
    // A file that says it is queued arrives interrupted, with no queue: no
    // worker starts what a file says.
    let pwned = other.path("PWNED");
    let queued = edited(&|lines: &mut Vec<Value>| {
        lines[0]["task"]["status"] = json!("queued");
        lines[0]["task"]["queue"] = json!("default");
        lines[0]["task"]["argv"] = json!(
            // It fails, so that a second resume runs it again.
            serde_json::to_string(&["sh", "-c", &format!("touch {}; exit 3", pwned.display())])
                .unwrap()
        );
    });
    other.write("queued.jsonl", &queued);
    let imported = other.durun(&["import", "queued.jsonl"]);
    let stderr = text(&imported.stderr);
    assert!(imported.status.success(), "{stderr}");
    assert!(stderr.contains("`durun resume t` continues it"), "{stderr}");
    assert!(stderr.contains("it runs `sh -c 'touch "), "{stderr}");
    let task = other.inspect("t");
    assert_eq!(task["task"]["status"], "interrupted");
    assert_eq!(task["task"]["queue"], Value::Null);
    // A worker that has taken a task queued after it has looked at the
    // imported one, which is older, and left it.
    let probe = other.durun(&["-q", "submit", "--task", "probe", "--", "true"]);
    assert!(probe.status.success(), "{}", text(&probe.stderr));
    let mut worker = other
        .command()
        .args(["worker"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("a worker");
    wait_for(
        "the worker to run the probe",
        Duration::from_secs(30),
        || other.inspect("probe")["task"]["status"] == "completed",
    );
    crate::env::signal(worker.id() as i32, libc::SIGTERM);
    worker.wait().expect("the worker ends");
    assert!(
        !pwned.exists(),
        "a worker ran an imported task nobody resumed"
    );
    // Named on purpose, it is queued; its first resume says what it runs.
    let again = other.durun(&["import", "queued.jsonl", "--replace", "--queue", "ci"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(other.inspect("t")["task"]["status"], "queued");
    assert_eq!(other.inspect("t")["task"]["queue"], "ci");
    let resumed = other.durun(&["resume", "t"]);
    let stderr = text(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("was imported") && stderr.contains("it runs `sh -c 'touch "),
        "{stderr}"
    );
    assert!(pwned.exists());
    // The next resume runs it again, and says nothing of the import.
    let later = other.durun(&["resume", "t"]);
    let stderr = text(&later.stderr);
    assert_eq!(later.status.code(), Some(3), "{stderr}");
    assert!(
        !stderr.contains("was imported"),
        "only the first resume: {stderr}"
    );
    // It holds steps: a run that made none is still resumable.
    assert!(
        stderr.contains("continue with `durun resume t`"),
        "{stderr}"
    );

    // A completed task is not "continued".
    let done = sealed(lines);
    other.write("done.jsonl", &done);
    let imported = other.durun(&["import", "done.jsonl", "--task", "done"]);
    let stderr = text(&imported.stderr);
    assert!(imported.status.success(), "{stderr}");
    assert!(stderr.contains("it is completed"), "{stderr}");
    assert!(!stderr.contains("durun resume"), "{stderr}");
}

#[test]
fn a_fork_replays_the_steps_before_n_and_runs_the_rest_anew() {
    let env = waiter_env();
    let plan = json!([{"step": "one"}, {"step": "two"}, {"step": "three"}]);
    assert!(
        run(&env, &waiter_args(&env, "t", &plan, &[]))
            .status
            .success()
    );
    let forked = env.durun(&["fork", "t", "--from-step", "3", "--task", "t2"]);
    assert!(forked.status.success(), "{}", text(&forked.stderr));
    assert_eq!(text(&forked.stdout).trim(), "t2");
    let resumed = env.durun(&["resume", "t2"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(ran(&env), ["one", "two", "three", "three"]);
    let original = env.inspect("t");
    let fork = env.inspect("t2");
    assert_eq!(fork["task"]["status"], "completed");
    assert_eq!(
        fork["steps"][0]["idempotency_key"],
        original["steps"][0]["idempotency_key"]
    );
    assert_ne!(
        fork["steps"][2]["idempotency_key"],
        original["steps"][2]["idempotency_key"]
    );
    assert_eq!(
        original["task"]["runs"].as_array().map(Vec::len),
        Some(1),
        "the original is untouched"
    );
    let beyond = env.durun(&["fork", "t", "--from-step", "9"]);
    assert_eq!(beyond.status.code(), Some(64), "{}", text(&beyond.stderr));
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
