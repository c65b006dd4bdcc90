//! `durun test` (SPEC 14): crash-test an agent on purpose. A reference
//! run, then a trial per step and kill point, each killed there with
//! SIGKILL and resumed to its end in a scratch journal of its own, and a
//! verdict on whether every trial ended as the reference did.
//!
//! # Invariant
//!
//! The user's journal is never opened: every run here has `--journal` set
//! to a file in the scratch directory. Trials reach no model: their calls
//! go to the recorder ([`tape`]), which answers from the reference's.

mod report;
mod tape;
mod trial;
mod verdict;

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::cli::{FaultKind, TestArgs};
use crate::config::Config;
use crate::error::Failure;
use crate::settings::Settings;
use crate::supervisor::Point;
use rustix::process::Signal;
use tape::{Content, Tape};
use trial::{Bench, Reference};

/// The longest a run of the reference may take when `--timeout` is not
/// given: trials then get ten times the reference's time.
const REFERENCE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The exit of a test stopped by SIGINT or SIGTERM, as a shell reports a
/// process ended by SIGINT.
const INTERRUPTED: i32 = 128 + Signal::INT.as_raw();

/// The proxy config the recorder matches with: the trials' runs leave out
/// of matching what the agent's CLI changes on every call, and so does the
/// recorder they replay from.
fn recorded_as(config: &Config, command: &[String]) -> crate::config::ProxyConfig {
    let mut proxy = config.proxy.clone();
    if let Some((preset, _)) = crate::presets::find(command) {
        preset.extend_ignore(&mut proxy.ignore);
    }
    proxy
}

pub(crate) fn exec(args: &TestArgs, settings: &Settings) -> Result<i32> {
    let cwd = std::env::current_dir().context("failed to read the current directory")?;
    let (config, _) = Config::discover(args.config.as_deref(), &cwd)?;
    let mut points = if args.points.is_empty() {
        Point::ALL.to_vec()
    } else {
        args.points.clone()
    };
    points.sort();
    points.dedup();
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [Signal::INT.as_raw(), Signal::TERM.as_raw()] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))
            .context("cannot set up the signal handlers")?;
    }
    let scratch = Scratch::new(args.keep)?;
    let hold = args.timeout.unwrap_or(REFERENCE_TIMEOUT);
    let tape = Tape::start(&recorded_as(&config, &args.command), hold)
        .context("cannot start durun test's recorder")?;
    let mut bench = Bench {
        durun: std::env::current_exe().context("cannot find durun's own executable")?,
        command: &args.command,
        config: args.config.as_deref(),
        setup: args.setup.as_deref(),
        check: args.check.as_deref(),
        tape: &tape,
        timeout: hold,
        seeds: None,
        tool_faults: "[]".into(),
        interrupted: &interrupted,
    };
    let say = |line: &str| {
        if !settings.quiet {
            eprintln!("durun test: {line}");
        }
    };

    say("the reference run");
    let reference = reference(&bench, &scratch.path.join("reference"));
    if interrupted.load(Ordering::Relaxed) {
        eprintln!("durun: durun test was interrupted during the reference run");
        return Ok(INTERRUPTED);
    }
    let Some(reference) = reference? else {
        return Ok(1);
    };
    let reference_calls = tape.calls("reference").requests;
    if args.timeout.is_none() {
        bench.timeout = (reference.took * 10).max(Duration::from_secs(60));
    }

    let seeds = scratch.path.join("reference").join("model-steps.json");
    std::fs::write(&seeds, reference.seen.seeds().to_string())
        .with_context(|| format!("cannot write {}", seeds.display()))?;
    bench.seeds = Some(seeds);
    let (faults, tool_faults) = faults(&args.fault, &reference, &tape)?;
    let faulted = !faults.is_empty() || !tool_faults.is_empty();
    tape.replay(faults);
    bench.tool_faults = serde_json::Value::Array(tool_faults).to_string();
    let plan = plan(&reference, args.steps, &points);
    let model_calls =
        reference_calls as usize + reference.seen.seeds().as_array().map_or(0, Vec::len);
    say(&format!(
        "{} steps in {} ms, {model_calls} model call{} recorded (the trials get their answers); {} trials, {} at a time",
        reference.seen.steps.len(),
        reference.took.as_millis(),
        if model_calls == 1 { "" } else { "s" },
        plan.len(),
        args.jobs
    ));
    let judged = run_trials(
        &bench,
        &reference,
        &plan,
        &scratch.path,
        (args.jobs, faulted),
        settings.quiet,
    );

    if interrupted.load(Ordering::Relaxed) {
        eprintln!(
            "durun: durun test was interrupted; {} of {} trials had run",
            judged.iter().filter(|trial| !trial.interrupted).count(),
            plan.len()
        );
        return Ok(INTERRUPTED);
    }
    if args.json {
        println!("{}", report::json(&judged, &reference, reference_calls));
    } else {
        print!(
            "{}",
            report::table(&judged, &points, &report::Again { args })
        );
        println!("\n{}", report::verdict(&judged, args.check.is_some()));
    }
    if let Some(path) = &args.junit {
        std::fs::write(path, report::junit(&judged))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let held = !judged.iter().any(|trial| trial.status.broke());
    Ok(i32::from(!held))
}

/// The reference run, or `None` (said on stderr) when it did not complete:
/// an agent must finish once before its crashes mean anything.
fn reference(bench: &Bench<'_>, dir: &Path) -> Result<Option<Reference>> {
    std::fs::create_dir_all(dir)?;
    if let Some(setup) = bench.setup
        && let Err(err) = Bench::shell(setup, dir)
    {
        eprintln!("durun: --setup failed before the reference run: {err}");
        return Ok(None);
    }
    let started = Instant::now();
    let ran = bench.run(dir, "reference", None)?;
    let took = started.elapsed();
    let seen = bench.inspect(dir).ok();
    let completed = seen.as_ref().is_some_and(|seen| seen.status == "completed");
    if ran.code != Some(0) || !completed {
        eprintln!(
            "durun: the reference run did not complete ({}): an agent must run to its end once before it can be crash-tested",
            match (ran.timed_out, ran.code) {
                (true, _) => "it took longer than --timeout".to_owned(),
                (false, Some(code)) => format!("exit {code}"),
                (false, None) => "killed by a signal".to_owned(),
            }
        );
        for line in ran
            .stderr
            .lines()
            .rev()
            .take(10)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            eprintln!("  {line}");
        }
        return Ok(None);
    }
    let check = match bench.check {
        Some(check) => match Bench::shell(check, dir) {
            Ok(out) => Some(out),
            Err(err) => {
                eprintln!("durun: --check failed after the reference run: {err}");
                return Ok(None);
            }
        },
        None => None,
    };
    Ok(Some(Reference {
        seen: seen.expect("checked above"),
        stdout: ran.stdout,
        check,
        took,
    }))
}

/// How long after a held model call's start (`during`) durun is killed.
const HELD_CALL_KILL: Duration = Duration::from_millis(100);

/// A trial to run: the step, its name, the point, and for `during` how long
/// after the step's start durun is killed.
struct Planned {
    step: u64,
    name: String,
    point: Point,
    delay: Duration,
    /// A `during` trial at a model call: the call the recorder holds while
    /// durun is killed.
    held: Option<Content>,
}

fn plan(reference: &Reference, steps: Option<(u64, u64)>, points: &[Point]) -> Vec<Planned> {
    let (first, last) = steps.unwrap_or((1, u64::MAX));
    let mut plan = Vec::new();
    for step in &reference.seen.steps {
        let Some(number) = step["step"].as_u64() else {
            continue;
        };
        if number < first || number > last || step["status"] != "committed" {
            continue;
        }
        let took = match (step["started_at"].as_str(), step["finished_at"].as_str()) {
            (Some(started), Some(finished)) => humantime::parse_rfc3339_weak(finished)
                .ok()
                .zip(humantime::parse_rfc3339_weak(started).ok())
                .and_then(|(finished, started)| finished.duration_since(started).ok())
                .unwrap_or_default(),
            _ => Duration::ZERO,
        };
        let model_call = step["kind"] == "proxy";
        for &point in points {
            let held = (point == Point::During && model_call).then(|| {
                (
                    step["name"].as_str().unwrap_or_default().to_owned(),
                    step["args_hash"].as_str().unwrap_or_default().to_owned(),
                )
            });
            plan.push(Planned {
                step: number,
                name: step["name"].as_str().unwrap_or_default().to_owned(),
                point,
                // A held call is in flight until durun dies: time for the
                // request to reach the recorder.
                delay: if held.is_some() {
                    HELD_CALL_KILL
                } else {
                    took / 2
                },
                held,
            });
        }
    }
    plan
}

/// `--fault KIND@STEP`: each at the model call the reference made at that
/// step (made by the recorder), or at its tool call (made by durun in
/// place of the tool: `DURUN_TEST_FAULTS`).
fn faults(
    asked: &[(FaultKind, u64)],
    reference: &Reference,
    tape: &Tape,
) -> Result<(HashMap<Content, FaultKind>, Vec<serde_json::Value>)> {
    use clap::ValueEnum as _;
    let mut faults = HashMap::new();
    let mut tools = Vec::new();
    for &(kind, step) in asked {
        let found = reference
            .seen
            .steps
            .iter()
            .find(|recorded| recorded["step"].as_u64() == Some(step));
        let Some(found) = found else {
            return Err(Failure::usage(format!(
                "--fault at step {step}: the reference run has {} steps",
                reference.seen.steps.len()
            ))
            .into());
        };
        let content = (
            found["name"].as_str().unwrap_or_default().to_owned(),
            found["args_hash"].as_str().unwrap_or_default().to_owned(),
        );
        if found["kind"] == "call" {
            let name = kind
                .to_possible_value()
                .map(|value| value.get_name().to_owned())
                .unwrap_or_default();
            tools.push(serde_json::json!({
                "name": content.0, "args_hash": content.1, "kind": name,
            }));
            continue;
        }
        if found["kind"] != "proxy" || !tape.has(&content) {
            return Err(Failure::usage(format!(
                "--fault at step {step}: step {step} (`{}`) is neither a model call through durun's proxy nor a tool durun runs",
                content.0
            ))
            .hint("faults are made at model calls and at `call`s of tools from durun.toml")
            .into());
        }
        faults.insert(content, kind);
    }
    Ok((faults, tools))
}

/// Runs the plan, `jobs` trials at a time, with a progress bar on a
/// terminal (a line per trial elsewhere); the trials judged, in the
/// plan's order.
fn run_trials(
    bench: &Bench<'_>,
    reference: &Reference,
    plan: &[Planned],
    scratch: &Path,
    (jobs, faulted): (u32, bool),
    quiet: bool,
) -> Vec<verdict::Judged> {
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(plan.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner:.cyan} [{elapsed_precise}] {bar:30} {pos}/{len} trials · {msg}",
            )
            .expect("the template is valid"),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<verdict::Judged>>> =
        Mutex::new(plan.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    if bench.interrupted.load(Ordering::Relaxed) {
                        return;
                    }
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(planned) = plan.get(index) else {
                        return;
                    };
                    let dir = scratch.join(format!("{}-{}", planned.step, planned.point.as_str()));
                    if let Some(content) = &planned.held {
                        bench.tape.hold_during(
                            &trial::run_name(planned.step, planned.point),
                            content.clone(),
                        );
                    }
                    let tried =
                        trial::trial(bench, &dir, planned.step, planned.point, planned.delay);
                    let judged = verdict::judge(&tried, reference, &planned.name, faulted);
                    let line = format!(
                        "step {} `{}` killed {}: {}",
                        planned.step,
                        planned.name,
                        planned.point.as_str(),
                        judged.status.as_str()
                    );
                    let count = done.fetch_add(1, Ordering::Relaxed) + 1;
                    match &bar {
                        Some(bar) => {
                            bar.set_message(line);
                            bar.inc(1);
                        }
                        None if !quiet => eprintln!("durun test: {count}/{} {line}", plan.len()),
                        None => {}
                    }
                    results.lock().expect("results lock")[index] = Some(judged);
                }
            });
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    results
        .into_inner()
        .expect("results lock")
        .into_iter()
        .flatten()
        .collect()
}

/// The scratch directory: removed when dropped, whatever ended the test
/// (a verdict, a usage error, a run that could not start), unless
/// `--keep` (then its path is said).
struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Scratch {
    fn new(keep: bool) -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let path =
            std::env::temp_dir().join(format!("durun-test-{}-{nanos:08x}", std::process::id()));
        // 0700: the journals hold what the agent's tools returned.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("cannot make the scratch directory {}", path.display()))?;
        Ok(Self { path, keep })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "durun test: the scratch journals are in {}",
                self.path.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
