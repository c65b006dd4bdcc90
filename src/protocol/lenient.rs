//! What Python's `json` reads and writes beyond JSON: `NaN`, `Infinity`,
//! lone surrogates, nesting deeper than serde's default. A request that
//! holds them must still get an answer (`bad_request`, naming them); these
//! are the slow paths, taken only after serde refused a line.

use serde::Deserialize as _;
use serde_json::{Map, Value};

use super::MAX_DEPTH;

/// A line serde's first reading refused, read again as Python would.
pub(super) enum Reread {
    /// Not a JSON object Python reads: a print.
    Nothing,
    /// An object, deeper than serde's default limit.
    Object(Map<String, Value>),
    /// An object that holds what JSON has not (`NaN`, a lone surrogate),
    /// replaced; the message names it.
    Extras(Map<String, Value>, String),
    /// A line that names an `op`, too deep to read; its `id` as far as it
    /// can be read.
    TooDeep(Value),
}

/// Reads a line serde refused with `err` the way Python's `json` would.
pub(super) fn reread(bytes: &[u8], err: &serde_json::Error) -> Reread {
    if err.to_string().starts_with("recursion limit exceeded") {
        if depth(bytes) > MAX_DEPTH {
            let head = &bytes[..bytes.len().min(64 * 1024)];
            if bytes.trim_ascii_start().starts_with(b"{") && names_an_op(head) {
                return Reread::TooDeep(sniff_id(head));
            }
            return Reread::Nothing;
        }
        let mut deserializer = serde_json::Deserializer::from_slice(bytes);
        deserializer.disable_recursion_limit();
        return match Value::deserialize(&mut deserializer).and_then(|value| {
            deserializer.end()?;
            Ok(value)
        }) {
            Ok(Value::Object(object)) => Reread::Object(object),
            Ok(_) => Reread::Nothing,
            Err(_) => with_python_extras(bytes),
        };
    }
    with_python_extras(bytes)
}

/// `NaN`, `Infinity`, `-Infinity` and lone surrogate escapes: Python's
/// `json` writes and reads them, JSON has none of them.
fn with_python_extras(bytes: &[u8]) -> Reread {
    let Some((json, problem)) = without_python_extras(bytes) else {
        return Reread::Nothing;
    };
    if depth(&json) > MAX_DEPTH {
        return Reread::Nothing;
    }
    let mut deserializer = serde_json::Deserializer::from_slice(&json);
    deserializer.disable_recursion_limit();
    match Value::deserialize(&mut deserializer) {
        Ok(Value::Object(object)) => Reread::Extras(object, problem),
        _ => Reread::Nothing,
    }
}

/// Whether the first bytes of a line name an `op`, as a request would.
pub(crate) fn names_an_op(head: &[u8]) -> bool {
    head.windows(4).any(|window| window == b"\"op\"")
}

/// The `id` of a request from the first bytes of its line, where it can be
/// read: a string or an integer after `"id":`.
pub(crate) fn sniff_id(head: &[u8]) -> Value {
    let Some(at) = head.windows(4).position(|w| w == b"\"id\"") else {
        return Value::Null;
    };
    let rest = &head[at + 4..];
    let rest = rest.trim_ascii_start();
    let Some(rest) = rest.strip_prefix(b":") else {
        return Value::Null;
    };
    let mut values =
        serde_json::Deserializer::from_slice(rest.trim_ascii_start()).into_iter::<Value>();
    match values.next() {
        Some(Ok(id @ Value::String(_))) => id,
        Some(Ok(Value::Number(n))) if !n.to_string().contains(['.', 'e', 'E']) => Value::Number(n),
        _ => Value::Null,
    }
}

/// How deep the line's brackets nest, strings skipped.
fn depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for &byte in bytes {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The line with Python's extras replaced (`null` for the numbers, U+FFFD
/// for a lone surrogate), and what was found, as the answer's message; or
/// `None` when it holds none.
fn without_python_extras(bytes: &[u8]) -> Option<(Vec<u8>, String)> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut found: Option<String> = None;
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if in_string {
            match rest[0] {
                b'"' => {
                    in_string = false;
                    out.push(b'"');
                    i += 1;
                }
                b'\\' if rest.get(1) == Some(&b'u') => {
                    let unit = hex_unit(&rest[2..]);
                    let next = rest
                        .get(6..8)
                        .filter(|e| *e == b"\\u")
                        .and_then(|_| hex_unit(&rest[8..]));
                    match unit {
                        Some(0xD800..=0xDBFF)
                            if next.is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) =>
                        {
                            out.extend_from_slice(&rest[..12]);
                            i += 12;
                        }
                        Some(lone @ 0xD800..=0xDFFF) => {
                            found.get_or_insert_with(|| format!(
                                "a string holds a lone surrogate (\\u{lone:04x}), which is not text and cannot be journaled; send the bytes encoded (base64) or drop them"
                            ));
                            out.extend_from_slice(b"\\ufffd");
                            i += 6;
                        }
                        _ => {
                            out.extend_from_slice(&rest[..2.min(rest.len())]);
                            i += 2;
                        }
                    }
                }
                b'\\' => {
                    out.extend_from_slice(&rest[..2.min(rest.len())]);
                    i += 2;
                }
                byte => {
                    out.push(byte);
                    i += 1;
                }
            }
            continue;
        }
        let word = [&b"-Infinity"[..], b"Infinity", b"NaN"]
            .into_iter()
            .find(|word| rest.starts_with(word));
        if let Some(word) = word {
            let name = String::from_utf8_lossy(word);
            found.get_or_insert_with(|| format!(
                "the request holds {name}, which is not JSON and cannot be journaled; send null, a number or a string instead"
            ));
            out.extend_from_slice(b"null");
            i += word.len();
            continue;
        }
        if rest[0] == b'"' {
            in_string = true;
        }
        out.push(rest[0]);
        i += 1;
    }
    found.map(|problem| (out, problem))
}

/// The code unit of four hex digits at the start of `bytes`.
fn hex_unit(bytes: &[u8]) -> Option<u32> {
    let digits = std::str::from_utf8(bytes.get(..4)?).ok()?;
    u32::from_str_radix(digits, 16).ok()
}
