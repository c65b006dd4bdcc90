//! `durun submit` (SPEC 11, 16): a task queued in the journal for a
//! `durun worker`, with its queue's retries.

use anyhow::{Context as _, Result};

use crate::cli::SubmitArgs;
use crate::config::Config;
use crate::error::Failure;
use crate::journal::{Access, Location};
use crate::settings::Settings;
use crate::task::{check_task_id, new_task_id};

pub(crate) fn submit(args: &SubmitArgs, settings: &Settings) -> Result<i32> {
    crate::task::check_queue(&args.queue)?;
    if let Some(id) = &args.new.task {
        check_task_id(id)?;
    }
    let cwd = std::env::current_dir().context("failed to read the current directory")?;
    let location = Location::of(settings)?;
    let mut journal = location.open(Access::Write, settings)?;
    let id = args.new.task.clone().unwrap_or_else(new_task_id);
    if journal.task(&id)?.is_some() {
        return Err(Failure::config(format!("task {id} exists already"))
            .hint("submit it under another --task id, or `durun resume` it")
            .into());
    }
    let mut task = crate::task::new_task(
        id.clone(),
        &args.new.command,
        &cwd,
        args.new.config.as_deref(),
        crate::task::Budget {
            tokens: args.max_tokens,
            cost_nanos: args.max_cost_nanos,
        },
        Some(args.queue.clone()),
        settings,
    )?;
    // A worker's runs send the model calls where this shell would.
    task.launch.upstreams = crate::proxy::upstreams_from_env();
    // The queue's retries, from the durun.toml here, unless told.
    let (config, _) = Config::discover(args.new.config.as_deref(), &cwd)?;
    let policy = config.queue_retries.get(&args.queue).copied();
    let retries = args
        .retries
        .or(policy.map(|(retries, _)| retries))
        .unwrap_or(0);
    if retries > 0 {
        let backoff = args
            .backoff
            .or(policy.map(|(_, backoff)| backoff))
            .unwrap_or(crate::config::DEFAULT_BACKOFF);
        task.retries = Some((retries, backoff.as_millis() as u64));
    }
    journal.create_task(&task)?;
    println!("{id}");
    if !settings.quiet {
        crate::report::say(&format!(
            "queued task {id} in `{}`; a `durun worker` runs it",
            args.queue
        ));
    }
    Ok(0)
}
