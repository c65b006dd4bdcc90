//! Everything durun reads from its environment, read once.
//!
//! `lib::run` builds [`Settings`] from the global arguments and the
//! environment before any command runs and hands it down: nothing deeper
//! reads a variable (ripgrep's low/high arguments are the model). A value
//! only some commands use is checked when it is used, so `DURUN_SYNC=bogus`
//! fails `run`, not `inspect`.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Result;

use crate::config::SyncMode;
use crate::error::Failure;
use crate::lease::Holder;

/// How often a runner renews its heartbeat, unless `DURUN_HEARTBEAT_MS`.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// How old another host's heartbeat may be before its lease is taken,
/// unless `DURUN_LEASE_STALE_MS`.
const STALE_AFTER: Duration = Duration::from_secs(60);
/// How long a write waits for another process's lock on an SQLite journal,
/// unless `DURUN_BUSY_TIMEOUT_MS`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A lease's timing (SPEC 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseTimes {
    /// How often a runner renews its heartbeat: at most a quarter of
    /// `stale`, so that several fit in the time a run may go without one.
    pub(crate) heartbeat: Duration,
    /// How old another host's heartbeat may be before its task is taken
    /// over; a runner that could not renew for half of it stops itself.
    pub(crate) stale: Duration,
}

impl Default for LeaseTimes {
    fn default() -> Self {
        Self {
            heartbeat: HEARTBEAT_EVERY,
            stale: STALE_AFTER,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// `--journal` or `DURUN_JOURNAL`.
    journal: Option<String>,
    state_home: Option<PathBuf>,
    home: Option<PathBuf>,
    pub(crate) quiet: bool,
    /// `DURUN_SYNC`, checked when a task is created.
    sync: Option<String>,
    pub(crate) lease: LeaseTimes,
    /// `DURUN_HOST_ID`, the host name a lease records if set.
    host_id: Option<String>,
    /// This runner as it would hold a lease: made when first asked for
    /// (the host name and this process's start time are two file reads
    /// that `durun step`, which takes no lease, need not pay).
    holder: std::sync::OnceLock<Holder>,
    pub(crate) busy_timeout: Duration,
    /// `DURUN_TEST_NOW`: the time `inspect` measures ages from and waits
    /// and sleeps take as now, for tests: a test can pretend a sleep's
    /// time has come without sleeping.
    fixed_now: Option<SystemTime>,
    /// `USER` (or `LOGNAME`): who the operator is, for the record.
    user: Option<String>,
    /// `NO_COLOR` set and not empty.
    pub(crate) no_color: bool,
    /// `COLUMNS`: the width of tables when stdout is not a terminal.
    pub(crate) columns: Option<usize>,
    /// `XDG_RUNTIME_DIR`: where a run's socket directory goes.
    pub(crate) runtime_dir: Option<PathBuf>,
    /// `DURUN_SOCKET`: the running durun, for `durun step` and `durun call`.
    pub(crate) socket: Option<PathBuf>,
    /// `DURUN_CONFIG`: the tools file of `durun call` outside a run (`run`
    /// reads it through clap, as `--config`).
    pub(crate) config: Option<PathBuf>,
}

impl Settings {
    /// These settings with `-q`.
    pub(crate) fn quieted(&self) -> Self {
        Self {
            quiet: true,
            ..self.clone()
        }
    }

    /// The settings of a command: `--journal` (clap has already read
    /// `DURUN_JOURNAL` into it) and `--quiet`, and the environment.
    pub(crate) fn resolve(journal: Option<String>, quiet: bool) -> Self {
        Self {
            quiet,
            ..Self::from_env(journal)
        }
    }

    /// The settings a process without a command line sees (a completion
    /// request): the environment alone.
    pub(crate) fn from_env(journal: Option<String>) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let millis = |name: &str| var(name)?.parse().ok().map(Duration::from_millis);
        let stale = millis("DURUN_LEASE_STALE_MS").unwrap_or(STALE_AFTER);
        let heartbeat = millis("DURUN_HEARTBEAT_MS")
            .unwrap_or(HEARTBEAT_EVERY)
            .min(stale / 4);
        Self {
            journal: journal.filter(|journal| !journal.is_empty()),
            state_home: var("XDG_STATE_HOME")
                .map(PathBuf::from)
                .filter(|dir| dir.is_absolute()),
            home: var("HOME").map(PathBuf::from),
            quiet: false,
            sync: var("DURUN_SYNC"),
            lease: LeaseTimes { heartbeat, stale },
            host_id: var("DURUN_HOST_ID"),
            holder: std::sync::OnceLock::new(),
            busy_timeout: millis("DURUN_BUSY_TIMEOUT_MS").unwrap_or(BUSY_TIMEOUT),
            fixed_now: var("DURUN_TEST_NOW").and_then(|text| humantime::parse_rfc3339(&text).ok()),
            user: var("USER").or_else(|| var("LOGNAME")),
            no_color: var("NO_COLOR").is_some(),
            columns: var("COLUMNS").and_then(|text| text.parse().ok()),
            runtime_dir: var("XDG_RUNTIME_DIR").map(PathBuf::from),
            socket: var("DURUN_SOCKET").map(PathBuf::from),
            config: var("DURUN_CONFIG").map(PathBuf::from),
        }
    }

    /// `XDG_STATE_HOME`, else `~/.local/state`: where per-user state (the
    /// default journal) goes.
    pub(crate) fn state_home(&self) -> Option<PathBuf> {
        self.state_home
            .clone()
            .or_else(|| self.home.as_ref().map(|home| home.join(".local/state")))
    }

    /// `DURUN_SYNC`, which wins over `[journal] sync` in the config.
    pub(crate) fn sync(&self) -> Result<Option<SyncMode>> {
        match &self.sync {
            None => Ok(None),
            Some(text) => SyncMode::parse(text).map(Some).ok_or_else(|| {
                Failure::config(format!("DURUN_SYNC={text:?} is not a sync mode"))
                    .hint("use DURUN_SYNC=full or DURUN_SYNC=normal")
                    .into()
            }),
        }
    }

    /// `--journal` or `DURUN_JOURNAL` as given, for a child durun.
    pub(crate) fn journal_arg(&self) -> Option<&str> {
        self.journal.as_deref()
    }

    /// This runner as it would hold a lease (`DURUN_HOST_ID` or the host
    /// name, this process).
    pub(crate) fn holder(&self) -> &Holder {
        self.holder
            .get_or_init(|| Holder::current(self.host_id.clone()))
    }

    /// The operator as the journal records who did something: `user@host`.
    pub(crate) fn operator(&self) -> String {
        format!(
            "{}@{}",
            self.user.as_deref().unwrap_or("unknown"),
            self.holder().host
        )
    }

    /// Now, as `inspect` measures ages and waits and sleeps see it.
    pub(crate) fn now(&self) -> SystemTime {
        self.fixed_now.unwrap_or_else(SystemTime::now)
    }

    /// The time `DURUN_TEST_NOW` fixes, if set.
    pub(crate) fn fixed_now(&self) -> Option<SystemTime> {
        self.fixed_now
    }
}
