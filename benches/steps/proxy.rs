//! The model proxy: a call through `durun run`'s proxy next to the same
//! call made directly, and a replayed call, against a local upstream that
//! answers at once, so that what is measured is durun's part alone.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::time::Instant;

use super::{Scratch, Table, env_or, json};

/// The chunks of a streamed answer after its first.
const LATER_CHUNKS: usize = 10;

/// A keep-alive HTTP/1.1 upstream on loopback answering every POST with a
/// JSON body of about `bytes` bytes; its port.
pub(crate) fn upstream(bytes: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let text = "x".repeat(bytes.saturating_sub(120));
    let body = format!(
        "{{\"choices\":[{{\"message\":{{\"content\":\"{text}\"}}}}],\"usage\":{{\"prompt_tokens\":10,\"completion_tokens\":5}}}}"
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let body = body.clone();
            std::thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut writer = stream;
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut request = vec![0; length];
                    if reader.read_exact(&mut request).is_err() {
                        return;
                    }
                    if request.windows(13).any(|w| w == b"\"stream\":true") {
                        // Each chunk says when it left. The first comes at
                        // once; the later ones 2 ms after, then 0.2 ms
                        // apart, as a model's next tokens would.
                        let chunk = || {
                            let event = format!("data: {{\"sent_ns\":{}}}\n\n", super::unix_ns());
                            format!("{:x}\r\n{event}\r\n", event.len())
                        };
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}",
                            chunk()
                        );
                        if writer.write_all(head.as_bytes()).is_err() {
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        for _ in 0..LATER_CHUNKS {
                            if writer.write_all(chunk().as_bytes()).is_err() {
                                return;
                            }
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                        let done = "data: [DONE]\n\n";
                        let tail = format!("{:x}\r\n{done}\r\n0\r\n\r\n", done.len());
                        if writer.write_all(tail.as_bytes()).is_err() {
                            return;
                        }
                        continue;
                    }
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if writer.write_all(head.as_bytes()).is_err()
                        || writer.write_all(body.as_bytes()).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A bare relay on loopback in front of `upstream`: each connection it
/// takes gets one to the upstream, and two threads copy bytes each way
/// with no HTTP work at all; its port. What any proxy pays for its second
/// hop (the sockets, the copies, the wake-ups) on this machine, with
/// nothing of its own: the floor under durun's proxy rows.
pub(crate) fn relay(upstream: u16) -> u16 {
    fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
        let mut buffer = vec![0; 64 << 10];
        while let Ok(read) = from.read(&mut buffer) {
            if read == 0 || to.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for agent in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let _ = agent.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (Ok(agent_out), Ok(server_in)) = (agent.try_clone(), server.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || pump(agent, server));
            std::thread::spawn(move || pump(server_in, agent_out));
        }
    });
    port
}

/// The agent: `DURUN_BENCH_STEPS` chat completions, one after another, to
/// `DURUN_BENCH_URL` or else `$OPENAI_BASE_URL` (the proxy under durun).
/// With `DURUN_BENCH_STREAM` set they are streamed, and it reports the
/// median time from the upstream's first chunk leaving to its arrival.
pub(crate) fn agent() {
    let calls: u64 = env_or("DURUN_BENCH_STEPS", 100);
    let base = std::env::var("DURUN_BENCH_URL")
        .or_else(|_| std::env::var("OPENAI_BASE_URL"))
        .expect("a base URL");
    let agent = reqwest::blocking::Client::new();
    let stream = std::env::var_os("DURUN_BENCH_STREAM").is_some();
    let mut first_chunk = Vec::new();
    let mut later_chunks = Vec::new();
    let started = Instant::now();
    for i in 0..calls {
        let body = json!({"model": "m", "stream": stream,
            "messages": [{"role": "user", "content": format!("call {i}")}]});
        let answer = agent
            .post(format!("{base}/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .expect("a call");
        if stream {
            let mut reader = BufReader::new(answer);
            let mut line = String::new();
            let mut seen = 0;
            loop {
                line.clear();
                if reader.read_line(&mut line).expect("a chunk") == 0 {
                    break;
                }
                let arrived = super::unix_ns();
                let Some(event) = line.strip_prefix("data: ") else {
                    continue;
                };
                if event.trim() == "[DONE]" {
                    break;
                }
                let sent: serde_json::Value = serde_json::from_str(event.trim()).expect("JSON");
                let sent = u128::from(sent["sent_ns"].as_u64().expect("sent_ns"));
                let took = arrived.saturating_sub(sent) as f64;
                if seen == 0 {
                    first_chunk.push(took);
                } else {
                    later_chunks.push(took);
                }
                seen += 1;
            }
            assert_eq!(seen, 1 + LATER_CHUNKS, "every chunk came");
            let mut rest = String::new();
            reader.read_to_string(&mut rest).expect("the rest");
            continue;
        }
        let text = answer.text().expect("the answer");
        assert!(text.starts_with("{\"choices\""), "{text}");
    }
    let report = json!({
        "elapsed_ns": started.elapsed().as_nanos() as u64,
        "first_chunk_ns": super::median(first_chunk),
        "later_chunk_p99_ns": p99(later_chunks),
    });
    let path = std::env::var("DURUN_BENCH_OUT").expect("DURUN_BENCH_OUT");
    std::fs::write(path, report.to_string()).expect("write the report");
    std::process::exit(env_or("DURUN_BENCH_EXIT", 0));
}

/// The 99th percentile of `samples` (the nearest rank); NaN for none.
fn p99(mut samples: Vec<f64>) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = (samples.len() * 99).div_ceil(100).max(1);
    samples[rank - 1]
}

/// One round of the proxy's rows: for a 10 KB and a 1 MB answer, a direct
/// call, the same call through the proxy (a new step: forwarded, then one
/// commit), and the same call replayed on resume.
pub(crate) fn rows(root: &Path, calls: u64, table: &mut Table) {
    for (bytes, label) in [(10_000, "10 KB"), (1_000_000, "1 MB")] {
        let port = upstream(bytes);
        let base = format!("http://127.0.0.1:{port}/v1");
        let scratch = Scratch::new(root, "proxy", "full");
        let steps = ("DURUN_BENCH_STEPS", calls.to_string());
        table.add(
            &format!("direct call {label}"),
            not_under_durun(root, &base, calls),
        );
        if bytes == 10_000 {
            let relayed = format!("http://127.0.0.1:{}/v1", relay(port));
            table.add("relayed call 10 KB", not_under_durun(root, &relayed, calls));
        }
        let upstream_env = ("OPENAI_BASE_URL", base.clone());
        let (report, _, ok) = scratch.agent(
            &["run", "--task", "proxy"],
            "proxy",
            &[
                steps.clone(),
                upstream_env.clone(),
                ("DURUN_BENCH_EXIT", "3".into()),
            ],
        );
        assert_eq!(ok, Some(3), "durun run failed");
        table.add(
            &format!("proxied call {label}"),
            super::us_per_step(&report, calls),
        );
        let (report, _, ok) = scratch.agent(
            &["resume", "proxy"],
            "proxy",
            &[steps.clone(), upstream_env.clone()],
        );
        assert_eq!(ok, Some(0), "durun resume failed");
        table.add(
            &format!("replayed call {label}"),
            super::us_per_step(&report, calls),
        );
        if bytes == 10_000 {
            // The same call with no fsync at all: what durun adds besides
            // the disk.
            let scratch = Scratch::new(root, "proxy-normal", "normal");
            let (report, _, ok) =
                scratch.agent(&["run", "--task", "proxy"], "proxy", &[steps, upstream_env]);
            assert_eq!(ok, Some(0), "durun run failed");
            table.add(
                "proxied call 10 KB, no fsync",
                super::us_per_step(&report, calls),
            );
        }
    }
}

/// The agent's time a call to `base`, the agent not under durun.
fn not_under_durun(root: &Path, base: &str, calls: u64) -> f64 {
    super::us_per_step(&alone(root, base, calls, false), calls)
}

/// The agent's report of `calls` calls to `base` (streamed or not), the
/// agent not under durun.
fn alone(root: &Path, base: &str, calls: u64, stream: bool) -> serde_json::Value {
    let out = root.join("direct.json");
    let mut agent = std::process::Command::new(std::env::current_exe().expect("self"));
    if stream {
        agent.env("DURUN_BENCH_STREAM", "1");
    }
    let status = agent
        .env("DURUN_BENCH_AGENT", "proxy")
        .env("DURUN_BENCH_URL", base)
        .env("DURUN_BENCH_STEPS", calls.to_string())
        .env("DURUN_BENCH_OUT", &out)
        .status()
        .expect("the direct agent");
    assert!(status.success());
    serde_json::from_str(&std::fs::read_to_string(&out).expect("report")).expect("JSON")
}

/// How long the first chunk of a stream takes to reach the agent after the
/// upstream sent it, directly and through the proxy (whose end of the
/// stream waits for its commit, but whose chunks do not).
pub(crate) fn first_chunk_rows(root: &Path, calls: u64, table: &mut Table) {
    let port = upstream(1000);
    let base = format!("http://127.0.0.1:{port}/v1");
    let direct = alone(root, &base, calls, true);
    table.add(
        "first chunk direct",
        direct["first_chunk_ns"].as_f64().unwrap_or(f64::NAN) / 1000.0,
    );
    table.add(
        "later chunks direct",
        direct["later_chunk_p99_ns"].as_f64().unwrap_or(f64::NAN) / 1000.0,
    );
    let scratch = Scratch::new(root, "proxy-stream", "full");
    let (report, _, ok) = scratch.agent(
        &["run", "--task", "stream"],
        "proxy",
        &[
            ("DURUN_BENCH_STEPS", calls.to_string()),
            ("DURUN_BENCH_STREAM", "1".into()),
            ("OPENAI_BASE_URL", base),
        ],
    );
    assert_eq!(ok, Some(0), "durun run failed");
    table.add(
        "first chunk proxied",
        report["first_chunk_ns"].as_f64().unwrap_or(f64::NAN) / 1000.0,
    );
    table.add(
        "later chunks proxied",
        report["later_chunk_p99_ns"].as_f64().unwrap_or(f64::NAN) / 1000.0,
    );
}

/// The proxy's rows of the table.
pub(crate) fn print(table: &Table) {
    let floor = table.get("floor 1 commit full").unwrap_or(f64::NAN);
    println!(
        "\nThe model proxy, per call, median of the rounds, a local upstream that answers at once (floor: one SQLite commit, full sync, {floor:.0} µs).\n"
    );
    println!("| answer | direct | through the proxy | added | added − floor | replayed |");
    println!("|---|---|---|---|---|---|");
    for label in ["10 KB", "1 MB"] {
        let get = |row: &str| table.get(&format!("{row} {label}")).unwrap_or(f64::NAN);
        let (direct, proxied, replayed) = (
            get("direct call"),
            get("proxied call"),
            get("replayed call"),
        );
        println!(
            "| {label} | {direct:.0} µs | {proxied:.0} µs | {:.0} µs | {:.0} µs | {replayed:.0} µs |",
            proxied - direct,
            proxied - direct - floor
        );
    }
    let get = |row: &str| table.get(row).unwrap_or(f64::NAN);
    println!(
        "\nThe 10 KB call through the proxy with the task at `sync = \"normal\"` (no fsync): {:.0} µs, {:.0} µs over the direct call: what durun adds besides its disk.",
        get("proxied call 10 KB, no fsync"),
        get("proxied call 10 KB, no fsync") - get("direct call 10 KB"),
    );
    let relayed = get("relayed call 10 KB");
    println!(
        "\nThe 10 KB call through a bare relay (two threads copying bytes, no HTTP work, no journal): {relayed:.0} µs, {:.0} µs over the direct call: the second hop alone, which any proxy pays. durun's own part, no fsync, over the relay: {:.0} µs.",
        relayed - get("direct call 10 KB"),
        get("proxied call 10 KB, no fsync") - relayed,
    );
    // What no proxy that journals an answer before the agent has it can
    // go under: its second hop, and the commit of the call's record.
    let big_commit = get("floor 1 commit full, 10 KB row");
    let least = relayed - get("direct call 10 KB") + big_commit;
    println!(
        "\nOne SQLite commit of a 10 KB row, full sync: {big_commit:.0} µs ({:.0} µs over the floor's). A proxy that journals the answer before the agent has it pays both, one after the other: {least:.0} µs over the direct call, {:.0} µs over the floor (the target allows 100 µs).",
        big_commit - floor,
        least - floor,
    );
    println!(
        "\nA streamed call: from the upstream sending its first chunk to the agent reading it, median: {:.0} µs direct, {:.0} µs through the proxy (+{:.0} µs; target +200 µs). Its {LATER_CHUNKS} later chunks, 99th percentile: {:.0} µs direct, {:.0} µs through the proxy (+{:.0} µs; target +50 µs).",
        get("first chunk direct"),
        get("first chunk proxied"),
        get("first chunk proxied") - get("first chunk direct"),
        get("later chunks direct"),
        get("later chunks proxied"),
        get("later chunks proxied") - get("later chunks direct"),
    );
}
