//! What a durable step costs in durun, next to the disk's floor (one SQLite
//! WAL commit) and next to DBOS and LangGraph, on this machine, in one run.
//!
//!     cargo bench --bench steps
//!
//! Prints a Markdown table (the one in docs/performance.md) to stdout and
//! progress to stderr. Settings are interleaved round by round, so a slow
//! minute of the disk hits every row alike. The agent is this same binary,
//! started by durun with `DURUN_BENCH_AGENT` set: a real process on the
//! real protocol, whose own cost per step is a few microseconds. The
//! SDK rows run the same workflow as agent authors write it: a plain loop
//! of `durun.step` through the Python SDK (`sdk_agent.py`) and the Node
//! SDK (`sdk_agent.mjs`), beside each language's peers. Every round
//! measures both floors (one fsync'd commit, one blocking pipe round
//! trip); ratios are taken per round. Each SDK's `read` row is measured
//! twice: in a fresh process (a short script's steps, while V8 still
//! compiles the Node SDK) and after [`WARMUP`] untimed steps in the same
//! process (a long-running agent's).
//!
//! Environment:
//! - `DURUN_BENCH_ROUNDS` (5): samples per row; the table shows medians.
//! - `DURUN_BENCH_STEPS` (1000): steps per sample of the per-step rows.
//! - `DURUN_BENCH_REPLAY` (10000,100000): task sizes for the replay rows.
//! - `DURUN_PEERS` (benches/peers): the DBOS and LangGraph scripts; their
//!   virtualenv is made under `PEERS_WORK` (/tmp/durun-peers) on first use.
//!   The Node peers (`benches/peers_node`: LangGraph.js, DBOS for
//!   TypeScript on the PostgreSQL at `DURUN_BENCH_POSTGRES`, default
//!   `postgresql://postgres@127.0.0.1:5432`) are installed with npm under
//!   `PEERS_NODE_WORK` (/tmp/durun-peers-node). `DURUN_BENCH_PEERS=0`
//!   leaves the peers out.
//! - `DURUN_BENCH_NODE24`: the Node 24 binary of the `node24` rows, else
//!   installed with npm under `DURUN_BENCH_NODE24_WORK` (/tmp/durun-node24).
//! - `DURUN_BENCH_ONLY=sdk`: only the floors, the SDKs' rows and the peers;
//!   `DURUN_BENCH_ONLY=proxy`: only the floor (also of a 10 KB row) and
//!   the model proxy's rows;
//!   `DURUN_BENCH_ONLY=traces`: only the floor and trace export's rows;
//!   `DURUN_BENCH_ONLY=startup`: only start-up.
//! - `DURUN_BENCH_STATIC=0`: no static build of durun for the start-up rows
//!   (made otherwise on Linux with glibc, into the target directory).
//! - `DURUN_BENCH_AGENT=upstream` runs no bench: the proxy rows' upstream
//!   alone, answering `DURUN_BENCH_BYTES` (10000) a call, to profile durun
//!   against (docs/performance.md); it prints its port and serves until
//!   killed.

#[path = "../common.rs"]
mod common;

mod agent;
mod languages;
mod machine;
mod peers;
mod peers_node;
mod proxy;
mod replay;
mod report;
mod scratch;
mod sdk_report;
mod startup;
mod traces;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use machine::{echo, fsyncs_per_step, pipe_round_trip, spawn_true};
use peers::Peers;
use replay::{ReplayRow, crash_recovery};
use report::{Table, print_table};
use scratch::{Scratch, floor, floor_of, us_per_step};

fn main() {
    if let Ok(mode) = std::env::var("DURUN_BENCH_AGENT") {
        if mode == "echo" {
            echo();
        } else if mode == "proxy" {
            proxy::agent();
        } else if mode == "upstream" {
            // The proxy's upstream alone, to profile durun against it:
            // prints its port, serves until killed.
            let bytes = env_or("DURUN_BENCH_BYTES", 10_000);
            println!("{}", proxy::upstream(bytes));
            loop {
                std::thread::park();
            }
        } else {
            agent::main(&mode);
        }
        return;
    }
    orchestrate();
}

/// The 1-minute load average, with a warning on stderr when it is above
/// the core count: the figures of this round are of a busy machine.
fn load_average(cores: usize) -> f64 {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    if load > cores as f64 {
        eprintln!(
            "warning: the load average is {load:.2} on {cores} cores: this round's figures are of a busy machine"
        );
    }
    load
}

/// The middle sample; NaN for none.
fn median(samples: Vec<f64>) -> f64 {
    common::median(samples).unwrap_or(f64::NAN)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

/// The step's own work, the same as the peers': one line appended to a
/// side-effect file, and a small JSON document as its output.
fn step_body(counter: &mut File, i: u64) -> String {
    writeln!(counter, "{} {i}", std::process::id()).expect("write the counter file");
    format!("{{\"i\":{i},\"payload\":\"{}\"}}", "x".repeat(100))
}

/// `DURUN_BENCH_ONLY=proxy|traces|startup`: only those rows, printed;
/// true when one of them ran.
fn one_mode(
    only: Option<&str>,
    (rounds, steps, cores): (usize, u64, usize),
    root: &Path,
    static_durun: Option<&Path>,
    table: &mut Table,
) -> bool {
    match only {
        Some("proxy") => {
            only_rounds(rounds, cores, table, |table| {
                table.add("floor 1 commit full", floor(root, 1, "full", steps));
                // The commit of a row as large as a 10 KB call's record.
                table.add(
                    "floor 1 commit full, 10 KB row",
                    floor_of(root, 1, "full", steps, 10_000),
                );
                proxy::rows(root, (steps / 5).max(20), table);
                proxy::first_chunk_rows(root, (steps / 5).max(20), table);
            });
            proxy::print(table);
            true
        }
        Some("traces") => {
            only_rounds(rounds, cores, table, |table| {
                table.add("floor 1 commit full", floor(root, 1, "full", steps));
                traces::rows(root, steps, table);
            });
            println!(
                "floor: one SQLite commit, full sync: {:.0} µs",
                table.get("floor 1 commit full").unwrap_or(f64::NAN)
            );
            traces::print(table);
            true
        }
        Some("startup") => {
            only_rounds(rounds, cores, table, |table| {
                table.add("spawn true", spawn_true(200));
                startup_rows(root, static_durun, table);
            });
            report::print_startup(table);
            true
        }
        _ => false,
    }
}

/// A round's step rows at one sync level: the floors of one and two
/// commits, then durun's `read` and `mutate` steps, on any core and on one.
fn step_rows(root: &Path, steps: u64, sync: &str, table: &mut Table) {
    table.add(
        &format!("floor 1 commit {sync}"),
        floor(root, 1, sync, steps),
    );
    table.add(
        &format!("floor 2 commits {sync}"),
        floor(root, 2, sync, steps),
    );
    for (mode, pinned) in [
        ("read", false),
        ("mutate", false),
        ("read", true),
        ("mutate", true),
    ] {
        let scratch = Scratch::new(root, mode, sync);
        let mut env = vec![("DURUN_BENCH_STEPS", steps.to_string())];
        let pin = if pinned { " one core" } else { "" };
        if pinned {
            env.push(("DURUN_BENCH_PIN", "0".into()));
        }
        let (report, _, ok) = scratch.agent(&["run", "--task", "bench"], mode, &env);
        assert_eq!(ok, Some(0), "durun run failed");
        table.add(
            &format!("durun {mode} {sync}{pin}"),
            us_per_step(&report, steps),
        );
    }
}

/// A round's tool-call rows: `call`s of `true`, one at a time and 8 at
/// once, `read` and `mutate`.
fn call_rows(root: &Path, steps: u64, table: &mut Table) {
    // Tool calls: each one starts a process, so fewer steps.
    let calls = (steps / 4).max(8);
    table.add("spawn true", spawn_true(calls));
    for (mode, parallel) in [
        ("call", 1),
        ("call", 8),
        ("call_mutate", 1),
        ("call_mutate", 8),
    ] {
        let scratch = Scratch::new(root, mode, "full");
        let (report, _, ok) = scratch.agent(
            &["run", "--task", "bench"],
            mode,
            &[
                ("DURUN_BENCH_STEPS", calls.to_string()),
                ("DURUN_BENCH_PARALLEL", parallel.to_string()),
            ],
        );
        assert_eq!(ok, Some(0), "durun run failed");
        table.add(
            &format!("durun {mode} x{parallel} full"),
            us_per_step(&report, calls),
        );
    }
}

/// Syncs per step of each kind, counted with strace.
fn syncs_per_step(root: &Path) -> Vec<(&'static str, Option<f64>)> {
    eprintln!("syncs per step (strace)");
    [
        ("`read` step (begin/commit)", "read", 1),
        ("`mutate` step (begin/commit)", "mutate", 1),
        ("`call`, `mutate` tool, one at a time", "call_mutate", 1),
        ("`call`, `mutate` tool, 8 at once", "call_mutate", 8),
    ]
    .into_iter()
    .map(|(name, mode, parallel)| (name, fsyncs_per_step(root, mode, parallel)))
    .collect()
}

fn orchestrate() {
    let rounds: usize = env_or("DURUN_BENCH_ROUNDS", 5);
    let steps: u64 = env_or("DURUN_BENCH_STEPS", 1000);
    let replay_sizes: Vec<u64> = std::env::var("DURUN_BENCH_REPLAY")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|size| size.trim().parse().ok())
        .collect();
    let root = tempfile::Builder::new()
        .prefix("durun-bench-")
        .tempdir_in(std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from))
        .expect("temp dir");
    let root = root.path();
    let mut table = Table::default();

    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    eprintln!("durun bench: {rounds} rounds of {steps} steps");
    let only = std::env::var("DURUN_BENCH_ONLY").ok();
    // The start-up rows are in the whole bench and in `startup`.
    let static_durun = (!matches!(only.as_deref(), Some("sdk" | "proxy" | "traces")))
        .then(startup::static_build)
        .flatten();
    let one_mode = one_mode(
        only.as_deref(),
        (rounds, steps, cores),
        root,
        static_durun.as_deref(),
        &mut table,
    );
    if one_mode {
        if let Some(load) = report::load_line(&table) {
            println!("\n{load}");
        }
        return;
    }
    let peers = Peers::find();
    let node_peers = peers_node::NodePeers::find();
    let sdk_only = only.as_deref() == Some("sdk");
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}");
        table.add("load average", load_average(cores));
        if sdk_only {
            sdk_round(root, steps, cores, &mut table);
            if let Some(peers) = &peers {
                peers.first_runs(root, steps, &mut table);
            }
            if let Some(peers) = &node_peers {
                peers.first_runs(root, steps, &mut table);
            }
            continue;
        }
        // Both floors, every round: one fsync'd commit (below) and one
        // blocking pipe round trip.
        table.add("pipe round trip one core", pipe_round_trip(2000, false));
        if cores >= 2 {
            table.add("pipe round trip two cores", pipe_round_trip(2000, true));
        }
        language_round_trips(&mut table);
        for sync in ["full", "normal"] {
            step_rows(root, steps, sync, &mut table);
            sdk_rows(root, steps, sync, &mut table);
        }
        call_rows(root, steps, &mut table);
        proxy::rows(root, (steps / 5).max(20), &mut table);
        proxy::first_chunk_rows(root, (steps / 5).max(20), &mut table);
        traces::rows(root, steps, &mut table);
        startup_rows(root, static_durun.as_deref(), &mut table);
        if let Some(peers) = &peers {
            peers.first_runs(root, steps, &mut table);
        }
        if let Some(peers) = &node_peers {
            peers.first_runs(root, steps, &mut table);
        }
    }

    if sdk_only {
        let mut out = String::new();
        if let Some(load) = report::load_line(&table) {
            out.push_str(&load);
            out.push('\n');
        }
        sdk_report::write(&mut out, &table);
        print!("{out}");
        return;
    }
    let syncs = syncs_per_step(root);
    let mut replay_rows = Vec::new();
    // 1,000 steps always: the target for the time to the first new step.
    for &size in std::iter::once(&1000).chain(replay_sizes.iter().filter(|&&size| size != 1000)) {
        eprintln!("replay of {size} steps");
        replay_rows.push(replay::replay(root, size, rounds.min(3)));
    }
    let crash = crash_recovery(root);
    let peer_crash = peers.as_ref().map(|peers| peers.crash(root));

    print_table(
        &table,
        &syncs,
        steps,
        &replay_rows,
        crash,
        peer_crash.as_ref(),
    );
    proxy::print(&table);
    traces::print(&table);
}

/// A `DURUN_BENCH_ONLY` mode's rounds: each its load average, then `round`.
fn only_rounds(rounds: usize, cores: usize, table: &mut Table, mut round: impl FnMut(&mut Table)) {
    for n in 1..=rounds {
        eprintln!("round {n}/{rounds}");
        table.add("load average", load_average(cores));
        round(table);
    }
}

/// Start-up of the build under test and, if there is one, of the static
/// build, in one round.
fn startup_rows(root: &std::path::Path, static_durun: Option<&std::path::Path>, table: &mut Table) {
    let builds = std::iter::once(("", std::path::Path::new(env!("CARGO_BIN_EXE_durun"))))
        .chain(static_durun.map(|bin| (" static", bin)));
    for (suffix, bin) in builds {
        let scratch = Scratch::new(root, &format!("startup{}", suffix.trim()), "full");
        table.add(
            &format!("startup run{suffix}"),
            startup::run_true(&scratch, bin),
        );
        table.add(
            &format!("startup step{suffix}"),
            startup::step_in_run(&scratch, bin),
        );
    }
}

/// The floors and the SDKs' rows of one round, each row back to back
/// with its floors.
fn sdk_round(root: &std::path::Path, steps: u64, cores: usize, table: &mut Table) {
    table.add("pipe round trip one core", pipe_round_trip(2000, false));
    if cores >= 2 {
        table.add("pipe round trip two cores", pipe_round_trip(2000, true));
    }
    language_round_trips(table);
    for sync in ["full", "normal"] {
        table.add(
            &format!("floor 1 commit {sync}"),
            floor(root, 1, sync, steps),
        );
        sdk_rows(root, steps, sync, table);
    }
}

/// A blocking round trip between two Python processes, and between two
/// Node processes: the floor an SDK's agent pays for one answer.
fn language_round_trips(table: &mut Table) {
    for lang in languages::sdk_languages() {
        if let Some(trip) = machine::language_round_trip(lang, 2000) {
            table.add(&format!("{lang} round trip"), trip);
        }
    }
}

/// The untimed steps before the timed ones of the SDKs' warm rows.
pub(crate) const WARMUP: u64 = 5_000;

/// The SDKs' loops of `durun.step` at `sync`, each left failed (3) so that
/// it can be resumed: every step replayed through the SDK.
fn sdk_rows(root: &std::path::Path, steps: u64, sync: &str, table: &mut Table) {
    for lang in languages::sdk_languages() {
        for effect in ["read", "mutate"] {
            let scratch = Scratch::new(root, &format!("{lang}-{effect}"), sync);
            table.add(
                &format!("{lang} {effect} {sync}"),
                scratch.sdk_agent(lang, false, effect, (0, steps), 3),
            );
            if sync == "full" && effect == "read" {
                table.add(
                    &format!("{lang} replay"),
                    scratch.sdk_agent(lang, true, effect, (0, steps), 3),
                );
                // The same, and the language's blocking round trip, with
                // two processes that never sleep beside them.
                let busy = machine::Busy::start(2);
                table.add(
                    &format!("{lang} replay loaded"),
                    scratch.sdk_agent(lang, true, effect, (0, steps), 3),
                );
                if let Some(trip) = machine::language_round_trip(lang, 2000) {
                    table.add(&format!("{lang} round trip loaded"), trip);
                }
                drop(busy);
                // The same loop after WARMUP steps in the same process: a
                // long-running agent's step, V8's compiling done.
                let scratch = Scratch::new(root, &format!("{lang}-warm"), sync);
                table.add(
                    &format!("{lang} read full warm"),
                    scratch.sdk_agent(lang, false, effect, (WARMUP, steps), 0),
                );
            }
        }
    }
}
