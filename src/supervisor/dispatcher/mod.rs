//! The dispatcher: the run's one owner of state. [`Supervisor`] is made of
//! owned parts (the step book `Steps`, `Outbox`, `Ending`, `Holding`, each
//! in a module of `supervisor` that says what it owns), and its fields are
//! private to this module: only the rooms below, which handle the loop's
//! events (`imp` is the loop; `requests`, `calls`, `commit`, `fencing`,
//! `stopping`, `waiting`, `proxied`, ...), read or change them. The parts
//! around the dispatcher (the agent's pipes, the inbox, the committer
//! thread, the socket, the replay decision) cannot: the compiler holds the
//! boundary.

mod ahead;
mod calls;
mod children;
mod closing;
mod commit;
mod fencing;
mod imp;
mod mcp_tasks;
mod patches;
mod proxied;
mod requests;
mod reserving;
mod retries;
mod seeded;
mod stopping;
mod waiting;
#[cfg(test)]
mod walk;

pub(crate) use imp::supervise;
pub(crate) use requests::PANIC_TASK;

use serde_json::Value;

use crate::journal::{Journal, RunStats, StepKind};
use crate::protocol::Effect;
use crate::report::Reporter;
use crate::supervisor::agent_io::AgentIo;
use crate::supervisor::ending::Ending;
use crate::supervisor::holding::Holding;
use crate::supervisor::inbox::Events;
use crate::supervisor::outbox::Outbox;
use crate::supervisor::spec::RunSpec;
use crate::supervisor::steps::Steps;
use crate::supervisor::transitions::Transition;
use crate::supervisor::{child, committer, crash, runners, socket};

struct Supervisor<'a> {
    spec: &'a RunSpec<'a>,
    /// The journal when it is home; `None` while it is lent to the
    /// committer thread with a batch (the `commit` room).
    journal: Option<&'a mut dyn Journal>,
    /// The way to the committer thread and back.
    committer: committer::Committer<'a>,
    reporter: &'a mut dyn Reporter,
    /// Every step of this run, by where it stands.
    steps: Steps,
    stats: RunStats,
    /// The agent's pipes; its answers are written after each batch.
    io: AgentIo,
    /// The next commit and where answers go.
    outbox: Outbox,
    /// The task's budgets, what it spent, and what the model calls in
    /// flight may spend at worst.
    budget: crate::supervisor::budget::Budget,
    /// Model calls waiting for room in the budget.
    held: reserving::Held,
    events_tx: Events,
    child_pid: u32,
    /// Whether a Ctrl-C from the terminal reaches the agent by itself.
    interactive: bool,
    /// How the run ends.
    ending: Ending,
    /// The run's hold on its task's lease.
    holding: Holding,
    /// What `durun test` asks of this run (kill point, seeds, faults).
    trial: crash::Trial,
    /// The runners of child tasks without a queue (SPEC 16): how many run,
    /// and the children waiting for one of them to end.
    children: runners::Runners,
    /// durun's stop signals, when this run takes its own (not a worker's).
    caught: Option<&'a child::Caught>,
    /// The model/API proxy, which starts serving at its first client.
    proxy: Option<&'a mut crate::proxy::Proxy>,
    /// The socket of `durun step`, which starts accepting at its first
    /// client.
    socket: &'a mut socket::SocketDir,
    /// The run said which `[proxy] ignore` would have replayed a request
    /// (once a run).
    ignore_hinted: bool,
}

/// A step as the agent asks for it.
#[derive(Clone, Copy)]
struct Wanted<'a> {
    name: &'a str,
    kind: StepKind,
    effect: Effect,
    args: &'a Value,
    canonical: &'a str,
    /// The tool wants an operator to decide before a step in doubt runs again.
    ask_first: bool,
    /// A proxied request's `proxy::request::request_hash`, kept with its step.
    request_hash: Option<&'a str>,
}

/// What a run's dispatcher is made of; the rest starts empty.
struct Parts<'a> {
    spec: &'a RunSpec<'a>,
    journal: &'a mut dyn Journal,
    committer: committer::Committer<'a>,
    reporter: &'a mut dyn Reporter,
    io: AgentIo,
    events_tx: Events,
    socket: &'a mut socket::SocketDir,
    /// The highest step number the journal holds.
    last_recorded: u64,
}

impl<'a> Supervisor<'a> {
    /// A run's dispatcher before the agent's first line: no step open,
    /// nothing waited on, no agent pid to signal, no listener started.
    fn new(parts: Parts<'a>) -> Self {
        let Parts {
            spec,
            journal,
            committer,
            reporter,
            io,
            events_tx,
            socket,
            last_recorded,
        } = parts;
        Self {
            spec,
            journal: Some(journal),
            committer,
            reporter,
            steps: Steps::new(last_recorded),
            stats: RunStats::default(),
            io,
            outbox: Outbox::default(),
            held: reserving::Held::new(spec.budget_tree.clone()),
            budget: crate::supervisor::budget::Budget::new(
                spec.max_tokens,
                spec.max_cost_nanos,
                crate::supervisor::budget::Worst {
                    tokens: spec.tokens_before,
                    nanos: spec.cost_before,
                },
            ),
            events_tx,
            child_pid: 0,
            interactive: false,
            ending: Ending::default(),
            holding: Holding::new(spec.leased_at),
            trial: crash::Trial::of(spec),
            children: runners::Runners::default(),
            caught: None,
            proxy: None,
            socket,
            ignore_hinted: false,
        }
    }
}

impl Supervisor<'_> {
    /// Hands `transition` to every observer.
    fn transition(&mut self, transition: Transition<'_>) {
        self.trial.observe(&transition);
        if let Some(event) = transition.report() {
            self.reporter.report(&event);
        }
    }
}
