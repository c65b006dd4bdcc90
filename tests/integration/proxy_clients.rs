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
