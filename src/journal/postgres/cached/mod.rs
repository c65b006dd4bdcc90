//! Statements prepared once per connection, as SQLite's `prepare_cached`:
//! an unprepared query costs three round trips (parse, run, close) and the
//! server counts each as a transaction of its own; a prepared one costs
//! one. Every query of the journal goes through here, so a step's commit
//! and an idle worker's look pay only for what they run.

mod values;

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use postgres::types::ToSql;
use postgres::{Client, GenericClient, Row, SimpleQueryMessage, SimpleQueryRow, Statement};

use crate::journal::tx::Arg;

type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

/// The statements a connection prepared, by their SQL (a fixed set: no
/// statement holds a value).
#[derive(Default)]
pub(super) struct Statements {
    prepared: HashMap<String, Statement>,
    /// Those prepared by name in SQL (`PREPARE durun_N`), which a batch of
    /// statements runs with `EXECUTE`: parsed and planned once a session,
    /// where a statement sent as text is parsed and planned each time.
    named: HashMap<String, u32>,
    /// Named in a batch that is not answered yet: kept once it is. A
    /// batch that fails may or may not have prepared them, so their names
    /// are not used again.
    pending: Vec<(String, u32)>,
    next: u32,
}

impl Statements {
    fn get(
        &mut self,
        client: &mut impl GenericClient,
        sql: &str,
    ) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.prepared.get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql)?;
        self.prepared.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    /// Writes `sql` run with `args` in a batch onto `out`: `EXECUTE
    /// durun_N(…)`, after its `PREPARE` the first time. False, with `out`
    /// as it was, for values it cannot write.
    fn write_executed(&mut self, out: &mut String, sql: &str, args: &[Arg<'_>]) -> bool {
        use std::fmt::Write as _;
        let known = self.named.get(sql).copied().or_else(|| {
            self.pending
                .iter()
                .find(|(pending, _)| pending == sql)
                .map(|&(_, n)| n)
        });
        let start = out.len();
        let n = known.unwrap_or(self.next);
        if known.is_none() {
            let _ = write!(out, "PREPARE durun_{n} AS {sql}; ");
        }
        let _ = write!(out, "EXECUTE durun_{n}");
        if values::write_values(out, args).is_none() {
            out.truncate(start);
            return false;
        }
        if known.is_none() {
            self.next += 1;
            self.pending.push((sql.to_owned(), n));
        }
        true
    }

    /// A batch was answered (`ok`) or failed: what it prepared is kept,
    /// or forgotten.
    fn sent<T, E>(&mut self, result: Result<T, E>) -> Result<T, E> {
        if result.is_ok() {
            self.named.extend(self.pending.drain(..));
        } else {
            self.pending.clear();
        }
        result
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
    /// Writes not sent yet, as `EXECUTE`s with their values, each ending in
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

    /// Keeps `sql` with `args` to send with a transaction's next round
    /// trip, as an `EXECUTE`; false on a connection, which runs each
    /// statement at once, or for values it cannot write.
    fn defer(&mut self, _sql: &str, _args: &[Arg<'_>]) -> bool {
        false
    }

    /// `sql` with `args` as a statement of a transaction's batch (an
    /// `EXECUTE`); `None` on a connection, or for values it cannot write.
    fn executed(&mut self, _sql: &str, _args: &[Arg<'_>]) -> Option<String> {
        None
    }

    /// Whether a transaction's `BEGIN` waits to be sent.
    fn begin_unsent(&self) -> bool {
        false
    }

    /// Runs `statements` (`EXECUTE`s, see [`Queries::executed`]) after what waits to
    /// be sent, in one round trip; the rows of each that returns rows, as
    /// texts.
    fn with_unsent(
        &mut self,
        statements: &str,
    ) -> Result<Vec<Vec<SimpleQueryRow>>, postgres::Error> {
        let rows = self.runner().simple_query(statements)?;
        Ok(rows_of(rows))
    }

    /// Runs `statement` (an `EXECUTE`) as a transaction's last:
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
        let done = self.client.batch_execute(&sql);
        self.statements.sent(done)
    }

    fn defer(&mut self, sql: &str, args: &[Arg<'_>]) -> bool {
        // Written where it waits: a step's event and counters are not
        // built apart and copied.
        let written = self.statements.write_executed(&mut self.later, sql, args);
        if written {
            self.later.push_str("; ");
        }
        written
    }

    fn executed(&mut self, sql: &str, args: &[Arg<'_>]) -> Option<String> {
        let mut statement = String::new();
        self.statements
            .write_executed(&mut statement, sql, args)
            .then_some(statement)
    }

    fn begin_unsent(&self) -> bool {
        self.begin.is_some()
    }

    fn with_unsent(
        &mut self,
        statements: &str,
    ) -> Result<Vec<Vec<SimpleQueryRow>>, postgres::Error> {
        let sql = self.unsent_then(statements);
        let rows = self.client.simple_query(&sql);
        Ok(rows_of(self.statements.sent(rows)?))
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
        let rows = self.client.simple_query(&sql);
        let rows = self.statements.sent(rows).map(rows_of);
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
        let done = self.client.batch_execute(&sql);
        self.statements.sent(done)
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
            let done = self.client.batch_execute(&sql);
            self.statements.sent(done)?;
        }
        self.ended = true;
        Ok(())
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        // What was named for a batch never sent was never prepared.
        self.statements.pending.clear();
        // A transaction never sent has nothing to roll back.
        if !self.ended && self.begin.is_none() {
            // On a lost connection there is nothing to roll back: the
            // server did when the session ended.
            let _ = self.client.batch_execute("ROLLBACK");
        }
    }
}

#[cfg(test)]
pub(super) mod tests;
