//! The story's first part: a task as its creation writes it, alone and
//! with its first run.

use super::{elsewhere, me, task};
use crate::config::SyncMode;
use crate::journal::*;

/// A new task reads back as `NewTask::record` says (what `run` carries on
/// with, unread), run at once or submitted, with a config and a budget.
pub(super) fn as_recorded(journal: &mut dyn Journal) {
    let tasks = [
        NewTask {
            config: Some("[proxy]\nenabled = false\n".into()),
            config_path: Some("/tmp/durun.toml".into()),
            sync: SyncMode::Normal,
            max_tokens: Some(12_345),
            ..task("t8")
        },
        NewTask {
            queue: Some("q".into()),
            ..task("t9")
        },
    ];
    for new in tasks {
        journal.create_task(&new).expect("create");
        let read = journal.task(&new.id).expect("read").expect("the task");
        assert_eq!(format!("{read:?}"), format!("{:?}", new.record()));
    }
}

/// `durun run`'s new task and its first run, made together: the task
/// leased and running, its run open; the same id again is refused and
/// changes nothing; the run's end keeps its counts.
pub(super) fn and_started(journal: &mut dyn Journal) {
    let first = journal.create_and_start(&task("t10"), &me(), &now());
    assert!(
        matches!(first, Ok(RunStart::Started { run: 1, .. })),
        "{first:?}"
    );
    let held = |journal: &mut dyn Journal| {
        let read = journal.task("t10").expect("read").expect("the task");
        let lease = read.lease.expect("a lease");
        (read.status, read.runs, lease.host, lease.pid, lease.run)
    };
    let expected = (TaskStatus::Running, 1, me().host, me().pid, 1);
    assert_eq!(held(journal), expected);
    let second = journal.start_run("t10", &elsewhere(), "b");
    assert!(matches!(second, Ok(RunStart::Locked(_))), "{second:?}");
    let again = journal.create_and_start(&task("t10"), &elsewhere(), &now());
    assert!(again.is_err(), "the id is taken");
    assert_eq!(held(journal), expected);
    let (replayed_steps, executed_steps, tokens_spent, tokens_saved) = (2, 3, 40, 50);
    let stats = RunStats {
        replayed_steps,
        replays_noted: replayed_steps,
        executed_steps,
        tokens_spent,
        tokens_saved,
        // Money read back as written (SPEC 19).
        cost: crate::journal::Cost {
            spent_nanos: 7_000,
            saved_nanos: 9_000,
            unpriced_steps: 1,
        },
    };
    let end = RunEnd {
        status: TaskStatus::Completed,
        exit_code: Some(0),
        finished_at: now(),
        error: None,
        release: None,
    };
    journal.finish_run("t10", 1, &end, &stats).expect("finish");
    let runs = journal.runs("t10").expect("runs");
    let ended = runs
        .iter()
        .map(|run| (run.exit_code, run.finished_at.clone(), run.stats));
    assert_eq!(
        ended.collect::<Vec<_>>(),
        [(Some(0), Some(end.finished_at), stats)]
    );
    let read = journal.task("t10").expect("read").expect("the task");
    assert_eq!(
        (read.status, read.lease.is_none()),
        (TaskStatus::Completed, true)
    );
}

/// A resume's start that reads the task first: nothing is written where
/// the row says not to start; otherwise the row is the task as it stood
/// before the start, and the start is `start_run`'s.
pub(super) fn opened(journal: &mut dyn Journal) {
    let all = |_: &TaskRecord| true;
    let unknown = journal.open_run("t-none", &me(), &now(), &all);
    assert!(matches!(unknown, Ok(Opened::Unknown)), "{unknown:?}");
    // t10 completed in `and_started`.
    let unfinished = |task: &TaskRecord| task.status != TaskStatus::Completed;
    match journal.open_run("t10", &me(), &now(), &unfinished) {
        Ok(Opened::Read(read)) => assert_eq!(read.status, TaskStatus::Completed),
        other => panic!("t10 was not only read: {other:?}"),
    }
    assert_eq!(
        journal.runs("t10").expect("runs").len(),
        1,
        "no run written"
    );
    journal.create_task(&task("t-opened")).expect("create");
    let before = journal.task("t-opened").expect("read").expect("the task");
    match journal.open_run("t-opened", &me(), &now(), &all) {
        Ok(Opened::Tried(
            read,
            RunStart::Started {
                run: 1, recorded, ..
            },
        )) => {
            assert_eq!(format!("{read:?}"), format!("{before:?}"));
            assert_eq!(recorded, journal.replay_bounds("t-opened").expect("bounds"));
        }
        other => panic!("t-opened did not start: {other:?}"),
    }
    let held = journal.task("t-opened").expect("read").expect("the task");
    assert_eq!(
        (held.status, held.runs, held.lease.map(|lease| lease.host)),
        (TaskStatus::Running, 1, Some(me().host))
    );
    let second = journal.open_run("t-opened", &elsewhere(), &now(), &all);
    assert!(
        matches!(second, Ok(Opened::Tried(_, RunStart::Locked(_)))),
        "{second:?}"
    );
    let refused = journal.open_run("t-opened", &elsewhere(), &now(), &|_| false);
    assert!(matches!(refused, Ok(Opened::Read(_))), "{refused:?}");
    assert_eq!(
        journal.runs("t-opened").expect("runs").len(),
        1,
        "no run written"
    );
}
