//! Every exit code durun itself returns (SPEC 7).
//!
//! When the agent exits on its own, durun passes its code through; when a
//! signal ends the agent, durun exits 128 + the signal number. The codes
//! below are durun's own, chosen from the BSD `sysexits.h` range so they do
//! not collide with the small codes agents usually return.

/// A command-line usage error (clap's own code).
pub const USAGE: i32 = 2;
/// Bad configuration, an unknown task, or `run --task` with another command.
pub const CONFIG: i32 = 64;
/// The agent asked for a different step than the journal holds.
pub const DIVERGENCE: i32 = 65;
/// A bug in durun.
pub const INTERNAL: i32 = 70;
/// The journal could not be read or written.
pub const JOURNAL: i32 = 74;
/// Another live runner holds the task.
pub const LOCKED: i32 = 75;
/// A step in doubt waits for `durun resolve`.
pub const IN_DOUBT: i32 = 76;
/// The task is parked, waiting for a signal or a time (resumable).
pub const PARKED: i32 = 77;
/// The task's token budget is spent.
pub const OVER_BUDGET: i32 = 78;
/// The agent command could not be started.
pub const CANNOT_START: i32 = 127;

/// Every code above, with what it means: the one table behind `--help`
/// and the man page's EXIT STATUS.
pub const TABLE: &[(i32, &str)] = &[
    (USAGE, "a command-line usage error"),
    (
        CONFIG,
        "bad configuration, an unknown task, or `run --task` with another command",
    ),
    (
        DIVERGENCE,
        "the agent took another path than the journal holds (divergence)",
    ),
    (INTERNAL, "an internal error (a bug in durun)"),
    (
        JOURNAL,
        "the journal could not be created, opened, read or written",
    ),
    (
        LOCKED,
        "another live runner holds the task, or this run lost its lease",
    ),
    (IN_DOUBT, "a step in doubt waits for `durun resolve`"),
    (
        PARKED,
        "the task is parked, waiting for a signal or a time (resumable, not a failure)",
    ),
    (OVER_BUDGET, "the task's token budget is spent"),
    (CANNOT_START, "the agent command could not be started"),
];

/// The exit codes as one paragraph, for `--help`.
pub fn help() -> String {
    let mut text =
        String::from("Exit codes: the agent's own when it exits; 128+N when signal N ends it");
    for (code, meaning) in TABLE {
        use std::fmt::Write as _;
        let _ = write!(text, "; {code} {meaning}");
    }
    text.push('.');
    text
}

/// The exit code of a process ended by `signal`, as shells report it.
pub fn from_signal(signal: i32) -> i32 {
    128 + signal
}

/// The code a shell reports for a finished process: its own, or 128 + the
/// signal that ended it.
pub fn of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(from_signal))
        .unwrap_or(1)
}
