//! `durun mcp`: an MCP server in front of another, its tool calls steps of
//! the run it is part of (SPEC 13).

use anyhow::Result;

use crate::cli::McpArgs;
use crate::config::Config;
use crate::error::Failure;
use crate::mcp::{Journaling, ToClient, find_socket, relay_command, relay_url};
use crate::protocol::client::Connection;
use crate::report::say;
use crate::settings::Settings;

pub(crate) fn exec(args: &McpArgs, settings: &Settings) -> Result<i32> {
    if let Some(name) = &args.name {
        crate::names::check_given_name("MCP server name", name)?;
    }
    let cwd = std::env::current_dir()?;
    let (config, _) = Config::discover(settings.config.as_deref(), &cwd)?;
    let run = match find_socket(settings.socket.clone()) {
        Some(socket) => match Connection::connect(&socket) {
            Ok(connection) => Some(connection),
            Err(err) => {
                say(&format!(
                    "cannot reach the durun run at {} ({err:#}): relaying MCP messages without journaling them",
                    socket.display()
                ));
                None
            }
        },
        None => {
            say("not inside a durun run: relaying MCP messages without journaling them");
            None
        }
    };
    let client = ToClient::new();
    let journaling = Journaling::new(
        run,
        args.name.clone(),
        config.mcp,
        config
            .mcp_max_message
            .unwrap_or(crate::config::MCP_MAX_MESSAGE),
        client.clone(),
    );
    match &args.url {
        Some(url) => {
            crate::config::check_upstream(url)
                .map_err(|message| Failure::usage(format!("--url: {message}")))?;
            relay_url(url, journaling, &client);
            Ok(0)
        }
        None => relay_command(&args.command, &journaling, &client),
    }
}
