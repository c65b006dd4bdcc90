//! Money (SPEC 9, 19): a token budget that stops a task and a raise that
//! lets it go on, at the protocol and at the proxy, and what model calls
//! cost at their models' prices.

use serde_json::{Value, json};

use crate::env::{agents_dir, text, wait_for};
use crate::proxy::llm_env;
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
        stderr.contains("task t has spent 300 of its 250 tokens; step 4 did not start"),
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

/// `--on-budget wait` holds a protocol step that finds the budget spent
/// (its tokens reported after the fact), and the steps behind it, until
/// `durun approve` raises the budget; the run then goes on, none lost.
#[test]
fn on_budget_wait_holds_a_step_until_an_approval_raises_the_budget() {
    let env = waiter_env();
    let plan = json!([
        {"step": "a", "tokens": 100},
        {"step": "b", "tokens": 200},
        {"step": "c", "tokens": 100},
        {"step": "d", "tokens": 100},
    ]);
    let args = waiter_args(
        &env,
        "t",
        &plan,
        &["--max-tokens", "250", "--on-budget", "wait"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut held = env.spawn(&args, "run");
    crate::env::wait_for(
        "the run to wait for a raise",
        std::time::Duration::from_secs(30),
        || {
            env.log("run").contains(
                "task t has spent 300 of its 250 tokens; its next step waits for `durun approve t --add-tokens N`",
            )
        },
    );
    assert_eq!(ran(&env), ["a", "b"]);
    assert_eq!(env.inspect("t")["task"]["status"], "running");
    let approved = env.durun(&["approve", "t", "--add-tokens", "300"]);
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    let status = crate::env::wait_exit(&mut held, std::time::Duration::from_secs(60));
    assert!(status.success(), "{}", env.log("run"));
    assert_eq!(ran(&env), ["a", "b", "c", "d"]);
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "completed");
    assert_eq!(task["task"]["tokens_spent"], 500);
    assert_eq!(task["task"]["max_tokens"], 550);
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
    // A raise of a budget the task lacks is refused, and changes nothing.
    let half = env.durun(&["approve", "t", "--add-tokens", "5", "--add-usd", "1"]);
    assert_eq!(half.status.code(), Some(2), "{}", text(&half.stderr));
    assert!(text(&half.stderr).contains("task t has no budget in dollars to raise"));
    assert_eq!(env.inspect("t")["task"]["max_tokens"], 650);
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

/// A token budget at the proxy: each call's worst case (its input and its
/// max_tokens) is reserved before it goes, so 8 calls at once under 300
/// tokens send exactly two (120 spent each): the third never fits.
#[test]
fn the_budget_is_enforced_at_the_proxy() {
    if !llm_clients() {
        return;
    }
    let (mut env, server) = llm_env();
    env.set("MODEL", "m");
    env.set("PARALLEL", "8");
    let run = run_calls(&env, "t", &["--max-tokens", "300"]);
    assert_eq!(run.status.code(), Some(78), "{}", text(&run.stderr));
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains("task t has spent 240 of its 300 tokens, and a model call that may take 145 more does not fit"),
        "{stderr}"
    );
    assert_eq!(received(&env), 2, "two calls went upstream");
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "over_budget");
    assert_eq!(task["task"]["tokens_spent"], 240);
    drop(server);
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
    let run = env.run_python("t", &agent);
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

/// The agent of many model calls at once, tests/agents/parallel_calls.py.
pub(crate) fn parallel_calls() -> String {
    agents_dir()
        .join("parallel_calls.py")
        .to_string_lossy()
        .into_owned()
}

/// `durun run --task TASK OPTIONS -- python3 parallel_calls.py`.
fn run_calls(env: &crate::env::TestEnv, task: &str, options: &[&str]) -> std::process::Output {
    let agent = parallel_calls();
    let mut args = vec!["run", "--task", task];
    args.extend(options);
    args.extend(["--", "python3", &agent]);
    env.durun(&args)
}

/// All the requests the fake upstream received.
fn received(env: &crate::env::TestEnv) -> u64 {
    std::fs::read_to_string(env.path("llm.port.count"))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|counts| {
            counts
                .as_object()
                .map(|counts| counts.values().filter_map(Value::as_u64).sum())
        })
        .unwrap_or(0)
}

/// 32 model calls at once under a budget in dollars: each is forwarded
/// only when its worst case fits beside the others', so what the task
/// spent stays within the budget; an approval and a resume then finish
/// the rest without sending a finished call again.
#[test]
fn parallel_calls_never_spend_past_the_budget_and_a_raise_finishes_them() {
    if !llm_clients() {
        return;
    }
    let (env, _server) = llm_env();
    // A call spends 100 + 20 tokens of gpt-4o-mini: $0.000027; its worst
    // case is a little more. $0.0003 holds eleven calls, not twelve.
    let run = run_calls(&env, "t", &["--max-usd", "0.0003"]);
    assert_eq!(run.status.code(), Some(78), "{}", text(&run.stderr));
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "over_budget", "{task}");
    let spent = task["task"]["cost_usd"].as_f64().expect("cost");
    assert!(spent <= 0.0003, "spent ${spent} of a $0.0003 budget");
    let sent = received(&env);
    assert!((1..=11).contains(&sent), "{sent} calls went upstream");
    assert_eq!(
        task["task"]["tokens_spent"].as_u64(),
        Some(120 * sent),
        "every call sent is paid for in the journal"
    );
    assert!(
        text(&run.stderr).contains("task t has spent $0.0003 of its $0.0003, and a model call that may cost <$0.0001 more does not fit"),
        "{}",
        text(&run.stderr)
    );
    let shown = env.durun(&["inspect", "t"]);
    assert!(
        text(&shown.stdout).contains("budget $0.0003"),
        "{}",
        text(&shown.stdout)
    );

    // The web view shows what is left, and raises the budget by its button.
    let ui = crate::ui::Ui::start(&env, &[]);
    let list = ui.get("/").body;
    assert!(list.contains("of $0.0003 left"), "{list}");
    let page = ui.get("/tasks/t").body;
    assert!(page.contains("Raise the budget"), "{page}");
    assert!(page.contains("of $0.0003 left"), "{page}");
    let csrf = ui.csrf();
    let bearer = ui.bearer();
    let raised = crate::ui::request(
        &ui.at,
        "POST",
        "/tasks/t/approve",
        &[
            ("Authorization", bearer.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("csrf={csrf}&add_usd=0.01"),
    );
    assert_eq!(raised.status, 200, "{}", raised.body);
    assert!(
        raised.body.contains("budget $0.0003 -&gt; $0.0103"),
        "{}",
        raised.body
    );
    let task = env.inspect("t");
    assert_eq!(task["task"]["max_usd"], 0.0103, "{task}");
    assert_eq!(task["task"]["status"], "interrupted", "{task}");
    drop(ui);
    let resumed = env.durun(&["resume", "t"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(text(&resumed.stdout).trim(), "32");
    assert_eq!(received(&env), 32, "no finished call was sent again");
    let task = env.inspect("t");
    assert_eq!(task["task"]["status"], "completed");
    assert_eq!(task["task"]["tokens_spent"], 32 * 120);
    assert_eq!(task["task"]["max_usd"], 0.0103);
}

/// A call whose cost durun cannot bound is refused under a budget in
/// dollars, and the message says what to add to durun.toml.
#[test]
fn a_budget_in_dollars_refuses_a_model_without_a_price() {
    if !llm_clients() {
        return;
    }
    let (mut env, _server) = llm_env();
    env.set("MODEL", "house-model");
    env.set("PARALLEL", "1");
    let run = run_calls(&env, "t", &["--max-usd", "1"]);
    assert_eq!(run.status.code(), Some(78), "{}", text(&run.stderr));
    assert!(
        text(&run.stderr).contains("[prices.\"house-model\"]"),
        "{}",
        text(&run.stderr)
    );
    assert_eq!(received(&env), 0);
    // With a price in durun.toml (recorded with a new task), it goes.
    env.write(
        "durun.toml",
        "[prices.\"house-model\"]\ninput = 1.0\noutput = 2.0\n",
    );
    let priced = run_calls(&env, "u", &["--max-usd", "1"]);
    assert!(priced.status.success(), "{}", text(&priced.stderr));
    assert_eq!(received(&env), 1);
}

/// `--on-budget wait`: a model call that does not fit waits in the live
/// run until `durun approve --add-usd` raises the budget; the run then
/// goes on and ends well, each call sent once.
#[test]
fn on_budget_wait_holds_the_call_until_an_approval_raises_the_budget() {
    if !llm_clients() {
        return;
    }
    let (mut env, _server) = llm_env();
    env.set("PARALLEL", "4");
    let agent = parallel_calls();
    // One call fits $0.00005 ($0.000027 spent, $0.000031 at worst); a
    // second never does.
    let mut run = env.spawn(
        &[
            "run",
            "--task",
            "t",
            "--max-usd",
            "0.00005",
            "--on-budget",
            "wait",
            "--",
            "python3",
            &agent,
        ],
        "run",
    );
    crate::env::wait_for(
        "the run to wait for a raise",
        std::time::Duration::from_secs(30),
        || {
            env.log("run")
                .contains("waits for `durun approve t --add-usd X`")
        },
    );
    assert_eq!(received(&env), 1, "{}", env.log("run"));
    let approved = env.durun(&["approve", "t", "--add-usd", "0.01"]);
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    let status = crate::env::wait_exit(&mut run, std::time::Duration::from_secs(60));
    assert!(status.success(), "{}", env.log("run"));
    assert_eq!(
        std::fs::read_to_string(env.path("run.out"))
            .unwrap_or_default()
            .trim(),
        "4"
    );
    assert_eq!(received(&env), 4, "each call sent once");
    assert_eq!(env.inspect("t")["task"]["status"], "completed");
}

/// Children that spend at the same time share their parent's budget
/// (SPEC 16, 19): each child is made with what is left of it (1,000
/// tokens, as nothing is spent yet), so four children of eight parallel
/// calls each could spend four times the budget between them; their runs
/// reserve each call against the parent's budget in the journal, so
/// together they spend at most 1,000 tokens.
#[test]
fn children_spending_at_once_never_pass_their_parents_budget() {
    if !llm_clients() {
        return;
    }
    let (mut env, _server) = llm_env();
    env.set("PARALLEL", "8");
    let child = parallel_calls();
    env.write(
        "parent.py",
        &format!(
            "import json, sys\n\
             def ask(m):\n    sys.stdout.write(json.dumps(m) + '\\n'); sys.stdout.flush()\n    a = json.loads(sys.stdin.readline())\n    assert a['ok'], a\n    return a\n\
             kids = [ask({{'op': 'spawn', 'id': i, 'name': 'kid', 'command': ['python3', {child:?}]}})['output']['task'] for i in range(4)]\n\
             ask({{'op': 'join', 'id': 9, 'task': kids[0]}})\n\
             import time; time.sleep(600)\n"
        ),
    );
    // The parent lives on after its join until the test ends it: its
    // children beside it run to their ends, where an ended parent would
    // leave those not yet ended interrupted (for its resume).
    let mut parent = env.spawn(
        &[
            "run",
            "--task",
            "p",
            "--max-tokens",
            "1000",
            "--jobs",
            "4",
            "--",
            "python3",
            "parent.py",
        ],
        "parent",
    );
    let kids = ["p-s1", "p-s2", "p-s3", "p-s4"];
    let ended = |task: &str| {
        let shown = env.durun(&["inspect", task, "--json"]);
        let status = serde_json::from_slice::<Value>(&shown.stdout)
            .map(|task| task["task"]["status"].clone())
            .unwrap_or_default();
        // A child shows `interrupted` from the moment its parent made it
        // until its runner holds it: only an end counts.
        ["completed", "failed", "cancelled", "over_budget"]
            .iter()
            .any(|end| status == *end)
    };
    wait_for(
        "the children to end",
        std::time::Duration::from_secs(60),
        || kids.iter().all(|kid| ended(kid)),
    );
    let spent: u64 = kids
        .iter()
        .map(|kid| {
            let task = env.inspect(kid);
            // Made with what was left of the parent's budget.
            assert_eq!(task["task"]["max_tokens"], 1000, "{task}");
            task["task"]["tokens_spent"].as_u64().unwrap_or(0)
        })
        .sum();
    // The fake upstream's usage: 120 tokens a call.
    let calls = received(&env);
    let ends: Vec<Value> = kids
        .iter()
        .map(|kid| env.inspect(kid)["task"].clone())
        .collect();
    assert!(calls >= 1, "{ends:?}\n{}", env.log("parent"));
    assert!(calls * 120 <= 1000, "{calls} calls: {}", env.log("parent"));
    assert_eq!(spent, calls * 120, "{}", env.log("parent"));
    crate::env::signal(i32::try_from(parent.id()).expect("pid"), libc::SIGTERM);
    crate::env::wait_exit(&mut parent, std::time::Duration::from_secs(30));
}
