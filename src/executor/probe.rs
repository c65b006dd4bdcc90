//! A probe (SPEC 22): asks a tool's destination whether a step left in
//! doubt took effect, before the step runs again. Its answer settles the
//! step only when it is plain: 2xx (exit 0) with a body is "it took effect,
//! this is what it returned"; 404 (exit 1) is "it did not"; anything else
//! leaves the step in doubt.

use serde_json::Value;

use super::{Cancel, Invocation, Outcome};

/// What a probe said of a step in doubt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Probed {
    /// It took effect: its output, as the destination has it.
    Applied(Value),
    /// It did not: the step runs again, with its key.
    NotApplied,
    /// The probe could not tell (why, for the user).
    Unknown(String),
}

/// Runs `invocation`, whose tool is a probe ([`crate::config::Tool::probe_tool`]).
pub(crate) fn run(invocation: &Invocation, cancel: &Cancel) -> Probed {
    verdict(super::run(invocation, cancel).outcome)
}

/// What a probe's outcome says.
fn verdict(outcome: Outcome) -> Probed {
    match outcome {
        Outcome::Done { output, .. } => {
            let body = match output {
                Value::String(text) => text,
                other => other.to_string(),
            };
            if body.trim().is_empty() {
                return Probed::Unknown("the probe answered without a body".to_owned());
            }
            Probed::Applied(serde_json::from_str(&body).unwrap_or(Value::String(body)))
        }
        Outcome::Failed {
            output: Some(output),
            message,
            ..
        } => {
            if output["status"] == 404 || output["exit_code"] == 1 {
                Probed::NotApplied
            } else {
                Probed::Unknown(message)
            }
        }
        Outcome::Failed { message, .. } => Probed::Unknown(message),
        Outcome::Cancelled => Probed::Unknown("the probe was stopped".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::ErrorCode;

    fn failed(output: Value) -> Outcome {
        Outcome::Failed {
            code: ErrorCode::ToolFailed,
            message: "it failed".to_owned(),
            output: Some(output),
            retryable: false,
            retry_after: None,
        }
    }

    /// 2xx or exit 0 with a body took effect; 404 or exit 1 did not;
    /// everything else cannot tell.
    #[test]
    fn only_a_plain_answer_settles_a_step() {
        let done = |text: &str| Outcome::Done {
            output: json!(text),
            usage: None,
        };
        assert_eq!(
            verdict(done(r#"{"id": "res-1"}"#)),
            Probed::Applied(json!({"id": "res-1"}))
        );
        assert_eq!(verdict(done("charged")), Probed::Applied(json!("charged")));
        assert!(matches!(verdict(done(" \n")), Probed::Unknown(_)));
        assert_eq!(
            verdict(failed(json!({"status": 404, "body": ""}))),
            Probed::NotApplied
        );
        assert_eq!(
            verdict(failed(json!({"exit_code": 1, "stdout": "", "stderr": ""}))),
            Probed::NotApplied
        );
        assert!(matches!(
            verdict(failed(json!({"status": 500, "body": "down"}))),
            Probed::Unknown(_)
        ));
        assert!(matches!(
            verdict(failed(json!({"exit_code": 2, "stdout": "", "stderr": ""}))),
            Probed::Unknown(_)
        ));
        assert!(matches!(verdict(Outcome::Cancelled), Probed::Unknown(_)));
    }
}
