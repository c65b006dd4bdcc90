//! Bad input and faults: the journal locked, read-only, not a database,
//! from a newer durun, or on a full disk; agents that send huge or broken
//! lines or leave early; tools that hang, flood or are missing. Each ends
//! with a clear `durun: ` line and the right exit code, and the journal
//! passes `PRAGMA integrity_check` with every committed step kept.
//!
//! `docs/reliability.md` lists these cases; keep the two in step.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, process_gone, read_pid, text, wait_for};

/// A tmpfs mounted for one test (these tests run as root, as CI does).
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Self {
        std::fs::create_dir_all(path).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (CI runs as root)"
        );
        Self {
            path: path.to_owned(),
        }
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.path)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount {options}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

fn committed_outputs(env: &TestEnv, task: &str) -> Vec<Value> {
    env.inspect(task)["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["status"] == "committed")
        .map(|step| step["output"].clone())
        .collect()
}

#[test]
fn a_locked_journal_exits_74_and_loses_nothing() {
    let mut env = TestEnv::new();
    env.set("DURUN_BUSY_TIMEOUT_MS", "200");
    assert!(
        env.durun(&["run", "--task", "before", "--", "true"])
            .status
            .success()
    );
    let holder = rusqlite::Connection::open(&env.journal).expect("open");
    holder
        .execute_batch("BEGIN IMMEDIATE; UPDATE tasks SET cwd = cwd;")
        .expect("lock");
    let output = env.durun(&["run", "--task", "blocked", "--", "true"]);
    assert_eq!(output.status.code(), Some(74), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.starts_with("durun: the journal at "), "{stderr}");
    assert!(stderr.contains("is locked by another process"), "{stderr}");
    holder.execute_batch("ROLLBACK").expect("unlock");
    drop(holder);
    assert!(
        env.durun(&["run", "--task", "blocked", "--", "true"])
            .status
            .success()
    );
    assert_eq!(env.inspect("before")["task"]["status"], "completed");
    env.assert_journal_intact();
}

#[test]
fn a_file_that_is_not_a_journal_is_left_alone() {
    let env = TestEnv::new();
    std::fs::create_dir_all(env.journal.parent().expect("dir")).expect("dir");
    let garbage = "this is not a database\n".repeat(200);
    std::fs::write(&env.journal, &garbage).expect("garbage");
    let output = env.durun(&["run", "--", "true"]);
    assert_eq!(output.status.code(), Some(74), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("is not a durun journal (not an SQLite database)"),
        "{stderr}"
    );
    assert!(stderr.contains("hint: move the file away"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&env.journal).expect("still there"),
        garbage
    );
    assert_eq!(env.durun(&["inspect"]).status.code(), Some(74));
    // Not a journal, so not for the end-of-test integrity check.
    std::fs::remove_file(&env.journal).expect("rm");
}

#[test]
fn a_journal_from_a_newer_durun_is_read_but_not_written() {
    let env = TestEnv::new();
    assert!(
        env.durun(&["run", "--task", "t", "--", "true"])
            .status
            .success()
    );
    env.sql("PRAGMA user_version = 99");
    let output = env.durun(&["run", "--task", "u", "--", "true"]);
    assert_eq!(output.status.code(), Some(74));
    assert!(
        text(&output.stderr).contains("was written by a newer durun"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(env.inspect("t")["task"]["status"], "completed");
    assert_eq!(env.durun(&["inspect", "u"]).status.code(), Some(64));
}

#[test]
fn a_read_only_journal_exits_74_and_can_still_be_inspected() {
    let mut env = TestEnv::new();
    let mount = Tmpfs::mount(&env.path("ro"), "4m");
    env.journal = mount.path.join("journal.db");
    assert_eq!(
        env.durun(&["run", "--task", "t", "--", "false"])
            .status
            .code(),
        Some(1)
    );
    mount.remount("ro");
    for args in [
        &["run", "--task", "new", "--", "true"][..],
        &["resume", "t"][..],
    ] {
        let output = env.durun(args);
        assert_eq!(
            output.status.code(),
            Some(74),
            "{args:?}: {}",
            text(&output.stderr)
        );
        assert!(
            text(&output.stderr).contains("is on a read-only file system"),
            "{}",
            text(&output.stderr)
        );
    }
    assert_eq!(env.inspect("t")["task"]["status"], "failed");
    mount.remount("rw");
    env.assert_journal_intact();
}

#[test]
fn a_full_disk_stops_the_task_and_keeps_every_committed_step() {
    let mut env = TestEnv::new();
    let mount = Tmpfs::mount(&env.path("small"), "300k");
    env.journal = mount.path.join("journal.db");
    let mut script = Vec::new();
    for i in 0..40 {
        script.push(json!({"send": json!({"op": "begin", "id": format!("b{i}"), "name": format!("s{i}"), "args": {}}).to_string()}));
        script.push(json!({"send": json!({"op": "commit", "id": format!("c{i}"), "step": i + 1, "output": format!("{i}:{}", "x".repeat(30_000))}).to_string()}));
    }
    let script = Value::from(script);
    let (output, answers) = env.probe("big", &script);
    assert_eq!(output.status.code(), Some(74), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("\ndurun: the disk holding the journal at "),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: free some space, then resume the task"),
        "{stderr}"
    );
    // The agent may be stopped before it logs the `journal` answer itself;
    // what matters is that every commit answered ok is kept.
    assert!(
        answers
            .iter()
            .all(|a| a["ok"] == true || a["error"]["code"] == "journal")
    );
    let acknowledged = answers
        .iter()
        .filter(|a| a["ok"] == true && a["id"].as_str().is_some_and(|id| id.starts_with('c')))
        .count();
    assert!(acknowledged > 0, "some steps fit before the disk filled");

    // Every commit durun acknowledged is in the journal; nothing else is.
    mount.remount("size=16m");
    env.assert_journal_intact();
    let kept = committed_outputs(&env, "big");
    assert_eq!(kept.len(), acknowledged);
    for (i, output) in kept.iter().enumerate() {
        assert!(output.as_str().expect("text").starts_with(&format!("{i}:")));
    }

    // With space again the task resumes: the acknowledged steps replay.
    let (output, _) = env.probe("big", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let view = env.inspect("big");
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], acknowledged);
    assert_eq!(committed_outputs(&env, "big").len(), 40);
    env.assert_journal_intact();
}

#[test]
fn a_line_over_64_mib_is_refused_and_memory_stays_bounded() {
    let env = TestEnv::new();
    let agent = r#"
import json, os, sys, time
pad = "x" * (200 * 1024 * 1024)
sys.stdout.write('{"op":"call","id":77,"tool":"t","args":{"pad":"' + pad + '"}}\n')
sys.stdout.flush()
del pad
answer = json.loads(sys.stdin.readline())
sys.stdout.write(json.dumps({"op": "begin", "id": 78, "name": "after", "args": {}}) + "\n")
sys.stdout.flush()
after = json.loads(sys.stdin.readline())
sys.stdout.write(json.dumps({"op": "commit", "id": 79, "step": after["step"], "output": "ok"}) + "\n")
sys.stdout.flush()
sys.stdin.readline()
json.dump([answer, after], open("answers.json", "w"))
while not os.path.exists("done"):
    time.sleep(0.02)
"#;
    env.write("agent.py", agent);
    let mut durun = env.spawn(
        &["run", "--task", "huge", "--", "python3", "agent.py"],
        "run",
    );
    wait_for("the agent's answers", Duration::from_secs(60), || {
        env.path("answers.json").exists()
    });
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", durun.id())).expect("durun is alive");
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmHWM");
    std::fs::write(env.path("done"), "").expect("done");
    assert!(durun.wait().expect("durun").success(), "{}", env.log("run"));
    let answers: Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("answers.json")).expect("answers"))
            .expect("JSON");
    assert_eq!(answers[0]["id"], 77);
    assert_eq!(answers[0]["error"]["code"], "bad_request");
    assert!(
        answers[0]["error"]["message"]
            .as_str()
            .expect("message")
            .contains("64 MiB")
    );
    assert_eq!(answers[1]["step"], 1, "the refused line opened no step");
    // A line up to the limit is read whole; past it durun drops the rest, so
    // a 200 MiB line costs about the limit, not the line.
    assert!(
        peak_kib < 128 * 1024,
        "durun held {peak_kib} KiB for a 200 MiB line"
    );
}

#[test]
fn an_agent_that_closes_stdout_or_leaves_steps_open_ends_cleanly() {
    let env = TestEnv::new();
    let agent = r#"
import json, os, sys, time
for i, effect in [(1, "read"), (2, "mutate")]:
    sys.stdout.write(json.dumps({"op": "begin", "id": i, "name": "s%d" % i, "args": {}, "effect": effect}) + "\n")
    sys.stdout.flush()
    sys.stdin.readline()
sys.stdout.write('{"op": "call", "id": 3, "tool": \n')
sys.stdout.flush()
os.close(1)
time.sleep(0.3)
"#;
    env.write("agent.py", agent);
    let output = env.durun(&["run", "--task", "early", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("looks like a request but is not valid JSON"),
        "{stderr}"
    );
    assert_eq!(
        text(&output.stdout),
        "{\"op\": \"call\", \"id\": 3, \"tool\": \n"
    );
    let view = env.inspect("early");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "the open read step left no row");
    assert_eq!(
        steps[0]["status"], "pending",
        "the open mutate step stays in doubt"
    );
    env.assert_journal_intact();
}

#[test]
fn tools_that_hang_flood_or_are_missing_fail_their_step() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        r#"
[tools.hang]
effect = "read"
command = ["sh", "-c", "sleep 60 & echo $! > grandchild.pid; wait"]
timeout = "300ms"

[tools.flood]
effect = "read"
command = ["sh", "-c", "head -c 40000000 /dev/zero | tr '\\0' x"]

[tools.missing]
effect = "read"
command = ["./no-such-tool"]
"#,
    );
    let script = json!([
        {"send": r#"{"op":"call","id":1,"tool":"hang"}"#},
        {"send": r#"{"op":"call","id":2,"tool":"flood"}"#},
        {"send": r#"{"op":"call","id":3,"tool":"missing"}"#},
    ]);
    let (output, answers) = env.probe("tools", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(answers[0]["error"]["code"], "timeout");
    let grandchild = read_pid(&env.path("grandchild.pid"));
    wait_for(
        "the tool's whole process group to die",
        Duration::from_secs(5),
        || process_gone(grandchild),
    );
    assert_eq!(answers[1]["error"]["code"], "tool_failed");
    assert!(
        answers[1]["error"]["message"]
            .as_str()
            .expect("message")
            .contains("more than 32 MiB")
    );
    assert_eq!(answers[2]["error"]["code"], "tool_failed");
    assert!(
        answers[2]["error"]["message"]
            .as_str()
            .expect("message")
            .contains("cannot start")
    );
    let view = env.inspect("tools");
    let statuses: Vec<&str> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["status"].as_str().expect("status"))
        .collect();
    assert_eq!(statuses, ["failed", "failed", "failed"]);
    env.assert_journal_intact();
}

/// SPEC 17: runs, submits and a worker that all find the same new SQLite
/// journal at once all succeed; none exits 74.
#[test]
fn several_processes_creating_one_new_journal_at_once_all_succeed() {
    let env = TestEnv::new();
    for round in 0..8 {
        let journal = env.path(&format!("round{round}/journal.db"));
        let start = |args: &[&str]| {
            env.command()
                .env("DURUN_JOURNAL", &journal)
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("durun")
        };
        let mut worker = start(&["worker"]);
        let others: Vec<std::process::Child> = (0..4)
            .map(|n| start(&["-q", "run", "--task", &format!("run{n}"), "--", "true"]))
            .chain((0..4).map(|n| {
                start(&[
                    "-q",
                    "submit",
                    "--task",
                    &format!("queued{n}"),
                    "--",
                    "true",
                ])
            }))
            .collect();
        for child in others {
            let output = child.wait_with_output().expect("durun");
            assert!(
                output.status.success(),
                "round {round}: {:?}: {}",
                output.status,
                text(&output.stderr)
            );
        }
        let status = |task: &str| {
            let output = env
                .command()
                .env("DURUN_JOURNAL", &journal)
                .args(["inspect", task, "--json"])
                .output()
                .expect("inspect");
            serde_json::from_slice::<Value>(&output.stdout)
                .map_or(Value::Null, |view| view["task"]["status"].clone())
        };
        wait_for(
            "the worker to run the queued tasks",
            Duration::from_secs(60),
            || {
                assert!(
                    worker.try_wait().expect("try_wait").is_none(),
                    "round {round}: the worker exited"
                );
                (0..4).all(|n| status(&format!("queued{n}")) == "completed")
            },
        );
        crate::env::signal(i32::try_from(worker.id()).expect("pid"), libc::SIGTERM);
        let output = worker.wait_with_output().expect("worker");
        assert!(
            output.status.success(),
            "round {round}: {}",
            text(&output.stderr)
        );
    }
}
