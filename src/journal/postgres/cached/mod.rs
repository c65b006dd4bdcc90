//! Statements prepared once per connection, as SQLite's `prepare_cached`:
//! an unprepared query costs three round trips (parse, run, close) and the
//! server counts each as a transaction of its own; a prepared one costs
//! one. Every query of the journal goes through here, so a step's commit
//! and an idle worker's look pay only for what they run.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use postgres::types::ToSql;
use postgres::{Client, GenericClient, Row, SimpleQueryMessage, SimpleQueryRow, Statement};

type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

/// The statements a connection prepared, by their SQL (a fixed set: no
/// statement holds a value).
#[derive(Default)]
pub(super) struct Statements(HashMap<String, Statement>);

impl Statements {
    fn get(
        &mut self,
        client: &mut impl GenericClient,
        sql: &str,
    ) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.0.get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql)?;
        self.0.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

/// A connection and its prepared statements.
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) statements: Statements,
    /// Each transaction commits without waiting for the server's disk
    /// (`SET LOCAL synchronous_commit TO off`, sent with its `BEGIN`): the
    /// journal's sync mode is `normal`.
    pub(super) unsynced: bool,
}

/// A transaction whose queries use the connection's prepared statements.
/// Its `BEGIN` goes with the first statement that needs an answer (or
/// with the `COMMIT`), writes whose count is not read with the next round
/// trip, and `NOTIFY`s with the `COMMIT`: a transaction of such writes
/// alone is one round trip. Dropped before its commit, it rolls back.
pub(super) struct Tx<'a> {
    client: &'a mut Client,
    statements: &'a mut Statements,
    /// The `BEGIN` and the statements that set the transaction up, not
    /// sent yet.
    begin: Option<Cow<'static, str>>,
    /// `COMMIT` was sent.
    ended: bool,
    /// Writes not sent yet, with their values written in, each ending in
    /// `; `: they go before the next statement.
    later: String,
    /// Statements sent with the `COMMIT` (`NOTIFY`s, which the server
    /// delivers at the commit anyway).
    at_commit: String,
}

/// The queries of a connection or of a transaction on it, through the
/// connection's prepared statements.
pub(super) trait Queries {
    /// `sql`, prepared on this connection once.
    fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error>;
    /// Where the statements run.
    fn runner(&mut self) -> &mut impl GenericClient;

    fn execute(&mut self, sql: &str, params: Params<'_>) -> Result<u64, postgres::Error> {
        let statement = self.prepared(sql)?;
        self.runner().execute(&statement, params)
    }

    fn query(&mut self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.prepared(sql)?;
        self.runner().query(&statement, params)
    }

    fn query_one(&mut self, sql: &str, params: Params<'_>) -> Result<Row, postgres::Error> {
        let statement = self.prepared(sql)?;
        self.runner().query_one(&statement, params)
    }

    fn query_opt(&mut self, sql: &str, params: Params<'_>) -> Result<Option<Row>, postgres::Error> {
        let statement = self.prepared(sql)?;
        self.runner().query_opt(&statement, params)
    }

    fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error> {
        self.runner().batch_execute(sql)
    }

    /// Where a transaction keeps writes to send with its next round trip;
    /// `None` on a connection, which runs each at once.
    fn unsent(&mut self) -> Option<&mut String> {
        None
    }

    /// Whether a transaction's `BEGIN` waits to be sent.
    fn begin_unsent(&self) -> bool {
        false
    }

    /// Runs `statements` (their values written in) after what waits to
    /// be sent, in one round trip; the rows of each that returns rows, as
    /// texts.
    fn with_unsent(
        &mut self,
        statements: &str,
    ) -> Result<Vec<Vec<SimpleQueryRow>>, postgres::Error> {
        let rows = self.runner().simple_query(statements)?;
        Ok(rows_of(rows))
    }

    /// Runs `statement` (its values written in) as a transaction's last:
    /// what waits, it and the `COMMIT` in one round trip; the rows of each
    /// statement that returns rows. `None` on a connection, which has no
    /// transaction to end.
    fn with_commit(
        &mut self,
        _statement: &str,
    ) -> Option<Result<Vec<Vec<SimpleQueryRow>>, postgres::Error>> {
        None
    }

    /// Notifies `channel` with `payload`: at once on a connection, with
    /// the `COMMIT` in a transaction (when the server delivers it anyway).
    fn notify_channel(&mut self, channel: &str, payload: &str) -> Result<(), postgres::Error> {
        notify_now(self, channel, payload)
    }
}

/// The rows of each statement of a batch that returns rows, in order.
fn rows_of(messages: Vec<SimpleQueryMessage>) -> Vec<Vec<SimpleQueryRow>> {
    let mut rows: Vec<Vec<SimpleQueryRow>> = Vec::new();
    for message in messages {
        match message {
            SimpleQueryMessage::Row(row) => match rows.last_mut() {
                Some(last) => last.push(row),
                None => rows.push(vec![row]),
            },
            // A statement's rows begin.
            SimpleQueryMessage::RowDescription(_) => rows.push(Vec::new()),
            _ => {}
        }
    }
    rows
}

fn notify_now(
    queries: &mut (impl Queries + ?Sized),
    channel: &str,
    payload: &str,
) -> Result<(), postgres::Error> {
    queries
        .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
        .map(drop)
}

/// Whether `text` may be written into SQL as it is: the channels and
/// news durun notifies (`durun_task_…`, `completed`).
fn plain(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'.')
}

impl Queries for Conn {
    fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        self.statements.get(&mut self.client, sql)
    }

    fn runner(&mut self) -> &mut impl GenericClient {
        &mut self.client
    }
}

impl Queries for Tx<'_> {
    fn prepared(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        // Every statement that needs an answer comes here first: what
        // waits is sent before it, in order.
        self.send_unsent()?;
        self.statements.get(self.client, sql)
    }

    fn batch_execute(&mut self, sql: &str) -> Result<(), postgres::Error> {
        let sql = self.unsent_then(sql);
        self.client.batch_execute(&sql)
    }

    fn unsent(&mut self) -> Option<&mut String> {
        Some(&mut self.later)
    }

    fn begin_unsent(&self) -> bool {
        self.begin.is_some()
    }

    fn with_unsent(
        &mut self,
        statements: &str,
    ) -> Result<Vec<Vec<SimpleQueryRow>>, postgres::Error> {
        let sql = self.unsent_then(statements);
        Ok(rows_of(self.client.simple_query(&sql)?))
    }

    fn with_commit(
        &mut self,
        statement: &str,
    ) -> Option<Result<Vec<Vec<SimpleQueryRow>>, postgres::Error>> {
        let mut end = String::with_capacity(statement.len() + self.at_commit.len() + 8);
        end.push_str(statement);
        end.push_str("; ");
        end.push_str(&std::mem::take(&mut self.at_commit));
        end.push_str("COMMIT");
        let sql = self.unsent_then(&end);
        let rows = self.client.simple_query(&sql).map(rows_of);
        // On an error the server rolled back, or the `ROLLBACK` on drop
        // ends what is left.
        self.ended = rows.is_ok();
        Some(rows)
    }

    fn runner(&mut self) -> &mut impl GenericClient {
        &mut *self.client
    }

    fn notify_channel(&mut self, channel: &str, payload: &str) -> Result<(), postgres::Error> {
        if !(plain(channel) && plain(payload)) {
            return notify_now(self, channel, payload);
        }
        let _ = write!(self.at_commit, "NOTIFY {channel}, '{payload}'; ");
        Ok(())
    }
}

impl Conn {
    pub(super) fn new(client: Client, unsynced: bool) -> Self {
        Self {
            client,
            statements: Statements::default(),
            unsynced,
        }
    }

    /// A transaction, at the connection's sync mode.
    pub(super) fn transaction(&mut self) -> Tx<'_> {
        self.begin(false, "")
    }

    /// A transaction that commits without waiting for the server's disk
    /// if `unsynced` (or the connection's sync mode says so), whose first
    /// statements are `setup` (a `LISTEN`, say): all sent with its first
    /// round trip, so an error in `setup` comes from there.
    pub(super) fn begin(&mut self, unsynced: bool, setup: &str) -> Tx<'_> {
        let begin = if unsynced || self.unsynced {
            "START TRANSACTION; SET LOCAL synchronous_commit TO off"
        } else {
            "START TRANSACTION"
        };
        // A step's commit begins with no text built.
        let begin = if setup.is_empty() {
            Cow::Borrowed(begin)
        } else {
            Cow::Owned(format!("{begin}; {setup}"))
        };
        Tx {
            client: &mut self.client,
            statements: &mut self.statements,
            begin: Some(begin),
            ended: false,
            later: String::new(),
            at_commit: String::new(),
        }
    }
}

impl Tx<'_> {
    pub(super) fn commit(self) -> Result<(), postgres::Error> {
        self.commit_after("")
    }

    /// Sends what waits (the `BEGIN`, writes that need no answer) before
    /// a statement that needs one: one round trip, or none.
    fn send_unsent(&mut self) -> Result<(), postgres::Error> {
        if self.begin.is_none() && self.later.is_empty() {
            return Ok(());
        }
        let sql = self.unsent_then("");
        self.client.batch_execute(&sql)
    }

    /// What waits to be sent before a statement, then `last`; the
    /// transaction counts as begun from here (a failure rolls it back
    /// when it is dropped).
    fn unsent_then(&mut self, last: &str) -> String {
        let mut sql = match self.begin.take() {
            Some(begin) => {
                let mut sql = begin.into_owned();
                sql.push_str("; ");
                sql
            }
            None => String::new(),
        };
        sql.push_str(&self.later);
        self.later.clear();
        sql.push_str(last);
        sql
    }

    /// Sends what waits, the notifies and `last` (an `UNLISTEN`, say),
    /// then commits: one round trip. On an error the transaction rolls
    /// back (when it is dropped).
    pub(super) fn commit_after(mut self, last: &str) -> Result<(), postgres::Error> {
        // Its last statement took the `COMMIT` with it.
        if self.ended {
            return Ok(());
        }
        if self.begin.is_none()
            && self.later.is_empty()
            && self.at_commit.is_empty()
            && last.is_empty()
        {
            self.client.batch_execute("COMMIT")?;
        } else {
            let mut end = std::mem::take(&mut self.at_commit);
            if !last.is_empty() {
                end.push_str(last);
                end.push_str("; ");
            }
            end.push_str("COMMIT");
            let sql = self.unsent_then(&end);
            self.client.batch_execute(&sql)?;
        }
        self.ended = true;
        Ok(())
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        // A transaction never sent has nothing to roll back.
        if !self.ended && self.begin.is_none() {
            // On a lost connection there is nothing to roll back: the
            // server did when the session ended.
            let _ = self.client.batch_execute("ROLLBACK");
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::{Conn, Queries as _};

    /// A connection to `DURUN_TEST_POSTGRES`, or `None` (said skipped).
    pub(in crate::journal::postgres) fn connect() -> Option<Conn> {
        let Ok(url) = std::env::var("DURUN_TEST_POSTGRES") else {
            assert!(
                std::env::var_os("DURUN_REQUIRE_POSTGRES").is_none(),
                "DURUN_REQUIRE_POSTGRES is set and DURUN_TEST_POSTGRES is not"
            );
            eprintln!("skipped: DURUN_TEST_POSTGRES is not set");
            return None;
        };
        let client = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        Some(Conn::new(client, false))
    }

    fn synchronous_commit(conn: &mut Conn, unsynced: bool) -> String {
        let mut tx = conn.begin(unsynced, "");
        let setting: String = tx
            .query_one("SHOW synchronous_commit", &[])
            .expect("show")
            .get(0);
        tx.commit().expect("commit");
        setting
    }

    #[test]
    fn a_transaction_is_unsynced_when_asked_or_when_its_connection_is() {
        let Some(mut conn) = connect() else { return };
        conn.batch_execute("SET synchronous_commit TO on")
            .expect("set");
        assert_eq!(synchronous_commit(&mut conn, false), "on");
        assert_eq!(synchronous_commit(&mut conn, true), "off");
        conn.unsynced = true;
        assert_eq!(synchronous_commit(&mut conn, false), "off");
        // The session's own setting is left as it was.
        let row = conn
            .query_one("SHOW synchronous_commit", &[])
            .expect("show");
        assert_eq!(row.get::<_, String>(0), "on");
    }

    #[test]
    fn a_transaction_not_committed_or_whose_commit_failed_rolls_back() {
        let Some(mut conn) = connect() else { return };
        conn.batch_execute("CREATE TEMPORARY TABLE t (n INTEGER)")
            .expect("table");
        let count = |conn: &mut Conn| -> i64 {
            conn.query_one("SELECT count(*) FROM t", &[])
                .expect("count")
                .get(0)
        };
        {
            let mut tx = conn.begin(false, "");
            tx.execute("INSERT INTO t VALUES (1)", &[]).expect("insert");
        }
        assert_eq!(count(&mut conn), 0, "a dropped transaction rolled back");
        let mut tx = conn.begin(true, "");
        tx.execute("INSERT INTO t VALUES (2)", &[]).expect("insert");
        tx.commit_after("SELECT 1/0")
            .expect_err("the last statement fails");
        // The session is out of the failed transaction: it answers.
        assert_eq!(count(&mut conn), 0, "a failed commit rolled back");
        let mut tx = conn.begin(false, "LISTEN durun_cached_test");
        tx.execute("INSERT INTO t VALUES (3)", &[]).expect("insert");
        tx.commit_after("UNLISTEN durun_cached_test")
            .expect("commit");
        assert_eq!(count(&mut conn), 1);
        // A setup that fails (with the first round trip) leaves no
        // transaction open.
        let mut tx = conn.begin(false, "SELECT 1/0");
        tx.execute("INSERT INTO t VALUES (4)", &[])
            .expect_err("the setup fails");
        drop(tx);
        assert_eq!(count(&mut conn), 1, "the session answers");
        let tx = conn.begin(false, "SELECT 1/0");
        tx.commit().expect_err("the setup fails");
        assert_eq!(count(&mut conn), 1, "the session answers");
    }

    #[test]
    fn a_transactions_notifies_go_with_its_commit_and_none_with_a_rollback() {
        use postgres::fallible_iterator::FallibleIterator as _;
        let Some(mut conn) = connect() else { return };
        conn.batch_execute("LISTEN durun_cached_news")
            .expect("listen");
        {
            let mut tx = conn.begin(false, "");
            tx.notify_channel("durun_cached_news", "dropped")
                .expect("notify");
        }
        let mut tx = conn.begin(false, "");
        tx.notify_channel("durun_cached_news", "committed")
            .expect("notify");
        // Not plain: sent at once, as a parameter.
        tx.notify_channel("durun_cached_news", "it's")
            .expect("notify");
        tx.commit().expect("commit");
        conn.batch_execute("SELECT 1").expect("a round trip");
        let heard: Vec<String> = conn
            .client
            .notifications()
            .iter()
            .map(|note| Ok(note.payload().to_owned()))
            .collect()
            .expect("notifications");
        assert_eq!(heard, ["it's", "committed"]);
    }

    #[test]
    fn a_transaction_of_writes_that_need_no_answer_is_one_round_trip() {
        use crate::journal::sql::Sql;
        use crate::journal::tx::{Arg, Tx as _};
        static INSERT: Sql = Sql::new("INSERT INTO t VALUES ($1, $2)");
        static READ: Sql = Sql::new(
            "SELECT n, s, n < 0, s IS NULL, (SELECT count(*) FROM t WHERE s = $2) FROM t WHERE n = $1",
        );
        let Some(mut conn) = connect() else { return };
        conn.batch_execute("CREATE TEMPORARY TABLE t (n BIGINT, s TEXT)")
            .expect("table");
        let texts = [
            "it's",
            "$d$",
            "ends in $d",
            "$d1$ and $d$",
            "back\\slash \\' and \"quotes\"",
            "-- not a comment\n; DROP TABLE t; --",
            "ünïcødé ✓",
            "",
        ];
        let mut tx = conn.begin(false, "");
        for (n, text) in texts.iter().enumerate() {
            tx.execute_later(&INSERT, &[Arg::Int(n as i64 - 3), Arg::Text(text)])
                .expect("later");
        }
        tx.execute_later(&INSERT, &[Arg::Null, Arg::Null])
            .expect("later");
        // Nothing was sent yet: the transaction is not there.
        assert!(!tx.later.is_empty() && tx.begin.is_some());
        tx.commit().expect("commit");
        let rows = conn
            .client
            .query("SELECT n, s FROM t ORDER BY n NULLS LAST", &[])
            .expect("rows");
        let read: Vec<(Option<i64>, Option<String>)> =
            rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        let mut wanted: Vec<(Option<i64>, Option<String>)> = texts
            .iter()
            .enumerate()
            .map(|(n, text)| (Some(n as i64 - 3), Some((*text).to_owned())))
            .collect();
        wanted.push((None, None));
        assert_eq!(read, wanted, "each value reads back as it was written");

        // The first statement that needs an answer goes with the BEGIN,
        // and reads as a prepared one would.
        let mut tx = conn.begin(true, "");
        tx.execute_later(&INSERT, &[Arg::Int(100), Arg::Null])
            .expect("later");
        tx.notify_channel("durun_cached_test", "read")
            .expect("notify");
        let mut rows = Vec::new();
        crate::journal::tx::Tx::query(
            &mut tx,
            &READ,
            &[Arg::Int(-3), Arg::Text("it's")],
            &mut |row| {
                rows.push((
                    row.int(0)?,
                    row.text(1)?.map(str::to_owned),
                    row.boolean(2)?,
                    row.boolean(3)?,
                    row.some_int(4)?,
                ));
                Ok(())
            },
        )
        .expect("query");
        assert!(
            tx.begin.is_none() && tx.later.is_empty(),
            "the BEGIN and the write went with it"
        );
        assert!(!tx.at_commit.is_empty(), "the NOTIFY waits for the COMMIT");
        assert_eq!(
            rows,
            [(
                Some(-3),
                Some("it's".to_owned()),
                Some(true),
                Some(false),
                1
            )]
        );
    }
}
