//! Where the journal lives, and opening it.

use std::path::PathBuf;

use anyhow::Result;

use super::{Access, Journal, postgres, sqlite};
use crate::error::Failure;
use crate::settings::Settings;

/// Where the journal lives.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Location {
    Sqlite(PathBuf),
    Postgres(String),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "Sqlite({})", path.display()),
            // A URL may carry a password: never print it.
            Self::Postgres(_) => f.write_str("Postgres(<redacted>)"),
        }
    }
}

impl Location {
    /// Where the journal lives: `--journal`/`DURUN_JOURNAL` if given, else
    /// the per-user default.
    pub(crate) fn of(settings: &Settings) -> Result<Self> {
        if let Some(text) = settings.journal_arg() {
            if text.starts_with("postgres://") || text.starts_with("postgresql://") {
                return Ok(Self::Postgres(text.to_owned()));
            }
            return Ok(Self::Sqlite(PathBuf::from(text)));
        }
        let state = settings.state_home().ok_or_else(|| {
            Failure::config(
                "cannot find a place for the journal: neither XDG_STATE_HOME nor HOME is set",
            )
            .hint("pass --journal PATH or set DURUN_JOURNAL")
        })?;
        Ok(Self::Sqlite(state.join("durun").join("journal.db")))
    }

    /// Whether a journal is there to read: false only when nothing is at
    /// the path; a path that cannot be looked at, or is not a file, is a
    /// journal error (74).
    pub(crate) fn exists(&self) -> Result<bool> {
        match self {
            Self::Sqlite(path) => sqlite::holds_tables(path),
            Self::Postgres(_) => Ok(true),
        }
    }

    /// How the journal is named in messages, never with a password.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("the journal at {}", path.display()),
            Self::Postgres(url) => postgres::describe(url),
        }
    }

    /// Opens the journal. Its storage errors are explained (a locked file,
    /// a full disk) in terms of this place when they are reported.
    pub(crate) fn open(&self, access: Access, settings: &Settings) -> Result<Box<dyn Journal>> {
        super::explain::remember(self.describe());
        let journal: Box<dyn Journal> = match self {
            Self::Sqlite(path) => Box::new(sqlite::SqliteJournal::open(path, access, settings)?),
            Self::Postgres(url) => Box::new(postgres::PostgresJournal::open(
                url,
                access == Access::Write,
                settings,
            )?),
        };
        Ok(journal)
    }
}
