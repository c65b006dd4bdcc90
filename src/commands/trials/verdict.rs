//! What each trial shows against the reference: the judgement of a trial
//! (its status, its problems, what ran again). How the test says it is
//! `report`.

use std::collections::HashMap;

use serde_json::Value;

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
