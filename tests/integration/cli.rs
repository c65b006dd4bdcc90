//! The command line itself: help, usage errors, completions, man pages.

use std::path::Path;

use crate::env::{text, TestEnv};

#[test]
fn committed_completions_and_man_pages_are_current() {
    let env = TestEnv::new();
    let out = env.path("generated");
    let output = env.durun(&["generate", "--out", out.to_str().expect("utf-8 path")]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut compared = 0;
    for dir in ["completions", "man"] {
        for entry in std::fs::read_dir(out.join(dir)).expect("generated dir") {
            let entry = entry.expect("entry");
            let committed = root.join(dir).join(entry.file_name());
            let fresh = std::fs::read(entry.path()).expect("generated file");
            let stale = std::fs::read(&committed).ok() != Some(fresh);
            assert!(
                !stale,
                "{} is stale or missing: run `cargo run -- generate --out .` and commit the result",
                committed.display()
            );
            compared += 1;
        }
    }
    assert_eq!(
        compared,
        5 + 8,
        "five completion scripts and eight man pages"
    );
}

#[test]
fn completions_print_for_every_shell() {
    let env = TestEnv::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = env.durun(&["completions", shell]);
        assert!(output.status.success());
        assert!(text(&output.stdout).contains("resume"), "{shell}");
    }
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
