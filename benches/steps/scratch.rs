//! A fresh journal and a durun to run the bench agent against it, and the
//! in-process SQLite floor.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

use crate::machine::pin_child;
use crate::{step_body, unix_ns};

/// A scratch folder for one sample's journal and agent.
pub(crate) struct Scratch {
    pub(crate) dir: PathBuf,
    /// Runs durun under strace, counting its syncs into this file.
    pub(crate) strace: Option<PathBuf>,
}

impl Scratch {
    pub(crate) fn new(root: &Path, name: &str, sync: &str) -> Self {
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

    pub(crate) fn journal(&self) -> PathBuf {
        self.dir.join("journal.db")
    }

    pub(crate) fn durun(&self) -> Command {
        self.durun_at(Path::new(env!("CARGO_BIN_EXE_durun")))
    }

    /// [`Scratch::durun`] with another build of durun.
    pub(crate) fn durun_at(&self, bin: &Path) -> Command {
        let mut command = match &self.strace {
            Some(log) => {
                let mut command = Command::new("strace");
                command
                    .args(["-f", "-qq", "-e", "trace=fsync,fdatasync", "-o"])
                    .arg(log)
                    .arg(bin);
                command
            }
            None => Command::new(bin),
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
    pub(crate) fn agent(
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

impl Scratch {
    /// Runs `benches/steps/sdk_agent.py` (the Python SDK, `lang`
    /// "python") or `sdk_agent.mjs` (the Node SDK, "node" or "node24")
    /// under `durun run --task sdk` or, with `resume`, resumes it; its
    /// loop's time per step.
    pub(crate) fn sdk_agent(
        &self,
        lang: &str,
        resume: bool,
        effect: &str,
        (warmup, steps): (u64, u64),
        exit: i32,
    ) -> f64 {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut command = self.durun();
        command.arg("-q");
        if resume {
            command.args(["resume", "sdk"]);
        } else if crate::languages::is_node(lang) {
            command
                .args(["run", "--task", "sdk", "--"])
                .arg(crate::languages::program(lang))
                .arg(repo.join("benches/steps/sdk_agent.mjs"));
        } else {
            command
                .args(["run", "--task", "sdk", "--", "python3"])
                .arg(repo.join("benches/steps/sdk_agent.py"));
        }
        let _ = std::fs::remove_file(self.dir.join("report.json"));
        let output = command
            .env("PYTHONPATH", repo.join("sdk/python"))
            .env("DURUN_BENCH_STEPS", steps.to_string())
            .env("DURUN_BENCH_WARMUP", warmup.to_string())
            .env("DURUN_BENCH_EFFECT", effect)
            .env("DURUN_BENCH_EXIT", exit.to_string())
            .stderr(Stdio::piped())
            .output()
            .expect("start durun");
        assert_eq!(
            output.status.code(),
            Some(exit),
            "the {lang} agent failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: Value = serde_json::from_str(
            &std::fs::read_to_string(self.dir.join("report.json")).expect("the agent's report"),
        )
        .expect("a JSON report");
        us_per_step(&report, steps)
    }
}

pub(crate) fn us_per_step(report: &Value, steps: u64) -> f64 {
    report["elapsed_ns"].as_f64().expect("elapsed_ns") / 1000.0 / steps as f64
}

/// The floor: the same step body and one (or two) raw SQLite commits per
/// step, WAL, with durun's own SQLite: the physical floor under every peer.
pub(crate) fn floor(root: &Path, commits: u8, sync: &str, steps: u64) -> f64 {
    floor_of(root, commits, sync, steps, 0)
}

/// The floor with `padding` more bytes in each step's output: one commit
/// of a row as large as a proxied call's record, whose pages the disk
/// writes whoever journals it.
pub(crate) fn floor_of(root: &Path, commits: u8, sync: &str, steps: u64, padding: usize) -> f64 {
    let pad = "x".repeat(padding);
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
        let mut output = step_body(&mut counter, i);
        output.push_str(&pad);
        conn.execute_batch("BEGIN").expect("begin");
        conn.prepare_cached("INSERT OR REPLACE INTO steps VALUES (?1, 'done', ?2)")
            .expect("prepare")
            .execute(rusqlite::params![i as i64, output])
            .expect("insert");
        conn.execute_batch("COMMIT").expect("commit");
    }
    started.elapsed().as_secs_f64() * 1e6 / steps as f64
}
