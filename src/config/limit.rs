//! `[limits.NAME]` in durun.toml (SPEC 19): what a limit holds and caps.
//! The runs keep to them through the journal (the limiter, `limits.rs`).

/// One `[limits.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) name: String,
    /// The proxy route it holds.
    pub(crate) route: String,
    /// The models it holds (`*` matches any run of characters); all if
    /// none.
    pub(crate) model: Option<String>,
    pub(crate) rpm: Option<u64>,
    pub(crate) tpm: Option<u64>,
    pub(crate) concurrency: Option<u64>,
}

impl Limit {
    /// Reads `match = "ROUTE"` or `"ROUTE:MODEL-GLOB"`.
    pub(crate) fn matching(name: &str, matched: &str) -> Self {
        let (route, model) = match matched.split_once(':') {
            Some((route, model)) => (route, Some(model.to_owned())),
            None => (matched, None),
        };
        Self {
            name: name.to_owned(),
            route: route.to_owned(),
            model,
            rpm: None,
            tpm: None,
            concurrency: None,
        }
    }

    pub(crate) fn holds(&self, route: &str, model: Option<&str>) -> bool {
        self.route == route
            && match (&self.model, model) {
                (None, _) => true,
                (Some(glob), Some(model)) => glob_matches(glob, model),
                (Some(_), None) => false,
            }
    }
}

/// Whether `text` matches `glob`, where `*` stands for any run of
/// characters.
fn glob_matches(glob: &str, text: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_holds_its_route_and_the_models_its_glob_names() {
        let all = Limit::matching("all", "openai");
        assert!(all.holds("openai", Some("gpt-4o")));
        assert!(all.holds("openai", None));
        assert!(!all.holds("anthropic", Some("gpt-4o")));
        let four = Limit::matching("four", "openai:gpt-4o*");
        assert!(four.holds("openai", Some("gpt-4o-mini")));
        assert!(!four.holds("openai", Some("gpt-5")));
        assert!(!four.holds("openai", None));
        for (glob, text, matches) in [
            ("*", "anything", true),
            ("a*c", "abc", true),
            ("a*c", "abd", false),
            ("*mini", "gpt-4o-mini", true),
            ("gpt-*-mini", "gpt-4o-mini", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_matches(glob, text), matches, "{glob} {text}");
        }
    }
}
