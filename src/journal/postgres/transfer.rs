//! A task's rows out of and into the journal (SPEC 10), whole or not at all.

use super::cached::Queries as _;
use anyhow::Result;
use serde_json::Value;

use super::PostgresJournal;
use super::rows::lease_of;
use crate::journal::sql;
use crate::journal::{TaskRows, Transfer};
use crate::lease::{self, Holder};

impl Transfer for PostgresJournal {
    fn export(&mut self, task: &str) -> Result<Option<TaskRows>> {
        // One snapshot, even of a task a runner is writing.
        let mut tx = self
            .client
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        let mut rows = TaskRows::default();
        for table in crate::journal::TABLES {
            let (key, order) = match *table {
                "tasks" => ("id", "id"),
                "runs" => ("task_id", "run"),
                _ => ("task_id", "id"),
            };
            let found = tx.query(
                &format!("SELECT row_to_json(r)::text FROM {table} r WHERE r.{key} = $1 ORDER BY r.{order}"),
                &[&task],
            )?;
            let mut objects = Vec::with_capacity(found.len());
            for row in &found {
                let text: String = row.get(0);
                match serde_json::from_str(&text)? {
                    Value::Object(object) => objects.push(object),
                    _ => anyhow::bail!("row_to_json gave no object"),
                }
            }
            match *table {
                "tasks" => match objects.pop() {
                    Some(task) => rows.task = task,
                    None => return Ok(None),
                },
                "runs" => rows.runs = objects,
                "steps" => rows.steps = objects,
                "signals" => rows.signals = objects,
                _ => rows.resolutions = objects,
            }
        }
        crate::journal::chats::expand_rows(&mut rows.steps, &mut |hash| {
            let found = tx.query_opt(
                "SELECT parent, message FROM chat_nodes WHERE hash = $1",
                &[&hash],
            )?;
            Ok(found.map(|row| (row.get(0), row.get(1))))
        })?;
        tx.commit()?;
        Ok(Some(rows))
    }

    fn import(&mut self, rows: &TaskRows, replace: bool, me: &Holder) -> Result<()> {
        let id = crate::journal::task_id(rows)?;
        let mut tx = self.client.transaction();
        let (lease, server_now) = lease_of(&mut tx, &id)?;
        let exists = tx
            .query_one(sql::TASK_EXISTS.postgres(), &[&id])?
            .get::<_, bool>(0);
        if exists {
            if !replace {
                return Err(crate::journal::transfer::exists(&id).into());
            }
            if let Some(lease) = lease
                && lease::is_live(&lease, me, server_now, self.stale)
            {
                return Err(crate::journal::locked(&id, &lease).into());
            }
            tx.execute(sql::DELETE_TASK.postgres(), &[&id])?;
        }
        // Conversations are kept once here too (SPEC 21).
        let steps = {
            let tx = std::cell::RefCell::new(&mut tx);
            crate::journal::chats::compact_rows(
                &rows.steps,
                &mut |hash| {
                    Ok(tx
                        .borrow_mut()
                        .query_one(
                            "SELECT EXISTS (SELECT 1 FROM chat_nodes WHERE hash = $1)",
                            &[&hash],
                        )?
                        .get(0))
                },
                &mut |hash, parent, message| {
                    tx.borrow_mut().execute(
                        "INSERT INTO chat_nodes (hash, parent, message) VALUES ($1, $2, $3) ON CONFLICT (hash) DO NOTHING",
                        &[&hash, &parent, &message],
                    )?;
                    Ok(())
                },
            )?
        };
        for (table, objects) in [
            ("tasks", std::slice::from_ref(&rows.task)),
            ("runs", rows.runs.as_slice()),
            ("steps", steps.as_slice()),
            ("signals", rows.signals.as_slice()),
            ("resolutions", rows.resolutions.as_slice()),
        ] {
            let known: Vec<String> = tx
                .query(
                    "SELECT column_name::text FROM information_schema.columns
                     WHERE table_name = $1 AND table_schema = current_schema()",
                    &[&table],
                )?
                .iter()
                .map(|row| row.get(0))
                .collect();
            for object in objects {
                let mut columns = Vec::new();
                for name in object.keys() {
                    if table != "tasks" && name == "id" {
                        continue;
                    }
                    if !known.contains(name) {
                        return Err(crate::journal::transfer::unknown_column(table, name).into());
                    }
                    columns.push(format!("\"{name}\""));
                }
                let columns = columns.join(", ");
                // The server turns each JSON value into its column's type.
                tx.execute(
                    &format!(
                        "INSERT INTO {table} ({columns})
                         SELECT {columns} FROM json_populate_record(NULL::{table}, $1::text::json)"
                    ),
                    &[&Value::Object(object.clone()).to_string()],
                )?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}
