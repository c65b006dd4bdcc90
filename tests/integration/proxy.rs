//! The model/API proxy (SPEC 12): unmodified agents on the real `openai`
//! and `anthropic` packages and plain HTTP, their calls journaled by
//! `durun run` alone, killed with SIGKILL and resumed.

use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, agents_dir, sigkill_once, text};
use crate::servers::{FakeApi, LlmServer, llm_clients};

pub(crate) fn zero_code_agent() -> String {
    agents_dir()
        .join("zero_code.py")
        .to_string_lossy()
        .into_owned()
}

/// An environment whose model clients' upstream is the fake LLM server,
/// set the way a user sets it (OPENAI_BASE_URL, ANTHROPIC_BASE_URL).
pub(crate) fn llm_env() -> (TestEnv, LlmServer) {
    let mut env = TestEnv::new();
    let server = LlmServer::start(&env);
    env.set("OPENAI_BASE_URL", format!("{}/v1", server.base()));
    env.set("ANTHROPIC_BASE_URL", server.base());
    (env, server)
}

/// All the journal holds of `task`, as text: its export and, on SQLite,
/// the file and its WAL byte for byte.
pub(crate) fn journal_text(env: &TestEnv, task: &str) -> String {
    let export = env.durun(&["export", task]);
    assert!(export.status.success(), "{}", text(&export.stderr));
    let mut bytes = export.stdout;
    for file in ["state/journal.db", "state/journal.db-wal"] {
        if let Ok(more) = std::fs::read(env.path(file)) {
            bytes.extend(more);
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

const SAID: &str = "echo: plan | echo: part a | echo: part b | echo: stream | echo: respond | echo: claude | echo: claude stream";

#[test]
fn an_unmodified_agent_killed_with_sigkill_resumes_without_sending_a_model_call_again() {
    if !llm_clients() {
        return;
    }
    let (mut env, server) = llm_env();
    let hold = env.path("hold");
    env.set("HOLD_FILE", hold.to_string_lossy());
    let agent = zero_code_agent();
    let mut durun = env.spawn(&["run", "--task", "t", "--", "python3", &agent], "run");
    sigkill_once(
        &mut durun,
        "every model call",
        Duration::from_secs(60),
        || env.path("hold.reached").exists(),
    );
    let before = server.counts();
    assert_eq!(
        before.as_object().map(serde_json::Map::len),
        Some(7),
        "{before}"
    );

    std::fs::write(&hold, "").expect("release");
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(
        text(&resumed.stdout).trim(),
        SAID,
        "the same answers, replayed"
    );
    assert_eq!(server.counts(), before, "no model call was sent again");

    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    let names: Vec<&str> = steps
        .iter()
        .map(|step| step["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
    assert_eq!(names[0], "openai POST /chat/completions");
    assert!(names.contains(&"openai POST /responses"), "{names:?}");
    assert_eq!(names[6], "anthropic POST /v1/messages");
    assert!(
        steps
            .iter()
            .all(|step| step["kind"] == "proxy" && step["effect"] == "read")
    );
    assert_eq!(steps[0]["args"]["body"]["messages"][0]["content"], "plan");
    assert_eq!(steps[0]["args"]["query"], "");
    let resumed_run = &task["task"]["runs"][1];
    assert_eq!(resumed_run["replayed_steps"], 7);
    assert_eq!(resumed_run["executed_steps"], 0);
    let spent = task["task"]["tokens_spent"].as_u64().expect("spent");
    assert_eq!(
        spent,
        120 * 3 + 60 + 37 + 48 * 2,
        "usage of bodies and streams"
    );
    assert_eq!(resumed_run["tokens_saved"].as_u64(), Some(spent));

    // Readable at 80 columns: the route, the model and what it said, the
    // time and the tokens.
    let shown = env
        .command()
        .env("COLUMNS", "80")
        .args(["inspect", "t"])
        .output()
        .expect("inspect");
    let shown = text(&shown.stdout);
    assert!(
        shown.lines().all(|line| line.chars().count() <= 80),
        "{shown}"
    );
    let first = shown
        .lines()
        .skip_while(|line| !line.starts_with("STEP"))
        .nth(1)
        .expect("step 1");
    for part in ["openai POST", "committed", "120", r#"m: "echo: plan""#] {
        assert!(first.contains(part), "{part} in {first}");
    }
}

#[test]
fn secrets_and_the_proxy_path_are_never_journaled_or_shown() {
    if !llm_clients() {
        return;
    }
    let (env, server) = llm_env();
    let agent = env.write(
        "agent.py",
        r#"
import os, urllib.request, urllib.error
base = os.environ["DURUN_PROXY"]
open("proxy-url", "w").write(base)
# A request without the secret segment goes nowhere.
port_base = base.rsplit("/", 1)[0]
for url in (port_base + "/openai/v1/chat/completions", port_base + "/x/openai/v1/chat/completions"):
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"))
        raise SystemExit("no 404 for " + url)
    except urllib.error.HTTPError as err:
        assert err.code == 404, err.code
exec(open(os.environ["ZERO_CODE"]).read())
"#,
    );
    let mut env = env;
    env.set("ZERO_CODE", zero_code_agent());
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        server.counts().as_object().map(serde_json::Map::len),
        Some(7),
        "the 404s were not forwarded"
    );
    let proxy = std::fs::read_to_string(env.path("proxy-url")).expect("the proxy's URL");
    let secret = proxy.rsplit('/').next().expect("the secret segment");
    assert!(secret.len() >= 32, "at least 128 bits: {secret}");
    assert!(proxy.starts_with("http://127.0.0.1:"), "{proxy}");
    let inspect = env.durun(&["inspect", "t", "--step", "1"]);
    let shown = format!(
        "{}{}{}",
        text(&run.stderr),
        text(&inspect.stdout),
        env.inspect("t")
    );
    let journal = journal_text(&env, "t");
    for secret in [secret, "sk-test-secret", "sk-ant-secret"] {
        assert!(!shown.contains(secret), "{secret} shown");
        assert!(!journal.contains(secret), "{secret} journaled");
    }
}

#[test]
fn a_custom_route_journals_a_post_before_it_and_sends_the_steps_key() {
    let api = FakeApi::start();
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!(
            "[proxy.routes.myapi]\nenv = \"MY_API\"\nupstream = \"{}\"\n",
            api.url.trim_end_matches('/')
        ),
    );
    let agent = agents_dir().join("api_agent.py");
    // The POST's answer is held: its intent is durable, its effect done.
    let mut durun = api.spawn_until_held(&env, "t", &["python3", &agent.to_string_lossy()]);
    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{task}");
    assert_eq!(steps[0]["name"], "myapi GET /resources");
    assert_eq!(steps[0]["effect"], "read");
    assert_eq!(steps[0]["args"]["query"], "page=1");
    assert_eq!(steps[1]["name"], "myapi POST /resources");
    assert_eq!(steps[1]["effect"], "mutate");
    assert_eq!(
        steps[1]["status"], "pending",
        "journaled before it was forwarded"
    );
    let key = steps[1]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_owned();
    assert_eq!(
        api.keys(),
        std::slice::from_ref(&key),
        "the step's key replaced the agent's"
    );
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    api.release();

    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(api.keys(), [key.clone(), key], "retried with the same key");
    assert_eq!(api.resources(), 1, "one resource, not two");
    let printed: Value = serde_json::from_slice(&resumed.stdout).expect("the agent's print");
    assert_eq!(printed["created"]["id"], "res-1");
    let task = env.inspect("t");
    assert_eq!(task["steps"][1]["status"], "committed");
    assert_eq!(task["steps"][1]["attempts"], 2);
    assert!(!journal_text(&env, "t").contains("api-secret"));
}

#[test]
fn a_stream_reaches_the_agent_chunk_by_chunk_and_a_cut_off_stream_is_sent_again() {
    if !llm_clients() {
        return;
    }
    let (mut env, server) = llm_env();
    let agent = agents_dir().join("slow_stream.py");
    let agent = agent.to_string_lossy();
    // The upstream holds its stream's end until the agent has its first
    // chunk: a proxy that buffered would leave it waiting 30 s.
    env.set("FIRST_FILE", env.path("llm.port.release").to_string_lossy());
    let run = env.durun(&["run", "--task", "relayed", "--", "python3", &agent]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout).trim(), "first second");
    let released = std::fs::read_to_string(env.path("llm.port.released")).expect("released");
    assert_eq!(
        released, "yes",
        "the first chunk reached the agent before the end"
    );
    let task = env.inspect("relayed");
    assert_eq!(task["steps"][0]["tokens"], 7, "the stream's usage");
    std::fs::remove_file(env.path("llm.port.release")).expect("reset");

    // Killed with the stream half sent: not a finished step.
    env.set("FIRST_FILE", env.path("first").to_string_lossy());
    let mut durun = env.spawn(&["run", "--task", "cut", "--", "python3", &agent], "run");
    sigkill_once(
        &mut durun,
        "the first chunk",
        Duration::from_secs(60),
        || env.path("first").exists(),
    );
    assert_eq!(
        env.inspect("cut")["steps"],
        serde_json::json!([]),
        "nothing finished"
    );
    std::fs::write(env.path("llm.port.release"), "").expect("release");
    let resumed = env.durun(&["resume", "cut"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(text(&resumed.stdout).trim(), "first second");
    assert_eq!(
        server.counts()["/v1/chat/completions slow stream"],
        3,
        "the cut-off call was sent again"
    );
    let steps = env.inspect("cut")["steps"].clone();
    assert_eq!(steps.as_array().map(Vec::len), Some(1), "{steps}");
    assert_eq!(steps[0]["status"], "committed");
}

#[test]
fn an_error_answer_is_passed_on_and_journaled_as_an_attempt_only() {
    if !llm_clients() {
        return;
    }
    let (env, server) = llm_env();
    let agent = env.write(
        "agent.py",
        r#"
import openai
client = openai.OpenAI(api_key="k", max_retries=0)
for attempt in range(2):
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "status 500"}])
    except openai.InternalServerError as err:
        print("500:", err.body["message"])
unreachable = openai.OpenAI(api_key="k", max_retries=0, base_url=client.base_url)
"#,
    );
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "500: status 500\n500: status 500\n");
    assert_eq!(server.counts()["/v1/chat/completions status 500"], 2);
    let steps = env.inspect("t")["steps"].clone();
    let steps = steps.as_array().expect("steps");
    assert_eq!(steps.len(), 2, "two attempts: {steps:?}");
    assert!(steps.iter().all(|step| step["status"] == "failed"));
    // A resume sends them again: a failed attempt is not a finished step.
    let rerun = env.run_python("u", &agent);
    assert!(rerun.status.success());
    assert_eq!(server.counts()["/v1/chat/completions status 500"], 4);
}

#[test]
fn a_wrapped_client_through_the_proxy_is_one_step_counted_once() {
    if !llm_clients() {
        return;
    }
    let (mut env, server) = llm_env();
    env.set("PYTHONPATH", crate::env::sdk_path());
    let agent = env.write(
        "agent.py",
        r#"
import durun, openai
client = durun.wrap(openai.OpenAI(api_key="k", max_retries=0))
reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan"}])
print(reply.choices[0].message.content)
"#,
    );
    let run = env.run_python("t", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    // The SDK sends the agent's prints to stderr.
    assert!(
        text(&run.stderr).contains("echo: plan\n"),
        "{}",
        text(&run.stderr)
    );
    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "one call, one record: {steps:?}");
    assert_eq!(steps[0]["kind"], "begin");
    assert_eq!(task["task"]["tokens_spent"], 120, "counted once");
    assert_eq!(server.counts()["/v1/chat/completions plan"], 1);
}

#[test]
fn without_the_proxy_the_agents_variables_are_left_alone() {
    let mut env = TestEnv::new();
    env.set("OPENAI_BASE_URL", "http://127.0.0.1:9/v1");
    let agent = env.write(
        "agent.py",
        "import os\nprint(os.environ.get('OPENAI_BASE_URL'), os.environ.get('DURUN_PROXY'))\n",
    );
    let off = env.durun(&[
        "run",
        "--no-proxy",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    assert!(off.status.success());
    assert_eq!(text(&off.stdout), "http://127.0.0.1:9/v1 None\n");
    env.write("durun.toml", "[proxy]\nenabled = false\n");
    let off = env.durun(&["run", "--", "python3", &agent.to_string_lossy()]);
    assert_eq!(text(&off.stdout), "http://127.0.0.1:9/v1 None\n");
    std::fs::remove_file(env.path("durun.toml")).expect("rm");
    let on = env.durun(&["run", "--", "python3", &agent.to_string_lossy()]);
    let printed = text(&on.stdout);
    assert!(printed.starts_with("http://127.0.0.1:"), "{printed}");
    assert!(
        printed.contains("/openai/v1 http://127.0.0.1:"),
        "{printed}"
    );
}

#[test]
fn a_changed_request_leaves_its_recording_not_replayed_and_ignore_is_the_fix() {
    if !llm_clients() {
        return;
    }
    let (env, server) = llm_env();
    // The prompt embeds something that changes every run, as a time does.
    let agent = env.write(
        "agent.py",
        r#"
import os, openai
client = openai.OpenAI(api_key="k", max_retries=0)
run = os.environ["DURUN_RUN"]
client.chat.completions.create(model="m", user=f"session-{run}",
                               messages=[{"role": "user", "content": "stable"}])
client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"run {run}"}])
if run == "1":
    raise SystemExit(3)
"#,
    );
    let agent = agent.to_string_lossy();
    let run = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(
        text(&resumed.stderr).contains("2 recorded request(s) were not replayed"),
        "{}",
        text(&resumed.stderr)
    );
    // Paste-ready, once a run: the first request differs only in `user`.
    assert_eq!(
        text(&resumed.stderr)
            .matches("durun: add to durun.toml [proxy] ignore = ")
            .count(),
        1,
        "{}",
        text(&resumed.stderr)
    );
    assert!(
        text(&resumed.stderr).contains(
            "durun: add to durun.toml [proxy] ignore = [\"/user\"] to replay this call\n"
        ),
        "{}",
        text(&resumed.stderr)
    );
    let shown = env.durun(&["inspect", "t"]);
    let shown = text(&shown.stdout);
    assert!(shown.contains("not replayed in run 2"), "{shown}");
    assert!(
        shown.contains(r#"/messages/0/content: "run 1" -> "run 2""#),
        "{shown}"
    );
    assert!(
        shown.contains(r#"/user: "session-1" -> "session-2""#),
        "{shown}"
    );
    assert_eq!(
        env.inspect("t")["task"]["runs"][1]["not_replayed"],
        serde_json::json!([1, 2])
    );

    // `[proxy] ignore` takes the changing member out of matching (`**`:
    // at any depth, here the top).
    env.write("durun.toml", "[proxy]\nignore = [\"/**/user\"]\n");
    let run = env.durun(&["run", "--task", "u", "--", "python3", &agent]);
    assert_eq!(run.status.code(), Some(3));
    let before = server.counts()["/v1/chat/completions stable"].clone();
    let resumed = env.durun(&["resume", "u"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(
        server.counts()["/v1/chat/completions stable"],
        before,
        "replayed, the user left out"
    );
    let task = env.inspect("u");
    assert_eq!(
        task["task"]["runs"][1]["not_replayed"],
        serde_json::json!([2])
    );
    assert_eq!(task["steps"][0]["args"]["body"].get("user"), None);
}

#[test]
fn protocol_steps_and_proxy_calls_share_a_task_and_each_replays_as_if_alone() {
    if !llm_clients() {
        return;
    }
    let (mut env, server) = llm_env();
    env.set("PYTHONPATH", crate::env::sdk_path());
    env.set("SIDE_EFFECTS", env.path("effects").to_string_lossy());
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    env.write(
        "durun.toml",
        &format!(
            "[proxy.routes.dead]\nenv = \"DEAD_API\"\nupstream = \"http://127.0.0.1:{dead}\"\n"
        ),
    );
    let agent = env.write(
        "agent.py",
        r#"
import os, urllib.request, urllib.error
import durun, openai

@durun.step("effect", effect="mutate")
def effect(name):
    with open(os.environ["SIDE_EFFECTS"], "a") as out:
        out.write(name + "\n")
    return name

client = openai.OpenAI(api_key="k", max_retries=0)
effect("one")
said = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "between"}])
try:   # an upstream that is down: no answer, no step
    urllib.request.urlopen(urllib.request.Request(os.environ["DEAD_API"] + "/x", data=b"{}", method="GET"))
except urllib.error.HTTPError as err:
    assert err.code == 502, err.code
effect("two")
print(said.choices[0].message.content)
if os.environ["DURUN_RUN"] == "1":
    raise SystemExit(3)
"#,
    );
    let agent = agent.to_string_lossy();
    let run = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let effects = std::fs::read_to_string(env.path("effects")).expect("effects");
    assert_eq!(effects, "one\ntwo\n", "each protocol step ran once");
    assert_eq!(server.counts()["/v1/chat/completions between"], 1);
    let task = env.inspect("t");
    let steps: Vec<(u64, &str)> = task["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| {
            (
                step["step"].as_u64().unwrap(),
                step["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [(1, "begin"), (2, "proxy"), (3, "begin")],
        "no number left unused"
    );
    assert_eq!(task["task"]["runs"][1]["replayed_steps"], 3);
}
