//! The write-ahead journal: tasks, runs and steps (SPEC 4).
//!
//! The runner talks to storage only through [`Journal`], so a backend is
//! plain records in and out. `SQLite` ([`sqlite::SqliteJournal`]) is the
//! embedded default.
//!
//! Invariant for every backend: when a method that writes returns `Ok`, the
//! write is durable (to the sync mode in force). The runner answers the agent
//! or starts a side effect only after that.

mod explain;
pub mod postgres;
mod records;
pub mod sqlite;

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::Value;

pub use explain::explain;
pub use records::{
    NewTask, Resolution, ResolutionAction, RunEnd, RunRecord, RunStart, RunStats, StepError,
    StepKind, StepRecord, StepStatus, TaskRecord, TaskStatus,
};

use crate::config::SyncMode;
use crate::error::Failure;
use crate::lease::Holder;

/// Storage for tasks, runs and steps.
pub trait Journal {
    /// Sets how hard commits are pushed to disk from now on.
    fn set_sync(&mut self, sync: SyncMode) -> Result<()>;
    fn create_task(&mut self, task: &NewTask) -> Result<()>;
    fn task(&mut self, id: &str) -> Result<Option<TaskRecord>>;
    /// Every task, newest first.
    fn tasks(&mut self) -> Result<Vec<TaskRecord>>;
    fn runs(&mut self, task: &str) -> Result<Vec<RunRecord>>;
    /// The task's steps that take part in replay, in step order; with
    /// `discarded`, also the steps `resume --from-step` took out, each
    /// before its replacement.
    fn steps(&mut self, task: &str, discarded: bool) -> Result<Vec<StepRecord>> {
        let mut steps = Vec::new();
        self.visit_steps(task, discarded, None, &mut |step| {
            steps.push(step);
            Ok(())
        })?;
        Ok(steps)
    }
    /// Hands the task's steps to `visit` one by one as they are read, in
    /// order (only the last `last` of them if given), so a long task is
    /// never held whole.
    fn visit_steps(
        &mut self,
        task: &str,
        discarded: bool,
        last: Option<usize>,
        visit: &mut dyn FnMut(StepRecord) -> Result<()>,
    ) -> Result<()>;
    /// Every step of the task (discarded ones included), or only its last
    /// `last`.
    fn steps_tail(&mut self, task: &str, last: Option<usize>) -> Result<Vec<StepRecord>> {
        let mut steps = Vec::new();
        self.visit_steps(task, true, last, &mut |step| {
            steps.push(step);
            Ok(())
        })?;
        Ok(steps)
    }
    /// How many steps the task has, discarded ones included.
    fn count_steps(&mut self, task: &str) -> Result<u64>;
    /// Every row of step `step` (a discarded one before its replacement).
    fn step_versions(&mut self, task: &str, step: u64) -> Result<Vec<StepRecord>>;
    /// Takes the task's lease for `me` and opens a new run, unless a live
    /// runner holds it or the task was cancelled. Atomic: of two racing
    /// runners one wins.
    fn start_run(&mut self, task: &str, me: &Holder, now: &str) -> Result<RunStart>;
    /// Renews the lease of `run`, if it still holds it, and says where it
    /// stands.
    fn heartbeat(&mut self, task: &str, run: u32) -> Result<Standing>;
    /// Where `run` stands, cheaply: answers [`Standing::Held`] without a
    /// query when nothing was written to the task since the last look
    /// (another runner's takeover, a cancel).
    fn watch(&mut self, task: &str, run: u32) -> Result<Standing>;
    /// The task's live steps after step `after`, in order, at most `limit`:
    /// replay reads a long task page by page, each row once.
    fn steps_page(&mut self, task: &str, after: u64, limit: usize) -> Result<Vec<StepRecord>>;
    /// How many live steps the task has, and the highest step number.
    fn replay_bounds(&mut self, task: &str) -> Result<(u64, u64)>;
    /// Writes steps, each new (`fresh`) or updated, and the run's counters
    /// if given, in one durable transaction: steps that finish together
    /// share one commit (group commit).
    ///
    /// Fenced: the same transaction checks that `run` still holds the
    /// task's lease, and fails with [`Fenced`] without writing if it does
    /// not, or if the task was cancelled and a step would be opened.
    fn put_steps(
        &mut self,
        task: &str,
        steps: &[StepWrite<'_>],
        run: u32,
        stats: Option<&RunStats>,
    ) -> Result<()>;
    /// Stores the task's final output; fenced like [`Journal::put_steps`].
    fn set_output(&mut self, task: &str, run: u32, output: &Value) -> Result<()>;
    /// Closes the run and, if it still holds the lease, releases it and
    /// records the task's status (`cancelled` if a cancel came meanwhile).
    fn finish_run(&mut self, task: &str, run: u32, end: &RunEnd, stats: &RunStats) -> Result<()>;
    /// Takes steps `step` and later out of replay (kept as `discarded`) and
    /// returns them as they were; fenced like [`Journal::put_steps`].
    fn discard_from(&mut self, task: &str, run: u32, step: u64) -> Result<Vec<StepRecord>>;
    /// Settles a step by hand and keeps the resolution; refused while a live
    /// runner holds the task.
    fn resolve(
        &mut self,
        task: &str,
        step: u64,
        resolution: &Resolution,
        me: &Holder,
    ) -> Result<StepRecord>;
    /// Cancels the task for good: from this commit on no run may start and
    /// no running one may open a step. Returns whether a live runner holds
    /// it (it is told, and stops its agent).
    fn request_cancel(&mut self, task: &str, me: &Holder) -> Result<bool>;
    /// Deletes finished tasks (completed, failed, cancelled) last updated
    /// before `finished_before`, never one a live runner holds; returns
    /// their ids.
    fn gc(&mut self, finished_before: &str, me: &Holder) -> Result<Vec<String>>;
}

/// Where a run stands with its task's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// The run holds the lease; it may go on.
    Held,
    /// Another run took the task over, or the lease was cleared: the run
    /// must stop at once without writing.
    Lost,
    /// `durun cancel` came: the run may record steps that finished but
    /// must open none.
    Cancelled,
}

/// A fenced write refused because the run no longer may write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced(pub Standing);

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Standing::Cancelled => "the task was cancelled",
            Standing::Held | Standing::Lost => "this run no longer holds the task's lease",
        })
    }
}

impl std::error::Error for Fenced {}

/// The fence of every write a run makes: refuse when `lease_run` (the
/// task's current holder) is not `run`, or when the task was cancelled and
/// the write would open a step.
pub fn fence(lease_run: Option<u32>, cancelled: bool, run: u32, opens: bool) -> Result<Standing> {
    let standing = standing_of(lease_run, cancelled, run);
    match standing {
        Standing::Lost => Err(Fenced(Standing::Lost).into()),
        Standing::Cancelled if opens => Err(Fenced(Standing::Cancelled).into()),
        _ => Ok(standing),
    }
}

/// Where `run` stands, from the task row's lease holder and cancel mark.
pub fn standing_of(lease_run: Option<u32>, cancelled: bool, run: u32) -> Standing {
    if lease_run != Some(run) {
        Standing::Lost
    } else if cancelled {
        Standing::Cancelled
    } else {
        Standing::Held
    }
}

/// One row of a [`Journal::put_steps`] write.
#[derive(Clone, Copy)]
pub struct StepWrite<'a> {
    pub record: &'a StepRecord,
    /// The row is new (an insert), not an update of the step's row.
    pub fresh: bool,
}

/// Where the journal lives.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "Sqlite({})", path.display()),
            // A URL may carry a password: never print it.
            Self::Postgres(_) => f.write_str("Postgres(<redacted>)"),
        }
    }
}

impl Location {
    /// `--journal`/`DURUN_JOURNAL` if given, else the per-user default.
    pub fn resolve(explicit: Option<&str>) -> Result<Self> {
        if let Some(text) = explicit.filter(|text| !text.is_empty()) {
            if text.starts_with("postgres://") || text.starts_with("postgresql://") {
                return Ok(Self::Postgres(text.to_owned()));
            }
            return Ok(Self::Sqlite(PathBuf::from(text)));
        }
        let state = std::env::var_os("XDG_STATE_HOME")
            .filter(|dir| !dir.is_empty() && Path::new(dir).is_absolute())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|home| !home.is_empty())
                    .map(|home| PathBuf::from(home).join(".local/state"))
            })
            .ok_or_else(|| {
                Failure::config(
                    "cannot find a place for the journal: neither XDG_STATE_HOME nor HOME is set",
                )
                .hint("pass --journal PATH or set DURUN_JOURNAL")
            })?;
        Ok(Self::Sqlite(state.join("durun").join("journal.db")))
    }
}

impl Location {
    /// Whether a journal is there to read: false only when nothing is at
    /// the path; a path that cannot be looked at, or is not a file, is a
    /// journal error (74).
    pub fn exists(&self) -> Result<bool> {
        match self {
            Self::Sqlite(path) => sqlite::regular_file(path),
            Self::Postgres(_) => Ok(true),
        }
    }
}

/// How a command means to use the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Creates the journal if missing and may write it.
    Write,
    /// Reads an existing journal; never creates or migrates one.
    Read,
}

/// Opens the journal at `location`.
pub fn open(location: &Location, access: Access) -> Result<Box<dyn Journal>> {
    match location {
        Location::Sqlite(path) => {
            let place = format!("the journal at {}", path.display());
            let journal =
                sqlite::SqliteJournal::open(path, access).map_err(|err| explain(&place, err))?;
            Ok(Box::new(explain::Explained::new(journal, place)))
        }
        Location::Postgres(url) => {
            let place = postgres::describe(url);
            let journal = postgres::PostgresJournal::open(url, access == Access::Write)
                .map_err(|err| explain(&place, err))?;
            Ok(Box::new(explain::Explained::new(journal, place)))
        }
    }
}

/// The current time as fixed-width RFC 3339 UTC with milliseconds, so that
/// the text sorts as the time does.
pub fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// The error for a task a live runner holds (exit 75).
pub fn locked(task: &str, lease: &crate::lease::Lease) -> Failure {
    Failure::new(
        crate::exit_code::LOCKED,
        format!(
            "task {task} is being run by another durun (pid {} on {}, run {})",
            lease.pid, lease.host, lease.run
        ),
    )
    .hint("wait for that run to end; if its runner dies, the task is free again")
}

/// What a resolution does to its step, the same on every backend; returns
/// the value the resolutions table keeps (the output or the message).
pub fn apply_resolution(record: &mut StepRecord, resolution: &Resolution) -> Option<String> {
    let value = match &resolution.action {
        ResolutionAction::Retry => {
            record.status = StepStatus::Pending;
            None
        }
        ResolutionAction::Output(output) => {
            record.status = StepStatus::Committed;
            record.output = Some(crate::json_text::JsonText::from_value(output));
            record.error = None;
            record.finished_at = Some(resolution.at.clone());
            Some(serde_json::to_string(output).expect("JSON serializes"))
        }
        ResolutionAction::Fail(message) => {
            record.status = StepStatus::Failed;
            record.error = Some(StepError {
                code: "tool_failed".to_owned(),
                message: message.clone(),
            });
            record.finished_at = Some(resolution.at.clone());
            Some(message.clone())
        }
    };
    record.resolution = Some(resolution.action.name().to_owned());
    value
}
