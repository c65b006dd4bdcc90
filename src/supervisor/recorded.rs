//! The task's recorded steps, read from the journal a page at a time as the
//! agent's protocol steps reach them (the first while the agent starts,
//! the next while the agent replays the end of one from an `ahead`
//! answer). Steps replayed by content (proxy and MCP requests) are in the
//! pages too, so that the protocol's numbering can pass over their numbers,
//! but without their args and output: those are in the run's [`Book`],
//! read once.
//!
//! [`Book`]: super::book::Book
//!
//! # Invariant
//!
//! Each recorded row is read once and memory holds at most two pages
//! however long the task; a step past the last one recorded when the run
//! started is never looked up, so replaying a step or running a new one
//! needs no round trip of its own.

use std::collections::VecDeque;

use crate::journal::{Journal, StepRecord};

/// Steps read per query.
const PAGE: usize = 1024;

pub(super) struct Recorded {
    page: VecDeque<StepRecord>,
    /// The page after `page`, read before the agent reached it.
    next: Option<VecDeque<StepRecord>>,
    /// An `ahead` answer offered the last step of `page`: the agent
    /// replays up to there itself, and then needs the next page.
    wanted: bool,
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
            next: None,
            wanted: false,
            last,
            done: last == 0,
        }
    }

    /// Whether the journal must be read before [`Recorded::take`] can
    /// answer for `step`. Steps are asked for in increasing order, so the
    /// steps before `step` are dropped.
    pub(super) fn needs_page(&mut self, step: u64) -> bool {
        loop {
            while self.page.front().is_some_and(|record| record.step < step) {
                self.page.pop_front();
            }
            // A page read ahead takes over once this one is used up.
            if !self.page.is_empty() {
                break;
            }
            match self.next.take() {
                Some(next) => self.page = next,
                None => break,
            }
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
        self.page = journal.numbering_page(task, step - 1, PAGE)?.into();
        self.done = self.page.len() < PAGE;
        Ok(())
    }

    /// Notes that an `ahead` answer offered steps through `step`: if that
    /// is the last one in memory, the next page is wanted.
    pub(super) fn offered_through(&mut self, step: u64) {
        self.wanted = !self.done
            && self.next.is_none()
            && self.page.back().is_some_and(|record| record.step == step);
    }

    /// Whether the next page is wanted before the agent reaches it.
    pub(super) fn wants_next(&self) -> bool {
        self.wanted
    }

    /// Reads the page after the one in memory. On a failure nothing
    /// changes: the page is read when the agent reaches it, as ever.
    pub(super) fn read_next(
        &mut self,
        journal: &mut dyn Journal,
        task: &str,
    ) -> anyhow::Result<()> {
        self.wanted = false;
        let Some(back) = self.page.back() else {
            return Ok(());
        };
        let next: VecDeque<StepRecord> = journal.numbering_page(task, back.step, PAGE)?.into();
        self.done = next.len() < PAGE;
        self.next = Some(next);
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
