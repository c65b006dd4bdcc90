//! Opening the SQLite journal: the file and its directory created private,
//! another program's database or a FIFO refused before a byte is written,
//! the schema migrated, and the file's identity kept to notice a deleted
//! journal.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::config::SyncMode;
use crate::error::Failure;
use crate::journal::Access;
use crate::journal::schema::{SQLITE_VERSION, sqlite_from};
use crate::os;
use crate::settings::Settings;

/// `PRAGMA application_id` of a durun journal ("durn"): a file with other
/// tables and another id belongs to another program and is left alone.
const APPLICATION_ID: i32 = 0x6475_726e;

pub(crate) struct SqliteJournal {
    pub(super) conn: Connection,
    path: PathBuf,
    /// The journal file's device and inode when it was opened for writing:
    /// a run stops rather than acknowledge steps into a file that was
    /// deleted or replaced under it.
    identity: Option<(u64, u64)>,
    /// `PRAGMA data_version` at the last [`crate::journal::Journal::watch`]: it changes
    /// only when another connection commits.
    pub(super) data_version: i64,
    /// `PRAGMA data_version` at the last look for a worker's work.
    pub(super) work_version: i64,
    /// The sync mode steps are committed with.
    pub(super) sync: SyncMode,
    /// How old another host's heartbeat may be before its lease is taken.
    pub(super) stale: Duration,
    /// Frames in the WAL after this connection's last commit.
    wal_frames: Arc<AtomicI32>,
}

/// SQLite's own size for a checkpoint as the WAL grows (its default).
const CHECKPOINT_FRAMES: i32 = 1000;

/// A closing connection checkpoints a WAL longer than this: the next
/// process to open the journal reads the whole WAL before its first query.
const CLOSE_FRAMES: i32 = 64;

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        if self.wal_frames.load(Ordering::Relaxed) > CLOSE_FRAMES {
            // Emptied, so that the next open reads nothing; never waiting
            // for a reader (another process's): then the next close tries.
            let _ = self.conn.busy_timeout(Duration::ZERO);
            let _ = self
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        }
    }
}

/// What a file is, before durun writes a byte to it.
enum Owner {
    /// An empty file, or none yet.
    Nobody,
    /// A durun journal.
    Durun,
}

impl SqliteJournal {
    pub(crate) fn open(path: &Path, access: Access, settings: &Settings) -> Result<Self> {
        let exists = regular_file(path)?;
        let conn = match access {
            Access::Write => {
                if os::read_only_mount(path) {
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
                if let Some(refused) = unreadable(path) {
                    return Err(refused);
                }
                // On read-only media SQLite cannot make the WAL index; a
                // journal there cannot change under us, so read it as
                // immutable, unless a WAL is there to read (a run's last
                // steps, which closing does not always checkpoint): SQLite
                // reads it when its index file is there too.
                let read_only_media = os::read_only_mount(path);
                let with_wal = |suffix: &str| {
                    let mut name = path.as_os_str().to_owned();
                    name.push(suffix);
                    std::fs::metadata(name).is_ok_and(|meta| meta.len() > 0)
                };
                let immutable = read_only_media && !(with_wal("-wal") && with_wal("-shm"));
                let uri = format!("file:{}?immutable={}", uri_path(path), u8::from(immutable));
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
            work_version: -1,
            sync: SyncMode::Full,
            stale: settings.lease.stale,
            wal_frames: Arc::default(),
        };
        journal
            .prepare_patiently(access, settings.busy_timeout)
            .map_err(|err| {
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
    pub(super) fn check_identity(&self) -> Result<()> {
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
    pub(crate) fn in_memory() -> Self {
        let mut journal = Self {
            conn: Connection::open_in_memory().expect("in-memory SQLite"),
            path: PathBuf::from(":memory:"),
            identity: None,
            data_version: -1,
            work_version: -1,
            sync: SyncMode::Full,
            stale: crate::settings::LeaseTimes::default().stale,
            wal_frames: Arc::default(),
        };
        journal
            .prepare(Access::Write, Duration::from_secs(5))
            .expect("fresh schema");
        journal
    }

    /// [`Self::prepare`], tried again while SQLite says busy, up to
    /// `busy_timeout`. Several processes creating one new journal at once
    /// (a run, a submit, a worker) race to put it in WAL mode and to
    /// migrate it, and SQLite answers some of those steps busy at once,
    /// without its busy handler (SPEC 17: none of them may fail). Every
    /// step is idempotent: a pragma, a migration that reads the version
    /// under its exclusive lock.
    fn prepare_patiently(&mut self, access: Access, busy_timeout: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + busy_timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match self.prepare(access, busy_timeout) {
                Err(err) if busy(&err) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                done => return done,
            }
        }
    }

    fn prepare(&mut self, access: Access, busy_timeout: Duration) -> Result<()> {
        self.conn.busy_timeout(busy_timeout)?;
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        self.owner()?;
        let version: i64 = self
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))?;
        let known = SQLITE_VERSION as i64;
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
            self.conn.pragma_update(None, "synchronous", "FULL")?;
            // No checkpoint when the last connection closes: the WAL stays
            // (SQLite checkpoints it as it grows), so a short run pays no
            // checkpoint's two fsyncs at its end and no WAL file's creation
            // (and its directory's fsync) at its start.
            self.conn
                .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
            // SQLite's checkpoint as the WAL grows, which a hook of our own
            // replaces, and the WAL's length for the checkpoint at close.
            let frames = Arc::clone(&self.wal_frames);
            self.conn
                .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages| {
                    frames.store(pages, Ordering::Relaxed);
                    if pages >= CHECKPOINT_FRAMES {
                        // Busy (a reader holds old frames): the next commit tries again.
                        let _ = wal.checkpoint();
                    }
                    Ok(())
                }))?;
            self.migrate(version)?;
        }
        Ok(())
    }

    fn migrate(&mut self, version: i64) -> Result<()> {
        let marked = self
            .conn
            .pragma_query_value(None, "application_id", |row| row.get::<_, i32>(0))?
            == APPLICATION_ID;
        if version >= SQLITE_VERSION as i64 && marked {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Exclusive)?;
        // Another process may have migrated between our check and the lock.
        let version: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
        for (format, sql) in sqlite_from(version as usize) {
            tx.execute_batch(&sql)
                .with_context(|| format!("failed to migrate the journal to format {format}"))?;
        }
        tx.pragma_update(None, "user_version", SQLITE_VERSION as i64)?;
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
        tx.commit()?;
        Ok(())
    }
}

/// Whether SQLite said busy or locked somewhere in `err`.
fn busy(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<rusqlite::Error>().is_some_and(|err| {
            matches!(
                err.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            )
        })
    })
}

/// Refuses a journal path that is not a regular file (a directory, a FIFO
/// that would block, a device) and says whether the file exists. A path
/// that cannot be looked at (a directory without permission) is a journal
/// error, whoever owns it.
/// Whether `path` holds a journal to read: a file with tables in it. A
/// file a first run is still creating (empty, or its schema not yet
/// committed) holds none yet: its readers see no tasks, not an error.
pub(crate) fn holds_tables(path: &Path) -> Result<bool> {
    if !regular_file(path)? {
        return Ok(false);
    }
    if std::fs::metadata(path).is_ok_and(|meta| meta.len() == 0) {
        return Ok(false);
    }
    let Ok(conn) = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    ) else {
        // Whatever is wrong, opening it for real says it well.
        return Ok(true);
    };
    let _ = conn.busy_timeout(Duration::from_secs(5));
    let tables = conn.query_row("SELECT count(*) FROM sqlite_master", [], |row| {
        row.get::<_, i64>(0)
    });
    Ok(!matches!(tables, Ok(0)))
}

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

/// The journal, or one of the WAL files beside it, that this user may
/// not read: durun makes them private to the user whose run made them, so
/// another user's `inspect` meets this, and SQLite would only say "unable
/// to open database file".
fn unreadable(path: &Path) -> Option<anyhow::Error> {
    use std::os::unix::fs::MetadataExt as _;
    ["", "-wal", "-shm"].into_iter().find_map(|suffix| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let meta = std::fs::metadata(&name).ok()?;
        rustix::fs::access(name.as_os_str(), rustix::fs::Access::READ_OK).err()?;
        let error = Failure::journal(format!(
            "cannot read the journal at {}: {} belongs to uid {} (mode {:o}), and this user (uid {}) may not read it",
            path.display(),
            Path::new(&name).display(),
            meta.uid(),
            meta.mode() & 0o7777,
            rustix::process::getuid().as_raw()
        ))
        .hint("run durun as the user whose runs wrote the journal (`sudo -u USER durun ...`), or have them copy a task out with `durun export`");
        Some(error.into())
    })
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
