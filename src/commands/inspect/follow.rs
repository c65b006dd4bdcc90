//! `inspect --follow`: a running task's steps as they start and finish;
//! with `--json`, its events (SPEC 20) as JSON lines, the very ones the
//! web view streams.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Result;

use super::views::{step_tone, task_tone, took};
use crate::journal::{Journal, StepStatus, TaskRecord, TaskStatus};
use crate::report::table::{self, Style};
use crate::report::{escape, short_duration, thousands};
use crate::settings::Settings;
use crate::task::events::{Cursor, Follower};
use crate::task::live::Live;
use crate::task::shown_status;

/// How often `--follow` looks at the journal.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

pub(super) fn follow(
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

/// `inspect --follow --json`: the task's events from its first (or from
/// right after `cursor`), one JSON object a line, until it stops running.
pub(super) fn follow_events(
    journal: &mut dyn Journal,
    task: TaskRecord,
    cursor: Cursor,
    settings: &Settings,
) -> Result<i32> {
    const BATCH: u64 = 256;
    let mut out = std::io::stdout().lock();
    let live = crate::journal::Location::of(settings)
        .ok()
        .and_then(|location| Live::of(settings, &location, &task.id));
    let running = shown_status(&task, settings) == TaskStatus::Running;
    let mut follower = Follower::new(&task.id, cursor, live, running);
    let mut task = task;
    loop {
        // The status first: the events read after it hold the last ones.
        let running = shown_status(&task, settings) == TaskStatus::Running;
        loop {
            let events = follower.next(journal, BATCH)?;
            for event in &events {
                serde_json::to_writer(&mut out, &event.data)?;
                out.write_all(b"\n")?;
            }
            if (events.len() as u64) < BATCH {
                break;
            }
        }
        out.flush()?;
        if !running {
            return Ok(0);
        }
        std::thread::sleep(FOLLOW_EVERY);
        task = journal
            .task(&task.id)?
            .ok_or_else(|| anyhow::anyhow!("task {} vanished from the journal", task.id))?;
    }
}
