//! The crash test of the design: an 8-step agent (steps 1-3 LLM calls, step
//! 4 a `mutate` call to an API that honours `Idempotency-Key`) is killed
//! while step 4's request is in flight (the API got it, the answer never came
//! back), then resumed. Steps 1-3 replay with zero LLM calls, step 4 is sent
//! again with the same key and creates nothing new, steps 5-8 run.
//!
//! Each scenario runs twice: with tools that durun runs (`call`) and with
//! steps the agent runs itself (`begin`/`commit`); and the kill hits durun
//! (SIGKILL), the agent (SIGKILL), the tool (SIGKILL), or durun (SIGTERM).

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{
    TestEnv, agents_dir, process_gone, read_json_lines, read_pid, signal, text, wait_for,
};
use crate::servers::{FakeApi, FakeLlm};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Variant {
    Call,
    Begin,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kill {
    Durun,
    Agent,
    Tool,
    Sigterm,
}

pub(crate) fn tools_toml() -> String {
    let agents = agents_dir();
    format!(
        r#"
[tools.llm]
effect = "read"
command = ["python3", "{llm}"]
stdin = "args"
output = "json"

[tools.create_resource]
effect = "mutate"
command = ["python3", "{api}"]
stdin = "args"
output = "json"

[tools.read_note]
effect = "read"
command = ["cat", "{{path}}"]

[tools.echo]
effect = "read"
command = ["echo", "{{text}}"]
"#,
        llm = agents.join("llm_tool.py").display(),
        api = agents.join("api_tool.py").display(),
    )
}

fn plan(variant: Variant) -> Value {
    match variant {
        Variant::Call => json!({"steps": [
            {"call": "llm", "args": {"prompt": "plan the change"}},
            {"call": "llm", "args": {"prompt": "research the code"}},
            {"call": "llm", "args": {"prompt": "write the patch"}},
            {"call": "create_resource", "args": {"title": "Fix typo"}},
            {"call": "read_note", "args": {"path": "note.txt"}},
            {"call": "echo", "args": {"text": "six"}},
            {"call": "llm", "args": {"prompt": "summarize"}},
            {"call": "create_resource", "args": {"title": "Notify"}},
        ]}),
        Variant::Begin => json!({"steps": [
            {"begin": "llm.plan", "args": {"prompt": "plan the change"}, "do": {"llm": true}},
            {"begin": "llm.research", "args": {"prompt": "research the code"}, "do": {"llm": true}},
            {"begin": "llm.patch", "args": {"prompt": "write the patch"}, "do": {"llm": true}},
            {"begin": "api.create_pr", "effect": "mutate", "args": {"title": "Fix typo"}, "do": {"api": true}},
            {"begin": "read_note", "args": {"path": "note.txt"}, "do": {"value": "remember the milk"}},
            {"begin": "compute", "args": {"n": 6}, "do": {"value": 42}},
            {"begin": "llm.summary", "args": {"prompt": "summarize"}, "do": {"llm": true}},
            {"begin": "api.notify", "effect": "mutate", "args": {"title": "Notify"}, "do": {"api": true}},
        ]}),
    }
}

/// The text an LLM step produced: the output itself for `begin`, the tool's
/// JSON `text` for `call`.
fn llm_text(output: &Value) -> String {
    output
        .as_str()
        .or_else(|| output["text"].as_str())
        .unwrap_or_else(|| panic!("not an LLM output: {output}"))
        .to_owned()
}

fn crash_and_resume(variant: Variant, kill: Kill) {
    let llm = FakeLlm::start();
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    env.set("LLM_URL", &llm.url);
    env.set("API_URL", &api.url);
    env.set("TOOL_PIDFILE", env.path("tool.pid").to_string_lossy());
    env.write("durun.toml", &tools_toml());
    env.write("note.txt", "remember the milk");
    let mut plan = plan(variant);
    plan["pidfile"] = json!(env.path("agent.pid"));
    let agent = env.scripted_agent("plan.json", &plan);

    let mut durun = api.spawn_until_held(&env, "t1", &agent);

    let (status, step4_attempts) = kill_first_run(kill, variant, &mut durun, (&env, &api));
    api.release();
    assert!(!status.success(), "the first run cannot complete");
    assert_eq!(llm.calls(), 3, "the first run made the three LLM calls");
    assert_eq!(api.resources(), 1, "step 4 reached the API once");
    let first_answers = llm.answers();
    let view = env.inspect("t1");
    let interrupted = view["task"]["status"].as_str().expect("status").to_owned();
    assert!(
        ["interrupted", "failed"].contains(&interrupted.as_str()),
        "after the kill the task is {interrupted}"
    );

    let resumed = env.durun(&["resume", "t1"]);
    assert!(
        resumed.status.success(),
        "resume failed: {}",
        text(&resumed.stderr)
    );

    assert_eq!(
        llm.calls(),
        4,
        "steps 1-3 replayed from the journal; only step 7 called the LLM"
    );
    assert_eq!(
        api.resources(),
        2,
        "step 4 created nothing new; step 8 created one"
    );
    check_the_resumed_task(
        &env.inspect("t1"),
        (&llm, &api),
        &first_answers,
        step4_attempts,
    );
    assert!(
        text(&resumed.stderr).contains("3,000 tokens saved"),
        "the run reports what it saved: {}",
        text(&resumed.stderr)
    );
}

/// Kills what `kill` names while step 4 is held at the API; the first
/// run's status, and the attempts step 4 will have taken once resumed.
fn kill_first_run(
    kill: Kill,
    variant: Variant,
    durun: &mut std::process::Child,
    (env, api): (&TestEnv, &FakeApi),
) -> (std::process::ExitStatus, u64) {
    let agent_pid = read_pid(&env.path("agent.pid"));
    // The step whose answer is lost: attempts it took, and how often its key
    // reaches the API.
    let mut step4_attempts = 2;
    let status = match kill {
        Kill::Durun => {
            durun.kill().expect("SIGKILL durun");
            let status = durun.wait().expect("wait durun");
            // The parent-death signal takes the agent and the tool along.
            wait_for(
                "the agent to die with durun",
                Duration::from_secs(10),
                || process_gone(agent_pid),
            );
            if variant == Variant::Call {
                let tool_pid = read_pid(&env.path("tool.pid"));
                wait_for(
                    "the tool to die with durun",
                    Duration::from_secs(10),
                    || process_gone(tool_pid),
                );
            }
            status
        }
        Kill::Agent => {
            signal(agent_pid, libc::SIGKILL);
            if variant == Variant::Call {
                // durun lets the tool it started finish and records it.
                step4_attempts = 1;
                api.release();
            }
            let status = durun.wait().expect("wait durun");
            assert_eq!(
                status.code(),
                Some(128 + libc::SIGKILL),
                "{}",
                env.log("run1")
            );
            status
        }
        Kill::Tool => {
            assert_eq!(
                variant,
                Variant::Call,
                "only `call` steps have a tool process"
            );
            signal(read_pid(&env.path("tool.pid")), libc::SIGKILL);
            let status = durun.wait().expect("wait durun");
            assert_eq!(
                status.code(),
                Some(3),
                "the agent exits 3 on tool_failed: {}",
                env.log("run1")
            );
            status
        }
        Kill::Sigterm => {
            signal(durun.id() as i32, libc::SIGTERM);
            let status = durun.wait().expect("wait durun");
            assert_eq!(
                status.code(),
                Some(128 + libc::SIGTERM),
                "{}",
                env.log("run1")
            );
            status
        }
    };
    (status, step4_attempts)
}

/// The resumed task against an uninterrupted run's: every step
/// committed, step 4's key sent as often as it was attempted, the LLM
/// answers kept, the tokens saved.
fn check_the_resumed_task(
    view: &Value,
    (llm, api): (&FakeLlm, &FakeApi),
    first_answers: &[String],
    step4_attempts: u64,
) {
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(view["task"]["exit_code"], 0);
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 8);
    assert!(
        steps.iter().all(|step| step["status"] == "committed"),
        "{steps:#?}"
    );
    let key4 = steps[3]["idempotency_key"].as_str().expect("key");
    let sent_with_key4 = api.keys().iter().filter(|key| *key == key4).count();
    assert_eq!(
        sent_with_key4, step4_attempts as usize,
        "step 4 reached the API with one key only"
    );
    assert_eq!(steps[3]["attempts"], step4_attempts);
    assert_eq!(api.keys().len(), step4_attempts as usize + 1);

    // The same final result as an uninterrupted run: the recorded LLM texts,
    // the resource created the first time.
    let outputs = view["task"]["output"]["outputs"]
        .as_array()
        .expect("final output");
    assert_eq!(outputs.len(), 8);
    for i in 0..3 {
        assert_eq!(
            llm_text(&outputs[i]),
            first_answers[i],
            "step {} kept its recorded answer",
            i + 1
        );
    }
    assert_eq!(outputs[3]["id"], "res-1");
    assert_eq!(outputs[7]["id"], "res-2");
    assert_eq!(llm_text(&outputs[6]), llm.answers()[3]);

    let runs = view["task"]["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    let resume = &runs[1];
    let replayed = if step4_attempts == 1 { 4 } else { 3 };
    assert_eq!(resume["replayed_steps"], replayed);
    assert_eq!(resume["executed_steps"], 8 - replayed);
    assert_eq!(
        resume["tokens_saved"], 3000,
        "three LLM steps of 1,000 tokens replayed"
    );
    assert_eq!(
        resume["tokens_spent"], 1000,
        "one LLM step of 1,000 tokens run"
    );
    let saved = resume["tokens_saved"].as_f64().expect("number");
    let spent = resume["tokens_spent"].as_f64().expect("number");
    assert!(
        saved / (saved + spent) > 0.7,
        "the resume saved over 70% of a restart from scratch"
    );
}

#[test]
fn sigkill_durun_during_a_call() {
    crash_and_resume(Variant::Call, Kill::Durun);
}

#[test]
fn sigkill_durun_during_a_begin() {
    crash_and_resume(Variant::Begin, Kill::Durun);
}

#[test]
fn sigkill_the_agent_during_a_call() {
    crash_and_resume(Variant::Call, Kill::Agent);
}

#[test]
fn sigkill_the_agent_during_a_begin() {
    crash_and_resume(Variant::Begin, Kill::Agent);
}

#[test]
fn sigkill_the_tool() {
    crash_and_resume(Variant::Call, Kill::Tool);
}

#[test]
fn sigterm_durun_during_a_call() {
    crash_and_resume(Variant::Call, Kill::Sigterm);
}

#[test]
fn sigterm_durun_during_a_begin() {
    crash_and_resume(Variant::Begin, Kill::Sigterm);
}

/// A `begin` of a step left pending by a dead run is answered `in_doubt`,
/// attempt 2, with the first attempt's key.
#[test]
fn a_pending_step_is_retried_in_doubt_with_its_key() {
    let env = TestEnv::new();
    // Logs every answer; dies inside the step unless `go` exists.
    let probe = r#"
import json, os, sys
sys.stdout.write(json.dumps({"op": "begin", "id": 1, "name": "charge", "args": {"amount": 5}, "effect": "mutate"}) + "\n")
sys.stdout.flush()
answer = sys.stdin.readline()
open("answers.log", "a").write(answer)
if not os.path.exists("go"):
    sys.exit(9)
sys.stdout.write(json.dumps({"op": "commit", "id": 2, "step": 1, "output": "charged"}) + "\n")
sys.stdout.flush()
sys.stdin.readline()
"#;
    env.write("probe.py", probe);
    let first = env.durun(&["run", "--task", "t1", "--", "python3", "probe.py"]);
    assert_eq!(first.status.code(), Some(9), "{}", text(&first.stderr));
    let view = env.inspect("t1");
    assert_eq!(view["task"]["status"], "failed");
    assert_eq!(
        view["steps"][0]["status"], "pending",
        "the intent was written before the agent ran it"
    );

    env.write("go", "");
    let resumed = env.durun(&["resume", "t1"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let answers = read_json_lines(&env.path("answers.log"));
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0]["attempt"], 1);
    assert!(answers[0].get("in_doubt").is_none());
    assert_eq!(answers[1]["attempt"], 2);
    assert_eq!(answers[1]["in_doubt"], true);
    assert_eq!(answers[1]["replayed"], false);
    assert_eq!(answers[0]["idempotency_key"], answers[1]["idempotency_key"]);
    let view = env.inspect("t1");
    assert_eq!(view["steps"][0]["status"], "committed");
    assert_eq!(view["steps"][0]["attempts"], 2);
    assert_eq!(
        view["steps"][0]["idempotency_key"],
        answers[0]["idempotency_key"]
    );
}
