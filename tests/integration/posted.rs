//! An agent that does not wait for a new `read` step's `begin`: it learns
//! from `DURUN_JOURNAL_STEPS` where the journal ends, posts `begin` and
//! `commit` together, and names the step in its commit by the `begin`'s id.

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, text};

/// Writes every request before it reads any answer; exits 3 on the first
/// run (so the task can be resumed) and 0 on the second.
const AGENT: &str = r#"
import json, os, sys
run = int(os.environ["DURUN_RUN"])
held = os.environ.get("DURUN_JOURNAL_STEPS")
requests = [
    {"op": "begin", "id": "b1", "name": "a", "args": {"n": 1}},
    {"op": "commit", "id": "c1", "begin": "b1", "output": {"a": run}},
    {"op": "begin", "id": 2, "name": "b", "args": {}},
    {"op": "fail", "id": "f2", "begin": 2, "error": "no luck"},
    {"op": "commit", "id": "c9", "begin": "b9", "output": 1},
    {"op": "commit", "id": "c1-again", "begin": "b1", "output": 1},
]
if run == 1:
    # A refused begin (bad args) opens nothing: its commit names no step.
    requests += [
        {"op": "begin", "id": "b3", "name": "c", "args": {"x": float("nan")}},
        {"op": "commit", "id": "c3", "begin": "b3", "output": 1},
    ]
for request in requests:
    sys.stdout.write(json.dumps(request) + "\n")
sys.stdout.flush()
answers = [json.loads(sys.stdin.readline()) for _ in requests]
with open(f"run{run}.json", "w") as out:
    json.dump({"held": held, "answers": answers}, out)
sys.exit(3 if run == 1 else 0)
"#;

fn by_id(answers: &Value) -> std::collections::HashMap<String, Value> {
    answers
        .as_array()
        .expect("answers")
        .iter()
        .map(|answer| (answer["id"].to_string().replace('"', ""), answer.clone()))
        .collect()
}

#[test]
fn a_commit_names_its_step_by_the_begin_and_the_agent_learns_where_the_journal_ends() {
    let env = TestEnv::new();
    env.write("agent.py", AGENT);
    let first = env.durun(&["run", "--task", "p", "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let run1: Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("run1.json")).expect("run1"))
            .expect("JSON");
    assert_eq!(run1["held"], "0");
    let answers = by_id(&run1["answers"]);
    assert_eq!(answers["b1"]["step"], 1);
    assert_eq!(answers["c1"]["ok"], true, "{:?}", answers["c1"]);
    assert_eq!(answers["c1"]["step"], 1);
    assert_eq!(answers["2"]["step"], 2);
    assert_eq!(answers["f2"]["ok"], true);
    for refused in ["c9", "c1-again", "b3", "c3"] {
        assert_eq!(
            answers[refused]["ok"], false,
            "{refused}: {:?}",
            answers[refused]
        );
        assert_eq!(answers[refused]["error"]["code"], "bad_request");
    }
    assert!(
        answers["c9"]["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("\"b9\"")),
        "{:?}",
        answers["c9"]
    );
    let view = env.inspect("p");
    assert_eq!(view["steps"][0]["output"], json!({"a": 1}));
    assert_eq!(view["steps"][1]["status"], "failed");
    assert_eq!(view["steps"].as_array().map(Vec::len), Some(2));

    // The resume is told where the journal ends: step 1 replays, and the
    // failed step 2 (the last) runs again.
    let second = env.durun(&["resume", "p"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let run2: Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("run2.json")).expect("run2"))
            .expect("JSON");
    assert_eq!(run2["held"], "2");
    let answers = by_id(&run2["answers"]);
    assert_eq!(answers["b1"]["replayed"], true);
    assert_eq!(answers["b1"]["output"], json!({"a": 1}));
    // A replayed step is not open: the commit that named it is refused.
    assert_eq!(answers["c1"]["ok"], false);
    assert_eq!(answers["2"]["attempt"], 2);
    assert_eq!(answers["f2"]["ok"], true);
}

/// `durun test`'s trials may answer a new step as a replay (the
/// reference's `durun.uuid` here): their agents are not told where the
/// journal ends, so the SDK waits for that step's `begin`, and every trial
/// gets the reference's value.
#[test]
fn an_agent_is_not_told_where_the_journal_ends_when_a_new_step_may_replay() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", crate::env::sdk_path());
    env.write(
        "agent.py",
        r#"
import os, durun
held = os.environ.get("DURUN_JOURNAL_STEPS", "unset")
value = durun.uuid()
durun.step("work", {}, lambda: 1)
with open(os.environ["SEEN"], "a") as seen:
    seen.write(f"{held} {value}\n")
"#,
    );
    env.set("SEEN", env.path("seen").to_string_lossy());
    let output = env.durun(&["test", "--points", "before", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let seen = std::fs::read_to_string(env.path("seen")).expect("seen");
    let lines: Vec<&str> = seen.lines().collect();
    assert!(lines.len() >= 3, "{seen}");
    // The reference was told (a new task: 0); the trials were not, and
    // every run saw the reference's value.
    let (held, value) = lines[0].split_once(' ').expect("two words");
    assert_eq!(held, "0", "{seen}");
    for line in &lines[1..] {
        assert!(line.starts_with("unset "), "{seen}");
        assert!(line.ends_with(value), "{seen}");
    }
}

/// The Python SDK's new `read` steps do not wait for their `begin`; a body
/// that asks for its step's number and key waits for them then, and gets
/// what the journal holds. A resume replays them, then runs new ones.
#[test]
fn the_python_sdk_posts_new_read_steps_and_their_keys_are_the_journals() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", crate::env::sdk_path());
    env.write(
        "agent.py",
        r#"
import os, durun
def seen():
    context = durun.current()
    return {"step": context.step, "key": context.idempotency_key, "attempt": context.attempt}
values = [durun.step("plain", {"i": i}, lambda: i) for i in range(3)]
values += [durun.step("asks", {"i": i}, seen) for i in range(3)]
if os.environ["DURUN_RUN"] == "1":
    raise SystemExit(3)
values.append(durun.step("new", {}, seen))
durun.result(values)
"#,
    );
    let first = env.durun(&["run", "--task", "k", "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let second = env.durun(&["resume", "k"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let view = env.inspect("k");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 7);
    let output = view["task"]["output"].as_array().expect("output").clone();
    assert_eq!(&output[..3], &[json!(0), json!(1), json!(2)]);
    for (value, step) in output[3..].iter().zip(&steps[3..]) {
        assert_eq!(value["step"], step["step"], "{value} {step}");
        assert_eq!(value["key"], step["idempotency_key"], "{value} {step}");
        assert_eq!(value["attempt"], 1);
    }
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 6);
}

/// This test is durun's end of the protocol: it says the journal held no
/// step (every `read` step is new, its `begin` posted) and gives the agent
/// a stdin that is closed. A `mutate` step learns that durun closed the
/// protocol; the `read` step after it is refused before its body runs.
#[test]
fn a_new_step_after_durun_closed_the_protocol_is_refused_before_its_body_runs() {
    let script = r#"
import durun
ran = []
for name, effect in (("first", "mutate"), ("second", "read")):
    try:
        durun.step(name, {}, lambda: ran.append(name), effect=effect)
        print(name + ": returned")
    except Exception as err:
        print(name + ":", err)
print("ran:", ran)
"#;
    let output = std::process::Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", crate::env::sdk_path())
        .env("DURUN_PROTOCOL", "1")
        .env("DURUN_TASK_ID", "t")
        .env("DURUN_JOURNAL_STEPS", "0")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("python3");
    let printed = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{printed}");
    for name in ["first", "second"] {
        assert!(
            printed.contains(&format!("{name}: durun closed the protocol")),
            "{printed}"
        );
    }
    assert!(printed.contains("ran: []"), "no body ran: {printed}");
}

/// Runs `program` on the test agent `script` (20 short steps, each
/// followed at once by a model call through the proxy), kills durun with
/// SIGKILL after the last call and resumes: every call is a step of its
/// own, and none is sent again.
fn calls_right_after_short_steps_are_never_sent_again(program: &str, script: &str) {
    const CALLS: usize = 20;
    let (mut env, server) = crate::proxy::llm_env();
    env.set("PYTHONPATH", crate::env::sdk_path());
    let (reached, release) = (env.path("reached"), env.path("release"));
    env.set("REACHED", reached.to_string_lossy());
    env.set("RELEASE", release.to_string_lossy());
    let script = crate::env::agents_dir().join(script);
    let calls = CALLS.to_string();
    let args = [
        "run",
        "--task",
        "t",
        "--",
        program,
        &script.to_string_lossy(),
        &calls,
    ];
    let mut durun = env.spawn(&args, "run");
    crate::env::sigkill_once(
        &mut durun,
        "every model call",
        Duration::from_secs(60),
        || reached.exists(),
    );
    let before = server.counts();
    let sent = before.as_object().expect("counts");
    assert_eq!(sent.len(), CALLS, "{before}");
    assert!(sent.values().all(|count| count == 1), "{before}");

    std::fs::write(&release, "").expect("release");
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(server.counts(), before, "no model call was sent again");
    let task = env.inspect("t");
    let kinds: Vec<&str> = task["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|step| step["kind"].as_str())
        .collect();
    let proxied = kinds.iter().filter(|kind| **kind == "proxy").count();
    assert_eq!(proxied, CALLS, "each call is a step of its own: {kinds:?}");
}

#[test]
fn a_node_agents_model_call_right_after_a_short_step_is_a_step_of_its_own() {
    calls_right_after_short_steps_are_never_sent_again("node", "step_then_call.mjs");
}

#[test]
fn a_python_agents_model_call_right_after_a_short_step_is_a_step_of_its_own() {
    calls_right_after_short_steps_are_never_sent_again("python3", "step_then_call.py");
}
