//! `${VAR}` in a tool's URL and headers, expanded from the environment
//! when the tool runs, and the values it expanded to kept as secrets.

use serde_json::Value;

/// `${VAR}` in `text` replaced from a test's environment.
#[cfg(test)]
pub(super) fn expand_env(text: &str) -> Result<String, String> {
    expand_with(text, &mut Secrets::default(), |name| {
        [
            ("DURUN_TEST_EXPAND", "x1"),
            ("DURUN_TEST_SECRET", "sk-live-123"),
        ]
        .into_iter()
        .find(|(known, _)| *known == name)
        .map(|(_, value)| value.to_owned())
    })
}

/// The values `${VAR}` expanded to: they never appear in a message, an
/// answer or the journal (SPEC 5).
#[derive(Debug, Default)]
pub(crate) struct Secrets(Vec<(String, String)>);

impl Secrets {
    /// `message` with every expanded value written back as `${VAR}`.
    pub(crate) fn redact(&self, message: &str) -> String {
        let mut out = message.to_owned();
        // Longest first, so that a value inside another goes with it.
        let mut values: Vec<&(String, String)> = self
            .0
            .iter()
            .filter(|(_, value)| !value.is_empty())
            .collect();
        values.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
        for (name, value) in values {
            out = out.replace(value.as_str(), &format!("${{{name}}}"));
        }
        out
    }

    /// Adds what `other` noted.
    pub(crate) fn extend(&mut self, other: Self) {
        self.0.extend(other.0);
    }

    /// `value` with every string in it redacted.
    pub(crate) fn redact_value(&self, value: &mut Value) {
        match value {
            Value::String(text) => *text = self.redact(text),
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_value(item)),
            Value::Object(members) => members
                .values_mut()
                .for_each(|member| self.redact_value(member)),
            _ => {}
        }
    }

    /// The names of the variables expanded so far.
    pub(crate) fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

/// `${VAR}` in `text` replaced from the environment, each value noted in
/// `secrets`.
pub(crate) fn expand_env_noting(text: &str, secrets: &mut Secrets) -> Result<String, String> {
    expand_with(text, secrets, |name| std::env::var(name).ok())
}

/// `${VAR}` in `text` replaced with what `lookup` finds.
pub(super) fn expand_with(
    text: &str,
    secrets: &mut Secrets,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let inner = &rest[start + 2..start + end];
        // `${NAME:-default}` falls back to the default when NAME is unset.
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        match (lookup(name), default) {
            (Some(value), _) if !value.is_empty() || default.is_none() => {
                out.push_str(&value);
                secrets.0.push((name.to_owned(), value));
            }
            (_, Some(default)) => out.push_str(default),
            (None, None) => return Err(format!("the environment variable {name} is not set")),
            (Some(_), None) => {}
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

pub(super) enum Piece {
    Text(String),
    Arg(String),
}

/// Splits `"--path={path}"` into text and argument pieces. Only
/// `{identifier}` is a placeholder, and not after `$` (so `${HOME}`, JSON
/// and a shell script's braces pass through); `{{identifier}}` is the
/// literal text `{identifier}`.
pub(super) fn parse_template(template: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(c) = rest.chars().next() {
        if let Some(name) = rest
            .strip_prefix("{{")
            .and_then(|after| braced_name(after, "}}"))
        {
            text.push('{');
            text.push_str(name);
            text.push('}');
            rest = &rest[name.len() + 4..];
            continue;
        }
        if c == '{'
            && !text.ends_with('$')
            && let Some(name) = braced_name(&rest[1..], "}")
        {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
            pieces.push(Piece::Arg(name.to_owned()));
            rest = &rest[name.len() + 2..];
            continue;
        }
        text.push(c);
        rest = &rest[c.len_utf8()..];
    }
    pieces.push(Piece::Text(text));
    pieces
}

/// The identifier at the start of `text` if `close` follows it.
fn braced_name<'a>(text: &'a str, close: &str) -> Option<&'a str> {
    let end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    let name = &text[..end];
    let valid = !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit());
    (valid && text[end..].starts_with(close)).then_some(name)
}
