//! The task's recorded steps, read from the journal a page at a time as the
//! agent's protocol steps reach them (the first while the agent starts).
//! Steps replayed by content (proxy and MCP requests) are in the pages
//! too, so that the protocol's numbering can pass over their numbers.
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
    /// Every step up to `last` has been read.
    done: bool,
}

impl Recorded {
    pub(super) fn new(last: u64) -> Self {
        Self {
            page: VecDeque::new(),
            last,
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

    /// Reads the page that starts at `step`.
    pub(super) fn read_page(
        &mut self,
        journal: &mut dyn Journal,
        task: &str,
        step: u64,
    ) -> anyhow::Result<()> {
        self.page = journal.steps_page(task, step - 1, PAGE)?.into();
        self.done = self.page.len() < PAGE;
        Ok(())
    }

    /// The kind of the recorded step `step`, if the journal holds one
    /// (after [`Recorded::needs_page`] and, if it said so,
    /// [`Recorded::read_page`]).
    pub(super) fn kind_at(&self, step: u64) -> Option<crate::journal::StepKind> {
        self.page
            .front()
            .filter(|record| record.step == step)
            .map(|record| record.kind)
    }

    /// The recorded steps in memory from `step` on, in order (after
    /// [`Recorded::needs_page`] and, if it said so, [`Recorded::read_page`]).
    pub(super) fn ahead(&self, step: u64) -> impl Iterator<Item = &StepRecord> {
        self.page
            .iter()
            .skip_while(move |record| record.step < step)
    }

    /// The highest step number in the journal when the run started.
    pub(super) fn last(&self) -> u64 {
        self.last
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
