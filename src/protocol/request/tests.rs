//! Lines and what they decode to, example by example.

use super::*;
use serde_json::json;

fn request(text: &str) -> Request {
    match parse_line(text.as_bytes()) {
        Line::Request(request) => request,
        other => panic!("{text} parsed as {other:?}"),
    }
}

fn invalid(text: &str) -> (Value, String) {
    match parse_line(text.as_bytes()) {
        Line::Invalid { id, message } => (id, message),
        other => panic!("{text} parsed as {other:?}"),
    }
}

#[test]
fn lines_that_are_not_requests_pass_through() {
    for line in [
        "hello",
        "",
        "[1,2]",
        r#"{"op":1}"#,
        r#"{"x":"call"}"#,
        "\u{fffd}",
        "{\"op\":\"call\"",
    ] {
        assert!(
            matches!(parse_line(line.as_bytes()), Line::Passthrough),
            "{line}"
        );
    }
    assert!(matches!(parse_line(b"\xff\xfe"), Line::Passthrough));
}

#[test]
fn decodes_call_and_begin() {
    assert_eq!(
        request(r#"{"op":"call","id":1,"tool":"t"}"#),
        Request::Call {
            id: json!(1),
            tool: "t".into(),
            args: json!({})
        }
    );
    assert_eq!(
        request(r#"{"op":"begin","id":"a","name":"n","args":null,"effect":"mutate"}"#),
        Request::Begin {
            id: json!("a"),
            name: "n".into(),
            args: Value::Null,
            effect: Some(Effect::Mutate),
            mcp: false,
        }
    );
    assert_eq!(
        request(r#"{"op":"begin","id":"a","name":"mcp s/t","kind":"mcp"}"#),
        Request::Begin {
            id: json!("a"),
            name: "mcp s/t".into(),
            args: json!({}),
            effect: None,
            mcp: true,
        }
    );
}

#[test]
fn decodes_commit_and_fail_by_step_or_begin() {
    assert_eq!(
        request(r#"{"op":"commit","id":2,"step":5,"output":"x","usage":null}"#),
        Request::Commit {
            id: json!(2),
            step: Closes::Step(5),
            output: json!("x"),
            usage: None,
        }
    );
    assert_eq!(
        request(r#"{"op":"fail","id":3,"step":5,"error":"boom"}"#),
        Request::Fail {
            id: json!(3),
            step: Closes::Step(5),
            error: "boom".into(),
            output: None
        }
    );
    assert_eq!(
        request(r#"{"op":"commit","id":4,"begin":"b3","output":1}"#),
        Request::Commit {
            id: json!(4),
            step: Closes::Begin(Box::new(json!("b3"))),
            output: json!(1),
            usage: None,
        }
    );
    assert_eq!(
        request(r#"{"op":"fail","id":5,"begin":3,"step":null}"#),
        Request::Fail {
            id: json!(5),
            step: Closes::Begin(Box::new(json!(3))),
            error: "failed".into(),
            output: None
        }
    );
}

#[test]
fn decodes_wait_and_sleep_and_refuses_a_bad_time() {
    assert_eq!(
        request(r#"{"op":"wait","id":7,"name":"approve","data":{"d":1},"timeout":"48h"}"#),
        Request::Wait {
            id: json!(7),
            name: "approve".into(),
            data: json!({"d": 1}),
            timeout: Some(Duration::from_secs(48 * 3600))
        }
    );
    assert_eq!(
        request(r#"{"op":"sleep","id":8,"seconds":3600}"#),
        Request::Sleep {
            id: json!(8),
            args: json!({"seconds": 3600}),
            wake: Wake::After(Duration::from_secs(3600))
        }
    );
    assert!(matches!(
        request(r#"{"op":"sleep","id":9,"until":"2026-12-01T09:00:00Z"}"#),
        Request::Sleep {
            wake: Wake::At(_),
            ..
        }
    ));
    assert!(invalid(r#"{"op":"sleep","id":9}"#).1.contains("either"));
    assert!(
        invalid(r#"{"op":"sleep","id":9,"seconds":-1}"#)
            .1
            .contains("0 or more")
    );
    assert!(
        invalid(r#"{"op":"sleep","id":9,"until":"tomorrow"}"#)
            .1
            .contains("RFC 3339")
    );
    assert!(
        invalid(r#"{"op":"wait","id":9,"name":"a","timeout":"soon"}"#)
            .1
            .contains("duration")
    );
}

#[test]
fn decodes_result_ahead_and_replayed() {
    assert_eq!(
        request(r#"{"op":"result","id":9,"output":{"a":1}}"#),
        Request::Result {
            id: json!(9),
            output: json!({"a": 1})
        }
    );
    assert_eq!(
        request(r#"{"op":"ahead","id":"a"}"#),
        Request::Ahead { id: json!("a") }
    );
    assert_eq!(
        request(r#"{"op":"replayed","id":3,"through":7,"idempotency_key":"k"}"#),
        Request::Replayed {
            id: json!(3),
            through: 7,
            key: "k".to_owned()
        }
    );
    for line in [
        r#"{"op":"replayed","id":3,"idempotency_key":"k"}"#,
        r#"{"op":"replayed","id":3,"through":0,"idempotency_key":"k"}"#,
        r#"{"op":"replayed","id":3,"through":"7","idempotency_key":"k"}"#,
    ] {
        assert!(invalid(line).1.contains("`through`"), "{line}");
    }
    assert!(
        invalid(r#"{"op":"replayed","id":3,"through":7}"#)
            .1
            .contains("idempotency_key")
    );
}

#[test]
fn bad_requests_name_their_id_where_it_can_be_read() {
    assert_eq!(invalid(r#"{"op":"call"}"#).0, Value::Null);
    assert_eq!(
        invalid(r#"{"op":"call","id":1.5,"tool":"t"}"#).0,
        Value::Null
    );
    let (id, message) = invalid(r#"{"op":"call","id":7}"#);
    assert_eq!(
        (id, message.as_str()),
        (json!(7), "`call` request has no `tool`")
    );
    assert_eq!(invalid(r#"{"op":"nope","id":"x"}"#).0, json!("x"));
    assert!(
        invalid(r#"{"op":"commit","id":1,"step":0}"#)
            .1
            .contains("positive")
    );
    assert!(
        invalid(r#"{"op":"commit","id":1,"step":2,"begin":1}"#)
            .1
            .contains("not both")
    );
    assert!(
        invalid(r#"{"op":"commit","id":1,"begin":1.5}"#)
            .1
            .contains("`id` of a `begin`")
    );
    assert!(
        invalid(r#"{"op":"begin","id":1,"name":"n","effect":"write"}"#)
            .1
            .contains("effect")
    );
}

#[test]
fn what_python_writes_gets_an_answer() {
    for (line, says) in [
        (r#"{"op":"call","id":4,"tool":"t","args":{"x":NaN}}"#, "NaN"),
        (
            r#"{"op":"call","id":4,"tool":"t","args":[Infinity]}"#,
            "Infinity",
        ),
        (
            r#"{"op":"call","id":4,"tool":"t","args":[-Infinity]}"#,
            "-Infinity",
        ),
        (
            r#"{"op":"call","id":4,"tool":"t","args":"\udcff"}"#,
            "lone surrogate (\\udcff)",
        ),
        (
            r#"{"op":"call","id":4,"tool":"t","args":"a\ud800b"}"#,
            "lone surrogate (\\ud800)",
        ),
        (r#"{"op":"begin","id":4,"name":"a\u0000b"}"#, "NUL"),
        (r#"{"op":"fail","id":4,"step":1,"error":"a\u0000b"}"#, "NUL"),
    ] {
        let (id, message) = invalid(line);
        assert_eq!(id, json!(4), "{line}");
        assert!(message.contains(says), "{line}: {message}");
    }
    // A surrogate pair and "NaN" inside a string are fine.
    assert!(matches!(
        parse_line(r#"{"op":"call","id":1,"tool":"t","args":["\ud83d\ude00","NaN"]}"#.as_bytes()),
        Line::Request(_)
    ));
    // Not requests: still passed through.
    assert!(matches!(parse_line(b"[NaN]"), Line::Passthrough));
    assert!(matches!(parse_line(br#"{"x": NaN}"#), Line::Passthrough));
}

#[test]
fn deep_requests_are_read_to_a_thousand_levels() {
    let nested = |depth: usize| {
        format!(
            r#"{{"op":"call","id":9,"tool":"t","args":{}1{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    assert!(matches!(
        parse_line(nested(998).as_bytes()),
        Line::Request(_)
    ));
    let (id, message) = invalid(&nested(5000));
    assert_eq!(id, json!(9));
    assert!(message.contains("deeper than 1000"), "{message}");
    assert!(matches!(
        parse_line(format!("{}{}", "[".repeat(5000), "]".repeat(5000)).as_bytes()),
        Line::Passthrough
    ));
}

#[test]
fn a_reconciled_commit_is_a_request_of_its_own() {
    assert_eq!(
        request(r#"{"op":"commit","id":2,"step":5,"output":"x","reconciled":true}"#),
        Request::Reconciled {
            id: json!(2),
            step: Closes::Step(5),
            output: json!("x"),
        }
    );
    assert!(matches!(
        request(r#"{"op":"commit","id":2,"step":5,"reconciled":false}"#),
        Request::Commit { .. }
    ));
}
