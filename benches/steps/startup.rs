//! Start-up: `durun run -- true` on a journal that exists, and `durun step
//! NAME -- true` inside a run (what a shell agent pays per step), each the
//! median of 100.

use std::process::Stdio;
use std::time::Instant;

use crate::median;
use crate::scratch::Scratch;

/// Times each `durun step` from inside the run: the agent (Python, started
/// by durun) runs it 101 times and writes the times, in ms, to the report.
const STEPS_AGENT: &str = r#"
import json, os, subprocess, time
durun = os.environ["DURUN_BENCH_DURUN"]
times = []
for i in range(101):
    started = time.perf_counter()
    subprocess.run([durun, "step", f"s{i}", "--", "true"], check=True, stdout=subprocess.DEVNULL)
    times.append((time.perf_counter() - started) * 1e3)
json.dump({"ms": times[1:]}, open(os.environ["DURUN_BENCH_OUT"], "w"))
"#;

/// `durun run -- true`, median of 100 in ms (a first run makes the journal).
pub(crate) fn run_true(scratch: &Scratch) -> f64 {
    let mut times = Vec::new();
    for _ in 0..101 {
        let started = Instant::now();
        let status = scratch
            .durun()
            .args(["-q", "run", "--", "true"])
            .stderr(Stdio::null())
            .status()
            .expect("durun");
        assert!(status.success());
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    times.remove(0);
    median(times)
}

/// `durun step NAME -- true` inside a run, median of 100 in ms.
pub(crate) fn step_in_run(scratch: &Scratch) -> f64 {
    let agent = scratch.dir.join("steps.py");
    std::fs::write(&agent, STEPS_AGENT).expect("the agent");
    let status = scratch
        .durun()
        .args(["-q", "run", "--", "python3"])
        .arg(&agent)
        .env("DURUN_BENCH_DURUN", env!("CARGO_BIN_EXE_durun"))
        .status()
        .expect("durun");
    assert!(status.success(), "the `durun step` agent failed");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(scratch.dir.join("report.json")).expect("the report"),
    )
    .expect("JSON");
    median(
        report["ms"]
            .as_array()
            .expect("times")
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .collect(),
    )
}
