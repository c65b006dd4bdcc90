//! `durun ui` (SPEC 15) over real HTTP on loopback: the token on every
//! request, CSRF on every action, no action by GET, journal data as text,
//! the API equal to `inspect --json`, and the page's actions doing what
//! the commands do. The page in a real browser: `browser.rs`' test.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Child;
use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, agents_dir, wait_exit, wait_for};

/// An answer, as read off the socket.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// One HTTP/1.1 request, `Connection: close`, the answer read whole.
pub(crate) fn request(
    at: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut stream = TcpStream::connect(at).expect("connect to durun ui");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("send");
    stream.write_all(body.as_bytes()).expect("send body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read answer");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|line| line.split_once(": "))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A `durun ui` on a free port of this environment's journal.
pub(crate) struct Ui {
    pub(crate) child: Child,
    /// `127.0.0.1:PORT`.
    pub(crate) at: String,
    pub(crate) token: String,
    /// The URL it printed.
    pub(crate) url: String,
}

impl Ui {
    pub(crate) fn start(env: &TestEnv, extra: &[&str]) -> Self {
        let mut args = vec!["ui", "--listen", "127.0.0.1:0"];
        args.extend(extra);
        let child = env.spawn(&args, "ui");
        let out = env.path("ui.out");
        let mut url = String::new();
        wait_for("durun ui to print its URL", Duration::from_secs(20), || {
            url = std::fs::read_to_string(&out).unwrap_or_default();
            url.ends_with('\n')
        });
        let url = url.trim().to_owned();
        let rest = url.strip_prefix("http://").expect("an http URL");
        let (at, token) = rest
            .split_once("/?token=")
            .unwrap_or((rest.trim_end_matches('/'), ""));
        Self {
            child,
            at: at.to_owned(),
            token: token.to_owned(),
            url,
        }
    }

    pub(crate) fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    pub(crate) fn get(&self, path: &str) -> Answer {
        request(
            &self.at,
            "GET",
            path,
            &[("Authorization", &self.bearer())],
            "",
        )
    }

    /// The CSRF token the pages carry.
    pub(crate) fn csrf(&self) -> String {
        let page = self.get("/").body;
        let from = page
            .find("name=\"csrf-token\" content=\"")
            .expect("the CSRF meta tag")
            + 27;
        page[from..from + 64].to_owned()
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A task parked on `wait` whose steps, outputs, errors and wait data hold
/// markup, and whose id is `javascript:alert.1`.
pub(crate) fn evil_task(env: &TestEnv) -> &'static str {
    let agent = agents_dir().join("ui_agent.py");
    let output = env
        .command()
        .env("UI_WAIT", "approve")
        .args([
            "run",
            "--task",
            "javascript:alert.1",
            "--park-after",
            "0s",
            "--",
            "python3",
        ])
        .arg(&agent)
        .output()
        .expect("run the agent");
    assert_eq!(
        output.status.code(),
        Some(77),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    "javascript:alert.1"
}

/// Resumes the evil task (its signal has come) and checks it completed.
pub(crate) fn resume_to_the_end(env: &TestEnv, task: &str) {
    let resumed = env
        .command()
        .env("UI_WAIT", "approve")
        .args(["resume", task])
        .output()
        .expect("resume");
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
}

#[test]
fn every_request_needs_the_token_and_the_first_visit_trades_it_for_a_cookie() {
    let env = TestEnv::new();
    let task = evil_task(&env);
    let ui = Ui::start(&env, &[]);
    assert!(ui.url.starts_with("http://127.0.0.1:"), "{}", ui.url);
    assert_eq!(ui.token.len(), 48, "{}", ui.url);
    for (what, headers) in [
        ("no token", vec![]),
        (
            "a wrong bearer token",
            vec![("Authorization", "Bearer 0123")],
        ),
        ("a wrong cookie", vec![("Cookie", "durun_ui_1=0123")]),
    ] {
        for path in [
            "/",
            "/api/tasks",
            "/tasks/javascript%3Aalert.1",
            "/assets/ui.js",
        ] {
            let answer = request(&ui.at, "GET", path, &headers, "");
            assert_eq!(answer.status, 401, "{what} on {path}");
            assert!(
                !answer.body.contains(task),
                "{what} on {path}: {}",
                answer.body
            );
        }
    }
    let wrong = request(&ui.at, "GET", "/?token=00", &[], "");
    assert_eq!(wrong.status, 401);

    // The first visit: the token leaves the address for an HttpOnly cookie.
    let first = request(
        &ui.at,
        "GET",
        &format!("/?token={}&status=waiting", ui.token),
        &[],
        "",
    );
    assert_eq!(first.status, 303);
    assert_eq!(first.header("location"), Some("/?status=waiting"));
    let cookie = first.header("set-cookie").expect("a cookie").to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().expect("name=value");
    // Its name is the port's, its value is not the token (a browser sends
    // 127.0.0.1's cookies to every port of it).
    let port = ui.at.rsplit(':').next().expect("a port");
    assert!(pair.starts_with(&format!("durun_ui_{port}=")), "{pair}");
    assert!(!pair.contains(&ui.token), "the cookie is the token: {pair}");
    // The API and the actions never take the token in the URL.
    let in_url = request(
        &ui.at,
        "GET",
        &format!("/api/tasks?token={}", ui.token),
        &[],
        "",
    );
    assert_eq!(in_url.status, 401, "{}", in_url.body);
    assert!(in_url.body.contains("never in the URL"), "{}", in_url.body);
    let posted = request(
        &ui.at,
        "POST",
        &format!("/tasks/javascript%3Aalert.1/cancel?token={}", ui.token),
        &[],
        "",
    );
    assert_eq!(posted.status, 401, "{}", posted.body);
    let list = request(&ui.at, "GET", "/?status=waiting", &[("Cookie", pair)], "");
    assert_eq!(list.status, 200);
    assert!(list.body.contains("javascript:alert.1"), "{}", list.body);
    let policy = list.header("content-security-policy").expect("a policy");
    assert!(
        policy.contains("default-src 'none'") && policy.contains("script-src 'self'"),
        "{policy}"
    );
    assert_eq!(list.header("x-content-type-options"), Some("nosniff"));
    // And a script's way in: the bearer token.
    assert_eq!(ui.get("/api/tasks").status, 200);
}

#[test]
fn actions_are_posts_with_the_csrf_token_and_do_what_the_commands_do() {
    let env = TestEnv::new();
    let task = evil_task(&env);
    let ui = Ui::start(&env, &[]);
    let path = "/tasks/javascript%3Aalert.1/approve";
    let csrf = ui.csrf();
    let bearer = ui.bearer();
    let form = [
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
    ];

    // No action by GET, even with the token and the CSRF token.
    let by_get = ui.get(&format!("{path}?csrf={csrf}"));
    assert_eq!(by_get.status, 405, "{}", by_get.body);
    assert_eq!(by_get.header("allow"), Some("POST"));
    // A POST without the CSRF token, or with a wrong one.
    for body in [
        "comment=x".to_owned(),
        format!("csrf={}&comment=x", "0".repeat(64)),
    ] {
        let answer = request(&ui.at, "POST", path, &form, &body);
        assert_eq!(answer.status, 403, "{body}: {}", answer.body);
    }
    // A POST without the token.
    let answer = request(
        &ui.at,
        "POST",
        path,
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &format!("csrf={csrf}"),
    );
    assert_eq!(answer.status, 401);
    assert!(
        env.inspect(task)["task"]["signals"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{}",
        env.inspect(task)
    );

    // The real thing: the approval reaches the task, which then completes.
    let answer = request(
        &ui.at,
        "POST",
        path,
        &form,
        &format!("csrf={csrf}&comment=ship+it"),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body.contains("approved task javascript:alert.1"),
        "{}",
        answer.body
    );
    resume_to_the_end(&env, task);
    let output = &env.inspect(task)["task"]["output"];
    assert_eq!(
        output["answer"]["data"],
        serde_json::json!({"approved": true, "comment": "ship it"}),
        "{output}"
    );

    // What the command refuses, the page refuses, with the command's words.
    let json = [
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Accept", "application/json"),
    ];
    let answer = request(
        &ui.at,
        "POST",
        "/tasks/javascript%3Aalert.1/signal",
        &json,
        &format!("csrf={csrf}&name=go"),
    );
    assert_eq!(answer.status, 422, "{}", answer.body);
    let said: Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(said["ok"], false);
    assert!(
        said["message"]
            .as_str()
            .is_some_and(|m| m.contains("is completed; it takes no more signals")),
        "{said}"
    );

    // Fork: a new task, and the page sends the browser there.
    let answer = request(
        &ui.at,
        "POST",
        "/tasks/javascript%3Aalert.1/fork",
        &json,
        &format!("csrf={csrf}&from=3"),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let said: Value = serde_json::from_str(&answer.body).expect("JSON");
    let location = said["location"].as_str().expect("a location");
    let forked = location.strip_prefix("/tasks/").expect("a task page");
    let copy = env.inspect(forked);
    assert_eq!(copy["steps"].as_array().map(Vec::len), Some(2), "{copy}");
}

#[test]
fn journal_data_is_shown_as_text_never_as_markup() {
    let env = TestEnv::new();
    let task = evil_task(&env);
    let sent = env.durun(&[
        "signal",
        task,
        "note",
        "--data",
        r#"{"x": "<script>alert(4)</script>\u001b[2J"}"#,
    ]);
    assert!(sent.status.success());
    let ui = Ui::start(&env, &[]);
    for path in [
        "/",
        "/tasks/javascript%3Aalert.1",
        "/tasks/javascript%3Aalert.1/steps/1",
        "/tasks/javascript%3Aalert.1/steps/4",
        "/tokens",
    ] {
        let page = ui.get(path);
        assert_eq!(page.status, 200, "{path}");
        let html = &page.body;
        // The page's one script is its own; no element came from the data.
        assert_eq!(html.matches("<script").count(), 1, "{path}: {html}");
        for markup in [
            "<img",
            "<a href=\"javascript",
            "href=\"javascript",
            "\u{1b}",
        ] {
            assert!(!html.contains(markup), "{path} holds {markup:?}: {html}");
        }
        if path.contains("tasks") {
            assert!(
                html.contains(
                    "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"
                ),
                "{path}: {html}"
            );
            // Shown escaped: `\x1b` in text, `\u001b` in JSON.
            assert!(
                html.contains("\\x1b[31mred") || html.contains("\\u001b[31mred"),
                "{path}: {html}"
            );
        }
    }
    let page = ui.get("/tasks/javascript%3Aalert.1").body;
    assert!(
        page.contains("refused: &lt;script&gt;"),
        "the step's error: {page}"
    );
    assert!(
        page.contains("&lt;script&gt;alert(4)&lt;/script&gt;\\u001b[2J"),
        "the signal's data: {page}"
    );
    // The task id in links is one percent-encoded path segment.
    let list = ui.get("/").body;
    assert!(
        list.contains("href=\"/tasks/javascript%3Aalert%2E1\""),
        "{list}"
    );
}

#[test]
fn a_divergence_shows_its_diff_on_the_task_page() {
    let env = TestEnv::new();
    let plan = |title: &str| {
        serde_json::json!({"steps": [
            {"begin": "open_pr", "effect": "mutate", "args": {"title": title}, "do": {"value": 1}},
        ]})
    };
    let agent = env.scripted_agent("plan.json", &plan("<b>Fix</b>"));
    let mut args = vec!["run", "--task", "d", "--"];
    args.extend(agent.iter().map(String::as_str));
    env.durun(&args);
    env.sql("UPDATE tasks SET status = 'failed'");
    env.scripted_agent("plan.json", &plan("Rewrite"));
    assert_eq!(env.durun(&["resume", "d"]).status.code(), Some(65));
    let ui = Ui::start(&env, &[]);
    let page = ui.get("/tasks/d").body;
    let row = page
        .split("<tr class=\"run-error\">")
        .nth(1)
        .unwrap_or_default();
    assert!(row.contains("diverged from the journal"), "{page}");
    // The recorded args are shown as text, never as markup.
    assert!(
        row.contains("/title: &quot;&lt;b&gt;Fix&lt;/b&gt;&quot; -&gt; &quot;Rewrite&quot;"),
        "{row}"
    );
}

#[test]
fn a_killed_run_says_it_died_and_how_long_it_lasted_at_most() {
    let env = TestEnv::new();
    let agent = "if [ \"$DURUN_RUN\" = 1 ]; then touch started; sleep 30; fi";
    let mut durun = env.spawn(&["run", "--task", "k", "--", "sh", "-c", agent], "run");
    crate::env::sigkill_once(
        &mut durun,
        "the first run",
        std::time::Duration::from_secs(30),
        || env.path("started").exists(),
    );
    assert!(env.durun(&["resume", "k"]).status.success());
    let ui = Ui::start(&env, &[]);
    let page = ui.get("/tasks/k").body;
    let runs = page.split("<h2>Runs</h2>").nth(1).unwrap_or_default();
    let first = runs.split("<tr>").nth(2).unwrap_or_default();
    assert!(
        first.contains("<span class=\"stale\">died</span>"),
        "{first}"
    );
    assert!(first.contains("<td>≤ "), "{first}");
    let second = runs.split("<tr>").nth(3).unwrap_or_default();
    assert!(second.contains("<td>0</td>"), "{second}");
    // The list says it crashed and was resumed.
    let list = ui.get("/").body;
    let row = list.split("/tasks/k\"").nth(1).unwrap_or_default();
    let row = row.split("</tr>").next().unwrap_or_default();
    assert!(row.contains("↻ crashed, resumed"), "{row}");
}

#[test]
fn a_task_held_back_after_its_agent_keeps_dying_says_so_on_its_page() {
    let env = TestEnv::new();
    env.durun(&["submit", "--task", "oom", "--", "sh", "-c", "kill -9 $$"]);
    for _ in 0..4 {
        assert_eq!(env.durun(&["resume", "oom"]).status.code(), Some(137));
    }
    // Four in a row: a worker waits 4 s from the last one's end.
    let ui = Ui::start(&env, &[]);
    let page = ui.get("/tasks/oom").body;
    let row = page
        .split("<dt>resumed</dt><dd>")
        .nth(1)
        .and_then(|rest| rest.split("</dd>").next())
        .unwrap_or_else(|| panic!("no row on the wait: {page}"));
    assert!(row.starts_with("by a worker in "), "{row}");
    assert!(
        row.ends_with("s: its agent was killed by a signal in its last 4 runs"),
        "{row}"
    );
}

#[test]
fn the_api_answers_what_inspect_json_prints() {
    let env = TestEnv::new();
    let task = evil_task(&env);
    let ui = Ui::start(&env, &[]);
    let parse = |text: &str| serde_json::from_str::<Value>(text).expect("JSON");
    let list = env.durun(&["inspect", "--json"]);
    assert_eq!(
        parse(&ui.get("/api/tasks").body),
        parse(&String::from_utf8_lossy(&list.stdout))
    );
    assert_eq!(
        parse(&ui.get("/api/tasks/javascript%3Aalert.1").body),
        env.inspect(task)
    );
    assert_eq!(ui.get("/api/tasks/nope").status, 404);

    // What the page's script asks every second changes with the task.
    let live =
        |ui: &Ui| parse(&ui.get("/api/live?key=task:javascript:alert.1").body)["version"].clone();
    let before = live(&ui);
    assert_eq!(live(&ui), before);
    assert!(env.durun(&["approve", task]).status.success());
    assert_ne!(live(&ui), before);
}

#[test]
fn a_listen_address_other_hosts_can_reach_needs_a_token_file() {
    let env = TestEnv::new();
    let refused = env.durun(&["ui", "--listen", "0.0.0.0:0"]);
    assert_eq!(refused.status.code(), Some(2));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.starts_with(
            "durun: --listen 0.0.0.0:0 is reachable from other hosts: it needs --token-file FILE"
        ),
        "{said}"
    );

    env.write("short", "abc\n");
    let refused = env.durun(&["ui", "--listen", "0.0.0.0:0", "--token-file", "short"]);
    assert_eq!(
        refused.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let token = "s3cret-token-of-the-operator-0123";
    env.write("token", &format!("{token}\n"));
    let mut ui = Ui::start(&env, &["--token-file", "token"]);
    // The operator's token is not printed.
    assert!(
        !ui.url.contains(token) && ui.url.ends_with('/'),
        "{}",
        ui.url
    );
    ui.token = token.to_owned();
    assert_eq!(ui.get("/").status, 200);
    assert_eq!(request(&ui.at, "GET", "/", &[], "").status, 401);
}

#[test]
fn a_port_in_use_is_said_plainly_and_sigterm_stops_the_server() {
    let env = TestEnv::new();
    let mut ui = Ui::start(&env, &[]);
    let taken = env.durun(&["ui", "--listen", &ui.at]);
    assert_eq!(taken.status.code(), Some(64));
    let said = String::from_utf8_lossy(&taken.stderr);
    assert!(
        said.contains(&format!("durun: cannot serve on {}", ui.at))
            && said.contains("127.0.0.1:0 for any free one"),
        "{said}"
    );
    // An empty journal: the list says how to make a task.
    assert!(ui.get("/").body.contains("No tasks yet"));
    crate::env::signal(ui.child.id() as i32, libc::SIGTERM);
    let status = wait_exit(&mut ui.child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
}
