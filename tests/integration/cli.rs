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
    let ids = |candidates: &str| -> Vec<String> {
        candidates
            .lines()
            .map(|line| line.split('\t').next().unwrap_or_default().to_owned())
            .filter(|word| !word.starts_with('-'))
            .collect()
    };
    for command in ["inspect", "resolve", "export"] {
        let candidates = complete(&["durun", command, "bu"]);
        assert_eq!(
            ids(&candidates),
            ["build-2", "build-1"],
            "{command}: {candidates}"
        );
        assert!(
            candidates.contains("build-2\tcompleted: true"),
            "{candidates}"
        );
    }
    // What can still be acted on: not the completed tasks.
    let submitted = env.durun(&["submit", "--task", "build-3", "--", "true"]);
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    for command in ["resume", "cancel", "approve", "reject", "signal"] {
        let candidates = complete(&["durun", command, "bu"]);
        assert_eq!(ids(&candidates), ["build-3"], "{command}: {candidates}");
    }
    // --journal on the line chooses the journal whose tasks are offered.
    let other = env.durun(&[
        "--journal",
        "other.db",
        "run",
        "--task",
        "elsewhere",
        "--",
        "true",
    ]);
    assert!(other.status.success(), "{}", text(&other.stderr));
    let candidates = complete(&["durun", "--journal", "other.db", "inspect", ""]);
    assert_eq!(ids(&candidates), ["elsewhere"], "{candidates}");
    // --from-step offers the steps of the task on the line.
    let stepped = env.durun(&[
        "run",
        "--task",
        "steps",
        "--",
        "sh",
        "-c",
        "durun step fetch -- true && durun step build -- true && exit 3",
    ]);
    assert_eq!(stepped.status.code(), Some(3), "{}", text(&stepped.stderr));
    let candidates = complete(&["durun", "resume", "steps", "--from-step", ""]);
    assert_eq!(ids(&candidates), ["1", "2"], "{candidates}");
    assert!(candidates.contains("1\tfetch (committed)"), "{candidates}");
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
    // An option durun does not know, before `--`, is a usage error naming
    // it: never a part of the agent's command, never a task.
    for (args, named) in [
        (
            &["run", "--typo-flag", "3", "--", "true"][..],
            "--typo-flag",
        ),
        (&["submit", "--retry", "2", "--", "true"][..], "--retry"),
        (&["run", "--tsak", "x", "--", "true"][..], "--tsak"),
    ] {
        let output = env.durun(args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("durun: unexpected argument '{named}'")),
            "{args:?}: {stderr}"
        );
    }
    let listed = env.durun(&["inspect", "--json"]);
    assert_eq!(text(&listed.stdout), "{\"tasks\":[]}\n", "no task was made");
    // The agent's own options after `--`, or after its first word, are its.
    let output = env.durun(&["run", "-q", "--", "sh", "-c", "echo $0 $1", "--x", "-y"]);
    assert_eq!(text(&output.stdout), "--x -y\n", "{}", text(&output.stderr));
    let output = env.durun(&["run", "-q", "sh", "-c", "echo $0", "--z"]);
    assert_eq!(text(&output.stdout), "--z\n", "{}", text(&output.stderr));
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
    for duration in ["1000000000y", "99999999999999999999999y"] {
        let sleep = env.durun(&["sleep", duration]);
        assert_eq!(sleep.status.code(), Some(2), "{}", text(&sleep.stderr));
        assert!(
            text(&sleep.stderr).contains(&format!("{duration} is too far")),
            "{}",
            text(&sleep.stderr)
        );
    }
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
        crate::env::skipped("DURUN_TEST_POSTGRES is not set");
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
    // A search_path schema that does not exist: what is missing, and how
    // to create it.
    let url =
        format!("postgres://postgres@{host}/test?options=-c%20search_path%3Dno_such_schema_here");
    let output = env.durun(&["--journal", &url, "run", "--", "true"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(74), "{stderr}");
    assert!(
        stderr.contains("the URL's search_path names a schema that does not exist")
            && stderr.contains("CREATE SCHEMA"),
        "{stderr}"
    );
}

/// The commands a message suggests name the journal the command line
/// named: without it they would act on another journal.
#[test]
fn hints_name_the_journal_the_command_line_named() {
    let env = TestEnv::new();
    let output = env
        .command()
        .env_remove("DURUN_JOURNAL")
        .args([
            "--journal",
            "hitl.db",
            "run",
            "--task",
            "t",
            "--",
            "sh",
            "-c",
            "durun step a -- true; exit 4",
        ])
        .output()
        .expect("durun");
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("continue with `durun --journal hitl.db resume t`"),
        "{}",
        text(&output.stderr)
    );
    let missing = env
        .command()
        .env_remove("DURUN_JOURNAL")
        .args(["--journal", "hitl.db", "resume", "nope"])
        .output()
        .expect("durun");
    assert!(
        text(&missing.stderr).contains("`durun --journal hitl.db inspect` lists the tasks"),
        "{}",
        text(&missing.stderr)
    );
}

/// durun runs under valgrind, as someone chasing a leak or profiling durun
/// runs it: it died with SIGSEGV at its first lease, reading the boot clock
/// through a vDSO that valgrind does not map. `.ci/run` installs valgrind
/// and sets DURUN_TEST_VALGRIND, which makes its absence a failure.
#[test]
fn durun_runs_under_valgrind() {
    if !crate::env::installed(
        std::process::Command::new("valgrind").arg("--version"),
        "valgrind is not installed",
        "DURUN_TEST_VALGRIND",
        "apt-get install valgrind",
    ) {
        return;
    }
    let env = TestEnv::new();
    // The test's own durun and environment, started by valgrind.
    let durun = env.command();
    let output = std::process::Command::new("valgrind")
        .env_clear()
        .envs(
            durun
                .get_envs()
                .filter_map(|(name, value)| Some((name, value?))),
        )
        .current_dir(durun.get_current_dir().expect("the test directory"))
        .args(["--tool=none", "-q"])
        .arg(durun.get_program())
        .args(["run", "--task", "v", "--", "true"])
        .output()
        .expect("valgrind");
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(env.inspect("v")["task"]["status"], "completed", "{stderr}");
}
