//! What the journal keeps of a proxied request (SPEC 12, 17, 21): the args
//! it is matched by (its JSON body with the `ignore`d members out, its
//! query with secrets as `***`), and the hash of its bytes as sent that a
//! resume replays it by. The answer's side is `recording.rs`.
//!
//! # Invariant
//!
//! Nothing from a request's headers is in its args or its hash: a secret
//! the agent sends (`authorization`, `x-api-key`, …) is forwarded and
//! forgotten; a query's secret is in the hash, never in clear.

use serde_json::{Value, json};

/// The args of a request (SPEC 12): its JSON body, or the body's hash and
/// length when it is not JSON, and its query, with the values of the
/// `secret` parameters as `***`; `ignore`'s JSON pointers taken out of the
/// body first.
pub(crate) fn request_args(
    body: &[u8],
    query: &str,
    ignore: &[String],
    secret: &[String],
) -> Value {
    let body = if body.is_empty() {
        Value::Null
    } else {
        // The default depth limit: a body nested deeper than any API
        // takes is hashed, never recursed into.
        match serde_json::from_slice::<Value>(body) {
            Ok(mut value) => {
                for pointer in ignore {
                    remove_pointer(&mut value, pointer);
                }
                value
            }
            Err(_) => json!({
                "sha256": crate::step_key::sha256_hex(body),
                "bytes": body.len(),
            }),
        }
    };
    json!({ "body": body, "query": masked_query(query, secret) })
}

/// `query` with the value of each parameter named in `secret` (any case)
/// as `***`; every other byte as it came, so that a query with no secret
/// in it is recorded as before.
fn masked_query<'q>(query: &'q str, secret: &[String]) -> std::borrow::Cow<'q, str> {
    let is_secret = |pair: &str| {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
        secret
            .iter()
            .any(|secret| secret.eq_ignore_ascii_case(&name))
    };
    if !query.split('&').any(is_secret) {
        return query.into();
    }
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret(pair) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
        .into()
}

/// Takes out of `value` what `pointer` names: a JSON pointer whose `*`
/// stands for any one member or index and `**` for any depth, none
/// included (`/input/*/id`, `/**/prompt_cache_key`).
fn remove_pointer(value: &mut Value, pointer: &str) {
    let tokens: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|token| token.replace("~1", "/").replace("~0", "~"))
        .collect();
    remove_at(value, &tokens);
}

fn remove_at(value: &mut Value, tokens: &[String]) {
    let Some((head, rest)) = tokens.split_first() else {
        return;
    };
    if head == "**" {
        remove_at(value, rest);
        for child in children(value, "*") {
            remove_at(child, tokens);
        }
        return;
    }
    if !rest.is_empty() {
        for child in children(value, head) {
            remove_at(child, rest);
        }
        return;
    }
    match value {
        Value::Object(map) if head == "*" => map.clear(),
        Value::Object(map) => {
            map.remove(head.as_str());
        }
        Value::Array(items) if head == "*" => items.clear(),
        Value::Array(items) => {
            if let Ok(index) = head.parse::<usize>()
                && index < items.len()
            {
                items.remove(index);
            }
        }
        _ => {}
    }
}

/// The members or items of `value` that `token` names (`*`: all).
fn children<'v>(value: &'v mut Value, token: &str) -> Vec<&'v mut Value> {
    let all = token == "*";
    match value {
        Value::Object(map) => {
            if all {
                map.values_mut().collect()
            } else {
                map.get_mut(token).into_iter().collect()
            }
        }
        Value::Array(items) => {
            if all {
                items.iter_mut().collect()
            } else {
                let index = token.parse::<usize>().ok();
                index
                    .and_then(|index| items.get_mut(index))
                    .into_iter()
                    .collect()
            }
        }
        _ => Vec::new(),
    }
}

/// A request's identity as sent: SHA-256 of its step's name, its query,
/// the proxy's `ignore` and `secret_query` lists and its body, each
/// length-prefixed. Equal hashes mean equal args ([`request_args`] makes
/// them from these alone), so a request whose hash a recorded step has
/// replays that step, as its args would.
pub(crate) fn request_hash(
    name: &str,
    query: &str,
    body: &[u8],
    ignore: &[String],
    secret: &[String],
) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    let mut part = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    part(b"durun request 1");
    part(name.as_bytes());
    part(query.as_bytes());
    for list in [ignore, secret] {
        part(&(list.len() as u64).to_le_bytes());
        for item in list {
            part(item.as_bytes());
        }
    }
    part(body);
    crate::step_key::hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_in_the_query_is_journaled_as_stars_and_nothing_else_changes() {
        let secret = vec!["key".to_owned(), "sig".to_owned()];
        let args = |query| request_args(b"", query, &[], &secret)["query"].clone();
        assert_eq!(args("a=b+c&KEY=sk-1&x"), "a=b+c&KEY=***&x");
        assert_eq!(args("%6Bey=sk-1&sig="), "%6Bey=***&sig=***");
        assert_eq!(args("a=%20b&keys=1"), "a=%20b&keys=1");
    }

    #[test]
    fn args_are_the_json_body_and_the_query_without_ignored_members() {
        let body = br#"{"model":"m","metadata":{"ts":1},"messages":[{"a":1},{"b":2}]}"#;
        assert_eq!(
            request_args(
                body,
                "x=1",
                &["/metadata".into(), "/messages/0".into()],
                &[]
            ),
            json!({"body": {"model": "m", "messages": [{"b": 2}]}, "query": "x=1"})
        );
        assert_eq!(
            request_args(b"", "", &[], &[]),
            json!({"body": null, "query": ""})
        );
        let binary = request_args(b"\x00\x01not json", "", &[], &[]);
        assert_eq!(binary["body"]["bytes"], 10);
        assert_eq!(binary["body"]["sha256"].as_str().unwrap().len(), 64);
        // Deeper than the parser goes: hashed, not parsed.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(request_args(deep.as_bytes(), "", &[], &[])["body"]["sha256"].is_string());
    }

    /// SPEC 18: `*` is any one member or index, `**` any depth.
    #[test]
    fn ignore_takes_wildcards() {
        let body = br#"{"input":[{"id":"a","text":"x"},{"id":"b","text":"y"}],
            "prompt_cache_key":"k","meta":{"deep":{"prompt_cache_key":"k2","kept":1}},
            "list":[[{"prompt_cache_key":3}]],"a/b":{"*":1,"c":2}}"#;
        let args = |ignore: &[&str]| {
            let ignore: Vec<String> = ignore.iter().map(|&pointer| pointer.to_owned()).collect();
            request_args(body, "", &ignore, &[])["body"].clone()
        };
        assert_eq!(
            args(&["/input/*/id", "/**/prompt_cache_key"]),
            json!({"input": [{"text": "x"}, {"text": "y"}],
                   "meta": {"deep": {"kept": 1}}, "list": [[{}]], "a/b": {"*": 1, "c": 2}})
        );
        assert_eq!(args(&["/input/*"])["input"], json!([]));
        assert_eq!(args(&["/a~1b/*"])["a/b"], json!({}));
        assert_eq!(
            args(&["/meta/*/kept"])["meta"],
            json!({"deep": {"prompt_cache_key": "k2"}})
        );
        assert_eq!(args(&["/input/1/text"])["input"][1], json!({"id": "b"}));
    }

    /// Gemini CLI lists its skills in its system prompt and its tool list
    /// in the order a file search found them, which changes from one
    /// start to the next, and opens its first message with the date and
    /// the folder's files: its preset leaves these out, and the
    /// conversation in.
    #[test]
    fn the_gemini_preset_matches_whatever_order_its_skills_came_in() {
        let body = |first: &str, second: &str, said: &str| {
            json!({
                "systemInstruction": {"parts": [{"text": format!("<available_skills>{first}{second}</available_skills>")}]},
                "tools": [{"functionDeclarations": [{"name": "activate_skill",
                    "parametersJsonSchema": {"properties": {"name": {"enum": [first, second]}}}}]}],
                "contents": [{"role": "user", "parts": [
                    {"text": format!("<session_context>{first}.txt</session_context>")},
                    {"text": said},
                ]}],
            })
            .to_string()
        };
        let mut ignore = Vec::new();
        crate::presets::named("gemini")
            .expect("the gemini preset")
            .extend_ignore(&mut ignore);
        let args = |body: String| request_args(body.as_bytes(), "", &ignore, &[]);
        let recorded = args(body("a", "b", "hi"));
        assert_eq!(recorded, args(body("b", "a", "hi")));
        assert_ne!(recorded, args(body("a", "b", "bye")));
    }

    /// Equal inputs, equal hash; any part changed, or moved from one part
    /// to the next, another.
    #[test]
    fn a_request_hash_covers_each_part_apart() {
        let ignore = vec!["/temperature".to_owned()];
        let base = request_hash("openai POST /chat", "a=1", b"{}", &ignore, &[]);
        assert_eq!(
            base,
            request_hash("openai POST /chat", "a=1", b"{}", &ignore, &[])
        );
        let others = [
            request_hash("openai POST /chat2", "a=1", b"{}", &ignore, &[]),
            request_hash("openai POST /chat", "a=2", b"{}", &ignore, &[]),
            request_hash("openai POST /chat", "a=1", b"{ }", &ignore, &[]),
            request_hash("openai POST /chat", "a=1", b"{}", &[], &[]),
            request_hash("openai POST /chat", "a=1", b"{}", &[], &ignore),
            request_hash("openai POST /cha", "ta=1", b"{}", &ignore, &[]),
        ];
        for other in &others {
            assert_ne!(&base, other);
        }
        assert_eq!(base.len(), 64);
    }
}
