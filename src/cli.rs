//! The command line. The `///` comments are the help text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Run an AI agent so that it survives a crash.
///
/// durun starts the agent as a child and journals every step it asks for
/// (over JSON lines on the agent's stdin/stdout) before the step runs. After a
/// crash, `durun resume` replays the finished steps from the journal, with no
/// LLM call and no repeated side effect, and retries the step in flight with
/// the same idempotency key.
#[derive(Parser, Debug)]
#[command(
    name = "durun",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(
    after_help = crate::exit_code::help()
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct GlobalArgs {
    /// The journal file [default: $XDG_STATE_HOME/durun/journal.db]
    #[arg(
        long,
        global = true,
        env = "DURUN_JOURNAL",
        hide_env_values = true,
        value_name = "PATH",
        help_heading = "Global options"
    )]
    pub journal: Option<String>,

    /// Print no progress on stderr
    #[arg(short, long, global = true, help_heading = "Global options")]
    pub quiet: bool,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run an agent command as a durable task
    ///
    /// Prints the task id on stderr first. With `--task ID` of a task that
    /// exists, resumes it if it did not finish and exits 0 if it completed, so
    /// a retried CI job picks up where the failed one stopped.
    #[command(after_help = "Examples:
  durun run -- python3 agent.py
  durun run --task \"release-$CI_PIPELINE_ID\" -- ./agent.sh --target prod
  DURUN_SYNC=normal durun run -- python3 agent.py   (faster steps, not power-cut safe)")]
    Run(RunArgs),
    /// Relaunch an unfinished task, replaying the steps it finished
    Resume(ResumeArgs),
    /// Show tasks, or one task's runs and steps
    Inspect(InspectArgs),
    /// Settle a step in doubt by hand: run it again, or record what happened
    ///
    /// A step is in doubt when a run died while its side effect was under
    /// way. Every resolution is kept in the journal.
    #[command(after_help = "Examples:
  durun resolve t42 4 --retry                      the API never saw it: run it again
  durun resolve t42 4 --output '{\"url\": \"...\"}'    it happened: this is what it returned
  durun resolve t42 4 --fail 'declined by hand'    it must not happen: record a failure")]
    Resolve(ResolveArgs),
    /// Stop a task for good: its runner ends the agent, and it never resumes
    Cancel(CancelArgs),
    /// Delete finished tasks (completed, failed, cancelled) from the journal
    Gc(GcArgs),
    /// Run a command as a journaled step of the running task (shell agents)
    ///
    /// Inside `durun run`, a step the journal already holds is not run
    /// again: its recorded stdout is printed and its exit code returned.
    /// Otherwise CMD runs with DURUN_IDEMPOTENCY_KEY, DURUN_STEP and
    /// DURUN_ATTEMPT set, its stdout is recorded as it passes through, and
    /// `durun step` exits with its code. Outside a run CMD simply runs.
    #[command(
        after_help = "Example, in a script run by `durun run -- bash deploy.sh`:
  plan=$(durun step plan -- ./ask-llm.sh \"plan the release\")
  durun step tag --effect mutate --args '{\"version\": \"1.4.0\"}' -- git push origin v1.4.0"
    )]
    Step(StepArgs),
    /// Call a tool from the task's durun.toml and print its output as JSON
    ///
    /// Exits 0 with the output on stdout, or 1 with the error on stderr.
    /// Outside `durun run` the tool from ./durun.toml (or DURUN_CONFIG) runs
    /// once, journaled nowhere, so a script works with or without durun.
    Call(CallArgs),
    /// Wait for a signal, as a journaled step of the running task (shell agents)
    ///
    /// Prints the signal as JSON on stdout: {"signal", "data", "by", "at"}.
    /// A recorded wait prints its recorded signal at once. Works inside
    /// `durun run` only.
    #[command(
        after_help = "Example, in a script run by `durun run -- bash deploy.sh`:
  answer=$(durun wait approve-deploy --data \"$(cat plan.json)\" --timeout 48h)
  [ \"$(echo \"$answer\" | jq .data.approved)\" = true ] || exit 1"
    )]
    Wait(WaitArgs),
    /// Sleep durably, as a journaled step of the running task (shell agents)
    ///
    /// The wake time is fixed the first time the step runs: a resumed task
    /// sleeps only what is left. A long sleep parks the task (exit 77).
    /// Outside `durun run` it simply sleeps.
    Sleep(SleepArgs),
    /// Send a signal to a task: a live runner takes it at once, a parked task on resume
    #[command(after_help = "Examples:
  durun signal t42 ci-passed --data '{\"sha\": \"4f2a9c1\"}'
  durun signal t42 webhook --id \"$DELIVERY_ID\" --data @payload.json   (the same --id twice is kept once)")]
    Signal(SignalArgs),
    /// Approve what a task waits for: a signal to its waiting step, {"approved": true}
    Approve(ApproveArgs),
    /// Turn down what a task waits for: a signal to its waiting step, {"approved": false}
    Reject(RejectArgs),
    /// Write a task, every row of it, as JSON lines (to move it to another journal)
    #[command(
        after_help = "Example, a CI job that failed hands its task to the retry:
  durun export \"$TASK\" -o durun-task.jsonl      (upload as an artifact)
  durun import durun-task.jsonl && durun resume \"$TASK\"   (in the retried job)"
    )]
    Export(ExportArgs),
    /// Load a task written by `durun export` into this journal
    Import(ImportArgs),
    /// Copy a task's steps before step N into a new task that runs from step N
    ///
    /// The new task has the same command, directory and config; its first
    /// N-1 steps replay from the copy, the rest run anew. The original is
    /// not changed (unlike `resume --from-step`). Prints the new id.
    Fork(ForkArgs),
    /// Queue a task for a worker to run; prints its id on stdout
    #[command(after_help = "Examples:
  durun submit -- python3 agent.py --repo acme/web
  id=$(durun submit --queue nightly --task \"digest-$(date +%F)\" -- ./digest.sh)")]
    Submit(SubmitArgs),
    /// Run queued tasks, and interrupted, signalled and woken ones, until SIGTERM
    ///
    /// Claims tasks of its queues, N at a time, and runs each as `durun
    /// resume` would, in the task's recorded directory. Any number of
    /// workers on any number of hosts share one PostgreSQL journal; each
    /// task goes to one of them. On SIGTERM or SIGINT it stops claiming,
    /// stops its tasks resumably (another worker takes them over) and exits 0.
    #[command(after_help = "Examples:
  durun --journal postgres://durun@db/durun worker --jobs 4
  durun worker --queue nightly --queue default --config workers.toml   ([queues.nightly] concurrency = 2)")]
    Worker(WorkerArgs),
    /// Print a shell completion script
    Completions(CompletionsArgs),
    /// Write the man page and completion scripts into a directory
    #[command(hide = true)]
    Generate(GenerateArgs),
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub new: NewTaskArgs,

    #[command(flatten)]
    pub limits: Limits,
}

/// What a new task is made of, for `run` and `submit`: its id, its tools
/// and its command.
#[derive(Args, Debug)]
pub(crate) struct NewTaskArgs {
    /// The task's id [default: a new one]
    #[arg(long, value_name = "ID")]
    pub task: Option<String>,

    /// The tools file [default: ./durun.toml if it exists]
    #[arg(
        long,
        env = "DURUN_CONFIG",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,

    /// The agent command and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What `run` and `resume` may bound: waiting and tokens.
#[derive(Args, Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    /// Stop the task with exit 78 once its steps have spent N tokens, over
    /// all its runs (replayed steps cost nothing); on `resume`, raises or
    /// sets the budget [default: `[budget] max_tokens` in durun.toml]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_tokens: Option<u64>,

    /// How long a `wait` or `sleep` step is waited on live before durun
    /// parks the task and exits 77 (`0s`: at once) [default: `[wait]
    /// park_after` in durun.toml, else 60s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub park_after: Option<std::time::Duration>,
}

#[derive(Args, Debug)]
pub(crate) struct ResumeArgs {
    /// The task to resume
    #[arg(
        value_name = "TASK",
        add = unfinished_task_ids(),
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub task: Option<String>,

    /// Discard steps N and later from replay (kept in the journal as
    /// `discarded`) and run them anew; lists the `mutate` steps among them
    /// that already took effect
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "all", add = step_numbers())]
    pub from_step: Option<u64>,

    /// Resume every interrupted task (its runner is gone), the entry point
    /// for a daemon restarted by systemd or a pool of workers
    #[arg(long)]
    pub all: bool,

    /// With --all: how many tasks run at once [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,

    #[command(flatten)]
    pub limits: Limits,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["retry", "output", "fail"])))]
pub(crate) struct ResolveArgs {
    /// The task
    #[arg(value_name = "TASK", add = task_ids())]
    pub task: String,

    /// The step number
    #[arg(value_name = "STEP", value_parser = clap::value_parser!(u64).range(1..))]
    pub step: u64,

    /// Run the step again on the next resume
    #[arg(long)]
    pub retry: bool,

    /// The step took effect: record this JSON as its output; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub output: Option<serde_json::Value>,

    /// The step did not take effect: record it as failed with this message
    #[arg(long, value_name = "MESSAGE")]
    pub fail: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct CancelArgs {
    /// The task to cancel
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub task: String,
}

#[derive(Args, Debug)]
pub(crate) struct GcArgs {
    /// Delete tasks finished longer ago than this, like `30d` or `12h`
    #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
    pub older_than: std::time::Duration,
}

#[derive(Args, Debug)]
pub(crate) struct InspectArgs {
    /// The task to show [default: list the tasks, newest first]
    #[arg(value_name = "TASK", add = task_ids())]
    pub task: Option<String>,

    /// Print JSON for scripts (the shape is part of durun's contract)
    #[arg(long, conflicts_with = "follow")]
    pub json: bool,

    /// Show one step whole: args, output, error, key and timings
    #[arg(long, value_name = "N", requires = "task", value_parser = clap::value_parser!(u64).range(1..))]
    pub step: Option<u64>,

    /// Print the task's steps as they happen, until it stops running
    #[arg(long, requires = "task", conflicts_with = "step")]
    pub follow: bool,

    /// Show every step of a long task, not only the last 500
    #[arg(long, requires = "task", conflicts_with_all = ["step", "follow", "json"])]
    pub all: bool,

    /// List only tasks with this status
    #[arg(long, value_name = "STATUS", conflicts_with = "task")]
    pub status: Option<StatusFilter>,

    /// List at most this many tasks
    #[arg(long, value_name = "N", conflicts_with = "task")]
    pub limit: Option<usize>,

    /// List the live workers, their queues, heartbeats and tasks
    #[arg(long, conflicts_with_all = ["task", "status", "limit"])]
    pub workers: bool,
}

/// The statuses `inspect --status` filters on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatusFilter {
    Running,
    Completed,
    Failed,
    Interrupted,
    Cancelled,
    /// Parked until a signal comes: waiting for a person
    Waiting,
    /// Parked until a time
    Sleeping,
    /// Stopped by its token budget
    #[value(name = "over_budget")]
    OverBudget,
    /// Submitted, waiting for a worker
    Queued,
}

#[derive(Args, Debug)]
pub(crate) struct StepArgs {
    /// The step's name
    #[arg(value_name = "NAME")]
    pub name: String,

    /// `read` (safe to repeat) or `mutate` (changes the world)
    #[arg(long, value_name = "EFFECT", default_value = "read", value_parser = ["read", "mutate"])]
    pub effect: String,

    /// More of the step's identity, as a JSON object merged into its args; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub args: Option<serde_json::Value>,

    /// A file the command writes its token usage to, as JSON like
    /// {"input_tokens": 812, "output_tokens": 96} [default: a `usage`
    /// member of the command's stdout, if it prints a JSON object]
    #[arg(long, value_name = "FILE")]
    pub usage_json: Option<PathBuf>,

    /// The command and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct CallArgs {
    /// The tool, as named in durun.toml
    #[arg(value_name = "TOOL")]
    pub tool: String,

    /// The tool's args, as JSON; @FILE reads a file, @- standard input [default: {}]
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub args: Option<serde_json::Value>,

    /// Answer with one JSON object on stdout, failures too: {"ok": true,
    /// "output": …} or {"ok": false, "error": {"code": …, "message": …}};
    /// the code is `not_under_durun` outside a run when durun.toml has no
    /// such tool. For SDKs and scripts that must tell failures apart.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    pub new: NewTaskArgs,

    /// The queue the task waits in
    #[arg(long, value_name = "QUEUE", default_value = "default")]
    pub queue: String,

    /// The task's token budget over all its runs
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_tokens: Option<u64>,
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    /// A queue to take tasks from (repeat for several) [default: default]
    #[arg(long = "queue", value_name = "QUEUE")]
    pub queues: Vec<String>,

    /// How many tasks this worker runs at once
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: u32,

    /// A file with `[queues.NAME] concurrency = N`: at most N tasks of a
    /// queue run at once, over all workers [default: ./durun.toml if it
    /// exists]
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct WaitArgs {
    /// The signal's name
    #[arg(value_name = "NAME")]
    pub name: String,

    /// What the waiter shows the sender (part of the step's identity), as JSON; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub data: Option<serde_json::Value>,

    /// Fail the step if no signal came this long after it first waited, like `48h`
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["duration", "until"])))]
pub(crate) struct SleepArgs {
    /// How long, like `90s`, `2h` or `1d`
    #[arg(value_name = "DURATION", value_parser = sleep_duration)]
    pub duration: Option<std::time::Duration>,

    /// Until this time, RFC 3339 in UTC like 2026-12-01T09:00:00Z
    #[arg(long, value_name = "TIME", value_parser = time_text)]
    pub until: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct SignalArgs {
    /// The task
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub task: String,

    /// The signal's name: a `wait` step of that name takes it
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The signal's data, as JSON; @FILE reads a file, @- standard input [default: null]
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub data: Option<serde_json::Value>,

    /// An id for the signal: sending the same id twice records it once
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ApproveArgs {
    /// The task
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub task: String,

    /// More data for the agent, a JSON object merged into {"approved": true}; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub data: Option<serde_json::Value>,
}

#[derive(Args, Debug)]
pub(crate) struct RejectArgs {
    /// The task
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub task: String,

    /// Why, for the agent: {"approved": false, "reason": TEXT}
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ExportArgs {
    /// The task
    #[arg(value_name = "TASK", add = task_ids())]
    pub task: String,

    /// Write to this file (created 0600) [default: standard output]
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ImportArgs {
    /// A file `durun export` wrote (`-`: standard input)
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Import it under this id instead [default: the id it was exported with]
    #[arg(long, value_name = "NEW_ID")]
    pub task: Option<String>,

    /// Overwrite a task of the same id in this journal
    #[arg(long)]
    pub replace: bool,

    /// Queue it for `durun worker` [default: it waits, interrupted, for
    /// `durun resume`; an import never hands a task to workers unasked]
    #[arg(long, value_name = "QUEUE")]
    pub queue: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ForkArgs {
    /// The task to copy
    #[arg(value_name = "TASK", add = task_ids())]
    pub task: String,

    /// The first step the new task runs anew; steps before it are copied
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), add = step_numbers())]
    pub from_step: u64,

    /// The new task's id [default: a new one]
    #[arg(long = "task", value_name = "NEW_ID")]
    pub new_task: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
    /// The directory to write `man/` and `completions/` into
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out: PathBuf,
}

/// A time a user typed, checked and kept as typed.
/// A JSON argument: the JSON itself, `@FILE` (the file's JSON) or `@-`
/// (standard input's). Linux caps one argument at 128 KiB, a file has no
/// such limit.
pub(crate) fn json_arg(text: &str) -> Result<serde_json::Value, String> {
    let (source, what) = match text.strip_prefix('@') {
        Some("-") => {
            let mut input = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)
                .map_err(|err| format!("cannot read standard input: {err}"))?;
            (input, "standard input".to_owned())
        }
        Some(file) => (
            std::fs::read_to_string(file).map_err(|err| format!("cannot read {file}: {err}"))?,
            file.to_owned(),
        ),
        None => {
            return serde_json::from_str(text).map_err(|err| {
                format!(
                    "not JSON: {err}; quote it for the shell, like '{{\"key\": \"value\"}}' or '\"text\"', or give @FILE"
                )
            });
        }
    };
    serde_json::from_str(&source).map_err(|err| format!("{what} does not hold JSON: {err}"))
}

/// A sleep's length: a duration within what durun takes (SPEC 8).
fn sleep_duration(text: &str) -> Result<std::time::Duration, String> {
    let too_far = || {
        format!(
            "{text} is too far: a sleep is at most {:e} seconds (about 3,000 years); --until takes a date",
            crate::protocol::MAX_SLEEP_SECONDS
        )
    };
    match humantime::parse_duration(text) {
        Ok(duration) if duration.as_secs_f64() < crate::protocol::MAX_SLEEP_SECONDS => Ok(duration),
        Ok(_) | Err(humantime::DurationError::NumberOverflow) => Err(too_far()),
        Err(err) => Err(format!("{err}; a duration like 90s, 2h or 1d")),
    }
}

fn time_text(text: &str) -> Result<String, String> {
    match crate::clock::parse(text) {
        Some(_) => Ok(text.to_owned()),
        None => Err("expected an RFC 3339 time in UTC like 2026-12-01T09:00:00Z".to_owned()),
    }
}

/// Completes a task argument to the ids in the journal.
fn task_ids() -> clap_complete::ArgValueCompleter {
    clap_complete::ArgValueCompleter::new(crate::completion::task_ids)
}

/// Completes a task argument to the tasks that are not finished.
fn unfinished_task_ids() -> clap_complete::ArgValueCompleter {
    clap_complete::ArgValueCompleter::new(crate::completion::unfinished_task_ids)
}

/// Completes a step number to the steps of the task on the command line.
fn step_numbers() -> clap_complete::ArgValueCompleter {
    clap_complete::ArgValueCompleter::new(crate::completion::step_numbers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_command_lines() {
        let parse = |line: &str| Cli::try_parse_from(line.split_whitespace());
        let cases: &[(&str, bool)] = &[
            ("durun run -- python3 agent.py", true),
            ("durun run python3 -u agent.py --flag", true),
            ("durun run --task t1 --config d.toml -- ./agent", true),
            ("durun -q --journal /tmp/j.db run -- true", true),
            ("durun run --journal /tmp/j.db -- true", true),
            ("durun run", false),
            ("durun resume t1", true),
            ("durun resume", false),
            ("durun resume t1 --from-step 3", true),
            ("durun resume t1 --from-step 0", false),
            ("durun resume --all", true),
            ("durun resume --all --jobs 4", true),
            ("durun resume t1 --all", false),
            ("durun resolve t1 4 --retry", true),
            ("durun resolve t1 4 --output {}", true),
            ("durun resolve t1 4 --fail gone", true),
            ("durun resolve t1 4", false),
            ("durun resolve t1 4 --retry --fail x", false),
            ("durun cancel t1", true),
            ("durun gc --older-than 30d", true),
            ("durun gc --older-than soon", false),
            ("durun gc", false),
            ("durun inspect", true),
            ("durun inspect t1 --json", true),
            ("durun inspect t1 --step 3", true),
            ("durun inspect --step 3", false),
            ("durun inspect t1 --follow", true),
            ("durun inspect t1 --follow --json", false),
            ("durun inspect --status failed --limit 5", true),
            ("durun inspect t1 --status failed", false),
            ("durun inspect --status bogus", false),
            ("durun completions zsh", true),
            ("durun step build -- make all", true),
            ("durun step build --effect mutate --args {} -- make", true),
            ("durun step build --effect write -- make", false),
            ("durun step build", false),
            ("durun call create_pr --args {}", true),
            ("durun call", false),
            ("durun completions tcsh", false),
            ("durun wait approve", true),
            ("durun wait approve --data {} --timeout 48h", true),
            ("durun sleep 90s", true),
            ("durun sleep --until 2026-12-01T09:00:00Z", true),
            ("durun sleep", false),
            ("durun sleep soon", false),
            ("durun signal t1 go --data 1 --id a", true),
            ("durun signal t1", false),
            ("durun approve t1", true),
            ("durun reject t1 --reason no", true),
            ("durun export t1 -o f.jsonl", true),
            ("durun import f.jsonl --task t2 --replace", true),
            ("durun fork t1 --from-step 3", true),
            ("durun fork t1 --from-step 3 --task t2", true),
            ("durun fork t1", false),
            ("durun run --max-tokens 1000 --park-after 0s -- true", true),
            ("durun submit -- python3 agent.py", true),
            (
                "durun submit --queue q --task t1 --max-tokens 5 -- ./a",
                true,
            ),
            ("durun submit", false),
            ("durun worker", true),
            ("durun worker --queue a --queue b --jobs 4", true),
            ("durun worker --jobs 0", false),
            ("durun inspect --workers", true),
            ("durun inspect t1 --workers", false),
            ("durun resume t1 --max-tokens 5000", true),
            ("durun frobnicate", false),
        ];
        for (line, ok) in cases {
            assert_eq!(parse(line).is_ok(), *ok, "{line}");
        }
        let Ok(Cli {
            command: Command::Run(run),
            ..
        }) = parse("durun run python3 -u agent.py --task x")
        else {
            panic!("run parses");
        };
        assert_eq!(run.new.command, ["python3", "-u", "agent.py", "--task", "x"]);
        assert_eq!(run.new.task, None);
    }
}
