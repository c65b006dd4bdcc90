//! Runs the agent and serves its requests against the journal.

mod imp;
pub(crate) mod lines;
mod passthrough;
mod recorded;
mod socket;

pub use imp::{RunSpec, supervise};
