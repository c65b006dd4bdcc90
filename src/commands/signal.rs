//! `durun signal`, `durun approve`, `durun reject`: signals for tasks that
//! wait (SPEC 8). A signal is a row in the journal: a live runner on any
//! host takes it within a tenth of a second, a parked task on its next
//! resume.

use anyhow::Result;
use serde_json::{Map, Value, json};

use crate::cli::{ApproveArgs, RejectArgs, SignalArgs};
use crate::error::Failure;
use crate::journal::{self, Access, Journal, Location, SignalRecord, StepKind};
use crate::prices::shown;
use crate::settings::Settings;
use crate::task::{shown_status, unknown_task};

pub(crate) fn signal(args: &SignalArgs, settings: &Settings) -> Result<i32> {
    crate::names::check_given_name("signal name", &args.name)?;
    let data = args.data.clone().unwrap_or(Value::Null);
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    send(
        journal.as_mut(),
        &location,
        settings,
        &args.task,
        (&args.name, data, args.id.clone()),
        &format!("sent `{}` to task {}", args.name, args.task),
    )
}

pub(crate) fn approve(args: &ApproveArgs, settings: &Settings) -> Result<i32> {
    if args.add_tokens.is_some() || args.add_cost_nanos.is_some() {
        let waits = add_budget(&args.task, args.add_tokens, args.add_cost_nanos, settings)?;
        if !waits {
            return Ok(0);
        }
    }
    let mut data = Map::new();
    data.insert("approved".to_owned(), Value::Bool(true));
    if let Some(extra) = &args.data {
        match extra.clone() {
            Value::Object(extra) => {
                data.extend(extra.into_iter().filter(|(key, _)| key != "approved"));
            }
            _ => {
                return Err(Failure::usage("--data of `approve` must be a JSON object",
                )
                .hint("it is merged into {\"approved\": true}, e.g. --data '{\"comment\": \"ship it\"}'")
                .into());
            }
        }
    }
    answer(&args.task, Value::Object(data), "approved", settings)
}

/// Raises `task`'s token budget by `tokens` and its budget in dollars by
/// `nanos` (SPEC 19); whether the task waits for a signal, which
/// `approve` then answers too.
fn add_budget(
    task: &str,
    tokens: Option<u64>,
    nanos: Option<u64>,
    settings: &Settings,
) -> Result<bool> {
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    let Some(record) = journal.task(task)? else {
        return Err(unknown_task(task, &location).into());
    };
    // Both checked before either is written: a refused raise changes nothing.
    let token_max = raise(
        task,
        tokens,
        record.max_tokens,
        ("token budget", "--max-tokens N"),
    )?;
    let cost_max = raise(
        task,
        nanos,
        record.max_cost_nanos,
        ("budget in dollars", "--max-usd X"),
    )?;
    if let Some((more, max)) = token_max {
        let raised = max.saturating_add(more);
        journal.set_max_tokens(task, Some(raised))?;
        crate::report::say(&format!(
            "task {task}: token budget {max} -> {raised}, {} left; `durun resume {task}` goes on",
            raised.saturating_sub(record.tokens_spent)
        ));
    }
    if let Some((more, max)) = cost_max {
        let raised = max.saturating_add(more);
        journal.set_max_cost(task, Some(raised))?;
        crate::report::say(&format!(
            "task {task}: budget {} -> {}, {} left; `durun resume {task}` goes on",
            shown(max),
            shown(raised),
            shown(raised.saturating_sub(record.cost.spent_nanos))
        ));
    }
    let waiting = crate::task::waiting_step(journal.as_mut(), task)?;
    Ok(waiting.is_some_and(|step| step.kind == StepKind::Wait))
}

/// `more` for budget `max` of `task` (`what` it is, and the `resume`
/// option that gives a task one), refused when the task has none.
fn raise(
    task: &str,
    more: Option<u64>,
    max: Option<u64>,
    (what, give): (&str, &str),
) -> Result<Option<(u64, u64)>, Failure> {
    let Some(more) = more else {
        return Ok(None);
    };
    let max = max.ok_or_else(|| {
        Failure::usage(format!("task {task} has no {what} to raise"))
            .hint(format!("`durun resume {task} {give}` gives it one"))
    })?;
    Ok(Some((more, max)))
}

pub(crate) fn reject(args: &RejectArgs, settings: &Settings) -> Result<i32> {
    answer(
        &args.task,
        json!({"approved": false, "reason": args.reason}),
        "rejected",
        settings,
    )
}

/// Sends `data` to the `wait` step the task waits on, under its name.
fn answer(task: &str, data: Value, verb: &str, settings: &Settings) -> Result<i32> {
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    if journal.task(task)?.is_none() {
        return Err(unknown_task(task, &location).into());
    }
    let waiting = crate::task::waiting_step(journal.as_mut(), task)?;
    let Some(name) = waiting
        .filter(|step| step.kind == StepKind::Wait)
        .map(|step| step.name)
    else {
        return Err(Failure::config(format!("task {task} waits for no signal"))
            .hint(format!(
                "`durun inspect {task}` shows where it stands; `durun signal {task} NAME` sends a signal a later `wait` takes"
            ))
            .into());
    };
    send(
        journal.as_mut(),
        &location,
        settings,
        task,
        (&name, data, None),
        &format!("{verb} task {task} (the signal `{name}`)"),
    )
}

fn send(
    journal: &mut dyn Journal,
    location: &Location,
    settings: &Settings,
    task: &str,
    (name, data, signal_id): (&str, Value, Option<String>),
    said: &str,
) -> Result<i32> {
    let Some(record) = journal.task(task)? else {
        return Err(unknown_task(task, location).into());
    };
    let status = shown_status(&record, settings);
    if matches!(
        status,
        journal::TaskStatus::Completed | journal::TaskStatus::Cancelled
    ) {
        return Err(
            Failure::config(format!("task {task} is {status}; it takes no more signals"))
                .hint("a signal goes to a task that runs, waits or can be resumed")
                .into(),
        );
    }
    let signal = SignalRecord {
        name: name.to_owned(),
        data,
        signal_id: signal_id.clone(),
        sent_by: settings.operator(),
        sent_at: journal::now(),
        taken_by: None,
    };
    if !journal.send_signal(task, &signal)? {
        crate::report::say(&format!(
            "task {task} already has the signal with id {}; it is kept once",
            signal_id.unwrap_or_default()
        ));
        return Ok(0);
    }
    let next = match status {
        journal::TaskStatus::Running => "its runner takes it now".to_owned(),
        status if status.is_parked() => format!("`durun resume {task}` continues it"),
        _ => format!("it is taken when the task waits for it (`durun resume {task}`)"),
    };
    crate::report::say(&format!("{said}; {next}"));
    Ok(0)
}
