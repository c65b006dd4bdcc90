//! The few Unix calls durun needs: parent-death signals, process groups,
//! and sending signals.

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// Makes `command` get SIGKILL when durun dies (Linux), so that no agent or
/// tool outlives its runner, even when durun itself is killed with SIGKILL.
pub fn die_with_parent(command: &mut Command) {
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
pub fn own_process_group(command: &mut Command) {
    command.process_group(0);
}

/// Sends `signal` to one process. A process that is already gone is fine.
pub fn signal_process(pid: u32, signal: i32) {
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
pub fn signal_group(pgid: u32, signal: i32) {
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
pub fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal as _;
    io::stdin().is_terminal()
}
