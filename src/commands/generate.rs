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
    pages.push(("durun.toml.5".to_owned(), config_page()?));
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
        "$XDG_RUNTIME_DIR/durun-PID-*/durun.sock",
        "The socket of a live run, in a private directory removed when the run ends.",
    ),
];

/// `durun.toml(5)`: the tools file.
fn config_page() -> Result<Vec<u8>> {
    let mut roff = Roff::new();
    roff.control(
        "TH",
        [
            "durun.toml",
            "5",
            "",
            &format!("durun {}", env!("CARGO_PKG_VERSION")),
            "durun manual",
        ],
    );
    roff.control("SH", ["NAME"]);
    roff.text([roman(
        "durun.toml - the tools an agent may call, the journal's settings, waiting and the token budget",
    )]);
    roff.control("SH", ["DESCRIPTION"]);
    roff.text([roman(
        "durun run reads durun.toml from its working directory (or --config FILE, DURUN_CONFIG) when it starts a task, \
         and records its text with the task: a resume uses the tools the task started with, whatever the file says now.",
    )]);
    roff.control("SH", ["[tools.NAME]"]);
    roff.text([roman(
        "A tool the agent may run with a call request. Its keys:",
    )]);
    for (key, meaning) in TOOL_KEYS {
        roff.control("TP", []);
        roff.text([bold(*key)]);
        roff.text([roman(*meaning)]);
    }
    for (heading, entries) in CONFIG_SECTIONS {
        roff.control("SH", [*heading]);
        for (key, meaning) in *entries {
            roff.control("TP", []);
            roff.text([bold(*key)]);
            roff.text([roman(*meaning)]);
        }
    }
    roff.control("SH", ["EXAMPLE"]);
    roff.control("nf", []);
    for line in EXAMPLE.lines() {
        roff.text([roman(line)]);
    }
    roff.control("fi", []);
    see_also(&mut roff, &["durun(1)", "durun-run(1)"]);
    let mut page = Vec::new();
    roff.to_writer(&mut page)?;
    Ok(page)
}

/// durun.toml(5)'s sections after `[tools.NAME]`: a heading, then each key
/// with its meaning.
const CONFIG_SECTIONS: &[(&str, &[(&str, &str)])] = &[
    (
        "[journal]",
        &[(
            "sync",
            "\"full\" (the default): every step's commit is fsync'd, and survives a power cut. \"normal\": steps about ten times cheaper; \
         every process crash is still survived, a power cut may lose the last steps. DURUN_SYNC overrides it.",
        )],
    ),
    (
        "[wait]",
        &[(
            "park_after",
            "How long a wait or sleep step is waited on live before durun ends the agent, leaves the task waiting or sleeping \
         and exits 77, like \"60s\" (the default) or \"0s\" (park at once). run --park-after and resume --park-after override it.",
        )],
    ),
    (
        "[budget]",
        &[
            (
                "max_tokens",
                "The task's token budget, over all its runs and its children's (replayed steps cost nothing). A model call \
         through the proxy goes only when its worst case (its input, and its max_tokens or the model's output limit) fits \
         beside the calls in flight; once spent reaches the budget, the next new step is refused with budget_exceeded \
         and durun exits 78. run --max-tokens overrides it; resume --max-tokens and approve --add-tokens raise it.",
            ),
            (
                "max_usd",
                "The task's budget in dollars, held as max_tokens is, at the models' prices ([prices.\"MODEL\"]): a call to a \
         model with no price is refused. run --max-usd overrides it; resume --max-usd and approve --add-usd raise it.",
            ),
        ],
    ),
    (
        "[limits.NAME]",
        &[
            (
                "match",
                "The requests the limit holds: a proxy route (\"openai\"), or its calls to some models (\"openai:gpt-4o*\", \
         * standing for any characters). Every run and worker on the journal shares the limit: one host on SQLite, \
         every host on PostgreSQL. A request over it waits inside durun; an upstream's 429 or 503 with Retry-After pauses \
         the limit for everyone and the request is sent again after it.",
            ),
            (
                "rpm",
                "Requests a minute: each goes 60/rpm seconds after the one before, so no minute holds more.",
            ),
            (
                "tpm",
                "Tokens a minute, counting a request's input (a byte a token) and its max_tokens.",
            ),
            ("concurrency", "Requests in flight at once."),
        ],
    ),
    (
        "[prices.\"MODEL\"]",
        &[
            (
                "input, output",
                "USD per million tokens of MODEL (as its requests name it): a model call's cost is its usage at this price. \
          Over durun's built-in table of OpenAI's and Anthropic's prices (read in June 2026; a dated id such as \
          gpt-4o-2024-08-06 takes the price of its longest listed prefix). A model with no price shows its tokens and \
          cost unknown.",
            ),
            (
                "cached_input",
                "USD per million input tokens read from the provider's prompt cache [default: input].",
            ),
            (
                "max_output",
                "The most output tokens one call may get: a budget's worst case for a request that sets no max_tokens \
          [default: the built-in table's, for its models].",
            ),
        ],
    ),
    (
        "[proxy]",
        &[
            (
                "enabled",
                "Whether run and resume start the model/API proxy (true, the default); --no-proxy turns it off for a run.",
            ),
            (
                "ignore",
                "JSON pointers (like \"/metadata/request_id\") left out of a request's body when it is matched with a recorded one: \
          the fix for a prompt that embeds the time.",
            ),
            (
                "secret_headers",
                "More request headers that are forwarded but never journaled, hashed or shown (authorization, x-api-key, \
          api-key, cookie and proxy-authorization always are).",
            ),
            (
                "openai.upstream, anthropic.upstream, gemini.upstream",
                "Where the model routes forward to, over OPENAI_BASE_URL, ANTHROPIC_BASE_URL and \
          GOOGLE_GEMINI_BASE_URL in durun's environment and the vendors' APIs.",
            ),
        ],
    ),
    (
        "[proxy.routes.NAME]",
        &[
            ("upstream", "The API this route forwards to."),
            ("env", "The variable the agent gets the route's URL in."),
            (
                "read, mutate",
                "Which METHOD PATH patterns read and which mutate; by default GET, HEAD and OPTIONS read and the rest mutate \
          (journaled before they are forwarded, with Idempotency-Key set to the step's key).",
            ),
        ],
    ),
    (
        "[mcp.NAME]",
        &[(
            "read, mutate",
            "Tool names of the MCP server durun mcp --name NAME fronts, over the server's readOnlyHint annotations.",
        )],
    ),
    (
        "[otel]",
        &[(
            "endpoint",
            "The OTLP/HTTP base URL runs send their trace spans to, when neither OTEL_EXPORTER_OTLP_TRACES_ENDPOINT \
          nor OTEL_EXPORTER_OTLP_ENDPOINT is set.",
        )],
    ),
    (
        "[queues.NAME]",
        &[
            (
                "concurrency",
                "For durun worker --config FILE: at most this many tasks of the queue run at once, over all workers.",
            ),
            (
                "retries, backoff",
                "For durun submit: the retries its tasks get unless --retries says (a failed run is resumed by a worker \
          after backoff, like \"30s\", default 10s, doubling each time).",
            ),
        ],
    ),
    (
        "[schedules.NAME]",
        &[
            (
                "cron, every",
                "For durun worker --config FILE: when the schedule ticks, one of them: a five-field cron expression           (minute hour day-of-month month day-of-week, UTC, as POSIX cron reads it), or a period like \"10m\"           (ticks on its multiples since the Unix epoch). Workers sharing a journal submit exactly one task per tick,           id NAME-YYYYMMDDTHHMMSSZ; durun schedules lists them.",
            ),
            ("command", "The task's argv."),
            ("queue", "The queue its tasks go to (default \"default\")."),
            (
                "cwd",
                "Where its tasks run (default the worker's directory).",
            ),
            (
                "catch_up",
                "Of the ticks missed while no worker ran: \"latest\" (the default) submits the last, \"none\" none, \"all\"           each of them (at most 100).",
            ),
        ],
    ),
];

const TOOL_KEYS: &[(&str, &str)] = &[
    (
        "effect",
        "\"read\" (safe to repeat) or \"mutate\" (changes the world; the default). A mutate step is journaled as pending, durably, before the tool starts.",
    ),
    (
        "command",
        "The argv to run, never through a shell. \"{name}\" takes args.name; {{name}} is the literal text {name}; ${VAR} is left to the program.",
    ),
    (
        "stdin",
        "\"args\": the step's args as JSON on the tool's stdin.",
    ),
    (
        "http",
        "Instead of command: { method = \"POST\", url = \"https://…\" }. The args are the JSON body, the step's key the Idempotency-Key header; the URL takes {name} and ${VAR}.",
    ),
    (
        "headers",
        "For an http tool: header values, with ${VAR} from the environment. Expanded values are never journaled or shown; a value holding a line break is refused.",
    ),
    (
        "output",
        "\"text\" (stdout as a string; the default for commands) or \"json\" (the default for http; a usage member counts tokens).",
    ),
    (
        "timeout",
        "How long one attempt may run, like \"30s\" (more than zero); the whole process group is ended past it.",
    ),
    (
        "retries",
        "More attempts after a failure, with backoff; every attempt carries the same key.",
    ),
    (
        "in_doubt",
        "\"retry\" (the default): a step a dead run left in doubt runs again with its key. \"ask\": for tools whose API takes no key, the run stops (exit 76) until durun resolve decides.",
    ),
];

const EXAMPLE: &str = r#"[tools.read_file]
effect = "read"
command = ["cat", "{path}"]
timeout = "30s"

[tools.create_pr]
effect = "mutate"
command = ["./scripts/create-pr.sh"]
stdin = "args"
output = "json"
retries = 2

[tools.notify]
effect = "mutate"
http = { method = "POST", url = "https://hooks.example/${HOOK_ID}" }
headers = { Authorization = "Bearer ${HOOK_TOKEN}" }

[journal]
sync = "full"

[wait]
park_after = "5m"

[budget]
max_tokens = 2000000
max_usd = 25

[limits.openai]
match = "openai"
rpm = 500
concurrency = 8"#;

fn see_also(roff: &mut Roff, pages: &[&str]) {
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
