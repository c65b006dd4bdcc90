//! The SDKs' part of the table: a plain `durun.step` loop in Python and in
//! JavaScript, against both floors (one fsync'd commit, one blocking pipe
//! round trip) and against the peers in the same language, every ratio
//! taken per round.

use std::fmt::Write as _;

use crate::median;
use crate::report::Table;

/// The per-round ratios of `row` over `floor`, as `low–high×`.
fn range(table: &Table, row: &str, floor: &str) -> Option<(f64, f64, f64)> {
    let values = table.samples(row)?;
    let floors = table.samples(floor)?;
    if values.len() != floors.len() {
        return None;
    }
    Some(spread(
        values.iter().zip(floors).map(|(v, f)| v / f).collect(),
    ))
}

/// The lowest, highest and median of per-round figures.
pub(crate) fn spread(rounds: Vec<f64>) -> (f64, f64, f64) {
    let low = rounds.iter().copied().fold(f64::INFINITY, f64::min);
    let high = rounds.iter().copied().fold(0.0, f64::max);
    (low, high, median(rounds))
}

fn shown(ratio: Option<(f64, f64, f64)>) -> String {
    ratio.map_or_else(
        || "-".into(),
        |(low, high, _)| format!("{low:.2}–{high:.2}×"),
    )
}

/// The round trip the SDK's agent pays: on two cores each process has its
/// own, else both share one.
fn trip_row(table: &Table) -> &'static str {
    if table.samples("pipe round trip two cores").is_some() {
        "pipe round trip two cores"
    } else {
        "pipe round trip one core"
    }
}

/// The peers of each language: row name, what it is.
const PEERS: &[(&str, &[(&str, &str)])] = &[
    (
        "python",
        &[
            ("DBOS", "DBOS Transact (Python), SQLite WAL"),
            (
                "LangGraph",
                "LangGraph (Python), functional API, SqliteSaver, sync",
            ),
        ],
    ),
    (
        "node",
        &[
            ("DBOS-TS", "DBOS Transact (TypeScript), PostgreSQL"),
            ("LangGraph.js", "LangGraph.js, functional API, SqliteSaver"),
        ],
    ),
];

/// What the SDKs' table shows, the floor it is read against, and its head.
fn head(out: &mut String, table: &Table) {
    let _ = writeln!(
        out,
        "\nThe SDKs: a plain loop of `durun.step` (the time includes settling: until durun answered every step), and the same workflow on each language's peers. Ratios are per round, shown as the range over the rounds.\n"
    );
    let floors: Vec<String> = ["full", "normal"]
        .iter()
        .filter_map(|sync| {
            let us = table.get(&format!("floor 1 commit {sync}"))?;
            Some(format!("{sync} {us:.0} µs"))
        })
        .collect();
    if !floors.is_empty() {
        let _ = writeln!(
            out,
            "One raw SQLite commit (the floor, median of the rounds): {}.\n",
            floors.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "| who | step | sync | per step | × 1 commit (same sync) | × blocking round trip |"
    );
}

pub(crate) fn write(out: &mut String, table: &Table) {
    let machine_trip = trip_row(table);
    head(out, table);
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for (lang, name) in [
        ("python", "Python SDK"),
        ("node", "Node SDK"),
        ("node24", "Node SDK on Node 24"),
    ] {
        // The round trip between two processes of the SDK's language, else
        // the machine's.
        let own = format!("{lang} round trip");
        let trip = if table.samples(&own).is_some() {
            own.as_str()
        } else {
            machine_trip
        };
        if let Some(us) = table.get(trip) {
            let _ = writeln!(
                out,
                "| {name}'s language: a blocking line round trip between two processes | - | - | {us:.0} µs | - | 1× |"
            );
        }
        for sync in ["full", "normal"] {
            let floor = format!("floor 1 commit {sync}");
            for effect in ["read", "mutate"] {
                let row = format!("{lang} {effect} {sync}");
                if let Some(us) = table.get(&row) {
                    let _ = writeln!(
                        out,
                        "| {name} | `{effect}`, first run | {sync} | {us:.0} µs | {} | {} |",
                        shown(range(table, &row, &floor)),
                        shown(range(table, &row, trip)),
                    );
                }
            }
        }
        let row = format!("{lang} read full warm");
        if let Some(us) = table.get(&row) {
            let _ = writeln!(
                out,
                "| {name} | `read`, first run, after {},{:03} untimed steps in the same process | full | {us:.0} µs | {} | {} |",
                crate::WARMUP / 1000,
                crate::WARMUP % 1000,
                shown(range(table, &row, "floor 1 commit full")),
                shown(range(table, &row, trip)),
            );
        }
        let row = format!("{lang} replay");
        if let Some(us) = table.get(&row) {
            let _ = writeln!(
                out,
                "| {name} | replayed (`durun resume`) | - | {us:.0} µs | - | {} |",
                shown(range(table, &row, trip)),
            );
        }
        let row = format!("{lang} replay loaded");
        let loaded_trip = format!("{lang} round trip loaded");
        if let Some(us) = table.get(&row) {
            let _ = writeln!(
                out,
                "| {name} | replayed, two busy processes beside it | - | {us:.0} µs | - | {} (its round trip then: {:.0} µs) |",
                shown(range(table, &row, &loaded_trip)),
                table.get(&loaded_trip).unwrap_or(f64::NAN),
            );
        }
        let peers = PEERS
            .iter()
            .find(|(peer_lang, _)| *peer_lang == lang)
            .map_or(&[][..], |(_, peers)| *peers);
        for (peer, what) in peers {
            for sync in ["full", "normal"] {
                let row = format!("{peer} {sync}");
                if let Some(us) = table.get(&row) {
                    let _ = writeln!(
                        out,
                        "| {what} | step | {sync} | {us:.0} µs | {} | - |",
                        shown(range(table, &row, &format!("floor 1 commit {sync}"))),
                    );
                }
            }
        }
    }
    for (lang, name) in [("python", "Python"), ("node", "Node")] {
        let mut said = Vec::new();
        for sync in ["full", "normal"] {
            if let Some((low, high, mid)) = nearest_peer(table, lang, sync) {
                said.push(format!("{sync}: {mid:.1}× (rounds {low:.1}–{high:.1}×)"));
            }
        }
        if !said.is_empty() {
            let _ = writeln!(
                out,
                "\n{name}: the nearest peer's step over the SDK's `read` step, per round: {}.",
                said.join("; ")
            );
        }
    }
}

/// Per round, the fastest peer of `lang` at `sync` over the SDK's `read`
/// step: (lowest, highest, median) over the rounds.
fn nearest_peer(table: &Table, lang: &str, sync: &str) -> Option<(f64, f64, f64)> {
    let sdk = table.samples(&format!("{lang} read {sync}"))?;
    let (_, peers) = PEERS.iter().find(|(peer_lang, _)| *peer_lang == lang)?;
    let rows: Vec<&[f64]> = peers
        .iter()
        .filter_map(|(peer, _)| table.samples(&format!("{peer} {sync}")))
        .filter(|samples| samples.len() == sdk.len())
        .collect();
    if rows.is_empty() {
        return None;
    }
    let ratios: Vec<f64> = (0..sdk.len())
        .map(|round| {
            let nearest = rows
                .iter()
                .map(|samples| samples[round])
                .fold(f64::INFINITY, f64::min);
            nearest / sdk[round]
        })
        .collect();
    Some(spread(ratios))
}
