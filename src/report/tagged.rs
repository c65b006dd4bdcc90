//! The lines of a worker's tasks (SPEC 16): each task runs on a thread of
//! the worker, and every line of it (durun's own and its agent's stderr)
//! is prefixed `[TASK] ` and written whole, since a worker's log
//! interleaves many tasks.

use std::cell::RefCell;
use std::io::Write as _;

thread_local! {
    /// The task this thread runs, on a worker.
    static TAG: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Prefixes what this thread writes with `[TASK] ` from now on.
pub(crate) fn tag_thread(task: &str) {
    TAG.with(|tag| *tag.borrow_mut() = Some(format!("[{task}] ")));
}

/// This thread's prefix, if it runs a worker's task.
pub(super) fn tag() -> Option<String> {
    TAG.with(|tag| tag.borrow().clone())
}

/// Writes whole lines to stderr in one write, each prefixed with this
/// thread's tag if it has one.
pub(super) fn write_stderr(lines: &[u8]) {
    match tag() {
        Some(tag) => {
            let _ = std::io::stderr().lock().write_all(&prefixed(&tag, lines));
        }
        None => {
            let _ = std::io::stderr().lock().write_all(lines);
        }
    }
}

fn prefixed(tag: &str, lines: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.len() + tag.len() * 2);
    for line in lines.split_inclusive(|byte| *byte == b'\n') {
        out.extend_from_slice(tag.as_bytes());
        out.extend_from_slice(line);
    }
    out
}

/// `-q` for a worker's task: warnings only, and the agent's stderr
/// copied line by line behind the task's prefix.
pub(super) struct Tagged {
    pub(super) tag: String,
}

impl super::Reporter for Tagged {
    fn report(&mut self, event: &super::Event<'_>) {
        super::Quiet.report(event);
    }

    fn stderr_copier(&self) -> Option<super::StderrCopier> {
        let mut lines = Lines {
            tag: self.tag.clone(),
            partial: Vec::new(),
        };
        Some(Box::new(move |bytes: &[u8]| lines.copy(bytes)))
    }
}

/// An agent's stderr as whole lines; a last line without a newline is
/// written when the copier drops.
struct Lines {
    tag: String,
    partial: Vec<u8>,
}

impl Lines {
    fn copy(&mut self, bytes: &[u8]) {
        let Some(end) = bytes.iter().rposition(|byte| *byte == b'\n') else {
            self.partial.extend_from_slice(bytes);
            return;
        };
        self.partial.extend_from_slice(&bytes[..=end]);
        let _ = std::io::stderr()
            .lock()
            .write_all(&prefixed(&self.tag, &self.partial));
        self.partial.clear();
        self.partial.extend_from_slice(&bytes[end + 1..]);
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        if !self.partial.is_empty() {
            self.partial.push(b'\n');
            let _ = std::io::stderr()
                .lock()
                .write_all(&prefixed(&self.tag, &self.partial));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefixed;

    #[test]
    fn every_line_gets_the_prefix() {
        assert_eq!(prefixed("[t] ", b"a\nb\n"), b"[t] a\n[t] b\n");
        assert_eq!(prefixed("[t] ", b"one"), b"[t] one");
    }
}
