//! Runs the agent and serves its requests against the journal.
//!
//! # Invariant
//!
//! What the agent is told follows what the journal holds: a result is
//! durable before its answer, a `mutate` intent before its effect, and a
//! run that lost its lease says nothing more. [`dispatcher`] owns the
//! run's state; its loop (`dispatcher::imp`) names the room each part of
//! this lives in.

mod agent_io;
mod book;
mod budget;
mod child;
mod committer;
mod contents;
mod crash;
mod decide;
mod dispatcher;
mod ending;
mod holding;
mod inbox;
mod lines;
mod outbox;
mod passthrough;
mod recorded;
mod runners;
mod socket;
mod spec;
mod steps;
mod stops;
mod transitions;

pub(crate) use crash::{CrashAt, FAULTS, Faults, Point, SEEDS, Seeds, load_seeds, parse_faults};
pub(crate) use dispatcher::PANIC_TASK;
pub(crate) use dispatcher::supervise;
pub(crate) use socket::share_home;
pub(crate) use spec::{Outcome, RunSpec};
pub(crate) use stops::Stops;
