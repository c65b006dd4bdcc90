//! Names that go into the journal, SQL parameters and logs: task ids and
//! queue names, checked by one rule wherever they come from (the command
//! line, an import).

use crate::error::Failure;

pub(crate) fn check_task_id(id: &str) -> anyhow::Result<()> {
    check_word("task id", id, 128, &['-', '_', '.', ':'])
}

pub(crate) fn check_queue(queue: &str) -> anyhow::Result<()> {
    check_word("queue name", queue, 64, &['-', '_', '.'])
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
