//! The story's pages of recorded steps: as written for a reader, and for
//! a run's numbering, where a step replayed by content is only a number.

use serde_json::json;

use super::{fresh, me, started, step, task};
use crate::journal::*;
use crate::json_text::JsonText;

/// A run's numbering page holds every live step in order, but a proxy or
/// MCP step's args and output are left out (the run's book has those);
/// the reader's page has them all.
pub(super) fn a_numbering_page_leaves_out_what_replays_by_content(journal: &mut dyn Journal) {
    journal.create_task(&task("t-numbering")).expect("create");
    let run = started(journal, "t-numbering", &me());
    let answer = JsonText::from_value(&json!({"status": 200, "body": {"text": "answer"}}));
    let records: Vec<StepRecord> = [
        StepKind::Call,
        StepKind::Proxy,
        StepKind::Mcp,
        StepKind::Begin,
    ]
    .into_iter()
    .zip(1..)
    .map(|(kind, n)| StepRecord {
        kind,
        output: Some(answer.clone()),
        ..step(n, StepStatus::Committed)
    })
    .collect();
    journal
        .put_steps("t-numbering", &fresh(&records), run, None)
        .expect("steps");
    let written = records[0].args.as_str();
    let shown = |page: Vec<StepRecord>| -> Vec<(u64, String, Option<String>)> {
        page.into_iter()
            .map(|record| {
                let output = record.output.map(|output| output.as_str().to_owned());
                (record.step, record.args.as_str().to_owned(), output)
            })
            .collect()
    };
    let whole = |n: u64| (n, written.to_owned(), Some(answer.as_str().to_owned()));
    let bare = |n: u64| (n, "null".to_owned(), None);
    assert_eq!(
        shown(journal.numbering_page("t-numbering", 0, 10).expect("page")),
        [whole(1), bare(2), bare(3), whole(4)]
    );
    assert_eq!(
        shown(journal.numbering_page("t-numbering", 2, 1).expect("page")),
        [bare(3)]
    );
    assert_eq!(
        shown(journal.steps_page("t-numbering", 0, 10).expect("page")),
        [whole(1), whole(2), whole(3), whole(4)]
    );
}
