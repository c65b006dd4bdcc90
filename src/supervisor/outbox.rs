//! What waits to be written: the steps of the next commit, and where
//! answers go.
//!
//! # Invariant
//!
//! A step in `batch` is answered only after the batch's commit (its
//! continuation runs then); `pipelined` once set stays set for the run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::oneshot;

use super::inbox::{Answers, Conn};
use crate::config::Tool;
use crate::journal::{StepKind, StepRecord};
use crate::proxy::Verdict;

#[derive(Default)]
pub(super) struct Outbox {
    /// Where answers go, by socket connection (the agent's go to `io`).
    pub(super) writers: HashMap<Conn, Answers>,
    /// Steps to write in the next commit.
    pub(super) batch: Vec<Deferred>,
    /// The agent asked for more before a commit of its own was answered:
    /// it does not wait for its commits, so they are written off the loop.
    pub(super) pipelined: bool,
}

/// A journal write that waits for the batch's commit, and what follows it.
pub(super) struct Deferred {
    /// The connection the continuation answers on.
    pub(super) conn: Conn,
    pub(super) record: StepRecord,
    /// The row is new (an insert), not an update.
    pub(super) fresh: bool,
    pub(super) then: Then,
}

impl Deferred {
    /// The agent's own `commit` of a step: a pipelining agent does not
    /// wait for its answer.
    pub(super) fn is_agent_commit(&self) -> bool {
        self.conn == super::inbox::AGENT
            && self.record.kind == StepKind::Begin
            && matches!(self.then, Then::Finished { .. })
    }
}

/// What follows a write once it is durable.
pub(super) enum Then {
    /// A long `read` step is written as in flight: nothing.
    Marked,
    /// The step finished: answer it.
    Finished { id: Value, started: Instant },
    /// A `mutate` begin's intent is written: answer the begin.
    Opened { id: Value, in_doubt: bool },
    /// An MCP step in doubt, asked for by its key (`find`), is written as
    /// its next attempt: answer the `find` as a `begin` in doubt.
    Reopened { id: Value },
    /// A patch's marker is written: answer `patched: true`.
    Patched { id: Value },
    /// A `mutate` call's intent is written: start its tool.
    Call {
        id: Value,
        tool: Arc<Tool>,
        args: Value,
    },
    /// A proxy request's intent or answer is written.
    Proxied(ProxyThen),
    /// A model step `durun test` answered is written: answer the begin
    /// as a replay.
    Seeded { id: Value },
    /// A `spawn` step's intent is written: make the child (SPEC 16).
    Spawn { id: Value, started: Instant },
}

impl Then {
    /// The request the write answers; `null` for none (a proxy request
    /// hears of a failed write when its reply is dropped).
    pub(super) fn into_id(self) -> Value {
        match self {
            Then::Finished { id, .. }
            | Then::Opened { id, .. }
            | Then::Reopened { id }
            | Then::Call { id, .. }
            | Then::Patched { id }
            | Then::Seeded { id }
            | Then::Spawn { id, .. } => id,
            Then::Marked | Then::Proxied(_) => Value::Null,
        }
    }

    /// Whether the write finishes a step (the run counts it).
    pub(super) fn finishes(&self) -> bool {
        matches!(
            self,
            Then::Finished { .. } | Then::Seeded { .. } | Then::Proxied(ProxyThen::Done { .. })
        )
    }
}

/// What follows a proxy step's write once it is durable.
pub(super) enum ProxyThen {
    /// A `mutate` request's intent is written: forward it.
    Forward {
        reply: oneshot::Sender<Verdict>,
        in_doubt: bool,
        /// What a budget reserves for it, if it is a model call.
        asked: Option<crate::usage::Asked>,
    },
    /// Its answer is written: let the agent have the end of it.
    Done {
        reply: oneshot::Sender<()>,
        started: Instant,
        /// The agent hung up before the end of the answer.
        unheard: bool,
    },
}
