//! What a run is given and what it gives back: the task's command, tools
//! and lease timing in; its end, and the rest of the agent's prints, out.
//!
//! # Invariant
//!
//! The run is recorded before the agent's last prints are written out
//! ([`Output::finish`] comes after): a reader that takes nothing from
//! durun's stdout delays the exit, never the journal.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime};

use super::passthrough::Passthrough;
use crate::config::Tool;
use crate::journal::{RunStats, TaskStatus};
use crate::settings::LeaseTimes;

/// How long to wait for the agent's stdout to close once it has exited (a
/// grandchild may hold it open).
pub(super) const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long a run stopped by a signal waits for a stdout that takes
/// nothing before it exits anyway.
const OUTPUT_STALL: Duration = Duration::from_secs(5);

/// What the supervisor needs to know about the run.
pub(crate) struct RunSpec<'a> {
    pub(crate) task_id: &'a str,
    pub(crate) run: u32,
    pub(crate) argv: &'a [String],
    pub(crate) cwd: &'a Path,
    /// What the agent's stdin is (SPEC 17).
    pub(crate) stdin: crate::config::StdinMode,
    /// The coding-agent CLI the agent is, and where its program is in
    /// `argv` when it can be told (SPEC 18).
    pub(crate) preset: Option<(&'static crate::presets::Preset, Option<usize>)>,
    /// The model upstreams the task's first run found in its environment
    /// (SPEC 18): the proxy's when durun's own environment names none.
    pub(crate) upstreams: BTreeMap<String, String>,
    pub(crate) tools: &'a BTreeMap<String, Arc<Tool>>,
    /// [`crate::os::boot_clock`] just before the lease was taken: the run's
    /// first heartbeat.
    pub(crate) leased_at: Duration,
    /// How many live steps the task had when the run started, and its
    /// highest step number.
    pub(crate) recorded: (u64, u64),
    pub(crate) lease: LeaseTimes,
    /// `XDG_RUNTIME_DIR`, where the socket goes if it is usable.
    pub(crate) runtime_dir: Option<std::path::PathBuf>,
    /// How long a `wait` or `sleep` is waited on live before the run
    /// parks (SPEC 8).
    pub(crate) park_after: Duration,
    /// The task's token budget (SPEC 9).
    pub(crate) max_tokens: Option<u64>,
    /// The task's budget in nano-dollars (SPEC 19).
    pub(crate) max_cost_nanos: Option<u64>,
    /// `--on-budget wait`: a model call that does not fit waits for
    /// `durun approve` to raise the budget instead of ending the run.
    pub(crate) budget_wait: bool,
    /// The tasks whose budgets cover this task along with other tasks:
    /// its budgeted ancestors, and itself when it has a budget and
    /// children (SPEC 16, 19). Its model calls reserve against them in the
    /// journal.
    pub(crate) budget_tree: Vec<String>,
    /// Tokens the task's earlier runs spent.
    pub(crate) tokens_before: u64,
    /// What the task and its children spent before this run, in
    /// nano-dollars.
    pub(crate) cost_before: u64,
    /// The time waits and sleeps take as now (`DURUN_TEST_NOW`, for
    /// tests); the system clock when `None`.
    pub(crate) fixed_now: Option<SystemTime>,
    /// What models cost (SPEC 19): the task's `[prices]` over the table.
    pub(crate) prices: &'a crate::prices::Prices,
    /// The model/API proxy's routes (SPEC 12); `None` when it is off.
    pub(crate) proxy: Option<&'a crate::config::ProxyConfig>,
    /// The run's span as the agent's `TRACEPARENT`, when traces are on
    /// (SPEC 15).
    pub(crate) traceparent: Option<String>,
    /// Where `durun test` has durun killed (SPEC 14).
    pub(crate) crash_at: Option<super::CrashAt>,
    /// `durun test`'s answers to model steps (SPEC 14).
    pub(crate) seeds: Option<super::Seeds>,
    /// `durun test`'s tool faults (SPEC 14).
    pub(crate) faults: super::Faults,
    /// Where the streams the proxy forwards are copied while someone
    /// watches the task's events (SPEC 20).
    pub(crate) live: Option<crate::task::live::Live>,
    /// The limits of the task's durun.toml, shared through the journal
    /// (SPEC 19).
    pub(crate) limiter: Option<std::sync::Arc<crate::limits::Limiter>>,
    /// `--journal` or `DURUN_JOURNAL`, for the runners of child tasks
    /// (SPEC 16).
    pub(crate) journal_arg: Option<&'a str>,
    /// How many children without a queue run at once beside the agent
    /// (`--jobs`); by default the cores, counted when a child first needs
    /// them (reading the cgroup's limits costs every start otherwise).
    pub(crate) child_jobs: Option<usize>,
    /// For a child task: its parent's id and the args it was spawned
    /// with, the agent's DURUN_PARENT_TASK and DURUN_ARGS.
    pub(crate) parent: Option<(String, String)>,
    /// For a run on a worker's thread: the worker's signals, which the run
    /// takes instead of catching its own.
    pub(crate) stops: Option<Arc<super::Stops>>,
    /// The run panics at the agent's first request (`DURUN_TEST_PANIC_TASK`).
    pub(crate) panic_on_request: bool,
}

impl RunSpec<'_> {
    /// Now, as waits and sleeps see it.
    pub(crate) fn now(&self) -> SystemTime {
        self.fixed_now.unwrap_or_else(SystemTime::now)
    }
}

/// How the run ended.
pub(crate) struct Outcome {
    pub(crate) status: TaskStatus,
    pub(crate) exit_code: i32,
    pub(crate) stats: RunStats,
    /// Why durun ended the run itself (divergence, a journal failure, an
    /// agent that could not start): printed after the run is recorded.
    pub(crate) failure: Option<anyhow::Error>,
    /// The agent's prints still on their way to durun's stdout: finished
    /// after the run is recorded, so a slow reader never holds up the
    /// journal.
    pub(crate) output: Option<Output>,
}

/// The rest of the agent's prints.
pub(crate) struct Output {
    pub(super) passthrough: Passthrough,
    /// The run was stopped by a signal: a stdout that takes nothing for
    /// [`OUTPUT_STALL`] is given up on, not waited for to the last byte.
    pub(super) signalled: bool,
    /// Hears when the agent's stderr, copied through the progress line,
    /// has closed and gone out.
    pub(super) stderr_done: Option<mpsc::Receiver<()>>,
    /// A worker's stop signals: one that comes while the prints wait
    /// counts as the run's own.
    pub(super) stops: Option<Arc<super::Stops>>,
}

impl Output {
    /// Waits until the agent's stderr went out, so that durun's closing
    /// lines come after it.
    pub(crate) fn finish_stderr(&mut self) {
        if let Some(done) = self.stderr_done.take() {
            // A process the agent left running may hold its stderr open.
            let _ = done.recv_timeout(DRAIN_GRACE);
        }
    }

    /// Writes what is left of the agent's prints to durun's stdout.
    pub(crate) fn finish(mut self) {
        self.finish_stderr();
        let (signalled, stops) = (self.signalled, self.stops.take());
        self.passthrough.finish(OUTPUT_STALL, &|| {
            signalled || stops.as_ref().is_some_and(|stops| stops.came())
        });
    }
}
