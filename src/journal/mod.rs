//! The write-ahead journal: tasks, runs and steps (SPEC 4).
//!
//! The runner talks to storage only through [`Journal`], so a backend is
//! plain records in and out: `SQLite` ([`sqlite::SqliteJournal`]), the
//! embedded default, and PostgreSQL ([`postgres::PostgresJournal`]), the
//! shared one. Rows become records in [`rows`], the same for both.

mod clock;
mod explain;
mod fence;
mod location;
pub(crate) mod postgres;
mod records;
mod rows;
pub(crate) mod sqlite;
mod store;
#[cfg(test)]
mod story;

pub(crate) use clock::{now, now_ms};
pub(crate) use explain::explain;
pub(crate) use fence::{Fenced, Standing, fence, locked, standing_of};
pub(crate) use location::Location;
pub(crate) use records::{
    NewTask, Resolution, ResolutionAction, ResolutionKind, RunEnd, RunRecord, RunStart, RunStats,
    StepError, StepKind, StepRecord, StepStatus, TaskRecord, TaskStatus, apply_resolution,
};
pub(crate) use store::{Access, Journal, StepWrite};
