//! A worker's runs: each claimed task runs as `durun resume` would, on a
//! thread of the worker (SPEC 16); a run that could not record its end
//! (its journal went away) is ended here once the journal is back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::exit_code;
use crate::journal::{self, Access, Journal, Location, RunEnd, RunStats, TaskStatus};
use crate::settings::Settings;
use crate::supervisor::Stops;

/// What a worker's runs share: where the journal is, its idle
/// connections, the worker's signals.
pub(super) struct Runs {
    location: Location,
    /// Connections of runs that ended, for the next, with when each
    /// came back: a run does not pay for a connection of its own (a
    /// PostgreSQL backend's start).
    idle: Mutex<Vec<(Box<dyn Journal>, Instant)>>,
    stops: Arc<Stops>,
    /// The worker's, quiet: a run says only warnings and errors.
    settings: Settings,
    /// The worker's id, whose claims the runs release.
    worker: String,
}

/// A run on its thread.
pub(super) struct Run {
    thread: JoinHandle<Ended>,
    /// Set when the run has ended, before its claim is released (in the
    /// transaction of the run's end, before its commit): the release wakes
    /// the worker, which then finds the run ended.
    done: Arc<AtomicBool>,
    /// Disconnected when the thread's work is over (its sender dropped).
    over: mpsc::Receiver<()>,
}

/// How long the worker waits for a run that said it ended to be over: its
/// end is committed, and what is left (its report, its agent's last
/// prints, which a slow stdout can hold up) must not hold the worker up.
pub(super) const FINISHING: Duration = Duration::from_millis(50);

/// How long a connection a run left is handed to the next without asking
/// the server first whether it still answers.
const FRESH: Duration = Duration::from_secs(1);

/// How a run ended.
pub(super) struct Ended {
    pub(super) code: i32,
    /// The run released its task's claim itself.
    pub(super) released: bool,
}

impl Run {
    /// Whether the run is over, waiting up to [`FINISHING`] for one that
    /// said it ended.
    pub(super) fn ended(&self) -> bool {
        if !self.done.load(Ordering::Acquire) && !self.thread.is_finished() {
            return false;
        }
        !matches!(
            self.over.recv_timeout(FINISHING),
            Err(mpsc::RecvTimeoutError::Timeout)
        )
    }

    /// Said it ended, and is not over yet: the worker looks again soon.
    pub(super) fn finishing(&self) -> bool {
        self.done.load(Ordering::Acquire) && !self.thread.is_finished()
    }

    /// Waits for the thread (a moment, once [`Run::ended`]); an error if
    /// the run panicked.
    pub(super) fn join(self) -> std::thread::Result<Ended> {
        self.thread.join()
    }
}

impl Runs {
    pub(super) fn new(
        location: Location,
        stops: Arc<Stops>,
        settings: Settings,
        worker: String,
    ) -> Self {
        Self {
            location,
            idle: Mutex::new(Vec::new()),
            stops,
            settings,
            worker,
        }
    }

    /// Opens a connection for the first run: the first task after a
    /// worker starts does not wait for one. A journal that cannot be
    /// opened now is the first run's to report.
    pub(super) fn warm(&self) {
        if let Ok(journal) = self.location.open(Access::Write, &self.settings) {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((journal, Instant::now()));
        }
    }

    /// Starts a run of task `id` on a thread of its own.
    pub(super) fn start(self: &Arc<Self>, id: &str) -> std::io::Result<Run> {
        let runs = Arc::clone(self);
        let task = id.to_owned();
        let done = Arc::new(AtomicBool::new(false));
        let (over_tx, over) = mpsc::channel();
        let thread = {
            let done = Arc::clone(&done);
            std::thread::Builder::new()
                .name(format!("task {id}"))
                .spawn(move || {
                    // Dropped when the run is over, also in a panic.
                    let _over = over_tx;
                    runs.run(&task, &done)
                })?
        };
        Ok(Run { thread, done, over })
    }

    /// Runs task `id` as `durun resume` would, on this thread.
    fn run(&self, id: &str, done: &Arc<AtomicBool>) -> Ended {
        crate::report::tag_thread(id);
        crate::error::contain_panics();
        // A connection that idled through a server restart is dropped
        // here, not handed to a run that would fail on its first
        // statement. One that served a run moments ago is not asked (a
        // round trip a task, when tasks come one after another): if the
        // server went away since, the run's first read connects again.
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .and_then(|(mut journal, since)| {
                (since.elapsed() < FRESH || journal.answers()).then_some(journal)
            });
        let mut journal =
            match idle.map_or_else(|| self.location.open(Access::Write, &self.settings), Ok) {
                Ok(journal) => journal,
                Err(err) => {
                    return Ended {
                        code: failed(err),
                        released: false,
                    };
                }
            };
        let args = crate::cli::ResumeArgs {
            task: Some(id.to_owned()),
            from_step: None,
            all: false,
            jobs: None,
            json: false,
            limits: crate::cli::Limits::default(),
        };
        let claim = journal::Claim::new(self.worker.clone(), Arc::clone(done));
        let result = super::super::resume::resume_task(
            journal.as_mut(),
            id,
            &args,
            &self.settings,
            Some(&super::super::session::ForWorker {
                stops: Arc::clone(&self.stops),
                claim: &claim,
            }),
        );
        claim.ending();
        // A run that ended before its end was recorded (a task completed
        // already, a journal error) leaves the claim to release here.
        let released = claim.released() || journal.release_claim(id, &self.worker).is_ok();
        // A connection that served a run to its end serves the next.
        if released && result.is_ok() {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((journal, Instant::now()));
        }
        Ended {
            code: result.unwrap_or_else(failed),
            released,
        }
    }
}

/// Says why a run failed, as `durun resume` would; its exit code.
fn failed(err: anyhow::Error) -> i32 {
    let err = journal::explain(err);
    crate::report::error(&err);
    crate::error::exit_code_of(&err)
}

/// A run whose journal went away (a PostgreSQL restart) could not
/// record its end: its task reads `running` under this worker's live
/// process, which no other runner on this host would ever take over
/// (SPEC 17). Now that the journal answers, the run is ended as
/// interrupted, which lets its lease go.
pub(super) fn interrupt_if_left_running(
    journal: &mut dyn Journal,
    id: &str,
    me: &crate::lease::Holder,
) -> anyhow::Result<()> {
    let Some(task) = journal.task(id)? else {
        return Ok(());
    };
    let ours = task.lease.as_ref().is_some_and(|lease| {
        lease.host == me.host && lease.pid == me.pid && lease.pid_start == me.pid_start
    });
    if task.status != TaskStatus::Running || !ours {
        return Ok(());
    }
    interrupt_open_run(
        journal,
        id,
        exit_code::JOURNAL,
        "durun: the journal went away during the run; the worker left the task interrupted once it was back",
    )
}

/// Ends the task's last run, if it has not ended, as interrupted with
/// `code` and `why`: its task can then be taken again.
pub(super) fn interrupt_open_run(
    journal: &mut dyn Journal,
    id: &str,
    code: i32,
    why: &str,
) -> anyhow::Result<()> {
    if let Some(run) = journal
        .runs(id)?
        .last()
        .filter(|run| run.finished_at.is_none())
    {
        let end = RunEnd {
            status: TaskStatus::Interrupted,
            exit_code: Some(code),
            finished_at: journal::now(),
            error: Some(why.to_owned()),
            release: None,
        };
        journal.finish_run(id, run.run, &end, &RunStats::default())?;
    }
    Ok(())
}
