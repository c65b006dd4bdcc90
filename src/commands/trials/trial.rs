//! One run of the agent under durun, and one trial: a run killed at its
//! point, then resumed until the task ends, each in a scratch journal of
//! the trial's own.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::tape::{Content, Tape};
use crate::supervisor::Point;

/// The task id of the reference and of every trial: keys compare.
pub(super) const TASK: &str = "test";

/// How many times a trial is resumed before it counts as stuck.
pub(super) const MOST_RESUMES: usize = 5;

/// What every run of a test shares.
pub(super) struct Bench<'a> {
    pub(super) durun: PathBuf,
    pub(super) command: &'a [String],
    pub(super) config: Option<&'a Path>,
    pub(super) setup: Option<&'a str>,
    pub(super) check: Option<&'a str>,
    pub(super) tape: &'a Tape,
    pub(super) timeout: Duration,
    /// The reference's model steps, once it has run.
    pub(super) seeds: Option<PathBuf>,
    /// The tool calls that fail in trials, as `DURUN_TEST_FAULTS` takes them.
    pub(super) tool_faults: String,
    /// Set by SIGINT or SIGTERM: runs are ended, no trial starts.
    pub(super) interrupted: &'a std::sync::atomic::AtomicBool,
}

/// How one process of a run ended, and what it printed.
pub(super) struct Ran {
    pub(super) code: Option<i32>,
    pub(super) killed: bool,
    pub(super) timed_out: bool,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// A task's state as `inspect --json` shows it.
pub(super) struct Seen {
    pub(super) status: String,
    pub(super) output: Value,
    pub(super) steps: Vec<Value>,
    pub(super) tokens_spent: u64,
}

impl Seen {
    /// The finished model calls the journal holds, by content.
    pub(super) fn model_calls(&self) -> HashMap<Content, u64> {
        let mut calls = HashMap::new();
        for step in &self.steps {
            let name = step["name"].as_str().unwrap_or_default();
            if step["kind"] == "proxy"
                && step["status"] == "committed"
                && crate::config::MODEL_ROUTES
                    .iter()
                    .any(|route| name.starts_with(&format!("{route} ")))
            {
                let content = (
                    name.to_owned(),
                    step["args_hash"].as_str().unwrap_or_default().to_owned(),
                );
                *calls.entry(content).or_default() += 1;
            }
        }
        calls
    }

    /// The steps a trial answers from the reference, as
    /// [`crate::supervisor::Seeds`]: those that reported token usage
    /// (model calls the agent or an SDK's `wrap` journaled itself) and the
    /// SDKs' `durun.now`, `durun.random` and `durun.uuid`, values a task
    /// takes once by design.
    pub(super) fn seeds(&self) -> Value {
        let seeds: Vec<Value> = self
            .steps
            .iter()
            .filter(|step| {
                step["kind"] == "begin"
                    && step["status"] == "committed"
                    && (step["usage"].is_object()
                        || ["durun.now", "durun.random", "durun.uuid"]
                            .contains(&step["name"].as_str().unwrap_or_default()))
            })
            .map(|step| {
                serde_json::json!({
                    "name": step["name"],
                    "args_hash": step["args_hash"],
                    "output": step["output"],
                    "usage": step["usage"],
                })
            })
            .collect();
        Value::Array(seeds)
    }

    /// The finished steps, by name and args, in step order.
    pub(super) fn path(&self) -> Vec<(String, String)> {
        self.steps
            .iter()
            .filter(|step| step["status"] == "committed")
            .map(|step| {
                (
                    step["name"].as_str().unwrap_or_default().to_owned(),
                    step["args_hash"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }
}

impl Bench<'_> {
    /// `durun` on the scratch journal in `dir`, its model calls counted as
    /// `run`'s by the recorder.
    fn durun(&self, dir: &Path, run: &str) -> Command {
        let mut command = Command::new(&self.durun);
        command
            .arg("--journal")
            .arg(dir.join("journal.db"))
            .arg("-q")
            .env_remove("DURUN_JOURNAL")
            .env("DURUN_TEST_SCRATCH", dir)
            .env(crate::proxy::TAPE, self.tape.url(run))
            // For an agent run without the proxy: its clients go to the
            // recorder themselves.
            .env("OPENAI_BASE_URL", format!("{}/openai", self.tape.url(run)))
            .env(
                "ANTHROPIC_BASE_URL",
                format!("{}/anthropic", self.tape.url(run)),
            )
            .env(
                "GOOGLE_GEMINI_BASE_URL",
                format!("{}/gemini", self.tape.url(run)),
            )
            .env_remove(crate::supervisor::SEEDS)
            .stdin(Stdio::null());
        if let Some(seeds) = &self.seeds {
            command
                .env(crate::supervisor::SEEDS, seeds)
                .env(crate::supervisor::FAULTS, &self.tool_faults);
        } else {
            command.env_remove(crate::supervisor::FAULTS);
        }
        command
    }

    /// A new task: `durun run`, killed at `crash` if given.
    pub(super) fn run(&self, dir: &Path, run: &str, crash: Option<String>) -> Result<Ran> {
        let mut command = self.durun(dir, run);
        command.args(["run", "--task", TASK]);
        if let Some(config) = self.config {
            command.arg("--config").arg(config);
        }
        if let Some(crash) = crash {
            command.arg("--crash-at").arg(crash);
        }
        command.arg("--").args(self.command);
        self.wait(command, dir, "run")
    }

    /// `durun resume` of the task.
    pub(super) fn resume(&self, dir: &Path, run: &str, round: usize) -> Result<Ran> {
        let mut command = self.durun(dir, run);
        command.args(["resume", TASK]);
        self.wait(command, dir, &format!("resume-{round}"))
    }

    /// Runs `command` to its end, or kills it once the timeout is up; its
    /// prints go to files in `dir` (a pipe could fill and stall it).
    fn wait(&self, mut command: Command, dir: &Path, what: &str) -> Result<Ran> {
        let stdout_path = dir.join(format!("{what}.stdout"));
        let stderr_path = dir.join(format!("{what}.stderr"));
        command
            .stdout(std::fs::File::create(&stdout_path)?)
            .stderr(std::fs::File::create(&stderr_path)?);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", self.durun.display()))?;
        let deadline = Instant::now() + self.timeout;
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if self.interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("interrupted");
            }
            if Instant::now() >= deadline {
                timed_out = true;
                let _ = child.kill();
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Ok(Ran {
            code: status.code(),
            killed: status.signal() == Some(9) && !timed_out,
            timed_out,
            stdout: std::fs::read_to_string(&stdout_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
        })
    }

    /// The task as the journal in `dir` holds it.
    pub(super) fn inspect(&self, dir: &Path) -> Result<Seen> {
        let output = Command::new(&self.durun)
            .arg("--journal")
            .arg(dir.join("journal.db"))
            .args(["inspect", TASK, "--json"])
            .env_remove("DURUN_JOURNAL")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot start {}", self.durun.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "durun inspect failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let view: Value = serde_json::from_slice(&output.stdout)
            .context("durun inspect --json printed no JSON")?;
        let task = &view["task"];
        Ok(Seen {
            status: task["status"].as_str().unwrap_or_default().to_owned(),
            output: task["output"].clone(),
            steps: view["steps"].as_array().cloned().unwrap_or_default(),
            tokens_spent: task["runs"]
                .as_array()
                .map(|runs| {
                    runs.iter()
                        .filter_map(|run| run["tokens_spent"].as_u64())
                        .sum()
                })
                .unwrap_or_default(),
        })
    }

    /// Runs `--setup` or `--check` (a shell command) in the current
    /// directory; its stdout, or why it failed.
    pub(super) fn shell(script: &str, dir: &Path) -> Result<String, String> {
        let output = Command::new("sh")
            .args(["-c", script])
            .env("DURUN_TEST_SCRATCH", dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|err| format!("cannot start sh: {err}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "`{script}` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }
}

/// What the reference run left, to compare trials with.
pub(super) struct Reference {
    pub(super) seen: Seen,
    pub(super) stdout: String,
    pub(super) check: Option<String>,
    pub(super) took: Duration,
}

/// A trial's outcome before it is judged.
pub(super) struct Tried {
    pub(super) step: u64,
    pub(super) point: Point,
    /// Whether durun was killed at the point (a point after the agent's
    /// end is never reached).
    pub(super) killed: bool,
    pub(super) runs: Vec<Ran>,
    pub(super) seen: Option<Seen>,
    pub(super) check: Option<Result<String, String>>,
    pub(super) setup_failed: Option<String>,
    /// Model calls sent again although the journal held them finished.
    pub(super) resent: u64,
    /// Model calls asked both before the kill and after it, by name.
    pub(super) asked_again: Vec<String>,
    pub(super) misses: Vec<String>,
    pub(super) error: Option<String>,
}

/// The trial's name, by which the recorder knows its calls.
pub(super) fn run_name(step: u64, point: Point) -> String {
    format!("{step}-{}", point.as_str())
}

/// Runs one trial in `dir`: killed at `step`/`point`, resumed to the end.
pub(super) fn trial(
    bench: &Bench<'_>,
    dir: &Path,
    step: u64,
    point: Point,
    delay: Duration,
) -> Tried {
    let mut tried = Tried {
        step,
        point,
        killed: false,
        runs: Vec::new(),
        seen: None,
        check: None,
        setup_failed: None,
        resent: 0,
        asked_again: Vec::new(),
        misses: Vec::new(),
        error: None,
    };
    if let Err(err) = std::fs::create_dir_all(dir) {
        tried.error = Some(format!("cannot make {}: {err}", dir.display()));
        return tried;
    }
    if let Some(setup) = bench.setup
        && let Err(err) = Bench::shell(setup, dir)
    {
        tried.setup_failed = Some(err);
        return tried;
    }
    let name = run_name(step, point);
    let crash = format!("{step}:{}:{}", point.as_str(), delay.as_millis());
    if let Err(err) = run_trial(bench, dir, &name, crash, &mut tried) {
        tried.error = Some(format!("{err:#}"));
    }
    if let Some(check) = bench.check {
        tried.check = Some(Bench::shell(check, dir));
    }
    tried.misses = bench.tape.calls(&name).misses;
    tried
}

fn run_trial(
    bench: &Bench<'_>,
    dir: &Path,
    name: &str,
    crash: String,
    tried: &mut Tried,
) -> Result<()> {
    let first = bench.run(dir, name, Some(crash))?;
    tried.killed = first.killed;
    let killed = first.killed;
    tried.runs.push(first);
    if !killed {
        tried.seen = Some(bench.inspect(dir)?);
        return Ok(());
    }
    // Model calls durable at the kill must never reach the model again:
    // later runs may ask only for what the reference asked beyond them.
    let durable = bench.inspect(dir)?.model_calls();
    let before_calls = bench.tape.calls(name);
    let before = before_calls.seen;
    for round in 1..=MOST_RESUMES {
        let ran = bench.resume(dir, name, round)?;
        let again = ran.killed;
        tried.runs.push(ran);
        if !again {
            break;
        }
    }
    let seen = bench.inspect(dir)?;
    let reference_calls = bench.tape.calls("reference").seen;
    for (content, total) in bench.tape.calls(name).seen {
        let later = total - before.get(&content).copied().unwrap_or(0);
        let needed = reference_calls
            .get(&content)
            .copied()
            .unwrap_or(0)
            .saturating_sub(durable.get(&content).copied().unwrap_or(0));
        tried.resent += later.saturating_sub(needed);
    }
    // Asked before the kill (answered, or still in flight) and again
    // after it.
    for (content, total) in bench.tape.calls(name).received {
        let earlier = before_calls.received.get(&content).copied().unwrap_or(0);
        if earlier > 0 && total > earlier {
            tried.asked_again.push(content.0);
        }
    }
    tried.seen = Some(seen);
    Ok(())
}
