//! durun: a write-ahead journal that makes any agent script survive a crash.
//!
//! `run` parses the command line, dispatches to one of `commands`, prints an
//! error as `durun: …` and chooses the exit code in one place.

#[cfg(not(target_os = "linux"))]
compile_error!("durun runs on Linux: it relies on the parent-death signal, /proc and clone");

mod cli;
mod clock;
mod commands;
mod completion;
mod config;
mod diff;
mod error;
mod executor;
pub mod exit_code;
mod journal;
mod json_text;
mod keeper;
mod launch;
mod lease;
mod limits;
mod mcp;
mod mcp_server;
mod names;
mod nursery;
mod os;
mod own_command;
mod presets;
mod prices;
mod protocol;
mod proxy;
mod report;
mod settings;
mod spawn;
mod sse;
mod step_key;
mod supervisor;
mod task;
#[cfg(test)]
mod test_helpers;
mod trace;
mod ui;
mod usage;
mod web;

use std::ffi::OsString;

/// Entry points for `fuzz/`; not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    /// Everything durun does with one line from an agent before it touches
    /// the journal: classify, decode, and canonicalize the args.
    pub fn request_line(line: &[u8]) {
        if let crate::protocol::Line::Request(
            crate::protocol::Request::Call { args, .. }
            | crate::protocol::Request::Begin { args, .. },
        ) = crate::protocol::parse_line(line)
            && let Ok(canonical) = crate::step_key::canonical_json(&args)
        {
            let _ = crate::step_key::idempotency_key("fuzz", 1, &canonical);
        }
    }
}

use clap::{CommandFactory as _, FromArgMatches as _};

use cli::{Cli, Command};

/// Becomes the keeper of an agent (`durun __keeper`, started by
/// durun itself) and never returns; returns at once otherwise.
pub fn keep_if_asked() {
    nursery::keep_if_asked();
}

/// Forks the nursery that makes the agents' keepers, if the command
/// (`run`, `resume`, `worker`) starts agents. Call first thing, while
/// durun is one thread and small: the fork copies it.
pub fn nurse_if_needed() {
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--journal" {
            // Its value.
            args.next();
        } else if !arg.as_encoded_bytes().starts_with(b"-") {
            if arg == "run" || arg == "resume" || arg == "worker" {
                nursery::open();
            }
            return;
        }
    }
}

/// Answers a shell's completion request (`COMPLETE=SHELL durun …`) and
/// exits; returns at once otherwise.
pub fn complete_if_asked() {
    commands::generate::complete_if_asked();
}

/// Runs durun with `args` (the program name first) and returns the exit code.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    // `Cli::try_parse_from`, but the command tree is left to the process's
    // end: freeing it is work for nothing (4 % of a `durun run -- true`'s
    // instructions before the subcommands were deferred, less since).
    let mut command = Cli::command();
    let parsed = command
        .try_get_matches_from_mut(args)
        .and_then(|mut matches| {
            Cli::from_arg_matches_mut(&mut matches).map_err(|err| err.format(&mut command))
        });
    std::mem::forget(command);
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => {
            if !err.use_stderr() {
                // --help and --version.
                let _ = err.print();
                return 0;
            }
            let text = err.render().to_string();
            eprint!(
                "{}",
                text.strip_prefix("error: ")
                    .map_or(text.clone(), |rest| format!("durun: {rest}"))
            );
            return exit_code::USAGE;
        }
    };
    if let Some(journal) = &cli.global.journal
        && std::env::var("DURUN_JOURNAL").ok().as_deref() != Some(journal.as_str())
    {
        report::journal_named(journal);
    }
    journal::notices_to(report::say);
    error::abort_on_panic();
    let settings = settings::Settings::resolve(cli.global.journal, cli.global.quiet);
    let result = dispatch(cli.command, &settings);
    match result {
        Ok(code) => code,
        Err(err) if error::is_broken_pipe(&err) => 0,
        Err(err) => {
            // Storage errors are explained once, here (a locked or full
            // journal says so, with what to do).
            let err = journal::explain(err);
            report::error(&err);
            error::exit_code_of(&err)
        }
    }
}

/// Runs `command`.
fn dispatch(command: Command, settings: &settings::Settings) -> anyhow::Result<i32> {
    match command {
        Command::Run(args) => commands::run::exec(&args, settings),
        Command::Resume(args) => {
            let json = args.task.as_deref().filter(|_| args.json);
            then_json(json, settings, commands::resume::exec(&args, settings))
        }
        Command::Test(args) => commands::trials::exec(&args, settings),
        Command::Inspect(args) => commands::inspect::exec(&args, settings),
        Command::Diff(args) => commands::compare::exec(&args, settings),
        Command::Resolve(args) => commands::resolve::exec(&args, settings),
        Command::Cancel(args) => then_json(
            args.output.of(&args.task),
            settings,
            commands::cancel::exec(&args, settings),
        ),
        Command::Gc(args) => commands::gc::exec(&args, settings),
        Command::Step(args) => commands::step::exec(&args, settings),
        Command::Call(args) => commands::step::call(&args, settings),
        Command::Mcp(args) => commands::mcp::exec(&args, settings),
        Command::Wait(args) => commands::step::wait(&args, settings),
        Command::Sleep(args) => commands::step::sleep(&args, settings),
        Command::Signal(args) => then_json(
            args.output.of(&args.task),
            settings,
            commands::signal::signal(&args, settings),
        ),
        Command::Approve(args) => then_json(
            args.output.of(&args.task),
            settings,
            commands::signal::approve(&args, settings),
        ),
        Command::Reject(args) => then_json(
            args.output.of(&args.task),
            settings,
            commands::signal::reject(&args, settings),
        ),
        Command::Export(args) => commands::transfer::export(&args, settings),
        Command::Import(args) => commands::transfer::import(&args, settings),
        Command::Fork(args) => commands::transfer::fork(&args, settings),
        Command::Submit(args) => commands::submit::submit(&args, settings),
        Command::Worker(args) => commands::worker::worker(&args, settings),
        Command::Ui(args) => ui::exec(&args, settings),
        Command::Schedules(args) => commands::schedules::exec(&args, settings),
        Command::Presets(args) => commands::presets::exec(&args),
        Command::Completions(args) => commands::generate::completions(&args),
        Command::Generate(args) => commands::generate::generate(&args),
        Command::McpServer(args) => match args.listen {
            Some(listen) => ui::serve_mcp(listen, args.token_file.as_deref(), settings),
            None => Ok(mcp_server::exec(settings)),
        },
        Command::Skill(args) => mcp_server::skill(&args),
    }
}

/// A command's result, then the task as `inspect TASK --json` prints it
/// when `task` is given (`--json` of `resume`, `cancel`, `signal`, ...):
/// after a failure too, when the task can be read (a resume stopped over
/// its budget).
fn then_json(
    task: Option<&str>,
    settings: &settings::Settings,
    result: anyhow::Result<i32>,
) -> anyhow::Result<i32> {
    let Some(task) = task else {
        return result;
    };
    let printed = commands::inspect::print_task_json(settings, task);
    match result {
        Ok(code) => printed.map(|()| code),
        Err(err) => Err(err),
    }
}
