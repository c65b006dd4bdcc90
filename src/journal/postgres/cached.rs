//! Statements prepared once per connection, as SQLite's `prepare_cached`:
//! an unprepared query costs three round trips (parse, run, close) and the
//! server counts each as a transaction of its own; a prepared one costs
//! one. Every query of the journal goes through here, so a step's commit
//! and an idle worker's look pay only for what they run.

use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Client, GenericClient, Row, Statement, Transaction};

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
}

/// A transaction whose queries use the connection's prepared statements.
pub(super) struct Tx<'a> {
    tx: Transaction<'a>,
    statements: &'a mut Statements,
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
        self.statements.get(&mut self.tx, sql)
    }

    fn runner(&mut self) -> &mut impl GenericClient {
        &mut self.tx
    }
}

impl Conn {
    pub(super) fn transaction(&mut self) -> Result<Tx<'_>, postgres::Error> {
        Ok(Tx {
            tx: self.client.transaction()?,
            statements: &mut self.statements,
        })
    }
}

impl Tx<'_> {
    pub(super) fn commit(self) -> Result<(), postgres::Error> {
        self.tx.commit()
    }
}
