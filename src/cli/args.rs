//! The arguments of each command; their `///` comments are the help text.

use std::path::PathBuf;

use clap::Args;

use super::values::{json_arg, step_numbers, task_ids, unfinished_task_ids};

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) new: NewTaskArgs,

    /// How many child tasks without a queue run at once beside the agent
    /// [default: the number of cores]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) jobs: Option<u32>,

    #[command(flatten)]
    pub(crate) limits: Limits,
}

// What a new task is made of, for `run` and `submit`: its id, its tools
// and its command. (Not a doc comment: clap would make a flattened
// struct's doc its subcommand's about, over the variant's.)
#[derive(Args, Debug)]
pub(crate) struct NewTaskArgs {
    /// The task's id [default: a new one]
    #[arg(long, value_name = "ID")]
    pub(crate) task: Option<String>,

    /// The tools file [default: ./durun.toml if it exists]
    #[arg(
        long,
        env = "DURUN_CONFIG",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub(crate) config: Option<PathBuf>,

    /// The agent command and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

// What `run` and `resume` may bound: waiting and tokens. (Not a doc
// comment: see `NewTaskArgs`.)
#[derive(Args, Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    /// Stop the task with exit 78 once its steps have spent N tokens, over
    /// all its runs (replayed steps cost nothing); on `resume`, raises or
    /// sets the budget [default: `[budget] max_tokens` in durun.toml]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) max_tokens: Option<u64>,

    /// Keep the task's model calls within USD dollars, over all its runs:
    /// a call is forwarded only if its worst case (input, and its
    /// max_tokens or the model's output limit, at the model's price) fits;
    /// on `resume`, raises or sets the budget [default: `[budget] max_usd`
    /// in durun.toml]
    #[arg(long = "max-usd", value_name = "USD", value_parser = parse_usd)]
    pub(crate) max_cost_nanos: Option<u64>,

    /// What a live run does when a model call does not fit the budget:
    /// `stop` (exit 78, the task `over_budget`) or `wait` until `durun
    /// approve TASK --add-usd X` (or `--add-tokens N`) raises it
    #[arg(long, value_name = "WHAT", value_enum, default_value_t = OnBudget::Stop)]
    pub(crate) on_budget: OnBudget,

    /// How long a `wait` or `sleep` step is waited on live before durun
    /// parks the task and exits 77 (`0s`: at once) [default: `[wait]
    /// park_after` in durun.toml, else 60s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) park_after: Option<std::time::Duration>,

    /// Do not start the model/API proxy: the agent's OPENAI_BASE_URL,
    /// ANTHROPIC_BASE_URL and GOOGLE_GEMINI_BASE_URL are left as they
    /// are and its model calls are
    /// not journaled unless it journals them itself [default: `[proxy]
    /// enabled` in durun.toml, else on]
    #[arg(long)]
    pub(crate) no_proxy: bool,

    /// The agent's stdin: `protocol`, durun's answers; `inherit`, durun's
    /// own stdin, or `null`, /dev/null, for an agent that reads its stdin
    /// itself (it then speaks the protocol over DURUN_SOCKET only, and its
    /// stdout is durun's) [default: `[agent] stdin` in durun.toml, else
    /// protocol]
    #[arg(long, value_name = "MODE")]
    pub(crate) stdin: Option<crate::config::StdinMode>,

    /// The coding-agent CLI the command runs, for its wiring to the proxy,
    /// its stdin and the request fields it changes on every call (`durun
    /// presets` lists them), or `none` [default: found by the program's
    /// name]
    #[arg(long, value_name = "NAME", value_parser = crate::presets::Choice::parse)]
    pub(crate) preset: Option<crate::presets::Choice>,

    /// `durun test`'s kill point, `STEP:POINT[:DELAY_MS]`: durun kills itself
    /// there with SIGKILL
    #[arg(long, value_name = "STEP:POINT", hide = true)]
    pub(crate) crash_at: Option<crate::supervisor::CrashAt>,

    /// `run --jobs`, `resume TASK --jobs`: child tasks beside the agent.
    #[arg(skip)]
    pub(crate) child_jobs: Option<u32>,
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
    pub(crate) task: Option<String>,

    /// Discard steps N and later from replay (kept in the journal as
    /// `discarded`) and run them anew; lists the `mutate` steps among them
    /// that already took effect
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "all", add = step_numbers())]
    pub(crate) from_step: Option<u64>,

    /// Resume every interrupted task (its runner is gone), the entry point
    /// for a daemon restarted by systemd or a pool of workers
    #[arg(long)]
    pub(crate) all: bool,

    /// With --all: how many tasks run at once [default: 1]; of one task:
    /// how many of its child tasks without a queue run at once beside its
    /// agent [default: the number of cores]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) jobs: Option<u32>,

    /// Print the task as `inspect TASK --json` does once its run ends, for
    /// scripts and agents (`durun mcp-server`)
    #[arg(long, conflicts_with = "all")]
    pub(crate) json: bool,

    #[command(flatten)]
    pub(crate) limits: Limits,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("decision").required(true).args(["retry", "output", "fail"])))]
pub(crate) struct ResolveArgs {
    /// The task
    #[arg(value_name = "TASK", add = task_ids())]
    pub(crate) task: String,

    /// The step number
    #[arg(value_name = "STEP", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) step: u64,

    /// Run the step again on the next resume
    #[arg(long)]
    pub(crate) retry: bool,

    /// The step took effect: record this JSON as its output; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub(crate) output: Option<serde_json::Value>,

    /// The step did not take effect: record it as failed with this message
    #[arg(long, value_name = "MESSAGE")]
    pub(crate) fail: Option<String>,
}

// `--json` of a command that acts on a task: the task, once done. (Not a
// doc comment: see `NewTaskArgs`.)
#[derive(Args, Debug)]
pub(crate) struct TaskJson {
    /// Print the task as `inspect TASK --json` does once done, for scripts
    /// and agents (`durun mcp-server`)
    #[arg(long)]
    json: bool,
}

impl TaskJson {
    /// `task`, if it is to be printed.
    pub(crate) fn of<'a>(&self, task: &'a str) -> Option<&'a str> {
        self.json.then_some(task)
    }
}

#[derive(Args, Debug)]
pub(crate) struct CancelArgs {
    /// The task to cancel
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub(crate) task: String,

    #[command(flatten)]
    pub(crate) output: TaskJson,
}

#[derive(Args, Debug)]
pub(crate) struct GcArgs {
    /// Delete tasks finished longer ago than this, like `30d` or `12h`
    #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
    pub(crate) older_than: std::time::Duration,
}

#[derive(Args, Debug)]
pub(crate) struct InspectArgs {
    /// The task to show [default: list the tasks, newest first]
    #[arg(value_name = "TASK", add = task_ids())]
    pub(crate) task: Option<String>,

    /// Print JSON for scripts (the shape is part of durun's contract)
    #[arg(long)]
    pub(crate) json: bool,

    /// Show one step whole: args, output, error, key and timings
    #[arg(long, value_name = "N", requires = "task", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) step: Option<u64>,

    /// Print the task's steps as they happen, until it stops running;
    /// with --json, its events (runs and steps opened, finished, replayed,
    /// failed, waiting) as JSON lines
    #[arg(long, requires = "task", conflicts_with = "step")]
    pub(crate) follow: bool,

    /// With --follow --json: start right after the event with this id (as
    /// `Last-Event-ID` does for the web view's stream)
    #[arg(long, value_name = "ID", requires = "follow", requires = "json")]
    pub(crate) after: Option<String>,

    /// Show every step of a long task, not only the last 500
    #[arg(long, requires = "task", conflicts_with_all = ["step", "follow", "json"])]
    pub(crate) all: bool,

    /// List only tasks with this status
    #[arg(long, value_name = "STATUS", conflicts_with = "task")]
    pub(crate) status: Option<StatusFilter>,

    /// List at most this many tasks
    #[arg(long, value_name = "N", conflicts_with = "task")]
    pub(crate) limit: Option<usize>,

    /// List the live workers, their queues, heartbeats and tasks
    #[arg(long, conflicts_with_all = ["task", "status", "limit"])]
    pub(crate) workers: bool,

    /// List the tasks as trees: each child under the task that spawned it
    #[arg(long, conflicts_with_all = ["task", "workers", "limit"])]
    pub(crate) tree: bool,
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
    pub(crate) name: String,

    /// `read` (safe to repeat) or `mutate` (changes the world)
    #[arg(long, value_name = "EFFECT", default_value = "read", value_parser = ["read", "mutate"])]
    pub(crate) effect: String,

    /// More of the step's identity, as a JSON object merged into its args; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub(crate) args: Option<serde_json::Value>,

    /// A file the command writes its token usage to, as JSON like
    /// {"input_tokens": 812, "output_tokens": 96} [default: a `usage`
    /// member of the command's stdout, if it prints a JSON object]
    #[arg(long, value_name = "FILE")]
    pub(crate) usage_json: Option<PathBuf>,

    /// The command and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct McpArgs {
    /// The server's name in step names, `mcp NAME/TOOL`, and in durun.toml's
    /// `[mcp.NAME]` [default: the name the server gives itself]
    #[arg(long, value_name = "NAME")]
    pub(crate) name: Option<String>,

    /// A server on the streamable HTTP transport, instead of a command
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    pub(crate) url: Option<String>,

    /// The server's command and its arguments
    #[arg(
        trailing_var_arg = true,
        value_name = "CMD",
        required_unless_present = "url"
    )]
    pub(crate) command: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct McpServerArgs {
    /// Serve on the streamable HTTP transport at http://ADDR:PORT/mcp
    /// instead of stdin/stdout; a port of 0 picks a free one. Prints the
    /// URL, then the token a client sends as Authorization: Bearer TOKEN
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) listen: Option<std::net::SocketAddr>,

    /// With --listen: read the token every client must bring from FILE
    /// instead of making one (needed with an address that is not a
    /// loopback one)
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub(crate) token_file: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct SkillArgs {
    #[command(subcommand)]
    pub(crate) action: SkillAction,
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum SkillAction {
    /// Write the skill (SKILL.md, with its front matter) where the agent finds it
    Install {
        /// The skill's directory
        #[arg(long, value_name = "DIR", default_value = ".claude/skills/durun")]
        dir: PathBuf,
    },
}

#[derive(Args, Debug)]
pub(crate) struct CallArgs {
    /// The tool, as named in durun.toml
    #[arg(value_name = "TOOL")]
    pub(crate) tool: String,

    /// The tool's args, as JSON; @FILE reads a file, @- standard input [default: {}]
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub(crate) args: Option<serde_json::Value>,

    /// Answer with one JSON object on stdout, failures too: {"ok": true,
    /// "output": …} or {"ok": false, "error": {"code": …, "message": …}};
    /// the code is `not_under_durun` outside a run when durun.toml has no
    /// such tool. For SDKs and scripts that must tell failures apart.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    pub(crate) new: NewTaskArgs,

    /// The queue the task waits in
    #[arg(long, value_name = "QUEUE", default_value = "default")]
    pub(crate) queue: String,

    /// The task's token budget over all its runs
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) max_tokens: Option<u64>,

    /// The task's budget in dollars over all its runs
    #[arg(long = "max-usd", value_name = "USD", value_parser = parse_usd)]
    pub(crate) max_cost_nanos: Option<u64>,

    /// Resume the task up to N times after a run that failed (any exit but
    /// 0, 64, 65 and 75 to 78) [default: `[queues.QUEUE] retries` in
    /// durun.toml, else 0]
    #[arg(long, value_name = "N")]
    pub(crate) retries: Option<u32>,

    /// How long after the failure the first retry starts; each next waits
    /// twice as long [default: `[queues.QUEUE] backoff`, else 10s]
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    pub(crate) backoff: Option<std::time::Duration>,
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    /// A queue to take tasks from (repeat for several) [default: default]
    #[arg(long = "queue", value_name = "QUEUE")]
    pub(crate) queues: Vec<String>,

    /// How many tasks this worker runs at once
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) jobs: u32,

    /// A file with `[queues.NAME] concurrency = N`: at most N tasks of a
    /// queue run at once, over all workers [default: ./durun.toml if it
    /// exists]
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ExportArgs {
    /// The task
    #[arg(value_name = "TASK", add = task_ids())]
    pub(crate) task: String,

    /// Write to this file (created 0600) [default: standard output]
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ImportArgs {
    /// A file `durun export` wrote (`-`: standard input)
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,

    /// Import it under this id instead [default: the id it was exported with]
    #[arg(long, value_name = "NEW_ID")]
    pub(crate) task: Option<String>,

    /// Overwrite a task of the same id in this journal
    #[arg(long)]
    pub(crate) replace: bool,

    /// Queue it for `durun worker` [default: it waits, interrupted, for
    /// `durun resume`; an import never hands a task to workers unasked]
    #[arg(long, value_name = "QUEUE")]
    pub(crate) queue: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ForkArgs {
    /// The task to copy
    #[arg(value_name = "TASK", add = task_ids())]
    pub(crate) task: String,

    /// The first step the new task runs anew; steps before it are copied
    #[arg(long, visible_alias = "at", value_name = "N", value_parser = clap::value_parser!(u64).range(1..), add = step_numbers())]
    pub(crate) from_step: u64,

    /// Answer step N with this file instead of running it: for a model
    /// call, the answer body the agent gets (status 200, the recorded
    /// content type); for any other step, its output as JSON. Steps before
    /// N replay, step N is marked edited, and the task runs live after it
    #[arg(long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,

    /// The new task's id [default: a new one]
    #[arg(long = "task", value_name = "NEW_ID")]
    pub(crate) new_task: Option<String>,

    /// Print the new task as `inspect TASK --json` does instead of its id,
    /// for scripts and agents (`durun mcp-server`)
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
    /// The directory to write `man/` and `completions/` into
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub(crate) out: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct UiArgs {
    /// Where to serve: an address and port; a port of 0 picks a free one
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:7878")]
    pub(crate) listen: std::net::SocketAddr,

    /// Read the token every visitor must bring from FILE instead of making
    /// one (needed with a --listen that is not a loopback address)
    #[arg(long, value_name = "FILE")]
    pub(crate) token_file: Option<std::path::PathBuf>,

    /// Open the page in the desktop's browser (xdg-open, or open on macOS)
    #[arg(long)]
    pub(crate) open: bool,

    /// Let `POST /api/tasks` queue a task for workers: any command, run as
    /// the workers' user by whoever has the token
    #[arg(long)]
    pub(crate) allow_submit: bool,
}

#[derive(Args, Debug)]
pub(crate) struct DiffArgs {
    /// The first task
    #[arg(value_name = "TASK_A", add = task_ids())]
    pub(crate) a: String,

    /// The task to compare with it
    #[arg(value_name = "TASK_B", add = task_ids())]
    pub(crate) b: String,

    /// Print JSON for scripts
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct PresetsArgs {
    /// Print JSON for scripts
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct SchedulesArgs {
    /// The file with the `[schedules.NAME]` [default: ./durun.toml if it
    /// exists]
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// Print JSON for scripts
    #[arg(long)]
    pub(crate) json: bool,
}

/// A number of dollars, as nano-dollars.
pub(crate) fn parse_usd(text: &str) -> Result<u64, String> {
    text.trim_start_matches('$')
        .parse::<f64>()
        .ok()
        .and_then(crate::prices::nanos_of_usd)
        .ok_or_else(|| format!("`{text}` is not a number of dollars (e.g. 2.50)"))
}

/// `--on-budget`: what a live run does when a model call does not fit.
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum OnBudget {
    /// End the run: the task is `over_budget`, durun exits 78.
    #[default]
    Stop,
    /// Hold the call, or the agent's next step, until `durun approve`
    /// raises the budget.
    Wait,
}
