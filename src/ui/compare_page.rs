//! The comparison of two tasks (`/diff?a=A&b=B`, SPEC 20): what `durun
//! diff` shows, as a page.

use std::fmt::Write as _;

use anyhow::Result;

use super::Shared;
use super::html::{page, task_href, text};
use super::http::{Reply, Req};
use crate::report::thousands;

/// `/diff?a=A&b=B`: two tasks step by step (SPEC 20), as `durun diff`
/// shows them.
pub(super) fn diff(req: &Req, shared: &Shared) -> Result<Reply> {
    let (Some(a), Some(b)) = (
        req.field("a").map(str::trim).filter(|id| !id.is_empty()),
        req.field("b").map(str::trim).filter(|id| !id.is_empty()),
    ) else {
        return Ok(Reply::text(
            hyper::StatusCode::BAD_REQUEST,
            "durun ui: compare which tasks? /diff?a=TASK&b=TASK",
        ));
    };
    let compared = shared.read(|journal| {
        let Some(journal) = journal else {
            return Ok(None);
        };
        let (Some(x), Some(y)) = (journal.task(a)?, journal.task(b)?) else {
            return Ok(None);
        };
        let (x_steps, y_steps) = (journal.steps(a, false)?, journal.steps(b, false)?);
        let compared = crate::commands::compare::compared((&x, &x_steps), (&y, &y_steps));
        Ok(Some((x, y, compared)))
    })?;
    let Some((x, y, compared)) = compared else {
        return Ok(Reply::text(
            hyper::StatusCode::NOT_FOUND,
            format!("durun ui: no task {a} or no task {b} in the journal"),
        ));
    };
    Ok(Reply::html(page(
        &format!("{a} and {b}"),
        &shared.keys.csrf,
        None,
        &diff_body([&x, &y], &compared),
    )))
}

/// The comparison as a page: the two tasks, then a row a step, its
/// changes under it.
fn diff_body(tasks: [&crate::journal::TaskRecord; 2], compared: &serde_json::Value) -> String {
    let side = |which: &str, task: &crate::journal::TaskRecord| {
        format!(
            "<dt>{which}</dt><dd><a href=\"{}\">{}</a> · {} · {} tokens · {}</dd>",
            task_href(&task.id),
            text(&task.id),
            task.status.as_str(),
            thousands(task.tokens_spent),
            crate::prices::shown(task.cost.spent_nanos),
        )
    };
    let mut body = format!(
        "<h1>Compare</h1><dl class=\"head\">{}{}</dl><p>{}</p>",
        side("A", tasks[0]),
        side("B", tasks[1]),
        match compared["first_parting"].as_u64() {
            Some(step) => format!("The tasks first part at step {step}."),
            None => "The tasks ran the same steps the same way.".to_owned(),
        }
    );
    body.push_str(
        "<table class=\"steps diff\"><thead><tr><th class=\"num\">Step</th><th>A</th><th>B</th><th></th></tr></thead><tbody>",
    );
    let first = compared["first_parting"].as_u64();
    for step in compared["steps"].as_array().into_iter().flatten() {
        let n = step["step"].as_u64().unwrap_or(0);
        let name = |which: &str| match step[which]["name"].as_str() {
            Some(name) => format!(
                "{} <small>{}</small>",
                text(name),
                text(step[which]["status"].as_str().unwrap_or_default())
            ),
            None => "-".to_owned(),
        };
        let what = if step["same"] == true {
            "same"
        } else if Some(n) == first {
            "first parting"
        } else {
            "differs"
        };
        let _ = write!(
            body,
            "<tr class=\"{}\"><td class=\"num\">{n}</td><td>{}</td><td>{}</td><td>{what}</td></tr>",
            if step["same"] == true {
                "same"
            } else {
                "parted"
            },
            name("a"),
            name("b"),
        );
        for part in ["args", "output"] {
            for change in step[part].as_array().into_iter().flatten() {
                let value = |key: &str| {
                    change
                        .get(key)
                        .filter(|value| !value.is_null())
                        .map_or_else(|| "—".to_owned(), |value| text(&value.to_string()))
                };
                let _ = write!(
                    body,
                    "<tr class=\"change\"><td></td><td colspan=\"3\">{part} <code>{}</code>: <span class=\"old\">{}</span> → <span class=\"new\">{}</span></td></tr>",
                    text(change["pointer"].as_str().unwrap_or_default()),
                    value("old"),
                    value("new"),
                );
            }
        }
    }
    body.push_str("</tbody></table>");
    body
}
