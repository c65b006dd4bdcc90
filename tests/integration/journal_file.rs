//! The journal is the journal: a file deleted under a live run, another
//! program's SQLite database, a FIFO, a device or a directory in its place,
//! and paths an unprivileged user may not use. Each is refused with 74 and
//! a clear line, without a byte written to what is not durun's.
//!
//! The unprivileged cases run durun as a user the test creates (CI runs as
//! root, and root may read anything).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::env::{TestEnv, read_pid, text, wait_exit};

fn sha(path: &Path) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(std::fs::read(path).expect("read")).to_vec()
}

#[test]
fn a_journal_deleted_under_a_live_run_stops_it_with_74() {
    let env = TestEnv::new();
    if env.postgres.is_some() {
        crate::env::skipped(crate::env::SQLITE_ONLY);
        return;
    }
    let gate = env.path("gate");
    let plan = json!({
        "pidfile": env.path("agent.pid"),
        "steps": [
            {"begin": "one", "args": {}, "do": {"value": 1}},
            {"begin": "gate", "args": {}, "do": {"wait_for": gate}},
            {"begin": "three", "args": {}, "do": {"value": 3}},
        ],
    });
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "t", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut durun = env.spawn(&args, "run");
    read_pid(&env.path("agent.pid"));
    // Step one is committed and the gate step open: the agent says so.
    crate::env::wait_for("the gate step to open", Duration::from_secs(30), || {
        gate.with_extension("waiting").exists()
    });
    std::fs::remove_file(&env.journal).expect("delete the journal");
    std::fs::write(&gate, "").expect("open the gate");
    let status = wait_exit(&mut durun, Duration::from_secs(30));
    assert_eq!(status.code(), Some(74), "{}", env.log("run"));
    assert!(
        env.log("run")
            .contains("was deleted or replaced while this run was writing it"),
        "{}",
        env.log("run")
    );
    // Nothing acknowledged the gate step: the agent never got to step 3.
    assert!(!env.log("run").contains("three"), "{}", env.log("run"));
}

#[test]
fn another_programs_database_is_refused_without_a_byte_written() {
    let env = TestEnv::new();
    for (name, schema) in [
        (
            "app.db",
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
        ),
        // Even with a table named like one of durun's.
        (
            "shop.db",
            "CREATE TABLE tasks (id INTEGER PRIMARY KEY, todo TEXT)",
        ),
    ] {
        let path = env.path(name);
        let conn = rusqlite::Connection::open(&path).expect("create");
        conn.execute_batch(schema).expect("schema");
        drop(conn);
        let before = sha(&path);
        let journal = path.to_string_lossy().into_owned();
        for args in [
            vec!["--journal", &journal, "run", "--", "true"],
            vec!["--journal", &journal, "inspect"],
            vec!["--journal", &journal, "resume", "--all"],
        ] {
            let output = env.durun(&args);
            assert_eq!(
                output.status.code(),
                Some(74),
                "{args:?}: {}",
                text(&output.stderr)
            );
            assert!(
                text(&output.stderr).starts_with(&format!(
                    "durun: {journal} is another program's SQLite database, not a durun journal"
                )),
                "{}",
                text(&output.stderr)
            );
        }
        assert_eq!(sha(&path), before, "{name} was changed");
        assert!(
            !env.path(&format!("{name}-wal")).exists(),
            "{name} was switched to WAL"
        );
    }
    // durun's own journal carries its mark.
    if env.postgres.is_some() {
        return;
    }
    let ours = env.durun(&["run", "--", "true"]);
    assert!(ours.status.success(), "{}", text(&ours.stderr));
    let conn = rusqlite::Connection::open(&env.journal).expect("open");
    let id: i32 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .expect("application_id");
    assert_eq!(id, 0x6475_726e);
}

#[test]
fn a_fifo_a_device_or_a_directory_is_not_a_journal() {
    let env = TestEnv::new();
    let fifo = env.path("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    std::fs::create_dir(env.path("dir")).expect("dir");
    for (path, what) in [
        (fifo.to_string_lossy().into_owned(), "a FIFO"),
        ("/dev/null".to_owned(), "a device"),
        (
            env.path("dir").to_string_lossy().into_owned(),
            "a directory",
        ),
    ] {
        for args in [
            vec!["inspect"],
            vec!["run", "--", "true"],
            vec!["inspect", "t"],
        ] {
            let mut command = env.command();
            command.arg("--journal").arg(&path).args(&args);
            let mut child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            let status = wait_exit(&mut child, Duration::from_secs(20));
            let output = child.wait_with_output().expect("output");
            assert_eq!(
                status.code(),
                Some(74),
                "{path} {args:?}: {}",
                text(&output.stderr)
            );
            assert!(
                text(&output.stderr)
                    .starts_with(&format!("durun: the journal path {path} is {what}")),
                "{}",
                text(&output.stderr)
            );
        }
    }
}

/// A user without privileges that a test makes and removes again, and a
/// copy of durun it can run: the one cargo built may sit in a directory
/// only root may enter (a clone under /root).
struct Unprivileged {
    name: String,
    durun: std::path::PathBuf,
}

impl Unprivileged {
    /// Needs root (CI runs as root); `None` elsewhere.
    fn make(env: &TestEnv) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let name = format!("durun-t{}", std::process::id());
        let made = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                &name,
            ])
            .status()
            .is_ok_and(|status| status.success());
        assert!(made, "useradd {name} failed");
        let user = Self {
            name,
            durun: env.path("bin/durun"),
        };
        let bin = env.path("bin");
        std::fs::create_dir(&bin).expect("dir");
        std::fs::copy(assert_cmd::cargo::cargo_bin("durun"), &user.durun).expect("copy durun");
        for (path, mode) in [
            (env.dir.path(), 0o755),
            (bin.as_path(), 0o755),
            (user.durun.as_path(), 0o755),
        ] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        Some(user)
    }
}

impl Drop for Unprivileged {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// Variables and arguments of one unprivileged run.
type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>);

/// durun as the unprivileged user, with only `vars` in its environment;
/// one that runs on past a minute is ended (exit 124).
fn durun_as(user: &Unprivileged, vars: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new("/usr/sbin/runuser");
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(["-u", &user.name, "--", "timeout", "60"])
        .arg(&user.durun)
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null());
    for (name, value) in vars {
        command.env(name, value);
    }
    command.output().expect("runuser")
}

#[test]
fn paths_an_unprivileged_user_may_not_use_are_journal_errors() {
    let env = TestEnv::new();
    if env.postgres.is_some() {
        crate::env::skipped(crate::env::SQLITE_ONLY);
        return;
    }
    // The test directory is the user's to look into, not to write.
    let Some(user) = Unprivileged::make(&env) else {
        crate::env::skipped("making a user needs root (CI runs as root)");
        return;
    };
    let user = &user;
    let locked = env.path("locked");
    std::fs::create_dir(&locked).expect("dir");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let unwritable = env.path("unwritable");
    std::fs::create_dir(&unwritable).expect("dir");
    std::fs::set_permissions(&unwritable, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Root's journal, 0600, and a link to it.
    let ok = env.durun(&["run", "--task", "secret", "--", "true"]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let link = env.path("link.db");
    std::os::unix::fs::symlink(&env.journal, &link).expect("symlink");
    let state = unwritable.to_string_lossy().into_owned();
    let in_locked = locked.join("j.db").to_string_lossy().into_owned();
    let in_unwritable = unwritable.join("j.db").to_string_lossy().into_owned();
    let link = link.to_string_lossy().into_owned();
    let roots = env.journal.to_string_lossy().into_owned();
    let cases: Vec<Case<'_>> = vec![
        (vec![("XDG_STATE_HOME", &state)], vec!["run", "--", "true"]),
        (vec![("HOME", &state)], vec!["run", "--", "true"]),
        (vec![("HOME", "/")], vec!["run", "--", "true"]),
        (
            vec![("DURUN_JOURNAL", &in_unwritable)],
            vec!["run", "--", "true"],
        ),
        (
            vec![("DURUN_JOURNAL", &in_locked)],
            vec!["run", "--", "true"],
        ),
        (vec![("DURUN_JOURNAL", &in_locked)], vec!["inspect"]),
        (vec![("DURUN_JOURNAL", &link)], vec!["run", "--", "true"]),
        (vec![("DURUN_JOURNAL", &link)], vec!["inspect"]),
        (vec![("DURUN_JOURNAL", &roots)], vec!["inspect"]),
        (vec![("DURUN_JOURNAL", &roots)], vec!["inspect", "secret"]),
        (vec![("DURUN_JOURNAL", &roots)], vec!["resume", "secret"]),
    ];
    for (vars, args) in cases {
        let output = durun_as(user, &vars, &args);
        assert_eq!(
            output.status.code(),
            Some(74),
            "{vars:?} {args:?}: {}{}",
            text(&output.stdout),
            text(&output.stderr)
        );
        let stderr = text(&output.stderr);
        assert!(stderr.starts_with("durun: "), "{stderr}");
        assert!(
            text(&output.stdout).is_empty(),
            "{vars:?} {args:?}: {}",
            text(&output.stdout)
        );
        assert_eq!(
            stderr
                .lines()
                .filter(|line| line.starts_with("durun: "))
                .count(),
            1,
            "{stderr}"
        );
    }
    // Root's journal where the user may look (a directory of mode 755):
    // the file is private all the same, and the error says whose it is.
    let open = env.path("open");
    std::fs::create_dir(&open).expect("dir");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let private = open.join("j.db").to_string_lossy().into_owned();
    let ok = env.durun(&[
        "--journal",
        &private,
        "run",
        "--task",
        "secret",
        "--",
        "true",
    ]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    // `durun ui` says so before it serves (else it would run on, and
    // `timeout` end it with 124).
    let ui = vec!["ui", "--listen", "127.0.0.1:0"];
    for args in [vec!["inspect"], vec!["inspect", "secret"], ui] {
        let output = durun_as(user, &[("DURUN_JOURNAL", &private)], &args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(74), "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "durun: cannot read the journal at {private}: {private} belongs to uid 0 (mode 600), and this user (uid "
            )) && stderr.contains("\n  hint: run durun as the user whose runs wrote the journal"),
            "{stderr}"
        );
    }
}
