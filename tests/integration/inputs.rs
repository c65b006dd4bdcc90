//! SPEC 17's inputs: what a user, an agent or a config gives that must be
//! taken as a value or refused where it is made.

use crate::env::{TestEnv, text};

#[test]
fn names_with_a_newline_or_a_control_character_are_refused_where_they_are_made() {
    let env = TestEnv::new();
    for name in ["two\nlines", "bell\u{7}", "esc\u{1b}[2J"] {
        let output = env.durun(&["mcp", "--name", name, "--", "true"]);
        assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
        assert!(text(&output.stderr).contains("invalid MCP server name"));
        let output = env.durun(&["signal", "some-task", name]);
        assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
        let stderr = text(&output.stderr);
        assert!(stderr.contains("invalid signal name"), "{stderr}");
        // The refusal is one line: the name is shown escaped.
        assert_eq!(
            stderr
                .lines()
                .filter(|line| line.starts_with("durun:"))
                .count(),
            1,
            "{stderr}"
        );
    }
}

#[test]
fn a_proxied_path_that_climbs_out_of_its_route_is_refused_and_a_query_secret_is_not_journaled() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = std::sync::Arc::clone(&seen);
    let upstream = crate::servers::serve(move |url, _, _| {
        log.lock().expect("log").push(url.to_owned());
        serde_json::json!({"ok": true})
    });
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        &format!(
            "[proxy]\nsecret_query = [\"session\"]\n\n[proxy.routes.api]\nenv = \"MY_API\"\nupstream = \"{upstream}base\"\nread = [\"POST /search\"]\n"
        ),
    );
    env.write(
        "agent.py",
        r#"
import json, os, urllib.error, urllib.request
api = os.environ["MY_API"]
def call(path, method="GET"):
    request = urllib.request.Request(api + path, method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code
print(json.dumps([
    call("/x/../../openai/v1/models"),
    call("/%2e%2e/%2E%2E/openai/v1/models"),
    call("/a//b/./c?key=sk-secret&page=2&session=s3"),
    call("/search/../items", "POST"),
]))
"#,
    );
    let output = env.durun(&["run", "--task", "paths", "--", "python3", "agent.py"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let statuses: serde_json::Value = serde_json::from_slice(&output.stdout).expect("statuses");
    assert_eq!(
        statuses,
        serde_json::json!([400, 400, 200, 200]),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(
        *seen.lock().expect("log"),
        ["/base/a/b/c?key=sk-secret&page=2&session=s3", "/base/items"],
        "forwarded as the upstream reads it, the secrets with it"
    );
    let view = env.inspect("paths");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{view}");
    assert_eq!(steps[0]["name"], "api GET /a/b/c");
    assert_eq!(steps[0]["args"]["query"], "key=***&page=2&session=***");
    // `/search/../items` is `/items`: not the read tier of `POST /search`.
    assert_eq!(steps[1]["name"], "api POST /items");
    assert_eq!(steps[1]["effect"], "mutate");
    assert!(
        !crate::proxy::journal_text(&env, "paths").contains("sk-secret"),
        "the key reached the journal"
    );
}

#[test]
fn a_route_may_not_set_the_variables_that_decide_what_runs() {
    let env = TestEnv::new();
    for variable in [
        "PATH",
        "HOME",
        "LD_PRELOAD",
        "DYLD_INSERT_LIBRARIES",
        "DURUN_SOCKET",
    ] {
        env.write(
            "durun.toml",
            &format!(
                "[proxy.routes.api]\nenv = \"{variable}\"\nupstream = \"http://127.0.0.1:9\"\n"
            ),
        );
        let output = env.durun(&["run", "--", "true"]);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{variable}: {}",
            text(&output.stderr)
        );
        assert!(
            text(&output.stderr).contains("is not for a route's URL"),
            "{}",
            text(&output.stderr)
        );
    }
}

#[test]
fn a_schedule_that_never_fires_is_refused() {
    let env = TestEnv::new();
    env.write(
        "durun.toml",
        "[schedules.leap]\ncron = \"0 0 30 2 *\"\ncommand = [\"true\"]\n",
    );
    let output = env.durun(&["schedules"]);
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("never fires"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn a_form_or_api_value_that_starts_with_a_dash_is_a_value_never_an_option() {
    let env = TestEnv::new();
    let task = crate::ui::evil_task(&env);
    let ui = crate::ui::Ui::start(&env, &[]);
    let elsewhere = env.path("elsewhere.db");
    let name = format!("--journal={}", elsewhere.display());
    let bearer = ui.bearer();
    let form = [
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Accept", "application/json"),
    ];
    let body: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("csrf", &ui.csrf())
        .append_pair("name", &name)
        .append_pair("data", "-1")
        .finish();
    let answer = crate::ui::request(
        &ui.at,
        "POST",
        "/tasks/javascript%3Aalert.1/signal",
        &form,
        &body,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let api = crate::ui::request(
        &ui.at,
        "POST",
        "/api/tasks/javascript%3Aalert.1/signals/-v",
        &[("Authorization", bearer.as_str())],
        "-2",
    );
    assert_eq!(api.status, 200, "{}", api.body);
    assert!(!elsewhere.exists(), "a form value was read as --journal");
    let signals = env.inspect(task)["task"]["signals"].clone();
    let named: Vec<(&str, &serde_json::Value)> = signals
        .as_array()
        .expect("signals")
        .iter()
        .map(|signal| (signal["name"].as_str().expect("a name"), &signal["data"]))
        .collect();
    assert_eq!(
        named,
        [
            (name.as_str(), &serde_json::json!(-1)),
            ("-v", &serde_json::json!(-2))
        ],
        "{signals}"
    );
}
