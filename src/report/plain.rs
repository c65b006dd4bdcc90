//! One plain line per step, for logs.

use std::io::Write as _;

use super::{Event, Reporter, short_duration, thousands};
use crate::journal::StepStatus;

/// Consecutive replayed steps are folded into one line, so a resume of a
/// long task does not flood the log.
#[derive(Default)]
pub(crate) struct Plain {
    replayed: Option<(u64, u64)>,
}

impl Plain {
    fn flush_replayed(&mut self, out: &mut impl std::io::Write) {
        if let Some((first, last)) = self.replayed.take() {
            let _ = if first == last {
                writeln!(out, "[durun] step {first} replayed from the journal")
            } else {
                writeln!(
                    out,
                    "[durun] steps {first}-{last} replayed from the journal"
                )
            };
        }
    }
}

impl Reporter for Plain {
    fn report(&mut self, event: &Event<'_>) {
        let mut out = Vec::new();
        self.render(event, &mut out);
        if !out.is_empty() {
            // One write: the agent's stderr is the same file, and a line of
            // one must not cut into a line of the other.
            let _ = std::io::stderr().lock().write_all(&out);
        }
    }
}

impl Plain {
    fn render(&mut self, event: &Event<'_>, out: &mut Vec<u8>) {
        if let Event::StepReplayed { step, .. } = event {
            self.replayed = match self.replayed {
                Some((first, last)) if last + 1 == *step => Some((first, *step)),
                _ => {
                    self.flush_replayed(out);
                    Some((*step, *step))
                }
            };
            return;
        }
        self.flush_replayed(out);
        let _ = match event {
            Event::RunStarted {
                task,
                run,
                recorded_steps,
            } => {
                if *run == 1 {
                    writeln!(out, "[durun] task {task}: run 1")
                } else {
                    writeln!(
                        out,
                        "[durun] task {task}: run {run}, {} in the journal",
                        super::plural(*recorded_steps as u64, "step")
                    )
                }
            }
            Event::StepStarted { .. } | Event::StepReplayed { .. } => Ok(()),
            Event::StepFinished {
                step,
                name,
                status,
                elapsed,
                tokens,
                error,
                ..
            } => {
                let mut line = format!(
                    "[durun] step {step} {name}: {} in {}",
                    status.as_str(),
                    short_duration(*elapsed)
                );
                if *tokens > 0 {
                    line = format!("{line}, {} tokens", thousands(*tokens));
                }
                if let (StepStatus::Failed, Some(error)) = (status, error) {
                    line = format!("{line}: {}", error.lines().next().unwrap_or_default());
                }
                writeln!(out, "{}", super::escape(&line))
            }
            Event::Warning(message) => writeln!(out, "durun: warning: {}", super::escape(message)),
            Event::Hint(message) => writeln!(out, "durun: {}", super::escape(message)),
            Event::RunFinished {
                task,
                status,
                exit_code,
                stats,
                elapsed,
                journaled,
            } => out.write_all(
                super::closing(task, *status, *exit_code, stats, *elapsed, *journaled).as_bytes(),
            ),
        };
    }
}
