//! The few Unix calls durun needs: parent-death signals, process groups,
//! sending signals, and waiting on pipes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// Makes `command` get SIGKILL when durun dies (Linux), so that no agent or
/// tool outlives its runner, even when durun itself is killed with SIGKILL.
pub(crate) fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid).
    unsafe {
        command.pre_exec(move || {
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::other("durun exited while starting the process"));
            }
            Ok(())
        });
    }
}

/// Puts `command` in a process group of its own, so that a timeout or a
/// cancel can end the whole tree it starts.
pub(crate) fn own_process_group(command: &mut Command) {
    command.process_group(0);
}

/// Sends `signal` to one process. A process that is already gone is fine.
pub(crate) fn signal_process(pid: u32, signal: i32) {
    // pid 0 would mean durun's own process group.
    if pid == 0 {
        return;
    }
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// Sends `signal` to every process in the group `pgid`.
pub(crate) fn signal_group(pgid: u32, signal: i32) {
    // Group 0 would mean durun's own.
    if pgid == 0 {
        return;
    }
    // SAFETY: killpg has no memory-safety preconditions.
    unsafe {
        libc::killpg(pgid as libc::pid_t, signal);
    }
}

/// Whether fd 0 is a terminal.
pub(crate) fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal as _;
    io::stdin().is_terminal()
}

/// A pipe whose two ends are non-blocking and closed on exec: other threads
/// write a byte to the second to wake a `poll` on the first.
pub(crate) fn wake_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors that we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes reads and writes on `fd` return `WouldBlock` instead of waiting.
pub(crate) fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor the caller keeps open.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until one of `fds` is ready or `timeout` passes; an interrupted
/// wait counts as a timeout.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: std::time::Duration) -> io::Result<()> {
    let millis = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // A timeout under a millisecond still waits (0 would only peek).
    let millis = if millis == 0 && !timeout.is_zero() {
        1
    } else {
        millis
    };
    // SAFETY: the slice is valid for its length for the whole call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    if ready < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}

/// Time since boot, counting time the machine was suspended: a lease must
/// age across a laptop lid or a paused VM, which `Instant` does not see.
pub(crate) fn boot_clock() -> std::time::Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the given pointer.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut now) } == 0;
    if !ok {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Whether the file system that holds (or would hold) `path` is mounted
/// read-only.
pub(crate) fn read_only_mount(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let existing = path
        .ancestors()
        .find(|ancestor| !ancestor.as_os_str().is_empty() && ancestor.exists())
        .unwrap_or(std::path::Path::new("."));
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

/// Writes one byte to a wake pipe. A full pipe already wakes its reader,
/// and a pipe whose read end lives cannot fail otherwise.
pub(crate) fn wake(fd: &impl AsRawFd) {
    // SAFETY: a one-byte write from a live buffer to an open descriptor.
    unsafe {
        libc::write(fd.as_raw_fd(), b"!".as_ptr().cast(), 1);
    }
}

/// Reads a non-blocking wake pipe empty.
pub(crate) fn drain(fd: &impl AsRawFd) {
    let mut buffer = [0u8; 256];
    // SAFETY: reads into a live buffer of the given size.
    while unsafe { libc::read(fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) } > 0 {}
}
