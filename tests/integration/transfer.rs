//! Tasks moved between journals: `export`, `import` (every row checked,
//! nothing written from a bad file) and `fork`. Real agents through the
//! Python SDK; on SQLite by `cargo test` and on PostgreSQL by `.ci/run`.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, text, wait_for};
use crate::waiting::{ran, run, waiter_args, waiter_env};

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
