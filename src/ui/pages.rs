//! The pages about many tasks: the task list, tokens by day, workers and
//! queues; and the API and live answers about all of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;
use sha2::{Digest as _, Sha256};

use super::html::{page, query_value, task_href, text};
use super::http::{Reply, Req};
use super::{Shared, timeline};
use crate::commands::inspect::{age, list_json, listed};
use crate::journal::{TaskRecord, TaskStatus};
use crate::report::thousands;
use crate::step_key::hex;
use crate::task::{Shown, shell_words};

/// Tasks on one page of the list.
const PAGE: usize = 200;

/// Every status, in the order the list's filter offers them.
const STATUSES: [TaskStatus; 9] = [
    TaskStatus::Running,
    TaskStatus::Waiting,
    TaskStatus::Sleeping,
    TaskStatus::Queued,
    TaskStatus::Interrupted,
    TaskStatus::OverBudget,
    TaskStatus::Failed,
    TaskStatus::Completed,
    TaskStatus::Cancelled,
];

fn all_tasks(shared: &Shared) -> Result<Vec<(TaskRecord, Shown)>> {
    shared.read(|journal| match journal {
        Some(journal) => listed(journal, &shared.settings, usize::MAX, &|_, _| true),
        None => Ok(Vec::new()),
    })
}

/// A status as a badge, its class the status's own.
pub(super) fn badge(status: TaskStatus) -> String {
    format!("<span class=\"badge {0}\">{0}</span>", status.as_str())
}

pub(super) fn task_list(req: &Req, shared: &Shared) -> Result<Reply> {
    let tasks = all_tasks(shared)?;
    let wanted = req.field("status").filter(|status| !status.is_empty());
    let search = req.field("q").unwrap_or_default().trim().to_lowercase();
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (_, shown) in &tasks {
        *counts.entry(shown.status.as_str()).or_default() += 1;
    }
    let matching: Vec<&(TaskRecord, Shown)> = tasks
        .iter()
        .filter(|(_, shown)| wanted.is_none_or(|wanted| shown.status.as_str() == wanted))
        .filter(|(task, _)| search.is_empty() || matches_search(task, &search))
        .collect();
    let pages = matching.len().div_ceil(PAGE).max(1);
    let at = req
        .field("page")
        .and_then(|page| page.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, pages);
    let now = shared.settings.now();
    let mut body = String::with_capacity(64 * PAGE + 4096);
    filter_form(&mut body, &search, wanted, &counts, tasks.len());
    if matching.is_empty() {
        body.push_str(if tasks.is_empty() {
            "<p class=\"empty\">No tasks yet: <code>durun run -- CMD</code> makes one.</p>"
        } else {
            "<p class=\"empty\">No task matches.</p>"
        });
    } else {
        body.push_str(
            "<table class=\"tasks\"><thead><tr><th>Task</th><th>Status</th><th>Command</th>\
             <th class=\"num\">Steps</th><th class=\"num\">Tokens spent</th><th class=\"num\">Tokens saved</th><th class=\"num\">Cost</th>\
             <th>Queue</th><th>Updated</th></tr></thead><tbody>",
        );
        let known: std::collections::HashSet<&str> =
            tasks.iter().map(|(task, _)| task.id.as_str()).collect();
        let page_rows: Vec<&(TaskRecord, Shown)> = matching
            .iter()
            .skip((at - 1) * PAGE)
            .take(PAGE)
            .copied()
            .collect();
        let died = died_runs(shared, &page_rows)?;
        for (task, shown) in page_rows {
            let marker = resumed_marker(task, died.get(task.id.as_str()).copied());
            task_row(&mut body, task, shown, &known, &marker, now);
        }
        body.push_str("</tbody></table>");
        pager(&mut body, (at, pages, matching.len()), wanted, &search);
    }
    Ok(Reply::html(page(
        "Tasks",
        &shared.keys.csrf,
        Some("list"),
        &body,
    )))
}

/// A task's cost, and what is left of its budget under it.
fn budget_cell(task: &TaskRecord) -> String {
    let cost = super::html::cost_cell(&task.cost);
    match crate::commands::inspect::budget_left(task) {
        Some(left) => format!("{cost}<br><small class=\"left\">{}</small>", text(&left)),
        None => cost,
    }
}

/// The list's search box and status filter, each status with its count.
fn filter_form(
    body: &mut String,
    search: &str,
    wanted: Option<&str>,
    counts: &BTreeMap<&'static str, usize>,
    total: usize,
) {
    body.push_str("<h1>Tasks</h1><form class=\"filter\" method=\"get\" action=\"/\">");
    let _ = write!(
        body,
        "<input type=\"search\" name=\"q\" placeholder=\"task id, command or queue\" value=\"{}\">\
         <select name=\"status\"><option value=\"\">every status ({})</option>",
        text(search),
        total
    );
    for status in STATUSES {
        let name = status.as_str();
        let _ = write!(
            body,
            "<option value=\"{name}\"{}>{name} ({})</option>",
            if wanted == Some(name) {
                " selected"
            } else {
                ""
            },
            counts.get(name).copied().unwrap_or(0)
        );
    }
    body.push_str("</select><button>Show</button></form>");
}

/// For each task of `rows` that ran more than once, how many of its runs
/// died: no end recorded, and a later run after them. (Only those tasks'
/// runs are read: one query each.)
fn died_runs<'t>(
    shared: &Shared,
    rows: &[&'t (TaskRecord, Shown)],
) -> Result<std::collections::HashMap<&'t str, usize>> {
    let resumed: Vec<&str> = rows
        .iter()
        .filter(|(task, _)| task.runs > 1)
        .map(|(task, _)| task.id.as_str())
        .collect();
    if resumed.is_empty() {
        return Ok(std::collections::HashMap::new());
    }
    shared.read(|journal| {
        let Some(journal) = journal else {
            return Ok(std::collections::HashMap::new());
        };
        let mut died = std::collections::HashMap::new();
        for id in resumed {
            let runs = journal.runs(id)?;
            let count = runs
                .iter()
                .take(runs.len().saturating_sub(1))
                .filter(|run| run.finished_at.is_none())
                .count();
            died.insert(id, count);
        }
        Ok(died)
    })
}

/// Under a task's status: that it was resumed, and after how many runs
/// that died (killed, a crash, a lost machine).
fn resumed_marker(task: &TaskRecord, died: Option<usize>) -> String {
    match died {
        Some(0) | None if task.runs > 1 => format!(
            "<br><small class=\"resumed\" title=\"{} runs\">↻ resumed</small>",
            task.runs
        ),
        Some(died) if died > 0 => format!(
            "<br><small class=\"resumed crashed\" title=\"{} runs, {died} of them died before their end\">↻ crashed, resumed</small>",
            task.runs
        ),
        _ => String::new(),
    }
}

/// One task's row: its id (and parent, for a child task), status (and
/// whether it was resumed), command, counts and age.
fn task_row(
    body: &mut String,
    task: &TaskRecord,
    shown: &Shown,
    known: &std::collections::HashSet<&str>,
    marker: &str,
    now: std::time::SystemTime,
) {
    // A child task (SPEC 16) names its parent under its id.
    let parent = task
        .id
        .rsplit_once("-s")
        .map(|(parent, _)| parent)
        .filter(|parent| known.contains(parent) && crate::task::is_child_of(&task.id, parent))
        .map_or_else(String::new, |parent| {
            format!(
                "<br><small>↳ of <a href=\"{}\">{}</a></small>",
                task_href(parent),
                text(parent)
            )
        });
    let command = text(&shell_words(&task.argv));
    let _ = write!(
        body,
        "<tr><td><a href=\"{}\">{}</a>{parent}</td><td>{}{marker}</td><td class=\"cmd\" title=\"{command}\">{command}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td>{}</td><td title=\"{}\">{}</td></tr>",
        task_href(&task.id),
        text(&task.id),
        badge(shown.status),
        thousands(task.steps),
        thousands(task.tokens_spent),
        thousands(task.tokens_saved),
        budget_cell(task),
        text(task.queue.as_deref().unwrap_or("")),
        text(&task.updated_at),
        age(&task.updated_at, now),
    );
}

/// "1–50 of N tasks", with links to the newer and older pages.
fn pager(
    body: &mut String,
    (at, pages, matching): (usize, usize, usize),
    wanted: Option<&str>,
    search: &str,
) {
    let link = |page: usize| {
        let mut query = format!("?page={page}");
        if let Some(wanted) = wanted {
            let _ = write!(query, "&status={}", query_value(wanted));
        }
        if !search.is_empty() {
            let _ = write!(query, "&q={}", query_value(search));
        }
        query
    };
    let _ = write!(
        body,
        "<p class=\"pages\">{}–{} of {} tasks",
        thousands(((at - 1) * PAGE + 1) as u64),
        thousands((at * PAGE).min(matching) as u64),
        thousands(matching as u64)
    );
    if at > 1 {
        let _ = write!(body, " · <a href=\"{}\">newer</a>", text(&link(at - 1)));
    }
    if at < pages {
        let _ = write!(body, " · <a href=\"{}\">older</a>", text(&link(at + 1)));
    }
    body.push_str("</p>");
}

fn matches_search(task: &TaskRecord, search: &str) -> bool {
    task.id.to_lowercase().contains(search)
        || task
            .argv
            .iter()
            .any(|word| word.to_lowercase().contains(search))
        || task
            .queue
            .as_deref()
            .is_some_and(|queue| queue.to_lowercase().contains(search))
}

/// Where the tokens went: by day, as a chart, and by task.
pub(super) fn tokens(shared: &Shared) -> Result<Reply> {
    let days = shared.read(|journal| match journal {
        Some(journal) => journal.token_days(),
        None => Ok(Vec::new()),
    })?;
    let mut tasks = all_tasks(shared)?;
    let spent: u64 = tasks.iter().map(|(task, _)| task.tokens_spent).sum();
    let saved: u64 = tasks.iter().map(|(task, _)| task.tokens_saved).sum();
    let mut body = format!(
        "<h1>Tokens</h1><p class=\"totals\"><span class=\"spent\">{} spent</span> · \
         <span class=\"saved\">{} saved by replay</span> over {} tasks</p>",
        thousands(spent),
        thousands(saved),
        thousands(tasks.len() as u64)
    );
    body.push_str("<h2>By day (UTC)</h2>");
    if days.is_empty() {
        body.push_str("<p class=\"empty\">No step has reported token usage yet.</p>");
    } else {
        body.push_str(&timeline::day_chart(&days));
        body.push_str(
            "<table class=\"days\"><thead><tr><th>Day</th><th class=\"num\">Spent</th>\
             <th class=\"num\">Saved</th></tr></thead><tbody>",
        );
        for (day, spent, saved) in days.iter().rev() {
            let _ = write!(
                body,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                text(day),
                thousands(*spent),
                thousands(*saved)
            );
        }
        body.push_str("</tbody></table>");
    }
    tasks.retain(|(task, _)| task.tokens_spent + task.tokens_saved > 0);
    tasks.sort_by_key(|(task, _)| std::cmp::Reverse(task.tokens_spent + task.tokens_saved));
    if !tasks.is_empty() {
        body.push_str(
            "<h2>By task</h2><table class=\"tasks\"><thead><tr><th>Task</th><th>Status</th>\
             <th class=\"num\">Spent</th><th class=\"num\">Saved</th><th>Budget</th></tr></thead><tbody>",
        );
        for (task, shown) in tasks.iter().take(50) {
            let _ = write!(
                body,
                "<tr><td><a href=\"{}\">{}</a></td><td>{}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td>{}</td></tr>",
                task_href(&task.id),
                text(&task.id),
                badge(shown.status),
                thousands(task.tokens_spent),
                thousands(task.tokens_saved),
                task.max_tokens.map_or(String::new(), thousands)
            );
        }
        body.push_str("</tbody></table>");
    }
    Ok(Reply::html(page(
        "Tokens",
        &shared.keys.csrf,
        Some("list"),
        &body,
    )))
}

/// The workers (SPEC 11) and each queue's tasks by status.
pub(super) fn workers(shared: &Shared) -> Result<Reply> {
    let workers = shared.read(|journal| match journal {
        Some(journal) => journal.workers(),
        None => Ok(Vec::new()),
    })?;
    let tasks = all_tasks(shared)?;
    let now_ms = crate::journal::now_ms();
    let late = shared.settings.lease.heartbeat * 2;
    let mut body = String::from("<h1>Workers</h1>");
    if workers.is_empty() {
        body.push_str(
            "<p class=\"empty\">No live workers: <code>durun worker</code> starts one.</p>",
        );
    } else {
        body.push_str(
            "<table><thead><tr><th>Worker</th><th>Queues</th><th class=\"num\">Jobs</th>\
             <th>Heartbeat</th><th>Tasks</th><th>Started</th></tr></thead><tbody>",
        );
        for worker in &workers {
            let beat = now_ms.saturating_sub(worker.heartbeat_ms).max(0) as u64;
            let stale = std::time::Duration::from_millis(beat) > late;
            let mut running = String::new();
            for task in &worker.tasks {
                let _ = write!(
                    running,
                    "<a href=\"{}\">{}</a> ",
                    task_href(task),
                    text(task)
                );
            }
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td class=\"num\">{}/{}</td><td{}>{} ago{}</td><td>{}</td><td>{}</td></tr>",
                text(&worker.id),
                text(&worker.queues.join(", ")),
                worker.tasks.len(),
                worker.jobs,
                if stale { " class=\"stale\"" } else { "" },
                crate::report::short_duration(std::time::Duration::from_millis(beat)),
                if stale { ", stale" } else { "" },
                running,
                text(&worker.started_at)
            );
        }
        body.push_str("</tbody></table>");
    }
    let mut queues: BTreeMap<&str, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for (task, shown) in &tasks {
        if let Some(queue) = &task.queue {
            *queues
                .entry(queue)
                .or_default()
                .entry(shown.status.as_str())
                .or_default() += 1;
        }
    }
    body.push_str("<h1>Queues</h1>");
    if queues.is_empty() {
        body.push_str("<p class=\"empty\">No task was submitted to a queue: <code>durun submit --queue Q -- CMD</code>.</p>");
    } else {
        body.push_str("<table><thead><tr><th>Queue</th>");
        for status in STATUSES {
            let _ = write!(body, "<th class=\"num\">{}</th>", status.as_str());
        }
        body.push_str("</tr></thead><tbody>");
        for (queue, counts) in &queues {
            let _ = write!(
                body,
                "<tr><td><a href=\"/?q={}\">{}</a></td>",
                text(&query_value(queue)),
                text(queue)
            );
            for status in STATUSES {
                let _ = write!(
                    body,
                    "<td class=\"num\">{}</td>",
                    counts.get(status.as_str()).copied().unwrap_or(0)
                );
            }
            body.push_str("</tr>");
        }
        body.push_str("</tbody></table>");
    }
    Ok(Reply::html(page(
        "Workers and queues",
        &shared.keys.csrf,
        Some("list"),
        &body,
    )))
}

/// `/api/tasks`: what `inspect --json` prints.
pub(super) fn api_tasks(shared: &Shared) -> Result<Reply> {
    let tasks = all_tasks(shared)?;
    let mut out = Vec::new();
    list_json(&tasks, &mut out)?;
    Ok(Reply::json(out))
}

/// `/api/live?key=list|task:ID`: a digest of what the page shows, which
/// its script asks for every second and reloads the page's content when
/// it changes.
pub(super) fn live(req: &Req, shared: &Shared) -> Result<Reply> {
    let key = req.field("key").unwrap_or("list");
    let mut digest = Sha256::new();
    match key.strip_prefix("task:") {
        Some(id) => {
            shared.read_task(id, |journal, task| {
                let shown = crate::task::shown(journal, &task, &shared.settings)?;
                let last = journal.steps_tail(id, Some(1))?;
                let signals = journal.signals(id)?.len();
                digest.update(format!(
                    "{}\0{}\0{}\0{}\0{}\0{signals}\0",
                    shown.status.as_str(),
                    task.updated_at,
                    task.runs,
                    journal.count_steps(id)?,
                    task.tokens_spent
                ));
                for step in last {
                    digest.update(format!(
                        "{}\0{}\0{:?}\0{}",
                        step.step,
                        step.status.as_str(),
                        step.finished_at,
                        step.attempts
                    ));
                }
                Ok(())
            })?;
        }
        None => {
            for (task, shown) in all_tasks(shared)? {
                digest.update(format!(
                    "{}\0{}\0{}\0{}\0{}\0",
                    task.id,
                    shown.status.as_str(),
                    task.updated_at,
                    task.steps,
                    task.tokens_spent
                ));
            }
        }
    }
    let version = hex(&digest.finalize()[..12]);
    Ok(Reply::json(
        serde_json::json!({ "version": version })
            .to_string()
            .into_bytes(),
    ))
}
