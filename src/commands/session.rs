//! Drives one run of a task: lease, supervisor, and the record of its end.
//! Shared by `run` and `resume`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::cli::Limits;
use crate::config::{Config, SyncMode};
use crate::error::Failure;
use crate::exit_code;
use crate::journal::{self, Journal, RunEnd, RunStart, StepStatus, TaskRecord, TaskStatus};
use crate::protocol::Effect;
use crate::report::{self, Event};
use crate::settings::Settings;
use crate::supervisor::{self, RunSpec};

/// The coding-agent CLI `task` runs, and where its program is in its
/// command: `--preset` given to this command, else to its first run, else
/// the one its program's name says.
fn preset_of(
    task: &TaskRecord,
    limits: Limits,
) -> Result<Option<(&'static crate::presets::Preset, Option<usize>)>> {
    use crate::presets::{self, Choice};
    let chosen = match (limits.preset, &task.launch.preset) {
        (Some(choice), _) => Some(choice),
        (None, Some(name)) => Some(Choice::parse(name).map_err(|err| {
            anyhow::anyhow!(
                "task {} was started with a preset this durun lacks: {err}",
                task.id
            )
        })?),
        (None, None) => None,
    };
    let found = presets::find(&task.argv);
    Ok(match chosen {
        None => found.map(|(preset, at)| (preset, Some(at))),
        Some(Choice::None) => None,
        // Where the named CLI is in the command, if it can be told: a
        // command whose program is not the CLI's (a script, `sh -c`) gets
        // no arguments from the preset, only its variables, stdin and
        // ignored fields.
        Some(Choice::Preset(preset)) => Some((
            preset,
            found
                .filter(|(named, _)| *named == preset)
                .map(|(_, at)| at),
        )),
    })
}

/// The tools a task replays against: the tools it started with.
fn recorded_config(task: &TaskRecord) -> Result<Config> {
    Ok(match &task.config {
        Some(text) => Config::parse(text)
            .with_context(|| format!("the recorded config of task {} is invalid", task.id))?,
        None => Config::default(),
    })
}

/// The agent's stdin: given to this command, else the task's (its first
/// run's `--stdin`, or its durun.toml), else its CLI's.
fn stdin_of(
    limits: Limits,
    task: &TaskRecord,
    config: &Config,
    preset: Option<(&'static crate::presets::Preset, Option<usize>)>,
) -> crate::config::StdinMode {
    (limits.stdin.or(task.launch.stdin).or(config.agent_stdin))
        .or_else(|| preset.map(|_| crate::presets::stdin()))
        .unwrap_or_default()
}

/// How a run that [`drive`] carries on began.
#[derive(Clone, Copy)]
pub(super) enum Begun {
    /// Not yet: the task was there, and its run starts in `drive`.
    Not,
    /// Started already: with the task, which this `durun run` made and
    /// started at once (`fresh`), or by the resume that read the task in
    /// its start's first round trip.
    Started(Start),
}

/// A run as it started: its number, when its lease was taken, its steps
/// as the start found them, and whether this `durun run` made the task.
#[derive(Clone, Copy)]
pub(super) struct Start {
    pub(super) run: u32,
    pub(super) leased_at: Duration,
    pub(super) recorded: (u64, u64),
    pub(super) fresh: bool,
}

impl Start {
    /// The run `started` began, or why task `task` does not run: another
    /// runner holds it, or it was cancelled.
    pub(super) fn of(task: &str, started: RunStart, fresh: bool) -> Result<Self> {
        match started {
            RunStart::Started {
                run,
                leased_at,
                recorded,
            } => Ok(Self {
                run,
                leased_at,
                recorded,
                fresh,
            }),
            RunStart::Locked(lease) => Err(journal::locked(task, &lease).into()),
            RunStart::Cancelled => Err(cancelled(task).into()),
        }
    }
}

/// What a worker hands the run it starts on one of its threads (SPEC 16).
pub(super) struct ForWorker<'a> {
    /// The worker's stop signals, which stop its runs too.
    pub(super) stops: std::sync::Arc<supervisor::Stops>,
    /// The worker's claim on the task, released with the run's end.
    pub(super) claim: &'a journal::Claim,
}

/// Runs `task` once more, from wherever its journal stands. A fresh task
/// (made by this `durun run`) whose agent cannot be started is removed
/// again: there is nothing to resume. `worker` is a worker's, for a run on
/// one of its threads.
pub(super) fn drive(
    journal: &mut dyn Journal,
    task: &TaskRecord,
    begun: Begun,
    from_step: Option<u64>,
    limits: Limits,
    settings: &Settings,
    worker: Option<&ForWorker<'_>>,
) -> Result<i32> {
    if task.status == TaskStatus::Cancelled {
        return Err(cancelled(&task.id).into());
    }
    // A parked task whose signal or time has not come parks again at
    // once, without starting its agent.
    if task.status.is_parked()
        && from_step.is_none()
        && let Some(parked) = crate::task::still_parked(journal, task, settings.now())?
    {
        return Err(parked.into());
    }
    let claim = worker.map(|worker| worker.claim);
    let (
        Prepared {
            config,
            seeds,
            faults,
            preset,
        },
        Start {
            run,
            leased_at,
            mut recorded,
            fresh,
        },
    ) = begin(journal, task, begun, limits, settings, claim)?;
    if let Some(from) = from_step {
        discard(journal, &task.id, run, from)?;
        recorded = journal.replay_bounds(&task.id)?;
    }
    let started = Instant::now();
    let (mut reporter, traceparent) = reporter_of(&config, settings);
    let (budget_tree, spent_before) = budget_of(journal, task)?;
    let spec = RunSpec {
        task_id: &task.id,
        run,
        argv: &task.argv,
        cwd: Path::new(&task.cwd),
        stdin: stdin_of(limits, task, &config, preset),
        preset,
        upstreams: task.launch.upstreams.clone(),
        tools: &config.tools,
        leased_at,
        recorded,
        lease: settings.lease,
        runtime_dir: settings.runtime_dir.clone(),
        live: live_of(settings, &task.id),
        limiter: crate::limits::Limiter::new(&config.limits, settings),
        park_after: limits
            .park_after
            .or(config.park_after)
            .unwrap_or(DEFAULT_PARK_AFTER),
        max_tokens: task.max_tokens,
        max_cost_nanos: task.max_cost_nanos,
        budget_wait: limits.on_budget == crate::cli::OnBudget::Wait,
        budget_tree,
        tokens_before: spent_before.0,
        cost_before: spent_before.1,
        fixed_now: settings.fixed_now(),
        proxy: (config.proxy.enabled && !limits.no_proxy).then_some(&config.proxy),
        prices: &config.prices,
        crash_at: limits.crash_at,
        traceparent,
        journal_arg: settings.journal_arg(),
        child_jobs: limits.child_jobs.map(|jobs| jobs as usize),
        parent: crate::task::parent_of(journal, &task.id)?,
        seeds,
        faults,
        stops: worker.map(|worker| std::sync::Arc::clone(&worker.stops)),
        panic_on_request: std::env::var_os(supervisor::PANIC_TASK)
            .is_some_and(|named| named == task.id.as_str()),
    };
    let outcome = match supervisor::supervise(&spec, journal, reporter.as_mut()) {
        Ok(outcome) => outcome,
        Err(err) => {
            record_failure(journal, (&task.id, run), &err, claim);
            return Err(err);
        }
    };
    let (recorded, journaled) = record_end(journal, task, (run, fresh), &outcome, claim);
    let mut output = outcome.output;
    if let Some(output) = &mut output {
        output.finish_stderr();
    }
    reporter.report(&Event::RunFinished {
        task: &task.id,
        status: outcome.status,
        exit_code: outcome.exit_code,
        stats: &outcome.stats,
        elapsed: started.elapsed(),
        journaled,
    });
    if let Some(output) = output {
        output.finish();
    }
    // The reason durun ended the run matters more than a failure to record
    // its end (a full disk causes both).
    if let Some(failure) = outcome.failure {
        return Err(failure);
    }
    recorded.context("failed to record the end of the run")?;
    Ok(outcome.exit_code)
}

/// What `durun test` gives a trial run through its environment: the model
/// steps to answer from, and the tool faults to make.
/// Where the run reports: stderr, and its span when traces are on (SPEC
/// 15), in the trace durun was started in if any; the agent gets the span
/// as its TRACEPARENT.
fn reporter_of(
    config: &Config,
    settings: &Settings,
) -> (Box<dyn report::Reporter>, Option<String>) {
    let reporter = report::for_stderr(settings.quiet);
    match crate::trace::endpoint(config.otel_endpoint.as_deref()) {
        Some(endpoint) => {
            let context = crate::trace::Context::new(std::env::var("TRACEPARENT").ok().as_deref());
            let traceparent = context.traceparent();
            (
                Box::new(crate::trace::Tracer::new(reporter, endpoint, context)),
                Some(traceparent),
            )
        }
        None => (reporter, None),
    }
}

/// The tasks whose budgets the run's model calls reserve against in the
/// journal, and what the task spent before this run in tokens and
/// nano-dollars, its descendants' spending with its own when a budget
/// counts it (SPEC 16, 19).
fn budget_of(journal: &mut dyn Journal, task: &TaskRecord) -> Result<(Vec<String>, (u64, u64))> {
    let children = if task.max_tokens.is_some() || task.max_cost_nanos.is_some() {
        crate::task::descendants_spent(journal, &task.id)?
    } else {
        (0, 0)
    };
    Ok((
        crate::task::budget_tree(journal, task)?,
        (
            task.tokens_spent + children.0,
            task.cost.spent_nanos + children.1,
        ),
    ))
}

/// The task's live directory (SPEC 20), emptied of the streams an
/// earlier run left when it was killed.
fn live_of(settings: &Settings, task: &str) -> Option<crate::task::live::Live> {
    let location = crate::journal::Location::of(settings).ok()?;
    let live = crate::task::live::Live::of(settings, &location, task)?;
    live.clear();
    Some(live)
}

fn trial_hooks() -> Result<(Option<supervisor::Seeds>, supervisor::Faults)> {
    let seeds = std::env::var_os(supervisor::SEEDS)
        .map(|path| {
            supervisor::load_seeds(Path::new(&path)).with_context(|| {
                format!(
                    "cannot read durun test's model steps from {}",
                    path.display()
                )
            })
        })
        .transpose()?;
    let faults = std::env::var(supervisor::FAULTS)
        .ok()
        .map(|text| supervisor::parse_faults(&text))
        .transpose()
        .context("durun test's tool faults are not JSON")?
        .unwrap_or_default();
    Ok((seeds, faults))
}

/// Records how the run ended, and what it left in the journal: a fresh
/// task whose agent could not be started leaves nothing behind.
fn record_end(
    journal: &mut dyn Journal,
    task: &TaskRecord,
    (run, fresh): (u32, bool),
    outcome: &supervisor::Outcome,
    claim: Option<&journal::Claim>,
) -> (Result<()>, report::Journaled) {
    let end = RunEnd {
        status: outcome.status,
        exit_code: Some(outcome.exit_code),
        finished_at: journal::now(),
        error: outcome.failure.as_ref().map(report::described),
        release: claim.cloned(),
    };
    let recorded = journal.finish_run(&task.id, run, &end, &outcome.stats);
    // An agent that could not be started leaves nothing behind.
    let unstarted = fresh
        && recorded.is_ok()
        && outcome.status == TaskStatus::Failed
        && outcome.exit_code == exit_code::CANNOT_START
        && outcome.failure.is_some()
        && outcome.stats.executed_steps == 0
        && outcome.stats.replayed_steps == 0;
    let journaled = if unstarted && journal.forget_unstarted(&task.id).unwrap_or(false) {
        report::Journaled::Removed
    } else if task.steps == 0 && outcome.stats.executed_steps == 0 {
        report::Journaled::Nothing
    } else {
        report::Journaled::Steps
    };
    (recorded, journaled)
}

/// What a run of `task` needs that may fail, and its start: `begun`'s,
/// or one made here. Its number, when its lease was taken, its steps as
/// the start found them, and whether this `durun run` made the task.
fn begin(
    journal: &mut dyn Journal,
    task: &TaskRecord,
    begun: Begun,
    limits: Limits,
    settings: &Settings,
    claim: Option<&journal::Claim>,
) -> Result<(Prepared, Start)> {
    // What the run needs that may fail, before the start where it can: a
    // task this durun cannot run (its config or preset from another
    // version) is left as it stood.
    let prepared = match (prepare(task, limits), &begun) {
        (Ok(prepared), _) => prepared,
        (Err(err), Begun::Started(start)) => {
            leave(journal, (&task.id, start.run), &err, claim);
            return Err(err);
        }
        (Err(err), Begun::Not) => return Err(err),
    };
    let started = match begun {
        Begun::Started(start) => start,
        Begun::Not => start(journal, task, settings)?,
    };
    Ok((prepared, started))
}

/// What a run of a task needs that may fail without a journal.
struct Prepared {
    config: Config,
    seeds: Option<supervisor::Seeds>,
    faults: supervisor::Faults,
    preset: Option<(&'static crate::presets::Preset, Option<usize>)>,
}

fn prepare(task: &TaskRecord, limits: Limits) -> Result<Prepared> {
    let (seeds, faults) = trial_hooks()?;
    Ok(Prepared {
        config: recorded_config(task)?,
        seeds,
        faults,
        preset: preset_of(task, limits)?,
    })
}

/// Ends a run that started but cannot go on as interrupted, with why
/// and no exit code: its lease and its worker's claim released, the task
/// as resumable as it was. A worker takes it again only after the wait
/// of an agent that keeps dying (`task::crashes`).
fn leave(
    journal: &mut dyn Journal,
    run: (&str, u32),
    err: &anyhow::Error,
    claim: Option<&journal::Claim>,
) {
    end_with(journal, run, (TaskStatus::Interrupted, None), err, claim);
}

/// Records the end of a run that durun could not carry on (`err`), as
/// far as the journal takes it: the error that ended it matters more.
fn record_failure(
    journal: &mut dyn Journal,
    run: (&str, u32),
    err: &anyhow::Error,
    claim: Option<&journal::Claim>,
) {
    let failed = (TaskStatus::Failed, Some(exit_code::INTERNAL));
    end_with(journal, run, failed, err, claim);
}

/// Ends run `run` of `task` as `status` with `code`, and `err` as why.
fn end_with(
    journal: &mut dyn Journal,
    (task, run): (&str, u32),
    (status, code): (TaskStatus, Option<i32>),
    err: &anyhow::Error,
    claim: Option<&journal::Claim>,
) {
    let end = RunEnd {
        status,
        exit_code: code,
        finished_at: journal::now(),
        error: Some(report::described(err)),
        release: claim.cloned(),
    };
    let _ = journal.finish_run(task, run, &end, &journal::RunStats::default());
}

/// Starts a run of `task`: its number, when its lease was taken, and
/// its steps as the start found them (see [`RunStart::Started`]).
fn start(journal: &mut dyn Journal, task: &TaskRecord, settings: &Settings) -> Result<Start> {
    let started = unsynced(journal, task.sync, |journal| {
        journal.start_run(&task.id, settings.holder(), &journal::now())
    })?;
    Start::of(&task.id, started?, false)
}

/// Writes a run's start (and a new task's row, for `run`) with `write`,
/// then puts back the task's sync mode `sync`: a failure to put it back
/// first, else what `write` returned. The start need not reach the disk
/// alone: a power loss that loses it ends this run too, and the first step
/// written at the task's sync mode takes it along (one fsync fewer per
/// start).
pub(super) fn unsynced<T>(
    journal: &mut dyn Journal,
    sync: SyncMode,
    write: impl FnOnce(&mut dyn Journal) -> T,
) -> Result<T> {
    journal.set_sync(SyncMode::Normal)?;
    let written = write(journal);
    journal.set_sync(sync)?;
    Ok(written)
}

/// How long a `wait` or `sleep` is waited on live by default (SPEC 8).
const DEFAULT_PARK_AFTER: Duration = Duration::from_secs(60);

/// Records the budgets given for the task, if any, and returns the task
/// as it now stands.
pub(super) fn raise_budget(
    journal: &mut dyn Journal,
    task: TaskRecord,
    limits: &crate::cli::Limits,
) -> Result<TaskRecord> {
    let mut task = task;
    if let Some(max) = limits
        .max_tokens
        .filter(|max| task.max_tokens != Some(*max))
    {
        journal.set_max_tokens(&task.id, Some(max))?;
        if max <= task.tokens_spent {
            crate::report::say(&format!(
                "task {} has spent {} tokens already; a budget of {max} stops it at its next new step",
                task.id, task.tokens_spent
            ));
        }
        task.max_tokens = Some(max);
    }
    if let Some(max) = limits
        .max_cost_nanos
        .filter(|max| task.max_cost_nanos != Some(*max))
    {
        journal.set_max_cost(&task.id, Some(max))?;
        if max <= task.cost.spent_nanos {
            crate::report::say(&format!(
                "task {} has spent {} already; a budget of {} stops it at its next new step",
                task.id,
                crate::prices::shown(task.cost.spent_nanos),
                crate::prices::shown(max)
            ));
        }
        task.max_cost_nanos = Some(max);
    }
    Ok(task)
}

/// The error for a task `durun cancel` ended.
fn cancelled(task: &str) -> Failure {
    Failure::config(format!("task {task} was cancelled; it never runs again"))
        .hint("start the agent as a new task")
}

/// Takes steps `from` and later out of replay, after saying which of them
/// changed the world already: durun does not undo them.
fn discard(journal: &mut dyn Journal, task: &str, run: u32, from: u64) -> Result<()> {
    let discarded = journal.discard_from(task, run, from)?;
    let Some(last) = discarded.last() else {
        crate::report::say(&format!(
            "task {task} has no step {from} or later; nothing to discard"
        ));
        return Ok(());
    };
    let steps = if last.step == from {
        format!("step {from}")
    } else {
        format!("steps {from}-{}", last.step)
    };
    crate::report::say(&format!(
        "discarded {steps} of task {task} from replay (kept in the journal as `discarded`)"
    ));
    for step in discarded
        .iter()
        .filter(|step| step.effect == Effect::Mutate)
    {
        let what = match step.status {
            StepStatus::Committed => "took effect",
            StepStatus::Pending => "may have taken effect",
            _ => continue,
        };
        // One whole write, escaped: step names come from the agent.
        let line = format!(
            "  step {} {} (mutate) {what}; durun does not undo it (key {})\n",
            step.step,
            crate::report::escape(&step.name),
            step.idempotency_key
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    }
    Ok(())
}
