//! `[schedules.NAME]` (SPEC 16): tasks the workers submit on a clock.
//!
//! A tick is a time in UTC, whole seconds: for `cron`, each time the
//! five-field expression matches (minutes, hours, day of month, month,
//! day of week, as POSIX cron reads them, through the `croner` crate); for
//! `every`, each multiple of the period since the Unix epoch, so that every
//! worker finds the same ticks. A tick's task is `NAME-YYYYMMDDTHHMMSSZ`:
//! the journal's primary key makes it exactly one task, whoever submits it.

use std::path::PathBuf;
use std::str::FromStr as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

/// The most missed ticks `catch_up = "all"` submits at once.
pub(crate) const MAX_CATCH_UP: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSchedule {
    cron: Option<String>,
    every: Option<String>,
    command: Vec<String>,
    queue: Option<String>,
    cwd: Option<PathBuf>,
    catch_up: Option<String>,
}

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub(crate) enum When {
    Cron(Box<croner::Cron>, String),
    Every(Duration),
}

/// Of the ticks missed while no worker ran, which get a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CatchUp {
    /// Only the last.
    Latest,
    /// None: the schedule goes on from the next tick.
    Skip,
    /// Every one (at most [`MAX_CATCH_UP`]).
    All,
}

#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    pub(crate) name: String,
    pub(crate) when: When,
    pub(crate) command: Vec<String>,
    pub(crate) queue: String,
    /// Where the task runs [default: the worker's directory].
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) catch_up: CatchUp,
}

impl Schedule {
    pub(super) fn from_raw(name: &str, raw: RawSchedule) -> Result<Self, String> {
        crate::names::check_task_id(&format!("{name}-20261202T000000Z")).map_err(|_| {
            "a schedule's name is letters, digits, `-`, `_`, `.` and `:`, at most 108 of them"
                .to_owned()
        })?;
        let when = match (raw.cron, raw.every) {
            (Some(cron), None) => {
                let fields = cron.split_whitespace().count();
                if fields != 5 {
                    return Err(format!(
                        "`cron` has five fields (minute hour day-of-month month day-of-week, UTC), not {fields}: {cron:?}"
                    ));
                }
                let parsed = croner::Cron::from_str(&cron)
                    .map_err(|err| format!("`cron` {cron:?} is not a cron expression: {err}"))?;
                When::Cron(Box::new(parsed), cron)
            }
            (None, Some(every)) => {
                let period = humantime::parse_duration(&every).map_err(|err| {
                    format!("`every` {every:?} is not a duration like \"10m\": {err}")
                })?;
                if period < Duration::from_secs(1) || period.subsec_nanos() != 0 {
                    return Err(format!(
                        "`every` is whole seconds, at least 1s, not {every:?}"
                    ));
                }
                When::Every(period)
            }
            _ => {
                return Err(
                    "give `cron = \"*/15 * * * *\"` or `every = \"10m\"`, one of them".to_owned(),
                );
            }
        };
        if raw.command.is_empty() {
            return Err(
                "`command` is the agent's argv, e.g. [\"python3\", \"digest.py\"]".to_owned(),
            );
        }
        let queue = raw.queue.unwrap_or_else(|| "default".to_owned());
        crate::names::check_queue(&queue).map_err(|err| format!("{err:#}"))?;
        let catch_up = match raw.catch_up.as_deref() {
            None | Some("latest") => CatchUp::Latest,
            Some("none") => CatchUp::Skip,
            Some("all") => CatchUp::All,
            Some(other) => {
                return Err(format!(
                    "`catch_up` is \"latest\", \"none\" or \"all\", not {other:?}"
                ));
            }
        };
        let schedule = Self {
            name: name.to_owned(),
            when,
            command: raw.command,
            queue,
            cwd: raw.cwd,
            catch_up,
        };
        // `0 0 30 2 *` parses, and never comes: a schedule that would sit
        // in the config and never run a task is refused (SPEC 17).
        if let When::Cron(_, cron) = &schedule.when
            && schedule.next_after(SystemTime::now()).is_none()
        {
            return Err(format!(
                "`cron` {cron:?} never fires (no such day comes): check its day-of-month and month"
            ));
        }
        Ok(schedule)
    }

    /// The first tick after `after`.
    pub(crate) fn next_after(&self, after: SystemTime) -> Option<SystemTime> {
        let secs = after.duration_since(UNIX_EPOCH).ok()?.as_secs();
        match &self.when {
            When::Every(period) => {
                let period = period.as_secs();
                Some(UNIX_EPOCH + Duration::from_secs((secs / period + 1) * period))
            }
            When::Cron(cron, _) => {
                let at =
                    chrono::DateTime::<chrono::Utc>::from_timestamp(i64::try_from(secs).ok()?, 0)?;
                let next = cron.find_next_occurrence(&at, false).ok()?;
                Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(next.timestamp()).ok()?))
            }
        }
    }

    /// The ticks after `after` up to `until`, oldest first, at most `limit`
    /// (the newest ones when there are more).
    pub(crate) fn ticks(
        &self,
        after: SystemTime,
        until: SystemTime,
        limit: usize,
    ) -> Vec<SystemTime> {
        let mut ticks = std::collections::VecDeque::new();
        let mut at = after;
        while let Some(next) = self.next_after(at) {
            if next > until {
                break;
            }
            if ticks.len() == limit {
                ticks.pop_front();
            }
            ticks.push_back(next);
            at = next;
        }
        ticks.into()
    }

    /// The task of the tick `at`.
    pub(crate) fn task_id(&self, at: SystemTime) -> String {
        let stamp = humantime::format_rfc3339_seconds(at).to_string();
        format!("{}-{}", self.name, stamp.replace(['-', ':'], ""))
    }

    /// The tick a task id of this schedule stands for.
    pub(crate) fn tick_of(&self, id: &str) -> Option<SystemTime> {
        let stamp = id.strip_prefix(&self.name)?.strip_prefix('-')?;
        let (date, time) = stamp.strip_suffix('Z')?.split_once('T')?;
        if date.len() != 8 || time.len() != 6 {
            return None;
        }
        let text = format!(
            "{}-{}-{}T{}:{}:{}Z",
            &date[..4],
            &date[4..6],
            &date[6..],
            &time[..2],
            &time[2..4],
            &time[4..]
        );
        humantime::parse_rfc3339(&text).ok()
    }

    /// The schedule as durun.toml says it: `cron "…"` or `every 10m`.
    pub(crate) fn describe(&self) -> String {
        match &self.when {
            When::Cron(_, text) => format!("cron {text}"),
            When::Every(period) => format!("every {}", humantime::format_duration(*period)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(toml_text: &str) -> Result<Schedule, String> {
        let raw: RawSchedule = toml::from_str(toml_text).map_err(|err| err.to_string())?;
        Schedule::from_raw("digest", raw)
    }

    fn at(text: &str) -> SystemTime {
        humantime::parse_rfc3339(text).expect("a time")
    }

    #[test]
    fn a_schedule_that_never_fires_is_refused() {
        let raw = |cron: &str| RawSchedule {
            cron: Some(cron.to_owned()),
            every: None,
            command: vec!["true".to_owned()],
            queue: None,
            cwd: None,
            catch_up: None,
        };
        for never in ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 11 *"] {
            let err = Schedule::from_raw("s", raw(never)).expect_err(never);
            assert!(err.contains("never fires"), "{never}: {err}");
        }
        // The 29th of February comes every four years; the 31st of some
        // months every year.
        for some_day in ["0 0 29 2 *", "0 0 31 * *", "0 0 30 2 1"] {
            assert!(Schedule::from_raw("s", raw(some_day)).is_ok(), "{some_day}");
        }
    }

    #[test]
    fn cron_ticks_as_posix_cron_reads_it_in_utc() {
        let quarter = schedule("cron = \"*/15 * * * *\"\ncommand = [\"x\"]").expect("valid");
        assert_eq!(
            quarter.next_after(at("2026-12-02T12:07:31Z")),
            Some(at("2026-12-02T12:15:00Z"))
        );
        assert_eq!(
            quarter.next_after(at("2026-12-02T12:15:00Z")),
            Some(at("2026-12-02T12:30:00Z"))
        );
        // Weekdays 1-5 are Monday to Friday: from a Saturday, Monday.
        let weekdays = schedule("cron = \"0 9 * * 1-5\"\ncommand = [\"x\"]").expect("valid");
        assert_eq!(
            weekdays.next_after(at("2026-12-05T10:00:00Z")),
            Some(at("2026-12-07T09:00:00Z"))
        );
        assert_eq!(
            quarter.ticks(at("2026-12-02T12:00:00Z"), at("2026-12-02T13:00:00Z"), 10),
            [
                at("2026-12-02T12:15:00Z"),
                at("2026-12-02T12:30:00Z"),
                at("2026-12-02T12:45:00Z"),
                at("2026-12-02T13:00:00Z")
            ]
        );
        // Past the limit, the newest.
        assert_eq!(
            quarter.ticks(at("2026-12-02T12:00:00Z"), at("2026-12-02T13:00:00Z"), 2),
            [at("2026-12-02T12:45:00Z"), at("2026-12-02T13:00:00Z")]
        );
    }

    #[test]
    fn every_ticks_on_multiples_of_its_period() {
        let every = schedule("every = \"10m\"\ncommand = [\"x\"]").expect("valid");
        assert_eq!(
            every.next_after(at("2026-12-02T12:07:31Z")),
            Some(at("2026-12-02T12:10:00Z"))
        );
        assert_eq!(every.describe(), "every 10m");
    }

    #[test]
    fn a_tick_is_one_task_id_and_back() {
        let every = schedule("every = \"1s\"\ncommand = [\"x\"]").expect("valid");
        let tick = at("2026-12-02T01:15:00Z");
        assert_eq!(every.task_id(tick), "digest-20261202T011500Z");
        assert_eq!(every.tick_of("digest-20261202T011500Z"), Some(tick));
        assert_eq!(every.tick_of("digestx-20261202T011500Z"), None);
        assert_eq!(every.tick_of("digest-2026"), None);
    }

    #[test]
    fn a_wrong_schedule_says_what_is_wrong() {
        for (text, says) in [
            ("cron = \"* * * *\"\ncommand = [\"x\"]", "five fields"),
            ("cron = \"0 * * * * *\"\ncommand = [\"x\"]", "five fields"),
            (
                "cron = \"61 * * * *\"\ncommand = [\"x\"]",
                "not a cron expression",
            ),
            ("every = \"500ms\"\ncommand = [\"x\"]", "at least 1s"),
            ("command = [\"x\"]", "one of them"),
            (
                "cron = \"* * * * *\"\nevery = \"1m\"\ncommand = [\"x\"]",
                "one of them",
            ),
            ("every = \"1m\"\ncommand = []", "argv"),
            (
                "every = \"1m\"\ncommand = [\"x\"]\ncatch_up = \"some\"",
                "catch_up",
            ),
        ] {
            let err = schedule(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
