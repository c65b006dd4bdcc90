//! What each trial shows against the reference, and how the test says it:
//! a table a person reads at a glance, JSON for scripts, JUnit for CI.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use super::trial::{Ran, Reference, Seen, Tried};
use crate::supervisor::Point;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Ok,
    /// The trial ran to its end without reaching its kill point: it shows
    /// nothing about a crash there (SPEC 18), and is not `ok`.
    NotReached,
    Diverged,
    Failed,
}

impl Status {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::NotReached => "not reached",
            Status::Diverged => "diverged",
            Status::Failed => "failed",
        }
    }

    /// Whether the agent did not hold: what makes `durun test` exit 1.
    pub(super) fn broke(self) -> bool {
        matches!(self, Status::Diverged | Status::Failed)
    }
}

/// A trial, judged.
pub(super) struct Judged {
    pub(super) step: u64,
    pub(super) point: Point,
    pub(super) name: String,
    pub(super) status: Status,
    pub(super) killed: bool,
    pub(super) resent: u64,
    pub(super) tokens_respent: u64,
    /// Each `mutate` step: its key and how many attempts carried it.
    pub(super) mutate_keys: Vec<(u64, String, String, u64)>,
    /// What went wrong, a line each (a diff, outputs, the error).
    pub(super) problems: Vec<String>,
    /// Worth knowing, not wrong (a mutate step sent twice with one key).
    pub(super) notes: Vec<String>,
    /// Cut short by SIGINT or SIGTERM: not a verdict.
    pub(super) interrupted: bool,
    /// The model calls and tool steps that ran again on resume, as said
    /// (a model call asked before the kill and again after it; a tool step
    /// that took another attempt).
    pub(super) ran_again: Vec<String>,
}

/// Judges `tried` against the reference. `faulted`: a fault was made, so
/// the failed attempts it left shift the steps' numbers, and with them
/// the keys: they are not compared with the reference's.
pub(super) fn judge(tried: &Tried, reference: &Reference, name: &str, faulted: bool) -> Judged {
    let mut findings = Findings::default();
    findings.runs(tried);
    let mut mutate_keys = Vec::new();
    let mut tokens_respent = 0;
    if let Some(seen) = &tried.seen {
        let last = tried.runs.last();
        findings.ending(seen, last, reference);
        mutate_keys = findings.keys(seen, reference, faulted);
        tokens_respent = seen
            .tokens_spent
            .saturating_sub(reference.seen.tokens_spent);
    }
    findings.check(tried, reference);
    let mut ran_again: Vec<String> = tried
        .asked_again
        .iter()
        .map(|name| format!("`{name}`"))
        .collect();
    ran_again.sort();
    ran_again.dedup();
    ran_again.extend(tried.seen.as_ref().map(tools_again).unwrap_or_default());
    let Findings {
        mut failed,
        diverged,
        notes,
    } = findings;
    // A failure is the cause when there is one (a tool that created twice
    // also changes the output).
    let status = if !failed.is_empty() {
        Status::Failed
    } else if !diverged.is_empty() {
        Status::Diverged
    } else if !tried.killed {
        Status::NotReached
    } else {
        Status::Ok
    };
    failed.extend(diverged);
    Judged {
        step: tried.step,
        point: tried.point,
        name: name.to_owned(),
        status,
        killed: tried.killed,
        resent: tried.resent,
        tokens_respent,
        mutate_keys,
        interrupted: tried.error.as_deref() == Some("interrupted"),
        problems: failed,
        notes,
        ran_again,
    }
}

/// The tool steps of a trial's journal that took more than one attempt:
/// they ran again on resume.
fn tools_again(seen: &Seen) -> Vec<String> {
    seen.steps
        .iter()
        .filter(|step| {
            matches!(step["kind"].as_str(), Some("mcp" | "call" | "begin"))
                && step["attempts"].as_u64().unwrap_or(1) > 1
        })
        .map(|step| {
            format!(
                "step {} `{}`",
                step["step"].as_u64().unwrap_or(0),
                step["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// What a trial's checks found: failures, divergences from the
/// reference, and notes that are neither.
#[derive(Default)]
struct Findings {
    failed: Vec<String>,
    diverged: Vec<String>,
    notes: Vec<String>,
}

impl Findings {
    /// How the trial's runs went: an error, a setup that failed, a run out
    /// of time or diverged, model calls sent again.
    fn runs(&mut self, tried: &Tried) {
        if let Some(err) = &tried.error {
            self.failed.push(err.clone());
        }
        if let Some(err) = &tried.setup_failed {
            self.failed.push(format!("--setup: {err}"));
        }
        if let Some(last) = tried.runs.last() {
            if last.timed_out {
                self.failed.push(
                    "a run did not end in time (see --timeout): the agent may wait for something a resumed run never gets".into(),
                );
            } else if last.code == Some(crate::exit_code::DIVERGENCE) {
                self.diverged.extend(last.stderr.lines().map(str::to_owned));
            } else if tried.killed && tried.runs.len() > super::trial::MOST_RESUMES {
                self.failed
                    .push("still not finished after the resumes a trial gets".into());
            }
        }
        self.diverged.extend(tried.misses.iter().cloned());
        if tried.resent > 0 {
            self.failed.push(format!(
                "{} finished model call{} sent again",
                tried.resent,
                if tried.resent == 1 { " was" } else { "s were" }
            ));
        }
    }

    /// How the task ended against the reference: its status, its output,
    /// what the agent printed, the path of its steps.
    fn ending(&mut self, seen: &Seen, last: Option<&Ran>, reference: &Reference) {
        if seen.status != "completed" && self.diverged.is_empty() {
            let code = last.and_then(|last| last.code);
            self.failed.push(format!(
                "the task ended {} (exit {}), the reference completed",
                seen.status,
                code.map_or("by a signal".into(), |code| code.to_string())
            ));
            if let Some(last) = last {
                self.failed.extend(tail(&last.stderr, 5));
            }
        }
        if seen.status == "completed" {
            if seen.output != reference.seen.output {
                self.diverged.push(format!(
                    "the task's output: {} (reference: {})",
                    seen.output, reference.seen.output
                ));
            }
            if let Some(last) = last
                && last.stdout != reference.stdout
            {
                self.diverged
                    .push("the agent printed something else than in the reference:".into());
                self.diverged
                    .extend(line_diff(&reference.stdout, &last.stdout));
            }
            self.diverged
                .extend(path_diff(&reference.seen.path(), &seen.path()));
        }
    }

    /// Each mutate step's key against the reference's (unless a fault
    /// shifted the numbers), and a note for each one attempted more than
    /// once; the mutate steps' numbers, names, keys and attempts.
    fn keys(
        &mut self,
        seen: &Seen,
        reference: &Reference,
        faulted: bool,
    ) -> Vec<(u64, String, String, u64)> {
        let mut mutate_keys = Vec::new();
        let reference_keys: HashMap<(String, String), String> = reference
            .seen
            .steps
            .iter()
            .map(|step| {
                (
                    (text(&step["name"]), text(&step["args_hash"])),
                    text(&step["idempotency_key"]),
                )
            })
            .collect();
        for step in &seen.steps {
            if step["effect"] != "mutate" {
                continue;
            }
            let number = step["step"].as_u64().unwrap_or_default();
            let (name, key) = (text(&step["name"]), text(&step["idempotency_key"]));
            let attempts = step["attempts"].as_u64().unwrap_or(1);
            match reference_keys.get(&(name.clone(), text(&step["args_hash"]))) {
                Some(expected) if *expected != key && !faulted => self.failed.push(format!(
                    "step {number} `{name}` carried key {key}, the reference's {expected}: a retry would be a new call"
                )),
                _ => {}
            }
            if attempts > 1 {
                self.notes.push(format!(
                    "step {number} `{name}` was attempted {attempts} times, each with key {key}: the tool must deduplicate by it"
                ));
            }
            mutate_keys.push((number, name, key, attempts));
        }
        mutate_keys
    }

    /// What `--check` printed against the reference's.
    fn check(&mut self, tried: &Tried, reference: &Reference) {
        match (&tried.check, &reference.check) {
            (Some(Err(err)), _) => self.failed.push(format!("--check: {err}")),
            (Some(Ok(got)), Some(expected)) if got != expected => {
                self.failed.push(
                    "--check printed another state of the world than after the reference:".into(),
                );
                self.failed.extend(line_diff(expected, got));
            }
            _ => {}
        }
    }
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

fn tail(text: &str, lines: usize) -> Vec<String> {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|line| format!("  {line}"))
        .collect()
}

/// The lines of `got` that differ from `expected`, `-`/`+`, at most 10.
fn line_diff(expected: &str, got: &str) -> Vec<String> {
    let (a, b): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), got.lines().collect());
    let mut lines = Vec::new();
    for i in 0..a.len().max(b.len()) {
        match (a.get(i), b.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => {
                if let Some(x) = x {
                    lines.push(format!("  - {x}"));
                }
                if let Some(y) = y {
                    lines.push(format!("  + {y}"));
                }
            }
        }
        if lines.len() >= 10 {
            break;
        }
    }
    lines
}

/// The finished steps one side has and the other lacks, by name and args.
fn path_diff(reference: &[(String, String)], trial: &[(String, String)]) -> Vec<String> {
    let mut count: HashMap<&(String, String), i64> = HashMap::new();
    for step in reference {
        *count.entry(step).or_default() += 1;
    }
    for step in trial {
        *count.entry(step).or_default() -= 1;
    }
    let mut lines: Vec<String> = count
        .into_iter()
        .filter(|(_, n)| *n != 0)
        .map(|((name, hash), n)| {
            let short = &hash[..hash.len().min(12)];
            if n > 0 {
                format!("  - step `{name}` (args {short}) finished in the reference only")
            } else {
                format!("  + step `{name}` (args {short}) finished in the trial only")
            }
        })
        .collect();
    lines.sort();
    lines.truncate(10);
    lines
}

/// The human report: a row per step, a column per point, then what went
/// wrong, then the verdict.
pub(super) fn table(judged: &[Judged], points: &[Point], again: &Again<'_>) -> String {
    let mut out = String::new();
    let mut steps: Vec<(u64, &str)> = judged
        .iter()
        .map(|trial| (trial.step, trial.name.as_str()))
        .collect();
    steps.dedup();
    let cells: HashMap<(u64, Point), &Judged> = judged
        .iter()
        .map(|trial| ((trial.step, trial.point), trial))
        .collect();
    let name_width = steps
        .iter()
        .map(|(_, name)| name.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 40);
    // Each column as wide as its widest cell, so that the rows line up.
    let widths: Vec<usize> = points
        .iter()
        .map(|point| {
            judged
                .iter()
                .filter(|trial| trial.point == *point)
                .map(|trial| cell(trial).chars().count())
                .max()
                .unwrap_or(1)
                .max(point.as_str().len())
        })
        .collect();
    let _ = write!(out, "{:>4}  {:<name_width$}", "STEP", "NAME");
    for (point, width) in points.iter().zip(&widths) {
        let _ = write!(out, "  {:<width$}", point.as_str().to_uppercase());
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    for (step, name) in &steps {
        let shown: String = name.chars().take(name_width).collect();
        let _ = write!(out, "{step:>4}  {shown:<name_width$}");
        for (point, width) in points.iter().zip(&widths) {
            let cell = cells
                .get(&(*step, *point))
                .map_or("-".into(), |trial| cell(trial));
            let _ = write!(out, "  {cell:<width$}");
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    }
    failures(&mut out, judged, again);
    let again_lines: Vec<String> = judged
        .iter()
        .filter(|trial| !trial.status.broke() && !trial.ran_again.is_empty())
        .map(|trial| {
            format!(
                "  step {} killed {}: {}",
                trial.step,
                trial.point.as_str(),
                trial.ran_again.join(", ")
            )
        })
        .collect();
    if !again_lines.is_empty() {
        out.push_str("\nran again on resume (in flight at the kill):\n");
        for line in again_lines {
            out.push_str(&line);
            out.push('\n');
        }
    }
    let mut notes: Vec<&String> = judged.iter().flat_map(|trial| &trial.notes).collect();
    notes.sort();
    notes.dedup();
    if !notes.is_empty() {
        out.push('\n');
        for note in notes {
            let _ = writeln!(out, "note: {note}");
        }
    }
    out
}

/// What went wrong, once for trials that went wrong the same way: the
/// trials, the problems, what ran again, and the command that reproduces
/// the first.
fn failures(out: &mut String, judged: &[Judged], again: &Again<'_>) {
    let mut groups: Vec<Vec<&Judged>> = Vec::new();
    for trial in judged.iter().filter(|trial| trial.status.broke()) {
        match groups
            .iter_mut()
            .find(|group| group[0].status == trial.status && group[0].problems == trial.problems)
        {
            Some(group) => group.push(trial),
            None => groups.push(vec![trial]),
        }
    }
    for group in groups {
        // `step 1 `NAME`, killed before, during; step 2 `NAME`, killed after`
        let mut trials: Vec<String> = Vec::new();
        for trial in &group {
            match trials.last_mut() {
                Some(last) if last.starts_with(&format!("step {} `", trial.step)) => {
                    let _ = write!(last, ", {}", trial.point.as_str());
                }
                _ => trials.push(format!(
                    "step {} `{}`, killed {}",
                    trial.step,
                    trial.name,
                    trial.point.as_str()
                )),
            }
        }
        let _ = writeln!(out, "\n{}: {}", trials.join("; "), group[0].status.as_str());
        for problem in &group[0].problems {
            let _ = writeln!(out, "  {problem}");
        }
        for trial in group.iter().filter(|trial| !trial.ran_again.is_empty()) {
            let _ = writeln!(
                out,
                "  ran again (killed {} {}): {}",
                trial.point.as_str(),
                trial.step,
                trial.ran_again.join(", ")
            );
        }
        let _ = writeln!(out, "  again: {}", again.for_trial(group[0]));
    }
}

fn cell(trial: &Judged) -> String {
    let mut cell = trial.status.as_str().to_owned();
    if trial.resent > 0 {
        let _ = write!(cell, " resent {}", trial.resent);
    }
    if let Some(most) = trial.mutate_keys.iter().map(|key| key.3).max()
        && most > 1
    {
        let _ = write!(cell, " key×{most}");
    }
    cell
}

/// The line that says how it went, and what it did not try: kill points
/// never reached, side effects never compared (no `--check`).
pub(super) fn verdict(judged: &[Judged], checked: bool) -> String {
    let count = |status: Status| judged.iter().filter(|trial| trial.status == status).count();
    let bad = judged.iter().filter(|trial| trial.status.broke()).count();
    let (held, unreached) = (count(Status::Ok), count(Status::NotReached));
    let mut verdict = if judged.is_empty() {
        return "no trials: the reference run made no steps to crash at".into();
    } else if bad > 0 {
        format!("{bad} of {} trials did not hold", judged.len())
    } else if unreached == 0 {
        format!("all {held} trials held: the agent survives a crash at every step tried")
    } else {
        format!(
            "{held} of {} trials held: the agent survives a crash at every step tried",
            judged.len()
        )
    };
    if unreached > 0 {
        let _ = write!(
            verdict,
            "\n{unreached} kill point{} not reached: the agent ran on past {} without a crash, which shows nothing",
            if unreached == 1 { " was" } else { "s were" },
            if unreached == 1 { "it" } else { "them" }
        );
    }
    if !checked {
        verdict.push_str(
            "\nside effects were not checked: give --check CMD, a command that prints the state of the world, to compare it after each trial",
        );
    }
    verdict
}

/// How to run one trial again: `durun test` with its step and point and
/// what else this one was given.
pub(super) struct Again<'a> {
    pub(super) args: &'a crate::cli::TestArgs,
}

impl Again<'_> {
    fn for_trial(&self, trial: &Judged) -> String {
        let args = self.args;
        let mut words = vec![
            "durun".to_owned(),
            "test".to_owned(),
            "--steps".to_owned(),
            trial.step.to_string(),
            "--points".to_owned(),
            trial.point.as_str().to_owned(),
        ];
        let mut option = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                words.extend([name.to_owned(), value]);
            }
        };
        option("--check", args.check.clone());
        option("--setup", args.setup.clone());
        option(
            "--config",
            args.config.as_ref().map(|path| path.display().to_string()),
        );
        option(
            "--timeout",
            args.timeout
                .map(|timeout| humantime::format_duration(timeout).to_string()),
        );
        for (kind, step) in &args.fault {
            let kind = clap::ValueEnum::to_possible_value(kind)
                .map(|value| value.get_name().to_owned())
                .unwrap_or_default();
            option("--fault", Some(format!("{kind}@{step}")));
        }
        words.push("--".to_owned());
        words.extend(args.command.iter().cloned());
        crate::task::shell_words(&words)
    }
}

/// `--json`.
pub(super) fn json(judged: &[Judged], reference: &Reference, reference_calls: u64) -> Value {
    let trials: Vec<Value> = judged
        .iter()
        .map(|trial| {
            let keys: Map<String, Value> = trial
                .mutate_keys
                .iter()
                .map(|(step, name, key, attempts)| {
                    (
                        step.to_string(),
                        json!({"name": name, "key": key, "attempts": attempts}),
                    )
                })
                .collect();
            json!({
                "step": trial.step,
                "name": trial.name,
                "point": trial.point.as_str(),
                "status": trial.status.as_str(),
                "ok": trial.status == Status::Ok,
                "reached": trial.status != Status::NotReached,
                "killed": trial.killed,
                "resent_model_calls": trial.resent,
                "ran_again": trial.ran_again,
                "tokens_respent": trial.tokens_respent,
                "mutate_keys": keys,
                "diff": if trial.problems.is_empty() { Value::Null } else { json!(trial.problems) },
                "notes": trial.notes,
            })
        })
        .collect();
    json!({
        "ok": !judged.iter().any(|trial| trial.status.broke()),
        "reference": {
            "steps": reference.seen.steps.len(),
            "output": reference.seen.output,
            "model_calls": reference_calls,
            "tokens_spent": reference.seen.tokens_spent,
            "took_ms": reference.took.as_millis() as u64,
        },
        "trials": trials,
    })
}

/// `--junit FILE`: a test case per trial.
pub(super) fn junit(judged: &[Judged]) -> String {
    let failures = judged.iter().filter(|trial| trial.status.broke()).count();
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"durun test\" tests=\"{}\" failures=\"{failures}\">\n",
        judged.len()
    );
    for trial in judged {
        let _ = write!(
            out,
            "<testcase classname=\"durun test\" name=\"{}\">",
            xml(&format!(
                "step {} {} killed {}",
                trial.step,
                trial.name,
                trial.point.as_str()
            ))
        );
        if trial.status == Status::NotReached {
            out.push_str("<skipped message=\"the kill point was not reached\"/>");
        } else if trial.status.broke() {
            let _ = write!(
                out,
                "<failure message=\"{}\">{}</failure>",
                trial.status.as_str(),
                xml(&trial.problems.join("\n"))
            );
        }
        out.push_str("</testcase>\n");
    }
    out.push_str("</testsuite>\n</testsuites>\n");
    out
}

fn xml(text: &str) -> String {
    text.chars()
        .filter(|&c| c == '\n' || c == '\t' || !c.is_control())
        .fold(String::new(), |mut out, c| {
            match c {
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                '&' => out.push_str("&amp;"),
                '"' => out.push_str("&quot;"),
                _ => out.push(c),
            }
            out
        })
}
