//! A model call as a person reads it (SPEC 18): the conversation it sent
//! as messages with roles, and its answer, a stream assembled into its
//! text and tool calls. One reading for `inspect --step` and the web
//! view, of the four request shapes the proxy sees: OpenAI chat and
//! responses, Anthropic messages, Gemini contents.

use serde_json::Value;

use super::recording::{Answer, output_answer};

/// One turn: who said it, and what, tool calls and results written out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Message {
    pub(crate) role: String,
    pub(crate) text: String,
}

/// A model call read: its model, what it sent, what came back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Call {
    pub(crate) model: Option<String>,
    pub(crate) sent: Vec<Message>,
    pub(crate) answer: Vec<Message>,
}

/// The model call of a proxy step's `args` and `output`, if its request
/// is one of a model API's.
pub(crate) fn read(args: &Value, output: Option<&Value>) -> Option<Call> {
    let body = args.get("body")?;
    let sent = sent(body)?;
    let answer = output
        .map(|output| answered(&output_answer(output)))
        .unwrap_or_default();
    Some(Call {
        model: body.get("model").and_then(Value::as_str).map(str::to_owned),
        sent,
        answer,
    })
}

fn message(role: &str, text: String) -> Message {
    Message {
        role: role.to_owned(),
        text,
    }
}

/// A tool call written out: `→ NAME ARGS`.
fn tool_call(name: &str, arguments: &Value) -> String {
    let arguments = match arguments {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    format!("→ {name} {arguments}")
}

/// Text of any content shape: a string, or blocks/parts with `text`,
/// tool calls and tool results among them.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .map(block_text)
            .filter(|text| !text.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => block_text(other),
    }
}

fn block_text(block: &Value) -> String {
    if let Some(text) = block.get("text").and_then(Value::as_str) {
        return text.to_owned();
    }
    if let Some(call) = block.get("functionCall") {
        return tool_call(call["name"].as_str().unwrap_or("?"), &call["args"]);
    }
    if let Some(result) = block.get("functionResponse") {
        return format!("← {}", content_text(&result["response"]));
    }
    match block.get("type").and_then(Value::as_str) {
        Some("tool_use") => tool_call(block["name"].as_str().unwrap_or("?"), &block["input"]),
        Some("tool_result") => format!("← {}", content_text(&block["content"])),
        _ => block.get("output").map(content_text).unwrap_or_default(),
    }
}

/// The messages a request sent, or `None` when it is no model call.
fn sent(body: &Value) -> Option<Vec<Message>> {
    let mut messages = Vec::new();
    // Anthropic's `system`, Responses' `instructions`, Gemini's
    // `systemInstruction`.
    for field in ["system", "instructions"] {
        if let Some(system) = body.get(field) {
            messages.push(message("system", content_text(system)));
        }
    }
    if let Some(system) = body.get("systemInstruction") {
        messages.push(message("system", content_text(&system["parts"])));
    }
    if let Some(list) = body.get("messages").and_then(Value::as_array) {
        for item in list {
            messages.push(chat_message(item));
        }
    } else if let Some(list) = body.get("contents").and_then(Value::as_array) {
        for item in list {
            let role = item["role"].as_str().unwrap_or("user");
            messages.push(message(role, content_text(&item["parts"])));
        }
    } else if let Some(input) = body.get("input") {
        match input {
            Value::Array(items) => messages.extend(items.iter().filter_map(response_item)),
            other => messages.push(message("user", content_text(other))),
        }
    } else {
        return None;
    }
    Some(messages)
}

/// A chat message (OpenAI's or Anthropic's).
fn chat_message(item: &Value) -> Message {
    let role = item["role"].as_str().unwrap_or("user");
    let mut text = content_text(&item["content"]);
    for call in item["tool_calls"].as_array().into_iter().flatten() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&tool_call(
            call.pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or("?"),
            &call
                .pointer("/function/arguments")
                .cloned()
                .unwrap_or(Value::Null),
        ));
    }
    message(role, text)
}

/// An item of a Responses `input` or `output`.
fn response_item(item: &Value) -> Option<Message> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    Some(match kind {
        "message" => message(
            item["role"].as_str().unwrap_or("user"),
            content_text(&item["content"]),
        ),
        "function_call" => message(
            "assistant",
            tool_call(item["name"].as_str().unwrap_or("?"), &item["arguments"]),
        ),
        "custom_tool_call" => message(
            "assistant",
            tool_call(item["name"].as_str().unwrap_or("?"), &item["input"]),
        ),
        "function_call_output" | "custom_tool_call_output" => {
            message("tool", format!("← {}", content_text(&item["output"])))
        }
        "reasoning" => return None,
        other => message(other, content_text(&item["content"])),
    })
}

/// What an answer said: a JSON body read as its API writes it, or a
/// stream's events assembled.
fn answered(answer: &Answer) -> Vec<Message> {
    if answer.is_stream() {
        return assembled(&answer.body);
    }
    let Ok(body) = serde_json::from_slice::<Value>(&answer.body) else {
        return Vec::new();
    };
    if let Some(message) = body.pointer("/choices/0/message") {
        return vec![chat_message(message)];
    }
    if let Some(parts) = body.pointer("/candidates/0/content/parts") {
        return vec![message("model", content_text(parts))];
    }
    if let Some(output) = body.get("output").and_then(Value::as_array) {
        return output.iter().filter_map(response_item).collect();
    }
    if let Some(content) = body.get("content") {
        return vec![message("assistant", content_text(content))];
    }
    Vec::new()
}

/// A stream's text deltas joined, and its tool calls with their
/// arguments gathered (OpenAI chat and responses, Anthropic, Gemini).
fn assembled(body: &[u8]) -> Vec<Message> {
    let mut assembly = Assembly::default();
    for line in String::from_utf8_lossy(body).lines() {
        if let Some(Ok(event)) = line
            .strip_prefix("data:")
            .map(|data| serde_json::from_str::<Value>(data.trim_start()))
        {
            assembly.add(&event);
        }
    }
    let mut said = assembly.text;
    for (name, arguments) in assembly.calls.iter().filter(|(name, _)| !name.is_empty()) {
        if !said.is_empty() {
            said.push('\n');
        }
        said.push_str(&tool_call(name, &Value::String(arguments.clone())));
    }
    if said.is_empty() {
        Vec::new()
    } else {
        vec![message("assistant", said)]
    }
}

/// A stream read so far: its text, and each tool call's name and
/// arguments by index.
#[derive(Default)]
struct Assembly {
    text: String,
    calls: Vec<(String, String)>,
}

impl Assembly {
    /// The tool call at `index`, made when it is the first word of it.
    fn call(&mut self, index: Option<u64>) -> &mut (String, String) {
        let index = index
            .and_then(|index| usize::try_from(index).ok())
            .unwrap_or(0)
            .min(1024);
        if self.calls.len() <= index {
            self.calls.resize(index + 1, (String::new(), String::new()));
        }
        &mut self.calls[index]
    }

    fn add(&mut self, event: &Value) {
        // OpenAI chat
        if let Some(delta) = event.pointer("/choices/0/delta") {
            if let Some(content) = delta.get("content").and_then(Value::as_str) {
                self.text.push_str(content);
            }
            for part in delta["tool_calls"].as_array().into_iter().flatten() {
                let call = self.call(part.get("index").and_then(Value::as_u64));
                if let Some(name) = part.pointer("/function/name").and_then(Value::as_str) {
                    call.0.push_str(name);
                }
                if let Some(arguments) = part.pointer("/function/arguments").and_then(Value::as_str)
                {
                    call.1.push_str(arguments);
                }
            }
            return;
        }
        let index = event.get("index").and_then(Value::as_u64);
        match event.get("type").and_then(Value::as_str).unwrap_or("") {
            // Anthropic
            "content_block_start" if event["content_block"]["type"] == "tool_use" => {
                event["content_block"]["name"]
                    .as_str()
                    .unwrap_or("?")
                    .clone_into(&mut self.call(index).0);
            }
            "content_block_delta" => {
                let delta = &event["delta"];
                if let Some(part) = delta.get("text").and_then(Value::as_str) {
                    self.text.push_str(part);
                } else if let Some(part) = delta.get("partial_json").and_then(Value::as_str) {
                    self.call(index).1.push_str(part);
                }
            }
            // Responses
            "response.output_text.delta" => {
                self.text.push_str(event["delta"].as_str().unwrap_or(""));
            }
            "response.output_item.done" => {
                let item = &event["item"];
                if let Some(name) = item.get("name").and_then(Value::as_str) {
                    let arguments = item.get("arguments").or_else(|| item.get("input"));
                    self.calls.push((
                        name.to_owned(),
                        content_text(arguments.unwrap_or(&Value::Null)),
                    ));
                } else if item["type"] == "message" && self.text.is_empty() {
                    self.text.push_str(&content_text(&item["content"]));
                }
            }
            // Gemini: each event a piece of the candidate.
            _ => {
                for part in event
                    .pointer("/candidates/0/content/parts")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        self.text.push_str(text);
                    } else if let Some(call) = part.get("functionCall") {
                        self.calls.push((
                            call["name"].as_str().unwrap_or("?").to_owned(),
                            call["args"].to_string(),
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stream(events: &str) -> Value {
        json!({"status": 200, "content_type": "text/event-stream", "text": events})
    }

    #[test]
    fn a_chat_call_reads_as_messages_with_roles() {
        let args = json!({"body": {"model": "gpt-4o", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Add 2 and 3"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ]}});
        let output = json!({"status": 200, "content_type": "application/json", "body": {
            "choices": [{"message": {"role": "assistant", "content": "It is 5."}}]}});
        let call = read(&args, Some(&output)).unwrap();
        assert_eq!(call.model.as_deref(), Some("gpt-4o"));
        let roles: Vec<&str> = call.sent.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(call.sent[2].text, "→ add {\"a\":2,\"b\":3}");
        assert_eq!(call.answer, [message("assistant", "It is 5.".into())]);
    }

    #[test]
    fn streams_are_assembled_into_text_and_tool_calls() {
        let chat = stream(concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"add\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n",
            "data: [DONE]\n\n",
        ));
        let args = json!({"body": {"messages": []}});
        assert_eq!(
            read(&args, Some(&chat)).unwrap().answer[0].text,
            "Hello\n→ add {\"a\":1}"
        );
        let anthropic = stream(concat!(
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Sure.\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"name\":\"Bash\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"command\\\":\\\"ls\\\"}\"}}\n\n",
        ));
        assert_eq!(
            read(&args, Some(&anthropic)).unwrap().answer[0].text,
            "Sure.\n→ Bash {\"command\":\"ls\"}"
        );
        let gemini = stream(
            "data: {\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":[{\"text\":\"Hi\"},{\"functionCall\":{\"name\":\"run\",\"args\":{\"c\":1}}}]}}]}\n\n",
        );
        assert_eq!(
            read(&args, Some(&gemini)).unwrap().answer[0].text,
            "Hi\n→ run {\"c\":1}"
        );
    }

    #[test]
    fn every_request_shape_reads() {
        let anthropic = json!({"body": {"system": [{"type": "text", "text": "S"}], "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": [{"type": "tool_use", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "content": "a.txt"}]}]}});
        let texts: Vec<String> = read(&anthropic, None)
            .unwrap()
            .sent
            .iter()
            .map(|m| format!("{}: {}", m.role, m.text))
            .collect();
        assert_eq!(
            texts,
            [
                "system: S",
                "user: Q",
                "assistant: → Bash {\"command\":\"ls\"}",
                "user: ← a.txt"
            ]
        );
        let responses = json!({"body": {"instructions": "I", "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q"}]},
            {"type": "function_call", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "output": "done"},
            {"type": "reasoning", "summary": []}]}});
        let call = read(&responses, None).unwrap();
        assert_eq!(call.sent.len(), 4);
        assert_eq!(call.sent[3], message("tool", "← done".into()));
        let gemini = json!({"body": {"contents": [{"role": "user", "parts": [{"text": "Q"}]}]}});
        assert_eq!(
            read(&gemini, None).unwrap().sent,
            [message("user", "Q".into())]
        );
        // Not a model call: an API route's body.
        assert!(read(&json!({"body": {"title": "x"}}), None).is_none());
        assert!(read(&json!({"body": null}), None).is_none());
    }
}
