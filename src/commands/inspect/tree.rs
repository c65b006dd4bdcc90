//! `inspect --tree` (SPEC 16): tasks as trees, each child under the task
//! that spawned it, with its status, steps and tokens.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;

use anyhow::Result;
use serde_json::Value;

use super::json::task_summary_json;
use super::status_matches;
use crate::cli::InspectArgs;
use crate::journal::TaskRecord;
use crate::report::{escape, thousands};
use crate::task::Shown;

/// The parent of `id` among `known`: `PARENT-sN` with PARENT a task.
fn parent<'a>(id: &'a str, known: &HashSet<&str>) -> Option<&'a str> {
    let (parent, step) = id.rsplit_once("-s")?;
    (!step.is_empty() && step.bytes().all(|byte| byte.is_ascii_digit()) && known.contains(parent))
        .then_some(parent)
}

pub(super) fn print(
    tasks: &[(TaskRecord, Shown)],
    args: &InspectArgs,
    out: &mut dyn Write,
) -> Result<()> {
    let known: HashSet<&str> = tasks.iter().map(|(task, _)| task.id.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut roots = Vec::new();
    for (index, (task, _)) in tasks.iter().enumerate() {
        match parent(&task.id, &known) {
            Some(parent) => children.entry(parent).or_default().push(index),
            None => roots.push(index),
        }
    }
    for list in children.values_mut() {
        list.sort_by_key(|&index| {
            let id = &tasks[index].0.id;
            id.rsplit_once("-s")
                .and_then(|(_, step)| step.parse::<u64>().ok())
                .unwrap_or(0)
        });
    }
    // A tree is listed when its root has the status asked for.
    roots.retain(|&index| {
        args.status
            .is_none_or(|wanted| status_matches(wanted, tasks[index].1.status))
    });
    if args.json {
        fn node(
            index: usize,
            tasks: &[(TaskRecord, Shown)],
            children: &BTreeMap<&str, Vec<usize>>,
        ) -> Value {
            let (task, shown) = &tasks[index];
            let mut json = task_summary_json(task, shown);
            json["children"] = Value::Array(
                children
                    .get(task.id.as_str())
                    .map(|list| {
                        list.iter()
                            .map(|&child| node(child, tasks, children))
                            .collect()
                    })
                    .unwrap_or_default(),
            );
            json
        }
        let trees: Vec<Value> = roots
            .iter()
            .map(|&index| node(index, tasks, &children))
            .collect();
        writeln!(out, "{}", serde_json::json!({ "tasks": trees }))?;
        return Ok(());
    }
    if roots.is_empty() {
        writeln!(out, "no tasks")?;
        return Ok(());
    }
    let mut lines = Vec::new();
    for &root in &roots {
        walk(root, "", "", tasks, &children, &mut lines);
    }
    let width = lines
        .iter()
        .map(|(label, _)| label.chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "{:<width$}  {:<11}  {:>7}  {:>9}  {:>9}",
        "TASK", "STATUS", "STEPS", "SPENT", "SAVED"
    )?;
    for (label, index) in lines {
        let (task, shown) = &tasks[index];
        writeln!(
            out,
            "{:<width$}  {:<11}  {:>7}  {:>9}  {:>9}",
            label,
            shown.status.as_str(),
            thousands(task.steps),
            thousands(task.tokens_spent),
            thousands(task.tokens_saved)
        )?;
    }
    Ok(())
}

/// The tree under `index`, depth first: each line's label (drawn with
/// `lead` before it) and the task it is.
fn walk(
    index: usize,
    lead: &str,
    rest: &str,
    tasks: &[(TaskRecord, Shown)],
    children: &BTreeMap<&str, Vec<usize>>,
    lines: &mut Vec<(String, usize)>,
) {
    let id = &tasks[index].0.id;
    lines.push((format!("{lead}{}", escape(id)), index));
    let Some(list) = children.get(id.as_str()) else {
        return;
    };
    for (position, &child) in list.iter().enumerate() {
        let last = position + 1 == list.len();
        let (branch, below) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        walk(
            child,
            &format!("{rest}{branch}"),
            &format!("{rest}{below}"),
            tasks,
            children,
            lines,
        );
    }
}
