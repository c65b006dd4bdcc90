//! DBOS and LangGraph on the same workflow, from `benches/peers`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::{Table, median};

/// `benches/peers`: DBOS and LangGraph running the same workflow.
pub(crate) struct Peers {
    pub(crate) dir: PathBuf,
    pub(crate) python: PathBuf,
}

/// The peer settings sampled each round: row name, script, flags.
pub(crate) const PEER_RUNS: &[(&str, &str, &[&str])] = &[
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
    pub(crate) fn find() -> Option<Self> {
        if std::env::var("DURUN_BENCH_PEERS").as_deref() == Ok("0") {
            return None;
        }
        let dir = std::env::var_os("DURUN_PEERS").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers"),
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
                    // Its report on stderr: stdout is the bench's tables.
                    .stdout(std::io::stderr())
                    .status()
                    .is_ok_and(|status| status.success());
            if !made {
                eprintln!("could not install the peers: their rows are left out");
                return None;
            }
        }
        Some(Self { dir, python })
    }

    pub(crate) fn script(
        &self,
        root: &Path,
        script: &str,
        flags: &[&str],
        extra: &[&str],
    ) -> Option<Value> {
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

    pub(crate) fn first_runs(&self, root: &Path, steps: u64, table: &mut Table) {
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
    pub(crate) fn crash(&self, root: &Path) -> Vec<PeerCrash> {
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
pub(crate) struct PeerCrash {
    pub(crate) name: &'static str,
    pub(crate) seconds: f64,
    /// Steps that had finished before the crash and ran again (worst case).
    pub(crate) rerun: u64,
}
