//! Fake services on loopback: an LLM that answers random text with a token
//! `usage`, and an API that creates resources and honours `Idempotency-Key`.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, wait_for};

pub(crate) fn serve(
    handler: impl Fn(&str, &HashMap<String, String>, Value) -> Value + Send + Sync + 'static,
) -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind loopback");
    let url = format!(
        "http://{}/",
        server.server_addr().to_ip().expect("an IP address")
    );
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let handler = Arc::clone(&handler);
            std::thread::spawn(move || {
                let mut body = String::new();
                let _ = request.as_reader().read_to_string(&mut body);
                let headers = request
                    .headers()
                    .iter()
                    .map(|h| {
                        (
                            h.field.as_str().as_str().to_ascii_lowercase(),
                            h.value.as_str().to_owned(),
                        )
                    })
                    .collect();
                let body = serde_json::from_str(&body).unwrap_or(Value::Null);
                let mut answer = handler(request.url(), &headers, body);
                // An answer's `__status` is its HTTP status (200 without).
                let status = answer
                    .as_object_mut()
                    .and_then(|fields| fields.remove("__status"))
                    .and_then(|status| status.as_u64())
                    .map_or(200, |status| status as u16);
                let header = tiny_http::Header::from_bytes("Content-Type", "application/json")
                    .expect("header");
                // The client may be dead (a killed tool): ignore write errors.
                let _ = request.respond(
                    tiny_http::Response::from_string(answer.to_string())
                        .with_status_code(status)
                        .with_header(header),
                );
            });
        }
    });
    url
}

#[derive(Default)]
struct LlmState {
    answers: Vec<String>,
    seed: u64,
}

pub(crate) struct FakeLlm {
    pub url: String,
    state: Arc<Mutex<LlmState>>,
}

impl FakeLlm {
    pub(crate) fn start() -> Self {
        let state = Arc::new(Mutex::new(LlmState {
            answers: Vec::new(),
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
                | 1,
        }));
        let shared = Arc::clone(&state);
        let url = serve(move |_, _, _| {
            let mut state = shared.lock().expect("llm state");
            let mut words = Vec::new();
            for _ in 0..6 {
                // xorshift: a different answer every call, as a real model gives.
                state.seed ^= state.seed << 13;
                state.seed ^= state.seed >> 7;
                state.seed ^= state.seed << 17;
                words.push(
                    [
                        "plan", "patch", "search", "token", "model", "branch", "review", "merge",
                    ][(state.seed % 8) as usize],
                );
            }
            let text = format!("{} #{}", words.join(" "), state.seed % 100_000);
            state.answers.push(text.clone());
            json!({"text": text, "usage": {"input_tokens": 800, "output_tokens": 200}})
        });
        Self { url, state }
    }

    pub(crate) fn calls(&self) -> usize {
        self.state.lock().expect("llm state").answers.len()
    }

    pub(crate) fn answers(&self) -> Vec<String> {
        self.state.lock().expect("llm state").answers.clone()
    }
}

/// One request as the API saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// `Durun-Run`: the run of the agent or tool that sent it.
    pub run: Option<u32>,
    pub at: std::time::SystemTime,
}

#[derive(Default)]
struct ApiState {
    /// Every request's key, in arrival order.
    keys: Vec<String>,
    seen: Vec<Seen>,
    /// The first answer given for each key, replayed for the key's retries
    /// as an idempotent API does.
    created: HashMap<String, Value>,
    resources: usize,
    hold_next_create: bool,
    /// Hold the next create before it creates anything, and drop it.
    hold_next_uncreated: bool,
    held: bool,
    released: bool,
    /// The probes asked (`GET /resources/KEY`), in order.
    probes: Vec<String>,
    /// Their `authorization` headers.
    probe_auth: Vec<Option<String>>,
}

/// Says a request is held, then holds it until the test releases it.
fn held_until_released<'a>(
    mut state: std::sync::MutexGuard<'a, ApiState>,
    changed: &Condvar,
) -> std::sync::MutexGuard<'a, ApiState> {
    state.held = true;
    changed.notify_all();
    while !state.released {
        state = changed.wait(state).expect("api state");
    }
    state
}

pub(crate) struct FakeApi {
    pub url: String,
    state: Arc<(Mutex<ApiState>, Condvar)>,
}

impl FakeApi {
    pub(crate) fn start() -> Self {
        let state = Arc::new((Mutex::new(ApiState::default()), Condvar::new()));
        let shared = Arc::clone(&state);
        let url = serve(move |path, headers, body| {
            let (lock, changed) = &*shared;
            let mut state = lock.lock().expect("api state");
            // A probe: whether the resource of a key exists, and its
            // answer (SPEC 22).
            if let Some(key) = path.strip_prefix("/resources/") {
                state.probes.push(key.to_owned());
                state.probe_auth.push(headers.get("authorization").cloned());
                return state
                    .created
                    .get(key)
                    .cloned()
                    .unwrap_or_else(|| json!({"__status": 404, "error": "no such key"}));
            }
            let key = headers.get("idempotency-key").cloned().unwrap_or_default();
            let read = headers.contains_key("durun-read");
            // A read (`Durun-Read`) is answered and creates nothing.
            state.seen.push(Seen {
                run: headers.get("durun-run").and_then(|run| run.parse().ok()),
                at: std::time::SystemTime::now(),
            });
            if read {
                return json!({"read": body});
            }
            state.keys.push(key.clone());
            if state.hold_next_uncreated {
                // Held before anything is made, then dropped: the caller
                // was killed meanwhile, and nothing took effect.
                state.hold_next_uncreated = false;
                drop(held_until_released(state, changed));
                return json!({"__status": 503, "error": "dropped"});
            }
            if let Some(first) = state.created.get(&key) {
                let mut again = first.clone();
                again["created"] = json!(false);
                return again;
            }
            state.resources += 1;
            let id = format!("res-{}", state.resources);
            let answer = json!({"id": id, "created": true, "title": body.get("title")});
            if !key.is_empty() {
                state.created.insert(key, answer.clone());
            }
            if state.hold_next_create {
                // The resource exists now; the answer is held back until
                // the test has killed whoever waits for it.
                state.hold_next_create = false;
                drop(held_until_released(state, changed));
            }
            answer
        });
        Self { url, state }
    }

    /// Starts `durun run --task TASK -- AGENT…` and returns once the
    /// agent's next resource-creating request is held here: the step is in
    /// flight, its effect done, its answer not yet given.
    pub(crate) fn spawn_until_held(
        &self,
        env: &crate::env::TestEnv,
        task: &str,
        agent: &[impl AsRef<str>],
    ) -> std::process::Child {
        self.hold_next_create();
        let mut args = vec!["run", "--task", task, "--"];
        args.extend(agent.iter().map(AsRef::as_ref));
        let durun = env.spawn(&args, "run1");
        self.wait_held();
        durun
    }

    /// Holds the next request that would create a resource before it
    /// creates it; once released, it is dropped with nothing made.
    pub(crate) fn hold_next_uncreated(&self) {
        self.state.0.lock().expect("api state").hold_next_uncreated = true;
    }

    /// The keys probes asked about, in order.
    pub(crate) fn probes(&self) -> Vec<String> {
        self.state.0.lock().expect("api state").probes.clone()
    }

    /// The `authorization` header each probe came with.
    pub(crate) fn probe_auth(&self) -> Vec<Option<String>> {
        self.state.0.lock().expect("api state").probe_auth.clone()
    }

    /// Holds back the answer to the next request that creates a resource.
    pub(crate) fn hold_next_create(&self) {
        self.state.0.lock().expect("api state").hold_next_create = true;
    }

    /// Waits until a held request has arrived (and created its resource).
    pub(crate) fn wait_held(&self) {
        let (lock, changed) = &*self.state;
        let state = lock.lock().expect("api state");
        let (state, timeout) = changed
            .wait_timeout_while(state, Duration::from_secs(60), |state| !state.held)
            .expect("api state");
        assert!(
            !timeout.timed_out() && state.held,
            "no request reached the API"
        );
    }

    pub(crate) fn release(&self) {
        let (lock, changed) = &*self.state;
        lock.lock().expect("api state").released = true;
        changed.notify_all();
    }

    pub(crate) fn resources(&self) -> usize {
        self.state.0.lock().expect("api state").resources
    }

    pub(crate) fn keys(&self) -> Vec<String> {
        self.state.0.lock().expect("api state").keys.clone()
    }

    /// Every request, reads included, in arrival order.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.0.lock().expect("api state").seen.clone()
    }
}

/// Whether the real client packages are installed: `.ci/run` installs
/// them and sets `DURUN_TEST_LLM_CLIENTS=1`, which makes their absence a
/// failure.
pub(crate) fn llm_clients() -> bool {
    crate::env::python_has(
        "openai, anthropic",
        "DURUN_TEST_LLM_CLIENTS",
        "openai anthropic",
    )
}

/// The fake OpenAI and Anthropic server, and its request counts.
pub(crate) struct LlmServer {
    child: std::process::Child,
    port_file: std::path::PathBuf,
}

impl LlmServer {
    pub(crate) fn start(env: &TestEnv) -> Self {
        Self::start_with(env, &[])
    }

    /// The server, with more arguments (a certificate and key: HTTPS).
    pub(crate) fn start_with(env: &TestEnv, args: &[&std::path::Path]) -> Self {
        let port_file = env.path("llm.port");
        let child = std::process::Command::new("python3")
            .arg(agents_dir().join("llm_server.py"))
            .arg(&port_file)
            .args(args)
            .spawn()
            .expect("the fake LLM server");
        wait_for("the fake LLM server", Duration::from_secs(20), || {
            port_file.exists()
        });
        Self { child, port_file }
    }

    pub(crate) fn base(&self) -> String {
        let port = std::fs::read_to_string(&self.port_file).expect("port");
        format!("http://127.0.0.1:{port}")
    }

    pub(crate) fn counts(&self) -> Value {
        let path = self.port_file.with_extension("port.count");
        serde_json::from_str(&std::fs::read_to_string(path).expect("counts")).expect("JSON")
    }
}

impl Drop for LlmServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
