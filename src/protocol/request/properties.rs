//! The line parser holds its promises for any input, not just the
//! examples.
use proptest::prelude::*;
use serde_json::Value;

use crate::protocol::{Line, Request, parse_line};
use crate::test_helpers::json_value;

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

}
