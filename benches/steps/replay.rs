//! Replaying recorded tasks, and recovering from a SIGKILL mid-task.

use std::path::Path;

use crate::median;
use crate::scratch::{Scratch, us_per_step};

pub(crate) struct ReplayRow {
    pub(crate) steps: u64,
    pub(crate) us_per_step: f64,
    pub(crate) first_new_ms: f64,
    pub(crate) peak_kib_first_run: u64,
    pub(crate) peak_kib_resume: u64,
    pub(crate) bytes_per_step: f64,
}

/// Records a task of `steps` read steps, then resumes it: every step is
/// replayed and one more runs.
pub(crate) fn replay(root: &Path, steps: u64, samples: usize) -> ReplayRow {
    let scratch = Scratch::new(root, &format!("replay-{steps}"), "normal");
    let (report, _, ok) = scratch.agent(
        &["run", "--task", "big"],
        "read",
        &[
            ("DURUN_BENCH_STEPS", steps.to_string()),
            ("DURUN_BENCH_EXIT", "3".into()),
        ],
    );
    assert_eq!(ok, Some(3), "recording {steps} steps failed");
    let peak_kib_first_run = report["durun_peak_kib"].as_u64().unwrap_or(0);
    let bytes_per_step =
        std::fs::metadata(scratch.journal()).map_or(0, |meta| meta.len()) as f64 / steps as f64;
    let mut per_step = Vec::new();
    let mut first_new = Vec::new();
    let mut peak = 0;
    for sample in 0..samples as u64 {
        let recorded = steps + sample;
        let (report, spawned_at, ok) = scratch.agent(
            &["resume", "big"],
            "read",
            &[
                ("DURUN_BENCH_STEPS", (recorded + 1).to_string()),
                ("DURUN_BENCH_REPLAY_STEPS", recorded.to_string()),
                ("DURUN_BENCH_EXIT", "3".into()),
            ],
        );
        assert_eq!(ok, Some(3), "resuming {steps} steps failed");
        // The agent's time covers the replayed steps and the new one.
        per_step.push(us_per_step(&report, recorded));
        let at: u128 = report["first_new_at_unix_ns"]
            .as_str()
            .and_then(|at| at.parse().ok())
            .expect("a new step ran");
        first_new.push((at - spawned_at) as f64 / 1e6);
        peak = peak.max(report["durun_peak_kib"].as_u64().unwrap_or(0));
    }
    ReplayRow {
        steps,
        us_per_step: median(per_step),
        first_new_ms: median(first_new),
        peak_kib_first_run,
        peak_kib_resume: peak,
        bytes_per_step,
    }
}

/// A 1,000-step task whose durun is killed with SIGKILL inside step 500,
/// then resumed: seconds from `durun resume` to the first step that runs.
pub(crate) fn crash_recovery(root: &Path) -> f64 {
    eprintln!("crash at step 500 of 1000, and resume");
    let mut samples = Vec::new();
    for _ in 0..3 {
        let scratch = Scratch::new(root, "crash", "full");
        let (_, _, ok) = scratch.agent(
            &["run", "--task", "crash"],
            "read",
            &[
                ("DURUN_BENCH_STEPS", "1000".into()),
                ("DURUN_BENCH_CRASH_AT", "500".into()),
            ],
        );
        assert_ne!(ok, Some(0), "the crash run should have been killed");
        let (report, spawned_at, ok) = scratch.agent(
            &["resume", "crash"],
            "read",
            &[
                ("DURUN_BENCH_STEPS", "1000".into()),
                ("DURUN_BENCH_REPLAY_STEPS", "499".into()),
            ],
        );
        assert_eq!(ok, Some(0), "resume after the crash failed");
        let at: u128 = report["first_new_at_unix_ns"]
            .as_str()
            .and_then(|at| at.parse().ok())
            .expect("a new step ran");
        samples.push((at - spawned_at) as f64 / 1e9);
        let counter = std::fs::read_to_string(scratch.dir.join("counter")).unwrap_or_default();
        let mut done: Vec<u64> = counter
            .lines()
            .filter_map(|line| line.split_whitespace().nth(1)?.parse().ok())
            .collect();
        done.sort_unstable();
        // Step 500 was killed before its body ran; nothing ran twice.
        assert_eq!(
            done,
            (1..=1000).collect::<Vec<_>>(),
            "a step ran twice or never"
        );
    }
    median(samples)
}
