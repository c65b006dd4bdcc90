//! Runs that share a process: a worker's tasks, each a supervisor on a
//! thread of the worker (SPEC 16). The worker takes SIGINT, SIGTERM and
//! SIGHUP itself and hands each to every run through [`Stops`], so that
//! each stops resumably as a `durun resume` of its own would.
//!
//! # Invariant
//!
//! A run that joins after a signal came gets it at once: no run starts
//! unstopped once the worker was told to stop.

use std::sync::{Arc, Mutex, PoisonError};

use super::inbox::{Event, Events};

/// The signals of a process whose runs share it.
#[derive(Default)]
pub(crate) struct Stops {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The signals that came, in order.
    came: Vec<i32>,
    runs: Vec<(u64, Events)>,
    next: u64,
}

impl Stops {
    /// Hands `signal` to every run, and to every run that joins later.
    pub(crate) fn signal(&self, signal: i32) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.came.push(signal);
        for (_, events) in &inner.runs {
            let _ = events.send(Event::Signal(signal));
        }
    }

    /// Whether a stop signal has come.
    pub(crate) fn came(&self) -> bool {
        !self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .came
            .is_empty()
    }

    /// Counts a run in until the returned guard drops.
    pub(super) fn join(self: &Arc<Self>, events: Events) -> Joined {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for signal in &inner.came {
            let _ = events.send(Event::Signal(*signal));
        }
        let id = inner.next;
        inner.next += 1;
        inner.runs.push((id, events));
        Joined {
            stops: Arc::clone(self),
            id,
        }
    }
}

/// A run counted in [`Stops`].
pub(super) struct Joined {
    stops: Arc<Stops>,
    id: u64,
}

impl Drop for Joined {
    fn drop(&mut self) {
        let mut inner = self
            .stops
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        inner.runs.retain(|(id, _)| *id != self.id);
    }
}
