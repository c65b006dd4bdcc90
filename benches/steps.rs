//! What a durable step costs in durun, next to the disk's floor (one SQLite
//! WAL commit) and next to DBOS and LangGraph, on this machine, in one run.
//!
//!     cargo bench --bench steps
//!
//! Prints a Markdown table (the one in docs/performance.md) to stdout and
//! progress to stderr. Settings are interleaved round by round, so a slow
//! minute of the disk hits every row alike. The agent is this same binary,
//! started by durun with `DURUN_BENCH_AGENT` set: a real process on the
//! real protocol, whose own cost per step is a few microseconds.
//!
//! Environment:
//! - `DURUN_BENCH_ROUNDS` (5): samples per row; the table shows medians.
//! - `DURUN_BENCH_STEPS` (1000): steps per sample of the per-step rows.
//! - `DURUN_BENCH_REPLAY` (10000,100000): task sizes for the replay rows.
//! - `DURUN_PEERS` (../shared/peers): the DBOS and LangGraph scripts; their
//!   virtualenv is made under `PEERS_WORK` (/tmp/durun-peers) on first use.
//!   `DURUN_BENCH_PEERS=0` leaves the peers out.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

fn main() {
    if let Ok(mode) = std::env::var("DURUN_BENCH_AGENT") {
        if mode == "echo" {
            echo();
        } else {
            agent::main(&mode);
        }
        return;
    }
    orchestrate();
}

/// Syncs to disk per step, counted with strace (exact, unlike time): the
/// difference between runs of 150 and 50 steps, so start-up cancels out.
fn fsyncs_per_step(root: &Path, mode: &str, parallel: u64) -> Option<f64> {
    let available = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !available {
        return None;
    }
    let mut counts = Vec::new();
    for steps in [50u64, 150] {
        let mut scratch = Scratch::new(root, "fsync", "full");
        let log = scratch.dir.join("strace.log");
        scratch.strace = Some(log.clone());
        let (_, _, ok) = scratch.agent(
            &["run", "--task", "bench"],
            mode,
            &[
                ("DURUN_BENCH_STEPS", steps.to_string()),
                ("DURUN_BENCH_PARALLEL", parallel.to_string()),
            ],
        );
        assert_eq!(ok, Some(0), "durun run under strace failed");
        let text = std::fs::read_to_string(&log).ok()?;
        let syncs = text
            .lines()
            .filter(|line| line.contains("fsync(") || line.contains("fdatasync("))
            .count();
        counts.push(syncs as f64);
    }
    Some((counts[1] - counts[0]) / 100.0)
}

/// The floor of a command tool: start `true` and wait for it, in µs.
fn spawn_true(count: u64) -> f64 {
    let started = Instant::now();
    for _ in 0..count {
        let status = Command::new("true").status().expect("run true");
        assert!(status.success());
    }
    started.elapsed().as_secs_f64() * 1e6 / count as f64
}

/// The other end of [`pipe_round_trip`]: answers each line with itself.
fn echo() {
    let mut input = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut input, &mut line).is_ok_and(|read| read > 0) {
        out.write_all(line.as_bytes()).expect("write");
        out.flush().expect("flush");
        line.clear();
    }
}

/// Pins the calling thread (and what it starts later) to `cpu`, or to the
/// CPUs in `mask`; returns the mask it had.
fn pin(cpu: Option<usize>, mask: Option<libc::cpu_set_t>) -> libc::cpu_set_t {
    // SAFETY: sched_{get,set}affinity on the calling thread with sets on
    // the stack, of the size given.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of_val(&old), &raw mut old);
        let mut set: libc::cpu_set_t = mask.unwrap_or_else(|| std::mem::zeroed());
        if let Some(cpu) = cpu {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &raw const set);
        old
    }
}

/// Starts `command` (and whatever it starts) on CPU `cpu` only.
fn pin_child(command: &mut Command, cpu: usize) {
    // SAFETY: sched_setaffinity between fork and exec, on a set built on
    // the stack.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &raw const set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The machine's floor for any protocol over pipes: one line to another
/// process and back, in µs, with the two processes on one core or on two
/// (where each answer must wake a process on the other core). A
/// `begin`/`commit` step makes two.
fn pipe_round_trip(count: u32, cross_core: bool) -> f64 {
    use std::io::BufRead as _;
    let old = pin(Some(0), None);
    let mut command = Command::new(std::env::current_exe().expect("the bench's own path"));
    command
        .env("DURUN_BENCH_AGENT", "echo")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if cross_core {
        pin_child(&mut command, 1);
    }
    let mut child = command.spawn().expect("start the echo agent");
    let mut to = child.stdin.take().expect("piped");
    let mut from = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let request = "{\"op\":\"begin\",\"id\":1,\"name\":\"step\",\"args\":{\"i\":1}}\n";
    let mut line = String::new();
    let started = Instant::now();
    for _ in 0..count {
        to.write_all(request.as_bytes()).expect("write");
        to.flush().expect("flush");
        line.clear();
        from.read_line(&mut line).expect("read");
    }
    let elapsed = started.elapsed();
    drop(to);
    let _ = child.wait();
    pin(None, Some(old));
    elapsed.as_secs_f64() * 1e6 / f64::from(count)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

/// The step's own work, the same as the peers': one line appended to a
/// side-effect file, and a small JSON document as its output.
fn step_body(counter: &mut File, i: u64) -> String {
    writeln!(counter, "{} {i}", std::process::id()).expect("write the counter file");
    format!("{{\"i\":{i},\"payload\":\"{}\"}}", "x".repeat(100))
}

mod agent {
    //! The agent side: speaks the protocol on stdin/stdout and writes what
    //! it measured to `DURUN_BENCH_OUT` as one JSON object.

    use super::{OpenOptions, Value, Write, env_or, json, step_body, unix_ns};
    use std::io::{BufRead, BufWriter};
    use std::time::Instant;

    struct Wire {
        out: BufWriter<std::io::Stdout>,
        input: std::io::StdinLock<'static>,
        line: String,
    }

    impl Wire {
        fn send(&mut self, request: &str) {
            self.out.write_all(request.as_bytes()).expect("write");
            self.out.write_all(b"\n").expect("write");
            self.out.flush().expect("flush");
        }

        fn receive(&mut self) -> Value {
            self.line.clear();
            let read = self.input.read_line(&mut self.line).expect("read");
            assert!(read > 0, "durun closed the agent's stdin");
            let response: Value = serde_json::from_str(&self.line).expect("a JSON response");
            assert!(response["ok"] == true, "durun refused a step: {response}");
            response
        }

        fn ask(&mut self, request: &str) -> Value {
            self.send(request);
            self.receive()
        }
    }

    /// Peak resident memory of durun, the agent's parent, in KiB.
    fn parent_peak_kib() -> u64 {
        let status = std::fs::read_to_string(format!(
            "/proc/{}/status",
            std::os::unix::process::parent_id()
        ))
        .unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// How many replayed steps the agent asks for ahead of their answers.
    const WINDOW: u64 = 256;

    pub fn main(mode: &str) {
        let steps: u64 = env_or("DURUN_BENCH_STEPS", 100);
        let replay: u64 = env_or("DURUN_BENCH_REPLAY_STEPS", 0);
        let crash_at: u64 = env_or("DURUN_BENCH_CRASH_AT", 0);
        let mut counter = OpenOptions::new()
            .create(true)
            .append(true)
            .open("counter")
            .expect("open the counter file");
        let mut wire = Wire {
            out: BufWriter::new(std::io::stdout()),
            input: std::io::stdin().lock(),
            line: String::new(),
        };
        let started = Instant::now();
        let mut first_new_at = None;
        match mode {
            "read" | "mutate" => {
                // Replayed steps are asked for ahead of their answers, from
                // another thread, at most a window ahead (as a pipelining
                // agent would): durun's own speed shows, not the round trip.
                let mode_owned = mode.to_owned();
                let (read_tx, read_rx) = std::sync::mpsc::channel::<()>();
                let sender = std::thread::spawn(move || {
                    let mut out = BufWriter::new(std::io::stdout().lock());
                    for i in 1..=replay {
                        if i > WINDOW {
                            out.flush().expect("flush");
                            read_rx.recv().expect("the reader");
                        }
                        writeln!(
                            out,
                            r#"{{"op":"begin","id":{i},"name":"step","args":{{"i":{i}}},"effect":"{mode_owned}"}}"#
                        )
                        .expect("write");
                    }
                    out.flush().expect("flush");
                });
                for _ in 1..=replay {
                    // A plain look at the line keeps the agent's own cost
                    // below durun's.
                    wire.line.clear();
                    wire.input.read_line(&mut wire.line).expect("read");
                    assert!(
                        wire.line.contains(r#""replayed":true"#),
                        "not replayed: {}",
                        wire.line
                    );
                    let _ = read_tx.send(());
                }
                sender.join().expect("the sender thread");
                for i in replay + 1..=steps {
                    let response = wire.ask(&format!(
                        r#"{{"op":"begin","id":{i},"name":"step","args":{{"i":{i}}},"effect":"{mode}"}}"#
                    ));
                    if response["replayed"] == true {
                        continue;
                    }
                    first_new_at.get_or_insert_with(unix_ns);
                    if i == crash_at {
                        crash();
                    }
                    let step = &response["step"];
                    let output = step_body(&mut counter, i);
                    wire.ask(&format!(
                        r#"{{"op":"commit","id":"c{i}","step":{step},"output":{output}}}"#
                    ));
                }
            }
            "call" | "call_mutate" => {
                // Calls in groups of `DURUN_BENCH_PARALLEL`, all of a group
                // sent before any answer is read.
                let parallel: u64 = env_or("DURUN_BENCH_PARALLEL", 1);
                let tool = if mode == "call" {
                    "noop"
                } else {
                    "noop_mutate"
                };
                let mut i = 0;
                while i < steps {
                    let group = parallel.min(steps - i);
                    for j in 1..=group {
                        wire.send(&format!(
                            r#"{{"op":"call","id":{},"tool":"{tool}","args":{{"i":{}}}}}"#,
                            i + j,
                            i + j
                        ));
                    }
                    for _ in 0..group {
                        wire.receive();
                    }
                    i += group;
                }
            }
            other => panic!("unknown agent mode {other}"),
        }
        let elapsed = started.elapsed();
        let report = json!({
            "elapsed_ns": elapsed.as_nanos() as u64,
            "first_new_at_unix_ns": first_new_at.map(|at| at.to_string()),
            "durun_peak_kib": parent_peak_kib(),
        });
        let path = std::env::var("DURUN_BENCH_OUT").expect("DURUN_BENCH_OUT");
        std::fs::write(path, report.to_string()).expect("write the report");
        // A task that ends failed can be resumed again and again.
        std::process::exit(env_or("DURUN_BENCH_EXIT", 0));
    }

    /// A real crash: durun is killed with SIGKILL, then the agent.
    fn crash() -> ! {
        // SAFETY: plain kill(2) calls with valid signal numbers.
        unsafe {
            libc::kill(std::os::unix::process::parent_id() as i32, libc::SIGKILL);
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        unreachable!("killed")
    }
}

/// A scratch folder for one sample's journal and agent.
struct Scratch {
    dir: PathBuf,
    /// Runs durun under strace, counting its syncs into this file.
    strace: Option<PathBuf>,
}

impl Scratch {
    fn new(root: &Path, name: &str, sync: &str) -> Self {
        let dir = root.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        std::fs::write(
            dir.join("durun.toml"),
            format!(
                "[journal]\nsync = \"{sync}\"\n\n\
                 [tools.noop]\neffect = \"read\"\ncommand = [\"true\"]\n\n\
                 [tools.noop_mutate]\neffect = \"mutate\"\ncommand = [\"true\"]\n"
            ),
        )
        .expect("durun.toml");
        Self { dir, strace: None }
    }

    fn journal(&self) -> PathBuf {
        self.dir.join("journal.db")
    }

    fn durun(&self) -> Command {
        let mut command = match &self.strace {
            Some(log) => {
                let mut command = Command::new("strace");
                command
                    .args(["-f", "-qq", "-e", "trace=fsync,fdatasync", "-o"])
                    .arg(log)
                    .arg(env!("CARGO_BIN_EXE_durun"));
                command
            }
            None => Command::new(env!("CARGO_BIN_EXE_durun")),
        };
        command
            .current_dir(&self.dir)
            .env("DURUN_JOURNAL", self.journal())
            .env("DURUN_BENCH_OUT", self.dir.join("report.json"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        command
    }

    /// Runs the agent under `durun run` or `durun resume` and returns what
    /// it measured, with the time `durun` was started.
    fn agent(
        &self,
        args: &[&str],
        mode: &str,
        env: &[(&str, String)],
    ) -> (Value, u128, Option<i32>) {
        let agent = std::env::current_exe().expect("the bench's own path");
        let mut command = self.durun();
        command.arg("-q").args(args);
        if args[0] == "run" {
            command.arg("--").arg(agent);
        }
        command.env("DURUN_BENCH_AGENT", mode);
        for (name, value) in env {
            command.env(name, value);
        }
        if let Some(cpu) = env.iter().find(|(name, _)| *name == "DURUN_BENCH_PIN") {
            let cpu: usize = cpu.1.parse().expect("a CPU number");
            // durun and the agent (which inherits it) on one core: no
            // wake-up crosses cores.
            pin_child(&mut command, cpu);
        }
        let _ = std::fs::remove_file(self.dir.join("report.json"));
        let spawned_at = unix_ns();
        // durun's stderr (the task id, warnings) shows only on a failure.
        let output = command
            .stderr(Stdio::piped())
            .output()
            .expect("start durun");
        let status = output.status;
        if !matches!(status.code(), Some(0 | 3)) {
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
        }
        let report = std::fs::read_to_string(self.dir.join("report.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null);
        (report, spawned_at, status.code())
    }
}

fn us_per_step(report: &Value, steps: u64) -> f64 {
    report["elapsed_ns"].as_f64().expect("elapsed_ns") / 1000.0 / steps as f64
}

/// The floor: the same step body and one (or two) raw SQLite commits per
/// step, WAL, as `../shared/peers/floor` does, with durun's own SQLite.
fn floor(root: &Path, commits: u8, sync: &str, steps: u64) -> f64 {
    let dir = root.join("floor");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("floor dir");
    let conn = rusqlite::Connection::open(dir.join("floor.db")).expect("open");
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .expect("wal");
    conn.execute_batch(&format!(
        "PRAGMA synchronous={sync};
         CREATE TABLE steps (i INTEGER PRIMARY KEY, status TEXT NOT NULL, output TEXT);"
    ))
    .expect("schema");
    let mut counter = File::create(dir.join("counter")).expect("counter");
    let started = Instant::now();
    for i in 1..=steps {
        if commits == 2 {
            conn.execute_batch("BEGIN").expect("begin");
            conn.prepare_cached("INSERT OR REPLACE INTO steps VALUES (?1, 'pending', NULL)")
                .expect("prepare")
                .execute([i as i64])
                .expect("insert");
            conn.execute_batch("COMMIT").expect("commit");
        }
        let output = step_body(&mut counter, i);
        conn.execute_batch("BEGIN").expect("begin");
        conn.prepare_cached("INSERT OR REPLACE INTO steps VALUES (?1, 'done', ?2)")
            .expect("prepare")
            .execute(rusqlite::params![i as i64, output])
            .expect("insert");
        conn.execute_batch("COMMIT").expect("commit");
    }
    started.elapsed().as_secs_f64() * 1e6 / steps as f64
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    if samples.is_empty() {
        return f64::NAN;
    }
    samples[samples.len() / 2]
}

/// Rows of the table, in the order they were first sampled.
#[derive(Default)]
struct Table {
    rows: Vec<(String, Vec<f64>)>,
}

impl Table {
    fn add(&mut self, name: &str, value: f64) {
        match self.rows.iter_mut().find(|(row, _)| row == name) {
            Some((_, samples)) => samples.push(value),
            None => self.rows.push((name.to_owned(), vec![value])),
        }
    }

    fn get(&self, name: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|(row, _)| row == name)
            .map(|(_, samples)| median(samples.clone()))
    }
}

fn orchestrate() {
    let rounds: usize = env_or("DURUN_BENCH_ROUNDS", 5);
    let steps: u64 = env_or("DURUN_BENCH_STEPS", 1000);
    let replay_sizes: Vec<u64> = std::env::var("DURUN_BENCH_REPLAY")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|size| size.trim().parse().ok())
        .collect();
    let root = tempfile::Builder::new()
        .prefix("durun-bench-")
        .tempdir_in(std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from))
        .expect("temp dir");
    let root = root.path();
    let peers = Peers::find();
    let mut table = Table::default();

    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    eprintln!("durun bench: {rounds} rounds of {steps} steps");
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}");
        if cores >= 2 {
            table.add("pipe round trip one core", pipe_round_trip(2000, false));
            table.add("pipe round trip two cores", pipe_round_trip(2000, true));
        }
        for sync in ["full", "normal"] {
            table.add(
                &format!("floor 1 commit {sync}"),
                floor(root, 1, sync, steps),
            );
            table.add(
                &format!("floor 2 commits {sync}"),
                floor(root, 2, sync, steps),
            );
            for (mode, pinned) in [
                ("read", false),
                ("mutate", false),
                ("read", true),
                ("mutate", true),
            ] {
                let scratch = Scratch::new(root, mode, sync);
                let mut env = vec![("DURUN_BENCH_STEPS", steps.to_string())];
                let pin = if pinned { " one core" } else { "" };
                if pinned {
                    env.push(("DURUN_BENCH_PIN", "0".into()));
                }
                let (report, _, ok) = scratch.agent(&["run", "--task", "bench"], mode, &env);
                assert_eq!(ok, Some(0), "durun run failed");
                table.add(
                    &format!("durun {mode} {sync}{pin}"),
                    us_per_step(&report, steps),
                );
            }
        }
        // Tool calls: each one starts a process, so fewer steps.
        let calls = (steps / 4).max(8);
        table.add("spawn true", spawn_true(calls));
        for (mode, parallel) in [
            ("call", 1),
            ("call", 8),
            ("call_mutate", 1),
            ("call_mutate", 8),
        ] {
            let scratch = Scratch::new(root, mode, "full");
            let (report, _, ok) = scratch.agent(
                &["run", "--task", "bench"],
                mode,
                &[
                    ("DURUN_BENCH_STEPS", calls.to_string()),
                    ("DURUN_BENCH_PARALLEL", parallel.to_string()),
                ],
            );
            assert_eq!(ok, Some(0), "durun run failed");
            table.add(
                &format!("durun {mode} x{parallel} full"),
                us_per_step(&report, calls),
            );
        }
        if let Some(peers) = &peers {
            peers.first_runs(root, steps, &mut table);
        }
    }

    eprintln!("syncs per step (strace)");
    let syncs: Vec<(&str, Option<f64>)> = [
        ("`read` step (begin/commit)", "read", 1),
        ("`mutate` step (begin/commit)", "mutate", 1),
        ("`call`, `mutate` tool, one at a time", "call_mutate", 1),
        ("`call`, `mutate` tool, 8 at once", "call_mutate", 8),
    ]
    .into_iter()
    .map(|(name, mode, parallel)| (name, fsyncs_per_step(root, mode, parallel)))
    .collect();

    eprintln!("start-up of `durun run -- true`");
    let scratch = Scratch::new(root, "startup", "full");
    let mut startup = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        let status = scratch
            .durun()
            .args(["-q", "run", "--", "true"])
            .stderr(Stdio::null())
            .status()
            .expect("durun");
        assert!(status.success());
        startup.push(started.elapsed().as_secs_f64() * 1e3);
    }
    // The first run made the journal; the rest show a run on a journal
    // that exists.
    startup.remove(0);
    let startup_ms = median(startup);

    let mut replay_rows = Vec::new();
    // 1,000 steps always: the target for the time to the first new step.
    for &size in std::iter::once(&1000).chain(replay_sizes.iter().filter(|&&size| size != 1000)) {
        eprintln!("replay of {size} steps");
        replay_rows.push(replay(root, size, rounds.min(3)));
    }
    let crash = crash_recovery(root);
    let peer_crash = peers.as_ref().map(|peers| peers.crash(root));

    print_table(
        &table,
        &syncs,
        steps,
        startup_ms,
        &replay_rows,
        crash,
        peer_crash.as_ref(),
    );
}

struct ReplayRow {
    steps: u64,
    us_per_step: f64,
    first_new_ms: f64,
    peak_kib_first_run: u64,
    peak_kib_resume: u64,
    bytes_per_step: f64,
}

/// Records a task of `steps` read steps, then resumes it: every step is
/// replayed and one more runs.
fn replay(root: &Path, steps: u64, samples: usize) -> ReplayRow {
    let scratch = Scratch::new(root, &format!("replay-{steps}"), "normal");
    let (report, _, ok) = scratch.agent(
        &["run", "--task", "big"],
        "read",
        &[
            ("DURUN_BENCH_STEPS", steps.to_string()),
            ("DURUN_BENCH_EXIT", "3".into()),
        ],
    );
    assert_eq!(ok, Some(3), "recording {steps} steps failed");
    let peak_kib_first_run = report["durun_peak_kib"].as_u64().unwrap_or(0);
    let bytes_per_step =
        std::fs::metadata(scratch.journal()).map_or(0, |meta| meta.len()) as f64 / steps as f64;
    let mut per_step = Vec::new();
    let mut first_new = Vec::new();
    let mut peak = 0;
    for sample in 0..samples as u64 {
        let recorded = steps + sample;
        let (report, spawned_at, ok) = scratch.agent(
            &["resume", "big"],
            "read",
            &[
                ("DURUN_BENCH_STEPS", (recorded + 1).to_string()),
                ("DURUN_BENCH_REPLAY_STEPS", recorded.to_string()),
                ("DURUN_BENCH_EXIT", "3".into()),
            ],
        );
        assert_eq!(ok, Some(3), "resuming {steps} steps failed");
        // The agent's time covers the replayed steps and the new one.
        per_step.push(us_per_step(&report, recorded));
        let at: u128 = report["first_new_at_unix_ns"]
            .as_str()
            .and_then(|at| at.parse().ok())
            .expect("a new step ran");
        first_new.push((at - spawned_at) as f64 / 1e6);
        peak = peak.max(report["durun_peak_kib"].as_u64().unwrap_or(0));
    }
    ReplayRow {
        steps,
        us_per_step: median(per_step),
        first_new_ms: median(first_new),
        peak_kib_first_run,
        peak_kib_resume: peak,
        bytes_per_step,
    }
}

/// A 1,000-step task whose durun is killed with SIGKILL inside step 500,
/// then resumed: seconds from `durun resume` to the first step that runs.
fn crash_recovery(root: &Path) -> f64 {
    eprintln!("crash at step 500 of 1000, and resume");
    let mut samples = Vec::new();
    for _ in 0..3 {
        let scratch = Scratch::new(root, "crash", "full");
        let (_, _, ok) = scratch.agent(
            &["run", "--task", "crash"],
            "read",
            &[
                ("DURUN_BENCH_STEPS", "1000".into()),
                ("DURUN_BENCH_CRASH_AT", "500".into()),
            ],
        );
        assert_ne!(ok, Some(0), "the crash run should have been killed");
        let (report, spawned_at, ok) = scratch.agent(
            &["resume", "crash"],
            "read",
            &[
                ("DURUN_BENCH_STEPS", "1000".into()),
                ("DURUN_BENCH_REPLAY_STEPS", "499".into()),
            ],
        );
        assert_eq!(ok, Some(0), "resume after the crash failed");
        let at: u128 = report["first_new_at_unix_ns"]
            .as_str()
            .and_then(|at| at.parse().ok())
            .expect("a new step ran");
        samples.push((at - spawned_at) as f64 / 1e9);
        let counter = std::fs::read_to_string(scratch.dir.join("counter")).unwrap_or_default();
        let mut done: Vec<u64> = counter
            .lines()
            .filter_map(|line| line.split_whitespace().nth(1)?.parse().ok())
            .collect();
        done.sort_unstable();
        // Step 500 was killed before its body ran; nothing ran twice.
        assert_eq!(
            done,
            (1..=1000).collect::<Vec<_>>(),
            "a step ran twice or never"
        );
    }
    median(samples)
}

/// `../shared/peers`: DBOS and LangGraph running the same workflow.
struct Peers {
    dir: PathBuf,
    python: PathBuf,
}

/// The peer settings sampled each round: row name, script, flags.
const PEER_RUNS: &[(&str, &str, &[&str])] = &[
    ("DBOS full", "dbos_steps.py", &["--journal", "wal"]),
    (
        "DBOS normal",
        "dbos_steps.py",
        &["--journal", "wal", "--synchronous", "normal"],
    ),
    (
        "LangGraph full",
        "langgraph_steps.py",
        &["--api", "functional", "--durability", "sync"],
    ),
    (
        "LangGraph normal",
        "langgraph_steps.py",
        &[
            "--api",
            "functional",
            "--durability",
            "sync",
            "--synchronous",
            "normal",
        ],
    ),
];

impl Peers {
    fn find() -> Option<Self> {
        if std::env::var("DURUN_BENCH_PEERS").as_deref() == Ok("0") {
            return None;
        }
        let dir = std::env::var_os("DURUN_PEERS").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/peers"),
            PathBuf::from,
        );
        if !dir.join("dbos_steps.py").exists() {
            eprintln!(
                "no peers at {} (DURUN_PEERS): their rows are left out",
                dir.display()
            );
            return None;
        }
        let work = std::env::var_os("PEERS_WORK")
            .map_or_else(|| PathBuf::from("/tmp/durun-peers"), PathBuf::from);
        let python = work.join(".venv/bin/python");
        if !python.exists() {
            eprintln!("installing DBOS and LangGraph into {}", work.display());
            let made = Command::new("python3")
                .args(["-m", "venv"])
                .arg(work.join(".venv"))
                .status()
                .is_ok_and(|status| status.success())
                && Command::new(work.join(".venv/bin/pip"))
                    .args(["install", "-q", "-r"])
                    .arg(dir.join("requirements.txt"))
                    .status()
                    .is_ok_and(|status| status.success());
            if !made {
                eprintln!("could not install the peers: their rows are left out");
                return None;
            }
        }
        Some(Self { dir, python })
    }

    fn script(&self, root: &Path, script: &str, flags: &[&str], extra: &[&str]) -> Option<Value> {
        let db = root.join("peer").join("peer.sqlite");
        let output = Command::new(&self.python)
            .arg(self.dir.join(script))
            .args(flags)
            .args(extra)
            .arg("--db")
            .arg(&db)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let line = String::from_utf8_lossy(&output.stdout);
        let result: Value = serde_json::from_str(line.lines().last()?).ok()?;
        if !output.status.success() {
            eprintln!("{script} {flags:?} failed: {line}");
            return None;
        }
        Some(result)
    }

    fn first_runs(&self, root: &Path, steps: u64, table: &mut Table) {
        let steps = steps.to_string();
        for (name, script, flags) in PEER_RUNS {
            if let Some(result) = self.script(root, script, flags, &["--steps", &steps]) {
                if result["ok"] != true {
                    eprintln!("{name}: not every step ran once: {result}");
                    continue;
                }
                if let Some(us) = result["us_per_step"].as_f64() {
                    table.add(name, us);
                }
            }
        }
    }

    /// Seconds from the recovering process's start to its first step, after
    /// a SIGKILL inside step 500 of 1,000.
    fn crash(&self, root: &Path) -> Vec<PeerCrash> {
        let mut rows = Vec::new();
        for (name, script, flags) in [PEER_RUNS[0], PEER_RUNS[2]] {
            eprintln!("{name}: crash at step 500 of 1000, and recovery");
            let mut samples = Vec::new();
            let mut rerun = 0;
            for _ in 0..3 {
                let Some(result) = self.script(
                    root,
                    script,
                    flags,
                    &["--steps", "1000", "--crash-at", "500"],
                ) else {
                    continue;
                };
                if let Some(seconds) = result["recover_first_step_s"].as_f64() {
                    samples.push(seconds);
                }
                rerun = rerun.max(result["reexecuted_completed"].as_u64().unwrap_or(0));
            }
            if !samples.is_empty() {
                rows.push(PeerCrash {
                    name: name.split(' ').next().unwrap_or(name),
                    seconds: median(samples),
                    rerun,
                });
            }
        }
        rows
    }
}

/// A peer's recovery after a crash inside step 500 of 1,000.
struct PeerCrash {
    name: &'static str,
    seconds: f64,
    /// Steps that had finished before the crash and ran again (worst case).
    rerun: u64,
}

fn print_table(
    table: &Table,
    syncs: &[(&str, Option<f64>)],
    steps: u64,
    startup_ms: f64,
    replay: &[ReplayRow],
    crash_s: f64,
    peer_crash: Option<&Vec<PeerCrash>>,
) {
    let mut out = String::new();
    let ratio = |row: &str, floor: &str| match (table.get(row), table.get(floor)) {
        (Some(value), Some(floor)) => format!(
            "{value:.0} µs | {:.2}× | {:+.0} µs",
            value / floor,
            value - floor
        ),
        _ => "- | - | -".into(),
    };
    let _ = writeln!(
        out,
        "Per step, median of the rounds, {steps} steps a sample; a ratio is to the floor of the same sync mode (one commit; two for `mutate`).\n"
    );
    let _ = writeln!(out, "| what | sync | per step | × floor | over floor |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for (row, cores) in [
        ("pipe round trip one core", "both on one core"),
        ("pipe round trip two cores", "each on its own core"),
    ] {
        if let Some(trip) = table.get(row) {
            let _ = writeln!(
                out,
                "| a line to another process and back, {cores} (a `begin`/`commit` step makes two) | - | {trip:.0} µs | - | - |"
            );
        }
    }
    for sync in ["full", "normal"] {
        let one = format!("floor 1 commit {sync}");
        let two = format!("floor 2 commits {sync}");
        for (row, name, floor) in [
            (one.clone(), "SQLite floor, 1 commit", one.clone()),
            (two.clone(), "SQLite floor, 2 commits", two.clone()),
            (
                format!("durun read {sync}"),
                "durun `read` step (begin/commit)",
                one.clone(),
            ),
            (
                format!("durun mutate {sync}"),
                "durun `mutate` step (begin/commit)",
                two.clone(),
            ),
            (
                format!("durun read {sync} one core"),
                "durun `read` step, durun and agent on one core",
                one.clone(),
            ),
            (
                format!("durun mutate {sync} one core"),
                "durun `mutate` step, durun and agent on one core",
                two.clone(),
            ),
            (format!("DBOS {sync}"), "DBOS step (WAL)", one.clone()),
            (
                format!("LangGraph {sync}"),
                "LangGraph task (functional, sync)",
                one.clone(),
            ),
        ] {
            if table.get(&row).is_some() {
                let _ = writeln!(out, "| {name} | {sync} | {} |", ratio(&row, &floor));
            }
        }
    }
    if let Some(spawn) = table.get("spawn true") {
        let _ = writeln!(
            out,
            "| start the command `true` and wait for it (no durun) | - | {spawn:.0} µs | - | - |"
        );
    }
    for (row, name, floor) in [
        (
            "durun call x1 full",
            "durun `call`, `read` tool `true`, one at a time",
            "floor 1 commit full",
        ),
        (
            "durun call x8 full",
            "durun `call`, `read` tool `true`, 8 at once",
            "floor 1 commit full",
        ),
        (
            "durun call_mutate x1 full",
            "durun `call`, `mutate` tool `true`, one at a time",
            "floor 2 commits full",
        ),
        (
            "durun call_mutate x8 full",
            "durun `call`, `mutate` tool `true`, 8 at once",
            "floor 2 commits full",
        ),
    ] {
        let _ = writeln!(out, "| {name} | full | {} |", ratio(row, floor));
    }
    if syncs.iter().any(|(_, count)| count.is_some()) {
        let _ = writeln!(
            out,
            "\nSyncs to disk per step (`sync = \"full\"`), counted with strace; exact, not timed.\n"
        );
        let _ = writeln!(out, "| durun | fsyncs per step |");
        let _ = writeln!(out, "|---|---|");
        for (name, count) in syncs {
            if let Some(count) = count {
                let _ = writeln!(out, "| {name} | {count:.2} |");
            }
        }
    }
    let _ = writeln!(
        out,
        "\nReplay: resuming a task whose steps are all recorded; the agent asks for every step, then one new one.\n"
    );
    let _ = writeln!(
        out,
        "| recorded steps | replay per step | `resume` to first new step | durun peak memory, first run | durun peak memory, resume | journal per step |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for row in replay {
        let _ = writeln!(
            out,
            "| {} | {:.2} µs | {:.1} ms | {:.1} MiB | {:.1} MiB | {:.0} B |",
            row.steps,
            row.us_per_step,
            row.first_new_ms,
            row.peak_kib_first_run as f64 / 1024.0,
            row.peak_kib_resume as f64 / 1024.0,
            row.bytes_per_step,
        );
    }
    let _ = writeln!(
        out,
        "\nStart-up of `durun run -- true` on an existing journal: {startup_ms:.1} ms (median of 20).\n"
    );
    let _ = writeln!(
        out,
        "Crash inside step 500 of 1,000 (SIGKILL), then recovery in a new process: time to the first step that runs.\n"
    );
    let _ = writeln!(out, "| who | to first step | finished steps run again |");
    let _ = writeln!(out, "|---|---|---|");
    let _ = writeln!(
        out,
        "| durun (`durun resume`, from its start) | {crash_s:.3} s | 0 |"
    );
    for PeerCrash {
        name,
        seconds,
        rerun,
    } in peer_crash.into_iter().flatten()
    {
        let _ = writeln!(
            out,
            "| {name} (from after the interpreter's start) | {seconds:.3} s | {rerun} |"
        );
    }
    print!("{out}");
    let _ = std::io::stdout().flush();
}
