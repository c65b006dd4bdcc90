//! The runners of child tasks without a queue (SPEC 16): at most a given
//! number at once, the rest waiting in spawn order.

use std::collections::VecDeque;

#[derive(Default)]
pub(super) struct Runners {
    running: usize,
    waiting: VecDeque<String>,
}

impl Runners {
    /// Whether `child` may start now, `jobs` at most running; if not, it
    /// waits for a runner to end.
    pub(super) fn admit(&mut self, child: &str, jobs: usize) -> bool {
        if self.running >= jobs.max(1) {
            self.waiting.push_back(child.to_owned());
            return false;
        }
        true
    }

    /// A runner started.
    pub(super) fn started(&mut self) {
        self.running += 1;
    }

    /// A runner ended: the next waiting child, when the run goes on.
    pub(super) fn ended(&mut self, goes_on: bool) -> Option<String> {
        self.running = self.running.saturating_sub(1);
        if goes_on {
            self.waiting.pop_front()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_past_the_limit_wait_their_turn_in_spawn_order() {
        let mut runners = Runners::default();
        assert!(runners.admit("a", 1));
        runners.started();
        assert!(!runners.admit("b", 1));
        assert!(!runners.admit("c", 1));
        assert_eq!(runners.ended(true).as_deref(), Some("b"));
        runners.started();
        // A run that stops starts no one.
        assert_eq!(runners.ended(false), None);
        assert!(runners.admit("d", 1));
    }
}
