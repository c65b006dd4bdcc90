//! The committer thread: the journal lent to it with a batch of steps to
//! write in one durable commit, sent back with the outcome, so that a
//! pipelining agent's commits are written while the loop goes on.

use std::sync::mpsc;

use super::inbox::{Event, Events};
use super::outbox::Deferred;
use crate::journal::{Journal, RunStats, Standing, StepWrite};

/// The committer thread: writes each batch it is lent, looks once more for
/// a cancel or a takeover (a pipelining agent may keep the journal away
/// from the loop's own look), and sends the batch and the journal back.
pub(super) fn committer<'a>(
    jobs: &mpsc::Receiver<Job<'a>>,
    landed: &mpsc::Sender<Landed<'a>>,
    events: &Events,
    task: &str,
    run: u32,
) {
    while let Ok(job) = jobs.recv() {
        let mut back = write(job, task, run);
        if back.written.is_ok() {
            back.standing = back.journal.watch(task, run).ok();
        }
        if landed.send(back).is_err() || events.send(Event::Landed).is_err() {
            return;
        }
    }
}

/// The committer thread's two channels.
pub(super) struct Committer<'a> {
    jobs: mpsc::Sender<Job<'a>>,
    landed: mpsc::Receiver<Landed<'a>>,
    /// Starts the thread, at the first batch it is lent; if it cannot
    /// start, its channel is closed and the loop writes the batch itself.
    start: Option<Box<dyn FnOnce() -> std::io::Result<()> + 'a>>,
    task: &'a str,
    run: u32,
}

impl<'a> Committer<'a> {
    /// The loop's ends of the committer's channels, and what starts it.
    pub(super) fn new(
        (jobs, landed): (mpsc::Sender<Job<'a>>, mpsc::Receiver<Landed<'a>>),
        start: Box<dyn FnOnce() -> std::io::Result<()> + 'a>,
        task: &'a str,
        run: u32,
    ) -> Self {
        Self {
            jobs,
            landed,
            start: Some(start),
            task,
            run,
        }
    }

    /// Writes `job` on the loop's own thread.
    pub(super) fn write(&self, job: Job<'a>) -> Landed<'a> {
        write(job, self.task, self.run)
    }

    /// Lends `job` to the committer thread (started at the first); back
    /// at once, written here, if the thread is gone.
    pub(super) fn lend(&mut self, job: Job<'a>) -> Option<Landed<'a>> {
        if let Some(start) = self.start.take() {
            // A thread that cannot start drops its end of the channel: the
            // send below fails and the batch is written here.
            let _ = start();
        }
        match self.jobs.send(job) {
            Ok(()) => None,
            // The committer is gone (it never ends before the loop does,
            // unless it could not start): write here rather than lose the
            // batch.
            Err(mpsc::SendError(job)) => Some(self.write(job)),
        }
    }

    /// The batch lent, once it is back; with `wait`, waits for it.
    pub(super) fn landed(&self, wait: bool) -> Option<Landed<'a>> {
        if wait {
            self.landed.recv().ok()
        } else {
            self.landed.try_recv().ok()
        }
    }
}

/// A batch to commit, with the journal lent to write it.
pub(super) struct Job<'a> {
    pub(super) journal: &'a mut dyn Journal,
    pub(super) batch: Vec<Deferred>,
    /// The run's counters once the batch is written.
    pub(super) stats: RunStats,
    /// Whether the counters change (an intent alone changes none).
    pub(super) finished: bool,
}

/// A batch back from the committer, and the journal with it.
pub(super) struct Landed<'a> {
    pub(super) journal: &'a mut dyn Journal,
    pub(super) batch: Vec<Deferred>,
    pub(super) stats: RunStats,
    pub(super) written: anyhow::Result<()>,
    /// Where the run stood right after the commit (a cancel, a takeover).
    pub(super) standing: Option<Standing>,
}

/// Writes a job's batch in one durable commit.
fn write<'a>(job: Job<'a>, task: &str, run: u32) -> Landed<'a> {
    let Job {
        journal,
        batch,
        stats,
        finished,
    } = job;
    let writes: Vec<StepWrite<'_>> = batch
        .iter()
        .map(|deferred| StepWrite {
            record: &deferred.record,
            fresh: deferred.fresh,
        })
        .collect();
    // An intent changes no counter: one row less to write.
    let written = journal.put_steps(task, &writes, run, finished.then_some(&stats));
    drop(writes);
    Landed {
        journal,
        batch,
        stats,
        written,
        standing: None,
    }
}
