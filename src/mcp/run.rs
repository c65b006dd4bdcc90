//! Which run `durun mcp` belongs to: `DURUN_SOCKET` when its environment
//! has it, else the nearest process above it whose environment does. MCP
//! clients commonly start servers with a reduced environment (the official
//! SDKs pass only `HOME`, `PATH` and a few more), and an unchanged client
//! config must still work.

use std::path::PathBuf;

/// The socket of the run this process is part of, if any.
pub(crate) fn find_socket(own: Option<PathBuf>) -> Option<PathBuf> {
    if let Some(own) = own {
        return Some(own);
    }
    let mut pid = parent_of(std::process::id())?;
    // A chain of processes is short; the bound only guards a loop.
    for _ in 0..64 {
        if pid <= 1 {
            return None;
        }
        if let Some(socket) = socket_in_environment(pid)
            && socket.exists()
        {
            return Some(socket);
        }
        pid = parent_of(pid)?;
    }
    None
}

/// The parent of `pid`, from `/proc/PID/stat` (its fourth field, after the
/// command name in parentheses, which may hold anything).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// `DURUN_SOCKET` in the environment `pid` was started with.
fn socket_in_environment(pid: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|byte| *byte == 0).find_map(|entry| {
        entry
            .strip_prefix(b"DURUN_SOCKET=")
            .map(|path| PathBuf::from(std::ffi::OsStr::from_bytes(path)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_past_any_command_name() {
        let me = std::process::id();
        let parent = parent_of(me).expect("a parent");
        assert_eq!(parent, std::os::unix::process::parent_id());
    }
}
