//! PostgreSQL's side of [`crate::journal::tx`]: a transaction runs the
//! shared writes on the connection's prepared statements.

use std::error::Error;

use anyhow::Result;
use bytes::BytesMut;
use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::cached::Queries;
use super::rows::lease_of;
use super::{PostgresJournal, channel};
use crate::journal::sql::NOW_MS;
use crate::journal::sql::Sql;
use crate::journal::tx::{Arg, Commit, EachRow, Row, Transact, Tx, Work};
use crate::lease::Lease;

type Boxed = Box<dyn Error + Sync + Send>;

impl ToSql for Arg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Boxed> {
        match *self {
            Arg::Null => Ok(IsNull::Yes),
            Arg::Text(text) if <&str as ToSql>::accepts(ty) => text.to_sql(ty, out),
            Arg::Texts(list) if <&[String] as ToSql>::accepts(ty) => list.to_sql(ty, out),
            Arg::Int(value) if *ty == Type::INT2 => i16::try_from(value)?.to_sql(ty, out),
            Arg::Int(value) if *ty == Type::INT4 => i32::try_from(value)?.to_sql(ty, out),
            Arg::Int(value) if *ty == Type::INT8 => value.to_sql(ty, out),
            arg => Err(format!("{arg:?} does not fit a parameter of type {ty}").into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::INT2 | Type::INT4 | Type::INT8)
            || <&str as ToSql>::accepts(ty)
            || <&[String] as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

impl Row for postgres::Row {
    fn int(&self, column: usize) -> Result<Option<i64>> {
        Ok(match *self.columns()[column].type_() {
            Type::INT2 => self.try_get::<_, Option<i16>>(column)?.map(i64::from),
            Type::INT4 => self.try_get::<_, Option<i32>>(column)?.map(i64::from),
            _ => self.try_get(column)?,
        })
    }

    fn text(&self, column: usize) -> Result<Option<&str>> {
        Ok(self.try_get(column)?)
    }

    fn boolean(&self, column: usize) -> Result<Option<bool>> {
        Ok(self.try_get(column)?)
    }
}

/// A row of a batch of statements (the simple query protocol): its
/// columns as texts.
impl Row for postgres::SimpleQueryRow {
    fn int(&self, column: usize) -> Result<Option<i64>> {
        let text = self.try_get(column)?;
        text.map(|text| {
            text.parse()
                .map_err(|_| anyhow::anyhow!("column {column} holds {text:?}, not an integer"))
        })
        .transpose()
    }

    fn text(&self, column: usize) -> Result<Option<&str>> {
        Ok(self.try_get(column)?)
    }

    fn boolean(&self, column: usize) -> Result<Option<bool>> {
        Ok(match self.try_get(column)? {
            None => None,
            Some("t") => Some(true),
            Some("f") => Some(false),
            Some(text) => anyhow::bail!("column {column} holds {text:?}, not a boolean"),
        })
    }
}

/// The arguments as the client takes them.
fn params<'a>(args: &'a [Arg<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|arg| arg as &(dyn ToSql + Sync)).collect()
}

/// A connection, or a transaction on it: both run the connection's
/// prepared statements.
impl<Q: Queries> Tx for Q {
    fn execute(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<u64> {
        Ok(Queries::execute(self, sql.postgres(), &params(args))?)
    }

    fn execute_later(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<()> {
        if self.defer(sql.postgres(), args) {
            return Ok(());
        }
        Tx::execute(self, sql, args).map(drop)
    }

    fn query(&mut self, sql: &Sql, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        // A transaction's first statement that needs an answer goes with
        // its BEGIN: one round trip, not two.
        if self.begin_unsent()
            && let Some(statement) = self.executed(sql.postgres(), args)
        {
            for row in self.with_unsent(&statement)?.last().into_iter().flatten() {
                each(row)?;
            }
            return Ok(());
        }
        let rows = Queries::query(self, sql.postgres(), &params(args))?;
        for row in &rows {
            each(row)?;
        }
        Ok(())
    }

    fn query_last(&mut self, sql: &Sql, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        if let Some(statement) = self.executed(sql.postgres(), args)
            && let Some(rows) = self.with_commit(&statement)
        {
            for row in rows?.last().into_iter().flatten() {
                each(row)?;
            }
            return Ok(());
        }
        Tx::query(self, sql, args, each)
    }

    fn lease(&mut self, task: &str) -> Result<(Option<Lease>, i64)> {
        lease_of(self, task)
    }

    fn now_ms(&mut self) -> Result<i64> {
        let row = Queries::query_one(self, &format!("SELECT {NOW_MS}"), &[])?;
        Ok(row.get(0))
    }

    fn notify(&mut self, task: &str, what: &str) -> Result<()> {
        Ok(self.notify_channel(&channel(task), what)?)
    }

    fn notify_workers(&mut self, what: &str) -> Result<()> {
        Ok(self.notify_channel("durun_work", what)?)
    }
}

impl Transact for PostgresJournal {
    fn transact(&mut self, commit: Commit, work: &mut Work<'_>) -> Result<()> {
        let mut tx = self.client.begin(commit == Commit::Unsynced, "");
        if work(&mut tx)? {
            tx.commit()?;
        }
        Ok(())
    }

    fn read(&mut self, work: &mut dyn FnMut(&mut dyn Tx) -> Result<()>) -> Result<()> {
        self.again(|journal, _| work(&mut journal.client))
    }

    fn stale(&self) -> std::time::Duration {
        self.stale
    }
}

#[cfg(test)]
mod tests {
    use crate::journal::postgres::cached::Queries as _;
    use crate::journal::sql::Sql;
    use crate::journal::tx::{Arg, Tx};

    /// A transaction's last statement goes with its `COMMIT`: the rows
    /// come once it committed. One that fails leaves nothing written and
    /// the connection ready for the next.
    #[test]
    fn a_last_statement_takes_the_commit_with_it() {
        static INSERT: Sql = Sql::new("INSERT INTO t VALUES ($1)");
        static TAKE: Sql = Sql::new("UPDATE t SET n = n + 1 WHERE n >= $1 RETURNING n");
        static FAIL: Sql = Sql::new("SELECT 1 / (n - $1) FROM t");
        let Some(mut conn) = super::super::cached::tests::connect() else {
            return;
        };
        conn.batch_execute("CREATE TEMPORARY TABLE t (n BIGINT)")
            .expect("table");
        let open = "SELECT pg_current_xact_id_if_assigned() IS NOT NULL";
        let mut tx = conn.begin(true, "");
        tx.execute_later(&INSERT, &[Arg::Int(1)]).expect("later");
        tx.execute_later(&INSERT, &[Arg::Int(5)]).expect("later");
        let mut taken = Vec::new();
        tx.query_last(&TAKE, &[Arg::Int(2)], &mut |row| {
            taken.push(row.some_int(0)?);
            Ok(())
        })
        .expect("last");
        assert_eq!(taken, [6]);
        let still_open: bool = tx.query_one(open, &[]).expect("open").get(0);
        assert!(!still_open, "the statement took the COMMIT with it");
        tx.commit().expect("nothing left to commit");

        let mut tx = conn.begin(false, "");
        tx.execute_later(&INSERT, &[Arg::Int(7)]).expect("later");
        let failed = tx.query_last(&FAIL, &[Arg::Int(7)], &mut |_| Ok(()));
        assert!(failed.is_err(), "division by zero");
        drop(tx);
        let rows: Vec<i64> = conn
            .client
            .query("SELECT n FROM t ORDER BY n", &[])
            .expect("the connection is ready")
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(rows, [1, 6], "the failed transaction wrote nothing");
    }
}
