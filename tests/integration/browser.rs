//! `durun ui` in a real browser: headless Chromium from Debian's package,
//! driven by Playwright (`tests/agents/ui_browser.py`): the list, a task's
//! page, journal data with markup shown as text, approve through the
//! button, live updates without a reload, and no request to another host.
//! `.ci/run` installs both and sets DURUN_TEST_BROWSER, which makes their
//! absence a failure; elsewhere the test is skipped.
//!
//! DURUN_UI_SCREENSHOTS=docs/img makes it write the README's screenshots.

use std::path::PathBuf;
use std::process::Command;

use crate::env::{TestEnv, agents_dir, path_with_durun, python_has};
use crate::ui::{Ui, evil_task};

fn chromium() -> Option<PathBuf> {
    let path = PathBuf::from(
        std::env::var("DURUN_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned()),
    );
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("DURUN_TEST_BROWSER").is_err(),
        "DURUN_TEST_BROWSER is set but there is no browser at {}: apt-get install chromium",
        path.display()
    );
    crate::env::skipped("apt-get install chromium to run it");
    None
}

/// An agent with a chat call and an Anthropic stream, by plain HTTP.
const MODEL_CALLS: &str = r#"import os
from chat import post
post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", {"model": "m", "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello model"}]})
post(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", {"model": "c", "max_tokens": 5, "stream": True,
    "messages": [{"role": "user", "content": "stream to me"}]})
"#;

/// Task `chat-call`: its model calls through the proxy, a chat call and a
/// streamed one.
fn model_calls(env: &TestEnv) {
    let llm = crate::servers::LlmServer::start(env);
    let asked = env
        .command()
        .env("OPENAI_BASE_URL", format!("{}/v1", llm.base()))
        .env("ANTHROPIC_BASE_URL", llm.base())
        .env("PYTHONPATH", agents_dir())
        .args([
            "run",
            "--task",
            "chat-call",
            "--",
            "python3",
            "-c",
            MODEL_CALLS,
        ])
        .output()
        .expect("durun");
    assert!(
        asked.status.success(),
        "{}",
        String::from_utf8_lossy(&asked.stderr)
    );
}

#[test]
fn the_web_view_in_a_real_browser() {
    if !python_has("playwright", "DURUN_TEST_BROWSER", "playwright") {
        return;
    }
    let Some(chromium) = chromium() else {
        return;
    };
    let env = TestEnv::new();
    let evil = evil_task(&env);
    // A task that ran, waited, was approved and resumed: replayed steps.
    let agent = agents_dir().join("ui_agent.py");
    let run = |args: &[&str]| {
        let output = env
            .command()
            .env("UI_PLAIN", "1")
            .env("UI_STEPS", "5")
            .env("UI_SLEEP", "0.2")
            .env("UI_WAIT", "approve")
            .args(args)
            .output()
            .expect("durun");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    std::fs::copy(&agent, env.path("agent.py")).expect("copy the agent");
    let (code, said) = run(&[
        "run",
        "--task",
        "release-1.4",
        "--park-after",
        "0s",
        "--",
        "python3",
        "agent.py",
    ]);
    assert_eq!(code, Some(77), "{said}");
    assert!(env.durun(&["approve", "release-1.4"]).status.success());
    let (code, said) = run(&["resume", "release-1.4"]);
    assert_eq!(code, Some(0), "{said}");
    // A failed task and a queued one, for a list with some of each.
    let failed = env.durun(&[
        "run",
        "--task",
        "triage-issue-88",
        "--",
        "python3",
        "-c",
        "raise SystemExit(1)",
    ]);
    assert_eq!(failed.status.code(), Some(1));
    let queued = env.durun(&[
        "submit",
        "--queue",
        "nightly",
        "--task",
        "digest-2026-12-02",
        "--",
        "python3",
        "agent.py",
    ]);
    assert!(
        queued.status.success(),
        "{}",
        String::from_utf8_lossy(&queued.stderr)
    );

    model_calls(&env);

    let ui = Ui::start(&env, &[]);
    let journal = env.postgres.as_ref().map_or_else(
        || env.journal.to_string_lossy().into_owned(),
        |pg| pg.url.clone(),
    );
    let mut browser = Command::new("python3");
    browser
        .arg(agents_dir().join("ui_browser.py"))
        .arg(&ui.url)
        .env("CHROMIUM", &chromium)
        .env("DURUN_BIN", assert_cmd::cargo::cargo_bin("durun"))
        .env("DURUN_JOURNAL", &journal)
        .env("UI_AGENT", &agent)
        .env("PATH", path_with_durun())
        .current_dir(env.dir.path());
    if let Ok(dir) = std::env::var("DURUN_UI_SCREENSHOTS") {
        // Relative to the repository, as `cargo test` runs in it.
        browser.env(
            "DURUN_UI_SCREENSHOTS",
            std::path::absolute(dir).expect("a directory"),
        );
    }
    let output = browser.output().expect("run the browser test");
    assert!(
        output.status.success(),
        "the browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The button's approval reached the journal, from the page's operator.
    let signals = &env.inspect(evil)["task"]["signals"];
    assert_eq!(
        signals[0]["data"],
        serde_json::json!({"approved": true, "comment": "looks good"}),
        "{signals}"
    );
    assert_eq!(env.inspect("live-run")["task"]["status"], "completed");
}
