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

    fn query(&mut self, sql: &Sql, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        let rows = Queries::query(self, sql.postgres(), &params(args))?;
        for row in &rows {
            each(row)?;
        }
        Ok(())
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
        let mut tx = self.client.begin(commit == Commit::Unsynced, "")?;
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
