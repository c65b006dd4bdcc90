//! `[proxy]` in `durun.toml`: the model/API proxy's routes, what it
//! leaves out of a request's identity, and which headers are secrets
//! (SPEC 12).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::protocol::Effect;

/// The two routes every run has, for the model clients.
pub(crate) const MODEL_ROUTES: [&str; 3] = ["openai", "anthropic", "gemini"];

/// The largest answer the proxy records unless `[proxy] max_record` says.
pub(crate) const MAX_RECORD: usize = 64 * 1024 * 1024;

/// A validated `[proxy]` table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProxyConfig {
    /// `enabled = false` turns the proxy off for the task.
    pub(crate) enabled: bool,
    /// JSON pointers left out of a request's args before matching and keys.
    pub(crate) ignore: Vec<String>,
    /// Query parameters journaled as `"***"`, beside the built-in ones.
    pub(crate) secret_query: Vec<String>,
    /// `[proxy] max_record`: the largest answer recorded, in bytes.
    pub(crate) max_record: Option<usize>,
    /// `[proxy.openai] upstream`, `[proxy.anthropic] upstream`.
    pub(crate) model_upstreams: BTreeMap<String, String>,
    /// `[proxy.routes.NAME]`.
    pub(crate) routes: BTreeMap<String, RouteConfig>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ignore: Vec::new(),
            secret_query: Vec::new(),
            max_record: None,
            model_upstreams: BTreeMap::new(),
            routes: BTreeMap::new(),
        }
    }
}

/// A custom route: an API the agent reaches through a variable it reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouteConfig {
    /// The variable the agent's environment gets the route's URL in.
    pub(crate) env: Option<String>,
    pub(crate) upstream: String,
    /// `"METHOD /path"` requests whose effect is not the method's default.
    pub(crate) read: Vec<String>,
    pub(crate) mutate: Vec<String>,
    /// `"GET /path?key={key}"`: asks whether a request in doubt took
    /// effect (SPEC 22).
    pub(crate) probe: Option<String>,
}

impl RouteConfig {
    /// The effect of `METHOD /path` on this route: GET, HEAD and OPTIONS
    /// read, the rest mutate, unless `read`/`mutate` say otherwise.
    pub(crate) fn effect(&self, method: &str, path: &str) -> Effect {
        let listed = |list: &[String]| {
            list.iter().any(|entry| {
                entry
                    .split_once(' ')
                    .is_some_and(|(m, p)| m.eq_ignore_ascii_case(method) && p == path)
            })
        };
        if listed(&self.mutate) {
            Effect::Mutate
        } else if listed(&self.read) || matches!(method, "GET" | "HEAD" | "OPTIONS") {
            Effect::Read
        } else {
            Effect::Mutate
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    enabled: Option<bool>,
    #[serde(default)]
    ignore: Vec<String>,
    /// Accepted and checked: no request header is ever journaled, hashed
    /// or shown, these included.
    #[serde(default)]
    secret_headers: Vec<String>,
    #[serde(default)]
    secret_query: Vec<String>,
    max_record: Option<toml::Value>,
    openai: Option<RawUpstream>,
    anthropic: Option<RawUpstream>,
    gemini: Option<RawUpstream>,
    #[serde(default)]
    routes: BTreeMap<String, RawRoute>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    upstream: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    env: Option<String>,
    upstream: String,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    mutate: Vec<String>,
    probe: Option<String>,
}

/// An `ignore` pointer durun can take out of a request (also `*`, `**`).
pub(crate) fn check_ignore(pointer: &str) -> Result<(), String> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err(format!(
            "{pointer:?} is not a JSON pointer (write \"/{pointer}\")"
        ));
    }
    if pointer.ends_with("/**") {
        return Err(format!(
            "{pointer:?} names no member to take out (name one after `**`: \"{pointer}/NAME\")"
        ));
    }
    Ok(())
}

impl RawProxy {
    pub(super) fn check(self) -> Result<ProxyConfig, String> {
        for pointer in &self.ignore {
            check_ignore(pointer).map_err(|err| format!("[proxy] ignore: {err}"))?;
        }
        for header in &self.secret_headers {
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(format!(
                    "[proxy] secret_headers: {header:?} is not a header name"
                ));
            }
        }
        let mut model_upstreams = BTreeMap::new();
        for (name, raw) in [
            ("openai", self.openai),
            ("anthropic", self.anthropic),
            ("gemini", self.gemini),
        ] {
            if let Some(raw) = raw {
                check_upstream(&raw.upstream)
                    .map_err(|message| format!("[proxy.{name}] upstream: {message}"))?;
                model_upstreams.insert(name.to_owned(), raw.upstream);
            }
        }
        let mut routes = BTreeMap::new();
        for (name, raw) in self.routes {
            let route = raw.check(&name)?;
            routes.insert(name, route);
        }
        Ok(ProxyConfig {
            enabled: self.enabled.unwrap_or(true),
            ignore: self.ignore,
            secret_query: self.secret_query,
            max_record: self
                .max_record
                .map(|value| {
                    super::size::size_value(&value).ok_or_else(|| {
                        format!(
                            "[proxy] max_record = {value}: not a size (bytes, or like \"64MiB\")"
                        )
                    })
                })
                .transpose()?,
            model_upstreams,
            routes,
        })
    }
}

impl RawRoute {
    /// A route's table, checked: `[proxy.routes.NAME]`.
    fn check(self, name: &str) -> Result<RouteConfig, String> {
        let raw = self;
        // The route's own variable, set on top of the agent's
        // environment: one that decides what runs or where durun is
        // would let a config take over the agent.
        let at = format!("[proxy.routes.{name}]");
        if MODEL_ROUTES.contains(&name) {
            return Err(format!(
                "{at}: `{name}` is a built-in route; set its upstream in [proxy.{name}]"
            ));
        }
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "{at}: a route's name is letters, digits, `-` and `_` (it is a URL path segment)"
            ));
        }
        check_upstream(&raw.upstream).map_err(|message| format!("{at} upstream: {message}"))?;
        if let Some(env) = &raw.env
            && (env.is_empty()
                || env.starts_with(|c: char| c.is_ascii_digit())
                || !env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        {
            return Err(format!("{at} env: {env:?} is not a variable name"));
        }
        if let Some(env) = &raw.env
            && reserved_variable(env)
        {
            return Err(format!(
                "{at} env: `{env}` is not for a route's URL: it would change how the agent runs (PATH, HOME, LD_*, DYLD_* and DURUN_* are refused); name a variable of the agent's own, such as {}_URL",
                name.to_uppercase().replace('-', "_")
            ));
        }
        for entry in raw.read.iter().chain(&raw.mutate) {
            if !entry
                .split_once(' ')
                .is_some_and(|(method, path)| !method.is_empty() && path.starts_with('/'))
            {
                return Err(format!(
                    "{at}: {entry:?} is not \"METHOD /path\" (as in \"POST /search\")"
                ));
            }
        }
        if let Some(probe) = &raw.probe
            && !probe.split_once(' ').is_some_and(|(method, path)| {
                reqwest::Method::from_bytes(method.as_bytes()).is_ok() && path.starts_with('/')
            })
        {
            return Err(format!(
                "{at} probe: {probe:?} is not \"METHOD /path\" (as in \"GET /charges?key={{key}}\")"
            ));
        }
        Ok(RouteConfig {
            env: raw.env,
            upstream: raw.upstream,
            read: raw.read,
            mutate: raw.mutate,
            probe: raw.probe,
        })
    }
}

/// An upstream is an `http://` or `https://` URL.
pub(crate) fn check_upstream(url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some() => {
            Ok(())
        }
        _ => Err(format!("{url:?} is not an http:// or https:// URL")),
    }
}

/// A variable a route's `env` may not set (SPEC 17): what decides which
/// program runs, where the agent's home is, what the loader preloads, and
/// durun's own.
fn reserved_variable(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["PATH", "HOME"].contains(&upper.as_str())
        || ["LD_", "DYLD_", "DURUN_"]
            .iter()
            .any(|prefix| upper.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(read: &[&str], mutate: &[&str]) -> RouteConfig {
        RouteConfig {
            env: None,
            upstream: "http://127.0.0.1:1".into(),
            read: read.iter().map(|s| (*s).to_owned()).collect(),
            mutate: mutate.iter().map(|s| (*s).to_owned()).collect(),
            probe: None,
        }
    }

    #[test]
    fn a_route_reads_with_safe_methods_and_mutates_with_the_rest() {
        let plain = route(&[], &[]);
        assert_eq!(plain.effect("GET", "/repos"), Effect::Read);
        assert_eq!(plain.effect("POST", "/repos"), Effect::Mutate);
        assert_eq!(plain.effect("DELETE", "/repos/1"), Effect::Mutate);
        let listed = route(&["POST /search"], &["GET /dispatch"]);
        assert_eq!(listed.effect("POST", "/search"), Effect::Read);
        assert_eq!(listed.effect("POST", "/search/more"), Effect::Mutate);
        assert_eq!(listed.effect("GET", "/dispatch"), Effect::Mutate);
    }
}
