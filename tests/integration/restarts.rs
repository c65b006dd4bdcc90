//! PostgreSQL going away under runs and workers: a restart mid-pool, the
//! server down mid-step for a run (which reconnects) and past a worker's
//! run's step (which cannot), and sessions the server ended while a worker
//! idled. The first three restart the server the rest of the suite uses:
//! `cargo test` leaves them out (`#[ignore]`) and `.ci/run` runs them alone,
//! one at a time (`restarts:: -- --ignored`).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::env::{TestEnv, text, wait_exit, wait_for};
use crate::servers::FakeApi;
use crate::workers::{all_completed, pool_env, status, stop, submit, worker, worker_log};

/// Stops, starts or restarts the PostgreSQL server the suite uses.
fn pg(action: &str) {
    let cluster = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql")
        .find_map(|entry| entry.ok()?.file_name().into_string().ok())
        .expect("a cluster");
    let done = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &cluster, "main", action])
        .output()
        .expect("pg_ctlcluster");
    assert!(done.status.success(), "{action}: {}", text(&done.stderr));
}

/// `pool_env` on PostgreSQL, or None (the test is skipped) without it.
fn postgres_pool_env(api: &FakeApi) -> Option<TestEnv> {
    let env = pool_env(api);
    if env.postgres.is_none() {
        crate::env::skipped("set DURUN_TEST_POSTGRES");
        return None;
    }
    Some(env)
}

/// A PostgreSQL restart while a pool runs: runs whose connection broke
/// stop (their tasks' leases go stale), the workers reconnect, and every
/// task completes with every charge once. It restarts the server that the
/// rest of the suite uses, so it is left out of `cargo test` and run alone
/// by `.ci/run` (`--ignored`).
#[test]
#[ignore = "restarts the PostgreSQL server: .ci/run runs it alone"]
fn a_postgresql_restart_loses_nothing_and_doubles_nothing() {
    let api = FakeApi::start();
    let Some(env) = postgres_pool_env(&api) else {
        return;
    };
    let ids: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let plan = json!({"steps": [
            {"begin": "think", "args": {"i": i}, "do": {"sleep_ms": 300}},
            {"begin": "charge", "effect": "mutate", "args": {"title": id}, "do": {"api": true}},
            {"begin": "after", "args": {"i": i}, "do": {"sleep_ms": 300}},
        ]});
        submit(&env, id, &plan, &[]);
    }
    let mut w1 = worker(&env, "w1", &["--jobs", "2"]);
    let mut w2 = worker(&env, "w2", &["--jobs", "2"]);
    wait_for("the pool to start", Duration::from_secs(30), || {
        api.resources() >= 2
    });
    pg("restart");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !all_completed(&env, &ids) {
        if Instant::now() > deadline {
            let listed = env.durun(&["inspect"]);
            panic!(
                "not every task completed:\n{}\nw1:\n{}\nw2:\n{}",
                text(&listed.stdout),
                worker_log(&env, "w1"),
                worker_log(&env, "w2")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(stop(&mut w1).success(), "{}", worker_log(&env, "w1"));
    assert!(stop(&mut w2).success(), "{}", worker_log(&env, "w2"));
    assert_eq!(api.resources(), 12, "every charge happened once");
    let logs = worker_log(&env, "w1") + &worker_log(&env, "w2");
    assert!(logs.contains("reconnecting"), "{logs}");
}

/// SPEC 17: a PostgreSQL restart in the middle of a run's step: the run
/// cannot record its end, and its task read `running` under the live
/// worker's pid for ever (no runner on its host would take it over, and
/// `durun resume` refused with 75). The worker, reconnected, leaves it
/// interrupted and runs it again, and it completes. Run alone by `.ci/run`
/// with the other restart test (`--ignored`, one thread).
#[test]
#[ignore = "restarts the PostgreSQL server: .ci/run runs it alone"]
fn a_postgresql_restart_mid_step_leaves_no_task_running_under_a_live_worker() {
    let api = FakeApi::start();
    let Some(env) = postgres_pool_env(&api) else {
        return;
    };
    let plan = json!({"steps": [
        {"begin": "long", "args": {}, "do": {"sleep_ms": 3000}},
        {"begin": "after", "args": {}, "do": {"value": 1}},
    ]});
    submit(&env, "long", &plan, &[]);
    let mut w = worker(&env, "w", &["--jobs", "1"]);
    wait_for("the long step to begin", Duration::from_secs(30), || {
        env.inspect("long")["steps"]
            .as_array()
            .is_some_and(|steps| !steps.is_empty())
    });
    // Down past the step's end and past the run's time to reconnect: the
    // run's commit, and the record of its end, fail.
    pg("stop");
    std::thread::sleep(Duration::from_secs(5));
    pg("start");
    wait_for(
        "PostgreSQL to take connections",
        Duration::from_secs(30),
        || env.durun(&["inspect", "long"]).status.success(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all_completed(&env, &["long".to_owned()]) {
        if Instant::now() > deadline {
            let listed = env.durun(&["inspect", "long"]);
            panic!(
                "the task did not complete:\n{}\nw:\n{}",
                text(&listed.stdout),
                worker_log(&env, "w")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
}

/// SPEC 17: a `durun run` whose PostgreSQL server stops mid-step and
/// comes back within the run's time to reconnect (half the lease's stale
/// time) connects again and carries on: the same run completes the task,
/// its charge made once, and says what happened on stderr.
#[test]
#[ignore = "restarts the PostgreSQL server: .ci/run runs it alone"]
fn a_run_that_loses_postgresql_mid_step_reconnects_and_carries_on() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    if env.postgres.is_none() {
        crate::env::skipped("set DURUN_TEST_POSTGRES");
        return;
    }
    env.set("API_URL", &api.url);
    env.set("DURUN_HEARTBEAT_MS", "250");
    env.set("DURUN_LEASE_STALE_MS", "30000");
    let plan = json!({"steps": [
        {"begin": "first", "args": {}, "do": {"value": 1}},
        {"begin": "long", "args": {}, "do": {"sleep_ms": 2000}},
        {"begin": "charge", "effect": "mutate", "args": {"title": "once"}, "do": {"api": true}},
        {"begin": "after", "args": {}, "do": {"value": 2}},
    ]});
    let agent = env.scripted_agent("long.json", &plan);
    let mut args = vec!["run", "--task", "long", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut run = env.spawn(&args, "run");
    wait_for("the first step", Duration::from_secs(30), || {
        let listed = env.durun(&["inspect", "long", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&listed.stdout).is_ok_and(|task| {
            task["steps"]
                .as_array()
                .is_some_and(|steps| !steps.is_empty())
        })
    });
    pg("stop");
    std::thread::sleep(Duration::from_secs(3));
    pg("start");
    let status = wait_exit(&mut run, Duration::from_secs(60));
    let log = env.log("run");
    assert!(status.success(), "{status:?}: {log}");
    let task = env.inspect("long");
    assert_eq!(task["task"]["status"], "completed", "{log}");
    assert_eq!(
        task["task"]["runs"].as_array().map(Vec::len),
        Some(1),
        "the run carried on: {log}"
    );
    assert_eq!(task["steps"].as_array().map(Vec::len), Some(4), "{task}");
    assert_eq!(api.resources(), 1, "the charge was made once");
    assert!(log.contains("reconnecting for up to"), "{log}");
    assert!(log.contains("is back after"), "{log}");
}

/// The server ends a worker's sessions while it idles (as a restart
/// does): the worker reconnects, and the next run does not fail on the
/// connection the last one left (asked first if it idled a while, or
/// connected again on its first read if it came back moments ago).
#[test]
fn a_pooled_connection_the_server_ended_fails_no_run() {
    let api = FakeApi::start();
    let Some(env) = postgres_pool_env(&api) else {
        return;
    };
    let plan = json!({"steps": [{"begin": "think", "args": {}, "do": {"sleep_ms": 10}}]});
    submit(&env, "first", &plan, &[]);
    let mut w = worker(&env, "w", &["--jobs", "1"]);
    wait_for("the first task to end", Duration::from_secs(30), || {
        status(&env, "first") == "completed"
    });
    env.end_sessions();
    submit(&env, "second", &plan, &[]);
    wait_for("the second task to end", Duration::from_secs(30), || {
        matches!(status(&env, "second").as_str(), "completed" | "failed")
    });
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    let log = worker_log(&env, "w");
    assert_eq!(status(&env, "second"), "completed", "{log}");
    assert!(
        log.contains("reconnecting"),
        "the sessions were ended: {log}"
    );
    assert!(
        !log.contains("ended with exit") && !log.contains("was killed"),
        "a run failed: {log}"
    );
}
