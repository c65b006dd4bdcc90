//! The story's queued tasks: what comes with a submit, and what a
//! worker's run leaves when it ends.

use super::{finish, me, started, task};
use crate::journal::*;

/// A submitted task's retries come with it, in its transaction; a task
/// that cannot be created leaves none behind.
pub(super) fn retries_come_with_the_task(journal: &mut dyn Journal) {
    let submitted = NewTask {
        queue: Some("q".into()),
        retries: Some((2, 500)),
        ..task("t7")
    };
    journal.create_task(&submitted).expect("create");
    let again = NewTask {
        retries: Some((9, 1)),
        ..submitted.clone()
    };
    journal.create_task(&again).expect_err("the id is taken");
    let run = started(journal, "t7", &me());
    finish(journal, "t7", run, TaskStatus::Failed, Some(1));
    let retryable = journal
        .look(&crate::journal::Look {
            retryable: true,
            ..crate::journal::Look::default()
        })
        .expect("retryable")
        .retryable;
    let found: Vec<_> = retryable
        .iter()
        .filter(|task| task.id == "t7")
        .map(|task| (task.retries, task.backoff_ms, task.used))
        .collect();
    assert_eq!(found, [(2, 500, 0)]);
}

/// A worker's run ends with the worker's claim on its task released, in
/// the transaction of its end, and says it has ended before that commits.
pub(super) fn a_run_ends_with_its_workers_claim(journal: &mut dyn Journal) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let queued = NewTask {
        queue: Some("q".into()),
        ..task("t11")
    };
    journal.create_task(&queued).expect("create");
    let ids = ["t11".to_owned()];
    assert_eq!(journal.claim("q", &ids, "w1", None).expect("claim"), ids);
    assert!(
        journal
            .claim("q", &ids, "w2", None)
            .expect("claim")
            .is_empty()
    );
    let run = started(journal, "t11", &me());
    let ended = Arc::new(AtomicBool::new(false));
    let claim = Claim::new("w1".into(), Arc::clone(&ended));
    let end = RunEnd {
        status: TaskStatus::Interrupted,
        exit_code: Some(143),
        finished_at: now(),
        error: None,
        release: Some(claim.clone()),
    };
    journal
        .finish_run("t11", run, &end, &RunStats::default())
        .expect("finish");
    assert!(ended.load(Ordering::Acquire) && claim.released());
    let loaded = journal.task("t11").expect("task").expect("exists");
    assert_eq!(loaded.status, TaskStatus::Interrupted);
    // Another worker may take the task over at once.
    assert_eq!(journal.claim("q", &ids, "w2", None).expect("claim"), ids);
}
