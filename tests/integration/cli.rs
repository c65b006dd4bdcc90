//! The command line itself: help, usage errors, completions, man pages.

use std::path::Path;

use crate::env::{TestEnv, text};

#[test]
fn committed_completions_and_man_pages_are_current() {
    let env = TestEnv::new();
    let out = env.path("generated");
    let output = env.durun(&["generate", "--out", out.to_str().expect("utf-8 path")]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let hint = "run `cargo run -- generate --out .` and commit the result";
    for dir in ["completions", "man"] {
        let generated = names(&out.join(dir));
        assert_eq!(
            names(&root.join(dir)),
            generated,
            "{dir}/ has other files than durun makes: {hint}"
        );
        for name in &generated {
            let fresh = std::fs::read(out.join(dir).join(name)).expect("generated file");
            let committed = std::fs::read(root.join(dir).join(name)).expect("committed file");
            assert!(committed == fresh, "{dir}/{name} is stale: {hint}");
        }
    }
    assert_eq!(
        names(&out.join("completions")).len(),
        5,
        "bash, zsh, fish, elvish, PowerShell"
    );
    assert!(names(&out.join("man")).contains(&"durun-step.1".to_owned()));
}

#[test]
fn completions_print_for_every_shell() {
    let env = TestEnv::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = env.durun(&["completions", shell]);
        assert!(output.status.success());
        // A script that asks durun itself for the candidates.
        assert!(text(&output.stdout).contains("COMPLETE"), "{shell}");
    }
}

#[test]
fn task_arguments_complete_to_the_tasks_in_the_journal() {
    let env = TestEnv::new();
    for task in ["build-1", "build-2", "deploy-1"] {
        let output = env.durun(&["run", "--task", task, "--", "true"]);
        assert!(output.status.success(), "{}", text(&output.stderr));
    }
    let complete = |words: &[&str]| {
        let output = env
            .command()
            .env("COMPLETE", "fish")
            .arg("--")
            .args(words)
            .output()
            .expect("complete");
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout)
    };
    for command in ["resume", "inspect", "cancel", "resolve"] {
        let candidates = complete(&["durun", command, "bu"]);
        let ids: Vec<&str> = candidates
            .lines()
            .map(|line| line.split('\t').next().unwrap_or_default())
            .filter(|word| !word.starts_with('-'))
            .collect();
        assert_eq!(ids, ["build-2", "build-1"], "{command}: {candidates}");
        assert!(
            candidates.contains("build-2\tcompleted: true"),
            "{candidates}"
        );
    }
    // The internal command is not offered.
    let commands = complete(&["durun", ""]);
    assert!(commands.contains("resume\t"), "{commands}");
    assert!(!commands.contains("generate"), "{commands}");
}

#[test]
fn usage_errors_exit_2_with_a_durun_line() {
    let env = TestEnv::new();
    for args in [
        &["frobnicate"][..],
        &["run"][..],
        &["run", "--task", "a b", "--", "true"][..],
    ] {
        let output = env.durun(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            text(&output.stderr).starts_with("durun: "),
            "{args:?}: {}",
            text(&output.stderr)
        );
        assert!(output.stdout.is_empty());
    }
    let help = env.durun(&["--help"]);
    assert!(help.status.success());
    assert!(text(&help.stdout).contains("Relaunch an unfinished task"));
}

#[test]
fn absurd_values_are_refused_with_a_clear_line() {
    let env = TestEnv::new();
    let ok = env.durun(&["run", "--", "true"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let gc = env.durun(&["gc", "--older-than", "100y"]);
    assert_eq!(gc.status.code(), Some(2), "{}", text(&gc.stderr));
    assert!(
        text(&gc.stderr).starts_with("durun: --older-than 100years reaches back before 1970"),
        "{}",
        text(&gc.stderr)
    );
    env.write(
        "durun.toml",
        "[tools.t]\neffect = \"read\"\ncommand = [\"true\"]\ntimeout = \"0s\"\n",
    );
    let run = env.durun(&["run", "--", "true"]);
    assert_eq!(run.status.code(), Some(64), "{}", text(&run.stderr));
    assert!(
        text(&run.stderr).contains("`timeout = \"0s\"` must be longer than zero"),
        "{}",
        text(&run.stderr)
    );
}

#[test]
fn a_postgresql_server_that_refuses_says_why() {
    let Ok(base) = std::env::var("DURUN_TEST_POSTGRES") else {
        eprintln!("skipped: DURUN_TEST_POSTGRES is not set");
        return;
    };
    let env = TestEnv::new();
    let host = base
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("postgres://USER@HOST:PORT/DB");
    for (url, reason) in [
        (
            format!("postgres://no_such_role:pw-s3cret@{host}/test"),
            "role \"no_such_role\" does not exist",
        ),
        (
            format!("postgres://postgres@{host}/no_such_database"),
            "database \"no_such_database\" does not exist",
        ),
    ] {
        let output = env.durun(&["--journal", &url, "inspect"]);
        assert_eq!(output.status.code(), Some(74), "{}", text(&output.stderr));
        let stderr = text(&output.stderr);
        assert!(stderr.contains(reason), "{stderr}");
        assert!(!stderr.contains("pw-s3cret"), "{stderr}");
    }
}
