//! The few Unix calls durun needs: parent-death signals, process groups,
//! sending signals, and waiting on pipes. Safe wrappers (rustix) wherever
//! one exists; `unsafe` is left for `pre_exec`, whose closure runs
//! between fork and exec ([`before_exec`]).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use rustix::event::PollFd;
pub(crate) use rustix::event::PollFlags;
use rustix::process::{Pid, Signal};

/// The open-file limit durun started with, once it raised its own.
static STARTED_NOFILE: std::sync::OnceLock<rustix::process::Rlimit> = std::sync::OnceLock::new();

/// Raises durun's own soft limit of open files to its hard limit: the
/// model proxy holds two descriptors per stream (the agent's connection
/// and the upstream's), and 1,000 streams are more than the usual 1,024.
/// The agent and tools get the limit durun started with back (programs
/// that use `select` break on descriptors above 1,024).
pub(crate) fn raise_open_files() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let started = getrlimit(Resource::Nofile);
    if started.current >= started.maximum || STARTED_NOFILE.get().is_some() {
        return;
    }
    let raised = Rlimit {
        current: started.maximum,
        maximum: started.maximum,
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        let _ = STARTED_NOFILE.set(started);
    }
}

/// Makes `command` get SIGKILL when durun dies (Linux), so that no agent or
/// tool outlives its runner, even when durun itself is killed with SIGKILL.
pub(crate) fn die_with_parent(command: &mut Command) {
    before_exec(command, Some(rustix::process::getpid()));
}

/// Gives `command` the open-file limit durun started with, not the one it
/// raised for itself.
pub(crate) fn restore_open_files(command: &mut Command) {
    before_exec(command, None);
}

/// What a started program gets between fork and exec: the open-file limit
/// durun started with, and SIGKILL when `parent` dies.
fn before_exec(command: &mut Command, parent: Option<Pid>) {
    let nofile = STARTED_NOFILE.get().copied();
    // SAFETY: the closure runs between fork and exec and makes only raw
    // system calls (prctl, setrlimit, getppid), which are async-signal-safe;
    // it neither allocates nor locks.
    unsafe {
        command.pre_exec(move || {
            if let Some(limit) = &nofile {
                rustix::process::setrlimit(rustix::process::Resource::Nofile, *limit)?;
            }
            if let Some(parent) = parent {
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                // The parent may have died before prctl took effect.
                if rustix::process::getppid() != Some(parent) {
                    return Err(io::Error::other("durun exited while starting the process"));
                }
            }
            Ok(())
        });
    }
}

/// Points this process's stdin, stdout and stderr at `/dev/null`, letting
/// go of whatever pipes they were.
pub(crate) fn stdio_to_null() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}

/// Sends `signal` to one process. A process that is already gone is fine.
pub(crate) fn signal_process(pid: u32, signal: Signal) {
    // pid 0 would mean durun's own process group.
    if let Some(pid) = pid_of(pid) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Sends `signal` to every process in the group `pgid`.
pub(crate) fn signal_group(pgid: u32, signal: Signal) {
    // Group 0 would mean durun's own.
    if let Some(pgid) = pid_of(pgid) {
        let _ = rustix::process::kill_process_group(pgid, signal);
    }
}

/// A positive pid; 0 and what does not fit are none.
fn pid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// Whether fd 0 is a terminal.
pub(crate) fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal as _;
    io::stdin().is_terminal()
}

/// A pipe whose two ends are non-blocking and closed on exec: other threads
/// write a byte to the second to wake a `poll` on the first.
pub(crate) fn wake_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pipe::PipeFlags;
    Ok(rustix::pipe::pipe_with(
        PipeFlags::NONBLOCK | PipeFlags::CLOEXEC,
    )?)
}

/// Makes reads and writes on `fd` return `WouldBlock` instead of waiting.
pub(crate) fn set_nonblocking(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::io::ioctl_fionbio(fd, true)?)
}

/// Waits until one of `fds` is ready or `timeout` passes; an interrupted
/// wait counts as a timeout.
pub(crate) fn poll(fds: &mut [PollFd<'_>], timeout: std::time::Duration) -> io::Result<()> {
    let timeout = rustix::time::Timespec {
        tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    match rustix::event::poll(fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// A descriptor to poll for `flags`.
pub(crate) fn poll_fd(fd: &impl AsFd, flags: PollFlags) -> PollFd<'_> {
    PollFd::new(fd, flags)
}

/// Time since boot, counting time the machine was suspended: a lease must
/// age across a laptop lid or a paused VM, which `Instant` does not see.
///
/// rustix reads the vDSO's address as libc does (`use-libc-auxv` in
/// Cargo.toml): asking the kernel instead, durun died with SIGSEGV at its
/// first lease under valgrind, which does not map the kernel's vDSO.
pub(crate) fn boot_clock() -> std::time::Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    std::time::Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Whether the file system that holds (or would hold) `path` is mounted
/// read-only.
pub(crate) fn read_only_mount(path: &std::path::Path) -> bool {
    let existing = path
        .ancestors()
        .find(|ancestor| !ancestor.as_os_str().is_empty() && ancestor.exists())
        .unwrap_or(std::path::Path::new("."));
    rustix::fs::statvfs(existing)
        .is_ok_and(|stat| stat.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

/// Writes one byte to a wake pipe. A full pipe already wakes its reader,
/// and a pipe whose read end lives cannot fail otherwise.
pub(crate) fn wake(fd: impl AsFd) {
    let _ = rustix::io::write(fd, b"!");
}

/// Reads a non-blocking wake pipe empty.
pub(crate) fn drain(fd: impl AsFd) {
    let mut buffer = [0u8; 256];
    while rustix::io::read(&fd, &mut buffer).is_ok_and(|n| n > 0) {}
}
