//! Every `--help` and every error message durun prints, as snapshots: a
//! change to what a person reads shows up in review. Paths are written as
//! `[TEST_ENV]`, times are pinned.

use std::fmt::Write as _;

use crate::env::{TestEnv, text};

fn redacted(env: &TestEnv, output: &std::process::Output) -> String {
    let all = format!("{}{}", text(&output.stdout), text(&output.stderr));
    all.replace(&env.dir.path().to_string_lossy().into_owned(), "[TEST_ENV]")
}

#[test]
fn help_of_every_command() {
    let env = TestEnv::new();
    let mut all = String::new();
    for command in [
        "",
        "run",
        "resume",
        "inspect",
        "resolve",
        "cancel",
        "gc",
        "step",
        "call",
        "completions",
    ] {
        let mut args: Vec<&str> = command.split_whitespace().collect();
        args.push("--help");
        let output = env
            .command()
            .env("COLUMNS", "100")
            .args(&args)
            .output()
            .expect("durun");
        assert!(output.status.success(), "{command}");
        let _ = writeln!(
            all,
            "$ durun {}\n{}",
            args.join(" "),
            redacted(&env, &output)
        );
    }
    insta::assert_snapshot!("help", all);
}

#[test]
fn every_error_message() {
    let mut env = TestEnv::new();
    if env.postgres.is_some() {
        // The journal's place reads differently there.
        crate::env::skipped(crate::env::SQLITE_ONLY);
        return;
    }
    env.set("COLUMNS", "100");
    env.write("bad.toml", "[tools.a]\neffect = \"read\"\n");
    env.write(
        "zero.toml",
        "[tools.a]\ncommand = [\"true\"]\ntimeout = \"0s\"\n",
    );
    std::fs::create_dir(env.path("dir")).expect("dir");
    let other = env.path("other.db");
    rusqlite::Connection::open(&other)
        .and_then(|conn| conn.execute_batch("CREATE TABLE users (id INTEGER)"))
        .expect("another program's database");
    let other = other.to_string_lossy().into_owned();
    let dir = env.path("dir").to_string_lossy().into_owned();
    // A finished task, a task waiting for a decision, and a diverged one.
    let ok = env.durun(&["run", "--task", "done", "--", "true"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    env.write(
        "agent.py",
        r#"
import json, sys
v = int(open("v").read())
sys.stdout.write(json.dumps({"op": "begin", "id": 1, "name": "plan", "args": {"v": v}}) + "\n")
sys.stdout.flush()
step = json.loads(sys.stdin.readline())
if not step["ok"]:
    sys.exit(2)
sys.stdout.write(json.dumps({"op": "commit", "id": 2, "step": step["step"], "output": "plan"}) + "\n")
sys.stdout.flush()
sys.stdin.readline()
sys.exit(3)
"#,
    );
    env.write("v", "1");
    let first = env.durun(&["-q", "run", "--task", "path", "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    env.write("v", "2");
    let cases: Vec<Vec<&str>> = vec![
        vec!["frobnicate"],
        vec!["run"],
        vec!["run", "--task", "a b", "--", "true"],
        vec!["run", "--task", "done", "--", "false"],
        vec!["run", "--config", "missing.toml", "--", "true"],
        vec!["run", "--config", "bad.toml", "--", "true"],
        vec!["run", "--config", "zero.toml", "--", "true"],
        vec!["-q", "run", "--task", "ghost", "--", "./no-such-agent"],
        vec!["resume", "nope"],
        vec!["resume", "--jobs", "2", "done"],
        vec!["inspect", "nope"],
        vec!["inspect", "done", "--step", "9"],
        vec!["inspect", "--status", "bogus"],
        vec!["resolve", "done", "1", "--output", "{not json"],
        vec!["resolve", "nope", "1", "--retry"],
        vec!["cancel", "nope"],
        vec!["gc", "--older-than", "100y"],
        vec!["call", "notify"],
        vec!["--journal", &other, "inspect"],
        vec!["--journal", &dir, "inspect"],
        vec!["--journal", "/dev/null", "run", "--", "true"],
        vec!["--journal", "postgres://nobody@127.0.0.1:1/none", "inspect"],
        vec!["signal", "nope", "go"],
        vec!["signal", "done", "go"],
        vec!["signal", "path", "go", "--data", "{not json"],
        vec!["approve", "path"],
        vec!["approve", "path", "--data", "[1]"],
        vec!["export", "nope"],
        vec!["import", "missing.jsonl"],
        vec!["import", "bad.toml"],
        vec!["fork", "nope", "--from-step", "1"],
        vec!["fork", "done", "--from-step", "9"],
        vec!["wait", "go"],
        vec!["sleep", "--until", "tomorrow"],
        vec!["run", "--park-after", "soon", "--", "true"],
        vec!["run", "--max-tokens", "-5", "--", "true"],
    ];
    let mut all = String::new();
    for args in &cases {
        let output = env.durun(args);
        let _ = write!(
            all,
            "$ durun {} -> exit {:?}\n{}\n",
            args.join(" ")
                .replace(&env.dir.path().to_string_lossy().into_owned(), "[TEST_ENV]"),
            output.status.code(),
            redacted(&env, &output)
        );
    }
    // A path the agent changed: the divergence, its diff and its hint.
    let output = env.durun(&["-q", "resume", "path"]);
    let _ = write!(
        all,
        "$ durun -q resume path (the agent asks for another step 1) -> exit {:?}\n{}\n",
        output.status.code(),
        redacted(&env, &output)
    );
    insta::assert_snapshot!("errors", all);
}
