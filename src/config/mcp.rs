//! `[mcp]`: what `durun mcp` reads of durun.toml (SPEC 13, 17): a table
//! per server (`[mcp.NAME]`, which tools read and which mutate) and
//! `max_message`, side by side in one table.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::size::size_value;
use crate::error::Failure;

/// The largest message `durun mcp` relays unless `[mcp] max_message` says.
pub(crate) const MCP_MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// `[mcp]`'s server tables and its `max_message` (bytes, or a size such as
/// `"64MiB"`).
pub(super) fn mcp_tables(
    raw: BTreeMap<String, toml::Value>,
) -> anyhow::Result<(BTreeMap<String, McpServerConfig>, Option<usize>)> {
    let mut max_message = None;
    let mut servers = BTreeMap::new();
    for (name, value) in raw {
        if name == "max_message" {
            let bytes = size_value(&value);
            max_message = Some(bytes.ok_or_else(|| {
                Failure::config(format!("[mcp] max_message = {value}: not a size"))
                    .hint("a number of bytes, or a size like \"64MiB\"")
            })?);
            continue;
        }
        let server = McpServerConfig::deserialize(value)
            .map_err(|err| Failure::config(format!("[mcp.{name}]: {err}")))?;
        servers.insert(name, server);
    }
    Ok((servers, max_message))
}

/// `[mcp.NAME] read = [...]`, `mutate = [...]`: tool names; `probe`:
/// the tool that says whether a call in doubt took effect (SPEC 22).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpServerConfig {
    #[serde(default)]
    pub(crate) read: Vec<String>,
    #[serde(default)]
    pub(crate) mutate: Vec<String>,
    /// Called with `{"idempotency_key": KEY}` before a call in doubt goes
    /// again.
    #[serde(default)]
    pub(crate) probe: Option<String>,
}
