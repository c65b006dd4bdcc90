//! Every op of docs/protocol.md, sent by each SDK's own encoders to the
//! real decoder: an agent of each SDK (tests/agents/every_op.*) sends every
//! op a run and a resume can send, its lines copied on their way to durun.
//! Each line must be one durun took (the run answers every request, and
//! ends completed), of an op the docs show, with only fields the docs'
//! examples of that op name. So the decoder, the docs and both encoders
//! agree on every op and field; `protocol::request::spelled` checks the
//! docs' examples against the decoder itself.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, text};
use crate::replayed_here::logged;

/// The ops only durun's own commands send (`find`, from `durun mcp`).
const OWN_OPS: [&str; 1] = ["find"];

/// Each op of docs/protocol.md's example requests, with every field its
/// examples name.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/protocol.md"),
    )
    .expect("docs/protocol.md");
    let mut fields: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in docs.lines() {
        let spans = line.split('`').skip(1).step_by(2);
        for example in std::iter::once(line)
            .chain(spans)
            .filter(|text| text.starts_with(r#"{"op":"#))
        {
            let request: Value = serde_json::from_str(example)
                .unwrap_or_else(|err| panic!("docs/protocol.md: {example}: {err}"));
            let op = request["op"].as_str().expect("op").to_owned();
            let named = request.as_object().expect("an object").keys().cloned();
            fields.entry(op).or_default().extend(named);
        }
    }
    fields
}

/// The requests an agent sent in `run`, from its copy on the way.
fn sent(env: &TestEnv, run: u32) -> Vec<Value> {
    let log = std::fs::read_to_string(env.path(&format!("requests-{run}.log"))).expect("log");
    log.lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| {
                panic!("the SDK wrote a line that is not JSON: {line}: {err}")
            })
        })
        .collect()
}

fn every_op_through(sdk: &str, agent: &str) {
    let mut env = TestEnv::new();
    env.write(
        "durun.toml",
        "[tools.echo]\neffect = \"read\"\ncommand = [\"echo\", \"hi\"]\n",
    );
    let command = logged(&mut env, &[agent]);
    let mut args = vec!["run", "--task", "t", "--"];
    args.extend(command.iter().map(String::as_str));
    let first = env.durun(&args);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let signal = env.durun(&["signal", "t", "go", "--data", r#"{"approved":true}"#]);
    assert!(signal.status.success(), "{}", text(&signal.stderr));
    let second = env.durun(&["resume", "t"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let task = &env.inspect("t")["task"];
    assert_eq!(task["status"], "completed");
    assert_eq!(task["output"], json!({"done": true}));

    let documented = documented();
    let mut seen = BTreeSet::new();
    let mut wrong = Vec::new();
    for request in sent(&env, 1).into_iter().chain(sent(&env, 2)) {
        let op = request["op"].as_str().unwrap_or_default().to_owned();
        let Some(fields) = documented.get(&op) else {
            wrong.push(format!(
                "{request}: docs/protocol.md has no example of {op:?}"
            ));
            continue;
        };
        let unnamed: Vec<_> = request
            .as_object()
            .expect("an object")
            .keys()
            .filter(|field| !fields.contains(*field))
            .collect();
        if !unnamed.is_empty() {
            wrong.push(format!(
                "{request}: docs/protocol.md's examples of {op:?} never name {unnamed:?}"
            ));
        }
        seen.insert(op);
    }
    let unsent: Vec<_> = documented
        .keys()
        .filter(|op| !seen.contains(*op) && !OWN_OPS.contains(&op.as_str()))
        .collect();
    assert!(
        wrong.is_empty() && unsent.is_empty(),
        "the {sdk} SDK and docs/protocol.md disagree:\n{}\nops the agent never sent: {unsent:?}",
        wrong.join("\n")
    );
}

#[test]
fn every_documented_op_through_the_python_sdk_s_encoders() {
    every_op_through(
        "Python",
        &format!("python3 {}", agents_dir().join("every_op.py").display()),
    );
}

#[test]
fn every_documented_op_through_the_node_sdk_s_encoders() {
    every_op_through(
        "Node",
        &format!("node {}", agents_dir().join("every_op.mjs").display()),
    );
}
