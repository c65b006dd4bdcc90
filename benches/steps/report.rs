//! The rows of the table, and the Markdown printed at the end.

use std::fmt::Write as _;
use std::io::Write;

use crate::ReplayRow;
use crate::median;
use crate::peers::PeerCrash;

/// Rows of the table, in the order they were first sampled.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) rows: Vec<(String, Vec<f64>)>,
}

impl Table {
    pub(crate) fn add(&mut self, name: &str, value: f64) {
        match self.rows.iter_mut().find(|(row, _)| row == name) {
            Some((_, samples)) => samples.push(value),
            None => self.rows.push((name.to_owned(), vec![value])),
        }
    }

    /// Every round's sample of a row, in round order.
    pub(crate) fn samples(&self, name: &str) -> Option<&[f64]> {
        self.rows
            .iter()
            .find(|(row, _)| row == name)
            .map(|(_, samples)| samples.as_slice())
    }

    pub(crate) fn get(&self, name: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|(row, _)| row == name)
            .map(|(_, samples)| median(samples.clone()))
    }
}

/// The load average at the start of each round, said beside the figures,
/// with a warning when it was above the core count.
pub(crate) fn load_line(table: &Table) -> Option<String> {
    let loads = table.samples("load average")?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let shown: Vec<String> = loads.iter().map(|load| format!("{load:.2}")).collect();
    let busy = loads.iter().any(|load| *load > cores as f64);
    Some(format!(
        "Load average (1 min) at the start of each round: {} on {cores} cores{}",
        shown.join(", "),
        if busy {
            ": **above the core count; the figures are of a busy machine**"
        } else {
            ""
        }
    ))
}

/// A row against its floor: its median, the range of the ratios taken in
/// each round (the row and its floor measured back to back), and the
/// median difference.
fn ratio(table: &Table, row: &str, floor: &str) -> String {
    match (table.samples(row), table.samples(floor)) {
        (Some(values), Some(floors)) if values.len() == floors.len() => {
            let ratios: Vec<f64> = values
                .iter()
                .zip(floors)
                .map(|(value, floor)| value / floor)
                .collect();
            let over: Vec<f64> = values
                .iter()
                .zip(floors)
                .map(|(value, floor)| value - floor)
                .collect();
            let (low, high, _) = crate::sdk_report::spread(ratios);
            format!(
                "{:.0} µs | {low:.2}–{high:.2}× | {:+.0} µs",
                median(values.to_vec()),
                median(over)
            )
        }
        _ => "- | - | -".into(),
    }
}

/// The syncs per step and the replay table.
fn syncs_and_replay(out: &mut String, syncs: &[(&str, Option<f64>)], replay: &[ReplayRow]) {
    if syncs.iter().any(|(_, count)| count.is_some()) {
        let _ = writeln!(
            out,
            "\nSyncs to disk per step (`sync = \"full\"`), counted with strace; exact, not timed.\n"
        );
        let _ = writeln!(out, "| durun | fsyncs per step |");
        let _ = writeln!(out, "|---|---|");
        for (name, count) in syncs {
            if let Some(count) = count {
                let _ = writeln!(out, "| {name} | {count:.2} |");
            }
        }
    }
    let _ = writeln!(
        out,
        "\nReplay: resuming a task whose steps are all recorded; the agent asks for every step, then one new one.\n"
    );
    let _ = writeln!(
        out,
        "| recorded steps | replay per step | `resume` to first new step | durun peak memory, first run | durun peak memory, resume | journal per step |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for row in replay {
        let _ = writeln!(
            out,
            "| {} | {:.2} µs | {:.1} ms | {:.1} MiB | {:.1} MiB | {:.0} B |",
            row.steps,
            row.us_per_step,
            row.first_new_ms,
            row.peak_kib_first_run as f64 / 1024.0,
            row.peak_kib_resume as f64 / 1024.0,
            row.bytes_per_step,
        );
    }
}

/// Time to the first step after a crash, durun's and the peers'.
fn crash_lines(out: &mut String, crash_s: f64, peer_crash: Option<&Vec<PeerCrash>>) {
    let _ = writeln!(
        out,
        "Crash inside step 500 of 1,000 (SIGKILL), then recovery in a new process: time to the first step that runs.\n"
    );
    let _ = writeln!(out, "| who | to first step | finished steps run again |");
    let _ = writeln!(out, "|---|---|---|");
    let _ = writeln!(
        out,
        "| durun (`durun resume`, from its start) | {crash_s:.3} s | 0 |"
    );
    for PeerCrash {
        name,
        seconds,
        rerun,
    } in peer_crash.into_iter().flatten()
    {
        let _ = writeln!(
            out,
            "| {name} (from after the interpreter's start) | {seconds:.3} s | {rerun} |"
        );
    }
}

pub(crate) fn print_table(
    table: &Table,
    syncs: &[(&str, Option<f64>)],
    steps: u64,
    replay: &[ReplayRow],
    crash_s: f64,
    peer_crash: Option<&Vec<PeerCrash>>,
) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Per step, median of the rounds, {steps} steps a sample; the ratio to the floor of the same sync mode (one commit; two for `mutate`) is taken in each round and shown as the range over the rounds.\n"
    );
    if let Some(load) = load_line(table) {
        let _ = writeln!(out, "{load}\n");
    }
    let _ = writeln!(out, "| what | sync | per step | × floor | over floor |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for (row, cores) in [
        ("pipe round trip one core", "both on one core"),
        ("pipe round trip two cores", "each on its own core"),
    ] {
        if let Some(trip) = table.get(row) {
            let _ = writeln!(
                out,
                "| a line to another process and back, {cores} (a `begin`/`commit` step makes two) | - | {trip:.0} µs | - | - |"
            );
        }
    }
    for sync in ["full", "normal"] {
        let one = format!("floor 1 commit {sync}");
        let two = format!("floor 2 commits {sync}");
        for (row, name, floor) in [
            (one.clone(), "SQLite floor, 1 commit", one.clone()),
            (two.clone(), "SQLite floor, 2 commits", two.clone()),
            (
                format!("durun read {sync}"),
                "durun `read` step (begin/commit)",
                one.clone(),
            ),
            (
                format!("durun mutate {sync}"),
                "durun `mutate` step (begin/commit)",
                two.clone(),
            ),
            (
                format!("durun read {sync} one core"),
                "durun `read` step, durun and agent on one core",
                one.clone(),
            ),
            (
                format!("durun mutate {sync} one core"),
                "durun `mutate` step, durun and agent on one core",
                two.clone(),
            ),
        ] {
            if table.get(&row).is_some() {
                let _ = writeln!(out, "| {name} | {sync} | {} |", ratio(table, &row, &floor));
            }
        }
    }
    if let Some(spawn) = table.get("spawn true") {
        let _ = writeln!(
            out,
            "| start the command `true` and wait for it (no durun) | - | {spawn:.0} µs | - | - |"
        );
    }
    for (row, name, floor) in [
        (
            "durun call x1 full",
            "durun `call`, `read` tool `true`, one at a time",
            "floor 1 commit full",
        ),
        (
            "durun call x8 full",
            "durun `call`, `read` tool `true`, 8 at once",
            "floor 1 commit full",
        ),
        (
            "durun call_mutate x1 full",
            "durun `call`, `mutate` tool `true`, one at a time",
            "floor 2 commits full",
        ),
        (
            "durun call_mutate x8 full",
            "durun `call`, `mutate` tool `true`, 8 at once",
            "floor 2 commits full",
        ),
    ] {
        let _ = writeln!(out, "| {name} | full | {} |", ratio(table, row, floor));
    }
    crate::sdk_report::write(&mut out, table);
    syncs_and_replay(&mut out, syncs, replay);
    startup_lines(&mut out, table);
    let _ = writeln!(out);
    crash_lines(&mut out, crash_s, peer_crash);
    print!("{out}");
    let _ = std::io::stdout().flush();
}

/// Start-up, one line per row measured: the build under test, and the
/// static build where the bench made one.
fn startup_lines(out: &mut String, table: &Table) {
    for (row, what) in [
        ("startup run", "`durun run -- true` on an existing journal"),
        ("startup step", "`durun step NAME -- true` inside a run"),
        (
            "startup run static",
            "`durun run -- true`, static build (as the README installs it)",
        ),
        (
            "startup step static",
            "`durun step NAME -- true`, static build",
        ),
    ] {
        if let Some(samples) = table.samples(row) {
            let (low, high, mid) = crate::sdk_report::spread(samples.to_vec());
            let _ = writeln!(
                out,
                "\nStart-up of {what}: {mid:.1} ms (median of 100 each round; rounds {low:.1}–{high:.1} ms)."
            );
        }
    }
}

/// `DURUN_BENCH_ONLY=startup`: the start-up lines, beside one `true`.
pub(crate) fn print_startup(table: &Table) {
    let mut out = String::new();
    if let Some(spawn) = table.get("spawn true") {
        let _ = writeln!(
            out,
            "Spawning `true` from the bench: {:.2} ms.",
            spawn / 1e3
        );
    }
    startup_lines(&mut out, table);
    print!("{out}");
}
