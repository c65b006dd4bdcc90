//! Turns storage errors into what a person can act on.
//!
//! A storage error (the journal is locked, read-only, corrupt, on a full
//! disk) is classified once, where it is reported ([`explain`]): a
//! `durun: …` line with a hint goes in front of it, naming the journal the
//! process opened, and SQLite's own words stay as the cause. Every such
//! error exits 74. A write the lease fence refused gets its line here too:
//! 75 when another run holds the task, 78 when it was cancelled.

use anyhow::Error;
use rusqlite::ErrorCode;

use crate::error::{Failure, Kind};

/// The journal this process opened, as messages name it.
static PLACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Notes which journal the process works on, for [`explain`].
pub(super) fn remember(place: String) {
    let _ = PLACE.set(place);
}

/// Whether `err` says the connection to the server was lost (a restart,
/// a network cut, the session ended by the server) rather than a write
/// refused: the task is worth resuming once the server is back.
pub(crate) fn connection_lost(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<postgres::Error>().is_some_and(|err| {
            err.is_closed()
                || err.code().is_some_and(|code| {
                    let code = code.code();
                    code.starts_with("08") || code.starts_with("57P")
                })
        })
    })
}

/// Adds a `Failure` that says what a storage error in the chain means for
/// the user; any other error comes back as it was.
pub(crate) fn explain(err: Error) -> Error {
    let place = PLACE.get().map_or("the journal", String::as_str);
    explain_at(place, err)
}

fn explain_at(place: &str, err: Error) -> Error {
    if crate::error::failure_of(&err).is_some() {
        return err;
    }
    if let Some(super::Fenced(standing)) = err.downcast_ref() {
        let failure = match standing {
            super::Standing::Cancelled => {
                Failure::config("the task was cancelled while this command worked on it")
                    .hint("a cancelled task never runs again; start the agent as a new task")
            }
            super::Standing::Held | super::Standing::Lost => Failure::new(
                Kind::Locked,
                "another run took the task over while this command worked on it",
            )
            .hint("see who holds it with `durun inspect TASK`"),
        };
        return err.context(failure);
    }
    let no_schema = err.chain().any(|cause| {
        cause
            .downcast_ref::<postgres::Error>()
            .and_then(postgres::Error::code)
            .is_some_and(|code| *code == postgres::error::SqlState::INVALID_SCHEMA_NAME)
    });
    if no_schema {
        return err.context(
            Failure::journal(format!(
                "{place} has no schema to create durun's tables in: the URL's search_path names a schema that does not exist"
            ))
            .hint("create it first (`psql URL -c 'CREATE SCHEMA name'`), or leave search_path out of the URL to use `public`"),
        );
    }
    let code = err
        .chain()
        .find_map(|cause| match cause.downcast_ref::<rusqlite::Error>() {
            Some(rusqlite::Error::SqliteFailure(failure, _)) => Some(failure.code),
            _ => None,
        });
    let (message, hint) = match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => (
            format!("{place} is locked by another process"),
            "another program has held a write lock on it for seconds; find it with `fuser` and let it finish",
        ),
        Some(ErrorCode::ReadOnly) => (
            format!("{place} is read-only"),
            "make the file and its directory writable, or choose another journal with --journal",
        ),
        Some(ErrorCode::NotADatabase) => (
            format!("{place} is not a durun journal (not an SQLite database)"),
            "move the file away (durun creates a new journal) or pass the right path with --journal",
        ),
        Some(ErrorCode::DatabaseCorrupt) => (
            format!("{place} is corrupt"),
            "restore it from a backup; `sqlite3 FILE .recover` may save the steps it holds",
        ),
        Some(ErrorCode::DiskFull) => (
            format!("the disk holding {place} is full"),
            "free some space, then resume the task: no step was recorded as done that was not",
        ),
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => (
            format!("cannot open {place}"),
            "check that its directory exists and is writable, or choose another journal with --journal",
        ),
        Some(ErrorCode::SystemIoFailure) => (
            format!("an I/O error hit {place}"),
            "check the disk; the task can be resumed once it works",
        ),
        _ => return err,
    };
    err.context(Failure::journal(message).hint(hint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::exit_code_of;
    use crate::exit_code;
    use crate::journal::{Fenced, Standing};

    fn explained(err: Error) -> (i32, String) {
        let err = explain_at("the journal at /j.db", err);
        (exit_code_of(&err), err.to_string())
    }

    #[test]
    fn a_refused_write_says_why_with_its_own_code() {
        let (code, message) = explained(Error::new(Fenced(Standing::Cancelled)));
        assert_eq!(code, exit_code::CONFIG);
        assert!(message.contains("cancelled"), "{message}");
        for standing in [Standing::Held, Standing::Lost] {
            let (code, message) = explained(Error::new(Fenced(standing)).context("discarding"));
            assert_eq!(code, exit_code::LOCKED);
            assert!(message.contains("another run"), "{message}");
        }
    }

    #[test]
    fn storage_errors_name_the_journal_and_exit_74() {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        let (code, message) = explained(Error::new(busy).context("writing step 3"));
        assert_eq!(code, exit_code::JOURNAL);
        assert_eq!(message, "the journal at /j.db is locked by another process");
    }

    #[test]
    fn other_errors_and_chosen_failures_pass_through() {
        let (code, message) = explained(anyhow::anyhow!("bug"));
        assert_eq!((code, message.as_str()), (exit_code::INTERNAL, "bug"));
        let chosen = Error::new(Failure::config("bad config")).context("while loading");
        let err = explain_at("x", chosen);
        assert_eq!(exit_code_of(&err), exit_code::CONFIG);
    }
}
