//! Every request gets an answer, nothing the agent prints is lost, and
//! durun's memory stays bounded whatever the agent or durun's reader does.

use std::io::Read as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::env::{TestEnv, path_with_durun, sdk_path, text, wait_exit};

/// The most memory durun held (VmHWM), sampled until it exits.
fn peak_rss_kib(pid: u32, child: &mut std::process::Child, timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    let mut peak = 0;
    while Instant::now() < deadline {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            && let Some(kib) = status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|rest| rest.trim().trim_end_matches(" kB").trim().parse().ok())
        {
            peak = peak.max(kib);
        }
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    peak
}

#[test]
fn what_python_writes_and_json_lacks_is_answered_bad_request() {
    let env = TestEnv::new();
    // Raw json.dumps, as an agent without the SDK writes it.
    env.write(
        "agent.py",
        r#"
import json, os, sys
def ask(id, args):
    sys.stdout.write(json.dumps({"op": "begin", "id": id, "name": "s", "args": args}) + "\n")
    sys.stdout.flush()
    return json.loads(sys.stdin.readline())
answers = [ask(1, {"x": float("nan")}), ask(2, [float("inf")]), ask(3, -float("inf")),
           ask(4, os.fsdecode(b"\xff"))]
deep = 1
for _ in range(980):
    deep = [deep]
opened = ask(5, deep)
sys.stdout.write(json.dumps({"op": "commit", "id": 6, "step": opened["step"], "output": "deep"}) + "\n")
sys.stdout.flush()
answers.append(opened)
answers.append(json.loads(sys.stdin.readline()))
json.dump(answers, open("answers.json", "w"))
"#,
    );
    let output = env.durun(&["run", "--task", "odd", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(env.path("answers.json")).expect("answers"))
            .expect("JSON");
    for (answer, (id, says)) in answers.iter().zip([
        (1, "NaN"),
        (2, "Infinity"),
        (3, "-Infinity"),
        (4, "lone surrogate (\\udcff)"),
    ]) {
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(answer["ok"], false, "{answer}");
        assert_eq!(answer["error"]["code"], "bad_request", "{answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.contains(says), "{message}");
    }
    // 981 levels deep: a step like any other, its key as Python makes it.
    assert_eq!(answers[4]["ok"], true, "{}", answers[4]);
    assert_eq!(answers[5]["ok"], true, "{}", answers[5]);
    let inspect = env.durun(&["inspect", "odd", "--json"]);
    let mut deserializer = serde_json::Deserializer::from_slice(&inspect.stdout);
    deserializer.disable_recursion_limit();
    let view = <Value as serde::Deserialize>::deserialize(&mut deserializer).expect("JSON");
    let steps = view["steps"].clone();
    assert_eq!(
        steps.as_array().expect("steps").len(),
        1,
        "refused requests open no step"
    );
    let python = std::process::Command::new("python3")
        .args([
            "-c",
            "import hashlib,json\nd=1\nfor _ in range(980): d=[d]\nprint(hashlib.sha256(('odd:1:'+json.dumps(d,sort_keys=True)).encode()).hexdigest())",
        ])
        .output()
        .expect("python3");
    assert_eq!(
        steps[0]["idempotency_key"].as_str().expect("key"),
        text(&python.stdout).trim()
    );
    let shown = env.durun(&["inspect", "odd", "--step", "1"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    // A resume replays the deep step from the journal.
    env.sql("UPDATE tasks SET status = 'failed'");
    let again = env.durun(&["resume", "odd"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(env.path("answers.json")).expect("answers"))
            .expect("JSON");
    assert_eq!(answers[4]["replayed"], true, "{}", answers[4]);
}

#[test]
fn the_sdk_refuses_what_json_cannot_hold_before_sending() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.write(
        "agent.py",
        r#"
import durun
for value in (float("nan"), "\udcff"):
    try:
        durun.step("s", {"x": value}, lambda: 1)
    except ValueError as exc:
        print("refused:", exc, flush=True)
print("ok", durun.step("t", {}, lambda: 2), flush=True)
try:
    durun.step("u", {}, lambda: float("inf"))
except (TypeError, ValueError) as exc:
    print("refused:", exc, flush=True)
"#,
    );
    let output = env.durun(&["run", "--task", "sdk", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("refused: durun: the begin of 's' holds NaN or Infinity"),
        "{stderr}"
    );
    assert!(
        stderr.contains("holds a string with a lone surrogate"),
        "{stderr}"
    );
    // A value that cannot be journaled fails its step, named.
    assert!(
        stderr.contains("refused: durun: the commit of 'u' holds NaN or Infinity"),
        "{stderr}"
    );
    let steps = env.inspect("sdk")["steps"].clone();
    assert_eq!(steps.as_array().expect("steps").len(), 2);
    assert_eq!(steps[0]["name"], "t");
    assert_eq!(steps[1]["name"], "u");
    assert_eq!(steps[1]["status"], "failed");
}

#[test]
fn a_nul_in_a_name_or_a_failure_is_refused_before_anything_is_written() {
    let env = TestEnv::new();
    let (output, answers) = env.probe(
        "nul",
        &json!([
            {"send": r#"{"op":"begin","id":1,"name":"a\u0000b"}"#},
            {"send": r#"{"op":"begin","id":2,"name":"ok"}"#},
            {"send": r#"{"op":"fail","id":3,"step":1,"error":"x\u0000y"}"#},
            {"send": r#"{"op":"fail","id":4,"step":1,"error":"plain","output":{"bytes":"x\u0000y"}}"#},
        ]),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(answers[0]["error"]["code"], "bad_request");
    assert!(
        answers[0]["error"]["message"]
            .as_str()
            .expect("message")
            .contains("NUL")
    );
    assert_eq!(answers[1]["ok"], true);
    assert_eq!(answers[2]["error"]["code"], "bad_request");
    assert_eq!(answers[3]["ok"], true, "{}", answers[3]);
    let steps = env.inspect("nul")["steps"].clone();
    assert_eq!(steps[0]["output"]["bytes"], "x\u{0}y");
    assert_eq!(steps[0]["error"]["message"], "plain");
}

#[test]
fn every_print_reaches_a_slow_reader_before_durun_exits() {
    let env = TestEnv::new();
    let mut durun = env
        .command()
        .args([
            "-q",
            "run",
            "--",
            "python3",
            "-c",
            "import sys\nfor i in range(1000): print('%06d ' % i + 'y' * 200)\nsys.stdout.write('no newline at the end')",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Like `| (sleep 2; wc -l)`: nobody reads while the agent prints and
    // exits.
    std::thread::sleep(Duration::from_secs(2));
    let mut out = Vec::new();
    durun
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("read");
    assert!(durun.wait().expect("wait").success());
    let expected: String = (0..1000)
        .map(|i| format!("{i:06} {}\n", "y".repeat(200)))
        .chain(std::iter::once("no newline at the end".to_owned()))
        .collect();
    assert_eq!(text(&out).len(), expected.len());
    assert!(text(&out) == expected, "the prints differ");
}

#[test]
fn huge_prints_to_a_slow_reader_keep_memory_bounded() {
    let env = TestEnv::new();
    // 100 lines of 8 MiB, plain and JSON-looking, to a reader that waits,
    // then reads slowly.
    env.write(
        "agent.py",
        r#"
import sys
for i in range(50):
    sys.stdout.write("x" * (8 << 20) + "\n")
    sys.stdout.write('{"print": "' + "y" * (8 << 20) + '"}\n')
sys.stdout.flush()
"#,
    );
    let mut durun = env
        .command()
        .args(["-q", "run", "--", "python3", "agent.py"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = durun.id();
    let mut stdout = durun.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let mut total = 0usize;
        let mut lines = 0usize;
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            let n = stdout.read(&mut buffer).expect("read");
            if n == 0 {
                break;
            }
            total += n;
            lines += buffer[..n].split(|&b| b == b'\n').count() - 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        (total, lines)
    });
    let peak = peak_rss_kib(pid, &mut durun, Duration::from_secs(240));
    let status = wait_exit(&mut durun, Duration::from_secs(240));
    assert!(status.success());
    let (total, lines) = reader.join().expect("reader");
    assert_eq!(lines, 100);
    assert_eq!(total, 50 * ((8 << 20) + 1) + 50 * ((8 << 20) + 14));
    // One 8 MiB line held, 8 MiB queued, buffers: far from 800 MiB.
    assert!(peak < 120 * 1024, "durun's memory peaked at {peak} KiB");
}

#[test]
fn an_agent_that_does_not_read_its_answers_holds_durun_to_a_bound() {
    let env = TestEnv::new();
    // Within the bound: everything first, then every answer.
    env.write(
        "batch.py",
        r#"
import json, sys
n = 100000
for i in range(n):
    sys.stdout.write('{"op":"commit","id":%d,"step":999999}\n' % i)
sys.stdout.flush()
ids = set()
for _ in range(n):
    ids.add(json.loads(sys.stdin.readline())["id"])
assert ids == set(range(n)), len(ids)
"#,
    );
    let output = env.durun(&["-q", "run", "--", "python3", "batch.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));

    // Never reading: durun stops reading it, and its memory stays flat.
    env.write(
        "deaf.py",
        r#"
import sys
line = '{"op":"commit","id":1,"step":999999}\n' * 1000
while True:
    sys.stdout.write(line)
"#,
    );
    let mut durun = env
        .command()
        .args(["-q", "run", "--", "python3", "deaf.py"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = durun.id();
    let watcher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(8));
        crate::env::signal(pid as i32, libc::SIGTERM);
    });
    let peak = peak_rss_kib(pid, &mut durun, Duration::from_secs(60));
    watcher.join().expect("watcher");
    wait_exit(&mut durun, Duration::from_secs(60));
    // 16 MiB of answers at most, and durun's own: about 30 MiB here
    // (without the bound: over 100 MiB after 8 s, growing).
    assert!(peak < 48 * 1024, "durun's memory peaked at {peak} KiB");
}

#[test]
fn requests_from_what_the_agent_left_running_open_no_step() {
    let env = TestEnv::new();
    // The agent exits at once; its child keeps its stdout and sends
    // requests in the drain window.
    env.write(
        "agent.py",
        r#"
import os, sys, time
if os.fork() == 0:
    time.sleep(0.3)
    for i in range(5):
        sys.stdout.write('{"op":"begin","id":%d,"name":"late","effect":"mutate"}\n' % i)
        sys.stdout.flush()
    time.sleep(0.3)
    os._exit(0)
"#,
    );
    let output = env.durun(&["run", "--task", "orphan", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let view = env.inspect("orphan");
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(
        view["steps"],
        json!([]),
        "a request after the exit opened a step"
    );
}

/// An agent that does not wait for its commits may exit before durun reads
/// the last one: a step it opened and closed is recorded even when the
/// commit is read after the exit. What it left running ends with it (its
/// keeper, SPEC 17), so a request that process would send later never
/// opens a step.
#[test]
fn a_commit_read_after_the_agent_exited_is_recorded() {
    let env = TestEnv::new();
    env.write(
        "agent.py",
        r#"
import os, sys, time
sys.stdout.write('{"op":"begin","id":1,"name":"last","effect":"read"}\n')
sys.stdout.flush()
sys.stdin.readline()
if os.fork() == 0:
    time.sleep(0.3)
    sys.stdout.write('{"op":"begin","id":3,"name":"late","effect":"read"}\n')
    sys.stdout.flush()
    time.sleep(0.3)
    os._exit(0)
sys.stdout.write('{"op":"commit","id":2,"step":1,"output":"kept"}\n')
sys.stdout.flush()
os._exit(0)
"#,
    );
    let output = env.durun(&["run", "--task", "t", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let view = env.inspect("t");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["status"], "committed");
    assert_eq!(steps[0]["output"], "kept");
}

#[test]
fn durun_step_records_and_replays_stdout_byte_for_byte() {
    let mut env = TestEnv::new();
    env.set("PATH", path_with_durun());
    env.write(
        "agent.sh",
        r"
set -e
durun step bytes -- python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 3)' > bytes.out
durun step zeros -- sh -c 'echo ran >> zeros.ran; head -c 12000000 /dev/zero' > zeros.out
test -e crashed || { touch crashed; kill -9 $DURUN_PID; }
",
    );
    let first = env.durun(&["run", "--task", "bin", "--", "bash", "agent.sh"]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&first.status),
        Some(libc::SIGKILL),
        "{}",
        text(&first.stderr)
    );
    let expected: Vec<u8> = (0..=255u8).cycle().take(768).collect();
    assert_eq!(
        std::fs::read(env.path("bytes.out")).expect("bytes"),
        expected
    );
    std::fs::remove_file(env.path("bytes.out")).expect("rm");
    std::fs::remove_file(env.path("zeros.out")).expect("rm");
    let second = env.durun(&["resume", "bin"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    // Replayed, not run: the same bytes, and the command ran once.
    assert_eq!(
        std::fs::read(env.path("bytes.out")).expect("bytes"),
        expected
    );
    let zeros = std::fs::read(env.path("zeros.out")).expect("zeros");
    assert_eq!(zeros.len(), 12_000_000);
    assert!(zeros.iter().all(|&b| b == 0));
    assert_eq!(
        std::fs::read_to_string(env.path("zeros.ran")).expect("ran"),
        "ran\n"
    );
    let view = env.inspect("bin");
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 2);
}
