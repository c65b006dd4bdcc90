//! The runners of child tasks without a queue (SPEC 16): at most a given
//! number at once, the rest waiting in spawn order.

use std::collections::VecDeque;

#[derive(Default)]
pub(super) struct Runners {
    /// The children whose runners run, in the order they started.
    running: Vec<String>,
    waiting: VecDeque<String>,
}

impl Runners {
    /// Whether `child` may start now, `jobs` at most running; if not, it
    /// waits for a runner to end.
    pub(super) fn admit(&mut self, child: &str, jobs: usize) -> bool {
        if self.running.len() >= jobs.max(1) {
            self.waiting.push_back(child.to_owned());
            return false;
        }
        true
    }

    /// `child`'s runner started.
    pub(super) fn started(&mut self, child: &str) {
        self.running.push(child.to_owned());
    }

    /// `child`'s runner ended: the next waiting child, when the run goes on.
    pub(super) fn ended(&mut self, child: &str, goes_on: bool) -> Option<String> {
        if let Some(at) = self.running.iter().position(|running| running == child) {
            self.running.remove(at);
        }
        if goes_on {
            self.waiting.pop_front()
        } else {
            None
        }
    }

    /// The children not yet ended: running, then waiting for a runner.
    pub(super) fn unfinished(&self) -> Vec<&str> {
        self.running
            .iter()
            .chain(&self.waiting)
            .map(String::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_past_the_limit_wait_their_turn_in_spawn_order() {
        let mut runners = Runners::default();
        assert!(runners.admit("a", 1));
        runners.started("a");
        assert!(!runners.admit("b", 1));
        assert!(!runners.admit("c", 1));
        assert_eq!(runners.unfinished(), ["a", "b", "c"]);
        assert_eq!(runners.ended("a", true).as_deref(), Some("b"));
        runners.started("b");
        assert_eq!(runners.unfinished(), ["b", "c"]);
        // A run that stops starts no one.
        assert_eq!(runners.ended("b", false), None);
        assert_eq!(runners.unfinished(), ["c"]);
        assert!(runners.admit("d", 1));
    }
}
