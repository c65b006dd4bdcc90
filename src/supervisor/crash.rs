//! What `durun test` (SPEC 14) asks of a run, and nothing else does: kill
//! points (durun kills itself with SIGKILL at a chosen step and point; the
//! crash is real, only the moment is chosen), seeds (the reference's model
//! steps, answered as replays) and tool faults. A run without them pays
//! a check of an empty map or a `None`, no more.

use std::collections::{HashMap, VecDeque};
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;

use crate::json_text::JsonText;

/// The model steps of `durun test`'s reference run (steps that reported
/// token usage), by name and args hash: in a trial, a new step that asks
/// the same is answered with the reference's output, as if replayed, and
/// spends no tokens.
pub(crate) type Seeds = HashMap<(String, String), VecDeque<(JsonText, Value)>>;

/// Where `durun test` hands a trial its seeds: a JSON file of
/// `[{"name", "args_hash", "output", "usage"}]`.
pub(crate) const SEEDS: &str = "DURUN_TEST_MODELS";

/// Tool calls `durun test` makes fail (`--fault KIND@STEP` at a step
/// that runs a tool), by name and args hash: the first call of each in a
/// run fails with the fault's kind, without the tool.
pub(crate) type Faults = HashMap<(String, String), String>;

/// Where `durun test` hands a trial its tool faults: JSON, `[{"name",
/// "args_hash", "kind"}]`.
pub(crate) const FAULTS: &str = "DURUN_TEST_FAULTS";

/// The tool faults in `text`.
pub(crate) fn parse_faults(text: &str) -> anyhow::Result<Faults> {
    let listed: Vec<Value> = serde_json::from_str(text)?;
    Ok(listed
        .iter()
        .map(|fault| {
            (
                (
                    fault["name"].as_str().unwrap_or_default().to_owned(),
                    fault["args_hash"].as_str().unwrap_or_default().to_owned(),
                ),
                fault["kind"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

/// The seeds in `path`.
pub(crate) fn load_seeds(path: &std::path::Path) -> anyhow::Result<Seeds> {
    let text = std::fs::read_to_string(path)?;
    let listed: Vec<Value> = serde_json::from_str(&text)?;
    let mut seeds = Seeds::new();
    for step in listed {
        let at = (
            step["name"].as_str().unwrap_or_default().to_owned(),
            step["args_hash"].as_str().unwrap_or_default().to_owned(),
        );
        seeds
            .entry(at)
            .or_default()
            .push_back((JsonText::from_value(&step["output"]), step["usage"].clone()));
    }
    Ok(seeds)
}

/// Where in a step durun is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub(crate) enum Point {
    /// Right after the step was let start (its intent durable, for
    /// `mutate`), before the step's work.
    Before,
    /// While the step runs: halfway through the time it took in the
    /// reference run.
    During,
    /// Right after the step's result reached durun, before it is durable.
    After,
}

impl Point {
    pub(crate) const ALL: [Point; 3] = [Point::Before, Point::During, Point::After];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Point::Before => "before",
            Point::During => "during",
            Point::After => "after",
        }
    }
}

/// `STEP:POINT[:DELAY_MS]`: the step counts the steps this run started
/// (and, for `after`, finished), in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CrashAt {
    pub(crate) step: u64,
    pub(crate) point: Point,
    /// For `during`: how long after the step started.
    pub(crate) delay: Duration,
}

impl FromStr for CrashAt {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut parts = text.split(':');
        let step = parts
            .next()
            .and_then(|step| step.parse().ok())
            .ok_or("expected STEP:POINT[:DELAY_MS]")?;
        let point = match parts.next() {
            Some("before") => Point::Before,
            Some("during") => Point::During,
            Some("after") => Point::After,
            _ => return Err("the point is before, during or after".into()),
        };
        let delay = match parts.next() {
            Some(ms) => Duration::from_millis(ms.parse().map_err(|_| "DELAY_MS is a number")?),
            None => Duration::ZERO,
        };
        Ok(Self { step, point, delay })
    }
}

/// What `durun test` asks of this run: its kill point, its answers to
/// model steps and its tool faults; empty in every other run.
pub(super) struct Trial {
    crashes: Crashes,
    /// The reference's answers to model steps, taken as they are used.
    seeds: Seeds,
    /// Tool faults, each taken by its first call.
    faults: Faults,
}

impl Trial {
    /// What `spec` asks: nothing, outside `durun test`.
    pub(super) fn of(spec: &super::spec::RunSpec<'_>) -> Self {
        Self {
            crashes: Crashes::new(spec.crash_at),
            seeds: spec.seeds.clone().unwrap_or_default(),
            faults: spec.faults.clone(),
        }
    }

    /// A new step is let start (its intent durable, for `mutate`).
    pub(super) fn started(&mut self) {
        self.crashes.started();
    }

    /// A step's result reached durun; it is not written yet.
    pub(super) fn finished(&mut self) {
        self.crashes.finished();
    }

    /// The reference's next answer to a new model step with this name and
    /// args. Nothing is looked up (or allocated) in a run without seeds.
    pub(super) fn seed(&mut self, name: &str, args_hash: &str) -> Option<(JsonText, Value)> {
        if self.seeds.is_empty() {
            return None;
        }
        self.seeds
            .get_mut(&(name.to_owned(), args_hash.to_owned()))
            .and_then(VecDeque::pop_front)
    }

    /// The fault to make of a `call` with this name and args, the first
    /// time only. Nothing is looked up in a run without faults.
    pub(super) fn fault(&mut self, name: &str, args_hash: &str) -> Option<String> {
        if self.faults.is_empty() {
            return None;
        }
        self.faults.remove(&(name.to_owned(), args_hash.to_owned()))
    }
}

/// Counts the run's steps as they start and finish, and kills durun at
/// the chosen one.
#[derive(Default)]
struct Crashes {
    at: Option<CrashAt>,
    started: u64,
    finished: u64,
    /// The chosen step finished before its `during` kill came: the kill
    /// is off (it would land in another step).
    too_late: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Crashes {
    fn new(at: Option<CrashAt>) -> Self {
        Self {
            at,
            ..Self::default()
        }
    }

    /// A new step is let start.
    fn started(&mut self) {
        let Some(at) = self.at else { return };
        self.started += 1;
        if self.started != at.step {
            return;
        }
        match at.point {
            Point::Before => die(),
            Point::During => {
                let too_late = std::sync::Arc::clone(&self.too_late);
                let _ = std::thread::Builder::new()
                    .name("crash".into())
                    .spawn(move || {
                        std::thread::sleep(at.delay);
                        if !too_late.load(std::sync::atomic::Ordering::SeqCst) {
                            die();
                        }
                    });
            }
            Point::After => {}
        }
    }

    /// A step's result reached durun; it is not written yet.
    fn finished(&mut self) {
        let Some(at) = self.at else { return };
        self.finished += 1;
        if self.finished == at.step {
            match at.point {
                Point::After => die(),
                Point::During => self
                    .too_late
                    .store(true, std::sync::atomic::Ordering::SeqCst),
                Point::Before => {}
            }
        }
    }
}

fn die() -> ! {
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_point_is_read_from_its_text() {
        assert_eq!(
            "3:during:250".parse(),
            Ok(CrashAt {
                step: 3,
                point: Point::During,
                delay: Duration::from_millis(250)
            })
        );
        assert_eq!(
            "1:after".parse::<CrashAt>().map(|at| at.point),
            Ok(Point::After)
        );
        assert!("x:before".parse::<CrashAt>().is_err());
        assert!("2:sometime".parse::<CrashAt>().is_err());
    }
}
