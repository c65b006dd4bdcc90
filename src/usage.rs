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
