//! A task's rows as JSON, out of and into SQLite, column by column
//! whatever the schema holds: `export` writes every column there is.

use anyhow::Result;
use rusqlite::types::{Value as Sql, ValueRef};
use rusqlite::{Connection, params_from_iter};
use serde_json::{Map, Number, Value};

use crate::journal::transfer::unknown_column;
use rusqlite::TransactionBehavior;

use super::SqliteJournal;
use super::rows::lease_of;
use crate::journal::sql;
use crate::journal::{TaskRows, Transfer};
use crate::lease::{self, Holder};

/// Every row `sql` (with the task id as `?1`) selects, as JSON objects.
pub(super) fn rows(conn: &Connection, sql: &str, task: &str) -> Result<Vec<Map<String, Value>>> {
    let mut statement = conn.prepare(sql)?;
    let names: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let mut rows = statement.query([task])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut object = Map::new();
        for (index, name) in names.iter().enumerate() {
            let value = match row.get_ref(index)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(number) => Value::from(number),
                ValueRef::Real(number) => {
                    Number::from_f64(number).map_or(Value::Null, Value::Number)
                }
                ValueRef::Text(text) => Value::String(String::from_utf8_lossy(text).into_owned()),
                ValueRef::Blob(_) => anyhow::bail!("the journal holds a blob in {name}"),
            };
            object.insert(name.clone(), value);
        }
        out.push(object);
    }
    Ok(out)
}

/// Inserts `rows` into `table`, taking only columns the table has.
/// `id` columns are left to the database (they order rows, nothing
/// refers to them).
pub(super) fn insert(conn: &Connection, table: &str, rows: &[Map<String, Value>]) -> Result<()> {
    let known: Vec<String> = conn
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for row in rows {
        let mut columns = Vec::new();
        let mut values = Vec::new();
        for (name, value) in row {
            if table != "tasks" && name == "id" {
                continue;
            }
            if !known.contains(name) {
                return Err(unknown_column(table, name).into());
            }
            columns.push(format!("\"{name}\""));
            values.push(match value {
                Value::Null => Sql::Null,
                Value::Bool(flag) => Sql::Integer(i64::from(*flag)),
                Value::Number(number) => match number.as_i64() {
                    Some(integer) => Sql::Integer(integer),
                    None => Sql::Real(number.as_f64().unwrap_or(0.0)),
                },
                Value::String(text) => Sql::Text(text.clone()),
                other => Sql::Text(other.to_string()),
            });
        }
        let marks = vec!["?"; columns.len()].join(", ");
        conn.prepare_cached(&format!(
            "INSERT INTO {table} ({}) VALUES ({marks})",
            columns.join(", ")
        ))?
        .execute(params_from_iter(values))?;
    }
    Ok(())
}

impl Transfer for SqliteJournal {
    fn export(&mut self, task: &str) -> Result<Option<TaskRows>> {
        // One read transaction: one snapshot, even of a task a runner is
        // writing.
        let tx = self.conn.transaction()?;
        let select = |sql: &str| rows(&tx, sql, task);
        let Some(task_row) = select("SELECT * FROM tasks WHERE id = ?1")?.pop() else {
            return Ok(None);
        };
        let mut rows = TaskRows {
            task: task_row,
            runs: select("SELECT * FROM runs WHERE task_id = ?1 ORDER BY run")?,
            steps: select("SELECT * FROM steps WHERE task_id = ?1 ORDER BY id")?,
            signals: select("SELECT * FROM signals WHERE task_id = ?1 ORDER BY id")?,
            resolutions: select("SELECT * FROM resolutions WHERE task_id = ?1 ORDER BY id")?,
        };
        crate::journal::chats::expand_rows(&mut rows.steps, &mut |hash| {
            use rusqlite::OptionalExtension as _;
            Ok(tx
                .query_row(
                    "SELECT parent, message FROM chat_nodes WHERE hash = ?1",
                    [hash],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?)
        })?;
        tx.commit()?;
        Ok(Some(rows))
    }

    fn import(&mut self, rows: &TaskRows, replace: bool, me: &Holder) -> Result<()> {
        let id = crate::journal::transfer::task_id(rows)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let exists: bool = tx.query_row(sql::TASK_EXISTS.sqlite(), [&id], |row| row.get(0))?;
        if exists {
            if !replace {
                return Err(crate::journal::transfer::exists(&id).into());
            }
            if let Some(lease) = lease_of(&tx, &id)?
                && lease::is_live(&lease, me, crate::journal::now_ms(), self.stale)
            {
                return Err(crate::journal::locked(&id, &lease).into());
            }
            tx.execute(sql::DELETE_TASK.sqlite(), [&id])?;
        }
        insert(&tx, "tasks", std::slice::from_ref(&rows.task))?;
        insert(&tx, "runs", &rows.runs)?;
        // Conversations are kept once here too (SPEC 21).
        let steps = crate::journal::chats::compact_rows(
            &rows.steps,
            &mut |hash| {
                Ok(tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM chat_nodes WHERE hash = ?1)",
                    [hash],
                    |row| row.get(0),
                )?)
            },
            &mut |hash, parent, message| {
                tx.execute(
                    "INSERT INTO chat_nodes (hash, parent, message) VALUES (?1, ?2, ?3) ON CONFLICT (hash) DO NOTHING",
                    rusqlite::params![hash, parent, message],
                )?;
                Ok(())
            },
        )?;
        insert(&tx, "steps", &steps)?;
        insert(&tx, "signals", &rows.signals)?;
        insert(&tx, "resolutions", &rows.resolutions)?;
        tx.commit()?;
        self.check_identity()
    }
}
