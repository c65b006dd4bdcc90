//! One behaviour story, generic over [`Journal`], told to every backend:
//! `SQLite` in memory always, PostgreSQL too when `DURUN_TEST_POSTGRES`
//! names a server (a schema of its own per story).

use serde_json::json;

use super::sqlite::SqliteJournal;
use super::*;
use crate::config::SyncMode;
use crate::json_text::JsonText;
use crate::lease::Holder;
use crate::settings::Settings;

mod created;
mod numbering;
mod queued;

fn task(id: &str) -> NewTask {
    NewTask {
        id: id.to_owned(),
        argv: vec!["agent".into(), "--flag".into()],
        cwd: "/tmp".into(),
        config: None,
        config_path: None,
        sync: SyncMode::Full,
        created_at: now(),
        max_tokens: None,
        max_cost_nanos: None,
        queue: None,
        retries: None,
        // Read back as written, on both journals.
        launch: crate::journal::Launch {
            stdin: Some(crate::config::StdinMode::Null),
            upstreams: [("OPENAI_BASE_URL".into(), "http://127.0.0.1:1/v1".into())].into(),
            preset: Some("codex".into()),
        },
    }
}

fn step(n: u64, status: StepStatus) -> StepRecord {
    StepRecord {
        args: JsonText::from_value(&json!({"big": 123_456_789_012_345_678_u64, "f": 1.5})),
        created_at: now(),
        started_at: now(),
        ..StepRecord::sample(n, status)
    }
}

fn me() -> Holder {
    Holder::current(None)
}

/// A runner on another host.
fn elsewhere() -> Holder {
    Holder {
        host: "elsewhere".into(),
        pid: 1,
        pid_start: None,
    }
}

fn started(journal: &mut dyn Journal, task: &str, holder: &Holder) -> u32 {
    match journal.start_run(task, holder, &now()).expect("start") {
        RunStart::Started { run, .. } => run,
        other => panic!("{task} did not start: {other:?}"),
    }
}

/// The run's end, as its runner records it; a failed run with what durun
/// said about it.
fn finish(journal: &mut dyn Journal, task: &str, run: u32, status: TaskStatus, code: Option<i32>) {
    let end = RunEnd {
        status,
        exit_code: code,
        finished_at: now(),
        error: (status == TaskStatus::Failed).then(|| format!("durun: {task} failed\n  why")),
        release: None,
    };
    journal
        .finish_run(task, run, &end, &RunStats::default())
        .expect("finish");
}

/// Each of `records` written as a new row.
fn fresh(records: &[StepRecord]) -> Vec<StepWrite<'_>> {
    records
        .iter()
        .map(|record| StepWrite {
            record,
            fresh: true,
        })
        .collect()
}

fn put(
    journal: &mut dyn Journal,
    task: &str,
    record: &StepRecord,
    fresh: bool,
    run: u32,
) -> anyhow::Result<()> {
    journal.put_steps(task, &[StepWrite { record, fresh }], run, None)
}

/// Steps that finish together share one commit, all or nothing; replay
/// reads them a page at a time.
fn group_commit(journal: &mut dyn Journal) {
    journal.create_task(&task("t1")).expect("create");
    let run = started(journal, "t1", &me());
    let records: Vec<StepRecord> = (1..=8).map(|n| step(n, StepStatus::Committed)).collect();
    let writes = fresh(&records);
    let stats = RunStats {
        executed_steps: 8,
        ..RunStats::default()
    };
    journal
        .put_steps("t1", &writes, run, Some(&stats))
        .expect("a group");
    assert_eq!(journal.replay_bounds("t1").expect("bounds"), (8, 8));
    assert_eq!(journal.runs("t1").expect("runs")[0].stats, stats);
    // A group with one bad row (an update of a step never written) writes
    // none of its rows.
    let new = step(9, StepStatus::Committed);
    let missing = step(12, StepStatus::Committed);
    let bad = [
        StepWrite {
            record: &new,
            fresh: true,
        },
        StepWrite {
            record: &missing,
            fresh: false,
        },
    ];
    journal
        .put_steps("t1", &bad, run, Some(&RunStats::default()))
        .expect_err("step 12 is missing");
    assert_eq!(journal.replay_bounds("t1").expect("bounds"), (8, 8));
    assert_eq!(journal.runs("t1").expect("runs")[0].stats, stats);
    let page: Vec<u64> = journal
        .steps_page("t1", 2, 3)
        .expect("page")
        .iter()
        .map(|record| record.step)
        .collect();
    assert_eq!(page, [3, 4, 5]);
    assert!(journal.steps_page("t1", 8, 3).expect("page").is_empty());
    // The next run's start reads what it may replay.
    finish(journal, "t1", run, TaskStatus::Interrupted, None);
    match journal.start_run("t1", &me(), &now()).expect("start") {
        RunStart::Started { recorded, .. } => assert_eq!(recorded, (8, 8)),
        other => panic!("t1 did not start: {other:?}"),
    }
}

/// A step goes from its intent to its result; what is read back is what
/// was written.
fn pending_to_committed(journal: &mut dyn Journal) {
    journal.create_task(&task("t2")).expect("create");
    let run = started(journal, "t2", &me());
    let mut record = step(1, StepStatus::Pending);
    put(journal, "t2", &record, true, run).expect("pending");
    record.status = StepStatus::Failed;
    record.error = Some(StepError {
        code: crate::protocol::ErrorCode::Timeout,
        message: "slow".into(),
    });
    record.seen_from = Some(3);
    put(journal, "t2", &record, false, run).expect("failed");
    record.status = StepStatus::Committed;
    record.error = None;
    record.output = Some(JsonText::from_value(&json!({"url": "x"})));
    record.tokens = 42;
    record.cost_nanos = Some(105_000);
    let stats = RunStats {
        executed_steps: 1,
        tokens_spent: 42,
        cost: crate::journal::Cost {
            spent_nanos: 105_000,
            ..crate::journal::Cost::default()
        },
        ..RunStats::default()
    };
    journal
        .put_steps(
            "t2",
            &[StepWrite {
                record: &record,
                fresh: false,
            }],
            run,
            Some(&stats),
        )
        .expect("commit");
    let steps = journal.steps("t2", false).expect("steps");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].status, StepStatus::Committed);
    assert_eq!(steps[0].output, record.output);
    assert_eq!(steps[0].args, record.args);
    assert_eq!(steps[0].seen_from, Some(3));
    assert_eq!(steps[0].cost_nanos, Some(105_000));
    let loaded = journal.task("t2").expect("task").expect("exists");
    assert_eq!((loaded.steps, loaded.tokens_spent), (1, 42));
    assert_eq!(loaded.cost.spent_nanos, 105_000);
}

/// One live runner at a time; a finished run frees the task.
fn leases(journal: &mut dyn Journal) {
    journal.create_task(&task("t3")).expect("create");
    assert_eq!(started(journal, "t3", &me()), 1);
    assert!(matches!(
        journal.start_run("t3", &elsewhere(), "b").expect("second"),
        RunStart::Locked(_)
    ));
    finish(journal, "t3", 1, TaskStatus::Failed, Some(1));
    assert_eq!(started(journal, "t3", &elsewhere()), 2);
    let runs: Vec<(u32, Option<i32>, Option<String>)> = journal
        .runs("t3")
        .expect("runs")
        .into_iter()
        .map(|run| (run.run, run.exit_code, run.error))
        .collect();
    assert_eq!(
        runs,
        [
            (1, Some(1), Some("durun: t3 failed\n  why".to_owned())),
            (2, None, None)
        ]
    );
}

/// A run that lost its lease writes nothing: not a step, not an output,
/// not a heartbeat; the new holder's rows stay as they are.
fn fenced_writes(journal: &mut dyn Journal) {
    journal.create_task(&task("t4")).expect("create");
    let old = started(journal, "t4", &me());
    put(journal, "t4", &step(1, StepStatus::Committed), true, old).expect("held");
    // The old run's end is recorded without its lease; another takes over.
    finish(journal, "t4", old, TaskStatus::Interrupted, None);
    let new = started(journal, "t4", &elsewhere());
    let mut theirs = step(2, StepStatus::Committed);
    theirs.attempts = 7;
    put(journal, "t4", &theirs, true, new).expect("the new holder writes");
    let mut stale = step(2, StepStatus::Committed);
    stale.attempts = 1;
    let refused = put(journal, "t4", &stale, false, old).expect_err("fenced");
    assert_eq!(
        refused.downcast_ref::<Fenced>(),
        Some(&Fenced(Standing::Lost))
    );
    let refused = put(journal, "t4", &step(3, StepStatus::Pending), true, old).expect_err("fenced");
    assert_eq!(
        refused.downcast_ref::<Fenced>(),
        Some(&Fenced(Standing::Lost))
    );
    journal
        .set_output("t4", old, &json!("late"))
        .expect_err("fenced output");
    assert_eq!(
        journal.heartbeat("t4", old).expect("heartbeat"),
        Standing::Lost
    );
    assert_eq!(
        journal.heartbeat("t4", new).expect("heartbeat"),
        Standing::Held
    );
    let steps = journal.steps("t4", false).expect("steps");
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1].attempts, 7, "the new holder's row is untouched");
    assert!(
        journal
            .task("t4")
            .expect("task")
            .expect("exists")
            .output
            .is_none()
    );
}

/// A cancel is final: the live run records what finishes but opens no
/// step, and no run starts again.
fn cancel_is_final(journal: &mut dyn Journal) {
    journal.create_task(&task("t5")).expect("create");
    let run = started(journal, "t5", &me());
    put(journal, "t5", &step(1, StepStatus::Pending), true, run).expect("intent");
    assert!(
        journal.request_cancel("t5", &me()).expect("cancel"),
        "a live runner holds it"
    );
    assert_eq!(
        journal.watch("t5", run).expect("watch"),
        Standing::Cancelled
    );
    let refused = put(journal, "t5", &step(2, StepStatus::Pending), true, run).expect_err("fenced");
    assert_eq!(
        refused.downcast_ref::<Fenced>(),
        Some(&Fenced(Standing::Cancelled))
    );
    put(journal, "t5", &step(1, StepStatus::Committed), false, run)
        .expect("a finished step is kept");
    finish(journal, "t5", run, TaskStatus::Completed, Some(0));
    let task = journal.task("t5").expect("task").expect("exists");
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert!(matches!(
        journal
            .start_run("t5", &elsewhere(), "later")
            .expect("start"),
        RunStart::Cancelled
    ));
}

fn signal(name: &str, data: serde_json::Value, id: Option<&str>) -> SignalRecord {
    SignalRecord {
        name: name.to_owned(),
        data,
        signal_id: id.map(str::to_owned),
        sent_by: "ann@ci".into(),
        sent_at: now(),
        taken_by: None,
    }
}

/// Signals are kept once per id, taken oldest first, one per `wait` step,
/// in the transaction that commits the step.
fn signals_are_kept_once_and_taken_oldest_first(journal: &mut dyn Journal) {
    journal.create_task(&task("t6")).expect("create");
    let run = started(journal, "t6", &me());
    let mut wait = step(1, StepStatus::Waiting);
    wait.kind = StepKind::Wait;
    wait.name = "go".into();
    wait.wake_at = Some(now());
    assert_eq!(
        journal
            .take_signal("t6", run, &mut wait, true)
            .expect("look"),
        None
    );
    assert_eq!(
        journal.steps("t6", false).expect("steps")[0].status,
        StepStatus::Waiting
    );
    assert!(!journal.signal_waiting("t6", "go").expect("look"));
    assert!(
        journal
            .send_signal("t6", &signal("go", json!(1), Some("a")))
            .expect("send")
    );
    assert!(
        !journal
            .send_signal("t6", &signal("go", json!(9), Some("a")))
            .expect("send"),
        "the same id is kept once"
    );
    assert!(
        journal
            .send_signal("t6", &signal("go", json!(2), None))
            .expect("send")
    );
    assert!(
        journal
            .send_signal("t6", &signal("other", json!(3), None))
            .expect("send")
    );
    assert!(journal.signal_waiting("t6", "go").expect("look"));
    let taken = journal
        .take_signal("t6", run, &mut wait, false)
        .expect("take")
        .expect("a signal");
    assert_eq!(
        (taken.data.clone(), taken.taken_by),
        (json!(1), Some(1)),
        "oldest first"
    );
    assert_eq!(wait.status, StepStatus::Committed);
    let recorded = &journal.steps("t6", false).expect("steps")[0];
    assert_eq!(
        recorded.output.as_ref().map(JsonText::value),
        Some(taken.output())
    );
    assert_eq!(recorded.wake_at, wait.wake_at);
    let mut second = step(2, StepStatus::Waiting);
    second.kind = StepKind::Wait;
    second.name = "go".into();
    let taken = journal
        .take_signal("t6", run, &mut second, true)
        .expect("take")
        .expect("a signal");
    assert_eq!(taken.data, json!(2));
    assert!(!journal.signal_waiting("t6", "go").expect("look"));
    let kept: Vec<Option<u64>> = journal
        .signals("t6")
        .expect("signals")
        .iter()
        .map(|signal| signal.taken_by)
        .collect();
    assert_eq!(kept, [Some(1), Some(2), None]);
    // A run that lost its lease takes nothing.
    let mut third = step(3, StepStatus::Waiting);
    third.name = "other".into();
    assert!(
        journal
            .take_signal("t6", run + 1, &mut third, true)
            .is_err()
    );
    assert!(journal.signal_waiting("t6", "other").expect("look"));
}

/// A budget is kept with the task.
fn a_budget_is_kept_with_the_task(journal: &mut dyn Journal) {
    journal.set_max_tokens("t6", Some(500)).expect("budget");
    assert_eq!(
        journal
            .task("t6")
            .expect("task")
            .expect("exists")
            .max_tokens,
        Some(500)
    );
}

/// A task's rows (its steps, signals and budget) move whole to another
/// journal, or not at all.
fn a_task_moves_whole(journal: &mut dyn Journal, other: &mut dyn Journal) {
    let rows = journal.export("t6").expect("export").expect("the task");
    assert_eq!(rows.steps.len(), 2);
    assert_eq!(rows.signals.len(), 3);
    other.import(&rows, false, &me()).expect("import");
    let moved = other.task("t6").expect("task").expect("imported");
    assert_eq!(moved.max_tokens, Some(500));
    assert_eq!(
        other.steps("t6", false).expect("steps")[1].idempotency_key,
        "k"
    );
    assert_eq!(
        other.signals("t6").expect("signals"),
        journal.signals("t6").expect("signals")
    );
    let again = other
        .import(&rows, false, &me())
        .expect_err("the task exists");
    assert_eq!(crate::error::exit_code_of(&again), crate::exit_code::CONFIG);
    // All or nothing: a row the journal cannot take leaves nothing behind.
    let mut broken = rows.clone();
    broken.task.insert("id".into(), json!("t7"));
    broken.steps[0].insert("no_such_column".into(), json!(1));
    for row in broken
        .runs
        .iter_mut()
        .chain(&mut broken.steps)
        .chain(&mut broken.signals)
    {
        row.insert("task_id".into(), json!("t7"));
    }
    other
        .import(&broken, false, &me())
        .expect_err("an unknown column");
    assert!(other.task("t7").expect("read").is_none());
}

/// The whole story on one journal (and a second one to move tasks to).
fn story(journal: &mut dyn Journal, other: &mut dyn Journal) {
    created::as_recorded(journal);
    created::and_started(journal);
    created::opened(journal);
    group_commit(journal);
    numbering::a_numbering_page_leaves_out_what_replays_by_content(journal);
    pending_to_committed(journal);
    leases(journal);
    fenced_writes(journal);
    cancel_is_final(journal);
    queued::retries_come_with_the_task(journal);
    queued::a_run_ends_with_its_workers_claim(journal);
    signals_are_kept_once_and_taken_oldest_first(journal);
    a_budget_is_kept_with_the_task(journal);
    a_task_moves_whole(journal, other);
}

#[test]
fn sqlite_tells_the_story() {
    story(
        &mut SqliteJournal::in_memory(),
        &mut SqliteJournal::in_memory(),
    );
}

#[test]
fn postgresql_tells_the_story() {
    let Ok(base) = std::env::var("DURUN_TEST_POSTGRES") else {
        // CI says PostgreSQL is required: its absence is a failure there.
        assert!(
            std::env::var_os("DURUN_REQUIRE_POSTGRES").is_none(),
            "DURUN_REQUIRE_POSTGRES is set and DURUN_TEST_POSTGRES is not"
        );
        eprintln!("skipped: DURUN_TEST_POSTGRES is not set");
        return;
    };
    let schema = format!("durun_story_{}", std::process::id());
    let mut admin = ::postgres::Client::connect(&base, ::postgres::NoTls).expect("connect");
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .expect("schema");
    let separator = if base.contains('?') { '&' } else { '?' };
    let url =
        format!("{base}{separator}options=-c%20search_path%3D{schema}&application_name={schema}");
    let settings = Settings::from_env(None);
    let mut journal = postgres::PostgresJournal::open(&url, true, &settings).expect("open");
    // Its tasks move to an embedded journal: from one backend to the other.
    story(&mut journal, &mut SqliteJournal::in_memory());
    // A session the server ended (as a restart does) no longer answers,
    // and says so: a worker drops it from its pool.
    assert!(journal.answers());
    admin
        .execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1",
            &[&schema],
        )
        .expect("terminate");
    assert!(!journal.answers());
    drop(journal);
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .expect("drop");
}

#[test]
fn refuses_a_journal_from_a_newer_durun() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("j.db");
    let settings = Settings::from_env(None);
    drop(SqliteJournal::open(&path, Access::Write, &settings).expect("create"));
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.pragma_update(None, "user_version", 99).expect("bump");
    drop(conn);
    let err = SqliteJournal::open(&path, Access::Write, &settings)
        .err()
        .expect("refused");
    assert_eq!(crate::error::exit_code_of(&err), crate::exit_code::JOURNAL);
    assert!(format!("{err:#}").contains("newer durun"), "{err:#}");
    assert!(SqliteJournal::open(&path, Access::Read, &settings).is_ok());
}

#[test]
fn creates_the_journal_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state/durun/journal.db");
    drop(SqliteJournal::open(&path, Access::Write, &Settings::from_env(None)).expect("create"));
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().expect("dir")), 0o700);
}
