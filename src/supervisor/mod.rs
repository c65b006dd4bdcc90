//! Runs the agent and serves its requests against the journal.

mod imp;
mod lines;

pub use imp::{supervise, RunSpec};
