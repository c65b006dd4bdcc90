//! What durun tells the person watching a run, on stderr.
//!
//! The supervisor never prints: it emits [`Event`]s, and a [`Reporter`]
//! chosen up front turns them into an indicatif line on a terminal, one
//! plain line per step elsewhere (a CI log), or nothing with `-q`.
//! [`error`] prints the `durun: …` line a failed command ends with.

mod plain;
mod progress;
pub(crate) mod table;
mod tagged;

use std::time::Duration;

use crate::journal::{RunStats, StepStatus, TaskStatus};

pub(crate) use plain::Plain;
pub(crate) use progress::Progress;
pub(crate) use tagged::tag_thread;

pub(crate) enum Event<'a> {
    RunStarted {
        task: &'a str,
        run: u32,
        recorded_steps: usize,
    },
    StepReplayed {
        step: u64,
        name: &'a str,
    },
    StepStarted {
        step: u64,
        name: &'a str,
        attempt: u32,
    },
    StepFinished {
        step: u64,
        name: &'a str,
        status: StepStatus,
        elapsed: Duration,
        tokens: u64,
        error: Option<&'a str>,
        /// The whole row, for whoever wants more of it (traces).
        record: &'a crate::journal::StepRecord,
    },
    /// Something the operator should know that is not an error.
    Warning(&'a str),
    /// What the operator could do, a line that says it (`durun: MESSAGE`).
    Hint(&'a str),
    RunFinished {
        task: &'a str,
        status: TaskStatus,
        exit_code: i32,
        stats: &'a RunStats,
        elapsed: Duration,
        /// What the task holds now, which decides what to type next.
        journaled: Journaled,
    },
}

/// What a task holds once a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Journaled {
    /// Steps: a resume replays them.
    Steps,
    /// No step, in this run or before it: a resume would only start the
    /// agent again as it was.
    Nothing,
    /// The task was removed: its agent could not be started.
    Removed,
}

/// Writes bytes of the agent's stderr where a person sees them.
pub(crate) type StderrCopier = Box<dyn FnMut(&[u8]) + Send>;

pub(crate) trait Reporter {
    fn report(&mut self, event: &Event<'_>);

    /// Where the agent's stderr goes when it cannot pass straight through:
    /// a live progress line must be taken down around each write, or it
    /// leaves a frozen copy above every line the agent prints. `None`
    /// (the default) leaves the agent's stderr untouched.
    fn stderr_copier(&self) -> Option<StderrCopier> {
        None
    }
}

/// Reports nothing (`-q`), except warnings.
pub(crate) struct Quiet;

impl Reporter for Quiet {
    fn report(&mut self, event: &Event<'_>) {
        let line = match event {
            Event::Warning(message) => format!("durun: warning: {message}\n"),
            Event::Hint(message) => format!("durun: {message}\n"),
            _ => return,
        };
        // One write, whole, beside the agent's own stderr lines.
        tagged::write_stderr(line.as_bytes());
    }
}

/// The reporter for this process: quiet, a progress line on a terminal, or
/// plain lines.
pub(crate) fn for_stderr(quiet: bool) -> Box<dyn Reporter> {
    use std::io::IsTerminal as _;
    if let Some(tag) = tagged::tag() {
        Box::new(tagged::Tagged { tag })
    } else if quiet {
        Box::new(Quiet)
    } else if std::io::stderr().is_terminal() {
        Box::new(Progress::new())
    } else {
        Box::new(Plain::default())
    }
}

/// Prints `durun: <what happened>`, the causes, and the hint to stderr.
pub(crate) fn error(err: &anyhow::Error) {
    use std::io::Write as _;
    // Written whole, in one write, beside whatever the agent left running
    // still prints.
    let mut out = Vec::new();
    // Messages quote task ids, step names and tool output: escaped.
    let _ = writeln!(out, "{}", escape(&described(err)));
    tagged::write_stderr(&out);
}

/// What [`error`] prints, unescaped: `durun: <what happened>`, the
/// causes, the details and the hint, a line each (what a run keeps as its
/// `error`).
pub(crate) fn described(err: &anyhow::Error) -> String {
    let mut lines = vec![format!("durun: {}", with_journal(&err.to_string()))];
    for cause in err.chain().skip(1) {
        lines.push(format!("  caused by: {cause}"));
    }
    let failure = crate::error::failure_of(err);
    if let Some(details) = failure.and_then(|failure| failure.details.as_deref()) {
        lines.extend(details.lines().map(|line| format!("  {line}")));
    }
    if let Some(hint) = failure.and_then(|failure| failure.hint.as_deref()) {
        lines.push(format!("  hint: {}", with_journal(hint)));
    }
    lines.join("\n")
}

/// The journal the command line named with `--journal`, if it did: the
/// commands durun suggests then name it too, or they would act on
/// another journal.
static JOURNAL_FLAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Remembers that the command line named the journal `journal`.
pub(crate) fn journal_named(journal: &str) {
    let _ = JOURNAL_FLAG.set(crate::task::shell_words(&[journal.to_owned()]));
}

/// `text` with every suggested command (`` `durun …` ``) naming the
/// journal the command line named.
pub(crate) fn with_journal(text: &str) -> std::borrow::Cow<'_, str> {
    match JOURNAL_FLAG.get() {
        Some(journal) if text.contains("`durun ") => std::borrow::Cow::Owned(
            text.replace("`durun ", &format!("`durun --journal {journal} ")),
        ),
        _ => std::borrow::Cow::Borrowed(text),
    }
}

/// Prints one `durun: MESSAGE` line to stderr, escaped, in one write (the
/// agent's stderr is the same file). Every line a command says to a person
/// goes through here.
pub(crate) fn say(message: &str) {
    let line = format!("durun: {}\n", escape(&with_journal(message)));
    tagged::write_stderr(line.as_bytes());
}

/// `text` safe to show on a terminal: every control character (C0 but
/// newline and tab, DEL, C1) that came from the journal, the agent or a
/// tool is written as an escape (`\x1b`, `\u{9b}`) instead of being
/// obeyed by the terminal (SPEC 5). Every human-facing output goes through
/// it.
pub(crate) fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    // Bidirectional overrides and isolates reorder what follows them on
    // screen: a name could show another name's text.
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !unsafe_char(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A short human duration: `850ms`, `2.4s`, `3m12s`.
pub(crate) fn short_duration(elapsed: Duration) -> String {
    let millis = elapsed.as_millis();
    if millis < 1000 {
        format!("{millis}ms")
    } else if millis < 60_000 {
        format!("{:.1}s", elapsed.as_secs_f64())
    } else {
        let secs = elapsed.as_secs();
        format!("{}m{:02}s", secs / 60, secs % 60)
    }
}

/// What to type to carry on after a run that did not complete.
pub(crate) fn next_move(
    task: &str,
    status: TaskStatus,
    exit_code: i32,
    journaled: Journaled,
) -> Option<String> {
    match journaled {
        Journaled::Removed => {
            return Some(
                "the agent could not be started: no task was kept; fix the command and run it again"
                    .to_owned(),
            );
        }
        Journaled::Nothing if status == TaskStatus::Failed => {
            return Some(
                "the agent ended before its first step: nothing was journaled; fix it and run it again"
                    .to_owned(),
            );
        }
        _ => {}
    }
    match (status, exit_code) {
        // The error that follows names the way out (`--from-step N`, the
        // command that cannot start): a plain resume would fail the same.
        (_, crate::exit_code::DIVERGENCE | crate::exit_code::CANNOT_START) => None,
        (TaskStatus::Interrupted | TaskStatus::Failed, _) => {
            Some(with_journal(&format!("continue with `durun resume {task}`")).into_owned())
        }
        _ => None,
    }
}

/// The lines a run ends with: its summary, and what to type next if
/// anything, each `[durun] …` and ended by a newline.
pub(crate) fn closing(
    task: &str,
    status: TaskStatus,
    exit_code: i32,
    stats: &RunStats,
    elapsed: Duration,
    journaled: Journaled,
) -> String {
    let mut text = format!(
        "[durun] task {task} {}\n",
        summary(status, exit_code, stats, elapsed)
    );
    if let Some(next) = next_move(task, status, exit_code, journaled) {
        use std::fmt::Write as _;
        let _ = writeln!(text, "[durun] {next}");
    }
    text
}

/// The closing line of a run.
pub(crate) fn summary(
    status: TaskStatus,
    exit_code: i32,
    stats: &RunStats,
    elapsed: Duration,
) -> String {
    use std::fmt::Write as _;
    let mut line = match status {
        TaskStatus::Completed => "completed".to_owned(),
        other => format!("{} (exit {exit_code})", other.as_str()),
    };
    let _ = write!(
        line,
        ": {} replayed, {} executed",
        plural(stats.replayed_steps, "step"),
        stats.executed_steps
    );
    if stats.tokens_saved > 0 || stats.tokens_spent > 0 {
        let _ = write!(
            line,
            ", {} tokens saved, {} spent",
            thousands(stats.tokens_saved),
            thousands(stats.tokens_spent)
        );
    }
    let _ = write!(line, ", {}", short_duration(elapsed));
    line
}

pub(crate) fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(escape("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            escape("a\x1b[2Jb\x1b]0;title\x07c\u{9b}d\x7f"),
            "a\\x1b[2Jb\\x1b]0;title\\x07c\\u{9b}d\\x7f"
        );
        assert_eq!(escape("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
    }

    #[test]
    fn formats_numbers_and_durations() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(short_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(short_duration(Duration::from_millis(2400)), "2.4s");
        assert_eq!(short_duration(Duration::from_secs(192)), "3m12s");
        let stats = RunStats {
            replayed_steps: 3,
            replays_noted: 3,
            executed_steps: 5,
            tokens_saved: 2436,
            tokens_spent: 900,
            cost: crate::journal::Cost::default(),
        };
        assert_eq!(
            summary(
                TaskStatus::Completed,
                0,
                &stats,
                Duration::from_millis(1200)
            ),
            "completed: 3 steps replayed, 5 executed, 2,436 tokens saved, 900 spent, 1.2s"
        );
    }
}
