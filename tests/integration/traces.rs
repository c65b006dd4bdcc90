//! OpenTelemetry traces (SPEC 15): a span per run and per step, sent as
//! OTLP/HTTP and decoded by the OpenTelemetry protocol's own classes.

use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, agents_dir, read_json_lines, text, wait_for};

/// Whether `opentelemetry-proto` is installed: `.ci/run` installs it and
/// sets `DURUN_TEST_OTEL=1`, which makes its absence a failure.
fn otlp_proto() -> bool {
    crate::env::python_has(
        "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        "DURUN_TEST_OTEL",
        "opentelemetry-proto",
    )
}

struct Receiver {
    child: std::process::Child,
    port: u16,
}

impl Receiver {
    fn start(env: &TestEnv) -> Self {
        let port_file = env.path("otlp.port");
        let child = std::process::Command::new("python3")
            .arg(agents_dir().join("otlp_receiver.py"))
            .arg(&port_file)
            .arg(env.path("spans.jsonl"))
            .spawn()
            .expect("the OTLP receiver");
        wait_for("the OTLP receiver", Duration::from_secs(20), || {
            port_file.exists()
        });
        let port = std::fs::read_to_string(&port_file)
            .expect("port")
            .parse()
            .expect("a port");
        Self { child, port }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

#[test]
fn a_run_and_its_steps_are_spans_in_the_callers_trace() {
    if !otlp_proto() {
        return;
    }
    let mut env = TestEnv::new();
    let receiver = Receiver::start(&env);
    env.set(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", receiver.port),
    );
    env.set("TRACEPARENT", format!("00-{TRACE}-{PARENT}-01"));
    env.set("PYTHONPATH", crate::env::sdk_path());
    // Two steps, the agent's TRACEPARENT kept, and a failure on the
    // first run: the resume replays both.
    let agent = env.write(
        "agent.py",
        "import os, durun\nopen('traceparent-' + os.environ['DURUN_RUN'], 'w').write(os.environ.get('TRACEPARENT', ''))\ndurun.step('plan', {}, lambda: 'p')\ndurun.step('act', {}, lambda: 'a', 'mutate')\nif os.environ['DURUN_RUN'] == '1':\n    raise SystemExit(3)\n",
    );
    let run = env.run_python("t", &agent);
    assert_eq!(run.status.code(), Some(3), "{}", text(&run.stderr));
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));

    let spans = read_json_lines(&env.path("spans.jsonl"));
    assert!(
        spans.iter().all(|span| span.get("error").is_none()),
        "{spans:?}"
    );
    assert_eq!(spans.len(), 6, "two runs, two steps each: {spans:#?}");
    let runs: Vec<&Value> = spans
        .iter()
        .filter(|span| span["name"] == "durun run t")
        .collect();
    assert_eq!(runs.len(), 2);
    for (index, run) in runs.iter().enumerate() {
        assert_eq!(run["trace_id"], TRACE);
        assert_eq!(
            run["parent_span_id"], PARENT,
            "a child of the caller's span"
        );
        assert_eq!(run["service"], "durun");
        assert_eq!(run["attributes"]["durun.task"], "t");
        assert_eq!(run["attributes"]["durun.run"], index + 1);
        let traceparent = std::fs::read_to_string(env.path(&format!("traceparent-{}", index + 1)))
            .expect("the agent's TRACEPARENT");
        assert_eq!(
            traceparent,
            format!("00-{TRACE}-{}-01", run["span_id"].as_str().expect("id")),
            "the agent is inside its run's span"
        );
        let steps: Vec<&Value> = spans
            .iter()
            .filter(|span| span["parent_span_id"] == run["span_id"])
            .collect();
        let names: Vec<&str> = steps
            .iter()
            .map(|span| {
                span["attributes"]["durun.step.name"]
                    .as_str()
                    .expect("name")
            })
            .collect();
        assert_eq!(names, ["plan", "act"], "{steps:#?}");
        for step in steps {
            assert_eq!(step["trace_id"], TRACE);
            assert_eq!(
                step["attributes"]["durun.replayed"],
                index == 1,
                "the second run replays: {step}"
            );
            assert!(step["end"].as_u64() >= step["start"].as_u64());
        }
    }
    // The failed run's span says so.
    assert_eq!(runs[0]["status"], 2);
    assert_eq!(runs[1]["status"], 0);
}

#[test]
fn a_collector_that_is_away_costs_the_run_nothing_but_a_line() {
    let env = TestEnv::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    // From durun.toml this time.
    env.write(
        "durun.toml",
        &format!("[otel]\nendpoint = \"http://127.0.0.1:{port}\"\n"),
    );
    let run = env.durun(&[
        "run",
        "--task",
        "t",
        "--",
        "python3",
        "-c",
        "import os; print(len(os.environ['TRACEPARENT']))",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        text(&run.stdout).trim(),
        "55",
        "the agent has its TRACEPARENT"
    );
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains(&format!(
            "durun: 1 span not sent to http://127.0.0.1:{port}/v1/traces"
        )),
        "{stderr}"
    );
    // A collector that takes the connection and never answers: the spans
    // still on their way when the run ends are said too (SPEC 17).
    let hole = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    env.write(
        "durun.toml",
        &format!(
            "[otel]\nendpoint = \"http://{}\"\n",
            hole.local_addr().expect("addr")
        ),
    );
    let run = env.durun(&["run", "--task", "hole", "--", "true"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let stderr = text(&run.stderr);
    assert!(stderr.contains("1 span not sent to"), "{stderr}");
    drop(hole);
}

#[test]
fn a_model_call_through_the_proxy_has_the_gen_ai_attributes() {
    if !otlp_proto() {
        return;
    }
    let mut env = TestEnv::new();
    let receiver = Receiver::start(&env);
    let server = crate::servers::LlmServer::start(&env);
    env.set("OPENAI_BASE_URL", format!("{}/v1", server.base()));
    env.set(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        format!("http://127.0.0.1:{}/v1/traces", receiver.port),
    );
    let agent = env.write(
        "agent.py",
        r#"
import json, os, urllib.request
body = json.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
print(json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"])
"#,
    );
    let run = env.run_python("m", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let spans = read_json_lines(&env.path("spans.jsonl"));
    let call = spans
        .iter()
        .find(|span| span["attributes"]["durun.step.name"] == "openai POST /chat/completions")
        .unwrap_or_else(|| panic!("the model call's span: {spans:#?}"));
    assert_eq!(call["attributes"]["gen_ai.request.model"], "gpt-test");
    let step = &env.inspect("m")["steps"][0];
    assert_eq!(
        call["attributes"]["gen_ai.usage.input_tokens"], step["usage"]["prompt_tokens"],
        "{call}"
    );
    assert_eq!(
        call["attributes"]["gen_ai.usage.output_tokens"],
        step["usage"]["completion_tokens"]
    );
    assert_eq!(call["attributes"]["durun.effect"], "read");
}

#[test]
fn tools_and_proxied_requests_carry_their_steps_traceparent() {
    if !otlp_proto() {
        return;
    }
    let mut env = TestEnv::new();
    let receiver = Receiver::start(&env);
    // One upstream for the HTTP tool and the proxied model call: it keeps
    // each request's traceparent header.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let keep = std::sync::Arc::clone(&seen);
    let upstream = crate::servers::serve(move |url, headers, _| {
        let traceparent = headers.get("traceparent").cloned().unwrap_or_default();
        keep.lock()
            .expect("lock")
            .push((url.to_owned(), traceparent));
        serde_json::json!({"id": "c1", "object": "chat.completion", "model": "gpt-test",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    });
    env.set("OPENAI_BASE_URL", format!("{upstream}v1"));
    env.set(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        format!("http://127.0.0.1:{}", receiver.port),
    );
    env.set("TRACEPARENT", format!("00-{TRACE}-{PARENT}-01"));
    env.write(
        "durun.toml",
        &format!(
            "[tools.fetch]\neffect = \"read\"\nhttp = {{ method = \"POST\", url = \"{upstream}tool\" }}\n\n\
             [tools.note]\neffect = \"mutate\"\ncommand = [\"sh\", \"-c\", \"printf %s \\\"$TRACEPARENT\\\" > note-traceparent; echo '{{}}'\"]\noutput = \"json\"\n"
        ),
    );
    let agent = env.write(
        "agent.py",
        r#"
import json, os, sys, urllib.request
def ask(message):
    sys.stdout.write(json.dumps(message) + "\n"); sys.stdout.flush()
    answer = json.loads(sys.stdin.readline())
    assert answer["ok"], answer
ask({"op": "call", "id": 1, "tool": "fetch", "args": {}})
ask({"op": "call", "id": 2, "tool": "note", "args": {}})
body = json.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
urllib.request.urlopen(request).read()
"#,
    );
    let run = env.run_python("tp", &agent);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let spans = read_json_lines(&env.path("spans.jsonl"));
    let span_of = |step: u64| {
        spans
            .iter()
            .find(|span| span["attributes"]["durun.step"] == step)
            .unwrap_or_else(|| panic!("step {step}'s span: {spans:#?}"))
    };
    let run_span = spans
        .iter()
        .find(|span| span["name"] == "durun run tp")
        .expect("the run's span");
    let seen = seen.lock().expect("lock").clone();
    let header = |path: &str| {
        seen.iter()
            .find(|(url, _)| url.starts_with(path))
            .map_or_else(
                || panic!("a request to {path}: {seen:?}"),
                |(_, traceparent)| traceparent.clone(),
            )
    };
    let of = |span: &Value| format!("00-{TRACE}-{}-01", span["span_id"].as_str().expect("an id"));
    assert_eq!(
        header("/tool"),
        of(span_of(1)),
        "the HTTP tool is inside its step's span"
    );
    assert_eq!(
        std::fs::read_to_string(env.path("note-traceparent"))
            .expect("the command tool's TRACEPARENT"),
        of(span_of(2)),
        "the command tool is inside its step's span"
    );
    // A proxied read request is numbered when its answer is written: it
    // is inside the run's span.
    assert_eq!(header("/v1/chat/completions"), of(run_span));
    assert_eq!(span_of(3)["parent_span_id"], run_span["span_id"]);
}
