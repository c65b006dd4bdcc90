//! What every command says about a task: the status a person sees, its
//! command as a shell line, and the error for a task that is not there.

pub(crate) mod crashes;
pub(crate) mod events;
pub(crate) mod live;

use std::path::Path;
use std::time::SystemTime;

use crate::config::{Config, SyncMode};
use crate::error::{Failure, Kind};
use crate::journal::{
    self, Journal, Location, NewTask, StepKind, StepRecord, StepStatus, TaskRecord, TaskStatus,
};
use crate::lease;
pub(crate) use crate::names::{check_queue, check_task_id};
use crate::settings::Settings;

/// A task's budgets as given on the command line (SPEC 9 and 19).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Budget {
    pub(crate) tokens: Option<u64>,
    pub(crate) cost_nanos: Option<u64>,
}

/// A new task `id` of `argv`, started in `cwd`: the config `--config`
/// names or `cwd` holds, the sync mode the environment or else the config
/// chooses, the budget given or else the config's.
pub(crate) fn new_task(
    id: String,
    argv: &[String],
    cwd: &Path,
    config: Option<&Path>,
    budget: Budget,
    queue: Option<String>,
    settings: &Settings,
) -> anyhow::Result<NewTask> {
    let (config, config_path) = Config::discover(config, cwd)?;
    Ok(NewTask {
        id,
        argv: argv.to_vec(),
        cwd: cwd.to_string_lossy().into_owned(),
        config: config_path.is_some().then(|| config.source.clone()),
        config_path: config_path.map(|path| path.to_string_lossy().into_owned()),
        sync: settings.sync()?.or(config.sync).unwrap_or(SyncMode::Full),
        created_at: journal::now(),
        max_tokens: budget.tokens.or(config.max_tokens),
        max_cost_nanos: budget.cost_nanos.or(config.max_cost_nanos),
        queue,
        retries: None,
        launch: crate::journal::Launch::default(),
    })
}

/// The status a person should see: a `running` task whose runner is gone
/// is `interrupted`.
pub(crate) fn shown_status(task: &TaskRecord, settings: &Settings) -> TaskStatus {
    if task.status != TaskStatus::Running {
        return task.status;
    }
    let live = task.lease.as_ref().is_some_and(|lease| {
        lease::is_live(
            lease,
            settings.holder(),
            journal::now_ms(),
            settings.lease.stale,
        )
    });
    if live {
        TaskStatus::Running
    } else {
        TaskStatus::Interrupted
    }
}

/// A task as a person should see it, derived once when it is read: its
/// status, and the step it waits on with whether a live runner keeps the
/// agent waiting (`live`) or the task is parked.
pub(crate) struct Shown {
    pub(crate) status: TaskStatus,
    pub(crate) waiting: Option<StepRecord>,
    pub(crate) live: bool,
}

impl Shown {
    /// Whether a live runner drives the task (running, or waiting live).
    pub(crate) fn driven(&self) -> bool {
        self.status == TaskStatus::Running || self.live
    }
}

/// How `task` looks now: a running task whose agent waits live on a
/// `wait` or `sleep` step is `waiting` or `sleeping` (SPEC 8), and
/// `running` again once the step is answered.
pub(crate) fn shown(
    journal: &mut dyn Journal,
    task: &TaskRecord,
    settings: &Settings,
) -> anyhow::Result<Shown> {
    let status = shown_status(task, settings);
    Ok(match status {
        TaskStatus::Running => match waiting_step(journal, &task.id)? {
            Some(step) => Shown {
                status: if step.kind == StepKind::Sleep {
                    TaskStatus::Sleeping
                } else {
                    TaskStatus::Waiting
                },
                waiting: Some(step),
                live: true,
            },
            None => Shown {
                status,
                waiting: None,
                live: false,
            },
        },
        status if status.is_parked() => Shown {
            status,
            waiting: waiting_step(journal, &task.id)?,
            live: false,
        },
        status => Shown {
            status,
            waiting: None,
            live: false,
        },
    })
}

/// The step the task waits on: its latest `waiting` step (parallel steps
/// may have come after it, so the last few are looked at).
pub(crate) fn waiting_step(
    journal: &mut dyn Journal,
    task: &str,
) -> anyhow::Result<Option<StepRecord>> {
    let mut waiting = None;
    journal.visit_steps(task, false, Some(256), &mut |step| {
        if step.status == StepStatus::Waiting {
            waiting = Some(step);
        }
        Ok(())
    })?;
    Ok(waiting)
}

/// When a waiting step's time comes: a sleep's wake time, a wait's
/// timeout.
pub(crate) fn wake_time(step: &StepRecord) -> Option<SystemTime> {
    step.wake_at.as_deref().and_then(crate::clock::parse)
}

/// Whether a parked task would go on if started now: its signal came or
/// its time did. A task parked on no step it can find is ready.
pub(crate) fn is_ready(
    journal: &mut dyn Journal,
    task: &str,
    now: SystemTime,
) -> anyhow::Result<bool> {
    Ok(readiness(journal, task, now)?.0)
}

/// [`is_ready`], and the time the task waits for, if any (a sleep's
/// wake time, a wait's timeout): it is ready by then at the latest.
pub(crate) fn readiness(
    journal: &mut dyn Journal,
    task: &str,
    now: SystemTime,
) -> anyhow::Result<(bool, Option<SystemTime>)> {
    let Some(step) = waiting_step(journal, task)? else {
        return Ok((true, None));
    };
    let wake = wake_time(&step);
    let due = wake.is_some_and(|at| now >= at);
    let ready = match step.kind {
        StepKind::Wait => due || journal.signal_waiting(task, &step.name)?,
        // A join is ready once its child has ended; at once for a child
        // without a queue, which runs only beside its parent's agent.
        StepKind::Join => {
            due || step.args.value()["task"]
                .as_str()
                .map(|child| journal.task(child))
                .transpose()?
                .flatten()
                .is_none_or(|child| {
                    child.queue.is_none()
                        || matches!(
                            child.status,
                            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
                        )
                })
        }
        _ => due,
    };
    Ok((ready, wake))
}

/// The notice of a parked task that is not ready (exit 77), or `None`
/// when it may run.
pub(crate) fn still_parked(
    journal: &mut dyn Journal,
    task: &TaskRecord,
    now: SystemTime,
) -> anyhow::Result<Option<Failure>> {
    if is_ready(journal, &task.id, now)? {
        return Ok(None);
    }
    Ok(waiting_step(journal, &task.id)?.map(|step| parked_notice(&task.id, &step)))
}

/// For a child task (SPEC 16), `PARENT-sN` whose parent's step N is a
/// `spawn`: the parent's id and the args it was spawned with, as JSON.
pub(crate) fn parent_of(
    journal: &mut dyn Journal,
    id: &str,
) -> anyhow::Result<Option<(String, String)>> {
    let Some((parent, step)) = id.rsplit_once("-s") else {
        return Ok(None);
    };
    let Ok(step) = step.parse::<u64>() else {
        return Ok(None);
    };
    if parent.is_empty() || journal.task(parent)?.is_none() {
        return Ok(None);
    }
    let spawned = journal
        .step_versions(parent, step)?
        .into_iter()
        .find(|version| version.kind == StepKind::Spawn && version.status != StepStatus::Discarded);
    Ok(spawned.map(|step| (parent.to_owned(), step.args.value()["args"].to_string())))
}

/// Whether `id` is `PARENT-sN`: a child `parent` spawned (SPEC 16).
pub(crate) fn is_child_of(id: &str, parent: &str) -> bool {
    id.strip_prefix(parent)
        .and_then(|rest| rest.strip_prefix("-s"))
        .is_some_and(|step| !step.is_empty() && step.bytes().all(|byte| byte.is_ascii_digit()))
}

/// The children a task spawned, in the order it spawned them.
pub(crate) fn children(journal: &mut dyn Journal, id: &str) -> anyhow::Result<Vec<TaskRecord>> {
    let mut children: Vec<TaskRecord> = journal
        .tasks_with_prefix(&format!("{id}-s"))?
        .into_iter()
        .filter(|task| is_child_of(&task.id, id))
        .collect();
    children.sort_by_key(|task| task.id[id.len() + 2..].parse::<u64>().unwrap_or(u64::MAX));
    Ok(children)
}

/// The tasks whose budgets cover `task` along with other tasks (SPEC 16,
/// 19): its ancestors with a budget, and itself when it has a budget and
/// children. A run of `task` reserves its model calls against them in the
/// journal, where the other tasks of the tree reserve too.
pub(crate) fn budget_tree(
    journal: &mut dyn Journal,
    task: &TaskRecord,
) -> anyhow::Result<Vec<String>> {
    let budgeted = |task: &TaskRecord| task.max_tokens.is_some() || task.max_cost_nanos.is_some();
    let mut tree = Vec::new();
    if budgeted(task) && !children(journal, &task.id)?.is_empty() {
        tree.push(task.id.clone());
    }
    let mut id = task.id.as_str();
    while let Some((parent, step)) = id.rsplit_once("-s") {
        if parent.is_empty() || step.parse::<u64>().is_err() {
            break;
        }
        let Some(record) = journal.task(parent)? else {
            break;
        };
        if budgeted(&record) {
            tree.push(record.id);
        }
        id = parent;
    }
    Ok(tree)
}

/// The tokens the task's children, and theirs, have spent: they count
/// against its budget (SPEC 16).
pub(crate) fn descendants_spent(journal: &mut dyn Journal, id: &str) -> anyhow::Result<(u64, u64)> {
    let (mut tokens, mut nanos) = (0, 0);
    let mut parents = vec![id.to_owned()];
    while let Some(parent) = parents.pop() {
        for child in children(journal, &parent)? {
            tokens += child.tokens_spent;
            nanos += child.cost.spent_nanos;
            parents.push(child.id);
        }
    }
    Ok((tokens, nanos))
}

/// A task's place in a tree of tasks (SPEC 16).
#[derive(Default)]
pub(crate) struct Family {
    pub(crate) parent: Option<String>,
    /// Each child's id and status as shown.
    pub(crate) children: Vec<(String, TaskStatus)>,
}

pub(crate) fn family(
    journal: &mut dyn Journal,
    task: &TaskRecord,
    settings: &Settings,
) -> anyhow::Result<Family> {
    Ok(Family {
        parent: parent_of(journal, &task.id)?.map(|(parent, _)| parent),
        children: children(journal, &task.id)?
            .iter()
            .map(|child| (child.id.clone(), shown_status(child, settings)))
            .collect(),
    })
}

/// What a parked task waits for and how to continue it (exit 77).
pub(crate) fn parked_notice(task: &str, step: &StepRecord) -> Failure {
    let number = step.step;
    match step.kind {
        StepKind::Sleep => Failure::new(Kind::Parked,
            format!(
                "task {task} sleeps until {} (step {number}); it is parked, not failed",
                step.wake_at.as_deref().unwrap_or("?")
            ),
        )
        .hint(format!(
            "`durun resume {task}` continues it once that time has come (before, it parks again at once); `durun resume --all` from a timer picks it up"
        )),
        StepKind::Join => Failure::new(Kind::Parked,
            format!(
                "task {task} waits for its child task {} to end (step {number}); it is parked, not failed",
                step.args.value()["task"].as_str().unwrap_or("?")
            ),
        )
        .hint(format!(
            "`durun resume {task}` continues it once the child has ended (before, it parks again at once); `durun resume --all` or a worker picks it up"
        )),
        _ => Failure::new(Kind::Parked,
            format!(
                "task {task} waits for the signal `{}` (step {number}); it is parked, not failed",
                step.name
            ),
        )
        .hint(format!(
            "send it with `durun approve {task}`, `durun reject {task}` or `durun signal {task} {} --data JSON`, then `durun resume {task}`",
            step.name
        )),
    }
}

/// What a task runs and where, for a person about to run what a file
/// said: `` `python3 agent.py` in /srv/agent ``.
pub(crate) fn runs_in(argv: &[String], cwd: &str) -> String {
    format!("`{}` in {cwd}", shell_words(argv))
}

/// An argv as a person would type it.
pub(crate) fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|word| {
            if !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c))
            {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn unknown_task(id: &str, location: &Location) -> Failure {
    let place = location.describe();
    Failure::config(format!("no task {id} in {place}"))
        .hint("`durun inspect` lists the tasks; --journal or DURUN_JOURNAL chooses the journal")
}

/// A new id that sorts by time: `20261129-121608-3fa9c2d41b7e8a05`. 64
/// random bits: a million tasks made in the same second collide with a
/// chance of about 3 in 100 million (24 bits collided in a burst of
/// thousands).
pub(crate) fn new_task_id() -> String {
    use std::fmt::Write as _;
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let digits: String = now.chars().filter(char::is_ascii_digit).collect();
    let mut random = [0u8; 8];
    if let Ok(mut urandom) = std::fs::File::open("/dev/urandom") {
        use std::io::Read as _;
        let _ = urandom.read_exact(&mut random);
    }
    if random == [0; 8] {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos() as u64);
        random = (nanos ^ (u64::from(std::process::id()) << 32)).to_le_bytes();
    }
    let mut id = format!("{}-{}-", &digits[..8], &digits[8..14]);
    for byte in random {
        let _ = write!(id, "{byte:02x}");
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_words() {
        let id = new_task_id();
        assert_eq!(id.len(), 32, "{id}");
        assert!(check_task_id(&id).is_ok());
        assert!(check_task_id("ci-1234:build.2").is_ok());
        assert!(check_task_id("a b").is_err());
        assert!(check_task_id("").is_err());
    }

    #[test]
    fn argv_reads_as_a_shell_line() {
        assert_eq!(
            shell_words(&["python3".into(), "my agent.py".into(), "it's".into()]),
            r"python3 'my agent.py' 'it'\''s'"
        );
    }
}
