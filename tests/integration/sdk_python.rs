//! The Python SDK as agent authors use it: methods, values, retries in
//! code, asyncio, patches, values fixed across replays, tools without
//! durun, and the real `openai` and `anthropic` clients wrapped by
//! `durun.wrap`, killed and resumed.

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, path_with_durun, sdk_path, text, wait_for};
use crate::servers::{LlmServer, llm_clients};

const ECHO_TOOL: &str = "[tools.echo]\neffect = \"read\"\ncommand = [\"echo\", \"{text}\"]\n";

fn sdk_env() -> TestEnv {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.set("PATH", path_with_durun());
    env.set("STOP_FILE", env.path("stop").to_string_lossy());
    env.write("durun.toml", ECHO_TOOL);
    env
}

fn features(scenario: &str) -> Vec<String> {
    vec![
        "python3".into(),
        agents_dir()
            .join("features.py")
            .to_string_lossy()
            .into_owned(),
        scenario.into(),
    ]
}

/// Runs `durun run --task TASK -- python3 features.py SCENARIO` (or resumes).
fn run(env: &TestEnv, task: &str, scenario: &str) -> std::process::Output {
    let mut args = vec!["run".to_owned(), "--task".into(), task.into(), "--".into()];
    args.extend(features(scenario));
    env.command().args(&args).output().expect("durun")
}

/// What the agent printed as `seen:` lines.
pub(crate) fn seen(output: &std::process::Output) -> Vec<Value> {
    text(&output.stderr)
        .lines()
        .filter_map(|line| line.strip_prefix("seen: "))
        .map(|json| serde_json::from_str(json).expect("seen JSON"))
        .collect()
}

#[test]
fn methods_leave_self_out_and_args_choose_the_identity() {
    let env = sdk_env();
    let output = run(&env, "t", "methods");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(seen(&output)[0], json!(["answer to plan", "GO", 42, 42]));
    let task = env.inspect("t");
    let args: Vec<&Value> = task["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| &step["args"])
        .collect();
    assert_eq!(
        args,
        [
            &json!({}),
            &json!({"prompt": "plan", "temperature": 0}),
            &json!({"prompt": "go"}),
            &json!({"n": 21})
        ]
    );
    assert_eq!(task["steps"][0]["name"], "thunk");
    assert_eq!(
        task["steps"][1]["tokens"], 15,
        "usage in the returned dict counts"
    );
    let again = env.durun(&["resume", "t", "--from-step", "5"]);
    assert!(
        again.status.success(),
        "every step replays: {}",
        text(&again.stderr)
    );
}

#[test]
fn values_are_stored_by_rule_and_what_json_cannot_hold_is_refused_by_name() {
    let env = sdk_env();
    let output = run(&env, "t", "values");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let seen = seen(&output);
    assert_eq!(seen[0]["point"], json!({"x": 1, "y": 2}));
    assert_eq!(seen[0]["pair"], json!([1, 2]));
    assert!(text(&output.stderr).contains("holds a tuple; it is stored as a list"));
    let arg_error = seen[1]["arg_error"].as_str().expect("an args error");
    assert!(
        arg_error.contains("step 'bad.arg'") && arg_error.contains("Client"),
        "{arg_error}"
    );
    assert!(
        !seen.contains(&json!("the bad step ran")),
        "refused before the work"
    );
    let value_error = seen[2]["value_error"].as_str().expect("a value error");
    assert!(
        value_error.contains("step 'bad.value'") && value_error.contains("builtins.set"),
        "{value_error}"
    );
    let awaitable = seen[3]["awaitable_error"]
        .as_str()
        .expect("an awaitable error");
    assert!(awaitable.contains("returned an awaitable"), "{awaitable}");
    let task = env.inspect("t");
    assert_eq!(
        task["steps"][0]["output"]["when"],
        "2026-12-01T09:00:00+00:00"
    );
    assert_eq!(
        task["steps"].as_array().map(Vec::len),
        Some(3),
        "the bad arg opened no step; the two bad values failed theirs"
    );
    assert_eq!(task["steps"][1]["status"], "failed");
}

/// asyncio alone is tens of milliseconds of a Python agent's start: the SDK
/// imports it, and the other modules a plain script never uses, only when
/// a step needs them.
#[test]
fn importing_the_sdk_loads_no_module_a_plain_script_does_not_use() {
    let env = sdk_env();
    env.write(
        "lean.py",
        r#"
import sys
before = set(sys.modules)
import durun
durun.step("plain", {"n": 1}, lambda: [1, 2])
durun.result(None)
heavy = ("asyncio", "inspect", "dataclasses", "subprocess", "uuid", "hashlib")
print("loaded:", [name for name in heavy if name in set(sys.modules) - before], file=sys.stderr)
"#,
    );
    // `-S`: what the machine's site-packages load is not the SDK's doing.
    let output = env.durun(&["-q", "run", "--task", "l", "--", "python3", "-S", "lean.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("loaded: []"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(env.inspect("l")["steps"][0]["output"], json!([1, 2]));
}

#[test]
fn retries_in_code_journal_every_attempt_under_one_key() {
    let env = sdk_env();
    let output = run(&env, "t", "retries");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let seen = seen(&output);
    assert_eq!(seen[0], "third time");
    let attempts = seen[1].as_array().expect("attempts");
    assert_eq!(
        attempts.iter().map(|a| a[0].clone()).collect::<Vec<_>>(),
        [json!(1), json!(2), json!(3)]
    );
    assert!(
        attempts.iter().all(|a| a[1] == attempts[0][1]),
        "one key: {attempts:?}"
    );
    assert_eq!(seen[2], "fast enough");
    let task = env.inspect("t");
    assert_eq!(task["steps"][0]["attempts"], 3);
    assert_eq!(task["steps"][0]["idempotency_key"], attempts[0][1]);
    assert_eq!(
        task["steps"][1]["attempts"], 2,
        "the timed-out attempt is journaled"
    );
}

#[test]
fn asyncio_steps_and_calls_are_numbered_in_the_order_they_open() {
    let env = sdk_env();
    let output = run(&env, "t", "async");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(seen(&output)[0], json!([[2, 4, 6], ["a\n", "b\n"], "c\n"]));
    let task = env.inspect("t");
    let args: Vec<Value> = task["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| step["args"].clone())
        .collect();
    assert_eq!(
        args,
        [
            json!({"n": 1}),
            json!({"n": 2}),
            json!({"n": 3}),
            json!({"text": "a"}),
            json!({"text": "b"}),
            json!({"text": "c"})
        ]
    );
    // Replayed, gather gets the same steps in the same order.
    let again = env.durun(&["resume", "t", "--from-step", "7"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(seen(&again)[0], json!([[2, 4, 6], ["a\n", "b\n"], "c\n"]));
}

#[test]
fn threads_and_an_event_loop_share_the_channel() {
    let env = sdk_env();
    let output = run(&env, "t", "threads");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let seen = seen(&output);
    assert_eq!(seen[0][0], 800);
    assert_eq!(seen[0][1], true, "every thread got its own answers");
    assert_eq!(seen[0][2], json!((0..30).collect::<Vec<_>>()));
    assert_eq!(seen[0][3], 19);
    assert_eq!(
        env.inspect("t")["steps"].as_array().map(Vec::len),
        Some(850)
    );
}

#[test]
fn a_patch_keeps_old_tasks_on_their_path_and_new_ones_on_the_new_code() {
    let mut env = sdk_env();
    // A task recorded by version 1, stopped before its last step.
    env.set("AGENT_VERSION", "1");
    std::fs::write(env.path("stop"), "").expect("stop");
    assert_eq!(run(&env, "old", "patched").status.code(), Some(3));
    // Version 2 resumes it on the old path, and runs a new task on the new one.
    env.set("AGENT_VERSION", "2");
    let resumed = env.durun(&["resume", "old"]);
    assert!(
        resumed.status.success(),
        "no divergence: {}",
        text(&resumed.stderr)
    );
    assert_eq!(seen(&resumed)[0], json!(["first", "old", "last"]));
    let new = run(&env, "new", "patched");
    assert!(new.status.success(), "{}", text(&new.stderr));
    assert_eq!(seen(&new)[0], json!(["first", "new", "last"]));
    // The patch is recorded: a resume of the new task replays it.
    let replayed = env.durun(&["resume", "new", "--from-step", "5"]);
    assert!(replayed.status.success(), "{}", text(&replayed.stderr));
    assert_eq!(seen(&replayed)[0], json!(["first", "new", "last"]));
    let steps = env.inspect("new")["steps"].clone();
    assert_eq!(steps[1]["name"], "durun.patched");
}

#[test]
fn now_random_and_uuid_are_the_same_on_every_replay() {
    let env = sdk_env();
    std::fs::write(env.path("stop"), "").expect("stop");
    let first = run(&env, "t", "deterministic");
    assert_eq!(first.status.code(), Some(3));
    std::thread::sleep(Duration::from_millis(20));
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(seen(&first)[0], seen(&resumed)[0]);
    assert_eq!(env.inspect("t")["task"]["output"], seen(&first)[0]);
}

#[test]
fn without_durun_a_tool_still_runs_from_durun_toml() {
    let env = sdk_env();
    let output = std::process::Command::new("python3")
        .args(&features("standalone")[1..])
        .current_dir(env.dir.path())
        .env("PYTHONPATH", sdk_path())
        .env("PATH", path_with_durun())
        .env_remove("DURUN_PROTOCOL")
        .env_remove("DURUN_SOCKET")
        .output()
        .expect("python3");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(seen(&output)[0], json!([false, "hi\n", 7]));
    let shell = std::process::Command::new(assert_cmd::cargo::cargo_bin("durun"))
        .args(["call", "nope"])
        .current_dir(env.dir.path())
        .env_remove("DURUN_SOCKET")
        .output()
        .expect("durun");
    assert_eq!(shell.status.code(), Some(64), "{}", text(&shell.stderr));
    assert!(
        text(&shell.stderr).contains("has no tool `nope`"),
        "{}",
        text(&shell.stderr)
    );
}

#[test]
fn durun_step_counts_the_tokens_a_command_reports() {
    let env = sdk_env();
    let script = env.write(
        "agent.sh",
        "durun step llm --usage-json u.json -- sh -c 'echo plan; echo \"{\\\"input_tokens\\\": 30, \\\"output_tokens\\\": 12}\" > u.json'\n\
         durun step json -- echo '{\"text\": \"x\", \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 2}}'\n",
    );
    let output = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "bash",
        &script.to_string_lossy(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let task = env.inspect("t");
    assert_eq!(task["steps"][0]["tokens"], 42);
    assert_eq!(task["steps"][1]["tokens"], 7);
    assert_eq!(task["task"]["tokens_spent"], 49);
}

#[test]
fn an_asyncio_agent_with_wrapped_clients_survives_sigkill_and_resends_nothing() {
    if !llm_clients() {
        return;
    }
    let mut env = sdk_env();
    let server = LlmServer::start(&env);
    env.set("LLM_BASE", server.base());
    env.set("HOLD_FILE", env.path("hold").to_string_lossy());
    env.set("HOLDING_FILE", env.path("holding").to_string_lossy());
    let agent = agents_dir().join("async_agent.py");
    let mut durun = env.spawn(
        &[
            "run",
            "--task",
            "t",
            "--",
            "python3",
            &agent.to_string_lossy(),
        ],
        "run",
    );
    wait_for("the hold step", Duration::from_secs(60), || {
        env.path("holding").exists()
    });
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    let before = server.counts();
    assert_eq!(
        before.as_object().map(serde_json::Map::len),
        Some(8),
        "{before}"
    );
    std::fs::write(env.path("hold"), "").expect("release");
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let after = server.counts();
    assert_eq!(after, before, "no request was sent again");
    assert!(
        after.as_object().unwrap().values().all(|count| count == 1),
        "{after}"
    );
    the_asyncio_task_has_every_call_once(&env.inspect("t"));
    durun_test_of_the_asyncio_agent_holds(&env, &server, &agent);
}

/// The resumed asyncio task: every call once, in argument order, the
/// streams' usage counted, the first run's tokens saved.
fn the_asyncio_task_has_every_call_once(task: &Value) {
    let summary = task["task"]["output"]["summary"].as_str().expect("summary");
    assert_eq!(
        summary,
        "echo: plan | echo: part a | echo: part b | echo: part c | echo: stream | echo: respond | echo: claude | echo: claude stream"
    );
    let steps = task["steps"].as_array().expect("steps");
    let names: Vec<&str> = steps[..8]
        .iter()
        .map(|step| step["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "openai.chat.completions.create",
            "openai.chat.completions.create",
            "openai.chat.completions.create",
            "openai.chat.completions.create",
            "openai.chat.completions.create",
            "openai.responses.create",
            "anthropic.messages.create",
            "anthropic.messages.create",
        ]
    );
    // gather's three calls are steps 2-4, in argument order.
    for (index, part) in ["part a", "part b", "part c"].iter().enumerate() {
        assert_eq!(steps[index + 1]["args"]["messages"][0]["content"], *part);
    }
    assert_eq!(steps[4]["tokens"], 60, "the stream's usage chunk counts");
    assert_eq!(
        steps[7]["tokens"], 48,
        "the Anthropic stream's usage counts"
    );
    let saved = task["task"]["runs"][1]["tokens_saved"]
        .as_u64()
        .expect("saved");
    let spent = task["task"]["tokens_spent"].as_u64().expect("spent");
    assert!(saved >= 600 && saved == spent, "saved {saved} of {spent}");
}

/// `durun test` of the same agent.
fn durun_test_of_the_asyncio_agent_holds(
    env: &TestEnv,
    server: &LlmServer,
    agent: &std::path::Path,
) {
    // `durun test` of the same asyncio agent (killed after each step, where
    // a commit is lost): every trial holds, and the wrapped calls of the
    // trials are answered from the reference's steps.
    let tested = env.durun(&[
        "test",
        "--json",
        "--jobs",
        "2",
        "--points",
        "after",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    let report: serde_json::Value = serde_json::from_slice(&tested.stdout)
        .unwrap_or_else(|_| panic!("no JSON: {}", text(&tested.stderr)));
    assert_eq!(tested.status.code(), Some(0), "{report:#}");
    assert_eq!(report["trials"].as_array().map(Vec::len), Some(12));
    let tested_counts = server.counts();
    assert!(
        tested_counts
            .as_object()
            .unwrap()
            .values()
            .all(|count| count == 2),
        "one call each for the reference, none for the trials: {tested_counts}"
    );
}

#[test]
fn sync_clients_wrapped_are_answered_from_the_journal_on_resume() {
    if !llm_clients() {
        return;
    }
    let mut env = sdk_env();
    let server = LlmServer::start(&env);
    env.set("LLM_BASE", server.base());
    let agent = agents_dir().join("sync_clients.py");
    let agent = agent.to_string_lossy();
    let first = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    // The clients' own response types, first run and replay.
    for run in [&first, &resumed] {
        assert!(
            text(&run.stderr).contains("types: ChatCompletion Response Message"),
            "{}",
            text(&run.stderr)
        );
    }
    let counts = server.counts();
    assert_eq!(
        counts.as_object().map(serde_json::Map::len),
        Some(5),
        "{counts}"
    );
    assert!(
        counts.as_object().unwrap().values().all(|count| count == 1),
        "{counts}"
    );
    assert_eq!(
        env.inspect("t")["task"]["output"],
        json!([
            "echo: sync plan",
            "echo: sync stream",
            "echo: sync respond",
            "echo: sync claude",
            "echo: sync claude stream",
            120
        ])
    );
}

/// A commit the SDK posted without waiting, refused by durun (its journal
/// locked past the busy timeout): the agent hears of it within its next 64
/// short steps, at once from a request that waits, or at exit when it
/// makes none; never silently.
#[test]
fn a_refused_commit_is_raised_at_the_next_request_or_reported_at_exit() {
    for scenario in ["refused_next", "refused_exit"] {
        let mut env = sdk_env();
        if env.postgres.is_some() {
            // The refusal comes from SQLite's write lock held past the
            // busy timeout; the SDK's side is the same on every backend.
            crate::env::skipped(crate::env::SQLITE_ONLY);
            return;
        }
        env.set("DURUN_BUSY_TIMEOUT_MS", "200");
        env.set("READY_FILE", env.path("ready").to_string_lossy());
        env.set("GO_FILE", env.path("go").to_string_lossy());
        let mut args = vec!["run", "--task", "t", "--"];
        let agent = features(scenario);
        args.extend(agent.iter().map(String::as_str));
        let mut durun = env.spawn(&args, "run");
        wait_for("the agent's first step", Duration::from_secs(20), || {
            env.path("ready").exists()
        });
        // Step a's commit was posted, not waited for: it must be durable
        // before the lock, or it is the one refused.
        wait_for("step a to be durable", Duration::from_secs(20), || {
            let shown = env.durun(&["inspect", "t", "--json"]);
            serde_json::from_slice::<Value>(&shown.stdout)
                .is_ok_and(|task| task["steps"][0]["status"] == "committed")
        });
        let holder = rusqlite::Connection::open(&env.journal).expect("open the journal");
        holder
            .execute_batch("BEGIN IMMEDIATE; UPDATE tasks SET cwd = cwd;")
            .expect("lock the journal");
        std::fs::write(env.path("go"), "").expect("go");
        let status = crate::env::wait_exit(&mut durun, Duration::from_secs(30));
        holder.execute_batch("ROLLBACK").expect("unlock");
        drop(holder);
        let log = env.log("run");
        assert_eq!(status.code(), Some(74), "{scenario}: {log}");
        let said: Vec<Value> = log
            .lines()
            .filter_map(|line| line.strip_prefix("seen: "))
            .map(|json| serde_json::from_str(json).expect("seen JSON"))
            .collect();
        // The step's value came back at once, before the commit's answer.
        assert_eq!(said[0], json!(2), "{scenario}: {log}");
        if scenario == "refused_next" {
            assert_eq!(said.len(), 3, "{scenario}: {log}");
            for raised in &said[1..3] {
                assert_eq!(raised["raised"], "JournalError", "{scenario}: {log}");
                assert!(
                    raised["message"]
                        .as_str()
                        .is_some_and(|message| message.contains("could not write the journal")),
                    "{scenario}: {log}"
                );
            }
            // The SDK reads posted answers every 128 posts, two a step.
            let after = said[1]["after"].as_u64().expect("after");
            assert!((1..=64).contains(&after), "{scenario}: {log}");
        } else {
            assert!(
                log.lines().any(|line| line.starts_with(
                    "durun: the commit of step 2 was refused: durun could not write the journal"
                )),
                "{scenario}: the SDK did not report the refusal at exit: {log}"
            );
        }
        // Step a is kept; b, refused, runs again on resume.
        let steps = env.inspect("t")["steps"].clone();
        assert_eq!(steps[0]["status"], "committed", "{scenario}: {steps}");
        assert!(
            steps.as_array().expect("steps").len() == 1,
            "{scenario}: {steps}"
        );
        env.assert_journal_intact();
    }
}
