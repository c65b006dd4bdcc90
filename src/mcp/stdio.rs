//! The stdio transport: the real server is a child process, one JSON-RPC
//! message a line each way.

use std::io::{BufReader, Write as _};
use std::process::ChildStdin;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use anyhow::Result;

use super::{Journaling, ToClient};
use crate::error::{Failure, Kind};

/// Relays between this process's stdin/stdout and `command`'s until the
/// client closes its end or the server exits; exits with the server's
/// code.
pub(crate) fn relay_command(
    command: &[String],
    journaling: &Arc<Journaling>,
    client: &ToClient,
) -> Result<i32> {
    // The server runs under a keeper: it and whatever it starts end when
    // `durun mcp` does, however it ends.
    let cannot_start = |err: std::io::Error| {
        Failure::new(
            Kind::CannotStart,
            format!("cannot start the MCP server `{}`: {err}", command[0]),
        )
        .hint("check the command after `durun mcp --`")
    };
    let cwd = std::env::current_dir().map_err(cannot_start)?;
    let spawned = crate::spawn::spawn(&crate::spawn::Plan {
        argv: command,
        cwd: &cwd,
        stdin: crate::config::StdinMode::Protocol,
        env: Vec::new(),
        pipe_stderr: false,
        own_group: false,
    })
    .map_err(cannot_start)?;
    let crate::spawn::Spawned {
        keeper,
        lifeline,
        status,
        stdin,
        stdout: server_out,
        ..
    } = spawned;
    // Shared: a task's call in doubt is sent again by durun itself.
    let server_in = Arc::new(Mutex::new(Some(stdin)));
    {
        let server_in = Arc::clone(&server_in);
        journaling.connect_server(Box::new(move |message| write_line(&server_in, message)));
    }
    let max = journaling.max_message();
    // The server's answers go to the client. When the server exits, every
    // call in flight gets an error and `durun mcp` exits with it (SPEC 17):
    // a client waiting on a dead server would hang.
    {
        let journaling = Arc::clone(journaling);
        let client = client.clone();
        std::thread::spawn(move || {
            for_each_line(
                BufReader::new(server_out),
                max,
                || {
                    client.error(
                        &Value::Null,
                        &format!("durun: the MCP server sent a message over {max} bytes ([mcp] max_message); it was dropped"),
                    );
                },
                |message| {
                    journaling
                        .on_server_message(message)
                        .is_none_or(|message| client.send(&message))
                },
            );
            journaling.server_gone(&client);
            let code = crate::spawn::wait_for_end(keeper, &status)
                .code()
                .unwrap_or(1);
            drop(lifeline);
            std::process::exit(code);
        });
    }
    for_each_line(
        std::io::stdin().lock(),
        max,
        || {
            client.error(
                &Value::Null,
                &format!("durun: a message over {max} bytes ([mcp] max_message) was refused"),
            );
        },
        |message| match journaling.on_client_message(message, client) {
            Some(forward) => write_line(&server_in, forward),
            None => true,
        },
    );
    // The client is done. Its tasks' calls run to their ends (SPEC 22);
    // then so is the server, once its stdin closes, and the thread above
    // exits with the server's code.
    journaling.drain();
    server_in.lock().expect("server stdin lock").take();
    loop {
        std::thread::park();
    }
}

/// Writes one message and its newline to the server; `false` once it is
/// gone (or its stdin was closed).
fn write_line(server_in: &Mutex<Option<ChildStdin>>, mut message: Vec<u8>) -> bool {
    message.push(b'\n');
    let mut server_in = server_in.lock().expect("server stdin lock");
    server_in.as_mut().is_some_and(|server_in| {
        server_in
            .write_all(&message)
            .and_then(|()| server_in.flush())
            .is_ok()
    })
}

/// Calls `each` with every non-empty line of `reader` (without its end),
/// until it returns `false` or the input ends. A line over `max` bytes is
/// never held: it is read past, and `too_long` is called instead.
pub(crate) fn for_each_line(
    mut reader: impl std::io::BufRead,
    max: usize,
    mut too_long: impl FnMut(),
    mut each: impl FnMut(Vec<u8>) -> bool,
) {
    let mut line = Vec::new();
    let mut over = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if available.is_empty() {
            // The input ended: a last line without its newline still counts.
            let message = line.trim_ascii();
            if !over && !message.is_empty() {
                each(message.to_vec());
            }
            return;
        }
        let end = available.iter().position(|&byte| byte == b'\n');
        let chunk = &available[..end.map_or(available.len(), |at| at + 1)];
        let used = chunk.len();
        if !over && line.len() + used > max.saturating_add(1) {
            over = true;
            line = Vec::new();
        }
        if !over {
            line.extend_from_slice(chunk);
        }
        reader.consume(used);
        if end.is_some() {
            if over {
                too_long();
            } else {
                let message = line.trim_ascii();
                if !message.is_empty() && !each(message.to_vec()) {
                    return;
                }
            }
            over = false;
            line.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_over_the_limit_is_read_past_and_said_never_held() {
        let input = format!("{}\n{}\n{{\"a\":1}}\nlast", "x".repeat(10), "y".repeat(11));
        let mut lines = Vec::new();
        let mut too_long = 0;
        for_each_line(
            std::io::BufReader::with_capacity(4, input.as_bytes()),
            10,
            || too_long += 1,
            |line| {
                lines.push(String::from_utf8(line).expect("text"));
                true
            },
        );
        assert_eq!(
            lines,
            ["x".repeat(10), "{\"a\":1}".to_owned(), "last".to_owned()]
        );
        assert_eq!(too_long, 1);
    }
}
