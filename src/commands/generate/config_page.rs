//! durun.toml(5): what each table and key of the tools file means, with
//! an example. Written here rather than derived: the file is read by serde,
//! not clap.

use anyhow::Result;
use clap_mangen::roff::{Roff, bold, roman};

use super::see_also;

/// `durun.toml(5)`: the tools file.
pub(super) fn config_page() -> Result<Vec<u8>> {
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
    (
        "probe",
        "How to ask the destination whether a step left in doubt took effect, before it runs again: { command = [\"./find-charge.sh\", \"{key}\"] } (exit 0 with its output: it did, and the step is reconciled with that output; exit 1: it did not, and the step runs again with its key) or { http = { method = \"GET\", url = \"https://…/charges/{key}\" } } (2xx with a body; 404), with the tool's headers. {key} is the step's key, {name} an arg. Any other answer leaves the step in doubt, as in_doubt says.",
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
