//! The agent as a process: how it is started (environment, pipes, its
//! keeper), the thread that waits for it where the kernel has
//! no pidfd, the one that copies its stderr through the progress line, and
//! durun's signals caught for the loop.
//!
//! # Invariant
//!
//! The agent never outlives durun: its keeper kills it and everything it
//! started when durun dies, and durun's signals are caught before it
//! starts, so none is lost between.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::inbox::{Event, Events};
use super::spec::RunSpec;
use crate::protocol;
use crate::report::StderrCopier;
use crate::spawn::{self, Plan, Spawned};
use rustix::process::Signal;

/// Starts the agent of `spec`, its stdin and stdout piped to durun, its
/// stderr piped only when `copier` takes it.
pub(super) fn spawn_agent(
    spec: &RunSpec<'_>,
    argv: &[String],
    socket: &Path,
    proxy: &[(String, String)],
    copier: bool,
) -> std::io::Result<Spawned> {
    let mut env = vec![
        ("DURUN_TASK_ID", spec.task_id.into()),
        ("DURUN_RUN", spec.run.to_string().into()),
        ("DURUN_PROTOCOL", protocol::VERSION.to_string().into()),
        ("DURUN_SOCKET", socket.as_os_str().to_owned()),
        // The agent's parent is durun's keeper, not durun.
        ("DURUN_PID", std::process::id().to_string().into()),
    ];
    // The model clients' base URLs point at the run's proxy.
    env.extend(
        proxy
            .iter()
            .map(|(name, value)| (name.as_str(), value.into())),
    );
    spawn::spawn(&Plan {
        argv,
        cwd: spec.cwd,
        stdin: spec.stdin,
        env,
        // On a terminal the agent's stderr goes through the progress line;
        // elsewhere it is the agent's own, untouched.
        pipe_stderr: copier,
        own_group: false,
    })
}

/// Waits for the agent on a thread of its own and tells the loop its exit.
pub(super) fn spawn_exit_waiter(pid: u32, events: Events) {
    use std::os::unix::process::ExitStatusExt as _;
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    std::thread::spawn(move || {
        loop {
            match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
                Ok(Some((_, status))) => {
                    let status = std::process::ExitStatus::from_raw(status.as_raw());
                    let _ = events.send(Event::Exited(status));
                    return;
                }
                Ok(None) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    });
}

/// Copies the agent's stderr through `copy` a line at a time (a part line
/// once nothing more came for [`PART_LINE_AFTER`]), bytes unchanged, on a
/// thread of its own. The receiver hears when the agent's stderr has
/// closed and every byte went out. A slow `copy` holds up the agent's
/// stderr, as a slow terminal would without durun.
pub(super) fn spawn_stderr_copier(
    stderr: std::process::ChildStderr,
    mut copy: StderrCopier,
) -> mpsc::Receiver<()> {
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut stderr = stderr;
        let mut buffer = vec![0u8; 64 * 1024];
        let mut pending: Vec<u8> = Vec::new();
        loop {
            if !pending.is_empty() && !readable_within(&stderr, PART_LINE_AFTER) {
                // A prompt without a newline still shows.
                copy(&pending);
                pending.clear();
                continue;
            }
            match stderr.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    pending.extend_from_slice(&buffer[..n]);
                    if let Some(last) = pending.iter().rposition(|&b| b == b'\n') {
                        copy(&pending[..=last]);
                        pending.drain(..=last);
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if !pending.is_empty() {
            copy(&pending);
        }
        let _ = done_tx.send(());
    });
    done
}

/// How long a part line of the agent's stderr waits for the rest.
const PART_LINE_AFTER: Duration = Duration::from_millis(100);

/// Whether `fd` has something to read (or closed) within `wait`.
fn readable_within(fd: &impl std::os::fd::AsFd, wait: Duration) -> bool {
    let mut fds = [crate::os::poll_fd(fd, crate::os::PollFlags::IN)];
    let _ = crate::os::poll(&mut fds, wait);
    !fds[0].revents().is_empty()
}

/// The signals that stop a run.
const CAUGHT: [i32; 3] = [
    Signal::INT.as_raw(),
    Signal::TERM.as_raw(),
    Signal::HUP.as_raw(),
];

/// durun's stop signals, caught without a thread and without `unsafe`:
/// signal-hook's handler writes a byte to the signal's own pipe, which
/// counts it, then one to the loop's wake pipe; the loop takes the counts
/// after its wait. Dropping it restores what was there before.
pub(super) struct Caught {
    ids: Vec<signal_hook::SigId>,
    /// The read ends of the signals' pipes, in the order of [`CAUGHT`].
    counts: Vec<OwnedFd>,
}

impl Caught {
    pub(super) fn new(wake: &Arc<OwnedFd>) -> std::io::Result<Self> {
        let mut caught = Self {
            ids: Vec::new(),
            counts: Vec::new(),
        };
        for signal in CAUGHT {
            let (count, counted) = crate::os::wake_pipe()?;
            caught.counts.push(count);
            // Actions run in the order they were registered: the count is
            // in its pipe before the loop wakes to look.
            caught
                .ids
                .push(signal_hook::low_level::pipe::register(signal, counted)?);
            let wake = wake.try_clone()?;
            caught
                .ids
                .push(signal_hook::low_level::pipe::register(signal, wake)?);
        }
        Ok(caught)
    }

    /// Hands `each` the signals caught since the last look.
    pub(super) fn take(&self, mut each: impl FnMut(i32)) {
        let mut buffer = [0u8; 16];
        for (count, signal) in self.counts.iter().zip(CAUGHT) {
            while let Ok(read @ 1..) = rustix::io::read(count, &mut buffer) {
                for _ in 0..read {
                    each(signal);
                }
            }
        }
    }
}

impl Drop for Caught {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
