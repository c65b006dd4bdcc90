//! The task's recorded protocol steps, read from the journal a page at a
//! time as the agent reaches them. Steps replayed by content (proxy and
//! MCP requests) are left out: the agent's protocol steps replay as if
//! they were absent.
//!
//! # Invariant
//!
//! Each recorded row is read once and memory holds one page however long
//! the task; a step past the last one recorded when the run started is
//! never looked up, so replaying a step or running a new one needs no
//! round trip of its own.

use std::collections::VecDeque;

use crate::journal::{Journal, StepRecord};

/// Steps read per query.
const PAGE: usize = 1024;

pub(super) struct Recorded {
    page: VecDeque<StepRecord>,
    /// The highest step number in the journal when the run started: no
    /// later step was recorded before this run.
    last: u64,
    /// The last step read, of any kind.
    after: u64,
    /// Every step up to `last` has been read.
    done: bool,
}

impl Recorded {
    pub(super) fn new(last: u64) -> Self {
        Self {
            page: VecDeque::new(),
            last,
            after: 0,
            done: last == 0,
        }
    }

    /// Whether the journal must be read before [`Recorded::take`] can
    /// answer for `step`. Steps are asked for in increasing order, so the
    /// steps before `step` are dropped.
    pub(super) fn needs_page(&mut self, step: u64) -> bool {
        while self.page.front().is_some_and(|record| record.step < step) {
            self.page.pop_front();
        }
        if self.page.is_empty() && !self.done && step > self.last {
            self.done = true;
        }
        self.page.is_empty() && !self.done
    }

    /// Reads pages from `step` on until one holds a protocol step or the
    /// journal has no more.
    pub(super) fn read_page(
        &mut self,
        journal: &mut dyn Journal,
        task: &str,
        step: u64,
    ) -> anyhow::Result<()> {
        self.after = self.after.max(step - 1);
        while self.page.is_empty() && !self.done {
            let rows = journal.steps_page(task, self.after, PAGE)?;
            self.done = rows.len() < PAGE;
            self.after = rows.last().map_or(self.after, |record| record.step);
            self.page = rows
                .into_iter()
                .filter(|record| !record.kind.by_content())
                .collect();
        }
        Ok(())
    }

    /// The number of the next recorded protocol step from `step` on, if
    /// the journal holds one (after [`Recorded::needs_page`] and, if it
    /// said so, [`Recorded::read_page`]).
    pub(super) fn next_at(&self, step: u64) -> Option<u64> {
        self.page
            .front()
            .map(|record| record.step)
            .filter(|next| *next >= step)
    }

    /// Takes the recorded step `step` out of the window, if the journal
    /// holds one (after [`Recorded::needs_page`] and, if it said so,
    /// [`Recorded::read_page`]).
    pub(super) fn take(&mut self, step: u64) -> Option<StepRecord> {
        match self.page.front() {
            Some(record) if record.step == step => self.page.pop_front(),
            _ => None,
        }
    }

    /// Puts back a step [`Recorded::take`] gave, for the next request to
    /// meet (a `patched` that found an older path there).
    pub(super) fn put_back(&mut self, record: StepRecord) {
        self.page.push_front(record);
    }
}
