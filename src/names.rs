//! Names that go into the journal, SQL parameters and logs: task ids and
//! queue names, checked by one rule wherever they come from (the command
//! line, an import); and free-form names (steps, signals, MCP servers),
//! which may hold anything but a newline or a control character.

use crate::error::Failure;

pub(crate) fn check_task_id(id: &str) -> anyhow::Result<()> {
    check_word("task id", id, 128, &['-', '_', '.', ':'])
}

pub(crate) fn check_queue(queue: &str) -> anyhow::Result<()> {
    check_word("queue name", queue, 64, &['-', '_', '.'])
}

/// Refuses what would break a line of stderr or a table in a free-form
/// name (a step's, a signal's, an MCP server's): a newline or another
/// control character. Says what it found.
pub(crate) fn check_name(text: &str) -> Result<(), String> {
    match text.chars().find(|c| c.is_control()) {
        None => Ok(()),
        Some('\n' | '\r') => Err("a newline".to_owned()),
        Some(c) => Err(format!("a control character ({c:?})")),
    }
}

/// Refuses a free-form name given on the command line or in a config
/// ([`check_name`]), with exit 64 (SPEC 17).
pub(crate) fn check_given_name(kind: &str, text: &str) -> anyhow::Result<()> {
    check_name(text).map_err(|why| {
        Failure::config(format!("invalid {kind} {text:?}: it holds {why}"))
            .hint(format!("a {kind} is one line of printable text"))
            .into()
    })
}

/// Names that go into the journal, SQL parameters and logs (task ids,
/// queue names): 1 to `most` letters, digits and the `extra` characters.
fn check_word(kind: &str, text: &str, most: usize, extra: &[char]) -> anyhow::Result<()> {
    let fine = !text.is_empty()
        && text.len() <= most
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c));
    if fine {
        return Ok(());
    }
    let shown: Vec<String> = extra.iter().map(|c| format!("`{c}`")).collect();
    let (last, rest) = shown.split_last().expect("some extra characters");
    Err(Failure::usage(format!("invalid {kind} {text:?}"))
        .hint(format!(
            "a {kind} is 1 to {most} characters of letters, digits, {} and {last}",
            rest.join(", ")
        ))
        .into())
}
