//! Reads the agent's stdout as bounded lines.
//!
//! A line longer than [`MAX_LINE`] is never held whole: durun keeps its
//! first bytes (to read its `id`), drops the rest up to the newline, and
//! answers it `bad_request`.

use std::io::{self, BufRead, BufReader, Read};

use serde_json::Value;

use crate::protocol::MAX_LINE;

/// How much of an oversized line is kept to look for its `id`.
const HEAD: usize = 64 * 1024;

pub enum Chunk {
    Line(Vec<u8>),
    Oversized { id: Value },
}

pub struct LineReader<R> {
    inner: R,
    limit: usize,
    /// The line read so far: a non-blocking reader may stop mid-line.
    line: Vec<u8>,
    oversized: bool,
}

impl<R: Read> LineReader<BufReader<R>> {
    pub fn new(inner: BufReader<R>) -> Self {
        Self {
            inner,
            limit: MAX_LINE,
            line: Vec::new(),
            oversized: false,
        }
    }

    #[cfg(test)]
    pub(crate) fn with_limit(inner: BufReader<R>, limit: usize) -> Self {
        Self {
            inner,
            limit,
            line: Vec::new(),
            oversized: false,
        }
    }

    /// The source the lines come from.
    pub fn get_ref(&self) -> &R {
        self.inner.get_ref()
    }

    /// Bytes already read from the source and not yet returned as lines.
    pub fn has_buffered(&self) -> bool {
        !self.inner.buffer().is_empty()
    }

    /// The next line without its `\n`, or `None` at the end of input. On a
    /// non-blocking source, `WouldBlock` keeps the part of a line read so
    /// far for the next call.
    pub fn next_line(&mut self) -> io::Result<Option<Chunk>> {
        loop {
            let line = &mut self.line;
            let buffer = match self.inner.fill_buf() {
                Ok(buffer) => buffer,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            if buffer.is_empty() {
                let line = std::mem::take(line);
                let oversized = std::mem::take(&mut self.oversized);
                return Ok(match (line.is_empty(), oversized) {
                    (true, false) => None,
                    (_, true) => Some(Chunk::Oversized {
                        id: sniff_id(&line),
                    }),
                    (false, false) => Some(Chunk::Line(line)),
                });
            }
            let (taken, done) = match memchr(buffer) {
                Some(at) => (at + 1, true),
                None => (buffer.len(), false),
            };
            let content = &buffer[..if done { taken - 1 } else { taken }];
            if !self.oversized {
                if line.len() + content.len() > self.limit {
                    self.oversized = true;
                    let room = HEAD.saturating_sub(line.len());
                    line.extend_from_slice(&content[..room.min(content.len())]);
                } else {
                    line.extend_from_slice(content);
                }
            }
            self.inner.consume(taken);
            if done {
                let line = std::mem::take(line);
                return Ok(Some(if std::mem::take(&mut self.oversized) {
                    Chunk::Oversized {
                        id: sniff_id(&line),
                    }
                } else {
                    Chunk::Line(line)
                }));
            }
        }
    }
}

fn memchr(buffer: &[u8]) -> Option<usize> {
    buffer.iter().position(|&b| b == b'\n')
}

/// The `id` of a request from the first bytes of its line, where it can be
/// read: a string or an integer after `"id":`.
fn sniff_id(head: &[u8]) -> Value {
    let Some(at) = head.windows(4).position(|w| w == b"\"id\"") else {
        return Value::Null;
    };
    let rest = &head[at + 4..];
    let rest = rest.trim_ascii_start();
    let Some(rest) = rest.strip_prefix(b":") else {
        return Value::Null;
    };
    let mut values =
        serde_json::Deserializer::from_slice(rest.trim_ascii_start()).into_iter::<Value>();
    match values.next() {
        Some(Ok(id @ Value::String(_))) => id,
        Some(Ok(Value::Number(n))) if !n.to_string().contains(['.', 'e', 'E']) => Value::Number(n),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(input: &[u8], limit: usize) -> Vec<Result<Vec<u8>, Value>> {
        let mut reader = LineReader::with_limit(io::BufReader::with_capacity(4, input), limit);
        let mut out = Vec::new();
        while let Some(chunk) = reader.next_line().expect("in-memory read") {
            out.push(match chunk {
                Chunk::Line(line) => Ok(line),
                Chunk::Oversized { id } => Err(id),
            });
        }
        out
    }

    #[test]
    fn splits_lines_and_drops_oversized_ones() {
        let input = b"a\n{\"id\": 7, \"op\":\"call\",\"x\":\"0123456789\"}\n{\"id\":\"s\",\"pad\":\"0123456789012345\"}\nlast";
        assert_eq!(
            lines(input, 30),
            vec![
                Ok(b"a".to_vec()),
                Err(json!(7)),
                Err(json!("s")),
                Ok(b"last".to_vec())
            ]
        );
        assert_eq!(
            lines(b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 30),
            vec![Err(Value::Null)]
        );
        assert_eq!(lines(b"", 30), Vec::<Result<Vec<u8>, Value>>::new());
        assert_eq!(lines(b"\n\n", 30), vec![Ok(vec![]), Ok(vec![])]);
    }
}
