//! A test environment: its own directory and journal, a clean process
//! environment, and helpers to run durun and read its journal.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) struct TestEnv {
    pub dir: tempfile::TempDir,
    pub journal: PathBuf,
    /// With `DURUN_TEST_POSTGRES` set, the journal is this URL: a schema of
    /// its own on that server.
    pub postgres: Option<Postgres>,
    vars: Vec<(String, String)>,
}

/// A schema for one test on the server in `DURUN_TEST_POSTGRES`.
pub(crate) struct Postgres {
    base: String,
    schema: String,
    pub url: String,
}

impl Postgres {
    fn create() -> Option<Self> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let base = std::env::var("DURUN_TEST_POSTGRES")
            .ok()
            .filter(|url| !url.is_empty())?;
        let schema = format!(
            "durun_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let mut client = postgres::Client::connect(&base, postgres::NoTls)
            .expect("connect to DURUN_TEST_POSTGRES");
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .expect("create a schema");
        let separator = if base.contains('?') { '&' } else { '?' };
        // Named after the schema: a test can find its sessions.
        let url = format!(
            "{base}{separator}options=-c%20search_path%3D{schema}&application_name={schema}"
        );
        Some(Self { base, schema, url })
    }

    fn client(&self) -> postgres::Client {
        let mut client = postgres::Client::connect(&self.base, postgres::NoTls).expect("connect");
        client
            .batch_execute(&format!("SET search_path TO {}", self.schema))
            .expect("search_path");
        client
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Ok(mut client) = postgres::Client::connect(&self.base, postgres::NoTls) {
            // A runner a failed test left stopped may hold locks: give up
            // rather than hang the suite (the schema is dropped next time).
            let _ = client.batch_execute(&format!(
                "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {} CASCADE",
                self.schema
            ));
        }
    }
}

impl TestEnv {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = dir.path().join("state/journal.db");
        Self {
            dir,
            journal,
            postgres: Postgres::create(),
            vars: Vec::new(),
        }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, contents).expect("write test file");
        path
    }

    /// Sets a variable for every durun this environment starts.
    pub(crate) fn set(&mut self, name: &str, value: impl Into<String>) {
        self.vars.push((name.to_owned(), value.into()));
    }

    /// durun with a clean environment, started in the test directory.
    pub(crate) fn command(&self) -> Command {
        let mut command = Command::new(assert_cmd::cargo::cargo_bin("durun"));
        command
            .env_clear()
            // A script's `durun` is the one under test, never one the
            // machine has installed.
            .env("PATH", path_with_durun())
            .env("HOME", self.dir.path())
            .env(
                "DURUN_JOURNAL",
                self.postgres
                    .as_ref()
                    .map_or(self.journal.as_os_str(), |pg| std::ffi::OsStr::new(&pg.url)),
            )
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        for (name, value) in &self.vars {
            command.env(name, value);
        }
        // durun starts as a shell at a terminal starts it, with SIGINT at
        // its default: a suite started in the background of a script
        // (`sh` ignores SIGINT in asynchronous commands) would otherwise
        // hand the ignore down to durun and, as any program passes an
        // ignored signal on, to its agent.
        // SAFETY: signal(2) is async-signal-safe, the only call between
        // fork and exec here.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        command
    }

    pub(crate) fn durun(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run durun")
    }

    /// `durun run --task TASK -- python3 AGENT`, to its end.
    pub(crate) fn run_python(&self, task: &str, agent: &Path) -> Output {
        self.durun(&[
            "run",
            "--task",
            task,
            "--",
            "python3",
            &agent.to_string_lossy(),
        ])
    }

    /// Starts durun in the background; its stdout and stderr go to files.
    pub(crate) fn spawn(&self, args: &[&str], log: &str) -> Child {
        let stdout = std::fs::File::create(self.path(&format!("{log}.out"))).expect("log file");
        let stderr = std::fs::File::create(self.path(&format!("{log}.err"))).expect("log file");
        self.command()
            .args(args)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn durun")
    }

    /// Like [`TestEnv::spawn`], as a runner on host `host`
    /// (`DURUN_HOST_ID`).
    pub(crate) fn spawn_on(&self, host: &str, args: &[&str], log: &str) -> Child {
        let stdout = std::fs::File::create(self.path(&format!("{log}.out"))).expect("log file");
        let stderr = std::fs::File::create(self.path(&format!("{log}.err"))).expect("log file");
        self.command()
            .env("DURUN_HOST_ID", host)
            .args(args)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn durun")
    }

    pub(crate) fn log(&self, log: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{log}.err"))).unwrap_or_default()
    }

    pub(crate) fn inspect(&self, task: &str) -> Value {
        let output = self.durun(&["inspect", task, "--json"]);
        assert!(
            output.status.success(),
            "inspect failed: {}",
            text(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("inspect prints JSON")
    }

    /// Runs `probe.py` as task `task` (a second call resumes it): it sends
    /// each `{"send": LINE, "answer": bool}` of `script` and logs durun's
    /// answers, which come back with durun's output.
    pub(crate) fn probe(&self, task: &str, script: &Value) -> (Output, Vec<Value>) {
        let script_path = self.write(&format!("{task}.json"), &script.to_string());
        let answers = self.path(&format!("{task}.answers"));
        let _ = std::fs::remove_file(&answers);
        let output = self
            .command()
            .args(["run", "--task", task, "--", "python3"])
            .arg(agents_dir().join("probe.py"))
            .arg(&script_path)
            .arg(&answers)
            .output()
            .expect("run durun");
        (output, read_json_lines(&answers))
    }

    /// Writes a plan for `scripted.py` and returns the agent's argv.
    pub(crate) fn scripted_agent(&self, name: &str, plan: &Value) -> Vec<String> {
        let path = self.write(name, &plan.to_string());
        vec![
            "python3".to_owned(),
            agents_dir()
                .join("scripted.py")
                .to_string_lossy()
                .into_owned(),
            path.to_string_lossy().into_owned(),
        ]
    }
}

impl TestEnv {
    /// Ends every PostgreSQL session of this test's durun processes, as a
    /// server restart would (and waits until they are gone).
    pub(crate) fn end_sessions(&self) {
        let pg = self.postgres.as_ref().expect("a PostgreSQL journal");
        pg.client()
            .execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
                 WHERE application_name = $1",
                &[&pg.schema],
            )
            .expect("end the sessions");
    }

    /// Stops `target` (a pid, or a process group as its negative) with
    /// SIGSTOP at a moment it holds no SQLite write: a process frozen in
    /// the middle of a commit keeps SQLite's write lock, and nothing else
    /// can write until it is continued (SQLite has one writer), which is not
    /// what a test of a paused worker or runner means to try. It stops and
    /// checks, and continues and tries again while the journal is held. On
    /// PostgreSQL it stops at once: the server ends a session left idle in
    /// a transaction, and the tests count on that.
    pub(crate) fn pause_outside_a_write(&self, target: i32) {
        for _ in 0..1000 {
            signal(target, libc::SIGSTOP);
            if self.postgres.is_some() || self.sqlite_writable() {
                return;
            }
            signal(target, libc::SIGCONT);
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("{target} never stopped outside a journal write");
    }

    /// Whether another process could write to the SQLite journal now.
    fn sqlite_writable(&self) -> bool {
        if !self.journal.exists() {
            return true;
        }
        let conn = rusqlite::Connection::open(&self.journal).expect("open the journal");
        conn.busy_timeout(Duration::ZERO).expect("busy_timeout");
        conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK").is_ok()
    }

    /// Runs SQL on the journal file directly (to age a step, say).
    pub(crate) fn sql(&self, sql: &str) {
        if let Some(pg) = &self.postgres {
            pg.client().batch_execute(sql).expect("SQL on the journal");
            return;
        }
        let conn = rusqlite::Connection::open(&self.journal).expect("open the journal");
        conn.execute_batch(sql).expect("SQL on the journal");
    }

    /// The one number `sql` selects, on either backend.
    pub(crate) fn sql_number(&self, sql: &str) -> i64 {
        if let Some(pg) = &self.postgres {
            return pg
                .client()
                .query_one(sql, &[])
                .expect("SQL on the journal")
                .get(0);
        }
        let conn = rusqlite::Connection::open(&self.journal).expect("open the journal");
        conn.query_row(sql, [], |row| row.get(0))
            .expect("SQL on the journal")
    }

    /// Asserts that the journal is intact: SQLite's integrity check, or on
    /// PostgreSQL that no step number has two live rows.
    pub(crate) fn assert_journal_intact(&self) {
        if let Some(pg) = &self.postgres {
            let mut client = pg.client();
            let created: bool = client
                .query_one("SELECT to_regclass('steps') IS NOT NULL", &[])
                .expect("look for the journal")
                .get(0);
            if !created {
                return;
            }
            let duplicates: i64 = client
                .query_one(
                    "SELECT count(*) FROM (SELECT task_id, step_index FROM steps WHERE status <> 'discarded'
                     GROUP BY task_id, step_index HAVING count(*) > 1) AS d",
                    &[],
                )
                .expect("check the journal")
                .get(0);
            assert_eq!(duplicates, 0, "live steps with the same number");
            return;
        }
        let conn = rusqlite::Connection::open_with_flags(
            &self.journal,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("open the journal");
        let verdict: String = conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .expect("integrity_check");
        assert_eq!(verdict, "ok", "PRAGMA integrity_check");
    }
}

/// Every test's journal must pass `PRAGMA integrity_check` at the end,
/// whatever the test did to it.
impl Drop for TestEnv {
    fn drop(&mut self) {
        if !std::thread::panicking() && (self.postgres.is_some() || self.journal.exists()) {
            self.assert_journal_intact();
        }
    }
}

/// The Python SDK, for PYTHONPATH.
pub(crate) fn sdk_path() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sdk/python")
        .to_string_lossy()
        .into_owned()
}

/// PATH with the durun under test first, for scripts that call `durun`.
pub(crate) fn path_with_durun() -> String {
    let bin = assert_cmd::cargo::cargo_bin("durun");
    format!(
        "{}:{}",
        bin.parent().expect("bin dir").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// PATH without any directory that holds a `durun`: a script sees no
/// durun, whatever the machine has installed.
pub(crate) fn path_without_durun() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|dir| !dir.join("durun").exists())
        .collect();
    std::env::join_paths(kept)
        .expect("PATH entries")
        .to_string_lossy()
        .into_owned()
}

/// `program` as found on the test's own PATH (before a test narrows it).
pub(crate) fn which(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

pub(crate) fn agents_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents")
}

/// A file of JSON lines, one value each; a missing file holds none.
pub(crate) fn read_json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a line of JSON"))
        .collect()
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Polls `ready` until it holds; panics with `what` after `timeout`.
/// Waits until `ready` (a run reached the point under test), then kills
/// durun with SIGKILL and reaps it.
pub(crate) fn sigkill_once(
    durun: &mut Child,
    what: &str,
    timeout: Duration,
    ready: impl FnMut() -> bool,
) {
    wait_for(what, timeout, ready);
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
}

pub(crate) fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for `child` to exit; panics after `timeout`.
pub(crate) fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a durun did not exit in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads a pid that a process wrote to `path`.
pub(crate) fn read_pid(path: &Path) -> i32 {
    wait_for(
        &format!("pid file {}", path.display()),
        Duration::from_secs(30),
        || path.exists(),
    );
    std::fs::read_to_string(path)
        .expect("pid file")
        .trim()
        .parse()
        .expect("a pid")
}

/// The live processes (zombies left out) whose `/proc/PID` directory
/// `matches`.
fn live_processes(matches: impl Fn(&Path) -> bool) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            (matches(&entry.path()) && !process_gone(pid)).then_some(pid)
        })
        .collect()
}

/// The live processes whose arguments (`argv[0]` first) pass `test`.
pub(crate) fn processes_whose_args(test: impl Fn(&[&[u8]]) -> bool) -> Vec<i32> {
    live_processes(|proc| {
        std::fs::read(proc.join("cmdline")).is_ok_and(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|&byte| byte == 0).collect();
            test(&args)
        })
    })
}

/// The live processes that run in `dir` or below it (their working
/// directory).
pub(crate) fn processes_in(dir: &Path) -> Vec<i32> {
    live_processes(|proc| {
        std::fs::read_link(proc.join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
    })
}

pub(crate) fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // A zombie has exited; only its parent's wait is missing.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

pub(crate) fn signal(pid: i32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Why a test of SQLite's own behaviour is skipped on the PostgreSQL run.
pub(crate) const SQLITE_ONLY: &str =
    "it tests a SQLite journal, and DURUN_TEST_POSTGRES chose PostgreSQL";

/// Says that the running test is skipped, and why, on stderr past `cargo
/// test`'s capture of a passing test's output: a green run lists by name
/// what it did not run. (libtest names each test's thread after the test;
/// run on the main thread, the line names none.)
pub(crate) fn skipped(reason: &str) {
    use std::io::Write as _;
    let name = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(|name| format!("{name}: "))
        .unwrap_or_default();
    let _ = writeln!(std::io::stderr(), "skipped: {name}{reason}");
}

/// Whether python3 can `import` these (comma-separated) modules. `.ci/run`
/// installs the packages and sets `required`, which makes their absence a
/// failure; elsewhere the test is skipped, saying what to install.
pub(crate) fn python_has(modules: &str, required: &str, install: &str) -> bool {
    installed(
        Command::new("python3").args(["-c", &format!("import {modules}")]),
        &format!("`{modules}` cannot be imported"),
        required,
        &format!("pip install {install}"),
    )
}

/// Whether `check` runs and succeeds, which says a package a test needs is
/// installed. `.ci/run` installs it and sets `required`, which makes its
/// absence (`missing` says what is wrong) a failure; elsewhere the test is
/// skipped, saying what to run (`install`).
pub(crate) fn installed(check: &mut Command, missing: &str, required: &str, install: &str) -> bool {
    let found = check.output().is_ok_and(|output| output.status.success());
    if !found {
        assert!(
            std::env::var(required).is_err(),
            "{required} is set but {missing}: {install}"
        );
        skipped(&format!("{install} to run it"));
    }
    found
}
