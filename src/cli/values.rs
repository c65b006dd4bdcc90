//! What arguments parse into (JSON from text or a file, durations, times)
//! and what they complete to.

/// A JSON argument: the JSON itself, `@FILE` (the file's JSON) or `@-`
/// (standard input's). Linux caps one argument at 128 KiB, a file has no
/// such limit.
pub(crate) fn json_arg(text: &str) -> Result<serde_json::Value, String> {
    let (source, what) = match text.strip_prefix('@') {
        Some("-") => {
            let mut input = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)
                .map_err(|err| format!("cannot read standard input: {err}"))?;
            (input, "standard input".to_owned())
        }
        Some(file) => (
            std::fs::read_to_string(file).map_err(|err| format!("cannot read {file}: {err}"))?,
            file.to_owned(),
        ),
        None => {
            return serde_json::from_str(text).map_err(|err| {
                format!(
                    "not JSON: {err}; quote it for the shell, like '{{\"key\": \"value\"}}' or '\"text\"', or give @FILE"
                )
            });
        }
    };
    serde_json::from_str(&source).map_err(|err| format!("{what} does not hold JSON: {err}"))
}

/// A sleep's length: a duration within what durun takes (SPEC 8).
pub(super) fn sleep_duration(text: &str) -> Result<std::time::Duration, String> {
    let too_far = || {
        format!(
            "{text} is too far: a sleep is at most {:e} seconds (about 3,000 years); --until takes a date",
            crate::protocol::MAX_SLEEP_SECONDS
        )
    };
    match humantime::parse_duration(text) {
        Ok(duration) if duration.as_secs_f64() < crate::protocol::MAX_SLEEP_SECONDS => Ok(duration),
        Ok(_) | Err(humantime::DurationError::NumberOverflow) => Err(too_far()),
        Err(err) => Err(format!("{err}; a duration like 90s, 2h or 1d")),
    }
}

/// A time a user typed, checked and kept as typed.
pub(super) fn time_text(text: &str) -> Result<String, String> {
    match crate::clock::parse(text) {
        Some(_) => Ok(text.to_owned()),
        None => Err("expected an RFC 3339 time in UTC like 2026-12-01T09:00:00Z".to_owned()),
    }
}

/// Completes a task argument to the ids in the journal.
pub(super) fn task_ids() -> clap_complete::ArgValueCompleter {
    clap_complete::ArgValueCompleter::new(crate::completion::task_ids)
}

/// Completes a task argument to the tasks that are not finished.
pub(super) fn unfinished_task_ids() -> clap_complete::ArgValueCompleter {
    clap_complete::ArgValueCompleter::new(crate::completion::unfinished_task_ids)
}

/// Completes a step number to the steps of the task on the command line.
pub(super) fn step_numbers() -> clap_complete::ArgValueCompleter {
    clap_complete::ArgValueCompleter::new(crate::completion::step_numbers)
}

/// How a faulty upstream answers (`--fault KIND@STEP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum FaultKind {
    /// 429 Too Many Requests, with a retry-after of 10 ms.
    #[value(name = "http-429")]
    Http429,
    /// 500 Internal Server Error.
    #[value(name = "http-500")]
    Http500,
    /// No answer until the client gives up (or the trial's time is up).
    Timeout,
    /// The connection closed without an answer.
    Reset,
    /// The answer's head and half its body, then the connection closed.
    Truncate,
}
