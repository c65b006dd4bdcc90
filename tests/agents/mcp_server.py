"""A FastMCP server (the official `mcp` Python SDK) with a read-only tool
and one that creates an issue. Every call is appended to CALLS_FILE as a
JSON line with the idempotency key durun put in `_meta`; `create_issue`
holds while HOLD_FILE names a file that does not exist yet (where a test
kills durun). MCP clients start servers with a reduced environment, so
these come as arguments:

    mcp_server.py stdio CALLS_FILE [HOLD_FILE]
    mcp_server.py http PORT_FILE CALLS_FILE     (streamable HTTP)"""

import json
import os
import sys
import time

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

server = FastMCP("tracker")
transport = sys.argv[1]
calls_file = sys.argv[3] if transport == "http" else sys.argv[2]
hold_file = sys.argv[3] if transport == "stdio" and len(sys.argv) > 3 else None
issues = {}


def key_of(ctx):
    """The idempotency key durun put in the call's `_meta`, if any."""
    meta = ctx.request_context.meta
    return ((meta.model_extra or {}) if meta is not None else {}).get("io.durun/idempotency-key")


def log(tool, ctx, **fields):
    with open(calls_file, "a") as out:
        out.write(json.dumps({"tool": tool, "key": key_of(ctx), **fields}) + "\n")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def lookup(topic: str, ctx: Context) -> str:
    """Looks a topic up."""
    log("lookup", ctx, topic=topic)
    return f"facts about {topic}"


@server.tool()
def create_issue(title: str, ctx: Context) -> str:
    """Creates an issue, once per idempotency key."""
    log("create_issue", ctx, title=title)
    key = key_of(ctx)
    if hold_file and not os.path.exists(hold_file):
        with open(hold_file + ".reached", "w"):
            pass
        while not os.path.exists(hold_file):
            time.sleep(0.02)
    if key not in issues:
        issues[key] = f"issue-{len(issues) + 1}"
    return issues[key]


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def announce(ctx: Context) -> str:
    """Tells the client, on the server's own stream, that its tools changed
    (a message not tied to any request: over streamable HTTP it goes out on
    the GET stream the client opened, or nowhere)."""
    await ctx.session.send_tool_list_changed()
    return "announced"


if transport == "http":
    import socket
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    server.settings.port = port
    server.settings.host = "127.0.0.1"
    with open(sys.argv[2] + ".tmp", "w") as out:
        out.write(str(port))
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    server.run(transport="streamable-http")
else:
    server.run()
