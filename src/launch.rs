//! How a keeper starts its charge: `clone(CLONE_VM | CLONE_VFORK)`, so that
//! nothing of the keeper is copied, with the parent-death signal set in the
//! child before `execve`.
//!
//! std's `Command` forks as soon as code must run between fork and exec
//! (the parent-death signal), and a fork copies the keeper's page tables,
//! which the child's exec then throws away: 0.1 to 0.2 ms of every agent's
//! start on a 2-vCPU machine (docs/performance.md, "Start-up: the keeper
//! without a fork"). `posix_spawn` copies nothing but cannot set the
//! parent-death signal, without which a `kill -9` of the keeper alone
//! would leave the agent running.
//!
//! The child shares the keeper's memory while the keeper waits for its
//! `execve`: it makes only system calls, on data prepared before the clone.

use std::ffi::{CStr, CString, OsStr, OsString, c_char, c_int, c_void};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// The child's stack: `execve` and `sigaction` need little.
const STACK: usize = 64 * 1024;

/// What the child needs, all of it made before the clone.
struct Child<'a> {
    /// The program, found on `PATH`.
    program: *const c_char,
    /// `argv` and `envp`, null-ended, pointing into `strings`.
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// `/bin/sh` with the program and its arguments: what `execvp` runs for
    /// a script without `#!` (`ENOEXEC`).
    sh_argv: Vec<*const c_char>,
    /// The process group to join: 0 for one of its own.
    group: i32,
    /// The keeper, whose death the child must not outlive.
    parent: i32,
    /// stdin, stdout and stderr to put in place.
    stdio: &'a [OwnedFd; 3],
    /// The child's `errno` when it could not exec; 0 otherwise.
    failed: AtomicI32,
}

/// Starts `argv` with `env` and `stdio`, in the keeper's directory; its
/// pid. `group` as in [`Child::group`].
pub(crate) fn launch(
    argv: &[OsString],
    env: &[(OsString, OsString)],
    stdio: &[OwnedFd; 3],
    group: i32,
) -> io::Result<u32> {
    let Some(program) = argv.first() else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let cwd = std::env::current_dir()?;
    let path = env
        .iter()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| value.as_os_str());
    let found = find(program, path, &cwd);
    let strings = Strings::new(argv, env, found.as_os_str())?;
    let mut child = Child {
        program: strings.program.as_ptr(),
        argv: Strings::pointers(strings.argv.iter().map(CString::as_c_str)),
        envp: Strings::pointers(strings.envp.iter().map(CString::as_c_str)),
        sh_argv: Strings::pointers(
            [c"/bin/sh", strings.program.as_c_str()]
                .into_iter()
                .chain(strings.argv.iter().skip(1).map(CString::as_c_str)),
        ),
        group,
        parent: rustix::process::getpid().as_raw_nonzero().get(),
        stdio,
        failed: AtomicI32::new(0),
    };
    let mut stack = vec![0u8; STACK];
    // The stack grows down from its (16-byte aligned) top.
    let top = (stack.as_mut_ptr() as usize + STACK) & !15;
    // SAFETY: CLONE_VFORK suspends this thread until the child has exec'd
    // or exited, so `child`, `strings` and `stack` outlive its use of them;
    // the child runs `start` on its own stack and makes only system calls.
    // The keeper has one thread, so no lock is held across the clone.
    let pid = unsafe {
        libc::clone(
            start,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_mut(&mut child).cast(),
        )
    };
    drop(stack);
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    let failed = child.failed.load(Ordering::Acquire);
    if failed != 0 {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
        return Err(io::Error::from_raw_os_error(failed));
    }
    Ok(pid.unsigned_abs())
}

/// The child: [`prepare`], SIGPIPE's default and no signal blocked, then
/// `execve`; on failure its `errno` for the keeper and exit 127.
extern "C" fn start(arg: *mut c_void) -> c_int {
    // SAFETY: `launch` passes a `Child` that outlives this call (the keeper
    // waits, CLONE_VFORK), which the child only reads but for `failed`;
    // the rest are system calls on descriptors the keeper holds open and
    // on null-ended arrays of C strings made before the clone.
    unsafe {
        let child = &*arg.cast::<Child<'_>>();
        let errno = prepare(child).err().map_or_else(
            || {
                // Rust's runtime ignores SIGPIPE; a program expects its
                // default, and no signal blocked.
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&raw mut none);
                libc::sigprocmask(libc::SIG_SETMASK, &raw const none, std::ptr::null_mut());
                libc::execve(child.program, child.argv.as_ptr(), child.envp.as_ptr());
                let errno = io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::ENOENT);
                if errno != libc::ENOEXEC {
                    return errno;
                }
                libc::execve(
                    child.sh_argv[0],
                    child.sh_argv.as_ptr(),
                    child.envp.as_ptr(),
                );
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::ENOEXEC)
            },
            rustix::io::Errno::raw_os_error,
        );
        child.failed.store(errno.max(1), Ordering::Release);
        127
    }
}

/// What the child sets up before its exec: its group, the parent-death
/// signal and its stdio; system calls only.
fn prepare(child: &Child<'_>) -> rustix::io::Result<()> {
    use rustix::process::{Pid, Signal};
    // 0: a group of its own, led by the child.
    rustix::process::setpgid(None, Pid::from_raw(child.group))?;
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
    // The keeper may have died before the signal was set.
    if rustix::process::getppid().map(|pid| pid.as_raw_nonzero().get()) != Some(child.parent) {
        return Err(rustix::io::Errno::SRCH);
    }
    let [stdin, stdout, stderr] = child.stdio;
    rustix::stdio::dup2_stdin(stdin)?;
    rustix::stdio::dup2_stdout(stdout)?;
    rustix::stdio::dup2_stderr(stderr)?;
    Ok(())
}

/// The C strings behind a [`Child`].
struct Strings {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Strings {
    fn new(argv: &[OsString], env: &[(OsString, OsString)], program: &OsStr) -> io::Result<Self> {
        let c = |bytes: &[u8]| {
            CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
        };
        Ok(Self {
            program: c(program.as_bytes())?,
            argv: argv
                .iter()
                .map(|arg| c(arg.as_bytes()))
                .collect::<io::Result<_>>()?,
            envp: env
                .iter()
                .map(|(name, value)| {
                    let mut pair = name.as_bytes().to_vec();
                    pair.push(b'=');
                    pair.extend_from_slice(value.as_bytes());
                    c(&pair)
                })
                .collect::<io::Result<_>>()?,
        })
    }

    /// Pointers to `strings`, then a null.
    fn pointers<'a>(strings: impl Iterator<Item = &'a CStr>) -> Vec<*const c_char> {
        strings
            .map(CStr::as_ptr)
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    }
}

/// `program` as `execvp` would find it on `path` (from `cwd` for an empty
/// entry): the first executable file; else the first file found (whose
/// exec then says why); else `program` itself.
fn find(program: &OsStr, path: Option<&OsStr>, cwd: &Path) -> PathBuf {
    if program.as_bytes().contains(&b'/') || program.is_empty() {
        return PathBuf::from(program);
    }
    let path = path.unwrap_or(OsStr::new("/bin:/usr/bin"));
    let mut seen = None;
    for dir in std::env::split_paths(path) {
        let dir = if dir.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else {
            dir
        };
        let candidate = dir.join(program);
        if !candidate.is_file() {
            continue;
        }
        if rustix::fs::access(&candidate, rustix::fs::Access::EXEC_OK).is_ok() {
            return candidate;
        }
        seen.get_or_insert(candidate);
    }
    seen.unwrap_or_else(|| PathBuf::from(program))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_found_as_execvp_would_find_it() {
        let dir = tempfile::tempdir().expect("dir");
        let bin = dir.path().join("bin");
        let other = dir.path().join("other");
        std::fs::create_dir_all(&bin).expect("bin");
        std::fs::create_dir_all(&other).expect("other");
        let write = |path: &Path, mode: u32| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::write(path, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("mode");
        };
        write(&other.join("tool"), 0o644);
        write(&bin.join("tool"), 0o755);
        let path = std::env::join_paths([&other, &bin]).expect("path");
        assert_eq!(
            find(OsStr::new("tool"), Some(&path), dir.path()),
            bin.join("tool")
        );
        // Only one that cannot run: exec says EACCES about it.
        let only_other = std::env::join_paths([&other]).expect("path");
        assert_eq!(
            find(OsStr::new("tool"), Some(&only_other), dir.path()),
            other.join("tool")
        );
        assert_eq!(
            find(OsStr::new("absent"), Some(&path), dir.path()),
            PathBuf::from("absent")
        );
        assert_eq!(
            find(OsStr::new("./x"), Some(&path), dir.path()),
            PathBuf::from("./x")
        );
        // An empty entry is the directory.
        write(&dir.path().join("here"), 0o755);
        let with_empty = OsString::from(format!("{}:", other.display()));
        assert_eq!(
            find(OsStr::new("here"), Some(&with_empty), dir.path()),
            dir.path().join("here")
        );
    }

    #[test]
    fn a_launched_program_runs_with_its_arguments_and_environment() {
        let out = tempfile::NamedTempFile::new().expect("out");
        let argv: Vec<OsString> = vec![
            "sh".into(),
            "-c".into(),
            format!(
                "printf '%s %s' \"$0\" \"$GREETING\" > {}",
                out.path().display()
            )
            .into(),
            "named".into(),
        ];
        let env = vec![
            (OsString::from("PATH"), OsString::from("/usr/bin:/bin")),
            (OsString::from("GREETING"), OsString::from("hello there")),
        ];
        let null = || -> OwnedFd { std::fs::File::open("/dev/null").expect("null").into() };
        let stdio = [null(), null(), null()];
        let group = rustix::process::getpgrp().as_raw_nonzero().get();
        let pid = launch(&argv, &env, &stdio, group).expect("launched");
        let pid = rustix::process::Pid::from_raw(pid as i32).expect("pid");
        let (_, status) =
            rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
                .expect("wait")
                .expect("status");
        assert_eq!(status.exit_status(), Some(0));
        assert_eq!(
            std::fs::read_to_string(out.path()).expect("read"),
            "named hello there"
        );
        let missing = launch(
            &[OsString::from("no-such-program-here")],
            &env,
            &stdio,
            group,
        )
        .expect_err("not found");
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    }
}
