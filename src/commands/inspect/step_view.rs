//! `inspect TASK --step N`: one step whole, its args and output pretty
//! printed.

use std::fmt::Write as _;
use std::time::SystemTime;

use serde_json::Value;

use super::views::{age, size, step_state, step_tone, took};
use crate::journal::{StepRecord, TaskRecord};
use crate::report::table::{Style, Tone};
use crate::report::{escape, short_duration, thousands};

fn pretty(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => serde_json::to_string_pretty(other).expect("JSON serializes"),
    }
}

fn indented(text: &str) -> String {
    text.lines().flat_map(|line| ["  ", line, "\n"]).collect()
}

/// Lines of a message shown in the conversation; `args` has them all.
const SHOWN_LINES: usize = 12;

/// A model call as a conversation: each message with its role, then the
/// answer (a stream's text and tool calls assembled).
fn conversation(style: &Style, call: &crate::proxy::conversation::Call) -> String {
    let mut out = String::new();
    if let Some(model) = &call.model {
        let _ = writeln!(out, "model       {}", escape(model));
    }
    for (title, messages) in [("sent", &call.sent), ("answer", &call.answer)] {
        let _ = writeln!(out, "{title}");
        for message in messages {
            let lines: Vec<&str> = message.text.lines().collect();
            let role = style.paint(Tone::Bold, &format!("{:<10}", escape(&message.role)));
            let _ = writeln!(
                out,
                "  {role} {}",
                escape(lines.first().copied().unwrap_or(""))
            );
            for line in lines.iter().skip(1).take(SHOWN_LINES - 1) {
                let line = escape(line);
                if line.trim().is_empty() {
                    out.push('\n');
                } else {
                    let _ = writeln!(out, "{:13}{}", "", line.trim_end());
                }
            }
            if lines.len() > SHOWN_LINES {
                let _ = writeln!(
                    out,
                    "             … {} more lines (in args)",
                    lines.len() - SHOWN_LINES
                );
            }
        }
    }
    out
}

pub(super) fn step_view(
    style: &Style,
    task: &TaskRecord,
    driven: bool,
    step: &StepRecord,
    now: SystemTime,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "step        {} of task {}",
        style.paint(Tone::Bold, &step.step.to_string()),
        escape(&task.id)
    );
    let _ = writeln!(
        out,
        "name        {} ({}, {})",
        escape(&step.name),
        step.kind.as_str(),
        step.effect.as_str()
    );
    let attempts = if step.attempts == 1 {
        "1 attempt".to_owned()
    } else {
        format!("{} attempts", step.attempts)
    };
    let _ = writeln!(
        out,
        "status      {} after {attempts}",
        style.paint(step_tone(step.status), step_state(step, driven))
    );
    if let Some(resolution) = &step.resolution {
        let by = match resolution {
            crate::journal::ResolutionKind::Edited => "durun fork --output",
            crate::journal::ResolutionKind::Reconciled => "its probe, after a crash",
            _ => "durun resolve",
        };
        let _ = writeln!(out, "resolution  {resolution} ({by})");
    }
    let _ = writeln!(out, "key         {}", step.idempotency_key);
    let _ = writeln!(out, "args hash   {}", step.args_hash);
    let _ = writeln!(
        out,
        "created     {} ({})",
        step.created_at,
        age(&step.created_at, now)
    );
    let _ = writeln!(out, "started     {} (run {})", step.started_at, step.run);
    match (
        &step.finished_at,
        took(&step.started_at, step.finished_at.as_deref()),
    ) {
        (Some(finished), Some(took)) => {
            let _ = writeln!(
                out,
                "finished    {finished} (took {})",
                short_duration(took)
            );
        }
        _ => {
            let _ = writeln!(out, "finished    -");
        }
    }
    if let Some(usage) = &step.usage {
        let _ = writeln!(
            out,
            "tokens      {} ({})",
            thousands(step.tokens),
            escape(usage.as_str())
        );
        let _ = writeln!(
            out,
            "cost        {}",
            step.cost_nanos.map_or_else(
                || "unknown (no price for its model: [prices.\"MODEL\"] in durun.toml)".to_owned(),
                crate::prices::shown
            )
        );
    }
    let args = step.args.value();
    let output = step.output.as_ref().map(crate::json_text::JsonText::value);
    if step.kind.as_str() == "proxy"
        && let Some(call) = crate::proxy::conversation::read(&args, output.as_ref())
    {
        out.push_str(&conversation(style, &call));
    }
    let _ = write!(out, "args\n{}", indented(&escape(&pretty(&args))));
    if let Some(output) = &step.output {
        let text = pretty(&output.value());
        let _ = write!(
            out,
            "output ({})\n{}",
            size(text.len()),
            indented(&escape(&text))
        );
    }
    if let Some(error) = &step.error {
        let _ = write!(
            out,
            "error\n{}",
            indented(&escape(&format!("{}: {}", error.code, error.message)))
        );
    }
    out
}
