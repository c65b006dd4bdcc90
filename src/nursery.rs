//! The nursery: a copy of durun, forked while durun is still one small
//! thread, that makes keepers for it (SPEC 17's start-up budget).
//!
//! Every agent runs under a keeper ([`crate::keeper`]), a process of its
//! own. Exec'ing durun's binary again for it costs about 1 ms a start here
//! (an exec, the loader, Rust's start-up), and forking durun once it runs
//! copies the page tables of a process with threads, a journal and a proxy,
//! whose copy could only exec. So `durun run`, `resume` and `worker` fork
//! the nursery first thing, before any thread or journal exists. For each
//! agent (and each command tool) durun sends the program, its arguments,
//! environment and directory, with its stdio and the keeper's two pipes.
//! The nursery clones itself with `CLONE_PARENT`, which makes the copy
//! durun's own child (durun waits for it as for any child), and the copy
//! becomes the keeper. Nothing is exec'd but the agent. The copy is made
//! before its request comes (a spare keeper waits for it), so a request
//! pays for no clone.
//!
//! The nursery lives in a process group of its own (Ctrl-C and a kill of
//! durun's group are not for it), holds `/dev/null` as its stdio, and exits
//! when durun's end of its socket closes: when durun exits, by any signal.
//! If it is gone (or the command does not start one: `durun mcp`), durun
//! execs its own binary as the keeper, and sends it the same request on its
//! stdin ([`keep_if_asked`]).

use std::ffi::OsString;
use std::io::{self, IoSlice, IoSliceMut, Read as _, Write as _};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::keeper::{Charge, Group, Setup};

/// durun's end of the nursery's socket; none when there is no nursery (not
/// forked, or it went away).
static NURSERY: Mutex<Option<UnixStream>> = Mutex::new(None);

/// The descriptors of a request, in this order: the agent's stdin, stdout
/// and stderr, the read end of the lifeline, the write end of the status
/// pipe.
const FDS: usize = 5;

/// The largest request: more than Linux's 2 MiB for arguments and
/// environment together.
const MAX_REQUEST: usize = 8 << 20;

/// Forks the nursery. Call only while durun has a single thread (a fork
/// copies only the calling thread, so a lock another thread held would
/// stay locked in the copy).
pub(crate) fn open() {
    let Ok((ours, theirs)) = UnixStream::pair() else {
        return;
    };
    // A copy of durun in a process of its own, its child.
    match clone_process(0) {
        Ok(true) => {
            drop(ours);
            serve(theirs)
        }
        Ok(false) => {
            drop(theirs);
            *lock() = Some(ours);
        }
        _ => {}
    }
}

/// What a keeper from the nursery starts.
pub(crate) struct Request<'a> {
    pub(crate) argv: &'a [OsString],
    pub(crate) env: &'a [(OsString, OsString)],
    pub(crate) cwd: &'a std::path::Path,
    /// The agent's stdin, stdout and stderr.
    pub(crate) stdio: [BorrowedFd<'a>; 3],
    /// The keeper's: the read end of its lifeline, the write end of its
    /// status pipe.
    pub(crate) lifeline: BorrowedFd<'a>,
    pub(crate) status: BorrowedFd<'a>,
    /// The charge leads a process group of its own (a tool), rather than
    /// joining durun's (the agent, whom Ctrl-C reaches).
    pub(crate) own_group: bool,
}

/// Has the nursery make a keeper for `request`, a child of durun's, which
/// says its pid and the agent's on the status pipe (the nursery says why
/// there, if it could not make one). False when there is no nursery: the
/// caller execs a keeper.
pub(crate) fn keeper(request: &Request<'_>) -> bool {
    let mut nursery = lock();
    let Some(socket) = nursery.as_mut() else {
        return false;
    };
    if send(socket, request).is_err() {
        // It is gone (killed, out of memory): exec from now on.
        *nursery = None;
        return false;
    }
    true
}

/// Forgets the nursery, which went away with a request: exec from now on.
pub(crate) fn forget() {
    *lock() = None;
}

fn lock() -> std::sync::MutexGuard<'static, Option<UnixStream>> {
    NURSERY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends `request`.
pub(crate) fn send(socket: &mut UnixStream, request: &Request<'_>) -> io::Result<()> {
    let payload = encode(request);
    let length = u32::try_from(payload.len())
        .ok()
        .filter(|&length| length as usize <= MAX_REQUEST)
        .ok_or_else(|| io::Error::from_raw_os_error(rustix::io::Errno::TOOBIG.raw_os_error()))?;
    let fds = [
        request.stdio[0],
        request.stdio[1],
        request.stdio[2],
        request.lifeline,
        request.status,
    ];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    // The descriptors go with the length; the rest follows as a stream.
    let header = length.to_le_bytes();
    let mut sent = 0;
    while sent == 0 {
        match rustix::net::sendmsg(
            socket.as_fd(),
            &[IoSlice::new(&header)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => sent = n,
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
    socket.write_all(&header[sent..])?;
    socket.write_all(&payload)
}

/// A request as bytes: counts and the group, then NUL-ended strings (none
/// holds a NUL: the caller made C strings of them).
fn encode(request: &Request<'_>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(4096);
    bytes.extend(u32::try_from(request.argv.len()).unwrap_or(0).to_le_bytes());
    bytes.extend(u32::try_from(request.env.len()).unwrap_or(0).to_le_bytes());
    bytes.extend(u32::from(request.own_group).to_le_bytes());
    let mut put = |string: &[u8]| {
        bytes.extend_from_slice(string);
        bytes.push(0);
    };
    put(request.cwd.as_os_str().as_bytes());
    for arg in request.argv {
        put(arg.as_bytes());
    }
    for (name, value) in request.env {
        put(name.as_bytes());
        put(value.as_bytes());
    }
    bytes
}

/// A request as the nursery reads it.
#[derive(Debug, PartialEq)]
struct Decoded {
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: PathBuf,
    own_group: bool,
}

/// A request read back; none if it is not one.
fn decode(bytes: &[u8]) -> Option<Decoded> {
    let count = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let (argc, envc, own_group) = (count(0)?, count(4)?, count(8)? == 1);
    let mut strings = bytes.get(12..)?.split(|&byte| byte == 0);
    let mut next = || {
        strings
            .next()
            .map(|string| OsString::from_vec(string.to_vec()))
    };
    let cwd = PathBuf::from(next()?);
    let argv = (0..argc).map(|_| next()).collect::<Option<Vec<_>>>()?;
    let env = (0..envc)
        .map(|_| Some((next()?, next()?)))
        .collect::<Option<Vec<_>>>()?;
    Some(Decoded {
        argv,
        env,
        cwd,
        own_group,
    })
}

/// The nursery's life: a keeper for each request, until durun's end
/// closes. Each keeper is cloned before its request comes (a spare), so
/// that no request waits for a clone: the spare reads the request itself,
/// tells the nursery it took one, and the nursery makes the next (after
/// the first request, once that agent has had its start).
fn serve(socket: UnixStream) -> ! {
    // What `ps` and `top` show.
    let _ = rustix::thread::set_name(c"durun-nursery");
    // A reader of durun's output sees its end when durun ends.
    crate::os::stdio_to_null();
    // The agents join durun's group, read before the nursery leaves it.
    let durun_group = rustix::process::getpgrp().as_raw_nonzero().get();
    let _ = rustix::process::setpgid(None, None);
    let mut first = true;
    loop {
        let (took, taken) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
            Ok(ends) => ends,
            Err(err) => {
                answer_failed(&socket, err.raw_os_error());
                continue;
            }
        };
        match hatch() {
            Ok(Hatched::Nursery) => {
                drop(taken);
                wait_for_the_spare(&socket, &took);
                if std::mem::take(&mut first) {
                    wait_for_need(&socket);
                }
            }
            Ok(Hatched::Keeper) => {
                drop(took);
                spare(socket, taken, durun_group)
            }
            Err(err) => answer_failed(
                &socket,
                err.raw_os_error()
                    .unwrap_or(rustix::io::Errno::IO.raw_os_error()),
            ),
        }
    }
}

/// The nursery, once its spare is out: back when the spare took a request
/// (or died without one while durun lives on); exits once durun is gone.
fn wait_for_the_spare(socket: &UnixStream, took: &OwnedFd) {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut byte = [0u8; 1];
    loop {
        match rustix::io::read(took, &mut byte) {
            Ok(1) => return,
            Err(rustix::io::Errno::INTR) => {}
            // The spare died without a request: durun's end closed (the
            // spare saw it first), or someone killed the spare.
            _ => {
                let mut fds = [PollFd::new(socket, PollFlags::empty())];
                let _ = rustix::event::poll(&mut fds, Some(&Timespec::default()));
                if fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR) {
                    std::process::exit(0)
                }
                return;
            }
        }
    }
}

/// How long the nursery waits, once its spare took the first request,
/// before it makes the next: that request is a run's agent, and a clone
/// made while the agent starts competes with it for the CPU (0.07 to 0.10
/// ms of `durun run -- true`'s 4.5 on two cores, docs/performance.md).
const SPARE_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// The nursery, once its spare took the first request: back when the next
/// request comes or [`SPARE_AFTER`] has passed; exits once durun is gone.
fn wait_for_need(socket: &UnixStream) {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let timeout = Timespec::try_from(SPARE_AFTER).unwrap_or_default();
    let mut fds = [PollFd::new(socket, PollFlags::IN)];
    loop {
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Err(rustix::io::Errno::INTR) => {}
            Ok(_) if fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR) => {
                std::process::exit(0)
            }
            _ => return,
        }
    }
}

/// The spare keeper: takes the next request, says so to the nursery, and
/// keeps its charge; exits once durun's end closes.
fn spare(socket: UnixStream, taken: OwnedFd, durun_group: i32) -> ! {
    // A keeper already, for `ps` and for whoever looks for the nursery.
    let _ = rustix::thread::set_name(c"durun-keeper");
    touch_memory();
    let Some((payload, fds)) = receive(&socket) else {
        // durun is gone.
        std::process::exit(0)
    };
    let _ = rustix::io::write(&taken, &[1]);
    drop(taken);
    // The socket is not the keeper's to hold: durun would not see the
    // nursery's end close.
    drop(socket);
    let (Some(decoded), Ok(fds)) = (decode(&payload), <[OwnedFd; FDS]>::try_from(fds)) else {
        // Not durun's: there is no one to answer.
        std::process::exit(0)
    };
    keep(decoded, fds, durun_group)
}

/// Writes to the stack and the heap a keeper uses to take its request and
/// start its charge. Each page the copy shares with the nursery costs a
/// fault and a copy at its first write: done while the spare waits, not
/// once its request has come (0.06 to 0.11 ms of `durun run -- true`,
/// docs/performance.md).
#[inline(never)]
fn touch_memory() {
    let mut stack = [0u8; 16 * 1024];
    for page in stack.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&mut stack);
    // Freed, they stay with the allocator for the request's strings.
    let heap: Vec<Vec<u8>> = (0..48).map(|_| vec![1u8; 2048]).collect();
    drop(std::hint::black_box(heap));
}

/// The nursery could not make a keeper (a process or descriptor limit):
/// it reads the next request itself and says why on its status pipe, with
/// no keeper for durun to wait for; exits once durun's end closes.
fn answer_failed(socket: &UnixStream, errno: i32) {
    let Some((_, fds)) = receive(socket) else {
        // durun is gone.
        std::process::exit(0)
    };
    if let Some(status) = fds.into_iter().nth(4) {
        let mut status = std::fs::File::from(status);
        let mut said = crate::keeper::said(crate::keeper::FAILED, errno);
        said[5..].fill(0);
        let _ = status.write_all(&said);
    }
}

/// One request: its length and descriptors, then its bytes; none once
/// durun's end is closed or sends what is not a request.
fn receive(socket: &UnixStream) -> Option<(Vec<u8>, Vec<OwnedFd>)> {
    let mut header = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            socket.as_fd(),
            &mut [IoSliceMut::new(&mut header)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(message) => break message.bytes,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return None,
        }
    };
    let mut fds = Vec::with_capacity(FDS);
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got == 0 {
        return None;
    }
    let mut socket = socket;
    socket.read_exact(&mut header[got..]).ok()?;
    let length = u32::from_le_bytes(header) as usize;
    if length > MAX_REQUEST {
        return None;
    }
    let mut payload = vec![0; length];
    socket.read_exact(&mut payload).ok()?;
    Some((payload, fds))
}

/// Which copy returned from [`hatch`].
enum Hatched {
    Nursery,
    /// The copy, a child of durun's.
    Keeper,
}

/// Clones the nursery as a child of durun's.
fn hatch() -> io::Result<Hatched> {
    // CLONE_PARENT gives the copy durun as its parent.
    Ok(if clone_process(libc::CLONE_PARENT)? {
        Hatched::Keeper
    } else {
        Hatched::Nursery
    })
}

/// `fork`, with `flags` too: true in the copy, false in this process. Call
/// only in a process of one thread (durun before its first, the nursery).
fn clone_process(flags: libc::c_int) -> io::Result<bool> {
    // SAFETY: `clone` as `fork` (no new stack, no shared memory) in a
    // process of one thread: the copy is a whole copy of it, no lock held
    // by another thread, and may run any code.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags | libc::SIGCHLD, 0, 0, 0, 0) };
    match pid {
        0 => Ok(true),
        pid if pid > 0 => Ok(false),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The argument that makes durun a keeper: never a subcommand name.
pub(crate) const ARG: &str = "__keeper";

/// Becomes the keeper and never returns if durun's arguments ask for it
/// (`durun __keeper`, exec'd by durun's spawn where there is no nursery);
/// returns at once otherwise. The request comes on stdin, a socket.
pub(crate) fn keep_if_asked() {
    if std::env::args_os().nth(1).as_deref() != Some(std::ffi::OsStr::new(ARG)) {
        return;
    }
    match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(socket) => keep_sent(socket.into()),
        Err(_) => std::process::exit(127),
    }
}

/// The keeper of a request sent on `socket` by durun's spawn, in a durun
/// exec'd for it (there is no nursery): it takes the request as the
/// nursery's spare does, and keeps its charge. Never returns.
fn keep_sent(socket: UnixStream) -> ! {
    // A reader of durun's output sees its end when durun ends; the socket
    // is held above.
    crate::os::stdio_to_null();
    let Some((payload, fds)) = receive(&socket) else {
        // durun is gone.
        std::process::exit(0)
    };
    drop(socket);
    let (Some(decoded), Ok(fds)) = (decode(&payload), <[OwnedFd; FDS]>::try_from(fds)) else {
        std::process::exit(127)
    };
    // Started by durun in its own group: the agent joins it.
    keep(
        decoded,
        fds,
        rustix::process::getpgrp().as_raw_nonzero().get(),
    )
}

/// The keeper's life, from the nursery.
fn keep(decoded: Decoded, fds: [OwnedFd; FDS], durun_group: i32) -> ! {
    let Decoded {
        argv,
        env,
        cwd,
        own_group,
    } = decoded;
    let [stdin, stdout, stderr, lifeline, status] = fds;
    let charge = Charge {
        argv,
        group: if own_group {
            Group::Own
        } else {
            Group::Join(durun_group)
        },
        setup: Setup {
            env,
            cwd,
            stdio: [stdin, stdout, stderr],
        },
    };
    std::process::exit(crate::keeper::keep(charge, &lifeline, status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_with_empty_strings_and_odd_bytes() {
        let argv: Vec<OsString> = vec!["agent".into(), String::new().into(), "a b\n".into()];
        let env = vec![
            (OsString::from("EMPTY"), OsString::new()),
            (
                OsString::from("BYTES"),
                OsString::from_vec(vec![0xff, b'=', 1]),
            ),
        ];
        let null = std::fs::File::open("/dev/null").expect("null");
        let fd = null.as_fd();
        let request = Request {
            argv: &argv,
            env: &env,
            cwd: std::path::Path::new("/tmp/a dir"),
            stdio: [fd, fd, fd],
            lifeline: fd,
            status: fd,
            own_group: true,
        };
        let back = decode(&encode(&request)).expect("a request");
        assert_eq!(
            back,
            Decoded {
                argv: argv.clone(),
                env: env.clone(),
                cwd: PathBuf::from("/tmp/a dir"),
                own_group: true,
            }
        );
        assert!(decode(&encode(&request)[..10]).is_none(), "a cut request");
        assert!(decode(b"\x05").is_none());
    }
}
