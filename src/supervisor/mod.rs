//! Runs the agent and serves its requests against the journal.

mod agent_io;
mod calls;
mod child;
mod commit;
mod decide;
mod diff;
mod fencing;
mod imp;
mod inbox;
mod lines;
mod passthrough;
mod recorded;
mod requests;
mod socket;
mod spec;
mod state;
mod stopping;

pub(crate) use imp::supervise;
pub(crate) use spec::RunSpec;
