//! Schedules (SPEC 16): workers sharing a journal submit exactly one task
//! per tick, a stopped worker included; missed ticks are caught up as
//! `catch_up` says; `durun schedules` shows the next tick.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::env::{TestEnv, text, wait_for};
use crate::workers::{stop, worker, worker_log};

fn schedule_env(catch_up: &str) -> TestEnv {
    let mut env = TestEnv::new();
    env.set("DURUN_HEARTBEAT_MS", "250");
    env.set("DURUN_LEASE_STALE_MS", "1500");
    env.write(
        "durun.toml",
        &format!(
            "[schedules.tick]\nevery = \"1s\"\ncommand = [\"true\"]\nqueue = \"ticks\"\ncatch_up = \"{catch_up}\"\n"
        ),
    );
    env
}

/// The ticks (seconds since the epoch) that have a task, sorted.
fn ticks(env: &TestEnv) -> Vec<u64> {
    let listed = env.durun(&["inspect", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let mut ticks: Vec<u64> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|task| {
            task["id"]
                .as_str()?
                .strip_prefix("tick-")
                .map(str::to_owned)
        })
        .map(|stamp| {
            let text = format!(
                "{}-{}-{}T{}:{}:{}Z",
                &stamp[..4],
                &stamp[4..6],
                &stamp[6..8],
                &stamp[9..11],
                &stamp[11..13],
                &stamp[13..15]
            );
            humantime::parse_rfc3339(&text)
                .expect("a tick")
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs()
        })
        .collect();
    ticks.sort_unstable();
    ticks
}

fn gaps(ticks: &[u64]) -> Vec<(u64, u64)> {
    ticks
        .windows(2)
        .filter(|pair| pair[1] != pair[0] + 1)
        .map(|pair| (pair[0], pair[1]))
        .collect()
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[test]
fn workers_sharing_a_journal_submit_each_tick_once_a_stopped_one_too() {
    let env = schedule_env("latest");
    let args = ["--config", "durun.toml", "--queue", "ticks"];
    let paused = worker(&env, "w0", &args);
    wait_for("the first tick's task", Duration::from_secs(20), || {
        !ticks(&env).is_empty()
    });
    env.pause_outside_a_write(paused.id() as i32);
    let mut pool: Vec<_> = ["w1", "w2", "w3"]
        .iter()
        .map(|host| worker(&env, host, &args))
        .collect();
    let until = now_secs() + 4;
    wait_for("four more ticks", Duration::from_secs(30), || {
        ticks(&env).last().is_some_and(|last| *last >= until)
    });
    crate::env::signal(paused.id() as i32, libc::SIGCONT);
    let until = now_secs() + 2;
    wait_for("two more ticks", Duration::from_secs(30), || {
        ticks(&env).last().is_some_and(|last| *last >= until)
    });
    for mut one in pool.drain(..).chain(std::iter::once(paused)) {
        assert!(stop(&mut one).success());
    }
    let ticks = ticks(&env);
    let logs: Vec<String> = ["w0", "w1", "w2", "w3"]
        .iter()
        .map(|host| worker_log(&env, host))
        .collect();
    assert!(ticks.len() >= 7, "{ticks:?}");
    assert_eq!(
        gaps(&ticks),
        [],
        "a worker ran at every tick: none was left out; the workers said:\n{}",
        logs.join("\n")
    );
    // Each tick's task was submitted by exactly one worker.
    let submitted: Vec<&str> = logs
        .iter()
        .flat_map(|log| log.lines())
        .filter_map(|line| line.split(" submitted task ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap_or_default())
        .collect();
    let mut unique = submitted.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        submitted.len(),
        "a tick submitted twice: {submitted:?}"
    );
    assert_eq!(unique.len(), ticks.len());
    // And the workers ran them.
    let listed: Value = serde_json::from_slice(
        &env.durun(&["inspect", "--json", "--status", "completed"])
            .stdout,
    )
    .expect("JSON");
    assert!(
        listed["tasks"]
            .as_array()
            .is_some_and(|tasks| tasks.len() + 4 >= ticks.len()),
        "{listed}"
    );
}

/// Runs a worker until `ticks` ticks have tasks, stops it for three
/// seconds, runs it again for two ticks.
fn stop_and_start(env: &TestEnv) -> (Vec<u64>, u64, u64) {
    let args = ["--config", "durun.toml", "--queue", "ticks"];
    let mut first = worker(env, "w1", &args);
    wait_for("two ticks' tasks", Duration::from_secs(20), || {
        ticks(env).len() >= 2
    });
    assert!(stop(&mut first).success());
    let stopped = now_secs();
    std::thread::sleep(Duration::from_millis(3500));
    // Restarted at the start of a second: the new worker has most of it
    // to make its first look, so the latest missed tick is this second's
    // (a busy CI machine once took it past the second's end).
    let into_second = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .subsec_millis();
    std::thread::sleep(Duration::from_millis(u64::from(1000 - into_second)));
    let restarted = now_secs();
    let mut second = worker(env, "w2", &args);
    wait_for("a tick after the restart", Duration::from_secs(20), || {
        ticks(env).last().is_some_and(|last| *last > restarted + 1)
    });
    assert!(stop(&mut second).success());
    (ticks(env), stopped, restarted)
}

#[test]
fn catch_up_all_submits_every_missed_tick_and_latest_only_the_last() {
    let env = schedule_env("all");
    let (all, stopped, restarted) = stop_and_start(&env);
    assert_eq!(
        gaps(&all),
        [],
        "catch_up = all: every tick has its task ({stopped}..{restarted})"
    );

    let env = schedule_env("latest");
    let (latest, stopped, restarted) = stop_and_start(&env);
    let gaps = gaps(&latest);
    assert_eq!(
        gaps.len(),
        1,
        "catch_up = latest: one gap, the stop ({stopped}..{restarted}): {latest:?}"
    );
    // The missed tick just before the restart has its task.
    assert!(gaps[0].1 <= restarted, "{gaps:?}, restarted at {restarted}");
}

#[test]
fn durun_schedules_shows_each_schedules_next_tick_and_last_task() {
    let mut env = TestEnv::new();
    env.set("DURUN_TEST_NOW", "2026-12-05T10:07:31Z");
    env.write(
        "durun.toml",
        "[schedules.digest]\ncron = \"0 9 * * 1-5\"\ncommand = [\"python3\", \"digest.py\"]\n\n\
         [schedules.sweep]\nevery = \"10m\"\ncommand = [\"./sweep.sh\"]\nqueue = \"maintenance\"\ncatch_up = \"none\"\n",
    );
    let listed = env.durun(&["schedules", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let digest = &listed["schedules"][0];
    assert_eq!(digest["name"], "digest");
    // A Saturday: the next weekday 09:00 is Monday's.
    assert_eq!(digest["next"], "2026-12-07T09:00:00.000Z");
    assert_eq!(digest["next_task"], "digest-20261207T090000Z");
    assert_eq!(digest["queue"], "default");
    assert_eq!(listed["schedules"][1]["next"], "2026-12-05T10:10:00.000Z");
    assert_eq!(listed["schedules"][1]["catch_up"], "none");

    // Its last task, once there is one.
    let submitted = env.durun(&[
        "-q",
        "submit",
        "--queue",
        "maintenance",
        "--task",
        "sweep-20261205T100000Z",
        "--",
        "./sweep.sh",
    ]);
    assert!(submitted.status.success());
    let table = env.durun(&["schedules"]);
    let table = text(&table.stdout);
    assert!(table.contains("sweep-20261205T100000Z (queued)"), "{table}");
    assert!(table.contains("2026-12-07T09:00:00Z"), "{table}");

    // A wrong schedule: the line says which and why.
    env.write(
        "durun.toml",
        "[schedules.bad]\ncron = \"0 9 * *\"\ncommand = [\"x\"]\n",
    );
    let refused = env.durun(&["schedules"]);
    assert_eq!(refused.status.code(), Some(64));
    assert!(
        text(&refused.stderr).contains("[schedules.bad]: `cron` has five fields"),
        "{}",
        text(&refused.stderr)
    );
}
