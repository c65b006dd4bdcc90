//! The keeper: the process between durun and the agent that makes every
//! process the agent starts belong to its run (SPEC 17).
//!
//! A parent-death signal reaches only the process that set it: a
//! grandchild that calls `setsid`, a double fork, a native binary under a
//! `node` launcher all outlived a killed durun. So every agent gets a
//! keeper of its own, which starts it: a clone of the nursery, or, where
//! there is none, durun's own binary exec'd as `durun __keeper`, which
//! takes the same request on its stdin (both in `nursery.rs`). The keeper
//! is a child subreaper: whatever the agent leaves behind, at any depth
//! and in any session, is re-parented to it rather than to init, so it
//! always has the whole tree below it.
//!
//! - The agent exits: the keeper ends what is left (SIGTERM, then SIGKILL
//!   after [`GRACE`]), then exits with the agent's own status, which is what
//!   durun sees.
//! - durun dies, by any signal: the lifeline pipe, whose write end only
//!   durun holds, reads end-of-file; the keeper SIGKILLs the agent and every
//!   process below it, then exits.
//!
//! It needs nothing from the host (no cgroup delegation, no namespaces, no
//! root), and costs about 0.4 ms of an agent's start (docs/performance.md,
//! docs/reliability.md). A process that escapes it must leave the tree
//! with a new parent that is not below the keeper, which only a process
//! that ptraces or is re-parented by a privileged helper can do.
//!
//! The keeper's stdin, stdout and stderr are `/dev/null` once the agent has
//! started, so that the agent's pipes close when the agent's tree is gone.
//! Signals meant for the run go to the agent, whose pid durun learns from
//! the keeper; the keeper itself shrugs off SIGINT, SIGTERM, SIGHUP and
//! SIGQUIT (a `pkill durun` reaches it too) and lives in a process group of
//! its own, so that a kill of durun's group leaves it to clean up.

use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;
use rustix::process::{Pid, Signal, WaitOptions};

/// How long what the agent left behind has between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_millis(500);

/// How long the keeper tries to end processes it may not be able to signal
/// (a setuid program) before it gives up on them.
const GIVE_UP: Duration = Duration::from_secs(3);

/// What the keeper writes on the status pipe: a tag byte and a number.
///
/// It took the request (the number is 0), before it starts anything: a
/// status pipe that then closes without [`STARTED`] or [`FAILED`] means
/// the keeper died, not that the request never reached one (only then may
/// durun ask again, or it would start the agent twice).
pub(crate) const TOOK: u8 = b'T';
pub(crate) const STARTED: u8 = b'P';
pub(crate) const FAILED: u8 = b'E';
/// The agent exited (the number is its wait status) and nothing it
/// started is left.
pub(crate) const EXITED: u8 = b'X';

/// What a keeper starts, and how.
pub(crate) struct Charge {
    /// The program (found on the agent's `PATH`) and its arguments.
    pub(crate) argv: Vec<std::ffi::OsString>,
    pub(crate) group: Group,
    pub(crate) setup: Setup,
}

/// The process group the program starts in.
pub(crate) enum Group {
    /// One of its own (a tool, whose group a timeout ends).
    Own,
    /// This one (durun's, read before the keeper leaves it): Ctrl-C reaches
    /// the agent.
    Join(i32),
}

/// The program's environment, directory and stdio.
pub(crate) struct Setup {
    pub(crate) env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    pub(crate) cwd: std::path::PathBuf,
    /// stdin, stdout and stderr.
    pub(crate) stdio: [OwnedFd; 3],
}

/// The keeper's life; returns its exit code where it does not end by the
/// agent's signal.
pub(crate) fn keep(charge: Charge, lifeline: &OwnedFd, status: OwnedFd) -> i32 {
    // Neither may reach the agent.
    for fd in [lifeline, &status] {
        let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
    }
    let mut status = std::fs::File::from(status);
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    let _ = status.write_all(&said(TOOK, 0));
    let agent = match start(charge) {
        Ok(agent) => agent,
        Err(err) => {
            let errno = err
                .raw_os_error()
                .unwrap_or(rustix::io::Errno::IO.raw_os_error());
            let _ = status.write_all(&said(FAILED, errno));
            return 127;
        }
    };
    let _ = status.write_all(&said(STARTED, agent as i32));
    settle_in();
    let Some(agent) = Pid::from_raw(agent as i32) else {
        return 127;
    };
    let Ok(children) = Children::new() else {
        // Without SIGCHLD's pipe the keeper can only wait for the agent.
        return exit_code_of(wait_for(agent));
    };
    match children.until_agent_exits(agent, lifeline) {
        Some(agent_status) => {
            // Nothing is left to end: durun may go on at once, rather than
            // when this process is gone.
            if !any_child_left() {
                let _ = status.write_all(&said(EXITED, agent_status.into_raw()));
            }
            drop(status);
            children.end_the_rest(lifeline);
            exit_code_of(agent_status)
        }
        None => {
            // durun is gone: nothing of its run may go on.
            let _ = rustix::process::kill_process(agent, Signal::KILL);
            end_tree(Signal::KILL, &children, Instant::now() + GIVE_UP);
            137
        }
    }
}

/// Starts the keeper's charge; its pid.
fn start(charge: Charge) -> std::io::Result<u32> {
    let group = match charge.group {
        Group::Own => 0,
        Group::Join(group) => group,
    };
    let setup = charge.setup;
    // In the keeper, not the child: a relative program is found from the
    // agent's directory, as after an exec there.
    std::env::set_current_dir(&setup.cwd)?;
    crate::launch::launch(&charge.argv, &setup.env, &setup.stdio, group)
}

/// The keeper's own house-keeping once the agent runs: its stdio lets go of
/// the agent's pipes, it leaves durun's process group, and the signals
/// that stop durun do not stop it. Done after the agent started, so that
/// the agent inherits durun's dispositions, not these.
fn settle_in() {
    crate::os::stdio_to_null();
    let _ = rustix::process::setpgid(None, None);
    let shrugged = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [
        Signal::INT.as_raw(),
        Signal::TERM.as_raw(),
        Signal::HUP.as_raw(),
        Signal::QUIT.as_raw(),
    ] {
        let _ = signal_hook::flag::register(signal, std::sync::Arc::clone(&shrugged));
    }
    // The keeper dies of the agent's signal at its end (exit_code_of): it
    // leaves no core file of its own.
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Core,
        rustix::process::Rlimit {
            current: Some(0),
            maximum: None,
        },
    );
}

/// The keeper's children, as SIGCHLD tells of them through a pipe.
struct Children {
    /// Read end: a byte per SIGCHLD (some may be merged).
    wake: OwnedFd,
}

impl Children {
    fn new() -> std::io::Result<Self> {
        let (wake, notify) = crate::os::wake_pipe()?;
        signal_hook::low_level::pipe::register(Signal::CHILD.as_raw(), notify)?;
        Ok(Self { wake })
    }

    /// Reaps children until the agent exits (its status) or durun dies
    /// (none).
    fn until_agent_exits(&self, agent: Pid, lifeline: &OwnedFd) -> Option<ExitStatus> {
        loop {
            loop {
                match rustix::process::wait(WaitOptions::NOHANG) {
                    Ok(Some((pid, status))) if pid == agent => {
                        return Some(ExitStatus::from_raw(status.as_raw()));
                    }
                    // An orphan that came to the keeper and ended.
                    Ok(Some(_)) | Err(rustix::io::Errno::INTR) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            if !self.sleep(lifeline, None) {
                return None;
            }
        }
    }

    /// Ends what the agent left behind: SIGTERM, then SIGKILL after
    /// [`GRACE`]; returns once nothing is left.
    fn end_the_rest(&self, lifeline: &OwnedFd) {
        if !any_child_left() {
            return;
        }
        let deadline = Instant::now() + GRACE;
        if signal_tree(Signal::TERM) > 0 {
            while any_child_left() && Instant::now() < deadline {
                if !self.sleep(lifeline, Some(deadline)) {
                    break;
                }
            }
        }
        end_tree(Signal::KILL, self, Instant::now() + GIVE_UP);
    }

    /// Waits for a SIGCHLD, the lifeline, or `until`; false once durun is
    /// gone.
    fn sleep(&self, lifeline: &OwnedFd, until: Option<Instant>) -> bool {
        let mut fds = [
            crate::os::poll_fd(&self.wake, PollFlags::IN),
            crate::os::poll_fd(lifeline, PollFlags::IN),
        ];
        let timeout = until.map_or(Duration::from_secs(3600), |until| {
            until.saturating_duration_since(Instant::now())
        });
        let _ = crate::os::poll(&mut fds, timeout);
        let durun_gone = !fds[1].revents().is_empty();
        crate::os::drain(&self.wake);
        !durun_gone
    }
}

/// Whether the keeper has any child left, reaping those that have ended.
fn any_child_left() -> bool {
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some(_)) | Err(rustix::io::Errno::INTR) => {}
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// Signals every process below the keeper with `signal` until none is
/// left or `give_up` passes.
fn end_tree(signal: Signal, children: &Children, give_up: Instant) {
    loop {
        signal_tree(signal);
        if !any_child_left() || Instant::now() >= give_up {
            return;
        }
        // A child that ignores nothing dies at once: wait for its SIGCHLD,
        // briefly, and look again (it may have forked in between).
        let mut fds = [crate::os::poll_fd(&children.wake, PollFlags::IN)];
        let _ = crate::os::poll(&mut fds, Duration::from_millis(20));
        crate::os::drain(&children.wake);
    }
}

/// Sends `signal` to every live process below the keeper; how many.
fn signal_tree(signal: Signal) -> usize {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let below = descendants(me, &processes());
    for &pid in &below {
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }
    below.len()
}

/// Every process's (pid, parent pid), zombies left out, from /proc.
fn processes() -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut buffer = String::new();
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            buffer.clear();
            std::fs::File::open(entry.path().join("stat"))
                .ok()?
                .read_to_string(&mut buffer)
                .ok()?;
            let (state, parent) = state_and_parent(&buffer)?;
            (state != 'Z').then_some((pid, parent))
        })
        .collect()
}

/// The state and parent pid in a /proc/PID/stat line. The command's name
/// may hold spaces and parentheses: the fields are read after its last `)`.
fn state_and_parent(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

/// The pids below `root` in `processes`.
fn descendants(root: i32, processes: &[(i32, i32)]) -> Vec<i32> {
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            processes
                .iter()
                .filter(|&&(_, of)| of == parent)
                .map(|&(pid, _)| pid),
        );
        next += 1;
    }
    found.remove(0);
    found
}

/// Waits for one process and gives its status.
fn wait_for(pid: Pid) -> ExitStatus {
    loop {
        match rustix::process::waitpid(Some(pid), WaitOptions::empty()) {
            Ok(Some((_, status))) => return ExitStatus::from_raw(status.as_raw()),
            Err(rustix::io::Errno::INTR) | Ok(None) => {}
            Err(_) => return ExitStatus::from_raw(127 << 8),
        }
    }
}

/// Exits as the agent did: its code, or its signal.
fn exit_code_of(status: ExitStatus) -> i32 {
    if let Some(signal) = status.signal() {
        let _ = signal_hook::low_level::emulate_default_handler(signal);
        // A signal whose default is not to end (it cannot be the agent's).
        return 128 + signal;
    }
    status.code().unwrap_or(127)
}

/// A status-pipe message: the tag, a number and the keeper's pid,
/// little-endian.
pub(crate) fn said(tag: u8, number: i32) -> [u8; 9] {
    let mut message = [tag, 0, 0, 0, 0, 0, 0, 0, 0];
    message[1..5].copy_from_slice(&number.to_le_bytes());
    let keeper = rustix::process::getpid().as_raw_nonzero().get();
    message[5..].copy_from_slice(&keeper.to_le_bytes());
    message
}

/// What a keeper said on its status pipe.
pub(crate) struct Status {
    /// The process that said it (the keeper; the nursery, when it could not
    /// make one).
    pub(crate) keeper: u32,
    /// The agent's pid, or the error that kept it from starting.
    pub(crate) agent: std::io::Result<u32>,
}

/// What the keeper said on its status pipe; none if the pipe closed
/// before any keeper took the request (the nursery went away with it).
/// Read by durun's spawn.
pub(crate) fn read_status(pipe: impl AsFd) -> Option<Status> {
    let mut took = None;
    loop {
        let Some(message) = read_message(&pipe) else {
            // A keeper that took the request and died before it said more:
            // its agent, if it started, dies with it (its parent-death
            // signal).
            return took.map(|keeper| Status {
                keeper,
                agent: Err(ended_without_a_word()),
            });
        };
        let (keeper, number) = (keeper_of(&message), number_of(&message));
        let agent = match message[0] {
            TOOK => {
                took = Some(keeper);
                continue;
            }
            STARTED => u32::try_from(number).map_err(|_| std::io::Error::other("a bad pid")),
            _ => Err(std::io::Error::from_raw_os_error(number)),
        };
        return Some(Status { keeper, agent });
    }
}

/// One whole status-pipe message; none at the pipe's end.
fn read_message(pipe: &impl AsFd) -> Option<[u8; 9]> {
    let mut message = [0u8; 9];
    let mut got = 0;
    while got < message.len() {
        match rustix::io::read(pipe, &mut message[got..]) {
            Ok(n) if n > 0 => got += n,
            Err(rustix::io::Errno::INTR) => {}
            _ => return None,
        }
    }
    Some(message)
}

/// The agent's exit as its keeper said it on the status pipe; none if the
/// keeper closed the pipe without (something of the agent was left, or it
/// died): its own exit says the agent's then.
pub(crate) fn read_exit(pipe: impl AsFd) -> Option<ExitStatus> {
    let mut message = [0u8; 9];
    // Nine bytes, written at once into a pipe: they come at once.
    match rustix::io::read(&pipe, &mut message) {
        Ok(9) if message[0] == EXITED => Some(ExitStatus::from_raw(number_of(&message))),
        _ => None,
    }
}

/// The number of a status-pipe message ([`said`]).
fn number_of(message: &[u8; 9]) -> i32 {
    i32::from_le_bytes([message[1], message[2], message[3], message[4]])
}

/// The pid of the process that wrote a status-pipe message ([`said`]).
fn keeper_of(message: &[u8; 9]) -> u32 {
    u32::from_le_bytes([message[5], message[6], message[7], message[8]])
}

/// A keeper that ended before it said whether the agent started.
pub(crate) fn ended_without_a_word() -> std::io::Error {
    std::io::Error::other("durun's keeper ended before it said whether the agent started")
}

/// durun's own binary, which runs as the keeper: its path, found once.
pub(crate) fn exe() -> std::io::Result<&'static std::ffi::OsString> {
    static EXE: std::sync::OnceLock<std::ffi::OsString> = std::sync::OnceLock::new();
    if let Some(exe) = EXE.get() {
        return Ok(exe);
    }
    let exe = std::env::current_exe()?.into_os_string();
    Ok(EXE.get_or_init(|| exe))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_after_the_commands_last_parenthesis() {
        let stat = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560";
        assert_eq!(state_and_parent(stat), Some(('S', 17)));
        assert_eq!(state_and_parent("1 (init) Z 0 1"), Some(('Z', 0)));
        assert_eq!(state_and_parent("garbage"), None);
    }

    #[test]
    fn descendants_are_found_at_any_depth_and_nothing_else() {
        let processes = [(10, 1), (11, 10), (12, 11), (13, 12), (20, 1), (14, 10)];
        let mut below = descendants(10, &processes);
        below.sort_unstable();
        assert_eq!(below, [11, 12, 13, 14]);
        assert!(descendants(20, &processes).is_empty());
    }

    #[test]
    fn a_status_message_reads_back() {
        let (read, write) = std::io::pipe().expect("pipe");
        let mut write = write;
        write.write_all(&said(STARTED, 4321)).expect("write");
        let status = read_status(&read).expect("a status");
        assert_eq!(status.agent.expect("pid"), 4321);
        assert_eq!(status.keeper, std::process::id());
        write
            .write_all(&said(FAILED, rustix::io::Errno::NOENT.raw_os_error()))
            .expect("write");
        let err = read_status(&read)
            .expect("a status")
            .agent
            .expect_err("an error");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        drop(write);
        assert!(read_status(&read).is_none(), "a keeper that said nothing");
    }

    #[test]
    fn a_keeper_that_took_the_request_and_died_is_not_a_silence() {
        let (read, mut write) = std::io::pipe().expect("pipe");
        write.write_all(&said(TOOK, 0)).expect("write");
        write.write_all(&said(STARTED, 77)).expect("write");
        assert_eq!(
            read_status(&read).expect("a status").agent.expect("pid"),
            77
        );
        write.write_all(&said(TOOK, 0)).expect("write");
        drop(write);
        let status = read_status(&read).expect("the keeper spoke");
        assert_eq!(status.keeper, std::process::id());
        assert!(status.agent.is_err(), "no agent to wait for");
    }
}
