//! Token usage as the agent, a tool or a model API reports it: OpenAI's
//! shape (`prompt_tokens`/`completion_tokens`) or Anthropic's
//! (`input_tokens`/`output_tokens`), counted as input plus output.

use serde_json::Value;

/// The members of a usage object that hold token counts.
const TOKEN_FIELDS: &[&str] = &[
    "input_tokens",
    "prompt_tokens",
    "output_tokens",
    "completion_tokens",
    "total_tokens",
];

/// A token count: a non-negative number with an integral value (`1.5e3`
/// is 1500; SDKs that count in floats still have a budget).
fn token_count(value: &Value) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return Some(n);
    }
    let n = value.as_f64()?;
    (n >= 0.0 && n.fract() == 0.0 && n < 2f64.powi(63)).then_some(n as u64)
}

/// Refuses a usage whose token counts are not counts (SPEC 5): a string,
/// a fraction or a negative number would count as nothing, and a budget
/// would never stop the task.
pub(crate) fn check_usage(usage: &Value) -> Result<(), String> {
    for field in TOKEN_FIELDS {
        if let Some(value) = usage.get(*field)
            && !value.is_null()
            && token_count(value).is_none()
        {
            return Err(format!(
                "`usage.{field}` must be a whole number of tokens, 0 or more, not {value}"
            ));
        }
    }
    Ok(())
}

/// Token usage in the `OpenAI` or Anthropic shape: input plus output tokens.
pub(crate) fn tokens_of(usage: &Value) -> u64 {
    let count = |names: &[&str]| {
        names
            .iter()
            .find_map(|name| usage.get(*name).and_then(token_count))
    };
    let input = count(&["input_tokens", "prompt_tokens"]);
    let output = count(&["output_tokens", "completion_tokens"]);
    match (input, output) {
        (None, None) => count(&["total_tokens"]).unwrap_or(0),
        (input, output) => input.unwrap_or(0).saturating_add(output.unwrap_or(0)),
    }
}

/// Several usages as one, in Anthropic's shape; `None` for none.
pub(crate) fn sum(usages: &[Value]) -> Option<Value> {
    if usages.is_empty() {
        return None;
    }
    let (mut input, mut output) = (0u64, 0u64);
    for usage in usages {
        let total = tokens_of(usage);
        let out = ["output_tokens", "completion_tokens"]
            .iter()
            .find_map(|name| usage.get(*name).and_then(token_count))
            .unwrap_or(0)
            .min(total);
        input = input.saturating_add(total - out);
        output = output.saturating_add(out);
    }
    Some(serde_json::json!({"input_tokens": input, "output_tokens": output}))
}

/// What a model call asks for (SPEC 19), as the proxy reads it off the
/// request: what a budget reserves before it is forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asked {
    pub(crate) model: String,
    /// A bound on its input tokens, with no tokenizer: a token is at
    /// least a byte, so the bytes of the body's text and four a part
    /// (what a chat template adds around a message).
    pub(crate) input: u64,
    /// Its `max_tokens` (`max_completion_tokens`, `max_output_tokens`,
    /// Gemini's `maxOutputTokens`), if it set one.
    pub(crate) output_cap: Option<u64>,
}

impl Asked {
    /// What a `tpm` limit counts of it: its input, and its output cap if it
    /// set one (as providers count a request against their own limits).
    pub(crate) fn rate_tokens(&self) -> u64 {
        self.input + self.output_cap.unwrap_or(0)
    }

    pub(crate) fn of(model: &str, body: &Value) -> Self {
        Self {
            model: model.to_owned(),
            input: text_bound(body),
            output_cap: [
                "/max_tokens",
                "/max_completion_tokens",
                "/max_output_tokens",
                "/generationConfig/maxOutputTokens",
            ]
            .iter()
            .find_map(|pointer| body.pointer(pointer).and_then(Value::as_u64)),
        }
    }
}

/// The bytes of every string in `value` (keys left out: the model sees
/// none), and four for each object and array.
fn text_bound(value: &Value) -> u64 {
    match value {
        Value::String(text) => text.len() as u64,
        Value::Array(items) => 4 + items.iter().map(text_bound).sum::<u64>(),
        Value::Object(members) => 4 + members.values().map(text_bound).sum::<u64>(),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_tokens_in_both_shapes() {
        assert_eq!(
            tokens_of(&json!({"input_tokens": 812, "output_tokens": 240})),
            1052
        );
        assert_eq!(
            tokens_of(&json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})),
            15
        );
        assert_eq!(tokens_of(&json!({"total_tokens": 7})), 7);
        assert_eq!(tokens_of(&json!({"other": 1})), 0);
        assert_eq!(
            tokens_of(&json!({"input_tokens": 1.5e3, "output_tokens": 2.0})),
            1502
        );
        assert!(check_usage(&json!({"input_tokens": 1.5e3})).is_ok());
        for bad in [json!("5000"), json!(-1_000_000), json!(1.5), json!(true)] {
            let message = check_usage(&json!({ "input_tokens": bad })).unwrap_err();
            assert!(message.contains("usage.input_tokens"), "{message}");
        }
    }
}
