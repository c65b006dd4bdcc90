//! Workers and the queue (SPEC 11): tasks submitted to a pool of workers
//! posing as separate hosts (`DURUN_HOST_ID`), each its own process tree,
//! on SQLite by `cargo test` and on the real PostgreSQL server by
//! `.ci/run`. Workers are SIGKILLed and SIGSTOPped past the stale time:
//! every task completes and every effect happens once.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::env::{TestEnv, text, wait_exit, wait_for};
use crate::servers::FakeApi;

/// A test environment whose leases go stale in 1.5 s.
pub(crate) fn pool_env(api: &FakeApi) -> TestEnv {
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    env.set("DURUN_HEARTBEAT_MS", "250");
    env.set("DURUN_LEASE_STALE_MS", "1500");
    env
}

/// A worker process; killed with its process group if a test fails
/// before it stops it.
pub(crate) struct Worker(Child);

impl std::ops::Deref for Worker {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            crate::env::signal(-(self.0.id() as i32), libc::SIGKILL);
            let _ = self.0.wait();
        }
    }
}

/// Starts a worker posing as `host`, in a process group of its own (so a
/// test can stop it with every run it started).
pub(crate) fn worker(env: &TestEnv, host: &str, args: &[&str]) -> Worker {
    worker_printing_to(env, host, args, Stdio::null())
}

/// [`worker`] with its stdout (where its agents' prints go) at `stdout`.
pub(crate) fn worker_printing_to(
    env: &TestEnv,
    host: &str,
    args: &[&str],
    stdout: Stdio,
) -> Worker {
    let log = std::fs::File::create(env.path(&format!("{host}.log"))).expect("log");
    Worker(
        env.command()
            .env("DURUN_HOST_ID", host)
            .arg("worker")
            .args(args)
            .stdout(stdout)
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("a worker"),
    )
}

pub(crate) fn worker_log(env: &TestEnv, host: &str) -> String {
    std::fs::read_to_string(env.path(&format!("{host}.log"))).unwrap_or_default()
}

/// Submits the scripted agent with `plan` as task `id`.
pub(crate) fn submit(env: &TestEnv, id: &str, plan: &Value, extra: &[&str]) {
    let agent = env.scripted_agent(&format!("{id}.json"), plan);
    let mut args = vec!["-q", "submit", "--task", id];
    args.extend(extra);
    args.push("--");
    args.extend(agent.iter().map(String::as_str));
    let output = env.durun(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stdout).trim(),
        id,
        "submit prints the id on stdout"
    );
}

pub(crate) fn status(env: &TestEnv, id: &str) -> String {
    env.inspect(id)["task"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

pub(crate) fn all_completed(env: &TestEnv, ids: &[String]) -> bool {
    let listed = env.durun(&["inspect", "--json"]);
    let Ok(listed) = serde_json::from_slice::<Value>(&listed.stdout) else {
        return false;
    };
    let done = listed["tasks"].as_array().map(|tasks| {
        tasks
            .iter()
            .filter(|task| task["status"] == "completed")
            .count()
    });
    done == Some(ids.len())
}

pub(crate) fn stop(child: &mut Worker) -> std::process::ExitStatus {
    crate::env::signal(child.id() as i32, libc::SIGTERM);
    wait_exit(child, Duration::from_secs(60))
}

#[test]
fn a_pool_runs_every_task_once_though_workers_are_killed_and_paused() {
    let api = FakeApi::start();
    let env = pool_env(&api);
    let ids: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
    // Every run's agent starts grandchildren that try to outlive it
    // (SPEC 17): none may be left once the pool is done.
    let escapees = env.path("escapees");
    std::fs::create_dir(&escapees).expect("dir");
    for (i, id) in ids.iter().enumerate() {
        let plan = json!({"escapees": escapees, "steps": [
            {"begin": "think", "args": {"i": i}, "do": {"sleep_ms": 200}},
            {"begin": "charge", "effect": "mutate", "args": {"title": id}, "do": {"api": true}},
            {"begin": "after", "args": {"i": i}, "do": {"sleep_ms": 200}},
        ]});
        submit(&env, id, &plan, &[]);
    }
    assert_eq!(status(&env, "t00"), "queued");
    let mut w1 = worker(&env, "w1", &["--jobs", "2"]);
    let mut w2 = worker(&env, "w2", &["--jobs", "2"]);
    let mut w3 = worker(&env, "w3", &["--jobs", "2"]);
    wait_for("w1 to run a task", Duration::from_secs(30), || {
        worker_log(&env, "w1").contains("runs task")
    });
    // w1 dies outright, its runs with it.
    w1.kill().expect("SIGKILL w1");
    w1.wait().expect("reap w1");
    // w2 and every run it started are paused past the stale time.
    wait_for("w2 to run a task", Duration::from_secs(30), || {
        worker_log(&env, "w2").contains("runs task")
    });
    let group = -(w2.id() as i32);
    env.pause_outside_a_write(group);
    // Paused past the stale time (1.5 s here).
    std::thread::sleep(Duration::from_millis(2500));
    crate::env::signal(group, libc::SIGCONT);
    wait_for("every task to complete", Duration::from_secs(120), || {
        all_completed(&env, &ids)
    });
    assert!(stop(&mut w2).success(), "{}", worker_log(&env, "w2"));
    assert!(stop(&mut w3).success(), "{}", worker_log(&env, "w3"));
    let pids = crate::containment::escapees_in(&escapees);
    assert!(
        pids.len() >= 90,
        "each task's agent started three: {pids:?}"
    );
    wait_for(
        "every escaping grandchild to be gone",
        Duration::from_secs(1),
        || pids.iter().all(|&pid| crate::env::process_gone(pid)),
    );
    assert_eq!(api.resources(), 30, "every charge happened once");
    let mut keys = api.keys();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 30, "one key per charge");
    for id in &ids {
        let task = env.inspect(id);
        assert_eq!(task["steps"].as_array().map(Vec::len), Some(3), "{id}");
    }
    let workers = env.durun(&["inspect", "--workers", "--json"]);
    let workers: Value = serde_json::from_slice(&workers.stdout).expect("JSON");
    assert_eq!(
        workers["workers"].as_array().map(Vec::len),
        Some(0),
        "the stopped workers left the list"
    );
}

#[test]
fn a_worker_picks_up_a_submit_at_once_and_lists_itself() {
    let api = FakeApi::start();
    let env = pool_env(&api);
    let mut w = worker(&env, "w", &["--jobs", "1"]);
    wait_for("the worker to list itself", Duration::from_secs(30), || {
        let listed = env.durun(&["inspect", "--workers", "--json"]);
        serde_json::from_slice::<Value>(&listed.stdout).is_ok_and(|listed| {
            listed["workers"]
                .as_array()
                .is_some_and(|workers| workers.len() == 1)
        })
    });
    let plan =
        json!({"steps": [{"begin": "hold", "args": {}, "do": {"wait_for": env.path("release")}}]});
    let submitted = Instant::now();
    submit(&env, "t", &plan, &[]);
    wait_for("the task to run", Duration::from_secs(10), || {
        status(&env, "t") == "running"
    });
    let latency = submitted.elapsed();
    let listed = env.durun(&["inspect", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert_eq!(listed["tasks"][0]["held_by"]["host"], "w");
    let workers = env.durun(&["inspect", "--workers", "--json"]);
    let workers: Value = serde_json::from_slice(&workers.stdout).expect("JSON");
    assert_eq!(workers["workers"][0]["host"], "w");
    wait_for(
        "the worker's heartbeat to list the task",
        Duration::from_secs(10),
        || {
            let workers = env.durun(&["inspect", "--workers", "--json"]);
            serde_json::from_slice::<Value>(&workers.stdout)
                .is_ok_and(|workers| workers["workers"][0]["tasks"] == json!(["t"]))
        },
    );
    std::fs::write(env.path("release"), "").expect("release");
    wait_for("the task to complete", Duration::from_secs(30), || {
        status(&env, "t") == "completed"
    });
    assert!(stop(&mut w).success());
    eprintln!("submit to running: {latency:?}");
    assert!(latency < Duration::from_secs(5), "{latency:?}");
}

#[test]
fn sigterm_drains_a_worker_and_another_takes_its_task_over() {
    let api = FakeApi::start();
    let env = pool_env(&api);
    let plan = json!({"steps": [
        {"begin": "first", "args": {}, "do": {"value": 1}},
        {"begin": "hold", "args": {}, "do": {"wait_for": env.path("release")}},
    ]});
    submit(&env, "t", &plan, &[]);
    let mut a = worker(&env, "a", &[]);
    wait_for("a to run it past step 1", Duration::from_secs(30), || {
        env.inspect("t")["steps"][0]["status"] == "committed"
    });
    let stopped = stop(&mut a);
    assert!(
        stopped.success(),
        "exit 0 on SIGTERM: {}",
        worker_log(&env, "a")
    );
    assert_eq!(status(&env, "t"), "interrupted", "left resumable");
    let log = worker_log(&env, "a");
    assert!(
        log.contains("drains: stopping task t resumably") && log.contains("stopped"),
        "{log}"
    );
    let mut b = worker(&env, "b", &[]);
    std::fs::write(env.path("release"), "").expect("release");
    wait_for("b to complete it", Duration::from_secs(30), || {
        status(&env, "t") == "completed"
    });
    assert!(stop(&mut b).success());
    let task = env.inspect("t");
    assert_eq!(task["task"]["runs"][1]["host"], "b");
    assert_eq!(task["task"]["runs"][1]["replayed_steps"], 1);
}

#[test]
fn a_worker_killed_on_this_host_frees_its_tasks_at_once() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    // The stale time stays a minute: a takeover must not wait for it.
    env.set("DURUN_LEASE_STALE_MS", "60000");
    let plan = json!({"steps": [
        {"begin": "first", "args": {}, "do": {"value": 1}},
        {"begin": "hold", "args": {}, "do": {"wait_for": env.path("release")}},
    ]});
    submit(&env, "t", &plan, &[]);
    let mut a = worker(&env, "h", &["--jobs", "2"]);
    wait_for("a to run it past step 1", Duration::from_secs(30), || {
        env.inspect("t")["steps"][0]["status"] == "committed"
    });
    // The worker's tasks are listed as they change, not a heartbeat later.
    wait_for(
        "the worker to list its task",
        Duration::from_secs(3),
        || {
            let workers = env.durun(&["inspect", "--workers", "--json"]);
            serde_json::from_slice::<Value>(&workers.stdout).is_ok_and(|workers| {
                workers["workers"][0]["tasks"] == json!(["t"])
                    && workers["workers"][0]["stale"] == false
            })
        },
    );
    let shown = text(&env.durun(&["inspect", "--workers"]).stdout);
    assert!(shown.contains("1/2") && shown.contains(" t"), "{shown}");
    // SIGKILL the worker and the run it started.
    crate::env::signal(-(a.id() as i32), libc::SIGKILL);
    a.wait().expect("reap a");
    let mut b = worker(&env, "h", &[]);
    let killed = Instant::now();
    std::fs::write(env.path("release"), "").expect("release");
    wait_for("b to complete it", Duration::from_secs(30), || {
        status(&env, "t") == "completed"
    });
    let took = killed.elapsed();
    assert!(stop(&mut b).success());
    assert!(
        took < Duration::from_secs(10),
        "a dead worker's task waited {took:?} (the stale time is 60 s)"
    );
    assert!(
        worker_log(&env, "h").contains("on this host is gone; its tasks are free"),
        "{}",
        worker_log(&env, "h")
    );
    assert_eq!(env.inspect("t")["task"]["runs"][1]["replayed_steps"], 1);
}

#[test]
fn a_parked_task_goes_back_to_a_worker_when_its_signal_comes() {
    let api = FakeApi::start();
    let env = pool_env(&api);
    env.write("durun.toml", "[wait]\npark_after = \"0s\"\n");
    let plan = json!({"steps": [
        {"begin": "first", "args": {}, "do": {"value": 1}},
        {"wait": "go"},
    ]});
    submit(&env, "t", &plan, &[]);
    let mut w = worker(&env, "w", &["--jobs", "2"]);
    wait_for("the task to park", Duration::from_secs(30), || {
        status(&env, "t") == "waiting"
    });
    let sent = env.durun(&["signal", "t", "go", "--data", "7"]);
    assert!(sent.status.success());
    wait_for("the worker to finish it", Duration::from_secs(30), || {
        status(&env, "t") == "completed"
    });
    assert!(stop(&mut w).success());
    assert_eq!(env.inspect("t")["task"]["output"]["outputs"][1]["data"], 7);
}

#[test]
fn a_queue_runs_no_more_tasks_at_once_than_its_concurrency() {
    let api = FakeApi::start();
    let env = pool_env(&api);
    env.write("workers.toml", "[queues.slow]\nconcurrency = 1\n");
    for i in 0..3 {
        let plan = json!({"steps": [{"begin": "slow", "args": {"i": i}, "do": {"sleep_ms": 400}}]});
        submit(&env, &format!("s{i}"), &plan, &["--queue", "slow"]);
    }
    let mut w1 = worker(
        &env,
        "w1",
        &["--queue", "slow", "--jobs", "2", "--config", "workers.toml"],
    );
    let mut w2 = worker(
        &env,
        "w2",
        &["--queue", "slow", "--jobs", "2", "--config", "workers.toml"],
    );
    let ids = ["s0", "s1", "s2"].map(str::to_owned);
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all_completed(&env, &ids) {
        assert!(Instant::now() < deadline, "the queue did not finish");
        let listed = env.durun(&["inspect", "--json", "--status", "running"]);
        if let Ok(listed) = serde_json::from_slice::<Value>(&listed.stdout) {
            most = most.max(listed["tasks"].as_array().map_or(0, Vec::len));
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    assert!(stop(&mut w1).success());
    assert!(stop(&mut w2).success());
    assert_eq!(most, 1, "concurrency = 1 over both workers");
    // FIFO by submit time.
    let started: Vec<String> = ids
        .iter()
        .map(|id| {
            env.inspect(id)["task"]["runs"][0]["started_at"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut sorted = started.clone();
    sorted.sort();
    assert_eq!(started, sorted);
}

#[test]
fn bad_submissions_fail_their_task_not_the_worker() {
    let api = FakeApi::start();
    let env = pool_env(&api);
    let odd = env.durun(&["submit", "--queue", "no way", "--", "true"]);
    assert_eq!(odd.status.code(), Some(2), "{}", text(&odd.stderr));
    assert!(text(&odd.stderr).contains("invalid queue name"));
    let missing = env.durun(&["-q", "submit", "--task", "missing", "--", "./no-such-agent"]);
    assert!(missing.status.success());
    // Submitted from a directory that is gone when the worker starts it.
    let gone = env.path("gone");
    std::fs::create_dir(&gone).expect("dir");
    let submitted = env
        .command()
        .current_dir(&gone)
        .args(["-q", "submit", "--task", "nowhere", "--", "true"])
        .output()
        .expect("submit");
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    std::fs::remove_dir(&gone).expect("remove");
    submit(
        &env,
        "fine",
        &json!({"steps": [{"begin": "a", "args": {}, "do": {"value": 1}}]}),
        &[],
    );
    let mut w = worker(&env, "w", &["--jobs", "2"]);
    let ids = ["missing", "nowhere", "fine"];
    wait_for("every task to end", Duration::from_secs(30), || {
        ids.iter()
            .all(|id| matches!(status(&env, id).as_str(), "failed" | "completed"))
    });
    assert!(
        stop(&mut w).success(),
        "the worker went on: {}",
        worker_log(&env, "w")
    );
    assert_eq!(status(&env, "fine"), "completed");
    assert_eq!(env.inspect("missing")["task"]["exit_code"], 127);
    assert_eq!(env.inspect("nowhere")["task"]["exit_code"], 127);
    assert!(
        worker_log(&env, "w").contains("ended with exit 127"),
        "{}",
        worker_log(&env, "w")
    );
}

/// A worker's pid taken by another process since (the worker died, the
/// pid was reused): its claims are freed at once too, by the start time.
#[test]
fn a_worker_whose_pid_was_reused_frees_its_tasks_at_once() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    if env.postgres.is_some() {
        // The dead worker's row is written with SQLite's client; the
        // decision is the same code on both backends.
        crate::env::skipped(crate::env::SQLITE_ONLY);
        return;
    }
    env.set("API_URL", &api.url);
    env.set("DURUN_LEASE_STALE_MS", "60000");
    let plan = json!({"steps": [{"begin": "one", "args": {}, "do": {"value": 1}}]});
    submit(&env, "t", &plan, &[]);
    // A worker that claimed t and died; its pid now belongs to this test
    // process, which started long after the worker's recorded start.
    let pid = std::process::id();
    let db = rusqlite::Connection::open(&env.journal).expect("open the journal");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    db.execute(
        "INSERT INTO workers (id, host, pid, queues, jobs, started_at, heartbeat, tasks)
         VALUES (?1, 'h', ?2, '[\"default\"]', 1, '2000-01-01T00:00:00.000Z', ?3, '[\"t\"]')",
        rusqlite::params![format!("h:{pid}"), pid, now_ms],
    )
    .expect("the dead worker's row");
    db.execute(
        "UPDATE tasks SET claimed_by = ?1, claimed_at = ?2 WHERE id = 't'",
        rusqlite::params![format!("h:{pid}"), now_ms],
    )
    .expect("its claim");
    drop(db);
    let mut w = worker(&env, "h", &[]);
    let started = Instant::now();
    wait_for("the task to complete", Duration::from_secs(30), || {
        status(&env, "t") == "completed"
    });
    let took = started.elapsed();
    assert!(stop(&mut w).success());
    assert!(took < Duration::from_secs(20), "the claim held {took:?}");
    assert!(
        worker_log(&env, "h").contains(&format!("worker h:{pid} on this host is gone")),
        "{}",
        worker_log(&env, "h")
    );
}
