//! `DURUN_SOCKET`: the protocol on a Unix socket, for `durun step` and
//! `durun call` run by shell agents (SPEC 2.5).
//!
//! The socket lives in a private directory (0700) made for the run and
//! removed after it. Each connection is one protocol stream: a thread reads
//! its lines into the supervisor's events, another writes its answers.
//!
//! # Invariant
//!
//! A connection is announced to the loop before any of its lines, on the
//! same channel, so every answer goes back on the connection that asked;
//! a client that leaves more than [`ANSWER_BOUND`] bytes of answers unread
//! is not read until it catches up.

use std::io::{BufReader, Write as _};
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak, mpsc};
use std::time::Duration;

use super::inbox::{Answers, Conn, Event, Events};
use super::lines::{Chunk, LineReader};
use crate::protocol;

/// The most answer bytes a client may leave unread before durun stops
/// reading its requests.
const ANSWER_BOUND: usize = 4 * 1024 * 1024;

/// Whether this process looked for dead runs' socket directories.
static SWEPT: std::sync::Once = std::sync::Once::new();

/// The directory the runs of this process share while someone holds it
/// ([`share_home`]).
static SHARED: Mutex<Weak<SocketHome>> = Mutex::new(Weak::new());

/// Numbers the sockets of a shared directory.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// A private directory (0700) for run sockets, removed when the last run
/// or holder lets go of it.
pub(crate) struct SocketHome {
    path: PathBuf,
}

impl Drop for SocketHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Has the runs of this process put their sockets in one directory for as
/// long as the handle lives (a worker's): a run does not make and remove
/// a directory of its own, which on ext4 costs a block allocation each.
pub(crate) fn share_home(runtime_dir: Option<&Path>) -> std::io::Result<Arc<SocketHome>> {
    let home = Arc::new(SocketHome {
        path: home_dir(runtime_dir)?,
    });
    *SHARED.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&home);
    Ok(home)
}

/// The socket's directory (removed when the run ends, unless the runs
/// share it) and the listener, closed then: a worker runs many runs in
/// one process. Connections are accepted on a thread started at the first
/// client ([`SocketDir::serve`]): most agents never run `durun step`.
pub(super) struct SocketDir {
    home: Arc<SocketHome>,
    pub(crate) path: PathBuf,
    listener: UnixListener,
    closed: Arc<AtomicBool>,
    /// Until the first client: where the accepting thread sends events.
    idle: Option<Events>,
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        // Wakes the thread blocked in accept(2) (it fails with EINVAL),
        // which then ends and lets go of the run's inbox.
        self.shut();
        // The directory goes with the last of its users.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket in a private directory (the one the runs share, if
/// any); [`SocketDir::serve`] starts accepting.
pub(super) fn listen(events: Events, runtime_dir: Option<&Path>) -> std::io::Result<SocketDir> {
    let shared = SHARED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .upgrade();
    let (home, name) = match shared {
        Some(home) => {
            let number = NEXT.fetch_add(1, Ordering::Relaxed);
            (home, format!("durun-{number}.sock"))
        }
        None => {
            let home = Arc::new(SocketHome {
                path: home_dir(runtime_dir)?,
            });
            (home, "durun.sock".to_owned())
        }
    };
    let path = home.path.join(name);
    let listener = UnixListener::bind(&path)?;
    Ok(SocketDir {
        home,
        path,
        listener,
        closed: Arc::new(AtomicBool::new(false)),
        idle: Some(events),
    })
}

impl SocketDir {
    /// The listener while no thread accepts on it: a client waiting on it
    /// (it polls readable) is the time to [`SocketDir::serve`].
    pub(super) fn idle_listener(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd as _;
        self.idle.as_ref().map(|_| self.listener.as_fd())
    }

    /// Starts accepting connections on a thread of its own, once. On
    /// failure the socket is shut, so that clients are refused rather
    /// than left waiting.
    pub(super) fn serve(&mut self) -> std::io::Result<()> {
        let Some(events) = self.idle.take() else {
            return Ok(());
        };
        let closed = Arc::clone(&self.closed);
        let started = self.listener.try_clone().and_then(|accepting| {
            std::thread::Builder::new()
                .name("durun-socket".to_owned())
                .spawn(move || {
                    for (conn, stream) in (1..).zip(accepting.incoming()) {
                        if closed.load(Ordering::SeqCst) {
                            return;
                        }
                        let Ok(stream) = stream else { continue };
                        serve(conn, stream, &events);
                    }
                })
        });
        if started.is_err() {
            self.shut();
        }
        started.map(drop)
    }

    /// Removes dead runs' directories beside this one, once a process.
    /// Called while the agent starts, which takes longer than one
    /// readdir: a thread of its own cost a start more CPU than the sweep.
    pub(super) fn sweep_once(&self) {
        if let Some(base) = self.home.path.parent() {
            SWEPT.call_once(|| sweep(base));
        }
    }

    /// Shuts the listener: clients are refused, and a thread blocked in
    /// accept(2) returns.
    fn shut(&self) {
        let _ = rustix::net::shutdown(&self.listener, rustix::net::Shutdown::Both);
    }
}

/// Removes the socket directories of runs that died without removing
/// their own (a SIGKILL leaves `durun-PID-…` behind): this user's, whose
/// process is gone. A pid since reused keeps its directory; it is empty
/// but for a dead socket, and goes once that pid is gone too.
fn sweep(base: &Path) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let me = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix("durun-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        let ours = entry
            .metadata()
            .is_ok_and(|meta| meta.is_dir() && meta.uid() == me);
        // Signal 0 only asks whether the pid exists.
        let gone = rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH);
        if ours && gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A new private directory in `$XDG_RUNTIME_DIR` where it is usable, else
/// in the temp directory.
fn home_dir(runtime_dir: Option<&Path>) -> std::io::Result<PathBuf> {
    let runtime = runtime_dir
        .filter(|dir| dir.is_dir())
        .and_then(|base| private_dir(base).ok());
    match runtime {
        Some(dir) => Ok(dir),
        None => private_dir(&std::env::temp_dir()),
    }
}

fn private_dir(base: &Path) -> std::io::Result<PathBuf> {
    let mut attempt = 0u32;
    loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let dir = base.join(format!("durun-{}-{nanos:08x}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

fn serve(conn: Conn, stream: UnixStream, events: &Events) {
    let Ok(mut write_half) = stream.try_clone() else {
        return;
    };
    let (tx, to_write) = mpsc::channel::<Vec<u8>>();
    let answers = Answers::new(tx);
    let unwritten = Arc::clone(&answers.unwritten);
    let client_gone = Arc::clone(&answers.gone);
    // Announced before any of its lines, on the same channel: the loop
    // knows where to answer before it reads a request.
    if events.send(Event::Connected(conn, answers)).is_err() {
        return;
    }
    let written = Arc::clone(&unwritten);
    let gone = Arc::clone(&client_gone);
    std::thread::spawn(move || {
        for line in to_write {
            if write_half
                .write_all(&line)
                .and_then(|()| write_half.flush())
                .is_err()
            {
                // The client is gone: its reader must not wait on it.
                gone.store(true, Ordering::SeqCst);
                break;
            }
            written.fetch_sub(line.len(), Ordering::SeqCst);
        }
    });
    let events = events.clone();
    // Deep requests (up to a thousand levels) are parsed here.
    let _ = std::thread::Builder::new()
        .stack_size(8 * 1024 * 1024)
        .spawn(move || {
            let mut reader = LineReader::new(BufReader::new(stream));
            loop {
                // A client that does not read its answers is not read either.
                while unwritten.load(Ordering::SeqCst) > ANSWER_BOUND
                    && !client_gone.load(Ordering::SeqCst)
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let event = match reader.next_line() {
                    Ok(Some(Chunk::Line { bytes, .. } | Chunk::Text(bytes))) => {
                        Event::Line(conn, protocol::parse_line(&bytes))
                    }
                    Ok(Some(Chunk::Oversized { id })) => Event::Oversized(conn, id),
                    Ok(None) | Err(_) => {
                        let _ = events.send(Event::Disconnected(conn));
                        return;
                    }
                };
                if events.send(event).is_err() {
                    return;
                }
            }
        });
}
