//! The finished steps a run may replay by content (SPEC 12, 13), shared by
//! the loop and the model proxy: the proxy takes the answer to a request
//! byte-identical to a recorded one itself, with no round trip to the
//! loop, so a resumed chat's calls cost no wake-up of another thread
//! (SPEC 21).
//!
//! # Invariant
//!
//! A finished step answers at most one request of a run, whichever thread
//! takes it, the earliest of equal ones first. A step the proxy took is
//! handed to the loop ([`Book::taken`]), which counts it before anything
//! it reads after: the proxy puts it here before the agent has its answer.
//! Once the run stops or is fenced, the proxy takes nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::journal::StepRecord;
use crate::json_text::JsonText;
use crate::proxy::{Answers, Taken};

/// The shelf of finished steps, behind a lock both threads take briefly.
#[derive(Default)]
pub(super) struct Book(Mutex<Shelf>);

/// Steps by name and args hash, earliest first.
pub(super) type Queues = HashMap<(String, String), VecDeque<StepRecord>>;

#[derive(Default)]
struct Shelf {
    /// Finished steps no request of this run has had.
    finished: Queues,
    /// The name and args hash of each finished step's request, by its
    /// bytes' `request_hash`: a byte-identical request finds its step
    /// without being parsed.
    known: HashMap<String, (String, String)>,
    /// Taken by the proxy and not yet counted by the loop (their outputs
    /// went to the agent).
    taken: Vec<StepRecord>,
    /// The run stops, or lost its lease: the proxy takes nothing more.
    closed: Option<Closed>,
}

/// Why the proxy takes no answer any more.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Closed {
    /// The run stops: requests are refused, as the loop refuses them.
    Stopping,
    /// Another runner holds the task: the agent hears nothing more.
    Fenced,
}

impl Book {
    /// Shelves a finished step read from the journal.
    pub(super) fn add(&self, record: StepRecord) {
        let mut shelf = self.lock();
        if let Some(request_hash) = &record.request_hash {
            let at = (record.name.clone(), record.args_hash.clone());
            shelf.known.insert(request_hash.clone(), at);
        }
        shelve(&mut shelf.finished, record);
    }

    /// Keeps a finished step for the next equal request (its answer never
    /// reached the agent).
    pub(super) fn keep(&self, record: StepRecord) {
        let at = (record.name.clone(), record.args_hash.clone());
        self.lock()
            .finished
            .entry(at)
            .or_default()
            .push_back(record);
    }

    /// The earliest finished step with this name and args that no request
    /// of this run has had.
    pub(super) fn take(&self, name: &str, args_hash: &str) -> Option<StepRecord> {
        take(&mut self.lock().finished, name, args_hash)
    }

    /// The steps the proxy took since the last call, for the loop to count.
    pub(super) fn taken(&self) -> Vec<StepRecord> {
        std::mem::take(&mut self.lock().taken)
    }

    /// The proxy takes nothing more: the run stops, or is fenced (which
    /// stays).
    pub(super) fn close(&self, closed: Closed) {
        let mut shelf = self.lock();
        if shelf.closed != Some(Closed::Fenced) {
            shelf.closed = Some(closed);
        }
    }

    /// The earliest finished step named `name` that no request of this
    /// run has had, whatever its args: a copy without its output (which
    /// stays on the shelf), for a look at its args.
    pub(super) fn first_unreplayed(&self, name: &str) -> Option<StepRecord> {
        let mut shelf = self.lock();
        let record = shelf
            .finished
            .iter_mut()
            .filter(|((recorded, _), _)| recorded == name)
            .filter_map(|(_, records)| records.front_mut())
            .min_by_key(|record| record.step)?;
        // Asked at each new request of a resumed run until a hint is
        // given: a model answer (up to `max_record`) is not copied each
        // time.
        let output = record.output.take();
        let copy = record.clone();
        record.output = output;
        Some(copy)
    }

    /// The recorded steps no request of this run has had, in order.
    pub(super) fn unreplayed(&self) -> Vec<u64> {
        let mut steps: Vec<u64> = self
            .lock()
            .finished
            .values()
            .flatten()
            .map(|record| record.step)
            .collect();
        steps.sort_unstable();
        steps
    }

    fn lock(&self) -> MutexGuard<'_, Shelf> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Answers for Book {
    /// The earliest finished step equal to the request whose bytes hash
    /// to `request_hash` that no request of this run has had: the step
    /// [`Book::take`] gives for its name and args.
    fn take(&self, request_hash: &str) -> Taken {
        let mut shelf = self.lock();
        let Shelf {
            finished,
            known,
            taken,
            closed,
        } = &mut *shelf;
        match closed {
            Some(Closed::Stopping) => return Taken::Stopping,
            Some(Closed::Fenced) => return Taken::Ended,
            None => {}
        }
        let Some(mut record) = known.get(request_hash).and_then(|at| take_at(finished, at)) else {
            return Taken::Ask;
        };
        let output = record.output.take().unwrap_or_else(JsonText::null);
        taken.push(record);
        Taken::Output(output)
    }
}

/// Puts `record` last among the steps of its name and args.
pub(super) fn shelve(queues: &mut Queues, record: StepRecord) {
    let at = (record.name.clone(), record.args_hash.clone());
    queues.entry(at).or_default().push_back(record);
}

/// The earliest step with this name and args, taken out.
pub(super) fn take(queues: &mut Queues, name: &str, args_hash: &str) -> Option<StepRecord> {
    // Keyed by owned strings: a lookup builds the key once per request.
    take_at(queues, &(name.to_owned(), args_hash.to_owned()))
}

fn take_at(map: &mut Queues, at: &(String, String)) -> Option<StepRecord> {
    let queue = map.get_mut(at)?;
    let record = queue.pop_front();
    if queue.is_empty() {
        map.remove(at);
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{StepKind, StepStatus};

    fn proxied(step: u64, args_hash: &str, request_hash: Option<&str>) -> StepRecord {
        StepRecord {
            name: "openai POST /chat/completions".into(),
            kind: StepKind::Proxy,
            args_hash: args_hash.into(),
            request_hash: request_hash.map(str::to_owned),
            output: Some(JsonText::from_value(&serde_json::json!({ "step": step }))),
            ..StepRecord::sample(step, StepStatus::Committed)
        }
    }

    /// A book with `records` shelved, in this order.
    fn shelved(records: impl IntoIterator<Item = StepRecord>) -> Book {
        let book = Book::default();
        for record in records {
            book.add(record);
        }
        book
    }

    fn output_step(taken: Taken) -> Option<u64> {
        match taken {
            Taken::Output(output) => output.value()["step"].as_u64(),
            _ => None,
        }
    }

    /// A request found by its bytes takes what its args would: the
    /// earliest unreplayed step of its name and args, once each; a step
    /// recorded without a request hash is found by its args alone. What
    /// the proxy took goes to the loop, once.
    #[test]
    fn a_known_request_takes_the_step_its_args_would() {
        let book = shelved([
            proxied(1, "a", Some("bytes-1")),
            proxied(2, "a", Some("bytes-2")),
            proxied(3, "b", None),
        ]);
        // Other bytes, the same args: the earliest step of those args.
        assert_eq!(output_step(Answers::take(&book, "bytes-2")), Some(1));
        assert_eq!(
            book.take("openai POST /chat/completions", "a")
                .map(|r| r.step),
            Some(2)
        );
        assert!(
            matches!(Answers::take(&book, "bytes-1"), Taken::Ask),
            "each answers once"
        );
        assert!(matches!(Answers::take(&book, "bytes-3"), Taken::Ask));
        assert_eq!(
            book.take("openai POST /chat/completions", "b")
                .map(|r| r.step),
            Some(3)
        );
        let taken: Vec<u64> = book.taken().iter().map(|r| r.step).collect();
        assert_eq!(taken, [1]);
        assert!(book.taken().is_empty(), "counted once");
    }

    /// The first unreplayed step of a name is its earliest, handed over
    /// without its output, which stays for the request that replays it.
    #[test]
    fn the_first_unreplayed_step_comes_without_its_output() {
        let book = shelved([
            proxied(2, "b", Some("bytes-2")),
            proxied(1, "a", Some("bytes-1")),
        ]);
        let first = book
            .first_unreplayed("openai POST /chat/completions")
            .expect("a step");
        assert_eq!((first.step, first.args_hash.as_str()), (1, "a"));
        assert!(first.output.is_none());
        assert!(book.first_unreplayed("other").is_none());
        assert_eq!(output_step(Answers::take(&book, "bytes-1")), Some(1));
    }

    /// Once the run stops, the proxy takes nothing; once fenced, it stays
    /// fenced.
    #[test]
    fn a_closed_book_gives_no_answer() {
        let book = Book::default();
        book.add(proxied(1, "a", Some("bytes-1")));
        book.close(Closed::Stopping);
        assert!(matches!(Answers::take(&book, "bytes-1"), Taken::Stopping));
        book.close(Closed::Fenced);
        book.close(Closed::Stopping);
        assert!(matches!(Answers::take(&book, "bytes-1"), Taken::Ended));
        assert_eq!(book.unreplayed(), [1], "nothing was taken");
    }
}
