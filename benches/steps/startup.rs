//! Start-up: `durun run -- true` on a journal that exists, and `durun step
//! NAME -- true` inside a run (what a shell agent pays per step), each the
//! median of 100; for the build under test and for a static build of the
//! same source (the README's static build), which skips the dynamic
//! loader.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
pub(crate) fn run_true(scratch: &Scratch, bin: &Path) -> f64 {
    let mut times = Vec::new();
    for _ in 0..101 {
        let started = Instant::now();
        let status = scratch
            .durun_at(bin)
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
pub(crate) fn step_in_run(scratch: &Scratch, bin: &Path) -> f64 {
    let agent = scratch.dir.join("steps.py");
    std::fs::write(&agent, STEPS_AGENT).expect("the agent");
    let status = scratch
        .durun_at(bin)
        .args(["-q", "run", "--", "python3"])
        .arg(&agent)
        .env("DURUN_BENCH_DURUN", bin)
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

/// durun built statically against glibc, at a fixed address (`-C
/// target-feature=+crt-static -C relocation-model=static`, as the README's
/// static install builds it), in release, beside the
/// build under test; None on a host that is not Linux with glibc, with
/// `DURUN_BENCH_STATIC=0`, or when the build fails (said on stderr).
pub(crate) fn static_build() -> Option<PathBuf> {
    if std::env::var("DURUN_BENCH_STATIC").as_deref() == Ok("0") {
        return None;
    }
    let rustc = Command::new("rustc").arg("-vV").output().ok()?;
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: ").map(str::to_owned))?;
    if !host.ends_with("-linux-gnu") {
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    eprintln!("a static build of durun for the start-up rows (DURUN_BENCH_STATIC=0 skips it)");
    // With --target, RUSTFLAGS reach durun and its dependencies but not
    // the proc-macros and build scripts, which cannot be static.
    let built = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args([
            "build",
            "--release",
            "--locked",
            "--bin",
            "durun",
            "--target",
            &host,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(root)
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C relocation-model=static",
        )
        .stdout(Stdio::null())
        .status();
    let bin = target_dir.join(&host).join("release").join("durun");
    if built.is_ok_and(|status| status.success()) && bin.exists() {
        Some(bin)
    } else {
        eprintln!("the static build failed: its start-up rows are left out");
        None
    }
}
