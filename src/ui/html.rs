//! HTML made by hand, with journal data always as text: every string that
//! came from the journal, the agent, a tool or the request goes through
//! [`text`], which escapes markup and shows control characters (an ESC
//! sequence, a bidirectional override) as visible escapes, as the terminal
//! views do. Links carry task ids percent-encoded as one path segment, so
//! no id can become a `javascript:` URL or another path.

use std::fmt::Write as _;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// What stays as it is in a path segment: letters, digits, `-_~` (a dot
/// too is encoded, so that no id becomes `..`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'~');

/// `raw` as HTML text (also safe inside a double-quoted attribute).
pub(crate) fn text(raw: &str) -> String {
    let shown = crate::report::escape(raw);
    let mut out = String::with_capacity(shown.len() + 8);
    for c in shown.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `raw` as one path segment.
pub(crate) fn segment(raw: &str) -> String {
    utf8_percent_encode(raw, SEGMENT).to_string()
}

/// The link to a task's page.
pub(crate) fn task_href(id: &str) -> String {
    format!("/tasks/{}", segment(id))
}

/// A query string value.
pub(crate) fn query_value(raw: &str) -> String {
    form_urlencoded::byte_serialize(raw.as_bytes()).collect()
}

/// The page around `body`: the header with the views, the CSRF token for
/// the script, the embedded style sheet and script (nothing from another
/// host), and the status line where actions report.
pub(crate) fn page(title: &str, csrf: &str, live: Option<&str>, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"csrf-token\" content=\"{csrf}\">\
         <title>{title} · durun</title>\
         <link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/assets/ui.css\">\
         <script src=\"/assets/ui.js\" defer></script></head>\
         <body{live}><header><a class=\"brand\" href=\"/\">durun</a>\
         <nav><a href=\"/\">Tasks</a><a href=\"/tokens\">Tokens</a><a href=\"/workers\">Workers and queues</a></nav>\
         <span id=\"live\" class=\"live\" hidden>live</span></header>\
         <div id=\"said\" role=\"status\" hidden></div>\
         <main>{body}</main></body></html>\n",
        title = text(title),
        csrf = text(csrf),
        live = live.map_or(String::new(), |key| format!(" data-live=\"{}\"", text(key))),
    );
    out
}

/// A JSON value, pretty and folded: objects and arrays are `<details>`
/// that open on a click (open for the first `open` levels), strings and
/// numbers as text.
pub(crate) fn json(value: &serde_json::Value, open: usize) -> String {
    let mut out = String::new();
    json_into(&mut out, value, open, 0);
    out
}

/// Folding stops this deep; the rest is shown as indented text.
const MAX_FOLD: usize = 32;

/// An object's or array's members: the key, if any, and the value.
type Members<'a> = Vec<(Option<&'a str>, &'a serde_json::Value)>;

fn json_into(out: &mut String, value: &serde_json::Value, open: usize, depth: usize) {
    use serde_json::Value;
    let (items, brackets): (Members<'_>, (&str, &str)) = match value {
        Value::Object(map) if !map.is_empty() && depth < MAX_FOLD => (
            map.iter()
                .map(|(key, item)| (Some(key.as_str()), item))
                .collect(),
            ("{", "}"),
        ),
        Value::Array(list) if !list.is_empty() && depth < MAX_FOLD => {
            (list.iter().map(|item| (None, item)).collect(), ("[", "]"))
        }
        Value::String(string) => {
            let _ = write!(out, "<span class=\"s\">{}</span>", text(&quoted(string)));
            return;
        }
        other => {
            let shown = if depth >= MAX_FOLD {
                serde_json::to_string_pretty(other).unwrap_or_default()
            } else {
                other.to_string()
            };
            let _ = write!(out, "<span class=\"v\">{}</span>", text(&shown));
            return;
        }
    };
    let _ = write!(
        out,
        "<details class=\"j\"{}><summary>{}<span class=\"n\">{} {}</span></summary>",
        if depth < open { " open" } else { "" },
        brackets.0,
        items.len(),
        if brackets.0 == "{" { "keys" } else { "items" },
    );
    for (key, item) in items {
        out.push_str("<div class=\"i\">");
        if let Some(key) = key {
            let _ = write!(out, "<span class=\"k\">{}</span>: ", text(&quoted(key)));
        }
        json_into(out, item, open, depth + 1);
        out.push_str("</div>");
    }
    let _ = write!(out, "</details>{}", brackets.1);
}

fn quoted(string: &str) -> String {
    serde_json::Value::String(string.to_owned()).to_string()
}

/// What a task or run spent at known prices, and whether steps had none.
pub(crate) fn cost_cell(cost: &crate::journal::Cost) -> String {
    match (cost.spent_nanos, cost.unpriced_steps) {
        (0, 0) => String::new(),
        (0, _) => "unknown".to_owned(),
        (spent, 0) => crate::prices::shown(spent),
        (spent, _) => format!("{} + unknown", crate::prices::shown(spent)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_control_characters_are_text() {
        assert_eq!(
            text("<script>alert('x')</script>\u{1b}[31m\"&"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;\\x1b[31m&quot;&amp;"
        );
        assert_eq!(text("\u{202e}abc"), "\\u{202e}abc");
    }

    #[test]
    fn a_task_id_stays_one_path_segment() {
        assert_eq!(
            task_href("javascript:alert(1)"),
            "/tasks/javascript%3Aalert%281%29"
        );
        assert_eq!(task_href("../x y"), "/tasks/%2E%2E%2Fx%20y");
        assert_eq!(task_href(".."), "/tasks/%2E%2E");
        assert_eq!(task_href("t-1_b~"), "/tasks/t-1_b~");
    }

    #[test]
    fn json_is_folded_and_escaped() {
        let shown = json(&serde_json::json!({"a<": ["<img onerror=x>", 1]}), 1);
        assert!(shown.contains("&lt;img onerror=x&gt;"), "{shown}");
        assert!(!shown.contains("<img"), "{shown}");
        assert!(shown.starts_with("<details class=\"j\" open>"), "{shown}");
    }
}
