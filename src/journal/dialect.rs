//! How one query is read by each backend: written in PostgreSQL's `$N`
//! placeholders, read by SQLite as `?N` (the same numbered parameters). A
//! closing lock clause (`FOR UPDATE`, `FOR SHARE`) is PostgreSQL's alone:
//! SQLite's write transaction (`IMMEDIATE`) holds the whole file already,
//! so its text leaves the clause out; `greatest` is SQLite's scalar `max`,
//! and [`NOW_MS`] its own clock. A query whose dialects differ beyond that
//! gives SQLite a text of its own ([`Sql::dialects`]).

use std::sync::OnceLock;

/// The clock (ms) that judges leases and heartbeats, in SQL: the
/// server's on PostgreSQL, so that hosts whose clocks disagree still agree
/// on whether a heartbeat is stale. SQLite reads it as [`SQLITE_NOW_MS`].
pub(crate) const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

/// This host's clock (ms) in SQLite's SQL, the one `crate::clock::now_ms`
/// reads: one host shares a SQLite journal.
const SQLITE_NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/// One query, as each backend reads it.
pub(crate) struct Sql {
    text: Text,
    sqlite: OnceLock<String>,
    /// SQLite's own text, where it is not made from PostgreSQL's.
    sqlite_text: Option<fn() -> String>,
}

/// A query's text in `$N` form: as written, or made once from the column
/// lists both backends share.
enum Text {
    Written(&'static str),
    Made(fn() -> String, OnceLock<String>),
}

impl Sql {
    pub(super) const fn new(postgres: &'static str) -> Self {
        Self {
            text: Text::Written(postgres),
            sqlite: OnceLock::new(),
            sqlite_text: None,
        }
    }

    pub(super) const fn made(make: fn() -> String) -> Self {
        Self {
            text: Text::Made(make, OnceLock::new()),
            sqlite: OnceLock::new(),
            sqlite_text: None,
        }
    }

    /// A query each dialect writes its own way, with the same parameters
    /// and columns; SQLite's text is read as [`for_sqlite`] reads any.
    pub(super) const fn dialects(postgres: fn() -> String, sqlite: fn() -> String) -> Self {
        Self {
            text: Text::Made(postgres, OnceLock::new()),
            sqlite: OnceLock::new(),
            sqlite_text: Some(sqlite),
        }
    }

    pub(crate) fn postgres(&self) -> &str {
        match &self.text {
            Text::Written(text) => text,
            Text::Made(make, made) => made.get_or_init(make),
        }
    }

    /// `?N` for `$N`, without a closing lock clause; made once.
    pub(crate) fn sqlite(&self) -> &str {
        self.sqlite.get_or_init(|| match self.sqlite_text {
            Some(make) => for_sqlite(&make()),
            None => for_sqlite(self.postgres()),
        })
    }
}

/// A query in `$N` form as SQLite reads it: `?N`, no closing lock clause
/// (`FOR UPDATE`, `FOR SHARE`), `greatest` as SQLite's scalar `max`, and
/// its own clock for [`NOW_MS`].
fn for_sqlite(postgres: &str) -> String {
    let text = [" FOR UPDATE", " FOR SHARE"]
        .iter()
        .find_map(|clause| postgres.strip_suffix(clause))
        .unwrap_or(postgres);
    text.replace(NOW_MS, SQLITE_NOW_MS)
        .replace('$', "?")
        .replace("greatest(", "max(")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's clock in SQL is this host's clock, as durun reads it.
    #[test]
    fn sqlites_clock_is_the_hosts() {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        let before = crate::clock::now_ms();
        let clock: i64 = conn
            .query_row(&format!("SELECT {SQLITE_NOW_MS}"), [], |row| row.get(0))
            .expect("the clock");
        let after = crate::clock::now_ms();
        assert!(
            before - 1 <= clock && clock <= after + 1,
            "{before} {clock} {after}"
        );
        assert_eq!(
            for_sqlite(&format!(
                "SELECT $1, greatest(a, {NOW_MS}) FROM t FOR UPDATE"
            )),
            format!("SELECT ?1, max(a, {SQLITE_NOW_MS}) FROM t")
        );
    }
}
