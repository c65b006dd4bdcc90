//! `durun diff TASK_A TASK_B` (SPEC 20): two tasks' steps side by side,
//! aligned by position and name: where they first part, what changed in
//! each step's args and output (JSON pointers with old and new values), and
//! the difference in tokens and cost.

use std::io::Write as _;

use anyhow::Result;
use serde_json::{Value, json};

use crate::cli::DiffArgs;
use crate::diff::{Change, changes};
use crate::journal::{Access, Location, StepKind, StepRecord, TaskRecord};
use crate::report::{escape, thousands};
use crate::settings::Settings;

/// The most changed leaves shown of a step's args or output.
const MOST: usize = 20;

/// One position of the two tasks.
struct Pair<'s> {
    step: u64,
    a: Option<&'s StepRecord>,
    b: Option<&'s StepRecord>,
    args: Vec<Change>,
    output: Vec<Change>,
}

impl Pair<'_> {
    /// The same step, asked and answered the same way.
    fn same(&self) -> bool {
        match (self.a, self.b) {
            (Some(a), Some(b)) => {
                a.name == b.name
                    && a.status == b.status
                    && self.args.is_empty()
                    && self.output.is_empty()
            }
            _ => false,
        }
    }
}

pub(crate) fn exec(args: &DiffArgs, settings: &Settings) -> Result<i32> {
    let location = Location::of(settings)?;
    if !location.exists()? {
        return Err(crate::task::unknown_task(&args.a, &location).into());
    }
    let mut journal = location.open(Access::Read, settings)?;
    let mut load = |id: &str| -> Result<(TaskRecord, Vec<StepRecord>)> {
        let task = journal
            .task(id)?
            .ok_or_else(|| crate::task::unknown_task(id, &location))?;
        let steps = journal.steps(id, false)?;
        Ok((task, steps))
    };
    let (a, a_steps) = load(&args.a)?;
    let (b, b_steps) = load(&args.b)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", compared((&a, &a_steps), (&b, &b_steps)))?;
    } else {
        let pairs = aligned(&a_steps, &b_steps);
        out.write_all(shown(&a, &b, &pairs, first_parting(&pairs)).as_bytes())?;
    }
    Ok(0)
}

/// The first step at which the two tasks differ.
fn first_parting(pairs: &[Pair<'_>]) -> Option<u64> {
    pairs.iter().find(|pair| !pair.same()).map(|pair| pair.step)
}

/// The steps of both tasks by position; a step's args and output compared
/// where both tasks have a step of one name there.
fn aligned<'s>(a: &'s [StepRecord], b: &'s [StepRecord]) -> Vec<Pair<'s>> {
    // By number, each side once: a task of 100,000 steps compares in one
    // pass.
    let mut by_number: std::collections::BTreeMap<
        u64,
        (Option<&'s StepRecord>, Option<&'s StepRecord>),
    > = std::collections::BTreeMap::new();
    for step in a {
        by_number.entry(step.step).or_default().0 = Some(step);
    }
    for step in b {
        by_number.entry(step.step).or_default().1 = Some(step);
    }
    by_number
        .into_iter()
        .map(|(n, (x, y))| {
            let (args, output) = match (x, y) {
                (Some(x), Some(y)) if x.name == y.name => {
                    (args_changes(x, y), output_changes(x, y))
                }
                _ => (Vec::new(), Vec::new()),
            };
            Pair {
                step: n,
                a: x,
                b: y,
                args,
                output,
            }
        })
        .collect()
}

/// A proxied request's body by pointers into it, as `[proxy] ignore` names
/// them (and its query as `?query`); any other step's args whole.
fn args_changes(a: &StepRecord, b: &StepRecord) -> Vec<Change> {
    if a.args_hash == b.args_hash {
        return Vec::new();
    }
    let (x, y) = (a.args.value(), b.args.value());
    if a.kind == StepKind::Proxy {
        let mut found = changes(&x["body"], &y["body"], MOST);
        if x["query"] != y["query"] {
            found.push(Change {
                pointer: "?query".to_owned(),
                old: Some(x["query"].clone()),
                new: Some(y["query"].clone()),
            });
        }
        return found;
    }
    changes(&x, &y, MOST)
}

/// A model call's answer as its text (a stream assembled); any other
/// output whole.
fn output_changes(a: &StepRecord, b: &StepRecord) -> Vec<Change> {
    let (x, y) = (
        a.output
            .as_ref()
            .map_or(Value::Null, crate::json_text::JsonText::value),
        b.output
            .as_ref()
            .map_or(Value::Null, crate::json_text::JsonText::value),
    );
    if x == y {
        return Vec::new();
    }
    if a.kind == StepKind::Proxy {
        let said = |step: &StepRecord, output: &Value| {
            crate::proxy::conversation::read(&step.args.value(), Some(output)).map(|call| {
                call.answer
                    .iter()
                    .map(|message| message.text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        };
        if let (Some(old), Some(new)) = (said(a, &x), said(b, &y))
            && !(old.is_empty() && new.is_empty())
        {
            return if old == new {
                // The same answer, other bytes (ids, times in a stream).
                Vec::new()
            } else {
                vec![Change {
                    pointer: "answer".to_owned(),
                    old: Some(Value::String(old)),
                    new: Some(Value::String(new)),
                }]
            };
        }
    }
    changes(&x, &y, MOST)
}

fn task_json(task: &TaskRecord, steps: usize) -> Value {
    json!({
        "id": task.id,
        "status": task.status.as_str(),
        "steps": steps,
        "tokens_spent": task.tokens_spent,
        "cost_usd": crate::prices::usd(task.cost.spent_nanos),
        "unpriced_steps": task.cost.unpriced_steps,
    })
}

fn changes_json(found: &[Change]) -> Value {
    found
        .iter()
        .map(|change| json!({"pointer": change.pointer, "old": change.old, "new": change.new}))
        .collect()
}

/// `durun diff A B --json` of two tasks and their live steps: what the
/// web view's comparison shows too.
pub(crate) fn compared(
    (a, a_steps): (&TaskRecord, &[StepRecord]),
    (b, b_steps): (&TaskRecord, &[StepRecord]),
) -> Value {
    let pairs = aligned(a_steps, b_steps);
    as_json(a, b, &pairs, first_parting(&pairs))
}

fn as_json(
    a: &TaskRecord,
    b: &TaskRecord,
    pairs: &[Pair<'_>],
    first_parting: Option<u64>,
) -> Value {
    let side = |step: Option<&StepRecord>| {
        step.map_or(Value::Null, |step| {
            json!({"name": step.name, "status": step.status.as_str(), "tokens": step.tokens,
                   "cost_usd": step.cost_nanos.map(crate::prices::usd)})
        })
    };
    let steps: Vec<Value> = pairs
        .iter()
        .map(|pair| {
            json!({
                "step": pair.step,
                "same": pair.same(),
                "a": side(pair.a),
                "b": side(pair.b),
                "args": changes_json(&pair.args),
                "output": changes_json(&pair.output),
            })
        })
        .collect();
    let count = |pick: fn(&Pair<'_>) -> bool| pairs.iter().filter(|pair| pick(pair)).count();
    json!({
        "a": task_json(a, count(|pair| pair.a.is_some())),
        "b": task_json(b, count(|pair| pair.b.is_some())),
        "first_parting": first_parting,
        "steps": steps,
        "tokens_difference": i128::from(b.tokens_spent) - i128::from(a.tokens_spent),
        "cost_usd_difference": crate::prices::usd(b.cost.spent_nanos) - crate::prices::usd(a.cost.spent_nanos),
    })
}

/// The report for a person: the two tasks, a line a step (its changes
/// under it), then tokens and cost.
fn shown(a: &TaskRecord, b: &TaskRecord, pairs: &[Pair<'_>], first_parting: Option<u64>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (label, task) in [("A", a), ("B", b)] {
        let _ = writeln!(
            out,
            "{label}  {}  {}, {} tokens, {}",
            escape(&task.id),
            task.status.as_str(),
            thousands(task.tokens_spent),
            crate::prices::shown(task.cost.spent_nanos)
        );
    }
    out.push('\n');
    let width = pairs
        .iter()
        .filter_map(|pair| pair.a.or(pair.b))
        .map(|step| step.name.chars().count().min(40))
        .max()
        .unwrap_or(4);
    for pair in pairs {
        let name = |step: Option<&StepRecord>| {
            step.map_or_else(
                || "-".to_owned(),
                |step| escape(&step.name).chars().take(40).collect(),
            )
        };
        let what = match (pair.a, pair.b) {
            _ if pair.same() => "same".to_owned(),
            (Some(x), Some(y)) if x.name != y.name => format!("parts: B ran `{}`", name(Some(y))),
            (Some(x), Some(y)) if x.status != y.status => {
                format!(
                    "differs: {} in A, {} in B",
                    x.status.as_str(),
                    y.status.as_str()
                )
            }
            (Some(_), Some(_)) => "differs".to_owned(),
            (Some(_), None) => "only in A".to_owned(),
            (None, Some(_)) => "only in B".to_owned(),
            (None, None) => String::new(),
        };
        let mark = if Some(pair.step) == first_parting {
            "  <- first parting"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{:>4}  {:<width$}  {what}{mark}",
            pair.step,
            name(pair.a.or(pair.b))
        );
        for (title, found) in [("args", &pair.args), ("output", &pair.output)] {
            for change in found {
                let _ = writeln!(
                    out,
                    "{:6}{title:<7} {}",
                    "",
                    escape(change.line().trim_start())
                );
            }
        }
    }
    let sign = |more: bool| if more { "+" } else { "-" };
    let (x, y) = (a.tokens_spent, b.tokens_spent);
    let _ = writeln!(
        out,
        "\ntokens  {} -> {} ({}{})",
        thousands(x),
        thousands(y),
        sign(y >= x),
        thousands(x.abs_diff(y))
    );
    let (x, y) = (a.cost.spent_nanos, b.cost.spent_nanos);
    let unpriced = a.cost.unpriced_steps + b.cost.unpriced_steps;
    if x > 0 || y > 0 {
        let _ = writeln!(
            out,
            "cost    {} -> {} ({}{}){}",
            crate::prices::shown(x),
            crate::prices::shown(y),
            sign(y >= x),
            crate::prices::shown(x.abs_diff(y)),
            if unpriced > 0 {
                ", without the steps at a model with no price"
            } else {
                ""
            }
        );
    } else if unpriced > 0 {
        out.push_str("cost    unknown (models without a price)\n");
    }
    match first_parting {
        Some(step) => {
            let _ = writeln!(out, "the tasks part at step {step}");
        }
        None => out.push_str("the tasks ran the same steps the same way\n"),
    }
    out
}
