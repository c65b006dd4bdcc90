//! A step's page (`/tasks/ID/steps/N`): every version of the step the
//! journal keeps, a model call read as a conversation, and the form that
//! forks the task with the step answered differently.

use std::fmt::Write as _;

use anyhow::Result;
use hyper::StatusCode;

use super::Shared;
use super::html::{json, page, task_href, text};
use super::http::Reply;
use super::task_page::{form, missing};
use super::timeline::step_class;
use crate::commands::inspect::took;
use crate::journal::{StepKind, StepRecord, StepStatus};
use crate::report::{short_duration, thousands};

/// One step whole: every version the journal keeps (a discarded one too).
pub(super) fn step(shared: &Shared, id: &str, step: &str) -> Result<Reply> {
    let Ok(number) = step.parse::<u64>() else {
        return Ok(Reply::text(
            StatusCode::NOT_FOUND,
            "durun ui: a step is a number",
        ));
    };
    let found = shared.read_task(id, |journal, task| {
        let shown = crate::task::shown(journal, &task, &shared.settings)?;
        let versions = journal.step_versions(id, number)?;
        Ok((task, shown, versions))
    })?;
    let Some((task, shown, versions)) = found else {
        return Ok(missing(id));
    };
    if versions.is_empty() {
        return Ok(Reply::text(
            StatusCode::NOT_FOUND,
            format!("durun ui: task {id} has no step {number}"),
        ));
    }
    let mut body = format!(
        "<p><a href=\"{}\">← task {}</a></p>",
        task_href(&task.id),
        text(&task.id)
    );
    for step in &versions {
        step_version(&mut body, step, step_class(step, &task, shown.driven()));
    }
    if let Some(live) = versions
        .iter()
        .find(|step| step.status == StepStatus::Committed)
    {
        body.push_str(&edit_form(&task.id, live, &shared.keys.csrf));
    }
    Ok(Reply::html(page(
        &format!("{} step {number}", task.id),
        &shared.keys.csrf,
        Some(&format!("task:{}", task.id)),
        &body,
    )))
}

/// Messages as a chat: each with its role.
fn chat(messages: &[crate::proxy::conversation::Message]) -> String {
    let mut out = String::from("<div class=\"chat\">");
    for message in messages {
        let role = text(&message.role);
        let _ = write!(
            out,
            "<div class=\"msg {}\"><span class=\"role\">{role}</span><pre>{}</pre></div>",
            match message.role.as_str() {
                "user" | "assistant" | "system" | "tool" | "model" => message.role.as_str(),
                _ => "other",
            },
            text(&message.text)
        );
    }
    out.push_str("</div>");
    out
}

/// "What if it had answered this instead?" (SPEC 20): the step's answer,
/// to edit, and a fork whose step N answers with the edit.
fn edit_form(task: &str, step: &StepRecord, csrf: &str) -> String {
    let output = step.output.as_ref().map(crate::json_text::JsonText::value);
    let current = match (&output, step.kind) {
        (Some(output), StepKind::Proxy) => match (output.get("body"), output.get("text")) {
            (Some(body), _) => serde_json::to_string_pretty(body).unwrap_or_default(),
            (None, Some(serde_json::Value::String(text))) => text.clone(),
            _ => String::new(),
        },
        (Some(output), _) => serde_json::to_string_pretty(output).unwrap_or_default(),
        (None, _) => String::new(),
    };
    let fields = format!(
        "<input type=\"hidden\" name=\"from\" value=\"{}\"><textarea name=\"output\" rows=\"12\" required>{}</textarea>",
        step.step,
        text(&current)
    );
    format!(
        "<section class=\"actions\"><h2>Answer it differently</h2><p>A new task replays the steps before this one, \
         answers this one with the text below ({}), and runs live from there.</p>{}</section>",
        if step.kind == StepKind::Proxy {
            "the answer body the agent gets"
        } else {
            "its output, as JSON"
        },
        form(task, "fork", csrf, &fields, "Fork with this answer", "")
    )
}

/// One version of a step: its heading and every field the journal keeps.
fn step_version(body: &mut String, step: &StepRecord, class: &str) {
    let _ = write!(
        body,
        "<h1>Step {} {} <span class=\"badge {class}\">{class}</span></h1><dl class=\"head\">",
        step.step,
        text(&step.name)
    );
    let mut row = |name: &str, value: String| {
        let _ = write!(body, "<dt>{name}</dt><dd>{value}</dd>");
    };
    row(
        "kind",
        format!("{} · {}", step.kind.as_str(), step.effect.as_str()),
    );
    row("status", step.status.as_str().to_owned());
    row(
        "idempotency key",
        format!("<code>{}</code>", text(&step.idempotency_key)),
    );
    row(
        "args hash",
        format!("<code>{}</code>", text(&step.args_hash)),
    );
    row("attempts", step.attempts.to_string());
    row("run", step.run.to_string());
    row("started", text(&step.started_at));
    if let Some(finished) = &step.finished_at {
        row(
            "finished",
            format!(
                "{} (took {})",
                text(finished),
                took(&step.started_at, Some(finished)).map_or_else(String::new, short_duration)
            ),
        );
    }
    if let Some(wake) = &step.wake_at {
        row(
            if step.kind == StepKind::Sleep {
                "wakes at"
            } else {
                "times out at"
            },
            text(wake),
        );
    }
    if let Some(resolution) = step.resolution {
        row("resolved", resolution.as_str().to_owned());
    }
    if step.tokens > 0 {
        row("tokens", thousands(step.tokens));
        row(
            "cost",
            step.cost_nanos.map_or_else(
                || "unknown (no price for its model)".to_owned(),
                crate::prices::shown,
            ),
        );
    }
    if let Some(usage) = &step.usage {
        row("usage", json(&usage.value(), 1));
    }
    let args = step.args.value();
    let output = step.output.as_ref().map(crate::json_text::JsonText::value);
    let call = (step.kind == StepKind::Proxy)
        .then(|| crate::proxy::conversation::read(&args, output.as_ref()))
        .flatten();
    if let Some(call) = call {
        // A model call as a person reads it; the request and answer as
        // recorded one click away.
        if let Some(model) = &call.model {
            row("model", text(model));
        }
        row("conversation", chat(&call.sent));
        row("answer", chat(&call.answer));
        let mut raw = format!(
            "<details class=\"raw\"><summary>request and answer as recorded</summary><h3>args</h3>{}",
            json(&args, 2)
        );
        if let Some(output) = &output {
            let _ = write!(raw, "<h3>output</h3>{}", json(output, 2));
        }
        raw.push_str("</details>");
        row("raw", raw);
    } else {
        row("args", json(&args, 2));
        if let Some(output) = &output {
            row("output", json(output, 2));
        }
    }
    if let Some(error) = &step.error {
        row(
            "error",
            format!(
                "<span class=\"error\">{}: {}</span>",
                error.code.as_str(),
                text(&error.message)
            ),
        );
    }
    body.push_str("</dl>");
}
