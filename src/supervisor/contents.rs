//! Steps replayed by content, not position (SPEC 12, 13): the proxy's and
//! MCP's recorded requests, found by name and args, and those in flight.
//!
//! # Invariant
//!
//! A recorded step answers at most one request of a run (it is taken out
//! of the [`Book`] when it does), the earliest of equal ones first; a step
//! in flight is in `in_flight` until its end comes, then written or, for a
//! `mutate` step cut off, kept to be retried with its key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::book::{self, Book, Closed, Queues};
use crate::journal::{StepRecord, StepStatus};

#[derive(Default)]
pub(super) struct Contents {
    /// Read from the journal (on the first request by content).
    loaded: bool,
    /// Finished steps no request of this run has had, shared with the
    /// proxy.
    book: Arc<Book>,
    /// `mutate` steps a run died inside (or whose answer was cut off):
    /// the same request runs them again with their key.
    pending: Queues,
    /// Requests forwarded, by flight.
    in_flight: HashMap<u64, InFlight>,
    /// The last flight given.
    flights: u64,
}

/// A request forwarded as a step of its own.
pub(super) struct InFlight {
    pub(super) record: StepRecord,
    /// Its row is not written yet (a `read` request).
    pub(super) fresh: bool,
    /// The args' canonical form, for the key of a step numbered when it
    /// is written (a `read` request).
    pub(super) canonical: Option<String>,
    pub(super) started: Instant,
    /// Its worst case, reserved in the task's budget (SPEC 19).
    pub(super) reservation: Option<u64>,
}

impl Contents {
    /// Sorts the task's recorded steps by content into what replays and
    /// what runs again.
    pub(super) fn load(&mut self, recorded: Vec<StepRecord>) {
        self.loaded = true;
        for record in recorded {
            match record.status {
                StepStatus::Committed => self.book.add(record),
                StepStatus::Pending => self.keep_pending(record),
                // A failed attempt is not a finished step: the request is
                // new again.
                _ => {}
            }
        }
    }

    /// The earliest finished step with this name and args that no
    /// request of this run has had.
    pub(super) fn take_finished(&mut self, name: &str, args_hash: &str) -> Option<StepRecord> {
        self.book.take(name, args_hash)
    }

    /// The finished steps, as the proxy takes answers from them.
    pub(super) fn book(&self) -> Arc<Book> {
        Arc::clone(&self.book)
    }

    /// The steps the proxy replayed since the last call ([`Book::taken`]).
    pub(super) fn taken(&self) -> Vec<StepRecord> {
        self.book.taken()
    }

    /// The proxy takes no more answers ([`Book::close`]).
    pub(super) fn close(&self, closed: Closed) {
        self.book.close(closed);
    }

    /// A `mutate` step with this name and args left in doubt.
    pub(super) fn take_pending(&mut self, name: &str, args_hash: &str) -> Option<StepRecord> {
        book::take(&mut self.pending, name, args_hash)
    }

    /// The step in doubt whose key is `key`, taken to run again.
    pub(super) fn take_pending_key(&mut self, key: &str) -> Option<StepRecord> {
        let (at, index) = self.pending.iter().find_map(|(at, queue)| {
            queue
                .iter()
                .position(|record| record.idempotency_key == key)
                .map(|index| (at.clone(), index))
        })?;
        let queue = self.pending.get_mut(&at)?;
        let record = queue.remove(index);
        if queue.is_empty() {
            self.pending.remove(&at);
        }
        record
    }

    /// Whether the task's recorded steps were read ([`Self::load`]).
    pub(super) fn loaded(&self) -> bool {
        self.loaded
    }

    /// The request of `flight` came back (answered, cut off, or given up).
    pub(super) fn landed(&mut self, flight: u64) -> Option<InFlight> {
        self.in_flight.remove(&flight)
    }

    /// A request on its way: its flight, which its end comes back with.
    pub(super) fn take_off(&mut self, flight: InFlight) -> u64 {
        self.flights += 1;
        self.in_flight.insert(self.flights, flight);
        self.flights
    }

    /// Keeps a finished step for the next equal request (its answer never
    /// reached the agent).
    pub(super) fn keep_finished(&mut self, record: StepRecord) {
        self.book.keep(record);
    }

    /// Keeps a `mutate` step in doubt for the next equal request.
    pub(super) fn keep_pending(&mut self, record: StepRecord) {
        book::shelve(&mut self.pending, record);
    }

    /// The earliest finished step named `name` that no request of this
    /// run has had, whatever its args, without its output
    /// ([`Book::first_unreplayed`]).
    pub(super) fn first_unreplayed(&self, name: &str) -> Option<StepRecord> {
        self.book.first_unreplayed(name)
    }

    /// The recorded steps no request of this run has had, in order.
    pub(super) fn unreplayed(&self) -> Vec<u64> {
        self.book.unreplayed()
    }
}
