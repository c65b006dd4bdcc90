//! Starting the agent's keeper without copying durun.
//!
//! Every process the agent starts must end with its run, even when durun
//! is killed with SIGKILL: the agent runs under a keeper, durun's own
//! binary started again ([`crate::keeper`]), which holds the read end of a
//! lifeline pipe and says the agent's pid on a status pipe. Both are put
//! on fixed descriptors in the child, between its start and `exec`.
//! `std::process::Command` can do that only through `fork`, which copies
//! durun's page tables and then faults on every page durun writes until the
//! child has exec'd (0.4 ms of a 5 ms `durun run -- true` here);
//! `posix_spawn`, which does not copy, has no place for it. So the keeper
//! is started as `posix_spawn` does it, with `clone(CLONE_VM |
//! CLONE_VFORK)`: the child runs on a stack of its own in durun's memory
//! while durun waits, sets its stdio, descriptors and directory, and execs.
//!
//! The child starts as `std::process::Command` would start it: signals
//! ignored by whoever started durun stay ignored (`trap '' QUIT` holds for
//! the agent too), SIGPIPE is back to its default (Rust ignores it in
//! durun), and the signal mask is empty; the keeper passes all three on to
//! the agent. Linux only (`clone`, the child subreaper), as durun is.
//!
//! # Invariant
//!
//! Between `clone` and `exec` the child makes only async-signal-safe calls
//! and touches no memory but [`ChildArgs`] and its own stack, which the
//! parent prepared and keeps alive (the parent is suspended until the
//! child execs or exits). The stack has a guard page below it: an
//! overflow faults instead of writing over durun's heap. All signals are
//! blocked across `clone`, and the child resets every handler durun
//! installed to its default before it unblocks them, so no handler of
//! durun's runs in the child.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::Path;
use std::process::{ChildStderr, ChildStdin, ChildStdout};

/// What the child runs.
pub(crate) struct Plan<'a> {
    /// The program as the user gave it (`argv[0]`) and its arguments.
    pub(crate) argv: &'a [String],
    pub(crate) cwd: &'a Path,
    /// `protocol`: the agent's stdin and stdout are pipes to durun; else
    /// its stdin is durun's own or /dev/null and its stdout durun's (the
    /// pipes then read as closed at once).
    pub(crate) stdin: crate::config::StdinMode,
    /// Variables set on top of durun's own environment.
    pub(crate) env: Vec<(&'a str, OsString)>,
    /// The child's stderr is a pipe to durun (else durun's own stderr).
    pub(crate) pipe_stderr: bool,
}

/// A started agent: its keeper's pid, its own, and durun's ends of its
/// pipes.
pub(crate) struct Spawned {
    /// The keeper: the process durun waits for. It exits once the agent
    /// and everything it started have ended, with the agent's status.
    pub(crate) keeper: u32,
    /// The agent: the process durun's signals are for.
    pub(crate) pid: u32,
    /// While durun holds this, the keeper lets the agent live; when it
    /// closes (durun's exit, by any signal), the keeper kills the agent's
    /// whole tree.
    pub(crate) lifeline: OwnedFd,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: ChildStdout,
    pub(crate) stderr: Option<ChildStderr>,
}

/// Everything the child reads, prepared by the parent.
struct ChildArgs {
    /// durun's own binary, run as the keeper.
    keeper: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: CString,
    /// -1: the child keeps durun's stdin.
    stdin: RawFd,
    /// -1: the child keeps durun's stdout.
    stdout: RawFd,
    /// -1: the child keeps durun's stderr.
    stderr: RawFd,
    /// Put on [`crate::keeper::LIFELINE_FD`] and [`crate::keeper::STATUS_FD`].
    lifeline: RawFd,
    status: RawFd,
    /// durun's signal mask, restored in the parent after `clone`.
    mask: libc::sigset_t,
    /// The open-file limit to give back (durun raised its own).
    nofile: Option<libc::rlimit>,
    /// Set by the child when it could not exec: an errno, negative when
    /// durun's own binary could not be exec'd.
    error: libc::c_int,
}

/// Starts `plan` under a keeper: the agent and every process it starts
/// end with its run, or when durun dies.
pub(crate) fn spawn(plan: &Plan<'_>) -> io::Result<Spawned> {
    if plan.argv.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
    }
    // The keeper finds the program on the agent's PATH, as execvp does.
    let argv_storage = [
        crate::keeper::exe()?.as_bytes(),
        crate::keeper::ARG.as_bytes(),
        b"--",
    ]
    .into_iter()
    .chain(plan.argv.iter().map(String::as_bytes))
    .map(cstring)
    .collect::<io::Result<Vec<_>>>()?;
    let env_storage = environment(plan)?;
    let (durun, child) = pipes(plan)?;
    let mut args = ChildArgs {
        keeper: argv_storage[0].clone(),
        argv: null_ended(&argv_storage),
        envp: null_ended(&env_storage),
        cwd: cstring(plan.cwd.as_os_str().as_bytes())?,
        nofile: crate::os::started_open_files().map(|(current, maximum)| libc::rlimit {
            rlim_cur: current,
            rlim_max: maximum,
        }),
        stdin: child.stdin,
        stdout: child.stdout,
        stderr: child.stderr,
        lifeline: child.lifeline.as_raw_fd(),
        status: child.status.as_raw_fd(),
        // SAFETY: a zeroed sigset_t is a valid value to be overwritten.
        mask: unsafe { std::mem::zeroed() },
        error: 0,
    };
    // The child's stack: it makes a few system calls and execs.
    let stack = Stack::new(128 * 1024)?;
    let pid = clone_child(&stack, &mut args)?;
    drop(child);
    drop(stack);
    let agent = match started(&args, &durun.status) {
        Ok(agent) => agent,
        Err(err) => {
            // Reaps the keeper, which exits at once when it could not start
            // the agent.
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
            }
            return Err(err);
        }
    };
    Ok(Spawned {
        keeper: pid as u32,
        pid: agent,
        lifeline: durun.lifeline,
        stdin: ChildStdin::from(durun.stdin),
        stdout: ChildStdout::from(durun.stdout),
        stderr: durun.stderr.map(ChildStderr::from),
    })
}

/// The child's environment: durun's, with `plan.env` set on top, as
/// `NAME=VALUE` strings.
fn environment(plan: &Plan<'_>) -> io::Result<Vec<CString>> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(name, _)| {
            !plan
                .env
                .iter()
                .any(|(set, _)| name.as_bytes() == set.as_bytes())
        })
        .collect();
    env.extend(
        plan.env
            .iter()
            .map(|(name, value)| (OsString::from(name), value.clone())),
    );
    env.into_iter()
        .map(|(name, value)| {
            let mut entry = name.into_vec();
            entry.push(b'=');
            entry.extend(value.into_vec());
            cstring(&entry)
        })
        .collect()
}

/// `strings` as the null-ended pointer array `execve` takes.
fn null_ended(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|string| string.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// durun's ends of the child's pipes.
struct DurunEnds {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: Option<OwnedFd>,
    lifeline: OwnedFd,
    status: OwnedFd,
}

/// The child's ends, held open until it has exec'd; -1 where the child
/// keeps durun's own descriptor.
struct ChildEnds {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    lifeline: OwnedFd,
    status: OwnedFd,
    /// Every descriptor above, owned.
    _held: Vec<OwnedFd>,
}

/// The pipes of a child that `plan` describes. Each child end is above
/// stdio (durun may have started with one closed), and the keeper's two
/// above its own numbers, so that no `dup2` in the child overwrites
/// another's source. All are close-on-exec: `dup2` gives the child its own
/// copies.
fn pipes(plan: &Plan<'_>) -> io::Result<(DurunEnds, ChildEnds)> {
    let (child_stdin, stdin) = pipe()?;
    let (stdout, child_stdout) = pipe()?;
    let (child_lifeline, lifeline) = pipe()?;
    let (status, child_status) = pipe()?;
    let mut held = vec![above_stdio(child_stdin)?, above_stdio(child_stdout)?];
    let (stdin_fd, stdout_fd) = match plan.stdin {
        crate::config::StdinMode::Protocol => (held[0].as_raw_fd(), held[1].as_raw_fd()),
        crate::config::StdinMode::Null => {
            held.push(above_stdio(std::fs::File::open("/dev/null")?.into())?);
            (held[2].as_raw_fd(), -1)
        }
        crate::config::StdinMode::Inherit => (-1, -1),
    };
    let (stderr, stderr_fd) = if plan.pipe_stderr {
        let (read, write) = pipe()?;
        let write = above_stdio(write)?;
        let fd = write.as_raw_fd();
        held.push(write);
        (Some(read), fd)
    } else {
        (None, -1)
    };
    let keeper = crate::keeper::STATUS_FD + 1;
    Ok((
        DurunEnds {
            stdin,
            stdout,
            stderr,
            lifeline,
            status,
        },
        ChildEnds {
            stdin: stdin_fd,
            stdout: stdout_fd,
            stderr: stderr_fd,
            lifeline: above(child_lifeline, keeper)?,
            status: above(child_status, keeper)?,
            _held: held,
        },
    ))
}

/// Starts the child on `stack` with `args`; its pid once it has exec'd
/// or failed.
fn clone_child(stack: &Stack, args: &mut ChildArgs) -> io::Result<libc::pid_t> {
    // SAFETY: see the module's invariant. The stack and `args` outlive the
    // child's use of them: with CLONE_VFORK, clone returns only once the
    // child has exec'd or exited.
    unsafe {
        let top = stack.top();
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&raw mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, &raw mut args.mask);
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_mut(args).cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(
            libc::SIG_SETMASK,
            &raw const args.mask,
            std::ptr::null_mut(),
        );
        if pid < 0 {
            return Err(clone_error);
        }
        Ok(pid)
    }
}

/// The agent's pid, once the child has exec'd the keeper and the keeper
/// said it started the agent; or why either failed.
fn started(args: &ChildArgs, status: &OwnedFd) -> io::Result<u32> {
    // SAFETY: the child wrote it (or not) before clone returned.
    let error = unsafe { std::ptr::read_volatile(&raw const args.error) };
    match error {
        0 => crate::keeper::read_status(status),
        keeper if keeper < 0 => Err(io::Error::other(KeeperMissing(format!(
            "cannot start durun's own binary {} to keep the agent: {}",
            crate::keeper::exe()
                .map_or_else(|_| "?".into(), |exe| exe.to_string_lossy().into_owned()),
            io::Error::from_raw_os_error(-keeper)
        )))),
        _ => Err(io::Error::from_raw_os_error(error)),
    }
}

/// durun's own binary could not be exec'd as the keeper (removed or
/// replaced since durun started): not the agent's fault.
#[derive(Debug)]
pub(crate) struct KeeperMissing(String);

impl std::fmt::Display for KeeperMissing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeeperMissing {}

/// The child, from `clone` to `exec`: async-signal-safe calls only.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's ChildArgs, alive and not touched by the
    // suspended parent; every call is async-signal-safe.
    unsafe {
        let args = &mut *arg.cast::<ChildArgs>();
        // durun's handlers and its ignored SIGPIPE are not the agent's; a
        // signal ignored by whoever started durun stays ignored, as exec
        // and std::process::Command leave it.
        for signal in 1..65 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &raw mut old) != 0 {
                continue;
            }
            if old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
            {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
        // The agent starts with no signal blocked, as std starts a child.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const none, std::ptr::null_mut());
        if (args.stdin >= 0 && libc::dup2(args.stdin, 0) < 0)
            || (args.stdout >= 0 && libc::dup2(args.stdout, 1) < 0)
        {
            return fail(args, *libc::__errno_location());
        }
        if args.stderr >= 0 && libc::dup2(args.stderr, 2) < 0 {
            return fail(args, *libc::__errno_location());
        }
        // dup2 leaves the copies open across exec, for the keeper alone.
        if libc::dup2(args.lifeline, crate::keeper::LIFELINE_FD) < 0
            || libc::dup2(args.status, crate::keeper::STATUS_FD) < 0
        {
            return fail(args, *libc::__errno_location());
        }
        if let Some(limit) = &args.nofile
            && libc::setrlimit(libc::RLIMIT_NOFILE, limit) != 0
        {
            return fail(args, *libc::__errno_location());
        }
        if libc::chdir(args.cwd.as_ptr()) != 0 {
            return fail(args, *libc::__errno_location());
        }
        libc::execve(args.keeper.as_ptr(), args.argv.as_ptr(), args.envp.as_ptr());
        // The keeper is durun's own binary: a failure here is not the
        // agent's (a durun replaced or removed while it runs).
        fail(args, -*libc::__errno_location())
    }
}

/// A stack for the child, with a guard page below it.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new(size: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = size.div_ceil(page) * page + page;
        // SAFETY: a fresh anonymous mapping, owned by this Stack.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // The lowest page faults: a stack grows down into it.
        // SAFETY: the first page of the mapping made above.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top of the stack, 16-byte aligned.
    fn top(&self) -> *mut u8 {
        // SAFETY: one past the end of the mapping, as a stack top is.
        let top = unsafe { self.base.cast::<u8>().add(self.len) };
        top.wrapping_sub(top as usize % 16)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used by any child.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Leaves the child with `error` for the parent to report: an errno, or
/// minus one when the keeper's own exec failed.
///
/// # Safety
/// Only in the child, before exec.
unsafe fn fail(args: &mut ChildArgs, error: libc::c_int) -> libc::c_int {
    // SAFETY: volatile, so the write is not dropped; the parent reads it
    // once the child has exited.
    unsafe {
        let error = if error == 0 { libc::EIO } else { error };
        std::ptr::write_volatile(&raw mut args.error, error);
        libc::_exit(127)
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or variable holds a NUL byte",
        )
    })
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = std::io::pipe()?;
    Ok((read.into(), write.into()))
}

/// `fd`, moved above 2 if it is one of the standard descriptors (durun
/// started with one closed), so that the child's `dup2` onto 0, 1 and 2
/// cannot overwrite another of its pipes.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    above(fd, 3)
}

/// `fd`, or a close-on-exec copy of it at `lowest` or above.
fn above(fd: OwnedFd, lowest: RawFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= lowest {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, lowest)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child's stack has a page below it that no one may touch: an
    /// overflow faults instead of writing over durun's memory.
    #[test]
    fn the_childs_stack_has_a_guard_page() {
        let stack = Stack::new(128 * 1024).expect("a stack");
        let base = stack.base as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let region = |line: &str| -> Option<(usize, usize, String)> {
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            Some((
                usize::from_str_radix(start, 16).ok()?,
                usize::from_str_radix(end, 16).ok()?,
                fields.next()?.to_owned(),
            ))
        };
        let regions: Vec<(usize, usize, String)> = maps.lines().filter_map(region).collect();
        let guard = regions
            .iter()
            .find(|(start, _, _)| *start == base)
            .expect("the mapping's first page");
        assert_eq!(guard.2, "---p", "the first page is not accessible: {maps}");
        let usable = regions
            .iter()
            .find(|(start, _, _)| *start == guard.1)
            .expect("the stack above it");
        assert!(usable.2.starts_with("rw"), "{maps}");
        assert!(stack.top() as usize <= base + stack.len);
        assert_eq!(stack.top() as usize % 16, 0);
    }
}
