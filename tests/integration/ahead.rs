//! An agent that replays its steps itself: `ahead` gives it the recorded
//! steps a `begin` would replay, `replayed` tells durun which it used.

use serde_json::{Value, json};

use crate::env::{TestEnv, sdk_path, text};

/// What every agent here starts with: `ask` sends a request, waits for
/// its answer and logs it in `log`.
const ASK: &str = r#"
import hashlib, json, os, sys
log = []
def ask(request):
    sys.stdout.write(json.dumps(request) + "\n")
    sys.stdout.flush()
    answer = json.loads(sys.stdin.readline())
    log.append(answer)
    return answer
"#;

/// The first run records steps a, b, c, patch p, d and leaves e open
/// (exit 3); the second asks `ahead` and `replayed` around them and logs
/// every answer, with the keys computed as SPEC 3.1 says.
const AGENT: &str = r#"
run = int(os.environ["DURUN_RUN"])
task = os.environ["DURUN_TASK_ID"]
def key(step, args):
    return hashlib.sha256(f"{task}:{step}:{json.dumps(args, sort_keys=True)}".encode()).hexdigest()
if run == 1:
    for name, args, output in [("a", {"n": 1}, {"a": 1}), ("b", {"n": 2}, "b-out"), ("c", {}, [3])]:
        step = ask({"op": "begin", "id": name, "name": name, "args": args})["step"]
        ask({"op": "commit", "id": "c" + name, "step": step, "output": output})
    ask({"op": "patched", "id": "p", "name": "p"})
    step = ask({"op": "begin", "id": "d", "name": "d", "args": {"n": 4}})["step"]
    ask({"op": "commit", "id": "cd", "step": step, "output": "d"})
    ask({"op": "begin", "id": "e", "name": "e", "args": {}, "effect": "mutate"})
    sys.exit(3)
first = ask({"op": "ahead", "id": 1})
two = first["steps"][1]["idempotency_key"]
ask({"op": "replayed", "id": 2, "through": 2, "idempotency_key": "not-the-key"})
ask({"op": "replayed", "id": 3, "through": 2, "idempotency_key": two})
ask({"op": "replayed", "id": 4, "through": 2, "idempotency_key": two})
ask({"op": "begin", "id": 5, "name": "c", "args": {}})
ask({"op": "ahead", "id": 6})
ask({"op": "patched", "id": 7, "name": "p"})
fifth = ask({"op": "ahead", "id": 8})["steps"][0]
ask({"op": "replayed", "id": 9, "through": 5, "idempotency_key": fifth["idempotency_key"]})
ask({"op": "ahead", "id": 10})
opened = ask({"op": "begin", "id": 11, "name": "e", "args": {}, "effect": "mutate"})
ask({"op": "commit", "id": 12, "step": opened["step"], "output": "e"})
with open("answers.json", "w") as out:
    json.dump({"answers": log, "keys": [key(1, {"n": 1}), key(2, {"n": 2}), key(3, {}), key(5, {"n": 4})]}, out)
"#;

/// Runs `script` after [`ASK`] as task `task` (its first run exits 3),
/// resumes it, and reads the JSON the resumed run wrote to `file`.
fn resumed<T: serde::de::DeserializeOwned>(
    env: &TestEnv,
    script: &str,
    task: &str,
    file: &str,
) -> T {
    env.write("agent.py", &format!("{ASK}{script}"));
    let first = env.durun(&["run", "--task", task, "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let second = env.durun(&["resume", task]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    serde_json::from_str(&std::fs::read_to_string(env.path(file)).expect(file)).expect("JSON")
}

#[test]
fn an_agent_replays_the_steps_ahead_itself_and_durun_counts_them() {
    let env = TestEnv::new();
    let logged: Value = resumed(&env, AGENT, "t", "answers.json");
    let (answers, keys) = (&logged["answers"], &logged["keys"]);
    // Steps 1 to 3, up to the patch: names, keys and outputs as recorded.
    let offered: Vec<Value> = answers[0]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| {
            json!([
                step["step"],
                step["name"],
                step["idempotency_key"],
                step["output"]
            ])
        })
        .collect();
    assert_eq!(
        offered,
        [
            json!([1, "a", keys[0], {"a": 1}]),
            json!([2, "b", keys[1], "b-out"]),
            json!([3, "c", keys[2], [3]]),
        ],
        "{answers}"
    );
    // A wrong key counts nothing; the right one counts 1 and 2; a second
    // time is refused, as the numbering is past them.
    let refused = |answer: &Value, words: &str| {
        assert_eq!(answer["ok"], false, "{answer}");
        assert_eq!(answer["error"]["code"], "bad_request", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{message}");
    };
    refused(&answers[1], "step 2 has another idempotency key");
    assert_eq!(answers[2], json!({"id": 3, "ok": true, "step": 2}));
    refused(&answers[3], "durun's next step is 3");
    // The next `begin` is step 3, replayed by durun as ever.
    assert_eq!(answers[4]["step"], 3, "{}", answers[4]);
    assert_eq!(answers[4]["replayed"], true);
    assert_eq!(answers[4]["output"], json!([3]));
    // A patch is not offered: `patched` asks for it.
    assert_eq!(answers[5]["steps"], json!([]));
    assert_eq!(answers[6]["patched"], true);
    assert_eq!(answers[7]["steps"][0]["step"], 5);
    assert_eq!(answers[7]["steps"][0]["idempotency_key"], keys[3]);
    assert_eq!(answers[7]["steps"].as_array().map(Vec::len), Some(1));
    assert_eq!(answers[8], json!({"id": 9, "ok": true, "step": 5}));
    // The step left open is not offered: it runs again, in doubt.
    assert_eq!(answers[9]["steps"], json!([]));
    assert_eq!(answers[10]["step"], 6);
    assert_eq!(answers[10]["replayed"], false);
    assert_eq!(answers[10]["in_doubt"], true);

    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed");
    let runs = view["task"]["runs"].as_array().expect("runs");
    assert_eq!(runs[1]["replayed_steps"], 5, "{view}");
    assert_eq!(runs[1]["executed_steps"], 1, "{view}");
    assert_eq!(view["steps"][5]["output"], "e");
}

/// Asks `ahead` 300 times before reading any answer, over steps whose
/// outputs make a full answer about 1 MiB.
const GREEDY: &str = r#"
if os.environ["DURUN_RUN"] == "1":
    for i in range(300):
        sys.stdout.write(json.dumps({"op": "begin", "id": i, "name": "s", "args": {"i": i}}) + "\n")
        sys.stdout.flush()
        step = json.loads(sys.stdin.readline())["step"]
        sys.stdout.write(json.dumps({"op": "commit", "id": i, "step": step, "output": "x" * 8000}) + "\n")
        sys.stdout.flush()
        sys.stdin.readline()
    sys.exit(3)
sys.stdout.write("".join(json.dumps({"op": "ahead", "id": i}) + "\n" for i in range(300)))
sys.stdout.flush()
sizes = [sum(len(step["output"]) for step in json.loads(sys.stdin.readline())["steps"]) for _ in range(300)]
with open("offered.json", "w") as out:
    json.dump(sizes, out)
"#;

#[test]
fn answers_left_unread_bound_what_ahead_offers() {
    let env = TestEnv::new();
    let sizes: Vec<usize> = resumed(&env, GREEDY, "g", "offered.json");
    assert_eq!(sizes.len(), 300);
    // A first full answer, and then no more than the bound on unread
    // answers (4 MiB) and the pipe's few pages allow, not 300 copies.
    assert!(sizes[0] >= 1 << 20, "{:?}", &sizes[..4]);
    let offered: usize = sizes.iter().sum();
    let answered = sizes.iter().filter(|size| **size > 0).count();
    assert!(
        offered < 7 << 20,
        "{offered} bytes offered in {answered} answers"
    );
    assert_eq!(sizes[299], 0, "{answered} answers offered steps");
}

/// Steps a, an MCP call (replayed by content), b; the first run exits 3.
/// Resumed, it asks around the MCP step without taking a number: a
/// `patched` on an older path, `ahead`, then the MCP call and `replayed`.
const AROUND: &str = r#"
def step(name, kind="begin"):
    opened = ask({"op": "begin", "id": name, "name": name, "args": {}, "kind": kind})
    if not opened.get("replayed"):
        ask({"op": "commit", "id": "c" + name, "step": opened["step"], "output": name})
step("a")
if os.environ["DURUN_RUN"] != "1":
    ask({"op": "patched", "id": "p", "name": "p"})
    ask({"op": "ahead", "id": "ahead"})
step("tool", "mcp")
if os.environ["DURUN_RUN"] == "1":
    step("b")
    sys.exit(3)
key = log[2]["steps"][0]["idempotency_key"]
ask({"op": "replayed", "id": "r", "through": 3, "idempotency_key": key})
with open("around.json", "w") as out:
    json.dump(log, out)
"#;

#[test]
fn requests_that_take_no_number_pass_over_steps_replayed_by_content() {
    let env = TestEnv::new();
    let log: Vec<Value> = resumed(&env, AROUND, "m", "around.json");
    let kinds: Vec<Value> = env.inspect("m")["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["kind"].clone())
        .collect();
    assert_eq!(kinds, [json!("begin"), json!("mcp"), json!("begin")]);
    assert_eq!(log[0]["replayed"], true);
    assert_eq!(log[1], json!({"id": "p", "ok": true, "patched": false}));
    let offered: Vec<&Value> = log[2]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| &step["step"])
        .collect();
    assert_eq!(offered, [&json!(3)], "{}", log[2]);
    assert_eq!(log[3]["replayed"], true, "{}", log[3]);
    assert_eq!(log[4], json!({"id": "r", "ok": true, "step": 3}));
    assert_eq!(env.inspect("m")["task"]["runs"][1]["replayed_steps"], 3);
}

/// Past the first page of recorded steps (1,024 rows), each page is read
/// while the agent replays the end of the one before from an `ahead`
/// answer: a resume through three pages gets every recorded output back
/// in order, and a step whose args changed on the third page is a
/// divergence there, not a replay.
#[test]
fn a_replay_across_pages_gets_every_step_back_and_stops_where_the_path_changed() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.set("DURUN_SYNC", "normal");
    env.write(
        "agent.py",
        r#"
import os, sys
import durun
run = int(os.environ["DURUN_RUN"])
for i in range(1, 2601):
    out = durun.step("s", {"i": i, "changed": run == 2 and i == 2100}, lambda: {"i": i, "run": run})
    if out != {"i": i, "run": 1}:
        sys.exit(f"step {i} gave {out}")
    if run == 2 and i == 2099:
        with open("replayed", "w") as done:
            done.write("through 2099 in order")
sys.exit(3)
"#,
    );
    let first = env.durun(&["-q", "run", "--task", "p", "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let second = env.durun(&["-q", "resume", "p"]);
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(65), "{stderr}");
    assert!(stderr.contains("step 2100 of task p diverged"), "{stderr}");
    let replayed = std::fs::read_to_string(env.path("replayed")).unwrap_or_default();
    assert_eq!(replayed, "through 2099 in order", "{stderr}");
    let view = env.inspect("p");
    assert_eq!(
        view["task"]["runs"][1]["replayed_steps"], 2099,
        "{}",
        view["task"]
    );
}
