//! A task's event stream (SPEC 20): `GET /api/tasks/ID/events` of `durun
//! ui` as a client reads it off the socket, hanging up and coming back
//! with `Last-Event-ID`, across the task's runs and a restart of the
//! server; and `inspect --follow --json`, which prints the same events.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::env::{TestEnv, text, wait_exit, wait_for};
use crate::ui::Ui;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: String,
    event: String,
    data: Value,
}

/// A task's event stream, open.
struct EventStream {
    reader: BufReader<TcpStream>,
}

impl EventStream {
    /// Opens the task's stream (after `last`, if given). HTTP/1.0: the
    /// body comes as the server sends it, not in chunks.
    fn open(ui: &Ui, task: &str, last: Option<&str>) -> Self {
        let mut stream = TcpStream::connect(&ui.at).expect("connect to durun ui");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut head = format!(
            "GET /api/tasks/{task}/events HTTP/1.0\r\nAuthorization: {}\r\n",
            ui.bearer()
        );
        if let Some(last) = last {
            head.push_str("Last-Event-ID: ");
            head.push_str(last);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).expect("send");
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).expect("status line");
        assert!(line.contains(" 200 "), "{line}");
        let mut event_stream = false;
        loop {
            line.clear();
            reader.read_line(&mut line).expect("a header");
            if line.trim().is_empty() {
                break;
            }
            event_stream |= line.eq_ignore_ascii_case("content-type: text/event-stream\r\n");
        }
        assert!(event_stream, "not an event stream");
        Self { reader }
    }

    /// Reads events until `enough` says so.
    fn read_until(&mut self, mut enough: impl FnMut(&[Sse]) -> bool) -> Vec<Sse> {
        let mut events = Vec::new();
        let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
        let mut line = String::new();
        while !enough(&events) {
            line.clear();
            let read = self.reader.read_line(&mut line).expect("an event line");
            assert!(read > 0, "the server ended the stream after {events:?}");
            let line = line.trim_end_matches('\n');
            if line.is_empty() {
                if !data.is_empty() {
                    events.push(Sse {
                        id: std::mem::take(&mut id),
                        event: std::mem::take(&mut event),
                        data: serde_json::from_str(&std::mem::take(&mut data)).expect("JSON data"),
                    });
                }
            } else if let Some(value) = line.strip_prefix("id: ") {
                value.clone_into(&mut id);
            } else if let Some(value) = line.strip_prefix("event: ") {
                value.clone_into(&mut event);
            } else if let Some(value) = line.strip_prefix("data: ") {
                data.push_str(value);
            }
        }
        events
    }
}

/// Opens the task's stream after `last`, reads events until `enough`
/// says so, and hangs up.
fn read_events(
    ui: &Ui,
    task: &str,
    last: Option<&str>,
    enough: impl FnMut(&[Sse]) -> bool,
) -> Vec<Sse> {
    EventStream::open(ui, task, last).read_until(enough)
}

/// An event id as its order: the journal row, then the part of it (a
/// live delta's place in its stream goes with the journal's place).
fn order(id: &str) -> (u64, u64) {
    let id = id.split_once('+').map_or(id, |(journal, _)| journal);
    let (row, part) = id.split_once('.').unwrap_or((id, "0"));
    (
        row.parse().expect("row"),
        part.parse().expect("part of a row"),
    )
}

const AGENT: &str = r#"
for i in $(seq 1 20); do
    durun step "s$i" --args "{\"i\": $i}" -- sh -c "sleep 0.02; echo $i" >/dev/null
    # The first run dies with durun, killed outright after step 12.
    [ "$DURUN_RUN" = 1 ] && [ "$i" = 12 ] && kill -9 $PPID
done
durun step publish --effect mutate -- echo published >/dev/null
"#;

#[test]
fn a_stream_resumed_across_hang_ups_runs_and_a_ui_restart_has_every_event_once() {
    let env = TestEnv::new();
    let agent = env.write("agent.sh", AGENT);
    let agent = agent.to_str().expect("path");
    let mut first = env.spawn(&["run", "--task", "ev", "--", "bash", agent], "run1");
    wait_for("task ev in the journal", Duration::from_secs(20), || {
        env.durun(&["inspect", "ev", "--json"]).status.success()
    });
    let mut ui = Ui::start(&env, &[]);
    let four = |events: &[Sse]| events.len() == 4;
    let mut seen = read_events(&ui, "ev", None, four);
    seen.extend(read_events(&ui, "ev", Some(&seen[3].id), four));
    drop(ui);
    ui = Ui::start(&env, &[]);
    seen.extend(read_events(&ui, "ev", Some(&seen[7].id), four));
    wait_exit(&mut first, Duration::from_secs(60));
    let mut second = env.spawn(&["resume", "ev"], "run2");
    let finished = |events: &[Sse]| {
        events
            .last()
            .is_some_and(|last| last.event == "run.finished")
    };
    // Hung up after 12 events: the rest, the resumed run's too, live.
    seen.extend(read_events(&ui, "ev", Some(&seen[11].id), finished));
    let status = wait_exit(&mut second, Duration::from_secs(60));
    assert!(status.success(), "{}", env.log("run2"));

    // Once each, in order, and nothing missed: the same as one stream
    // read from the start, and as `inspect --follow --json` prints.
    for pair in seen.windows(2) {
        assert!(order(&pair[0].id) < order(&pair[1].id), "{pair:?}");
    }
    let whole = read_events(&ui, "ev", None, finished);
    assert_eq!(seen, whole);
    let followed = env.durun(&["inspect", "ev", "--follow", "--json"]);
    assert!(followed.status.success());
    let printed: Vec<Value> = String::from_utf8_lossy(&followed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let data: Vec<Value> = whole.iter().map(|sse| sse.data.clone()).collect();
    assert_eq!(printed, data);
    // From an id on, as a script that lost its place would ask.
    let from = &whole[5].id;
    let after = env.durun(&["inspect", "ev", "--follow", "--json", "--after", from]);
    assert!(after.status.success(), "{}", text(&after.stderr));
    let printed: Vec<Value> = String::from_utf8_lossy(&after.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(printed, data[6..]);
    let bad = env.durun(&["inspect", "ev", "--follow", "--json", "--after", "soon"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    for sse in &whole {
        assert_eq!(sse.data["id"], sse.id.as_str());
        assert_eq!(sse.data["event"], sse.event.as_str());
    }

    // What the journal holds: every step finished once, by its run; the
    // runs opened and ended; the second replayed what the first did.
    let shown = env.inspect("ev");
    let steps = shown["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 21);
    let of = |kind: &str| -> Vec<&Sse> { whole.iter().filter(|sse| sse.event == kind).collect() };
    let finished_steps: Vec<(u64, &str, u64)> = of("step.finished")
        .iter()
        .map(|sse| {
            (
                sse.data["step"].as_u64().expect("step"),
                sse.data["name"].as_str().expect("name"),
                sse.data["run"].as_u64().expect("run"),
            )
        })
        .collect();
    let expected: Vec<(u64, &str, u64)> = steps
        .iter()
        .map(|step| {
            let number = step["step"].as_u64().expect("step");
            (
                number,
                step["name"].as_str().expect("name"),
                if number <= 12 { 1 } else { 2 },
            )
        })
        .collect();
    assert_eq!(finished_steps, expected);
    let runs = shown["task"]["runs"].as_array().expect("runs");
    let replayed: Vec<u64> = of("step.replayed")
        .iter()
        .map(|sse| sse.data["step"].as_u64().expect("step"))
        .collect();
    assert_eq!(replayed, (1..=12).collect::<Vec<u64>>());
    assert_eq!(runs[1]["replayed_steps"], 12);
    let kinds: Vec<(&str, u64)> = whole
        .iter()
        .filter(|sse| sse.event.starts_with("run."))
        .map(|sse| (sse.event.as_str(), sse.data["run"].as_u64().expect("run")))
        .collect();
    assert_eq!(
        kinds,
        [
            ("run.opened", 1),
            ("run.interrupted", 1),
            ("run.opened", 2),
            ("run.finished", 2)
        ]
    );
    // The mutate step was opened (its intent) before it finished.
    assert_eq!(of("step.opened").len(), 1);
    assert_eq!(of("step.opened")[0].data["name"], "publish");
}

/// While a proxied stream runs, its text comes as `step.delta` events
/// before the step is journaled; a client back from a delta gets none of
/// that text again.
#[test]
fn a_live_model_stream_comes_as_text_deltas_before_its_step_is_written() {
    if !crate::servers::llm_clients() {
        return;
    }
    let (env, _server) = crate::proxy::llm_env();
    // The call waits for the watcher; the upstream holds its stream after
    // "first " until llm.port.release is there.
    let agent = env.write(
        "agent.py",
        r#"
import os, time
import openai
while not os.path.exists("go"):
    time.sleep(0.01)
client = openai.OpenAI(api_key="k", max_retries=0)
stream = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "slow stream"}], stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
"#,
    );
    let agent = agent.to_str().expect("path");
    let mut run = env.spawn(&["run", "--task", "live", "--", "python3", agent], "run");
    wait_for("task live in the journal", Duration::from_secs(20), || {
        env.durun(&["inspect", "live", "--json"]).status.success()
    });
    let ui = Ui::start(&env, &[]);
    let mut stream = EventStream::open(&ui, "live", None);
    let mut seen = stream.read_until(|events| events.iter().any(|sse| sse.event == "run.opened"));
    std::fs::write(env.path("go"), "").expect("go");
    seen.extend(stream.read_until(|events| events.iter().any(|sse| sse.event == "step.delta")));
    let first = seen.last().expect("a delta").clone();
    assert_eq!(first.data["text"], "first ");
    assert_eq!(first.data["id"], first.id.as_str());
    assert_eq!(
        env.inspect("live")["steps"],
        serde_json::json!([]),
        "the step is not written yet"
    );
    std::fs::write(env.path("llm.port.release"), "").expect("release");
    seen.extend(stream.read_until(|events| events.iter().any(|sse| sse.event == "run.finished")));
    let status = wait_exit(&mut run, Duration::from_secs(60));
    assert!(status.success(), "{}", env.log("run"));
    let text: String = seen
        .iter()
        .filter(|sse| sse.event == "step.delta")
        .map(|sse| sse.data["text"].as_str().expect("text"))
        .collect();
    assert_eq!(text, "first second");
    let last_delta = seen.iter().rposition(|sse| sse.event == "step.delta");
    let finished = seen.iter().position(|sse| sse.event == "step.finished");
    assert!(last_delta < finished, "{seen:?}");
    for pair in seen.windows(2) {
        assert!(order(&pair[0].id) <= order(&pair[1].id), "{pair:?}");
    }
    // Back from the first delta: the rest, "first " not again.
    let rest = read_events(&ui, "live", Some(&first.id), |events| {
        events.iter().any(|sse| sse.event == "run.finished")
    });
    assert!(
        rest.iter().all(|sse| sse.data["text"] != "first "),
        "{rest:?}"
    );
    assert_eq!(
        rest.iter()
            .filter(|sse| sse.event == "step.finished")
            .count(),
        1
    );
}

/// A client that hands back an id durun never gave is told so, and a
/// task that is not there is a 404.
#[test]
fn a_bad_last_event_id_or_an_unknown_task_is_refused() {
    let env = TestEnv::new();
    let made = env.durun(&["run", "--task", "t", "--", "true"]);
    assert!(made.status.success());
    let ui = Ui::start(&env, &[]);
    let bearer = ui.bearer();
    let bad = crate::ui::request(
        &ui.at,
        "GET",
        "/api/tasks/t/events",
        &[("Authorization", &bearer), ("Last-Event-ID", "yesterday")],
        "",
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("Last-Event-ID"), "{}", bad.body);
    let missing = ui.get("/api/tasks/nope/events");
    assert_eq!(missing.status, 404, "{}", missing.body);
    let denied = crate::ui::request(&ui.at, "GET", "/api/tasks/t/events", &[], "");
    assert_eq!(denied.status, 401);
}
