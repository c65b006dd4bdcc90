//! What `inspect` shows: snapshots of the list, the task view, the step
//! view and errors (times pinned), and the JSON shape field by field.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, text};
use crate::proxy::llm_env;

/// A task whose journal holds committed, failed, pending and discarded
/// steps, with every timestamp pinned, and a second, completed task.
fn journal_with_every_kind_of_step() -> TestEnv {
    let mut env = TestEnv::new();
    env.set("COLUMNS", "120");
    env.set("DURUN_TEST_NOW", "2026-11-29T12:00:00Z");
    std::fs::copy(agents_dir().join("probe.py"), env.path("probe.py")).expect("copy probe");
    env.write(
        "durun.toml",
        "[tools.echo]\neffect = \"read\"\ncommand = [\"echo\", \"{text}\"]\n",
    );
    let first = json!([
        {"send": r#"{"op":"begin","id":1,"name":"llm.plan","args":{"prompt":"plan the fix"}}"#},
        {"send": r#"{"op":"commit","id":2,"step":1,"output":"1. find the typo\n2. fix it","usage":{"input_tokens":812,"output_tokens":240}}"#},
        {"send": r#"{"op":"call","id":3,"tool":"echo","args":{"text":"README.md"}}"#},
        {"send": r#"{"op":"begin","id":4,"name":"lint","args":{}}"#},
        {"send": r#"{"op":"fail","id":5,"step":3,"error":"3 warnings"}"#},
        {"send": r#"{"op":"begin","id":6,"name":"open_pr","args":{"title":"Fix typo"},"effect":"mutate"}"#},
    ]);
    env.write("script.json", &first.to_string());
    let run = env.durun(&[
        "run",
        "--task",
        "fix-typo",
        "--",
        "python3",
        "probe.py",
        "script.json",
        "answers.jsonl",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let second = json!([
        {"send": r#"{"op":"begin","id":1,"name":"llm.plan","args":{"prompt":"plan the fix"}}"#},
        {"send": r#"{"op":"call","id":3,"tool":"echo","args":{"text":"README.md"}}"#},
        {"send": r#"{"op":"begin","id":4,"name":"lint","args":{"fix":true}}"#},
        {"send": r#"{"op":"commit","id":5,"step":3,"output":"clean"}"#},
        {"send": r#"{"op":"begin","id":6,"name":"open_pr","args":{"title":"Fix typo"},"effect":"mutate"}"#},
        {"send": r#"{"op":"commit","id":7,"step":4,"output":{"url":"https://git.example/pr/7"}}"#},
        {"send": r#"{"op":"begin","id":8,"name":"notify","args":{"channel":"dev"},"effect":"mutate"}"#},
        {"send": r#"{"op":"fail","id":9,"step":5,"error":"webhook answered 503"}"#},
        {"send": r#"{"op":"begin","id":10,"name":"retry_notify","args":{},"effect":"mutate"}"#},
    ]);
    env.write("script.json", &second.to_string());
    let resumed = env.durun(&["resume", "fix-typo", "--from-step", "3"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(
        env.durun(&["run", "--task", "hello", "--", "echo", "hi"])
            .status
            .success()
    );
    // Pin every time: steps take 1.5 s, runs 4 s, all on one morning.
    env.sql(
        "UPDATE steps SET created_at = '2026-11-29T10:00:00.000Z', started_at = '2026-11-29T10:00:00.000Z',
             finished_at = CASE WHEN finished_at IS NULL THEN NULL ELSE '2026-11-29T10:00:01.500Z' END;
         UPDATE runs SET started_at = '2026-11-29T10:00:00.000Z', finished_at = '2026-11-29T10:00:04.000Z', pid = 4242;
         UPDATE tasks SET created_at = '2026-11-29T10:00:00.000Z', updated_at = '2026-11-29T10:00:04.000Z' WHERE id = 'fix-typo';
         UPDATE tasks SET created_at = '2026-11-29T11:58:00.000Z', updated_at = '2026-11-29T11:58:00.000Z' WHERE id = 'hello';",
    );
    env
}

fn redacted(env: &TestEnv, output: &std::process::Output) -> String {
    let all = format!("{}{}", text(&output.stdout), text(&output.stderr));
    all.replace(&env.dir.path().to_string_lossy().into_owned(), "[TEST_ENV]")
}

#[test]
fn the_task_list() {
    let env = journal_with_every_kind_of_step();
    insta::assert_snapshot!(redacted(&env, &env.durun(&["inspect"])), @"
    TASK      STATUS     STEPS  SPENT  SAVED  AGE     COMMAND
    hello     completed      0      0      0  2m ago  echo hi
    fix-typo  completed      6  1,052  1,052  2h ago  python3 probe.py script.json answers.jsonl
    ");
}

#[test]
fn the_task_view() {
    let env = journal_with_every_kind_of_step();
    insta::assert_snapshot!(redacted(&env, &env.durun(&["inspect", "fix-typo"])), @r#"
    task     fix-typo
    status   completed, exit 0
    command  python3 probe.py script.json answers.jsonl
    cwd      [TEST_ENV]
    tokens   1,052 spent, 1,052 saved
    cost     unknown (1 step at a model without a price)
    journal  sync full, 2 runs, created 2h ago

    RUN  EXIT  REPLAYED  EXECUTED  SPENT  SAVED  STARTED  TOOK
      1     0         0         3  1,052      0  2h ago   4.0s
      2     0         2         3      0  1,052  2h ago   4.0s

    STEP  NAME          KIND   EFFECT  STATUS       TRIES  TOOK  TOKENS  KEY       OUTPUT
       1  llm.plan      begin  read    committed        1  1.5s   1,052  3ea38321  1. find the typo 2. fix it
       2  echo          call   read    committed        1  1.5s          9f4d1ec4  README.md
       3  lint          begin  read    discarded        1  1.5s          52ee881b  tool_failed: 3 warnings
       3  lint          begin  read    committed        1  1.5s          9feaefe2  clean
       4  open_pr       begin  mutate  discarded        1     -          c3c4bcb0
       4  open_pr       begin  mutate  committed        1  1.5s          c3c4bcb0  {"url":"https://git.example/pr/7"}
       5  notify        begin  mutate  failed           1  1.5s          57623d5b  tool_failed: webhook answered 503
       6  retry_notify  begin  mutate  interrupted      1     -          9725c1a0
    "#);
}

#[test]
fn the_step_view_shows_a_discarded_step_and_its_replacement() {
    let env = journal_with_every_kind_of_step();
    insta::assert_snapshot!(redacted(&env, &env.durun(&["inspect", "fix-typo", "--step", "3"])), @r#"
    step        3 of task fix-typo
    name        lint (begin, read)
    status      discarded after 1 attempt
    key         52ee881b42a970951a6f3e7cb21c68f7c3c75f519e42e4d9f364af27c2ce15ef
    args hash   44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a
    created     2026-11-29T10:00:00.000Z (2h ago)
    started     2026-11-29T10:00:00.000Z (run 1)
    finished    2026-11-29T10:00:01.500Z (took 1.5s)
    args
      {}
    error
      tool_failed: 3 warnings

    step        3 of task fix-typo
    name        lint (begin, read)
    status      committed after 1 attempt
    key         9feaefe280f4095b7e22576b265dab3079886417f9bb826e990d7d819d45e4a0
    args hash   8fea83035c0d6a87203609e2aa4ccf4b776a08641cbb3c3dcab152d32a895253
    created     2026-11-29T10:00:00.000Z (2h ago)
    started     2026-11-29T10:00:00.000Z (run 2)
    finished    2026-11-29T10:00:01.500Z (took 1.5s)
    args
      {
        "fix": true
      }
    output (5 B)
      clean
    "#);
}

#[test]
fn errors_read_as_one_line_and_a_hint() {
    let env = journal_with_every_kind_of_step();
    let mut all = String::new();
    for args in [
        &["inspect", "nope"][..],
        &["inspect", "fix-typo", "--step", "9"][..],
        &["resume", "hello"][..],
        &["run", "--task", "hello", "--", "echo", "bye"][..],
        &["resolve", "fix-typo", "2", "--output", "{not json"][..],
    ] {
        let output = env.durun(args);
        let _ = write!(
            all,
            "$ durun {} -> exit {:?}\n{}\n",
            args.join(" "),
            output.status.code(),
            redacted(&env, &output)
        );
    }
    insta::assert_snapshot!(all, @r#"
    $ durun inspect nope -> exit Some(64)
    durun: no task nope in the journal at [TEST_ENV]/state/journal.db
      hint: `durun inspect` lists the tasks; --journal or DURUN_JOURNAL chooses the journal

    $ durun inspect fix-typo --step 9 -> exit Some(64)
    durun: task fix-typo has no step 9
      hint: `durun inspect fix-typo` lists its steps

    $ durun resume hello -> exit Some(0)
    durun: task hello already completed; nothing to resume

    $ durun run --task hello -- echo bye -> exit Some(64)
    hello
    durun: task hello was started with another command: echo hi
      hint: use a new --task id, or `durun resume hello` to run it as recorded

    $ durun resolve fix-typo 2 --output {not json -> exit Some(2)
    durun: invalid value '{not json' for '--output <JSON>': not JSON: key must be a string at line 1 column 2; quote it for the shell, like '{"key": "value"}' or '"text"', or give @FILE

    For more information, try '--help'.
    "#);
}

#[test]
fn filters_narrow_the_list() {
    let env = journal_with_every_kind_of_step();
    let list = |args: &[&str]| -> Value {
        let output = env.durun(args);
        serde_json::from_slice(&output.stdout).expect("JSON")
    };
    let ids = |value: Value| -> Vec<String> {
        value["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .map(|t| t["id"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(ids(list(&["inspect", "--json"])), ["hello", "fix-typo"]);
    assert_eq!(
        ids(list(&["inspect", "--json", "--status", "completed"])),
        ["hello", "fix-typo"]
    );
    assert_eq!(
        ids(list(&["inspect", "--json", "--status", "failed"])),
        Vec::<String>::new()
    );
    assert_eq!(ids(list(&["inspect", "--json", "--limit", "1"])), ["hello"]);
}

/// The JSON of SPEC 6, member by member: what scripts rely on.
#[test]
fn the_json_shape() {
    let env = journal_with_every_kind_of_step();
    let list: Value =
        serde_json::from_slice(&env.durun(&["inspect", "--json"]).stdout).expect("JSON");
    a_summary_has_its_members(&list["tasks"][1]);
    let view = env.inspect("fix-typo");
    a_task_and_its_runs_have_their_members(&view["task"]);
    every_version_of_a_step_is_listed_with_its_members(&view);
}

/// A task in `inspect --json`'s list.
fn a_summary_has_its_members(summary: &Value) {
    let mut keys: Vec<String> = summary
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "command",
            "cost_saved_usd",
            "cost_usd",
            "created_at",
            "held_by",
            "id",
            "max_tokens",
            "max_usd",
            "queue",
            "status",
            "steps",
            "tokens_saved",
            "tokens_spent",
            "unpriced_steps",
            "updated_at"
        ]
    );
    assert_eq!(summary["id"], "fix-typo");
    assert_eq!(
        summary["command"],
        json!(["python3", "probe.py", "script.json", "answers.jsonl"])
    );
    assert_eq!(summary["tokens_saved"], 1052);
}

/// `inspect TASK --json`'s task, and its runs.
fn a_task_and_its_runs_have_their_members(task: &Value) {
    for member in [
        "id",
        "status",
        "command",
        "cwd",
        "exit_code",
        "output",
        "runs",
        "created_at",
        "updated_at",
        "max_tokens",
        "max_usd",
        "waiting_for",
        "signals",
    ] {
        assert!(task.get(member).is_some(), "task.{member}");
    }
    assert_eq!(task["status"], "completed");
    assert_eq!(task["max_tokens"], Value::Null);
    assert_eq!(task["max_usd"], Value::Null);
    assert_eq!(task["waiting_for"], Value::Null, "null when not parked");
    assert_eq!(task["exit_code"], 0);
    assert_eq!(task["output"], Value::Null);
    assert_eq!(task["updated_at"], "2026-11-29T10:00:04.000Z");
    let runs = task["runs"].as_array().expect("runs");
    for member in [
        "run",
        "exit_code",
        "replayed_steps",
        "executed_steps",
        "tokens_spent",
        "tokens_saved",
    ] {
        assert!(runs[0].get(member).is_some(), "runs[].{member}");
    }
    assert_eq!(
        (
            runs[1]["replayed_steps"].clone(),
            runs[1]["executed_steps"].clone()
        ),
        (json!(2), json!(3))
    );
    assert_eq!(
        (
            runs[0]["tokens_spent"].clone(),
            runs[1]["tokens_saved"].clone()
        ),
        (json!(1052), json!(1052))
    );
}

/// `inspect TASK --json`'s steps, a discarded version too.
fn every_version_of_a_step_is_listed_with_its_members(view: &Value) {
    let steps = view["steps"].as_array().expect("steps");
    let statuses: Vec<(u64, &str)> = steps
        .iter()
        .map(|s| {
            (
                s["step"].as_u64().expect("n"),
                s["status"].as_str().expect("s"),
            )
        })
        .collect();
    assert_eq!(
        statuses,
        [
            (1, "committed"),
            (2, "committed"),
            (3, "discarded"),
            (3, "committed"),
            (4, "discarded"),
            (4, "committed"),
            (5, "failed"),
            (6, "pending")
        ]
    );
    let plan = &steps[0];
    for member in [
        "step",
        "name",
        "kind",
        "effect",
        "status",
        "args",
        "args_hash",
        "idempotency_key",
        "attempts",
        "output",
        "error",
        "usage",
        "created_at",
        "finished_at",
    ] {
        assert!(plan.get(member).is_some(), "steps[].{member}");
    }
    assert_eq!(plan["name"], "llm.plan");
    assert_eq!(plan["kind"], "begin");
    assert_eq!(plan["effect"], "read");
    assert_eq!(plan["args"], json!({"prompt": "plan the fix"}));
    assert_eq!(
        plan["usage"],
        json!({"input_tokens": 812, "output_tokens": 240})
    );
    assert_eq!(plan["error"], Value::Null);
    assert_eq!(plan["created_at"], "2026-11-29T10:00:00.000Z");
    assert_eq!(steps[1]["kind"], "call");
    assert_eq!(steps[1]["output"], "README.md\n");
    assert_eq!(
        steps[6]["error"],
        json!({"code": "tool_failed", "message": "webhook answered 503"})
    );
    assert_eq!(steps[7]["finished_at"], Value::Null);
    // Keys are the Python reference: sha256 of "task:step:canonical args".
    assert_eq!(
        plan["idempotency_key"],
        "3ea38321cfa081ea9735ca24407d79b26775801d36ffbba343bf9c5e47b5872b"
    );
}

#[test]
fn follow_prints_steps_as_a_running_task_makes_them() {
    let env = TestEnv::new();
    let plan = json!({
        "pidfile": env.path("agent.pid"),
        "steps": [
            {"begin": "first", "args": {}, "do": {"value": 1}},
            {"begin": "wait", "args": {}, "do": {"wait_for": env.path("go")}},
            {"begin": "last", "effect": "mutate", "args": {}, "do": {"value": 3}},
        ],
    });
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "live", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut runner = env.spawn(&args, "run");
    crate::env::read_pid(&env.path("agent.pid"));
    let mut follower = env
        .command()
        .args(["inspect", "live", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("follow");
    // The follower has seen the task running once it printed its first
    // step: only then does the task go on.
    let mut reader = std::io::BufReader::new(follower.stdout.take().expect("stdout"));
    let mut seen = String::new();
    for _ in 0..2 {
        std::io::BufRead::read_line(&mut reader, &mut seen).expect("a line");
    }
    std::fs::write(env.path("go"), "").expect("go");
    assert!(runner.wait().expect("runner").success());
    std::io::Read::read_to_string(&mut reader, &mut seen).expect("the rest");
    assert!(
        follower
            .wait()
            .expect("follower ends when the task does")
            .success()
    );
    let text = seen;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "following task live (running)");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("step 1 first committed")),
        "{text}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("step 3 last pending"))
            || lines.iter().any(|l| l.starts_with("step 3 last committed")),
        "{text}"
    );
    assert_eq!(lines.last(), Some(&"task live completed (exit 0)"));
}

#[test]
fn progress_is_one_plain_line_per_step_in_a_log_and_none_with_q() {
    let env = TestEnv::new();
    let plan = json!({"steps": [
        {"begin": "a", "args": {}, "do": {"value": 1}},
        {"begin": "b", "args": {}, "do": {"value": 2}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "p", "--"];
    args.extend(agent.iter().map(String::as_str));
    let output = env.durun(&args);
    let stderr = text(&output.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[durun]"))
        .collect();
    assert_eq!(ours.len(), 4, "{stderr}");
    assert!(ours[0].starts_with("[durun] task p: run 1"));
    assert!(ours[1].starts_with("[durun] step 1 a: committed in "));
    assert!(ours[2].starts_with("[durun] step 2 b: committed in "));
    assert!(ours[3].starts_with("[durun] task p completed: 0 steps replayed, 2 executed"));

    let mut quiet = vec!["-q"];
    quiet.extend(args.iter().copied());
    quiet[3] = "q";
    let output = env.durun(&quiet);
    assert_eq!(
        text(&output.stderr),
        "q\n",
        "-q prints the task id and nothing else"
    );
    assert_eq!(
        text(&output.stdout),
        "agent: starting\n",
        "stdout carries only the agent's own lines"
    );
}

/// A journal a first run is creating reads as empty, never as an error.
#[test]
fn a_journal_being_created_reads_as_empty() {
    for round in 0..20 {
        let env = TestEnv::new();
        if env.postgres.is_some() {
            crate::env::skipped(crate::env::SQLITE_ONLY);
            return;
        }
        let mut run = env
            .command()
            .args(["run", "-q", "--", "true"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("durun run");
        loop {
            let done = run.try_wait().expect("try_wait").is_some();
            let listed = env.durun(&["inspect", "--json"]);
            assert_eq!(
                listed.status.code(),
                Some(0),
                "round {round}: {}",
                text(&listed.stderr)
            );
            let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
            assert!(listed["tasks"].is_array(), "{listed}");
            if done {
                break;
            }
        }
    }
}

#[test]
fn a_task_held_back_after_its_agent_keeps_dying_says_when_a_worker_resumes_it() {
    let env = TestEnv::new();
    let killed = |output: std::process::Output| {
        assert_eq!(output.status.code(), Some(137), "{}", text(&output.stderr));
    };
    // A queued task, run here rather than by a worker.
    let agent = ["--", "sh", "-c", "kill -9 $$"];
    let submitted = env.durun(&[&["submit", "--task", "oom"][..], &agent].concat());
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    killed(env.durun(&["resume", "oom"]));
    // One crash: a worker resumes it at once, so nothing is said.
    let shown = text(&env.durun(&["inspect", "oom"]).stdout);
    assert!(shown.contains("status   interrupted"), "{shown}");
    assert!(!shown.contains("resumes"), "{shown}");
    for _ in 0..3 {
        killed(env.durun(&["resume", "oom"]));
    }
    // Four in a row: the next waits 4 s from the last one's end.
    let shown = text(&env.durun(&["inspect", "oom"]).stdout);
    let line = shown
        .lines()
        .find(|line| line.starts_with("resumes  by a worker in "))
        .unwrap_or_else(|| panic!("no line on the wait: {shown}"));
    assert!(
        line.ends_with(
            "s: its agent was killed by a signal in its last 4 runs (`durun resume oom` resumes it now)"
        ),
        "{line}"
    );
    // A task in no queue: no worker takes it, so none holds it back.
    for _ in 0..4 {
        killed(env.durun(&[&["run", "--task", "alone"][..], &agent].concat()));
    }
    let shown = text(&env.durun(&["inspect", "alone"]).stdout);
    assert!(shown.contains(", 4 runs, "), "{shown}");
    assert!(!shown.contains("resumes"), "{shown}");
}

#[test]
fn inspect_shows_a_model_call_as_its_conversation_and_its_answer_assembled() {
    let (mut env, _server) = llm_env();
    env.set("PYTHONPATH", agents_dir().to_string_lossy());
    let agent = env.write(
        "ask.py",
        r#"import os
from chat import post
post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", {"model": "m", "stream": True, "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "stream this"}]})
post(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", {"model": "c", "max_tokens": 5, "system": "S",
    "messages": [{"role": "user", "content": "claude"}]})
"#,
    );
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let shown = |step: &str| text(&env.durun(&["inspect", "t", "--step", step]).stdout);
    // The stream's chunks read as the text they carry; the raw body stays
    // below, under `output`.
    let stream = shown("1");
    for line in [
        "model       m\n",
        "  system     Be brief.\n",
        "  user       stream this\n",
        "answer\n  assistant  echo: stream this",
        "output (",
    ] {
        assert!(stream.contains(line), "{line:?} in:\n{stream}");
    }
    let message = shown("2");
    for line in [
        "  system     S\n",
        "  user       claude\n",
        "answer\n  assistant  echo: claude\n",
    ] {
        assert!(message.contains(line), "{line:?} in:\n{message}");
    }
}
