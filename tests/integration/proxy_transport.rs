//! The model/API proxy's transport: HTTPS upstreams trusted through
//! `SSL_CERT_FILE`, `HTTP_PROXY` and `NO_PROXY`, 200 concurrent requests,
//! threads started at the first client, and the open-file limit the agent
//! gets back.

use crate::env::{TestEnv, text};
use crate::proxy::llm_env;
use crate::servers::{LlmServer, llm_clients};

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
    let run = env.run_python("t", &agent);
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
