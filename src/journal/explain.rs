//! Turns storage errors into what a person can act on.
//!
//! [`Explained`] wraps any backend and puts a `durun: …` line with a hint
//! in front of each storage error (the journal is locked, read-only,
//! corrupt, on a full disk), keeping SQLite's own words as the cause. Every
//! such error exits 74.

use anyhow::{Error, Result};
use rusqlite::ErrorCode;
use serde_json::Value;

use super::{
    Journal, NewTask, Resolution, RunEnd, RunRecord, RunStart, RunStats, Standing, StepRecord,
    StepWrite, TaskRecord,
};
use crate::config::SyncMode;
use crate::error::Failure;
use crate::lease::Holder;

pub struct Explained<J> {
    inner: J,
    /// "the journal at /path", for messages.
    place: String,
}

impl<J> Explained<J> {
    pub fn new(inner: J, place: String) -> Self {
        Self { inner, place }
    }
}

/// Adds a `Failure` that says what the storage error means for the user.
pub fn explain(place: &str, err: Error) -> Error {
    if crate::error::failure_of(&err).is_some() {
        return err;
    }
    let code = err
        .chain()
        .find_map(|cause| match cause.downcast_ref::<rusqlite::Error>() {
            Some(rusqlite::Error::SqliteFailure(failure, _)) => Some(failure.code),
            _ => None,
        });
    let (message, hint) = match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => (
            format!("{place} is locked by another process"),
            "another program has held a write lock on it for seconds; find it with `fuser` and let it finish",
        ),
        Some(ErrorCode::ReadOnly) => (
            format!("{place} is read-only"),
            "make the file and its directory writable, or choose another journal with --journal",
        ),
        Some(ErrorCode::NotADatabase) => (
            format!("{place} is not a durun journal (not an SQLite database)"),
            "move the file away (durun creates a new journal) or pass the right path with --journal",
        ),
        Some(ErrorCode::DatabaseCorrupt) => (
            format!("{place} is corrupt"),
            "restore it from a backup; `sqlite3 FILE .recover` may save the steps it holds",
        ),
        Some(ErrorCode::DiskFull) => (
            format!("the disk holding {place} is full"),
            "free some space, then resume the task: no step was recorded as done that was not",
        ),
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => (
            format!("cannot open {place}"),
            "check that its directory exists and is writable, or choose another journal with --journal",
        ),
        Some(ErrorCode::SystemIoFailure) => (
            format!("an I/O error hit {place}"),
            "check the disk; the task can be resumed once it works",
        ),
        _ => return err,
    };
    err.context(Failure::journal(message).hint(hint))
}

impl<J: Journal> Explained<J> {
    fn map<T>(&self, result: Result<T>) -> Result<T> {
        result.map_err(|err| explain(&self.place, err))
    }
}

impl<J: Journal> Journal for Explained<J> {
    fn set_sync(&mut self, sync: SyncMode) -> Result<()> {
        let result = self.inner.set_sync(sync);
        self.map(result)
    }
    fn create_task(&mut self, task: &NewTask) -> Result<()> {
        let result = self.inner.create_task(task);
        self.map(result)
    }
    fn task(&mut self, id: &str) -> Result<Option<TaskRecord>> {
        let result = self.inner.task(id);
        self.map(result)
    }
    fn tasks(&mut self) -> Result<Vec<TaskRecord>> {
        let result = self.inner.tasks();
        self.map(result)
    }
    fn runs(&mut self, task: &str) -> Result<Vec<RunRecord>> {
        let result = self.inner.runs(task);
        self.map(result)
    }
    fn visit_steps(
        &mut self,
        task: &str,
        discarded: bool,
        last: Option<usize>,
        visit: &mut dyn FnMut(StepRecord) -> Result<()>,
    ) -> Result<()> {
        let result = self.inner.visit_steps(task, discarded, last, visit);
        self.map(result)
    }
    fn count_steps(&mut self, task: &str) -> Result<u64> {
        let result = self.inner.count_steps(task);
        self.map(result)
    }
    fn step_versions(&mut self, task: &str, step: u64) -> Result<Vec<StepRecord>> {
        let result = self.inner.step_versions(task, step);
        self.map(result)
    }
    fn start_run(&mut self, task: &str, me: &Holder, now: &str) -> Result<RunStart> {
        let result = self.inner.start_run(task, me, now);
        self.map(result)
    }
    fn heartbeat(&mut self, task: &str, run: u32) -> Result<Standing> {
        let result = self.inner.heartbeat(task, run);
        self.map(result)
    }
    fn watch(&mut self, task: &str, run: u32) -> Result<Standing> {
        let result = self.inner.watch(task, run);
        self.map(result)
    }
    fn steps_page(&mut self, task: &str, after: u64, limit: usize) -> Result<Vec<StepRecord>> {
        let result = self.inner.steps_page(task, after, limit);
        self.map(result)
    }
    fn replay_bounds(&mut self, task: &str) -> Result<(u64, u64)> {
        let result = self.inner.replay_bounds(task);
        self.map(result)
    }
    fn put_steps(
        &mut self,
        task: &str,
        steps: &[StepWrite<'_>],
        run: u32,
        stats: Option<&RunStats>,
    ) -> Result<()> {
        let result = self.inner.put_steps(task, steps, run, stats);
        self.map(result)
    }
    fn set_output(&mut self, task: &str, run: u32, output: &Value) -> Result<()> {
        let result = self.inner.set_output(task, run, output);
        self.map(result)
    }
    fn finish_run(&mut self, task: &str, run: u32, end: &RunEnd, stats: &RunStats) -> Result<()> {
        let result = self.inner.finish_run(task, run, end, stats);
        self.map(result)
    }
    fn discard_from(&mut self, task: &str, run: u32, step: u64) -> Result<Vec<StepRecord>> {
        let result = self.inner.discard_from(task, run, step);
        self.map(result)
    }
    fn resolve(
        &mut self,
        task: &str,
        step: u64,
        resolution: &Resolution,
        me: &Holder,
    ) -> Result<StepRecord> {
        let result = self.inner.resolve(task, step, resolution, me);
        self.map(result)
    }
    fn request_cancel(&mut self, task: &str, me: &Holder) -> Result<bool> {
        let result = self.inner.request_cancel(task, me);
        self.map(result)
    }
    fn gc(&mut self, finished_before: &str, me: &Holder) -> Result<Vec<String>> {
        let result = self.inner.gc(finished_before, me);
        self.map(result)
    }
}
