//! The few typed errors that choose an exit code. (`report::error` prints
//! them.)

use std::fmt;

use crate::exit_code;

/// What kind of failure it is: each kind has one exit code (SPEC 7),
/// chosen here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The command line is wrong.
    Usage,
    /// A bad config, an unknown task, a refused import.
    Config,
    /// The agent's path changed since the journal was written.
    Divergence,
    /// A bug, or a fault durun has no better word for.
    Internal,
    /// The journal could not be created, opened, read or written.
    Journal,
    /// A live runner holds the task.
    Locked,
    /// A step in doubt waits for `durun resolve`.
    InDoubt,
    /// The task is parked until a signal or a time.
    Parked,
    /// The task's token budget is spent.
    OverBudget,
    /// The agent's command cannot be started.
    CannotStart,
}

impl Kind {
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            Self::Usage => exit_code::USAGE,
            Self::Config => exit_code::CONFIG,
            Self::Divergence => exit_code::DIVERGENCE,
            Self::Internal => exit_code::INTERNAL,
            Self::Journal => exit_code::JOURNAL,
            Self::Locked => exit_code::LOCKED,
            Self::InDoubt => exit_code::IN_DOUBT,
            Self::Parked => exit_code::PARKED,
            Self::OverBudget => exit_code::OVER_BUDGET,
            Self::CannotStart => exit_code::CANNOT_START,
        }
    }
}

/// An error whose exit code is not the generic internal-error code.
///
/// Everything else travels as `anyhow::Error` with context; `lib::run` walks
/// the chain for the first `Failure` (or a storage error) to pick the code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: Kind,
    pub(crate) message: String,
    /// Lines printed under the first one (a diff, a list of steps).
    pub(crate) details: Option<String>,
    /// What the user can do about it, printed as `hint: …`.
    pub(crate) hint: Option<String>,
}

impl Failure {
    pub(crate) fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            details: None,
            hint: None,
        }
    }

    #[must_use]
    pub(crate) fn details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }

    #[must_use]
    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::new(Kind::Config, message)
    }

    pub(crate) fn journal(message: impl Into<String>) -> Self {
        Self::new(Kind::Journal, message)
    }

    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(Kind::Usage, message)
    }

    /// The exit code this failure ends the command with.
    pub(crate) fn exit_code(&self) -> i32 {
        self.kind.exit_code()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// The outermost `Failure` in the error, whether it is the error itself or
/// context added on the way up. (`err.chain()` would not find context: it
/// yields anyhow's wrappers.)
pub(crate) fn failure_of(err: &anyhow::Error) -> Option<&Failure> {
    err.downcast_ref::<Failure>()
}

/// The exit code for an error chain: the first `Failure` wins, storage
/// errors mean the journal failed, anything else is an internal error.
pub(crate) fn exit_code_of(err: &anyhow::Error) -> i32 {
    if let Some(failure) = failure_of(err) {
        return failure.exit_code();
    }
    for cause in err.chain() {
        if cause.downcast_ref::<rusqlite::Error>().is_some()
            || cause.downcast_ref::<postgres::Error>().is_some()
        {
            return exit_code::JOURNAL;
        }
    }
    exit_code::INTERNAL
}

/// Whether the chain ends in a broken pipe: `durun inspect | head` is not
/// an error.
pub(crate) fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

thread_local! {
    /// This thread runs a worker's task: a panic here ends the task, not
    /// the worker.
    static CONTAINED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A panic is a bug: it ends durun at once, and the agent and its tools
/// die with it (parent-death signal), leaving the task resumable; the
/// release build unwinds only so that a worker's task thread
/// ([`contain_panics`]) can end alone.
pub(crate) fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        if !CONTAINED.get() {
            std::process::abort();
        }
    }));
}

/// A panic on this thread unwinds it, to be caught where it was started
/// (a worker's task thread: SPEC 16).
pub(crate) fn contain_panics() {
    CONTAINED.set(true);
}

/// `err` and its causes on one line, `: ` between them (a client error
/// whose own text says only its kind, "error sending request").
pub(crate) fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}
