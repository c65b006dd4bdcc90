//! Agents of every kind: the Python SDK and shell scripts with `durun step`
//! and `durun call`, crash and resume included.

use std::time::Duration;

use serde_json::Value;

use crate::env::{
    TestEnv, agents_dir, path_with_durun, path_without_durun, process_gone, read_pid, sdk_path,
    text, wait_for, which,
};
use crate::servers::{FakeApi, FakeLlm};

fn agent_env(llm: &FakeLlm, api: &FakeApi) -> TestEnv {
    let mut env = TestEnv::new();
    env.set("LLM_URL", &llm.url);
    env.set("API_URL", &api.url);
    env.set("PYTHONPATH", sdk_path());
    env.set("PATH", path_with_durun());
    env.set("AGENT_PIDFILE", env.path("agent.pid").to_string_lossy());
    env.write("note.txt", "remember the milk");
    env
}

/// Kills durun with SIGKILL while step 4's request is held at the API,
/// resumes, and checks the design's promises.
fn kill_in_step_4_and_resume(env: &TestEnv, llm: &FakeLlm, api: &FakeApi, agent: &[&str]) -> Value {
    let mut durun = api.spawn_until_held(env, "t", agent);
    let agent_pid = read_pid(&env.path("agent.pid"));
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap durun");
    wait_for(
        "the agent to die with durun",
        Duration::from_secs(10),
        || process_gone(agent_pid),
    );
    api.release();
    assert_eq!(llm.calls(), 3);

    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(
        llm.calls(),
        4,
        "steps 1-3 replayed with no LLM call; step 7 ran"
    );
    assert_eq!(
        api.resources(),
        2,
        "step 4 created one resource, step 8 one"
    );
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed");
    let key4 = view["steps"][3]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_owned();
    assert_eq!(
        api.keys().iter().filter(|key| **key == key4).count(),
        2,
        "step 4 retried with its key"
    );
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 3);
    view
}

#[test]
fn the_sdk_agent_survives_sigkill_in_step_4() {
    let llm = FakeLlm::start();
    let api = FakeApi::start();
    let env = agent_env(&llm, &api);
    let script = agents_dir().join("sdk_agent.py");
    let view = kill_in_step_4_and_resume(
        &env,
        &llm,
        &api,
        &["python3", script.to_str().expect("utf-8")],
    );
    let outputs = view["task"]["output"]["outputs"]
        .as_array()
        .expect("outputs");
    let answers = llm.answers();
    for i in 0..3 {
        assert_eq!(
            outputs[i],
            answers[i],
            "step {} kept its recorded answer",
            i + 1
        );
    }
    assert_eq!(outputs[3]["id"], "res-1");
    assert_eq!(outputs[4], "remember the milk");
    assert_eq!(outputs[7]["id"], "res-2");
    assert_eq!(view["task"]["runs"][1]["tokens_saved"], 3000);
    assert_eq!(view["steps"][0]["usage"]["input_tokens"], 800);
    assert!(env.log("run1").contains("agent: a print goes to stderr"));
}

#[test]
fn the_shell_agent_survives_sigkill_in_step_4() {
    let llm = FakeLlm::start();
    let api = FakeApi::start();
    let env = agent_env(&llm, &api);
    let script = agents_dir().join("shell_agent.sh");
    kill_in_step_4_and_resume(&env, &llm, &api, &["bash", script.to_str().expect("utf-8")]);
    let outputs = std::fs::read_to_string(env.path("outputs.txt")).expect("outputs");
    let lines: Vec<&str> = outputs.lines().collect();
    let answers = llm.answers();
    assert_eq!(&lines[..3], &answers[..3], "the recorded stdout came back");
    assert!(lines[3].contains("\"res-1\""), "{outputs}");
    assert_eq!(lines[4], "remember the milk");
    assert_eq!(lines[5], "42");
    assert!(lines[7].contains("\"res-2\""), "{outputs}");
}

#[test]
fn the_sdk_and_durun_step_work_without_durun() {
    let env = TestEnv::new();
    let script = r#"
import durun
assert not durun.active()
print(durun.step("add", {"a": 1}, lambda: 1 + 1))
@durun.step("twice")
def twice(x):
    return 2 * x
print(twice(21))
try:
    durun.call("anything")
except durun.NotUnderDurun as err:
    print("NotUnderDurun:", err)
durun.result({"ignored": True})
"#;
    env.write("plain.py", script);
    // With no durun on PATH, and with one there (installed, or the one
    // under test) outside a run: durun.call raises NotUnderDurun either way.
    for (path, says) in [
        (
            path_without_durun(),
            "NotUnderDurun: durun.call('anything') runs the tool through `durun call`, and durun is not on PATH",
        ),
        (
            path_with_durun(),
            "NotUnderDurun: durun call anything: not inside a run, and no durun.toml here",
        ),
    ] {
        let plain = std::process::Command::new(which("python3"))
            .arg(env.path("plain.py"))
            .current_dir(env.path(""))
            .env("PYTHONPATH", sdk_path())
            .env("PATH", path)
            .env_remove("DURUN_PROTOCOL")
            .env_remove("DURUN_SOCKET")
            .env_remove("DURUN_CONFIG")
            .output()
            .expect("python3");
        assert!(plain.status.success(), "{}", text(&plain.stderr));
        let stdout = text(&plain.stdout);
        assert!(stdout.starts_with(&format!("2\n42\n{says}")), "{stdout}");
    }

    let step = std::process::Command::new(assert_cmd::cargo::cargo_bin("durun"))
        .args(["step", "greet", "--", "sh", "-c", "echo hi; exit 3"])
        .env_remove("DURUN_SOCKET")
        .output()
        .expect("durun step");
    assert_eq!(step.status.code(), Some(3));
    assert_eq!(text(&step.stdout), "hi\n");
}

#[test]
fn sdk_errors_are_typed() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.write(
        "durun.toml",
        "[tools.broken]\neffect = \"read\"\ncommand = [\"sh\", \"-c\", \"echo nope >&2; exit 2\"]\n",
    );
    let script = r#"
import durun
try:
    durun.call("broken")
except durun.ToolFailed as err:
    print("ToolFailed", err.step, err.message)
try:
    durun.call("missing")
except durun.UnknownTool as err:
    print("UnknownTool", err.message)
def boom():
    raise RuntimeError("model overloaded")
try:
    durun.step("flaky", {}, boom)
except RuntimeError as err:
    print("raised", err)
print("key", len(durun.step("k", {}, lambda: durun.current().idempotency_key)))
"#;
    env.write("errors.py", script);
    let output = env.durun(&["-q", "run", "--task", "e", "--", "python3", "errors.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("ToolFailed 1 exit status 2: nope"),
        "{stderr}"
    );
    assert!(stderr.contains("UnknownTool no tool `missing`"), "{stderr}");
    assert!(stderr.contains("raised model overloaded"), "{stderr}");
    assert!(stderr.contains("key 64"), "{stderr}");
    let view = env.inspect("e");
    assert_eq!(view["steps"][1]["status"], "failed");
    assert_eq!(
        view["steps"][1]["error"]["message"],
        "RuntimeError: model overloaded"
    );
}

#[test]
fn call_all_runs_tools_at_once_and_replays_them_in_order() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    // Each tool run waits until all four have started, so the calls must
    // run at once; each logs its run.
    env.write(
        "durun.toml",
        r#"
[tools.meet]
effect = "read"
command = ["python3", "meet.py", "{name}"]
"#,
    );
    env.write(
        "meet.py",
        r#"
import os, sys, time
name = sys.argv[1]
open("arrived-" + name, "w").close()
with open("runs.log", "a") as log:
    log.write(name + "\n")
deadline = time.time() + 60
while sum(n.startswith("arrived-") for n in os.listdir(".")) < 4:
    if time.time() > deadline:
        sys.exit("the calls ran one at a time")
    time.sleep(0.01)
print("hello " + name)
"#,
    );
    let script = r#"
import durun, os, sys
outputs = durun.call_all([("meet", {"name": n}) for n in ["a", "b", "c", "d"]])
print(outputs)
if not os.path.exists("second-run"):
    open("second-run", "w").close()
    sys.exit(9)
"#;
    env.write("agent.py", script);
    let first = env.durun(&["-q", "run", "--task", "all", "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(9), "{}", text(&first.stderr));
    let expected = "['hello a\\n', 'hello b\\n', 'hello c\\n', 'hello d\\n']";
    assert!(
        text(&first.stderr).contains(expected),
        "{}",
        text(&first.stderr)
    );
    // The resume is answered from the journal, in the same order, and runs
    // no tool again.
    let second = env.durun(&["-q", "resume", "all"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(
        text(&second.stderr).contains(expected),
        "{}",
        text(&second.stderr)
    );
    let runs = std::fs::read_to_string(env.path("runs.log")).expect("runs.log");
    assert_eq!(runs.lines().count(), 4, "{runs}");
    let view = env.inspect("all");
    let names: Vec<&str> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["args"]["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
}

#[test]
fn an_answer_the_sdk_cannot_read_wakes_every_waiting_request() {
    // Stand-in for durun: the SDK's stdin gets a line that is not JSON
    // while three threads wait for answers. None may hang.
    let script = r#"
import os, sys, threading
read_end, write_end = os.pipe()
os.dup2(read_end, 0)
sink = os.open(os.devnull, os.O_WRONLY)
os.dup2(sink, 1)
os.environ["DURUN_PROTOCOL"] = "1"
import durun
errors = []
def ask():
    try:
        durun.call("tool")
    except durun.DurunError as exc:
        errors.append(str(exc))
threads = [threading.Thread(target=ask) for _ in range(3)]
for thread in threads:
    thread.start()
os.write(write_end, b"not json\n")
for thread in threads:
    thread.join(10)
assert not any(thread.is_alive() for thread in threads), "a request hangs"
try:
    durun.call("later")
except durun.DurunError as exc:
    errors.append(str(exc))
assert len(errors) == 4, errors
assert all("could not read durun's answer" in e for e in errors), errors
sys.stderr.write("ok\n")
"#;
    let output = std::process::Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", sdk_path())
        .output()
        .expect("python3");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stderr), "ok\n");
}

/// SPEC 14's SDK guarantee: a step that reported token usage returns only
/// once its commit is durable. The agent kills durun with SIGKILL the
/// moment its three gathered model steps have returned; resumed, it sends
/// none of them again.
fn gathered_model_steps_are_never_paid_twice(agent: &[&str]) {
    let llm = FakeLlm::start();
    let mut env = TestEnv::new();
    env.set("LLM_URL", &llm.url);
    env.set("PYTHONPATH", sdk_path());
    env.set("ANSWERS_FILE", env.path("answers.json").to_string_lossy());
    let mut args = vec!["run", "--task", "g", "--"];
    args.extend_from_slice(agent);
    let first = env.durun(&args);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&first.status),
        Some(libc::SIGKILL),
        "durun was killed: {}",
        crate::env::text(&first.stderr)
    );
    assert_eq!(llm.calls(), 3);
    let resumed = env.durun(&["resume", "g"]);
    assert!(
        resumed.status.success(),
        "{}",
        crate::env::text(&resumed.stderr)
    );
    assert_eq!(llm.calls(), 3, "a finished model call was sent again");
    let printed: Vec<String> = serde_json::from_str(
        &std::fs::read_to_string(env.path("answers.json")).expect("the agent's answers"),
    )
    .expect("JSON");
    let mut answers = llm.answers();
    answers.sort();
    let mut printed_sorted = printed.clone();
    printed_sorted.sort();
    assert_eq!(printed_sorted, answers, "the answers it had, replayed");
    let view = env.inspect("g");
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 3);
}

#[test]
fn gathered_python_model_steps_killed_right_after_are_never_paid_twice() {
    let agent = agents_dir().join("gathered.py");
    gathered_model_steps_are_never_paid_twice(&["python3", agent.to_str().expect("utf-8")]);
}

#[test]
fn gathered_node_model_steps_killed_right_after_are_never_paid_twice() {
    let agent = agents_dir().join("gathered.mjs");
    gathered_model_steps_are_never_paid_twice(&["node", agent.to_str().expect("utf-8")]);
}
