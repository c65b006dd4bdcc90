//! Crash torture of a pipelining agent: one that sends its next commit
//! before the last is answered, with durun SIGKILLed microseconds after a
//! commit was sent. The seeds are `torture`'s (`DURUN_TORTURE_ROUNDS`,
//! `DURUN_TORTURE_SEED`).

use serde_json::{Value, json};

use crate::env::{TestEnv, text};
use crate::torture::{Rng, seeds};

/// Steps of the pipelining agent.
const PIPELINED_STEPS: u64 = 30;

/// The journal's rule for a pipelining agent: its steps form one run of
/// numbers from 1, each committed but perhaps the last, which may be a
/// `mutate` step's intent (in doubt). So no intent is durable before a
/// commit sent ahead of it. Returns the committed prefix.
fn committed_prefix(env: &TestEnv, seed: u64, run: u64) -> u64 {
    let view = env.inspect("t");
    let steps = view["steps"].as_array().expect("steps");
    for (at, step) in steps.iter().enumerate() {
        let number = step["step"].as_u64().expect("step number");
        assert_eq!(
            number,
            at as u64 + 1,
            "seed {seed}, run {run}: a gap in the journal: {steps:?}"
        );
        if step["status"] != "committed" {
            assert_eq!(
                at + 1,
                steps.len(),
                "seed {seed}, run {run}: step {number} is {} before a later step was written: {steps:?}",
                step["status"]
            );
            assert_eq!(
                step["effect"], "mutate",
                "seed {seed}, run {run}: a `read` step left {} : {steps:?}",
                step["status"]
            );
        }
    }
    steps
        .iter()
        .take_while(|step| step["status"] == "committed")
        .count() as u64
}

/// One seed of the pipelining torture: the agent kills durun right after
/// a commit it did not wait for, run after run, until the task completes.
fn pipelined_torture(seed: u64) {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", crate::env::sdk_path());
    env.set("STEPS", PIPELINED_STEPS.to_string());
    let effects = env.path("effects.log");
    env.set("EFFECTS", effects.to_string_lossy());
    let agent = crate::env::agents_dir().join("pipelined.py");
    let agent = agent.to_string_lossy();
    let mut rng = Rng(seed | 1);
    let mut prefixes = vec![0];
    let mut kills = 0;
    for run in 0.. {
        assert!(run < 40, "seed {seed}: the task did not finish in 40 runs");
        // Later runs are left to finish, so that every seed ends.
        let kill_at = if run < 12 { 1 + rng.below(5) } else { 0 };
        let args: Vec<&str> = if run == 0 {
            vec!["run", "--task", "t", "--", "python3", &agent]
        } else {
            vec!["resume", "t"]
        };
        let output = env
            .command()
            .args(&args)
            .env("RUN_MARK", run.to_string())
            .env("KILL_AT", kill_at.to_string())
            .output()
            .expect("durun");
        if output.status.success() {
            break;
        }
        assert!(
            kill_at > 0 && output.status.code().is_none(),
            "seed {seed}, run {run}: {:?} {}",
            output.status,
            text(&output.stderr)
        );
        kills += 1;
        prefixes.push(committed_prefix(&env, seed, run));
    }
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed", "seed {seed}");
    let total: u64 = (1..=PIPELINED_STEPS).map(|i| i * i).sum();
    assert_eq!(
        view["task"]["output"],
        json!({"total": total}),
        "seed {seed}"
    );
    // Each run went on exactly from what the journal held: no committed
    // step ran again, none was skipped; a step lost with its commit ran
    // again.
    let log = std::fs::read_to_string(&effects).expect("effects");
    let mut executed: Vec<Vec<(String, u64, String)>> = vec![Vec::new(); prefixes.len()];
    for line in log.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let run: usize = fields[0].parse().expect("run mark");
        executed[run].push((
            fields[1].to_owned(),
            fields[2].parse().expect("step"),
            fields[3].to_owned(),
        ));
    }
    for (run, steps) in executed.iter().enumerate() {
        let first = steps.first().map(|step| step.1);
        assert_eq!(
            first,
            Some(prefixes[run] + 1),
            "seed {seed}, run {run}: began at {first:?}, the journal held {} steps",
            prefixes[run]
        );
        for pair in steps.windows(2) {
            assert_eq!(
                pair[1].1,
                pair[0].1 + 1,
                "seed {seed}, run {run}: {steps:?}"
            );
        }
    }
    // Every `mutate` step reached the "API" with the key the journal holds
    // for it, and with no other.
    let journal: Vec<&Value> = view["steps"].as_array().expect("steps").iter().collect();
    for (effect, step, key) in executed.iter().flatten() {
        let recorded = journal[*step as usize - 1];
        assert_eq!(
            recorded["idempotency_key"].as_str(),
            Some(key.as_str()),
            "seed {seed}: step {step}"
        );
        assert_eq!(
            recorded["effect"].as_str(),
            Some(effect.as_str()),
            "seed {seed}: step {step}"
        );
    }
    env.assert_journal_intact();
    eprintln!(
        "pipelined torture seed {seed}: {kills} kills, {} steps run",
        log.lines().count()
    );
}

/// A Python agent that does not wait for its commits, SIGKILLing durun
/// microseconds after one was sent: the journal keeps the order (no intent
/// before an earlier commit), every step lost with its commit runs again
/// from the right place, and every `mutate` step keeps its one key.
#[test]
fn a_pipelining_agent_killed_right_after_a_commit_keeps_the_order() {
    for seed in seeds() {
        pipelined_torture(seed);
    }
}
