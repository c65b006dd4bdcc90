//! What `durun test` (SPEC 14) asks of a run, and nothing else does: kill
//! points (durun kills itself with SIGKILL at a chosen step and point; the
//! crash is real, only the moment is chosen), seeds (the reference's model
//! steps, answered as replays) and tool faults. A run without them pays
//! a check of an empty map or a `None`, no more.

use std::collections::{HashMap, VecDeque};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::transitions::Transition;
use crate::json_text::JsonText;
use rustix::process::Signal;

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
    /// The chosen step finished before its `during` kill came: the kill
    /// is off (it would land in another step).
    called_off: Arc<AtomicBool>,
}

impl Trial {
    /// What `spec` asks: nothing, outside `durun test`.
    pub(super) fn of(spec: &super::spec::RunSpec<'_>) -> Self {
        Self {
            crashes: Crashes::new(spec.crash_at),
            seeds: spec.seeds.clone().unwrap_or_default(),
            faults: spec.faults.clone(),
            called_off: Arc::default(),
        }
    }

    /// Kills durun where its kill point says, as the step transitions
    /// come.
    pub(super) fn observe(&mut self, transition: &Transition<'_>) {
        match self.crashes.observe(transition) {
            None => {}
            Some(Crash::Now) => die(),
            Some(Crash::After(delay)) => {
                let called_off = Arc::clone(&self.called_off);
                let _ = std::thread::Builder::new()
                    .name("crash".into())
                    .spawn(move || {
                        std::thread::sleep(delay);
                        if !called_off.load(Ordering::SeqCst) {
                            die();
                        }
                    });
            }
            Some(Crash::CallOff) => self.called_off.store(true, Ordering::SeqCst),
        }
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

/// What a kill point asks at a transition.
#[derive(Debug, PartialEq, Eq)]
enum Crash {
    /// SIGKILL durun now.
    Now,
    /// SIGKILL durun after this long, unless called off.
    After(Duration),
    /// The step the kill waits for finished first: no kill.
    CallOff,
}

/// Counts the run's steps as they start and return, and says when the
/// chosen one is reached. Pure: [`Trial::observe`] carries it out.
#[derive(Default)]
struct Crashes {
    at: Option<CrashAt>,
    started: u64,
    returned: u64,
}

impl Crashes {
    fn new(at: Option<CrashAt>) -> Self {
        Self {
            at,
            ..Self::default()
        }
    }

    fn observe(&mut self, transition: &Transition<'_>) -> Option<Crash> {
        let at = self.at?;
        match transition {
            Transition::Started => {
                self.started += 1;
                (self.started == at.step).then_some(())?;
                match at.point {
                    Point::Before => Some(Crash::Now),
                    Point::During => Some(Crash::After(at.delay)),
                    Point::After => None,
                }
            }
            Transition::Returned => {
                self.returned += 1;
                (self.returned == at.step).then_some(())?;
                match at.point {
                    Point::After => Some(Crash::Now),
                    Point::During => Some(Crash::CallOff),
                    Point::Before => None,
                }
            }
            Transition::Opened { .. }
            | Transition::Replayed { .. }
            | Transition::Finished { .. } => None,
        }
    }
}

fn die() -> ! {
    let _ = rustix::process::kill_process(rustix::process::getpid(), Signal::KILL);
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

    /// Feeds a run's transitions to a kill point and returns what it asked
    /// at each.
    fn walk(at: &str, transitions: &[Transition<'_>]) -> Vec<Option<Crash>> {
        let mut crashes = Crashes::new(Some(at.parse().expect("a kill point")));
        transitions
            .iter()
            .map(|transition| crashes.observe(transition))
            .collect()
    }

    #[test]
    fn a_kill_point_falls_at_its_steps_transition_and_only_there() {
        let opened = Transition::Opened {
            step: 1,
            name: "s",
            attempt: 1,
        };
        let replayed = Transition::Replayed { step: 1, name: "s" };
        let (started, returned) = (Transition::Started, Transition::Returned);
        // Steps opened or replayed are not counted; the second started is.
        assert_eq!(
            walk("2:before", &[replayed, opened, started, returned, started]),
            [None, None, None, None, Some(Crash::Now)]
        );
        assert_eq!(
            walk("1:during:250", &[opened, started, returned]),
            [
                None,
                Some(Crash::After(Duration::from_millis(250))),
                Some(Crash::CallOff)
            ]
        );
        assert_eq!(
            walk(
                "2:after",
                &[started, returned, started, started, returned, returned]
            ),
            [None, None, None, None, Some(Crash::Now), None]
        );
        let mut none = Crashes::new(None);
        assert_eq!(none.observe(&started), None);
    }
}
