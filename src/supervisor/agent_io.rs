//! The agent's end of the protocol: its stdout read and its stdin written
//! without blocking, from the loop's own thread (`poll`).
//!
//! # Invariant
//!
//! Answers go out in the order they were pushed, whole lines only; a line
//! the agent printed that is not a request is handed to the passthrough or
//! held, and while one is held the agent's stdout is not read, so no print
//! is dropped and none overtakes another.

use std::io::{BufReader, Write as _};
use std::os::fd::OwnedFd;
use std::process::{ChildStdin, ChildStdout};
use std::time::{Duration, Instant};

use super::lines::LineReader;
use super::passthrough::Passthrough;
use crate::os;
use crate::os::PollFlags;
use crate::protocol::Response;

/// How long the loop looks for the agent's next request before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// The agent's end of the protocol: its stdout, read without blocking, and
/// its stdin, written without blocking from a buffer.
pub(super) struct AgentIo {
    pub(super) reader: LineReader<BufReader<ChildStdout>>,
    pub(super) stdin: Option<ChildStdin>,
    /// Answers not yet taken by the agent's stdin pipe: `out[sent..]`.
    pub(super) out: Vec<u8>,
    pub(super) sent: usize,
    /// When an answer last went out, for the short spin in `wait`.
    pub(super) answered_at: Option<Instant>,
    pub(super) wake: OwnedFd,
    /// Copies the agent's prints to durun's stdout, off the loop, so a slow
    /// reader of durun's stdout holds up only the agent's prints.
    pub(super) passthrough: Passthrough,
    /// A print the copier had no room for: until it goes, the agent's
    /// stdout is not read (the agent waits, as it would without durun).
    pub(super) held: Option<Vec<u8>>,
    /// When the agent's stdout last gave bytes, for the drain after exit.
    pub(super) read_at: Instant,
    /// The agent's pidfd, polled with the rest: its exit wakes the loop
    /// itself, with no thread waiting for it. Taken once it is reaped.
    exit: Option<(OwnedFd, rustix::process::Pid)>,
    /// The pidfd said the agent has exited.
    exit_ready: bool,
    /// The keeper's status pipe, on which it says the agent's exit as soon
    /// as nothing of the agent is left (before its own, which costs the
    /// tear-down of a process). Polled with the pidfd.
    status: Option<OwnedFd>,
    /// The status pipe has something to read (or closed).
    status_ready: bool,
}

impl AgentIo {
    /// Waits for the agent's stdout, room in its stdin (when answers wait),
    /// a client on one of the idle `listeners` (the proxy's, the socket's),
    /// or a wake-up from another thread, at most `wait`. Says which
    /// listeners have a client.
    pub(super) fn wait(
        &mut self,
        wait: Duration,
        read: bool,
        listeners: [Option<std::os::fd::BorrowedFd<'_>>; 2],
    ) -> [bool; 2] {
        let wait = if !read && self.held.is_some() {
            // Try the held line again soon.
            wait.min(Duration::from_millis(10))
        } else if read && self.reader.has_buffered() {
            Duration::ZERO
        } else {
            wait
        };
        let spin_until = self.answered_at.take().map(|at| at + SPIN);
        let stdin = match &self.stdin {
            Some(stdin) if self.sent < self.out.len() => Some(stdin),
            _ => None,
        };
        // The wake pipe first; the agent's stdout when durun reads, its
        // stdin when answers wait for room.
        let mut fds = [
            os::poll_fd(&self.wake, PollFlags::IN),
            os::poll_fd(&self.wake, PollFlags::empty()),
            os::poll_fd(&self.wake, PollFlags::empty()),
            os::poll_fd(&self.wake, PollFlags::empty()),
            os::poll_fd(&self.wake, PollFlags::empty()),
            os::poll_fd(&self.wake, PollFlags::empty()),
            os::poll_fd(&self.wake, PollFlags::empty()),
        ];
        let mut count = 1;
        let exit_at = self.exit.as_ref().map(|(pidfd, _)| {
            fds[count] = os::poll_fd(pidfd, PollFlags::IN);
            count += 1;
            count - 1
        });
        let status_at = self
            .status
            .as_ref()
            .filter(|_| self.exit.is_some())
            .map(|status| {
                fds[count] = os::poll_fd(status, PollFlags::IN);
                count += 1;
                count - 1
            });
        if read {
            fds[count] = os::poll_fd(self.reader.get_ref(), PollFlags::IN);
            count += 1;
        }
        if let Some(stdin) = stdin {
            fds[count] = os::poll_fd(stdin, PollFlags::OUT);
            count += 1;
        }
        let listener_at = listeners.each_ref().map(|listener| {
            listener.as_ref().map(|listener| {
                fds[count] = os::poll_fd(listener, PollFlags::IN);
                count += 1;
                count - 1
            })
        });
        let fds = &mut fds[..count];
        // Right after an answer, the agent's next request usually comes
        // within microseconds: look for it briefly before sleeping, since a
        // wake-up from sleep costs tens of microseconds on many machines.
        let mut ready = false;
        if let Some(until) = spin_until {
            while Instant::now() < until {
                if os::poll(fds, Duration::ZERO).is_ok()
                    && fds.iter().any(|fd| !fd.revents().is_empty())
                {
                    ready = true;
                    break;
                }
                // On a shared core, the agent gets to run.
                std::thread::yield_now();
            }
        }
        if !ready && os::poll(fds, wait).is_err() {
            // Not expected for valid descriptors; a short sleep keeps a
            // failing poll from spinning.
            std::thread::sleep(Duration::from_millis(10));
        }
        if !fds[0].revents().is_empty() {
            os::drain(&self.wake);
        }
        if exit_at.is_some_and(|at| !fds[at].revents().is_empty()) {
            self.exit_ready = true;
        }
        if status_at.is_some_and(|at| !fds[at].revents().is_empty()) {
            self.status_ready = true;
        }
        listener_at.map(|at| at.is_some_and(|at| !fds[at].revents().is_empty()))
    }

    /// Watches the agent's exit through its keeper's pidfd and status pipe
    /// in `wait`'s poll; false where the kernel has no pidfd (before Linux
    /// 5.3): a thread waits then.
    pub(super) fn watch_exit(&mut self, keeper: u32, status: OwnedFd) -> bool {
        self.status = Some(status);
        let Some(pid) = i32::try_from(keeper)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        else {
            return false;
        };
        match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(pidfd) => {
                self.exit = Some((pidfd, pid));
                true
            }
            Err(_) => false,
        }
    }

    /// The agent's exit status, once the pidfd said it exited (it is
    /// reaped here, once).
    pub(super) fn reaped(&mut self) -> Option<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt as _;
        if std::mem::take(&mut self.status_ready)
            && let Some(status) = self.status.take()
            && let Some(exited) = crate::keeper::read_exit(&status)
            && let Some((_, keeper)) = self.exit.take()
        {
            // Its own end, the tear-down of a process, is not waited for.
            crate::spawn::let_go(keeper);
            return Some(exited);
        }
        if !self.exit_ready {
            return None;
        }
        let (_, pid) = self.exit.as_ref()?;
        match rustix::process::waitpid(Some(*pid), rustix::process::WaitOptions::NOHANG) {
            Ok(Some((_, status))) => {
                self.exit = None;
                Some(std::process::ExitStatus::from_raw(status.as_raw()))
            }
            // Not yet (a stop, not an exit): the pidfd says so again.
            Ok(None) | Err(rustix::io::Errno::INTR) => {
                self.exit_ready = false;
                None
            }
            Err(_) => {
                self.exit = None;
                None
            }
        }
    }

    /// Looks for the agent's next request for at most [`SPIN`]; true when
    /// something came.
    pub(super) fn spin_for_more(&self) -> bool {
        let until = Instant::now() + SPIN;
        loop {
            if self.agent_has_more() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Whether the agent wrote more that durun has not read yet.
    pub(super) fn agent_has_more(&self) -> bool {
        if self.reader.has_buffered() {
            return true;
        }
        let mut fds = [os::poll_fd(self.reader.get_ref(), PollFlags::IN)];
        os::poll(&mut fds, Duration::ZERO).is_ok() && fds[0].revents().contains(PollFlags::IN)
    }

    /// Hands the held print to the copier if it has room; true when none
    /// is held.
    pub(super) fn release_held(&mut self) -> bool {
        if let Some(piece) = self.held.take() {
            self.held = self.passthrough.offer(piece).err();
        }
        self.held.is_none()
    }

    /// Hands a print to the copier; false (and held) when it has no room.
    pub(super) fn pass_on(&mut self, piece: Vec<u8>) -> bool {
        self.held = self.passthrough.offer(piece).err();
        self.held.is_none()
    }

    /// Answers written but not yet taken by the agent.
    pub(super) fn unread(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Queues an answer for the agent, unless its stdin is closed.
    pub(super) fn push(&mut self, response: &Response) {
        if self.stdin.is_none() {
            return;
        }
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        } else if self.sent > self.out.len() / 2 {
            // Moves the unsent half down, at most once per byte sent.
            self.out.drain(..self.sent);
            self.sent = 0;
        }
        response.write_line(&mut self.out);
    }

    /// Writes what the agent's stdin pipe takes now.
    pub(super) fn write_out(&mut self) {
        let Some(stdin) = &mut self.stdin else {
            self.out.clear();
            self.sent = 0;
            return;
        };
        while self.sent < self.out.len() {
            match stdin.write(&self.out[self.sent..]) {
                Ok(0) => break,
                Ok(n) => {
                    self.sent += n;
                    self.answered_at = Some(Instant::now());
                }
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // A child that closed its stdin gets no more answers;
                    // the loop learns of its exit from the waiter.
                    self.stdin = None;
                    self.out.clear();
                    self.sent = 0;
                    return;
                }
            }
        }
    }
}

impl AgentIo {
    pub(super) fn new(
        stdin: ChildStdin,
        stdout: ChildStdout,
        wake: OwnedFd,
    ) -> anyhow::Result<Self> {
        // The agent started; it dies with durun (parent-death signal) if
        // this fails.
        os::set_nonblocking(&stdin)
            .and_then(|()| os::set_nonblocking(&stdout))
            .map_err(|err| anyhow::anyhow!("failed to set up the agent's pipes: {err}"))?;
        let passthrough = Passthrough::new();
        Ok(Self {
            reader: LineReader::streaming(BufReader::with_capacity(64 * 1024, stdout)),
            stdin: Some(stdin),
            out: Vec::new(),
            sent: 0,
            answered_at: None,
            wake,
            passthrough,
            held: None,
            read_at: Instant::now(),
            exit: None,
            exit_ready: false,
            status: None,
            status_ready: false,
        })
    }
}
