//! The arguments of waiting (SPEC 8): the steps that wait for the world
//! (`wait`, `sleep`) and the commands that answer them (`signal`,
//! `approve`, `reject`); their `///` comments are the help text.

use clap::Args;

use super::args::{TaskJson, parse_usd};
use super::values::{json_arg, sleep_duration, time_text, unfinished_task_ids};

#[derive(Args, Debug)]
pub(crate) struct WaitArgs {
    /// The signal's name
    #[arg(value_name = "NAME")]
    pub(crate) name: String,

    /// What the waiter shows the sender (part of the step's identity), as JSON; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub(crate) data: Option<serde_json::Value>,

    /// Fail the step if no signal came this long after it first waited, like `48h`
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Option<std::time::Duration>,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["duration", "until"])))]
pub(crate) struct SleepArgs {
    /// How long, like `90s`, `2h` or `1d`
    #[arg(value_name = "DURATION", value_parser = sleep_duration)]
    pub(crate) duration: Option<std::time::Duration>,

    /// Until this time, RFC 3339 in UTC like 2026-12-01T09:00:00Z
    #[arg(long, value_name = "TIME", value_parser = time_text)]
    pub(crate) until: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct SignalArgs {
    /// The task
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub(crate) task: String,

    /// The signal's name: a `wait` step of that name takes it
    #[arg(value_name = "NAME")]
    pub(crate) name: String,

    /// The signal's data, as JSON; @FILE reads a file, @- standard input [default: null]
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub(crate) data: Option<serde_json::Value>,

    /// An id for the signal: sending the same id twice records it once
    #[arg(long, value_name = "ID")]
    pub(crate) id: Option<String>,

    #[command(flatten)]
    pub(crate) output: TaskJson,
}

#[derive(Args, Debug)]
pub(crate) struct ApproveArgs {
    /// The task
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub(crate) task: String,

    /// More data for the agent, a JSON object merged into {"approved": true}; @FILE reads a file, @- standard input
    #[arg(long, value_name = "JSON", value_parser = json_arg)]
    pub(crate) data: Option<serde_json::Value>,

    /// Raise the task's token budget by N: a task stopped over its budget
    /// goes on at its next `resume` (or worker); a task that waits for no
    /// signal gets none
    #[arg(long, value_name = "N")]
    pub(crate) add_tokens: Option<u64>,

    /// Raise the task's budget in dollars by USD, as --add-tokens does
    /// its token budget
    #[arg(long = "add-usd", value_name = "USD", value_parser = parse_usd)]
    pub(crate) add_cost_nanos: Option<u64>,

    #[command(flatten)]
    pub(crate) output: TaskJson,
}

#[derive(Args, Debug)]
pub(crate) struct RejectArgs {
    /// The task
    #[arg(value_name = "TASK", add = unfinished_task_ids())]
    pub(crate) task: String,

    /// Why, for the agent: {"approved": false, "reason": TEXT}
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: Option<String>,

    #[command(flatten)]
    pub(crate) output: TaskJson,
}
