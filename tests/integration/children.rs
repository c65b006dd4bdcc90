//! Sub-agents (SPEC 16): `spawn` makes child tasks `PARENT-sN` once,
//! `join` waits for them (live, or parked until they end), a crash of the
//! parent's runner loses no child and makes none twice.

use std::time::Duration;

use serde_json::{Value, json};

use crate::env::{TestEnv, agents_dir, text, wait_for};
use crate::workers::{stop, worker};

fn parent_args(env: &TestEnv, task: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--task", task]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args.push("--".to_owned());
    args.push("python3".to_owned());
    args.push(
        agents_dir()
            .join("tree_parent.py")
            .to_string_lossy()
            .into_owned(),
    );
    let _ = env;
    args
}

fn joined(env: &TestEnv, task: &str) -> Value {
    env.inspect(task)["task"]["output"]["joined"].clone()
}

fn expected(parent: &str) -> Value {
    json!([
        {"task": format!("{parent}-s1"), "status": "completed", "output": {"topic": "a", "parent": parent}},
        {"task": format!("{parent}-s2"), "status": "completed", "output": {"topic": "b", "parent": parent}},
    ])
}

fn task_ids(env: &TestEnv) -> Vec<String> {
    let listed: Value =
        serde_json::from_slice(&env.durun(&["inspect", "--json"]).stdout).expect("JSON");
    let mut ids: Vec<String> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter_map(|task| task["id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_parent_spawns_children_beside_it_and_joins_their_answers() {
    let env = TestEnv::new();
    // Children beside the agent end with its durun: their join never
    // parks, whatever --park-after says.
    let args = parent_args(&env, "root", &["--park-after", "0s"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = env.durun(&args);
    assert!(run.status.success(), "{}", text(&run.stderr));
    // Each child got its args in DURUN_ARGS and its parent's id.
    assert_eq!(joined(&env, "root"), expected("root"));
    assert_eq!(task_ids(&env), ["root", "root-s1", "root-s2"]);
    let steps = &env.inspect("root")["steps"];
    assert_eq!(steps[0]["kind"], "spawn");
    assert_eq!(steps[0]["effect"], "mutate");
    assert_eq!(steps[0]["output"], json!({"task": "root-s1"}));
    assert_eq!(steps[2]["kind"], "join");
    // inspect: the family, and the tree.
    let root = env.inspect("root");
    assert_eq!(root["task"]["parent"], Value::Null);
    assert_eq!(
        root["task"]["children"],
        json!([{"id": "root-s1", "status": "completed"}, {"id": "root-s2", "status": "completed"}])
    );
    assert_eq!(env.inspect("root-s2")["task"]["parent"], "root");
    let tree = text(&env.durun(&["inspect", "--tree"]).stdout);
    assert!(
        tree.contains("root        completed")
            && tree.contains("├─ root-s1  completed")
            && tree.contains("└─ root-s2  completed"),
        "{tree}"
    );
    let tree: Value =
        serde_json::from_slice(&env.durun(&["inspect", "--tree", "--json"]).stdout).expect("JSON");
    assert_eq!(tree["tasks"].as_array().map(Vec::len), Some(1), "{tree}");
    assert_eq!(tree["tasks"][0]["children"][1]["id"], "root-s2");
}

#[test]
fn a_crash_of_the_parents_runner_loses_no_child_and_makes_none_twice() {
    let mut env = TestEnv::new();
    env.set("CHILD_GATE", env.path("gate").to_string_lossy());
    let args = parent_args(&env, "root", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut parent = env.spawn(&args, "parent");
    // Both children are working, the parent joins the first: SIGKILL.
    wait_for("both children at work", Duration::from_secs(20), || {
        env.path("work-a.log").exists() && env.path("work-b.log").exists()
    });
    crate::env::signal(parent.id() as i32, libc::SIGKILL);
    let _ = parent.wait();
    std::fs::write(env.path("gate"), "").expect("open the gate");
    let resumed = env.durun(&["resume", "root"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(joined(&env, "root"), expected("root"));
    assert_eq!(
        task_ids(&env),
        ["root", "root-s1", "root-s2"],
        "no child made twice"
    );
    let runs = &env.inspect("root")["task"]["runs"];
    assert_eq!(runs[1]["replayed_steps"], 2, "the spawns replayed: {runs}");
}

#[test]
fn queued_children_go_to_workers_and_the_parked_parent_resumes_when_they_end() {
    let mut env = TestEnv::new();
    env.set("CHILD_QUEUE", "kids");
    env.set("DURUN_HEARTBEAT_MS", "250");
    env.set("DURUN_LEASE_STALE_MS", "1500");
    let args = parent_args(&env, "root", &["--park-after", "0s"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let parked = env.durun(&args);
    assert_eq!(parked.status.code(), Some(77), "{}", text(&parked.stderr));
    assert!(
        text(&parked.stderr).contains("task root waits for its child task root-s1 to end (step 3)"),
        "{}",
        text(&parked.stderr)
    );
    assert_eq!(env.inspect("root-s1")["task"]["status"], "queued");
    // Not ready yet: it parks again at once, its agent not started.
    assert_eq!(env.durun(&["resume", "root"]).status.code(), Some(77));
    let mut pool = worker(&env, "w1", &["--queue", "kids"]);
    wait_for("both children to complete", Duration::from_secs(30), || {
        ["root-s1", "root-s2"]
            .iter()
            .all(|kid| env.inspect(kid)["task"]["status"] == "completed")
    });
    assert!(stop(&mut pool).success());
    let resumed = env.durun(&["resume", "root"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(joined(&env, "root"), expected("root"));
}

#[test]
fn a_join_of_no_such_task_fails_its_step_and_a_bad_spawn_is_refused() {
    let env = TestEnv::new();
    let (output, answers) = env.probe(
        "t",
        &json!([
            {"send": json!({"op": "join", "id": 1, "task": "nobody"}).to_string()},
            {"send": json!({"op": "spawn", "id": 2, "name": "x", "command": []}).to_string()},
            {"send": json!({"op": "spawn", "id": 3, "name": "x", "command": ["true"], "queue": "no spaces"}).to_string()},
        ]),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(answers[0]["ok"], false, "{answers:?}");
    assert_eq!(answers[0]["error"]["code"], "bad_request");
    assert!(
        answers[0]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("there is no task nobody to join"))
    );
    assert_eq!(answers[1]["error"]["code"], "bad_request");
    assert_eq!(answers[2]["error"]["code"], "bad_request");
}

#[test]
fn cancelling_a_parent_cancels_its_children() {
    let mut env = TestEnv::new();
    env.set("CHILD_QUEUE", "kids");
    let args = parent_args(&env, "root", &["--park-after", "0s"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(env.durun(&args).status.code(), Some(77));
    let cancelled = env.durun(&["cancel", "root"]);
    assert!(cancelled.status.success(), "{}", text(&cancelled.stderr));
    assert!(
        text(&cancelled.stderr).contains("task root-s1 cancelled with its parent root"),
        "{}",
        text(&cancelled.stderr)
    );
    for task in ["root", "root-s1", "root-s2"] {
        assert_eq!(env.inspect(task)["task"]["status"], "cancelled", "{task}");
    }
}

#[test]
fn the_python_sdk_spawns_and_joins_sync_and_asyncio() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", crate::env::sdk_path());
    env.write(
        "child.py",
        "import durun\ntopic = durun.args()['topic']\nout = durun.step('research', {'topic': topic}, lambda: topic.upper())\ndurun.result({'found': out, 'parent': durun.parent()})\n",
    );
    env.write(
        "parent.py",
        "import durun\nkids = [durun.spawn('research ' + t, ['python3', 'child.py'], {'topic': t}) for t in ['x', 'y']]\n\
         durun.result([j['output']['found'] for j in durun.join_all(kids)])\n",
    );
    env.write(
        "aparent.py",
        "import asyncio, durun\nasync def main():\n    kids = [await durun.aspawn('research ' + t, ['python3', 'child.py'], {'topic': t}) for t in ['x', 'y']]\n\
         \x20   joined = await durun.ajoin_all(kids)\n    durun.result([j['status'] for j in joined])\nasyncio.run(main())\n",
    );
    for (task, agent, output) in [
        ("sync", "parent.py", json!(["X", "Y"])),
        ("async", "aparent.py", json!(["completed", "completed"])),
    ] {
        let run = env.durun(&["run", "--task", task, "--", "python3", agent]);
        assert!(run.status.success(), "{task}: {}", text(&run.stderr));
        assert_eq!(env.inspect(task)["task"]["output"], output, "{task}");
        assert_eq!(
            env.inspect(&format!("{task}-s1"))["task"]["output"]["parent"],
            task
        );
    }
}

/// The root of a three-level tree of ten tasks, killed with SIGKILL (its
/// runner, and with it the runners of the children beside it) again and
/// again at varied moments, resumed each time: every task made once, each
/// task's `mutate` step acting under one key only, the root's output
/// right.
#[test]
fn a_tree_of_ten_tasks_killed_again_and_again_makes_each_task_once() {
    let env = TestEnv::new();
    let agent = agents_dir().join("tree_node.py");
    let agent = agent.to_string_lossy();
    let mut kills = 0;
    for (round, delay_ms) in [250u64, 600, 400, 900, 300, 700].into_iter().enumerate() {
        let args: Vec<&str> = if round == 0 {
            vec!["run", "--task", "root", "--", "python3", &agent]
        } else {
            vec!["resume", "root"]
        };
        let mut runner = env.spawn(&args, &format!("round{round}"));
        std::thread::sleep(Duration::from_millis(delay_ms));
        if runner.try_wait().expect("wait").is_none() {
            crate::env::signal(runner.id() as i32, libc::SIGKILL);
            kills += 1;
        }
        let _ = runner.wait();
        // The children beside it die with it (parent-death signal).
        wait_for("the killed tree to end", Duration::from_secs(10), || {
            crate::env::processes_in(&env.path("")).is_empty()
        });
    }
    let finished = env.durun(&["resume", "root"]);
    assert!(finished.status.success(), "{}", text(&finished.stderr));
    assert!(kills >= 2, "the runs were killed {kills} times");
    assert_eq!(env.inspect("root")["task"]["output"], 10);
    let mut expected = vec!["root".to_owned()];
    // Step 1 is each node's `work`: its children are steps 2 and on.
    for child in 2..=4 {
        let child = format!("root-s{child}");
        expected.extend([format!("{child}-s2"), format!("{child}-s3")]);
        expected.push(child);
    }
    expected.sort();
    assert_eq!(task_ids(&env), expected, "each task made once");
    // Each task's one `mutate` step acted under one key, however often it
    // ran again after a kill.
    let log = std::fs::read_to_string(env.path("work.log")).expect("work.log");
    let mut keys: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        std::collections::BTreeMap::new();
    for line in log.lines() {
        let (task, key) = line.split_once(' ').expect("task and key");
        keys.entry(task).or_default().insert(key);
    }
    assert_eq!(keys.len(), 10, "{log}");
    assert!(keys.values().all(|keys| keys.len() == 1), "{keys:?}");
}

#[test]
fn a_childs_tokens_count_against_its_parents_budget() {
    let mut env = TestEnv::new();
    env.set("DURUN_HEARTBEAT_MS", "250");
    env.set("DURUN_LEASE_STALE_MS", "1500");
    let ask = "import json, sys\ndef ask(m):\n    sys.stdout.write(json.dumps(m) + '\\n'); sys.stdout.flush()\n    a = json.loads(sys.stdin.readline())\n    assert a['ok'], a\n    return a\n";
    env.write(
        "child.py",
        &format!("{ask}o = ask({{'op': 'begin', 'id': 1, 'name': 'research', 'args': {{}}}})\nif not o.get('replayed'):\n    ask({{'op': 'commit', 'id': 2, 'step': o['step'], 'output': 'r', 'usage': {{'input_tokens': 400, 'output_tokens': 50}}}})\n"),
    );
    env.write(
        "parent.py",
        &format!(
            "{ask}o = ask({{'op': 'begin', 'id': 1, 'name': 'plan', 'args': {{}}}})\nif not o.get('replayed'):\n    ask({{'op': 'commit', 'id': 2, 'step': o['step'], 'output': 'p', 'usage': {{'input_tokens': 100, 'output_tokens': 20}}}})\n\
             kid = ask({{'op': 'spawn', 'id': 3, 'name': 'kid', 'command': ['python3', 'child.py'], 'queue': 'kids'}})['output']['task']\n\
             ask({{'op': 'join', 'id': 4, 'task': kid}})\nask({{'op': 'begin', 'id': 5, 'name': 'summarize', 'args': {{}}}})\n"
        ),
    );
    let parked = env.durun(&[
        "run",
        "--task",
        "p",
        "--max-tokens",
        "500",
        "--park-after",
        "0s",
        "--",
        "python3",
        "parent.py",
    ]);
    assert_eq!(parked.status.code(), Some(77), "{}", text(&parked.stderr));
    // The child gets what is left of the budget.
    assert_eq!(env.inspect("p-s2")["task"]["max_tokens"], 380);
    let mut pool = worker(&env, "w1", &["--queue", "kids"]);
    wait_for("the child to complete", Duration::from_secs(30), || {
        env.inspect("p-s2")["task"]["status"] == "completed"
    });
    assert!(stop(&mut pool).success());
    // 120 of its own and 450 of its child's: the next new step is refused.
    let resumed = env.durun(&["resume", "p"]);
    assert_eq!(resumed.status.code(), Some(78), "{}", text(&resumed.stderr));
    assert!(
        text(&resumed.stderr).contains("task p has spent 570 of its 500 tokens"),
        "{}",
        text(&resumed.stderr)
    );
}

#[test]
fn run_jobs_bounds_the_children_that_run_at_once_beside_the_agent() {
    let mut env = TestEnv::new();
    env.set("PYTHONPATH", crate::env::sdk_path());
    env.write(
        "child.py",
        "import durun, time\nt = durun.args()\nopen('spans.log', 'a').write(f'start {time.time()}\\n')\ntime.sleep(0.4)\nopen('spans.log', 'a').write(f'end {time.time()}\\n')\ndurun.result(t)\n",
    );
    env.write(
        "parent.py",
        "import durun\nkids = [durun.spawn('kid', ['python3', 'child.py'], i) for i in range(3)]\ndurun.result([j['output'] for j in durun.join_all(kids)])\n",
    );
    let run = env.durun(&[
        "run",
        "--task",
        "one-at-a-time",
        "--jobs",
        "1",
        "--",
        "python3",
        "parent.py",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        env.inspect("one-at-a-time")["task"]["output"],
        json!([0, 1, 2])
    );
    // One at a time: every start comes after the end before it.
    let log = std::fs::read_to_string(env.path("spans.log")).expect("spans");
    let events: Vec<(&str, f64)> = log
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(what, at)| (what, at.parse().expect("a time")))
        .collect();
    let mut running = 0;
    for (what, _) in &events {
        running += if *what == "start" { 1 } else { -1 };
        assert!(running <= 1, "two children at once: {log}");
    }
    assert_eq!(events.len(), 6, "{log}");
}

#[test]
fn durun_test_holds_on_a_parent_that_spawns_and_joins() {
    let env = TestEnv::new();
    let agent = agents_dir().join("tree_parent.py");
    let tested = env.durun(&["test", "--", "python3", &agent.to_string_lossy()]);
    let said = format!("{}{}", text(&tested.stdout), text(&tested.stderr));
    assert_eq!(tested.status.code(), Some(0), "{said}");
    assert!(
        said.contains("trials held: the agent survives a crash at every step tried"),
        "{said}"
    );
    // The kill before a spawn made its child lands, and holds.
    assert!(said.contains("research a  ok key×2"), "{said}");
}

/// A parent whose agent ends before its children do says so: their
/// runners die with its durun and leave them interrupted, and a completed
/// parent is never resumed to carry them on.
#[test]
fn a_parent_that_ends_before_its_children_says_they_are_left_interrupted() {
    let env = TestEnv::new();
    let parent = r#"
import json, sys
sys.stdout.write(json.dumps({"op": "spawn", "id": 1, "name": "slow", "command": ["sleep", "30"], "args": {}}) + "\n")
sys.stdout.flush()
answer = json.loads(sys.stdin.readline())
assert answer.get("ok"), answer
"#;
    let run = env.durun(&["run", "--task", "p", "--", "python3", "-c", parent]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains(
            "durun: warning: child task p-s1 had not ended when task p's run ended: stopped with it, it is left interrupted; `durun resume p-s1` carries it on"
        ),
        "{stderr}"
    );
    wait_for(
        "the child to read interrupted",
        Duration::from_secs(10),
        || env.inspect("p-s1")["task"]["status"] == "interrupted",
    );
}
