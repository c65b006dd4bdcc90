//! The supervisor's state: the loop's one struct, made of owned parts
//! (`Steps`, `Outbox`, `Ending`, `Holding`, each in a module of its own
//! that says what it owns), shared by the rooms that act on them
//! (`requests`, `calls`, `commit`, `fencing`, `stopping`), none of which
//! imports another.

use serde_json::Value;

use super::agent_io::AgentIo;
use super::ending::Ending;
use super::holding::Holding;
use super::inbox::Events;
use super::outbox::Outbox;
use super::spec::RunSpec;
use super::steps::Steps;
use super::transitions::Transition;
use crate::journal::{Journal, RunStats, StepKind};
use crate::protocol::Effect;
use crate::report::Reporter;

pub(super) struct Supervisor<'a> {
    pub(super) spec: &'a RunSpec<'a>,
    /// The journal when it is home; `None` while it is lent to the
    /// committer thread with a batch (the `commit` room).
    pub(super) journal: Option<&'a mut dyn Journal>,
    /// The way to the committer thread and back.
    pub(super) committer: super::committer::Committer<'a>,
    pub(super) reporter: &'a mut dyn Reporter,
    /// Every step of this run, by where it stands.
    pub(super) steps: Steps,
    pub(super) stats: RunStats,
    /// The agent's pipes; its answers are written after each batch.
    pub(super) io: AgentIo,
    /// The next commit and where answers go.
    pub(super) outbox: Outbox,
    /// Tokens of the steps this run finished, their commits written or
    /// not yet: what the budget counts.
    pub(super) tokens_finished: u64,
    pub(super) events_tx: Events,
    pub(super) child_pid: u32,
    /// Whether a Ctrl-C from the terminal reaches the agent by itself.
    pub(super) interactive: bool,
    /// How the run ends.
    pub(super) ending: Ending,
    /// The run's hold on its task's lease.
    pub(super) holding: Holding,
    /// What `durun test` asks of this run (kill point, seeds, faults).
    pub(super) trial: super::crash::Trial,
    /// The runners of child tasks without a queue (SPEC 16): how many run,
    /// and the children waiting for one of them to end.
    pub(super) children: super::runners::Runners,
    /// durun's stop signals, when this run takes its own (not a worker's).
    pub(super) caught: Option<&'a super::child::Caught>,
    /// The model/API proxy, which starts serving at its first client.
    pub(super) proxy: Option<&'a mut crate::proxy::Proxy>,
    /// The socket of `durun step`, which starts accepting at its first
    /// client.
    pub(super) socket: &'a mut super::socket::SocketDir,
}

/// A step as the agent asks for it.
#[derive(Clone, Copy)]
pub(super) struct Wanted<'a> {
    pub(super) name: &'a str,
    pub(super) kind: StepKind,
    pub(super) effect: Effect,
    pub(super) args: &'a Value,
    pub(super) canonical: &'a str,
    /// The tool wants an operator to decide before a step in doubt runs again.
    pub(super) ask_first: bool,
}

impl Supervisor<'_> {
    /// Hands `transition` to every observer.
    pub(super) fn transition(&mut self, transition: Transition<'_>) {
        self.trial.observe(&transition);
        if let Some(event) = transition.report() {
            self.reporter.report(&event);
        }
    }
}
