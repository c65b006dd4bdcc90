//! The live text of a proxied model stream (SPEC 20), for the event
//! streams of `durun ui` and `inspect --follow --json`. While someone
//! watches a task, its runner copies each stream it proxies, as the bytes
//! come, to a file in the task's live directory; the watchers read the
//! text deltas from it. Nothing of this is journaled (the step's answer
//! is, once whole), and it is of one host: a watcher sees the streams of
//! the runners on its own.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};

use crate::journal::Location;
use crate::settings::Settings;

/// How long a watcher's word holds; a watcher says it again every
/// [`WATCH_EVERY`].
const WATCHED_FOR: Duration = Duration::from_secs(30);
/// How often a watcher says it still watches.
pub(crate) const WATCH_EVERY: Duration = Duration::from_secs(5);

/// Which stream of a run: a step's, or one of a model call not numbered
/// yet (a `read` call gets its number when its answer is written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stream {
    Step(u64),
    Call(u64),
}

impl Stream {
    /// As event ids and file names write it: `12` or `c3`.
    pub(crate) fn token(self) -> String {
        match self {
            Self::Step(step) => step.to_string(),
            Self::Call(flight) => format!("c{flight}"),
        }
    }

    pub(crate) fn parse(token: &str) -> Option<Self> {
        match token.strip_prefix('c') {
            Some(flight) => flight.parse().ok().map(Self::Call),
            None => token.parse().ok().map(Self::Step),
        }
    }

    /// The step's number, once it has one.
    pub(crate) fn step(self) -> Option<u64> {
        match self {
            Self::Step(step) => Some(step),
            Self::Call(_) => None,
        }
    }
}

/// A task's live directory: `$XDG_STATE_HOME/durun/live/KEY`, KEY made of
/// the journal's place and the task's id.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    dir: PathBuf,
}

impl Live {
    pub(crate) fn of(settings: &Settings, location: &Location, task: &str) -> Option<Self> {
        let place = match location {
            Location::Sqlite(path) => std::fs::canonicalize(path)
                .unwrap_or_else(|_| path.clone())
                .to_string_lossy()
                .into_owned(),
            Location::Postgres(url) => url.clone(),
        };
        let key = Sha256::digest(format!("durun live\0{place}\0{task}").as_bytes());
        let key = crate::step_key::hex(&key[..12]);
        Some(Self {
            dir: settings.state_home()?.join("durun").join("live").join(key),
        })
    }

    /// Says that someone watches the task, for the next [`WATCHED_FOR`].
    pub(crate) fn watch(&self) {
        use std::os::unix::fs::DirBuilderExt as _;
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir);
        if made.is_ok() {
            let _ = std::fs::write(self.dir.join("watch"), b"");
        }
    }

    fn watched(&self) -> bool {
        std::fs::metadata(self.dir.join("watch"))
            .and_then(|meta| meta.modified())
            .is_ok_and(|at| {
                SystemTime::now()
                    .duration_since(at)
                    .is_ok_and(|age| age < WATCHED_FOR)
            })
    }

    /// A file for run `run`'s `stream`, if someone watches the task: one
    /// look at the watch file per proxied stream.
    pub(crate) fn tap(&self, run: u32, stream: Stream) -> Option<Tap> {
        if !self.watched() {
            return None;
        }
        let path = self.dir.join(format!("{run}-{}.stream", stream.token()));
        let file = File::create(&path).ok()?;
        Some(Tap { file, path })
    }

    /// Removes the streams a killed runner left behind.
    pub(crate) fn clear(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".stream") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// The streams there now, as (run, stream, path).
    fn streams(&self) -> Vec<(u32, Stream, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let (run, stream) = name.strip_suffix(".stream")?.split_once('-')?;
                Some((run.parse().ok()?, Stream::parse(stream)?, entry.path()))
            })
            .collect()
    }
}

/// A stream's copy, removed when the stream ends.
#[derive(Debug)]
pub(crate) struct Tap {
    file: File,
    path: PathBuf,
}

impl Tap {
    /// Copies bytes of the stream; a failure costs the watchers their
    /// deltas, never the run anything.
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        let _ = self.file.write_all(bytes);
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One new piece of a stream's text.
pub(crate) struct Delta {
    pub(crate) run: u32,
    pub(crate) stream: Stream,
    /// The stream's bytes read so far: where a watcher goes on from.
    pub(crate) offset: u64,
    pub(crate) text: String,
}

/// What a watcher has read of each live stream: the bytes taken (whole
/// events only) and the length of their text.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    taken: BTreeMap<Stream, (u64, Option<usize>)>,
    /// The stream the last delta came from, and how far it was read.
    current: Option<(Stream, u64)>,
}

impl Deltas {
    /// A watcher that had read `stream` up to `offset`.
    pub(crate) fn from(stream: Stream, offset: u64) -> Self {
        Self {
            taken: [(stream, (offset, None))].into(),
            current: Some((stream, offset)),
        }
    }

    /// The stream a watcher is in the middle of, and how far it read it.
    pub(crate) fn current(&self) -> Option<(Stream, u64)> {
        self.current
    }

    /// Forgets a step's stream that ended: its text is in the journal now.
    pub(crate) fn ended(&mut self, step: u64) {
        let stream = Stream::Step(step);
        self.taken.insert(stream, (u64::MAX, None));
        if self.current.is_some_and(|(current, _)| current == stream) {
            self.current = None;
        }
    }

    /// The text each live stream got since the last look, but of the
    /// streams that ended.
    pub(crate) fn poll(&mut self, live: &Live) -> Vec<Delta> {
        let mut deltas = Vec::new();
        let streams = live.streams();
        // A stream whose file is gone has ended.
        self.taken
            .retain(|stream, _| streams.iter().any(|(_, there, _)| there == stream));
        if self
            .current
            .is_some_and(|(current, _)| !self.taken.contains_key(&current))
        {
            self.current = None;
        }
        for (run, stream, path) in streams {
            let (offset, sent) = self.taken.get(&stream).copied().unwrap_or((0, Some(0)));
            if offset == u64::MAX {
                continue;
            }
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            // Whole events only: a part of one waits for the next look.
            let Some(end) = bytes.windows(2).rposition(|pair| pair == b"\n\n") else {
                continue;
            };
            let end = end + 2;
            if end as u64 <= offset {
                continue;
            }
            let sent = sent.unwrap_or_else(|| {
                let before = bytes
                    .len()
                    .min(usize::try_from(offset).unwrap_or(usize::MAX));
                crate::sse::stream_text(&bytes[..before]).map_or(0, |text| text.len())
            });
            let text = crate::sse::stream_text(&bytes[..end]).unwrap_or_default();
            self.taken
                .insert(stream, (end as u64, Some(text.len().max(sent))));
            if let Some(new) = text.get(sent..).filter(|new| !new.is_empty()) {
                self.current = Some((stream, end as u64));
                deltas.push(Delta {
                    run,
                    stream,
                    offset: end as u64,
                    text: new.to_owned(),
                });
            }
        }
        deltas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(data: &str) -> String {
        format!(
            "data: {}\n\n",
            serde_json::json!({"choices": [{"delta": {"content": data}}]})
        )
    }

    /// Whole events only, each piece of text once; a watcher back from an
    /// offset gets what came after it.
    #[test]
    fn deltas_are_the_new_text_of_whole_events() {
        let dir = tempfile::tempdir().expect("dir");
        let live = Live {
            dir: dir.path().to_owned(),
        };
        let path = dir.path().join("2-c7.stream");
        let first = delta("Hello");
        std::fs::write(&path, format!("{first}data: {{\"cho")).expect("write");
        let mut deltas = Deltas::default();
        let got = deltas.poll(&live);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].run, got[0].stream), (2, Stream::Call(7)));
        assert_eq!(got[0].text, "Hello");
        assert_eq!(got[0].offset, first.len() as u64);
        assert!(deltas.poll(&live).is_empty(), "half an event waits");
        std::fs::write(&path, format!("{first}{}", delta(", world"))).expect("write");
        assert_eq!(deltas.poll(&live)[0].text, ", world");
        let mut back = Deltas::from(Stream::Call(7), first.len() as u64);
        let got = back.poll(&live);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].text, ", world");
        back.ended(7);
        std::fs::remove_file(&path).expect("remove");
        assert!(back.poll(&live).is_empty());
        assert_eq!(back.current(), None);
    }
}
