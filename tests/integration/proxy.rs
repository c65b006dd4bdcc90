//! The model/API proxy (SPEC 12): unmodified agents on the real `openai`
//! and `anthropic` packages and plain HTTP, their calls journaled by
//! `durun run` alone, killed with SIGKILL and resumed.

use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, agents_dir, sigkill_once, text};
use crate::servers::{FakeApi, LlmServer, llm_clients};

fn zero_code_agent() -> String {
    agents_dir()
        .join("zero_code.py")
        .to_string_lossy()
        .into_owned()
}

/// An environment whose model clients' upstream is the fake LLM server,
/// set the way a user sets it (OPENAI_BASE_URL, ANTHROPIC_BASE_URL).
fn llm_env() -> (TestEnv, LlmServer) {
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
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
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
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "500: status 500\n500: status 500\n");
    assert_eq!(server.counts()["/v1/chat/completions status 500"], 2);
    let steps = env.inspect("t")["steps"].clone();
    let steps = steps.as_array().expect("steps");
    assert_eq!(steps.len(), 2, "two attempts: {steps:?}");
    assert!(steps.iter().all(|step| step["status"] == "failed"));
    // A resume sends them again: a failed attempt is not a finished step.
    let rerun = env.durun(&[
        "run",
        "--task",
        "u",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    assert!(rerun.status.success());
    assert_eq!(server.counts()["/v1/chat/completions status 500"], 4);
}

#[test]
fn an_upstream_that_cannot_be_reached_gets_the_agent_a_502_naming_the_route() {
    let mut env = TestEnv::new();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    env.set("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"));
    let agent = env.write(
        "agent.py",
        r#"
import json, os, urllib.request, urllib.error
open("secret", "w").write(os.environ["DURUN_PROXY"].rsplit("/", 1)[1])
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                 data=b'{"model": "m"}', method="POST")
try:
    urllib.request.urlopen(request)
except urllib.error.HTTPError as err:
    print(err.code, json.loads(err.read())["error"]["message"])
"#,
    );
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let printed = text(&run.stdout);
    assert!(
        printed.starts_with("502 durun could not reach the upstream of route `openai`"),
        "{printed}"
    );
    let secret = std::fs::read_to_string(env.path("secret")).expect("the secret segment");
    assert!(
        !printed.contains(&secret),
        "the 502 never names the secret: {printed}"
    );
    assert!(
        !text(&run.stderr).contains(&secret),
        "{}",
        text(&run.stderr)
    );
    assert_eq!(env.inspect("t")["steps"], serde_json::json!([]));
}

#[test]
fn the_budget_is_enforced_at_the_proxy() {
    if !llm_clients() {
        return;
    }
    let (env, server) = llm_env();
    let agent = zero_code_agent();
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--max-tokens",
        "100",
        "--",
        "python3",
        &agent,
    ]);
    assert_eq!(run.status.code(), Some(78), "{}", text(&run.stderr));
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains("budget_exceeded") || stderr.contains("token budget"),
        "{stderr}"
    );
    assert_eq!(
        server.counts().as_object().map(serde_json::Map::len),
        Some(1),
        "only the first call went upstream"
    );
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "over_budget");
    assert_eq!(task["task"]["tokens_spent"], 120);
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
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
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
fn two_hundred_concurrent_requests_are_two_hundred_steps_replayed_on_resume() {
    if !llm_clients() {
        return;
    }
    let (env, server) = llm_env();
    let agent = env.write(
        "agent.py",
        r#"
import asyncio, openai, os, sys
async def main():
    client = openai.AsyncOpenAI(api_key="k", max_retries=0, timeout=120)
    replies = await asyncio.gather(*[
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q{i}"}])
        for i in range(200)])
    print(sum(reply.choices[0].message.content == f"echo: q{i}" for i, reply in enumerate(replies)))
    if os.environ["DURUN_RUN"] == "1":
        sys.exit(3)
asyncio.run(main())
"#,
    );
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "200\n");
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(text(&resumed.stdout), "200\n");
    let counts = server.counts();
    assert_eq!(counts.as_object().map(serde_json::Map::len), Some(200));
    assert!(counts.as_object().unwrap().values().all(|count| count == 1));
    let task = env.inspect("t");
    assert_eq!(task["task"]["runs"][1]["replayed_steps"], 200);
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

/// The proxy's thread and the `durun step` socket's start with their
/// first client: a run that never calls a model nor runs `durun step`
/// pays for neither, and the first call is served all the same (the
/// proxy's own 404 for a route it does not have, here). The committer
/// thread starts only for an agent that does not wait for its commits:
/// `durun step` waits.
#[test]
fn the_proxy_and_the_socket_start_their_threads_at_their_first_client() {
    let env = TestEnv::new();
    let agent = env.write(
        "agent.py",
        r#"
import glob, os, subprocess, urllib.error, urllib.request
def threads():
    names = set()
    for path in glob.glob(f"/proc/{os.environ['DURUN_PID']}/task/*/comm"):
        try:
            names.add(open(path).read().strip())
        except FileNotFoundError:
            pass  # a thread that ended between the listing and the read
    return sorted(names & {"durun-proxy", "durun-socket", "durun-committer"})
before = threads()
try:
    urllib.request.urlopen(os.environ["DURUN_PROXY"] + "/nowhere/v1/models", timeout=30)
    status = 200
except urllib.error.HTTPError as err:
    status = err.code
stepped = subprocess.run(["durun", "step", "s", "--", "true"]).returncode
print("before", before, "proxy", status, "step", stepped, "after", threads())
"#,
    );
    let out = env.durun(&["run", "--", "python3", &agent.to_string_lossy()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "before [] proxy 404 step 0 after ['durun-proxy', 'durun-socket']\n",
        "{}",
        text(&out.stderr)
    );
}

/// A certificate authority and a certificate for 127.0.0.1 it signed, made
/// with openssl in `env`'s directory: (CA, certificate, key).
fn test_ca(env: &TestEnv) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let (ca, ca_key) = (env.path("ca.pem"), env.path("ca.key"));
    let (cert, key, csr) = (
        env.path("cert.pem"),
        env.path("cert.key"),
        env.path("cert.csr"),
    );
    let ext = env.write(
        "ext.cnf",
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    );
    let openssl = |args: &[&str]| {
        let output = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            text(&output.stderr)
        );
    };
    let s = |path: &std::path::Path| path.to_string_lossy().into_owned();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=durun test CA",
        "-keyout",
        &s(&ca_key),
        "-out",
        &s(&ca),
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        &s(&key),
        "-out",
        &s(&csr),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &s(&csr),
        "-CA",
        &s(&ca),
        "-CAkey",
        &s(&ca_key),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &s(&ext),
        "-out",
        &s(&cert),
    ]);
    (ca, cert, key)
}

#[test]
fn an_https_upstream_is_trusted_through_ssl_cert_file() {
    if !llm_clients() {
        return;
    }
    let mut env = TestEnv::new();
    let (ca, cert, key) = test_ca(&env);
    let server = LlmServer::start_with(&env, &[&cert, &key]);
    let base = server.base().replace("http://", "https://");
    env.set("OPENAI_BASE_URL", format!("{base}/v1"));
    let agent = env.write(
        "agent.py",
        r#"
import openai
client = openai.OpenAI(api_key="k", max_retries=0)
print(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "tls"}]).choices[0].message.content)
"#,
    );
    let agent = agent.to_string_lossy();
    // Not trusted: the system's roots do not know the test's CA.
    let untrusted = env.durun(&["run", "--task", "u", "--", "python3", &agent]);
    assert!(!untrusted.status.success());
    assert!(
        text(&untrusted.stderr).contains("upstream_unreachable")
            || text(&untrusted.stderr).contains("502"),
        "{}",
        text(&untrusted.stderr)
    );
    assert!(
        !env.path("llm.port.count").exists(),
        "nothing reached the server"
    );
    env.set("SSL_CERT_FILE", ca.to_string_lossy());
    let run = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "echo: tls\n");
    assert_eq!(server.counts()["/v1/chat/completions tls"], 1);
}

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

#[test]
fn big_bodies_a_hung_upstream_and_a_request_after_the_run_each_have_a_clear_outcome() {
    let api = FakeApi::start();
    let mut env = TestEnv::new();
    // An upstream that takes connections and never answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_port = hung.local_addr().expect("addr").port();
    env.write(
        "durun.toml",
        &format!(
            "[proxy.routes.api]\nenv = \"MY_API\"\nupstream = \"{}\"\n\n[proxy.routes.hung]\nenv = \"HUNG_API\"\nupstream = \"http://127.0.0.1:{hung_port}\"\n",
            api.url.trim_end_matches('/')
        ),
    );
    env.set("PROXY_FILE", env.path("proxy-url").to_string_lossy());
    let agent = env.write(
        "agent.py",
        r#"
import os, socket, urllib.request, urllib.error
open(os.environ["PROXY_FILE"], "w").write(os.environ["MY_API"])
def post(url, body, timeout=60):
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code
    except (socket.timeout, urllib.error.URLError) as err:
        return "timeout"
base = os.environ["MY_API"]
print("50 MB, not JSON:", post(base + "/upload", b"\xff" * (50 << 20)))
print("over 64 MiB:", post(base + "/upload", b"\xff" * (96 << 20)))
print("hung upstream:", post(os.environ["HUNG_API"] + "/x", b"{}", timeout=1))
"#,
    );
    let started = std::time::Instant::now();
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        text(&run.stdout),
        "50 MB, not JSON: 200\nover 64 MiB: 413\nhung upstream: timeout\n"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a hung upstream does not hold the run's end"
    );
    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    assert_eq!(
        steps.len(),
        2,
        "the upload, and the hung call's intent: {steps:?}"
    );
    assert_eq!(steps[0]["args"]["body"]["bytes"], 50 << 20);
    assert_eq!(
        steps[0]["args"]["body"]["sha256"].as_str().map(str::len),
        Some(64)
    );
    assert_eq!(steps[0]["status"], "committed");
    assert_eq!(steps[1]["name"], "hung POST /x");
    assert_eq!(
        steps[1]["status"], "pending",
        "in doubt: it may have reached the API"
    );
    assert_eq!(api.resources(), 1);

    // After the run, its proxy is gone.
    let url = std::fs::read_to_string(env.path("proxy-url")).expect("the proxy's URL");
    let port = url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .expect("port")
        .parse::<u16>()
        .expect("a port");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    drop(hung);
}

#[test]
fn an_agent_that_hangs_up_mid_stream_still_gets_the_call_from_the_journal() {
    if !llm_clients() {
        return;
    }
    let (mut env, server) = llm_env();
    env.set("RELEASE", env.path("llm.port.release").to_string_lossy());
    let agent = env.write(
        "agent.py",
        r#"
import json, os, socket, urllib.parse
import openai
base = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "slow stream"}]})
raw = socket.create_connection((base.hostname, base.port))
raw.sendall((f"POST {base.path}/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
             f"content-length: {len(body)}\r\n\r\n{body}").encode())
seen = b""
while b"data:" not in seen:
    seen += raw.recv(65536)
raw.shutdown(socket.SHUT_RDWR)   # hangs up mid-stream
raw.close()
import time
time.sleep(0.3)
open(os.environ["RELEASE"], "w").close()
time.sleep(0.5)                  # the stream goes on to its end without the agent
# The stream went on to its end without the agent, and was recorded: the
# agent's retry is answered from the journal.
client = openai.OpenAI(api_key="k", max_retries=0)
stream = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "slow stream"}], stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
"#,
    );
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        &agent.to_string_lossy(),
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let counts = server.counts();
    let task = env.inspect("t");
    let steps = task["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0]["status"], "committed");
    assert_eq!(text(&run.stdout), "first second\n");
    assert_eq!(
        counts["/v1/chat/completions slow stream"], 1,
        "the retry came from the journal"
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
    let shown = env.durun(&["inspect", "t"]);
    let shown = text(&shown.stdout);
    assert!(shown.contains("not replayed in run 2"), "{shown}");
    assert!(
        shown.contains(r#"args.body.messages[0].content: "run 1" -> "run 2""#),
        "{shown}"
    );
    assert!(
        shown.contains(r#"args.body.user: "session-1" -> "session-2""#),
        "{shown}"
    );
    assert_eq!(
        env.inspect("t")["task"]["runs"][1]["not_replayed"],
        serde_json::json!([1, 2])
    );

    // `[proxy] ignore` takes the changing member out of matching.
    env.write("durun.toml", "[proxy]\nignore = [\"/user\"]\n");
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

#[test]
fn the_agent_gets_the_open_file_limit_durun_started_with() {
    let env = TestEnv::new();
    let agent = env.write(
        "agent.py",
        "import resource\nprint(*resource.getrlimit(resource.RLIMIT_NOFILE))\n",
    );
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) },
        0
    );
    if limit.rlim_max < 600 {
        crate::env::skipped("the hard open-file limit is too low to lower the soft one");
        return;
    }
    let hard = if limit.rlim_max == libc::RLIM_INFINITY {
        "-1".to_owned()
    } else {
        limit.rlim_max.to_string()
    };
    // durun starts with a soft limit below its hard one and raises its
    // own for the proxy's connections; the agent gets 512 back.
    let durun = assert_cmd::cargo::cargo_bin("durun");
    let output = std::process::Command::new("bash")
        .args([
            "-c",
            "ulimit -S -n 512 && exec \"$DURUN\" run -- python3 \"$AGENT\"",
        ])
        .env("DURUN", &durun)
        .env("AGENT", &agent)
        .env("DURUN_JOURNAL", env.path("journal.db"))
        .current_dir(env.path(""))
        .output()
        .expect("durun");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), format!("512 {hard}"));
}

#[test]
fn upstream_requests_go_through_http_proxy_unless_no_proxy_says_otherwise() {
    if !llm_clients() {
        return;
    }
    let mut env = TestEnv::new();
    // The fake LLM plays the company's forward proxy: it answers requests
    // for any URL, and counts them by the absolute URL they name.
    let forward = LlmServer::start(&env);
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    env.set("OPENAI_BASE_URL", format!("http://127.0.0.1:{dead}/v1"));
    env.set("HTTP_PROXY", forward.base());
    let agent = env.write(
        "agent.py",
        r#"
import openai
client = openai.OpenAI(api_key="k", max_retries=0)
try:
    print(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "via"}]).choices[0].message.content)
except openai.APIStatusError as err:
    print("status", err.status_code)
"#,
    );
    let agent = agent.to_string_lossy();
    let through = env.durun(&["run", "--", "python3", &agent]);
    assert!(through.status.success(), "{}", text(&through.stderr));
    assert_eq!(text(&through.stdout), "echo: via\n");
    let url = format!("http://127.0.0.1:{dead}/v1/chat/completions via");
    assert_eq!(forward.counts()[url.as_str()], 1, "{}", forward.counts());
    env.set("NO_PROXY", "127.0.0.1");
    let direct = env.durun(&["run", "--", "python3", &agent]);
    assert_eq!(
        text(&direct.stdout),
        "status 502\n",
        "straight to the dead upstream"
    );
    assert_eq!(forward.counts()[url.as_str()], 1);
}
