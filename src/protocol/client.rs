//! The protocol from the agent's side, typed: what `durun step`, `durun
//! call`, `durun wait` and `durun sleep` send over `DURUN_SOCKET` and what
//! they read back.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ErrorCode;

/// A request, without its `id` (the client numbers them).
#[derive(Serialize, Debug)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(crate) enum Outgoing<'a> {
    Begin {
        name: &'a str,
        args: &'a Value,
        effect: &'a str,
        /// `Some("mcp")`: replayed by content (`durun mcp`).
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<&'a str>,
    },
    Commit {
        step: u64,
        output: &'a Value,
        usage: &'a Value,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        reconciled: bool,
    },
    Fail {
        step: u64,
        error: &'a str,
        output: &'a Value,
    },
    Call {
        tool: &'a str,
        args: &'a Value,
    },
    Wait {
        name: &'a str,
        data: &'a Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout: Option<String>,
    },
    Find {
        idempotency_key: &'a str,
    },
    Sleep {
        #[serde(skip_serializing_if = "Option::is_none")]
        seconds: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        until: Option<&'a str>,
    },
}

/// A request on the wire: its `id` and the request.
#[derive(Serialize)]
pub(crate) struct Envelope<'a> {
    pub(crate) id: u64,
    #[serde(flatten)]
    pub(crate) request: &'a Outgoing<'a>,
}

/// One connection to the running durun, one request at a time.
pub(crate) struct Connection {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
}

impl Connection {
    pub(crate) fn connect(path: &Path) -> Result<Self> {
        let stream = UnixStream::connect(path)?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            next_id: 0,
        })
    }

    pub(crate) fn request(&mut self, request: &Outgoing<'_>) -> Result<Answer> {
        self.next_id += 1;
        let mut line = serde_json::to_vec(&Envelope {
            id: self.next_id,
            request,
        })?;
        line.push(b'\n');
        self.writer
            .write_all(&line)
            .context("failed to send the request to durun")?;
        let mut answer = String::new();
        self.reader
            .read_line(&mut answer)
            .context("failed to read durun's answer")?;
        if answer.is_empty() {
            return Err(crate::error::Failure::new(
                crate::error::Kind::Internal,
                "durun closed the socket without answering",
            )
            .hint("the run may be stopping; see its output")
            .into());
        }
        serde_json::from_str(&answer).context("durun's answer is not JSON")
    }
}

/// durun's answer, as the agent reads it.
#[derive(Deserialize, Debug, Default)]
pub(crate) struct Answer {
    pub(crate) ok: bool,
    #[serde(default)]
    pub(crate) step: Option<u64>,
    #[serde(default)]
    pub(crate) replayed: bool,
    #[serde(default)]
    pub(crate) attempt: Option<u32>,
    #[serde(default)]
    pub(crate) idempotency_key: Option<String>,
    /// A step a run died inside: it may have taken effect.
    #[serde(default)]
    pub(crate) in_doubt: bool,
    #[serde(default)]
    pub(crate) output: Value,
    #[serde(default)]
    pub(crate) error: Option<AnswerError>,
    /// A `find`'s answer.
    #[serde(default)]
    pub(crate) found: Option<FoundStep>,
}

/// The MCP step a `find` found.
#[derive(Deserialize, Debug)]
pub(crate) struct FoundStep {
    /// `running`, `finished` or `reopened`.
    pub(crate) state: String,
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) args: Value,
}

#[derive(Deserialize, Debug)]
pub(crate) struct AnswerError {
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
}

impl Answer {
    /// The error's code, if durun named one it knows.
    pub(crate) fn code(&self) -> Option<ErrorCode> {
        self.error
            .as_ref()
            .and_then(|error| ErrorCode::parse(&error.code))
    }

    /// `code: message`, for a `durun:` line.
    pub(crate) fn error_text(&self) -> String {
        match &self.error {
            Some(error) => format!("{}: {}", error.code, error.message),
            None => "error: no message".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_are_written_as_the_protocol_reads_them() {
        let args = json!({"argv": ["true"]});
        let begin = Outgoing::Begin {
            name: "s",
            args: &args,
            effect: "read",
            kind: None,
        };
        let line = serde_json::to_value(Envelope {
            id: 7,
            request: &begin,
        })
        .unwrap();
        assert_eq!(
            line,
            json!({"op": "begin", "id": 7, "name": "s", "args": {"argv": ["true"]}, "effect": "read"})
        );
        let sleep = Outgoing::Sleep {
            seconds: Some(1.5),
            until: None,
        };
        assert_eq!(
            serde_json::to_value(Envelope {
                id: 1,
                request: &sleep
            })
            .unwrap(),
            json!({"op": "sleep", "id": 1, "seconds": 1.5})
        );
        let answer: Answer = serde_json::from_str(
            r#"{"id":1,"ok":false,"step":3,"error":{"code":"divergence","message":"m"}}"#,
        )
        .unwrap();
        assert_eq!(answer.code(), Some(ErrorCode::Divergence));
        assert_eq!(answer.error_text(), "divergence: m");
    }
}
