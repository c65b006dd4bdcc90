//! The ways out of trouble: `resolve` for steps in doubt, `cancel`, `gc`,
//! `resume --from-step`, and the warning for keys retried after a day.

use std::time::Duration;

use serde_json::json;

use crate::env::{TestEnv, agents_dir, read_pid, text};
use crate::servers::FakeApi;

/// A task whose step 1 is a charge through an `in_doubt = "ask"` tool, left
/// in doubt: durun was killed while the API held its answer.
fn charge_in_doubt(api: &FakeApi) -> TestEnv {
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    env.write(
        "durun.toml",
        &format!(
            "[tools.charge]\neffect = \"mutate\"\ncommand = [\"python3\", \"{}\"]\nstdin = \"args\"\noutput = \"json\"\nin_doubt = \"ask\"\n",
            agents_dir().join("api_tool.py").display()
        ),
    );
    let plan = json!({"steps": [
        {"call": "charge", "args": {"title": "charge 5"}},
        {"begin": "receipt", "args": {}, "do": {"value": "sent"}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut durun = api.spawn_until_held(&env, "pay", &agent);
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    api.release();

    let stopped = env.durun(&["resume", "pay"]);
    assert_eq!(stopped.status.code(), Some(76), "{}", text(&stopped.stderr));
    let stderr = text(&stopped.stderr);
    assert!(
        stderr.contains("\ndurun: step 1 (charge) of task pay may or may not have taken effect"),
        "{stderr}"
    );
    assert!(
        stderr.contains("durun resolve pay 1 --retry | --output JSON | --fail MESSAGE"),
        "{stderr}"
    );
    assert_eq!(
        api.keys().len(),
        1,
        "a tool that asks first is not retried on its own"
    );
    env
}

#[test]
fn resolve_output_records_what_the_operator_saw() {
    let api = FakeApi::start();
    let env = charge_in_doubt(&api);
    let resolved = env.durun(&[
        "resolve",
        "pay",
        "1",
        "--output",
        r#"{"id": "res-1", "by": "hand"}"#,
    ]);
    assert!(resolved.status.success(), "{}", text(&resolved.stderr));
    let resumed = env.durun(&["resume", "pay"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(api.keys().len(), 1, "the step was not run again");
    let view = env.inspect("pay");
    assert_eq!(
        view["steps"][0]["output"],
        json!({"id": "res-1", "by": "hand"})
    );
    assert_eq!(view["steps"][0]["resolution"], "output");
    assert_eq!(view["task"]["output"]["outputs"][0]["by"], "hand");
    env.assert_journal_intact();
}

#[test]
fn resolve_retry_runs_the_step_again_with_its_key() {
    let api = FakeApi::start();
    let env = charge_in_doubt(&api);
    assert!(
        env.durun(&["resolve", "pay", "1", "--retry"])
            .status
            .success()
    );
    let resumed = env.durun(&["resume", "pay"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let keys = api.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0], keys[1],
        "the retry carries the first attempt's key"
    );
    assert_eq!(api.resources(), 1);
    assert_eq!(env.inspect("pay")["steps"][0]["attempts"], 2);
}

#[test]
fn resolve_fail_replays_as_a_failure() {
    let api = FakeApi::start();
    let env = charge_in_doubt(&api);
    assert!(
        env.durun(&["resolve", "pay", "1", "--fail", "card declined"])
            .status
            .success()
    );
    let resumed = env.durun(&["resume", "pay"]);
    assert_eq!(
        resumed.status.code(),
        Some(3),
        "the agent exits 3 on a failed call"
    );
    assert!(text(&resumed.stderr).contains("card declined"));
    assert_eq!(api.keys().len(), 1);
    // The same decision holds on every later resume.
    assert_eq!(env.durun(&["resume", "pay"]).status.code(), Some(3));
    assert_eq!(api.keys().len(), 1);

    let bad = env.durun(&["resolve", "pay", "9", "--retry"]);
    assert_eq!(bad.status.code(), Some(64));
    assert!(text(&bad.stderr).starts_with("durun: task pay has no step 9"));
    let bad = env.durun(&["resolve", "pay", "1", "--output", "{oops"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn cancel_stops_a_live_runner_and_the_task_never_resumes() {
    let env = TestEnv::new();
    let plan = json!({
        "pidfile": env.path("agent.pid"),
        "steps": [
            {"begin": "one", "args": {}, "do": {"value": 1}},
            {"begin": "wait", "args": {}, "do": {"wait_for": env.path("never")}},
        ],
    });
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "c", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut runner = env.spawn(&args, "run");
    read_pid(&env.path("agent.pid"));
    let cancel = env.durun(&["cancel", "c"]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    assert!(
        text(&cancel.stderr).contains("durun: task c cancelled"),
        "{}",
        text(&cancel.stderr)
    );
    let status = runner.wait().expect("runner");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        env.log("run")
    );
    assert_eq!(env.inspect("c")["task"]["status"], "cancelled");

    let resume = env.durun(&["resume", "c"]);
    assert_eq!(resume.status.code(), Some(64));
    assert!(text(&resume.stderr).contains("was cancelled"));
    let again = env.durun(&["cancel", "c"]);
    assert!(text(&again.stderr).contains("already cancelled"));
}

/// Two calls at once: `flaky` fails (quickly) until the file `fixed`
/// exists, `slow` takes a moment. The agent sends both, reads both answers,
/// and exits 3 on a failure; with `then_more`, it first opens one more step
/// (it went on knowing of the failure).
fn parallel_failure_env(then_more: bool) -> TestEnv {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        "[tools.flaky]\neffect = \"mutate\"\ncommand = [\"sh\", \"-c\", \"test -e fixed && echo fine\"]\n\n\
         [tools.slow]\neffect = \"read\"\ncommand = [\"sh\", \"-c\", \"sleep 0.5; echo slow\"]\n",
    );
    env.write(
        "agent.py",
        &format!(
            r#"
import json, sys
def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
send({{"op": "call", "id": 1, "tool": "flaky"}})
send({{"op": "call", "id": 2, "tool": "slow"}})
answers = [json.loads(sys.stdin.readline()) for _ in range(2)]
if not all(a["ok"] for a in answers):
    if {then_more}:
        send({{"op": "begin", "id": 3, "name": "cleanup"}})
        step = json.loads(sys.stdin.readline())["step"]
        send({{"op": "commit", "id": 4, "step": step, "output": "cleaned"}})
        sys.stdin.readline()
    sys.exit(3)
"#,
            then_more = if then_more { "True" } else { "False" }
        ),
    );
    env
}

#[test]
fn a_failure_answered_after_every_later_step_opened_runs_again() {
    let env = parallel_failure_env(false);
    let first = env.durun(&["run", "--task", "p", "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let view = env.inspect("p");
    assert_eq!(view["steps"][0]["status"], "failed");
    assert_eq!(view["steps"][1]["status"], "committed");
    // Step 2 was opened before step 1's failure was answered: the agent
    // never went on from it, so a resume retries it with its key.
    std::fs::write(env.path("fixed"), "").expect("fix");
    let second = env.durun(&["resume", "p"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let view = env.inspect("p");
    assert_eq!(view["steps"][0]["status"], "committed");
    assert_eq!(view["steps"][0]["attempts"], 2);
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 1);
}

#[test]
fn a_failure_the_agent_went_on_from_replays_as_a_failure() {
    let env = parallel_failure_env(true);
    let first = env.durun(&["run", "--task", "p", "--", "python3", "agent.py"]);
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    std::fs::write(env.path("fixed"), "").expect("fix");
    // It opened step 3 after it saw the failure: the failure is history.
    let second = env.durun(&["resume", "p"]);
    assert_eq!(second.status.code(), Some(3), "{}", text(&second.stderr));
    let view = env.inspect("p");
    assert_eq!(view["steps"][0]["status"], "failed");
    assert_eq!(view["steps"][0]["attempts"], 1);
    assert_eq!(view["steps"][2]["output"], "cleaned");
}

#[test]
fn cancel_without_a_runner_is_immediate() {
    let env = TestEnv::new();
    assert_eq!(
        env.durun(&["run", "--task", "f", "--", "false"])
            .status
            .code(),
        Some(1)
    );
    let cancel = env.durun(&["cancel", "f"]);
    assert!(cancel.status.success());
    assert_eq!(env.inspect("f")["task"]["status"], "cancelled");
}

#[test]
fn gc_removes_finished_tasks_and_never_a_live_one() {
    let env = TestEnv::new();
    assert!(
        env.durun(&["run", "--task", "done", "--", "true"])
            .status
            .success()
    );
    assert_eq!(
        env.durun(&["run", "--task", "broke", "--", "false"])
            .status
            .code(),
        Some(1)
    );
    let plan = json!({"pidfile": env.path("agent.pid"), "steps": [
        {"begin": "wait", "args": {}, "do": {"wait_for": env.path("release")}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "live", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut live = env.spawn(&args, "live");
    read_pid(&env.path("agent.pid"));

    let kept = env.durun(&["gc", "--older-than", "1h"]);
    assert!(kept.status.success());
    assert!(kept.stdout.is_empty(), "nothing is an hour old");
    std::thread::sleep(Duration::from_millis(20));
    let gc = env.durun(&["gc", "--older-than", "1ms"]);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    let mut removed: Vec<String> = text(&gc.stdout).lines().map(str::to_owned).collect();
    removed.sort();
    assert_eq!(removed, ["broke", "done"]);
    assert!(text(&gc.stderr).contains("removed 2 finished tasks"));
    assert_eq!(env.durun(&["inspect", "done"]).status.code(), Some(64));
    assert_eq!(env.inspect("live")["task"]["status"], "running");

    std::fs::write(env.path("release"), "").expect("release");
    assert!(live.wait().expect("live").success());
    env.assert_journal_intact();
}

#[test]
fn resume_from_step_discards_and_lists_what_took_effect() {
    let env = TestEnv::new();
    let plan = |title: &str| {
        json!({"steps": [
            {"begin": "plan", "args": {}, "do": {"value": "p"}},
            {"begin": "open_pr", "effect": "mutate", "args": {"title": title}, "do": {"value": title}},
            {"begin": "report", "args": {}, "do": {"value": "r"}},
        ]})
    };
    let agent = env.scripted_agent("plan.json", &plan("first"));
    let mut args = vec!["run", "--task", "f", "--"];
    args.extend(agent.iter().map(String::as_str));
    assert!(env.durun(&args).status.success());

    env.scripted_agent("plan.json", &plan("second"));
    assert_eq!(
        env.durun(&["resume", "f"]).status.code(),
        Some(0),
        "a completed task stays completed"
    );
    let resumed = env.durun(&["resume", "f", "--from-step", "2"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let stderr = text(&resumed.stderr);
    assert!(
        stderr.contains("durun: discarded steps 2-3 of task f from replay"),
        "{stderr}"
    );
    assert!(
        stderr.contains("step 2 open_pr (mutate) took effect; durun does not undo it"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("step 3 report (mutate)"),
        "read steps are not listed: {stderr}"
    );

    let view = env.inspect("f");
    let steps: Vec<(u64, String, String)> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["step"].as_u64().expect("n"),
                s["status"].as_str().expect("status").to_owned(),
                s["output"].to_string(),
            )
        })
        .collect();
    let expect = |n: u64, status: &str, output: &str| (n, status.to_owned(), output.to_owned());
    assert_eq!(
        steps,
        [
            expect(1, "committed", "\"p\""),
            expect(2, "discarded", "\"first\""),
            expect(2, "committed", "\"second\""),
            expect(3, "discarded", "\"r\""),
            expect(3, "committed", "\"r\""),
        ]
    );
    assert_eq!(view["task"]["runs"][1]["replayed_steps"], 1);
    env.assert_journal_intact();
}

#[test]
fn a_mutate_step_retried_after_a_day_is_flagged() {
    let env = TestEnv::new();
    let plan = json!({"steps": [
        {"begin": "deploy", "effect": "mutate", "args": {}, "do": {"exit_unless": env.path("go"), "code": 9}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    let mut args = vec!["run", "--task", "old", "--"];
    args.extend(agent.iter().map(String::as_str));
    assert_eq!(env.durun(&args).status.code(), Some(9));
    env.sql("UPDATE steps SET created_at = '2000-01-01T00:00:00.000Z'");
    std::fs::write(env.path("go"), "").expect("go");
    let resumed = env.durun(&["resume", "old"]);
    assert!(resumed.status.success());
    let stderr = text(&resumed.stderr);
    assert!(
        stderr.contains(
            "durun: warning: step 1 (deploy) is retried more than 24 hours after its first attempt"
        ),
        "{stderr}"
    );
}

/// A task this durun cannot run (its recorded preset is one it lacks: a
/// task from another version) fails its resume with why, and is left
/// resumable: the run that started says why it ended, and holds no lease.
#[test]
fn a_task_this_durun_cannot_run_is_left_resumable_with_why() {
    let env = TestEnv::new();
    let submitted = env.durun(&["-q", "submit", "--task", "t", "--", "true"]);
    assert!(submitted.status.success(), "{}", text(&submitted.stderr));
    env.sql("UPDATE tasks SET launch = '{\"preset\": \"no-such\"}' WHERE id = 't'");
    let resumed = env.durun(&["resume", "t"]);
    let said = text(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(70), "{said}");
    assert!(said.contains("a preset this durun lacks"), "{said}");
    let shown = env.inspect("t");
    assert_eq!(shown["task"]["status"], "interrupted", "{shown}");
    let runs = shown["task"]["runs"].as_array().expect("runs");
    let last = runs.last().expect("a run");
    assert!(
        last["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such"),
        "the run says why it ended: {shown}"
    );
    assert_eq!(
        env.sql_number("SELECT count(*) FROM tasks WHERE lease_host IS NOT NULL"),
        0,
        "no lease is left"
    );
}
