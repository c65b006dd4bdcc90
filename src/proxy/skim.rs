//! A JSON answer read without its tree: an answer is mostly the text of
//! its strings, and a tree of it copies every string (a 1 MB answer, a
//! megabyte allocated, written and freed) only for the few fields kept.
//!
//! # Invariant
//!
//! What reads here as JSON is exactly what `serde_json::Value` reads as
//! JSON, the same numbers out of range and the same nesting limit
//! included: both go through the deserializer's `deserialize_any`.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Whether `body` is JSON that `Value` reads, checked without building it.
pub(crate) fn is_json(body: &[u8]) -> bool {
    serde_json::from_slice::<Checked>(body).is_ok()
}

/// The `usage` and `usageMetadata` members of a JSON object, as a parsed
/// `Value` has them (a later key wins). `None`: not JSON, or not an
/// object (but a number reads as an object with neither member: under
/// serde_json's `arbitrary_precision`, which the step key needs, a number
/// comes to a visitor as a one-member map).
pub(crate) fn usage_fields(body: &[u8]) -> Option<UsageFields> {
    serde_json::from_slice(body).ok()
}

/// See [`usage_fields`].
#[derive(Default)]
pub(crate) struct UsageFields {
    pub(crate) usage: Option<Value>,
    pub(crate) usage_metadata: Option<Value>,
}

/// A JSON value read and kept nowhere.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Skim)
    }
}

impl<'de> Deserialize<'de> for UsageFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Usage)
    }
}

/// Reads any value and keeps nothing of it.
struct Skim;

impl<'de> Visitor<'de> for Skim {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// Reads an object, keeping its two usage members; anything else is an
/// error (a body that is not an object has neither).
struct Usage;

impl<'de> Visitor<'de> for Usage {
    type Value = UsageFields;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UsageFields, A::Error> {
        let mut fields = UsageFields::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "usage" => fields.usage = Some(map.next_value()?),
                "usageMetadata" => fields.usage_metadata = Some(map.next_value()?),
                _ => {
                    map.next_value::<Checked>()?;
                }
            }
        }
        Ok(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// JSON here is JSON to `Value`, odd cases included.
    #[test]
    fn reads_as_json_what_a_tree_reads_as_json() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let cases: &[&[u8]] = &[
            b"{\"a\":[1,2.5,-3,true,null,\"x\\n\\u00e9\"]}",
            b"\"text\"",
            b"[]",
            b"1e400",
            b"123456789012345678901234567890",
            b"{\"a\":1,}",
            b"{\"a\":1} x",
            b"\"\\ud800\"",
            b"\"\xff\"",
            b"{\"a\":1,\"a\":2}",
            deep.as_bytes(),
            b"",
        ];
        for case in cases {
            assert_eq!(
                is_json(case),
                serde_json::from_slice::<Value>(case).is_ok(),
                "{}",
                String::from_utf8_lossy(case)
            );
            // Not JSON: nothing; an object: its members.
            match serde_json::from_slice::<Value>(case) {
                Err(_) => assert!(usage_fields(case).is_none()),
                Ok(tree) if tree.is_object() => assert!(usage_fields(case).is_some()),
                Ok(_) => {}
            }
        }
    }

    /// The usage members as a tree gives them: a later key wins; none
    /// from an array or a string, which are no objects.
    #[test]
    fn keeps_the_usage_members_a_tree_keeps() {
        let body = br#"{"usage":{"a":1},"x":"y","usage":{"b":2},"usageMetadata":{"c":3}}"#;
        let fields = usage_fields(body).expect("JSON");
        let tree: Value = serde_json::from_slice(body).expect("JSON");
        assert_eq!(fields.usage.as_ref(), tree.get("usage"));
        assert_eq!(fields.usage_metadata.as_ref(), tree.get("usageMetadata"));
        for other in [&br#"[{"usage":1}]"#[..], br#""usage""#] {
            assert!(usage_fields(other).is_none());
        }
    }
}
