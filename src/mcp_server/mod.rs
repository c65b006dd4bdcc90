//! `durun mcp-server` (SPEC 22): an MCP server over the journal on
//! stdin/stdout (or, with `--listen`, on the streamable HTTP transport,
//! served by the web view's server: `ui::serve_mcp`), so that a coding agent can look after durable runs. Each
//! tool runs this binary's command of its name with `--json`, on the same
//! journal, and answers what the command printed, as text and as
//! structured content: a tool says what the command says, no more. `durun
//! skill install` writes the skill that tells an agent when to use them.

mod tools;

use anyhow::Result;
use serde_json::{Value, json};

use crate::cli::{SkillAction, SkillArgs};
use crate::settings::Settings;

/// The protocol versions this server speaks; it answers a client in its
/// own when it is one of them, else in the newest.
const VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The longest message a client may send.
const MAX_MESSAGE: usize = 16 << 20;

/// JSON-RPC's error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// How many tool calls run at once; one more waits for the oldest.
const CALLS_AT_ONCE: usize = 8;

/// Serves the client on stdin/stdout until it closes stdin and the calls
/// under way have answered; exit code 0. A tool call runs on a thread of
/// its own (a `resume` or a `test` may take as long as its agent), so the
/// client's other requests are answered meanwhile, each with its id.
pub(crate) fn exec(settings: &Settings) -> i32 {
    let out = crate::mcp::ToClient::new();
    let mut calls: std::collections::VecDeque<std::thread::JoinHandle<()>> =
        std::collections::VecDeque::new();
    let send =
        |out: &crate::mcp::ToClient, message: &Value| out.send(message.to_string().as_bytes());
    crate::mcp::for_each_line(
        std::io::stdin().lock(),
        MAX_MESSAGE,
        || {
            // Its id is unread: the answer has none.
            let too_long = format!("a message over {} MiB", MAX_MESSAGE >> 20);
            send(&out, &error(&Value::Null, INVALID_REQUEST, &too_long));
        },
        |line| {
            calls.retain(|call| !call.is_finished());
            let call_id = serde_json::from_slice::<Value>(&line)
                .ok()
                .filter(|message| message["method"] == "tools/call")
                .and_then(|message| message.get("id").cloned());
            let Some(id) = call_id else {
                return answers(&line, settings).is_none_or(|answers| send(&out, &answers));
            };
            if calls.len() >= CALLS_AT_ONCE
                && let Some(oldest) = calls.pop_front()
            {
                let _ = oldest.join();
            }
            let (call_out, call_settings) = (out.clone(), settings.clone());
            let spawned = std::thread::Builder::new()
                .name("mcp-call".into())
                .spawn(move || {
                    if let Some(answers) = answers(&line, &call_settings) {
                        send(&call_out, &answers);
                    }
                });
            match spawned {
                Ok(call) => {
                    calls.push_back(call);
                    true
                }
                Err(err) => send(
                    &out,
                    &error(
                        &id,
                        INVALID_REQUEST,
                        &format!("cannot start the call: {err}"),
                    ),
                ),
            }
        },
    );
    for call in calls {
        let _ = call.join();
    }
    0
}

/// The answer to a message or a batch of them, as JSON-RPC has it (a
/// batch's answers in a list); none when all were notifications or
/// responses. The stdio server's and `--listen`'s.
pub(crate) fn answers(body: &[u8], settings: &Settings) -> Option<Value> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(batch)) => {
            let answers: Vec<Value> = batch
                .iter()
                .filter_map(|message| answer(message, settings))
                .collect();
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        Ok(message) => answer(&message, settings),
        Err(err) => Some(error(
            &Value::Null,
            PARSE_ERROR,
            &format!("not JSON: {err}"),
        )),
    }
}

/// The answer to one message; none for a notification or a response.
fn answer(message: &Value, settings: &Settings) -> Option<Value> {
    let id = message.get("id")?;
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        // A response to a request of ours (there are none) or no request.
        return message
            .get("result")
            .or_else(|| message.get("error"))
            .is_none()
            .then(|| error(id, INVALID_REQUEST, "not a JSON-RPC request"));
    };
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": tools::list() })),
        "tools/call" => tools::call(&params, settings),
        _ => Err((
            METHOD_NOT_FOUND,
            format!("durun mcp-server has no method {method}"),
        )),
    };
    Some(match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => error(id, code, &message),
    })
}

fn initialize(params: &Value) -> Value {
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    let version = VERSIONS
        .iter()
        .find(|version| **version == asked)
        .unwrap_or(&VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "durun", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "durun keeps AI agents' runs in a write-ahead journal: a run that crashed is resumed with its finished steps answered from the journal. These tools read that journal (list_tasks, inspect_task, inspect_step, diff) and act on its tasks (resume, fork, approve, signal, cancel, test), each as the durun command of its name does.",
    })
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The skill an agent reads: when and how to use durun.
const SKILL: &str = include_str!("skill.md");

/// `durun skill install`: writes the skill to its directory.
pub(crate) fn skill(args: &SkillArgs) -> Result<i32> {
    use anyhow::Context as _;
    let SkillAction::Install { dir } = &args.action;
    let path = dir.join("SKILL.md");
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, SKILL))
        .with_context(|| format!("cannot write the skill to {}", path.display()))?;
    crate::report::say(&format!("wrote the durun skill to {}", path.display()));
    Ok(0)
}
