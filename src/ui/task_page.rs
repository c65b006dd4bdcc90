//! One task's page: its header as `inspect` shows it, the actions its
//! state allows, the timeline, its runs, signals and steps (a page of
//! them at a time: a task of 100,000 steps opens as fast as one of ten).
//! A step's own page is `step_page`.

use std::fmt::Write as _;

use anyhow::Result;
use hyper::StatusCode;

use super::Shared;
use super::html::{json, page, task_href, text};
use super::http::{Reply, Req};
use super::pages::badge;
use super::timeline::{LEGEND, step_class, task_timeline};
use crate::commands::inspect::{age, held, task_json, took};
use crate::exit_code;
use crate::journal::{
    RunRecord, SignalRecord, StepKind, StepRecord, StepStatus, TaskRecord, TaskStatus,
};
use crate::protocol::Effect;
use crate::report::{short_duration, thousands};
use crate::task::{Shown, shell_words};

/// Steps on one page of a task.
const STEPS: usize = 200;

pub(super) fn missing(id: &str) -> Reply {
    Reply::text(
        StatusCode::NOT_FOUND,
        format!("durun ui: no task {id} in the journal"),
    )
}

/// What a task's page needs from the journal, read in one go.
struct Loaded {
    task: TaskRecord,
    shown: Shown,
    runs: Vec<RunRecord>,
    signals: Vec<SignalRecord>,
    steps: Vec<StepRecord>,
    /// The highest step number of the task, and whether steps come before
    /// this page's.
    last: u64,
    family: crate::task::Family,
}

pub(super) fn task(req: &Req, shared: &Shared, id: &str) -> Result<Reply> {
    let from = req.field("from").and_then(|from| from.parse::<u64>().ok());
    let loaded = shared.read_task(id, |journal, task| {
        let shown = crate::task::shown(journal, &task, &shared.settings)?;
        let runs = journal.runs(id)?;
        let signals = journal.signals(id)?;
        let mut steps: Vec<StepRecord> = match from {
            Some(from) => journal.steps_page(id, from.saturating_sub(1), STEPS)?,
            None => journal.steps_tail(id, Some(STEPS))?,
        };
        steps.retain(|step| step.status != StepStatus::Discarded);
        let last = journal.replay_bounds(id)?.1;
        let family = crate::task::family(journal, &task, &shared.settings)?;
        Ok(Loaded {
            task,
            shown,
            runs,
            signals,
            steps,
            last,
            family,
        })
    })?;
    let Some(loaded) = loaded else {
        return Ok(missing(id));
    };
    Ok(Reply::html(page(
        &loaded.task.id,
        &shared.keys.csrf,
        Some(&format!("task:{}", loaded.task.id)),
        &task_body(&loaded, shared),
    )))
}

fn task_body(loaded: &Loaded, shared: &Shared) -> String {
    let Loaded {
        task,
        shown,
        runs,
        signals,
        steps,
        last,
        ..
    } = loaded;
    let now = shared.settings.now();
    let driven = shown.driven();
    let mut body = head(loaded, now);
    body.push_str(&actions(task, shown, steps, *last, &shared.keys.csrf));
    body.push_str("<h2>Timeline</h2>");
    body.push_str(&task_timeline(task, runs, steps, driven, now));
    body.push_str("<p class=\"legend\">");
    for (class, meaning) in LEGEND {
        let _ = write!(body, "<span class=\"key {class}\"></span>{meaning} ");
    }
    body.push_str("</p>");
    runs_table(&mut body, runs, driven);
    // A task and its fork, or two runs of one agent: `durun diff`.
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/diff\" class=\"act\"><input type=\"hidden\" name=\"a\" value=\"{}\">\
         <input name=\"b\" placeholder=\"another task's id\" required><button>Compare</button></form>",
        text(&task.id)
    );
    signals_table(&mut body, task, signals);
    steps_table(&mut body, task, steps, *last, driven);
    body
}

/// The task's head: a heading with its status, then its command,
/// directory, family, counts, holder, what it waits for, times and output.
fn head(loaded: &Loaded, now: std::time::SystemTime) -> String {
    let Loaded {
        task,
        shown,
        runs,
        family,
        ..
    } = loaded;
    let driven = shown.driven();
    let mut body = format!(
        "<h1>{} {}</h1><dl class=\"head\">",
        text(&task.id),
        badge(shown.status)
    );
    let mut row = |name: &str, value: String| {
        let _ = write!(body, "<dt>{name}</dt><dd>{value}</dd>");
    };
    row(
        "command",
        format!("<code>{}</code>", text(&shell_words(&task.argv))),
    );
    row("directory", text(&task.cwd));
    family_rows(&mut row, family);
    row("runs", task.runs.to_string());
    row("steps", thousands(task.steps));
    spending_rows(&mut row, task);
    if let Some(queue) = &task.queue {
        row("queue", text(queue));
    }
    if let Some(lease) = task.lease.as_ref().filter(|_| driven) {
        row(
            "held by",
            text(&format!(
                "{} pid {} (run {})",
                lease.host, lease.pid, lease.run
            )),
        );
    }
    if let Some(step) = &shown.waiting {
        row(
            "waiting for",
            format!(
                "{} <a href=\"{}/steps/{}\">step {}</a> {}{}",
                if step.kind == StepKind::Sleep {
                    "the time of"
                } else {
                    "the signal"
                },
                task_href(&task.id),
                step.step,
                step.step,
                text(&step.name),
                step.wake_at
                    .as_deref()
                    .map_or_else(String::new, |at| format!(" (until {})", text(at)))
            ),
        );
    }
    if shown.status == TaskStatus::Interrupted
        && let Some(held) = held(task, runs, now)
    {
        row("resumed", held);
    }
    row(
        "created",
        format!(
            "{} ({})",
            text(&task.created_at),
            age(&task.created_at, now)
        ),
    );
    row(
        "updated",
        format!(
            "{} ({})",
            text(&task.updated_at),
            age(&task.updated_at, now)
        ),
    );
    if let Some(code) = task.exit_code {
        row("exit code", code.to_string());
    }
    if let Some(output) = &task.output {
        row("output", json(output, 1));
    }
    body.push_str("</dl>");
    body
}

/// What the task spent and saved, and what is left of its budgets.
fn spending_rows(row: &mut impl FnMut(&str, String), task: &TaskRecord) {
    row(
        "tokens",
        format!(
            "<span class=\"spent\">{} spent</span> · <span class=\"saved\">{} saved</span>{}",
            thousands(task.tokens_spent),
            thousands(task.tokens_saved),
            task.max_tokens
                .map_or_else(String::new, |max| format!(" · budget {}", thousands(max)))
        ),
    );
    if let Some(cost) =
        crate::commands::inspect::cost_line(&task.cost, task.tokens_spent + task.tokens_saved)
    {
        row("cost", text(&cost));
    }
    if let Some(left) = crate::commands::inspect::budget_left(task) {
        row("budget", text(&left));
    }
}

/// The task's parent and children, linked.
fn family_rows(row: &mut impl FnMut(&str, String), family: &crate::task::Family) {
    if let Some(parent) = &family.parent {
        row(
            "parent",
            format!("<a href=\"{}\">{}</a>", task_href(parent), text(parent)),
        );
    }
    if !family.children.is_empty() {
        let children: Vec<String> = family
            .children
            .iter()
            .map(|(id, status)| {
                format!(
                    "<a href=\"{}\">{}</a> {}",
                    task_href(id),
                    text(id),
                    badge(*status)
                )
            })
            .collect();
        row("children", children.join(" "));
    }
}

pub(super) fn form(
    task: &str,
    action: &str,
    csrf: &str,
    fields: &str,
    button: &str,
    class: &str,
) -> String {
    format!(
        "<form method=\"post\" action=\"{}/{action}\" class=\"act\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">{fields}<button class=\"{class}\">{button}</button></form>",
        task_href(task),
        text(csrf)
    )
}

/// The buttons for what the task's state allows, each doing what the
/// command it names does.
fn actions(
    task: &TaskRecord,
    shown: &Shown,
    steps: &[StepRecord],
    last: u64,
    csrf: &str,
) -> String {
    let id = &task.id;
    let mut out = String::from("<section class=\"actions\"><h2>Actions</h2>");
    let over = matches!(shown.status, TaskStatus::Completed | TaskStatus::Cancelled);
    if shown
        .waiting
        .as_ref()
        .is_some_and(|step| step.kind == StepKind::Wait)
    {
        out.push_str(&form(
            id,
            "approve",
            csrf,
            "<input name=\"comment\" placeholder=\"comment (optional)\">",
            "Approve",
            "go",
        ));
        out.push_str(&form(
            id,
            "reject",
            csrf,
            "<input name=\"reason\" placeholder=\"reason (optional)\">",
            "Reject",
            "stop",
        ));
    }
    if shown.status == TaskStatus::OverBudget {
        let mut fields = String::new();
        if task.max_cost_nanos.is_some() {
            fields.push_str("<input name=\"add_usd\" placeholder=\"dollars to add, e.g. 5\" inputmode=\"decimal\">");
        }
        if task.max_tokens.is_some() {
            fields.push_str(
                "<input name=\"add_tokens\" placeholder=\"tokens to add\" inputmode=\"numeric\">",
            );
        }
        out.push_str(&form(
            id,
            "approve",
            csrf,
            &fields,
            "Raise the budget",
            "go",
        ));
    }
    if !over {
        out.push_str(&form(
            id,
            "signal",
            csrf,
            "<input name=\"name\" placeholder=\"signal name\" required><input name=\"data\" placeholder='data as JSON, e.g. {\"sha\": \"4f2a\"}'>",
            "Send signal",
            "",
        ));
    }
    for step in steps.iter().filter(|step| {
        step.status == StepStatus::Pending && step.effect == Effect::Mutate && !shown.driven()
    }) {
        let _ = write!(
            out,
            "<div class=\"doubt-box\"><p>Step {} <b>{}</b> is in doubt: its run died while it ran.</p>",
            step.step,
            text(&step.name)
        );
        let hidden = format!(
            "<input type=\"hidden\" name=\"step\" value=\"{}\">",
            step.step
        );
        out.push_str(&form(
            id,
            "resolve",
            csrf,
            &format!("{hidden}<input type=\"hidden\" name=\"how\" value=\"retry\">"),
            "Run it again",
            "",
        ));
        out.push_str(&form(id, "resolve", csrf, &format!("{hidden}<input type=\"hidden\" name=\"how\" value=\"output\"><input name=\"value\" placeholder=\"what it returned, as JSON\" required>"), "Record output", ""));
        out.push_str(&form(id, "resolve", csrf, &format!("{hidden}<input type=\"hidden\" name=\"how\" value=\"fail\"><input name=\"value\" placeholder=\"why it must not happen\" required>"), "Record failure", "stop"));
        out.push_str("</div>");
    }
    out.push_str(&form(
        id,
        "fork",
        csrf,
        &format!("<label>from step <input name=\"from\" type=\"number\" min=\"1\" max=\"{}\" value=\"{}\" required></label>", last + 1, last.max(1)),
        "Fork",
        "",
    ));
    if !over {
        out.push_str(&form(id, "cancel", csrf, "", "Cancel task", "stop"));
    }
    out.push_str("</section>");
    out
}

/// The runs, each with how it ended: a run with no end recorded that is
/// not the one running now died (killed, a crash, a lost machine), and
/// lasted at most until the next run began.
fn runs_table(body: &mut String, runs: &[RunRecord], driven: bool) {
    if runs.is_empty() {
        return;
    }
    body.push_str(
        "<h2>Runs</h2><table><thead><tr><th>Run</th><th>Host</th><th>Started</th><th>Took</th><th>Exit</th>\
         <th class=\"num\">Executed</th><th class=\"num\">Replayed</th><th class=\"num\">Tokens spent</th>\
         <th class=\"num\">Tokens saved</th><th class=\"num\">Cost</th></tr></thead><tbody>",
    );
    for (at, run) in runs.iter().enumerate() {
        let next = runs.get(at + 1);
        let live = next.is_none() && driven;
        let exit = match run.exit_code {
            Some(exit_code::DIVERGENCE) => "65 diverged".to_owned(),
            Some(code) => code.to_string(),
            None if run.finished_at.is_none() && !live => {
                "<span class=\"stale\">died</span>".to_owned()
            }
            None if live => "running".to_owned(),
            None => String::new(),
        };
        let took_text = match (&run.finished_at, next) {
            (Some(finished), _) => {
                took(&run.started_at, Some(finished)).map_or_else(String::new, short_duration)
            }
            // Died: it ended before the next run began.
            (None, Some(next)) => took(&run.started_at, Some(&next.started_at))
                .map_or_else(String::new, |took| format!("≤ {}", short_duration(took))),
            (None, None) if live => {
                took(&run.started_at, None).map_or_else(String::new, short_duration)
            }
            (None, None) => "unknown".to_owned(),
        };
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{exit}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            run.run,
            text(&format!("{} pid {}", run.host, run.pid)),
            text(&run.started_at),
            took_text,
            thousands(run.stats.executed_steps),
            thousands(run.stats.replayed_steps),
            thousands(run.stats.tokens_spent),
            thousands(run.stats.tokens_saved),
            super::html::cost_cell(&run.stats.cost),
        );
        // Why durun ended it, as the terminal showed it: a divergence's
        // diff, a journal error.
        if let Some(error) = &run.error {
            let _ = write!(
                body,
                "<tr class=\"run-error\"><td colspan=\"10\"><pre>{}</pre></td></tr>",
                text(error)
            );
        }
    }
    body.push_str("</tbody></table>");
}

fn signals_table(body: &mut String, task: &TaskRecord, signals: &[SignalRecord]) {
    if signals.is_empty() {
        return;
    }
    body.push_str("<h2>Signals</h2><table><thead><tr><th>Signal</th><th>Data</th><th>Sent by</th><th>At</th><th>Taken by</th></tr></thead><tbody>");
    for signal in signals {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            text(&signal.name),
            json(&signal.data, 1),
            text(&signal.sent_by),
            text(&signal.sent_at),
            signal.taken_by.map_or_else(
                || "not yet".to_owned(),
                |step| format!(
                    "<a href=\"{}/steps/{step}\">step {step}</a>",
                    task_href(&task.id)
                )
            ),
        );
    }
    body.push_str("</tbody></table>");
}

fn steps_table(
    body: &mut String,
    task: &TaskRecord,
    steps: &[StepRecord],
    last: u64,
    driven: bool,
) {
    let href = task_href(&task.id);
    let _ = write!(body, "<h2>Steps</h2>");
    if steps.is_empty() {
        body.push_str("<p class=\"empty\">No step yet.</p>");
        return;
    }
    let (first, end) = (steps[0].step, steps[steps.len() - 1].step);
    let _ = write!(
        body,
        "<p class=\"pages\">steps {first}–{end} of {}",
        thousands(last)
    );
    if first > 1 {
        let _ = write!(
            body,
            " · <a href=\"{href}?from=1\">first</a> · <a href=\"{href}?from={}\">earlier</a>",
            first.saturating_sub(STEPS as u64).max(1)
        );
    }
    if end < last {
        let _ = write!(
            body,
            " · <a href=\"{href}?from={}\">later</a> · <a href=\"{href}\">latest</a>",
            end + 1
        );
    }
    body.push_str("</p><table class=\"steps\"><thead><tr><th class=\"num\">#</th><th>Step</th><th>Kind</th><th>Effect</th><th>Status</th>\
        <th class=\"num\">Attempts</th><th class=\"num\">Tokens</th><th>Took</th><th>Run</th><th>Output</th></tr></thead><tbody>");
    for step in steps {
        let class = step_class(step, task, driven);
        let output = match (&step.error, &step.output) {
            (Some(error), _) => format!(
                "<span class=\"error\">{}: {}</span>",
                error.code.as_str(),
                text(&error.message)
            ),
            (None, Some(output)) => text(&output.preview(80)),
            (None, None) => String::new(),
        };
        let _ = write!(
            body,
            "<tr class=\"{class}\"><td class=\"num\"><a href=\"{href}/steps/{0}\">{0}</a></td><td>{1}</td><td>{2}</td><td>{3}</td>\
             <td><span class=\"key {class}\"></span>{class}</td><td class=\"num\">{4}</td><td class=\"num\">{5}</td><td>{6}</td><td>{7}</td><td class=\"out\">{output}</td></tr>",
            step.step,
            text(&step.name),
            step.kind.as_str(),
            step.effect.as_str(),
            step.attempts,
            if step.tokens > 0 {
                thousands(step.tokens)
            } else {
                String::new()
            },
            took(&step.started_at, step.finished_at.as_deref())
                .map_or_else(String::new, short_duration),
            step.run,
        );
    }
    body.push_str("</tbody></table>");
}

/// `/api/tasks/ID`: what `inspect ID --json` prints.
pub(super) fn api_task(shared: &Shared, id: &str) -> Result<Reply> {
    let out = shared.read_task(id, |journal, task| {
        let runs = journal.runs(id)?;
        let mut out = Vec::new();
        task_json(journal, &task, &runs, &shared.settings, &mut out)?;
        Ok(out)
    })?;
    Ok(out.map_or_else(|| missing(id), Reply::json))
}
