//! The examples run as the README says, crash and resume included.

use std::path::Path;

use crate::env::{text, TestEnv};

/// Copies `examples/NAME` into the test directory (examples write files).
fn copy_example(env: &TestEnv, name: &str) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    let target = env.path(name);
    std::fs::create_dir_all(&target).expect("example dir");
    for entry in std::fs::read_dir(&source).expect("example exists") {
        let entry = entry.expect("dir entry");
        if entry.file_type().expect("file type").is_file() {
            std::fs::copy(entry.path(), target.join(entry.file_name())).expect("copy");
        }
    }
    target
}

#[test]
fn quickstart_runs_and_survives_a_crash() {
    let env = TestEnv::new();
    let dir = copy_example(&env, "quickstart");
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
    assert!(!dir.join("report.md").exists());

    // Resumed from anywhere: the recorded directory and tools are used.
    let resumed = env.durun(&["resume", "demo"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let stderr = text(&resumed.stderr);
    assert!(
        stderr.contains("step 1 llm.plan: from the journal"),
        "{stderr}"
    );
    let report = std::fs::read_to_string(dir.join("report.md")).expect("the report was written");
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
    assert_eq!(view["task"]["output"]["report"]["path"], "report.md");
}
