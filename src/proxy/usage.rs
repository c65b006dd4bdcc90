//! Usage for streams that do not ask for it (SPEC 18): an OpenAI chat
//! stream counts its tokens only when the request asks
//! (`stream_options.include_usage`), so a paid call of an agent that does
//! not ask (aider) would show 0 tokens. durun asks on the agent's behalf,
//! records the whole stream, and gives the agent the stream it would have
//! had: without the last chunk that carries the usage and without the
//! `"usage":null` every other chunk then carries. The journaled request is
//! the agent's own, so keys and replay do not change.

use bytes::Bytes;
use serde_json::Value;

/// What durun adds to the request.
const ASK: &str = r#""stream_options":{"include_usage":true},"#;

/// The body to send for the agent's `body` on `route` at `path` (`parsed`
/// as the journal has it, not parsed again): the same JSON asking for
/// usage, when it is an OpenAI chat stream whose request has no
/// `stream_options`; none when it goes as it came.
pub(crate) fn asked(route: &str, path: &str, body: &[u8], parsed: &Value) -> Option<Bytes> {
    if route != "openai" || !path.ends_with("/chat/completions") {
        return None;
    }
    let object = parsed.as_object()?;
    if object.get("stream") != Some(&Value::Bool(true)) || object.contains_key("stream_options") {
        return None;
    }
    // After the object's `{`: the rest goes byte for byte as the agent
    // wrote it.
    let open = body.iter().position(|&byte| byte == b'{')?;
    let mut sent = Vec::with_capacity(body.len() + ASK.len());
    sent.extend_from_slice(&body[..=open]);
    sent.extend_from_slice(ASK.as_bytes());
    sent.extend_from_slice(&body[open + 1..]);
    Some(Bytes::from(sent))
}

/// Whether [`asked`] asks for usage on `body`'s behalf, read from its
/// bytes without building its JSON: for a request replayed by its bytes,
/// whose answer hides the usage durun asked for as it did when recorded.
pub(crate) fn would_ask(route: &str, path: &str, body: &[u8]) -> bool {
    if route != "openai" || !path.ends_with("/chat/completions") {
        return false;
    }
    serde_json::from_slice::<StreamFields>(body)
        .is_ok_and(|fields| fields.stream == Some(Value::Bool(true)) && !fields.options)
}

/// The two fields of a request body [`would_ask`] reads, as a parsed
/// object has them: the last `stream` (a later key wins), and whether
/// `stream_options` is there at all; the rest is skipped.
struct StreamFields {
    stream: Option<Value>,
    options: bool,
}

impl<'de> serde::Deserialize<'de> for StreamFields {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = StreamFields;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StreamFields, A::Error> {
                let mut fields = StreamFields {
                    stream: None,
                    options: false,
                };
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "stream" => fields.stream = Some(map.next_value()?),
                        "stream_options" => {
                            fields.options = true;
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(fields)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// A stream whose usage durun asked for, as the agent gets it: events are
/// held until they are whole, then passed on without what durun added.
#[derive(Default)]
pub(crate) struct Hidden {
    pending: Vec<u8>,
}

impl Hidden {
    /// What of `chunk` (and what came before it) goes on now.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some((end, gap)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + gap).collect();
            if let Some(kept) = without_usage(&event[..end]) {
                out.extend_from_slice(&kept);
                out.extend_from_slice(&event[end..]);
            }
        }
        out
    }

    /// What is left when the stream ends.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.pending);
        without_usage(&rest).unwrap_or_default()
    }

    /// A whole recorded stream, as the agent gets it.
    pub(crate) fn whole(body: &[u8]) -> Vec<u8> {
        let mut hidden = Self::default();
        let mut out = hidden.feed(body);
        out.extend(hidden.finish());
        out
    }
}

/// Where the first event in `bytes` ends, and the length of the blank
/// line that ends it.
fn event_end(bytes: &[u8]) -> Option<(usize, usize)> {
    let lf = find(bytes, b"\n\n").map(|at| (at, 2));
    let crlf = find(bytes, b"\r\n\r\n").map(|at| (at, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (found, None) | (None, found) => found,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// An event without what durun's ask added: none for the chunk that only
/// carries the usage; `"usage":null` taken out of any other.
fn without_usage(event: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(event);
    let data = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim_start)
        .collect::<String>();
    if let Ok(chunk) = serde_json::from_str::<Value>(&data)
        && chunk
            .get("choices")
            .is_some_and(|choices| choices.as_array().is_some_and(Vec::is_empty))
        && chunk.get("usage").is_some_and(Value::is_object)
    {
        return None;
    }
    if !text.contains(r#""usage""#) {
        return Some(event.to_vec());
    }
    Some(without_null_usage(&text).into_bytes())
}

/// `text` without its `"usage": null` members (and the comma that joins
/// each to its neighbour), however spaced. Outside strings a quote is a
/// quote, inside one it is escaped: the member cannot hide in a string.
fn without_null_usage(text: &str) -> String {
    let bytes = text.as_bytes();
    let skip_space = |mut at: usize| {
        while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
            at += 1;
        }
        at
    };
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    let mut search = 0;
    while let Some(found) = text[search..].find(r#""usage""#) {
        let start = search + found;
        search = start + 7;
        let colon = skip_space(start + 7);
        if bytes.get(colon) != Some(&b':') {
            continue;
        }
        let value = skip_space(colon + 1);
        if !text[value..].starts_with("null") {
            continue;
        }
        let mut end = value + 4;
        // The comma before it, else the one after it.
        let before = text[from..start].trim_end();
        let (cut_from, cut_to) = if before.ends_with(',') {
            (from + before.len() - 1, end)
        } else {
            let after = skip_space(end);
            if bytes.get(after) == Some(&b',') {
                end = skip_space(after + 1);
            }
            (start, end)
        };
        out.push_str(&text[from..cut_from]);
        from = cut_to;
        search = cut_to;
    }
    out.push_str(&text[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_stream_that_does_not_ask_is_sent_asking() {
        let asked = |route: &str, path: &str, body: &[u8]| {
            let parsed = serde_json::from_slice(body).unwrap_or(Value::Null);
            asked(route, path, body, &parsed)
        };
        let body = br#" {"model":"m","stream":true,"messages":[]}"#;
        let sent = asked("openai", "/v1/chat/completions", body).expect("asked");
        let sent: Value = serde_json::from_slice(&sent).expect("JSON");
        assert_eq!(sent["stream_options"]["include_usage"], true);
        assert_eq!(sent["model"], "m");
        let own = br#"{"stream":true,"stream_options":{"include_usage":false}}"#;
        assert!(asked("openai", "/v1/chat/completions", own).is_none());
        assert!(asked("openai", "/v1/chat/completions", br#"{"stream":false}"#).is_none());
        assert!(asked("anthropic", "/v1/messages", br#"{"stream":true}"#).is_none());
        assert!(asked("openai", "/v1/chat/completions", b"not json").is_none());
    }

    #[test]
    fn the_agent_gets_the_stream_it_would_have_had() {
        let upstream = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi \\\"usage\\\":null\"}}],\"usage\":null}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{}}],\"usage\":null,\"x\":1}\n\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        );
        let wanted = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi \\\"usage\\\":null\"}}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"delta\":{}}],\"x\":1}\n\n",
            "data: [DONE]\n\n"
        );
        assert_eq!(
            String::from_utf8(Hidden::whole(upstream.as_bytes())).unwrap(),
            wanted
        );
        // Cut anywhere, the same.
        for cut in 1..upstream.len() {
            let mut hidden = Hidden::default();
            let mut out = hidden.feed(&upstream.as_bytes()[..cut]);
            out.extend(hidden.feed(&upstream.as_bytes()[cut..]));
            out.extend(hidden.finish());
            assert_eq!(String::from_utf8(out).unwrap(), wanted, "cut at {cut}");
        }
    }

    /// Read from its bytes alone, a body asks as its parsed JSON does.
    #[test]
    fn would_ask_reads_a_body_as_asked_does() {
        let bodies = [
            r#"{"model":"m","stream":true,"messages":[]}"#,
            r#"{"model":"m","stream":false}"#,
            r#"{"stream":"true"}"#,
            r#"{"stream":true,"stream_options":null}"#,
            r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
            r#"{"stream":true,"stream":false}"#,
            r#"{"stream":false,"stream":true}"#,
            r#"{"messages":[{"stream":true}],"stream":true}"#,
            r#"{"st\u0072eam":true}"#,
            r#"[{"stream":true}]"#,
            r#"{"stream":true} trailing"#,
            "not json",
            "",
        ];
        for body in bodies {
            let parsed = serde_json::from_str::<Value>(body).unwrap_or(Value::Null);
            for (route, path) in [
                ("openai", "/v1/chat/completions"),
                ("openai", "/v1/responses"),
                ("anthropic", "/v1/chat/completions"),
            ] {
                assert_eq!(
                    would_ask(route, path, body.as_bytes()),
                    asked(route, path, body.as_bytes(), &parsed).is_some(),
                    "{route} {path} {body}"
                );
            }
        }
        assert!(would_ask(
            "openai",
            "/v1/chat/completions",
            br#"{"stream":true}"#
        ));
    }
}
