//! What a task spent and what is left of its budgets (SPEC 9 and 19), as
//! `inspect` and the web view say it.

use std::fmt::Write as _;

use crate::journal::TaskRecord;
use crate::report::thousands;

/// The task's `tokens` and `cost` lines, each with its budget and what is
/// left of it.
pub(super) fn spending(out: &mut String, task: &TaskRecord) {
    let budget = task.max_tokens.map_or_else(String::new, |max| {
        format!(
            ", budget {} ({} left)",
            thousands(max),
            thousands(max.saturating_sub(task.tokens_spent))
        )
    });
    let _ = writeln!(
        out,
        "tokens   {} spent, {} saved{budget}",
        thousands(task.tokens_spent),
        thousands(task.tokens_saved)
    );
    let budget = task.max_cost_nanos.map_or_else(String::new, |max| {
        format!(
            ", budget {} ({} left)",
            crate::prices::shown(max),
            crate::prices::shown(max.saturating_sub(task.cost.spent_nanos))
        )
    });
    match cost_line(&task.cost, task.tokens_spent + task.tokens_saved) {
        Some(cost) => {
            let _ = writeln!(out, "cost     {cost}{budget}");
        }
        None if task.max_cost_nanos.is_some() => {
            let _ = writeln!(out, "cost     $0{budget}");
        }
        None => {}
    }
}

/// What a task's tokens cost at their models' prices (SPEC 19), when it
/// spent or saved any.
pub(crate) fn cost_line(cost: &crate::journal::Cost, tokens: u64) -> Option<String> {
    if tokens == 0 {
        return None;
    }
    let steps = |n: u64| {
        if n == 1 {
            "1 step".to_owned()
        } else {
            format!("{n} steps")
        }
    };
    if cost.spent_nanos == 0 && cost.saved_nanos == 0 && cost.unpriced_steps > 0 {
        return Some(format!(
            "unknown ({} at a model without a price)",
            steps(cost.unpriced_steps)
        ));
    }
    let unpriced = if cost.unpriced_steps > 0 {
        format!(
            "; {} at a model without a price: cost unknown",
            steps(cost.unpriced_steps)
        )
    } else {
        String::new()
    };
    Some(format!(
        "{} spent, {} saved{unpriced}",
        crate::prices::shown(cost.spent_nanos),
        crate::prices::shown(cost.saved_nanos)
    ))
}

/// What is left of the task's budgets, for a person: `$4.88 of $5.00
/// left`, `880 of 1,000 tokens left`, both, or none without a budget.
pub(crate) fn budget_left(task: &TaskRecord) -> Option<String> {
    let money = task.max_cost_nanos.map(|max| {
        format!(
            "{} of {} left",
            crate::prices::shown(max.saturating_sub(task.cost.spent_nanos)),
            crate::prices::shown(max)
        )
    });
    let tokens = task.max_tokens.map(|max| {
        format!(
            "{} of {} tokens left",
            thousands(max.saturating_sub(task.tokens_spent)),
            thousands(max)
        )
    });
    match (money, tokens) {
        (Some(money), Some(tokens)) => Some(format!("{money}, {tokens}")),
        (money, tokens) => money.or(tokens),
    }
}
