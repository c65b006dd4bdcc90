//! Server-sent event streams as model APIs send them (OpenAI's chat and
//! Responses, Anthropic's Messages, Gemini): the text their deltas carry.
//! The proxy's readable answers and the live deltas of a task's events
//! (SPEC 20) read it the same way.

use serde_json::Value;

/// The text an event stream carried, its deltas joined.
pub(crate) fn stream_text(body: &[u8]) -> Option<String> {
    let mut text = String::new();
    for line in String::from_utf8_lossy(body).lines() {
        let Some(Ok(event)) = line
            .strip_prefix("data:")
            .map(|data| serde_json::from_str::<Value>(data.trim_start()))
        else {
            continue;
        };
        let delta = event
            .pointer("/choices/0/delta/content")
            .or_else(|| event.pointer("/delta/text"))
            .or_else(|| event.pointer("/candidates/0/content/parts/0/text"))
            .or_else(|| {
                (event.get("type").and_then(Value::as_str) == Some("response.output_text.delta"))
                    .then(|| event.get("delta"))
                    .flatten()
            });
        if let Some(delta) = delta.and_then(Value::as_str) {
            text.push_str(delta);
        }
    }
    (!text.is_empty()).then_some(text)
}
