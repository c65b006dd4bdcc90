//! Fenced leases and a final cancel (SPEC 4): a runner paused past the
//! stale time (SIGSTOP) and continued after another host took its task over
//! runs nothing more, writes nothing, and exits 75; of many runners racing
//! for a stale task one wins; once `cancel` returns, no runner starts a
//! step. Real processes, real signals, on SQLite and on PostgreSQL.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::crash::tools_toml;
use crate::env::{TestEnv, process_gone, read_pid, signal, text, wait_exit, wait_for};
use crate::servers::FakeApi;

/// Heartbeats every 50 ms; another host may take a lease unrenewed for 3 s,
/// and a runner stops itself after 1.5 s without renewal (a loaded CI
/// machine can stall a process for a good part of a second).
const STALE: Duration = Duration::from_secs(3);

fn environment(api: &FakeApi) -> TestEnv {
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    env.set("DURUN_HEARTBEAT_MS", "50");
    env.set("DURUN_LEASE_STALE_MS", STALE.as_millis().to_string());
    env.write("durun.toml", &tools_toml());
    env
}

fn run_args<'a>(task: &'a str, agent: &'a [String]) -> Vec<&'a str> {
    let mut args = vec!["run", "--task", task, "--"];
    args.extend(agent.iter().map(String::as_str));
    args
}

/// A plan that reads, creates, waits at a gate (the file `gate`), then
/// reads and creates again.
fn gated_plan(env: &TestEnv) -> Value {
    json!({
        "pidfile": env.path("agent.pid"),
        "steps": [
            {"begin": "look", "args": {"n": 1}, "do": {"read": true}},
            {"begin": "create.a", "effect": "mutate", "args": {"title": "a"}, "do": {"api": true}},
            {"begin": "gate", "args": {}, "do": {"wait_for": env.path("gate")}},
            {"begin": "look.again", "args": {"n": 2}, "do": {"read": true}},
            {"begin": "create.b", "effect": "mutate", "args": {"title": "b"}, "do": {"api": true}},
            {"call": "echo", "args": {"text": "done"}},
        ],
    })
}

/// Starts run 1 of task `t` on host-a and waits until its agent waits at
/// the gate.
fn start_at_gate(env: &TestEnv, api: &FakeApi, agent: &[String]) -> std::process::Child {
    let first = env.spawn_on("host-a", &run_args("t", agent), "a");
    read_pid(&env.path("agent.pid"));
    wait_for(
        "the agent to reach the gate",
        Duration::from_secs(30),
        || api.seen().len() == 2,
    );
    // The gate step's `begin` was answered: the agent says so.
    wait_for("the gate step to open", Duration::from_secs(30), || {
        env.path("gate.waiting").exists()
    });
    first
}

/// No request from `run` reached the API at or after `since`.
fn assert_silent_since(api: &FakeApi, run: u32, since: SystemTime) {
    let late: Vec<_> = api
        .seen()
        .into_iter()
        .filter(|seen| seen.run == Some(run) && seen.at >= since)
        .collect();
    assert!(
        late.is_empty(),
        "run {run} reached the API after it lost its lease: {late:#?}"
    );
}

#[test]
fn a_paused_runner_taken_over_by_another_host_runs_and_writes_nothing_more() {
    let api = FakeApi::start();
    let env = environment(&api);
    let agent = env.scripted_agent("plan.json", &gated_plan(&env));
    let mut first = start_at_gate(&env, &api, &agent);
    let first_agent = read_pid(&env.path("agent.pid"));

    // Runner A stops (its agent goes on); once its lease is stale, host B
    // takes the task over and runs it to the end.
    env.pause_outside_a_write(first.id() as i32);
    std::thread::sleep(STALE + Duration::from_millis(300));
    std::fs::write(env.path("gate"), "").expect("open the gate");
    let mut second = env.spawn_on("host-b", &["resume", "t"], "b");
    let status = wait_exit(&mut second, Duration::from_secs(60));
    assert!(status.success(), "{}", env.log("b"));

    // Runner A continues: it must stop at once, without a step, an answer
    // or a write.
    let continued = SystemTime::now();
    signal(first.id() as i32, libc::SIGCONT);
    let status = wait_exit(&mut first, Duration::from_secs(30));
    assert_eq!(status.code(), Some(75), "{}", env.log("a"));
    let stderr = env.log("a");
    assert!(
        stderr.contains("durun: the run could not renew the lease of task t")
            || stderr.contains("durun: task t was taken over"),
        "{stderr}"
    );
    wait_for("A's agent to be killed", Duration::from_secs(10), || {
        process_gone(first_agent)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_silent_since(&api, 1, continued);

    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 6);
    for step in steps {
        assert_eq!(step["status"], "committed", "{step}");
        assert_eq!(step["attempts"], 1, "{step}");
    }
    let runs = view["task"]["runs"].as_array().expect("runs");
    assert_eq!(
        (runs[0]["exit_code"].clone(), runs[1]["exit_code"].clone()),
        (json!(75), json!(0))
    );
    // Each create reached the API once, from the run that held the lease.
    assert_eq!(api.resources(), 2);
    let mut keys = api.keys();
    keys.dedup();
    assert_eq!(keys.len(), 2, "{:?}", api.keys());
}

#[test]
fn a_runner_that_could_not_renew_for_half_the_stale_time_stops_itself() {
    let api = FakeApi::start();
    let env = environment(&api);
    let agent = env.scripted_agent("plan.json", &gated_plan(&env));
    let mut first = start_at_gate(&env, &api, &agent);

    // Paused past half the stale time, and nobody took the task over yet:
    // the run still must not go on.
    env.pause_outside_a_write(first.id() as i32);
    std::thread::sleep(STALE * 3 / 4);
    std::fs::write(env.path("gate"), "").expect("open the gate");
    std::thread::sleep(Duration::from_millis(100));
    let continued = SystemTime::now();
    signal(first.id() as i32, libc::SIGCONT);
    let status = wait_exit(&mut first, Duration::from_secs(30));
    assert_eq!(status.code(), Some(75), "{}", env.log("a"));
    assert!(
        env.log("a").contains("could not renew the lease"),
        "{}",
        env.log("a")
    );
    assert_silent_since(&api, 1, continued);
    assert_eq!(env.inspect("t")["task"]["status"], "interrupted");

    // Resumable: the gate ran again (it was never recorded), the rest
    // replays or runs once.
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(env.inspect("t")["task"]["status"], "completed");
    assert_eq!(api.resources(), 2);
}

#[test]
fn of_many_runners_racing_for_a_stale_task_one_wins() {
    let api = FakeApi::start();
    let env = environment(&api);
    let agent = env.scripted_agent("plan.json", &gated_plan(&env));
    let mut first = start_at_gate(&env, &api, &agent);
    env.pause_outside_a_write(first.id() as i32);
    std::thread::sleep(STALE + Duration::from_millis(300));

    let mut racers: Vec<_> = (0..6)
        .map(|i| {
            env.spawn_on(
                &format!("racer-{i}"),
                &["resume", "t"],
                &format!("racer{i}"),
            )
        })
        .collect();
    // The winner waits at the gate; every other racer is refused.
    let mut refused = 0;
    wait_for("five racers to be refused", Duration::from_secs(60), || {
        refused = racers
            .iter_mut()
            .map(|racer| racer.try_wait().expect("try_wait"))
            .filter(|status| status.is_some_and(|status| status.code() == Some(75)))
            .count();
        refused >= 5
    });
    std::fs::write(env.path("gate"), "").expect("open the gate");
    let codes: Vec<Option<i32>> = racers
        .iter_mut()
        .map(|racer| wait_exit(racer, Duration::from_secs(60)).code())
        .collect();
    assert_eq!(
        codes.iter().filter(|code| **code == Some(0)).count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|code| **code == Some(75)).count(),
        5,
        "{codes:?}"
    );

    let continued = SystemTime::now();
    signal(first.id() as i32, libc::SIGCONT);
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(30)).code(),
        Some(75)
    );
    assert_silent_since(&api, 1, continued);
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "completed");
    // Run 1 was paused, six more were opened and five of them refused
    // before they wrote a run.
    assert_eq!(view["task"]["runs"].as_array().expect("runs").len(), 2);
    assert_eq!(api.resources(), 2);
}

#[test]
fn once_cancel_returns_no_runner_starts_a_step_even_one_that_died_unaware() {
    let api = FakeApi::start();
    let env = environment(&api);
    let agent = env.scripted_agent("plan.json", &gated_plan(&env));
    let mut first = start_at_gate(&env, &api, &agent);

    // The runner cannot hear the cancel: it is stopped, then killed.
    env.pause_outside_a_write(first.id() as i32);
    let cancel = env.durun(&["cancel", "t"]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    let cancelled = SystemTime::now();
    first.kill().expect("SIGKILL the runner");
    first.wait().expect("reap");
    std::fs::write(env.path("gate"), "").expect("open the gate");
    assert_eq!(env.inspect("t")["task"]["status"], "cancelled");

    let resume = env.durun(&["resume", "t"]);
    assert_eq!(resume.status.code(), Some(64), "{}", text(&resume.stderr));
    assert!(
        text(&resume.stderr).contains("was cancelled"),
        "{}",
        text(&resume.stderr)
    );
    let mut args = vec!["run", "--task", "t", "--"];
    args.extend(agent.iter().map(String::as_str));
    let rerun = env.durun(&args);
    assert_eq!(rerun.status.code(), Some(64), "{}", text(&rerun.stderr));
    let all = env.durun(&["resume", "--all"]);
    assert!(all.status.success(), "{}", text(&all.stderr));
    assert!(
        text(&all.stderr).contains("no interrupted task"),
        "{}",
        text(&all.stderr)
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        api.seen().iter().all(|seen| seen.at < cancelled),
        "a step ran after the cancel: {:#?}",
        api.seen()
    );
    assert_eq!(env.inspect("t")["task"]["status"], "cancelled");
}

#[test]
fn a_live_runner_hears_a_cancel_before_its_next_read_step() {
    let api = FakeApi::start();
    let env = environment(&api);
    let agent = env.scripted_agent("plan.json", &gated_plan(&env));
    let mut first = start_at_gate(&env, &api, &agent);
    let cancel = env.durun(&["cancel", "t"]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    let cancelled = SystemTime::now();
    // The gate opens after the cancel returned: the next read step must
    // not start.
    std::fs::write(env.path("gate"), "").expect("open the gate");
    let status = wait_exit(&mut first, Duration::from_secs(30));
    assert!(!status.success(), "{}", env.log("a"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        api.seen().iter().all(|seen| seen.at < cancelled),
        "a step ran after the cancel: {:#?}",
        api.seen()
    );
    let view = env.inspect("t");
    assert_eq!(view["task"]["status"], "cancelled");
    let steps = view["steps"].as_array().expect("steps");
    assert!(
        steps.iter().all(|step| step["name"] != "look.again"),
        "{steps:#?}"
    );
}

/// Split-brain torture: runner A of the 32-step torture agent is paused
/// (SIGSTOP) at a seeded random moment, host B takes the task over once the
/// lease is stale, and A is continued at another random moment, while B
/// still runs or after it finished. A must exit 75 having reached the API
/// no more; B must finish with the output of an uninterrupted run and every
/// resource created once.
///
/// One round by default; `DURUN_SPLIT_ROUNDS=100` runs a hundred, and
/// `DURUN_SPLIT_SEED` picks the first seed.
#[test]
fn split_brain_torture() {
    use crate::torture::{MUTATE_STEPS, Rng, normalized, plan, reference_output};
    let rounds: u64 = std::env::var("DURUN_SPLIT_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let first_seed: u64 = std::env::var("DURUN_SPLIT_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x5_B1A1);
    let expected = reference_output();
    let mut paused = 0;
    for seed in first_seed..first_seed + rounds {
        let mut rng = Rng(seed | 1);
        let api = FakeApi::start();
        let env = environment(&api);
        let mut plan = plan();
        plan["pidfile"] = json!(env.path("agent.pid"));
        let agent = env.scripted_agent("plan.json", &plan);
        let mut first = env.spawn_on("host-a", &run_args("t", &agent), "a");
        // A holds the lease once its agent runs: a pause before that (a
        // runner still opening the journal) is not a split brain.
        read_pid(&env.path("agent.pid"));
        std::thread::sleep(Duration::from_millis(rng.below(900)));
        if first.try_wait().expect("try_wait").is_some() {
            // It finished before the pause: nothing to take over.
            continue;
        }
        paused += 1;
        // Any moment, a commit in flight included: B then waits for A.
        signal(first.id() as i32, libc::SIGSTOP);
        std::thread::sleep(STALE + Duration::from_millis(300));
        let mut second = env.spawn_on("host-b", &["resume", "t"], "b");
        std::thread::sleep(Duration::from_millis(rng.below(1500)));
        let continued = SystemTime::now();
        signal(first.id() as i32, libc::SIGCONT);
        let status = wait_exit(&mut first, Duration::from_secs(60));
        assert_eq!(status.code(), Some(75), "seed {seed}: {}", env.log("a"));
        let status = wait_exit(&mut second, Duration::from_secs(120));
        assert!(status.success(), "seed {seed}: {}", env.log("b"));
        std::thread::sleep(Duration::from_millis(200));
        assert_silent_since(&api, 1, continued);
        let view = env.inspect("t");
        assert_eq!(view["task"]["status"], "completed", "seed {seed}");
        assert_eq!(normalized(&view["task"]["output"]), expected, "seed {seed}");
        assert_eq!(
            api.resources(),
            MUTATE_STEPS,
            "seed {seed}: a resource was created twice"
        );
        eprintln!(
            "split-brain seed {seed}: A paused, B took over, {} API requests",
            api.seen().len()
        );
    }
    eprintln!("split-brain torture: {paused} of {rounds} rounds paused a runner");
}
