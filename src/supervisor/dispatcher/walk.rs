//! Every step transition, walked through the dispatcher alone: an
//! in-memory journal, the agent's two pipes in the test's hands, no agent
//! process, no loop thread and no sleeps. Each turn gives the dispatcher
//! one line of the agent (its event), lets it commit and answer (its
//! effects), and reads back what the agent was told, the rows the journal
//! holds, and the transitions the observers saw.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Parts, Supervisor};
use crate::journal::sqlite::SqliteJournal;
use crate::journal::{
    Journal, NewTask, RunEnd, RunStart, RunStats, Signals as _, StepRecord, StepStatus, TaskStatus,
};
use crate::lease::Holder;
use crate::report::{Event as Report, Reporter};
use crate::supervisor::agent_io::AgentIo;
use crate::supervisor::committer::Committer;
use crate::supervisor::inbox::Events;
use crate::supervisor::spec::RunSpec;
use crate::supervisor::{crash, socket};

/// What the observers saw: the transitions handed to the reporter.
#[derive(Default)]
struct Seen(Vec<String>);

impl Reporter for Seen {
    fn report(&mut self, event: &Report<'_>) {
        let seen = match event {
            Report::StepStarted { step, attempt, .. } => format!("opened {step} attempt {attempt}"),
            Report::StepReplayed { step, .. } => format!("replayed {step}"),
            Report::StepFinished { step, status, .. } => {
                format!("finished {step} {}", status.as_str())
            }
            _ => return,
        };
        self.0.push(seen);
    }
}

/// The agent's ends of its pipes: what it says, what it hears.
struct Agent {
    says: std::fs::File,
    hears: std::fs::File,
}

impl Agent {
    fn say(&mut self, line: &Value) {
        writeln!(self.says, "{line}").expect("the agent's stdout");
    }

    /// The one answer the dispatcher wrote: it is there by now, or never.
    fn hear(&mut self) -> Value {
        let mut bytes = Vec::new();
        let mut buffer = [0u8; 4096];
        while let Ok(read @ 1..) = self.hears.read(&mut buffer) {
            bytes.extend_from_slice(&buffer[..read]);
        }
        let text = String::from_utf8(bytes).expect("UTF-8");
        let mut lines = text.lines();
        let answer = lines.next().expect("the dispatcher answered");
        assert_eq!(lines.next(), None, "one answer a turn");
        serde_json::from_str(answer).expect("an answer is JSON")
    }
}

/// One run of `task` that gives the dispatcher `lines`, one a turn, and
/// ends as if the agent were killed (nothing recorded after the last
/// turn); the answers and what the observers saw.
fn run(journal: &mut SqliteJournal, task: &str, lines: &[Value]) -> (Vec<Value>, Vec<String>) {
    walk(journal, task, |dispatcher, agent| {
        lines
            .iter()
            .map(|line| {
                agent.say(line);
                turn(dispatcher, agent)
            })
            .collect()
    })
}

/// One turn of the dispatcher: it reads what the agent said, commits and
/// answers; the one answer the agent heard.
fn turn(dispatcher: &mut Supervisor<'_>, agent: &mut Agent) -> Value {
    dispatcher.read_agent();
    dispatcher.flush();
    dispatcher.io.write_out();
    agent.hear()
}

/// One run of `task` whose agent `play` plays, turn by turn; what it
/// returns, and what the observers saw. The run ends as if the agent were
/// killed.
fn walk<T>(
    journal: &mut SqliteJournal,
    task: &str,
    play: impl FnOnce(&mut Supervisor<'_>, &mut Agent) -> T,
) -> (T, Vec<String>) {
    let me = Holder::current(None);
    let now = crate::journal::now();
    let started = if journal.task(task).expect("task").is_some() {
        journal.start_run(task, &me, &now)
    } else {
        journal.create_and_start(&new_task(task), &me, &now)
    };
    let RunStart::Started {
        run,
        leased_at,
        recorded,
    } = started.expect("start")
    else {
        panic!("the run did not start");
    };
    assert_eq!(recorded, journal.replay_bounds(task).expect("bounds"));
    let tools = BTreeMap::new();
    let spec = spec(task, (run, recorded), leased_at, &tools);
    let (_, last_recorded) = recorded;
    let (events_tx, _events, wake) = Events::new().expect("inbox");
    let mut socket = socket::listen(events_tx.clone(), None).expect("socket");
    let (agent_reads, durun_writes) = rustix::pipe::pipe().expect("pipe");
    let (durun_reads, agent_writes) = rustix::pipe::pipe().expect("pipe");
    crate::os::set_nonblocking(&agent_reads).expect("non-blocking");
    let mut agent = Agent {
        says: agent_writes.into(),
        hears: agent_reads.into(),
    };
    let io = AgentIo::new(durun_writes.into(), durun_reads.into(), wake).expect("io");
    let (jobs, _) = mpsc::channel();
    let (_, landed) = mpsc::channel();
    // No committer thread: every batch is written on the dispatcher's.
    let committer = Committer::new(
        (jobs, landed),
        Box::new(|| Err(std::io::Error::other("no committer thread here"))),
        task,
        run,
    );
    let mut seen = Seen::default();
    let walked = {
        let mut dispatcher = Supervisor::new(Parts {
            spec: &spec,
            journal: &mut *journal,
            committer,
            reporter: &mut seen,
            io,
            events_tx,
            socket: &mut socket,
            last_recorded,
        });
        dispatcher.read_first_page();
        play(&mut dispatcher, &mut agent)
    };
    // Killed: the lease goes, what the run left open stays as it is.
    let end = RunEnd {
        status: TaskStatus::Interrupted,
        exit_code: Some(137),
        finished_at: crate::journal::now(),
        error: None,
        release: None,
    };
    journal
        .finish_run(task, run, &end, &RunStats::default())
        .expect("end");
    (walked, seen.0)
}

fn new_task(id: &str) -> NewTask {
    NewTask {
        id: id.to_owned(),
        argv: vec!["agent".into()],
        cwd: "/".into(),
        config: None,
        config_path: None,
        sync: crate::config::SyncMode::Full,
        created_at: crate::journal::now(),
        max_tokens: None,
        max_cost_nanos: None,
        queue: None,
        retries: None,
        launch: crate::journal::Launch::default(),
    }
}

fn spec<'a>(
    task: &'a str,
    (run, recorded): (u32, (u64, u64)),
    leased_at: Duration,
    tools: &'a BTreeMap<String, std::sync::Arc<crate::config::Tool>>,
) -> RunSpec<'a> {
    RunSpec {
        task_id: task,
        run,
        argv: &[],
        cwd: Path::new("/"),
        stdin: crate::config::StdinMode::default(),
        preset: None,
        upstreams: BTreeMap::new(),
        tools,
        leased_at,
        recorded,
        lease: crate::settings::LeaseTimes::default(),
        live: None,
        limiter: None,
        runtime_dir: None,
        park_after: Duration::from_secs(60),
        max_tokens: None,
        max_cost_nanos: None,
        budget_tree: Vec::new(),
        tokens_before: 0,
        cost_before: 0,
        budget_wait: false,
        fixed_now: None,
        proxy: None,
        prices: Box::leak(Box::default()),
        traceparent: None,
        crash_at: None,
        seeds: None,
        faults: crash::Faults::default(),
        journal_arg: None,
        child_jobs: None,
        parent: None,
        stops: None,
        panic_on_request: false,
    }
}

fn begin(id: u64, name: &str, args: &Value, effect: &str) -> Value {
    json!({"op": "begin", "id": id, "name": name, "args": args, "effect": effect})
}

/// The journal's rows of `task`, as (status, attempts).
fn statuses(journal: &mut SqliteJournal, task: &str) -> Vec<(StepStatus, u32)> {
    journal
        .steps(task, false)
        .expect("steps")
        .into_iter()
        .map(
            |StepRecord {
                 status, attempts, ..
             }| (status, attempts),
        )
        .collect()
}

#[test]
fn open_finish_fail_doubt_replay_and_divergence() {
    let mut journal = SqliteJournal::in_memory();
    let none = json!({});

    // A read step: opened, then finished by its commit; a mutate step:
    // opened once its intent is durable, then failed; another mutate step
    // opened (the agent went on from the failure) when the run is killed.
    let (answers, seen) = run(
        &mut journal,
        "t",
        &[
            begin(1, "plan", &none, "read"),
            json!({"op": "commit", "id": 2, "step": 1, "output": "the plan"}),
            begin(3, "pay", &json!({"usd": 5}), "mutate"),
            json!({"op": "fail", "id": 4, "step": 2, "error": "declined"}),
            begin(5, "ship", &none, "mutate"),
        ],
    );
    assert_eq!(
        (
            &answers[0]["replayed"],
            &answers[0]["step"],
            &answers[0]["attempt"]
        ),
        (&json!(false), &json!(1), &json!(1))
    );
    assert_eq!(answers[1], json!({"id": 2, "ok": true, "step": 1}));
    assert_eq!(answers[3]["ok"], true);
    let ship_key = answers[4]["idempotency_key"].clone();
    assert_eq!(answers[4]["in_doubt"], Value::Null);
    assert_eq!(
        seen,
        [
            "opened 1 attempt 1",
            "finished 1 committed",
            "opened 2 attempt 1",
            "finished 2 failed",
            "opened 3 attempt 1",
        ]
    );
    assert_eq!(
        statuses(&mut journal, "t"),
        [
            (StepStatus::Committed, 1),
            (StepStatus::Failed, 1),
            // The intent, durable before the agent was told to go.
            (StepStatus::Pending, 1),
        ]
    );

    // Resumed: the finished step and the failure the agent went on from
    // are replayed; the step in doubt is retried with its first key.
    let (answers, seen) = run(
        &mut journal,
        "t",
        &[
            begin(1, "plan", &none, "read"),
            begin(2, "pay", &json!({"usd": 5}), "mutate"),
            begin(3, "ship", &none, "mutate"),
            json!({"op": "commit", "id": 4, "step": 3, "output": "shipped"}),
        ],
    );
    assert_eq!(
        (&answers[0]["replayed"], &answers[0]["output"]),
        (&json!(true), &json!("the plan"))
    );
    assert_eq!(
        (&answers[1]["replayed"], &answers[1]["error"]["message"]),
        (&json!(true), &json!("declined"))
    );
    assert_eq!(
        (
            &answers[2]["attempt"],
            &answers[2]["in_doubt"],
            &answers[2]["idempotency_key"]
        ),
        (&json!(2), &json!(true), &ship_key)
    );
    assert_eq!(
        seen,
        [
            "replayed 1",
            "replayed 2",
            "opened 3 attempt 2",
            "finished 3 committed"
        ]
    );
    assert_eq!(
        statuses(&mut journal, "t"),
        [
            (StepStatus::Committed, 1),
            (StepStatus::Failed, 1),
            (StepStatus::Committed, 2),
        ]
    );

    // A changed path: divergence, answered without opening a step.
    let (answers, seen) = run(
        &mut journal,
        "t",
        &[begin(1, "plan", &json!({"v": 2}), "read")],
    );
    assert_eq!(
        (&answers[0]["ok"], &answers[0]["error"]["code"]),
        (&json!(false), &json!("divergence"))
    );
    assert!(seen.is_empty(), "{seen:?}");
    assert_eq!(statuses(&mut journal, "t").len(), 3);
}

#[test]
fn a_failure_the_agent_did_not_go_on_from_runs_again_with_its_key() {
    let mut journal = SqliteJournal::in_memory();
    let args = json!({"usd": 5});
    let (answers, _) = run(
        &mut journal,
        "u",
        &[
            begin(1, "pay", &args, "mutate"),
            json!({"op": "fail", "id": 2, "step": 1, "error": "timed out"}),
        ],
    );
    let key = answers[0]["idempotency_key"].clone();
    let (answers, seen) = run(
        &mut journal,
        "u",
        &[
            begin(1, "pay", &args, "mutate"),
            json!({"op": "commit", "id": 2, "step": 1, "output": "paid"}),
        ],
    );
    assert_eq!(
        (
            &answers[0]["replayed"],
            &answers[0]["attempt"],
            &answers[0]["idempotency_key"]
        ),
        (&json!(false), &json!(2), &key)
    );
    assert_eq!(answers[0]["in_doubt"], Value::Null);
    assert_eq!(seen, ["opened 1 attempt 2", "finished 1 committed"]);
    assert_eq!(statuses(&mut journal, "u"), [(StepStatus::Committed, 2)]);
}

#[test]
fn a_wait_takes_the_signal_sent_before_it_and_a_replay_answers_the_same() {
    let mut journal = SqliteJournal::in_memory();
    let plan = [
        begin(1, "plan", &json!({}), "read"),
        json!({"op": "commit", "id": 2, "step": 1, "output": "the plan"}),
    ];
    run(&mut journal, "w", &plan);
    let signal = crate::journal::SignalRecord {
        name: "approve".into(),
        data: json!({"approved": true}),
        signal_id: None,
        sent_by: "ann@ci".into(),
        sent_at: crate::journal::now(),
        taken_by: None,
    };
    assert!(journal.send_signal("w", &signal).expect("signal"));
    let wait = json!({"op": "wait", "id": 3, "name": "approve", "data": {"diff": "+1"}});
    let (answers, seen) = run(&mut journal, "w", &[plan[0].clone(), wait.clone()]);
    assert_eq!(
        (
            &answers[1]["output"]["signal"],
            &answers[1]["output"]["data"]
        ),
        (&json!("approve"), &json!({"approved": true}))
    );
    assert_eq!(
        seen,
        ["replayed 1", "opened 2 attempt 1", "finished 2 committed"]
    );
    let (again, seen) = run(&mut journal, "w", &[plan[0].clone(), wait]);
    assert_eq!(again[1]["output"], answers[1]["output"]);
    assert_eq!(seen, ["replayed 1", "replayed 2"]);
}

/// A model call through the proxy, as the loop hears of it; where it goes.
fn model_call(dispatcher: &mut Supervisor<'_>) -> crate::proxy::Verdict {
    let args = json!({"body": {"model": "m"}});
    let (reply, verdict) = tokio::sync::oneshot::channel();
    dispatcher.on_proxy(crate::proxy::ToLoop::Ask(crate::proxy::Ask {
        name: "openai POST /chat/completions".into(),
        effect: crate::protocol::Effect::Read,
        canonical: crate::step_key::canonical_json(&args).expect("canonical"),
        args,
        request_hash: "hash".into(),
        asked: None,
        reply,
    }));
    verdict.blocking_recv().expect("a verdict")
}

/// Whether a forwarded call is a step of its own (else part of the
/// agent's open step).
fn own(verdict: &crate::proxy::Verdict) -> bool {
    match verdict {
        crate::proxy::Verdict::Forward { own, .. } => *own,
        _ => panic!("the call was not forwarded"),
    }
}

/// A model call the agent makes right after it closed a step is a step of
/// its own, even when the loop hears of the call before it has read the
/// commit: the commit was in the pipe first, and is read first.
#[test]
fn a_model_call_after_a_commit_in_the_pipe_is_not_part_of_the_closed_step() {
    let mut journal = SqliteJournal::in_memory();
    let (verdict, _) = walk(&mut journal, "t", |dispatcher, agent| {
        agent.say(&begin(1, "quick", &json!({}), "read"));
        let opened = turn(dispatcher, agent);
        assert_eq!(opened["step"], 1, "{opened}");
        // Said, not yet read: the call comes in meanwhile.
        agent.say(&json!({"op": "commit", "id": 2, "step": 1, "output": 1}));
        let verdict = model_call(dispatcher);
        assert!(
            dispatcher.steps.innermost_begin().is_none(),
            "step 1 closed"
        );
        verdict
    });
    assert!(own(&verdict), "a step of its own, not part of step 1");
}

/// A model call a step's body makes is part of the step, even when the
/// loop hears of the call before it has read the step's `begin` (an agent
/// that does not wait for a `read` step's `begin`).
#[test]
fn a_model_call_after_a_begin_in_the_pipe_is_part_of_its_step() {
    let mut journal = SqliteJournal::in_memory();
    let (verdict, _) = walk(&mut journal, "t", |dispatcher, agent| {
        agent.say(&begin(1, "plan", &json!({}), "read"));
        let verdict = model_call(dispatcher);
        assert_eq!(dispatcher.steps.innermost_begin(), Some(1), "step 1 open");
        verdict
    });
    assert!(!own(&verdict), "part of step 1");
}
