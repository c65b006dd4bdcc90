//! Property tests: the line parser, the line reader and the canonical JSON
//! printer hold their promises for any input, not just the examples.

use proptest::prelude::*;
use serde_json::{Map, Value};

use crate::protocol::{Line, Request, parse_line};
use crate::step_key::canonical_json;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| serde_json::from_str(&format!("{f:e}")).expect("a finite float is JSON")),
        "\\PC{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((any::<String>(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes at all: the parser answers, it never panics.
    #[test]
    fn parse_line_takes_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_line(&bytes);
    }

    /// A well-formed request reads back as itself, whatever its args.
    #[test]
    fn requests_round_trip(id in any::<i64>(), tool in "[a-z_.]{1,12}", args in json_value()) {
        let line = serde_json::json!({"op": "call", "id": id, "tool": tool, "args": args}).to_string();
        match parse_line(line.as_bytes()) {
            Line::Request(Request::Call { id: got_id, tool: got_tool, args: got_args }) => {
                prop_assert_eq!(got_id, Value::from(id));
                prop_assert_eq!(got_tool, tool);
                prop_assert_eq!(got_args, args);
            }
            other => prop_assert!(false, "{line} parsed as {other:?}"),
        }
    }

    /// The canonical text is stable: printing what it reads back gives the
    /// same text, and the order of object members does not matter.
    #[test]
    fn canonical_json_is_stable_and_order_free(value in json_value()) {
        let canonical = canonical_json(&value).expect("generated values have short integers");
        let reread: Value = serde_json::from_str(&canonical).expect("canonical text is JSON");
        prop_assert_eq!(canonical_json(&reread).expect("canonical"), canonical.clone());
        prop_assert!(canonical.is_ascii());
        if let Value::Object(map) = &value {
            let reversed: Map<String, Value> = map.iter().rev().map(|(k, v)| (k.clone(), v.clone())).collect();
            let mut text = String::from("{");
            for (i, (k, v)) in reversed.iter().enumerate() {
                if i > 0 { text.push(','); }
                text.push_str(&serde_json::to_string(k).expect("key"));
                text.push(':');
                text.push_str(&v.to_string());
            }
            text.push('}');
            let shuffled: Value = serde_json::from_str(&text).expect("JSON");
            prop_assert_eq!(canonical_json(&shuffled).expect("canonical"), canonical);
        }
    }

    /// Lines come out as they went in, however the input is chunked; an
    /// oversized one comes out as one refusal.
    #[test]
    fn the_line_reader_splits_like_split(
        lines in prop::collection::vec("[^\n]{0,40}", 0..12),
        capacity in 1usize..64,
    ) {
        use std::io::BufReader;
        use crate::supervisor::lines::{Chunk, LineReader};
        let input: String = lines.iter().flat_map(|l| [l.as_str(), "\n"]).collect();
        let mut reader = LineReader::with_limit(BufReader::with_capacity(capacity, input.as_bytes()), 30, false);
        let mut got = Vec::new();
        while let Some(chunk) = reader.next_line().expect("in memory") {
            got.push(match chunk {
                Chunk::Line { bytes, ended } => {
                    prop_assert!(ended);
                    Some(String::from_utf8(bytes).expect("utf-8 in, utf-8 out"))
                }
                Chunk::Oversized { .. } => None,
                Chunk::Text(_) => panic!("only the agent's stdout streams"),
            });
        }
        let expected: Vec<Option<String>> = lines.iter().map(|l| (l.len() <= 30).then(|| l.clone())).collect();
        prop_assert_eq!(got, expected);
    }

    /// On a non-blocking source that runs dry anywhere (mid-line, inside an
    /// oversized line), a `WouldBlock` loses nothing: reading on gives the
    /// same lines as a blocking source.
    #[test]
    fn the_line_reader_resumes_after_would_block(
        lines in prop::collection::vec("[^\n]{0,40}", 0..12),
        capacity in 1usize..64,
        pieces in prop::collection::vec(1usize..20, 1..8),
    ) {
        use std::io::{BufReader, ErrorKind, Read};
        use crate::supervisor::lines::{Chunk, LineReader};
        /// Gives a few bytes at a time and runs dry between them.
        struct Stutter<'a> {
            input: &'a [u8],
            pieces: Vec<usize>,
            turn: usize,
        }
        impl Read for Stutter<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.turn += 1;
                if self.turn.is_multiple_of(2) && !self.input.is_empty() {
                    return Err(ErrorKind::WouldBlock.into());
                }
                let n = self.pieces[self.turn % self.pieces.len()]
                    .min(buf.len())
                    .min(self.input.len());
                buf[..n].copy_from_slice(&self.input[..n]);
                self.input = &self.input[n..];
                Ok(n)
            }
        }
        let input: String = lines.iter().flat_map(|l| [l.as_str(), "\n"]).collect();
        let source = Stutter { input: input.as_bytes(), pieces, turn: 0 };
        let mut reader = LineReader::with_limit(BufReader::with_capacity(capacity, source), 30, false);
        let mut got = Vec::new();
        loop {
            match reader.next_line() {
                Ok(Some(Chunk::Line { bytes, .. })) => got.push(Some(String::from_utf8(bytes).expect("utf-8 in, utf-8 out"))),
                Ok(Some(Chunk::Oversized { .. })) => got.push(None),
                Ok(Some(Chunk::Text(_))) => panic!("only the agent's stdout streams"),
                Ok(None) => break,
                Err(err) if err.kind() == ErrorKind::WouldBlock => {}
                Err(err) => panic!("{err}"),
            }
        }
        let expected: Vec<Option<String>> = lines.iter().map(|l| (l.len() <= 30).then(|| l.clone())).collect();
        prop_assert_eq!(got, expected);
    }

    /// On the agent's stdout nothing is lost: whatever the lines and their
    /// chunking, the pieces handed on plus the lines held whole give back
    /// the input byte for byte (no line here names an `op`).
    #[test]
    fn the_streaming_reader_loses_no_byte(
        lines in prop::collection::vec(prop_oneof!["[^\n]{0,60}", "[ \t]{0,3}\\{[^\n]{0,60}"], 0..12),
        capacity in 1usize..64,
        last_newline in any::<bool>(),
    ) {
        use std::io::BufReader;
        use crate::supervisor::lines::{Chunk, LineReader};
        let mut input: String = lines.iter().flat_map(|l| [l.as_str(), "\n"]).collect();
        if !last_newline {
            input.pop();
        }
        prop_assume!(!input.contains("\"op\""));
        let mut reader = LineReader::with_limit(BufReader::with_capacity(capacity, input.as_bytes()), 30, true);
        let mut out = Vec::new();
        while let Some(chunk) = reader.next_line().expect("in memory") {
            match chunk {
                Chunk::Text(bytes) => out.extend(bytes),
                Chunk::Line { bytes, ended } => {
                    prop_assert!(bytes.len() <= 30);
                    out.extend(bytes);
                    if ended {
                        out.push(b'\n');
                    }
                }
                Chunk::Oversized { .. } => prop_assert!(false, "no line names an op"),
            }
        }
        prop_assert_eq!(String::from_utf8(out).expect("utf-8"), input);
    }
}
