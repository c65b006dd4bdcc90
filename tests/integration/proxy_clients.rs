//! The model/API proxy under the clients users run besides Python's
//! `openai`: the `openai` npm package on Node and LangChain's ChatOpenAI,
//! unmodified, killed with SIGKILL and resumed.

use std::time::Duration;

use crate::env::{agents_dir, sigkill_once, text};
use crate::proxy::{journal_text, llm_env};
use crate::servers::llm_clients;

/// The `openai` npm package, as `.ci/run` installs it into sdk/node.
fn node_openai() -> Option<String> {
    let modules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/node/node_modules");
    if modules.join("openai").exists() {
        return Some(modules.to_string_lossy().into_owned());
    }
    assert!(
        std::env::var("DURUN_TEST_LLM_CLIENTS").is_err(),
        "DURUN_TEST_LLM_CLIENTS is set but the openai npm package is not in sdk/node/node_modules"
    );
    crate::env::skipped("(cd sdk/node && npm install --no-save openai@4) to run it");
    None
}

#[test]
fn an_unmodified_node_agent_on_the_openai_npm_package_resumes_without_resending() {
    let Some(modules) = node_openai() else {
        return;
    };
    let (mut env, server) = llm_env();
    env.set("NODE_PATH", modules);
    let hold = env.path("hold");
    env.set("HOLD_FILE", hold.to_string_lossy());
    let agent = agents_dir().join("zero_code.cjs");
    let agent = agent.to_string_lossy();
    let mut durun = env.spawn(&["run", "--task", "t", "--", "node", &agent], "run");
    sigkill_once(
        &mut durun,
        "every model call",
        Duration::from_secs(60),
        || env.path("hold.reached").exists(),
    );
    let before = server.counts();
    assert_eq!(
        before.as_object().map(serde_json::Map::len),
        Some(3),
        "{before}"
    );
    std::fs::write(&hold, "").expect("release");
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(
        text(&resumed.stdout).trim(),
        "echo: node plan | echo: node stream | echo: node respond"
    );
    assert_eq!(server.counts(), before, "no model call was sent again");
    let task = env.inspect("t");
    assert_eq!(task["task"]["runs"][1]["replayed_steps"], 3);
    assert!(!journal_text(&env, "t").contains("sk-node-secret"));
}

#[test]
fn langchains_chat_openai_replays_on_resume() {
    if !llm_clients()
        || !crate::env::python_has(
            "langchain_openai",
            "DURUN_TEST_LLM_CLIENTS",
            "langchain-openai",
        )
    {
        return;
    }
    let (mut env, server) = llm_env();
    env.set("OPENAI_API_KEY", "sk-lc-secret");
    let agent = env.write(
        "agent.py",
        r#"
import os
from langchain_openai import ChatOpenAI
llm = ChatOpenAI(model="m", max_retries=0)
plan = llm.invoke("lc plan").content
streamed = "".join(chunk.content for chunk in llm.stream("lc stream"))
print(plan, "|", streamed.strip(), flush=True)
if os.environ["DURUN_RUN"] == "1":
    raise SystemExit(3)   # dies after its model calls
"#,
    );
    let agent = agent.to_string_lossy();
    let run = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let before = server.counts();
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(text(&resumed.stdout), text(&run.stdout));
    assert_eq!(text(&resumed.stdout), "echo: lc plan | echo: lc stream\n");
    assert_eq!(server.counts(), before, "no model call was sent again");
    assert_eq!(env.inspect("t")["task"]["runs"][1]["replayed_steps"], 2);
}

/// SPEC 18: an OpenAI chat stream the agent asked without usage (as aider
/// does) is sent asking for it, so the step counts its tokens, and the
/// agent gets the stream it asked for, first run and replay: no usage
/// chunk, no `usage` member.
#[test]
fn a_stream_without_usage_is_counted_and_the_agent_sees_none() {
    if !llm_clients() {
        return;
    }
    let (env, server) = llm_env();
    env.write(
        "quiet.py",
        r#"
import json, os, sys
import openai
client = openai.OpenAI(api_key="k", max_retries=0)
chunks = list(client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "quiet stream"}], stream=True))
print(json.dumps({
    "text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip(),
    "usage": sum("usage" in c.model_fields_set for c in chunks),
    "no_choices": sum(not c.choices for c in chunks),
}))
sys.exit(3 if os.environ.get("DURUN_RUN") == "1" else 0)
"#,
    );
    let seen = serde_json::json!({"text": "echo: quiet stream", "usage": 0, "no_choices": 0});
    let first = env.durun(&["run", "--task", "q", "--", "python3", "quiet.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let resumed = env.durun(&["resume", "q"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    for run in [&first, &resumed] {
        let said: serde_json::Value =
            serde_json::from_str(text(&run.stdout).trim()).expect("the agent's JSON");
        assert_eq!(said, seen);
    }
    let task = crate::env::TestEnv::inspect(&env, "q");
    assert_eq!(task["steps"][0]["tokens"], 60, "the usage durun asked for");
    assert_eq!(
        task["steps"][0]["args"]["body"].get("stream_options"),
        None,
        "journaled as the agent sent it"
    );
    assert_eq!(
        server.counts().as_object().map(serde_json::Map::len),
        Some(1)
    );
    assert!(
        server
            .counts()
            .as_object()
            .unwrap()
            .values()
            .all(|count| count == 1),
        "replayed, not sent again"
    );
}
