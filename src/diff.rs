//! What changed in a step's args since it was recorded: the lines a
//! divergence shows.
//!
//! # Invariant
//!
//! Args that differ give at least one line and equal args none; the lines
//! name each differing leaf by its JSON pointer, the syntax `[proxy]
//! ignore` takes (a proxied request's from its body, so that a line can be
//! pasted there), in a stable order (object keys sorted), and stop at
//! [`MOST`] however large the args.

use serde_json::Value;

/// A line per leaf that differs between the recorded and the asked args,
/// with its pointer: `/files/2/path: "a" -> "b"`.
pub(crate) fn args_diff(recorded: &Value, asked: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    diff_at("", recorded, asked, &mut lines);
    lines.truncate(MOST);
    lines
}

/// [`args_diff`] of a proxied request's args (`{"body", "query"}`): its
/// body's leaves by their pointers into the body, as `[proxy] ignore`
/// names them, and its query as `?query` (its last line).
pub(crate) fn request_diff(recorded: &Value, asked: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    diff_at("", part(recorded, "body"), part(asked, "body"), &mut lines);
    lines.truncate(MOST - 1);
    let (was, is) = (part(recorded, "query"), part(asked, "query"));
    if was != is {
        lines.push(format!("  ?query: {was} -> {is}"));
    }
    lines
}

/// A member of a request's args, `null` when it has none.
fn part<'v>(args: &'v Value, name: &str) -> &'v Value {
    args.get(name).unwrap_or(&Value::Null)
}

/// The pointers into a proxied request's body where `asked` differs from
/// `recorded`, for `[proxy] ignore`; none when the query differs too or
/// more than `most` leaves do.
fn ignorable(recorded: &Value, asked: &Value, most: usize) -> Option<Vec<String>> {
    let lines = request_diff(recorded, asked);
    if lines.is_empty() || lines.len() > most {
        return None;
    }
    // `  /a/b: x -> y`, `- /a: x`, `+ /a: y`: the pointer before the first
    // `: ` (one escaped as JSON pointers are has no space); `?query` and
    // the whole body (`/`) are not fields to ignore.
    let pointers: Vec<String> = lines
        .iter()
        .filter_map(|line| {
            line.get(2..)?
                .split_once(": ")
                .map(|(pointer, _)| pointer.to_owned())
        })
        .filter(|pointer| pointer.starts_with('/') && pointer != "/")
        .collect();
    (pointers.len() == lines.len()).then_some(pointers)
}

/// The paste-ready line that makes `asked` replay `recorded` (SPEC 18):
/// `add to durun.toml [proxy] ignore = ["/…", …] to replay this call`, when
/// they differ in at most [`HINT_FIELDS`] fields of the body alone.
pub(crate) fn ignore_hint(recorded: &Value, asked: &Value) -> Option<String> {
    let pointers = ignorable(recorded, asked, HINT_FIELDS)?;
    let listed: Vec<String> = pointers
        .into_iter()
        .map(|pointer| Value::String(pointer).to_string())
        .collect();
    Some(format!(
        "add to durun.toml [proxy] ignore = [{}] to replay this call",
        listed.join(", ")
    ))
}

/// The most body fields a request may differ in from a recorded one for
/// durun to say which `[proxy] ignore` replays it.
const HINT_FIELDS: usize = 5;

/// The most lines a divergence shows.
const MOST: usize = 20;

/// `path` and one more token, escaped as a JSON pointer's.
fn child(path: &str, token: &str) -> String {
    format!("{path}/{}", token.replace('~', "~0").replace('/', "~1"))
}

/// A leaf that differs between two values, by its JSON pointer: `old`
/// alone where it went, `new` alone where it came.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    pub(crate) pointer: String,
    pub(crate) old: Option<Value>,
    pub(crate) new: Option<Value>,
}

impl Change {
    /// `  /a/b: x -> y`, `- /a: x`, `+ /a: y` (the whole value: `/`).
    pub(crate) fn line(&self) -> String {
        let pointer = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        match (&self.old, &self.new) {
            (Some(old), Some(new)) => format!("  {pointer}: {old} -> {new}"),
            (Some(old), None) => format!("- {pointer}: {old}"),
            (None, Some(new)) => format!("+ {pointer}: {new}"),
            (None, None) => format!("  {pointer}"),
        }
    }
}

/// The leaves that differ between `old` and `new`, at most `most`, in a
/// stable order (object keys sorted).
pub(crate) fn changes(old: &Value, new: &Value, most: usize) -> Vec<Change> {
    let mut found = Vec::new();
    changes_at("", old, new, most, &mut found);
    found
}

fn diff_at(path: &str, recorded: &Value, asked: &Value, lines: &mut Vec<String>) {
    let room = MOST.saturating_sub(lines.len());
    let mut found = Vec::new();
    changes_at(path, recorded, asked, room, &mut found);
    lines.extend(found.iter().map(Change::line));
}

fn changes_at(path: &str, old: &Value, new: &Value, most: usize, found: &mut Vec<Change>) {
    if old == new || found.len() >= most {
        return;
    }
    let mut both = |child: String, x: Option<&Value>, y: Option<&Value>| match (x, y) {
        (Some(x), Some(y)) => changes_at(&child, x, y, most, found),
        (x, y) if found.len() < most && (x.is_some() || y.is_some()) => found.push(Change {
            pointer: child,
            old: x.cloned(),
            new: y.cloned(),
        }),
        _ => {}
    };
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                both(child(path, key), a.get(key), b.get(key));
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                both(child(path, &i.to_string()), a.get(i), b.get(i));
            }
        }
        _ => found.push(Change {
            pointer: path.to_owned(),
            old: Some(old.clone()),
            new: Some(new.clone()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{args_diff, request_diff};
    use serde_json::json;

    #[test]
    fn diffs_name_the_pointer_of_each_change() {
        let recorded = json!({"title": "Fix typo", "files": [{"path": "a"}, {"path": "b"}], "draft": true, "a/b~": 1});
        let asked = json!({"title": "Fix typo", "files": [{"path": "a"}, {"path": "c"}, {"path": "d"}], "labels": [], "a/b~": 2});
        assert_eq!(
            args_diff(&recorded, &asked),
            [
                "  /a~1b~0: 1 -> 2",
                "- /draft: true",
                "  /files/1/path: \"b\" -> \"c\"",
                "+ /files/2: {\"path\":\"d\"}",
                "+ /labels: []",
            ]
        );
        assert_eq!(args_diff(&json!(1), &json!("1")), ["  /: 1 -> \"1\""]);
        assert!(args_diff(&recorded, &recorded).is_empty());
    }

    /// A proxied request's lines name pointers into its body, as `[proxy]
    /// ignore` takes them.
    #[test]
    fn a_requests_lines_can_be_pasted_into_ignore() {
        let recorded =
            json!({"body": {"messages": [{"content": "run 1"}], "user": "a"}, "query": "x=1"});
        let asked =
            json!({"body": {"messages": [{"content": "run 2"}], "user": "a"}, "query": "x=2"});
        assert_eq!(
            request_diff(&recorded, &asked),
            [
                "  /messages/0/content: \"run 1\" -> \"run 2\"",
                "  ?query: \"x=1\" -> \"x=2\"",
            ]
        );
    }

    /// The paste-ready hint's pointers: a few body fields, no query.
    #[test]
    fn a_few_changed_body_fields_are_ignorable() {
        let recorded = json!({"body": {"metadata": {"user_id": "a"}, "m": 1}, "query": ""});
        let asked = json!({"body": {"metadata": {"user_id": "b"}, "m": 1, "x": 2}, "query": ""});
        assert_eq!(
            super::ignorable(&recorded, &asked, 3),
            Some(vec!["/metadata/user_id".to_owned(), "/x".to_owned()])
        );
        assert_eq!(super::ignorable(&recorded, &asked, 1), None);
        assert_eq!(super::ignorable(&recorded, &recorded, 3), None);
        let other_query = json!({"body": {"metadata": {"user_id": "a"}, "m": 1}, "query": "a=1"});
        assert_eq!(super::ignorable(&recorded, &other_query, 3), None);
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
        assert_eq!(lines[19], "  /k019: 1 -> 2");
        let lines = args_diff(&json!([wide(1), 7]), &json!([wide(2)]));
        assert_eq!(lines.len(), super::MOST);
        assert_eq!(lines[0], "  /0/k000: 1 -> 2");
    }
}
