//! The agent as a process under `durun run`: the signals it starts with
//! and is sent, its stdin, a stuck reader of durun's stdout, and the
//! socket directories that killed runs leave behind.

use crate::env::{TestEnv, text};

#[test]
fn sigint_reaches_the_agent_and_leaves_the_task_resumable() {
    let env = TestEnv::new();
    let agent = r#"
import json, os, sys, time
sys.stdout.write(json.dumps({"op": "begin", "id": 1, "name": "work", "args": {}}) + "\n")
sys.stdout.flush()
answer = json.loads(sys.stdin.readline())
if not answer["replayed"]:
    try:
        open("started", "w").write(str(os.getpid()))
        time.sleep(60)
    except KeyboardInterrupt:
        open("interrupted", "w").write("yes")
        sys.exit(130)
    sys.stdout.write(json.dumps({"op": "commit", "id": 2, "step": 1, "output": "done"}) + "\n")
    sys.stdout.flush()
    sys.stdin.readline()
"#;
    env.write("agent.py", agent);
    let mut durun = env.spawn(&["run", "--task", "i", "--", "python3", "agent.py"], "run");
    crate::env::wait_for(
        "the agent to start",
        std::time::Duration::from_secs(30),
        || env.path("started").exists(),
    );
    crate::env::signal(durun.id() as i32, libc::SIGINT);
    let status = durun.wait().expect("durun");
    assert_eq!(status.code(), Some(130), "{}", env.log("run"));
    assert!(env.path("interrupted").exists(), "the agent got SIGINT");
    assert_eq!(env.inspect("i")["task"]["status"], "interrupted");
}

#[test]
fn a_stuck_reader_of_durun_stdout_holds_up_the_agent_not_durun() {
    let env = TestEnv::new();
    // The agent prints without end; nobody reads durun's stdout, so its
    // pipe fills, then durun's copy queue, then the agent's own pipe.
    env.write(
        "agent.py",
        r#"
import sys
open("started", "w").close()
line = "x" * 1000 + "\n"
while True:
    sys.stdout.write(line)
"#,
    );
    let mut durun = env
        .command()
        .args(["run", "--task", "flood", "--", "python3", "agent.py"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn durun");
    crate::env::wait_for(
        "the agent to start",
        std::time::Duration::from_secs(30),
        || env.path("started").exists(),
    );
    // Nobody reads: durun's stdout pipe fills up (64 KiB, less what one
    // atomic write of up to 4 KiB no longer fits in).
    let stdout = durun.stdout.take().expect("stdout");
    crate::env::wait_for(
        "durun's stdout to fill",
        std::time::Duration::from_secs(30),
        || rustix::io::ioctl_fionread(&stdout).is_ok_and(|unread| unread > 65536 - 4096),
    );
    // durun still serves signals: SIGTERM reaches the agent and the run ends.
    crate::env::signal(durun.id() as i32, libc::SIGTERM);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = durun.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = durun.kill();
            panic!("durun did not end the run after SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(143));
    assert_eq!(env.inspect("flood")["task"]["status"], "interrupted");
}

#[test]
fn socket_directories_of_killed_runs_are_swept() {
    let env = TestEnv::new();
    let tmp = env.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let run = |args: &[&str]| {
        env.command()
            .env("TMPDIR", &tmp)
            .env_remove("XDG_RUNTIME_DIR")
            .args(args)
            // Not the test's output: the runs' task ids.
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("durun")
    };
    // A run killed with SIGKILL leaves its directory behind.
    let mut killed = run(&["run", "-q", "--", "sleep", "30"]);
    crate::env::wait_for(
        "the socket directory",
        std::time::Duration::from_secs(20),
        || std::fs::read_dir(&tmp).is_ok_and(|mut dir| dir.next().is_some()),
    );
    killed.kill().expect("SIGKILL");
    killed.wait().expect("reap");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("tmp")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    // The next run removes it (and keeps its own until it ends).
    let mut next = run(&["run", "-q", "--", "sleep", "1"]);
    crate::env::wait_for("the sweep", std::time::Duration::from_secs(20), || {
        !left[0].exists()
    });
    assert!(next.wait().expect("the run").success());
    assert_eq!(std::fs::read_dir(&tmp).expect("tmp").count(), 0);
}

/// The agent starts as `std::process::Command` starts a child: a signal
/// ignored by whoever started durun stays ignored (`trap '' QUIT`),
/// SIGPIPE is back to its default, and no signal is blocked.
#[test]
fn the_agent_starts_with_the_signals_a_child_should_have() {
    use std::os::unix::process::CommandExt as _;
    let env = TestEnv::new();
    let mut command = env.command();
    command.args([
        "run",
        "-q",
        "--",
        "sh",
        "-c",
        "grep -E '^Sig(Ign|Blk):' /proc/self/status",
    ]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
            libc::signal(libc::SIGUSR1, libc::SIG_IGN);
            let mut blocked: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut blocked);
            libc::sigaddset(&raw mut blocked, libc::SIGUSR2);
            libc::sigprocmask(libc::SIG_BLOCK, &raw const blocked, std::ptr::null_mut());
            Ok(())
        });
    }
    let output = command.output().expect("durun");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let mask = |name: &str| {
        let line = stdout
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {stdout}"));
        u64::from_str_radix(line.split_whitespace().nth(1).expect("a mask"), 16).expect("hex")
    };
    let bit = |signal: i32| 1u64 << (signal - 1);
    let ignored = mask("SigIgn:");
    assert_ne!(ignored & bit(libc::SIGQUIT), 0, "SIGQUIT ignored: {stdout}");
    assert_ne!(ignored & bit(libc::SIGUSR1), 0, "SIGUSR1 ignored: {stdout}");
    assert_eq!(
        ignored & bit(libc::SIGPIPE),
        0,
        "SIGPIPE at its default: {stdout}"
    );
    assert_eq!(mask("SigBlk:"), 0, "nothing blocked: {stdout}");
}

/// SPEC 17: an agent that reads its stdin to the end (as `codex exec`
/// does) hangs on durun's answer pipe; `--stdin null` and `--stdin inherit`
/// give it /dev/null or durun's own stdin, and it speaks the protocol over
/// DURUN_SOCKET (here through `durun step`).
#[test]
fn an_agent_that_reads_its_stdin_gets_dev_null_or_duruns_own() {
    use std::io::Write as _;
    let mut env = TestEnv::new();
    env.set("PATH", crate::env::path_with_durun());
    env.write(
        "agent.sh",
        "got=$(cat)\ndurun step greet -- echo \"hello $got\"\necho \"agent saw [$got]\"\n",
    );
    let output = env.durun(&[
        "run", "-q", "--task", "null", "--stdin", "null", "--", "sh", "agent.sh",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "hello \nagent saw []\n");
    let mut durun = env
        .command()
        .args([
            "run", "-q", "--task", "inherit", "--stdin", "inherit", "--", "sh", "agent.sh",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("durun");
    durun
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"from the pipe")
        .expect("write");
    let output = durun.wait_with_output().expect("durun");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout),
        "hello from the pipe\nagent saw [from the pipe]\n"
    );
    for task in ["null", "inherit"] {
        let view = env.inspect(task);
        assert_eq!(view["steps"][0]["name"], "greet", "{view}");
        assert_eq!(view["task"]["status"], "completed", "{view}");
    }
    // Set in durun.toml, it holds for every run of the task: the resume
    // of a crashed run reads /dev/null too.
    env.write("durun.toml", "[agent]\nstdin = \"null\"\n");
    env.write(
        "crash.sh",
        "cat > /dev/null\ndurun step once -- echo ran\ntest -e crashed || { touch crashed; kill -9 $DURUN_PID; }\n",
    );
    let first = env.durun(&["run", "-q", "--task", "toml", "--", "sh", "crash.sh"]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&first.status),
        Some(libc::SIGKILL),
        "{}",
        text(&first.stderr)
    );
    std::fs::remove_file(env.path("durun.toml")).expect("the config is the task's now");
    let resumed = env.durun(&["resume", "-q", "toml"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(env.inspect("toml")["task"]["status"], "completed");
}

/// SPEC 17: the `--stdin` a task's `run` chose holds for every resume,
/// in a shell or on a worker that does not say it again. (Given
/// protocol's pipe instead, this agent's `cat` would wait for ever.)
#[test]
fn the_stdin_a_run_chose_is_its_resumes_stdin() {
    let mut env = TestEnv::new();
    env.set("PATH", crate::env::path_with_durun());
    env.write(
        "crash.sh",
        "cat > /dev/null\ndurun step once -- echo ran\ntest -e crashed || { touch crashed; kill -9 $DURUN_PID; }\n",
    );
    let first = env.durun(&[
        "run", "-q", "--task", "t", "--stdin", "null", "--", "sh", "crash.sh",
    ]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&first.status),
        Some(libc::SIGKILL),
        "{}",
        text(&first.stderr)
    );
    let mut resumed = env
        .command()
        .args(["resume", "-q", "t"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("durun");
    let status = crate::env::wait_exit(&mut resumed, std::time::Duration::from_secs(30));
    assert!(status.success(), "{status}");
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed", "{view}");
    assert_eq!(view["steps"][0]["name"], "once", "{view}");
}
