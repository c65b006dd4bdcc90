//! The embedded journal: one `SQLite` file in WAL mode.
//!
//! `synchronous=FULL` by default: a commit is fsync'd before durun acts on
//! it, so a step that took effect is never forgotten, even on power loss.
//! Migrations are an append-only list tracked by `PRAGMA user_version`; a
//! journal from a newer durun is refused rather than written.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use rusqlite::{Connection, OpenFlags, OptionalExtension as _, Row, TransactionBehavior, params};
use serde_json::Value;

use super::{
    Access, Journal, NewTask, Resolution, RunEnd, RunRecord, RunStart, RunStats, Standing,
    StepError, StepKind, StepRecord, StepStatus, StepWrite, TaskRecord, TaskStatus,
};
use crate::config::SyncMode;
use crate::error::Failure;
use crate::json_text::JsonText;
use crate::lease::{self, Holder, Lease};
use crate::protocol::Effect;

/// How long a write waits for another process's transaction, unless
/// `DURUN_BUSY_TIMEOUT_MS` says otherwise.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

fn busy_timeout() -> Duration {
    std::env::var("DURUN_BUSY_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(BUSY_TIMEOUT, Duration::from_millis)
}

/// Never edit a migration that has shipped: append a new one.
const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE tasks (
    id              TEXT PRIMARY KEY NOT NULL,
    status          TEXT NOT NULL,
    argv            TEXT NOT NULL,
    cwd             TEXT NOT NULL,
    config          TEXT,
    config_path     TEXT,
    sync_mode       TEXT NOT NULL,
    exit_code       INTEGER,
    output          TEXT,
    runs            INTEGER NOT NULL DEFAULT 0,
    lease_host      TEXT,
    lease_pid       INTEGER,
    lease_pid_start INTEGER,
    lease_heartbeat INTEGER,
    lease_run       INTEGER,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE INDEX tasks_by_created_at ON tasks (created_at);

CREATE TABLE runs (
    task_id        TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run            INTEGER NOT NULL,
    host           TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    started_at     TEXT NOT NULL,
    finished_at    TEXT,
    exit_code      INTEGER,
    replayed_steps INTEGER NOT NULL DEFAULT 0,
    executed_steps INTEGER NOT NULL DEFAULT 0,
    tokens_spent   INTEGER NOT NULL DEFAULT 0,
    tokens_saved   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id, run)
);

CREATE TABLE steps (
    id              INTEGER PRIMARY KEY,
    task_id         TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_index      INTEGER NOT NULL,
    tool_name       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    effect          TEXT NOT NULL,
    args            TEXT NOT NULL,
    args_hash       TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL,
    output          TEXT,
    error_code      TEXT,
    error           TEXT,
    usage           TEXT,
    tokens          INTEGER NOT NULL DEFAULT 0,
    run             INTEGER NOT NULL,
    created_at      TEXT NOT NULL,
    started_at      TEXT NOT NULL,
    finished_at     TEXT
);
-- Discarded steps stay for the audit trail; one live row per step number.
CREATE UNIQUE INDEX steps_live ON steps (task_id, step_index) WHERE status <> 'discarded';
",
    r"
ALTER TABLE tasks ADD COLUMN cancel_requested_at TEXT;
ALTER TABLE steps ADD COLUMN resolution TEXT;
-- Finds a task's discarded steps; live rows are not in it, so it costs
-- nothing on the per-step write path.
CREATE INDEX steps_discarded ON steps (task_id) WHERE status = 'discarded';
-- Every hand-made decision about a step (`durun resolve`), for the audit trail.
CREATE TABLE resolutions (
    id          INTEGER PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    step_index  INTEGER NOT NULL,
    action      TEXT NOT NULL,
    value       TEXT,
    resolved_by TEXT NOT NULL,
    resolved_at TEXT NOT NULL
);
",
    r"
-- For a failed step, the first step number the agent could open knowing
-- of the failure: it replays only if the journal holds a step from there.
ALTER TABLE steps ADD COLUMN seen_from INTEGER;
",
];

/// `PRAGMA application_id` of a durun journal ("durn"): a file with other
/// tables and another id belongs to another program and is left alone.
const APPLICATION_ID: i32 = 0x6475_726e;

pub struct SqliteJournal {
    conn: Connection,
    path: PathBuf,
    /// The journal file's device and inode when it was opened for writing:
    /// a run stops rather than acknowledge steps into a file that was
    /// deleted or replaced under it.
    identity: Option<(u64, u64)>,
    /// `PRAGMA data_version` at the last [`Journal::watch`]: it changes
    /// only when another connection commits.
    data_version: i64,
    /// The sync mode steps are committed with.
    sync: SyncMode,
}

/// What a file is, before durun writes a byte to it.
enum Owner {
    /// An empty file, or none yet.
    Nobody,
    /// A durun journal.
    Durun,
}

impl SqliteJournal {
    pub fn open(path: &Path, access: Access) -> Result<Self> {
        let exists = regular_file(path)?;
        let conn = match access {
            Access::Write => {
                if on_read_only_mount(path) {
                    return Err(Failure::journal(format!(
                        "the journal at {} is on a read-only file system",
                        path.display()
                    ))
                    .hint("remount it read-write, or choose another journal with --journal or DURUN_JOURNAL")
                    .into());
                }
                create_private(path)?;
                Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            }
            Access::Read => {
                if !exists {
                    return Err(Failure::config(format!("no journal at {}", path.display()))
                        .hint("nothing has run with this journal yet; check --journal or DURUN_JOURNAL")
                        .into());
                }
                // On read-only media SQLite cannot make the WAL index; a
                // journal there cannot change under us, so read it as
                // immutable.
                let read_only_media = on_read_only_mount(path);
                let uri = format!("file:{}?immutable={}", uri_path(path), u8::from(read_only_media));
                Connection::open_with_flags(
                    uri,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
                )
            }
        }
        .with_context(|| format!("failed to open journal at {}", path.display()))?;
        let mut journal = Self {
            conn,
            path: path.to_owned(),
            identity: None,
            data_version: -1,
            sync: SyncMode::Full,
        };
        journal.prepare(access).map_err(|err| {
            // A refusal that says what is wrong leads; SQLite's own errors
            // get the place.
            if crate::error::failure_of(&err).is_some() {
                err
            } else {
                err.context(format!("failed to open journal at {}", path.display()))
            }
        })?;
        if access == Access::Write {
            journal.identity = Some(file_identity(path).map_err(|err| {
                Failure::journal(format!(
                    "cannot read the journal at {}: {err}",
                    path.display()
                ))
            })?);
        }
        Ok(journal)
    }

    /// Fails if the journal file is no longer the one this process opened
    /// (deleted, or replaced by another file).
    fn check_identity(&self) -> Result<()> {
        let Some(opened) = self.identity else {
            return Ok(());
        };
        if file_identity(&self.path).ok() == Some(opened) {
            return Ok(());
        }
        Err(Failure::journal(format!(
            "the journal file {} was deleted or replaced while this run was writing it",
            self.path.display()
        ))
        .hint("this run stopped rather than record steps in a file nobody reads; restore the file, or start the agent again")
        .into())
    }

    /// Whose database this is, read without writing: a file of another
    /// program is refused before durun changes a byte of it.
    fn owner(&self) -> Result<Owner> {
        let id: i32 = self
            .conn
            .pragma_query_value(None, "application_id", |row| row.get(0))?;
        if id == APPLICATION_ID {
            return Ok(Owner::Durun);
        }
        let tables: Vec<String> = {
            let mut statement = self
                .conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
            let names = statement.query_map([], |row| row.get(0))?;
            names.collect::<rusqlite::Result<_>>()?
        };
        let has = |name: &str| tables.iter().any(|table| table == name);
        if id == 0 && tables.is_empty() {
            return Ok(Owner::Nobody);
        }
        // A journal from before durun marked its files.
        if id == 0 && has("tasks") && has("runs") && has("steps") {
            return Ok(Owner::Durun);
        }
        Err(Failure::journal(format!(
            "{} is another program's SQLite database, not a durun journal",
            self.path.display()
        ))
        .hint("durun left it untouched; pass a durun journal or a new file with --journal or DURUN_JOURNAL")
        .into())
    }

    #[cfg(test)]
    pub fn in_memory() -> Self {
        let mut journal = Self {
            conn: Connection::open_in_memory().expect("in-memory SQLite"),
            path: PathBuf::from(":memory:"),
            identity: None,
            data_version: -1,
            sync: SyncMode::Full,
        };
        journal.prepare(Access::Write).expect("fresh schema");
        journal
    }

    fn prepare(&mut self, access: Access) -> Result<()> {
        self.conn.busy_timeout(busy_timeout())?;
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        self.owner()?;
        let version: i64 = self
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            let message = format!(
                "journal {} was written by a newer durun (format {version}; this durun knows up to {known})",
                self.path.display()
            );
            if access == Access::Write {
                return Err(Failure::journal(message)
                    .hint("upgrade durun to use this journal")
                    .into());
            }
        }
        if access == Access::Write {
            let mode: String =
                self.conn
                    .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") && self.path != Path::new(":memory:") {
                anyhow::bail!("SQLite refused WAL mode (journal_mode is {mode})");
            }
            self.set_sync(SyncMode::Full)?;
            self.migrate(version)?;
        }
        Ok(())
    }

    fn migrate(&mut self, version: i64) -> Result<()> {
        let marked = self
            .conn
            .pragma_query_value(None, "application_id", |row| row.get::<_, i32>(0))?
            == APPLICATION_ID;
        if version >= MIGRATIONS.len() as i64 && marked {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Exclusive)?;
        // Another process may have migrated between our check and the lock.
        let version: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
        for (index, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(sql).with_context(|| {
                format!("failed to migrate the journal to format {}", index + 1)
            })?;
        }
        tx.pragma_update(None, "user_version", MIGRATIONS.len() as i64)?;
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
        tx.commit()?;
        Ok(())
    }
}

/// Whether the file system that holds (or would hold) `path` is mounted
/// read-only.
fn on_read_only_mount(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let existing = path
        .ancestors()
        .find(|ancestor| !ancestor.as_os_str().is_empty() && ancestor.exists())
        .unwrap_or(Path::new("."));
    let Ok(c_path) = std::ffi::CString::new(existing.as_os_str().as_bytes()) else {
        return false;
    };
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a valid C string and `stat` is writable memory of
    // the right size; statvfs initializes it when it returns 0.
    let ok = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) } == 0;
    // SAFETY: initialized by the successful call above.
    ok && unsafe { stat.assume_init() }.f_flag & libc::ST_RDONLY != 0
}

/// Refuses a journal path that is not a regular file (a directory, a FIFO
/// that would block, a device) and says whether the file exists. A path
/// that cannot be looked at (a directory without permission) is a journal
/// error, whoever owns it.
pub(crate) fn regular_file(path: &Path) -> Result<bool> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(true),
        Ok(meta) => {
            let kind = meta.file_type();
            let what = if kind.is_dir() {
                "a directory"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_char_device() || kind.is_block_device() {
                "a device"
            } else {
                "not a regular file"
            };
            Err(Failure::journal(format!(
                "the journal path {} is {what}, not a journal file",
                path.display()
            ))
            .hint("pass the path of a journal file (or a new one) with --journal or DURUN_JOURNAL")
            .into())
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(cannot_use(path, &err)),
    }
}

/// The journal error for a path the file system refuses.
fn cannot_use(path: &Path, err: &std::io::Error) -> anyhow::Error {
    Failure::journal(format!("cannot use the journal at {}: {err}", path.display()))
        .hint("check that you may read and write the file and its directory, or choose another journal with --journal or DURUN_JOURNAL")
        .into()
}

/// The device and inode of the file at `path`.
fn file_identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map(|meta| (meta.dev(), meta.ino()))
}

/// `path` for an SQLite `file:` URI: `?` and `#` would start the query.
fn uri_path(path: &Path) -> String {
    path.to_string_lossy()
        .replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23")
}

/// Creates the journal's directory (0700) and file (0600) if missing:
/// outputs can hold secrets.
fn create_private(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        match std::fs::metadata(dir) {
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|err| cannot_use(path, &err))?;
            }
            Err(err) => return Err(cannot_use(path, &err)),
        }
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|err| cannot_use(path, &err))?;
    Ok(())
}

fn json_text(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value always serializes")
}

fn parse_json(text: Option<String>) -> Result<Option<Value>> {
    text.map(|text| serde_json::from_str(&text).context("the journal holds malformed JSON"))
        .transpose()
}

/// A nullable JSON column as text, checked but not parsed into a tree.
/// A nullable JSON column, read in place (no `String` in between).
fn json_column(row: &Row<'_>, index: usize) -> Result<Option<JsonText>> {
    row.get_ref(index)?
        .as_str_or_null()?
        .map(|text| JsonText::from_text(text).context("the journal holds malformed JSON"))
        .transpose()
}

fn bad_column(column: &str, value: &str) -> anyhow::Error {
    Failure::journal(format!("the journal holds an unknown {column} {value:?}")).into()
}

const TASK_COLUMNS: &str = "t.id, t.status, t.argv, t.cwd, t.config, t.config_path, t.sync_mode, t.exit_code,
    t.output, t.runs, t.lease_host, t.lease_pid, t.lease_pid_start, t.lease_heartbeat, t.lease_run,
    t.created_at,
    max(t.updated_at, coalesce((SELECT coalesce(s.finished_at, s.started_at) FROM steps s
        WHERE s.task_id = t.id AND s.status <> 'discarded' ORDER BY s.step_index DESC LIMIT 1), '')),
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status <> 'discarded'),
    (SELECT coalesce(sum(r.tokens_spent), 0) FROM runs r WHERE r.task_id = t.id),
    (SELECT coalesce(sum(r.tokens_saved), 0) FROM runs r WHERE r.task_id = t.id)";

fn task_from_row(row: &Row<'_>) -> Result<TaskRecord> {
    let status: String = row.get(1)?;
    let argv: String = row.get(2)?;
    let sync: String = row.get(6)?;
    let lease = lease_from(row, 10)?;
    Ok(TaskRecord {
        id: row.get(0)?,
        status: TaskStatus::parse(&status).ok_or_else(|| bad_column("task status", &status))?,
        argv: serde_json::from_str(&argv).context("the journal holds a malformed argv")?,
        cwd: row.get(3)?,
        config: row.get(4)?,
        config_path: row.get(5)?,
        sync: SyncMode::parse(&sync).ok_or_else(|| bad_column("sync mode", &sync))?,
        exit_code: row.get(7)?,
        output: parse_json(row.get(8)?)?,
        runs: row.get(9)?,
        lease,
        created_at: row.get(15)?,
        updated_at: row.get(16)?,
        steps: row.get::<_, i64>(17)? as u64,
        tokens_spent: row.get::<_, i64>(18)? as u64,
        tokens_saved: row.get::<_, i64>(19)? as u64,
    })
}

fn step_from_row(row: &Row<'_>) -> Result<StepRecord> {
    let kind: String = row.get(2)?;
    let effect: String = row.get(3)?;
    let status: String = row.get(7)?;
    let error = match (
        row.get::<_, Option<String>>(10)?,
        row.get::<_, Option<String>>(11)?,
    ) {
        (code, Some(message)) => Some(StepError {
            code: code.unwrap_or_else(|| "tool_failed".to_owned()),
            message,
        }),
        _ => None,
    };
    Ok(StepRecord {
        step: row.get::<_, i64>(0)? as u64,
        name: row.get(1)?,
        kind: StepKind::parse(&kind).ok_or_else(|| bad_column("step kind", &kind))?,
        effect: Effect::parse(&effect).ok_or_else(|| bad_column("effect", &effect))?,
        args: JsonText::from_text(row.get_ref(4)?.as_str()?)
            .context("the journal holds malformed args")?,
        args_hash: row.get(5)?,
        idempotency_key: row.get(6)?,
        status: StepStatus::parse(&status).ok_or_else(|| bad_column("step status", &status))?,
        attempts: row.get(8)?,
        output: json_column(row, 9)?,
        error,
        usage: json_column(row, 12)?,
        tokens: row.get::<_, i64>(13)? as u64,
        run: row.get(14)?,
        created_at: row.get(15)?,
        started_at: row.get(16)?,
        finished_at: row.get(17)?,
        resolution: row.get(18)?,
        seen_from: row.get::<_, Option<i64>>(20)?.map(|step| step as u64),
    })
}

const STEP_COLUMNS: &str = "step_index, tool_name, kind, effect, args, args_hash, idempotency_key, status,
    attempts, output, error_code, error, usage, tokens, run, created_at, started_at, finished_at, resolution, id,
    seen_from";

impl Journal for SqliteJournal {
    fn set_sync(&mut self, sync: SyncMode) -> Result<()> {
        self.conn
            .pragma_update(None, "synchronous", sync.as_str().to_ascii_uppercase())?;
        self.sync = sync;
        Ok(())
    }

    fn create_task(&mut self, task: &NewTask) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO tasks (id, status, argv, cwd, config, config_path, sync_mode, created_at, updated_at)
                 VALUES (?1, 'running', ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
            )?
            .execute(params![
                task.id,
                serde_json::to_string(&task.argv)?,
                task.cwd,
                task.config,
                task.config_path,
                task.sync.as_str(),
                task.created_at,
            ])
            .with_context(|| format!("failed to create task {}", task.id))?;
        Ok(())
    }

    fn task(&mut self, id: &str) -> Result<Option<TaskRecord>> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks t WHERE t.id = ?1"
        ))?;
        let mut rows = statement.query([id])?;
        rows.next()?.map(task_from_row).transpose()
    }

    fn tasks(&mut self) -> Result<Vec<TaskRecord>> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks t ORDER BY t.created_at DESC, t.rowid DESC"
        ))?;
        let mut rows = statement.query([])?;
        let mut tasks = Vec::new();
        while let Some(row) = rows.next()? {
            tasks.push(task_from_row(row)?);
        }
        Ok(tasks)
    }

    fn runs(&mut self, task: &str) -> Result<Vec<RunRecord>> {
        let mut statement = self.conn.prepare_cached(
            "SELECT run, host, pid, started_at, finished_at, exit_code,
                    replayed_steps, executed_steps, tokens_spent, tokens_saved
             FROM runs WHERE task_id = ?1 ORDER BY run",
        )?;
        let runs = statement
            .query_map([task], |row| {
                Ok(RunRecord {
                    run: row.get(0)?,
                    host: row.get(1)?,
                    pid: row.get(2)?,
                    started_at: row.get(3)?,
                    finished_at: row.get(4)?,
                    exit_code: row.get(5)?,
                    stats: RunStats {
                        replayed_steps: row.get::<_, i64>(6)? as u64,
                        executed_steps: row.get::<_, i64>(7)? as u64,
                        tokens_spent: row.get::<_, i64>(8)? as u64,
                        tokens_saved: row.get::<_, i64>(9)? as u64,
                    },
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(runs)
    }

    fn visit_steps(
        &mut self,
        task: &str,
        discarded: bool,
        last: Option<usize>,
        visit: &mut dyn FnMut(StepRecord) -> Result<()>,
    ) -> Result<()> {
        // Separate statements, so that replay's uses the partial index.
        let live = format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ?1 AND status <> 'discarded'"
        );
        let all = format!(
            "{live} UNION ALL SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ?1 AND status = 'discarded'"
        );
        let body = if discarded { all } else { live };
        let sql = match last {
            // The last rows, still in order.
            Some(_) => format!(
                "SELECT * FROM ({body} ORDER BY step_index DESC, id DESC LIMIT ?2) ORDER BY step_index, id"
            ),
            None if discarded => format!("{body} ORDER BY step_index, id"),
            None => format!("{body} ORDER BY step_index"),
        };
        let mut statement = self.conn.prepare_cached(&sql)?;
        let mut rows = match last {
            Some(last) => statement.query(params![task, last as i64])?,
            None => statement.query([task])?,
        };
        while let Some(row) = rows.next()? {
            visit(step_from_row(row)?)?;
        }
        Ok(())
    }

    fn count_steps(&mut self, task: &str) -> Result<u64> {
        let count: i64 = self
            .conn
            .prepare_cached(
                "SELECT (SELECT count(*) FROM steps WHERE task_id = ?1 AND status <> 'discarded')
                      + (SELECT count(*) FROM steps WHERE task_id = ?1 AND status = 'discarded')",
            )?
            .query_row([task], |row| row.get(0))?;
        Ok(count as u64)
    }

    fn step_versions(&mut self, task: &str, step: u64) -> Result<Vec<StepRecord>> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ?1 AND step_index = ?2 AND status <> 'discarded'
             UNION ALL
             SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ?1 AND step_index = ?2 AND status = 'discarded'
             ORDER BY id"
        ))?;
        let mut rows = statement.query(params![task, step as i64])?;
        let mut steps = Vec::new();
        while let Some(row) = rows.next()? {
            steps.push(step_from_row(row)?);
        }
        Ok(steps)
    }

    fn start_run(&mut self, task: &str, me: &Holder, now: &str) -> Result<RunStart> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (runs, current, cancelled): (u32, Option<Lease>, bool) = tx.query_row(
            "SELECT runs, lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run,
                    cancel_requested_at IS NOT NULL OR status = 'cancelled'
             FROM tasks WHERE id = ?1",
            [task],
            |row| Ok((row.get(0)?, lease_from(row, 1)?, row.get(6)?)),
        )?;
        if cancelled {
            return Ok(RunStart::Cancelled);
        }
        let now_ms = super::now_ms();
        if let Some(lease) = current
            && lease::is_live(&lease, me, now_ms)
        {
            return Ok(RunStart::Locked(lease));
        }
        let run = runs + 1;
        let leased_at = crate::os::boot_clock();
        tx.execute(
            "UPDATE tasks SET status = 'running', runs = ?2, exit_code = NULL, lease_host = ?3, lease_pid = ?4,
                 lease_pid_start = ?5, lease_heartbeat = ?6, lease_run = ?2, updated_at = ?7
             WHERE id = ?1",
            params![task, run, me.host, me.pid, me.pid_start.map(|start| start as i64), now_ms, now],
        )?;
        tx.execute(
            "INSERT INTO runs (task_id, run, host, pid, started_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![task, run, me.host, me.pid, now],
        )?;
        tx.commit()?;
        Ok(RunStart::Started { run, leased_at })
    }

    fn heartbeat(&mut self, task: &str, run: u32) -> Result<Standing> {
        // A heartbeat need not survive a power cut, and an fsync on a busy
        // disk must not hold up the lease: it commits without one (the
        // next step's fsync takes it along).
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        let cancelled: rusqlite::Result<Option<bool>> = self
            .conn
            .prepare_cached(
                "UPDATE tasks SET lease_heartbeat = ?3 WHERE id = ?1 AND lease_run = ?2
                 RETURNING cancel_requested_at IS NOT NULL",
            )
            .and_then(|mut statement| {
                statement
                    .query_row(params![task, run, super::now_ms()], |row| row.get(0))
                    .optional()
            });
        self.conn
            .pragma_update(None, "synchronous", self.sync.as_str().to_ascii_uppercase())?;
        let cancelled = cancelled?;
        self.check_identity()?;
        Ok(match cancelled {
            None => Standing::Lost,
            Some(cancelled) => super::standing_of(Some(run), cancelled, run),
        })
    }

    fn watch(&mut self, task: &str, run: u32) -> Result<Standing> {
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |row| row.get(0))?;
        if version == self.data_version {
            return Ok(Standing::Held);
        }
        self.data_version = version;
        let (lease_run, cancelled) = standing_columns(&self.conn, task)?;
        Ok(super::standing_of(lease_run, cancelled, run))
    }

    fn steps_page(&mut self, task: &str, after: u64, limit: usize) -> Result<Vec<StepRecord>> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {STEP_COLUMNS} FROM steps
             WHERE task_id = ?1 AND status <> 'discarded' AND step_index > ?2
             ORDER BY step_index LIMIT ?3"
        ))?;
        let mut rows = statement.query(params![task, after as i64, limit as i64])?;
        let mut steps = Vec::with_capacity(limit.min(4096));
        while let Some(row) = rows.next()? {
            steps.push(step_from_row(row)?);
        }
        Ok(steps)
    }

    fn replay_bounds(&mut self, task: &str) -> Result<(u64, u64)> {
        let (count, last): (i64, Option<i64>) = self
            .conn
            .prepare_cached(
                "SELECT count(*), max(step_index) FROM steps WHERE task_id = ?1 AND status <> 'discarded'",
            )?
            .query_row([task], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok((count as u64, last.unwrap_or(0) as u64))
    }

    fn put_steps(
        &mut self,
        task: &str,
        steps: &[StepWrite<'_>],
        run: u32,
        stats: Option<&RunStats>,
    ) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // The write lock is ours until the commit: no takeover or cancel
        // can come between this check and the writes.
        let (lease_run, cancelled) = standing_columns(&tx, task)?;
        let opens = steps
            .iter()
            .any(|write| write.record.status == StepStatus::Pending);
        super::fence(lease_run, cancelled, run, opens)?;
        for &StepWrite {
            record: step,
            fresh,
        } in steps
        {
            write_step(&tx, task, step, fresh, run)?;
        }
        if let Some(stats) = stats {
            write_stats(&tx, task, run, stats)?;
        }
        tx.commit()?;
        self.check_identity()
    }

    fn set_output(&mut self, task: &str, run: u32, output: &Value) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (lease_run, cancelled) = standing_columns(&tx, task)?;
        super::fence(lease_run, cancelled, run, false)?;
        tx.prepare_cached("UPDATE tasks SET output = ?2, updated_at = ?3 WHERE id = ?1")?
            .execute(params![task, json_text(output), super::now()])?;
        tx.commit()?;
        self.check_identity()
    }

    fn finish_run(&mut self, task: &str, run: u32, end: &RunEnd, stats: &RunStats) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "UPDATE runs SET finished_at = ?3, exit_code = ?4 WHERE task_id = ?1 AND run = ?2",
            params![task, run, end.finished_at, end.exit_code],
        )?;
        write_stats(&tx, task, run, stats)?;
        // Release the lease only if this run still holds it; a cancel that
        // came meanwhile decides the status.
        tx.execute(
            "UPDATE tasks SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE ?3 END,
                 exit_code = ?4, updated_at = ?5, lease_host = NULL, lease_pid = NULL,
                 lease_pid_start = NULL, lease_heartbeat = NULL, lease_run = NULL
             WHERE id = ?1 AND lease_run = ?2",
            params![task, run, end.status.as_str(), end.exit_code, end.finished_at],
        )?;
        tx.commit()?;
        Ok(())
    }
    fn discard_from(&mut self, task: &str, run: u32, step: u64) -> Result<Vec<StepRecord>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (lease_run, cancelled) = standing_columns(&tx, task)?;
        super::fence(lease_run, cancelled, run, true)?;
        let discarded = {
            let mut statement = tx.prepare_cached(&format!(
                "SELECT {STEP_COLUMNS} FROM steps
                 WHERE task_id = ?1 AND step_index >= ?2 AND status <> 'discarded' ORDER BY step_index"
            ))?;
            let mut rows = statement.query(params![task, step as i64])?;
            let mut discarded = Vec::new();
            while let Some(row) = rows.next()? {
                discarded.push(step_from_row(row)?);
            }
            discarded
        };
        tx.execute(
            "UPDATE steps SET status = 'discarded' WHERE task_id = ?1 AND step_index >= ?2 AND status <> 'discarded'",
            params![task, step as i64],
        )?;
        tx.commit()?;
        Ok(discarded)
    }

    fn resolve(
        &mut self,
        task: &str,
        step: u64,
        resolution: &Resolution,
        me: &Holder,
    ) -> Result<StepRecord> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(lease) = lease_of(&tx, task)?
            && lease::is_live(&lease, me, super::now_ms())
        {
            return Err(super::locked(task, &lease).into());
        }
        let mut record = {
            let mut statement = tx.prepare_cached(&format!(
                "SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ?1 AND step_index = ?2 AND status <> 'discarded'"
            ))?;
            let mut rows = statement.query(params![task, step as i64])?;
            match rows.next()? {
                Some(row) => step_from_row(row)?,
                None => {
                    return Err(Failure::config(format!("task {task} has no step {step}"))
                        .hint(format!("`durun inspect {task}` lists its steps"))
                        .into());
                }
            }
        };
        let value = super::apply_resolution(&mut record, resolution);
        let (error_code, error) = match &record.error {
            Some(error) => (Some(error.code.as_str()), Some(error.message.as_str())),
            None => (None, None),
        };
        tx.execute(
            "UPDATE steps SET status = ?3, output = ?4, error_code = ?5, error = ?6, finished_at = ?7, resolution = ?8
             WHERE task_id = ?1 AND step_index = ?2 AND status <> 'discarded'",
            params![
                task,
                step as i64,
                record.status.as_str(),
                record.output.as_ref().map(JsonText::as_str),
                error_code,
                error,
                record.finished_at,
                record.resolution,
            ],
        )?;
        tx.execute(
            "INSERT INTO resolutions (task_id, step_index, action, value, resolved_by, resolved_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                task,
                step as i64,
                resolution.action.name(),
                value,
                resolution.by,
                resolution.at
            ],
        )?;
        tx.commit()?;
        Ok(record)
    }

    fn request_cancel(&mut self, task: &str, me: &Holder) -> Result<bool> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let now = super::now();
        let live =
            lease_of(&tx, task)?.is_some_and(|lease| lease::is_live(&lease, me, super::now_ms()));
        if live {
            // The runner keeps its lease to record what finishes, but may
            // open no step: every write it makes checks this mark.
            tx.execute(
                "UPDATE tasks SET status = 'cancelled', updated_at = ?2,
                     cancel_requested_at = coalesce(cancel_requested_at, ?2)
                 WHERE id = ?1",
                params![task, now],
            )?;
        } else {
            tx.execute(
                "UPDATE tasks SET status = 'cancelled', cancel_requested_at = ?2, updated_at = ?2, lease_host = NULL,
                     lease_pid = NULL, lease_pid_start = NULL, lease_heartbeat = NULL, lease_run = NULL
                 WHERE id = ?1",
                params![task, now],
            )?;
        }
        tx.commit()?;
        Ok(live)
    }

    fn gc(&mut self, finished_before: &str, me: &Holder) -> Result<Vec<String>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let candidates: Vec<(String, Option<Lease>)> = {
            let mut statement = tx.prepare(
                "SELECT id, lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run FROM tasks
                 WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at < ?1",
            )?;
            let rows = statement.query_map([finished_before], |row| {
                Ok((row.get(0)?, lease_from(row, 1)?))
            })?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let now_ms = super::now_ms();
        let mut removed = Vec::new();
        for (id, lease) in candidates {
            if lease.is_some_and(|lease| lease::is_live(&lease, me, now_ms)) {
                continue;
            }
            tx.execute("DELETE FROM tasks WHERE id = ?1", [&id])?;
            removed.push(id);
        }
        tx.commit()?;
        Ok(removed)
    }
}

/// The lease columns starting at `first`: host, pid, pid start, heartbeat, run.
fn lease_from(row: &Row<'_>, first: usize) -> rusqlite::Result<Option<Lease>> {
    Ok(
        match (
            row.get::<_, Option<String>>(first)?,
            row.get::<_, Option<u32>>(first + 1)?,
        ) {
            (Some(host), Some(pid)) => Some(Lease {
                host,
                pid,
                pid_start: row
                    .get::<_, Option<i64>>(first + 2)?
                    .map(|start| start as u64),
                heartbeat_ms: row.get::<_, Option<i64>>(first + 3)?.unwrap_or(0),
                run: row.get::<_, Option<u32>>(first + 4)?.unwrap_or(0),
            }),
            _ => None,
        },
    )
}

fn lease_of(tx: &rusqlite::Transaction<'_>, task: &str) -> Result<Option<Lease>> {
    let lease = tx
        .query_row(
            "SELECT lease_host, lease_pid, lease_pid_start, lease_heartbeat, lease_run FROM tasks WHERE id = ?1",
            [task],
            |row| lease_from(row, 0),
        )
        .optional()?
        .flatten();
    Ok(lease)
}

/// The task's lease holder (its run) and whether it was cancelled.
fn standing_columns(conn: &Connection, task: &str) -> Result<(Option<u32>, bool)> {
    let columns = conn
        .prepare_cached(
            "SELECT lease_run, cancel_requested_at IS NOT NULL FROM tasks WHERE id = ?1",
        )?
        .query_row([task], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    Ok(columns.unwrap_or((None, false)))
}

/// Inserts (`fresh`) or updates one step's row.
fn write_step(
    tx: &rusqlite::Transaction<'_>,
    task: &str,
    step: &StepRecord,
    fresh: bool,
    run: u32,
) -> Result<()> {
    let output = step.output.as_ref().map(JsonText::as_str);
    let usage = step.usage.as_ref().map(JsonText::as_str);
    let (error_code, error) = match &step.error {
        Some(error) => (Some(error.code.as_str()), Some(error.message.as_str())),
        None => (None, None),
    };
    if fresh {
        tx.prepare_cached(
            "INSERT INTO steps (task_id, step_index, tool_name, kind, effect, args, args_hash, idempotency_key,
                 status, attempts, output, error_code, error, usage, tokens, run, created_at, started_at,
                 finished_at, resolution, seen_from)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
        )?
        .execute(params![
            task,
            step.step as i64,
            step.name,
            step.kind.as_str(),
            step.effect.as_str(),
            step.args.as_str(),
            step.args_hash,
            step.idempotency_key,
            step.status.as_str(),
            step.attempts,
            output,
            error_code,
            error,
            usage,
            step.tokens as i64,
            run,
            step.created_at,
            step.started_at,
            step.finished_at,
            step.resolution,
            step.seen_from.map(|step| step as i64),
        ])?;
    } else {
        let changed = tx
            .prepare_cached(
                "UPDATE steps SET status = ?3, attempts = ?4, output = ?5, error_code = ?6, error = ?7,
                     usage = ?8, tokens = ?9, run = ?10, started_at = ?11, finished_at = ?12, resolution = ?13,
                     seen_from = ?14
                 WHERE task_id = ?1 AND step_index = ?2 AND status <> 'discarded'",
            )?
            .execute(params![
                task,
                step.step as i64,
                step.status.as_str(),
                step.attempts,
                output,
                error_code,
                error,
                usage,
                step.tokens as i64,
                run,
                step.started_at,
                step.finished_at,
                step.resolution,
                step.seen_from.map(|step| step as i64),
            ])?;
        anyhow::ensure!(
            changed == 1,
            "step {} of task {task} is missing from the journal",
            step.step
        );
    }
    Ok(())
}

fn write_stats(
    tx: &rusqlite::Transaction<'_>,
    task: &str,
    run: u32,
    stats: &RunStats,
) -> Result<()> {
    tx.prepare_cached(
        "UPDATE runs SET replayed_steps = ?3, executed_steps = ?4, tokens_spent = ?5, tokens_saved = ?6
         WHERE task_id = ?1 AND run = ?2",
    )?
    .execute(params![
        task,
        run,
        stats.replayed_steps as i64,
        stats.executed_steps as i64,
        stats.tokens_spent as i64,
        stats.tokens_saved as i64,
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(id: &str) -> NewTask {
        NewTask {
            id: id.to_owned(),
            argv: vec!["agent".into(), "--flag".into()],
            cwd: "/tmp".into(),
            config: None,
            config_path: None,
            sync: SyncMode::Full,
            created_at: super::super::now(),
        }
    }

    fn step(n: u64, status: StepStatus) -> StepRecord {
        StepRecord {
            step: n,
            name: "llm".into(),
            kind: StepKind::Begin,
            effect: Effect::Mutate,
            args: JsonText::from_value(&json!({"big": 123_456_789_012_345_678_u64, "f": 1.5})),
            args_hash: "h".into(),
            idempotency_key: "k".into(),
            status,
            attempts: 1,
            output: None,
            error: None,
            usage: None,
            tokens: 0,
            run: 1,
            created_at: super::super::now(),
            started_at: super::super::now(),
            finished_at: None,
            resolution: None,
            seen_from: None,
        }
    }

    #[test]
    fn a_group_of_steps_is_one_commit_all_or_nothing() {
        let mut journal = SqliteJournal::in_memory();
        journal.create_task(&task("t1")).expect("create");
        let RunStart::Started { run, .. } = journal
            .start_run("t1", &Holder::current(), "now")
            .expect("start")
        else {
            panic!("a fresh task is not locked");
        };
        let records: Vec<StepRecord> = (1..=8).map(|n| step(n, StepStatus::Committed)).collect();
        let writes: Vec<StepWrite<'_>> = records
            .iter()
            .map(|record| StepWrite {
                record,
                fresh: true,
            })
            .collect();
        let stats = RunStats {
            executed_steps: 8,
            ..RunStats::default()
        };
        journal
            .put_steps("t1", &writes, run, Some(&stats))
            .expect("a group");
        assert_eq!(journal.replay_bounds("t1").expect("bounds"), (8, 8));
        assert_eq!(journal.runs("t1").expect("runs")[0].stats, stats);

        // A group with one bad row (an update of a step never written)
        // writes none of its rows.
        let new = step(9, StepStatus::Committed);
        let missing = step(12, StepStatus::Committed);
        let bad = [
            StepWrite {
                record: &new,
                fresh: true,
            },
            StepWrite {
                record: &missing,
                fresh: false,
            },
        ];
        journal
            .put_steps("t1", &bad, run, Some(&RunStats::default()))
            .expect_err("step 12 is missing");
        assert_eq!(journal.replay_bounds("t1").expect("bounds"), (8, 8));
        assert_eq!(journal.runs("t1").expect("runs")[0].stats, stats);

        // Pages of the live steps after a step, in order.
        let page: Vec<u64> = journal
            .steps_page("t1", 2, 3)
            .expect("page")
            .iter()
            .map(|record| record.step)
            .collect();
        assert_eq!(page, [3, 4, 5]);
        assert!(journal.steps_page("t1", 8, 3).expect("page").is_empty());
    }

    #[test]
    fn a_step_goes_from_pending_to_committed() {
        let mut journal = SqliteJournal::in_memory();
        journal.create_task(&task("t1")).expect("create");
        let me = Holder::current();
        let RunStart::Started { run, .. } = journal.start_run("t1", &me, "now").expect("start")
        else {
            panic!("a fresh task is not locked");
        };
        assert_eq!(run, 1);
        let mut record = step(1, StepStatus::Pending);
        let stats = RunStats {
            executed_steps: 0,
            ..RunStats::default()
        };
        journal
            .put_steps(
                "t1",
                &[StepWrite {
                    record: &record,
                    fresh: true,
                }],
                run,
                Some(&stats),
            )
            .expect("pending");
        record.status = StepStatus::Committed;
        record.output = Some(JsonText::from_value(&json!({"url": "x"})));
        record.tokens = 42;
        let stats = RunStats {
            executed_steps: 1,
            tokens_spent: 42,
            ..RunStats::default()
        };
        journal
            .put_steps(
                "t1",
                &[StepWrite {
                    record: &record,
                    fresh: false,
                }],
                run,
                Some(&stats),
            )
            .expect("commit");
        let steps = journal.steps("t1", false).expect("steps");
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].status, StepStatus::Committed);
        assert_eq!(
            steps[0].output,
            Some(JsonText::from_value(&json!({"url": "x"})))
        );
        assert_eq!(steps[0].args, record.args);
        let loaded = journal.task("t1").expect("task").expect("exists");
        assert_eq!((loaded.steps, loaded.tokens_spent), (1, 42));
    }

    #[test]
    fn a_live_lease_locks_the_task_until_released() {
        let mut journal = SqliteJournal::in_memory();
        journal.create_task(&task("t1")).expect("create");
        let me = Holder::current();
        assert!(matches!(
            journal.start_run("t1", &me, "a").expect("first"),
            RunStart::Started { run: 1, .. }
        ));
        let other = Holder {
            pid: me.pid,
            pid_start: me.pid_start,
            host: me.host.clone(),
        };
        assert!(matches!(
            journal.start_run("t1", &other, "b").expect("second"),
            RunStart::Locked(_)
        ));
        let end = RunEnd {
            status: TaskStatus::Failed,
            exit_code: Some(1),
            finished_at: "c".into(),
        };
        journal
            .finish_run("t1", 1, &end, &RunStats::default())
            .expect("finish");
        assert!(matches!(
            journal.start_run("t1", &other, "d").expect("third"),
            RunStart::Started { run: 2, .. }
        ));
        let runs = journal.runs("t1").expect("runs");
        assert_eq!(
            runs.iter()
                .map(|r| (r.run, r.exit_code))
                .collect::<Vec<_>>(),
            [(1, Some(1)), (2, None)]
        );
    }

    #[test]
    fn refuses_a_journal_from_a_newer_durun() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.db");
        drop(SqliteJournal::open(&path, Access::Write).expect("create"));
        let conn = Connection::open(&path).expect("open");
        conn.pragma_update(None, "user_version", 99).expect("bump");
        drop(conn);
        let err = SqliteJournal::open(&path, Access::Write)
            .err()
            .expect("refused");
        assert_eq!(crate::error::exit_code_of(&err), crate::exit_code::JOURNAL);
        assert!(format!("{err:#}").contains("newer durun"), "{err:#}");
        assert!(SqliteJournal::open(&path, Access::Read).is_ok());
    }

    #[test]
    fn creates_the_journal_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state/durun/journal.db");
        drop(SqliteJournal::open(&path, Access::Write).expect("create"));
        let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().expect("dir")), 0o700);
    }
}
