//! `[tools.NAME]`: the tools a `call` runs, a command or an HTTP request,
//! checked when the config is read (SPEC 5).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::expand::{Piece, parse_template};
use crate::protocol::Effect;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tool {
    pub(crate) name: String,
    pub(crate) effect: Effect,
    /// What runs: a command or an HTTP request.
    pub(crate) kind: ToolKind,
    pub(crate) output: OutputMode,
    pub(crate) timeout: Option<Duration>,
    /// More attempts after a failure, with backoff.
    pub(crate) retries: u32,
    /// Whether a step left in doubt by a dead run is retried on resume
    /// (`retry`, for tools that honour the idempotency key) or waits for
    /// `durun resolve` (`ask`, for tools that do not).
    pub(crate) in_doubt: InDoubt,
    /// How to ask the tool's destination whether a step left in doubt took
    /// effect (SPEC 22): `{key}` is the step's key.
    pub(crate) probe: Option<Probe>,
}

/// A probe: a command (exit 0 with its output: it took effect; exit 1:
/// it did not) or an HTTP request (2xx with a body; 404).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Probe {
    Command(Vec<String>),
    Http { method: String, url: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbe {
    command: Option<Vec<String>>,
    http: Option<RawHttp>,
}

impl Probe {
    fn from_raw(raw: RawProbe) -> Result<Self, String> {
        match (raw.command, raw.http) {
            (Some(argv), None) => {
                if argv.first().is_none_or(String::is_empty) {
                    return Err("`probe.command` needs a program as its first element".to_owned());
                }
                Ok(Self::Command(argv))
            }
            (None, Some(http)) => {
                let method = http
                    .method
                    .unwrap_or_else(|| "GET".to_owned())
                    .to_ascii_uppercase();
                if !["GET", "POST", "HEAD"].contains(&method.as_str()) {
                    return Err(format!(
                        "`probe.http.method = {method:?}` is not GET, POST or HEAD: a probe only asks"
                    ));
                }
                if !(http.url.starts_with("http://")
                    || http.url.starts_with("https://")
                    || http.url.starts_with("${"))
                {
                    return Err(format!(
                        "`probe.http.url = {:?}` must start with http:// or https://",
                        http.url
                    ));
                }
                Ok(Self::Http {
                    method,
                    url: http.url,
                })
            }
            _ => Err(
                "`probe` needs `command = [\"program\", \"{key}\", …]` or `http = { url = \"…{key}…\" }`, one of them"
                    .to_owned(),
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolKind {
    Command {
        /// argv templates; `{name}` takes `args.name`.
        argv: Vec<String>,
        /// The args as JSON on stdin.
        stdin_args: bool,
    },
    Http(HttpSpec),
}

/// An HTTP tool: the args are the JSON body, the step's key the
/// `Idempotency-Key` header.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HttpSpec {
    pub(crate) method: String,
    /// May hold `{name}` placeholders, like a command's argv, and
    /// `${VAR}` / `${VAR:-default}` from the environment.
    pub(crate) url: String,
    /// Values may hold `${VAR}`, read from the environment at each call and
    /// never journaled.
    pub(crate) headers: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    method: Option<String>,
    url: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum InDoubt {
    Retry,
    Ask,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OutputMode {
    Text,
    Json,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTool {
    effect: Option<Effect>,
    command: Option<Vec<String>>,
    http: Option<RawHttp>,
    headers: Option<BTreeMap<String, String>>,
    stdin: Option<String>,
    output: Option<OutputMode>,
    timeout: Option<String>,
    retries: Option<u32>,
    in_doubt: Option<InDoubt>,
    probe: Option<RawProbe>,
}

impl Tool {
    pub(super) fn from_raw(name: &str, raw: RawTool) -> Result<Self, String> {
        let stdin_args = match raw.stdin.as_deref() {
            None | Some("null") => false,
            Some("args") => true,
            Some(other) => return Err(format!("`stdin` must be \"args\", not {other:?}")),
        };
        let kind = match (raw.http, raw.command) {
            (Some(_), Some(_)) => {
                return Err("has both `command` and `http`; choose one".to_owned());
            }
            (Some(http), None) => {
                if stdin_args {
                    return Err(
                        "`stdin` goes with `command`; an HTTP tool sends its args as the body"
                            .to_owned(),
                    );
                }
                let method = http
                    .method
                    .unwrap_or_else(|| "POST".to_owned())
                    .to_ascii_uppercase();
                if !["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&method.as_str()) {
                    return Err(format!(
                        "`http.method = {method:?}` is not GET, POST, PUT, PATCH or DELETE"
                    ));
                }
                if !(http.url.starts_with("http://")
                    || http.url.starts_with("https://")
                    || http.url.starts_with("${"))
                {
                    return Err(format!(
                        "`http.url = {:?}` must start with http:// or https://",
                        http.url
                    ));
                }
                ToolKind::Http(HttpSpec {
                    method,
                    url: http.url,
                    headers: raw.headers.unwrap_or_default(),
                })
            }
            (None, _) if raw.headers.is_some() => return Err("`headers` go with `http`".to_owned()),
            (None, Some(argv)) => {
                if argv.first().is_none_or(String::is_empty) {
                    return Err("`command` needs a program as its first element".to_owned());
                }
                ToolKind::Command { argv, stdin_args }
            }
            (None, None) => {
                return Err(
                    "needs `command = [\"program\", \"arg\", …]` or `http = { url = \"…\" }`"
                        .to_owned(),
                );
            }
        };
        let timeout = raw
            .timeout
            .map(|text| {
                let timeout = humantime::parse_duration(&text).map_err(|err| {
                    format!("`timeout = {text:?}` is not a duration like \"30s\": {err}")
                })?;
                if timeout.is_zero() {
                    // Every call would time out before it started.
                    return Err(format!("`timeout = {text:?}` must be longer than zero"));
                }
                Ok(timeout)
            })
            .transpose()?;
        Ok(Self {
            name: name.to_owned(),
            // A tool nobody classified may change the world: assume it does.
            effect: raw.effect.unwrap_or(Effect::Mutate),
            // An HTTP API answers JSON as a rule; a command prints text.
            output: raw.output.unwrap_or(match kind {
                ToolKind::Http(_) => OutputMode::Json,
                ToolKind::Command { .. } => OutputMode::Text,
            }),
            kind,
            timeout,
            retries: raw.retries.unwrap_or(0),
            in_doubt: raw.in_doubt.unwrap_or(InDoubt::Retry),
            probe: raw.probe.map(Probe::from_raw).transpose()?,
        })
    }

    /// The tool that asks this one's destination about a step in doubt:
    /// it only reads, runs once, sends this tool's headers, and answers
    /// text (read as JSON where it is).
    pub(crate) fn probe_tool(&self) -> Option<Tool> {
        let kind = match self.probe.as_ref()? {
            Probe::Command(argv) => ToolKind::Command {
                argv: argv.clone(),
                stdin_args: false,
            },
            Probe::Http { method, url } => ToolKind::Http(HttpSpec {
                method: method.clone(),
                url: url.clone(),
                headers: match &self.kind {
                    ToolKind::Http(http) => http.headers.clone(),
                    ToolKind::Command { .. } => BTreeMap::new(),
                },
            }),
        };
        Some(Self {
            name: format!("{} probe", self.name),
            effect: Effect::Read,
            kind,
            output: OutputMode::Text,
            timeout: Some(self.timeout.unwrap_or(Duration::from_secs(30))),
            retries: 0,
            in_doubt: InDoubt::Retry,
            probe: None,
        })
    }

    /// Whether `args` fill every placeholder of the argv or URL.
    pub(crate) fn check_args(&self, args: &Value) -> Result<(), String> {
        match &self.kind {
            ToolKind::Http(http) => self.expand(&http.url, args).map(drop),
            ToolKind::Command { argv, .. } => self.argv(argv, args).map(drop),
        }
    }

    /// One template filled from `args`.
    pub(crate) fn expand(&self, template: &str, args: &Value) -> Result<String, String> {
        let mut out = String::new();
        for piece in parse_template(template) {
            match piece {
                Piece::Text(text) => out.push_str(&text),
                Piece::Arg(name) => match args.get(&name) {
                    Some(Value::String(text)) => out.push_str(text),
                    Some(Value::Null) | None => {
                        return Err(format!("tool `{}` needs `args.{name}`", self.name));
                    }
                    Some(other) => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(out)
    }

    /// The argv `templates` filled from `args`, or why `args` do not fit.
    pub(crate) fn argv(&self, templates: &[String], args: &Value) -> Result<Vec<String>, String> {
        templates
            .iter()
            .map(|template| self.expand(template, args))
            .collect()
    }
}
