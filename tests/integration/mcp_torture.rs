//! Torture of `durun mcp` (SPEC 17): an agent makes 24 MCP calls, one
//! after another, through `durun mcp` under `durun run`. durun (the
//! runner), `durun mcp` or the MCP server is killed with SIGKILL at a
//! seeded random moment and the task resumed until it completes. No call
//! may be lost (the agent ends with what an uninterrupted run prints,
//! every step committed once) and none may reach the server without the
//! journal (only with its step's key, and no more times than its step's
//! attempts).
//!
//! Two seeds by default; `DURUN_MCP_TORTURE_ROUNDS=N` runs N, from
//! `DURUN_MCP_TORTURE_SEED`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, read_json_lines, signal, text, wait_exit};
use crate::torture::Rng;

const CALLS: usize = 24;

fn environment() -> TestEnv {
    let mut env = TestEnv::new();
    env.set(
        "DURUN_BIN",
        assert_cmd::cargo::cargo_bin("durun").to_string_lossy(),
    );
    env
}

/// `durun run` of the caller agent as task `task`.
fn run_args(env: &TestEnv, task: &str) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--task", task, "--", "python3"]
        .map(str::to_owned)
        .into();
    args.push(agents_dir().join("mcp_caller.py").display().to_string());
    args.push(CALLS.to_string());
    args.push(env.path("calls.jsonl").display().to_string());
    args.push(env.path("mcp.pid").display().to_string());
    args
}

/// What the agent prints when nothing is killed: each call's arguments,
/// echoed.
fn expected() -> Value {
    (0..CALLS)
        .map(|i| json!({"title": format!("c{i}")}))
        .collect()
}

/// How far into a run a kill may come: as long as a whole uninterrupted
/// run takes here (a slow machine would otherwise see no kill land).
fn kill_window() -> u64 {
    static WINDOW: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *WINDOW.get_or_init(|| {
        let env = environment();
        let started = Instant::now();
        let args = run_args(&env, "ref");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let done = env.durun(&args);
        assert!(done.status.success(), "{}", text(&done.stderr));
        (started.elapsed().as_millis() as u64).max(50)
    })
}

/// The MCP server's pid, if it runs: python running plain_mcp_server.py
/// on `calls` (`durun mcp` and its keeper name both in their arguments).
fn server_pid(calls: &str) -> Option<i32> {
    crate::env::processes_whose_args(|args| {
        args.len() >= 3
            && args[0].ends_with(b"python3")
            && args[1].ends_with(b"plain_mcp_server.py")
            && args[2] == calls.as_bytes()
    })
    .first()
    .copied()
}

/// What a round did: kills by victim (durun, `durun mcp`, the server),
/// runs, and the calls the server saw.
struct Round {
    kills: [u64; 3],
    runs: u64,
    sent: usize,
}

fn round(seed: u64) -> Round {
    let env = environment();
    let mut rng = Rng(seed | 1);
    let first = run_args(&env, "t");
    let calls = env.path("calls.jsonl").display().to_string();
    let mut done = Round {
        kills: [0; 3],
        runs: 0,
        sent: 0,
    };
    let mut printed = None;
    while printed.is_none() {
        assert!(done.runs < 80, "seed {seed}: not done in 80 runs");
        let _ = std::fs::remove_file(env.path("mcp.pid"));
        let recorded = done.runs > 0 && env.durun(&["inspect", "t"]).status.success();
        let args: Vec<&str> = if recorded {
            vec!["resume", "t"]
        } else {
            first.iter().map(String::as_str).collect()
        };
        let log = format!("run{}", done.runs);
        let mut durun = env.spawn(&args, &log);
        done.runs += 1;
        let delay = rng.below(kill_window());
        let deadline = Instant::now() + Duration::from_millis(delay);
        let victim = rng.below(3) as usize;
        while Instant::now() < deadline && durun.try_wait().expect("try_wait").is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        let victim_pid = match victim {
            1 => std::fs::read_to_string(env.path("mcp.pid"))
                .ok()
                .and_then(|pid| pid.trim().parse().ok()),
            2 => server_pid(&calls),
            _ => None,
        };
        let status = if durun.try_wait().expect("try_wait").is_some() {
            wait_exit(&mut durun, Duration::from_secs(1))
        } else if let Some(pid) = victim_pid {
            // The agent fails its call (3), or was past it and ends well.
            signal(pid, libc::SIGKILL);
            done.kills[victim] += 1;
            wait_exit(&mut durun, Duration::from_secs(120))
        } else {
            durun.kill().expect("SIGKILL durun");
            done.kills[0] += 1;
            durun.wait().expect("durun")
        };
        if status.success() {
            // A run killed once its task completed left the agent's print
            // in its own log, and the resume after it has none.
            printed = (0..done.runs).rev().find_map(|run| {
                let out = std::fs::read_to_string(env.path(&format!("run{run}.out"))).ok()?;
                (!out.trim().is_empty()).then_some(out)
            });
            assert!(printed.is_some(), "seed {seed}: no run printed");
        } else if status.code().is_some() {
            assert_eq!(status.code(), Some(3), "seed {seed}: {}", env.log(&log));
        }
    }
    let printed: Vec<String> = serde_json::from_str(printed.as_deref().unwrap_or_default())
        .unwrap_or_else(|err| panic!("seed {seed}: the agent's print: {err}"));
    let printed: Value = printed
        .iter()
        .map(|text| serde_json::from_str::<Value>(text).expect("an echo"))
        .collect();
    assert_eq!(printed, expected(), "seed {seed}: what the agent got");
    done.sent = assert_each_call_journaled(&env, seed);
    env.assert_journal_intact();
    done
}

/// Every call is one committed step, and reached the server only with its
/// step's key, at most once an attempt. How many calls the server saw.
fn assert_each_call_journaled(env: &TestEnv, seed: u64) -> usize {
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed", "seed {seed}");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), CALLS, "seed {seed}: one step a call");
    let sent = read_json_lines(&env.path("calls.jsonl"));
    let mut by_key: BTreeMap<&str, u64> = BTreeMap::new();
    for call in &sent {
        let key = call["key"].as_str().unwrap_or_else(|| {
            panic!("seed {seed}: a call reached the server without a key: {call}")
        });
        *by_key.entry(key).or_default() += 1;
    }
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["status"], "committed", "seed {seed}: {step}");
        assert_eq!(
            step["args"]["title"],
            format!("c{i}"),
            "seed {seed}: {step}"
        );
        let key = step["idempotency_key"].as_str().expect("a key");
        let times = by_key.remove(key).unwrap_or(0);
        assert!(
            times >= 1 && times <= step["attempts"].as_u64().expect("attempts"),
            "seed {seed}: step {i} reached the server {times} times in {} attempts",
            step["attempts"]
        );
    }
    assert!(
        by_key.is_empty(),
        "seed {seed}: the server saw keys no step holds: {by_key:?}"
    );
    sent.len()
}

#[test]
fn durun_mcp_killed_at_random_loses_no_call_and_sends_none_unjournaled() {
    let number = |name: &str| std::env::var(name).ok().and_then(|n| n.parse().ok());
    let rounds: u64 = number("DURUN_MCP_TORTURE_ROUNDS").unwrap_or(2);
    let first: u64 = number("DURUN_MCP_TORTURE_SEED").unwrap_or(0x4D_C9);
    let (mut kills, mut runs, mut sent) = ([0; 3], 0, 0);
    for seed in first..first + rounds {
        let done = round(seed);
        for (all, these) in kills.iter_mut().zip(done.kills) {
            *all += these;
        }
        runs += done.runs;
        sent += done.sent;
    }
    eprintln!(
        "mcp torture: {rounds} rounds, {} kills (durun {}, durun mcp {}, server {}), {runs} runs, {sent} calls sent for {} steps, none lost, none unjournaled",
        kills.iter().sum::<u64>(),
        kills[0],
        kills[1],
        kills[2],
        rounds as usize * CALLS
    );
}
