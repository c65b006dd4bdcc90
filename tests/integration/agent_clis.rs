//! The coding-agent CLIs (SPEC 18), the real packages: each runs under
//! `durun run --` with no durun config against a fake upstream, durun is
//! killed while its third model call is in flight, and a resume from a
//! shell without the upstream variables sends none of the finished calls
//! again. Their stdin is a pipe nobody writes: a CLI that waited on it
//! would hang the resume.
//!
//! `.ci/run` installs the pinned CLIs under one folder and names it in
//! `DURUN_TEST_CLI_DIR` (npm's `node_modules/.bin/`, aider's virtualenv
//! `aider/bin/`), and sets `DURUN_TEST_AGENT_CLIS`, which makes a missing
//! CLI a failure; elsewhere each test says it is skipped.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::env::{TestEnv, agents_dir, wait_exit, wait_for};

const PROMPT: &str = "durun-session: run the two echo commands";

/// The CLI's program in `DURUN_TEST_CLI_DIR`, or `None` (said skipped).
fn cli(program: &str) -> Option<PathBuf> {
    let required = std::env::var("DURUN_TEST_AGENT_CLIS").is_ok();
    let found = std::env::var_os("DURUN_TEST_CLI_DIR")
        .map(|dir| PathBuf::from(dir).join(program))
        .filter(|path| path.is_file());
    if found.is_none() {
        assert!(
            !required,
            "DURUN_TEST_AGENT_CLIS is set but DURUN_TEST_CLI_DIR has no {program}"
        );
        crate::env::skipped(&format!(
            "{program} is not installed: set DURUN_TEST_CLI_DIR to a folder with {program} (`.ci/run` installs it)"
        ));
    }
    found
}

/// The fake upstream of `cli_upstream.py`, and the keys of the requests
/// it was sent.
struct Upstream {
    process: std::process::Child,
    state: PathBuf,
    url: String,
}

impl Upstream {
    fn start(env: &TestEnv) -> Self {
        let state = env.path("upstream");
        std::fs::create_dir_all(&state).expect("upstream dir");
        let process = std::process::Command::new("python3")
            .arg(agents_dir().join("cli_upstream.py"))
            .arg(&state)
            .spawn()
            .expect("start the fake upstream");
        let port_file = state.join("port");
        wait_for("the upstream's port", Duration::from_secs(30), || {
            port_file.exists()
        });
        let url = format!(
            "http://127.0.0.1:{}",
            std::fs::read_to_string(&port_file).expect("port").trim()
        );
        Self {
            process,
            state,
            url,
        }
    }

    fn keys(&self) -> Vec<String> {
        std::fs::read_to_string(self.state.join("requests"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Upstream {
    /// Where each request of a key in `again` sent from `index` on
    /// differs from the first request of its key: what made durun send a
    /// finished call again.
    fn changes(&self, index: usize, again: &[&String]) -> String {
        let bodies: Vec<serde_json::Value> = std::fs::read_to_string(self.state.join("bodies"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let mut said = String::new();
        for later in bodies.iter().skip(index) {
            if !again.iter().any(|key| later["key"] == key.as_str()) {
                continue;
            }
            let Some(first) = bodies.iter().find(|body| body["key"] == later["key"]) else {
                continue;
            };
            let _ = writeln!(said, "{} changed:", later["key"]);
            differences(&first["body"], &later["body"], "", &mut said);
        }
        said
    }
}

/// Appends the JSON pointers where `a` and `b` differ, with both values
/// (cut to 400 bytes).
fn differences(a: &serde_json::Value, b: &serde_json::Value, at: &str, said: &mut String) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys().filter(|key| !x.contains_key(*key))) {
                let (left, right) = (&x.get(key), &y.get(key));
                if left != right {
                    let (left, right) =
                        (left.unwrap_or(&Value::Null), right.unwrap_or(&Value::Null));
                    differences(left, right, &format!("{at}/{key}"), said);
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (index, (left, right)) in x.iter().zip(y).enumerate() {
                if left != right {
                    differences(left, right, &format!("{at}/{index}"), said);
                }
            }
        }
        _ => {
            let cut = |value: &Value| value.to_string().chars().take(400).collect::<String>();
            let _ = writeln!(said, "  {at}: {} -> {}", cut(a), cut(b));
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Runs `argv` under durun, kills durun while the CLI's third model call
/// is held at the upstream, resumes, and checks that no finished call was
/// sent again.
fn crash_and_resume(env: &mut TestEnv, argv: &[String]) {
    let upstream = Upstream::start(env);
    let url = &upstream.url;
    std::fs::write(upstream.state.join("hold"), "").expect("hold");
    for (name, value) in [
        ("OPENAI_API_KEY", "sk-test"),
        ("ANTHROPIC_API_KEY", "sk-test"),
        ("GEMINI_API_KEY", "test-key"),
    ] {
        env.set(name, value);
    }
    // The CLIs describe their folder to the model (Gemini CLI lists it):
    // the test's logs and the upstream's files stay out of it.
    let work = env.path("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let mut args = vec!["run", "--task", "t", "--"];
    args.extend(argv.iter().map(String::as_str));
    let err = std::fs::File::create(env.path("run.err")).expect("log");
    let mut run = env
        .command()
        .env("OPENAI_BASE_URL", format!("{url}/v1"))
        .env("ANTHROPIC_BASE_URL", url)
        .env("GOOGLE_GEMINI_BASE_URL", url)
        .current_dir(&work)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn durun");
    let open_stdin = run.stdin.take();
    wait_for(
        "the CLI's third model call",
        Duration::from_secs(120),
        || upstream.keys().iter().any(|key| key.ends_with("turn 2")),
    );
    run.kill().expect("SIGKILL durun");
    run.wait().expect("reap");
    drop(open_stdin);
    let first = upstream.keys();
    std::fs::remove_file(upstream.state.join("hold")).expect("release the held call");

    // From a shell without the upstream variables: the task recorded them.
    let err = std::fs::File::create(env.path("resume.err")).expect("log");
    let mut resume = env
        .command()
        .args(["resume", "t"])
        .current_dir(&work)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn durun resume");
    let open_stdin = resume.stdin.take();
    let status = wait_exit(&mut resume, Duration::from_secs(120));
    drop(open_stdin);
    let log = std::fs::read_to_string(env.path("resume.err")).unwrap_or_default();
    assert!(
        status.success(),
        "resume: {status}\n{log}\nfirst run:\n{}",
        std::fs::read_to_string(env.path("run.err")).unwrap_or_default()
    );
    // Every call of the first run but the one held there finished.
    let held = first
        .iter()
        .position(|key| key.ends_with("turn 2"))
        .expect("a held call");
    let finished = &first[..held];
    assert!(finished.len() >= 2, "finished calls: {finished:?}");
    let all = upstream.keys();
    let again: Vec<&String> = all[first.len()..]
        .iter()
        .filter(|key| finished.contains(key))
        .collect();
    // What changed comes last: a CI log cut to its tail keeps it.
    assert!(
        again.is_empty(),
        "finished calls sent again on resume: {again:?}\n{log}\nwhat changed:\n{}",
        upstream.changes(first.len(), &again)
    );
    assert!(
        !log.contains("durun: add to durun.toml"),
        "the preset left a changing field: {log}"
    );
    check_journal(env);
}

/// The task completed, its finished model calls replayed, its tokens
/// counted.
fn check_journal(env: &TestEnv) {
    let inspected = env.inspect("t");
    let task = &inspected["task"];
    let summary = format!("status {}, runs {}", task["status"], task["runs"]);
    assert_eq!(task["status"], "completed", "{summary}");
    let committed = inspected["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["kind"] == "proxy" && step["status"] == "committed")
        .count();
    assert!(committed >= 3, "{committed} model calls: {summary}");
    assert!(
        task["runs"][1]["replayed_steps"].as_u64().unwrap_or(0) >= 2,
        "{summary}"
    );
    // A paid call never shows 0 tokens, streamed or not.
    assert!(task["tokens_spent"].as_u64().unwrap_or(0) > 0, "{summary}");
}

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| (*word).to_owned()).collect()
}

#[test]
fn claude_code_resumes_with_no_finished_call_sent_again() {
    let Some(claude) = cli("node_modules/.bin/claude") else {
        return;
    };
    let mut env = TestEnv::new();
    let mut argv = vec![claude.to_string_lossy().into_owned()];
    argv.extend(words(&["-p", PROMPT, "--allowedTools", "Bash(echo:*)"]));
    crash_and_resume(&mut env, &argv);
}

#[test]
fn codex_resumes_with_no_finished_call_sent_again() {
    let Some(codex) = cli("node_modules/.bin/codex") else {
        return;
    };
    let mut env = TestEnv::new();
    let mut argv = vec![codex.to_string_lossy().into_owned()];
    argv.extend(words(&["exec", "--skip-git-repo-check", PROMPT]));
    crash_and_resume(&mut env, &argv);
}

#[test]
fn aider_resumes_with_no_finished_call_sent_again() {
    let Some(aider) = cli("aider/bin/aider") else {
        return;
    };
    let mut env = TestEnv::new();
    let mut argv = vec![aider.to_string_lossy().into_owned()];
    // Its failing test command makes it ask the model again, twice.
    argv.extend(words(&[
        "--model",
        "openai/gpt-4o",
        "--edit-format",
        "whole",
        "--no-git",
        "--yes-always",
        "--no-check-update",
        "--no-show-model-warnings",
        "--analytics-disable",
        "--auto-test",
        "--test-cmd",
        "sh -c 'echo durun tests failed; exit 1'",
        "--message",
        PROMPT,
    ]));
    crash_and_resume(&mut env, &argv);
}

#[test]
fn gemini_cli_resumes_with_no_finished_call_sent_again() {
    let Some(gemini) = cli("node_modules/.bin/gemini") else {
        return;
    };
    let mut env = TestEnv::new();
    // A Gemini API key user's own settings, as `gemini` writes them.
    std::fs::create_dir_all(env.path(".gemini")).expect("settings dir");
    env.write(
        ".gemini/settings.json",
        r#"{"security": {"auth": {"selectedType": "gemini-api-key"}}}"#,
    );
    let mut argv = vec![gemini.to_string_lossy().into_owned()];
    argv.extend(words(&["--yolo", "--skip-trust", "-p", PROMPT]));
    crash_and_resume(&mut env, &argv);
}

/// A stand-in `codex` that writes down how it was started: its args, its
/// stdin, the variables a preset sets.
fn fake_codex(env: &TestEnv) -> String {
    let path = env.write(
        "codex",
        "#!/bin/sh\n{ echo \"args: $*\"; echo \"stdin: $(readlink /proc/self/fd/0)\"; } >> started.txt\n",
    );
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    path.to_string_lossy().into_owned()
}

#[test]
fn a_preset_is_found_by_the_programs_name_chosen_or_refused_and_kept_for_resume() {
    let env = TestEnv::new();
    let codex = fake_codex(&env);
    let run = env.durun(&["run", "--task", "found", "--", &codex, "exec", "hi"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let started = std::fs::read_to_string(env.path("started.txt")).expect("started");
    // Wired to the proxy through its own config, args kept in order, and
    // never waiting on a pipe.
    assert!(
        started.contains("args: -c model_provider=\"durun\" -c model_providers.durun={"),
        "{started}"
    );
    assert!(started.contains("/openai/v1\""), "{started}");
    assert!(started.contains("} exec hi\n"), "{started}");
    assert!(started.contains("stdin: /dev/null\n"), "{started}");

    // `--preset NAME` and `--preset none`: kept for resume.
    std::fs::remove_file(env.path("started.txt")).expect("rm");
    let script = env.write(
        "twice.sh",
        &format!("{codex} \"$@\"\n[ \"$DURUN_RUN\" = 1 ] && exit 3\nexit 0\n"),
    );
    let script = script.to_string_lossy().into_owned();
    let run = env.durun(&[
        "run", "--task", "named", "--preset", "codex", "--", "sh", &script, "x",
    ]);
    assert_eq!(
        run.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let started = std::fs::read_to_string(env.path("started.txt")).expect("started");
    // Named for a command whose program is not the CLI's: nothing is added
    // to the command (`sh -c …` would run it), the stdin is the CLI's.
    assert!(started.contains("args: x\n"), "{started}");
    assert!(started.contains("stdin: /dev/null\n"), "{started}");
    std::fs::remove_file(env.path("started.txt")).expect("rm");
    let run = env.durun(&[
        "run", "--task", "plain", "--preset", "none", "--", &codex, "exec",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let started = std::fs::read_to_string(env.path("started.txt")).expect("started");
    assert!(started.contains("args: exec\n"), "{started}");
    // The first run's choice holds on resume.
    let resumed = env.durun(&["resume", "named"]);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let started = std::fs::read_to_string(env.path("started.txt")).expect("started");
    assert!(
        started.ends_with("args: x\nstdin: /dev/null\n"),
        "{started}"
    );

    let refused = env.durun(&["run", "--preset", "cursor", "--", &codex]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("no preset \"cursor\": one of claude, codex, aider, gemini, or none"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let listed = env.durun(&["presets", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let names: Vec<&str> = listed["presets"]
        .as_array()
        .expect("presets")
        .iter()
        .filter_map(|preset| preset["name"].as_str())
        .collect();
    assert_eq!(names, ["claude", "codex", "aider", "gemini"]);
    assert_eq!(listed["presets"][1]["verified"], "0.171.0");
}
