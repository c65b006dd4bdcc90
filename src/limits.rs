//! Limits that every run and worker on a journal share (SPEC 19):
//! `[limits.NAME]` in durun.toml caps the requests a minute (`rpm`), the
//! tokens a minute (`tpm`) and the requests in flight (`concurrency`) of a
//! proxy route, or of its calls to some models. The state lives in the
//! journal (one host shares a SQLite file, every host a PostgreSQL
//! server), so fifty agents under one limit take turns instead of meeting
//! 429s. A request over a limit waits inside durun: the agent sees a
//! slower answer, not an error. Requests are paced, not counted per
//! window: each goes 60/rpm seconds (and a hundredth) after the one
//! before, so no minute, however it is cut, holds more than `rpm` of them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::config::Limit;
use crate::journal::{Access, Journal, Location};
use crate::settings::Settings;

/// A slot held longer than this by a process on another host is taken
/// for one whose process died there.
const STALE_SLOT: Duration = Duration::from_secs(15 * 60);
/// How far ahead a run takes turns from the journal under a limit of many
/// requests a second (and how long it trusts that no pause began): one
/// journal write for this long of them, not one a request.
const AHEAD: Duration = Duration::from_millis(50);
/// How late a turn taken ahead may still be used.
const LATE: Duration = Duration::from_millis(2);
/// How long a request waits before it looks for a free slot again, at
/// first and at most.
const SLOT_POLL: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(200));

/// A run's hold on the limits of its durun.toml, through a journal
/// connection of its own (opened at the first request a limit holds).
pub(crate) struct Limiter {
    limits: Vec<Limit>,
    location: Location,
    settings: Settings,
    journal: Mutex<Option<Box<dyn Journal>>>,
    /// Whether a journal error was said already.
    warned: std::sync::atomic::AtomicBool,
    /// Turns taken ahead, by limit.
    ahead: Mutex<std::collections::HashMap<String, Ahead>>,
}

/// What a run holds ahead under a limit.
enum Ahead {
    /// Its next turns, in order.
    Turns(std::collections::VecDeque<Instant>),
    /// Requests go at once until then: no pace, no pause.
    Clear(Instant),
}

/// The slots a request holds while in flight; freed by [`Limiter::done`].
#[derive(Debug, Default)]
pub(crate) struct Slots(Vec<i64>);

impl Limiter {
    /// A limiter of `limits`; none when there are none.
    pub(crate) fn new(limits: &[Limit], settings: &Settings) -> Option<Arc<Self>> {
        if limits.is_empty() {
            return None;
        }
        let location = Location::of(settings).ok()?;
        Some(Arc::new(Self {
            limits: limits.to_vec(),
            location,
            settings: settings.clone(),
            journal: Mutex::new(None),
            warned: std::sync::atomic::AtomicBool::new(false),
            ahead: Mutex::new(std::collections::HashMap::new()),
        }))
    }

    /// Whether any limit holds a request of `route` to `model`.
    pub(crate) fn holds(&self, route: &str, model: Option<&str>) -> bool {
        self.limits.iter().any(|limit| limit.holds(route, model))
    }

    /// Runs `work` with the limiter's journal, blocking: a failure is said
    /// once and lets the request go (a limit is no reason to fail a run).
    fn with_journal<T>(&self, work: impl FnOnce(&mut dyn Journal) -> Result<T>) -> Option<T> {
        let mut journal = self.journal.lock().ok()?;
        let done = (|| {
            if journal.is_none() {
                *journal = Some(self.location.open(Access::Write, &self.settings)?);
            }
            work(journal.as_mut().expect("opened").as_mut())
        })();
        match done {
            Ok(value) => Some(value),
            Err(err) => {
                // A broken connection is opened again next time.
                *journal = None;
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    crate::report::say(&format!(
                        "warning: the shared limits cannot be read from the journal ({err:#}); requests go unlimited"
                    ));
                }
                None
            }
        }
    }

    /// Waits until a request of `route` to `model`, of about `tokens`
    /// tokens, may go under every limit that holds it; returns the slots
    /// it holds in flight.
    pub(crate) async fn wait_turn(
        self: &Arc<Self>,
        route: &str,
        model: Option<&str>,
        tokens: u64,
    ) -> Slots {
        let mut slots = Slots::default();
        let holding: Vec<Limit> = self
            .limits
            .iter()
            .filter(|limit| limit.holds(route, model))
            .cloned()
            .collect();
        for limit in holding {
            if let Some(max) = limit.concurrency {
                slots.0.extend(self.take_slot(&limit.name, max).await);
            }
            // Its turn: after the one before (`rpm`), after their tokens
            // (`tpm`), and never inside a pause an upstream asked for.
            // A hundredth slower than the limit: the requests of a minute
            // reach the upstream with the network's jitter, and its last
            // must not come early.
            let interval = limit
                .rpm
                .map_or(0, |rpm| 6_060_000_u64.div_ceil(rpm.max(1) * 100));
            let tokens_ms = limit
                .tpm
                .map_or(0, |tpm| (tokens * 60_000).div_ceil(tpm.max(1)));
            let at = if tokens_ms == 0 {
                self.turn_ahead(limit.name, interval).await
            } else {
                let wait = self
                    .blocking(move |limiter| {
                        limiter.with_journal(|journal| {
                            journal.limit_turn(&limit.name, interval, tokens_ms)
                        })
                    })
                    .await
                    .unwrap_or(0);
                Instant::now() + Duration::from_millis(wait)
            };
            tokio::time::sleep_until(at.into()).await;
        }
        slots
    }

    /// A turn under a limit paced only by requests (`interval` ms apart,
    /// or not at all): taken from the turns this run holds ahead, else
    /// with [`AHEAD`]'s worth more from the journal in one write.
    async fn turn_ahead(self: &Arc<Self>, name: String, interval: u64) -> Instant {
        let now = Instant::now();
        if let Ok(mut ahead) = self.ahead.lock()
            && let Some(held) = ahead.get_mut(&name)
        {
            match held {
                Ahead::Clear(until) if now < *until => return now,
                Ahead::Turns(turns) => {
                    // A turn gone by is let go, not used late: late turns
                    // bunched together could pass the limit.
                    while turns.front().is_some_and(|turn| *turn + LATE < now) {
                        turns.pop_front();
                    }
                    if let Some(turn) = turns.pop_front() {
                        return turn;
                    }
                }
                Ahead::Clear(_) => {}
            }
        }
        let span = u64::try_from(AHEAD.as_millis()).unwrap_or(u64::MAX);
        let batch = span
            .checked_div(interval)
            .map_or(1, |batch| batch.clamp(1, 64));
        let journal_name = name.clone();
        let wait = self
            .blocking(move |limiter| {
                limiter
                    .with_journal(|journal| journal.limit_turn(&journal_name, interval * batch, 0))
            })
            .await;
        let base = Instant::now() + Duration::from_millis(wait.unwrap_or(0));
        let held = if interval == 0 {
            // No pause now: none is looked for again for a while.
            (wait == Some(0)).then(|| Ahead::Clear(base + AHEAD))
        } else {
            Some(Ahead::Turns(
                (1..batch)
                    .map(|k| base + Duration::from_millis(k * interval))
                    .collect(),
            ))
        };
        if let (Some(held), Ok(mut ahead)) = (held, self.ahead.lock()) {
            ahead.insert(name, held);
        }
        base
    }

    async fn take_slot(self: &Arc<Self>, name: &str, max: u64) -> Option<i64> {
        let mut poll = SLOT_POLL.0;
        loop {
            let name = name.to_owned();
            let taken = self
                .blocking(move |limiter| {
                    // Who holds a slot, as the run's lease names it
                    // (`DURUN_HOST_ID` included).
                    let me = limiter.settings.holder().clone();
                    let stale = i64::try_from(STALE_SLOT.as_millis()).unwrap_or(i64::MAX);
                    limiter.with_journal(|journal| journal.limit_take_slot(&name, max, &me, stale))
                })
                .await;
            match taken {
                // Taken; or the journal failed and the request goes.
                Some(Some(slot)) => return Some(slot),
                None => return None,
                Some(None) => {
                    tokio::time::sleep(poll).await;
                    poll = (poll * 2).min(SLOT_POLL.1);
                }
            }
        }
    }

    /// An upstream answered 429 or 503 with `Retry-After`: every limit
    /// that holds the request pauses for `wait`, for every run.
    pub(crate) async fn pause(self: &Arc<Self>, route: &str, model: Option<&str>, wait: Duration) {
        let names: Vec<String> = self
            .limits
            .iter()
            .filter(|limit| limit.holds(route, model))
            .map(|limit| limit.name.clone())
            .collect();
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        // The turns this run took ahead fall inside the pause.
        if let Ok(mut ahead) = self.ahead.lock() {
            for name in &names {
                ahead.remove(name);
            }
        }
        self.blocking(move |limiter| {
            for name in &names {
                limiter.with_journal(|journal| journal.limit_pause(name, ms));
            }
            Some(())
        })
        .await;
    }

    /// The request ended: its slots are free.
    pub(crate) async fn done(self: &Arc<Self>, slots: Slots) {
        if slots.0.is_empty() {
            return;
        }
        self.blocking(move |limiter| {
            for slot in slots.0 {
                limiter.with_journal(|journal| journal.limit_free_slot(slot));
            }
            Some(())
        })
        .await;
    }

    /// Runs `work` on tokio's blocking threads: the journal's clients block.
    async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Self) -> Option<T> + Send + 'static,
    ) -> Option<T> {
        let limiter = Arc::clone(self);
        tokio::task::spawn_blocking(move || work(&limiter))
            .await
            .ok()
            .flatten()
    }
}

/// How long an answer asks to wait before a retry: `Retry-After` in
/// seconds (an HTTP date is read as a minute), at most ten minutes.
pub(crate) fn retry_after(value: &str) -> Duration {
    let seconds = value.trim().parse::<f64>().unwrap_or(60.0);
    Duration::from_secs_f64(seconds.clamp(0.0, 600.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_and_bounded() {
        assert_eq!(retry_after("2"), Duration::from_secs(2));
        assert_eq!(retry_after("0.5"), Duration::from_millis(500));
        assert_eq!(
            retry_after("Wed, 21 Oct 2026 07:28:00 GMT"),
            Duration::from_secs(60)
        );
        assert_eq!(retry_after("99999"), Duration::from_secs(600));
    }
}
