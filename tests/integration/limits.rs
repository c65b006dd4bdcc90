//! Limits shared through the journal (SPEC 19): `[limits.NAME]` paces the
//! requests of every run and worker on the journal, each on its own
//! connection; an upstream's 429 with `Retry-After` pauses the limit and
//! the request goes again, unseen by the agent.

use std::time::Duration;

use crate::env::{text, wait_exit, wait_for};
use crate::proxy::llm_env;
use crate::servers::llm_clients;
use crate::workers::{status, stop, worker};

/// When each request reached the fake upstream, in seconds, in order.
fn arrivals(env: &crate::env::TestEnv) -> Vec<f64> {
    let mut times: Vec<f64> = std::fs::read_to_string(env.path("llm.port.times"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').next()?.parse().ok())
        .collect();
    times.sort_by(f64::total_cmp);
    times
}

#[test]
fn a_limit_holds_across_two_runs_and_a_worker() {
    if !llm_clients() {
        return;
    }
    let (mut env, _server) = llm_env();
    env.set("MODEL", "m");
    env.set("PARALLEL", "3");
    // 120 a minute: one request every half second, whoever sends it.
    env.write(
        "durun.toml",
        "[limits.upstream]\nmatch = \"openai\"\nrpm = 120\n",
    );
    let agent = crate::budgets::parallel_calls();
    let submitted = env.durun(&[
        "-q", "submit", "--task", "w", "--queue", "q", "--", "python3", &agent,
    ]);
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    let mut pool = worker(&env, "w1", &["--queue", "q"]);
    two_runs_at_once(&env, &agent);
    wait_for("the worker's task", Duration::from_secs(60), || {
        status(&env, "w") == "completed"
    });
    assert!(stop(&mut pool).success());
    let times = arrivals(&env);
    assert_eq!(times.len(), 9, "{times:?}");
    // Paced 0.5 s apart by durun; the network's jitter is far less.
    assert_apart(&times, 0.4, "paced too close");
}

#[test]
fn a_429_with_retry_after_pauses_the_limit_and_the_agent_never_sees_it() {
    if !llm_clients() {
        return;
    }
    let (env, _server) = llm_env();
    env.write(
        "durun.toml",
        "[limits.upstream]\nmatch = \"openai:m*\"\nconcurrency = 4\n",
    );
    let agent = env.write(
        "agent.py",
        r#"
import openai
client = openai.OpenAI(api_key="k", max_retries=0)
answer = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "rate limited once"}])
print(answer.choices[0].message.content)
"#,
    );
    let agent = agent.to_string_lossy();
    let run = env.durun(&["run", "--task", "t", "--", "python3", &agent]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout).trim(), "echo: rate limited once");
    let times = arrivals(&env);
    assert_eq!(times.len(), 2, "sent again after the pause: {times:?}");
    assert!(times[1] - times[0] >= 0.95, "{times:?}");
    let steps = env.inspect("t")["steps"].clone();
    assert_eq!(steps.as_array().map(Vec::len), Some(1), "{steps}");
    assert_eq!(steps[0]["status"], "committed");
}

#[test]
fn a_concurrency_limit_lets_one_call_in_flight_at_a_time() {
    if !llm_clients() {
        return;
    }
    let (mut env, _server) = llm_env();
    env.set("MODEL", "m");
    env.set("PARALLEL", "3");
    env.set("PROMPT", "sleep 0.3");
    env.write(
        "durun.toml",
        "[limits.one]\nmatch = \"openai:m\"\nconcurrency = 1\n",
    );
    let agent = crate::budgets::parallel_calls();
    two_runs_at_once(&env, &agent);
    // Each call takes 0.3 s upstream: one at a time, they come that far apart.
    let times = arrivals(&env);
    assert_eq!(times.len(), 6, "{times:?}");
    assert_apart(&times, 0.29, "two calls in flight at once");
}

/// Tasks `a` and `b`, each `python3 AGENT`, run side by side to their
/// ends, both successful.
fn two_runs_at_once(env: &crate::env::TestEnv, agent: &str) {
    let mut first = env.spawn(&["run", "--task", "a", "--", "python3", agent], "a");
    let mut second = env.spawn(&["run", "--task", "b", "--", "python3", agent], "b");
    for (run, log) in [(&mut first, "a"), (&mut second, "b")] {
        let status = wait_exit(run, Duration::from_secs(60));
        assert!(status.success(), "{}", env.log(log));
    }
}

/// Every two arrivals in `times` (sorted, in seconds) at least `gap` apart.
fn assert_apart(times: &[f64], gap: f64, why: &str) {
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= gap,
            "{why}: two requests {:.3} s apart: {times:?}",
            pair[1] - pair[0]
        );
    }
}
