//! The examples run as the README says, crash and resume included.

use std::path::Path;

use crate::env::{TestEnv, path_with_durun, sdk_path, text};

/// Copies `examples/NAME` into the test directory, only the files the
/// repository holds: nothing a run of the example left behind.
fn copy_example(env: &TestEnv, name: &str) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = root.join("examples").join(name);
    let tracked = std::process::Command::new("git")
        .args(["ls-files", "--", "."])
        .current_dir(&source)
        .output()
        .ok()
        .filter(|output| output.status.success() && !output.stdout.is_empty())
        .map(|output| {
            text(&output.stdout)
                .lines()
                .map(str::to_owned)
                .collect::<Vec<String>>()
        });
    let target = env.path(name);
    std::fs::create_dir_all(&target).expect("example dir");
    for entry in std::fs::read_dir(&source).expect("example exists") {
        let entry = entry.expect("dir entry");
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let in_repo = tracked
            .as_ref()
            .is_none_or(|files| files.contains(&file_name));
        if entry.file_type().expect("file type").is_file() && in_repo {
            std::fs::copy(entry.path(), target.join(entry.file_name())).expect("copy");
        }
    }
    target
}

/// `durun test` on the example `name`, as the README's quick start ends:
/// every trial holds.
fn passes_durun_test(env: &TestEnv, name: &str, agent: &[&str]) -> serde_json::Value {
    // The Node example imports the SDK by its place in the repository.
    let dir = if name == "node-agent" {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name)
    } else {
        copy_example(env, name)
    };
    let output = env
        .command()
        .current_dir(&dir)
        .args(["test", "--json", "--jobs", "2", "--"])
        .args(agent)
        .output()
        .expect("durun test");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("no JSON: {}", text(&output.stderr)));
    assert_eq!(output.status.code(), Some(0), "{report:#}");
    let trials = report["trials"].as_array().expect("trials");
    // Three kill points at each of the reference's steps.
    assert_eq!(
        trials.len(),
        3 * report["reference"]["steps"].as_u64().expect("steps") as usize
    );
    // Held, each; a `during` point a quick step never reached shows
    // nothing either way.
    assert!(
        trials
            .iter()
            .all(|trial| trial["ok"] == true || trial["reached"] == false),
        "{report:#}"
    );
    assert!(trials.iter().any(|trial| trial["ok"] == true), "{report:#}");
    report
}

#[test]
fn quickstart_runs_and_survives_a_crash() {
    let env = TestEnv::new();
    let dir = copy_example(&env, "quickstart");
    let reports = env.path("reports");
    std::fs::create_dir(&reports).expect("reports dir");
    let report_path = reports.join("durun-report-demo.md");
    let mut env = env;
    env.set("REPORT_DIR", reports.to_string_lossy());
    let first = env
        .command()
        .current_dir(&dir)
        .env("CRASH_IN", "llm.summarize")
        .args(["run", "--task", "demo", "--", "python3", "agent.py"])
        .output()
        .expect("durun");
    assert_eq!(
        first.status.code(),
        Some(128 + libc::SIGKILL),
        "{}",
        text(&first.stderr)
    );
    assert!(!report_path.exists());

    // Resumed from anywhere: the recorded directory and tools are used.
    let resumed = env.durun(&["resume", "demo"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let stderr = text(&resumed.stderr);
    assert!(
        stderr.contains("step 1 llm.plan: from the journal"),
        "{stderr}"
    );
    let report = std::fs::read_to_string(&report_path).expect("the report was written");
    assert!(report.starts_with("# Report"));

    let view = env.inspect("demo");
    assert_eq!(view["task"]["status"], "completed");
    let run2 = &view["task"]["runs"][1];
    // The plan, the listing and a word count per file replayed; the summary
    // (where it died) and the report ran.
    let steps = view["steps"].as_array().expect("steps").len() as u64;
    assert_eq!(run2["replayed_steps"], steps - 2);
    assert_eq!(run2["executed_steps"], 2);
    assert_eq!(run2["tokens_saved"], view["steps"][0]["tokens"]);
    assert_eq!(
        view["task"]["output"]["report"]["path"],
        report_path.to_string_lossy().as_ref()
    );
    // The example wrote nothing into its own folder.
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    files.sort();
    assert_eq!(files, ["agent.py", "durun.toml", "write_report.py"]);
    let _ = passes_durun_test(&env, "quickstart", &["python3", "agent.py"]);
}

/// `examples/fake_services.py` on a free port, stopped when dropped.
struct FakeServices {
    child: std::process::Child,
    port: u16,
}

impl FakeServices {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fake_services.py");
        let child = std::process::Command::new("python3")
            .arg(script)
            .env("FAKE_PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start the fake services");
        let services = Self { child, port };
        crate::env::wait_for(
            "the fake services",
            std::time::Duration::from_secs(20),
            || services.stats().is_some(),
        );
        services
    }

    fn stats(&self) -> Option<serde_json::Value> {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .write_all(b"GET /stats HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        serde_json::from_str(response.split("\r\n\r\n").nth(1)?).ok()
    }
}

impl Drop for FakeServices {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `examples/NAME` as task `task` with `CRASH_IN` set, so that it
/// dies with SIGKILL inside that step, then resumes it.
/// Runs the example `name` until it crashes in `crash_in` (with `first`
/// in the first run's environment alone), then resumes it.
fn crash_and_resume(
    env: &TestEnv,
    (name, task, crash_in): (&str, &str, &str),
    first: &[(&str, String)],
    agent: &[&str],
) {
    let dir = copy_example(env, name);
    let first = env
        .command()
        .current_dir(&dir)
        .envs(first.iter().map(|(name, value)| (*name, value)))
        .env("CRASH_IN", crash_in)
        .args(["run", "--task", task, "--"])
        .args(agent)
        .output()
        .expect("durun");
    assert_eq!(
        first.status.code(),
        Some(128 + libc::SIGKILL),
        "{}",
        text(&first.stderr)
    );
    let resumed = env.durun(&["resume", task]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
}

#[test]
fn the_python_agent_example_opens_one_pull_request_across_a_crash() {
    let services = FakeServices::start();
    let mut env = TestEnv::new();
    env.set("FAKE_PORT", services.port.to_string());
    env.set("PYTHONPATH", sdk_path());
    crash_and_resume(
        &env,
        ("python-agent", "py", "research"),
        &[],
        &["python3", "agent.py"],
    );
    let stats = services.stats().expect("stats");
    assert_eq!(
        stats["llm_calls"], 2,
        "the plan was replayed, not asked again"
    );
    assert_eq!(stats["pulls"], 1);
    assert_eq!(stats["notifications"], 1);
    let view = env.inspect("py");
    assert_eq!(
        view["task"]["output"]["pull"],
        "https://git.example/pulls/1"
    );
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 1);
    assert!(
        view["task"]["runs"][1]["tokens_saved"]
            .as_u64()
            .expect("tokens")
            > 800
    );
    let _ = passes_durun_test(&env, "python-agent", &["python3", "agent.py"]);
}

#[test]
fn the_shell_agent_example_publishes_once_across_a_crash() {
    let services = FakeServices::start();
    let mut env = TestEnv::new();
    env.set("FAKE_PORT", services.port.to_string());
    env.set("PATH", path_with_durun());
    crash_and_resume(
        &env,
        ("shell-agent", "sh", "draft"),
        &[],
        &["bash", "agent.sh"],
    );
    let stats = services.stats().expect("stats");
    assert_eq!(stats["llm_calls"], 2, "the plan came from the journal");
    assert_eq!(stats["notifications"], 1);
    let view = env.inspect("sh");
    assert_eq!(view["steps"].as_array().expect("steps").len(), 3);
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 1);
    assert!(
        view["task"]["runs"][1]["tokens_saved"]
            .as_u64()
            .expect("tokens")
            > 0,
        "the model step reports its usage"
    );
    let _ = passes_durun_test(&env, "shell-agent", &["bash", "agent.sh"]);
}

#[test]
fn the_node_agent_example_holds_under_durun_test() {
    let services = FakeServices::start();
    let mut env = TestEnv::new();
    env.set("FAKE_PORT", services.port.to_string());
    let report = passes_durun_test(&env, "node-agent", &["node", "agent.mjs"]);
    // The trials' model calls came from the reference: the services saw
    // the reference's calls alone, one per model step.
    let stats = services.stats().expect("stats");
    assert_eq!(stats["llm_calls"], 4, "{stats}");
    assert_eq!(report["reference"]["steps"], 8);
}

#[test]
fn the_zero_code_example_opens_one_pull_request_across_a_crash() {
    if !crate::env::python_has(
        "agents.mcp, mcp.server.fastmcp",
        "DURUN_TEST_MCP",
        "openai-agents 'mcp<2'",
    ) {
        return;
    }
    let services = FakeServices::start();
    let mut env = TestEnv::new();
    env.set("FAKE_PORT", services.port.to_string());
    env.set("OPENAI_API_KEY", "demo");
    env.set("PATH", path_with_durun());
    // The upstream is in the run's environment alone: the resume, as from
    // another shell, sends the model calls where the run did (SPEC 18).
    crash_and_resume(
        &env,
        ("zero-code", "zc", "open_pull"),
        &[(
            "OPENAI_BASE_URL",
            format!("http://127.0.0.1:{}/v1", services.port),
        )],
        &["python3", "agent.py"],
    );
    let stats = services.stats().expect("stats");
    assert_eq!(
        stats["pulls"], 1,
        "one pull request across the crash: {stats}"
    );
    assert_eq!(
        stats["llm_calls"], 3,
        "two model turns replayed, only the last one new: {stats}"
    );
    let keys = stats["keys"].as_object().expect("keys");
    assert_eq!(keys.len(), 1, "{stats}");
    assert_eq!(
        keys.values().next(),
        Some(&serde_json::json!(2)),
        "the same key twice"
    );
    let view = env.inspect("zc");
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 3);
    let kinds: Vec<&str> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["proxy", "mcp", "proxy", "mcp", "proxy"]);
    env.set(
        "OPENAI_BASE_URL",
        format!("http://127.0.0.1:{}/v1", services.port),
    );
    let _ = passes_durun_test(&env, "zero-code", &["python3", "agent.py"]);
}
