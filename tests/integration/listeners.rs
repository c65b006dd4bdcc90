//! SPEC 17's listeners (the proxy, `durun test`'s recorder, `durun ui` and
//! its webhook API share one HTTP loop): a slow head is closed, and no
//! number of connections runs durun out of descriptors.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use crate::env::TestEnv;
use crate::ui::Ui;

/// SPEC 17: a listener closes a connection whose headers take over 10 s,
/// and serves at most 256 connections at once; more wait, and durun's
/// descriptors stay bounded.
#[test]
fn slow_or_too_many_connections_wait_or_are_closed_and_never_exhaust_durun() {
    let env = TestEnv::new();
    let ui = Ui::start(&env, &[]);
    let stall = || {
        let mut stream = TcpStream::connect(&ui.at).expect("connect");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .expect("part of a head");
        stream
    };
    let mut stalled: Vec<TcpStream> = (0..300).map(|_| stall()).collect();
    let fds =
        || std::fs::read_dir(format!("/proc/{}/fd", ui.child.id())).map_or(0, Iterator::count);
    // Past the 256th, connections wait: a real request is not served yet.
    let mut waiting = TcpStream::connect(&ui.at).expect("connect");
    waiting
        .write_all(format!("GET /api/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n", ui.token).as_bytes())
        .expect("a request");
    waiting
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let mut answer = Vec::new();
    assert!(
        waiting.read_to_end(&mut answer).is_err() && answer.is_empty(),
        "served past the limit: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(fds() < 256 + 64, "durun holds {} descriptors", fds());
    // The stalled heads are closed after 10 s; then the request is served.
    let closed = stalled.first_mut().expect("a stalled connection");
    closed
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut rest = Vec::new();
    let _ = closed.read_to_end(&mut rest);
    waiting
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    waiting.read_to_end(&mut answer).expect("the answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(stalled);
}
