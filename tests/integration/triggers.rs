//! Triggers from outside over HTTP (`durun ui`'s API): a webhook wakes a
//! waiting task with a signal, or queues a task, with a real HTTP client
//! (curl) and the same token rules as the page.

use std::process::Command;

use serde_json::Value;

use crate::env::TestEnv;
use crate::ui::{Ui, evil_task, request};

/// `curl` POSTing `body` to the server, with `headers`: its status and
/// its answer.
fn curl(ui: &Ui, path: &str, headers: &[&str], body: &str) -> (u16, Value) {
    let mut command = Command::new("curl");
    command.args([
        "-s",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        "POST",
        "--data-binary",
        body,
    ]);
    for header in headers {
        command.args(["-H", header]);
    }
    let output = command
        .arg(format!("http://{}{path}", ui.at))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (answer, status) = text.rsplit_once('\n').expect("a status");
    (
        status.parse().expect("a status code"),
        serde_json::from_str(answer).unwrap_or(Value::String(answer.to_owned())),
    )
}

#[test]
fn a_webhook_wakes_a_waiting_task_and_a_redelivery_is_kept_once() {
    let env = TestEnv::new();
    let task = evil_task(&env);
    let ui = Ui::start(&env, &[]);
    let bearer = format!("Authorization: Bearer {}", ui.token);
    let path = "/api/tasks/javascript%3Aalert.1/signals/approve";
    let body = r#"{"approved": true, "by": "ci"}"#;

    // No token, or the cookie without the CSRF token: refused.
    assert_eq!(curl(&ui, path, &[], body).0, 401);
    // The page's cookie, as a first visit gets it.
    let first = crate::ui::request(&ui.at, "GET", &format!("/?token={}", ui.token), &[], "");
    let pair = first
        .header("set-cookie")
        .and_then(|cookie| cookie.split(';').next())
        .expect("a cookie")
        .to_owned();
    let cookie = format!("Cookie: {pair}");
    assert_eq!(curl(&ui, path, &[&cookie], body).0, 403);
    let (status, said) = curl(
        &ui,
        path,
        &[&bearer, "Content-Type: application/json"],
        "{not json",
    );
    assert_eq!(status, 400, "{said}");
    assert!(
        env.inspect(task)["task"]["signals"]
            .as_array()
            .is_none_or(Vec::is_empty)
    );

    // Delivered twice, with the delivery's id: one signal.
    for _ in 0..2 {
        let (status, said) = curl(&ui, path, &[&bearer, "Idempotency-Key: delivery-1"], body);
        assert_eq!(status, 200, "{said}");
        assert_eq!(said["ok"], true);
    }
    let signals = env.inspect(task)["task"]["signals"].clone();
    assert_eq!(signals.as_array().map(Vec::len), Some(1), "{signals}");
    assert_eq!(
        signals[0]["data"],
        serde_json::json!({"approved": true, "by": "ci"})
    );

    // The task it woke completes with the webhook's data.
    crate::ui::resume_to_the_end(&env, task);
    assert_eq!(
        env.inspect(task)["task"]["output"]["answer"]["data"]["by"],
        "ci"
    );

    // A task that takes no more signals says so, in the command's words.
    let (status, said) = curl(&ui, path, &[&bearer], body);
    assert_eq!(status, 422);
    assert!(
        said["message"]
            .as_str()
            .is_some_and(|m| m.contains("is completed; it takes no more signals")),
        "{said}"
    );
}

#[test]
fn a_webhook_queues_a_task_only_where_the_operator_allowed_it() {
    let env = TestEnv::new();
    let body =
        r#"{"command": ["python3", "-c", "print('hi')"], "task": "hook-1", "queue": "webhooks"}"#;
    {
        let ui = Ui::start(&env, &[]);
        let bearer = format!("Authorization: Bearer {}", ui.token);
        let (status, said) = curl(&ui, "/api/tasks", &[&bearer], body);
        assert_eq!(status, 403, "{said}");
        assert!(
            said["message"]
                .as_str()
                .is_some_and(|m| m.contains("--allow-submit")),
            "{said}"
        );
    }
    let ui = Ui::start(&env, &["--allow-submit"]);
    let bearer = format!("Authorization: Bearer {}", ui.token);
    let (status, said) = curl(&ui, "/api/tasks", &[&bearer], body);
    assert_eq!(status, 201, "{said}");
    assert_eq!(said["task"], "hook-1");
    let queued = env.inspect("hook-1");
    assert_eq!(queued["task"]["status"], "queued");
    assert_eq!(queued["task"]["queue"], "webhooks");
    assert_eq!(
        queued["task"]["command"],
        serde_json::json!(["python3", "-c", "print('hi')"])
    );

    let (status, said) = curl(&ui, "/api/tasks", &[&bearer], body);
    assert_eq!(status, 422);
    assert!(
        said["message"]
            .as_str()
            .is_some_and(|m| m.contains("task hook-1 exists already")),
        "{said}"
    );
    for bad in [
        r#"{"command": []}"#,
        r#"{"command": "python3 x"}"#,
        "[1]",
        r#"{"command": ["x"], "max_tokens": -1}"#,
    ] {
        let (status, said) = curl(&ui, "/api/tasks", &[&bearer], bad);
        assert_eq!(status, 400, "{bad}: {said}");
    }
    // Not by GET.
    assert_eq!(
        request(
            &ui.at,
            "GET",
            "/api/tasks/hook-1/signals/go",
            &[("Authorization", &format!("Bearer {}", ui.token))],
            ""
        )
        .status,
        404
    );
}
