//! A task's events (SPEC 20): its runs and steps in the order the journal
//! wrote them, each with an id that a client hands back to go on right
//! after it (`Last-Event-ID`). The ids are the journal's, so they hold
//! across the task's runs and across restarts of `durun ui`; `inspect
//! --follow --json` prints the very same events.

use std::fmt::Write as _;

use anyhow::Result;
use serde_json::{Map, Value, json};

use super::live::{Deltas, Live, Stream};
use crate::journal::{EventRow, Journal};

/// Where a client stands in a task's events: after row `row`, or after
/// the `part`th step of that row when it is a run's replayed steps; and,
/// after a live text delta, how far it read that step's stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    row: i64,
    part: Option<u64>,
    /// (stream, bytes of it read): `ROW+STREAM@OFFSET`.
    delta: Option<(Stream, u64)>,
}

impl Cursor {
    /// The cursor an event id leaves a client at; `None` for an id this
    /// durun never gave.
    pub(crate) fn after(id: &str) -> Option<Self> {
        let (journal, delta) = match id.split_once('+') {
            Some((journal, delta)) => {
                let (stream, offset) = delta.split_once('@')?;
                (
                    journal,
                    Some((Stream::parse(stream)?, offset.parse().ok()?)),
                )
            }
            None => (id, None),
        };
        let (row, part) = match journal.split_once('.') {
            Some((row, part)) => (row, Some(part.parse().ok()?)),
            None => (journal, None),
        };
        Some(Self {
            row: row.parse().ok().filter(|row| *row >= 0)?,
            part,
            delta,
        })
    }

    fn id(self) -> String {
        let mut id = match self.part {
            Some(part) => format!("{}.{part}", self.row),
            None => self.row.to_string(),
        };
        if let Some((stream, offset)) = self.delta {
            let _ = write!(id, "+{}@{offset}", stream.token());
        }
        id
    }
}

/// One event: its id and what it says (`event`, `task`, `run`, ...).
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) data: Value,
}

impl Event {
    /// The event as one server-sent event.
    pub(crate) fn sse(&self) -> String {
        format!(
            "id: {}\nevent: {}\ndata: {}\n\n",
            self.id, self.kind, self.data
        )
    }
}

/// The task's events after `cursor`, at most about `limit` rows' worth,
/// and the cursor after the last of them.
pub(crate) fn after(
    journal: &mut dyn Journal,
    task: &str,
    cursor: Cursor,
    limit: u64,
) -> Result<(Vec<Event>, Cursor)> {
    let from = if cursor.part.is_some() {
        cursor.row
    } else {
        cursor.row + 1
    };
    let mut events = Vec::new();
    let mut at = Cursor {
        delta: None,
        ..cursor
    };
    for row in journal.events(task, from, limit)? {
        if row.kind == "step.replayed" {
            let (Some(first), Some(last)) = (row.step, row.last_step) else {
                continue;
            };
            let start = match cursor.part {
                Some(part) if row.id == cursor.row => part + 1,
                _ => first,
            };
            if start <= last {
                let steps = journal.replayable_steps(task, row.run, last - start + 1, start - 1)?;
                for (ordinal, (step, name)) in (start..).zip(steps) {
                    at = Cursor {
                        row: row.id,
                        part: Some(ordinal),
                        delta: None,
                    };
                    events.push(event(task, &row, at, Some(step), Some(&name)));
                }
            }
            at = Cursor {
                row: row.id,
                part: Some(last),
                delta: None,
            };
        } else {
            at = Cursor {
                row: row.id,
                part: None,
                delta: None,
            };
            events.push(event(task, &row, at, row.step, row.name.as_deref()));
        }
    }
    Ok((events, at))
}

/// A watcher of a task's events: the journal's, and the live text of
/// the streams its runner proxies while a run is live.
pub(crate) struct Follower {
    task: String,
    cursor: Cursor,
    live: Option<Live>,
    deltas: Deltas,
    /// A run is live: its last event was `run.opened`.
    running: bool,
    watched_at: Option<std::time::Instant>,
}

impl Follower {
    /// A watcher from right after `cursor`; `running`: the task has a live
    /// run now.
    pub(crate) fn new(task: &str, cursor: Cursor, live: Option<Live>, running: bool) -> Self {
        let deltas = match cursor.delta {
            Some((stream, offset)) => Deltas::from(stream, offset),
            None => Deltas::default(),
        };
        Self {
            task: task.to_owned(),
            cursor,
            live,
            deltas,
            running,
            watched_at: None,
        }
    }

    /// The events since the last call (at most about `limit` journal
    /// rows of them): the live streams' new text first, then the journal's.
    pub(crate) fn next(&mut self, journal: &mut dyn Journal, limit: u64) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        if let Some(live) = &self.live {
            if self
                .watched_at
                .is_none_or(|at| at.elapsed() >= super::live::WATCH_EVERY)
            {
                live.watch();
                self.watched_at = Some(std::time::Instant::now());
            }
            if self.running {
                for delta in self.deltas.poll(live) {
                    self.cursor.delta = Some((delta.stream, delta.offset));
                    let id = self.cursor.id();
                    let mut data = json!({
                        "id": id,
                        "event": "step.delta",
                        "task": self.task,
                        "run": delta.run,
                    });
                    // A `read` call is numbered when its answer is written.
                    if let Some(step) = delta.stream.step() {
                        data["step"] = json!(step);
                    }
                    data["text"] = json!(delta.text);
                    out.push(Event {
                        data,
                        id,
                        kind: "step.delta".into(),
                    });
                }
            }
        }
        let from = Cursor {
            delta: None,
            ..self.cursor
        };
        let (mut events, next) = after(journal, &self.task, from, limit)?;
        for event in &mut events {
            match event.kind.as_str() {
                "run.opened" => self.running = true,
                "step.finished" | "step.failed" => {
                    if let Some(step) = event.data["step"].as_u64() {
                        self.deltas.ended(step);
                    }
                }
                kind if kind.starts_with("run.") => {
                    self.running = false;
                    self.deltas = Deltas::default();
                }
                _ => {}
            }
            // Its id says how far the stream still going was read, so
            // that a client back from it gets no text twice.
            if let Some((stream, offset)) = self.deltas.current() {
                event.id = format!("{}+{}@{offset}", event.id, stream.token());
                event.data["id"] = json!(event.id);
            }
        }
        self.cursor = Cursor {
            delta: self.deltas.current(),
            ..next
        };
        out.extend(events);
        Ok(out)
    }
}

fn event(task: &str, row: &EventRow, at: Cursor, step: Option<u64>, name: Option<&str>) -> Event {
    let id = at.id();
    let mut data = Map::new();
    data.insert("id".into(), json!(id));
    data.insert("event".into(), json!(row.kind));
    data.insert("task".into(), json!(task));
    data.insert("run".into(), json!(row.run));
    if let Some(step) = step {
        data.insert("step".into(), json!(step));
    }
    if let Some(name) = name {
        data.insert("name".into(), json!(name));
    }
    if row.kind == "step.finished"
        && let Some(tokens) = row.tokens.filter(|tokens| *tokens > 0)
    {
        data.insert("tokens".into(), json!(tokens));
    }
    data.insert("at".into(), json!(row.at));
    Event {
        id,
        kind: row.kind.clone(),
        data: Value::Object(data),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An id names the cursor right after its event; ids durun never
    /// gives are refused rather than read as the start.
    #[test]
    fn ids_read_back_as_cursors() {
        for id in ["0", "17", "17.3", "17+4@120", "17.3+4@0", "17+c2@9"] {
            assert_eq!(Cursor::after(id).map(Cursor::id).as_deref(), Some(id));
        }
        for bad in [
            "", "x", "-1", "1.x", "1.2.3", "1+2", "1+x@3", "+1@2", "1+c@2",
        ] {
            assert_eq!(Cursor::after(bad), None, "{bad}");
        }
    }
}
