//! Reads a protocol stream as bounded lines.
//!
//! A request is one JSON object on one line, so only a line whose first
//! non-blank byte is `{` can be one. On the agent's stdout
//! ([`LineReader::streaming`]) every other line is handed on piece by piece
//! as it arrives, never held whole.
//!
//! # Invariant
//!
//! Memory held for a line never exceeds [`MAX_LINE`], and every byte the
//! agent printed that is not a request reaches durun's stdout as it was,
//! whatever its length. A `{` line past [`MAX_LINE`] that names an `op` is
//! dropped and answered `bad_request` (its first bytes are kept to read
//! its `id`); one that does not is handed on like any print.

use std::io::{self, BufRead, BufReader, Read};

use serde_json::Value;

use crate::protocol::{MAX_LINE, names_an_op, sniff_id};

/// How much of an oversized line is kept to look for its `id`.
const HEAD: usize = 64 * 1024;

#[derive(Debug, PartialEq)]
pub(crate) enum Chunk {
    /// A whole line without its newline; `ended` is false only for the last
    /// bytes of the stream when no newline closed them.
    Line { bytes: Vec<u8>, ended: bool },
    /// Part of a line that is not a request, newline included where it
    /// ends: copied through as it comes.
    Text(Vec<u8>),
    /// A line over the limit that looks like a request: dropped, answered.
    Oversized { id: Value },
}

/// Where the reader is within the current line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Only blanks so far (kept in `line`).
    Start,
    /// A `{` line, held whole up to the limit.
    Json,
    /// A line that is not a request, handed on as it comes.
    Text,
    /// An oversized request: skipped up to its newline.
    Drop,
}

pub(crate) struct LineReader<R> {
    inner: R,
    limit: usize,
    /// Whether lines that cannot be requests are handed on in pieces.
    streaming: bool,
    /// The line read so far: a non-blocking reader may stop mid-line.
    line: Vec<u8>,
    mode: Mode,
}

impl<R: Read> LineReader<BufReader<R>> {
    /// Every line whole (up to the limit): the socket, where every line
    /// must be a request.
    pub(crate) fn new(inner: BufReader<R>) -> Self {
        Self::with_limit(inner, MAX_LINE, false)
    }

    /// The agent's stdout: lines that cannot be requests stream through.
    pub(crate) fn streaming(inner: BufReader<R>) -> Self {
        Self::with_limit(inner, MAX_LINE, true)
    }

    pub(crate) fn with_limit(inner: BufReader<R>, limit: usize, streaming: bool) -> Self {
        Self {
            inner,
            limit,
            streaming,
            line: Vec::new(),
            mode: Mode::Start,
        }
    }

    /// The source the lines come from.
    pub(crate) fn get_ref(&self) -> &R {
        self.inner.get_ref()
    }

    /// Bytes already read from the source and not yet returned.
    pub(crate) fn has_buffered(&self) -> bool {
        !self.inner.buffer().is_empty()
    }

    /// The next chunk, or `None` at the end of input. On a non-blocking
    /// source, `WouldBlock` keeps the part of a line read so far for the
    /// next call.
    pub(crate) fn next_line(&mut self) -> io::Result<Option<Chunk>> {
        loop {
            let buffer = match self.inner.fill_buf() {
                Ok(buffer) => buffer,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            if buffer.is_empty() {
                return Ok(self.end_of_input());
            }
            let newline = buffer.iter().position(|&b| b == b'\n');
            let (taken, done) = match newline {
                Some(at) => (at + 1, true),
                None => (buffer.len(), false),
            };
            match self.mode {
                Mode::Start => {
                    // Decide the line's kind at its first non-blank byte.
                    let blanks = buffer[..taken]
                        .iter()
                        .position(|&b| !matches!(b, b' ' | b'\t' | b'\r'))
                        .unwrap_or(taken);
                    if blanks == taken && !done {
                        self.line.extend_from_slice(&buffer[..taken]);
                        self.inner.consume(taken);
                        if self.line.len() > self.limit {
                            // Blanks only, and too many to hold.
                            self.mode = if self.streaming {
                                Mode::Text
                            } else {
                                Mode::Json
                            };
                        }
                        continue;
                    }
                    self.line.extend_from_slice(&buffer[..blanks]);
                    self.inner.consume(blanks);
                    let first = self.inner.buffer().first().copied();
                    self.mode = if first == Some(b'{') || !self.streaming {
                        Mode::Json
                    } else {
                        Mode::Text
                    };
                }
                Mode::Text => {
                    let mut piece = std::mem::take(&mut self.line);
                    piece.extend_from_slice(&buffer[..taken]);
                    self.inner.consume(taken);
                    if done {
                        self.mode = Mode::Start;
                    }
                    return Ok(Some(Chunk::Text(piece)));
                }
                Mode::Json => {
                    let content = &buffer[..if done { taken - 1 } else { taken }];
                    if self.line.len() + content.len() <= self.limit {
                        self.line.extend_from_slice(content);
                        self.inner.consume(taken);
                        if done {
                            self.mode = Mode::Start;
                            return Ok(Some(Chunk::Line {
                                bytes: std::mem::take(&mut self.line),
                                ended: true,
                            }));
                        }
                        continue;
                    }
                    // Past the limit: a request is refused, anything else
                    // is a print and goes on.
                    let room = self
                        .limit
                        .saturating_sub(self.line.len())
                        .min(content.len());
                    if self.streaming && !names_an_op(&self.line[..self.line.len().min(HEAD)]) {
                        let mut piece = std::mem::take(&mut self.line);
                        piece.extend_from_slice(&buffer[..room]);
                        self.inner.consume(room);
                        self.mode = Mode::Text;
                        return Ok(Some(Chunk::Text(piece)));
                    }
                    self.line.truncate(HEAD);
                    let keep = HEAD.saturating_sub(self.line.len()).min(content.len());
                    self.line.extend_from_slice(&content[..keep]);
                    self.mode = Mode::Drop;
                }
                Mode::Drop => {
                    self.inner.consume(taken);
                    if done {
                        self.mode = Mode::Start;
                        return Ok(Some(Chunk::Oversized {
                            id: sniff_id(&std::mem::take(&mut self.line)),
                        }));
                    }
                }
            }
        }
    }

    /// What is left when the input ends.
    fn end_of_input(&mut self) -> Option<Chunk> {
        let line = std::mem::take(&mut self.line);
        let mode = std::mem::replace(&mut self.mode, Mode::Start);
        match mode {
            Mode::Drop => Some(Chunk::Oversized {
                id: sniff_id(&line),
            }),
            _ if line.is_empty() => None,
            Mode::Text => Some(Chunk::Text(line)),
            Mode::Start | Mode::Json => Some(Chunk::Line {
                bytes: line,
                ended: false,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chunks(input: &[u8], limit: usize, streaming: bool) -> Vec<Chunk> {
        let mut reader =
            LineReader::with_limit(io::BufReader::with_capacity(4, input), limit, streaming);
        let mut out = Vec::new();
        while let Some(chunk) = reader.next_line().expect("in-memory read") {
            out.push(chunk);
        }
        out
    }

    fn line(text: &str) -> Chunk {
        Chunk::Line {
            bytes: text.as_bytes().to_vec(),
            ended: true,
        }
    }

    #[test]
    fn holds_requests_and_drops_oversized_ones() {
        let input = b"{\"id\": 7, \"op\":\"call\",\"x\":\"0123456789\"}\n{\"id\":\"s\",\"op\":\"a\",\"pad\":\"0123456789012345\"}\n{\"a\":1}\nlast";
        assert_eq!(
            chunks(input, 30, false),
            vec![
                Chunk::Oversized { id: json!(7) },
                Chunk::Oversized { id: json!("s") },
                line("{\"a\":1}"),
                Chunk::Line {
                    bytes: b"last".to_vec(),
                    ended: false
                },
            ]
        );
        assert_eq!(
            chunks(b"{\"op\":xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 30, false),
            vec![Chunk::Oversized { id: Value::Null }]
        );
        assert_eq!(chunks(b"", 30, false), vec![]);
        assert_eq!(chunks(b"\n\n", 30, false), vec![line(""), line("")]);
    }

    #[test]
    fn streams_what_cannot_be_a_request() {
        let text = |chunks: Vec<Chunk>| -> Vec<u8> {
            chunks
                .into_iter()
                .flat_map(|chunk| match chunk {
                    Chunk::Text(bytes) => bytes,
                    Chunk::Line { mut bytes, ended } => {
                        if ended {
                            bytes.push(b'\n');
                        }
                        bytes
                    }
                    Chunk::Oversized { .. } => b"<dropped>".to_vec(),
                })
                .collect()
        };
        let input = b"hello world, a long print\n  {\"a\": \"a JSON print longer than the limit\"}\n{\"op\":\"call\",\"id\":3,\"pad\":\"xxxxxxxxxxxxxxxxxxxx\"}\n  \n{\"x\":1}\nno newline";
        let out = chunks(input, 30, true);
        assert!(out.iter().any(|chunk| matches!(chunk, Chunk::Text(_))));
        assert!(out.contains(&Chunk::Oversized { id: json!(3) }));
        assert!(out.contains(&line("{\"x\":1}")));
        assert_eq!(
            String::from_utf8(text(out)).expect("utf-8"),
            "hello world, a long print\n  {\"a\": \"a JSON print longer than the limit\"}\n<dropped>  \n{\"x\":1}\nno newline"
        );
    }
}

#[cfg(test)]
mod properties {
    //! The line reader loses nothing, however its input is chunked.
    use proptest::prelude::*;

    proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

        /// Lines come out as they went in, however the input is chunked; an
        /// oversized one comes out as one refusal.
        #[test]
        fn the_line_reader_splits_like_split(
            lines in prop::collection::vec("[^\n]{0,40}", 0..12),
            capacity in 1usize..64,
        ) {
            use std::io::BufReader;
            use super::{Chunk, LineReader};
            let input: String = lines.iter().flat_map(|l| [l.as_str(), "\n"]).collect();
            let mut reader = LineReader::with_limit(BufReader::with_capacity(capacity, input.as_bytes()), 30, false);
            let mut got = Vec::new();
            while let Some(chunk) = reader.next_line().expect("in memory") {
                got.push(match chunk {
                    Chunk::Line { bytes, ended } => {
                        prop_assert!(ended);
                        Some(String::from_utf8(bytes).expect("utf-8 in, utf-8 out"))
                    }
                    Chunk::Oversized { .. } => None,
                    Chunk::Text(_) => panic!("only the agent's stdout streams"),
                });
            }
            let expected: Vec<Option<String>> = lines.iter().map(|l| (l.len() <= 30).then(|| l.clone())).collect();
            prop_assert_eq!(got, expected);
        }

        /// On a non-blocking source that runs dry anywhere (mid-line, inside an
        /// oversized line), a `WouldBlock` loses nothing: reading on gives the
        /// same lines as a blocking source.
        #[test]
        fn the_line_reader_resumes_after_would_block(
            lines in prop::collection::vec("[^\n]{0,40}", 0..12),
            capacity in 1usize..64,
            pieces in prop::collection::vec(1usize..20, 1..8),
        ) {
            use std::io::{BufReader, ErrorKind, Read};
            use super::{Chunk, LineReader};
            /// Gives a few bytes at a time and runs dry between them.
            struct Stutter<'a> {
                input: &'a [u8],
                pieces: Vec<usize>,
                turn: usize,
            }
            impl Read for Stutter<'_> {
                fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                    self.turn += 1;
                    if self.turn.is_multiple_of(2) && !self.input.is_empty() {
                        return Err(ErrorKind::WouldBlock.into());
                    }
                    let n = self.pieces[self.turn % self.pieces.len()]
                        .min(buf.len())
                        .min(self.input.len());
                    buf[..n].copy_from_slice(&self.input[..n]);
                    self.input = &self.input[n..];
                    Ok(n)
                }
            }
            let input: String = lines.iter().flat_map(|l| [l.as_str(), "\n"]).collect();
            let source = Stutter { input: input.as_bytes(), pieces, turn: 0 };
            let mut reader = LineReader::with_limit(BufReader::with_capacity(capacity, source), 30, false);
            let mut got = Vec::new();
            loop {
                match reader.next_line() {
                    Ok(Some(Chunk::Line { bytes, .. })) => got.push(Some(String::from_utf8(bytes).expect("utf-8 in, utf-8 out"))),
                    Ok(Some(Chunk::Oversized { .. })) => got.push(None),
                    Ok(Some(Chunk::Text(_))) => panic!("only the agent's stdout streams"),
                    Ok(None) => break,
                    Err(err) if err.kind() == ErrorKind::WouldBlock => {}
                    Err(err) => panic!("{err}"),
                }
            }
            let expected: Vec<Option<String>> = lines.iter().map(|l| (l.len() <= 30).then(|| l.clone())).collect();
            prop_assert_eq!(got, expected);
        }

        /// On the agent's stdout nothing is lost: whatever the lines and their
        /// chunking, the pieces handed on plus the lines held whole give back
        /// the input byte for byte (no line here names an `op`).
        #[test]
        fn the_streaming_reader_loses_no_byte(
            lines in prop::collection::vec(prop_oneof!["[^\n]{0,60}", "[ \t]{0,3}\\{[^\n]{0,60}"], 0..12),
            capacity in 1usize..64,
            last_newline in any::<bool>(),
        ) {
            use std::io::BufReader;
            use super::{Chunk, LineReader};
            let mut input: String = lines.iter().flat_map(|l| [l.as_str(), "\n"]).collect();
            if !last_newline {
                input.pop();
            }
            prop_assume!(!input.contains("\"op\""));
            let mut reader = LineReader::with_limit(BufReader::with_capacity(capacity, input.as_bytes()), 30, true);
            let mut out = Vec::new();
            while let Some(chunk) = reader.next_line().expect("in memory") {
                match chunk {
                    Chunk::Text(bytes) => out.extend(bytes),
                    Chunk::Line { bytes, ended } => {
                        prop_assert!(bytes.len() <= 30);
                        out.extend(bytes);
                        if ended {
                            out.push(b'\n');
                        }
                    }
                    Chunk::Oversized { .. } => prop_assert!(false, "no line names an op"),
                }
            }
            prop_assert_eq!(String::from_utf8(out).expect("utf-8"), input);
        }
    }
}
