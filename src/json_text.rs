//! JSON kept as text.
//!
//! Step args, outputs and usage travel from the journal to a replay answer
//! or to `inspect --json` without being parsed into a tree and printed
//! again: [`JsonText`] is checked once when it is read and then embedded
//! as it is. A tree is built only where a value is looked into.

use serde::{Deserialize as _, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

#[derive(Clone, Debug)]
pub(crate) struct JsonText(Box<RawValue>);

impl JsonText {
    pub(crate) fn from_value(value: &Value) -> Self {
        Self(serde_json::value::to_raw_value(value).expect("a JSON value always serializes"))
    }

    /// Text that must be JSON (from the journal): checked, not parsed into
    /// a tree.
    pub(crate) fn from_text(text: &str) -> Result<Self, serde_json::Error> {
        // Without serde's default nesting limit: requests nest up to
        // `protocol::MAX_DEPTH`.
        let mut deserializer = serde_json::Deserializer::from_str(text);
        deserializer.disable_recursion_limit();
        let raw = Box::<RawValue>::deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(Self(raw))
    }

    pub(crate) fn null() -> Self {
        Self::from_value(&Value::Null)
    }

    pub(crate) fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The value as a tree, for the few places that look inside.
    pub(crate) fn value(&self) -> Value {
        let mut deserializer = serde_json::Deserializer::from_str(self.0.get());
        deserializer.disable_recursion_limit();
        Value::deserialize(&mut deserializer).expect("JsonText holds valid JSON")
    }

    /// A one-line preview of at most `width` characters: a string's text
    /// (escapes undone), anything else as compact JSON. Reads only the
    /// start of a long value.
    pub(crate) fn preview(&self, width: usize) -> String {
        let text = self.as_str();
        let Some(body) = text.strip_prefix('"') else {
            return text.chars().take(width + 1).collect();
        };
        let mut out = String::new();
        let mut chars = body.chars();
        for _ in 0..=width {
            match chars.next() {
                None | Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('n' | 'r' | 't') => out.push(' '),
                    Some('u') => {
                        let hex: String = chars.by_ref().take(4).collect();
                        out.push(
                            u32::from_str_radix(&hex, 16)
                                .ok()
                                .and_then(char::from_u32)
                                .unwrap_or('\u{fffd}'),
                        );
                    }
                    Some(c) => out.push(c),
                    None => break,
                },
                Some(c) => out.push(c),
            }
        }
        out
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn embeds_raw_and_previews_cheaply() {
        let text = JsonText::from_text(r#"{"a": 1.50, "b": "x"}"#).expect("JSON");
        assert_eq!(
            serde_json::to_string(&json!({"k": 1})).expect("json"),
            r#"{"k":1}"#
        );
        assert_eq!(
            serde_json::to_string(&vec![&text]).expect("json"),
            r#"[{"a": 1.50, "b": "x"}]"#
        );
        assert!(JsonText::from_text("{oops").is_err());
        let long = JsonText::from_value(&json!("line one\nline \"two\" \u{e9}"));
        assert_eq!(long.preview(100), "line one line \"two\" é");
        assert_eq!(long.preview(4), "line ");
        assert_eq!(JsonText::from_value(&json!([1, 2])).preview(10), "[1,2]");
        assert_eq!(text.value()["b"], "x");
    }
}
