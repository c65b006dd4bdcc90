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
pub mod postgres;
mod records;
mod rows;
pub mod sqlite;
mod store;
#[cfg(test)]
mod story;

pub use clock::{now, now_ms};
pub use explain::explain;
pub use fence::{Fenced, Standing, fence, locked, standing_of};
pub use location::{Access, Location};
pub use records::{
    NewTask, Resolution, ResolutionAction, ResolutionKind, RunEnd, RunRecord, RunStart, RunStats,
    StepError, StepKind, StepRecord, StepStatus, TaskRecord, TaskStatus, apply_resolution,
};
pub use store::{Journal, StepWrite};
