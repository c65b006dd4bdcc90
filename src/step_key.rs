//! The identity of a step: its args hash and its idempotency key (SPEC 3.1).
//!
//! Both hash a canonical text of the args that is byte for byte what
//! Python's `json.dumps(args, sort_keys=True)` prints after `json.loads`
//! read them, so anyone with Python can recompute any key in the journal.
//! What makes it canonical:
//!
//! * separators `", "` and `": "`, object keys sorted by code point (UTF-8
//!   byte order is code point order), the last of duplicate keys kept;
//! * every character outside space..`~` escaped as lower-case `\uXXXX`
//!   (surrogate pairs above U+FFFF), except the seven short escapes;
//! * integers exactly as written (`serde_json`'s `arbitrary_precision` keeps
//!   the literal), `-0` as `0`; more than 4300 digits is refused as Python
//!   refuses it;
//! * a literal with `.`, `e` or `E` is a double, correctly rounded, printed
//!   the way Python's `repr` prints it: the shortest digits that read back
//!   to the same double, in fixed notation when the decimal exponent is in
//!   -4..16, else as `1e-05` / `1.5e+16`; an overflow is `Infinity`.

use std::fmt::{self, Write as _};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Python's default limit on the digits of an integer literal.
const MAX_INT_DIGITS: usize = 4300;

/// Why a JSON value has no canonical form.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CanonicalError {
    IntegerTooLong(usize),
}

impl fmt::Display for CanonicalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::IntegerTooLong(digits) => write!(
                f,
                "an integer of {digits} digits is longer than the {MAX_INT_DIGITS} digits Python reads"
            ),
        }
    }
}

impl std::error::Error for CanonicalError {}

/// `json.dumps(value, sort_keys=True)` as Python prints it.
pub(crate) fn canonical_json(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_value(&mut out, value)?;
    Ok(out)
}

/// SHA-256 hex of the canonical args: equal args, equal hash.
pub(crate) fn args_hash(canonical_args: &str) -> String {
    sha256_hex(canonical_args.as_bytes())
}

/// SHA-256 hex of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 hex of `"{task}:{step}:{canonical args}"`.
pub(crate) fn idempotency_key(task_id: &str, step: u64, canonical_args: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(task_id.as_bytes());
    hasher.update(b":");
    hasher.update(step.to_string().as_bytes());
    hasher.update(b":");
    hasher.update(canonical_args.as_bytes());
    hex(&hasher.finalize())
}

/// Bytes as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

fn write_value(out: &mut String, value: &Value) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(out, &number.to_string())?,
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            // serde_json's map (without its `preserve_order` feature) is
            // ordered by key bytes, which is code point order: its keys
            // come sorted (`a_map_iterates_in_code_point_order`).
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, key);
                out.push_str(": ");
                write_value(out, item)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// `literal` is the number exactly as the JSON text wrote it.
fn write_number(out: &mut String, literal: &str) -> Result<(), CanonicalError> {
    if literal.contains(['.', 'e', 'E']) {
        // Rust's parse is correctly rounded like Python's float(), and gives
        // an infinity (not an error) on overflow, as Python does.
        let value: f64 = literal.parse().unwrap_or(f64::NAN);
        write_python_float(out, value);
        return Ok(());
    }
    let digits = literal.strip_prefix('-').unwrap_or(literal);
    if digits.len() > MAX_INT_DIGITS {
        return Err(CanonicalError::IntegerTooLong(digits.len()));
    }
    if digits.bytes().all(|b| b == b'0') {
        out.push('0');
    } else {
        out.push_str(literal);
    }
    Ok(())
}

/// Python's `float.__repr__`.
fn write_python_float(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
        return;
    }
    if value.is_infinite() {
        out.push_str(if value > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    if value.is_sign_negative() {
        out.push('-');
    }
    if value == 0.0 {
        out.push_str("0.0");
        return;
    }
    let scientific = shortest_round_trip(value.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("`{:e}` always prints an exponent");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let digits = match digits.trim_end_matches('0') {
        "" => "0",
        trimmed => trimmed,
    };
    let exponent: i32 = exponent.parse().expect("`{:e}` prints an integer exponent");
    let point = exponent + 1; // digits before the decimal point
    let count = digits.len() as i32;
    if (-3..=16).contains(&point) {
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(digits);
        } else if point < count {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        } else {
            out.push_str(digits);
            out.extend(std::iter::repeat_n('0', (point - count) as usize));
            out.push_str(".0");
        }
    } else {
        out.push_str(&digits[..1]);
        if count > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exponent.abs());
    }
}

/// The shortest digits that read back as `value`, as `d.ddde±x`, choosing
/// among equally short candidates the nearest, ties to even, as Python does.
///
/// `{:e}` gives the shortest length, but on an exact tie (a double such as
/// 1149636667324797.25, whose 17th digit sits halfway) it rounds up where
/// Python rounds to even. Exact formatting to that many digits rounds half
/// to even; it is kept only if it still reads back as `value` (at a power of
/// two the rounding interval is lopsided).
fn shortest_round_trip(value: f64) -> String {
    let shortest = format!("{value:e}");
    let digits = shortest.split('e').next().map_or(1, |mantissa| {
        mantissa.chars().filter(char::is_ascii_digit).count()
    });
    let exact = format!("{value:.*e}", digits.saturating_sub(1));
    if exact.parse::<f64>() == Ok(value) {
        exact
    } else {
        shortest
    }
}

/// A JSON string with Python's `ensure_ascii` escaping.
fn write_string(out: &mut String, text: &str) {
    out.push('"');
    let mut rest = text;
    while !rest.is_empty() {
        // Printable ASCII but `"` and a backslash goes as it is, a run at a time:
        // a conversation's text is mostly that.
        let plain = plain_run(rest.as_bytes());
        out.push_str(&rest[..plain]);
        rest = &rest[plain..];
        let Some(c) = rest.chars().next() else {
            break;
        };
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
        rest = &rest[c.len_utf8()..];
    }
    out.push('"');
}

/// Whether canonical JSON writes `byte` as it is: printable ASCII but `"`
/// and a backslash.
fn is_plain(byte: u8) -> bool {
    (b' '..=b'~').contains(&byte) && byte != b'"' && byte != b'\\'
}

/// The length of the run of [`is_plain`] bytes `bytes` starts with, read
/// eight at a time: every string of every step's args is scanned, and a
/// conversation's are most of a model call's bytes.
fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte below `n` (n <= 0x80); a byte above a
    // flagged one may be flagged wrongly, the lowest never is.
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGHS;
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let special = below(x, 0x20)
            | below(x ^ (ONES * u64::from(b'"')), 1)
            | below(x ^ (ONES * u64::from(b'\\')), 1)
            | below(x ^ (ONES * 0x7f), 1)
            | x & HIGHS;
        if special != 0 {
            // Little-endian: the lowest flagged byte is the first.
            return at + (special.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + bytes[at..]
        .iter()
        .position(|&byte| !is_plain(byte))
        .unwrap_or(bytes.len() - at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        canonical_json(&serde_json::from_str(text).expect("test JSON parses")).expect("canonical")
    }

    #[test]
    fn runs_of_plain_text_are_copied_and_the_rest_escaped_between_them() {
        assert_eq!(
            canon(r#""plain \"quoted\" a\\b\ttab ~ end é""#),
            r#""plain \"quoted\" a\\b\ttab ~ end \u00e9""#
        );
    }

    #[test]
    fn layout_matches_python() {
        assert_eq!(
            canon(r#"{"b":1,"a":[1,2,{}],"c":[]}"#),
            r#"{"a": [1, 2, {}], "b": 1, "c": []}"#
        );
        assert_eq!(
            canon(r#""é\u0001\u007f😀\n""#),
            r#""\u00e9\u0001\u007f\ud83d\ude00\n""#
        );
        assert_eq!(canon(r#"{"a":1,"a":2}"#), r#"{"a": 2}"#);
    }

    #[test]
    fn numbers_match_python() {
        let cases = [
            ("1.0", "1.0"),
            ("100.0", "100.0"),
            ("1e-5", "1e-05"),
            ("1e16", "1e+16"),
            ("1e15", "1000000000000000.0"),
            ("-0.0", "-0.0"),
            ("-0", "0"),
            ("0.0001", "0.0001"),
            ("0.00001234", "1.234e-05"),
            ("1E400", "Infinity"),
            ("-1e400", "-Infinity"),
            ("1e-400", "0.0"),
            ("0.1", "0.1"),
            (
                "123456789012345678901234567890",
                "123456789012345678901234567890",
            ),
            ("1.5e300", "1.5e+300"),
            ("12345678901234567890.0", "1.2345678901234567e+19"),
            ("1149636667324797.25", "1149636667324797.2"),
            ("-165793407361858.125", "-165793407361858.12"),
            ("5e-324", "5e-324"),
            ("1e23", "1e+23"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), expected, "for {input}");
        }
    }

    #[test]
    fn refuses_integers_python_refuses() {
        let long = "9".repeat(4301);
        let value: Value = serde_json::from_str(&long).expect("parses");
        assert_eq!(
            canonical_json(&value),
            Err(CanonicalError::IntegerTooLong(4301))
        );
        let ok = "9".repeat(4300);
        assert!(canonical_json(&serde_json::from_str(&ok).expect("parses")).is_ok());
    }

    #[test]
    fn key_matches_python_reference() {
        // python3 -c 'import hashlib,json; a=json.dumps({"a":1},sort_keys=True);
        //   print(hashlib.sha256(("t:1:"+a).encode()).hexdigest(), hashlib.sha256(a.encode()).hexdigest())'
        let canonical = canon(r#"{"a":1}"#);
        assert_eq!(
            idempotency_key("t", 1, &canonical),
            "88a26fb931d671e080b69ddd5e55d1b66f1dfc31eca72ce5f7d4f6ce41bf2d11"
        );
        assert_eq!(
            args_hash(&canonical),
            "f9d86028c6e0d64e225186f96acb69338b2c59764df79162107f5c4bb34d1310"
        );
    }

    /// Thousands of doubles, from random bit patterns and from decimal
    /// literals near rounding ties, against Python itself.
    #[test]
    fn floats_match_python_repr() {
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut literals = Vec::new();
        for _ in 0..20_000 {
            let value = f64::from_bits(next());
            if value.is_finite() {
                literals.push(format!("{value:e}"));
            }
        }
        for _ in 0..10_000 {
            // Short decimals with a 5 at the end sit on or near ties.
            let digits = next() % 10_000_000_000;
            let exponent = (next() % 60) as i32 - 30;
            literals.push(format!("{digits}5e{exponent}"));
            literals.push(format!("0.{digits}5"));
        }
        for exponent in -1074..1024 {
            let power = 2f64.powi(exponent);
            for value in [
                power,
                f64::from_bits(power.to_bits() + 1),
                f64::from_bits(power.to_bits().saturating_sub(1)),
            ] {
                if value.is_finite() && value > 0.0 {
                    literals.push(format!("{value:e}"));
                }
            }
        }
        let input = format!("[{}]", literals.join(","));
        let output = std::process::Command::new("python3")
            .args(["-c", "import json,sys; sys.stdout.write(json.dumps(json.loads(sys.stdin.read()), sort_keys=True))"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                child.stdin.take().expect("piped").write_all(input.as_bytes())?;
                child.wait_with_output()
            })
            .expect("python3 runs");
        let expected = String::from_utf8(output.stdout).expect("utf-8");
        let ours = canon(&input);
        if ours != expected {
            let ours: Vec<&str> = ours.trim_matches(['[', ']']).split(", ").collect();
            let theirs: Vec<&str> = expected.trim_matches(['[', ']']).split(", ").collect();
            let diffs: Vec<String> = literals
                .iter()
                .zip(ours.iter().zip(&theirs))
                .filter(|(_, (a, b))| a != b)
                .take(10)
                .map(|(literal, (a, b))| format!("{literal}: durun {a}, python {b}"))
                .collect();
            panic!("{} floats differ, first: {diffs:#?}", diffs.len());
        }
    }
}

#[cfg(test)]
mod properties {
    //! The canonical text is stable for any value.
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::{canonical_json, is_plain, plain_run};
    use crate::test_helpers::json_value;

    proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

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

    }

    /// The canonical writer takes an object's keys in the map's order.
    #[test]
    fn a_map_iterates_in_code_point_order() {
        let keys = ["b", "a", "\u{e9}", "z", "A", "~", "\u{1f600}", "ab", ""];
        let map: Map<String, Value> = keys
            .iter()
            .map(|key| ((*key).to_owned(), Value::Null))
            .collect();
        let mut sorted: Vec<&str> = keys.to_vec();
        sorted.sort_by(|a, b| a.chars().cmp(b.chars()));
        assert_eq!(map.keys().map(String::as_str).collect::<Vec<_>>(), sorted);
    }

    #[test]
    fn a_plain_run_ends_at_the_first_byte_written_otherwise() {
        // Every byte value, at every place in a run of up to 24 bytes.
        for special in 0..=255u8 {
            for len in 0..24 {
                for at in 0..=len {
                    let mut bytes = vec![b'a'; len];
                    if at < len {
                        bytes[at] = special;
                    }
                    let slow = bytes
                        .iter()
                        .position(|&byte| !is_plain(byte))
                        .unwrap_or(len);
                    assert_eq!(plain_run(&bytes), slow, "{special:#x} at {at} of {len}");
                }
            }
        }
        // Two specials, the later one smaller: the first still wins.
        assert_eq!(plain_run(b"ab\x01\"cdefgh"), 2);
        assert_eq!(plain_run(b"abc\x00\x80efgh"), 3);
    }
}
