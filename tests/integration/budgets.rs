//! Money (SPEC 9, 19): a token budget that stops a task and a raise that
//! lets it go on, at the protocol and at the proxy, and what model calls
//! cost at their models' prices.

use serde_json::{Value, json};

use crate::env::{agents_dir, text};
use crate::proxy::{llm_env, zero_code_agent};
use crate::servers::llm_clients;
use crate::waiting::{ran, run, waiter_args, waiter_env};

#[test]
fn a_token_budget_stops_the_task_and_a_raise_continues_it() {
    let env = waiter_env();
    let plan = json!([
        {"step": "a", "tokens": 100},
        {"step": "b", "tokens": 100},
        {"step": "c", "tokens": 100},
        {"step": "d", "tokens": 100},
    ]);
    let first = run(
        &env,
        &waiter_args(&env, "t", &plan, &["--max-tokens", "250"]),
    );
    assert_eq!(first.status.code(), Some(78), "{}", text(&first.stderr));
    let stderr = text(&first.stderr);
    assert!(
        stderr.contains("spent its token budget: 300 of 250"),
        "{stderr}"
    );
    assert!(stderr.contains("--max-tokens"), "{stderr}");
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "over_budget");
    assert_eq!(task["task"]["max_tokens"], 250);
    assert_eq!(ran(&env), ["a", "b", "c"]);
    // Without a raise the replayed steps are free and step 4 is refused again.
    let again = env.durun(&["resume", "t"]);
    assert_eq!(again.status.code(), Some(78));
    assert_eq!(ran(&env), ["a", "b", "c"]);
    let raised = env.durun(&["resume", "t", "--max-tokens", "1000"]);
    assert!(raised.status.success(), "{}", text(&raised.stderr));
    assert_eq!(ran(&env), ["a", "b", "c", "d"]);
    let task = env.inspect("t");
    assert_eq!(task["task"]["max_tokens"], 1000);
    assert_eq!(task["task"]["tokens_spent"], 400);
    let shown = env.durun(&["inspect", "t"]);
    assert!(
        text(&shown.stdout).contains("budget 1,000 (600 left)"),
        "{}",
        text(&shown.stdout)
    );
}

#[test]
fn approve_add_tokens_raises_the_budget_and_the_task_goes_on() {
    let env = waiter_env();
    let plan = json!([
        {"step": "a", "tokens": 100},
        {"step": "b", "tokens": 100},
        {"step": "c", "tokens": 100},
    ]);
    let first = run(
        &env,
        &waiter_args(&env, "t", &plan, &["--max-tokens", "150"]),
    );
    assert_eq!(first.status.code(), Some(78), "{}", text(&first.stderr));
    assert_eq!(env.inspect("t")["task"]["status"], "over_budget");
    let approved = env.durun(&["approve", "t", "--add-tokens", "500"]);
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    assert!(
        text(&approved.stderr).contains("task t: token budget 150 -> 650, 450 left"),
        "{}",
        text(&approved.stderr)
    );
    // No longer stopped: a resume (or a worker) goes on from the journal.
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "interrupted", "{task}");
    assert_eq!(task["task"]["max_tokens"], 650);
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(ran(&env), ["a", "b", "c"]);
    // A task with no budget has none to raise.
    let plain = run(&env, &waiter_args(&env, "u", &json!([{"step": "a"}]), &[]));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let refused = env.durun(&["approve", "u", "--add-tokens", "5"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("task u has no token budget to raise"));
}

#[test]
fn a_budget_from_durun_toml_is_recorded_with_the_task() {
    let env = waiter_env();
    env.write(
        "durun.toml",
        "[budget]\nmax_tokens = 150\n\n[wait]\npark_after = \"0s\"\n",
    );
    let plan = json!([{"step": "a", "tokens": 100}, {"step": "b", "tokens": 100}, {"wait": "x"}]);
    let first = run(&env, &waiter_args(&env, "t", &plan, &[]));
    assert_eq!(first.status.code(), Some(78), "{}", text(&first.stderr));
    let raised = env.durun(&["resume", "t", "--max-tokens", "500"]);
    assert_eq!(
        raised.status.code(),
        Some(77),
        "parks at once by [wait] park_after: {}",
        text(&raised.stderr)
    );
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
fn a_model_calls_cost_is_its_usage_at_its_price_and_replay_saves_it() {
    let (mut env, _server) = llm_env();
    env.set("PYTHONPATH", agents_dir().to_string_lossy());
    env.write(
        "durun.toml",
        "[prices.\"house-model\"]\ninput = 1.0\noutput = 2.0\n",
    );
    let agent = env.write(
        "ask.py",
        r#"import os
from chat import ask
for model in ("gpt-4o-2024-08-06", "house-model", "mystery"):
    ask("price " + model, model)
raise SystemExit(3 if os.environ["DURUN_RUN"] == "1" else 0)
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
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let inspected = env.inspect("t");
    let usd = |value: &Value| value.as_f64().unwrap_or(-1.0);
    let near = |value: &Value, want: f64| (usd(value) - want).abs() < 1e-12;
    // 100 tokens in, 20 out (the fake's usage): gpt-4o at $2.50 and $10 a
    // million, the house model at durun.toml's $1 and $2; no price for
    // the third.
    let steps = inspected["steps"].as_array().expect("steps");
    assert!(
        near(&steps[0]["cost_usd"], 0.000_45),
        "{}",
        steps[0]["cost_usd"]
    );
    assert!(
        near(&steps[1]["cost_usd"], 0.000_14),
        "{}",
        steps[1]["cost_usd"]
    );
    assert_eq!(steps[2]["cost_usd"], Value::Null);
    let task = &inspected["task"];
    assert!(near(&task["cost_usd"], 0.000_59), "{task}");
    assert_eq!(task["unpriced_steps"], 1, "{task}");
    // The resume answered all three from the journal: their cost saved.
    assert!(near(&task["cost_saved_usd"], 0.000_59), "{task}");
    assert!(near(&task["runs"][1]["cost_saved_usd"], 0.000_59), "{task}");
    assert!(near(&task["runs"][1]["cost_usd"], 0.0), "{task}");
    let shown = text(&env.durun(&["inspect", "t"]).stdout);
    assert!(
        shown.contains(
            "cost     $0.0006 spent, $0.0006 saved; 1 step at a model without a price: cost unknown"
        ),
        "{shown}"
    );
    let step = text(&env.durun(&["inspect", "t", "--step", "3"]).stdout);
    assert!(
        step.contains("cost        unknown (no price for its model"),
        "{step}"
    );
}
