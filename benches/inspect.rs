//! How long `durun inspect` takes on a task with 100,000 steps, alone and
//! while another process writes to the same journal; then how long `durun
//! ui` takes to make its pages of that task and of a list of 10,000 tasks
//! (the server's own time, from its `Server-Timing` header, and the whole
//! request on loopback).
//!
//!     cargo bench --bench inspect
//!
//! The steps are written straight into a journal that durun created (so
//! the schema is durun's own), in one transaction, with outputs of a few
//! hundred bytes and token usage, like an agent's.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const STEPS: u64 = 100_000;
const SAMPLES: usize = 7;

fn durun() -> Command {
    Command::new(env!("CARGO_BIN_EXE_durun"))
}

#[path = "common.rs"]
mod common;

fn median(samples: Vec<Duration>) -> Duration {
    common::median(samples).expect("samples were taken")
}

fn time(journal: &std::path::Path, args: &[&str]) -> Duration {
    let samples = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            let status = durun()
                .env("DURUN_JOURNAL", journal)
                .args(args)
                .stdout(Stdio::null())
                .status()
                .expect("run durun");
            assert!(status.success(), "durun {args:?} failed");
            start.elapsed()
        })
        .collect();
    median(samples)
}

/// Fills task `big` with the bench's steps, in one transaction.
fn fill(journal: &std::path::Path) {
    let mut conn = rusqlite::Connection::open(journal).expect("open journal");
    let tx = conn.transaction().expect("transaction");
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO steps (task_id, step_index, tool_name, kind, effect, args, args_hash, idempotency_key,
                     status, attempts, output, usage, tokens, run, created_at, started_at, finished_at)
                 VALUES ('big', ?1, ?2, 'begin', 'read', ?3, ?4, ?5, 'committed', 1, ?6,
                     '{\"input_tokens\":800,\"output_tokens\":200}', 1000, 1,
                     '2026-11-29T10:00:00.000Z', '2026-11-29T10:00:00.000Z', '2026-11-29T10:00:01.000Z')",
            )
            .expect("prepare");
        for step in 1..=STEPS {
            let output = format!(
                "\"step {step}: {}\"",
                "lorem ipsum dolor sit amet ".repeat(10)
            );
            insert
                .execute(rusqlite::params![
                    step as i64,
                    format!("llm.step{}", step % 7),
                    format!("{{\"prompt\": \"step {step}\"}}"),
                    format!("{step:064x}"),
                    format!("{:064x}", step * 31),
                    output,
                ])
                .expect("insert");
        }
    }
    tx.commit().expect("commit");
    drop(conn);
}

/// A writer that commits a step into task `busy` every millisecond or so,
/// as a live runner would, until `stop`; how many it wrote.
fn writer(journal: &std::path::Path, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<i64> {
    let stop = Arc::clone(stop);
    let journal = journal.to_owned();
    std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(&journal).expect("open");
        conn.busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        conn.pragma_update(None, "synchronous", "FULL")
            .expect("sync");
        let mut n: i64 = conn
            .query_row(
                "SELECT coalesce(max(step_index), 0) FROM steps WHERE task_id = 'busy'",
                [],
                |row| row.get(0),
            )
            .expect("max step");
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            conn.execute(
                    "INSERT INTO steps (task_id, step_index, tool_name, kind, effect, args, args_hash,
                         idempotency_key, status, attempts, run, created_at, started_at)
                     VALUES ('busy', ?1, 'w', 'begin', 'read', '{}', 'h', 'k', 'committed', 1, 1, 'x', 'x')",
                    [n],
                )
                .expect("writer insert");
        }
        n
    })
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let journal = dir.path().join("journal.db");
    // DURUN_BENCH_KEEP=1 keeps the journal, to profile inspect on it.
    let dir = if std::env::var_os("DURUN_BENCH_KEEP").is_some() {
        let kept = dir.keep();
        eprintln!("journal kept at {}", kept.join("journal.db").display());
        None
    } else {
        Some(dir)
    };
    for task in ["big", "busy"] {
        let status = durun()
            .env("DURUN_JOURNAL", &journal)
            .args(["-q", "run", "--task", task, "--", "true"])
            .stderr(Stdio::null())
            .status()
            .expect("durun");
        assert!(status.success());
    }
    fill(&journal);
    let size = std::fs::metadata(&journal).map_or(0, |m| m.len());

    let rows = [
        ("inspect (task list)", vec!["inspect"]),
        ("inspect big (last 500 steps)", vec!["inspect", "big"]),
        (
            "inspect big --all (100k-step table)",
            vec!["inspect", "big", "--all"],
        ),
        ("inspect big --json", vec!["inspect", "big", "--json"]),
        (
            "inspect big --step 50000",
            vec!["inspect", "big", "--step", "50000"],
        ),
    ];
    println!(
        "journal: {STEPS} steps, {:.1} MiB; median of {SAMPLES} runs",
        size as f64 / 1_048_576.0
    );
    println!(
        "{:<34} {:>12} {:>22}",
        "command", "alone", "with a writer running"
    );
    // A writer commits a step every millisecond or so into another task,
    // as a live runner would, while inspect reads.
    for (label, args) in rows {
        let alone = time(&journal, &args);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = writer(&journal, &stop);
        std::thread::sleep(Duration::from_millis(50));
        let busy = time(&journal, &args);
        stop.store(true, Ordering::Relaxed);
        let written = writer.join().expect("writer");
        assert!(written > 0);
        println!(
            "{label:<34} {:>10.1}ms {:>20.1}ms",
            alone.as_secs_f64() * 1e3,
            busy.as_secs_f64() * 1e3
        );
    }
    web_view(&journal);
    drop(dir);
}

/// `durun ui`'s pages over 10,000 tasks and the 100,000-step task.
fn web_view(journal: &std::path::Path) {
    const TASKS: usize = 10_000;
    let conn = rusqlite::Connection::open(journal).expect("open journal");
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('tasks')")
        .expect("columns")
        .query_map([], |row| row.get(0))
        .expect("columns")
        .collect::<Result<_, _>>()
        .expect("columns");
    let copied: Vec<String> = columns
        .iter()
        .map(|column| {
            if column == "id" {
                "?1".to_owned()
            } else {
                column.clone()
            }
        })
        .collect();
    let copy = format!(
        "INSERT INTO tasks ({}) SELECT {} FROM tasks WHERE id = 'busy'",
        columns.join(", "),
        copied.join(", ")
    );
    conn.execute_batch("BEGIN").expect("begin");
    for n in 0..TASKS - 2 {
        conn.execute(&copy, [format!("bulk-{n:05}")])
            .expect("copy a task");
    }
    conn.execute_batch("COMMIT").expect("commit");
    drop(conn);

    let mut ui = durun()
        .env("DURUN_JOURNAL", journal)
        .args(["ui", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start durun ui");
    let mut url = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(ui.stdout.take().expect("stdout")),
        &mut url,
    )
    .expect("the URL");
    let rest = url.trim().strip_prefix("http://").expect("a URL");
    let (at, token) = rest.split_once("/?token=").expect("a token");
    println!("\ndurun ui, {TASKS} tasks; median of {SAMPLES} requests");
    println!("{:<34} {:>12} {:>22}", "page", "server", "whole request");
    for (label, path) in [
        ("task list (first 200 of 10,000)", "/"),
        ("task list, searched", "/?q=bulk-09999"),
        ("task list, one status", "/?status=completed&page=3"),
        ("tokens by day and task", "/tokens"),
        ("live digest of the list", "/api/live?key=list"),
        ("100k-step task (last 200 steps)", "/tasks/big"),
        ("100k-step task from step 50,000", "/tasks/big?from=50000"),
        ("one step of it", "/tasks/big/steps/50000"),
        ("live digest of the task", "/api/live?key=task:big"),
    ] {
        let mut server = Vec::new();
        let mut whole = Vec::new();
        for _ in 0..SAMPLES {
            let start = Instant::now();
            let answer = get(at, token, path);
            whole.push(start.elapsed());
            let timing = answer
                .lines()
                .find_map(|line| line.strip_prefix("server-timing: render;dur="))
                .and_then(|ms| ms.trim().parse::<f64>().ok())
                .expect("a Server-Timing header");
            assert!(
                answer.starts_with("HTTP/1.1 200"),
                "{path}: {}",
                &answer[..answer.len().min(300)]
            );
            server.push(timing);
        }
        println!(
            "{label:<34} {:>10.1}ms {:>20.1}ms",
            common::median(server).expect("samples"),
            median(whole).as_secs_f64() * 1e3
        );
    }
    let _ = ui.kill();
    let _ = ui.wait();
}

fn get(at: &str, token: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(at).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {at}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}
