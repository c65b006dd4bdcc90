//! An agent that keeps dying. A run whose agent a signal killed (the OOM
//! killer, a crash in native code, a `kill -9`) leaves its task
//! interrupted, and a worker resumes it: that is the crash durun is for.
//! But an agent that dies every time it starts would have a worker start
//! it again dozens of times a second, forever. So the first such end is
//! resumed at once, and each one after it in a row waits twice as long
//! as the one before, up to five minutes; a run that ends any other way
//! starts the count again. An agent ended by a signal that asks it to
//! stop (SIGTERM from a worker's drain or `docker stop`, SIGINT, SIGHUP)
//! was stopped, not crashed. A run that durun ended before its agent
//! started, because this durun cannot run the task (its preset or config
//! from another version), counts the same: a worker that would take it
//! again at once would do so dozens of times a second.

use std::time::{Duration, SystemTime};

use anyhow::Result;

use crate::journal::{Journal, RunRecord, TaskStatus};

/// The wait after the second crash in a row; it doubles with each more.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait: a task that always crashes runs twelve times an hour.
const MOST_WAIT: Duration = Duration::from_secs(300);

/// The signals that ask a process to stop: SIGHUP, SIGINT and SIGTERM.
const STOPS: [i32; 3] = [1, 2, 15];

/// Whether a run ended with its agent killed by a signal (durun recorded
/// 128 + the signal, and no error of its own), or before its agent
/// started, with why and no exit code (`session::leave`).
fn crashed(run: &RunRecord) -> bool {
    run.finished_at.is_some()
        && match (run.exit_code, &run.error) {
            (Some(code), None) => code > 128 && !STOPS.contains(&(code - 128)),
            (None, Some(_)) => true,
            _ => false,
        }
}

/// How many of the task's last runs in a row ended that way.
pub(crate) fn in_a_row(runs: &[RunRecord]) -> u32 {
    let count = runs.iter().rev().take_while(|run| crashed(run)).count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The wait before the next run after `crashes` in a row: none after the
/// first.
pub(crate) fn wait_after(crashes: u32) -> Duration {
    if crashes < 2 {
        return Duration::ZERO;
    }
    FIRST_WAIT
        .saturating_mul(1 << (crashes - 2).min(16))
        .min(MOST_WAIT)
}

/// How long the task must still wait before a worker resumes it (zero:
/// now), from its runs; the wait counts from the last run's end.
pub(crate) fn left(runs: &[RunRecord], now: SystemTime) -> Duration {
    let wait = wait_after(in_a_row(runs));
    if wait.is_zero() {
        return Duration::ZERO;
    }
    let Some(ended) = runs
        .last()
        .and_then(|run| run.finished_at.as_deref())
        .and_then(crate::clock::parse)
    else {
        return Duration::ZERO;
    };
    (ended + wait).duration_since(now).unwrap_or(Duration::ZERO)
}

/// What a worker says of a run of task `id` that ended with `code`, if
/// its agent was killed by a signal and the task waits to be resumed.
pub(crate) fn said(journal: &mut dyn Journal, id: &str, code: i32) -> Result<Option<String>> {
    if code <= 128
        || !journal
            .task(id)?
            .is_some_and(|task| task.status == TaskStatus::Interrupted)
    {
        return Ok(None);
    }
    let crashes = in_a_row(&journal.runs(id)?);
    if crashes == 0 {
        return Ok(None);
    }
    let signal = code - 128;
    let wait = wait_after(crashes);
    Ok(Some(if wait.is_zero() {
        format!(
            "ended: its agent was killed by signal {signal} (exit {code}); it is resumed at once"
        )
    } else {
        format!(
            "ended: its agent was killed by signal {signal} (exit {code}), {crashes} runs in a row; \
             it is resumed in {}",
            humantime::format_duration(wait)
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::RunStats;

    fn run(exit_code: Option<i32>, error: Option<&str>, finished_at: Option<&str>) -> RunRecord {
        RunRecord {
            run: 1,
            host: "h".into(),
            pid: 1,
            started_at: "2026-12-03T10:00:00Z".into(),
            finished_at: finished_at.map(str::to_owned),
            exit_code,
            stats: RunStats::default(),
            unreplayed: Vec::new(),
            error: error.map(str::to_owned),
        }
    }

    const ENDED: Option<&str> = Some("2026-12-03T10:00:10Z");

    #[test]
    fn only_the_last_runs_killed_by_a_signal_count() {
        let killed = run(Some(137), None, ENDED);
        let failed = run(Some(1), None, ENDED);
        let stopped_by_durun = run(Some(137), Some("durun: the journal is full"), ENDED);
        let died_with_durun = run(None, None, None);
        assert_eq!(in_a_row(&[]), 0);
        assert_eq!(in_a_row(&[killed.clone(), failed.clone()]), 0);
        assert_eq!(
            in_a_row(&[failed.clone(), killed.clone(), killed.clone()]),
            2
        );
        assert_eq!(
            in_a_row(&[killed.clone(), stopped_by_durun, killed.clone()]),
            1
        );
        assert_eq!(
            in_a_row(&[killed.clone(), died_with_durun, killed.clone()]),
            1
        );
        // SIGTERM (a worker's drain), SIGINT, SIGHUP: stopped, not crashed.
        for stop in [143, 130, 129] {
            let stopped = run(Some(stop), None, ENDED);
            assert_eq!(in_a_row(&[killed.clone(), stopped, killed.clone()]), 1);
        }
        let segfault = run(Some(139), None, ENDED);
        assert_eq!(in_a_row(&[killed.clone(), segfault]), 2);
        // Ended before its agent started: this durun cannot run the task.
        let not_started = run(None, Some("durun: a preset this durun lacks"), ENDED);
        assert_eq!(in_a_row(&[failed, not_started.clone(), not_started]), 2);
    }

    #[test]
    fn the_wait_is_none_after_one_crash_then_doubles_up_to_five_minutes() {
        let waits: Vec<u64> = (0..=12).map(|k| wait_after(k).as_secs()).collect();
        assert_eq!(waits, [0, 0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(wait_after(u32::MAX), MOST_WAIT);
    }

    #[test]
    fn the_wait_counts_from_the_last_runs_end() {
        let killed = run(Some(137), None, ENDED);
        let runs = [killed.clone(), killed.clone(), killed];
        let ended = crate::clock::parse("2026-12-03T10:00:10Z").expect("a time");
        // Three in a row: two seconds from the end.
        assert_eq!(left(&runs, ended), Duration::from_secs(2));
        assert_eq!(
            left(&runs, ended + Duration::from_millis(1500)),
            Duration::from_millis(500)
        );
        assert_eq!(left(&runs, ended + Duration::from_secs(3)), Duration::ZERO);
        assert_eq!(left(&runs[..1], ended), Duration::ZERO);
    }
}
