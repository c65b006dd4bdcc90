//! A conversation's repeated prefix, stored once (SPEC 21). Each request
//! of a chat agent repeats the whole history, so journaling each one's
//! args whole grows with the square of the turns. A proxied request's
//! message list is kept instead as a chain of nodes, one message each,
//! each naming the node before it: the request's args name the chain's
//! last node (`{"$durun_chain": HASH, "messages": N}` in place of the
//! list), and a turn writes only its new messages.
//!
//! # Invariant
//!
//! What a step's args are never changes: keys and `args_hash` are made
//! from the whole args before they are written, and every read of a step
//! (`journal::reads`), and an export, gives the whole args back. A node is
//! written with its parent in the same transaction, so a node that is
//! there has its whole chain.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use super::StepRecord;
use super::sql;
use super::tx::Tx;
use crate::json_text::JsonText;

/// Where a reference to a chain stands in place of a message list.
const CHAIN: &str = "$durun_chain";

/// The members of a request's body that hold its conversation: OpenAI's
/// and Anthropic's `messages`, the Responses API's `input`, Gemini's
/// `contents`.
const CONVERSATIONS: [&str; 3] = ["messages", "input", "contents"];

/// How each of [`CONVERSATIONS`] begins as a list in args' text: a
/// request without one is passed over unparsed.
const CONVERSATION_LISTS: [&str; 3] = ["\"messages\":[", "\"input\":[", "\"contents\":["];

/// Lists shorter than this are left in place: a chain saves nothing.
const SHORTEST: usize = 2;

/// A node as read: the node before it, and its message.
type Node = (Option<String>, Arc<Value>);

/// Reads a node as text: the node before it, and its message's JSON.
type FetchText<'a> = dyn FnMut(&str) -> Result<Option<(Option<String>, String)>> + 'a;

/// The args of a proxied request with its conversation kept as a chain,
/// the chain's new nodes written; `None` when there is nothing to keep
/// (no message list of two or more).
pub(crate) fn compact(tx: &mut dyn Tx, args: &JsonText) -> Result<Option<JsonText>> {
    let tx = std::cell::RefCell::new(tx);
    compact_with(
        args,
        &mut |hash| {
            let there = tx
                .borrow_mut()
                .query_opt(&sql::CHAT_NODE_THERE, &[hash.into()], |_| Ok(()))?;
            Ok(there.is_some())
        },
        &mut |hash, parent, text| {
            tx.borrow_mut().execute(
                &sql::INSERT_CHAT_NODE,
                &[hash.into(), parent.into(), text.into()],
            )?;
            Ok(())
        },
    )
}

/// Whether a node is there.
type There<'a> = dyn FnMut(&str) -> Result<bool> + 'a;

/// Writes a node: its hash, its parent, its message's JSON.
type Write<'a> = dyn FnMut(&str, Option<&str>, &str) -> Result<()> + 'a;

/// [`compact`], reading and writing nodes through `there` and `write`
/// (an import's transaction is a backend's own).
pub(crate) fn compact_with(
    args: &JsonText,
    there: &mut There<'_>,
    write: &mut Write<'_>,
) -> Result<Option<JsonText>> {
    if !CONVERSATION_LISTS
        .iter()
        .any(|list| args.as_str().contains(list))
    {
        return Ok(None);
    }
    let mut value = args.value();
    let Some((member, list)) = conversation_mut(&mut value) else {
        return Ok(None);
    };
    let Value::Array(messages) = list else {
        return Ok(None);
    };
    if messages.len() < SHORTEST {
        return Ok(None);
    }
    // Each node's hash covers its message and the node before it.
    let mut nodes = Vec::with_capacity(messages.len());
    let mut parent: Option<String> = None;
    for message in messages.iter() {
        let text = serde_json::to_string(message)?;
        let mut hasher = Sha256::new();
        hasher.update(parent.as_deref().unwrap_or_default());
        hasher.update(b"\n");
        hasher.update(text.as_bytes());
        let hash = crate::step_key::hex(&hasher.finalize());
        nodes.push((hash.clone(), parent.take(), text));
        parent = Some(hash);
    }
    // The nodes already there end where the conversation last was: look
    // back from its end, then write what follows.
    let mut known = nodes.len();
    while known > 0 && !there(&nodes[known - 1].0)? {
        known -= 1;
    }
    for (hash, parent, text) in &nodes[known..] {
        write(hash, parent.as_deref(), text)?;
    }
    let length = messages.len();
    let tip = nodes
        .last()
        .map(|(hash, ..)| hash.clone())
        .unwrap_or_default();
    let mut reference = Map::new();
    reference.insert(CHAIN.to_owned(), Value::String(tip));
    reference.insert("messages".to_owned(), Value::from(length));
    *value
        .get_mut("body")
        .and_then(|body| body.get_mut(member))
        .context("the conversation moved")? = Value::Object(reference);
    Ok(Some(JsonText::from_value(&value)))
}

/// Gives each record its whole args back, reading each node once.
pub(crate) fn expand_all(tx: &mut dyn Tx, records: &mut [StepRecord]) -> Result<()> {
    let mut nodes = HashMap::new();
    for record in records {
        expand(tx, record, &mut nodes)?;
    }
    Ok(())
}

/// Whether `record`'s args name a chain in place of a conversation.
pub(crate) fn names_a_chain(record: &StepRecord) -> bool {
    record.args.as_str().contains(CHAIN)
}

/// Gives `record` its whole args back; `nodes`: those read so far.
pub(crate) fn expand(
    tx: &mut dyn Tx,
    record: &mut StepRecord,
    nodes: &mut HashMap<String, Node>,
) -> Result<()> {
    if !names_a_chain(record) {
        return Ok(());
    }
    let mut args = record.args.value();
    expand_value(&mut args, &mut |hash| {
        if let Some(node) = nodes.get(hash) {
            return Ok(Some(node.clone()));
        }
        let found = tx.query_opt(&sql::CHAT_NODE, &[hash.into()], |row| {
            let parent = row.text(0)?.map(str::to_owned);
            let message: Value = serde_json::from_str(row.some_text(1)?)?;
            Ok((parent, Arc::new(message)))
        })?;
        if let Some(node) = &found {
            nodes.insert(hash.to_owned(), node.clone());
        }
        Ok(found)
    })?;
    record.args = JsonText::from_value(&args);
    Ok(())
}

/// Puts the message list back in `args` where a chain stands for it;
/// `fetch` reads a node.
pub(crate) fn expand_value(
    args: &mut Value,
    fetch: &mut dyn FnMut(&str) -> Result<Option<Node>>,
) -> Result<()> {
    let Some((_, list)) = conversation_mut(args) else {
        return Ok(());
    };
    let Some(tip) = list.get(CHAIN).and_then(Value::as_str).map(str::to_owned) else {
        return Ok(());
    };
    let mut messages = Vec::new();
    let mut at = Some(tip);
    while let Some(hash) = at {
        let (parent, message) = fetch(&hash)?.with_context(|| {
            format!("the journal lacks message {hash} of a conversation (a damaged journal)")
        })?;
        messages.push(Value::clone(&message));
        at = parent;
    }
    messages.reverse();
    *list = Value::Array(messages);
    Ok(())
}

/// Keeps the conversations of imported step rows as chains (an export
/// carries whole args); `there` and `write` read and write nodes.
pub(crate) fn compact_rows(
    steps: &[Map<String, Value>],
    there: &mut There<'_>,
    write: &mut Write<'_>,
) -> Result<Vec<Map<String, Value>>> {
    let mut compacted = Vec::with_capacity(steps.len());
    for row in steps {
        let mut row = row.clone();
        if row.get("kind") == Some(&Value::String("proxy".to_owned()))
            && let Some(Value::String(text)) = row.get("args")
            && let Ok(args) = JsonText::from_text(text)
            && let Some(kept) = compact_with(&args, there, write)?
        {
            row.insert("args".to_owned(), Value::String(kept.as_str().to_owned()));
        }
        compacted.push(row);
    }
    Ok(compacted)
}

/// Gives exported step rows their whole args (an export carries whole
/// args: SPEC 10, 21); `fetch` reads a node's parent and message text.
pub(crate) fn expand_rows(
    steps: &mut [Map<String, Value>],
    fetch: &mut FetchText<'_>,
) -> Result<()> {
    let mut nodes: HashMap<String, Node> = HashMap::new();
    for row in steps {
        let Some(Value::String(text)) = row.get("args") else {
            continue;
        };
        if !text.contains(CHAIN) {
            continue;
        }
        let mut args: Value = serde_json::from_str(text)?;
        expand_value(&mut args, &mut |hash| {
            if let Some(node) = nodes.get(hash) {
                return Ok(Some(node.clone()));
            }
            let Some((parent, message)) = fetch(hash)? else {
                return Ok(None);
            };
            let node = (parent, Arc::new(serde_json::from_str(&message)?));
            nodes.insert(hash.to_owned(), node.clone());
            Ok(Some(node))
        })?;
        row.insert("args".to_owned(), Value::String(args.to_string()));
    }
    Ok(())
}

/// The member of the request's body that holds its conversation.
fn conversation_mut(args: &mut Value) -> Option<(&'static str, &mut Value)> {
    let body = args.get_mut("body")?.as_object_mut()?;
    let member = CONVERSATIONS.into_iter().find(|member| {
        body.get(*member)
            .is_some_and(|list| list.is_array() || list.get(CHAIN).is_some())
    })?;
    Some((member, body.get_mut(member)?))
}

/// Deletes the nodes no step's args lead to any more (after `gc` took
/// tasks out); how many.
pub(crate) fn sweep(tx: &mut dyn Tx) -> Result<u64> {
    let mut tips = Vec::new();
    tx.query(&sql::CHAIN_TIPS, &[], &mut |row| {
        let args: Value = serde_json::from_str(row.some_text(0)?)?;
        let mut args = args;
        if let Some((_, list)) = conversation_mut(&mut args)
            && let Some(tip) = list.get(CHAIN).and_then(Value::as_str)
        {
            tips.push(tip.to_owned());
        }
        Ok(())
    })?;
    let mut parents = HashMap::new();
    tx.query(&sql::CHAT_NODE_PARENTS, &[], &mut |row| {
        parents.insert(
            row.some_text(0)?.to_owned(),
            row.text(1)?.map(str::to_owned),
        );
        Ok(())
    })?;
    let mut kept = std::collections::HashSet::new();
    for tip in tips {
        let mut at = Some(tip);
        while let Some(hash) = at {
            if !kept.insert(hash.clone()) {
                break;
            }
            at = parents.get(&hash).cloned().flatten();
        }
    }
    let mut removed = 0;
    for hash in parents.keys().filter(|hash| !kept.contains(*hash)) {
        removed += tx.execute(&sql::DELETE_CHAT_NODE, &[hash.as_str().into()])?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_chain_stands_for_the_list_and_gives_it_back() {
        let mut args =
            json!({"body": {"model": "m", "messages": [{"role": "user", "content": "a"}]}});
        let mut stored: HashMap<String, Node> = HashMap::new();
        stored.insert(
            "t".into(),
            (
                Some("p".into()),
                Arc::new(json!({"role": "assistant", "content": "b"})),
            ),
        );
        stored.insert(
            "p".into(),
            (None, Arc::new(json!({"role": "user", "content": "a"}))),
        );
        args["body"]["messages"] = json!({CHAIN: "t", "messages": 2});
        expand_value(&mut args, &mut |hash| Ok(stored.get(hash).cloned())).unwrap();
        assert_eq!(
            args["body"]["messages"],
            json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
        );
        let mut broken = json!({"body": {"messages": {CHAIN: "x", "messages": 1}}});
        assert!(expand_value(&mut broken, &mut |_| Ok(None)).is_err());
    }
}
