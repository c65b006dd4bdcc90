//! PostgreSQL going away under workers: a restart mid-pool, the server
//! down past a run's step, and sessions the server ended while a worker
//! idled. The first two restart the server the rest of the suite uses:
//! `cargo test` leaves them out (`#[ignore]`) and `.ci/run` runs them alone,
//! one at a time.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::env::{TestEnv, text, wait_for};
use crate::servers::FakeApi;
use crate::workers::{all_completed, pool_env, status, stop, submit, worker, worker_log};

/// `pool_env` on PostgreSQL, or None (the test is skipped) without it.
fn postgres_pool_env(api: &FakeApi) -> Option<TestEnv> {
    let env = pool_env(api);
    if env.postgres.is_none() {
        eprintln!("skipped: set DURUN_TEST_POSTGRES");
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
    let cluster = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql")
        .find_map(|entry| entry.ok()?.file_name().into_string().ok())
        .expect("a cluster");
    let restarted = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &cluster, "main", "restart"])
        .output()
        .expect("pg_ctlcluster");
    assert!(restarted.status.success(), "{}", text(&restarted.stderr));
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
    let cluster = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql")
        .find_map(|entry| entry.ok()?.file_name().into_string().ok())
        .expect("a cluster");
    // Down past the step's end: the run's commit, and the record of its
    // end, fail.
    let pg = |action: &str| {
        let done = std::process::Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &cluster, "main", action])
            .output()
            .expect("pg_ctlcluster");
        assert!(done.status.success(), "{action}: {}", text(&done.stderr));
    };
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

/// The server ends a worker's sessions while it idles (as a restart
/// does): the worker reconnects, and the connection its last run left for
/// the next is dropped, not handed to the next run to fail on.
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
