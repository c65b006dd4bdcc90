//! Time travel (SPEC 20): `durun diff` of two tasks.

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, text};
use crate::proxy::llm_env;
use crate::servers::LlmServer;

/// The fake model's environment, its agents able to `from chat import ask`
/// (tests/agents/chat.py).
fn chat_env() -> (TestEnv, LlmServer) {
    let (mut env, server) = llm_env();
    env.set("PYTHONPATH", agents_dir().to_string_lossy());
    (env, server)
}

/// An agent of three model calls, the third asking after `$VARIANT`.
const THREE_CALLS: &str = r#"import os
from chat import ask
for prompt in ("one", "two", "three " + os.environ["VARIANT"]):
    ask(prompt)
"#;

#[test]
fn a_diff_of_two_runs_of_one_agent_shows_where_they_part_and_what_changed() {
    let (env, _server) = chat_env();
    let agent = env.write("agent.py", THREE_CALLS);
    let agent = agent.to_string_lossy();
    for (task, variant) in [("a", "a"), ("b", "b"), ("c", "a")] {
        let run = env
            .command()
            .env("VARIANT", variant)
            .args(["run", "--task", task, "--", "python3", &agent])
            .output()
            .expect("durun");
        assert!(run.status.success(), "{}", text(&run.stderr));
    }
    let diff = env.durun(&["diff", "a", "b", "--json"]);
    assert!(diff.status.success(), "{}", text(&diff.stderr));
    let diff: Value = serde_json::from_slice(&diff.stdout).expect("JSON");
    assert_eq!(diff["first_parting"], 3, "{diff:#}");
    let steps = diff["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3);
    assert_eq!(steps[0]["same"], true);
    assert_eq!(steps[1]["same"], true);
    assert_eq!(steps[2]["same"], false);
    assert_eq!(
        steps[2]["args"],
        json!([{"pointer": "/messages/0/content", "old": "three a", "new": "three b"}])
    );
    assert_eq!(
        steps[2]["output"],
        json!([{"pointer": "answer", "old": "echo: three a", "new": "echo: three b"}])
    );
    assert_eq!(diff["tokens_difference"], 0);
    assert_eq!(diff["a"]["steps"], 3);

    let shown = text(&env.durun(&["diff", "a", "b"]).stdout);
    for line in [
        "   1  openai POST /chat/completions  same\n",
        "   3  openai POST /chat/completions  differs  <- first parting\n",
        "      args    /messages/0/content: \"three a\" -> \"three b\"\n",
        "      output  answer: \"echo: three a\" -> \"echo: three b\"\n",
        "the tasks part at step 3\n",
    ] {
        assert!(shown.contains(line), "{line:?} in:\n{shown}");
    }
    // The web view's comparison says the same.
    let ui = crate::ui::Ui::start(&env, &[]);
    let page = ui.get("/diff?a=a&b=b").body;
    assert!(page.contains("The tasks first part at step 3."), "{page}");
    assert!(
        page.contains("args <code>/messages/0/content</code>: <span class=\"old\">&quot;three a&quot;</span> → <span class=\"new\">&quot;three b&quot;</span>"),
        "{page}"
    );
    assert_eq!(ui.get("/diff?a=a&b=nope").status, 404);
    assert!(ui.get("/tasks/a").body.contains("<button>Compare</button>"));
    drop(ui);
    // Two runs that went the same way part nowhere.
    let same: Value =
        serde_json::from_slice(&env.durun(&["diff", "a", "c", "--json"]).stdout).expect("JSON");
    assert_eq!(same["first_parting"], Value::Null, "{same:#}");
    let missing = env.durun(&["diff", "a", "nope"]);
    assert_eq!(missing.status.code(), Some(64));
    assert!(
        text(&missing.stderr).contains("no task nope"),
        "{}",
        text(&missing.stderr)
    );
}

/// An agent whose third call asks after the second's answer.
const CHAINED: &str = r#"from chat import ask
ask("one")
two = ask("two")
print(ask("after " + two))
"#;

#[test]
fn an_edited_fork_replays_the_prefix_free_and_the_agent_goes_on_from_the_edit() {
    let (env, server) = chat_env();
    let agent = env.write("agent.py", CHAINED);
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "echo: after echo: two\n");
    let before = server.counts();
    let edit = env.write(
        "edit.json",
        r#"{"id": "e1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "EDITED"}, "finish_reason": "stop"}]}"#,
    );
    let fork = env.durun(&[
        "fork",
        "t",
        "--at",
        "2",
        "--output",
        &edit.to_string_lossy(),
        "--task",
        "f",
    ]);
    assert!(fork.status.success(), "{}", text(&fork.stderr));
    assert_eq!(text(&fork.stdout), "f\n");
    let resumed = env.durun(&["resume", "f"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    // The agent's next request carried the edited answer; nothing before
    // the edit reached the model again.
    assert_eq!(text(&resumed.stdout), "echo: after EDITED\n");
    let counts = server.counts();
    assert_eq!(
        counts["/v1/chat/completions one"],
        before["/v1/chat/completions one"]
    );
    assert_eq!(
        counts["/v1/chat/completions two"],
        before["/v1/chat/completions two"]
    );
    assert_eq!(counts["/v1/chat/completions after EDITED"], 1, "{counts}");
    let inspected = env.inspect("f");
    assert_eq!(inspected["steps"][1]["resolution"], "edited");
    assert_eq!(inspected["steps"][1]["tokens"], 0);
    assert_eq!(inspected["task"]["runs"][0]["replayed_steps"], 2);
    assert!(
        text(&env.durun(&["inspect", "f"]).stdout).contains("  edited  "),
        "the step table marks it"
    );
    // The original is untouched, and the two part at the edit.
    let diff: Value =
        serde_json::from_slice(&env.durun(&["diff", "t", "f", "--json"]).stdout).expect("JSON");
    assert_eq!(diff["first_parting"], 2, "{diff:#}");
    assert_eq!(env.inspect("t")["steps"][1]["resolution"], Value::Null);
    // A step past the task's end cannot be answered; a bad file is said.
    let past = env.durun(&[
        "fork",
        "t",
        "--at",
        "4",
        "--output",
        &edit.to_string_lossy(),
    ]);
    assert_eq!(past.status.code(), Some(64));
    assert!(
        text(&past.stderr).contains("there is no step 4"),
        "{}",
        text(&past.stderr)
    );
}

/// The web view's step page forks with an edited answer (SPEC 20).
#[test]
fn the_step_page_forks_with_an_edited_answer() {
    let (env, _server) = chat_env();
    let agent = env.write("agent.py", CHAINED);
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let ui = crate::ui::Ui::start(&env, &[]);
    let page = ui.get("/tasks/t/steps/2").body;
    assert!(page.contains("Fork with this answer"), "{page}");
    // The answer as the agent got it, to edit.
    assert!(
        page.contains("&quot;content&quot;: &quot;echo: two&quot;"),
        "{page}"
    );
    let edited = r#"{"id": "e1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "EDITED"}, "finish_reason": "stop"}]}"#;
    let body: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", &ui.csrf())
        .append_pair("from", "2")
        .append_pair("output", edited)
        .finish();
    let bearer = ui.bearer();
    let answer = crate::ui::request(
        &ui.at,
        "POST",
        "/tasks/t/fork",
        &[
            ("Authorization", bearer.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Accept", "application/json"),
        ],
        &body,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let said: Value = serde_json::from_str(&answer.body).expect("JSON");
    let forked = said["location"]
        .as_str()
        .and_then(|location| location.strip_prefix("/tasks/"))
        .expect("the fork's page")
        .to_owned();
    let resumed = env.durun(&["resume", &forked]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(text(&resumed.stdout), "echo: after EDITED\n");
    assert_eq!(env.inspect(&forked)["steps"][1]["resolution"], "edited");
    // The edit's file is gone once the fork read it.
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("durun-ui-edit-{}-", ui.child.id()))
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
