//! Who may drive a task: one live runner at a time (SPEC 4).
//!
//! A run holds a lease on its task: host, pid (with the process start time,
//! so a recycled pid is not mistaken for the runner) and a heartbeat. A
//! lease on this host is live while its process is; a lease from another
//! host is live while its heartbeat is fresh.

use std::time::Duration;

/// A lease as the journal holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) pid_start: Option<u64>,
    pub(crate) heartbeat_ms: i64,
    pub(crate) run: u32,
}

/// This process, as it would hold a lease.
#[derive(Debug, Clone)]
pub(crate) struct Holder {
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) pid_start: Option<u64>,
}

impl Holder {
    /// This process, on host `host` (`DURUN_HOST_ID`; tests pose as other
    /// hosts), or the host name.
    pub(crate) fn current(host: Option<String>) -> Self {
        let pid = std::process::id();
        Self {
            host: host.unwrap_or_else(host_name),
            pid,
            pid_start: proc_stat(pid).map(|stat| stat.start),
        }
    }
}

/// The machine's host name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Whether `lease` still belongs to a live runner, seen from `me`: on this
/// host while its process lives, from another host while its heartbeat is
/// younger than `stale`.
pub(crate) fn is_live(lease: &Lease, me: &Holder, now_ms: i64, stale: Duration) -> bool {
    if lease.host == me.host {
        if lease.pid == me.pid && lease.pid_start == me.pid_start {
            return true;
        }
        match proc_stat(lease.pid) {
            Some(stat) => !stat.zombie && lease.pid_start.is_none_or(|start| start == stat.start),
            None => false,
        }
    } else {
        now_ms.saturating_sub(lease.heartbeat_ms) < stale.as_millis() as i64
    }
}

/// When process `pid` of this host started, on the wall clock (to the
/// kernel's tick); `None` when it is gone or a zombie. A pid reused by
/// another process shows a later start than its first owner's.
pub(crate) fn process_started(pid: u32) -> Option<std::time::SystemTime> {
    let stat = proc_stat(pid).filter(|stat| !stat.zombie)?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    Some(
        std::time::UNIX_EPOCH
            + Duration::from_secs(boot)
            + Duration::from_secs_f64(stat.start as f64 / ticks as f64),
    )
}

struct ProcStat {
    start: u64,
    zombie: bool,
}

/// Reads the state and start time of `pid` from `/proc`.
fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last `)`. State is field 3, start time field 22.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        zombie: matches!(fields.first(), Some(&("Z" | "X"))),
        start: fields.get(19)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALE: Duration = Duration::from_secs(60);

    #[test]
    fn a_process_started_before_now_and_a_dead_one_not_at_all() {
        let started = process_started(std::process::id()).expect("this process");
        let now = std::time::SystemTime::now();
        // btime is in whole seconds: allow for it.
        assert!(
            started <= now + Duration::from_secs(2),
            "{started:?} after {now:?}"
        );
        assert!(now.duration_since(started).unwrap_or_default() < Duration::from_secs(24 * 3600));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert_eq!(process_started(pid), None);
    }

    #[test]
    fn this_process_is_live_and_a_dead_one_is_not() {
        let me = Holder::current(None);
        let mine = Lease {
            host: me.host.clone(),
            pid: me.pid,
            pid_start: me.pid_start,
            heartbeat_ms: 0,
            run: 1,
        };
        assert!(is_live(&mine, &me, 0, STALE));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert!(!is_live(
            &Lease {
                pid,
                ..mine.clone()
            },
            &me,
            0,
            STALE
        ));
        let recycled = Lease {
            pid_start: me.pid_start.map(|start| start + 1),
            ..mine.clone()
        };
        assert!(!is_live(
            &recycled,
            &Holder {
                pid: 1,
                ..me.clone()
            },
            0,
            STALE
        ));
        let remote = Lease {
            host: "elsewhere".into(),
            heartbeat_ms: 1_000,
            ..mine
        };
        assert!(is_live(&remote, &me, 1_000 + 59_000, STALE));
        assert!(!is_live(&remote, &me, 1_000 + 61_000, STALE));
    }
}
