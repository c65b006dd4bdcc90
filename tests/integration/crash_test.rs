//! `durun test` (SPEC 14): it passes a sound agent without spending a
//! model call, and fails, with the right diagnosis, each agent that is
//! wrong in one of the classic ways.

use serde_json::Value;

use crate::env::{TestEnv, agents_dir, text};
use crate::servers::LlmServer;

/// An environment with the subject agent's `create` tool and the fake LLM
/// as the model upstream.
fn subject_env() -> (TestEnv, LlmServer) {
    let mut env = TestEnv::new();
    let server = LlmServer::start(&env);
    env.set("OPENAI_BASE_URL", format!("{}/v1", server.base()));
    let create = agents_dir().join("create.py");
    env.write(
        "durun.toml",
        &format!(
            "[tools.create]\neffect = \"mutate\"\ncommand = [\"python3\", \"{}\"]\nstdin = \"args\"\noutput = \"json\"\ntimeout = \"30s\"\n",
            create.display()
        ),
    );
    (env, server)
}

fn subject() -> String {
    agents_dir()
        .join("subject.py")
        .to_string_lossy()
        .into_owned()
}

const CHECK: &str = "cat \"$DURUN_TEST_SCRATCH/resources.jsonl\"";

/// `durun test --json ARGS -- python3 subject.py`: its exit code and JSON.
fn durun_test(env: &TestEnv, args: &[&str]) -> (Option<i32>, Value, String) {
    let agent = subject();
    let mut all = vec!["test", "--json"];
    all.extend_from_slice(args);
    all.extend(["--", "python3", &agent]);
    let output = env.durun(&all);
    let stderr = text(&output.stderr);
    let report = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("no JSON ({err}): {}\n{stderr}", text(&output.stdout)));
    (output.status.code(), report, stderr)
}

fn trials(report: &Value) -> &Vec<Value> {
    report["trials"].as_array().expect("trials")
}

#[test]
fn a_sound_agent_holds_at_every_step_and_trials_spend_no_model_call() {
    let (env, server) = subject_env();
    let (code, report, stderr) = durun_test(&env, &["--check", CHECK, "--jobs", "2"]);
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["ok"], true);
    // A model call, two reads, a mutate call: four steps, three points.
    let trials = trials(&report);
    assert_eq!(trials.len(), 12, "{report:#}");
    for trial in trials {
        // `during` a read that takes no time, there is nothing to kill in:
        // not reached, never `ok`.
        let status = if trial["killed"] == true {
            "ok"
        } else {
            "not reached"
        };
        assert_eq!(trial["status"], status, "{trial:#}");
        assert_eq!(trial["resent_model_calls"], 0);
        assert_eq!(trial["tokens_respent"], 0);
    }
    // Every trial killed durun where it was asked to, but `during` a read
    // that takes no time; `during` the model call, while the recorder held
    // it in flight.
    assert!(
        trials
            .iter()
            .filter(|trial| trial["point"] != "during" || trial["step"] == 1)
            .all(|trial| trial["killed"] == true),
        "{report:#}"
    );
    // The model saw the reference's one call, no more.
    let counts = server.counts();
    assert_eq!(
        counts.as_object().map(serde_json::Map::len),
        Some(1),
        "{counts}"
    );
    assert_eq!(counts["/v1/chat/completions plan the work"], 1, "{counts}");
    // Killed during the tool, the mutate step reached it twice, with one key.
    let during = trials
        .iter()
        .find(|trial| trial["step"] == 4 && trial["point"] == "during")
        .expect("the during trial of the mutate step");
    let keys = during["mutate_keys"]
        .as_object()
        .expect("keys")
        .values()
        .collect::<Vec<_>>();
    assert_eq!(keys.len(), 1, "{during:#}");
    assert_eq!(keys[0]["attempts"], 2, "{during:#}");
    assert_eq!(keys[0]["name"], "create");
    // Each trial says what ran again: the tool in flight at the kill, the
    // model call held in flight; nothing where the kill came between steps.
    assert_eq!(
        during["ran_again"],
        serde_json::json!(["step 4 `create`"]),
        "{during:#}"
    );
    let held = trials
        .iter()
        .find(|trial| trial["step"] == 1 && trial["point"] == "during")
        .expect("the during trial of the model call");
    assert_eq!(
        held["ran_again"],
        serde_json::json!(["`openai POST /chat/completions`"]),
        "{held:#}"
    );
    let between = trials
        .iter()
        .find(|trial| trial["step"] == 2 && trial["point"] == "before")
        .expect("a trial killed between steps");
    assert_eq!(between["ran_again"], serde_json::json!([]), "{between:#}");
    // Nothing of the user's journal was touched.
    assert!(!env.path("state/journal.db").exists());
}

#[test]
fn a_side_effect_outside_any_step_is_caught_by_check() {
    let (mut env, _server) = subject_env();
    env.set("MISTAKE", "outside");
    let (code, report, _) = durun_test(
        &env,
        &[
            "--check",
            "cat \"$DURUN_TEST_SCRATCH/world.txt\"",
            "--points",
            "after",
        ],
    );
    assert_eq!(code, Some(1), "{report:#}");
    let failed: Vec<&Value> = trials(&report)
        .iter()
        .filter(|trial| trial["status"] == "failed")
        .collect();
    assert_eq!(
        failed.len(),
        4,
        "every trial ran the agent twice: {report:#}"
    );
    let diff = failed[0]["diff"].to_string();
    assert!(diff.contains("--check printed another state"), "{diff}");
    assert!(diff.contains("+ started"), "{diff}");
}

#[test]
fn a_prompt_from_the_clock_diverges_with_the_diff() {
    let (mut env, server) = subject_env();
    env.set("MISTAKE", "clock");
    let (code, report, _) = durun_test(&env, &["--points", "before", "--steps", "2"]);
    assert_eq!(code, Some(1), "{report:#}");
    let trial = &trials(&report)[0];
    assert_eq!(trial["status"], "diverged", "{trial:#}");
    let diff = trial["diff"].to_string();
    assert!(diff.contains("not made by the reference"), "{diff}");
    assert!(
        diff.contains("/messages/0/content"),
        "the diff names what changed: {diff}"
    );
    assert!(
        diff.contains(
            r#"add to durun.toml [proxy] ignore = [\"/messages/0/content\"] to replay this call"#
        ),
        "and what replays it: {diff}"
    );
    // The trial's changed call never reached the model.
    assert_eq!(
        server.counts().as_object().map(serde_json::Map::len),
        Some(1)
    );
    // The table ends each failure with the command that runs it again.
    let agent = subject();
    let human = env.durun(&[
        "test", "--points", "before", "--steps", "2", "--", "python3", &agent,
    ]);
    assert_eq!(human.status.code(), Some(1));
    let printed = text(&human.stdout);
    assert!(
        printed.contains(&format!(
            "  again: durun test --steps 2 --points before -- python3 {agent}\n"
        )),
        "{printed}"
    );
}

#[test]
fn a_tool_that_ignores_the_key_is_caught_by_check_and_the_key_is_shown() {
    let (mut env, _server) = subject_env();
    env.set("NO_DEDUPE", "1");
    // Killed after the tool returned, before its result was durable: the
    // resource exists and the retry comes with the same key, whatever the
    // machine's load (a `during` kill may land before the tool has made
    // it, on a busy machine).
    let (code, report, _) = durun_test(
        &env,
        &["--check", CHECK, "--points", "after", "--steps", "4"],
    );
    assert_eq!(code, Some(1), "{report:#}");
    let trial = &trials(&report)[0];
    assert_eq!(trial["status"], "failed", "{trial:#}");
    assert_eq!(trial["killed"], true);
    let diff = trial["diff"].to_string();
    assert!(
        diff.contains("res-2"),
        "two resources instead of one: {diff}"
    );
    let notes = trial["notes"].to_string();
    assert!(notes.contains("the tool must deduplicate by it"), "{notes}");
    let key = trial["mutate_keys"]["4"]["key"].as_str().expect("a key");
    assert!(notes.contains(key), "{notes}");
}

#[test]
fn steps_named_from_a_sets_order_diverge() {
    let (mut env, _server) = subject_env();
    env.set("MISTAKE", "set_order");
    let (code, report, _) = durun_test(&env, &["--points", "after"]);
    assert_eq!(code, Some(1), "{report:#}");
    let diverged = trials(&report)
        .iter()
        .filter(|trial| trial["status"] == "diverged")
        .count();
    // A trial killed after a read resumes with those five strings in
    // another order four times in five: one trial in six of them holding
    // by chance has odds of 1 in 15,000.
    assert!(diverged >= 1, "{report:#}");
}

#[test]
fn a_fault_at_a_model_call_tests_the_agents_own_retry() {
    let (env, server) = subject_env();
    let (code, report, _) = durun_test(
        &env,
        &[
            "--fault",
            "http-500@1",
            "--points",
            "before",
            "--steps",
            "1-2",
            "--junit",
            "junit.xml",
        ],
    );
    assert_eq!(code, Some(0), "the agent retries: {report:#}");
    assert_eq!(server.counts()["/v1/chat/completions plan the work"], 1);
    let junit = std::fs::read_to_string(env.path("junit.xml")).expect("the JUnit report");
    assert!(junit.contains("tests=\"2\" failures=\"0\""), "{junit}");
    // Every other kind, through the proxy: a 429, a connection reset, an
    // answer cut off mid-body. None is a finished step; the retry is.
    for kind in ["http-429@1", "reset@1", "truncate@1"] {
        let (code, report, _) = durun_test(
            &env,
            &["--fault", kind, "--points", "after", "--steps", "1"],
        );
        assert_eq!(code, Some(0), "{kind}: {report:#}");
        assert_eq!(trials(&report)[0]["killed"], true, "{kind}: {report:#}");
    }
    assert_eq!(server.counts()["/v1/chat/completions plan the work"], 4);

    let (mut env, _server) = subject_env();
    env.set("MISTAKE", "no_retry");
    let (code, report, _) = durun_test(
        &env,
        &[
            "--fault",
            "reset@1",
            "--points",
            "before",
            "--steps",
            "1",
            "--junit",
            "junit.xml",
        ],
    );
    assert_eq!(code, Some(1), "no retry: {report:#}");
    assert_eq!(trials(&report)[0]["status"], "failed");
    let junit = std::fs::read_to_string(env.path("junit.xml")).expect("the JUnit report");
    assert!(junit.contains("<failure message=\"failed\">"), "{junit}");
}

#[test]
fn a_fault_at_a_tool_call_fails_it_without_the_tool() {
    let (env, _server) = subject_env();
    let args = [
        "--fault",
        "http-500@4",
        "--points",
        "before",
        "--steps",
        "3",
        // The retry is a new call, with a key of its own: resources by id.
        "--check",
        "grep -o '\"id\": \"[^\"]*\"' \"$DURUN_TEST_SCRATCH/resources.jsonl\"",
    ];
    let (code, report, _) = durun_test(&env, &args);
    assert_eq!(code, Some(1), "the agent does not retry: {report:#}");
    let diff = trials(&report)[0]["diff"].to_string();
    assert!(diff.contains("the task ended failed"), "{diff}");
    assert!(
        diff.contains("http-500: a fault made by durun test"),
        "{diff}"
    );

    let (mut env, _server) = subject_env();
    env.set("RETRY_CALLS", "1");
    let (code, report, _) = durun_test(&env, &args);
    assert_eq!(code, Some(0), "the agent retries the call: {report:#}");
}

#[test]
fn the_human_report_and_bad_input() {
    let (env, _server) = subject_env();
    let agent = subject();
    let output = env.durun(&["test", "--points", "before", "--", "python3", &agent]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    assert!(printed.starts_with("STEP  NAME"), "{printed}");
    assert!(printed.contains("read alpha"), "{printed}");
    assert!(
        printed.contains("all 4 trials held: the agent survives a crash at every step tried\n"),
        "{printed}"
    );
    assert!(
        printed
            .trim_end()
            .ends_with("side effects were not checked: give --check CMD, a command that prints the state of the world, to compare it after each trial"),
        "without --check, the verdict says what it did not try: {printed}"
    );
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("durun test: 4/4"),
        "progress, a line per trial: {stderr}"
    );

    // A fault at a step that is neither a model call nor a tool.
    let output = env.durun(&["test", "--fault", "http-429@2", "--", "python3", &agent]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains(
            "durun: --fault at step 2: step 2 (`read alpha`) is neither a model call through durun's proxy nor a tool durun runs"
        ),
        "{}",
        text(&output.stderr)
    );
    // An agent that fails by itself.
    let output = env.durun(&["test", "--", "python3", "-c", "raise SystemExit(3)"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("durun: the reference run did not complete (exit 3)"),
        "{}",
        text(&output.stderr)
    );
    let output = env.durun(&["test", "--steps", "5-2", "--", "true"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn a_run_that_hangs_is_ended_at_the_timeout_and_an_interrupt_cleans_up() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", crate::env::sdk_path());
    env.set("TMPDIR", env.path("tmp").to_string_lossy());
    std::fs::create_dir(env.path("tmp")).expect("tmp");
    // Fine the first time; a resume waits for something that never comes.
    let agent = env.write(
        "agent.py",
        "import os, time, durun\ndurun.step('a', {}, lambda: 1)\nif os.environ['DURUN_RUN'] != '1':\n    time.sleep(60)\n",
    );
    let agent = agent.to_string_lossy();
    let args = ["test", "--json", "--timeout", "3s", "--points", "before"];
    let output = env.durun(&[&args[..], &["--", "python3", &agent]].concat());
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(output.status.code(), Some(1), "{report:#}");
    assert_eq!(trials(&report)[0]["status"], "failed");
    assert!(
        trials(&report)[0]["diff"]
            .to_string()
            .contains("did not end in time"),
        "{report:#}"
    );

    // Stopped with SIGINT during the reference: its runs end with it, and
    // the scratch directory goes.
    let slow = env.write(
        "slow.py",
        "import time, durun\ndurun.step('a', {}, lambda: time.sleep(60))\n",
    );
    let mut test = env
        .command()
        .args(["test", "--", "python3", &slow.to_string_lossy()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("durun test");
    crate::env::wait_for(
        "the scratch directory",
        std::time::Duration::from_secs(30),
        || std::fs::read_dir(env.path("tmp")).is_ok_and(|mut dir| dir.next().is_some()),
    );
    // The reference run's agent runs (python3 itself: durun's command
    // lines name slow.py too).
    let slow = slow.to_string_lossy().into_owned();
    crate::env::wait_for(
        "the reference run's agent",
        std::time::Duration::from_secs(30),
        || {
            !crate::env::processes_whose_args(|args| {
                args.first()
                    .is_some_and(|program| program.ends_with(b"python3"))
                    && args.contains(&slow.as_bytes())
            })
            .is_empty()
        },
    );
    crate::env::signal(test.id() as i32, libc::SIGINT);
    let status = crate::env::wait_exit(&mut test, std::time::Duration::from_secs(20));
    assert_eq!(status.code(), Some(130));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut test.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(
        stderr.contains("durun: durun test was interrupted during the reference run"),
        "{stderr}"
    );
    // (The killed run's socket directory, `durun-PID-…`, is swept by the
    // next run, as after any SIGKILL.)
    let left: Vec<_> = std::fs::read_dir(env.path("tmp"))
        .expect("tmp")
        .map(|entry| entry.expect("entry").file_name())
        .filter(|name| name.to_string_lossy().starts_with("durun-test-"))
        .collect();
    assert!(left.is_empty(), "the scratch directory is gone: {left:?}");
}
