//! The proxy's routes: the two model routes every run has, and the
//! custom ones `durun.toml` adds, each with the upstream it forwards to.

use std::collections::BTreeMap;

use crate::config::{ProxyConfig, RouteConfig};
use crate::protocol::Effect;

/// Where `durun test` has a run's model calls go (SPEC 14): its recorder.
pub(crate) const TAPE: &str = "DURUN_TEST_TAPE";

/// Every route of a run, with what a request on it is.
pub(crate) struct Routes {
    by_name: BTreeMap<String, Route>,
    pub(crate) ignore: Vec<String>,
    /// Query parameters journaled as `"***"` ([`SECRET_QUERY`] and
    /// `[proxy] secret_query`).
    pub(crate) secret_query: Vec<String>,
    /// The largest answer recorded (`[proxy] max_record`); a larger one is
    /// passed on whole and its step stays an attempt.
    pub(crate) max_record: usize,
    /// The limits requests wait for (SPEC 19), if any.
    pub(crate) limiter: Option<std::sync::Arc<crate::limits::Limiter>>,
}

/// Query parameters that carry a credential by convention: forwarded as
/// they are, journaled as `"***"` (SPEC 17).
pub(crate) const SECRET_QUERY: [&str; 7] = [
    "key",
    "api_key",
    "apikey",
    "token",
    "access_token",
    "sig",
    "signature",
];

pub(crate) struct Route {
    /// The upstream's base URL, no `/` at its end.
    pub(crate) upstream: String,
    /// What follows the route's name in the agent's base URL (`/v1` for
    /// OpenAI's clients, whose base holds it).
    prefix: &'static str,
    /// The variable the agent gets the route's URL in.
    env: Option<String>,
    /// A custom route's effects; `None` for a model route (all `read`).
    custom: Option<RouteConfig>,
}

impl Route {
    /// The effect of `METHOD PATH` on this route.
    pub(crate) fn effect(&self, method: &str, path: &str) -> Effect {
        match &self.custom {
            None => Effect::Read,
            Some(custom) => custom.effect(method, path),
        }
    }

    /// The route's probe (SPEC 22): its method, and the URL it asks with
    /// `key` in place of `{key}`.
    pub(crate) fn probe(&self, key: &str) -> Option<(String, String)> {
        let probe = self.custom.as_ref()?.probe.as_deref()?;
        let (method, path) = probe.split_once(' ')?;
        Some((
            method.to_owned(),
            format!("{}{}", self.upstream, path.replace("{key}", key)),
        ))
    }

    /// The PATH of a step's name for `rest`, what follows the route's name
    /// in a request: `rest` read as the upstream reads it (its `.` and
    /// `..` resolved, [`normalized`]), then what follows the route's base.
    pub(crate) fn resolve(&self, rest: &str) -> Result<String, Unresolved> {
        let normal = normalized(rest).ok_or(Unresolved::LeavesBase)?;
        match self.path(&normal) {
            Some(path) => Ok(path.to_owned()),
            // Under the base as written, out of it once resolved.
            None if self.path(rest).is_some() => Err(Unresolved::LeavesBase),
            None => Err(Unresolved::NotUnderBase),
        }
    }

    /// What follows the route's base, if the request is under it.
    fn path<'p>(&self, rest: &'p str) -> Option<&'p str> {
        let path = rest.strip_prefix(self.prefix)?;
        if path.is_empty() {
            Some("/")
        } else {
            path.starts_with('/').then_some(path)
        }
    }
}

/// Why a request's path names no path of its route.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unresolved {
    /// Its `..` climbs out of the route, or out of the route's base.
    LeavesBase,
    /// It is not under the route's base (`/v1` for OpenAI's).
    NotUnderBase,
}

/// The query parameters `config` has journaled as `"***"`.
pub(crate) fn secret_query(config: &ProxyConfig) -> Vec<String> {
    SECRET_QUERY
        .iter()
        .map(|name| (*name).to_owned())
        .chain(config.secret_query.iter().cloned())
        .collect()
}

/// `rest`, a path under a route, with its `.` and `..` segments resolved
/// (also written `%2e`), and empty ones (`//`) dropped, as an upstream would
/// read it; `None` when a `..` climbs above the route. Matching and tiers
/// then see the path the upstream acts on.
pub(crate) fn normalized(rest: &str) -> Option<String> {
    let mut kept: Vec<&str> = Vec::new();
    for segment in rest.split('/') {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        match decoded.as_str() {
            "" | "." => {}
            ".." => {
                kept.pop()?;
            }
            _ => kept.push(segment),
        }
    }
    let mut path = String::with_capacity(rest.len());
    for segment in &kept {
        path.push('/');
        path.push_str(segment);
    }
    // A trailing slash is the upstream's to read (`/v1/` is not `/v1`).
    if rest.ends_with('/') && !kept.is_empty() {
        path.push('/');
    }
    Some(path)
}

/// The variable that names each model route's upstream, the vendor's API
/// when none does, and what follows the route's name in the agent's URL.
const MODEL_UPSTREAMS: [(&str, &str, &str, &str); 3] = [
    (
        "openai",
        "OPENAI_BASE_URL",
        "https://api.openai.com/v1",
        "/v1",
    ),
    (
        "anthropic",
        "ANTHROPIC_BASE_URL",
        "https://api.anthropic.com",
        "",
    ),
    // Google's `@google/genai` clients (and Gemini CLI) read it.
    (
        "gemini",
        "GOOGLE_GEMINI_BASE_URL",
        "https://generativelanguage.googleapis.com",
        "",
    ),
];

/// The model upstreams this process's environment names, by variable: a
/// task records them, and its resumes send their model calls there when
/// their own environment names none (SPEC 18).
pub(crate) fn upstreams_from_env() -> BTreeMap<String, String> {
    MODEL_UPSTREAMS
        .iter()
        .filter_map(|(_, variable, _, _)| {
            let url = std::env::var(variable).ok()?;
            crate::config::check_upstream(&url).ok()?;
            Some(((*variable).to_owned(), url))
        })
        .collect()
}

impl Routes {
    /// The routes of `config`, their upstreams resolved: `durun.toml`
    /// first, then (for the model routes) the variable in `env`, then the
    /// vendor's API.
    pub(crate) fn new(config: &ProxyConfig, env: impl Fn(&str) -> Option<String>) -> Self {
        let mut routes = BTreeMap::new();
        for (name, variable, default, prefix) in MODEL_UPSTREAMS {
            // `durun test` answers a trial's model calls from the
            // reference run's recording, whatever else is configured.
            let upstream = env(TAPE)
                .map(|tape| format!("{}/{name}", tape.trim_end_matches('/')))
                .or_else(|| config.model_upstreams.get(name).cloned())
                .or_else(|| env(variable).filter(|url| crate::config::check_upstream(url).is_ok()))
                .unwrap_or_else(|| default.to_owned());
            routes.insert(
                name.to_owned(),
                Route {
                    upstream: upstream.trim_end_matches('/').to_owned(),
                    prefix,
                    env: Some(variable.to_owned()),
                    custom: None,
                },
            );
        }
        for (name, custom) in &config.routes {
            routes.insert(
                name.clone(),
                Route {
                    upstream: custom.upstream.trim_end_matches('/').to_owned(),
                    prefix: "",
                    env: custom.env.clone(),
                    custom: Some(custom.clone()),
                },
            );
        }
        Self {
            by_name: routes,
            ignore: config.ignore.clone(),
            secret_query: secret_query(config),
            max_record: config.max_record.unwrap_or(crate::config::MAX_RECORD),
            limiter: None,
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Route> {
        self.by_name.get(name)
    }

    /// The URL of route `name` under the proxy at `base`.
    pub(super) fn url(&self, base: &str, name: &str) -> Option<String> {
        let route = self.by_name.get(name)?;
        Some(format!("{base}/{name}{}", route.prefix))
    }

    /// Each route's variable and URL under the proxy at `base`.
    pub(super) fn env(&self, base: &str) -> Vec<(String, String)> {
        self.by_name
            .iter()
            .filter_map(|(name, route)| {
                let variable = route.env.clone()?;
                Some((variable, format!("{base}/{name}{}", route.prefix)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_come_from_the_config_then_the_environment_then_the_vendor() {
        let mut config = ProxyConfig::default();
        let routes = Routes::new(&config, |_| None);
        assert_eq!(
            routes.get("openai").unwrap().upstream,
            "https://api.openai.com/v1"
        );
        assert_eq!(
            routes.get("anthropic").unwrap().upstream,
            "https://api.anthropic.com"
        );
        let env = |name: &str| {
            (name == "OPENAI_BASE_URL").then(|| "https://gateway.example/openai/v1/".to_owned())
        };
        let routes = Routes::new(&config, env);
        assert_eq!(
            routes.get("openai").unwrap().upstream,
            "https://gateway.example/openai/v1"
        );
        config
            .model_upstreams
            .insert("openai".into(), "http://127.0.0.1:9/v1".into());
        let routes = Routes::new(&config, env);
        assert_eq!(
            routes.get("openai").unwrap().upstream,
            "http://127.0.0.1:9/v1"
        );
        assert_eq!(
            routes.env("http://127.0.0.1:1/s"),
            [
                (
                    "ANTHROPIC_BASE_URL".to_owned(),
                    "http://127.0.0.1:1/s/anthropic".to_owned()
                ),
                (
                    "GOOGLE_GEMINI_BASE_URL".to_owned(),
                    "http://127.0.0.1:1/s/gemini".to_owned()
                ),
                (
                    "OPENAI_BASE_URL".to_owned(),
                    "http://127.0.0.1:1/s/openai/v1".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn a_path_is_read_as_the_upstream_would_read_it() {
        assert_eq!(
            normalized("/v1/chat/completions").as_deref(),
            Some("/v1/chat/completions")
        );
        assert_eq!(
            normalized("/v1//chat/./completions").as_deref(),
            Some("/v1/chat/completions")
        );
        assert_eq!(normalized("/v1/x/../models").as_deref(), Some("/v1/models"));
        assert_eq!(
            normalized("/v1/x/%2e%2E/models").as_deref(),
            Some("/v1/models")
        );
        assert_eq!(normalized("/v1/").as_deref(), Some("/v1/"));
        assert_eq!(normalized("").as_deref(), Some(""));
        assert_eq!(normalized("/v1/../../openai/v1"), None);
        assert_eq!(normalized("/%2e%2e/admin"), None);
    }

    #[test]
    fn a_path_is_what_follows_the_routes_base() {
        let routes = Routes::new(&ProxyConfig::default(), |_| None);
        let openai = routes.get("openai").unwrap();
        assert_eq!(
            openai.path("/v1/chat/completions"),
            Some("/chat/completions")
        );
        assert_eq!(openai.path("/v1x/chat"), None);
        assert_eq!(openai.path("/chat/completions"), None);
        let anthropic = routes.get("anthropic").unwrap();
        assert_eq!(anthropic.path("/v1/messages"), Some("/v1/messages"));
        // Resolved first: `..` may not leave the route or its base.
        assert_eq!(
            openai.resolve("/v1//chat/./completions"),
            Ok("/chat/completions".to_owned())
        );
        assert_eq!(openai.resolve("/v1/../models"), Err(Unresolved::LeavesBase));
        assert_eq!(
            openai.resolve("/../anthropic/v1"),
            Err(Unresolved::LeavesBase)
        );
        assert_eq!(openai.resolve("/chat"), Err(Unresolved::NotUnderBase));
    }
}
