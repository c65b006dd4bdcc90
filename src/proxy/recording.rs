//! What the journal keeps of a proxied request's answer: the answer as a
//! step's output (and as a replay gives it back), whether it is whole, and
//! the tokens it spent. The request's side is `request.rs`.
//!
//! # Invariant
//!
//! Nothing from a request's headers is ever in the args or the output: a
//! secret the agent sends (`authorization`, `x-api-key`, …) is forwarded
//! and forgotten.

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::json_text::JsonText;

/// A recorded answer, as the agent gets it again on replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: Option<String>,
    /// Shared, not copied, with the agent's answer and the recorder.
    pub(crate) body: bytes::Bytes,
}

impl Answer {
    /// Whether it is an event stream (replayed as a stream).
    pub(crate) fn is_stream(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(|content_type| content_type.starts_with("text/event-stream"))
    }
}

/// Whether a body the upstream ended by closing its connection is whole
/// by its type (SPEC 17): JSON that parses; an OpenAI chat stream that
/// reached `[DONE]`; an Anthropic stream that reached `message_stop`; an
/// OpenAI Responses stream that reached its last event. A body of another
/// type cannot say, and counts as whole.
pub(crate) fn whole(content_type: Option<&str>, body: &[u8]) -> bool {
    let content_type = content_type.unwrap_or_default();
    if content_type.starts_with("text/event-stream") {
        let text = String::from_utf8_lossy(body);
        let has = |mark: &str| text.contains(mark);
        if has("message_start") {
            return has("message_stop");
        }
        if has("response.created") {
            return has("response.completed")
                || has("response.failed")
                || has("response.incomplete");
        }
        if has("chat.completion.chunk") {
            return has("data: [DONE]");
        }
        return true;
    }
    if content_type.contains("json") {
        return serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok();
    }
    true
}

/// An answer as a step's output: its status, content type and body (JSON
/// as JSON, other UTF-8 text as `text`, anything else as `base64`).
pub(crate) fn answer_output(answer: &Answer) -> Value {
    let mut output = Map::new();
    output.insert("status".into(), answer.status.into());
    output.insert(
        "content_type".into(),
        answer
            .content_type
            .clone()
            .map_or(Value::Null, Value::String),
    );
    let json_body = !answer.is_stream() && !answer.body.is_empty();
    match json_body
        .then(|| serde_json::from_slice::<Value>(&answer.body).ok())
        .flatten()
    {
        Some(body) => {
            output.insert("body".into(), body);
        }
        None => match std::str::from_utf8(&answer.body) {
            Ok(text) => {
                output.insert("text".into(), text.into());
            }
            Err(_) => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(&answer.body);
                output.insert("base64".into(), encoded.into());
            }
        },
    }
    Value::Object(output)
}

/// An answer as a step's output, as the journal keeps it: [`answer_output`],
/// with a JSON body's members in the order the upstream wrote them (the
/// whitespace between its tokens left out). A replay then gives the agent
/// the object it read the first time, in that order: an agent that puts
/// the answer back into its next request (a chat's history) sends the
/// same bytes as before, which replay by their hash.
pub(crate) fn answer_output_text(answer: &Answer) -> JsonText {
    // The body is JSON exactly when `answer_output` keeps it as `body`;
    // checked without its tree, which would copy every string of it.
    let json_body =
        !answer.is_stream() && !answer.body.is_empty() && super::skim::is_json(&answer.body);
    let kept = json_body
        .then(|| minified(&answer.body))
        .flatten()
        .and_then(|body| {
            // The keys in the order `answer_output`'s map gives them.
            let content_type = Value::from(answer.content_type.clone());
            let text = format!(
                r#"{{"body":{body},"content_type":{content_type},"status":{}}}"#,
                answer.status
            );
            JsonText::from_text(&text).ok()
        });
    kept.unwrap_or_else(|| JsonText::from_value(&answer_output(answer)))
}

/// `json` (valid JSON) without the whitespace between its tokens; none if
/// it is not UTF-8. A string is copied whole, found by its closing quote
/// (memchr, many bytes at a time): an answer is mostly the text of its
/// strings.
fn minified(json: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(json.len());
    let mut at = 0;
    while let Some(&byte) = json.get(at) {
        if byte == b'"' {
            let end = string_end(json, at + 1);
            out.extend_from_slice(&json[at..end]);
            at = end;
        } else {
            if !byte.is_ascii_whitespace() {
                out.push(byte);
            }
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Where the string whose text starts at `from` ends: just past its
/// closing quote, the first one no backslash escapes (the end of `json`
/// if there is none).
fn string_end(json: &[u8], mut from: usize) -> usize {
    while let Some(rest) = json.get(from..) {
        match memchr::memchr2(b'"', b'\\', rest) {
            Some(found) if rest[found] == b'"' => return from + found + 1,
            // A backslash: the byte after it is escaped.
            Some(found) => from += found + 2,
            None => break,
        }
    }
    json.len()
}

/// The answer a step's output, as the journal keeps it, records: a JSON
/// body as the output's text has it ([`answer_output_text`]). Read in one
/// pass, the body not parsed into a tree: a replay's answer costs a scan
/// of it. An output this cannot read so ([`output_answer`]'s odd cases:
/// a `null` body, a repeated key) is read as a tree.
pub(crate) fn kept_answer(output: &JsonText) -> Answer {
    #[derive(serde::Deserialize)]
    struct Kept<'a> {
        status: Option<u64>,
        content_type: Option<String>,
        #[serde(borrow)]
        body: Option<&'a serde_json::value::RawValue>,
        text: Option<String>,
        base64: Option<String>,
    }
    let Ok(kept) = serde_json::from_str::<Kept<'_>>(output.as_str()) else {
        return output_answer(&output.value());
    };
    if kept.body.is_none() && kept.text.is_none() && kept.base64.is_none() {
        return output_answer(&output.value());
    }
    from_fields(
        kept.status,
        kept.content_type,
        kept.body.map(|body| body.get().as_bytes().to_vec()),
        kept.text.as_deref(),
        kept.base64.as_deref(),
    )
}

/// The answer a step's output records.
pub(crate) fn output_answer(output: &Value) -> Answer {
    from_fields(
        output.get("status").and_then(Value::as_u64),
        output
            .get("content_type")
            .and_then(Value::as_str)
            .map(str::to_owned),
        output
            .get("body")
            .map(|body| serde_json::to_vec(body).expect("a JSON value serializes")),
        output.get("text").and_then(Value::as_str),
        output.get("base64").and_then(Value::as_str),
    )
}

/// An answer from an output's fields, as both readers find them: the body
/// (JSON) first, else `text`, else `base64`; a status that is no HTTP
/// status reads as 200.
fn from_fields(
    status: Option<u64>,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
    text: Option<&str>,
    base64: Option<&str>,
) -> Answer {
    let body = body
        .or_else(|| text.map(|text| text.as_bytes().to_vec()))
        .or_else(|| {
            base64.map(|encoded| {
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .unwrap_or_default()
            })
        })
        .unwrap_or_default();
    Answer {
        status: status
            .and_then(|status| u16::try_from(status).ok())
            .unwrap_or(200),
        content_type,
        body: body.into(),
    }
}

/// The token usage an OpenAI or Anthropic answer reports: `usage` in a
/// JSON body, or gathered from an event stream's events (OpenAI's last
/// chunk, Responses' `response.completed`, Anthropic's `message_start`
/// and `message_delta`, later counts replacing earlier ones).
pub(crate) fn usage_of(answer: &Answer) -> Option<Value> {
    if !answer.is_stream() {
        // Two members of what may be a large body: read without its tree.
        let fields = super::skim::usage_fields(&answer.body)?;
        return fields
            .usage
            .filter(Value::is_object)
            .or_else(|| fields.usage_metadata.as_ref().map(gemini_metadata_usage));
    }
    let text = String::from_utf8_lossy(&answer.body);
    let mut merged = Map::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let Ok(event) = serde_json::from_str::<Value>(data.trim_start()) else {
            continue;
        };
        let usage = event
            .get("usage")
            .or_else(|| event.pointer("/message/usage"))
            .or_else(|| event.pointer("/response/usage"));
        let gemini = gemini_usage(&event);
        if let Some(Value::Object(usage)) = usage.or(gemini.as_ref()) {
            for (field, count) in usage {
                if !count.is_null() {
                    merged.insert(field.clone(), count.clone());
                }
            }
        }
    }
    (!merged.is_empty()).then_some(Value::Object(merged))
}

/// Gemini's `usageMetadata` as the other APIs count it: the prompt's
/// tokens in, the answer's and its thoughts' out (each event of a stream
/// carries the total so far).
fn gemini_usage(body: &Value) -> Option<Value> {
    body.get("usageMetadata").map(gemini_metadata_usage)
}

/// [`gemini_usage`] from the `usageMetadata` member itself.
fn gemini_metadata_usage(metadata: &Value) -> Value {
    let count = |field: &str| metadata.get(field).and_then(Value::as_u64).unwrap_or(0);
    serde_json::json!({
        "input_tokens": count("promptTokenCount"),
        "output_tokens": count("candidatesTokenCount") + count("thoughtsTokenCount"),
    })
}

/// A proxy step at a glance, for `inspect`: the model it asked and the
/// start of what it answered (`m: "The plan is…"`), or the status.
pub(crate) fn summary(args: &Value, output: &Value) -> String {
    let model = args.pointer("/body/model").and_then(Value::as_str);
    let answer = output_answer(output);
    let text = if answer.is_stream() {
        crate::sse::stream_text(&answer.body)
    } else {
        output.get("body").and_then(answer_text)
    };
    let said = match text {
        Some(text) => format!("{:?}", text.trim()),
        None => format!("HTTP {}", answer.status),
    };
    match model {
        Some(model) => format!("{model}: {said}"),
        None => said,
    }
}

/// The text of an OpenAI (chat, responses) or Anthropic answer, or of an
/// MCP tool result.
pub(crate) fn answer_text(body: &Value) -> Option<String> {
    if let Some(text) = body
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
    {
        return Some(text.to_owned());
    }
    if let Some(text) = body.get("output_text").and_then(Value::as_str) {
        return Some(text.to_owned());
    }
    let blocks = body
        .get("content")
        .or_else(|| body.pointer("/output/0/content"))
        .and_then(Value::as_array)?;
    let text: Vec<&str> = blocks
        .iter()
        .filter_map(|block| block.get("text").and_then(Value::as_str))
        .collect();
    (!text.is_empty()).then(|| text.join(" "))
}

#[cfg(test)]
mod tests {
    /// The byte-at-a-time minifier [`super::minified`] replaced: the oracle.
    fn minified_bytewise(json: &[u8]) -> Option<String> {
        let mut out = Vec::with_capacity(json.len());
        let (mut in_string, mut escaped) = (false, false);
        for &byte in json {
            if in_string {
                if escaped {
                    escaped = false;
                } else if byte == b'\\' {
                    escaped = true;
                } else if byte == b'"' {
                    in_string = false;
                }
            } else if byte == b'"' {
                in_string = true;
            } else if byte.is_ascii_whitespace() {
                continue;
            }
            out.push(byte);
        }
        String::from_utf8(out).ok()
    }

    #[test]
    fn minified_copies_strings_whole_and_drops_whitespace_between_tokens() {
        let cases: &[&[u8]] = &[
            b"",
            br#"{ "a" : [1, 2 ,3 ] }"#,
            br#"{"text": "  spaces  inside\t\"quoted\" \\" , "b":true}"#,
            br#""ends with a backslash \\""#,
            br#""escaped quote at the end \""#,
            br#""unterminated"#,
            br#""a lone backslash at the end \"#,
            b"\n\t [ \"\xc3\xa9t\xc3\xa9\" ]\r\n",
            b"\"\xff\"",
            b"  \"\\\\\\\"\" : 1",
        ];
        for case in cases {
            assert_eq!(
                super::minified(case),
                minified_bytewise(case),
                "{}",
                String::from_utf8_lossy(case)
            );
        }
        // Every short string of these bytes, at every length up to 6.
        let alphabet = [b' ', b'"', b'\\', b'a', b'\n', b'{'];
        let mut case = Vec::new();
        for length in 0..=6u32 {
            for mut index in 0..alphabet.len().pow(length) {
                case.clear();
                for _ in 0..length {
                    case.push(alphabet[index % alphabet.len()]);
                    index /= alphabet.len();
                }
                assert_eq!(super::minified(&case), minified_bytewise(&case), "{case:?}");
            }
        }
    }

    use serde_json::json;

    use super::*;

    #[test]
    fn a_body_ended_by_a_close_is_whole_only_if_its_type_says_so() {
        let sse = Some("text/event-stream");
        let openai = "data: {\"object\":\"chat.completion.chunk\"}\n\n";
        assert!(!whole(sse, openai.as_bytes()));
        assert!(whole(sse, format!("{openai}data: [DONE]\n\n").as_bytes()));
        let anthropic = "event: message_start\ndata: {}\n\n";
        assert!(!whole(sse, anthropic.as_bytes()));
        assert!(whole(
            sse,
            format!("{anthropic}event: message_stop\ndata: {{}}\n\n").as_bytes()
        ));
        assert!(whole(sse, b"data: something else\n\n"));
        let json = Some("application/json; charset=utf-8");
        assert!(whole(json, b"{\"a\": [1, 2]}"));
        assert!(!whole(json, b"{\"a\": [1, "));
        assert!(whole(Some("text/plain"), b"cut or not, no one can tell"));
    }

    #[test]
    fn an_answer_survives_the_journal() {
        for answer in [
            Answer {
                status: 200,
                content_type: Some("application/json".into()),
                body: bytes::Bytes::from_static(br#"{"id":"x","n":1.50}"#),
            },
            Answer {
                status: 200,
                content_type: Some("text/event-stream; charset=utf-8".into()),
                body: bytes::Bytes::from_static(b"data: {\"a\":1}\n\ndata: [DONE]\n\n"),
            },
            Answer {
                status: 201,
                content_type: None,
                body: bytes::Bytes::from_static(&[0, 159, 146, 150]),
            },
        ] {
            let output = answer_output(&answer);
            let back = output_answer(&serde_json::from_str(&output.to_string()).unwrap());
            assert_eq!(back, answer, "{output}");
        }
    }

    /// A JSON answer is kept, and replayed, with its members in the
    /// upstream's order and without the whitespace between tokens; one
    /// kept by an older durun (sorted) replays as before.
    #[test]
    fn a_json_answer_is_kept_in_its_own_order() {
        let answer = Answer {
            status: 200,
            content_type: Some("application/json".into()),
            body: bytes::Bytes::from_static(
                b"{\n  \"role\": \"assistant\",\n  \"content\": \"a \\\" b\\\\\" , \"n\": [1.50, {\"z\": 1, \"a\": null}]\n}\n",
            ),
        };
        let kept = answer_output_text(&answer);
        assert_eq!(kept.value(), answer_output(&answer));
        let replayed = kept_answer(&kept);
        assert_eq!(
            std::str::from_utf8(&replayed.body).unwrap(),
            r#"{"role":"assistant","content":"a \" b\\","n":[1.50,{"z":1,"a":null}]}"#
        );
        assert_eq!(
            (replayed.status, replayed.content_type),
            (200, answer.content_type.clone())
        );
        let older = JsonText::from_value(&answer_output(&answer));
        assert_eq!(
            std::str::from_utf8(&kept_answer(&older).body).unwrap(),
            r#"{"content":"a \" b\\","n":[1.50,{"a":null,"z":1}],"role":"assistant"}"#
        );
        // Outputs as older durun kept them, odd ones too: read as a tree
        // reads them.
        for output in [
            json!({"body": {"b": [1, 2.50], "a": "x"}, "content_type": "application/json", "status": 201}),
            json!({"body": null, "content_type": null, "status": 200}),
            json!({"text": "data: x\n\n", "content_type": "text/event-stream", "status": 99_999}),
            json!({"base64": "AJ+Slg==", "content_type": null, "status": 200}),
            json!({"status": 204, "content_type": null}),
        ] {
            let kept = JsonText::from_value(&output);
            assert_eq!(kept_answer(&kept), output_answer(&output), "{output}");
        }
        // Not JSON: kept as before.
        let text = Answer {
            status: 200,
            content_type: Some("text/plain".into()),
            body: bytes::Bytes::from_static(b"{ not json"),
        };
        assert_eq!(kept_answer(&answer_output_text(&text)), text);
    }

    #[test]
    fn a_step_is_summed_up_by_its_model_and_text() {
        let args = json!({"body": {"model": "gpt-x"}, "query": ""});
        let chat = answer_output(&Answer {
            status: 200,
            content_type: Some("application/json".into()),
            body: bytes::Bytes::from_static(br#"{"choices":[{"message":{"content":"the plan"}}]}"#),
        });
        assert_eq!(summary(&args, &chat), r#"gpt-x: "the plan""#);
        let stream = answer_output(&Answer {
            status: 200,
            content_type: Some("text/event-stream".into()),
            body: bytes::Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"a \"}}]}\n\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"b\"}}\n\ndata: [DONE]\n\n"),
        });
        assert_eq!(summary(&args, &stream), r#"gpt-x: "a b""#);
        let claude = json!({"content": [{"type": "text", "text": "hi"}]});
        assert_eq!(answer_text(&claude).as_deref(), Some("hi"));
        let empty = answer_output(&Answer {
            status: 204,
            content_type: None,
            body: bytes::Bytes::new(),
        });
        assert_eq!(summary(&json!({"body": null}), &empty), "HTTP 204");
    }

    #[test]
    fn usage_is_read_from_bodies_and_streams() {
        let plain = Answer {
            status: 200,
            content_type: Some("application/json".into()),
            body: bytes::Bytes::from_static(
                br#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
            ),
        };
        assert_eq!(crate::usage::tokens_of(&usage_of(&plain).unwrap()), 7);
        let anthropic = Answer {
            status: 200,
            content_type: Some("text/event-stream".into()),
            body: concat!(
                "event: message_start\n",
                "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
                "event: message_delta\n",
                "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
            )
            .as_bytes()
            .to_vec()
            .into(),
        };
        assert_eq!(crate::usage::tokens_of(&usage_of(&anthropic).unwrap()), 40);
        let responses = Answer {
            status: 200,
            content_type: Some("text/event-stream".into()),
            body: bytes::Bytes::from_static(b"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":6}}}\n\ndata: [DONE]\n\n"),
        };
        assert_eq!(crate::usage::tokens_of(&usage_of(&responses).unwrap()), 11);
        // Gemini's, each event with the total so far; and a whole answer.
        let gemini = Answer {
            status: 200,
            content_type: Some("text/event-stream".into()),
            body: bytes::Bytes::from_static(b"data: {\"usageMetadata\":{\"promptTokenCount\":30,\"candidatesTokenCount\":2}}\n\ndata: {\"usageMetadata\":{\"promptTokenCount\":30,\"candidatesTokenCount\":7,\"thoughtsTokenCount\":3}}\n\n"),
        };
        assert_eq!(crate::usage::tokens_of(&usage_of(&gemini).unwrap()), 40);
        let whole = Answer {
            status: 200,
            content_type: Some("application/json".into()),
            body: bytes::Bytes::from_static(
                br#"{"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":1}}"#,
            ),
        };
        assert_eq!(crate::usage::tokens_of(&usage_of(&whole).unwrap()), 10);
    }
}
