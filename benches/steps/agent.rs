//! The agent side: speaks the protocol on stdin/stdout and writes what
//! it measured to `DURUN_BENCH_OUT` as one JSON object.

use super::{OpenOptions, Value, Write, env_or, json, step_body, unix_ns};
use std::io::{BufRead, BufWriter};
use std::time::Instant;

struct Wire {
    out: BufWriter<std::io::Stdout>,
    input: std::io::StdinLock<'static>,
    line: String,
}

impl Wire {
    fn send(&mut self, request: &str) {
        self.out.write_all(request.as_bytes()).expect("write");
        self.out.write_all(b"\n").expect("write");
        self.out.flush().expect("flush");
    }

    fn receive(&mut self) -> Value {
        self.line.clear();
        let read = self.input.read_line(&mut self.line).expect("read");
        assert!(read > 0, "durun closed the agent's stdin");
        let response: Value = serde_json::from_str(&self.line).expect("a JSON response");
        assert!(response["ok"] == true, "durun refused a step: {response}");
        response
    }

    fn ask(&mut self, request: &str) -> Value {
        self.send(request);
        self.receive()
    }
}

/// Peak resident memory of durun, the agent's parent, in KiB.
fn parent_peak_kib() -> u64 {
    let status = std::fs::read_to_string(format!(
        "/proc/{}/status",
        std::os::unix::process::parent_id()
    ))
    .unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// How many replayed steps the agent asks for ahead of their answers.
const WINDOW: u64 = 256;

pub(crate) fn main(mode: &str) {
    let steps: u64 = env_or("DURUN_BENCH_STEPS", 100);
    let replay: u64 = env_or("DURUN_BENCH_REPLAY_STEPS", 0);
    let crash_at: u64 = env_or("DURUN_BENCH_CRASH_AT", 0);
    let mut counter = OpenOptions::new()
        .create(true)
        .append(true)
        .open("counter")
        .expect("open the counter file");
    let mut wire = Wire {
        out: BufWriter::new(std::io::stdout()),
        input: std::io::stdin().lock(),
        line: String::new(),
    };
    let started = Instant::now();
    let mut first_new_at = None;
    match mode {
        "read" | "mutate" => {
            // Replayed steps are asked for ahead of their answers, from
            // another thread, at most a window ahead (as a pipelining
            // agent would): durun's own speed shows, not the round trip.
            let mode_owned = mode.to_owned();
            let (read_tx, read_rx) = std::sync::mpsc::channel::<()>();
            let sender = std::thread::spawn(move || {
                let mut out = BufWriter::new(std::io::stdout().lock());
                for i in 1..=replay {
                    if i > WINDOW {
                        out.flush().expect("flush");
                        read_rx.recv().expect("the reader");
                    }
                    writeln!(
                        out,
                        r#"{{"op":"begin","id":{i},"name":"step","args":{{"i":{i}}},"effect":"{mode_owned}"}}"#
                    )
                    .expect("write");
                }
                out.flush().expect("flush");
            });
            for _ in 1..=replay {
                // A plain look at the line keeps the agent's own cost
                // below durun's.
                wire.line.clear();
                wire.input.read_line(&mut wire.line).expect("read");
                assert!(
                    wire.line.contains(r#""replayed":true"#),
                    "not replayed: {}",
                    wire.line
                );
                let _ = read_tx.send(());
            }
            sender.join().expect("the sender thread");
            for i in replay + 1..=steps {
                let response = wire.ask(&format!(
                    r#"{{"op":"begin","id":{i},"name":"step","args":{{"i":{i}}},"effect":"{mode}"}}"#
                ));
                if response["replayed"] == true {
                    continue;
                }
                first_new_at.get_or_insert_with(unix_ns);
                if i == crash_at {
                    crash();
                }
                let step = &response["step"];
                let output = step_body(&mut counter, i);
                wire.ask(&format!(
                    r#"{{"op":"commit","id":"c{i}","step":{step},"output":{output}}}"#
                ));
            }
        }
        "call" | "call_mutate" => {
            // Calls in groups of `DURUN_BENCH_PARALLEL`, all of a group
            // sent before any answer is read.
            let parallel: u64 = env_or("DURUN_BENCH_PARALLEL", 1);
            let tool = if mode == "call" {
                "noop"
            } else {
                "noop_mutate"
            };
            let mut i = 0;
            while i < steps {
                let group = parallel.min(steps - i);
                for j in 1..=group {
                    wire.send(&format!(
                        r#"{{"op":"call","id":{},"tool":"{tool}","args":{{"i":{}}}}}"#,
                        i + j,
                        i + j
                    ));
                }
                for _ in 0..group {
                    wire.receive();
                }
                i += group;
            }
        }
        other => panic!("unknown agent mode {other}"),
    }
    let elapsed = started.elapsed();
    let report = json!({
        "elapsed_ns": elapsed.as_nanos() as u64,
        "first_new_at_unix_ns": first_new_at.map(|at| at.to_string()),
        "durun_peak_kib": parent_peak_kib(),
    });
    let path = std::env::var("DURUN_BENCH_OUT").expect("DURUN_BENCH_OUT");
    std::fs::write(path, report.to_string()).expect("write the report");
    // A task that ends failed can be resumed again and again.
    std::process::exit(env_or("DURUN_BENCH_EXIT", 0));
}

/// A real crash: durun is killed with SIGKILL, then the agent.
fn crash() -> ! {
    // SAFETY: plain kill(2) calls with valid signal numbers.
    unsafe {
        libc::kill(std::os::unix::process::parent_id() as i32, libc::SIGKILL);
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!("killed")
}
