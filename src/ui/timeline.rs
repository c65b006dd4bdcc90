//! Pictures drawn as SVG on the server: a task's runs and steps to scale,
//! and tokens by day. Sizes and places are attributes (the page's policy
//! allows no inline style); every label is escaped text.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::html::text;
use crate::journal::{RunRecord, StepKind, StepRecord, StepStatus, TaskRecord};
use crate::protocol::Effect;
use crate::report::{short_duration, thousands};

/// How a step is drawn and listed: each kind visibly different.
pub(super) fn step_class(step: &StepRecord, task: &TaskRecord, driven: bool) -> &'static str {
    match step.status {
        StepStatus::Discarded => "discarded",
        StepStatus::Waiting => "waiting",
        StepStatus::Failed => "failed",
        StepStatus::Pending if driven => "running",
        // A side effect begun by a run that died, its outcome unknown.
        StepStatus::Pending if step.effect == Effect::Mutate => "doubt",
        // A read begun by a run that died: the next run does it again.
        StepStatus::Pending => "interrupted",
        StepStatus::Committed if matches!(step.kind, StepKind::Wait | StepKind::Sleep) => "waited",
        // Written by an earlier run: later runs answered it from the journal.
        StepStatus::Committed if step.run < task.runs => "replayed",
        StepStatus::Committed => "executed",
    }
}

/// What each class means, for the legend.
pub(super) const LEGEND: [(&str, &str); 8] = [
    ("executed", "executed"),
    ("replayed", "recorded earlier, replayed"),
    ("failed", "failed"),
    ("waiting", "waiting"),
    ("waited", "waited"),
    ("running", "running"),
    ("doubt", "in doubt"),
    ("interrupted", "interrupted, runs again"),
];

fn millis(at: &str) -> Option<i64> {
    let at = crate::clock::parse(at)?;
    Some(at.duration_since(UNIX_EPOCH).ok()?.as_millis() as i64)
}

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 70.0;
const ROW: f64 = 26.0;

/// The task's runs, one row each, with the steps each run wrote placed
/// where they started and as long as they took; each run after the first
/// begins with a mark for the steps it replayed.
pub(super) fn task_timeline(
    task: &TaskRecord,
    runs: &[RunRecord],
    steps: &[StepRecord],
    driven: bool,
    now: SystemTime,
) -> String {
    let clock = Clock {
        now_ms: now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |at| at.as_millis() as i64),
        driven,
        last_run: task.runs,
    };
    let starts = runs.iter().filter_map(|run| millis(&run.started_at)).chain(
        steps
            .iter()
            .filter_map(|step| clock.step_span(step).map(|span| span.0)),
    );
    let ends = runs.iter().map(|run| clock.run_end(run)).chain(
        steps
            .iter()
            .filter_map(|step| clock.step_span(step).map(|span| span.1)),
    );
    let (Some(t0), Some(t1)) = (starts.min(), ends.max()) else {
        return "<p class=\"empty\">No run yet.</p>".to_owned();
    };
    let scale = Scale {
        t0,
        span: (t1 - t0).max(1) as f64,
    };
    let rows = runs.len().max(1);
    let height = ROW * rows as f64 + 24.0;
    let mut svg = format!(
        "<svg class=\"timeline\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"runs and steps over time\">"
    );
    for (row, run) in runs.iter().enumerate() {
        let y = ROW * row as f64 + 4.0;
        run_row(&mut svg, (&clock, &scale), run, y);
        for step in steps.iter().filter(|step| step.run == run.run) {
            if let Some(span) = clock.step_span(step) {
                step_rect(&mut svg, &scale, (task, step, span), (y, driven));
            }
        }
        if run.stats.replayed_steps > 0 {
            let start = millis(&run.started_at).unwrap_or(t0);
            replayed_mark(&mut svg, scale.x(start), run, y);
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{:.1}\" class=\"axis\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" class=\"axis end\">{} in all</text></svg>",
        height - 4.0,
        text(&crate::clock::stamp(
            UNIX_EPOCH + Duration::from_millis(t0 as u64)
        )),
        WIDTH - 10.0,
        height - 4.0,
        short_duration(Duration::from_millis((t1 - t0) as u64)),
    );
    svg
}

/// What "now" means for a timeline: a live run's end and a running step's
/// are now.
struct Clock {
    now_ms: i64,
    driven: bool,
    /// The task's last run, the one a live runner drives.
    last_run: u32,
}

impl Clock {
    /// When `run` ended (now, for the live one).
    fn run_end(&self, run: &RunRecord) -> i64 {
        run.finished_at.as_deref().and_then(millis).unwrap_or(
            if self.driven && run.run == self.last_run {
                self.now_ms
            } else {
                0
            },
        )
    }

    /// When `step` started and ended, if it has a start.
    fn step_span(&self, step: &StepRecord) -> Option<(i64, i64)> {
        let start = millis(&step.started_at)?;
        let end = step
            .finished_at
            .as_deref()
            .and_then(millis)
            .unwrap_or(if self.driven { self.now_ms } else { start });
        Some((start, end.max(start)))
    }
}

/// Times to x positions.
struct Scale {
    t0: i64,
    span: f64,
}

impl Scale {
    fn x(&self, at: i64) -> f64 {
        LEFT + (at - self.t0) as f64 / self.span * (WIDTH - LEFT - 10.0)
    }
}

/// A run's label and bar, with what it did in its title.
fn run_row(svg: &mut String, (clock, scale): (&Clock, &Scale), run: &RunRecord, y: f64) {
    let start = millis(&run.started_at).unwrap_or(scale.t0);
    let end = clock.run_end(run).max(start);
    let _ = write!(
        svg,
        "<text x=\"0\" y=\"{:.1}\" class=\"label\">run {}</text>\
         <rect class=\"run\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{}</title></rect>",
        y + 14.0,
        run.run,
        scale.x(start),
        y + 8.0,
        (scale.x(end) - scale.x(start)).max(1.0),
        ROW - 20.0,
        text(&format!(
            "run {} on {} (pid {}): {}, {} executed, {} replayed, {} tokens spent, {} saved",
            run.run,
            run.host,
            run.pid,
            run.exit_code.map_or_else(
                || "no exit recorded".to_owned(),
                |code| format!("exit {code}")
            ),
            run.stats.executed_steps,
            run.stats.replayed_steps,
            thousands(run.stats.tokens_spent),
            thousands(run.stats.tokens_saved)
        ))
    );
}

/// A step, in the row of the run that wrote it: executed there.
fn step_rect(
    svg: &mut String,
    scale: &Scale,
    (task, step, (start, end)): (&TaskRecord, &StepRecord, (i64, i64)),
    (y, driven): (f64, bool),
) {
    let class = match step_class(step, task, driven) {
        "replayed" => "executed",
        class => class,
    };
    let took = Duration::from_millis((end - start) as u64);
    let _ = write!(
        svg,
        "<rect class=\"step {class}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\"><title>{}</title></rect>",
        scale.x(start),
        y + 2.0,
        (scale.x(end) - scale.x(start)).max(2.0),
        ROW - 8.0,
        text(&format!(
            "step {} {}: {class}, {}{}",
            step.step,
            step.name,
            short_duration(took),
            if step.tokens > 0 {
                format!(", {} tokens", thousands(step.tokens))
            } else {
                String::new()
            }
        ))
    );
}

/// The mark at a run's start for the steps it replayed.
fn replayed_mark(svg: &mut String, at: f64, run: &RunRecord, y: f64) {
    let _ = write!(
        svg,
        "<rect class=\"replayed\" x=\"{:.1}\" y=\"{:.1}\" width=\"8\" height=\"{:.1}\"><title>{}</title></rect>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"label end\">{} replayed</text>",
        at,
        y + 2.0,
        ROW - 8.0,
        text(&format!(
            "run {} replayed {} steps from the journal ({} tokens saved)",
            run.run,
            run.stats.replayed_steps,
            thousands(run.stats.tokens_saved)
        )),
        at - 3.0,
        y + 14.0,
        run.stats.replayed_steps,
    );
}

/// Tokens spent and saved per day, two bars a day, the last 60 days that
/// have any.
pub(super) fn day_chart(days: &[(String, u64, u64)]) -> String {
    let days = &days[days.len().saturating_sub(60)..];
    let top = days
        .iter()
        .map(|(_, spent, saved)| (*spent).max(*saved))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let height = 180.0;
    let base = height - 24.0;
    let slot = (WIDTH - LEFT) / days.len().max(1) as f64;
    let bar = (slot * 0.4).min(24.0);
    let mut svg = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"tokens by day\">\
         <text x=\"0\" y=\"14\" class=\"axis\">{}</text><text x=\"0\" y=\"{base}\" class=\"axis\">0</text>",
        thousands(top as u64)
    );
    let every = days.len().div_ceil(12).max(1);
    for (i, (day, spent, saved)) in days.iter().enumerate() {
        let left = LEFT + slot * i as f64;
        for (offset, class, value) in [(0.0, "spent", *spent), (bar, "saved", *saved)] {
            let tall = value as f64 / top * (base - 20.0);
            let _ = write!(
                svg,
                "<rect class=\"{class}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{tall:.1}\"><title>{}</title></rect>",
                left + offset,
                base - tall,
                text(&format!("{day}: {} tokens {class}", thousands(value)))
            );
        }
        if i % every == 0 {
            let _ = write!(
                svg,
                "<text x=\"{left:.1}\" y=\"{:.1}\" class=\"axis\">{}</text>",
                height - 6.0,
                text(day.get(5..).unwrap_or(day))
            );
        }
    }
    svg.push_str("</svg><p class=\"legend\"><span class=\"key spent\"></span>spent <span class=\"key saved\"></span>saved by replay</p>");
    svg
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_chart_escapes_and_scales() {
        let chart = super::day_chart(&[
            ("2026-12-01".to_owned(), 100, 0),
            ("2026-12-02<x>".to_owned(), 50, 200),
        ]);
        assert!(
            chart.contains("2026-12-02&lt;x&gt;: 200 tokens saved"),
            "{chart}"
        );
        assert!(!chart.contains("<x>"));
        // The tallest bar reaches the top of the plot.
        assert!(chart.contains("height=\"136.0\""), "{chart}");
    }
}
