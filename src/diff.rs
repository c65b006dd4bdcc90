//! What changed in a step's args since it was recorded: the lines a
//! divergence shows.
//!
//! # Invariant
//!
//! Args that differ give at least one line and equal args none; the lines
//! name each differing leaf by its path, in a stable order (object keys
//! sorted), and stop at [`MOST`] however large the args.

use serde_json::Value;

/// A line per leaf that differs between the recorded and the asked args,
/// with its path: `args.files[2].path: "a" -> "b"`.
pub(crate) fn args_diff(recorded: &Value, asked: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    diff_at("args", recorded, asked, &mut lines);
    lines.truncate(MOST);
    lines
}

/// The most lines a divergence shows.
const MOST: usize = 20;

fn diff_at(path: &str, recorded: &Value, asked: &Value, lines: &mut Vec<String>) {
    if recorded == asked || lines.len() >= MOST {
        return;
    }
    match (recorded, asked) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let child = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff_at(&child, x, y, lines),
                    (Some(x), None) => lines.push(format!("- {child}: {x}")),
                    (None, Some(y)) => lines.push(format!("+ {child}: {y}")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                let child = format!("{path}[{i}]");
                match (a.get(i), b.get(i)) {
                    (Some(x), Some(y)) => diff_at(&child, x, y, lines),
                    (Some(x), None) => lines.push(format!("- {child}: {x}")),
                    (None, Some(y)) => lines.push(format!("+ {child}: {y}")),
                    (None, None) => {}
                }
            }
        }
        _ => lines.push(format!("  {path}: {recorded} -> {asked}")),
    }
}

#[cfg(test)]
mod tests {
    use super::args_diff;
    use serde_json::json;

    #[test]
    fn diffs_name_the_path_of_each_change() {
        let recorded =
            json!({"title": "Fix typo", "files": [{"path": "a"}, {"path": "b"}], "draft": true});
        let asked = json!({"title": "Fix typo", "files": [{"path": "a"}, {"path": "c"}, {"path": "d"}], "labels": []});
        assert_eq!(
            args_diff(&recorded, &asked),
            [
                "- args.draft: true",
                "  args.files[1].path: \"b\" -> \"c\"",
                "+ args.files[2]: {\"path\":\"d\"}",
                "+ args.labels: []",
            ]
        );
        assert_eq!(args_diff(&json!(1), &json!("1")), ["  args: 1 -> \"1\""]);
        assert!(args_diff(&recorded, &recorded).is_empty());
    }

    #[test]
    fn a_huge_change_shows_a_bounded_number_of_lines() {
        let wide = |value: u32| {
            serde_json::Value::Object(
                (0..500)
                    .map(|key| (format!("k{key:03}"), json!(value)))
                    .collect(),
            )
        };
        let lines = args_diff(&wide(1), &wide(2));
        assert_eq!(lines.len(), super::MOST);
        assert_eq!(lines[19], "  args.k019: 1 -> 2");
        let lines = args_diff(&json!([wide(1), 7]), &json!([wide(2)]));
        assert_eq!(lines.len(), super::MOST);
        assert_eq!(lines[0], "  args[0].k000: 1 -> 2");
    }
}
