//! A task's lease as PostgreSQL reads it: locked, with the server's clock.

use super::cached::Queries;
use anyhow::Result;

use crate::journal::sql::NOW_MS;
use crate::journal::tx::lease_at;
use crate::lease::Lease;

/// The task's lease, locked until the transaction ends, and the server's
/// clock.
pub(super) fn lease_of(tx: &mut impl Queries, task: &str) -> Result<(Option<Lease>, i64)> {
    let row = tx.query_opt(
        &format!(
            "SELECT lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run, {NOW_MS}
                  FROM tasks WHERE id = $1 FOR UPDATE"
        ),
        &[&task],
    )?;
    Ok(match row {
        Some(row) => (lease_at(&row, 0)?, row.get(5)),
        None => (None, 0),
    })
}
