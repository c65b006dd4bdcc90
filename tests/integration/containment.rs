//! SPEC 17: every process an agent starts belongs to its run. Agents here
//! start grandchildren that leave their process group and session
//! (`setsid`), double-fork so that their parent is gone, and go through a
//! `node` launcher that starts a detached native binary; then the run ends,
//! or durun is killed with SIGKILL.

use std::time::{Duration, Instant};

use crate::env::{TestEnv, process_gone, read_pid, text, wait_exit, wait_for};

/// How long SPEC 17 gives the run's processes once it has ended.
pub(crate) const GONE_WITHIN: Duration = Duration::from_secs(1);

/// An agent that starts three escaping grandchildren, writes their pids
/// and its own, then either exits 0 (`exit`) or sleeps until killed.
const ESCAPING_AGENT: &str = r#"#!/bin/sh
set -e
echo $$ > agent.pid
# A new session and process group, its parent still alive.
setsid sh -c 'sleep 300 & echo $! > setsid.pid; wait' &
# A double fork: the sleep's parent exits at once.
sh -c '(sleep 301 & echo $! > orphan.pid) &'
# A launcher: node starts a detached native binary and exits.
node -e "const c = require('child_process').spawn('sleep', ['302'], {detached: true, stdio: 'ignore'}); require('fs').writeFileSync('launched.pid', String(c.pid)); c.unref();"
while [ ! -s setsid.pid ] || [ ! -s orphan.pid ] || [ ! -s launched.pid ]; do sleep 0.01; done
touch ready
if [ "$1" = exit ]; then exit 0; fi
sleep 600
"#;

const ESCAPEES: [&str; 3] = ["setsid.pid", "orphan.pid", "launched.pid"];

fn escaping_agent(env: &TestEnv) {
    let path = env.write("escape.sh", ESCAPING_AGENT);
    let mut permissions = std::fs::metadata(&path).expect("agent").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).expect("chmod");
}

/// Waits at most `within` for every one of `pids` to be gone, and says
/// which were still alive.
pub(crate) fn all_gone(pids: &[i32], within: Duration) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|&pid| !process_gone(pid))
            .collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn escapee_pids(env: &TestEnv) -> Vec<i32> {
    ESCAPEES
        .iter()
        .map(|name| read_pid(&env.path(name)))
        .collect()
}

/// Ends the processes a failed assertion left behind.
pub(crate) fn cleanup(pids: &[i32]) {
    for &pid in pids {
        crate::env::signal(pid, libc::SIGKILL);
    }
}

#[test]
fn what_an_agent_leaves_running_ends_with_its_run() {
    let env = TestEnv::new();
    escaping_agent(&env);
    let output = env.durun(&["run", "-q", "--task", "leaves", "--", "./escape.sh", "exit"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let pids = escapee_pids(&env);
    let alive = all_gone(&pids, GONE_WITHIN);
    cleanup(&alive);
    assert!(
        alive.is_empty(),
        "{alive:?} of {pids:?} outlived their run by {GONE_WITHIN:?}"
    );
    assert_eq!(env.inspect("leaves")["task"]["status"], "completed");
}

#[test]
fn nothing_an_agent_started_outlives_durun_killed_with_sigkill() {
    let env = TestEnv::new();
    escaping_agent(&env);
    let mut durun = env.spawn(
        &["run", "-q", "--task", "killed", "--", "./escape.sh"],
        "killed",
    );
    let ready = env.path("ready");
    wait_for("the agent's grandchildren", Duration::from_secs(30), || {
        ready.exists()
    });
    let mut pids = escapee_pids(&env);
    pids.push(read_pid(&env.path("agent.pid")));
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap durun");
    let alive = all_gone(&pids, GONE_WITHIN);
    cleanup(&alive);
    assert!(
        alive.is_empty(),
        "{alive:?} of {pids:?} outlived a SIGKILLed durun by {GONE_WITHIN:?}"
    );
    // The task is left as a crash leaves it: resumable.
    assert_eq!(env.inspect("killed")["task"]["status"], "interrupted");
}

/// The keeper starts the agent without copying itself (a vfork), and the
/// agent still dies with it: a `kill -9` of the keeper alone ends the agent
/// (its parent-death signal), and durun ends the run.
#[test]
fn an_agent_dies_with_its_keeper_killed_alone() {
    let env = TestEnv::new();
    env.write("agent.sh", "echo $$ > agent.pid\nexec sleep 600\n");
    let mut durun = env.spawn(
        &["run", "-q", "--task", "orphan", "--", "sh", "agent.sh"],
        "orphan",
    );
    let agent = read_pid(&env.path("agent.pid"));
    let stat = std::fs::read_to_string(format!("/proc/{agent}/stat")).expect("the agent's stat");
    let keeper: i32 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        .expect("the agent's parent");
    let comm = std::fs::read_to_string(format!("/proc/{keeper}/comm")).expect("the keeper's comm");
    assert_eq!(comm.trim(), "durun-keeper", "the agent's parent");
    crate::env::signal(keeper, libc::SIGKILL);
    let alive = all_gone(&[agent], GONE_WITHIN);
    cleanup(&alive);
    assert!(
        alive.is_empty(),
        "the agent outlived its killed keeper by {GONE_WITHIN:?}"
    );
    wait_exit(&mut durun, Duration::from_secs(30));
}

#[test]
fn a_kill_of_durun_and_its_agent_together_still_ends_the_grandchildren() {
    // `kill -9 -PGID` (a CI runner cancelling a job) takes durun and the
    // agent at once; the keeper, in a group of its own, is left to end the
    // rest.
    let env = TestEnv::new();
    escaping_agent(&env);
    let mut command = env.command();
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let stderr = std::fs::File::create(env.path("group.err")).expect("log");
    let mut durun = command
        .args(["run", "-q", "--task", "group", "--", "./escape.sh"])
        .stderr(stderr)
        .spawn()
        .expect("durun");
    let ready = env.path("ready");
    wait_for("the agent's grandchildren", Duration::from_secs(30), || {
        ready.exists()
    });
    let mut pids = escapee_pids(&env);
    pids.push(read_pid(&env.path("agent.pid")));
    let group = i32::try_from(durun.id()).expect("a pid");
    crate::env::signal(-group, libc::SIGKILL);
    let status = wait_exit(&mut durun, Duration::from_secs(10));
    assert_eq!(status.code(), None, "killed: {status:?}");
    let alive = all_gone(&pids, GONE_WITHIN);
    cleanup(&alive);
    assert!(
        alive.is_empty(),
        "{alive:?} of {pids:?} outlived a killed process group by {GONE_WITHIN:?}"
    );
}

/// A command that starts a grandchild in a session of its own, writes its
/// pid to `file`, then runs `rest`.
fn escaping(file: &str, rest: &str) -> String {
    format!(
        "setsid sh -c 'sleep 303 & echo $! > {file}; wait' & while [ ! -s {file} ]; do sleep 0.01; done; {rest}"
    )
}

#[test]
fn what_a_tool_leaves_running_ends_with_its_step() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!(
            "[tools.leaves]\neffect = \"read\"\ncommand = [\"sh\", \"-c\", \"{}\"]\n",
            escaping("tool-kid.pid", "echo done")
        ),
    );
    let script = serde_json::json!([{"send": r#"{"op":"call","id":1,"tool":"leaves"}"#}]);
    let (output, answers) = env.probe("tool", &script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(answers[0]["output"], "done\n", "{answers:?}");
    let pid = read_pid(&env.path("tool-kid.pid"));
    let alive = all_gone(&[pid], GONE_WITHIN);
    cleanup(&alive);
    assert!(
        alive.is_empty(),
        "the tool's grandchild {pid} outlived its step"
    );
}

#[test]
fn nothing_a_tool_or_an_mcp_server_started_outlives_durun_killed_with_sigkill() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!(
            "[tools.hangs]\neffect = \"read\"\ncommand = [\"sh\", \"-c\", \"{}\"]\n",
            escaping("tool-kid.pid", "sleep 300")
        ),
    );
    let script = env.write(
        "tool.json",
        r#"[{"send": "{\"op\":\"call\",\"id\":1,\"tool\":\"hangs\"}"}]"#,
    );
    let mut durun = env
        .command()
        .args(["run", "-q", "--task", "tool", "--", "python3"])
        .arg(crate::env::agents_dir().join("probe.py"))
        .arg(&script)
        .arg(env.path("tool.answers"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("durun");
    let tool_kid = read_pid(&env.path("tool-kid.pid"));
    // `durun mcp` in front of a server that starts an escaping grandchild.
    let mut mcp = env
        .command()
        .args(["mcp", "--name", "escapes", "--", "sh", "-c"])
        .arg(escaping("mcp-kid.pid", "exec cat"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("durun mcp");
    let mcp_kid = read_pid(&env.path("mcp-kid.pid"));
    for child in [&mut durun, &mut mcp] {
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }
    let pids = [tool_kid, mcp_kid];
    let alive = all_gone(&pids, GONE_WITHIN);
    cleanup(&alive);
    assert!(
        alive.is_empty(),
        "{alive:?} of {pids:?} (a tool's, an MCP server's) outlived a SIGKILLed durun"
    );
}

/// The pids the escapees in `dir` wrote.
pub(crate) fn escapees_in(dir: &std::path::Path) -> Vec<i32> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| !entry.file_name().to_string_lossy().ends_with(".tmp"))
        .filter_map(|entry| {
            std::fs::read_to_string(entry.path())
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .collect()
}

/// SPEC 17's torture of containment: a runner (`durun run`), a worker or
/// `durun mcp` is killed with SIGKILL at a random moment while its agent,
/// the agent's tool and an MCP server start grandchildren that try to
/// outlive them; none may be alive 1 s later. Twelve kills in `cargo
/// test`; `DURUN_CONTAINMENT_KILLS=1000` for the figure in
/// docs/reliability.md.
#[test]
fn grandchildren_never_outlive_a_runner_a_worker_or_durun_mcp_killed_at_random() {
    let kills: u64 = std::env::var("DURUN_CONTAINMENT_KILLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12);
    let mut rng = crate::torture::Rng(0xC0_47A1 | 1);
    let (mut seen, mut kinds) = (0, [0u64; 3]);
    for round in 0..kills {
        let mut env = TestEnv::new();
        env.set("PATH", crate::env::path_with_durun());
        let dir = env.path("escapees");
        std::fs::create_dir(&dir).expect("dir");
        std::fs::copy(
            crate::env::agents_dir().join("escape.sh"),
            env.path("escape.sh"),
        )
        .expect("escape.sh");
        env.write(
            "agent.sh",
            "sh escape.sh \"$PWD/escapees\"\ndurun step tool -- sh -c 'sh escape.sh \"$PWD/escapees\"; sleep 30'\n",
        );
        env.write("server.sh", "sh escape.sh \"$PWD/escapees\"\nexec cat\n");
        let kind = rng.below(3);
        kinds[kind as usize] += 1;
        let mut victim = match kind {
            0 => env.spawn(&["-q", "run", "--", "sh", "agent.sh"], "victim"),
            1 => {
                let submitted = env.durun(&["-q", "submit", "--", "sh", "agent.sh"]);
                assert!(submitted.status.success(), "{}", text(&submitted.stderr));
                env.spawn(&["-q", "worker"], "victim")
            }
            _ => env
                .command()
                .args(["mcp", "--", "sh", "server.sh"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("durun mcp"),
        };
        std::thread::sleep(Duration::from_millis(rng.below(400)));
        victim.kill().expect("SIGKILL");
        victim.wait().expect("reap");
        // Let a pid file being written land: its process is then ended by
        // its keeper, or was never alive.
        std::thread::sleep(Duration::from_millis(20));
        let pids = escapees_in(&dir);
        seen += pids.len();
        let alive = all_gone(&pids, GONE_WITHIN);
        cleanup(&alive);
        assert!(
            alive.is_empty(),
            "round {round} (victim kind {kind}): {alive:?} of {pids:?} outlived the kill by {GONE_WITHIN:?}"
        );
    }
    eprintln!(
        "containment: {kills} kills (runner {}, worker {}, durun mcp {}), {seen} escaping grandchildren, none alive 1 s later",
        kinds[0], kinds[1], kinds[2]
    );
}

/// The pid of `parent`'s child whose name is `name`, if any.
fn child_named(parent: u32, name: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent && comm == name).then_some(pid)
        })
}

/// A package upgrade removes durun's binary under a live worker. Its
/// agents' keepers come from the nursery, forked at the worker's start, so
/// the worker runs on; once the nursery and its spare keeper are gone too
/// (killed here), a keeper
/// must be exec'd from the binary, and the worker says that it is missing,
/// not that the agent is.
#[test]
fn a_worker_whose_binary_was_removed_runs_on_then_says_so_not_that_the_agent_is_missing() {
    let env = TestEnv::new();
    escaping_agent(&env);
    let copy = env.path("durun-copy");
    std::fs::copy(assert_cmd::cargo::cargo_bin("durun"), &copy).expect("copy");
    let journal = env.path("removed.db");
    let log = std::fs::File::create(env.path("worker.err")).expect("log");
    let mut worker = std::process::Command::new(&copy)
        .env_clear()
        .env("PATH", crate::env::path_with_durun())
        .env("HOME", env.path(""))
        .env("DURUN_JOURNAL", &journal)
        .arg("worker")
        .current_dir(env.path(""))
        .stdin(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("worker");
    let worker_log = || std::fs::read_to_string(env.path("worker.err")).unwrap_or_default();
    wait_for("the worker to start", Duration::from_secs(30), || {
        worker_log().contains("takes tasks")
    });
    std::fs::remove_file(&copy).expect("remove the worker's binary");
    let submit = |task: &str, argv: &[&str]| {
        let submitted = env
            .command()
            .env("DURUN_JOURNAL", &journal)
            .args(["-q", "submit", "--task", task, "--"])
            .args(argv)
            .output()
            .expect("submit");
        assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    };
    // From the nursery: the task runs, and what its agent left behind
    // still ends with it.
    submit("kept", &["./escape.sh", "exit"]);
    wait_for("the first task to end", Duration::from_secs(30), || {
        worker_log().contains("task kept ")
    });
    assert!(
        worker_log().contains("task kept completed"),
        "{}",
        worker_log()
    );
    let escapees = escapee_pids(&env);
    let alive = all_gone(&escapees, GONE_WITHIN);
    cleanup(&alive);
    assert!(alive.is_empty(), "{alive:?} outlived the run");

    // The nursery, and the spare keeper it made for the next request.
    let nursery = child_named(worker.id(), "durun-nursery").expect("the worker's nursery");
    wait_for("the spare keeper", Duration::from_secs(10), || {
        child_named(worker.id(), "durun-keeper").is_some()
    });
    let spare = child_named(worker.id(), "durun-keeper").expect("the spare keeper");
    crate::env::signal(nursery, libc::SIGKILL);
    crate::env::signal(spare, libc::SIGKILL);
    submit("orphaned", &["true"]);
    wait_for("the second task to end", Duration::from_secs(30), || {
        worker_log().contains("task orphaned ")
    });
    crate::env::signal(i32::try_from(worker.id()).expect("pid"), libc::SIGTERM);
    wait_exit(&mut worker, Duration::from_secs(30));
    let log = worker_log();
    assert!(
        log.contains("cannot start durun's own binary") && log.contains("was removed or replaced"),
        "{log}"
    );
    assert!(!log.contains("check the command"), "{log}");
}
