//! Connecting to the server, naming it in messages without the password,
//! and migrating the schema.

use super::cached::Queries as _;
use std::time::Duration;

use anyhow::{Context as _, Result};
use postgres::{Client, NoTls};

use super::PostgresJournal;
use crate::error::Failure;
use crate::journal::schema::{POSTGRES_VERSION, postgres_from};
use crate::settings::Settings;

/// What the server said, for messages: `postgres::Error` prints only its
/// kind ("db error"), the reason is in its source.
pub(crate) fn reason(err: &postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => crate::error::with_causes(err),
    }
}

/// How a PostgreSQL URL is named in messages: host, port and database,
/// never the user or password.
pub(crate) fn describe(url: &str) -> String {
    match url.parse::<postgres::Config>() {
        Ok(config) => {
            let host = match config.get_hosts().first() {
                Some(postgres::config::Host::Tcp(host)) => host.clone(),
                #[cfg(unix)]
                Some(postgres::config::Host::Unix(path)) => path.display().to_string(),
                None => "localhost".to_owned(),
            };
            let port = config.get_ports().first().copied().unwrap_or(5432);
            format!(
                "the PostgreSQL journal at {host}:{port}/{}",
                config.get_dbname().unwrap_or("postgres")
            )
        }
        Err(_) => "the PostgreSQL journal".to_owned(),
    }
}

/// A session on the server, set up as every session of durun's is.
pub(super) fn connect(
    config: &postgres::Config,
    stale: Duration,
) -> Result<Client, postgres::Error> {
    let mut client = config.connect(NoTls)?;
    // A runner paused inside a transaction (SIGSTOP, a frozen VM) would
    // hold its row locks and block every takeover until it came back: the
    // server ends such a session after half the stale time, before anyone
    // may take the task over. durun's own transactions never wait on the
    // client that long.
    let idle = (stale / 2).max(Duration::from_secs(1));
    // Each statement is prepared once per session and planned once: the
    // server would otherwise plan most of them again at every execution
    // (a custom plan), which cost a worker's tasks more server time than
    // running them. durun's statements look rows up by key, which a
    // generic plan does as well. (Set only where the server has it:
    // PostgreSQL 12 and later.)
    client.batch_execute(&format!(
        "SET idle_in_transaction_session_timeout = {};
         SELECT set_config(name, 'force_generic_plan', false) FROM pg_settings
         WHERE name = 'plan_cache_mode'",
        idle.as_millis()
    ))?;
    Ok(client)
}

impl PostgresJournal {
    pub(crate) fn open(url: &str, write: bool, settings: &Settings) -> Result<Self> {
        let config: postgres::Config = url.parse().map_err(|err| {
            Failure::config(format!("the journal URL is not a PostgreSQL URL: {err}"))
                .hint("postgres://USER@HOST:PORT/DATABASE, e.g. postgres://postgres@127.0.0.1/test")
        })?;
        let client = connect(&config, settings.lease.stale).map_err(|err| {
            Failure::journal(format!("cannot reach {}: {}", describe(url), reason(&err)))
                .hint("check that the server runs and accepts this user, or choose another journal with --journal")
        })?;
        let mut journal = Self {
            client: super::cached::Conn::new(client, false),
            config,
            listening: false,
            synced_session: false,
            stale: settings.lease.stale,
            channel: None,
            missed: false,
            quiet: settings.quiet,
            name: describe(url),
        };
        journal.migrate(write)?;
        Ok(journal)
    }

    fn migrate(&mut self, write: bool) -> Result<()> {
        let mut tx = self.client.transaction();
        // One migrating durun at a time, whatever the schema holds.
        tx.execute("SELECT pg_advisory_xact_lock(7238312)", &[])?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS durun_schema (version INTEGER NOT NULL)")?;
        let version: Option<i32> = tx
            .query_opt("SELECT max(version) FROM durun_schema", &[])?
            .and_then(|row| row.get(0));
        let version = version.unwrap_or(0);
        let known = POSTGRES_VERSION as i32;
        if version > known {
            if write {
                return Err(Failure::journal(format!(
                    "the PostgreSQL journal was written by a newer durun (format {version}; this durun knows up to {known})"
                ))
                .hint("upgrade durun to use this journal")
                .into());
            }
        } else if version < known {
            for (format, sql) in postgres_from(version as usize) {
                tx.batch_execute(&sql)
                    .with_context(|| format!("failed to migrate the journal to format {format}"))?;
            }
            tx.execute("DELETE FROM durun_schema", &[])?;
            tx.execute("INSERT INTO durun_schema (version) VALUES ($1)", &[&known])?;
        }
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Every session durun opens plans each statement once, and ends a
    /// transaction left idle for half the stale time.
    #[test]
    fn a_session_plans_once_and_ends_an_idle_transaction() {
        let Some(url) = super::super::cached::tests::test_url() else {
            return;
        };
        let config: postgres::Config = url.parse().expect("a URL");
        let mut client = super::connect(&config, Duration::from_secs(30)).expect("connect");
        let mut show = |name: &str| -> String {
            client
                .query_one(&format!("SHOW {name}"), &[])
                .expect("show")
                .get(0)
        };
        assert_eq!(show("plan_cache_mode"), "force_generic_plan");
        assert_eq!(show("idle_in_transaction_session_timeout"), "15s");
    }
}
