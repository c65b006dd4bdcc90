//! A worker runs each task it claims on a thread of its own (SPEC 16):
//! what that must not cost. A panic in one run (a bug) ends that run
//! alone, its agent with it, and leaves the task resumable; every line a
//! run writes to the worker's log says which task it is from. On SQLite
//! by `cargo test`, on PostgreSQL by `.ci/run`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, text, wait_for};
use crate::workers::{stop, worker, worker_log, worker_printing_to};

fn status(env: &TestEnv, id: &str) -> String {
    env.inspect(id)["task"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn submit(env: &TestEnv, id: &str, command: &[String]) {
    let mut args = vec!["-q", "submit", "--task", id, "--"];
    args.extend(command.iter().map(String::as_str));
    let submitted = env.durun(&args);
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
}

#[test]
fn a_panic_in_one_run_ends_that_run_alone_and_leaves_its_task_resumable() {
    let mut env = TestEnv::new();
    env.set("DURUN_TEST_PANIC_TASK", "buggy");
    let pidfile = env.path("buggy.pid");
    let buggy = env.scripted_agent(
        "buggy.json",
        &json!({"pidfile": pidfile, "steps": [{"begin": "a", "args": {}, "do": {"value": 1}}]}),
    );
    submit(&env, "buggy", &buggy);
    let mut w = worker(&env, "w", &["--jobs", "2"]);
    wait_for("the buggy run to end", Duration::from_secs(30), || {
        worker_log(&env, "w").contains("task buggy ended in a panic")
    });
    assert_eq!(status(&env, "buggy"), "interrupted", "left resumable");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("the agent started")
        .parse()
        .expect("a pid");
    wait_for(
        "its agent to die with the run",
        Duration::from_secs(10),
        || crate::env::process_gone(pid),
    );
    // The worker goes on: it runs the next task, and leaves the buggy one.
    let fine = env.scripted_agent(
        "fine.json",
        &json!({"steps": [{"begin": "a", "args": {}, "do": {"value": 1}}]}),
    );
    submit(&env, "fine", &fine);
    wait_for("the next task to complete", Duration::from_secs(30), || {
        status(&env, "fine") == "completed"
    });
    assert!(
        w.try_wait().expect("wait").is_none(),
        "{}",
        worker_log(&env, "w")
    );
    assert_eq!(status(&env, "buggy"), "interrupted", "not taken again here");
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    // Without the bug, a resume completes it.
    let resumed = env
        .command()
        .env_remove("DURUN_TEST_PANIC_TASK")
        .args(["-q", "resume", "buggy"])
        .output()
        .expect("resume");
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let task: Value = env.inspect("buggy");
    assert_eq!(task["task"]["status"], "completed");
    assert_eq!(task["task"]["runs"][0]["exit_code"], 70);
}

#[test]
fn each_line_in_a_workers_log_names_its_task() {
    let env = TestEnv::new();
    let talk = ["sh", "-c", "echo one >&2; printf two >&2"].map(String::from);
    submit(&env, "talk", &talk);
    submit(&env, "nosuch", &["./no-such-agent".to_owned()]);
    let mut w = worker(&env, "w", &["--jobs", "2"]);
    wait_for("both tasks to end", Duration::from_secs(30), || {
        status(&env, "talk") == "completed" && status(&env, "nosuch") == "failed"
    });
    assert!(stop(&mut w).success());
    let log = worker_log(&env, "w");
    // The agent's lines, whole, the last one without its newline too.
    assert!(log.contains("[talk] one\n"), "{log}");
    assert!(log.contains("[talk] two\n"), "{log}");
    // durun's own line about a run.
    assert!(
        log.lines()
            .any(|line| line.starts_with("[nosuch] durun: cannot start `./no-such-agent`")),
        "{log}"
    );
}

/// Threads and open files of process `pid`.
fn holdings(pid: u32) -> (usize, usize) {
    let count = |what: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{what}"))
            .map(Iterator::count)
            .unwrap_or_default()
    };
    (count("task"), count("fd"))
}

#[test]
fn a_worker_keeps_no_thread_or_file_of_a_run_that_ended() {
    let env = TestEnv::new();
    let step = env.scripted_agent(
        "step.json",
        &json!({"steps": [{"begin": "a", "args": {}, "do": {"value": 1}}]}),
    );
    let submit_all = |first: usize, count: usize| {
        for index in first..first + count {
            submit(&env, &format!("t{index}"), &step);
        }
    };
    // The journal exists before the worker opens it.
    submit_all(0, 4);
    let mut w = worker(&env, "w", &["--jobs", "2"]);
    let pid = w.id();
    let settle = |first: usize, count: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let statuses: Vec<String> = (first..first + count)
                .map(|index| status(&env, &format!("t{index}")))
                .collect();
            if statuses.iter().all(|status| status == "completed") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "tasks t{first}..: {statuses:?}\n{}",
                worker_log(&env, "w")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The last run's thread ends a moment after its task completes.
        std::thread::sleep(Duration::from_millis(300));
        holdings(pid)
    };
    let (threads, files) = settle(0, 4);
    submit_all(4, 16);
    let (threads_after, files_after) = settle(4, 16);
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    assert!(
        threads_after <= threads && files_after <= files,
        "after 4 runs: {threads} threads, {files} files; after 20: {threads_after}, {files_after}"
    );
}

#[test]
fn an_agent_killed_outright_ends_its_run_not_the_worker() {
    let env = TestEnv::new();
    let pidfile = env.path("victim.pid");
    let victim = env.scripted_agent(
        "victim.json",
        &json!({"pidfile": pidfile, "steps": [
            {"begin": "hold", "args": {}, "do": {"wait_for": env.path("release")}},
        ]}),
    );
    submit(&env, "victim", &victim);
    let mut w = worker(&env, "w", &["--jobs", "2"]);
    wait_for("the agent to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&pidfile).is_ok_and(|pid| !pid.is_empty())
    });
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("pid")
        .parse()
        .expect("a pid");
    crate::env::signal(pid, libc::SIGKILL);
    wait_for("its run to end", Duration::from_secs(30), || {
        worker_log(&env, "w").contains(
            "task victim ended: its agent was killed by signal 9 (exit 137); it is resumed at once",
        )
    });
    // A crash leaves the task resumable: the worker runs it again.
    std::fs::write(env.path("release"), "").expect("release");
    wait_for("the task to complete", Duration::from_secs(30), || {
        status(&env, "victim") == "completed"
    });
    assert!(
        w.try_wait().expect("wait").is_none(),
        "{}",
        worker_log(&env, "w")
    );
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    let task = env.inspect("victim");
    assert_eq!(task["task"]["runs"][0]["exit_code"], 137);
    assert_eq!(task["task"]["runs"][1]["exit_code"], 0);
}

/// CPU time process `pid` has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(") ").expect("stat fields");
    // utime and stime: fields 14 and 15, the 12th and 13th after the state.
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

#[test]
fn a_busy_worker_waits_quietly_for_a_free_place() {
    let env = TestEnv::new();
    let hold = env.scripted_agent(
        "hold.json",
        &json!({"steps": [{"begin": "hold", "args": {}, "do": {"wait_for": env.path("release")}}]}),
    );
    submit(&env, "busy", &hold);
    let mut w = worker(&env, "w", &["--jobs", "1"]);
    wait_for("the first task to run", Duration::from_secs(30), || {
        env.path("release.waiting").exists()
    });
    // A submit while its one place is taken: news it cannot act on yet.
    let next = env.scripted_agent(
        "next.json",
        &json!({"steps": [{"begin": "a", "args": {}, "do": {"value": 1}}]}),
    );
    submit(&env, "next", &next);
    let before = cpu_ticks(w.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(w.id()) - before;
    std::fs::write(env.path("release"), "").expect("release");
    wait_for("both tasks to complete", Duration::from_secs(30), || {
        status(&env, "next") == "completed" && status(&env, "busy") == "completed"
    });
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    // 100 ticks a second: a worker spinning on the news would use ~200.
    assert!(used < 50, "the worker used {used} ticks of CPU in 2 s");
}

#[test]
fn tasks_a_worker_cannot_take_now_never_hide_the_ones_behind_them() {
    let env = TestEnv::new();
    // More sleeping tasks at the head of the queue than one look of a
    // worker with one place reads (four).
    let sleeper: Vec<String> = ["durun", "sleep", "1h"].map(str::to_owned).into();
    for i in 1..=6 {
        submit(&env, &format!("sleeper-{i}"), &sleeper);
    }
    submit(&env, "behind", &["true".to_owned()]);
    let mut w = worker(&env, "w", &["--jobs", "1"]);
    wait_for(
        "the task behind them to run",
        Duration::from_secs(30),
        || status(&env, "behind") == "completed",
    );
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    for i in 1..=6 {
        assert_eq!(status(&env, &format!("sleeper-{i}")), "sleeping");
    }
}

/// A run whose agent's last prints wait for the worker's stdout (a pipe
/// nobody reads) holds up neither its worker, which takes its next task
/// meanwhile, nor the worker's stop: the prints are given up on once the
/// stop came and the pipe took nothing for a while.
#[test]
fn a_run_whose_prints_wait_for_stdout_does_not_hold_up_its_worker() {
    let env = TestEnv::new();
    // 1 MiB to stdout: more than a pipe holds.
    let loud = ["sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' x"].map(String::from);
    submit(&env, "loud", &loud);
    let mut w = worker_printing_to(&env, "w", &["--jobs", "2"], std::process::Stdio::piped());
    wait_for("the loud task to complete", Duration::from_secs(30), || {
        status(&env, "loud") == "completed"
    });
    submit(&env, "quiet", &["true".to_owned()]);
    wait_for("the next task to complete", Duration::from_secs(30), || {
        status(&env, "quiet") == "completed"
    });
    // Never read: the worker stops all the same.
    let stdout = w.stdout.take().expect("the worker's stdout");
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    drop(stdout);
}

/// Every byte a worker's runs print reaches the worker's stdout when it is
/// read, in order, the last line of each run too, through the worker's
/// stop.
#[test]
fn a_workers_runs_lose_no_print_that_is_read() {
    use std::io::Read as _;
    let env = TestEnv::new();
    // 1 MiB and a line that ends it: more than a pipe holds.
    let loud = [
        "sh",
        "-c",
        "head -c 1048576 /dev/zero | tr '\\0' x; echo; echo the-end-of-loud",
    ]
    .map(String::from);
    submit(&env, "loud", &loud);
    let mut w = worker_printing_to(&env, "w", &["--jobs", "2"], std::process::Stdio::piped());
    let mut stdout = w.stdout.take().expect("the worker's stdout");
    let reader = std::thread::spawn(move || {
        let mut printed = Vec::new();
        stdout
            .read_to_end(&mut printed)
            .expect("read the worker's stdout");
        printed
    });
    wait_for("the loud task to complete", Duration::from_secs(30), || {
        status(&env, "loud") == "completed"
    });
    let last = ["sh", "-c", "echo the-last-print"].map(String::from);
    submit(&env, "last", &last);
    wait_for("the last task to complete", Duration::from_secs(30), || {
        status(&env, "last") == "completed"
    });
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    let printed = String::from_utf8(reader.join().expect("the reader")).expect("UTF-8");
    let mut lines = printed.lines();
    let first = lines.next().expect("the loud run's print");
    assert_eq!(first.len(), 1 << 20, "the whole MiB, on one line");
    assert!(first.bytes().all(|byte| byte == b'x'), "nothing else in it");
    assert_eq!(
        lines.collect::<Vec<_>>(),
        ["the-end-of-loud", "the-last-print"],
        "each run's prints whole and in order"
    );
}

/// A worker's runs put their sockets in one private directory (not one
/// made and removed for each run), each removed with its run; the
/// directory goes with the worker.
#[test]
fn a_workers_runs_share_one_socket_directory_that_goes_with_the_worker() {
    let mut env = TestEnv::new();
    let tmp = env.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let tmp_text = tmp.to_string_lossy().into_owned();
    env.set("TMPDIR", tmp_text.clone());
    env.set("XDG_RUNTIME_DIR", tmp_text);
    let mut w = worker(&env, "w", &["--jobs", "1"]);
    let sockets: Vec<std::path::PathBuf> = ["a", "b"]
        .iter()
        .map(|id| {
            let said = env.path(&format!("{id}.socket"));
            let script = format!("echo \"$DURUN_SOCKET\" > '{}'", said.display());
            submit(&env, id, &["sh".into(), "-c".into(), script]);
            wait_for("the run to complete", Duration::from_secs(30), || {
                status(&env, id) == "completed"
            });
            let path = std::fs::read_to_string(&said).expect("the agent said its socket");
            std::path::PathBuf::from(path.trim())
        })
        .collect();
    assert_ne!(sockets[0], sockets[1]);
    let home = sockets[0].parent().expect("a directory");
    assert_eq!(Some(home), sockets[1].parent(), "{sockets:?}");
    assert_eq!(home.parent(), Some(tmp.as_path()));
    // Each socket went with its run; the directory stays for the next.
    assert!(!sockets[0].exists() && !sockets[1].exists());
    assert!(home.is_dir());
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    let left: Vec<_> = std::fs::read_dir(&tmp).expect("tmp").flatten().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A task this durun cannot run (its recorded preset is one it lacks: a
/// task from another version) is not taken again at once, over and over:
/// its runs back off as an agent's crashes do.
#[test]
fn a_task_this_durun_cannot_run_is_taken_again_only_after_a_wait() {
    let env = TestEnv::new();
    submit(&env, "t", &["true".to_owned()]);
    env.sql("UPDATE tasks SET launch = '{\"preset\": \"no-such\"}' WHERE id = 't'");
    let mut w = worker(&env, "w", &[]);
    wait_for("the first run to end", Duration::from_secs(30), || {
        worker_log(&env, "w").contains("a preset this durun lacks")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(stop(&mut w).success(), "{}", worker_log(&env, "w"));
    let shown = env.inspect("t");
    let runs = shown["task"]["runs"].as_array().map_or(0, Vec::len);
    // At once, at once again, then after a second, then two more: taken
    // again at once each time, it would be dozens.
    assert!(
        (2..=4).contains(&runs),
        "{runs} runs in about two seconds: {}",
        worker_log(&env, "w")
    );
    assert_eq!(shown["task"]["status"], "interrupted", "{shown}");
}
