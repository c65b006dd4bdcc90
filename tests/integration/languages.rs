//! An agent in another language, written from `docs/protocol.md` alone:
//! the JavaScript agent in `tests/agents/node_agent.mjs` runs through a
//! crash inside its `mutate` step and a resume. It checks every key
//! against the doc's formula itself.

use crate::crash::tools_toml;
use crate::env::{TestEnv, agents_dir, text};
use crate::servers::FakeApi;

#[test]
fn a_javascript_agent_from_the_protocol_doc_survives_a_crash() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    env.set("CRASH_ONCE", env.path("crashed").to_string_lossy());
    env.write("durun.toml", &tools_toml());
    let agent = agents_dir().join("node_agent.mjs");
    let agent = agent.to_string_lossy();
    let first = env.durun(&["run", "--task", "js", "--", "node", &agent]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&first.status),
        Some(libc::SIGKILL),
        "{}",
        text(&first.stderr)
    );
    let second = env.durun(&["resume", "js"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(
        text(&second.stdout).contains("a print is not a request"),
        "{}",
        text(&second.stdout)
    );
    // The publish ran twice with one key: one resource; the plan replayed.
    assert_eq!(api.resources(), 1);
    let keys = api.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(
        std::fs::read_to_string(env.path("publish.log")).expect("log"),
        "1 false\n2 true\n"
    );
    let view = env.inspect("js");
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 1);
    assert_eq!(view["task"]["output"]["echo"], "1. tag 2. notes\n");
    assert_eq!(view["steps"][0]["tokens"], 20);
}
