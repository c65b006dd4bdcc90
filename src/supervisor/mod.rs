//! Runs the agent and serves its requests against the journal.
//!
//! # Invariant
//!
//! What the agent is told follows what the journal holds: a result is
//! durable before its answer, a `mutate` intent before its effect, and a
//! run that lost its lease says nothing more. [`imp`] is the loop and
//! names the room each part of this lives in.

mod agent_io;
mod ahead;
mod calls;
mod child;
mod children;
mod commit;
mod committer;
mod contents;
mod crash;
mod decide;
mod ending;
mod fencing;
mod holding;
mod imp;
mod inbox;
mod lines;
mod outbox;
mod passthrough;
mod patches;
mod proxied;
mod recorded;
mod requests;
mod retries;
mod runners;
mod seeded;
mod socket;
mod spec;
mod state;
mod steps;
mod stopping;
mod stops;
mod transitions;
mod waiting;

pub(crate) use crash::{CrashAt, FAULTS, Faults, Point, SEEDS, Seeds, load_seeds, parse_faults};
pub(crate) use imp::supervise;
pub(crate) use requests::PANIC_TASK;
pub(crate) use spec::{Outcome, RunSpec};
pub(crate) use stops::Stops;
