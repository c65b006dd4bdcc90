//! Crash torture: a 32-step agent mixing `read` and `mutate` steps, `begin`
//! and `call`, and groups of parallel calls, is killed with SIGKILL (durun,
//! the agent, or a running tool, at seeded random moments) and resumed
//! until it finishes. It must end with the same final output as an
//! uninterrupted run; every `mutate` step must reach the API with one key
//! only, and no resource may be created twice. A killed tool fails its
//! step; the failure runs again on resume unless the agent went on from it.
//!
//! One seed by default; `DURUN_TORTURE_ROUNDS=50` runs fifty, and
//! `DURUN_TORTURE_SEED` picks the first.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crash::tools_toml;
use crate::env::{TestEnv, process_gone, signal, text, wait_for};
use crate::servers::FakeApi;

const STEPS: usize = 32;

pub(crate) fn plan() -> Value {
    let steps: Vec<Value> = (0..STEPS)
        .map(|i| match i % 8 {
            0 | 4 => json!({"begin": format!("api.b{i}"), "effect": "mutate", "args": {"title": format!("b{i}")}, "do": {"api": true}}),
            3 => json!({"call": "create_resource", "args": {"title": format!("c{i}")}}),
            2 | 6 => json!({"call": "echo", "args": {"text": format!("e{i}")}}),
            5 => json!({"parallel": [
                {"call": "create_resource", "args": {"title": format!("p{i}a")}},
                {"call": "echo", "args": {"text": format!("p{i}")}},
                {"call": "create_resource", "args": {"title": format!("p{i}b")}},
            ]}),
            1 => json!({"begin": format!("look{i}"), "args": {"i": i}, "do": {"read": true}}),
            _ => json!({"begin": format!("think{i}"), "args": {"i": i}, "do": {"value": i * i}}),
        })
        .collect();
    json!({"steps": steps})
}

/// The outputs without what differs between a first try and a retry (the
/// API says whether it created the resource or found it by key) or between
/// runs (parallel creates take resource ids in either order).
pub(crate) fn normalized(output: &Value) -> Value {
    let mut output = output.clone();
    if let Some(outputs) = output["outputs"].as_array_mut() {
        for item in outputs {
            if let Some(object) = item.as_object_mut() {
                object.remove("created");
                object.remove("id");
            }
        }
    }
    output
}

/// Resources the plan creates: two `api` begins, one create call and two
/// parallel creates in every eight steps.
pub(crate) const MUTATE_STEPS: usize = STEPS / 8 * 5;

fn environment(api: &FakeApi) -> TestEnv {
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    std::fs::create_dir(env.path("tools")).expect("tool pid dir");
    std::fs::create_dir(env.path("escapees")).expect("escapees dir");
    let tools = env.path("tools").to_string_lossy().into_owned();
    env.set("TOOL_PIDS", tools);
    env.write("durun.toml", &tools_toml());
    env
}

/// A running create tool's pid, if one runs.
fn running_tool(env: &TestEnv, rng: &mut Rng) -> Option<i32> {
    let pids: Vec<i32> = std::fs::read_dir(env.path("tools"))
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (!pids.is_empty()).then(|| pids[rng.below(pids.len() as u64) as usize])
}

fn agent_args(env: &TestEnv) -> Vec<String> {
    let mut plan = plan();
    plan["pidfile"] = json!(env.path("agent.pid"));
    plan["escapees"] = json!(env.path("escapees"));
    env.scripted_agent("plan.json", &plan)
}

/// xorshift64*, seeded: the kill schedule of a failing round reproduces.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

pub(crate) fn reference_output() -> Value {
    let api = FakeApi::start();
    let env = environment(&api);
    let mut args = vec![
        "run".to_owned(),
        "--task".to_owned(),
        "ref".to_owned(),
        "--".to_owned(),
    ];
    args.extend(agent_args(&env));
    let output = env.command().args(&args).output().expect("durun");
    assert!(output.status.success(), "{}", text(&output.stderr));
    normalized(&env.inspect("ref")["task"]["output"])
}

/// How far into a run a kill may come, in milliseconds: 700, or as long
/// as a whole run of the task took here when the machine is slower (a
/// busy machine would otherwise kill every run before it gets anywhere).
fn kill_window() -> u64 {
    static WINDOW: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *WINDOW.get_or_init(|| {
        let started = Instant::now();
        reference_output();
        (started.elapsed().as_millis() as u64).max(700)
    })
}

fn torture(seed: u64, expected: &Value) {
    let api = FakeApi::start();
    let env = environment(&api);
    let mut rng = Rng(seed | 1);
    let mut first = vec![
        "run".to_owned(),
        "--task".to_owned(),
        "t".to_owned(),
        "--".to_owned(),
    ];
    first.extend(agent_args(&env));
    let mut kills = 0;
    let mut runs = 0;
    let mut escapees = 0;
    let mut recorded = false;
    loop {
        assert!(runs < 60, "seed {seed}: the task did not finish in 60 runs");
        let _ = std::fs::remove_file(env.path("agent.pid"));
        // A first run killed before it recorded the task (a slow start on
        // a busy machine) left nothing to resume: it is run again, as its
        // user would.
        if !recorded && runs > 0 {
            recorded = env.durun(&["inspect", "t"]).status.success();
        }
        let args: Vec<&str> = if recorded {
            vec!["resume", "t"]
        } else {
            first.iter().map(String::as_str).collect()
        };
        let mut durun = env.spawn(&args, &format!("run{runs}"));
        runs += 1;
        let delay = Duration::from_millis(50 + rng.below(kill_window()));
        let victim = rng.below(3);
        let deadline = Instant::now() + delay;
        let mut finished = None;
        while Instant::now() < deadline {
            if let Some(status) = durun.try_wait().expect("try_wait") {
                finished = Some(status);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(status) = finished {
            escapees += assert_none_outlived(&env, seed, runs);
            if status.success() {
                break;
            }
            // The agent stops on a failed step (a tool killed earlier);
            // the next resume runs the step again.
            assert_eq!(
                status.code(),
                Some(3),
                "seed {seed}, run {runs}: {}",
                env.log(&format!("run{}", runs - 1))
            );
            continue;
        }
        let agent_pid = std::fs::read_to_string(env.path("agent.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<i32>().ok());
        let tool_pid = running_tool(&env, &mut rng);
        match (agent_pid, tool_pid) {
            (_, Some(tool)) if victim == 2 => {
                // The step fails; the run goes on or ends as the agent
                // decides.
                signal(tool, libc::SIGKILL);
                kills += 1;
                let done = ended_after_tool_kill(&mut durun, &env, seed, runs);
                escapees += assert_none_outlived(&env, seed, runs);
                if done {
                    break;
                }
                continue;
            }
            (Some(_), _) if victim == 1 => kill(&mut durun, agent_pid, true),
            _ => kill(&mut durun, agent_pid, false),
        }
        escapees += assert_none_outlived(&env, seed, runs);
        kills += 1;
    }

    let requests = assert_every_step_once(&env, &api, seed, expected);
    env.assert_journal_intact();
    eprintln!(
        "torture seed {seed}: {kills} kills, {runs} runs, {requests} API requests, {escapees} escaping grandchildren ended, none past 1 s"
    );
}

/// The task ended as an uninterrupted run does: the same output, each
/// `mutate` step with one key only, no resource made twice. How many
/// requests the API saw.
fn assert_every_step_once(env: &TestEnv, api: &FakeApi, seed: u64, expected: &Value) -> usize {
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed", "seed {seed}");
    assert_eq!(
        &normalized(&view["task"]["output"]),
        expected,
        "seed {seed}: the final output differs"
    );
    let mutate_steps = MUTATE_STEPS;
    assert_eq!(
        api.resources(),
        mutate_steps,
        "seed {seed}: a resource was created twice"
    );
    // Each mutate step's key is distinct and was the only key its step sent.
    let keys = api.keys();
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        mutate_steps,
        "seed {seed}: one key per mutate step"
    );
    let recorded: Vec<&str> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["effect"] == "mutate")
        .map(|step| step["idempotency_key"].as_str().expect("key"))
        .collect();
    for key in &distinct {
        assert!(
            recorded.contains(&key.as_str()),
            "seed {seed}: the API saw a key the journal does not hold"
        );
    }
    keys.len()
}

/// SPEC 17: once a run has ended, by a kill or on its own, none of the
/// processes its agent started to outlive it (`escapees`) is alive 1 s
/// later. Their pid files go with them; how many there were.
fn assert_none_outlived(env: &TestEnv, seed: u64, runs: usize) -> usize {
    use crate::containment::{GONE_WITHIN, all_gone, cleanup, escapees_in};
    let dir = env.path("escapees");
    let pids = escapees_in(&dir);
    let alive = all_gone(&pids, GONE_WITHIN);
    cleanup(&alive);
    assert!(
        alive.is_empty(),
        "seed {seed}, run {runs}: {alive:?} outlived their run by {GONE_WITHIN:?}"
    );
    // Counted once: the next run's start their own.
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let _ = std::fs::remove_file(entry.path());
    }
    pids.len()
}

/// SIGKILL to the agent (when `agent` and it has a pid) or to durun,
/// whose agent then dies with it; returns once durun has exited.
fn kill(durun: &mut std::process::Child, agent_pid: Option<i32>, agent: bool) {
    match agent_pid {
        Some(pid) if agent => {
            signal(pid, libc::SIGKILL);
            durun.wait().expect("durun");
        }
        _ => {
            durun.kill().expect("SIGKILL durun");
            durun.wait().expect("durun");
            if let Some(pid) = agent_pid {
                wait_for(
                    "the agent to die with durun",
                    Duration::from_secs(10),
                    || process_gone(pid),
                );
            }
        }
    }
}

/// After a tool was killed: the run ends on its own, the agent stopping on
/// the failure (3) or going on to the end (0, true).
fn ended_after_tool_kill(
    durun: &mut std::process::Child,
    env: &TestEnv,
    seed: u64,
    runs: usize,
) -> bool {
    let status = crate::env::wait_exit(durun, Duration::from_secs(120));
    assert!(
        status.success() || status.code() == Some(3),
        "seed {seed}, run {runs}: {status:?} {}",
        env.log(&format!("run{}", runs - 1))
    );
    status.success()
}

/// The seeds to torture: `DURUN_TORTURE_ROUNDS` of them (one by default)
/// from `DURUN_TORTURE_SEED`.
pub(crate) fn seeds() -> std::ops::Range<u64> {
    let number = |name: &str| std::env::var(name).ok().and_then(|n| n.parse().ok());
    let rounds: u64 = number("DURUN_TORTURE_ROUNDS").unwrap_or(1);
    let first: u64 = number("DURUN_TORTURE_SEED").unwrap_or(0xD0_5EED);
    first..first + rounds
}

#[test]
fn the_task_survives_sigkill_at_random_points() {
    let expected = reference_output();
    for seed in seeds() {
        torture(seed, &expected);
    }
}

/// The torture plan with two `wait` steps and two short `sleep` steps in
/// place of four plain ones.
fn plan_with_waits() -> Value {
    let mut plan = plan();
    plan["steps"][7] = json!({"wait": "go"});
    plan["steps"][15] = json!({"sleep": 0.3});
    plan["steps"][23] = json!({"wait": "go"});
    plan["steps"][31] = json!({"sleep": 0.1});
    plan
}

/// Sends the next signal `go`, its data its number.
fn send_go(env: &TestEnv, sent: &mut u32) {
    *sent += 1;
    let data = sent.to_string();
    let output = env.durun(&["signal", "t", "go", "--data", &data]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

/// Runs `args` (a run or a resume) to its end, sending a signal each time
/// the task parks: the output of a task that waits, never killed.
fn waiting_reference(api: &FakeApi) -> Value {
    let env = environment(api);
    let mut plan = plan_with_waits();
    plan["pidfile"] = json!(env.path("agent.pid"));
    let mut args = vec!["run", "--task", "t", "--park-after", "0s", "--"]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    args.extend(env.scripted_agent("plan.json", &plan));
    let mut sent = 0;
    loop {
        let output = env.command().args(&args).output().expect("durun");
        match output.status.code() {
            Some(0) => break,
            Some(77) if env.inspect("t")["task"]["status"] == "sleeping" => {
                std::thread::sleep(Duration::from_millis(350));
            }
            Some(77) if sent < 2 => send_go(&env, &mut sent),
            other => panic!("{other:?}: {}", text(&output.stderr)),
        }
        args = ["resume", "t", "--park-after", "0s"]
            .into_iter()
            .map(str::to_owned)
            .collect();
    }
    normalized(&env.inspect("t")["task"]["output"])
}

fn waiting_torture(seed: u64, expected: &Value) {
    let api = FakeApi::start();
    let env = environment(&api);
    // Every seed its own schedule (`seed | 1` gives 2k and 2k+1 the same).
    let mut rng = Rng((seed << 1) | 1);
    let mut plan = plan_with_waits();
    plan["pidfile"] = json!(env.path("agent.pid"));
    let agent = env.scripted_agent("plan.json", &plan);
    let mut sent = 0;
    let mut kills = 0;
    let mut runs = 0;
    loop {
        assert!(runs < 80, "seed {seed}: the task did not finish in 80 runs");
        let _ = std::fs::remove_file(env.path("agent.pid"));
        // Parks at once, or waits live long enough to be killed waiting.
        let park_after = if rng.below(2) == 0 { "0s" } else { "60s" };
        let mut args = vec!["run", "--task", "t", "--park-after", park_after, "--"];
        args.extend(agent.iter().map(String::as_str));
        let mut durun = env.spawn(&args, &format!("run{runs}"));
        runs += 1;
        let deadline = Instant::now() + Duration::from_millis(50 + rng.below(kill_window()));
        let mut finished = None;
        while Instant::now() < deadline {
            if let Some(status) = durun.try_wait().expect("try_wait") {
                finished = Some(status);
                break;
            }
            if sent < 2 && rng.below(40) == 0 {
                // A signal while the run may be waiting live.
                send_go(&env, &mut sent);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match finished.map(|status| status.code()) {
            Some(Some(0)) => break,
            Some(Some(77)) => {
                if env.inspect("t")["task"]["status"] == "sleeping" {
                    std::thread::sleep(Duration::from_millis(350));
                } else {
                    assert!(sent < 2, "seed {seed}: parked with every signal sent");
                    send_go(&env, &mut sent);
                }
                continue;
            }
            Some(Some(3)) => continue,
            Some(other) => panic!(
                "seed {seed}: {other:?} {}",
                env.log(&format!("run{}", runs - 1))
            ),
            None => {}
        }
        let agent_pid = std::fs::read_to_string(env.path("agent.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<i32>().ok());
        kill(&mut durun, agent_pid, rng.below(3) == 0);
        kills += 1;
    }
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed", "seed {seed}");
    assert_eq!(
        &normalized(&view["task"]["output"]),
        expected,
        "seed {seed}: the waits took other signals, or a step ran twice"
    );
    assert_eq!(
        api.resources(),
        MUTATE_STEPS,
        "seed {seed}: a resource was created twice"
    );
    // Each signal was taken once, by its own wait, oldest first.
    let waits: Vec<u64> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["kind"] == "wait" && step["status"] != "discarded")
        .map(|step| step["step"].as_u64().expect("step"))
        .collect();
    let taken: Vec<Value> = view["task"]["signals"]
        .as_array()
        .expect("signals")
        .iter()
        .map(|signal| signal["taken_by_step"].clone())
        .collect();
    assert_eq!(taken, [json!(waits[0]), json!(waits[1])], "seed {seed}");
    env.assert_journal_intact();
    eprintln!("waiting torture seed {seed}: {kills} kills, {runs} runs");
}

#[test]
fn a_waiting_task_survives_sigkill_and_takes_each_signal_once() {
    let expected = waiting_reference(&FakeApi::start());
    let waits: Vec<&Value> = expected["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .filter(|output| output.get("wait").is_some())
        .collect();
    assert_eq!(
        waits,
        [
            &json!({"wait": "go", "data": 1}),
            &json!({"wait": "go", "data": 2})
        ]
    );
    for seed in seeds() {
        waiting_torture(seed, &expected);
    }
}
