//! Schedules (SPEC 16): `durun schedules`, and what a worker does with
//! `[schedules.NAME]`: at each tick, submit the tick's task.
//!
//! Any number of workers may share the schedules: a tick's task id is
//! fixed (`NAME-YYYYMMDDTHHMMSSZ`), so of workers racing to submit it the
//! journal's primary key keeps one. A worker looks at the journal only
//! when a tick is due: one query for the schedule's last task (the tick
//! every worker agrees was last submitted), one insert per new tick.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Result;
use serde_json::json;

use crate::cli::SchedulesArgs;
use crate::config::{CatchUp, Config, MAX_CATCH_UP, Schedule};
use crate::journal::{Access, Journal, Location};
use crate::settings::Settings;

/// How late a tick may be found and still count as on time, not missed.
const GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A schedule as a worker follows it.
pub(crate) struct Ticking {
    schedule: Schedule,
    /// Where its tasks run.
    cwd: PathBuf,
    /// The tick this worker waits for; `None` before its first look.
    next: Option<SystemTime>,
}

impl Ticking {
    pub(crate) fn all(config: &Config, cwd: &Path) -> Vec<Self> {
        config
            .schedules
            .iter()
            .map(|schedule| Self {
                cwd: schedule
                    .cwd
                    .as_ref()
                    .map_or_else(|| cwd.to_owned(), |dir| cwd.join(dir)),
                schedule: schedule.clone(),
                next: None,
            })
            .collect()
    }
}

/// Submits the tasks of the ticks that are due; returns the ids submitted
/// by this worker.
pub(crate) fn submit_due(
    schedules: &mut [Ticking],
    journal: &mut dyn Journal,
    now: SystemTime,
    settings: &Settings,
) -> Result<Vec<String>> {
    let mut submitted = Vec::new();
    for ticking in schedules {
        if ticking.next.is_some_and(|next| next > now) {
            continue;
        }
        let schedule = &ticking.schedule;
        let last = journal
            .latest_task_id(&format!("{}-", schedule.name))?
            .and_then(|id| schedule.tick_of(&id));
        // The ticks since the last task any worker submitted; with none
        // ever, only those this worker was waiting for.
        let ticks = match (last, ticking.next) {
            (Some(last), _) => schedule.ticks(last, now, MAX_CATCH_UP),
            (None, Some(next)) => schedule.ticks(
                next.checked_sub(std::time::Duration::from_secs(1))
                    .unwrap_or(next),
                now,
                MAX_CATCH_UP,
            ),
            (None, None) => Vec::new(),
        };
        // A tick this worker was waiting for, come a moment ago, is on
        // time; the others were missed while no worker ran (or while this
        // one was stopped).
        let on_time = |tick: &SystemTime| {
            ticking.next.is_some_and(|next| *tick >= next)
                && now.duration_since(*tick).unwrap_or_default() <= GRACE
        };
        let (on_time, missed): (Vec<SystemTime>, Vec<SystemTime>) =
            ticks.into_iter().partition(on_time);
        let chosen: Vec<SystemTime> = match schedule.catch_up {
            CatchUp::All => missed.into_iter().chain(on_time).collect(),
            CatchUp::Latest => missed.last().copied().into_iter().chain(on_time).collect(),
            CatchUp::Skip => on_time,
        };
        for tick in chosen {
            let id = schedule.task_id(tick);
            if submit(journal, schedule, &ticking.cwd, &id, settings)? {
                submitted.push(id);
            }
        }
        ticking.next = schedule.next_after(now);
    }
    Ok(submitted)
}

/// Queues the tick's task unless a worker did; whether this one did.
fn submit(
    journal: &mut dyn Journal,
    schedule: &Schedule,
    cwd: &Path,
    id: &str,
    settings: &Settings,
) -> Result<bool> {
    if journal.task(id)?.is_some() {
        return Ok(false);
    }
    let task = crate::task::new_task(
        id.to_owned(),
        &schedule.command,
        cwd,
        None,
        crate::task::Budget::default(),
        Some(schedule.queue.clone()),
        settings,
    )?;
    match journal.create_task(&task) {
        Ok(()) => Ok(true),
        // Another worker submitted it first: the key kept one.
        Err(_) if journal.task(id)?.is_some() => Ok(false),
        Err(err) => Err(err),
    }
}

/// `durun schedules`: each schedule with its next tick and its last task.
pub(crate) fn exec(args: &SchedulesArgs, settings: &Settings) -> Result<i32> {
    let cwd = std::env::current_dir()?;
    let (config, path) = Config::discover(args.config.as_deref(), &cwd)?;
    let location = Location::of(settings)?;
    let mut journal = if location.exists()? {
        Some(location.open(Access::Read, settings)?)
    } else {
        None
    };
    let now = settings.now();
    let mut rows = Vec::new();
    for schedule in &config.schedules {
        let last = match journal.as_mut() {
            Some(journal) => match journal.latest_task_id(&format!("{}-", schedule.name))? {
                Some(id) => {
                    let status = journal
                        .task(&id)?
                        .map(|task| crate::task::shown_status(&task, settings));
                    Some((id, status))
                }
                None => None,
            },
            None => None,
        };
        rows.push((schedule, schedule.next_after(now), last));
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let schedules: Vec<serde_json::Value> = rows
            .iter()
            .map(|(schedule, next, last)| {
                json!({
                    "name": schedule.name,
                    "when": schedule.describe(),
                    "queue": schedule.queue,
                    "command": schedule.command,
                    "catch_up": match schedule.catch_up {
                        CatchUp::Latest => "latest",
                        CatchUp::Skip => "none",
                        CatchUp::All => "all",
                    },
                    "next": next.map(crate::clock::stamp),
                    "next_task": next.map(|next| schedule.task_id(next)),
                    "last_task": last.as_ref().map(|(id, _)| id),
                    "last_status": last.as_ref().and_then(|(_, status)| status.map(crate::journal::TaskStatus::as_str)),
                })
            })
            .collect();
        writeln!(out, "{}", json!({ "schedules": schedules }))?;
        return Ok(0);
    }
    if rows.is_empty() {
        crate::report::say(&match path {
            Some(path) => format!("{} has no [schedules.NAME]", path.display()),
            None => "no durun.toml here, and no --config: no schedules".to_owned(),
        });
        return Ok(0);
    }
    let name_width = rows
        .iter()
        .map(|(schedule, ..)| schedule.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let when_width = rows
        .iter()
        .map(|(schedule, ..)| schedule.describe().len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "{:<name_width$}  {:<when_width$}  {:<20}  {:<12}  LAST TASK",
        "NAME", "WHEN", "NEXT (UTC)", "QUEUE"
    )?;
    for (schedule, next, last) in &rows {
        let next = next.map_or_else(
            || "never".to_owned(),
            |next| humantime::format_rfc3339_seconds(next).to_string(),
        );
        let last = last.as_ref().map_or_else(
            || "none yet".to_owned(),
            |(id, status)| format!("{id} ({})", status.map_or("gone", |status| status.as_str())),
        );
        writeln!(
            out,
            "{:<name_width$}  {:<when_width$}  {next:<20}  {:<12}  {}",
            crate::report::escape(&schedule.name),
            schedule.describe(),
            crate::report::escape(&schedule.queue),
            crate::report::escape(&last)
        )?;
    }
    Ok(0)
}
