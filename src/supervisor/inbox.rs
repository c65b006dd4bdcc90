//! The loop's inbox: what other threads tell the supervisor loop, the pipe
//! that wakes it, and the outbox of a socket client's answers.
//!
//! # Invariant
//!
//! An event is in the channel before its wake byte is written, so a loop
//! that wakes finds every event that woke it.

use std::io;
use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use serde_json::Value;

use crate::executor::Finished;
use crate::os;
use crate::protocol::Line;

/// A protocol connection: [`AGENT`] is the agent's stdin/stdout, others
/// are clients of `DURUN_SOCKET` (`durun step`, `durun call`).
pub(super) type Conn = usize;

/// The agent's own connection.
pub(super) const AGENT: Conn = 0;

/// The model/API proxy: it answers through its own channels, never a
/// connection's.
pub(super) const PROXY: Conn = usize::MAX;

pub(super) enum Event {
    Line(Conn, Line),
    /// A client connected to the socket; its answers go to this outbox.
    Connected(Conn, Answers),
    Disconnected(Conn),
    Oversized(Conn, Value),
    Exited(ExitStatus),
    ToolDone {
        step: u64,
        finished: Finished,
    },
    /// A probe of a step in doubt answered (SPEC 22).
    Probed {
        step: u64,
        probed: crate::executor::probe::Probed,
        probing: Box<Probing>,
    },
    Signal(i32),
    /// The committer sent a batch back.
    Landed,
    /// A request through the model/API proxy, or its end.
    Proxy(Box<crate::proxy::ToLoop>),
    /// The runner of this child task (without a queue) ended (SPEC 16).
    ChildEnded(String),
}

/// What a probe's call needs again once it answers: the tool and the
/// call's args, to run the step again if it did not take effect.
pub(super) struct Probing {
    pub(super) tool: std::sync::Arc<crate::config::Tool>,
    pub(super) args: Value,
}

/// Sends [`Event`]s to the loop and wakes it.
#[derive(Clone)]
pub(super) struct Events {
    tx: mpsc::Sender<Event>,
    wake: Arc<OwnedFd>,
}

impl Events {
    /// A new inbox: the sender, the loop's receiver, and the read end of the
    /// wake pipe the loop polls.
    pub(super) fn new() -> io::Result<(Self, mpsc::Receiver<Event>, OwnedFd)> {
        let (tx, rx) = mpsc::channel();
        let (wake_rx, wake_tx) = os::wake_pipe()?;
        Ok((
            Self {
                tx,
                wake: Arc::new(wake_tx),
            },
            rx,
            wake_rx,
        ))
    }

    /// The write end of the loop's wake pipe.
    pub(super) fn wake(&self) -> &Arc<OwnedFd> {
        &self.wake
    }

    pub(super) fn send(&self, event: Event) -> Result<(), mpsc::SendError<Event>> {
        self.tx.send(event)?;
        os::wake(&*self.wake);
        Ok(())
    }
}

/// Where the loop puts one socket client's answers, and how far behind
/// the client's reading is.
pub(super) struct Answers {
    tx: mpsc::Sender<Vec<u8>>,
    /// Bytes sent to the writer and not yet written to the client.
    pub(super) unwritten: Arc<AtomicUsize>,
    /// The client stopped reading for good.
    pub(super) gone: Arc<AtomicBool>,
}

impl Answers {
    pub(super) fn new(tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self {
            tx,
            unwritten: Arc::new(AtomicUsize::new(0)),
            gone: Arc::new(AtomicBool::new(false)),
        }
    }

    pub(super) fn send(&self, line: Vec<u8>) {
        self.unwritten.fetch_add(line.len(), Ordering::SeqCst);
        // A writer is gone only when its client stopped reading.
        let _ = self.tx.send(line);
    }
}
