//! What trace export costs a step: the same `read` steps with traces off,
//! with a collector that answers (a local one that takes every batch at
//! once), and with a collector that is down (a closed port), in one round.

use std::path::Path;

use super::{Scratch, Table, us_per_step};

/// One round of the rows.
pub(crate) fn rows(root: &Path, steps: u64, table: &mut Table) {
    let up = format!("http://127.0.0.1:{}/v1/traces", super::proxy::upstream(10));
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        format!("http://127.0.0.1:{port}/v1/traces")
    };
    for (label, endpoint) in [
        ("off", None),
        ("collector up", Some(up)),
        ("collector down", Some(down)),
    ] {
        let scratch = Scratch::new(root, "traces", "full");
        let mut env = vec![("DURUN_BENCH_STEPS", steps.to_string())];
        if let Some(endpoint) = endpoint {
            env.push(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint));
        }
        let (report, _, ok) = scratch.agent(&["run", "--task", "bench"], "read", &env);
        assert_eq!(ok, Some(0), "durun run failed");
        table.add(&format!("traces {label}"), us_per_step(&report, steps));
    }
}

/// The rows of the table: each round's figure, and the median.
pub(crate) fn print(table: &Table) {
    println!("\nTrace export, per `read` step at full sync (each round, then the median):\n");
    println!("| traces | rounds | median |");
    println!("|---|---|---|");
    for label in ["off", "collector up", "collector down"] {
        let name = format!("traces {label}");
        let samples = table
            .rows
            .iter()
            .find(|(row, _)| *row == name)
            .map(|(_, samples)| samples.clone())
            .unwrap_or_default();
        let rounds: Vec<String> = samples.iter().map(|us| format!("{us:.0}")).collect();
        println!(
            "| {label} | {} µs | {:.0} µs |",
            rounds.join(", "),
            table.get(&name).unwrap_or(f64::NAN)
        );
    }
}
