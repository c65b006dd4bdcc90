//! The live line on a terminal: current step, tool, elapsed time, steps
//! replayed.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{Event, Reporter};
use crate::journal::StepStatus;

pub(crate) struct Progress {
    bar: ProgressBar,
    replayed: u64,
}

impl Progress {
    pub(crate) fn new() -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner:.cyan} [{elapsed_precise}] {msg}")
                .expect("the template is valid"),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Self { bar, replayed: 0 }
    }

    fn message(&self, current: &str) {
        let current = super::escape(current).replace('\n', " ");
        self.bar
            .set_message(format!("{current} · {} replayed", self.replayed));
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Reporter for Progress {
    fn stderr_copier(&self) -> Option<super::StderrCopier> {
        let bar = self.bar.clone();
        Some(Box::new(move |bytes: &[u8]| {
            use std::io::Write as _;
            // The line comes down, the agent's bytes go out as they are,
            // the line is drawn again below them.
            bar.suspend(|| {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(bytes).and_then(|()| err.flush());
            });
        }))
    }

    fn report(&mut self, event: &Event<'_>) {
        match event {
            Event::RunStarted { task, run, .. } => {
                self.message(&format!("task {task} run {run}: starting"));
            }
            Event::StepReplayed { step, name } => {
                self.replayed += 1;
                self.message(&format!("step {step} {name} (replayed)"));
            }
            Event::StepStarted {
                step,
                name,
                attempt,
            } => {
                let retry = if *attempt > 1 {
                    format!(" attempt {attempt}")
                } else {
                    String::new()
                };
                self.message(&format!("step {step} {name}{retry}"));
            }
            Event::StepFinished {
                step,
                name,
                status: StepStatus::Failed,
                error,
                ..
            } => {
                self.bar.println(super::escape(&format!(
                    "[durun] step {step} {name} failed: {}",
                    error.unwrap_or_default().lines().next().unwrap_or_default()
                )));
            }
            Event::StepFinished { .. } => {}
            Event::Warning(message) => self
                .bar
                .println(super::escape(&format!("durun: warning: {message}"))),
            Event::Hint(message) => self
                .bar
                .println(super::escape(&format!("durun: {message}"))),
            Event::RunFinished {
                task,
                status,
                exit_code,
                stats,
                elapsed,
                journaled,
            } => {
                self.bar.finish_and_clear();
                eprint!(
                    "{}",
                    super::closing(task, *status, *exit_code, stats, *elapsed, *journaled)
                );
            }
        }
    }
}
