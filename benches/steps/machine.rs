//! What this machine costs before durun does anything: process starts,
//! pipe round trips, CPU pinning, fsyncs counted with strace.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::Scratch;

/// Syncs to disk per step, counted with strace (exact, unlike time): the
/// difference between runs of 150 and 50 steps, so start-up cancels out.
pub(crate) fn fsyncs_per_step(root: &Path, mode: &str, parallel: u64) -> Option<f64> {
    let available = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !available {
        return None;
    }
    let mut counts = Vec::new();
    for steps in [50u64, 150] {
        let mut scratch = Scratch::new(root, "fsync", "full");
        let log = scratch.dir.join("strace.log");
        scratch.strace = Some(log.clone());
        let (_, _, ok) = scratch.agent(
            &["run", "--task", "bench"],
            mode,
            &[
                ("DURUN_BENCH_STEPS", steps.to_string()),
                ("DURUN_BENCH_PARALLEL", parallel.to_string()),
            ],
        );
        assert_eq!(ok, Some(0), "durun run under strace failed");
        let text = std::fs::read_to_string(&log).ok()?;
        let syncs = text
            .lines()
            .filter(|line| line.contains("fsync(") || line.contains("fdatasync("))
            .count();
        counts.push(syncs as f64);
    }
    Some((counts[1] - counts[0]) / 100.0)
}

/// The floor of a command tool: start `true` and wait for it, in µs.
pub(crate) fn spawn_true(count: u64) -> f64 {
    let started = Instant::now();
    for _ in 0..count {
        let status = Command::new("true").status().expect("run true");
        assert!(status.success());
    }
    started.elapsed().as_secs_f64() * 1e6 / count as f64
}

/// The other end of [`pipe_round_trip`]: answers each line with itself.
pub(crate) fn echo() {
    let mut input = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut input, &mut line).is_ok_and(|read| read > 0) {
        out.write_all(line.as_bytes()).expect("write");
        out.flush().expect("flush");
        line.clear();
    }
}

/// Pins the calling thread (and what it starts later) to `cpu`, or to the
/// CPUs in `mask`; returns the mask it had.
pub(crate) fn pin(cpu: Option<usize>, mask: Option<libc::cpu_set_t>) -> libc::cpu_set_t {
    // SAFETY: sched_{get,set}affinity on the calling thread with sets on
    // the stack, of the size given.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of_val(&old), &raw mut old);
        let mut set: libc::cpu_set_t = mask.unwrap_or_else(|| std::mem::zeroed());
        if let Some(cpu) = cpu {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &raw const set);
        old
    }
}

/// Starts `command` (and whatever it starts) on CPU `cpu` only.
pub(crate) fn pin_child(command: &mut Command, cpu: usize) {
    // SAFETY: sched_setaffinity between fork and exec, on a set built on
    // the stack.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &raw const set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The machine's floor for any protocol over pipes: one line to another
/// process and back, in µs, with the two processes on one core or on two
/// (where each answer must wake a process on the other core). A
/// `begin`/`commit` step makes two.
pub(crate) fn pipe_round_trip(count: u32, cross_core: bool) -> f64 {
    use std::io::BufRead as _;
    let old = pin(Some(0), None);
    let mut command = Command::new(std::env::current_exe().expect("the bench's own path"));
    command
        .env("DURUN_BENCH_AGENT", "echo")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if cross_core {
        pin_child(&mut command, 1);
    }
    let mut child = command.spawn().expect("start the echo agent");
    let mut to = child.stdin.take().expect("piped");
    let mut from = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let request = "{\"op\":\"begin\",\"id\":1,\"name\":\"step\",\"args\":{\"i\":1}}\n";
    let mut line = String::new();
    let started = Instant::now();
    for _ in 0..count {
        to.write_all(request.as_bytes()).expect("write");
        to.flush().expect("flush");
        line.clear();
        from.read_line(&mut line).expect("read");
    }
    let elapsed = started.elapsed();
    drop(to);
    let _ = child.wait();
    pin(None, Some(old));
    elapsed.as_secs_f64() * 1e6 / f64::from(count)
}

/// One blocking line round trip between two processes of `lang` ("python",
/// "node" or "node24"), each on its own core where there are two: what a
/// step that waits for one answer costs an agent in that language, in µs.
pub(crate) fn language_round_trip(lang: &str, count: u32) -> Option<f64> {
    let script = match lang {
        "python" => {
            r#"
import os, subprocess, sys, time
if len(sys.argv) > 2:
    for line in sys.stdin.buffer:
        sys.stdout.buffer.write(line); sys.stdout.buffer.flush()
    sys.exit(0)
child = subprocess.Popen([sys.executable, sys.argv[0], sys.argv[1], "echo"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
line = b'{"op":"begin","id":1,"name":"step","args":{"i":1}}\n'
n = int(sys.argv[1])
started = time.perf_counter()
for _ in range(n):
    child.stdin.write(line); child.stdin.flush(); child.stdout.readline()
print((time.perf_counter() - started) / n * 1e6)
child.stdin.close(); child.wait()
"#
        }
        _ => {
            r#"
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
if (process.argv[3] === "echo") {
  createInterface({ input: process.stdin }).on("line", (line) => process.stdout.write(line + "\n"));
} else {
  const n = Number(process.argv[2]);
  const child = spawn(process.execPath, [process.argv[1], process.argv[2], "echo"], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout });
  const next = () => new Promise((resolve) => lines.once("line", resolve));
  const started = performance.now();
  for (let i = 0; i < n; i++) {
    const answered = next();
    child.stdin.write('{"op":"begin","id":1,"name":"step","args":{"i":1}}\n');
    await answered;
  }
  console.log((performance.now() - started) / n * 1000);
  child.stdin.end();
}
"#
        }
    };
    let dir = tempfile::tempdir().ok()?;
    let path = dir.path().join(if lang == "python" {
        "trip.py"
    } else {
        "trip.mjs"
    });
    std::fs::write(&path, script).ok()?;
    let output = Command::new(crate::languages::program(lang))
        .arg(&path)
        .arg(count.to_string())
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

/// Processes that never sleep, killed when dropped: a loaded machine.
pub(crate) struct Busy(Vec<std::process::Child>);

impl Busy {
    pub(crate) fn start(count: usize) -> Self {
        Self(
            (0..count)
                .filter_map(|_| {
                    std::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .ok()
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
