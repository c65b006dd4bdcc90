//! `durun.toml`: the tools an agent may call and the journal's sync mode
//! (SPEC 5).
//!
//! The file's text is recorded with the task when it starts, and a resume
//! reads that recorded text, never the file on disk: the tools a task
//! replays against must be the tools it ran with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;

use crate::error::Failure;

mod expand;
mod limit;
mod mcp;
mod proxy;
mod schedules;
mod size;
mod tool;

pub(crate) use expand::{Secrets, expand_env_noting};
pub(crate) use limit::Limit;
pub(crate) use mcp::{MCP_MAX_MESSAGE, McpServerConfig};
#[cfg(test)]
pub(crate) use proxy::check_ignore;
pub(crate) use proxy::{MAX_RECORD, MODEL_ROUTES, ProxyConfig, RouteConfig, check_upstream};
pub(crate) use schedules::{CatchUp, MAX_CATCH_UP, Schedule};
use tool::RawTool;
pub(crate) use tool::{HttpSpec, InDoubt, OutputMode, Tool, ToolKind};

/// The file `run` looks for in its working directory.
pub(crate) const FILE_NAME: &str = "durun.toml";

/// How hard the journal pushes each commit to the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SyncMode {
    /// fsync on every commit: a committed step survives a power cut.
    Full,
    /// No fsync on commit: survives any process crash, not a power cut.
    Normal,
}

impl SyncMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Normal => "normal",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "full" => Some(Self::Full),
            "normal" => Some(Self::Normal),
            _ => None,
        }
    }
}

/// The first wait before a failed task's retry, unless `--backoff` or
/// `[queues.NAME] backoff` says; it doubles with each retry.
pub(crate) const DEFAULT_BACKOFF: Duration = Duration::from_secs(10);

/// A validated `durun.toml`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Config {
    /// The text it was read from, recorded with the task.
    pub(crate) source: String,
    pub(crate) sync: Option<SyncMode>,
    pub(crate) tools: BTreeMap<String, Arc<Tool>>,
    /// `[wait] park_after`: how long a wait is waited on live.
    pub(crate) park_after: Option<Duration>,
    /// `[budget] max_tokens`.
    pub(crate) max_tokens: Option<u64>,
    /// `[budget] max_usd`, in nano-dollars.
    pub(crate) max_cost_nanos: Option<u64>,
    /// `[limits.NAME]` (SPEC 19).
    pub(crate) limits: Vec<Limit>,
    /// `[queues.NAME] concurrency`: a worker's limits per queue.
    pub(crate) queues: BTreeMap<String, u32>,
    /// `[queues.NAME] retries`, `backoff`: what `durun submit` gives the
    /// tasks of the queue unless it is told otherwise (SPEC 16).
    pub(crate) queue_retries: BTreeMap<String, (u32, Duration)>,
    /// `[proxy]`: the model/API proxy (SPEC 12).
    pub(crate) proxy: ProxyConfig,
    /// `[mcp.NAME]`: which of an MCP server's tools read and which mutate,
    /// over its own annotations (SPEC 13).
    pub(crate) mcp: BTreeMap<String, McpServerConfig>,
    /// `[mcp] max_message`: the largest JSON-RPC message `durun mcp`
    /// relays, either way (SPEC 17); [`MCP_MAX_MESSAGE`] when unset.
    pub(crate) mcp_max_message: Option<usize>,
    /// `[agent] stdin`: what the agent's stdin is, unless `--stdin` says.
    pub(crate) agent_stdin: Option<StdinMode>,
    /// `[otel] endpoint`: the OTLP/HTTP base URL traces go to, under the
    /// standard variables (SPEC 15).
    pub(crate) otel_endpoint: Option<String>,
    /// `[schedules.NAME]`: tasks the workers submit on a clock (SPEC 16).
    pub(crate) schedules: Vec<Schedule>,
    /// `[prices."MODEL"]` over the built-in table (SPEC 19).
    pub(crate) prices: crate::prices::Prices,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    agent: RawAgent,
    #[serde(default)]
    journal: RawJournal,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
    #[serde(default)]
    wait: RawWait,
    #[serde(default)]
    budget: RawBudget,
    #[serde(default)]
    queues: BTreeMap<String, RawQueue>,
    #[serde(default)]
    proxy: proxy::RawProxy,
    /// `[mcp.NAME]` tables, and `[mcp] max_message`.
    #[serde(default)]
    mcp: BTreeMap<String, toml::Value>,
    #[serde(default)]
    otel: RawOtel,
    #[serde(default)]
    schedules: BTreeMap<String, schedules::RawSchedule>,
    #[serde(default)]
    prices: BTreeMap<String, RawPrice>,
    #[serde(default)]
    limits: BTreeMap<String, RawLimit>,
}

/// `[limits.NAME]`: a limit the runs and workers on the journal share.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    r#match: String,
    rpm: Option<u64>,
    tpm: Option<u64>,
    concurrency: Option<u64>,
}

/// `[prices."MODEL"]`: USD per million tokens.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    input: f64,
    output: f64,
    cached_input: Option<f64>,
    /// The most output tokens one call may get (a budget's worst case).
    max_output: Option<u64>,
}

/// `[agent]`: how the agent is started.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    stdin: Option<StdinMode>,
}

/// What the agent's stdin is (SPEC 17): `run --stdin`, `[agent] stdin`.
/// (The variants' comments are not doc comments: clap would show them as
/// a list under `--stdin` in every `-h`.)
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StdinMode {
    // durun's answers: the agent speaks the protocol on stdin and stdout.
    #[default]
    Protocol,
    // durun's own stdin (a terminal, a pipe): the agent speaks the
    // protocol over `DURUN_SOCKET` only, and its stdout is durun's.
    Inherit,
    // `/dev/null`: for an agent that reads its stdin to the end before it
    // starts; the protocol over `DURUN_SOCKET` only, its stdout durun's.
    Null,
}

/// `[otel]`: where traces go when the environment does not say.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawOtel {
    endpoint: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    concurrency: Option<u32>,
    retries: Option<u32>,
    backoff: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawJournal {
    sync: Option<SyncMode>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawWait {
    park_after: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    max_tokens: Option<u64>,
    max_usd: Option<f64>,
}

/// `[limits.NAME]` tables, checked.
fn limits_of(raw: BTreeMap<String, RawLimit>) -> anyhow::Result<Vec<Limit>> {
    let mut limits = Vec::new();
    for (name, limit) in raw {
        crate::names::check_given_name("limit name", &name)
            .map_err(|err| Failure::config(format!("[limits.{name:?}]: {err:#}")))?;
        if limit.r#match.trim().is_empty() {
            return Err(Failure::config(format!(
                "[limits.{name}] match is empty: name a proxy route, e.g. \"openai\" or \"openai:gpt-4o*\""
            ))
            .into());
        }
        let amounts = [limit.rpm, limit.tpm, limit.concurrency];
        if amounts.iter().all(Option::is_none) || amounts.contains(&Some(0)) {
            return Err(Failure::config(format!(
                "[limits.{name}] caps nothing: give it rpm, tpm or concurrency, each 1 or more"
            ))
            .into());
        }
        limits.push(Limit {
            rpm: limit.rpm,
            tpm: limit.tpm,
            concurrency: limit.concurrency,
            ..Limit::matching(&name, &limit.r#match)
        });
    }
    Ok(limits)
}

impl Config {
    /// Finds the config for a new task: `explicit` (from `--config` or
    /// `DURUN_CONFIG`) must exist; otherwise `durun.toml` in `cwd` is used
    /// if there is one, and no tools if not.
    pub(crate) fn discover(
        explicit: Option<&Path>,
        cwd: &Path,
    ) -> anyhow::Result<(Self, Option<PathBuf>)> {
        let path = match explicit {
            Some(path) => cwd.join(path),
            None => {
                let path = cwd.join(FILE_NAME);
                if !path.exists() {
                    return Ok((Self::default(), None));
                }
                path
            }
        };
        let text = std::fs::read_to_string(&path).map_err(|err| {
            Failure::config(format!("cannot read config {}: {err}", path.display()))
                .hint("pass an existing file with --config, or leave it out to use ./durun.toml")
        })?;
        let config =
            Self::parse(&text).with_context(|| format!("invalid config {}", path.display()))?;
        Ok((config, Some(path)))
    }

    /// Parses and checks the text of a `durun.toml`.
    pub(crate) fn parse(text: &str) -> anyhow::Result<Self> {
        let raw: RawConfig = toml::from_str(text)
            .map_err(|err| Failure::config(err.to_string().trim_end().to_owned()))?;
        let mut schedules = Vec::new();
        for (name, raw_schedule) in raw.schedules {
            schedules
                .push(Schedule::from_raw(&name, raw_schedule).map_err(|message| {
                    Failure::config(format!("[schedules.{name}]: {message}"))
                })?);
        }
        let mut tools = BTreeMap::new();
        for (name, raw_tool) in raw.tools {
            let tool = Tool::from_raw(&name, raw_tool)
                .map_err(|message| Failure::config(format!("tool `{name}`: {message}")))?;
            tools.insert(name, Arc::new(tool));
        }
        let park_after = raw
            .wait
            .park_after
            .map(|text| {
                humantime::parse_duration(&text).map_err(|err| {
                    Failure::config(format!("[wait] park_after = {text:?}: {err}"))
                        .hint("a duration like \"60s\", \"10m\" or \"0s\" (park at once)")
                })
            })
            .transpose()?;
        let proxy = raw.proxy.check().map_err(Failure::config)?;
        let mut prices = crate::prices::Prices::default();
        for (model, price) in raw.prices {
            let amounts = [Some(price.input), Some(price.output), price.cached_input];
            if amounts
                .iter()
                .flatten()
                .any(|usd| !usd.is_finite() || *usd < 0.0 || *usd > 1e6)
            {
                return Err(Failure::config(format!(
                    "[prices.{model:?}]: a price is USD per million tokens, 0 or more"
                ))
                .into());
            }
            prices.overrides.insert(
                model,
                crate::prices::Price {
                    max_output: price.max_output,
                    ..crate::prices::Price::per_million(
                        price.input,
                        price.output,
                        price.cached_input,
                    )
                },
            );
        }
        let limits = limits_of(raw.limits)?;
        let (mcp, mcp_max_message) = mcp::mcp_tables(raw.mcp)?;
        Ok(Self {
            source: text.to_owned(),
            sync: raw.journal.sync,
            tools,
            park_after,
            max_tokens: raw.budget.max_tokens,
            limits,
            max_cost_nanos: raw
                .budget
                .max_usd
                .map(|usd| {
                    crate::prices::nanos_of_usd(usd).ok_or_else(|| {
                        Failure::config("[budget] max_usd: a budget is dollars, 0 or more")
                    })
                })
                .transpose()?,
            queue_retries: raw
                .queues
                .iter()
                .filter_map(|(name, queue)| Some((name, queue.retries?, queue.backoff.as_deref())))
                .map(|(name, retries, backoff)| {
                    let backoff = backoff.map_or(Ok(DEFAULT_BACKOFF), |text| {
                        humantime::parse_duration(text).map_err(|err| {
                            Failure::config(format!("[queues.{name}] backoff = {text:?}: {err}"))
                                .hint("a duration like \"30s\" or \"5m\"")
                        })
                    })?;
                    Ok((name.clone(), (retries, backoff)))
                })
                .collect::<anyhow::Result<_>>()?,
            queues: raw
                .queues
                .into_iter()
                .filter_map(|(name, queue)| Some((name, queue.concurrency?)))
                .collect(),
            proxy,
            mcp,
            mcp_max_message,
            otel_endpoint: raw.otel.endpoint,
            agent_stdin: raw.agent.stdin,
            schedules,
            prices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::expand::{expand_env, expand_with};
    use super::*;
    use crate::protocol::Effect;
    use serde_json::json;

    #[test]
    fn reads_the_spec_example() {
        let config = Config::parse(
            r#"
            [journal]
            sync = "normal"
            [tools.read_file]
            effect = "read"
            command = ["cat", "{path}"]
            output = "text"
            timeout = "30s"
            [tools.create_pr]
            command = ["./create-pr.sh", "--title={title}", "{{literal}}", "${HOME}", "{ a; }", "{n}", "{\"a\": {\"b\": 1}}"]
            stdin = "args"
            output = "json"
            retries = 2
            "#,
        )
        .expect("valid config");
        assert_eq!(config.sync, Some(SyncMode::Normal));
        let read = &config.tools["read_file"];
        assert_eq!(
            (read.effect, read.timeout),
            (Effect::Read, Some(Duration::from_secs(30)))
        );
        let pr = &config.tools["create_pr"];
        assert_eq!((pr.effect, pr.retries), (Effect::Mutate, 2));
        let ToolKind::Command {
            argv,
            stdin_args: true,
        } = &pr.kind
        else {
            panic!(
                "create_pr is a command with its args on stdin: {:?}",
                pr.kind
            );
        };
        assert_eq!(
            pr.argv(argv, &json!({"title": "Fix typo", "n": 3}))
                .expect("fits"),
            [
                "./create-pr.sh",
                "--title=Fix typo",
                "{literal}",
                "${HOME}",
                "{ a; }",
                "3",
                r#"{"a": {"b": 1}}"#
            ]
        );
        assert_eq!(
            pr.argv(argv, &json!({})).unwrap_err(),
            "tool `create_pr` needs `args.title`"
        );
    }

    #[test]
    fn expands_the_environment() {
        assert_eq!(
            expand_env("a ${DURUN_TEST_EXPAND} b").as_deref(),
            Ok("a x1 b")
        );
        assert_eq!(
            expand_env("${DURUN_TEST_UNSET_VAR:-8765}/p").as_deref(),
            Ok("8765/p")
        );
        assert!(
            expand_env("${DURUN_TEST_UNSET_VAR}")
                .unwrap_err()
                .contains("DURUN_TEST_UNSET_VAR is not set")
        );
        assert_eq!(
            expand_env("no vars, {braces}").as_deref(),
            Ok("no vars, {braces}")
        );
    }

    #[test]
    fn secrets_are_written_back_as_their_variables() {
        let mut secrets = Secrets::default();
        let url = expand_with("http://h/${DURUN_TEST_SECRET}/x", &mut secrets, |_| {
            Some("sk-live-123".to_owned())
        })
        .expect("set");
        assert_eq!(
            secrets.redact(&format!("could not reach {url}")),
            "could not reach http://h/${DURUN_TEST_SECRET}/x"
        );
        let mut body = json!({"echo": ["Bearer sk-live-123"]});
        secrets.redact_value(&mut body);
        assert_eq!(body, json!({"echo": ["Bearer ${DURUN_TEST_SECRET}"]}));
    }

    #[test]
    fn rejects_what_it_cannot_run() {
        for (text, fragment) in [
            ("[tools.a]\neffect = \"read\"", "needs `command"),
            ("[tools.a]\ncommand = []", "needs a program"),
            (
                "[tools.a]\ncommand = [\"x\"]\ntimeout = \"soon\"",
                "not a duration",
            ),
            (
                "[tools.a]\ncommand = [\"x\"]\ntimeout = \"0s\"",
                "longer than zero",
            ),
            ("[tools.a]\ncommand = [\"x\"]\ncolour = 1", "unknown field"),
            (
                "[tools.a]\ncommand = [\"x\"]\neffect = \"write\"",
                "unknown variant",
            ),
        ] {
            let err = format!("{:#}", Config::parse(text).unwrap_err());
            assert!(err.contains(fragment), "{text}: {err}");
        }
    }
}
