//! `durun run` and `resume` on small agents: the protocol, tools, exit codes
//! and the journal file.

use serde_json::{Value, json};

use crate::env::{TestEnv, text};

fn send(line: &str) -> Value {
    json!({"send": line})
}

fn print(line: &str) -> Value {
    json!({"send": line, "answer": false})
}

#[test]
fn other_lines_pass_through_to_stdout_untouched() {
    let env = TestEnv::new();
    let script = json!([
        print("hello"),
        print(r#"{"not": "a request"}"#),
        print(r#"{"op": 7}"#),
        send(r#"{"op":"begin","id":1,"name":"n","args":{}}"#),
        send(r#"{"op":"commit","id":2,"step":1,"output":"x"}"#),
        print("bye"),
    ]);
    let (output, answers) = env.probe("t", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "hello\n{\"not\": \"a request\"}\n{\"op\": 7}\nbye\n"
    );
    assert_eq!(answers.len(), 2);
}

#[test]
fn bad_requests_are_answered_and_open_no_step() {
    let mut env = TestEnv::new();
    env.set("DURUN_CONFIG", "tools.toml");
    env.write(
        "tools.toml",
        "[tools.cat]\neffect = \"read\"\ncommand = [\"cat\", \"{path}\"]\n",
    );
    let script = json!([
        send(r#"{"op":"call","id":1,"tool":"nope"}"#),
        send(r#"{"op":"call","id":2,"tool":"cat","args":{}}"#),
        send(r#"{"op":"commit","id":3,"step":1,"output":"x"}"#),
        send(r#"{"op":"frobnicate","id":"f"}"#),
        send(r#"{"op":"begin","name":"n"}"#),
        send(r#"{"op":"begin","id":4,"name":"n","args":{"big":1e400}}"#),
        send(r#"{"op":"commit","id":5,"step":1,"output":"done"}"#),
        send(r#"{"op":"commit","id":6,"step":1,"output":"again"}"#),
    ]);
    let (output, answers) = env.probe("t", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let codes: Vec<(Value, Value)> = answers
        .iter()
        .map(|a| (a["id"].clone(), a["error"]["code"].clone()))
        .collect();
    assert_eq!(
        codes,
        [
            (json!(1), json!("unknown_tool")),
            (json!(2), json!("bad_request")),
            (json!(3), json!("bad_request")),
            (json!("f"), json!("bad_request")),
            (Value::Null, json!("bad_request")),
            (json!(4), Value::Null),
            (json!(5), Value::Null),
            (json!(6), json!("bad_request")),
        ]
    );
    assert_eq!(answers[5]["step"], 1, "rejected requests opened no step");
    let view = env.inspect("t");
    assert_eq!(view["steps"].as_array().expect("steps").len(), 1);
    assert_eq!(view["steps"][0]["output"], "done");
    // Args are recorded with their number literals, which no double holds.
    let big: f64 = view["steps"][0]["args"]["big"]
        .to_string()
        .parse()
        .expect("a number");
    assert!(big.is_infinite());
}

#[test]
fn token_counts_are_whole_numbers_or_refused_by_name() {
    let env = TestEnv::new();
    let script = json!([
        send(r#"{"op":"begin","id":1,"name":"a","args":{}}"#),
        send(r#"{"op":"commit","id":2,"step":1,"output":1,"usage":{"input_tokens":"5000"}}"#),
        send(r#"{"op":"commit","id":3,"step":1,"output":1,"usage":{"prompt_tokens":-1000000}}"#),
        send(r#"{"op":"commit","id":4,"step":1,"output":1,"usage":{"output_tokens":1.5}}"#),
        send(
            r#"{"op":"commit","id":5,"step":1,"output":1,"usage":{"input_tokens":1.5e3,"output_tokens":2}}"#
        ),
    ]);
    let (output, answers) = env.probe("t", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    for (answer, field) in answers[1..4].iter().zip([
        "usage.input_tokens",
        "usage.prompt_tokens",
        "usage.output_tokens",
    ]) {
        assert_eq!(answer["error"]["code"], "bad_request", "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|message| message.contains(field)),
            "{answer}"
        );
    }
    assert_eq!(answers[4]["ok"], true, "{}", answers[4]);
    assert_eq!(env.inspect("t")["steps"][0]["tokens"], 1502);
}

#[test]
fn tools_get_the_step_identity_and_their_failures_are_recorded() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        r#"
[tools.whoami]
effect = "read"
command = ["sh", "-c", "printf '%s %s %s %s' \"$DURUN_TASK_ID\" \"$DURUN_STEP\" \"$DURUN_ATTEMPT\" \"$DURUN_IDEMPOTENCY_KEY\""]

[tools.flaky]
effect = "mutate"
command = ["sh", "-c", "if [ -e flaked ]; then echo '{\"ok\": true, \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 2}}'; else touch flaked; echo boom >&2; exit 4; fi"]
output = "json"
retries = 1

[tools.broken_json]
effect = "read"
command = ["echo", "not json"]
output = "json"

[tools.slow]
effect = "read"
command = ["sleep", "30"]
timeout = "200ms"

[tools.stdin]
effect = "read"
command = ["cat"]
stdin = "args"
output = "json"
"#,
    );
    let script = json!([
        send(r#"{"op":"call","id":1,"tool":"whoami","args":{"a":1}}"#),
        send(r#"{"op":"call","id":2,"tool":"flaky","args":{}}"#),
        send(r#"{"op":"call","id":3,"tool":"broken_json"}"#),
        send(r#"{"op":"call","id":4,"tool":"slow"}"#),
        send(r#"{"op":"call","id":5,"tool":"stdin","args":{"n":12345678901234567890123,"s":"é"}}"#),
    ]);
    let (output, answers) = env.probe("tools", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let key = answers[0]["idempotency_key"].as_str().expect("key");
    assert_eq!(answers[0]["output"], format!("tools 1 1 {key}"));
    assert_eq!(answers[1]["ok"], true, "{}", answers[1]);
    assert_eq!(answers[1]["output"]["ok"], true);
    assert_eq!(answers[2]["error"]["code"], "tool_failed");
    assert!(
        answers[2]["error"]["message"]
            .as_str()
            .expect("message")
            .contains("invalid JSON")
    );
    assert_eq!(answers[3]["error"]["code"], "timeout");
    assert_eq!(
        answers[4]["output"],
        json!({"n": 12_345_678_901_234_567_890_123_u128, "s": "é"})
    );
    let view = env.inspect("tools");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps[1]["attempts"], 2, "one retry, same key");
    assert_eq!(steps[1]["tokens"], 7);
    assert_eq!(steps[1]["effect"], "mutate");
    assert_eq!(steps[2]["status"], "failed");
    assert_eq!(steps[3]["error"]["code"], "timeout");
    assert_eq!(view["task"]["tokens_spent"], 7);
}

#[test]
fn the_agents_exit_code_passes_through() {
    let env = TestEnv::new();
    let output = env.durun(&["run", "--", "python3", "-c", "import sys, os; print(os.environ['DURUN_RUN'], os.environ['DURUN_PROTOCOL'], len(os.environ['DURUN_TASK_ID'])); sys.exit(5)"]);
    assert_eq!(output.status.code(), Some(5));
    assert_eq!(text(&output.stdout), "1 1 32\n");
    let output = env.durun(&["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(output.status.code(), Some(128 + libc::SIGTERM));
}

#[test]
fn a_command_that_cannot_start_exits_127() {
    let env = TestEnv::new();
    let output = env.durun(&["run", "--task", "x", "--", "no-such-agent-here"]);
    assert_eq!(output.status.code(), Some(127));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("durun: cannot start `no-such-agent-here`"),
        "{stderr}"
    );
    // An agent that never started leaves no task, and no resume hint.
    assert!(!stderr.contains("durun resume"), "{stderr}");
    assert!(stderr.contains("no task was kept"), "{stderr}");
    let missing = env.durun(&["inspect", "x"]);
    assert_eq!(missing.status.code(), Some(64), "{}", text(&missing.stdout));
    // One that dies before its first request is kept, failed, with
    // nothing to resume: no resume hint.
    let output = env.durun(&[
        "run",
        "--task",
        "y",
        "--",
        "python3",
        "-c",
        "import no_such_module_here",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("ModuleNotFoundError"), "{stderr}");
    assert!(!stderr.contains("durun resume"), "{stderr}");
    assert!(
        stderr.contains("the agent ended before its first step"),
        "{stderr}"
    );
    assert_eq!(env.inspect("y")["task"]["status"], "failed");
    // A task that ran a step is kept, failed, and resumable.
    let plan = json!({"steps": [
        {"begin": "a", "args": {}, "do": {"value": 1}},
        {"begin": "b", "args": {}, "do": {"exit_unless": env.path("never"), "code": 3}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "z", "--"];
    args.extend(agent.iter().map(String::as_str));
    let output = env.durun(&args);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("continue with `durun resume z`"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(env.inspect("z")["task"]["status"], "failed");
}

#[test]
fn unknown_tasks_exit_64() {
    let env = TestEnv::new();
    for args in [&["resume", "nope"][..], &["inspect", "nope"][..]] {
        let output = env.durun(args);
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        assert!(
            text(&output.stderr).starts_with("durun: no task nope"),
            "{}",
            text(&output.stderr)
        );
    }
}

#[test]
fn a_changed_path_is_divergence_not_a_new_step() {
    let env = TestEnv::new();
    let plan = |title: &str| {
        json!({"steps": [
            {"begin": "plan", "args": {}, "do": {"value": "p"}},
            {"begin": "open_pr", "effect": "mutate", "args": {"title": title}, "do": {"exit_unless": env.path("go"), "code": 2}},
        ]})
    };
    let agent = env.scripted_agent("plan.json", &plan("Fix typo"));
    let mut args = vec!["run", "--task", "d", "--"];
    args.extend(agent.iter().map(String::as_str));
    assert_eq!(env.durun(&args).status.code(), Some(2));

    // The agent now takes another path at step 2.
    env.scripted_agent("plan.json", &plan("Rewrite everything"));
    std::fs::write(env.path("go"), "").expect("go");
    let output = env.durun(&["resume", "d"]);
    assert_eq!(output.status.code(), Some(65), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("durun: step 2 of task d diverged from the journal"),
        "{stderr}"
    );
    assert!(
        stderr.contains(r#"  /title: "Fix typo" -> "Rewrite everything""#),
        "{stderr}"
    );
    assert!(
        stderr.contains("`durun resume d --from-step 2` runs the new path from step 2"),
        "{stderr}"
    );
    // The only way out named is --from-step: a plain resume diverges again.
    assert!(
        !stderr.contains("continue with `durun resume d`"),
        "{stderr}"
    );
    let view = env.inspect("d");
    assert_eq!(view["task"]["status"], "failed");
    assert_eq!(view["steps"][1]["args"]["title"], "Fix typo");
    assert_eq!(view["steps"][1]["status"], "pending");
    assert_eq!(view["steps"].as_array().expect("steps").len(), 2);
    // The run keeps what durun said, diff and all, for whoever looks later.
    assert!(view["task"]["runs"][0].get("error").is_none(), "{view}");
    let said = view["task"]["runs"][1]["error"]
        .as_str()
        .unwrap_or_default();
    // What the terminal showed is what the run keeps.
    assert!(
        said.starts_with("durun: step 2 of task d diverged"),
        "{said}"
    );
    assert!(stderr.trim_end().ends_with(said), "{said}\n---\n{stderr}");
    let shown = text(&env.durun(&["inspect", "d"]).stdout);
    assert!(shown.contains("run 2 was ended by durun:"), "{shown}");
    assert!(
        shown.contains(r#"  /title: "Fix typo" -> "Rewrite everything""#),
        "{shown}"
    );
}

#[test]
fn the_default_journal_is_private_under_xdg_state_home() {
    use std::os::unix::fs::PermissionsExt as _;
    let env = TestEnv::new();
    let state = env.path("xdg");
    let output = env
        .command()
        .env_remove("DURUN_JOURNAL")
        .env("XDG_STATE_HOME", &state)
        .env("DURUN_SYNC", "normal")
        .args(["run", "--task", "x", "--", "true"])
        .output()
        .expect("durun");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let journal = state.join("durun/journal.db");
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .expect("exists")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&journal), 0o600);
    assert_eq!(mode(journal.parent().expect("dir")), 0o700);
    let view = env
        .command()
        .env("DURUN_JOURNAL", &journal)
        .args(["inspect", "x", "--json"])
        .output()
        .expect("inspect");
    let view: Value = serde_json::from_slice(&view.stdout).expect("JSON");
    assert_eq!(view["task"]["sync"], "normal");
    assert_eq!(view["task"]["status"], "completed");
}

#[test]
fn many_outstanding_requests_are_answered_by_id() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        r#"
[tools.sleep]
effect = "read"
command = ["sh", "-c", "sleep $0; echo slept $0", "{s}"]
"#,
    );
    // Three calls sent at once: the slowest first. Answers come as tools
    // finish, each naming its request.
    let agent = r#"
import json, sys
for i, s in [("slow", "0.6"), ("mid", "0.3"), ("fast", "0")]:
    sys.stdout.write(json.dumps({"op": "call", "id": i, "tool": "sleep", "args": {"s": s}}) + "\n")
sys.stdout.flush()
answers = [json.loads(sys.stdin.readline()) for _ in range(3)]
sys.stderr.write("ORDER " + " ".join(a["id"] for a in answers) + "\n")
for a in answers:
    assert a["ok"] and a["output"] == "slept %s\n" % {"slow": "0.6", "mid": "0.3", "fast": "0"}[a["id"]], a
sys.stderr.write("STEPS " + " ".join("%s=%d" % (a["id"], a["step"]) for a in sorted(answers, key=lambda a: a["step"])) + "\n")
"#;
    env.write("agent.py", agent);
    let output = env.durun(&["run", "--task", "p", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("ORDER fast mid slow"), "{stderr}");
    assert!(
        stderr.contains("STEPS slow=1 mid=2 fast=3"),
        "steps are numbered in the order requests arrive: {stderr}"
    );
}

#[test]
fn parallel_calls_run_at_once_each_after_its_intent_is_durable() {
    let mut env = TestEnv::new();
    env.write(
        "durun.toml",
        r#"
[tools.meet]
effect = "mutate"
command = ["python3", "meet.py"]
"#,
    );
    // Each tool waits until all eight have started: it fails if the calls
    // ran one at a time. On SQLite it also reads the journal: its step's
    // intent must be there, pending, before it runs.
    env.write(
        "meet.py",
        r#"
import os, sqlite3, sys, time
step = os.environ["DURUN_STEP"]
journal = os.environ.get("MEET_JOURNAL")
if journal:
    row = sqlite3.connect(journal).execute(
        "SELECT status, idempotency_key FROM steps WHERE task_id = 'par' AND step_index = ?",
        (int(step),)).fetchone()
    if row != ("pending", os.environ["DURUN_IDEMPOTENCY_KEY"]):
        sys.exit("step %s started before its intent was durable: %r" % (step, row))
open("arrived-" + step, "w").close()
deadline = time.time() + 60
while sum(name.startswith("arrived-") for name in os.listdir(".")) < 8:
    if time.time() > deadline:
        sys.exit("the other calls never started: calls ran one at a time")
    time.sleep(0.01)
print("met", step)
"#,
    );
    if env.postgres.is_none() {
        let journal = env.journal.to_string_lossy().into_owned();
        env.set("MEET_JOURNAL", journal);
    }
    let agent = r#"
import json, sys
for i in range(8):
    sys.stdout.write(json.dumps({"op": "call", "id": i, "tool": "meet", "args": {"i": i}}) + "\n")
sys.stdout.flush()
answers = [json.loads(sys.stdin.readline()) for _ in range(8)]
for a in answers:
    assert a["ok"] and a["output"] == "met %d\n" % a["step"], a
assert len({a["idempotency_key"] for a in answers}) == 8, answers
"#;
    env.write("agent.py", agent);
    let output = env.durun(&["run", "--task", "par", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let view = env.inspect("par");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 8);
    assert!(
        steps
            .iter()
            .all(|step| step["status"] == "committed" && step["attempts"] == 1),
        "{steps:#?}"
    );
}
