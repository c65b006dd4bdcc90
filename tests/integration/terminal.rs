//! What a person sees: the line that says how to continue, the step a run
//! died in, a stop that reads as a stop, and the progress line below the
//! agent's own stderr on a terminal.

use std::time::Duration;

use serde_json::json;

use crate::env::{TestEnv, read_pid, sdk_path, signal, text, wait_exit, wait_for};

#[test]
fn an_interrupted_run_says_how_to_continue() {
    let env = TestEnv::new();
    let plan = json!({
        "pidfile": env.path("agent.pid"),
        "steps": [{"begin": "wait", "args": {}, "do": {"wait_for": env.path("never")}}],
    });
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "cut", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut durun = env.spawn(&args, "run");
    let pid = read_pid(&env.path("agent.pid"));
    signal(pid, libc::SIGKILL);
    assert_eq!(
        wait_exit(&mut durun, Duration::from_secs(30)).code(),
        Some(137)
    );
    let log = env.log("run");
    let last: Vec<&str> = log.lines().rev().take(2).collect();
    assert_eq!(last[0], "[durun] continue with `durun resume cut`", "{log}");
    assert!(
        last[1].starts_with("[durun] task cut interrupted (exit 137)"),
        "{log}"
    );
}

#[test]
fn the_step_a_run_died_in_shows_in_inspect() {
    let env = TestEnv::new();
    // A read step that runs for seconds (an LLM call): its row is written
    // as in flight once it has run a moment.
    let plan = json!({
        "pidfile": env.path("agent.pid"),
        "steps": [
            {"begin": "quick", "args": {}, "do": {"value": 1}},
            {"begin": "llm.long", "args": {"prompt": "p"}, "do": {"wait_for": env.path("done")}},
        ],
    });
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "long", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut durun = env.spawn(&args, "run");
    read_pid(&env.path("agent.pid"));
    wait_for("the long step's row", Duration::from_secs(30), || {
        env.inspect("long")["steps"]
            .as_array()
            .is_some_and(|steps| steps.len() == 2)
    });
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    let view = env.inspect("long");
    assert_eq!(view["task"]["status"], "interrupted");
    let step = &view["steps"][1];
    assert_eq!(
        (step["name"].as_str(), step["status"].as_str()),
        (Some("llm.long"), Some("pending"))
    );
    assert_eq!(step["attempts"], 1);
    let shown = text(&env.durun(&["inspect", "long"]).stdout);
    let row = shown
        .lines()
        .find(|line| line.contains("llm.long"))
        .expect("the step's row");
    assert!(row.contains("interrupted"), "{shown}");
    // A resume runs it as its second attempt.
    std::fs::write(env.path("done"), "").expect("done");
    let resumed = env.durun(&["resume", "long"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let step = env.inspect("long")["steps"][1].clone();
    assert_eq!(
        (step["status"].as_str(), step["attempts"].as_u64()),
        (Some("committed"), Some(2))
    );
}

#[test]
fn ctrl_c_on_an_sdk_agent_reads_as_a_stop() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.write(
        "agent.py",
        r#"
import os, time, durun
def think():
    open("started", "w").close()
    time.sleep(60)
durun.step("think", {}, think)
"#,
    );
    let mut command = env.command();
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let log = std::fs::File::create(env.path("run.err")).expect("log");
    let mut durun = command
        .args(["run", "--task", "stop", "--", "python3", "agent.py"])
        .stderr(log)
        .spawn()
        .expect("spawn");
    wait_for("the step to start", Duration::from_secs(30), || {
        env.path("started").exists()
    });
    // Ctrl-C at a terminal: SIGINT to the whole foreground group.
    // SAFETY: killpg has no memory-safety preconditions.
    unsafe {
        libc::killpg(durun.id() as i32, libc::SIGINT);
    }
    let status = wait_exit(&mut durun, Duration::from_secs(30));
    assert_eq!(status.code(), Some(130), "{}", env.log("run"));
    let stderr = env.log("run");
    assert!(!stderr.contains("Traceback"), "{stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|line| line.starts_with("durun: "))
            .collect::<Vec<_>>(),
        ["durun: the agent was stopped; `durun resume stop` continues the task"],
        "{stderr}"
    );
    assert_eq!(env.inspect("stop")["task"]["status"], "interrupted");
}

/// In a log (stderr not a terminal) the agent's stderr and durun's step
/// lines share one file: each of durun's lines is written whole, so none
/// cuts into a line of the agent's.
#[test]
fn durun_and_the_agent_share_stderr_line_by_line() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", sdk_path());
    env.write(
        "agent.py",
        r#"
import sys, threading
import durun

def chatter():
    for i in range(3000):
        sys.stderr.write(f"agent line {i:05d} " + "x" * 60 + "\n")

talker = threading.Thread(target=chatter)
talker.start()
for i in range(400):
    durun.step("step", {"i": i}, lambda: i)
talker.join()
"#,
    );
    let output = env.durun(&["run", "--task", "t", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    let whole = format!("{} ", "x".repeat(60));
    let agent_lines = stderr
        .lines()
        .filter(|line| line.starts_with("agent line ") && format!("{line} ").ends_with(&whole))
        .count();
    let step_lines = stderr
        .lines()
        .filter(|line| line.starts_with("[durun] step ") && line.contains(": committed in "))
        .count();
    assert_eq!(agent_lines, 3000, "an agent line was cut:\n{stderr}");
    assert_eq!(step_lines, 400, "a step line was cut:\n{stderr}");
}

/// A tool's error text and a signal's name reach the terminal escaped:
/// an OSC title or an SGR colour from a tool is shown, never obeyed.
#[test]
fn a_tools_error_text_and_a_signal_name_are_escaped() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        "[tools.evil]\neffect = \"read\"\nretries = 0\ncommand = [\"sh\", \"-c\", \"printf 'boom \\\\033]0;owned\\\\007 \\\\033[31mred' >&2; exit 1\"]\n",
    );
    let output = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "sh",
        "-c",
        "durun call evil; exit 0",
    ]);
    let stderr = text(&output.stderr);
    let line = stderr
        .lines()
        .find(|line| line.starts_with("durun: call evil failed"))
        .unwrap_or_else(|| panic!("no failure line: {stderr:?}"));
    assert!(!line.contains('\u{1b}'), "raw escape in {line:?}");
    assert!(line.contains("\\x1b]0;owned\\x07"), "{line:?}");
    let sent = env.durun(&["signal", "t", "n\u{1b}]0;X\u{7}"]);
    let stderr = text(&sent.stderr);
    assert!(!stderr.contains('\u{1b}'), "raw escape in {stderr:?}");
}

#[test]
fn control_characters_from_the_journal_never_reach_the_terminal() {
    let env = TestEnv::new();
    // An output, an error, a cwd and a command that would clear the screen
    // and set the window title if printed raw. A step name that would is
    // refused where it is made (SPEC 17).
    let cwd = env.path("dir\u{1b}[2J");
    std::fs::create_dir(&cwd).expect("dir");
    std::fs::copy(
        crate::env::agents_dir().join("probe.py"),
        cwd.join("probe.py"),
    )
    .expect("copy");
    std::fs::write(
        cwd.join("script.json"),
        json!([
            {"send": r#"{"op":"begin","id":5,"name":"clear\u001b[2J"}"#},
            {"send": r#"{"op":"begin","id":1,"name":"clear"}"#},
            {"send": r#"{"op":"commit","id":2,"step":1,"output":"title\u001b]0;pwned\u0007\u009b31m"}"#},
            {"send": r#"{"op":"begin","id":3,"name":"fails"}"#},
            {"send": r#"{"op":"fail","id":4,"step":2,"error":"boom\u001b[31m red"}"#},
        ])
        .to_string(),
    )
    .expect("script");
    let output = env
        .command()
        .current_dir(&cwd)
        .args([
            "run",
            "--task",
            "esc",
            "--",
            "python3",
            "probe.py",
            "script.json",
            "answers",
            "\u{1b}]0;argv\u{7}",
        ])
        .output()
        .expect("run");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let answers = crate::env::read_json_lines(&cwd.join("answers"));
    assert_eq!(answers[0]["error"]["code"], "bad_request", "{answers:?}");
    assert!(
        answers[0]["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("control character")),
        "{answers:?}"
    );
    let mut shown = output.stderr.clone();
    for args in [
        vec!["inspect"],
        vec!["inspect", "esc"],
        vec!["inspect", "esc", "--step", "1"],
        vec!["inspect", "esc", "--step", "2"],
        vec!["inspect", "esc", "--follow"],
        vec!["inspect", "\u{1b}[2Jno-such-task"],
        vec!["cancel", "\u{1b}[2Jno-such-task"],
    ] {
        let output = env.durun(&args);
        shown.extend(&output.stdout);
        shown.extend(&output.stderr);
    }
    let text = String::from_utf8_lossy(&shown);
    assert!(
        !text.contains(['\u{1b}', '\u{7}', '\u{9b}']),
        "a control character reached the terminal:\n{text}"
    );
    assert!(text.contains("boom\\x1b[31m red"), "{text}");
    assert!(text.contains("dir\\x1b[2J"), "{text}");
}
