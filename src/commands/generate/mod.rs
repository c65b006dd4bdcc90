//! Completions and man pages, generated from the clap definition.
//!
//! `completions/` and `man/` in the repository are written by the hidden
//! `durun generate --out .`; a test regenerates them and fails when the
//! committed files are stale.
//!
//! Completions use clap's dynamic engine: the scripts call `durun` back
//! (`COMPLETE=bash durun …`), so a task argument completes to the task ids
//! in the journal, not to file names.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use clap::CommandFactory as _;
use clap_complete::env::Shells;
use clap_mangen::roff::{Roff, bold, italic, roman};

use crate::cli::{Cli, CompletionsArgs, GenerateArgs};
use crate::exit_code;

mod config_page;

/// The variable the completion scripts set when they call durun back.
const COMPLETE_VAR: &str = "COMPLETE";

/// The file each shell's script is kept in, under `completions/`.
const SCRIPTS: [(&str, &str); 5] = [
    ("bash", "durun.bash"),
    ("zsh", "_durun"),
    ("fish", "durun.fish"),
    ("elvish", "durun.elv"),
    ("powershell", "_durun.ps1"),
];

pub(crate) fn completions(args: &CompletionsArgs) -> Result<i32> {
    let script = completion_script(&args.shell.to_string())?;
    std::io::stdout().lock().write_all(&script)?;
    Ok(0)
}

/// The shell code that registers durun's completions with `shell`.
fn completion_script(shell: &str) -> Result<Vec<u8>> {
    let shells = Shells::builtins();
    let completer = shells
        .completer(shell)
        .with_context(|| format!("no completions for {shell}"))?;
    let mut script = Vec::new();
    completer.write_registration(COMPLETE_VAR, "durun", "durun", "durun", &mut script)?;
    Ok(script)
}

/// Answers a completion request (`COMPLETE=SHELL durun …`) and exits; does
/// nothing otherwise. Runs before anything else prints.
pub(crate) fn complete_if_asked() {
    clap_complete::CompleteEnv::with_factory(Cli::command)
        .var(COMPLETE_VAR)
        .complete();
}

pub(crate) fn generate(args: &GenerateArgs) -> Result<i32> {
    write_all(&args.out)?;
    Ok(0)
}

fn write_all(out: &Path) -> Result<()> {
    let man_dir = out.join("man");
    let completions_dir = out.join("completions");
    for dir in [&man_dir, &completions_dir] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
    }
    for (name, page) in man_pages()? {
        write(&man_dir.join(name), &page)?;
    }
    for (shell, file) in SCRIPTS {
        write(&completions_dir.join(file), &completion_script(shell)?)?;
    }
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("failed to write {}", path.display()))
}

/// Every man page: `durun(1)`, one `durun-CMD(1)` per command, and
/// `durun.toml(5)`.
fn man_pages() -> Result<Vec<(String, Vec<u8>)>> {
    let command = Cli::command().disable_help_subcommand(true);
    let mut pages = vec![("durun.1".to_owned(), main_page(&command)?)];
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let sub = &built(sub);
        let name = format!("durun-{}", sub.get_name());
        let bin = format!("durun {}", sub.get_name());
        let usage = synopsis(sub, &bin);
        let sub = sub
            .clone()
            .name(name.clone())
            .bin_name(bin)
            .override_usage(usage);
        let man = manual(sub.clone(), &name, "1");
        let mut page = Vec::new();
        man.render_title(&mut page)?;
        man.render_name_section(&mut page)?;
        man.render_synopsis_section(&mut page)?;
        man.render_description_section(&mut page)?;
        if sub.get_arguments().any(|arg| !arg.is_hide_set()) {
            man.render_options_section(&mut page)?;
        }
        if sub.get_after_help().is_some() || sub.get_after_long_help().is_some() {
            let mut examples = Vec::new();
            man.render_extra_section(&mut examples)?;
            let examples = without_preamble(&examples)
                .replace(".SH EXTRA", ".SH EXAMPLES")
                .replace("Examples:\n", "");
            page.extend(examples.bytes());
        }
        let mut roff = Roff::new();
        see_also(&mut roff, &["durun(1)", "durun.toml(5)"]);
        roff.to_writer(&mut page)?;
        pages.push((format!("{name}.1"), join_fragments(&page)));
    }
    pages.push(("durun.toml.5".to_owned(), config_page::config_page()?));
    Ok(pages)
}

/// A subcommand with its arguments, which are made only when it is
/// parsed or built (`#[command(defer)]` on [`crate::cli::Command`]).
fn built(sub: &clap::Command) -> clap::Command {
    let mut sub = sub.clone();
    sub.build();
    sub
}

/// A manual for `command` named `title(section)`.
fn manual(command: clap::Command, title: &str, section: &str) -> clap_mangen::Man {
    clap_mangen::Man::new(command)
        .title(title)
        .section(section)
        .source(format!("durun {}", env!("CARGO_PKG_VERSION")))
        .manual("durun manual")
}

/// `durun(1)`: the commands, the exit codes, the environment, the files.
fn main_page(command: &clap::Command) -> Result<Vec<u8>> {
    let command = command
        .clone()
        .override_usage(
            "durun [--journal PATH] [-q] COMMAND [ARGS]\ndurun run [--task ID] [--config FILE] -- CMD [ARG…]",
        );
    let man = manual(command, "durun", "1");
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    man.render_subcommands_section(&mut page)?;
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    roff.text([roman(
        "The agent's own exit code when it exits; 128+N when signal N ends it. durun's own:",
    )]);
    for (code, meaning) in exit_code::TABLE {
        roff.control("TP", []);
        roff.text([bold(code.to_string())]);
        roff.text([roman(*meaning)]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    for (name, meaning) in ENVIRONMENT {
        roff.control("TP", []);
        roff.text([bold(*name)]);
        roff.text([roman(*meaning)]);
    }
    roff.control("SH", ["FILES"]);
    for (name, meaning) in FILES {
        roff.control("TP", []);
        roff.text([italic(*name)]);
        roff.text([roman(*meaning)]);
    }
    see_also(&mut roff, &["durun.toml(5)", "sqlite3(1)"]);
    roff.to_writer(&mut page)?;
    Ok(join_fragments(&page))
}

/// Every variable durun reads, and those it sets for the agent and tools.
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "DURUN_JOURNAL",
        "The journal: a file path, or a postgres:// URL for a shared journal (as --journal).",
    ),
    (
        "DURUN_CONFIG",
        "The tools file for new tasks (as run --config).",
    ),
    (
        "DURUN_SYNC",
        "full or normal: how hard step commits go to disk, for the tasks run starts; overrides [journal] sync in durun.toml.",
    ),
    (
        "DURUN_HOST_ID",
        "This runner's host in leases; the host name by default.",
    ),
    (
        "DURUN_HEARTBEAT_MS",
        "How often a runner renews its lease (10000); at most a quarter of the stale time.",
    ),
    (
        "DURUN_LEASE_STALE_MS",
        "How old another host's heartbeat may be before its task is taken over (60000); a runner that could not renew for half this stops itself.",
    ),
    (
        "DURUN_BUSY_TIMEOUT_MS",
        "How long a write waits for another process's lock on an SQLite journal (5000).",
    ),
    (
        "XDG_STATE_HOME",
        "Where the default journal lives: $XDG_STATE_HOME/durun/journal.db.",
    ),
    (
        "HOME",
        "The default journal without XDG_STATE_HOME: ~/.local/state/durun/journal.db.",
    ),
    (
        "XDG_RUNTIME_DIR",
        "Where the run's private socket directory goes (else the temp directory).",
    ),
    (
        "NO_COLOR",
        "Set and not empty: no colour in inspect's tables.",
    ),
    (
        "COLUMNS",
        "The width of inspect's tables when stdout is not a terminal.",
    ),
    (
        "COMPLETE",
        "Set by the completion scripts when they ask durun for candidates.",
    ),
    (
        "DURUN_TASK_ID, DURUN_RUN, DURUN_PROTOCOL, DURUN_SOCKET, DURUN_JOURNAL_STEPS",
        "Set for the agent: its task, its run (1, 2, …), the protocol version, the socket for durun step and durun call, and the highest step number the journal held for the task when the run started.",
    ),
    (
        "DURUN_STEP, DURUN_ATTEMPT, DURUN_IDEMPOTENCY_KEY",
        "Set for a command tool and for the command of durun step: the step, the attempt, and the step's idempotency key.",
    ),
];

/// The files durun reads and writes.
const FILES: &[(&str, &str)] = &[
    (
        "$XDG_STATE_HOME/durun/journal.db",
        "The default journal (SQLite, WAL: with journal.db-wal and journal.db-shm), created 0600 in a 0700 directory.",
    ),
    (
        "./durun.toml",
        "The tools and journal settings of a new task, recorded with it (see durun.toml(5)).",
    ),
    (
        "$XDG_RUNTIME_DIR/durun-PID-*/durun*.sock",
        "The socket of a live run, in a private directory removed when the run ends (a worker's runs share one, removed when the worker ends).",
    ),
];

pub(super) fn see_also(roff: &mut Roff, pages: &[&str]) {
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman(pages.join(", "))]);
}

/// A synopsis with the value names clap_mangen leaves out:
/// `durun run [--task ID] [--config FILE] -- CMD [ARG…]`.
fn synopsis(command: &clap::Command, bin: &str) -> String {
    let mut words = vec![bin.to_owned()];
    for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if long == "help" {
            continue;
        }
        let takes_value = arg.get_action().takes_values();
        let mut word = format!("--{long}");
        if takes_value {
            let value = arg
                .get_value_names()
                .and_then(|names| names.first())
                .map_or_else(|| "VALUE".to_owned(), ToString::to_string);
            word = format!("{word} {value}");
        }
        words.push(if arg.is_required_set() {
            word
        } else {
            format!("[{word}]")
        });
    }
    for arg in command.get_positionals() {
        let value = arg
            .get_value_names()
            .and_then(|names| names.first())
            .map_or_else(|| arg.get_id().to_string(), ToString::to_string);
        if arg.is_trailing_var_arg_set() {
            words.push(format!("-- {value} [ARG…]"));
        } else if arg.is_required_set() {
            words.push(value);
        } else {
            words.push(format!("[{value}]"));
        }
    }
    words.join(" ")
}

/// Each clap_mangen fragment opens with the same two preamble lines; one
/// page needs them once.
fn join_fragments(page: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(page);
    let preamble = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";
    let mut out = String::new();
    for (i, fragment) in text.split(preamble).enumerate() {
        if i == 1 {
            out.push_str(preamble);
        }
        out.push_str(fragment);
    }
    out.into_bytes()
}

fn without_preamble(fragment: &[u8]) -> String {
    String::from_utf8_lossy(fragment).replace(".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n", "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synopses_name_their_values() {
        let command = Cli::command();
        let run = built(command.find_subcommand("run").expect("run"));
        assert_eq!(
            synopsis(&run, "durun run"),
            "durun run [--task ID] [--config FILE] [--jobs N] [--max-tokens N] [--max-usd USD] [--on-budget WHAT] [--park-after DURATION] [--no-proxy] [--stdin MODE] [--preset NAME] -- CMD [ARG…]"
        );
    }
}
