//! Probes (SPEC 22): a step a dead run left in doubt is settled by asking
//! its destination, before it runs again: reconciled when the effect is
//! there, run again with its key when it is not, and left to `in_doubt`
//! when the probe cannot tell. No effect is applied twice.

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, text};
use crate::servers::FakeApi;

/// `charge`, an `in_doubt = "ask"` tool (without its probe, a step in
/// doubt stops the run for `durun resolve`), with `probe`.
fn with_probe(api: &FakeApi, probe: &str) -> TestEnv {
    let mut env = TestEnv::new();
    env.set("API_URL", &api.url);
    env.write(
        "durun.toml",
        &format!(
            "[tools.charge]\neffect = \"mutate\"\ncommand = [\"python3\", \"{}\"]\nstdin = \"args\"\noutput = \"json\"\nin_doubt = \"ask\"\nprobe = {probe}\n",
            agents_dir().join("api_tool.py").display()
        ),
    );
    env
}

/// Runs the charge and a receipt; kills durun (SIGKILL) while the API
/// holds the charge, which `hold` set up; resumes.
fn killed_and_resumed(api: &FakeApi, env: &TestEnv, hold: impl Fn()) -> std::process::Output {
    let plan = json!({"steps": [
        {"call": "charge", "args": {"title": "charge 5"}},
        {"begin": "receipt", "args": {}, "do": {"value": "sent"}},
    ]});
    let agent = env.scripted_agent("plan.json", &plan);
    hold();
    let mut args = vec!["run", "--task", "pay", "--"];
    args.extend(agent.iter().map(String::as_str));
    let mut durun = env.spawn(&args, "run1");
    api.wait_held();
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    api.release();
    env.durun(&["resume", "pay"])
}

fn http_probe(api: &FakeApi) -> String {
    format!("{{ http = {{ url = \"{}resources/{{key}}\" }} }}", api.url)
}

#[test]
fn a_charge_that_took_effect_is_reconciled_by_its_probe_not_run_again() {
    let api = FakeApi::start();
    let env = with_probe(&api, &http_probe(&api));
    let resumed = killed_and_resumed(&api, &env, || api.hold_next_create());
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(
        text(&resumed.stderr).contains(
            "step 1 (charge) was in doubt; its probe says it took effect: reconciled, not run again"
        ),
        "{}",
        text(&resumed.stderr)
    );
    let key = {
        let view = env.inspect("pay");
        view["steps"][0]["idempotency_key"]
            .as_str()
            .expect("key")
            .to_owned()
    };
    assert_eq!(
        api.keys(),
        std::slice::from_ref(&key),
        "the charge was sent once"
    );
    assert_eq!(api.probes(), [key]);
    assert_eq!(api.resources(), 1);
    let view = env.inspect("pay");
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(view["steps"][0]["resolution"], "reconciled");
    assert_eq!(
        view["steps"][0]["output"]["id"], "res-1",
        "{}",
        view["steps"][0]
    );
    assert_eq!(view["task"]["output"]["outputs"][0]["id"], "res-1");
    let step = text(&env.durun(&["inspect", "pay", "--step", "1"]).stdout);
    assert!(
        step.contains("resolution  reconciled (its probe, after a crash)"),
        "{step}"
    );
}

#[test]
fn a_charge_that_never_took_effect_runs_again_with_its_key_once_its_probe_says_so() {
    let api = FakeApi::start();
    // A command probe: exit 0 with the charge if it is there, exit 1 if not.
    let probe = env_probe_script();
    let env = with_probe(
        &api,
        &format!("{{ command = [\"python3\", \"{probe}\", \"{{key}}\"] }}"),
    );
    let resumed = killed_and_resumed(&api, &env, || api.hold_next_uncreated());
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let view = env.inspect("pay");
    let key = view["steps"][0]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_owned();
    // The dropped request, then the one after the probe: the same key.
    assert_eq!(api.keys(), [key.clone(), key]);
    assert_eq!(api.resources(), 1, "applied once");
    assert_eq!(view["task"]["status"], "completed");
    assert_eq!(view["steps"][0]["resolution"], Value::Null);
    assert_eq!(view["steps"][0]["attempts"], 2);
}

#[test]
fn a_probe_that_cannot_tell_leaves_the_step_to_in_doubt() {
    let api = FakeApi::start();
    // Nothing listens there: the probe fails, neither yes nor no.
    let env = with_probe(
        &api,
        "{ http = { url = \"http://127.0.0.1:9/charges/{key}\" } }",
    );
    let resumed = killed_and_resumed(&api, &env, || api.hold_next_create());
    assert_eq!(resumed.status.code(), Some(76), "{}", text(&resumed.stderr));
    assert!(
        text(&resumed.stderr).contains("its probe could not tell whether it took effect"),
        "{}",
        text(&resumed.stderr)
    );
    assert_eq!(api.keys().len(), 1, "not run again");
}

#[test]
fn a_probe_that_is_neither_a_command_nor_http_is_refused() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        "[tools.charge]\ncommand = [\"true\"]\nprobe = {}\n",
    );
    let run = env.durun(&["run", "--", "true"]);
    assert_eq!(run.status.code(), Some(64), "{}", text(&run.stderr));
    assert!(
        text(&run.stderr).contains("`probe` needs `command = [\"program\", \"{key}\", …]` or `http = { url = \"…{key}…\" }`, one of them"),
        "{}",
        text(&run.stderr)
    );
}

/// A probe command: GETs $API_URL/resources/KEY and prints it (exit 0),
/// or exits 1 on a 404.
fn env_probe_script() -> String {
    agents_dir()
        .join("probe_resource.py")
        .to_string_lossy()
        .into_owned()
}

/// Steps of the probe torture: a create through `charge` (probed) in
/// every other step.
const TORTURE_STEPS: usize = 24;

/// A task of creates through a probed tool is killed (SIGKILL to durun,
/// which ends its agent and tools) at random moments and resumed until it
/// ends. Every step a kill left in doubt is probed on resume; each probe
/// that can tell settles its step without a person; no resource is made
/// twice. One seed by default; `DURUN_TORTURE_ROUNDS=N` runs N and prints
/// the figures (docs/reliability.md).
#[test]
fn random_kills_leave_steps_in_doubt_that_their_probes_settle_with_no_effect_twice() {
    let (mut probed, mut reconciled, mut unsettled, mut kills) = (0, 0, 0, 0);
    for seed in crate::torture::seeds() {
        let round = probe_torture(seed);
        probed += round.probed;
        reconciled += round.reconciled;
        unsettled += round.unsettled;
        kills += round.kills;
    }
    eprintln!(
        "probe torture: {kills} kills, {probed} steps in doubt probed, {reconciled} reconciled, {} run again after a probe said not applied, {unsettled} the probe could not settle",
        probed - reconciled - unsettled
    );
    assert!(
        unsettled * 10 <= probed,
        "{unsettled} of {probed} steps in doubt unsettled"
    );
}

struct Round {
    kills: usize,
    probed: usize,
    reconciled: usize,
    unsettled: usize,
}

fn probe_torture(seed: u64) -> Round {
    let api = FakeApi::start();
    let env = with_probe(&api, &http_probe(&api));
    let steps: Vec<Value> = (0..TORTURE_STEPS)
        .map(|i| {
            if i % 2 == 0 {
                json!({"call": "charge", "args": {"title": format!("c{i}")}})
            } else {
                json!({"begin": format!("think{i}"), "args": {"i": i}, "do": {"sleep_ms": 5}})
            }
        })
        .collect();
    let agent = env.scripted_agent("plan.json", &json!({ "steps": steps }));
    let mut rng = crate::torture::Rng(seed | 1);
    let (mut runs, mut kills, mut unsettled) = (0, 0, 0);
    loop {
        assert!(runs < 80, "seed {seed}: the task did not finish in 80 runs");
        let recorded = runs > 0 && env.durun(&["inspect", "pay"]).status.success();
        let mut args = vec!["run", "--task", "pay", "--"];
        args.extend(agent.iter().map(String::as_str));
        if recorded {
            args = vec!["resume", "pay"];
        }
        let log = format!("run{runs}");
        let mut durun = env.spawn(&args, &log);
        runs += 1;
        // The window grows run by run, so that a machine loaded enough to
        // make every start slow still sees the task end.
        let deadline = std::time::Instant::now()
            + std::time::Duration::from_millis(30 + rng.below(400) + 50 * runs);
        let mut ended = None;
        while std::time::Instant::now() < deadline && ended.is_none() {
            ended = durun.try_wait().expect("try_wait");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let killed = ended.is_none();
        if killed {
            durun.kill().expect("SIGKILL durun");
            kills += 1;
        }
        let status = durun.wait().expect("reap");
        let said = env.log(&log);
        unsettled += said.matches("its probe could not tell").count();
        if status.success() {
            break;
        }
        assert!(
            killed,
            "seed {seed}: run {runs} ended with {status}: {said}"
        );
    }
    let view = env.inspect("pay");
    assert_eq!(view["task"]["status"], "completed", "seed {seed}");
    assert_eq!(
        api.resources(),
        TORTURE_STEPS / 2,
        "seed {seed}: a resource was made twice, or one is missing"
    );
    let reconciled = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["resolution"] == "reconciled")
        .count();
    Round {
        kills,
        probed: api.probes().len(),
        reconciled,
        unsettled,
    }
}

/// A custom route to the fake API whose probe is `GET /resources/{key}`;
/// api_agent.py POSTs through it, durun is killed while the API holds the
/// POST (`hold` says where), and the task resumed.
fn proxied_killed_and_resumed(api: &FakeApi, hold: impl Fn()) -> (TestEnv, std::process::Output) {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!(
            "[proxy.routes.myapi]\nenv = \"MY_API\"\nupstream = \"{}\"\nprobe = \"GET /resources/{{key}}\"\n",
            api.url.trim_end_matches('/')
        ),
    );
    let agent = agents_dir().join("api_agent.py");
    hold();
    let mut durun = env.spawn(
        &[
            "run",
            "--task",
            "t",
            "--",
            "python3",
            &agent.to_string_lossy(),
        ],
        "run1",
    );
    api.wait_held();
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    api.release();
    let resumed = env.durun(&["resume", "t"]);
    (env, resumed)
}

#[test]
fn a_proxied_post_that_took_effect_is_reconciled_by_its_routes_probe_not_sent_again() {
    let api = FakeApi::start();
    let (env, resumed) = proxied_killed_and_resumed(&api, || api.hold_next_create());
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let key = env.inspect("t")["steps"][1]["idempotency_key"]
        .as_str()
        .expect("key")
        .to_owned();
    assert_eq!(api.keys(), std::slice::from_ref(&key), "not sent again");
    assert_eq!(api.probes(), std::slice::from_ref(&key));
    assert_eq!(
        api.probe_auth(),
        [Some("Bearer api-secret".to_owned())],
        "the probe carries the agent's credentials"
    );
    let printed: Value = serde_json::from_slice(&resumed.stdout).expect("the agent's print");
    assert_eq!(printed["created"]["id"], "res-1", "the probe's answer");
    let step = &env.inspect("t")["steps"][1];
    assert_eq!(step["status"], "committed");
    assert_eq!(step["resolution"], "reconciled", "{step}");
    assert_eq!(step["attempts"], 1);
    assert!(
        text(&resumed.stderr).contains("its route's probe says it took effect: reconciled"),
        "{}",
        text(&resumed.stderr)
    );
}

#[test]
fn a_proxied_post_that_never_took_effect_goes_again_with_its_key_once_the_probe_says_so() {
    let api = FakeApi::start();
    let (env, resumed) = proxied_killed_and_resumed(&api, || api.hold_next_uncreated());
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let step = &env.inspect("t")["steps"][1];
    let key = step["idempotency_key"].as_str().expect("key").to_owned();
    assert_eq!(api.probes(), std::slice::from_ref(&key), "asked first");
    assert_eq!(api.keys(), [key.clone(), key], "then sent again, same key");
    assert_eq!(api.resources(), 1);
    assert_eq!(step["resolution"], Value::Null);
    assert_eq!(step["attempts"], 2);
}
