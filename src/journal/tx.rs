//! Statements on either backend, so that a write or a read is written
//! once (in `writes` and `reads`): a statement of [`super::sql`], its
//! arguments as [`Arg`]s, its rows read by position through [`Row`]. Each
//! backend implements [`Tx`] on its connection and its write transactions
//! (SQLite's `IMMEDIATE` one; PostgreSQL's, on the connection's prepared
//! statements) and supplies what its dialect does differently: a task's
//! lease with the clock that judges it, the clock, NOTIFY. [`Transact`]
//! is how a journal runs them.

use anyhow::Result;

use super::sql::Sql;
use crate::lease::Lease;

/// A statement's argument, as the column takes it. PostgreSQL's `INTEGER`
/// and `BIGINT` both take [`Arg::Int`]: the statement's parameter type
/// decides the width.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg<'a> {
    Int(i64),
    Text(&'a str),
    /// A list of texts: PostgreSQL's `text[]`, SQLite's JSON array (its
    /// query reads it with `json_each`).
    Texts(&'a [String]),
    Null,
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(value)
    }
}

impl From<u64> for Arg<'_> {
    fn from(value: u64) -> Self {
        Arg::Int(value as i64)
    }
}

impl From<u32> for Arg<'_> {
    fn from(value: u32) -> Self {
        Arg::Int(i64::from(value))
    }
}

impl From<i32> for Arg<'_> {
    fn from(value: i32) -> Self {
        Arg::Int(i64::from(value))
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(value: &'a String) -> Self {
        Arg::Text(value)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(value: Option<T>) -> Self {
        value.map_or(Arg::Null, Into::into)
    }
}

/// The lease columns starting at `first`: host, pid, pid start, heartbeat, run.
pub(crate) fn lease_at(row: &dyn Row, first: usize) -> Result<Option<Lease>> {
    Ok(super::rows::lease(
        row.text(first)?.map(str::to_owned),
        row.int(first + 1)?,
        row.int(first + 2)?,
        row.int(first + 3)?,
        row.int(first + 4)?,
    ))
}

/// A row a [`Tx`] read: its columns by position.
pub(crate) trait Row {
    /// An integer column (any width), or NULL.
    fn int(&self, column: usize) -> Result<Option<i64>>;
    /// A text column, or NULL.
    fn text(&self, column: usize) -> Result<Option<&str>>;
    /// A boolean (SQLite: an integer, 0 or not), or NULL.
    fn boolean(&self, column: usize) -> Result<Option<bool>>;

    /// An integer column that is never NULL.
    fn some_int(&self, column: usize) -> Result<i64> {
        self.int(column)?.ok_or_else(|| null(column))
    }

    /// A text column that is never NULL.
    fn some_text(&self, column: usize) -> Result<&str> {
        self.text(column)?.ok_or_else(|| null(column))
    }
}

fn null(column: usize) -> anyhow::Error {
    crate::error::Failure::journal(format!(
        "the journal holds NULL in column {column} of a row that needs a value"
    ))
    .into()
}

/// What a query hands each row it returns to.
pub(crate) type EachRow<'a> = dyn FnMut(&dyn Row) -> Result<()> + 'a;

/// Where statements run on either backend: a write transaction (its
/// owner commits it; dropped uncommitted, it rolls back) or, for a read,
/// the connection itself.
pub(crate) trait Tx {
    /// Runs `sql`; how many rows it changed.
    fn execute(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<u64>;
    /// Runs `sql` before the transaction commits, when how many rows it
    /// changed is not needed: PostgreSQL sends it with the transaction's
    /// next round trip (its `COMMIT`, if no statement after it needs an
    /// answer); SQLite runs it now.
    fn execute_later(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<()> {
        self.execute(sql, args).map(drop)
    }
    /// Runs `sql` and hands each row it returns to `each`, in order.
    fn query(&mut self, sql: &Sql, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()>;
    /// [`Tx::query`] as a transaction's last statement: PostgreSQL sends
    /// it with the `COMMIT`, one round trip, and hands over its rows once
    /// the commit took (the owner's commit then has nothing left to do);
    /// SQLite runs it now. No statement may follow it.
    fn query_last(&mut self, sql: &Sql, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        self.query(sql, args, each)
    }
    /// The task's lease, held until the transaction ends, and the clock
    /// (ms) that judges it: the server's on PostgreSQL, this host's on
    /// SQLite.
    fn lease(&mut self, task: &str) -> Result<(Option<Lease>, i64)>;
    /// The clock (ms) that judges leases: the server's on PostgreSQL,
    /// this host's on SQLite.
    fn now_ms(&mut self) -> Result<i64>;
    /// Tells a live runner of `task` at the commit that `what` changed
    /// (PostgreSQL's NOTIFY; SQLite's runners look at the file).
    fn notify(&mut self, task: &str, what: &str) -> Result<()>;
    /// Tells the workers listening at the commit that `what` changed
    /// (PostgreSQL's NOTIFY on `durun_work`; SQLite's workers look).
    fn notify_workers(&mut self, what: &str) -> Result<()>;
}

impl dyn Tx + '_ {
    /// The first row `sql` returns, made into a `T` by `make`.
    pub(crate) fn query_opt<T>(
        &mut self,
        sql: &Sql,
        args: &[Arg<'_>],
        make: impl FnOnce(&dyn Row) -> Result<T>,
    ) -> Result<Option<T>> {
        let mut make = Some(make);
        let mut found = None;
        self.query(sql, args, &mut |row| {
            if let Some(make) = make.take() {
                found = Some(make(row)?);
            }
            Ok(())
        })?;
        Ok(found)
    }
}

/// How a write transaction commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Commit {
    /// As the journal's sync mode says (fsync'd, by default).
    Durable,
    /// Without waiting for the disk, for writes that need not survive a
    /// power cut or a crash of the server (a worker's claim and heartbeat,
    /// void after the stale time anyway): SQLite's `synchronous = NORMAL`,
    /// PostgreSQL's `synchronous_commit` off.
    Unsynced,
}

/// The work of one write transaction: it commits when this returns
/// `Ok(true)` and rolls back otherwise.
pub(crate) type Work<'a> = dyn FnMut(&mut dyn Tx) -> Result<bool> + 'a;

/// A journal's write transactions, which the writes written once (in
/// `writes`) run in.
pub(crate) trait Transact {
    /// Runs `work` in one write transaction, committed as `commit` says.
    fn transact(&mut self, commit: Commit, work: &mut Work<'_>) -> Result<()>;
    /// Runs `work` on the journal's connection, outside a write
    /// transaction: a read, which PostgreSQL makes again on a new
    /// connection after a lost one (a read is safe to repeat).
    fn read(&mut self, work: &mut dyn FnMut(&mut dyn Tx) -> Result<()>) -> Result<()>;
    /// How old a lease's heartbeat may be before the lease is free.
    fn stale(&self) -> std::time::Duration;
}

/// What `work` reads from `journal` (made again, whole, if the
/// connection was lost).
pub(crate) fn read<T>(
    journal: &mut (impl Transact + ?Sized),
    mut work: impl FnMut(&mut dyn Tx) -> Result<T>,
) -> Result<T> {
    let mut done = None;
    journal.read(&mut |tx| {
        done = Some(work(tx)?);
        Ok(())
    })?;
    done.ok_or_else(|| anyhow::anyhow!("a journal read ended without running its work"))
}

/// Runs `work` in one of `journal`'s write transactions, commits it, and
/// returns what `work` did.
pub(crate) fn committed<T>(
    journal: &mut (impl Transact + ?Sized),
    work: impl FnOnce(&mut dyn Tx) -> Result<T>,
) -> Result<T> {
    once(work, |each| journal.transact(Commit::Durable, each))
}

/// [`committed`], in a transaction that does not wait for the disk
/// ([`Commit::Unsynced`]).
pub(crate) fn committed_unsynced<T>(
    journal: &mut (impl Transact + ?Sized),
    work: impl FnOnce(&mut dyn Tx) -> Result<T>,
) -> Result<T> {
    once(work, |each| journal.transact(Commit::Unsynced, each))
}

/// Hands `work` to `transact` as the closure it calls (once), and
/// returns what `work` did.
fn once<T>(
    work: impl FnOnce(&mut dyn Tx) -> Result<T>,
    transact: impl FnOnce(&mut Work<'_>) -> Result<()>,
) -> Result<T> {
    let mut work = Some(work);
    let mut done = None;
    transact(&mut |tx| {
        if let Some(work) = work.take() {
            done = Some(work(tx)?);
        }
        Ok(true)
    })?;
    done.ok_or_else(|| anyhow::anyhow!("a journal transaction ended without running its work"))
}
