//! Runs the agent and serves its requests against the journal.

mod imp;
pub(crate) mod lines;
mod socket;

pub use imp::{supervise, RunSpec};
