//! How `durun test` says what the trials showed: a table a person reads at
//! a glance, JSON for scripts, JUnit for CI.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{Map, Value, json};

use super::trial::Reference;
use super::verdict::{Judged, Status};
use crate::supervisor::Point;

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
