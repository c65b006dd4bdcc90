//! `inspect` for people: the task list, one task's runs and steps, one
//! step whole. Tables fit the terminal; everything that came from the
//! journal is escaped before it is shown.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::journal::{RunRecord, StepRecord, StepStatus, TaskRecord, TaskStatus};
use crate::report::table::{self, Column, Style, Tone};
use crate::report::{escape, short_duration, thousands};
use crate::task::{Shown, shell_words};

pub(super) fn task_tone(status: TaskStatus) -> Tone {
    match status {
        TaskStatus::Completed => Tone::Good,
        TaskStatus::Failed => Tone::Bad,
        TaskStatus::Interrupted
        | TaskStatus::Running
        | TaskStatus::Waiting
        | TaskStatus::Sleeping
        | TaskStatus::OverBudget => Tone::Warn,
        TaskStatus::Queued | TaskStatus::Cancelled => Tone::Dim,
    }
}

pub(super) fn step_tone(status: StepStatus) -> Tone {
    match status {
        StepStatus::Committed => Tone::Good,
        StepStatus::Failed => Tone::Bad,
        StepStatus::Pending | StepStatus::Waiting => Tone::Warn,
        StepStatus::Discarded => Tone::Dim,
    }
}

/// A step's state for people: a `pending` step of a task no runner drives
/// is the step its last run died in, `interrupted`.
pub(super) fn step_state(step: &StepRecord, driven: bool) -> &'static str {
    if step.status == StepStatus::Pending && !driven {
        "interrupted"
    } else if step.resolution == Some(crate::journal::ResolutionKind::Edited) {
        "edited"
    } else if step.resolution == Some(crate::journal::ResolutionKind::Reconciled) {
        "reconciled"
    } else {
        step.status.as_str()
    }
}

fn parse_time(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(text).ok()
}

/// When a worker resumes a task it holds back after crashes, and why
/// (the task view, the web view); None when it is not held back, or no
/// worker takes it (a task of `durun run`, in no queue).
pub(crate) fn held(task: &TaskRecord, runs: &[RunRecord], now: SystemTime) -> Option<String> {
    let wait = crate::task::crashes::left(runs, now);
    (task.queue.is_some() && !wait.is_zero()).then(|| {
        format!(
            "by a worker in {}: its agent was killed by a signal in its last {} runs",
            short_duration(wait),
            crate::task::crashes::in_a_row(runs)
        )
    })
}

/// `3m ago`, `2h ago`, `4d ago`.
pub(crate) fn age(then: &str, now: SystemTime) -> String {
    let Some(elapsed) = parse_time(then).and_then(|then| now.duration_since(then).ok()) else {
        return "just now".to_owned();
    };
    let secs = elapsed.as_secs();
    match secs {
        0..=59 => format!("{secs}s ago"),
        60..=3599 => format!("{}m ago", secs / 60),
        3600..=86_399 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

pub(crate) fn took(started: &str, finished: Option<&str>) -> Option<Duration> {
    let started = parse_time(started)?;
    let finished = parse_time(finished?)?;
    finished.duration_since(started).ok()
}

/// `812 B`, `12.3 KiB`, `4.0 MiB`.
pub(super) fn size(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    let bytes_f = bytes as f64;
    if bytes_f < KIB {
        format!("{bytes} B")
    } else if bytes_f < KIB * KIB {
        format!("{:.1} KiB", bytes_f / KIB)
    } else {
        format!("{:.1} MiB", bytes_f / KIB / KIB)
    }
}

fn preview(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn plain(text: impl Into<String>) -> (String, Tone) {
    (text.into(), Tone::Plain)
}

pub(super) fn task_list(style: &Style, tasks: &[(TaskRecord, Shown)], now: SystemTime) -> String {
    if tasks.is_empty() {
        return "no tasks\n".to_owned();
    }
    let columns = [
        Column::fixed("TASK"),
        Column::fixed("STATUS"),
        Column::number("STEPS"),
        Column::number("SPENT"),
        Column::number("SAVED"),
        Column::fixed("AGE"),
        Column::flexible("COMMAND"),
    ];
    let rows: Vec<Vec<(String, Tone)>> = tasks
        .iter()
        .map(|(task, shown)| {
            let status = shown.status;
            // Who runs it, for a running task: the worker's host and pid.
            let shown = match (&task.lease, status) {
                (Some(lease), TaskStatus::Running) => {
                    format!("running on {}:{}", lease.host, lease.pid)
                }
                (_, TaskStatus::Queued) => {
                    format!("queued in {}", task.queue.as_deref().unwrap_or("default"))
                }
                _ => status.as_str().to_owned(),
            };
            vec![
                plain(&task.id),
                (shown, task_tone(status)),
                plain(task.steps.to_string()),
                plain(thousands(task.tokens_spent)),
                plain(thousands(task.tokens_saved)),
                plain(age(&task.created_at, now)),
                plain(shell_words(&task.argv)),
            ]
        })
        .collect();
    table::render(style, &columns, &rows)
}

/// `inspect --workers`: the live workers.
pub(super) fn worker_list(
    style: &Style,
    workers: &[crate::journal::WorkerRecord],
    now_ms: i64,
    late: Duration,
) -> String {
    if workers.is_empty() {
        return "no live workers\n".to_owned();
    }
    let columns = [
        Column::fixed("WORKER"),
        Column::fixed("QUEUES"),
        Column::number("JOBS"),
        Column::number("HEARTBEAT"),
        Column::flexible("TASKS"),
    ];
    let rows: Vec<Vec<(String, Tone)>> = workers
        .iter()
        .map(|worker| {
            let beat =
                Duration::from_millis(now_ms.saturating_sub(worker.heartbeat_ms).max(0) as u64);
            // Two heartbeats missed: the worker may be gone or stopped.
            let heartbeat = if beat > late {
                (format!("{} ago, stale", short_duration(beat)), Tone::Warn)
            } else {
                plain(format!("{} ago", short_duration(beat)))
            };
            vec![
                plain(&worker.id),
                plain(worker.queues.join(",")),
                plain(format!("{}/{}", worker.tasks.len(), worker.jobs)),
                heartbeat,
                plain(worker.tasks.join(" ")),
            ]
        })
        .collect();
    table::render(style, &columns, &rows)
}

pub(super) fn task_view(
    style: &Style,
    (task, shown, family): (&TaskRecord, &Shown, &crate::task::Family),
    runs: &[RunRecord],
    steps: &[StepRecord],
    now: SystemTime,
) -> String {
    let mut out = task_header(style, (task, shown, family), runs, now);
    if !runs.is_empty() {
        out.push('\n');
        out.push_str(&runs_table(style, runs, now));
    }
    // Why durun ended the last run (a divergence's diff, say): the
    // terminal that showed it may be long gone.
    if let Some((run, error)) = runs
        .last()
        .and_then(|run| Some((run.run, run.error.as_deref()?)))
    {
        out.push('\n');
        let title = format!("run {run} was ended by durun:");
        let _ = writeln!(out, "{}", style.paint(Tone::Bad, &title));
        for line in error.lines() {
            let _ = writeln!(out, "  {}", escape(line));
        }
    }
    out.push('\n');
    if steps.is_empty() {
        out.push_str("no steps yet\n");
        return out;
    }
    out.push_str(&steps_table(style, shown, runs, steps));
    if let Some(run) = runs.last()
        && !run.unreplayed.is_empty()
    {
        out.push_str(&not_replayed(run, steps));
    }
    out
}

/// The task's lines above its tables: id, status, command, family, what
/// it waits for, tokens, journal, output.
fn task_header(
    style: &Style,
    (task, shown, family): (&TaskRecord, &Shown, &crate::task::Family),
    runs: &[RunRecord],
    now: SystemTime,
) -> String {
    let status = shown.status;
    let waiting = shown.waiting.as_ref();
    let mut out = String::new();
    let exit = task
        .exit_code
        .map_or_else(String::new, |code| format!(", exit {code}"));
    let _ = writeln!(out, "task     {}", style.paint(Tone::Bold, &task.id));
    let _ = writeln!(
        out,
        "status   {}{exit}",
        style.paint(task_tone(status), status.as_str())
    );
    let _ = writeln!(out, "command  {}", escape(&shell_words(&task.argv)));
    let _ = writeln!(out, "cwd      {}", escape(&task.cwd));
    if let Some(parent) = &family.parent {
        let _ = writeln!(out, "parent   {}", escape(parent));
    }
    if !family.children.is_empty() {
        let children: Vec<String> = family
            .children
            .iter()
            .map(|(id, status)| format!("{} ({})", escape(id), status.as_str()))
            .collect();
        let _ = writeln!(out, "children {}", children.join(", "));
    }
    if let Some(step) = waiting {
        let what = match step.kind {
            crate::journal::StepKind::Sleep => format!(
                "until {} (step {}, a sleep)",
                step.wake_at.as_deref().unwrap_or("?"),
                step.step
            ),
            crate::journal::StepKind::Join => format!(
                "for its child task {} to end (step {})",
                escape(step.args.value()["task"].as_str().unwrap_or("?")),
                step.step
            ),
            _ => format!(
                "for the signal `{}` (step {}){}; `durun approve {}` or `durun signal {} {} --data JSON`",
                escape(&step.name),
                step.step,
                step.wake_at
                    .as_deref()
                    .map_or_else(String::new, |at| format!(", times out {at}")),
                task.id,
                task.id,
                escape(&step.name)
            ),
        };
        let _ = writeln!(out, "waits    {what}");
    }
    // A worker holds back an agent that keeps dying (see task::crashes):
    // say so, or the task looks forgotten.
    if status == TaskStatus::Interrupted
        && let Some(held) = held(task, runs, now)
    {
        let _ = writeln!(
            out,
            "resumes  {held} (`durun resume {}` resumes it now)",
            escape(&task.id)
        );
    }
    super::money::spending(&mut out, task);
    let runs_count = if task.runs == 1 {
        "1 run".to_owned()
    } else {
        format!("{} runs", task.runs)
    };
    let _ = writeln!(
        out,
        "journal  sync {}, {runs_count}, created {}",
        task.sync.as_str(),
        age(&task.created_at, now)
    );
    if let Some(output) = &task.output {
        let width = style.width.saturating_sub(9);
        let _ = writeln!(out, "output   {}", table::fit(&preview(output), width));
    }
    out
}

/// One row a run: its exit, steps, tokens and times.
fn runs_table(style: &Style, runs: &[RunRecord], now: SystemTime) -> String {
    let columns = [
        Column::number("RUN"),
        Column::number("EXIT"),
        Column::number("REPLAYED"),
        Column::number("EXECUTED"),
        Column::number("SPENT"),
        Column::number("SAVED"),
        Column::fixed("STARTED"),
        Column::number("TOOK"),
        Column::number("COST"),
    ];
    // The cost column only where a run cost something at a known price.
    let priced = runs
        .iter()
        .any(|run| run.stats.cost.spent_nanos > 0 || run.stats.cost.saved_nanos > 0);
    let columns = if priced {
        &columns[..]
    } else {
        &columns[..columns.len() - 1]
    };
    let rows: Vec<Vec<(String, Tone)>> = runs
        .iter()
        .map(|run| {
            let exit = run
                .exit_code
                .map_or_else(|| "-".to_owned(), |code| code.to_string());
            let tone = match run.exit_code {
                Some(0) => Tone::Good,
                Some(_) => Tone::Bad,
                None => Tone::Warn,
            };
            vec![
                plain(run.run.to_string()),
                (exit, tone),
                plain(run.stats.replayed_steps.to_string()),
                plain(run.stats.executed_steps.to_string()),
                plain(thousands(run.stats.tokens_spent)),
                plain(thousands(run.stats.tokens_saved)),
                plain(age(&run.started_at, now)),
                plain(
                    took(&run.started_at, run.finished_at.as_deref())
                        .map_or_else(|| "-".to_owned(), short_duration),
                ),
                plain(crate::prices::shown(run.stats.cost.spent_nanos)),
            ]
            .into_iter()
            .take(columns.len())
            .collect()
        })
        .collect();
    table::render(style, columns, &rows)
}

/// One row a step, narrower than 100 columns without the kind, tries and
/// key.
fn steps_table(style: &Style, shown: &Shown, runs: &[RunRecord], steps: &[StepRecord]) -> String {
    // The last run's recorded requests that no request asked for.
    let unreplayed: &[u64] = runs.last().map_or(&[], |run| run.unreplayed.as_slice());
    // Narrower than 100 columns, the kind, tries and key give their room
    // to the name and the output (`--step N` shows them).
    let narrow = style.width < 100;
    let wide_only = ["KIND", "TRIES", "KEY"];
    let columns: Vec<Column> = [
        Column::number("STEP"),
        Column::flexible("NAME"),
        Column::fixed("KIND"),
        Column::fixed("EFFECT"),
        Column::fixed("STATUS"),
        Column::number("TRIES"),
        Column::number("TOOK"),
        Column::number("TOKENS"),
        Column::fixed("KEY"),
        Column::flexible("OUTPUT"),
    ]
    .into_iter()
    .filter(|column| !(narrow && wide_only.contains(&column.title)))
    .collect();
    let rows: Vec<Vec<(String, Tone)>> = steps
        .iter()
        .map(|step| {
            let result = step_result(step);
            let took = took(&step.started_at, step.finished_at.as_deref())
                .map_or_else(|| "-".to_owned(), short_duration);
            let mut row = vec![
                plain(step.step.to_string()),
                plain(&step.name),
                plain(step.kind.as_str()),
                plain(step.effect.as_str()),
                if unreplayed.contains(&step.step) {
                    ("not replayed".to_owned(), Tone::Dim)
                } else {
                    (
                        step_state(step, shown.driven()).to_owned(),
                        step_tone(step.status),
                    )
                },
                plain(step.attempts.to_string()),
                plain(took),
                plain(if step.tokens > 0 {
                    thousands(step.tokens)
                } else {
                    String::new()
                }),
                (step.idempotency_key.chars().take(8).collect(), Tone::Dim),
                result,
            ];
            if narrow {
                // KIND, TRIES, KEY, from the right.
                for index in [8, 5, 2] {
                    row.remove(index);
                }
            }
            row
        })
        .collect();
    table::render(style, &columns, &rows)
}

/// What a step's OUTPUT cell says: its error, the signal that answered a
/// wait, what a waiting step waits for, a model call's or an MCP call's
/// answer, or its output.
fn step_result(step: &StepRecord) -> (String, Tone) {
    match (&step.error, &step.output) {
        (Some(error), _) => (format!("{}: {}", error.code, error.message), Tone::Bad),
        // The signal that answered a wait: who sent it, and what.
        (None, Some(output)) if step.kind == crate::journal::StepKind::Wait => {
            let signal = output.value();
            plain(format!(
                "signal from {}: {}",
                signal["by"].as_str().unwrap_or("?"),
                crate::json_text::JsonText::from_value(&signal["data"]).preview(200)
            ))
        }
        (None, None) if step.status == StepStatus::Waiting => match (step.kind, &step.wake_at) {
            (crate::journal::StepKind::Sleep, Some(at)) => plain(format!("until {at}")),
            (_, Some(at)) => plain(format!("for a signal, until {at}")),
            _ => plain("for a signal"),
        },
        (None, Some(output)) if step.kind == crate::journal::StepKind::Proxy => {
            plain(crate::proxy::summary(&step.args.value(), &output.value()))
        }
        (None, Some(output)) if step.kind == crate::journal::StepKind::Mcp => {
            let output = output.value();
            plain(
                crate::proxy::answer_text(&output)
                    .map_or_else(|| output.to_string(), |text| format!("{:?}", text.trim())),
            )
        }
        (None, Some(output)) => plain(output.preview(200)),
        (None, None) => plain(""),
    }
}

/// The recorded requests no request of `run` asked for, each with how it
/// differs from the nearest request of that run with the same name: the
/// first thing to look at when a prompt embeds a time or an id.
fn not_replayed(run: &RunRecord, steps: &[StepRecord]) -> String {
    let mut out = format!(
        "\nnot replayed in run {}: no request of the run matched {} recorded one(s); the agent's path changed, \
         or a request embeds something that changes (a time, an id): `[proxy] ignore` leaves it out of matching\n",
        run.run,
        run.unreplayed.len()
    );
    for number in &run.unreplayed {
        let Some(recorded) = steps.iter().find(|step| step.step == *number) else {
            continue;
        };
        let _ = writeln!(out, "  step {number} `{}`", escape(&recorded.name));
        let recorded_args = recorded.args.value();
        // A proxied request's lines name pointers into its body, ready for
        // `[proxy] ignore`.
        let diff = if recorded.kind == crate::journal::StepKind::Proxy {
            crate::diff::request_diff
        } else {
            crate::diff::args_diff
        };
        let nearest = steps
            .iter()
            .filter(|step| {
                step.run == run.run
                    && step.name == recorded.name
                    && !run.unreplayed.contains(&step.step)
            })
            .map(|step| {
                let lines = diff(&recorded_args, &step.args.value());
                (step.step, lines)
            })
            .min_by_key(|(_, lines)| lines.len());
        match nearest {
            Some((step, lines)) => {
                let _ = writeln!(out, "    nearest request of run {}: step {step}", run.run);
                for line in lines {
                    let _ = writeln!(out, "    {}", escape(&line));
                }
            }
            None => {
                let _ = writeln!(out, "    no request of run {} had this name", run.run);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_sizes_read_well() {
        let now = humantime::parse_rfc3339("2026-11-29T12:00:00Z").expect("time");
        assert_eq!(age("2026-11-29T11:59:50.000Z", now), "10s ago");
        assert_eq!(age("2026-11-29T11:57:00.000Z", now), "3m ago");
        assert_eq!(age("2026-11-29T09:00:00.000Z", now), "3h ago");
        assert_eq!(age("2026-11-25T12:00:00.000Z", now), "4d ago");
        assert_eq!(size(812), "812 B");
        assert_eq!(size(12_600), "12.3 KiB");
        assert_eq!(
            took("2026-11-29T12:00:00.000Z", Some("2026-11-29T12:00:01.200Z")),
            Some(Duration::from_millis(1200))
        );
    }
}
