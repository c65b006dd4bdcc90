//! `durun inspect`: the task list, one task's runs and steps, one step
//! whole, or a running task followed live.
//!
//! `--json` prints the shape of SPEC 6 for scripts; without it, tables for
//! people that fit the terminal. Reading never writes the journal and
//! never waits for a runner (WAL readers do not block writers).

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use serde_json::{Value, json};

use crate::cli::{InspectArgs, StatusFilter};
use crate::journal::{
    Access, Journal, ResolutionKind, RunRecord, StepRecord, StepStatus, TaskRecord, TaskStatus,
};
use crate::json_text::JsonText;
use crate::report::table::{self, Column, Style, Tone};
use crate::report::{escape, short_duration, thousands};
use crate::settings::Settings;
use crate::task::{shell_words, shown_status, unknown_task};

/// How many steps the task view shows unless `--all` says every one.
const VIEW_LIMIT: usize = 500;

/// How often `--follow` looks at the journal.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

pub fn exec(args: &InspectArgs, settings: &Settings) -> Result<i32> {
    let location = settings.location()?;
    let now = settings.now();
    let missing = !location.exists()?;
    let style = Style::stdout();
    let mut out = std::io::stdout().lock();
    let Some(id) = &args.task else {
        let tasks = if missing {
            // No journal yet: no tasks.
            Vec::new()
        } else {
            location.open(Access::Read, settings)?.tasks()?
        };
        let tasks: Vec<TaskRecord> = tasks
            .into_iter()
            .filter(|task| {
                args.status
                    .is_none_or(|wanted| status_matches(wanted, shown_status(task, settings)))
            })
            .take(args.limit.unwrap_or(usize::MAX))
            .collect();
        if args.json {
            let tasks: Vec<Value> = tasks
                .iter()
                .map(|task| task_summary_json(task, settings))
                .collect();
            writeln!(out, "{}", json!({ "tasks": tasks }))?;
        } else {
            out.write_all(task_list(&style, settings, &tasks, now).as_bytes())?;
        }
        out.flush()?;
        return Ok(0);
    };
    if missing {
        return Err(unknown_task(id, &location).into());
    }
    let mut journal = location.open(Access::Read, settings)?;
    let Some(task) = journal.task(id)? else {
        return Err(unknown_task(id, &location).into());
    };
    if args.follow {
        drop(out);
        return follow(journal.as_mut(), task, &style, settings);
    }
    let runs = journal.runs(id)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, out);
    if args.json && args.step.is_none() {
        // Streamed: each step is written as it is read.
        out.write_all(b"{\"task\":")?;
        serde_json::to_writer(&mut out, &task_out(&task, &runs, settings))?;
        out.write_all(b",\"steps\":[")?;
        let mut first = true;
        journal.visit_steps(id, true, None, &mut |step| {
            if !std::mem::take(&mut first) {
                out.write_all(b",")?;
            }
            serde_json::to_writer(&mut out, &step_json(&step))?;
            Ok(())
        })?;
        out.write_all(b"]}\n")?;
    } else if let Some(n) = args.step {
        let steps = journal.step_versions(id, n)?;
        if args.json {
            let steps: Vec<StepOut<'_>> = steps.iter().map(step_json).collect();
            serde_json::to_writer(
                &mut out,
                &json!({"task": task_out(&task, &runs, settings), "steps": steps}),
            )?;
            writeln!(out)?;
            out.flush()?;
            return Ok(0);
        }
        let matching: Vec<&StepRecord> = steps.iter().collect();
        if matching.is_empty() {
            return Err(
                crate::error::Failure::config(format!("task {id} has no step {n}"))
                    .hint(format!("`durun inspect {id}` lists its steps"))
                    .into(),
            );
        }
        for (i, step) in matching.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            out.write_all(step_view(&style, settings, &task, step, now).as_bytes())?;
        }
    } else {
        let total = journal.count_steps(id)?;
        let last = (!args.all && total > VIEW_LIMIT as u64).then_some(VIEW_LIMIT);
        let steps = journal.steps_tail(id, last)?;
        out.write_all(task_view(&style, settings, &task, &runs, &steps, now).as_bytes())?;
        if last.is_some() {
            writeln!(
                out,
                "… the last {VIEW_LIMIT} of {} steps; `--all` shows every one, `--json` prints them for scripts",
                thousands(total)
            )?;
        }
    }
    out.flush()?;
    Ok(0)
}

fn status_matches(wanted: StatusFilter, status: TaskStatus) -> bool {
    matches!(
        (wanted, status),
        (StatusFilter::Running, TaskStatus::Running)
            | (StatusFilter::Completed, TaskStatus::Completed)
            | (StatusFilter::Failed, TaskStatus::Failed)
            | (StatusFilter::Interrupted, TaskStatus::Interrupted)
            | (StatusFilter::Cancelled, TaskStatus::Cancelled)
    )
}

fn task_summary_json(task: &TaskRecord, settings: &Settings) -> Value {
    json!({
        "id": task.id,
        "status": shown_status(task, settings).as_str(),
        "command": task.argv,
        "steps": task.steps,
        "tokens_spent": task.tokens_spent,
        "tokens_saved": task.tokens_saved,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
    })
}

/// `inspect TASK --json` (SPEC 6) is `{"task": TaskOut, "steps": [StepOut]}`.
/// Step JSON is embedded as the journal holds it, never parsed and printed
/// again, and streamed: 100,000 steps stay fast.
#[derive(serde::Serialize)]
struct TaskOut<'a> {
    id: &'a str,
    status: &'static str,
    command: &'a [String],
    cwd: &'a str,
    exit_code: Option<i32>,
    output: &'a Option<Value>,
    sync: &'static str,
    config_path: &'a Option<String>,
    steps: u64,
    tokens_spent: u64,
    tokens_saved: u64,
    created_at: &'a str,
    updated_at: &'a str,
    runs: Vec<RunOut<'a>>,
}

#[derive(serde::Serialize)]
struct RunOut<'a> {
    run: u32,
    exit_code: Option<i32>,
    replayed_steps: u64,
    executed_steps: u64,
    tokens_spent: u64,
    tokens_saved: u64,
    host: &'a str,
    pid: u32,
    started_at: &'a str,
    finished_at: &'a Option<String>,
}

#[derive(serde::Serialize)]
struct StepOut<'a> {
    step: u64,
    name: &'a str,
    kind: &'static str,
    effect: &'static str,
    status: &'static str,
    args: &'a JsonText,
    args_hash: &'a str,
    idempotency_key: &'a str,
    attempts: u32,
    output: &'a Option<JsonText>,
    error: Option<ErrorOut<'a>>,
    usage: &'a Option<JsonText>,
    tokens: u64,
    resolution: Option<&'static str>,
    created_at: &'a str,
    started_at: &'a str,
    finished_at: &'a Option<String>,
}

#[derive(serde::Serialize)]
struct ErrorOut<'a> {
    code: &'a str,
    message: &'a str,
}

fn task_out<'a>(task: &'a TaskRecord, runs: &'a [RunRecord], settings: &Settings) -> TaskOut<'a> {
    TaskOut {
        id: &task.id,
        status: shown_status(task, settings).as_str(),
        command: &task.argv,
        cwd: &task.cwd,
        exit_code: task.exit_code,
        output: &task.output,
        sync: task.sync.as_str(),
        config_path: &task.config_path,
        steps: task.steps,
        tokens_spent: task.tokens_spent,
        tokens_saved: task.tokens_saved,
        created_at: &task.created_at,
        updated_at: &task.updated_at,
        runs: runs
            .iter()
            .map(|run| RunOut {
                run: run.run,
                exit_code: run.exit_code,
                replayed_steps: run.stats.replayed_steps,
                executed_steps: run.stats.executed_steps,
                tokens_spent: run.stats.tokens_spent,
                tokens_saved: run.stats.tokens_saved,
                host: &run.host,
                pid: run.pid,
                started_at: &run.started_at,
                finished_at: &run.finished_at,
            })
            .collect(),
    }
}

fn step_json(step: &StepRecord) -> StepOut<'_> {
    StepOut {
        step: step.step,
        name: &step.name,
        kind: step.kind.as_str(),
        effect: step.effect.as_str(),
        status: step.status.as_str(),
        args: &step.args,
        args_hash: &step.args_hash,
        idempotency_key: &step.idempotency_key,
        attempts: step.attempts,
        output: &step.output,
        error: step.error.as_ref().map(|error| ErrorOut {
            code: error.code.as_str(),
            message: &error.message,
        }),
        usage: &step.usage,
        tokens: step.tokens,
        resolution: step.resolution.map(ResolutionKind::as_str),
        created_at: &step.created_at,
        started_at: &step.started_at,
        finished_at: &step.finished_at,
    }
}

fn task_tone(status: TaskStatus) -> Tone {
    match status {
        TaskStatus::Completed => Tone::Good,
        TaskStatus::Failed => Tone::Bad,
        TaskStatus::Interrupted | TaskStatus::Running => Tone::Warn,
        TaskStatus::Cancelled => Tone::Dim,
    }
}

fn step_tone(status: StepStatus) -> Tone {
    match status {
        StepStatus::Committed => Tone::Good,
        StepStatus::Failed => Tone::Bad,
        StepStatus::Pending => Tone::Warn,
        StepStatus::Discarded => Tone::Dim,
    }
}

/// A step's state for people: a `pending` step of a task no runner drives
/// is the step its last run died in, `interrupted`.
fn step_state(step: &StepRecord, task: TaskStatus) -> &'static str {
    if step.status == StepStatus::Pending && task != TaskStatus::Running {
        "interrupted"
    } else {
        step.status.as_str()
    }
}

fn parse_time(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(text).ok()
}

/// `3m ago`, `2h ago`, `4d ago`.
fn age(then: &str, now: SystemTime) -> String {
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

fn took(started: &str, finished: Option<&str>) -> Option<Duration> {
    let started = parse_time(started)?;
    let finished = parse_time(finished?)?;
    finished.duration_since(started).ok()
}

/// `812 B`, `12.3 KiB`, `4.0 MiB`.
fn size(bytes: usize) -> String {
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

fn task_list(style: &Style, settings: &Settings, tasks: &[TaskRecord], now: SystemTime) -> String {
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
        .map(|task| {
            let status = shown_status(task, settings);
            vec![
                plain(&task.id),
                (status.as_str().to_owned(), task_tone(status)),
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

fn task_view(
    style: &Style,
    settings: &Settings,
    task: &TaskRecord,
    runs: &[RunRecord],
    steps: &[StepRecord],
    now: SystemTime,
) -> String {
    let status = shown_status(task, settings);
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
    let _ = writeln!(
        out,
        "tokens   {} spent, {} saved",
        thousands(task.tokens_spent),
        thousands(task.tokens_saved)
    );
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
    if !runs.is_empty() {
        out.push('\n');
        let columns = [
            Column::number("RUN"),
            Column::number("EXIT"),
            Column::number("REPLAYED"),
            Column::number("EXECUTED"),
            Column::number("SPENT"),
            Column::number("SAVED"),
            Column::fixed("STARTED"),
            Column::number("TOOK"),
        ];
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
                ]
            })
            .collect();
        out.push_str(&table::render(style, &columns, &rows));
    }
    out.push('\n');
    if steps.is_empty() {
        out.push_str("no steps yet\n");
        return out;
    }
    let columns = [
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
    ];
    let rows: Vec<Vec<(String, Tone)>> = steps
        .iter()
        .map(|step| {
            let result = match (&step.error, &step.output) {
                (Some(error), _) => (format!("{}: {}", error.code, error.message), Tone::Bad),
                (None, Some(output)) => plain(output.preview(200)),
                (None, None) => plain(""),
            };
            let took = took(&step.started_at, step.finished_at.as_deref())
                .map_or_else(|| "-".to_owned(), short_duration);
            vec![
                plain(step.step.to_string()),
                plain(&step.name),
                plain(step.kind.as_str()),
                plain(step.effect.as_str()),
                (step_state(step, status).to_owned(), step_tone(step.status)),
                plain(step.attempts.to_string()),
                plain(took),
                plain(if step.tokens > 0 {
                    thousands(step.tokens)
                } else {
                    String::new()
                }),
                (step.idempotency_key.chars().take(8).collect(), Tone::Dim),
                result,
            ]
        })
        .collect();
    out.push_str(&table::render(style, &columns, &rows));
    out
}

fn pretty(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => serde_json::to_string_pretty(other).expect("JSON serializes"),
    }
}

fn indented(text: &str) -> String {
    text.lines().flat_map(|line| ["  ", line, "\n"]).collect()
}

fn step_view(
    style: &Style,
    settings: &Settings,
    task: &TaskRecord,
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
        style.paint(
            step_tone(step.status),
            step_state(step, shown_status(task, settings))
        )
    );
    if let Some(resolution) = &step.resolution {
        let _ = writeln!(out, "resolution  {resolution} (durun resolve)");
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
    }
    let _ = write!(
        out,
        "args\n{}",
        indented(&escape(&pretty(&step.args.value())))
    );
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

/// Prints the task's steps as they start and finish, until it stops.
fn follow(
    journal: &mut dyn Journal,
    task: TaskRecord,
    style: &Style,
    settings: &Settings,
) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    let mut seen: std::collections::HashMap<(u64, String), (StepStatus, u32)> =
        std::collections::HashMap::new();
    writeln!(
        out,
        "following task {} ({})",
        escape(&task.id),
        shown_status(&task, settings).as_str()
    )?;
    out.flush()?;
    let mut task = task;
    loop {
        for step in journal.steps(&task.id, false)? {
            let key = (step.step, step.idempotency_key.clone());
            let state = (step.status, step.attempts);
            if seen.get(&key) == Some(&state) {
                continue;
            }
            seen.insert(key, state);
            let mut line = format!(
                "step {} {} {}",
                step.step,
                escape(&step.name),
                style.paint(step_tone(step.status), step.status.as_str())
            );
            if let Some(took) = took(&step.started_at, step.finished_at.as_deref()) {
                let _ = write!(line, " in {}", short_duration(took));
            }
            if step.tokens > 0 {
                let _ = write!(line, ", {} tokens", thousands(step.tokens));
            }
            if let Some(error) = &step.error {
                let _ = write!(line, ": {}", table::fit(&error.message, 80));
            }
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        let status = shown_status(&task, settings);
        if status != TaskStatus::Running {
            let exit = task
                .exit_code
                .map_or_else(String::new, |code| format!(" (exit {code})"));
            writeln!(
                out,
                "task {} {}{exit}",
                escape(&task.id),
                style.paint(task_tone(status), status.as_str())
            )?;
            return Ok(0);
        }
        std::thread::sleep(FOLLOW_EVERY);
        task = journal
            .task(&task.id)?
            .ok_or_else(|| anyhow::anyhow!("task {} vanished from the journal", task.id))?;
    }
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
