//! The stdio transport: the real server is a child process, one JSON-RPC
//! message a line each way.

use std::io::{BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::Result;

use super::{Journaling, ToClient};
use crate::error::{Failure, Kind};

/// Relays between this process's stdin/stdout and `command`'s until the
/// client closes its end; returns the server's exit code.
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
    let mut keeping = crate::keeper::Keeping::new().map_err(cannot_start)?;
    let (exe, args) = crate::keeper::Keeping::command_line(command, false).map_err(cannot_start)?;
    let mut server = Command::new(exe);
    server
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    keeping.hand_over()(&mut server).map_err(cannot_start)?;
    let mut child = server.spawn().map_err(cannot_start)?;
    if let Err(err) = keeping.started() {
        let _ = child.wait();
        return Err(cannot_start(err).into());
    }
    let _keeping = keeping;
    let mut server_in = child.stdin.take().expect("piped");
    let server_out = child.stdout.take().expect("piped");
    let back = {
        let journaling = Arc::clone(journaling);
        let client = client.clone();
        std::thread::spawn(move || {
            for_each_line(BufReader::new(server_out), |message| {
                client.send(&journaling.on_server_message(message))
            });
        })
    };
    for_each_line(std::io::stdin().lock(), |message| {
        match journaling.on_client_message(message, client) {
            Some(mut forward) => {
                forward.push(b'\n');
                server_in
                    .write_all(&forward)
                    .and_then(|()| server_in.flush())
                    .is_ok()
            }
            None => true,
        }
    });
    // The client is done: so is the server, once its stdin closes.
    drop(server_in);
    let _ = back.join();
    let status = child.wait()?;
    Ok(status.code().unwrap_or(1))
}

/// Calls `each` with every non-empty line of `reader` (without its end),
/// until it returns `false` or the input ends.
pub(super) fn for_each_line(
    mut reader: impl std::io::BufRead,
    mut each: impl FnMut(Vec<u8>) -> bool,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let message = line.trim_ascii();
        if !message.is_empty() && !each(message.to_vec()) {
            return;
        }
    }
}
