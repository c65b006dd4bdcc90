//! Starting the agent, or a command tool, under its keeper.
//!
//! Every process the agent starts must end with its run, even when durun
//! is killed with SIGKILL: the agent runs under a keeper
//! ([`crate::keeper`]), which holds the read end of a lifeline pipe and
//! says the agent's pid on a status pipe. The nursery ([`crate::nursery`])
//! makes the keeper by cloning itself, with no exec; where there is no
//! nursery, durun's own binary is exec'd as the keeper, its two pipes
//! placed on fixed descriptors between fork and exec.
//!
//! The agent starts as `std::process::Command` starts a child: signals
//! ignored by whoever started durun stay ignored (`trap '' QUIT` holds for
//! the agent too), SIGPIPE is back to its default, and the signal mask is
//! empty. Linux only (the child subreaper), as durun is.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Stdio};

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
    /// The child leads a process group of its own (a tool, whose group is
    /// ended with its step); else it is in durun's foreground group, so
    /// that Ctrl-C reaches it (the agent).
    pub(crate) own_group: bool,
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
    /// The keeper's status pipe, on which it says the agent's exit
    /// ([`crate::keeper::read_exit`]).
    pub(crate) status: OwnedFd,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: ChildStdout,
    pub(crate) stderr: Option<ChildStderr>,
}

/// Keepers that said their agent's exit and are ending: reaped by the
/// next spawn (a worker's next task), or by init once durun exits.
static ENDING: std::sync::Mutex<Vec<rustix::process::Pid>> = std::sync::Mutex::new(Vec::new());

/// Leaves `keeper`, which said its agent's exit, to be reaped later: its
/// own end (the tear-down of a process) is not worth waiting for.
pub(crate) fn let_go(keeper: rustix::process::Pid) {
    ENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(keeper);
}

/// Reaps the keepers left by [`let_go`] that have ended.
fn reap_ended() {
    ENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|&keeper| {
            matches!(
                rustix::process::waitpid(Some(keeper), rustix::process::WaitOptions::NOHANG),
                Ok(None)
            )
        });
}

/// Starts `plan` under a keeper: the agent and every process it starts
/// end with its run, or when durun dies.
pub(crate) fn spawn(plan: &Plan<'_>) -> io::Result<Spawned> {
    reap_ended();
    if plan.argv.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command"));
    }
    let argv: Vec<OsString> = plan.argv.iter().map(OsString::from).collect();
    let env = environment(plan);
    if argv
        .iter()
        .chain(env.iter().flat_map(|(name, value)| [name, value]))
        .any(|string| string.as_bytes().contains(&0))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or variable holds a NUL byte",
        ));
    }
    let (durun, child) = pipes(plan)?;
    let request = crate::nursery::Request {
        argv: &argv,
        env: &env,
        cwd: plan.cwd,
        stdio: child.stdio(),
        lifeline: child.lifeline.as_fd(),
        status: child.status.as_fd(),
        own_group: plan.own_group,
    };
    let from_nursery = crate::nursery::keeper(&request);
    let exec_keeper = if from_nursery {
        None
    } else {
        Some(exec_keeper(&request)?)
    };
    drop(child);
    let (keeper, agent) = match crate::keeper::read_status(&durun.status) {
        // The nursery could not clone itself (a process limit, a seccomp
        // filter): exec the keeper, now and from now on.
        Some(status) if from_nursery && status.keeper == 0 => {
            crate::nursery::forget();
            return spawn(plan);
        }
        Some(status) => {
            let keeper = exec_keeper.unwrap_or(status.keeper);
            match status.agent {
                Ok(agent) => (keeper, agent),
                Err(err) => {
                    // The keeper exits at once when it could not start the
                    // agent.
                    reap(keeper);
                    return Err(err);
                }
            }
        }
        None => {
            if let Some(keeper) = exec_keeper {
                reap(keeper);
                return Err(crate::keeper::ended_without_a_word());
            }
            // No keeper took the request: the nursery went away with it.
            // (A keeper that took it and died said so first: asking again
            // would start a second agent.)
            crate::nursery::forget();
            return spawn(plan);
        }
    };
    Ok(Spawned {
        keeper,
        pid: agent,
        lifeline: durun.lifeline,
        status: durun.status,
        stdin: ChildStdin::from(durun.stdin),
        stdout: ChildStdout::from(durun.stdout),
        stderr: durun.stderr.map(ChildStderr::from),
    })
}

/// Waits for `pid`, a keeper of durun's that is ending; none for 0 (the
/// nursery said it could not make one).
fn reap(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
}

/// Execs durun's own binary as the keeper of `request` (there is no
/// nursery) and sends it the request on its stdin, a socket, as the
/// nursery's spare takes one; its pid.
fn exec_keeper(request: &crate::nursery::Request<'_>) -> io::Result<u32> {
    let exe = crate::keeper::exe()?;
    let (mut ours, theirs) = UnixStream::pair()?;
    let mut command = std::process::Command::new(exe);
    command
        .arg(crate::nursery::ARG)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::null());
    // The agent gets the open-file limit durun started with, as from the
    // nursery, which was forked before durun raised its own.
    crate::os::restore_open_files(&mut command);
    let mut keeper = match command.spawn() {
        Ok(keeper) => keeper,
        Err(err) if std::fs::metadata(exe).is_err() => {
            return Err(io::Error::other(KeeperMissing(format!(
                "cannot start durun's own binary {} to keep the agent: {err}",
                exe.to_string_lossy()
            ))));
        }
        Err(err) => return Err(err),
    };
    drop(command);
    if let Err(err) = crate::nursery::send(&mut ours, request) {
        // The keeper reads the end of its socket and exits.
        drop(ours);
        let _ = keeper.wait();
        return Err(err);
    }
    Ok(keeper.id())
}

/// Waits for the end of a child started by [`spawn`] whose `keeper` and
/// `status` pipe these are: the child's exit status, as its keeper says it
/// once nothing the child started is left, or the keeper's own, which is
/// the child's.
pub(crate) fn wait_for_end(keeper: u32, status: &OwnedFd) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt as _;
    let Some(pid) = i32::try_from(keeper)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return std::process::ExitStatus::from_raw(127 << 8);
    };
    if let Some(exited) = crate::keeper::read_exit(status) {
        let_go(pid);
        return exited;
    }
    loop {
        match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => return std::process::ExitStatus::from_raw(status.as_raw()),
            Err(rustix::io::Errno::INTR) => {}
            _ => return std::process::ExitStatus::from_raw(127 << 8),
        }
    }
}

/// The child's environment: durun's, with `plan.env` set on top.
fn environment(plan: &Plan<'_>) -> Vec<(OsString, OsString)> {
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
    env
}

/// durun's ends of the child's pipes.
struct DurunEnds {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: Option<OwnedFd>,
    lifeline: OwnedFd,
    status: OwnedFd,
}

/// The child's ends, held open until it has started.
struct ChildEnds {
    /// stdin, stdout, stderr; none where the child gets durun's own.
    stdio: [Option<OwnedFd>; 3],
    lifeline: OwnedFd,
    status: OwnedFd,
}

impl ChildEnds {
    /// The agent's stdio, durun's own where it has none of its own.
    fn stdio(&self) -> [BorrowedFd<'_>; 3] {
        let mut stdio = [
            rustix::stdio::stdin(),
            rustix::stdio::stdout(),
            rustix::stdio::stderr(),
        ];
        for (fd, end) in stdio.iter_mut().zip(&self.stdio) {
            if let Some(end) = end {
                *fd = end.as_fd();
            }
        }
        stdio
    }
}

/// The pipes of a child that `plan` describes. All are close-on-exec: the
/// keeper gets them over its socket, and the child its own copies.
fn pipes(plan: &Plan<'_>) -> io::Result<(DurunEnds, ChildEnds)> {
    let (child_stdin, stdin) = pipe()?;
    let (stdout, child_stdout) = pipe()?;
    let (child_lifeline, lifeline) = pipe()?;
    let (status, child_status) = pipe()?;
    let (child_stdin, child_stdout) = match plan.stdin {
        crate::config::StdinMode::Protocol => (Some(child_stdin), Some(child_stdout)),
        crate::config::StdinMode::Null => (Some(std::fs::File::open("/dev/null")?.into()), None),
        crate::config::StdinMode::Inherit => (None, None),
    };
    let (stderr, child_stderr) = if plan.pipe_stderr {
        let (read, write) = pipe()?;
        (Some(read), Some(write))
    } else {
        (None, None)
    };
    Ok((
        DurunEnds {
            stdin,
            stdout,
            stderr,
            lifeline,
            status,
        },
        ChildEnds {
            stdio: [child_stdin, child_stdout, child_stderr],
            lifeline: child_lifeline,
            status: child_status,
        },
    ))
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

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = std::io::pipe()?;
    Ok((read.into(), write.into()))
}
