//! An SDK answers a resumed task's replayed steps itself, from durun's
//! `ahead` answers: no request per step, the same values, the same
//! numbering (asyncio too), divergence caught by durun as before, and the
//! steps counted as replayed.

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, sdk_path, text};
use crate::sdk_python::seen;

/// The agent's command, its requests to durun copied to
/// `requests-RUN.log` on their way (its exit status kept).
pub(crate) fn logged(env: &mut TestEnv, agent: &[&str]) -> Vec<String> {
    env.set("PYTHONPATH", sdk_path());
    let agent = agent.join(" ");
    vec![
        "bash".into(),
        "-c".into(),
        format!("{agent} | tee requests-$DURUN_RUN.log; exit ${{PIPESTATUS[0]}}"),
    ]
}

fn python(scenario: &str) -> String {
    format!(
        "python3 {} {scenario}",
        agents_dir().join("replayed_here.py").display()
    )
}

fn node(scenario: &str) -> String {
    format!(
        "node {} {scenario}",
        agents_dir().join("replayed_here.mjs").display()
    )
}

/// How many of the run's requests have op `op`.
fn requests(env: &TestEnv, run: u32, op: &str) -> usize {
    let log = std::fs::read_to_string(env.path(&format!("requests-{run}.log"))).expect("log");
    log.lines()
        .filter(|line| serde_json::from_str::<Value>(line).is_ok_and(|request| request["op"] == op))
        .count()
}

fn run_twice(env: &TestEnv, command: &[String]) -> std::process::Output {
    let mut args = vec!["run", "--task", "t", "--"];
    args.extend(command.iter().map(String::as_str));
    let first = env.durun(&args);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    env.durun(&["resume", "t"])
}

fn replayed_in_run(env: &TestEnv, run: usize) -> (Value, Value) {
    let view = env.inspect("t");
    let runs = &view["task"]["runs"][run - 1];
    (
        runs["replayed_steps"].clone(),
        runs["executed_steps"].clone(),
    )
}

fn replays_from_the_steps_ahead_without_a_request_each(agent: &str) {
    let mut env = TestEnv::new();
    let command = logged(&mut env, &[agent]);
    let second = run_twice(&env, &command);
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert_eq!(seen(&second), [json!(vec![1; 600])]);
    assert_eq!(requests(&env, 1, "begin"), 600);
    let begins = requests(&env, 2, "begin");
    assert!(begins <= 3, "{begins} begins for 600 replayed steps");
    assert!(requests(&env, 2, "replayed") >= 2);
    // Told at exit too: every step counts as replayed.
    assert_eq!(replayed_in_run(&env, 2), (json!(600), json!(0)));
    assert_eq!(env.inspect("t")["task"]["status"], "completed");
}

#[test]
fn a_python_agent_replays_from_the_steps_ahead_without_a_request_each() {
    replays_from_the_steps_ahead_without_a_request_each(&python("loop 600"));
}

#[test]
fn a_node_agent_replays_from_the_steps_ahead_without_a_request_each() {
    replays_from_the_steps_ahead_without_a_request_each(&node("loop 600"));
}

fn a_changed_step_among_the_steps_ahead_is_divergence(agent: &str) {
    let mut env = TestEnv::new();
    let command = logged(&mut env, &[agent]);
    let second = run_twice(&env, &command);
    assert_eq!(second.status.code(), Some(65), "{}", text(&second.stderr));
    let stderr = text(&second.stderr);
    assert!(stderr.contains("step 200"), "{stderr}");
    assert_eq!(replayed_in_run(&env, 2), (json!(199), json!(0)));
}

#[test]
fn a_changed_step_among_the_steps_ahead_is_divergence_in_python() {
    a_changed_step_among_the_steps_ahead_is_divergence(&python("diverge 300 200"));
}

#[test]
fn a_changed_step_among_the_steps_ahead_is_divergence_in_node() {
    a_changed_step_among_the_steps_ahead_is_divergence(&node("diverge 300 200"));
}

/// Three steps begun together, one of whose coroutines then begins a
/// fourth: replayed here, each takes the number it had.
fn gathered_steps_replayed_here_keep_their_numbers(agent: &str) {
    let mut env = TestEnv::new();
    let command = logged(&mut env, &[agent]);
    let second = run_twice(&env, &command);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let rounds = seen(&second);
    assert_eq!(rounds, [json!(vec![json!([[1, 1], 1, 1]); 100])]);
    assert!(requests(&env, 2, "begin") < 20);
    assert_eq!(replayed_in_run(&env, 2), (json!(400), json!(0)));
}

#[test]
fn gathered_asyncio_steps_replayed_here_keep_their_numbers() {
    gathered_steps_replayed_here_keep_their_numbers(&python("gather 100"));
}

#[test]
fn gathered_node_steps_replayed_here_keep_their_numbers() {
    gathered_steps_replayed_here_keep_their_numbers(&node("gather 100"));
}
