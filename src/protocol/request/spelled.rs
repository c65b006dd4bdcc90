//! An op is spelled in five places: the decoder here, docs/protocol.md,
//! and the requests of the Python and Node SDKs. This checks that they
//! agree: every op the decoder takes is documented and sent by both SDKs,
//! and none of them spells an op the decoder does not take. What the SDKs'
//! encoders actually send, field by field, is tests/integration/conformance.rs.

use std::collections::BTreeSet;
use std::path::Path;

use super::{Line, parse_line};

/// The ops of protocol version 1.
const OPS: [&str; 13] = [
    "ahead", "begin", "call", "commit", "fail", "join", "patched", "replayed", "result", "retry",
    "sleep", "spawn", "wait",
];

/// The ops only durun's own commands send (`find`, from `durun mcp`):
/// documented, but no SDK needs them.
const OWN_OPS: [&str; 1] = ["find"];

/// Whether the decoder takes `op` (its other fields may still be wrong).
fn decoded(op: &str) -> bool {
    match parse_line(format!(r#"{{"op":"{op}","id":1}}"#).as_bytes()) {
        Line::Request(_) => true,
        Line::Invalid { message, .. } => !message.starts_with("unknown op"),
        Line::Passthrough => false,
    }
}

/// The ops named in `text` right after one of `prefixes` (`"op":"`), where
/// the prefix does not end a longer word (`stop: "` is not `op: "`).
fn spelled(text: &str, prefixes: &[&str]) -> BTreeSet<String> {
    let mut ops = BTreeSet::new();
    for prefix in prefixes {
        for (at, _) in text.match_indices(prefix) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &text[at + prefix.len()..];
            if let Some(end) = rest.find('"') {
                ops.insert(rest[..end].to_owned());
            }
        }
    }
    ops
}

/// The text of every file under `dir` (in the repository) named `*.ext`.
fn sources(dir: &str, ext: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir)
        .expect("the SDK's directory")
        .flatten()
    {
        if entry.path().extension().is_some_and(|found| found == ext) {
            text.push_str(&std::fs::read_to_string(entry.path()).expect("a source file"));
        }
    }
    text
}

#[test]
fn every_op_is_spelled_alike_in_the_decoder_the_docs_and_both_sdks() {
    let ops: BTreeSet<String> = OPS.map(str::to_owned).into();
    let documented: BTreeSet<String> = ops
        .iter()
        .cloned()
        .chain(OWN_OPS.map(str::to_owned))
        .collect();
    for op in &documented {
        assert!(decoded(op), "the decoder does not take {op:?}");
    }
    assert!(!decoded("calls"), "the decoder takes any op");
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/protocol.md"))
            .expect("docs/protocol.md");
    let places = [
        (
            "docs/protocol.md",
            spelled(&docs, &[r#""op":""#, r#""op": ""#]),
        ),
        (
            "the Python SDK",
            spelled(
                &sources("sdk/python/durun", "py"),
                &[r#""op":""#, r#""op": ""#],
            ),
        ),
        (
            "the Node SDK",
            spelled(&sources("sdk/node", "js"), &[r#""op":""#, r#"op: ""#]),
        ),
    ];
    for (place, found) in places {
        let ops = if place == "docs/protocol.md" {
            &documented
        } else {
            &ops
        };
        let unknown: Vec<_> = found.difference(ops).collect();
        let missing: Vec<_> = ops.difference(&found).collect();
        assert!(
            unknown.is_empty() && missing.is_empty(),
            "{place} spells ops the decoder does not take: {unknown:?}; and never spells: {missing:?}"
        );
    }
}

/// The example requests of `text`: each line that is one (`{"op":…}`),
/// and each inline code span that is one.
fn examples(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with(r#"{"op":"#) {
            found.push(line);
            continue;
        }
        for span in line.split('`').skip(1).step_by(2) {
            if span.starts_with(r#"{"op":"#) {
                found.push(span);
            }
        }
    }
    found
}

/// Every example request in docs/protocol.md is one the decoder takes, as
/// written, and every op has one: a reader who copies an example gets an
/// answer, not `bad_request`.
#[test]
fn every_example_request_in_the_docs_decodes_and_every_op_has_one() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/protocol.md"))
            .expect("docs/protocol.md");
    let examples = examples(&docs);
    let mut shown = BTreeSet::new();
    for example in &examples {
        match parse_line(example.as_bytes()) {
            Line::Request(_) => {}
            Line::Invalid { message, .. } => panic!("docs/protocol.md: {example}: {message}"),
            Line::Passthrough => panic!("docs/protocol.md: {example} is not a request"),
        }
        shown.extend(spelled(example, &[r#""op":""#]));
    }
    let missing: Vec<_> = OPS
        .iter()
        .chain(&OWN_OPS)
        .filter(|op| !shown.contains(**op))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/protocol.md has no example of {missing:?}"
    );
}

#[test]
fn examples_are_whole_lines_and_inline_spans() {
    let text = "{\"op\":\"call\",\"id\":1}\nwith `{\"op\":\"find\",\"id\":2}` and `not one`\n  {\"op\":\"x\"}";
    assert_eq!(
        examples(text),
        [r#"{"op":"call","id":1}"#, r#"{"op":"find","id":2}"#]
    );
}

#[test]
fn a_prefix_inside_a_longer_word_is_no_op() {
    let found = spelled(
        r#"{ op: "call", stop: "x", "op":"wait" }"#,
        &[r#"op: ""#, r#""op":""#],
    );
    assert_eq!(
        found,
        BTreeSet::from(["call".to_owned(), "wait".to_owned()])
    );
}
