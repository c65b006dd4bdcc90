//! `durun worker` (SPEC 11): workers on any number of hosts that take the
//! tasks `durun submit` queued in the journal.
//!
//! A worker claims tasks in one transaction (of workers racing for one,
//! exactly one claims it) and runs each as `durun resume TASK` would, on a
//! thread of its own: the run takes the task's fenced lease like any run,
//! and the claim only keeps other workers from starting a run that would
//! lose the lease race. A claim older than the stale time is void, so the
//! tasks of a worker that died go to the others.
//!
//! # Isolation
//!
//! A task's agent is a process of its own: its death ends its run, never
//! the worker. A panic in a run (a bug) unwinds its thread alone: the
//! agent dies with that thread (its parent-death signal), the task is left
//! interrupted, and this worker does not take it again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::cli::WorkerArgs;
use crate::config::Config;
use crate::exit_code;
use crate::journal::{
    self, Access, Candidate, Heard, Journal, Location, Look, Retryable, WorkerRecord,
};
use crate::lease;
use crate::settings::Settings;
use crate::supervisor::Stops;

mod not_ready;
mod runs;

use runs::{Ended, Run, Runs};
use rustix::process::Signal;

/// How long a worker waits for news before it looks again anyway (a
/// sleeping task's time, a stale lease, a dead worker of its host): a
/// takeover within SPEC 16's two seconds, and an idle worker's one
/// transaction comes less than once a second.
const LOOK_EVERY: Duration = Duration::from_millis(1200);
/// How often a worker looks for failed tasks to retry when nothing else
/// tells it to (SPEC 16).
const RETRY_LOOK: Duration = Duration::from_secs(10);
/// The most tasks one look reads past those it cannot take now, and how
/// many a query after the first page reads.
const MOST_LOOKED_AT: usize = 4096;
const DEEP_PAGE: usize = 256;
/// How often a look reads past a first page full of tasks it cannot take
/// now, when no news (a submit, a signal, a run's end) tells it to.
const DEEP_LOOK_EVERY: Duration = Duration::from_secs(10);

pub(crate) fn worker(args: &WorkerArgs, settings: &Settings) -> Result<i32> {
    let queues = if args.queues.is_empty() {
        vec!["default".to_owned()]
    } else {
        args.queues.clone()
    };
    for queue in &queues {
        crate::task::check_queue(queue)?;
    }
    let cwd = std::env::current_dir().context("failed to read the current directory")?;
    let (config, _) = Config::discover(args.config.as_deref(), &cwd)?;
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    // The worker takes the signals and hands each to every run on its
    // threads: they stop resumably, as `durun resume` does.
    let stop = Arc::new(AtomicBool::new(false));
    let stops = Arc::new(Stops::default());
    let mut signals = signal_hook::iterator::Signals::new([
        Signal::INT.as_raw(),
        Signal::TERM.as_raw(),
        Signal::HUP.as_raw(),
    ])?;
    {
        let (stop, stops) = (Arc::clone(&stop), Arc::clone(&stops));
        std::thread::Builder::new()
            .name("signals".to_owned())
            .spawn(move || {
                for signal in signals.forever() {
                    stop.store(true, Ordering::Relaxed);
                    stops.signal(signal);
                }
            })?;
    }
    let id = format!("{}:{}", settings.holder().host, settings.holder().pid);
    let mut worker = Worker {
        record: WorkerRecord {
            id: id.clone(),
            host: settings.holder().host.clone(),
            pid: settings.holder().pid,
            queues,
            jobs: args.jobs,
            started_at: journal::now(),
            heartbeat_ms: 0,
            tasks: Vec::new(),
        },
        schedules: super::schedules::Ticking::all(&config, &cwd),
        concurrency: config.queues,
        running: HashMap::new(),
        reaped: Vec::new(),
        panicked: HashSet::new(),
        not_ready: not_ready::NotReady::default(),
        runs: Arc::new(Runs::new(location.clone(), stops, settings.quieted(), id)),
        settings,
    };
    worker.runs.warm();
    // The runs' sockets share one directory while the worker lives; where
    // it cannot be made, each run makes its own (and says why it cannot).
    let _sockets = crate::supervisor::share_home(settings.runtime_dir.as_deref()).ok();
    if !settings.quiet {
        crate::report::say(&format!(
            "worker {} takes tasks of {} from {}, {} at a time",
            worker.record.id,
            worker.record.queues.join(", "),
            location.describe(),
            args.jobs
        ));
    }
    loop {
        match worker.serve(journal.as_mut(), &stop) {
            Ok(()) => break,
            Err(err) if stop.load(Ordering::Relaxed) => {
                crate::report::say(&format!("worker {}: {err:#}", worker.record.id));
                break;
            }
            // The journal went away (a PostgreSQL restart, a network cut):
            // reconnect and go on. The runs it started hold their own
            // leases; one that lost its own is fenced and its task goes
            // to whoever takes it next, never to two runners.
            Err(err) => {
                crate::report::say(&format!(
                    "worker {}: the journal failed ({err:#}); reconnecting",
                    worker.record.id
                ));
                journal = reconnect(&location, settings, &stop)?;
            }
        }
    }
    worker.drain(journal.as_mut());
    Ok(0)
}

/// Opens the journal again, once a second, until it answers or the
/// worker is told to stop.
fn reconnect(
    location: &Location,
    settings: &Settings,
    stop: &AtomicBool,
) -> Result<Box<dyn Journal>> {
    loop {
        std::thread::sleep(Duration::from_secs(1));
        match location.open(Access::Write, settings) {
            Ok(journal) => return Ok(journal),
            Err(err) if stop.load(Ordering::Relaxed) => return Err(err),
            Err(_) => {}
        }
    }
}

struct Worker<'a> {
    record: WorkerRecord,
    /// `[queues.NAME] concurrency`, over all workers.
    concurrency: std::collections::BTreeMap<String, u32>,
    /// Each task this worker runs, on a thread of its own.
    running: HashMap<String, Run>,
    /// Runs that ended, until the journal has taken their ends.
    reaped: Vec<(String, std::thread::Result<Ended>)>,
    /// Tasks whose run panicked here: this worker leaves them to others.
    panicked: HashSet<String>,
    /// Tasks found not ready, passed by until their time.
    not_ready: not_ready::NotReady,
    /// What the runs share.
    runs: Arc<Runs>,
    /// `[schedules.NAME]`: tasks it submits on a clock.
    schedules: Vec<super::schedules::Ticking>,
    settings: &'a Settings,
}

impl Worker<'_> {
    fn serve(&mut self, journal: &mut dyn Journal, stop: &AtomicBool) -> Result<()> {
        let mut last_heartbeat: Option<Instant> = None;
        let mut last_sweep: Option<Instant> = None;
        // Failed tasks' retries are looked for when a run ended, when the
        // next one known is due, or every RETRY_LOOK.
        let mut news = Heard {
            any: true,
            run_ended: true,
        };
        let mut retry_look = Instant::now();
        let mut last_deep_look: Option<Instant> = None;
        while !stop.load(Ordering::Relaxed) {
            self.reap(journal)?;
            let now = Instant::now();
            let heard = std::mem::take(&mut news);
            if heard.any {
                self.not_ready.forget();
            }
            // Dead workers of this host, stale leases and sleeping tasks
            // are looked for every LOOK_EVERY: a takeover within SPEC 16's
            // two seconds. An idle worker makes that one look, in one
            // transaction, and nothing else.
            let sweep = last_sweep.is_none_or(|at| at.elapsed() >= LOOK_EVERY);
            let mut tasks: Vec<String> = self.running.keys().cloned().collect();
            tasks.sort();
            // The list of tasks `inspect --workers` shows goes with the
            // next look, not only with the next heartbeat.
            let beat = last_heartbeat
                .is_none_or(|at| at.elapsed() >= self.settings.lease.heartbeat)
                || (sweep && tasks != self.record.tasks);
            if beat {
                self.record.tasks = tasks;
            }
            let retries = heard.run_ended || now >= retry_look;
            let free = self.record.jobs as usize - self.running.len();
            let claim = free > 0 && (heard.any || sweep);
            // A look's first page of tasks to claim: room for tasks of a
            // queue at its concurrency, and for its own running ones.
            let page = free * 4 + self.running.len();
            if beat || sweep || retries || claim {
                let looked = journal.look(&Look {
                    heartbeat: beat.then_some(&self.record),
                    workers: sweep,
                    claimable: claim.then(|| (&self.record.queues[..], &self.record.id[..], page)),
                    retryable: retries,
                })?;
                if beat {
                    last_heartbeat = Some(now);
                }
                // Tasks freed here are claimable at once: look again.
                if sweep {
                    last_sweep = Some(now);
                    news.any |= self.free_claims_of_dead_workers(journal, looked.workers)?;
                }
                if retries {
                    let (next, started) = self.retry_due(journal, looked.retryable)?;
                    retry_look = now + next.unwrap_or(RETRY_LOOK).min(RETRY_LOOK);
                    news.any |= started;
                }
                if claim {
                    // Past the first page on news, else now and then: its
                    // cost grows with the tasks it passes over.
                    let deep = heard.any
                        || last_deep_look.is_none_or(|at| at.elapsed() >= DEEP_LOOK_EVERY);
                    if self.take(journal, free, looked.claimable, page, deep, looked.now_ms)? {
                        last_deep_look = Some(now);
                    }
                }
            }
            if !self.schedules.is_empty() {
                let submitted = super::schedules::submit_due(
                    &mut self.schedules,
                    journal,
                    std::time::SystemTime::now(),
                    self.settings,
                )?;
                if !self.settings.quiet {
                    for id in submitted {
                        crate::report::say(&format!(
                            "worker {} submitted task {id} on its schedule",
                            self.record.id
                        ));
                    }
                }
            }
            if news.any {
                continue;
            }
            // A submit, a signal or an ended run wakes it at once
            // (PostgreSQL NOTIFY; SQLite's data_version); else the next
            // sweep does.
            let next_sweep =
                last_sweep.map_or(Duration::ZERO, |at| LOOK_EVERY.saturating_sub(at.elapsed()));
            // A run whose end is committed but whose thread is not over yet
            // (its agent's last prints wait for a slow stdout) is looked at
            // again soon: no news will come of it.
            let wait = if self.running.values().any(runs::Run::finishing) {
                next_sweep.min(runs::FINISHING)
            } else {
                next_sweep
            };
            news = journal.wait_for_work(wait)?;
        }
        Ok(())
    }

    /// Frees the claims of workers on this host whose process is gone (a
    /// SIGKILL, an OOM kill), or whose pid another process took since:
    /// their tasks go to a live worker at once, not after the stale time
    /// (SPEC 16, "Takeover"). Their runs died with them, so the tasks'
    /// leases are free as well. True if it freed some.
    fn free_claims_of_dead_workers(
        &mut self,
        journal: &mut dyn Journal,
        workers: Vec<WorkerRecord>,
    ) -> Result<bool> {
        let mut freed = false;
        for other in workers {
            if other.host != self.record.host || other.id == self.record.id {
                continue;
            }
            // A process that started well after the worker recorded its
            // start is another one, with the dead worker's pid.
            let recorded = crate::clock::parse(&other.started_at);
            let alive = lease::process_started(other.pid).is_some_and(|started| {
                recorded.is_none_or(|recorded| started <= recorded + Duration::from_secs(5))
            });
            if !alive {
                journal.worker_gone(&other.id)?;
                freed = true;
                if !self.settings.quiet {
                    crate::report::say(&format!(
                        "worker {}: worker {} on this host is gone; its tasks are free",
                        self.record.id, other.id
                    ));
                }
            }
        }
        Ok(freed)
    }

    /// Leaves each failed task of its queues whose retry is due (SPEC 16)
    /// interrupted, to be claimed as any: of workers racing for it, one
    /// counts the retry.
    /// Returns how long until the next retry of its queues is due, if one
    /// is pending, and whether it started one.
    fn retry_due(
        &mut self,
        journal: &mut dyn Journal,
        retryable: Vec<Retryable>,
    ) -> Result<(Option<Duration>, bool)> {
        let now = self.settings.now();
        let mut next: Option<Duration> = None;
        let mut started = false;
        for task in retryable {
            let mine = task
                .queue
                .as_ref()
                .is_some_and(|queue| self.record.queues.contains(queue));
            // Those need a person, or are no failure.
            let settled = task
                .exit_code
                .is_some_and(|code| [0, 64, 65, 75, 76, 77, 78].contains(&code));
            let Some(failed) = crate::clock::parse(&task.failed_at) else {
                continue;
            };
            let backoff =
                Duration::from_millis(task.backoff_ms.saturating_mul(1 << task.used.min(20)));
            if !mine || settled {
                continue;
            }
            if let Ok(left) = (failed + backoff).duration_since(now)
                && !left.is_zero()
            {
                next = Some(next.map_or(left, |next| next.min(left)));
                continue;
            }
            if !journal.start_retry(&task.id, task.used)? {
                continue;
            }
            started = true;
            if !self.settings.quiet {
                crate::report::say(&format!(
                    "worker {}: task {} failed (exit {}); retry {} of {}",
                    self.record.id,
                    task.id,
                    task.exit_code
                        .map_or_else(|| "unknown".to_owned(), |code| code.to_string()),
                    task.used + 1,
                    task.retries
                ));
            }
        }
        Ok((next, started))
    }

    /// Claims up to `free` of the candidates a look found (its first page
    /// of `page` tasks) and starts them. Tasks it cannot take now (parked
    /// and not ready, an agent that keeps dying) may fill that page: then,
    /// if `deep`, it reads the next pages, so that they never hide the
    /// tasks behind them for long. Returns whether it read past the first.
    fn take(
        &mut self,
        journal: &mut dyn Journal,
        free: usize,
        mut candidates: Vec<Candidate>,
        page: usize,
        deep: bool,
        mut now_ms: i64,
    ) -> Result<bool> {
        let mut by_queue: Vec<(String, Vec<String>)> = Vec::new();
        let mut found = 0;
        let mut offset = 0;
        let mut size = page;
        loop {
            let full = candidates.len() >= size;
            for task in candidates {
                if self.running.contains_key(&task.id)
                    || self.panicked.contains(&task.id)
                    || !self
                        .not_ready
                        .may_take(journal, &task, self.settings, now_ms)?
                {
                    continue;
                }
                found += 1;
                let queue = task.queue.clone().unwrap_or_default();
                match by_queue.iter_mut().find(|(name, _)| *name == queue) {
                    Some((_, ids)) => ids.push(task.id),
                    None => by_queue.push((queue, vec![task.id])),
                }
            }
            // As many as the first page holds when none is skipped.
            offset += size;
            if found >= free * 4 || !full || !deep || offset >= MOST_LOOKED_AT {
                break;
            }
            // The next pages larger: fewer queries past many parked tasks.
            size = size.max(DEEP_PAGE);
            (candidates, now_ms) =
                journal.claimable(&self.record.queues, &self.record.id, size, offset)?;
        }
        let mut free = free;
        for (queue, ids) in by_queue {
            if free == 0 {
                break;
            }
            let ids: Vec<String> = ids.into_iter().take(free).collect();
            let limit = self.concurrency.get(&queue).copied();
            for id in journal.claim(&queue, &ids, &self.record.id, limit)? {
                free -= 1;
                self.start(journal, &id)?;
            }
        }
        Ok(offset > page)
    }

    fn start(&mut self, journal: &mut dyn Journal, id: &str) -> Result<()> {
        match self.runs.start(id) {
            Ok(thread) => {
                if !self.settings.quiet {
                    crate::report::say(&format!("worker {} runs task {id}", self.record.id));
                }
                self.running.insert(id.to_owned(), thread);
            }
            Err(err) => {
                // This host cannot start runs now (no threads left): say
                // so, leave the task to the next claim.
                crate::report::say(&format!(
                    "worker {} cannot start a run of task {id}: {err}; the task stays for the next claim",
                    self.record.id
                ));
                journal.release_claim(id, &self.record.id)?;
            }
        }
        Ok(())
    }

    /// Collects the runs that ended and gives up their claims.
    fn reap(&mut self, journal: &mut dyn Journal) -> Result<()> {
        let ended: Vec<String> = self
            .running
            .iter()
            .filter(|(_, run)| run.ended())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ended {
            if let Some(run) = self.running.remove(&id) {
                self.reaped.push((id, run.join()));
            }
        }
        // Kept until the journal has taken each end: one that fails here
        // (the journal went away) is done after the reconnect.
        while !self.reaped.is_empty() {
            let (id, outcome) = self.reaped.remove(0);
            let code = match self.ended(journal, &id, &outcome) {
                Ok(code) => code,
                Err(err) => {
                    self.reaped.insert(0, (id, outcome));
                    return Err(err);
                }
            };
            if !self.settings.quiet {
                let what = match code {
                    None => "ended in a panic of durun's (a bug); it is left interrupted and this worker leaves it to others".to_owned(),
                    Some(0) => "completed".to_owned(),
                    Some(exit_code::LOCKED) => "was taken by another runner".to_owned(),
                    Some(exit_code::PARKED) => "parked (waits for a signal or a time)".to_owned(),
                    // A journal error here costs only the line's detail.
                    Some(code) => crate::task::crashes::said(journal, &id, code)
                        .ok()
                        .flatten()
                        .unwrap_or_else(|| format!("ended with exit {code}")),
                };
                crate::report::say(&format!("worker {}: task {id} {what}", self.record.id));
            }
        }
        Ok(())
    }

    /// The exit code of a run that ended, its claim released; `None` if
    /// it panicked, when its task is left interrupted (its agent died with
    /// the thread).
    fn ended(
        &mut self,
        journal: &mut dyn Journal,
        id: &str,
        outcome: &std::thread::Result<Ended>,
    ) -> Result<Option<i32>> {
        if let Ok(ended) = outcome {
            // Only a run that failed on the journal (or on its lease,
            // which it checks there) can have left its end unwritten:
            // other ends cost no look.
            if matches!(
                ended.code,
                exit_code::JOURNAL | exit_code::INTERNAL | exit_code::LOCKED
            ) {
                runs::interrupt_if_left_running(journal, id, self.settings.holder())?;
            }
            if !ended.released {
                journal.release_claim(id, &self.record.id)?;
            }
            return Ok(Some(ended.code));
        }
        self.panicked.insert(id.to_owned());
        // The task is left interrupted before its claim goes, so that no
        // other worker looks at it while it still reads `running`.
        runs::interrupt_open_run(
            journal,
            id,
            exit_code::INTERNAL,
            "durun: the run's thread panicked (a bug in durun)",
        )?;
        journal.release_claim(id, &self.record.id)?;
        Ok(None)
    }

    /// Waits for every run, each stopped resumably by the signal that
    /// stopped the worker (the agent is told, the task is left interrupted
    /// for another worker), and leaves the list.
    fn drain(&mut self, journal: &mut dyn Journal) {
        let mut ids: Vec<String> = self.running.keys().cloned().collect();
        ids.sort_unstable();
        let what = if ids.is_empty() {
            "no task was running".to_owned()
        } else {
            format!(
                "stopping task {} resumably; another worker takes them over",
                ids.join(", ")
            )
        };
        if !self.settings.quiet {
            crate::report::say(&format!("worker {} drains: {what}", self.record.id));
        }
        for id in ids {
            if let Some(run) = self.running.remove(&id) {
                let outcome = run.join();
                let _ = self.ended(journal, &id, &outcome);
            }
        }
        for (id, outcome) in std::mem::take(&mut self.reaped) {
            let _ = self.ended(journal, &id, &outcome);
        }
        let _ = journal.worker_gone(&self.record.id);
        if !self.settings.quiet {
            crate::report::say(&format!("worker {} stopped", self.record.id));
        }
    }
}
