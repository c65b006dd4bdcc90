//! A conversation's repeated prefix is journaled once (SPEC 21): a chat
//! agent's every request repeats the whole history, and the journal grows
//! with the conversation, not its square; every read still gives the
//! whole args, and replay is unchanged.

use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, agents_dir, text, wait_for};
use crate::servers::LlmServer;

const TURNS: usize = 60;

/// The bytes the journal holds for its steps and conversations: args,
/// outputs, and the conversation's nodes.
const ROW_BYTES: &str = "SELECT CAST((SELECT sum(length(args) + coalesce(length(output), 0)) FROM steps)
    + (SELECT coalesce(sum(length(hash) + coalesce(length(parent), 0) + length(message)), 0) FROM chat_nodes) AS BIGINT)";

/// The fake OpenAI server, as the chat agent's upstream.
fn chat_upstream(env: &mut TestEnv) -> LlmServer {
    let llm = LlmServer::start(env);
    env.set("OPENAI_BASE_URL", format!("{}/v1", llm.base()));
    llm
}

/// `durun run --task chat` of tests/agents/chat_agent.py for `turns`
/// turns, its output in `run1.out` and `run1.err`.
fn start_chat(env: &TestEnv, turns: usize) -> std::process::Child {
    let agent = agents_dir().join("chat_agent.py");
    let turns = turns.to_string();
    let args = [
        "run",
        "--task",
        "chat",
        "--",
        "python3",
        &agent.to_string_lossy(),
        &turns,
    ];
    env.spawn(&args, "run1")
}

#[test]
fn a_long_chat_journals_each_message_once_and_reads_and_replays_whole() {
    let mut env = TestEnv::new();
    let llm = chat_upstream(&mut env);
    // Killed halfway, then resumed: the turns before replay.
    let mut durun = start_chat(&env, TURNS);
    wait_for("half the turns", Duration::from_secs(120), || {
        std::fs::read_to_string(env.path("llm.port.count"))
            .ok()
            .and_then(|counts| serde_json::from_str::<Value>(&counts).ok())
            .and_then(|counts| counts.as_object().map(serde_json::Map::len))
            .is_some_and(|seen| seen >= TURNS / 2)
    });
    durun.kill().expect("SIGKILL durun");
    durun.wait().expect("reap");
    let resumed = env.durun(&["resume", "chat"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let printed: Value = text(&resumed.stdout)
        .lines()
        .find_map(|line| serde_json::from_str(line).ok())
        .expect("the agent's print");
    let counts = llm.counts();
    let counts: Vec<u64> = counts
        .as_object()
        .expect("counts")
        .values()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(counts.len(), TURNS);
    // The turn in flight at the kill may go again; no other.
    let again = counts.iter().filter(|count| **count > 1).count();
    assert!(
        again <= 1 && counts.iter().all(|count| *count <= 2),
        "turns replayed, not sent again: {counts:?}"
    );

    let distinct = printed["distinct_bytes"].as_i64().expect("distinct");
    let whole = printed["whole_bytes"].as_i64().expect("whole");
    let bound = 2 * distinct + 1024 * TURNS as i64;
    let journaled = env.sql_number(ROW_BYTES);
    assert!(
        journaled <= bound,
        "{journaled} bytes journaled for {distinct} distinct bytes (bound {bound})"
    );
    assert!(
        whole > 3 * bound,
        "the chat repeats itself: {whole} bytes whole"
    );

    // Every read gives the whole conversation back.
    let task = env.inspect("chat");
    let steps = task["steps"].as_array().expect("steps");
    let last = &steps.last().expect("a step")["args"]["body"]["messages"];
    assert_eq!(last.as_array().map(Vec::len), Some(2 * TURNS), "{last}");
    assert_eq!(last[0]["role"], "system");
    let exported = env.durun(&["export", "chat"]);
    assert!(exported.status.success(), "{}", text(&exported.stderr));
    assert!(
        !text(&exported.stdout).contains("durun_chain"),
        "an export is whole"
    );

    // Once no step leads to them, `gc` takes the messages out too.
    let nodes = "SELECT CAST(count(*) AS BIGINT) FROM chat_nodes";
    assert_eq!(env.sql_number(nodes), 2 * TURNS as i64);
    std::thread::sleep(Duration::from_millis(1100));
    let gc = env.durun(&["gc", "--older-than", "1s"]);
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert_eq!(env.sql_number(nodes), 0, "{}", text(&gc.stderr));

    // An import keeps the conversation once again.
    let file = env.write("chat.jsonl", &text(&exported.stdout));
    let imported = env.durun(&["import", "--task", "again", &file.to_string_lossy()]);
    assert!(imported.status.success(), "{}", text(&imported.stderr));
    assert_eq!(env.sql_number(nodes), 2 * TURNS as i64);
    let args = "SELECT CAST(sum(length(args)) AS BIGINT) FROM steps WHERE task_id = 'again'";
    assert!(
        env.sql_number(args) < 300 * TURNS as i64,
        "args kept as chains"
    );
    let again = env.inspect("again");
    let last = &again["steps"]
        .as_array()
        .expect("steps")
        .last()
        .expect("a step")["args"];
    assert_eq!(
        last["body"]["messages"].as_array().map(Vec::len),
        Some(2 * TURNS)
    );
}

/// A resumed chat replays each request by its bytes, not parsed: a step
/// whose args hash no longer matches its args (changed here by hand, which
/// only the bytes' hash can get past) still replays, and so do the later
/// ones, whose requests carry the replayed answers (kept in the upstream's
/// order, as the agent read them the first time); one recorded without a
/// request hash (an older durun's) is matched by its args, and goes
/// upstream again when they do not match.
#[test]
fn a_resumed_chat_replays_each_request_by_its_bytes_and_an_older_one_by_its_args() {
    const CHAT: usize = 6;
    let mut env = TestEnv::new();
    let llm = chat_upstream(&mut env);
    let hold = env.path("hold");
    env.set("HOLD_FILE", hold.to_string_lossy());
    env.set("HOLD_AFTER", (CHAT - 1).to_string());
    let mut durun = start_chat(&env, CHAT);
    crate::env::sigkill_once(
        &mut durun,
        "the turn before the last",
        Duration::from_secs(60),
        || env.path("hold.reached").exists(),
    );
    let hashed = "SELECT CAST(count(*) AS BIGINT) FROM steps WHERE request_hash IS NOT NULL";
    assert_eq!(env.sql_number(hashed), (CHAT - 1) as i64);

    // No request's args hash to these any more (each its own); the last
    // step is as an older durun wrote it.
    env.sql("UPDATE steps SET args_hash = idempotency_key");
    env.sql(
        "UPDATE steps SET request_hash = NULL
         WHERE step_index = (SELECT max(step_index) FROM steps)",
    );
    std::fs::write(&hold, "").expect("release");
    let resumed = env.durun(&["resume", "chat"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let mut counts: Vec<u64> = llm
        .counts()
        .as_object()
        .expect("counts")
        .values()
        .filter_map(Value::as_u64)
        .collect();
    counts.sort_unstable();
    // Turns 0 to 3 replayed by their bytes (the first too: the proxy has
    // the hashes before its first request), turn 4 sent again (its args
    // no longer match), turn 5 new.
    assert_eq!(counts, [1, 1, 1, 1, 1, 2], "{}", text(&resumed.stderr));
    let runs = &env.inspect("chat")["task"]["runs"];
    assert_eq!(runs[1]["replayed_steps"], (CHAT - 2) as u64);
    assert_eq!(env.inspect("chat")["task"]["status"], "completed");
}
