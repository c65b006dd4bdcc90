//! `durun presets` (SPEC 18): the coding-agent CLIs durun knows, as a
//! table or JSON on stdout.

use std::fmt::Write as _;
use std::io::Write as _;

use anyhow::Result;
use serde_json::json;

use crate::cli::PresetsArgs;
use crate::presets::PRESETS;

pub(crate) fn exec(args: &PresetsArgs) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    if args.json {
        let presets: Vec<serde_json::Value> = PRESETS
            .iter()
            .map(|preset| {
                json!({
                    "name": preset.name,
                    "cli": preset.about,
                    "programs": preset.programs(),
                    "verified": preset.verified,
                    "wiring": preset.wiring(),
                    "ignore": preset.ignore,
                })
            })
            .collect();
        writeln!(out, "{}", json!({ "presets": presets }))?;
        return Ok(0);
    }
    let rows: Vec<[String; 5]> = PRESETS
        .iter()
        .map(|preset| {
            [
                preset.name.to_owned(),
                preset.about.to_owned(),
                preset.verified.to_owned(),
                preset.wiring(),
                if preset.ignore.is_empty() {
                    "-".to_owned()
                } else {
                    preset.ignore.join(" ")
                },
            ]
        })
        .collect();
    let header = ["NAME", "CLI", "VERIFIED", "WIRED THROUGH", "IGNORED FIELDS"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(header.map(str::to_owned)).chain(rows) {
        let mut line = String::new();
        for (at, (cell, width)) in row.iter().zip(widths).enumerate() {
            if at + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(0)
}
