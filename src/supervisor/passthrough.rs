//! Copies the agent's prints to durun's stdout, on a thread of its own,
//! started by the first print (most agents print nothing but requests).
//!
//! # Invariant
//!
//! A slow reader of durun's stdout holds up the agent, never the loop: the
//! queue takes at most [`BOUND`] bytes, and the loop stops reading the
//! agent's stdout until it has room (the agent then waits on its own
//! stdout, as it would without durun). [`Passthrough::finish`] waits
//! until every queued byte is written, so nothing the agent printed is lost
//! when durun exits.

use std::collections::VecDeque;
use std::io::Write as _;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most bytes queued for durun's stdout. One piece larger than this
/// still goes when the queue is empty.
pub(super) const BOUND: usize = 8 * 1024 * 1024;

pub(super) struct Passthrough {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the copier when a piece comes, and `finish` when one went.
    ready: Condvar,
}

#[derive(Default)]
struct Queue {
    pieces: VecDeque<Vec<u8>>,
    /// Queued and being written.
    bytes: usize,
    closed: bool,
}

impl Passthrough {
    pub(super) fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                ready: Condvar::new(),
            }),
            thread: None,
        }
    }

    /// Queues `piece`, or gives it back when the queue is full.
    pub(super) fn offer(&mut self, piece: Vec<u8>) -> Result<(), Vec<u8>> {
        if self.thread.is_none() {
            let copier = Arc::clone(&self.shared);
            match std::thread::Builder::new()
                .name("passthrough".to_owned())
                .spawn(move || copy(&copier))
            {
                Ok(thread) => self.thread = Some(thread),
                Err(_) => {
                    // No thread to be had (the process's limit): the print
                    // is written here, in order, rather than lost.
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&piece).and_then(|()| out.flush());
                    return Ok(());
                }
            }
        }
        let mut queue = self.shared.queue.lock().expect("no panic holds the lock");
        if queue.bytes > 0 && queue.bytes + piece.len() > BOUND {
            return Err(piece);
        }
        queue.bytes += piece.len();
        queue.pieces.push_back(piece);
        self.shared.ready.notify_all();
        Ok(())
    }

    /// Waits until everything queued is written (or durun's stdout failed).
    /// Once `stopped` says a stop came (asked as it waits), gives up when
    /// durun's stdout has taken nothing for `stall`: a run stopped by a
    /// signal, or one that ended in a worker told to stop since, does not
    /// wait forever for a reader that never reads.
    pub(super) fn finish(mut self, stall: Duration, stopped: &dyn Fn() -> bool) {
        let mut queue = self.shared.queue.lock().expect("no panic holds the lock");
        queue.closed = true;
        self.shared.ready.notify_all();
        let mut left = queue.bytes;
        let mut moved_at = Instant::now();
        while queue.bytes > 0 {
            if moved_at.elapsed() >= stall && stopped() {
                // The copier is stuck in a write; it ends with durun.
                self.thread = None;
                return;
            }
            queue = self
                .shared
                .ready
                .wait_timeout(queue, Duration::from_millis(50))
                .expect("no panic holds the lock")
                .0;
            if queue.bytes != left {
                left = queue.bytes;
                moved_at = Instant::now();
            }
        }
        drop(queue);
        self.close();
    }

    fn close(&mut self) {
        if let Ok(mut queue) = self.shared.queue.lock() {
            queue.closed = true;
        }
        self.shared.ready.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Passthrough {
    fn drop(&mut self) {
        self.close();
    }
}

fn copy(shared: &Shared) {
    let mut out = std::io::stdout().lock();
    // durun's own stdout may be closed; the agent's prints are then lost,
    // as they would be without durun, and the queue still empties.
    let mut broken = false;
    loop {
        let (piece, more) = {
            let mut queue = shared.queue.lock().expect("no panic holds the lock");
            while queue.pieces.is_empty() && !queue.closed {
                queue = shared.ready.wait(queue).expect("no panic holds the lock");
            }
            match queue.pieces.pop_front() {
                Some(piece) => (piece, !queue.pieces.is_empty()),
                None => return,
            }
        };
        if !broken {
            broken = out.write_all(&piece).is_err() || (!more && out.flush().is_err());
        }
        let mut queue = shared.queue.lock().expect("no panic holds the lock");
        queue.bytes -= piece.len();
        shared.ready.notify_all();
    }
}
