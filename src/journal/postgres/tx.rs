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

/// `sql` with its parameters written in as constants, to be sent in a
/// batch of statements (the simple query protocol takes no parameters);
/// `None` for what it does not write (a text with a NUL, a `$` that is
/// not a parameter, a comment), which then runs as a prepared statement.
///
/// A text is dollar-quoted with a tag that does not occur in it, so that
/// it reads back byte for byte whatever it holds and whatever the
/// server's `standard_conforming_strings`.
pub(super) fn with_values(sql: &str, args: &[Arg<'_>]) -> Option<String> {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find(['$', '\'', '"', '-', '/']) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let quote = rest.as_bytes()[0];
        if quote == b'-' || quote == b'/' {
            // A value written into a comment could end it.
            if rest.starts_with("--") || rest.starts_with("/*") {
                return None;
            }
            out.push(quote as char);
            rest = &rest[1..];
            continue;
        }
        if quote != b'$' {
            // A string or a quoted name is copied as it is.
            let end = rest[1..].find(quote as char)? + 2;
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        let digits = rest[1..].bytes().take_while(u8::is_ascii_digit).count();
        let number: usize = rest[1..=digits].parse().ok()?;
        write_value(&mut out, args.get(number.checked_sub(1)?)?)?;
        rest = &rest[1 + digits..];
    }
    out.push_str(rest);
    Some(out)
}

/// One parameter's value as a constant, spaced from what is around it.
fn write_value(out: &mut String, arg: &Arg<'_>) -> Option<()> {
    use std::fmt::Write as _;
    match *arg {
        Arg::Null => out.push_str(" NULL "),
        Arg::Int(value) if value < 0 => write!(out, " ({value}) ").ok()?,
        Arg::Int(value) => write!(out, " {value} ").ok()?,
        Arg::Text(text) => write_text(out, text)?,
        Arg::Texts(list) => {
            out.push_str(" (ARRAY[");
            for (n, text) in list.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_text(out, text)?;
            }
            out.push_str("]::TEXT[]) ");
        }
    }
    Some(())
}

/// A text, dollar-quoted with a tag that first occurs where it closes the
/// text; `None` for a text with a NUL, which PostgreSQL does not hold.
fn write_text(out: &mut String, text: &str) -> Option<()> {
    use std::fmt::Write as _;
    if text.contains('\0') {
        return None;
    }
    let mut tag = String::from("$d$");
    let mut n = 0;
    // A tag's only border is its `$`: it closes the text early if the
    // text holds it, or ends in it without its last `$`.
    while text.contains(tag.as_str()) || text.ends_with(&tag[..tag.len() - 1]) {
        n += 1;
        tag = format!("$d{n}$");
    }
    write!(out, " {tag}{text}{tag} ").ok()
}

/// A connection, or a transaction on it: both run the connection's
/// prepared statements.
impl<Q: Queries> Tx for Q {
    fn execute(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<u64> {
        Ok(Queries::execute(self, sql.postgres(), &params(args))?)
    }

    fn execute_later(&mut self, sql: &Sql, args: &[Arg<'_>]) -> Result<()> {
        if let Some(unsent) = self.unsent()
            && let Some(statement) = with_values(sql.postgres(), args)
        {
            unsent.push_str(&statement);
            unsent.push_str("; ");
            return Ok(());
        }
        Tx::execute(self, sql, args).map(drop)
    }

    fn query(&mut self, sql: &Sql, args: &[Arg<'_>], each: &mut EachRow<'_>) -> Result<()> {
        // A transaction's first statement that needs an answer goes with
        // its BEGIN: one round trip, not two.
        if self.begin_unsent()
            && let Some(statement) = with_values(sql.postgres(), args)
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
        if let Some(statement) = with_values(sql.postgres(), args)
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
    use super::with_values;
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

    #[test]
    fn values_are_written_in_where_their_parameters_are_and_nowhere_else() {
        let args: Vec<Arg<'_>> = (1..=10).map(Arg::Int).chain([Arg::Int(-7)]).collect();
        assert_eq!(
            with_values("SELECT $1, $10, $11 - $2 / 2, '$1', \"$2\"", &args).as_deref(),
            Some("SELECT  1 ,  10 ,  (-7)  -  2  / 2, '$1', \"$2\"")
        );
        assert_eq!(
            with_values(
                "UPDATE t SET s = $1 WHERE n = $2",
                &[Arg::Text("it's"), Arg::Null]
            )
            .as_deref(),
            Some("UPDATE t SET s =  $d$it's$d$  WHERE n =  NULL ")
        );
        assert_eq!(
            with_values("SELECT $1", &[Arg::Text("a$d")]).as_deref(),
            Some("SELECT  $d1$a$d$d1$ "),
            "a tag that would close early is not used"
        );
        let list = ["a".to_owned(), "b'".to_owned()];
        assert_eq!(
            with_values("WHERE id = ANY($1)", &[Arg::Texts(&list)]).as_deref(),
            Some("WHERE id = ANY( (ARRAY[ $d$a$d$ , $d$b'$d$ ]::TEXT[]) )")
        );
        assert_eq!(
            with_values("$1", &[Arg::Texts(&[])]).as_deref(),
            Some(" (ARRAY[]::TEXT[]) ")
        );
    }

    #[test]
    fn what_cannot_be_written_in_is_left_to_a_prepared_statement() {
        for (sql, args) in [
            ("SELECT $1", vec![Arg::Text("nul\0")]),
            ("SELECT $2", vec![Arg::Int(1)]),
            ("SELECT $0", vec![Arg::Int(1)]),
            ("SELECT $$x$$ || $1", vec![Arg::Int(1)]),
            ("SELECT $1 -- a comment", vec![Arg::Int(1)]),
            ("SELECT $1 /* a comment */", vec![Arg::Int(1)]),
            ("SELECT 'open", vec![]),
        ] {
            assert_eq!(with_values(sql, &args), None, "{sql}");
        }
    }
}
