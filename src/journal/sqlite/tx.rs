//! SQLite's side of [`crate::journal::tx`]: an `IMMEDIATE` transaction
//! (the write lock is held from its start, so no takeover or cancel comes
//! between a fence and the writes) runs the shared writes on its cached
//! statements.

use anyhow::Result;
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};

use super::SqliteJournal;
use super::rows::lease_of;
use crate::journal::sql::Sql;
use crate::journal::tx::{Arg, Commit, EachRow, Row, Transact, Tx, Work};
use crate::lease::Lease;

impl ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match *self {
            Arg::Int(value) => ToSqlOutput::from(value),
            Arg::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Arg::Texts(list) => ToSqlOutput::from(
                serde_json::to_string(list)
                    .map_err(|error| rusqlite::Error::ToSqlConversionFailure(error.into()))?,
            ),
            Arg::Null => ToSqlOutput::from(rusqlite::types::Null),
        })
    }
}

impl Row for rusqlite::Row<'_> {
    fn int(&self, column: usize) -> Result<Option<i64>> {
        Ok(self.get_ref(column)?.as_i64_or_null()?)
    }

    fn text(&self, column: usize) -> Result<Option<&str>> {
        Ok(self.get_ref(column)?.as_str_or_null()?)
    }

    fn boolean(&self, column: usize) -> Result<Option<bool>> {
        Ok(self.int(column)?.map(|value| value != 0))
    }
}

/// The connection, or a transaction on it (which derefs to it).
impl Tx for &rusqlite::Connection {
    fn execute(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<u64> {
        let changed = self
            .prepare_cached(sql.sqlite())?
            .execute(rusqlite::params_from_iter(args))?;
        Ok(changed as u64)
    }

    fn query(&mut self, sql: &Sql, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        let mut statement = self.prepare_cached(sql.sqlite())?;
        let mut rows = statement.query(rusqlite::params_from_iter(args))?;
        while let Some(row) = rows.next()? {
            each(row)?;
        }
        Ok(())
    }

    fn lease(&mut self, task: &str) -> Result<(Option<Lease>, i64)> {
        Ok((lease_of(self, task)?, crate::journal::now_ms()))
    }

    fn now_ms(&mut self) -> Result<i64> {
        Ok(crate::journal::now_ms())
    }

    fn notify(&mut self, _task: &str, _what: &str) -> Result<()> {
        Ok(())
    }

    fn notify_workers(&mut self, _what: &str) -> Result<()> {
        Ok(())
    }
}

impl Transact for SqliteJournal {
    fn transact(&mut self, commit: Commit, work: &mut Work<'_>) -> Result<()> {
        if commit == Commit::Unsynced {
            // A pragma outside the transaction: within one it would not
            // apply.
            self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        }
        let done = self.immediate(work);
        if commit == Commit::Unsynced {
            self.conn.pragma_update(
                None,
                "synchronous",
                self.sync.as_str().to_ascii_uppercase(),
            )?;
        }
        done
    }

    fn read(&mut self, work: &mut dyn FnMut(&mut dyn Tx) -> Result<()>) -> Result<()> {
        work(&mut &self.conn)
    }

    fn stale(&self) -> std::time::Duration {
        self.stale
    }
}

impl SqliteJournal {
    /// `work` in an `IMMEDIATE` transaction.
    fn immediate(&mut self, work: &mut Work<'_>) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if work(&mut &*tx)? {
            tx.commit()?;
            self.check_identity()?;
        }
        Ok(())
    }
}
